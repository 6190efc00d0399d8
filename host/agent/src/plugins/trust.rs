//! Whether a candidate's file may run. The file is opened once and checked on the
//! descriptor ([`open_checked`]: no symlink, a regular file, owner and mode, not being
//! written), and the bytes behind that descriptor are hashed ([`Binary`]); the launcher
//! executes that descriptor, so the bytes checked are the bytes that run. The
//! operator's [`Policy`] (allow and deny lists, `sha256` pins, `in_process`) then says
//! whether those bytes may run, and under which name they may serve.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use drover_api::PluginSource;
use sha2::Digest as _;

use super::candidate::{Candidate, CandidateKind};
use crate::config::AgentConfig;

/// Identity of a file's content as far as `fstat` tells: device, inode, size, mtime and
/// ctime (which no one can set back), each with nanoseconds. While it is unchanged, a
/// hash taken earlier still describes the file.
pub type FileKey = (u64, u64, u64, i64, u64, i64, u64);

/// Why a file or directory is not safe to run plugins from: writable by others, or
/// owned by someone other than us or root. `what` names it in the message, `path` is
/// what the fix applies to.
fn insecure_reason(mode: u32, uid: u32, what: &str, path: &Path) -> Option<String> {
    let path = path.display();
    // Group-writable counts too: a group other than root's may hold other host users,
    // and any of them could then swap the binary the agent runs as its own uid.
    if mode & 0o022 != 0 {
        let who = if mode & 0o002 != 0 {
            "world-writable"
        } else {
            "group-writable"
        };
        return Some(format!(
            "{what} is {who} (mode {:04o}): another user could replace the plugin; \
             fix: chmod go-w {path}",
            mode & 0o7777
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        return Some(format!(
            "{what} is owned by uid {uid}, not by root or the agent's uid {me}; \
             fix: chown {me} {path}"
        ));
    }
    None
}

/// What a non-regular file is, for a refusal.
fn file_type_name(t: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match t {
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        _ => "not a regular file",
    }
}

/// Open the candidate's binary once and check it on the descriptor, never by path
/// again: the file itself must not be a symlink (`O_NOFOLLOW`), must be a regular,
/// executable file, owned by root or the agent's uid and not writable by group or
/// others; an external plugin's directory is checked the same way and the file is
/// opened relative to it. The descriptor is close-on-exec; it is what the launcher
/// executes, or, for a driver library, what the sealed copy that is loaded is made
/// from ([`super::library`]). A library need not be executable (`dlopen` maps it, nothing
/// executes the file); every other check is the same.
///
/// The file is first opened with `O_PATH`, which never blocks and reads nothing, and
/// only a regular file is then opened for reading: opening a FIFO for reading blocks
/// until a writer comes, and opening a device may act on it, so a FIFO dropped into
/// `plugin_dir` would otherwise hang plugin loading for good. The second open cannot
/// block either (`O_NONBLOCK`) and must find the same file (device and inode), or the
/// candidate is refused.
pub fn open_checked(c: &Candidate) -> Result<(OwnedFd, FileKey), String> {
    let r = open_checked_inner(c);
    match c.source {
        PluginSource::External => r,
        // Built-ins run from the agent's own binary: say so, or "file is
        // group-writable" leaves the operator looking for a plugin file.
        PluginSource::Builtin => r.map_err(|reason| {
            format!(
                "built-in drivers run from the agent's own binary, and it fails the checks \
                 every plugin binary must pass: {reason}"
            )
        }),
    }
}

fn open_checked_inner(c: &Candidate) -> Result<(OwnedFd, FileKey), String> {
    use rustix::fs::{FileType, Mode, OFlags};
    let shown = c.path.display().to_string();
    let kind = c.kind();
    let refused = |e: rustix::io::Errno| {
        if e == rustix::io::Errno::LOOP {
            let (what, how) = match kind {
                CandidateKind::Binary => ("plugin binaries are run", "binary"),
                CandidateKind::Library => ("driver libraries are loaded", "library"),
            };
            format!(
                "{shown} is a symlink: {what} only from the file itself (O_NOFOLLOW); copy \
                 or move the {how} into place"
            )
        } else {
            format!("cannot open {shown}: {e}")
        }
    };
    let (dir_fd, name) = match c.source {
        PluginSource::External => {
            let (Some(dir), Some(name)) = (c.path.parent(), c.path.file_name()) else {
                return Err(format!("{shown} is not a file in a directory"));
            };
            let dir_fd = rustix::fs::open(
                dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("cannot open plugin_dir {}: {e}", dir.display()))?;
            let st =
                rustix::fs::fstat(&dir_fd).map_err(|e| format!("cannot stat plugin_dir: {e}"))?;
            if let Some(reason) = insecure_reason(
                st.st_mode,
                st.st_uid,
                &format!("plugin_dir {}", dir.display()),
                dir,
            ) {
                return Err(reason);
            }
            (Some(dir_fd), name.to_owned())
        }
        PluginSource::Builtin => (None, c.path.as_os_str().to_owned()),
    };
    let open = |flags: OFlags| match &dir_fd {
        Some(dir) => rustix::fs::openat(dir, name.as_os_str(), flags, Mode::empty()),
        None => rustix::fs::open(name.as_os_str(), flags, Mode::empty()),
    };
    // O_PATH: no read access asked for, so nothing blocks and no device is touched.
    let path_fd = open(OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC).map_err(refused)?;
    let st = rustix::fs::fstat(&path_fd).map_err(|e| format!("cannot stat {shown}: {e}"))?;
    let file_type = FileType::from_raw_mode(st.st_mode);
    if file_type != FileType::RegularFile {
        return Err(format!(
            "{shown} is {}, not a regular file: only regular files are run or loaded as plugins",
            file_type_name(file_type)
        ));
    }
    let fd = open(
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
    )
    .map_err(refused)?;
    let st2 = rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat {shown}: {e}"))?;
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino)
        || FileType::from_raw_mode(st2.st_mode) != FileType::RegularFile
    {
        return Err(format!(
            "{shown} was replaced while it was being checked; not run"
        ));
    }
    // Reads of the binary (its hash) should block as usual.
    let fcntl_failed = |e: rustix::io::Errno| format!("fcntl on {shown}: {e}");
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(fcntl_failed)?;
    rustix::fs::fcntl_setfl(&fd, flags.difference(OFlags::NONBLOCK)).map_err(fcntl_failed)?;
    let mode = st2.st_mode;
    if kind == CandidateKind::Binary && mode & 0o111 == 0 {
        return Err(format!(
            "{shown} is not executable (mode {:04o}); chmod +x it to load it",
            mode & 0o7777
        ));
    }
    if let Some(reason) = insecure_reason(mode, st2.st_uid, &shown, &c.path) {
        return Err(reason);
    }
    if kind == CandidateKind::Library && open_for_writing(&fd) {
        return Err(format!(
            "{shown} is still open for writing (a copy in progress?): a library is loaded \
             only once nobody writes it; it is tried again at the next reload (its writer's \
             close starts one)"
        ));
    }
    let key = (
        st2.st_dev,
        st2.st_ino,
        st2.st_size as u64,
        st2.st_mtime,
        st2.st_mtime_nsec as u64,
        st2.st_ctime,
        st2.st_ctime_nsec as u64,
    );
    Ok((fd, key))
}

/// Does any process have the file behind `fd` (opened read-only) open for writing?
///
/// A read lease (`F_SETLEASE`, `F_RDLCK`) is refused with `EAGAIN` exactly then; it is
/// given back at once. A writer opening the file in between would break the lease and
/// signal this process: the signal is made `SIGURG` first (ignored unless handled; the
/// default `SIGIO` would end the agent). The lease needs the file's owner or
/// `CAP_LEASE`, and a filesystem that has leases: where it cannot be taken for those
/// reasons, this says no, and the loader's quiet-time check
/// ([`super::library::SETTLE`]) is what remains.
fn open_for_writing(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    // `F_SETSIG` (asm-generic/fcntl.h), which the libc crate does not export.
    const F_SETSIG: libc::c_int = 10;
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function borrows, with integer arguments.
    #[allow(unsafe_code)]
    unsafe {
        if libc::fcntl(fd, F_SETSIG, libc::SIGURG) != 0 {
            return false;
        }
        if libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) == 0 {
            libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
            return false;
        }
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
}

/// sha256 of the bytes behind `fd` (hex), read from the start.
pub fn sha256_fd(fd: &OwnedFd) -> std::io::Result<String> {
    use std::io::{Seek as _, SeekFrom};
    let mut file = std::fs::File::from(fd.try_clone()?);
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// A plugin binary opened once and checked ([`open_checked`]), with the sha256 of the
/// bytes behind its descriptor: the launcher executes this descriptor, so the bytes
/// checked are the bytes that run.
#[derive(Debug, Clone)]
pub struct Binary {
    /// The open file, close-on-exec.
    pub fd: Arc<OwnedFd>,
    /// sha256 (hex, lowercase) of its content.
    pub sha256: String,
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Which binaries may run and serve: `plugin_allow`/`plugin_deny` and the `sha256`
/// pins of `[plugin.NAME]`.
///
/// The pin rule: while no pin is configured, any binary that passes the file checks
/// runs. Once any `[plugin.NAME] sha256` is configured, an external binary runs only if
/// its sha256 equals one of the configured pins (file names do not matter, so renaming
/// a file cannot dodge a pin), and it then serves only if the name it reports has a pin
/// equal to its sha256. A built-in (the agent's own binary) needs no pin, but a pin
/// configured under its name is checked before it runs. All of it is checked before
/// every exec, relaunches included, on the bytes executed.
///
/// Driver libraries follow the same rules (pins included: a library is external),
/// and one more: a library is loaded only when `[plugin.<label>] in_process = true`
/// asks for it, checked before every load, relaunches included.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `plugin_allow`.
    pub allow: Vec<String>,
    /// `plugin_deny`.
    pub deny: Vec<String>,
    /// Pins by plugin name, lowercase hex.
    pub pins: BTreeMap<String, String>,
    /// Names whose `[plugin.NAME]` says `in_process = true`: the driver libraries that
    /// may be loaded into the agent.
    pub in_process: BTreeSet<String>,
}

impl Policy {
    /// The policy the configuration describes.
    pub fn from_config(config: &AgentConfig) -> Self {
        Policy {
            allow: config.plugin_allow.clone(),
            deny: config.plugin_deny.clone(),
            pins: config
                .plugin
                .iter()
                .filter_map(|(name, s)| {
                    s.sha256
                        .as_ref()
                        .map(|p| (name.clone(), p.trim().to_ascii_lowercase()))
                })
                .collect(),
            in_process: config
                .plugin
                .iter()
                .filter(|(_, s)| s.in_process)
                .map(|(name, _)| name.clone())
                .collect(),
        }
    }

    /// May `c`, whose binary hashes to `sha256`, be executed (a library: loaded)?
    pub fn before_exec(&self, c: &Candidate, sha256: &str) -> Result<(), String> {
        allowed(&c.label, &self.allow, &self.deny)?;
        if c.kind() == CandidateKind::Library && !self.in_process.contains(&c.label) {
            let label = &c.label;
            return Err(format!(
                "not loaded: {} is a driver library, and a library is loaded into the agent \
                 only when its config allows it (a crash of an in-process driver is a crash \
                 of the agent); to load it, add `in_process = true` under [plugin.{label}] \
                 in the agent config",
                c.path.display()
            ));
        }
        let (not_run, run) = match c.kind() {
            CandidateKind::Binary => ("not run", "run"),
            CandidateKind::Library => ("not loaded", "load"),
        };
        if let Some(pin) = self.pins.get(&c.label) {
            if !pin.eq_ignore_ascii_case(sha256) {
                return Err(format!(
                    "sha256 is {sha256}, but [plugin.{}] sha256 pins {pin}; {not_run}",
                    c.label
                ));
            }
            return Ok(());
        }
        if c.source == PluginSource::External
            && !self.pins.is_empty()
            && !self.pins.values().any(|p| p.eq_ignore_ascii_case(sha256))
        {
            return Err(format!(
                "not pinned: its sha256 {sha256} matches no [plugin.NAME] sha256 pin, and once \
                 any pin is configured only pinned binaries and libraries run; {not_run} (to \
                 {run} it, add sha256 = \"{sha256}\" under [plugin.<the name it serves>])"
            ));
        }
        Ok(())
    }

    /// May a binary hashing to `sha256` serve the plugin name it reported?
    pub fn before_serve(
        &self,
        name: &str,
        source: PluginSource,
        sha256: &str,
    ) -> Result<(), String> {
        allowed(name, &self.allow, &self.deny)?;
        match self.pins.get(name) {
            Some(pin) if !pin.eq_ignore_ascii_case(sha256) => Err(format!(
                "sha256 is {sha256}, but [plugin.{name}] sha256 pins {pin}"
            )),
            None if source == PluginSource::External && !self.pins.is_empty() => Err(format!(
                "it calls itself {name:?}, but no [plugin.{name}] sha256 pins it; once any pin \
                 is configured an external plugin serves only under a name that pins its sha256"
            )),
            _ => Ok(()),
        }
    }
}

/// Is `name` allowed by the allow and deny lists?
pub(super) fn allowed(name: &str, allow: &[String], deny: &[String]) -> Result<(), String> {
    // A driver's older name is the same driver: a plugin reporting `rawexec` is as
    // denied as `raw_exec` (and cannot slip past a deny list by the alias).
    let canonical = drover_api::canonical_driver_name;
    let same = |listed: &String| canonical(listed) == canonical(name);
    if deny.iter().any(same) {
        return Err(format!("{name:?} is in plugin_deny"));
    }
    if !allow.is_empty() && !allow.iter().any(same) {
        return Err(format!("{name:?} is not in plugin_allow"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn allow_and_deny() {
        assert!(allowed("x", &[], &[]).is_ok());
        assert!(allowed("x", &[], &["x".into()]).is_err());
        assert!(allowed("x", &["y".into()], &[]).is_err());
        assert!(allowed("y", &["y".into()], &[]).is_ok());
        // A driver's older name is the same driver, either way round.
        assert!(allowed("rawexec", &[], &["raw_exec".into()]).is_err());
        assert!(allowed("raw_exec", &[], &["rawexec".into()]).is_err());
        assert!(allowed("rawexec", &["raw_exec".into()], &[]).is_ok());
    }

    fn candidate(label: &str, source: PluginSource) -> Candidate {
        Candidate {
            path: PathBuf::from("/plugins").join(label),
            args: Vec::new(),
            source,
            label: label.into(),
        }
    }

    #[test]
    fn pins_bind_bytes_to_names_and_lock_out_unpinned_binaries() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let ext = PluginSource::External;
        let none = Policy::default();
        assert!(none.before_exec(&candidate("x", ext), &a).is_ok());
        assert!(none.before_serve("x", ext, &a).is_ok());

        let pinned = Policy {
            pins: [("skeleton".to_owned(), a.clone())].into(),
            ..Policy::default()
        };
        // Any file name: only the pinned bytes run.
        assert!(
            pinned
                .before_exec(&candidate("drover-skeleton-driver", ext), &a)
                .is_ok()
        );
        let err = pinned
            .before_exec(&candidate("drover-skeleton-driver", ext), &b)
            .unwrap_err();
        assert!(err.contains("not pinned"), "{err}");
        let err = pinned
            .before_exec(&candidate("skeleton", ext), &b)
            .unwrap_err();
        assert!(err.contains("[plugin.skeleton] sha256 pins"), "{err}");
        // The pinned bytes serve only under the name that pins them.
        assert!(pinned.before_serve("skeleton", ext, &a).is_ok());
        let err = pinned.before_serve("other", ext, &a).unwrap_err();
        assert!(err.contains("no [plugin.other] sha256"), "{err}");
        // Built-ins need no pin, but one under their name is checked.
        let builtin = PluginSource::Builtin;
        assert!(
            pinned
                .before_exec(&candidate("rawexec", builtin), &b)
                .is_ok()
        );
        assert!(pinned.before_serve("rawexec", builtin, &b).is_ok());
        let strict = Policy {
            pins: [("rawexec".to_owned(), a.clone())].into(),
            ..Policy::default()
        };
        assert!(
            strict
                .before_exec(&candidate("rawexec", builtin), &b)
                .is_err()
        );
        assert!(strict.before_serve("rawexec", builtin, &b).is_err());
        // Deny wins over a pin.
        let denied = Policy {
            deny: vec!["skeleton".into()],
            ..pinned
        };
        assert!(denied.before_serve("skeleton", ext, &a).is_err());
    }

    #[test]
    fn a_library_loads_only_with_in_process_and_pins_hold_for_it() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let lib = Candidate {
            path: PathBuf::from("/plugins/librawexec.so"),
            ..candidate("rawexec", PluginSource::External)
        };
        let err = Policy::default().before_exec(&lib, &a).unwrap_err();
        assert!(
            err.contains("/plugins/librawexec.so is a driver library")
                && err.contains("add `in_process = true` under [plugin.rawexec]"),
            "{err}"
        );
        let allowed = Policy {
            in_process: ["rawexec".to_owned()].into(),
            ..Policy::default()
        };
        assert!(allowed.before_exec(&lib, &a).is_ok());
        // The same label as a binary needs no consent: it runs as a process.
        assert!(
            Policy::default()
                .before_exec(&candidate("rawexec", PluginSource::External), &a)
                .is_ok()
        );
        let pinned = Policy {
            pins: [("rawexec".to_owned(), a.clone())].into(),
            ..allowed.clone()
        };
        assert!(pinned.before_exec(&lib, &a).is_ok());
        let err = pinned.before_exec(&lib, &b).unwrap_err();
        assert!(
            err.contains("[plugin.rawexec] sha256 pins") && err.ends_with("not loaded"),
            "{err}"
        );
        let other = Policy {
            pins: [("skeleton".to_owned(), a.clone())].into(),
            ..allowed.clone()
        };
        assert!(
            other
                .before_exec(&lib, &b)
                .unwrap_err()
                .contains("not pinned")
        );
        let denied = Policy {
            deny: vec!["rawexec".into()],
            ..allowed
        };
        assert!(
            denied
                .before_exec(&lib, &a)
                .unwrap_err()
                .contains("plugin_deny")
        );
    }
}
