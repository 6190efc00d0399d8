//! The host side: launch a plugin binary, check its handshake, connect, call it, and
//! shut it down. Used by the Drover agent, the benchmarks and plugin tests.
//!
//! - `process.rs`: [`PluginProcess`] — launch a binary and check its handshake, its
//!   liveness, shutdown; [`LaunchOptions`], [`LaunchError`];
//! - `reattach.rs`: take over a plugin an earlier host launched ([`ReattachConfig`],
//!   [`PluginProcess::reattach`]);
//! - `reattach_tls.rs`: the AutoMTLS material kept for a launched plugin ([`ReattachTls`]);
//! - `inproc.rs`: load a driver library into this process ([`InProcessPlugin`]);
//! - this module: [`PluginClient`], the typed RPCs, and what a plugin says it is.

mod dead_socket;
mod inproc;
mod nomad;
mod process;
mod reattach;
mod reattach_tls;

pub use inproc::{InProcessLibrary, InProcessOptions, InProcessPlugin, LoadError, sealed_copy};
pub use nomad::{NOMAD_DRIVER_API_REQ, NomadHostOptions};

pub use process::{
    HostEnv, LaunchError, LaunchOptions, PluginProcess, SHUTDOWN_GRACE,
    set_plugin_nofile_soft_limit,
};
pub use reattach::{ReattachConfig, ReattachError, process_start_time};
pub use reattach_tls::ReattachTls;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drover_proto::v1 as pb;
use pb::base_plugin_client::BasePluginClient;
use pb::driver_client::DriverClient;
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::Channel;

use crate::DriverError;
use crate::signal::Signal;
use crate::types::{
    AgentInfo, Capabilities, ExecChunk, ExecEvent, ExecInput, ExecOutput, ExitResult, Fingerprint,
    TaskEvent, TaskHandle, TaskSpec, TaskStats, TaskStatus, to_duration,
};

use process::Exit;

/// What a plugin says about itself (`PluginInfo`): who it is and which plugin API
/// versions it speaks.
///
/// ```
/// use drover_plugin_sdk::client::{PluginIdentity, PluginKind, PluginProtocol};
/// let id = PluginIdentity::new("rawexec", "0.1.0", vec!["1.0.0".into()]);
/// assert_eq!(id.kind, PluginKind::Driver);
/// assert_eq!(id.protocol, PluginProtocol::Drover);
/// assert_eq!(id.info().name, "rawexec");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginIdentity {
    /// Its name, lowercase `[a-z0-9_-]` when it follows the rules.
    pub name: String,
    /// Semver of the plugin binary.
    pub version: String,
    /// Plugin API versions it implements (semver).
    pub api_versions: Vec<String>,
    /// What kind of plugin it is.
    pub kind: PluginKind,
    /// Which driver protocol it speaks.
    pub protocol: PluginProtocol,
}

/// The driver protocol a plugin speaks, which its handshake's app protocol version
/// tells: Drover's own (`drover.plugin.v1`, app protocol 1) or Nomad's
/// (`hashicorp.nomad.plugins.*`, app protocol 2). A host talks to both through the same
/// [`PluginClient`].
///
/// ```
/// use drover_plugin_sdk::client::PluginProtocol;
/// assert_eq!(PluginProtocol::from_app_protocol(2), PluginProtocol::Nomad);
/// assert_eq!(PluginProtocol::Nomad.to_string(), "nomad");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginProtocol {
    /// Drover's driver protocol.
    #[default]
    Drover,
    /// Nomad's driver protocol.
    Nomad,
}

impl PluginProtocol {
    /// The protocol of a handshake's app protocol version.
    pub fn from_app_protocol(version: u32) -> Self {
        if version == crate::handshake::NOMAD_APP_PROTOCOL_VERSION {
            PluginProtocol::Nomad
        } else {
            PluginProtocol::Drover
        }
    }

    /// Its name, as `plugin status` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginProtocol::Drover => "drover",
            PluginProtocol::Nomad => "nomad",
        }
    }
}

impl std::fmt::Display for PluginProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PluginIdentity {
    /// A driver plugin `name` at `version`, speaking `api_versions`.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        api_versions: Vec<String>,
    ) -> Self {
        PluginIdentity {
            name: name.into(),
            version: version.into(),
            api_versions,
            kind: PluginKind::Driver,
            protocol: PluginProtocol::Drover,
        }
    }

    /// Name and version, as the driver's own [`crate::DriverPlugin::info`] says them.
    pub fn info(&self) -> crate::PluginInfo {
        crate::PluginInfo::new(self.name.clone(), self.version.clone())
    }
}

/// The kind of a plugin (the protocol's `PluginType`).
///
/// ```
/// let k = drover_plugin_sdk::client::PluginKind::Other(7);
/// assert_eq!(k.to_string(), "7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginKind {
    /// A task driver.
    Driver,
    /// A device plugin (Nomad's base type `device`).
    Device,
    /// A type this host does not know (or none): its number on the wire.
    Other(i32),
}

impl PluginKind {
    fn from_wire(n: i32) -> Self {
        match pb::PluginType::try_from(n) {
            Ok(pb::PluginType::Driver) => PluginKind::Driver,
            _ => PluginKind::Other(n),
        }
    }
}

impl std::fmt::Display for PluginKind {
    /// The wire number, which is what hosts have always printed for it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginKind::Driver => write!(f, "{}", pb::PluginType::Driver as i32),
            PluginKind::Device => f.write_str("device"),
            PluginKind::Other(n) => write!(f, "{n}"),
        }
    }
}

/// A stream of a plugin's answers (fingerprints, stats, events), whatever protocol it
/// speaks.
pub type BoxStream<T> =
    std::pin::Pin<Box<dyn Stream<Item = Result<T, DriverError>> + Send + 'static>>;

/// Typed calls to one plugin. Every call fails fast with
/// [`DriverError::Unavailable`] once the plugin process has exited, instead of hanging.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
/// use std::time::Duration;
/// let plugin = PluginProcess::launch(LaunchOptions::new("rawexec", "./drover-driver-rawexec")).await?;
/// // The first RPC proves the plugin serves; bound it (it may never answer).
/// let info = tokio::time::timeout(Duration::from_secs(5), plugin.client().plugin_info()).await??;
/// println!("{} {} speaks {:?}", info.name, info.version, info.api_versions);
/// plugin.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PluginClient {
    name: String,
    channel: Channel,
    exit: watch::Receiver<Option<Exit>>,
    /// Set for a plugin that speaks Nomad's protocol: every typed call goes through it.
    nomad: Option<Arc<nomad::NomadBridge>>,
}

impl PluginClient {
    fn base(&self) -> BasePluginClient<Channel> {
        BasePluginClient::new(self.channel.clone())
            .max_decoding_message_size(crate::server::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE_SIZE)
    }

    fn driver(&self) -> DriverClient<Channel> {
        DriverClient::new(self.channel.clone())
            .max_decoding_message_size(crate::server::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE_SIZE)
    }

    /// Run one RPC, failing as soon as the plugin process exits.
    async fn guard<T>(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, DriverError> {
        self.guard_call(async {
            call.await
                .map(tonic::Response::into_inner)
                .map_err(DriverError::from)
        })
        .await
    }

    /// Run one call (an RPC, or a Nomad plugin's calls through the bridge), failing as
    /// soon as the plugin process exits.
    async fn guard_call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, DriverError>>,
    ) -> Result<T, DriverError> {
        let mut exit = self.exit.clone();
        let exited = |e: Option<&Exit>| {
            DriverError::Unavailable(match e {
                Some(e) => format!("plugin {} exited ({})", self.name, e.outcome),
                None => format!("plugin {} exited (watcher gone)", self.name),
            })
        };
        if let Some(e) = exit.borrow().as_ref() {
            return Err(exited(Some(e)));
        }
        tokio::select! {
            r = call => r,
            e = exit.wait_for(Option::is_some) => Err(exited(e.ok().as_deref().and_then(Option::as_ref))),
        }
    }

    /// Which driver protocol the plugin speaks.
    pub fn protocol(&self) -> PluginProtocol {
        if self.nomad.is_some() {
            PluginProtocol::Nomad
        } else {
            PluginProtocol::Drover
        }
    }

    /// go-plugin's `Ping`: whether the plugin's health service says service `plugin`
    /// is `SERVING`. A launch makes no RPC of its own (see [`PluginProcess::launch`]);
    /// this is the check for a host that wants liveness proven without a driver call.
    /// Bound it with a timeout: a plugin may accept a connection and never answer.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
    /// let plugin = PluginProcess::launch(LaunchOptions::new("rawexec", "./drover-driver-rawexec")).await?;
    /// match tokio::time::timeout(Duration::from_secs(5), plugin.client().ping()).await {
    ///     Ok(Ok(())) => println!("serving"),
    ///     Ok(Err(e)) => println!("not serving: {e}"),
    ///     Err(_) => println!("no answer within 5 s"),
    /// }
    /// plugin.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn ping(&self) -> Result<(), DriverError> {
        self.guard_call(async {
            process::check_health(self.channel.clone())
                .await
                .map_err(|e| DriverError::Unavailable(format!("plugin {}: {e}", self.name)))
        })
        .await
    }

    /// `PluginInfo`: identity plus the plugin API versions it offers.
    pub async fn plugin_info(&self) -> Result<PluginIdentity, DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.plugin_info()).await;
        }
        let r = self
            .guard(self.base().plugin_info(pb::PluginInfoRequest {}))
            .await?;
        Ok(PluginIdentity {
            name: r.name,
            version: r.plugin_version,
            api_versions: r.plugin_api_versions,
            kind: PluginKind::from_wire(r.r#type),
            protocol: PluginProtocol::Drover,
        })
    }

    /// The generated gRPC client of the `Driver` service on this plugin's connection,
    /// for what the typed calls cannot express: tests that send a driver malformed
    /// requests (an unknown signal name, say) to check what it answers. Its calls do
    /// not fail fast when the plugin exits; map a failed call's status with
    /// [`DriverError::from`].
    pub fn raw_driver(&self) -> DriverClient<Channel> {
        self.driver()
    }

    /// `ConfigSchema`: JSON Schema of the plugin configuration.
    pub async fn config_schema(&self) -> Result<String, DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.config_schema()).await;
        }
        Ok(self
            .guard(self.base().config_schema(pb::ConfigSchemaRequest {}))
            .await?
            .json_schema)
    }

    /// `SetConfig`.
    pub async fn set_config(
        &self,
        config_json: String,
        agent: &AgentInfo,
    ) -> Result<(), DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.set_config(&config_json, agent)).await;
        }
        self.guard(self.base().set_config(pb::SetConfigRequest {
            config_json,
            plugin_api_version: agent.api_version.clone(),
            agent_config: Some(pb::AgentConfig {
                alloc_dir: agent.alloc_dir.display().to_string(),
                plugin_state_dir: agent.plugin_state_dir.display().to_string(),
            }),
        }))
        .await
        .map(drop)
    }

    /// `TaskConfigSchema`: JSON Schema of the driver's task config.
    pub async fn task_config_schema(&self) -> Result<String, DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.task_config_schema()).await;
        }
        Ok(self
            .guard(
                self.driver()
                    .task_config_schema(pb::TaskConfigSchemaRequest {}),
            )
            .await?
            .json_schema)
    }

    /// `Capabilities`.
    pub async fn capabilities(&self) -> Result<Capabilities, DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.capabilities()).await;
        }
        Ok(self
            .guard(self.driver().capabilities(pb::CapabilitiesRequest {}))
            .await?
            .capabilities
            .unwrap_or_default()
            .into())
    }

    /// `Fingerprint`: a stream of fingerprints; the first arrives at once.
    pub async fn fingerprint(&self) -> Result<BoxStream<Fingerprint>, DriverError> {
        if let Some(b) = &self.nomad {
            let s = self.guard_call(b.fingerprint()).await?;
            return Ok(Box::pin(s));
        }
        let s = self
            .guard(self.driver().fingerprint(pb::FingerprintRequest {}))
            .await?;
        Ok(Box::pin(s.map(|r| {
            r.map(Fingerprint::from).map_err(DriverError::from)
        })))
    }

    /// A device plugin's `Fingerprint`: a stream of its device groups (all of them in
    /// each message); the first arrives at once. Nomad's device plugins only.
    pub async fn device_fingerprint(
        &self,
    ) -> Result<BoxStream<Vec<crate::device::DeviceGroup>>, DriverError> {
        let Some(b) = &self.nomad else {
            return Err(DriverError::Unimplemented(
                "device plugins speak Nomad's device protocol only".into(),
            ));
        };
        let s = self.guard_call(b.device_fingerprint()).await?;
        Ok(Box::pin(s))
    }

    /// A device plugin's `Reserve`: what a task given these instances needs.
    pub async fn reserve_devices(
        &self,
        device_ids: Vec<String>,
    ) -> Result<crate::device::Reservation, DriverError> {
        let Some(b) = &self.nomad else {
            return Err(DriverError::Unimplemented(
                "device plugins speak Nomad's device protocol only".into(),
            ));
        };
        self.guard_call(b.reserve_devices(device_ids)).await
    }

    /// `StartTask`.
    pub async fn start_task(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError> {
        self.start_task_reporting(spec)
            .await
            .map(|(handle, _)| handle)
    }

    /// `StartTask`, with the task's attributes when the plugin sends them along (a
    /// Drover plugin does; `None` from a Nomad plugin or one that said nothing, which
    /// [`PluginClient::inspect_task`] then asks).
    pub async fn start_task_reporting(
        &self,
        spec: TaskSpec,
    ) -> Result<(TaskHandle, Option<BTreeMap<String, String>>), DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.start_task(spec)).await.map(|h| (h, None));
        }
        let r = self
            .guard(self.driver().start_task(pb::StartTaskRequest {
                task: Some(spec.into()),
            }))
            .await?;
        let attributes = (!r.attributes.is_empty()).then(|| r.attributes.into_iter().collect());
        let handle = r
            .handle
            .map(TaskHandle::from)
            .ok_or_else(|| DriverError::Internal("StartTask answered without a handle".into()))?;
        Ok((handle, attributes))
    }

    /// `WaitTask`: blocks until the task exits.
    pub async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.wait_task(task_id)).await;
        }
        let r = self
            .guard(self.driver().wait_task(pb::WaitTaskRequest {
                task_id: task_id.into(),
            }))
            .await?;
        Ok(r.result.map(ExitResult::from).unwrap_or_default())
    }

    /// `StopTask`.
    pub async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.stop_task(task_id, timeout, signal)).await;
        }
        self.guard(self.driver().stop_task(pb::StopTaskRequest {
            task_id: task_id.into(),
            timeout: Some(to_duration(timeout)),
            signal: signal.to_string(),
        }))
        .await
        .map(drop)
    }

    /// `DestroyTask`.
    pub async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.destroy_task(task_id, force)).await;
        }
        self.guard(self.driver().destroy_task(pb::DestroyTaskRequest {
            task_id: task_id.into(),
            force,
        }))
        .await
        .map(drop)
    }

    /// `InspectTask`.
    pub async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.inspect_task(task_id)).await;
        }
        let r = self
            .guard(self.driver().inspect_task(pb::InspectTaskRequest {
                task_id: task_id.into(),
            }))
            .await?;
        r.task
            .map(TaskStatus::from)
            .ok_or_else(|| DriverError::Internal("InspectTask answered without a status".into()))
    }

    /// `RecoverTask`.
    pub async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.recover_task(handle)).await;
        }
        self.guard(self.driver().recover_task(pb::RecoverTaskRequest {
            task_id: handle.spec.id.clone(),
            handle: Some(handle.into()),
        }))
        .await
        .map(drop)
    }

    /// `SignalTask`.
    pub async fn signal_task(&self, task_id: &str, signal: Signal) -> Result<(), DriverError> {
        if let Some(b) = &self.nomad {
            return self.guard_call(b.signal_task(task_id, signal)).await;
        }
        self.guard(self.driver().signal_task(pb::SignalTaskRequest {
            task_id: task_id.into(),
            signal: signal.to_string(),
        }))
        .await
        .map(drop)
    }

    /// `TaskStats`: a sample every `interval`.
    pub async fn task_stats(
        &self,
        task_id: &str,
        interval: Duration,
    ) -> Result<BoxStream<TaskStats>, DriverError> {
        if let Some(b) = &self.nomad {
            let s = self.guard_call(b.task_stats(task_id, interval)).await?;
            return Ok(Box::pin(s));
        }
        let s = self
            .guard(self.driver().task_stats(pb::TaskStatsRequest {
                task_id: task_id.into(),
                interval: Some(to_duration(interval)),
            }))
            .await?;
        Ok(Box::pin(s.map(|r| {
            r.map(TaskStats::from).map_err(DriverError::from)
        })))
    }

    /// `TaskEvents`.
    pub async fn task_events(&self) -> Result<BoxStream<TaskEvent>, DriverError> {
        if let Some(b) = &self.nomad {
            let s = self.guard_call(b.task_events()).await?;
            return Ok(Box::pin(s));
        }
        let s = self
            .guard(self.driver().task_events(pb::TaskEventsRequest {}))
            .await?;
        Ok(Box::pin(s.map(|r| {
            r.map(TaskEvent::from).map_err(DriverError::from)
        })))
    }

    /// `ExecTaskStreaming`: run `command` inside task `task_id` interactively, fed
    /// from `inputs`; what it writes and, last, how it ended. Dropping the stream (or
    /// `inputs` ending) ends the call, and the driver kills the command.
    pub async fn exec_task_streaming(
        &self,
        task_id: &str,
        command: Vec<String>,
        tty: bool,
        inputs: tokio::sync::mpsc::Receiver<ExecInput>,
    ) -> Result<BoxStream<ExecEvent>, DriverError> {
        if let Some(b) = &self.nomad {
            let s = self
                .guard_call(b.exec_task_streaming(task_id, command, tty, inputs))
                .await?;
            return Ok(Box::pin(s));
        }
        use pb::exec_task_streaming_request::{Msg as In, Setup, TerminalSize as Size};
        use pb::exec_task_streaming_response::Msg as Out;
        let setup = pb::ExecTaskStreamingRequest {
            msg: Some(In::Setup(Setup {
                task_id: task_id.into(),
                command,
                tty,
            })),
        };
        let requests = tokio_stream::once(setup).chain(
            tokio_stream::wrappers::ReceiverStream::new(inputs).map(|i| {
                pb::ExecTaskStreamingRequest {
                    msg: Some(match i {
                        ExecInput::Stdin(d) => In::Stdin(d),
                        ExecInput::StdinClosed => In::StdinClose(true),
                        ExecInput::Resize(s) => In::TtySize(Size {
                            rows: u32::from(s.rows),
                            cols: u32::from(s.cols),
                        }),
                    }),
                }
            }),
        );
        let s = self
            .guard(self.driver().exec_task_streaming(requests))
            .await?;
        Ok(Box::pin(s.filter_map(|r| match r {
            Err(e) => Some(Err(DriverError::from(e))),
            Ok(pb::ExecTaskStreamingResponse { msg: None }) => None,
            Ok(pb::ExecTaskStreamingResponse { msg: Some(m) }) => Some(Ok(match m {
                Out::Stdout(d) => ExecEvent::Output(ExecChunk::Stdout(d)),
                Out::Stderr(d) => ExecEvent::Output(ExecChunk::Stderr(d)),
                Out::Exited(r) => ExecEvent::Exited(ExitResult::from(r)),
            })),
        })))
    }

    /// `ExecTask`.
    pub async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        if let Some(b) = &self.nomad {
            return self
                .guard_call(b.exec_task(task_id, command, timeout))
                .await;
        }
        let r = self
            .guard(self.driver().exec_task(pb::ExecTaskRequest {
                task_id: task_id.into(),
                command,
                timeout: Some(to_duration(timeout)),
            }))
            .await?;
        Ok(
            ExecOutput::new(r.result.map(ExitResult::from).unwrap_or_default())
                .with_stdout(r.stdout)
                .with_stderr(r.stderr),
        )
    }
}
