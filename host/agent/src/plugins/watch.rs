//! Watching `plugin_dir` (inotify) so that plugins are added, upgraded and removed as
//! their files come and go, without a restart: every burst of changes ends in one
//! [`Catalog::reload`].
//!
//! A copy in progress is many events (create, writes, attribute changes); the reload
//! waits until the directory has been quiet for `QUIET` (250 ms), but no longer than
//! `MAX_DELAY` (2 s) after the first event, so a file written for ever cannot postpone it
//! for ever. An operator who installs with an atomic rename (write elsewhere, `mv`
//! into `plugin_dir`) gives one `MOVED_TO`, and a half-written file is never tried.
//! A file caught half-written (a copy that paused longer than `QUIET`, or one
//! slower than `MAX_DELAY`) is not served: a binary still open for writing cannot be
//! executed (`ETXTBSY`), and a driver library is not loaded while anyone has it open
//! for writing or while it changed less than the loader's settle time ago, and is
//! refused on its ELF image if it is cut short ([`super::library`]). Its writer's
//! `CLOSE_WRITE` starts the reload that tries it again.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use super::catalog::Catalog;

/// Quiet time after the last event before reloading.
const QUIET: Duration = Duration::from_millis(250);
/// Longest wait from the first event of a burst to its reload.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// How often to look for a `plugin_dir` that does not exist (yet).
const DIR_POLL: Duration = Duration::from_secs(1);

/// Why the directory is not (or no longer) watched.
#[derive(Debug, thiserror::Error)]
enum WatchError {
    #[error("cannot watch {path} with inotify: {source}")]
    Inotify {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} went away")]
    Gone { path: PathBuf },
}

/// Watch `dir` until `stop` fires, reloading `catalog` after each burst of changes.
/// A `dir` that does not exist is looked for every `DIR_POLL` (1 s); when it appears (or
/// goes away) the catalog reloads too.
pub async fn run(catalog: Arc<Catalog>, dir: PathBuf, stop: CancellationToken) {
    let mut existed = dir.is_dir();
    loop {
        if !dir.is_dir() {
            if existed {
                tracing::info!(plugin_dir = %dir.display(), "plugin_dir went away; its plugins are removed");
                catalog.reload(false).await;
                existed = false;
            }
            tokio::select! {
                () = tokio::time::sleep(DIR_POLL) => continue,
                () = stop.cancelled() => return,
            }
        }
        if !existed {
            tracing::info!(plugin_dir = %dir.display(), "plugin_dir appeared; loading its plugins");
            existed = true;
            catalog.reload(false).await;
        }
        match watch_dir(&catalog, &dir, &stop).await {
            Ok(()) => return,
            Err(WatchError::Gone { .. }) => {}
            Err(e @ WatchError::Inotify { .. }) => {
                // Without inotify (no instance or watch left), look now and then.
                tracing::warn!("{e}; looking for plugin changes every {DIR_POLL:?} instead");
                tokio::select! {
                    () = tokio::time::sleep(DIR_POLL) => catalog.reload(false).await.len(),
                    () = stop.cancelled() => return,
                };
            }
        }
    }
}

fn watcher(dir: &Path) -> std::io::Result<AsyncFd<OwnedFd>> {
    let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
    inotify::add_watch(
        &fd,
        dir,
        // MODIFY only extends the quiet wait while a file is being written in place.
        WatchFlags::CLOSE_WRITE
            | WatchFlags::MODIFY
            | WatchFlags::MOVED_TO
            | WatchFlags::MOVED_FROM
            | WatchFlags::DELETE
            | WatchFlags::ATTRIB
            | WatchFlags::CREATE
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF,
    )?;
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and names
    // the same inotify instance for as long as it is registered (tokio's
    // `AsyncFd::new`, which did the same without `unsafe`, is deprecated for this).
    #[allow(unsafe_code)]
    let registered = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
    registered.map_err(std::io::Error::from)
}

/// What a read of the queue found.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Any event at all.
    any: bool,
    /// The directory itself went away (deleted, moved, unmounted).
    gone: bool,
}

/// Read everything queued into `seen`. Ends with `WouldBlock` once the queue is
/// empty, which is what tells tokio to wait for the next readiness.
fn read_queue(fd: &OwnedFd, seen: &mut Seen) -> std::io::Result<()> {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(fd, &mut buf);
    loop {
        match reader.next() {
            Ok(event) => {
                seen.any = true;
                if event
                    .events()
                    .intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::IGNORED)
                {
                    seen.gone = true;
                }
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Wait for the next events; `Ok(None)` when `stop` fired, else whether the directory
/// itself went away.
async fn next_events(
    fd: &AsyncFd<OwnedFd>,
    stop: &CancellationToken,
) -> std::io::Result<Option<bool>> {
    let mut seen = Seen::default();
    loop {
        let mut ready = tokio::select! {
            ready = fd.readable() => ready?,
            () = stop.cancelled() => return Ok(None),
        };
        match ready.try_io(|fd| read_queue(fd.get_ref(), &mut seen)) {
            // `read_queue` only ends in an error; WouldBlock is the `Err` arm below.
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_drained) => {}
        }
        if seen.any {
            return Ok(Some(seen.gone));
        }
    }
}

async fn watch_dir(
    catalog: &Arc<Catalog>,
    dir: &Path,
    stop: &CancellationToken,
) -> Result<(), WatchError> {
    let inotify_err = |source| WatchError::Inotify {
        path: dir.to_owned(),
        source,
    };
    let fd = watcher(dir).map_err(inotify_err)?;
    tracing::info!(plugin_dir = %dir.display(), "watching plugin_dir for added, upgraded and removed plugins");
    // Files that changed between the initial load and the watch being in place.
    catalog.reload(false).await;
    loop {
        let Some(mut gone) = next_events(&fd, stop).await.map_err(inotify_err)? else {
            return Ok(());
        };
        // Debounce: until quiet for QUIET, at most MAX_DELAY in all.
        let deadline = tokio::time::Instant::now() + MAX_DELAY;
        while !gone {
            let quiet = (tokio::time::Instant::now() + QUIET).min(deadline);
            match tokio::time::timeout_at(quiet, next_events(&fd, stop)).await {
                Err(_) => break,
                Ok(Ok(Some(g))) => gone = g,
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(inotify_err(e)),
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        if gone {
            return Err(WatchError::Gone {
                path: dir.to_owned(),
            });
        }
        tracing::debug!(plugin_dir = %dir.display(), "plugin_dir changed; reloading plugins");
        catalog.reload(false).await;
    }
}
