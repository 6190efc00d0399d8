//! Nomad's wire shape of the cluster's objects: the JSON of Nomad's `api` package
//! (v1.0), PascalCase keys as Nomad writes them (`ID`, `TaskGroups`, `MemoryMB`,
//! `LTarget`), durations in nanoseconds, times of objects in nanoseconds since the epoch
//! and times of task states in RFC 3339.
//!
//! The internal types of [`crate::types`] stay the model (the state store and the node
//! RPCs keep them); the HTTP API speaks only these. Every object the server serves has a
//! conversion from its internal type (`From<&crate::Job> for nomad::Job`, the list
//! stubs, ...), and a job as a client submits it converts into a [`crate::JobSpec`]
//! with [`Job::to_spec`] (or `JobSpec::try_from`), which refuses what Drover cannot run
//! yet instead of dropping it: a field Nomad knows and Drover does not is an error
//! naming the field (`TaskGroups[0].Services: not supported yet by Drover`) as soon as
//! it carries a value; `null`, `false`, `0`, `""`, `[]` and `{}` carry none (Nomad's own
//! `nomad job run -output` writes many of those).
//!
//! Keys are read as Nomad writes them and, for the fields Drover uses, in snake_case
//! too (`task_groups`, `memory_mb`), since Go's decoder is lenient about case and
//! hand-written requests rely on it. Fields Drover has that Nomad lacks travel in extra
//! PascalCase keys (e.g. `TaskState.TaskID`), which Nomad's clients ignore.

mod acl;
mod alloc;
mod deployment;
mod duration;
mod eval;
mod job;
#[cfg(test)]
mod job_tests;
mod network;
mod node;
mod volumes;
#[cfg(test)]
mod wire_tests;

pub use acl::*;
pub use alloc::*;
pub use deployment::*;
pub use eval::*;
pub use job::*;
pub use network::*;
pub use node::*;
pub use volumes::*;

use serde_json::Value;

/// The namespace of an object that names none.
pub use crate::namespaces::DEFAULT_NAMESPACE;

/// A wire namespace as Drover keeps it: empty (an older client's, or a stub's that
/// left it out) is `default`.
pub fn namespace_or_default(ns: &str) -> String {
    if ns.is_empty() {
        DEFAULT_NAMESPACE.to_owned()
    } else {
        ns.to_owned()
    }
}
/// The region a server names when none is configured (Nomad's default).
pub use crate::types::DEFAULT_REGION;

/// A submitted job Drover cannot take as it is. Displays as `PATH: MESSAGE`, the path
/// being the JSON path of the field in the job (`TaskGroups[0].Tasks[1].KillTimeout`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConversionError {
    /// Where, e.g. `TaskGroups[0].Services`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl ConversionError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> ConversionError {
        ConversionError {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn unsupported(path: impl Into<String>) -> ConversionError {
        ConversionError::new(path, "not supported yet by Drover")
    }
}

/// Whether a value carries nothing: `null`, `false`, `0`, `""`, `[]`, `{}`, or an
/// object whose every value carries nothing (Nomad writes empty blocks as objects of
/// nulls).
pub(crate) fn carries_nothing(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(carries_nothing),
    }
}

/// Whether `v` asks for nothing beyond Nomad's default `default`: every key it sets
/// carries nothing or has the default's value. A job read from a Nomad server holds
/// Nomad's defaults of blocks Drover lacks (`EphemeralDisk`, `Migrate`); they ask
/// nothing Drover must refuse.
pub(crate) fn is_nomad_default(v: &Value, default: &Value) -> bool {
    match v {
        Value::Object(o) => o
            .iter()
            .all(|(k, val)| carries_nothing(val) || default.get(k) == Some(val)),
        other => carries_nothing(other),
    }
}

/// Reads `null` as the default: Go writes a nil map, slice or pointer as `null`.
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    use serde::Deserialize as _;
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `prefix.Key`, or `Key` at the top.
pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Refuses the first field of `fields` (named as Nomad names them) that carries a value.
pub(crate) fn refuse_unsupported(
    prefix: &str,
    fields: &[(&str, &Option<Value>)],
) -> Result<(), ConversionError> {
    for (name, value) in fields {
        if let Some(v) = value
            && !carries_nothing(v)
        {
            return Err(ConversionError::unsupported(join(prefix, name)));
        }
    }
    Ok(())
}

/// Refuses a key neither Nomad (as far as Drover knows it) nor Drover has, when it
/// carries a value: a misspelt key must not be dropped.
pub(crate) fn refuse_unknown(
    prefix: &str,
    others: &std::collections::BTreeMap<String, Value>,
) -> Result<(), ConversionError> {
    for (key, value) in others {
        if !carries_nothing(value) {
            return Err(ConversionError::new(
                join(prefix, key),
                "unknown field (Nomad's API spells fields in PascalCase, e.g. TaskGroups)",
            ));
        }
    }
    Ok(())
}

/// Nanoseconds since the epoch as RFC 3339 (UTC, nanoseconds when there are any).
pub fn rfc3339_from_nanos(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let sub = nanos.rem_euclid(1_000_000_000) as u32;
    match u64::try_from(secs) {
        Ok(secs) => {
            let t = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(secs)
                + std::time::Duration::from_nanos(u64::from(sub));
            humantime::format_rfc3339_nanos(t).to_string()
        }
        // Before the epoch: Go's zero time is what Nomad writes for "never".
        Err(_) => GO_ZERO_TIME.to_owned(),
    }
}

/// RFC 3339 as nanoseconds since the epoch (`None` for Go's zero time or garbage).
pub fn nanos_from_rfc3339(text: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(text).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_nanos()).ok()
}

/// What Go writes for a `time.Time` never set.
pub const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";
