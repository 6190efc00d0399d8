//! The durable state behind the server: a key-value store with revisions and
//! compare-and-set, the model etcd offers, so that the embedded store (redb, one
//! server) and the etcd store (several servers) are interchangeable. With the cargo
//! feature `testing`, a third one lives in memory (`MemStore`, for tests).
//!
//! The server keeps the whole state in memory, indexed for the scheduler, and writes
//! every change through [`Store::txn`] before it acknowledges it and before it applies
//! it in memory. On start (or when it becomes leader) it reads everything back with
//! [`Store::range`]. The store's revision is the cluster's index: it grows with every
//! committed transaction and is what `create_index` / `modify_index` and blocking
//! queries count in.
//!
//! Keys (values are JSON documents of `drover_server_api` types):
//!
//! | key | value |
//! |---|---|
//! | `job/<name>` | `Job` (the current version) |
//! | `jobv/<name>/<version, 20 digits>` | `Job` (every kept version) |
//! | `node/<id>` | `Node` |
//! | `alloc/<id>` | `Allocation` |
//! | `eval/<id>` | `Evaluation` |
//! | `service/<id>` | `ServiceRegistration` (Nomad's `_nomad-task-...` id) |
//! | `schema` | the schema version, `"1"` |
//!
//! With several servers (the etcd store) every key lives under the store's prefix
//! (`/drover/` by default), the store keeps its own index counter beside them (etcd's
//! revision also moves for writes that are not commits: leader elections, server
//! registrations), and only the elected leader commits, each commit fenced by its
//! leadership ([`crate::leader`]). Followers follow the leader's commits through
//! [`Store::watch`].

use std::future::Future;
use std::pin::Pin;

/// A boxed future, so that [`Store`] can be used as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A key with its value and revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// Revision of the transaction that created the key.
    pub create_revision: u64,
    /// Revision of the transaction that last wrote it.
    pub mod_revision: u64,
}

/// A condition a transaction checks before it writes anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The key was last written at `revision` (0: the key does not exist).
    ModRevision {
        /// The key.
        key: String,
        /// Expected mod revision.
        revision: u64,
    },
    /// The key was created at `revision` (0: the key does not exist). This is how a
    /// leader fences its writes on etcd: its leadership key's create revision.
    CreateRevision {
        /// The key.
        key: String,
        /// Expected create revision.
        revision: u64,
    },
}

/// A write within a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create or replace.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Remove (a missing key is not an error).
    Delete {
        /// The key.
        key: String,
    },
}

/// What a transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Every condition held and every op was applied.
    pub succeeded: bool,
    /// The store's revision after the transaction (unchanged when it did not succeed).
    pub revision: u64,
}

/// Why the store failed. Nothing of a failed call was written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be used (I/O, corruption, connection lost).
    #[error("{0}")]
    Backend(String),
    /// The store holds data of an unknown schema or a value that does not decode.
    #[error("corrupt state: {0}")]
    Corrupt(String),
    /// A transaction is larger than the store accepts.
    #[error("transaction too large: {0}")]
    TooLarge(String),
}

/// One transaction committed to the store by any server, as [`Store::watch`] reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreChange {
    /// The store's revision (the cluster index) after this change. `None` for a part
    /// of a transaction the store had to split ([`TxnLimits`]): the parts before the
    /// last one do not move the revision; a follower keeps them until the part that
    /// does, so that it never shows half a commit.
    pub revision: Option<u64>,
    /// Keys written, with their new values.
    pub puts: Vec<KeyValue>,
    /// Keys deleted.
    pub deletes: Vec<String>,
}

/// What [`Store::watch`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The next change, in commit order.
    Change(StoreChange),
    /// The watch could not go on from where it was (it fell behind the store's
    /// compaction, or the store was unreachable for long): the watcher must read
    /// everything again with [`Store::range`] and watch from there.
    Reset,
}

/// A boxed stream of watch events.
pub type WatchStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<WatchEvent, StoreError>> + Send + 'static>>;

/// The largest transaction a store takes in one piece. [`Store::txn`] splits larger
/// ones into several, in order, each checking the conditions; only the last moves the
/// revision. If one part fails, the parts before it stay written: the ops of a
/// `crate::state::Batch` are ordered so that such a prefix is harmless (deletions,
/// then documents, evaluations last, so that an unfinished plan leaves its evaluation
/// pending and the next leader runs it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnLimits {
    /// Ops per transaction (etcd: `--max-txn-ops`, 128 by default).
    pub max_ops: usize,
    /// Bytes of keys and values per transaction (etcd: `--max-request-bytes`,
    /// 1.5 MiB by default; a margin is kept for the request's framing).
    pub max_bytes: usize,
}

impl TxnLimits {
    /// No limit (the embedded store).
    pub const UNLIMITED: TxnLimits = TxnLimits {
        max_ops: usize::MAX,
        max_bytes: usize::MAX,
    };
}

/// Health of one endpoint of the store, for `drover server status`: the API's type,
/// served as is.
pub use drover_server_api::StoreEndpointHealth as EndpointHealth;

/// A key-value store with revisions and compare-and-set.
///
/// Every method is atomic; a transaction that returns `Ok` is durable.
pub trait Store: Send + Sync + 'static {
    /// Every key starting with `prefix` (all keys for `""`), in key order, and the
    /// revision they were read at.
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, u64), StoreError>>;

    /// If every condition holds, apply every op in one transaction, durable before this
    /// returns, and move the revision on by one.
    fn txn(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<Op>,
    ) -> BoxFuture<'_, Result<TxnOutcome, StoreError>>;

    /// The current revision.
    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// The changes committed after `revision`, by any server, in order, for ever
    /// (reconnecting as needed; [`WatchEvent::Reset`] when it cannot go on from where
    /// it was). The embedded store has one writer, the server itself, so its watch
    /// never yields.
    fn watch(&self, revision: u64) -> WatchStream {
        let _ = revision;
        Box::pin(futures_util::stream::pending())
    }

    /// The largest transaction taken in one piece.
    fn limits(&self) -> TxnLimits {
        TxnLimits::UNLIMITED
    }

    /// `"embedded"` or `"etcd"` (`"memory"` for the test store).
    fn kind(&self) -> &'static str;

    /// Each endpoint's health (one entry for the embedded store).
    fn health(&self) -> BoxFuture<'_, Vec<EndpointHealth>>;
}

pub mod election;
pub mod etcd;
#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod redb;

pub use self::etcd::{EtcdOptions, EtcdStore};
#[cfg(any(test, feature = "testing"))]
pub use self::mem::MemStore;
pub use self::redb::RedbStore;
