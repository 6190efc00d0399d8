//! # drover-skeleton-driver
//!
//! The smallest complete Drover task driver, meant to be copied. Its tasks are
//! simulated: a task "runs" for `run_for_ms` milliseconds (or until stopped) and then
//! "exits" with `exit_code`. Replace the simulation with real work (a process, a
//! container, a VM) and keep the rest: the shapes of the trait methods, the task map,
//! the exit result published once and kept until destroy.
//!
//! Build it, drop the binary into the agent's `plugin_dir`, and:
//!
//! ```text
//! drover task run --driver skeleton --config '{"run_for_ms": 500, "exit_code": 3}'
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use drover_plugin_sdk::{
    Capabilities, DriverError, DriverPlugin, EmptyConfig, ExitResult, Fingerprint, PluginInfo,
    TaskHandle, TaskSpec, TaskState, TaskStatus, parse_signal,
};
use tokio::sync::watch;

/// The driver's name: what users write in `--driver`.
pub const NAME: &str = "skeleton";
/// Version of [`TaskState`]'s encoding in task handles. Bump it when the encoding
/// changes, and keep decoding old versions for tasks started by older plugins.
const HANDLE_VERSION: u32 = 1;

/// Task configuration. `deny_unknown_fields` makes the derived JSON Schema forbid
/// extra properties, so a user's typo is refused with the field's name.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkeletonTaskConfig {
    /// How long the task runs, in milliseconds. Absent: until stopped.
    #[serde(default)]
    pub run_for_ms: Option<u64>,
    /// The exit code it ends with when it runs out by itself.
    #[serde(default)]
    pub exit_code: i32,
}

/// What the driver needs to find a task again after a plugin restart. For a real
/// driver: a pid, a container id, a socket path.
#[derive(serde::Serialize, serde::Deserialize)]
struct HandleState {
    config: SkeletonTaskConfig,
    started_at: SystemTime,
}

/// One task: its identity and a channel on which its exit result is published once.
struct Task {
    name: String,
    started_at: SystemTime,
    exit: watch::Sender<Option<(ExitResult, SystemTime)>>,
}

impl Task {
    fn exit_result(&self) -> Option<(ExitResult, SystemTime)> {
        self.exit.borrow().clone()
    }

    /// Publish the exit result, unless the task already has one.
    fn finish(&self, result: ExitResult) {
        self.exit.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some((result, SystemTime::now()));
            true
        });
    }
}

/// The skeleton driver: a map of tasks. Calls arrive concurrently, so the map is
/// behind a lock that is never held across an `.await`.
#[derive(Default)]
pub struct SkeletonDriver {
    tasks: Mutex<HashMap<String, Arc<Task>>>,
}

impl SkeletonDriver {
    fn task(&self, id: &str) -> Result<Arc<Task>, DriverError> {
        self.tasks
            .lock()
            .map_err(DriverError::internal)?
            .get(id)
            .cloned()
            .ok_or_else(|| DriverError::NotFound(format!("task {id}")))
    }

    /// Track a task and start its simulated run.
    fn track(&self, spec: &TaskSpec, state: &HandleState) -> Result<(), DriverError> {
        let mut tasks = self.tasks.lock().map_err(DriverError::internal)?;
        if tasks.contains_key(&spec.id) {
            return Err(DriverError::AlreadyExists(format!("task {}", spec.id)));
        }
        let task = Arc::new(Task {
            name: spec.name.clone(),
            started_at: state.started_at,
            exit: watch::channel(None).0,
        });
        if let Some(ms) = state.config.run_for_ms {
            // The "work": finish after the configured time, counted from the original
            // start so that a recovered task ends when it would have.
            let elapsed = state.started_at.elapsed().unwrap_or_default();
            let left = Duration::from_millis(ms).saturating_sub(elapsed);
            let code = state.config.exit_code;
            let runner = task.clone();
            tokio::spawn(async move {
                tokio::time::sleep(left).await;
                runner.finish(ExitResult::code(code));
            });
        }
        tasks.insert(spec.id.clone(), task);
        Ok(())
    }
}

impl DriverPlugin for SkeletonDriver {
    type Config = EmptyConfig;
    type TaskConfig = SkeletonTaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(NAME, env!("CARGO_PKG_VERSION"))
    }

    fn capabilities(&self) -> Capabilities {
        // Tell the truth: the host trusts these flags.
        Capabilities {
            send_signals: true,
            recover: true,
            ..Default::default()
        }
    }

    async fn fingerprint(&self) -> Fingerprint {
        // A real driver checks its dependencies here (is docker reachable? is qemu
        // installed?) and says Undetected/Unhealthy with the reason when not.
        Fingerprint::healthy("ready")
            .attribute("driver.skeleton.version", env!("CARGO_PKG_VERSION"))
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: SkeletonTaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        let state = HandleState {
            config,
            started_at: SystemTime::now(),
        };
        self.track(&spec, &state)?;
        TaskHandle::new(spec, HANDLE_VERSION, &state)
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        let task = self.task(task_id)?;
        let mut exit = task.exit.subscribe();
        let result = exit
            .wait_for(Option::is_some)
            .await
            .map_err(|_| DriverError::Internal(format!("task {task_id} was dropped")))?;
        Ok(result.as_ref().map(|(r, _)| r.clone()).unwrap_or_default())
    }

    async fn stop_task(
        &self,
        task_id: &str,
        _timeout: Duration,
        signal: &str,
    ) -> Result<(), DriverError> {
        let task = self.task(task_id)?;
        // A simulated task dies of the first signal; a real one may need SIGKILL after
        // `timeout`.
        task.finish(ExitResult::signaled(parse_signal(signal)?));
        Ok(())
    }

    async fn signal_task(&self, task_id: &str, signal: &str) -> Result<(), DriverError> {
        let task = self.task(task_id)?;
        task.finish(ExitResult::signaled(parse_signal(signal)?));
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.task(task_id)?;
        if task.exit_result().is_none() {
            if !force {
                return Err(DriverError::FailedPrecondition(format!(
                    "task {task_id} is still running; stop it first or destroy it with force"
                )));
            }
            task.finish(ExitResult::signaled(9));
        }
        self.tasks
            .lock()
            .map_err(DriverError::internal)?
            .remove(task_id);
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        let task = self.task(task_id)?;
        let exit = task.exit_result();
        Ok(TaskStatus {
            id: task_id.to_owned(),
            name: task.name.clone(),
            state: if exit.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            started_at: Some(task.started_at),
            completed_at: exit.as_ref().map(|(_, at)| *at),
            exit_result: exit.map(|(r, _)| r),
            attributes: Default::default(),
        })
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if self.task(&handle.spec.id).is_ok() {
            return Ok(()); // already tracked: recovering twice is harmless
        }
        let state: HandleState = handle.decode_state(HANDLE_VERSION)?;
        self.track(&handle.spec, &state)
    }
}
