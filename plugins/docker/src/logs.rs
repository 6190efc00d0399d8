//! The container's output into the task's rotated log files: where they are, and what
//! writes them.
//!
//! Docker keeps the output (json-file driver, small); a follower per task (the loop is
//! in `follower`) reads it with timestamps and writes stdout and stderr, through a
//! [`Sink`], with the SDK's [`RotatingWriter`]. A cursor file next to the logs holds
//! the container id, a second to read again from and how many of the messages written
//! were stamped at or after it (see [`Cursor`]).
//! A follower started by a new plugin process, or a read after a follow that ended,
//! asks Docker for the output since that second and skips that many messages, so
//! lines are neither lost nor repeated.
//! The cursor also records where each log stream ended after the last message it
//! counts: a plugin killed between writing a message and updating the cursor left
//! bytes past that point, and the next follower cuts them off before it replays the
//! message, so it is in the files once.
//!
//! The log directory is the task's (a container may even have been given a bind
//! mount of it by an older plugin): the log files and the cursor are opened beneath
//! its descriptor through [`drover_plugin_sdk::taskdir`], so a link planted there is
//! refused, never written through as root.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bollard::container::LogOutput;
use drover_plugin_sdk::LogConfig;
use drover_plugin_sdk::logs::{LogPosition, RotatingWriter, roll_back};
use drover_plugin_sdk::taskdir::{Dir, OpenOptions};

/// Name of the cursor file, in the directory of the stdout (else stderr) log files.
/// It does not look like a log file, so log readers skip it.
pub const CURSOR_FILE: &str = ".docker-logs.cursor";

/// Where a task's output goes.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogTarget {
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub limits: LogConfig,
}

impl LogTarget {
    /// Nothing to write: both paths are empty.
    pub(crate) fn discard(&self) -> bool {
        self.stdout.as_os_str().is_empty() && self.stderr.as_os_str().is_empty()
    }

    #[cfg(test)]
    pub(crate) fn cursor_path(&self) -> Option<PathBuf> {
        self.cursor_dir().map(|dir| dir.join(CURSOR_FILE))
    }

    /// The directory holding the cursor file: the log directory.
    fn cursor_dir(&self) -> Option<&Path> {
        [&self.stdout, &self.stderr]
            .into_iter()
            .find(|p| !p.as_os_str().is_empty())
            .and_then(|p| p.parent())
    }

    /// The cursor file, opened (created 0600) beneath the log directory's descriptor:
    /// never through a link, and only a regular file with one name.
    fn open_cursor(&self) -> std::io::Result<Option<(PathBuf, File)>> {
        let Some(dir) = self.cursor_dir() else {
            return Ok(None);
        };
        let path = dir.join(CURSOR_FILE);
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create(0o600)
            .single_link(true);
        let file = Dir::open(dir)
            .and_then(|d| d.open_file(CURSOR_FILE, &opts))
            .map_err(|e| in_file(&path, e))?;
        Ok(Some((path, file)))
    }
}

/// Where a read of the container's logs resumes without losing or repeating a message.
///
/// Docker filters a read by `since` (whole seconds: every message stamped at or after
/// it, in the log's order), and its timestamps are not monotonic in that order: stdout
/// and stderr are stamped by separate copiers, so a message can follow one stamped
/// later (seen under load: a replay that compared timestamps wrote a line twice). The
/// cursor therefore never compares timestamps with each other. It keeps a second
/// `since`, one before the newest second written, and how many of the messages written
/// were stamped in `since` and in `since + 1` (no written message is newer). What was
/// written is a prefix of the log, so its part stamped at or after `since` is exactly
/// what a read from `since` delivers first: a replay skips that many messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// The second reads resume from; `None` before the first message (read it all).
    since: Option<i64>,
    /// Messages written that were stamped in `since` and in `since + 1`.
    counts: [u64; 2],
    /// Messages a read that just started still skips: written already.
    skip: u64,
}

impl Cursor {
    /// Parse the cursor file's line for `container`: `None` for another container's
    /// line or anything unreadable, including an older plugin's format (the task's
    /// output is then read from its start again).
    fn parse(text: &str, container: &str) -> Option<Saved> {
        let mut f = text.lines().next()?.split_whitespace();
        if f.next()? != container {
            return None;
        }
        let since = f.next()?;
        let numbers: Vec<u64> = f.map(|n| n.parse::<u64>().ok()).collect::<Option<_>>()?;
        let [c0, c1, oi, ol, ei, el] = numbers[..] else {
            return None;
        };
        let cursor = if since == NO_MESSAGE {
            Cursor::default()
        } else {
            Cursor {
                since: Some(since.parse::<i64>().ok()?),
                counts: [c0, c1],
                skip: 0,
            }
        };
        let ends = (
            LogPosition { index: oi, len: ol },
            LogPosition { index: ei, len: el },
        );
        Some(Saved { cursor, ends })
    }

    /// A read from [`Cursor::since`] is about to start: the messages it delivers first
    /// are the ones already written.
    fn rewind(&mut self) {
        self.skip = self.counts[0] + self.counts[1];
    }

    /// The whole second to ask Docker for output since (0: everything).
    fn since(&self) -> i32 {
        self.since
            .and_then(|s| i32::try_from(s.max(0)).ok())
            .unwrap_or(0)
    }

    /// Whether the next message a read delivers, stamped `at`, is new; counts it if so.
    fn accept(&mut self, at: SystemTime) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        let second = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        match self.since {
            None => {
                self.since = Some(second - 1);
                self.counts = [0, 1];
            }
            // Stamped before `since`: a read from `since` never delivers it again.
            Some(since) if second < since => {}
            Some(since) if second <= since + 1 => {
                self.counts[usize::from(second > since)] += 1;
            }
            // A newer second: `since` moves to the one before it, keeping the count of
            // the second that stays in the window.
            Some(since) => {
                let kept = if second - 1 == since + 1 {
                    self.counts[1]
                } else {
                    0
                };
                self.since = Some(second - 1);
                self.counts = [kept, 1];
            }
        }
        true
    }
}

/// What the cursor file holds for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Saved {
    cursor: Cursor,
    /// Where stdout and stderr ended after the last message the cursor counts.
    ends: (LogPosition, LogPosition),
}

/// The cursor's timestamp before the first message.
const NO_MESSAGE: &str = "-";

/// Split Docker's `<timestamp> <message>` frame.
fn split_timestamp(frame: &[u8]) -> Option<(&str, SystemTime, &[u8])> {
    let space = frame.iter().position(|b| *b == b' ')?;
    let raw = std::str::from_utf8(&frame[..space]).ok()?;
    let at = humantime::parse_rfc3339(raw).ok()?;
    Some((raw, at, &frame[space + 1..]))
}

/// The open log files and cursor of one task.
pub(crate) struct Sink {
    container: String,
    stdout: Option<RotatingWriter>,
    stderr: Option<RotatingWriter>,
    cursor: Cursor,
    cursor_file: Option<(PathBuf, File)>,
}

fn open_writer(base: &Path, limits: LogConfig) -> std::io::Result<Option<RotatingWriter>> {
    if base.as_os_str().is_empty() {
        return Ok(None);
    }
    RotatingWriter::open(base, limits).map(Some)
}

impl Sink {
    pub(crate) fn open(target: &LogTarget, container: &str) -> std::io::Result<Sink> {
        let cursor_file = target.open_cursor()?;
        let saved = cursor_file.as_ref().and_then(|(_, file)| {
            let mut text = String::new();
            (&*file).read_to_string(&mut text).ok()?;
            Cursor::parse(&text, container)
        });
        if let Some((stdout, stderr)) = saved.as_ref().map(|s| s.ends) {
            for (base, to) in [(&target.stdout, stdout), (&target.stderr, stderr)] {
                if base.as_os_str().is_empty() {
                    continue;
                }
                match roll_back(base, to).map_err(|e| in_file(base, e))? {
                    Some(0) => {}
                    Some(cut) => tracing::info!(
                        "{}: cut {cut} bytes the previous plugin process wrote without \
                         recording them; they are written again",
                        base.display()
                    ),
                    None => tracing::info!(
                        "{}: the previous plugin process died in the middle of a log file \
                         rotation; its last message may appear twice",
                        base.display()
                    ),
                }
            }
        }
        let stdout = open_writer(&target.stdout, target.limits)?;
        let stderr = open_writer(&target.stderr, target.limits)?;
        let sink = Sink {
            container: container.to_owned(),
            stdout,
            stderr,
            cursor: saved.map(|s| s.cursor).unwrap_or_default(),
            cursor_file,
        };
        // Record where the streams are before the first message, so that even that
        // one can be cut off if this process dies before counting it.
        sink.save()?;
        Ok(sink)
    }

    /// A read of the container's logs is about to start: returns the whole second to
    /// ask Docker for output since (0: everything); the messages that read delivers
    /// first, written already, are skipped.
    pub(crate) fn start_read(&mut self) -> i32 {
        self.cursor.rewind();
        self.cursor.since()
    }

    pub(crate) fn write(&mut self, out: LogOutput) -> std::io::Result<()> {
        let (frame, to_stdout) = match &out {
            LogOutput::StdOut { message } => (message, true),
            LogOutput::StdErr { message } => (message, false),
            LogOutput::StdIn { .. } | LogOutput::Console { .. } => return Ok(()),
        };
        let Some((_, at, message)) = split_timestamp(frame) else {
            tracing::debug!("log frame without a timestamp skipped");
            return Ok(());
        };
        if !self.cursor.accept(at) {
            return Ok(());
        }
        let writer = if to_stdout {
            self.stdout.as_mut()
        } else {
            self.stderr.as_mut()
        };
        if let Some(w) = writer {
            w.write_all(message)?;
        }
        self.save()
    }

    /// The cursor file's line: fixed width, so that overwriting it in place never
    /// leaves a tail of an older, longer one, and written with one `pwrite`.
    fn line(&self) -> String {
        let end = |w: &Option<RotatingWriter>| {
            w.as_ref().map(RotatingWriter::position).unwrap_or_default()
        };
        let (out, err) = (end(&self.stdout), end(&self.stderr));
        let since = match self.cursor.since {
            Some(s) => s.to_string(),
            None => NO_MESSAGE.to_owned(),
        };
        let [c0, c1] = self.cursor.counts;
        format!(
            "{:<64} {since:<20} {c0:020} {c1:020} {:020} {:020} {:020} {:020}\n",
            self.container, out.index, out.len, err.index, err.len
        )
    }

    fn save(&self) -> std::io::Result<()> {
        match &self.cursor_file {
            Some((path, file)) => file
                .write_all_at(self.line().as_bytes(), 0)
                .map_err(|e| in_file(path, e)),
            None => Ok(()),
        }
    }
}

fn in_file(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Remove a destroyed task's cursor file.
pub(crate) fn remove_cursor(target: &LogTarget) {
    if let Some(dir) = target.cursor_dir() {
        let _ = Dir::open(dir).and_then(|d| d.remove_file(CURSOR_FILE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const CID: &str = "c0ffee";

    fn frame(ts: &str, msg: &str) -> Bytes {
        Bytes::from(format!("{ts} {msg}"))
    }

    fn out(ts: &str, msg: &str) -> LogOutput {
        LogOutput::StdOut {
            message: frame(ts, msg),
        }
    }

    fn err(ts: &str, msg: &str) -> LogOutput {
        LogOutput::StdErr {
            message: frame(ts, msg),
        }
    }

    fn target(dir: &Path) -> LogTarget {
        LogTarget {
            stdout: dir.join("stdout"),
            stderr: dir.join("stderr"),
            limits: LogConfig::default(),
        }
    }

    const T1: &str = "2024-05-01T10:00:00.000000001Z";
    const T2: &str = "2024-05-01T10:00:00.000000002Z";
    const T3: &str = "2024-05-01T10:00:01.500000000Z";

    #[test]
    fn resumed_sink_neither_loses_nor_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let t = target(dir.path());
        // Docker's whole output, in order; two messages share a timestamp.
        let all = || {
            vec![
                out(T1, "a\n"),
                err(T2, "b\n"),
                out(T2, "c\n"),
                out(T3, "d\n"),
            ]
        };

        let mut first = Sink::open(&t, CID).unwrap();
        for o in all().into_iter().take(2) {
            first.write(o).unwrap();
        }
        drop(first);
        // A new process asks for everything since the cursor's second and is given
        // the whole output again.
        let mut second = Sink::open(&t, CID).unwrap();
        // One second before the newest one written (T2's).
        assert_eq!(second.cursor.since(), 1_714_557_599);
        second.cursor.rewind();
        for o in all() {
            second.write(o).unwrap();
        }
        drop(second);
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        assert_eq!(read("stdout.0"), "a\nc\nd\n");
        assert_eq!(read("stderr.0"), "b\n");

        // Once more, with nothing new: nothing is written.
        let mut third = Sink::open(&t, CID).unwrap();
        third.cursor.rewind();
        for o in all() {
            third.write(o).unwrap();
        }
        assert_eq!(read("stdout.0"), "a\nc\nd\n");
        // The same process reading again (a follow that ended early) repeats nothing.
        third.cursor.rewind();
        for o in all() {
            third.write(o).unwrap();
        }
        third.write(out(T3, "e\n")).unwrap();
        assert_eq!(read("stdout.0"), "a\nc\nd\ne\n");
    }

    #[test]
    fn a_clock_stepping_back_mid_stream_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sink::open(&target(dir.path()), CID).unwrap();
        s.cursor.rewind();
        s.write(out(T3, "late\n")).unwrap();
        s.write(out(T1, "earlier clock\n")).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("stdout.0")).unwrap(),
            "late\nearlier clock\n"
        );
    }

    #[test]
    fn a_new_container_starts_a_new_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let t = target(dir.path());
        let mut s = Sink::open(&t, CID).unwrap();
        s.write(out(T3, "old\n")).unwrap();
        drop(s);
        // The next incarnation of the task (a restart) has another container.
        let mut s = Sink::open(&t, "other").unwrap();
        assert_eq!(s.cursor, Cursor::default());
        s.write(out(T1, "new\n")).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("stdout.0")).unwrap(),
            "old\nnew\n"
        );
    }

    #[test]
    fn cursor_line_is_fixed_width_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sink::open(&target(dir.path()), CID).unwrap();
        let empty = s.line();
        assert_eq!(
            Cursor::parse(&empty, CID),
            Some(Saved {
                cursor: Cursor::default(),
                ends: (LogPosition::default(), LogPosition::default()),
            })
        );
        s.write(out(T1, "w\n")).unwrap();
        s.write(out(T3, "x\n")).unwrap();
        s.write(err(T3, "yz\n")).unwrap();
        let line = s.line();
        assert_eq!(line.len(), empty.len());
        let back = Cursor::parse(&line, CID).unwrap();
        // T3's second is 1_714_557_601: the window is T1's second and T3's.
        assert_eq!(back.cursor.since, Some(1_714_557_600));
        assert_eq!(back.cursor.counts, [1, 2]);
        let end = |len| LogPosition { index: 0, len };
        assert_eq!(back.ends, (end(4), end(3)));
        assert_eq!(Cursor::parse(&line, "another"), None);
        assert_eq!(Cursor::parse("garbage", CID), None);
        // An older plugin's line (a timestamp and one count): read again from the start.
        assert_eq!(Cursor::parse(&format!("{CID} {T1} 4 0 2 0 3\n"), CID), None);
        assert_eq!(Cursor::parse(&format!("{CID} {T1} 4\n"), CID), None);
    }

    /// Docker stamps stdout and stderr in separate copiers: under load a message can
    /// follow one stamped later, within a second or across one. Reading again from the
    /// cursor (as after every follow that ends) repeats nothing and loses nothing.
    #[test]
    fn out_of_order_timestamps_are_neither_repeated_nor_lost() {
        const A: &str = "2024-05-01T10:00:00.900000000Z";
        const B: &str = "2024-05-01T10:00:01.100000000Z";
        const C: &str = "2024-05-01T10:00:01.000000000Z";
        const D: &str = "2024-05-01T10:00:02.500000000Z";
        const E: &str = "2024-05-01T10:00:02.400000000Z";
        let all = || {
            vec![
                out(A, "a\n"),
                out(B, "b\n"),
                err(C, "c\n"),
                out(D, "d\n"),
                err(E, "e\n"),
            ]
        };
        // Docker's read from a second: the messages stamped at or after it, in order.
        let since = |s: i32| {
            all()
                .into_iter()
                .filter(move |o| {
                    let (LogOutput::StdOut { message } | LogOutput::StdErr { message }) = o else {
                        unreachable!()
                    };
                    let (_, at, _) = split_timestamp(message).unwrap();
                    let secs = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
                    secs >= u64::try_from(s).unwrap()
                })
                .collect::<Vec<_>>()
        };
        for cut in 0..=5 {
            let dir = tempfile::tempdir().unwrap();
            let t = target(dir.path());
            let mut first = Sink::open(&t, CID).unwrap();
            for o in all().into_iter().take(cut) {
                first.write(o).unwrap();
            }
            // The same process reads again, then a new process does.
            first.cursor.rewind();
            for o in since(first.cursor.since()) {
                first.write(o).unwrap();
            }
            drop(first);
            let mut second = Sink::open(&t, CID).unwrap();
            second.cursor.rewind();
            for o in since(second.cursor.since()) {
                second.write(o).unwrap();
            }
            let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
            assert_eq!(read("stdout.0"), "a\nb\nd\n", "after {cut} messages");
            assert_eq!(read("stderr.0"), "c\ne\n", "after {cut} messages");
        }
    }

    /// The plugin dies after writing a message but before the cursor counts it (here:
    /// the cursor file is put back as it was before that message). The next process
    /// cuts the message off and writes it again: it is in the file once.
    #[test]
    fn a_message_written_but_not_counted_is_not_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let t = target(dir.path());
        let cursor_file = t.cursor_path().unwrap();
        let all = || vec![out(T1, "a\n"), out(T2, "b\n"), err(T3, "c\n")];
        for uncounted in 0..3 {
            let _ = std::fs::remove_dir_all(dir.path());
            std::fs::create_dir_all(dir.path()).unwrap();
            let mut first = Sink::open(&t, CID).unwrap();
            for o in all().into_iter().take(uncounted) {
                first.write(o).unwrap();
            }
            let before = std::fs::read(&cursor_file).unwrap();
            first.write(all().remove(uncounted)).unwrap();
            drop(first);
            std::fs::write(&cursor_file, before).unwrap();

            let mut second = Sink::open(&t, CID).unwrap();
            second.cursor.rewind();
            for o in all() {
                second.write(o).unwrap();
            }
            let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
            assert_eq!(read("stdout.0"), "a\nb\n", "uncounted message {uncounted}");
            assert_eq!(read("stderr.0"), "c\n", "uncounted message {uncounted}");
        }
    }

    #[test]
    fn frames_without_timestamps_are_skipped_and_discard_writes_nothing() {
        assert!(split_timestamp(b"no-timestamp here").is_none());
        let (raw, _, msg) = split_timestamp(b"2024-05-01T10:00:00.000000001Z hi there\n").unwrap();
        assert_eq!(raw, T1);
        assert_eq!(msg, b"hi there\n");
        let t = LogTarget::default();
        assert!(t.discard() && t.cursor_path().is_none());
    }
}
