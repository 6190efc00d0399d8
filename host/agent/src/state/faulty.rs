//! [`ErrorStore`]: a state store that fails on purpose, for tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{PluginRecord, StateError, StateStore, lock};

/// Which calls an [`ErrorStore`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    /// Pass every call through.
    Never,
    /// Fail every call.
    All,
    /// Fail only every `put_*`/`delete_*`; reads pass.
    Writes,
    /// Fail only the Nth call from now (1-based, all methods counted); others pass.
    Nth(u64),
}

/// A [`StateStore`] that fails on purpose, for tests of the code paths that must cope
/// with a failing store (like Nomad's `client/state/db_error.go`). Wraps a real store,
/// so the calls it lets through really happen.
pub struct ErrorStore {
    inner: Arc<dyn StateStore>,
    fail: Mutex<Fail>,
    calls: AtomicU64,
    /// Value of `calls` when `fail` was last set, for [`Fail::Nth`].
    armed_at: AtomicU64,
}

impl std::fmt::Debug for ErrorStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorStore")
            .field("fail", &*lock(&self.fail))
            .field("calls", &self.calls.load(Ordering::SeqCst))
            .finish()
    }
}

impl ErrorStore {
    /// Wrap `inner`, failing the calls `fail` selects.
    pub fn new(inner: Arc<dyn StateStore>, fail: Fail) -> Self {
        ErrorStore {
            inner,
            fail: Mutex::new(fail),
            calls: AtomicU64::new(0),
            armed_at: AtomicU64::new(0),
        }
    }

    /// Change which calls fail; [`Fail::Nth`] counts from this point.
    pub fn set(&self, fail: Fail) {
        let mut f = lock(&self.fail);
        self.armed_at
            .store(self.calls.load(Ordering::SeqCst), Ordering::SeqCst);
        *f = fail;
    }

    /// How many calls were made so far (failed ones included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn check(&self, write: bool, op: impl FnOnce() -> String) -> Result<(), StateError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let fail = match *lock(&self.fail) {
            Fail::Never => false,
            Fail::All => true,
            Fail::Writes => write,
            Fail::Nth(k) => n == self.armed_at.load(Ordering::SeqCst) + k,
        };
        if fail {
            return Err(StateError::Io {
                op: op(),
                reason: "injected failure".into(),
            });
        }
        Ok(())
    }
}

impl StateStore for ErrorStore {
    fn put_plugin(&self, rec: &PluginRecord) -> Result<(), StateError> {
        self.check(true, || format!("put plugin {}", rec.name))?;
        self.inner.put_plugin(rec)
    }
    fn plugins(&self) -> Result<Vec<PluginRecord>, StateError> {
        self.check(false, || "read plugin records".into())?;
        self.inner.plugins()
    }
    fn delete_plugin(&self, name: &str) -> Result<(), StateError> {
        self.check(true, || format!("delete plugin {name}"))?;
        self.inner.delete_plugin(name)
    }
    fn put_task(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        self.check(true, || format!("put task {id}"))?;
        self.inner.put_task(id, record)
    }
    fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.check(false, || "read task records".into())?;
        self.inner.tasks()
    }
    fn delete_task(&self, id: &str) -> Result<(), StateError> {
        self.check(true, || format!("delete task {id}"))?;
        self.inner.delete_task(id)
    }
    fn write_tasks(&self, writes: &[super::TaskWrite<'_>]) -> Result<(), StateError> {
        self.check(true, || format!("write {} task records", writes.len()))?;
        self.inner.write_tasks(writes)
    }
    fn put_alloc(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        self.check(true, || format!("put alloc {id}"))?;
        self.inner.put_alloc(id, record)
    }
    fn allocs(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.check(false, || "read alloc records".into())?;
        self.inner.allocs()
    }
    fn delete_alloc(&self, id: &str) -> Result<(), StateError> {
        self.check(true, || format!("delete alloc {id}"))?;
        self.inner.delete_alloc(id)
    }
}
