//! The server facade: [`Server`] starts the core and the leader loop, and is what the
//! HTTP API and the node RPCs hold. Its operations are in `endpoints/`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_server_api::{ClientAllocation, Index};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::core::Core;
use crate::error::ServerError;
use crate::leader::leadership::Leadership;
use crate::leader::plan_apply::PlanResult;
use crate::leader::{Election, ServerInfo, SoleLeader};
use crate::scheduler::Plan;
use crate::state::State;
use crate::store::Store;

pub use crate::leader::client_updates::{
    MAX_CLIENT_TEXT_BYTES, MAX_CLIENT_UPDATES, MAX_TASK_FIELD_BYTES,
};

/// A running server: state in memory, store behind it, broker, workers, plan applier
/// and heartbeat timers in the background.
pub struct Server {
    pub(crate) core: Arc<Core>,
    pub(crate) leadership: Arc<Leadership>,
    pub(crate) forwarder: crate::transport::forward::Forwarder,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// `servers_status`'s last answer and when: its election calls (leader, members,
    /// the leader's term) are made at most once per [`STATUS_CACHE`], and one at a
    /// time (callers wait on the lock and take the fresh answer); the endpoints'
    /// health is asked every time.
    pub(crate) status_cache:
        tokio::sync::Mutex<Option<(std::time::Instant, drover_server_api::ServersStatus)>>,
    /// The keyring's KEK and unwrapped root keys (variables, workload identities).
    pub(crate) keyring: Arc<crate::keyring::Keyring>,
    /// CSI controller calls waiting for agents (see `endpoints/csi.rs`).
    pub(crate) csi_queue: crate::endpoints::csi::ControllerQueue,
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
        let keyring = Arc::new(
            match &config.keyring_kek_file {
                Some(file) => crate::keyring::Keyring::open(file, false),
                None => {
                    if store.kind() == "etcd" {
                        tracing::warn!(
                            "no --keyring-kek-file: this server generates its own KEK, and \
                         variables written through another server will not decrypt here; \
                         give every server the same KEK file"
                        );
                    }
                    crate::keyring::Keyring::open(
                        &crate::keyring::default_kek_file(&config.data_dir),
                        true,
                    )
                }
            }
            .map_err(|e| ServerError::Unavailable(e.to_string()))?,
        );
        let (kvs, revision) = store.range("").await?;
        let state = State::load(kvs, revision)?;
        let leadership = Arc::new(Leadership::new(election, me));
        let forwarder = crate::transport::forward::Forwarder::new(&config, leadership.clone())?;
        let core = Arc::new(Core::new(config, store, state, shutdown));
        {
            let st = core.read();
            tracing::info!(
                server = %leadership.me.name,
                index = st.index,
                nodes = st.all_nodes().count(),
                jobs = st.jobs().count(),
                "server state loaded"
            );
        }
        let tasks = vec![
            tokio::spawn(crate::leader::terms::run(core.clone(), leadership.clone())),
            tokio::spawn(crate::leader::terms::keep_registered(
                core.clone(),
                leadership.clone(),
            )),
        ];
        Ok(Arc::new(Server {
            core,
            leadership,
            forwarder,
            tasks: Mutex::new(tasks),
            status_cache: tokio::sync::Mutex::new(None),
            keyring,
            csi_queue: Default::default(),
        }))
    }

    /// Wait until this server leads (or shuts down).
    pub async fn wait_leading(&self) {
        let mut rx = self.leadership.watch_leading();
        tokio::select! {
            _ = rx.wait_for(Option::is_some) => {}
            () = self.core.shutdown.cancelled() => {}
        }
    }

    /// The id of the term this server leads in; `None` while it follows.
    pub fn leading(&self) -> Option<u64> {
        self.leadership.leading()
    }

    /// This server as the others see it.
    pub fn info(&self) -> &ServerInfo {
        &self.leadership.me
    }

    /// Wait (at most `limit`) until this server's state holds the commit at `index`.
    pub async fn wait_applied(&self, index: Index, limit: Duration) {
        self.core.wait_applied(index, limit).await;
    }

    /// Whether this server leads now (writes are made here, not forwarded).
    pub fn is_leader(&self) -> bool {
        self.leadership.is_leader()
    }

    /// The leader as the store says (`None`: none elected at the moment).
    pub async fn leader(&self) -> Result<Option<ServerInfo>, ServerError> {
        if self.leadership.is_leader() {
            return Ok(Some(self.leadership.me.clone()));
        }
        Ok(self.leadership.election.leader().await?)
    }

    /// An HTTP request for the leader (a write reaching a follower).
    pub(crate) async fn forward_http(
        &self,
        request: drover_proto::drover::cluster::v1::ForwardRequest,
    ) -> crate::transport::forward::Forwarded<axum::response::Response> {
        self.forwarder.http(&self.core, request).await
    }

    /// A node RPC for the leader (see [`crate::transport::forward::Forwarder::node_call`]).
    pub(crate) async fn forward_node<R>(
        &self,
        call: impl Fn(
            drover_proto::drover::cluster::v1::node_client::NodeClient<tonic::transport::Channel>,
            tonic::Request<()>,
        ) -> crate::store::BoxFuture<'static, Result<R, tonic::Status>>,
    ) -> crate::transport::forward::Forwarded<Result<R, tonic::Status>> {
        let fwd = &self.forwarder;
        self.forwarder
            .node_call(&self.core, |client| call(client, fwd.outgoing_node(())))
            .await
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
    pub(crate) fn term(&self) -> Arc<crate::leader::term::LeaderTerm> {
        self.leadership.term().expect("the server leads")
    }

    /// The newest committed index.
    pub fn index(&self) -> Index {
        *self.core.index_tx.borrow()
    }

    /// Counters of the state.
    pub fn stats(&self) -> ServerStats {
        let term = self.leadership.term();
        let st = self.core.read();
        ServerStats {
            index: st.index,
            jobs: st.job_count(),
            nodes: st.node_count(),
            allocations: st.alloc_count(),
            evaluations_in_broker: term.as_ref().map_or(0, |t| t.broker.len()),
            delayed_evaluations: term.as_ref().map_or(0, |t| t.broker.delayed_len()),
            blocked_evaluations: st.blocked_evals().count(),
        }
    }

    /// The server's metrics as OpenMetrics families without `# EOF` (see
    /// `drover_metrics::render`), the gauges read from the state now.
    pub fn metrics_families(&self) -> String {
        let term = self.leadership.term();
        let gauges = term.as_ref().map(|t| {
            let (ready, unacked) = t.broker.ready_and_unacked();
            crate::metrics::TermGauges {
                ready,
                unacked,
                delayed: t.broker.delayed_len(),
                plan_queue_depth: crate::leader::term::PLAN_QUEUE
                    .saturating_sub(t.plans.capacity()),
            }
        });
        {
            let st = self.core.read();
            self.core.metrics.refresh(&st, term.is_some(), gauges);
        }
        self.core.metrics.families()
    }

    /// Wait until the index is above `index` or `wait` passed; the index then.
    pub async fn wait_for_index(&self, index: Index, wait: Duration) -> Index {
        let mut rx = self.core.index_tx.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|i| *i > index)).await;
        *rx.borrow()
    }

    /// The region this server serves.
    pub fn region(&self) -> &str {
        &self.core.config.region
    }

    /// The datacenter this server says it is in.
    pub fn datacenter(&self) -> &str {
        &self.core.config.datacenter
    }

    /// The leader as this server knows it without asking the store: itself while it
    /// leads, else the one it last heard of (`None`: none known).
    pub fn known_leader(&self) -> Option<ServerInfo> {
        if self.leadership.is_leader() {
            return Some(self.leadership.me.clone());
        }
        self.leadership.known_leader()
    }

    /// The servers registered in the store (empty when the store cannot say, or for
    /// a sole server that registers nowhere).
    pub async fn members(&self) -> Vec<ServerInfo> {
        self.leadership
            .election
            .members()
            .await
            .unwrap_or_else(|e| {
                tracing::debug!("cannot list the servers: {e}");
                Vec::new()
            })
    }

    /// What the state is stored in (`embedded`, `etcd`).
    pub fn store_kind(&self) -> &'static str {
        self.core.store.kind()
    }

    /// The events of the commits this server applies, from `index` on (see
    /// [`crate::events`]).
    pub fn subscribe_events(&self, index: Index) -> crate::events::Subscription {
        self.core.events.subscribe(index)
    }

    /// The type of job `name` of namespace `ns` (`None`: no such job).
    pub fn job_type_of(&self, ns: &str, name: &str) -> Option<drover_server_api::JobType> {
        let st = self.core.read();
        st.job_in(ns, name).map(|j| j.spec.job_type)
    }

    /// The version of its job an allocation runs (the current one, or a kept one).
    pub fn job_version_of(
        &self,
        alloc: &drover_server_api::Allocation,
    ) -> Option<drover_server_api::Job> {
        let st = self.core.read();
        if let Some(j) = st.job_in(&alloc.namespace, &alloc.job_name)
            && j.version == alloc.job_version
        {
            return Some(j.clone());
        }
        st.job_versions(&alloc.namespace, &alloc.job_name)
            .and_then(|vs| vs.get(&alloc.job_version))
            .cloned()
    }

    /// Submit a plan to the plan applier, as a worker does, and wait for its verdict:
    /// what was committed and which nodes refused placements.
    pub async fn apply_plan(&self, plan: Plan) -> Result<PlanResult, ServerError> {
        self.leadership.require()?.submit_plan(plan, None).await
    }
}
