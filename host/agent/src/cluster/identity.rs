//! The node's stable id, kept in `<data_dir>/node-id` so that the servers see the same
//! node across agent restarts (its allocations stay its own).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use super::ClusterError;

/// The file's name in the data directory.
pub const NODE_ID_FILE: &str = "node-id";

/// The node id in `data_dir`, created (a random UUID, mode 0600) the first time. A
/// file that does not hold a UUID is an error, never replaced: a new id would make the
/// servers see a new node and the old one's allocations lost.
pub fn load_or_create(data_dir: &Path) -> Result<String, ClusterError> {
    let path = data_dir.join(NODE_ID_FILE);
    let err = |reason: String| ClusterError::NodeId {
        path: path.clone(),
        reason,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = uuid::Uuid::parse_str(text.trim()).map_err(|e| {
                err(format!(
                    "does not hold a node id (a UUID): {e}; restore it, or remove it to make \
                     this agent a new node (the servers then see the old one go down)"
                ))
            })?;
            Ok(id.hyphenated().to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = uuid::Uuid::new_v4().hyphenated().to_string();
            write_new(&path, &id).map_err(|e| err(format!("cannot create it: {e}")))?;
            tracing::info!(node_id = %id, path = %path.display(), "new node id");
            Ok(id)
        }
        Err(e) => Err(err(format!("cannot read it: {e}"))),
    }
}

/// Write `id` to a temporary file and rename it into place, so that a crash never
/// leaves a half-written id behind.
fn write_new(path: &Path, id: &str) -> std::io::Result<()> {
    let tmp: PathBuf = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(format!("{id}\n").as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn created_once_private_then_kept() {
        let dir = tempfile::tempdir().unwrap();
        let id = load_or_create(dir.path()).unwrap();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
        let path = dir.path().join(NODE_ID_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_create(dir.path()).unwrap(), id);
        assert!(!dir.path().join("node-id.tmp").exists());
    }

    #[test]
    fn a_corrupt_file_is_an_error_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NODE_ID_FILE);
        std::fs::write(&path, "not-a-uuid\n").unwrap();
        let err = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("node-id") && err.contains("UUID"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not-a-uuid\n");
    }
}
