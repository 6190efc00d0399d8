//! The log relay: a small process of its own that reads a task's stdout and stderr
//! FIFOs and writes them into the task's log series (Drover's answer to Nomad's
//! `logmon`).
//!
//! A Nomad task driver is given the paths of two FIFOs in `StartTask`; its executor
//! opens them for writing and the task's output goes there. Something must read them
//! all the time the task runs, or the task blocks on a full pipe, and that something
//! must not be the agent: the agent may be killed or restarted while the task goes on.
//! So the host:
//!
//! 1. makes the FIFOs with [`make_fifos`] in a private directory of its own;
//! 2. starts a relay with [`spawn_relay`]: its own binary re-executed, which calls
//!    [`run_if_relay`] first thing in `main`. The relay opens both FIFOs for reading
//!    and says so before [`spawn_relay`] returns, so a writer that opens them never
//!    blocks and never gets `SIGPIPE`;
//! 3. hands the FIFO paths to the driver, and keeps the [`RelayProcess`] (pid and
//!    start time) in its state, to [`RelayProcess::stop`] it later, possibly from a
//!    restarted agent.
//!
//! The relay runs in its own session, is nobody's child (it is forked twice, so no
//! caller has to reap it), and writes every read straight to the files with
//! [`RotatingWriter`] (resuming the series: a restarted task appends), so killing the
//! agent at any time loses nothing and nothing waits in the relay's memory beyond one
//! read. It exits 0 when both streams have ended (a writer came and went: end of file)
//! and, on `SIGTERM`, after draining what is readable at that moment.
//!
//! Paths: the FIFO directory is the host's and must be private (owned by this user,
//! not a link, not writable by group or others); the FIFOs are opened relative to its
//! descriptor with `O_NOFOLLOW` and checked to be FIFOs. The log directory is in the
//! task's directory and goes through [`crate::taskdir`] like every log writer's.
//!
//! ```standalone_crate
//! use drover_plugin_sdk::LogConfig;
//! use drover_plugin_sdk::logs::relay::{RelaySpec, make_fifos, run_if_relay, spawn_relay};
//! use std::os::unix::fs::DirBuilderExt as _;
//! use std::time::Duration;
//!
//! fn main() {
//!     // This very program is the relay when started as one.
//!     run_if_relay();
//!
//!     let tmp = tempfile::tempdir().unwrap();
//!     let fifo_dir = tmp.path().join("fifos");
//!     std::fs::DirBuilder::new().mode(0o700).create(&fifo_dir).unwrap();
//!     std::fs::create_dir(tmp.path().join("logs")).unwrap();
//!     let (stdout_fifo, stderr_fifo) = make_fifos(&fifo_dir, "web.0").unwrap();
//!     let spec = RelaySpec {
//!         stdout_fifo: stdout_fifo.clone(),
//!         stdout_base: tmp.path().join("logs/web.stdout"),
//!         stderr_fifo: stderr_fifo.clone(),
//!         stderr_base: tmp.path().join("logs/web.stderr"),
//!         limits: LogConfig::new(3, 1),
//!     };
//!     let relay = spawn_relay(&std::env::current_exe().unwrap(), &[], &spec).unwrap();
//!
//!     // The task writes and exits: the relay has the FIFOs open, so this never blocks.
//!     std::fs::write(&stdout_fifo, "hello\n").unwrap();
//!     std::fs::write(&stderr_fifo, "").unwrap();
//!     // Both streams ended: the relay exits by itself.
//!     assert!(relay.wait_exit(Duration::from_secs(30)).unwrap());
//!     let out = std::fs::read(tmp.path().join("logs/web.stdout.0")).unwrap();
//!     assert_eq!(out, b"hello\n");
//! }
//! ```

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};
use serde::{Deserialize, Serialize};

use super::RotatingWriter;
use crate::LogConfig;
use crate::taskdir::Refused;

/// The environment variable that makes a process a relay: its value is the relay's
/// spec (JSON) and the descriptor on which it reports readiness. [`spawn_relay`] sets it
/// and clears the rest of the environment; [`run_if_relay`] reads it.
///
/// ```
/// assert_eq!(drover_plugin_sdk::logs::relay::ENV_RELAY, "DROVER_LOG_RELAY");
/// ```
pub const ENV_RELAY: &str = "DROVER_LOG_RELAY";

/// Mode of the FIFOs [`make_fifos`] creates: only the host's user (root, normally)
/// opens them; the executor opens them as that user before the task drops privileges.
pub const FIFO_MODE: u32 = 0o600;

/// How long [`spawn_relay`] waits for the relay to say it has opened its FIFOs.
const READY_LIMIT: Duration = Duration::from_secs(20);

/// Bytes taken from a FIFO in one read: the most the relay holds in memory per stream.
const CHUNK: usize = 64 * 1024;

/// On `SIGTERM`, at most this many bytes are drained from each stream (a writer that
/// keeps writing could otherwise keep the relay reading forever).
const DRAIN_LIMIT: usize = 4 * 1024 * 1024;

/// Longest name [`make_fifos`] accepts (a file name must fit in 255 bytes with the
/// `.stdout` suffix; a FIFO path has no length limit like a socket's).
const MAX_NAME: usize = 200;

/// What one relay process does: read these FIFOs, write these log series.
///
/// Every path is absolute and valid UTF-8 (the spec travels to the relay as JSON).
/// The FIFOs' names are `[A-Za-z0-9_.-]` (as [`make_fifos`] makes them); their
/// directory is checked like [`make_fifos`] checks it. A base is where
/// [`RotatingWriter`] writes `<base>.0`, `<base>.1`, …; its directory must exist.
///
/// ```
/// use drover_plugin_sdk::{LogConfig, logs::relay::RelaySpec};
/// let spec = RelaySpec {
///     stdout_fifo: "/var/lib/drover/fifos/web-1.0.stdout".into(),
///     stdout_base: "/var/lib/drover/allocs/a1/alloc/logs/web.stdout".into(),
///     stderr_fifo: "/var/lib/drover/fifos/web-1.0.stderr".into(),
///     stderr_base: "/var/lib/drover/allocs/a1/alloc/logs/web.stderr".into(),
///     limits: LogConfig::new(10, 10),
/// };
/// assert!(spec.validate().is_ok());
/// let relative = RelaySpec { stdout_base: "logs/web.stdout".into(), ..spec };
/// assert!(relative.validate().unwrap_err().to_string().contains("stdout_base"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySpec {
    /// The FIFO the task's stdout is written to.
    pub stdout_fifo: PathBuf,
    /// The log series of stdout (`<base>.<index>` files).
    pub stdout_base: PathBuf,
    /// The FIFO the task's stderr is written to.
    pub stderr_fifo: PathBuf,
    /// The log series of stderr.
    pub stderr_base: PathBuf,
    /// Rotation limits of both series.
    pub limits: LogConfig,
}

impl RelaySpec {
    /// Check the spec as the relay will (see the [type docs](RelaySpec)): an error
    /// names the field and what is wrong with it.
    pub fn validate(&self) -> io::Result<()> {
        for (field, path, fifo) in [
            ("stdout_fifo", &self.stdout_fifo, true),
            ("stdout_base", &self.stdout_base, false),
            ("stderr_fifo", &self.stderr_fifo, true),
            ("stderr_base", &self.stderr_base, false),
        ] {
            let bad =
                |why: &str| invalid(format!("log relay spec: {field} {}: {why}", path.display()));
            if path.to_str().is_none() {
                return Err(bad("not valid UTF-8"));
            }
            if !path.is_absolute() {
                return Err(bad("not an absolute path"));
            }
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                return Err(bad("names no file"));
            };
            if path.parent().is_none() {
                return Err(bad("has no directory"));
            }
            if fifo && let Err(why) = check_name(name) {
                return Err(bad(&why));
            }
        }
        if self.stdout_fifo == self.stderr_fifo || self.stdout_base == self.stderr_base {
            return Err(invalid(format!(
                "log relay spec: stdout and stderr must be different FIFOs and series \
                 (both FIFOs {}, both series {})",
                self.stdout_fifo.display(),
                self.stdout_base.display()
            )));
        }
        Ok(())
    }
}

/// What travels to the relay in [`ENV_RELAY`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    /// The descriptor (inherited) on which the relay reports readiness.
    ready_fd: RawFd,
    spec: RelaySpec,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// `Ok` when `name` is a FIFO name or FIFO name stem: `[A-Za-z0-9_.-]`, not empty,
/// not `.` or `..`, at most 200 bytes.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("{name:?} is not a usable name"));
    }
    if name.len() > MAX_NAME {
        return Err(format!("name is longer than {MAX_NAME} bytes"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "{c:?} is not allowed in a name (only A-Z a-z 0-9 _ . -)"
        ));
    }
    Ok(())
}

/// Open the host's private directory `dir` (for FIFOs): not a link, a directory, owned
/// by this process's user, not writable by group or others.
fn open_private_dir(dir: &Path) -> io::Result<OwnedFd> {
    let fd = match rfs::openat(
        rfs::CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        // O_NOFOLLOW | O_DIRECTORY on a link: ELOOP or ENOTDIR (Linux), so look.
        Err(Errno::LOOP | Errno::NOTDIR)
            if rfs::statat(rfs::CWD, dir, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink) =>
        {
            return Err(Refused::Link {
                path: dir.to_owned(),
                link: dir.to_owned(),
            }
            .into());
        }
        Err(Errno::NOTDIR) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("FIFO directory {} is not a directory", dir.display()),
            ));
        }
        Err(e) => {
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("FIFO directory {}: {e}", dir.display()),
            ));
        }
    };
    let st = rfs::fstat(&fd)?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "FIFO directory {} is owned by uid {}, not by this process's uid {me}",
                dir.display(),
                st.st_uid
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "FIFO directory {} has mode {:o}: group or others can write it (make it 0700)",
                dir.display(),
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

/// Create the two FIFOs (mode 0600) in `fifo_dir` named after `name`:
/// `<fifo_dir>/<name>.stdout` and `<fifo_dir>/<name>.stderr`, replacing stale ones
/// (whatever non-directory has the name), and return their paths.
///
/// `fifo_dir` is a private directory of the host, which this checks: not a symbolic
/// link, owned by this process's user, not writable by group or others. `name` is a
/// task id plus a start counter (`web-1.3`): `[A-Za-z0-9_.-]`, at most 200 bytes.
/// A relay still reading a replaced FIFO keeps the old one (it is unlinked, not
/// reused): stop it first, or use a new counter.
///
/// ```
/// use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};
/// let tmp = tempfile::tempdir().unwrap();
/// let dir = tmp.path().join("fifos");
/// std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
/// let (out, err) = drover_plugin_sdk::logs::relay::make_fifos(&dir, "web-1.0").unwrap();
/// assert_eq!(out, dir.join("web-1.0.stdout"));
/// assert_eq!(err, dir.join("web-1.0.stderr"));
/// let meta = std::fs::symlink_metadata(&out).unwrap();
/// assert!(meta.file_type().is_fifo());
/// assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
/// assert!(drover_plugin_sdk::logs::relay::make_fifos(&dir, "../web").is_err());
/// ```
pub fn make_fifos(fifo_dir: &Path, name: &str) -> io::Result<(PathBuf, PathBuf)> {
    check_name(name).map_err(|why| invalid(format!("FIFO name {name:?}: {why}")))?;
    let dir = open_private_dir(fifo_dir)?;
    let mut paths = Vec::with_capacity(2);
    for stream in ["stdout", "stderr"] {
        let file = format!("{name}.{stream}");
        let path = fifo_dir.join(&file);
        let err = |what: &str, e: Errno| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("cannot {what} FIFO {}: {e}", path.display()),
            )
        };
        match rfs::unlinkat(&dir, file.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(err("remove the stale", e)),
        }
        rfs::mkfifoat(&dir, file.as_str(), Mode::from_raw_mode(FIFO_MODE))
            .map_err(|e| err("create", e))?;
        // Exactly 0600 whatever the umask; the directory is ours alone, so the name
        // still holds the FIFO just made.
        rfs::chmodat(
            &dir,
            file.as_str(),
            Mode::from_raw_mode(FIFO_MODE),
            AtFlags::empty(),
        )
        .map_err(|e| err("set the mode of", e))?;
        paths.push(path);
    }
    let stderr = paths.pop();
    let stdout = paths.pop();
    match (stdout, stderr) {
        (Some(o), Some(e)) => Ok((o, e)),
        _ => Err(io::Error::other("make_fifos: two paths were made")),
    }
}

/// Open the FIFO at `path` for reading without blocking, relative to its (checked)
/// directory, refusing a link; check it is a FIFO.
fn open_fifo(path: &Path) -> io::Result<OwnedFd> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(invalid(format!(
            "FIFO path {} names no file",
            path.display()
        )));
    };
    let dir = open_private_dir(dir)?;
    let fd = match rfs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => {
            return Err(Refused::Link {
                path: path.to_owned(),
                link: path.to_owned(),
            }
            .into());
        }
        Err(e) => {
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("cannot open FIFO {}: {e}", path.display()),
            ));
        }
    };
    let kind = FileType::from_raw_mode(rfs::fstat(&fd)?.st_mode);
    if kind != FileType::Fifo {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a FIFO ({kind:?})", path.display()),
        ));
    }
    Ok(fd)
}

/// A running relay: its pid and its start time in `/proc` (clock ticks since boot),
/// which tells it from a later process that got the same pid. Keep it in the host's
/// state to stop the relay from a restarted host.
///
/// ```
/// use drover_plugin_sdk::logs::relay::RelayProcess;
/// // A process that is not what was recorded is neither running nor signalled.
/// let me = RelayProcess { pid: std::process::id(), start_time: 1 };
/// assert!(!me.is_running());
/// me.stop().unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayProcess {
    /// The relay's pid.
    pub pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`), to tell a reused pid.
    pub start_time: u64,
}

impl RelayProcess {
    /// A pidfd of the relay, proven to be it: opened first, then the pid's start time
    /// read and found equal (so the pid was the relay's while the pidfd was opened).
    /// `None` when the relay has exited (a zombie counts: it has).
    fn prove(&self) -> io::Result<Option<OwnedFd>> {
        if self.start_time == 0 {
            return Err(invalid(format!(
                "log relay {}: no start time recorded, so it cannot be told from a later \
                 process with the same pid",
                self.pid
            )));
        }
        let Some(pid) = i32::try_from(self.pid).ok().and_then(Pid::from_raw) else {
            return Err(invalid(format!("log relay: impossible pid {}", self.pid)));
        };
        let pidfd = match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(Errno::SRCH) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match proc_stat(self.pid) {
            Ok((state, start)) if start == self.start_time && state != 'Z' && state != 'X' => {
                Ok(Some(pidfd))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ask the relay to stop: `SIGTERM`, after which it drains what is readable and
    /// exits. Nothing is sent when the relay has exited already, and never to a later
    /// process that got its pid (the start time is checked through a pidfd). A record
    /// read back from storage may name any pid with its start time (which anyone can
    /// read): check [`RelayProcess::is_relay`] first.
    pub fn stop(&self) -> io::Result<()> {
        let Some(pidfd) = self.prove()? else {
            return Ok(());
        };
        match rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::TERM) {
            Ok(()) | Err(Errno::SRCH) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the process with this pid is a log relay: its environment is the one
    /// [`spawn_relay`] gives a relay (nothing but [`ENV_RELAY`]).
    pub fn is_relay(&self) -> bool {
        std::fs::read(format!("/proc/{}/environ", self.pid))
            .is_ok_and(|env| env.starts_with(format!("{ENV_RELAY}=").as_bytes()))
    }

    /// Whether the process with this pid is the log relay of exactly these FIFOs (its
    /// spec names them): a relay of another task is not this task's.
    pub fn serves(&self, fifos: &[PathBuf]) -> bool {
        let Ok(env) = std::fs::read(format!("/proc/{}/environ", self.pid)) else {
            return false;
        };
        let prefix = format!("{ENV_RELAY}=");
        let Some(value) = env.strip_prefix(prefix.as_bytes()) else {
            return false;
        };
        let value = value.split(|b| *b == 0).next().unwrap_or_default();
        serde_json::from_slice::<Wire>(value).is_ok_and(|w| {
            fifos.contains(&w.spec.stdout_fifo) && fifos.contains(&w.spec.stderr_fifo)
        })
    }

    /// Whether the relay (this pid with this start time) is still running.
    pub fn is_running(&self) -> bool {
        matches!(self.prove(), Ok(Some(_)))
    }

    /// Wait up to `limit` for the relay to exit: `true` once it has (or had already),
    /// `false` when it still runs after `limit`.
    pub fn wait_exit(&self, limit: Duration) -> io::Result<bool> {
        let Some(pidfd) = self.prove()? else {
            return Ok(true);
        };
        poll_one(pidfd.as_fd(), limit)
    }
}

/// Poll `fd` for input until `limit`: whether it became readable.
fn poll_one(fd: BorrowedFd<'_>, limit: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) if left.is_zero() => return Ok(false),
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// State letter and start time (field 22) of process `pid`, from `/proc/<pid>/stat`.
/// Fields are counted from the last `)`, so a command name with spaces or parentheses
/// does not shift them.
fn proc_stat(pid: u32) -> io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat has no state and start time"),
        )
    })
}

fn parse_stat(text: &str) -> Option<(char, u64)> {
    let (_, after) = text.rsplit_once(')')?;
    let mut fields = after.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 was the state; the 19th field after it is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Start the relay for `spec` as a process that outlives the caller, and return once
/// it has opened both FIFOs for reading (an error, with the relay's reason, when it
/// could not).
///
/// `program` with `args` must run a binary whose `main` calls [`run_if_relay`] first
/// thing (the host's own binary: `std::env::current_exe()`). The relay is forked
/// twice (no caller has to reap it, and it is in nobody's process group), runs in its
/// own session, with stdin, stdout and stderr on `/dev/null` and an environment that
/// holds nothing but [`ENV_RELAY`]. (So what goes wrong once it runs, a log write that
/// fails, is not reported anywhere; the bytes concerned are dropped and the relay goes
/// on reading, so that the task never blocks on a full pipe.)
///
/// This blocks until the relay has answered (at most 20 seconds): in async code, call
/// it from `spawn_blocking`.
///
/// See the [module docs](self) for a complete example.
pub fn spawn_relay(
    program: &Path,
    args: &[OsString],
    spec: &RelaySpec,
) -> io::Result<RelayProcess> {
    spec.validate()?;
    let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let wire = serde_json::to_string(&Wire {
        ready_fd: ready_write.as_raw_fd(),
        spec: spec.clone(),
    })
    .map_err(|e| invalid(format!("log relay spec: {e}")))?;
    let ready_fd = ready_write.as_raw_fd();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env(ENV_RELAY, wire)
        // Holding no directory (a mount) busy for as long as the task runs.
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only async-signal-safe calls are made (fcntl,
    // setsid, fork, _exit), and nothing is allocated.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            // The readiness pipe's write end survives exec (and only in this child).
            if libc::fcntl(ready_fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            // Fork again and let the middle process exit: the relay is orphaned at
            // once (adopted by init or the nearest subreaper), so the caller never has
            // a zombie to reap, and, not a session leader, it never gets a terminal.
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
    let mut middle = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot start the log relay {}: {e}", program.display()),
        )
    })?;
    drop(ready_write);
    middle.wait()?;
    read_verdict(ready_read, program)
}

/// Read what the relay says on the readiness pipe: `pid <pid> <start>`, then `ok` or
/// `err <reason>`.
fn read_verdict(ready: OwnedFd, program: &Path) -> io::Result<RelayProcess> {
    let deadline = Instant::now() + READY_LIMIT;
    let mut said = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !poll_one(ready.as_fd(), left)? {
            let relay = parse_verdict(&said).0;
            if let Some(relay) = relay {
                // Stuck: it will not be asked for again, so do not leave it behind.
                let _ = relay.stop();
            }
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the log relay ({}) did not open its FIFOs within {READY_LIMIT:?}",
                    program.display()
                ),
            ));
        }
        match rustix::io::read(&ready, &mut buf) {
            Ok(0) => break,
            Ok(n) if said.len() < 16 * 1024 => {
                said.extend_from_slice(&buf[..n]);
                // Done once it has said: a process forked meanwhile by another
                // thread may hold a copy of the write end until it execs.
                if said.ends_with(b"\n") && has_verdict(&said) {
                    break;
                }
            }
            Ok(_) => break,
            Err(Errno::INTR | Errno::AGAIN) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    match parse_verdict(&said) {
        (Some(relay), Ok(())) => Ok(relay),
        (_, Err(why)) => Err(io::Error::other(format!("log relay: {why}"))),
        (None, Ok(())) => Err(io::Error::other(format!(
            "the log relay ({}) exited without saying it had opened its FIFOs; does its \
             main call drover_plugin_sdk::logs::relay::run_if_relay() first thing?",
            program.display()
        ))),
    }
}

/// Whether `said` holds `ok` or `err …` (the relay's last word).
fn has_verdict(said: &[u8]) -> bool {
    said.split(|&b| b == b'\n')
        .any(|line| line == b"ok" || line.starts_with(b"err "))
}

/// The relay named in `said`, and whether it said it is ready (`Err` with its reason,
/// or with what was missing).
fn parse_verdict(said: &[u8]) -> (Option<RelayProcess>, Result<(), String>) {
    let text = String::from_utf8_lossy(said);
    let mut relay = None;
    let mut verdict = Err(String::new());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("pid ") {
            let mut f = rest.split(' ');
            if let (Some(Ok(pid)), Some(Ok(start_time))) =
                (f.next().map(str::parse), f.next().map(str::parse))
            {
                relay = Some(RelayProcess { pid, start_time });
            }
        } else if line == "ok" {
            verdict = Ok(());
        } else if let Some(why) = line.strip_prefix("err ") {
            verdict = Err(why.to_owned());
        }
    }
    if verdict.as_ref().is_err_and(String::is_empty) {
        if relay.is_some() {
            verdict = Err("it exited before saying it had opened its FIFOs".into());
        } else {
            verdict = Ok(()); // nothing said at all: the caller words it
        }
    }
    (relay, verdict)
}

/// If this process was started as a relay (by [`spawn_relay`]), run it and exit;
/// otherwise return at once. Call it first thing in `main`, before any runtime,
/// thread or logging is set up: a relay runs once per task and stays small.
///
/// ```no_run
/// fn main() {
///     drover_plugin_sdk::logs::relay::run_if_relay();
///     the_programs_real_work();
/// }
/// # fn the_programs_real_work() {}
/// ```
pub fn run_if_relay() {
    if let Some(value) = std::env::var_os(ENV_RELAY) {
        std::process::exit(relay_main(value.as_bytes()));
    }
}

/// The relay process: 0 when both streams ended or after `SIGTERM`, 1 when it could
/// not start, 2 when its spec is unreadable.
fn relay_main(value: &[u8]) -> i32 {
    let wire: Wire = match serde_json::from_slice(value) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("log relay: {ENV_RELAY} is not a relay spec: {e}");
            return 2;
        }
    };
    // The descriptor number came from outside: it must be an open pipe other than
    // stdio before it is owned here.
    if wire.ready_fd < 3 || !is_pipe(wire.ready_fd) {
        eprintln!(
            "log relay: readiness descriptor {} is not an inherited pipe",
            wire.ready_fd
        );
        return 2;
    }
    // SAFETY: checked just above to be open; nothing else in this process owns it.
    #[allow(unsafe_code)]
    let ready = unsafe { OwnedFd::from_raw_fd(wire.ready_fd) };
    let _ = rustix::io::fcntl_setfd(&ready, rustix::io::FdFlags::CLOEXEC);
    let me = std::process::id();
    let start = proc_stat(me).map_or(0, |(_, t)| t);
    if tell(&ready, &format!("pid {me} {start}\n")).is_err() {
        return 1; // nobody waits for this relay: do not run unowned
    }
    let mut relay = match Relay::open(&wire.spec) {
        Ok(r) => r,
        Err(e) => {
            let why = e.to_string().replace('\n', " ");
            let _ = tell(&ready, &format!("err {why}\n"));
            return 1;
        }
    };
    if tell(&ready, "ok\n").is_err() {
        return 1;
    }
    drop(ready);
    relay.run()
}

fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: only borrowed for the fstat; a closed number gives EBADF.
    #[allow(unsafe_code)]
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    rfs::fstat(fd).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Fifo)
}

fn tell(fd: &OwnedFd, what: &str) -> io::Result<()> {
    let mut f = std::fs::File::from(fd.try_clone()?);
    f.write_all(what.as_bytes())
}

/// The write end of the self-pipe the `SIGTERM` handler writes to (-1: none).
static TERM_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_term(_: std::ffi::c_int) {
    let fd = TERM_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the pipe lives as long as the relay (it is never closed); write(2)
        // is async-signal-safe. A full pipe already says the same.
        #[allow(unsafe_code)]
        let pipe = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::write(pipe, &[1]);
    }
}

/// One stream: its FIFO (until it ends) and its writer.
struct Stream {
    name: &'static str,
    fifo: Option<OwnedFd>,
    base: PathBuf,
    limits: LogConfig,
    writer: Option<RotatingWriter>,
}

/// What one read from a stream gave.
enum Got {
    Data,
    Empty,
    End,
}

impl Stream {
    fn open(name: &'static str, fifo: &Path, base: &Path, limits: LogConfig) -> io::Result<Stream> {
        let fd = open_fifo(fifo)?;
        let writer = RotatingWriter::open(base, limits)
            .map_err(|e| io::Error::new(e.kind(), format!("log series {}: {e}", base.display())))?;
        Ok(Stream {
            name,
            fifo: Some(fd),
            base: base.to_owned(),
            limits,
            writer: Some(writer),
        })
    }

    /// One read from the FIFO, written out at once.
    fn pump(&mut self, buf: &mut [u8]) -> Got {
        let Some(fd) = &self.fifo else {
            return Got::End;
        };
        match rustix::io::read(fd, &mut *buf) {
            Ok(0) => {
                self.fifo = None;
                Got::End
            }
            Ok(n) => {
                self.deliver(&buf[..n]);
                Got::Data
            }
            Err(Errno::AGAIN | Errno::INTR) => Got::Empty,
            Err(e) => {
                eprintln!("log relay: reading {}: {e}; the stream ends", self.name);
                self.fifo = None;
                Got::End
            }
        }
    }

    /// Write `chunk` to the series; on an error, open the series again (a rotation
    /// that failed, a directory replaced) and try once more, then drop the rest.
    fn deliver(&mut self, mut chunk: &[u8]) {
        let mut retried = false;
        while !chunk.is_empty() {
            if self.writer.is_none() {
                match RotatingWriter::open(&self.base, self.limits) {
                    Ok(w) => self.writer = Some(w),
                    Err(e) => {
                        eprintln!(
                            "log relay: {}: {e}; {} bytes of {} lost",
                            self.base.display(),
                            chunk.len(),
                            self.name
                        );
                        return;
                    }
                }
            }
            let Some(w) = self.writer.as_mut() else {
                return;
            };
            match w.write(chunk) {
                Ok(0) => {}
                Ok(n) => {
                    chunk = &chunk[n..];
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => eprintln!("log relay: writing {}: {e}", self.base.display()),
            }
            self.writer = None;
            if retried {
                eprintln!("log relay: {} bytes of {} lost", chunk.len(), self.name);
                return;
            }
            retried = true;
        }
    }

    /// Read what is readable now (at most [`DRAIN_LIMIT`]).
    fn drain(&mut self, buf: &mut [u8]) {
        let mut taken = 0;
        while taken < DRAIN_LIMIT {
            match self.pump(buf) {
                Got::Data => taken += buf.len(),
                Got::Empty | Got::End => return,
            }
        }
    }
}

struct Relay {
    streams: [Stream; 2],
    term: OwnedFd,
    // Kept open for the handler (see TERM_PIPE).
    _term_write: OwnedFd,
}

impl Relay {
    /// Install the `SIGTERM` handler, open both FIFOs and both series.
    fn open(spec: &RelaySpec) -> io::Result<Relay> {
        spec.validate()?;
        let (term, term_write) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )?;
        TERM_PIPE.store(term_write.as_raw_fd(), Ordering::Relaxed);
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(on_term),
            nix::sys::signal::SaFlags::SA_RESTART,
            nix::sys::signal::SigSet::empty(),
        );
        // The signal mask survives exec: the host may have blocked SIGTERM in the
        // thread that started this process.
        nix::sys::signal::SigSet::from(nix::sys::signal::Signal::SIGTERM)
            .thread_unblock()
            .map_err(io::Error::from)?;
        // SAFETY: the handler only loads an atomic and calls write(2).
        #[allow(unsafe_code)]
        let installed =
            unsafe { nix::sys::signal::sigaction(nix::sys::signal::Signal::SIGTERM, &action) };
        installed.map_err(io::Error::from)?;
        let stdout = Stream::open("stdout", &spec.stdout_fifo, &spec.stdout_base, spec.limits)?;
        let stderr = Stream::open("stderr", &spec.stderr_fifo, &spec.stderr_base, spec.limits)?;
        Ok(Relay {
            streams: [stdout, stderr],
            term,
            _term_write: term_write,
        })
    }

    /// Relay until both streams end (0) or `SIGTERM` (drain, then 0).
    fn run(&mut self) -> i32 {
        let mut buf = vec![0u8; CHUNK];
        loop {
            if self.streams.iter().all(|s| s.fifo.is_none()) {
                return 0;
            }
            let (ready, term) = {
                let mut fds = Vec::with_capacity(3);
                let mut which = Vec::with_capacity(2);
                for (i, s) in self.streams.iter().enumerate() {
                    if let Some(fd) = &s.fifo {
                        fds.push(PollFd::new(fd, PollFlags::IN));
                        which.push(i);
                    }
                }
                fds.push(PollFd::new(&self.term, PollFlags::IN));
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(Errno::INTR) => continue,
                    Err(e) => {
                        eprintln!("log relay: poll: {e}");
                        return 1;
                    }
                }
                let term = !fds[fds.len() - 1].revents().is_empty();
                let ready: Vec<usize> = which
                    .iter()
                    .zip(&fds)
                    .filter(|(_, fd)| !fd.revents().is_empty())
                    .map(|(i, _)| *i)
                    .collect();
                (ready, term)
            };
            for i in ready {
                self.streams[i].pump(&mut buf);
            }
            if term {
                for s in &mut self.streams {
                    s.drain(&mut buf);
                }
                return 0;
            }
        }
    }
}

#[cfg(test)]
mod tests;
