//! Durations as Go's `time.Duration` travels in JSON: an integer of nanoseconds.
//! Read leniently: a duration string (`"10s"`, `"1m30s"`) is accepted too, as
//! hand-written requests use it.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};
use serde_json::Value;

/// Nanoseconds, saturating at `i64::MAX` (292 years).
pub(crate) fn to_nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Reads a duration from a JSON value: nanoseconds or a duration string.
pub(crate) fn from_value(v: &Value) -> Result<Option<Duration>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Ok(Some(Duration::from_nanos(u)))
            } else if n.as_i64().is_some() {
                Err(format!(
                    "a duration cannot be negative, got {n} nanoseconds"
                ))
            } else {
                match n.as_f64() {
                    Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 9.2e18 => {
                        Ok(Some(Duration::from_nanos(f as u64)))
                    }
                    _ => Err(format!(
                        "expected a duration in whole nanoseconds (or a string like \"10s\"), got {n}"
                    )),
                }
            }
        }
        Value::String(s) => humantime::parse_duration(s.trim()).map(Some).map_err(|e| {
            format!("{s:?} is not a duration ({e}); write nanoseconds or e.g. \"10s\"")
        }),
        other => Err(format!(
            "expected a duration in nanoseconds (or a string like \"10s\"), got {other}"
        )),
    }
}

/// `#[serde(with = "duration::opt")]` for `Option<Duration>`.
pub(crate) mod opt {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_i64(to_nanos(*d)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let v = Value::deserialize(d)?;
        from_value(&v).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "duration::plain")]` for `Duration` (absent or null: zero).
pub(crate) mod plain {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(to_nanos(*d))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = Value::deserialize(d)?;
        from_value(&v)
            .map(Option::unwrap_or_default)
            .map_err(serde::de::Error::custom)
    }
}
