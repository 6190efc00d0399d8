//! [`TaskStore`]: the map from task id to the task a driver tracks, with a reservation
//! step so that two concurrent starts (or a start and a recovery) of one id can never
//! both create a task. [`ExitSlot`]: how one of those tasks ended, once it has.
//! [`TaskEvents`]: the feed of task events a driver serves through `task_events`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use std::time::SystemTime;

use tokio::sync::{broadcast, watch};

use crate::{DriverError, ExitResult, TaskEvent};

/// How many events a slow `TaskEvents` subscriber may fall behind before it misses
/// some (the SDK then tells it how many).
const EVENT_BACKLOG: usize = 256;

/// A driver's task events: what `DriverPlugin::task_events` subscribes to. Every event
/// is logged too, so that it is in the plugin's log when nobody listens.
///
/// ```
/// let events = drover_plugin_sdk::store::TaskEvents::default();
/// let mut rx = events.subscribe();
/// events.send("web-1", "task started (pid 42)".into());
/// assert_eq!(rx.try_recv().unwrap().message, "task started (pid 42)");
/// ```
#[derive(Debug, Clone)]
pub struct TaskEvents(broadcast::Sender<TaskEvent>);

impl Default for TaskEvents {
    fn default() -> Self {
        TaskEvents(broadcast::channel(EVENT_BACKLOG).0)
    }
}

impl TaskEvents {
    /// Send an event about `task_id`. No subscriber is fine: events are best-effort
    /// notifications.
    pub fn send(&self, task_id: &str, message: String) {
        tracing::info!(task = task_id, "{message}");
        let _ = self.0.send(TaskEvent::new(task_id, message));
    }

    /// A new subscriber, for `DriverPlugin::task_events`.
    pub fn subscribe(&self) -> broadcast::Receiver<TaskEvent> {
        self.0.subscribe()
    }
}

/// How a task ended and when, once known. The first result recorded wins (the exit
/// watcher and a stop may both see the end); any number of callers wait for it.
///
/// ```
/// use drover_plugin_sdk::{ExitResult, store::ExitSlot};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let slot = ExitSlot::default();
/// assert!(slot.get().is_none());
/// assert!(slot.finish(ExitResult::code(3), std::time::SystemTime::now()));
/// assert!(!slot.finish(ExitResult::code(0), std::time::SystemTime::now()));
/// assert_eq!(slot.wait().await.exit_code, 3);
/// # });
/// ```
#[derive(Debug)]
pub struct ExitSlot(watch::Sender<Option<(ExitResult, SystemTime)>>);

impl Default for ExitSlot {
    fn default() -> Self {
        ExitSlot(watch::channel(None).0)
    }
}

impl ExitSlot {
    /// The result and the time of the exit, if the task has ended.
    pub fn get(&self) -> Option<(ExitResult, SystemTime)> {
        self.0.borrow().clone()
    }

    /// Whether the task has ended.
    pub fn is_set(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Record how the task ended; `false` (and nothing changes) if a result was
    /// recorded before.
    pub fn finish(&self, result: ExitResult, at: SystemTime) -> bool {
        self.0.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some((result, at));
            true
        })
    }

    /// Until the task has ended; its result.
    pub async fn wait(&self) -> ExitResult {
        let mut rx = self.0.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(slot) => slot.as_ref().map(|(r, _)| r.clone()).unwrap_or_default(),
            // The sender lives in `self`, so it cannot be gone while we borrow it.
            Err(_) => ExitResult::default(),
        }
    }
}

enum Slot<T> {
    /// The id is taken by a start or recovery in progress.
    Starting,
    Ready(Arc<T>),
}

/// Every task a plugin process tracks, by id. Calls arrive concurrently; the lock is
/// only held for one map operation, never across an `.await`.
///
/// ```
/// use drover_plugin_sdk::{DriverError, store::TaskStore};
/// let store: TaskStore<String> = TaskStore::default();
/// let r = store.reserve("web-1").unwrap();
/// // A second start of the same id is refused while the first is in progress...
/// assert!(matches!(store.reserve("web-1"), Err(DriverError::AlreadyExists(_))));
/// assert!(store.starting("web-1"));
/// r.commit(std::sync::Arc::new("pid 42".to_owned()));
/// assert_eq!(*store.get("web-1").unwrap(), "pid 42");
/// store.remove("web-1");
/// assert!(!store.knows("web-1"));
/// ```
pub struct TaskStore<T> {
    tasks: Mutex<HashMap<String, Slot<T>>>,
}

impl<T> Default for TaskStore<T> {
    fn default() -> Self {
        TaskStore {
            tasks: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> TaskStore<T> {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot<T>>> {
        // Slots are replaced whole, so a panic elsewhere cannot leave one half-written.
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take `id` for a task about to be started or recovered, so that two cannot run
    /// for one id at once. Released when the [`Reservation`] drops uncommitted.
    pub fn reserve(&self, id: &str) -> Result<Reservation<'_, T>, DriverError> {
        let mut tasks = self.lock();
        if tasks.contains_key(id) {
            return Err(DriverError::AlreadyExists(format!("task {id}")));
        }
        tasks.insert(id.to_owned(), Slot::Starting);
        Ok(Reservation {
            store: self,
            id: id.to_owned(),
            done: false,
        })
    }

    /// The task `id`; `NotFound` while it is only reserved.
    pub fn get(&self, id: &str) -> Result<Arc<T>, DriverError> {
        match self.lock().get(id) {
            Some(Slot::Ready(task)) => Ok(task.clone()),
            Some(Slot::Starting) | None => Err(DriverError::NotFound(format!("task {id}"))),
        }
    }

    /// Whether a start or recovery of `id` is in progress.
    pub fn starting(&self, id: &str) -> bool {
        matches!(self.lock().get(id), Some(Slot::Starting))
    }

    /// Whether `id` is tracked, or being started or recovered.
    pub fn knows(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Forget `id`.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// An id taken by [`TaskStore::reserve`]; released on drop unless committed.
pub struct Reservation<'a, T> {
    store: &'a TaskStore<T>,
    id: String,
    done: bool,
}

impl<T> Reservation<'_, T> {
    /// Store the task under the reserved id.
    pub fn commit(mut self, task: Arc<T>) {
        self.store.lock().insert(self.id.clone(), Slot::Ready(task));
        self.done = true;
    }
}

impl<T> Drop for Reservation<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            self.store.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_blocks_duplicates_and_is_released_on_drop() {
        let store: TaskStore<u32> = TaskStore::default();
        let r = store.reserve("t1").unwrap();
        assert!(matches!(
            store.reserve("t1"),
            Err(DriverError::AlreadyExists(_))
        ));
        assert!(matches!(store.get("t1"), Err(DriverError::NotFound(_))));
        assert!(store.starting("t1") && store.knows("t1"));
        drop(r);
        assert!(!store.knows("t1"));
        store.reserve("t1").unwrap().commit(Arc::new(7));
        assert_eq!(*store.get("t1").unwrap(), 7);
        assert!(!store.starting("t1"));
    }
}
