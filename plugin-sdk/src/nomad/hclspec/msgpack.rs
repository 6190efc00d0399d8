//! JSON <-> msgpack as cty's msgpack encoding writes a decoded config value and the Go
//! plugins' ugorji codec reads it.

use rmpv::Value as Mp;
use serde_json::{Map, Number, Value};

use super::types::MAX_DEPTH;
use super::{SpecError, join_index, join_key};

/// Largest magnitude below which every integral f64 is exactly an i64 (2^63).
const I64_LIMIT: f64 = 9_223_372_036_854_775_808.0;

/// Numbers as cty writes them: an integral number as an integer, others as float64.
pub(crate) fn canonical_number(n: &Number) -> Number {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < I64_LIMIT => Number::from(f as i64),
        _ => n.clone(),
    }
}

/// Rewrites integral floats as integers everywhere in `value`; refuses values nested
/// deeper than [`MAX_DEPTH`] (an `any` attribute passes its value through unchecked).
pub(crate) fn canonicalize(value: &mut Value, path: &str, depth: usize) -> Result<(), SpecError> {
    if depth > MAX_DEPTH {
        return Err(SpecError::new(path, "value nested too deeply"));
    }
    match value {
        Value::Number(n) => *n = canonical_number(n),
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                canonicalize(item, &join_index(path, i), depth + 1)?;
            }
        }
        Value::Object(entries) => {
            for (k, item) in entries.iter_mut() {
                canonicalize(item, &join_key(path, k), depth + 1)?;
            }
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
    Ok(())
}

/// The msgpack value of a canonical JSON value; map keys sorted, as cty writes objects
/// and maps (whatever order serde_json's map keeps).
pub(crate) fn to_msgpack(value: &Value) -> Mp {
    match value {
        Value::Null => Mp::Nil,
        Value::Bool(b) => Mp::Boolean(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Mp::from(i)
            } else if let Some(u) = n.as_u64() {
                Mp::from(u)
            } else {
                Mp::F64(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => Mp::from(s.as_str()),
        Value::Array(items) => Mp::Array(items.iter().map(to_msgpack).collect()),
        Value::Object(entries) => {
            let mut pairs: Vec<(&String, &Value)> = entries.iter().collect();
            pairs.sort_by(|a, b| a.0.cmp(b.0));
            Mp::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| (Mp::from(k.as_str()), to_msgpack(v)))
                    .collect(),
            )
        }
    }
}

/// Reads one msgpack value, all of `bytes`, into JSON.
pub(crate) fn from_msgpack_bytes(bytes: &[u8]) -> Result<Value, SpecError> {
    let mut rest = bytes;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, MAX_DEPTH)
        .map_err(|e| SpecError::new("", format!("not a msgpack value: {e}")))?;
    if !rest.is_empty() {
        return Err(SpecError::new(
            "",
            format!("{} byte(s) left after the msgpack value", rest.len()),
        ));
    }
    from_msgpack(&value, "")
}

fn from_msgpack(value: &Mp, path: &str) -> Result<Value, SpecError> {
    Ok(match value {
        Mp::Nil => Value::Null,
        Mp::Boolean(b) => Value::Bool(*b),
        Mp::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            (None, None) => return Err(SpecError::new(path, "integer out of range")),
        },
        Mp::F32(f) => float(f64::from(*f), path)?,
        Mp::F64(f) => float(*f, path)?,
        Mp::String(s) => match s.as_str() {
            Some(s) => Value::String(s.to_owned()),
            None => return Err(SpecError::new(path, "string is not valid UTF-8")),
        },
        Mp::Binary(b) => {
            return Err(SpecError::new(
                path,
                format!("binary data ({} bytes) has no JSON form", b.len()),
            ));
        }
        Mp::Ext(tag, _) => {
            return Err(SpecError::new(
                path,
                format!(
                    "msgpack extension type {tag} has no JSON form (cty writes unknown values so)"
                ),
            ));
        }
        Mp::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| from_msgpack(v, &join_index(path, i)))
                .collect::<Result<_, _>>()?,
        ),
        Mp::Map(pairs) => {
            let mut out = Map::new();
            for (k, v) in pairs {
                let Some(key) = k.as_str() else {
                    return Err(SpecError::new(path, format!("map key {k} is not a string")));
                };
                let p = join_key(path, key);
                if out.insert(key.to_owned(), from_msgpack(v, &p)?).is_some() {
                    return Err(SpecError::new(p, "duplicate map key"));
                }
            }
            Value::Object(out)
        }
    })
}

fn float(f: f64, path: &str) -> Result<Value, SpecError> {
    Number::from_f64(f)
        .map(|n| Value::Number(canonical_number(&n)))
        .ok_or_else(|| SpecError::new(path, format!("{f} has no JSON form")))
}
