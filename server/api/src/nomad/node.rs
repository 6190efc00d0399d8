//! Nodes as Nomad's API carries them (`api/nodes.go`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    GO_ZERO_TIME, NetworkResource, Resources, node_network, parse_reserved_ports,
    reserved_ports_text,
};
use crate::types::{self as internal, NodeStatus};

/// A driver's fingerprint on a node, in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DriverInfo {
    /// `driver.<name>.<key>` attributes.
    #[serde(rename = "Attributes")]
    pub attributes: Option<BTreeMap<String, String>>,
    /// Found and answering.
    #[serde(rename = "Detected")]
    pub detected: bool,
    /// Can run tasks now.
    #[serde(rename = "Healthy")]
    pub healthy: bool,
    /// Why not, or `Healthy`.
    #[serde(rename = "HealthDescription", deserialize_with = "super::null_default")]
    pub health_description: String,
    /// RFC 3339 of the last fingerprint (Drover does not keep it: Go's zero time).
    #[serde(rename = "UpdateTime", deserialize_with = "super::null_default")]
    pub update_time: String,
}

/// CPU a node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeCpuResources {
    /// MHz in total.
    #[serde(rename = "CpuShares")]
    pub cpu_shares: i64,
}

/// Memory a node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeMemoryResources {
    /// MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: i64,
}

/// Disk a node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeDiskResources {
    /// MiB (Drover does not account disk: 0).
    #[serde(rename = "DiskMB")]
    pub disk_mb: i64,
}

/// What a node offers, in Nomad's newer shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeResources {
    /// CPU.
    #[serde(rename = "Cpu")]
    pub cpu: NodeCpuResources,
    /// Memory.
    #[serde(rename = "Memory")]
    pub memory: NodeMemoryResources,
    /// Disk.
    #[serde(rename = "Disk")]
    pub disk: NodeDiskResources,
    /// The node's network: the address allocations' ports are on (`Mode` `host`).
    #[serde(rename = "Networks")]
    pub networks: Option<Vec<NetworkResource>>,
    /// Device groups the node's device plugins fingerprinted.
    #[serde(rename = "Devices")]
    pub devices: Option<Vec<NodeDeviceResource>>,
    /// Lowest port the scheduler picks (Nomad 1.1's).
    #[serde(rename = "MinDynamicPort")]
    pub min_dynamic_port: i64,
    /// Highest port the scheduler picks (Nomad 1.1's).
    #[serde(rename = "MaxDynamicPort")]
    pub max_dynamic_port: i64,
}

/// One device group, in Nomad's shape (`NodeDeviceResource`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeDeviceResource {
    /// Vendor.
    #[serde(rename = "Vendor")]
    pub vendor: String,
    /// Type.
    #[serde(rename = "Type")]
    pub device_type: String,
    /// Name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Instances.
    #[serde(rename = "Instances")]
    pub instances: Option<Vec<NodeDevice>>,
    /// Attributes (Nomad's `{Float, Int, String, Bool, Unit}`; Drover sends text as
    /// `String`).
    #[serde(rename = "Attributes")]
    pub attributes: Option<BTreeMap<String, DeviceAttribute>>,
}

/// One device instance, in Nomad's shape (`NodeDevice`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeDevice {
    /// Its id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Whether it may be given to a task.
    #[serde(rename = "Healthy")]
    pub healthy: bool,
    /// Why not.
    #[serde(rename = "HealthDescription")]
    pub health_description: String,
    /// Hardware locality (never set by Drover).
    #[serde(rename = "Locality")]
    pub locality: Option<Value>,
}

/// A device attribute, in Nomad's shape (`psstructs.Attribute`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceAttribute {
    /// A float value.
    #[serde(rename = "Float", skip_serializing_if = "Option::is_none")]
    pub float: Option<f64>,
    /// An integer value.
    #[serde(rename = "Int", skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// A string value.
    #[serde(rename = "String", skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// A bool value.
    #[serde(rename = "Bool", skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// Unit of a number.
    #[serde(rename = "Unit")]
    pub unit: String,
}

impl DeviceAttribute {
    /// The attribute as text, with its unit (`11 GiB`).
    pub fn text(&self) -> Option<String> {
        let value = match (&self.string, self.int, self.float, self.bool) {
            (Some(s), ..) => return Some(s.clone()),
            (None, Some(i), ..) => i.to_string(),
            (None, None, Some(f), _) => f.to_string(),
            (None, None, None, Some(b)) => return Some(b.to_string()),
            (None, None, None, None) => return None,
        };
        Some(if self.unit.is_empty() {
            value
        } else {
            format!("{value} {}", self.unit)
        })
    }
}

fn wire_devices(groups: &[crate::NodeDeviceGroup]) -> Option<Vec<NodeDeviceResource>> {
    if groups.is_empty() {
        return None;
    }
    Some(
        groups
            .iter()
            .map(|g| NodeDeviceResource {
                vendor: g.vendor.clone(),
                device_type: g.device_type.clone(),
                name: g.name.clone(),
                instances: Some(
                    g.instances
                        .iter()
                        .map(|i| NodeDevice {
                            id: i.id.clone(),
                            healthy: i.healthy,
                            health_description: i.health_description.clone(),
                            locality: None,
                        })
                        .collect(),
                ),
                attributes: Some(
                    g.attributes
                        .iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                DeviceAttribute {
                                    string: Some(v.clone()),
                                    ..Default::default()
                                },
                            )
                        })
                        .collect(),
                ),
            })
            .collect(),
    )
}

fn internal_devices(resources: Option<&NodeResources>) -> Vec<crate::NodeDeviceGroup> {
    resources
        .and_then(|r| r.devices.as_ref())
        .into_iter()
        .flatten()
        .map(|g| crate::NodeDeviceGroup {
            vendor: g.vendor.clone(),
            device_type: g.device_type.clone(),
            name: g.name.clone(),
            instances: g
                .instances
                .iter()
                .flatten()
                .map(|i| crate::NodeDeviceInstance {
                    id: i.id.clone(),
                    healthy: i.healthy,
                    health_description: i.health_description.clone(),
                })
                .collect(),
            attributes: g
                .attributes
                .iter()
                .flatten()
                .filter_map(|(k, a)| Some((k.clone(), a.text()?)))
                .collect(),
        })
        .collect()
}

/// What a node keeps from allocations, in Nomad's shape (`ReservedResources`): Drover
/// reserves only ports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeReservedResources {
    /// CPU (none).
    #[serde(rename = "Cpu")]
    pub cpu: NodeCpuResources,
    /// Memory (none).
    #[serde(rename = "Memory")]
    pub memory: NodeMemoryResources,
    /// Disk (none).
    #[serde(rename = "Disk")]
    pub disk: NodeDiskResources,
    /// Ports.
    #[serde(rename = "Networks")]
    pub networks: NodeReservedNetworkResources,
}

/// A node's reserved ports in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeReservedNetworkResources {
    /// `22,80,8000-8100`.
    #[serde(rename = "ReservedHostPorts", deserialize_with = "super::null_default")]
    pub reserved_host_ports: String,
}

/// A drain in progress.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DrainStrategy {
    /// Nanoseconds the drain may take (Drover: 0, no deadline).
    #[serde(rename = "Deadline")]
    pub deadline: i64,
    /// Leave system jobs' allocations.
    #[serde(rename = "IgnoreSystemJobs")]
    pub ignore_system_jobs: bool,
    /// RFC 3339 of the deadline.
    #[serde(rename = "ForceDeadline", deserialize_with = "super::null_default")]
    pub force_deadline: String,
    /// RFC 3339 of the start.
    #[serde(rename = "StartedAt", deserialize_with = "super::null_default")]
    pub started_at: String,
}

/// A node in Nomad's shape (`GET /v1/node/:id`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    /// Stable id.
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// Datacenter.
    #[serde(rename = "Datacenter", deserialize_with = "super::null_default")]
    pub datacenter: String,
    /// Name.
    #[serde(rename = "Name", deserialize_with = "super::null_default")]
    pub name: String,
    /// Its agent's HTTP address (Drover's server does not know it: empty).
    #[serde(rename = "HTTPAddr", deserialize_with = "super::null_default")]
    pub http_addr: String,
    /// TLS on its HTTP address.
    #[serde(rename = "TLSEnabled")]
    pub tls_enabled: bool,
    /// Fingerprinted attributes.
    #[serde(rename = "Attributes")]
    pub attributes: Option<BTreeMap<String, String>>,
    /// Capacity, older shape (`CPU`, `MemoryMB`).
    #[serde(rename = "Resources")]
    pub resources: Option<Resources>,
    /// Reserved for the system (none in Drover).
    #[serde(rename = "Reserved")]
    pub reserved: Option<Resources>,
    /// Capacity.
    #[serde(rename = "NodeResources")]
    pub node_resources: Option<NodeResources>,
    /// Kept from allocations: the node's reserved ports.
    #[serde(rename = "ReservedResources")]
    pub reserved_resources: Option<NodeReservedResources>,
    /// Links (none in Drover).
    #[serde(rename = "Links")]
    pub links: Option<BTreeMap<String, String>>,
    /// Operator metadata.
    #[serde(rename = "Meta")]
    pub meta: Option<BTreeMap<String, String>>,
    /// Node class (none in Drover).
    #[serde(rename = "NodeClass", deserialize_with = "super::null_default")]
    pub node_class: String,
    /// Draining.
    #[serde(rename = "Drain")]
    pub drain: bool,
    /// The drain, while draining.
    #[serde(rename = "DrainStrategy")]
    pub drain_strategy: Option<DrainStrategy>,
    /// `eligible` or `ineligible`.
    #[serde(
        rename = "SchedulingEligibility",
        deserialize_with = "super::null_default"
    )]
    pub scheduling_eligibility: String,
    /// `initializing`, `ready`, `down`.
    #[serde(rename = "Status", deserialize_with = "super::null_default")]
    pub status: String,
    /// Why the status.
    #[serde(rename = "StatusDescription", deserialize_with = "super::null_default")]
    pub status_description: String,
    /// Seconds since the epoch of the last status change.
    #[serde(rename = "StatusUpdatedAt")]
    pub status_updated_at: i64,
    /// Node events (none in Drover).
    #[serde(rename = "Events")]
    pub events: Option<Vec<Value>>,
    /// Drivers by name.
    #[serde(rename = "Drivers")]
    pub drivers: Option<BTreeMap<String, DriverInfo>>,
    /// Host volumes of the agent's config, by name (Nomad's `HostVolumeInfo`).
    #[serde(rename = "HostVolumes")]
    pub host_volumes: Option<BTreeMap<String, HostVolumeInfo>>,
    /// The node's CSI controller plugins: `CSIInfo` by plugin id (null: none).
    #[serde(rename = "CSIControllerPlugins")]
    pub csi_controller_plugins: Option<Value>,
    /// The node's CSI node plugins: `CSIInfo` by plugin id (null: none).
    #[serde(rename = "CSINodePlugins")]
    pub csi_node_plugins: Option<Value>,
    /// Index of the first registration.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
    /// Drover: the status as Drover says it (`draining` where Nomad says `ready`
    /// with `Drain`).
    #[serde(rename = "DroverStatus", skip_serializing_if = "Option::is_none")]
    pub drover_status: Option<String>,
    /// Drover's own: the node was marked ineligible (apart from a drain, which makes
    /// it ineligible too), so that the mark survives a round trip.
    #[serde(
        rename = "DroverMarkedIneligible",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub drover_marked_ineligible: Option<bool>,
    /// Drover: `StatusUpdatedAt` in nanoseconds.
    #[serde(
        rename = "StatusUpdatedAtNanos",
        skip_serializing_if = "Option::is_none"
    )]
    pub status_updated_at_nanos: Option<i64>,
}

/// One line of `GET /v1/nodes`, in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeListStub {
    /// The node's IP address (Drover's server does not know it: empty).
    #[serde(rename = "Address", deserialize_with = "super::null_default")]
    pub address: String,
    /// Stable id.
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// Datacenter.
    #[serde(rename = "Datacenter", deserialize_with = "super::null_default")]
    pub datacenter: String,
    /// Name.
    #[serde(rename = "Name", deserialize_with = "super::null_default")]
    pub name: String,
    /// Node class (none in Drover).
    #[serde(rename = "NodeClass", deserialize_with = "super::null_default")]
    pub node_class: String,
    /// The agent's version (its `drover.version` attribute).
    #[serde(rename = "Version", deserialize_with = "super::null_default")]
    pub version: String,
    /// Draining.
    #[serde(rename = "Drain")]
    pub drain: bool,
    /// `eligible` or `ineligible`.
    #[serde(
        rename = "SchedulingEligibility",
        deserialize_with = "super::null_default"
    )]
    pub scheduling_eligibility: String,
    /// `initializing`, `ready`, `down`.
    #[serde(rename = "Status", deserialize_with = "super::null_default")]
    pub status: String,
    /// Why the status.
    #[serde(rename = "StatusDescription", deserialize_with = "super::null_default")]
    pub status_description: String,
    /// Drivers by name.
    #[serde(rename = "Drivers")]
    pub drivers: Option<BTreeMap<String, DriverInfo>>,
    /// Capacity (Nomad sends it with `?resources=true`; Drover always).
    #[serde(rename = "NodeResources", skip_serializing_if = "Option::is_none")]
    pub node_resources: Option<NodeResources>,
    /// Index of the first registration.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
    /// Drover: the status as Drover says it.
    #[serde(rename = "DroverStatus", skip_serializing_if = "Option::is_none")]
    pub drover_status: Option<String>,
    /// Drover's own: the node was marked ineligible (apart from a drain, which makes
    /// it ineligible too), so that the mark survives a round trip.
    #[serde(
        rename = "DroverMarkedIneligible",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub drover_marked_ineligible: Option<bool>,
}

/// `POST /v1/node/:id/drain`: Nomad's body. `DrainSpec` null ends a drain.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeDrainRequest {
    /// The node (Nomad repeats it in the body).
    #[serde(rename = "NodeID", alias = "node_id")]
    pub node_id: String,
    /// The drain; `null`: stop draining.
    #[serde(rename = "DrainSpec", alias = "drain_spec")]
    pub drain_spec: Option<DrainSpec>,
    /// Make the node eligible again when the drain ends (Nomad's default: true when
    /// stopping a drain from the CLI).
    #[serde(rename = "MarkEligible", alias = "mark_eligible")]
    pub mark_eligible: bool,
    /// Metadata (ignored).
    #[serde(rename = "Meta")]
    pub meta: Option<BTreeMap<String, String>>,
}

/// How a node drains.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DrainSpec {
    /// Nanoseconds the drain may take (Drover ignores it).
    #[serde(rename = "Deadline")]
    pub deadline: i64,
    /// Leave system jobs' allocations.
    #[serde(rename = "IgnoreSystemJobs")]
    pub ignore_system_jobs: bool,
}

/// Answer to `POST /v1/node/:id/drain` and `/eligibility`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeDrainUpdateResponse {
    /// Evaluations created.
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Option<Vec<String>>,
    /// Index they were created at.
    #[serde(rename = "EvalCreateIndex")]
    pub eval_create_index: u64,
    /// Index of the node's change.
    #[serde(rename = "NodeModifyIndex")]
    pub node_modify_index: u64,
    /// Index of the commit.
    #[serde(rename = "Index")]
    pub index: u64,
    /// Milliseconds since the leader was last heard.
    #[serde(rename = "LastContact")]
    pub last_contact: i64,
    /// A leader is known.
    #[serde(rename = "KnownLeader")]
    pub known_leader: bool,
}

/// Nomad's word for a Drover node status (`draining` is `ready` with `Drain`).
pub fn node_status(s: NodeStatus) -> &'static str {
    match s {
        NodeStatus::Initializing => "initializing",
        NodeStatus::Ready | NodeStatus::Draining => "ready",
        NodeStatus::Down => "down",
    }
}

fn eligibility(n: &internal::Node) -> &'static str {
    if n.ineligible || n.drain || n.status == NodeStatus::Draining {
        "ineligible"
    } else {
        "eligible"
    }
}

fn status_from(drover: Option<&str>, nomad: &str, drain: bool) -> NodeStatus {
    if let Some(s) = drover
        && let Ok(s) = serde_json::from_value::<NodeStatus>(Value::String(s.to_owned()))
    {
        return s;
    }
    match nomad {
        "ready" if drain => NodeStatus::Draining,
        "ready" => NodeStatus::Ready,
        "down" | "disconnected" => NodeStatus::Down,
        _ => NodeStatus::Initializing,
    }
}

fn drivers(d: &BTreeMap<String, internal::DriverInfo>) -> Option<BTreeMap<String, DriverInfo>> {
    Some(
        d.iter()
            .map(|(name, i)| {
                (
                    name.clone(),
                    DriverInfo {
                        attributes: Some(i.attributes.clone()),
                        detected: i.detected,
                        healthy: i.healthy,
                        health_description: i.health_description.clone(),
                        update_time: GO_ZERO_TIME.to_owned(),
                    },
                )
            })
            .collect(),
    )
}

fn internal_drivers(
    d: &Option<BTreeMap<String, DriverInfo>>,
) -> BTreeMap<String, internal::DriverInfo> {
    d.iter()
        .flatten()
        .map(|(name, i)| {
            (
                name.clone(),
                internal::DriverInfo {
                    detected: i.detected,
                    healthy: i.healthy,
                    health_description: i.health_description.clone(),
                    attributes: i.attributes.clone().unwrap_or_default(),
                },
            )
        })
        .collect()
}

fn node_resources(n: &internal::Node) -> NodeResources {
    NodeResources {
        cpu: NodeCpuResources {
            cpu_shares: i64::try_from(n.resources.cpu).unwrap_or(i64::MAX),
        },
        memory: NodeMemoryResources {
            memory_mb: i64::try_from(n.resources.memory_mb).unwrap_or(i64::MAX),
        },
        networks: Some(vec![node_network(&n.network)]),
        devices: wire_devices(&n.devices),
        min_dynamic_port: i64::from(n.network.min_dynamic_port),
        max_dynamic_port: i64::from(n.network.max_dynamic_port),
        ..Default::default()
    }
}

/// The node's network read back: its address from `NodeResources.Networks`, its port
/// range and reserved ports; what is missing keeps the defaults.
fn internal_network(
    resources: Option<&NodeResources>,
    reserved: Option<&NodeReservedResources>,
) -> internal::NodeNetwork {
    let mut out = internal::NodeNetwork::default();
    if let Some(r) = resources {
        if let Some(ip) = r
            .networks
            .iter()
            .flatten()
            .find_map(|n| n.ip.clone().filter(|ip| !ip.is_empty()))
        {
            out.address = ip;
        }
        if let Ok(p) = u16::try_from(r.min_dynamic_port)
            && p != 0
        {
            out.min_dynamic_port = p;
        }
        if let Ok(p) = u16::try_from(r.max_dynamic_port)
            && p != 0
        {
            out.max_dynamic_port = p;
        }
    }
    if let Some(ranges) =
        reserved.and_then(|r| parse_reserved_ports(&r.networks.reserved_host_ports))
    {
        out.reserved_ports = ranges;
    }
    out
}

/// A host volume of a node in Nomad's shape (`api.HostVolumeInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostVolumeInfo {
    /// The directory on the node.
    #[serde(rename = "Path", default)]
    pub path: String,
    /// Offered read-only.
    #[serde(rename = "ReadOnly", default)]
    pub read_only: bool,
}

impl From<&internal::Node> for Node {
    fn from(n: &internal::Node) -> Node {
        Node {
            id: n.id.clone(),
            datacenter: n.datacenter.clone(),
            name: n.name.clone(),
            http_addr: String::new(),
            tls_enabled: false,
            attributes: Some(n.attributes.clone()),
            resources: Some(Resources {
                cpu: Some(i64::try_from(n.resources.cpu).unwrap_or(i64::MAX)),
                memory_mb: Some(i64::try_from(n.resources.memory_mb).unwrap_or(i64::MAX)),
                ..Default::default()
            }),
            reserved: None,
            node_resources: Some(node_resources(n)),
            reserved_resources: Some(NodeReservedResources {
                networks: NodeReservedNetworkResources {
                    reserved_host_ports: reserved_ports_text(&n.network.reserved_ports),
                },
                ..Default::default()
            }),
            links: None,
            meta: Some(n.meta.clone()),
            node_class: String::new(),
            drain: n.drain,
            drain_strategy: n.drain.then(|| DrainStrategy {
                force_deadline: GO_ZERO_TIME.to_owned(),
                started_at: GO_ZERO_TIME.to_owned(),
                ..Default::default()
            }),
            scheduling_eligibility: eligibility(n).to_owned(),
            status: node_status(n.status).to_owned(),
            status_description: n.status_description.clone(),
            status_updated_at: n.status_updated_at.div_euclid(1_000_000_000),
            events: None,
            drivers: drivers(&n.drivers),
            // Nomad's is null for a node without host volumes.
            host_volumes: (!n.host_volumes.is_empty()).then(|| {
                n.host_volumes
                    .iter()
                    .map(|(name, v)| {
                        (
                            name.clone(),
                            HostVolumeInfo {
                                path: v.path.clone(),
                                read_only: v.read_only,
                            },
                        )
                    })
                    .collect()
            }),
            csi_controller_plugins: crate::csi::nomad_csi_maps(&n.csi_plugins).0,
            csi_node_plugins: crate::csi::nomad_csi_maps(&n.csi_plugins).1,
            create_index: n.create_index,
            modify_index: n.modify_index,
            drover_status: Some(n.status.as_str().to_owned()),
            drover_marked_ineligible: Some(n.ineligible),
            status_updated_at_nanos: Some(n.status_updated_at),
        }
    }
}

impl Node {
    /// The node as Drover keeps it (for clients that render internal types).
    pub fn to_internal(&self) -> internal::Node {
        let narrow = |v: i64| u64::try_from(v).unwrap_or(0);
        let resources = match (&self.node_resources, &self.resources) {
            (Some(r), _) => internal::NodeResources {
                cpu: narrow(r.cpu.cpu_shares),
                memory_mb: narrow(r.memory.memory_mb),
            },
            (None, Some(r)) => internal::NodeResources {
                cpu: narrow(r.cpu.unwrap_or(0)),
                memory_mb: narrow(r.memory_mb.unwrap_or(0)),
            },
            (None, None) => internal::NodeResources::default(),
        };
        internal::Node {
            csi_plugins: crate::csi::from_nomad_csi_maps(
                self.csi_controller_plugins.as_ref(),
                self.csi_node_plugins.as_ref(),
            ),
            devices: internal_devices(self.node_resources.as_ref()),
            host_volumes: self
                .host_volumes
                .iter()
                .flatten()
                .map(|(name, v)| {
                    (
                        name.clone(),
                        crate::HostVolume {
                            path: v.path.clone(),
                            read_only: v.read_only,
                        },
                    )
                })
                .collect(),
            network: internal_network(
                self.node_resources.as_ref(),
                self.reserved_resources.as_ref(),
            ),
            id: self.id.clone(),
            name: self.name.clone(),
            datacenter: self.datacenter.clone(),
            status: status_from(self.drover_status.as_deref(), &self.status, self.drain),
            status_description: self.status_description.clone(),
            drain: self.drain,
            ineligible: self
                .drover_marked_ineligible
                .unwrap_or(!self.drain && self.scheduling_eligibility == "ineligible"),
            attributes: self.attributes.clone().unwrap_or_default(),
            meta: self.meta.clone().unwrap_or_default(),
            resources,
            drivers: internal_drivers(&self.drivers),
            status_updated_at: self
                .status_updated_at_nanos
                .unwrap_or(self.status_updated_at.saturating_mul(1_000_000_000)),
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }
}

impl From<&internal::Node> for NodeListStub {
    fn from(n: &internal::Node) -> NodeListStub {
        NodeListStub {
            address: String::new(),
            id: n.id.clone(),
            datacenter: n.datacenter.clone(),
            name: n.name.clone(),
            node_class: String::new(),
            version: n
                .attributes
                .get("drover.version")
                .cloned()
                .unwrap_or_default(),
            drain: n.drain,
            scheduling_eligibility: eligibility(n).to_owned(),
            status: node_status(n.status).to_owned(),
            status_description: n.status_description.clone(),
            drivers: drivers(&n.drivers),
            node_resources: Some(node_resources(n)),
            create_index: n.create_index,
            modify_index: n.modify_index,
            drover_status: Some(n.status.as_str().to_owned()),
            drover_marked_ineligible: Some(n.ineligible),
        }
    }
}

impl NodeListStub {
    /// What a stub tells of the node as Drover keeps it: no attributes or meta (fetch
    /// the node for them).
    pub fn to_internal(&self) -> internal::Node {
        let narrow = |v: i64| u64::try_from(v).unwrap_or(0);
        internal::Node {
            devices: internal_devices(self.node_resources.as_ref()),
            host_volumes: Default::default(),
            csi_plugins: Default::default(),
            network: internal_network(self.node_resources.as_ref(), None),
            id: self.id.clone(),
            name: self.name.clone(),
            datacenter: self.datacenter.clone(),
            status: status_from(self.drover_status.as_deref(), &self.status, self.drain),
            status_description: self.status_description.clone(),
            drain: self.drain,
            ineligible: self
                .drover_marked_ineligible
                .unwrap_or(!self.drain && self.scheduling_eligibility == "ineligible"),
            attributes: BTreeMap::new(),
            meta: BTreeMap::new(),
            resources: self
                .node_resources
                .as_ref()
                .map(|r| internal::NodeResources {
                    cpu: narrow(r.cpu.cpu_shares),
                    memory_mb: narrow(r.memory.memory_mb),
                })
                .unwrap_or_default(),
            drivers: internal_drivers(&self.drivers),
            status_updated_at: 0,
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }
}
