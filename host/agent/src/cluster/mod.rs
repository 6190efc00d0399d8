//! The agent as a cluster client: it registers its node with the servers, heartbeats,
//! streams its allocations to the [`AllocManager`] and
//! reports their status back in batches; it keeps running its tasks while no server
//! answers, and reconciles when one does.
//!
//! One session per server connection: register (attributes, meta, resources, every
//! driver's fingerprint), then, concurrently until something fails,
//! - heartbeat at half the TTL the server returned (NOT_FOUND: register again), and
//!   register again when a driver's health or attributes change;
//! - watch the node's allocations from the last index applied (0 after a start: the
//!   complete set) and hand each batch to the allocation manager;
//! - send status reports, coalesced per allocation, every 250 ms in calls of at most
//!   500.
//!
//! A failed session moves on to the next server after a capped, jittered backoff;
//! reports keep queueing meanwhile (newest per allocation) and are sent, together
//! with every allocation's current status, once a server answers.

pub mod connection;
pub mod fingerprint;
pub mod forward;
pub mod identity;
pub mod network;
pub mod queue;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::{AllocClientUpdate, ClientAllocation, DriverInfo, NodeRegistration};
use pb::node_client::NodeClient;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::allocs::AllocManager;
use crate::config::AgentConfig;
use crate::plugins::catalog::Catalog;

pub use connection::{ServerConnection, TokenInterceptor, connect};
use queue::{Backoff, FlushClock, StatusQueue};

/// Why the cluster client cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The servers, TLS or token settings are unusable; the message names which.
    #[error("cluster client: {0}")]
    Config(String),
    /// The node id file is unreadable or corrupt.
    #[error("node id file {}: {reason}", path.display())]
    NodeId {
        /// `<data_dir>/node-id`.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A host volume of the config cannot be offered; the message names it.
    #[error("host volume: {0}")]
    HostVolume(String),
    /// A CSI plugin of the config cannot be run; the message names it.
    #[error("CSI plugin: {0}")]
    CsiPlugin(String),
    /// The node secret file is unreadable or corrupt.
    #[error("node secret file {}: {reason}", path.display())]
    NodeSecret {
        /// `<data_dir>/node-secret`.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
}

/// Status reports per `UpdateAllocations` call.
pub const MAX_REPORTS_PER_CALL: usize = 500;
/// How often the drivers' fingerprints are compared with the registered ones.
pub const DRIVER_POLL: Duration = Duration::from_secs(3);
/// Least time between two registrations for changed drivers or devices: a device
/// plugin whose instances flap must not have the node registered (and every blocked
/// evaluation looked at again) more than about once a second.
const MIN_REREGISTER_INTERVAL: Duration = Duration::from_secs(1);

/// When a change noticed at `now` may register the node again, the last registration
/// having been at `last`.
fn reregister_at(last: Instant, now: Instant) -> Instant {
    (last + MIN_REREGISTER_INTERVAL).max(now)
}
/// Deadline of one unary call (register, heartbeat, a status batch).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// First and longest delay before reconnecting.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));
/// Heartbeat TTL assumed if a server answers 0.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// What the client needs of the node, checked at start (before the agent serves).
#[derive(Debug, Clone)]
pub struct Prepared {
    conn: ServerConnection,
    node_id: String,
    node_secret: identity::NodeSecret,
    name: String,
    datacenter: String,
    meta: BTreeMap<String, String>,
    host: fingerprint::HostFacts,
    network: drover_server_api::NodeNetwork,
    host_volumes: BTreeMap<String, drover_server_api::HostVolume>,
}

impl Prepared {
    /// The node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }
    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The servers.
    pub fn connection(&self) -> &ServerConnection {
        &self.conn
    }
    /// The node's datacenter.
    pub fn datacenter(&self) -> &str {
        &self.datacenter
    }
    /// The node's address and ports, as registered.
    pub fn network(&self) -> &drover_server_api::NodeNetwork {
        &self.network
    }
    /// The node's secret (what its RPCs carry).
    pub fn node_secret(&self) -> &identity::NodeSecret {
        &self.node_secret
    }
    /// The node's host volumes (checked), as registered.
    pub fn host_volumes(&self) -> &BTreeMap<String, drover_server_api::HostVolume> {
        &self.host_volumes
    }
    /// What the node's tasks may know of it (their environment and interpolation):
    /// the values it registers with.
    pub fn node_env(&self) -> crate::taskenv::NodeEnv {
        crate::taskenv::NodeEnv {
            id: self.node_id.clone(),
            name: self.name.clone(),
            datacenter: self.datacenter.clone(),
            class: String::new(),
            attributes: self.host.attributes.clone(),
            meta: self.meta.clone(),
        }
    }
}

/// Check the cluster settings of `config` and read the node's identity and host facts:
/// everything that can be wrong before the client dials a server.
pub fn prepare(config: &AgentConfig) -> Result<Prepared, ClusterError> {
    let conn = connect(config)?;
    crate::volumes::check_host_volumes(&config.host_volume).map_err(ClusterError::HostVolume)?;
    crate::csi::plugins::check_config(&config.csi_plugin).map_err(ClusterError::CsiPlugin)?;
    let node_id = identity::load_or_create(&config.data_dir())?;
    let node_secret = identity::load_or_create_secret(&config.data_dir())?;
    let host = fingerprint::host();
    let network = network::node_network(config)?;
    let name = config
        .node_name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| host.hostname.clone());
    Ok(Prepared {
        conn,
        node_id,
        node_secret,
        name,
        datacenter: config.datacenter.clone(),
        meta: config.meta.clone(),
        host,
        network,
        host_volumes: config.host_volume.clone(),
    })
}

/// Run the client until `stop` fires: register, heartbeat, stream allocations into
/// `allocs`, send what arrives on `updates` to the servers.
pub async fn run(
    config: AgentConfig,
    catalog: Arc<Catalog>,
    allocs: Arc<AllocManager>,
    updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
    stop: CancellationToken,
) {
    let prepared = match prepare(&config) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}; this agent does not join the cluster");
            stop.cancelled().await;
            return;
        }
    };
    run_prepared(prepared, catalog, allocs, Arc::default(), updates, stop).await;
}

/// [`run`] with settings already checked by [`prepare`].
pub async fn run_prepared(
    prepared: Prepared,
    catalog: Arc<Catalog>,
    allocs: Arc<AllocManager>,
    csi: Arc<crate::csi::plugins::CsiPlugins>,
    updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
    stop: CancellationToken,
) {
    let changes = catalog.driver_changes();
    let csi_changes = csi.changes();
    let device_catalog = catalog.clone();
    let drivers = move || fingerprint::drivers(&catalog);
    let devices = move || fingerprint::devices(&device_catalog);
    Client::new(
        prepared,
        Box::new(drivers),
        Arc::new(Manager(allocs)),
        updates,
        stop,
    )
    .with_driver_changes(changes)
    .with_devices(Box::new(devices))
    .with_csi_plugins(Box::new(move || csi.fingerprints()), csi_changes)
    .run()
    .await;
}

/// A boxed future (the allocation sink is used as a trait object).
pub type BoxFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where the client delivers allocations and reads their statuses: the allocation
/// manager (a trait so the session logic can be tested against a recorder).
pub trait AllocSink: Send + Sync + 'static {
    /// [`AllocManager::apply`].
    fn apply(&self, allocs: Vec<ClientAllocation>, complete: bool) -> BoxFuture<'_>;
    /// [`AllocManager::statuses`].
    fn statuses(&self) -> Vec<AllocClientUpdate>;
}

struct Manager(Arc<AllocManager>);

impl AllocSink for Manager {
    fn apply(&self, allocs: Vec<ClientAllocation>, complete: bool) -> BoxFuture<'_> {
        Box::pin(self.0.apply(allocs, complete))
    }
    fn statuses(&self) -> Vec<AllocClientUpdate> {
        self.0.statuses()
    }
}

/// Reads every driver's fingerprint now.
pub type Drivers = Box<dyn Fn() -> BTreeMap<String, DriverInfo> + Send + Sync>;
/// Reads every device group the device plugins fingerprinted, now.
pub type Devices = Box<dyn Fn() -> Vec<drover_server_api::NodeDeviceGroup> + Send + Sync>;
/// Reads every configured CSI plugin's fingerprint, now.
pub type CsiFingerprints =
    Box<dyn Fn() -> BTreeMap<String, drover_server_api::csi::CsiPluginFingerprint> + Send + Sync>;
type Rpc = NodeClient<InterceptedService<Channel, TokenInterceptor>>;

/// Why a session ended.
#[derive(Debug)]
enum Ended {
    Stopped,
    Failed(String),
}

fn failed(what: &str, status: &tonic::Status) -> Ended {
    let hint = match status.code() {
        tonic::Code::Unauthenticated => {
            "; the server refused this agent's token (check token_file / --token-file)"
        }
        tonic::Code::PermissionDenied => {
            "; the server knows this node id with another node secret (was the data \
             dir's node-secret file replaced, or is another agent using this node id?)"
        }
        _ => "",
    };
    Ended::Failed(format!(
        "{what}: {} ({:?}){hint}",
        status.message(),
        status.code()
    ))
}

/// The client loop's state across sessions.
pub struct Client {
    node: Prepared,
    drivers: Drivers,
    /// The device plugins' device groups (none without).
    devices: Devices,
    /// Fires when a driver's fingerprint may have changed (else: polled).
    driver_changes: Option<tokio::sync::watch::Receiver<u64>>,
    /// The CSI plugins' fingerprints (none without).
    csi: CsiFingerprints,
    /// Fires when a CSI plugin's fingerprint changed.
    csi_changes: Option<tokio::sync::watch::Receiver<u64>>,
    allocs: Arc<dyn AllocSink>,
    updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
    updates_open: bool,
    queue: StatusQueue,
    /// Index of the last allocation batch applied: a new session resumes there.
    last_index: u64,
    backoff: Backoff,
    /// Held while a batch of allocations is applied (see [`watch`]).
    applying: Arc<tokio::sync::Mutex<()>>,
    stop: CancellationToken,
}

impl Client {
    /// A client for `node`, reading driver fingerprints from `drivers`.
    pub fn new(
        node: Prepared,
        drivers: Drivers,
        allocs: Arc<dyn AllocSink>,
        updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
        stop: CancellationToken,
    ) -> Self {
        Client {
            node,
            drivers,
            devices: Box::new(Vec::new),
            driver_changes: None,
            csi: Box::new(BTreeMap::new),
            csi_changes: None,
            allocs,
            updates,
            updates_open: true,
            queue: StatusQueue::default(),
            last_index: 0,
            backoff: Backoff::new(BACKOFF.0, BACKOFF.1),
            applying: Arc::default(),
            stop,
        }
    }

    /// Read device groups from `devices` for each registration.
    pub fn with_devices(mut self, devices: Devices) -> Self {
        self.devices = devices;
        self
    }

    /// Read the CSI plugins' fingerprints from `csi` for each registration, and
    /// register again as soon as `changes` sees a change.
    pub fn with_csi_plugins(
        mut self,
        csi: CsiFingerprints,
        changes: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Self {
        self.csi = csi;
        self.csi_changes = changes;
        self
    }

    /// Also register again as soon as `changes` sees a change (a driver became
    /// healthy), not only at the next poll.
    pub fn with_driver_changes(mut self, changes: tokio::sync::watch::Receiver<u64>) -> Self {
        self.driver_changes = Some(changes);
        self
    }

    /// Sessions with one server after the other until `stop`.
    pub async fn run(mut self) {
        tracing::info!(
            node_id = %self.node.node_id,
            name = %self.node.name,
            servers = ?self.node.conn.addresses(),
            "cluster client starting"
        );
        let mut server = 0usize;
        loop {
            match self.session(server).await {
                Ended::Stopped => break,
                Ended::Failed(why) => {
                    let delay = self.backoff.next_delay();
                    tracing::warn!(
                        server = %self.node.conn.address(server),
                        retry_in = ?delay,
                        queued_reports = self.queue.len(),
                        "cluster server: {why}; tasks keep running"
                    );
                    server = server.wrapping_add(1);
                    if self.wait(delay).await {
                        break;
                    }
                }
            }
        }
        tracing::info!("cluster client stopped");
    }

    /// Sleep `delay`, queueing reports meanwhile; true when stopped.
    async fn wait(&mut self, delay: Duration) -> bool {
        let deadline = tokio::time::sleep(delay);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return false,
                () = self.stop.cancelled() => return true,
                u = self.updates.recv(), if self.updates_open => match u {
                    Some(u) => self.queue.push(u),
                    None => self.updates_open = false,
                },
            }
        }
    }

    fn registration(&self, drivers: BTreeMap<String, DriverInfo>) -> NodeRegistration {
        NodeRegistration {
            devices: (self.devices)(),
            csi_plugins: (self.csi)(),
            host_volumes: self.node.host_volumes.clone(),
            network: self.node.network.clone(),
            datacenter: self.node.datacenter.clone(),
            id: self.node.node_id.clone(),
            name: self.node.name.clone(),
            attributes: self.node.host.attributes.clone(),
            meta: self.node.meta.clone(),
            resources: self.node.host.resources,
            drivers,
        }
    }

    async fn session(&mut self, server: usize) -> Ended {
        let addr = self.node.conn.address(server).to_owned();
        let channel = tokio::select! {
            c = self.node.conn.connect(server) => c,
            () = self.stop.cancelled() => return Ended::Stopped,
        };
        let channel = match channel {
            Ok(c) => c,
            Err(e) => return Ended::Failed(format!("cannot connect: {}", error_chain(&e))),
        };
        let rpc: Rpc = NodeClient::with_interceptor(channel, self.node.conn.interceptor())
            .max_decoding_message_size(connection::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(connection::MAX_MESSAGE_BYTES);
        let drivers = (self.drivers)();
        let registration = self.registration(drivers.clone());
        let mut first = rpc.clone();
        let ttl = tokio::select! {
            r = register(&mut first, &registration, &self.node.node_secret) => match r {
                Ok(ttl) => ttl,
                Err(e) => return e,
            },
            () = self.stop.cancelled() => return Ended::Stopped,
        };
        self.backoff.reset();
        tracing::info!(server = %addr, heartbeat_ttl = ?ttl, "node registered");

        // Reports that waited in the channel are older than the statuses read now.
        while let Ok(u) = self.updates.try_recv() {
            self.queue.push(u);
        }
        for status in self.allocs.statuses() {
            self.queue.push(status);
        }

        let Client {
            node,
            drivers: read_drivers,
            devices: read_devices,
            driver_changes,
            csi: read_csi,
            csi_changes,
            allocs,
            updates,
            updates_open,
            queue,
            last_index,
            applying,
            stop,
            ..
        } = self;
        let node_id = node.node_id.as_str();
        let secret = &node.node_secret;
        let beats = heartbeats(
            rpc.clone(),
            registration,
            secret,
            read_drivers,
            read_devices,
            driver_changes,
            (read_csi, csi_changes),
            ttl,
        );
        let watch = watch(rpc.clone(), node_id, secret, last_index, allocs, applying);
        let reports = reports(rpc, node_id, secret, queue, updates, updates_open);
        tokio::select! {
            e = beats => e,
            e = watch => e,
            e = reports => e,
            () = stop.cancelled() => Ended::Stopped,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        // hyper and tonic repeat their inner error's text in their own.
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

async fn call<T>(
    what: &str,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "{what}: no answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

fn ttl_of(ms: u64) -> Duration {
    if ms == 0 {
        DEFAULT_TTL
    } else {
        Duration::from_millis(ms)
    }
}

async fn register(
    rpc: &mut Rpc,
    registration: &NodeRegistration,
    secret: &identity::NodeSecret,
) -> Result<Duration, Ended> {
    let node_json = serde_json::to_vec(registration)
        .map_err(|e| Ended::Failed(format!("encoding the registration: {e}")))?;
    let req = pb::RegisterRequest {
        node_json,
        node_secret: secret.expose().to_owned(),
    };
    let r = call("register", rpc.register(req))
        .await
        .map_err(|s| failed("register", &s))?;
    Ok(ttl_of(r.heartbeat_ttl_ms))
}

/// Heartbeat at half the TTL; register again when the server forgot the node or the
/// drivers changed. Returns only on failure.
// Each reader is the session's borrow of the client's own: bundling them into a
// struct would only rename the borrows.
#[allow(clippy::too_many_arguments)]
async fn heartbeats(
    mut rpc: Rpc,
    mut registration: NodeRegistration,
    secret: &identity::NodeSecret,
    read_drivers: &Drivers,
    read_devices: &Devices,
    driver_changes: &mut Option<tokio::sync::watch::Receiver<u64>>,
    (read_csi, csi_changes): (
        &CsiFingerprints,
        &mut Option<tokio::sync::watch::Receiver<u64>>,
    ),
    mut ttl: Duration,
) -> Ended {
    let every = |ttl: Duration| (ttl / 2).max(Duration::from_millis(100));
    let mut next = Instant::now() + every(ttl);
    let mut poll = tokio::time::interval(DRIVER_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    // The first change after connecting goes at once (drivers finishing their first
    // fingerprints just after the node registered); later ones are paced.
    let mut last_register = Instant::now()
        .checked_sub(MIN_REREGISTER_INTERVAL)
        .unwrap_or_else(Instant::now);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {
                let req = pb::HeartbeatRequest {
                    node_id: registration.id.clone(),
                    node_secret: secret.expose().to_owned(),
                };
                match call("heartbeat", rpc.heartbeat(req)).await {
                    Ok(r) => ttl = ttl_of(r.heartbeat_ttl_ms),
                    Err(s) if s.code() == tonic::Code::NotFound => {
                        tracing::warn!("the server does not know this node (any more); registering again");
                        match register(&mut rpc, &registration, secret).await {
                            Ok(t) => ttl = t,
                            Err(e) => return e,
                        }
                    }
                    Err(s) => return failed("heartbeat", &s),
                }
                next = Instant::now() + every(ttl);
            }
            _ = async {
                tokio::select! {
                    _ = poll.tick() => {}
                    // A closed sender (the catalog is gone) leaves only the poll.
                    Ok(()) = async {
                        match driver_changes.as_mut() {
                            Some(rx) => rx.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {}
                    Ok(()) = async {
                        match csi_changes.as_mut() {
                            Some(rx) => rx.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {}
                }
            } => {
                // Paced: changes within the pause are gathered into one registration.
                tokio::time::sleep_until(reregister_at(last_register, Instant::now())).await;
                let drivers = read_drivers();
                let devices = read_devices();
                let csi = read_csi();
                if drivers != registration.drivers
                    || devices != registration.devices
                    || csi != registration.csi_plugins
                {
                    tracing::info!(
                        healthy = ?drivers.iter().filter(|(_, d)| d.healthy).map(|(n, _)| n).collect::<Vec<_>>(),
                        devices = devices.len(),
                        "drivers or devices changed; registering again"
                    );
                    registration.drivers = drivers;
                    registration.devices = devices;
                    registration.csi_plugins = csi;
                    last_register = Instant::now();
                    match register(&mut rpc, &registration, secret).await {
                        Ok(t) => ttl = t,
                        Err(e) => return e,
                    }
                    next = Instant::now() + every(ttl);
                }
            }
        }
    }
}

/// The index to resume from after applying a batch at `index`: a complete set is the
/// truth at its index, even a lower one (a server whose store was replaced); changes
/// never move it back.
fn next_index(last: u64, index: u64, complete: bool) -> u64 {
    if complete { index } else { last.max(index) }
}

/// Decode a batch's allocations. A document that does not decode is skipped with an
/// error logged; a complete set missing one is applied as changes only, so that the
/// allocation it describes is not stopped for a decoding problem.
fn decode_batch(update: &pb::AllocationsUpdate) -> (Vec<ClientAllocation>, bool) {
    let mut allocs = Vec::with_capacity(update.allocations_json.len());
    let mut all = true;
    for (i, json) in update.allocations_json.iter().enumerate() {
        match serde_json::from_slice::<ClientAllocation>(json) {
            Ok(a) => allocs.push(a),
            Err(e) => {
                all = false;
                tracing::error!(
                    index = update.index,
                    "allocation {i} of a batch from the server does not decode (skipped): {e}"
                );
            }
        }
    }
    (allocs, update.complete && all)
}

/// Stream the node's allocations into `allocs` from `last_index`. Returns only on
/// failure (a server ending the stream included).
async fn watch(
    mut rpc: Rpc,
    node_id: &str,
    secret: &identity::NodeSecret,
    last_index: &mut u64,
    allocs: &Arc<dyn AllocSink>,
    applying: &Arc<tokio::sync::Mutex<()>>,
) -> Ended {
    let req = pb::WatchAllocationsRequest {
        node_id: node_id.to_owned(),
        index: *last_index,
        node_secret: secret.expose().to_owned(),
    };
    let mut stream = match call("watch allocations", rpc.watch_allocations(req)).await {
        Ok(s) => s,
        Err(s) => return failed("watch allocations", &s),
    };
    loop {
        match stream.message().await {
            Ok(Some(update)) => {
                let (batch, complete) = decode_batch(&update);
                tracing::debug!(
                    index = update.index,
                    complete,
                    allocations = batch.len(),
                    "allocations from the server"
                );
                // Applied in a task of its own: a session that fails meanwhile (a
                // missed heartbeat) must not cut an allocation change in half. The
                // index only moves on once it is done, so a batch cut short by the
                // agent stopping is sent again next time. One apply at a time: a
                // later session waits for the earlier one's.
                let sink = allocs.clone();
                let slot = applying.clone().lock_owned().await;
                let applied = tokio::spawn(async move {
                    let _slot = slot;
                    sink.apply(batch, complete).await;
                });
                if let Err(e) = applied.await {
                    return Ended::Failed(format!("applying allocations panicked: {e}"));
                }
                *last_index = next_index(*last_index, update.index, update.complete);
            }
            Ok(None) => return Ended::Failed("the server ended the allocation stream".into()),
            Err(s) => return failed("allocation stream", &s),
        }
    }
}

/// Queue reports as they come and send them when [`FlushClock`] says. Returns only on
/// failure; whatever was not acknowledged stays queued (and is sent at once on the next
/// connection).
async fn reports(
    mut rpc: Rpc,
    node_id: &str,
    secret: &identity::NodeSecret,
    queue: &mut StatusQueue,
    updates: &mut mpsc::UnboundedReceiver<AllocClientUpdate>,
    open: &mut bool,
) -> Ended {
    let mut clock = FlushClock::default();
    if !queue.is_empty() {
        clock.queued(Instant::now());
    }
    loop {
        let due = clock.due();
        tokio::select! {
            u = updates.recv(), if *open => match u {
                Some(u) => {
                    queue.push(u);
                    clock.queued(Instant::now());
                }
                None => *open = false,
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                clock.sent(Instant::now());
                while !queue.is_empty() {
                    let batch = queue.batch(MAX_REPORTS_PER_CALL);
                    let updates_json = match batch
                        .updates()
                        .map(serde_json::to_vec)
                        .collect::<Result<Vec<_>, _>>()
                    {
                        Ok(v) => v,
                        Err(e) => return Ended::Failed(format!("encoding status reports: {e}")),
                    };
                    let req = pb::UpdateAllocationsRequest {
                        node_id: node_id.to_owned(),
                        updates_json,
                        node_secret: secret.expose().to_owned(),
                    };
                    match call("update allocations", rpc.update_allocations(req)).await {
                        Ok(_) => queue.ack(batch),
                        Err(s) if matches!(
                            s.code(),
                            tonic::Code::InvalidArgument | tonic::Code::NotFound
                        ) => {
                            // The server will never take these (malformed, or about an
                            // allocation it does not give this node); keeping them
                            // would block every later report.
                            tracing::error!(
                                reports = batch.len(),
                                "the server refused status reports (dropped): {}",
                                s.message()
                            );
                            queue.ack(batch);
                        }
                        Err(s) => return failed("update allocations", &s),
                    }
                }
            }
        }
    }
}
