//! Nomad's plugin config specs (hclspec) and the msgpack its configs travel in, both ways.
//!
//! A Nomad plugin describes its plugin config and its task config as an hclspec tree
//! ([`Spec`]), read with the semantics of HCL2's `hcldec`. Nomad's host decodes a user's
//! config with it and sends the result to the plugin as msgpack (cty's encoding); the Go
//! plugin decodes that into its structs. Drover users write configs as JSON or TOML, so
//! here a config is a [`serde_json::Value`] in the shape of HCL's JSON syntax:
//!
//! | spec | JSON form |
//! | --- | --- |
//! | `Attr` | `"name": value` |
//! | `Block` | `"name": {…}` (a one-element array of it is also accepted) |
//! | `BlockList`, `BlockSet` | `"name": [{…}, …]` (a single `{…}` is also accepted) |
//! | `BlockAttrs` | `"name": {"key": value, …}` |
//! | `BlockMap` with labels `a`, `b` | `"name": {"a-label": {"b-label": {…}}}` |
//! | `Object`, `Array`, `Default`, `Literal` | no key of their own |
//!
//! Decisions where Drover's reading differs from, or narrows, Nomad's:
//! - Types are strict: a string is never converted to a number or a bool (cty would
//!   convert `"5"`). The safe conversions are applied: a number or bool where a string is
//!   expected becomes that string (`5` → `"5"`, `true` → `"true"`).
//! - `null` is an absent key (so a required attribute given `null` is missing, and a
//!   `Default` applies). Inside typed lists, sets, maps and tuples `null` is refused,
//!   since the Go plugin would read it as a silent zero value; `any` passes anything.
//! - A `Default` literal is converted to its attribute's type when the spec is read (a
//!   literal that cannot be is a spec error), so the plugin always gets one type.
//! - Values of `any` pass unchanged (cty would unify the element types of `list(any)`).
//! - A whole config of `null` is an empty body.
//! - Specs come from third-party plugins, so reading one is bounded: `Literal`s must be
//!   constants (null, bools, numbers, plain strings, arrays and objects of them; no `for`,
//!   conditionals, operators, function calls, variables or `${…}` templates, which Nomad
//!   would evaluate), at most 64 KiB each and 100 000 values in all; names, keys and
//!   labels at most 256 bytes; type expressions at most 4 KiB; at most 10 000 nodes.
//!
//! What is sent is what Nomad's host sends: every spec'd key is present, an absent
//! optional attribute or `Block` as nil, an absent `BlockList`/`BlockSet` as an empty
//! array, an absent `BlockMap` as an empty map; integral numbers as msgpack integers,
//! others as float64; map keys sorted.
//!
//! ```
//! use drover_plugin_sdk::nomad::hclspec::{decode_msgpack, encode_msgpack, from_json_schema};
//! use serde_json::json;
//!
//! // A spec as Nomad's raw_exec task config has it, derived here from a JSON Schema.
//! let spec = from_json_schema(&json!({
//!     "type": "object",
//!     "properties": {
//!         "command": {"type": "string"},
//!         "args": {"type": "array", "items": {"type": "string"}},
//!     },
//!     "required": ["command"],
//! }))?;
//! let bytes = encode_msgpack(&spec, &json!({"command": "/bin/echo"})).expect("valid config");
//! assert_eq!(decode_msgpack(&bytes)?, json!({"command": "/bin/echo", "args": null}));
//! # Ok::<(), drover_plugin_sdk::nomad::hclspec::SpecError>(())
//! ```

mod from_schema;
mod msgpack;
mod node;
mod types;

#[cfg(test)]
mod tests;

pub use drover_proto::nomad::hclspec::Spec;

use node::Node;

/// One problem with a config or a spec, at a path like `config.args[1]` or `port_map.http`.
///
/// Paths are relative to the config (or spec) given; `(root)` is the whole of it.
///
/// ```
/// use drover_plugin_sdk::nomad::hclspec::SpecError;
/// let e = SpecError { path: "args[1]".into(), message: "expected string, got an object".into() };
/// assert_eq!(e.to_string(), "args[1]: expected string, got an object");
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SpecError {
    /// Where: keys joined by `.`, list indexes in brackets; `(root)` for the whole value.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl SpecError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> SpecError {
        let path = path.into();
        let path = if path.is_empty() {
            "(root)".to_owned()
        } else {
            path
        };
        SpecError {
            path,
            message: message.into(),
        }
    }
}

/// `path.key` (or `key` at the root).
pub(crate) fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `path[index]`.
pub(crate) fn join_index(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

fn compile(spec: &Spec) -> Result<Node, SpecError> {
    Node::compile(spec, "", "", 0, &mut node::Budget::default())
}

/// JSON Schema (draft 2020-12) of what `spec` accepts in Drover's JSON form of the config:
/// objects with "properties", "required", "additionalProperties": false, types from HCL type
/// expressions, defaults as "default". Err for a malformed spec (bad type expression, bad literal).
///
/// Optional keys also admit `null` (an absent key). Otherwise the schema describes the
/// canonical form: `BlockList`s as arrays (a single object is accepted too) and strings
/// as strings (numbers and bools are accepted too).
///
/// ```
/// use drover_plugin_sdk::nomad::hclspec::{Spec, to_json_schema};
/// use drover_plugin_sdk::proto::nomad::hclspec::{spec::Block, Attr, Default, Literal, Object};
/// use serde_json::json;
///
/// let attr = |name: &str, ty: &str, required| Spec {
///     block: Some(Block::Attr(Attr { name: name.into(), r#type: ty.into(), required })),
/// };
/// let shell = Spec {
///     block: Some(Block::Default(Box::new(Default {
///         primary: Some(Box::new(attr("shell", "string", false))),
///         default: Some(Box::new(Spec { block: Some(Block::Literal(Literal { value: r#""bash""#.into() })) })),
///     }))),
/// };
/// let spec = Spec {
///     block: Some(Block::Object(Object {
///         attributes: [("shell".to_owned(), shell), ("args".to_owned(), attr("args", "list(string)", true))].into(),
///     })),
/// };
/// let schema = to_json_schema(&spec)?;
/// // Optional keys may be null: that is the same as absent.
/// assert_eq!(schema["properties"]["shell"], json!({"type": ["string", "null"], "default": "bash"}));
/// assert_eq!(schema["properties"]["args"], json!({"type": "array", "items": {"type": "string"}}));
/// assert_eq!(schema["required"], json!(["args"]));
/// assert_eq!(schema["additionalProperties"], json!(false));
///
/// let bad = attr("x", "list(strng)", false);
/// assert!(to_json_schema(&bad).unwrap_err().message.contains("unknown type"));
/// # Ok::<(), drover_plugin_sdk::nomad::hclspec::SpecError>(())
/// ```
pub fn to_json_schema(spec: &Spec) -> Result<serde_json::Value, SpecError> {
    let mut schema = compile(spec)?.body_schema();
    if let serde_json::Value::Object(map) = &mut schema {
        map.insert(
            "$schema".into(),
            "https://json-schema.org/draft/2020-12/schema".into(),
        );
    }
    Ok(schema)
}

/// Validate `value` against `spec` (unknown key, wrong type, missing required attribute, too few/many
/// blocks: every error, each naming its path), apply Default/Literal, and encode msgpack as Nomad's
/// host does (absent optional attributes as nil like cty; absent Block -> nil, absent BlockList/BlockSet
/// -> empty array, BlockMap -> empty map; integral numbers as ints).
///
/// A malformed spec gives one error (its path is in the spec).
///
/// ```
/// use drover_plugin_sdk::nomad::hclspec::{decode_msgpack, encode_msgpack, from_json_schema};
/// use serde_json::json;
///
/// let spec = from_json_schema(&json!({
///     "type": "object",
///     "properties": {"count": {"type": "integer", "default": 3}, "name": {"type": "string"}},
///     "required": ["name"],
/// }))
/// .unwrap();
/// let bytes = encode_msgpack(&spec, &json!({"name": "web"})).unwrap();
/// assert_eq!(decode_msgpack(&bytes).unwrap(), json!({"count": 3, "name": "web"}));
///
/// let errors = encode_msgpack(&spec, &json!({"count": "3", "nmae": "web"})).unwrap_err();
/// let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
/// assert_eq!(
///     shown,
///     [
///         "nmae: unknown key; expected one of: count, name",
///         "count: expected number, got a string",
///         "name: missing required attribute (of type string)",
///     ]
/// );
/// ```
pub fn encode_msgpack(spec: &Spec, value: &serde_json::Value) -> Result<Vec<u8>, Vec<SpecError>> {
    let normalized = normalize(spec, value)?;
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &msgpack::to_msgpack(&normalized))
        .map_err(|e| vec![SpecError::new("", format!("writing msgpack: {e}"))])?;
    Ok(out)
}

/// The JSON value `encode_msgpack` would encode (validated, defaults applied) — for showing/storing.
///
/// ```
/// use drover_plugin_sdk::nomad::hclspec::{from_json_schema, normalize};
/// use serde_json::json;
///
/// let spec = from_json_schema(&json!({
///     "type": "object",
///     "properties": {
///         "enabled": {"type": "boolean", "default": false},
///         "ports": {"type": "array", "items": {
///             "type": "object",
///             "properties": {"label": {"type": "string"}, "port": {"type": "integer"}},
///             "required": ["label"],
///         }},
///     },
/// }))
/// .unwrap();
/// assert_eq!(
///     normalize(&spec, &json!({"ports": {"label": "http", "port": 80.0}})).unwrap(),
///     json!({"enabled": false, "ports": [{"label": "http", "port": 80}]})
/// );
/// ```
pub fn normalize(
    spec: &Spec,
    value: &serde_json::Value,
) -> Result<serde_json::Value, Vec<SpecError>> {
    let node = compile(spec).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut out = node.decode_body(value, "", 0, &mut errors);
    if errors.is_empty() {
        msgpack::canonicalize(&mut out, "", 0).map_err(|e| vec![e])?;
        Ok(out)
    } else {
        Err(errors)
    }
}

/// msgpack (from a Nomad host) to JSON: maps with string keys, arrays, numbers, strings, bools, nil;
/// binary/ext refused with a clear error. Bounded depth.
///
/// Integral floats come back as integers (as cty would have written them).
///
/// ```
/// use drover_plugin_sdk::nomad::hclspec::decode_msgpack;
/// use serde_json::json;
///
/// // {"command": "echo", "args": ["hi"], "n": 1.5}
/// let bytes = b"\x83\xa7command\xa4echo\xa4args\x91\xa2hi\xa1n\xcb\x3f\xf8\0\0\0\0\0\0";
/// assert_eq!(decode_msgpack(bytes)?, json!({"command": "echo", "args": ["hi"], "n": 1.5}));
///
/// let err = decode_msgpack(b"\x81\xa1k\xc4\x01\x00").unwrap_err(); // {"k": bin(1)}
/// assert_eq!(err.path, "k");
/// assert!(err.message.contains("binary"));
/// # Ok::<(), drover_plugin_sdk::nomad::hclspec::SpecError>(())
/// ```
pub fn decode_msgpack(bytes: &[u8]) -> Result<serde_json::Value, SpecError> {
    msgpack::from_msgpack_bytes(bytes)
}

/// The hclspec of a JSON Schema as schemars 1.x derives it for a Rust config struct (the SDK's
/// `DriverPlugin::Config`/`TaskConfig`): properties -> Attr with the HCL type ("string", "number", "bool",
/// "list(string)", "map(string)", "list(map(string))", "any" where nothing fits), `required` -> required,
/// nested objects (incl. via $ref/$defs) -> Block, arrays of objects -> BlockList, "default" -> Default+Literal
/// (the literal written as JSON, which is valid HCL). `Option<T>` (schemars' type arrays with "null"/anyOf) is optional.
///
/// Also: a map whose values are objects with properties (`HashMap<String, Struct>`) becomes
/// a `BlockMap` with the one label `name`; an object with properties inside a type (a list
/// element, a map value) becomes `object({…})` when all its properties are required, else
/// `any`; enums of strings are `string`; `uniqueItems` arrays are `set(…)`.
///
/// ```
/// use drover_plugin_sdk::nomad::hclspec::{from_json_schema, to_json_schema};
/// use serde_json::json;
///
/// let spec = from_json_schema(&json!({
///     "type": "object",
///     "properties": {
///         "image": {"type": "string"},
///         "labels": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
///         "auth": {"$ref": "#/$defs/Auth"},
///     },
///     "required": ["image"],
///     "$defs": {"Auth": {"type": "object", "properties": {"user": {"type": "string"}}}},
/// }))?;
/// let schema = to_json_schema(&spec)?;
/// assert_eq!(schema["required"], json!(["image"]));
/// assert_eq!(schema["properties"]["labels"]["additionalProperties"], json!({"type": "string"}));
/// assert_eq!(schema["properties"]["auth"]["properties"]["user"], json!({"type": ["string", "null"]}));
/// # Ok::<(), drover_plugin_sdk::nomad::hclspec::SpecError>(())
/// ```
pub fn from_json_schema(schema: &serde_json::Value) -> Result<Spec, SpecError> {
    from_schema::spec_of_root(schema)
}
