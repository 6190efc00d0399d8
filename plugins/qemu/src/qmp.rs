//! A small typed QMP client over tokio (QEMU Machine Protocol: JSON objects, one per
//! line, on a unix socket).
//!
//! Why not a crate: `qapi`/`qapi-qmp` (generated from QEMU's whole schema) is only
//! passively maintained and brings thousands of generated types for the five commands
//! the driver sends; QMP's framing is one JSON value per line.
//!
//! The protocol, as the driver uses it:
//! 1. on connect the server sends a greeting `{"QMP": {"version": {...}, "capabilities": [...]}}`;
//! 2. the client must send `{"execute": "qmp_capabilities"}` before any other command;
//! 3. each command gets `{"return": ...}` or `{"error": {"class", "desc"}}`, matched by
//!    the `id` the client sends with it;
//! 4. asynchronous events `{"event": "SHUTDOWN", "data": {"guest": true, "reason":
//!    "guest-shutdown"}, "timestamp": {...}}` may arrive between replies.
//!
//! Every read is bounded (a line longer than [`MAX_LINE`] is an error, so a broken or
//! hostile peer cannot grow our memory) and every call takes a timeout.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Longest QMP line accepted (replies to the commands we send are a few hundred bytes).
pub const MAX_LINE: usize = 1 << 20;

/// What can go wrong talking QMP.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting or reading/writing the socket failed.
    #[error("QMP socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The peer sent something that is not QMP (no greeting, bad JSON, a line too long).
    #[error("QMP protocol: {0}")]
    Protocol(String),
    /// The command failed: QMP's `error.class` and `error.desc`.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command sent.
        command: String,
        /// QMP's error class (`GenericError`, `CommandNotFound`, …).
        class: String,
        /// QMP's description.
        desc: String,
    },
    /// No answer in time.
    #[error("QMP {0}: no answer within {1:?}")]
    Timeout(String, Duration),
    /// The connection closed (qemu exited).
    #[error("QMP connection closed")]
    Closed,
}

/// qemu's version from the greeting.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct QemuVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Micro.
    pub micro: u32,
    /// The package string (`Debian 1:7.2+dfsg-7`), may be empty.
    pub package: String,
}

/// `query-status`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VmStatus {
    /// `running`, `paused`, `shutdown`, `prelaunch`, …
    pub status: String,
    /// Whether the VM's CPUs run.
    pub running: bool,
}

/// An asynchronous QMP event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `SHUTDOWN`: `guest` is true when the guest itself powered off (ACPI poweroff
    /// after `system_powerdown`, or a `poweroff` inside); `reason` is QMP's
    /// (`guest-shutdown`, `host-qmp-quit`, `host-signal`, …).
    Shutdown {
        /// The guest asked for it.
        guest: bool,
        /// QMP's reason.
        reason: String,
    },
    /// `POWERDOWN`: `system_powerdown` was delivered (the guest may ignore it).
    Powerdown,
    /// `STOP` / `RESUME`.
    Stop,
    /// `RESUME`.
    Resume,
    /// Any other event, by name.
    Other(String),
}

/// A connected QMP session, past the greeting and `qmp_capabilities`.
///
/// Events that arrive while a command waits for its reply are kept (bounded: the
/// oldest are dropped beyond 256) and handed out by [`Qmp::next_event`].
pub struct Qmp {
    _private: (),
}

impl Qmp {
    /// Connect to the socket at `path`, read the greeting and negotiate
    /// (`qmp_capabilities`), all within `timeout`. `path` is a socket in a directory
    /// only the driver can write (the caller makes sure of that).
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let _ = (path, timeout);
        Err(QmpError::Protocol("FOUNDATION STUB".into()))
    }

    /// qemu's version, from the greeting.
    pub fn version(&self) -> &QemuVersion {
        unimplemented!("FOUNDATION STUB")
    }

    /// `query-status`.
    pub async fn query_status(&mut self, timeout: Duration) -> Result<VmStatus, QmpError> {
        let _ = timeout;
        Err(QmpError::Protocol("FOUNDATION STUB".into()))
    }

    /// `system_powerdown`: press the ACPI power button. Returns when qemu accepted it;
    /// whether the guest acts on it shows as a `SHUTDOWN` event (or never).
    pub async fn system_powerdown(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let _ = timeout;
        Err(QmpError::Protocol("FOUNDATION STUB".into()))
    }

    /// `quit`: qemu exits at once (no guest shutdown).
    pub async fn quit(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let _ = timeout;
        Err(QmpError::Protocol("FOUNDATION STUB".into()))
    }

    /// Any command with arguments, for what has no typed method yet; the `return`
    /// value as JSON.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<serde_json::Value, QmpError> {
        let _ = (command, arguments, timeout);
        Err(QmpError::Protocol("FOUNDATION STUB".into()))
    }

    /// The next event (kept ones first); `Ok(None)` when `timeout` passes without one;
    /// [`QmpError::Closed`] when qemu closed the socket.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, QmpError> {
        let _ = timeout;
        Err(QmpError::Protocol("FOUNDATION STUB".into()))
    }
}
