//! The agent's durable state: plugin reattach records, task records and allocation
//! records.
//!
//! [`StateStore`] is the seam: the agent uses the redb-backed store under `data_dir`;
//! tests use [`MemStore`] (and an error-injecting store) to drive the same code.
//! Every `put_*`/`delete_*` is durable when it returns.
//!
//! Task records are opaque bytes here (the task manager owns their encoding, JSON),
//! so the store never needs to change when a task field is added.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

mod faulty;
mod mem;
mod redb_store;

pub use faulty::{ErrorStore, Fail};
pub use mem::MemStore;
pub use redb_store::{RedbStore, SCHEMA_VERSION, STATE_FILE};

/// A poisoned lock still guards consistent data here: every critical section is a
/// single map operation.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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

/// One change of [`StateStore::write_tasks`]: task id, and its new record or `None` to
/// delete it.
pub type TaskWrite<'a> = (&'a str, Option<&'a [u8]>);

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
    /// Apply `writes` in their order (a record to store, or `None` to delete the
    /// task's record), all of them or none, in one durable write. Every durable write
    /// costs an fsync (~2.5 ms on a disk here) and a commit, so writing many records
    /// together is much cheaper than one `put_task` each. The default writes them one
    /// by one (stores without transactions).
    fn write_tasks(&self, writes: &[TaskWrite<'_>]) -> Result<(), StateError> {
        for (id, record) in writes {
            match record {
                Some(record) => self.put_task(id, record)?,
                None => self.delete_task(id)?,
            }
        }
        Ok(())
    }
    /// Insert or replace the record of allocation `id` (opaque bytes: the allocation
    /// manager owns their encoding).
    fn put_alloc(&self, id: &str, record: &[u8]) -> Result<(), StateError>;
    /// Insert or replace several allocation records at once, all or none, in one
    /// durable write (a node given 100 allocations at once pays one fsync, not 100).
    /// The default writes them one by one (stores without transactions).
    fn put_allocs(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
        for (id, record) in records {
            self.put_alloc(id, record)?;
        }
        Ok(())
    }
    /// Every allocation record, by id.
    fn allocs(&self) -> Result<Vec<(String, Vec<u8>)>, StateError>;
    /// Forget allocation `id` (absent is fine).
    fn delete_alloc(&self, id: &str) -> Result<(), StateError>;
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use redb::TableDefinition;

    use super::redb_store::META;
    use super::*;
    use drover_plugin_sdk::client::ReattachConfig;
    use drover_plugin_sdk::handshake::PluginAddr;

    fn record(name: &str, pid: u32) -> PluginRecord {
        PluginRecord {
            name: name.into(),
            version: "1.2.3".into(),
            api_version: "0.1.0".into(),
            args: vec!["plugin".into(), "serve".into(), name.into()],
            sha256: "ab".repeat(32),
            reattach: ReattachConfig {
                addr: PluginAddr::Unix(format!("/run/{name}.sock").into()),
                pid,
                start_time: 99,
                app_protocol_version: 1,
                path: "/usr/bin/drover".into(),
                tls: None,
                multiplex_grpc: false,
            },
        }
    }

    /// Open the store, waiting while its lock is held. Locks are `flock`s on open file
    /// descriptions: a process another test in this binary forks between our open and
    /// its own exec holds a copy of our descriptor (close-on-exec only closes it at the
    /// exec), so a reopen right after a drop can briefly see `Locked`. An agent never
    /// retries: a second agent on one data dir is refused at once (tested below).
    fn open_when_free(dir: &Path) -> Result<RedbStore, StateError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match RedbStore::open(dir) {
                Err(StateError::Locked { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    /// `redb::Database::open`, waiting while the file's lock is held (see
    /// [`open_when_free`]).
    fn redb_open_when_free(path: impl AsRef<Path>) -> Result<redb::Database, redb::DatabaseError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match redb::Database::open(path.as_ref()) {
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    /// A state file with some content, closed cleanly; returns its bytes.
    fn populated(dir: &Path) -> Vec<u8> {
        let store = open_when_free(dir).unwrap();
        store.put_plugin(&record("rawexec", 10)).unwrap();
        for i in 0..200 {
            store.put_task(&format!("task-{i}"), &[7u8; 300]).unwrap();
        }
        drop(store);
        std::fs::read(dir.join(STATE_FILE)).unwrap()
    }

    /// Open must fail with `Corrupt` naming the file, and leave its bytes alone.
    fn assert_refused(dir: &Path, what: &str) -> String {
        let path = dir.join(STATE_FILE);
        let before = std::fs::read(&path).ok();
        let err = open_when_free(dir).expect_err(what);
        assert!(matches!(err, StateError::Corrupt { .. }), "{what}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
        assert!(msg.contains("move it aside"), "{what}: {msg}");
        assert_eq!(std::fs::read(&path).ok(), before, "{what}: file changed");
        msg
    }

    #[test]
    fn records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_when_free(dir.path()).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(store.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert!(store.plugins().unwrap().is_empty());
        store.put_plugin(&record("rawexec", 10)).unwrap();
        store.put_plugin(&record("rawexec", 11)).unwrap();
        store.put_plugin(&record("docker", 12)).unwrap();
        store.delete_plugin("docker").unwrap();
        store.delete_plugin("never-was").unwrap();
        store.put_task("t1", b"one").unwrap();
        store.put_task("t2", b"two").unwrap();
        store.delete_task("t1").unwrap();
        store
            .write_tasks(&[
                ("t3", Some(b"three".as_slice())),
                ("t4", Some(b"four".as_slice())),
            ])
            .unwrap();
        store.delete_task("t4").unwrap();
        drop(store);

        let store = open_when_free(dir.path()).unwrap();
        assert_eq!(store.plugins().unwrap(), vec![record("rawexec", 11)]);
        assert_eq!(
            store.tasks().unwrap(),
            vec![
                ("t2".into(), b"two".to_vec()),
                ("t3".into(), b"three".to_vec())
            ]
        );
        assert!(!dir.path().join("state.db.new").exists());
    }

    #[test]
    fn task_writes_apply_in_order_in_one_commit_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_when_free(dir.path()).unwrap();
        store.put_task("gone", b"deleted below").unwrap();
        store
            .write_tasks(&[
                ("t1", Some(b"before the start".as_slice())),
                ("t1", Some(b"started".as_slice())),
                ("gone", None),
                ("t2", Some(b"another task".as_slice())),
                ("t3", Some(b"short-lived".as_slice())),
                ("t3", None),
                ("never-was", None),
            ])
            .unwrap();
        let expected = vec![
            ("t1".to_owned(), b"started".to_vec()),
            ("t2".to_owned(), b"another task".to_vec()),
        ];
        assert_eq!(store.tasks().unwrap(), expected);
        drop(store);
        let store = open_when_free(dir.path()).unwrap();
        assert_eq!(store.tasks().unwrap(), expected);
    }

    #[test]
    fn alloc_records_survive_reopen_and_an_older_file_without_their_table_opens() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_when_free(dir.path()).unwrap();
        store.put_task("t1", b"one").unwrap();
        store.put_alloc("a1", b"alloc one").unwrap();
        store.put_alloc("a2", b"alloc two").unwrap();
        store.delete_alloc("a1").unwrap();
        store.delete_alloc("never-was").unwrap();
        store
            .put_allocs(&[
                ("a3", b"alloc three".as_slice()),
                ("a4", b"four".as_slice()),
            ])
            .unwrap();
        drop(store);
        let store = open_when_free(dir.path()).unwrap();
        assert_eq!(
            store.allocs().unwrap(),
            vec![
                ("a2".into(), b"alloc two".to_vec()),
                ("a3".into(), b"alloc three".to_vec()),
                ("a4".into(), b"four".to_vec())
            ]
        );
        drop(store);

        // A file an agent wrote before allocations existed: no `allocs` table.
        {
            let db = redb_open_when_free(dir.path().join(STATE_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            assert!(
                txn.delete_table(TableDefinition::<&str, &[u8]>::new("allocs"))
                    .unwrap()
            );
            txn.commit().unwrap();
        }
        let store = open_when_free(dir.path()).unwrap();
        assert!(store.allocs().unwrap().is_empty());
        assert_eq!(store.tasks().unwrap().len(), 1, "its tasks are kept");
        store.delete_alloc("a2").unwrap();
        store.put_alloc("a3", b"three").unwrap();
        drop(store);
        let store = open_when_free(dir.path()).unwrap();
        assert_eq!(
            store.allocs().unwrap(),
            vec![("a3".into(), b"three".to_vec())]
        );

        let mem = MemStore::default();
        mem.put_alloc("m", b"x").unwrap();
        let faulty = ErrorStore::new(Arc::new(mem), Fail::Writes);
        assert!(faulty.put_alloc("n", b"y").is_err());
        assert!(faulty.delete_alloc("m").is_err());
        assert_eq!(faulty.allocs().unwrap().len(), 1);
    }

    #[test]
    fn leftover_half_made_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.db.new"), b"half").unwrap();
        let store = open_when_free(dir.path()).unwrap();
        assert!(store.tasks().unwrap().is_empty());
        assert!(!dir.path().join("state.db.new").exists());
    }

    #[test]
    fn file_left_by_a_killed_agent_opens_with_its_data() {
        // Copy the file while the store is open: the copy is what a kill -9 leaves
        // (committed data, "recovery required" flag set).
        let dir = tempfile::tempdir().unwrap();
        let store = open_when_free(dir.path()).unwrap();
        store.put_plugin(&record("rawexec", 10)).unwrap();
        store.put_task("t1", b"one").unwrap();
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(store.path(), copy.path().join(STATE_FILE)).unwrap();
        store.put_task("t2", b"after the copy").unwrap();
        let reopened = open_when_free(copy.path()).unwrap();
        assert_eq!(reopened.plugins().unwrap(), vec![record("rawexec", 10)]);
        assert_eq!(
            reopened.tasks().unwrap(),
            vec![("t1".into(), b"one".to_vec())]
        );
        drop(reopened);

        // The same unclean file, truncated: repair must not be attempted on it.
        let bytes = std::fs::read(store.path()).unwrap();
        for cut in [bytes.len() / 2, bytes.len() - 4096] {
            std::fs::write(copy.path().join(STATE_FILE), &bytes[..cut]).unwrap();
            assert_refused(copy.path(), &format!("unclean, truncated to {cut}"));
        }
    }

    #[test]
    fn zero_length_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), b"").unwrap();
        let msg = assert_refused(dir.path(), "empty");
        assert!(msg.contains("empty"), "{msg}");
    }

    #[test]
    fn random_bytes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let noise: Vec<u8> = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(dir.path().join(STATE_FILE), &noise).unwrap();
        assert_refused(dir.path(), "random bytes");
        std::fs::write(dir.path().join(STATE_FILE), b"{\"plugins\": []}\n").unwrap();
        assert_refused(dir.path(), "a JSON file");
    }

    #[test]
    fn truncated_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = populated(dir.path());
        for cut in [bytes.len() / 2, bytes.len() - 4096, 4096, 100, 5] {
            std::fs::write(dir.path().join(STATE_FILE), &bytes[..cut]).unwrap();
            assert_refused(
                dir.path(),
                &format!("truncated to {cut} of {}", bytes.len()),
            );
        }
    }

    #[test]
    fn damaged_pages_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = populated(dir.path());
        // Overwrite a stretch in the middle of the data pages with garbage.
        let mut damaged = bytes.clone();
        let mid = bytes.len() / 3;
        for b in &mut damaged[mid..mid + 8192] {
            *b = !*b;
        }
        std::fs::write(dir.path().join(STATE_FILE), &damaged).unwrap();
        assert_refused(dir.path(), "damaged pages");
    }

    #[test]
    fn directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(STATE_FILE)).unwrap();
        let err = open_when_free(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        assert!(dir.path().join(STATE_FILE).is_dir());
    }

    #[test]
    fn foreign_redb_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(TableDefinition::<&str, u64>::new("other"))
                .unwrap()
                .insert("k", 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let msg = assert_refused(dir.path(), "foreign redb");
        assert!(msg.contains("not a Drover state file"), "{msg}");
    }

    fn set_meta(path: &Path, key: &str, value: &[u8]) {
        let db = redb_open_when_free(path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert(key, value).unwrap();
        txn.commit().unwrap();
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        populated(dir.path());
        let path = dir.path().join(STATE_FILE);
        set_meta(&path, "schema_version", &7u32.to_be_bytes());
        let before = std::fs::read(&path).unwrap();
        let err = open_when_free(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                StateError::Version {
                    found: 7,
                    supported: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains(&path.display().to_string()));
        assert_eq!(std::fs::read(&path).unwrap(), before);

        set_meta(&path, "schema_version", b"x");
        let msg = assert_refused(dir.path(), "malformed version");
        assert!(msg.contains("schema_version"), "{msg}");
    }

    #[test]
    fn second_agent_is_locked_out() {
        let dir = tempfile::tempdir().unwrap();
        let first = open_when_free(dir.path()).unwrap();
        first.put_task("t", b"x").unwrap();
        let err = RedbStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StateError::Locked { .. }), "{err:?}");
        assert!(err.to_string().contains("another agent"), "{err}");
        drop(first);
        let again = open_when_free(dir.path()).unwrap();
        assert_eq!(again.tasks().unwrap().len(), 1);
    }

    #[test]
    fn error_store_fails_what_it_is_told() {
        let inner: Arc<dyn StateStore> = Arc::new(MemStore::default());
        let store = ErrorStore::new(inner.clone(), Fail::Never);
        store.put_task("a", b"1").unwrap();

        store.set(Fail::All);
        let err = store.tasks().unwrap_err().to_string();
        assert!(
            err.contains("read task records") && err.contains("injected"),
            "{err}"
        );
        assert!(store.put_task("b", b"2").is_err());

        store.set(Fail::Writes);
        assert!(store.put_task("b", b"2").is_err());
        assert!(store.delete_plugin("x").is_err());
        assert_eq!(store.tasks().unwrap().len(), 1);

        store.set(Fail::Nth(2));
        store.put_task("c", b"3").unwrap();
        assert!(store.put_task("d", b"4").is_err());
        store.put_task("e", b"5").unwrap();
        let ids: Vec<String> = inner.tasks().unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(ids, ["a", "c", "e"]);
        assert_eq!(store.calls(), 9);
    }
}
