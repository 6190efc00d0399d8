//! Allocations on a client node: one runner per allocation drives its group's tasks
//! through the task manager, in the group lifecycle order (prestart, main + sidecars,
//! poststart, poststop), with a shared allocation directory.
//!
//! FOUNDATION STUB: the signatures are the contract between the cluster client
//! (`crate::cluster`, which talks to the servers) and the allocation runners; the
//! bodies are written on the `cluster-allocs` branch.

use std::sync::Arc;

use drover_server_api::{AllocClientUpdate, ClientAllocation};
use tokio::sync::mpsc;

use crate::state::StateStore;
use crate::tasks::TaskManager;

/// Runs the allocations the servers give this node.
pub struct AllocManager {
    _tasks: Arc<TaskManager>,
    _store: Arc<dyn StateStore>,
    _updates: mpsc::UnboundedSender<AllocClientUpdate>,
}

impl AllocManager {
    /// A manager that starts tasks through `tasks`, keeps its records in `store`, and
    /// sends every change of an allocation's client status or task states to
    /// `updates` (the cluster client batches and forwards them).
    pub fn new(
        tasks: Arc<TaskManager>,
        store: Arc<dyn StateStore>,
        updates: mpsc::UnboundedSender<AllocClientUpdate>,
    ) -> Arc<Self> {
        Arc::new(AllocManager {
            _tasks: tasks,
            _store: store,
            _updates: updates,
        })
    }

    /// Restore the allocations recorded before an agent restart (after the task
    /// manager recovered its tasks): their runners carry on without restarting tasks.
    pub async fn restore(self: &Arc<Self>) {}

    /// The server's allocations for this node. With `complete`, `allocs` is every
    /// allocation the node should know: a local one missing from it is stopped and
    /// forgotten. Else they are changes (new allocations, new desired status or job
    /// version).
    pub async fn apply(self: &Arc<Self>, allocs: Vec<ClientAllocation>, complete: bool) {
        let _ = (allocs, complete);
    }

    /// The current status of every local allocation (sent again after a reconnect).
    pub fn statuses(&self) -> Vec<AllocClientUpdate> {
        Vec::new()
    }

    /// The node-local task id of `task` in allocation `alloc_id` (`alloc logs`).
    pub fn task_id(&self, alloc_id: &str, task: &str) -> Option<String> {
        let _ = (alloc_id, task);
        None
    }
}
