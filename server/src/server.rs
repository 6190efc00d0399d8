//! The server's operations: what the HTTP API and the node RPCs call.
//!
//! FOUNDATION STUB: the signatures are the contract between the API layers and the
//! scheduler core; the bodies are written on the `cluster-core` branch.

use std::sync::Arc;
use std::time::Duration;

use drover_server_api::{
    AllocClientUpdate, Allocation, ClientAllocation, Evaluation, Index, Job, JobListStub,
    JobPlanResponse, JobRegisterResponse, JobSpec, Node, NodeRegistration,
};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::store::Store;

/// A running server: state in memory, store behind it, broker, workers, plan applier
/// and heartbeat timers in the background.
pub struct Server {
    _config: ServerConfig,
}

/// A batch of a node's allocations for its client (see the `WatchAllocations` RPC).
#[derive(Debug, Clone)]
pub struct NodeAllocations {
    /// The index the batch is consistent with.
    pub index: Index,
    /// Every allocation of the node (else only the changed ones).
    pub complete: bool,
    /// The allocations, with their group specs.
    pub allocations: Vec<ClientAllocation>,
}

const STUB: &str = "not built yet";

impl Server {
    /// Load the state from `store` and start the background loops; they stop when
    /// `shutdown` fires.
    pub async fn start(
        config: ServerConfig,
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Server>, ServerError> {
        let _ = (store, shutdown);
        Ok(Arc::new(Server { _config: config }))
    }

    /// The newest committed index.
    pub fn index(&self) -> Index {
        0
    }

    /// Wait until the index is above `index` or `wait` passed; the index then.
    pub async fn wait_for_index(&self, index: Index, wait: Duration) -> Index {
        let _ = (index, wait);
        0
    }

    // --- jobs ---------------------------------------------------------------------

    /// Register a job or a new version of it, and create its evaluation. Validates the
    /// spec (`ServerError::Invalid` names the field). Re-registering an unchanged spec
    /// creates no version but still an evaluation (as `nomad job run`).
    pub async fn register_job(&self, spec: JobSpec) -> Result<JobRegisterResponse, ServerError> {
        let _ = spec;
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// What registering `spec` would do; commits nothing.
    pub fn plan_job(&self, spec: JobSpec) -> Result<JobPlanResponse, ServerError> {
        let _ = spec;
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// Stop a job (its allocations are stopped); with `purge` also forget it.
    pub async fn stop_job(
        &self,
        name: &str,
        purge: bool,
    ) -> Result<JobRegisterResponse, ServerError> {
        let _ = (name, purge);
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// Every job.
    pub fn jobs(&self) -> Vec<JobListStub> {
        Vec::new()
    }

    /// One job.
    pub fn job(&self, name: &str) -> Option<Job> {
        let _ = name;
        None
    }

    /// A job's allocations, newest first.
    pub fn job_allocations(&self, name: &str) -> Vec<Allocation> {
        let _ = name;
        Vec::new()
    }

    /// A job's evaluations, newest first.
    pub fn job_evaluations(&self, name: &str) -> Vec<Evaluation> {
        let _ = name;
        Vec::new()
    }

    // --- nodes --------------------------------------------------------------------

    /// Register or update a node; it is `ready` (or still draining). Returns the
    /// heartbeat TTL and the index.
    pub async fn register_node(
        &self,
        registration: NodeRegistration,
    ) -> Result<(Duration, Index), ServerError> {
        let _ = registration;
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// A node's heartbeat. `NotFound` for an unknown node (it must register).
    pub async fn heartbeat(&self, node_id: &str) -> Result<(Duration, Index), ServerError> {
        let _ = node_id;
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// Start or end a node's drain; `node` is an id or a unique name.
    pub async fn drain_node(&self, node: &str, enable: bool) -> Result<Index, ServerError> {
        let _ = (node, enable);
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// Every node.
    pub fn nodes(&self) -> Vec<Node> {
        Vec::new()
    }

    /// One node, by id or unique name.
    pub fn node(&self, node: &str) -> Option<Node> {
        let _ = node;
        None
    }

    /// A node's allocations, newest first.
    pub fn node_allocations(&self, node_id: &str) -> Vec<Allocation> {
        let _ = node_id;
        Vec::new()
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
        let _ = (node_id, index, wait);
        Err(ServerError::Unavailable(STUB.into()))
    }

    /// Status reports from a node's client; durable when this returns. Updates for
    /// allocations of other nodes are refused.
    pub async fn update_allocations(
        &self,
        node_id: &str,
        updates: Vec<AllocClientUpdate>,
    ) -> Result<Index, ServerError> {
        let _ = (node_id, updates);
        Err(ServerError::Unavailable(STUB.into()))
    }

    // --- allocations and evaluations ---------------------------------------------

    /// Every allocation, newest first.
    pub fn allocations(&self) -> Vec<Allocation> {
        Vec::new()
    }

    /// One allocation, by id or unique id prefix.
    pub fn allocation(&self, id: &str) -> Option<Allocation> {
        let _ = id;
        None
    }

    /// Every evaluation, newest first.
    pub fn evaluations(&self) -> Vec<Evaluation> {
        Vec::new()
    }

    /// One evaluation, by id or unique id prefix.
    pub fn evaluation(&self, id: &str) -> Option<Evaluation> {
        let _ = id;
        None
    }
}
