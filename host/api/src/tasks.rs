//! Tasks: what a client sends to run, stop and inspect one, and what it gets back.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A request to run a task (`POST /v1/tasks`, `drover task run`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Driver name.
    pub driver: String,
    /// Driver-specific task config.
    #[serde(default)]
    pub config: serde_json::Value,
    /// Task name (default: the driver's name).
    #[serde(default)]
    pub name: Option<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Signal sent by `stop` (default SIGTERM).
    #[serde(default)]
    pub kill_signal: Option<String>,
    /// Time between the stop signal and SIGKILL, e.g. "5s".
    #[serde(default)]
    pub kill_timeout: Option<String>,
    /// What to do when the task exits unsuccessfully (default: no restarts).
    #[serde(default)]
    pub restart: Option<RestartPolicy>,
    /// Resource limits handed to the driver.
    #[serde(default)]
    pub resources: Option<Resources>,
    /// Log rotation limits (default: 10 files of 10 MiB per stream).
    #[serde(default)]
    pub logs: Option<LogConfig>,
}

/// How a task that fails is restarted, as Nomad users know it: at most `attempts`
/// restarts within any `interval`, each after `delay`; when the attempts are used up,
/// `mode` `fail` gives up and `delay` waits for the interval to end and starts over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartPolicy {
    /// Restarts allowed within `interval` (0: never restart).
    #[serde(default)]
    pub attempts: u32,
    /// The window `attempts` are counted in, e.g. "30m".
    #[serde(default = "RestartPolicy::default_interval")]
    pub interval: String,
    /// Wait before each restart, e.g. "15s".
    #[serde(default = "RestartPolicy::default_delay")]
    pub delay: String,
    /// `fail` or `delay`.
    #[serde(default)]
    pub mode: RestartMode,
}

impl RestartPolicy {
    fn default_interval() -> String {
        "30m".into()
    }
    fn default_delay() -> String {
        "15s".into()
    }
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            attempts: 0,
            interval: Self::default_interval(),
            delay: Self::default_delay(),
            mode: RestartMode::Fail,
        }
    }
}

/// What happens once a task used up its restart attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    /// The task is dead for good (`NotRestarting`).
    #[default]
    Fail,
    /// Wait until the interval has passed, then restart with a fresh count.
    Delay,
}

/// Resources requested for a task (the shape of the plugin SDK's `Resources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    /// Relative CPU weight.
    pub cpu_shares: i64,
    /// Memory reservation in MiB (0: none).
    pub memory_mb: i64,
    /// Hard memory limit in MiB (0: same as `memory_mb`).
    pub memory_max_mb: i64,
}

/// Log rotation limits for a task's stdout and stderr (the shape of the plugin SDK's
/// `LogConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// How many files to keep per stream.
    pub max_files: u32,
    /// Size of one file in MiB.
    pub max_file_size_mb: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            max_files: 10,
            max_file_size_mb: 10,
        }
    }
}

/// Lifecycle state of a task, as Nomad users know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskLifecycle {
    /// Accepted, not started yet.
    Pending,
    /// Started and not exited.
    Running,
    /// Exited, stopped or failed to start.
    Dead,
}

/// Something that happened to a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskEventView {
    /// When, RFC 3339.
    pub time: String,
    /// Event type, e.g. `Started`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Details.
    pub message: String,
}

/// What the API shows of a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskView {
    /// Task id.
    pub id: String,
    /// Task name.
    pub name: String,
    /// Driver name.
    pub driver: String,
    /// pending, running or dead.
    pub state: TaskLifecycle,
    /// Exit code of the last incarnation once it exited (absent while running, and
    /// when the driver could not tell: then `error` says why).
    pub exit_code: Option<i32>,
    /// Signal that killed it, if any.
    pub signal: Option<i32>,
    /// Killed by the OOM killer.
    pub oom_killed: bool,
    /// Why the task failed, when the driver could not say how it ended.
    pub error: Option<String>,
    /// The task directory.
    pub task_dir: PathBuf,
    /// Driver facts such as `pid`.
    pub attributes: BTreeMap<String, String>,
    /// When it was accepted.
    pub created_at: String,
    /// When it started.
    pub started_at: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// What happened, oldest first: the most recent events only (the agent keeps
    /// 100).
    pub events: Vec<TaskEventView>,
    /// How many older events were dropped to keep [`TaskView::events`] short.
    #[serde(default)]
    pub events_dropped: u64,
    /// How many times the task was restarted by its restart policy.
    #[serde(default)]
    pub restarts: u32,
    /// When the pending restart is due, RFC 3339 (only while one is pending).
    #[serde(default)]
    pub restart_at: Option<String>,
}

/// The body of `POST /v1/tasks/{id}/stop` (may be empty).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// Signal instead of the task's kill signal.
    pub signal: Option<String>,
    /// Time before SIGKILL instead of the task's kill timeout.
    pub timeout: Option<String>,
}

/// The body of `POST /v1/tasks/{id}/signal`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal name, e.g. `SIGHUP`.
    pub signal: String,
}

/// The query of `DELETE /v1/tasks/{id}`.
#[derive(Debug, Default, Deserialize)]
pub struct DestroyQuery {
    /// Kill the task first if it is running.
    #[serde(default)]
    pub force: bool,
}

/// Which output stream of a task.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Standard output.
    #[default]
    Stdout,
    /// Standard error.
    Stderr,
}

/// The query of `GET /v1/tasks/{id}/logs`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// Which stream.
    #[serde(default)]
    pub stream: LogStream,
    /// Keep the response open and send output as it is written, until the task is dead.
    #[serde(default)]
    pub follow: bool,
    /// Start this many bytes after the beginning of the oldest log file present.
    pub offset: Option<u64>,
    /// Start at the last N lines.
    pub tail: Option<u64>,
    /// Answer in frames ([`crate::Frame`]) instead of plain bytes.
    #[serde(default)]
    pub framed: bool,
}

/// The query of `GET /v1/tasks/{id}/stats`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    /// Stream a sample every `interval` (JSON lines) until the task is dead.
    #[serde(default)]
    pub follow: bool,
    /// Time between samples when following, e.g. "1s" (default 1s, at least 100ms).
    pub interval: Option<String>,
}

/// One resource usage sample, as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsView {
    /// Task id.
    pub task_id: String,
    /// When it was taken, RFC 3339.
    pub time: String,
    /// Percent of one core since the previous sample.
    pub cpu_percent: f64,
    /// User CPU time so far, seconds.
    pub cpu_user_seconds: f64,
    /// System CPU time so far, seconds.
    pub cpu_system_seconds: f64,
    /// Resident memory, bytes.
    pub memory_rss_bytes: u64,
    /// Page cache charged to the task, bytes (0: the driver cannot tell).
    #[serde(default)]
    pub memory_cache_bytes: u64,
    /// Processes in the task (0: the driver cannot tell).
    #[serde(default)]
    pub process_count: u64,
}
