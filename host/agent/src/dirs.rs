//! The agent's own directories (data dir, socket dirs, plugin dir): created with modes
//! that keep other host users out, and refused when they already exist in a state
//! another user could exploit.
//!
//! The rule, checked at every start before anything is read from or written to a
//! directory:
//! - the directory is owned by the agent's uid (the plugin dir and the API socket's
//!   directory may also be owned by root, which can do anything anyway);
//! - a private directory (the data dir and the plugin socket dir, which hold state,
//!   sockets and task logs) grants nothing to group or others (`chmod 0700`);
//!   the others are at least not writable by group or others (`chmod go-w`);
//! - every directory above it is owned by the agent's uid or root and is not writable
//!   by group or others unless it is sticky (`/tmp`): otherwise another user could
//!   rename it away and put their own in its place. This is OpenSSH's `StrictModes`
//!   rule for `~/.ssh`.
//!
//! A directory that does not exist is created with the mode given (exactly, whatever
//! the umask). An existing one is never "fixed" silently: a wrong owner or mode may
//! mean another user prepared it (as with `--dev`'s fixed `/tmp/drover-dev-$UID`), and
//! whatever is inside it cannot be trusted, so the agent refuses to start and says what
//! to do.

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// How strictly a directory is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing for group or others (mode `0700` when created): state, sockets, logs.
    Private,
    /// Not writable by group or others; created with the given mode.
    NotWritableByOthers(u32),
    /// As [`Access::NotWritableByOthers`], and root may own it too: a directory that
    /// holds nothing of the agent's but what it names (the plugin dir, the API
    /// socket's dir), which an administrator may well provide.
    RootMayOwn(u32),
}

impl Access {
    fn create_mode(self) -> u32 {
        match self {
            Access::Private => 0o700,
            Access::NotWritableByOthers(m) | Access::RootMayOwn(m) => m,
        }
    }
}

/// A directory the agent will not use, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    /// The directory, or one above it, is not safe from other host users.
    #[error("refusing to use {path} as the {what}: {problem}; {fix}")]
    Untrusted {
        /// The directory at fault (the one asked for, or one above it).
        path: PathBuf,
        /// What it was to be, e.g. "data directory".
        what: &'static str,
        /// What is wrong with it.
        problem: String,
        /// The command or setting that fixes it.
        fix: String,
    },
    /// The directory could not be created or looked at.
    #[error("cannot prepare {path} as the {what}: {source}")]
    Io {
        /// Which directory.
        path: PathBuf,
        /// What it was to be.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
}

/// Create `path` (and missing parents) if it does not exist, then check it and every
/// directory above it against the rule in the module doc. `what` names it in errors
/// ("data directory").
pub fn prepare(path: &Path, what: &'static str, access: Access) -> Result<(), DirError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| DirError::Io { path, what, source }
    };
    let path = std::path::absolute(path).map_err(io(path))?;
    match std::fs::symlink_metadata(&path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            match std::fs::DirBuilder::new()
                .mode(access.create_mode())
                .create(&path)
            {
                Ok(()) => {
                    // The umask may have taken bits away; the mode is ours to decide.
                    std::fs::set_permissions(
                        &path,
                        std::fs::Permissions::from_mode(access.create_mode()),
                    )
                    .map_err(io(&path))?;
                }
                // Someone else was quicker: it is checked below like any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Err(e) => return Err(io(&path)(e)),
    }
    check(&path, what, access)
}

/// The agent's effective uid.
fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Check an existing directory `path` (absolute) and everything above it.
fn check(path: &Path, what: &'static str, access: Access) -> Result<(), DirError> {
    let uid = my_uid();
    let untrusted = |at: &Path, problem: String, fix: String| DirError::Untrusted {
        path: at.to_owned(),
        what,
        problem,
        fix,
    };
    let io = |at: &Path| {
        let at = at.to_owned();
        move |source| DirError::Io {
            path: at,
            what,
            source,
        }
    };
    // The path as written, then where its links lead: a link is as safe as the
    // directory holding it (links themselves cannot be changed, only replaced), and
    // the directory it points to must be safe as well.
    let real = std::fs::canonicalize(path).map_err(io(path))?;
    for walk in [path, real.as_path()] {
        for dir in walk.ancestors().skip(1) {
            let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
            if meta.uid() != uid && meta.uid() != 0 {
                return Err(untrusted(
                    dir,
                    format!(
                        "{} (a directory above it) is owned by uid {}, who could replace \
                         everything below it",
                        dir.display(),
                        meta.uid()
                    ),
                    format!(
                        "use a directory whose parents belong to uid {uid} or root, or \
                         `chown {uid} {}`",
                        dir.display()
                    ),
                ));
            }
            let sticky = meta.mode() & 0o1000 != 0;
            if !meta.file_type().is_symlink() && meta.mode() & 0o022 != 0 && !sticky {
                return Err(untrusted(
                    dir,
                    format!(
                        "{} (a directory above it) is writable by {} (mode {:04o}), who \
                         could replace everything below it",
                        dir.display(),
                        writers(meta.mode()),
                        meta.mode() & 0o7777
                    ),
                    format!("`chmod go-w {}`, or use another directory", dir.display()),
                ));
            }
        }
    }
    let link = std::fs::symlink_metadata(path).map_err(io(path))?;
    if link.file_type().is_symlink() && link.uid() != uid && link.uid() != 0 {
        return Err(untrusted(
            path,
            format!(
                "it is a symbolic link owned by uid {}, not by this agent's uid {uid}",
                link.uid()
            ),
            format!(
                "remove it (`rm {}`) or use another directory",
                path.display()
            ),
        ));
    }
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if !meta.is_dir() {
        return Err(untrusted(
            path,
            "it is not a directory".into(),
            "remove it or use another path".into(),
        ));
    }
    let root_ok = matches!(access, Access::RootMayOwn(_));
    if meta.uid() != uid && !(root_ok && meta.uid() == 0) {
        return Err(untrusted(
            path,
            format!(
                "it is owned by uid {}, not by this agent's uid {uid}: another user may \
                 have created it to read or plant what the agent keeps there",
                meta.uid()
            ),
            format!(
                "if that is expected, remove it (`rm -rf {p}`) or `chown -R {uid} {p}`; \
                 or use another directory",
                p = path.display()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    match access {
        Access::Private if mode & 0o077 != 0 => Err(untrusted(
            path,
            format!(
                "its mode {mode:04o} lets {} in, and it holds state, sockets and task logs",
                if mode & 0o022 != 0 {
                    writers(mode)
                } else {
                    "other host users"
                }
            ),
            format!("`chmod 0700 {}`", path.display()),
        )),
        Access::NotWritableByOthers(_) | Access::RootMayOwn(_) if mode & 0o022 != 0 => {
            Err(untrusted(
                path,
                format!("its mode {mode:04o} lets {} write in it", writers(mode)),
                format!("`chmod go-w {}`", path.display()),
            ))
        }
        _ => Ok(()),
    }
}

/// Who the write bits of `mode` let in.
fn writers(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "group and others",
        (true, false) => "its group",
        _ => "every host user",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn creates_private_with_exact_mode() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("a/b/data");
        prepare(&d, "data directory", Access::Private).unwrap();
        let mode = std::fs::metadata(&d).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        let run = d.join("run");
        prepare(&run, "socket directory", Access::Private).unwrap();
        prepare(&run, "socket directory", Access::Private).unwrap();
    }

    #[test]
    fn refuses_open_modes_with_the_fix() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("data");
        std::fs::create_dir(&d).unwrap();
        for mode in [0o755, 0o777, 0o750, 0o701] {
            chmod(&d, mode);
            let e = prepare(&d, "data directory", Access::Private)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&d.display().to_string()), "{e}");
            assert!(e.contains(&format!("chmod 0700 {}", d.display())), "{e}");
            assert!(e.contains(&format!("{mode:04o}")), "{e}");
        }
        chmod(&d, 0o755);
        prepare(&d, "plugin directory", Access::RootMayOwn(0o700)).unwrap();
        chmod(&d, 0o775);
        let e = prepare(&d, "plugin directory", Access::RootMayOwn(0o700))
            .unwrap_err()
            .to_string();
        assert!(e.contains("chmod go-w"), "{e}");
    }

    #[test]
    fn refuses_a_writable_parent_but_not_a_sticky_one() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("shared");
        std::fs::create_dir(&parent).unwrap();
        chmod(&parent, 0o777);
        let d = parent.join("data");
        let e = prepare(&d, "data directory", Access::Private)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a directory above it"), "{e}");
        assert!(e.contains(&parent.display().to_string()), "{e}");
        chmod(&parent, 0o1777);
        prepare(&d, "data directory", Access::Private).unwrap();
    }

    #[test]
    fn refuses_a_dir_of_another_owner() {
        if my_uid() != 0 {
            // Only root can give a directory away. CI runs as root: a skip there is
            // a failure.
            assert!(
                std::env::var_os("CI").is_none(),
                "this test needs root to chown a directory"
            );
            eprintln!("skipped: needs root to chown a directory");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("data");
        std::fs::create_dir(&d).unwrap();
        chmod(&d, 0o700);
        rustix::fs::chown(&d, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        let e = prepare(&d, "data directory", Access::Private)
            .unwrap_err()
            .to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
        assert!(e.contains("rm -rf"), "{e}");
        // A link to it, planted by someone else, is refused for the link's owner.
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        rustix::fs::chownat(
            rustix::fs::CWD,
            &link,
            Some(rustix::fs::Uid::from_raw(65534)),
            None,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let e = prepare(&link, "data directory", Access::Private)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link owned by uid 65534"), "{e}");
    }
}
