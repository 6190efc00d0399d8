//! What the leader's queues carry: plans for the plan applier (with their verdict,
//! [`PlanResult`]) and client status reports for the client update batcher.

use std::collections::BTreeMap;

use drover_server_api::{AllocClientUpdate, Evaluation, Index, PlacementFailure};

use crate::scheduler::Plan;

/// What the worker writes for its evaluation once its plan committed completely.
#[derive(Debug, Clone)]
pub(crate) struct EvalFinish {
    pub eval: Evaluation,
    pub failed_tg_allocs: BTreeMap<String, PlacementFailure>,
    pub queued_allocations: BTreeMap<String, u32>,
    /// A failed allocation waits for its reschedule delay until then (unix
    /// nanoseconds): a follow-up evaluation is made, due at that time.
    pub follow_up_at: Option<i64>,
}

/// A plan for the applier, and what to write for its evaluation once it committed.
pub(crate) struct PlanRequest {
    pub plan: Plan,
    pub finish: Option<EvalFinish>,
}

/// The applier's verdict on a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanResult {
    /// The index of the commit (the current index if nothing was committed).
    pub index: Index,
    /// Allocations created.
    pub placed: usize,
    /// Allocations stopped (or marked lost).
    pub stopped: usize,
    /// Allocations refused because they no longer fit or their node cannot take them.
    pub refused: usize,
    /// Nodes that refused some of their placements, with why.
    pub refused_nodes: BTreeMap<String, String>,
    /// The whole plan was refused: it was made for an older version of the job.
    pub stale_job: bool,
}

impl PlanResult {
    /// Everything in the plan was committed.
    pub fn fully_committed(&self) -> bool {
        self.refused == 0 && !self.stale_job
    }
}

/// A client's status reports waiting to be committed.
pub(crate) struct UpdateRequest {
    pub node_id: String,
    pub updates: Vec<AllocClientUpdate>,
}
