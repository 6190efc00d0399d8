//! Nomad's driver protocol over the same [`DriverPlugin`]: what [`crate::serve`] serves
//! when a Nomad agent starts the plugin (Nomad's cookie, app protocol 2).
//!
//! Nomad's host speaks `hashicorp.nomad.plugins.base.proto.BasePlugin` and
//! `hashicorp.nomad.plugins.drivers.proto.Driver`; each call is translated to the
//! driver's trait methods here. What maps and what does not is listed in the author's
//! guide (docs/plugin-authoring.md, "Your driver in a Nomad agent").
//!
//! - Schemas: the driver's JSON Schemas (`D::Config`, `D::TaskConfig`) become Nomad
//!   `hclspec` specs; configs arrive as msgpack and are decoded into the same JSON the
//!   driver gets from a Drover agent (null attributes, Nomad's "not set", are left out,
//!   so serde's defaults apply).
//! - Task ids: Nomad's ids (`<alloc8>/<task>/<rand8>`) are not Drover task ids (no `/`);
//!   the driver sees [`drover_task_id`] of them, and every reply names Nomad's id.
//! - Logs: Nomad's stdout/stderr paths are FIFOs its `logmon` reads; the spec gets them
//!   with [`LogMode::Direct`].
//! - Task handles: Nomad's handle is `{version 1, config: the TaskConfig as Nomad gave
//!   it, state, driver_state: the driver's TaskHandle as JSON}`; RecoverTask decodes it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use drover_proto::nomad::{base as nb, drivers as nd, hclspec, structs as ns};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{BoxStream, MAX_MESSAGE_SIZE, contained, contained_sync};
use crate::driver::DriverPlugin;
use crate::signal::Signal;
use crate::types::{
    AgentInfo, Capabilities, ExitResult, Fingerprint, FsIsolation, Health, LogConfig, LogMode,
    Resources, TaskDevice, TaskHandle, TaskMount, TaskPort, TaskSpec, TaskState, TaskStats,
    TaskStatus, from_duration, to_timestamp, validate_task_id,
};
use crate::{DriverError, TaskEvent};

use crate::nomad::hclspec as hcl;

/// The plugin API versions a Nomad 1.0 agent accepts for a driver (its loader's
/// `drivers.ApiVersion010`).
///
/// ```
/// assert_eq!(drover_plugin_sdk::server::NOMAD_PLUGIN_API_VERSIONS, ["v0.1.0"]);
/// ```
pub const NOMAD_PLUGIN_API_VERSIONS: &[&str] = &["v0.1.0"];

/// Version of the task handles this SDK gives a Nomad agent (see the module docs).
const NOMAD_HANDLE_VERSION: i32 = 1;

/// The Drover task id the driver sees for Nomad's task id `nomad_id`. An id that is a
/// valid Drover id already is kept; any other (every Nomad id: it holds `/`) has each
/// character outside `[A-Za-z0-9_.-]` replaced by `.`, is cut to 100 characters, and
/// gets `-` and 16 hex digits of a hash of the whole id, so two ids never meet.
///
/// ```
/// use drover_plugin_sdk::server::drover_task_id;
/// let id = drover_task_id("5f2c9a1b/web/0a1b2c3d");
/// assert!(id.starts_with("5f2c9a1b.web.0a1b2c3d-"));
/// assert!(drover_plugin_sdk::validate_task_id(&id).is_ok());
/// assert_ne!(drover_task_id("a/b"), drover_task_id("a.b"));
/// assert_eq!(drover_task_id("a.b"), "a.b");
/// ```
pub fn drover_task_id(nomad_id: &str) -> String {
    if validate_task_id(nomad_id).is_ok() {
        return nomad_id.to_owned();
    }
    let clean: String = nomad_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '.'
            }
        })
        .take(100)
        .collect();
    // FNV-1a: stable across builds and platforms, which the ids must be (a recovered
    // task is looked up by it).
    let hash = nomad_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{clean}-{hash:016x}")
}

/// The parts of a Nomad task's identity that replies and events carry.
#[derive(Debug, Clone, Default)]
struct NomadTask {
    id: String,
    name: String,
    alloc_id: String,
}

/// Nomad's task ids by the Drover ids the driver knows them by.
#[derive(Default)]
struct Tasks(Mutex<HashMap<String, NomadTask>>);

impl Tasks {
    fn remember(&self, drover_id: String, task: NomadTask) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(drover_id, task);
    }
    fn forget(&self, drover_id: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(drover_id);
    }
    fn nomad(&self, drover_id: &str) -> Option<NomadTask> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(drover_id)
            .cloned()
    }
}

/// Add Nomad's BasePlugin and Driver services over `driver` to `router`.
pub(crate) fn add_services<D: DriverPlugin>(
    router: tonic::transport::server::Router,
    driver: Arc<D>,
    stop: CancellationToken,
) -> tonic::transport::server::Router {
    let tasks = Arc::new(Tasks::default());
    router
        .add_service(
            nb::base_plugin_server::BasePluginServer::new(NomadBase::<_, AsDriver>::new(
                driver.clone(),
            ))
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
        .add_service(
            nd::driver_server::DriverServer::new(NomadDriver {
                driver,
                stop,
                tasks,
            })
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
}

/// The hclspec of `T`'s JSON Schema; a schema with no hclspec form is the plugin's
/// fault, answered as INTERNAL naming where in the schema.
pub(super) fn spec_of<T: schemars::JsonSchema>(what: &str) -> Result<hclspec::Spec, Status> {
    let schema = serde_json::to_value(schemars::schema_for!(T))
        .map_err(|e| Status::internal(format!("{what} schema: {e}")))?;
    hcl::from_json_schema(&schema).map_err(|e| {
        Status::internal(format!(
            "the {what} schema has no Nomad hclspec form at {}: {}",
            e.path, e.message
        ))
    })
}

/// A config Nomad sent as msgpack (empty: none), as the JSON the driver's serde type
/// reads. Nomad sends every attribute of the spec, null when the user left it out:
/// those are dropped, so serde's defaults apply as they do under a Drover agent.
pub(super) fn decode_config(what: &str, msgpack: &[u8]) -> Result<serde_json::Value, DriverError> {
    if msgpack.is_empty() {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    let value = hcl::decode_msgpack(msgpack)
        .map_err(|e| DriverError::InvalidConfig(format!("{what} at {}: {}", e.path, e.message)))?;
    Ok(strip_nulls(value))
}

fn strip_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(strip_nulls).collect())
        }
        other => other,
    }
}

pub(super) fn typed<T: serde::de::DeserializeOwned>(
    what: &str,
    value: serde_json::Value,
) -> Result<T, DriverError> {
    serde_json::from_value(value).map_err(|e| DriverError::InvalidConfig(format!("{what}: {e}")))
}

/// What Nomad's `BasePlugin` service asks of a plugin, drivers and device plugins
/// alike: its identity, its config's schema, and the config itself. `K` tells the
/// two blanket implementations apart ([`AsDriver`], [`crate::server::device::AsDevice`]).
pub(super) trait NomadBased<K>: Send + Sync + 'static {
    type Config: serde::de::DeserializeOwned + schemars::JsonSchema + Send;
    /// The plugin type `PluginInfo` reports.
    const TYPE: nb::PluginType;
    /// The plugin API versions it offers.
    const API_VERSIONS: &'static [&'static str];
    fn info(&self) -> crate::PluginInfo;
    fn set_config(
        &self,
        config: Self::Config,
        agent: AgentInfo,
    ) -> impl std::future::Future<Output = Result<(), DriverError>> + Send;
}

/// [`NomadBased`] for a [`DriverPlugin`].
pub(super) enum AsDriver {}

impl<D: DriverPlugin> NomadBased<AsDriver> for D {
    type Config = D::Config;
    const TYPE: nb::PluginType = nb::PluginType::Driver;
    const API_VERSIONS: &'static [&'static str] = NOMAD_PLUGIN_API_VERSIONS;
    fn info(&self) -> crate::PluginInfo {
        DriverPlugin::info(self)
    }
    fn set_config(
        &self,
        config: Self::Config,
        agent: AgentInfo,
    ) -> impl std::future::Future<Output = Result<(), DriverError>> + Send {
        DriverPlugin::set_config(self, config, agent)
    }
}

/// Nomad's `BasePlugin` over a plugin `P` of kind `K`.
pub(super) struct NomadBase<P, K>(pub(super) Arc<P>, std::marker::PhantomData<fn() -> K>);

impl<P, K> NomadBase<P, K> {
    pub(super) fn new(plugin: Arc<P>) -> Self {
        NomadBase(plugin, std::marker::PhantomData)
    }
}

#[tonic::async_trait]
impl<K: 'static, P: NomadBased<K>> nb::base_plugin_server::BasePlugin for NomadBase<P, K> {
    async fn plugin_info(
        &self,
        _: Request<nb::PluginInfoRequest>,
    ) -> Result<Response<nb::PluginInfoResponse>, Status> {
        let info = contained_sync("PluginInfo", || self.0.info())?;
        Ok(Response::new(nb::PluginInfoResponse {
            r#type: P::TYPE as i32,
            plugin_api_versions: P::API_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
            plugin_version: info.version,
            name: info.name,
        }))
    }

    async fn config_schema(
        &self,
        _: Request<nb::ConfigSchemaRequest>,
    ) -> Result<Response<nb::ConfigSchemaResponse>, Status> {
        Ok(Response::new(nb::ConfigSchemaResponse {
            spec: Some(spec_of::<P::Config>("plugin config")?),
        }))
    }

    async fn set_config(
        &self,
        req: Request<nb::SetConfigRequest>,
    ) -> Result<Response<nb::SetConfigResponse>, Status> {
        let req = req.into_inner();
        let config: P::Config = typed(
            "plugin config",
            decode_config("plugin config", &req.msgpack_config)?,
        )?;
        // Nomad tells a plugin neither where allocations live (each TaskConfig says)
        // nor a state directory: the plugin picks its own (the executors' fallback).
        let info = AgentInfo::new(req.plugin_api_version);
        contained("SetConfig", self.0.set_config(config, info)).await??;
        Ok(Response::new(nb::SetConfigResponse {}))
    }
}

struct NomadDriver<D> {
    driver: Arc<D>,
    stop: CancellationToken,
    tasks: Arc<Tasks>,
}

/// Nomad's TaskConfig as the [`TaskSpec`] a driver gets (without the driver config).
fn task_spec(cfg: &nd::TaskConfig) -> TaskSpec {
    let alloc = PathBuf::from(&cfg.alloc_dir);
    let resources = cfg.resources.clone().unwrap_or_default();
    let allocated = resources.allocated_resources.unwrap_or_default();
    let linux = resources.linux_resources.unwrap_or_default();
    let memory = allocated.memory.unwrap_or_default();
    let cpu_shares = allocated.cpu.map_or(linux.cpu_shares, |c| c.cpu_shares);
    let memory_mb = if memory.memory_mb > 0 {
        memory.memory_mb
    } else {
        linux.memory_limit_bytes / (1024 * 1024)
    };
    let mut spec = TaskSpec::new(drover_task_id(&cfg.id))
        .with_name(cfg.name.clone())
        .with_envs(cfg.env.clone())
        .with_resources(
            Resources::default()
                .with_cpu_shares(cpu_shares)
                .with_memory_mb(memory_mb)
                .with_memory_max_mb(memory.memory_max_mb),
        )
        .with_user(cfg.user.clone())
        .with_stdout_path(cfg.stdout_path.clone())
        .with_stderr_path(cfg.stderr_path.clone())
        .with_logs(LogConfig::default().with_mode(LogMode::Direct))
        .with_ports(ports_from_nomad(&resources.ports))
        .with_devices(cfg.devices.iter().map(|d| {
            TaskDevice::new(&d.host_path, &d.task_path).with_permissions(&d.cgroup_permissions)
        }))
        .with_mounts(
            cfg.mounts
                .iter()
                .map(|m| TaskMount::new(&m.host_path, &m.task_path).with_read_only(m.readonly)),
        );
    if !cfg.alloc_dir.is_empty() {
        spec = spec
            .with_task_dir(alloc.join(&cfg.name))
            .with_alloc_dir(alloc.join("alloc"));
    }
    // Nomad's group isolation: the allocation's namespace, which the task joins.
    if let Some(iso) = &cfg.network_isolation_spec
        && iso.mode == nd::network_isolation_spec::NetworkIsolationMode::Group as i32
        && !iso.path.is_empty()
    {
        spec = spec.with_netns_path(iso.path.clone());
    }
    spec
}

/// Nomad's port mappings as the task's ports; a number that is no port (Nomad's `to`
/// of -1 means "the same port") is 0, so the same.
fn ports_from_nomad(ports: &[nd::PortMapping]) -> Vec<TaskPort> {
    ports
        .iter()
        .filter_map(|p| {
            let value = u16::try_from(p.value).ok()?;
            let to = u16::try_from(p.to).unwrap_or(0);
            Some(
                TaskPort::new(p.label.clone(), value)
                    .with_to(to)
                    .with_host_ip(p.host_ip.clone()),
            )
        })
        .collect()
}

fn nomad_task(cfg: &nd::TaskConfig) -> NomadTask {
    NomadTask {
        id: cfg.id.clone(),
        name: cfg.name.clone(),
        alloc_id: cfg.alloc_id.clone(),
    }
}

fn nomad_state(s: TaskState) -> i32 {
    (match s {
        TaskState::Unknown => nd::TaskState::Unknown,
        TaskState::Running => nd::TaskState::Running,
        TaskState::Exited => nd::TaskState::Exited,
    }) as i32
}

fn nomad_exit(r: &ExitResult) -> nd::ExitResult {
    nd::ExitResult {
        exit_code: r.exit_code,
        signal: r.signal,
        oom_killed: r.oom_killed,
    }
}

fn nomad_capabilities(c: Capabilities) -> nd::DriverCapabilities {
    use nd::network_isolation_spec::NetworkIsolationMode as Mode;
    let mut modes = Vec::new();
    if c.network_modes.host {
        modes.push(Mode::Host as i32);
    }
    if c.network_modes.none {
        modes.push(Mode::None as i32);
    }
    nd::DriverCapabilities {
        send_signals: c.send_signals,
        exec: c.exec,
        fs_isolation: (match c.fs_isolation {
            FsIsolation::None => nd::driver_capabilities::FsIsolation::None,
            FsIsolation::Chroot => nd::driver_capabilities::FsIsolation::Chroot,
            FsIsolation::Image => nd::driver_capabilities::FsIsolation::Image,
        }) as i32,
        network_isolation_modes: {
            if c.network_modes.group {
                // The task joins the namespace its allocation runner made.
                modes.push(Mode::Group as i32);
            }
            modes
        },
        must_create_network: false,
        // A Drover driver gets no volume mounts from Nomad (TaskSpec has none).
        mount_configs: nd::driver_capabilities::MountConfigs::NoMounts as i32,
        remote_tasks: false,
        disable_log_collection: false,
    }
}

/// A Drover attribute value as Nomad's typed attribute: `true`/`false` are booleans,
/// an integer is an integer, anything else a string (a version such as `1.2.3` stays
/// a string; Nomad compares those as versions itself).
fn nomad_attribute(value: String) -> ns::Attribute {
    use ns::attribute::Value;
    let value = match value.as_str() {
        "true" => Value::BoolVal(true),
        "false" => Value::BoolVal(false),
        text => match text.parse::<i64>() {
            Ok(n) => Value::IntVal(n),
            Err(_) => Value::StringVal(value),
        },
    };
    ns::Attribute {
        value: Some(value),
        unit: String::new(),
    }
}

fn nomad_fingerprint(fp: Fingerprint) -> nd::FingerprintResponse {
    use nd::fingerprint_response::HealthState;
    nd::FingerprintResponse {
        attributes: fp
            .attributes
            .into_iter()
            .map(|(k, v)| (k, nomad_attribute(v)))
            .collect(),
        health: (match fp.health {
            Health::Undetected => HealthState::Undetected,
            Health::Unhealthy => HealthState::Unhealthy,
            Health::Healthy => HealthState::Healthy,
        }) as i32,
        health_description: fp.description,
    }
}

fn nomad_stats(nomad_id: String, s: TaskStats) -> nd::TaskStatsResponse {
    use nd::cpu_usage::Fields as CpuFields;
    use nd::memory_usage::Fields as MemFields;
    let mut mem_fields = vec![MemFields::Rss as i32];
    if s.memory_cache_bytes > 0 {
        mem_fields.push(MemFields::Cache as i32);
    }
    let usage = nd::TaskResourceUsage {
        cpu: Some(nd::CpuUsage {
            percent: s.cpu_percent,
            measured_fields: vec![CpuFields::Percent as i32],
            ..Default::default()
        }),
        memory: Some(nd::MemoryUsage {
            rss: s.memory_rss_bytes,
            cache: s.memory_cache_bytes,
            measured_fields: mem_fields,
            ..Default::default()
        }),
    };
    nd::TaskStatsResponse {
        stats: Some(nd::TaskStats {
            id: nomad_id,
            timestamp: Some(to_timestamp(SystemTime::now())),
            agg_resource_usage: Some(usage),
            resource_usage_by_pid: Default::default(),
        }),
    }
}

fn nomad_handle(cfg: nd::TaskConfig, handle: &TaskHandle) -> Result<nd::TaskHandle, Status> {
    Ok(nd::TaskHandle {
        version: NOMAD_HANDLE_VERSION,
        state: nomad_state(handle.state),
        driver_state: serde_json::to_vec(handle)
            .map_err(|e| Status::internal(format!("cannot encode the task handle: {e}")))?,
        config: Some(cfg),
    })
}

#[tonic::async_trait]
impl<D: DriverPlugin> nd::driver_server::Driver for NomadDriver<D> {
    async fn task_config_schema(
        &self,
        _: Request<nd::TaskConfigSchemaRequest>,
    ) -> Result<Response<nd::TaskConfigSchemaResponse>, Status> {
        Ok(Response::new(nd::TaskConfigSchemaResponse {
            spec: Some(spec_of::<D::TaskConfig>("task config")?),
        }))
    }

    async fn capabilities(
        &self,
        _: Request<nd::CapabilitiesRequest>,
    ) -> Result<Response<nd::CapabilitiesResponse>, Status> {
        let caps = contained_sync("Capabilities", || self.driver.capabilities())?;
        Ok(Response::new(nd::CapabilitiesResponse {
            capabilities: Some(nomad_capabilities(caps)),
        }))
    }

    type FingerprintStream = BoxStream<nd::FingerprintResponse>;

    async fn fingerprint(
        &self,
        _: Request<nd::FingerprintRequest>,
    ) -> Result<Response<Self::FingerprintStream>, Status> {
        Ok(Response::new(super::fingerprint_stream(
            self.driver.clone(),
            self.stop.clone(),
            nomad_fingerprint,
        )))
    }

    async fn recover_task(
        &self,
        req: Request<nd::RecoverTaskRequest>,
    ) -> Result<Response<nd::RecoverTaskResponse>, Status> {
        let req = req.into_inner();
        let handle = req
            .handle
            .ok_or_else(|| Status::invalid_argument("RecoverTask without a handle"))?;
        let cfg = handle.config.unwrap_or_default();
        let nomad_id = if cfg.id.is_empty() {
            req.task_id
        } else {
            cfg.id.clone()
        };
        let drover = if handle.driver_state.is_empty() {
            // Nomad never got StartTask's reply: find the task by its id.
            let mut spec = task_spec(&cfg);
            spec.id = drover_task_id(&nomad_id);
            TaskHandle::for_spec(spec)
        } else {
            serde_json::from_slice::<TaskHandle>(&handle.driver_state).map_err(|e| {
                Status::invalid_argument(format!(
                    "task {nomad_id}: the handle's driver_state is not a task handle made by \
                     this SDK: {e}"
                ))
            })?
        };
        validate_task_id(&drover.spec.id)?;
        let drover_id = drover.spec.id.clone();
        contained("RecoverTask", self.driver.recover_task(drover)).await??;
        self.tasks.remember(
            drover_id,
            NomadTask {
                id: nomad_id,
                ..nomad_task(&cfg)
            },
        );
        Ok(Response::new(nd::RecoverTaskResponse {}))
    }

    async fn start_task(
        &self,
        req: Request<nd::StartTaskRequest>,
    ) -> Result<Response<nd::StartTaskResponse>, Status> {
        let cfg = req
            .into_inner()
            .task
            .ok_or_else(|| Status::invalid_argument("StartTask without a task"))?;
        let json = decode_config("task config", &cfg.msgpack_driver_config)?;
        let mut spec = task_spec(&cfg);
        spec.driver_config_json = json.to_string();
        validate_task_id(&spec.id)?;
        let config: D::TaskConfig = typed("task config", json)?;
        let drover_id = spec.id.clone();
        self.tasks.remember(drover_id.clone(), nomad_task(&cfg));
        let handle = match contained("StartTask", self.driver.start_task(spec, config)).await? {
            Ok(h) => h,
            Err(e) => {
                self.tasks.forget(&drover_id);
                return Err(e.into());
            }
        };
        Ok(Response::new(nd::StartTaskResponse {
            result: nd::start_task_response::Result::Success as i32,
            driver_error_msg: String::new(),
            handle: Some(nomad_handle(cfg, &handle)?),
            network_override: None,
        }))
    }

    async fn wait_task(
        &self,
        req: Request<nd::WaitTaskRequest>,
    ) -> Result<Response<nd::WaitTaskResponse>, Status> {
        let id = drover_task_id(&req.into_inner().task_id);
        let result = contained("WaitTask", self.driver.wait_task(&id)).await??;
        Ok(Response::new(nd::WaitTaskResponse {
            result: Some(nomad_exit(&result)),
            err: result.err.unwrap_or_default(),
        }))
    }

    async fn stop_task(
        &self,
        req: Request<nd::StopTaskRequest>,
    ) -> Result<Response<nd::StopTaskResponse>, Status> {
        let req = req.into_inner();
        let id = drover_task_id(&req.task_id);
        let timeout = from_duration(req.timeout).unwrap_or(Duration::from_secs(5));
        let signal = Signal::parse_or_default(&req.signal).map_err(DriverError::from)?;
        contained("StopTask", self.driver.stop_task(&id, timeout, signal)).await??;
        Ok(Response::new(nd::StopTaskResponse {}))
    }

    async fn destroy_task(
        &self,
        req: Request<nd::DestroyTaskRequest>,
    ) -> Result<Response<nd::DestroyTaskResponse>, Status> {
        let req = req.into_inner();
        let id = drover_task_id(&req.task_id);
        contained("DestroyTask", self.driver.destroy_task(&id, req.force)).await??;
        self.tasks.forget(&id);
        Ok(Response::new(nd::DestroyTaskResponse {}))
    }

    async fn inspect_task(
        &self,
        req: Request<nd::InspectTaskRequest>,
    ) -> Result<Response<nd::InspectTaskResponse>, Status> {
        let nomad_id = req.into_inner().task_id;
        let id = drover_task_id(&nomad_id);
        let status: TaskStatus = contained("InspectTask", self.driver.inspect_task(&id)).await??;
        Ok(Response::new(nd::InspectTaskResponse {
            task: Some(nd::TaskStatus {
                id: nomad_id,
                name: status.name,
                state: nomad_state(status.state),
                started_at: status.started_at.map(to_timestamp),
                completed_at: status.completed_at.map(to_timestamp),
                result: status.exit_result.as_ref().map(nomad_exit),
            }),
            driver: Some(nd::TaskDriverStatus {
                attributes: status.attributes.into_iter().collect(),
            }),
            network_override: None,
        }))
    }

    type TaskStatsStream = BoxStream<nd::TaskStatsResponse>;

    async fn task_stats(
        &self,
        req: Request<nd::TaskStatsRequest>,
    ) -> Result<Response<Self::TaskStatsStream>, Status> {
        let req = req.into_inner();
        let interval = from_duration(req.collection_interval).unwrap_or(Duration::from_secs(1));
        let nomad_id = req.task_id;
        let id = drover_task_id(&nomad_id);
        let stream = super::stats_stream(self.driver.clone(), id, interval, move |s| {
            nomad_stats(nomad_id.clone(), s)
        })
        .await?;
        Ok(Response::new(stream))
    }

    type TaskEventsStream = BoxStream<nd::DriverTaskEvent>;

    async fn task_events(
        &self,
        _: Request<nd::TaskEventsRequest>,
    ) -> Result<Response<Self::TaskEventsStream>, Status> {
        let tasks = self.tasks.clone();
        let stream = super::events_stream(self.driver.as_ref(), move |e: TaskEvent| {
            let task = tasks.nomad(&e.task_id).unwrap_or_else(|| NomadTask {
                id: e.task_id.clone(),
                ..Default::default()
            });
            nd::DriverTaskEvent {
                task_id: task.id,
                alloc_id: task.alloc_id,
                task_name: task.name,
                timestamp: Some(to_timestamp(e.timestamp)),
                message: e.message,
                annotations: e.annotations.into_iter().collect(),
            }
        })?;
        Ok(Response::new(stream))
    }

    async fn signal_task(
        &self,
        req: Request<nd::SignalTaskRequest>,
    ) -> Result<Response<nd::SignalTaskResponse>, Status> {
        let req = req.into_inner();
        let id = drover_task_id(&req.task_id);
        let signal = Signal::parse_or_default(&req.signal).map_err(DriverError::from)?;
        contained("SignalTask", self.driver.signal_task(&id, signal)).await??;
        Ok(Response::new(nd::SignalTaskResponse {}))
    }

    async fn exec_task(
        &self,
        req: Request<nd::ExecTaskRequest>,
    ) -> Result<Response<nd::ExecTaskResponse>, Status> {
        let req = req.into_inner();
        if req.command.is_empty() {
            return Err(Status::invalid_argument("ExecTask needs a command"));
        }
        let id = drover_task_id(&req.task_id);
        let timeout = from_duration(req.timeout).unwrap_or(Duration::from_secs(60));
        let out = contained("ExecTask", self.driver.exec_task(&id, req.command, timeout)).await??;
        Ok(Response::new(nd::ExecTaskResponse {
            stdout: out.stdout,
            stderr: out.stderr,
            result: Some(nomad_exit(&out.result)),
        }))
    }

    type ExecTaskStreamingStream = BoxStream<nd::ExecTaskStreamingResponse>;

    async fn exec_task_streaming(
        &self,
        req: Request<tonic::Streaming<nd::ExecTaskStreamingRequest>>,
    ) -> Result<Response<Self::ExecTaskStreamingStream>, Status> {
        use crate::types::{ExecChunk, ExecInput, TerminalSize};
        let mut inbound = req.into_inner();
        // Nomad's first message is the setup; sizes and stdin may ride on any message.
        let Some(first) = inbound.message().await? else {
            return Err(Status::invalid_argument("ExecTaskStreaming: no setup"));
        };
        let Some(setup) = first.setup.clone() else {
            return Err(Status::invalid_argument(
                "ExecTaskStreaming: the first message must carry the setup",
            ));
        };
        if setup.command.is_empty() {
            return Err(Status::invalid_argument(
                "ExecTaskStreaming needs a command",
            ));
        }
        let inputs_of = |m: nd::ExecTaskStreamingRequest| -> Vec<ExecInput> {
            let mut v = Vec::new();
            if let Some(size) = m.tty_size {
                v.push(ExecInput::Resize(TerminalSize {
                    rows: u16::try_from(size.height.max(0)).unwrap_or(u16::MAX),
                    cols: u16::try_from(size.width.max(0)).unwrap_or(u16::MAX),
                }));
            }
            if let Some(stdin) = m.stdin {
                if !stdin.data.is_empty() {
                    v.push(ExecInput::Stdin(stdin.data));
                }
                if stdin.close {
                    v.push(ExecInput::StdinClosed);
                }
            }
            v
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let first_inputs = inputs_of(first);
        tokio::spawn(async move {
            for i in first_inputs {
                if tx.send(i).await.is_err() {
                    return;
                }
            }
            while let Ok(Some(m)) = inbound.message().await {
                for i in inputs_of(m) {
                    if tx.send(i).await.is_err() {
                        return;
                    }
                }
            }
        });
        let op = |data: Vec<u8>| Some(nd::ExecTaskStreamingIoOperation { data, close: false });
        Ok(Response::new(super::exec_session_stream(
            self.driver.clone(),
            drover_task_id(&setup.task_id),
            setup.command,
            setup.tty,
            rx,
            move |chunk| match chunk {
                ExecChunk::Stdout(d) => nd::ExecTaskStreamingResponse {
                    stdout: op(d),
                    ..Default::default()
                },
                ExecChunk::Stderr(d) => nd::ExecTaskStreamingResponse {
                    stderr: op(d),
                    ..Default::default()
                },
            },
            |result| nd::ExecTaskStreamingResponse {
                exited: true,
                result: Some(nomad_exit(&result)),
                ..Default::default()
            },
        )))
    }

    async fn create_network(
        &self,
        _: Request<nd::CreateNetworkRequest>,
    ) -> Result<Response<nd::CreateNetworkResponse>, Status> {
        Err(Status::unimplemented(
            "CreateNetwork: drivers built on drover-plugin-sdk do not create Nomad group networks",
        ))
    }

    async fn destroy_network(
        &self,
        _: Request<nd::DestroyNetworkRequest>,
    ) -> Result<Response<nd::DestroyNetworkResponse>, Status> {
        Err(Status::unimplemented(
            "DestroyNetwork: drivers built on drover-plugin-sdk do not create Nomad group networks",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EmptyConfig, PluginInfo};
    use nd::driver_server::Driver as _;
    use std::path::Path;

    /// A driver that runs nothing: it keeps the specs and configs it was given, and its
    /// tasks "exit" with code 3 at once.
    #[derive(Default)]
    struct Recorder {
        started: Mutex<Vec<(TaskSpec, RecTaskConfig)>>,
        recovered: Mutex<Vec<TaskHandle>>,
    }

    #[derive(Debug, Clone, PartialEq, serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct RecTaskConfig {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        cwd: Option<String>,
    }

    impl DriverPlugin for Recorder {
        type Config = EmptyConfig;
        type TaskConfig = RecTaskConfig;
        fn info(&self) -> PluginInfo {
            PluginInfo::new("recorder", "0.3.0")
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
                .with_send_signals(true)
                .with_network_modes(crate::NetworkModes::default().with_host(true))
        }
        async fn fingerprint(&self) -> Fingerprint {
            Fingerprint::healthy("ready")
                .attribute("driver.recorder.version", "0.3.0")
                .attribute("driver.recorder.cgroups", "true")
                .attribute("driver.recorder.slots", "4")
        }
        async fn start_task(
            &self,
            spec: TaskSpec,
            cfg: RecTaskConfig,
        ) -> Result<TaskHandle, DriverError> {
            self.started.lock().unwrap().push((spec.clone(), cfg));
            TaskHandle::new(spec, 7, &serde_json::json!({"pid": 42}))
        }
        async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError> {
            if self.started.lock().unwrap().iter().any(|(s, _)| s.id == id) {
                Ok(ExitResult::code(3))
            } else {
                Err(DriverError::NotFound(id.into()))
            }
        }
        async fn stop_task(&self, _: &str, _: Duration, _: Signal) -> Result<(), DriverError> {
            Ok(())
        }
        async fn destroy_task(&self, _: &str, _: bool) -> Result<(), DriverError> {
            Ok(())
        }
        async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
            Ok(TaskStatus::new(id, TaskState::Exited)
                .with_exit_result(ExitResult::code(3))
                .with_attribute("pid", "42"))
        }
        async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
            self.recovered.lock().unwrap().push(handle);
            Ok(())
        }
    }

    fn service() -> NomadDriver<Recorder> {
        NomadDriver {
            driver: Arc::new(Recorder::default()),
            stop: CancellationToken::new(),
            tasks: Arc::default(),
        }
    }

    /// msgpack of a map of strings to msgpack values (enough for these tests).
    fn msgpack_map(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = vec![0x80 | u8::try_from(entries.len()).unwrap()];
        for (k, v) in entries {
            out.extend(msgpack_str(k));
            out.extend(v);
        }
        out
    }

    fn msgpack_str(s: &str) -> Vec<u8> {
        let mut out = vec![0xa0 | u8::try_from(s.len()).unwrap()];
        out.extend(s.as_bytes());
        out
    }

    fn nomad_task_config() -> nd::TaskConfig {
        nd::TaskConfig {
            id: "5f2c9a1b/hello/0a1b2c3d".into(),
            name: "hello".into(),
            alloc_id: "5f2c9a1b-0000-0000-0000-000000000000".into(),
            alloc_dir: "/var/nomad/alloc/5f2c9a1b".into(),
            stdout_path: "/var/nomad/alloc/5f2c9a1b/alloc/logs/.hello.stdout.fifo".into(),
            stderr_path: "/var/nomad/alloc/5f2c9a1b/alloc/logs/.hello.stderr.fifo".into(),
            env: [("NOMAD_TASK_NAME".to_owned(), "hello".to_owned())].into(),
            resources: Some(nd::Resources {
                allocated_resources: Some(nd::AllocatedTaskResources {
                    cpu: Some(nd::AllocatedCpuResources { cpu_shares: 100 }),
                    memory: Some(nd::AllocatedMemoryResources {
                        memory_mb: 64,
                        memory_max_mb: 128,
                    }),
                    networks: Vec::new(),
                }),
                ports: vec![
                    nd::PortMapping {
                        label: "http".into(),
                        value: 23456,
                        to: 80,
                        host_ip: "127.0.0.1".into(),
                    },
                    nd::PortMapping {
                        label: "same".into(),
                        value: 23457,
                        to: -1,
                        host_ip: "127.0.0.1".into(),
                    },
                ],
                ..Default::default()
            }),
            msgpack_driver_config: msgpack_map(&[
                ("command", msgpack_str("/bin/sh")),
                (
                    "args",
                    [vec![0x92], msgpack_str("-c"), msgpack_str("exit 3")].concat(),
                ),
                // Nomad sends an attribute the job left out as nil.
                ("cwd", vec![0xc0]),
            ]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn start_task_gives_the_driver_a_drover_spec_and_nomad_a_handle_it_can_recover() {
        let svc = service();
        let cfg = nomad_task_config();
        let resp = svc
            .start_task(Request::new(nd::StartTaskRequest {
                task: Some(cfg.clone()),
            }))
            .await
            .unwrap()
            .into_inner();
        let (spec, task_config) = svc.driver.started.lock().unwrap()[0].clone();
        assert_eq!(
            task_config,
            RecTaskConfig {
                command: "/bin/sh".into(),
                args: vec!["-c".into(), "exit 3".into()],
                cwd: None
            }
        );
        assert_eq!(spec.id, drover_task_id(&cfg.id));
        assert_eq!(spec.name, "hello");
        assert_eq!(spec.env["NOMAD_TASK_NAME"], "hello");
        assert_eq!(
            (
                spec.resources.cpu_shares,
                spec.resources.memory_mb,
                spec.resources.memory_max_mb
            ),
            (100, 64, 128)
        );
        assert_eq!(spec.task_dir, Path::new("/var/nomad/alloc/5f2c9a1b/hello"));
        assert_eq!(spec.alloc_dir, Path::new("/var/nomad/alloc/5f2c9a1b/alloc"));
        // Nomad's shared ports reach the driver; its `to = -1` is "the same port".
        assert_eq!(
            spec.ports,
            [
                TaskPort::new("http", 23456)
                    .with_to(80)
                    .with_host_ip("127.0.0.1"),
                TaskPort::new("same", 23457).with_host_ip("127.0.0.1"),
            ]
        );
        assert_eq!(spec.stdout_path, Path::new(&cfg.stdout_path));
        assert_eq!(
            spec.logs.mode,
            LogMode::Direct,
            "Nomad's FIFOs are written as they are"
        );
        let json: serde_json::Value = serde_json::from_str(&spec.driver_config_json).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"command": "/bin/sh", "args": ["-c", "exit 3"]})
        );

        let handle = resp.handle.unwrap();
        assert_eq!(handle.version, 1);
        assert_eq!(
            handle.config.as_ref(),
            Some(&cfg),
            "the TaskConfig as Nomad gave it"
        );
        assert_eq!(handle.state, nd::TaskState::Running as i32);

        // WaitTask and InspectTask by Nomad's id.
        let wait = svc
            .wait_task(Request::new(nd::WaitTaskRequest {
                task_id: cfg.id.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(wait.result.unwrap().exit_code, 3);
        let inspect = svc
            .inspect_task(Request::new(nd::InspectTaskRequest {
                task_id: cfg.id.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(inspect.task.as_ref().unwrap().id, cfg.id);
        assert_eq!(inspect.task.unwrap().result.unwrap().exit_code, 3);
        assert_eq!(inspect.driver.unwrap().attributes["pid"], "42");

        // A fresh plugin recovers the task from Nomad's handle: the driver's own handle.
        let fresh = service();
        fresh
            .recover_task(Request::new(nd::RecoverTaskRequest {
                task_id: cfg.id.clone(),
                handle: Some(handle),
            }))
            .await
            .unwrap();
        let recovered = fresh.driver.recovered.lock().unwrap()[0].clone();
        assert_eq!(recovered.version, 7);
        assert_eq!(recovered.spec, spec);
        assert_eq!(
            recovered.decode_state::<serde_json::Value>(7).unwrap(),
            serde_json::json!({"pid": 42})
        );
    }

    #[tokio::test]
    async fn bad_task_configs_and_handles_are_refused_with_what_is_wrong() {
        let svc = service();
        let mut cfg = nomad_task_config();
        cfg.msgpack_driver_config = msgpack_map(&[("comand", msgpack_str("/bin/sh"))]);
        let err = svc
            .start_task(Request::new(nd::StartTaskRequest { task: Some(cfg) }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("comand"), "{}", err.message());
        assert!(svc.driver.started.lock().unwrap().is_empty());

        let err = svc
            .recover_task(Request::new(nd::RecoverTaskRequest {
                task_id: "x/y/z".into(),
                handle: Some(nd::TaskHandle {
                    version: 1,
                    driver_state: b"garbage".to_vec(),
                    ..Default::default()
                }),
            }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("x/y/z"), "{}", err.message());
    }

    #[tokio::test]
    async fn plugin_info_schema_capabilities_and_fingerprint_are_nomads() {
        use nb::base_plugin_server::BasePlugin as _;
        let base = NomadBase::<_, AsDriver>::new(Arc::new(Recorder::default()));
        let info = base
            .plugin_info(Request::new(nb::PluginInfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.r#type, nb::PluginType::Driver as i32);
        assert_eq!(info.plugin_api_versions, ["v0.1.0"]);
        assert_eq!(
            (info.name.as_str(), info.plugin_version.as_str()),
            ("recorder", "0.3.0")
        );
        // No config block: empty msgpack is an empty config.
        base.set_config(Request::new(nb::SetConfigRequest::default()))
            .await
            .unwrap();
        let err = base
            .set_config(Request::new(nb::SetConfigRequest {
                msgpack_config: msgpack_map(&[("x", vec![0x01])]),
                ..Default::default()
            }))
            .await
            .unwrap_err();
        assert!(err.message().contains('x'), "{}", err.message());

        let svc = service();
        let spec = svc
            .task_config_schema(Request::new(nd::TaskConfigSchemaRequest {}))
            .await
            .unwrap()
            .into_inner()
            .spec
            .unwrap();
        let Some(hclspec::spec::Block::Object(obj)) = spec.block else {
            panic!("not an object spec: {spec:?}");
        };
        let Some(hclspec::spec::Block::Attr(command)) = &obj.attributes["command"].block else {
            panic!("{obj:?}");
        };
        assert_eq!(
            (command.r#type.as_str(), command.required),
            ("string", true)
        );

        let caps = svc
            .capabilities(Request::new(nd::CapabilitiesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .unwrap();
        assert!(caps.send_signals && !caps.exec);
        assert_eq!(
            caps.network_isolation_modes,
            [nd::network_isolation_spec::NetworkIsolationMode::Host as i32]
        );

        use tokio_stream::StreamExt as _;
        let mut fps = svc
            .fingerprint(Request::new(nd::FingerprintRequest {}))
            .await
            .unwrap()
            .into_inner();
        let fp = fps.next().await.unwrap().unwrap();
        assert_eq!(
            fp.health,
            nd::fingerprint_response::HealthState::Healthy as i32
        );
        assert_eq!(fp.health_description, "ready");
        use ns::attribute::Value;
        let attr = |k: &str| fp.attributes[k].value.clone().unwrap();
        assert_eq!(
            attr("driver.recorder.version"),
            Value::StringVal("0.3.0".into())
        );
        assert_eq!(attr("driver.recorder.cgroups"), Value::BoolVal(true));
        assert_eq!(attr("driver.recorder.slots"), Value::IntVal(4));
    }

    #[test]
    fn a_nomad_agents_device_reservation_reaches_the_driver() {
        let mut cfg = nomad_task_config();
        cfg.devices = vec![nd::Device {
            task_path: "/dev/zero0".into(),
            host_path: "/srv/nodes/zero0".into(),
            cgroup_permissions: "rw".into(),
        }];
        cfg.mounts = vec![nd::Mount {
            task_path: "/opt/lib".into(),
            host_path: "/usr/lib/acme".into(),
            readonly: true,
            propagation_mode: String::new(),
        }];
        let spec = task_spec(&cfg);
        assert_eq!(
            spec.devices,
            [TaskDevice::new("/srv/nodes/zero0", "/dev/zero0").with_permissions("rw")]
        );
        assert_eq!(
            spec.mounts,
            [TaskMount::new("/usr/lib/acme", "/opt/lib").with_read_only(true)]
        );
    }

    #[test]
    fn nomad_ids_become_distinct_valid_drover_ids() {
        let a = drover_task_id("5f2c9a1b/web/0a1b2c3d");
        let b = drover_task_id("5f2c9a1b/web/0a1b2c3e");
        assert_ne!(a, b);
        assert_eq!(a, drover_task_id("5f2c9a1b/web/0a1b2c3d"), "stable");
        let long = drover_task_id(&format!("a/{}/b", "x".repeat(300)));
        assert!(validate_task_id(&long).is_ok(), "{long}");
    }
}
