//! Durations in the API's JSON and queries: text as people write it ("30s", "1m 30s"),
//! parsed and formatted by humantime. Each field has its own deserializer so that a
//! bad value is refused with a message naming the field, and a value beyond the
//! field's maximum is refused while its text is still known.

use std::time::Duration;

use serde::{Deserialize as _, Deserializer, de::Error as _};

/// Longest kill timeout accepted: a stop that waits longer is not a stop.
pub const MAX_KILL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Longest restart `interval` or `delay` accepted: longer ones mean nothing useful, and
/// would overflow the clock arithmetic (or RFC 3339, which ends at year 9999).
pub const MAX_RESTART_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// A duration as people write it, to the millisecond (`0s` for zero).
pub fn human_duration(d: Duration) -> String {
    let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if ms.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(ms).to_string()
}

/// How one field's text is checked.
struct Field {
    /// The name errors give it, e.g. `restart.delay`.
    name: &'static str,
    /// What a good value looks like, for the error (empty, or ` like "5s"`).
    like: &'static str,
    /// The longest value accepted.
    max: Option<Duration>,
}

impl Field {
    fn parse(&self, text: &str) -> Result<Duration, String> {
        let name = self.name;
        let d = humantime::parse_duration(text.trim())
            .map_err(|e| format!("{name} {text:?} is not a duration{}: {e}", self.like))?;
        if let Some(max) = self.max
            && d > max
        {
            return Err(format!(
                "{name} {text:?} is longer than the maximum of {}",
                human_duration(max)
            ));
        }
        Ok(d)
    }

    fn one<'de, D: Deserializer<'de>>(&self, d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        self.parse(&text).map_err(D::Error::custom)
    }

    fn optional<'de, D: Deserializer<'de>>(&self, d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| self.parse(&text))
            .transpose()
            .map_err(D::Error::custom)
    }
}

const KILL_TIMEOUT: Field = Field {
    name: "kill_timeout",
    like: " like \"5s\"",
    max: Some(MAX_KILL_TIMEOUT),
};

const RESTART_INTERVAL: Field = Field {
    name: "restart.interval",
    like: " like \"30s\" or \"5m\"",
    max: Some(MAX_RESTART_DURATION),
};

const RESTART_DELAY: Field = Field {
    name: "restart.delay",
    like: " like \"30s\" or \"5m\"",
    max: Some(MAX_RESTART_DURATION),
};

const STOP_TIMEOUT: Field = Field {
    name: "timeout",
    like: "",
    max: None,
};

const STATS_INTERVAL: Field = Field {
    name: "interval",
    like: "",
    max: None,
};

pub(crate) fn kill_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    KILL_TIMEOUT.optional(d)
}

pub(crate) fn restart_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    RESTART_INTERVAL.one(d)
}

pub(crate) fn restart_delay<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    RESTART_DELAY.one(d)
}

pub(crate) fn stop_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    STOP_TIMEOUT.optional(d)
}

pub(crate) fn stats_interval<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    STATS_INTERVAL.optional(d)
}
