//! Plugin configuration, task configuration, and how both (with the task's spec) turn
//! into the body of a Docker `POST /containers/create`. Everything here is pure, so the
//! translation is tested without a daemon.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, HostConfig, HostConfigLogConfig, Mount, MountType,
    PortBinding,
};
use drover_plugin_sdk::taskdir::{Dir, FileKind, OpenOptions};
use drover_plugin_sdk::{DriverError, TaskPort, TaskSpec};
use schemars::JsonSchema;
use serde::Deserialize;

/// Label carrying the Drover task id: how a container is found again by id.
pub const LABEL_TASK_ID: &str = "drover.task_id";
/// Label carrying the Drover task name, for people running `docker ps`.
pub const LABEL_TASK_NAME: &str = "drover.task_name";
/// Label carrying the agent's allocation directory: which agent a container belongs
/// to when several agents share one Docker daemon.
pub const LABEL_ALLOC_DIR: &str = "drover.alloc_dir";

/// Where the task's `local/` and `secrets/` directories appear in the container
/// (the same places Nomad uses).
pub const CONTAINER_LOCAL_DIR: &str = "/local";
/// See [`CONTAINER_LOCAL_DIR`].
pub const CONTAINER_SECRETS_DIR: &str = "/secrets";
/// Where the allocation's shared directory (`data/`, `logs/`, `tmp/`) appears.
pub const CONTAINER_ALLOC_DIR: &str = "/alloc";

/// Capabilities a task may add when the plugin config does not say otherwise: Docker's
/// default set, as Nomad allows it.
pub const DEFAULT_ALLOW_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Configuration of the docker plugin (`[plugin.docker] config = {...}`).
///
/// Everything that lets a task reach past its container to the host is refused unless
/// a setting here allows it: `privileged` ([`allow_privileged`](Self::allow_privileged)),
/// capabilities beyond Docker's default set ([`allow_caps`](Self::allow_caps)), host
/// paths and named volumes ([`volumes`](Self::volumes)), the host's network, pid, ipc,
/// uts or user namespace ([`allow_host_namespaces`](Self::allow_host_namespaces)), the
/// namespaces of another container
/// ([`allow_container_namespaces`](Self::allow_container_namespaces)), host devices
/// ([`allow_devices`](Self::allow_devices)), security options that loosen the
/// container's confinement ([`allow_security_opt`](Self::allow_security_opt)) and
/// kernel parameters ([`allow_sysctl`](Self::allow_sysctl)).
///
/// ```
/// use drover_driver_docker::{HostNamespace, PluginConfig};
/// let c: PluginConfig = serde_json::from_str(
///     r#"{"allow_privileged":true,"pull_timeout":"30s","allow_host_namespaces":["network"]}"#,
/// ).unwrap();
/// assert!(c.allow_privileged && !c.volumes.enabled && !c.allow_container_namespaces);
/// assert_eq!(c.allow_host_namespaces, [HostNamespace::Network]);
/// assert_eq!(c.pull_timeout, std::time::Duration::from_secs(30));
/// assert!(serde_json::from_str::<PluginConfig>(r#"{"endpont":"x"}"#).is_err());
/// // A namespace Docker cannot share is a configuration error, not a silent no-op.
/// let e = serde_json::from_str::<PluginConfig>(r#"{"allow_host_namespaces":["mount"]}"#);
/// assert!(e.unwrap_err().to_string().contains("mount"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PluginConfig {
    /// Docker daemon address: `unix:///path/docker.sock`, a bare socket path, or
    /// `tcp://host:port`. Default: `DOCKER_HOST`, else `unix:///var/run/docker.sock`.
    pub endpoint: Option<String>,
    /// Allow tasks to run privileged containers.
    pub allow_privileged: bool,
    /// Host paths and named volumes in tasks.
    pub volumes: VolumesConfig,
    /// Capabilities tasks may add with `cap_add` (`"ALL"` allows any). Names with or
    /// without `CAP_`, any case.
    pub allow_caps: Vec<String>,
    /// Host namespaces a task may join with `network_mode`, `pid_mode`, `ipc_mode`,
    /// `uts_mode` or `userns_mode` = `"host"`. Default: none. A task on the host's
    /// network binds host ports and reaches every service on the host's loopback; on
    /// its pid namespace it sees (and, as root, signals and ptraces) host processes.
    pub allow_host_namespaces: Vec<HostNamespace>,
    /// Allow `network_mode`, `pid_mode` and `ipc_mode` = `"container:<name or id>"`:
    /// joining the namespaces of another container on the daemon, which need not
    /// belong to the task (or to Drover).
    pub allow_container_namespaces: bool,
    /// Allow `devices` (host device nodes in the container).
    pub allow_devices: bool,
    /// Allow `security_opt` entries other than `no-new-privileges` (which only
    /// tightens): `seccomp=unconfined`, `apparmor=unconfined`, `label=disable`, a
    /// custom profile, ….
    pub allow_security_opt: bool,
    /// Allow `sysctl` (kernel parameters; on the host's network they are the host's).
    pub allow_sysctl: bool,
    /// Garbage collection of images and of containers no task owns.
    pub gc: GcConfig,
    /// Longest time an image pull (or `load`) may take before the start fails.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub pull_timeout: Duration,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            endpoint: None,
            allow_privileged: false,
            volumes: VolumesConfig::default(),
            allow_caps: DEFAULT_ALLOW_CAPS.iter().map(|c| (*c).to_owned()).collect(),
            allow_host_namespaces: Vec::new(),
            allow_container_namespaces: false,
            allow_devices: false,
            allow_security_opt: false,
            allow_sysctl: false,
            gc: GcConfig::default(),
            pull_timeout: Duration::from_secs(5 * 60),
        }
    }
}

/// A host namespace a task may share (`allow_host_namespaces` in the plugin config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HostNamespace {
    /// `network_mode = "host"`.
    Network,
    /// `pid_mode = "host"`.
    Pid,
    /// `ipc_mode = "host"`.
    Ipc,
    /// `uts_mode = "host"`.
    Uts,
    /// `userns_mode = "host"` (leaves the daemon's user-namespace remapping).
    Userns,
}

impl HostNamespace {
    /// Its name in `allow_host_namespaces`.
    pub fn name(self) -> &'static str {
        match self {
            HostNamespace::Network => "network",
            HostNamespace::Pid => "pid",
            HostNamespace::Ipc => "ipc",
            HostNamespace::Uts => "uts",
            HostNamespace::Userns => "userns",
        }
    }
}

/// `volumes` in the plugin config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VolumesConfig {
    /// Allow bind mounts of host paths outside the task directory and named volumes.
    /// Paths inside the task directory are always allowed.
    pub enabled: bool,
}

/// `gc` in the plugin config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct GcConfig {
    /// Remove a task's image when the task is destroyed and no other container uses it.
    pub image: bool,
    /// How long after the destroy to remove it (a restarting task reuses it meanwhile).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub image_delay: Duration,
    /// Containers with Drover labels of this agent whose task this plugin does not know.
    pub dangling_containers: DanglingConfig,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            image: false,
            image_delay: Duration::from_secs(3 * 60),
            dangling_containers: DanglingConfig::default(),
        }
    }
}

/// `gc.dangling_containers` in the plugin config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DanglingConfig {
    /// Look for them and report them (a warning and a task event).
    pub enabled: bool,
    /// Also remove them (force: running ones are killed).
    pub remove: bool,
    /// How often to look.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub period: Duration,
    /// Ignore containers younger than this, and look only once the plugin has run
    /// this long: the agent recovers its tasks in the meantime.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub creation_grace: Duration,
}

impl Default for DanglingConfig {
    fn default() -> Self {
        DanglingConfig {
            enabled: true,
            remove: false,
            period: Duration::from_secs(60),
            creation_grace: Duration::from_secs(5 * 60),
        }
    }
}

/// Configuration of one docker task.
///
/// ```
/// let c: drover_driver_docker::TaskConfig = serde_json::from_str(
///     r#"{"image":"busybox:1.36","command":"echo","args":["hi"],"ports":{"80":8080}}"#,
/// ).unwrap();
/// assert_eq!(c.args, ["hi"]);
/// let err = serde_json::from_str::<drover_driver_docker::TaskConfig>(r#"{"image":"x","comand":"y"}"#)
///     .unwrap_err();
/// assert!(err.to_string().contains("comand"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// Image reference, e.g. `redis:7` or `registry.example.com/team/app@sha256:…`. No
    /// tag means `latest`.
    pub image: String,
    /// Command to run (replaces the image's `CMD`; the image's entrypoint stays).
    #[serde(default)]
    pub command: Option<String>,
    /// Arguments to `command`; without `command` they replace the image's `CMD`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Replaces the image's entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Environment, on top of the task's (the `DROVER_*` variables win).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Container labels: a map, or Nomad's `labels { ... }` blocks (a list of maps,
    /// merged in order). Keys starting with `drover.` are reserved.
    #[serde(default, deserialize_with = "map_or_maps")]
    #[schemars(with = "MapOrMaps<String>")]
    pub labels: BTreeMap<String, String>,
    /// Working directory in the container.
    #[serde(default)]
    pub work_dir: Option<String>,
    /// User in the container (`name`, `uid`, `uid:gid`). Default: the task's user,
    /// else the image's.
    #[serde(default)]
    pub user: Option<String>,
    /// Published ports: container port (`"80"`, `"53/udp"`) → host port (`8080`, or
    /// `"127.0.0.1:8080"`; `0` lets Docker pick). Or Nomad's form, a list of the group
    /// network's port labels (`["http"]`): each allocated port's address and number
    /// on the node is published to its `to` in the container (the same number when
    /// it has none), TCP and UDP; a label the group does not have fails the start.
    #[serde(default)]
    pub ports: Ports,
    /// Nomad's older `port_map { http = 80 }`: the group port labelled `http` is
    /// published to container port 80, and `NOMAD_PORT_http` in the container says 80.
    #[serde(default)]
    pub port_map: Option<serde_json::Value>,
    /// Bind mounts `source:target[:ro]`. A relative source is inside the task
    /// directory; host paths elsewhere and named volumes need `volumes.enabled`.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// Mounts in long form.
    #[serde(default)]
    pub mounts: Vec<MountConfig>,
    /// Nomad's `mount { ... }` blocks: more mounts, the same as `mounts`.
    #[serde(default)]
    pub mount: Vec<MountConfig>,
    /// Network mode (`none`, `bridge`, a network name; `host` needs `"network"` in the
    /// plugin's `allow_host_namespaces`, `container:<id>` needs
    /// `allow_container_namespaces`).
    #[serde(default)]
    pub network_mode: Option<String>,
    /// PID namespace: `host` (needs `"pid"` in `allow_host_namespaces`) or
    /// `container:<id>` (needs `allow_container_namespaces`). Default: the container's own.
    #[serde(default)]
    pub pid_mode: Option<String>,
    /// IPC namespace: `private`, `shareable`, `none`; `host` (needs `"ipc"` in
    /// `allow_host_namespaces`) or `container:<id>` (needs `allow_container_namespaces`).
    #[serde(default)]
    pub ipc_mode: Option<String>,
    /// UTS namespace: `host` (needs `"uts"` in `allow_host_namespaces`).
    #[serde(default)]
    pub uts_mode: Option<String>,
    /// User namespace: `host` (needs `"userns"` in `allow_host_namespaces`).
    #[serde(default)]
    pub userns_mode: Option<String>,
    /// Host devices in the container (needs `allow_devices`).
    #[serde(default)]
    pub devices: Vec<DeviceConfig>,
    /// Docker security options. `no-new-privileges` is always allowed; anything else
    /// (`seccomp=…`, `apparmor=…`, `label=…`) needs `allow_security_opt`.
    #[serde(default)]
    pub security_opt: Vec<String>,
    /// Kernel parameters, e.g. `{"net.core.somaxconn": "1024"}` (needs `allow_sysctl`);
    /// Nomad's `sysctl { ... }` blocks (a list of maps) too.
    #[serde(default, deserialize_with = "map_or_maps")]
    #[schemars(with = "MapOrMaps<String>")]
    pub sysctl: BTreeMap<String, String>,
    /// Capabilities to add (must be in the plugin's `allow_caps`).
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// Capabilities to drop.
    #[serde(default)]
    pub cap_drop: Vec<String>,
    /// Run privileged (refused unless the plugin config has `allow_privileged`).
    #[serde(default)]
    pub privileged: bool,
    /// Credentials for a private registry: an object, or Nomad's `auth { ... }` block
    /// (a list of one object).
    #[serde(default, deserialize_with = "one_block")]
    #[schemars(with = "Option<OneOrList<AuthConfig>>")]
    pub auth: Option<AuthConfig>,
    /// Pull the image even when it is present.
    #[serde(default)]
    pub force_pull: bool,
    /// An image tarball (`docker save` format) in the task directory, loaded before the
    /// container is created; it must provide `image`.
    #[serde(default)]
    pub load: Option<String>,
    /// Size of `/dev/shm` in bytes.
    #[serde(default)]
    pub shm_size: Option<i64>,
    /// Run an init process (tini) as PID 1 that forwards signals and reaps zombies.
    #[serde(default)]
    pub init: bool,
    /// The container's hostname.
    #[serde(default)]
    pub hostname: Option<String>,
    /// DNS servers of the container.
    #[serde(default)]
    pub dns_servers: Vec<String>,
    /// DNS search domains of the container.
    #[serde(default)]
    pub dns_search_domains: Vec<String>,
    /// DNS resolver options of the container.
    #[serde(default)]
    pub dns_options: Vec<String>,
    /// Extra `/etc/hosts` lines, `host:ip`.
    #[serde(default)]
    pub extra_hosts: Vec<String>,
    /// Mount the container's root filesystem read-only.
    #[serde(default)]
    pub readonly_rootfs: bool,
    /// Most processes and threads the container may have at once.
    #[serde(default)]
    pub pids_limit: Option<i64>,
    /// Resource limits by name, `"soft:hard"` or `"both"`, e.g. `{"nofile": "2048:4096"}`
    /// (Nomad's `ulimit { ... }` blocks too). `rtprio` above 0 and `nice` above 20 are
    /// refused: they let a task out-schedule the host.
    #[serde(default, deserialize_with = "map_or_maps")]
    #[schemars(with = "MapOrMaps<String>")]
    pub ulimit: BTreeMap<String, String>,
    /// How long pulling the image may take (`"5m"`); default: the plugin's
    /// `pull_timeout`.
    #[serde(default, with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub image_pull_timeout: Option<Duration>,
    // Nomad docker options Drover's docker driver does not support yet: in the schema
    // so that a job file using one gets an error naming it as such (see
    // UNSUPPORTED_KEYS), never a silent no-op and never "unknown field".
    /// Nomad's `advertise_ipv6_address`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub advertise_ipv6_address: Option<serde_json::Value>,
    /// Nomad's `auth_soft_fail`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub auth_soft_fail: Option<serde_json::Value>,
    /// Nomad's `cpu_cfs_period`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub cpu_cfs_period: Option<serde_json::Value>,
    /// Nomad's `cpu_hard_limit`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub cpu_hard_limit: Option<serde_json::Value>,
    /// Nomad's `cpuset_cpus`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub cpuset_cpus: Option<serde_json::Value>,
    /// Nomad's `interactive`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub interactive: Option<serde_json::Value>,
    /// Nomad's `ipv4_address`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub ipv4_address: Option<serde_json::Value>,
    /// Nomad's `ipv6_address`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub ipv6_address: Option<serde_json::Value>,
    /// Nomad's `logging`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub logging: Option<serde_json::Value>,
    /// Nomad's `mac_address`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub mac_address: Option<serde_json::Value>,
    /// Nomad's `memory_hard_limit`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub memory_hard_limit: Option<serde_json::Value>,
    /// Nomad's `network_aliases`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub network_aliases: Option<serde_json::Value>,
    /// Nomad's `runtime`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub runtime: Option<serde_json::Value>,
    /// Nomad's `storage_opt`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub storage_opt: Option<serde_json::Value>,
    /// Nomad's `tty`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub tty: Option<serde_json::Value>,
    /// Nomad's `volume_driver`: not supported yet (see [`UNSUPPORTED_KEYS`](crate::UNSUPPORTED_KEYS)).
    #[serde(default)]
    pub volume_driver: Option<serde_json::Value>,
}

/// Nomad's docker task options Drover does not support yet, and why where it matters.
/// A `false` boolean (Nomad's default) is accepted: it asks for nothing.
pub const UNSUPPORTED_KEYS: &[(&str, &str)] = &[
    ("advertise_ipv6_address", ""),
    ("auth_soft_fail", ""),
    ("cpu_cfs_period", ""),
    (
        "cpu_hard_limit",
        "the task's resources set the container's CPU shares",
    ),
    ("cpuset_cpus", ""),
    ("interactive", ""),
    (
        "ipv4_address",
        "ports and addresses need issue 25's networks",
    ),
    (
        "ipv6_address",
        "ports and addresses need issue 25's networks",
    ),
    (
        "logging",
        "Drover reads the container's output through Docker's json-file log, which \
         another log driver would replace",
    ),
    ("mac_address", ""),
    (
        "memory_hard_limit",
        "the task's resources (memory_max) set the hard limit",
    ),
    (
        "network_aliases",
        "ports and addresses need issue 25's networks",
    ),
    ("runtime", ""),
    ("storage_opt", ""),
    (
        "tty",
        "Drover reads the container's output as separate stdout and stderr",
    ),
    ("volume_driver", ""),
];

impl TaskConfig {
    /// The [`UNSUPPORTED_KEYS`] this config sets, with their values.
    fn unsupported(&self) -> Vec<(&'static str, &serde_json::Value)> {
        [
            ("advertise_ipv6_address", &self.advertise_ipv6_address),
            ("auth_soft_fail", &self.auth_soft_fail),
            ("cpu_cfs_period", &self.cpu_cfs_period),
            ("cpu_hard_limit", &self.cpu_hard_limit),
            ("cpuset_cpus", &self.cpuset_cpus),
            ("interactive", &self.interactive),
            ("ipv4_address", &self.ipv4_address),
            ("ipv6_address", &self.ipv6_address),
            ("logging", &self.logging),
            ("mac_address", &self.mac_address),
            ("memory_hard_limit", &self.memory_hard_limit),
            ("network_aliases", &self.network_aliases),
            ("runtime", &self.runtime),
            ("storage_opt", &self.storage_opt),
            ("tty", &self.tty),
            ("volume_driver", &self.volume_driver),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        // `false` (Nomad's default for its booleans) asks for nothing.
        .filter(|(_, v)| **v != serde_json::Value::Bool(false))
        .collect()
    }
}

/// The schema of a map of `V`, or of a list of such maps (Nomad's repeated blocks).
#[derive(JsonSchema)]
#[allow(dead_code)]
#[serde(untagged)]
enum MapOrMaps<V> {
    Map(BTreeMap<String, V>),
    Maps(Vec<BTreeMap<String, V>>),
}

/// The schema of one `T`, or a list of them (Nomad's block: a list of one).
#[derive(JsonSchema)]
#[allow(dead_code)]
#[serde(untagged)]
enum OneOrList<T> {
    One(T),
    List(Vec<T>),
}

/// A map, or a list of maps merged in order (Nomad's `labels { a = "b" }` is
/// `[{"a": "b"}]` in its API JSON).
fn map_or_maps<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form<V> {
        Map(BTreeMap<String, V>),
        Maps(Vec<BTreeMap<String, V>>),
    }
    Ok(
        match Form::<V>::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a map of strings, or a list of such maps")
        })? {
            Form::Map(m) => m,
            Form::Maps(ms) => ms.into_iter().flatten().collect(),
        },
    )
}

/// One block: an object, or a list of at most one (how Nomad's API JSON carries a
/// block such as `auth { ... }`).
fn one_block<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = match Option::<serde_json::Value>::deserialize(d)? {
        None => return Ok(None),
        Some(serde_json::Value::Array(mut items)) => match items.len() {
            0 => return Ok(None),
            1 => items.remove(0),
            n => {
                return Err(serde::de::Error::custom(format!(
                    "expected one block, found {n}"
                )));
            }
        },
        Some(v) => v,
    };
    serde_json::from_value(value)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Published ports: Drover's map, or Nomad's list of port labels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Ports {
    /// Container port → host port.
    Published(BTreeMap<String, PortSpec>),
    /// Nomad's port labels of the group network.
    Labels(Vec<String>),
}

impl Default for Ports {
    fn default() -> Self {
        Ports::Published(BTreeMap::new())
    }
}

/// The group port `label` of the task's allocation, or an error naming `key`, the label
/// and the labels there are.
fn group_port<'s>(spec: &'s TaskSpec, key: &str, label: &str) -> Result<&'s TaskPort, DriverError> {
    spec.port(label).ok_or_else(|| {
        let known: Vec<&str> = spec.ports.iter().map(|p| p.label.as_str()).collect();
        let known = if known.is_empty() {
            "it has no ports: add network { port \"...\" {} } to the group".to_owned()
        } else {
            format!("it has {}", known.join(", "))
        };
        invalid(format!(
            "{key}: port {label:?} not found in the group's network block ({known})"
        ))
    })
}

/// A published port's host side.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PortSpec {
    /// Host port on every address (`0`: Docker picks one).
    Port(u16),
    /// `"ip:port"`, e.g. `"127.0.0.1:8080"`.
    Address(String),
}

/// A host device in the container.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// The device node on the host, e.g. `/dev/fuse`.
    pub host_path: String,
    /// Where it appears in the container (default: the same path).
    #[serde(default)]
    pub container_path: Option<String>,
    /// Device cgroup permissions, any of `r`, `w`, `m` (default `rwm`).
    #[serde(default)]
    pub cgroup_permissions: Option<String>,
}

/// One mount in long form.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    /// `bind` (default), `volume` or `tmpfs`.
    #[serde(rename = "type", default)]
    pub kind: MountKind,
    /// Host path (bind; relative: inside the task directory) or volume name.
    #[serde(default)]
    pub source: Option<String>,
    /// Path in the container.
    pub target: String,
    /// Mount read-only.
    #[serde(default)]
    pub readonly: bool,
    /// Nomad's `tmpfs_options` block of a `tmpfs` mount: its `size` (bytes) and
    /// `mode` (octal permission bits as a number, e.g. `1777`).
    #[serde(default, deserialize_with = "one_block")]
    #[schemars(with = "Option<OneOrList<TmpfsOptions>>")]
    pub tmpfs_options: Option<TmpfsOptions>,
    /// Nomad's `bind_options` block: not supported yet.
    #[serde(default)]
    pub bind_options: Option<serde_json::Value>,
    /// Nomad's `volume_options` block: not supported yet.
    #[serde(default)]
    pub volume_options: Option<serde_json::Value>,
}

/// Options of a tmpfs mount (Nomad's `tmpfs_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TmpfsOptions {
    /// Size in bytes.
    #[serde(default)]
    pub size: Option<i64>,
    /// Permission bits, written as octal digits (`1777`).
    #[serde(default)]
    pub mode: Option<i64>,
}

/// Kind of a [`MountConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MountKind {
    /// A host path.
    #[default]
    Bind,
    /// A Docker volume.
    Volume,
    /// A tmpfs.
    Tmpfs,
}

/// Registry credentials.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// User name.
    #[serde(default)]
    pub username: Option<String>,
    /// Password or token.
    #[serde(default)]
    pub password: Option<String>,
    /// E-mail (some registries want it).
    #[serde(default)]
    pub email: Option<String>,
    /// Registry address, e.g. `registry.example.com`.
    #[serde(default)]
    pub server_address: Option<String>,
    /// OAuth identity token instead of a password.
    #[serde(default)]
    pub identity_token: Option<String>,
}

impl AuthConfig {
    pub(crate) fn credentials(&self) -> bollard::auth::DockerCredentials {
        bollard::auth::DockerCredentials {
            username: self.username.clone(),
            password: self.password.clone(),
            email: self.email.clone(),
            serveraddress: self.server_address.clone(),
            identitytoken: self.identity_token.clone(),
            ..Default::default()
        }
    }
}

fn invalid(msg: impl Into<String>) -> DriverError {
    DriverError::InvalidConfig(msg.into())
}

/// `SYS_ADMIN` from `sys_admin`, `CAP_SYS_ADMIN`, `Sys_Admin`.
fn normalize_cap(cap: &str) -> String {
    let upper = cap.trim().to_ascii_uppercase();
    upper
        .strip_prefix("CAP_")
        .map_or_else(|| upper.clone(), str::to_owned)
}

/// `name:latest` for a reference with neither tag nor digest, since an untagged pull
/// would fetch every tag of the repository.
///
/// ```
/// use drover_driver_docker::normalize_image;
/// assert_eq!(normalize_image("busybox"), "busybox:latest");
/// assert_eq!(normalize_image("localhost:5000/app"), "localhost:5000/app:latest");
/// assert_eq!(normalize_image("redis:7"), "redis:7");
/// assert_eq!(normalize_image("app@sha256:abc"), "app@sha256:abc");
/// ```
pub fn normalize_image(image: &str) -> String {
    let image = image.trim();
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.contains(':') {
        image.to_owned()
    } else {
        format!("{image}:latest")
    }
}

/// The task directory, opened once for a plan: every relative source is resolved
/// from its descriptor, so a link the task planted (in this incarnation or an earlier
/// one) is refused instead of followed. `None` when the task has no directory or it
/// does not exist.
struct TaskDir<'a> {
    spec: &'a TaskSpec,
    dir: Option<Dir>,
}

/// What a relative source is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    /// A bind mount, writable or not; `create`: make a missing directory (what Docker
    /// does for `volumes` entries).
    Bind { writable: bool, create: bool },
    /// A file the plugin reads (`load`).
    Read,
}

impl<'a> TaskDir<'a> {
    fn open(spec: &'a TaskSpec) -> Result<Self, DriverError> {
        if spec.task_dir.as_os_str().is_empty() {
            return Ok(TaskDir { spec, dir: None });
        }
        match Dir::open(&spec.task_dir) {
            Ok(dir) => Ok(TaskDir {
                spec,
                dir: Some(dir),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TaskDir { spec, dir: None }),
            Err(e) => Err(DriverError::Internal(format!(
                "cannot open the task directory {}: {e}",
                spec.task_dir.display()
            ))),
        }
    }

    /// `rel` inside the task directory: checked now, with no component a link, and
    /// given to Docker as the path just checked. Nothing of the task runs between this
    /// check and Docker's mount (the container is created and started right after; a
    /// restart comes after the previous container exited), so the path cannot change
    /// in between.
    ///
    /// `logs/` (and the task directory itself, which holds it) is never mounted
    /// writable: a task that can write its log directory can plant a link where the
    /// plugin writes and the agent reads, as root. Such a mount is refused with an
    /// error saying to make it read-only, rather than silently made read-only: a task
    /// that expects to write there would otherwise fail later and obscurely.
    fn resolve(&self, field: &str, rel: &str, how: Use) -> Result<PathBuf, DriverError> {
        if self.spec.task_dir.as_os_str().is_empty() {
            return Err(invalid(format!(
                "{field}: relative path {rel:?} needs a task directory, and this task has none"
            )));
        }
        let path = Path::new(rel);
        if path
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(invalid(format!(
                "{field}: {rel:?} must be a relative path inside the task directory (no `..`)"
            )));
        }
        let first = path.components().find_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        });
        if let Use::Bind { writable: true, .. } = how
            && first.is_none_or(|n| n == "logs")
        {
            return Err(invalid(format!(
                "{field}: {rel:?} would let the task write its own log directory (logs/), \
                 which the agent and this plugin read and write as root; mount it read-only \
                 (\"readonly\": true in mounts, \":ro\" in volumes) or use a directory \
                 such as local/"
            )));
        }
        let Some(dir) = &self.dir else {
            return Err(invalid(format!(
                "{field}: {rel:?}: the task directory {} does not exist",
                self.spec.task_dir.display()
            )));
        };
        let refused = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::NotFound {
                invalid(format!(
                    "{field}: {rel:?} does not exist in the task directory {}",
                    self.spec.task_dir.display()
                ))
            } else {
                invalid(format!("{field}: {rel:?} cannot be used: {e}"))
            }
        };
        if let Use::Bind { create: true, .. } = how
            && matches!(dir.metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        {
            dir.create_dir_all(path, 0o755).map_err(refused)?;
        }
        let (resolved, meta) = dir.resolve(path).map_err(refused)?;
        // A second name may be a host file's (a hard link made where both were visible).
        if meta.kind == FileKind::File && meta.links > 1 {
            return Err(invalid(format!(
                "{field}: {rel:?} has {} hard links; a file that may be another file under a \
                 second name is not used",
                meta.links
            )));
        }
        match (how, meta.kind) {
            (Use::Read, FileKind::File) | (Use::Bind { .. }, FileKind::File | FileKind::Dir) => {
                Ok(resolved)
            }
            (_, kind) => Err(invalid(format!(
                "{field}: {rel:?} is {kind}; only a {} can be used",
                if how == Use::Read {
                    "regular file"
                } else {
                    "directory or regular file"
                }
            ))),
        }
    }

    /// The regular file `rel`, opened for reading beneath the task directory.
    fn open_read(&self, field: &str, rel: &str) -> Result<(PathBuf, std::fs::File), DriverError> {
        let path = self.resolve(field, rel, Use::Read)?;
        let file = self
            .dir
            .as_ref()
            .ok_or_else(|| invalid(format!("{field}: {rel:?}: no task directory")))?
            // Hard links checked again on the file opened: one swapped in after
            // `resolve` looked would be another file's bytes.
            .open_file(rel, &OpenOptions::new().read(true).single_link(true))
            .map_err(|e| invalid(format!("{field}: cannot open {rel:?}: {e}")))?;
        Ok((path, file))
    }

    /// A directory of the task's own layout (`local`, `secrets`), if it is there.
    fn layout_dir(&self, sub: &str) -> Result<Option<PathBuf>, DriverError> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        match dir.resolve(sub) {
            Ok((path, meta)) if meta.kind == FileKind::Dir => Ok(Some(path)),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(invalid(format!("the task's {sub}/ cannot be mounted: {e}"))),
        }
    }
}

/// The allocation's shared directory, to be mounted at [`CONTAINER_ALLOC_DIR`]: an
/// absolute path under the agent's allocation directory whose last component is a
/// directory, not a link (the agent made it; its parents are the agent's).
/// A host volume as a bind (`STAGED:DEST[:ro]`): dockerd binds the volume's staging
/// mount (see [`crate::volumes`]), never the volume's own path, and resolves the
/// destination inside the container's root (never through the container's links to
/// the host).
fn host_volume_bind(
    v: &drover_plugin_sdk::TaskVolume,
    staged: &std::path::Path,
) -> Result<String, DriverError> {
    let bad = |why: String| {
        DriverError::InvalidConfig(format!("volume_mount of volume {:?}: {why}", v.name))
    };
    let host = staged.to_str().unwrap_or_default();
    let dest = v.destination.to_str().unwrap_or_default();
    if !v.host_path.is_absolute() || !host.starts_with('/') || host.contains([':', ',']) {
        return Err(bad(format!(
            "the volume's path {} (staged at {host}) must be absolute, without ':' or ','",
            v.host_path.display()
        )));
    }
    if !dest.starts_with('/') || dest.contains([':', ',']) || dest.split('/').any(|c| c == "..") {
        return Err(bad(format!(
            "destination {} must be an absolute path without '..', ':' or ','",
            v.destination.display()
        )));
    }
    // No `:ro`: the staging mount is read-only itself when the volume is, and a plain
    // bind inherits that with its nosuid,nodev; older runc turned `:ro` into a
    // remount that cleared them.
    Ok(format!("{host}:{dest}"))
}

fn shared_alloc_dir(spec: &TaskSpec, policy: &Policy) -> Result<Option<PathBuf>, DriverError> {
    let dir = &spec.alloc_dir;
    if dir.as_os_str().is_empty() {
        return Ok(None);
    }
    let under_agent = policy.alloc_dir.is_empty() || dir.starts_with(&policy.alloc_dir);
    let clean = dir.is_absolute()
        && !dir
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir));
    if !clean || !under_agent {
        return Err(invalid(format!(
            "the allocation directory {} is not under the agent's {}",
            dir.display(),
            policy.alloc_dir
        )));
    }
    Dir::open(dir).map_err(|e| {
        invalid(format!(
            "the allocation directory {} cannot be mounted: {e}",
            dir.display()
        ))
    })?;
    warn_setuid_or_devices(dir);
    Ok(Some(dir.clone()))
}

/// Whether the filesystem mount holding `dir` honours setuid bits or device nodes.
/// Docker cannot mount a bind `nosuid,nodev` (neither `Binds` options nor
/// `Mount.BindOptions` have these), but a bind mount keeps the flags of the mount its
/// source lives on: on a `nosuid,nodev` mount, `/alloc` is one too.
fn allows_setuid_or_devices(dir: &Path) -> std::io::Result<bool> {
    Ok(flags_allow_setuid_or_devices(
        rustix::fs::statvfs(dir)?.f_flag,
    ))
}

fn flags_allow_setuid_or_devices(flags: rustix::fs::StatVfsMountFlags) -> bool {
    use rustix::fs::StatVfsMountFlags as F;
    !flags.contains(F::NOSUID | F::NODEV)
}

/// Warn, once per plugin process, when `/alloc` (shared by the group's tasks) lets a
/// task running as root plant a setuid binary or a device node for the others.
fn warn_setuid_or_devices(dir: &Path) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if matches!(allows_setuid_or_devices(dir), Ok(true)) {
        WARNED.call_once(|| {
            tracing::warn!(
                dir = %dir.display(),
                "the allocation directory is on a mount without nosuid,nodev: a docker task \
                 running as root can leave setuid binaries or device nodes in /alloc for the \
                 other tasks of its group; put the agent's alloc directory on a nosuid,nodev \
                 mount (Docker cannot mount /alloc so itself)"
            );
        });
    }
}

/// The settings of the plugin that a task start depends on.
#[derive(Debug, Clone, Default)]
pub(crate) struct Policy {
    pub config: PluginConfig,
    /// The agent's allocation directory (identifies this agent's containers).
    pub alloc_dir: String,
    /// Where host volumes are staged for dockerd to bind ([`crate::volumes`]):
    /// `<plugin state dir>/docker/volumes`; empty without a state directory.
    pub volume_staging: PathBuf,
}

/// The size of each of Docker's 3 json-file files per container, in MB: the task's log
/// file size, within these bounds.
const DOCKER_LOG_MIN_MB: u32 = 10;
const DOCKER_LOG_MAX_MB: u32 = 64;

/// A checked task: what to create, which image to make present first.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Normalized image reference.
    pub image: String,
    /// The tarball to load first: its path (for messages) and the file, opened
    /// beneath the task directory without following links.
    pub load: Option<(PathBuf, std::fs::File)>,
    pub force_pull: bool,
    pub auth: Option<bollard::auth::DockerCredentials>,
    /// The task's `image_pull_timeout`, if it has one.
    pub pull_timeout: Option<Duration>,
    /// Container name.
    pub name: String,
    pub body: ContainerCreateBody,
}

/// A Docker container name for the task: `<name>-<id>` with the name reduced to
/// Docker's charset, or `drover-<id>`.
pub(crate) fn container_name(spec: &TaskSpec) -> String {
    let name: String = spec
        .name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(64)
        .collect();
    // Docker names must start with an alphanumeric character.
    match name.chars().next() {
        Some(c) if c.is_ascii_alphanumeric() => format!("{name}-{}", spec.id),
        _ => format!("drover-{}", spec.id),
    }
}

impl TaskConfig {
    /// Check the task against the plugin's policy and build the container to create.
    pub(crate) fn plan(&self, spec: &TaskSpec, policy: &Policy) -> Result<Plan, DriverError> {
        let pc = &policy.config;
        if self.image.trim().is_empty() {
            return Err(invalid("image must not be empty"));
        }
        if let Some((key, _)) = self.unsupported().first() {
            let why = UNSUPPORTED_KEYS
                .iter()
                .find(|(k, _)| k == key)
                .map_or("", |(_, why)| *why);
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            };
            return Err(invalid(format!(
                "{key}: Nomad's docker option {key} is not supported by Drover's docker \
                 driver yet{why}; leave it out"
            )));
        }
        if let Some(m) = &self.port_map {
            drover_plugin_sdk::port_map_entries(m)?;
        }
        if let Some(n) = self.pids_limit
            && n <= 0
        {
            return Err(invalid(format!("pids_limit must be positive, not {n}")));
        }
        if let Some(h) = &self.hostname {
            let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            if h.is_empty() || h.len() > 63 || !h.chars().all(ok) {
                return Err(invalid(format!(
                    "hostname {h:?} must be 1-63 characters of [A-Za-z0-9.-]"
                )));
            }
        }
        for line in &self.extra_hosts {
            if line
                .split_once(':')
                .is_none_or(|(h, ip)| h.is_empty() || ip.is_empty())
            {
                return Err(invalid(format!("extra_hosts: {line:?} is not \"host:ip\"")));
            }
        }
        let ulimits = ulimits(&self.ulimit)?;
        if self.privileged && !pc.allow_privileged {
            return Err(invalid(
                "privileged containers are not allowed on this agent (set allow_privileged = \
                 true in the docker plugin config to allow them)",
            ));
        }
        let host = self.host_access(pc)?;
        let allowed: Vec<String> = pc.allow_caps.iter().map(|c| normalize_cap(c)).collect();
        let allow_all = allowed.iter().any(|c| c == "ALL");
        let mut cap_add = Vec::new();
        for cap in &self.cap_add {
            let c = normalize_cap(cap);
            if !allow_all && !allowed.contains(&c) {
                return Err(invalid(format!(
                    "cap_add: capability {cap:?} is not in the docker plugin's allow_caps ({})",
                    allowed.join(", ")
                )));
            }
            cap_add.push(c);
        }
        let cap_drop: Vec<String> = self.cap_drop.iter().map(|c| normalize_cap(c)).collect();
        for key in self.labels.keys() {
            if key.starts_with("drover.") {
                return Err(invalid(format!(
                    "labels: {key:?} is reserved (keys starting with \"drover.\" are set by Drover)"
                )));
            }
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') {
                return Err(invalid(format!("env: bad variable name {key:?}")));
            }
        }
        if let Some(cmd) = &self.command
            && cmd.trim().is_empty()
        {
            return Err(invalid(
                "command must not be empty (leave it out to run the image's CMD)",
            ));
        }
        if let Some(size) = self.shm_size
            && size <= 0
        {
            return Err(invalid(format!("shm_size must be positive, not {size}")));
        }

        let task = TaskDir::open(spec)?;
        let mut binds = Vec::new();
        let mut mounts = Vec::new();
        // The task's own directories, always: the Nomad layout. The variables that name
        // them are pointed at the container's paths.
        let mut dir_env = Vec::new();
        for (sub, target, vars) in [
            (
                "local",
                CONTAINER_LOCAL_DIR,
                &["DROVER_TASK_DIR", "DROVER_LOCAL_DIR"][..],
            ),
            (
                "secrets",
                CONTAINER_SECRETS_DIR,
                &["DROVER_SECRETS_DIR"][..],
            ),
        ] {
            if let Some(dir) = task.layout_dir(sub)? {
                binds.push(format!("{}:{target}", dir.display()));
                dir_env.extend(vars.iter().map(|v| (*v, target)));
            }
        }
        if let Some(dir) = shared_alloc_dir(spec, policy)? {
            binds.push(format!("{}:{CONTAINER_ALLOC_DIR}", dir.display()));
            dir_env.push(("DROVER_ALLOC_DIR", CONTAINER_ALLOC_DIR));
        }
        for (i, v) in spec.volumes.iter().enumerate() {
            let staged = crate::volumes::staged_path(&policy.volume_staging, &spec.id, i)?;
            binds.push(host_volume_bind(v, &staged)?);
        }
        // A device plugin's reservation (the operator installed the plugin: no
        // allow_devices or volumes.enabled needed, as in Nomad).
        for m in &spec.mounts {
            binds.push(device_mount_bind(m)?);
        }
        for v in &self.volumes {
            binds.push(self.bind(&task, pc, v)?);
        }
        for m in self.mounts.iter().chain(&self.mount) {
            mounts.push(mount(&task, pc, m)?);
        }

        let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        let mut exposed = Vec::new();
        let mut publish = |key: String, binding: PortBinding| {
            if !exposed.contains(&key) {
                exposed.push(key.clone());
            }
            port_bindings
                .entry(key)
                .or_default()
                .get_or_insert_with(Vec::new)
                .push(binding);
        };
        // Nomad's `port_map` sets the container port of a label, and the task's
        // NOMAD_PORT_<label> with it.
        let port_map = self
            .port_map
            .as_ref()
            .map(drover_plugin_sdk::port_map_entries)
            .transpose()?
            .unwrap_or_default();
        let mut group_ports: Vec<(&TaskPort, u16)> = Vec::new();
        match &self.ports {
            Ports::Published(p) => {
                for (container, host) in p {
                    let key = container_port(container)?;
                    let binding = host_binding(&key, host)?;
                    publish(key, binding);
                }
            }
            Ports::Labels(labels) => {
                for label in labels {
                    let port = group_port(spec, "ports", label)?;
                    let to = port_map.get(label).copied().unwrap_or(port.task_port());
                    group_ports.push((port, to));
                }
            }
        }
        for (label, to) in &port_map {
            if !group_ports.iter().any(|(p, _)| &p.label == label) {
                group_ports.push((group_port(spec, "port_map", label)?, *to));
            }
        }
        for (port, to) in &group_ports {
            // TCP and UDP, as Nomad publishes them.
            for proto in ["tcp", "udp"] {
                publish(
                    format!("{to}/{proto}"),
                    PortBinding {
                        host_ip: (!port.host_ip.is_empty()).then(|| port.host_ip.clone()),
                        host_port: Some(port.value.to_string()),
                    },
                );
            }
        }

        let load = self
            .load
            .as_deref()
            .map(|l| task.open_read("load", l))
            .transpose()?;

        // Environment: the task's (with DROVER_* from the agent), the config's on top
        // except for DROVER_*, then the directories as the container sees them.
        let mut env = spec.env.clone();
        for (k, v) in &self.env {
            if !(k.starts_with("DROVER_") && env.contains_key(k)) {
                env.insert(k.clone(), v.clone());
            }
        }
        for (var, target) in dir_env {
            env.insert(var.to_owned(), target.to_owned());
        }
        for (label, to) in &port_map {
            env.insert(format!("NOMAD_PORT_{label}"), to.to_string());
        }

        let mut labels: HashMap<String, String> = self
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(LABEL_TASK_ID.into(), spec.id.clone());
        labels.insert(LABEL_TASK_NAME.into(), spec.name.clone());
        if !policy.alloc_dir.is_empty() {
            labels.insert(LABEL_ALLOC_DIR.into(), policy.alloc_dir.clone());
        }

        let cmd = match (&self.command, self.args.is_empty()) {
            (Some(c), _) => Some(
                std::iter::once(c.clone())
                    .chain(self.args.clone())
                    .collect(),
            ),
            (None, false) => Some(self.args.clone()),
            (None, true) => None,
        };
        let user = self
            .user
            .clone()
            .or_else(|| (!spec.user.is_empty()).then(|| spec.user.clone()));

        let r = spec.resources;
        let mib = |m: i64| m.saturating_mul(1024 * 1024);
        let (memory, reservation) = match (r.memory_mb, r.memory_max_mb) {
            (m, max) if max > m && max > 0 => (Some(mib(max)), (m > 0).then(|| mib(m))),
            (m, _) if m > 0 => (Some(mib(m)), None),
            _ => (None, None),
        };
        // Docker's copy of the output is a buffer between the container and the log
        // follower, and covers the time a plugin restart takes (the relaunched plugin
        // reads on from its cursor): at least 3 × 10 MB. It is sized on its own terms,
        // not as the task's log files: those may be 1 file of 1024 MB, which as
        // Docker's 3 files kept 3 GB per container. 3 × 64 MB holds minutes of a
        // chatty task's output.
        let log_size = spec
            .logs
            .max_file_size_mb
            .clamp(DOCKER_LOG_MIN_MB, DOCKER_LOG_MAX_MB);

        let host_config = HostConfig {
            binds: (!binds.is_empty()).then_some(binds),
            mounts: (!mounts.is_empty()).then_some(mounts),
            port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
            network_mode: host.network_mode,
            pid_mode: host.pid_mode,
            ipc_mode: host.ipc_mode,
            uts_mode: host.uts_mode,
            userns_mode: host.userns_mode,
            devices: reserved_devices(host.devices, &spec.devices)?,
            security_opt: host.security_opt,
            sysctls: host.sysctls,
            cap_add: (!cap_add.is_empty()).then_some(cap_add),
            cap_drop: (!cap_drop.is_empty()).then_some(cap_drop),
            privileged: self.privileged.then_some(true),
            memory,
            memory_reservation: reservation,
            // Swap would let a task run past its limit instead of being OOM killed.
            memory_swap: memory,
            // Docker refuses shares below 2.
            cpu_shares: (r.cpu_shares > 0).then(|| r.cpu_shares.max(2)),
            shm_size: self.shm_size,
            init: self.init.then_some(true),
            dns: (!self.dns_servers.is_empty()).then(|| self.dns_servers.clone()),
            dns_search: (!self.dns_search_domains.is_empty())
                .then(|| self.dns_search_domains.clone()),
            dns_options: (!self.dns_options.is_empty()).then(|| self.dns_options.clone()),
            extra_hosts: (!self.extra_hosts.is_empty()).then(|| self.extra_hosts.clone()),
            readonly_rootfs: self.readonly_rootfs.then_some(true),
            pids_limit: self.pids_limit,
            ulimits: (!ulimits.is_empty()).then_some(ulimits),
            // The plugin reads the container's output back from this driver (with
            // timestamps, for the log cursor); it is only a buffer, so keep it small.
            log_config: Some(HostConfigLogConfig {
                typ: Some("json-file".into()),
                config: Some(HashMap::from([
                    ("max-size".to_owned(), format!("{log_size}m")),
                    ("max-file".to_owned(), "3".to_owned()),
                ])),
            }),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(normalize_image(&self.image)),
            cmd,
            entrypoint: self.entrypoint.clone(),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            working_dir: self.work_dir.clone(),
            hostname: self.hostname.clone(),
            user,
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            tty: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        };
        Ok(Plan {
            image: normalize_image(&self.image),
            load,
            force_pull: self.force_pull,
            auth: self.auth.as_ref().map(AuthConfig::credentials),
            pull_timeout: self.image_pull_timeout,
            name: container_name(spec),
            body,
        })
    }

    /// Check every option that shares something of the host (or of another container)
    /// against the plugin config, refusing with the option and the setting that would
    /// allow it; the checked values as the container gets them.
    fn host_access(&self, pc: &PluginConfig) -> Result<HostAccess, DriverError> {
        const IPC_OWN: &[&str] = &["private", "shareable", "none"];
        let mode = |field: &'static str,
                    value: &Option<String>,
                    ns: HostNamespace,
                    own: Option<&[&str]>,
                    container: bool| {
            value
                .as_deref()
                .map(|v| namespace_mode(pc, field, v, ns, own, container))
                .transpose()
        };
        let network_mode = mode(
            "network_mode",
            &self.network_mode,
            HostNamespace::Network,
            None,
            true,
        )?;
        let pid_mode = mode(
            "pid_mode",
            &self.pid_mode,
            HostNamespace::Pid,
            Some(&[]),
            true,
        )?;
        let ipc_mode = mode(
            "ipc_mode",
            &self.ipc_mode,
            HostNamespace::Ipc,
            Some(IPC_OWN),
            true,
        )?;
        let uts_mode = mode(
            "uts_mode",
            &self.uts_mode,
            HostNamespace::Uts,
            Some(&[]),
            false,
        )?;
        let userns_mode = mode(
            "userns_mode",
            &self.userns_mode,
            HostNamespace::Userns,
            Some(&[]),
            false,
        )?;

        if let Some(d) = self.devices.first()
            && !pc.allow_devices
        {
            return Err(invalid(format!(
                "devices: host device {:?} is not allowed on this agent (set allow_devices = \
                 true in the docker plugin config to allow devices)",
                d.host_path
            )));
        }
        let devices = self
            .devices
            .iter()
            .map(device)
            .collect::<Result<Vec<_>, _>>()?;

        for opt in &self.security_opt {
            if !pc.allow_security_opt && !tightens_only(opt) {
                return Err(invalid(format!(
                    "security_opt: {opt:?} is not allowed on this agent (set \
                     allow_security_opt = true in the docker plugin config to allow it; \
                     only \"no-new-privileges\" is allowed by default)"
                )));
            }
        }
        if let Some(key) = self.sysctl.keys().next()
            && !pc.allow_sysctl
        {
            return Err(invalid(format!(
                "sysctl: {key:?} is not allowed on this agent (set allow_sysctl = true in the \
                 docker plugin config to allow kernel parameters)"
            )));
        }
        Ok(HostAccess {
            network_mode,
            pid_mode,
            ipc_mode,
            uts_mode,
            userns_mode,
            devices: (!devices.is_empty()).then_some(devices),
            security_opt: (!self.security_opt.is_empty()).then(|| self.security_opt.clone()),
            sysctls: (!self.sysctl.is_empty()).then(|| {
                self.sysctl
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            }),
        })
    }

    /// One `volumes` entry as a Docker bind string.
    fn bind(&self, task: &TaskDir<'_>, pc: &PluginConfig, v: &str) -> Result<String, DriverError> {
        let parts: Vec<&str> = v.split(':').collect();
        let (source, target, mode) = match parts.as_slice() {
            [s, t] => (*s, *t, None),
            [s, t, m] => (*s, *t, Some(*m)),
            _ => {
                return Err(invalid(format!(
                    "volumes: {v:?} is not source:target or source:target:mode"
                )));
            }
        };
        if source.is_empty() || !target.starts_with('/') {
            return Err(invalid(format!(
                "volumes: {v:?} needs a source and an absolute target"
            )));
        }
        // Docker's mode is a comma-separated list (`ro`, `rw`, `z`, `ro,Z`, …).
        let writable = !mode.is_some_and(|m| m.split(',').any(|o| o == "ro"));
        let how = Use::Bind {
            writable,
            create: true,
        };
        let source = host_source(task, pc, "volumes", source, how)?;
        Ok(match mode {
            Some(m) => format!("{source}:{target}:{m}"),
            None => format!("{source}:{target}"),
        })
    }
}

/// The host side of a bind or volume: inside the task directory for a relative path,
/// otherwise only with `volumes.enabled`.
fn host_source(
    task: &TaskDir<'_>,
    pc: &PluginConfig,
    field: &str,
    source: &str,
    how: Use,
) -> Result<String, DriverError> {
    let is_path = source.starts_with('/') || source.starts_with('.') || source.contains('/');
    if is_path && !source.starts_with('/') {
        return Ok(task.resolve(field, source, how)?.display().to_string());
    }
    if !pc.volumes.enabled {
        let what = if is_path {
            format!("host path {source:?}")
        } else {
            format!("named volume {source:?}")
        };
        return Err(invalid(format!(
            "{field}: {what} is not allowed: volumes are disabled in the docker plugin config \
             (volumes.enabled = false); paths relative to the task directory are allowed"
        )));
    }
    Ok(source.to_owned())
}

fn mount(task: &TaskDir<'_>, pc: &PluginConfig, m: &MountConfig) -> Result<Mount, DriverError> {
    if !m.target.starts_with('/') {
        return Err(invalid(format!(
            "mounts: target {:?} must be an absolute path",
            m.target
        )));
    }
    for (key, set) in [
        ("bind_options", m.bind_options.is_some()),
        ("volume_options", m.volume_options.is_some()),
    ] {
        if set {
            return Err(invalid(format!(
                "mounts: {}: {key} is not supported by Drover's docker driver yet; leave it out",
                m.target
            )));
        }
    }
    let (typ, source) = match m.kind {
        MountKind::Tmpfs => (MountType::TMPFS, None),
        MountKind::Bind | MountKind::Volume => {
            let Some(source) = m.source.as_deref().filter(|s| !s.is_empty()) else {
                return Err(invalid(format!("mounts: {} needs a source", m.target)));
            };
            let typ = if m.kind == MountKind::Bind {
                MountType::BIND
            } else {
                MountType::VOLUME
            };
            if m.kind == MountKind::Volume && !pc.volumes.enabled {
                return Err(invalid(format!(
                    "mounts: volume {source:?} is not allowed: volumes are disabled in the \
                     docker plugin config (volumes.enabled = false)"
                )));
            }
            // Docker refuses a missing bind source in `mounts`; so does the check.
            let how = Use::Bind {
                writable: !m.readonly,
                create: false,
            };
            let source = if m.kind == MountKind::Bind && !source.starts_with('/') {
                task.resolve("mounts", source, how)?.display().to_string()
            } else {
                host_source(task, pc, "mounts", source, how)?
            };
            (typ, Some(source))
        }
    };
    let tmpfs_options = match (&m.tmpfs_options, m.kind) {
        (None, _) => None,
        (Some(o), MountKind::Tmpfs) => Some(tmpfs_options(&m.target, o)?),
        (Some(_), _) => {
            return Err(invalid(format!(
                "mounts: {}: tmpfs_options go with type = \"tmpfs\"",
                m.target
            )));
        }
    };
    Ok(Mount {
        target: Some(m.target.clone()),
        source,
        typ: Some(typ),
        read_only: m.readonly.then_some(true),
        tmpfs_options,
        ..Default::default()
    })
}

/// Docker's ulimits from `ulimit` (`"soft:hard"` or one number for both), refusing
/// those that would let a task out-schedule the host (as the exec driver does).
fn ulimits(
    config: &BTreeMap<String, String>,
) -> Result<Vec<bollard::models::ResourcesUlimits>, DriverError> {
    let mut out = Vec::new();
    for (name, value) in config {
        let number = |t: &str| t.trim().parse::<i64>().ok().filter(|n| *n >= 0);
        let (soft, hard) = match value.split_once(':') {
            Some((s, h)) => (number(s), number(h)),
            None => (number(value), number(value)),
        };
        let (Some(soft), Some(hard)) = (soft, hard) else {
            return Err(invalid(format!(
                "ulimit: {name} = {value:?} is not \"soft:hard\" or one number"
            )));
        };
        if soft > hard {
            return Err(invalid(format!(
                "ulimit: {name} = {value:?}: the soft limit is above the hard one"
            )));
        }
        let raises = match name.as_str() {
            "rtprio" => hard > 0,
            "nice" => hard > 20,
            _ => false,
        };
        if raises {
            return Err(invalid(format!(
                "ulimit: {name} {soft}/{hard} is refused: it lets a task raise its scheduling \
                 priority above other tasks' and the host's (CPU limits come from the task's \
                 resources)"
            )));
        }
        out.push(bollard::models::ResourcesUlimits {
            name: Some(name.clone()),
            soft: Some(soft),
            hard: Some(hard),
        });
    }
    Ok(out)
}

/// Docker's tmpfs options from Nomad's: `mode` is written in octal digits.
fn tmpfs_options(
    target: &str,
    o: &TmpfsOptions,
) -> Result<bollard::models::MountTmpfsOptions, DriverError> {
    if let Some(size) = o.size
        && size <= 0
    {
        return Err(invalid(format!(
            "mounts: {target}: tmpfs_options size must be positive, not {size}"
        )));
    }
    let mode = o
        .mode
        .map(|m| {
            i64::from_str_radix(&m.to_string(), 8)
                .ok()
                .filter(|bits| (0..=0o7777).contains(bits))
                .ok_or_else(|| {
                    invalid(format!(
                        "mounts: {target}: tmpfs_options mode {m} is not permission bits in \
                         octal digits, like 1777"
                    ))
                })
        })
        .transpose()?;
    Ok(bollard::models::MountTmpfsOptions {
        size_bytes: o.size,
        mode,
        ..Default::default()
    })
}

/// The host-reaching parts of the container, checked by [`TaskConfig::host_access`].
struct HostAccess {
    network_mode: Option<String>,
    pid_mode: Option<String>,
    ipc_mode: Option<String>,
    uts_mode: Option<String>,
    userns_mode: Option<String>,
    devices: Option<Vec<DeviceMapping>>,
    security_opt: Option<Vec<String>>,
    sysctls: Option<HashMap<String, String>>,
}

/// Check one `*_mode` value: `host` needs `ns` in `allow_host_namespaces`,
/// `container:<id>` (where Docker has it: `container`) needs
/// `allow_container_namespaces`, anything else must be in `own` (`None`: any other
/// value, e.g. a network name). "host" is matched in any case and with blanks around
/// it, so that a spelling Docker might read differently is refused rather than passed.
fn namespace_mode(
    pc: &PluginConfig,
    field: &str,
    value: &str,
    ns: HostNamespace,
    own: Option<&[&str]>,
    container: bool,
) -> Result<String, DriverError> {
    let v = value.trim();
    if v.is_empty() {
        // Docker's default: the container's own namespace.
        return Ok(String::new());
    }
    if v.eq_ignore_ascii_case("host") {
        if pc.allow_host_namespaces.contains(&ns) {
            return Ok(v.to_owned());
        }
        return Err(invalid(format!(
            "{field} {value:?} shares the host's {name} namespace, which is not allowed on this \
             agent (add \"{name}\" to allow_host_namespaces in the docker plugin config to \
             allow it)",
            name = ns.name()
        )));
    }
    let lower = v.to_ascii_lowercase();
    if container && lower.starts_with("container:") {
        if v.len() == "container:".len() {
            return Err(invalid(format!(
                "{field} {value:?} names no container (container:<name or id>)"
            )));
        }
        if pc.allow_container_namespaces {
            return Ok(v.to_owned());
        }
        return Err(invalid(format!(
            "{field} {value:?} joins the {name} namespace of another container, which is not \
             allowed on this agent (set allow_container_namespaces = true in the docker \
             plugin config to allow it)",
            name = ns.name()
        )));
    }
    match own {
        None => Ok(v.to_owned()),
        Some(list) if list.contains(&v) => Ok(v.to_owned()),
        Some(list) => {
            let mut accepted: Vec<String> = list.iter().map(|o| format!("{o:?}")).collect();
            accepted.push("\"host\"".into());
            if container {
                accepted.push("\"container:<name or id>\"".into());
            }
            Err(invalid(format!(
                "{field}: {value:?} is not one of {}",
                accepted.join(", ")
            )))
        }
    }
}

/// A `security_opt` entry that only takes privileges away.
fn tightens_only(opt: &str) -> bool {
    matches!(
        opt.trim(),
        "no-new-privileges" | "no-new-privileges:true" | "no-new-privileges=true"
    )
}

/// A path of a device plugin's reservation for docker's `Binds`/`Devices`: absolute,
/// without `..`, `:` or `,`.
fn reserved_path(what: &str, path: &Path) -> Result<String, DriverError> {
    let text = path.to_str().unwrap_or_default();
    if !text.starts_with('/') || text.contains([':', ',']) || text.split('/').any(|c| c == "..") {
        return Err(invalid(format!(
            "{what} {} of a device reservation must be an absolute path without '..', ':' \
             or ','",
            path.display()
        )));
    }
    Ok(text.to_owned())
}

/// A device plugin's mount as a bind.
fn device_mount_bind(m: &drover_plugin_sdk::TaskMount) -> Result<String, DriverError> {
    let host = reserved_path("host path", &m.host_path)?;
    let task = reserved_path("task path", &m.task_path)?;
    Ok(if m.read_only {
        format!("{host}:{task}:ro")
    } else {
        format!("{host}:{task}")
    })
}

/// The task config's `devices` and a device plugin's device nodes, for `Devices`.
fn reserved_devices(
    configured: Option<Vec<DeviceMapping>>,
    reserved: &[drover_plugin_sdk::TaskDevice],
) -> Result<Option<Vec<DeviceMapping>>, DriverError> {
    let mut all = configured.unwrap_or_default();
    for d in reserved {
        let perms = &d.permissions;
        if perms.is_empty() || !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(invalid(format!(
                "device node {}: permissions {perms:?} must be made of r, w and m",
                d.task_path.display()
            )));
        }
        all.push(DeviceMapping {
            path_on_host: Some(reserved_path("host path", &d.host_path)?),
            path_in_container: Some(reserved_path("task path", &d.task_path)?),
            cgroup_permissions: Some(perms.clone()),
        });
    }
    Ok((!all.is_empty()).then_some(all))
}

fn device(d: &DeviceConfig) -> Result<DeviceMapping, DriverError> {
    if !d.host_path.starts_with('/') {
        return Err(invalid(format!(
            "devices: host_path {:?} must be an absolute path",
            d.host_path
        )));
    }
    let target = d
        .container_path
        .clone()
        .unwrap_or_else(|| d.host_path.clone());
    if !target.starts_with('/') {
        return Err(invalid(format!(
            "devices: container_path {target:?} must be an absolute path"
        )));
    }
    let perms = d.cgroup_permissions.clone().unwrap_or_else(|| "rwm".into());
    if perms.is_empty() || !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(invalid(format!(
            "devices: cgroup_permissions {perms:?} of {} must be made of r, w and m",
            d.host_path
        )));
    }
    Ok(DeviceMapping {
        path_on_host: Some(d.host_path.clone()),
        path_in_container: Some(target),
        cgroup_permissions: Some(perms),
    })
}

/// `"80"` → `"80/tcp"`; `"53/udp"` stays.
fn container_port(key: &str) -> Result<String, DriverError> {
    let (port, proto) = key.split_once('/').unwrap_or((key, "tcp"));
    let ok_port = port.parse::<u16>().is_ok_and(|p| p > 0);
    if !ok_port || !matches!(proto, "tcp" | "udp" | "sctp") {
        return Err(invalid(format!(
            "ports: {key:?} is not a container port like \"80\" or \"53/udp\""
        )));
    }
    Ok(format!("{port}/{proto}"))
}

fn host_binding(key: &str, host: &PortSpec) -> Result<PortBinding, DriverError> {
    Ok(match host {
        PortSpec::Port(p) => PortBinding {
            host_ip: None,
            host_port: Some(p.to_string()),
        },
        PortSpec::Address(a) => {
            let parsed: std::net::SocketAddr = a.parse().map_err(|_| {
                invalid(format!(
                    "ports: {key}: {a:?} is not a host port or an \"ip:port\" address"
                ))
            })?;
            PortBinding {
                host_ip: Some(parsed.ip().to_string()),
                host_port: Some(parsed.port().to_string()),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_without_nosuid_nodev_is_told_apart() {
        use rustix::fs::StatVfsMountFlags as F;
        assert!(!flags_allow_setuid_or_devices(
            F::NOSUID | F::NODEV | F::NOEXEC
        ));
        assert!(flags_allow_setuid_or_devices(F::NOSUID));
        assert!(flags_allow_setuid_or_devices(F::NODEV));
        assert!(flags_allow_setuid_or_devices(F::empty()));
        // /dev holds device nodes: its mount is never nodev.
        assert!(allows_setuid_or_devices(Path::new("/dev")).unwrap());
    }

    fn parse(json: &str) -> TaskConfig {
        serde_json::from_str(json).unwrap()
    }

    fn spec(dir: &Path) -> TaskSpec {
        TaskSpec::new("t1")
            .with_name("web server")
            .with_task_dir(dir)
            .with_env("A", "1")
    }

    fn policy() -> Policy {
        Policy {
            config: PluginConfig::default(),
            alloc_dir: "/var/lib/drover/alloc".into(),
            volume_staging: PathBuf::new(),
        }
    }

    #[test]
    fn the_allocation_dir_is_mounted_at_alloc_only_from_under_the_agent_dir() {
        let agent = tempfile::tempdir().unwrap();
        let task_dir = agent.path().join("t1");
        std::fs::create_dir_all(task_dir.join("local")).unwrap();
        let shared = agent.path().join("a1/alloc");
        std::fs::create_dir_all(shared.join("data")).unwrap();
        let p = Policy {
            config: PluginConfig::default(),
            alloc_dir: agent.path().display().to_string(),
            volume_staging: PathBuf::new(),
        };
        let cfg = parse(r#"{"image": "busybox"}"#);
        let plan = cfg
            .plan(&spec(&task_dir).with_alloc_dir(&shared), &p)
            .unwrap();
        let h = plan.body.host_config.as_ref().unwrap();
        assert!(
            h.binds
                .as_ref()
                .unwrap()
                .contains(&format!("{}:/alloc", shared.display())),
            "{:?}",
            h.binds
        );
        let env = plan.body.env.as_ref().unwrap();
        assert!(
            env.contains(&"DROVER_ALLOC_DIR=/alloc".to_owned()),
            "{env:?}"
        );

        // A link in its place, a path elsewhere, a path climbing out: refused.
        let link = agent.path().join("a2");
        std::fs::create_dir(&link).unwrap();
        std::os::unix::fs::symlink("/etc", link.join("alloc")).unwrap();
        for bad in [
            link.join("alloc"),
            PathBuf::from("/etc"),
            agent.path().join("a1/../../x"),
        ] {
            let e = cfg
                .plan(&spec(&task_dir).with_alloc_dir(&bad), &p)
                .map(|_| ())
                .unwrap_err();
            assert!(
                matches!(&e, DriverError::InvalidConfig(m) if m.contains("allocation directory")),
                "{}: {e:?}",
                bad.display()
            );
        }
    }

    fn err(cfg: &str, policy: &Policy) -> String {
        let dir = tempfile::tempdir().unwrap();
        match parse(cfg).plan(&spec(dir.path()), policy) {
            Err(DriverError::InvalidConfig(m)) => m,
            other => panic!("expected InvalidConfig for {cfg}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_schema() {
        let c: PluginConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, PluginConfig::default());
        assert!(!c.allow_privileged && !c.volumes.enabled && !c.gc.image);
        assert!(c.gc.dangling_containers.enabled && !c.gc.dangling_containers.remove);
        let e = serde_json::from_str::<PluginConfig>(r#"{"pull_timeout":"soon"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon"), "{e}");
        let schema = serde_json::to_value(schemars::schema_for!(TaskConfig)).unwrap();
        assert_eq!(schema["additionalProperties"], false, "{schema:#}");
        assert_eq!(schema["required"], serde_json::json!(["image"]));
        let schema = serde_json::to_value(schemars::schema_for!(PluginConfig)).unwrap();
        assert_eq!(schema["properties"]["pull_timeout"]["type"], "string");
    }

    #[test]
    fn durations_are_written_like_30s() {
        let c: PluginConfig = serde_json::from_str(
            r#"{"pull_timeout":"30s","gc":{"image_delay":"1m 30s",
                "dangling_containers":{"period":"200ms","creation_grace":"1h"}}}"#,
        )
        .unwrap();
        assert_eq!(c.pull_timeout, Duration::from_secs(30));
        assert_eq!(c.gc.image_delay, Duration::from_secs(90));
        assert_eq!(c.gc.dangling_containers.period, Duration::from_millis(200));
        assert_eq!(
            c.gc.dangling_containers.creation_grace,
            Duration::from_secs(3600)
        );
        // A number is not a duration: the unit must be written.
        assert!(serde_json::from_str::<PluginConfig>(r#"{"pull_timeout":30}"#).is_err());
        let schema = serde_json::to_value(schemars::schema_for!(GcConfig)).unwrap();
        assert_eq!(schema["properties"]["image_delay"]["type"], "string");
        let schema = serde_json::to_value(schemars::schema_for!(DanglingConfig)).unwrap();
        assert_eq!(schema["properties"]["period"]["type"], "string");
        assert_eq!(schema["properties"]["creation_grace"]["type"], "string");
    }

    /// Nomad's `ports = ["http"]` publishes the allocation's port on the node's
    /// address to the port's `to` (or the same number), TCP and UDP; `port_map`
    /// gives a label its container port and `NOMAD_PORT_<label>`; a label the group
    /// lacks is refused naming it and the labels there are.
    #[test]
    fn group_port_labels_are_published_from_the_nodes_address() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path()).with_ports([
            TaskPort::new("http", 23456)
                .with_to(80)
                .with_host_ip("127.0.0.1"),
            TaskPort::new("metrics", 23457).with_host_ip("127.0.0.1"),
            TaskPort::new("admin", 23458).with_host_ip("127.0.0.1"),
        ]);
        let cfg =
            parse(r#"{"image":"busybox","ports":["http","metrics"],"port_map":[{"admin":9000}]}"#);
        let plan = cfg.plan(&s, &policy()).unwrap();
        let h = plan.body.host_config.as_ref().unwrap();
        let bindings = h.port_bindings.as_ref().unwrap();
        let bound = |key: &str| {
            let b = &bindings[key].as_ref().unwrap()[0];
            (b.host_ip.clone().unwrap(), b.host_port.clone().unwrap())
        };
        assert_eq!(bound("80/tcp"), ("127.0.0.1".into(), "23456".into()));
        assert_eq!(bound("80/udp"), ("127.0.0.1".into(), "23456".into()));
        assert_eq!(bound("23457/tcp"), ("127.0.0.1".into(), "23457".into()));
        assert_eq!(bound("9000/tcp"), ("127.0.0.1".into(), "23458".into()));
        assert_eq!(bindings.len(), 6, "{bindings:?}");
        let exposed = plan.body.exposed_ports.as_ref().unwrap();
        assert!(exposed.contains(&"80/tcp".to_owned()), "{exposed:?}");
        let env = plan.body.env.as_ref().unwrap();
        assert!(env.contains(&"NOMAD_PORT_admin=9000".to_owned()), "{env:?}");

        let m = err_with(r#"{"image":"x","ports":["http","nope"]}"#, &s);
        assert!(
            m.contains("ports: port \"nope\" not found in the group's network block")
                && m.contains("it has http, metrics, admin"),
            "{m}"
        );
        let m = err_with(r#"{"image":"x","port_map":{"web":80}}"#, &spec(dir.path()));
        assert!(
            m.contains("port_map: port \"web\" not found") && m.contains("it has no ports"),
            "{m}"
        );
    }

    fn err_with(cfg: &str, spec: &TaskSpec) -> String {
        match parse(cfg).plan(spec, &policy()) {
            Err(DriverError::InvalidConfig(m)) => m,
            other => panic!("expected InvalidConfig for {cfg}, got {other:?}"),
        }
    }

    #[test]
    fn builds_the_container() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("local")).unwrap();
        let cfg = parse(
            r#"{"image":"busybox","command":"sh","args":["-c","echo hi"],
                "env":{"B":"2","A":"override"},"labels":{"team":"web"},
                "ports":{"80":8080,"53/udp":"127.0.0.1:5353"},"work_dir":"/srv",
                "cap_add":["net_bind_service"],"cap_drop":["CAP_CHOWN"],"init":true,
                "shm_size":1048576,"network_mode":"host"}"#,
        );
        let mut s = spec(dir.path());
        s.resources.memory_mb = 64;
        s.resources.cpu_shares = 1;
        s.user = "nobody".into();
        let mut p = policy();
        p.config.allow_host_namespaces = vec![HostNamespace::Network];
        let plan = cfg.plan(&s, &p).unwrap();
        assert_eq!(plan.image, "busybox:latest");
        assert_eq!(plan.name, "webserver-t1");
        let b = &plan.body;
        assert_eq!(b.cmd.as_deref().unwrap(), ["sh", "-c", "echo hi"]);
        let env = b.env.as_ref().unwrap();
        assert!(env.contains(&"A=override".to_owned()), "{env:?}");
        assert!(env.contains(&"B=2".to_owned()));
        assert!(env.contains(&"DROVER_LOCAL_DIR=/local".to_owned()));
        assert!(
            !env.iter().any(|e| e.starts_with("DROVER_SECRETS_DIR")),
            "secrets/ is not mounted, so not named: {env:?}"
        );
        let labels = b.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_TASK_ID], "t1");
        assert_eq!(labels[LABEL_TASK_NAME], "web server");
        assert_eq!(labels[LABEL_ALLOC_DIR], "/var/lib/drover/alloc");
        assert_eq!(labels["team"], "web");
        assert_eq!(b.user.as_deref(), Some("nobody"));
        assert_eq!(b.working_dir.as_deref(), Some("/srv"));
        let h = b.host_config.as_ref().unwrap();
        assert_eq!(h.memory, Some(64 << 20));
        assert_eq!(h.memory_swap, Some(64 << 20));
        assert_eq!(h.memory_reservation, None);
        assert_eq!(h.cpu_shares, Some(2));
        assert_eq!(h.cap_add.as_deref().unwrap(), ["NET_BIND_SERVICE"]);
        assert_eq!(h.cap_drop.as_deref().unwrap(), ["CHOWN"]);
        assert_eq!(h.init, Some(true));
        assert_eq!(h.shm_size, Some(1 << 20));
        assert_eq!(h.network_mode.as_deref(), Some("host"));
        let ports = h.port_bindings.as_ref().unwrap();
        assert_eq!(
            ports["80/tcp"].as_ref().unwrap()[0].host_port.as_deref(),
            Some("8080")
        );
        let udp = &ports["53/udp"].as_ref().unwrap()[0];
        assert_eq!(udp.host_ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(udp.host_port.as_deref(), Some("5353"));
        let binds = h.binds.as_ref().unwrap();
        assert_eq!(
            binds,
            &[format!("{}/local:/local", dir.path().display())],
            "secrets/ does not exist, so it is not mounted"
        );
    }

    /// A task config as Nomad's job files write it and `nomad job run -output` prints
    /// it (blocks as lists of objects): it passes the schema the agent checks with,
    /// and every key lands where Nomad's docker driver puts it.
    #[test]
    fn nomads_docker_config_as_its_api_carries_it_builds_the_container() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("local/y")).unwrap();
        std::fs::create_dir_all(dir.path().join("local/x")).unwrap();
        let json = r#"{"args": ["-c", "echo hi"], "auth": [{"password": "p", "username": "u"}],
            "command": "sh", "entrypoint": ["/bin/sh"], "hostname": "h", "image": "busybox:1.36",
            "image_pull_timeout": "1m", "labels": [{"a": "b"}, {"c": "d"}],
            "mount": [{"readonly": true, "source": "local/y", "target": "/y", "type": "bind"},
                      {"target": "/t", "tmpfs_options": [{"size": 1000, "mode": 1777}], "type": "tmpfs"}],
            "network_mode": "bridge", "sysctl": [{"net.core.somaxconn": "16384"}],
            "ulimit": [{"nofile": "2048:4096"}], "volumes": ["local/x:/x:ro"], "work_dir": "/srv",
            "dns_servers": ["1.1.1.1"], "dns_search_domains": ["example.com"],
            "dns_options": ["ndots:2"], "extra_hosts": ["db:10.0.0.2"], "readonly_rootfs": true,
            "pids_limit": 64, "tty": false, "interactive": false, "cap_add": ["CHOWN"],
            "cap_drop": ["NET_RAW"], "force_pull": false}"#;
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        let schema = serde_json::to_value(schemars::schema_for!(TaskConfig)).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(problems.is_empty(), "{problems:?}");
        let cfg = parse(json);
        let mut p = policy();
        p.config.allow_sysctl = true;
        let plan = cfg.plan(&spec(dir.path()), &p).unwrap();
        assert_eq!(plan.pull_timeout, Some(Duration::from_secs(60)));
        assert_eq!(plan.auth.as_ref().unwrap().username.as_deref(), Some("u"));
        let b = &plan.body;
        assert_eq!(b.cmd.as_deref().unwrap(), ["sh", "-c", "echo hi"]);
        assert_eq!(b.entrypoint.as_deref().unwrap(), ["/bin/sh"]);
        assert_eq!(b.hostname.as_deref(), Some("h"));
        assert_eq!(b.working_dir.as_deref(), Some("/srv"));
        let labels = b.labels.as_ref().unwrap();
        assert_eq!((labels["a"].as_str(), labels["c"].as_str()), ("b", "d"));
        let h = b.host_config.as_ref().unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("bridge"));
        assert_eq!(h.sysctls.as_ref().unwrap()["net.core.somaxconn"], "16384");
        let u = &h.ulimits.as_ref().unwrap()[0];
        assert_eq!(
            (u.name.as_deref(), u.soft, u.hard),
            (Some("nofile"), Some(2048), Some(4096))
        );
        assert_eq!(h.dns.as_deref().unwrap(), ["1.1.1.1"]);
        assert_eq!(h.dns_search.as_deref().unwrap(), ["example.com"]);
        assert_eq!(h.dns_options.as_deref().unwrap(), ["ndots:2"]);
        assert_eq!(h.extra_hosts.as_deref().unwrap(), ["db:10.0.0.2"]);
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.pids_limit, Some(64));
        let mounts = h.mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 2, "{mounts:?}");
        assert_eq!(mounts[0].target.as_deref(), Some("/y"));
        assert_eq!(mounts[0].read_only, Some(true));
        let tmpfs = mounts[1].tmpfs_options.as_ref().unwrap();
        assert_eq!((tmpfs.size_bytes, tmpfs.mode), (Some(1000), Some(0o1777)));
        let binds = h.binds.as_ref().unwrap();
        assert!(
            binds.contains(&format!("{}/local/x:/x:ro", dir.path().display())),
            "{binds:?}"
        );
    }

    /// Nomad keys Drover cannot honour are refused naming the key and why: a
    /// `port_map` entry that is no port; options not supported yet say so; the safety
    /// refusals stay; a typo keeps its unknown-field error.
    #[test]
    fn nomads_docker_keys_drover_cannot_honour_are_refused_naming_them() {
        let p = policy();
        for (json, words) in [
            (
                r#"{"image":"x","port_map":[{"http":0}]}"#,
                &["port_map: http = 0 is not a port"][..],
            ),
            (
                r#"{"image":"x","logging":[{"type":"syslog"}]}"#,
                &[
                    "logging: Nomad's docker option logging is not supported",
                    "json-file",
                ],
            ),
            (r#"{"image":"x","tty":true}"#, &["tty", "not supported"]),
            (
                r#"{"image":"x","runtime":"runsc"}"#,
                &["runtime", "not supported"],
            ),
            (
                r#"{"image":"x","memory_hard_limit":512}"#,
                &["memory_hard_limit", "memory_max"],
            ),
            (r#"{"image":"x","privileged":true}"#, &["allow_privileged"]),
            (
                r#"{"image":"x","network_mode":"host"}"#,
                &["network_mode", "host"],
            ),
            (
                r#"{"image":"x","cap_add":["SYS_ADMIN"]}"#,
                &["cap_add", "allow_caps"],
            ),
            (
                r#"{"image":"x","mount":[{"type":"bind","source":"local","target":"/l","bind_options":[{"propagation":"rshared"}]}]}"#,
                &["bind_options is not supported"],
            ),
            (
                r#"{"image":"x","ulimit":[{"rtprio":"99"}]}"#,
                &["ulimit: rtprio 99/99 is refused"],
            ),
            (
                r#"{"image":"x","ulimit":{"nofile":"many"}}"#,
                &["nofile", "soft:hard"],
            ),
            (r#"{"image":"x","hostname":"a b"}"#, &["hostname"]),
            (
                r#"{"image":"x","extra_hosts":["nohost"]}"#,
                &["extra_hosts", "host:ip"],
            ),
            (r#"{"image":"x","pids_limit":0}"#, &["pids_limit"]),
        ] {
            let e = err(json, &p);
            for w in words {
                assert!(e.contains(w), "{json}: {e:?} lacks {w:?}");
            }
        }
        // An empty list of port labels asks for nothing.
        let dir = tempfile::tempdir().unwrap();
        parse(r#"{"image":"x","ports":[]}"#)
            .plan(&spec(dir.path()), &p)
            .unwrap();
        let e = serde_json::from_str::<TaskConfig>(r#"{"image":"x","imgae":"y"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("imgae"), "{e}");
        let e = serde_json::from_str::<TaskConfig>(r#"{"image":"x","auth":[{"user":"u"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("user"), "{e}");
        let e = serde_json::from_str::<TaskConfig>(r#"{"image":"x","auth":[{},{}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one block"), "{e}");
    }

    #[test]
    fn memory_max_is_the_limit_and_memory_the_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.resources.memory_mb = 64;
        s.resources.memory_max_mb = 128;
        let plan = parse(r#"{"image":"x"}"#).plan(&s, &policy()).unwrap();
        let h = plan.body.host_config.unwrap();
        assert_eq!(h.memory, Some(128 << 20));
        assert_eq!(h.memory_reservation, Some(64 << 20));
        assert!(plan.body.cmd.is_none(), "no command: the image's CMD runs");
    }

    /// Docker's json-file buffer: 3 files of the task's log file size within 10..=64
    /// MB, whatever the task's own log limits (1 file of 1024 MB kept 3 GB per
    /// container in Docker before).
    #[test]
    fn dockers_log_buffer_is_bounded_on_its_own_terms() {
        let dir = tempfile::tempdir().unwrap();
        for ((files, size), want) in [
            ((1, 1024), "64m"),
            ((10, 10), "10m"),
            ((2, 1), "10m"),
            ((3, 32), "32m"),
        ] {
            let mut s = spec(dir.path());
            s.logs = drover_plugin_sdk::LogConfig::new(files, size);
            let plan = parse(r#"{"image":"x"}"#).plan(&s, &policy()).unwrap();
            let log = plan.body.host_config.unwrap().log_config.unwrap();
            assert_eq!(log.typ.as_deref(), Some("json-file"));
            let config = log.config.unwrap();
            assert_eq!(config["max-size"], want, "task logs {files} × {size} MB");
            assert_eq!(config["max-file"], "3");
        }
    }

    #[test]
    fn policy_refusals_name_the_setting() {
        let p = policy();
        let m = err(r#"{"image":"x","privileged":true}"#, &p);
        assert!(
            m.contains("privileged") && m.contains("allow_privileged"),
            "{m}"
        );
        let m = err(r#"{"image":"x","cap_add":["SYS_ADMIN"]}"#, &p);
        assert!(m.contains("SYS_ADMIN") && m.contains("allow_caps"), "{m}");
        let m = err(r#"{"image":"x","volumes":["/etc:/host-etc"]}"#, &p);
        assert!(m.contains("/etc") && m.contains("volumes.enabled"), "{m}");
        let m = err(r#"{"image":"x","volumes":["data:/data"]}"#, &p);
        assert!(m.contains("named volume"), "{m}");
        let m = err(
            r#"{"image":"x","mounts":[{"type":"volume","source":"v","target":"/v"}]}"#,
            &p,
        );
        assert!(m.contains("volumes.enabled"), "{m}");
        let m = err(r#"{"image":"x","volumes":["../up:/up"]}"#, &p);
        assert!(m.contains(".."), "{m}");
        let m = err(r#"{"image":"x","labels":{"drover.task_id":"other"}}"#, &p);
        assert!(m.contains("reserved"), "{m}");
        let m = err(r#"{"image":"x","ports":{"http":80}}"#, &p);
        assert!(m.contains("http"), "{m}");
        let m = err(r#"{"image":"x","ports":{"80":"localhost"}}"#, &p);
        assert!(m.contains("localhost"), "{m}");
        let m = err(r#"{"image":"x","load":"/tmp/image.tar"}"#, &p);
        assert!(m.contains("load"), "{m}");
        let m = err(r#"{"image":" "}"#, &p);
        assert!(m.contains("image"), "{m}");

        let mut open = policy();
        open.config.allow_privileged = true;
        open.config.volumes.enabled = true;
        open.config.allow_caps = vec!["all".into()];
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cfg")).unwrap();
        let plan = parse(
            r#"{"image":"x","privileged":true,"cap_add":["SYS_ADMIN"],
                "volumes":["/etc:/host-etc:ro","data/sub:/data"],
                "mounts":[{"type":"tmpfs","target":"/scratch"},{"source":"cfg","target":"/cfg","readonly":true}]}"#,
        )
        .plan(&spec(dir.path()), &open)
        .unwrap();
        let h = plan.body.host_config.unwrap();
        assert_eq!(h.privileged, Some(true));
        let binds = h.binds.unwrap();
        assert!(binds.contains(&"/etc:/host-etc:ro".to_owned()), "{binds:?}");
        assert!(
            binds.contains(&format!("{}/data/sub:/data", dir.path().display())),
            "{binds:?}"
        );
        let mounts = h.mounts.unwrap();
        assert_eq!(mounts[0].typ, Some(MountType::TMPFS));
        assert_eq!(
            mounts[1].source.as_deref(),
            Some(format!("{}/cfg", dir.path().display()).as_str())
        );
        assert_eq!(mounts[1].read_only, Some(true));
    }

    /// Every option that shares something of the host, or of another container, is
    /// refused by default with the option and the setting named; the setting lets it
    /// through to the container unchanged.
    #[test]
    fn host_modes_are_refused_unless_the_plugin_config_allows_them() {
        let p = policy();
        let cases: &[(&str, &[&str])] = &[
            (
                r#""network_mode":"host""#,
                &[
                    "network_mode",
                    "\"host\"",
                    "allow_host_namespaces",
                    "\"network\"",
                ],
            ),
            (r#""network_mode":" HOST ""#, &["allow_host_namespaces"]),
            (
                r#""network_mode":"container:db""#,
                &["network_mode", "container:db", "allow_container_namespaces"],
            ),
            (
                r#""pid_mode":"host""#,
                &["pid_mode", "\"pid\"", "allow_host_namespaces"],
            ),
            (
                r#""pid_mode":"container:db""#,
                &["pid_mode", "allow_container_namespaces"],
            ),
            (
                r#""ipc_mode":"host""#,
                &["ipc_mode", "\"ipc\"", "allow_host_namespaces"],
            ),
            (
                r#""ipc_mode":"container:db""#,
                &["ipc_mode", "allow_container_namespaces"],
            ),
            (
                r#""uts_mode":"host""#,
                &["uts_mode", "\"uts\"", "allow_host_namespaces"],
            ),
            (
                r#""userns_mode":"host""#,
                &["userns_mode", "\"userns\"", "allow_host_namespaces"],
            ),
            (
                r#""devices":[{"host_path":"/dev/sda"}]"#,
                &["devices", "/dev/sda", "allow_devices"],
            ),
            (
                r#""security_opt":["seccomp=unconfined"]"#,
                &["security_opt", "seccomp=unconfined", "allow_security_opt"],
            ),
            (
                r#""security_opt":["no-new-privileges","apparmor=unconfined"]"#,
                &["apparmor=unconfined", "allow_security_opt"],
            ),
            (
                r#""security_opt":["no-new-privileges:false"]"#,
                &["allow_security_opt"],
            ),
            (
                r#""sysctl":{"net.ipv4.ip_forward":"1"}"#,
                &["sysctl", "net.ipv4.ip_forward", "allow_sysctl"],
            ),
            (r#""cap_add":["NET_ADMIN"]"#, &["NET_ADMIN", "allow_caps"]),
            (r#""privileged":true"#, &["privileged", "allow_privileged"]),
        ];
        for (field, words) in cases {
            let m = err(&format!(r#"{{"image":"x",{field}}}"#), &p);
            for w in *words {
                assert!(m.contains(w), "{field}: {w:?} missing from: {m}");
            }
        }
        // Values that are no mode at all are refused as such, whatever the policy.
        let m = err(r#"{"image":"x","uts_mode":"container:db"}"#, &p);
        assert!(m.contains("uts_mode") && m.contains("not one of"), "{m}");
        let m = err(r#"{"image":"x","pid_mode":"private"}"#, &p);
        assert!(m.contains("pid_mode") && m.contains("not one of"), "{m}");
        let m = err(r#"{"image":"x","network_mode":"container:"}"#, &p);
        assert!(m.contains("names no container"), "{m}");

        // What stays allowed by default: the container's own namespaces, named
        // networks, and security options that only tighten.
        let dir = tempfile::tempdir().unwrap();
        let plan = parse(
            r#"{"image":"x","network_mode":"none","ipc_mode":"shareable","pid_mode":"",
                "security_opt":["no-new-privileges"]}"#,
        )
        .plan(&spec(dir.path()), &p)
        .unwrap();
        let h = plan.body.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.ipc_mode.as_deref(), Some("shareable"));
        assert_eq!(h.security_opt.unwrap(), ["no-new-privileges"]);
        assert_eq!((h.devices, h.sysctls, h.uts_mode), (None, None, None));

        let mut open = policy();
        open.config.allow_host_namespaces = vec![
            HostNamespace::Network,
            HostNamespace::Pid,
            HostNamespace::Ipc,
            HostNamespace::Uts,
            HostNamespace::Userns,
        ];
        open.config.allow_container_namespaces = true;
        open.config.allow_devices = true;
        open.config.allow_security_opt = true;
        open.config.allow_sysctl = true;
        let plan = parse(
            r#"{"image":"x","network_mode":"host","pid_mode":"host","ipc_mode":"host",
                "uts_mode":"host","userns_mode":"host",
                "devices":[{"host_path":"/dev/fuse"},
                           {"host_path":"/dev/sdb","container_path":"/dev/xvdb","cgroup_permissions":"r"}],
                "security_opt":["seccomp=unconfined"],"sysctl":{"net.core.somaxconn":"1024"}}"#,
        )
        .plan(&spec(dir.path()), &open)
        .unwrap();
        let h = plan.body.host_config.unwrap();
        let modes = [
            h.network_mode,
            h.pid_mode,
            h.ipc_mode,
            h.uts_mode,
            h.userns_mode,
        ];
        assert!(
            modes.iter().all(|m| m.as_deref() == Some("host")),
            "{modes:?}"
        );
        let devices = h.devices.unwrap();
        assert_eq!(devices[0].path_in_container.as_deref(), Some("/dev/fuse"));
        assert_eq!(devices[0].cgroup_permissions.as_deref(), Some("rwm"));
        assert_eq!(devices[1].path_on_host.as_deref(), Some("/dev/sdb"));
        assert_eq!(devices[1].path_in_container.as_deref(), Some("/dev/xvdb"));
        assert_eq!(h.security_opt.unwrap(), ["seccomp=unconfined"]);
        assert_eq!(h.sysctls.unwrap()["net.core.somaxconn"], "1024");
        let plan =
            parse(r#"{"image":"x","network_mode":"container:db","pid_mode":"container:db"}"#)
                .plan(&spec(dir.path()), &open)
                .unwrap();
        let h = plan.body.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("container:db"));
        assert_eq!(h.pid_mode.as_deref(), Some("container:db"));
        // Only the namespaces listed: the network alone does not open the pid namespace.
        let mut net_only = policy();
        net_only.config.allow_host_namespaces = vec![HostNamespace::Network];
        let m = err(
            r#"{"image":"x","network_mode":"host","pid_mode":"host"}"#,
            &net_only,
        );
        assert!(m.contains("pid_mode"), "{m}");
        let m = err(
            r#"{"image":"x","devices":[{"host_path":"/dev/fuse","cgroup_permissions":"rx"}]}"#,
            &open,
        );
        assert!(m.contains("cgroup_permissions"), "{m}");
    }

    #[test]
    fn relative_sources_stay_in_the_task_dir_even_with_volumes_disabled() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("local")).unwrap();
        std::fs::write(dir.path().join("local/img.tar"), "tar").unwrap();
        let plan = parse(r#"{"image":"x","volumes":["./data:/data"],"load":"local/img.tar"}"#)
            .plan(&spec(dir.path()), &policy())
            .unwrap();
        let binds = plan.body.host_config.unwrap().binds.unwrap();
        // The local/ of the layout, then the volume: made as Docker would, and given to
        // Docker as the path that was checked.
        assert_eq!(binds[1..], [format!("{}/data:/data", dir.path().display())]);
        assert!(dir.path().join("data").is_dir());
        assert_eq!(plan.load.unwrap().0, dir.path().join("local/img.tar"));
    }

    /// `logs/` (or the task directory holding it) is never mounted writable; links in
    /// any component of a relative source are refused, not followed, also when a
    /// previous incarnation planted them; the tarball to load is never read through one.
    #[test]
    fn task_dir_sources_refuse_writable_logs_and_links() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let task = dir.path().join("task");
        for sub in ["local", "secrets", "logs"] {
            std::fs::create_dir_all(task.join(sub)).unwrap();
        }
        let s = spec(&task);
        let p = policy();
        for cfg in [
            r#"{"image":"x","mounts":[{"type":"bind","source":"logs","target":"/hl"}]}"#,
            r#"{"image":"x","mounts":[{"source":"./logs/","target":"/hl"}]}"#,
            r#"{"image":"x","mounts":[{"source":".","target":"/t"}]}"#,
            r#"{"image":"x","volumes":["./logs:/hl"]}"#,
            r#"{"image":"x","volumes":["logs/sub:/hl:z"]}"#,
            r#"{"image":"x","volumes":["./:/t:rw"]}"#,
        ] {
            let m = parse(cfg).plan(&s, &p).unwrap_err().to_string();
            assert!(m.contains("logs/") && m.contains("read-only"), "{cfg}: {m}");
        }
        // Read-only, they are allowed.
        for cfg in [
            r#"{"image":"x","mounts":[{"source":"logs","target":"/hl","readonly":true}]}"#,
            r#"{"image":"x","volumes":["./logs:/hl:ro","./:/t:ro,z"]}"#,
        ] {
            parse(cfg).plan(&s, &p).unwrap();
        }

        // A previous incarnation replaced local/data with a link to a host directory.
        let host = dir.path().join("host");
        std::fs::create_dir(&host).unwrap();
        symlink(&host, task.join("local/data")).unwrap();
        for cfg in [
            r#"{"image":"x","volumes":["local/data:/data"]}"#,
            r#"{"image":"x","volumes":["local/data/sub:/data"]}"#,
            r#"{"image":"x","mounts":[{"source":"local/data","target":"/data"}]}"#,
            r#"{"image":"x","load":"local/data"}"#,
        ] {
            let m = parse(cfg).plan(&s, &p).unwrap_err().to_string();
            assert!(
                m.contains("symbolic link") && m.contains("local/data"),
                "{cfg}: {m}"
            );
        }
        assert!(!host.join("sub").exists(), "nothing made through the link");
        std::fs::write(host.join("img.tar"), "tar").unwrap();
        symlink(host.join("img.tar"), task.join("local/img.tar")).unwrap();
        let m = parse(r#"{"image":"x","load":"local/img.tar"}"#)
            .plan(&s, &p)
            .unwrap_err()
            .to_string();
        assert!(m.contains("symbolic link"), "{m}");
        std::fs::remove_file(task.join("local/img.tar")).unwrap();
        std::fs::hard_link(host.join("img.tar"), task.join("local/img.tar")).unwrap();
        for cfg in [
            r#"{"image":"x","load":"local/img.tar"}"#,
            r#"{"image":"x","volumes":["local/img.tar:/img.tar"]}"#,
        ] {
            let m = parse(cfg).plan(&s, &p).unwrap_err().to_string();
            assert!(m.contains("2 hard links"), "{cfg}: {m}");
        }
        // The layout's own secrets/ replaced by a link: refused, not mounted.
        std::fs::remove_dir_all(task.join("secrets")).unwrap();
        symlink(&host, task.join("secrets")).unwrap();
        let m = parse(r#"{"image":"x"}"#)
            .plan(&s, &p)
            .unwrap_err()
            .to_string();
        assert!(m.contains("secrets") && m.contains("symbolic link"), "{m}");
    }

    #[test]
    fn container_names() {
        let mut s = TaskSpec::new("abc").with_name("my app/v2");
        assert_eq!(container_name(&s), "myappv2-abc");
        s.name = "_x".into();
        assert_eq!(container_name(&s), "drover-abc");
        s.name = String::new();
        assert_eq!(container_name(&s), "drover-abc");
    }

    #[test]
    fn a_device_reservation_becomes_devices_and_binds() {
        let d =
            drover_plugin_sdk::TaskDevice::new("/srv/n/zero0", "/dev/zero0").with_permissions("rw");
        let all = reserved_devices(None, &[d]).unwrap().unwrap();
        assert_eq!(all[0].path_on_host.as_deref(), Some("/srv/n/zero0"));
        assert_eq!(all[0].path_in_container.as_deref(), Some("/dev/zero0"));
        assert_eq!(all[0].cgroup_permissions.as_deref(), Some("rw"));
        assert_eq!(reserved_devices(None, &[]).unwrap(), None);
        let bad = drover_plugin_sdk::TaskDevice::new("/srv/n/zero0", "/dev/a:b");
        assert!(reserved_devices(None, &[bad]).is_err());
        let bad =
            drover_plugin_sdk::TaskDevice::new("/srv/n/zero0", "/dev/z").with_permissions("x");
        assert!(reserved_devices(None, &[bad]).is_err());
        let m = drover_plugin_sdk::TaskMount::new("/opt/lib", "/usr/lib/acme").with_read_only(true);
        assert_eq!(device_mount_bind(&m).unwrap(), "/opt/lib:/usr/lib/acme:ro");
        let m = drover_plugin_sdk::TaskMount::new("/opt/lib", "/usr/../etc");
        assert!(device_mount_bind(&m).is_err());
    }
}
