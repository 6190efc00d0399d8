//! [`TaskStore`]: the map from task id to the task a driver tracks, with a reservation
//! step so that two concurrent starts (or a start and a recovery) of one id can never
//! both create a task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::DriverError;

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
