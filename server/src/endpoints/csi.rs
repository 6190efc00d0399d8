//! CSI volumes: list, read, register, deregister, create, delete (Nomad's
//! `/v1/volumes?type=csi`, `/v1/volume/csi/:id[/create|/delete]`), and the queue of
//! controller calls agents answer.
//!
//! The server cannot call agents: `create` and `delete` queue a [`ControllerCall`] for
//! a node whose controller plugin of the volume is healthy; that node's agent takes it
//! from its `CsiController.Watch` stream (on the server it is connected to) and
//! answers with `Reply`; the HTTP call waits for the answer up to
//! [`CONTROLLER_CALL_TIMEOUT`]. The queue is in memory on the server that took the
//! call: with several servers, a create works when the controller node's agent is
//! connected to that server (a follower forwards writes to the leader, so that is the
//! leader).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use drover_server_api::csi::{
    ControllerCall, ControllerOutcome, CsiClaim, CsiVolume, MAX_VOLUME_ENTRIES,
};
use drover_server_api::{Index, NodeStatus};
use tokio::sync::{Notify, oneshot};

use crate::error::ServerError;
use crate::server::Server;
use crate::state::Batch;

/// How long `create` and `delete` wait for the controller's answer.
pub const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Most CSI volumes the cluster holds.
pub const MAX_CSI_VOLUMES: usize = 10_000;
/// Most controller calls waiting per node.
const MAX_QUEUED_PER_NODE: usize = 64;

/// Controller calls waiting for agents, by node id; and the callers waiting for
/// their answers, by call id.
#[derive(Debug, Default)]
pub struct ControllerQueue {
    inner: Mutex<QueueInner>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct QueueInner {
    queued: HashMap<String, VecDeque<(String, ControllerCall)>>,
    waiting: HashMap<String, (String, oneshot::Sender<ControllerOutcome>)>,
}

impl ControllerQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queue `call` for `node_id`; the receiver gets the answer.
    fn push(
        &self,
        node_id: &str,
        call: ControllerCall,
    ) -> Result<(String, oneshot::Receiver<ControllerOutcome>), ServerError> {
        let id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.lock();
            let queue = q.queued.entry(node_id.to_owned()).or_default();
            if queue.len() >= MAX_QUEUED_PER_NODE {
                return Err(ServerError::Unavailable(format!(
                    "node {node_id} has {MAX_QUEUED_PER_NODE} CSI controller calls waiting; retry later"
                )));
            }
            queue.push_back((id.clone(), call));
            q.waiting.insert(id.clone(), (node_id.to_owned(), tx));
        }
        self.notify.notify_waiters();
        Ok((id, rx))
    }

    /// Forget call `id` (its caller gave up).
    fn cancel(&self, id: &str) {
        let mut q = self.lock();
        q.waiting.remove(id);
        for queue in q.queued.values_mut() {
            queue.retain(|(i, _)| i != id);
        }
    }

    /// The calls queued for `node_id`, taken off the queue.
    pub fn take(&self, node_id: &str) -> Vec<(String, ControllerCall)> {
        self.lock()
            .queued
            .remove(node_id)
            .map(Vec::from)
            .unwrap_or_default()
    }

    /// Completes when something is queued (for anyone) after it was made: make it
    /// (and `enable` it) before [`ControllerQueue::take`], so that no call is missed.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Deliver `node_id`'s answer to call `id`; false when nobody waits for it (or it
    /// was another node's).
    pub fn answer(&self, node_id: &str, id: &str, outcome: ControllerOutcome) -> bool {
        let mut q = self.lock();
        match q.waiting.get(id) {
            Some((n, _)) if n == node_id => {}
            _ => return false,
        }
        match q.waiting.remove(id) {
            Some((_, tx)) => tx.send(outcome).is_ok(),
            None => false,
        }
    }
}

impl Server {
    /// The CSI volumes of the namespaces `namespaces` takes, with their claims.
    pub fn csi_volumes(&self, namespaces: super::NsFilter<'_>) -> Vec<(CsiVolume, Vec<CsiClaim>)> {
        let st = self.core.read();
        let mut claims = st.all_csi_claims();
        st.csi_volumes("*")
            .filter(|v| namespaces(&v.namespace))
            .map(|v| {
                let c = claims
                    .remove(&(v.namespace.clone(), v.id.clone()))
                    .unwrap_or_default();
                (v.clone(), c)
            })
            .collect()
    }

    /// One CSI volume, with its claims.
    pub fn csi_volume(&self, ns: &str, id: &str) -> Option<(CsiVolume, Vec<CsiClaim>)> {
        let st = self.core.read();
        st.csi_volume(ns, id)
            .map(|v| (v.clone(), st.csi_claims(ns, id)))
    }

    /// The queue of controller calls (the RPC layer serves it to agents).
    pub fn csi_controller_queue(&self) -> &ControllerQueue {
        &self.csi_queue
    }

    /// Register a volume that exists (its `external_id` given), or update a registered
    /// one that is not claimed. The commit's index.
    pub async fn register_csi_volume(&self, mut v: CsiVolume) -> Result<Index, ServerError> {
        check_volume(&v)?;
        if v.external_id.is_empty() {
            return Err(ServerError::Invalid(
                "external_id: missing: a registered volume names the plugin's volume id \
                 (use `volume create` to make one)"
                    .into(),
            ));
        }
        self.check_namespace(&v.namespace)?;
        v.provider = self.csi_provider(&v.plugin_id);
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, _now| {
                refuse_shared_storage(st, &v)?;
                match st.csi_volume(&v.namespace, &v.id) {
                    Some(old) => {
                        if !st.csi_claims(&v.namespace, &v.id).is_empty()
                            && (old.plugin_id != v.plugin_id || old.external_id != v.external_id)
                        {
                            return Err(ServerError::Conflict(format!(
                                "volume {:?} is claimed: its plugin_id and external_id cannot change",
                                v.id
                            )));
                        }
                        v.create_index = old.create_index;
                        v.created = old.created;
                    }
                    None => {
                        if st.csi_volume_count() >= MAX_CSI_VOLUMES {
                            return Err(ServerError::Invalid(format!(
                                "the cluster holds {MAX_CSI_VOLUMES} CSI volumes, the most it may"
                            )));
                        }
                        v.create_index = index;
                    }
                }
                v.modify_index = index;
                Ok((
                    Batch {
                        csi_volumes: vec![v.clone()],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await?;
        Ok(index)
    }

    /// Forget a volume (the storage stays). Refused while claimed.
    pub async fn deregister_csi_volume(&self, ns: &str, id: &str) -> Result<Index, ServerError> {
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, _index, _now| {
                if st.csi_volume(ns, id).is_none() {
                    return Err(ServerError::NotFound(format!("volume {id:?} not found")));
                }
                refuse_claimed(&st.csi_claims(ns, id), id, "deregistered")?;
                Ok((
                    Batch {
                        drop_csi_volumes: vec![(ns.to_owned(), id.to_owned())],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await?;
        Ok(index)
    }

    /// Create a volume through its plugin's controller (CreateVolume), then register
    /// it. Refused when a volume of that id exists.
    pub async fn create_csi_volume(&self, mut v: CsiVolume) -> Result<Index, ServerError> {
        check_volume(&v)?;
        if !v.external_id.is_empty() {
            return Err(ServerError::Invalid(
                "external_id: a created volume gets its id from the plugin (use `volume register` for an existing one)".into(),
            ));
        }
        self.check_namespace(&v.namespace)?;
        if self.core.read().csi_volume(&v.namespace, &v.id).is_some() {
            return Err(ServerError::Conflict(format!(
                "volume {:?} already exists in namespace {:?}",
                v.id, v.namespace
            )));
        }
        let node =
            self.controller_node(&v.plugin_id, |c| c.create_delete, "CREATE_DELETE_VOLUME")?;
        let call = ControllerCall::Create {
            plugin_id: v.plugin_id.clone(),
            name: plugin_volume_name(&v),
            capacity_min: v.capacity_min,
            capacity_max: v.capacity_max,
            capabilities: v.capabilities.clone(),
            mount_options: v.mount_options.clone(),
            parameters: v.parameters.clone(),
        };
        match self.controller_call(&node, call).await? {
            ControllerOutcome::Created {
                external_id,
                capacity,
                context,
            } => {
                v.external_id = external_id;
                v.capacity = capacity;
                v.context = context;
            }
            other => {
                return Err(ServerError::Unavailable(format!(
                    "the controller answered {other:?} to CreateVolume"
                )));
            }
        }
        v.created = true;
        v.provider = self.csi_provider(&v.plugin_id);
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, _now| {
                if st.csi_volume(&v.namespace, &v.id).is_some() {
                    return Err(ServerError::Conflict(format!(
                        "volume {:?} was registered meanwhile",
                        v.id
                    )));
                }
                refuse_shared_storage(st, &v)?;
                v.create_index = index;
                v.modify_index = index;
                Ok((
                    Batch {
                        csi_volumes: vec![v.clone()],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await?;
        Ok(index)
    }

    /// Delete a volume through its plugin's controller (DeleteVolume), then forget it.
    /// Refused while claimed.
    pub async fn delete_csi_volume(&self, ns: &str, id: &str) -> Result<Index, ServerError> {
        let (v, claims) = self
            .csi_volume(ns, id)
            .ok_or_else(|| ServerError::NotFound(format!("volume {id:?} not found")))?;
        refuse_claimed(&claims, id, "deleted")?;
        let node =
            self.controller_node(&v.plugin_id, |c| c.create_delete, "CREATE_DELETE_VOLUME")?;
        let call = ControllerCall::Delete {
            plugin_id: v.plugin_id.clone(),
            external_id: v.external_id.clone(),
        };
        match self.controller_call(&node, call).await? {
            ControllerOutcome::Deleted => {}
            other => {
                return Err(ServerError::Unavailable(format!(
                    "the controller answered {other:?} to DeleteVolume"
                )));
            }
        }
        self.deregister_csi_volume(ns, id).await
    }

    /// Node `node_id`'s own controller call: ControllerPublishVolume or
    /// ControllerUnpublishVolume of a volume of a plugin the node runs, through a
    /// healthy controller that publishes; `NotRequired` when the plugin's controllers
    /// do not (or it has none). A failed call is the outcome `Failed`.
    pub async fn csi_node_controller_call(
        &self,
        node_id: &str,
        call: ControllerCall,
    ) -> Result<ControllerOutcome, ServerError> {
        let (plugin_id, external_id, plugin_node_id, publish) = match &call {
            ControllerCall::Publish {
                plugin_id,
                external_id,
                node_id,
                ..
            } => (
                plugin_id.clone(),
                external_id.clone(),
                node_id.clone(),
                true,
            ),
            ControllerCall::Unpublish {
                plugin_id,
                external_id,
                node_id,
            } => (
                plugin_id.clone(),
                external_id.clone(),
                node_id.clone(),
                false,
            ),
            _ => {
                return Err(ServerError::Invalid(
                    "call_json: a node may ask for publish or unpublish only".into(),
                ));
            }
        };
        {
            let st = self.core.read();
            // A node acts for itself only: the plugin's id of the node is the one its
            // node plugin fingerprinted, and it publishes only volumes its own
            // allocations claim.
            let known = crate::scheduler::StateView::node(&*st, node_id)
                .and_then(|n| n.csi_plugins.get(&plugin_id))
                .filter(|f| f.plugin_type.is_node())
                .map(|f| f.node_id.clone());
            match known {
                None => {
                    return Err(ServerError::Denied(format!(
                        "node {node_id} runs no node plugin {plugin_id:?}"
                    )));
                }
                Some(id) if id != plugin_node_id => {
                    return Err(ServerError::Denied(format!(
                        "node {node_id} is {id:?} to plugin {plugin_id:?}, not {plugin_node_id:?}"
                    )));
                }
                Some(_) => {}
            }
            if publish {
                let claimed = st.csi_volumes("*").any(|v| {
                    v.plugin_id == plugin_id
                        && v.external_id == external_id
                        && st
                            .csi_claims(&v.namespace, &v.id)
                            .iter()
                            .any(|c| c.node_id == node_id)
                });
                if !claimed {
                    return Err(ServerError::Denied(format!(
                        "no allocation of node {node_id} claims volume {external_id:?} of plugin {plugin_id:?}"
                    )));
                }
            }
            let publishes = crate::scheduler::StateView::nodes(&*st)
                .into_iter()
                .any(|n| {
                    n.csi_plugins.get(&plugin_id).is_some_and(|f| {
                        f.plugin_type.is_controller()
                            && f.controller.as_ref().is_some_and(|c| c.publish_unpublish)
                    })
                });
            if !publishes {
                return Ok(ControllerOutcome::NotRequired);
            }
        }
        let node = self.controller_node(
            &plugin_id,
            |c| c.publish_unpublish,
            "PUBLISH_UNPUBLISH_VOLUME",
        )?;
        match self.controller_call(&node, call).await {
            Ok(o) => Ok(o),
            Err(ServerError::Invalid(error)) => Ok(ControllerOutcome::Failed { error }),
            Err(e) => Err(e),
        }
    }

    fn check_namespace(&self, ns: &str) -> Result<(), ServerError> {
        if self.core.read().namespace(ns).is_none() {
            return Err(ServerError::Invalid(format!(
                "namespace: {ns:?} does not exist"
            )));
        }
        Ok(())
    }

    /// The provider name some node fingerprinted for `plugin_id`.
    fn csi_provider(&self, plugin_id: &str) -> String {
        let st = self.core.read();
        crate::scheduler::StateView::nodes(&*st)
            .into_iter()
            .find_map(|n| n.csi_plugins.get(plugin_id))
            .map(|f| f.provider.clone())
            .unwrap_or_default()
    }

    /// A ready node whose controller of `plugin_id` is healthy and can `what`.
    fn controller_node(
        &self,
        plugin_id: &str,
        can: fn(&drover_server_api::csi::CsiControllerCapabilities) -> bool,
        what: &str,
    ) -> Result<String, ServerError> {
        let st = self.core.read();
        let mut seen = false;
        for n in crate::scheduler::StateView::nodes(&*st) {
            let Some(f) = n.csi_plugins.get(plugin_id) else {
                continue;
            };
            if !f.plugin_type.is_controller() || n.status == NodeStatus::Down {
                continue;
            }
            seen = true;
            if f.healthy && f.controller.as_ref().is_some_and(can) {
                return Ok(n.id.clone());
            }
        }
        Err(ServerError::Invalid(if seen {
            format!("no healthy controller of CSI plugin {plugin_id:?} that supports {what}")
        } else {
            format!("no node runs a controller of CSI plugin {plugin_id:?}")
        }))
    }

    async fn controller_call(
        &self,
        node_id: &str,
        call: ControllerCall,
    ) -> Result<ControllerOutcome, ServerError> {
        let (id, rx) = self.csi_queue.push(node_id, call)?;
        let outcome = match tokio::time::timeout(CONTROLLER_CALL_TIMEOUT, rx).await {
            Ok(Ok(o)) => o,
            Ok(Err(_)) | Err(_) => {
                self.csi_queue.cancel(&id);
                return Err(ServerError::Unavailable(format!(
                    "the CSI controller on node {node_id} did not answer within \
                     {CONTROLLER_CALL_TIMEOUT:?} (is its agent connected to this server?)"
                )));
            }
        };
        match outcome {
            ControllerOutcome::Failed { error } => Err(ServerError::Invalid(format!(
                "CSI controller on node {node_id}: {error}"
            ))),
            o => Ok(o),
        }
    }
}

fn refuse_claimed(claims: &[CsiClaim], id: &str, what: &str) -> Result<(), ServerError> {
    if claims.is_empty() {
        return Ok(());
    }
    let allocs: Vec<&str> = claims.iter().map(|c| c.alloc_id.as_str()).collect();
    Err(ServerError::Conflict(format!(
        "volume {id:?} is in use by {} allocation(s) ({}): it cannot be {what} until they stop",
        claims.len(),
        allocs.join(", ")
    )))
}

fn check_volume(v: &CsiVolume) -> Result<(), ServerError> {
    let bad = |field: &str, m: &str| Err(ServerError::Invalid(format!("{field}: {m}")));
    if v.id.is_empty() || v.id.contains('/') || v.id.len() > 256 {
        return bad("id", "1 to 256 bytes without '/'");
    }
    if v.plugin_id.is_empty() {
        return bad("plugin_id", "missing");
    }
    if v.capabilities.is_empty() {
        return bad(
            "capability",
            "at least one capability { access_mode, attachment_mode }",
        );
    }
    if v.capabilities.len() > MAX_VOLUME_ENTRIES
        || v.parameters.len() > MAX_VOLUME_ENTRIES
        || v.context.len() > MAX_VOLUME_ENTRIES
    {
        return bad(
            "capability/parameters/context",
            &format!("at most {MAX_VOLUME_ENTRIES} entries each"),
        );
    }
    let big = |m: &BTreeMap<String, String>| m.iter().any(|(k, v)| k.len() + v.len() > 4096);
    if big(&v.parameters) || big(&v.context) {
        return bad("parameters/context", "an entry is longer than 4096 bytes");
    }
    if v.name.len() > 256 {
        return bad("name", "at most 256 bytes");
    }
    if v.plugin_id.len() > 128 {
        return bad("plugin_id", "at most 128 bytes");
    }
    if v.external_id.len() > 1024 {
        return bad("external_id", "at most 1024 bytes");
    }
    if v.capacity_min < 0 || v.capacity_max < 0 {
        return bad("capacity_min/capacity_max", "not negative");
    }
    if v.capacity_max > 0 && v.capacity_min > v.capacity_max {
        return bad("capacity_min", "above capacity_max");
    }
    let flags = &v.mount_options.mount_flags;
    if flags.len() > MAX_VOLUME_ENTRIES
        || flags.iter().any(|f| f.len() > 256)
        || v.mount_options.fs_type.len() > 64
    {
        return bad(
            "mount_options",
            &format!("at most {MAX_VOLUME_ENTRIES} mount_flags of 256 bytes, fs_type 64 bytes"),
        );
    }
    Ok(())
}

/// The name a volume is created under in its plugin: `<namespace>.<name>`. CSI's
/// CreateVolume is idempotent by name (a second call with a name in use returns that
/// volume), so a bare name would let a volume of one namespace be created as another
/// namespace's storage; a namespace's name holds no `.`, so these never meet.
fn plugin_volume_name(v: &CsiVolume) -> String {
    format!("{}.{}", v.namespace, v.name)
}

/// Refuse a volume whose plugin volume another volume (of any namespace) already is:
/// two records of one storage would each count claims on their own, and a namespace
/// could reach another's data.
fn refuse_shared_storage(st: &crate::state::State, v: &CsiVolume) -> Result<(), ServerError> {
    match st.csi_volume_with_external_id(&v.plugin_id, &v.external_id, &v.namespace, &v.id) {
        Some(other) => Err(ServerError::Conflict(format!(
            "plugin {:?}'s volume {:?} is already registered as volume {:?} in namespace {:?}",
            v.plugin_id, v.external_id, other.id, other.namespace
        ))),
        None => Ok(()),
    }
}
