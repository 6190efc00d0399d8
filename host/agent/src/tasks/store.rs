//! The state store as the task manager uses it.

use std::sync::Arc;

use tokio::sync::{Semaphore, broadcast};

use crate::state::{StateError, StateStore};

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
        }
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
