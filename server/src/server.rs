//! The server's operations: what the HTTP API and the node RPCs call.
//!
//! Every change is one store transaction first (`Core::commit`), applied in memory
//! after it committed, with the transaction's revision as index; then the evaluations
//! it created go to the broker and the index watch wakes blocking queries. Only the
//! leader commits, each transaction fenced by its term; a follower's state moves with
//! the leader's commits instead (see `ha.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use drover_server_api::{
    AllocClientUpdate, Allocation, ClientAllocation, ClientStatus, DesiredStatus, EvalStatus,
    EvalTrigger, Evaluation, GroupPlanSummary, GroupSummary, Index, Job, JobListStub,
    JobPlanResponse, JobRegisterResponse, JobSpec, JobStatus, JobType, Node, NodeRegistration,
    NodeStatus,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::heartbeat::Timers;
use crate::leader::{Election, ServerInfo, SoleLeader};
use crate::plan::{PlanRequest, PlanResult};
use crate::scheduler::{self, Plan, SchedulerSettings};
use crate::state::{Batch, KEPT_VERSIONS, Overlay, State};
use crate::store::Store;

/// Evaluations kept per job; older terminal ones are deleted with the commit that adds
/// a new one, so the state does not grow with every evaluation ever made.
pub(crate) const MAX_EVALS_PER_JOB: usize = 64;
/// Client status updates accepted in one call.
pub const MAX_CLIENT_UPDATES: usize = 10_000;
/// An allocation's `client_description`, and a task state's `message`, are cut to this
/// many bytes: they are for people, and a longer one is kept, not refused, so that one
/// verbose driver error does not cost a node its other reports.
pub const MAX_CLIENT_TEXT_BYTES: usize = 4096;
/// Longest `task_id`, `started_at` or `finished_at` of a reported task state (longer
/// is refused: these are identifiers and timestamps, not prose).
pub const MAX_TASK_FIELD_BYTES: usize = 256;
/// How long a dequeued evaluation may go unacknowledged before it is redelivered.
pub(crate) const UNACK_TIMEOUT: Duration = Duration::from_secs(60);
/// Plans waiting for the applier; a worker waits when it is full.
pub(crate) const PLAN_QUEUE: usize = 256;

/// A running server: state in memory, store behind it, broker, workers, plan applier
/// and heartbeat timers in the background.
pub struct Server {
    core: Arc<Core>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// `servers_status`'s last answer and when: its election calls (leader, members,
    /// the leader's term) are made at most once per [`STATUS_CACHE`], and one at a
    /// time (callers wait on the lock and take the fresh answer); the endpoints'
    /// health is asked every time.
    status_cache:
        tokio::sync::Mutex<Option<(std::time::Instant, drover_server_api::ServersStatus)>>,
}

/// How long a `/v1/status/servers` answer is reused.
const STATUS_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

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

/// Cheap counters of the server's state (for benchmarks and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// The newest committed index.
    pub index: Index,
    /// Jobs.
    pub jobs: usize,
    /// Nodes.
    pub nodes: usize,
    /// Allocations, terminal ones included.
    pub allocations: usize,
    /// Evaluations held by the broker (ready, waiting or in a worker).
    pub evaluations_in_broker: usize,
    /// Evaluations waiting for their `wait_until` (follow-ups of failed allocations
    /// waiting for their reschedule delay).
    pub delayed_evaluations: usize,
    /// Blocked evaluations.
    pub blocked_evaluations: usize,
}

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
    state: RwLock<State>,
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
    pub forwarder: crate::forward::Forwarder,
    pub shutdown: CancellationToken,
}

pub(crate) fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A new pending evaluation of `job`.
pub(crate) fn new_eval(job: &Job, trigger: EvalTrigger, index: Index, now: i64) -> Evaluation {
    Evaluation {
        wait_until: None,
        id: uuid::Uuid::new_v4().to_string(),
        job_name: job.spec.name.clone(),
        job_type: job.spec.job_type,
        priority: job.spec.priority,
        triggered_by: trigger,
        status: EvalStatus::Pending,
        status_description: String::new(),
        node_id: None,
        failed_tg_allocs: BTreeMap::new(),
        queued_allocations: BTreeMap::new(),
        blocked_eval: None,
        previous_eval: None,
        job_modify_index: job.job_modify_index,
        create_index: index,
        modify_index: index,
        create_time: now,
        modify_time: now,
    }
}

/// `eval` with a new status, stamped at `index`.
pub(crate) fn set_eval_status(
    eval: &Evaluation,
    status: EvalStatus,
    description: String,
    index: Index,
    now: i64,
) -> Evaluation {
    let mut e = eval.clone();
    e.status = status;
    e.status_description = description;
    e.modify_index = index;
    e.modify_time = now;
    e
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

/// Delete the oldest terminal evaluations of jobs that get a new one and hold more
/// than [`MAX_EVALS_PER_JOB`].
fn gc_evals(st: &State, batch: &mut Batch) {
    let mut jobs: BTreeSet<&str> = BTreeSet::new();
    for e in &batch.evals {
        if st.eval(&e.id).is_none() {
            jobs.insert(&e.job_name);
        }
    }
    let keep: std::collections::HashSet<&str> = batch.evals.iter().map(|e| e.id.as_str()).collect();
    let mut drop = Vec::new();
    for job in jobs {
        let evals: Vec<&Evaluation> = st.evals_of_job(job).collect();
        if evals.len() < MAX_EVALS_PER_JOB {
            continue;
        }
        let excess = evals.len() + 1 - MAX_EVALS_PER_JOB;
        drop.extend(
            evals
                .iter()
                .filter(|e| {
                    matches!(
                        e.status,
                        EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled
                    ) && !keep.contains(e.id.as_str())
                })
                .take(excess)
                .map(|e| e.id.clone()),
        );
    }
    batch.drop_evals.extend(drop);
}

/// The same checks as the CLI's (`drover_server_api::validate`): a job refused here
/// names the field (`group[0].task[1].resources.memory_mb: ...`).
fn validate_spec(spec: &JobSpec) -> Result<(), ServerError> {
    drover_server_api::validate::validate(spec).map_err(|e| ServerError::Invalid(e.to_string()))
}

/// A job's status, derived from its allocations and evaluations.
fn job_status(st: &State, job: &Job) -> JobStatus {
    let mut any = false;
    for a in st.allocs_of_job(&job.spec.name) {
        if !a.is_terminal() {
            return JobStatus::Running;
        }
        any = true;
    }
    if job.stop {
        return JobStatus::Dead;
    }
    let waiting = st.blocked_eval(&job.spec.name).is_some()
        || st
            .evals_of_job(&job.spec.name)
            .any(|e| e.status == EvalStatus::Pending);
    if job.spec.job_type == JobType::Batch && any && !waiting {
        return JobStatus::Dead;
    }
    JobStatus::Pending
}

fn job_with_status(st: &State, job: &Job) -> Job {
    let mut j = job.clone();
    j.status = job_status(st, job);
    j
}

fn newest_first<T>(v: &mut [T], key: impl Fn(&T) -> (Index, &str)) {
    v.sort_by(|a, b| {
        let (ia, ida) = key(a);
        let (ib, idb) = key(b);
        ib.cmp(&ia).then_with(|| ida.cmp(idb))
    });
}

/// The one item whose id is `id` or starts with `id` (a unique prefix).
fn by_id_or_prefix<'a, T>(
    exact: Option<&'a T>,
    all: impl Iterator<Item = &'a T>,
    id_of: impl Fn(&T) -> &str,
    id: &str,
) -> Option<&'a T> {
    if exact.is_some() {
        return exact;
    }
    if id.is_empty() {
        return None;
    }
    let mut found = None;
    for x in all {
        if id_of(x).starts_with(id) {
            if found.is_some() {
                return None;
            }
            found = Some(x);
        }
    }
    found
}

impl Server {
    /// Load the state from `store` and start the background loops; they stop when
    /// `shutdown` fires. The one server on its store leads at once ([`SoleLeader`]):
    /// this returns once it does.
    pub async fn start(
        config: ServerConfig,
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Server>, ServerError> {
        let me = ServerInfo {
            name: "local".into(),
            rpc_addr: String::new(),
            http_addr: String::new(),
            tls: false,
            version: env!("CARGO_PKG_VERSION").into(),
            started: ServerInfo::now(),
        };
        let server =
            Server::start_with(config, store, Arc::new(SoleLeader::default()), me, shutdown)
                .await?;
        server.wait_leading().await;
        Ok(server)
    }

    /// Load the state from `store` and run as one of the servers `election` elects
    /// among: campaign, lead while elected (broker, workers, plan applier, heartbeat
    /// timers, blocked and delayed evaluations, garbage collection), follow the
    /// leader's commits otherwise, and keep `me` registered. Returns once the state is
    /// loaded (leading or not); everything stops when `shutdown` fires.
    pub async fn start_with(
        config: ServerConfig,
        store: Arc<dyn Store>,
        election: Arc<dyn Election>,
        me: ServerInfo,
        shutdown: CancellationToken,
    ) -> Result<Arc<Server>, ServerError> {
        let (kvs, revision) = store.range("").await?;
        let state = State::load(kvs, revision)?;
        let forwarder = crate::forward::Forwarder::new(&config, election.clone(), me.clone())?;
        let core = Arc::new(Core {
            broker: Broker::new(config.eval_delivery_limit, UNACK_TIMEOUT),
            config,
            store,
            index_tx: watch::channel(state.index).0,
            state: RwLock::new(state),
            commit_lock: tokio::sync::Mutex::new(()),
            timers: Mutex::new(Timers::default()),
            timers_changed: tokio::sync::Notify::new(),
            unblock: tokio::sync::Notify::new(),
            term: RwLock::new(None),
            leading: watch::channel(None).0,
            election,
            me,
            forwarder,
            shutdown,
        });
        {
            let st = core.read();
            tracing::info!(
                server = %core.me.name,
                index = st.index,
                nodes = st.all_nodes().count(),
                jobs = st.jobs().count(),
                "server state loaded"
            );
        }
        let tasks = vec![
            tokio::spawn(crate::ha::run(core.clone())),
            tokio::spawn(crate::ha::keep_registered(core.clone())),
        ];
        Ok(Arc::new(Server {
            core,
            tasks: Mutex::new(tasks),
            status_cache: tokio::sync::Mutex::new(None),
        }))
    }

    /// Wait until this server leads (or shuts down).
    pub async fn wait_leading(&self) {
        let mut rx = self.core.leading.subscribe();
        tokio::select! {
            _ = rx.wait_for(Option::is_some) => {}
            () = self.core.shutdown.cancelled() => {}
        }
    }

    /// The id of the term this server leads in; `None` while it follows.
    pub fn leading(&self) -> Option<u64> {
        *self.core.leading.borrow()
    }

    /// This server as the others see it.
    pub fn info(&self) -> &ServerInfo {
        &self.core.me
    }

    /// Wait (at most `limit`) until this server's state holds the commit at `index`.
    pub async fn wait_applied(&self, index: Index, limit: Duration) {
        self.core.wait_applied(index, limit).await;
    }

    /// Whether this server leads now (writes are made here, not forwarded).
    pub fn is_leader(&self) -> bool {
        self.core.is_leader()
    }

    /// The leader as the store says (`None`: none elected at the moment).
    pub async fn leader(&self) -> Result<Option<ServerInfo>, ServerError> {
        if self.core.is_leader() {
            return Ok(Some(self.core.me.clone()));
        }
        Ok(self.core.election.leader().await?)
    }

    /// An HTTP request for the leader (a write reaching a follower).
    pub(crate) async fn forward_http(
        &self,
        request: drover_proto::drover::cluster::v1::ForwardRequest,
    ) -> crate::forward::Forwarded<axum::response::Response> {
        self.core.forwarder.http(&self.core, request).await
    }

    /// A node RPC for the leader (see [`crate::forward::Forwarder::node_call`]).
    pub(crate) async fn forward_node<R>(
        &self,
        call: impl Fn(
            drover_proto::drover::cluster::v1::node_client::NodeClient<tonic::transport::Channel>,
            tonic::Request<()>,
        ) -> crate::store::BoxFuture<'static, Result<R, tonic::Status>>,
    ) -> crate::forward::Forwarded<Result<R, tonic::Status>> {
        let fwd = &self.core.forwarder;
        self.core
            .forwarder
            .node_call(&self.core, |client| call(client, fwd.outgoing_node(())))
            .await
    }

    /// This server's term, when it leads (`GET /v1/status/leader`).
    pub fn leader_status(&self) -> Result<drover_server_api::LeaderStatus, ServerError> {
        match self.core.current_term() {
            Some(t) => Ok(drover_server_api::LeaderStatus {
                name: self.core.me.name.clone(),
                term: t.id,
            }),
            None => Err(self.core.not_leader()),
        }
    }

    /// The cluster's servers, its leader and its store (`GET /v1/status/servers`).
    /// What the store cannot tell (it is unreachable) is left out: no leader, no
    /// servers, and the endpoints' health says why.
    pub async fn servers_status(&self) -> drover_server_api::ServersStatus {
        let mut cache = self.status_cache.lock().await;
        if let Some((at, status)) = &*cache
            && at.elapsed() < STATUS_CACHE
        {
            let mut status = status.clone();
            // The endpoints' health is always asked anew: an etcd that just went
            // down must show as down.
            status.store.endpoints = self.store_health().await;
            return status;
        }
        let status = self.servers_status_now().await;
        *cache = Some((std::time::Instant::now(), status.clone()));
        status
    }

    async fn store_health(&self) -> Vec<drover_server_api::StoreEndpointHealth> {
        self.core.store.health().await
    }

    async fn servers_status_now(&self) -> drover_server_api::ServersStatus {
        let core = &self.core;
        let leader = match self.leader_status() {
            Ok(me) => Some(me),
            Err(_) => match core.election.leader().await {
                Ok(Some(l)) => {
                    let term = if l.name == core.me.name {
                        0
                    } else {
                        core.forwarder.leader_term(&l).await.unwrap_or(0)
                    };
                    Some(drover_server_api::LeaderStatus { name: l.name, term })
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!("server status: the store does not say who leads: {e}");
                    None
                }
            },
        };
        let members = core.election.members().await.unwrap_or_else(|e| {
            tracing::debug!("server status: cannot list the servers: {e}");
            Vec::new()
        });
        let mut servers: Vec<drover_server_api::ServerMember> = members
            .into_iter()
            .map(|m| drover_server_api::ServerMember {
                leader: leader.as_ref().is_some_and(|l| l.name == m.name),
                name: m.name,
                rpc_addr: m.rpc_addr,
                http_addr: m.http_addr,
                version: m.version,
                started: m.started,
            })
            .collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        let endpoints = self.store_health().await;
        drover_server_api::ServersStatus {
            this: core.me.name.clone(),
            leader,
            servers,
            store: drover_server_api::StoreStatus {
                kind: core.store.kind().to_owned(),
                endpoints,
            },
        }
    }

    /// Wait until the background loops ended (after `shutdown` fired); the store is
    /// released once the server is dropped too.
    pub async fn stopped(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            let _ = t.await;
        }
    }

    #[cfg(test)]
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The newest committed index.
    pub fn index(&self) -> Index {
        *self.core.index_tx.borrow()
    }

    /// Counters of the state.
    pub fn stats(&self) -> ServerStats {
        let st = self.core.read();
        ServerStats {
            index: st.index,
            jobs: st.jobs().count(),
            nodes: st.all_nodes().count(),
            allocations: st.alloc_count(),
            evaluations_in_broker: self.core.broker.len(),
            delayed_evaluations: self.core.broker.delayed_len(),
            blocked_evaluations: st.blocked_evals().count(),
        }
    }

    /// Wait until the index is above `index` or `wait` passed; the index then.
    pub async fn wait_for_index(&self, index: Index, wait: Duration) -> Index {
        let mut rx = self.core.index_tx.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|i| *i > index)).await;
        *rx.borrow()
    }

    /// Submit a plan to the plan applier, as a worker does, and wait for its verdict:
    /// what was committed and which nodes refused placements.
    pub async fn apply_plan(&self, plan: Plan) -> Result<PlanResult, ServerError> {
        self.core.submit_plan(plan, None).await
    }

    // --- jobs ---------------------------------------------------------------------

    /// Register a job or a new version of it, and create its evaluation. Validates the
    /// spec (`ServerError::Invalid` names the field). Re-registering an unchanged spec
    /// creates no version but still an evaluation (as `nomad job run`).
    pub async fn register_job(&self, spec: JobSpec) -> Result<JobRegisterResponse, ServerError> {
        validate_spec(&spec)?;
        let (index, (eval_id, job_modify_index, warnings)) = self
            .core
            .commit(|st, index, now| {
                let mut b = Batch::default();
                let existing = scheduler::StateView::job(st, &spec.name);
                let changed = existing.is_none_or(|j| j.spec != spec || j.stop);
                let job = match existing {
                    None => Job {
                        spec: spec.clone(),
                        version: 0,
                        stop: false,
                        status: JobStatus::Pending,
                        submit_time: now,
                        create_index: index,
                        modify_index: index,
                        job_modify_index: index,
                    },
                    Some(old) if changed => Job {
                        spec: spec.clone(),
                        version: old.version + 1,
                        stop: false,
                        status: JobStatus::Pending,
                        submit_time: now,
                        create_index: old.create_index,
                        modify_index: index,
                        job_modify_index: index,
                    },
                    Some(old) => old.clone(),
                };
                if changed {
                    b.jobs.push(job.clone());
                    b.versions.push(job.clone());
                    if let Some(vs) = st.job_versions(&job.spec.name) {
                        // Keep the newest KEPT_VERSIONS (the new one included).
                        let drop = (vs.len() + 1).saturating_sub(KEPT_VERSIONS);
                        b.drop_versions
                            .extend(vs.keys().take(drop).map(|v| (job.spec.name.clone(), *v)));
                    }
                }
                let eval = new_eval(&job, EvalTrigger::JobRegister, index, now);
                if let Some(blocked) = st.blocked_eval(&job.spec.name) {
                    b.evals.push(set_eval_status(
                        blocked,
                        EvalStatus::Canceled,
                        format!("superseded by evaluation {}", eval.id),
                        index,
                        now,
                    ));
                }
                let warnings = driver_warnings(st, &job.spec);
                let r = (eval.id.clone(), job.job_modify_index, warnings);
                b.evals.push(eval);
                Ok((b, r))
            })
            .await?;
        Ok(JobRegisterResponse {
            eval_id,
            job_modify_index,
            index,
            warnings,
        })
    }

    /// What registering `spec` would do; commits nothing. The scheduler runs on a
    /// blocking thread (as a worker's does): a big job must not hold an async worker
    /// thread of the HTTP server for the whole placement.
    pub async fn plan_job(&self, spec: JobSpec) -> Result<JobPlanResponse, ServerError> {
        validate_spec(&spec)?;
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || plan_job_blocking(&core, spec))
            .await
            .map_err(|e| ServerError::Unavailable(format!("the scheduler failed: {e}")))?
    }
    /// Stop a job (its allocations are stopped); with `purge` also forget it.
    pub async fn stop_job(
        &self,
        name: &str,
        purge: bool,
    ) -> Result<JobRegisterResponse, ServerError> {
        let (index, (eval_id, job_modify_index)) = self
            .core
            .commit(|st, index, now| {
                let Some(old) = scheduler::StateView::job(st, name) else {
                    return Err(ServerError::NotFound(format!("job {name} not found")));
                };
                let mut b = Batch::default();
                let mut job = old.clone();
                job.stop = true;
                job.modify_index = index;
                // A plan made for the running spec must not place anything any more.
                job.job_modify_index = index;
                let eval = new_eval(&job, EvalTrigger::JobDeregister, index, now);
                if purge {
                    b.purge.push(name.to_owned());
                    // What already ended goes with the job; the rest once its client
                    // reports it ended (garbage collection).
                    b.drop_allocs.extend(
                        st.allocs_of_job(name)
                            .filter(|a| a.client_status.is_terminal())
                            .map(|a| a.id.clone()),
                    );
                } else {
                    b.jobs.push(job.clone());
                }
                if let Some(blocked) = st.blocked_eval(name) {
                    b.evals.push(set_eval_status(
                        blocked,
                        EvalStatus::Canceled,
                        format!("job stopped (evaluation {})", eval.id),
                        index,
                        now,
                    ));
                }
                let r = (eval.id.clone(), job.job_modify_index);
                b.evals.push(eval);
                Ok((b, r))
            })
            .await?;
        Ok(JobRegisterResponse {
            eval_id,
            job_modify_index,
            index,
            warnings: Vec::new(),
        })
    }

    /// Every job.
    pub fn jobs(&self) -> Vec<JobListStub> {
        let st = self.core.read();
        let mut out: Vec<JobListStub> = st
            .jobs()
            .map(|j| {
                let mut summary: BTreeMap<String, GroupSummary> = j
                    .spec
                    .groups
                    .iter()
                    .map(|g| (g.name.clone(), GroupSummary::default()))
                    .collect();
                for a in st.allocs_of_job(&j.spec.name) {
                    let s = summary.entry(a.group.clone()).or_default();
                    match a.client_status {
                        ClientStatus::Pending => s.pending += 1,
                        ClientStatus::Running => s.running += 1,
                        ClientStatus::Complete => s.complete += 1,
                        ClientStatus::Failed => s.failed += 1,
                        ClientStatus::Lost => s.lost += 1,
                    }
                }
                if let Some(b) = st.blocked_eval(&j.spec.name) {
                    for (g, n) in &b.queued_allocations {
                        summary.entry(g.clone()).or_default().queued += n;
                    }
                }
                JobListStub {
                    name: j.spec.name.clone(),
                    job_type: j.spec.job_type,
                    priority: j.spec.priority,
                    status: job_status(&st, j),
                    stop: j.stop,
                    version: j.version,
                    summary,
                    create_index: j.create_index,
                    modify_index: j.modify_index,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One job.
    pub fn job(&self, name: &str) -> Option<Job> {
        let st = self.core.read();
        scheduler::StateView::job(&*st, name).map(|j| job_with_status(&st, j))
    }

    /// A job's allocations, newest first.
    pub fn job_allocations(&self, name: &str) -> Vec<Allocation> {
        let st = self.core.read();
        let mut v: Vec<Allocation> = st.allocs_of_job(name).cloned().collect();
        newest_first(&mut v, |a| (a.create_index, &a.id));
        v
    }

    /// A job's evaluations, newest first.
    pub fn job_evaluations(&self, name: &str) -> Vec<Evaluation> {
        let st = self.core.read();
        let mut v: Vec<Evaluation> = st.evals_of_job(name).cloned().collect();
        newest_first(&mut v, |e| (e.create_index, &e.id));
        v
    }

    // --- nodes --------------------------------------------------------------------

    /// Register or update a node; it is `ready` (or still draining). Returns the
    /// heartbeat TTL and the index.
    ///
    /// `secret` is the node's secret: the first registration of an id binds it (the
    /// server keeps its SHA-256); every later one must present the same, else
    /// `Denied`. Attributes, meta and drivers are bounded (see the `MAX_NODE_*`
    /// constants): more is `Invalid`.
    pub async fn register_node(
        &self,
        registration: NodeRegistration,
        secret: &str,
    ) -> Result<(Duration, Index), ServerError> {
        self.core.register_node(registration, secret).await
    }

    /// May a caller presenting `secret` act as node `node_id`? `NotFound` for a node
    /// the server does not know, `Denied` for a wrong secret (or a node with none bound
    /// yet: it must register). The node RPCs call this before acting for a node.
    pub fn authenticate_node(&self, node_id: &str, secret: &str) -> Result<(), ServerError> {
        crate::heartbeat::authenticate(&self.core.read(), node_id, secret)
    }

    /// A node's heartbeat. `NotFound` for an unknown node (it must register).
    pub async fn heartbeat(&self, node_id: &str) -> Result<(Duration, Index), ServerError> {
        self.core.heartbeat(node_id).await
    }

    /// Start or end a node's drain; `node` is an id or a unique name.
    pub async fn drain_node(&self, node: &str, enable: bool) -> Result<Index, ServerError> {
        self.core.drain_node(node, enable).await
    }

    /// Every node.
    pub fn nodes(&self) -> Vec<Node> {
        self.core.read().all_nodes().cloned().collect()
    }

    /// One node, by id or name. `NotFound` when none has it; `Invalid`, listing their
    /// ids, when several nodes have that name.
    pub fn node(&self, node: &str) -> Result<Node, ServerError> {
        crate::heartbeat::lookup_node(&self.core.read(), node)?
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
                    alloc: a.clone(),
                    job_type: scheduler::StateView::job(&*st, &a.job_name)
                        .map(|j| j.spec.job_type)
                        .or_else(|| st.evals_of_job(&a.job_name).next().map(|e| e.job_type))
                        .unwrap_or_default(),
                    group: st.alloc_group(a),
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
        self.core.update_allocations(node_id, updates).await
    }

    // --- allocations and evaluations ---------------------------------------------

    /// Every allocation, newest first.
    pub fn allocations(&self) -> Vec<Allocation> {
        let st = self.core.read();
        let mut v: Vec<Allocation> = st.all_allocs().cloned().collect();
        newest_first(&mut v, |a| (a.create_index, &a.id));
        v
    }

    /// One allocation, by id or unique id prefix.
    pub fn allocation(&self, id: &str) -> Option<Allocation> {
        let st = self.core.read();
        by_id_or_prefix(st.alloc(id), st.all_allocs(), |a| &a.id, id).cloned()
    }

    /// Every evaluation, newest first.
    pub fn evaluations(&self) -> Vec<Evaluation> {
        let st = self.core.read();
        let mut v: Vec<Evaluation> = st.all_evals().cloned().collect();
        newest_first(&mut v, |e| (e.create_index, &e.id));
        v
    }

    /// One evaluation, by id or unique id prefix.
    pub fn evaluation(&self, id: &str) -> Option<Evaluation> {
        let st = self.core.read();
        by_id_or_prefix(st.eval(id), st.all_evals(), |e| &e.id, id).cloned()
    }
}

/// "no ready node has driver X": said at registration, the job is still accepted.
fn driver_warnings(st: &State, spec: &JobSpec) -> Vec<String> {
    let drivers: BTreeSet<&str> = spec
        .groups
        .iter()
        .flat_map(|g| g.tasks.iter().map(|t| t.driver.as_str()))
        .collect();
    let mut out = Vec::new();
    let nodes: Vec<&Node> = st
        .all_nodes()
        .filter(|n| n.status == NodeStatus::Ready)
        .collect();
    for d in drivers {
        let ok = nodes
            .iter()
            .any(|n| n.drivers.get(d).is_some_and(|i| i.detected && i.healthy));
        if !ok {
            out.push(format!("no ready node has driver {d} healthy"));
        }
    }
    out
}

/// A client's status reports waiting to be committed.
pub(crate) struct UpdateRequest {
    node_id: String,
    updates: Vec<AllocClientUpdate>,
    reply: tokio::sync::oneshot::Sender<Result<Index, ServerError>>,
}

/// Client updates committed together at most.
const MAX_UPDATE_REQUESTS_PER_COMMIT: usize = 256;

/// Commits client status reports: every request waiting (up to
/// [`MAX_UPDATE_REQUESTS_PER_COMMIT`]) in one transaction, so that a thousand clients
/// reporting at once cost a few commits, not a thousand. A request that is refused
/// (another node's allocation) is answered with its error and changes nothing; the
/// others of the batch commit.
pub(crate) async fn run_updates(
    core: Arc<Core>,
    mut rx: mpsc::Receiver<UpdateRequest>,
    stop: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let mut reqs = vec![first];
        while reqs.len() < MAX_UPDATE_REQUESTS_PER_COMMIT {
            match rx.try_recv() {
                Ok(r) => reqs.push(r),
                Err(_) => break,
            }
        }
        let res = core
            .commit(|st, index, now| Ok(client_updates(st, &reqs, index, now)))
            .await;
        match res {
            Ok((index, verdicts)) => {
                for (req, v) in reqs.into_iter().zip(verdicts) {
                    let _ = req.reply.send(v.map(|()| index));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for req in reqs {
                    let _ = req.reply.send(Err(ServerError::Unavailable(format!(
                        "allocation updates not committed: {msg}"
                    ))));
                }
            }
        }
    }
}

/// `text` cut to at most [`MAX_CLIENT_TEXT_BYTES`], on a character boundary.
fn truncated(text: &str) -> String {
    if text.len() <= MAX_CLIENT_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_CLIENT_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The task names of an allocation's group (at the version it was placed with), when
/// the server still has its job.
fn group_tasks<'a>(st: &'a State, a: &Allocation) -> Option<Vec<&'a str>> {
    let of = |j: &'a Job| {
        j.spec
            .groups
            .iter()
            .find(|g| g.name == a.group)
            .map(|g| g.tasks.iter().map(|t| t.name.as_str()).collect())
    };
    st.job_at_version(&a.job_name, a.job_version)
        .and_then(of)
        .or_else(|| scheduler::StateView::job(st, &a.job_name).and_then(of))
}

/// Task states are kept only for tasks of the allocation's group, with bounded fields.
fn check_task_states(st: &State, u: &AllocClientUpdate) -> Result<(), ServerError> {
    let Some(alloc) = st.alloc(&u.id) else {
        return Ok(()); // ignored anyway
    };
    let tasks = group_tasks(st, alloc);
    for (name, ts) in &u.task_states {
        if tasks.as_ref().is_some_and(|t| !t.contains(&name.as_str())) {
            return Err(ServerError::Invalid(format!(
                "allocation {}: task_states: group {} has no task {name:?}",
                u.id, alloc.group
            )));
        }
        let fields = [
            ("task_id", ts.task_id.as_str()),
            ("started_at", ts.started_at.as_deref().unwrap_or("")),
            ("finished_at", ts.finished_at.as_deref().unwrap_or("")),
        ];
        if let Some((field, v)) = fields.iter().find(|(_, v)| v.len() > MAX_TASK_FIELD_BYTES) {
            return Err(ServerError::Invalid(format!(
                "allocation {}: task_states.{name}.{field}: {} bytes, at most \
                 {MAX_TASK_FIELD_BYTES}",
                u.id,
                v.len()
            )));
        }
    }
    Ok(())
}

fn client_updates(
    st: &State,
    reqs: &[UpdateRequest],
    index: Index,
    now: i64,
) -> (Batch, Vec<Result<(), ServerError>>) {
    let mut changed: HashMap<String, Allocation> = HashMap::new();
    let mut b = Batch::default();
    let mut failure_evals: BTreeSet<String> = BTreeSet::new();
    // Per job: does an older version still run (a rolling update in progress)?
    let mut rolling: HashMap<String, bool> = HashMap::new();
    let mut rolling_evals: BTreeSet<String> = BTreeSet::new();
    let mut verdicts = Vec::with_capacity(reqs.len());
    for req in reqs {
        let node_id = req.node_id.as_str();
        if scheduler::StateView::node(st, node_id).is_none() {
            verdicts.push(Err(ServerError::NotFound(format!(
                "node {node_id} is not registered"
            ))));
            continue;
        }
        // Check the whole request first: a refused one changes nothing.
        let foreign = req.updates.iter().find_map(|u| {
            st.alloc(&u.id)
                .filter(|a| a.node_id != node_id)
                .map(|a| (u.id.as_str(), a.node_id.as_str()))
        });
        if let Some((id, owner)) = foreign {
            verdicts.push(Err(ServerError::Invalid(format!(
                "allocation {id} belongs to node {owner}, not to node {node_id}"
            ))));
            continue;
        }
        if let Some(e) = req
            .updates
            .iter()
            .find_map(|u| check_task_states(st, u).err())
        {
            verdicts.push(Err(e));
            continue;
        }
        for u in &req.updates {
            let Some(old) = changed.get(&u.id).or_else(|| st.alloc(&u.id)) else {
                tracing::debug!(alloc = %u.id, node = %node_id, "update for an unknown allocation ignored");
                continue;
            };
            let mut a = old.clone();
            // A terminal client status is final: lost stays lost (the server replaced
            // it), complete/failed do not go back to running.
            if !old.client_status.is_terminal() {
                a.client_status = u.client_status;
                a.client_description = truncated(&u.client_description);
            }
            // Unchecked task names (the allocation's job is gone) are not kept.
            if group_tasks(st, old).is_some() {
                a.task_states = u
                    .task_states
                    .iter()
                    .map(|(name, ts)| {
                        let mut ts = ts.clone();
                        ts.message = truncated(&ts.message);
                        (name.clone(), ts)
                    })
                    .collect();
            }
            if a.client_status == old.client_status
                && a.client_description == old.client_description
                && a.task_states == old.task_states
            {
                continue;
            }
            a.modify_index = index;
            a.modify_time = now;
            if !old.is_terminal() && a.is_terminal() {
                b.unblock = true;
            }
            if let Some(job) = scheduler::StateView::job(st, &a.job_name).filter(|j| !j.stop) {
                let name = &job.spec.name;
                if a.client_status == ClientStatus::Failed
                    && old.client_status != ClientStatus::Failed
                    && a.desired_status == DesiredStatus::Run
                    && job.spec.job_type != JobType::System
                {
                    failure_evals.insert(name.clone());
                }
                if a.client_status == ClientStatus::Running
                    && old.client_status == ClientStatus::Pending
                    && a.job_version == job.version
                {
                    let in_progress = *rolling.entry(name.clone()).or_insert_with(|| {
                        st.allocs_of_job(name)
                            .any(|o| !o.is_terminal() && o.job_version < job.version)
                    });
                    if in_progress {
                        rolling_evals.insert(name.clone());
                    }
                }
            }
            changed.insert(a.id.clone(), a);
        }
        verdicts.push(Ok(()));
    }
    b.allocs = changed.into_values().collect();
    for name in &failure_evals {
        if let Some(job) = scheduler::StateView::job(st, name) {
            b.evals
                .push(new_eval(job, EvalTrigger::AllocFailure, index, now));
        }
    }
    // An alloc-failure evaluation of the same job does the rolling update's work too.
    for name in rolling_evals.difference(&failure_evals) {
        if let Some(job) = scheduler::StateView::job(st, name) {
            let mut e = new_eval(job, EvalTrigger::RollingUpdate, index, now);
            e.previous_eval = st.evals_of_job(name).last().map(|p| p.id.clone());
            b.evals.push(e);
        }
    }
    (b, verdicts)
}

impl Core {
    async fn update_allocations(
        &self,
        node_id: &str,
        updates: Vec<AllocClientUpdate>,
    ) -> Result<Index, ServerError> {
        if updates.len() > MAX_CLIENT_UPDATES {
            return Err(ServerError::Invalid(format!(
                "{} allocation updates in one call, at most {MAX_CLIENT_UPDATES}",
                updates.len()
            )));
        }
        let Some(term) = self.current_term() else {
            return Err(self.not_leader());
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stopped = || self.term_ended("allocation updates not committed");
        term.updates
            .send(UpdateRequest {
                node_id: node_id.to_owned(),
                updates,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    pub(crate) async fn submit_plan(
        &self,
        plan: Plan,
        finish: Option<crate::plan::EvalFinish>,
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
    fn term_ended(&self, what: &str) -> ServerError {
        if self.shutdown.is_cancelled() {
            ServerError::Unavailable(format!("{what}: the server is shutting down"))
        } else {
            ServerError::Unavailable(format!(
                "{what}: this server stopped leading; retry (writes go to the leader)"
            ))
        }
    }
}

/// `Server::plan_job` on the calling (blocking) thread, under the state's read lock.
fn plan_job_blocking(core: &Core, spec: JobSpec) -> Result<JobPlanResponse, ServerError> {
    let st = core.read();
    let existing = scheduler::StateView::job(&*st, &spec.name);
    let changed = existing.is_none_or(|j| j.spec != spec || j.stop);
    let version = match existing {
        None => 0,
        Some(j) if changed => j.version + 1,
        Some(j) => j.version,
    };
    let job_modify_index = existing.map_or(0, |j| j.job_modify_index);
    let job = Job {
        spec: spec.clone(),
        version,
        stop: false,
        status: JobStatus::Pending,
        submit_time: now_nanos(),
        create_index: existing.map_or(st.index + 1, |j| j.create_index),
        modify_index: st.index + 1,
        job_modify_index: if changed {
            st.index + 1
        } else {
            job_modify_index
        },
    };
    let eval = new_eval(&job, EvalTrigger::JobRegister, st.index + 1, now_nanos());
    let overlay = Overlay { base: &st, job };
    let out = scheduler::schedule(&overlay, &eval, core.settings());
    let mut groups: BTreeMap<String, GroupPlanSummary> = spec
        .groups
        .iter()
        .map(|g| (g.name.clone(), GroupPlanSummary::default()))
        .collect();
    let stopped: std::collections::HashSet<&str> = out
        .plan
        .node_update
        .values()
        .flatten()
        .map(|s| s.alloc_id.as_str())
        .collect();
    for a in out.plan.node_allocation.values().flatten() {
        let g = groups.entry(a.group.clone()).or_default();
        if a.previous_allocation
            .as_deref()
            .is_some_and(|p| stopped.contains(p))
        {
            g.update += 1;
        } else {
            g.place += 1;
        }
    }
    for s in out.plan.node_update.values().flatten() {
        if let Some(a) = st.alloc(&s.alloc_id) {
            groups.entry(a.group.clone()).or_default().stop += 1;
        }
    }
    for g in groups.values_mut() {
        g.stop = g.stop.saturating_sub(g.update);
    }
    for a in st.allocs_of_job(&spec.name) {
        if !a.is_terminal() && !stopped.contains(a.id.as_str()) {
            groups.entry(a.group.clone()).or_default().ignore += 1;
        }
    }
    Ok(JobPlanResponse {
        job_version: version,
        changed,
        groups,
        failed_tg_allocs: out.failed_tg_allocs,
        job_modify_index,
    })
}
