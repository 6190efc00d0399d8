//! The driver calls the task manager makes, behind a trait: the catalog's plugins in
//! the agent, a scripted fake in tests (so the runner's restart, recovery and failure
//! paths are tested without plugin processes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drover_plugin_sdk::{
    DriverError, ExitResult, FsIsolation, NetworkModes, Signal, TaskEvent, TaskHandle, TaskSpec,
    TaskStats, TaskStatus,
};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;

use crate::plugins::catalog::{Catalog, LoadedPlugin};
use drover_api::PluginState;

/// One driver as the task manager sees it. Every call goes to the driver's current
/// process; a call in flight when that process dies fails with
/// [`DriverError::Unavailable`], or [`DriverError::Transport`] when the connection
/// broke before the death was noticed.
#[tonic::async_trait]
pub trait TaskDriver: Send + Sync {
    /// Health and why.
    fn state(&self) -> (PluginState, String);
    /// JSON Schema of the task config, compiled.
    fn task_schema(&self) -> crate::plugins::loader::Schema;
    /// Bumped each time the driver's process is replaced.
    fn generation(&self) -> watch::Receiver<u64>;
    /// Why the driver takes no new tasks (its plugin file was removed and it only
    /// serves the tasks it runs until they end); `None` while it takes them.
    fn retiring(&self) -> Option<String> {
        None
    }
    /// Whether the driver's instance of `generation` is on probation: it replaced the
    /// previous one in a hand-over that is still in progress, and a task it refuses
    /// makes the catalog roll the hand-over back (the previous instance still runs
    /// the task) rather than the task being lost.
    fn on_probation(&self, generation: u64) -> bool {
        let _ = generation;
        false
    }
    /// Whether a `RecoverTask` with a handle made from the task's spec alone (no handle
    /// the driver gave) finds a task the driver started: true for Drover's drivers,
    /// which find their tasks by id; Nomad's drivers need the handle they gave. Only
    /// then may the record that adds the handle after a start be deferred.
    fn finds_tasks_by_id(&self) -> bool {
        false
    }
    /// Where its tasks see their directories (its capabilities' filesystem
    /// isolation): the host's paths, or `/local`, `/secrets` and `/alloc` inside a
    /// chroot or image. Default: no isolation.
    fn fs_isolation(&self) -> FsIsolation {
        FsIsolation::None
    }
    /// The network modes its capabilities offer (default: none said, the host's).
    fn network_modes(&self) -> NetworkModes {
        NetworkModes::default().with_host(true)
    }
    /// `StartTask`.
    async fn start_task(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError>;
    /// `StartTask`, with the task's attributes if the driver sent them along (then no
    /// `InspectTask` is needed after the start). Default: [`TaskDriver::start_task`],
    /// no attributes.
    async fn start_task_reporting(
        &self,
        spec: TaskSpec,
    ) -> Result<(TaskHandle, Option<BTreeMap<String, String>>), DriverError> {
        self.start_task(spec).await.map(|h| (h, None))
    }
    /// `WaitTask`: until the task exits.
    async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError>;
    /// `StopTask`.
    async fn stop_task(
        &self,
        id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError>;
    /// `DestroyTask`.
    async fn destroy_task(&self, id: &str, force: bool) -> Result<(), DriverError>;
    /// `InspectTask`.
    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError>;
    /// `RecoverTask`.
    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError>;
    /// `SignalTask`.
    async fn signal_task(&self, id: &str, signal: Signal) -> Result<(), DriverError>;
    /// One `TaskStats` sample.
    async fn task_stats(&self, id: &str) -> Result<TaskStats, DriverError>;
    /// `ExecTask`: run a command inside the task (script checks). Default: the
    /// driver cannot.
    async fn exec_task(
        &self,
        id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<drover_plugin_sdk::ExecOutput, DriverError> {
        let _ = (id, command, timeout);
        Err(DriverError::Unimplemented("ExecTask".into()))
    }
    /// `ExecTaskStreaming`: run a command inside the task interactively (`alloc exec`).
    /// Default: the driver cannot.
    async fn exec_task_streaming(
        &self,
        id: &str,
        command: Vec<String>,
        tty: bool,
        inputs: tokio::sync::mpsc::Receiver<drover_plugin_sdk::ExecInput>,
    ) -> Result<ExecEventStream, DriverError> {
        let _ = (id, command, tty, inputs);
        Err(DriverError::Unimplemented("ExecTaskStreaming".into()))
    }
    /// `TaskEvents`: what the driver's current process says about its tasks, until
    /// that process goes away. Default: the driver has nothing to say.
    async fn task_events(&self) -> Result<TaskEventStream, DriverError> {
        Err(DriverError::Unimplemented("TaskEvents".into()))
    }
}

/// What an interactive exec writes, then how it ended.
pub type ExecEventStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<drover_plugin_sdk::ExecEvent, DriverError>> + Send>,
>;

/// A driver's stream of task events.
pub type TaskEventStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<TaskEvent, DriverError>> + Send>>;

/// Where the task manager finds drivers by name.
pub trait Drivers: Send + Sync {
    /// The driver serving `name`, if one is loaded (an older name of a driver, e.g.
    /// `rawexec`, finds the driver under its current name).
    fn driver(&self, name: &str) -> Option<Arc<dyn TaskDriver>>;
    /// The name of the driver [`Drivers::driver`] finds for `name`: what a new task
    /// records as its driver, so that it shows, and is handed over, under the name the
    /// driver has. `name` itself when no driver serves it.
    fn resolve_name(&self, name: &str) -> String {
        name.to_owned()
    }
    /// Names of the loaded drivers, for error messages.
    fn names(&self) -> Vec<String>;
}

impl Drivers for Catalog {
    fn driver(&self, name: &str) -> Option<Arc<dyn TaskDriver>> {
        self.driver_named(name).map(|p| p as Arc<dyn TaskDriver>)
    }
    fn resolve_name(&self, name: &str) -> String {
        self.driver_named(name)
            .map_or_else(|| name.to_owned(), |p| p.name.clone())
    }
    fn names(&self) -> Vec<String> {
        Catalog::names(self)
    }
}

#[tonic::async_trait]
impl TaskDriver for LoadedPlugin {
    fn state(&self) -> (PluginState, String) {
        LoadedPlugin::state(self)
    }
    fn task_schema(&self) -> crate::plugins::loader::Schema {
        LoadedPlugin::task_schema(self)
    }
    fn generation(&self) -> watch::Receiver<u64> {
        LoadedPlugin::generation(self)
    }
    fn retiring(&self) -> Option<String> {
        LoadedPlugin::retiring(self)
    }
    fn on_probation(&self, generation: u64) -> bool {
        LoadedPlugin::on_probation(self, generation)
    }
    fn fs_isolation(&self) -> FsIsolation {
        self.capabilities().fs_isolation
    }
    fn finds_tasks_by_id(&self) -> bool {
        self.speaks_drover()
    }
    fn network_modes(&self) -> NetworkModes {
        self.capabilities().network_modes
    }
    async fn start_task(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError> {
        self.after_handover().await;
        self.client().start_task(spec).await
    }
    async fn start_task_reporting(
        &self,
        spec: TaskSpec,
    ) -> Result<(TaskHandle, Option<BTreeMap<String, String>>), DriverError> {
        self.after_handover().await;
        self.client().start_task_reporting(spec).await
    }
    async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError> {
        self.client().wait_task(id).await
    }
    async fn stop_task(
        &self,
        id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        self.client().stop_task(id, timeout, signal).await
    }
    async fn destroy_task(&self, id: &str, force: bool) -> Result<(), DriverError> {
        self.client().destroy_task(id, force).await
    }
    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
        self.client().inspect_task(id).await
    }
    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        self.client().recover_task(handle).await
    }
    async fn signal_task(&self, id: &str, signal: Signal) -> Result<(), DriverError> {
        self.client().signal_task(id, signal).await
    }
    async fn task_stats(&self, id: &str) -> Result<TaskStats, DriverError> {
        let stream = self.client().task_stats(id, Duration::from_secs(1)).await?;
        let mut stream = Box::pin(stream);
        match stream.next().await {
            Some(sample) => sample,
            None => Err(DriverError::Internal(format!(
                "TaskStats for task {id} ended without a sample"
            ))),
        }
    }
    async fn task_events(&self) -> Result<TaskEventStream, DriverError> {
        Ok(Box::pin(self.client().task_events().await?))
    }
    async fn exec_task(
        &self,
        id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<drover_plugin_sdk::ExecOutput, DriverError> {
        self.client().exec_task(id, command, timeout).await
    }
    async fn exec_task_streaming(
        &self,
        id: &str,
        command: Vec<String>,
        tty: bool,
        inputs: tokio::sync::mpsc::Receiver<drover_plugin_sdk::ExecInput>,
    ) -> Result<ExecEventStream, DriverError> {
        self.client()
            .exec_task_streaming(id, command, tty, inputs)
            .await
    }
}
