//! Driver libraries loaded into the agent (`NAME.so` in `plugin_dir` with
//! `[plugin.NAME] in_process = true`).
//!
//! The file was opened and checked like a plugin binary ([`super::open_checked`]) and
//! the [`super::Policy`] has passed the hash of the bytes behind that descriptor. What
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
//! after they were mapped are not mapped again. So the agent holds at most one copy
//! of each distinct library it has ever loaded, whatever the number of relaunches.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use drover_plugin_sdk::client::{InProcessOptions, InProcessPlugin, LoadError, sealed_copy};

use super::{Binary, Candidate, sha256_fd};

/// The largest driver library loaded. Its sealed copy stays in memory for the life of
/// the agent (a debug build of rawexec is 29 MB, a release build a third of that), so
/// a file in `plugin_dir` that is far larger is a mistake, not a driver.
pub const MAX_LIBRARY_BYTES: u64 = 256 << 20;

/// What this agent holds of one library's bytes.
#[derive(Default)]
enum Held {
    /// Nothing yet (or only copies that failed before they were mapped).
    #[default]
    Nothing,
    /// Loaded from `path`; `plugin` is its latest runtime, running or stopped.
    Loaded {
        plugin: InProcessPlugin,
        path: PathBuf,
    },
    /// Mapped, then refused or failed: the reason, kept so the bytes are not mapped
    /// again.
    Failed(String),
}

/// Libraries by the sha256 of their bytes. Each entry is locked while it is loaded or
/// restarted, so two candidates with the same bytes never load them twice.
static LIBRARIES: LazyLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<Held>>>>> =
    LazyLock::new(Mutex::default);

/// The running plugin of `candidate`'s library, whose checked bytes are `binary`:
/// loaded now, or the library already loaded with these bytes started afresh. The
/// error is a reason for `plugin status`.
pub async fn load(
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
        Held::Loaded { plugin, path } if !plugin.has_exited() => Err(format!(
            "the same library (sha256 {}) is already loaded into the agent from {} and \
             serving; a library is loaded once",
            binary.sha256,
            path.display()
        )),
        Held::Loaded { plugin, path } => {
            let fresh = plugin.restart(timeout).await.map_err(|e| e.to_string())?;
            tracing::info!(
                library = %candidate.path.display(),
                sha256 = %binary.sha256,
                "driver library restarted in the copy already loaded (not loaded again)"
            );
            *held = Held::Loaded {
                plugin: fresh.clone(),
                path: path.clone(),
            };
            Ok(fresh)
        }
        Held::Failed(reason) => Err(format!(
            "{reason} (these bytes failed after they were loaded, and a library cannot be \
             unloaded, so this agent does not load them again: replace the file, or \
             restart the agent)"
        )),
        Held::Nothing => match load_checked_bytes(candidate, binary, timeout).await {
            Ok(plugin) => {
                *held = Held::Loaded {
                    plugin: plugin.clone(),
                    path: candidate.path.clone(),
                };
                Ok(plugin)
            }
            Err(Failure { reason, mapped }) => {
                if mapped {
                    *held = Held::Failed(reason.clone());
                }
                Err(reason)
            }
        },
    }
}

/// Why a load failed, and whether the library's bytes were mapped before it did.
struct Failure {
    reason: String,
    mapped: bool,
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure {
            reason,
            mapped: false,
        }
    }
}

/// Copy the checked bytes into a sealed memfd, make sure the copy hashes to what the
/// policy checked, and load the copy.
async fn load_checked_bytes(
    candidate: &Candidate,
    binary: &Binary,
    timeout: Duration,
) -> Result<InProcessPlugin, Failure> {
    let shown = candidate.path.display().to_string();
    let size = rustix::fs::fstat(&*binary.fd)
        .map_err(|e| format!("cannot stat {shown}: {e}"))?
        .st_size as u64;
    if size > MAX_LIBRARY_BYTES {
        return Err(format!(
            "{shown} is {size} bytes, more than the {MAX_LIBRARY_BYTES} a driver library may \
             have (its copy stays in the agent's memory); not loaded"
        )
        .into());
    }
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
    InProcessPlugin::load(opts).await.map_err(|e| Failure {
        // dlopen refused it (nothing stays mapped), or the copy could not be made;
        // anything later happened to a library that is now part of the agent.
        mapped: !matches!(e, LoadError::Dlopen { .. } | LoadError::Io(_)),
        reason: e.to_string(),
    })
}
