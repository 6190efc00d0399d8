//! The state store as the task manager uses it.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::state::{StateError, StateStore};

/// The state store as the task manager uses it: every call off the event loop (the
/// agent's runtime has one thread, and a durable write waits for the disk), and only a
/// few at once (a store commits one write at a time anyway; 1000 tasks reporting a
/// plugin crash together must not become 1000 blocking threads).
pub(crate) struct Records {
    pub(super) store: Arc<dyn StateStore>,
    slots: Semaphore,
}

/// Store calls in flight at once.
const STORE_CONCURRENCY: usize = 4;

impl Records {
    pub(super) fn new(store: Arc<dyn StateStore>) -> Self {
        Records {
            store,
            slots: Semaphore::new(STORE_CONCURRENCY),
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
