//! Jobs as Nomad's API carries them (`api/jobs.go`, `api/tasks.go`, `api/resources.go`,
//! `api/constraint.go` of Nomad 1.0): the job a client registers, the job the server
//! serves, its list stub, summary, versions, and the answers to register, deregister and
//! plan.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_api::{LogConfig as InternalLogConfig, RestartMode, RestartPolicy as InternalRestart};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::duration;
use super::network::{
    NetworkResource, Service, ServiceOwner, group_network, refuse_task_networks, services,
};
use super::{
    ConversionError, DEFAULT_REGION, is_nomad_default, join, namespace_or_default, refuse_unknown,
    refuse_unsupported,
};
use crate::types::{
    self as internal, ConstraintOperator, GroupPlanSummary, JobStatus, JobType, LifecycleHook,
    PlacementFailure,
};

// ---------------------------------------------------------------------------------------
// The job
// ---------------------------------------------------------------------------------------

/// A job in Nomad's shape: what `nomad job run -output` prints inside `{"Job": ...}`,
/// what `PUT /v1/jobs` takes and what `GET /v1/job/:id` answers. Every field may be
/// absent or `null` on input (Nomad fills in defaults); the server-set fields (`Status`,
/// `Version`, the indexes, ...) are ignored on input, so a job read from the API can be
/// registered again as it is.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Job {
    /// The region the job is for (the server checks it against its own).
    #[serde(rename = "Region", alias = "region", default)]
    pub region: Option<String>,
    /// Only `default` (namespaces come with issue 26).
    #[serde(rename = "Namespace", alias = "namespace", default)]
    pub namespace: Option<String>,
    /// The job's id: Drover's job name.
    #[serde(rename = "ID", alias = "id", alias = "Id", default)]
    pub id: Option<String>,
    /// Display name; Drover keeps only the id (a different name is a warning).
    #[serde(rename = "Name", alias = "name", default)]
    pub name: Option<String>,
    /// `service` (default), `batch` or `system`.
    #[serde(rename = "Type", alias = "type", default)]
    pub job_type: Option<String>,
    /// 1..=100 (default 50).
    #[serde(rename = "Priority", alias = "priority", default)]
    pub priority: Option<i64>,
    /// Datacenters the job may run in (glob patterns).
    #[serde(rename = "Datacenters", alias = "datacenters", default)]
    pub datacenters: Option<Vec<String>>,
    /// Constraints of every group.
    #[serde(rename = "Constraints", alias = "constraints", default)]
    pub constraints: Option<Vec<Constraint>>,
    /// The groups.
    #[serde(
        rename = "TaskGroups",
        alias = "task_groups",
        alias = "taskgroups",
        default
    )]
    pub task_groups: Option<Vec<TaskGroup>>,
    /// Rolling updates (`MaxParallel`).
    #[serde(rename = "Update", alias = "update", default)]
    pub update: Option<UpdateStrategy>,
    /// The groups' reschedule policy, unless a group has its own.
    #[serde(rename = "Reschedule", alias = "reschedule", default)]
    pub reschedule: Option<ReschedulePolicy>,
    /// Free-form metadata.
    #[serde(rename = "Meta", alias = "meta", default)]
    pub meta: Option<BTreeMap<String, String>>,

    /// Not supported yet.
    #[serde(rename = "AllAtOnce", default)]
    pub all_at_once: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Affinities", default)]
    pub affinities: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Spreads", default)]
    pub spreads: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Multiregion", default)]
    pub multiregion: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Periodic", default)]
    pub periodic: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "ParameterizedJob", default)]
    pub parameterized_job: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Migrate", default)]
    pub migrate: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "ConsulToken", default)]
    pub consul_token: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "VaultToken", default)]
    pub vault_token: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "VaultNamespace", default)]
    pub vault_namespace: Option<Value>,
    /// Not supported yet (dispatched jobs).
    #[serde(rename = "Payload", default)]
    pub payload: Option<Value>,
    /// Not supported yet (dispatched jobs).
    #[serde(rename = "Dispatched", default)]
    pub dispatched: Option<Value>,
    /// Not supported yet (child jobs).
    #[serde(rename = "ParentID", default)]
    pub parent_id: Option<Value>,

    // Set by the server; ignored on input.
    /// Stopped (`job stop`).
    #[serde(rename = "Stop", default)]
    pub stop: Option<bool>,
    /// `pending`, `running` or `dead`.
    #[serde(rename = "Status", default)]
    pub status: Option<String>,
    /// Why the status.
    #[serde(rename = "StatusDescription", default)]
    pub status_description: Option<String>,
    /// Whether the version ran healthy (Drover keeps no deployments: false).
    #[serde(rename = "Stable", default)]
    pub stable: Option<bool>,
    /// 0 for the first registration, +1 for every changed spec.
    #[serde(rename = "Version", default)]
    pub version: Option<u64>,
    /// Nanoseconds since the epoch.
    #[serde(rename = "SubmitTime", default)]
    pub submit_time: Option<i64>,
    /// Index of creation.
    #[serde(rename = "CreateIndex", default)]
    pub create_index: Option<u64>,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex", default)]
    pub modify_index: Option<u64>,
    /// Index of the last change of the spec.
    #[serde(rename = "JobModifyIndex", default)]
    pub job_modify_index: Option<u64>,
    /// Set by Nomad's ACL system; ignored.
    #[serde(rename = "NomadTokenID", default, skip_serializing)]
    pub nomad_token_id: Option<Value>,

    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A task group in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TaskGroup {
    /// Unique within the job.
    #[serde(rename = "Name", alias = "name", default)]
    pub name: Option<String>,
    /// Copies (default 1).
    #[serde(rename = "Count", alias = "count", default)]
    pub count: Option<i64>,
    /// Constraints on the group's nodes.
    #[serde(rename = "Constraints", alias = "constraints", default)]
    pub constraints: Option<Vec<Constraint>>,
    /// The tasks.
    #[serde(rename = "Tasks", alias = "tasks", default)]
    pub tasks: Option<Vec<Task>>,
    /// The restart policy of every task without its own.
    #[serde(
        rename = "RestartPolicy",
        alias = "restart_policy",
        alias = "restart",
        default
    )]
    pub restart_policy: Option<RestartPolicy>,
    /// When a failed allocation is replaced.
    #[serde(
        rename = "ReschedulePolicy",
        alias = "reschedule_policy",
        alias = "reschedule",
        default
    )]
    pub reschedule_policy: Option<ReschedulePolicy>,
    /// Must equal the job's (Drover updates a job's groups alike).
    #[serde(rename = "Update", alias = "update", default)]
    pub update: Option<UpdateStrategy>,
    /// Free-form metadata.
    #[serde(rename = "Meta", alias = "meta", default)]
    pub meta: Option<BTreeMap<String, String>>,

    /// Not supported yet.
    #[serde(rename = "Affinities", default)]
    pub affinities: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Spreads", default)]
    pub spreads: Option<Value>,
    /// The volumes its tasks may mount, by name.
    #[serde(rename = "Volumes", alias = "volumes", default)]
    pub volumes: Option<BTreeMap<String, super::VolumeRequest>>,
    /// Not supported yet.
    #[serde(rename = "EphemeralDisk", default)]
    pub ephemeral_disk: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Migrate", default)]
    pub migrate: Option<Value>,
    /// The allocation's network (one per group, as in Nomad).
    #[serde(rename = "Networks", alias = "networks", default)]
    pub networks: Option<Vec<NetworkResource>>,
    /// The group's services.
    #[serde(rename = "Services", alias = "services", default)]
    pub services: Option<Vec<Service>>,
    /// Not supported yet.
    #[serde(rename = "ShutdownDelay", default)]
    pub shutdown_delay: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "StopAfterClientDisconnect", default)]
    pub stop_after_client_disconnect: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Scaling", default)]
    pub scaling: Option<Value>,

    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A task in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Task {
    /// Unique within the group.
    #[serde(rename = "Name", alias = "name", default)]
    pub name: Option<String>,
    /// Driver name, as written (`raw_exec`, `docker`, ...): the node maps it.
    #[serde(rename = "Driver", alias = "driver", default)]
    pub driver: Option<String>,
    /// When the task runs within its group.
    #[serde(rename = "Lifecycle", alias = "lifecycle", default)]
    pub lifecycle: Option<TaskLifecycle>,
    /// Driver config, passed through unchanged.
    #[serde(rename = "Config", alias = "config", default)]
    pub config: Option<Value>,
    /// Constraints; Drover places groups, so they join the group's (as Nomad's do).
    #[serde(rename = "Constraints", alias = "constraints", default)]
    pub constraints: Option<Vec<Constraint>>,
    /// Extra environment.
    #[serde(rename = "Env", alias = "env", default)]
    pub env: Option<BTreeMap<String, String>>,
    /// What the task needs.
    #[serde(rename = "Resources", alias = "resources", default)]
    pub resources: Option<Resources>,
    /// Restarts on the node (over the group's, field by field).
    #[serde(
        rename = "RestartPolicy",
        alias = "restart_policy",
        alias = "restart",
        default
    )]
    pub restart_policy: Option<RestartPolicy>,
    /// Free-form metadata.
    #[serde(rename = "Meta", alias = "meta", default)]
    pub meta: Option<BTreeMap<String, String>>,
    /// Between the kill signal and SIGKILL, nanoseconds.
    #[serde(
        rename = "KillTimeout",
        alias = "kill_timeout",
        default,
        with = "duration::opt"
    )]
    pub kill_timeout: Option<Duration>,
    /// The stop signal (empty: SIGTERM).
    #[serde(rename = "KillSignal", alias = "kill_signal", default)]
    pub kill_signal: Option<String>,
    /// Log rotation.
    #[serde(rename = "LogConfig", alias = "log_config", alias = "logs", default)]
    pub log_config: Option<LogConfig>,

    /// Not supported yet.
    #[serde(rename = "User", default)]
    pub user: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Affinities", default)]
    pub affinities: Option<Value>,
    /// The task's services.
    #[serde(rename = "Services", alias = "services", default)]
    pub services: Option<Vec<Service>>,
    /// Not supported yet.
    #[serde(rename = "Artifacts", alias = "artifacts", default)]
    pub artifacts: Option<Vec<TaskArtifact>>,
    /// Not supported yet.
    #[serde(rename = "Vault", default)]
    pub vault: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Templates", alias = "templates", default)]
    pub templates: Option<Vec<Template>>,
    /// How the task gets its workload identity token.
    #[serde(
        rename = "Identity",
        alias = "identity",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub identity: Option<WorkloadIdentity>,
    /// Not supported yet.
    #[serde(rename = "DispatchPayload", default)]
    pub dispatch_payload: Option<Value>,
    /// The group's volumes the task mounts.
    #[serde(rename = "VolumeMounts", alias = "volume_mounts", default)]
    pub volume_mounts: Option<Vec<super::VolumeMount>>,
    /// Not supported yet.
    #[serde(rename = "CSIPluginConfig", default, skip_serializing)]
    pub csi_plugin_config: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Leader", default)]
    pub leader: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "ShutdownDelay", default)]
    pub shutdown_delay: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Kind", default)]
    pub kind: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "ScalingPolicies", default)]
    pub scaling_policies: Option<Value>,

    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A task's resources in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Resources {
    /// MHz (default 100).
    #[serde(rename = "CPU", alias = "cpu", default)]
    pub cpu: Option<i64>,
    /// MiB (default 300).
    #[serde(rename = "MemoryMB", alias = "memory_mb", alias = "memory", default)]
    pub memory_mb: Option<i64>,
    /// Hard limit in MiB (Nomad 1.1's `memory_max`; 0: same as `MemoryMB`).
    #[serde(
        rename = "MemoryMaxMB",
        alias = "memory_max_mb",
        alias = "memory_max",
        default
    )]
    pub memory_max_mb: Option<i64>,

    /// Not supported yet.
    #[serde(rename = "DiskMB", default)]
    pub disk_mb: Option<Value>,
    /// A task's: refused (networks are the group's); an allocation's: its ports.
    #[serde(rename = "Networks", default)]
    pub networks: Option<Vec<NetworkResource>>,
    /// Devices the task asks for (`device "vendor/type/name" { count }`).
    #[serde(rename = "Devices", alias = "devices", default)]
    pub devices: Option<Vec<RequestedDevice>>,
    /// Deprecated in Nomad; not supported.
    #[serde(rename = "IOPS", default)]
    pub iops: Option<Value>,
    /// Not supported yet (Nomad 1.1's reserved cores).
    #[serde(rename = "Cores", default, skip_serializing)]
    pub cores: Option<Value>,

    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A constraint in Nomad's shape: `LTarget Operand RTarget`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Constraint {
    /// Left side (`${attr.kernel.name}`).
    #[serde(rename = "LTarget", alias = "ltarget", alias = "attribute", default)]
    pub l_target: String,
    /// Right side.
    #[serde(rename = "RTarget", alias = "rtarget", alias = "value", default)]
    pub r_target: String,
    /// `=`, `!=`, `<`, `regexp`, `version`, `distinct_hosts`, ... (empty: `=`).
    #[serde(rename = "Operand", alias = "operand", alias = "operator", default)]
    pub operand: String,
}

/// A task's `device` block in Nomad's shape (`RequestedDevice`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RequestedDevice {
    /// `type`, `vendor/type` or `vendor/type/name`.
    #[serde(rename = "Name", alias = "name", default)]
    pub name: String,
    /// Instances wanted (absent: 1).
    #[serde(rename = "Count", alias = "count", default)]
    pub count: Option<i64>,
    /// Constraints on the device group (`${device.attr.memory}`, ...).
    #[serde(rename = "Constraints", alias = "constraint", default)]
    pub constraints: Option<Vec<Constraint>>,
    /// Affinities: not supported yet (refused).
    #[serde(rename = "Affinities", alias = "affinity", default)]
    pub affinities: Option<Value>,
    /// Unknown fields, refused.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A restart policy in Nomad's shape (durations in nanoseconds). An absent field takes
/// Nomad's default for the job's type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// The window `Attempts` counts in.
    #[serde(
        rename = "Interval",
        alias = "interval",
        default,
        with = "duration::opt"
    )]
    pub interval: Option<Duration>,
    /// Restarts allowed per interval.
    #[serde(rename = "Attempts", alias = "attempts", default)]
    pub attempts: Option<i64>,
    /// Wait before a restart.
    #[serde(rename = "Delay", alias = "delay", default, with = "duration::opt")]
    pub delay: Option<Duration>,
    /// `fail` or `delay`.
    #[serde(rename = "Mode", alias = "mode", default)]
    pub mode: Option<String>,
}

/// A reschedule policy in Nomad's shape. An absent field takes the job's (`Reschedule`)
/// or else Nomad's default for the job's type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReschedulePolicy {
    /// Replacements per interval.
    #[serde(rename = "Attempts", alias = "attempts", default)]
    pub attempts: Option<i64>,
    /// The window `Attempts` counts in.
    #[serde(
        rename = "Interval",
        alias = "interval",
        default,
        with = "duration::opt"
    )]
    pub interval: Option<Duration>,
    /// Wait before the first replacement.
    #[serde(rename = "Delay", alias = "delay", default, with = "duration::opt")]
    pub delay: Option<Duration>,
    /// `exponential` (Drover doubles the delay) or `constant`; not `fibonacci`.
    #[serde(rename = "DelayFunction", alias = "delay_function", default)]
    pub delay_function: Option<String>,
    /// Longest delay.
    #[serde(
        rename = "MaxDelay",
        alias = "max_delay",
        default,
        with = "duration::opt"
    )]
    pub max_delay: Option<Duration>,
    /// Replace for ever.
    #[serde(rename = "Unlimited", alias = "unlimited", default)]
    pub unlimited: Option<bool>,
}

/// The delay function Drover's rescheduling uses: the delay doubles up to `MaxDelay`.
pub const DELAY_FUNCTION: &str = "exponential";
/// Nomad's constant delay: Drover's doubling delay with `MaxDelay` equal to `Delay`.
pub const CONSTANT_DELAY_FUNCTION: &str = "constant";

/// An update strategy in Nomad's shape. An absent field takes the job's (a group's
/// `Update`) or else Nomad's default.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateStrategy {
    /// Allocations replaced at a time.
    #[serde(rename = "MaxParallel", alias = "max_parallel", default)]
    pub max_parallel: Option<i64>,
    /// Accepted; Drover moves on as soon as an allocation turns healthy.
    #[serde(rename = "Stagger", alias = "stagger", default, with = "duration::opt")]
    pub stagger: Option<Duration>,
    /// `checks`, `task_states` or `manual`.
    #[serde(rename = "HealthCheck", alias = "health_check", default)]
    pub health_check: Option<String>,
    /// How long a new allocation must be healthy.
    #[serde(
        rename = "MinHealthyTime",
        alias = "min_healthy_time",
        default,
        with = "duration::opt"
    )]
    pub min_healthy_time: Option<Duration>,
    /// By when a new allocation must be healthy.
    #[serde(
        rename = "HealthyDeadline",
        alias = "healthy_deadline",
        default,
        with = "duration::opt"
    )]
    pub healthy_deadline: Option<Duration>,
    /// How long a deployment may go without progress.
    #[serde(
        rename = "ProgressDeadline",
        alias = "progress_deadline",
        default,
        with = "duration::opt"
    )]
    pub progress_deadline: Option<Duration>,
    /// Canaries.
    #[serde(rename = "Canary", alias = "canary", default)]
    pub canary: Option<i64>,
    /// Revert to the last stable version when the deployment fails.
    #[serde(rename = "AutoRevert", alias = "auto_revert", default)]
    pub auto_revert: Option<bool>,
    /// Promote once the canaries are healthy.
    #[serde(rename = "AutoPromote", alias = "auto_promote", default)]
    pub auto_promote: Option<bool>,
}

impl From<&internal::UpdateStrategy> for UpdateStrategy {
    fn from(u: &internal::UpdateStrategy) -> UpdateStrategy {
        UpdateStrategy {
            max_parallel: Some(i64::from(u.max_parallel)),
            stagger: Some(u.stagger),
            health_check: Some(u.health_check.as_str().to_owned()),
            min_healthy_time: Some(u.min_healthy_time),
            healthy_deadline: Some(u.healthy_deadline),
            progress_deadline: Some(u.progress_deadline),
            canary: Some(i64::from(u.canary)),
            auto_revert: Some(u.auto_revert),
            auto_promote: Some(u.auto_promote),
        }
    }
}

/// Log rotation in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LogConfig {
    /// Files kept per stream (default 10).
    #[serde(rename = "MaxFiles", alias = "max_files", default)]
    pub max_files: Option<i64>,
    /// MiB per file (default 10).
    #[serde(
        rename = "MaxFileSizeMB",
        alias = "max_file_size_mb",
        alias = "max_file_size",
        default
    )]
    pub max_file_size_mb: Option<i64>,
}

/// A task's lifecycle in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskLifecycle {
    /// `prestart`, `poststart` or `poststop`.
    #[serde(rename = "Hook", alias = "hook", default)]
    pub hook: String,
    /// Keeps running beside the main tasks.
    #[serde(rename = "Sidecar", alias = "sidecar", default)]
    pub sidecar: bool,
}

/// An `artifact` block in Nomad's shape (`api.TaskArtifact`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TaskArtifact {
    /// The URL.
    #[serde(rename = "GetterSource", alias = "source", default)]
    pub getter_source: Option<String>,
    /// go-getter options (`checksum`, `archive`).
    #[serde(rename = "GetterOptions", alias = "options", default)]
    pub getter_options: Option<BTreeMap<String, String>>,
    /// Request headers.
    #[serde(rename = "GetterHeaders", alias = "headers", default)]
    pub getter_headers: Option<BTreeMap<String, String>>,
    /// `any`, `file` or `dir`.
    #[serde(rename = "GetterMode", alias = "mode", default)]
    pub getter_mode: Option<String>,
    /// Destination in the task directory.
    #[serde(rename = "RelativeDest", alias = "destination", default)]
    pub relative_dest: Option<String>,
    /// Keys Drover does not know.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A task's `identity` block in Nomad's shape (`api.WorkloadIdentity`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WorkloadIdentity {
    /// The token in the task's environment as `NOMAD_TOKEN`.
    #[serde(rename = "Env", alias = "env", default)]
    pub env: Option<bool>,
    /// The token in `secrets/nomad_token`.
    #[serde(rename = "File", alias = "file", default)]
    pub file: Option<bool>,
    /// Keys Drover does not know.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A `template` block in Nomad's shape (`api.Template`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Template {
    /// A template file in the task directory.
    #[serde(rename = "SourcePath", alias = "source", default)]
    pub source_path: Option<String>,
    /// Where the result goes.
    #[serde(rename = "DestPath", alias = "destination", default)]
    pub dest_path: Option<String>,
    /// The template itself.
    #[serde(rename = "EmbeddedTmpl", alias = "data", default)]
    pub embedded_tmpl: Option<String>,
    /// `restart`, `signal` or `noop`.
    #[serde(rename = "ChangeMode", alias = "change_mode", default)]
    pub change_mode: Option<String>,
    /// The signal of `signal`.
    #[serde(rename = "ChangeSignal", alias = "change_signal", default)]
    pub change_signal: Option<String>,
    /// Random delay before a change is applied, nanoseconds.
    #[serde(rename = "Splay", alias = "splay", default, with = "duration::opt")]
    pub splay: Option<Duration>,
    /// Octal permission bits.
    #[serde(rename = "Perms", alias = "perms", default)]
    pub perms: Option<String>,
    /// Opening delimiter.
    #[serde(rename = "LeftDelim", alias = "left_delimiter", default)]
    pub left_delim: Option<String>,
    /// Closing delimiter.
    #[serde(rename = "RightDelim", alias = "right_delimiter", default)]
    pub right_delim: Option<String>,
    /// The result is added to the task's environment.
    #[serde(rename = "Envvars", alias = "env", default)]
    pub envvars: Option<bool>,
    /// A missing map key is an error.
    #[serde(rename = "ErrMissingKey", alias = "error_on_missing_key", default)]
    pub err_missing_key: Option<bool>,
    /// Not supported yet.
    #[serde(rename = "ChangeScript", default)]
    pub change_script: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Uid", default)]
    pub uid: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Gid", default)]
    pub gid: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "Wait", default)]
    pub wait: Option<Value>,
    /// Deprecated in Nomad (unused since Vault 0.5): ignored.
    #[serde(rename = "VaultGrace", default, skip_serializing)]
    pub vault_grace: Option<Value>,
    /// Keys Drover does not know.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

fn artifact(path: &str, a: &TaskArtifact) -> Result<internal::ArtifactSpec, ConversionError> {
    refuse_unknown(path, &a.other)?;
    let source = a.getter_source.clone().unwrap_or_default();
    let mode = match a.getter_mode.as_deref() {
        None | Some("") | Some("any") => internal::ArtifactMode::Any,
        Some("file") => internal::ArtifactMode::File,
        Some("dir") => internal::ArtifactMode::Dir,
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "GetterMode"),
                format!("unknown mode {other:?} (any, file or dir)"),
            ));
        }
    };
    let destination = match a.relative_dest.as_deref() {
        Some(d) if !d.is_empty() => d.to_owned(),
        // Nomad: a file goes to local/<its name>, anything else into local/.
        _ if mode == internal::ArtifactMode::File => {
            let base = source
                .split(['?', '#'])
                .next()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default();
            format!("local/{base}")
        }
        _ => internal::DEFAULT_ARTIFACT_DESTINATION.to_owned(),
    };
    Ok(internal::ArtifactSpec {
        source,
        destination,
        mode,
        options: a.getter_options.clone().unwrap_or_default(),
        headers: a.getter_headers.clone().unwrap_or_default(),
    })
}

fn template(path: &str, t: &Template) -> Result<internal::TemplateSpec, ConversionError> {
    refuse_unsupported(
        path,
        &[
            ("ChangeScript", &t.change_script),
            ("Uid", &t.uid),
            ("Gid", &t.gid),
            ("Wait", &t.wait),
        ],
    )?;
    refuse_unknown(path, &t.other)?;
    let change_mode = match t.change_mode.as_deref() {
        None | Some("") | Some("restart") => internal::ChangeMode::Restart,
        Some("signal") => internal::ChangeMode::Signal,
        Some("noop") => internal::ChangeMode::Noop,
        Some("script") => return Err(ConversionError::unsupported(join(path, "ChangeMode"))),
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "ChangeMode"),
                format!("unknown change mode {other:?} (restart, signal or noop)"),
            ));
        }
    };
    let non_empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    Ok(internal::TemplateSpec {
        data: t.embedded_tmpl.clone().unwrap_or_default(),
        source: t.source_path.clone().unwrap_or_default(),
        destination: t.dest_path.clone().unwrap_or_default(),
        change_mode,
        change_signal: non_empty(&t.change_signal).map(|s| s.to_uppercase()),
        env: t.envvars.unwrap_or(false),
        perms: non_empty(&t.perms).unwrap_or_else(|| internal::DEFAULT_TEMPLATE_PERMS.to_owned()),
        left_delimiter: non_empty(&t.left_delim).unwrap_or_else(|| "{{".to_owned()),
        right_delimiter: non_empty(&t.right_delim).unwrap_or_else(|| "}}".to_owned()),
        splay: t.splay.unwrap_or(internal::DEFAULT_TEMPLATE_SPLAY),
        error_on_missing_key: t.err_missing_key.unwrap_or(false),
    })
}

impl From<&internal::ArtifactSpec> for TaskArtifact {
    fn from(a: &internal::ArtifactSpec) -> TaskArtifact {
        TaskArtifact {
            getter_source: Some(a.source.clone()),
            getter_options: Some(a.options.clone()).filter(|o| !o.is_empty()),
            getter_headers: Some(a.headers.clone()).filter(|o| !o.is_empty()),
            getter_mode: Some(a.mode.as_str().to_owned()),
            relative_dest: Some(a.destination.clone()),
            other: BTreeMap::new(),
        }
    }
}

impl From<&internal::TemplateSpec> for Template {
    fn from(t: &internal::TemplateSpec) -> Template {
        Template {
            source_path: Some(t.source.clone()),
            dest_path: Some(t.destination.clone()),
            embedded_tmpl: Some(t.data.clone()),
            change_mode: Some(t.change_mode.as_str().to_owned()),
            change_signal: Some(t.change_signal.clone().unwrap_or_default()),
            splay: Some(t.splay),
            perms: Some(t.perms.clone()),
            left_delim: Some(t.left_delimiter.clone()),
            right_delim: Some(t.right_delimiter.clone()),
            envvars: Some(t.env),
            err_missing_key: Some(t.error_on_missing_key),
            ..Default::default()
        }
    }
}

// ---------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------

/// `PUT /v1/jobs` and `PUT /v1/job/:id`: `{"Job": {...}}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JobRegisterRequest {
    /// The job.
    #[serde(rename = "Job", alias = "job")]
    pub job: Job,
    /// Register only if the job's `JobModifyIndex` is still `JobModifyIndex` (0: only
    /// if the job does not exist).
    #[serde(rename = "EnforceIndex", alias = "enforce_index", default)]
    pub enforce_index: bool,
    /// See `EnforceIndex`.
    #[serde(rename = "JobModifyIndex", alias = "job_modify_index", default)]
    pub job_modify_index: u64,
    /// Sentinel policies (Enterprise); ignored.
    #[serde(rename = "PolicyOverride", default)]
    pub policy_override: bool,
    /// Keep the running groups' counts.
    #[serde(rename = "PreserveCounts", alias = "preserve_counts", default)]
    pub preserve_counts: bool,
    /// The write request's namespace (Nomad's `WriteRequest.Namespace`): used for a
    /// job that names none when the query names none either.
    #[serde(
        rename = "Namespace",
        alias = "namespace",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
}

impl JobRegisterRequest {
    /// A plain registration of `job`.
    pub fn new(job: Job) -> JobRegisterRequest {
        JobRegisterRequest {
            job,
            ..Default::default()
        }
    }
}

/// `PUT /v1/job/:id/plan`: `{"Job": {...}, "Diff": true}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JobPlanRequest {
    /// The job.
    #[serde(rename = "Job", alias = "job")]
    pub job: Job,
    /// Whether to answer with a diff (Drover's answer has none).
    #[serde(rename = "Diff", alias = "diff", default)]
    pub diff: bool,
    /// Sentinel policies (Enterprise); ignored.
    #[serde(rename = "PolicyOverride", default)]
    pub policy_override: bool,
}

// ---------------------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------------------

/// One line of `GET /v1/jobs`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobListStub {
    /// The job's id (Drover's job name).
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// Parent (none in Drover).
    #[serde(rename = "ParentID", deserialize_with = "super::null_default")]
    pub parent_id: String,
    /// Same as the id.
    #[serde(rename = "Name", deserialize_with = "super::null_default")]
    pub name: String,
    /// `default`.
    #[serde(rename = "Namespace", deserialize_with = "super::null_default")]
    pub namespace: String,
    /// Datacenters.
    #[serde(rename = "Datacenters", deserialize_with = "super::null_default")]
    pub datacenters: Vec<String>,
    /// `service`, `batch`, `system`.
    #[serde(rename = "Type", deserialize_with = "super::null_default")]
    pub job_type: String,
    /// Priority.
    #[serde(rename = "Priority")]
    pub priority: i64,
    /// Periodic (never in Drover).
    #[serde(rename = "Periodic")]
    pub periodic: bool,
    /// Parameterized (never in Drover).
    #[serde(rename = "ParameterizedJob")]
    pub parameterized_job: bool,
    /// Stopped.
    #[serde(rename = "Stop")]
    pub stop: bool,
    /// `pending`, `running`, `dead`.
    #[serde(rename = "Status", deserialize_with = "super::null_default")]
    pub status: String,
    /// Why the status.
    #[serde(rename = "StatusDescription", deserialize_with = "super::null_default")]
    pub status_description: String,
    /// Allocation counts per group.
    #[serde(rename = "JobSummary")]
    pub job_summary: Option<JobSummary>,
    /// Index of creation.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
    /// Index of the last change of the spec.
    #[serde(rename = "JobModifyIndex")]
    pub job_modify_index: u64,
    /// Nanoseconds since the epoch.
    #[serde(rename = "SubmitTime")]
    pub submit_time: i64,
    /// The job's version (Drover's addition to the stub).
    #[serde(rename = "Version")]
    pub version: u64,
}

/// `GET /v1/job/:id/summary`, and inside each [`JobListStub`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobSummary {
    /// The job's id.
    #[serde(rename = "JobID", deserialize_with = "super::null_default")]
    pub job_id: String,
    /// `default`.
    #[serde(rename = "Namespace", deserialize_with = "super::null_default")]
    pub namespace: String,
    /// Per group.
    #[serde(rename = "Summary", deserialize_with = "super::null_default")]
    pub summary: BTreeMap<String, TaskGroupSummary>,
    /// Child jobs (none in Drover).
    #[serde(rename = "Children")]
    pub children: Option<JobChildrenSummary>,
    /// Index of creation.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
}

/// Child jobs of a periodic or parameterized job by status (always zero in Drover).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobChildrenSummary {
    /// Pending.
    #[serde(rename = "Pending")]
    pub pending: i64,
    /// Running.
    #[serde(rename = "Running")]
    pub running: i64,
    /// Dead.
    #[serde(rename = "Dead")]
    pub dead: i64,
}

/// Allocation counts of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskGroupSummary {
    /// Not yet placed.
    #[serde(rename = "Queued")]
    pub queued: i64,
    /// Complete.
    #[serde(rename = "Complete")]
    pub complete: i64,
    /// Failed.
    #[serde(rename = "Failed")]
    pub failed: i64,
    /// Running.
    #[serde(rename = "Running")]
    pub running: i64,
    /// Placed, not running yet.
    #[serde(rename = "Starting")]
    pub starting: i64,
    /// Lost with their node.
    #[serde(rename = "Lost")]
    pub lost: i64,
}

/// `GET /v1/job/:id/versions`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobVersionsResponse {
    /// Newest first.
    #[serde(rename = "Versions", deserialize_with = "super::null_default")]
    pub versions: Vec<Job>,
    /// Diffs between consecutive versions when asked (`?diffs=true`); Drover has none.
    #[serde(rename = "Diffs")]
    pub diffs: Option<Vec<Value>>,
    /// The index the answer was read at.
    #[serde(rename = "Index")]
    pub index: u64,
    /// Milliseconds since the leader was last heard (0 on the leader).
    #[serde(rename = "LastContact")]
    pub last_contact: i64,
    /// A leader is known.
    #[serde(rename = "KnownLeader")]
    pub known_leader: bool,
}

/// Answer to `PUT /v1/jobs`, `PUT /v1/job/:id`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobRegisterResponse {
    /// The evaluation created (empty when nothing changed).
    #[serde(rename = "EvalID", deserialize_with = "super::null_default")]
    pub eval_id: String,
    /// The index the evaluation was created at.
    #[serde(rename = "EvalCreateIndex")]
    pub eval_create_index: u64,
    /// The index of the job's spec.
    #[serde(rename = "JobModifyIndex")]
    pub job_modify_index: u64,
    /// Warnings, one per line (Nomad's is one string).
    #[serde(rename = "Warnings", deserialize_with = "super::null_default")]
    pub warnings: String,
    /// The index of the commit.
    #[serde(rename = "Index")]
    pub index: u64,
    /// Milliseconds since the leader was last heard.
    #[serde(rename = "LastContact")]
    pub last_contact: i64,
    /// A leader is known.
    #[serde(rename = "KnownLeader")]
    pub known_leader: bool,
}

/// Answer to `DELETE /v1/job/:id`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobDeregisterResponse {
    /// The evaluation created.
    #[serde(rename = "EvalID", deserialize_with = "super::null_default")]
    pub eval_id: String,
    /// The index the evaluation was created at.
    #[serde(rename = "EvalCreateIndex")]
    pub eval_create_index: u64,
    /// The index of the job's spec.
    #[serde(rename = "JobModifyIndex")]
    pub job_modify_index: u64,
    /// The index of the commit.
    #[serde(rename = "Index")]
    pub index: u64,
    /// Milliseconds since the leader was last heard.
    #[serde(rename = "LastContact")]
    pub last_contact: i64,
    /// A leader is known.
    #[serde(rename = "KnownLeader")]
    pub known_leader: bool,
}

/// Answer to `PUT /v1/job/:id/plan`: Nomad's fields as far as Drover's plan tells them,
/// and Drover's own per-group summary.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobPlanResponse {
    /// The job's current index (for a check-and-set registration).
    #[serde(rename = "JobModifyIndex")]
    pub job_modify_index: u64,
    /// Evaluations the plan created (none: Drover's plan commits nothing).
    #[serde(rename = "CreatedEvals")]
    pub created_evals: Option<Vec<Value>>,
    /// The diff: `Type` is `None`, `Added` or `Edited` (no field diffs yet).
    #[serde(rename = "Diff")]
    pub diff: Option<JobDiff>,
    /// What would happen per group.
    #[serde(rename = "Annotations")]
    pub annotations: Option<PlanAnnotations>,
    /// What could not be placed, per group.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, super::AllocationMetric>>,
    /// The next launch of a periodic job (`null`: none, as Nomad writes it).
    #[serde(rename = "NextPeriodicLaunch")]
    pub next_periodic_launch: Option<String>,
    /// Warnings, one per line.
    #[serde(rename = "Warnings", deserialize_with = "super::null_default")]
    pub warnings: String,
    /// Drover: the version the job would get.
    #[serde(rename = "JobVersion")]
    pub job_version: u64,
    /// Drover: whether the spec differs from the stored one.
    #[serde(rename = "Changed")]
    pub changed: bool,
    /// Drover: per group, what would happen to its allocations.
    #[serde(rename = "Groups", deserialize_with = "super::null_default")]
    pub groups: BTreeMap<String, GroupPlan>,
}

/// The top of Nomad's job diff (Drover computes no field diffs yet).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobDiff {
    /// `None`, `Added`, `Edited`.
    #[serde(rename = "Type", deserialize_with = "super::null_default")]
    pub diff_type: String,
    /// The job's id.
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// Field diffs (none yet).
    #[serde(rename = "Fields")]
    pub fields: Option<Vec<Value>>,
    /// Object diffs (none yet).
    #[serde(rename = "Objects")]
    pub objects: Option<Vec<Value>>,
    /// Group diffs (none yet).
    #[serde(rename = "TaskGroups")]
    pub task_groups: Option<Vec<Value>>,
}

/// Nomad's plan annotations: per group, the counts of the scheduler's decisions.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanAnnotations {
    /// Per group.
    #[serde(rename = "DesiredTGUpdates", deserialize_with = "super::null_default")]
    pub desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    /// Preemptions (none in Drover).
    #[serde(rename = "PreemptedAllocs")]
    pub preempted_allocs: Option<Vec<Value>>,
}

/// Nomad's per-group decision counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DesiredUpdates {
    /// Left alone.
    #[serde(rename = "Ignore")]
    pub ignore: u64,
    /// New.
    #[serde(rename = "Place")]
    pub place: u64,
    /// Moved off a node.
    #[serde(rename = "Migrate")]
    pub migrate: u64,
    /// Stopped.
    #[serde(rename = "Stop")]
    pub stop: u64,
    /// Updated in place.
    #[serde(rename = "InPlaceUpdate")]
    pub in_place_update: u64,
    /// Replaced by a new version.
    #[serde(rename = "DestructiveUpdate")]
    pub destructive_update: u64,
    /// Canaries.
    #[serde(rename = "Canary")]
    pub canary: u64,
    /// Preempted.
    #[serde(rename = "Preemptions")]
    pub preemptions: u64,
}

/// Drover's per-group plan summary in its wire shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupPlan {
    /// New allocations.
    #[serde(rename = "Place")]
    pub place: u32,
    /// Allocations stopped.
    #[serde(rename = "Stop")]
    pub stop: u32,
    /// Allocations replaced by a new version.
    #[serde(rename = "Update")]
    pub update: u32,
    /// Allocations left alone.
    #[serde(rename = "Ignore")]
    pub ignore: u32,
    /// Canaries placed.
    #[serde(rename = "Canary", default)]
    pub canary: u32,
}

// ---------------------------------------------------------------------------------------
// Wire → internal
// ---------------------------------------------------------------------------------------

/// A submitted job converted: the spec, and what the caller must check or tell.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedJob {
    /// The spec.
    pub spec: internal::JobSpec,
    /// The job's `Region`, if it named one: the server refuses a region not its own.
    pub region: Option<String>,
    /// Things accepted but not acted on (an ignored `Update.MinHealthyTime`, a `Name`
    /// that differs from the `ID`): for `Warnings` of the answer.
    pub warnings: Vec<String>,
}

impl TryFrom<&Job> for internal::JobSpec {
    type Error = ConversionError;

    fn try_from(job: &Job) -> Result<internal::JobSpec, ConversionError> {
        job.to_spec().map(|p| p.spec)
    }
}

impl TryFrom<Job> for internal::JobSpec {
    type Error = ConversionError;

    fn try_from(job: Job) -> Result<internal::JobSpec, ConversionError> {
        internal::JobSpec::try_from(&job)
    }
}

fn count_u32(path: &str, v: i64, what: &str) -> Result<u32, ConversionError> {
    u32::try_from(v)
        .map_err(|_| ConversionError::new(path, format!("{what} must be 0 or more, got {v}")))
}

fn non_empty<'a>(
    path: &str,
    v: &'a Option<String>,
    what: &str,
) -> Result<&'a str, ConversionError> {
    match v.as_deref() {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(ConversionError::new(path, format!("missing {what}"))),
    }
}

impl Job {
    /// The job as Drover's spec, the region it names and the warnings. Errors name the
    /// field by its JSON path (`TaskGroups[0].Tasks[1].Resources.MemoryMB`).
    pub fn to_spec(&self) -> Result<ParsedJob, ConversionError> {
        let mut warnings = Vec::new();
        refuse_unsupported(
            "",
            &[
                ("AllAtOnce", &self.all_at_once),
                ("Affinities", &self.affinities),
                ("Spreads", &self.spreads),
                ("Multiregion", &self.multiregion),
                ("Periodic", &self.periodic),
                ("ParameterizedJob", &self.parameterized_job),
                ("Migrate", &self.migrate),
                ("ConsulToken", &self.consul_token),
                ("VaultToken", &self.vault_token),
                ("VaultNamespace", &self.vault_namespace),
                ("Payload", &self.payload),
                ("Dispatched", &self.dispatched),
                ("ParentID", &self.parent_id),
            ],
        )?;
        refuse_unknown("", &self.other)?;

        let name = match (self.id.as_deref(), self.name.as_deref()) {
            (Some(id), _) if !id.is_empty() => id.to_owned(),
            (_, Some(name)) if !name.is_empty() => name.to_owned(),
            _ => return Err(ConversionError::new("ID", "missing job ID")),
        };
        if let (Some(id), Some(n)) = (self.id.as_deref(), self.name.as_deref())
            && !id.is_empty()
            && !n.is_empty()
            && id != n
        {
            warnings.push(format!(
                "Name {n:?} differs from ID {id:?}: Drover names the job by its ID"
            ));
        }
        let namespace = namespace_or_default(self.namespace.as_deref().unwrap_or(""));
        if let Err(why) = crate::namespaces::check_namespace_name(&namespace) {
            return Err(ConversionError::new("Namespace", why));
        }
        let job_type = match self.job_type.as_deref() {
            None | Some("") | Some("service") => JobType::Service,
            Some("batch") => JobType::Batch,
            Some("system") => JobType::System,
            Some("sysbatch") => return Err(ConversionError::unsupported("Type")),
            Some(other) => {
                return Err(ConversionError::new(
                    "Type",
                    format!("unknown job type {other:?} (service, batch or system)"),
                ));
            }
        };
        let priority = match self.priority {
            None => 50,
            Some(p) => u8::try_from(p).map_err(|_| {
                ConversionError::new("Priority", format!("must be 1 to 100, got {p}"))
            })?,
        };
        let update = match &self.update {
            None => internal::UpdateStrategy::default(),
            Some(u) => update_strategy("Update", &internal::UpdateStrategy::default(), u)?,
        };
        let mut constraints = Vec::new();
        for (i, c) in self.constraints.iter().flatten().enumerate() {
            constraints.push(constraint(&format!("Constraints[{i}]"), c)?);
        }
        let groups_in = self.task_groups.as_deref().unwrap_or_default();
        if groups_in.is_empty() {
            return Err(ConversionError::new(
                "TaskGroups",
                "a job needs a task group",
            ));
        }
        let mut groups = Vec::with_capacity(groups_in.len());
        for (i, g) in groups_in.iter().enumerate() {
            groups.push(self.group(&format!("TaskGroups[{i}]"), &name, g, job_type, update)?);
        }
        Ok(ParsedJob {
            spec: internal::JobSpec {
                namespace,
                name,
                job_type,
                priority,
                constraints,
                update,
                meta: self.meta.clone().unwrap_or_default(),
                datacenters: self.datacenters.clone().unwrap_or_default(),
                groups,
            },
            region: self.region.clone().filter(|r| !r.is_empty()),
            warnings,
        })
    }

    fn group(
        &self,
        path: &str,
        job_name: &str,
        g: &TaskGroup,
        job_type: JobType,
        job_update: internal::UpdateStrategy,
    ) -> Result<internal::TaskGroup, ConversionError> {
        // Nomad's defaults of these blocks (in every job a Nomad server serves) ask
        // for nothing Drover lacks.
        let ephemeral_disk = g.ephemeral_disk.clone().filter(|v| {
            !is_nomad_default(
                v,
                &json!({"Sticky": false, "SizeMB": 300, "Migrate": false}),
            )
        });
        let migrate = g.migrate.clone().filter(|v| {
            !is_nomad_default(
                v,
                &json!({"MaxParallel": 1, "HealthCheck": "checks",
                    "MinHealthyTime": 10_000_000_000_i64, "HealthyDeadline": 300_000_000_000_i64}),
            )
        });
        refuse_unsupported(
            path,
            &[
                ("Affinities", &g.affinities),
                ("Spreads", &g.spreads),
                ("EphemeralDisk", &ephemeral_disk),
                ("Migrate", &migrate),
                ("ShutdownDelay", &g.shutdown_delay),
                ("StopAfterClientDisconnect", &g.stop_after_client_disconnect),
                ("Scaling", &g.scaling),
            ],
        )?;
        refuse_unknown(path, &g.other)?;
        let name = non_empty(&join(path, "Name"), &g.name, "group name")?.to_owned();
        let count = match g.count {
            None => 1,
            Some(c) => count_u32(&join(path, "Count"), c, "Count")?,
        };
        // Nomad merges a group's update over the job's, field by field; the result
        // is kept on the group only when it differs.
        let update = match &g.update {
            None => None,
            Some(u) => {
                let merged = update_strategy(&join(path, "Update"), &job_update, u)?;
                (merged != job_update).then_some(merged)
            }
        };
        let mut constraints = Vec::new();
        for (i, c) in g.constraints.iter().flatten().enumerate() {
            constraints.push(constraint(&format!("{path}.Constraints[{i}]"), c)?);
        }
        let reschedule = match (&self.reschedule, &g.reschedule_policy) {
            (None, None) => None,
            (job_level, group_level) => {
                let mut p = internal::ReschedulePolicy::default_for(job_type);
                if let Some(j) = job_level {
                    p = reschedule_over(&p, "Reschedule", j)?;
                }
                if let Some(gp) = group_level {
                    p = reschedule_over(&p, &join(path, "ReschedulePolicy"), gp)?;
                }
                Some(p)
            }
        };
        let tasks_in = g.tasks.as_deref().unwrap_or_default();
        if tasks_in.is_empty() {
            return Err(ConversionError::new(
                join(path, "Tasks"),
                "a group needs a task",
            ));
        }
        let mut tasks = Vec::with_capacity(tasks_in.len());
        for (i, t) in tasks_in.iter().enumerate() {
            let tpath = format!("{path}.Tasks[{i}]");
            for (j, c) in t.constraints.iter().flatten().enumerate() {
                // A task's constraints restrict where its group goes, as in Nomad.
                constraints.push(constraint(&format!("{tpath}.Constraints[{j}]"), c)?);
            }
            let mut converted = task(&tpath, t, job_type, g.restart_policy.as_ref())?;
            converted.services = services(
                &join(&tpath, "Services"),
                t.services.as_deref().unwrap_or_default(),
                &ServiceOwner {
                    job: job_name,
                    group: &name,
                    task: Some(&converted.name),
                },
            )?;
            tasks.push(converted);
        }
        let network = group_network(
            &join(path, "Networks"),
            g.networks.as_deref().unwrap_or_default(),
        )?;
        let group_services = services(
            &join(path, "Services"),
            g.services.as_deref().unwrap_or_default(),
            &ServiceOwner {
                job: job_name,
                group: &name,
                task: None,
            },
        )?;
        let volumes =
            super::volumes::volume_requests(path, g.volumes.as_ref().unwrap_or(&BTreeMap::new()))?;
        Ok(internal::TaskGroup {
            volumes,
            network,
            services: group_services,
            name,
            count,
            constraints,
            meta: g.meta.clone().unwrap_or_default(),
            tasks,
            reschedule,
            update,
        })
    }
}

fn task(
    path: &str,
    t: &Task,
    job_type: JobType,
    group_restart: Option<&RestartPolicy>,
) -> Result<internal::Task, ConversionError> {
    refuse_unsupported(
        path,
        &[
            ("User", &t.user),
            ("Affinities", &t.affinities),
            ("Vault", &t.vault),
            ("DispatchPayload", &t.dispatch_payload),
            ("CSIPluginConfig", &t.csi_plugin_config),
            ("Leader", &t.leader),
            ("ShutdownDelay", &t.shutdown_delay),
            ("Kind", &t.kind),
            ("ScalingPolicies", &t.scaling_policies),
        ],
    )?;
    refuse_unknown(path, &t.other)?;
    let name = non_empty(&join(path, "Name"), &t.name, "task name")?.to_owned();
    let driver = non_empty(&join(path, "Driver"), &t.driver, "driver")?.to_owned();
    let restart = match (group_restart, &t.restart_policy) {
        (None, None) => None,
        (g, own) => {
            let mut p = default_restart(job_type);
            if let Some(g) = g {
                p = restart_over(&p, &path_of_group_restart(path), g)?;
            }
            if let Some(own) = own {
                p = restart_over(&p, &join(path, "RestartPolicy"), own)?;
            }
            Some(p)
        }
    };
    let resources = match &t.resources {
        None => internal::TaskResources::default(),
        Some(r) => resources(&join(path, "Resources"), r)?,
    };
    let logs = match &t.log_config {
        None => None,
        Some(l) => {
            let lpath = join(path, "LogConfig");
            let d = InternalLogConfig::default();
            Some(InternalLogConfig {
                max_files: match l.max_files {
                    None => d.max_files,
                    Some(v) => count_u32(&join(&lpath, "MaxFiles"), v, "MaxFiles")?,
                },
                max_file_size_mb: match l.max_file_size_mb {
                    None => d.max_file_size_mb,
                    Some(v) => count_u32(&join(&lpath, "MaxFileSizeMB"), v, "MaxFileSizeMB")?,
                },
            })
        }
    };
    let lifecycle = match &t.lifecycle {
        None => None,
        // Nomad writes an absent lifecycle block of some tools as `{"Hook": ""}`.
        Some(l) if l.hook.is_empty() && !l.sidecar => None,
        Some(l) => {
            let hook = match l.hook.as_str() {
                "prestart" => LifecycleHook::Prestart,
                "poststart" => LifecycleHook::Poststart,
                "poststop" => LifecycleHook::Poststop,
                other => {
                    return Err(ConversionError::new(
                        join(path, "Lifecycle.Hook"),
                        format!("unknown hook {other:?} (prestart, poststart or poststop)"),
                    ));
                }
            };
            Some(internal::Lifecycle {
                hook,
                sidecar: l.sidecar,
            })
        }
    };
    let mut artifacts = Vec::new();
    for (i, a) in t.artifacts.iter().flatten().enumerate() {
        artifacts.push(artifact(&join(path, &format!("Artifacts[{i}]")), a)?);
    }
    let mut templates = Vec::new();
    for (i, tm) in t.templates.iter().flatten().enumerate() {
        templates.push(template(&join(path, &format!("Templates[{i}]")), tm)?);
    }
    let identity = match &t.identity {
        None => None,
        Some(id) => {
            refuse_unknown(&join(path, "Identity"), &id.other)?;
            // A field left out of the block is false, as in Nomad.
            Some(internal::TaskIdentity {
                env: id.env.unwrap_or(false),
                file: id.file.unwrap_or(false),
            })
        }
    };
    let devices = match t.resources.as_ref().and_then(|r| r.devices.as_ref()) {
        None => Vec::new(),
        Some(ds) => ds
            .iter()
            .enumerate()
            .map(|(i, d)| device_request(&join(path, &format!("Resources.Devices[{i}]")), d))
            .collect::<Result<_, _>>()?,
    };
    let volume_mounts =
        super::volumes::volume_mounts(path, t.volume_mounts.as_deref().unwrap_or_default())?;
    Ok(internal::Task {
        devices,
        volume_mounts,
        services: Default::default(),
        name,
        driver,
        config: t.config.clone().unwrap_or(Value::Null),
        env: t.env.clone().unwrap_or_default(),
        meta: t.meta.clone().unwrap_or_default(),
        kill_signal: t.kill_signal.clone().filter(|s| !s.is_empty()),
        kill_timeout: t.kill_timeout,
        restart,
        resources,
        logs,
        lifecycle,
        artifacts,
        templates,
        identity,
    })
}

/// `TaskGroups[i].RestartPolicy` from `TaskGroups[i].Tasks[j]`.
fn path_of_group_restart(task_path: &str) -> String {
    match task_path.rfind(".Tasks[") {
        Some(at) => format!("{}.RestartPolicy", &task_path[..at]),
        None => "RestartPolicy".to_owned(),
    }
}

fn resources(path: &str, r: &Resources) -> Result<internal::TaskResources, ConversionError> {
    refuse_task_networks(&join(path, "Networks"), &r.networks)?;
    refuse_unsupported(
        path,
        &[
            ("DiskMB", &r.disk_mb),
            ("IOPS", &r.iops),
            ("Cores", &r.cores),
        ],
    )?;
    refuse_unknown(path, &r.other)?;
    let d = internal::TaskResources::default();
    Ok(internal::TaskResources {
        cpu: match r.cpu {
            None => d.cpu,
            Some(v) => count_u32(&join(path, "CPU"), v, "CPU")?,
        },
        memory_mb: match r.memory_mb {
            None => d.memory_mb,
            Some(v) => count_u32(&join(path, "MemoryMB"), v, "MemoryMB")?,
        },
        memory_max_mb: match r.memory_max_mb {
            None => d.memory_max_mb,
            Some(v) => count_u32(&join(path, "MemoryMaxMB"), v, "MemoryMaxMB")?,
        },
    })
}

/// A `device` block: name and count as given (validation checks their ranges and
/// forms, naming the task), constraints converted, affinities refused.
fn device_request(
    path: &str,
    d: &RequestedDevice,
) -> Result<crate::DeviceRequest, ConversionError> {
    refuse_unknown(path, &d.other)?;
    if d.affinities
        .as_ref()
        .is_some_and(|a| !a.is_null() && !a.as_array().is_some_and(Vec::is_empty))
    {
        return Err(ConversionError::new(
            join(path, "Affinities"),
            "device affinities are not supported yet (use a constraint)",
        ));
    }
    let count = match d.count {
        None => 1,
        Some(v) => u32::try_from(v).map_err(|_| {
            ConversionError::new(join(path, "Count"), format!("must be 1 to 64, got {v}"))
        })?,
    };
    let constraints = d
        .constraints
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| constraint(&join(path, &format!("Constraints[{i}]")), c))
        .collect::<Result<_, _>>()?;
    Ok(crate::DeviceRequest {
        name: d.name.clone(),
        count,
        constraints,
    })
}

fn constraint(path: &str, c: &Constraint) -> Result<internal::Constraint, ConversionError> {
    let operator = if c.operand.is_empty() {
        ConstraintOperator::Equal
    } else {
        serde_json::from_value::<ConstraintOperator>(Value::String(c.operand.clone())).map_err(
            |_| {
                if c.operand == "distinct_property" {
                    ConversionError::unsupported(join(path, "Operand"))
                } else {
                    ConversionError::new(
                        join(path, "Operand"),
                        format!("unknown operator {:?}", c.operand),
                    )
                }
            },
        )?
    };
    Ok(internal::Constraint {
        attribute: c.l_target.clone(),
        operator,
        value: c.r_target.clone(),
    })
}

/// `u` over `base`, field by field (Nomad merges a group's update over the job's).
fn update_strategy(
    path: &str,
    base: &internal::UpdateStrategy,
    u: &UpdateStrategy,
) -> Result<internal::UpdateStrategy, ConversionError> {
    let health_check = match u.health_check.as_deref() {
        None | Some("") => base.health_check,
        Some("checks") => internal::HealthCheckMode::Checks,
        Some("task_states") => internal::HealthCheckMode::TaskStates,
        Some("manual") => internal::HealthCheckMode::Manual,
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "HealthCheck"),
                format!("unknown health check {other:?} (checks, task_states or manual)"),
            ));
        }
    };
    Ok(internal::UpdateStrategy {
        max_parallel: match u.max_parallel {
            None => base.max_parallel,
            Some(v) => count_u32(&join(path, "MaxParallel"), v, "MaxParallel")?,
        },
        health_check,
        min_healthy_time: u.min_healthy_time.unwrap_or(base.min_healthy_time),
        // Nomad serves a job's own `Update` with zero timings (its groups carry the
        // real ones): a zero deadline, which could never be met, is the default.
        healthy_deadline: u
            .healthy_deadline
            .filter(|d| !d.is_zero())
            .unwrap_or(base.healthy_deadline),
        progress_deadline: u.progress_deadline.unwrap_or(base.progress_deadline),
        canary: match u.canary {
            None => base.canary,
            Some(v) => count_u32(&join(path, "Canary"), v, "Canary")?,
        },
        auto_promote: u.auto_promote.unwrap_or(base.auto_promote),
        auto_revert: u.auto_revert.unwrap_or(base.auto_revert),
        stagger: u.stagger.unwrap_or(base.stagger),
    })
}

/// Nomad's restart defaults by job type (`structs.DefaultServiceJobRestartPolicy`,
/// `DefaultBatchJobRestartPolicy`).
pub fn default_restart(job_type: JobType) -> InternalRestart {
    match job_type {
        JobType::Batch => InternalRestart {
            attempts: 3,
            interval: Duration::from_secs(24 * 3600),
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        },
        JobType::Service | JobType::System => InternalRestart {
            attempts: 2,
            interval: Duration::from_secs(30 * 60),
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        },
    }
}

fn restart_over(
    base: &InternalRestart,
    path: &str,
    r: &RestartPolicy,
) -> Result<InternalRestart, ConversionError> {
    Ok(InternalRestart {
        attempts: match r.attempts {
            None => base.attempts,
            Some(v) => count_u32(&join(path, "Attempts"), v, "Attempts")?,
        },
        interval: r.interval.unwrap_or(base.interval),
        delay: r.delay.unwrap_or(base.delay),
        mode: match r.mode.as_deref() {
            None | Some("") => base.mode,
            Some("fail") => RestartMode::Fail,
            Some("delay") => RestartMode::Delay,
            Some(other) => {
                return Err(ConversionError::new(
                    join(path, "Mode"),
                    format!("unknown mode {other:?} (fail or delay)"),
                ));
            }
        },
    })
}

fn reschedule_over(
    base: &internal::ReschedulePolicy,
    path: &str,
    r: &ReschedulePolicy,
) -> Result<internal::ReschedulePolicy, ConversionError> {
    let constant = match r.delay_function.as_deref() {
        None | Some("") | Some(DELAY_FUNCTION) => false,
        Some(CONSTANT_DELAY_FUNCTION) => true,
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "DelayFunction"),
                format!(
                    "delay function {other:?} is not supported yet by Drover \
                     ({DELAY_FUNCTION:?} or {CONSTANT_DELAY_FUNCTION:?})"
                ),
            ));
        }
    };
    let delay = r.delay.unwrap_or(base.delay);
    let max_delay = match r.max_delay {
        // A constant delay is a doubling one that may not grow.
        _ if constant => delay,
        Some(m) => m,
        // A longer delay than the default limit lifts the limit rather than making
        // the policy invalid.
        None => base.max_delay.max(delay),
    };
    Ok(internal::ReschedulePolicy {
        attempts: match r.attempts {
            None => base.attempts,
            Some(v) => count_u32(&join(path, "Attempts"), v, "Attempts")?,
        },
        interval: r.interval.unwrap_or(base.interval),
        delay,
        max_delay,
        unlimited: r.unlimited.unwrap_or(base.unlimited),
    })
}

// ---------------------------------------------------------------------------------------
// Internal → wire
// ---------------------------------------------------------------------------------------

impl From<&internal::JobSpec> for Job {
    /// The spec as a client submits it (no server-set fields).
    fn from(spec: &internal::JobSpec) -> Job {
        Job {
            region: None,
            namespace: Some(spec.namespace.clone()),
            id: Some(spec.name.clone()),
            name: Some(spec.name.clone()),
            job_type: Some(spec.job_type.as_str().to_owned()),
            priority: Some(i64::from(spec.priority)),
            datacenters: Some(spec.datacenters.clone()),
            constraints: Some(spec.constraints.iter().map(Constraint::from).collect()),
            task_groups: Some(spec.groups.iter().map(TaskGroup::from).collect()),
            update: Some(UpdateStrategy::from(&spec.update)),
            meta: Some(spec.meta.clone()),
            ..Default::default()
        }
    }
}

impl From<&internal::Job> for Job {
    /// The job as the server serves it (`Region` is `global`: a server with another
    /// region sets its own).
    fn from(job: &internal::Job) -> Job {
        let mut out = Job::from(&job.spec);
        out.region = Some(DEFAULT_REGION.to_owned());
        out.stop = Some(job.stop);
        out.status = Some(job_status(job.status).to_owned());
        out.status_description = Some(String::new());
        out.stable = Some(job.stable);
        out.version = Some(job.version);
        out.submit_time = Some(job.submit_time);
        out.create_index = Some(job.create_index);
        out.modify_index = Some(job.modify_index);
        out.job_modify_index = Some(job.job_modify_index);
        out.all_at_once = Some(Value::Bool(false));
        out.dispatched = Some(Value::Bool(false));
        out
    }
}

/// `pending`, `running`, `dead`.
pub fn job_status(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Pending => "pending",
        JobStatus::Running => "running",
        JobStatus::Dead => "dead",
    }
}

/// The internal status of Nomad's `pending`, `running`, `dead` (unknown: pending).
pub fn job_status_from(s: &str) -> JobStatus {
    match s {
        "running" => JobStatus::Running,
        "dead" => JobStatus::Dead,
        _ => JobStatus::Pending,
    }
}

impl From<&internal::TaskGroup> for TaskGroup {
    fn from(g: &internal::TaskGroup) -> TaskGroup {
        TaskGroup {
            name: Some(g.name.clone()),
            count: Some(i64::from(g.count)),
            constraints: Some(g.constraints.iter().map(Constraint::from).collect()),
            tasks: Some(g.tasks.iter().map(Task::from).collect()),
            restart_policy: None,
            reschedule_policy: g.reschedule.as_ref().map(ReschedulePolicy::from),
            update: g.update.as_ref().map(UpdateStrategy::from),
            meta: Some(g.meta.clone()),
            networks: g.network.as_ref().map(|n| vec![NetworkResource::from(n)]),
            services: Some(g.services.iter().map(Service::from).collect()),
            volumes: Some(
                g.volumes
                    .iter()
                    .map(|(name, v)| (name.clone(), super::VolumeRequest::from((name, v))))
                    .collect(),
            ),
            ..Default::default()
        }
    }
}

impl From<&internal::Task> for Task {
    fn from(t: &internal::Task) -> Task {
        Task {
            name: Some(t.name.clone()),
            driver: Some(t.driver.clone()),
            lifecycle: t.lifecycle.map(|l| TaskLifecycle {
                hook: match l.hook {
                    LifecycleHook::Prestart => "prestart",
                    LifecycleHook::Poststart => "poststart",
                    LifecycleHook::Poststop => "poststop",
                }
                .to_owned(),
                sidecar: l.sidecar,
            }),
            config: Some(t.config.clone()),
            constraints: None,
            env: Some(t.env.clone()),
            resources: Some(Resources {
                cpu: Some(i64::from(t.resources.cpu)),
                memory_mb: Some(i64::from(t.resources.memory_mb)),
                memory_max_mb: Some(i64::from(t.resources.memory_max_mb)),
                devices: (!t.devices.is_empty()).then(|| {
                    t.devices
                        .iter()
                        .map(|d| RequestedDevice {
                            name: d.name.clone(),
                            count: Some(i64::from(d.count)),
                            constraints: (!d.constraints.is_empty())
                                .then(|| d.constraints.iter().map(Constraint::from).collect()),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            restart_policy: t.restart.as_ref().map(RestartPolicy::from),
            meta: Some(t.meta.clone()),
            kill_timeout: t.kill_timeout,
            kill_signal: Some(t.kill_signal.clone().unwrap_or_default()),
            log_config: t.logs.map(|l| LogConfig {
                max_files: Some(i64::from(l.max_files)),
                max_file_size_mb: Some(i64::from(l.max_file_size_mb)),
            }),
            services: Some(t.services.iter().map(Service::from).collect()),
            artifacts: Some(t.artifacts.iter().map(TaskArtifact::from).collect()),
            templates: Some(t.templates.iter().map(Template::from).collect()),
            identity: t.identity.map(|id| WorkloadIdentity {
                env: Some(id.env),
                file: Some(id.file),
                other: BTreeMap::new(),
            }),
            volume_mounts: Some(
                t.volume_mounts
                    .iter()
                    .map(super::VolumeMount::from)
                    .collect(),
            ),
            ..Default::default()
        }
    }
}

impl From<&internal::Constraint> for Constraint {
    fn from(c: &internal::Constraint) -> Constraint {
        Constraint {
            l_target: c.attribute.clone(),
            r_target: c.value.clone(),
            operand: c.operator.as_str().to_owned(),
        }
    }
}

impl From<&InternalRestart> for RestartPolicy {
    fn from(r: &InternalRestart) -> RestartPolicy {
        RestartPolicy {
            interval: Some(r.interval),
            attempts: Some(i64::from(r.attempts)),
            delay: Some(r.delay),
            mode: Some(
                match r.mode {
                    RestartMode::Fail => "fail",
                    RestartMode::Delay => "delay",
                }
                .to_owned(),
            ),
        }
    }
}

impl From<&internal::ReschedulePolicy> for ReschedulePolicy {
    fn from(r: &internal::ReschedulePolicy) -> ReschedulePolicy {
        ReschedulePolicy {
            attempts: Some(i64::from(r.attempts)),
            interval: Some(r.interval),
            delay: Some(r.delay),
            delay_function: Some(
                if r.max_delay == r.delay {
                    CONSTANT_DELAY_FUNCTION
                } else {
                    DELAY_FUNCTION
                }
                .to_owned(),
            ),
            max_delay: Some(r.max_delay),
            unlimited: Some(r.unlimited),
        }
    }
}

/// A group's counts in Nomad's shape.
impl From<&internal::GroupSummary> for TaskGroupSummary {
    fn from(s: &internal::GroupSummary) -> TaskGroupSummary {
        TaskGroupSummary {
            queued: i64::from(s.queued),
            complete: i64::from(s.complete),
            failed: i64::from(s.failed),
            running: i64::from(s.running),
            starting: i64::from(s.pending),
            lost: i64::from(s.lost),
        }
    }
}

impl From<&TaskGroupSummary> for internal::GroupSummary {
    fn from(s: &TaskGroupSummary) -> internal::GroupSummary {
        let c = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
        internal::GroupSummary {
            queued: c(s.queued),
            complete: c(s.complete),
            failed: c(s.failed),
            running: c(s.running),
            pending: c(s.starting),
            lost: c(s.lost),
        }
    }
}

impl JobSummary {
    /// The summary of `job` from its per-group counts.
    pub fn new(
        namespace: &str,
        job_id: &str,
        summary: &BTreeMap<String, internal::GroupSummary>,
        create_index: u64,
        modify_index: u64,
    ) -> JobSummary {
        JobSummary {
            job_id: job_id.to_owned(),
            namespace: namespace.to_owned(),
            summary: summary
                .iter()
                .map(|(g, s)| (g.clone(), TaskGroupSummary::from(s)))
                .collect(),
            children: Some(JobChildrenSummary::default()),
            create_index,
            modify_index,
        }
    }
}

impl JobListStub {
    /// The stub of a stored job with its per-group counts. The internal list stub lacks
    /// the datacenters and times, so the stub is made from the job.
    pub fn new(
        job: &internal::Job,
        summary: &BTreeMap<String, internal::GroupSummary>,
    ) -> JobListStub {
        JobListStub {
            id: job.spec.name.clone(),
            parent_id: String::new(),
            name: job.spec.name.clone(),
            namespace: job.spec.namespace.clone(),
            datacenters: job.spec.datacenters.clone(),
            job_type: job.spec.job_type.as_str().to_owned(),
            priority: i64::from(job.spec.priority),
            periodic: false,
            parameterized_job: false,
            stop: job.stop,
            status: job_status(job.status).to_owned(),
            status_description: String::new(),
            job_summary: Some(JobSummary::new(
                &job.spec.namespace,
                &job.spec.name,
                summary,
                job.create_index,
                job.modify_index,
            )),
            create_index: job.create_index,
            modify_index: job.modify_index,
            job_modify_index: job.job_modify_index,
            submit_time: job.submit_time,
            version: job.version,
        }
    }
}

impl From<&internal::JobListStub> for JobListStub {
    /// The stub from Drover's internal stub (no datacenters, submit time or job modify
    /// index: use [`JobListStub::new`] where the job is at hand).
    fn from(s: &internal::JobListStub) -> JobListStub {
        JobListStub {
            id: s.name.clone(),
            parent_id: String::new(),
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            datacenters: Vec::new(),
            job_type: s.job_type.as_str().to_owned(),
            priority: i64::from(s.priority),
            periodic: false,
            parameterized_job: false,
            stop: s.stop,
            status: job_status(s.status).to_owned(),
            status_description: String::new(),
            job_summary: Some(JobSummary::new(
                &s.namespace,
                &s.name,
                &s.summary,
                s.create_index,
                s.modify_index,
            )),
            create_index: s.create_index,
            modify_index: s.modify_index,
            job_modify_index: 0,
            submit_time: 0,
            version: s.version,
        }
    }
}

impl From<&JobListStub> for internal::JobListStub {
    /// What the CLI renders of a job list line. An unknown type reads as `service`.
    fn from(s: &JobListStub) -> internal::JobListStub {
        internal::JobListStub {
            namespace: namespace_or_default(&s.namespace),
            name: s.id.clone(),
            job_type: job_type_from(&s.job_type),
            priority: u8::try_from(s.priority).unwrap_or(u8::MAX),
            status: job_status_from(&s.status),
            stop: s.stop,
            version: s.version,
            summary: s
                .job_summary
                .iter()
                .flat_map(|j| j.summary.iter())
                .map(|(g, c)| (g.clone(), internal::GroupSummary::from(c)))
                .collect(),
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

/// The internal type of Nomad's type name (unknown: service).
pub fn job_type_from(s: &str) -> JobType {
    match s {
        "batch" => JobType::Batch,
        "system" => JobType::System,
        _ => JobType::Service,
    }
}

impl Job {
    /// The stored job a served job describes: the spec converted back, and the
    /// server-set fields. For clients (the CLI) that render internal types.
    pub fn to_internal(&self) -> Result<internal::Job, ConversionError> {
        let spec = self.to_spec()?.spec;
        Ok(internal::Job {
            spec,
            version: self.version.unwrap_or_default(),
            stop: self.stop.unwrap_or_default(),
            status: job_status_from(self.status.as_deref().unwrap_or_default()),
            submit_time: self.submit_time.unwrap_or_default(),
            create_index: self.create_index.unwrap_or_default(),
            modify_index: self.modify_index.unwrap_or_default(),
            job_modify_index: self.job_modify_index.unwrap_or_default(),
            stable: self.stable.unwrap_or_default(),
        })
    }
}

impl From<&internal::JobRegisterResponse> for JobRegisterResponse {
    fn from(r: &internal::JobRegisterResponse) -> JobRegisterResponse {
        JobRegisterResponse {
            eval_id: r.eval_id.clone(),
            eval_create_index: if r.eval_id.is_empty() { 0 } else { r.index },
            job_modify_index: r.job_modify_index,
            warnings: r.warnings.join("\n"),
            index: r.index,
            last_contact: 0,
            known_leader: true,
        }
    }
}

impl From<&JobRegisterResponse> for internal::JobRegisterResponse {
    fn from(r: &JobRegisterResponse) -> internal::JobRegisterResponse {
        internal::JobRegisterResponse {
            eval_id: r.eval_id.clone(),
            job_modify_index: r.job_modify_index,
            index: r.index,
            warnings: r
                .warnings
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

impl From<&internal::JobRegisterResponse> for JobDeregisterResponse {
    fn from(r: &internal::JobRegisterResponse) -> JobDeregisterResponse {
        JobDeregisterResponse {
            eval_id: r.eval_id.clone(),
            eval_create_index: if r.eval_id.is_empty() { 0 } else { r.index },
            job_modify_index: r.job_modify_index,
            index: r.index,
            last_contact: 0,
            known_leader: true,
        }
    }
}

impl From<&JobDeregisterResponse> for internal::JobRegisterResponse {
    fn from(r: &JobDeregisterResponse) -> internal::JobRegisterResponse {
        internal::JobRegisterResponse {
            eval_id: r.eval_id.clone(),
            job_modify_index: r.job_modify_index,
            index: r.index,
            warnings: Vec::new(),
        }
    }
}

impl JobPlanResponse {
    /// Drover's plan answer for job `job_id` in Nomad's shape (`existed`: the job was
    /// registered before, for the diff's type), with `warnings`.
    pub fn new(
        job_id: &str,
        plan: &internal::JobPlanResponse,
        existed: bool,
        warnings: &[String],
    ) -> JobPlanResponse {
        let diff_type = match (existed, plan.changed) {
            (false, _) => "Added",
            (true, true) => "Edited",
            (true, false) => "None",
        };
        JobPlanResponse {
            job_modify_index: plan.job_modify_index,
            created_evals: None,
            diff: Some(JobDiff {
                diff_type: diff_type.to_owned(),
                id: job_id.to_owned(),
                ..Default::default()
            }),
            annotations: Some(PlanAnnotations {
                desired_tg_updates: plan
                    .groups
                    .iter()
                    .map(|(g, s)| {
                        (
                            g.clone(),
                            DesiredUpdates {
                                ignore: u64::from(s.ignore),
                                place: u64::from(s.place),
                                stop: u64::from(s.stop),
                                destructive_update: u64::from(s.update),
                                canary: u64::from(s.canary),
                                ..Default::default()
                            },
                        )
                    })
                    .collect(),
                preempted_allocs: None,
            }),
            failed_tg_allocs: Some(
                plan.failed_tg_allocs
                    .iter()
                    .map(|(g, f)| (g.clone(), super::AllocationMetric::from(f)))
                    .collect(),
            ),
            next_periodic_launch: None,
            warnings: warnings.join("\n"),
            job_version: plan.job_version,
            changed: plan.changed,
            groups: plan
                .groups
                .iter()
                .map(|(g, s)| {
                    (
                        g.clone(),
                        GroupPlan {
                            place: s.place,
                            stop: s.stop,
                            update: s.update,
                            ignore: s.ignore,
                            canary: s.canary,
                        },
                    )
                })
                .collect(),
        }
    }
}

impl From<&JobPlanResponse> for internal::JobPlanResponse {
    fn from(p: &JobPlanResponse) -> internal::JobPlanResponse {
        // Drover's own groups when present, else Nomad's annotations.
        let groups = if !p.groups.is_empty() {
            p.groups
                .iter()
                .map(|(g, s)| {
                    (
                        g.clone(),
                        GroupPlanSummary {
                            place: s.place,
                            stop: s.stop,
                            update: s.update,
                            ignore: s.ignore,
                            canary: s.canary,
                        },
                    )
                })
                .collect()
        } else {
            let c = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
            p.annotations
                .iter()
                .flat_map(|a| a.desired_tg_updates.iter())
                .map(|(g, u)| {
                    (
                        g.clone(),
                        GroupPlanSummary {
                            place: c(u.place),
                            stop: c(u.stop),
                            update: c(u.destructive_update + u.in_place_update),
                            ignore: c(u.ignore),
                            canary: c(u.canary),
                        },
                    )
                })
                .collect()
        };
        internal::JobPlanResponse {
            job_version: p.job_version,
            changed: p.changed
                || p.diff
                    .as_ref()
                    .is_some_and(|d| d.diff_type != "None" && !d.diff_type.is_empty()),
            groups,
            failed_tg_allocs: p
                .failed_tg_allocs
                .iter()
                .flatten()
                .map(|(g, m)| (g.clone(), PlacementFailure::from(m)))
                .collect(),
            job_modify_index: p.job_modify_index,
        }
    }
}
