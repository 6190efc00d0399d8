//! What the TOML file readers share: the task files of `drover task run` ([`taskfile`],
//! here) and the job files of `drover job run` (`drover_server_api::jobfile`, which
//! depends on this crate). Both say where a problem is, `FILE:LINE: FIELD: MESSAGE`
//! ([`FileError`]), from the spans of the TOML parser, and both turn free-form TOML
//! (a driver's config, an `env` table) into JSON the same way.
//!
//! It lives in this crate because it is the lower of the two: the server's API crate
//! depends on this one, never the other way round, and `toml` is all it adds.
//!
//! [`taskfile`]: crate::taskfile

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeString, DeTable, DeValue};

/// A file that could not be used. Displays as `FILE:LINE: FIELD: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct FileError {
    /// The file name as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// Path of the field, e.g. `restart.attempts` or `group[0].task[1].env.PORT`, when
    /// one is concerned.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// The text of a file and the name its errors mention.
#[derive(Debug, Clone, Copy)]
pub struct Source<'t> {
    /// The whole file.
    pub text: &'t str,
    /// The file name as given.
    pub file: &'t str,
}

impl<'t> Source<'t> {
    /// An error on the line of `span` (line 1 without one).
    pub fn error(
        &self,
        span: Option<Range<usize>>,
        field: Option<String>,
        message: String,
    ) -> FileError {
        FileError {
            file: self.file.to_owned(),
            line: span.map_or(1, |s| self.line_of(s.start)),
            field,
            message,
        }
    }

    /// The file as a spanned TOML table; a syntax error names its line and column.
    pub fn parse(&self) -> Result<Spanned<DeTable<'t>>, FileError> {
        DeTable::parse(self.text).map_err(|e| {
            let message = match e.span() {
                Some(s) => format!(
                    "invalid TOML at column {}: {}",
                    self.column_of(s.start),
                    e.message().trim_end()
                ),
                None => format!("invalid TOML: {}", e.message().trim_end()),
            };
            self.error(e.span(), None, message)
        })
    }

    /// `root` as a `T`; an error names the field it is about. `hint(field)` may add a
    /// remedy to the message of an error about `field`.
    pub fn deserialize<T: for<'de> Deserialize<'de>>(
        &self,
        root: &Spanned<DeTable<'t>>,
        hint: impl Fn(&str) -> Option<&'static str>,
    ) -> Result<T, FileError> {
        T::deserialize(toml::de::Deserializer::from(root.clone())).map_err(|e| {
            let field = e.span().and_then(|s| field_at(root.get_ref(), &s));
            let mut message = e.message().trim_end().to_owned();
            if let Some(h) = field.as_deref().and_then(&hint) {
                message.push_str(h);
            }
            self.error(e.span(), field, message)
        })
    }

    /// `v` as a duration of at most `max`; `field` is its path.
    pub fn duration(
        &self,
        v: &Spanned<String>,
        field: &str,
        max: Duration,
    ) -> Result<Duration, FileError> {
        let d = humantime::parse_duration(v.get_ref()).map_err(|e| {
            self.error(
                Some(v.span()),
                Some(field.to_owned()),
                format!(
                    "{:?} is not a duration like \"5s\" or \"1m30s\": {e}",
                    v.get_ref()
                ),
            )
        })?;
        if d > max {
            return Err(self.error(
                Some(v.span()),
                Some(field.to_owned()),
                format!(
                    "{:?} is longer than the maximum of {}",
                    v.get_ref(),
                    crate::human_duration(max)
                ),
            ));
        }
        Ok(d)
    }

    /// `env` and `meta`: a table whose values are strings, or scalars turned into
    /// strings; `field` is its path.
    pub fn string_map(
        &self,
        value: &Spanned<DeValue<'_>>,
        field: &str,
    ) -> Result<BTreeMap<String, String>, FileError> {
        let DeValue::Table(t) = value.get_ref() else {
            return Err(self.error(
                Some(value.span()),
                Some(field.to_owned()),
                format!(
                    "expected a table of strings, found {}",
                    value.get_ref().type_str()
                ),
            ));
        };
        let mut out = BTreeMap::new();
        for (k, v) in t {
            let text = match v.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(_) | DeValue::Float(_) | DeValue::Boolean(_) => {
                    scalar_json(v.get_ref())
                        .map(|j| j.to_string())
                        .unwrap_or_default()
                }
                other => {
                    return Err(self.error(
                        Some(v.span()),
                        Some(format!("{field}.{}", k.get_ref())),
                        format!("expected a string, found {}", other.type_str()),
                    ));
                }
            };
            out.insert(k.get_ref().to_string(), text);
        }
        Ok(out)
    }

    /// Free-form TOML (a driver's config) as JSON; `field` is its path. `seen(pointer,
    /// span)` is called for every key and array element, with its JSON pointer.
    pub fn to_json(
        &self,
        value: &Spanned<DeValue<'_>>,
        field: &str,
        seen: &mut dyn FnMut(&str, Range<usize>),
    ) -> Result<serde_json::Value, FileError> {
        fn go(
            value: &Spanned<DeValue<'_>>,
            pointer: &str,
            field: &str,
            seen: &mut dyn FnMut(&str, Range<usize>),
        ) -> Result<serde_json::Value, (Range<usize>, String, String)> {
            Ok(match value.get_ref() {
                DeValue::Table(t) => {
                    let mut map = serde_json::Map::new();
                    for (k, v) in t {
                        let key = k.get_ref().to_string();
                        let p = format!("{pointer}/{}", escape_pointer(&key));
                        seen(&p, k.span());
                        map.insert(key.clone(), go(v, &p, &format!("{field}.{key}"), seen)?);
                    }
                    serde_json::Value::Object(map)
                }
                DeValue::Array(a) => {
                    let mut items = Vec::new();
                    for (i, v) in a.iter().enumerate() {
                        let p = format!("{pointer}/{i}");
                        seen(&p, v.span());
                        items.push(go(v, &p, &format!("{field}[{i}]"), seen)?);
                    }
                    serde_json::Value::Array(items)
                }
                other => scalar_json(other).ok_or_else(|| {
                    (
                        value.span(),
                        field.to_owned(),
                        format!("{} cannot be represented in JSON", other.type_str()),
                    )
                })?,
            })
        }
        go(value, "", field, seen)
            .map_err(|(span, field, message)| self.error(Some(span), Some(field), message))
    }

    /// 1-based line of byte `offset`.
    pub fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }

    /// 1-based column (in characters) of byte `offset`.
    pub fn column_of(&self, offset: usize) -> usize {
        let text = self.text;
        let end = offset.min(text.len());
        let start = text.as_bytes()[..end]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        text.get(start..end)
            .map_or(end - start, |s| s.chars().count())
            + 1
    }
}

/// The key `key` of `table` and its value.
pub fn entry<'a, 'i>(
    table: &'a DeTable<'i>,
    key: &str,
) -> Option<(&'a Spanned<DeString<'i>>, &'a Spanned<DeValue<'i>>)> {
    table.iter().find(|(k, _)| k.get_ref() == key)
}

/// The value of the key `key` of `table`.
pub fn value<'a, 'i>(table: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
    entry(table, key).map(|(_, v)| v)
}

/// `key` as one segment of a JSON pointer: `a/b` → `a~1b`.
pub fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The dotted path of the deepest key whose key or value contains `span`.
///
/// Every level is searched, not only the children whose span contains `span`: the
/// span of a table opened by a `[header]` covers the header, not the keys below it.
fn field_at(table: &DeTable<'_>, span: &Range<usize>) -> Option<String> {
    fn inside(s: &Range<usize>, at: usize) -> bool {
        s.start <= at && at < s.end.max(s.start + 1)
    }
    fn walk(value: &DeValue<'_>, at: usize) -> Option<Vec<String>> {
        let children: Vec<(String, Range<usize>, &Spanned<DeValue<'_>>)> = match value {
            DeValue::Table(t) => t
                .iter()
                .map(|(k, v)| (k.get_ref().to_string(), k.span(), v))
                .collect(),
            DeValue::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("[{i}]"), v.span(), v))
                .collect(),
            _ => return None,
        };
        for (name, key_span, child) in children {
            if let Some(mut deeper) = walk(child.get_ref(), at) {
                deeper.insert(0, name);
                return Some(deeper);
            }
            if inside(&key_span, at) || inside(&child.span(), at) {
                return Some(vec![name]);
            }
        }
        None
    }
    let path = walk(&DeValue::Table(table.clone()), span.start)?;
    let mut field = String::new();
    for seg in path {
        if !field.is_empty() && !seg.starts_with('[') {
            field.push('.');
        }
        field.push_str(&seg);
    }
    Some(field)
}

/// A TOML scalar as JSON; `None` for tables, arrays and floats JSON cannot hold.
fn scalar_json(value: &DeValue<'_>) -> Option<serde_json::Value> {
    match value {
        DeValue::String(s) => Some(serde_json::Value::String(s.to_string())),
        DeValue::Boolean(b) => Some((*b).into()),
        DeValue::Integer(i) => {
            let n = i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok()?;
            Some(n.into())
        }
        DeValue::Float(f) => {
            let n: f64 = f.as_str().replace('_', "").parse().ok()?;
            serde_json::Number::from_f64(n).map(serde_json::Value::Number)
        }
        DeValue::Datetime(d) => Some(serde_json::Value::String(d.to_string())),
        DeValue::Array(_) | DeValue::Table(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        let at = |text| Source { text, file: "f" };
        assert_eq!(at("a\nb\nc").line_of(4), 3);
        assert_eq!(at("a\nbé c").column_of(6), 4);
    }
}
