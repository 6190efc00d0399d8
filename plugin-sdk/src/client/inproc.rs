//! The host side of in-process plugins: a driver built as a shared library (`cdylib`)
//! with [`crate::export_driver!`], loaded into the host with `dlopen` and spoken to with
//! the same gRPC as a plugin process, over a socket pair per connection.
//!
//! CONTRACT (foundation commit; the implementation fills the bodies). The agent
//! (`drover-host`) and the conformance harness code against exactly these items.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use crate::types::ExitOutcome;

use super::PluginClient;

/// How to load a shared-library plugin.
#[derive(Debug)]
#[non_exhaustive]
pub struct InProcessOptions {
    /// Name for logs (the file's label; the plugin's own name is learnt over RPC).
    pub name: String,
    /// The library's bytes: a sealed memfd from [`sealed_copy`]. The library is
    /// `dlopen`ed from this descriptor (`/proc/self/fd/N`), which stays open for the
    /// life of the process, so the bytes loaded are the bytes the caller checked.
    pub library: OwnedFd,
    /// Where the bytes came from, for messages only (never opened).
    pub display_path: PathBuf,
    /// The program the plugin's executors run (a `.so` cannot be executed). `None`:
    /// `/proc/self/exe`, the host's own binary, which must call
    /// `drover_executor::run_if_executor` first thing in `main` (the `drover` binary
    /// does).
    pub executor: Option<PathBuf>,
    /// Bound on loading, starting the plugin's runtime and its first health check.
    pub timeout: Duration,
}

impl InProcessOptions {
    /// Options with the defaults (executor: the host binary, timeout 5 s).
    pub fn new(
        name: impl Into<String>,
        library: OwnedFd,
        display_path: impl Into<PathBuf>,
    ) -> Self {
        InProcessOptions {
            name: name.into(),
            library,
            display_path: display_path.into(),
            executor: None,
            timeout: Duration::from_secs(5),
        }
    }
}

/// Why a shared library could not be loaded as a plugin. Each message is a sentence
/// an operator reads in `drover plugin status`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// `dlopen` failed (not an ELF shared object, missing dependency, ...).
    #[error("cannot load {path} as a shared library: {reason}")]
    Dlopen {
        /// The library.
        path: PathBuf,
        /// `dlerror()`'s text.
        reason: String,
    },
    /// The library does not export the entry symbol.
    #[error(
        "{path} exports no `{symbol}`: it is not a Drover driver library (build it with \
         drover_plugin_sdk::export_driver!)"
    )]
    NoEntry {
        /// The library.
        path: PathBuf,
        /// The symbol looked for.
        symbol: String,
    },
    /// The library speaks another version of the in-process ABI.
    #[error("{path} speaks in-process ABI version {found}; this host speaks {expected}")]
    AbiVersion {
        /// The library.
        path: PathBuf,
        /// What it says.
        found: u32,
        /// What the host speaks.
        expected: u32,
    },
    /// The plugin's start-up failed or panicked (contained: the host keeps running).
    #[error("{path}: the plugin failed to start: {reason}")]
    Start {
        /// The library.
        path: PathBuf,
        /// What it said, or the panic message.
        reason: String,
    },
    /// No health answer within the timeout.
    #[error("{path}: the plugin did not answer its health check within {timeout:?}")]
    Timeout {
        /// The library.
        path: PathBuf,
        /// The bound.
        timeout: Duration,
    },
    /// Reading or sealing the bytes failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A driver loaded into this process. Cheap to clone; all clones are one plugin.
///
/// The library is never unloaded (`dlclose` is unsafe with thread-locals and threads
/// the library started); [`InProcessPlugin::shutdown`] stops its runtime and
/// [`InProcessPlugin::restart`] starts a fresh one in the same library.
#[derive(Debug, Clone)]
pub struct InProcessPlugin {
    _private: (),
}

impl InProcessPlugin {
    /// `dlopen` the library, check its entry symbol and ABI version, start its runtime
    /// and check its health, within `opts.timeout`. Panics inside the library are
    /// contained and reported as [`LoadError::Start`].
    pub async fn load(opts: InProcessOptions) -> Result<Self, LoadError> {
        let _ = opts;
        todo!("in-process loading")
    }

    /// A typed client; every call opens nothing new until the channel needs a
    /// connection, which is a fresh socket pair handed to the library.
    pub fn client(&self) -> PluginClient {
        todo!("in-process client")
    }

    /// Name given in the options.
    pub fn name(&self) -> &str {
        todo!()
    }

    /// Where the library came from.
    pub fn display_path(&self) -> &std::path::Path {
        todo!()
    }

    /// Whether the plugin's runtime has stopped (shut down, or its runtime thread
    /// ended: a panic that escaped a task).
    pub fn has_exited(&self) -> bool {
        todo!()
    }

    /// Resolves when the plugin's runtime stops, saying why.
    pub async fn exited(&self) -> ExitOutcome {
        todo!()
    }

    /// Ask the plugin to shut down (`DriverPlugin::shutdown`, then its runtime stops),
    /// bounded like a process shutdown. Tasks keep running in their executors.
    pub async fn shutdown(&self) -> ExitOutcome {
        todo!()
    }

    /// Start a fresh runtime in the already loaded library after it stopped (the
    /// supervisor's "relaunch"): a new [`InProcessPlugin`] sharing the library.
    pub async fn restart(&self, timeout: Duration) -> Result<InProcessPlugin, LoadError> {
        let _ = timeout;
        todo!()
    }
}

/// Copy the bytes behind `fd` (from offset 0) into a fresh memfd and seal it against
/// every change (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`). Hash the
/// copy, check it, then pass it to [`InProcessOptions::library`]: nothing can change
/// the bytes between the check and `dlopen`.
pub fn sealed_copy(fd: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    let _ = (fd, name);
    todo!()
}
