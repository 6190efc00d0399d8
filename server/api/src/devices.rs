//! Devices (Nomad's device plugins, issue 27): what a node offers, what a task asks for
//! and what it was given. A device plugin fingerprints **device groups** (a vendor,
//! a type and a name, e.g. `nvidia/gpu/1080ti`) of **instances** (one id each, with
//! their health); a task's `device "vendor/type/name" { count }` asks for `count`
//! healthy instances of a matching group, and the scheduler gives it instance ids no
//! other live allocation holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Constraint;

/// One device group a node offers (Nomad's `NodeDeviceResource`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDeviceGroup {
    /// Vendor, e.g. `nvidia`.
    pub vendor: String,
    /// Type, e.g. `gpu`.
    #[serde(rename = "type")]
    pub device_type: String,
    /// Name, e.g. `1080ti`.
    pub name: String,
    /// The instances.
    #[serde(default)]
    pub instances: Vec<NodeDeviceInstance>,
    /// Attributes (`memory = "11 GiB"`, ...), as the plugin states them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

impl NodeDeviceGroup {
    /// `vendor/type/name`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.vendor, self.device_type, self.name)
    }

    /// Does a request's name (`type`, `vendor/type` or `vendor/type/name`, Nomad's
    /// forms) name this group?
    pub fn matches(&self, requested: &str) -> bool {
        let parts: Vec<&str> = requested.split('/').collect();
        match parts.as_slice() {
            [t] => *t == self.device_type,
            [v, t] => *v == self.vendor && *t == self.device_type,
            [v, t, n] => *v == self.vendor && *t == self.device_type && *n == self.name,
            _ => false,
        }
    }
}

/// One instance of a device group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDeviceInstance {
    /// Its id, unique within the group (what the task is told it got).
    pub id: String,
    /// Whether it may be given to a task.
    pub healthy: bool,
    /// Why not, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_description: String,
}

/// A task's `device "NAME" { count, constraint }` (Nomad's `RequestedDevice`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRequest {
    /// `type`, `vendor/type` or `vendor/type/name`.
    pub name: String,
    /// Instances wanted (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Constraints on the group's attributes (`${device.attr.memory}`, ...).
    #[serde(default, rename = "constraint", alias = "constraints")]
    pub constraints: Vec<Constraint>,
}

fn one() -> u32 {
    1
}

/// Instances of one device group given to a task (Nomad's `AllocatedDeviceResource`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatedDevices {
    /// Vendor.
    pub vendor: String,
    /// Type.
    #[serde(rename = "type")]
    pub device_type: String,
    /// Name.
    pub name: String,
    /// The instance ids given.
    pub device_ids: Vec<String>,
}
