//! The etcd store: the server's state in an etcd cluster (3.4 or newer), shared by
//! several servers, and their leader election.
//!
//! - Keys: `<prefix><key>` for every key of the layout in [`super`] (prefix `/drover/`
//!   by default), plus `<prefix>meta/index` (the cluster index, a decimal counter:
//!   every commit compares its mod revision and increments it, so commits are
//!   serialised across servers and the index moves by one per commit whatever else
//!   moves etcd's revision), `<prefix>schema` (`"1"`), `<prefix>election` (the
//!   election's name; the candidates' keys are `<prefix>election/<lease id, hex>`) and
//!   `<prefix>servers/<name>` (a server's [`ServerInfo`](crate::leader::ServerInfo),
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
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_proto::etcd::etcdserverpb as pb;
use tokio_util::sync::CancellationToken;

use self::client::{Client, Retry, kv};
use self::election::EtcdElection;
use super::{
    BoxFuture, Condition, EndpointHealth, KeyValue, Op, Store, StoreError, TxnOutcome, WatchStream,
};
use crate::leader::Election;

/// Schema version this build writes and reads under the prefix.
pub const SCHEMA_VERSION: &str = "1";
/// Keys read per range request.
const PAGE: i64 = 500;
/// Bytes kept free in every transaction for the request's framing (key prefixes,
/// compares, protobuf tags).
const FRAMING_MARGIN: usize = 64 * 1024;
/// Index → etcd revision pairs remembered for [`Store::watch`].
const KNOWN_INDEXES: usize = 4096;
/// etcd's smallest lease TTL with its default timing.
const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `http://HOST:PORT` or `https://HOST:PORT` (with [`EtcdOptions::tls`]), at
    /// least one.
    pub endpoints: Vec<String>,
    /// Prefix of every key (`/drover/` by default; several clusters can share an
    /// etcd). Must end with `/`.
    pub prefix: String,
    /// TTL of this server's lease: how long a leader that stops renewing (killed,
    /// paused, partitioned) keeps its leadership at most. At least 2 s (etcd's
    /// minimum with its default timing); shorter is raised to 2 s.
    pub lease_ttl: Duration,
    /// How long one request may take before the endpoint counts as down.
    pub request_timeout: Duration,
    /// The largest transaction etcd takes (its `--max-txn-ops`,
    /// `--max-request-bytes`).
    pub limits: super::TxnLimits,
    /// TLS to etcd's client port, for `https://` endpoints (`None`: plain http).
    pub tls: Option<EtcdTls>,
}

/// TLS to etcd (`https://` endpoints): the CA that signed etcd's certificates and,
/// for an etcd run with `--client-cert-auth`, this server's client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the CA (etcd's `--trusted-ca-file` side of the handshake).
    pub ca: std::path::PathBuf,
    /// PEM client certificate (with `key`), when etcd checks client certificates.
    pub cert: Option<std::path::PathBuf>,
    /// PEM key of `cert`.
    pub key: Option<std::path::PathBuf>,
    /// Name to check etcd's certificate against (default: the endpoint's host).
    pub server_name: Option<String>,
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
            tls: None,
        }
    }
}

/// The state in etcd. Cheap to clone (clones share the connection, what this
/// instance knows of the index, and the election).
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
    election: Arc<EtcdElection>,
}

pub(crate) struct Inner {
    options: EtcdOptions,
    client: Arc<Client>,
    seen: Mutex<Seen>,
    /// Fires when the last clone of the store is dropped: watch tasks stop.
    closed: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// What this store instance knows of the index.
#[derive(Debug, Default)]
struct Seen {
    /// The newest index seen.
    index: u64,
    /// Mod revision of `meta/index` when it held `index` (0: absent).
    index_mod: i64,
    /// For an index: the etcd revision a watch for the changes after it may start
    /// after (the index key's mod revision, or the range's revision for index 0).
    watch_from: BTreeMap<u64, i64>,
}

impl Seen {
    fn note(&mut self, index: u64, index_mod: i64, watch_from: i64) {
        if index_mod >= self.index_mod {
            self.index = index;
            self.index_mod = index_mod;
        }
        let e = self.watch_from.entry(index).or_insert(watch_from);
        *e = (*e).min(watch_from);
        while self.watch_from.len() > KNOWN_INDEXES {
            self.watch_from.pop_first();
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.options.endpoints)
            .field("prefix", &self.inner.options.prefix)
            .finish()
    }
}

/// Keys a new prefix's check for a nested cluster reads at most.
const NESTED_SCAN: i64 = 10_000;

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

impl Inner {
    fn key(&self, k: &str) -> Vec<u8> {
        format!("{}{k}", self.options.prefix).into_bytes()
    }

    fn index_key(&self) -> Vec<u8> {
        self.key(INDEX_KEY)
    }

    /// One range (count only) over `key` .. `range_end` (empty: `key` alone).
    async fn count(&self, key: Vec<u8>, range_end: Vec<u8>) -> Result<i64, StoreError> {
        let req = pb::RangeRequest {
            key,
            range_end,
            count_only: true,
            ..Default::default()
        };
        let resp = self
            .client
            .unary("prefix check", Retry::Idempotent, |ch| {
                let r = req.clone();
                async move { kv(ch).range(r).await }
            })
            .await?;
        Ok(resp.count)
    }

    /// Prefixes must not nest: two clusters whose keys overlap would read (and
    /// delete) each other's state. Refused: a prefix inside another cluster's (a
    /// `schema` key at a parent prefix), and a new prefix (no `schema` of its own
    /// yet) with another cluster's `<…>/schema` below it.
    async fn check_prefix(&self) -> Result<(), StoreError> {
        let prefix = &self.options.prefix;
        let nested = |other: &str| {
            StoreError::Backend(format!(
                "etcd prefix {prefix:?} overlaps the cluster at {other:?}: prefixes of \
                 clusters sharing an etcd must not nest (use --etcd-prefix with a \
                 prefix of its own, e.g. /drover-b/)"
            ))
        };
        // Every parent prefix ending in '/': "/a/b/" has "/a/" and "/".
        let mut parents: Vec<&str> = prefix[..prefix.len() - 1]
            .match_indices('/')
            .map(|(i, _)| &prefix[..=i])
            .collect();
        parents.dedup();
        for parent in parents {
            let key = format!("{parent}schema").into_bytes();
            if self.count(key, Vec::new()).await? > 0 {
                return Err(nested(parent));
            }
        }
        // A new prefix (no schema of its own yet; other servers of this cluster may
        // be starting at once and writing theirs): another cluster's `schema` below
        // it. Only keys are read, and at most NESTED_SCAN of them.
        let own = self.key("schema");
        if self.count(own.clone(), Vec::new()).await? == 0 {
            let full = prefix.as_bytes().to_vec();
            let req = pb::RangeRequest {
                range_end: client::prefix_end(&full),
                key: full,
                keys_only: true,
                limit: NESTED_SCAN,
                ..Default::default()
            };
            let resp = self
                .client
                .unary("prefix check", Retry::Idempotent, |ch| {
                    let r = req.clone();
                    async move { kv(ch).range(r).await }
                })
                .await?;
            if let Some(kv) = resp
                .kvs
                .iter()
                .find(|kv| kv.key != own && kv.key.ends_with(b"/schema"))
            {
                let key = String::from_utf8_lossy(&kv.key);
                let other = key.strip_suffix("schema").unwrap_or(&key);
                return Err(nested(other));
            }
        }
        Ok(())
    }

    async fn check_schema(&self) -> Result<(), StoreError> {
        self.check_prefix().await?;
        let key = self.key("schema");
        let req = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Create as i32,
                key: key.clone(),
                target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
            }],
            success: vec![put_op(key.clone(), SCHEMA_VERSION.as_bytes().to_vec())],
            failure: vec![range_op(key.clone())],
        };
        // Idempotent: the compare makes a repeat harmless.
        let resp = self
            .client
            .unary("schema check", Retry::Idempotent, |ch| {
                let r = req.clone();
                async move { kv(ch).txn(r).await }
            })
            .await?;
        if resp.succeeded {
            return Ok(());
        }
        let found = first_range_kv(&resp.responses)
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            .unwrap_or_default();
        if found != SCHEMA_VERSION {
            return Err(StoreError::Corrupt(format!(
                "etcd prefix {:?} holds schema {found:?}; this server reads schema \
                 {SCHEMA_VERSION:?} (use another --etcd-prefix or a matching server version)",
                self.options.prefix
            )));
        }
        Ok(())
    }

    /// The index key at the newest revision: (index, its mod revision, etcd revision).
    async fn read_index(&self, what: &str) -> Result<(u64, i64, i64), StoreError> {
        let req = pb::RangeRequest {
            key: self.index_key(),
            ..Default::default()
        };
        let resp = self
            .client
            .unary(what, Retry::Idempotent, |ch| {
                let r = req.clone();
                async move { kv(ch).range(r).await }
            })
            .await?;
        let rev = header_revision(resp.header.as_ref());
        let (index, index_mod) = self.decode_index(resp.kvs.first())?;
        Ok((index, index_mod, rev))
    }

    fn decode_index(
        &self,
        kv: Option<&drover_proto::etcd::mvccpb::KeyValue>,
    ) -> Result<(u64, i64), StoreError> {
        match kv {
            None => Ok((0, 0)),
            Some(kv) => {
                let index = std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "etcd key {}{INDEX_KEY} holds {:?}, not an index",
                            self.options.prefix,
                            String::from_utf8_lossy(&kv.value)
                        ))
                    })?;
                Ok((index, kv.mod_revision))
            }
        }
    }

    async fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, u64), StoreError> {
        // The index key first: its revision fixes the revision of every page.
        let (index, index_mod, rev) = self.read_index("range (index)").await?;
        let full = self.key(prefix);
        let end = client::prefix_end(&full);
        let mut from = full;
        let mut out = Vec::new();
        let mut page = PAGE;
        loop {
            let req = pb::RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                limit: page,
                revision: rev,
                ..Default::default()
            };
            let resp = match self
                .client
                .unary("range", Retry::Idempotent, |ch| {
                    let r = req.clone();
                    async move { kv(ch).range(r).await }
                })
                .await
            {
                Ok(r) => r,
                // A page of large values beyond the largest message we decode: fewer
                // keys per page.
                Err(e) if page > 1 && e.to_string().contains("too large") => {
                    page = (page / 4).max(1);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(last) = resp.kvs.last() else { break };
            from = last.key.clone();
            from.push(0);
            for kv in &resp.kvs {
                let key = self.strip(&kv.key)?;
                if is_state_key(&key) {
                    out.push(KeyValue {
                        key,
                        value: kv.value.clone(),
                        create_revision: to_u64(kv.create_revision),
                        mod_revision: to_u64(kv.mod_revision),
                    });
                }
            }
            if !resp.more {
                break;
            }
        }
        let watch_from = if index_mod == 0 { rev } else { index_mod };
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(index, index_mod, watch_from);
        Ok((out, index))
    }

    /// `key` without the prefix.
    fn strip(&self, key: &[u8]) -> Result<String, StoreError> {
        let p = self.options.prefix.as_bytes();
        let rest = key.strip_prefix(p).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "etcd returned key {:?} outside the prefix {:?}",
                String::from_utf8_lossy(key),
                self.options.prefix
            ))
        })?;
        String::from_utf8(rest.to_vec()).map_err(|_| {
            StoreError::Corrupt(format!(
                "etcd key {:?} is not UTF-8",
                String::from_utf8_lossy(key)
            ))
        })
    }

    fn compare(&self, c: &Condition) -> pb::Compare {
        use pb::compare::{CompareResult, CompareTarget, TargetUnion};
        let (key, target, union) = match c {
            Condition::ModRevision { key, revision } => (
                key,
                CompareTarget::Mod,
                TargetUnion::ModRevision(to_i64(*revision)),
            ),
            Condition::CreateRevision { key, revision } => (
                key,
                CompareTarget::Create,
                TargetUnion::CreateRevision(to_i64(*revision)),
            ),
        };
        pb::Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: self.key(key),
            target_union: Some(union),
        }
    }

    async fn txn(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<Op>,
    ) -> Result<TxnOutcome, StoreError> {
        let parts = split(
            dedup(ops),
            self.options.limits,
            self.options.prefix.len(),
            conditions.len(),
        )?;
        let (index, index_mod) = {
            let s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            (s.index, s.index_mod)
        };
        let mut compare: Vec<pb::Compare> = conditions.iter().map(|c| self.compare(c)).collect();
        compare.push(self.compare(&Condition::ModRevision {
            key: INDEX_KEY.into(),
            revision: to_u64(index_mod),
        }));
        let next = index + 1;
        let n = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let last = i + 1 == n;
            let mut success: Vec<pb::RequestOp> = part
                .into_iter()
                .map(|op| match op {
                    Op::Put { key, value } => put_op(self.key(&key), value),
                    Op::Delete { key } => pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestDeleteRange(
                            pb::DeleteRangeRequest {
                                key: self.key(&key),
                                ..Default::default()
                            },
                        )),
                    },
                })
                .collect();
            if last {
                success.push(put_op(self.index_key(), next.to_string().into_bytes()));
            }
            let req = pb::TxnRequest {
                compare: compare.clone(),
                success,
                failure: vec![range_op(self.index_key())],
            };
            let what = if n > 1 {
                format!("commit of index {next} (part {} of {n})", i + 1)
            } else {
                format!("commit of index {next}")
            };
            let resp = self
                .client
                .unary(&what, Retry::NotSent, |ch| {
                    let r = req.clone();
                    async move { kv(ch).txn(r).await }
                })
                .await?;
            if !resp.succeeded {
                let (current, _) = self.decode_index(first_range_kv(&resp.responses))?;
                if i > 0 {
                    tracing::warn!(
                        index = next,
                        parts_written = i,
                        parts = n,
                        "a split commit was refused after its first parts were written"
                    );
                }
                return Ok(TxnOutcome {
                    succeeded: false,
                    revision: current,
                });
            }
            if last {
                let rev = header_revision(resp.header.as_ref());
                self.seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .note(next, rev, rev);
            }
        }
        Ok(TxnOutcome {
            succeeded: true,
            revision: next,
        })
    }

    /// etcd revision a watch for the changes after `index` starts after; `None` when
    /// it cannot be known.
    async fn watch_from(&self, index: u64) -> Result<Option<i64>, StoreError> {
        if let Some(r) = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .watch_from
            .get(&index)
        {
            return Ok(Some(*r));
        }
        let (current, index_mod, _) = self.read_index("watch (index)").await?;
        Ok((current == index && index_mod > 0).then_some(index_mod))
    }

    fn note_seen(&self, index: u64, rev: i64) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(index, rev, rev);
    }

    async fn health(&self) -> Vec<EndpointHealth> {
        let mut out = Vec::new();
        for i in 0..self.client.len() {
            let (url, ch) = self.client.endpoint(i);
            let r = tokio::time::timeout(
                self.client.timeout(),
                client::maintenance(ch).status(pb::StatusRequest {}),
            )
            .await;
            out.push(match r {
                Ok(Ok(resp)) => {
                    let s = resp.into_inner();
                    let member = s.header.as_ref().map_or(0, |h| h.member_id);
                    EndpointHealth {
                        endpoint: url.to_owned(),
                        healthy: s.errors.is_empty(),
                        version: Some(s.version),
                        db_size: Some(to_u64(s.db_size)),
                        is_leader: member != 0 && member == s.leader,
                        error: (!s.errors.is_empty()).then(|| s.errors.join("; ")),
                    }
                }
                Ok(Err(st)) => unhealthy(url, client::describe(&st)),
                Err(_) => unhealthy(url, format!("no answer within {:?}", self.client.timeout())),
            });
        }
        out
    }
}

fn unhealthy(url: &str, error: String) -> EndpointHealth {
    EndpointHealth {
        endpoint: url.to_owned(),
        healthy: false,
        version: None,
        db_size: None,
        is_leader: false,
        error: Some(error),
    }
}

/// The index counter's key under the prefix.
const INDEX_KEY: &str = "meta/index";

/// A key of the server's state (not the store's or the election's own keys).
fn is_state_key(key: &str) -> bool {
    !(key.starts_with("meta/")
        || key == "schema"
        || key == "election"
        || key.starts_with("election/")
        || key.starts_with("servers/"))
}

fn put_op(key: Vec<u8>, value: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key,
            value,
            lease: 0,
        })),
    }
}

fn range_op(key: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

fn first_range_kv(r: &[pb::ResponseOp]) -> Option<&drover_proto::etcd::mvccpb::KeyValue> {
    r.iter().find_map(|r| match &r.response {
        Some(pb::response_op::Response::ResponseRange(rr)) => rr.kvs.first(),
        _ => None,
    })
}

pub(crate) fn header_revision(h: Option<&pb::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The ops with only the last write of each key, in the order of those last writes
/// (etcd refuses a key twice in one transaction).
fn dedup(ops: Vec<Op>) -> Vec<Op> {
    let key = |op: &Op| match op {
        Op::Put { key, .. } | Op::Delete { key } => key.clone(),
    };
    let mut last: HashMap<String, usize> = HashMap::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        last.insert(key(op), i);
    }
    if last.len() == ops.len() {
        return ops;
    }
    ops.into_iter()
        .enumerate()
        .filter(|(i, op)| last.get(&key(op)) == Some(i))
        .map(|(_, op)| op)
        .collect()
}

/// The ops in parts etcd takes: each at most `max_ops - 1` ops (the last part adds
/// the index) and `max_bytes` less a margin of keys and values. Always at least one
/// (possibly empty) part.
fn split(
    ops: Vec<Op>,
    limits: super::TxnLimits,
    prefix_len: usize,
    conditions: usize,
) -> Result<Vec<Vec<Op>>, StoreError> {
    if conditions + 1 > limits.max_ops {
        return Err(StoreError::TooLarge(format!(
            "{conditions} conditions, etcd takes {} compares per transaction",
            limits.max_ops
        )));
    }
    let max_ops = limits.max_ops.saturating_sub(1).max(1);
    let budget = limits
        .max_bytes
        .saturating_sub(FRAMING_MARGIN.min(limits.max_bytes / 4));
    let mut parts: Vec<Vec<Op>> = vec![Vec::new()];
    let mut bytes = 0usize;
    for op in ops {
        // Key (twice counted: the op and its framing), value, tags.
        let size = match &op {
            Op::Put { key, value } => prefix_len + key.len() + value.len() + 16,
            Op::Delete { key } => prefix_len + key.len() + 16,
        };
        if size > budget {
            let key = match &op {
                Op::Put { key, .. } | Op::Delete { key } => key,
            };
            return Err(StoreError::TooLarge(format!(
                "{key:?} is {size} bytes with its value, more than the {budget} bytes etcd \
                 takes in one request"
            )));
        }
        let cur = parts.last_mut().expect("at least one part");
        if cur.len() >= max_ops || bytes + size > budget {
            parts.push(vec![op]);
            bytes = size;
        } else {
            cur.push(op);
            bytes += size;
        }
    }
    Ok(parts)
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
