//! Files only their owner may read: the cluster token (an agent's `token_file`, a
//! server's `--token-file`) and the servers' TLS private keys. Whoever reads one acts
//! with its rights, so a file others can read is refused, naming the `chmod` that
//! fixes it. The cluster client, the agent's forwarder and `drover server` all read
//! them here.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// Refuses a file whose mode has a bit of `mask` set (`0o006`: other users can read
/// or change it; `0o077`: its group or others can), with `fix` as the remedy.
/// Shared by the token file and the servers' private key files.
pub fn check_private_file(path: &Path, mask: u32, fix: &str) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let mode = meta.permissions().mode();
    if mode & mask != 0 {
        let who = if mask & 0o070 != 0 {
            "users of its group or others"
        } else {
            "every user on this host"
        };
        return Err(format!(
            "mode {:o} lets {who} read or change it; {fix}",
            mode & 0o777
        ));
    }
    Ok(())
}

/// A token file that cannot be used. Displays as `token file PATH: REASON`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token file {}: {reason}", path.display())]
pub struct TokenFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, and what to do.
    pub reason: String,
}

/// The token in `path`: the file's content without surrounding whitespace. A file
/// other users can read or write is refused (anyone who reads it can act as a node),
/// and so is an empty one (a token of nothing would let anyone in on a server that
/// accepted it).
pub fn read_token(path: &Path) -> Result<String, TokenFileError> {
    let bad = |reason: String| TokenFileError {
        path: path.to_owned(),
        reason,
    };
    let fix = format!("`chmod o-rwx {}` (0600 is best)", path.display());
    check_private_file(path, 0o006, &fix).map_err(bad)?;
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(bad("it is empty".into()));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "the token must be printable ASCII without spaces (it travels in a header)".into(),
        ));
    }
    Ok(token.to_owned())
}
