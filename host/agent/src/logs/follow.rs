//! Following a task's log stream as the task writes: a [`LogReader`] driven by inotify
//! events in the log directory (polling as a fallback), its chunks sent to one client.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{AheadHandle, FilePosition, LogChunk, LogReader, LogStart, lock};

/// How a stream is served.
#[derive(Debug, Clone, Copy)]
pub struct FollowOptions {
    /// Keep reading as the task writes, until it is dead.
    pub follow: bool,
    /// How often to look for new data when there is none and the log directory cannot
    /// be watched (inotify); with a watch, how often to look once the task is dead.
    pub poll: Duration,
    /// After the task is dead, how long the stream must stay quiet before it ends:
    /// the driver may still be copying the task's last output from its pipe.
    pub settle: Duration,
}

impl Default for FollowOptions {
    fn default() -> Self {
        FollowOptions {
            follow: false,
            poll: Duration::from_millis(20),
            settle: Duration::from_millis(250),
        }
    }
}

/// Wakes a follower as soon as something happens in the log directory (a file is
/// written or created), instead of at its next poll. A fast writer rotating small
/// files can delete a file a few milliseconds after creating it; a follower woken
/// by the creation opens it first (it stays readable through our descriptor).
///
/// Every follower of the agent shares one inotify instance ([`Inotify`]): instances
/// count against `fs.inotify.max_user_instances` (128 per user by default), which the
/// agent shares with every other root daemon on the host, so one per follower let a
/// few hundred `logs -f` use them all up, host-wide.
struct DirWatch {
    inotify: Arc<Inotify>,
    wd: i32,
    /// This follower among the directory's fillers.
    id: u64,
    /// The directory's change counter; `changed` wakes on a change not yet seen.
    changes: tokio::sync::watch::Receiver<u64>,
}

/// The process's one inotify instance for log directories, read by a thread of its
/// own (so that it serves every runtime, and a test's runtime going away leaves it
/// working): each event bumps the change counter of its watch, which wakes that
/// directory's followers. A directory is watched once however many follow it; the
/// watch is removed when its last follower goes.
struct Inotify {
    fd: std::os::fd::OwnedFd,
    /// By watch descriptor. Watches are added and removed under this lock, so that the
    /// count and the kernel's watch agree.
    dirs: std::sync::Mutex<std::collections::HashMap<i32, Watched>>,
}

struct Watched {
    followers: usize,
    changes: tokio::sync::watch::Sender<u64>,
    /// The files ahead of each follower of the directory, by [`DirWatch::id`]: filled
    /// by the reader thread itself when a file is created (see [`super::Ahead`]).
    fillers: std::collections::HashMap<u64, AheadHandle>,
}

/// Numbers the [`DirWatch`]es.
static NEXT_WATCH_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The shared instance, made on first use; `None` again if its reader thread ended.
static INOTIFY: std::sync::Mutex<Option<Arc<Inotify>>> = std::sync::Mutex::new(None);

impl Inotify {
    fn shared() -> io::Result<Arc<Inotify>> {
        use rustix::fs::inotify::CreateFlags;
        let mut shared = lock(&INOTIFY);
        if let Some(i) = &*shared {
            return Ok(i.clone());
        }
        // Blocking reads: the reader thread waits in `read`.
        let fd = rustix::fs::inotify::init(CreateFlags::CLOEXEC)?;
        let inotify = Arc::new(Inotify {
            fd,
            dirs: std::sync::Mutex::new(std::collections::HashMap::new()),
        });
        let reader = inotify.clone();
        std::thread::Builder::new()
            .name("log-inotify".into())
            .spawn(move || reader.run())?;
        *shared = Some(inotify.clone());
        Ok(inotify)
    }

    /// Read events for ever: open the files created in a directory ahead of its
    /// followers, then wake the followers of each directory named.
    fn run(self: Arc<Self>) {
        use rustix::fs::inotify::ReadFlags;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = rustix::fs::inotify::Reader::new(&self.fd, &mut buf);
        let mut woken = Vec::new();
        let mut created = Vec::new();
        loop {
            match reader.next() {
                Ok(event) => {
                    woken.push(event.wd());
                    if event.events().intersects(
                        ReadFlags::CREATE | ReadFlags::MOVED_TO | ReadFlags::QUEUE_OVERFLOW,
                    ) {
                        created.push(event.wd());
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::warn!(
                        "the log directories' inotify reader failed: {e}; followers poll"
                    );
                    {
                        let mut shared = lock(&INOTIFY);
                        if shared.as_ref().is_some_and(|i| Arc::ptr_eq(i, &self)) {
                            *shared = None;
                        }
                    }
                    // Wake everyone once: they look again and then wait for their
                    // idle check.
                    for w in lock(&self.dirs).values() {
                        w.changes.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    return;
                }
            }
            if reader.is_buffer_empty() {
                if !created.is_empty() {
                    self.fill(&mut created);
                }
                let dirs = lock(&self.dirs);
                woken.sort_unstable();
                woken.dedup();
                // wd -1: the event queue overflowed; anything may have changed.
                let all = woken.first() == Some(&-1);
                for (wd, w) in dirs.iter() {
                    if all || woken.binary_search(wd).is_ok() {
                        w.changes.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                woken.clear();
            }
        }
    }
}

impl Inotify {
    /// Open the new files in the directories `created` names ahead of their
    /// followers. Here rather than in each follower: this thread is woken by the
    /// kernel the moment a file is created and does nothing else, where a follower
    /// may be busy sending to its client or wait for a runtime worker, and a fast
    /// writer rotating small files can create and delete a file in a few
    /// milliseconds.
    fn fill(&self, created: &mut Vec<i32>) {
        created.sort_unstable();
        created.dedup();
        // wd -1: the event queue overflowed; anything may have been created.
        let all = created.first() == Some(&-1);
        let fillers: Vec<AheadHandle> = lock(&self.dirs)
            .iter()
            .filter(|(wd, _)| all || created.binary_search(wd).is_ok())
            .flat_map(|(_, w)| w.fillers.values().cloned())
            .collect();
        created.clear();
        // Outside the directories' lock: this opens files.
        for filler in fillers {
            filler.fill();
        }
    }
}

/// With a [`DirWatch`], how often a quiet follower still looks at the task's state
/// and the stop signal.
const WATCHED_IDLE_CHECK: Duration = Duration::from_millis(100);

/// Without a [`DirWatch`] (no inotify, or no watch left: `fs.inotify.max_user_watches`),
/// the longest a quiet follower waits between polls. It starts at
/// [`FollowOptions::poll`] and doubles while nothing comes, so that hundreds of idle
/// followers do not each read fifty times a second; output resets it.
const UNWATCHED_MAX_POLL: Duration = Duration::from_millis(250);

/// After a wake-up, how long a follower lets more output gather before it reads: a
/// task writing many small lines would otherwise wake it once per write. Short
/// against the time a fast writer takes to fill and rotate away a log file.
const WAKE_BATCH: Duration = Duration::from_millis(2);

impl DirWatch {
    /// Watch `dir` on the shared instance, filling `ahead` as files are created.
    fn new(dir: &Path, ahead: AheadHandle) -> io::Result<DirWatch> {
        use rustix::fs::inotify::WatchFlags;
        let inotify = Inotify::shared()?;
        let mut dirs = lock(&inotify.dirs);
        // The same directory gives the same descriptor (the flags are the same each
        // time, so adding again changes nothing).
        let wd = rustix::fs::inotify::add_watch(
            &inotify.fd,
            dir,
            // A task may replace its logs dir with a link: never watch through one.
            WatchFlags::CREATE
                | WatchFlags::MODIFY
                | WatchFlags::MOVED_TO
                | WatchFlags::DONT_FOLLOW
                | WatchFlags::ONLYDIR,
        )?;
        let watched = dirs.entry(wd).or_insert_with(|| Watched {
            followers: 0,
            changes: tokio::sync::watch::channel(0).0,
            fillers: std::collections::HashMap::new(),
        });
        watched.followers += 1;
        let id = NEXT_WATCH_ID.fetch_add(1, Ordering::Relaxed);
        watched.fillers.insert(id, ahead);
        // What changed before this follower came is not news to it.
        let changes = watched.changes.subscribe();
        drop(dirs);
        Ok(DirWatch {
            inotify,
            wd,
            id,
            changes,
        })
    }

    /// Until something changed in the directory since the last call (or `limit`
    /// passed). Which file changed does not matter: the reader looks at the files
    /// again.
    async fn changed(&mut self, limit: Duration) {
        match tokio::time::timeout(limit, self.changes.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            // The watch is gone (cannot happen while we count as a follower): do not
            // spin.
            Ok(Err(_)) => tokio::time::sleep(limit).await,
        }
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        let mut dirs = lock(&self.inotify.dirs);
        if let Some(w) = dirs.get_mut(&self.wd) {
            w.followers -= 1;
            w.fillers.remove(&self.id);
            if w.followers == 0 {
                dirs.remove(&self.wd);
                // Fails when the kernel removed it already (the directory is gone).
                let _ = rustix::fs::inotify::remove_watch(&self.inotify.fd, self.wd);
            }
        }
    }
}

/// Watch `dir` into `watch`. `false` when it does not exist yet, to be tried again;
/// `true` when watched, or when it cannot be (said once, loudly) and the follower
/// polls for good.
fn try_watch(dir: &Path, ahead: &AheadHandle, watch: &mut Option<DirWatch>) -> bool {
    match DirWatch::new(dir, ahead.clone()) {
        Ok(w) => {
            *watch = Some(w);
            true
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            cannot_watch(dir, &e);
            true
        }
    }
}

/// Say that a follower polls `dir` instead of watching it: loudly the first time, as
/// a follower that polls can lose a burst of output to rotation (it looks every
/// [`UNWATCHED_MAX_POLL`] at most once the task is quiet), and an operator can give
/// the agent the inotify instances or watches it lacks
/// (`fs.inotify.max_user_instances`, `fs.inotify.max_user_watches`).
fn cannot_watch(dir: &Path, e: &io::Error) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    // Out of instances (EMFILE) or watches (ENOSPC); anything else (a directory
    // replaced by a link, say) is this one follower's business.
    let out_of_inotify = [rustix::io::Errno::MFILE, rustix::io::Errno::NOSPC]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()));
    if !out_of_inotify || WARNED.swap(true, Ordering::Relaxed) {
        tracing::debug!("polling {}: cannot watch it: {e}", dir.display());
    } else {
        tracing::warn!(
            "log followers poll instead of watching their directories ({}: {e}); a \
             fast writer can rotate output away between polls. Raise \
             fs.inotify.max_user_instances or fs.inotify.max_user_watches (or the \
             agent's open-file limit, if that is what ran out)",
            dir.display()
        );
    }
}

/// Until the directory changes, or `fallback` passed when there is no watch.
async fn wait_for_change(watch: Option<&mut DirWatch>, idle: Duration, fallback: Duration) {
    match watch {
        Some(w) => w.changed(idle).await,
        None => tokio::time::sleep(fallback).await,
    }
}

/// Serve the stream at `base` from a task of its own and send its chunks. Without
/// `follow`, ends at the end of what was written. With it, ends once `dead` resolved
/// and everything was read, or when `stop` fires or the receiver is dropped.
///
/// A follower holds no thread while it waits: only each read (and each look for new
/// files) runs on the blocking pool, for as long as that one read takes. A follower
/// that held a pool thread for its life let a few hundred `logs -f` exhaust the pool,
/// and the state store's writes, which run there too, queued behind them.
pub fn stream(
    base: PathBuf,
    start: LogStart,
    options: FollowOptions,
    dead: impl std::future::Future<Output = ()> + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::sync::mpsc::Receiver<io::Result<LogChunk>> {
    // A few chunks of slack; beyond that the reader waits for the client.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(follow(base, start, options, dead, stop, tx, |chunk, _| {
        chunk
    }));
    rx
}

/// [`stream`], each chunk with where it ends ([`LogReader::position`]): Nomad's log
/// frames name the file and the offset.
pub fn stream_positioned(
    base: PathBuf,
    start: LogStart,
    options: FollowOptions,
    dead: impl std::future::Future<Output = ()> + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::sync::mpsc::Receiver<io::Result<(LogChunk, Option<FilePosition>)>> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(follow(base, start, options, dead, stop, tx, |chunk, at| {
        (chunk, at)
    }));
    rx
}

/// A [`LogReader`] whose calls run on the blocking pool, one call at a time.
struct PooledReader {
    /// `None` only while a call runs (or after one panicked).
    reader: Option<LogReader>,
    base: PathBuf,
}

impl PooledReader {
    /// Run `f` on the reader on a blocking-pool thread.
    async fn call<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut LogReader) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let mut reader = self
            .reader
            .take()
            .ok_or_else(|| io::Error::other("the log reader failed earlier"))?;
        let (reader, out) = tokio::task::spawn_blocking(move || {
            let out = f(&mut reader);
            (reader, out)
        })
        .await
        .map_err(|e| io::Error::other(format!("the log reader failed: {e}")))?;
        self.reader = Some(reader);
        out
    }

    /// The next chunk and where it ends.
    async fn read(&mut self) -> io::Result<Option<(LogChunk, Option<FilePosition>)>> {
        self.call(|r| match r.read()? {
            Some(chunk) => Ok(Some((chunk, r.position()?))),
            None => Ok(None),
        })
        .await
    }

    async fn open_ahead(&mut self) -> io::Result<()> {
        self.call(LogReader::open_ahead).await
    }
}

async fn follow<T: Send + 'static>(
    base: PathBuf,
    start: LogStart,
    options: FollowOptions,
    dead: impl std::future::Future<Output = ()> + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
    tx: tokio::sync::mpsc::Sender<io::Result<T>>,
    item: fn(LogChunk, Option<FilePosition>) -> T,
) {
    let finished = Arc::new(AtomicBool::new(false));
    // Fired when this follower ends, so that the watcher of `dead` ends with it.
    let reader_done = tokio_util::sync::CancellationToken::new();
    let _done = reader_done.clone().drop_guard();
    if options.follow {
        let finished = finished.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = dead => finished.store(true, Ordering::Release),
                () = reader_done.cancelled() => {}
            }
        });
    }
    let log_reader = LogReader::new(base.clone(), start);
    // Without a watch (no inotify, or no directory yet) the follower polls; a
    // directory that does not exist yet is watched once it does.
    let ahead = log_reader.ahead_handle();
    let watch_dir = base
        .parent()
        .filter(|_| options.follow)
        .map(Path::to_path_buf);
    let mut watch = None;
    let mut watch_later = match &watch_dir {
        Some(dir) => !try_watch(dir, &ahead, &mut watch),
        None => false,
    };
    let mut reader = PooledReader {
        reader: Some(log_reader),
        base,
    };
    let mut quiet_since: Option<Instant> = None;
    let mut poll = options.poll;
    loop {
        if tx.is_closed() {
            return;
        }
        if stop.is_cancelled() {
            let _ = tx
                .send(Err(io::Error::other(
                    "the agent is stopping; the log stream ends here",
                )))
                .await;
            return;
        }
        match reader.read().await {
            Ok(Some((chunk, at))) => {
                quiet_since = None;
                poll = options.poll;
                if !send(&tx, &mut reader, watch.as_mut(), &stop, Ok(item(chunk, at))).await {
                    return;
                }
            }
            Ok(None) if !options.follow => return,
            Ok(None) => {
                if finished.load(Ordering::Acquire)
                    && quiet_since.get_or_insert_with(Instant::now).elapsed() >= options.settle
                {
                    return;
                }
                if let (true, Some(dir)) = (watch_later, &watch_dir) {
                    watch_later = !try_watch(dir, &ahead, &mut watch);
                }
                let (idle, fallback) = if finished.load(Ordering::Acquire) {
                    (options.poll, options.poll)
                } else {
                    (WATCHED_IDLE_CHECK, poll)
                };
                tokio::select! {
                    () = wait_for_change(watch.as_mut(), idle, fallback) => {}
                    // A client that went away frees its follower now, not at the
                    // next change in the directory.
                    () = tx.closed() => return,
                }
                // Whatever appeared, open it before rotation can take it away.
                if let Err(e) = reader.open_ahead().await {
                    tracing::debug!("opening log files ahead: {e}");
                }
                if watch.is_some() {
                    tokio::time::sleep(WAKE_BATCH).await;
                } else if !finished.load(Ordering::Acquire) {
                    poll = (poll * 2).min(UNWATCHED_MAX_POLL.max(options.poll));
                }
            }
            Err(e) => {
                let e = io::Error::new(
                    e.kind(),
                    format!("reading the log files at {}: {e}", reader.base.display()),
                );
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// Send `item`, opening the files that appear meanwhile while the client is slow, so
/// that a burst of output is not lost to rotation while we wait. `false` when the
/// receiver is gone or `stop` fired.
async fn send<T>(
    tx: &tokio::sync::mpsc::Sender<io::Result<T>>,
    reader: &mut PooledReader,
    mut watch: Option<&mut DirWatch>,
    stop: &tokio_util::sync::CancellationToken,
    item: io::Result<T>,
) -> bool {
    // No pause before the first wait; after a wake-up, a short one, so that a chatty
    // task does not wake a follower whose client is slow once per write.
    let mut pause = Duration::ZERO;
    loop {
        let reserved = tokio::select! {
            permit = tx.reserve() => Some(permit),
            () = async {
                tokio::time::sleep(pause).await;
                wait_for_change(watch.as_deref_mut(), WATCHED_IDLE_CHECK, Duration::from_millis(10)).await;
            } => None,
        };
        pause = WAKE_BATCH;
        match reserved {
            Some(Ok(permit)) => {
                permit.send(item);
                return true;
            }
            Some(Err(_closed)) => return false,
            None if stop.is_cancelled() => return false,
            None => {
                // An error here shows up again at the next read, which reports it.
                let _ = reader.open_ahead().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use drover_plugin_sdk::LogConfig;
    use drover_plugin_sdk::logs::{RotatingWriter, log_files};

    use super::*;

    const MIB: usize = 1024 * 1024;

    /// A follower that does nothing at all (busy sending, or short of CPU) still loses
    /// no file to rotation: the inotify reader thread opens each file ahead of it as
    /// it is created. Without that, this reader would find files 1 to 8 deleted.
    #[test]
    fn the_inotify_thread_opens_files_ahead_of_an_idle_follower() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, LogConfig::new(3, 1)).unwrap();
        w.write_all(b"first\n").unwrap();
        let mut reader = LogReader::new(&base, LogStart::Beginning);
        let Some(LogChunk::Data(mut read)) = reader.read().unwrap() else {
            panic!("no first line");
        };
        let _watch = DirWatch::new(dir.path(), reader.ahead_handle()).unwrap();
        let mut written = b"first\n".to_vec();
        for file in 1..=10u8 {
            // Fill the current file and start the next one.
            let data = vec![b'a' + file; MIB];
            w.write_all(&data).unwrap();
            written.extend(&data);
            let index = w.current_index();
            // Wait (bounded) until the thread holds the new file; the reader itself
            // is never called in between.
            let deadline = Instant::now() + Duration::from_secs(10);
            while lock(&reader.ahead).last != Some(index) {
                assert!(
                    Instant::now() < deadline,
                    "file {index} was not opened ahead: {:?}",
                    lock(&reader.ahead).last
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let on_disk: Vec<u64> = log_files(&base).unwrap().iter().map(|(i, _)| *i).collect();
        assert_eq!(
            on_disk.len(),
            3,
            "rotation deleted the older files: {on_disk:?}"
        );
        while let Some(chunk) = reader.read().unwrap() {
            match chunk {
                LogChunk::Data(d) => read.extend(d),
                LogChunk::Skipped(n) => panic!("{n} files skipped"),
            }
        }
        assert_eq!(read.len(), written.len());
        assert!(read == written, "the stream differs from what was written");
    }

    /// A file created while its reader's lock is busy is still opened ahead: the
    /// inotify thread waits for the lock (held only for moments) rather than giving
    /// up on that reader. Giving up lost the file for good when no later file was
    /// created to bring the thread back, and under load lost whole runs of files to
    /// rotation (CI saw 9 of 1 MiB skipped).
    #[test]
    fn a_file_created_while_the_reader_holds_its_lock_is_still_opened_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("stdout");
        let mut w = RotatingWriter::open(&base, LogConfig::new(3, 1)).unwrap();
        w.write_all(b"first\n").unwrap();
        let mut reader = LogReader::new(&base, LogStart::Beginning);
        assert!(matches!(reader.read().unwrap(), Some(LogChunk::Data(_))));
        let _watch = DirWatch::new(dir.path(), reader.ahead_handle()).unwrap();
        {
            let held = lock(&reader.ahead);
            // Fill file 0 and create file 1, the last file of this test.
            w.write_all(&vec![b'x'; MIB]).unwrap();
            assert_eq!(w.current_index(), 1);
            // Long enough for the thread to see the creation and meet the lock.
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(held.last, Some(0));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&reader.ahead).last != Some(1) {
            assert!(
                Instant::now() < deadline,
                "file 1 was never opened ahead of the reader"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// `logs -f` on a task whose log directory does not exist yet (it was just
    /// submitted) watches the directory once it appears, instead of polling for the
    /// rest of its life: a polling follower, backed off while there was nothing, lost
    /// most of a burst to rotation. Then it follows whole through rotation.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_started_before_its_log_directory_watches_it_once_it_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("logs");
        let base = logs.join("stdout");
        let (dead_tx, mut rx) = super::super::tests::follow_until_dead(&base);
        // Long enough for the follower's polling to back off to its longest interval.
        tokio::time::sleep(UNWATCHED_MAX_POLL * 2).await;
        std::fs::create_dir(&logs).unwrap();
        let mut w = RotatingWriter::open(&base, LogConfig::new(3, 1)).unwrap();
        w.write_all(b"first\n").unwrap();
        assert_eq!(
            rx.recv().await.unwrap().unwrap(),
            LogChunk::Data(b"first\n".to_vec())
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        // The watch's handle on this follower's files ahead, once it is watched.
        let filler = || {
            let inotify = lock(&INOTIFY).clone()?;
            let dirs = lock(&inotify.dirs);
            dirs.values()
                .flat_map(|w| w.fillers.values())
                .find(|h| h.base == base)
                .cloned()
        };
        while filler().is_none() {
            assert!(
                Instant::now() < deadline,
                "the follower never watched the directory"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Through rotation: each file is opened ahead of the follower (by the watch's
        // thread) before the next one is written, so nothing depends on how quickly
        // the follower gets the CPU; the first check above is what needs the watch.
        let held = || {
            let ahead = filler()?.ahead.upgrade()?;
            lock(&ahead).last
        };
        let mut written = Vec::new();
        for file in 1..=10u8 {
            let data = vec![b'a' + file; MIB];
            w.write_all(&data).unwrap();
            written.extend(data);
            let index = w.current_index();
            while held().is_none_or(|last| last < index) {
                assert!(
                    Instant::now() < deadline,
                    "file {index} was not opened ahead: {:?}",
                    held()
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        drop(w);
        dead_tx.send(()).unwrap();
        let mut read = Vec::new();
        while let Some(chunk) = rx.recv().await {
            match chunk.unwrap() {
                LogChunk::Data(d) => read.extend(d),
                LogChunk::Skipped(n) => panic!("{n} files skipped"),
            }
        }
        assert_eq!(read.len(), written.len());
        assert!(read == written, "the stream differs from what was written");
    }
}
