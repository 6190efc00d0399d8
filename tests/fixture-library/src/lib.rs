//! # drover-fixture-library
//!
//! A test-only driver built as a library for the agent to load in process
//! (`fixture-library.so` with `[plugin.fixture-library] in_process = true`). Its tasks
//! are simulated, as the skeleton's: they run until stopped. A task whose config
//! carries `panic_in_start` makes `StartTask` panic with that message, inside the
//! agent: the end-to-end tests check that the panic stays inside the library (the call
//! fails with an error that says so) and that the agent and this driver keep serving.

use std::time::{Duration, SystemTime};

use drover_plugin_sdk::store::{ExitSlot, TaskStore};
use drover_plugin_sdk::{
    Capabilities, DriverError, DriverPlugin, EmptyConfig, ExitResult, Fingerprint, PluginInfo,
    Signal, TaskHandle, TaskSpec, TaskState, TaskStatus,
};

/// The driver's name, and the library's file name without `.so`.
pub const NAME: &str = "fixture-library";

/// Task configuration.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixtureTaskConfig {
    /// Panic in `StartTask` with this message.
    #[serde(default)]
    pub panic_in_start: Option<String>,
}

/// The driver: simulated tasks by id.
#[derive(Default)]
pub struct FixtureLibraryDriver {
    tasks: TaskStore<ExitSlot>,
}

impl FixtureLibraryDriver {
    /// A fresh driver (the library's constructor: it runs at every start).
    pub fn new() -> Self {
        FixtureLibraryDriver::default()
    }
}

drover_plugin_sdk::export_driver!(FixtureLibraryDriver::new);

impl DriverPlugin for FixtureLibraryDriver {
    type Config = EmptyConfig;
    type TaskConfig = FixtureTaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(NAME, env!("CARGO_PKG_VERSION"))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_send_signals(true)
    }

    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint::healthy("ready")
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: FixtureTaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        if let Some(message) = &config.panic_in_start {
            panic!("{message}");
        }
        let reservation = self.tasks.reserve(&spec.id)?;
        reservation.commit(std::sync::Arc::new(ExitSlot::default()));
        TaskHandle::new(spec, 1, &config)
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        Ok(self.tasks.get(task_id)?.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &str,
        _timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        self.signal_task(task_id, signal).await
    }

    async fn signal_task(&self, task_id: &str, signal: Signal) -> Result<(), DriverError> {
        self.tasks
            .get(task_id)?
            .finish(ExitResult::signaled(signal), SystemTime::now());
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let exit = self.tasks.get(task_id)?;
        if !exit.is_set() && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} is still running; stop it first or destroy it with force"
            )));
        }
        exit.finish(ExitResult::signaled(Signal::KILL), SystemTime::now());
        self.tasks.remove(task_id);
        Ok(())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if self.tasks.knows(&handle.spec.id) {
            return Ok(());
        }
        if handle.driver_state.is_empty() {
            // A probe by id: this driver's tasks live only in its runtime.
            return Err(DriverError::NotFound(format!(
                "task {:?} is not running in this plugin",
                handle.spec.id
            )));
        }
        // A simulated task runs until stopped: it runs again under the new runtime.
        let reservation = self.tasks.reserve(&handle.spec.id)?;
        reservation.commit(std::sync::Arc::new(ExitSlot::default()));
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        let exit = self.tasks.get(task_id)?;
        Ok(match exit.get() {
            None => TaskStatus::new(task_id, TaskState::Running),
            Some((result, at)) => TaskStatus::new(task_id, TaskState::Exited)
                .with_exit_result(result)
                .with_completed_at(at),
        })
    }
}
