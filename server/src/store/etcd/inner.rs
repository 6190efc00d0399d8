//! The connection to etcd and what one store instance knows of the index, shared by
//! the store, its watches and its election: reads, transactions, the schema check,
//! the endpoints' health.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use drover_proto::etcd::etcdserverpb as pb;
use tokio_util::sync::CancellationToken;

use super::client::{self, Client, Retry, kv};

use super::keys::{
    INDEX_KEY, dedup, first_range_kv, header_revision, is_state_key, put_op, range_op, split,
    to_i64, to_u64,
};
use super::options::{EtcdOptions, SCHEMA_VERSION};
use crate::store::{Condition, EndpointHealth, KeyValue, Op, StoreError, TxnOutcome};

/// Keys read per range request.
pub(super) const PAGE: i64 = 500;
/// Index → etcd revision pairs remembered for [`Store::watch`].
pub(super) const KNOWN_INDEXES: usize = 4096;

pub(super) struct Inner {
    pub(super) options: EtcdOptions,
    pub(super) client: Arc<Client>,
    pub(super) seen: Mutex<Seen>,
    /// Fires when the last clone of the store is dropped: watch tasks stop.
    pub(super) closed: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// What this store instance knows of the index.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// The newest index seen.
    pub(super) index: u64,
    /// Mod revision of `meta/index` when it held `index` (0: absent).
    pub(super) index_mod: i64,
    /// For an index: the etcd revision a watch for the changes after it may start
    /// after (the index key's mod revision, or the range's revision for index 0).
    pub(super) watch_from: BTreeMap<u64, i64>,
}

impl Seen {
    pub(super) fn note(&mut self, index: u64, index_mod: i64, watch_from: i64) {
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

/// Keys a new prefix's check for a nested cluster reads at most.
pub(super) const NESTED_SCAN: i64 = 10_000;

impl Inner {
    pub(super) fn key(&self, k: &str) -> Vec<u8> {
        format!("{}{k}", self.options.prefix).into_bytes()
    }

    pub(super) fn index_key(&self) -> Vec<u8> {
        self.key(INDEX_KEY)
    }

    /// One range (count only) over `key` .. `range_end` (empty: `key` alone).
    pub(super) async fn count(&self, key: Vec<u8>, range_end: Vec<u8>) -> Result<i64, StoreError> {
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
    pub(super) async fn check_prefix(&self) -> Result<(), StoreError> {
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

    pub(super) async fn check_schema(&self) -> Result<(), StoreError> {
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
    pub(super) async fn read_index(&self, what: &str) -> Result<(u64, i64, i64), StoreError> {
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

    pub(super) fn decode_index(
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

    pub(super) async fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, u64), StoreError> {
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
    pub(super) fn strip(&self, key: &[u8]) -> Result<String, StoreError> {
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

    pub(super) fn compare(&self, c: &Condition) -> pb::Compare {
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

    pub(super) async fn txn(
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
    pub(super) async fn watch_from(&self, index: u64) -> Result<Option<i64>, StoreError> {
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

    pub(super) fn note_seen(&self, index: u64, rev: i64) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(index, rev, rev);
    }

    pub(super) async fn health(&self) -> Vec<EndpointHealth> {
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

pub(super) fn unhealthy(url: &str, error: String) -> EndpointHealth {
    EndpointHealth {
        endpoint: url.to_owned(),
        healthy: false,
        version: None,
        db_size: None,
        is_leader: false,
        error: Some(error),
    }
}
