//! Files beneath a task directory, opened without following a link the task planted.
//!
//! A task directory is hostile territory. The task (a container whose bind mount
//! reaches into it, a process in `local/`) can replace any name it can write with a
//! symbolic link to `/etc/shadow`, a hard link to another file, a FIFO that blocks
//! whoever opens it, or a device node. The agent, plugins and executors run as root: a
//! path they join and open (`task_dir.join("logs/stdout.0")`) follows such a link and
//! reads or writes whatever it points at, as root.
//!
//! A [`Dir`] is an open directory. Every path given to its methods is relative to it and
//! resolved by the kernel beneath it:
//!
//! - with `openat2(2)` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS` (Linux 5.6+), or, where `openat2` is missing (`ENOSYS`), one
//!   component at a time from the directory's descriptor with `O_NOFOLLOW`;
//! - a symbolic link in **any** component, the last one included, is refused, never
//!   followed; so are absolute paths and `..`;
//! - a file is first opened with `O_PATH` (which has no side effects), checked, and only
//!   then re-opened for reading or writing through `/proc/self/fd`, so a FIFO or device
//!   node is refused before it is ever really opened;
//! - [`OpenOptions::single_link`] also refuses a file with more than one hard link (a
//!   log file is always created by its writer and never has a second name).
//!
//! A refusal is an [`io::Error`] of kind [`io::ErrorKind::PermissionDenied`] carrying a
//! [`Refused`] that names the path and what was wrong; [`refusal`] gets it back.
//!
//! The directory a [`Dir`] is opened from ([`Dir::open`]) is trusted as a path except for
//! its last component, which must not be a link: open the task directory itself (or its
//! `logs/`), never something the task chose.
//!
//! ```
//! use drover_plugin_sdk::taskdir::{Dir, OpenOptions, refusal, Refused};
//! use std::io::{Read as _, Write as _};
//!
//! let tmp = tempfile::tempdir().unwrap();
//! let task = Dir::open(tmp.path()).unwrap();
//! let logs = task.create_dir("logs", 0o700).unwrap();
//! let mut out = logs
//!     .open_file("stdout.0", &OpenOptions::new().append(true).create(0o600).single_link(true))
//!     .unwrap();
//! out.write_all(b"hello\n").unwrap();
//!
//! // The task replaces its log with a link to a host file: it is refused, not followed.
//! std::fs::write(tmp.path().join("secret"), "root only").unwrap();
//! std::fs::remove_file(tmp.path().join("logs/stdout.0")).unwrap();
//! std::os::unix::fs::symlink(tmp.path().join("secret"), tmp.path().join("logs/stdout.0")).unwrap();
//! let err = logs.open_file("stdout.0", &OpenOptions::new().read(true)).unwrap_err();
//! assert!(matches!(refusal(&err), Some(Refused::Link { .. })), "{err}");
//! // A link on the way is refused the same.
//! assert!(task.open_file("logs/stdout.0", &OpenOptions::new().read(true)).is_err());
//! ```

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Set once `openat2` answered `ENOSYS`: every later resolution walks instead.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
thread_local! {
    /// Tests run each case through both resolvers, on their own thread.
    static FORCE_WALK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether to walk instead of calling `openat2`.
fn walk_only() -> bool {
    #[cfg(test)]
    if FORCE_WALK.with(std::cell::Cell::get) {
        return true;
    }
    NO_OPENAT2.load(Ordering::Relaxed)
}

/// What `openat2` is asked for: stay beneath the directory, follow no link of any kind.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Why a path beneath a [`Dir`] was refused. It is the inner error of an [`io::Error`]
/// of kind [`io::ErrorKind::PermissionDenied`]; see [`refusal`].
///
/// ```
/// use drover_plugin_sdk::taskdir::{Dir, OpenOptions, refusal, Refused};
/// let tmp = tempfile::tempdir().unwrap();
/// let err = Dir::open(tmp.path()).unwrap()
///     .open_file("../etc/passwd", &OpenOptions::new().read(true)).unwrap_err();
/// assert!(matches!(refusal(&err), Some(Refused::Escape { .. })));
/// assert!(err.to_string().contains("../etc/passwd"), "{err}");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// A component of the path is a symbolic link.
    #[error("{}: {} is a symbolic link, and links in a task directory are not followed", path.display(), link.display())]
    Link {
        /// The whole path asked for.
        path: PathBuf,
        /// The component that is a link (the whole path when the kernel did not say
        /// which one).
        link: PathBuf,
    },
    /// The path is absolute, empty where a name is needed, or has a `..` component.
    #[error("{}: not a relative path beneath {} (no `..`, not absolute)", path.display(), dir.display())]
    Escape {
        /// The directory it had to stay beneath.
        dir: PathBuf,
        /// The path asked for.
        path: PathBuf,
    },
    /// The file is not a regular file (a FIFO, device node, socket or directory).
    #[error("{} is {kind}, not a regular file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: FileKind,
    },
    /// The file has more than one hard link and [`OpenOptions::single_link`] was asked.
    #[error("{} has {links} hard links; a file that may have another name elsewhere is not opened", path.display())]
    HardLinked {
        /// The path.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// A directory was asked for and the path is something else.
    #[error("{} is {kind}, not a directory", path.display())]
    NotDir {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: FileKind,
    },
}

impl From<Refused> for io::Error {
    fn from(r: Refused) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, r)
    }
}

/// The [`Refused`] inside `err`, if `err` is a refusal by this module.
///
/// ```
/// let err = std::io::Error::from(std::io::ErrorKind::NotFound);
/// assert!(drover_plugin_sdk::taskdir::refusal(&err).is_none());
/// ```
pub fn refusal(err: &io::Error) -> Option<&Refused> {
    err.get_ref()?.downcast_ref::<Refused>()
}

/// What kind of file a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
    /// Something else.
    Unknown,
}

impl FileKind {
    fn of(mode: u32) -> FileKind {
        match FileType::from_raw_mode(mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            FileType::Fifo => FileKind::Fifo,
            FileType::Socket => FileKind::Socket,
            FileType::CharacterDevice => FileKind::CharDevice,
            FileType::BlockDevice => FileKind::BlockDevice,
            _ => FileKind::Unknown,
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::File => "a regular file",
            FileKind::Dir => "a directory",
            FileKind::Symlink => "a symbolic link",
            FileKind::Fifo => "a named pipe",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Unknown => "an unknown kind of file",
        })
    }
}

/// What [`Dir::metadata`] tells about an entry (never about a link's target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metadata {
    /// The kind of file.
    pub kind: FileKind,
    /// Size in bytes.
    pub len: u64,
    /// Hard link count.
    pub links: u64,
    /// Permission bits (`0o7777` of `st_mode`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last modification (`st_mtime`), where the clock allows it.
    pub modified: Option<std::time::SystemTime>,
}

impl Metadata {
    fn of(st: &rfs::Stat) -> Metadata {
        Metadata {
            kind: FileKind::of(st.st_mode),
            len: u64::try_from(st.st_size).unwrap_or(0),
            links: st.st_nlink,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            modified: modified(st),
        }
    }
}

/// `st_mtime` as a time, if it fits one.
fn modified(st: &rfs::Stat) -> Option<std::time::SystemTime> {
    let nanos = u32::try_from(st.st_mtime_nsec).ok()?;
    let epoch = std::time::UNIX_EPOCH;
    match u64::try_from(st.st_mtime) {
        Ok(secs) => epoch.checked_add(std::time::Duration::new(secs, nanos)),
        Err(_) => epoch
            .checked_sub(std::time::Duration::from_secs(st.st_mtime.unsigned_abs()))?
            .checked_add(std::time::Duration::from_nanos(u64::from(nanos))),
    }
}

/// How [`Dir::open_file`] opens a file: like [`std::fs::OpenOptions`], plus
/// [`OpenOptions::single_link`]. Only regular files are ever opened.
///
/// ```
/// use drover_plugin_sdk::taskdir::OpenOptions;
/// // A log file: appended to, created 0600 if missing, refused if hard-linked.
/// let log = OpenOptions::new().append(true).create(0o600).single_link(true);
/// # let _ = log;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: Option<u32>,
    create_new: bool,
    single_link: bool,
}

impl OpenOptions {
    /// Nothing set: set at least one of read, write or append.
    pub fn new() -> Self {
        Self::default()
    }

    /// Open for reading.
    pub fn read(mut self, yes: bool) -> Self {
        self.read = yes;
        self
    }

    /// Open for writing.
    pub fn write(mut self, yes: bool) -> Self {
        self.write = yes;
        self
    }

    /// Open for appending (implies writing).
    pub fn append(mut self, yes: bool) -> Self {
        self.append = yes;
        self
    }

    /// Cut an existing file to length 0.
    pub fn truncate(mut self, yes: bool) -> Self {
        self.truncate = yes;
        self
    }

    /// Create the file with permission bits `mode` (exactly: the umask does not apply)
    /// when it does not exist. It is created with `O_EXCL`, so creation never follows
    /// a link either.
    pub fn create(mut self, mode: u32) -> Self {
        self.create = Some(mode);
        self
    }

    /// Create the file with permission bits `mode`, and fail with
    /// [`io::ErrorKind::AlreadyExists`] if anything is there already: the file opened
    /// is always the one this call made, never one someone else put at that name.
    ///
    /// ```
    /// use drover_plugin_sdk::taskdir::{Dir, OpenOptions};
    /// let tmp = tempfile::tempdir().unwrap();
    /// let task = Dir::open(tmp.path()).unwrap();
    /// let fresh = OpenOptions::new().write(true).create_new(0o600);
    /// task.open_file("token.new", &fresh).unwrap();
    /// let again = task.open_file("token.new", &fresh).unwrap_err();
    /// assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
    /// // A link there, dangling or not, is something there too: never followed.
    /// std::os::unix::fs::symlink("/nonexistent", tmp.path().join("dangling")).unwrap();
    /// std::os::unix::fs::symlink("/etc/passwd", tmp.path().join("passwd")).unwrap();
    /// for name in ["dangling", "passwd"] {
    ///     let e = task.open_file(name, &fresh).unwrap_err();
    ///     assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{name}: {e}");
    /// }
    /// assert!(!std::path::Path::new("/nonexistent").exists());
    /// ```
    pub fn create_new(mut self, mode: u32) -> Self {
        self.create = Some(mode);
        self.create_new = true;
        self
    }

    /// Refuse a file with more than one hard link. A file its writer created has one;
    /// a second name means someone linked it in from elsewhere (or out to elsewhere).
    pub fn single_link(mut self, yes: bool) -> Self {
        self.single_link = yes;
        self
    }

    fn access(&self) -> OFlags {
        let write = self.write || self.append;
        let mut f = match (self.read, write) {
            (true, true) => OFlags::RDWR,
            (false, true) => OFlags::WRONLY,
            _ => OFlags::RDONLY,
        };
        if self.append {
            f |= OFlags::APPEND;
        }
        f | OFlags::CLOEXEC | OFlags::NOCTTY
    }
}

/// An open directory; every path given to its methods is resolved beneath it without
/// following links (see the [module docs](self)).
///
/// ```
/// use drover_plugin_sdk::taskdir::Dir;
/// let tmp = tempfile::tempdir().unwrap();
/// let task = Dir::open(tmp.path()).unwrap();
/// let tmpdir = task.create_dir("tmp", 0o700).unwrap();
/// assert_eq!(tmpdir.path(), tmp.path().join("tmp"));
/// assert_eq!(task.metadata("tmp").unwrap().mode, 0o700);
/// ```
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// For messages, and for [`Dir::resolve`]'s answer.
    path: PathBuf,
}

/// The directory holding a path's last component: the one asked, or one beneath it.
enum Parent<'d> {
    This(&'d Dir),
    Beneath(Dir),
}

impl std::ops::Deref for Parent<'_> {
    type Target = Dir;
    fn deref(&self) -> &Dir {
        match self {
            Parent::This(d) => d,
            Parent::Beneath(d) => d,
        }
    }
}

impl Dir {
    /// Open the directory at `path`. The path up to its parent is trusted (it is the
    /// caller's, e.g. the agent's alloc dir); its last component must be a directory,
    /// not a link to one.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Dir> {
        let path = path.as_ref();
        let fd = rfs::openat(
            rfs::CWD,
            path,
            O_PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Dir::from_path_fd(fd, path.to_owned())
    }

    /// The directory an `O_PATH | O_NOFOLLOW` descriptor refers to, opened for reading
    /// (`.` beneath it: the very inode that was checked).
    fn from_path_fd(fd: OwnedFd, path: PathBuf) -> io::Result<Dir> {
        match FileKind::of(rfs::fstat(&fd)?.st_mode) {
            FileKind::Dir => {}
            FileKind::Symlink => {
                return Err(Refused::Link {
                    link: path.clone(),
                    path,
                }
                .into());
            }
            kind => return Err(Refused::NotDir { path, kind }.into()),
        }
        let fd = rfs::openat(&fd, c".", O_DIR, Mode::empty())?;
        Ok(Dir { fd, path })
    }

    /// A second handle on this very directory (a duplicate of its descriptor): for two
    /// owners of one directory opened once. The two share a read position, which no
    /// method depends on ([`Dir::entries`] lists from a descriptor of its own).
    ///
    /// ```
    /// let tmp = tempfile::tempdir().unwrap();
    /// let dir = drover_plugin_sdk::taskdir::Dir::open(tmp.path()).unwrap();
    /// let again = dir.try_clone().unwrap();
    /// drop(dir);
    /// assert_eq!(again.path(), tmp.path());
    /// assert!(again.entries().unwrap().is_empty());
    /// ```
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    /// The path this directory was opened at (for messages; never re-opened).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory `rel` beneath this one.
    pub fn open_dir(&self, rel: impl AsRef<Path>) -> io::Result<Dir> {
        let rel = rel.as_ref();
        let fd = self.resolve_fd(rel, O_PATH, Mode::empty())?;
        Dir::from_path_fd(fd, self.full(rel))
    }

    /// The directory `rel` beneath this one, made (with permission bits `mode`, exactly)
    /// if it does not exist; its parent must exist. An existing directory keeps its
    /// mode; an existing link or other file there is refused.
    ///
    /// ```
    /// let tmp = tempfile::tempdir().unwrap();
    /// let task = drover_plugin_sdk::taskdir::Dir::open(tmp.path()).unwrap();
    /// task.create_dir("logs", 0o700).unwrap();
    /// task.create_dir("logs", 0o755).unwrap(); // exists: opened as it is
    /// assert_eq!(task.metadata("logs").unwrap().mode, 0o700);
    /// ```
    pub fn create_dir(&self, rel: impl AsRef<Path>, mode: u32) -> io::Result<Dir> {
        let rel = rel.as_ref();
        let (parent, name) = self.parent_of(rel)?;
        match rfs::mkdirat(&parent.fd, name, Mode::from_raw_mode(mode & 0o7777)) {
            Ok(()) => {
                let dir = parent.open_dir(name)?;
                dir.set_mode(mode)?;
                Ok(Dir {
                    fd: dir.fd,
                    path: self.full(rel),
                })
            }
            Err(Errno::EXIST) => self.open_dir(rel),
            Err(e) => Err(e.into()),
        }
    }

    /// The directory `name` (one plain name) made in this one now, with permission bits
    /// `mode` exactly; an error of kind `AlreadyExists` if anything is there. Cheaper
    /// than [`Dir::create_dir`] (a new directory cannot be a link, so it is opened
    /// directly), for a directory that is new, such as everything in a new task
    /// directory.
    ///
    /// ```
    /// let tmp = tempfile::tempdir().unwrap();
    /// let task = drover_plugin_sdk::taskdir::Dir::open(tmp.path()).unwrap();
    /// task.create_new_dir("local", 0o755).unwrap();
    /// assert_eq!(task.metadata("local").unwrap().mode, 0o755);
    /// let again = task.create_new_dir("local", 0o700).unwrap_err();
    /// assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
    /// ```
    pub fn create_new_dir(&self, name: impl AsRef<Path>, mode: u32) -> io::Result<Dir> {
        let rel = name.as_ref();
        let names = self.components(rel)?;
        let [name] = names.as_slice() else {
            return Err(self.escape(rel));
        };
        rfs::mkdirat(&self.fd, *name, Mode::from_raw_mode(mode & 0o7777))?;
        // O_NOFOLLOW: should the new name have been swapped for a link meanwhile (only
        // whoever may write this directory could), it is refused, not followed.
        let fd = rfs::openat(&self.fd, *name, O_DIR | OFlags::NOFOLLOW, Mode::empty())?;
        let dir = Dir {
            fd,
            path: self.full(rel),
        };
        // The umask may have taken bits away.
        dir.set_mode(mode)?;
        Ok(dir)
    }

    /// Like [`Dir::create_dir`], making every missing directory on the way with `mode`.
    pub fn create_dir_all(&self, rel: impl AsRef<Path>, mode: u32) -> io::Result<Dir> {
        let rel = rel.as_ref();
        let names = self.components(rel)?;
        let mut so_far = PathBuf::new();
        let mut dir = self.open_dir("")?;
        for name in names {
            so_far.push(name);
            dir = match self.open_dir(&so_far) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => self.create_dir(&so_far, mode)?,
                Err(e) => return Err(e),
            };
        }
        Ok(dir)
    }

    /// Open the regular file `rel` as `opts` say. A link in any component, a file that
    /// is not regular, and (with [`OpenOptions::single_link`]) a hard-linked file are
    /// refused before the file is opened for reading or writing.
    pub fn open_file(&self, rel: impl AsRef<Path>, opts: &OpenOptions) -> io::Result<File> {
        let rel = rel.as_ref();
        if self.components(rel)?.is_empty() {
            return Err(self.escape(rel));
        }
        // An existing file is checked first; a missing one is created with O_EXCL,
        // which cannot follow a link. Someone creating it in between: look again.
        if opts.create_new {
            // Straight to O_EXCL: whatever is at the name (a link too, dangling or not)
            // is EEXIST, and nothing there is ever opened.
            let mode = opts.create.map_or(0o600, |m| m & 0o7777);
            let flags = opts.access() | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
            let fd = self.resolve_fd(rel, flags, Mode::from_raw_mode(mode))?;
            rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            return Ok(File::from(fd));
        }
        for _ in 0..8 {
            match self.resolve_fd(rel, O_PATH, Mode::empty()) {
                Ok(fd) => return self.reopen(rel, &fd, opts),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let Some(mode) = opts.create.map(|m| m & 0o7777) else {
                        return Err(e);
                    };
                    let flags = opts.access() | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
                    match self.resolve_fd(rel, flags, Mode::from_raw_mode(mode)) {
                        Ok(fd) => {
                            // Exactly `mode`, whatever the umask.
                            rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
                            return Ok(File::from(fd));
                        }
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!(
            "{}: created and removed by someone else while being opened, again and again",
            self.full(rel).display()
        )))
    }

    /// What `rel` is. A link as the last component is described as a link
    /// ([`FileKind::Symlink`]), not followed; a link on the way is refused.
    ///
    /// ```
    /// use drover_plugin_sdk::taskdir::{Dir, FileKind};
    /// let tmp = tempfile::tempdir().unwrap();
    /// std::os::unix::fs::symlink("/etc", tmp.path().join("l")).unwrap();
    /// let task = Dir::open(tmp.path()).unwrap();
    /// assert_eq!(task.metadata("l").unwrap().kind, FileKind::Symlink);
    /// assert!(task.metadata("l/passwd").is_err());
    /// ```
    pub fn metadata(&self, rel: impl AsRef<Path>) -> io::Result<Metadata> {
        let fd = self.resolve_any(rel.as_ref(), O_PATH, Mode::empty())?;
        Ok(Metadata::of(&rfs::fstat(&fd)?))
    }

    /// Check that `rel` exists and that no component of it is a link, and return the
    /// path to give a program outside this process (Docker's bind source): this
    /// directory's path joined with `rel` cleaned of `.` components, with what it is.
    ///
    /// The answer is only as good as the moment: use it when nothing the task runs can
    /// change the directory until the path is used (e.g. before the container starts).
    ///
    /// ```
    /// let tmp = tempfile::tempdir().unwrap();
    /// let task = drover_plugin_sdk::taskdir::Dir::open(tmp.path()).unwrap();
    /// task.create_dir("local", 0o755).unwrap();
    /// std::os::unix::fs::symlink("/etc", tmp.path().join("local/etc")).unwrap();
    /// assert_eq!(task.resolve("./local").unwrap().0, tmp.path().join("local"));
    /// assert!(task.resolve("local/etc").is_err());
    /// ```
    pub fn resolve(&self, rel: impl AsRef<Path>) -> io::Result<(PathBuf, Metadata)> {
        let rel = rel.as_ref();
        let names = self.components(rel)?;
        let fd = self.resolve_fd(rel, O_PATH, Mode::empty())?;
        let meta = Metadata::of(&rfs::fstat(&fd)?);
        let mut path = self.path.clone();
        path.extend(names);
        Ok((path, meta))
    }

    /// Remove the file, link, FIFO or other non-directory `rel` (a link itself is
    /// removed, never its target).
    pub fn remove_file(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel.as_ref())?;
        rfs::unlinkat(&parent.fd, name, AtFlags::empty()).map_err(Into::into)
    }

    /// Rename `from` to `to` (both beneath this directory, no link followed on the
    /// way to either): an existing file at `to` is replaced at once, so a reader
    /// sees the old file or the new one, never none. A link at `to` is replaced
    /// itself, never followed; a directory at `to` is not replaced (an error).
    ///
    /// ```
    /// use drover_plugin_sdk::taskdir::{Dir, OpenOptions};
    /// use std::io::Write as _;
    /// let tmp = tempfile::tempdir().unwrap();
    /// let task = Dir::open(tmp.path()).unwrap();
    /// std::fs::write(tmp.path().join("app.env"), "old").unwrap();
    /// let mut f = task
    ///     .open_file(".app.env.new", &OpenOptions::new().write(true).create(0o600))
    ///     .unwrap();
    /// f.write_all(b"new").unwrap();
    /// task.rename(".app.env.new", "app.env").unwrap();
    /// assert_eq!(std::fs::read_to_string(tmp.path().join("app.env")).unwrap(), "new");
    /// ```
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let (from_parent, from_name) = self.parent_of(from.as_ref())?;
        let (to_parent, to_name) = self.parent_of(to.as_ref())?;
        rfs::renameat(&from_parent.fd, from_name, &to_parent.fd, to_name).map_err(Into::into)
    }

    /// The names in this directory (without `.` and `..`), in no particular order.
    pub fn entries(&self) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        for entry in rfs::Dir::new(self.reopen_self()?)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(&name).to_owned());
            }
        }
        Ok(names)
    }

    /// The first `limit` names read from this directory (without `.` and `..`), in no
    /// particular order, and whether there were more: what a listing shows of a
    /// directory a task may have filled with millions of names, in bounded memory.
    ///
    /// ```
    /// let tmp = tempfile::tempdir().unwrap();
    /// for n in 0..5 {
    ///     std::fs::write(tmp.path().join(format!("f{n}")), "").unwrap();
    /// }
    /// let dir = drover_plugin_sdk::taskdir::Dir::open(tmp.path()).unwrap();
    /// let (names, more) = dir.entries_limited(3).unwrap();
    /// assert_eq!((names.len(), more), (3, true));
    /// ```
    pub fn entries_limited(&self, limit: usize) -> io::Result<(Vec<OsString>, bool)> {
        let mut names = Vec::new();
        for entry in rfs::Dir::new(self.reopen_self()?)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            if names.len() == limit {
                return Ok((names, true));
            }
            names.push(OsStr::from_bytes(&name).to_owned());
        }
        Ok((names, false))
    }

    /// A new descriptor of this directory, for reading its entries from the start.
    fn reopen_self(&self) -> io::Result<OwnedFd> {
        rfs::openat(&self.fd, c".", O_DIR, Mode::empty()).map_err(Into::into)
    }

    /// Set this directory's permission bits to `mode`.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        rfs::fchmod(&self.fd, Mode::from_raw_mode(mode & 0o7777)).map_err(Into::into)
    }

    /// Give this directory to `uid`:`gid`.
    pub fn set_owner(&self, uid: u32, gid: u32) -> io::Result<()> {
        rfs::fchown(
            &self.fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(Into::into)
    }

    /// This directory's own metadata.
    pub fn own_metadata(&self) -> io::Result<Metadata> {
        Ok(Metadata::of(&rfs::fstat(&self.fd)?))
    }

    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    fn escape(&self, rel: &Path) -> io::Error {
        Refused::Escape {
            dir: self.path.clone(),
            path: rel.to_owned(),
        }
        .into()
    }

    /// The names of `rel`'s components: only plain names (`.` dropped); anything that
    /// could leave the directory is refused.
    fn components<'a>(&self, rel: &'a Path) -> io::Result<Vec<&'a OsStr>> {
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => names.push(n),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(self.escape(rel));
                }
            }
        }
        Ok(names)
    }

    /// The directory holding `rel`'s last component, and that component. A name
    /// directly in this directory is this directory's own descriptor, opened and
    /// checked already: opening it again would cost five system calls on every
    /// `create_dir`, `remove_file` and `rename` in a task's directory.
    fn parent_of<'d, 'a>(&'d self, rel: &'a Path) -> io::Result<(Parent<'d>, &'a OsStr)> {
        let names = self.components(rel)?;
        let Some((name, dirs)) = names.split_last() else {
            return Err(self.escape(rel));
        };
        if dirs.is_empty() {
            return Ok((Parent::This(self), name));
        }
        let parent: PathBuf = dirs.iter().collect();
        Ok((Parent::Beneath(self.open_dir(&parent)?), name))
    }

    /// `rel` opened with `flags` (plus `O_NOFOLLOW`), no link followed on the way. An
    /// `O_PATH` answer may be the link itself: such an answer is refused here.
    fn resolve_fd(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let fd = self.resolve_any(rel, flags, mode)?;
        if flags.contains(OFlags::PATH) {
            let st = rfs::fstat(&fd)?;
            if FileKind::of(st.st_mode) == FileKind::Symlink {
                return Err(Refused::Link {
                    path: self.full(rel),
                    link: self.full(rel),
                }
                .into());
            }
        }
        Ok(fd)
    }

    /// Like [`Dir::resolve_fd`], but an `O_PATH` answer may be a link (the last
    /// component, not followed).
    fn resolve_any(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let names = self.components(rel)?;
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if walk_only() {
            self.walk(rel, &names, flags, mode)
        } else {
            self.beneath(rel, &names, flags, mode)
        }
    }

    /// `openat2` with [`RESOLVE`]; falls back to [`Dir::walk`] for good on `ENOSYS`.
    fn beneath(
        &self,
        rel: &Path,
        names: &[&OsStr],
        flags: OFlags,
        mode: Mode,
    ) -> io::Result<OwnedFd> {
        let joined: PathBuf = if names.is_empty() {
            PathBuf::from(".")
        } else {
            names.iter().collect()
        };
        // EAGAIN: a rename somewhere raced the lookup; the kernel asks to try again.
        for _ in 0..16 {
            match rfs::openat2(&self.fd, &joined, flags, mode, RESOLVE) {
                Ok(fd) => return Ok(fd),
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    return self.walk(rel, names, flags, mode);
                }
                // A link somewhere: the walk refuses it too, and names the component.
                // (Should the link be gone by then, the walk's answer is as safe.)
                Err(Errno::LOOP) => return self.walk(rel, names, flags, mode),
                Err(Errno::XDEV) => return Err(self.escape(rel)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(Errno::AGAIN.into())
    }

    /// One component at a time from this directory's descriptor, each opened with
    /// `O_PATH | O_NOFOLLOW` and checked to be a directory, not a link.
    fn walk(&self, rel: &Path, names: &[&OsStr], flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let Some((last, dirs)) = names.split_last() else {
            return rfs::openat(&self.fd, c".", flags, mode).map_err(Into::into);
        };
        let mut cur: Option<OwnedFd> = None;
        let mut so_far = self.path.clone();
        for name in dirs {
            so_far.push(name);
            let at: BorrowedFd<'_> = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
            let fd = rfs::openat(
                at,
                *name,
                O_PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            match FileKind::of(rfs::fstat(&fd)?.st_mode) {
                FileKind::Dir => cur = Some(fd),
                FileKind::Symlink => {
                    return Err(Refused::Link {
                        path: self.full(rel),
                        link: so_far,
                    }
                    .into());
                }
                _ => return Err(Errno::NOTDIR.into()),
            }
        }
        let at: BorrowedFd<'_> = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
        match rfs::openat(at, *last, flags, mode) {
            Ok(fd) => Ok(fd),
            // O_NOFOLLOW on a final link (without O_PATH).
            Err(Errno::LOOP) => Err(Refused::Link {
                path: self.full(rel),
                link: self.full(rel),
            }
            .into()),
            Err(e) => Err(e.into()),
        }
    }

    /// Turn a checked `O_PATH` descriptor into an open file: only a regular file (with
    /// one link if asked) is re-opened, through `/proc/self/fd`, which opens exactly
    /// the inode that was checked.
    fn reopen(&self, rel: &Path, fd: &OwnedFd, opts: &OpenOptions) -> io::Result<File> {
        let st = rfs::fstat(fd)?;
        let kind = FileKind::of(st.st_mode);
        if kind != FileKind::File {
            return Err(Refused::NotRegular {
                path: self.full(rel),
                kind,
            }
            .into());
        }
        if opts.single_link && st.st_nlink != 1 {
            return Err(Refused::HardLinked {
                path: self.full(rel),
                links: st.st_nlink,
            }
            .into());
        }
        // Non-blocking: the owner of a file can put a lease on it (`F_SETLEASE`), and
        // then every other open of it waits until the lease is given up or broken (45 s
        // by default), which would let a task hold up whoever opens its files.
        let mut flags = opts.access() | OFlags::NONBLOCK;
        if opts.truncate {
            flags |= OFlags::TRUNC;
        }
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let file = match rfs::open(proc_path.as_str(), flags, Mode::empty()) {
            Ok(f) => f,
            Err(Errno::NOENT) => {
                return Err(io::Error::other(format!(
                    "{}: cannot re-open the checked file through {proc_path} (is /proc mounted?)",
                    self.full(rel).display()
                )));
            }
            Err(Errno::WOULDBLOCK) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: another process holds a lease on it; not waiting for it",
                        self.full(rel).display()
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        // Regular files ignore O_NONBLOCK for reads and writes; cleared all the same,
        // so that the file is exactly what the caller asked for.
        rfs::fcntl_setfl(&file, rfs::fcntl_getfl(&file)? - OFlags::NONBLOCK)?;
        Ok(File::from(file))
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

const O_PATH: OFlags = OFlags::PATH;
/// Every descriptor opened here is close-on-exec: a plugin or agent that spawns a
/// process while it looks at a task dir must not hand that process the directory.
const O_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    /// Both resolvers: openat2 and the walk (forced for the second run).
    fn both(test: impl Fn()) {
        test();
        FORCE_WALK.with(|w| w.set(true));
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&test));
        FORCE_WALK.with(|w| w.set(false));
        if let Err(p) = walked {
            std::panic::resume_unwind(p);
        }
    }

    fn read() -> OpenOptions {
        OpenOptions::new().read(true)
    }

    fn log() -> OpenOptions {
        OpenOptions::new()
            .append(true)
            .create(0o600)
            .single_link(true)
    }

    fn refused(e: io::Error) -> Refused {
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        match e.into_inner().map(|b| b.downcast::<Refused>()) {
            Some(Ok(r)) => *r,
            other => panic!("not a refusal: {other:?}"),
        }
    }

    /// A task dir with `logs/stdout.0` and an outside secret.
    fn setup() -> (tempfile::TempDir, Dir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "root only").unwrap();
        std::fs::create_dir_all(tmp.path().join("task/logs/sub")).unwrap();
        std::fs::write(tmp.path().join("task/logs/stdout.0"), "out\n").unwrap();
        let dir = Dir::open(tmp.path().join("task")).unwrap();
        (tmp, dir, secret)
    }

    fn close_on_exec(fd: impl AsFd, what: &str) {
        let flags = rustix::io::fcntl_getfd(fd).unwrap();
        assert!(
            flags.contains(rustix::io::FdFlags::CLOEXEC),
            "{what}: the descriptor is not close-on-exec"
        );
    }

    /// A task puts a write lease on its own log file: opening it fails at once,
    /// saying why, instead of waiting until the lease is broken (45 s by default)
    /// while whoever opens it (the agent's log reader) is held up. Without a lease the
    /// file opens as asked, blocking as usual.
    #[test]
    fn a_leased_file_is_not_waited_for() {
        let (_tmp, task, _) = setup();
        let holder = std::fs::File::open(task.path().join("logs/stdout.0")).unwrap();
        // `F_SETSIG` (asm-generic/fcntl.h), which the libc crate does not export: the
        // lease break signals its holder (this process) with SIGURG, ignored, instead
        // of SIGIO, which would end the test.
        const F_SETSIG: libc::c_int = 10;
        let fd = holder.as_raw_fd();
        // SAFETY: fcntl on a descriptor this test owns, with integer arguments.
        #[allow(unsafe_code)]
        let leased = unsafe {
            libc::fcntl(fd, F_SETSIG, libc::SIGURG) == 0
                && libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) == 0
        };
        assert!(leased, "{}", io::Error::last_os_error());
        let t = std::time::Instant::now();
        let e = task.open_file("logs/stdout.0", &read()).unwrap_err();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        assert!(e.to_string().contains("lease"), "{e}");
        drop(holder);
        let mut f = task.open_file("logs/stdout.0", &read()).unwrap();
        let flags = rustix::fs::fcntl_getfl(&f).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        assert_eq!(text, "out\n");
    }

    /// A descriptor without O_CLOEXEC leaks into every process spawned meanwhile
    /// (a plugin starting a task while it lists a task dir).
    #[test]
    fn every_descriptor_is_close_on_exec() {
        both(|| {
            let (_tmp, task, _) = setup();
            close_on_exec(&task, "Dir::open");
            close_on_exec(
                task.reopen_self().unwrap(),
                "the descriptor `entries` reads",
            );
            close_on_exec(task.open_dir("logs/sub").unwrap(), "Dir::open_dir");
            close_on_exec(task.create_dir("new", 0o700).unwrap(), "Dir::create_dir");
            close_on_exec(
                task.create_dir_all("a/b", 0o700).unwrap(),
                "Dir::create_dir_all",
            );
            close_on_exec(
                task.open_file("logs/stdout.0", &read()).unwrap(),
                "Dir::open_file (existing)",
            );
            close_on_exec(
                task.open_file("logs/stdout.9", &log()).unwrap(),
                "Dir::open_file (created)",
            );
            close_on_exec(
                task.resolve_any(Path::new("logs/stdout.0"), O_PATH, Mode::empty())
                    .unwrap(),
                "an O_PATH resolution",
            );
        });
    }

    #[test]
    fn a_symlink_as_the_last_component_is_refused_for_every_use() {
        both(|| {
            let (tmp, task, secret) = setup();
            let link = tmp.path().join("task/logs/stdout.1");
            symlink(&secret, &link).unwrap();
            for opts in [read(), log(), OpenOptions::new().write(true).truncate(true)] {
                match refused(task.open_file("logs/stdout.1", &opts).unwrap_err()) {
                    Refused::Link { link: l, .. } => assert_eq!(l, link),
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(
                task.metadata("logs/stdout.1").unwrap().kind,
                FileKind::Symlink
            );
            assert!(matches!(
                refused(task.resolve("logs/stdout.1").unwrap_err()),
                Refused::Link { .. }
            ));
            assert!(matches!(
                refused(task.open_dir("logs/stdout.1").unwrap_err()),
                Refused::Link { .. }
            ));
            // Nothing was written through it, and removing it removes the link only.
            task.remove_file("logs/stdout.1").unwrap();
            assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");
            assert!(!link.exists());
        });
    }

    #[test]
    fn a_symlink_in_a_middle_component_is_refused_and_named() {
        both(|| {
            let (tmp, task, _secret) = setup();
            // logs/ replaced by a link to a directory holding a "log" file.
            let elsewhere = tmp.path().join("elsewhere");
            std::fs::create_dir(&elsewhere).unwrap();
            std::fs::write(elsewhere.join("stdout.0"), "not yours").unwrap();
            symlink(&elsewhere, tmp.path().join("task/linked")).unwrap();
            for rel in ["linked/stdout.0", "./linked/stdout.0"] {
                match refused(task.open_file(rel, &read()).unwrap_err()) {
                    Refused::Link { link, path } => {
                        assert_eq!(link, tmp.path().join("task/linked"));
                        assert_eq!(path, tmp.path().join("task").join(rel));
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert!(task.open_file("linked/new", &log()).is_err());
            assert!(!elsewhere.join("new").exists());
            assert!(task.create_dir("linked/d", 0o700).is_err());
            assert!(!elsewhere.join("d").exists());
            assert!(task.remove_file("linked/stdout.0").is_err());
            assert!(elsewhere.join("stdout.0").exists());
            assert!(task.resolve("linked").is_err());
            // Dir::open refuses a link as its last component, too.
            assert!(matches!(
                refused(Dir::open(tmp.path().join("task/linked")).unwrap_err()),
                Refused::Link { .. }
            ));
        });
    }

    #[test]
    fn dot_dot_and_absolute_paths_are_refused() {
        both(|| {
            let (_tmp, task, secret) = setup();
            for rel in ["../secret", "logs/../../secret", "logs/..", "/etc/passwd"] {
                assert!(
                    matches!(
                        refused(task.open_file(rel, &read()).unwrap_err()),
                        Refused::Escape { .. }
                    ),
                    "{rel}"
                );
            }
            assert!(matches!(
                refused(
                    task.open_file(secret.to_str().unwrap(), &read())
                        .unwrap_err()
                ),
                Refused::Escape { .. }
            ));
            assert!(matches!(
                refused(task.open_file("", &read()).unwrap_err()),
                Refused::Escape { .. }
            ));
            assert!(matches!(
                refused(task.remove_file("..").unwrap_err()),
                Refused::Escape { .. }
            ));
        });
    }

    #[test]
    fn hard_links_are_refused_only_when_asked() {
        both(|| {
            let (tmp, task, secret) = setup();
            std::fs::hard_link(&secret, tmp.path().join("task/logs/stdout.2")).unwrap();
            match refused(task.open_file("logs/stdout.2", &log()).unwrap_err()) {
                Refused::HardLinked { links, .. } => assert_eq!(links, 2),
                other => panic!("{other:?}"),
            }
            assert!(
                task.open_file("logs/stdout.2", &read().single_link(true))
                    .is_err()
            );
            // Without single_link it is a regular file like any other.
            let mut s = String::new();
            task.open_file("logs/stdout.2", &read())
                .unwrap()
                .read_to_string(&mut s)
                .unwrap();
            assert_eq!(s, "root only");
        });
    }

    #[test]
    fn fifos_and_devices_are_refused_before_they_are_opened() {
        both(|| {
            let (tmp, task, _secret) = setup();
            let fifo = tmp.path().join("task/logs/stdout.3");
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &fifo,
                FileType::Fifo,
                Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap();
            // Opening a FIFO for reading with no writer would block: a refusal that
            // returns at all proves it was never really opened.
            for opts in [read(), log()] {
                match refused(task.open_file("logs/stdout.3", &opts).unwrap_err()) {
                    Refused::NotRegular { kind, .. } => assert_eq!(kind, FileKind::Fifo),
                    other => panic!("{other:?}"),
                }
            }
            // /dev/null's node, made again inside the task dir (root only).
            if rustix::process::geteuid().is_root() {
                let dev = tmp.path().join("task/logs/stdout.4");
                let null = rustix::fs::stat("/dev/null").unwrap();
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &dev,
                    FileType::CharacterDevice,
                    Mode::from_raw_mode(0o600),
                    null.st_rdev,
                )
                .unwrap();
                match refused(task.open_file("logs/stdout.4", &read()).unwrap_err()) {
                    Refused::NotRegular { kind, .. } => assert_eq!(kind, FileKind::CharDevice),
                    other => panic!("{other:?}"),
                }
            }
            match refused(task.open_file("logs/sub", &read()).unwrap_err()) {
                Refused::NotRegular { kind, .. } => assert_eq!(kind, FileKind::Dir),
                other => panic!("{other:?}"),
            }
            match refused(task.open_dir("logs/stdout.0").unwrap_err()) {
                Refused::NotDir { kind, .. } => assert_eq!(kind, FileKind::File),
                other => panic!("{other:?}"),
            }
        });
    }

    #[test]
    fn files_are_created_with_exact_modes_and_appended_to() {
        both(|| {
            let (tmp, task, _secret) = setup();
            let logs = task.open_dir("logs").unwrap();
            for _ in 0..2 {
                logs.open_file("stderr.0", &log())
                    .unwrap()
                    .write_all(b"line\n")
                    .unwrap();
            }
            let path = tmp.path().join("task/logs/stderr.0");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "line\nline\n");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o600);
            // Missing without create: NotFound, as std says it.
            let e = logs.open_file("nothing", &read()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            // A dangling link is refused, not created through.
            symlink(
                tmp.path().join("created-outside"),
                tmp.path().join("task/logs/x.0"),
            )
            .unwrap();
            assert!(logs.open_file("x.0", &log()).is_err());
            assert!(!tmp.path().join("created-outside").exists());
            // Directories: exact mode, existing ones kept, created through no link.
            let made = task.create_dir_all("local/a/b", 0o750).unwrap();
            assert_eq!(made.path(), tmp.path().join("task/local/a/b"));
            assert_eq!(task.metadata("local/a").unwrap().mode, 0o750);
            assert_eq!(task.metadata("local/a/b").unwrap().kind, FileKind::Dir);
            let mut names = task.open_dir("logs").unwrap().entries().unwrap();
            names.sort();
            assert_eq!(names, ["stderr.0", "stdout.0", "sub", "x.0"]);
        });
    }

    #[test]
    fn open_refuses_a_link_as_the_directory_itself() {
        let (tmp, _task, _secret) = setup();
        symlink(tmp.path().join("task"), tmp.path().join("alias")).unwrap();
        let e = Dir::open(tmp.path().join("alias")).unwrap_err();
        assert!(e.to_string().contains("alias"), "{e}");
        // A path above the last component is the caller's and may be a link.
        let d = Dir::open(tmp.path().join("alias/logs")).unwrap();
        assert_eq!(d.metadata("stdout.0").unwrap().len, 4);
    }
}
