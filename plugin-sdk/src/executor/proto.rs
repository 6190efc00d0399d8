//! What the plugin and the executor say to each other, and what they write to files.
//! Shared by both sides so that they cannot disagree.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::types::{ExitResult, LogConfig, TaskStats};

use super::PROTOCOL_VERSION;

/// How the executor starts a task: written by the plugin to `task.json`, read by the
/// executor. The executor is the same binary as the plugin that wrote it, so unknown
/// fields are refused rather than ignored (an isolation setting silently dropped would
/// be worse than a refusal).
///
/// Drivers with isolation (exec, java) extend it with optional fields
/// (`#[serde(default)]`): namespaces, chroot, cgroup, capabilities, user, rlimits,
/// all applied in one place, between fork and exec.
///
/// ```
/// let mut spec = drover_plugin_sdk::executor::LaunchSpec::new("web-1", "/bin/echo");
/// spec.args = vec!["hello".into()];
/// spec.env.insert("PATH".into(), "/bin:/usr/bin".into());
/// assert_eq!(spec.cwd, std::path::Path::new("/"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LaunchSpec {
    /// The task id (also the key of the executor directory).
    pub task_id: String,
    /// The program: an absolute path, or a name looked up in `env["PATH"]`.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The task's whole environment (nothing is inherited from the plugin).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; must exist.
    #[serde(default = "root")]
    pub cwd: PathBuf,
    /// Base path of the stdout log files (`<base>.0`, `<base>.1`, …); empty discards.
    #[serde(default)]
    pub stdout_path: PathBuf,
    /// Base path of the stderr log files; empty discards.
    #[serde(default)]
    pub stderr_path: PathBuf,
    /// Size and count limits of the log files.
    #[serde(default)]
    pub logs: LogConfig,
}

fn root() -> PathBuf {
    PathBuf::from("/")
}

impl LaunchSpec {
    /// Run `command` for task `task_id`, with no arguments, an empty environment, in
    /// `/`, output discarded. Set the public fields for the rest.
    pub fn new(task_id: impl Into<String>, command: impl Into<String>) -> Self {
        LaunchSpec {
            task_id: task_id.into(),
            command: command.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: root(),
            stdout_path: PathBuf::new(),
            stderr_path: PathBuf::new(),
            logs: LogConfig::default(),
        }
    }
}

/// How a task ended, as the executor recorded it.
///
/// ```
/// use drover_plugin_sdk::{ExitResult, executor::ExitInfo};
/// let e = ExitInfo {
///     result: ExitResult::signaled(9),
///     exited_at: std::time::SystemTime::now(),
///     killed_after_timeout: true,
/// };
/// assert!(!e.result.successful());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code or signal (and the OOM flag, for drivers that can tell).
    pub result: ExitResult,
    /// When the executor reaped it.
    pub exited_at: SystemTime,
    /// A `stop` request's timeout ran out and the executor sent SIGKILL.
    #[serde(default)]
    pub killed_after_timeout: bool,
}

/// A task as its executor sees it: answered by every call, and written to `exit.json`
/// (with `exit` set) when the task has exited.
///
/// ```
/// let s = drover_plugin_sdk::executor::ExecutorStatus {
///     task_id: "web-1".into(),
///     pid: 4242,
///     pgid: 4242,
///     start_time: 123456,
///     started_at: std::time::SystemTime::now(),
///     executor_pid: 4241,
///     exit: None,
/// };
/// assert!(s.running());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorStatus {
    /// The task id from the launch spec: proves the executor is the right one.
    pub task_id: String,
    /// The task's main process.
    pub pid: u32,
    /// Its process group, which signals go to.
    pub pgid: u32,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// When it was started.
    pub started_at: SystemTime,
    /// The executor's own pid.
    pub executor_pid: u32,
    /// How it ended, once it has.
    pub exit: Option<ExitInfo>,
}

impl ExecutorStatus {
    /// The task has not exited yet.
    pub fn running(&self) -> bool {
        self.exit.is_none()
    }
}

/// One request: `{"v":1,"op":"wait"}`, `{"v":1,"op":"signal","signal":10}`, …
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request {
    pub v: u32,
    #[serde(flatten)]
    pub op: Op,
}

impl Request {
    pub(crate) fn new(op: Op) -> Self {
        Request {
            v: PROTOCOL_VERSION,
            op,
        }
    }
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
    /// Answer at once.
    Status,
    /// Resource usage of the task's main process, with the status.
    Stats,
    /// Answer when the task has exited.
    Wait,
    /// Send `signal` to the task's process group.
    Signal { signal: i32 },
    /// Send `signal`, then SIGKILL to the group after `timeout_ms`; answer on exit.
    Stop { signal: i32, timeout_ms: u64 },
    /// SIGKILL the group if running, remove the directory, answer, exit.
    Destroy,
}

/// Why a request failed, so the client can map it to the right [`crate::DriverError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorKind {
    /// A bad request (unknown signal, unknown op, newer protocol).
    Invalid,
    /// The task has exited (e.g. signal to an exited task).
    Exited,
    /// The task could not be started (start-up reply only).
    Spawn,
    /// Anything else.
    Internal,
}

/// One reply, and also the start-up line the executor writes to the plugin: the task's
/// status, or an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Reply {
    pub v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ExecutorStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<TaskStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

impl Reply {
    pub(crate) fn ok(status: ExecutorStatus) -> Self {
        Reply {
            v: PROTOCOL_VERSION,
            status: Some(status),
            stats: None,
            error: None,
            kind: None,
        }
    }

    pub(crate) fn err(kind: ErrorKind, message: impl Into<String>) -> Self {
        Reply {
            v: PROTOCOL_VERSION,
            status: None,
            stats: None,
            error: Some(message.into()),
            kind: Some(kind),
        }
    }
}

/// The content of `exit.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExitFile {
    pub v: u32,
    pub status: ExecutorStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_on_the_wire() {
        let text = serde_json::to_string(&Request::new(Op::Stop {
            signal: 15,
            timeout_ms: 500,
        }))
        .unwrap();
        assert_eq!(text, r#"{"v":1,"op":"stop","signal":15,"timeout_ms":500}"#);
        let back: Request = serde_json::from_str(r#"{"op":"wait","v":1}"#).unwrap();
        assert_eq!(back.op, Op::Wait);
        assert!(serde_json::from_str::<Request>(r#"{"v":1,"op":"reboot"}"#).is_err());
    }

    #[test]
    fn launch_spec_refuses_unknown_fields_and_defaults_the_rest() {
        let s: LaunchSpec = serde_json::from_str(r#"{"task_id":"t","command":"x"}"#).unwrap();
        assert_eq!(s, LaunchSpec::new("t", "x"));
        let err =
            serde_json::from_str::<LaunchSpec>(r#"{"task_id":"t","command":"x","chroot":"/srv"}"#)
                .unwrap_err();
        assert!(err.to_string().contains("chroot"), "{err}");
    }

    #[test]
    fn error_replies_omit_the_status() {
        let text = serde_json::to_string(&Reply::err(ErrorKind::Exited, "gone")).unwrap();
        assert_eq!(text, r#"{"v":1,"error":"gone","kind":"exited"}"#);
    }
}
