//! The agent's durable state: plugin reattach records and task records.
//!
//! [`StateStore`] is the seam: the agent uses the redb-backed store under `data_dir`;
//! tests use [`MemStore`] (and an error-injecting store) to drive the same code.
//! Every `put_*`/`delete_*` is durable when it returns.
//!
//! Task records are opaque bytes here (the task manager owns their encoding, JSON),
//! so the store never needs to change when a task field is added.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{ReadableDatabase as _, ReadableTable as _, StorageBackend as _, TableDefinition};
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
    /// Insert or replace several task records at once: all of them or none are stored.
    /// Every write costs an fsync (~2.5 ms here), so writing many records together is
    /// much cheaper than one `put_task` each. The default writes them one by one
    /// (stores without transactions).
    fn put_tasks(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
        for (id, record) in records {
            self.put_task(id, record)?;
        }
        Ok(())
    }
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

/// File name of the state store inside `data_dir`.
pub const STATE_FILE: &str = "state.db";
/// Schema version this build writes. Bump it (and add a migration) whenever the meaning
/// of a table or of a stored value changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;
/// Marker in the `meta` table that tells a Drover state file from any other redb file.
const FORMAT: &[u8] = b"drover-state";
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const PLUGINS: TableDefinition<&str, &[u8]> = TableDefinition::new("plugins");
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
/// The agent's working set is small (plugin records, task records); redb's default page
/// cache limit is 1 GiB.
const CACHE_BYTES: usize = 16 << 20;

/// The durable [`StateStore`]: a redb file at `<data_dir>/state.db`.
///
/// Every write is its own transaction committed with redb's default durability (fsync),
/// so it is on disk when the call returns. Opening never writes to a file it could not
/// first validate: see [`RedbStore::open`].
pub struct RedbStore {
    path: PathBuf,
    db: redb::Database,
    /// Exclusive `flock` on `data_dir`, held for the store's life: a second agent on the
    /// same directory is refused before it reads anything. Not inherited by plugins
    /// (std opens files close-on-exec), so a surviving plugin never holds it.
    _dir_lock: std::fs::File,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbStore {
    /// Open (or create) `<data_dir>/state.db`. `data_dir` must exist.
    ///
    /// - no file: a new one is created (under a temporary name, renamed into place once
    ///   its format marker is durable, so a crash never leaves a half-made file);
    /// - a directory, an empty file, random bytes, a truncated or otherwise damaged redb
    ///   file: [`StateError::Corrupt`];
    /// - a valid redb file without Drover's format marker: [`StateError::Corrupt`];
    /// - a newer schema: [`StateError::Version`];
    /// - another agent holds `data_dir`: [`StateError::Locked`].
    ///
    /// An existing file is first checked on an in-memory copy (redb's full integrity
    /// check, plus the format marker and schema version); only a file that passes is
    /// opened for writing. A valid file left unclean by a killed agent is repaired by redb
    /// on that open, which is expected after `kill -9`.
    pub fn open(data_dir: &Path) -> Result<Self, StateError> {
        let path = data_dir.join(STATE_FILE);
        let dir_lock = lock_dir(data_dir, &path)?;
        let corrupt = |reason: String| StateError::Corrupt {
            path: path.clone(),
            reason,
        };
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_new(data_dir, &path)?;
            }
            Err(e) => {
                return Err(StateError::Io {
                    op: format!("stat {}", path.display()),
                    reason: e.to_string(),
                });
            }
            Ok(m) if m.is_dir() => return Err(corrupt("it is a directory, not a file".into())),
            Ok(m) if !m.is_file() => return Err(corrupt("it is not a regular file".into())),
            Ok(m) if m.len() == 0 => {
                return Err(corrupt(
                    "the file is empty (0 bytes); a Drover state file never is".into(),
                ));
            }
            Ok(_) => {
                let bytes = std::fs::read(&path).map_err(|e| StateError::Io {
                    op: format!("read {}", path.display()),
                    reason: e.to_string(),
                })?;
                validate_copy(&path, bytes)?;
            }
        }
        let db = guarded(&path, || {
            redb::Database::builder()
                .set_cache_size(CACHE_BYTES)
                .open(&path)
        })?
        .map_err(|e| open_error(&path, e))?;
        // Checked again on the real file: it is the one we are about to write to.
        check_meta(&path, &db)?;
        tracing::debug!(path = %path.display(), "state store opened");
        Ok(RedbStore {
            path,
            db,
            _dir_lock: dir_lock,
        })
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(
        &self,
        op: impl Fn() -> String,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StateError> {
        let io = |e: redb::Error| StateError::Io {
            op: op(),
            reason: e.to_string(),
        };
        let txn = self.db.begin_write().map_err(|e| io(e.into()))?;
        f(&txn).map_err(io)?;
        txn.commit().map_err(|e| io(e.into()))
    }

    fn read_all(
        &self,
        table: TableDefinition<&str, &[u8]>,
        op: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let io = |e: redb::Error| StateError::Io {
            op: op.to_owned(),
            reason: e.to_string(),
        };
        let txn = self.db.begin_read().map_err(|e| io(e.into()))?;
        let t = match txn.open_table(table) {
            Ok(t) => t,
            // Tables are made when the file is created; tolerate one that is not there.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(io(e.into())),
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| io(e.into()))? {
            let (k, v) = row.map_err(|e| io(e.into()))?;
            out.push((k.value().to_owned(), v.value().to_vec()));
        }
        Ok(out)
    }
}

impl StateStore for RedbStore {
    fn put_plugin(&self, rec: &PluginRecord) -> Result<(), StateError> {
        let op = || format!("put plugin {}", rec.name);
        let json = serde_json::to_vec(rec).map_err(|e| StateError::Io {
            op: op(),
            reason: e.to_string(),
        })?;
        self.write(op, |txn| {
            txn.open_table(PLUGINS)?
                .insert(rec.name.as_str(), json.as_slice())?;
            Ok(())
        })
    }

    fn plugins(&self) -> Result<Vec<PluginRecord>, StateError> {
        let mut out = Vec::new();
        for (name, json) in self.read_all(PLUGINS, "read plugin records")? {
            // One unreadable record must not stop the agent: forgetting it only costs a
            // fresh launch of that plugin instead of a reattach.
            match serde_json::from_slice(&json) {
                Ok(rec) => out.push(rec),
                Err(e) => tracing::warn!(
                    plugin = %name,
                    path = %self.path.display(),
                    "ignoring unreadable plugin record: {e}"
                ),
            }
        }
        Ok(out)
    }

    fn delete_plugin(&self, name: &str) -> Result<(), StateError> {
        self.write(
            || format!("delete plugin {name}"),
            |txn| {
                txn.open_table(PLUGINS)?.remove(name)?;
                Ok(())
            },
        )
    }

    fn put_task(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        self.write(
            || format!("put task {id}"),
            |txn| {
                txn.open_table(TASKS)?.insert(id, record)?;
                Ok(())
            },
        )
    }

    fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.read_all(TASKS, "read task records")
    }

    fn delete_task(&self, id: &str) -> Result<(), StateError> {
        self.write(
            || format!("delete task {id}"),
            |txn| {
                txn.open_table(TASKS)?.remove(id)?;
                Ok(())
            },
        )
    }

    fn put_tasks(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
        self.write(
            || format!("put {} task records", records.len()),
            |txn| {
                let mut t = txn.open_table(TASKS)?;
                for (id, record) in records {
                    t.insert(*id, *record)?;
                }
                Ok(())
            },
        )
    }
}

/// Take an exclusive, non-blocking `flock` on `data_dir`.
fn lock_dir(data_dir: &Path, path: &Path) -> Result<std::fs::File, StateError> {
    let dir = std::fs::File::open(data_dir).map_err(|e| StateError::Io {
        op: format!("open {}", data_dir.display()),
        reason: e.to_string(),
    })?;
    match rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(dir),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StateError::Locked {
            path: path.to_owned(),
        }),
        Err(e) => Err(StateError::Io {
            op: format!("lock {}", data_dir.display()),
            reason: e.to_string(),
        }),
    }
}

/// Run a redb call that may panic on a damaged file (redb's debug builds assert on
/// impossible on-disk states) and turn a panic into [`StateError::Corrupt`].
fn guarded<T>(path: &Path, f: impl FnOnce() -> T) -> Result<T, StateError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown".into());
        StateError::Corrupt {
            path: path.to_owned(),
            reason: format!("the database engine failed on it ({what})"),
        }
    })
}

fn open_error(path: &Path, e: redb::DatabaseError) -> StateError {
    let corrupt = |reason: String| StateError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            StateError::Locked {
                path: path.to_owned(),
            }
        }
        redb::DatabaseError::UpgradeRequired(v) => corrupt(format!(
            "it is in redb file format {v}, which this agent does not read"
        )),
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() != std::io::ErrorKind::InvalidData =>
        {
            StateError::Io {
                op: format!("open {}", path.display()),
                reason: io.to_string(),
            }
        }
        // redb's "not a database" (bad magic, empty) is an I/O error of kind InvalidData;
        // its own message says it better without the "I/O error:" prefix.
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
            corrupt(format!("not a valid database: {io}"))
        }
        other => corrupt(format!(
            "not a valid database: {}",
            other.to_string().trim_end_matches('.')
        )),
    }
}

/// Open an in-memory copy of the file with redb's full integrity check and check the
/// format marker and schema. Nothing touches the file itself.
fn validate_copy(path: &Path, bytes: Vec<u8>) -> Result<(), StateError> {
    let io = |e: std::io::Error| StateError::Io {
        op: "copy the state file into memory".into(),
        reason: e.to_string(),
    };
    let backend = redb::backends::InMemoryBackend::new();
    backend.set_len(bytes.len() as u64).map_err(io)?;
    backend.write(0, &bytes).map_err(io)?;
    drop(bytes);
    let db = guarded(path, || {
        redb::Database::builder()
            .set_cache_size(CACHE_BYTES)
            .set_check_integrity_on_open(true)
            .create_with_backend(backend)
    })?
    // Memory cannot fail to read: every error here, I/O-looking or not (a header that
    // points past the end reads "out of range"), is about the file's content.
    .map_err(|e| match open_error(path, e) {
        StateError::Io { reason, .. } => StateError::Corrupt {
            path: path.to_owned(),
            reason: format!("not a valid database: {}", reason.trim_end_matches('.')),
        },
        other => other,
    })?;
    check_meta(path, &db)
}

/// A value of the `meta` table, absent or its bytes.
type MetaValue = Option<Vec<u8>>;

/// The file must carry Drover's format marker and a schema version we understand.
fn check_meta(path: &Path, db: &redb::Database) -> Result<(), StateError> {
    let corrupt = |reason: String| StateError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let not_ours = || {
        corrupt(
            "it is a redb database but not a Drover state file (no \"drover-state\" format \
             marker)"
                .into(),
        )
    };
    let read = guarded(path, || -> Result<(MetaValue, MetaValue), String> {
        let txn = db.begin_read().map_err(|e| e.to_string())?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok((None, None)),
            Err(e) => return Err(e.to_string()),
        };
        let get = |k: &str| -> Result<Option<Vec<u8>>, String> {
            Ok(meta
                .get(k)
                .map_err(|e| e.to_string())?
                .map(|v| v.value().to_vec()))
        };
        Ok((get("format")?, get("schema_version")?))
    })?;
    let (format, version) =
        read.map_err(|e| corrupt(format!("cannot read its meta table: {e}")))?;
    if format.as_deref() != Some(FORMAT) {
        return Err(not_ours());
    }
    let found = version
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| corrupt("its schema_version is missing or malformed".into()))?;
    if found > SCHEMA_VERSION {
        return Err(StateError::Version {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == 0 {
        return Err(corrupt(
            "its schema_version is 0, which no agent writes".into(),
        ));
    }
    Ok(())
}

/// Make a fresh state file: build it as `state.db.new`, commit the meta table and empty
/// tables, then rename it into place and sync the directory.
fn create_new(data_dir: &Path, path: &Path) -> Result<(), StateError> {
    let io = |op: String| {
        move |e: std::io::Error| StateError::Io {
            op,
            reason: e.to_string(),
        }
    };
    let tmp = data_dir.join(format!("{STATE_FILE}.new"));
    // A leftover from a crash during an earlier creation: it never became the state file.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(format!("remove {}", tmp.display()))(e)),
    }
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(format!("create {}", tmp.display())))?
    };
    let redb_err = |e: redb::Error| StateError::Io {
        op: format!("initialise {}", tmp.display()),
        reason: e.to_string(),
    };
    let backend = redb::backends::FileBackend::new(file).map_err(|e| redb_err(e.into()))?;
    let db = redb::Database::builder()
        .set_cache_size(CACHE_BYTES)
        .create_with_backend(backend)
        .map_err(|e| redb_err(e.into()))?;
    let txn = db.begin_write().map_err(|e| redb_err(e.into()))?;
    {
        let mut meta = txn.open_table(META).map_err(|e| redb_err(e.into()))?;
        meta.insert("format", FORMAT)
            .map_err(|e| redb_err(e.into()))?;
        meta.insert("schema_version", SCHEMA_VERSION.to_be_bytes().as_slice())
            .map_err(|e| redb_err(e.into()))?;
        txn.open_table(PLUGINS).map_err(|e| redb_err(e.into()))?;
        txn.open_table(TASKS).map_err(|e| redb_err(e.into()))?;
    }
    txn.commit().map_err(|e| redb_err(e.into()))?;
    drop(db);
    std::fs::rename(&tmp, path).map_err(io(format!(
        "rename {} to {}",
        tmp.display(),
        path.display()
    )))?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("sync {}", data_dir.display())))?;
    tracing::info!(path = %path.display(), schema_version = SCHEMA_VERSION, "state store created");
    Ok(())
}

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
    fn put_tasks(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
        self.check(true, || format!("put {} task records", records.len()))?;
        self.inner.put_tasks(records)
    }
}

#[cfg(test)]
mod tests {
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
            },
        }
    }

    /// A state file with some content, closed cleanly; returns its bytes.
    fn populated(dir: &Path) -> Vec<u8> {
        let store = RedbStore::open(dir).unwrap();
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
        let err = RedbStore::open(dir).expect_err(what);
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
        let store = RedbStore::open(dir.path()).unwrap();
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
            .put_tasks(&[("t3", b"three".as_slice()), ("t4", b"four".as_slice())])
            .unwrap();
        store.delete_task("t4").unwrap();
        drop(store);

        let store = RedbStore::open(dir.path()).unwrap();
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
    fn leftover_half_made_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.db.new"), b"half").unwrap();
        let store = RedbStore::open(dir.path()).unwrap();
        assert!(store.tasks().unwrap().is_empty());
        assert!(!dir.path().join("state.db.new").exists());
    }

    #[test]
    fn file_left_by_a_killed_agent_opens_with_its_data() {
        // Copy the file while the store is open: the copy is what a kill -9 leaves
        // (committed data, "recovery required" flag set).
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path()).unwrap();
        store.put_plugin(&record("rawexec", 10)).unwrap();
        store.put_task("t1", b"one").unwrap();
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(store.path(), copy.path().join(STATE_FILE)).unwrap();
        store.put_task("t2", b"after the copy").unwrap();
        let reopened = RedbStore::open(copy.path()).unwrap();
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
        let err = RedbStore::open(dir.path()).unwrap_err().to_string();
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
        let db = redb::Database::open(path).unwrap();
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
        let err = RedbStore::open(dir.path()).unwrap_err();
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
        let first = RedbStore::open(dir.path()).unwrap();
        first.put_task("t", b"x").unwrap();
        let err = RedbStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StateError::Locked { .. }), "{err:?}");
        assert!(err.to_string().contains("another agent"), "{err}");
        drop(first);
        let again = RedbStore::open(dir.path()).unwrap();
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
