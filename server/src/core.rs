//! The shared core every part of the server works on: the configuration, the store,
//! the state in memory with its index, the commit lock, and the term while this
//! server leads.
//!
//! Every change is one store transaction first (`Core::commit`), applied in memory
//! after it committed, with the transaction's revision as index; then the evaluations
//! it created go to the broker and the index watch wakes blocking queries. Only the
//! leader commits, each transaction fenced by its term; a follower's state moves with
//! the leader's commits instead (see `leader/terms.rs`).

use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use drover_server_api::{EvalStatus, Evaluation, Index};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::leader::broker::Broker;
use crate::leader::client_updates::UpdateRequest;
use crate::leader::heartbeat::Timers;
use crate::leader::plan_apply::{PlanRequest, PlanResult};
use crate::leader::{Election, ServerInfo};
use crate::scheduler::{Plan, SchedulerSettings};
use crate::state::evals::{gc_evals, now_nanos, set_eval_status};
use crate::state::{Batch, State};
use crate::store::Store;

/// How long a dequeued evaluation may go unacknowledged before it is redelivered.
pub(crate) const UNACK_TIMEOUT: Duration = Duration::from_secs(60);
/// Plans waiting for the applier; a worker waits when it is full.
pub(crate) const PLAN_QUEUE: usize = 256;

/// The term this server leads in: its fence, and the queues of its leader loops.
pub(crate) struct LeaderTerm {
    /// The term's id (for logs and `server status`).
    pub id: u64,
    /// Conditions every commit of the term adds to its transaction.
    pub fence: Vec<crate::store::Condition>,
    /// Fires when the term is over; a commit the store refused fires it too.
    pub lost: CancellationToken,
    pub plans: mpsc::Sender<PlanRequest>,
    pub updates: mpsc::Sender<UpdateRequest>,
}

/// The shared core the background loops and the facade work on.
pub(crate) struct Core {
    pub config: ServerConfig,
    pub store: Arc<dyn Store>,
    pub(crate) state: RwLock<State>,
    pub(crate) index_tx: watch::Sender<Index>,
    /// Serialises writers: the index a batch is built for is the next store revision.
    /// A follower applying the leader's commits, and a reload, take it too.
    pub(crate) commit_lock: tokio::sync::Mutex<()>,
    pub broker: Broker,
    pub timers: Mutex<Timers>,
    pub timers_changed: tokio::sync::Notify,
    pub unblock: tokio::sync::Notify,
    /// The term while this server leads; `None` while it follows.
    pub(crate) term: RwLock<Option<Arc<LeaderTerm>>>,
    /// The id of the term this server leads in, `None` while it follows.
    pub(crate) leading: watch::Sender<Option<u64>>,
    pub election: Arc<dyn Election>,
    pub me: ServerInfo,
    pub forwarder: crate::transport::forward::Forwarder,
    pub shutdown: CancellationToken,
}

impl Core {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, State> {
        // The state is only mutated by `apply`, which cannot panic halfway in a way
        // that breaks the indexes more than the panic itself; keep serving.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn settings(&self) -> SchedulerSettings {
        SchedulerSettings {
            algorithm: self.config.algorithm,
            now: now_nanos(),
        }
    }

    /// Build a batch against the current state with the index it will get, commit it
    /// in one store transaction, apply it, and hand its new pending evaluations to the
    /// broker. An empty batch commits nothing (the current index is returned).
    pub(crate) async fn commit<R>(
        &self,
        build: impl FnOnce(&State, Index, i64) -> Result<(Batch, R), ServerError>,
    ) -> Result<(Index, R), ServerError> {
        let _writer = self.commit_lock.lock().await;
        let Some(term) = self.current_term() else {
            return Err(self.not_leader());
        };
        let (batch, r, ops, index) = {
            let st = self.read();
            let index = st.index + 1;
            let (mut batch, r) = build(&st, index, now_nanos())?;
            if batch.is_empty() {
                return Ok((st.index, r));
            }
            gc_evals(&st, &mut batch);
            let ops = batch.ops(&st)?;
            (batch, r, ops, index)
        };
        // Fenced: the store refuses it once this server's term is over, whatever the
        // server believes (a paused leader resumed after its lease expired).
        let outcome = self.store.txn(term.fence.clone(), ops).await?;
        if !outcome.succeeded {
            tracing::warn!(
                term = term.id,
                index,
                "the store refused a commit: this server's term is over; stepping down"
            );
            term.lost.cancel();
            return Err(ServerError::LeadershipLost(format!(
                "term {} of {} is over (the store refused its commit at index {index}); \
                 another server leads or is being elected: retry",
                term.id, self.me.name
            )));
        }
        if outcome.revision != index {
            // Only the leader writes: another revision means another writer, or a
            // commit whose answer was lost. The state in memory cannot be trusted any
            // more: step down, which reloads it from the store.
            tracing::error!(
                expected = index,
                got = outcome.revision,
                "the store's revision moved under the server; reloading the state"
            );
            term.lost.cancel();
            return Err(ServerError::Unavailable(format!(
                "the state store's revision is {}, expected {index}: another writer uses it",
                outcome.revision
            )));
        }
        let enqueue: Vec<Evaluation> = batch
            .evals
            .iter()
            .filter(|e| e.status == EvalStatus::Pending && e.create_index == index)
            .cloned()
            .collect();
        let unblock = batch.unblock;
        self.write().apply(batch, index);
        self.index_tx.send_replace(index);
        for e in enqueue {
            self.broker.enqueue(e);
        }
        if unblock {
            self.unblock.notify_one();
        }
        Ok((index, r))
    }

    /// Wait (at most `limit`) until this server's state holds what was committed at
    /// `index`: a follower that forwarded a write answers only once it can read it
    /// back, so that a client reading from the same server next sees its write.
    pub(crate) async fn wait_applied(&self, index: Index, limit: Duration) {
        let mut rx = self.index_tx.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|i| *i >= index)).await;
    }

    /// The term this server leads in, if it leads.
    pub(crate) fn current_term(&self) -> Option<Arc<LeaderTerm>> {
        self.term.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether this server leads now.
    pub(crate) fn is_leader(&self) -> bool {
        self.term
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The error for a write on a follower, naming the leader it knows of.
    pub(crate) fn not_leader(&self) -> ServerError {
        ServerError::NotLeader {
            leader: self
                .forwarder
                .cached_leader()
                .map(|l| format!("{} ({})", l.name, l.rpc_addr)),
        }
    }

    /// Replace the whole state with what the store holds now (a new term, a follower
    /// that fell behind the watch). The caller holds `commit_lock`.
    pub(crate) async fn reload(&self) -> Result<Index, ServerError> {
        let (kvs, revision) = self.store.range("").await?;
        let state = State::load(kvs, revision)?;
        let index = state.index;
        *self.write() = state;
        self.index_tx.send_replace(index);
        Ok(index)
    }

    /// Apply changes the leader committed (a follower), all at once at `index`: the
    /// parts of a split transaction come together, so that no reader sees half a
    /// commit. Changes at or below the current index are already applied.
    pub(crate) fn apply_followed(&self, batches: Vec<Batch>, index: Index) -> bool {
        {
            let mut st = self.write();
            if index <= st.index {
                return false;
            }
            for b in batches {
                st.apply(b, index);
            }
        }
        self.index_tx.send_replace(index);
        true
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

impl Core {
    pub(crate) async fn submit_plan(
        &self,
        plan: Plan,
        finish: Option<crate::leader::plan_apply::EvalFinish>,
    ) -> Result<PlanResult, ServerError> {
        let Some(term) = self.current_term() else {
            return Err(self.not_leader());
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        term.plans
            .send(PlanRequest {
                plan,
                finish,
                reply: tx,
            })
            .await
            .map_err(|_| self.term_ended("the plan applier stopped"))?;
        rx.await
            .map_err(|_| self.term_ended("the plan applier stopped"))?
    }

    /// Why a leader loop's queue closed: shutdown, or the term ended.
    pub(crate) fn term_ended(&self, what: &str) -> ServerError {
        if self.shutdown.is_cancelled() {
            ServerError::Unavailable(format!("{what}: the server is shutting down"))
        } else {
            ServerError::Unavailable(format!(
                "{what}: this server stopped leading; retry (writes go to the leader)"
            ))
        }
    }
}
