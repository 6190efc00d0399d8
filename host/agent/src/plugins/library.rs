//! Driver libraries loaded into the agent (`NAME.so` in `plugin_dir` with
//! `[plugin.NAME] in_process = true`).
//!
//! The file was opened and checked like a plugin binary ([`super::trust::open_checked`]) and
//! the [`super::trust::Policy`] has passed the hash of the bytes behind that descriptor. What
//! is loaded is a sealed copy of those bytes ([`sealed_copy`]: a memfd that nothing
//! can write, grow or shrink any more), hashed again: the copy must hash to what was
//! checked, or nothing is loaded. The SDK then `dlopen`s the copy through
//! `/proc/self/fd/N`, never the path, so whatever happens to the file in `plugin_dir`
//! meanwhile changes nothing that runs.
//!
//! A library is never unloaded (`dlclose` is not safe once its code has run: threads,
//! thread-locals, handlers it installed), so each distinct library stays mapped for
//! the life of the agent. This module keeps them by sha256: a relaunch of a plugin
//! whose bytes did not change starts a fresh runtime in the library already loaded
//! ([`InProcessPlugin::restart`]) instead of mapping another copy; bytes that failed
//! after they were mapped are not mapped again, nor are bytes refused before (their
//! ELF image, or `dlopen`). So the agent holds at most one copy of each distinct
//! library it has ever loaded, whatever the number of relaunches, and at most
//! [`MAX_RETAINED_LIBRARIES`] copies and [`MAX_RETAINED_BYTES`] in all: past that, a
//! new library is refused until the agent restarts.
//!
//! A file changed less than [`SETTLE`] ago is loaded only once it has been left alone
//! that long (a copy in progress is refused, and its next change reloads it): the
//! sealed copy would otherwise be of a half-written file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

use drover_plugin_sdk::client::{
    InProcessLibrary, InProcessOptions, InProcessPlugin, LoadError, sealed_copy,
};

use super::candidate::Candidate;
use super::trust::{Binary, sha256_fd};

/// The largest driver library loaded. Its sealed copy stays in memory for the life of
/// the agent (a debug build of rawexec is 29 MB, a release build a third of that), so
/// a file in `plugin_dir` that is far larger is a mistake, not a driver.
pub const MAX_LIBRARY_BYTES: u64 = 256 << 20;

/// The most distinct libraries one agent maps in its life (each stays mapped: a
/// library cannot be unloaded). Each upgrade of an in-process driver is one more.
pub const MAX_RETAINED_LIBRARIES: usize = 8;

/// The most bytes of sealed copies one agent keeps in its life.
pub const MAX_RETAINED_BYTES: u64 = 1 << 30;

/// How long a library's file must have been left alone (its ctime, which every write
/// and rename sets) before it is copied: the watcher's quiet time.
pub const SETTLE: Duration = Duration::from_millis(250);

/// What this agent holds of one library's bytes.
#[derive(Default)]
enum Held {
    /// Nothing yet (or only attempts that may succeed another time: an I/O error, a
    /// file still being written, the retained libraries' bound).
    #[default]
    Nothing,
    /// Loaded from `path`; `plugin` is its latest runtime, running or stopped (`None`:
    /// its first start failed, and its runtime stopped: it is started again at the
    /// next relaunch or `drover plugin reload`).
    Loaded {
        library: InProcessLibrary,
        plugin: Option<InProcessPlugin>,
        path: PathBuf,
    },
    /// Refused for good, with the reason: bytes that are no loadable library (refused
    /// before `dlopen`, or by it), or that failed once mapped, or whose runtime did not
    /// stop. Kept so that the bytes are not copied again.
    Failed { reason: String, mapped: bool },
}

/// Libraries by the sha256 of their bytes. Each entry is locked while it is loaded or
/// restarted, so two candidates with the same bytes never load them twice.
static LIBRARIES: LazyLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<Held>>>>> =
    LazyLock::new(Mutex::default);

/// Sealed copies this agent keeps (mapped, or being loaded): how many, how many bytes.
static RETAINED: Mutex<(usize, u64)> = Mutex::new((0, 0));

/// A place among the retained libraries, taken before a copy is made; given back when
/// dropped unless [`Reservation::keep`] says the copy stays mapped.
struct Reservation {
    bytes: u64,
}

impl Reservation {
    /// Take a place for a copy of `bytes`, or say why there is none.
    fn take(bytes: u64, shown: &str) -> Result<Reservation, String> {
        let mut retained = RETAINED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (count, total) = *retained;
        if count >= MAX_RETAINED_LIBRARIES || total.saturating_add(bytes) > MAX_RETAINED_BYTES {
            return Err(format!(
                "{shown} is not loaded: this agent already keeps {count} driver libraries \
                 ({} MiB) mapped, and keeps at most {MAX_RETAINED_LIBRARIES} (and {} MiB): a \
                 library cannot be unloaded, so each one loaded (each upgrade too) stays; \
                 restart the agent to load more libraries",
                total >> 20,
                MAX_RETAINED_BYTES >> 20
            ));
        }
        *retained = (count + 1, total + bytes);
        Ok(Reservation { bytes })
    }

    /// The copy stays mapped for the life of the agent.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut retained = RETAINED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        retained.0 = retained.0.saturating_sub(1);
        retained.1 = retained.1.saturating_sub(self.bytes);
    }
}

/// The running plugin of `candidate`'s library, whose checked bytes are `binary`:
/// loaded now, or the library already loaded with these bytes started afresh. The
/// error is a reason for `plugin status`.
pub(super) async fn load(
    candidate: &Candidate,
    binary: &Binary,
    timeout: Duration,
) -> Result<InProcessPlugin, String> {
    let entry = LIBRARIES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(binary.sha256.to_ascii_lowercase())
        .or_default()
        .clone();
    let mut held = entry.lock().await;
    match &*held {
        Held::Loaded {
            plugin: Some(plugin),
            path,
            ..
        } if !plugin.has_exited() => Err(format!(
            "the same library (sha256 {}) is already loaded into the agent from {} and \
             serving; a library is loaded once",
            binary.sha256,
            path.display()
        )),
        Held::Loaded { library, path, .. } => {
            let (library, path) = (library.clone(), path.clone());
            let fresh = start(&mut held, library.clone(), path, timeout).await?;
            tracing::info!(
                library = %candidate.path.display(),
                sha256 = %binary.sha256,
                "driver library restarted in the copy already loaded (not loaded again)"
            );
            Ok(fresh)
        }
        Held::Failed {
            reason,
            mapped: true,
        } => Err(format!(
            "{reason} (these bytes failed after they were loaded, and a library cannot be \
             unloaded, so this agent does not load them again: replace the file, or \
             restart the agent)"
        )),
        Held::Failed {
            reason,
            mapped: false,
        } => Err(format!(
            "{reason} (this agent does not try these bytes again: replace the file, or \
             restart the agent)"
        )),
        Held::Nothing => {
            let library = match open_checked_bytes(candidate, binary, timeout).await {
                Ok(library) => library,
                Err(Failure::Again(reason)) => return Err(reason),
                Err(Failure::ForGood { reason, mapped }) => {
                    *held = Held::Failed {
                        reason: reason.clone(),
                        mapped,
                    };
                    return Err(reason);
                }
            };
            start(&mut held, library, candidate.path.clone(), timeout).await
        }
    }
}

/// Start a runtime in `library` (loaded from `path`) and record the outcome in `held`:
/// a start that failed but stopped again is tried at the next load; one that left its
/// runtime running fails these bytes for good.
async fn start(
    held: &mut Held,
    library: InProcessLibrary,
    path: PathBuf,
    timeout: Duration,
) -> Result<InProcessPlugin, String> {
    match library.start(timeout).await {
        Ok(plugin) => {
            *held = Held::Loaded {
                library,
                plugin: Some(plugin.clone()),
                path,
            };
            Ok(plugin)
        }
        Err(e @ LoadError::NotStopped { .. }) => {
            let reason = e.to_string();
            *held = Held::Failed {
                reason: reason.clone(),
                mapped: true,
            };
            Err(reason)
        }
        Err(e) => {
            *held = Held::Loaded {
                library,
                plugin: None,
                path,
            };
            Err(format!(
                "{e} (its runtime stopped; the library stays loaded and is started again at \
                 the plugin's next relaunch or `drover plugin reload`)"
            ))
        }
    }
}

/// Why loading failed: worth another try later, or not with these bytes.
enum Failure {
    Again(String),
    ForGood { reason: String, mapped: bool },
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure::Again(reason)
    }
}

/// Wait until the file has been left alone for [`SETTLE`]; a file that changes
/// meanwhile is refused (it is still being written; its next change reloads it).
async fn settled(binary: &Binary, shown: &str) -> Result<u64, String> {
    let stat = || {
        let st = rustix::fs::fstat(&*binary.fd).map_err(|e| format!("cannot stat {shown}: {e}"))?;
        let changed = SystemTime::UNIX_EPOCH
            + Duration::new(st.st_ctime.max(0) as u64, st.st_ctime_nsec as u32);
        Ok::<_, String>((
            (
                st.st_size as u64,
                st.st_mtime,
                st.st_mtime_nsec,
                st.st_ctime,
                st.st_ctime_nsec,
            ),
            changed,
        ))
    };
    let (before, changed) = stat()?;
    // A ctime in the future (a clock set back) counts as just now.
    let age = SystemTime::now()
        .duration_since(changed)
        .unwrap_or_default();
    if age < SETTLE {
        tokio::time::sleep(SETTLE - age).await;
        let (after, _) = stat()?;
        if after != before {
            return Err(format!(
                "{shown} is still being written (it changed within the last {SETTLE:?}); not \
                 loaded now: it is tried again when it changes, or by `drover plugin reload`"
            ));
        }
    }
    Ok(before.0)
}

/// Copy the checked bytes into a sealed memfd, make sure the copy hashes to what the
/// policy checked, check its ELF image and `dlopen` it.
async fn open_checked_bytes(
    candidate: &Candidate,
    binary: &Binary,
    timeout: Duration,
) -> Result<InProcessLibrary, Failure> {
    let shown = candidate.path.display().to_string();
    let size = settled(binary, &shown).await?;
    if size > MAX_LIBRARY_BYTES {
        return Err(format!(
            "{shown} is {size} bytes, more than the {MAX_LIBRARY_BYTES} a driver library may \
             have (its copy stays in the agent's memory); not loaded"
        )
        .into());
    }
    let place = Reservation::take(size, &shown)?;
    let (fd, label) = (binary.fd.clone(), candidate.label.clone());
    let (sealed, sha256) = tokio::task::spawn_blocking(move || {
        let sealed = sealed_copy(&fd, &label)?;
        let sha256 = sha256_fd(&sealed)?;
        std::io::Result::Ok((sealed, sha256))
    })
    .await
    .map_err(|e| format!("copying {shown}: {e}"))?
    .map_err(|e| format!("cannot copy {shown} into a sealed file to load it: {e}"))?;
    if !sha256.eq_ignore_ascii_case(&binary.sha256) {
        return Err(format!(
            "{shown} changed while it was being loaded: the bytes copied hash to {sha256}, \
             not to the {} that was checked; not loaded",
            binary.sha256
        )
        .into());
    }
    let mut opts = InProcessOptions::new(candidate.label.clone(), sealed, candidate.path.clone());
    opts.timeout = timeout;
    match InProcessLibrary::open(opts).await {
        Ok(library) => {
            place.keep();
            Ok(library)
        }
        Err(e @ LoadError::Io(_)) => Err(Failure::Again(e.to_string())),
        // Refused before dlopen, or by it: nothing stays mapped (the copy was closed).
        Err(e @ (LoadError::Elf { .. } | LoadError::Dlopen { .. })) => Err(Failure::ForGood {
            reason: e.to_string(),
            mapped: false,
        }),
        // Mapped, and its code ran: it stays.
        Err(e) => {
            place.keep();
            Err(Failure::ForGood {
                reason: e.to_string(),
                mapped: true,
            })
        }
    }
}
