//! Server settings.

use std::path::PathBuf;
use std::time::Duration;

/// How nodes are ranked among the feasible ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulerAlgorithm {
    /// Fill nodes up (Nomad's fit score): fewer nodes busy, bigger holes left.
    #[default]
    BinPack,
    /// Spread allocations over nodes: the least used node first.
    Spread,
}

/// What a server runs with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the embedded store lives.
    pub data_dir: PathBuf,
    /// Nodes must heartbeat at least this often.
    pub heartbeat_ttl: Duration,
    /// Extra time after the TTL before a silent node is `down`.
    pub heartbeat_grace: Duration,
    /// After a server start, how long every known node has to reach it before it can be
    /// marked `down` (at least TTL + grace). Clients reconnect with a backoff of up to
    /// 30 s after an outage; without this window a server that was away for a while
    /// would mark every node down and replace every allocation (Nomad's
    /// `failover_heartbeat_ttl`, 5 minutes).
    pub failover_heartbeat_ttl: Duration,
    /// Scheduler workers (default: one per core).
    pub workers: usize,
    /// Ranking of feasible nodes.
    pub algorithm: SchedulerAlgorithm,
    /// Evaluations that failed this often are given up (`failed`).
    pub eval_delivery_limit: u32,
    /// How often garbage collection runs.
    pub gc_interval: Duration,
    /// Terminal allocations (and evaluations of purged jobs) older than this are
    /// deleted; those of a purged job at once once terminal on their client.
    pub alloc_gc_threshold: Duration,
    /// Nodes `down` for longer than this, with no allocation left, are deleted.
    pub node_gc_threshold: Duration,
    /// How a follower reaches the leader to forward writes to it.
    pub forward: ForwardOptions,
    /// The region this server serves (Nomad's; default [`DEFAULT_REGION`]): a job
    /// whose region is set to another one is refused.
    pub region: String,
    /// The datacenter this server says it is in (`/v1/agent/self`).
    pub datacenter: String,
    /// ACLs are enforced on the HTTP API (Nomad's `acl { enabled = true }`): every
    /// request is checked against its token's policies (`X-Nomad-Token`), and the
    /// cluster token is no user credential any more.
    pub acl_enabled: bool,

    /// The keyring's key-encryption key (`--keyring-kek-file`): base64 of 32 bytes,
    /// 0600. Every server of a cluster must be given the same one. `None`: the one in
    /// `<data_dir>/keystore/kek`, generated on first start (a single server).
    pub keyring_kek_file: Option<PathBuf>,
}

/// The region of a server not told otherwise (Nomad's).
pub use drover_server_api::DEFAULT_REGION;

/// How a follower authenticates to the leader when it forwards writes (HTTP writes
/// over the leader's `Api.Forward`, node RPCs to its `Node` service).
#[derive(Clone, Default)]
pub struct ForwardOptions {
    /// The cluster token (the server's own), sent with every forwarded call.
    pub token: Option<String>,
    /// TLS towards the other servers, when their listeners speak it.
    pub tls: Option<ForwardTls>,
}

/// TLS towards the other servers.
#[derive(Debug, Clone)]
pub struct ForwardTls {
    /// CA (PEM) the other servers' certificates chain to.
    pub ca_file: PathBuf,
    /// Certificate and key (PEM) this server presents (servers that require client
    /// certificates): its own.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for ForwardOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("ForwardOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl ServerConfig {
    /// Defaults for a server keeping its state in `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            data_dir: data_dir.into(),
            heartbeat_ttl: Duration::from_secs(10),
            heartbeat_grace: Duration::from_secs(10),
            failover_heartbeat_ttl: Duration::from_secs(300),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            algorithm: SchedulerAlgorithm::BinPack,
            eval_delivery_limit: 3,
            gc_interval: Duration::from_secs(60),
            alloc_gc_threshold: Duration::from_secs(3600),
            node_gc_threshold: Duration::from_secs(24 * 3600),
            forward: ForwardOptions::default(),
            region: DEFAULT_REGION.to_owned(),
            datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
            acl_enabled: false,

            keyring_kek_file: None,
        }
    }
}
