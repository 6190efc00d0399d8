use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

use super::*;

pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hcl")
}

/// Nomad's output less its nulls: what we print.
pub(crate) fn without_nulls(v: &Json) -> Json {
    match v {
        Json::Object(m) => Json::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Json::Array(items) => Json::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// The inputs each golden fixture was printed with by `nomad job run -output`.
pub(crate) fn fixture_inputs(name: &str) -> VarInputs {
    match name {
        "vars.nomad.hcl" => VarInputs {
            vars: vec!["image_tag=v2".into(), "region=us-east".into()],
            var_files: vec![fixtures().join("vars.vars.hcl")],
            env: vec![],
        },
        "docs.nomad.hcl" => VarInputs {
            vars: vec!["message=hello".into()],
            ..VarInputs::default()
        },
        _ => VarInputs::default(),
    }
}

pub(crate) const GOLDEN: &[(&str, &str)] = &[
    ("web.nomad", "web.json"),
    ("vars.nomad.hcl", "vars.json"),
    ("batch.hcl", "batch.json"),
    ("docs.nomad.hcl", "docs.json"),
    ("config.hcl", "config.json"),
    ("services.nomad.hcl", "services.json"),
    ("artifacts.nomad.hcl", "artifacts.json"),
];

#[test]
fn artifact_and_template_blocks_become_the_tasks_files() {
    let spec = parse_job_file(
        &fixtures().join("artifacts.nomad.hcl"),
        &VarInputs::default(),
    )
    .expect("parses")
    .to_spec()
    .expect("converts")
    .spec;
    crate::validate(&spec).unwrap_or_else(|e| panic!("{e}"));
    let t = &spec.groups[0].tasks[0];
    assert_eq!(t.artifacts.len(), 2);
    let a = &t.artifacts[0];
    assert_eq!(a.source, "http://127.0.0.1:8080/app.tar.gz");
    assert_eq!(a.destination, "local/app");
    assert_eq!(a.mode, crate::ArtifactMode::Dir);
    assert!(a.options["checksum"].starts_with("sha256:"));
    assert_eq!(a.headers["X-Team"], "a");
    assert_eq!(t.artifacts[1].destination, "local/");
    assert_eq!(t.artifacts[1].options["archive"], "false");
    let tm = &t.templates[0];
    assert_eq!(tm.destination, "secrets/app.env");
    assert!(tm.env);
    assert_eq!(tm.change_mode, crate::ChangeMode::Signal);
    assert_eq!(tm.change_signal.as_deref(), Some("SIGHUP"));
    assert_eq!(tm.perms, "600");
    assert_eq!(tm.splay, std::time::Duration::from_secs(2));
    assert_eq!(
        (tm.left_delimiter.as_str(), tm.right_delimiter.as_str()),
        ("[[", "]]")
    );
    let tm = &t.templates[1];
    assert_eq!(tm.source, "local/in.tpl");
    assert_eq!(tm.change_mode, crate::ChangeMode::Restart);
    assert_eq!(tm.perms, "0644");

    // Back to Nomad's shape and in again: nothing lost.
    let wire = crate::nomad::Job::from(&spec);
    let again = wire.to_spec().expect("converts back").spec;
    assert_eq!(again.groups[0].tasks[0].artifacts, t.artifacts);
    assert_eq!(again.groups[0].tasks[0].templates, t.templates);

    // A hostile destination is refused naming the field.
    let text = task_file(
        "      template {\n        data = \"x\"\n        destination = \"../../etc/cron.d/x\"\n      }",
    );
    let e = crate::validate(
        &parse_text(&text)
            .map(|j| to_job("job.hcl", j).unwrap().to_spec().unwrap().spec)
            .unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.field, "group[0].task[0].template[0].destination", "{e}");
}

#[test]
fn golden_files_match_nomads_output() {
    for (job, expected) in GOLDEN {
        let ours = parse_file(&fixtures().join(job), &fixture_inputs(job))
            .unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(fixtures().join(expected)).expect("fixture");
        let nomad: Json = serde_json::from_str(&text).expect("fixture JSON");
        assert_eq!(
            ours,
            without_nulls(&nomad),
            "{job}: ours (left) differs from Nomad's (right)"
        );
    }
}

#[test]
fn golden_files_become_valid_job_specs() {
    let job = "vars.nomad.hcl";
    let wire = parse_job_file(&fixtures().join(job), &fixture_inputs(job))
        .unwrap_or_else(|e| panic!("{e}"));
    let parsed = wire.to_spec().unwrap_or_else(|e| panic!("{job}: {e}"));
    crate::validate(&parsed.spec).unwrap_or_else(|e| panic!("{job}: {e:?}"));
    assert_eq!(wire.id.as_deref(), Some(parsed.spec.name.as_str()));
    let shop = parse_job_file(
        &fixtures().join("vars.nomad.hcl"),
        &fixture_inputs("vars.nomad.hcl"),
    )
    .expect("parses")
    .to_spec()
    .expect("converts")
    .spec;
    assert_eq!(shop.datacenters, vec!["dc1".to_owned(), "dc2".to_owned()]);
    assert_eq!(shop.groups[0].count, 4);
    // web.nomad has every argument Nomad 1.0 prints: its update blocks (canaries,
    // auto-revert, a group's own max_parallel) become the group's strategy.
    let web = parse_job_file(&fixtures().join("web.nomad"), &VarInputs::default())
        .expect("parses")
        .to_spec()
        .expect("converts")
        .spec;
    let group_update = web.update_of(&web.groups[0]);
    assert_eq!(
        (
            web.update.max_parallel,
            group_update.max_parallel,
            group_update.canary,
            group_update.auto_revert,
            group_update.health_check,
        ),
        (2, 1, 1, true, crate::HealthCheckMode::TaskStates)
    );
    let batch =
        parse_job_file(&fixtures().join("batch.hcl"), &VarInputs::default()).expect("parses");
    let refused = batch
        .to_spec()
        .expect_err("distinct_property is not supported yet");
    assert_eq!(
        refused.to_string(),
        "TaskGroups[1].Constraints[0].Operand: not supported yet by Drover"
    );
}

fn parse_text(text: &str) -> Result<Json, HclError> {
    parse("job.hcl", &fixtures(), text, &VarInputs::default())
}

fn err(text: &str) -> String {
    match parse_text(text) {
        Ok(j) => panic!("parsed, expected an error: {j}"),
        Err(e) => e.to_string(),
    }
}

fn task_file(inner: &str) -> String {
    format!(
        "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"raw_exec\"\n{inner}\n    }}\n  }}\n}}\n"
    )
}

#[test]
fn an_identity_block_says_where_the_token_goes_and_left_out_fields_are_false() {
    let spec = |inner: &str| {
        let text = task_file(inner);
        let json = parse_text(&text).unwrap_or_else(|e| panic!("{e}"));
        let job = to_job("job.hcl", json.clone())
            .unwrap()
            .to_spec()
            .unwrap()
            .spec;
        (json, job.groups[0].tasks[0].clone())
    };
    let (json, t) = spec("      identity {\n        env  = true\n        file = false\n      }");
    assert_eq!(
        json["Job"]["TaskGroups"][0]["Tasks"][0]["Identity"],
        json!({"Env": true, "File": false})
    );
    assert_eq!(
        t.identity(),
        crate::TaskIdentity {
            env: true,
            file: false
        }
    );
    // Nomad's: a field left out of the block is false.
    let (_, t) = spec("      identity {\n        env = true\n      }");
    assert_eq!(
        t.identity(),
        crate::TaskIdentity {
            env: true,
            file: false
        }
    );
    // No block: the file, not the variable.
    let (json, t) = spec("");
    assert!(
        json["Job"]["TaskGroups"][0]["Tasks"][0]
            .get("Identity")
            .is_none()
    );
    assert_eq!(t.identity, None);
    assert_eq!(t.identity(), crate::TaskIdentity::DEFAULT);
    assert_eq!(
        err(&task_file("      identity {\n        envv = true\n      }")),
        "job.hcl:6:9: unsupported argument \"envv\"; did you mean \"env\"?"
    );
}

#[test]
fn typo_is_named_with_a_suggestion_and_its_place() {
    let text = "job \"j\" {\n  group \"g\" {\n    cunt = 2\n  }\n}\n";
    assert_eq!(
        err(text),
        "job.hcl:3:5: unsupported argument \"cunt\"; did you mean \"count\"?"
    );
}

#[test]
fn unknown_block_is_named() {
    let text = "job \"j\" {\n  group \"g\" {\n    tsak \"t\" {\n    }\n  }\n}\n";
    assert_eq!(
        err(text),
        "job.hcl:3:5: unsupported block \"tsak\"; did you mean \"task\"?"
    );
    let text = "job \"j\" {\n  foo {\n  }\n}\n";
    assert_eq!(err(text), "job.hcl:2:3: unsupported block \"foo\"");
}

#[test]
fn nomad_blocks_drover_lacks_are_refused_not_dropped() {
    let text = task_file("      vault {\n        policies = [\"x\"]\n      }");
    assert_eq!(
        err(&text),
        "job.hcl:5:7: block \"vault\" is not supported by Drover yet"
    );
    for block in UNSUPPORTED_BLOCKS {
        let text = task_file(&format!("      {block} {{\n      }}"));
        assert_eq!(
            err(&text),
            format!("job.hcl:5:7: block \"{block}\" is not supported by Drover yet")
        );
    }
    let text = "job \"j\" {\n  all_at_once = true\n}\n";
    assert_eq!(
        err(text),
        "job.hcl:2:3: argument \"all_at_once\" is not supported by Drover yet"
    );
}

#[test]
fn a_value_of_the_wrong_type_is_placed_on_the_value() {
    let text = "job \"j\" {\n  group \"g\" {\n    count = \"two\"\n  }\n}\n";
    assert_eq!(
        err(text),
        "job.hcl:3:13: \"count\": a number is required, found string \"two\""
    );
    let text = task_file("      kill_timeout = \"soon\"");
    assert_eq!(
        err(&text),
        "job.hcl:5:22: \"kill_timeout\": a duration is required (such as \"30s\" or \"1h30m\"), found string \"soon\""
    );
    // As Nomad converts: a numeric string is a number.
    let ok =
        parse_text("job \"j\" {\n  group \"g\" {\n    count = \"3\"\n  }\n}\n").expect("parses");
    assert_eq!(ok["Job"]["TaskGroups"][0]["Count"], 3);
}

#[test]
fn syntax_errors_are_placed() {
    let e = err("job \"j\" {\n  group \"g\" {\n    count = = 2\n  }\n}\n");
    assert!(e.starts_with("job.hcl:3:13: syntax error: "), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn a_file_without_a_job_or_with_two_is_refused() {
    assert_eq!(
        err("locals {\n  a = 1\n}\n"),
        "job.hcl: no job block: the file must hold one job \"NAME\" { ... }"
    );
    assert_eq!(
        err("job \"a\" {\n}\njob \"b\" {\n}\n"),
        "job.hcl:3:1: only one job block is allowed in a file"
    );
    assert_eq!(
        err("job {\n}\n"),
        "job.hcl:1:1: block \"job\" needs exactly one label (its name), as in job \"example\" { ... }"
    );
}

#[test]
fn runtime_references_stay_text_for_the_client() {
    let text = task_file(
        "      env {\n        A = \"${NOMAD_PORT_http}\"\n        B = \"${attr.kernel.name}\"\n        C = \"x-${node.unique.name}-y\"\n        D = \"${meta.rack}\"\n        E = \"${env[\"HOME\"]}\"\n        F = attr.cpu.arch\n        G = \"$${literal}\"\n      }",
    );
    let job = parse_text(&text).expect("parses");
    assert_eq!(
        job["Job"]["TaskGroups"][0]["Tasks"][0]["Env"],
        json!({
            "A": "${NOMAD_PORT_http}",
            "B": "${attr.kernel.name}",
            "C": "x-${node.unique.name}-y",
            "D": "${meta.rack}",
            "E": "${env[\"HOME\"]}",
            "F": "${attr.cpu.arch}",
            "G": "${literal}",
        })
    );
}

const VARS_FILE: &str = r#"
variable "dc" {
  type    = string
  default = "dc1"
}
variable "n" {
  type = number
}
variable "tags" {
  type    = list(string)
  default = []
}
locals {
  # uses a local defined after it
  label = "${local.base}-${var.n}"
  base  = upper(var.dc)
}
job "j" {
  datacenters = [var.dc]
  meta {
    label = local.label
    tags  = join(",", var.tags)
  }
  group "g" {
    count = var.n
  }
}
"#;

fn parse_vars(inputs: &VarInputs) -> Result<Json, HclError> {
    parse("vars.hcl", &fixtures(), VARS_FILE, inputs)
}

#[test]
fn variables_take_values_from_env_var_files_and_var_in_that_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let var_file = dir.path().join("v.hcl");
    std::fs::write(&var_file, "n = 5\ndc = \"from-file\"\n").expect("write");
    let inputs = VarInputs {
        vars: vec!["dc=from-var".into(), "tags=[\"a\", \"b\"]".into()],
        var_files: vec![var_file.clone()],
        env: vec![
            ("NOMAD_VAR_n".into(), "2".into()),
            ("NOMAD_VAR_dc".into(), "from-env".into()),
        ],
    };
    let job = parse_vars(&inputs).expect("parses");
    assert_eq!(job["Job"]["Datacenters"], json!(["from-var"]));
    assert_eq!(job["Job"]["TaskGroups"][0]["Count"], 5);
    assert_eq!(
        job["Job"]["Meta"],
        json!({"label": "FROM-VAR-5", "tags": "a,b"})
    );

    let env_only = VarInputs {
        env: vec![
            ("NOMAD_VAR_n".into(), "2".into()),
            ("NOMAD_VAR_unknown".into(), "x".into()),
        ],
        ..VarInputs::default()
    };
    let job = parse_vars(&env_only).expect("parses");
    assert_eq!(job["Job"]["TaskGroups"][0]["Count"], 2);
    assert_eq!(job["Job"]["Datacenters"], json!(["dc1"]));
}

#[test]
fn variable_errors_are_clear() {
    let missing = parse_vars(&VarInputs::default()).expect_err("n has no value");
    assert_eq!(
        missing.to_string(),
        "vars.hcl:6:1: variable \"n\" has no value: give it a default, -var n=..., a -var-file or NOMAD_VAR_n"
    );
    let undeclared = parse_vars(&VarInputs {
        vars: vec!["n=1".into(), "nope=1".into()],
        ..VarInputs::default()
    })
    .expect_err("nope is not declared");
    assert_eq!(
        undeclared.to_string(),
        "vars.hcl: -var nope: no variable \"nope\" is declared in this file"
    );
    let bad = parse_vars(&VarInputs {
        vars: vec!["n=many".into()],
        ..VarInputs::default()
    })
    .expect_err("n is a number");
    assert!(bad.to_string().starts_with("vars.hcl: -var n: "), "{bad}");

    let dir = tempfile::tempdir().expect("tempdir");
    let var_file = dir.path().join("v.hcl");
    std::fs::write(&var_file, "n = 1\n\nzone = \"a\"\n").expect("write");
    let e = parse_vars(&VarInputs {
        var_files: vec![var_file.clone()],
        ..VarInputs::default()
    })
    .expect_err("zone is not declared");
    assert_eq!(
        e.to_string(),
        format!(
            "{}:3:1: no variable \"zone\" is declared in vars.hcl",
            var_file.display()
        )
    );

    let e = err("job \"j\" {\n  datacenters = [var.nope]\n}\n");
    assert!(e.starts_with("job.hcl:2:17: cannot evaluate: "), "{e}");
}

#[test]
fn functions_beyond_nomad_1_0() {
    let text = r##"
locals {
  nums = tolist([3, 1])
}
job "j" {
  meta {
    a = tostring(12)
    b = tonumber("7") + 1
    c = length(toset(["x", "x", "y"]))
    d = length(uuidv4())
    e = regex_replace("a1b22", "[0-9]+", "#")
    f = element(local.nums, 3)
    g = coalesce(null, "z")
    h = length(timestamp()) > 0
  }
}
"##;
    let job = parse_text(text).expect("parses");
    assert_eq!(
        job["Job"]["Meta"],
        json!({"a": "12", "b": "8", "c": "2", "d": "36", "e": "a#b#", "f": "1", "g": "z", "h": "true"})
    );
}

#[test]
fn memory_max_and_task_blocks_read() {
    let text = task_file(
        "      resources {\n        cpu        = 100\n        memory     = 64\n        memory_max = 128\n      }\n      lifecycle {\n        hook = \"prestart\"\n      }",
    );
    let job = parse_text(&text).expect("parses");
    let task = &job["Job"]["TaskGroups"][0]["Tasks"][0];
    assert_eq!(
        task["Resources"],
        json!({"CPU": 100, "MemoryMB": 64, "MemoryMaxMB": 128})
    );
    assert_eq!(
        task["Lifecycle"],
        json!({"Hook": "prestart", "Sidecar": false})
    );
}

#[test]
fn file_is_read_relative_to_the_job_and_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("msg.txt"), "hi").expect("write");
    std::fs::write(
        dir.path().join("big.txt"),
        vec![b'x'; MAX_INCLUDED_FILE_BYTES as usize + 1],
    )
    .expect("write");
    let job_path = dir.path().join("j.hcl");
    std::fs::write(
        &job_path,
        "job \"j\" {\n  meta {\n    m = file(\"msg.txt\")\n  }\n}\n",
    )
    .expect("write");
    let job = parse_file(&job_path, &VarInputs::default()).expect("parses");
    assert_eq!(job["Job"]["Meta"]["m"], "hi");
    std::fs::write(
        &job_path,
        "job \"j\" {\n  meta {\n    m = file(\"big.txt\")\n  }\n}\n",
    )
    .expect("write");
    let e = parse_file(&job_path, &VarInputs::default()).expect_err("too big");
    assert!(e.to_string().contains("is larger than"), "{e}");
    // A FIFO would block for ever: only regular files are read.
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    std::fs::write(
        &job_path,
        "job \"j\" {\n  meta {\n    m = file(\"fifo\")\n  }\n}\n",
    )
    .expect("write");
    let e = parse_file(&job_path, &VarInputs::default()).expect_err("a fifo");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn go_durations() {
    assert_eq!(eval::parse_go_duration("1h30m"), Some(5_400_000_000_000));
    assert_eq!(eval::parse_go_duration("1.5s"), Some(1_500_000_000));
    assert_eq!(eval::parse_go_duration("300ms"), Some(300_000_000));
    assert_eq!(eval::parse_go_duration("0"), Some(0));
    assert_eq!(eval::parse_go_duration("10"), None);
    assert_eq!(eval::parse_go_duration("1 s"), None);
}

#[test]
fn values_are_bounded() {
    // Each local doubles the last: 2^30 elements unless the parser stops it.
    let mut text = String::from("locals {\n  l0 = [\"xxxxxxxxxxxxxxxx\"]\n");
    for i in 1..=30 {
        text.push_str(&format!(
            "  l{i} = concat(local.l{}, local.l{})\n",
            i - 1,
            i - 1
        ));
    }
    text.push_str("}\njob \"j\" {\n  meta {\n    n = length(local.l30)\n  }\n}\n");
    let e = err(&text);
    assert!(
        e.contains(&format!("the value is larger than {MAX_VALUE_BYTES} bytes")),
        "{e}"
    );
}

#[test]
fn text_from_elsewhere_reads_no_files() {
    let text = "job \"j\" {\n  meta {\n    m = file(\"/etc/hostname\")\n  }\n}\n";
    let e = parse_without_files("request", text, &VarInputs::default()).expect_err("no files");
    assert!(
        e.to_string().starts_with("request:3:9: cannot evaluate: "),
        "{e}"
    );
    assert!(
        e.to_string().contains("file() cannot read files here"),
        "{e}"
    );
    // Nor a relative path, which would be the server's working directory's.
    for name in ["../../../../../../etc/passwd", "Cargo.toml", "."] {
        let text = format!("job \"j\" {{\n  meta {{\n    m = file(\"{name}\")\n  }}\n}}\n");
        let e = parse_without_files("request", &text, &VarInputs::default())
            .expect_err("no relative files");
        assert!(
            e.to_string().contains("file() cannot read files here"),
            "{name}: {e}"
        );
    }
    let e = parse_without_files(
        "request",
        text,
        &VarInputs {
            var_files: vec![PathBuf::from("/etc/passwd")],
            ..VarInputs::default()
        },
    )
    .expect_err("no var files");
    assert_eq!(e.to_string(), "request: variable files cannot be read here");
}

#[test]
fn variables_block_for_keys_and_cycles() {
    let text = r#"
variables {
  tiers = { web = 2, db = 1 }
}
job "j" {
  meta {
    pairs = join(",", [for k, v in var.tiers : "${k}=${v}@${node.class}"])
    lit   = join(",", [for k, v in { z = 1, a = 2 } : k])
  }
}
"#;
    let job = parse_text(text).expect("parses");
    assert_eq!(
        job["Job"]["Meta"]["pairs"],
        "db=1@${node.class},web=2@${node.class}"
    );
    assert_eq!(job["Job"]["Meta"]["lit"], "a,z");

    let cycle = "locals {\n  a = local.b\n  b = local.a\n}\njob \"j\" {\n}\n";
    let e = err(cycle);
    assert!(e.starts_with("job.hcl:2:7: cannot evaluate: "), "{e}");
}

#[test]
fn format_takes_flags_width_and_precision_as_nomad_does() {
    // The expected values are what `nomad job run -output` (1.0.18) printed for them.
    let text = r#"
job "j" {
  meta {
    a = format("%03d", 2)
    b = format("%-5s|", "ab")
    c = format("%5.1f", 3.14159)
    d = format("%+d", 5)
    e = format("%x", 255)
    f = format("%.2s", "hello")
    g = format("%05d", -42)
    h = format("%%|%v|%t", 7, true)
  }
}
"#;
    let job = parse_text(text).expect("parses");
    assert_eq!(
        job["Job"]["Meta"],
        json!({"a": "002", "b": "ab   |", "c": "  3.1", "d": "+5", "e": "ff", "f": "he", "g": "-0042", "h": "%|7|true"})
    );
    let e = err("job \"j\" {\n  meta {\n    a = format(\"%99999d\", 1)\n  }\n}\n");
    assert!(e.contains("width or precision above"), "{e}");
}

fn meta_file(locals: &str, meta: &str) -> String {
    format!("locals {{\n{locals}}}\njob \"j\" {{\n  meta {{\n{meta}  }}\n}}\n")
}

#[test]
fn values_nested_deeper_than_64_levels_are_refused() {
    // The attack that overflowed the stack, at a safe scale: each local wraps the last
    // in 60 levels (hcl-edit allows 64 in one literal; locals used to stack them).
    let wrap = |inner: &str| format!("{}{inner}{}", "[".repeat(60), "]".repeat(60));
    let mut locals = format!("  l0 = {}\n", wrap("1"));
    for i in 1..3000 {
        locals.push_str(&format!(
            "  l{i} = {}\n",
            wrap(&format!("local.l{}", i - 1))
        ));
    }
    let e = err(&meta_file(&locals, "    m = jsonencode(local.l2999)\n"));
    assert!(
        e.starts_with("job.hcl:3:8: ") && e.contains("nested deeper than 64 levels"),
        "{e}"
    );

    // 64 levels are a value; 65 are refused, whichever function builds them.
    let json = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
    let ok = parse_text(&meta_file(
        "",
        &format!("    m = length(jsondecode(\"{}\"))\n", json(64)),
    ))
    .expect("64 levels parse");
    assert_eq!(ok["Job"]["Meta"]["m"], "1");
    let e = err(&meta_file(
        "",
        &format!("    m = length(jsondecode(\"{}\"))\n", json(65)),
    ));
    assert!(e.contains("nested deeper than 64 levels"), "{e}");
}

#[test]
fn locals_in_reverse_order_are_bounded_work() {
    // Each round of the locals' evaluation defines one: n rounds of n tries.
    let locals: String = (0..3000)
        .map(|i| format!("  l{i} = local.l{}\n", i + 1))
        .chain(std::iter::once("  l3000 = 1\n".to_owned()))
        .collect();
    let e = err(&meta_file(&locals, "    m = local.l0\n"));
    assert!(e.contains("bytes of work"), "{e}");
    // A few out of order are fine.
    let job = parse_text(&meta_file(
        "  a = local.b\n  b = local.c\n  c = 3\n",
        "    m = local.a\n",
    ))
    .expect("locals in any order");
    assert_eq!(job["Job"]["Meta"]["m"], "3");
}

/// A 40 KB string local, cheap to build.
const S40K: &str = "  s = join(\"\", [for a in range(10) : format(\"%4000s\", \"\")])\n";

#[test]
fn a_parse_has_a_work_budget_reset_for_each_parse() {
    // Each entry builds a 4 MB list (4 MB of format() results, and the for's bound of
    // 1 KiB an element): sixteen of them are more work than one parse may do.
    let entry = |i: usize| {
        format!("    m{i} = length([for a in range(1024) : format(\"%4000s\", \"\")])\n")
    };
    let many: String = (0..16).map(entry).collect();
    let e = err(&meta_file("", &many));
    assert!(
        e.contains(&format!(
            "the job file's expressions need more than {MAX_PARSE_WORK_BYTES} bytes of work"
        )),
        "{e}"
    );
    // Fewer fit, and the budget is afresh for each parse.
    let few: String = (0..8).map(entry).collect();
    for _ in 0..3 {
        let job = parse_text(&meta_file("", &few)).expect("within the budget");
        assert_eq!(job["Job"]["Meta"]["m7"], "1024");
    }
}

#[test]
fn functions_that_multiply_their_input_are_bounded_before_they_run() {
    for expr in [
        // 40 KB × 40 KB.
        "length(replace(local.s, \" \", local.s))",
        "length(regex_replace(local.s, \" \", local.s))",
        "length(join(local.s, split(\"\", local.s)))",
        // A million pieces of a string that doubles through locals.
        "length(split(\"\", replace(format(\"%4000s\", \"\"), \" \", format(\"%4000s\", \"\"))))",
        // Copies of a local, each a reference hcl-rs copies before any function runs.
        &format!("length([{}])", vec!["local.s"; 2000].join(", ")),
        &format!("length(\"{}\")", vec!["${local.s}"; 2000].join("")),
    ] {
        let e = err(&meta_file(S40K, &format!("    m = {expr}\n")));
        assert!(e.contains("bytes of work"), "{expr}: {e}");
    }
}

#[test]
fn distinct_is_linear() {
    // 100 000 elements: quadratic would be 10^10 comparisons.
    let job = parse_text(&meta_file(
        "  l = flatten([for a in range(1000) : range(100)])\n",
        "    m = length(distinct(local.l))\n    n = length(toset(concat(local.l, [\"x\"])))\n",
    ))
    .expect("distinct");
    assert_eq!(job["Job"]["Meta"]["m"], "100");
    assert_eq!(job["Job"]["Meta"]["n"], "101");
}

#[test]
fn a_for_inside_another_is_refused_on_the_inner_for() {
    let e = err(&meta_file(
        "",
        "    m = jsonencode([for a in range(1024) : [for b in range(64) : format(\"%4096s\", \"\")]])\n",
    ));
    assert_eq!(
        e,
        "job.hcl:5:44: a for expression inside another is not supported by Drover"
    );
    for expr in [
        "[for a in [for b in range(3) : b] : a]",
        "{for a in range(3) : [for b in range(3) : b][0] => a}",
        "[for a in range(3) : a if length([for b in range(3) : b]) > 0]",
    ] {
        let e = err(&meta_file("", &format!("    m = jsonencode({expr})\n")));
        assert!(
            e.ends_with("a for expression inside another is not supported by Drover"),
            "{expr}: {e}"
        );
    }
    // A template's `%{ for }` too, with its text counted.
    let e = err(&meta_file(
        "",
        "    m = \"%{ for a in range(3) }%{ for b in range(3) }x%{ endfor }%{ endfor }\"\n",
    ));
    assert!(
        e.ends_with("a for expression inside another is not supported by Drover"),
        "{e}"
    );
    let text = "x".repeat(20_000);
    let e = err(&meta_file(
        "",
        &format!("    m = \"%{{ for a in range(1024) }}{text}%{{ endfor }}\"\n"),
    ));
    assert!(e.contains("this for expression may build"), "{e}");
    let job = parse_text(&meta_file(
        "",
        "    m = \"%{ for a in range(3) }${a}%{ endfor }\"\n",
    ))
    .expect("a template for");
    assert_eq!(job["Job"]["Meta"]["m"], "012");
    // One level of for is fine.
    let job = parse_text(&meta_file(
        "",
        "    m = jsonencode([for a in range(3) : a * 2 if a > 0])\n",
    ))
    .expect("a for");
    assert_eq!(job["Job"]["Meta"]["m"], "[2,4]");
}

#[test]
fn a_for_whose_body_copies_a_big_local_is_refused_before_it_runs() {
    let e = err(&meta_file(
        S40K,
        "    m = length([for a in range(1024) : local.s])\n",
    ));
    assert!(
        e.starts_with("job.hcl:6:16: this for expression may build ")
            && e.contains(&format!(
                "more than Drover's limit of {MAX_FOR_BYTES} bytes"
            )),
        "{e}"
    );
    // A few copies are fine.
    let job = parse_text(&meta_file(
        S40K,
        "    m = length([for a in range(4) : local.s])\n",
    ))
    .expect("a small for");
    assert_eq!(job["Job"]["Meta"]["m"], "4");
}

#[test]
fn variables_and_locals_together_are_bounded() {
    // Each 3.5 MB, under the bound of one value; five are more than all may hold.
    let mut locals =
        String::from("  l1 = join(\"\", [for a in range(875) : format(\"%4000s\", \"\")])\n");
    for i in 2..=5 {
        locals.push_str(&format!("  l{i} = local.l1\n"));
    }
    let e = err(&meta_file(&locals, "    m = length(local.l5)\n"));
    assert!(
        e.starts_with("job.hcl:6:8: local.l5: ")
            && e.contains(&format!(
                "variables and locals together are larger than {MAX_VARIABLES_BYTES} bytes"
            )),
        "{e}"
    );
}

fn group_file(inner: &str) -> String {
    format!(
        "job \"j\" {{\n  group \"g\" {{\n{inner}\n    task \"t\" {{\n      driver = \"raw_exec\"\n    }}\n  }}\n}}\n"
    )
}

#[test]
fn service_provider_is_nomads_only() {
    let text = group_file("    service {\n      provider = \"nomad\"\n    }");
    let job = parse_text(&text).expect("parses");
    assert_eq!(
        job["Job"]["TaskGroups"][0]["Services"][0]["Provider"],
        "nomad"
    );
    let text = group_file("    service {\n      provider = \"consul\"\n    }");
    assert_eq!(
        err(&text),
        "job.hcl:4:18: provider \"consul\" is not supported: Drover keeps services itself: provider = \"nomad\""
    );
}

#[test]
fn service_and_check_arguments_drover_lacks_are_refused_by_name() {
    for (inner, place, name) in [
        (
            "    service {\n      address_mode = \"driver\"\n    }",
            "4:7",
            "address_mode",
        ),
        (
            "    service {\n      canary_tags = [\"c\"]\n    }",
            "4:7",
            "canary_tags",
        ),
        (
            "    service {\n      enable_tag_override = true\n    }",
            "4:7",
            "enable_tag_override",
        ),
        (
            "    service {\n      on_update = \"ignore\"\n    }",
            "4:7",
            "on_update",
        ),
        (
            "    service {\n      check {\n        tls_skip_verify = true\n      }\n    }",
            "5:9",
            "tls_skip_verify",
        ),
        (
            "    service {\n      check {\n        grpc_service = \"x\"\n      }\n    }",
            "5:9",
            "grpc_service",
        ),
        ("    network {\n      mbits = 10\n    }", "4:7", "mbits"),
    ] {
        assert_eq!(
            err(&group_file(inner)),
            format!("job.hcl:{place}: argument \"{name}\" is not supported by Drover yet")
        );
    }
    let text = group_file("    service {\n      connect {\n      }\n    }");
    assert_eq!(
        err(&text),
        "job.hcl:4:7: block \"connect\" is not supported by Drover yet"
    );
    // As Nomad's parser: header is a block.
    let text = group_file(
        "    service {\n      check {\n        header = { X = [\"a\"] }\n      }\n    }",
    );
    assert_eq!(
        err(&text),
        "job.hcl:5:9: \"header\" is a block here: write header { ... }"
    );
    let text = group_file(
        "    service {\n      check {\n        header {\n          X = \"a\"\n        }\n      }\n    }",
    );
    assert!(
        err(&text).contains("header \"X\": a list of strings is required"),
        "{}",
        err(&text)
    );
    let text = group_file("    service {\n      chek {\n      }\n    }");
    assert_eq!(
        err(&text),
        "job.hcl:4:7: unsupported block \"chek\"; did you mean \"check\"?"
    );
}

#[test]
fn a_network_belongs_to_the_group() {
    let text = task_file("      resources {\n        network {\n        }\n      }");
    assert!(
        err(&text)
            .starts_with("job.hcl:6:9: network in resources: move network { ... } to the group"),
        "{}",
        err(&text)
    );
    let text = task_file("      network {\n      }");
    assert!(
        err(&text)
            .starts_with("job.hcl:5:7: a task has no network: move network { ... } to the group"),
        "{}",
        err(&text)
    );
    let text = group_file("    network {\n    }\n    network {\n    }");
    assert_eq!(
        err(&text),
        "job.hcl:5:5: only one \"network\" block is allowed here"
    );
    let text = group_file("    network {\n      port {\n      }\n    }");
    assert!(
        err(&text).contains("needs exactly one label"),
        "{}",
        err(&text)
    );
}

/// The fenced blocks of `lang` in docs/services.md.
/// The `lang` code blocks of the "Job files" section of docs/services.md (the other
/// sections show fragments of jobs).
fn doc_examples(lang: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/services.md");
    let text = std::fs::read_to_string(&path).expect("docs/services.md");
    let start = text.find("\n## Job files\n").expect("a Job files section");
    let section = &text[start + 1..];
    let section = match section[1..].find("\n## ") {
        Some(end) => &section[..end + 1],
        None => section,
    };
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = section;
    while let Some(start) = rest.find(&fence) {
        let body = &rest[start + fence.len()..];
        let end = body.find("```").expect("a closed fence");
        out.push(body[..end].to_owned());
        rest = &body[end + 3..];
    }
    out
}

#[test]
fn the_job_files_of_the_services_docs_are_valid() {
    let hcl = doc_examples("hcl");
    assert_eq!(hcl.len(), 2, "a host and a bridge example");
    for text in &hcl {
        let job = parse_job("services.md", &fixtures(), text, &VarInputs::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let spec = job.to_spec().unwrap_or_else(|e| panic!("{e}")).spec;
        crate::validate(&spec).unwrap_or_else(|e| panic!("{e}"));
        assert!(spec.groups[0].network.is_some() && !spec.groups[0].services.is_empty());
    }
    let toml = doc_examples("toml");
    assert_eq!(toml.len(), 2, "the same jobs in TOML");
    for (text, hcl_text) in toml.iter().zip(&hcl) {
        let from_toml = crate::jobfile::parse_and_validate(text, "services.md")
            .unwrap_or_else(|e| panic!("{e}"));
        let from_hcl = parse_job("services.md", &fixtures(), hcl_text, &VarInputs::default())
            .expect("parses")
            .to_spec()
            .expect("converts")
            .spec;
        // Both formats say the same of ports and services.
        assert_eq!(from_toml.groups[0].network, from_hcl.groups[0].network);
        assert_eq!(from_toml.groups[0].services, from_hcl.groups[0].services);
    }
}

/// A task's `device` blocks (issue 27) become Nomad's `Resources.Devices`, and then
/// the task's device requests; affinities are refused; validation checks count and
/// name.
#[test]
fn device_blocks_become_device_requests() {
    let text = task_file(
        "      resources {\n        device \"nvidia/gpu\" {\n          count = 2\n          constraint {\n            attribute = \"${device.attr.memory}\"\n            operator  = \">=\"\n            value     = \"4\"\n          }\n        }\n        device \"fpga\" {}\n      }",
    );
    let json = parse_text(&text).expect("parses");
    let devices = &json["Job"]["TaskGroups"][0]["Tasks"][0]["Resources"]["Devices"];
    assert_eq!(devices[0]["Name"], "nvidia/gpu", "{json:#}");
    assert_eq!(devices[0]["Count"], 2);
    assert_eq!(
        devices[0]["Constraints"][0]["LTarget"],
        "${device.attr.memory}"
    );
    assert_eq!(devices[1]["Count"], 1);
    let job = to_job("job.hcl", json).expect("a job");
    let parsed = job.to_spec().expect("converts");
    let task = &parsed.spec.groups[0].tasks[0];
    assert_eq!(task.devices.len(), 2);
    assert_eq!(task.devices[0].count, 2);
    assert_eq!(task.devices[0].constraints[0].value, "4");
    crate::validate::validate(&parsed.spec).expect("valid");

    // Back to Nomad's shape and again: the same requests.
    let mut wire = crate::nomad::Job::from(&parsed.spec);
    let again = wire.to_spec().expect("converts back");
    assert_eq!(again.spec.groups[0].tasks[0].devices, task.devices);
    // Nomad's JSON with an affinity: refused, naming the field.
    let groups = wire.task_groups.as_mut().expect("groups");
    let tasks = groups[0].tasks.as_mut().expect("tasks");
    let res = tasks[0].resources.as_mut().expect("resources");
    res.devices.as_mut().expect("devices")[0].affinities =
        Some(json!([{"LTarget": "${device.model}", "RTarget": "x", "Weight": 50}]));
    let e = wire.to_spec().unwrap_err().to_string();
    assert!(
        e.contains("Resources.Devices[0].Affinities") && e.contains("not supported"),
        "{e}"
    );

    let text = task_file(
        "      resources {\n        device \"gpu\" {\n          affinity {\n          }\n        }\n      }",
    );
    assert_eq!(
        err(&text),
        "job.hcl:7:11: block \"affinity\" is not supported by Drover yet"
    );

    let mut bad = parsed.spec.clone();
    bad.groups[0].tasks[0].devices[0].count = 65;
    let e = crate::validate::validate(&bad).unwrap_err();
    assert_eq!(e.field, "group[0].task[0].device[0].count", "{e:?}");
    let mut bad = parsed.spec.clone();
    bad.groups[0].tasks[0].devices[0].name = "a/b/c/d".into();
    let e = crate::validate::validate(&bad).unwrap_err();
    assert_eq!(e.field, "group[0].task[0].device[0].name", "{e:?}");
    let mut bad = parsed.spec;
    bad.groups[0].tasks[0].devices[0].constraints[0].attribute = "${attr.kernel.name}".into();
    let e = crate::validate::validate(&bad).unwrap_err();
    assert_eq!(
        e.field, "group[0].task[0].device[0].constraint[0].attribute",
        "{e:?}"
    );
}

/// Issue 27: a group's `volume` and a task's `volume_mount` blocks read as Nomad 1.0.18
/// prints them (`nomad job run -output`), and convert into the spec.
#[test]
fn volume_and_volume_mount_blocks_read_as_nomad_prints_them() {
    let text = r#"
job "v" {
  group "g" {
    volume "data" {
      type = "host"
      source = "shared"
      read_only = false
    }
    volume "ro" {
      type = "host"
      source = "shared"
      read_only = true
    }
    task "t" {
      driver = "exec"
      volume_mount {
        volume = "data"
        destination = "/data"
      }
      volume_mount {
        volume = "ro"
        destination = "/ro"
        read_only = true
      }
    }
  }
}
"#;
    let json = parse_text(text).unwrap_or_else(|e| panic!("{e}"));
    let g = &json["Job"]["TaskGroups"][0];
    // What Nomad 1.0.18 prints for this file.
    assert_eq!(
        g["Volumes"],
        json!({
            "data": {"Name": "data", "Type": "host", "Source": "shared", "ReadOnly": false, "MountOptions": null},
            "ro": {"Name": "ro", "Type": "host", "Source": "shared", "ReadOnly": true, "MountOptions": null}
        })
    );
    assert_eq!(
        g["Tasks"][0]["VolumeMounts"],
        json!([
            {"Volume": "data", "Destination": "/data", "ReadOnly": null, "PropagationMode": null},
            {"Volume": "ro", "Destination": "/ro", "ReadOnly": true, "PropagationMode": null}
        ])
    );
    let spec = to_job("job.hcl", json).unwrap().to_spec().unwrap().spec;
    crate::validate(&spec).unwrap_or_else(|e| panic!("{e:?}"));
    let g = &spec.groups[0];
    assert_eq!(g.volumes["ro"].source, "shared");
    assert!(g.volumes["ro"].read_only && !g.volumes["data"].read_only);
    assert_eq!(
        g.tasks[0].volume_mounts[1],
        crate::VolumeMount {
            volume: "ro".into(),
            destination: "/ro".into(),
            read_only: true
        }
    );
    assert!(
        err(&task_file(
            "      volume_mount {\n        volum = \"x\"\n      }"
        ))
        .contains("unsupported argument \"volum\"; did you mean \"volume\"?")
    );
}
