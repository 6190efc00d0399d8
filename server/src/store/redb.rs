//! [`RedbStore`]: the embedded [`Store`] of a single server, a redb file
//! `<data_dir>/server.db`.
//!
//! One redb table `kv` holds every key; its value is the two revisions (create, mod;
//! 8 bytes big-endian each) followed by the value's bytes. A `meta` table holds the
//! format marker, the schema version and the global revision. Every [`Store::txn`] is
//! one redb write transaction committed with redb's default durability (fsync): when
//! it returns `Ok` it is on disk. redb's file lock keeps a second server off the file.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableDatabase as _, ReadableTable as _, TableDefinition};

use super::{BoxFuture, Condition, KeyValue, Op, Store, StoreError, TxnOutcome};

/// File name of the store inside the server's data dir.
pub const STORE_FILE: &str = "server.db";
/// Schema version this build writes and reads.
pub const SCHEMA_VERSION: &str = "1";
/// Marker that tells a Drover server store from any other redb file.
const FORMAT: &[u8] = b"drover-server";
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// Bytes of revisions in front of every value.
const HEADER: usize = 16;
/// More ops than this in one transaction are refused (etcd refuses above 128 by
/// default; the embedded store is generous, but a runaway plan must not be).
pub const MAX_TXN_OPS: usize = 1_000_000;

/// The embedded store. Cheap to clone (the database is shared).
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    db: redb::Database,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl RedbStore {
    /// Open (or create) `<data_dir>/server.db`; `data_dir` is created if missing.
    ///
    /// A file that is not a redb database, a redb file that is not a Drover server
    /// store, or one of another schema version is [`StoreError::Corrupt`]; a file
    /// another server holds open is [`StoreError::Backend`] saying so.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            StoreError::Backend(format!("create data dir {}: {e}", data_dir.display()))
        })?;
        let path = data_dir.join(STORE_FILE);
        let fresh = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(StoreError::Backend(format!("stat {}: {e}", path.display()))),
            Ok(m) if !m.is_file() => {
                return Err(StoreError::Corrupt(format!(
                    "{} is not a regular file",
                    path.display()
                )));
            }
            Ok(m) if m.len() == 0 => {
                return Err(StoreError::Corrupt(format!(
                    "{} is empty (0 bytes); a Drover server store never is",
                    path.display()
                )));
            }
            Ok(_) => false,
        };
        let db = guarded(&path, || redb::Database::builder().create(&path))?
            .map_err(|e| open_error(&path, e))?;
        let store = RedbStore {
            inner: Arc::new(Inner { path, db }),
        };
        if fresh {
            store.init()?;
        }
        store.check_meta()?;
        tracing::debug!(path = %store.inner.path.display(), "server store opened");
        Ok(store)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn init(&self) -> Result<(), StoreError> {
        let e = |e: redb::Error| backend(&self.inner.path, "initialise", e);
        let txn = self.inner.db.begin_write().map_err(|x| e(x.into()))?;
        {
            let mut meta = txn.open_table(META).map_err(|x| e(x.into()))?;
            meta.insert("format", FORMAT).map_err(|x| e(x.into()))?;
            meta.insert("schema", SCHEMA_VERSION.as_bytes())
                .map_err(|x| e(x.into()))?;
            meta.insert("revision", 0u64.to_be_bytes().as_slice())
                .map_err(|x| e(x.into()))?;
            txn.open_table(KV).map_err(|x| e(x.into()))?;
        }
        txn.commit().map_err(|x| e(x.into()))
    }

    fn check_meta(&self) -> Result<(), StoreError> {
        let path = &self.inner.path;
        let corrupt = |why: String| StoreError::Corrupt(format!("{}: {why}", path.display()));
        let read = guarded(path, || -> Result<[Option<Vec<u8>>; 3], String> {
            let txn = self.inner.db.begin_read().map_err(|e| e.to_string())?;
            let meta = match txn.open_table(META) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok([None, None, None]),
                Err(e) => return Err(e.to_string()),
            };
            let get = |k: &str| -> Result<Option<Vec<u8>>, String> {
                Ok(meta
                    .get(k)
                    .map_err(|e| e.to_string())?
                    .map(|v| v.value().to_vec()))
            };
            Ok([get("format")?, get("schema")?, get("revision")?])
        })?;
        let [format, schema, revision] =
            read.map_err(|e| corrupt(format!("cannot read its meta table: {e}")))?;
        if format.as_deref() != Some(FORMAT) {
            return Err(corrupt(
                "a redb database but not a Drover server store (no \"drover-server\" format \
                 marker)"
                    .into(),
            ));
        }
        let schema = schema.unwrap_or_default();
        if schema != SCHEMA_VERSION.as_bytes() {
            return Err(corrupt(format!(
                "schema version {:?}, this server reads {SCHEMA_VERSION:?}",
                String::from_utf8_lossy(&schema)
            )));
        }
        decode_revision(revision.as_deref()).map_err(corrupt)?;
        Ok(())
    }

    fn range_blocking(&self, prefix: &str) -> Result<(Vec<KeyValue>, u64), StoreError> {
        let path = &self.inner.path;
        let e = |x: redb::Error| backend(path, "read", x);
        let txn = self.inner.db.begin_read().map_err(|x| e(x.into()))?;
        let meta = txn.open_table(META).map_err(|x| e(x.into()))?;
        let revision = decode_revision(
            meta.get("revision")
                .map_err(|x| e(x.into()))?
                .map(|v| v.value().to_vec())
                .as_deref(),
        )
        .map_err(|why| StoreError::Corrupt(format!("{}: {why}", path.display())))?;
        let kv = txn.open_table(KV).map_err(|x| e(x.into()))?;
        let mut out = Vec::new();
        for row in kv.range::<&str>(prefix..).map_err(|x| e(x.into()))? {
            let (k, v) = row.map_err(|x| e(x.into()))?;
            let key = k.value();
            if !key.starts_with(prefix) {
                break;
            }
            out.push(decode_kv(key, v.value())?);
        }
        Ok((out, revision))
    }

    fn txn_blocking(&self, conditions: &[Condition], ops: &[Op]) -> Result<TxnOutcome, StoreError> {
        if ops.len() > MAX_TXN_OPS {
            return Err(StoreError::TooLarge(format!(
                "{} ops, at most {MAX_TXN_OPS}",
                ops.len()
            )));
        }
        let path = &self.inner.path;
        let e = |x: redb::Error| backend(path, "write", x);
        let txn = self.inner.db.begin_write().map_err(|x| e(x.into()))?;
        let revision;
        {
            let mut meta = txn.open_table(META).map_err(|x| e(x.into()))?;
            let current = decode_revision(
                meta.get("revision")
                    .map_err(|x| e(x.into()))?
                    .map(|v| v.value().to_vec())
                    .as_deref(),
            )
            .map_err(|why| StoreError::Corrupt(format!("{}: {why}", path.display())))?;
            let mut kv = txn.open_table(KV).map_err(|x| e(x.into()))?;
            for c in conditions {
                let (key, want, create) = match c {
                    Condition::ModRevision { key, revision } => (key, *revision, false),
                    Condition::CreateRevision { key, revision } => (key, *revision, true),
                };
                let have = match kv.get(key.as_str()).map_err(|x| e(x.into()))? {
                    None => 0,
                    Some(v) => {
                        let (c, m) = decode_header(key, v.value())?;
                        if create { c } else { m }
                    }
                };
                if have != want {
                    // Dropping the write transaction aborts it: nothing was written.
                    return Ok(TxnOutcome {
                        succeeded: false,
                        revision: current,
                    });
                }
            }
            revision = current + 1;
            // In key order: consecutive writes then land on the same B-tree pages
            // (a plan's allocations are neighbours, see `state::alloc_key`) instead
            // of hopping over the tree. A stable sort: two ops on one key keep their
            // order, and ops on different keys commute within a transaction.
            let mut sorted: Vec<&Op> = ops.iter().collect();
            sorted.sort_by(|a, b| op_key(a).cmp(op_key(b)));
            let mut buf = Vec::new();
            for op in sorted {
                match op {
                    Op::Put { key, value } => {
                        let created = match kv.get(key.as_str()).map_err(|x| e(x.into()))? {
                            None => revision,
                            Some(v) => decode_header(key, v.value())?.0,
                        };
                        buf.clear();
                        buf.extend_from_slice(&created.to_be_bytes());
                        buf.extend_from_slice(&revision.to_be_bytes());
                        buf.extend_from_slice(value);
                        kv.insert(key.as_str(), buf.as_slice())
                            .map_err(|x| e(x.into()))?;
                    }
                    Op::Delete { key } => {
                        kv.remove(key.as_str()).map_err(|x| e(x.into()))?;
                    }
                }
            }
            meta.insert("revision", revision.to_be_bytes().as_slice())
                .map_err(|x| e(x.into()))?;
        }
        txn.commit().map_err(|x| e(x.into()))?;
        Ok(TxnOutcome {
            succeeded: true,
            revision,
        })
    }

    fn revision_blocking(&self) -> Result<u64, StoreError> {
        let path = &self.inner.path;
        let e = |x: redb::Error| backend(path, "read", x);
        let txn = self.inner.db.begin_read().map_err(|x| e(x.into()))?;
        let meta = txn.open_table(META).map_err(|x| e(x.into()))?;
        let v = meta.get("revision").map_err(|x| e(x.into()))?;
        decode_revision(v.map(|v| v.value().to_vec()).as_deref())
            .map_err(|why| StoreError::Corrupt(format!("{}: {why}", path.display())))
    }
}

/// Run blocking store work on tokio's blocking pool: an fsync must not stall the
/// async workers.
/// The key an op writes.
fn op_key(op: &Op) -> &str {
    match op {
        Op::Put { key, .. } | Op::Delete { key } => key,
    }
}

async fn blocking<T: Send + 'static>(
    store: &RedbStore,
    f: impl FnOnce(&RedbStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let store = store.clone();
    let path = store.inner.path.clone();
    match tokio::task::spawn_blocking(move || guarded(&path, || f(&store))).await {
        Ok(r) => r?,
        Err(e) => Err(StoreError::Backend(format!("store task failed: {e}"))),
    }
}

impl Store for RedbStore {
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, u64), StoreError>> {
        let prefix = prefix.to_owned();
        Box::pin(blocking(self, move |s| s.range_blocking(&prefix)))
    }

    fn txn(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<Op>,
    ) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(blocking(self, move |s| s.txn_blocking(&conditions, &ops)))
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(blocking(self, |s| s.revision_blocking()))
    }

    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn health(&self) -> BoxFuture<'_, Vec<super::EndpointHealth>> {
        Box::pin(async move {
            let endpoint = self.inner.path.display().to_string();
            vec![match self.revision().await {
                Ok(_) => super::EndpointHealth {
                    db_size: std::fs::metadata(&self.inner.path).ok().map(|m| m.len()),
                    endpoint,
                    healthy: true,
                    version: Some(format!("redb (drover {})", env!("CARGO_PKG_VERSION"))),
                    is_leader: true,
                    error: None,
                },
                Err(e) => super::EndpointHealth {
                    endpoint,
                    healthy: false,
                    version: None,
                    db_size: None,
                    is_leader: false,
                    error: Some(e.to_string()),
                },
            }]
        })
    }
}

fn decode_revision(v: Option<&[u8]>) -> Result<u64, String> {
    v.and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| "its revision is missing or malformed".to_owned())
}

fn decode_header(key: &str, v: &[u8]) -> Result<(u64, u64), StoreError> {
    if v.len() < HEADER {
        return Err(StoreError::Corrupt(format!(
            "value of {key:?} is {} bytes, shorter than its revision header",
            v.len()
        )));
    }
    let mut c = [0u8; 8];
    let mut m = [0u8; 8];
    c.copy_from_slice(&v[..8]);
    m.copy_from_slice(&v[8..HEADER]);
    Ok((u64::from_be_bytes(c), u64::from_be_bytes(m)))
}

fn decode_kv(key: &str, v: &[u8]) -> Result<KeyValue, StoreError> {
    let (create_revision, mod_revision) = decode_header(key, v)?;
    Ok(KeyValue {
        key: key.to_owned(),
        value: v[HEADER..].to_vec(),
        create_revision,
        mod_revision,
    })
}

fn backend(path: &Path, op: &str, e: redb::Error) -> StoreError {
    match e {
        redb::Error::Corrupted(why) => StoreError::Corrupt(format!("{}: {why}", path.display())),
        other => StoreError::Backend(format!("{op} {}: {other}", path.display())),
    }
}

/// Run a redb call that may panic on a damaged file and turn a panic into
/// [`StoreError::Corrupt`]: a bad file must never take the server down.
fn guarded<T>(path: &Path, f: impl FnOnce() -> T) -> Result<T, StoreError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown".into());
        StoreError::Corrupt(format!(
            "{}: the database engine failed on it ({what})",
            path.display()
        ))
    })
}

fn open_error(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
            "{} is in use by another server (one server per data dir)",
            path.display()
        )),
        redb::DatabaseError::UpgradeRequired(v) => StoreError::Corrupt(format!(
            "{} is in redb file format {v}, which this server does not read",
            path.display()
        )),
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() != std::io::ErrorKind::InvalidData =>
        {
            StoreError::Backend(format!("open {}: {io}", path.display()))
        }
        other => StoreError::Corrupt(format!(
            "{} is not a valid database: {}",
            path.display(),
            other.to_string().trim_end_matches('.')
        )),
    }
}
