//! The host side of in-process plugins: a driver built as a shared library (`cdylib`)
//! with [`crate::export_driver!`], loaded into the host with `dlopen` and spoken to with
//! the same gRPC as a plugin process, over a socket pair per connection.
//!
//! How it goes: the library's bytes are a sealed memfd ([`sealed_copy`]), `dlopen`ed
//! as `/proc/self/fd/N`; its entry table ([`crate::inproc::EntryV1`]) is checked for
//! the ABI version before any other pointer in it is used; `start` gets a pipe whose
//! read end is forwarded into this host's `tracing` exactly like a plugin process's
//! stderr (and whose end of file says the plugin's runtime stopped); each gRPC
//! connection is a fresh `socketpair`, one end handed to the library's `connect`.
//! Every call into the library runs on a blocking thread, bounded.

use std::collections::VecDeque;
use std::os::fd::{AsFd as _, AsRawFd as _, IntoRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::inproc::{ABI_VERSION, CODE_OK, ENTRY_SYMBOL, EntryV1, ErrorBuf, StartArgs};
use crate::types::ExitOutcome;

use super::PluginClient;
use super::process::{Exit, SHUTDOWN_GRACE, check_health, format_tail, spawn_stderr_forwarder};

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
    /// The sealed copy is not a complete shared library for this host, or it would
    /// find its dependencies outside the system's library path: refused before
    /// `dlopen`, nothing of it ran or stays mapped.
    #[error("{path} is not loaded: {reason}")]
    Elf {
        /// The library.
        path: PathBuf,
        /// What is wrong with its bytes.
        reason: String,
    },
    /// `dlopen` failed (a missing dependency, an undefined symbol, ...); nothing of the
    /// library stays mapped.
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
    /// Its runtime stopped: a later start may succeed.
    #[error("{path}: the plugin failed to start: {reason}")]
    Start {
        /// The library.
        path: PathBuf,
        /// What it said, or the panic message.
        reason: String,
    },
    /// No health answer within the timeout (from [`InProcessLibrary::start`]: its
    /// runtime stopped, a later start may succeed), or `dlopen` did not return within
    /// it (from [`InProcessLibrary::open`]: the library's initialisers still run).
    #[error("{path}: the plugin did not answer its health check within {timeout:?}")]
    Timeout {
        /// The library.
        path: PathBuf,
        /// The bound.
        timeout: Duration,
    },
    /// The plugin's start failed, and its runtime did not stop when told to: it is left
    /// running in the host, and the library cannot be started again.
    #[error(
        "{path}: the plugin failed to start ({reason}), and its runtime did not stop: it \
         is left running in this process"
    )]
    NotStopped {
        /// The library.
        path: PathBuf,
        /// Why the start failed.
        reason: String,
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
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use drover_plugin_sdk::client::{InProcessOptions, InProcessPlugin, sealed_copy};
/// let file = std::fs::File::open("plugins/librawexec.so")?;
/// let library = sealed_copy(&file.into(), "rawexec")?;
/// // ... check the sealed bytes (owner, mode, pin) here ...
/// let plugin = InProcessPlugin::load(InProcessOptions::new("rawexec", library, "plugins/librawexec.so")).await?;
/// println!("{}", plugin.client().plugin_info().await?.version);
/// plugin.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct InProcessPlugin {
    inner: Arc<Running>,
}

/// A loaded library: never unloaded, so everything here lives for the process.
#[derive(Debug)]
struct Loaded {
    name: String,
    display_path: PathBuf,
    entry: EntryV1,
    executor: Option<PathBuf>,
}

/// One runtime of a loaded library.
#[derive(Debug)]
struct Running {
    library: Arc<Loaded>,
    channel: Channel,
    exit: watch::Receiver<Option<Exit>>,
    /// Set when this host asked it to stop: its end is then a clean one.
    stopping: Arc<AtomicBool>,
}

/// How much of a library's error message is read.
const ERROR_CAP: usize = 4096;
/// Bound on handing a connection to the library (it only queues it).
const CONNECT_BOUND: Duration = Duration::from_secs(2);

impl InProcessPlugin {
    /// `dlopen` the library, check its entry symbol and ABI version, start its runtime
    /// and check its health, within `opts.timeout`. Panics inside the library are
    /// contained and reported as [`LoadError::Start`].
    pub async fn load(opts: InProcessOptions) -> Result<Self, LoadError> {
        let started = Instant::now();
        let timeout = opts.timeout;
        let library = InProcessLibrary::open(opts).await?;
        let plugin = library
            .start(timeout.saturating_sub(started.elapsed()))
            .await?;
        tracing::debug!(
            plugin = %plugin.name(),
            library = %plugin.display_path().display(),
            healthy_us = started.elapsed().as_micros() as u64,
            "plugin loaded in process"
        );
        Ok(plugin)
    }

    /// The library this plugin runs in.
    pub fn library(&self) -> InProcessLibrary {
        InProcessLibrary {
            inner: self.inner.library.clone(),
        }
    }

    /// Start the driver linked into this very binary through
    /// [`crate::export_driver!`] (pass the `drover_plugin_entry_v1` it generated), with
    /// everything [`Self::load`] does after `dlopen`: for tests of the in-process path
    /// without a shared library. One per binary: the SDK's copy in it holds one runtime.
    /// Host and driver then share one std and one `tracing`: the driver's panic hook
    /// (which logs panics) becomes the binary's, and its logger is installed only if the
    /// binary has none (else its lines go to the binary's logger directly).
    ///
    /// ```no_run
    /// # async fn demo(entry: extern "C" fn() -> *const drover_plugin_sdk::inproc::EntryV1) {
    /// use drover_plugin_sdk::client::InProcessPlugin;
    /// let plugin = InProcessPlugin::load_linked("mine", entry, None, std::time::Duration::from_secs(5))
    ///     .await
    ///     .expect("starts");
    /// # }
    /// ```
    pub async fn load_linked(
        name: impl Into<String>,
        entry: extern "C" fn() -> *const EntryV1,
        executor: Option<PathBuf>,
        timeout: Duration,
    ) -> Result<Self, LoadError> {
        let path = PathBuf::from("(linked into this binary)");
        let entry = read_table(entry).map_err(|e| e.at(&path))?;
        let library = Arc::new(Loaded {
            name: name.into(),
            display_path: path,
            entry,
            executor,
        });
        start_runtime(library, timeout).await
    }

    /// A typed client; every call opens nothing new until the channel needs a
    /// connection, which is a fresh socket pair handed to the library.
    pub fn client(&self) -> PluginClient {
        PluginClient {
            name: self.inner.library.name.clone(),
            channel: self.inner.channel.clone(),
            exit: self.inner.exit.clone(),
            nomad: None,
        }
    }

    /// Name given in the options.
    pub fn name(&self) -> &str {
        &self.inner.library.name
    }

    /// Where the library came from.
    pub fn display_path(&self) -> &std::path::Path {
        &self.inner.library.display_path
    }

    /// Whether the plugin's runtime has stopped (shut down, or its runtime thread
    /// ended: a panic that escaped a task).
    pub fn has_exited(&self) -> bool {
        self.inner.exit.borrow().is_some()
    }

    /// Resolves when the plugin's runtime stops, saying why.
    pub async fn exited(&self) -> ExitOutcome {
        let mut exit = self.inner.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(e) => e
                .as_ref()
                .map_or_else(|| ExitOutcome::Other(String::new()), |e| e.outcome.clone()),
            Err(_) => ExitOutcome::Other("watcher gone".into()),
        }
    }

    /// Ask the plugin to shut down (`DriverPlugin::shutdown`, then its runtime stops),
    /// bounded like a process shutdown. Tasks keep running in their executors.
    pub async fn shutdown(&self) -> ExitOutcome {
        if !self.has_exited() {
            self.inner.stopping.store(true, Ordering::SeqCst);
            let stop = self.inner.library.entry.stop;
            let timeout_ms = SHUTDOWN_GRACE.as_millis() as u64;
            // SAFETY: `stop` comes from the checked entry table of a library that is
            // never unloaded; the buffer is the helper's, valid for the call.
            #[allow(unsafe_code)]
            let stopped =
                call_library(SHUTDOWN_GRACE + Duration::from_secs(1), move |err| unsafe {
                    stop(timeout_ms, err)
                })
                .await;
            if tokio::time::timeout(Duration::from_secs(1), self.exited())
                .await
                .is_err()
            {
                if let Err(reason) = stopped {
                    tracing::warn!(plugin = %self.name(), "in-process plugin did not stop: {reason}");
                }
                return ExitOutcome::Other(format!(
                    "the plugin's runtime did not stop within {SHUTDOWN_GRACE:?}; it is left running \
                     in the agent"
                ));
            }
        }
        self.exited().await
    }

    /// Start a fresh runtime in the already loaded library after it stopped (the
    /// supervisor's "relaunch"): a new [`InProcessPlugin`] sharing the library.
    pub async fn restart(&self, timeout: Duration) -> Result<InProcessPlugin, LoadError> {
        start_runtime(self.inner.library.clone(), timeout).await
    }
}

/// A driver library loaded into this process ([`InProcessLibrary::open`]), whose
/// runtime is started with [`InProcessLibrary::start`], as often as it stopped. Cheap to
/// clone. [`InProcessPlugin::load`] is `open` then `start`; keep the library to start
/// it again after a start that failed (a timeout on a busy machine).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use drover_plugin_sdk::client::{InProcessLibrary, InProcessOptions, sealed_copy};
/// use std::time::Duration;
/// let file = std::fs::File::open("plugins/rawexec.so")?;
/// let sealed = sealed_copy(&file.into(), "rawexec")?;
/// let library = InProcessLibrary::open(InProcessOptions::new("rawexec", sealed, "plugins/rawexec.so")).await?;
/// let plugin = match library.start(Duration::from_secs(5)).await {
///     Ok(p) => p,
///     // Its runtime stopped: try again.
///     Err(_) => library.start(Duration::from_secs(5)).await?,
/// };
/// plugin.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct InProcessLibrary {
    inner: Arc<Loaded>,
}

impl InProcessLibrary {
    /// Check the sealed copy's ELF image (a complete 64-bit shared object for this
    /// machine: every segment and the section headers inside the file, so that no page
    /// the dynamic linker touches lies past its end, which would kill the process with
    /// `SIGBUS`; dependencies found only in the system's library path), then `dlopen` it
    /// and check its entry symbol and ABI version, within `opts.timeout`. Until
    /// `dlopen` succeeds the copy is closed on every failure; after, it stays open for
    /// the life of the process.
    pub async fn open(opts: InProcessOptions) -> Result<Self, LoadError> {
        let path = opts.display_path.clone();
        let library = opts.library;
        let opened = tokio::task::spawn_blocking(move || {
            elf_check::check(&library).map_err(OpenError::Elf)?;
            open_library(library)
        });
        let entry = match tokio::time::timeout(opts.timeout, opened).await {
            Err(_) => {
                return Err(LoadError::Timeout {
                    path,
                    timeout: opts.timeout,
                });
            }
            Ok(Err(join)) => {
                return Err(LoadError::Start {
                    path,
                    reason: format!("loading failed: {join}"),
                });
            }
            Ok(Ok(r)) => r.map_err(|e| e.at(&path))?,
        };
        Ok(InProcessLibrary {
            inner: Arc::new(Loaded {
                name: opts.name,
                display_path: path,
                entry,
                executor: opts.executor,
            }),
        })
    }

    /// Start a runtime in the library and check its health within `timeout`. On
    /// [`LoadError::Start`] and [`LoadError::Timeout`] the runtime was stopped again and
    /// a later `start` may succeed; [`LoadError::NotStopped`] says it was not.
    pub async fn start(&self, timeout: Duration) -> Result<InProcessPlugin, LoadError> {
        start_runtime(self.inner.clone(), timeout).await
    }

    /// Where the library came from.
    pub fn display_path(&self) -> &std::path::Path {
        &self.inner.display_path
    }
}

/// A [`LoadError`] before its path is known.
enum OpenError {
    Elf(String),
    Dlopen(String),
    NoEntry,
    AbiVersion(u32),
    Start(String),
}

impl OpenError {
    fn at(self, path: &std::path::Path) -> LoadError {
        let path = path.to_owned();
        match self {
            OpenError::Elf(reason) => LoadError::Elf { path, reason },
            OpenError::Dlopen(reason) => LoadError::Dlopen { path, reason },
            OpenError::NoEntry => LoadError::NoEntry {
                path,
                symbol: ENTRY_SYMBOL.into(),
            },
            OpenError::AbiVersion(found) => LoadError::AbiVersion {
                path,
                found,
                expected: ABI_VERSION,
            },
            OpenError::Start(reason) => LoadError::Start { path, reason },
        }
    }
}

/// `dlopen` the sealed copy and read its entry table (blocking: the library's
/// initialisers run here).
///
/// The memfd stays open for the life of the process and the library is never
/// `dlclose`d, both on purpose: glibc recognises an already loaded library by its name,
/// here `/proc/self/fd/N`, so if N were closed and reused for another library, a later
/// `dlopen` of that name would silently return this one; and unloading code whose
/// threads and thread-locals may still be alive is undefined behaviour.
fn open_library(library: OwnedFd) -> Result<EntryV1, OpenError> {
    let name = format!("/proc/self/fd/{}", library.as_raw_fd());
    // SAFETY: loading runs the library's initialisers; the caller checked its bytes
    // (sealed, so they cannot have changed since) and the operator allowed it in
    // process. RTLD_NOW: a missing symbol fails here, not in the middle of a call;
    // RTLD_LOCAL: its symbols never interpose on the host's.
    #[allow(unsafe_code)]
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(name.as_str()),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .map_err(|e| OpenError::Dlopen(innermost(&e)))?;
    // Loaded: kept open for ever (see above). A failed dlopen left nothing mapped, so
    // `library` was closed on that path and its copy freed.
    let _ = library.into_raw_fd();
    // SAFETY: the symbol's type is the ABI's (a function without arguments returning
    // the table's address); it is only called after this lookup succeeded.
    #[allow(unsafe_code)]
    let entry_fn: EntryFn = match unsafe { lib.get::<EntryFn>(ENTRY_SYMBOL) } {
        Ok(f) => *f,
        Err(_) => {
            // A library is never unloaded, even a refused one (its initialisers ran).
            std::mem::forget(lib);
            return Err(OpenError::NoEntry);
        }
    };
    std::mem::forget(lib);
    read_table(entry_fn)
}

/// Call a library's entry function and check the table it returns: the version first,
/// nothing else read before it matches.
fn read_table(entry_fn: EntryFn) -> Result<EntryV1, OpenError> {
    // SAFETY: calling the entry the ABI defines; it only returns a static address.
    #[allow(unsafe_code)]
    let table = unsafe { entry_fn() };
    if table.is_null() {
        return Err(OpenError::Start(
            "its entry function returned no table".into(),
        ));
    }
    // SAFETY: every version of the table starts with the u32 version; nothing else is
    // read before it matches.
    #[allow(unsafe_code)]
    let version = unsafe { std::ptr::read(table.cast::<u32>()) };
    if version != ABI_VERSION {
        return Err(OpenError::AbiVersion(version));
    }
    // SAFETY: a version-1 table: the size field follows the version.
    #[allow(unsafe_code)]
    let size = unsafe { (*table).size } as usize;
    if size < std::mem::size_of::<EntryV1>() {
        return Err(OpenError::Start(format!(
            "its entry table is {size} bytes, shorter than version {ABI_VERSION}'s {}",
            std::mem::size_of::<EntryV1>()
        )));
    }
    // SAFETY: a complete version-1 table in a library that is never unloaded.
    #[allow(unsafe_code)]
    Ok(unsafe { *table })
}

/// The entry function's type.
type EntryFn = unsafe extern "C" fn() -> *const EntryV1;

/// The innermost cause's text (dlerror's message).
fn innermost(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg = s.to_string();
        src = s.source();
    }
    msg
}

/// Run one call into the library on a blocking thread, bounded by `bound` (a call that
/// overruns is left to finish on its thread). `call` gets the error buffer; a code other
/// than [`CODE_OK`] becomes its message.
async fn call_library(
    bound: Duration,
    call: impl FnOnce(ErrorBuf) -> i32 + Send + 'static,
) -> Result<(), String> {
    let blocking = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; ERROR_CAP];
        let mut len = 0usize;
        let code = call(ErrorBuf {
            ptr: buf.as_mut_ptr(),
            cap: buf.len(),
            len: &mut len,
        });
        buf.truncate(len.min(ERROR_CAP));
        (code, String::from_utf8_lossy(&buf).into_owned())
    });
    match tokio::time::timeout(bound, blocking).await {
        Err(_) => Err(format!("no answer within {bound:?}")),
        Ok(Err(e)) => Err(format!("the call failed: {e}")),
        Ok(Ok((CODE_OK, _))) => Ok(()),
        Ok(Ok((code, message))) if message.is_empty() => Err(format!("error code {code}")),
        Ok(Ok((_, message))) => Err(message),
    }
}

/// Start a runtime in `library` and connect to it: log pipe, `start`, channel, health.
async fn start_runtime(
    library: Arc<Loaded>,
    timeout: Duration,
) -> Result<InProcessPlugin, LoadError> {
    let started = Instant::now();
    let path = library.display_path.clone();
    let (log_read, log_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from)?;
    let log_read = tokio::net::unix::pipe::Receiver::from_owned_fd(log_read)?;
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let forwarded = spawn_stderr_forwarder(library.name.clone(), log_read, tail.clone());

    let stopping = Arc::new(AtomicBool::new(false));
    let (exit_tx, exit) = watch::channel(None);
    {
        let stopping = stopping.clone();
        tokio::spawn(async move {
            // The library closes the log when its runtime thread ends.
            let _ = forwarded.await;
            let outcome = if stopping.load(Ordering::SeqCst) {
                ExitOutcome::Code(0)
            } else {
                ExitOutcome::Other("the plugin's runtime stopped by itself (see its log)".into())
            };
            let _ = exit_tx.send(Some(Exit {
                status: None,
                outcome,
            }));
        });
    }

    let entry = library.entry;
    let executor = library
        .executor
        .as_ref()
        .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
        .unwrap_or_default();
    let log_fd = log_write.into_raw_fd();
    // SAFETY: `start` comes from the checked table of a never-unloaded library; the
    // args point to `executor` (moved into the closure, alive for the call) and the
    // helper's buffer; the log fd's ownership passes to the library.
    #[allow(unsafe_code)]
    let start = call_library(timeout, move |error| {
        let args = StartArgs {
            log_fd,
            executor_ptr: executor.as_ptr(),
            executor_len: executor.len(),
            error,
        };
        unsafe { (entry.start)(&args) }
    })
    .await;
    let healthy = match start {
        Err(reason) => Ok(Err(reason)),
        Ok(()) => {
            let left = timeout.saturating_sub(started.elapsed());
            tokio::time::timeout(left, async {
                let channel = connect(entry, left).await?;
                check_health(channel.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(channel)
            })
            .await
        }
    };
    let failed = match healthy {
        Ok(Ok(channel)) => {
            return Ok(InProcessPlugin {
                inner: Arc::new(Running {
                    library,
                    channel,
                    exit,
                    stopping,
                }),
            });
        }
        Ok(Err(reason)) => LoadError::Start {
            path,
            reason: format!("{reason}{}", format_tail(&tail)),
        },
        Err(_) => LoadError::Timeout { path, timeout },
    };
    // Leave nothing running: a later restart must find the library stopped.
    stopping.store(true, Ordering::SeqCst);
    let stop = entry.stop;
    let timeout_ms = SHUTDOWN_GRACE.as_millis() as u64;
    // SAFETY: as for `start`.
    #[allow(unsafe_code)]
    let _ = call_library(SHUTDOWN_GRACE + Duration::from_secs(1), move |err| unsafe {
        stop(timeout_ms, err)
    })
    .await;
    // The log's end is the runtime's end (or a start that never got that far).
    let mut exit = exit;
    let stopped = tokio::time::timeout(Duration::from_secs(1), exit.wait_for(Option::is_some))
        .await
        .is_ok_and(|r| r.is_ok());
    if stopped {
        return Err(failed);
    }
    let reason = match failed {
        LoadError::Timeout { timeout, .. } => {
            format!("it did not answer its health check within {timeout:?}")
        }
        other => other.to_string(),
    };
    Err(LoadError::NotStopped {
        path: library.display_path.clone(),
        reason,
    })
}

/// A gRPC channel whose every connection is a fresh socket pair, one end handed to the
/// library's `connect`.
async fn connect(entry: EntryV1, timeout: Duration) -> Result<Channel, String> {
    Endpoint::try_from("http://plugin")
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: http::Uri| async move {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            ours.set_nonblocking(true)?;
            let fd = theirs.into_raw_fd();
            let connect = entry.connect;
            // SAFETY: `connect` comes from the checked table of a never-unloaded
            // library; the fd's ownership passes to it.
            #[allow(unsafe_code)]
            call_library(CONNECT_BOUND, move |err| unsafe { connect(fd, err) })
                .await
                .map_err(std::io::Error::other)?;
            let stream = tokio::net::UnixStream::from_std(ours)?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }))
        .await
        .map_err(|e| innermost(&e))
}

/// Copy the bytes behind `fd` (from offset 0) into a fresh memfd and seal it against
/// every change (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`). Hash the
/// copy, check it, then pass it to [`InProcessOptions::library`]: nothing can change
/// the bytes between the check and `dlopen`.
///
/// ```
/// use std::io::Write as _;
/// let mut f = tempfile::tempfile().unwrap();
/// f.write_all(b"\x7fELF...").unwrap();
/// let sealed = drover_plugin_sdk::client::sealed_copy(&f.into(), "demo").unwrap();
/// let copy = std::fs::read(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&sealed))).unwrap();
/// assert_eq!(copy, b"\x7fELF...");
/// ```
pub fn sealed_copy(fd: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let memfd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    // In the kernel (sendfile): a debug build's library is tens of MB, and copying it
    // through a user-space buffer is most of a load's time.
    let mut offset = 0u64;
    loop {
        match rustix::fs::sendfile(&memfd, fd.as_fd(), Some(&mut offset), 1 << 30) {
            Ok(0) => break,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            // Not a regular file sendfile can read (a pipe): through a buffer.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) if offset == 0 => {
                copy_through_buffer(fd, &memfd)?;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    rustix::fs::seek(&memfd, rustix::fs::SeekFrom::Start(0))?;
    rustix::fs::fcntl_add_seals(
        &memfd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(memfd)
}

/// Copy everything `from` reads (from offset 0) to `to`'s current position.
fn copy_through_buffer(from: &OwnedFd, to: &OwnedFd) -> std::io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut offset = 0u64;
    loop {
        let n = match rustix::io::pread(from.as_fd(), &mut buf[..], offset) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Ok(());
        }
        let mut written = 0;
        while written < n {
            match rustix::io::write(to, &buf[written..n]) {
                Ok(w) => written += w,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        offset += n as u64;
    }
}

/// The ELF checks a library's sealed copy passes before `dlopen` ([`check_library`]).
mod elf_check {
    use std::os::fd::OwnedFd;

    use object::elf;
    use object::read::elf::{Dyn as _, FileHeader as _, ProgramHeader as _};
    use object::{Endianness, ReadCache};

    /// The host's `e_machine`; `None` on an architecture this list does not know (the
    /// dynamic linker still refuses a foreign one).
    const HOST_MACHINE: Option<elf::Machine> = if cfg!(target_arch = "x86_64") {
        Some(elf::EM_X86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(elf::EM_AARCH64)
    } else if cfg!(target_arch = "riscv64") {
        Some(elf::EM_RISCV)
    } else {
        None
    };

    /// Why the bytes must not reach `dlopen`, as a clause for an operator.
    pub(super) fn check(fd: &OwnedFd) -> Result<(), String> {
        let file = std::fs::File::from(fd.try_clone().map_err(|e| format!("cannot read it: {e}"))?);
        let size = file
            .metadata()
            .map_err(|e| format!("cannot stat it: {e}"))?
            .len();
        let cache = ReadCache::new(file);
        let data = &cache;
        let header = elf::FileHeader64::<Endianness>::parse(data).map_err(|_| {
            "it is not a 64-bit ELF file (its header is not one, or the file is shorter \
             than one)"
                .to_owned()
        })?;
        let endian = header.endian().map_err(|e| e.to_string())?;
        if endian != Endianness::default() {
            return Err("it is an ELF file of the other byte order than this host's".into());
        }
        let machine = header.e_machine(endian);
        if let Some(host) = HOST_MACHINE
            && machine != host
        {
            return Err(format!(
                "it is built for another machine (ELF e_machine {machine}, this host's is {host})"
            ));
        }
        if header.e_type(endian) != elf::ET_DYN {
            return Err(format!(
                "it is not a shared object (ELF e_type {}, a shared library's is {})",
                header.e_type(endian),
                elf::ET_DYN
            ));
        }
        let truncated = |what: String| {
            format!(
                "{what}, past the end of the file ({size} bytes): the file is truncated or \
                 still being written"
            )
        };
        let segments = header
            .program_headers(endian, data)
            .map_err(|_| truncated("its program headers do not lie inside the file".into()))?;
        if segments.is_empty() {
            return Err("it has no program headers: there is nothing to load".into());
        }
        for (i, s) in segments.iter().enumerate() {
            let (offset, filesz) = (s.p_offset(endian), s.p_filesz(endian));
            let end = offset.checked_add(filesz);
            if end.is_none_or(|end| end > size) {
                return Err(truncated(format!(
                    "its segment {i} ({}) covers bytes {offset}..{}",
                    s.p_type(endian),
                    offset.saturating_add(filesz)
                )));
            }
        }
        // Linkers write the section headers last: a copy cut anywhere loses them, even
        // where the loaded segments survive.
        header.section_headers(endian, data).map_err(|_| {
            truncated(format!(
                "its section headers (at byte {}) do not lie inside the file",
                header.e_shoff(endian)
            ))
        })?;
        check_dynamic(segments, endian, data)
    }

    /// `DT_NEEDED`, `DT_RPATH` and `DT_RUNPATH`: the library's dependencies must be
    /// found where the system's are, never relative to the working directory or to the
    /// copy (`$ORIGIN` is `/proc/self/fd` here).
    fn check_dynamic(
        segments: &[elf::ProgramHeader64<Endianness>],
        endian: Endianness,
        data: &ReadCache<std::fs::File>,
    ) -> Result<(), String> {
        let Some(dynamic) = segments
            .iter()
            .find(|s| s.p_type(endian) == elf::PT_DYNAMIC)
        else {
            return Ok(());
        };
        let entries = dynamic
            .dynamic(endian, data)
            .map_err(|_| "its dynamic section cannot be read".to_owned())?
            .unwrap_or(&[]);
        let value = |tag: elf::DynamicTag| {
            entries
                .iter()
                .find(|d| d.d_tag(endian) == tag)
                .map(|d| d.d_val(endian))
        };
        let mut strings: Vec<(elf::DynamicTag, u64)> = Vec::new();
        for d in entries {
            let tag = d.d_tag(endian);
            if tag == elf::DT_NULL {
                break;
            }
            for t in [elf::DT_NEEDED, elf::DT_RPATH, elf::DT_RUNPATH] {
                if tag == t {
                    strings.push((t, d.d_val(endian)));
                }
            }
        }
        if strings.is_empty() {
            return Ok(());
        }
        let (Some(strtab), Some(strsz)) = (value(elf::DT_STRTAB), value(elf::DT_STRSZ)) else {
            return Err("its dynamic section names libraries but has no string table".into());
        };
        let table = segments
            .iter()
            .filter(|s| s.p_type(endian) == elf::PT_LOAD)
            .find_map(|s| s.data_range(endian, data, strtab, strsz).ok().flatten())
            .ok_or("its dynamic string table lies outside its loaded segments")?;
        for (tag, offset) in strings {
            let text = usize::try_from(offset)
                .ok()
                .and_then(|o| table.get(o..))
                .and_then(|rest| rest.split(|b| *b == 0).next())
                .ok_or("a name in its dynamic section lies outside its string table")?;
            let text = String::from_utf8_lossy(text);
            if tag == elf::DT_NEEDED {
                if text.contains('/') {
                    return Err(format!(
                        "it needs the library {text:?} by a path (DT_NEEDED with a '/'): \
                         a driver library's dependencies must come from the system's \
                         library path"
                    ));
                }
                continue;
            }
            let name = if tag == elf::DT_RPATH {
                "DT_RPATH"
            } else {
                "DT_RUNPATH"
            };
            if let Some(entry) = text.split(':').find(|e| !e.starts_with('/')) {
                return Err(format!(
                    "its {name} {text:?} has the entry {entry:?}, which is not an absolute \
                     path: it would be resolved against the agent's working directory or \
                     the memfd the library is loaded from ($ORIGIN); rebuild it without \
                     that search path"
                ));
            }
            for entry in text.split(':') {
                let Ok(st) = rustix::fs::stat(entry) else {
                    continue;
                };
                let me = rustix::process::geteuid().as_raw();
                if st.st_mode & 0o022 != 0 || (st.st_uid != 0 && st.st_uid != me) {
                    return Err(format!(
                        "its {name} entry {entry:?} is a directory that other users may \
                         write (mode {:04o}, owner uid {}): one of them could plant a \
                         dependency there",
                        st.st_mode & 0o7777,
                        st.st_uid
                    ));
                }
            }
        }
        Ok(())
    }
}
