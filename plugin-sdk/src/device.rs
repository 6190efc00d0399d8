//! Device plugins as a host sees them (issue 27): the device groups a plugin
//! fingerprints and what it answers when instances are reserved for a task. Nomad's
//! device plugins (`hashicorp.nomad.plugins.device.DevicePlugin`) are read into these
//! through [`crate::client::PluginClient::device_fingerprint`] and
//! [`crate::client::PluginClient::reserve_devices`].

use std::collections::BTreeMap;

/// Instances that share a vendor, a type and a name.
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceNode {
    /// Path inside the task.
    pub task_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions: some of `r`, `w`, `m`.
    pub permissions: String,
}
