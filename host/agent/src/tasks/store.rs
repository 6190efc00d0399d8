//! The state store as the task manager uses it.

use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, broadcast, oneshot};

use crate::state::{StateError, StateStore};

/// A task record waiting for the next group commit.
struct PendingWrite {
    id: String,
    record: Vec<u8>,
    durable: bool,
    done: oneshot::Sender<Result<(), StateError>>,
}

/// Task record writes queued for the writer, and whether a writer is at work.
#[derive(Default)]
struct WriteQueue {
    pending: Vec<PendingWrite>,
    writing: bool,
    /// A lazy write is not durable yet and a sync is due (see [`LAZY_SYNC`]).
    sync_due: bool,
}

/// How long a lazy write may stay off the disk at most: a sync follows it by then, if no
/// durable write came first. Bounds what a crash of the agent can take back.
const LAZY_SYNC: std::time::Duration = std::time::Duration::from_millis(100);

/// The state store as the task manager uses it: every call off the event loop (the
/// agent's runtime has one thread, and a durable write waits for the disk), and only a
/// few at once (a store commits one write at a time anyway; 1000 tasks reporting a
/// plugin crash together must not become 1000 blocking threads).
pub(crate) struct Records {
    pub(super) store: Arc<dyn StateStore>,
    slots: Semaphore,
    /// The id of every task whose record was just written or deleted: every change of
    /// a task's state is written, so this is the task manager's change notification
    /// (the allocation runners watch their tasks through it). Lossy by design: a
    /// subscriber that lags is told so and reads the tasks it cares about again.
    pub(super) changes: broadcast::Sender<String>,
    /// Task record writes for the group commit ([`Records::put_task`]).
    queue: Arc<Mutex<WriteQueue>>,
}

/// Task changes buffered per subscriber before it is told it lagged.
const CHANGES_BUFFER: usize = 1024;

/// Store calls in flight at once.
const STORE_CONCURRENCY: usize = 4;

impl Records {
    pub(super) fn new(store: Arc<dyn StateStore>) -> Self {
        Records {
            store,
            slots: Semaphore::new(STORE_CONCURRENCY),
            changes: broadcast::channel(CHANGES_BUFFER).0,
            queue: Arc::default(),
        }
    }

    /// Write the record of task `id`: durable when this returns if `durable` (else see
    /// [`StateStore::put_task_lazily`]).
    ///
    /// Group commit: every write asked for while the store is busy with a commit goes
    /// into the next one, a single transaction with one fsync for all of them (16
    /// tasks starting at once cost one fsync, not 16). The first writer to find no
    /// commit under way commits on a blocking thread until the queue is empty; the
    /// others wait for its answer. A task's writes never share a batch (each waits for
    /// the previous one under the task's own lock), so their order is kept.
    pub(super) async fn put_task(
        &self,
        id: String,
        record: Vec<u8>,
        durable: bool,
    ) -> Result<(), StateError> {
        let (done, answer) = oneshot::channel();
        let lead = {
            let mut q = lock(&self.queue);
            q.pending.push(PendingWrite {
                id: id.clone(),
                record,
                durable,
                done,
            });
            !std::mem::replace(&mut q.writing, true)
        };
        if lead {
            let queue = self.queue.clone();
            let store = self.store.clone();
            // Not awaited: the writer answers through the channels, this caller's too.
            drop(tokio::task::spawn_blocking(move || {
                commit_until_empty(&queue, &*store)
            }));
        }
        let written = answer.await.unwrap_or_else(|_| {
            Err(StateError::Io {
                op: format!("put task {id}"),
                reason: "the store writer ended without an answer".into(),
            })
        });
        if written.is_ok() && !durable {
            self.sync_soon();
        }
        written
    }

    /// After a lazy write: a durable (empty) commit within [`LAZY_SYNC`], unless one
    /// is due already or a durable write makes it needless meanwhile.
    fn sync_soon(&self) {
        if std::mem::replace(&mut lock(&self.queue).sync_due, true) {
            return;
        }
        let queue = self.queue.clone();
        let store = self.store.clone();
        drop(tokio::spawn(async move {
            tokio::time::sleep(LAZY_SYNC).await;
            let synced = tokio::task::spawn_blocking(move || {
                if !std::mem::take(&mut lock(&queue).sync_due) {
                    return Ok(());
                }
                store.sync()
            })
            .await;
            match synced {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!("cannot sync the state file: {e}"),
                Err(e) => tracing::error!("the state file's sync panicked: {e}"),
            }
        }));
    }

    pub(super) async fn call<T: Send + 'static>(
        &self,
        op: String,
        call: impl FnOnce(&dyn StateStore) -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        let _slot = self.slots.acquire().await.map_err(|e| StateError::Io {
            op: op.clone(),
            reason: e.to_string(),
        })?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || call(&*store))
            .await
            .map_err(|e| StateError::Io {
                op,
                reason: format!("the store call panicked or was cancelled: {e}"),
            })?
    }
}

fn lock(queue: &Mutex<WriteQueue>) -> std::sync::MutexGuard<'_, WriteQueue> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_one(store: &dyn StateStore, w: &PendingWrite) -> Result<(), StateError> {
    if w.durable {
        store.put_task(&w.id, &w.record)
    } else {
        store.put_task_lazily(&w.id, &w.record)
    }
}

/// A store call whose panic becomes an error: the writer must go on answering, or
/// every later write would wait for ever.
fn guarded(what: &str, call: impl FnOnce() -> Result<(), StateError>) -> Result<(), StateError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|_| {
        Err(StateError::Io {
            op: format!("put task {what}"),
            reason: "the store call panicked".into(),
        })
    })
}

/// The group commit's writer: commit what is queued, answer, and again, until the
/// queue is empty (then the next writer leads).
fn commit_until_empty(queue: &Mutex<WriteQueue>, store: &dyn StateStore) {
    loop {
        let batch = {
            let mut q = lock(queue);
            if q.pending.is_empty() {
                q.writing = false;
                return;
            }
            std::mem::take(&mut q.pending)
        };
        let durable = batch.iter().any(|w| w.durable);
        let result = if let [one] = batch.as_slice() {
            // Alone: the plain calls (a store counts and fails them one by one).
            guarded(&one.id, || write_one(store, one))
        } else if durable {
            let records: Vec<(&str, &[u8])> = batch
                .iter()
                .map(|w| (w.id.as_str(), w.record.as_slice()))
                .collect();
            guarded("of a batch", || store.put_tasks(&records))
        } else {
            guarded("of a batch", || {
                batch
                    .iter()
                    .try_for_each(|w| store.put_task_lazily(&w.id, &w.record))
            })
        };
        if durable && result.is_ok() {
            // This commit carried every lazy write before it to the disk. (A failed one
            // did not: the sync that is due stays due.)
            lock(queue).sync_due = false;
        }
        match result {
            Ok(()) => {
                for w in batch {
                    // A caller that went away needs no answer.
                    let _ = w.done.send(Ok(()));
                }
            }
            Err(e) if batch.len() == 1 => {
                if let Some(w) = batch.into_iter().next() {
                    let _ = w.done.send(Err(e));
                }
            }
            // One bad record must not fail the others' writes: each on its own again.
            Err(_) => {
                for w in batch {
                    let answer = guarded(&w.id, || write_one(store, &w));
                    let _ = w.done.send(answer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::state::MemStore;
    use crate::state::PluginRecord;

    /// A store that records the size of every commit, holds its first commit until told
    /// to go on (when given a gate), and panics on the record `b"boom"`.
    #[derive(Default)]
    struct TestStore {
        inner: MemStore,
        commits: Mutex<Vec<usize>>,
        gate: Mutex<Option<mpsc::Receiver<()>>>,
    }

    impl TestStore {
        fn commit(&self, n: usize) {
            if let Some(gate) = lock_any(&self.gate).take() {
                let _ = gate.recv();
            }
            lock_any(&self.commits).push(n);
        }
    }

    fn lock_any<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    impl StateStore for TestStore {
        fn put_plugin(&self, rec: &PluginRecord) -> Result<(), StateError> {
            self.inner.put_plugin(rec)
        }
        fn plugins(&self) -> Result<Vec<PluginRecord>, StateError> {
            self.inner.plugins()
        }
        fn delete_plugin(&self, name: &str) -> Result<(), StateError> {
            self.inner.delete_plugin(name)
        }
        fn put_task(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
            assert_ne!(record, b"boom", "the store fell over");
            self.commit(1);
            self.inner.put_task(id, record)
        }
        fn put_tasks(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
            assert!(
                records.iter().all(|(_, r)| *r != b"boom"),
                "the store fell over"
            );
            self.commit(records.len());
            self.inner.put_tasks(records)
        }
        fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
            self.inner.tasks()
        }
        fn delete_task(&self, id: &str) -> Result<(), StateError> {
            self.inner.delete_task(id)
        }
        fn put_alloc(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
            self.inner.put_alloc(id, record)
        }
        fn allocs(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
            self.inner.allocs()
        }
        fn delete_alloc(&self, id: &str) -> Result<(), StateError> {
            self.inner.delete_alloc(id)
        }
    }

    #[tokio::test]
    async fn a_store_that_panics_fails_that_write_and_the_next_writes_go_on() {
        let records = Records::new(Arc::new(TestStore::default()));
        let err = records
            .put_task("t1".into(), b"boom".to_vec(), true)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        records
            .put_task("t2".into(), b"fine".to_vec(), true)
            .await
            .unwrap();
        assert_eq!(
            records.store.tasks().unwrap(),
            vec![("t2".to_owned(), b"fine".to_vec())]
        );
    }

    #[tokio::test]
    async fn writes_that_wait_for_a_commit_share_the_next_one() {
        let (go, gate) = mpsc::channel();
        let store = Arc::new(TestStore {
            gate: Mutex::new(Some(gate)),
            ..TestStore::default()
        });
        let records = Arc::new(Records::new(store.clone()));
        let write = |i: usize| {
            let records = records.clone();
            tokio::spawn(async move {
                records
                    .put_task(format!("t{i}"), format!("record {i}").into_bytes(), true)
                    .await
            })
        };
        // The first write leads, and its commit is held.
        let first = write(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&records.queue).pending.len() == 1 || !lock(&records.queue).writing {
            assert!(Instant::now() < deadline, "the first write never started");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let rest: Vec<_> = (1..16).map(write).collect();
        while lock(&records.queue).pending.len() < 15 {
            assert!(
                Instant::now() < deadline,
                "the other writes were never queued"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        go.send(()).unwrap();
        first.await.unwrap().unwrap();
        for w in rest {
            w.await.unwrap().unwrap();
        }
        assert_eq!(*lock_any(&store.commits), vec![1, 15]);
        assert_eq!(store.tasks().unwrap().len(), 16);
        // The writer answers before it looks at the queue once more and, finding it
        // empty, stands down: that may come a moment after the last answer.
        while lock(&records.queue).writing {
            assert!(Instant::now() < deadline, "the writer never stood down");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
