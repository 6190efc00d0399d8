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

/// Most device groups one device plugin may report, and one node.
pub const MAX_DEVICE_GROUPS: usize = 64;
/// Most instances in one device group.
pub const MAX_DEVICE_INSTANCES: usize = 1024;
/// Most attributes of one device group.
pub const MAX_DEVICE_ATTRIBUTES: usize = 64;
/// Longest vendor, type, name, instance id and attribute name, in bytes.
pub const MAX_DEVICE_NAME_BYTES: usize = 256;
/// Longest attribute value and health description, in bytes.
pub const MAX_DEVICE_TEXT_BYTES: usize = 1024;

/// Check device groups as a plugin or a node reports them: at most
/// [`MAX_DEVICE_GROUPS`] groups of at most [`MAX_DEVICE_INSTANCES`] instances and
/// [`MAX_DEVICE_ATTRIBUTES`] attributes, names and texts bounded; vendor, type and
/// name non-empty without `/` (a group is named `vendor/type/name`), instance ids
/// non-empty, unique in their group and without `/` or `,` (a task's ids are joined
/// with `,`). The error names the field: `devices[0].instances[2].id: ...`.
///
/// ```
/// use drover_server_api::{NodeDeviceGroup, NodeDeviceInstance, devices::check_device_groups};
/// let mut g = NodeDeviceGroup {
///     vendor: "nvidia".into(), device_type: "gpu".into(), name: "1080ti".into(),
///     instances: vec![NodeDeviceInstance { id: "GPU-1".into(), healthy: true, health_description: String::new() }],
///     attributes: Default::default(),
/// };
/// assert!(check_device_groups(std::slice::from_ref(&g)).is_ok());
/// g.instances[0].id = "a,b".into();
/// let e = check_device_groups(&[g]).unwrap_err();
/// assert!(e.starts_with("devices[0].instances[0].id"), "{e}");
/// ```
pub fn check_device_groups(groups: &[NodeDeviceGroup]) -> Result<(), String> {
    if groups.len() > MAX_DEVICE_GROUPS {
        return Err(format!(
            "devices: {} device groups, at most {MAX_DEVICE_GROUPS}",
            groups.len()
        ));
    }
    let name_ok = |s: &str, forbidden: &[char]| {
        !s.is_empty() && s.len() <= MAX_DEVICE_NAME_BYTES && !s.contains(forbidden)
    };
    for (i, g) in groups.iter().enumerate() {
        for (field, value) in [
            ("vendor", &g.vendor),
            ("type", &g.device_type),
            ("name", &g.name),
        ] {
            if !name_ok(value, &['/']) {
                return Err(format!(
                    "devices[{i}].{field}: {:?} must be 1 to {MAX_DEVICE_NAME_BYTES} bytes \
                     without '/'",
                    value.chars().take(64).collect::<String>()
                ));
            }
        }
        if g.instances.len() > MAX_DEVICE_INSTANCES {
            return Err(format!(
                "devices[{i}] ({}): {} instances, at most {MAX_DEVICE_INSTANCES}",
                g.id(),
                g.instances.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (j, inst) in g.instances.iter().enumerate() {
            if !name_ok(&inst.id, &['/', ',']) {
                return Err(format!(
                    "devices[{i}].instances[{j}].id: {:?} must be 1 to {MAX_DEVICE_NAME_BYTES} \
                     bytes without '/' or ','",
                    inst.id.chars().take(64).collect::<String>()
                ));
            }
            if !seen.insert(inst.id.as_str()) {
                return Err(format!(
                    "devices[{i}].instances[{j}].id: {:?} is reported twice in {}",
                    inst.id,
                    g.id()
                ));
            }
            if inst.health_description.len() > MAX_DEVICE_TEXT_BYTES {
                return Err(format!(
                    "devices[{i}].instances[{j}].health_description: {} bytes, at most \
                     {MAX_DEVICE_TEXT_BYTES}",
                    inst.health_description.len()
                ));
            }
        }
        if g.attributes.len() > MAX_DEVICE_ATTRIBUTES {
            return Err(format!(
                "devices[{i}].attributes: {} attributes, at most {MAX_DEVICE_ATTRIBUTES}",
                g.attributes.len()
            ));
        }
        for (k, v) in &g.attributes {
            if k.is_empty() || k.len() > MAX_DEVICE_NAME_BYTES || v.len() > MAX_DEVICE_TEXT_BYTES {
                return Err(format!(
                    "devices[{i}].attributes: {:?}: names must be 1 to {MAX_DEVICE_NAME_BYTES} \
                     bytes and values at most {MAX_DEVICE_TEXT_BYTES}",
                    k.chars().take(64).collect::<String>()
                ));
            }
        }
    }
    Ok(())
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
