//! [`RedbStore`]: the state store of a real agent, a redb file under `data_dir`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase as _, ReadableTable as _, StorageBackend as _, TableDefinition};

use super::{PluginRecord, StateError, StateStore, TaskWrite};

/// File name of the state store inside `data_dir`.
pub const STATE_FILE: &str = "state.db";
/// Schema version this build writes. Bump it (and add a migration) whenever the meaning
/// of a table or of a stored value changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;
/// Marker in the `meta` table that tells a Drover state file from any other redb file.
const FORMAT: &[u8] = b"drover-state";
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const PLUGINS: TableDefinition<&str, &[u8]> = TableDefinition::new("plugins");
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
/// Allocation records. Added after schema version 1 was released without bumping it:
/// an older file simply has no such table yet (reads see none, the first write makes
/// it), and an older agent ignores a table it does not know.
const ALLOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("allocs");
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

    fn write_tasks(&self, writes: &[TaskWrite<'_>]) -> Result<(), StateError> {
        self.write(
            || format!("write {} task records", writes.len()),
            |txn| {
                let mut t = txn.open_table(TASKS)?;
                for (id, record) in writes {
                    match record {
                        Some(record) => {
                            t.insert(*id, *record)?;
                        }
                        None => {
                            t.remove(*id)?;
                        }
                    }
                }
                Ok(())
            },
        )
    }

    fn put_allocs(&self, records: &[(&str, &[u8])]) -> Result<(), StateError> {
        self.write(
            || format!("put {} allocation records", records.len()),
            |txn| {
                let mut t = txn.open_table(ALLOCS)?;
                for (id, record) in records {
                    t.insert(*id, *record)?;
                }
                Ok(())
            },
        )
    }

    fn put_alloc(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        self.write(
            || format!("put alloc {id}"),
            |txn| {
                // Opening makes the table in a file written before it existed.
                txn.open_table(ALLOCS)?.insert(id, record)?;
                Ok(())
            },
        )
    }

    fn allocs(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.read_all(ALLOCS, "read alloc records")
    }

    fn delete_alloc(&self, id: &str) -> Result<(), StateError> {
        self.write(
            || format!("delete alloc {id}"),
            |txn| {
                txn.open_table(ALLOCS)?.remove(id)?;
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
        txn.open_table(ALLOCS).map_err(|e| redb_err(e.into()))?;
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
