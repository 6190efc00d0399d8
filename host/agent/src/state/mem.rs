//! [`MemStore`]: the state store in memory, for tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{PluginRecord, StateError, StateStore, lock};

/// A [`StateStore`] in memory, for tests and for nothing else.
#[derive(Debug, Default)]
pub struct MemStore {
    plugins: Mutex<BTreeMap<String, PluginRecord>>,
    tasks: Mutex<BTreeMap<String, Vec<u8>>>,
    allocs: Mutex<BTreeMap<String, Vec<u8>>>,
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
    fn put_alloc(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        lock(&self.allocs).insert(id.to_owned(), record.to_vec());
        Ok(())
    }
    fn allocs(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        Ok(lock(&self.allocs)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn delete_alloc(&self, id: &str) -> Result<(), StateError> {
        lock(&self.allocs).remove(id);
        Ok(())
    }
}
