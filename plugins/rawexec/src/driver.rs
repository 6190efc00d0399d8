//! The rawexec driver: the [`DriverPlugin`] impl.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use drover_plugin_sdk::{
    Capabilities, DriverError, DriverPlugin, ExecOutput, ExitResult, Fingerprint, FsIsolation,
    PluginInfo, TaskEvent, TaskHandle, TaskSpec, TaskStats, TaskStatus, parse_signal,
};
use tokio::sync::broadcast;

use crate::config::{Launch, PluginConfig, TaskConfig, open_output};
use crate::handle::{HandleState, Task, watch_adopted};
use crate::procfs;
use crate::store::Store;

/// The driver's name.
pub const PLUGIN_NAME: &str = "rawexec";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the task handle's driver state.
pub const HANDLE_VERSION: u32 = 1;
/// `PATH` given to tasks whose environment does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const SIGKILL: i32 = 9;
/// How long a SIGKILLed task may take to be reaped before the call reports it. Only a
/// process stuck in uninterruptible sleep (D state) takes longer.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// Wait for a task that was sent SIGKILL, bounded by [`KILL_GRACE`].
async fn wait_killed(task: &Task) -> Result<(), DriverError> {
    tokio::time::timeout(KILL_GRACE, task.wait())
        .await
        .map(drop)
        .map_err(|_| {
            DriverError::Timeout(format!(
                "task {} (pid {}) did not exit within {KILL_GRACE:?} of SIGKILL; it may be stuck \
             in uninterruptible sleep",
                task.id, task.state.pid
            ))
        })
}

/// `SIGTERM` for 15; the number itself for a signal nix does not know.
fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map_or_else(|_| sig.to_string(), |s| s.as_str().to_owned())
}

/// Runs tasks as plain host processes, each the leader of its own process group.
pub struct RawExecDriver {
    store: Store,
    events: broadcast::Sender<TaskEvent>,
}

impl Default for RawExecDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl RawExecDriver {
    /// A driver with no tasks.
    pub fn new() -> Self {
        RawExecDriver {
            store: Store::default(),
            events: broadcast::channel(256).0,
        }
    }

    fn event(&self, task_id: &str, message: String) {
        tracing::info!(task = task_id, "{message}");
        // No subscriber is fine: events are best-effort notifications.
        let _ = self.events.send(TaskEvent {
            task_id: task_id.to_owned(),
            timestamp: SystemTime::now(),
            message,
            annotations: BTreeMap::new(),
        });
    }

    /// Publish the exit of `task` when `result` resolves.
    fn on_exit(
        &self,
        task: Arc<Task>,
        result: impl std::future::Future<Output = ExitResult> + Send + 'static,
    ) {
        let events = self.events.clone();
        tokio::spawn(async move {
            let result = result.await;
            let message = match (result.signal, &result.err) {
                (_, Some(e)) => format!("task exited: {e}"),
                (0, None) => format!("task exited: code {}", result.exit_code),
                (sig, None) => format!("task exited: signal {sig}"),
            };
            if task.finish(result) {
                tracing::info!(task = %task.id, "{message}");
                let _ = events.send(TaskEvent {
                    task_id: task.id.clone(),
                    timestamp: SystemTime::now(),
                    message,
                    annotations: BTreeMap::new(),
                });
            }
        });
    }
}

impl DriverPlugin for RawExecDriver {
    type Config = PluginConfig;
    type TaskConfig = TaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(PLUGIN_NAME, PLUGIN_VERSION)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            send_signals: true,
            exec: true,
            fs_isolation: FsIsolation::None,
            task_stats: true,
            task_events: true,
            // Tasks keep running when the plugin dies, but their exit status is only
            // exact once the per-task executor exists.
            recover: false,
        }
    }

    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint::healthy("ready").attribute("driver.rawexec.version", PLUGIN_VERSION)
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        config.validate()?;
        if !spec.user.is_empty() {
            // Refuse rather than silently run as the plugin's user.
            return Err(DriverError::InvalidConfig(format!(
                "rawexec runs tasks as the plugin's own user; user {:?} is not supported",
                spec.user
            )));
        }
        let reservation = self.store.reserve(&spec.id)?;
        let launch = Launch::new(&spec, Some(&config));
        let mut cmd = launch.command(&config.command, &config.args);
        match open_output("stdout", &spec.stdout_path)? {
            Some(f) => cmd.stdout(f),
            None => cmd.stdout(std::process::Stdio::null()),
        };
        match open_output("stderr", &spec.stderr_path)? {
            Some(f) => cmd.stderr(f),
            None => cmd.stderr(std::process::Stdio::null()),
        };
        let mut child = cmd.spawn().map_err(|e| {
            DriverError::InvalidConfig(format!(
                "cannot start command {:?} in {}: {e}",
                config.command,
                launch.cwd.display()
            ))
        })?;
        let pid = child
            .id()
            .ok_or_else(|| DriverError::Internal("started process has no pid".into()))?;
        let state = HandleState {
            pid,
            pgid: pid,
            start_time: procfs::read_stat(pid).map(|s| s.start_time).unwrap_or(0),
        };
        let task = Arc::new(Task::new(
            spec.id.clone(),
            spec.name.clone(),
            state,
            SystemTime::now(),
            launch,
        ));
        reservation.commit(task.clone());
        self.on_exit(task.clone(), async move {
            match child.wait().await {
                Ok(status) => ExitResult::from_status(status),
                Err(e) => ExitResult {
                    err: Some(format!("waiting for the process failed: {e}")),
                    ..Default::default()
                },
            }
        });
        self.event(&spec.id, format!("task started (pid {pid})"));
        TaskHandle::new(spec, HANDLE_VERSION, &state)
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        Ok(self.store.get(task_id)?.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        signal: &str,
    ) -> Result<(), DriverError> {
        let sig = parse_signal(signal)?;
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Ok(());
        }
        task.signal_group(sig)?;
        self.event(task_id, format!("sent {}", signal_name(sig)));
        if tokio::time::timeout(timeout, task.wait()).await.is_err() {
            task.signal_group(SIGKILL)?;
            self.event(
                task_id,
                format!("sent SIGKILL: still running after {timeout:?}"),
            );
            wait_killed(&task).await?;
        }
        // Leftovers of the group (children that ignored the signal) go too.
        let _ = task.signal_group(SIGKILL);
        Ok(())
    }

    async fn signal_task(&self, task_id: &str, signal: &str) -> Result<(), DriverError> {
        let sig = parse_signal(signal)?;
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} has exited"
            )));
        }
        task.signal_group(sig)?;
        self.event(task_id, format!("sent {}", signal_name(sig)));
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if task.running() {
            if !force {
                return Err(DriverError::FailedPrecondition(format!(
                    "task {task_id} is still running; stop it first or destroy it with force"
                )));
            }
            task.signal_group(SIGKILL)?;
            wait_killed(&task).await?;
        }
        self.store.remove(task_id);
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        Ok(self.store.get(task_id)?.status())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if self.store.get(&handle.spec.id).is_ok() {
            return Ok(());
        }
        let state: HandleState = handle.decode_state(HANDLE_VERSION)?;
        let reservation = self.store.reserve(&handle.spec.id)?;
        let config: Option<TaskConfig> = serde_json::from_str(&handle.spec.driver_config_json).ok();
        let launch = Launch::new(&handle.spec, config.as_ref());
        let started_at = procfs::start_wall_time(state.start_time).unwrap_or_else(SystemTime::now);
        let task = Arc::new(Task::new(
            handle.spec.id.clone(),
            handle.spec.name.clone(),
            state,
            started_at,
            launch,
        ));
        reservation.commit(task.clone());
        let alive = procfs::read_stat(state.pid)
            .is_ok_and(|s| s.start_time == state.start_time && s.state != 'Z');
        if alive {
            self.on_exit(task, watch_adopted(state.pid));
            self.event(
                &handle.spec.id,
                format!("task recovered (pid {})", state.pid),
            );
        } else {
            task.finish(ExitResult {
                err: Some(
                    "exit status unavailable: the task exited while no plugin process watched it"
                        .into(),
                ),
                ..Default::default()
            });
            self.event(&handle.spec.id, "task had exited before recovery".into());
        }
        Ok(())
    }

    async fn task_stats(&self, task_id: &str) -> Result<TaskStats, DriverError> {
        self.store.get(task_id)?.stats()
    }

    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        Some(self.events.subscribe())
    }

    async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let task = self.store.get(task_id)?;
        let (program, args) = command
            .split_first()
            .ok_or_else(|| DriverError::InvalidConfig("exec needs a command".into()))?;
        let mut cmd = task.launch.command(program, args);
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Unlike the task, an exec'd command dies with its call (e.g. on timeout).
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| DriverError::InvalidConfig(format!("cannot start {program:?}: {e}")))?;
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(out)) => Ok(ExecOutput {
                stdout: out.stdout,
                stderr: out.stderr,
                result: ExitResult::from_status(out.status),
            }),
            Ok(Err(e)) => Err(DriverError::Internal(format!("running {program:?}: {e}"))),
            Err(_) => Ok(ExecOutput {
                result: ExitResult {
                    signal: SIGKILL,
                    err: Some(format!("timed out after {timeout:?}")),
                    ..Default::default()
                },
                ..Default::default()
            }),
        }
    }
}
