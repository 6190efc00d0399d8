//! One leadership term: its fence, and what the leader owns for it — the evaluation
//! broker, the heartbeat timers, the plan queue and the client update queue. A new
//! term starts them empty; when the term ends they go with it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use drover_server_api::{EvalStatus, Evaluation, Index};
use tokio::sync::{Notify, mpsc};

use crate::core::{Core, Fence};
use crate::error::ServerError;
use crate::leader::batcher::{self, Queued};
use crate::leader::broker::Broker;
use crate::leader::requests::{EvalFinish, PlanRequest, PlanResult, UpdateRequest};
use crate::leader::timers::Timers;
use crate::scheduler::Plan;
use crate::state::evals::set_eval_status;
use crate::state::{Batch, State};

/// How long a dequeued evaluation may go unacknowledged before it is redelivered.
pub(crate) const UNACK_TIMEOUT: Duration = Duration::from_secs(60);
/// Plans (and client update requests) waiting for their loop; a sender waits when
/// the queue is full.
pub(crate) const PLAN_QUEUE: usize = 256;

/// The term this server leads in, and what its leader loops share.
pub(crate) struct LeaderTerm {
    pub core: Arc<Core>,
    pub fence: Fence,
    pub broker: Broker,
    pub timers: Mutex<Timers>,
    pub timers_changed: Notify,
    /// Capacity was freed: blocked evaluations may fit now.
    pub unblock: Notify,
    pub plans: mpsc::Sender<Queued<PlanRequest, PlanResult>>,
    pub updates: mpsc::Sender<Queued<UpdateRequest, Index>>,
}

/// The receiving ends of a term's queues, for its loops.
pub(crate) struct TermQueues {
    pub plans: mpsc::Receiver<Queued<PlanRequest, PlanResult>>,
    pub updates: mpsc::Receiver<Queued<UpdateRequest, Index>>,
}

impl LeaderTerm {
    pub(crate) fn new(core: Arc<Core>, fence: Fence) -> (LeaderTerm, TermQueues) {
        let (plans, plans_rx) = mpsc::channel(PLAN_QUEUE);
        let (updates, updates_rx) = mpsc::channel(PLAN_QUEUE);
        let term = LeaderTerm {
            broker: Broker::new(core.config.eval_delivery_limit, UNACK_TIMEOUT),
            core,
            fence,
            timers: Mutex::new(Timers::default()),
            timers_changed: Notify::new(),
            unblock: Notify::new(),
            plans,
            updates,
        };
        (
            term,
            TermQueues {
                plans: plans_rx,
                updates: updates_rx,
            },
        )
    }

    /// The term's id.
    pub(crate) fn id(&self) -> u64 {
        self.fence.term
    }

    /// Commit a batch fenced by this term ([`Core::commit`]); its new pending
    /// evaluations go to this term's broker.
    pub(crate) async fn commit<R>(
        &self,
        build: impl FnOnce(&State, Index, i64) -> Result<(Batch, R), ServerError>,
    ) -> Result<(Index, R), ServerError> {
        self.core
            .commit(&self.fence, build, |pending, unblock| {
                for e in pending {
                    self.broker.enqueue(e);
                }
                if unblock {
                    self.unblock.notify_one();
                }
            })
            .await
    }

    pub(crate) fn timers(&self) -> MutexGuard<'_, Timers> {
        self.timers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Give `node_id` a full heartbeat window from now.
    pub(crate) fn arm(&self, node_id: &str) {
        let config = &self.core.config;
        let deadline = Instant::now() + config.heartbeat_ttl + config.heartbeat_grace;
        self.timers().reset(node_id, deadline);
        self.timers_changed.notify_one();
    }

    /// Submit a plan to the plan applier and wait for its verdict.
    pub(crate) async fn submit_plan(
        &self,
        plan: Plan,
        finish: Option<EvalFinish>,
    ) -> Result<PlanResult, ServerError> {
        batcher::submit(&self.plans, PlanRequest { plan, finish })
            .await
            .unwrap_or_else(|| Err(self.ended("the plan applier stopped")))
    }

    /// Submit a client's status reports to the batcher and wait until they are
    /// committed.
    pub(crate) async fn submit_updates(
        &self,
        request: UpdateRequest,
    ) -> Result<Index, ServerError> {
        batcher::submit(&self.updates, request)
            .await
            .unwrap_or_else(|| Err(self.ended("allocation updates not committed")))
    }

    /// Why a leader loop's queue closed: shutdown, or the term ended.
    pub(crate) fn ended(&self, what: &str) -> ServerError {
        if self.core.shutdown.is_cancelled() {
            ServerError::Unavailable(format!("{what}: the server is shutting down"))
        } else {
            ServerError::Unavailable(format!(
                "{what}: this server stopped leading; retry (writes go to the leader)"
            ))
        }
    }

    /// Record an evaluation the broker gave up on.
    pub(crate) async fn fail_eval(&self, eval: &Evaluation, why: String) {
        let id = eval.id.clone();
        let r = self
            .commit(|st, index, now| {
                let mut b = Batch::default();
                let current = st.eval(&id).unwrap_or(eval);
                b.evals.push(set_eval_status(
                    current,
                    EvalStatus::Failed,
                    why,
                    index,
                    now,
                ));
                Ok((b, ()))
            })
            .await;
        if let Err(e) = r {
            tracing::error!(eval = %id, "could not record the evaluation as failed: {e}");
        }
    }
}
