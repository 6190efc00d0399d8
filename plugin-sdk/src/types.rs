//! Plain Rust types a driver works with, and their conversions to and from the wire.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use drover_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::DriverError;
use crate::signal::Signal;

/// Identity of a plugin, answered by `PluginInfo`.
///
/// ```
/// let info = drover_plugin_sdk::PluginInfo::new("rawexec", env!("CARGO_PKG_VERSION"));
/// assert_eq!(info.name, "rawexec");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PluginInfo {
    /// Unique name, lowercase `[a-z0-9_-]`.
    pub name: String,
    /// Semver of the plugin binary.
    pub version: String,
}

impl PluginInfo {
    /// A plugin named `name` at `version`.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        PluginInfo {
            name: name.into(),
            version: version.into(),
        }
    }
}

/// How much of the host file system a task sees.
///
/// ```
/// assert_eq!(drover_plugin_sdk::FsIsolation::default(), drover_plugin_sdk::FsIsolation::None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FsIsolation {
    /// The task sees the host file system (rawexec).
    #[default]
    None,
    /// The task runs in a chroot built from the task directory (exec, java).
    Chroot,
    /// The task runs in its own image (docker, qemu).
    Image,
}

/// The network modes a driver offers its tasks.
///
/// ```
/// let n = drover_plugin_sdk::NetworkModes::default().with_host(true).with_none(true);
/// assert!(n.host && n.none && !n.bridge);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NetworkModes {
    /// The host's network stack.
    pub host: bool,
    /// An own network namespace with only a loopback device.
    pub none: bool,
    /// An own network namespace attached to a bridge.
    pub bridge: bool,
    /// Joins the network namespace of its task group ([`TaskSpec::netns_path`]: a
    /// group in bridge mode, whose namespace the agent made), as Nomad's `group`
    /// isolation mode.
    #[serde(default)]
    pub group: bool,
}

impl NetworkModes {
    /// With or without [`NetworkModes::host`].
    pub fn with_host(mut self, on: bool) -> Self {
        self.host = on;
        self
    }
    /// With or without [`NetworkModes::none`].
    pub fn with_none(mut self, on: bool) -> Self {
        self.none = on;
        self
    }
    /// With or without [`NetworkModes::bridge`].
    pub fn with_bridge(mut self, on: bool) -> Self {
        self.bridge = on;
        self
    }
    /// With or without [`NetworkModes::group`].
    pub fn with_group(mut self, on: bool) -> Self {
        self.group = on;
        self
    }
}

/// What a driver supports. Optional RPCs a driver does not support answer
/// `UNIMPLEMENTED`; these flags let the host know up front.
///
/// Start from the default (nothing supported) and add what the driver does:
///
/// ```
/// use drover_plugin_sdk::{Capabilities, FsIsolation};
/// let caps = Capabilities::default()
///     .with_send_signals(true)
///     .with_fs_isolation(FsIsolation::Chroot);
/// assert!(caps.send_signals && !caps.exec);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// `SignalTask` works.
    pub send_signals: bool,
    /// `ExecTask` works.
    pub exec: bool,
    /// File system isolation of tasks.
    pub fs_isolation: FsIsolation,
    /// `TaskStats` works.
    pub task_stats: bool,
    /// `TaskEvents` works.
    pub task_events: bool,
    /// Tasks outlive the plugin process and `RecoverTask` reattaches to them.
    pub recover: bool,
    /// Network modes tasks can ask for (none set: the driver does not say).
    pub network_modes: NetworkModes,
}

impl Capabilities {
    /// With or without [`Capabilities::send_signals`].
    pub fn with_send_signals(mut self, on: bool) -> Self {
        self.send_signals = on;
        self
    }
    /// With or without [`Capabilities::exec`].
    pub fn with_exec(mut self, on: bool) -> Self {
        self.exec = on;
        self
    }
    /// With [`Capabilities::fs_isolation`] set.
    pub fn with_fs_isolation(mut self, isolation: FsIsolation) -> Self {
        self.fs_isolation = isolation;
        self
    }
    /// With or without [`Capabilities::task_stats`].
    pub fn with_task_stats(mut self, on: bool) -> Self {
        self.task_stats = on;
        self
    }
    /// With or without [`Capabilities::task_events`].
    pub fn with_task_events(mut self, on: bool) -> Self {
        self.task_events = on;
        self
    }
    /// With or without [`Capabilities::recover`].
    pub fn with_recover(mut self, on: bool) -> Self {
        self.recover = on;
        self
    }
    /// With [`Capabilities::network_modes`] set.
    pub fn with_network_modes(mut self, modes: NetworkModes) -> Self {
        self.network_modes = modes;
        self
    }
}

/// Driver health on this node.
///
/// ```
/// use drover_plugin_sdk::{Fingerprint, Health};
/// let fp = Fingerprint::not_ready(Health::Undetected, "docker is not installed");
/// assert_eq!(fp.health, Health::Undetected);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Health {
    /// The driver cannot run on this node (e.g. docker is not installed).
    #[default]
    Undetected,
    /// The driver should work but does not right now.
    Unhealthy,
    /// Ready to run tasks.
    Healthy,
}

/// One fingerprint: health plus node attributes.
///
/// ```
/// let fp = drover_plugin_sdk::Fingerprint::healthy("ready")
///     .attribute("driver.rawexec.version", "0.1.0");
/// assert_eq!(fp.attributes["driver.rawexec.version"], "0.1.0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fingerprint {
    /// Health.
    pub health: Health,
    /// A sentence saying why, for people.
    pub description: String,
    /// Node attributes, e.g. `driver.docker.version`.
    pub attributes: BTreeMap<String, String>,
}

impl Fingerprint {
    /// A healthy fingerprint with a description.
    pub fn healthy(description: impl Into<String>) -> Self {
        Fingerprint {
            health: Health::Healthy,
            description: description.into(),
            attributes: BTreeMap::new(),
        }
    }
    /// An unhealthy or undetected fingerprint with the reason.
    pub fn not_ready(health: Health, description: impl Into<String>) -> Self {
        Fingerprint {
            health,
            description: description.into(),
            attributes: BTreeMap::new(),
        }
    }
    /// Add one attribute.
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(key.into(), value.into());
        self
    }
}

/// Resources requested for a task.
///
/// ```
/// let r = drover_plugin_sdk::Resources::default().with_memory_mb(256);
/// assert_eq!((r.memory_mb, r.cpu_shares), (256, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Resources {
    /// Relative CPU weight.
    pub cpu_shares: i64,
    /// Memory reservation in MiB (0: none).
    pub memory_mb: i64,
    /// Hard memory limit in MiB (0: same as `memory_mb`).
    pub memory_max_mb: i64,
}

impl Resources {
    /// With [`Resources::cpu_shares`] set.
    pub fn with_cpu_shares(mut self, shares: i64) -> Self {
        self.cpu_shares = shares;
        self
    }
    /// With [`Resources::memory_mb`] set.
    pub fn with_memory_mb(mut self, mb: i64) -> Self {
        self.memory_mb = mb;
        self
    }
    /// With [`Resources::memory_max_mb`] set.
    pub fn with_memory_max_mb(mut self, mb: i64) -> Self {
        self.memory_max_mb = mb;
        self
    }
}

/// Where a task's stdout and stderr paths lead: how [`crate::logs::RotatingWriter`]
/// writes them.
///
/// A Drover agent always asks for [`LogMode::Rotate`]. A Nomad agent (see
/// [`crate::server`], "Nomad's protocol") hands the driver the paths of two FIFOs that
/// its own `logmon` process reads and rotates: the SDK then sets [`LogMode::Direct`],
/// and the driver's output goes into those FIFOs as it is.
///
/// ```
/// use drover_plugin_sdk::{LogConfig, LogMode};
/// assert_eq!(LogConfig::default().mode, LogMode::Rotate);
/// assert_eq!(LogConfig::default().with_mode(LogMode::Direct).mode, LogMode::Direct);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum LogMode {
    /// The path is the base of numbered, size- and count-capped files
    /// (`<path>.0`, `<path>.1`, …) that the driver writes and rotates.
    #[default]
    Rotate,
    /// The path is one FIFO (or file) that someone else reads and rotates: the driver
    /// writes to it as it is, never renames, caps or deletes it. It is opened
    /// write-only without following a link; a FIFO with no reader yet is waited for
    /// (up to [`crate::logs::DIRECT_OPEN_TIMEOUT`]); a missing path is created as a
    /// regular 0600 file; anything else (a directory, a device, a socket) is refused.
    /// The limits of [`LogConfig`] do not apply.
    Direct,
}

/// How a task's stdout and stderr are written: rotation limits, or [`LogMode::Direct`].
///
/// ```
/// let l = drover_plugin_sdk::LogConfig::default();
/// assert_eq!((l.max_files, l.max_file_size_mb), (10, 10));
/// let small = drover_plugin_sdk::LogConfig::new(2, 1);
/// assert_eq!((small.max_files, small.max_file_size_mb), (2, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LogConfig {
    /// How many files to keep per stream.
    pub max_files: u32,
    /// Size of one file in MiB.
    pub max_file_size_mb: u32,
    /// Whether the paths are rotated files' base (the default) or FIFOs/files to
    /// write as they are.
    pub mode: LogMode,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig::new(10, 10)
    }
}

impl LogConfig {
    /// Keep `max_files` files of `max_file_size_mb` MiB per stream.
    pub fn new(max_files: u32, max_file_size_mb: u32) -> Self {
        LogConfig {
            max_files,
            max_file_size_mb,
            mode: LogMode::Rotate,
        }
    }
    /// With [`LogConfig::mode`] set.
    pub fn with_mode(mut self, mode: LogMode) -> Self {
        self.mode = mode;
        self
    }
    /// With [`LogConfig::max_files`] set.
    pub fn with_max_files(mut self, max_files: u32) -> Self {
        self.max_files = max_files;
        self
    }
    /// With [`LogConfig::max_file_size_mb`] set.
    pub fn with_max_file_size_mb(mut self, mb: u32) -> Self {
        self.max_file_size_mb = mb;
        self
    }
}

/// Everything about a task except its driver-specific config, which the driver gets
/// separately as its typed `TaskConfig`.
///
/// ```
/// let spec = drover_plugin_sdk::TaskSpec::new("web-1")
///     .with_stdout_path("/alloc/web-1/logs/stdout")
///     .with_env("GREETING", "hello");
/// assert!(drover_plugin_sdk::validate_task_id(&spec.id).is_ok());
/// assert_eq!(spec.env["GREETING"], "hello");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskSpec {
    /// Unique id, `[A-Za-z0-9_.-]{1,128}` (validated by the SDK before the driver sees it).
    pub id: String,
    /// Human name.
    pub name: String,
    /// Environment for the task.
    pub env: BTreeMap<String, String>,
    /// Requested resources.
    pub resources: Resources,
    /// The task's directory (empty: the driver picks none).
    pub task_dir: PathBuf,
    /// Base path of the task's stdout files (empty: discarded). The driver writes
    /// `<stdout_path>.0`, `.1`, … with [`crate::logs::RotatingWriter`] under the
    /// limits in [`TaskSpec::logs`]; when its [`LogConfig::mode`] is
    /// [`LogMode::Direct`] (under a Nomad agent), this path is a FIFO written as it is,
    /// which [`crate::logs::RotatingWriter::open`] does by itself.
    pub stdout_path: PathBuf,
    /// Base path of the task's stderr files, like [`TaskSpec::stdout_path`].
    pub stderr_path: PathBuf,
    /// Log rotation limits.
    pub logs: LogConfig,
    /// User to run as (empty: the plugin's user).
    pub user: String,
    /// The raw driver config JSON, kept so that a recovered task knows its config.
    pub driver_config_json: String,
    /// The shared directory of the task's allocation on the host (`<alloc>/alloc`, with
    /// `data/`, `logs/`, `tmp/`), which every task of its group sees; empty for a task
    /// outside an allocation. Drivers that isolate the filesystem mount it at `/alloc`.
    #[serde(default)]
    pub alloc_dir: PathBuf,
    /// The network namespace the task joins: its group's, in bridge mode
    /// (`/run/netns/<alloc id>`), shared by every task of the group; empty: the
    /// driver's own network choice. Only given to a driver whose
    /// [`NetworkModes::group`] is set; it enters the namespace (setns) before the
    /// task's exec.
    #[serde(default, skip_serializing_if = "crate::types::path_is_empty")]
    pub netns_path: PathBuf,
    /// The ports the scheduler gave the task's allocation on the node, one per label
    /// of the group's `network` (Nomad's `Resources.Ports`). A driver that publishes
    /// ports (docker `ports`, qemu `port_map`) forwards [`TaskPort::host_ip`] and
    /// [`TaskPort::value`] to [`TaskPort::to`] inside the task; the task's
    /// environment already has `NOMAD_PORT_<label>` and the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<TaskPort>,
    /// Host volumes the task mounts. A driver that isolates the filesystem binds each
    /// [`TaskVolume::host_path`] (the directory itself, opened without following
    /// links) at [`TaskVolume::destination`]; one that cannot must refuse the task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<TaskVolume>,
    /// Device nodes the task was given by a device plugin's reservation. A driver that
    /// isolates the filesystem creates each [`TaskDevice::task_path`] as the node
    /// [`TaskDevice::host_path`] is (its type, major and minor, read without
    /// following a link) and lets the task use it with [`TaskDevice::permissions`]
    /// only; a driver without isolation ignores them (the task sees the host's
    /// `/dev` anyway).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<TaskDevice>,
    /// Host paths a device plugin's reservation mounts into the task (driver
    /// libraries, control files). A driver that isolates the filesystem binds each
    /// [`TaskMount::host_path`] at [`TaskMount::task_path`]; one without ignores them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<TaskMount>,
}

/// A device node a task was given (a device plugin's reservation).
///
/// ```
/// let d = drover_plugin_sdk::TaskDevice::new("/srv/nodes/zero0", "/dev/zero0").with_permissions("r");
/// assert_eq!(d.permissions, "r");
/// let spec = drover_plugin_sdk::TaskSpec::new("t1").with_devices([d]);
/// assert_eq!(spec.devices[0].task_path, std::path::Path::new("/dev/zero0"));
/// // Read and write unless said otherwise.
/// assert_eq!(drover_plugin_sdk::TaskDevice::new("/dev/kvm", "/dev/kvm").permissions, "rw");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TaskDevice {
    /// The device node on the host (a character or block device).
    pub host_path: PathBuf,
    /// Where the task sees it: an absolute path, usually below `/dev`.
    pub task_path: PathBuf,
    /// What the task may do with it, as cgroup device rules say: some of `r` (read),
    /// `w` (write) and `m` (mknod).
    pub permissions: String,
}

impl TaskDevice {
    /// The node `host_path` seen at `task_path`, readable and writable.
    pub fn new(host_path: impl Into<PathBuf>, task_path: impl Into<PathBuf>) -> Self {
        TaskDevice {
            host_path: host_path.into(),
            task_path: task_path.into(),
            permissions: "rw".into(),
        }
    }
    /// With [`TaskDevice::permissions`] set.
    pub fn with_permissions(mut self, permissions: impl Into<String>) -> Self {
        self.permissions = permissions.into();
        self
    }
}

/// A host path mounted into a task by a device plugin's reservation.
///
/// ```
/// let m = drover_plugin_sdk::TaskMount::new("/usr/lib/gpu", "/usr/lib/gpu").with_read_only(true);
/// assert!(m.read_only);
/// let spec = drover_plugin_sdk::TaskSpec::new("t1").with_mounts([m]);
/// assert_eq!(spec.mounts.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TaskMount {
    /// The path on the host.
    pub host_path: PathBuf,
    /// Where the task sees it: an absolute path without `..`.
    pub task_path: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

impl TaskMount {
    /// `host_path` seen at `task_path`, writable.
    pub fn new(host_path: impl Into<PathBuf>, task_path: impl Into<PathBuf>) -> Self {
        TaskMount {
            host_path: host_path.into(),
            task_path: task_path.into(),
            read_only: false,
        }
    }
    /// With [`TaskMount::read_only`] set.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }
}

/// A host volume a task mounts.
///
/// ```
/// let v = drover_plugin_sdk::TaskVolume::new("data", "/srv/data", "/data").with_read_only(true);
/// assert!(v.read_only);
/// let spec = drover_plugin_sdk::TaskSpec::new("t1").with_volumes([v]);
/// assert_eq!(spec.volumes[0].destination, std::path::Path::new("/data"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TaskVolume {
    /// The group's name of the volume.
    pub name: String,
    /// The volume's directory on the node (an absolute directory owned by root, not a
    /// link: the agent checked it at start).
    pub host_path: PathBuf,
    /// Where the task sees it: absolute, without `..`.
    pub destination: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

impl TaskVolume {
    /// Volume `name` at `host_path` on the node, seen at `destination`, writable.
    pub fn new(
        name: impl Into<String>,
        host_path: impl Into<PathBuf>,
        destination: impl Into<PathBuf>,
    ) -> Self {
        TaskVolume {
            name: name.into(),
            host_path: host_path.into(),
            destination: destination.into(),
            read_only: false,
        }
    }
    /// With [`TaskVolume::read_only`] set.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }
}

fn path_is_empty(p: &std::path::Path) -> bool {
    p.as_os_str().is_empty()
}

/// A port of a task's allocation on its node.
///
/// ```
/// let p = drover_plugin_sdk::TaskPort::new("http", 23456)
///     .with_to(80)
///     .with_host_ip("127.0.0.1");
/// assert_eq!((p.label.as_str(), p.value, p.to), ("http", 23456, 80));
/// // Unmapped: the task listens on the node's port itself.
/// assert_eq!(drover_plugin_sdk::TaskPort::new("db", 24000).task_port(), 24000);
/// let spec = drover_plugin_sdk::TaskSpec::new("web-1").with_ports([p]);
/// assert_eq!(spec.port("http").map(|p| p.task_port()), Some(80));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TaskPort {
    /// The group's label for the port (`http` of `port "http" {}`).
    pub label: String,
    /// The port on the node.
    pub value: u16,
    /// The port inside the task it maps to (0: the same as [`TaskPort::value`]).
    pub to: u16,
    /// The node's address the port is on.
    pub host_ip: String,
}

impl TaskPort {
    /// Port `value` on the node under `label`, not mapped, on no particular address.
    pub fn new(label: impl Into<String>, value: u16) -> Self {
        TaskPort {
            label: label.into(),
            value,
            to: 0,
            host_ip: String::new(),
        }
    }
    /// With [`TaskPort::to`] set.
    pub fn with_to(mut self, to: u16) -> Self {
        self.to = to;
        self
    }
    /// With [`TaskPort::host_ip`] set.
    pub fn with_host_ip(mut self, ip: impl Into<String>) -> Self {
        self.host_ip = ip.into();
        self
    }
    /// The port the task listens on: [`TaskPort::to`], or [`TaskPort::value`] when
    /// the port is not mapped (Nomad's rule for `NOMAD_PORT_<label>`).
    pub fn task_port(&self) -> u16 {
        if self.to == 0 { self.value } else { self.to }
    }
}

/// Nomad's `port_map` driver option (docker, qemu): the port inside the task for each
/// port label, as HCL gives it (`[{"http": 80}]`) or as a plain map (`{"http": 80}`);
/// ports may be numbers or strings. A wrong shape or a number outside 1-65535 is an
/// [`DriverError::InvalidConfig`] naming the entry.
///
/// ```
/// use serde_json::json;
/// let m = drover_plugin_sdk::port_map_entries(&json!([{"http": 80}, {"db": "5432"}])).unwrap();
/// assert_eq!(m["http"], 80);
/// assert_eq!(m["db"], 5432);
/// assert!(drover_plugin_sdk::port_map_entries(&json!({"http": 70000})).is_err());
/// ```
pub fn port_map_entries(value: &serde_json::Value) -> Result<BTreeMap<String, u16>, DriverError> {
    let bad = |why: String| {
        DriverError::InvalidConfig(format!(
            "port_map: {why} (expected port_map {{ http = 80 }})"
        ))
    };
    let maps: Vec<&serde_json::Map<String, serde_json::Value>> = match value {
        serde_json::Value::Object(m) => vec![m],
        serde_json::Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_object()
                    .ok_or_else(|| bad(format!("{i} is not a map of labels to ports")))
            })
            .collect::<Result<_, _>>()?,
        serde_json::Value::Null => Vec::new(),
        other => return Err(bad(format!("{other} is not a map of labels to ports"))),
    };
    let mut out = BTreeMap::new();
    for (label, port) in maps.into_iter().flatten() {
        let n = port
            .as_u64()
            .or_else(|| port.as_str().and_then(|s| s.parse().ok()))
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
            .ok_or_else(|| bad(format!("{label} = {port} is not a port from 1 to 65535")))?;
        out.insert(label.clone(), n);
    }
    Ok(out)
}

impl TaskSpec {
    /// A task with id `id` and nothing else set; its name is its id.
    pub fn new(id: impl Into<String>) -> Self {
        let id = id.into();
        TaskSpec {
            name: id.clone(),
            id,
            ..Default::default()
        }
    }
    /// With [`TaskSpec::id`] set.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
    /// With [`TaskSpec::name`] set.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// With one more environment variable.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }
    /// With more environment variables.
    pub fn with_envs<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }
    /// With [`TaskSpec::resources`] set.
    pub fn with_resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }
    /// With [`TaskSpec::task_dir`] set.
    pub fn with_task_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.task_dir = dir.into();
        self
    }
    /// With [`TaskSpec::stdout_path`] set.
    pub fn with_stdout_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.stdout_path = path.into();
        self
    }
    /// With [`TaskSpec::stderr_path`] set.
    pub fn with_stderr_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.stderr_path = path.into();
        self
    }
    /// With [`TaskSpec::logs`] set.
    pub fn with_logs(mut self, logs: LogConfig) -> Self {
        self.logs = logs;
        self
    }
    /// With [`TaskSpec::user`] set.
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }
    /// With [`TaskSpec::driver_config_json`] set.
    pub fn with_driver_config_json(mut self, json: impl Into<String>) -> Self {
        self.driver_config_json = json.into();
        self
    }
    /// With [`TaskSpec::alloc_dir`] set.
    pub fn with_alloc_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.alloc_dir = dir.into();
        self
    }
    /// With [`TaskSpec::netns_path`] set.
    pub fn with_netns_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.netns_path = path.into();
        self
    }

    /// With [`TaskSpec::ports`] set.
    pub fn with_ports(mut self, ports: impl IntoIterator<Item = TaskPort>) -> Self {
        self.ports = ports.into_iter().collect();
        self
    }
    /// With [`TaskSpec::volumes`] set.
    pub fn with_volumes(mut self, volumes: impl IntoIterator<Item = TaskVolume>) -> Self {
        self.volumes = volumes.into_iter().collect();
        self
    }
    /// With [`TaskSpec::devices`] set.
    pub fn with_devices(mut self, devices: impl IntoIterator<Item = TaskDevice>) -> Self {
        self.devices = devices.into_iter().collect();
        self
    }
    /// With [`TaskSpec::mounts`] set.
    pub fn with_mounts(mut self, mounts: impl IntoIterator<Item = TaskMount>) -> Self {
        self.mounts = mounts.into_iter().collect();
        self
    }
    /// The allocation's port labelled `label`, if it has one.
    pub fn port(&self, label: &str) -> Option<&TaskPort> {
        self.ports.iter().find(|p| p.label == label)
    }
}

/// Check a task id against `[A-Za-z0-9_.-]{1,128}`, not `.` or `..`: ids become
/// file and socket names, so nothing else is allowed.
///
/// ```
/// assert!(drover_plugin_sdk::validate_task_id("web-1.a_b").is_ok());
/// assert!(drover_plugin_sdk::validate_task_id("../etc").is_err());
/// ```
pub fn validate_task_id(id: &str) -> Result<(), DriverError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if id.is_empty() || id.len() > 128 || id == "." || id == ".." || !id.chars().all(ok_char) {
        return Err(DriverError::InvalidConfig(format!(
            "task id {id:?} must be 1-128 characters of [A-Za-z0-9_.-]"
        )));
    }
    Ok(())
}

/// Whether a task is running.
///
/// ```
/// assert_eq!(drover_plugin_sdk::TaskState::default(), drover_plugin_sdk::TaskState::Unknown);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum TaskState {
    /// Not known.
    #[default]
    Unknown,
    /// Running.
    Running,
    /// Exited; the exit result is known.
    Exited,
}

/// How a task ended.
///
/// The fields are what travels on the wire; [`ExitResult::outcome`] is the gist, for
/// matching.
///
/// ```
/// use drover_plugin_sdk::{ExitOutcome, ExitResult, Signal};
/// let r = ExitResult::code(3);
/// assert!(!r.successful());
/// assert_eq!(r.outcome(), ExitOutcome::Code(3));
/// assert_eq!(ExitResult::signaled(Signal::KILL).outcome(), ExitOutcome::Signal(Signal::KILL));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExitResult {
    /// Exit code (0 when killed by a signal).
    pub exit_code: i32,
    /// Signal that killed it, 0 if none.
    pub signal: i32,
    /// Killed by the OOM killer.
    pub oom_killed: bool,
    /// Set when the driver could not tell how the task ended.
    pub err: Option<String>,
}

impl ExitResult {
    /// Exited with `code`.
    pub fn code(code: i32) -> Self {
        ExitResult {
            exit_code: code,
            ..Default::default()
        }
    }
    /// Killed by `signal`: a [`Signal`], or the number the kernel reported (which may
    /// be one with no name, such as a realtime signal).
    pub fn signaled(signal: impl Into<i32>) -> Self {
        ExitResult {
            signal: signal.into(),
            ..Default::default()
        }
    }
    /// The driver cannot tell how the task ended: why.
    ///
    /// ```
    /// let r = drover_plugin_sdk::ExitResult::unknown("the executor died first");
    /// assert_eq!(r.outcome(), drover_plugin_sdk::ExitOutcome::Other("the executor died first".into()));
    /// ```
    pub fn unknown(why: impl Into<String>) -> Self {
        ExitResult {
            err: Some(why.into()),
            ..Default::default()
        }
    }
    /// With [`ExitResult::oom_killed`] set.
    pub fn with_oom_killed(mut self, oom_killed: bool) -> Self {
        self.oom_killed = oom_killed;
        self
    }
    /// With [`ExitResult::err`] set: what else is known about the end, for people.
    pub fn with_err(mut self, err: impl Into<String>) -> Self {
        self.err = Some(err.into());
        self
    }
    /// From a std exit status.
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitResult::code(code),
            (None, Some(sig)) => ExitResult::signaled(sig),
            (None, None) => ExitResult::unknown(format!("unknown exit status {status:?}")),
        }
    }
    /// Exit code 0, no signal, no error.
    pub fn successful(&self) -> bool {
        self.exit_code == 0 && self.signal == 0 && !self.oom_killed && self.err.is_none()
    }
    /// The gist of the result. An OOM kill wins over the signal it was done with; an
    /// error wins only when there is neither code nor signal (otherwise it explains
    /// them, as in "timed out" next to SIGKILL).
    ///
    /// ```
    /// use drover_plugin_sdk::{ExitOutcome, ExitResult};
    /// let oom = ExitResult::signaled(9).with_oom_killed(true);
    /// assert_eq!(oom.outcome(), ExitOutcome::OomKilled);
    /// ```
    pub fn outcome(&self) -> ExitOutcome {
        if self.oom_killed {
            return ExitOutcome::OomKilled;
        }
        if self.signal != 0 {
            return ExitOutcome::from_signal_number(self.signal);
        }
        match &self.err {
            Some(e) if self.exit_code == 0 => ExitOutcome::Other(e.clone()),
            _ => ExitOutcome::Code(self.exit_code),
        }
    }
}

/// The gist of how a task or a plugin process ended, for matching: see
/// [`ExitResult::outcome`] and the launcher's `PluginProcess::shutdown`. It prints as
/// people read it: `exit code 0`, `killed by signal 9`.
///
/// ```
/// use drover_plugin_sdk::{ExitOutcome, Signal};
/// assert_eq!(ExitOutcome::Code(0).to_string(), "exit code 0");
/// assert_eq!(ExitOutcome::Signal(Signal::KILL).to_string(), "killed by signal 9");
/// assert!(ExitOutcome::Code(0).is_success());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExitOutcome {
    /// Exited by itself with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(Signal),
    /// Killed by the OOM killer at its memory limit.
    OomKilled,
    /// An end none of the others describes: the driver could not tell how it ended,
    /// or a signal this platform has no name for killed it. What is known, for people.
    Other(String),
}

impl ExitOutcome {
    /// Exit code 0.
    pub fn is_success(&self) -> bool {
        *self == ExitOutcome::Code(0)
    }

    /// From a std exit status (a process of our own that we reaped).
    ///
    /// ```
    /// use std::os::unix::process::ExitStatusExt as _;
    /// use drover_plugin_sdk::ExitOutcome;
    /// let st = std::process::ExitStatus::from_raw(3 << 8);
    /// assert_eq!(ExitOutcome::from_status(st), ExitOutcome::Code(3));
    /// ```
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(c), _) => ExitOutcome::Code(c),
            (None, Some(s)) => ExitOutcome::from_signal_number(s),
            _ => ExitOutcome::Other(status.to_string()),
        }
    }

    fn from_signal_number(n: i32) -> Self {
        match Signal::try_from(n) {
            Ok(sig) => ExitOutcome::Signal(sig),
            // Same words as a named signal: only the type cannot hold it.
            Err(_) => ExitOutcome::Other(format!("killed by signal {n}")),
        }
    }
}

impl std::fmt::Display for ExitOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitOutcome::Code(c) => write!(f, "exit code {c}"),
            // The number, as the host's events and logs have always said it.
            ExitOutcome::Signal(s) => write!(f, "killed by signal {}", s.as_raw()),
            ExitOutcome::OomKilled => f.write_str("killed by the OOM killer"),
            ExitOutcome::Other(why) => f.write_str(why),
        }
    }
}

/// The state a driver needs to find a task again after the plugin restarts. The host
/// stores it and hands it back to `recover_task`; it never looks inside `driver_state`.
///
/// ```
/// use drover_plugin_sdk::{TaskHandle, TaskSpec};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct State { pid: u32 }
/// let h = TaskHandle::new(TaskSpec::default(), 1, &State { pid: 42 }).unwrap();
/// let back: State = h.decode_state(1).unwrap();
/// assert_eq!(back.pid, 42);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskHandle {
    /// Version of the `driver_state` encoding, chosen by the driver.
    pub version: u32,
    /// The task.
    pub spec: TaskSpec,
    /// Its state when the handle was made.
    pub state: TaskState,
    /// Opaque driver bytes.
    pub driver_state: Vec<u8>,
}

impl TaskHandle {
    /// A running task's handle whose driver state is `state` encoded as JSON.
    pub fn new(spec: TaskSpec, version: u32, state: &impl Serialize) -> Result<Self, DriverError> {
        Ok(TaskHandle {
            version,
            spec,
            state: TaskState::Running,
            driver_state: serde_json::to_vec(state).map_err(DriverError::internal)?,
        })
    }

    /// A handle that carries only `spec`: no driver state, state unknown. The host
    /// recovers a task with it when it never got the task's `StartTask` reply, so
    /// that the driver looks the task up by id.
    ///
    /// ```
    /// let h = drover_plugin_sdk::TaskHandle::for_spec(drover_plugin_sdk::TaskSpec::new("t1"));
    /// assert!(h.driver_state.is_empty());
    /// ```
    pub fn for_spec(spec: TaskSpec) -> Self {
        TaskHandle {
            spec,
            ..Default::default()
        }
    }

    /// Decode JSON driver state, refusing a version this driver does not know.
    pub fn decode_state<T: serde::de::DeserializeOwned>(
        &self,
        expected_version: u32,
    ) -> Result<T, DriverError> {
        if self.version != expected_version {
            return Err(DriverError::InvalidConfig(format!(
                "task handle version {} is not {expected_version}",
                self.version
            )));
        }
        serde_json::from_slice(&self.driver_state)
            .map_err(|e| DriverError::InvalidConfig(format!("task handle state: {e}")))
    }
}

/// A task's status, answered by `InspectTask`.
///
/// ```
/// use drover_plugin_sdk::{ExitResult, TaskState, TaskStatus};
/// let s = TaskStatus::new("t1", TaskState::Exited)
///     .with_exit_result(ExitResult::code(0))
///     .with_attribute("pid", "42");
/// assert!(s.exit_result.unwrap().successful());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskStatus {
    /// Task id.
    pub id: String,
    /// Task name.
    pub name: String,
    /// Running or exited.
    pub state: TaskState,
    /// When it started.
    pub started_at: Option<SystemTime>,
    /// When it exited.
    pub completed_at: Option<SystemTime>,
    /// How it ended, once it has.
    pub exit_result: Option<ExitResult>,
    /// Driver facts such as `pid`.
    pub attributes: BTreeMap<String, String>,
}

impl TaskStatus {
    /// Task `id` in `state`, nothing else known yet.
    pub fn new(id: impl Into<String>, state: TaskState) -> Self {
        TaskStatus {
            id: id.into(),
            state,
            ..Default::default()
        }
    }
    /// With [`TaskStatus::name`] set.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// With [`TaskStatus::started_at`] set.
    pub fn with_started_at(mut self, at: SystemTime) -> Self {
        self.started_at = Some(at);
        self
    }
    /// With [`TaskStatus::completed_at`] set.
    pub fn with_completed_at(mut self, at: SystemTime) -> Self {
        self.completed_at = Some(at);
        self
    }
    /// With [`TaskStatus::exit_result`] set.
    pub fn with_exit_result(mut self, result: ExitResult) -> Self {
        self.exit_result = Some(result);
        self
    }
    /// With one more attribute.
    pub fn with_attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(key.into(), value.into());
        self
    }
}

/// A resource usage sample of one task.
///
/// ```
/// let s = drover_plugin_sdk::TaskStats::default().with_memory_rss_bytes(4 << 20);
/// assert_eq!(s.cpu_percent, 0.0);
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskStats {
    /// Resident memory in bytes.
    pub memory_rss_bytes: u64,
    /// User CPU time.
    pub cpu_user: Duration,
    /// System CPU time.
    pub cpu_system: Duration,
    /// Percent of one core since the previous sample.
    pub cpu_percent: f64,
    /// Page cache charged to the task (0 when the driver cannot tell).
    pub memory_cache_bytes: u64,
    /// Processes in the task (0 when the driver cannot tell).
    pub process_count: u64,
}

impl TaskStats {
    /// With [`TaskStats::memory_rss_bytes`] set.
    pub fn with_memory_rss_bytes(mut self, bytes: u64) -> Self {
        self.memory_rss_bytes = bytes;
        self
    }
    /// With [`TaskStats::cpu_user`] and [`TaskStats::cpu_system`] set.
    pub fn with_cpu_time(mut self, user: Duration, system: Duration) -> Self {
        self.cpu_user = user;
        self.cpu_system = system;
        self
    }
    /// With [`TaskStats::cpu_percent`] set.
    pub fn with_cpu_percent(mut self, percent: f64) -> Self {
        self.cpu_percent = percent;
        self
    }
    /// With [`TaskStats::memory_cache_bytes`] set.
    pub fn with_memory_cache_bytes(mut self, bytes: u64) -> Self {
        self.memory_cache_bytes = bytes;
        self
    }
    /// With [`TaskStats::process_count`] set.
    pub fn with_process_count(mut self, count: u64) -> Self {
        self.process_count = count;
        self
    }
}

/// Something that happened to a task, reported by the driver.
///
/// ```
/// let e = drover_plugin_sdk::TaskEvent::new("t1", "image pulled").with_annotation("image", "redis:7");
/// assert_eq!(e.message, "image pulled");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskEvent {
    /// Task id.
    pub task_id: String,
    /// When.
    pub timestamp: SystemTime,
    /// What, for people.
    pub message: String,
    /// Machine-readable details.
    pub annotations: BTreeMap<String, String>,
}

impl TaskEvent {
    /// `message` about task `task_id`, happening now.
    pub fn new(task_id: impl Into<String>, message: impl Into<String>) -> Self {
        TaskEvent {
            task_id: task_id.into(),
            timestamp: SystemTime::now(),
            message: message.into(),
            annotations: BTreeMap::new(),
        }
    }
    /// With [`TaskEvent::timestamp`] set.
    pub fn with_timestamp(mut self, at: SystemTime) -> Self {
        self.timestamp = at;
        self
    }
    /// With one more annotation.
    pub fn with_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
}

/// How much of each of stdout and stderr an `ExecTask` keeps: a script check runs
/// every interval, and its command is the task's (hostile) code, so what it prints
/// must not grow the driver's or the agent's memory. The rest is read and discarded,
/// so that the command is never blocked on a full pipe.
pub const EXEC_OUTPUT_LIMIT: usize = 64 * 1024;

/// Reads `reader` to its end, keeping at most [`EXEC_OUTPUT_LIMIT`] bytes and
/// discarding the rest (read all the same, so the writer never blocks).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let big = vec![b'x'; drover_plugin_sdk::EXEC_OUTPUT_LIMIT + 10];
/// let kept = drover_plugin_sdk::read_exec_output(&big[..]).await.unwrap();
/// assert_eq!(kept.len(), drover_plugin_sdk::EXEC_OUTPUT_LIMIT);
/// # });
/// ```
pub async fn read_exec_output<R>(mut reader: R) -> std::io::Result<Vec<u8>>
where
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt as _;
    let mut kept = Vec::new();
    (&mut reader)
        .take(EXEC_OUTPUT_LIMIT as u64)
        .read_to_end(&mut kept)
        .await?;
    tokio::io::copy(&mut reader, &mut tokio::io::sink()).await?;
    Ok(kept)
}

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TerminalSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// What the caller of an interactive exec sends to its command
/// ([`crate::DriverPlugin::exec_task_streaming`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecInput {
    /// Bytes for the command's stdin (or its terminal).
    Stdin(Vec<u8>),
    /// The caller's stdin ended.
    StdinClosed,
    /// The caller's terminal changed size (with a terminal only).
    Resize(TerminalSize),
}

/// What an interactive exec's command writes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecChunk {
    /// Bytes of its stdout (everything it writes, with a terminal).
    Stdout(Vec<u8>),
    /// Bytes of its stderr (never with a terminal).
    Stderr(Vec<u8>),
}

/// What the host reads from an interactive exec: output, then how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecEvent {
    /// What the command wrote.
    Output(ExecChunk),
    /// How it ended: the last event.
    Exited(ExitResult),
}

/// An interactive exec: the command, whether it gets a terminal, and the two
/// directions of its stream. The driver reads `input` until it ends (the caller went
/// away: kill the command) and sends what the command writes to `output`; it returns
/// how the command ended once it has and its output is sent.
///
/// ```
/// use drover_plugin_sdk::{ExecChunk, ExecInput, ExecSession};
/// let (session, input, mut output) = ExecSession::channel(vec!["/bin/sh".into()], true, 16);
/// input.try_send(ExecInput::Stdin(b"exit 3\n".to_vec())).unwrap();
/// # drop((session, output.try_recv()));
/// ```
#[derive(Debug)]
pub struct ExecSession {
    /// The command and its arguments (not empty).
    pub command: Vec<String>,
    /// Whether the command gets a pseudo-terminal as stdin, stdout and stderr.
    pub tty: bool,
    /// The terminal's size at the start, when the caller knows it.
    pub size: Option<TerminalSize>,
    /// From the caller.
    pub input: tokio::sync::mpsc::Receiver<ExecInput>,
    /// To the caller.
    pub output: tokio::sync::mpsc::Sender<ExecChunk>,
}

impl ExecSession {
    /// A session and the caller's ends of its channels, each holding up to `depth`
    /// messages.
    pub fn channel(
        command: Vec<String>,
        tty: bool,
        depth: usize,
    ) -> (
        ExecSession,
        tokio::sync::mpsc::Sender<ExecInput>,
        tokio::sync::mpsc::Receiver<ExecChunk>,
    ) {
        let (in_tx, in_rx) = tokio::sync::mpsc::channel(depth);
        let (out_tx, out_rx) = tokio::sync::mpsc::channel(depth);
        (
            ExecSession {
                command,
                tty,
                size: None,
                input: in_rx,
                output: out_tx,
            },
            in_tx,
            out_rx,
        )
    }
}

/// Output of a command run with `ExecTask`.
///
/// ```
/// use drover_plugin_sdk::{ExecOutput, ExitResult};
/// let out = ExecOutput::new(ExitResult::code(0)).with_stdout(b"ok\n".to_vec());
/// assert!(out.result.successful());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExecOutput {
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub result: ExitResult,
}

impl ExecOutput {
    /// A command that ended as `result`, with no output.
    pub fn new(result: ExitResult) -> Self {
        ExecOutput {
            result,
            ..Default::default()
        }
    }
    /// With [`ExecOutput::stdout`] set.
    pub fn with_stdout(mut self, stdout: Vec<u8>) -> Self {
        self.stdout = stdout;
        self
    }
    /// With [`ExecOutput::stderr`] set.
    pub fn with_stderr(mut self, stderr: Vec<u8>) -> Self {
        self.stderr = stderr;
        self
    }
    /// Appends `chunk` to `buf`, keeping `buf` at most [`EXEC_OUTPUT_LIMIT`] bytes:
    /// for drivers that receive a command's output in chunks.
    ///
    /// ```
    /// use drover_plugin_sdk::{EXEC_OUTPUT_LIMIT, ExecOutput};
    /// let mut out = ExecOutput::default();
    /// ExecOutput::append_capped(&mut out.stdout, &vec![0; EXEC_OUTPUT_LIMIT - 1]);
    /// ExecOutput::append_capped(&mut out.stdout, b"abc");
    /// assert_eq!(out.stdout.len(), EXEC_OUTPUT_LIMIT);
    /// ```
    pub fn append_capped(buf: &mut Vec<u8>, chunk: &[u8]) {
        let room = EXEC_OUTPUT_LIMIT.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
}

/// Facts about the agent a driver learns in `set_config`.
///
/// ```
/// let a = drover_plugin_sdk::AgentInfo::new("1.0.0").with_alloc_dir("/data/alloc");
/// assert_eq!(a.api_version, "1.0.0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AgentInfo {
    /// Where task directories live.
    pub alloc_dir: PathBuf,
    /// A directory the plugin may use for its own state.
    pub plugin_state_dir: PathBuf,
    /// The negotiated plugin API version.
    pub api_version: String,
}

impl AgentInfo {
    /// An agent speaking plugin API `api_version`, with no directories set.
    pub fn new(api_version: impl Into<String>) -> Self {
        AgentInfo {
            api_version: api_version.into(),
            ..Default::default()
        }
    }
    /// With [`AgentInfo::alloc_dir`] set.
    pub fn with_alloc_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.alloc_dir = dir.into();
        self
    }
    /// With [`AgentInfo::plugin_state_dir`] set.
    pub fn with_plugin_state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_state_dir = dir.into();
        self
    }
}

// ---------------------------------------------------------------------------------
// Wire conversions. Kept here so that plugin and host use exactly the same mapping.

pub(crate) fn to_timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub(crate) fn from_timestamp(t: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    t.and_then(|t| SystemTime::try_from(t).ok())
}

#[cfg(feature = "launcher")]
pub(crate) fn to_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    })
}

pub(crate) fn from_duration(d: Option<prost_types::Duration>) -> Option<Duration> {
    d.and_then(|d| Duration::try_from(d).ok())
}

impl From<Capabilities> for pb::Capabilities {
    fn from(c: Capabilities) -> Self {
        pb::Capabilities {
            send_signals: c.send_signals,
            exec: c.exec,
            fs_isolation: match c.fs_isolation {
                FsIsolation::None => pb::FsIsolation::None,
                FsIsolation::Chroot => pb::FsIsolation::Chroot,
                FsIsolation::Image => pb::FsIsolation::Image,
            } as i32,
            task_stats: c.task_stats,
            task_events: c.task_events,
            recover: c.recover,
            network_modes: [
                (c.network_modes.host, pb::NetworkMode::Host),
                (c.network_modes.none, pb::NetworkMode::None),
                (c.network_modes.bridge, pb::NetworkMode::Bridge),
                (c.network_modes.group, pb::NetworkMode::Group),
            ]
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, m)| m as i32)
            .collect(),
        }
    }
}

impl From<pb::Capabilities> for Capabilities {
    fn from(c: pb::Capabilities) -> Self {
        Capabilities {
            send_signals: c.send_signals,
            exec: c.exec,
            fs_isolation: match pb::FsIsolation::try_from(c.fs_isolation) {
                Ok(pb::FsIsolation::Chroot) => FsIsolation::Chroot,
                Ok(pb::FsIsolation::Image) => FsIsolation::Image,
                _ => FsIsolation::None,
            },
            task_stats: c.task_stats,
            task_events: c.task_events,
            recover: c.recover,
            network_modes: {
                let has = |m: pb::NetworkMode| c.network_modes.contains(&(m as i32));
                NetworkModes {
                    host: has(pb::NetworkMode::Host),
                    none: has(pb::NetworkMode::None),
                    bridge: has(pb::NetworkMode::Bridge),
                    group: has(pb::NetworkMode::Group),
                }
            },
        }
    }
}

impl From<Fingerprint> for pb::FingerprintResponse {
    fn from(f: Fingerprint) -> Self {
        pb::FingerprintResponse {
            health: match f.health {
                Health::Undetected => pb::HealthState::Undetected,
                Health::Unhealthy => pb::HealthState::Unhealthy,
                Health::Healthy => pb::HealthState::Healthy,
            } as i32,
            health_description: f.description,
            attributes: f.attributes.into_iter().collect(),
        }
    }
}

impl From<pb::FingerprintResponse> for Fingerprint {
    fn from(f: pb::FingerprintResponse) -> Self {
        Fingerprint {
            health: match pb::HealthState::try_from(f.health) {
                Ok(pb::HealthState::Healthy) => Health::Healthy,
                Ok(pb::HealthState::Unhealthy) => Health::Unhealthy,
                _ => Health::Undetected,
            },
            description: f.health_description,
            attributes: f.attributes.into_iter().collect(),
        }
    }
}

impl From<TaskSpec> for pb::TaskConfig {
    fn from(s: TaskSpec) -> Self {
        pb::TaskConfig {
            id: s.id,
            name: s.name,
            env: s.env.into_iter().collect(),
            resources: Some(pb::Resources {
                cpu_shares: s.resources.cpu_shares,
                memory_mb: s.resources.memory_mb,
                memory_max_mb: s.resources.memory_max_mb,
            }),
            task_dir: s.task_dir.display().to_string(),
            stdout_path: s.stdout_path.display().to_string(),
            stderr_path: s.stderr_path.display().to_string(),
            logs: Some(pb::LogConfig {
                max_files: s.logs.max_files,
                max_file_size_mb: s.logs.max_file_size_mb,
            }),
            driver_config_json: s.driver_config_json,
            user: s.user,
            alloc_dir: s.alloc_dir.display().to_string(),
            netns_path: s.netns_path.display().to_string(),

            ports: s
                .ports
                .into_iter()
                .map(|p| pb::TaskPort {
                    label: p.label,
                    value: u32::from(p.value),
                    to: u32::from(p.to),
                    host_ip: p.host_ip,
                })
                .collect(),
            volumes: s
                .volumes
                .into_iter()
                .map(|v| pb::TaskVolume {
                    name: v.name,
                    host_path: v.host_path.display().to_string(),
                    destination: v.destination.display().to_string(),
                    read_only: v.read_only,
                })
                .collect(),
            devices: s
                .devices
                .into_iter()
                .map(|d| pb::TaskDevice {
                    host_path: d.host_path.display().to_string(),
                    task_path: d.task_path.display().to_string(),
                    permissions: d.permissions,
                })
                .collect(),
            mounts: s
                .mounts
                .into_iter()
                .map(|m| pb::TaskMount {
                    host_path: m.host_path.display().to_string(),
                    task_path: m.task_path.display().to_string(),
                    read_only: m.read_only,
                })
                .collect(),
        }
    }
}

impl From<pb::TaskConfig> for TaskSpec {
    fn from(c: pb::TaskConfig) -> Self {
        let r = c.resources.unwrap_or_default();
        TaskSpec {
            id: c.id,
            name: c.name,
            env: c.env.into_iter().collect(),
            resources: Resources {
                cpu_shares: r.cpu_shares,
                memory_mb: r.memory_mb,
                memory_max_mb: r.memory_max_mb,
            },
            task_dir: c.task_dir.into(),
            stdout_path: c.stdout_path.into(),
            stderr_path: c.stderr_path.into(),
            logs: c
                .logs
                .map(|l| LogConfig::new(l.max_files, l.max_file_size_mb))
                .unwrap_or_default(),
            driver_config_json: c.driver_config_json,
            user: c.user,
            alloc_dir: c.alloc_dir.into(),
            netns_path: c.netns_path.into(),

            // A number past 65535 is no port: it is dropped here, and a driver that
            // was asked to publish its label says the label is unknown.
            ports: c
                .ports
                .into_iter()
                .filter_map(|p| {
                    Some(TaskPort {
                        label: p.label,
                        value: u16::try_from(p.value).ok()?,
                        to: u16::try_from(p.to).ok()?,
                        host_ip: p.host_ip,
                    })
                })
                .collect(),
            volumes: c
                .volumes
                .into_iter()
                .map(|v| TaskVolume {
                    name: v.name,
                    host_path: v.host_path.into(),
                    destination: v.destination.into(),
                    read_only: v.read_only,
                })
                .collect(),
            devices: c
                .devices
                .into_iter()
                .map(|d| TaskDevice {
                    host_path: d.host_path.into(),
                    task_path: d.task_path.into(),
                    permissions: d.permissions,
                })
                .collect(),
            mounts: c
                .mounts
                .into_iter()
                .map(|m| TaskMount {
                    host_path: m.host_path.into(),
                    task_path: m.task_path.into(),
                    read_only: m.read_only,
                })
                .collect(),
        }
    }
}

fn state_to_pb(s: TaskState) -> i32 {
    (match s {
        TaskState::Unknown => pb::TaskState::Unknown,
        TaskState::Running => pb::TaskState::Running,
        TaskState::Exited => pb::TaskState::Exited,
    }) as i32
}

fn state_from_pb(s: i32) -> TaskState {
    match pb::TaskState::try_from(s) {
        Ok(pb::TaskState::Running) => TaskState::Running,
        Ok(pb::TaskState::Exited) => TaskState::Exited,
        _ => TaskState::Unknown,
    }
}

impl From<TaskHandle> for pb::TaskHandle {
    fn from(h: TaskHandle) -> Self {
        pb::TaskHandle {
            version: h.version,
            config: Some(h.spec.into()),
            state: state_to_pb(h.state),
            driver_state: h.driver_state,
        }
    }
}

impl From<pb::TaskHandle> for TaskHandle {
    fn from(h: pb::TaskHandle) -> Self {
        TaskHandle {
            version: h.version,
            spec: h.config.map(Into::into).unwrap_or_default(),
            state: state_from_pb(h.state),
            driver_state: h.driver_state,
        }
    }
}

impl From<ExitResult> for pb::ExitResult {
    fn from(r: ExitResult) -> Self {
        pb::ExitResult {
            exit_code: r.exit_code,
            signal: r.signal,
            oom_killed: r.oom_killed,
            err: r.err.unwrap_or_default(),
        }
    }
}

impl From<pb::ExitResult> for ExitResult {
    fn from(r: pb::ExitResult) -> Self {
        ExitResult {
            exit_code: r.exit_code,
            signal: r.signal,
            oom_killed: r.oom_killed,
            err: (!r.err.is_empty()).then_some(r.err),
        }
    }
}

impl From<TaskStatus> for pb::TaskStatus {
    fn from(s: TaskStatus) -> Self {
        pb::TaskStatus {
            id: s.id,
            name: s.name,
            state: state_to_pb(s.state),
            started_at: s.started_at.map(to_timestamp),
            completed_at: s.completed_at.map(to_timestamp),
            exit_result: s.exit_result.map(Into::into),
            attributes: s.attributes.into_iter().collect(),
        }
    }
}

impl From<pb::TaskStatus> for TaskStatus {
    fn from(s: pb::TaskStatus) -> Self {
        TaskStatus {
            id: s.id,
            name: s.name,
            state: state_from_pb(s.state),
            started_at: from_timestamp(s.started_at),
            completed_at: from_timestamp(s.completed_at),
            exit_result: s.exit_result.map(Into::into),
            attributes: s.attributes.into_iter().collect(),
        }
    }
}

impl TaskStats {
    pub(crate) fn into_pb(self, task_id: String) -> pb::TaskStatsResponse {
        pb::TaskStatsResponse {
            task_id,
            timestamp: Some(to_timestamp(SystemTime::now())),
            memory_rss_bytes: self.memory_rss_bytes,
            cpu_user_nanos: u64::try_from(self.cpu_user.as_nanos()).unwrap_or(u64::MAX),
            cpu_system_nanos: u64::try_from(self.cpu_system.as_nanos()).unwrap_or(u64::MAX),
            cpu_percent: self.cpu_percent,
            pids: Default::default(),
            memory_cache_bytes: self.memory_cache_bytes,
            process_count: self.process_count,
        }
    }
}

impl From<pb::TaskStatsResponse> for TaskStats {
    fn from(s: pb::TaskStatsResponse) -> Self {
        TaskStats {
            memory_rss_bytes: s.memory_rss_bytes,
            cpu_user: Duration::from_nanos(s.cpu_user_nanos),
            cpu_system: Duration::from_nanos(s.cpu_system_nanos),
            cpu_percent: s.cpu_percent,
            memory_cache_bytes: s.memory_cache_bytes,
            process_count: s.process_count,
        }
    }
}

impl From<TaskEvent> for pb::DriverTaskEvent {
    fn from(e: TaskEvent) -> Self {
        pb::DriverTaskEvent {
            task_id: e.task_id,
            timestamp: Some(to_timestamp(e.timestamp)),
            message: e.message,
            annotations: e.annotations.into_iter().collect(),
        }
    }
}

impl From<pb::DriverTaskEvent> for TaskEvent {
    fn from(e: pb::DriverTaskEvent) -> Self {
        TaskEvent {
            task_id: e.task_id,
            timestamp: from_timestamp(e.timestamp).unwrap_or(SystemTime::UNIX_EPOCH),
            message: e.message,
            annotations: e.annotations.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod port_tests {
    use super::*;

    /// The ports cross the plugin protocol as they are; a number past 65535 arriving
    /// from a broken peer is dropped rather than wrapped into another port.
    #[test]
    fn task_ports_cross_the_wire() {
        let spec = TaskSpec::new("t1").with_ports([
            TaskPort::new("http", 23456)
                .with_to(80)
                .with_host_ip("127.0.0.1"),
            TaskPort::new("db", 23457),
        ]);
        let mut wire = pb::TaskConfig::from(spec.clone());
        assert_eq!(TaskSpec::from(wire.clone()), spec);
        wire.ports[1].value = 70000;
        let back = TaskSpec::from(wire);
        assert_eq!(back.ports, spec.ports[..1]);
    }
}
