//! Device plugins (issue 27): the device groups a plugin fingerprints, what it
//! answers when instances are reserved for a task, and the [`DevicePlugin`] trait a
//! plugin author implements and serves with [`crate::server::serve_device`].
//!
//! A host reads any device plugin through `client::PluginClient::device_fingerprint`
//! and `client::PluginClient::reserve_devices` (feature `launcher`). On the wire a
//! device plugin on this SDK speaks Nomad's device protocol
//! (`hashicorp.nomad.plugins.device.DevicePlugin`, base plugin type `device`, app
//! protocol 2), so the same binary loads in a Drover agent and in a Nomad agent.
//!
//! ```no_run
//! use drover_plugin_sdk::device::*;
//! use drover_plugin_sdk::{DriverError, EmptyConfig, PluginInfo};
//!
//! /// One always-healthy `example/null/dev` instance whose reservation is `/dev/null`.
//! struct NullDevice;
//!
//! impl DevicePlugin for NullDevice {
//!     type Config = EmptyConfig;
//!     fn info(&self) -> PluginInfo { PluginInfo::new("null-device", "0.1.0") }
//!     async fn fingerprint(&self) -> Result<Vec<DeviceGroup>, DriverError> {
//!         Ok(vec![DeviceGroup::new("example", "null", "dev")
//!             .with_instances([DeviceInstance::healthy("null0")])])
//!     }
//!     async fn reserve(&self, ids: Vec<String>) -> Result<Reservation, DriverError> {
//!         if ids != ["null0"] {
//!             return Err(DriverError::NotFound(format!("no instances {ids:?}")));
//!         }
//!         Ok(Reservation::default().with_device(DeviceNode::new("/dev/null", "/dev/null", "rw")))
//!     }
//! }
//!
//! fn main() { drover_plugin_sdk::server::serve_device(NullDevice) }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::DriverError;
use crate::types::{AgentInfo, PluginInfo};

/// A device plugin: what a plugin author implements, and [`crate::server::serve_device`]
/// serves. The SDK calls [`DevicePlugin::fingerprint`] when the host opens its
/// `Fingerprint` stream and then every [`DevicePlugin::fingerprint_interval`], and
/// sends the groups whenever they changed; [`DevicePlugin::reserve`] when a task that
/// was given instances is about to start.
///
/// ```
/// use drover_plugin_sdk::device::*;
/// use drover_plugin_sdk::{DriverError, EmptyConfig, PluginInfo};
///
/// struct Two;
/// impl DevicePlugin for Two {
///     type Config = EmptyConfig;
///     fn info(&self) -> PluginInfo { PluginInfo::new("two", "1.0.0") }
///     async fn fingerprint(&self) -> Result<Vec<DeviceGroup>, DriverError> {
///         Ok(vec![DeviceGroup::new("acme", "fpga", "x1")
///             .with_instances([DeviceInstance::healthy("a"), DeviceInstance::healthy("b")])
///             .with_attribute("memory", "4 GiB")])
///     }
///     async fn reserve(&self, ids: Vec<String>) -> Result<Reservation, DriverError> {
///         Ok(Reservation::default().with_env("ACME_FPGAS", ids.join(",")))
///     }
/// }
/// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// let r = Two.reserve(vec!["a".into()]).await.unwrap();
/// assert_eq!(r.envs["ACME_FPGAS"], "a");
/// assert!(Two.stats().await.unwrap().is_empty());
/// # });
/// ```
pub trait DevicePlugin: Send + Sync + 'static {
    /// Plugin-level configuration (`[plugin.NAME] config = {...}` in the agent config,
    /// checked against its JSON Schema). Use [`crate::EmptyConfig`] when there is none.
    type Config: DeserializeOwned + JsonSchema + Send;

    /// Name and version of the plugin (the name is what `[plugin.NAME]` says).
    fn info(&self) -> PluginInfo;

    /// Receive the plugin configuration, once, before the host opens the fingerprint
    /// stream. The default accepts it and does nothing.
    fn set_config(
        &self,
        config: Self::Config,
        agent: AgentInfo,
    ) -> impl Future<Output = Result<(), DriverError>> + Send {
        let _ = (config, agent);
        async { Ok(()) }
    }

    /// Every device group the plugin has now, each with all its instances (a group or
    /// instance left out is gone). An error ends the host's stream; it opens a new one.
    fn fingerprint(&self) -> impl Future<Output = Result<Vec<DeviceGroup>, DriverError>> + Send;

    /// How often to fingerprint again. Default 5 s.
    fn fingerprint_interval(&self) -> Duration {
        Duration::from_secs(5)
    }

    /// What a task given the instances `device_ids` (of one group) needs: environment,
    /// mounts and device nodes. Refuse ids the plugin does not have.
    fn reserve(
        &self,
        device_ids: Vec<String>,
    ) -> impl Future<Output = Result<Reservation, DriverError>> + Send;

    /// Usage of the instances now, sent on the host's `Stats` stream at the interval
    /// it asks for. The default has none.
    fn stats(&self) -> impl Future<Output = Result<Vec<DeviceStats>, DriverError>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// One instance's usage, for [`DevicePlugin::stats`].
///
/// ```
/// let s = drover_plugin_sdk::device::DeviceStats::new("acme", "fpga", "x1", "a", 42.0, "%");
/// assert_eq!((s.instance.as_str(), s.value, s.unit.as_str()), ("a", 42.0, "%"));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceStats {
    /// The group's vendor.
    pub vendor: String,
    /// The group's type.
    pub device_type: String,
    /// The group's name.
    pub name: String,
    /// The instance's id.
    pub instance: String,
    /// Its summary value (e.g. utilisation).
    pub value: f64,
    /// Unit of [`DeviceStats::value`].
    pub unit: String,
}

impl DeviceStats {
    /// `value` `unit` for instance `instance` of group `vendor/device_type/name`.
    pub fn new(
        vendor: impl Into<String>,
        device_type: impl Into<String>,
        name: impl Into<String>,
        instance: impl Into<String>,
        value: f64,
        unit: impl Into<String>,
    ) -> Self {
        DeviceStats {
            vendor: vendor.into(),
            device_type: device_type.into(),
            name: name.into(),
            instance: instance.into(),
            value,
            unit: unit.into(),
        }
    }
}

/// Instances that share a vendor, a type and a name.
///
/// ```
/// use drover_plugin_sdk::device::{DeviceGroup, DeviceInstance};
/// let g = DeviceGroup::new("nvidia", "gpu", "1080ti")
///     .with_instances([DeviceInstance::healthy("GPU-1"), DeviceInstance::unhealthy("GPU-2", "too hot")])
///     .with_attribute("memory", "11 GiB");
/// assert_eq!(g.instances.len(), 2);
/// assert_eq!(g.attributes["memory"], "11 GiB");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceGroup {
    /// Vendor, e.g. `nvidia`.
    pub vendor: String,
    /// Type, e.g. `gpu`.
    pub device_type: String,
    /// Name, e.g. `1080ti`.
    pub name: String,
    /// The instances.
    pub instances: Vec<DeviceInstance>,
    /// Attributes, as text (a number with its unit: `11 GiB`).
    pub attributes: BTreeMap<String, String>,
}

/// One instance of a device group.
///
/// ```
/// let i = drover_plugin_sdk::device::DeviceInstance::unhealthy("d0", "unplugged");
/// assert!(!i.healthy);
/// assert_eq!(i.health_description, "unplugged");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceInstance {
    /// Its id, stable across plugin restarts.
    pub id: String,
    /// Whether it may be given to a task.
    pub healthy: bool,
    /// Why not, for people.
    pub health_description: String,
}

/// What a task needs to use the instances reserved for it.
///
/// ```
/// use drover_plugin_sdk::device::{DeviceMount, DeviceNode, Reservation};
/// let r = Reservation::default()
///     .with_env("ACME_DEVICES", "a,b")
///     .with_mount(DeviceMount::new("/usr/lib/acme", "/usr/lib/acme", true))
///     .with_device(DeviceNode::new("/dev/acme0", "/dev/acme0", "rw"));
/// assert_eq!((r.envs.len(), r.mounts.len(), r.devices.len()), (1, 1, 1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reservation {
    /// Environment variables for the task.
    pub envs: BTreeMap<String, String>,
    /// Host paths to mount into the task.
    pub mounts: Vec<DeviceMount>,
    /// Device nodes to give the task.
    pub devices: Vec<DeviceNode>,
}

/// A host path mounted into a task.
///
/// ```
/// let m = drover_plugin_sdk::device::DeviceMount::new("/opt/lib", "/usr/lib/x", true);
/// assert!(m.read_only);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceMount {
    /// Path inside the task.
    pub task_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A device node given to a task.
///
/// ```
/// let d = drover_plugin_sdk::device::DeviceNode::new("/dev/kvm", "/dev/kvm", "rw");
/// assert_eq!(d.permissions, "rw");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceNode {
    /// Path inside the task.
    pub task_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions: some of `r`, `w`, `m`.
    pub permissions: String,
}

impl DeviceGroup {
    /// An empty group `vendor/device_type/name`.
    pub fn new(
        vendor: impl Into<String>,
        device_type: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        DeviceGroup {
            vendor: vendor.into(),
            device_type: device_type.into(),
            name: name.into(),
            ..Default::default()
        }
    }
    /// With these instances.
    pub fn with_instances(mut self, instances: impl IntoIterator<Item = DeviceInstance>) -> Self {
        self.instances = instances.into_iter().collect();
        self
    }
    /// With attribute `key` = `value` (a number may carry its unit after a space:
    /// `11 GiB`, `1500 MHz`).
    pub fn with_attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(key.into(), value.into());
        self
    }
}

impl DeviceInstance {
    /// A healthy instance `id`.
    pub fn healthy(id: impl Into<String>) -> Self {
        DeviceInstance {
            id: id.into(),
            healthy: true,
            health_description: String::new(),
        }
    }
    /// An unhealthy instance `id`, and why.
    pub fn unhealthy(id: impl Into<String>, why: impl Into<String>) -> Self {
        DeviceInstance {
            id: id.into(),
            healthy: false,
            health_description: why.into(),
        }
    }
}

impl Reservation {
    /// With variable `key` = `value` in the task's environment.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(key.into(), value.into());
        self
    }
    /// With `mount`.
    pub fn with_mount(mut self, mount: DeviceMount) -> Self {
        self.mounts.push(mount);
        self
    }
    /// With device node `device`.
    pub fn with_device(mut self, device: DeviceNode) -> Self {
        self.devices.push(device);
        self
    }
}

impl DeviceMount {
    /// `host_path` seen at `task_path`.
    pub fn new(
        host_path: impl Into<String>,
        task_path: impl Into<String>,
        read_only: bool,
    ) -> Self {
        DeviceMount {
            task_path: task_path.into(),
            host_path: host_path.into(),
            read_only,
        }
    }
}

impl DeviceNode {
    /// The node `host_path` seen at `task_path`, with cgroup `permissions` (some of
    /// `r`, `w`, `m`).
    pub fn new(
        host_path: impl Into<String>,
        task_path: impl Into<String>,
        permissions: impl Into<String>,
    ) -> Self {
        DeviceNode {
            task_path: task_path.into(),
            host_path: host_path.into(),
            permissions: permissions.into(),
        }
    }
}
