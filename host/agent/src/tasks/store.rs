//! The state store as the task manager uses it.

use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, oneshot};

use crate::state::{StateError, StateStore, TaskWrite};

/// What a queued write does.
enum Change {
    /// Store this record.
    Put(Vec<u8>),
    /// Delete the task's record.
    Delete,
    /// Nothing: a [`Records::flush`] waiting for the writes queued before it.
    Flush,
}

/// A change waiting for the next group commit.
struct PendingWrite {
    id: String,
    change: Change,
    /// Whoever waits for the commit; `None` for a deferred write (see
    /// [`Records::put_task`]), which nobody waits for.
    done: Option<oneshot::Sender<Result<(), StateError>>>,
}

/// Writes queued for the writer, and whether a writer is at work.
#[derive(Default)]
struct WriteQueue {
    pending: Vec<PendingWrite>,
    writing: bool,
    /// A commit of the deferred writes is scheduled, [`DEFER_FOR`] after the first.
    flush_scheduled: bool,
    /// That commit is due: deferred writes are committed even if nobody waits.
    flush_due: bool,
}

/// How long a deferred write may wait for a commit at most: one follows by then if no
/// durable write carried it first. Bounds what a crash of the agent can take back.
const DEFER_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// The state store as the task manager uses it: every write off the event loop (the
/// agent's runtime has one thread, and a durable write waits for the disk), queued
/// for a single writer that commits what is queued together (1000 tasks reporting a
/// plugin crash at once are one writer, not 1000 blocking threads).
pub(crate) struct Records {
    pub(super) store: Arc<dyn StateStore>,
    /// The id of every task whose record was just written or deleted: every change of
    /// a task's state is written, so this is the task manager's change notification
    /// (the allocation runners watch their tasks through it). Lossy by design: a
    /// subscriber that lags is told so and reads the tasks it cares about again.
    pub(super) changes: broadcast::Sender<String>,
    /// Writes for the group commit ([`Records::put_task`]).
    queue: Arc<Mutex<WriteQueue>>,
}

/// Task changes buffered per subscriber before it is told it lagged.
const CHANGES_BUFFER: usize = 1024;

impl Records {
    pub(super) fn new(store: Arc<dyn StateStore>) -> Self {
        Records {
            store,
            changes: broadcast::channel(CHANGES_BUFFER).0,
            queue: Arc::default(),
        }
    }

    /// Write the record of task `id`: durable when this returns if `durable`.
    ///
    /// Group commit: every write asked for while the store is busy with a commit goes
    /// into the next one, a single transaction with one fsync for all of them (16
    /// tasks starting at once cost one fsync, not 16). The first writer to find no
    /// commit under way commits on a blocking thread until the queue is empty; the
    /// others wait for its answer. A task's writes are queued in their order (each
    /// waits for the previous one under the task's own lock) and a commit applies
    /// them in that order, so the last one stands.
    ///
    /// Not `durable`: the write is deferred. It is queued and this returns at once;
    /// it is committed with the next commit that somebody waits for, or [`DEFER_FOR`]
    /// later, whichever comes first. An agent that dies before then loses it, and the
    /// task's record is the one before it: only for a record whose loss that earlier
    /// one covers (the record that adds the handle after a start: its predecessor,
    /// durable and without a handle, makes the next agent ask the driver for the task
    /// by id). A deferred write that fails is logged; there is nobody to tell.
    pub(super) async fn put_task(
        &self,
        id: String,
        record: Vec<u8>,
        durable: bool,
    ) -> Result<(), StateError> {
        if durable {
            return self.commit(id, Change::Put(record)).await;
        }
        let schedule = {
            let mut q = lock(&self.queue);
            q.pending.push(PendingWrite {
                id,
                change: Change::Put(record),
                done: None,
            });
            !std::mem::replace(&mut q.flush_scheduled, true)
        };
        if schedule {
            let queue = self.queue.clone();
            let store = self.store.clone();
            drop(tokio::spawn(async move {
                tokio::time::sleep(DEFER_FOR).await;
                let lead = {
                    let mut q = lock(&queue);
                    q.flush_scheduled = false;
                    if q.pending.is_empty() {
                        // A commit somebody waited for carried them.
                        false
                    } else {
                        // An active writer sees this and takes them too.
                        q.flush_due = true;
                        !std::mem::replace(&mut q.writing, true)
                    }
                };
                if lead {
                    start_writer(queue, store);
                }
            }));
        }
        Ok(())
    }

    /// Delete the record of task `id`; durable when this returns. Queued behind the
    /// task's writes, deferred ones too, so none of them brings the record back.
    pub(super) async fn delete_task(&self, id: String) -> Result<(), StateError> {
        self.commit(id, Change::Delete).await
    }

    /// Commit every write queued so far, deferred ones too (an agent going away).
    pub(crate) async fn flush(&self) -> Result<(), StateError> {
        {
            let q = lock(&self.queue);
            if q.pending.is_empty() && !q.writing {
                return Ok(());
            }
        }
        self.commit(String::new(), Change::Flush).await
    }

    /// Commit the queued deferred writes on this thread, now (tests: the store then
    /// holds what it would a moment later, with nothing else of the agent run between).
    #[cfg(test)]
    pub(super) fn commit_deferred_now(&self) {
        let batch = std::mem::take(&mut lock(&self.queue).pending);
        assert!(
            batch.iter().all(|w| w.done.is_none()),
            "a write somebody waits for is queued: its writer commits it"
        );
        let writes: Vec<TaskWrite<'_>> = batch.iter().filter_map(task_write).collect();
        if !writes.is_empty() {
            let result = self.store.write_tasks(&writes);
            assert!(result.is_ok(), "deferred writes failed: {result:?}");
        }
    }

    /// Queue `change` for the next commit and wait for it.
    async fn commit(&self, id: String, change: Change) -> Result<(), StateError> {
        let (done, answer) = oneshot::channel();
        let op = match change {
            Change::Put(_) => format!("put task {id}"),
            Change::Delete => format!("delete task {id}"),
            Change::Flush => "commit the deferred task records".to_owned(),
        };
        let lead = {
            let mut q = lock(&self.queue);
            q.pending.push(PendingWrite {
                id,
                change,
                done: Some(done),
            });
            !std::mem::replace(&mut q.writing, true)
        };
        if lead {
            start_writer(self.queue.clone(), self.store.clone());
        }
        answer.await.unwrap_or_else(|_| {
            Err(StateError::Io {
                op,
                reason: "the store writer ended without an answer".into(),
            })
        })
    }
}

/// Start the group commit's writer on a blocking thread ([`commit_until_empty`]); the
/// caller set `writing`. Not awaited: the writer answers through the channels.
fn start_writer(queue: Arc<Mutex<WriteQueue>>, store: Arc<dyn StateStore>) {
    drop(tokio::task::spawn_blocking(move || {
        commit_until_empty(&queue, &*store)
    }));
}

fn lock(queue: &Mutex<WriteQueue>) -> std::sync::MutexGuard<'_, WriteQueue> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The store's form of a queued write; `None` for a flush, which writes nothing.
fn task_write(w: &PendingWrite) -> Option<TaskWrite<'_>> {
    match &w.change {
        Change::Put(record) => Some((w.id.as_str(), Some(record.as_slice()))),
        Change::Delete => Some((w.id.as_str(), None)),
        Change::Flush => None,
    }
}

/// A store call whose panic becomes an error: the writer must go on answering, or
/// every later write would wait for ever.
fn guarded(what: &str, call: impl FnOnce() -> Result<(), StateError>) -> Result<(), StateError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|_| {
        Err(StateError::Io {
            op: format!("write task {what}"),
            reason: "the store call panicked".into(),
        })
    })
}

/// Tell whoever waits for `w` how its write went; a deferred write's failure is
/// logged, there being nobody to tell.
fn answer(w: PendingWrite, result: Result<(), StateError>) {
    match (w.done, result) {
        // A caller that went away needs no answer.
        (Some(done), result) => drop(done.send(result)),
        (None, Ok(())) => {}
        (None, Err(e)) => tracing::error!(
            task = %w.id,
            "cannot record the task's state ({e}); its stored record is the one before: \
             should this agent die now, the next one asks the driver for the task by id"
        ),
    }
}

/// The group commit's writer: commit what is queued, answer, and again, until the
/// queue is empty or holds deferred writes alone whose commit is not due yet (then
/// the next writer leads).
fn commit_until_empty(queue: &Mutex<WriteQueue>, store: &dyn StateStore) {
    loop {
        let batch = {
            let mut q = lock(queue);
            let waited_for = q.pending.iter().any(|w| w.done.is_some());
            if !(waited_for || q.flush_due && !q.pending.is_empty()) {
                q.writing = false;
                return;
            }
            q.flush_due = false;
            std::mem::take(&mut q.pending)
        };
        let writes: Vec<TaskWrite<'_>> = batch.iter().filter_map(task_write).collect();
        let result = if writes.is_empty() {
            Ok(())
        } else {
            guarded("records", || store.write_tasks(&writes))
        };
        match result {
            Ok(()) => {
                for w in batch {
                    answer(w, Ok(()));
                }
            }
            // One write: its error is the answer (a store counts and fails them one by
            // one). A flush beside it committed nothing that could fail.
            Err(e) if writes.len() == 1 => {
                let mut e = Some(e);
                for w in batch {
                    let result = match w.change {
                        Change::Flush => Ok(()),
                        _ => e.take().map_or(Ok(()), Err),
                    };
                    answer(w, result);
                }
            }
            // One bad record must not fail the others' writes: each on its own again.
            Err(_) => {
                for w in batch {
                    let result = match task_write(&w) {
                        Some(write) => guarded(&w.id, || store.write_tasks(&[write])),
                        None => Ok(()),
                    };
                    answer(w, result);
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
        fn write_tasks(&self, writes: &[TaskWrite<'_>]) -> Result<(), StateError> {
            assert!(
                writes.iter().all(|(_, r)| *r != Some(b"boom".as_slice())),
                "the store fell over"
            );
            self.commit(writes.len());
            self.inner.write_tasks(writes)
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

    /// Until `cond` holds, for at most 10 s.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "{what}: not within 10 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn a_deferred_write_rides_with_the_next_durable_commit() {
        let store = Arc::new(TestStore::default());
        let records = Records::new(store.clone());
        records
            .put_task("t1".into(), b"before the start".to_vec(), true)
            .await
            .unwrap();
        records
            .put_task("t1".into(), b"started".to_vec(), false)
            .await
            .unwrap();
        // Deferred: not committed yet, and no commit of its own is under way.
        assert_eq!(
            store.tasks().unwrap(),
            vec![("t1".to_owned(), b"before the start".to_vec())]
        );
        records
            .put_task("t2".into(), b"another task".to_vec(), true)
            .await
            .unwrap();
        assert_eq!(
            store.tasks().unwrap(),
            vec![
                ("t1".to_owned(), b"started".to_vec()),
                ("t2".to_owned(), b"another task".to_vec())
            ]
        );
        assert_eq!(*lock_any(&store.commits), vec![1, 2], "one commit each");
    }

    #[tokio::test]
    async fn a_deferred_write_alone_is_committed_within_its_bound() {
        let store = Arc::new(TestStore::default());
        let records = Records::new(store.clone());
        let t = Instant::now();
        for i in 0..3 {
            records
                .put_task("t1".into(), format!("record {i}").into_bytes(), false)
                .await
                .unwrap();
        }
        until("the deferred writes committed", || {
            !lock_any(&store.commits).is_empty()
        })
        .await;
        assert!(t.elapsed() >= DEFER_FOR, "committed before it was due");
        assert_eq!(
            store.tasks().unwrap(),
            vec![("t1".to_owned(), b"record 2".to_vec())],
            "the last write of the task stands"
        );
        until("the writer stood down", || !lock(&records.queue).writing).await;
        assert_eq!(
            *lock_any(&store.commits),
            vec![3],
            "one commit for all three"
        );
    }

    #[tokio::test]
    async fn a_delete_after_a_deferred_write_leaves_no_record() {
        let store = Arc::new(TestStore::default());
        let records = Records::new(store.clone());
        records
            .put_task("t1".into(), b"started".to_vec(), false)
            .await
            .unwrap();
        records.delete_task("t1".into()).await.unwrap();
        assert!(store.tasks().unwrap().is_empty());
        // Nothing deferred is left to bring it back later.
        tokio::time::sleep(DEFER_FOR * 2).await;
        assert!(store.tasks().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_flush_commits_the_deferred_writes_now() {
        let store = Arc::new(TestStore::default());
        let records = Records::new(store.clone());
        records
            .put_task("t1".into(), b"started".to_vec(), false)
            .await
            .unwrap();
        records.flush().await.unwrap();
        assert_eq!(
            store.tasks().unwrap(),
            vec![("t1".to_owned(), b"started".to_vec())]
        );
        // Nothing queued: nothing to wait for.
        records.flush().await.unwrap();
        until("the writer stood down", || !lock(&records.queue).writing).await;
        assert_eq!(*lock_any(&store.commits), vec![1]);
    }

    #[tokio::test]
    async fn a_deferred_write_that_fails_fails_nobody_else() {
        let store = Arc::new(TestStore::default());
        let records = Records::new(store.clone());
        records
            .put_task("bad".into(), b"boom".to_vec(), false)
            .await
            .unwrap();
        records
            .put_task("t2".into(), b"fine".to_vec(), true)
            .await
            .unwrap();
        assert_eq!(
            store.tasks().unwrap(),
            vec![("t2".to_owned(), b"fine".to_vec())]
        );
    }
}
