//! Feasibility: can a node run a group at all (status, drivers, constraints)? What
//! depends only on the node and the group is checked once per node and group in a
//! scheduling pass; resources and `distinct_hosts` depend on the plan so far and are
//! checked by the placer.

use std::collections::HashMap;

use drover_server_api::validate::{
    Target, interpolation_target, lenient_version, set_items, version_requirement,
};
use drover_server_api::{Constraint, ConstraintOperator, JobSpec, Node, NodeStatus, TaskGroup};
use regex::Regex;
use semver::VersionReq;

/// Why a node cannot run a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filter<'a> {
    /// Not `ready` (or draining): "node down", "node draining", "node initializing".
    NotReady(&'static str),
    /// A task's driver was not fingerprinted on the node.
    DriverMissing(&'a str),
    /// A task's driver is there but not healthy.
    DriverUnhealthy(&'a str),
    /// A constraint does not hold.
    Constraint(&'a Constraint),
    /// No device group of the node matches a task's `device` request (name and
    /// constraints) with enough instances, healthy or not.
    DeviceMissing(&'a str),
    /// The node has no host volume of this name.
    HostVolumeMissing(&'a str),
    /// The node's host volume is read-only, the group wants it writable.
    HostVolumeReadOnly(&'a str),
}

impl Filter<'_> {
    /// The key of `PlacementFailure::nodes_filtered`.
    pub(crate) fn key(&self) -> String {
        match self {
            Filter::NotReady(what) => (*what).to_owned(),
            Filter::DriverMissing(d) => format!("driver {d} not detected"),
            Filter::DriverUnhealthy(d) => format!("driver {d} unhealthy"),
            Filter::Constraint(c) => describe(c),
            Filter::DeviceMissing(d) => format!("missing compatible device {d}"),
            Filter::HostVolumeMissing(v) => format!("missing host volume {v:?}"),
            Filter::HostVolumeReadOnly(v) => format!("host volume {v:?} is read-only"),
        }
    }
}

/// A constraint as people read it: `${node.meta.rack} = r9`.
pub(crate) fn describe(c: &Constraint) -> String {
    let mut s = format!("constraint {} {}", c.attribute, c.operator.as_str());
    if !c.value.is_empty() {
        s.push(' ');
        s.push_str(&c.value);
    }
    s
}

/// Why a node takes no new allocations, if it does not.
pub(crate) fn not_ready(node: &Node) -> Option<&'static str> {
    match node.status {
        NodeStatus::Ready if node.drain => Some("node draining"),
        NodeStatus::Ready if node.ineligible => Some("node ineligible"),
        NodeStatus::Ready => None,
        NodeStatus::Draining => Some("node draining"),
        NodeStatus::Down => Some("node down"),
        NodeStatus::Initializing => Some("node initializing"),
    }
}

/// What a group asks of every node, gathered once per scheduling pass.
#[derive(Debug)]
pub(crate) struct GroupNeeds<'a> {
    /// The drivers of its tasks, each once.
    pub drivers: Vec<&'a str>,
    /// The job's and the group's constraints, `distinct_hosts` aside.
    pub constraints: Vec<&'a Constraint>,
    /// `distinct_hosts` on the job: no two allocations of the job on a node.
    pub distinct_job: bool,
    /// `distinct_hosts` on the group: no two allocations of the group on a node.
    pub distinct_group: bool,
    /// The `device` requests of its tasks, with the task's name.
    pub devices: Vec<(&'a str, &'a drover_server_api::DeviceRequest)>,
    /// The host volumes it mounts ([`host_volume_needs`]).
    pub host_volumes: Vec<HostVolumeNeed<'a>>,
}

fn distinct_enabled(c: &Constraint) -> bool {
    c.operator == ConstraintOperator::DistinctHosts && c.value.trim() != "false"
}

impl<'a> GroupNeeds<'a> {
    pub(crate) fn new(job: &'a JobSpec, group: &'a TaskGroup) -> Self {
        let mut drivers: Vec<&str> = Vec::new();
        for t in &group.tasks {
            if !drivers.contains(&t.driver.as_str()) {
                drivers.push(&t.driver);
            }
        }
        let constraints = job
            .constraints
            .iter()
            .chain(&group.constraints)
            .filter(|c| c.operator != ConstraintOperator::DistinctHosts)
            .collect();
        let devices = group
            .tasks
            .iter()
            .flat_map(|t| t.devices.iter().map(move |d| (t.name.as_str(), d)))
            .collect();
        GroupNeeds {
            drivers,
            devices,
            constraints,
            distinct_job: job.constraints.iter().any(distinct_enabled),
            distinct_group: group.constraints.iter().any(distinct_enabled),
            host_volumes: host_volume_needs(group),
        }
    }
}

/// Regular expressions and version requirements of constraints, compiled once per
/// scheduling pass (they are checked on every node). `None`: it does not compile, and
/// the constraint holds on no node (validation refuses such jobs; older stored ones
/// filter with the constraint as their reason).
#[derive(Debug, Default)]
pub(crate) struct Compiled {
    regexes: HashMap<String, Option<Regex>>,
    versions: HashMap<String, Option<VersionReq>>,
}

impl Compiled {
    fn regex(&mut self, pattern: &str) -> Option<&Regex> {
        self.regexes
            .entry(pattern.to_owned())
            .or_insert_with(|| Regex::new(pattern).ok())
            .as_ref()
    }

    fn version(&mut self, requirement: &str) -> Option<&VersionReq> {
        self.versions
            .entry(requirement.to_owned())
            .or_insert_with(|| version_requirement(requirement).ok())
            .as_ref()
    }
}

/// Whether `node` can run a group needing `needs`, apart from resources and
/// `distinct_hosts`.
pub(crate) fn check<'a>(
    node: &Node,
    needs: &GroupNeeds<'a>,
    compiled: &mut Compiled,
) -> Result<(), Filter<'a>> {
    if let Some(why) = not_ready(node) {
        return Err(Filter::NotReady(why));
    }
    for d in &needs.drivers {
        match node.driver(d) {
            Some(info) if info.detected && info.healthy => {}
            Some(info) if info.detected => return Err(Filter::DriverUnhealthy(d)),
            _ => return Err(Filter::DriverMissing(d)),
        }
    }
    for c in &needs.constraints {
        if !holds(node, c, compiled) {
            return Err(Filter::Constraint(c));
        }
    }
    for (_, d) in &needs.devices {
        if !super::devices::could_serve(node, d, compiled) {
            return Err(Filter::DeviceMissing(&d.name));
        }
    }
    check_host_volumes(node, &needs.host_volumes)?;
    Ok(())
}

/// A host volume a group mounts: the node's volume name (the request's `source`) and
/// whether some task mounts it writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostVolumeNeed<'a> {
    /// The name in the node's `host_volume` config.
    pub source: &'a str,
    /// The group's request is not read-only (a task may write to it).
    pub writable: bool,
}

/// The host volumes `group` asks for, each source once (writable if any request of it
/// is). CSI volumes are not placed by this.
pub(crate) fn host_volume_needs(group: &TaskGroup) -> Vec<HostVolumeNeed<'_>> {
    let mut out: Vec<HostVolumeNeed<'_>> = Vec::new();
    for v in group.volumes.values().filter(|v| v.volume_type == "host") {
        match out.iter_mut().find(|n| n.source == v.source) {
            Some(n) => n.writable |= !v.read_only,
            None => out.push(HostVolumeNeed {
                source: &v.source,
                writable: !v.read_only,
            }),
        }
    }
    out
}

/// The node has every host volume in `needs`, and writable where a need is (Nomad's
/// `HostVolumeChecker`).
pub(crate) fn check_host_volumes<'a>(
    node: &Node,
    needs: &[HostVolumeNeed<'a>],
) -> Result<(), Filter<'a>> {
    for need in needs {
        match node.host_volumes.get(need.source) {
            None => return Err(Filter::HostVolumeMissing(need.source)),
            Some(v) if v.read_only && need.writable => {
                return Err(Filter::HostVolumeReadOnly(need.source));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Whether `node` could ever run a group needing `needs`: its drivers were detected
/// (healthy or not) and the constraints hold; whether it is ready now does not matter.
pub(crate) fn could_run(node: &Node, needs: &GroupNeeds<'_>, compiled: &mut Compiled) -> bool {
    needs
        .drivers
        .iter()
        .all(|d| node.driver(d).is_some_and(|i| i.detected))
        && needs.constraints.iter().all(|c| holds(node, c, compiled))
        && needs
            .devices
            .iter()
            .all(|(_, d)| super::devices::could_serve(node, d, compiled))
        && check_host_volumes(node, &needs.host_volumes).is_ok()
}

/// The value a constraint side has on `node` (`None`: not set there).
fn resolve<'n>(node: &'n Node, text: &'n str) -> Option<&'n str> {
    match interpolation_target(text).ok()? {
        Target::NodeName => Some(&node.name),
        Target::NodeId => Some(&node.id),
        Target::NodeDatacenter => Some(&node.datacenter),
        Target::NodeClass => Some(""),
        Target::Attribute(k) => node.attributes.get(k).map(String::as_str),
        Target::Meta(k) => node.meta.get(k).map(String::as_str),
        Target::Driver(d, k) => node
            .driver(d)
            .and_then(|i| i.attributes.get(k))
            .map(String::as_str),
        Target::Literal(t) => Some(t),
    }
}

/// Numeric when both sides are numbers, else lexical.
fn compare(l: &str, r: &str) -> std::cmp::Ordering {
    match (l.trim().parse::<f64>(), r.trim().parse::<f64>()) {
        (Ok(a), Ok(b)) => a.partial_cmp(&b).unwrap_or(std::cmp::Ordering::Equal),
        _ => l.cmp(r),
    }
}

/// Whether constraint `c` holds on `node`.
pub(crate) fn holds(node: &Node, c: &Constraint, compiled: &mut Compiled) -> bool {
    let l = resolve(node, &c.attribute);
    let r = resolve(node, &c.value);
    holds_for(c.operator, l, r, compiled)
}

/// Whether `l operator r` holds, the sides resolved (`None`: not set).
pub(crate) fn holds_for(
    operator: ConstraintOperator,
    l: Option<&str>,
    r: Option<&str>,
    compiled: &mut Compiled,
) -> bool {
    use ConstraintOperator::*;
    use std::cmp::Ordering;
    match operator {
        Equal => l.is_some() && l == r,
        NotEqual => l != r,
        Less | LessEqual | Greater | GreaterEqual => {
            let (Some(l), Some(r)) = (l, r) else {
                return false;
            };
            let ord = compare(l, r);
            match operator {
                Less => ord == Ordering::Less,
                LessEqual => ord != Ordering::Greater,
                Greater => ord == Ordering::Greater,
                _ => ord != Ordering::Less,
            }
        }
        Version => {
            let (Some(l), Some(r)) = (l, r) else {
                return false;
            };
            let Some(v) = lenient_version(l) else {
                return false;
            };
            compiled.version(r).is_some_and(|req| req.matches(&v))
        }
        Regexp => {
            let (Some(l), Some(r)) = (l, r) else {
                return false;
            };
            compiled.regex(r).is_some_and(|re| re.is_match(l))
        }
        SetContains | SetContainsAny => {
            let (Some(l), Some(r)) = (l, r) else {
                return false;
            };
            let have: Vec<&str> = set_items(l).collect();
            let mut wanted = set_items(r);
            if operator == SetContains {
                wanted.all(|w| have.contains(&w))
            } else {
                wanted.any(|w| have.contains(&w))
            }
        }
        IsSet => l.is_some(),
        IsNotSet => l.is_none(),
        DistinctHosts => true,
    }
}
