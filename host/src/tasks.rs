//! Tasks: validate, start through the right driver, watch until they exit, stop.
//!
//! State is in memory for now; the durable store and restart policies build on the
//! same [`TaskManager`].

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use drover_plugin_sdk::{DriverError, ExitResult, TaskHandle, TaskSpec};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::catalog::{Catalog, LoadedPlugin};
use crate::loader::PluginState;

/// Default time between the stop signal and SIGKILL.
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);

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
    pub resources: Option<drover_plugin_sdk::Resources>,
    /// Log rotation limits (default: 10 files of 10 MiB per stream).
    #[serde(default)]
    pub logs: Option<drover_plugin_sdk::LogConfig>,
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
    /// Exit code once dead (absent while running).
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
    /// What happened, oldest first.
    pub events: Vec<TaskEventView>,
}

struct TaskEntry {
    view: Mutex<TaskView>,
    handle: Mutex<Option<TaskHandle>>,
    kill_signal: String,
    kill_timeout: Duration,
    dead: watch::Sender<bool>,
}

impl TaskEntry {
    fn view(&self) -> std::sync::MutexGuard<'_, TaskView> {
        self.view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn event(&self, kind: &str, message: impl Into<String>) {
        let message = message.into();
        let mut v = self.view();
        tracing::info!(task = %v.id, event = kind, "{message}");
        v.events.push(TaskEventView {
            time: now(),
            kind: kind.into(),
            message,
        });
    }

    fn finish(&self, result: &ExitResult) {
        {
            let mut v = self.view();
            if v.state == TaskLifecycle::Dead {
                return;
            }
            v.state = TaskLifecycle::Dead;
            v.exit_code = Some(result.exit_code);
            v.signal = (result.signal != 0).then_some(result.signal);
            v.oom_killed = result.oom_killed;
            v.error = result.err.clone();
            v.finished_at = Some(now());
        }
        let mut msg = format!("exit code {}", result.exit_code);
        if result.signal != 0 {
            msg = format!("killed by signal {}", result.signal);
        }
        if result.oom_killed {
            msg.push_str(", OOM killed");
        }
        if let Some(e) = &result.err {
            msg.push_str(&format!(" ({e})"));
        }
        self.event("Terminated", msg);
        self.dead.send_replace(true);
    }
}

fn now() -> String {
    humantime::format_rfc3339_micros(SystemTime::now()).to_string()
}

/// Runs tasks through the catalog's drivers.
pub struct TaskManager {
    catalog: Arc<Catalog>,
    alloc_dir: PathBuf,
    tasks: RwLock<HashMap<String, Arc<TaskEntry>>>,
}

impl TaskManager {
    /// A manager creating task directories under `alloc_dir`.
    pub fn new(catalog: Arc<Catalog>, alloc_dir: PathBuf) -> Self {
        TaskManager {
            catalog,
            alloc_dir,
            tasks: RwLock::new(HashMap::new()),
        }
    }

    fn entry(&self, id: &str) -> Result<Arc<TaskEntry>, DriverError> {
        self.tasks
            .read()
            .ok()
            .and_then(|t| t.get(id).cloned())
            .ok_or_else(|| DriverError::NotFound(format!("no task with id {id:?}")))
    }

    fn plugin(&self, driver: &str) -> Result<Arc<LoadedPlugin>, DriverError> {
        self.catalog.get(driver).ok_or_else(|| {
            DriverError::NotFound(format!(
                "no driver named {driver:?}; loaded drivers: {}",
                self.catalog.names().join(", ")
            ))
        })
    }

    /// Validate and start a task. Nothing is created when the request is invalid or
    /// the driver refuses it.
    pub async fn run(self: &Arc<Self>, req: RunRequest) -> Result<TaskView, DriverError> {
        let plugin = self.plugin(&req.driver)?;
        let (state, reason) = plugin.state();
        if state != PluginState::Healthy {
            return Err(DriverError::Unavailable(format!(
                "driver {:?} is {state:?}: {reason}",
                req.driver
            )));
        }
        let config = if req.config.is_null() {
            serde_json::json!({})
        } else {
            req.config.clone()
        };
        crate::loader::validate(&plugin.task_schema(), &config).map_err(|e| {
            DriverError::InvalidConfig(format!("task config for driver {:?}: {e}", req.driver))
        })?;
        let kill_signal = req.kill_signal.clone().unwrap_or_else(|| "SIGTERM".into());
        drover_plugin_sdk::parse_signal(&kill_signal)?;
        let kill_timeout = match &req.kill_timeout {
            None => DEFAULT_KILL_TIMEOUT,
            Some(t) => humantime::parse_duration(t).map_err(|e| {
                DriverError::InvalidConfig(format!(
                    "kill_timeout {t:?} is not a duration like \"5s\": {e}"
                ))
            })?,
        };

        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = req.name.clone().unwrap_or_else(|| req.driver.clone());
        let task_dir = self.alloc_dir.join(&id);
        create_task_dir(&task_dir).map_err(|e| {
            DriverError::Internal(format!(
                "cannot create task dir {}: {e}",
                task_dir.display()
            ))
        })?;
        let mut env = req.env.clone();
        env.insert("DROVER_TASK_ID".into(), id.clone());
        env.insert("DROVER_TASK_NAME".into(), name.clone());
        env.insert("DROVER_TASK_DIR".into(), task_dir.display().to_string());
        let spec = TaskSpec {
            id: id.clone(),
            name: name.clone(),
            env,
            task_dir: task_dir.clone(),
            stdout_path: task_dir.join("logs").join("stdout"),
            stderr_path: task_dir.join("logs").join("stderr"),
            driver_config_json: config.to_string(),
            ..Default::default()
        };
        let entry = Arc::new(TaskEntry {
            view: Mutex::new(TaskView {
                id: id.clone(),
                name,
                driver: req.driver.clone(),
                state: TaskLifecycle::Pending,
                exit_code: None,
                signal: None,
                oom_killed: false,
                error: None,
                task_dir: task_dir.clone(),
                attributes: BTreeMap::new(),
                created_at: now(),
                started_at: None,
                finished_at: None,
                events: Vec::new(),
            }),
            handle: Mutex::new(None),
            kill_signal,
            kill_timeout,
            dead: watch::channel(false).0,
        });
        entry.event(
            "Received",
            format!("task received by driver {}", req.driver),
        );
        if let Ok(mut t) = self.tasks.write() {
            t.insert(id.clone(), entry.clone());
        }
        let handle = match plugin.client().start_task(spec).await {
            Ok(h) => h,
            Err(e) => {
                if let Ok(mut t) = self.tasks.write() {
                    t.remove(&id);
                }
                let _ = std::fs::remove_dir_all(&task_dir);
                return Err(e);
            }
        };
        if let Ok(mut h) = entry.handle.lock() {
            *h = Some(handle);
        }
        {
            let mut v = entry.view();
            v.state = TaskLifecycle::Running;
            v.started_at = Some(now());
        }
        if let Ok(status) = plugin.client().inspect_task(&id).await {
            entry.view().attributes = status.attributes;
        }
        entry.event("Started", "task started by driver");
        tokio::spawn(watch_task(entry.clone(), plugin));
        let view = entry.view().clone();
        Ok(view)
    }

    /// The task's current view.
    pub fn status(&self, id: &str) -> Result<TaskView, DriverError> {
        Ok(self.entry(id)?.view().clone())
    }

    /// Every task, newest first.
    pub fn list(&self) -> Vec<TaskView> {
        let mut all: Vec<TaskView> = self
            .tasks
            .read()
            .map(|t| t.values().map(|e| e.view().clone()).collect())
            .unwrap_or_default();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at));
        all
    }

    /// Block until the task is dead, then return its view.
    pub async fn wait(&self, id: &str) -> Result<TaskView, DriverError> {
        let entry = self.entry(id)?;
        let mut dead = entry.dead.subscribe();
        let _ = dead.wait_for(|d| *d).await;
        Ok(entry.view().clone())
    }

    /// Stop a task: its kill signal (or `signal`), then SIGKILL after its kill timeout
    /// (or `timeout`). Returns once it is dead.
    pub async fn stop(
        &self,
        id: &str,
        signal: Option<String>,
        timeout: Option<Duration>,
    ) -> Result<TaskView, DriverError> {
        let entry = self.entry(id)?;
        if entry.view().state == TaskLifecycle::Dead {
            return Ok(entry.view().clone());
        }
        let signal = signal.unwrap_or_else(|| entry.kill_signal.clone());
        drover_plugin_sdk::parse_signal(&signal)?;
        let timeout = timeout.unwrap_or(entry.kill_timeout);
        let driver = entry.view().driver.clone();
        let plugin = self.plugin(&driver)?;
        entry.event(
            "Killing",
            format!("sending {signal}, SIGKILL after {timeout:?}"),
        );
        plugin.client().stop_task(id, timeout, &signal).await?;
        let mut dead = entry.dead.subscribe();
        // The watcher records the exit result; it arrives right after StopTask returns.
        if tokio::time::timeout(Duration::from_secs(10), dead.wait_for(|d| *d))
            .await
            .is_err()
        {
            return Err(DriverError::Timeout(format!(
                "driver stopped task {id} but its exit was not reported within 10s"
            )));
        }
        entry.event("Killed", "task stopped");
        Ok(entry.view().clone())
    }

    /// Send a signal to a running task.
    pub async fn signal(&self, id: &str, signal: &str) -> Result<TaskView, DriverError> {
        let entry = self.entry(id)?;
        drover_plugin_sdk::parse_signal(signal)?;
        let driver = entry.view().driver.clone();
        self.plugin(&driver)?
            .client()
            .signal_task(id, signal)
            .await?;
        entry.event("Signaling", format!("sent {signal}"));
        Ok(entry.view().clone())
    }

    /// Forget a task; refuses a running one unless `force`.
    pub async fn destroy(&self, id: &str, force: bool) -> Result<(), DriverError> {
        let entry = self.entry(id)?;
        let (driver, running) = {
            let v = entry.view();
            (v.driver.clone(), v.state != TaskLifecycle::Dead)
        };
        if running && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {id} is still running; stop it first or destroy it with force"
            )));
        }
        if let Ok(plugin) = self.plugin(&driver) {
            match plugin.client().destroy_task(id, force).await {
                Ok(()) | Err(DriverError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if let Ok(mut t) = self.tasks.write() {
            t.remove(id);
        }
        let dir = entry.view().task_dir.clone();
        let _ = std::fs::remove_dir_all(dir);
        Ok(())
    }
}

fn create_task_dir(dir: &std::path::Path) -> std::io::Result<()> {
    for sub in ["local", "tmp", "logs", "secrets"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::set_permissions(dir.join("secrets"), std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// Wait for the task's exit through its driver. If the plugin dies meanwhile, wait for
/// the supervisor to relaunch it, hand the task back with `RecoverTask`, and go on
/// waiting: the task itself is never restarted.
async fn watch_task(entry: Arc<TaskEntry>, plugin: Arc<LoadedPlugin>) {
    let id = entry.view().id.clone();
    let mut generation = plugin.generation();
    loop {
        match plugin.client().wait_task(&id).await {
            Ok(result) => {
                entry.finish(&result);
                return;
            }
            Err(DriverError::Unavailable(why)) => {
                entry.event("DriverFailure", format!("driver became unavailable: {why}"));
                if generation.changed().await.is_err() {
                    return;
                }
                let handle = entry.handle.lock().ok().and_then(|h| h.clone());
                let Some(handle) = handle else { return };
                match plugin.client().recover_task(handle).await {
                    Ok(()) => entry.event("Recovered", "task recovered by the relaunched driver"),
                    Err(e) => {
                        entry.event("DriverFailure", format!("recovering the task failed: {e}"));
                        entry.finish(&ExitResult {
                            err: Some(format!("lost track of the task: {e}")),
                            ..Default::default()
                        });
                        return;
                    }
                }
            }
            Err(e) => {
                entry.event("DriverFailure", format!("waiting for the task failed: {e}"));
                entry.finish(&ExitResult {
                    err: Some(format!("waiting for the task failed: {e}")),
                    ..Default::default()
                });
                return;
            }
        }
    }
}
