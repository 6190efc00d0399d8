//! The etcd store: the server's state in an etcd cluster (3.4 or newer), shared by
//! several servers, and their leader election.
//!
//! - Keys: `<prefix><key>` for every key of the layout in [`super`] (prefix `/drover/`
//!   by default), plus `<prefix>meta/index` (the cluster index, a decimal counter:
//!   every commit compares its mod revision and increments it, so commits are
//!   serialised across servers and the index moves by one per commit whatever else
//!   moves etcd's revision), `<prefix>schema` (`"1"`), `<prefix>election` (the
//!   election's name; the candidates' keys are `<prefix>election/<lease id, hex>`) and
//!   `<prefix>servers/<name>` (a server's [`ServerInfo`](crate::store::election::ServerInfo),
//!   bound to its lease). [`Store::range`] and [`Store::watch`] show only the state's
//!   keys, never `meta/`, `schema`, `election/` or `servers/`.
//! - Values: the same JSON documents as the embedded store's; fields added later are
//!   `#[serde(default)]`, so a newer server reads what an older one wrote; the
//!   `schema` key says which layout the keys follow ([`EtcdStore::connect`] refuses
//!   another).
//! - Revisions: the store's revision ([`Store::revision`], [`TxnOutcome::revision`],
//!   the revision [`Store::range`] returns) is the index counter. A [`KeyValue`]'s
//!   `create_revision`/`mod_revision` and the revisions in [`Condition`]s are etcd's
//!   own (they only need to agree with each other: a condition compares what a range
//!   or watch returned).
//! - [`Store::range`]: read the index key, then the keys page by page at that same
//!   etcd revision: one consistent snapshot.
//! - [`Store::txn`]: one etcd `Txn`: the conditions (fence) and a compare of the mod
//!   revision of `meta/index` with the one this store instance last saw (from its own
//!   range, commit or watch), then the ops and `meta/index` = index + 1. A second
//!   writer that has not read the latest commit is refused. Duplicate keys in one
//!   transaction: the last op wins (etcd refuses duplicates). A transaction beyond
//!   [`TxnLimits`](super::TxnLimits) is split into parts sent in order (see
//!   [`TxnLimits`](super::TxnLimits)); each part
//!   checks the conditions and the index, only the last moves it. A failed commit
//!   reports the current index and does not teach this instance the new index: it
//!   must read again ([`Store::range`]) before it can commit.
//! - [`Store::watch`]: an etcd watch on the prefix from the etcd revision at which this
//!   instance saw the index it is asked for ([`WatchEvent::Reset`](super::WatchEvent::Reset) if it does not
//!   know it, or etcd compacted that far); the events of one etcd revision make one
//!   [`StoreChange`](super::StoreChange), whose revision is the new index when that
//!   etcd revision moved the index (`None`: a part of a split transaction). A lost
//!   connection is resumed on the next endpoint from the last revision seen. The
//!   stream ends after a `Reset`: read again and watch from there.
//! - Election ([`EtcdStore::election`]): etcd's `v3election` API (Campaign / Leader /
//!   Resign) with one lease per store instance, granted with the TTL
//!   [`EtcdOptions::lease_ttl`] and kept alive every TTL/3; the leader's term is fenced
//!   by its election key's create revision, and ends (`Term::lost`) when the lease is
//!   gone, when no keepalive succeeded for a TTL (measured from the send of the last
//!   answered one, so never later than etcd's own expiry), or when the key is deleted.
//!   [`Election::close`] revokes the lease on shutdown, so another server takes over
//!   at once; a lease given up for want of answers is revoked as soon as etcd answers
//!   again (etcd renews every lease's TTL when it restarts, so the old election key
//!   would otherwise hold the next leader back for a TTL).
//! - Endpoints: `http://`, or `https://` with [`EtcdTls`] (etcd's CA, and a client
//!   certificate for an etcd that checks them). A call goes to the endpoint
//!   that answered last; reads move on to the next endpoint when one cannot be reached,
//!   writes only when the request surely never left (otherwise the error says the
//!   outcome is unknown, and the caller reads again).
//!
//! etcd's API is compiled from our own trimmed copy of its `.proto` files (the
//! messages and fields we use, same names and numbers) by `protox`, as the rest of
//! `drover-proto`: no system `protoc` (the `etcd-client` crate's build script needs
//! one).

mod client;
mod election;
mod inner;
mod keys;
mod options;
mod watch;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use self::client::Client;
use self::election::EtcdElection;
use self::inner::{Inner, Seen};
use super::{
    BoxFuture, Condition, EndpointHealth, KeyValue, Op, Store, StoreError, TxnOutcome, WatchStream,
};
use crate::store::election::Election;

pub use self::options::{EtcdOptions, EtcdTls, SCHEMA_VERSION};

/// etcd's smallest lease TTL with its default timing.
const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The state in etcd. Cheap to clone (clones share the connection, what this
/// instance knows of the index, and the election).
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
    election: Arc<EtcdElection>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.options.endpoints)
            .field("prefix", &self.inner.options.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connect (an endpoint must answer within `request_timeout`) and check the schema
    /// under the prefix (writing it on first use).
    pub async fn connect(mut options: EtcdOptions) -> Result<EtcdStore, StoreError> {
        if options.prefix.is_empty() || !options.prefix.ends_with('/') {
            return Err(StoreError::Backend(format!(
                "etcd prefix {:?} must end with '/' (e.g. /drover/)",
                options.prefix
            )));
        }
        options.lease_ttl = options.lease_ttl.max(MIN_LEASE_TTL);
        if options.limits.max_ops < 2 {
            return Err(StoreError::Backend(format!(
                "etcd transaction limit of {} ops is too small (at least 2)",
                options.limits.max_ops
            )));
        }
        let client = Arc::new(Client::new(
            &options.endpoints,
            options.request_timeout,
            options.tls.as_ref(),
        )?);
        let inner = Arc::new(Inner {
            client: client.clone(),
            seen: Mutex::new(Seen::default()),
            closed: CancellationToken::new(),
            options,
        });
        inner.check_schema().await?;
        let election = Arc::new(EtcdElection::new(
            client,
            inner.options.prefix.clone(),
            inner.options.lease_ttl,
        ));
        Ok(EtcdStore { inner, election })
    }

    /// The leader election on this store (one per store instance, sharing its lease),
    /// for [`crate::Server::start`]'s leadership loop. Call [`Election::close`] at
    /// shutdown to hand leadership over at once.
    pub fn election(&self) -> Arc<dyn Election> {
        self.election.clone()
    }

    /// The options in force (lease TTL raised to etcd's minimum).
    pub fn options(&self) -> &EtcdOptions {
        &self.inner.options
    }

    /// Revoke this instance's lease (its leadership and registration end at once) and
    /// stop its background tasks; the store can still be read and written.
    pub async fn close(&self) {
        self.election.close().await;
    }
}

impl Store for EtcdStore {
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, u64), StoreError>> {
        let prefix = prefix.to_owned();
        Box::pin(async move { self.inner.range(&prefix).await })
    }

    fn txn(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<Op>,
    ) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(self.inner.txn(conditions, ops))
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let (index, _, _) = self.inner.read_index("revision").await?;
            Ok(index)
        })
    }

    fn watch(&self, revision: u64) -> WatchStream {
        watch::watch(self.inner.clone(), revision)
    }

    fn limits(&self) -> super::TxnLimits {
        self.inner.options.limits
    }

    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn health(&self) -> BoxFuture<'_, Vec<EndpointHealth>> {
        Box::pin(self.inner.health())
    }
}

#[cfg(test)]
mod tests {
    use super::keys::{dedup, is_state_key, split};
    use super::*;

    fn put(k: &str, n: usize) -> Op {
        Op::Put {
            key: k.into(),
            value: vec![b'x'; n],
        }
    }

    #[test]
    fn dedup_keeps_the_last_write_of_each_key() {
        let ops = vec![put("a", 1), put("b", 1), Op::Delete { key: "a".into() }];
        assert_eq!(
            dedup(ops),
            vec![put("b", 1), Op::Delete { key: "a".into() }]
        );
    }

    #[test]
    fn split_respects_ops_and_bytes_and_refuses_one_op_too_big() {
        let limits = super::super::TxnLimits {
            max_ops: 4,
            max_bytes: 1000,
        };
        let parts = split(
            (0..7).map(|i| put(&format!("k{i}"), 1)).collect(),
            limits,
            8,
            0,
        )
        .unwrap();
        assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
        let parts = split(
            (0..4).map(|i| put(&format!("k{i}"), 300)).collect(),
            limits,
            8,
            0,
        )
        .unwrap();
        assert!(parts.len() >= 2, "{} parts", parts.len());
        let e = split(vec![put("big", 5000)], limits, 8, 0).unwrap_err();
        assert!(matches!(e, StoreError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains("\"big\""), "{e}");
        let e = split(vec![], limits, 8, 4).unwrap_err();
        assert!(matches!(e, StoreError::TooLarge(_)), "{e}");
        assert_eq!(split(vec![], limits, 8, 0).unwrap().len(), 1);
    }

    #[test]
    fn only_state_keys_are_shown() {
        for k in ["job/a", "node/1", "alloc/x", "eval/y", "jobv/a/1"] {
            assert!(is_state_key(k), "{k}");
        }
        for k in ["meta/index", "schema", "election/694d", "servers/s1"] {
            assert!(!is_state_key(k), "{k}");
        }
    }
}
