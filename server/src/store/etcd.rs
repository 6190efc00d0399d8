//! The etcd store: the server's state in an etcd cluster, shared by several servers,
//! and their leader election (FOUNDATION STUB: the contract only).
//!
//! - Keys: `<prefix><key>` for every key of the layout in [`super`] (prefix `/drover/`
//!   by default), plus `<prefix>meta/index` (the cluster index, a decimal counter:
//!   every commit compares its mod revision and increments it, so commits are
//!   serialised across servers and the index moves by one per commit whatever else
//!   moves etcd's revision), `<prefix>election` (the election's name) and
//!   `<prefix>servers/<name>` (a server's [`ServerInfo`], bound to its lease).
//! - Values: the same JSON documents as the embedded store's; fields added later are
//!   `#[serde(default)]`, so a newer server reads what an older one wrote; the
//!   `schema` key says which layout the keys follow.
//! - [`Store::txn`]: one etcd `Txn`: the conditions (fence) and the index compare, then
//!   the ops and the index increment. A transaction beyond [`TxnLimits`] is split
//!   (see [`TxnLimits`]); each part checks the conditions.
//! - [`Store::watch`]: an etcd watch on the prefix from the revision the last range was
//!   read at; the events of one etcd revision make one [`super::StoreChange`].
//! - Election: etcd's `v3election` API (Campaign / Leader / Resign) with a lease kept
//!   alive by this server; the leader's term is fenced by its election key's create
//!   revision.
//!
//! etcd's API is compiled from our own trimmed copy of its `.proto` files (the
//! messages and fields we use, same names and numbers) by `protox`, as the rest of
//! `drover-proto`: no system `protoc` (the `etcd-client` crate's build script needs
//! one).

use std::sync::Arc;
use std::time::Duration;

use super::{BoxFuture, Condition, EndpointHealth, KeyValue, Op, Store, StoreError, TxnOutcome};
use crate::leader::Election;

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `http://HOST:PORT` (or `https://`), at least one.
    pub endpoints: Vec<String>,
    /// Prefix of every key (`/drover/` by default; several clusters can share an etcd).
    pub prefix: String,
    /// TTL of this server's lease: how long a leader that stops renewing (killed,
    /// paused, partitioned) keeps its leadership at most. At least 2 s (etcd's
    /// minimum with its default timing).
    pub lease_ttl: Duration,
    /// How long one request may take before the endpoint counts as down.
    pub request_timeout: Duration,
    /// The largest transaction etcd takes (its `--max-txn-ops`,
    /// `--max-request-bytes`).
    pub limits: super::TxnLimits,
}

impl EtcdOptions {
    /// Defaults for `endpoints`: prefix `/drover/`, lease TTL 10 s, requests 5 s,
    /// etcd's default limits (128 ops, 1.5 MiB).
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdOptions {
            endpoints,
            prefix: "/drover/".into(),
            lease_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            limits: super::TxnLimits {
                max_ops: 128,
                max_bytes: 1536 * 1024,
            },
        }
    }
}

/// The state in etcd.
#[derive(Clone)]
pub struct EtcdStore {
    options: Arc<EtcdOptions>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.options.endpoints)
            .field("prefix", &self.options.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connect (an endpoint must answer within `request_timeout`) and check the schema
    /// under the prefix (writing it on first use).
    pub async fn connect(options: EtcdOptions) -> Result<EtcdStore, StoreError> {
        Err(StoreError::Backend(format!(
            "FOUNDATION STUB: the etcd store ({:?}) is not built yet",
            options.endpoints
        )))
    }

    /// The leader election on this store, for [`crate::Server::start_with`].
    pub fn election(&self) -> Arc<dyn Election> {
        unimplemented!("FOUNDATION STUB")
    }
}

impl Store for EtcdStore {
    fn range(&self, _prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, u64), StoreError>> {
        Box::pin(async { Err(StoreError::Backend("FOUNDATION STUB".into())) })
    }

    fn txn(
        &self,
        _conditions: Vec<Condition>,
        _ops: Vec<Op>,
    ) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(async { Err(StoreError::Backend("FOUNDATION STUB".into())) })
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async { Err(StoreError::Backend("FOUNDATION STUB".into())) })
    }

    fn limits(&self) -> super::TxnLimits {
        self.options.limits
    }

    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn health(&self) -> BoxFuture<'_, Vec<EndpointHealth>> {
        Box::pin(async { Vec::new() })
    }
}
