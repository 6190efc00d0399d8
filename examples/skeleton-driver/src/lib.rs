//! # drover-skeleton-driver
//!
//! The smallest complete Drover task driver, meant to be copied. Its tasks are
//! simulated: a task "runs" for `run_for_ms` milliseconds (or until stopped) and then
//! "exits" with `exit_code`. Replace the simulation with real work (a process, a
//! container, a VM) and keep the rest: the shapes of the trait methods, the task map
//! (the SDK's [`TaskStore`]) and the exit result published once and kept until destroy
//! (the SDK's [`ExitSlot`]).
//!
//! Build it, drop the binary into the agent's `plugin_dir`, and:
//!
//! ```text
//! drover task run --driver skeleton --config '{"run_for_ms": 500, "exit_code": 3}'
//! ```
//!
//! The crate also builds as a shared library (`libdrover_skeleton_driver.so`, from
//! `crate-type = ["rlib", "cdylib"]` and the [`drover_plugin_sdk::export_driver!`] line
//! at the end of this file) that an agent loads in process with
//! `[plugin.skeleton] in_process = true`: the same driver, no process of its own.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use drover_plugin_sdk::store::{ExitSlot, TaskStore};
use drover_plugin_sdk::{
    Capabilities, DriverError, DriverPlugin, EmptyConfig, ExitResult, Fingerprint, PluginInfo,
    Signal, TaskHandle, TaskSpec, TaskState, TaskStatus,
};

/// The driver's name: what users write in `--driver`.
pub const NAME: &str = "skeleton";
/// Version of [`HandleState`]'s encoding in task handles. Bump it when the encoding
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

/// One task. A real driver keeps its process, container or VM handle here too.
struct Task {
    name: String,
    started_at: SystemTime,
    /// How it ended, once it has: recorded once (the first end wins), kept until
    /// destroy, waited on by any number of `wait_task` calls.
    exit: ExitSlot,
}

/// The skeleton driver: its tasks by id. Calls arrive concurrently; the SDK's
/// [`TaskStore`] is safe to share and refuses a second task with an id in use.
#[derive(Default)]
pub struct SkeletonDriver {
    tasks: TaskStore<Task>,
}

impl SkeletonDriver {
    /// Track a task and start its simulated run.
    fn track(&self, spec: &TaskSpec, state: &HandleState) -> Result<(), DriverError> {
        // Reserve the id first: a real driver starts its work between `reserve` and
        // `commit`, and a concurrent start of the same id is refused meanwhile.
        let reservation = self.tasks.reserve(&spec.id)?;
        let task = Arc::new(Task {
            name: spec.name.clone(),
            started_at: state.started_at,
            exit: ExitSlot::default(),
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
                runner
                    .exit
                    .finish(ExitResult::code(code), SystemTime::now());
            });
        }
        reservation.commit(task);
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
        Capabilities::default()
            .with_send_signals(true)
            .with_recover(true)
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
        Ok(self.tasks.get(task_id)?.exit.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &str,
        _timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        let task = self.tasks.get(task_id)?;
        // A simulated task dies of the first signal; a real one may need SIGKILL after
        // `timeout`. Stopping a task that has ended changes nothing.
        task.exit
            .finish(ExitResult::signaled(signal), SystemTime::now());
        Ok(())
    }

    async fn signal_task(&self, task_id: &str, signal: Signal) -> Result<(), DriverError> {
        let task = self.tasks.get(task_id)?;
        task.exit
            .finish(ExitResult::signaled(signal), SystemTime::now());
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.tasks.get(task_id)?;
        if !task.exit.is_set() {
            if !force {
                return Err(DriverError::FailedPrecondition(format!(
                    "task {task_id} is still running; stop it first or destroy it with force"
                )));
            }
            task.exit
                .finish(ExitResult::signaled(Signal::KILL), SystemTime::now());
        }
        self.tasks.remove(task_id);
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        let task = self.tasks.get(task_id)?;
        let status = |state| {
            TaskStatus::new(task_id, state)
                .with_name(task.name.clone())
                .with_started_at(task.started_at)
        };
        Ok(match task.exit.get() {
            None => status(TaskState::Running),
            Some((result, at)) => status(TaskState::Exited)
                .with_exit_result(result)
                .with_completed_at(at),
        })
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if self.tasks.get(&handle.spec.id).is_ok() {
            return Ok(()); // already tracked: recovering twice is harmless
        }
        if handle.driver_state.is_empty() {
            // A probe by id: the host never got this task's StartTask reply. This
            // driver's tasks live in its own process, so an untracked one was never
            // started (or died with a previous process): NotFound tells the host to
            // start it; any other error would make the host give it up as lost.
            return Err(DriverError::NotFound(format!(
                "task {:?} is not running in this plugin",
                handle.spec.id
            )));
        }
        let state: HandleState = handle.decode_state(HANDLE_VERSION)?;
        self.track(&handle.spec, &state)
    }
}

// The entry point of the shared-library form: an agent loading this crate's `.so`
// starts a `SkeletonDriver::default()` through it.
drover_plugin_sdk::export_driver!(SkeletonDriver::default);
