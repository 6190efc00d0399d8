//! An hclspec from the JSON Schema schemars 1.x derives for a config struct.

use std::collections::{BTreeMap, BTreeSet};

use drover_proto::nomad::hclspec::{self as pb, spec::Block as SpecKind};
use serde_json::Value;

use super::types::{HclType, MAX_DEPTH};
use super::{Spec, SpecError, join_key};

/// What a (sub)schema describes, as far as an hclspec can tell things apart.
enum Shape {
    /// A value of an HCL type.
    Type(HclType),
    /// An object with named properties (a struct): the schema, `$ref`s resolved.
    Struct(Value),
    /// An array.
    List {
        item: Box<Shape>,
        unique: bool,
        min: u64,
        max: u64,
    },
    /// An object keyed by arbitrary strings (a map).
    Map(Box<Shape>),
}

struct Reader<'a> {
    root: &'a Value,
}

pub(crate) fn spec_of_root(schema: &Value) -> Result<Spec, SpecError> {
    let reader = Reader { root: schema };
    match reader.shape(schema, "", 0)?.0 {
        Shape::Struct(s) => reader.body(&s, "", 0),
        _ => Err(SpecError::new(
            "",
            "the schema must describe an object with properties (a struct)",
        )),
    }
}

fn spec(kind: SpecKind) -> Spec {
    Spec { block: Some(kind) }
}

impl Reader<'_> {
    /// The Object spec of a struct's properties.
    fn body(&self, schema: &Value, path: &str, depth: usize) -> Result<Spec, SpecError> {
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut attributes = std::collections::HashMap::new();
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let p = join_key(path, name);
                let s =
                    self.property(name, prop, required.contains(name.as_str()), &p, depth + 1)?;
                attributes.insert(name.clone(), s);
            }
        }
        Ok(spec(SpecKind::Object(pb::Object { attributes })))
    }

    fn property(
        &self,
        name: &str,
        prop: &Value,
        listed: bool,
        path: &str,
        depth: usize,
    ) -> Result<Spec, SpecError> {
        let (shape, nullable) = self.shape(prop, path, depth)?;
        let default = prop.get("default").filter(|d| !d.is_null());
        let required = listed && !nullable && default.is_none();
        let name = name.to_owned();
        let primary = match shape {
            Shape::Struct(s) => spec(SpecKind::BlockValue(Box::new(pb::Block {
                name,
                required,
                nested: Some(Box::new(self.body(&s, path, depth)?)),
            }))),
            Shape::List {
                item,
                unique,
                min,
                max,
            } if matches!(*item, Shape::Struct(_)) => {
                let Shape::Struct(s) = *item else {
                    unreachable!("matched above")
                };
                let nested = Some(Box::new(self.body(&s, path, depth)?));
                let (min_items, max_items) = (if required { min } else { 0 }, max);
                // An absent block list is an empty list, never null: no Default needed.
                return Ok(if unique {
                    spec(SpecKind::BlockSet(Box::new(pb::BlockSet {
                        name,
                        min_items,
                        max_items,
                        nested,
                    })))
                } else {
                    spec(SpecKind::BlockList(Box::new(pb::BlockList {
                        name,
                        min_items,
                        max_items,
                        nested,
                    })))
                });
            }
            Shape::Map(value) if matches!(*value, Shape::Struct(_)) => {
                let Shape::Struct(s) = *value else {
                    unreachable!("matched above")
                };
                return Ok(spec(SpecKind::BlockMap(Box::new(pb::BlockMap {
                    name,
                    labels: vec!["name".to_owned()],
                    nested: Some(Box::new(self.body(&s, path, depth)?)),
                }))));
            }
            other => spec(SpecKind::Attr(pb::Attr {
                name,
                r#type: self.hcl_type(other, path, depth)?.expr(),
                required,
            })),
        };
        let Some(default) = default else {
            return Ok(primary);
        };
        Ok(spec(SpecKind::Default(Box::new(pb::Default {
            primary: Some(Box::new(primary)),
            default: Some(Box::new(spec(SpecKind::Literal(pb::Literal {
                value: hcl_literal(default),
            })))),
        }))))
    }

    /// The HCL type of a shape in a type position (a list element, a map value, an attribute).
    fn hcl_type(&self, shape: Shape, path: &str, depth: usize) -> Result<HclType, SpecError> {
        Ok(match shape {
            Shape::Type(t) => t,
            Shape::List {
                item,
                unique: false,
                ..
            } => HclType::List(Box::new(self.hcl_type(*item, path, depth + 1)?)),
            Shape::List {
                item, unique: true, ..
            } => HclType::Set(Box::new(self.hcl_type(*item, path, depth + 1)?)),
            Shape::Map(value) => HclType::Map(Box::new(self.hcl_type(*value, path, depth + 1)?)),
            Shape::Struct(s) => {
                // cty's object types need every attribute: only a struct whose properties
                // are all required and never null has one; anything else is `any`.
                let required: BTreeSet<&str> = s
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut attrs = BTreeMap::new();
                for (name, prop) in s
                    .get("properties")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                {
                    let p = join_key(path, name);
                    let (shape, nullable) = self.shape(prop, &p, depth + 1)?;
                    if nullable || !required.contains(name.as_str()) {
                        return Ok(HclType::Any);
                    }
                    attrs.insert(name.clone(), self.hcl_type(shape, &p, depth + 1)?);
                }
                HclType::Object(attrs)
            }
        })
    }

    /// What `schema` describes, and whether it also admits null (an `Option`).
    fn shape(&self, schema: &Value, path: &str, depth: usize) -> Result<(Shape, bool), SpecError> {
        if depth > MAX_DEPTH {
            return Err(SpecError::new(
                path,
                "schema nested too deeply (a recursive type?)",
            ));
        }
        let obj = match schema {
            Value::Bool(true) => return Ok((Shape::Type(HclType::Any), true)),
            Value::Object(o) => o,
            _ => {
                return Err(SpecError::new(
                    path,
                    format!("not a usable JSON Schema: {schema}"),
                ));
            }
        };
        if let Some(reference) = obj.get("$ref") {
            let target = reference
                .as_str()
                .and_then(|r| r.strip_prefix('#'))
                .and_then(|pointer| self.root.pointer(pointer))
                .ok_or_else(|| SpecError::new(path, format!("unresolvable $ref {reference}")))?;
            return self.shape(target, path, depth + 1);
        }
        if let Some([only]) = obj
            .get("allOf")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            return self.shape(only, path, depth + 1);
        }
        if let Some(variants) = obj
            .get("anyOf")
            .or_else(|| obj.get("oneOf"))
            .and_then(Value::as_array)
        {
            let (nulls, rest): (Vec<&Value>, Vec<&Value>) =
                variants.iter().partition(|v| is_null_schema(v));
            let nullable = !nulls.is_empty();
            return Ok(match rest.as_slice() {
                [only] => {
                    let (shape, inner_nullable) = self.shape(only, path, depth + 1)?;
                    (shape, nullable || inner_nullable)
                }
                _ if !rest.is_empty() && rest.iter().all(|v| is_string_schema(v)) => {
                    (Shape::Type(HclType::String), nullable)
                }
                _ => (Shape::Type(HclType::Any), nullable),
            });
        }
        let values = obj
            .get("enum")
            .and_then(Value::as_array)
            .cloned()
            .or_else(|| obj.get("const").map(|c| vec![c.clone()]));
        if let Some(values) = values {
            let nullable = values.iter().any(Value::is_null);
            let non_null: Vec<&Value> = values.iter().filter(|v| !v.is_null()).collect();
            let ty = if !non_null.is_empty() && non_null.iter().all(|v| v.is_string()) {
                HclType::String
            } else if !non_null.is_empty() && non_null.iter().all(|v| v.is_number()) {
                HclType::Number
            } else if !non_null.is_empty() && non_null.iter().all(|v| v.is_boolean()) {
                HclType::Bool
            } else {
                HclType::Any
            };
            return Ok((Shape::Type(ty), nullable));
        }
        let (ty, nullable) = match obj.get("type") {
            Some(Value::String(t)) => (Some(t.as_str()), false),
            Some(Value::Array(ts)) => {
                let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
                let non_null: Vec<&str> = names.iter().copied().filter(|t| *t != "null").collect();
                let nullable = non_null.len() < names.len();
                match non_null.as_slice() {
                    [one] => (Some(*one), nullable),
                    _ => return Ok((Shape::Type(HclType::Any), nullable)),
                }
            }
            _ => (None, false),
        };
        let shape = match ty {
            Some("string") => Shape::Type(HclType::String),
            Some("integer" | "number") => Shape::Type(HclType::Number),
            Some("boolean") => Shape::Type(HclType::Bool),
            Some("null") => return Ok((Shape::Type(HclType::Any), true)),
            Some("array") => {
                if let Some(prefix) = obj.get("prefixItems").and_then(Value::as_array) {
                    let mut items = Vec::with_capacity(prefix.len());
                    for (i, item) in prefix.iter().enumerate() {
                        let (shape, _) =
                            self.shape(item, &super::join_index(path, i), depth + 1)?;
                        items.push(self.hcl_type(shape, path, depth + 1)?);
                    }
                    Shape::Type(HclType::Tuple(items))
                } else {
                    let item = match obj.get("items") {
                        Some(items) => self.shape(items, &format!("{path}[]"), depth + 1)?.0,
                        None => Shape::Type(HclType::Any),
                    };
                    let count = |key: &str| obj.get(key).and_then(Value::as_u64).unwrap_or(0);
                    Shape::List {
                        item: Box::new(item),
                        unique: obj.get("uniqueItems") == Some(&Value::Bool(true)),
                        min: count("minItems"),
                        max: count("maxItems"),
                    }
                }
            }
            Some("object") | None if is_struct(obj) => Shape::Struct(schema.clone()),
            Some("object") => match obj.get("additionalProperties") {
                Some(Value::Object(_)) => {
                    let value = obj
                        .get("additionalProperties")
                        .map_or(Ok(Shape::Type(HclType::Any)), |v| {
                            self.shape(v, &format!("{path}.*"), depth + 1).map(|s| s.0)
                        })?;
                    Shape::Map(Box::new(value))
                }
                _ => Shape::Map(Box::new(Shape::Type(HclType::Any))),
            },
            _ => Shape::Type(HclType::Any),
        };
        Ok((shape, nullable))
    }
}

/// An object schema with named properties, or one closed to any (`struct Empty {}`).
fn is_struct(obj: &serde_json::Map<String, Value>) -> bool {
    obj.contains_key("properties") || obj.get("additionalProperties") == Some(&Value::Bool(false))
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
        || v.get("const").is_some_and(Value::is_null)
}

fn is_string_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("string")
        || v.get("const").is_some_and(Value::is_string)
        || v.get("enum")
            .and_then(Value::as_array)
            .is_some_and(|e| e.iter().all(Value::is_string))
}

/// A JSON value as an HCL literal. JSON is HCL expression syntax, except that `${` and
/// `%{` in a string start a template there; HCL's escapes for them are `$${` and `%%{`.
/// (Those two sequences can only occur inside JSON strings.)
pub(crate) fn hcl_literal(value: &Value) -> String {
    value.to_string().replace("${", "$${").replace("%{", "%%{")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nomad::hclspec::node::eval_literal;
    use serde_json::json;

    #[test]
    fn json_defaults_are_hcl_literals_that_evaluate_back() {
        for v in [
            json!("bash"),
            json!("${not_a_template} and %{ not_a_directive }"),
            json!("quote \" backslash \\ newline \n tab \t unicode é \u{1}"),
            json!(["a", 1, 2.5, true, null]),
            json!({"a": {"b": [1, {"c": "d"}]}, "weird key-1": "x"}),
            json!(-3),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(1e300),
            json!(0.1),
            json!(-2.5e-8),
            json!("emoji 🦀 and \u{2028}"),
            json!({"": "", "$${": "%%{"}),
        ] {
            assert_eq!(
                eval_literal(&hcl_literal(&v), &mut { usize::MAX }).unwrap(),
                v,
                "{}",
                hcl_literal(&v)
            );
        }
    }

    #[test]
    fn non_struct_roots_and_bad_refs_are_refused() {
        assert!(
            spec_of_root(&json!({"type": "string"}))
                .unwrap_err()
                .message
                .contains("struct")
        );
        let err =
            spec_of_root(&json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}))
                .unwrap_err();
        assert_eq!(err.path, "a");
        assert!(err.message.contains("unresolvable $ref"), "{err}");
        let recursive = json!({
            "type": "object", "properties": {"n": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        });
        assert!(
            spec_of_root(&recursive)
                .unwrap_err()
                .message
                .contains("recursive")
        );
    }
}
