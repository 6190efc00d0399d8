//! Tasks: what a client sends to run, stop and inspect one, and what it gets back.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration;

/// A request to run a task (`POST /v1/tasks`, `drover task run`).
///
/// ```
/// let req: drover_api::RunRequest = serde_json::from_str(
///     r#"{"driver": "rawexec", "config": {"command": "/bin/true"}, "kill_timeout": "10s"}"#,
/// ).unwrap();
/// assert_eq!(req.kill_timeout, Some(std::time::Duration::from_secs(10)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Time between the stop signal and SIGKILL (default 5s, at most
    /// [`MAX_KILL_TIMEOUT`](crate::MAX_KILL_TIMEOUT)); on the wire a string like "5s".
    #[serde(
        default,
        deserialize_with = "duration::kill_timeout",
        serialize_with = "humantime_serde::serialize"
    )]
    pub kill_timeout: Option<Duration>,
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
    /// The window `attempts` are counted in (default 30m); on the wire a string like
    /// "30m".
    #[serde(
        default = "RestartPolicy::default_interval",
        deserialize_with = "duration::restart_interval",
        serialize_with = "humantime_serde::serialize"
    )]
    pub interval: Duration,
    /// Wait before each restart (default 15s); on the wire a string like "15s".
    #[serde(
        default = "RestartPolicy::default_delay",
        deserialize_with = "duration::restart_delay",
        serialize_with = "humantime_serde::serialize"
    )]
    pub delay: Duration,
    /// `fail` or `delay`.
    #[serde(default)]
    pub mode: RestartMode,
}

impl RestartPolicy {
    /// The default `interval`: 30 minutes.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30 * 60);
    /// The default `delay`: 15 seconds.
    pub const DEFAULT_DELAY: Duration = Duration::from_secs(15);

    fn default_interval() -> Duration {
        Self::DEFAULT_INTERVAL
    }
    fn default_delay() -> Duration {
        Self::DEFAULT_DELAY
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

/// The most log one stream of a task may keep, in MiB: `max_files × max_file_size_mb`
/// at most this (1 GiB). A task's logs live on the agent's disk, and its followers
/// can hold deleted files open, so what one task may fill is bounded.
pub const MAX_LOG_MB_PER_STREAM: u64 = 1024;

impl LogConfig {
    /// Whether these limits can be used: each at least 1, and together at most
    /// [`MAX_LOG_MB_PER_STREAM`]. The error names the field (`logs.max_files`).
    pub fn check(&self) -> Result<(), String> {
        if self.max_files == 0 {
            return Err("logs.max_files must be at least 1".into());
        }
        if self.max_file_size_mb == 0 {
            return Err("logs.max_file_size_mb must be at least 1".into());
        }
        let total = u64::from(self.max_files) * u64::from(self.max_file_size_mb);
        if total > MAX_LOG_MB_PER_STREAM {
            return Err(format!(
                "logs.max_files × logs.max_file_size_mb is {} × {} = {total} MiB per stream, \
                 more than the maximum of {MAX_LOG_MB_PER_STREAM} MiB",
                self.max_files, self.max_file_size_mb
            ));
        }
        Ok(())
    }
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

impl TaskLifecycle {
    /// The name on the wire: `pending`, `running` or `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskLifecycle::Pending => "pending",
            TaskLifecycle::Running => "running",
            TaskLifecycle::Dead => "dead",
        }
    }
}

impl fmt::Display for TaskLifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The type of a task event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskEventKind {
    /// The agent accepted the task.
    Received,
    /// The driver started it (again, after a restart).
    Started,
    /// It exited; the message says how.
    Terminated,
    /// A user asked it to stop: the kill signal is being sent.
    Killing,
    /// It was stopped (or stopped before it started).
    Killed,
    /// A user sent it a signal.
    Signaling,
    /// The restart policy restarts it after a delay.
    Restarting,
    /// The restart policy gives up on it.
    NotRestarting,
    /// Its driver took it over again after an agent or plugin restart.
    Recovered,
    /// Its driver failed or is away; the task may still run.
    DriverFailure,
    /// The driver said something about the task (its `TaskEvents` stream): e.g. the
    /// qemu driver's "the guest powered off".
    DriverMessage,
}

impl TaskEventKind {
    /// The name on the wire, e.g. `"NotRestarting"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskEventKind::Received => "Received",
            TaskEventKind::Started => "Started",
            TaskEventKind::Terminated => "Terminated",
            TaskEventKind::Killing => "Killing",
            TaskEventKind::Killed => "Killed",
            TaskEventKind::Signaling => "Signaling",
            TaskEventKind::Restarting => "Restarting",
            TaskEventKind::NotRestarting => "NotRestarting",
            TaskEventKind::Recovered => "Recovered",
            TaskEventKind::DriverFailure => "DriverFailure",
            TaskEventKind::DriverMessage => "DriverMessage",
        }
    }
}

impl fmt::Display for TaskEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the name on the wire: `kind == "Started"`.
impl PartialEq<str> for TaskEventKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// Compares with the name on the wire: `kind == "Started"`.
impl PartialEq<&str> for TaskEventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Something that happened to a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEventView {
    /// When, RFC 3339.
    pub time: String,
    /// Event type, e.g. `Started`.
    #[serde(rename = "type")]
    pub kind: TaskEventKind,
    /// Details.
    pub message: String,
}

/// What the API shows of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// Signal instead of the task's kill signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Time before SIGKILL instead of the task's kill timeout; on the wire a string
    /// like "2s".
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "duration::stop_timeout",
        serialize_with = "humantime_serde::serialize"
    )]
    pub timeout: Option<Duration>,
}

/// The body of `POST /v1/tasks/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal name, e.g. `SIGHUP`.
    pub signal: String,
}

/// The query of `DELETE /v1/tasks/{id}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyQuery {
    /// Kill the task first if it is running.
    #[serde(default)]
    pub force: bool,
}

/// The answer to `DELETE /v1/tasks/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destroyed {
    /// The task's id.
    pub id: String,
    /// Always true: a task that could not be destroyed is an error.
    pub destroyed: bool,
}

/// Which output stream of a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Standard output.
    #[default]
    Stdout,
    /// Standard error.
    Stderr,
}

/// The query of `GET /v1/tasks/{id}/logs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// Which stream.
    #[serde(default)]
    pub stream: LogStream,
    /// Keep the response open and send output as it is written, until the task is dead.
    #[serde(default)]
    pub follow: bool,
    /// Start this many bytes after the beginning of the oldest log file present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Start at the last N lines (not together with `offset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u64>,
    /// Answer in frames ([`crate::Frame`]) instead of plain bytes.
    #[serde(default)]
    pub framed: bool,
}

/// The query of `GET /v1/tasks/{id}/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    /// Stream a sample every `interval` (JSON lines) until the task is dead.
    #[serde(default)]
    pub follow: bool,
    /// Time between samples when following (default 1s, at least 100ms); on the wire
    /// a string like "1s".
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "duration::stats_interval",
        serialize_with = "humantime_serde::serialize"
    )]
    pub interval: Option<Duration>,
}

/// One resource usage sample, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_text_on_the_wire() {
        let text = r#"{"driver":"rawexec","config":{"command":"/bin/true"},"name":null,"env":{},"kill_signal":null,"kill_timeout":"10s","restart":{"attempts":2,"interval":"30m","delay":"200ms","mode":"delay"},"resources":null,"logs":null}"#;
        let req: RunRequest = serde_json::from_str(text).unwrap();
        assert_eq!(req.kill_timeout, Some(Duration::from_secs(10)));
        let restart = req.restart.as_ref().unwrap();
        assert_eq!(restart.interval, Duration::from_secs(1800));
        assert_eq!(restart.delay, Duration::from_millis(200));
        assert_eq!(restart.mode, RestartMode::Delay);
        // Written back byte for byte.
        assert_eq!(serde_json::to_string(&req).unwrap(), text);
        // Spaces around the text are forgiven, compound durations read and written.
        let req: RunRequest =
            serde_json::from_str(r#"{"driver":"x","kill_timeout":" 1m30s "}"#).unwrap();
        assert_eq!(req.kill_timeout, Some(Duration::from_secs(90)));
        let again = serde_json::to_value(&req).unwrap();
        assert_eq!(again["kill_timeout"], "1m 30s");
        let back: RunRequest = serde_json::from_value(again).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let p: RestartPolicy = serde_json::from_str(r#"{"attempts":1}"#).unwrap();
        assert_eq!(
            p,
            RestartPolicy {
                attempts: 1,
                ..Default::default()
            }
        );
        assert_eq!(
            (p.interval, p.delay, p.mode),
            (
                Duration::from_secs(30 * 60),
                Duration::from_secs(15),
                RestartMode::Fail
            )
        );
        let stop: StopRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(stop, StopRequest::default());
        assert_eq!(serde_json::to_string(&stop).unwrap(), "{}");
        let stop = StopRequest {
            signal: Some("SIGINT".into()),
            timeout: Some(Duration::from_secs(2)),
        };
        assert_eq!(
            serde_json::to_string(&stop).unwrap(),
            r#"{"signal":"SIGINT","timeout":"2s"}"#
        );
    }

    #[test]
    fn bad_durations_name_the_field_and_the_text() {
        let err = |json: &str| {
            serde_json::from_str::<RunRequest>(json)
                .unwrap_err()
                .to_string()
        };
        let e = err(r#"{"driver":"x","kill_timeout":"soon"}"#);
        assert!(
            e.starts_with(r#"kill_timeout "soon" is not a duration like "5s": "#),
            "{e}"
        );
        let e = err(r#"{"driver":"x","kill_timeout":"2days"}"#);
        assert!(
            e.starts_with(r#"kill_timeout "2days" is longer than the maximum of 1day"#),
            "{e}"
        );
        let e = err(r#"{"driver":"x","restart":{"delay":"often"}}"#);
        assert!(
            e.starts_with(r#"restart.delay "often" is not a duration"#),
            "{e}"
        );
        let e = err(r#"{"driver":"x","restart":{"interval":"400days"}}"#);
        assert!(
            e.starts_with(r#"restart.interval "400days" is longer than the maximum"#),
            "{e}"
        );
        let e = err(r#"{"driver":"x","kill_timeout":5}"#);
        assert!(e.contains("invalid type: integer `5`"), "{e}");
        let e = serde_json::from_str::<StopRequest>(r#"{"timeout":"later"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(r#"timeout "later" is not a duration: "#),
            "{e}"
        );
    }

    #[test]
    fn a_task_view_reads_and_writes_the_agents_json_unchanged() {
        let text = r#"{"id":"5f0c","name":"web","driver":"rawexec","state":"dead","exit_code":3,"signal":null,"oom_killed":false,"error":null,"task_dir":"/alloc/5f0c","attributes":{"pid":"42"},"created_at":"2026-01-02T03:04:05.000006Z","started_at":"2026-01-02T03:04:05.100000Z","finished_at":"2026-01-02T03:04:06.000000Z","events":[{"time":"2026-01-02T03:04:05.000006Z","type":"Received","message":"task received by driver rawexec"},{"time":"2026-01-02T03:04:06.000000Z","type":"NotRestarting","message":"exceeded 2 attempts in 1m (mode fail)"}],"events_dropped":0,"restarts":2,"restart_at":null}"#;
        let view: TaskView = serde_json::from_str(text).unwrap();
        assert_eq!(view.state, TaskLifecycle::Dead);
        assert_eq!(view.state.to_string(), "dead");
        assert_eq!(view.events[1].kind, TaskEventKind::NotRestarting);
        assert!(view.events[0].kind == "Received");
        assert_eq!(view.events[1].kind.to_string(), "NotRestarting");
        assert_eq!(serde_json::to_string(&view).unwrap(), text);
        let e =
            serde_json::from_str::<TaskEventView>(r#"{"time":"t","type":"Exploded","message":""}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("unknown variant `Exploded`"), "{e}");
    }
}
