//! Devices (issue 27): which of a node's device instances an allocation gets.
//!
//! A task's `device "NAME" { count }` is served by one device group of the node whose
//! vendor/type/name matches `NAME` and whose attributes satisfy the request's
//! constraints, with `count` healthy instances that no live allocation on the node
//! holds. Groups are tried in `vendor/type/name` order and instances taken in id order,
//! so that the same state always gives the same ids. The plan applier checks again
//! that no instance is given twice.

use std::collections::{BTreeMap, HashSet};

use drover_server_api::validate::{DeviceTarget, device_target};
use drover_server_api::{AllocatedDevices, Allocation, DeviceRequest, Node, NodeDeviceGroup};

use super::feasible::{Compiled, holds_for};

/// What one allocation's tasks were given, by task name.
pub(crate) type TaskDevices = BTreeMap<String, Vec<AllocatedDevices>>;

/// The key of one instance on a node: `vendor/type/name` and the instance id.
pub(crate) fn instance_key(group: &str, id: &str) -> String {
    format!("{group}\u{0}{id}")
}

/// The instance keys an allocation holds.
pub(crate) fn held_by(a: &Allocation) -> impl Iterator<Item = String> + '_ {
    a.task_devices.values().flatten().flat_map(|d| {
        let group = format!("{}/{}/{}", d.vendor, d.device_type, d.name);
        d.device_ids.iter().map(move |id| instance_key(&group, id))
    })
}

/// The instances the live allocations among `allocs` hold.
pub(crate) fn held<'a>(allocs: impl IntoIterator<Item = &'a Allocation>) -> HashSet<String> {
    allocs
        .into_iter()
        .filter(|a| !a.is_terminal())
        .flat_map(held_by)
        .collect()
}

fn side<'g>(group: &'g NodeDeviceGroup, text: &'g str) -> Option<&'g str> {
    match device_target(text).ok()? {
        DeviceTarget::Vendor => Some(&group.vendor),
        DeviceTarget::Type => Some(&group.device_type),
        DeviceTarget::Model => Some(&group.name),
        DeviceTarget::Attribute(k) => group.attributes.get(k).map(String::as_str),
        DeviceTarget::Literal(t) => Some(t),
    }
}

/// Whether `group` is one `req` may be served by (name and constraints), whatever
/// its instances' health.
fn suits(group: &NodeDeviceGroup, req: &DeviceRequest, compiled: &mut Compiled) -> bool {
    group.matches(&req.name)
        && req.constraints.iter().all(|c| {
            holds_for(
                c.operator,
                side(group, &c.attribute),
                side(group, &c.value),
                compiled,
            )
        })
}

/// Whether `node` could ever serve `req`: a suitable group with at least `count`
/// instances, healthy or not (else the node is filtered, not exhausted).
pub(crate) fn could_serve(node: &Node, req: &DeviceRequest, compiled: &mut Compiled) -> bool {
    node.devices
        .iter()
        .any(|g| g.instances.len() >= req.count as usize && suits(g, req, compiled))
}

/// Why a node has too few free instances for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceShortage {
    /// The group that came closest (`vendor/type/name`), or the request's name.
    pub(crate) device: String,
    /// Its free healthy instances.
    pub(crate) free: usize,
    /// How many were asked for.
    pub(crate) wanted: u32,
}

impl DeviceShortage {
    /// The key of `PlacementFailure::nodes_exhausted`.
    pub(crate) fn key(&self) -> String {
        format!(
            "devices: device {}: {} of {} instances free",
            self.device, self.free, self.wanted
        )
    }
}

/// Instances for every request of `asks` (task name, request) on `node`, none of
/// which `used` says is held; or the first request that cannot be served.
pub(crate) fn assign(
    node: &Node,
    asks: &[(&str, &DeviceRequest)],
    used: impl Fn(&str) -> bool,
    compiled: &mut Compiled,
) -> Result<TaskDevices, DeviceShortage> {
    let mut out = TaskDevices::new();
    if asks.is_empty() {
        return Ok(out);
    }
    let mut groups: Vec<&NodeDeviceGroup> = node.devices.iter().collect();
    groups.sort_by_key(|g| g.id());
    // Taken by earlier requests of this same allocation.
    let mut taken: HashSet<String> = HashSet::new();
    for (task, req) in asks {
        let mut best: Option<DeviceShortage> = None;
        let mut served = false;
        for g in &groups {
            if !suits(g, req, compiled) {
                continue;
            }
            let gid = g.id();
            let mut ids: Vec<&str> = g
                .instances
                .iter()
                .filter(|i| i.healthy)
                .map(|i| i.id.as_str())
                .filter(|id| {
                    let k = instance_key(&gid, id);
                    !used(&k) && !taken.contains(&k)
                })
                .collect();
            ids.sort_unstable();
            if ids.len() >= req.count as usize {
                ids.truncate(req.count as usize);
                for id in &ids {
                    taken.insert(instance_key(&gid, id));
                }
                out.entry((*task).to_owned())
                    .or_default()
                    .push(AllocatedDevices {
                        vendor: g.vendor.clone(),
                        device_type: g.device_type.clone(),
                        name: g.name.clone(),
                        device_ids: ids.into_iter().map(str::to_owned).collect(),
                    });
                served = true;
                break;
            }
            if best.as_ref().is_none_or(|b| ids.len() > b.free) {
                best = Some(DeviceShortage {
                    device: gid,
                    free: ids.len(),
                    wanted: req.count,
                });
            }
        }
        if !served {
            return Err(best.unwrap_or_else(|| DeviceShortage {
                device: req.name.clone(),
                free: 0,
                wanted: req.count,
            }));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_server_api::{Constraint, ConstraintOperator, NodeDeviceInstance};

    fn node(instances: &[(&str, bool)]) -> Node {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "id": "n1", "name": "n1", "status": "ready", "drain": false,
            "attributes": {}, "meta": {}, "resources": {"cpu": 1000, "memory_mb": 1000},
            "drivers": {}, "status_updated_at": 0, "create_index": 1, "modify_index": 1
        }))
        .unwrap();
        n.devices = vec![NodeDeviceGroup {
            vendor: "nomad".into(),
            device_type: "file".into(),
            name: "mock".into(),
            instances: instances
                .iter()
                .map(|(id, healthy)| NodeDeviceInstance {
                    id: (*id).into(),
                    healthy: *healthy,
                    health_description: String::new(),
                })
                .collect(),
            attributes: [("size".to_owned(), "12".to_owned())].into(),
        }];
        n
    }

    fn req(name: &str, count: u32) -> DeviceRequest {
        DeviceRequest {
            name: name.into(),
            count,
            constraints: Vec::new(),
        }
    }

    #[test]
    fn picks_free_healthy_instances_in_id_order() {
        let n = node(&[("c", true), ("a", true), ("b", false), ("d", true)]);
        let r = req("nomad/file", 2);
        let mut compiled = Compiled::default();
        let held = instance_key("nomad/file/mock", "a");
        let got = assign(&n, &[("t", &r)], |k| k == held, &mut compiled).unwrap();
        assert_eq!(got["t"][0].device_ids, ["c", "d"]);
        assert_eq!(got["t"][0].name, "mock");
        // Two requests of one allocation never share an instance.
        let r1 = req("file", 1);
        let got = assign(&n, &[("t", &r1), ("u", &r1)], |_| false, &mut compiled).unwrap();
        assert_eq!(got["t"][0].device_ids, ["a"]);
        assert_eq!(got["u"][0].device_ids, ["c"]);
    }

    #[test]
    fn a_shortage_says_how_many_are_free() {
        let n = node(&[("a", true), ("b", true), ("c", false)]);
        let r = req("nomad/file/mock", 2);
        let mut compiled = Compiled::default();
        let held = instance_key("nomad/file/mock", "a");
        let e = assign(&n, &[("t", &r)], |k| k == held, &mut compiled).unwrap_err();
        assert_eq!(
            e.key(),
            "devices: device nomad/file/mock: 1 of 2 instances free"
        );
        assert!(could_serve(&n, &r, &mut compiled));
        assert!(!could_serve(&n, &req("nvidia/gpu", 1), &mut compiled));
        assert!(!could_serve(&n, &req("file", 4), &mut compiled));
    }

    #[test]
    fn constraints_read_the_group() {
        let n = node(&[("a", true)]);
        let mut compiled = Compiled::default();
        let mut r = req("file", 1);
        r.constraints.push(Constraint {
            attribute: "${device.attr.size}".into(),
            operator: ConstraintOperator::Greater,
            value: "10".into(),
        });
        assert!(could_serve(&n, &r, &mut compiled));
        r.constraints.push(Constraint {
            attribute: "${device.vendor}".into(),
            operator: ConstraintOperator::Equal,
            value: "nvidia".into(),
        });
        assert!(!could_serve(&n, &r, &mut compiled));
    }
}
