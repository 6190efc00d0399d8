//! [`Signal`]: a POSIX signal, as the driver trait and the host pass it around.
//!
//! The wire protocol spells signals as text (`"SIGTERM"`, empty for the default);
//! the SDK turns that text into a [`Signal`] at its edge, so drivers only ever see a
//! signal that exists.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A signal this platform knows, such as `SIGTERM`.
///
/// Parse it from a name with or without the `SIG` prefix, in any case, or from its
/// number; it prints (and serializes) as its full name.
///
/// ```
/// use drover_plugin_sdk::Signal;
/// let term: Signal = "SIGTERM".parse().unwrap();
/// assert_eq!(term, Signal::TERM);
/// assert_eq!("term".parse::<Signal>().unwrap(), Signal::TERM);
/// assert_eq!("15".parse::<Signal>().unwrap(), Signal::TERM);
/// assert_eq!(term.to_string(), "SIGTERM");
/// assert_eq!(term.as_raw(), 15);
/// assert!("SIGNOPE".parse::<Signal>().is_err());
/// assert_eq!(serde_json::to_string(&Signal::HUP).unwrap(), r#""SIGHUP""#);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signal(nix::sys::signal::Signal);

/// Why a text is not a [`Signal`].
///
/// ```
/// let e = "SIGNOPE".parse::<drover_plugin_sdk::Signal>().unwrap_err();
/// assert_eq!(e.to_string(), "unknown signal \"SIGNOPE\" (expected a name like SIGTERM or TERM, or a number like 15)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseSignalError {
    /// The text is empty.
    #[error("empty signal name (expected a name like SIGTERM or TERM, or a number like 15)")]
    Empty,
    /// A name this platform does not know.
    #[error("unknown signal {0:?} (expected a name like SIGTERM or TERM, or a number like 15)")]
    UnknownName(String),
    /// A number that is no signal on this platform.
    #[error("unknown signal number {0}")]
    UnknownNumber(i32),
}

impl From<ParseSignalError> for crate::DriverError {
    fn from(e: ParseSignalError) -> Self {
        crate::DriverError::InvalidConfig(e.to_string())
    }
}

impl Signal {
    /// `SIGHUP` (1).
    pub const HUP: Signal = Signal(nix::sys::signal::Signal::SIGHUP);
    /// `SIGINT` (2).
    pub const INT: Signal = Signal(nix::sys::signal::Signal::SIGINT);
    /// `SIGQUIT` (3).
    pub const QUIT: Signal = Signal(nix::sys::signal::Signal::SIGQUIT);
    /// `SIGKILL` (9): cannot be caught; what a stop escalates to.
    pub const KILL: Signal = Signal(nix::sys::signal::Signal::SIGKILL);
    /// `SIGUSR1` (10).
    pub const USR1: Signal = Signal(nix::sys::signal::Signal::SIGUSR1);
    /// `SIGUSR2` (12).
    pub const USR2: Signal = Signal(nix::sys::signal::Signal::SIGUSR2);
    /// `SIGTERM` (15): the default stop signal.
    pub const TERM: Signal = Signal(nix::sys::signal::Signal::SIGTERM);
    /// `SIGCONT` (18).
    pub const CONT: Signal = Signal(nix::sys::signal::Signal::SIGCONT);

    /// The signal's number, for system calls and the executor's protocol.
    ///
    /// ```
    /// assert_eq!(drover_plugin_sdk::Signal::KILL.as_raw(), 9);
    /// ```
    pub fn as_raw(self) -> i32 {
        self.0 as i32
    }

    /// The full name, `SIGTERM`.
    ///
    /// ```
    /// assert_eq!(drover_plugin_sdk::Signal::USR1.name(), "SIGUSR1");
    /// ```
    pub fn name(self) -> &'static str {
        self.0.as_str()
    }

    /// Parse text in which empty (or blank) means the default, `SIGTERM`: how the wire
    /// protocol's `StopTask` and the agent's task settings spell a signal. Otherwise the
    /// same as [`str::parse`].
    ///
    /// ```
    /// use drover_plugin_sdk::Signal;
    /// assert_eq!(Signal::parse_or_default("").unwrap(), Signal::TERM);
    /// assert_eq!(Signal::parse_or_default(" hup ").unwrap(), Signal::HUP);
    /// assert!(Signal::parse_or_default("SIGNOPE").is_err());
    /// ```
    pub fn parse_or_default(text: &str) -> Result<Signal, ParseSignalError> {
        if text.trim().is_empty() {
            Ok(Signal::default())
        } else {
            text.parse()
        }
    }
}

/// `SIGTERM`, the signal a stop sends unless told otherwise.
impl Default for Signal {
    fn default() -> Self {
        Signal::TERM
    }
}

impl FromStr for Signal {
    type Err = ParseSignalError;

    /// A name (`SIGTERM`, `TERM`, `sigterm`) or a number (`15`). Surrounding blanks
    /// are ignored.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(ParseSignalError::Empty);
        }
        if let Ok(n) = trimmed.parse::<i32>() {
            return Signal::try_from(n);
        }
        let upper = trimmed.to_ascii_uppercase();
        let full = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        nix::sys::signal::Signal::from_str(&full)
            .map(Signal)
            .map_err(|_| ParseSignalError::UnknownName(text.to_owned()))
    }
}

impl TryFrom<i32> for Signal {
    type Error = ParseSignalError;

    /// The signal numbered `n`, if this platform has one.
    fn try_from(n: i32) -> Result<Self, Self::Error> {
        nix::sys::signal::Signal::try_from(n)
            .map(Signal)
            .map_err(|_| ParseSignalError::UnknownNumber(n))
    }
}

impl From<Signal> for i32 {
    fn from(s: Signal) -> i32 {
        s.as_raw()
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `SIGTERM` reads better in assertions than `Signal(SIGTERM)`.
        f.write_str(self.name())
    }
}

impl Serialize for Signal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Signal {
    /// Any text [`str::parse`] accepts, so hand-written configs may say `TERM` or `15`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Signal {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Signal".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A signal name like SIGTERM or TERM, or a number like 15"
        })
    }
}

/// Set SIGCHLD back to its default disposition if this process was started with it
/// ignored, and say whether it was. Call it first thing in `main`, before anything
/// installs a handler for SIGCHLD; [`crate::serve`] does, for every plugin.
///
/// An ignored SIGCHLD survives `exec`, so a daemon started that way (by a careless
/// supervisor or shell) hands it to everything it runs. The kernel then reaps the
/// process's children itself: their exit statuses are lost, and a handle that signals
/// a child by pid (tokio's `kill_on_drop`) may hit whatever process got that pid since.
/// A caught or default SIGCHLD is left as it is.
///
/// ```
/// // First thing in `main`:
/// if drover_plugin_sdk::signal::reset_ignored_sigchld() {
///     eprintln!("started with SIGCHLD ignored; set back to its default");
/// }
/// // Done once: nothing left to change.
/// assert!(!drover_plugin_sdk::signal::reset_ignored_sigchld());
/// ```
pub fn reset_ignored_sigchld() -> bool {
    // SAFETY: a query (null new action) of SIGCHLD's disposition into a zeroed
    // struct the call fills.
    #[allow(unsafe_code)]
    let ignored = unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    };
    if ignored {
        // SAFETY: SIG_DFL installs no handler; it replaces SIG_IGN only.
        #[allow(unsafe_code)]
        unsafe {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        }
    }
    ignored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_and_without_prefix_in_any_case() {
        for text in [
            "SIGTERM",
            "TERM",
            "sigterm",
            "term",
            "SigTerm",
            " SIGTERM\n",
        ] {
            assert_eq!(text.parse::<Signal>(), Ok(Signal::TERM), "{text:?}");
        }
        assert_eq!("usr1".parse::<Signal>(), Ok(Signal::USR1));
        assert_eq!("SIGKILL".parse::<Signal>(), Ok(Signal::KILL));
    }

    #[test]
    fn numbers() {
        assert_eq!("9".parse::<Signal>(), Ok(Signal::KILL));
        assert_eq!("1".parse::<Signal>(), Ok(Signal::HUP));
        assert_eq!(Signal::try_from(15), Ok(Signal::TERM));
        assert_eq!(
            "0".parse::<Signal>(),
            Err(ParseSignalError::UnknownNumber(0))
        );
        assert_eq!(
            "999".parse::<Signal>(),
            Err(ParseSignalError::UnknownNumber(999))
        );
        assert_eq!(
            "-15".parse::<Signal>(),
            Err(ParseSignalError::UnknownNumber(-15))
        );
        assert_eq!(i32::from(Signal::USR2), 12);
    }

    #[test]
    fn garbage_is_refused_with_the_text() {
        for text in ["SIGNOPE", "NOPE", "SIG", "SIGTERM2", "15x", "SIG TERM", "ä"] {
            match text.parse::<Signal>() {
                Err(ParseSignalError::UnknownName(t)) => assert_eq!(t, text),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert_eq!("".parse::<Signal>(), Err(ParseSignalError::Empty));
        assert_eq!("  ".parse::<Signal>(), Err(ParseSignalError::Empty));
        let e = crate::DriverError::from("SIGNOPE".parse::<Signal>().unwrap_err());
        assert!(
            matches!(&e, crate::DriverError::InvalidConfig(m) if m.contains("SIGNOPE")),
            "{e:?}"
        );
    }

    #[test]
    fn empty_means_term_only_where_asked() {
        assert_eq!(Signal::parse_or_default(""), Ok(Signal::TERM));
        assert_eq!(Signal::parse_or_default("INT"), Ok(Signal::INT));
        assert_eq!(Signal::default(), Signal::TERM);
    }

    #[test]
    fn display_and_serde_use_the_full_name() {
        assert_eq!(Signal::CONT.to_string(), "SIGCONT");
        assert_eq!(format!("{:?}", Signal::QUIT), "SIGQUIT");
        let json = serde_json::to_string(&Signal::INT).unwrap();
        assert_eq!(json, r#""SIGINT""#);
        assert_eq!(serde_json::from_str::<Signal>(&json).unwrap(), Signal::INT);
        assert_eq!(
            serde_json::from_str::<Signal>(r#""hup""#).unwrap(),
            Signal::HUP
        );
        let e = serde_json::from_str::<Signal>(r#""SIGNOPE""#).unwrap_err();
        assert!(e.to_string().contains("SIGNOPE"), "{e}");
        // Every signal this platform knows survives the trip through its name.
        for n in 1..65 {
            if let Ok(s) = Signal::try_from(n) {
                assert_eq!(s.to_string().parse::<Signal>(), Ok(s));
                assert_eq!(s.as_raw(), n);
            }
        }
    }

    #[test]
    fn schema_is_a_string() {
        let schema = serde_json::to_value(schemars::schema_for!(Signal)).unwrap();
        assert_eq!(schema["type"], "string", "{schema}");
    }
}
