//! The agent's durable state: plugin reattach records and task records.
//!
//! [`StateStore`] is the seam: the agent uses the redb-backed store under `data_dir`;
//! tests use [`MemStore`] (and an error-injecting store) to drive the same code.
//! Every `put_*`/`delete_*` is durable when it returns.
//!
//! Task records are opaque bytes here (the task manager owns their encoding, JSON),
//! so the store never needs to change when a task field is added.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// What the agent remembers about a plugin process so that it can reattach to it
/// after the agent restarts, instead of launching a second one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRecord {
    /// Plugin name (the catalog key).
    pub name: String,
    /// Plugin version it reported.
    pub version: String,
    /// Negotiated plugin API version.
    pub api_version: String,
    /// Arguments the binary was launched with (built-ins: `plugin serve NAME`).
    pub args: Vec<String>,
    /// sha256 (hex) of the binary when it was launched.
    pub sha256: String,
    /// Address, pid, start time, protocol, path.
    pub reattach: drover_plugin_sdk::client::ReattachConfig,
}

/// Why the state store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The file exists but is not a readable Drover state file. Nothing was written.
    #[error(
        "state file {path} is unreadable: {reason}. The agent will not start on it and has not \
         changed it; move it aside (e.g. `mv {path} {path}.bad`) to start with empty state, or \
         restore it from a backup"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The file was written by a newer (or unknown) schema version.
    #[error(
        "state file {path} has schema version {found}, this agent understands {supported}; \
         run a newer agent or move the file aside"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build writes.
        supported: u32,
    },
    /// Another agent holds the file open.
    #[error("state file {path} is in use by another process (is another agent running?)")]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// A read or write failed.
    #[error("state store {op} failed: {reason}")]
    Io {
        /// What was being done, e.g. `put task 1234`.
        op: String,
        /// The cause.
        reason: String,
    },
}

/// Durable storage of plugin reattach records and task records.
pub trait StateStore: Send + Sync + 'static {
    /// Insert or replace the record of plugin `rec.name`.
    fn put_plugin(&self, rec: &PluginRecord) -> Result<(), StateError>;
    /// Every plugin record.
    fn plugins(&self) -> Result<Vec<PluginRecord>, StateError>;
    /// Forget plugin `name` (absent is fine).
    fn delete_plugin(&self, name: &str) -> Result<(), StateError>;
    /// Insert or replace the record of task `id`.
    fn put_task(&self, id: &str, record: &[u8]) -> Result<(), StateError>;
    /// Every task record, by id.
    fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StateError>;
    /// Forget task `id` (absent is fine).
    fn delete_task(&self, id: &str) -> Result<(), StateError>;
}

/// A [`StateStore`] in memory, for tests and for nothing else.
#[derive(Debug, Default)]
pub struct MemStore {
    plugins: Mutex<BTreeMap<String, PluginRecord>>,
    tasks: Mutex<BTreeMap<String, Vec<u8>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StateStore for MemStore {
    fn put_plugin(&self, rec: &PluginRecord) -> Result<(), StateError> {
        lock(&self.plugins).insert(rec.name.clone(), rec.clone());
        Ok(())
    }
    fn plugins(&self) -> Result<Vec<PluginRecord>, StateError> {
        Ok(lock(&self.plugins).values().cloned().collect())
    }
    fn delete_plugin(&self, name: &str) -> Result<(), StateError> {
        lock(&self.plugins).remove(name);
        Ok(())
    }
    fn put_task(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        lock(&self.tasks).insert(id.to_owned(), record.to_vec());
        Ok(())
    }
    fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        Ok(lock(&self.tasks)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn delete_task(&self, id: &str) -> Result<(), StateError> {
        lock(&self.tasks).remove(id);
        Ok(())
    }
}
