//! Node endpoints: registration (with its bounds), authentication by the node's
//! secret, heartbeats, drain, and the reads of nodes and their allocations (the
//! clients' blocking allocation watch among them).
//!
//! A node proves who it is with its secret (as Nomad's node SecretID): a random string
//! its client keeps next to its id and sends on every node RPC. The server keeps only
//! its SHA-256, bound at the node's first registration (store key `nodesecret/<id>`,
//! never part of the node document the API serves); every later call for that id must
//! present a secret of the same hash, else it is refused (`Denied`) and changes
//! nothing. A node stored before secrets existed has no hash: its next registration
//! binds the secret it presents.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use drover_server_api::{
    AllocClientUpdate, Allocation, ClientAllocation, ClientStatus, DriverInfo, EvalTrigger, Index,
    Node, NodeRegistration, NodeStatus,
};
use sha2::{Digest as _, Sha256};

use super::newest_first;
use crate::error::ServerError;
use crate::leader::client_updates::check_count;
use crate::leader::requests::UpdateRequest;
use crate::scheduler::{self, StateView};
use crate::server::{NodeAllocations, Server};
use crate::state::evals::{new_eval, system_job_evals};
use crate::state::{Batch, State};

/// Shortest node secret taken (the client sends 64 hex characters).
pub const MIN_NODE_SECRET_BYTES: usize = 16;
/// Longest node secret taken.
pub const MAX_NODE_SECRET_BYTES: usize = 256;
/// Entries a node may report in its attributes, its meta, and each driver's attributes.
pub const MAX_NODE_ENTRIES: usize = 256;
/// Longest key of an attribute or meta entry, and longest driver name.
pub const MAX_NODE_KEY_BYTES: usize = 256;
/// Longest value of an attribute or meta entry, and longest driver health description.
pub const MAX_NODE_VALUE_BYTES: usize = 4096;
/// Drivers a node may report.
pub const MAX_NODE_DRIVERS: usize = 64;

/// The hex SHA-256 the server keeps of a node secret.
fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Is `secret` the one whose hash is `hash`? Hashes are compared in constant time.
fn secret_matches(secret: &str, hash: &str) -> bool {
    crate::transport::auth::token_eq(secret_hash(secret).as_bytes(), hash.as_bytes())
}

fn check_secret_shape(node_id: &str, secret: &str) -> Result<(), ServerError> {
    if secret.len() < MIN_NODE_SECRET_BYTES || secret.len() > MAX_NODE_SECRET_BYTES {
        return Err(ServerError::Invalid(format!(
            "node {node_id}: node_secret must be {MIN_NODE_SECRET_BYTES} to \
             {MAX_NODE_SECRET_BYTES} bytes"
        )));
    }
    Ok(())
}

/// May the caller presenting `secret` act as node `node_id`? `NotFound` for a node
/// the server does not know (it must register); `Denied` for a wrong secret, or for a
/// node with no secret bound yet (its client registers again, which binds it).
pub(crate) fn authenticate(st: &State, node_id: &str, secret: &str) -> Result<(), ServerError> {
    if st.node(node_id).is_none() {
        return Err(ServerError::NotFound(format!(
            "node {node_id} is not registered"
        )));
    }
    match st.node_secret_hash(node_id) {
        Some(hash) if secret_matches(secret, hash) => Ok(()),
        Some(_) => Err(ServerError::Denied(format!(
            "node {node_id}: the node secret does not match the one this node registered with"
        ))),
        None => Err(ServerError::Denied(format!(
            "node {node_id}: no node secret is bound to this node yet; register first"
        ))),
    }
}

/// A node by id, else by name. A name several nodes have (a node re-registered under
/// a name another took while it was down, or a new node with a down one's name) is
/// ambiguous: an error listing their ids, so that nothing acts on the wrong one.
pub(crate) fn lookup_node<'a>(st: &'a State, node: &str) -> Result<Option<&'a Node>, ServerError> {
    if let Some(n) = st.node(node) {
        return Ok(Some(n));
    }
    let named: Vec<&Node> = st.all_nodes().filter(|n| n.name == node).collect();
    match named.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => Err(ServerError::Invalid(format!(
            "node name {node} is ambiguous: nodes {} have it; use an id",
            many.iter()
                .map(|n| format!("{} ({})", n.id, format!("{:?}", n.status).to_lowercase()))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn check_entries(
    node_id: &str,
    field: &str,
    entries: &std::collections::BTreeMap<String, String>,
) -> Result<(), ServerError> {
    if entries.len() > MAX_NODE_ENTRIES {
        return Err(ServerError::Invalid(format!(
            "node {node_id}: {field}: {} entries, at most {MAX_NODE_ENTRIES}",
            entries.len()
        )));
    }
    for (k, v) in entries {
        if k.len() > MAX_NODE_KEY_BYTES {
            return Err(ServerError::Invalid(format!(
                "node {node_id}: {field}: a key of {} bytes, at most {MAX_NODE_KEY_BYTES}",
                k.len()
            )));
        }
        if v.len() > MAX_NODE_VALUE_BYTES {
            return Err(ServerError::Invalid(format!(
                "node {node_id}: {field}.{k}: {} bytes, at most {MAX_NODE_VALUE_BYTES}",
                v.len()
            )));
        }
    }
    Ok(())
}

/// What a node reports is kept, indexed and served to everyone: bound it.
fn check_registration(reg: &NodeRegistration) -> Result<(), ServerError> {
    let id = &reg.id;
    check_host_volumes(id, &reg.host_volumes)?;
    drover_server_api::devices::check_device_groups(&reg.devices)
        .map_err(|e| ServerError::Invalid(format!("node {id}: {e}")))?;
    check_entries(id, "attributes", &reg.attributes)?;
    check_entries(id, "meta", &reg.meta)?;
    if reg.drivers.len() > MAX_NODE_DRIVERS {
        return Err(ServerError::Invalid(format!(
            "node {id}: drivers: {} drivers, at most {MAX_NODE_DRIVERS}",
            reg.drivers.len()
        )));
    }
    for (
        name,
        DriverInfo {
            health_description,
            attributes,
            ..
        },
    ) in &reg.drivers
    {
        if name.is_empty() || name.len() > MAX_NODE_KEY_BYTES {
            return Err(ServerError::Invalid(format!(
                "node {id}: drivers: a driver name must be 1 to {MAX_NODE_KEY_BYTES} bytes"
            )));
        }
        if health_description.len() > MAX_NODE_VALUE_BYTES {
            return Err(ServerError::Invalid(format!(
                "node {id}: drivers.{name}.health_description: {} bytes, at most \
                 {MAX_NODE_VALUE_BYTES}",
                health_description.len()
            )));
        }
        check_entries(id, &format!("drivers.{name}.attributes"), attributes)?;
    }
    check_network(id, &reg.network)
}

/// A node has new capacity or features for the scheduler.
/// Host volumes a node may report at most.
const MAX_NODE_HOST_VOLUMES: usize = 256;

/// A node's host volumes: bounded in number, names and paths of bounded size.
fn check_host_volumes(
    id: &str,
    volumes: &BTreeMap<String, drover_server_api::HostVolume>,
) -> Result<(), ServerError> {
    if volumes.len() > MAX_NODE_HOST_VOLUMES {
        return Err(ServerError::Invalid(format!(
            "node {id}: host_volumes: {} volumes, at most {MAX_NODE_HOST_VOLUMES}",
            volumes.len()
        )));
    }
    for (name, v) in volumes {
        if name.is_empty() || name.len() > MAX_NODE_KEY_BYTES {
            return Err(ServerError::Invalid(format!(
                "node {id}: host_volumes: a volume name must be 1 to {MAX_NODE_KEY_BYTES} bytes"
            )));
        }
        if v.path.is_empty() || v.path.len() > MAX_NODE_VALUE_BYTES {
            return Err(ServerError::Invalid(format!(
                "node {id}: host_volumes.{name}.path must be 1 to {MAX_NODE_VALUE_BYTES} bytes"
            )));
        }
    }
    Ok(())
}

fn capacity_changed(old: &Node, new: &Node) -> bool {
    old.resources != new.resources
        || old.drivers != new.drivers
        || old.attributes != new.attributes
        || old.meta != new.meta
        || old.network != new.network
        || old.host_volumes != new.host_volumes
        // Instances that appear or become healthy may unblock evaluations.
        || old.devices != new.devices
}

/// Reserved port ranges a node may report at most.
const MAX_NODE_RESERVED_RANGES: usize = 1024;

/// A node's address and ports: an IP address, a dynamic range of at least one port
/// starting at 1 or above, reserved ranges that are ranges.
fn check_network(id: &str, net: &drover_server_api::NodeNetwork) -> Result<(), ServerError> {
    if net.address.parse::<std::net::IpAddr>().is_err() {
        return Err(ServerError::Invalid(format!(
            "node {id}: network.address: {:?} is not an IP address",
            net.address.chars().take(64).collect::<String>()
        )));
    }
    if net.min_dynamic_port == 0 || net.min_dynamic_port > net.max_dynamic_port {
        return Err(ServerError::Invalid(format!(
            "node {id}: network: the dynamic port range {}-{} is not a range of ports \
             (1-65535, min at most max)",
            net.min_dynamic_port, net.max_dynamic_port
        )));
    }
    if net.reserved_ports.len() > MAX_NODE_RESERVED_RANGES {
        return Err(ServerError::Invalid(format!(
            "node {id}: network.reserved_ports: {} ranges, at most {MAX_NODE_RESERVED_RANGES}",
            net.reserved_ports.len()
        )));
    }
    if let Some((i, r)) = net
        .reserved_ports
        .iter()
        .enumerate()
        .find(|(_, r)| r.first == 0 || r.first > r.last)
    {
        return Err(ServerError::Invalid(format!(
            "node {id}: network.reserved_ports[{i}]: {}-{} is not a range of ports",
            r.first, r.last
        )));
    }
    Ok(())
}

impl Server {
    // --- nodes --------------------------------------------------------------------

    /// May a caller presenting `secret` act as node `node_id`? `NotFound` for a node
    /// the server does not know, `Denied` for a wrong secret (or a node with none bound
    /// yet: it must register). The node RPCs call this before acting for a node.
    pub fn authenticate_node(&self, node_id: &str, secret: &str) -> Result<(), ServerError> {
        authenticate(&self.core.read(), node_id, secret)
    }

    /// Every node.
    pub fn nodes(&self) -> Vec<Node> {
        self.core.read().all_nodes().cloned().collect()
    }

    /// One node, by id or name. `NotFound` when none has it; `Invalid`, listing their
    /// ids, when several nodes have that name.
    pub fn node(&self, node: &str) -> Result<Node, ServerError> {
        lookup_node(&self.core.read(), node)?
            .cloned()
            .ok_or_else(|| ServerError::NotFound(format!("node {node:?} not found")))
    }

    /// A node's allocations, newest first.
    pub fn node_allocations(&self, node_id: &str) -> Vec<Allocation> {
        let st = self.core.read();
        let mut v: Vec<Allocation> = st.allocs_on_node(node_id).cloned().collect();
        newest_first(&mut v, |a| (a.create_index, &a.id));
        v
    }

    /// What a client gets: with `index` 0 the complete set of its node's allocations,
    /// else those whose `alloc_modify_index` is above `index` (or the complete set if
    /// the server cannot tell what changed). Waits up to `wait` for something newer
    /// than `index` first.
    pub async fn allocations_for_client(
        &self,
        node_id: &str,
        index: Index,
        wait: Duration,
    ) -> Result<NodeAllocations, ServerError> {
        let deadline = tokio::time::Instant::now() + wait.min(drover_server_api::MAX_BLOCKING_WAIT);
        let mut rx = self.core.index_tx.subscribe();
        loop {
            // Mark the current value seen before reading the state: a commit after
            // this point wakes `changed()` below.
            rx.borrow_and_update();
            let timed_out = tokio::time::Instant::now() >= deadline;
            {
                let st = self.core.read();
                if scheduler::StateView::node(&*st, node_id).is_none() {
                    return Err(ServerError::NotFound(format!(
                        "node {node_id} is not registered"
                    )));
                }
                let to_client = |a: &Allocation| ClientAllocation {
                    update: st.alloc_update(a),
                    alloc: a.clone(),
                    job_type: st
                        .job_in(&a.namespace, &a.job_name)
                        .map(|j| j.spec.job_type)
                        .or_else(|| {
                            st.evals_of_job(&a.namespace, &a.job_name)
                                .next()
                                .map(|e| e.job_type)
                        })
                        .unwrap_or_default(),
                    identities: {
                        let group = st.alloc_group(a);
                        self.workload_identities(&st, a, &group)
                    },
                    csi_volumes: st.csi_volumes_of(&a.namespace, &st.alloc_group(a)),
                    group: st.alloc_group(a),
                    job_meta: st.alloc_job_meta(a),
                    region: self.core.config.region.clone(),
                };
                // An index from the future (the server's state was replaced) cannot be
                // diffed against: send everything.
                if index == 0 || index > st.index {
                    // Only what the node must still act on: an allocation its client
                    // reported ended (complete, failed) needs nothing more, and
                    // sending every one it ever ran (each with its group) would grow
                    // without bound. Missing from the set, the client forgets it
                    // (it is terminal there already). Lost ones are the server's
                    // verdict, not the client's: they stay, so that it stops them.
                    let mut allocations: Vec<ClientAllocation> = st
                        .allocs_on_node(node_id)
                        .filter(|a| {
                            !a.client_status.is_terminal() || a.client_status == ClientStatus::Lost
                        })
                        .map(to_client)
                        .collect();
                    allocations.sort_by(|a, b| a.alloc.id.cmp(&b.alloc.id));
                    return Ok(NodeAllocations {
                        index: st.index,
                        complete: true,
                        allocations,
                    });
                }
                let mut changed: Vec<ClientAllocation> = st
                    .allocs_on_node(node_id)
                    .filter(|a| a.alloc_modify_index > index)
                    .map(to_client)
                    .collect();
                if !changed.is_empty() || timed_out {
                    changed.sort_by(|a, b| a.alloc.id.cmp(&b.alloc.id));
                    return Ok(NodeAllocations {
                        index: st.index,
                        complete: false,
                        allocations: changed,
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                r = rx.changed() => {
                    if r.is_err() {
                        return Err(ServerError::Unavailable("server shutting down".into()));
                    }
                }
                _ = self.core.shutdown.cancelled() => {
                    return Err(ServerError::Unavailable("server shutting down".into()));
                }
            }
        }
    }

    /// Status reports from a node's client; durable when this returns. Updates for
    /// allocations of other nodes are refused.
    pub async fn update_allocations(
        &self,
        node_id: &str,
        updates: Vec<AllocClientUpdate>,
    ) -> Result<Index, ServerError> {
        check_count(&updates)?;
        self.leadership
            .require()?
            .submit_updates(UpdateRequest {
                node_id: node_id.to_owned(),
                updates,
            })
            .await
    }
}

impl Server {
    /// Register or update a node; it is `ready` (or still draining). Returns the
    /// heartbeat TTL and the index.
    ///
    /// `secret` is the node's secret: the first registration of an id binds it (the
    /// server keeps its SHA-256); every later one must present the same, else
    /// `Denied`. Attributes, meta and drivers are bounded (see the `MAX_NODE_*`
    /// constants): more is `Invalid`.
    pub async fn register_node(
        &self,
        reg: NodeRegistration,
        secret: &str,
    ) -> Result<(Duration, Index), ServerError> {
        if reg.id.is_empty() || reg.id.len() > 128 {
            return Err(ServerError::Invalid(
                "node id must be 1 to 128 characters".into(),
            ));
        }
        if reg.name.is_empty() || reg.name.len() > 256 {
            return Err(ServerError::Invalid(format!(
                "node {}: name must be 1 to 256 characters",
                reg.id
            )));
        }
        check_secret_shape(&reg.id, secret)?;
        check_registration(&reg)?;
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, now| {
                let old = st.node(&reg.id);
                let mut b = Batch::default();
                match st.node_secret_hash(&reg.id) {
                    Some(hash) if secret_matches(secret, hash) => {}
                    Some(_) => {
                        return Err(ServerError::Denied(format!(
                            "node {}: the node secret does not match the one this node \
                             registered with",
                            reg.id
                        )));
                    }
                    // The first registration of this id (or of a node stored before
                    // secrets existed) binds the secret it presents.
                    None => b.node_secrets.push((reg.id.clone(), secret_hash(secret))),
                }
                // Names are unique among live nodes for ids new to the server only: a
                // node that proved its id keeps its name even if another live node took
                // it while it was down (`lookup_node` then calls the name ambiguous).
                if old.is_none()
                    && let Some(other) = st.all_nodes().find(|n| {
                        n.name == reg.name && n.id != reg.id && n.status != NodeStatus::Down
                    })
                {
                    return Err(ServerError::Conflict(format!(
                        "node name {} is already used by live node {}",
                        reg.name, other.id
                    )));
                }
                let drain = old.is_some_and(|n| n.drain);
                let status = if drain {
                    NodeStatus::Draining
                } else {
                    NodeStatus::Ready
                };
                let node = Node {
                    devices: reg.devices.clone(),
                    host_volumes: reg.host_volumes.clone(),
                    csi_plugins: reg.csi_plugins.clone(),
                    network: reg.network.clone(),
                    id: reg.id.clone(),
                    name: reg.name.clone(),
                    datacenter: reg.datacenter.clone(),
                    status,
                    status_description: String::new(),
                    drain,
                    ineligible: old.is_some_and(|n| n.ineligible),
                    attributes: reg.attributes.clone(),
                    meta: reg.meta.clone(),
                    resources: reg.resources,
                    drivers: reg.drivers.clone(),
                    status_updated_at: match old {
                        Some(o) if o.status == status => o.status_updated_at,
                        _ => now,
                    },
                    create_index: old.map_or(index, |o| o.create_index),
                    modify_index: index,
                };
                let unchanged = old.is_some_and(|o| {
                    let mut same = node.clone();
                    same.modify_index = o.modify_index;
                    same.status_description.clone_from(&o.status_description);
                    &same == o
                });
                if unchanged {
                    return Ok((b, ()));
                }
                let came_back = old.is_none_or(|o| o.status == NodeStatus::Down);
                if came_back || old.is_some_and(|o| capacity_changed(o, &node)) {
                    system_job_evals(st, &node.id, index, now, &mut b);
                    b.unblock = true;
                }
                b.nodes.push(node);
                Ok((b, ()))
            })
            .await?;
        term.arm(&reg.id);
        Ok((self.core.config.heartbeat_ttl, index))
    }

    /// A node's heartbeat. `NotFound` for an unknown node (it must register).
    pub async fn heartbeat(&self, node_id: &str) -> Result<(Duration, Index), ServerError> {
        let status = self.core.read().node(node_id).map(|n| n.status);
        match status {
            None => Err(ServerError::NotFound(format!(
                "node {node_id} is not registered"
            ))),
            Some(NodeStatus::Down) => {
                // A node the server gave up on is heard again: it is back, with what it
                // registered last.
                let term = self.leadership.require()?;
                let (index, ()) = term
                    .commit(|st, index, now| {
                        let mut b = Batch::default();
                        if let Some(n) = st.node(node_id)
                            && n.status == NodeStatus::Down
                        {
                            let mut n = n.clone();
                            n.status = if n.drain {
                                NodeStatus::Draining
                            } else {
                                NodeStatus::Ready
                            };
                            n.status_description = "heartbeating again".into();
                            n.status_updated_at = now;
                            n.modify_index = index;
                            system_job_evals(st, node_id, index, now, &mut b);
                            b.unblock = true;
                            b.nodes.push(n);
                        }
                        Ok((b, ()))
                    })
                    .await?;
                term.arm(node_id);
                Ok((self.core.config.heartbeat_ttl, index))
            }
            Some(_) => {
                let deadline = Instant::now()
                    + self.core.config.heartbeat_ttl
                    + self.core.config.heartbeat_grace;
                self.leadership.require()?.timers().reset(node_id, deadline);
                Ok((self.core.config.heartbeat_ttl, self.core.read().index))
            }
        }
    }

    /// Start or end a node's drain; `node` is an id or a unique name. A drain that
    /// ends leaves the node eligible (as `nomad node drain -disable`).
    pub async fn drain_node(&self, node: &str, enable: bool) -> Result<Index, ServerError> {
        self.update_drain(node, enable, true).await
    }

    /// Start or end a node's drain; when it ends, `mark_eligible` says whether the
    /// node takes new allocations again or stays ineligible (Nomad's `MarkEligible`).
    pub async fn update_drain(
        &self,
        node: &str,
        enable: bool,
        mark_eligible: bool,
    ) -> Result<Index, ServerError> {
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, now| {
                let Some(n) = lookup_node(st, node)? else {
                    return Err(ServerError::NotFound(format!("node {node} not found")));
                };
                let mut b = Batch::default();
                // A drain that ends leaves the node ineligible unless asked otherwise
                // (Nomad's); a drain itself already keeps new placements away.
                let ineligible = if enable {
                    n.ineligible
                } else if mark_eligible {
                    false
                } else {
                    n.ineligible || n.drain
                };
                if n.drain == enable && n.ineligible == ineligible {
                    return Ok((b, ()));
                }
                let eligible_again = n.ineligible && !ineligible;
                let mut n = n.clone();
                n.ineligible = ineligible;
                if n.drain == enable {
                    n.modify_index = index;
                    if eligible_again {
                        b.unblock = true;
                        system_job_evals(st, &n.id, index, now, &mut b);
                    }
                    b.nodes.push(n);
                    return Ok((b, ()));
                }
                n.drain = enable;
                if n.status != NodeStatus::Down {
                    n.status = if enable {
                        NodeStatus::Draining
                    } else {
                        NodeStatus::Ready
                    };
                    n.status_updated_at = now;
                }
                n.status_description = if enable {
                    "drain requested".into()
                } else {
                    String::new()
                };
                n.modify_index = index;
                if enable {
                    let jobs: BTreeSet<(&str, &str)> = st
                        .allocs_on_node(&n.id)
                        .filter(|a| !a.is_terminal())
                        .map(|a| (a.namespace.as_str(), a.job_name.as_str()))
                        .collect();
                    for (ns, name) in jobs {
                        if let Some(job) = st.job_in(ns, name) {
                            let mut e = new_eval(job, EvalTrigger::NodeDrain, index, now);
                            e.node_id = Some(n.id.clone());
                            b.evals.push(e);
                        }
                    }
                } else {
                    b.unblock = true;
                    system_job_evals(st, &n.id, index, now, &mut b);
                }
                b.nodes.push(n);
                Ok((b, ()))
            })
            .await?;
        Ok(index)
    }

    /// Mark a node eligible or ineligible for new placements (`nomad node
    /// eligibility`): what runs there stays; a node made eligible again gets the
    /// system jobs and the blocked evaluations retried.
    pub async fn set_node_eligibility(
        &self,
        node: &str,
        eligible: bool,
    ) -> Result<Index, ServerError> {
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, now| {
                let Some(n) = lookup_node(st, node)? else {
                    return Err(ServerError::NotFound(format!("node {node} not found")));
                };
                let mut b = Batch::default();
                if n.ineligible != eligible {
                    return Ok((b, ()));
                }
                if eligible && n.drain {
                    return Err(ServerError::Invalid(format!(
                        "node {}: can not set node's scheduling eligibility to eligible while it is draining",
                        n.id
                    )));
                }
                let mut n = n.clone();
                n.ineligible = !eligible;
                n.modify_index = index;
                if eligible {
                    b.unblock = true;
                    system_job_evals(st, &n.id, index, now, &mut b);
                }
                b.nodes.push(n);
                Ok((b, ()))
            })
            .await?;
        Ok(index)
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;

    fn group(instances: usize) -> drover_server_api::NodeDeviceGroup {
        drover_server_api::NodeDeviceGroup {
            vendor: "nomad".into(),
            device_type: "file".into(),
            name: "mock".into(),
            instances: (0..instances)
                .map(|i| drover_server_api::NodeDeviceInstance {
                    id: format!("dev-{i}"),
                    healthy: true,
                    health_description: String::new(),
                })
                .collect(),
            attributes: Default::default(),
        }
    }

    #[test]
    fn a_device_instance_becoming_healthy_is_new_capacity() {
        let mut old = crate::scheduler::tests::node("n1", 1000, 1000);
        old.devices = vec![group(2)];
        old.devices[0].instances[1].healthy = false;
        let mut new = old.clone();
        assert!(!capacity_changed(&old, &new));
        new.devices[0].instances[1].healthy = true;
        assert!(capacity_changed(&old, &new));
    }

    #[test]
    fn a_registration_with_too_many_or_bad_devices_is_refused() {
        let node = crate::scheduler::tests::node("n1", 1000, 1000);
        let reg = |devices: Vec<drover_server_api::NodeDeviceGroup>| {
            let mut r: NodeRegistration =
                serde_json::from_value(serde_json::to_value(&node).unwrap())
                    .unwrap_or_else(|e| panic!("a node's JSON as a registration: {e}"));
            r.devices = devices;
            r
        };
        let e = check_registration(&reg(vec![group(
            drover_server_api::devices::MAX_DEVICE_INSTANCES + 1,
        )]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("node id-n1: devices[0] (nomad/file/mock)"),
            "{e}"
        );
        let mut slash = group(1);
        slash.instances[0].id = "a/b".into();
        let e = check_registration(&reg(vec![slash]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("devices[0].instances[0].id"), "{e}");
        let many = vec![group(1); drover_server_api::devices::MAX_DEVICE_GROUPS + 1];
        assert!(check_registration(&reg(many)).is_err());
    }
}
