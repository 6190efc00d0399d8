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
/// // -1 means "unchanged" to setresuid: never a valid id.
/// assert!(drover_isolation::user::resolve("4294967295").is_err());
/// ```
pub fn resolve(user: &str) -> Result<Credentials, DriverError> {
    let user = user.trim();
    if let Some((uid, gid)) = numeric(user)? {
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

/// The largest uid or gid a task may name: ids above `2^31 - 1` are refused, as by
/// shadow-utils and container runtimes. `4294967295` is `(uid_t)-1`, which
/// `setresuid`/`setresgid` read as "leave unchanged": the task would keep the
/// executor's uid 0.
pub const MAX_ID: u32 = i32::MAX as u32;

/// `1000` (gid = uid) or `1000:100`; `None` when `user` is not numbers (a name).
fn numeric(user: &str) -> Result<Option<(u32, u32)>, DriverError> {
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(u) || !all_digits(g) {
        return Ok(None);
    }
    let id = |s: &str, what: &str| {
        s.parse::<u32>()
            .ok()
            .filter(|v| *v <= MAX_ID)
            .ok_or_else(|| {
                DriverError::InvalidConfig(format!(
                    "user {user:?}: {what} {s} is out of range: uids and gids go up to {MAX_ID} \
                     (4294967295 is -1, which would leave the task with the plugin's own id)"
                ))
            })
    };
    Ok(Some((id(u, "uid")?, id(g, "gid")?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_out_of_range_are_refused_naming_them() {
        for (user, word) in [
            ("4294967295", "uid 4294967295"),
            ("65534:4294967295", "gid 4294967295"),
            ("2147483648", "uid 2147483648"),
            ("99999999999", "uid 99999999999"),
            ("1:2147483648", "gid 2147483648"),
        ] {
            let e = resolve(user).unwrap_err();
            assert!(matches!(e, DriverError::InvalidConfig(_)), "{user}: {e:?}");
            assert!(e.to_string().contains(word), "{user}: {e}");
        }
        let top = resolve("2147483647:2147483647").unwrap();
        assert_eq!((top.uid, top.gid), (MAX_ID, MAX_ID));
    }
}
