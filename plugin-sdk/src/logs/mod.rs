//! Task log files: one stream (stdout or stderr) is a numbered series of files
//! `<base>.0`, `<base>.1`, … capped in size and count, like Nomad's task logs.
//!
//! Drivers write a task's output with [`RotatingWriter`]; the agent reads it back in
//! order with [`log_files`]. Rotation never renames a file: a new file gets the next
//! index and the oldest beyond `max_files` is deleted. A reader that follows the
//! stream therefore reads file `N` to its end, then goes on with `N + 1` once that
//! exists, and never sees the same bytes twice.
//!
//! The log directory is in the task's directory, which the task may be able to write
//! (a container with a bind mount of it). Everything here therefore goes through
//! [`crate::taskdir`]: the directory `<base>`'s parent is opened once, refusing a link
//! as its last component, and every file in it is opened, created and deleted
//! relative to that descriptor. A log file that is a symbolic link, a hard link (more
//! than one name), a FIFO or a device is refused, never written or read through. Files
//! are created with mode 0600.
//!
//! ```
//! use drover_plugin_sdk::{LogConfig, logs::{RotatingWriter, log_files}};
//! use std::io::Write as _;
//! let dir = tempfile::tempdir().unwrap();
//! let base = dir.path().join("stdout");
//! let mut w = RotatingWriter::open(&base, LogConfig::new(2, 1)).unwrap();
//! w.write_all(&vec![b'x'; 3 * 1024 * 1024]).unwrap();
//! let files = log_files(&base).unwrap();
//! assert_eq!(files.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1, 2]);
//! ```

pub mod relay;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::taskdir::{Dir, OpenOptions};
use crate::{LogConfig, LogMode};

const MIB: u64 = 1024 * 1024;

/// How long [`RotatingWriter::open`] waits, in [`LogMode::Direct`], for a FIFO to get a
/// reader (a Nomad agent's `logmon` opens it just before the task starts). Past it the
/// open fails with an error naming the FIFO, rather than hanging the start forever.
///
/// ```
/// assert_eq!(drover_plugin_sdk::logs::DIRECT_OPEN_TIMEOUT.as_secs(), 30);
/// ```
pub const DIRECT_OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Open `name` in `dir` for [`LogMode::Direct`]: write-only, never through a symbolic
/// link, created 0600 as a regular file when missing; a FIFO or a regular file with one
/// name, nothing else.
/// `wait` bounds the wait for a FIFO's reader (`None`: do not wait).
fn open_direct(dir: &Dir, name: &OsStr, wait: Option<std::time::Duration>) -> io::Result<File> {
    use rustix::fs::{FileType, Mode, OFlags};
    let flags = OFlags::WRONLY
        | OFlags::APPEND
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::CLOEXEC
        | OFlags::NOCTTY;
    let deadline = wait.map(|w| std::time::Instant::now() + w);
    let path = || dir.path().join(name);
    let fd = loop {
        match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(LOG_FILE_MODE)) {
            Ok(fd) => break fd,
            // A FIFO nobody reads yet.
            Err(rustix::io::Errno::NXIO)
                if deadline.is_some_and(|d| std::time::Instant::now() < d) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(rustix::io::Errno::NXIO) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{}: no process reads this FIFO", path().display()),
                ));
            }
            Err(rustix::io::Errno::LOOP) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: is a symbolic link; refused", path().display()),
                ));
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("{}: {e}", path().display()),
                ));
            }
        }
    };
    let stat = rustix::fs::fstat(&fd)?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Fifo => {}
        // A second name may be one the task planted for a file it must not write
        // (the log directory is the allocation's, which tasks can write).
        FileType::RegularFile if stat.st_nlink > 1 => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: has {} names (a hard link); refused",
                    path().display(),
                    stat.st_nlink
                ),
            ));
        }
        FileType::RegularFile => {}
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: is a {other:?}, not a FIFO or a file; refused",
                    path().display()
                ),
            ));
        }
    }
    // Writes block as a pipe's do: the executor polls the task's pipes, not this one.
    rustix::fs::fcntl_setfl(&fd, OFlags::APPEND)?;
    Ok(File::from(fd))
}

/// Mode of the log files a [`RotatingWriter`] creates: the agent's user reads them, and
/// no one else (the task's user included).
pub const LOG_FILE_MODE: u32 = 0o600;

/// The file holding part `index` of the stream at `base`: `<base>.<index>`.
///
/// ```
/// use std::path::Path;
/// assert_eq!(drover_plugin_sdk::logs::file_name(Path::new("/t/logs/stdout"), 3),
///            Path::new("/t/logs/stdout.3"));
/// ```
pub fn file_name(base: &Path, index: u64) -> PathBuf {
    let mut name = base.as_os_str().to_owned();
    name.push(format!(".{index}"));
    PathBuf::from(name)
}

/// `<stem>.<index>`: a log file's name in its directory.
fn part(stem: &OsStr, index: u64) -> OsString {
    let mut name = stem.to_owned();
    name.push(format!(".{index}"));
    name
}

/// The directory and stem of the stream at `base`.
fn split(base: &Path) -> io::Result<(&Path, &OsStr)> {
    let Some(stem) = base.file_name() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("log base {} names no file", base.display()),
        ));
    };
    let dir = match base.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok((dir, stem))
}

/// The directory of the stream at `base`, opened without following a link as its last
/// component; `None` when it does not exist.
fn open_dir(base: &Path) -> io::Result<Option<(Dir, &OsStr)>> {
    let (dir, stem) = split(base)?;
    match Dir::open(dir) {
        Ok(d) => Ok(Some((d, stem))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The files of the stream at `base` that exist now, oldest first, with their index.
/// A missing directory is an empty stream; a directory that is a symbolic link is
/// refused (see [`crate::taskdir`]).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// assert!(drover_plugin_sdk::logs::log_files(&dir.path().join("stderr")).unwrap().is_empty());
/// ```
pub fn log_files(base: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let Some((dir, stem)) = open_dir(base)? else {
        return Ok(Vec::new());
    };
    Ok(log_files_in(&dir, stem)?
        .into_iter()
        .map(|(i, name)| (i, dir.path().join(name)))
        .collect())
}

/// The files of the stream named `stem` in `dir` that exist now, oldest first: their
/// index and their name in `dir` (open them with [`Dir::open_file`]).
///
/// ```
/// use drover_plugin_sdk::taskdir::Dir;
/// let tmp = tempfile::tempdir().unwrap();
/// std::fs::write(tmp.path().join("stdout.1"), "").unwrap();
/// std::fs::write(tmp.path().join("stdout.0"), "").unwrap();
/// let files = drover_plugin_sdk::logs::log_files_in(&Dir::open(tmp.path()).unwrap(), "stdout".as_ref()).unwrap();
/// assert_eq!(files, [(0, "stdout.0".into()), (1, "stdout.1".into())]);
/// ```
pub fn log_files_in(dir: &Dir, stem: &OsStr) -> io::Result<Vec<(u64, OsString)>> {
    Ok(log_files_among(&dir.entries()?, stem))
}

/// [`log_files_in`] over `names`, a listing of the directory.
fn log_files_among(names: &[OsString], stem: &OsStr) -> Vec<(u64, OsString)> {
    let mut prefix = stem.to_owned();
    prefix.push(".");
    let prefix = prefix.to_string_lossy().into_owned();
    let mut files = Vec::new();
    for name in names {
        let Some(index) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<u64>().ok())
        else {
            continue;
        };
        files.push((index, name.clone()));
    }
    files.sort_unstable_by_key(|(i, _)| *i);
    files
}

/// How a log file is opened to be written: appended to, created 0600, and refused
/// when it is a link, hard-linked, or not a regular file.
fn append() -> OpenOptions {
    OpenOptions::new()
        .append(true)
        .create(LOG_FILE_MODE)
        .single_link(true)
}

/// Writes one output stream into size-capped, count-capped files.
///
/// Opening continues the newest existing file, so a writer that is re-created (a
/// restarted executor, a driver re-attaching to a container's logs) appends instead
/// of starting over. No file grows past `max_file_size_mb`: a write that does not fit
/// is split across files. Files are opened, created and deleted relative to the
/// directory's descriptor, never through a link (see the [module docs](self)).
///
/// ```
/// use std::io::Write as _;
/// let dir = tempfile::tempdir().unwrap();
/// let base = dir.path().join("stdout");
/// let mut w = drover_plugin_sdk::logs::RotatingWriter::open(&base, Default::default()).unwrap();
/// w.write_all(b"hello\n").unwrap();
/// assert_eq!(std::fs::read(dir.path().join("stdout.0")).unwrap(), b"hello\n");
/// ```
#[derive(Debug)]
pub struct RotatingWriter {
    dir: Dir,
    stem: OsString,
    max_files: u64,
    max_size: u64,
    index: u64,
    written: u64,
    file: File,
    /// [`LogMode::Direct`]: `stem` is the one FIFO or file, never rotated.
    direct: bool,
}

impl RotatingWriter {
    /// Open the stream at `base` with `limits` (a zero limit counts as 1). `base`'s
    /// directory must exist and must not be a symbolic link.
    ///
    /// With [`LogMode::Direct`] in `limits`, `base` itself is opened (see
    /// [`LogMode::Direct`]; this may wait up to [`DIRECT_OPEN_TIMEOUT`] for a FIFO's
    /// reader) and every write goes there unchanged:
    ///
    /// ```
    /// use drover_plugin_sdk::{LogConfig, LogMode, logs::RotatingWriter};
    /// use std::io::Write as _;
    /// let dir = tempfile::tempdir().unwrap();
    /// let fifo = dir.path().join("stdout.fifo");
    /// assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    /// let reader = std::thread::spawn({
    ///     let fifo = fifo.clone();
    ///     move || std::fs::read(fifo).unwrap()
    /// });
    /// let mut w = RotatingWriter::open(&fifo, LogConfig::default().with_mode(LogMode::Direct)).unwrap();
    /// w.write_all(b"as it is\n").unwrap();
    /// drop(w);
    /// assert_eq!(reader.join().unwrap(), b"as it is\n");
    /// ```
    pub fn open(base: &Path, limits: LogConfig) -> io::Result<Self> {
        let (dir, stem) = split(base)?;
        Self::open_in(Dir::open(dir)?, stem, limits)
    }

    /// Open the stream named `stem` in the directory `dir` with `limits`.
    ///
    /// ```
    /// use drover_plugin_sdk::{logs::RotatingWriter, taskdir::Dir};
    /// use std::io::Write as _;
    /// let tmp = tempfile::tempdir().unwrap();
    /// let logs = Dir::open(tmp.path()).unwrap().create_dir("logs", 0o700).unwrap();
    /// let mut w = RotatingWriter::open_in(logs, "stderr".as_ref(), Default::default()).unwrap();
    /// w.write_all(b"oops\n").unwrap();
    /// assert_eq!(std::fs::read(tmp.path().join("logs/stderr.0")).unwrap(), b"oops\n");
    /// ```
    pub fn open_in(dir: Dir, stem: &OsStr, limits: LogConfig) -> io::Result<Self> {
        if limits.mode == LogMode::Direct {
            return Self::open_listed(dir, stem, limits, &[]);
        }
        let names = dir.entries()?;
        Self::open_listed(dir, stem, limits, &names)
    }

    /// The streams at `first` and `second` (a task's stdout and stderr), both with
    /// `limits`: their directory opened and listed once when they share it, where
    /// [`RotatingWriter::open`] twice would do each twice (a start costs that many
    /// fewer system calls).
    ///
    /// ```
    /// use drover_plugin_sdk::logs::RotatingWriter;
    /// use std::io::Write as _;
    /// let tmp = tempfile::tempdir().unwrap();
    /// std::fs::write(tmp.path().join("stderr.3"), "older\n").unwrap();
    /// let (mut out, mut err) = RotatingWriter::open_pair(
    ///     &tmp.path().join("stdout"),
    ///     &tmp.path().join("stderr"),
    ///     Default::default(),
    /// )
    /// .unwrap();
    /// out.write_all(b"one\n").unwrap();
    /// err.write_all(b"two\n").unwrap();
    /// assert_eq!((out.current_index(), err.current_index()), (0, 3));
    /// assert_eq!(std::fs::read(tmp.path().join("stderr.3")).unwrap(), b"older\ntwo\n");
    /// ```
    pub fn open_pair(first: &Path, second: &Path, limits: LogConfig) -> io::Result<(Self, Self)> {
        let ((dir, stem), (second_dir, second_stem)) = (split(first)?, split(second)?);
        if dir != second_dir || stem == second_stem || limits.mode == LogMode::Direct {
            return Ok((Self::open(first, limits)?, Self::open(second, limits)?));
        }
        let dir = Dir::open(dir)?;
        let names = dir.entries()?;
        let first = Self::open_listed(dir.try_clone()?, stem, limits, &names)?;
        Ok((first, Self::open_listed(dir, second_stem, limits, &names)?))
    }

    /// [`RotatingWriter::open_in`] with `names`, a listing of `dir` made just now.
    fn open_listed(
        dir: Dir,
        stem: &OsStr,
        limits: LogConfig,
        names: &[OsString],
    ) -> io::Result<Self> {
        if limits.mode == LogMode::Direct {
            let file = open_direct(&dir, stem, Some(DIRECT_OPEN_TIMEOUT))?;
            return Ok(RotatingWriter {
                dir,
                stem: stem.to_owned(),
                max_files: 1,
                max_size: u64::MAX,
                index: 0,
                written: 0,
                file,
                direct: true,
            });
        }
        let files = log_files_among(names, stem);
        let index = files.last().map_or(0, |(i, _)| *i);
        let file = dir.open_file(part(stem, index), &append())?;
        let written = file.metadata()?.len();
        let mut w = RotatingWriter {
            dir,
            stem: stem.to_owned(),
            max_files: u64::from(limits.max_files.max(1)),
            max_size: u64::from(limits.max_file_size_mb.max(1)) * MIB,
            index,
            written,
            file,
            direct: false,
        };
        // The files were listed just now: prune from that list rather than a second
        // scan (a start opens two streams; each scan is an open and two getdents).
        w.prune_listed(files)?;
        Ok(w)
    }

    /// Index of the file being written.
    pub fn current_index(&self) -> u64 {
        self.index
    }

    /// Where the next byte goes: the file index and that file's length. A writer
    /// that records it after each message can later undo a message it wrote but did
    /// not get to record, with [`roll_back`].
    pub fn position(&self) -> LogPosition {
        LogPosition {
            index: self.index,
            len: self.written,
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        // Only a planted name gets here (2^64 files of at least 1 MiB are never
        // written): refuse to go on rather than wrap round to file 0.
        self.index = self.index.checked_add(1).ok_or_else(|| {
            io::Error::other(format!(
                "{}: no log file can follow index {}",
                self.dir.path().join(&self.stem).display(),
                self.index
            ))
        })?;
        self.file = self
            .dir
            .open_file(part(&self.stem, self.index), &append())?;
        self.written = 0;
        self.prune()
    }

    /// [`LogMode::Direct`]: write as it is. A write while no one reads the FIFO (Nomad's
    /// `logmon` restarting) fails with `BrokenPipe`; the FIFO is then opened again once,
    /// without waiting, and the write retried, and if there is still no reader the error
    /// is the caller's (the executor drops that output and notes it once). Once a new
    /// reader opens the FIFO, writes go on.
    fn write_direct(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.file.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.file = open_direct(&self.dir, &self.stem, None)?;
                self.file.write(buf)
            }
            other => other,
        }
        .inspect(|n| self.written = self.written.saturating_add(*n as u64))
    }

    /// Delete the oldest files beyond `max_files`.
    fn prune(&mut self) -> io::Result<()> {
        let files = log_files_in(&self.dir, &self.stem)?;
        self.prune_listed(files)
    }

    /// [`RotatingWriter::prune`] over `files`, a listing of this stream's files.
    fn prune_listed(&mut self, files: Vec<(u64, OsString)>) -> io::Result<()> {
        let oldest_kept = self.index.saturating_add(1).saturating_sub(self.max_files);
        for (i, name) in files {
            if i < oldest_kept {
                match self.dir.remove_file(&name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

impl Write for RotatingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.direct {
            return self.write_direct(buf);
        }
        if self.written >= self.max_size {
            self.rotate()?;
        }
        let room = usize::try_from(self.max_size - self.written).unwrap_or(usize::MAX);
        let n = self.file.write(&buf[..buf.len().min(room)])?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// A point in a stream: file `index`, `len` bytes into it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogPosition {
    /// Index of the file (`<base>.<index>`).
    pub index: u64,
    /// Bytes of that file before the point.
    pub len: u64,
}

/// Undo whatever was written to the stream at `base` after `to`, when that is only
/// a tail of file `to.index`: the file is cut back to `to.len` and `Some(bytes cut)`
/// is returned (`Some(0)` when it is not longer than that).
///
/// A writer whose process may die between writing a message and recording that it
/// did (a driver copying a container's logs) records [`RotatingWriter::position`]
/// after each message; the next process rolls back to the recorded position and
/// writes the unrecorded message again, so it ends up in the files exactly once.
/// The rewritten bytes are the same as the cut ones, so a reader that already read
/// them reads on correctly.
///
/// When the stream has moved past file `to.index` (a later file exists, or that file
/// is gone), nothing is touched and `None` is returned: deleting a later file would
/// make a reader that already opened it miss what is written again under its name.
/// The caller then lives with the message being written twice.
///
/// ```
/// use drover_plugin_sdk::logs::{roll_back, RotatingWriter};
/// use std::io::Write as _;
/// let dir = tempfile::tempdir().unwrap();
/// let base = dir.path().join("stdout");
/// let mut w = RotatingWriter::open(&base, Default::default()).unwrap();
/// w.write_all(b"one\n").unwrap();
/// let recorded = w.position();
/// w.write_all(b"two\n").unwrap(); // the process dies before recording this one
/// drop(w);
/// assert_eq!(roll_back(&base, recorded).unwrap(), Some(4));
/// assert_eq!(std::fs::read(dir.path().join("stdout.0")).unwrap(), b"one\n");
/// ```
pub fn roll_back(base: &Path, to: LogPosition) -> io::Result<Option<u64>> {
    let Some((dir, stem)) = open_dir(base)? else {
        return Ok(None);
    };
    let files = log_files_in(&dir, stem)?;
    if files.iter().any(|(i, _)| *i > to.index) {
        return Ok(None);
    }
    let Some((_, name)) = files.iter().find(|(i, _)| *i == to.index) else {
        return Ok(None);
    };
    let file = match dir.open_file(name, &OpenOptions::new().write(true).single_link(true)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len <= to.len {
        return Ok(Some(0));
    }
    file.set_len(to.len)?;
    Ok(Some(len - to.len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(files: u32) -> LogConfig {
        LogConfig::new(files, 1)
    }

    fn direct() -> LogConfig {
        LogConfig::default().with_mode(LogMode::Direct)
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    #[test]
    fn direct_mode_writes_the_path_as_it_is_and_never_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut w = RotatingWriter::open(&path, direct().with_max_file_size_mb(1)).unwrap();
        w.write_all(&vec![b'a'; 2 * MIB as usize]).unwrap();
        drop(w);
        assert_eq!(file_len(&path), 2 * MIB, "no cap, no rotation");
        assert!(log_files(&path).unwrap().is_empty(), "no numbered files");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            LOG_FILE_MODE
        );
    }

    #[test]
    fn direct_mode_refuses_links_and_other_kinds_of_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep\n").unwrap();
        let link = dir.path().join("symlink");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = RotatingWriter::open(&link, direct()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let hard = dir.path().join("hardlink");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = RotatingWriter::open(&hard, direct()).unwrap_err();
        assert!(e.to_string().contains("hard link"), "{e}");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(RotatingWriter::open(&sub, direct()).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
    }

    #[test]
    fn direct_mode_gives_up_on_a_fifo_nobody_reads_and_reopens_one_whose_reader_left() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("stdout.fifo");
        mkfifo(&fifo);
        let d = Dir::open(dir.path()).unwrap();
        let e = open_direct(
            &d,
            OsStr::new("stdout.fifo"),
            Some(std::time::Duration::from_millis(50)),
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("no process reads"), "{e}");

        // A reader comes, goes, and a new one comes (Nomad's logmon restarted).
        // A blocking O_RDONLY open waits for a writer: open the readers non-blocking.
        let open_reader = || {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(&fifo)
                .unwrap()
        };
        let reader = open_reader();
        let mut w = RotatingWriter::open(&fifo, direct()).unwrap();
        w.write_all(b"one\n").unwrap();
        drop(reader);
        // Nobody reads: the write fails at once (no hang, no SIGPIPE death).
        let e = w.write_all(b"lost\n").unwrap_err();
        assert!(
            e.kind() == io::ErrorKind::BrokenPipe || e.to_string().contains("no process reads"),
            "{e}"
        );
        let mut again = open_reader();
        w.write_all(b"two\n").unwrap();
        drop(w);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut again, &mut got).unwrap();
        assert_eq!(got, "one\ntwo\n", "what the pipe held, then the new output");
    }

    #[test]
    fn rotates_by_size_and_keeps_count() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, limits(3)).unwrap();
        let line = [b'a'; 1000];
        for _ in 0..10_000 {
            w.write_all(&line).unwrap();
        }
        let files = log_files(&base).unwrap();
        assert_eq!(files.len(), 3, "{files:?}");
        for (_, p) in &files {
            assert!(std::fs::metadata(p).unwrap().len() <= MIB);
        }
        // 10 MB in 1 MiB files: indexes 7, 8, 9 remain.
        assert_eq!(files[0].0, 7);
        assert_eq!(files[2].0, 9);
    }

    /// A task plants a file with the last index there is, then gets a new writer
    /// (a restart): writing fills that file, and then fails saying why, instead of
    /// wrapping round to file 0 past the reader (or panicking in a debug build).
    #[test]
    fn a_planted_last_index_stops_the_writer_without_wrapping() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        std::fs::write(file_name(&base, 0), "old\n").unwrap();
        std::fs::write(file_name(&base, u64::MAX), "").unwrap();
        let mut w = RotatingWriter::open(&base, limits(3)).unwrap();
        assert_eq!(w.current_index(), u64::MAX);
        let e = w.write_all(&vec![b'x'; 2 * MIB as usize]).unwrap_err();
        assert!(e.to_string().contains("no log file can follow"), "{e}");
        assert_eq!(
            std::fs::metadata(file_name(&base, u64::MAX)).unwrap().len(),
            MIB
        );
        assert!(
            !file_name(&base, 0).exists(),
            "pruned as older than the newest 3"
        );
        assert_eq!(log_files(&base).unwrap().len(), 1);
    }

    #[test]
    fn reopening_appends_to_the_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stderr");
        RotatingWriter::open(&base, limits(2))
            .unwrap()
            .write_all(b"one\n")
            .unwrap();
        RotatingWriter::open(&base, limits(2))
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(file_name(&base, 0)).unwrap(),
            "one\ntwo\n"
        );
    }

    #[test]
    fn roll_back_cuts_a_tail_and_never_touches_a_later_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, limits(5)).unwrap();
        w.write_all(&vec![b'a'; (MIB - 40) as usize]).unwrap();
        let recorded = w.position();
        assert_eq!(
            recorded,
            LogPosition {
                index: 0,
                len: MIB - 40
            }
        );
        w.write_all(&[b'b'; 30]).unwrap();
        assert_eq!(roll_back(&base, recorded).unwrap(), Some(30));
        assert_eq!(file_len(&file_name(&base, 0)), MIB - 40);
        // Nothing past the record: nothing to cut.
        assert_eq!(roll_back(&base, recorded).unwrap(), Some(0));
        // Reopened, the writer goes on from the recorded point.
        let mut w = RotatingWriter::open(&base, limits(5)).unwrap();
        assert_eq!(w.position(), recorded);
        // A message split across a rotation: file 1 exists, so nothing is touched.
        w.write_all(&[b'c'; 60]).unwrap();
        assert_eq!(w.position(), LogPosition { index: 1, len: 20 });
        drop(w);
        assert_eq!(roll_back(&base, recorded).unwrap(), None);
        assert_eq!(file_len(&file_name(&base, 0)), MIB);
        assert_eq!(file_len(&file_name(&base, 1)), 20);
    }

    #[test]
    fn roll_back_to_a_pruned_file_touches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        // One file kept: the rotation that creates file 1 deletes file 0.
        let mut w = RotatingWriter::open(&base, limits(1)).unwrap();
        w.write_all(&vec![b'a'; (MIB - 10) as usize]).unwrap();
        let recorded = w.position();
        w.write_all(&[b'b'; 30]).unwrap();
        drop(w);
        assert_eq!(roll_back(&base, recorded).unwrap(), None);
        let files = log_files(&base).unwrap();
        assert_eq!(files.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1]);
        assert_eq!(file_len(&files[0].1), 20);
    }

    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
    }

    /// Both streams of a task opened together keep what each opened alone does: its
    /// own newest file, its own pruning, a planted link refused, and streams in two
    /// directories opened each in its own.
    #[test]
    fn a_pair_opened_together_is_two_streams_opened_alone() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        for name in ["stdout.0", "stdout.1", "stdout.2", "stderr.4"] {
            std::fs::write(logs.join(name), name).unwrap();
        }
        let (out, err) = (logs.join("stdout"), logs.join("stderr"));
        let (mut o, mut e) = RotatingWriter::open_pair(&out, &err, limits(2)).unwrap();
        assert_eq!((o.current_index(), e.current_index()), (2, 4));
        o.write_all(b"+o").unwrap();
        e.write_all(b"+e").unwrap();
        drop((o, e));
        let names = |base: &Path| -> Vec<u64> {
            log_files(base).unwrap().iter().map(|(i, _)| *i).collect()
        };
        // Two files kept of stdout's three; stderr's one untouched but for the write.
        assert_eq!(names(&out), [1, 2]);
        assert_eq!(std::fs::read(logs.join("stdout.2")).unwrap(), b"stdout.2+o");
        assert_eq!(std::fs::read(logs.join("stderr.4")).unwrap(), b"stderr.4+e");

        // A link planted as the newest stderr file fails the pair, as it fails stderr
        // alone, and nothing is written through it.
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "root only").unwrap();
        symlink(&secret, logs.join("stderr.5")).unwrap();
        let refused = RotatingWriter::open_pair(&out, &err, limits(2)).unwrap_err();
        assert!(crate::taskdir::refusal(&refused).is_some(), "{refused}");
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");

        // Two directories: each stream in its own.
        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let (mut o, mut e) =
            RotatingWriter::open_pair(&out, &other.join("stderr"), limits(2)).unwrap();
        o.write_all(b"!").unwrap();
        e.write_all(b"!").unwrap();
        drop((o, e));
        assert_eq!(std::fs::read(other.join("stderr.0")).unwrap(), b"!");
    }

    /// A task that can write its log directory plants links: the writer neither writes
    /// through them nor deletes what they point at; the reader's listing is refused
    /// when the directory itself is a link.
    #[test]
    fn planted_links_are_refused_not_followed() {
        use std::os::unix::fs::{PermissionsExt as _, symlink};
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "root only").unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let base = logs.join("stdout");

        // The newest file is a link: opening refuses it.
        symlink(&secret, logs.join("stdout.0")).unwrap();
        let e = RotatingWriter::open(&base, limits(2)).unwrap_err();
        assert!(crate::taskdir::refusal(&e).is_some(), "{e}");
        // A hard link is refused as well.
        std::fs::remove_file(logs.join("stdout.0")).unwrap();
        std::fs::hard_link(&secret, logs.join("stdout.0")).unwrap();
        assert!(RotatingWriter::open(&base, limits(2)).is_err());
        assert!(roll_back(&base, LogPosition { index: 0, len: 0 }).is_err());
        std::fs::remove_file(logs.join("stdout.0")).unwrap();

        // The next file to rotate into is a link: the write fails instead.
        let mut w = RotatingWriter::open(&base, limits(1)).unwrap();
        w.write_all(&vec![b'a'; MIB as usize]).unwrap();
        symlink(&secret, logs.join("stdout.1")).unwrap();
        assert!(w.write_all(b"more").is_err());
        // Pruning deletes a link planted under an old index, never its target.
        std::fs::remove_file(logs.join("stdout.1")).unwrap();
        let planted = tmp.path().join("planted");
        std::fs::create_dir(&planted).unwrap();
        symlink(&planted, logs.join("stdout.0x")).unwrap(); // not a log name: ignored
        let mut w = RotatingWriter::open(&base, limits(1)).unwrap();
        w.write_all(b"b").unwrap();
        drop(w);
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");
        assert!(planted.exists());
        let mode = std::fs::metadata(logs.join("stdout.1"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, LOG_FILE_MODE);

        // The directory itself replaced by a link.
        let moved = tmp.path().join("moved");
        std::fs::rename(&logs, &moved).unwrap();
        symlink(&moved, &logs).unwrap();
        for e in [
            RotatingWriter::open(&base, limits(1)).unwrap_err(),
            log_files(&base).unwrap_err(),
        ] {
            assert!(crate::taskdir::refusal(&e).is_some(), "{e}");
        }
    }

    #[test]
    fn other_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        for name in ["stdout.1", "stdout.x", "stdout.", "stderr.0", "stdout.10"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let idx: Vec<u64> = log_files(&base)
            .unwrap()
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(idx, [1, 10]);
    }
}
