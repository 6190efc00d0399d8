//! PLACEHOLDER on branch cluster-http only: the embedded redb store is written on
//! branch cluster-core (`RedbStore::open(data_dir)`); this stand-in has its name and
//! signature so that `drover server` and the HTTP tests build before the merge. At the
//! merge, take cluster-core's file (and its `pub mod redb;` line) instead of this one.

use std::path::Path;

use super::{BoxFuture, Condition, KeyValue, Op, Store, StoreError, TxnOutcome};

/// The embedded store (placeholder: it stores nothing).
#[derive(Debug)]
pub struct RedbStore;

impl RedbStore {
    /// Open (or create) the store under `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let _ = data_dir;
        Ok(RedbStore)
    }
}

const PLACEHOLDER: &str = "the redb store is not built on this branch";

impl Store for RedbStore {
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, u64), StoreError>> {
        let _ = prefix;
        Box::pin(async { Err(StoreError::Backend(PLACEHOLDER.into())) })
    }

    fn txn(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<Op>,
    ) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        let _ = (conditions, ops);
        Box::pin(async { Err(StoreError::Backend(PLACEHOLDER.into())) })
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async { Err(StoreError::Backend(PLACEHOLDER.into())) })
    }
}
