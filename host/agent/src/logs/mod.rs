//! Reading and following a task's log stream.
//!
//! Drivers write each stream (stdout, stderr) as numbered files `<base>.0`, `<base>.1`,
//! … ([`drover_plugin_sdk::logs`]): a file is never renamed or written again once the
//! next one exists, and the oldest are deleted beyond the task's `max_files`. So a
//! reader reads file `N` to its end, then goes on with `N + 1` once that exists. A file
//! deleted while we hold it open stays readable through our descriptor, so the file
//! being read is never lost. To keep up with a fast writer the reader also opens the
//! next files as soon as they appear, before it gets to them ([`LOOKAHEAD`] files and
//! up to [`LOOKAHEAD_BYTES`]); only files further ahead can be deleted before it
//! reaches them, and then [`LogReader`] says how many were skipped instead of
//! pretending the stream is whole.
//!
//! A driver that writes one plain file at `<base>` (no index) is read as a stream of
//! one file that never rotates.
//!
//! [`stream`] (in `follow.rs`) serves a reader to an API client, following the task's
//! writes (woken by inotify on the log directory) until the task is dead.
//!
//! The log directory is in the task's directory, where a task may plant links (a
//! container given a bind mount of it). Every file is opened through
//! [`drover_plugin_sdk::taskdir`]: relative to the log directory's descriptor (itself
//! refused if it is a link), following no link, and only if it is a regular file with
//! one name. A planted `stdout.0 -> /root/secret` ends the read with an error that
//! says so; the agent never reads through it.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use drover_plugin_sdk::logs::log_files_in;
use drover_plugin_sdk::taskdir::{Dir, FileKind, OpenOptions};

mod follow;

pub use follow::{FollowOptions, stream, stream_positioned};

/// Largest piece returned by one read.
const CHUNK: usize = 256 * 1024;

/// How many files past the one being read a reader holds open at least. A deleted
/// file's disk space is only freed when the last descriptor closes, so this and
/// [`LOOKAHEAD_BYTES`] bound what a slow or stalled reader (`logs -f | less`) can pin
/// beyond the task's own `max_files`.
pub const LOOKAHEAD: usize = 4;

/// Past [`LOOKAHEAD`] files, a reader goes on opening files ahead while the complete
/// ones it holds ahead total less than this: a burst of this much output (small log
/// files rotating fast) reaches a follower whole.
pub const LOOKAHEAD_BYTES: u64 = 64 * 1024 * 1024;

/// Files held ahead at most by one reader, whatever their size.
const LOOKAHEAD_MAX_FILES: usize = 256;

/// Files held ahead beyond [`LOOKAHEAD`] by all readers of the agent together: the
/// descriptors come out of the agent's own limit (often 1024), which its API and
/// plugin connections need too.
const LOOKAHEAD_EXTRA_FILES_TOTAL: usize = 512;

static LOOKAHEAD_EXTRA_FILES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// One of the [`LOOKAHEAD_EXTRA_FILES_TOTAL`] descriptors, given back on drop.
struct ExtraFileSlot;

impl ExtraFileSlot {
    fn take() -> Option<ExtraFileSlot> {
        LOOKAHEAD_EXTRA_FILES
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < LOOKAHEAD_EXTRA_FILES_TOTAL).then_some(n + 1)
            })
            .ok()
            .map(|_| ExtraFileSlot)
    }
}

impl Drop for ExtraFileSlot {
    fn drop(&mut self) {
        LOOKAHEAD_EXTRA_FILES.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a reader yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogChunk {
    /// Bytes of the stream, in order.
    Data(Vec<u8>),
    /// This many files were deleted by rotation before they could be read; the data
    /// that follows starts at the beginning of the next file still present.
    Skipped(u64),
}

/// Where a reader starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogStart {
    /// At the beginning of the oldest file present.
    #[default]
    Beginning,
    /// This many bytes after the beginning of the oldest file present.
    Offset(u64),
    /// At the start of the last `n` lines.
    Tail(u64),
    /// This many bytes before the end of the stream (Nomad's `origin=end&offset=n`);
    /// at the beginning of the oldest file present when the stream is shorter.
    FromEnd(u64),
}

/// Where a chunk just read ends: in which file (`None` for a plain, unnumbered file)
/// and at which byte of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilePosition {
    /// The file's index (`<base>.<index>`).
    pub index: Option<u64>,
    /// The byte after the chunk's last, in that file.
    pub offset: u64,
}

struct OpenFile {
    /// `None` for a plain, unnumbered file.
    index: Option<u64>,
    file: File,
    /// Its size as counted in [`Ahead::bytes`] (complete files held ahead).
    counted: u64,
    /// Held while this file is open, if it was opened beyond [`LOOKAHEAD`].
    _slot: Option<ExtraFileSlot>,
}

/// The next file to read once the current one is drained.
struct Pending {
    open: OpenFile,
    skipped: u64,
}

/// The files a reader holds open ahead of the one it reads. Shared with the agent's
/// inotify reader (`follow.rs`), which fills it the moment a log file is created, on
/// its own thread: a follower busy sending, or a process short of CPU, would otherwise
/// only open the next files at its next read, and a fast writer rotating small files
/// can create and delete two files in that time.
pub(crate) struct Ahead {
    /// The highest index the reader holds: its current or pending file, or the last
    /// of `files`. `None` before the first numbered file is open (and for a plain
    /// file), when there is nothing to open ahead of.
    last: Option<u64>,
    /// Files after the reader's current (and pending) one, consecutive, opened before
    /// they could be deleted.
    files: std::collections::VecDeque<OpenFile>,
    /// Sum of `counted` over `files`.
    bytes: u64,
    /// Fillers between looking at `last` and adding the file they open: a reader that
    /// finds files skipped waits for them, as one of them may hold the next file open.
    opening: usize,
}

/// Lock `m`; its data stays consistent at every unlock, so a panic elsewhere does not
/// spoil it.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Ahead {
    /// Whether a reader holding this wants another file ahead, and if so whether it
    /// needs an [`ExtraFileSlot`] for it.
    fn wants(&self) -> Option<bool> {
        if self.files.len() < LOOKAHEAD {
            Some(false)
        } else if self.bytes < LOOKAHEAD_BYTES && self.files.len() < LOOKAHEAD_MAX_FILES {
            Some(true)
        } else {
            None
        }
    }

    /// Take `file`, opened as `index`, if it is the next one (`last + 1`); when someone
    /// else took that index meanwhile, hand it back, to be closed outside the lock
    /// (closing the last descriptor of a deleted file frees its blocks).
    fn push(
        &mut self,
        index: u64,
        file: File,
        slot: Option<ExtraFileSlot>,
    ) -> io::Result<Option<(File, Option<ExtraFileSlot>)>> {
        if self.last.and_then(|l| l.checked_add(1)) != Some(index) {
            return Ok(Some((file, slot)));
        }
        // The next file exists, so the one before it is complete: count it.
        if let Some(prev) = self.files.back_mut() {
            prev.counted = prev.file.metadata()?.len();
            self.bytes = self.bytes.saturating_add(prev.counted);
        }
        self.files.push_back(OpenFile {
            index: Some(index),
            file,
            counted: 0,
            _slot: slot,
        });
        self.last = Some(index);
        Ok(None)
    }

    fn pop(&mut self) -> Option<OpenFile> {
        let open = self.files.pop_front()?;
        self.bytes = self.bytes.saturating_sub(open.counted);
        Some(open)
    }
}

/// Open the files after the last one `ahead` holds that exist now, up to [`LOOKAHEAD`]
/// files and [`LOOKAHEAD_BYTES`]. Cheap when there is nothing new (one failed `open`).
///
/// The reader and the inotify reader thread both fill, concurrently. The lock is held
/// only to look at and to add to the files, never while opening one: a reader thread
/// that lost its CPU while it held the lock across a directory look would otherwise
/// keep the inotify thread from opening files that rotation then deleted. Two fillers
/// opening the same file is harmless: the second copy is dropped.
fn fill_ahead(ahead: &std::sync::Mutex<Ahead>, base: &Path) -> io::Result<()> {
    let mut dir = None;
    loop {
        let (next, extra) = {
            let mut a = lock(ahead);
            let Some(last) = a.last else {
                return Ok(());
            };
            let Some(extra) = a.wants() else {
                return Ok(());
            };
            // Nothing follows the last index there is (a task can plant that name).
            let Some(next) = last.checked_add(1) else {
                return Ok(());
            };
            a.opening += 1;
            (next, extra)
        };
        let opened = open_next(&mut dir, base, next, extra);
        let refused = {
            let mut a = lock(ahead);
            a.opening -= 1;
            match opened {
                Ok(Some((file, slot))) => a.push(next, file, slot),
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        };
        // Taken by another filler meanwhile: go on from wherever it got to. The copy
        // is closed here, outside the lock.
        drop(refused?);
    }
}

/// Open file `index` of the stream at `base` (and its directory into `dir`, once);
/// `None` when it does not exist, or when it would be past the agent's bound on
/// files held ahead (`extra`).
fn open_next<'a>(
    dir: &mut Option<(Dir, &'a OsStr)>,
    base: &'a Path,
    index: u64,
    extra: bool,
) -> io::Result<Option<(File, Option<ExtraFileSlot>)>> {
    let slot = if extra {
        match ExtraFileSlot::take() {
            Some(slot) => Some(slot),
            None => return Ok(None),
        }
    } else {
        None
    };
    if dir.is_none() {
        *dir = open_dir(base)?;
    }
    let Some((dir, stem)) = dir else {
        return Ok(None);
    };
    match open_log(dir, &part(stem, index)) {
        Ok(file) => Ok(Some((file, slot))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// How many times a reader that finds files skipped waits for a filler before it
/// reports the skip: 16 yields, then 1 ms sleeps.
const FILLER_WAITS: u32 = 16 + 100;

/// A handle on a reader's files ahead, for the inotify reader to fill.
#[derive(Clone)]
pub(crate) struct AheadHandle {
    base: PathBuf,
    ahead: std::sync::Weak<std::sync::Mutex<Ahead>>,
}

impl AheadHandle {
    /// Open what was created ahead of the reader, if it is still there. An error is
    /// left for the reader to meet (and report) at its own next look.
    pub(crate) fn fill(&self) {
        if let Some(ahead) = self.ahead.upgrade() {
            let _ = fill_ahead(&ahead, &self.base);
        }
    }
}

/// Reads one log stream in order, across rotations, without blocking: [`LogReader::read`]
/// returns what is there and `None` at the end of what was written so far.
pub struct LogReader {
    base: PathBuf,
    start: Option<LogStart>,
    current: Option<OpenFile>,
    ahead: std::sync::Arc<std::sync::Mutex<Ahead>>,
    pending: Option<Pending>,
    buf: Vec<u8>,
}

impl LogReader {
    /// A reader of the stream at `base` (e.g. `<task_dir>/logs/stdout`). Where it
    /// starts is decided at the first read: if nothing was written yet, at the beginning.
    pub fn new(base: impl Into<PathBuf>, start: LogStart) -> Self {
        LogReader {
            base: base.into(),
            start: Some(start),
            current: None,
            ahead: std::sync::Arc::new(std::sync::Mutex::new(Ahead {
                last: None,
                files: std::collections::VecDeque::new(),
                bytes: 0,
                opening: 0,
            })),
            pending: None,
            buf: vec![0; CHUNK],
        }
    }

    /// The next piece of the stream, or `None` when everything written so far was read.
    pub fn read(&mut self) -> io::Result<Option<LogChunk>> {
        // Times this read waited for a filler (below).
        let mut waited = 0u32;
        loop {
            let Some(current) = self.current.as_mut() else {
                if !self.open_first()? {
                    return Ok(None);
                }
                continue;
            };
            let n = current.file.read(&mut self.buf)?;
            if n > 0 {
                let chunk = LogChunk::Data(self.buf[..n].to_vec());
                // An error opening a file ahead (a link planted further on) is met
                // again, and reported, when the reader gets to that file: the chunk
                // read is not lost to it.
                let _ = self.open_ahead();
                return Ok(Some(chunk));
            }
            // End of the current file. If the next one was found before this read,
            // the current one was complete and is now drained: move on.
            if let Some(next) = self.pending.take() {
                self.current = Some(next.open);
                if next.skipped > 0 {
                    return Ok(Some(LogChunk::Skipped(next.skipped)));
                }
                continue;
            }
            let Some(index) = current.index else {
                return Ok(None);
            };
            if let Some(open) = lock(&self.ahead).pop() {
                self.pending = Some(Pending { open, skipped: 0 });
                continue;
            }
            // Nothing held ahead: look for the next file ourselves, without the lock
            // (a directory look can be slow), then settle with the inotify reader
            // thread, which may have opened that same next file meanwhile.
            let found = find_after(&self.base, index)?;
            let mut ahead = lock(&self.ahead);
            if let Some(open) = ahead.pop() {
                self.pending = Some(Pending { open, skipped: 0 });
                continue;
            }
            if found.as_ref().is_some_and(|f| f.skipped > 0)
                && ahead.opening > 0
                && waited < FILLER_WAITS
            {
                // A filler may hold the file after `index` open, deleted since: let it
                // add it rather than skip it (its open is one short system call, which
                // does not wait even for a lease the task put on the file; bounded all
                // the same, at about 100 ms).
                drop(ahead);
                waited += 1;
                if waited < 16 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                continue;
            }
            match found {
                // The writer may have appended to the current file between our read
                // and its creating the next one: read the current file once more.
                Some(next) => {
                    // Nothing was added ahead meanwhile, so nothing is held past
                    // `index`: the found file (or a later one, after a skip) is next.
                    ahead.last = next.open.index;
                    self.pending = Some(next);
                }
                None => return Ok(None),
            }
        }
    }

    /// Where the chunk [`LogReader::read`] returned last ends (for a
    /// [`LogChunk::Skipped`], the start of the file read next); `None` before the
    /// first file is open.
    pub fn position(&mut self) -> io::Result<Option<FilePosition>> {
        let Some(current) = self.current.as_mut() else {
            return Ok(None);
        };
        Ok(Some(FilePosition {
            index: current.index,
            offset: current.file.stream_position()?,
        }))
    }

    /// A handle the inotify reader fills this reader's files ahead through.
    pub(crate) fn ahead_handle(&self) -> AheadHandle {
        AheadHandle {
            base: self.base.clone(),
            ahead: std::sync::Arc::downgrade(&self.ahead),
        }
    }

    /// Open the files after the current one that exist now, up to [`LOOKAHEAD`] files
    /// and [`LOOKAHEAD_BYTES`], so that rotation cannot delete them before they are
    /// read. Cheap when there is nothing new (one failed `open`); call it while
    /// waiting, too.
    pub fn open_ahead(&mut self) -> io::Result<()> {
        fill_ahead(&self.ahead, &self.base)
    }

    /// Open the file to start from; `false` when the stream has no file yet.
    fn open_first(&mut self) -> io::Result<bool> {
        loop {
            let Some((dir, stem)) = open_dir(&self.base)? else {
                self.start = Some(LogStart::Beginning);
                return Ok(false);
            };
            let files: Vec<(Option<u64>, OsString)> = {
                let numbered = log_files_in(&dir, stem)?;
                if numbered.is_empty() && is_file(&dir, stem)? {
                    vec![(None, stem.to_owned())]
                } else {
                    numbered.into_iter().map(|(i, p)| (Some(i), p)).collect()
                }
            };
            if files.is_empty() {
                // Nothing written yet: whatever comes is read from its beginning.
                self.start = Some(LogStart::Beginning);
                return Ok(false);
            }
            let (at, pos) = match self.start.unwrap_or_default() {
                LogStart::Beginning => (0, 0),
                LogStart::Offset(n) => offset_position(&dir, &files, n)?,
                LogStart::Tail(n) => tail_position(&dir, &files, n)?,
                LogStart::FromEnd(n) => end_position(&dir, &files, n)?,
            };
            let (index, name) = &files[at];
            match open_log(&dir, name) {
                Ok(mut file) => {
                    file.seek(SeekFrom::Start(pos))?;
                    lock(&self.ahead).last = *index;
                    self.current = Some(OpenFile {
                        index: *index,
                        file,
                        counted: 0,
                        _slot: None,
                    });
                    self.start = None;
                    return Ok(true);
                }
                // Rotated away between listing and opening: look again.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The file that follows `index`: `index + 1`, or, when rotation deleted that one
/// already, the oldest present after it (with how many were skipped).
fn find_after(base: &Path, index: u64) -> io::Result<Option<Pending>> {
    // Nothing follows the last index there is (a task can plant that name).
    let Some(next) = index.checked_add(1) else {
        return Ok(None);
    };
    let Some((dir, stem)) = open_dir(base)? else {
        return Ok(None);
    };
    match open_log(&dir, &part(stem, next)) {
        Ok(file) => {
            return Ok(Some(Pending {
                open: OpenFile {
                    index: Some(next),
                    file,
                    counted: 0,
                    _slot: None,
                },
                skipped: 0,
            }));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    loop {
        let Some((next, name)) = log_files_in(&dir, stem)?
            .into_iter()
            .find(|(i, _)| *i > index)
        else {
            return Ok(None);
        };
        match open_log(&dir, &name) {
            Ok(file) => {
                return Ok(Some(Pending {
                    open: OpenFile {
                        index: Some(next),
                        file,
                        counted: 0,
                        _slot: None,
                    },
                    skipped: next - index - 1,
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The log directory of the stream at `base` (refused if it is a link) and the
/// stream's name in it; `None` while the directory does not exist.
fn open_dir(base: &Path) -> io::Result<Option<(Dir, &OsStr)>> {
    let (Some(dir), Some(stem)) = (base.parent(), base.file_name()) else {
        return Ok(None);
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    match Dir::open(dir) {
        Ok(d) => Ok(Some((d, stem))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// `<stem>.<index>`.
fn part(stem: &OsStr, index: u64) -> OsString {
    let mut name = stem.to_owned();
    name.push(format!(".{index}"));
    name
}

/// A log file, for reading: a regular file with one name, reached through no link.
fn open_log(dir: &Dir, name: &OsStr) -> io::Result<File> {
    dir.open_file(name, &OpenOptions::new().read(true).single_link(true))
}

/// Whether `name` in `dir` is a regular file (a link is not).
fn is_file(dir: &Dir, name: &OsStr) -> io::Result<bool> {
    match dir.metadata(name) {
        Ok(m) => Ok(m.kind == FileKind::File),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn file_len(dir: &Dir, name: &OsStr) -> io::Result<u64> {
    match dir.metadata(name) {
        Ok(m) => Ok(m.len),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// File (position in `files`) and byte position `offset` bytes into the stream.
fn offset_position(
    dir: &Dir,
    files: &[(Option<u64>, OsString)],
    mut offset: u64,
) -> io::Result<(usize, u64)> {
    for (at, (_, name)) in files.iter().enumerate() {
        let len = file_len(dir, name)?;
        if offset < len {
            return Ok((at, offset));
        }
        offset -= len;
    }
    let last = files.len() - 1;
    Ok((last, file_len(dir, &files[last].1)?))
}

/// File and byte position `back` bytes before the end of the stream, or its very
/// beginning when it is shorter.
fn end_position(
    dir: &Dir,
    files: &[(Option<u64>, OsString)],
    mut back: u64,
) -> io::Result<(usize, u64)> {
    for (at, (_, name)) in files.iter().enumerate().rev() {
        let len = file_len(dir, name)?;
        if back <= len {
            return Ok((at, len - back));
        }
        back -= len;
    }
    Ok((0, 0))
}

/// The most a tail looks back: what a stream can hold
/// ([`drover_api::MAX_LOG_MB_PER_STREAM`]). Only files a task planted (a sparse
/// file of 2^63 bytes without a newline, say) are longer; the tail then starts there,
/// instead of a reader thread going through them for ever.
const TAIL_SCAN_MAX: u64 = drover_api::MAX_LOG_MB_PER_STREAM * 1024 * 1024;

/// File and byte position where the last `lines` lines start. A newline ending the
/// stream ends the last line; it does not start an empty one.
fn tail_position(
    dir: &Dir,
    files: &[(Option<u64>, OsString)],
    lines: u64,
) -> io::Result<(usize, u64)> {
    tail_position_within(dir, files, lines, TAIL_SCAN_MAX)
}

/// [`tail_position`], looking back at most `scan_max` bytes (rounded up to a block).
fn tail_position_within(
    dir: &Dir,
    files: &[(Option<u64>, OsString)],
    lines: u64,
    scan_max: u64,
) -> io::Result<(usize, u64)> {
    const BLOCK: u64 = 64 * 1024;
    let last = files.len() - 1;
    if lines == 0 {
        return Ok((last, file_len(dir, &files[last].1)?));
    }
    let mut remaining = lines;
    let mut at_stream_end = true;
    let mut block = vec![0u8; BLOCK as usize];
    let mut scanned = 0u64;
    for (at, (_, name)) in files.iter().enumerate().rev() {
        let mut file = match open_log(dir, name) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut end = file.metadata()?.len();
        while end > 0 {
            if scanned >= scan_max {
                return Ok((at, end));
            }
            let start = end.saturating_sub(BLOCK);
            scanned += end - start;
            let len = (end - start) as usize;
            file.seek(SeekFrom::Start(start))?;
            file.read_exact(&mut block[..len])?;
            for i in (0..len).rev() {
                let newline = block[i] == b'\n';
                if std::mem::take(&mut at_stream_end) && newline {
                    continue;
                }
                if newline {
                    remaining -= 1;
                    if remaining == 0 {
                        return Ok((at, start + i as u64 + 1));
                    }
                }
            }
            end = start;
        }
    }
    Ok((0, 0))
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    use drover_plugin_sdk::LogConfig;
    use drover_plugin_sdk::logs::{RotatingWriter, log_files};

    use super::*;

    const MIB: usize = 1024 * 1024;

    fn limits() -> LogConfig {
        LogConfig::new(3, 1)
    }

    /// Read everything available now.
    fn drain(r: &mut LogReader) -> (Vec<u8>, Vec<u64>) {
        let (mut data, mut skips) = (Vec::new(), Vec::new());
        while let Some(c) = r.read().unwrap() {
            match c {
                LogChunk::Data(d) => data.extend(d),
                LogChunk::Skipped(n) => skips.push(n),
            }
        }
        (data, skips)
    }

    #[test]
    fn reads_across_rotations_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, limits().with_max_files(10)).unwrap();
        let mut want = Vec::new();
        for i in 0..300_000 {
            let line = format!("line {i}\n");
            want.extend_from_slice(line.as_bytes());
            w.write_all(line.as_bytes()).unwrap();
        }
        assert!(log_files(&base).unwrap().len() > 1);
        let mut r = LogReader::new(&base, LogStart::Beginning);
        let (data, skips) = drain(&mut r);
        assert!(skips.is_empty());
        assert!(data == want, "stream differs from what was written");
        // Nothing more until something is written; then exactly that.
        assert_eq!(r.read().unwrap(), None);
        w.write_all(b"more\n").unwrap();
        assert_eq!(drain(&mut r).0, b"more\n");
    }

    #[test]
    fn files_removed_before_they_were_read_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, limits()).unwrap();
        w.write_all(&vec![b'a'; MIB + MIB / 2]).unwrap();
        let mut r = LogReader::new(&base, LogStart::Beginning);
        let Some(LogChunk::Data(first)) = r.read().unwrap() else {
            panic!("no data")
        };
        // The writer outpaces the reader: files 1..=8 are deleted before it gets there.
        w.write_all(&vec![b'b'; 10 * MIB]).unwrap();
        assert_eq!(
            log_files(&base)
                .unwrap()
                .iter()
                .map(|(i, _)| *i)
                .collect::<Vec<_>>(),
            [9, 10, 11]
        );
        let mut rest = Vec::new();
        let mut events = Vec::new();
        while let Some(c) = r.read().unwrap() {
            match c {
                LogChunk::Data(d) => {
                    if events.last() != Some(&"data") {
                        events.push("data");
                    }
                    rest.extend(d);
                }
                LogChunk::Skipped(n) => {
                    // File 1 was opened ahead while it existed, so it is not lost.
                    assert_eq!(n, 7, "files 2..=8");
                    events.push("skip");
                }
            }
        }
        // Files 0 and 1 are read to their end through descriptors opened before they
        // were deleted, then the skip, then files 9, 10 and 11.
        assert_eq!(events, ["data", "skip", "data"]);
        let mut all = first;
        all.extend(rest);
        assert_eq!(all.len(), 2 * MIB + 2 * MIB + MIB / 2);
        assert!(all[..MIB + MIB / 2].iter().all(|b| *b == b'a'));
        assert!(all[MIB + MIB / 2..].iter().all(|b| *b == b'b'));
    }

    /// A reader held up by its client (it only opens files ahead, as `send` does while
    /// it waits) loses nothing of a burst up to [`LOOKAHEAD_BYTES`]; past that, rotation
    /// wins and the gap is reported, so a stalled reader pins a bounded amount.
    #[test]
    fn a_held_up_reader_keeps_a_burst_up_to_the_byte_limit() {
        const MIB_U64: u64 = MIB as u64;
        for (burst_mib, lost) in [(40u64, false), (120, true)] {
            let dir = tempfile::tempdir().unwrap();
            let base = dir.path().join("stdout");
            let mut w = RotatingWriter::open(&base, limits()).unwrap();
            w.write_all(b"start\n").unwrap();
            let mut r = LogReader::new(&base, LogStart::Beginning);
            assert!(matches!(r.read().unwrap(), Some(LogChunk::Data(_))));
            for _ in 0..burst_mib {
                w.write_all(&vec![b'x'; MIB]).unwrap();
                r.open_ahead().unwrap();
            }
            let held = lock(&r.ahead).bytes;
            assert!(held <= LOOKAHEAD_BYTES, "{held}");
            let (data, skips) = drain(&mut r);
            assert_eq!(
                skips.is_empty(),
                !lost,
                "burst of {burst_mib} MiB: {skips:?}"
            );
            if !lost {
                assert_eq!(data.len() as u64, burst_mib * MIB_U64);
            }
            assert!(
                data.len() as u64 <= LOOKAHEAD_BYTES + 5 * MIB_U64,
                "pinned {} bytes",
                data.len()
            );
        }
    }

    #[test]
    fn tail_and_offset_start_where_asked() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stderr");
        let mut w = RotatingWriter::open(&base, limits().with_max_files(10)).unwrap();
        let mut all = String::new();
        for i in 0..200_000 {
            all.push_str(&format!("{i}\n"));
        }
        w.write_all(all.as_bytes()).unwrap();
        assert!(log_files(&base).unwrap().len() > 1);
        let tail =
            |n| String::from_utf8(drain(&mut LogReader::new(&base, LogStart::Tail(n))).0).unwrap();
        assert_eq!(tail(3), "199997\n199998\n199999\n");
        assert_eq!(tail(0), "");
        assert_eq!(tail(1_000_000), all);
        // A line that crosses a file boundary counts once.
        let boundary_line = all[..MIB].rsplit('\n').next().unwrap().to_owned();
        let lines_after: u64 = all[MIB..].matches('\n').count() as u64;
        let t = tail(lines_after);
        assert!(t.starts_with(&boundary_line), "{:?}", &t[..20]);
        // An unterminated last line is a line.
        w.write_all(b"partial").unwrap();
        assert_eq!(tail(2), "199999\npartial");
        let from = |n| drain(&mut LogReader::new(&base, LogStart::Offset(n))).0;
        assert_eq!(
            from(MIB as u64 + 3),
            all.as_bytes()[MIB + 3..]
                .iter()
                .chain(b"partial")
                .copied()
                .collect::<Vec<_>>()
        );
        assert!(from(1 << 40).is_empty());
    }

    /// Nomad's `origin=end&offset=N`: N bytes before the end, across file boundaries;
    /// each chunk says where it ends (the file and the byte after it), which Nomad's
    /// frames carry.
    #[test]
    fn from_end_starts_that_many_bytes_before_the_end_and_chunks_say_where_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, limits().with_max_files(10)).unwrap();
        let all: Vec<u8> = (0..MIB + MIB / 2).map(|i| b'a' + (i % 26) as u8).collect();
        w.write_all(&all).unwrap();
        assert_eq!(log_files(&base).unwrap().len(), 2);
        let from_end = |n: usize| drain(&mut LogReader::new(&base, LogStart::FromEnd(n as u64))).0;
        assert_eq!(from_end(0), b"");
        assert_eq!(from_end(5), &all[all.len() - 5..]);
        assert_eq!(from_end(MIB / 2 + 7), &all[all.len() - MIB / 2 - 7..]);
        assert_eq!(from_end(1 << 40), all);
        let mut r = LogReader::new(&base, LogStart::FromEnd(5));
        assert_eq!(r.position().unwrap(), None);
        assert!(matches!(r.read().unwrap(), Some(LogChunk::Data(d)) if d.len() == 5));
        assert_eq!(
            r.position().unwrap(),
            Some(FilePosition {
                index: Some(1),
                offset: (MIB / 2) as u64
            })
        );
    }

    #[test]
    fn a_plain_file_is_a_stream_of_one() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut r = LogReader::new(&base, LogStart::Tail(1));
        assert_eq!(r.read().unwrap(), None);
        std::fs::write(&base, "a\nb\n").unwrap();
        // Nothing had been written when the reader started: it reads from the beginning.
        assert_eq!(drain(&mut r).0, b"a\nb\n");
        let mut r = LogReader::new(&base, LogStart::Tail(1));
        assert_eq!(drain(&mut r).0, b"b\n");
    }

    /// 50 MB of numbered lines through 1 MiB × 3 files, written by another thread as
    /// fast as it can while the reader follows: every line arrives once and in order,
    /// and a gap is only ever where the reader reported one.
    #[test]
    fn follower_keeps_up_with_a_fast_writer() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        const LINES: u64 = 5_000_000; // "%09d\n": 10 bytes each, 50 MB
        let writer = {
            let base = base.clone();
            std::thread::spawn(move || {
                let mut w = RotatingWriter::open(&base, limits()).unwrap();
                let mut batch = String::with_capacity(64 * 1024);
                for i in 1..=LINES {
                    batch.push_str(&format!("{i:09}\n"));
                    if batch.len() >= 60 * 1024 {
                        w.write_all(batch.as_bytes()).unwrap();
                        batch.clear();
                    }
                }
                w.write_all(batch.as_bytes()).unwrap();
            })
        };
        // Collect first, check afterwards: the reader is what is under test here, not
        // the speed of the checking code.
        let mut r = LogReader::new(&base, LogStart::Beginning);
        let mut segments: Vec<(u64, Vec<u8>)> = vec![(0, Vec::new())];
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut writer_done = false;
        loop {
            assert!(Instant::now() < deadline, "follower stalled");
            match r.read().unwrap() {
                Some(LogChunk::Data(d)) => segments.last_mut().unwrap().1.extend(d),
                Some(LogChunk::Skipped(n)) => segments.push((n, Vec::new())),
                // Everything written before the writer finished has been read.
                None if writer_done => break,
                None if writer.is_finished() => writer_done = true,
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        writer.join().unwrap();

        let mut next = 1u64;
        let (mut skipped_files, mut lines_lost) = (0, 0);
        for (i, (skipped, mut data)) in segments.into_iter().enumerate() {
            if i > 0 {
                assert!(skipped > 0);
                skipped_files += skipped;
                // The segment starts where a file starts, usually inside a line.
                let nl = data
                    .iter()
                    .position(|b| *b == b'\n')
                    .expect("a line after a skip");
                if nl != 9 {
                    data.drain(..=nl);
                }
            }
            assert_eq!(
                data.len() % 10,
                0,
                "segment {i} does not end with a whole line"
            );
            for line in data.chunks(10) {
                let n: u64 = std::str::from_utf8(&line[..9])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| {
                        panic!(
                            "garbled line {:?} after {}",
                            String::from_utf8_lossy(line),
                            next - 1
                        )
                    });
                if n != next {
                    // Only right after a reported skip may lines be missing.
                    assert!(
                        i > 0 && n > next && line.as_ptr() == data.as_ptr(),
                        "line {n} where {next} was due"
                    );
                    lines_lost += n - next;
                }
                assert_eq!(line[9], b'\n');
                next = n + 1;
            }
        }
        assert_eq!(
            next,
            LINES + 1,
            "the stream does not end with the last line"
        );
        eprintln!("followed {LINES} lines: {skipped_files} files skipped, {lines_lost} lines lost");
    }

    /// `logs -f` of the stream at `base` from its beginning, until the sender fires (the
    /// task is dead) and all was read.
    pub(super) fn follow_until_dead(
        base: &Path,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::mpsc::Receiver<io::Result<LogChunk>>,
    ) {
        let (dead_tx, dead_rx) = tokio::sync::oneshot::channel::<()>();
        let rx = stream(
            base.to_owned(),
            LogStart::Beginning,
            FollowOptions {
                follow: true,
                ..Default::default()
            },
            async move {
                let _ = dead_rx.await;
            },
            Default::default(),
        );
        (dead_tx, rx)
    }

    #[tokio::test]
    async fn stream_ends_after_the_task_is_dead_and_all_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let (dead_tx, mut rx) = follow_until_dead(&base);
        let mut w = RotatingWriter::open(&base, limits()).unwrap();
        w.write_all(b"one\n").unwrap();
        assert_eq!(
            rx.recv().await.unwrap().unwrap(),
            LogChunk::Data(b"one\n".to_vec())
        );
        // Output written right before the exit is still delivered.
        w.write_all(b"two\n").unwrap();
        dead_tx.send(()).unwrap();
        let mut rest = Vec::new();
        let t = Instant::now();
        while let Some(c) = rx.recv().await {
            let LogChunk::Data(d) = c.unwrap() else {
                panic!("skip")
            };
            rest.extend(d);
        }
        assert_eq!(rest, b"two\n");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    /// A task plants a huge sparse log file (1 TiB) without a newline: a tail looks back no
    /// further than a stream can hold, and starts there, instead of reading it all.
    #[test]
    fn a_tail_looks_back_no_further_than_a_stream_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let huge = std::fs::File::create(tmp.path().join("stdout.0")).unwrap();
        huge.set_len(1 << 40).unwrap();
        std::fs::write(tmp.path().join("stdout.1"), "no newline either").unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        let files = vec![
            (Some(0), OsString::from("stdout.0")),
            (Some(1), OsString::from("stdout.1")),
        ];
        let (at, offset) = tail_position_within(&dir, &files, 10, 1 << 20).unwrap();
        assert_eq!(at, 0);
        // The last file whole, then 1 MiB of the planted one (in 64 KiB blocks).
        let looked = (1u64 << 40) - offset + 17;
        assert!(
            (1 << 20..(1 << 20) + 128 * 1024).contains(&looked),
            "{looked}"
        );
        // Lines within the bound are found as before.
        let (at, offset) = tail_position_within(&dir, &files, 0, 1 << 20).unwrap();
        assert_eq!((at, offset), (1, 17));
    }

    /// A task plants a file with the last index there is beside its log: it is read,
    /// and the stream ends there (nothing follows it), instead of the index wrapping
    /// round to 0 and the stream never ending (or, in a debug build, a panic).
    #[test]
    fn a_planted_last_index_ends_the_stream() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("stdout.0"), "zero\n").unwrap();
        std::fs::write(tmp.path().join(format!("stdout.{}", u64::MAX)), "last\n").unwrap();
        let mut r = LogReader::new(tmp.path().join("stdout"), LogStart::Beginning);
        let mut read = Vec::new();
        for _ in 0..10 {
            match r.read().unwrap() {
                Some(LogChunk::Data(d)) => read.extend(d),
                Some(LogChunk::Skipped(_)) => {}
                None => break,
            }
        }
        assert_eq!(read, b"zero\nlast\n");
        assert!(r.read().unwrap().is_none());
        r.open_ahead().unwrap();
        assert!(r.read().unwrap().is_none());
    }

    /// Files before a link the task planted further on are read whole (an error
    /// opening files ahead does not throw away the chunk just read); then the link
    /// ends the stream, saying why.
    #[test]
    fn output_before_a_planted_link_is_read_and_then_the_link_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "root only\n").unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        std::fs::write(logs.join("stdout.0"), "zero\n").unwrap();
        std::fs::write(logs.join("stdout.1"), "one\n").unwrap();
        std::os::unix::fs::symlink(&secret, logs.join("stdout.2")).unwrap();
        let mut r = LogReader::new(logs.join("stdout"), LogStart::Beginning);
        let mut read = Vec::new();
        let e = loop {
            match r.read() {
                Ok(Some(LogChunk::Data(d))) => read.extend(d),
                Ok(other) => panic!("{other:?}"),
                Err(e) => break e,
            }
        };
        // The files before the link are whole; the link ends the stream, with why.
        assert_eq!(read, b"zero\none\n");
        assert!(drover_plugin_sdk::taskdir::refusal(&e).is_some(), "{e}");
    }

    /// A task that can write its log directory replaces its log with a link to a
    /// root-only file, a hard link to it, or a FIFO: the reader refuses each (without
    /// hanging on the FIFO) and never returns the file's bytes, whatever the start.
    #[test]
    fn planted_links_and_fifos_are_refused_not_read() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "root only\n").unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let base = logs.join("stdout");
        let starts = [LogStart::Beginning, LogStart::Tail(1), LogStart::Offset(1)];
        let check = |what: &str| {
            for start in starts {
                let mut r = LogReader::new(&base, start);
                let e = r.read().expect_err(what);
                assert!(
                    drover_plugin_sdk::taskdir::refusal(&e).is_some(),
                    "{what}: {e}"
                );
                assert!(!e.to_string().contains("root only"), "{e}");
            }
        };
        symlink(&secret, logs.join("stdout.0")).unwrap();
        check("a symbolic link");
        std::fs::remove_file(logs.join("stdout.0")).unwrap();
        std::fs::hard_link(&secret, logs.join("stdout.0")).unwrap();
        check("a hard link");
        std::fs::remove_file(logs.join("stdout.0")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            logs.join("stdout.0"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        check("a FIFO");
        std::fs::remove_file(logs.join("stdout.0")).unwrap();
        // A link as the next file while following: refused when reached.
        std::fs::write(logs.join("stdout.0"), "mine\n").unwrap();
        let mut r = LogReader::new(&base, LogStart::Beginning);
        assert_eq!(r.read().unwrap(), Some(LogChunk::Data(b"mine\n".to_vec())));
        symlink(&secret, logs.join("stdout.1")).unwrap();
        assert!(r.read().is_err());
        // The log directory itself a link: refused too.
        std::fs::remove_file(logs.join("stdout.1")).unwrap();
        let moved = tmp.path().join("moved");
        std::fs::rename(&logs, &moved).unwrap();
        std::fs::write(moved.join("stdout.0"), "root only\n").unwrap();
        symlink(&moved, &logs).unwrap();
        check("a linked directory");
    }
}
