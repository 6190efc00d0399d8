//! The cluster's objects. Field names are what the HTTP API and `--json` output show.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_api::{LogConfig, RestartPolicy};
use serde::{Deserialize, Serialize};

/// A store revision: every committed write gets the next one.
pub type Index = u64;

// ---------------------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------------------

/// How a job's groups are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    /// Long-running: `count` copies are kept running, replaced when lost or failed.
    #[default]
    Service,
    /// Runs to completion: an allocation that completed successfully is not replaced.
    Batch,
    /// One allocation of every group on every feasible node.
    System,
}

impl JobType {
    /// The lowercase name (`service`, `batch`, `system`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Service => "service",
            JobType::Batch => "batch",
            JobType::System => "system",
        }
    }
}

/// A job as a user submits it (the job file, or `PUT /v1/jobs` with `{"job": ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name: its id, `[A-Za-z0-9_.-]{1,128}`, unique within its namespace.
    pub name: String,
    /// The namespace it lives in (`default` when the job file names none).
    #[serde(default = "crate::default_namespace")]
    pub namespace: String,
    /// Scheduler type.
    #[serde(rename = "type", default)]
    pub job_type: JobType,
    /// 1..=100, higher first (default 50).
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// Constraints every group of the job must meet.
    #[serde(default, rename = "constraint", alias = "constraints")]
    pub constraints: Vec<Constraint>,
    /// How a changed job replaces its allocations.
    #[serde(default)]
    pub update: UpdateStrategy,
    /// Free-form metadata.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// Datacenters the job may be placed in, glob patterns (`dc1`, `eu-*`, `*`);
    /// empty: every datacenter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
    /// The task groups (at least one).
    #[serde(rename = "group", alias = "groups")]
    pub groups: Vec<TaskGroup>,
}

fn default_priority() -> u8 {
    50
}

/// How a changed job replaces its allocations (Nomad's `update` block): a
/// deployment replaces at most `max_parallel` allocations of a group at a time and
/// waits for each new one to be healthy (its tasks running, and with
/// `health_check = "checks"` its checks passing, for `min_healthy_time`) before the
/// next; `canary` new copies first wait for a promotion; a deployment that fails
/// (an allocation unhealthy, `healthy_deadline` or `progress_deadline` passed) stops,
/// and with `auto_revert` the job goes back to its last stable version.
///
/// Nomad's defaults: max_parallel 1, health checks, 10s, 5m, 10m, no canary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpdateStrategy {
    /// Allocations replaced at a time (default 1; 0: no deployment, every changed
    /// allocation is replaced at once, health unchecked).
    pub max_parallel: u32,
    /// What makes a new allocation healthy.
    pub health_check: HealthCheckMode,
    /// How long a new allocation must stay healthy to count as healthy.
    #[serde(with = "humantime_serde")]
    pub min_healthy_time: Duration,
    /// A new allocation not healthy by then (from its start) is unhealthy.
    #[serde(with = "humantime_serde")]
    pub healthy_deadline: Duration,
    /// A deployment that made no progress (no allocation turned healthy) for this long
    /// fails (0: never).
    #[serde(with = "humantime_serde")]
    pub progress_deadline: Duration,
    /// New copies placed next to the old ones, waiting for a promotion.
    pub canary: u32,
    /// Promote once every canary is healthy.
    pub auto_promote: bool,
    /// A failed deployment reverts the job to its last stable version.
    pub auto_revert: bool,
    /// Accepted for Nomad's job files: Drover moves a deployment on as soon as an
    /// allocation turns healthy.
    #[serde(with = "humantime_serde")]
    pub stagger: Duration,
}

impl Default for UpdateStrategy {
    fn default() -> Self {
        UpdateStrategy {
            max_parallel: 1,
            health_check: HealthCheckMode::Checks,
            min_healthy_time: Duration::from_secs(10),
            healthy_deadline: Duration::from_secs(5 * 60),
            progress_deadline: Duration::from_secs(10 * 60),
            canary: 0,
            auto_promote: false,
            auto_revert: false,
            stagger: Duration::from_secs(30),
        }
    }
}

impl UpdateStrategy {
    /// Whether a change of the job is rolled out as a deployment (health-gated).
    pub fn deploys(&self) -> bool {
        self.max_parallel > 0
    }
}

/// What makes a new allocation of a deployment healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheckMode {
    /// Every task running and every check of its services passing.
    #[default]
    Checks,
    /// Every task running.
    TaskStates,
    /// Nothing automatic: health is set through the API.
    Manual,
}

impl HealthCheckMode {
    /// The job-file name (`checks`, `task_states`, `manual`).
    pub fn as_str(self) -> &'static str {
        match self {
            HealthCheckMode::Checks => "checks",
            HealthCheckMode::TaskStates => "task_states",
            HealthCheckMode::Manual => "manual",
        }
    }
}

/// A set of tasks placed together on one node: the unit of scheduling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskGroup {
    /// Unique within the job.
    pub name: String,
    /// Copies wanted (service and batch; ignored for system jobs). Default 1.
    #[serde(default = "default_count")]
    pub count: u32,
    /// Constraints on the nodes the group may run on.
    #[serde(default, rename = "constraint", alias = "constraints")]
    pub constraints: Vec<Constraint>,
    /// Free-form metadata.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The tasks (at least one that is not a lifecycle hook).
    #[serde(rename = "task", alias = "tasks")]
    pub tasks: Vec<Task>,
    /// When a failed allocation is replaced (absent: the job type's default, see
    /// [`ReschedulePolicy::default_for`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule: Option<ReschedulePolicy>,
    /// The allocation's network: its mode and the ports it asks for (absent: host
    /// networking, no ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// The group's own update strategy (Nomad's group-level `update`, merged over the
    /// job's field by field when read); absent: the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<UpdateStrategy>,
    /// Services of the group (Nomad's group-level `service` blocks).
    #[serde(
        default,
        rename = "service",
        alias = "services",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub services: Vec<ServiceSpec>,
    /// Volumes the group's tasks may mount, by name (Nomad's group `volume` blocks).
    #[serde(
        default,
        rename = "volume",
        alias = "volumes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub volumes: BTreeMap<String, crate::VolumeRequest>,
}

fn default_count() -> u32 {
    1
}

/// When the server replaces an allocation that failed (Nomad's `reschedule` block):
/// after `delay`, doubling with every consecutive failure up to `max_delay`; at most
/// `attempts` times per `interval` unless `unlimited`. Lost or drained allocations are
/// replaced at once; this is for failures only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReschedulePolicy {
    /// Replacements allowed within `interval` (ignored when `unlimited`).
    #[serde(default)]
    pub attempts: u32,
    /// The window `attempts` counts in.
    #[serde(default, with = "humantime_serde")]
    pub interval: Duration,
    /// Wait before the first replacement.
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    /// Longest wait (the delay doubles per consecutive failure up to this).
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Replace for ever (with the delays).
    #[serde(default)]
    pub unlimited: bool,
}

impl ReschedulePolicy {
    /// Nomad's defaults: service jobs unlimited, 30s doubling to 1h; batch jobs once
    /// per 24h after 5s. System jobs are not rescheduled (their allocation belongs to
    /// its node).
    pub fn default_for(job_type: JobType) -> ReschedulePolicy {
        match job_type {
            JobType::Batch => ReschedulePolicy {
                attempts: 1,
                interval: Duration::from_secs(24 * 3600),
                delay: Duration::from_secs(5),
                max_delay: Duration::from_secs(5),
                unlimited: false,
            },
            JobType::Service | JobType::System => ReschedulePolicy {
                attempts: 0,
                interval: Duration::ZERO,
                delay: Duration::from_secs(30),
                max_delay: Duration::from_secs(3600),
                unlimited: true,
            },
        }
    }
}

impl JobSpec {
    /// The update strategy of `group`: its own, else the job's.
    pub fn update_of(&self, group: &TaskGroup) -> UpdateStrategy {
        group.update.unwrap_or(self.update)
    }
}

impl TaskGroup {
    /// What one allocation of the group asks of a node: the sum of its tasks.
    pub fn resources(&self) -> AllocResources {
        let mut r = AllocResources::default();
        for t in &self.tasks {
            r.cpu += u64::from(t.resources.cpu);
            r.memory_mb += u64::from(t.resources.memory_mb);
        }
        r
    }
}

/// One task of a group: the fields of a `drover task run` spec file, plus `lifecycle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique within the group.
    pub name: String,
    /// Driver name.
    pub driver: String,
    /// Driver-specific config, checked by the driver on the node.
    #[serde(default)]
    pub config: serde_json::Value,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form metadata (over the group's and the job's: `NOMAD_META_*`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Signal sent on stop (default SIGTERM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_signal: Option<String>,
    /// Time between the stop signal and SIGKILL (default 5s).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub kill_timeout: Option<Duration>,
    /// Restarts on the node before the allocation fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicy>,
    /// What the task needs of the node.
    #[serde(default)]
    pub resources: TaskResources,
    /// Log rotation limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogConfig>,
    /// When the task runs within the group (absent: a main task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// Services of the task (Nomad's task-level `service` blocks).
    #[serde(
        default,
        rename = "service",
        alias = "services",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub services: Vec<ServiceSpec>,
    /// Files fetched into the task directory before it starts (Nomad's `artifact`).
    #[serde(
        default,
        rename = "artifact",
        alias = "artifacts",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub artifacts: Vec<ArtifactSpec>,
    /// Files rendered into the task directory before it starts, and again when what
    /// they read changes (Nomad's `template`).
    #[serde(
        default,
        rename = "template",
        alias = "templates",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub templates: Vec<TemplateSpec>,
    /// How the task gets its workload identity token (Nomad's `identity` block);
    /// absent: in `secrets/nomad_token`, not in the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<TaskIdentity>,
    /// Devices the task asks for (Nomad's `resources { device "NAME" { ... } }`).
    #[serde(
        default,
        rename = "device",
        alias = "devices",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub devices: Vec<crate::DeviceRequest>,
    /// The group's volumes the task mounts (Nomad's `volume_mount` blocks).
    #[serde(
        default,
        rename = "volume_mount",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub volume_mounts: Vec<crate::VolumeMount>,
}

/// A task's `identity` block (Nomad's `WorkloadIdentity`: `env`, `file`). A field
/// left out of the block is false, as in Nomad; a task without the block gets the
/// file and not the variable ([`TaskIdentity::DEFAULT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskIdentity {
    /// The token in the task's environment as `NOMAD_TOKEN`.
    #[serde(default)]
    pub env: bool,
    /// The token in `secrets/nomad_token`.
    #[serde(default)]
    pub file: bool,
}

impl TaskIdentity {
    /// A task without an `identity` block: the file, not the variable.
    pub const DEFAULT: TaskIdentity = TaskIdentity {
        env: false,
        file: true,
    };
}

impl Task {
    /// Where this task's workload identity token goes.
    pub fn identity(&self) -> TaskIdentity {
        self.identity.unwrap_or(TaskIdentity::DEFAULT)
    }
}

// ---------------------------------------------------------------------------------------
// Artifacts and templates
// ---------------------------------------------------------------------------------------

/// Where an artifact goes when its `destination` is not given (Nomad's default).
pub const DEFAULT_ARTIFACT_DESTINATION: &str = "local/";

/// The name of the client's artifact hook; a task failed by it says so first in its
/// message (`artifacts hook: ...`), which Nomad's API shows as a "Failed Artifact
/// Download" event.
pub const ARTIFACT_HOOK: &str = "artifacts";

fn default_artifact_destination() -> String {
    DEFAULT_ARTIFACT_DESTINATION.to_owned()
}

/// One file fetched over http(s) into the task directory before the task starts
/// (Nomad's `artifact` block). An archive (by its name: `.tar`, `.tar.gz`, `.tgz`,
/// `.zip`) is unpacked unless `options { archive = "false" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactSpec {
    /// The URL (`http://` or `https://`).
    pub source: String,
    /// Where in the task directory (relative, default `local/`).
    #[serde(default = "default_artifact_destination")]
    pub destination: String,
    /// `any` (default), `file` or `dir`.
    #[serde(default, skip_serializing_if = "ArtifactMode::is_any")]
    pub mode: ArtifactMode,
    /// go-getter's options: `checksum = "sha256:..."`, `archive = "false"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
    /// Headers sent with the request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// What an artifact's destination is (Nomad's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactMode {
    /// A directory for an archive, the file's directory otherwise.
    #[default]
    Any,
    /// The destination is the file itself.
    File,
    /// The destination is a directory.
    Dir,
}

impl ArtifactMode {
    fn is_any(&self) -> bool {
        *self == ArtifactMode::Any
    }
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactMode::Any => "any",
            ArtifactMode::File => "file",
            ArtifactMode::Dir => "dir",
        }
    }
}

/// What the client does to a running task when its template renders differently
/// (Nomad's `change_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeMode {
    /// Restart the task.
    #[default]
    Restart,
    /// Send it `change_signal`.
    Signal,
    /// Nothing: the file changes under the running task.
    Noop,
}

impl ChangeMode {
    fn is_restart(&self) -> bool {
        *self == ChangeMode::Restart
    }
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeMode::Restart => "restart",
            ChangeMode::Signal => "signal",
            ChangeMode::Noop => "noop",
        }
    }
}

/// Default permission bits of a rendered template (Nomad's `perms`).
pub const DEFAULT_TEMPLATE_PERMS: &str = "644";
/// Default delay before a change is applied (Nomad's `splay`).
pub const DEFAULT_TEMPLATE_SPLAY: Duration = Duration::from_secs(5);

fn default_template_perms() -> String {
    DEFAULT_TEMPLATE_PERMS.to_owned()
}
fn default_left_delimiter() -> String {
    "{{".to_owned()
}
fn default_right_delimiter() -> String {
    "}}".to_owned()
}
fn default_splay() -> Duration {
    DEFAULT_TEMPLATE_SPLAY
}
fn is_default_perms(p: &String) -> bool {
    p == DEFAULT_TEMPLATE_PERMS
}
fn is_left(p: &String) -> bool {
    p == "{{"
}
fn is_right(p: &String) -> bool {
    p == "}}"
}
fn is_default_splay(d: &Duration) -> bool {
    *d == DEFAULT_TEMPLATE_SPLAY
}
fn is_false(b: &bool) -> bool {
    !*b
}

/// A file rendered from a Go template (consul-template's syntax) into the task
/// directory (Nomad's `template` block).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    /// The template itself (one of `data` and `source`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// A template file in the task directory (relative), read when rendering.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Where the result goes in the task directory (relative).
    pub destination: String,
    /// What a change does to the running task.
    #[serde(default, skip_serializing_if = "ChangeMode::is_restart")]
    pub change_mode: ChangeMode,
    /// The signal of `change_mode = "signal"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_signal: Option<String>,
    /// The result is `KEY=VALUE` lines added to the task's environment.
    #[serde(default, skip_serializing_if = "is_false")]
    pub env: bool,
    /// Permission bits of the file, octal (`"644"`); files under `secrets/` are 0600.
    #[serde(
        default = "default_template_perms",
        skip_serializing_if = "is_default_perms"
    )]
    pub perms: String,
    /// Opening delimiter of actions.
    #[serde(default = "default_left_delimiter", skip_serializing_if = "is_left")]
    pub left_delimiter: String,
    /// Closing delimiter of actions.
    #[serde(default = "default_right_delimiter", skip_serializing_if = "is_right")]
    pub right_delimiter: String,
    /// Random delay, up to this, before a change is applied.
    #[serde(
        default = "default_splay",
        with = "humantime_serde",
        skip_serializing_if = "is_default_splay"
    )]
    pub splay: Duration,
    /// A missing map key is an error (otherwise it renders as `<no value>`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub error_on_missing_key: bool,
}

// ---------------------------------------------------------------------------------------
// Networks and ports
// ---------------------------------------------------------------------------------------

/// How an allocation is networked (Nomad's `network { mode = ... }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The node's own network: tasks bind the node's address and their ports on it.
    #[default]
    Host,
    /// A network namespace of the allocation's own, shared by its tasks, on the node's
    /// bridge; mapped ports are forwarded from the node's address.
    Bridge,
}

impl NetworkMode {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Host => "host",
            NetworkMode::Bridge => "bridge",
        }
    }
}

/// A group's network (Nomad's `network` block).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Host or bridge.
    #[serde(default)]
    pub mode: NetworkMode,
    /// The ports the allocation needs, by label.
    #[serde(
        default,
        rename = "port",
        alias = "ports",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ports: Vec<PortSpec>,
}

/// One port of a group (Nomad's `port "label" { static = ...; to = ... }`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// The name tasks and services refer to it by (`NOMAD_PORT_<label>`).
    pub label: String,
    /// A fixed port on the node (1-65535); 0: the scheduler picks one from the node's
    /// dynamic range. Wider than `u16` so that a wrong number is refused by name.
    #[serde(
        default,
        rename = "static",
        skip_serializing_if = "crate::types::is_zero_u32"
    )]
    pub static_port: u32,
    /// The port inside the allocation the node's port is mapped to (bridge mode, docker
    /// `ports`); 0: the same number as the node's port; -1: also the same (Nomad's
    /// spelling).
    #[serde(default, skip_serializing_if = "crate::types::is_zero_i32")]
    pub to: i32,
    /// The node's host network to take the address from (only `default` so far).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_network: String,
}

pub(crate) fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

pub(crate) fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

/// A port the scheduler gave an allocation on its node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocatedPort {
    /// The group's label for it.
    pub label: String,
    /// The port on the node.
    pub value: u16,
    /// The port inside the allocation it maps to (bridge mode, docker); equal to
    /// `value` when the group asked for no mapping.
    pub to: u16,
    /// The node's address the port is on.
    pub host_ip: String,
}

/// What a node offers for ports, from its agent's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeNetwork {
    /// The address allocations' ports are on (the agent's `network_interface`'s, or
    /// `bind_addr`; 127.0.0.1 on a dev agent).
    pub address: String,
    /// Lowest port the scheduler may pick (Nomad's `min_dynamic_port`, 20000).
    pub min_dynamic_port: u16,
    /// Highest port the scheduler may pick (Nomad's `max_dynamic_port`, 32000).
    pub max_dynamic_port: u16,
    /// Ports never given to allocations (`reserved.reserved_ports`): ranges, inclusive.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reserved_ports: Vec<PortRange>,
}

/// Nomad's default lowest dynamic port.
pub const DEFAULT_MIN_DYNAMIC_PORT: u16 = 20000;
/// Nomad's default highest dynamic port.
pub const DEFAULT_MAX_DYNAMIC_PORT: u16 = 32000;

impl Default for NodeNetwork {
    fn default() -> Self {
        NodeNetwork {
            address: "127.0.0.1".to_owned(),
            min_dynamic_port: DEFAULT_MIN_DYNAMIC_PORT,
            max_dynamic_port: DEFAULT_MAX_DYNAMIC_PORT,
            reserved_ports: Vec::new(),
        }
    }
}

/// An inclusive range of ports (`first == last` for one port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (at least `first`).
    pub last: u16,
}

// ---------------------------------------------------------------------------------------
// Services and checks
// ---------------------------------------------------------------------------------------

/// A service an allocation offers (Nomad's `service` block with `provider = "nomad"`):
/// registered by the client with the server while the allocation runs, served by
/// `GET /v1/service/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// The service's name; may use `${...}` (Nomad's default:
    /// `${JOB}-${TASKGROUP}[-${TASK}]`, filled in by the parser when absent).
    pub name: String,
    /// The port label of the group's network (or a port number) the service is at.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port: String,
    /// Tags, served with every instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Free-form metadata of the service.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Who keeps the registrations: `nomad` (the server) is the only one Drover has.
    #[serde(default = "default_service_provider")]
    pub provider: String,
    /// For a group-level service: the task whose restarts `check_restart` acts on and
    /// in which `script` checks run (Nomad's `task` of a group service).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task: String,
    /// Health checks: the instance is healthy while every one passes.
    #[serde(
        default,
        rename = "check",
        alias = "checks",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub checks: Vec<CheckSpec>,
    /// Restart the task after this many failed checks in a row (every check of the
    /// service that has none of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_restart: Option<CheckRestart>,
}

/// The only service provider Drover has: its own servers (Nomad's native discovery).
pub const NOMAD_SERVICE_PROVIDER: &str = "nomad";

fn default_service_provider() -> String {
    NOMAD_SERVICE_PROVIDER.to_owned()
}

/// A health check of a service (Nomad's `check` block).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// Name (default: `service: "<service>" check`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `http`, `tcp` or `script` (checked by [`crate::validate()`], so that a wrong one is
    /// refused by field name).
    #[serde(rename = "type")]
    pub check_type: String,
    /// Time between two runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Time one run may take before it counts as failed.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// `http`: the path asked for (`/health`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// `http`: the method (default GET).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// `http`: `http` (default) or `https`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// `http`: extra request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub header: BTreeMap<String, Vec<String>>,
    /// The port label to check (default: the service's port).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port: String,
    /// `script`: the command, run inside the task (exit 0 passing, 1 warning, other
    /// critical).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    /// `script`: its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// `script` of a group-level service: the task it runs in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task: String,
    /// Check through a port the allocation exposes for it (bridge mode).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expose: bool,
    /// Restart the task after failures of this check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_restart: Option<CheckRestart>,
}

/// The kinds of check Drover runs.
pub const CHECK_TYPES: [&str; 3] = ["http", "tcp", "script"];

/// When failing checks restart their task (Nomad's `check_restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRestart {
    /// Failures in a row that restart the task (0: never).
    #[serde(default)]
    pub limit: u32,
    /// Time after the task (re)started during which failures do not count.
    #[serde(default, with = "humantime_serde")]
    pub grace: Duration,
    /// A warning counts as passing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_warnings: bool,
}

/// A task's resources: what the scheduler reserves on the node and the driver enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskResources {
    /// CPU in MHz (default 100), also the task's relative CPU weight.
    pub cpu: u32,
    /// Memory in MiB (default 300).
    pub memory_mb: u32,
    /// Hard memory limit in MiB (0: same as `memory_mb`).
    pub memory_max_mb: u32,
}

impl Default for TaskResources {
    fn default() -> Self {
        TaskResources {
            cpu: 100,
            memory_mb: 300,
            memory_max_mb: 0,
        }
    }
}

/// When a task runs relative to the group's main tasks (Nomad's `lifecycle` block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// `prestart`, `poststart` or `poststop`.
    pub hook: LifecycleHook,
    /// Keeps running beside the main tasks (prestart/poststart only); stopped when the
    /// main tasks end.
    #[serde(default)]
    pub sidecar: bool,
}

/// The phase a lifecycle task belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleHook {
    /// Before the main tasks; an ephemeral one must succeed before they start.
    Prestart,
    /// Once every main task started.
    Poststart,
    /// After every main task stopped.
    Poststop,
}

/// A rule on node attributes or metadata (`${node.meta.rack} = r1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraint {
    /// Left side: `${attr.kernel.name}`, `${node.meta.rack}`, `${node.name}`, ... or a
    /// literal. Empty for `distinct_hosts`.
    #[serde(default)]
    pub attribute: String,
    /// Comparison (default `=`).
    #[serde(default)]
    pub operator: ConstraintOperator,
    /// Right side: a literal or an interpolation as for `attribute`.
    #[serde(default)]
    pub value: String,
}

/// The comparisons a [`Constraint`] can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ConstraintOperator {
    /// Equal strings.
    #[default]
    #[serde(rename = "=", alias = "==", alias = "is")]
    Equal,
    /// Different strings (or the attribute is missing).
    #[serde(rename = "!=", alias = "not")]
    NotEqual,
    /// Numeric when both sides are numbers, else lexical.
    #[serde(rename = "<")]
    Less,
    /// As `<`.
    #[serde(rename = "<=")]
    LessEqual,
    /// As `<`.
    #[serde(rename = ">")]
    Greater,
    /// As `<`.
    #[serde(rename = ">=")]
    GreaterEqual,
    /// The attribute, a version, matches a requirement such as `>= 5.10, < 7`.
    #[serde(rename = "version", alias = "semver")]
    Version,
    /// The attribute matches a regular expression.
    #[serde(rename = "regexp")]
    Regexp,
    /// The attribute, a comma-separated set, contains every comma-separated value.
    #[serde(rename = "set_contains", alias = "set_contains_all")]
    SetContains,
    /// ... contains at least one of the values.
    #[serde(rename = "set_contains_any")]
    SetContainsAny,
    /// No two allocations of the job (or group) on one node.
    #[serde(rename = "distinct_hosts")]
    DistinctHosts,
    /// The attribute is set.
    #[serde(rename = "is_set")]
    IsSet,
    /// The attribute is not set.
    #[serde(rename = "is_not_set")]
    IsNotSet,
}

impl ConstraintOperator {
    /// The operator as written in a job file.
    pub fn as_str(self) -> &'static str {
        use ConstraintOperator::*;
        match self {
            Equal => "=",
            NotEqual => "!=",
            Less => "<",
            LessEqual => "<=",
            Greater => ">",
            GreaterEqual => ">=",
            Version => "version",
            Regexp => "regexp",
            SetContains => "set_contains",
            SetContainsAny => "set_contains_any",
            DistinctHosts => "distinct_hosts",
            IsSet => "is_set",
            IsNotSet => "is_not_set",
        }
    }
}

/// A job's overall state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Registered, nothing running yet.
    #[default]
    Pending,
    /// Some allocation is pending or running (or desired to run).
    Running,
    /// Stopped, or every allocation is terminal and nothing is wanted.
    Dead,
}

/// A job as the server keeps it: the submitted spec and the server's bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// What was submitted.
    #[serde(flatten)]
    pub spec: JobSpec,
    /// 0 for the first registration, +1 for every changed spec.
    pub version: u64,
    /// Stopped by `job stop` (the spec is kept until purged).
    pub stop: bool,
    /// Derived from the allocations.
    pub status: JobStatus,
    /// Unix time of the submission, nanoseconds.
    pub submit_time: i64,
    /// Index of the registration that created the job.
    pub create_index: Index,
    /// Index of the last change of the job object (spec, status or stop).
    pub modify_index: Index,
    /// Index of the last change of the spec (a new version).
    pub job_modify_index: Index,
    /// A deployment of this version succeeded (or it was the first version, placed
    /// without one): what a failed deployment's auto-revert goes back to.
    #[serde(default)]
    pub stable: bool,
}

/// One line of `GET /v1/jobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobListStub {
    /// Name.
    pub name: String,
    /// Its namespace.
    #[serde(default = "crate::default_namespace")]
    pub namespace: String,
    /// Type.
    #[serde(rename = "type")]
    pub job_type: JobType,
    /// Priority.
    pub priority: u8,
    /// Status.
    pub status: JobStatus,
    /// Stopped.
    pub stop: bool,
    /// Version.
    pub version: u64,
    /// Allocation counts by client status, per group.
    pub summary: BTreeMap<String, GroupSummary>,
    /// Index of creation.
    pub create_index: Index,
    /// Index of the last change.
    pub modify_index: Index,
}

/// Allocation counts of one group by client status (and queued: not yet placed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GroupSummary {
    /// Wanted but not placed (blocked).
    pub queued: u32,
    /// Placed, not yet running.
    pub pending: u32,
    /// Running.
    pub running: u32,
    /// Completed successfully.
    pub complete: u32,
    /// Failed.
    pub failed: u32,
    /// Lost with their node.
    pub lost: u32,
}

// ---------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------

/// A node's scheduling state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// Registered, not yet heartbeating.
    #[default]
    Initializing,
    /// Heartbeating; receives allocations unless draining.
    Ready,
    /// Missed its heartbeat TTL plus grace: its allocations are lost and replaced.
    Down,
    /// Ready, but its allocations are being moved off and nothing new is placed on it.
    Draining,
}

impl NodeStatus {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Initializing => "initializing",
            NodeStatus::Ready => "ready",
            NodeStatus::Down => "down",
            NodeStatus::Draining => "draining",
        }
    }
}

/// A driver as fingerprinted on a node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DriverInfo {
    /// The plugin was found and answered its fingerprint.
    pub detected: bool,
    /// It can run tasks now.
    pub healthy: bool,
    /// Why not, when unhealthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_description: String,
    /// Attributes the driver reported (`driver.<name>.<key>` in constraints).
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

/// What a node offers to allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeResources {
    /// Total CPU in MHz (cores × MHz).
    pub cpu: u64,
    /// Total memory in MiB.
    pub memory_mb: u64,
}

/// What an allocation reserves on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AllocResources {
    /// CPU in MHz.
    pub cpu: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
}

/// What a client agent tells the server about itself when it registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistration {
    /// Stable id the client keeps in its data dir (a UUID).
    pub id: String,
    /// Human name (`--node-name`, default the host name); unique among live nodes.
    pub name: String,
    /// The datacenter the node is in (`datacenter` of the agent's config, default
    /// `dc1`).
    #[serde(default = "default_datacenter")]
    pub datacenter: String,
    /// Fingerprinted attributes: `os.name`, `kernel.name`, `kernel.version`,
    /// `cpu.arch`, `cpu.numcores`, `cpu.frequency` (MHz), `memory.totalbytes`,
    /// `unique.hostname`, and whatever else the client found.
    pub attributes: BTreeMap<String, String>,
    /// Operator metadata (`--meta k=v`).
    pub meta: BTreeMap<String, String>,
    /// Capacity offered to allocations.
    pub resources: NodeResources,
    /// Every driver's fingerprint, by driver name.
    pub drivers: BTreeMap<String, DriverInfo>,
    /// Address and ports offered to allocations (an older agent sends none: the
    /// defaults).
    #[serde(default)]
    pub network: NodeNetwork,
    /// Device groups the node's device plugins fingerprinted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::NodeDeviceGroup>,
    /// Host volumes of the agent's config, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_volumes: BTreeMap<String, crate::HostVolume>,
    /// CSI plugins the node runs, by plugin id, with their health.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub csi_plugins: BTreeMap<String, crate::csi::CsiPluginFingerprint>,
}

/// The datacenter of a node that names none: Nomad's default.
pub const DEFAULT_DATACENTER: &str = "dc1";

fn default_datacenter() -> String {
    DEFAULT_DATACENTER.to_owned()
}

/// Whether datacenter `dc` matches one of a job's `datacenters` patterns (Nomad 1.5's
/// rule: a pattern is a glob where `*` stands for any run of characters, nothing else
/// is special, and the match is exact and case-sensitive). No pattern at all: every
/// datacenter.
pub fn datacenter_allowed(patterns: &[String], dc: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| glob_matches(p, dc))
}

/// `*`-only glob matching, linear in the text: each `*` lets the next literal piece
/// match at its first position from where the previous piece ended (the leftmost
/// match is always the right one for `*`-only globs).
fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split('*');
    // `split` always yields at least one piece.
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let middle: Vec<&str> = pieces.collect();
    let Some((last, middle)) = middle.split_last() else {
        // No `*`: the whole text must be the pattern.
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A node as the server keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Stable id.
    pub id: String,
    /// Human name.
    pub name: String,
    /// Datacenter (see [`NodeRegistration::datacenter`]).
    #[serde(default = "default_datacenter")]
    pub datacenter: String,
    /// Scheduling state.
    pub status: NodeStatus,
    /// Why it has its status ("missed heartbeats for 20s", ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status_description: String,
    /// A drain was asked for: nothing new is placed, allocations are moved off.
    pub drain: bool,
    /// Marked ineligible for new placements (Nomad's `SchedulingEligibility`
    /// "ineligible"): what runs there stays; kept through re-registrations.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ineligible: bool,
    /// Attributes (see [`NodeRegistration::attributes`]).
    pub attributes: BTreeMap<String, String>,
    /// Metadata.
    pub meta: BTreeMap<String, String>,
    /// Capacity.
    pub resources: NodeResources,
    /// Drivers by name.
    pub drivers: BTreeMap<String, DriverInfo>,
    /// Address and ports (see [`NodeRegistration::network`]).
    #[serde(default)]
    pub network: NodeNetwork,
    /// Device groups (see [`NodeRegistration::devices`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::NodeDeviceGroup>,
    /// Host volumes by name (see [`NodeRegistration::host_volumes`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_volumes: BTreeMap<String, crate::HostVolume>,
    /// CSI plugins by plugin id (see [`NodeRegistration::csi_plugins`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub csi_plugins: BTreeMap<String, crate::csi::CsiPluginFingerprint>,
    /// Unix time of the last status change, nanoseconds.
    pub status_updated_at: i64,
    /// Index of the first registration.
    pub create_index: Index,
    /// Index of the last change.
    pub modify_index: Index,
}

impl Node {
    /// The fingerprint of the driver a task's `driver` names: the driver of that name,
    /// else of the name it is an older spelling of (a job that says `rawexec` runs on
    /// a node whose driver is `raw_exec`, see [`drover_api::DRIVER_ALIASES`]).
    pub fn driver(&self, name: &str) -> Option<&DriverInfo> {
        self.drivers
            .get(name)
            .or_else(|| self.drivers.get(drover_api::canonical_driver_name(name)))
    }
}

// ---------------------------------------------------------------------------------------
// Allocations
// ---------------------------------------------------------------------------------------

/// What the server wants of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    /// Run it.
    #[default]
    Run,
    /// Stop it (job stopped, scaled down, replaced, node drained or back from down).
    Stop,
}

/// What the client reports of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    /// Placed, not all of its main tasks running yet.
    #[default]
    Pending,
    /// Its main tasks run.
    Running,
    /// Every task ended successfully (or the allocation was stopped as asked).
    Complete,
    /// A task failed for good.
    Failed,
    /// Its node went down: the server replaced it.
    Lost,
}

impl ClientStatus {
    /// Complete, failed or lost: nothing runs and nothing will.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost
        )
    }
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientStatus::Pending => "pending",
            ClientStatus::Running => "running",
            ClientStatus::Complete => "complete",
            ClientStatus::Failed => "failed",
            ClientStatus::Lost => "lost",
        }
    }
}

/// A task's state within an allocation, as its client reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskState {
    /// `pending`, `running` or `dead`.
    pub state: TaskRunState,
    /// Dead unsuccessfully.
    pub failed: bool,
    /// Exit code of the last run, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Restarts so far.
    pub restarts: u32,
    /// Times the task was started on its node (1 + restarts, unless it never started).
    pub starts: u32,
    /// RFC 3339, when it last started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// RFC 3339, when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The node-local task id (`drover task status ID` on that agent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    /// Last event, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A task's coarse state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskRunState {
    /// Not started yet (or waiting for a restart).
    #[default]
    Pending,
    /// Running.
    Running,
    /// Ended for good.
    Dead,
}

/// One copy of a task group on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// UUID.
    pub id: String,
    /// `job.group[index]`.
    pub name: String,
    /// Which copy of the group (0..count).
    pub index: u32,
    /// The namespace of its job.
    #[serde(default = "crate::default_namespace")]
    pub namespace: String,
    /// Job name.
    pub job_name: String,
    /// The job version this allocation runs.
    pub job_version: u64,
    /// Group name.
    pub group: String,
    /// Node id.
    pub node_id: String,
    /// Node name.
    pub node_name: String,
    /// What it reserves on the node.
    pub resources: AllocResources,
    /// The ports it was given on the node, one per port label of its group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<AllocatedPort>,
    /// The device instances each task was given, by task name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub task_devices: BTreeMap<String, Vec<crate::AllocatedDevices>>,
    /// What the server wants.
    pub desired_status: DesiredStatus,
    /// Why (for a stop: "job stopped", "node down", "replaced by a newer version"...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub desired_description: String,
    /// What the client reports.
    pub client_status: ClientStatus,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_description: String,
    /// Task states by task name.
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
    /// The evaluation that placed it.
    pub eval_id: String,
    /// The allocation it replaces, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_allocation: Option<String>,
    /// The allocation that replaced it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_allocation: Option<String>,
    /// The deployment that placed it (a service job's rollout of a version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_id: Option<String>,
    /// Its health as its deployment sees it (reported by the client), and whether it
    /// is a canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_status: Option<AllocDeploymentStatus>,
    /// The replacements of failed allocations that led to this one, oldest first
    /// (bounded: what the group's `reschedule` policy needs to count and to double
    /// the delay).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reschedule_events: Vec<RescheduleEvent>,
    /// Index of creation.
    pub create_index: Index,
    /// Index of the last change of any field.
    pub modify_index: Index,
    /// Index of the last change the server made (desired status, job version): what a
    /// client acts on. Client status updates do not change it.
    pub alloc_modify_index: Index,
    /// Unix time of creation, nanoseconds.
    pub create_time: i64,
    /// Unix time of the last change, nanoseconds.
    pub modify_time: i64,
}

/// An allocation's standing in its deployment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AllocDeploymentStatus {
    /// Healthy or unhealthy, as the client decided; absent: not yet known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// Unix time the health was decided, nanoseconds (0: not yet).
    #[serde(default)]
    pub timestamp: i64,
    /// Placed as a canary (next to the old version, until promoted).
    #[serde(default)]
    pub canary: bool,
    /// Index of the last change.
    #[serde(default)]
    pub modify_index: Index,
}

/// One replacement of a failed allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescheduleEvent {
    /// Unix time of the replacement, nanoseconds.
    pub time: i64,
    /// The failed allocation replaced.
    pub prev_alloc_id: String,
    /// How long the replacement waited after the failure.
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
}

impl Allocation {
    /// Stopped or ended: it no longer uses its node's resources.
    pub fn is_terminal(&self) -> bool {
        self.desired_status == DesiredStatus::Stop || self.client_status.is_terminal()
    }
}

/// What a client sends about one allocation (batched).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocClientUpdate {
    /// Allocation id.
    pub id: String,
    /// Client status.
    pub client_status: ClientStatus,
    /// Why, for people.
    #[serde(default)]
    pub client_description: String,
    /// Task states by task name.
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
    /// The allocation's health in its deployment, once the client decided it (see
    /// [`UpdateStrategy`]); absent: not decided, or no deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// The allocation's service instances, all of them (an empty list deregisters
    /// every one); absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<crate::services::ServiceInstance>>,
}

/// An allocation as a client receives it: the allocation and the group it runs, at the
/// job version it was placed with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientAllocation {
    /// The allocation.
    pub alloc: Allocation,
    /// Job type (a batch task that exits 0 completes the allocation).
    pub job_type: JobType,
    /// The group spec at `alloc.job_version`.
    pub group: TaskGroup,
    /// The group's update strategy when the allocation belongs to a deployment: how
    /// the client decides its health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<UpdateStrategy>,
    /// The job's `meta` at `alloc.job_version` (under the group's and the task's: the
    /// client merges them into `NOMAD_META_*`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub job_meta: BTreeMap<String, String>,
    /// The region of the server that placed it (`NOMAD_REGION`, `${node.region}`).
    #[serde(default = "default_region")]
    pub region: String,
    /// Each task's workload identity (task name to a JWT the server signed), which the
    /// client writes to the task's `secrets/nomad_token`: it reads the task's own
    /// variables (`nomad/jobs/<job>[/<group>[/<task>]]`). Empty for a stopped
    /// allocation, or before the keyring has a key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub identities: BTreeMap<String, String>,
    /// The CSI volumes the group claims, by volume id (its requests' `source`), as
    /// the server keeps them: what the client stages and publishes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub csi_volumes: BTreeMap<String, crate::csi::CsiVolume>,
}

/// The region of a server that names none: Nomad's default.
pub const DEFAULT_REGION: &str = "global";

fn default_region() -> String {
    DEFAULT_REGION.to_owned()
}

// ---------------------------------------------------------------------------------------
// Deployments
// ---------------------------------------------------------------------------------------

/// Where a deployment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeploymentStatus {
    /// Placing and waiting for health.
    #[default]
    Running,
    /// Held by an operator.
    Paused,
    /// Every group has its healthy allocations: the version is stable.
    Successful,
    /// An allocation was unhealthy, a deadline passed, or an operator failed it.
    Failed,
    /// A newer version of the job (or its stop) replaced it.
    Cancelled,
}

impl DeploymentStatus {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Running => "running",
            DeploymentStatus::Paused => "paused",
            DeploymentStatus::Successful => "successful",
            DeploymentStatus::Failed => "failed",
            DeploymentStatus::Cancelled => "cancelled",
        }
    }

    /// Running or paused: it may still move.
    pub fn is_active(self) -> bool {
        matches!(self, DeploymentStatus::Running | DeploymentStatus::Paused)
    }
}

/// The rollout of one version of a service job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// UUID.
    pub id: String,
    /// The namespace of its job.
    #[serde(default = "crate::default_namespace")]
    pub namespace: String,
    /// Job name.
    pub job_name: String,
    /// The version it rolls out.
    pub job_version: u64,
    /// The job's `job_modify_index` at that version.
    pub job_modify_index: Index,
    /// The job's `create_index`.
    pub job_create_index: Index,
    /// Status.
    pub status: DeploymentStatus,
    /// Why, for people.
    #[serde(default)]
    pub status_description: String,
    /// Per group.
    pub groups: BTreeMap<String, DeploymentGroup>,
    /// Index of creation.
    pub create_index: Index,
    /// Index of the last change.
    pub modify_index: Index,
    /// Unix time of creation, nanoseconds.
    pub create_time: i64,
    /// Unix time of the last change, nanoseconds.
    pub modify_time: i64,
}

/// A deployment's state for one group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeploymentGroup {
    /// Revert the job when this deployment fails.
    pub auto_revert: bool,
    /// Promote once the canaries are healthy.
    pub auto_promote: bool,
    /// The canaries were promoted (or there are none to promote).
    pub promoted: bool,
    /// How long the group may go without progress.
    #[serde(with = "humantime_serde")]
    pub progress_deadline: Duration,
    /// Unix time (nanoseconds) by which an allocation must turn healthy; 0: none.
    #[serde(default)]
    pub require_progress_by: i64,
    /// Canaries wanted.
    pub desired_canaries: u32,
    /// Allocations of the version wanted (the group's count).
    pub desired_total: u32,
    /// The canaries placed.
    #[serde(default)]
    pub placed_canaries: Vec<String>,
    /// Allocations placed by this deployment.
    pub placed_allocs: u32,
    /// Of them, healthy.
    pub healthy_allocs: u32,
    /// Of them, unhealthy.
    pub unhealthy_allocs: u32,
}

impl Deployment {
    /// Every group with canaries is promoted.
    pub fn promoted(&self) -> bool {
        self.groups
            .values()
            .all(|g| g.desired_canaries == 0 || g.promoted)
    }

    /// Some group waits for a promotion.
    pub fn has_unpromoted_canaries(&self) -> bool {
        self.groups
            .values()
            .any(|g| g.desired_canaries > 0 && !g.promoted)
    }
}

// ---------------------------------------------------------------------------------------
// Evaluations
// ---------------------------------------------------------------------------------------

/// An evaluation's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalStatus {
    /// Waiting for, or in, a worker.
    #[default]
    Pending,
    /// Something could not be placed: retried when capacity appears.
    Blocked,
    /// Done.
    Complete,
    /// Gave up (e.g. plan rejected too often).
    Failed,
    /// Superseded by a newer evaluation of the same job.
    Canceled,
}

/// Why an evaluation was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvalTrigger {
    /// A job was registered or changed.
    #[default]
    JobRegister,
    /// A job was stopped or purged.
    JobDeregister,
    /// A node changed status (down, back, new).
    NodeUpdate,
    /// A node is draining.
    NodeDrain,
    /// An allocation failed on its node.
    AllocFailure,
    /// A blocked evaluation retried because capacity changed.
    QueuedAllocs,
    /// A rolling update continues after a batch became healthy.
    RollingUpdate,
    /// The plan was rejected too often; re-planned.
    MaxPlanAttempts,
    /// A user stopped one allocation (Nomad's `alloc-stop`): it is replaced.
    AllocStop,
    /// A group's count was changed through the scale endpoint (Nomad's `job-scaling`).
    JobScaling,
    /// A deployment changed: promoted, failed, an allocation's health decided
    /// (Nomad's `deployment-watcher`).
    DeploymentWatcher,
}

/// Why a group could not (all) be placed: what a person reads in `job status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PlacementFailure {
    /// Copies that could not be placed.
    pub unplaced: u32,
    /// One sentence, e.g. "no node has driver qemu healthy" or "memory exhausted on 3
    /// of 3 nodes".
    pub reason: String,
    /// Nodes considered.
    pub nodes_evaluated: u32,
    /// Nodes filtered out, by reason ("driver qemu not detected" → 3).
    #[serde(default)]
    pub nodes_filtered: BTreeMap<String, u32>,
    /// Nodes feasible but full, by dimension ("memory" → 3).
    #[serde(default)]
    pub nodes_exhausted: BTreeMap<String, u32>,
}

/// A unit of scheduling work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// UUID.
    pub id: String,
    /// The namespace of its job.
    #[serde(default = "crate::default_namespace")]
    pub namespace: String,
    /// Job it evaluates.
    pub job_name: String,
    /// Job type.
    pub job_type: JobType,
    /// Job priority.
    pub priority: u8,
    /// Why.
    pub triggered_by: EvalTrigger,
    /// State.
    pub status: EvalStatus,
    /// Why the status, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status_description: String,
    /// The node concerned (node updates and drains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Groups that could not be (fully) placed, by group name.
    #[serde(default)]
    pub failed_tg_allocs: BTreeMap<String, PlacementFailure>,
    /// Copies still to place, by group.
    #[serde(default)]
    pub queued_allocations: BTreeMap<String, u32>,
    /// The blocked evaluation this one created for what it could not place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_eval: Option<String>,
    /// The evaluation this one follows (blocked → retry, rolling update → next batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_eval: Option<String>,
    /// Unix time (nanoseconds) before which the evaluation is not handed to a worker:
    /// the follow-up of an evaluation that left a failed allocation waiting for its
    /// reschedule delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_until: Option<i64>,
    /// Index of the job spec it evaluated.
    pub job_modify_index: Index,
    /// Index of creation.
    pub create_index: Index,
    /// Index of the last change.
    pub modify_index: Index,
    /// Unix time of creation, nanoseconds.
    pub create_time: i64,
    /// Unix time of the last change, nanoseconds.
    pub modify_time: i64,
}

// ---------------------------------------------------------------------------------------
// Requests and responses
// ---------------------------------------------------------------------------------------

/// `PUT /v1/jobs` and `PUT /v1/job/{name}/plan`: `{"job": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRegisterRequest {
    /// The job.
    pub job: JobSpec,
}

/// Answer to a registration or a stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRegisterResponse {
    /// The evaluation created (empty when nothing changed).
    pub eval_id: String,
    /// The index of the job's spec.
    pub job_modify_index: Index,
    /// The index of the commit.
    pub index: Index,
    /// Things the user should know (e.g. an unknown driver on every node).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// What a deployment change (promote, fail) or a job revert committed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeploymentUpdateResponse {
    /// The evaluation created.
    pub eval_id: String,
    /// The deployment's index after the change (0 for a revert).
    pub deployment_modify_index: Index,
    /// The version a revert registered (a failed deployment's auto-revert too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted_job_version: Option<u64>,
    /// The index of the commit.
    pub index: Index,
}

/// What would happen to the allocations of one group (`job plan`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GroupPlanSummary {
    /// New allocations.
    pub place: u32,
    /// Allocations stopped.
    pub stop: u32,
    /// Allocations replaced by a new version (destructive update).
    pub update: u32,
    /// Allocations left as they are.
    pub ignore: u32,
    /// Canaries placed.
    #[serde(default)]
    pub canary: u32,
}

/// Answer to `job plan`: nothing is committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPlanResponse {
    /// The version the job would get.
    pub job_version: u64,
    /// Whether the spec differs from the stored one.
    pub changed: bool,
    /// Per group.
    pub groups: BTreeMap<String, GroupPlanSummary>,
    /// What could not be placed, per group.
    pub failed_tg_allocs: BTreeMap<String, PlacementFailure>,
    /// The job's current index, for a check-and-set registration.
    pub job_modify_index: Index,
}

/// `drover job status --json` and `GET /v1/job/{name}` with `?allocations=true`
/// are separate calls; the CLI combines them into this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatusView {
    /// The job.
    pub job: Job,
    /// Its allocations, newest first.
    pub allocations: Vec<Allocation>,
    /// Its evaluations, newest first.
    pub evaluations: Vec<Evaluation>,
}

/// `POST /v1/node/{id}/drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDrainRequest {
    /// true: drain; false: make it eligible again.
    pub enable: bool,
}

/// Answer to `POST /v1/node/{id}/drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDrainResponse {
    /// The index of the commit.
    pub index: Index,
}

/// Answer to `GET /v1/status/servers`: the servers of the cluster, its leader and its
/// store (`drover server status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServersStatus {
    /// The name of the server that answered.
    pub this: String,
    /// The leader, `null` while none is elected.
    pub leader: Option<LeaderStatus>,
    /// Every server registered in the store now.
    pub servers: Vec<ServerMember>,
    /// The state store.
    pub store: StoreStatus,
}

/// The leader and its term (`GET /v1/status/leader` on the leader itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderStatus {
    /// Its name.
    pub name: String,
    /// Its term: a number that grows with every election in the cluster (0 when the
    /// answering follower could not ask the leader for it).
    pub term: u64,
}

/// A server registered in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMember {
    /// Its name (`drover server --name`).
    pub name: String,
    /// Where nodes and other servers reach its RPCs (`HOST:PORT`).
    pub rpc_addr: String,
    /// Where its HTTP API is (`HOST:PORT`).
    pub http_addr: String,
    /// Its version.
    pub version: String,
    /// When it started (seconds since the epoch).
    pub started: u64,
    /// It is the leader.
    pub leader: bool,
}

/// The state store and its endpoints' health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    /// `embedded` or `etcd`.
    pub kind: String,
    /// Each endpoint (the embedded store: its file).
    pub endpoints: Vec<StoreEndpointHealth>,
}

/// One store endpoint's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreEndpointHealth {
    /// As configured (`http://127.0.0.1:2379`), or the embedded store's path.
    pub endpoint: String,
    /// It answered.
    pub healthy: bool,
    /// Its version, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its database size in bytes, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size: Option<u64>,
    /// It is its cluster's raft leader (etcd).
    #[serde(default)]
    pub is_leader: bool,
    /// Why it is not healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The query of `GET /v1/client/fs/logs/{alloc}`: a task's log, from the agent of the
/// node that runs the allocation (the server keeps no logs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocLogsQuery {
    /// The task's name in the allocation's group.
    pub task: String,
    /// stdout (default) or stderr.
    #[serde(default)]
    pub stream: drover_api::LogStream,
    /// Keep the answer open and send output as it is written, until the task is dead.
    #[serde(default)]
    pub follow: bool,
    /// Start at the last N lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u64>,
    /// Answer in frames (`drover_api::Frame`) instead of plain bytes.
    #[serde(default)]
    pub framed: bool,
}

/// Header carrying the index of the state an answer was read at (Nomad's).
pub const INDEX_HEADER: &str = "x-nomad-index";
/// HTTP header carrying the ACL token (Nomad's).
pub const TOKEN_HEADER: &str = "x-nomad-token";
/// Metadata key carrying the cluster token on the node and server RPCs (Drover's own
/// protocol, not Nomad's API: it keeps its name).
pub const RPC_TOKEN_KEY: &str = "x-drover-token";
/// Longest blocking-query wait the server allows.
pub const MAX_BLOCKING_WAIT: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraint_operators_read_as_written_in_job_files() {
        for (text, op) in [
            ("=", ConstraintOperator::Equal),
            ("==", ConstraintOperator::Equal),
            ("!=", ConstraintOperator::NotEqual),
            ("<", ConstraintOperator::Less),
            (">", ConstraintOperator::Greater),
            ("version", ConstraintOperator::Version),
            ("regexp", ConstraintOperator::Regexp),
            ("set_contains", ConstraintOperator::SetContains),
            ("distinct_hosts", ConstraintOperator::DistinctHosts),
        ] {
            let parsed: ConstraintOperator =
                serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(parsed, op, "{text}");
        }
        assert!(serde_json::from_value::<ConstraintOperator>(serde_json::json!("~=")).is_err());
    }

    #[test]
    fn group_resources_sum_their_tasks() {
        let task = |cpu, memory_mb| Task {
            devices: Default::default(),
            volume_mounts: Default::default(),
            services: Default::default(),
            meta: Default::default(),
            name: "t".into(),
            driver: "rawexec".into(),
            config: serde_json::Value::Null,
            env: BTreeMap::new(),
            kill_signal: None,
            kill_timeout: None,
            restart: None,
            resources: TaskResources {
                cpu,
                memory_mb,
                memory_max_mb: 0,
            },
            logs: None,
            lifecycle: None,
            artifacts: Vec::new(),
            templates: Vec::new(),
            identity: None,
        };
        let g = TaskGroup {
            volumes: Default::default(),
            update: Default::default(),
            network: Default::default(),
            services: Default::default(),
            name: "g".into(),
            count: 1,
            constraints: vec![],
            meta: BTreeMap::new(),
            tasks: vec![task(100, 64), task(250, 128)],
            reschedule: None,
        };
        assert_eq!(
            g.resources(),
            AllocResources {
                cpu: 350,
                memory_mb: 192
            }
        );
    }

    #[test]
    fn datacenter_patterns_are_star_globs() {
        let p = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
        assert!(
            datacenter_allowed(&[], "anything"),
            "no pattern: every datacenter"
        );
        for (patterns, dc, want) in [
            (&["dc1"][..], "dc1", true),
            (&["dc1"], "dc10", false),
            (&["dc1"], "DC1", false),
            (&["dc2", "dc1"], "dc1", true),
            (&["*"], "", true),
            (&["*"], "eu-west-1", true),
            (&["eu-*"], "eu-west-1", true),
            (&["eu-*"], "us-east-1", false),
            (&["*-1"], "eu-west-1", true),
            (&["eu-*-1"], "eu-west-1", true),
            (&["eu-*-1"], "eu-1", false),
            (&["a*a"], "a", false),
            (&["a*a"], "aa", true),
            (&["*b*"], "abc", true),
            (&["*b*"], "ac", false),
            (&["a**c"], "abbc", true),
            // Nothing but `*` is special.
            (&["dc?"], "dc1", false),
            (&["dc[12]"], "dc1", false),
        ] {
            assert_eq!(
                datacenter_allowed(&p(patterns), dc),
                want,
                "{patterns:?} ~ {dc}"
            );
        }
    }
}
