//! Nodes: registration, heartbeats and their timers, drain.
//!
//! Every live node has a deadline (last heartbeat + TTL + grace) kept in [`Timers`];
//! one loop sleeps until the earliest and marks a node whose deadline passed `down`:
//! its non-terminal allocations are stopped as `lost` (the scheduler replaces them) and
//! a `node-update` evaluation is made for every affected job and every system job.
//! Heartbeats are not written to the store (as Nomad's): after a server restart every
//! node gets a fresh TTL + grace.
//!
//! A node proves who it is with its secret (as Nomad's node SecretID): a random string
//! its client keeps next to its id and sends on every node RPC. The server keeps only
//! its SHA-256, bound at the node's first registration (store key `nodesecret/<id>`,
//! never part of the node document the API serves); every later call for that id must
//! present a secret of the same hash, else it is refused (`Denied`) and changes
//! nothing. A node stored before secrets existed has no hash: its next registration
//! binds the secret it presents.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_server_api::{
    ClientStatus, DesiredStatus, DriverInfo, EvalTrigger, Index, JobType, Node, NodeRegistration,
    NodeStatus,
};
use sha2::{Digest as _, Sha256};

use crate::error::ServerError;
use crate::scheduler::StateView;
use crate::server::{Core, new_eval};
use crate::state::{Batch, State};

/// Heartbeat deadlines, earliest first.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    by_node: HashMap<String, Instant>,
    order: BTreeSet<(Instant, String)>,
}

impl Timers {
    pub(crate) fn reset(&mut self, node: &str, deadline: Instant) {
        if let Some(old) = self.by_node.insert(node.to_owned(), deadline) {
            self.order.remove(&(old, node.to_owned()));
        }
        self.order.insert((deadline, node.to_owned()));
    }

    pub(crate) fn next(&self) -> Option<Instant> {
        self.order.first().map(|(t, _)| *t)
    }

    pub(crate) fn has(&self, node: &str) -> bool {
        self.by_node.contains_key(node)
    }

    /// Remove and return the nodes whose deadline is at or before `now`.
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((t, _)) = self.order.first() {
            if *t > now {
                break;
            }
            if let Some((_, n)) = self.order.pop_first() {
                self.by_node.remove(&n);
                out.push(n);
            }
        }
        out
    }
}

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
    crate::rpc::token_eq(secret_hash(secret).as_bytes(), hash.as_bytes())
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
    Ok(())
}

pub(crate) async fn run(core: Arc<Core>, stop: tokio_util::sync::CancellationToken) {
    loop {
        let changed = core.timers_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let next = core.timers().next();
        let sleep = async {
            match next {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = changed => continue,
            _ = sleep => {}
        }
        let expired = core.timers().pop_expired(Instant::now());
        for node in expired {
            if let Err(e) = core.node_down(&node).await {
                if e.is_not_leader() {
                    // The term ended under this loop (it stops at once): the next
                    // leader's timers decide about the node, after its failover window.
                    tracing::info!(node = %node, "not marking the node down: {e}");
                    return;
                }
                tracing::error!(node = %node, "could not mark the node down: {e}; retrying");
                // Try again soon rather than forget the node.
                core.timers()
                    .reset(&node, Instant::now() + Duration::from_secs(1));
            }
        }
    }
}

/// A node has new capacity or features for the scheduler.
fn capacity_changed(old: &Node, new: &Node) -> bool {
    old.resources != new.resources
        || old.drivers != new.drivers
        || old.attributes != new.attributes
        || old.meta != new.meta
}

/// A `node-update` evaluation for every live system job.
fn system_job_evals(st: &State, node_id: &str, index: Index, now: i64, b: &mut Batch) {
    for job in st
        .jobs()
        .filter(|j| j.spec.job_type == JobType::System && !j.stop)
    {
        let mut e = new_eval(job, EvalTrigger::NodeUpdate, index, now);
        e.node_id = Some(node_id.to_owned());
        b.evals.push(e);
    }
}

impl Core {
    pub(crate) fn timers(&self) -> std::sync::MutexGuard<'_, Timers> {
        self.timers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn arm(&self, node_id: &str) {
        let deadline = Instant::now() + self.config.heartbeat_ttl + self.config.heartbeat_grace;
        self.timers().reset(node_id, deadline);
        self.timers_changed.notify_one();
    }

    pub(crate) async fn register_node(
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
        let (index, ()) = self
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
                    id: reg.id.clone(),
                    name: reg.name.clone(),
                    status,
                    status_description: String::new(),
                    drain,
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
        self.arm(&reg.id);
        Ok((self.config.heartbeat_ttl, index))
    }

    pub(crate) async fn heartbeat(&self, node_id: &str) -> Result<(Duration, Index), ServerError> {
        let status = self.read().node(node_id).map(|n| n.status);
        match status {
            None => Err(ServerError::NotFound(format!(
                "node {node_id} is not registered"
            ))),
            Some(NodeStatus::Down) => {
                // A node the server gave up on is heard again: it is back, with what it
                // registered last.
                let (index, ()) = self
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
                self.arm(node_id);
                Ok((self.config.heartbeat_ttl, index))
            }
            Some(_) => {
                let deadline =
                    Instant::now() + self.config.heartbeat_ttl + self.config.heartbeat_grace;
                self.timers().reset(node_id, deadline);
                Ok((self.config.heartbeat_ttl, self.read().index))
            }
        }
    }

    /// Mark a node whose heartbeat deadline passed `down`.
    pub(crate) async fn node_down(&self, node_id: &str) -> Result<(), ServerError> {
        let silent = self.config.heartbeat_ttl + self.config.heartbeat_grace;
        let (index, n) = self
            .commit(|st, index, now| {
                let mut b = Batch::default();
                // A heartbeat or registration that came in since the deadline wins.
                if self.timers().has(node_id) {
                    return Ok((b, 0));
                }
                let Some(node) = st.node(node_id).filter(|n| n.status != NodeStatus::Down) else {
                    return Ok((b, 0));
                };
                let mut node = node.clone();
                node.status = NodeStatus::Down;
                node.status_description =
                    format!("missed heartbeats for {}", humantime_secs(silent));
                node.status_updated_at = now;
                node.modify_index = index;
                let mut jobs = BTreeSet::new();
                for a in st.allocs_on_node(node_id) {
                    if a.is_terminal() {
                        continue;
                    }
                    let mut a = a.clone();
                    a.desired_status = DesiredStatus::Stop;
                    a.desired_description = "node down".into();
                    a.client_status = ClientStatus::Lost;
                    a.client_description = "node down: allocation lost".into();
                    a.alloc_modify_index = index;
                    a.modify_index = index;
                    a.modify_time = now;
                    jobs.insert(a.job_name.clone());
                    b.allocs.push(a);
                }
                let n = b.allocs.len();
                for name in &jobs {
                    if let Some(job) = st.job(name).filter(|j| j.spec.job_type != JobType::System) {
                        let mut e = new_eval(job, EvalTrigger::NodeUpdate, index, now);
                        e.node_id = Some(node_id.to_owned());
                        b.evals.push(e);
                    }
                }
                system_job_evals(st, node_id, index, now, &mut b);
                b.nodes.push(node);
                Ok((b, n))
            })
            .await?;
        tracing::warn!(node = %node_id, index, lost_allocations = n, "node missed its heartbeats: down");
        Ok(())
    }

    pub(crate) async fn drain_node(&self, node: &str, enable: bool) -> Result<Index, ServerError> {
        let (index, ()) = self
            .commit(|st, index, now| {
                let Some(n) = lookup_node(st, node)? else {
                    return Err(ServerError::NotFound(format!("node {node} not found")));
                };
                let mut b = Batch::default();
                if n.drain == enable {
                    return Ok((b, ()));
                }
                let mut n = n.clone();
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
                    let jobs: BTreeSet<&str> = st
                        .allocs_on_node(&n.id)
                        .filter(|a| !a.is_terminal())
                        .map(|a| a.job_name.as_str())
                        .collect();
                    for name in jobs {
                        if let Some(job) = st.job(name) {
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
}

fn humantime_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_pop_in_deadline_order_and_reset_moves_a_node() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.reset("a", t0 + Duration::from_secs(1));
        t.reset("b", t0 + Duration::from_secs(2));
        t.reset("a", t0 + Duration::from_secs(3));
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(2)),
            vec!["b".to_string()]
        );
        assert!(t.has("a") && !t.has("b"));
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(3)),
            vec!["a".to_string()]
        );
        assert_eq!(t.next(), None);
    }
}
