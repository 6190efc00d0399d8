//! The task map: task id to running (or exited, not yet destroyed) task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use drover_plugin_sdk::DriverError;

use crate::handle::Task;

enum Slot {
    /// The id is taken by a start or recovery in progress.
    Starting,
    Ready(Arc<Task>),
}

/// All tasks this plugin process tracks. Calls arrive concurrently; the lock is only
/// ever held for a map operation, never across an `.await`.
#[derive(Default)]
pub(crate) struct Store {
    tasks: Mutex<HashMap<String, Slot>>,
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take `id` for a task about to be started, so that two concurrent starts with
    /// the same id cannot both spawn a process.
    pub(crate) fn reserve(&self, id: &str) -> Result<Reservation<'_>, DriverError> {
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

    /// The task `id`.
    pub(crate) fn get(&self, id: &str) -> Result<Arc<Task>, DriverError> {
        match self.lock().get(id) {
            Some(Slot::Ready(task)) => Ok(task.clone()),
            Some(Slot::Starting) | None => Err(DriverError::NotFound(format!("task {id}"))),
        }
    }

    /// Forget `id`.
    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Whether `id` is tracked or being started or recovered.
    pub(crate) fn knows(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }
}

/// An id taken by [`Store::reserve`]; released on drop unless committed.
pub(crate) struct Reservation<'a> {
    store: &'a Store,
    id: String,
    done: bool,
}

impl Reservation<'_> {
    /// Store the task under the reserved id.
    pub(crate) fn commit(mut self, task: Arc<Task>) {
        self.store.lock().insert(self.id.clone(), Slot::Ready(task));
        self.done = true;
    }
}

impl Drop for Reservation<'_> {
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
        let store = Store::default();
        let r = store.reserve("t1").unwrap();
        assert!(matches!(
            store.reserve("t1"),
            Err(DriverError::AlreadyExists(_))
        ));
        assert!(matches!(store.get("t1"), Err(DriverError::NotFound(_))));
        drop(r);
        assert!(store.reserve("t1").is_ok());
    }
}
