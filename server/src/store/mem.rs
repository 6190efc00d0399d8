//! A store in memory, for tests (cargo feature `testing`): the [`Store`] trait's
//! semantics as the redb and etcd stores have them — one revision per successful
//! transaction, keys with their create and mod revisions, conditions checked before
//! anything is written (compare-and-set, and a leader's term fence on its key's
//! create revision), and a watch that reports every transaction after a revision, as
//! etcd's does (so that servers sharing one `MemStore` can follow each other).
//! Nothing survives the process.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::mpsc;

use super::{
    BoxFuture, Condition, EndpointHealth, KeyValue, Op, Store, StoreChange, StoreError, TxnOutcome,
    WatchEvent, WatchStream,
};

/// Transactions kept for watches that start behind the current revision; a watch
/// from further back gets [`WatchEvent::Reset`] (as after an etcd compaction).
const KEPT_CHANGES: usize = 4096;

/// A [`Store`] in memory.
#[derive(Default)]
pub struct MemStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    kvs: BTreeMap<String, KeyValue>,
    revision: u64,
    /// The newest transactions, oldest first.
    history: VecDeque<StoreChange>,
    watchers: Vec<mpsc::UnboundedSender<WatchEvent>>,
}

impl MemStore {
    /// An empty store at revision 0.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every change is made whole under the lock before it is released.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn holds(&self, c: &Condition) -> bool {
        match c {
            Condition::ModRevision { key, revision } => {
                self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *revision
            }
            Condition::CreateRevision { key, revision } => {
                self.kvs.get(key).map_or(0, |kv| kv.create_revision) == *revision
            }
        }
    }

    fn txn(&mut self, conditions: &[Condition], ops: Vec<Op>) -> TxnOutcome {
        if !conditions.iter().all(|c| self.holds(c)) {
            return TxnOutcome {
                succeeded: false,
                revision: self.revision,
            };
        }
        self.revision += 1;
        let revision = self.revision;
        let mut change = StoreChange {
            revision: Some(revision),
            puts: Vec::new(),
            deletes: Vec::new(),
        };
        for op in ops {
            match op {
                Op::Put { key, value } => {
                    let created = self.kvs.get(&key).map_or(revision, |kv| kv.create_revision);
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision: created,
                        mod_revision: revision,
                    };
                    change.puts.retain(|p| p.key != key);
                    change.deletes.retain(|d| *d != key);
                    change.puts.push(kv.clone());
                    self.kvs.insert(key, kv);
                }
                Op::Delete { key } => {
                    change.puts.retain(|p| p.key != key);
                    if self.kvs.remove(&key).is_some() && !change.deletes.contains(&key) {
                        change.deletes.push(key);
                    }
                }
            }
        }
        self.watchers
            .retain(|w| w.send(WatchEvent::Change(change.clone())).is_ok());
        self.history.push_back(change);
        while self.history.len() > KEPT_CHANGES {
            self.history.pop_front();
        }
        TxnOutcome {
            succeeded: true,
            revision,
        }
    }
}

impl Store for MemStore {
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, u64), StoreError>> {
        let g = self.lock();
        let kvs = g
            .kvs
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        let revision = g.revision;
        Box::pin(async move { Ok((kvs, revision)) })
    }

    fn txn(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<Op>,
    ) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(async move { Ok(self.lock().txn(&conditions, ops)) })
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { Ok(self.lock().revision) })
    }

    fn watch(&self, revision: u64) -> WatchStream {
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut g = self.lock();
            let oldest_kept = g
                .history
                .front()
                .and_then(|c| c.revision)
                .unwrap_or(g.revision + 1);
            if revision + 1 < oldest_kept && revision < g.revision {
                let _ = tx.send(WatchEvent::Reset);
            } else {
                for c in g.history.iter().filter(|c| c.revision > Some(revision)) {
                    let _ = tx.send(WatchEvent::Change(c.clone()));
                }
            }
            g.watchers.push(tx);
        }
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|e| (Ok(e), rx))
        }))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn health(&self) -> BoxFuture<'_, Vec<EndpointHealth>> {
        Box::pin(async { Vec::new() })
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;

    use super::*;

    fn put(key: &str, value: &str) -> Op {
        Op::Put {
            key: key.into(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[tokio::test]
    async fn one_revision_per_transaction_with_create_and_mod_revisions() {
        let s = MemStore::new();
        assert_eq!(s.revision().await.unwrap(), 0);
        let r = s
            .txn(vec![], vec![put("job/a", "1"), put("job/b", "2")])
            .await
            .unwrap();
        assert!(r.succeeded);
        assert_eq!(r.revision, 1);
        let r = s.txn(vec![], vec![put("job/a", "3")]).await.unwrap();
        assert_eq!(r.revision, 2);
        s.txn(vec![], vec![put("node/x", "n")]).await.unwrap();
        let (kvs, rev) = s.range("job/").await.unwrap();
        assert_eq!(rev, 3);
        assert_eq!(kvs.len(), 2);
        assert_eq!(
            (kvs[0].key.as_str(), kvs[0].value.as_slice()),
            ("job/a", &b"3"[..])
        );
        assert_eq!((kvs[0].create_revision, kvs[0].mod_revision), (1, 2));
        assert_eq!((kvs[1].create_revision, kvs[1].mod_revision), (1, 1));
        let r = s
            .txn(
                vec![],
                vec![Op::Delete {
                    key: "job/missing".into(),
                }],
            )
            .await
            .unwrap();
        assert!(r.succeeded, "deleting a missing key is not an error");
    }

    #[tokio::test]
    async fn a_failed_condition_writes_nothing_and_fences_a_term() {
        let s = MemStore::new();
        s.txn(vec![], vec![put("leader", "a")]).await.unwrap();
        let fence = vec![Condition::CreateRevision {
            key: "leader".into(),
            revision: 1,
        }];
        let r = s.txn(fence.clone(), vec![put("job/a", "1")]).await.unwrap();
        assert!(r.succeeded, "the term holds");
        // The leader key is deleted and created again: another term.
        s.txn(
            vec![],
            vec![Op::Delete {
                key: "leader".into(),
            }],
        )
        .await
        .unwrap();
        s.txn(vec![], vec![put("leader", "b")]).await.unwrap();
        let r = s.txn(fence, vec![put("job/a", "2")]).await.unwrap();
        assert!(!r.succeeded, "the old term's commit is refused");
        assert_eq!(r.revision, 4, "the revision does not move");
        let stale = Condition::ModRevision {
            key: "job/a".into(),
            revision: 1,
        };
        let r = s.txn(vec![stale], vec![put("job/a", "3")]).await.unwrap();
        assert!(!r.succeeded);
        let (kvs, _) = s.range("job/a").await.unwrap();
        assert_eq!(kvs[0].value, b"1");
    }

    #[tokio::test]
    async fn a_watch_reports_every_transaction_after_its_revision() {
        let s = MemStore::new();
        s.txn(vec![], vec![put("job/a", "1")]).await.unwrap();
        s.txn(vec![], vec![put("job/b", "2")]).await.unwrap();
        let mut w = s.watch(1);
        s.txn(
            vec![],
            vec![Op::Delete {
                key: "job/a".into(),
            }],
        )
        .await
        .unwrap();
        let Some(Ok(WatchEvent::Change(c))) = w.next().await else {
            panic!("a change")
        };
        assert_eq!((c.revision, c.puts[0].key.as_str()), (Some(2), "job/b"));
        let Some(Ok(WatchEvent::Change(c))) = w.next().await else {
            panic!("a change")
        };
        assert_eq!(
            (c.revision, c.deletes.as_slice()),
            (Some(3), &["job/a".to_owned()][..])
        );
    }
}
