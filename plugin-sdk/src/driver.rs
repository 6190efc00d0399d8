//! The [`DriverPlugin`] trait: what a task driver implements.

use std::future::Future;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::DriverError;
use crate::signal::Signal;
use crate::types::{
    AgentInfo, Capabilities, ExecOutput, ExecSession, ExitResult, Fingerprint, PluginInfo,
    TaskEvent, TaskHandle, TaskSpec, TaskStats, TaskStatus,
};

/// A task driver. Implement this, then call [`crate::serve`] from `main`.
///
/// The SDK does the protocol work around it: it validates task configs against
/// `TaskConfig` (unknown or misspelt fields are refused with the field's name, since
/// the derived schema forbids extra properties when the struct has
/// `#[serde(deny_unknown_fields)]`), checks task ids, streams fingerprints and stats,
/// maps [`DriverError`] to gRPC codes, and answers `UNIMPLEMENTED` for the optional
/// methods a driver leaves at their defaults.
///
/// Calls can arrive concurrently; keep per-task state behind a lock or a concurrent map.
/// [`crate::serve`] runs the driver on a single-threaded tokio runtime: never block in
/// a method (no `std::thread::sleep`, no blocking I/O on slow devices); use
/// `tokio::task::spawn_blocking` for work that must block.
///
/// # Example
///
/// ```no_run
/// use drover_plugin_sdk::*;
/// use std::time::Duration;
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// struct HelloConfig { greeting: String }
///
/// struct Hello;
///
/// impl DriverPlugin for Hello {
///     type Config = EmptyConfig;
///     type TaskConfig = HelloConfig;
///     fn info(&self) -> PluginInfo { PluginInfo::new("hello", "0.1.0") }
///     fn capabilities(&self) -> Capabilities { Capabilities::default() }
///     async fn fingerprint(&self) -> Fingerprint { Fingerprint::healthy("always ready") }
///     async fn start_task(&self, spec: TaskSpec, cfg: HelloConfig) -> Result<TaskHandle, DriverError> {
///         println!("{}", cfg.greeting);
///         TaskHandle::new(spec, 1, &())
///     }
///     async fn wait_task(&self, _id: &str) -> Result<ExitResult, DriverError> { Ok(ExitResult::code(0)) }
///     async fn stop_task(&self, _id: &str, _t: Duration, _sig: Signal) -> Result<(), DriverError> { Ok(()) }
///     async fn destroy_task(&self, _id: &str, _force: bool) -> Result<(), DriverError> { Ok(()) }
///     async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
///         Err(DriverError::NotFound(id.into()))
///     }
///     async fn recover_task(&self, _h: TaskHandle) -> Result<(), DriverError> { Ok(()) }
/// }
///
/// fn main() { drover_plugin_sdk::serve(Hello) }
/// ```
pub trait DriverPlugin: Send + Sync + 'static {
    /// Plugin-level configuration (`[plugin.NAME] config = {...}` in the agent config).
    /// Use [`crate::EmptyConfig`] when there is none.
    type Config: DeserializeOwned + JsonSchema + Send;
    /// Driver-specific task configuration. Derive `Deserialize` and `JsonSchema`, and
    /// add `#[serde(deny_unknown_fields)]` so typos are refused.
    type TaskConfig: DeserializeOwned + JsonSchema + Send;

    /// Name and version of the plugin. Called for `PluginInfo`.
    fn info(&self) -> PluginInfo;

    /// Plugin API versions implemented (semver). The default is the SDK's
    /// [`crate::version::PLUGIN_API_VERSION`]; override only to speak several.
    fn api_versions(&self) -> Vec<String> {
        vec![crate::version::PLUGIN_API_VERSION.to_owned()]
    }

    /// What the driver supports. Must be honest: the host trusts it.
    fn capabilities(&self) -> Capabilities;

    /// Receive the plugin configuration, once, before any task call. The default
    /// accepts it and does nothing.
    fn set_config(
        &self,
        config: Self::Config,
        agent: AgentInfo,
    ) -> impl Future<Output = Result<(), DriverError>> + Send {
        let _ = (config, agent);
        async { Ok(()) }
    }

    /// Current health and attributes. The SDK calls it when a `Fingerprint` stream
    /// opens and then every [`DriverPlugin::fingerprint_interval`], and sends a message
    /// when the answer changed (and at least every 30 s).
    fn fingerprint(&self) -> impl Future<Output = Fingerprint> + Send;

    /// How often to re-fingerprint. Default 10 s.
    fn fingerprint_interval(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// Start a task and return its handle. `config` has been validated already. An error
    /// must leave nothing running.
    fn start_task(
        &self,
        spec: TaskSpec,
        config: Self::TaskConfig,
    ) -> impl Future<Output = Result<TaskHandle, DriverError>> + Send;

    /// Wait for the task to exit and return its result. Must keep returning the same
    /// result after exit, until `destroy_task`.
    fn wait_task(
        &self,
        task_id: &str,
    ) -> impl Future<Output = Result<ExitResult, DriverError>> + Send;

    /// Send `signal`, then SIGKILL after `timeout`, to the whole task. Return once it
    /// has exited. (A host that names no signal sends [`Signal::TERM`]; a name that is
    /// no signal is refused by the SDK before the driver is called.)
    fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Forget the task. Refuse a running task with
    /// [`DriverError::FailedPrecondition`] unless `force`, which kills it first.
    fn destroy_task(
        &self,
        task_id: &str,
        force: bool,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Status of a task.
    fn inspect_task(
        &self,
        task_id: &str,
    ) -> impl Future<Output = Result<TaskStatus, DriverError>> + Send;

    /// Take the task over from a handle made by an earlier plugin process. Must not
    /// restart it.
    fn recover_task(
        &self,
        handle: TaskHandle,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Deliver `signal` to the task. Optional.
    fn signal_task(
        &self,
        task_id: &str,
        signal: Signal,
    ) -> impl Future<Output = Result<(), DriverError>> + Send {
        let _ = (task_id, signal);
        async { Err(DriverError::Unimplemented("SignalTask".into())) }
    }

    /// One resource usage sample. Optional; the SDK streams it at the requested interval.
    fn task_stats(
        &self,
        task_id: &str,
    ) -> impl Future<Output = Result<TaskStats, DriverError>> + Send {
        let _ = task_id;
        async { Err(DriverError::Unimplemented("TaskStats".into())) }
    }

    /// A feed of task events. Optional; `None` answers `UNIMPLEMENTED`.
    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        None
    }

    /// Run a command in the task's environment. Optional.
    fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, DriverError>> + Send {
        let _ = (task_id, command, timeout);
        async { Err(DriverError::Unimplemented("ExecTask".into())) }
    }

    /// Run a command inside the task's sandbox interactively (`drover alloc exec`,
    /// Nomad's `ExecTaskStreaming`): the same user, namespaces, cgroup, capabilities
    /// and seccomp filter as the task, so that it can never be used to leave them.
    /// Optional. See [`ExecSession`] for the stream; [`crate::exec`] has the relay of
    /// a local process or pseudo-terminal.
    fn exec_task_streaming(
        &self,
        task_id: &str,
        session: ExecSession,
    ) -> impl Future<Output = Result<ExitResult, DriverError>> + Send {
        let _ = (task_id, session);
        async { Err(DriverError::Unimplemented("ExecTaskStreaming".into())) }
    }

    /// Called once when the host asks the plugin to shut down, before the process exits.
    /// Tasks must keep running; release only what the process itself holds.
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A plugin configuration with no fields (and which refuses any).
///
/// ```
/// let c: drover_plugin_sdk::EmptyConfig = serde_json::from_str("{}").unwrap();
/// assert!(serde_json::from_str::<drover_plugin_sdk::EmptyConfig>(r#"{"x":1}"#).is_err());
/// # let _ = c;
/// ```
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyConfig {}
