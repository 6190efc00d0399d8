//! Which program an executor runs.
//!
//! An executor lives as long as its task, so whatever is linked into the program it
//! runs is paid once per running task. The dedicated [`EXECUTOR_BINARY`]
//! (`drover-executor`, installed beside `drover`) links only what supervising one task
//! needs; a driver's own binary (the plugin, or `drover` for the built-in drivers)
//! links its whole gRPC stack and runtime too. So a driver uses the dedicated binary
//! whenever a good one is there, and its own binary otherwise.
//!
//! Where it looks, first match wins:
//! 1. the path in [`ENV_EXECUTOR_PROGRAM`] (`DROVER_EXECUTOR`), if set;
//! 2. `drover-executor` in the directory of the driver's own program (the plugin binary,
//!    or for a driver loaded into a host, the host's binary).
//!
//! A candidate is used only if it passes every check, made on the open file that is
//! later executed (by `/proc/self/fd/N`, so a file swapped in after the check is never
//! run): a regular file, owned by root or by the driver's own user, writable by nobody
//! else, and carrying this driver's [`BUILD_ID`]. A candidate that fails a check is
//! refused with an error in the driver's log that names the file and what is wrong,
//! and executors then run the driver's own binary, as before the dedicated executor
//! existed. Executors that the driver's own binary started keep being recovered: both
//! forms speak the same protocol.

use std::fs::File;
use std::io::Read as _;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// File name of the dedicated executor, looked for beside the driver's program.
///
/// Where a driver looks, first match wins: the path in [`ENV_EXECUTOR_PROGRAM`] if set;
/// else `drover-executor` in the directory of the driver's own program (the plugin
/// binary, or for a driver loaded into a host, the host's binary). The candidate is
/// used only if it is a regular file, owned by root or the driver's user, writable by
/// no one else, and carries this driver's [`BUILD_ID`]; these checks are made on the
/// open file that is then executed. A refused candidate is named in the driver's log
/// with the reason, and executors run the driver's own binary instead.
///
/// ```
/// assert_eq!(drover_executor::EXECUTOR_BINARY, "drover-executor");
/// ```
pub const EXECUTOR_BINARY: &str = "drover-executor";

/// Environment variable naming the dedicated executor explicitly (tests, unusual
/// layouts); it then is the only candidate.
///
/// ```
/// assert_eq!(drover_executor::ENV_EXECUTOR_PROGRAM, "DROVER_EXECUTOR");
/// ```
pub const ENV_EXECUTOR_PROGRAM: &str = "DROVER_EXECUTOR";

/// This build of the executor: the crate's version and a hash of its sources (see
/// `build.rs`). A dedicated executor binary is used only if it carries the same id.
///
/// ```
/// assert!(drover_executor::BUILD_ID.starts_with(env!("CARGO_PKG_VERSION")));
/// ```
pub const BUILD_ID: &str = env!("DROVER_EXECUTOR_BUILD_ID");

/// What precedes the build id inside a dedicated executor binary.
const MARKER_PREFIX: &[u8] = b"drover-executor-build:";

/// The build marker the dedicated executor carries in its read-only data, ended by a
/// NUL. Referenced by [`crate::executor_main`], so the linker keeps it.
pub(crate) static BUILD_MARKER: &str = concat!(
    "drover-executor-build:",
    env!("DROVER_EXECUTOR_BUILD_ID"),
    "\0"
);

/// Largest executor binary read to find its build id.
const MAX_BINARY: u64 = 64 * 1024 * 1024;

/// The program executors of this process run.
#[derive(Debug)]
pub(crate) enum Program {
    /// A checked dedicated executor, kept open: what is executed is what was checked.
    Dedicated { path: PathBuf, file: File },
    /// The driver's own program (see [`drover_plugin_sdk::inproc::executor_program`]).
    Own(PathBuf),
}

impl Program {
    /// What to pass to `execve`.
    pub(crate) fn exec_path(&self) -> PathBuf {
        match self {
            Program::Dedicated { file, .. } => {
                PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
            }
            Program::Own(path) => path.clone(),
        }
    }

    /// For messages: the file's own path.
    pub(crate) fn display_path(&self) -> &Path {
        match self {
            Program::Dedicated { path, .. } | Program::Own(path) => path,
        }
    }
}

/// The program of this process's executors, resolved (and logged) once.
pub(crate) fn program() -> &'static Program {
    static PROGRAM: OnceLock<Program> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let own = drover_plugin_sdk::inproc::executor_program();
        let explicit = std::env::var_os(ENV_EXECUTOR_PROGRAM).map(PathBuf::from);
        let (candidate, required) = match explicit {
            Some(path) => (path, true),
            None => match sibling(&own) {
                Some(path) => (path, false),
                None => return Program::Own(own),
            },
        };
        match check(&candidate) {
            Ok(file) => {
                tracing::debug!(executor = %candidate.display(), "tasks run under the dedicated executor");
                Program::Dedicated {
                    path: candidate,
                    file,
                }
            }
            Err(Refusal::Missing) if !required => {
                tracing::info!(
                    looked_for = %candidate.display(),
                    "no dedicated executor installed; each task's executor runs this driver's \
                     own binary, which costs more memory per task"
                );
                Program::Own(own)
            }
            Err(refusal) => {
                tracing::error!(
                    executor = %candidate.display(),
                    "refusing the executor binary: {}; each task's executor runs this driver's \
                     own binary instead",
                    refusal.describe(&candidate)
                );
                Program::Own(own)
            }
        }
    })
}

/// `drover-executor` beside the file `own` resolves to.
fn sibling(own: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(own).ok()?;
    Some(real.parent()?.join(EXECUTOR_BINARY))
}

/// Why a candidate executor binary is not used.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Missing,
    Unreadable(String),
    NotAFile,
    Link,
    UnsafeDirectory { uid: u32, mode: u32 },
    NotExecutable,
    Owner { uid: u32, me: u32 },
    Writable { mode: u32 },
    NoBuildId,
    OtherBuild(String),
}

impl Refusal {
    pub(crate) fn describe(&self, path: &Path) -> String {
        let p = path.display();
        match self {
            Refusal::Missing => format!("{p} does not exist"),
            Refusal::Unreadable(e) => format!("cannot read {p}: {e}"),
            Refusal::NotAFile => format!("{p} is not a regular file"),
            Refusal::Link => format!("{p} is a symbolic link; install the file itself"),
            Refusal::UnsafeDirectory { uid, mode } => format!(
                "the directory of {p} is owned by uid {uid} with mode {mode:o}: it must be \
                 owned by root or this driver's user and writable by no one else, or someone \
                 else could put an executor there"
            ),
            Refusal::NotExecutable => format!("{p} is not executable"),
            Refusal::Owner { uid, me } => {
                format!("{p} is owned by uid {uid}, neither root nor this driver's uid {me}")
            }
            Refusal::Writable { mode } => {
                format!("{p} is writable by group or others (mode {mode:o})")
            }
            Refusal::NoBuildId => {
                format!("{p} is not a Drover executor (it carries no executor build id)")
            }
            Refusal::OtherBuild(theirs) => format!(
                "{p} is executor build {theirs}, but this driver is build {BUILD_ID}: install \
                 drover-executor from the same build as the driver (or remove it)"
            ),
        }
    }
}

/// Open `path` and check it as an executor binary of this build: its directory first
/// (owned by root or us, writable by no one else, so that no one else can put a file
/// or a link there), then the file, opened beneath that directory without following a
/// link and without blocking on a FIFO, and checked on the descriptor.
pub(crate) fn check(path: &Path) -> Result<File, Refusal> {
    use rustix::fs::{Mode, OFlags};
    let unreadable = |e: rustix::io::Errno| Refusal::Unreadable(e.to_string());
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Refusal::NotAFile);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let me = rustix::process::geteuid().as_raw();
    let dir = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => Refusal::Missing,
        e => unreadable(e),
    })?;
    let dmeta = rustix::fs::fstat(&dir).map_err(unreadable)?;
    if (dmeta.st_uid != 0 && dmeta.st_uid != me) || dmeta.st_mode & 0o022 != 0 {
        return Err(Refusal::UnsafeDirectory {
            uid: dmeta.st_uid,
            mode: dmeta.st_mode & 0o7777,
        });
    }
    let fd = rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => Refusal::Missing,
        rustix::io::Errno::LOOP => Refusal::Link,
        e => unreadable(e),
    })?;
    // Above the standard descriptors, whatever this process left closed: the child
    // maps 0-2 to its stdio before it runs /proc/self/fd/N.
    let fd = rustix::io::fcntl_dupfd_cloexec(&fd, 3).map_err(unreadable)?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| Refusal::Unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(Refusal::NotAFile);
    }
    if meta.mode() & 0o100 == 0 {
        return Err(Refusal::NotExecutable);
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(Refusal::Owner {
            uid: meta.uid(),
            me,
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Refusal::Writable {
            mode: meta.mode() & 0o7777,
        });
    }
    let mut bytes = Vec::new();
    (&file)
        .take(MAX_BINARY)
        .read_to_end(&mut bytes)
        .map_err(|e| Refusal::Unreadable(e.to_string()))?;
    let ids = build_ids(&bytes);
    if ids.iter().any(|id| id == BUILD_ID) {
        return Ok(file);
    }
    Err(match ids.into_iter().next() {
        Some(theirs) => Refusal::OtherBuild(theirs),
        None => Refusal::NoBuildId,
    })
}

/// Every build id marked in `bytes` (a binary holds one; a driver binary pointed at by
/// mistake may hold none).
fn build_ids(bytes: &[u8]) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = bytes;
    while let Some(at) = memchr::memmem::find(rest, MARKER_PREFIX) {
        let tail = &rest[at + MARKER_PREFIX.len()..];
        let end = tail.iter().take(128).position(|&b| b == 0);
        if let Some(end) = end
            && let Ok(id) = std::str::from_utf8(&tail[..end])
            && !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.+".contains(&b))
        {
            ids.push(id.to_owned());
        }
        rest = tail;
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_binary_of_this_build_passes() {
        let tmp = tempfile::tempdir().unwrap();
        let body = format!("\x7fELF junk {BUILD_MARKER} more");
        let p = write(tmp.path(), "x", body.as_bytes(), 0o755);
        assert!(check(&p).is_ok());
    }

    #[test]
    fn another_build_is_refused_naming_both_ids() {
        let tmp = tempfile::tempdir().unwrap();
        let p = write(
            tmp.path(),
            "x",
            b"\x7fELF drover-executor-build:0.0.1-00000000deadbeef\0",
            0o755,
        );
        let refusal = check(&p).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::OtherBuild("0.0.1-00000000deadbeef".into())
        );
        let text = refusal.describe(&p);
        assert!(
            text.contains("0.0.1-00000000deadbeef") && text.contains(BUILD_ID),
            "{text}"
        );
    }

    #[test]
    fn files_that_are_not_executors_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let plain = write(tmp.path(), "plain", b"\x7fELF nothing here", 0o755);
        assert_eq!(check(&plain).unwrap_err(), Refusal::NoBuildId);
        let body = BUILD_MARKER;
        let writable = write(tmp.path(), "w", body.as_bytes(), 0o775);
        assert_eq!(
            check(&writable).unwrap_err(),
            Refusal::Writable { mode: 0o775 }
        );
        let noexec = write(tmp.path(), "n", body.as_bytes(), 0o644);
        assert_eq!(check(&noexec).unwrap_err(), Refusal::NotExecutable);
        let sub = tmp.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert_eq!(check(&sub).unwrap_err(), Refusal::NotAFile);
        assert_eq!(
            check(&tmp.path().join("absent")).unwrap_err(),
            Refusal::Missing
        );
        let good = write(tmp.path(), "good", body.as_bytes(), 0o755);
        std::os::unix::fs::symlink(&good, tmp.path().join("link")).unwrap();
        assert_eq!(check(&tmp.path().join("link")).unwrap_err(), Refusal::Link);
        // A FIFO is refused without blocking the driver.
        let fifo = tmp.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o700),
        )
        .unwrap();
        assert_eq!(check(&fifo).unwrap_err(), Refusal::NotAFile);
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        let p = write(&open, "x", BUILD_MARKER.as_bytes(), 0o755);
        assert!(check(&p).is_ok());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            check(&p).unwrap_err(),
            Refusal::UnsafeDirectory { mode: 0o777, .. }
        ));
    }

    #[test]
    fn build_ids_are_read_up_to_their_nul() {
        let ids = build_ids(b"aadrover-executor-build:1-a\0bbdrover-executor-build:2-b\0");
        assert_eq!(ids, ["1-a", "2-b"]);
        assert!(build_ids(b"drover-executor-build:unterminated").is_empty());
        // The prefix alone, followed by other data (a string table): not an id.
        assert!(build_ids(b"drover-executor-build:\x01\x02{}\0").is_empty());
    }
}
