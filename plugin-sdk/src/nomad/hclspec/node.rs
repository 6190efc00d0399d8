//! A [`Spec`] checked once into a tree with parsed types and evaluated literals, and what
//! is done with it: reading a JSON config body (hcldec's decoding, on HCL's JSON syntax)
//! and describing that body as a JSON Schema.

use std::collections::BTreeSet;

use drover_proto::nomad::hclspec::spec::Block as SpecKind;
use serde_json::{Map, Value, json};

use super::types::{HclType, MAX_DEPTH, kind};
use super::{Spec, SpecError, join_index, join_key};

/// Longest name, object key or label a spec may have, in bytes. Paths are built from
/// them for every child, so long ones would make compiling cost far more than the spec's
/// size suggests; real ones are a few words.
pub(crate) const MAX_NAME_LEN: usize = 256;
/// Most nodes a spec may have in all (Nomad's docker driver has a few hundred).
pub(crate) const MAX_NODES: usize = 10_000;
/// Most labels a `block_map` may have (Nomad's have one); each is a level of nesting.
pub(crate) const MAX_LABELS: usize = 8;
/// Longest Literal text, in bytes.
pub(crate) const MAX_LITERAL_LEN: usize = 64 * 1024;
/// Most values all of a spec's literals may hold together.
pub(crate) const MAX_LITERAL_VALUES: usize = 100_000;

/// What a spec being compiled may still use: compiling a hostile plugin's spec costs at
/// most time and memory in proportion to these.
#[derive(Debug)]
pub(crate) struct Budget {
    nodes_left: usize,
    values_left: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            nodes_left: MAX_NODES,
            values_left: MAX_LITERAL_VALUES,
        }
    }
}

/// Refuses a name, key or label longer than [`MAX_NAME_LEN`]; `path` is where it is.
fn check_name(path: &str, what: &str, name: &str) -> Result<(), SpecError> {
    if name.len() > MAX_NAME_LEN {
        return Err(SpecError::new(
            path,
            format!(
                "{what} {} is {} bytes long (at most {MAX_NAME_LEN})",
                preview(name),
                name.len()
            ),
        ));
    }
    Ok(())
}

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
    /// types and literals must parse. `path` locates the spec node in errors. `budget`
    /// bounds the whole spec's size (see [`Budget`]); names are bounded too.
    pub(crate) fn compile(
        spec: &Spec,
        implied: &str,
        path: &str,
        depth: usize,
        budget: &mut Budget,
    ) -> Result<Node, SpecError> {
        if depth > MAX_DEPTH {
            return Err(SpecError::new(path, "spec nested too deeply"));
        }
        budget.nodes_left = budget
            .nodes_left
            .checked_sub(1)
            .ok_or_else(|| SpecError::new(path, format!("spec has more than {MAX_NODES} nodes")))?;
        // Children are counted before any is compiled, so a huge object is refused before
        // its keys are sorted or paths are built for them.
        let reserve_children = |n: usize, budget: &Budget| {
            if n > budget.nodes_left {
                return Err(SpecError::new(
                    path,
                    format!("spec has more than {MAX_NODES} nodes ({n} children here)"),
                ));
            }
            Ok(())
        };
        let name_of = |given: &str, what: &str| -> Result<String, SpecError> {
            match (given, implied) {
                ("", "") => Err(SpecError::new(path, format!("{what} spec without a name"))),
                ("", implied) => Ok(implied.to_owned()),
                (given, _) => {
                    check_name(path, &format!("{what} name"), given)?;
                    Ok(given.to_owned())
                }
            }
        };
        let nested = |n: &Option<Box<Spec>>,
                      what: &str,
                      budget: &mut Budget|
         -> Result<Box<Node>, SpecError> {
            match n {
                Some(n) => Ok(Box::new(Node::compile(n, "", path, depth + 1, budget)?)),
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
                reserve_children(obj.attributes.len(), budget)?;
                for key in obj.attributes.keys() {
                    check_name(path, "key", key)?;
                }
                let mut keys: Vec<&String> = obj.attributes.keys().collect();
                keys.sort();
                let mut out = Vec::with_capacity(keys.len());
                for key in keys {
                    let child = &obj.attributes[key];
                    out.push((
                        key.clone(),
                        Node::compile(child, key, &join_key(path, key), depth + 1, budget)?,
                    ));
                }
                Node::Object(out)
            }
            SpecKind::Array(arr) => {
                reserve_children(arr.values.len(), budget)?;
                Node::Array(
                    arr.values
                        .iter()
                        .enumerate()
                        .map(|(i, s)| Node::compile(s, "", &join_index(path, i), depth + 1, budget))
                        .collect::<Result<_, _>>()?,
                )
            }
            SpecKind::Attr(a) => Node::Attr {
                name: name_of(&a.name, "attribute")?,
                ty: ty_of(&a.r#type)?,
                required: a.required,
            },
            SpecKind::BlockValue(b) => Node::Block {
                name: name_of(&b.name, "block")?,
                required: b.required,
                nested: nested(&b.nested, "block", budget)?,
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
                nested: nested(&b.nested, "block_list", budget)?,
                set: false,
            },
            SpecKind::BlockSet(b) => Node::BlockList {
                name: name_of(&b.name, "block_set")?,
                min: b.min_items,
                max: b.max_items,
                nested: nested(&b.nested, "block_set", budget)?,
                set: true,
            },
            SpecKind::BlockMap(b) => {
                if b.labels.is_empty() {
                    return Err(SpecError::new(
                        path,
                        "block_map spec without labels (it needs at least one)",
                    ));
                }
                if b.labels.len() > MAX_LABELS {
                    return Err(SpecError::new(
                        path,
                        format!(
                            "block_map spec with {} labels (at most {MAX_LABELS})",
                            b.labels.len()
                        ),
                    ));
                }
                for label in &b.labels {
                    check_name(path, "block_map label", label)?;
                }
                Node::BlockMap {
                    name: name_of(&b.name, "block_map")?,
                    labels: b.labels.clone(),
                    nested: nested(&b.nested, "block_map", budget)?,
                }
            }
            SpecKind::Default(d) => {
                let part = |s: &Option<Box<Spec>>, what: &str, budget: &mut Budget| match s {
                    Some(s) => Node::compile(s, "", path, depth + 1, budget),
                    None => Err(SpecError::new(
                        path,
                        format!("default spec without its {what}"),
                    )),
                };
                let primary = part(&d.primary, "primary", budget)?;
                let mut default = part(&d.default, "default", budget)?;
                // hcldec would hand the literal over as written; converting it to the
                // attribute's type here means the plugin gets one type either way, and a
                // literal that cannot be one is a spec error now, not a decode error later.
                // Likewise a block's default is read as that block would be.
                if let Node::Literal(v) = &mut default
                    && !v.is_null()
                {
                    let mut errors = Vec::new();
                    let converted = match &primary {
                        Node::Attr { ty, .. } => ty.convert(v, "", 0, &mut errors),
                        Node::BlockAttrs { ty, .. } => {
                            HclType::Map(Box::new(ty.clone())).convert(v, "", 0, &mut errors)
                        }
                        Node::Block { nested, .. } => {
                            Some(nested.decode_body(v, "", 0, &mut errors))
                        }
                        _ => Some(v.clone()),
                    };
                    match converted {
                        Some(converted) if errors.is_empty() => *v = converted,
                        _ => {
                            let why: Vec<String> = errors
                                .iter()
                                .map(|e| match e.path.as_str() {
                                    "(root)" => e.message.clone(),
                                    _ => e.to_string(),
                                })
                                .collect();
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
            SpecKind::Literal(l) => Node::Literal(
                eval_literal(&l.value, &mut budget.values_left)
                    .map_err(|e| SpecError::new(path, e))?,
            ),
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
                        // A set holds each block once; serialized for a linear check.
                        let mut seen = std::collections::HashSet::new();
                        for (i, item) in items.iter().enumerate() {
                            let v = nested.decode_body(item, &join_index(&p, i), depth + 1, errors);
                            if !*set || seen.insert(super::msgpack::set_key(&v)) {
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

/// Reads a Literal's HCL expression as a constant: null, bools, numbers, strings without
/// `${…}`/`%{…}` (escapes like `$${` are fine), and arrays and objects of those (object
/// keys identifiers or strings). Nomad's real specs use nothing else. Everything that would
/// be evaluated is refused rather than run: hcl-rs evaluates `for` expressions, and a few
/// KiB of nested ones build millions of values synchronously, so a hostile plugin's spec
/// could take the agent's memory. `values_left` is the number of values the literal may
/// still hold (shared across a spec); it is decremented by the values read.
pub(crate) fn eval_literal(text: &str, values_left: &mut usize) -> Result<Value, String> {
    if text.len() > MAX_LITERAL_LEN {
        return Err(format!(
            "literal of {} bytes is too long (at most {MAX_LITERAL_LEN})",
            text.len()
        ));
    }
    let expr: hcl::Expression = text
        .trim()
        .parse()
        .map_err(|e| format!("literal {} is not an HCL expression: {e}", preview(text)))?;
    constant(&expr, "", values_left).map_err(|e| {
        format!(
            "literal {} is not a constant value: {e}; only constant literals are supported",
            preview(text)
        )
    })
}

/// The value of a constant expression (see [`eval_literal`]); `at` is the place inside
/// the literal, for errors. The parser bounds nesting (hcl-edit refuses more than 64
/// levels), so the recursion is bounded too.
fn constant(expr: &hcl::Expression, at: &str, values_left: &mut usize) -> Result<Value, String> {
    use hcl::{Expression as E, ObjectKey};
    *values_left = values_left
        .checked_sub(1)
        .ok_or_else(|| format!("more than {MAX_LITERAL_VALUES} values in the spec's literals"))?;
    let refuse = |what: &str| match at {
        "" => Err(format!("it is {what}")),
        at => Err(format!("{at} is {what}")),
    };
    match expr {
        E::Null => Ok(Value::Null),
        E::Bool(b) => Ok(Value::Bool(*b)),
        E::Number(n) => serde_json::to_value(n).map_err(|e| format!("number {n}: {e}")),
        // Plain strings only: the parser gives a string with interpolations or directives
        // (or a heredoc) as a TemplateExpr.
        E::String(s) => Ok(Value::String(s.clone())),
        E::Parenthesis(inner) => constant(inner, at, values_left),
        E::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| constant(item, &join_index(at, i), values_left))
            .collect::<Result<_, _>>()
            .map(Value::Array),
        E::Object(entries) => {
            let mut out = Map::new();
            for (key, item) in entries {
                let key = match key {
                    ObjectKey::Identifier(id) => id.as_str().to_owned(),
                    ObjectKey::Expression(E::String(s)) => s.clone(),
                    _ => {
                        return refuse("an object with a key that is not a name or a plain string");
                    }
                };
                let v = constant(item, &join_key(at, &key), values_left)?;
                out.insert(key, v);
            }
            Ok(Value::Object(out))
        }
        E::TemplateExpr(_) => refuse("a template (a string with ${…} or %{…}, or a heredoc)"),
        E::Variable(v) => refuse(&format!("the variable {}", preview(v.as_str()))),
        E::Traversal(_) => refuse("a traversal"),
        E::FuncCall(_) => refuse("a function call"),
        E::Conditional(_) => refuse("a conditional"),
        E::Operation(_) => refuse("an operation"),
        E::ForExpr(_) => refuse("a for expression"),
        _ => refuse("an unsupported expression"),
    }
}

/// `text` quoted for an error message, cut short: the text may be a hostile plugin's.
pub(crate) fn preview(text: &str) -> String {
    const SHOWN: usize = 64;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str) -> Result<Value, String> {
        let mut values_left = MAX_LITERAL_VALUES;
        eval_literal(text, &mut values_left)
    }

    #[test]
    fn literals_are_hcl_constants() {
        for (text, want) in [
            ("false", json!(false)),
            ("true", json!(true)),
            ("null", json!(null)),
            ("42", json!(42)),
            ("-7", json!(-7)),
            ("- 7", json!(-7)),
            ("1.5", json!(1.5)),
            ("(3)", json!(3)),
            (r#""bash""#, json!("bash")),
            (r#""none""#, json!("none")),
            (r#""a\"b\\c\n\t\u00e9""#, json!("a\"b\\c\n\t\u{e9}")),
            (r#""$${x} %%{y}""#, json!("${x} %{y}")),
            ("[]", json!([])),
            ("{}", json!({})),
            (r#"["a", 1, true]"#, json!(["a", 1, true])),
            (r#"{a = 1, "b" = [2]}"#, json!({"a": 1, "b": [2]})),
            (r#"{"a": {"b": null}}"#, json!({"a": {"b": null}})),
            ("  \"spaced\"  ", json!("spaced")),
        ] {
            assert_eq!(eval(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn bad_literals_are_refused() {
        for text in ["", "\"open", "[1,", "{a = }"] {
            assert!(eval(text).is_err(), "{text:?} was accepted");
        }
    }

    #[test]
    fn only_constants_are_read_nothing_is_evaluated() {
        for (text, what) in [
            ("var.x", "a traversal"),
            ("foo", "the variable \"foo\""),
            ("flase", "the variable"),
            ("upper(\"x\")", "a function call"),
            ("true ? 1 : 2", "a conditional"),
            ("1 + 2", "an operation"),
            ("!true", "an operation"),
            ("-(1)", "an operation"),
            ("[for x in [1, 2]: x]", "a for expression"),
            ("{for k, v in {a = 1}: k => v}", "a for expression"),
            ("\"${1}\"", "a template"),
            ("\"%{ if true }x%{ endif }\"", "a template"),
            ("\"a${\"b\"}c\"", "a template"),
            ("<<EOT\nhello\nEOT\n", "a template"),
            ("[1, [2, 1 + 1]]", "[1][1] is an operation"),
            ("{a = {b = x}}", "a.b is the variable"),
            ("{(x) = 1}", "a key that is not a name or a plain string"),
            ("{1 = 1}", "a key that is not a name or a plain string"),
        ] {
            let err = eval(text).unwrap_err();
            assert!(err.contains(what), "{text:?}: {err}");
            assert!(
                err.contains("only constant literals are supported"),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    fn literal_size_and_values_are_bounded() {
        // Just over the text limit: refused before parsing, and the text is not echoed.
        let long = format!("\"{}\"", "a".repeat(MAX_LITERAL_LEN));
        let err = eval(&long).unwrap_err();
        assert!(err.contains("too long"), "{err}");
        assert!(err.len() < 200, "{err}");
        // The value budget is shared: 3 values fit in 3, not in 2.
        assert_eq!(eval_literal("[1, 2]", &mut 3).unwrap(), json!([1, 2]));
        let err = eval_literal("[1, 2]", &mut 2).unwrap_err();
        assert!(err.contains("more than"), "{err}");
        let mut left = 10;
        eval_literal("[1, 2]", &mut left).unwrap();
        assert_eq!(left, 7);
    }
}
