//! The plugin side of in-process plugins: the C ABI a driver library exports
//! ([`crate::export_driver!`]) and what the host tells it when it starts.
//!
//! Only integers, file descriptors and byte buffers cross the boundary, so a host and a
//! library built by different compilers (and with different copies of std, tokio and
//! tracing: a `cdylib` links its own) can work together:
//!
//! - [`EntryV1::start`] gets a log descriptor (a pipe's write end; the library's
//!   `tracing` writes the same JSON lines a plugin process writes to stderr there) and
//!   the program its executors run, builds the driver and starts a dedicated thread
//!   with a current-thread tokio runtime serving the very gRPC router a plugin process
//!   serves ([`crate::serve`]);
//! - [`EntryV1::connect`] hands it one end of a `socketpair`: one gRPC connection;
//! - [`EntryV1::stop`] runs `DriverPlugin::shutdown` (bounded), stops the runtime and
//!   joins its thread. `start` may then be called again.
//!
//! When the runtime stops (stop, `GRPCController/Shutdown`, or a panic that ended it)
//! the library closes the log descriptor: its end of file tells the host.
//!
//! Every entry point catches panics: a panic becomes [`CODE_PANICKED`] and its message,
//! never an unwind into the host.
//!
//! In a host, the library installs no signal handler, never exits the process, reads
//! no `PLUGIN_*` variable, has no socket directory and no orphan watch.

use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::driver::DriverPlugin;

/// The versioned entry symbol every driver library exports. A host looks it up with
/// `dlsym`; a library without it is not a Drover driver library.
///
/// ```
/// assert_eq!(drover_plugin_sdk::inproc::ENTRY_SYMBOL, "drover_plugin_entry_v1");
/// ```
pub const ENTRY_SYMBOL: &str = "drover_plugin_entry_v1";

/// The version of the in-process ABI the entry returns in its table. A host refuses a
/// library whose table carries another version.
pub const ABI_VERSION: u32 = 1;

/// An entry point succeeded.
pub const CODE_OK: i32 = 0;
/// An entry point failed; the reason is in the error buffer.
pub const CODE_ERROR: i32 = 1;
/// An entry point panicked (contained); the panic message is in the error buffer.
pub const CODE_PANICKED: i32 = 2;
/// `connect` or `stop` without a running runtime.
pub const CODE_NOT_RUNNING: i32 = 3;

/// The table [`ENTRY_SYMBOL`] returns, version 1. `abi_version` comes first and stays
/// first in every version, so a host reads it before trusting anything else.
///
/// ```
/// use drover_plugin_sdk::inproc::EntryV1;
/// // The layout a host relies on: the version in the first four bytes.
/// assert_eq!(std::mem::offset_of!(EntryV1, abi_version), 0);
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EntryV1 {
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// `size_of::<EntryV1>()` as the library was built.
    pub size: u32,
    /// Start the runtime. Returns a `CODE_*`.
    pub start: unsafe extern "C" fn(args: *const StartArgs) -> i32,
    /// Serve one connection on `fd` (ownership passes, even on failure). Returns a
    /// `CODE_*`.
    pub connect: unsafe extern "C" fn(fd: RawFd, error: ErrorBuf) -> i32,
    /// Shut the driver down and stop the runtime, waiting at most `timeout_ms`.
    /// Returns a `CODE_*`.
    pub stop: unsafe extern "C" fn(timeout_ms: u64, error: ErrorBuf) -> i32,
}

impl EntryV1 {
    /// The table for a library whose `start` is `start` (the macro's; everything else
    /// is the SDK's).
    pub const fn new(start: unsafe extern "C" fn(args: *const StartArgs) -> i32) -> Self {
        EntryV1 {
            abi_version: ABI_VERSION,
            size: std::mem::size_of::<EntryV1>() as u32,
            start,
            connect: connect_v1,
            stop: stop_v1,
        }
    }
}

/// A caller's buffer for an error message (UTF-8, not NUL-terminated): `len` receives
/// how many bytes were written, at most `cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ErrorBuf {
    /// The buffer (may be null: no message wanted).
    pub ptr: *mut u8,
    /// Its size.
    pub cap: usize,
    /// Receives the length written (may be null).
    pub len: *mut usize,
}

impl ErrorBuf {
    /// Copy as much of `message` as fits (cut at a character boundary).
    ///
    /// # Safety
    /// `ptr` must be null or valid for `cap` bytes of writes, `len` null or valid for a
    /// write, as `start`/`connect`/`stop` callers promise.
    #[allow(unsafe_code)]
    unsafe fn write(self, message: &str) {
        let mut n = message.len().min(self.cap);
        while !message.is_char_boundary(n) {
            n -= 1;
        }
        if !self.ptr.is_null() {
            // SAFETY: the caller gave `ptr` valid for `cap` bytes; n <= cap, and the
            // source is a distinct Rust string.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::copy_nonoverlapping(message.as_ptr(), self.ptr, n)
            };
        } else {
            n = 0;
        }
        if !self.len.is_null() {
            // SAFETY: the caller gave `len` valid for one write.
            #[allow(unsafe_code)]
            unsafe {
                self.len.write(n)
            };
        }
    }
}

/// What the host passes to [`EntryV1::start`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StartArgs {
    /// Where the library logs (JSON lines); ownership passes to the library, which
    /// closes it when its runtime stops. Negative: no log.
    pub log_fd: RawFd,
    /// The program its executors run (bytes of a path); empty: `/proc/self/exe`.
    pub executor_ptr: *const u8,
    /// Length of `executor_ptr`.
    pub executor_len: usize,
    /// For the error message.
    pub error: ErrorBuf,
}

/// The program executors run, as the host said at start.
static EXECUTOR_PROGRAM: RwLock<Option<PathBuf>> = RwLock::new(None);

/// The program a driver's executors run. A plugin process re-executes itself
/// (`/proc/self/exe`); a driver loaded into a host cannot (a `.so` is not a program),
/// so the host names the program at start, by default its own binary
/// (`/proc/self/exe` again, seen from the host).
///
/// ```
/// // In a plugin process (nothing loaded this as a library):
/// assert_eq!(drover_plugin_sdk::inproc::executor_program(), std::path::Path::new("/proc/self/exe"));
/// ```
pub fn executor_program() -> PathBuf {
    let given = match EXECUTOR_PROGRAM.read() {
        Ok(p) => p.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    given.unwrap_or_else(|| PathBuf::from("/proc/self/exe"))
}

/// The running runtime of this library.
struct Running {
    /// Connections to serve (std sockets; made tokio ones inside the runtime).
    connections: tokio::sync::mpsc::UnboundedSender<std::os::unix::net::UnixStream>,
    /// Cancelled to stop (also by `GRPCController/Shutdown`).
    stop: CancellationToken,
    /// Receives once the runtime thread is about to end.
    done: std::sync::mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

fn running() -> std::sync::MutexGuard<'static, Option<Running>> {
    match RUNNING.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// How long a start waits for a runtime that was told to stop to end.
const STOPPING_WAIT: Duration = Duration::from_secs(2);

/// How long the runtime thread waits for blocking work (`spawn_blocking`) when it ends.
const BLOCKING_GRACE: Duration = Duration::from_millis(500);

/// Log panics of this library's threads through its own `tracing` (to the log fd): a
/// library has its own std, so this hook is its own, never the host's.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            tracing::error!(
                thread = thread.name().unwrap_or("unnamed"),
                location,
                "panicked: {}",
                crate::server::panic_message(info.payload())
            );
        }));
    });
}

/// Run an entry point's body, turning a panic into [`CODE_PANICKED`] and its message.
fn guarded(error: ErrorBuf, body: impl FnOnce() -> Result<(), (i32, String)>) -> i32 {
    let (code, message) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => return CODE_OK,
        Ok(Err(e)) => e,
        Err(payload) => (
            CODE_PANICKED,
            format!(
                "panicked: {}",
                crate::server::panic_message(payload.as_ref())
            ),
        ),
    };
    // SAFETY: the host passed `error` as the ABI requires.
    #[allow(unsafe_code)]
    unsafe {
        error.write(&message)
    };
    code
}

/// The body of the `start` entry point [`crate::export_driver!`] generates: build the
/// driver with `make` on a fresh runtime thread and serve it.
///
/// # Safety
/// `args` must point to a valid [`StartArgs`] whose pointers are valid as documented.
#[doc(hidden)]
#[allow(unsafe_code)]
pub unsafe fn start_v1<D: DriverPlugin>(args: *const StartArgs, make: fn() -> D) -> i32 {
    if args.is_null() {
        return CODE_ERROR;
    }
    // SAFETY: the caller promises `args` points to a valid StartArgs.
    #[allow(unsafe_code)]
    let args = unsafe { *args };
    // SAFETY: ownership of the log fd passes to us (the ABI's contract); taken before
    // anything can fail so it is closed on every path.
    #[allow(unsafe_code)]
    let log = (args.log_fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(args.log_fd) });
    let executor = if args.executor_ptr.is_null() || args.executor_len == 0 {
        None
    } else {
        // SAFETY: the caller promises executor_ptr is valid for executor_len bytes.
        #[allow(unsafe_code)]
        let bytes = unsafe { std::slice::from_raw_parts(args.executor_ptr, args.executor_len) };
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    };
    guarded(args.error, move || start(make, log, executor))
}

fn start<D: DriverPlugin>(
    make: fn() -> D,
    log: Option<OwnedFd>,
    executor: Option<PathBuf>,
) -> Result<(), (i32, String)> {
    let mut slot = running();
    if let Some(old) = slot.take() {
        // A runtime told to stop (`GRPCController/Shutdown`) may still be finishing:
        // give it the time a stop takes (driver shutdown 1 s, then the runtime's end).
        let finished = old.thread.is_finished()
            || (old.stop.is_cancelled()
                && !matches!(
                    old.done.recv_timeout(STOPPING_WAIT),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                ));
        if !finished {
            *slot = Some(old);
            return Err((
                CODE_ERROR,
                "the plugin's runtime is already running in this library".into(),
            ));
        }
        let _ = old.thread.join();
    }
    crate::logging::set_log_sink(log.map(std::fs::File::from));
    crate::logging::init_inproc_logging();
    install_panic_hook();
    match EXECUTOR_PROGRAM.write() {
        Ok(mut p) => *p = executor,
        Err(poisoned) => *poisoned.into_inner() = executor,
    }

    let stop = CancellationToken::new();
    let (conn_tx, conn_rx) = tokio::sync::mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let thread_stop = stop.clone();
    let thread = std::thread::Builder::new()
        .name("drover-plugin".into())
        .spawn(move || {
            runtime_thread(make, conn_rx, thread_stop, ready_tx);
            // Closing the log tells the host the runtime stopped.
            crate::logging::set_log_sink(None);
            let _ = done_tx.send(());
        })
        .map_err(|e| (CODE_ERROR, format!("cannot start the plugin's thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => {
            let _ = thread.join();
            return Err((CODE_ERROR, reason));
        }
        Err(_) => {
            let _ = thread.join();
            return Err((
                CODE_ERROR,
                "the plugin's thread ended while starting".into(),
            ));
        }
    }
    *slot = Some(Running {
        connections: conn_tx,
        stop,
        done: done_rx,
        thread,
    });
    Ok(())
}

/// The runtime thread: build the runtime and the driver (its constructor may need a
/// runtime), say whether that worked, then serve until `stop`.
fn runtime_thread<D: DriverPlugin>(
    make: fn() -> D,
    connections: tokio::sync::mpsc::UnboundedReceiver<std::os::unix::net::UnixStream>,
    stop: CancellationToken,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    // One thread, as in a plugin process: control-plane I/O, blocking work on
    // spawn_blocking.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start the async runtime: {e}")));
            return;
        }
    };
    let driver = {
        let _guard = rt.enter();
        match std::panic::catch_unwind(make) {
            Ok(d) => Arc::new(d),
            Err(payload) => {
                let _ = ready.send(Err(format!(
                    "the driver's constructor panicked: {}",
                    crate::server::panic_message(payload.as_ref())
                )));
                return;
            }
        }
    };
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
            let router = crate::server::plugin_router(driver.clone(), stop.clone()).await;
            let _ = ready.send(Ok(()));
            tracing::info!(
                executor = %executor_program().display(),
                "serving in process"
            );
            let incoming = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::UnboundedReceiverStream::new(connections),
                tokio::net::UnixStream::from_std,
            );
            let server_stop = stop.clone();
            let server = tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, server_stop.cancelled_owned())
                    .await
            });
            stop.cancelled().await;
            crate::server::shutdown_driver(driver.as_ref()).await;
            let _ = tokio::time::timeout(crate::server::SHUTDOWN_GRACE, server).await;
        });
    }));
    if let Err(payload) = served {
        tracing::error!(
            "the plugin's runtime panicked and stopped: {}",
            crate::server::panic_message(payload.as_ref())
        );
    }
    rt.shutdown_timeout(BLOCKING_GRACE);
}

/// The `connect` entry point: serve one connection on `fd`.
///
/// # Safety
/// `fd` must be an open socket whose ownership passes to the library; `error` as in
/// [`ErrorBuf`].
#[allow(unsafe_code)]
unsafe extern "C" fn connect_v1(fd: RawFd, error: ErrorBuf) -> i32 {
    if fd < 0 {
        return CODE_ERROR;
    }
    // SAFETY: ownership of `fd` passes to us (the ABI's contract).
    #[allow(unsafe_code)]
    let stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    guarded(error, move || {
        stream
            .set_nonblocking(true)
            .map_err(|e| (CODE_ERROR, format!("cannot use the connection: {e}")))?;
        let slot = running();
        let Some(r) = slot.as_ref() else {
            return Err((
                CODE_NOT_RUNNING,
                "the plugin's runtime is not running".into(),
            ));
        };
        r.connections
            .send(stream)
            .map_err(|_| (CODE_NOT_RUNNING, "the plugin's runtime has stopped".into()))
    })
}

/// The `stop` entry point.
///
/// # Safety
/// `error` as in [`ErrorBuf`].
#[allow(unsafe_code)]
unsafe extern "C" fn stop_v1(timeout_ms: u64, error: ErrorBuf) -> i32 {
    guarded(error, move || {
        let mut slot = running();
        let Some(r) = slot.take() else {
            return Err((
                CODE_NOT_RUNNING,
                "the plugin's runtime is not running".into(),
            ));
        };
        r.stop.cancel();
        match r.done.recv_timeout(Duration::from_millis(timeout_ms)) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = r.thread.join();
                Ok(())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let message = format!(
                    "the plugin's runtime did not stop within {timeout_ms} ms; it is left running"
                );
                // Kept: a later start refuses while it runs, a later stop waits again.
                *slot = Some(r);
                Err((CODE_ERROR, message))
            }
        }
    })
}

/// Export a [`DriverPlugin`] as an in-process driver library: generates
/// `drover_plugin_entry_v1` ([`ENTRY_SYMBOL`]), which returns the [`EntryV1`] table
/// through which a host (the Drover agent with `in_process = true`) starts the driver
/// and talks to it with the same gRPC as a plugin process.
///
/// The argument is a path to a function (or a unit-struct-like constructor) taking no
/// arguments and returning the driver; it runs again at every start (a restart gets a
/// fresh driver).
///
/// The crate must build a shared library besides its rlib:
///
/// ```toml
/// [lib]
/// crate-type = ["rlib", "cdylib"]
/// ```
///
/// One binary must not link two libraries that each call the macro: both define the
/// same symbol and the link fails. (The `drover` binary links rawexec's rlib, which
/// calls it; that is the only one.)
///
/// ```
/// # use drover_plugin_sdk::*;
/// # use std::time::Duration;
/// pub struct MyDriver;
/// # impl DriverPlugin for MyDriver {
/// #   type Config = EmptyConfig;
/// #   type TaskConfig = EmptyConfig;
/// #   fn info(&self) -> PluginInfo { PluginInfo::new("my", "0.1.0") }
/// #   fn capabilities(&self) -> Capabilities { Capabilities::default() }
/// #   async fn fingerprint(&self) -> Fingerprint { Fingerprint::healthy("ready") }
/// #   async fn recover_task(&self, _: TaskHandle) -> Result<(), DriverError> { Ok(()) }
/// #   async fn start_task(&self, s: TaskSpec, _: EmptyConfig) -> Result<TaskHandle, DriverError> { TaskHandle::new(s, 1, &()) }
/// #   async fn wait_task(&self, _: &str) -> Result<ExitResult, DriverError> { Ok(ExitResult::code(0)) }
/// #   async fn stop_task(&self, _: &str, _: Duration, _: Signal) -> Result<(), DriverError> { Ok(()) }
/// #   async fn destroy_task(&self, _: &str, _: bool) -> Result<(), DriverError> { Ok(()) }
/// #   async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> { Err(DriverError::NotFound(id.into())) }
/// # }
/// impl MyDriver {
///     pub fn new() -> Self { MyDriver }
/// }
/// // In lib.rs:
/// drover_plugin_sdk::export_driver!(MyDriver::new);
/// # fn main() {
/// let table = unsafe { &*drover_plugin_entry_v1() };
/// assert_eq!(table.abi_version, drover_plugin_sdk::inproc::ABI_VERSION);
/// # }
/// ```
#[macro_export]
macro_rules! export_driver {
    ($constructor:path) => {
        /// The Drover in-process entry point (generated by `export_driver!`).
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub extern "C" fn drover_plugin_entry_v1() -> *const $crate::inproc::EntryV1 {
            #[allow(unsafe_code)]
            unsafe extern "C" fn start(args: *const $crate::inproc::StartArgs) -> i32 {
                // SAFETY: the host passes `args` as the ABI requires.
                unsafe { $crate::inproc::start_v1(args, $constructor) }
            }
            static ENTRY: $crate::inproc::EntryV1 = $crate::inproc::EntryV1::new(start);
            &ENTRY
        }
    };
}
