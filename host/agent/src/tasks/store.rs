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
}

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
        answer.await.unwrap_or_else(|_| {
            Err(StateError::Io {
                op: format!("put task {id}"),
                reason: "the store writer ended without an answer".into(),
            })
        })
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
        let result = match batch.as_slice() {
            // Alone: the plain calls (a store counts and fails them one by one).
            [one] if one.durable => store.put_task(&one.id, &one.record),
            [one] => store.put_task_lazily(&one.id, &one.record),
            many if many.iter().any(|w| w.durable) => {
                let records: Vec<(&str, &[u8])> = many
                    .iter()
                    .map(|w| (w.id.as_str(), w.record.as_slice()))
                    .collect();
                store.put_tasks(&records)
            }
            many => many
                .iter()
                .try_for_each(|w| store.put_task_lazily(&w.id, &w.record)),
        };
        let n = batch.len();
        let mut batch = batch.into_iter();
        if n == 1 {
            if let Some(w) = batch.next() {
                // A caller that went away needs no answer.
                let _ = w.done.send(result);
            }
            continue;
        }
        for w in batch {
            let answer = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(StateError::Io {
                    op: format!("put task {} (with {} others in one commit)", w.id, n - 1),
                    reason: e.to_string(),
                }),
            };
            let _ = w.done.send(answer);
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

    /// A store that records the size of every commit, and holds its first commit until
    /// told to go on.
    struct GatedStore {
        inner: MemStore,
        commits: Mutex<Vec<usize>>,
        gate: Mutex<Option<mpsc::Receiver<()>>>,
    }

    impl GatedStore {
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

    impl StateStore for GatedStore {
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
            self.commit(1);
            self.inner.put_task(id, record)
        }
        fn put_tasks(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
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
    async fn writes_that_wait_for_a_commit_share_the_next_one() {
        let (go, gate) = mpsc::channel();
        let store = Arc::new(GatedStore {
            inner: MemStore::default(),
            commits: Mutex::default(),
            gate: Mutex::new(Some(gate)),
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
        assert!(!lock(&records.queue).writing);
    }
}
