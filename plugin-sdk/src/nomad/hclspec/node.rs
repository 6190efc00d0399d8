//! A [`Spec`] checked once into a tree with parsed types and evaluated literals, and what
//! is done with it: reading a JSON config body (hcldec's decoding, on HCL's JSON syntax)
//! and describing that body as a JSON Schema.

use std::collections::BTreeSet;

use drover_proto::nomad::hclspec::spec::Block as SpecKind;
use serde_json::{Map, Value, json};

use super::types::{HclType, MAX_DEPTH, kind};
use super::{Spec, SpecError, join_index, join_key};

/// A checked spec node; the variants are the hclspec ones.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// Output object: output key -> node (sorted by key).
    Object(Vec<(String, Node)>),
    /// Output tuple of the nodes' values.
    Array(Vec<Node>),
    Attr {
        name: String,
        ty: HclType,
        required: bool,
    },
    Block {
        name: String,
        required: bool,
        nested: Box<Node>,
    },
    BlockAttrs {
        name: String,
        ty: HclType,
        required: bool,
    },
    /// BlockList, or BlockSet when `set`.
    BlockList {
        name: String,
        min: u64,
        max: u64,
        nested: Box<Node>,
        set: bool,
    },
    BlockMap {
        name: String,
        labels: Vec<String>,
        nested: Box<Node>,
    },
    Default {
        primary: Box<Node>,
        default: Box<Node>,
    },
    Literal(Value),
}

impl Node {
    /// Checks `spec` as Nomad's `hclspecutils.Convert` does: names default to the key of the
    /// enclosing Object (`implied`), a BlockMap needs labels, nested specs must be there,
    /// types and literals must parse. `path` locates the spec node in errors.
    pub(crate) fn compile(
        spec: &Spec,
        implied: &str,
        path: &str,
        depth: usize,
    ) -> Result<Node, SpecError> {
        if depth > MAX_DEPTH {
            return Err(SpecError::new(path, "spec nested too deeply"));
        }
        let name_of = |given: &str, what: &str| -> Result<String, SpecError> {
            match (given, implied) {
                ("", "") => Err(SpecError::new(path, format!("{what} spec without a name"))),
                ("", implied) => Ok(implied.to_owned()),
                (given, _) => Ok(given.to_owned()),
            }
        };
        let nested = |n: &Option<Box<Spec>>, what: &str| -> Result<Box<Node>, SpecError> {
            match n {
                Some(n) => Ok(Box::new(Node::compile(n, "", path, depth + 1)?)),
                None => Err(SpecError::new(
                    path,
                    format!("{what} spec without a nested spec"),
                )),
            }
        };
        let ty_of = |text: &str| HclType::parse(text).map_err(|e| SpecError::new(path, e));
        let Some(kind) = &spec.block else {
            return Err(SpecError::new(
                path,
                "empty spec (none of its kinds is set)",
            ));
        };
        Ok(match kind {
            SpecKind::Object(obj) => {
                let mut keys: Vec<&String> = obj.attributes.keys().collect();
                keys.sort();
                let mut out = Vec::with_capacity(keys.len());
                for key in keys {
                    let child = &obj.attributes[key];
                    out.push((
                        key.clone(),
                        Node::compile(child, key, &join_key(path, key), depth + 1)?,
                    ));
                }
                Node::Object(out)
            }
            SpecKind::Array(arr) => Node::Array(
                arr.values
                    .iter()
                    .enumerate()
                    .map(|(i, s)| Node::compile(s, "", &join_index(path, i), depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            SpecKind::Attr(a) => Node::Attr {
                name: name_of(&a.name, "attribute")?,
                ty: ty_of(&a.r#type)?,
                required: a.required,
            },
            SpecKind::BlockValue(b) => Node::Block {
                name: name_of(&b.name, "block")?,
                required: b.required,
                nested: nested(&b.nested, "block")?,
            },
            SpecKind::BlockAttrs(b) => Node::BlockAttrs {
                name: name_of(&b.name, "block_attrs")?,
                ty: ty_of(&b.r#type)?,
                required: b.required,
            },
            SpecKind::BlockList(b) => Node::BlockList {
                name: name_of(&b.name, "block_list")?,
                min: b.min_items,
                max: b.max_items,
                nested: nested(&b.nested, "block_list")?,
                set: false,
            },
            SpecKind::BlockSet(b) => Node::BlockList {
                name: name_of(&b.name, "block_set")?,
                min: b.min_items,
                max: b.max_items,
                nested: nested(&b.nested, "block_set")?,
                set: true,
            },
            SpecKind::BlockMap(b) => {
                if b.labels.is_empty() {
                    return Err(SpecError::new(
                        path,
                        "block_map spec without labels (it needs at least one)",
                    ));
                }
                Node::BlockMap {
                    name: name_of(&b.name, "block_map")?,
                    labels: b.labels.clone(),
                    nested: nested(&b.nested, "block_map")?,
                }
            }
            SpecKind::Default(d) => {
                let part = |s: &Option<Box<Spec>>, what: &str| match s {
                    Some(s) => Node::compile(s, "", path, depth + 1),
                    None => Err(SpecError::new(
                        path,
                        format!("default spec without its {what}"),
                    )),
                };
                let primary = part(&d.primary, "primary")?;
                let mut default = part(&d.default, "default")?;
                // hcldec would hand the literal over as written; converting it to the
                // attribute's type here means the plugin gets one type either way, and a
                // literal that cannot be one is a spec error now, not a decode error later.
                if let (Node::Attr { ty, .. }, Node::Literal(v)) = (&primary, &mut default)
                    && !v.is_null()
                {
                    let mut errors = Vec::new();
                    match ty.convert(v, path, 0, &mut errors) {
                        Some(converted) => *v = converted,
                        None => {
                            let why: Vec<String> = errors.into_iter().map(|e| e.message).collect();
                            return Err(SpecError::new(
                                path,
                                format!("default value: {}", why.join("; ")),
                            ));
                        }
                    }
                }
                Node::Default {
                    primary: Box::new(primary),
                    default: Box::new(default),
                }
            }
            SpecKind::Literal(l) => {
                Node::Literal(eval_literal(&l.value).map_err(|e| SpecError::new(path, e))?)
            }
        })
    }

    /// The body keys this node reads (not those of nested blocks' bodies).
    fn names<'a>(&'a self, out: &mut BTreeSet<&'a str>) {
        match self {
            Node::Object(children) => children.iter().for_each(|(_, n)| n.names(out)),
            Node::Array(children) => children.iter().for_each(|n| n.names(out)),
            Node::Default { primary, default } => {
                primary.names(out);
                default.names(out);
            }
            Node::Literal(_) => {}
            Node::Attr { name, .. }
            | Node::Block { name, .. }
            | Node::BlockAttrs { name, .. }
            | Node::BlockList { name, .. }
            | Node::BlockMap { name, .. } => {
                out.insert(name);
            }
        }
    }

    /// Reads a config body (a JSON object; `null` is an empty body): refuses keys no spec
    /// reads, then decodes. Every problem goes to `errors`; the value is only meaningful
    /// when none was added.
    pub(crate) fn decode_body(
        &self,
        body: &Value,
        path: &str,
        depth: usize,
        errors: &mut Vec<SpecError>,
    ) -> Value {
        static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
        let map = match body {
            Value::Object(m) => m,
            Value::Null => &EMPTY,
            other => {
                errors.push(SpecError::new(
                    path,
                    format!("expected an object (a block body), got {}", kind(other)),
                ));
                return Value::Null;
            }
        };
        if depth > MAX_DEPTH {
            errors.push(SpecError::new(path, "blocks nested too deeply"));
            return Value::Null;
        }
        let mut known = BTreeSet::new();
        self.names(&mut known);
        for key in map.keys().filter(|k| !known.contains(k.as_str())) {
            let expected = if known.is_empty() {
                "this block takes no keys".to_owned()
            } else {
                format!(
                    "expected one of: {}",
                    known.iter().copied().collect::<Vec<_>>().join(", ")
                )
            };
            errors.push(SpecError::new(
                join_key(path, key),
                format!("unknown key; {expected}"),
            ));
        }
        self.decode(map, path, depth, errors)
    }

    fn decode(
        &self,
        body: &Map<String, Value>,
        path: &str,
        depth: usize,
        errors: &mut Vec<SpecError>,
    ) -> Value {
        // An explicit null is an absent key, as in HCL's JSON syntax.
        let get = |name: &str| body.get(name).filter(|v| !v.is_null());
        match self {
            Node::Object(children) => Value::Object(
                children
                    .iter()
                    .map(|(key, n)| (key.clone(), n.decode(body, path, depth, errors)))
                    .collect(),
            ),
            Node::Array(children) => Value::Array(
                children
                    .iter()
                    .map(|n| n.decode(body, path, depth, errors))
                    .collect(),
            ),
            Node::Literal(v) => v.clone(),
            Node::Default { primary, default } => match primary.decode(body, path, depth, errors) {
                Value::Null => default.decode(body, path, depth, errors),
                v => v,
            },
            Node::Attr { name, ty, required } => {
                let p = join_key(path, name);
                match get(name) {
                    None if *required => {
                        errors.push(SpecError::new(
                            p,
                            format!("missing required attribute (of type {})", ty.expr()),
                        ));
                        Value::Null
                    }
                    None => Value::Null,
                    Some(v) => ty.convert(v, &p, depth + 1, errors).unwrap_or(Value::Null),
                }
            }
            Node::BlockAttrs { name, ty, required } => {
                let p = join_key(path, name);
                match get(name) {
                    None if *required => {
                        errors.push(SpecError::new(p, "missing required block"));
                        Value::Null
                    }
                    None => Value::Null,
                    Some(v) => HclType::Map(Box::new(ty.clone()))
                        .convert(v, &p, depth + 1, errors)
                        .unwrap_or(Value::Null),
                }
            }
            Node::Block {
                name,
                required,
                nested,
            } => {
                let p = join_key(path, name);
                match get(name) {
                    None if *required => {
                        errors.push(SpecError::new(p, "missing required block"));
                        Value::Null
                    }
                    None => Value::Null,
                    Some(Value::Array(items)) if items.len() > 1 => {
                        errors.push(SpecError::new(
                            p,
                            format!("only one block is allowed here, got {}", items.len()),
                        ));
                        Value::Null
                    }
                    Some(Value::Array(items)) => match items.first() {
                        Some(item) => {
                            nested.decode_body(item, &join_index(&p, 0), depth + 1, errors)
                        }
                        None if *required => {
                            errors.push(SpecError::new(p, "missing required block"));
                            Value::Null
                        }
                        None => Value::Null,
                    },
                    Some(v) => nested.decode_body(v, &p, depth + 1, errors),
                }
            }
            Node::BlockList {
                name,
                min,
                max,
                nested,
                set,
            } => {
                let p = join_key(path, name);
                let mut out = Vec::new();
                match get(name) {
                    None => {}
                    Some(Value::Array(items)) => {
                        for (i, item) in items.iter().enumerate() {
                            let v = nested.decode_body(item, &join_index(&p, i), depth + 1, errors);
                            if !(*set && out.contains(&v)) {
                                out.push(v);
                            }
                        }
                    }
                    // HCL's JSON syntax: a single block may be given as its object.
                    Some(v) => out.push(nested.decode_body(v, &p, depth + 1, errors)),
                }
                let n = out.len() as u64;
                if n < *min {
                    errors.push(SpecError::new(
                        &p,
                        format!("at least {min} block(s) required, got {n}"),
                    ));
                }
                if *max > 0 && n > *max {
                    errors.push(SpecError::new(
                        &p,
                        format!("at most {max} block(s) allowed, got {n}"),
                    ));
                }
                Value::Array(out)
            }
            Node::BlockMap {
                name,
                labels,
                nested,
            } => {
                let p = join_key(path, name);
                match get(name) {
                    None => Value::Object(Map::new()),
                    Some(v) => decode_labels(nested, labels, v, &p, depth + 1, errors),
                }
            }
        }
    }

    /// The JSON Schema of a body this node reads.
    pub(crate) fn body_schema(&self) -> Value {
        let mut props = Map::new();
        let mut required = Vec::new();
        self.collect_props(&mut props, &mut required, None);
        json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
    }

    fn collect_props(
        &self,
        props: &mut Map<String, Value>,
        required: &mut Vec<String>,
        default: Option<&Value>,
    ) {
        match self {
            Node::Object(children) => children
                .iter()
                .for_each(|(_, n)| n.collect_props(props, required, None)),
            Node::Array(children) => children
                .iter()
                .for_each(|n| n.collect_props(props, required, None)),
            Node::Default { primary, default } => {
                let lit = match &**default {
                    Node::Literal(v) => Some(v),
                    _ => None,
                };
                primary.collect_props(props, required, lit);
                default.collect_props(props, required, None);
            }
            Node::Literal(_) => {}
            Node::Attr {
                name,
                ty,
                required: r,
            } => add_prop(props, required, default, name, ty.json_schema(), *r),
            Node::BlockAttrs {
                name,
                ty,
                required: r,
            } => add_prop(
                props,
                required,
                default,
                name,
                HclType::Map(Box::new(ty.clone())).json_schema(),
                *r,
            ),
            Node::Block {
                name,
                required: r,
                nested,
            } => add_prop(props, required, default, name, nested.body_schema(), *r),
            Node::BlockList {
                name,
                min,
                max,
                nested,
                set: _,
            } => {
                let mut s = json!({"type": "array", "items": nested.body_schema()});
                if *min > 0 {
                    s["minItems"] = json!(min);
                }
                if *max > 0 {
                    s["maxItems"] = json!(max);
                }
                add_prop(props, required, default, name, s, *min > 0)
            }
            Node::BlockMap {
                name,
                labels,
                nested,
            } => {
                let mut s = nested.body_schema();
                for _ in labels {
                    s = json!({"type": "object", "additionalProperties": s});
                }
                add_prop(props, required, default, name, s, false)
            }
        }
    }
}

/// Adds one property to a body's schema.
fn add_prop(
    props: &mut Map<String, Value>,
    required: &mut Vec<String>,
    default: Option<&Value>,
    name: &str,
    mut schema: Value,
    is_required: bool,
) {
    if let (Some(d), Value::Object(s)) = (default.filter(|d| !d.is_null()), &mut schema) {
        s.insert("default".into(), d.clone());
    }
    // null is an absent key: an optional one may be given as null (and `normalize`
    // writes absent optional attributes and blocks so).
    if !is_required && let Some(Value::String(t)) = schema.get("type") {
        schema["type"] = json!([t, "null"]);
    }
    if is_required && !required.iter().any(|r| r == name) {
        required.push(name.to_owned());
    }
    props.insert(name.to_owned(), schema);
}

/// A BlockMap's value: one object level per label, block bodies at the bottom.
fn decode_labels(
    nested: &Node,
    labels: &[String],
    value: &Value,
    path: &str,
    depth: usize,
    errors: &mut Vec<SpecError>,
) -> Value {
    let Some((label, rest)) = labels.split_first() else {
        return nested.decode_body(value, path, depth, errors);
    };
    let Value::Object(entries) = value else {
        errors.push(SpecError::new(
            path,
            format!("expected an object keyed by {label}, got {}", kind(value)),
        ));
        return Value::Null;
    };
    Value::Object(
        entries
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    decode_labels(nested, rest, v, &join_key(path, k), depth + 1, errors),
                )
            })
            .collect(),
    )
}

/// Evaluates a Literal's HCL expression without variables or functions, as Nomad does.
pub(crate) fn eval_literal(text: &str) -> Result<Value, String> {
    use hcl::eval::Evaluate;
    let expr: hcl::Expression = text
        .trim()
        .parse()
        .map_err(|e| format!("literal {text:?} is not an HCL expression: {e}"))?;
    let value = expr
        .evaluate(&hcl::eval::Context::new())
        .map_err(|e| format!("literal {text:?} is not a constant value: {e}"))?;
    serde_json::to_value(&value).map_err(|e| format!("literal {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_hcl_expressions() {
        for (text, want) in [
            ("false", json!(false)),
            ("true", json!(true)),
            ("null", json!(null)),
            ("42", json!(42)),
            ("-7", json!(-7)),
            ("1.5", json!(1.5)),
            (r#""bash""#, json!("bash")),
            (r#""none""#, json!("none")),
            (r#""a\"b\\c\n\t\u00e9""#, json!("a\"b\\c\n\t\u{e9}")),
            (r#"["a", 1, true]"#, json!(["a", 1, true])),
            (r#"{a = 1, "b" = [2]}"#, json!({"a": 1, "b": [2]})),
            (r#"{"a": {"b": null}}"#, json!({"a": {"b": null}})),
            ("  \"spaced\"  ", json!("spaced")),
        ] {
            assert_eq!(eval_literal(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn bad_literals_are_refused() {
        for text in [
            "",
            "\"open",
            "var.x",
            "foo",
            "[1,",
            "{a = }",
            "upper(\"x\")",
        ] {
            assert!(eval_literal(text).is_err(), "{text:?} was accepted");
        }
    }
}
