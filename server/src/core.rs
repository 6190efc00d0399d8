//! The shared core every part of the server works on: the configuration, the store,
//! the state in memory with its index, the commit lock and the shutdown token. It
//! knows nothing of leadership but the fence a commit carries ([`Fence`]): the
//! leader's term (`leader/term.rs`) commits through it.
//!
//! Every change is one store transaction first (`Core::commit`), applied in memory
//! after it committed, with the transaction's revision as index; then the evaluations
//! it created go to the broker and the index watch wakes blocking queries. Only the
//! leader commits, each transaction fenced by its term; a follower's state moves with
//! the leader's commits instead (see `leader/terms.rs`).

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use drover_server_api::{EvalStatus, Evaluation, Index};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::events::EventBroker;
use crate::scheduler::SchedulerSettings;
use crate::state::evals::{gc_evals, now_nanos};
use crate::state::{Batch, State};
use crate::store::{Condition, Store};

/// What fences a leader's commits: the store refuses them once its term is over.
pub(crate) struct Fence {
    /// The term's id (for logs and errors).
    pub term: u64,
    /// The server that holds the term (for errors).
    pub holder: String,
    /// Conditions every commit of the term adds to its transaction.
    pub conditions: Vec<Condition>,
    /// Fires when the term is over; a commit the store refused fires it too.
    pub lost: CancellationToken,
    /// Fires when this server stops leading in the term (lost, or shutdown): later
    /// commits are refused before they reach the store.
    pub ended: CancellationToken,
}

/// The shared core the leader loops, the endpoints and the facade work on.
pub(crate) struct Core {
    pub config: ServerConfig,
    pub store: Arc<dyn Store>,
    state: RwLock<State>,
    pub(crate) index_tx: watch::Sender<Index>,
    /// Serialises writers: the index a batch is built for is the next store revision.
    /// A follower applying the leader's commits, and a reload, take it too.
    pub(crate) commit_lock: tokio::sync::Mutex<()>,
    pub shutdown: CancellationToken,
    /// Every commit applied here, as events (`/v1/event/stream`).
    pub(crate) events: Arc<EventBroker>,
    /// The server's metrics (`/v1/metrics`).
    pub(crate) metrics: crate::metrics::ServerMetrics,
}

impl Core {
    pub(crate) fn new(
        config: ServerConfig,
        store: Arc<dyn Store>,
        state: State,
        shutdown: CancellationToken,
    ) -> Core {
        Core {
            config,
            store,
            index_tx: watch::channel(state.index).0,
            state: RwLock::new(state),
            commit_lock: tokio::sync::Mutex::new(()),
            shutdown,
            events: Arc::new(EventBroker::default()),
            metrics: crate::metrics::ServerMetrics::new(),
        }
    }

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
    /// in one store transaction fenced by `fence`, apply it, and hand its new pending
    /// evaluations (and whether capacity was freed) to `committed`, still under the
    /// commit lock. An empty batch commits nothing (the current index is returned).
    pub(crate) async fn commit<R>(
        &self,
        fence: &Fence,
        build: impl FnOnce(&State, Index, i64) -> Result<(Batch, R), ServerError>,
        committed: impl FnOnce(Vec<Evaluation>, bool),
    ) -> Result<(Index, R), ServerError> {
        let _writer = self.commit_lock.lock().await;
        if fence.ended.is_cancelled() {
            return Err(ServerError::NotLeader { leader: None });
        }
        let (batch, r, ops, index) = {
            let st = self.read();
            let index = st.index + 1;
            let (mut batch, r) = build(&st, index, now_nanos())?;
            if batch.is_empty() {
                return Ok((st.index, r));
            }
            gc_evals(&st, &mut batch);
            crate::state::services::drop_ended(&st, &mut batch);
            let ops = batch.ops(&st)?;
            (batch, r, ops, index)
        };
        // Fenced: the store refuses it once this server's term is over, whatever the
        // server believes (a paused leader resumed after its lease expired).
        let started = std::time::Instant::now();
        let outcome = self.store.txn(fence.conditions.clone(), ops).await;
        self.metrics
            .store_commit_duration
            .observe(started.elapsed().as_secs_f64());
        let outcome = outcome?;
        if !outcome.succeeded {
            tracing::warn!(
                term = fence.term,
                index,
                "the store refused a commit: this server's term is over; stepping down"
            );
            fence.lost.cancel();
            return Err(ServerError::LeadershipLost(format!(
                "term {} of {} is over (the store refused its commit at index {index}); \
                 another server leads or is being elected: retry",
                fence.term, fence.holder
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
            fence.lost.cancel();
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
        self.apply_and_publish(vec![batch], index);
        self.index_tx.send_replace(index);
        committed(enqueue, unblock);
        Ok((index, r))
    }

    /// Wait (at most `limit`) until this server's state holds what was committed at
    /// `index`: a follower that forwarded a write answers only once it can read it
    /// back, so that a client reading from the same server next sees its write.
    pub(crate) async fn wait_applied(&self, index: Index, limit: Duration) {
        let mut rx = self.index_tx.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|i| *i >= index)).await;
    }

    /// Replace the whole state with what the store holds now (a new term, a follower
    /// that fell behind the watch). The caller holds `commit_lock`.
    pub(crate) async fn reload(&self) -> Result<Index, ServerError> {
        let (kvs, revision) = self.store.range("").await?;
        let state = State::load(kvs, revision)?;
        let index = state.index;
        let before = std::mem::replace(&mut *self.write(), state).index;
        if index != before {
            // What changed in between is not known as events: readers start anew.
            self.events.reset(index);
        }
        self.index_tx.send_replace(index);
        Ok(index)
    }

    /// Apply changes the leader committed (a follower), all at once at `index`: the
    /// parts of a split transaction come together, so that no reader sees half a
    /// commit. Changes at or below the current index are already applied.
    pub(crate) fn apply_followed(&self, batches: Vec<Batch>, index: Index) -> bool {
        if index <= self.read().index {
            return false;
        }
        self.apply_and_publish(batches, index);
        self.index_tx.send_replace(index);
        true
    }

    /// Apply `batches` at `index` and publish their events, in one: the events are
    /// made against the state before the change, and published before the index
    /// moves on, so a reader woken by the index finds them.
    fn apply_and_publish(&self, batches: Vec<Batch>, index: Index) {
        let wanted = self.events.wanted();
        let events = {
            let mut st = self.write();
            let mut events = Vec::new();
            for b in batches {
                if wanted {
                    events.extend(crate::events::of_batch(&st, &b, index));
                }
                st.apply(b, index);
            }
            events
        };
        self.events.publish(index, events);
    }
}
