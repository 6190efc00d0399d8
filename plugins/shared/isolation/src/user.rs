//! The user a task runs as: a name or number resolved on the host.

use drover_executor::Credentials;
use drover_plugin_sdk::DriverError;

/// Who a task runs as when its config says nothing.
pub const DEFAULT_USER: &str = "nobody";

/// Resolve `user`: a name from the host's user database (its primary group and
/// supplementary groups with it), or `uid` / `uid:gid` numbers.
///
/// ```
/// let root = drover_isolation::user::resolve("root").unwrap();
/// assert_eq!((root.uid, root.gid), (0, 0));
/// let n = drover_isolation::user::resolve("1234:5678").unwrap();
/// assert_eq!((n.uid, n.gid, n.groups.len()), (1234, 5678, 0));
/// assert!(drover_isolation::user::resolve("no-such-user-here").is_err());
/// ```
pub fn resolve(user: &str) -> Result<Credentials, DriverError> {
    let user = user.trim();
    if let Some((uid, gid)) = numeric(user) {
        return Ok(Credentials {
            uid,
            gid,
            groups: Vec::new(),
        });
    }
    let entry = nix::unistd::User::from_name(user)
        .map_err(|e| DriverError::Internal(format!("cannot look up user {user:?}: {e}")))?
        .ok_or_else(|| {
            DriverError::InvalidConfig(format!("user {user:?} does not exist on this host"))
        })?;
    let name = std::ffi::CString::new(user)
        .map_err(|_| DriverError::InvalidConfig(format!("user {user:?} contains a NUL byte")))?;
    let groups = nix::unistd::getgrouplist(&name, entry.gid)
        .map_err(|e| DriverError::Internal(format!("cannot list the groups of {user:?}: {e}")))?;
    Ok(Credentials {
        uid: entry.uid.as_raw(),
        gid: entry.gid.as_raw(),
        groups: groups.into_iter().map(|g| g.as_raw()).collect(),
    })
}

/// `1000` (gid = uid) or `1000:100`.
fn numeric(user: &str) -> Option<(u32, u32)> {
    match user.split_once(':') {
        Some((u, g)) => Some((u.parse().ok()?, g.parse().ok()?)),
        None => {
            let u = user.parse().ok()?;
            Some((u, u))
        }
    }
}
