//! Nomad's interactive exec into a task, `/v1/client/allocation/:alloc/exec?task=T&
//! command=<JSON array>&tty=<bool>`: a WebSocket whose text messages are JSON
//! [`ExecFrame`]s, in Nomad 1.0's shape (`ExecStreamingInput` and
//! `ExecStreamingOutput`), so that Nomad's CLI and UI work unchanged.
//!
//! - client → agent: `{"stdin":{"data":"<base64>"}}`, `{"stdin":{"close":true}}`,
//!   `{"tty_size":{"height":24,"width":80}}`, and from a browser, which cannot set
//!   headers on a WebSocket, first `{"version":1,"auth_token":"<secret>"}`;
//! - agent → client: `{"stdout":{"data":"<base64>"}}`, `{"stderr":{...}}`, and last
//!   `{"exited":true,"result":{"exit_code":N}}`. An error (unknown task, not
//!   running, not allowed) closes the socket with a close frame that says why.

use serde::{Deserialize, Serialize};

/// Nomad's `ExecStreamingIOOperation`: bytes, or the end of a stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecIo {
    /// Bytes, base64 in JSON.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::client_fs::base64_bytes"
    )]
    pub data: Vec<u8>,
    /// The stream ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub close: bool,
}

/// Nomad's `TerminalSize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    /// Rows.
    #[serde(default)]
    pub height: u16,
    /// Columns.
    #[serde(default)]
    pub width: u16,
}

/// Nomad's `ExecStreamingExitResult`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// The command's exit code (128 + N for a command killed by signal N).
    pub exit_code: i32,
}

/// One message of the exec WebSocket, either way (Nomad's input and output frames
/// share no field, so one type reads and writes both).
///
/// ```
/// use drover_server_api::exec::{ExecFrame, ExecIo};
/// let f: ExecFrame = serde_json::from_str(r#"{"stdin":{"data":"aWQgLXUK"}}"#).unwrap();
/// assert_eq!(f.stdin.unwrap().data, b"id -u\n");
/// let out = ExecFrame { stdout: Some(ExecIo { data: b"0\n".to_vec(), close: false }), ..Default::default() };
/// assert_eq!(serde_json::to_string(&out).unwrap(), r#"{"stdout":{"data":"MAo="}}"#);
/// assert_eq!(serde_json::to_string(&ExecFrame::exited(3)).unwrap(), r#"{"exited":true,"result":{"exit_code":3}}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecFrame {
    /// Input for the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<ExecIo>,
    /// The caller's terminal size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty_size: Option<TtySize>,
    /// What the command wrote to stdout (everything, with a terminal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<ExecIo>,
    /// What the command wrote to stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<ExecIo>,
    /// The command ended ([`ExecFrame::result`] says how).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exited: bool,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ExecResult>,
    /// Nomad's UI: the protocol version of its first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Nomad's UI: the caller's token, in its first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<String>,
}

impl ExecFrame {
    /// The last frame: the command ended with `exit_code`.
    pub fn exited(exit_code: i32) -> ExecFrame {
        ExecFrame {
            exited: true,
            result: Some(ExecResult { exit_code }),
            ..Default::default()
        }
    }
}

/// The most a close frame's reason may hold (125 bytes of payload, 2 of them the code).
pub const MAX_CLOSE_REASON: usize = 123;

/// `reason` cut to fit a close frame, at a character boundary.
pub fn close_reason(reason: &str) -> String {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}
