//! The task map: task id to running (or exited, not yet destroyed) task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use drover_plugin_sdk::DriverError;

use crate::handle::Task;

enum Slot {
    /// Taken by a start or recovery in progress.
    Starting,
    Ready(Arc<Task>),
}

/// Every task this plugin process tracks. The lock is held for one map operation at
/// a time, never across an `.await`.
#[derive(Default)]
pub(crate) struct Store {
    tasks: Mutex<HashMap<String, Slot>>,
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take `id` for a start or recovery, so that two cannot run for one id at once.
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

    pub(crate) fn get(&self, id: &str) -> Result<Arc<Task>, DriverError> {
        match self.lock().get(id) {
            Some(Slot::Ready(task)) => Ok(task.clone()),
            Some(Slot::Starting) | None => Err(DriverError::NotFound(format!("task {id}"))),
        }
    }

    pub(crate) fn starting(&self, id: &str) -> bool {
        matches!(self.lock().get(id), Some(Slot::Starting))
    }

    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// An id taken by [`Store::reserve`]; released on drop unless committed.
pub(crate) struct Reservation<'a> {
    store: &'a Store,
    id: String,
    done: bool,
}

impl Reservation<'_> {
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
        assert!(store.starting("t1"));
        drop(r);
        assert!(store.reserve("t1").is_ok());
    }
}
