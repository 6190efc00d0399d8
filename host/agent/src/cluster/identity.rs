//! The node's stable id, kept in `<data_dir>/node-id` so that the servers see the same
//! node across agent restarts (its allocations stay its own), and its secret, kept in
//! `<data_dir>/node-secret`: the proof, sent on every node RPC, that a caller is this
//! node (the server binds its hash to the id at the first registration and refuses
//! calls for the id without it).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use super::ClusterError;

/// The file's name in the data directory.
pub const NODE_ID_FILE: &str = "node-id";
/// The secret's file in the data directory.
pub const NODE_SECRET_FILE: &str = "node-secret";
/// Hex characters of a node secret (32 random bytes).
const SECRET_HEX_CHARS: usize = 64;

/// The node's secret. Its `Debug` does not show it, so that it never reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeSecret(String);

impl NodeSecret {
    /// The secret itself, to send to a server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for NodeSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeSecret(..)")
    }
}

/// The node secret in `data_dir`, created (32 random bytes as hex, mode 0600) the
/// first time. A file that does not hold one is an error, never replaced: the servers
/// know this node by the old secret and would refuse it with a new one.
pub fn load_or_create_secret(data_dir: &Path) -> Result<NodeSecret, ClusterError> {
    let path = data_dir.join(NODE_SECRET_FILE);
    let err = |reason: String| ClusterError::NodeSecret {
        path: path.clone(),
        reason,
    };
    let parse = |text: &str| {
        let s = text.trim_end_matches('\n');
        if s.len() == SECRET_HEX_CHARS && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(NodeSecret(s.to_owned()))
        } else {
            // The content is not echoed: it may be a secret, just a damaged one.
            Err(err(format!(
                "does not hold a node secret ({SECRET_HEX_CHARS} hex characters); restore \
                 it (the servers refuse this node's id without it), or remove it together \
                 with {NODE_ID_FILE} to make this agent a new node"
            )))
        }
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Two UUID v4s: 244 random bits from the OS generator.
            let secret = format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            match write_new(&path, &secret) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "new node secret");
                    Ok(NodeSecret(secret))
                }
                // Another agent on this data dir made one first: that one counts.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| err(format!("cannot read it: {e}")))?;
                    parse(&text)
                }
                Err(e) => Err(err(format!("cannot create it: {e}"))),
            }
        }
        Err(e) => Err(err(format!("cannot read it: {e}"))),
    }
}

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

/// Write `id` to a temporary file and link it into place, so that a crash never
/// leaves a half-written file behind and an existing file is never replaced (the link
/// fails with `AlreadyExists`).
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
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked?;
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
    fn the_secret_is_created_once_private_then_kept_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let secret = load_or_create_secret(dir.path()).unwrap();
        assert_eq!(secret.expose().len(), 64);
        let path = dir.path().join(NODE_SECRET_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_create_secret(dir.path()).unwrap(), secret);
        assert!(!dir.path().join("node-secret.tmp").exists());
        assert!(!format!("{secret:?}").contains(secret.expose()));
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create_secret(other.path()).unwrap(), secret);
    }

    #[test]
    fn a_corrupt_secret_is_an_error_naming_the_file_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NODE_SECRET_FILE);
        std::fs::write(&path, "short\n").unwrap();
        let err = load_or_create_secret(dir.path()).unwrap_err().to_string();
        assert!(err.contains("node-secret"), "{err}");
        assert!(!err.contains("short"), "the content is not echoed: {err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short\n");
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
