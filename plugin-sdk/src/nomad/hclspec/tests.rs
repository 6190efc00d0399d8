//! The specs of real Nomad drivers (raw_exec, mock, the skeleton driver, docker-like
//! blocks) built as `Spec` values, configs checked and encoded against them, the msgpack
//! read back with `rmpv` for its types; and schemars structs round-tripped.

use std::collections::{BTreeMap, HashMap};

use drover_proto::nomad::hclspec::{self as pb, spec::Block as K};
use rmpv::Value as Mp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::*;

fn s(kind: K) -> Spec {
    Spec { block: Some(kind) }
}
fn attr(name: &str, ty: &str, required: bool) -> Spec {
    s(K::Attr(pb::Attr {
        name: name.into(),
        r#type: ty.into(),
        required,
    }))
}
fn lit(value: &str) -> Spec {
    s(K::Literal(pb::Literal {
        value: value.into(),
    }))
}
fn default(primary: Spec, default: Spec) -> Spec {
    s(K::Default(Box::new(pb::Default {
        primary: Some(Box::new(primary)),
        default: Some(Box::new(default)),
    })))
}
fn object(attrs: Vec<(&str, Spec)>) -> Spec {
    s(K::Object(pb::Object {
        attributes: attrs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    }))
}
fn block(name: &str, required: bool, nested: Spec) -> Spec {
    s(K::BlockValue(Box::new(pb::Block {
        name: name.into(),
        required,
        nested: Some(Box::new(nested)),
    })))
}
fn block_list(name: &str, min_items: u64, max_items: u64, nested: Spec) -> Spec {
    s(K::BlockList(Box::new(pb::BlockList {
        name: name.into(),
        min_items,
        max_items,
        nested: Some(Box::new(nested)),
    })))
}
fn block_set(name: &str, nested: Spec) -> Spec {
    s(K::BlockSet(Box::new(pb::BlockSet {
        name: name.into(),
        min_items: 0,
        max_items: 0,
        nested: Some(Box::new(nested)),
    })))
}
fn block_map(name: &str, labels: &[&str], nested: Spec) -> Spec {
    s(K::BlockMap(Box::new(pb::BlockMap {
        name: name.into(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        nested: Some(Box::new(nested)),
    })))
}
fn block_attrs(name: &str, ty: &str, required: bool) -> Spec {
    s(K::BlockAttrs(pb::BlockAttrs {
        name: name.into(),
        r#type: ty.into(),
        required,
    }))
}

/// raw_exec's plugin config spec (drivers/rawexec/driver.go, Nomad v1.0.18).
fn rawexec_config() -> Spec {
    object(vec![
        (
            "enabled",
            default(attr("enabled", "bool", false), lit("false")),
        ),
        (
            "no_cgroups",
            default(attr("no_cgroups", "bool", false), lit("false")),
        ),
    ])
}

/// raw_exec's task config spec.
fn rawexec_task() -> Spec {
    object(vec![
        ("command", attr("command", "string", true)),
        ("args", attr("args", "list(string)", false)),
    ])
}

/// The mock driver's plugin config spec (drivers/mock/driver.go).
fn mock_config() -> Spec {
    object(vec![
        (
            "fs_isolation",
            default(attr("fs_isolation", "string", false), lit(r#""none""#)),
        ),
        (
            "shutdown_periodic_after",
            default(attr("shutdown_periodic_after", "bool", false), lit("false")),
        ),
        (
            "shutdown_periodic_duration",
            attr("shutdown_periodic_duration", "number", false),
        ),
    ])
}

fn mock_command_attrs() -> Vec<(&'static str, Spec)> {
    [
        ("run_for", "string"),
        ("exit_code", "number"),
        ("exit_signal", "number"),
        ("exit_err_msg", "string"),
        ("signal_error", "string"),
        ("stdout_string", "string"),
        ("stdout_repeat", "number"),
        ("stdout_repeat_duration", "string"),
        ("stderr_string", "string"),
        ("stderr_repeat", "number"),
        ("stderr_repeat_duration", "string"),
    ]
    .into_iter()
    .map(|(name, ty)| (name, attr(name, ty, false)))
    .collect()
}

/// The mock driver's task config spec.
fn mock_task() -> Spec {
    let mut attrs = mock_command_attrs();
    for (name, ty) in [
        ("start_error", "string"),
        ("start_error_recoverable", "bool"),
        ("start_block_for", "string"),
        ("kill_after", "string"),
        ("plugin_exit_after", "string"),
        ("driver_ip", "string"),
        ("driver_advertise", "bool"),
        ("driver_port_map", "string"),
    ] {
        attrs.push((name, attr(name, ty, false)));
    }
    attrs.push((
        "exec_command",
        block("exec_command", false, object(mock_command_attrs())),
    ));
    object(attrs)
}

/// The skeleton driver's specs (hashicorp/nomad-skeleton-driver-plugin, hello/driver.go).
fn skeleton_config() -> Spec {
    object(vec![(
        "shell",
        default(attr("shell", "string", false), lit(r#""bash""#)),
    )])
}
fn skeleton_task() -> Spec {
    object(vec![(
        "greeting",
        default(attr("greeting", "string", false), lit(r#""Hello, World!""#)),
    )])
}

/// Blocks as docker's task config uses them (drivers/docker/config.go): a block list
/// with nested blocks, block attrs, a block map, a set.
fn docker_like_task() -> Spec {
    object(vec![
        ("image", attr("image", "string", true)),
        ("labels", attr("labels", "list(map(string))", false)),
        ("port_map", block_attrs("port_map", "number", false)),
        (
            "mounts",
            block_list(
                "mounts",
                0,
                2,
                object(vec![
                    ("target", attr("target", "string", true)),
                    (
                        "readonly",
                        default(attr("readonly", "bool", false), lit("false")),
                    ),
                    (
                        "volume_options",
                        block(
                            "volume_options",
                            false,
                            object(vec![("no_copy", attr("no_copy", "bool", false))]),
                        ),
                    ),
                ]),
            ),
        ),
        (
            "logging",
            block(
                "logging",
                false,
                object(vec![("type", attr("type", "string", false))]),
            ),
        ),
        (
            "devices",
            block_set(
                "devices",
                object(vec![("host_path", attr("host_path", "string", true))]),
            ),
        ),
        (
            "ulimit",
            block_map(
                "ulimit",
                &["name"],
                object(vec![("soft", attr("soft", "number", true))]),
            ),
        ),
    ])
}

/// The msgpack of `bytes` as rmpv reads it, map keys to values.
fn mp_map(bytes: &[u8]) -> BTreeMap<String, Mp> {
    let v = rmpv::decode::read_value(&mut &bytes[..]).expect("valid msgpack");
    let Mp::Map(pairs) = v else {
        panic!("not a map: {v}")
    };
    pairs
        .into_iter()
        .map(|(k, v)| (k.as_str().expect("string key").to_owned(), v))
        .collect()
}

fn paths(errors: &[SpecError]) -> Vec<&str> {
    errors.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn rawexec_defaults_apply_and_booleans_stay_booleans() {
    let spec = rawexec_config();
    assert_eq!(
        normalize(&spec, &json!({})).unwrap(),
        json!({"enabled": false, "no_cgroups": false})
    );
    assert_eq!(
        normalize(&spec, &Value::Null).unwrap(),
        json!({"enabled": false, "no_cgroups": false})
    );
    let m = mp_map(&encode_msgpack(&spec, &json!({"enabled": true})).unwrap());
    assert_eq!(m["enabled"], Mp::Boolean(true));
    assert_eq!(m["no_cgroups"], Mp::Boolean(false));
    let errors = encode_msgpack(&spec, &json!({"enabled": "yes", "cgroups": false})).unwrap_err();
    assert_eq!(paths(&errors), ["cgroups", "enabled"]);
    assert_eq!(
        errors[0].message,
        "unknown key; expected one of: enabled, no_cgroups"
    );
    assert_eq!(errors[1].message, "expected bool, got a string");
}

#[test]
fn rawexec_task_config_errors_name_their_keys() {
    let spec = rawexec_task();
    let bytes = encode_msgpack(&spec, &json!({"command": "/bin/sleep", "args": ["1", 2]})).unwrap();
    let m = mp_map(&bytes);
    assert_eq!(m["command"], Mp::from("/bin/sleep"));
    // A number where a string is expected is cty's safe conversion.
    assert_eq!(m["args"], Mp::Array(vec![Mp::from("1"), Mp::from("2")]));
    // An absent optional attribute is there, as nil.
    let m = mp_map(&encode_msgpack(&spec, &json!({"command": "x"})).unwrap());
    assert_eq!(m["args"], Mp::Nil);

    let errors = encode_msgpack(
        &spec,
        &json!({"comand": "x", "args": ["a", {"b": 1}, null]}),
    )
    .unwrap_err();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "comand: unknown key; expected one of: args, command",
            "args[1]: expected string, got an object",
            "args[2]: expected string, got null",
            "command: missing required attribute (of type string)",
        ]
    );
    let errors = encode_msgpack(&spec, &json!({"command": null, "args": "a b"})).unwrap_err();
    assert_eq!(paths(&errors), ["args", "command"]);
    let errors = encode_msgpack(&spec, &json!(["command"])).unwrap_err();
    assert_eq!(
        errors,
        [SpecError::new(
            "",
            "expected an object (a block body), got an array"
        )]
    );
    assert_eq!(errors[0].path, "(root)");
}

#[test]
fn mock_driver_specs_encode_ints_as_ints_and_blocks_as_maps() {
    let config = mock_config();
    let m = mp_map(
        &encode_msgpack(
            &config,
            &json!({"shutdown_periodic_duration": 5_000_000_000u64}),
        )
        .unwrap(),
    );
    assert_eq!(m["fs_isolation"], Mp::from("none"));
    assert_eq!(m["shutdown_periodic_after"], Mp::Boolean(false));
    assert!(m["shutdown_periodic_duration"].is_u64() || m["shutdown_periodic_duration"].is_i64());
    assert_eq!(
        m["shutdown_periodic_duration"].as_u64(),
        Some(5_000_000_000)
    );

    let task = mock_task();
    let cfg = json!({
        "run_for": "10s",
        "exit_code": 3.0,
        "stdout_repeat": 2,
        "exec_command": {"run_for": "1ms", "exit_signal": 9, "stdout_string": "hi"},
    });
    let bytes = encode_msgpack(&task, &cfg).unwrap();
    let m = mp_map(&bytes);
    assert_eq!(m.len(), 20, "every spec'd key is sent: {:?}", m.keys());
    assert_eq!(
        m["exit_code"],
        Mp::from(3),
        "an integral float goes as an int"
    );
    assert!(m["exit_code"].is_i64() || m["exit_code"].is_u64());
    assert_eq!(m["start_error"], Mp::Nil);
    assert_eq!(m["driver_advertise"], Mp::Nil);
    let Mp::Map(exec) = &m["exec_command"] else {
        panic!("exec_command is {}", m["exec_command"])
    };
    assert_eq!(exec.len(), 11);
    let exec: BTreeMap<&str, &Mp> = exec.iter().map(|(k, v)| (k.as_str().unwrap(), v)).collect();
    assert_eq!(*exec["exit_signal"], Mp::from(9));
    assert_eq!(*exec["exit_code"], Mp::Nil);
    // Keys are written sorted, as cty writes an object.
    let keys: Vec<&str> = exec.keys().copied().collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted);

    let decoded = decode_msgpack(&bytes).unwrap();
    assert_eq!(decoded, normalize(&task, &cfg).unwrap());
    assert_eq!(decoded["exec_command"]["stdout_string"], json!("hi"));

    // A float stays a float.
    let m = mp_map(&encode_msgpack(&task, &json!({"exit_code": 1.5})).unwrap());
    assert_eq!(m["exit_code"], Mp::F64(1.5));
    // An absent block is nil.
    let m = mp_map(&encode_msgpack(&task, &json!({})).unwrap());
    assert_eq!(m["exec_command"], Mp::Nil);

    let errors = encode_msgpack(
        &task,
        &json!({"exit_code": "1", "exec_command": {"run_for": 5, "bogus": 1, "exit_code": true}}),
    )
    .unwrap_err();
    assert_eq!(
        paths(&errors),
        ["exec_command.bogus", "exec_command.exit_code", "exit_code"]
    );
    assert_eq!(errors[1].message, "expected number, got a bool");
    let errors = encode_msgpack(&task, &json!({"exec_command": "run"})).unwrap_err();
    assert_eq!(
        errors,
        [SpecError::new(
            "exec_command",
            "expected an object (a block body), got a string"
        )]
    );
}

#[test]
fn skeleton_defaults_are_its_literals() {
    assert_eq!(
        normalize(&skeleton_config(), &json!({})).unwrap(),
        json!({"shell": "bash"})
    );
    assert_eq!(
        normalize(&skeleton_config(), &json!({"shell": "fish"})).unwrap(),
        json!({"shell": "fish"})
    );
    // null is absent, so the default applies.
    assert_eq!(
        normalize(&skeleton_config(), &json!({"shell": null})).unwrap(),
        json!({"shell": "bash"})
    );
    let m = mp_map(&encode_msgpack(&skeleton_task(), &json!({})).unwrap());
    assert_eq!(m["greeting"], Mp::from("Hello, World!"));
    let schema = to_json_schema(&skeleton_task()).unwrap();
    assert_eq!(
        schema,
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"greeting": {"type": ["string", "null"], "default": "Hello, World!"}},
            "required": [],
            "additionalProperties": false,
        })
    );
}

#[test]
fn docker_like_blocks_decode_to_lists_maps_and_nil() {
    let spec = docker_like_task();
    let absent = normalize(&spec, &json!({"image": "redis"})).unwrap();
    assert_eq!(
        absent,
        json!({"image": "redis", "labels": null, "port_map": null, "mounts": [], "logging": null,
               "devices": [], "ulimit": {}})
    );
    let m = mp_map(&encode_msgpack(&spec, &json!({"image": "redis"})).unwrap());
    assert_eq!(m["mounts"], Mp::Array(vec![]));
    assert_eq!(m["ulimit"], Mp::Map(vec![]));
    assert_eq!(m["logging"], Mp::Nil);

    let cfg = json!({
        "image": "redis",
        "labels": [{"a": "b"}],
        "port_map": {"http": 8080},
        // A single block given as its object, as HCL's JSON syntax allows.
        "mounts": {"target": "/data", "volume_options": {"no_copy": true}},
        "devices": [{"host_path": "/dev/a"}, {"host_path": "/dev/a"}],
        "ulimit": {"nofile": {"soft": 1024}},
        "logging": [{"type": "json-file"}],
    });
    assert_eq!(
        normalize(&spec, &cfg).unwrap(),
        json!({
            "image": "redis",
            "labels": [{"a": "b"}],
            "port_map": {"http": 8080},
            "mounts": [{"target": "/data", "readonly": false, "volume_options": {"no_copy": true}}],
            "devices": [{"host_path": "/dev/a"}],
            "ulimit": {"nofile": {"soft": 1024}},
            "logging": {"type": "json-file"},
        })
    );

    let bad = json!({
        "port_map": {"http": "eighty"},
        "mounts": [{"target": "/a"}, {"readonly": 1}, {"target": "/c", "volume_options": {"copy": true}}],
        "ulimit": {"nofile": {"hard": 1}, "core": 5},
        "logging": [{"type": "a"}, {"type": "b"}],
        "labels": {"a": "b"},
    });
    let errors = normalize(&spec, &bad).unwrap_err();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "image: missing required attribute (of type string)",
            "labels: expected list(map(string)), got an object",
            "logging: only one block is allowed here, got 2",
            "mounts[1].readonly: expected bool, got a number",
            "mounts[1].target: missing required attribute (of type string)",
            "mounts[2].volume_options.copy: unknown key; expected one of: no_copy",
            "mounts: at most 2 block(s) allowed, got 3",
            "port_map.http: expected number, got a string",
            "ulimit.core: expected an object (a block body), got a number",
            "ulimit.nofile.hard: unknown key; expected one of: soft",
            "ulimit.nofile.soft: missing required attribute (of type number)",
        ],
    );
}

#[test]
fn block_list_minimum_and_required_block() {
    let spec = object(vec![
        (
            "ports",
            block_list(
                "ports",
                1,
                0,
                object(vec![("p", attr("p", "number", false))]),
            ),
        ),
        ("auth", block("auth", true, object(vec![]))),
    ]);
    let errors = normalize(&spec, &json!({})).unwrap_err();
    assert_eq!(
        errors,
        [
            SpecError::new("auth", "missing required block"),
            SpecError::new("ports", "at least 1 block(s) required, got 0")
        ]
    );
    let errors = normalize(&spec, &json!({"auth": {"x": 1}, "ports": [{}]})).unwrap_err();
    assert_eq!(
        errors,
        [SpecError::new(
            "auth.x",
            "unknown key; this block takes no keys"
        )]
    );
    assert_eq!(
        normalize(&spec, &json!({"auth": {}, "ports": [{}]})).unwrap(),
        json!({"auth": {}, "ports": [{"p": null}]})
    );
}

#[test]
fn object_keys_and_names_may_differ_and_names_may_be_implied() {
    // hcldec: the Object key names the output, the Attr's name the input; an empty name
    // is the Object key's.
    let spec = object(vec![
        ("out", attr("in", "string", false)),
        ("implied", attr("", "number", false)),
    ]);
    assert_eq!(
        normalize(&spec, &json!({"in": "x", "implied": 1})).unwrap(),
        json!({"out": "x", "implied": 1})
    );
    let err = encode_msgpack(&attr("", "string", false), &json!({})).unwrap_err();
    assert_eq!(err, [SpecError::new("", "attribute spec without a name")]);
    // An Array spec is a tuple of values read from the same body.
    let tuple = s(K::Array(pb::Array {
        values: vec![attr("a", "string", false), lit("7")],
    }));
    assert_eq!(
        normalize(&tuple, &json!({"a": "x"})).unwrap(),
        json!(["x", 7])
    );
}

#[test]
fn malformed_specs_are_refused_with_their_place() {
    let cases = [
        (
            object(vec![("a", attr("a", "lst(string)", false))]),
            "a",
            "unknown type constructor",
        ),
        (
            object(vec![("a", default(attr("a", "bool", false), lit("flase")))]),
            "a",
            "not a constant value",
        ),
        (
            object(vec![(
                "a",
                default(attr("a", "bool", false), lit(r#""yes""#)),
            )]),
            "a",
            "default value: expected bool",
        ),
        (
            object(vec![("m", block_map("m", &[], object(vec![])))]),
            "m",
            "without labels",
        ),
        (
            object(vec![(
                "b",
                s(K::BlockValue(Box::new(pb::Block {
                    name: "b".into(),
                    required: false,
                    nested: None,
                }))),
            )]),
            "b",
            "without a nested spec",
        ),
        (object(vec![("e", Spec { block: None })]), "e", "empty spec"),
    ];
    for (spec, path, needle) in cases {
        let err = to_json_schema(&spec).unwrap_err();
        assert_eq!(err.path, path, "{err}");
        assert!(err.message.contains(needle), "{err}");
        let errors = encode_msgpack(&spec, &json!({})).unwrap_err();
        assert_eq!(errors, [err]);
    }
    // A number literal for a string attribute is converted, as cty's safe conversion.
    let spec = object(vec![("a", default(attr("a", "string", false), lit("5")))]);
    assert_eq!(normalize(&spec, &json!({})).unwrap(), json!({"a": "5"}));
}

#[test]
fn json_schema_of_docker_like_spec_accepts_what_normalize_accepts() {
    let spec = docker_like_task();
    let schema = to_json_schema(&spec).unwrap();
    assert_eq!(schema["required"], json!(["image"]));
    assert_eq!(
        schema["properties"]["port_map"],
        json!({"type": ["object", "null"], "additionalProperties": {"type": "number"}})
    );
    assert_eq!(schema["properties"]["mounts"]["maxItems"], json!(2));
    assert_eq!(
        schema["properties"]["mounts"]["items"]["properties"]["readonly"]["default"],
        json!(false)
    );
    assert_eq!(
        schema["properties"]["mounts"]["items"]["required"],
        json!(["target"])
    );
    assert_eq!(
        schema["properties"]["ulimit"]["additionalProperties"]["properties"]["soft"],
        json!({"type": "number"})
    );
    assert_eq!(
        schema["properties"]["labels"],
        json!({"type": ["array", "null"], "items": {"type": "object", "additionalProperties": {"type": "string"}}})
    );
    let validator = jsonschema::draft202012::new(&schema).expect("a valid draft 2020-12 schema");
    let good =
        json!({"image": "redis", "mounts": [{"target": "/a"}], "ulimit": {"nofile": {"soft": 1}}});
    assert!(validator.is_valid(&good));
    assert!(normalize(&spec, &good).is_ok());
    for bad in [
        json!({"image": "redis", "imag": 1}),
        json!({}),
        json!({"image": "r", "mounts": [{}]}),
    ] {
        assert!(!validator.is_valid(&bad), "{bad}");
        assert!(normalize(&spec, &bad).is_err(), "{bad}");
    }
    let mock = to_json_schema(&mock_task()).unwrap();
    assert_eq!(mock["properties"].as_object().unwrap().len(), 20);
    assert_eq!(
        mock["properties"]["exec_command"]["additionalProperties"],
        json!(false)
    );
    assert!(jsonschema::draft202012::new(&mock).is_ok());
}

#[test]
fn decode_msgpack_refuses_what_json_cannot_hold() {
    let enc = |v: Mp| {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &v).unwrap();
        out
    };
    let err = decode_msgpack(&enc(Mp::Map(vec![(
        Mp::from("a"),
        Mp::Array(vec![Mp::Ext(0, vec![1])]),
    )])))
    .unwrap_err();
    assert_eq!(err.path, "a[0]");
    assert!(err.message.contains("extension type 0"), "{err}");
    let err = decode_msgpack(&enc(Mp::Map(vec![(Mp::from(1), Mp::Nil)]))).unwrap_err();
    assert!(err.message.contains("not a string"), "{err}");
    let err = decode_msgpack(&enc(Mp::Map(vec![
        (Mp::from("k"), Mp::Nil),
        (Mp::from("k"), Mp::Nil),
    ])))
    .unwrap_err();
    assert_eq!(err, SpecError::new("k", "duplicate map key"));
    let err = decode_msgpack(&enc(Mp::F64(f64::NAN))).unwrap_err();
    assert!(err.message.contains("no JSON form"), "{err}");
    let mut two = enc(Mp::Nil);
    two.push(0xc0);
    assert!(
        decode_msgpack(&two)
            .unwrap_err()
            .message
            .contains("1 byte(s) left")
    );
    assert!(decode_msgpack(&[]).is_err());
    assert!(decode_msgpack(&[0x92, 0x01]).is_err(), "truncated array");
    // An array claiming 2^32-1 elements with none there: refused, without allocating them.
    assert!(decode_msgpack(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    // Nesting is bounded.
    let mut deep = vec![0x91; 10_000];
    deep.push(0xc0);
    assert!(decode_msgpack(&deep).is_err());
    let mut ok = vec![0x91; 20];
    ok.push(0xc0);
    assert!(decode_msgpack(&ok).is_ok());
    // Integers of both signs and the full u64 range come through.
    assert_eq!(
        decode_msgpack(&enc(Mp::from(u64::MAX))).unwrap(),
        json!(u64::MAX)
    );
    assert_eq!(
        decode_msgpack(&enc(Mp::from(i64::MIN))).unwrap(),
        json!(i64::MIN)
    );
    assert_eq!(decode_msgpack(&enc(Mp::F32(0.5))).unwrap(), json!(0.5));
}

#[test]
fn any_values_pass_through_but_depth_is_bounded() {
    let spec = object(vec![("x", attr("x", "any", false))]);
    let v = json!({"x": {"a": [1, "b", null, {"c": 2.0}]}});
    assert_eq!(
        normalize(&spec, &v).unwrap(),
        json!({"x": {"a": [1, "b", null, {"c": 2}]}})
    );
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!([deep]);
    }
    let errors = normalize(&spec, &json!({"x": deep})).unwrap_err();
    assert!(
        errors[0].message.contains("nested too deeply"),
        "{errors:?}"
    );
}

// ---- schemars round trip -------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Mount {
    target: String,
    #[serde(default)]
    readonly: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Fast,
    Safe,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct Limits {
    cpu: u32,
    memory_mb: Option<u64>,
}

fn default_shell() -> String {
    "bash".into()
}
fn default_retries() -> u32 {
    3
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TaskConfig {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default = "default_shell")]
    shell: String,
    #[serde(default = "default_retries")]
    retries: u32,
    ratio: f64,
    mode: Mode,
    limits: Limits,
    spare_limits: Option<Limits>,
    #[serde(default)]
    mounts: Vec<Mount>,
    #[serde(default)]
    env: HashMap<String, String>,
    #[serde(default)]
    labels: Vec<HashMap<String, String>>,
    #[serde(default)]
    volumes: BTreeMap<String, Mount>,
    note: Option<String>,
    extra: Option<serde_json::Value>,
}

fn sample() -> TaskConfig {
    TaskConfig {
        command: "/bin/echo".into(),
        args: vec!["hello".into(), "${literally}".into()],
        shell: "fish".into(),
        retries: 0,
        ratio: 0.25,
        mode: Mode::Safe,
        limits: Limits {
            cpu: 500,
            memory_mb: Some(256),
        },
        spare_limits: None,
        mounts: vec![
            Mount {
                target: "/a".into(),
                readonly: true,
            },
            Mount {
                target: "/b".into(),
                readonly: false,
            },
        ],
        env: HashMap::from([("A".into(), "1".into())]),
        labels: vec![HashMap::from([("k".into(), "v".into())])],
        volumes: BTreeMap::from([(
            "data".into(),
            Mount {
                target: "/data".into(),
                readonly: false,
            },
        )]),
        note: Some("n".into()),
        extra: Some(json!({"free": ["form", 1]})),
    }
}

fn kind_of(spec: &Spec) -> &K {
    spec.block.as_ref().expect("a kind")
}

#[test]
fn schemars_struct_becomes_blocks_and_attrs() {
    let schema = serde_json::to_value(schemars::schema_for!(TaskConfig)).unwrap();
    let spec = from_json_schema(&schema).unwrap_or_else(|e| panic!("{e}\n{schema:#}"));
    let K::Object(obj) = kind_of(&spec) else {
        panic!("root is not an Object")
    };
    let get = |k: &str| kind_of(&obj.attributes[k]);
    assert!(matches!(get("command"), K::Attr(a) if a.r#type == "string" && a.required));
    assert!(matches!(get("ratio"), K::Attr(a) if a.r#type == "number" && a.required));
    assert!(matches!(get("mode"), K::Attr(a) if a.r#type == "string" && a.required));
    assert!(matches!(get("note"), K::Attr(a) if a.r#type == "string" && !a.required));
    assert!(matches!(get("extra"), K::Attr(a) if a.r#type == "any" && !a.required));
    assert!(matches!(get("limits"), K::BlockValue(b) if b.required));
    assert!(matches!(get("spare_limits"), K::BlockValue(b) if !b.required));
    assert!(matches!(get("mounts"), K::BlockList(b) if b.min_items == 0));
    assert!(matches!(get("volumes"), K::BlockMap(b) if b.labels == ["name"]));
    let K::Default(d) = get("shell") else {
        panic!("shell has no default: {:?}", get("shell"))
    };
    assert!(
        matches!(kind_of(d.default.as_ref().unwrap()), K::Literal(l) if l.value == r#""bash""#)
    );
    assert!(
        matches!(kind_of(d.primary.as_ref().unwrap()), K::Attr(a) if a.r#type == "string" && !a.required)
    );
    let K::Default(d) = get("env") else {
        panic!("env has no default")
    };
    assert!(
        matches!(kind_of(d.primary.as_ref().unwrap()), K::Attr(a) if a.r#type == "map(string)")
    );
    let K::Default(d) = get("labels") else {
        panic!("labels has no default")
    };
    assert!(
        matches!(kind_of(d.primary.as_ref().unwrap()), K::Attr(a) if a.r#type == "list(map(string))")
    );
    let K::Default(d) = get("args") else {
        panic!("args has no default")
    };
    assert!(
        matches!(kind_of(d.primary.as_ref().unwrap()), K::Attr(a) if a.r#type == "list(string)")
    );
}

#[test]
fn schemars_round_trip_through_msgpack() {
    let schema = serde_json::to_value(schemars::schema_for!(TaskConfig)).unwrap();
    let spec = from_json_schema(&schema).unwrap();
    let original = sample();
    let bytes = encode_msgpack(&spec, &serde_json::to_value(&original).unwrap()).unwrap();
    let decoded = decode_msgpack(&bytes).unwrap();
    let back: TaskConfig =
        serde_json::from_value(decoded.clone()).unwrap_or_else(|e| panic!("{e}: {decoded:#}"));
    assert_eq!(back, original);
    let m = mp_map(&bytes);
    assert!(m["retries"].is_u64(), "retries is {}", m["retries"]);
    assert_eq!(m["ratio"], Mp::F64(0.25));

    // The least config: defaults fill in, absent options are nil, absent lists empty.
    let least = json!({"command": "x", "ratio": 1, "mode": "fast", "limits": {"cpu": 1}});
    let decoded = decode_msgpack(&encode_msgpack(&spec, &least).unwrap()).unwrap();
    let back: TaskConfig = serde_json::from_value(decoded).unwrap();
    assert_eq!(back.shell, "bash");
    assert_eq!(back.retries, 3);
    assert!(
        back.args.is_empty()
            && back.mounts.is_empty()
            && back.volumes.is_empty()
            && back.env.is_empty()
    );
    assert_eq!(
        back.limits,
        Limits {
            cpu: 1,
            memory_mb: None
        }
    );
    assert_eq!(back.spare_limits, None);

    // And what a user gets wrong is named.
    let errors = encode_msgpack(
        &spec,
        &json!({"command": "x", "ratio": "1", "mode": "fast", "limits": {"cpus": 1}, "mounts": [{"readonly": true}]}),
    )
    .unwrap_err();
    assert_eq!(
        paths(&errors),
        ["limits.cpus", "limits.cpu", "mounts[0].target", "ratio"],
        "{errors:?}"
    );

    // The JSON Schema of the derived spec accepts the sample.
    let derived = to_json_schema(&spec).unwrap();
    let validator = jsonschema::draft202012::new(&derived).unwrap();
    let normalized = normalize(&spec, &serde_json::to_value(&original).unwrap()).unwrap();
    assert!(validator.is_valid(&serde_json::to_value(&original).unwrap()));
    assert!(!validator.is_valid(&json!({"command": 1})));
    assert_eq!(normalized["volumes"]["data"]["target"], json!("/data"));
}

#[test]
fn empty_config_struct_is_an_empty_object() {
    let schema = serde_json::to_value(schemars::schema_for!(crate::EmptyConfig)).unwrap();
    let spec = from_json_schema(&schema).unwrap();
    assert_eq!(normalize(&spec, &json!({})).unwrap(), json!({}));
    assert_eq!(encode_msgpack(&spec, &json!({})).unwrap(), [0x80]);
    assert_eq!(
        paths(&normalize(&spec, &json!({"x": 1})).unwrap_err()),
        ["x"]
    );
}

/// A part of docker's task config spec (drivers/docker/config.go, Nomad v1.0.18), with
/// its mount body spec as it is.
fn docker_task() -> Spec {
    let mount_body = object(vec![
        (
            "type",
            default(attr("type", "string", false), lit("\"volume\"")),
        ),
        ("target", attr("target", "string", false)),
        ("source", attr("source", "string", false)),
        ("readonly", attr("readonly", "bool", false)),
        (
            "bind_options",
            block(
                "bind_options",
                false,
                object(vec![("propagation", attr("propagation", "string", false))]),
            ),
        ),
        (
            "tmpfs_options",
            block(
                "tmpfs_options",
                false,
                object(vec![
                    ("size", attr("size", "number", false)),
                    ("mode", attr("mode", "number", false)),
                ]),
            ),
        ),
        (
            "volume_options",
            block(
                "volume_options",
                false,
                object(vec![
                    ("no_copy", attr("no_copy", "bool", false)),
                    ("labels", attr("labels", "list(map(string))", false)),
                    (
                        "driver_config",
                        block(
                            "driver_config",
                            false,
                            object(vec![
                                ("name", attr("name", "string", false)),
                                ("options", attr("options", "list(map(string))", false)),
                            ]),
                        ),
                    ),
                ]),
            ),
        ),
    ]);
    object(vec![
        ("image", attr("image", "string", true)),
        ("args", attr("args", "list(string)", false)),
        (
            "auth",
            block(
                "auth",
                false,
                object(vec![
                    ("username", attr("username", "string", false)),
                    ("password", attr("password", "string", false)),
                ]),
            ),
        ),
        (
            "cpu_cfs_period",
            default(attr("cpu_cfs_period", "number", false), lit("100000")),
        ),
        (
            "image_pull_timeout",
            default(attr("image_pull_timeout", "string", false), lit(r#""5m""#)),
        ),
        ("port_map", attr("port_map", "list(map(number))", false)),
        ("storage_opt", block_attrs("storage_opt", "string", false)),
        ("mount", block_list("mount", 0, 0, mount_body.clone())),
        ("mounts", block_list("mounts", 0, 0, mount_body)),
    ])
}

#[test]
fn docker_spec_nested_blocks_defaults_and_deep_error_paths() {
    let spec = docker_task();
    let cfg = json!({
        "image": "redis:7",
        "port_map": [{"db": 6379}],
        "storage_opt": {"size": 10},
        "mount": [{"target": "/data", "volume_options": {"driver_config": {"name": "local", "options": [{"o": "bind"}]}}}],
    });
    let bytes = encode_msgpack(&spec, &cfg).unwrap();
    let m = mp_map(&bytes);
    assert_eq!(m["cpu_cfs_period"], Mp::from(100_000));
    assert!(m["cpu_cfs_period"].is_u64());
    assert_eq!(m["image_pull_timeout"], Mp::from("5m"));
    assert_eq!(
        m["port_map"],
        Mp::Array(vec![Mp::Map(vec![(Mp::from("db"), Mp::from(6379))])])
    );
    assert_eq!(
        m["storage_opt"],
        Mp::Map(vec![(Mp::from("size"), Mp::from("10"))])
    );
    assert_eq!(m["mounts"], Mp::Array(vec![]));
    assert_eq!(m["auth"], Mp::Nil);
    let decoded = decode_msgpack(&bytes).unwrap();
    assert_eq!(
        decoded["mount"][0]["type"],
        json!("volume"),
        "the mount body's default"
    );
    assert_eq!(decoded["mount"][0]["bind_options"], Value::Null);
    assert_eq!(
        decoded["mount"][0]["volume_options"]["driver_config"]["options"],
        json!([{"o": "bind"}])
    );
    assert_eq!(decoded["mount"][0]["volume_options"]["labels"], Value::Null);

    let bad = json!({
        "image": "redis",
        "port_map": {"db": 6379},
        "mount": [{}, {"volume_options": {"driver_config": {"nam": "x", "options": [{"o": 1}, {"p": ["x"]}]}}}],
        "auth": {"username": "u", "pasword": "p"},
    });
    let errors = normalize(&spec, &bad).unwrap_err();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "auth.pasword: unknown key; expected one of: password, username",
            "mount[1].volume_options.driver_config.nam: unknown key; expected one of: name, options",
            "mount[1].volume_options.driver_config.options[1].p: expected string, got an array",
            "port_map: expected list(map(number)), got an object",
        ]
    );
}

#[test]
fn block_defaults_are_read_as_the_block() {
    let auth = block(
        "auth",
        false,
        object(vec![
            ("user", attr("user", "string", true)),
            ("port", attr("port", "number", false)),
        ]),
    );
    let spec = object(vec![("auth", default(auth.clone(), lit(r#"{"user": 7}"#)))]);
    assert_eq!(
        normalize(&spec, &json!({})).unwrap(),
        json!({"auth": {"user": "7", "port": null}})
    );
    assert_eq!(
        normalize(&spec, &json!({"auth": {"user": "u"}})).unwrap(),
        json!({"auth": {"user": "u", "port": null}})
    );
    let bad = object(vec![("auth", default(auth, lit(r#"{"usr": "x"}"#)))]);
    let err = to_json_schema(&bad).unwrap_err();
    assert_eq!(err.path, "auth");
    assert_eq!(
        err.message,
        "default value: usr: unknown key; expected one of: port, user; user: missing required attribute (of type string)"
    );
}

/// A small deterministic generator of JSON values (xorshift), for fuzz-ish round trips.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn string(&mut self) -> String {
        const ALPHABET: &[&str] = &[
            "a", "Z", "0", " ", "\"", "\\", "\n", "\t", "${", "%{", "é", "🦀", "\u{1}", "}", "=",
        ];
        (0..self.next() % 6)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize])
            .collect()
    }
    fn value(&mut self, depth: usize) -> Value {
        match self.next() % if depth == 0 { 5 } else { 7 } {
            0 => Value::Null,
            1 => Value::Bool(self.next().is_multiple_of(2)),
            2 => json!((self.next() as i64) >> (self.next() % 64)),
            3 => json!(((self.next() % 2_000_000) as f64 - 1_000_000.0) / 64.0),
            4 => Value::String(self.string()),
            5 => Value::Array(
                (0..self.next() % 4)
                    .map(|_| self.value(depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..self.next() % 4)
                    .map(|_| (self.string(), self.value(depth - 1)))
                    .collect(),
            ),
        }
    }
}

#[test]
fn fuzzish_values_survive_literals_and_msgpack() {
    let spec = object(vec![("x", attr("x", "any", false))]);
    let mut generator = Gen(0x9e37_79b9_7f4a_7c15);
    for _ in 0..2000 {
        let v = generator.value(4);
        // JSON written as an HCL literal evaluates back to itself.
        let literal = default(attr("x", "any", false), lit(&from_schema::hcl_literal(&v)));
        let via_literal = normalize(&object(vec![("x", literal)]), &json!({})).unwrap();
        // And the value through msgpack comes back too (integral floats as ints).
        let via_msgpack =
            decode_msgpack(&encode_msgpack(&spec, &json!({"x": v})).unwrap()).unwrap();
        let canonical = normalize(&spec, &json!({"x": v})).unwrap();
        assert_eq!(via_msgpack, canonical, "{v}");
        if !v.is_null() {
            assert_eq!(via_literal, canonical, "{v}");
        }
    }
}

/// A literal of nested `for` expressions: `n` to the third power values if it were
/// evaluated (n = 400 is 64M values from 4 KiB of text).
fn for_bomb(n: usize) -> String {
    let items = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    format!("[for a in [{items}]: [for b in [{items}]: [for c in [{items}]: 0]]]")
}

#[test]
fn for_expression_bomb_literal_is_refused_not_evaluated() {
    // 64^3 = 262144 values if evaluated: more than the literal budget, and it would take
    // visible time; refused it takes neither.
    let bomb = object(vec![(
        "x",
        default(attr("x", "any", false), lit(&for_bomb(64))),
    )]);
    let started = std::time::Instant::now();
    let err = to_json_schema(&bomb).unwrap_err();
    assert_eq!(err.path, "x", "{err}");
    assert!(err.message.contains("a for expression"), "{err}");
    assert!(
        err.message.contains("only constant literals are supported"),
        "{err}"
    );
    assert!(err.message.len() < 300, "the literal is not echoed: {err}");
    let errors = encode_msgpack(&bomb, &json!({"x": 1})).unwrap_err();
    assert_eq!(errors, [err]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn evaluated_literals_are_refused_with_their_place() {
    for (text, what) in [
        ("true ? \"a\" : \"b\"", "a conditional"),
        ("1 + 1", "an operation"),
        ("upper(\"bash\")", "a function call"),
        ("\"${env.HOME}\"", "a template"),
        ("\"%{ for x in [1] }x%{ endfor }\"", "a template"),
        ("var.shell", "a traversal"),
    ] {
        let spec = object(vec![(
            "cfg",
            block(
                "cfg",
                false,
                object(vec![(
                    "shell",
                    default(attr("shell", "any", false), lit(text)),
                )]),
            ),
        )]);
        let err = to_json_schema(&spec).unwrap_err();
        assert_eq!(err.path, "cfg.shell", "{text}: {err}");
        assert!(err.message.contains(what), "{text}: {err}");
        assert!(
            err.message.contains("only constant literals are supported"),
            "{text}: {err}"
        );
    }
    // A plain `Literal` spec (not under a Default) is read the same way.
    let spec = object(vec![("k", lit("[for x in [1]: x]"))]);
    assert!(
        to_json_schema(&spec)
            .unwrap_err()
            .message
            .contains("a for expression")
    );
}

#[test]
fn long_names_keys_labels_and_types_are_refused() {
    let long = "k".repeat(300);
    // An object key.
    let spec = object(vec![(
        "cfg",
        block(
            "cfg",
            false,
            object(vec![(&long, attr("a", "string", false))]),
        ),
    )]);
    let err = to_json_schema(&spec).unwrap_err();
    assert_eq!(err.path, "cfg");
    assert!(err.message.contains("key"), "{err}");
    assert!(
        err.message.contains("300 bytes long (at most 256)"),
        "{err}"
    );
    assert!(
        err.message.len() < 200,
        "the key is not echoed whole: {err}"
    );
    // A name given in the spec.
    let spec = object(vec![("a", attr(&long, "string", false))]);
    let err = to_json_schema(&spec).unwrap_err();
    assert_eq!(err.path, "a");
    assert!(err.message.contains("attribute name"), "{err}");
    // A block_map label, and too many labels.
    let spec = object(vec![("m", block_map("m", &[&long], object(vec![])))]);
    let err = to_json_schema(&spec).unwrap_err();
    assert_eq!(err.path, "m");
    assert!(err.message.contains("block_map label"), "{err}");
    let labels = ["l"; 9];
    let spec = object(vec![("m", block_map("m", &labels, object(vec![])))]);
    assert!(
        to_json_schema(&spec)
            .unwrap_err()
            .message
            .contains("9 labels (at most 8)")
    );
    // 256 bytes is still a name.
    let ok = "k".repeat(256);
    let spec = object(vec![(&ok, attr(&ok, "string", false))]);
    assert!(to_json_schema(&spec).is_ok());
    // A type expression over 4 KiB, even a valid one.
    let ty = format!("list({}string)", " ".repeat(4096));
    let spec = object(vec![("a", attr("a", &ty, false))]);
    let err = to_json_schema(&spec).unwrap_err();
    assert_eq!(err.path, "a");
    assert!(err.message.contains("too long (at most 4096)"), "{err}");
}

#[test]
fn specs_over_ten_thousand_nodes_are_refused() {
    let attrs = |n: usize, prefix: &str| -> Vec<(String, Spec)> {
        (0..n)
            .map(|i| (format!("{prefix}{i}"), attr("", "string", false)))
            .collect()
    };
    let object_of = |attrs: Vec<(String, Spec)>| {
        s(K::Object(pb::Object {
            attributes: attrs.into_iter().collect(),
        }))
    };
    // The root and 9 999 attributes: 10 000 nodes.
    assert!(to_json_schema(&object_of(attrs(9_999, "a"))).is_ok());
    // One more: 10 001.
    let err = to_json_schema(&object_of(attrs(10_000, "a"))).unwrap_err();
    assert_eq!(err.path, "(root)");
    assert!(err.message.contains("more than 10000 nodes"), "{err}");
    // Counted across the whole tree: the root, then 101 blocks each of a block node, its
    // object and n attributes: n = 97 is 1 + 101 * 99 = 10 000 nodes and fits, n = 98 is
    // 10 101 and does not.
    for (per_block, fits) in [(97, true), (98, false)] {
        let spec = object_of(
            (0..101)
                .map(|b| {
                    let name = format!("b{b}");
                    let nested = block(&name, false, object_of(attrs(per_block, "a")));
                    (name, nested)
                })
                .collect(),
        );
        let got = to_json_schema(&spec);
        assert_eq!(got.is_ok(), fits, "{per_block}: {got:?}");
        if let Err(err) = got {
            assert!(err.message.contains("more than 10000 nodes"), "{err}");
            assert!(err.path.starts_with('b'), "{err}");
        }
    }
}
