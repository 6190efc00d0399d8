//! HCL type expressions (`string`, `list(map(string))`, `object({a = string})`, …) and
//! checking a JSON value against one, with cty's safe conversions to string.

use std::collections::BTreeMap;

use hcl::expr::{Expression, ObjectKey};
use serde_json::{Map, Value, json};

use super::{SpecError, join_index, join_key};

/// Deepest nesting of a type expression or of a value checked against one: far beyond any
/// real plugin's config, and it keeps recursion on hostile input bounded.
pub(crate) const MAX_DEPTH: usize = 64;

/// Longest type expression, in bytes (real ones are a few dozen): a hostile plugin's spec
/// must not make the agent parse megabytes per attribute.
pub(crate) const MAX_TYPE_LEN: usize = 4096;

/// A cty type, as the type expressions of Nomad's hclspec name them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HclType {
    String,
    Number,
    Bool,
    /// `any`: cty's dynamic pseudo-type; any JSON value passes unchanged.
    Any,
    List(Box<HclType>),
    Set(Box<HclType>),
    Map(Box<HclType>),
    Object(BTreeMap<String, HclType>),
    Tuple(Vec<HclType>),
}

impl HclType {
    /// Parses a type expression as Nomad's `hclspecutils` evaluates it: the variables
    /// `string`, `number`, `bool`, `any` and the functions `list`, `set`, `map`, `object`,
    /// `tuple`.
    pub(crate) fn parse(text: &str) -> Result<HclType, String> {
        if text.len() > MAX_TYPE_LEN {
            return Err(format!(
                "type expression of {} bytes is too long (at most {MAX_TYPE_LEN})",
                text.len()
            ));
        }
        let expr: Expression = text
            .trim()
            .parse()
            .map_err(|e| format!("type {text:?} is not an HCL expression: {e}"))?;
        Self::from_expr(&expr, 0).map_err(|e| format!("type {text:?}: {e}"))
    }

    fn from_expr(expr: &Expression, depth: usize) -> Result<HclType, String> {
        if depth > MAX_DEPTH {
            return Err("nested too deeply".into());
        }
        match expr {
            Expression::Variable(v) => match v.as_str() {
                "string" => Ok(HclType::String),
                "number" => Ok(HclType::Number),
                "bool" => Ok(HclType::Bool),
                "any" => Ok(HclType::Any),
                other => Err(format!("unknown type {other:?}")),
            },
            Expression::Parenthesis(inner) => Self::from_expr(inner, depth + 1),
            Expression::FuncCall(call) => {
                let name = call.name.name.as_str();
                if !call.name.namespace.is_empty() || call.expand_final {
                    return Err(format!("unsupported type constructor {}", call.name.name));
                }
                let [arg] = call.args.as_slice() else {
                    return Err(format!("{name}(…) takes exactly one argument"));
                };
                match name {
                    "list" => Ok(HclType::List(Box::new(Self::from_expr(arg, depth + 1)?))),
                    "set" => Ok(HclType::Set(Box::new(Self::from_expr(arg, depth + 1)?))),
                    "map" => Ok(HclType::Map(Box::new(Self::from_expr(arg, depth + 1)?))),
                    "tuple" => {
                        let Expression::Array(items) = arg else {
                            return Err(
                                "tuple(…) takes a list of types: tuple([string, number])".into()
                            );
                        };
                        items
                            .iter()
                            .map(|e| Self::from_expr(e, depth + 1))
                            .collect::<Result<_, _>>()
                            .map(HclType::Tuple)
                    }
                    "object" => {
                        let Expression::Object(attrs) = arg else {
                            return Err(
                                "object(…) takes an object of types: object({a = string})".into()
                            );
                        };
                        let mut out = BTreeMap::new();
                        for (key, ty) in attrs.iter() {
                            let key = match key {
                                ObjectKey::Identifier(id) => id.as_str().to_owned(),
                                ObjectKey::Expression(Expression::String(s)) => s.clone(),
                                ObjectKey::Expression(Expression::Variable(v)) => {
                                    v.as_str().to_owned()
                                }
                                ObjectKey::Expression(other) => {
                                    return Err(format!(
                                        "object attribute name {other} is not a name"
                                    ));
                                }
                                _ => return Err("unsupported object attribute name".into()),
                            };
                            out.insert(key, Self::from_expr(ty, depth + 1)?);
                        }
                        Ok(HclType::Object(out))
                    }
                    other => Err(format!("unknown type constructor {other:?}")),
                }
            }
            other => Err(format!("{other} is not a type")),
        }
    }

    /// The type expression, as Nomad's specs write it (`list(map(string))`).
    pub(crate) fn expr(&self) -> String {
        match self {
            HclType::String => "string".into(),
            HclType::Number => "number".into(),
            HclType::Bool => "bool".into(),
            HclType::Any => "any".into(),
            HclType::List(t) => format!("list({})", t.expr()),
            HclType::Set(t) => format!("set({})", t.expr()),
            HclType::Map(t) => format!("map({})", t.expr()),
            HclType::Object(attrs) => {
                let inner: Vec<String> = attrs
                    .iter()
                    .map(|(k, t)| format!("{k} = {}", t.expr()))
                    .collect();
                format!("object({{{}}})", inner.join(", "))
            }
            HclType::Tuple(items) => {
                let inner: Vec<String> = items.iter().map(HclType::expr).collect();
                format!("tuple([{}])", inner.join(", "))
            }
        }
    }

    /// The JSON Schema of the values this type accepts in their canonical form.
    pub(crate) fn json_schema(&self) -> Value {
        match self {
            HclType::String => json!({"type": "string"}),
            HclType::Number => json!({"type": "number"}),
            HclType::Bool => json!({"type": "boolean"}),
            HclType::Any => json!({}),
            HclType::List(t) => json!({"type": "array", "items": t.json_schema()}),
            HclType::Set(t) => {
                json!({"type": "array", "items": t.json_schema(), "uniqueItems": true})
            }
            HclType::Map(t) => json!({"type": "object", "additionalProperties": t.json_schema()}),
            HclType::Object(attrs) => {
                let props: Map<String, Value> = attrs
                    .iter()
                    .map(|(k, t)| (k.clone(), t.json_schema()))
                    .collect();
                let required: Vec<&String> = attrs.keys().collect();
                json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
            }
            HclType::Tuple(items) => {
                let prefix: Vec<Value> = items.iter().map(HclType::json_schema).collect();
                json!({"type": "array", "prefixItems": prefix, "items": false,
                       "minItems": items.len(), "maxItems": items.len()})
            }
        }
    }

    /// Checks `value` against this type and returns it converted, pushing one error per
    /// problem (with its path) into `errors`. Conversions are cty's safe ones only:
    /// a number or a bool where a string is expected becomes that string; a string is
    /// never turned into a number or a bool. `null` passes only for `any` and as an
    /// attribute of an object type (cty's null attribute); inside lists, sets, maps and
    /// tuples it is refused, since the Go plugin would silently read it as a zero value.
    pub(crate) fn convert(
        &self,
        value: &Value,
        path: &str,
        depth: usize,
        errors: &mut Vec<SpecError>,
    ) -> Option<Value> {
        if depth > MAX_DEPTH {
            errors.push(SpecError::new(path, "value nested too deeply"));
            return None;
        }
        let wrong = |errors: &mut Vec<SpecError>| {
            errors.push(SpecError::new(
                path,
                format!("expected {}, got {}", self.expr(), kind(value)),
            ));
            None
        };
        match self {
            HclType::Any => Some(value.clone()),
            HclType::String => match value {
                Value::String(_) => Some(value.clone()),
                Value::Number(n) => Some(Value::String(number_to_string(n))),
                Value::Bool(b) => Some(Value::String(b.to_string())),
                _ => wrong(errors),
            },
            HclType::Number => match value {
                Value::Number(_) => Some(value.clone()),
                _ => wrong(errors),
            },
            HclType::Bool => match value {
                Value::Bool(_) => Some(value.clone()),
                _ => wrong(errors),
            },
            HclType::List(elem) | HclType::Set(elem) => {
                let Value::Array(items) = value else {
                    return wrong(errors);
                };
                let before = errors.len();
                let mut out = Vec::with_capacity(items.len());
                // Serialized elements already in a set: linear, where `out.contains` is not.
                let mut seen = std::collections::HashSet::new();
                for (i, item) in items.iter().enumerate() {
                    let p = join_index(path, i);
                    if let Some(v) = elem.convert_element(item, &p, depth, errors) {
                        // A set holds each value once, as cty's sets do.
                        if !matches!(self, HclType::Set(_))
                            || seen.insert(super::msgpack::set_key(&v))
                        {
                            out.push(v);
                        }
                    }
                }
                (errors.len() == before).then_some(Value::Array(out))
            }
            HclType::Map(elem) => {
                let Value::Object(entries) = value else {
                    return wrong(errors);
                };
                let before = errors.len();
                let mut out = Map::new();
                for (k, item) in entries {
                    let p = join_key(path, k);
                    if let Some(v) = elem.convert_element(item, &p, depth, errors) {
                        out.insert(k.clone(), v);
                    }
                }
                (errors.len() == before).then_some(Value::Object(out))
            }
            HclType::Object(attrs) => {
                let Value::Object(entries) = value else {
                    return wrong(errors);
                };
                let before = errors.len();
                let mut out = Map::new();
                for k in entries.keys().filter(|k| !attrs.contains_key(*k)) {
                    errors.push(SpecError::new(join_key(path, k), "unknown attribute"));
                }
                for (k, ty) in attrs {
                    let p = join_key(path, k);
                    match entries.get(k) {
                        None => errors.push(SpecError::new(
                            p,
                            format!("missing attribute of type {}", ty.expr()),
                        )),
                        Some(Value::Null) => {
                            out.insert(k.clone(), Value::Null);
                        }
                        Some(item) => {
                            if let Some(v) = ty.convert(item, &p, depth + 1, errors) {
                                out.insert(k.clone(), v);
                            }
                        }
                    }
                }
                (errors.len() == before).then_some(Value::Object(out))
            }
            HclType::Tuple(types) => {
                let Value::Array(items) = value else {
                    return wrong(errors);
                };
                if items.len() != types.len() {
                    errors.push(SpecError::new(
                        path,
                        format!(
                            "expected {} ({} elements), got {} elements",
                            self.expr(),
                            types.len(),
                            items.len()
                        ),
                    ));
                    return None;
                }
                let before = errors.len();
                let mut out = Vec::with_capacity(items.len());
                for (i, (item, ty)) in items.iter().zip(types).enumerate() {
                    if let Some(v) = ty.convert_element(item, &join_index(path, i), depth, errors) {
                        out.push(v);
                    }
                }
                (errors.len() == before).then_some(Value::Array(out))
            }
        }
    }

    /// An element of a collection: `null` only where the element type is `any`.
    fn convert_element(
        &self,
        item: &Value,
        path: &str,
        depth: usize,
        errors: &mut Vec<SpecError>,
    ) -> Option<Value> {
        if item.is_null() && *self != HclType::Any {
            errors.push(SpecError::new(
                path,
                format!("expected {}, got null", self.expr()),
            ));
            return None;
        }
        self.convert(item, path, depth + 1, errors)
    }
}

/// A number as cty converts it to a string: integers without a fraction, others in their
/// shortest decimal form.
fn number_to_string(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => {
            format!("{f:.0}")
        }
        _ => n.to_string(),
    }
}

/// What kind of JSON value this is, for error messages.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nomad_type_expressions_parse_and_print_back() {
        for text in [
            "string",
            "number",
            "bool",
            "any",
            "list(string)",
            "list(map(string))",
            "set(number)",
            "map(list(string))",
            "object({a = string, b = list(number)})",
            "tuple([string, number])",
        ] {
            let ty = HclType::parse(text).unwrap();
            assert_eq!(ty.expr(), text);
            assert_eq!(HclType::parse(&ty.expr()).unwrap(), ty);
        }
        assert_eq!(
            HclType::parse(r#"object({"quoted" = bool})"#).unwrap(),
            HclType::Object(BTreeMap::from([("quoted".to_owned(), HclType::Bool)]))
        );
        assert_eq!(HclType::parse(" ( string ) ").unwrap(), HclType::String);
    }

    #[test]
    fn malformed_type_expressions_are_refused_with_the_reason() {
        for (text, needle) in [
            ("strin", "unknown type"),
            ("list(string", "not an HCL expression"),
            ("list(string, number)", "exactly one argument"),
            ("list()", "exactly one argument"),
            ("frob(string)", "unknown type constructor"),
            ("tuple(string)", "tuple([string, number])"),
            ("object(string)", "object({a = string})"),
            ("\"string\"", "is not a type"),
            ("1", "is not a type"),
            ("", "not an HCL expression"),
        ] {
            let err = HclType::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let deep = format!("{}string{}", "list(".repeat(200), ")".repeat(200));
        assert!(HclType::parse(&deep).is_err());
    }

    #[test]
    fn conversions_are_strict_except_to_string() {
        let s = HclType::String;
        let mut errors = Vec::new();
        assert_eq!(s.convert(&json!(5), "x", 0, &mut errors), Some(json!("5")));
        assert_eq!(
            s.convert(&json!(1.5), "x", 0, &mut errors),
            Some(json!("1.5"))
        );
        assert_eq!(
            s.convert(&json!(2.0), "x", 0, &mut errors),
            Some(json!("2"))
        );
        assert_eq!(
            s.convert(&json!(true), "x", 0, &mut errors),
            Some(json!("true"))
        );
        assert!(errors.is_empty());
        assert_eq!(
            HclType::Number.convert(&json!("5"), "x", 0, &mut errors),
            None
        );
        assert_eq!(
            HclType::Bool.convert(&json!("true"), "y", 0, &mut errors),
            None
        );
        assert_eq!(
            errors,
            vec![
                SpecError::new("x", "expected number, got a string"),
                SpecError::new("y", "expected bool, got a string")
            ]
        );
    }

    #[test]
    fn collection_errors_name_every_bad_element() {
        let ty = HclType::parse("map(list(number))").unwrap();
        let mut errors = Vec::new();
        let got = ty.convert(
            &json!({"a": [1, "x", null], "b": {}}),
            "cfg",
            0,
            &mut errors,
        );
        assert_eq!(got, None);
        assert_eq!(
            errors,
            vec![
                SpecError::new("cfg.a[1]", "expected number, got a string"),
                SpecError::new("cfg.a[2]", "expected number, got null"),
                SpecError::new("cfg.b", "expected list(number), got an object"),
            ]
        );
        let obj = HclType::parse("object({a = string, b = number})").unwrap();
        errors.clear();
        assert_eq!(
            obj.convert(&json!({"a": "x", "c": 1}), "o", 0, &mut errors),
            None
        );
        assert_eq!(
            errors,
            vec![
                SpecError::new("o.c", "unknown attribute"),
                SpecError::new("o.b", "missing attribute of type number")
            ]
        );
        errors.clear();
        let set = HclType::parse("set(string)").unwrap();
        assert_eq!(
            set.convert(&json!(["a", "b", "a"]), "s", 0, &mut errors),
            Some(json!(["a", "b"]))
        );
        let maps = HclType::parse("set(map(string))").unwrap();
        let got = maps.convert(
            &json!([{"a": "1", "b": 2}, {"b": "2", "a": 1}, {"a": "1"}]),
            "s",
            0,
            &mut errors,
        );
        assert_eq!(got, Some(json!([{"a": "1", "b": "2"}, {"a": "1"}])));
        // Large sets are deduplicated in linear time.
        let many: Vec<u64> = (0..50_000).map(|i| i % 25_000).collect();
        let got = HclType::parse("set(number)")
            .unwrap()
            .convert(&json!(many), "s", 0, &mut errors);
        assert_eq!(got.and_then(|v| v.as_array().map(Vec::len)), Some(25_000));
        let tuple = HclType::parse("tuple([string, number])").unwrap();
        assert_eq!(
            tuple.convert(&json!([1, 2]), "t", 0, &mut errors),
            Some(json!(["1", 2]))
        );
        assert_eq!(tuple.convert(&json!([1]), "t", 0, &mut errors), None);
        assert_eq!(errors.len(), 1);
    }
}
