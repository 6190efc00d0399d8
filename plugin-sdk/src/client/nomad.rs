//! Nomad's task drivers behind Drover's typed client.
//!
//! A plugin binary that answers the handshake with app protocol 2 speaks Nomad's driver
//! protocol (`hashicorp.nomad.plugins.base.proto.BasePlugin` and
//! `hashicorp.nomad.plugins.drivers.proto.Driver`). [`NomadBridge`] does for it what
//! Nomad's client does around a driver, so that the host above sees the same
//! [`super::PluginClient`] calls as for a Drover plugin:
//!
//! - configs: the plugin describes its plugin config and task config as hclspec trees;
//!   the host gets them as JSON Schema (so its own validation names a bad key before
//!   anything starts), and a user's JSON config is checked against the spec, given its
//!   defaults and sent as msgpack of the spec's types ([`crate::nomad::hclspec`]);
//! - task directories: Nomad's drivers work in `<alloc_dir>/<name>`, which is exactly a
//!   Drover task directory and its parent;
//! - logs: Nomad's drivers write a task's output into two FIFOs that Nomad's per-task
//!   `logmon` reads. Here a log relay process (`crate::logs::relay`) reads them into
//!   Drover's rotated log files; it is a process of its own, so output goes on being
//!   saved while the agent is down or restarting. The FIFOs live in a private directory
//!   of the host ([`NomadHostOptions::fifo_dir`]), out of the task's reach;
//! - handles: Nomad's own task handle (with the driver's opaque state, which for
//!   raw_exec is how to find its executor again) is kept inside the Drover handle's
//!   driver state, with the relay's pid, and given back in `RecoverTask`.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use drover_proto::nomad::base as nb;
use drover_proto::nomad::device as ndev;
use drover_proto::nomad::drivers as nd;
use drover_proto::nomad::structs as ns;
use nb::base_plugin_client::BasePluginClient;
use nd::driver_client::DriverClient;
use ndev::device_plugin_client::DevicePluginClient;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::Channel;

use crate::DriverError;
use crate::device::{DeviceGroup, DeviceInstance, DeviceMount, DeviceNode, Reservation};
use crate::logs::relay::{self, RelayProcess, RelaySpec};
use crate::nomad::hclspec::{self, Spec, SpecError};
use crate::signal::Signal;
use crate::types::{
    AgentInfo, Capabilities, ExecOutput, ExitResult, Fingerprint, FsIsolation, Health,
    NetworkModes, TaskEvent, TaskHandle, TaskSpec, TaskState, TaskStats, TaskStatus,
};

use super::{PluginIdentity, PluginKind, PluginProtocol};

/// Nomad driver API versions this bridge speaks (Nomad 0.9's plugins say "0.1.0",
/// later ones "v0.1.0").
const NOMAD_DRIVER_API: &str = "0.1.0";

/// The Nomad driver API versions the bridge speaks, as a requirement on what a Nomad
/// plugin's `PluginInfo` offers (a leading `v` is ignored).
pub const NOMAD_DRIVER_API_REQ: &str = "=0.1.0";

/// Version of the driver state the bridge keeps in a Drover [`TaskHandle`].
/// Not a small number: a Drover driver's handle (version 1, 2, ...) handed to the bridge
/// (a plugin upgraded in place from Drover's protocol to Nomad's) is refused, never read
/// as the bridge's, whose relay pid and FIFO paths the bridge acts on. ("NB", 1.)
const BRIDGE_STATE_VERSION: u32 = 0x4E42_0001;

/// The largest Nomad task handle accepted from a driver: it is stored with the task,
/// and a driver that answers with more is broken or hostile.
const MAX_NOMAD_HANDLE: usize = 1024 * 1024;

/// gRPC message limit both ways (Nomad's drivers send specs and stats, never much).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// What a host must provide to run Nomad drivers' tasks.
///
/// ```
/// use drover_plugin_sdk::client::NomadHostOptions;
/// let o = NomadHostOptions::new("/var/lib/drover/fifos", "/usr/bin/drover");
/// assert_eq!(o.client_port_range, (14000, 14512));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NomadHostOptions {
    /// A private directory (0700, the host's) where each task's stdout and stderr FIFOs
    /// are made.
    pub fifo_dir: PathBuf,
    /// The program that becomes a log relay when it runs (it calls
    /// [`crate::logs::relay::run_if_relay`] first thing in `main`).
    pub relay_program: PathBuf,
    /// Its arguments.
    pub relay_args: Vec<OsString>,
    /// Port range Nomad gives drivers for their own sub-plugins (executors); they use
    /// unix sockets on Linux and ignore it.
    pub client_port_range: (u32, u32),
}

impl NomadHostOptions {
    /// Options with Nomad's default port range and no relay arguments.
    pub fn new(fifo_dir: impl Into<PathBuf>, relay_program: impl Into<PathBuf>) -> Self {
        NomadHostOptions {
            fifo_dir: fifo_dir.into(),
            relay_program: relay_program.into(),
            relay_args: Vec::new(),
            client_port_range: (14000, 14512),
        }
    }
}

/// What the bridge keeps in a Drover handle's `driver_state`.
#[derive(Debug, Serialize, Deserialize)]
struct BridgeState {
    /// Nomad's `TaskHandle`, protobuf, base64.
    nomad_handle: String,
    /// The log relay of this start, if the task's output is kept.
    #[serde(default)]
    relay: Option<RelayProcess>,
    /// The FIFOs of this start, removed when the task is destroyed.
    #[serde(default)]
    fifos: Vec<PathBuf>,
}

/// What the bridge knows of one task between calls.
#[derive(Debug, Default)]
struct BridgeTask {
    relay: Option<RelayProcess>,
    fifos: Vec<PathBuf>,
    /// Set once the task has exited and the plugin has been told to forget it: a Nomad
    /// driver keeps an exited task's executor (raw_exec: a process of some MiB) until
    /// `DestroyTask`, which a host may call much later or, across a plugin relaunch,
    /// never usefully. The bridge answers for the task from here on.
    ended: Option<Ended>,
    /// Held shared by each `StopTask` in flight and exclusively while an exited task
    /// is released. Nomad's client never destroys a task while it is being stopped,
    /// and Nomad's drivers rely on it: raw_exec's `DestroyTask` shuts the executor
    /// down and kills it while `StopTask` still waits on that executor's `Shutdown`,
    /// which then fails ("transport is closing", or the cleanup it raced with), and
    /// for a reattached executor (after a plugin relaunch) the driver cannot tell that
    /// failure from a real one: the user's stop got an error for a task that stopped.
    calls: Arc<tokio::sync::RwLock<()>>,
}

/// What the bridge keeps of a task it has released from the plugin.
#[derive(Debug, Clone)]
struct Ended {
    result: ExitResult,
    status: TaskStatus,
}

/// A Nomad driver plugin seen through Drover's driver API. One per plugin process.
#[derive(Debug)]
pub(crate) struct NomadBridge {
    name: String,
    channel: Channel,
    host: NomadHostOptions,
    /// The Nomad driver API version chosen from PluginInfo's list.
    api_version: Mutex<Option<String>>,
    config_spec: Mutex<Option<Arc<Spec>>>,
    task_spec: Mutex<Option<Arc<Spec>>>,
    tasks: Mutex<HashMap<String, BridgeTask>>,
}

/// What goes wrong between the bridge and the Nomad plugin, as a [`DriverError`].
fn spec_errors(what: &str, errors: Vec<SpecError>) -> DriverError {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    DriverError::InvalidConfig(format!("{what}: {}", list.join("; ")))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl NomadBridge {
    pub(crate) fn new(name: String, channel: Channel, host: NomadHostOptions) -> Self {
        NomadBridge {
            name,
            channel,
            host,
            api_version: Mutex::new(None),
            config_spec: Mutex::new(None),
            task_spec: Mutex::new(None),
            tasks: Mutex::new(HashMap::new()),
        }
    }

    fn base(&self) -> BasePluginClient<Channel> {
        BasePluginClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    fn driver(&self) -> DriverClient<Channel> {
        DriverClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// `PluginInfo`. The identity says the Drover API version the bridge speaks; the
    /// Nomad version it will use with the plugin is remembered for `SetConfig`.
    pub(crate) async fn plugin_info(&self) -> Result<PluginIdentity, DriverError> {
        let r = self
            .base()
            .plugin_info(nb::PluginInfoRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner();
        let kind = match nb::PluginType::try_from(r.r#type) {
            Ok(nb::PluginType::Driver) => PluginKind::Driver,
            Ok(nb::PluginType::Device) => PluginKind::Device,
            _ => PluginKind::Other(r.r#type),
        };
        let nomad_api = r
            .plugin_api_versions
            .iter()
            .find(|v| v.trim_start_matches('v') == NOMAD_DRIVER_API)
            .cloned();
        // Nomad's driver API versions, not Drover's: a host accepts a Nomad plugin
        // whose list has [`NOMAD_DRIVER_API_REQ`]'s version.
        let api_versions = r.plugin_api_versions.clone();
        *lock(&self.api_version) = nomad_api;
        Ok(PluginIdentity {
            name: r.name,
            version: r.plugin_version,
            api_versions,
            kind,
            protocol: PluginProtocol::Nomad,
        })
    }

    async fn config_spec(&self) -> Result<Arc<Spec>, DriverError> {
        if let Some(s) = lock(&self.config_spec).clone() {
            return Ok(s);
        }
        let r = self
            .base()
            .config_schema(nb::ConfigSchemaRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner();
        let spec = Arc::new(r.spec.unwrap_or_default());
        *lock(&self.config_spec) = Some(spec.clone());
        Ok(spec)
    }

    async fn task_spec(&self) -> Result<Arc<Spec>, DriverError> {
        if let Some(s) = lock(&self.task_spec).clone() {
            return Ok(s);
        }
        let r = self
            .driver()
            .task_config_schema(nd::TaskConfigSchemaRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner();
        let spec = Arc::new(r.spec.unwrap_or_default());
        *lock(&self.task_spec) = Some(spec.clone());
        Ok(spec)
    }

    fn schema_text(what: &str, spec: &Spec) -> Result<String, DriverError> {
        let schema = hclspec::to_json_schema(spec).map_err(|e| {
            DriverError::Internal(format!("the plugin's {what} spec is malformed: {e}"))
        })?;
        Ok(schema.to_string())
    }

    /// `ConfigSchema`, as JSON Schema.
    pub(crate) async fn config_schema(&self) -> Result<String, DriverError> {
        let spec = self.config_spec().await?;
        Self::schema_text("plugin config", &spec)
    }

    /// `TaskConfigSchema`, as JSON Schema.
    pub(crate) async fn task_config_schema(&self) -> Result<String, DriverError> {
        let spec = self.task_spec().await?;
        Self::schema_text("task config", &spec)
    }

    /// `SetConfig`: the JSON config checked against the plugin's spec, then msgpack.
    pub(crate) async fn set_config(
        &self,
        config_json: &str,
        _agent: &AgentInfo,
    ) -> Result<(), DriverError> {
        let value = parse_config(config_json, "plugin config")?;
        let spec = self.config_spec().await?;
        let msgpack =
            hclspec::encode_msgpack(&spec, &value).map_err(|e| spec_errors("plugin config", e))?;
        let plugin_api_version = lock(&self.api_version)
            .clone()
            .unwrap_or_else(|| NOMAD_DRIVER_API.to_owned());
        let (min, max) = self.host.client_port_range;
        self.base()
            .set_config(nb::SetConfigRequest {
                msgpack_config: msgpack,
                nomad_config: Some(nb::NomadConfig {
                    driver: Some(nb::NomadDriverConfig {
                        client_max_port: max,
                        client_min_port: min,
                    }),
                }),
                plugin_api_version,
            })
            .await
            .map_err(DriverError::from)?;
        Ok(())
    }

    fn device(&self) -> DevicePluginClient<Channel> {
        DevicePluginClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// A device plugin's `Fingerprint`.
    pub(crate) async fn device_fingerprint(
        &self,
    ) -> Result<impl Stream<Item = Result<Vec<DeviceGroup>, DriverError>> + use<>, DriverError>
    {
        let s = self
            .device()
            .fingerprint(ndev::FingerprintRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner();
        Ok(s.map(|r| {
            r.map(|r| {
                r.device_group
                    .into_iter()
                    .map(device_group_from_nomad)
                    .collect()
            })
            .map_err(DriverError::from)
        }))
    }

    /// A device plugin's `Reserve`.
    pub(crate) async fn reserve_devices(
        &self,
        device_ids: Vec<String>,
    ) -> Result<Reservation, DriverError> {
        let r = self
            .device()
            .reserve(ndev::ReserveRequest { device_ids })
            .await
            .map_err(DriverError::from)?
            .into_inner();
        let c = r.container_res.unwrap_or_default();
        Ok(Reservation {
            envs: c.envs.into_iter().collect(),
            mounts: c
                .mounts
                .into_iter()
                .map(|m| DeviceMount {
                    task_path: m.task_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            devices: c
                .devices
                .into_iter()
                .map(|d| DeviceNode {
                    task_path: d.task_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
        })
    }

    /// `Capabilities`.
    pub(crate) async fn capabilities(&self) -> Result<Capabilities, DriverError> {
        let c = self
            .driver()
            .capabilities(nd::CapabilitiesRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner()
            .capabilities
            .unwrap_or_default();
        Ok(capabilities_from_nomad(&c))
    }

    /// `Fingerprint`.
    pub(crate) async fn fingerprint(
        &self,
    ) -> Result<impl Stream<Item = Result<Fingerprint, DriverError>> + use<>, DriverError> {
        let s = self
            .driver()
            .fingerprint(nd::FingerprintRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner();
        Ok(s.map(|r| r.map(fingerprint_from_nomad).map_err(DriverError::from)))
    }

    /// `StartTask`: FIFOs and a relay for the output, the config as msgpack, Nomad's
    /// handle kept inside Drover's.
    pub(crate) async fn start_task(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError> {
        if let Some(v) = spec.volumes.first() {
            // Nomad's TaskConfig.mounts would carry them, but what a Nomad driver does
            // with a host path (follow links in it or not) is not ours to check.
            return Err(DriverError::InvalidConfig(format!(
                "volume_mount of volume {:?}: Nomad drivers are not given host volumes by \
                 Drover yet; use the exec, java or docker driver",
                v.name
            )));
        }
        let task_spec = self.task_spec().await?;
        let value = parse_config(&spec.driver_config_json, "task config")?;
        let msgpack = hclspec::encode_msgpack(&task_spec, &value)
            .map_err(|e| spec_errors("task config", e))?;
        let (alloc_dir, name) = nomad_dirs(&spec)?;
        let output = self.start_output(&spec).await?;
        let config = nd::TaskConfig {
            id: spec.id.clone(),
            name,
            msgpack_driver_config: msgpack,
            env: spec.env.clone().into_iter().collect(),
            resources: Some(resources_to_nomad(&spec)),
            user: spec.user.clone(),
            alloc_dir: alloc_dir.display().to_string(),
            stdout_path: output.stdout.display().to_string(),
            stderr_path: output.stderr.display().to_string(),
            alloc_id: spec.id.clone(),
            network_isolation_spec: (!spec.netns_path.as_os_str().is_empty()).then(|| {
                nd::NetworkIsolationSpec {
                    mode: nd::network_isolation_spec::NetworkIsolationMode::Group as i32,
                    path: spec.netns_path.display().to_string(),
                    ..Default::default()
                }
            }),
            // A device plugin's reservation, as Nomad gives it to its drivers.
            devices: spec
                .devices
                .iter()
                .map(|d| nd::Device {
                    task_path: d.task_path.display().to_string(),
                    host_path: d.host_path.display().to_string(),
                    cgroup_permissions: d.permissions.clone(),
                })
                .collect(),
            mounts: spec
                .mounts
                .iter()
                .map(|m| nd::Mount {
                    task_path: m.task_path.display().to_string(),
                    host_path: m.host_path.display().to_string(),
                    readonly: m.read_only,
                    propagation_mode: String::new(),
                })
                .collect(),
            ..Default::default()
        };
        let answer = self
            .driver()
            .start_task(nd::StartTaskRequest { task: Some(config) })
            .await
            .map_err(DriverError::from);
        let handle = match answer.map(tonic::Response::into_inner) {
            Ok(r) => self.accept_start(&spec, r).await,
            Err(e) => Err(e),
        };
        // On an error `output` is dropped: its relay stops and its FIFOs go.
        let handle = handle?;
        let (relay, fifos) = output.keep();
        let state = BridgeState {
            nomad_handle: base64::engine::general_purpose::STANDARD.encode(handle.encode_to_vec()),
            relay,
            fifos: fifos.clone(),
        };
        let task_id = spec.id.clone();
        let handle = TaskHandle::new(spec, BRIDGE_STATE_VERSION, &state)?;
        self.track(
            &task_id,
            BridgeTask {
                relay,
                fifos,
                ended: None,
                calls: Arc::default(),
            },
        );
        Ok(handle)
    }

    /// Check a `StartTask` answer. A refusal, or a handle that is missing, names
    /// another task or is too big, fails the start; in the last two cases the task the
    /// plugin may have started is destroyed first, so that nothing runs unknown.
    async fn accept_start(
        &self,
        spec: &TaskSpec,
        r: nd::StartTaskResponse,
    ) -> Result<nd::TaskHandle, DriverError> {
        match nd::start_task_response::Result::try_from(r.result) {
            Ok(nd::start_task_response::Result::Success) => {}
            Ok(nd::start_task_response::Result::Retry) => {
                return Err(DriverError::Unavailable(format!(
                    "{} refused to start the task (it may succeed later): {}",
                    self.name, r.driver_error_msg
                )));
            }
            _ => {
                return Err(DriverError::InvalidConfig(format!(
                    "{} failed to start the task: {}",
                    self.name, r.driver_error_msg
                )));
            }
        }
        let problem = handle_problem(&spec.id, r.handle.as_ref());
        match (problem, r.handle) {
            (None, Some(h)) => Ok(h),
            (problem, _) => {
                let problem = problem.unwrap_or_else(|| "no task handle".into());
                let _ = self
                    .driver()
                    .destroy_task(nd::DestroyTaskRequest {
                        task_id: spec.id.clone(),
                        force: true,
                    })
                    .await;
                Err(DriverError::Internal(format!(
                    "{} answered StartTask with {problem}; the task was destroyed",
                    self.name
                )))
            }
        }
    }

    /// The FIFOs and the relay for a start of `spec`; `/dev/null` for a stream the
    /// host does not keep.
    async fn start_output(&self, spec: &TaskSpec) -> Result<StartOutput, DriverError> {
        let keep =
            !spec.stdout_path.as_os_str().is_empty() || !spec.stderr_path.as_os_str().is_empty();
        if !keep {
            return Ok(StartOutput {
                stdout: "/dev/null".into(),
                stderr: "/dev/null".into(),
                relay: None,
                fifos: Vec::new(),
            });
        }
        let nonce = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!("{}.{nonce:x}", spec.id);
        let (stdout, stderr) = relay::make_fifos(&self.host.fifo_dir, &name).map_err(|e| {
            DriverError::Internal(format!(
                "cannot make the task's log FIFOs in {}: {e}",
                self.host.fifo_dir.display()
            ))
        })?;
        let fifos = vec![stdout.clone(), stderr.clone()];
        let relay_spec = RelaySpec {
            stdout_fifo: stdout.clone(),
            stdout_base: spec.stdout_path.clone(),
            stderr_fifo: stderr.clone(),
            stderr_base: spec.stderr_path.clone(),
            limits: spec.logs,
        };
        // Spawning waits for the relay to say it has the FIFOs open: blocking.
        let (program, args) = (
            self.host.relay_program.clone(),
            self.host.relay_args.clone(),
        );
        let spawned =
            tokio::task::spawn_blocking(move || relay::spawn_relay(&program, &args, &relay_spec))
                .await
                .map_err(DriverError::internal)
                .and_then(|r| {
                    r.map_err(|e| {
                        DriverError::Internal(format!("cannot start the task's log relay: {e}"))
                    })
                });
        let relay = match spawned {
            Ok(r) => r,
            Err(e) => {
                remove_files(&fifos);
                return Err(e);
            }
        };
        Ok(StartOutput {
            stdout,
            stderr,
            relay: Some(relay),
            fifos,
        })
    }

    /// `WaitTask`.
    /// The exit of a task this bridge has released, if it has.
    fn ended(&self, task_id: &str) -> Option<Ended> {
        lock(&self.tasks).get(task_id).and_then(|t| t.ended.clone())
    }

    /// The lock that keeps a release of `task_id` apart from its stops (see
    /// [`BridgeTask::calls`]); none for a task the bridge does not track.
    fn calls(&self, task_id: &str) -> Option<Arc<tokio::sync::RwLock<()>>> {
        lock(&self.tasks).get(task_id).map(|t| t.calls.clone())
    }

    /// `WaitTask`. Once the task has exited, the plugin is told to forget it (its
    /// executor goes) and the bridge answers for it until `destroy_task`.
    pub(crate) async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        if let Some(e) = self.ended(task_id) {
            return Ok(e.result);
        }
        let answer = self
            .driver()
            .wait_task(nd::WaitTaskRequest {
                task_id: task_id.into(),
            })
            .await
            .map_err(DriverError::from);
        let r = match answer {
            Ok(r) => r.into_inner(),
            // Another waiter released it meanwhile.
            Err(e) => return self.ended(task_id).map(|e| e.result).ok_or(e),
        };
        let mut result = r.result.map(exit_from_nomad).unwrap_or_default();
        if !r.err.is_empty() {
            result.err = Some(r.err);
        }
        self.release(task_id, &result).await;
        Ok(result)
    }

    /// The task has exited: keep its last status, and have the plugin destroy it (and
    /// its executor). Its FIFOs go; the relay ends by itself once the executor has
    /// closed them. Only tasks this bridge started or recovered are released.
    async fn release(&self, task_id: &str, result: &ExitResult) {
        let Some(calls) = self.calls(task_id) else {
            return;
        };
        // A stop in flight ends first: its exit is what this release reports, and
        // the plugin's DestroyTask would tear its executor down under it.
        let _no_stop = calls.write().await;
        let running = lock(&self.tasks)
            .get(task_id)
            .is_some_and(|t| t.ended.is_none());
        if !running {
            return;
        }
        let status = match self.plugin_inspect(task_id).await {
            Ok(s) => s,
            Err(_) => TaskStatus::new(task_id, TaskState::Exited),
        }
        .with_exit_result(result.clone());
        let destroyed = self
            .driver()
            .destroy_task(nd::DestroyTaskRequest {
                task_id: task_id.into(),
                force: false,
            })
            .await;
        match destroyed.map_err(DriverError::from) {
            Ok(_) | Err(DriverError::NotFound(_)) => {}
            // Not forgotten: the task stays the plugin's to answer for (a driver whose
            // wait returned early must still be stoppable through it).
            Err(e) => {
                tracing::warn!(plugin = %self.name, task = task_id, error = %e, "the driver did not forget an exited task");
                return;
            }
        }
        let fifos = {
            let mut tasks = lock(&self.tasks);
            let Some(t) = tasks.get_mut(task_id) else {
                return;
            };
            t.ended = Some(Ended {
                result: result.clone(),
                status,
            });
            std::mem::take(&mut t.fifos)
        };
        remove_files(&fifos);
    }

    /// `StopTask`.
    pub(crate) async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        let calls = self.calls(task_id);
        let _stopping = match &calls {
            Some(c) => Some(c.read().await),
            None => None,
        };
        if self.ended(task_id).is_some() {
            return Ok(());
        }
        self.driver()
            .stop_task(nd::StopTaskRequest {
                task_id: task_id.into(),
                timeout: Some(crate::types::to_duration(timeout)),
                signal: signal.to_string(),
            })
            .await
            .map_err(DriverError::from)?;
        Ok(())
    }

    /// `DestroyTask`; then the relay drains and ends, and the FIFOs go.
    pub(crate) async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        // A released task is gone from the plugin already.
        let answer = if self.ended(task_id).is_none() {
            self.driver()
                .destroy_task(nd::DestroyTaskRequest {
                    task_id: task_id.into(),
                    force,
                })
                .await
                .map(drop)
                .map_err(DriverError::from)
        } else {
            Ok(())
        };
        match answer {
            // Still running and not forced: the task keeps its output.
            Err(e @ DriverError::FailedPrecondition(_)) => return Err(e),
            Err(DriverError::NotFound(_)) | Ok(()) => {}
            // The relay and the FIFOs are the bridge's, whatever the plugin answered.
            Err(e) => {
                self.untrack(task_id);
                return Err(e);
            }
        }
        self.untrack(task_id);
        Ok(())
    }

    /// Forget `task_id`: its relay drains and ends, its FIFOs go.
    fn untrack(&self, task_id: &str) {
        let gone = lock(&self.tasks).remove(task_id);
        if let Some(task) = gone {
            forget(task);
        }
    }

    /// `InspectTask`.
    pub(crate) async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        if let Some(e) = self.ended(task_id) {
            return Ok(e.status);
        }
        self.plugin_inspect(task_id).await
    }

    async fn plugin_inspect(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        let r = self
            .driver()
            .inspect_task(nd::InspectTaskRequest {
                task_id: task_id.into(),
            })
            .await
            .map_err(DriverError::from)?
            .into_inner();
        let Some(t) = r.task else {
            return Err(DriverError::Internal(format!(
                "{} answered InspectTask without a status",
                self.name
            )));
        };
        let mut status = TaskStatus::new(t.id, task_state_from_nomad(t.state)).with_name(t.name);
        status.started_at = t.started_at.and_then(time_from_proto);
        status.completed_at = t.completed_at.and_then(time_from_proto);
        status.exit_result = t.result.map(exit_from_nomad);
        if let Some(d) = r.driver {
            status.attributes = d.attributes.into_iter().collect();
        }
        Ok(status)
    }

    /// `RecoverTask` from the handle `start_task` made.
    pub(crate) async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        let task_id = handle.spec.id.clone();
        if handle.driver_state.is_empty() {
            // The host never got this start's answer (it gave up on it, or died). A
            // Nomad driver cannot be handed a task by id; if this plugin process started
            // it anyway, it must not run unseen.
            if self.plugin_inspect(&task_id).await.is_ok() {
                let _ = self
                    .driver()
                    .destroy_task(nd::DestroyTaskRequest {
                        task_id: task_id.clone(),
                        force: true,
                    })
                    .await;
                tracing::warn!(plugin = %self.name, task = %task_id, "destroyed a task whose start was never answered");
            }
            return Err(DriverError::NotFound(format!(
                "task {task_id}: no handle of its start was kept, and a Nomad driver cannot \
                 find a task by id"
            )));
        }
        let state: BridgeState = handle.decode_state(BRIDGE_STATE_VERSION)?;
        self.check_state(&task_id, &state)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(state.nomad_handle.as_bytes())
            .map_err(|e| DriverError::InvalidConfig(format!("task handle: {e}")))?;
        let nomad = nd::TaskHandle::decode(bytes.as_slice())
            .map_err(|e| DriverError::InvalidConfig(format!("task handle: {e}")))?;
        self.driver()
            .recover_task(nd::RecoverTaskRequest {
                task_id: task_id.clone(),
                handle: Some(nomad),
            })
            .await
            .map_err(DriverError::from)?;
        self.track(
            &task_id,
            BridgeTask {
                relay: state.relay,
                fifos: state.fifos,
                ended: None,
                calls: Arc::default(),
            },
        );
        Ok(())
    }

    /// What a handle's state names must be this bridge's own for `task_id`: FIFOs of
    /// that task in the FIFO directory, a relay process that is a log relay. The state
    /// is checked though the bridge wrote it, because a handle can reach the bridge from
    /// elsewhere (a plugin that spoke Drover's protocol at its last launch).
    fn check_state(&self, task_id: &str, state: &BridgeState) -> Result<(), DriverError> {
        let bad = |what: String| {
            DriverError::InvalidConfig(format!("task {task_id}: task handle state: {what}"))
        };
        for f in &state.fifos {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            // Exactly `<task id>.<hex nonce>.<stream>`: a task id may hold dots, so a
            // looser match would take `web.2`'s FIFOs for `web`'s.
            let nonce = name
                .strip_prefix(task_id)
                .and_then(|r| r.strip_prefix('.'))
                .and_then(|r| {
                    r.strip_suffix(".stdout")
                        .or_else(|| r.strip_suffix(".stderr"))
                });
            let ours = f.parent() == Some(self.host.fifo_dir.as_path())
                && nonce.is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_hexdigit()));
            if !ours {
                return Err(bad(format!("{} is not one of its FIFOs", f.display())));
            }
        }
        if let Some(r) = &state.relay
            && r.is_running()
            && !r.serves(&state.fifos)
        {
            return Err(bad(format!(
                "pid {} is not a log relay of this task's FIFOs",
                r.pid
            )));
        }
        Ok(())
    }

    /// Keep `task` as the bridge's record of `task_id`, ending what an earlier record
    /// of the same id held (a restart's new start replaces the old one's).
    fn track(&self, task_id: &str, task: BridgeTask) {
        let old = lock(&self.tasks).insert(task_id.to_owned(), task);
        if let Some(old) = old {
            forget(old);
        }
    }

    /// `SignalTask`.
    pub(crate) async fn signal_task(
        &self,
        task_id: &str,
        signal: Signal,
    ) -> Result<(), DriverError> {
        if self.ended(task_id).is_some() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} has exited"
            )));
        }
        self.driver()
            .signal_task(nd::SignalTaskRequest {
                task_id: task_id.into(),
                signal: signal.to_string(),
            })
            .await
            .map_err(DriverError::from)?;
        Ok(())
    }

    /// `TaskStats`.
    pub(crate) async fn task_stats(
        &self,
        task_id: &str,
        interval: Duration,
    ) -> Result<impl Stream<Item = Result<TaskStats, DriverError>> + use<>, DriverError> {
        let s = self
            .driver()
            .task_stats(nd::TaskStatsRequest {
                task_id: task_id.into(),
                collection_interval: Some(crate::types::to_duration(interval)),
            })
            .await
            .map_err(DriverError::from)?
            .into_inner();
        Ok(s.map(|r| {
            r.map(|r| stats_from_nomad(r.stats.unwrap_or_default()))
                .map_err(DriverError::from)
        }))
    }

    /// `TaskEvents`.
    pub(crate) async fn task_events(
        &self,
    ) -> Result<impl Stream<Item = Result<TaskEvent, DriverError>> + use<>, DriverError> {
        let s = self
            .driver()
            .task_events(nd::TaskEventsRequest {})
            .await
            .map_err(DriverError::from)?
            .into_inner();
        Ok(s.map(|r| r.map(event_from_nomad).map_err(DriverError::from)))
    }

    /// `ExecTaskStreaming`, in Nomad's messages.
    pub(crate) async fn exec_task_streaming(
        &self,
        task_id: &str,
        command: Vec<String>,
        tty: bool,
        inputs: tokio::sync::mpsc::Receiver<crate::types::ExecInput>,
    ) -> Result<impl Stream<Item = Result<crate::types::ExecEvent, DriverError>> + use<>, DriverError>
    {
        use crate::types::{ExecChunk, ExecEvent, ExecInput};
        let setup = nd::ExecTaskStreamingRequest {
            setup: Some(nd::exec_task_streaming_request::Setup {
                task_id: task_id.into(),
                command,
                tty,
            }),
            ..Default::default()
        };
        let requests = tokio_stream::once(setup).chain(
            tokio_stream::wrappers::ReceiverStream::new(inputs).map(|i| match i {
                ExecInput::Stdin(data) => nd::ExecTaskStreamingRequest {
                    stdin: Some(nd::ExecTaskStreamingIoOperation { data, close: false }),
                    ..Default::default()
                },
                ExecInput::StdinClosed => nd::ExecTaskStreamingRequest {
                    stdin: Some(nd::ExecTaskStreamingIoOperation {
                        data: Vec::new(),
                        close: true,
                    }),
                    ..Default::default()
                },
                ExecInput::Resize(s) => nd::ExecTaskStreamingRequest {
                    tty_size: Some(nd::exec_task_streaming_request::TerminalSize {
                        height: i32::from(s.rows),
                        width: i32::from(s.cols),
                    }),
                    ..Default::default()
                },
            }),
        );
        let s = self
            .driver()
            .exec_task_streaming(requests)
            .await
            .map_err(DriverError::from)?
            .into_inner();
        Ok(futures_util::StreamExt::flat_map(s, |r| {
            let events: Vec<Result<ExecEvent, DriverError>> = match r {
                Err(e) => vec![Err(DriverError::from(e))],
                Ok(m) => {
                    let mut v = Vec::new();
                    if let Some(o) = m.stdout.filter(|o| !o.data.is_empty()) {
                        v.push(Ok(ExecEvent::Output(ExecChunk::Stdout(o.data))));
                    }
                    if let Some(o) = m.stderr.filter(|o| !o.data.is_empty()) {
                        v.push(Ok(ExecEvent::Output(ExecChunk::Stderr(o.data))));
                    }
                    if m.exited {
                        v.push(Ok(ExecEvent::Exited(
                            m.result.map(exit_from_nomad).unwrap_or_default(),
                        )));
                    }
                    v
                }
            };
            futures_util::stream::iter(events)
        }))
    }

    /// `ExecTask`.
    pub(crate) async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let r = self
            .driver()
            .exec_task(nd::ExecTaskRequest {
                task_id: task_id.into(),
                command,
                timeout: Some(crate::types::to_duration(timeout)),
            })
            .await
            .map_err(DriverError::from)?
            .into_inner();
        Ok(
            ExecOutput::new(r.result.map(exit_from_nomad).unwrap_or_default())
                .with_stdout(r.stdout)
                .with_stderr(r.stderr),
        )
    }
}

/// What is wrong with the task handle a `StartTask` answer carries for task `task_id`,
/// if anything: none at all, one too big to keep, or one of another task.
fn handle_problem(task_id: &str, handle: Option<&nd::TaskHandle>) -> Option<String> {
    let h = match handle {
        None => return Some("no task handle".to_owned()),
        Some(h) => h,
    };
    let size = h.encoded_len();
    if size > MAX_NOMAD_HANDLE {
        return Some(format!(
            "a task handle of {size} bytes (at most {MAX_NOMAD_HANDLE})"
        ));
    }
    match &h.config {
        Some(c) if c.id != task_id => Some(format!("the handle of another task ({:?})", c.id)),
        _ => None,
    }
}

/// The output side of one start. Until [`StartOutput::keep`] it is the start's to
/// undo: dropped (the start failed, or its caller gave up on it and dropped the future
/// mid-call) it stops the relay and removes the FIFOs, so a start that ends any other
/// way than with a kept handle leaves nothing of its own behind.
struct StartOutput {
    stdout: PathBuf,
    stderr: PathBuf,
    relay: Option<RelayProcess>,
    fifos: Vec<PathBuf>,
}

impl StartOutput {
    /// The start succeeded: the relay and the FIFOs are the task's now.
    fn keep(mut self) -> (Option<RelayProcess>, Vec<PathBuf>) {
        (self.relay.take(), std::mem::take(&mut self.fifos))
    }
}

impl Drop for StartOutput {
    fn drop(&mut self) {
        if let Some(r) = self.relay.take() {
            let _ = r.stop();
        }
        remove_files(&self.fifos);
    }
}

/// End what a task record holds: its relay (told to drain and exit) and its FIFOs.
fn forget(task: BridgeTask) {
    if let Some(relay) = &task.relay
        && relay.is_relay()
        && let Err(e) = relay.stop()
    {
        tracing::warn!(pid = relay.pid, error = %e, "stopping a task's log relay");
    }
    remove_files(&task.fifos);
}

fn remove_files(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// A config as JSON; an empty text is an empty object.
fn parse_config(text: &str, what: &str) -> Result<serde_json::Value, DriverError> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    serde_json::from_str(text).map_err(|e| DriverError::InvalidConfig(format!("{what}: {e}")))
}

/// Nomad's `alloc_dir` and task name for a Drover task: its directory is
/// `<alloc_dir>/<name>`.
fn nomad_dirs(spec: &TaskSpec) -> Result<(PathBuf, String), DriverError> {
    let dir = &spec.task_dir;
    match (dir.parent(), dir.file_name().and_then(|n| n.to_str())) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
            Ok((parent.to_owned(), name.to_owned()))
        }
        _ => Err(DriverError::InvalidConfig(format!(
            "a Nomad driver needs a task directory <alloc_dir>/<name>; this task has {:?}",
            dir.display().to_string()
        ))),
    }
}

fn resources_to_nomad(spec: &TaskSpec) -> nd::Resources {
    let r = &spec.resources;
    nd::Resources {
        allocated_resources: Some(nd::AllocatedTaskResources {
            cpu: Some(nd::AllocatedCpuResources {
                cpu_shares: r.cpu_shares,
            }),
            memory: Some(nd::AllocatedMemoryResources {
                memory_mb: r.memory_mb,
                memory_max_mb: r.memory_max_mb,
            }),
            networks: Vec::new(),
        }),
        linux_resources: Some(nd::LinuxResources {
            cpu_shares: r.cpu_shares,
            memory_limit_bytes: r.memory_max_mb.max(r.memory_mb).saturating_mul(1024 * 1024),
            ..Default::default()
        }),
        // Nomad's `AllocatedResources.Shared.Ports`: what its docker driver's `ports`
        // and its task environment read.
        ports: spec
            .ports
            .iter()
            .map(|p| nd::PortMapping {
                label: p.label.clone(),
                value: i32::from(p.value),
                to: i32::from(p.to),
                host_ip: p.host_ip.clone(),
            })
            .collect(),
    }
}

fn capabilities_from_nomad(c: &nd::DriverCapabilities) -> Capabilities {
    use nd::driver_capabilities::FsIsolation as NomadFs;
    use nd::network_isolation_spec::NetworkIsolationMode as Mode;
    let modes: Vec<Mode> = c
        .network_isolation_modes
        .iter()
        .filter_map(|m| Mode::try_from(*m).ok())
        .collect();
    Capabilities {
        send_signals: c.send_signals,
        exec: c.exec,
        fs_isolation: match NomadFs::try_from(c.fs_isolation) {
            Ok(NomadFs::Chroot) => FsIsolation::Chroot,
            Ok(NomadFs::Image) => FsIsolation::Image,
            _ => FsIsolation::None,
        },
        // Every Nomad driver serves TaskStats, TaskEvents and RecoverTask (they are part
        // of its interface, not optional).
        task_stats: true,
        task_events: true,
        recover: true,
        network_modes: NetworkModes {
            // A driver that names no mode runs tasks in the host's network (Nomad's
            // default).
            host: modes.is_empty() || modes.contains(&Mode::Host),
            none: modes.contains(&Mode::None),
            bridge: modes.contains(&Mode::Group),
            // Nomad's drivers that offer group isolation join the namespace given in
            // the TaskConfig's NetworkIsolationSpec.
            group: modes.contains(&Mode::Group),
        },
    }
}

fn device_group_from_nomad(g: ndev::DeviceGroup) -> DeviceGroup {
    DeviceGroup {
        vendor: g.vendor,
        device_type: g.device_type,
        name: g.device_name,
        instances: g
            .devices
            .into_iter()
            .map(|d| DeviceInstance {
                id: d.id,
                healthy: d.healthy,
                health_description: d.health_description,
            })
            .collect(),
        attributes: g
            .attributes
            .iter()
            .filter_map(|(k, a)| {
                let text = attribute_text(a)?;
                Some((
                    k.clone(),
                    if a.unit.is_empty() {
                        text
                    } else {
                        format!("{text} {}", a.unit)
                    },
                ))
            })
            .collect(),
    }
}

fn attribute_text(a: &ns::Attribute) -> Option<String> {
    use ns::attribute::Value;
    Some(match a.value.as_ref()? {
        Value::FloatVal(f) => f.to_string(),
        Value::IntVal(i) => i.to_string(),
        Value::StringVal(s) => s.clone(),
        Value::BoolVal(b) => b.to_string(),
    })
}

fn fingerprint_from_nomad(r: nd::FingerprintResponse) -> Fingerprint {
    use nd::fingerprint_response::HealthState;
    let health = match HealthState::try_from(r.health) {
        Ok(HealthState::Healthy) => Health::Healthy,
        Ok(HealthState::Unhealthy) => Health::Unhealthy,
        _ => Health::Undetected,
    };
    let description = if r.health_description.is_empty() {
        // Nomad shows nothing then; an operator reading `plugin status` deserves a word.
        match health {
            Health::Healthy => "healthy".to_owned(),
            Health::Unhealthy => "the driver says it is unhealthy, without a reason".to_owned(),
            _ => "the driver says it is not detected on this node, without a reason".to_owned(),
        }
    } else {
        r.health_description
    };
    let mut fp = Fingerprint::not_ready(health, cut(description, MAX_FINGERPRINT_TEXT));
    // Bounded: the agent keeps them, logs changes and sends them to the servers.
    fp.attributes = r
        .attributes
        .iter()
        .filter(|(k, _)| k.len() <= MAX_FINGERPRINT_TEXT)
        .filter_map(|(k, v)| attribute_text(v).map(|t| (k.clone(), cut(t, MAX_FINGERPRINT_TEXT))))
        .take(MAX_FINGERPRINT_ATTRIBUTES)
        .collect::<BTreeMap<_, _>>();
    fp
}

/// At most this many attributes of a fingerprint are kept, the rest dropped.
const MAX_FINGERPRINT_ATTRIBUTES: usize = 256;
/// A fingerprint's description, attribute names and values are cut to this many bytes.
const MAX_FINGERPRINT_TEXT: usize = 1024;

/// `text` cut to at most `max` bytes, at a character boundary, marked when cut.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push_str(" [cut]");
    }
    text
}

fn exit_from_nomad(r: nd::ExitResult) -> ExitResult {
    let mut e = ExitResult::code(r.exit_code);
    e.signal = r.signal;
    e.oom_killed = r.oom_killed;
    e
}

fn task_state_from_nomad(s: i32) -> TaskState {
    match nd::TaskState::try_from(s) {
        Ok(nd::TaskState::Running) => TaskState::Running,
        Ok(nd::TaskState::Exited) => TaskState::Exited,
        _ => TaskState::Unknown,
    }
}

fn time_from_proto(t: prost_types::Timestamp) -> Option<SystemTime> {
    // Go's zero time (year 1) comes as a large negative timestamp: not a time, nor is
    // the epoch itself.
    crate::types::from_timestamp(Some(t)).filter(|t| *t > SystemTime::UNIX_EPOCH)
}

fn stats_from_nomad(s: nd::TaskStats) -> TaskStats {
    let mut out = TaskStats::default();
    if let Some(agg) = s.agg_resource_usage {
        if let Some(m) = agg.memory {
            out.memory_rss_bytes = m.rss;
            out.memory_cache_bytes = m.cache;
        }
        if let Some(c) = agg.cpu {
            out.cpu_percent = c.percent;
        }
    }
    out.process_count = s.resource_usage_by_pid.len() as u64;
    out
}

fn event_from_nomad(e: nd::DriverTaskEvent) -> TaskEvent {
    let mut annotations: BTreeMap<String, String> = e.annotations.into_iter().collect();
    if !e.alloc_id.is_empty() {
        annotations.insert("alloc_id".into(), e.alloc_id);
    }
    if !e.task_name.is_empty() {
        annotations.insert("task_name".into(), e.task_name);
    }
    let mut ev = TaskEvent::new(e.task_id, e.message);
    ev.timestamp = e
        .timestamp
        .and_then(time_from_proto)
        .unwrap_or_else(SystemTime::now);
    ev.annotations = annotations;
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nomad_device_group_keeps_ids_health_and_attributes_with_units() {
        let attr = |value, unit: &str| ns::Attribute {
            value: Some(value),
            unit: unit.to_owned(),
        };
        let g = device_group_from_nomad(ndev::DeviceGroup {
            vendor: "nvidia".into(),
            device_type: "gpu".into(),
            device_name: "1080ti".into(),
            devices: vec![ndev::DetectedDevice {
                id: "GPU-1".into(),
                healthy: false,
                health_description: "too hot".into(),
                hw_locality: None,
            }],
            attributes: [
                (
                    "memory".to_owned(),
                    attr(ns::attribute::Value::IntVal(11), "GiB"),
                ),
                (
                    "model".to_owned(),
                    attr(ns::attribute::Value::StringVal("x".into()), ""),
                ),
            ]
            .into(),
        });
        assert_eq!(
            (g.vendor.as_str(), g.device_type.as_str(), g.name.as_str()),
            ("nvidia", "gpu", "1080ti")
        );
        assert_eq!(g.instances[0].id, "GPU-1");
        assert!(!g.instances[0].healthy);
        assert_eq!(g.instances[0].health_description, "too hot");
        assert_eq!(g.attributes["memory"], "11 GiB");
        assert_eq!(g.attributes["model"], "x");
    }

    fn handle(id: &str, state: usize) -> nd::TaskHandle {
        nd::TaskHandle {
            version: 1,
            config: Some(nd::TaskConfig {
                id: id.into(),
                ..Default::default()
            }),
            state: nd::TaskState::Running as i32,
            driver_state: vec![7; state],
        }
    }

    /// A Nomad driver gets the allocation's ports where Nomad puts them
    /// (`Resources.Ports`, its `AllocatedResources.Shared.Ports`).
    #[test]
    fn the_allocations_ports_go_to_a_nomad_driver_as_its_port_mappings() {
        let spec = TaskSpec::new("t1").with_ports([
            crate::TaskPort::new("http", 23456)
                .with_to(80)
                .with_host_ip("127.0.0.1"),
            crate::TaskPort::new("db", 23457).with_host_ip("127.0.0.1"),
        ]);
        let r = resources_to_nomad(&spec);
        let got: Vec<(&str, i32, i32, &str)> = r
            .ports
            .iter()
            .map(|p| (p.label.as_str(), p.value, p.to, p.host_ip.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("http", 23456, 80, "127.0.0.1"),
                ("db", 23457, 0, "127.0.0.1")
            ]
        );
    }

    #[test]
    fn start_answers_without_a_usable_handle_are_named() {
        assert_eq!(handle_problem("t1", Some(&handle("t1", 100))), None);
        assert_eq!(
            handle_problem("t1", None).as_deref(),
            Some("no task handle")
        );
        let other = handle_problem("t1", Some(&handle("t2", 1))).unwrap();
        assert!(other.contains("another task (\"t2\")"), "{other}");
        let big = handle_problem("t1", Some(&handle("t1", MAX_NOMAD_HANDLE + 1))).unwrap();
        assert!(big.contains("bytes (at most"), "{big}");
    }

    #[test]
    fn nomad_configs_and_dirs_map_as_nomad_expects() {
        let mut spec = TaskSpec::new("t1");
        assert!(nomad_dirs(&spec).is_err());
        spec.task_dir = "/var/lib/drover/alloc/a1/web".into();
        let (alloc, name) = nomad_dirs(&spec).unwrap();
        assert_eq!(alloc, PathBuf::from("/var/lib/drover/alloc/a1"));
        assert_eq!(name, "web");
        assert_eq!(parse_config("  ", "x").unwrap(), serde_json::json!({}));
        let err = parse_config("{", "task config").unwrap_err();
        assert!(err.to_string().contains("task config"), "{err}");
    }

    #[test]
    fn fingerprints_capabilities_and_results_translate() {
        use nd::fingerprint_response::HealthState;
        let mut attrs = std::collections::HashMap::new();
        attrs.insert(
            "driver.raw_exec".to_owned(),
            ns::Attribute {
                value: Some(ns::attribute::Value::BoolVal(true)),
                unit: String::new(),
            },
        );
        let fp = fingerprint_from_nomad(nd::FingerprintResponse {
            attributes: attrs,
            health: HealthState::Healthy as i32,
            health_description: "Healthy".into(),
        });
        assert_eq!(fp.health, Health::Healthy);
        assert_eq!(fp.attributes["driver.raw_exec"], "true");
        let quiet = fingerprint_from_nomad(nd::FingerprintResponse::default());
        assert_eq!(quiet.health, Health::Undetected);
        assert!(
            quiet.description.contains("not detected"),
            "{}",
            quiet.description
        );

        let caps = capabilities_from_nomad(&nd::DriverCapabilities {
            send_signals: true,
            exec: true,
            fs_isolation: nd::driver_capabilities::FsIsolation::Chroot as i32,
            ..Default::default()
        });
        assert!(caps.send_signals && caps.exec && caps.recover);
        assert_eq!(caps.fs_isolation, FsIsolation::Chroot);
        assert!(caps.network_modes.host && !caps.network_modes.bridge);

        let r = exit_from_nomad(nd::ExitResult {
            exit_code: 0,
            signal: 9,
            oom_killed: true,
        });
        assert_eq!((r.signal, r.oom_killed), (9, true));
        // Go's zero time is no time.
        assert_eq!(
            time_from_proto(prost_types::Timestamp {
                seconds: -62135596800,
                nanos: 0
            }),
            None
        );
    }

    #[tokio::test]
    async fn a_handle_naming_another_tasks_fifos_is_refused() {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let bridge = NomadBridge::new(
            "x".into(),
            channel,
            NomadHostOptions::new("/nonexistent", "/nonexistent"),
        );
        let mut h = TaskHandle::for_spec(TaskSpec::new("web"));
        h.version = BRIDGE_STATE_VERSION;
        // Task ids may hold dots: `web.2.ab.stdout` is task `web.2`'s, not `web`'s.
        h.driver_state =
            br#"{"nomad_handle": "", "fifos": ["/nonexistent/web.2.ab.stdout"]}"#.to_vec();
        let err = bridge.recover_task(h).await.unwrap_err();
        assert!(err.to_string().contains("is not one of its FIFOs"), "{err}");
    }

    #[tokio::test]
    async fn a_garbage_handle_is_refused_on_recovery_with_the_reason() {
        // A channel to nowhere: the checks come before any call.
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let bridge = NomadBridge::new(
            "x".into(),
            channel,
            NomadHostOptions::new("/nonexistent", "/nonexistent"),
        );
        let mut h = TaskHandle::for_spec(TaskSpec::new("t1"));
        let err = bridge.recover_task(h.clone()).await.unwrap_err();
        assert!(matches!(err, DriverError::NotFound(_)), "{err:?}");
        h.version = BRIDGE_STATE_VERSION;
        h.driver_state = b"not json".to_vec();
        let err = bridge.recover_task(h.clone()).await.unwrap_err();
        assert!(err.to_string().contains("task handle state"), "{err}");
        h.driver_state = br#"{"nomad_handle": "!!!"}"#.to_vec();
        let err = bridge.recover_task(h.clone()).await.unwrap_err();
        assert!(err.to_string().contains("task handle"), "{err}");
        // A Drover driver's handle (version 1) is never read as the bridge's.
        h.version = 1;
        h.driver_state = br#"{"nomad_handle": ""}"#.to_vec();
        let err = bridge.recover_task(h.clone()).await.unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        // Nor acted on when it names what is not the bridge's: a file elsewhere, a
        // process that is not a log relay (this test's own).
        h.version = BRIDGE_STATE_VERSION;
        h.driver_state = br#"{"nomad_handle": "", "fifos": ["/etc/passwd"]}"#.to_vec();
        let err = bridge.recover_task(h.clone()).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("/etc/passwd is not one of its FIFOs"),
            "{err}"
        );
        h.driver_state =
            br#"{"nomad_handle": "", "fifos": ["/nonexistent/t1.1.stdout/../../x"]}"#.to_vec();
        assert!(bridge.recover_task(h.clone()).await.is_err());
        let me = relay::RelayProcess {
            pid: std::process::id(),
            start_time: crate::client::process_start_time(std::process::id()).unwrap(),
        };
        h.driver_state = serde_json::to_vec(&serde_json::json!({
            "nomad_handle": "", "relay": me, "fifos": ["/nonexistent/t1.5.stdout"]
        }))
        .unwrap();
        let err = bridge.recover_task(h).await.unwrap_err();
        assert!(err.to_string().contains("is not a log relay"), "{err}");
    }
}
