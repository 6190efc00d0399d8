//! Leadership: which server runs the broker, the plan applier, the heartbeat timers
//! and garbage collection, and commits.
//!
//! One server on the embedded store always leads ([`SoleLeader`]). Several servers on
//! etcd campaign through etcd's election API ([`crate::store::EtcdStore::election`]):
//! the winner holds a key bound to its lease, and every commit it makes checks that
//! key's create revision ([`Term::fence`]), so a leader that lost its lease (paused,
//! partitioned) can no longer commit anything, whatever it believes. A server that
//! loses its term stops its leader loops and follows again.

use std::time::SystemTime;

use tokio_util::sync::CancellationToken;

use crate::store::{BoxFuture, Condition, StoreError};

/// A server as the others see it: registered in the store while it runs, and the
/// leader's value in the election.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServerInfo {
    /// Its name, unique in the cluster (`--name`, default the host name).
    pub name: String,
    /// Where nodes and servers reach its RPC listener (`HOST:PORT`).
    pub rpc_addr: String,
    /// Where users reach its HTTP API (`HOST:PORT`).
    pub http_addr: String,
    /// Whether its listeners use TLS.
    #[serde(default)]
    pub tls: bool,
    /// Its version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// When it started (seconds since the epoch).
    pub started: u64,
}

impl ServerInfo {
    /// Seconds since the epoch, for [`ServerInfo::started`].
    pub fn now() -> u64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// One term of leadership.
#[derive(Debug)]
pub struct Term {
    /// Conditions every commit of this term adds to its transaction: they fail once
    /// the term is over (etcd: the election key's create revision; none for the sole
    /// leader).
    pub fence: Vec<Condition>,
    /// Fires when the term is over (lease lost or expired, key deleted, resigned).
    /// The leader loops stop on it.
    pub lost: CancellationToken,
    /// A number that grows with every term in the cluster (the election key's create
    /// revision; 1 for the sole leader), for logs and `server status`.
    pub id: u64,
}

/// What [`Election::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameClaim {
    /// The name is this server's: it is registered under it.
    Claimed,
    /// Another live server holds the name: its registration.
    HeldBy(ServerInfo),
}

impl ServerInfo {
    /// The same server, as far as others can tell: same name and addresses. A server
    /// restarted before its old registration expired is the same server (its
    /// listeners are bound before it claims its name, so no other live process on
    /// its host holds those addresses).
    pub fn same_server(&self, other: &ServerInfo) -> bool {
        self.name == other.name
            && self.rpc_addr == other.rpc_addr
            && self.http_addr == other.http_addr
    }
}

/// How a server becomes leader and learns who leads.
pub trait Election: Send + Sync + 'static {
    /// Campaign until this server leads, then return its term. Fails only when the
    /// store cannot be reached (the caller retries after a pause); a server that is
    /// shutting down drops the future.
    fn campaign(&self, me: ServerInfo) -> BoxFuture<'_, Result<Term, StoreError>>;

    /// The leader now, as the store says (`None`: no leader at the moment).
    fn leader(&self) -> BoxFuture<'_, Result<Option<ServerInfo>, StoreError>>;

    /// Keep `me` registered as a member of the cluster while the returned future runs
    /// (etcd: a key bound to a lease of this server); it ends only when the store
    /// fails for good or when dropped.
    fn register(&self, me: ServerInfo) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Register `me` under its name unless another live server holds it, in one step
    /// of the store (etcd: a transaction that creates the key only if it is absent), so
    /// that of two servers starting at once with one name exactly one gets it. A
    /// registration of [`ServerInfo::same_server`] is this server's own from before a
    /// restart and is taken over. Call it once at start, before serving.
    ///
    /// The default, for an election that cannot do it in one step, asks
    /// [`Election::members`] (a server starting at the same moment can be missed).
    fn claim(&self, me: ServerInfo) -> BoxFuture<'_, Result<NameClaim, StoreError>> {
        Box::pin(async move {
            let members = self.members().await?;
            Ok(
                match members
                    .into_iter()
                    .find(|m| m.name == me.name && !m.same_server(&me))
                {
                    Some(other) => NameClaim::HeldBy(other),
                    None => NameClaim::Claimed,
                },
            )
        })
    }

    /// The servers registered now.
    fn members(&self) -> BoxFuture<'_, Result<Vec<ServerInfo>, StoreError>>;

    /// How long a leader that stopped renewing stays leader at most (the lease TTL).
    fn lease_ttl(&self) -> std::time::Duration;

    /// Give up leadership now if this server leads: its term's `lost` fires and
    /// another server's campaign can win at once. A later [`Election::campaign`]
    /// starts afresh. Errors are logged (the lease's expiry ends the term anyway).
    fn resign(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// The server is shutting down: resign and end its registration at once (etcd:
    /// revoke its lease), so that another server takes over without waiting for the
    /// lease TTL. Call it once, after the leader loops stopped and before exiting;
    /// afterwards [`Election::register`] returns `Ok(())` and
    /// [`Election::campaign`] fails.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The embedded store's election: the one server always leads, with no fence (no
/// other server can write its store: redb holds an exclusive lock on the file).
#[derive(Debug, Default)]
pub struct SoleLeader {
    me: std::sync::Mutex<Option<ServerInfo>>,
}

impl Election for SoleLeader {
    fn campaign(&self, me: ServerInfo) -> BoxFuture<'_, Result<Term, StoreError>> {
        *self.me.lock().unwrap_or_else(|p| p.into_inner()) = Some(me);
        Box::pin(async {
            Ok(Term {
                fence: Vec::new(),
                lost: CancellationToken::new(),
                id: 1,
            })
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<ServerInfo>, StoreError>> {
        let me = self.me.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { Ok(me) })
    }

    fn register(&self, me: ServerInfo) -> BoxFuture<'_, Result<(), StoreError>> {
        *self.me.lock().unwrap_or_else(|p| p.into_inner()) = Some(me);
        Box::pin(std::future::pending())
    }

    fn members(&self) -> BoxFuture<'_, Result<Vec<ServerInfo>, StoreError>> {
        let me = self.me.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { Ok(me.into_iter().collect()) })
    }

    fn lease_ttl(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}
