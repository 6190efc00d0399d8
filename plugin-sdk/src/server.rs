//! The plugin side: [`serve`] turns a [`DriverPlugin`] into a go-plugin compatible
//! plugin process.

use std::future::Future;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use drover_proto::goplugin;
use drover_proto::v1 as pb;
use futures_util::FutureExt as _;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

mod device;
mod nomad;
pub use nomad::{NOMAD_PLUGIN_API_VERSIONS, drover_task_id};

use crate::DriverError;
use crate::driver::DriverPlugin;
use crate::handshake::{self, HandshakeLine, PluginAddr};
use crate::signal::Signal;
use crate::transport::{ServerTransport, tls};
use crate::types::{
    AgentInfo, ExecChunk, ExecInput, ExecSession, TaskSpec, TerminalSize, from_duration,
    validate_task_id,
};

/// Largest gRPC message a plugin accepts or sends (go-plugin hosts allow more than
/// gRPC's 4 MiB default; task configs and exec output can be large).
///
/// ```
/// assert!(drover_plugin_sdk::server::MAX_MESSAGE_SIZE > 4 << 20);
/// ```
pub const MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// How long a plugin waits for in-flight calls after a shutdown request before it
/// exits anyway. go-plugin hosts kill the process 2 s after asking; and the host keeps
/// its connection open, so a graceful drain would always run into this limit.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_millis(50);

/// Fingerprints are resent at least this often even when nothing changed.
const FINGERPRINT_HEARTBEAT: Duration = Duration::from_secs(30);

/// How long StartTask waits for the task's attributes (an InspectTask in process) to
/// send along; past it the answer goes without them and the host asks itself.
const START_ATTRIBUTES_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a plugin with no host connected looks whether its socket is still where
/// it announced it. A plugin whose socket is gone (its agent's data dir was deleted)
/// can never be reached again, so it exits; see [`serve`].
///
/// ```
/// assert_eq!(drover_plugin_sdk::server::ORPHAN_CHECK_INTERVAL.as_secs(), 2);
/// ```
pub const ORPHAN_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Why a plugin could not start serving. [`serve`] logs it and exits 1; the host shows
/// the message as the reason the plugin was skipped.
///
/// ```
/// let e = drover_plugin_sdk::server::ServeError::Handshake(std::io::ErrorKind::BrokenPipe.into());
/// assert!(e.to_string().starts_with("cannot write the handshake line"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The socket directory could not be created.
    #[error("cannot create plugin socket directory under {dir}: {source}")]
    SocketDir {
        /// The parent directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The socket path does not fit in `sun_path`.
    #[error(
        "plugin socket path {path} is {len} bytes, longer than the {max} a unix socket allows; \
         set PLUGIN_UNIX_SOCKET_DIR (or TMPDIR) to a shorter directory"
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Binding the socket failed.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Writing the handshake line failed (stdout closed).
    #[error("cannot write the handshake line to stdout: {0}")]
    Handshake(std::io::Error),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// AutoMTLS could not be set up: `PLUGIN_CLIENT_CERT` is not a PEM certificate, or
    /// the plugin's own certificate could not be made.
    #[error("cannot set up automatic mTLS (PLUGIN_CLIENT_CERT): {0}")]
    AutoMtls(String),
}

/// Serve `driver` as a plugin process and exit. Call it from `main`.
///
/// It checks the magic cookie (a person running the binary by hand gets a sentence on
/// stderr and exit code 1). With Drover's cookie ([`handshake::MAGIC_COOKIE_KEY`]) it
/// speaks Drover's protocol, app protocol 1, as below. With only Nomad's
/// ([`handshake::NOMAD_MAGIC_COOKIE_KEY`], as a Nomad agent starts every binary in its
/// `plugin_dir`) it speaks Nomad's driver protocol instead, app protocol 2: Nomad's
/// `BasePlugin` and `Driver` services translated to the same `driver` (what maps and
/// what does not: docs/plugin-authoring.md, "Your driver in a Nomad agent";
/// [`drover_task_id`]; [`crate::LogMode::Direct`]). Drover's cookie wins when both are
/// set. It logs JSON lines to stderr, binds a unix socket (mode 0600
/// in a fresh 0700 directory), serves health, go-plugin's controller/stdio/broker and
/// Drover's BasePlugin and Driver services, prints the handshake line, ignores SIGINT,
/// and exits when the host calls `GRPCController.Shutdown` or sends SIGTERM.
///
/// It reads go-plugin's transport variables as go-plugin 1.6.3's `Serve` does. With
/// `PLUGIN_CLIENT_CERT` (a PEM certificate, AutoMTLS) it makes a fresh self-signed
/// certificate, serves TLS only, requires the host to present that certificate (or one
/// it issued), and prints its own certificate in the handshake's 6th field. With
/// `PLUGIN_MULTIPLEX_GRPC=true` each host connection is a yamux session whose streams
/// are gRPC connections; whenever the variable is set the handshake has a 7th field,
/// `true`.
///
/// A plugin outlives its host on purpose (the next agent reattaches to it through the
/// socket it announced). It also exits by itself when it is *orphaned*: no host
/// connection is open and its socket is no longer at the announced path (deleted, or
/// replaced by another file), checked every [`ORPHAN_CHECK_INTERVAL`]. That happens when
/// the agent's data dir (which holds the socket directory) is deleted: no host can ever
/// reach the plugin again. Exiting this way is like a host-requested shutdown:
/// [`DriverPlugin::shutdown`] runs and tasks keep running.
///
/// ```no_run
/// # struct MyDriver;
/// # impl MyDriver { fn new() -> Self { MyDriver } }
/// fn main() {
///     # /*
///     drover_plugin_sdk::serve(MyDriver::new())
///     # */
/// }
/// ```
pub fn serve<D: DriverPlugin>(driver: D) -> ! {
    let Some(protocol) = Protocol::from_env() else {
        let name = std::env::args()
            .next()
            .unwrap_or_else(|| "this program".into());
        eprintln!(
            "{name} is a Drover plugin. It is not meant to be run by hand: put it in a \
             Drover agent's plugin_dir (or a Nomad agent's: it speaks Nomad's driver \
             protocol too) and the agent will start it."
        );
        std::process::exit(1);
    };
    run_plugin(serve_async(driver, protocol))
}

/// Serve `plugin` as a device plugin process and exit. Call it from `main`.
///
/// It speaks Nomad's device protocol whichever host started it (a Drover agent, which
/// sets Drover's cookie and offers app protocols `1,2`, or a Nomad agent, which sets
/// Nomad's): go-plugin's handshake with app protocol 2, Nomad's `BasePlugin`
/// (`PluginInfo` says type `device`, API version `v0.1.0`; the config's JSON Schema
/// as an hclspec; `SetConfig` decodes msgpack into [`crate::device::DevicePlugin::Config`]) and
/// `hashicorp.nomad.plugins.device.DevicePlugin`:
///
/// - `Fingerprint`: [`crate::device::DevicePlugin::fingerprint`] at once and every
///   [`crate::device::DevicePlugin::fingerprint_interval`], sent when the groups changed (and at
///   least every 30 s); a failed fingerprint ends the stream with its error;
/// - `Reserve`: [`crate::device::DevicePlugin::reserve`];
/// - `Stats`: [`crate::device::DevicePlugin::stats`] at the interval the host asks for.
///
/// Everything else is as for [`serve`]: the socket, AutoMTLS and multiplexing, the
/// orphan check, SIGTERM and `GRPCController.Shutdown`, logs on stderr.
///
/// ```no_run
/// # use drover_plugin_sdk::device::*;
/// # use drover_plugin_sdk::{DriverError, EmptyConfig, PluginInfo};
/// # struct MyDevices;
/// # impl DevicePlugin for MyDevices {
/// #     type Config = EmptyConfig;
/// #     fn info(&self) -> PluginInfo { PluginInfo::new("my-devices", "0.1.0") }
/// #     async fn fingerprint(&self) -> Result<Vec<DeviceGroup>, DriverError> { Ok(vec![]) }
/// #     async fn reserve(&self, _: Vec<String>) -> Result<Reservation, DriverError> { Ok(Reservation::default()) }
/// # }
/// fn main() {
///     drover_plugin_sdk::server::serve_device(MyDevices)
/// }
/// ```
pub fn serve_device<P: crate::device::DevicePlugin>(plugin: P) -> ! {
    if Protocol::from_env().is_none() {
        let name = std::env::args()
            .next()
            .unwrap_or_else(|| "this program".into());
        eprintln!(
            "{name} is a Drover device plugin. It is not meant to be run by hand: put it \
             in a Drover (or Nomad) agent's plugin_dir and the agent will start it."
        );
        std::process::exit(1);
    }
    let stop = CancellationToken::new();
    let plugin = Arc::new(plugin);
    let serving = async move {
        let router = goplugin_router(stop.clone()).await;
        let router = device::add_services(router, plugin, stop.clone());
        serve_router(
            &[handshake::NOMAD_APP_PROTOCOL_VERSION],
            router,
            stop,
            async {},
        )
        .await
    };
    run_plugin(serving)
}

/// Run `serving` on a one-thread runtime with the plugin's logging, and exit with its
/// outcome.
fn run_plugin(serving: impl Future<Output = Result<(), ServeError>>) -> ! {
    crate::logging::init_plugin_logging();
    set_process_name();
    if crate::signal::reset_ignored_sigchld() {
        tracing::warn!(
            "this plugin was started with SIGCHLD ignored (by whoever started the agent); \
             set back to its default, so that the plugin reaps its own children"
        );
    }
    // One thread: a plugin is I/O-bound control-plane code. No worker threads to start
    // keeps launch latency low (cross-thread wake-ups are slow, especially in VMs) and
    // memory small. Drivers run blocking work with `tokio::task::spawn_blocking`.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime);
    let code = match runtime.and_then(|rt| rt.block_on(serving)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("plugin failed: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// Which host started the plugin, told by the magic cookie in its environment.
///
/// Drover's cookie wins when both are set: a Drover host sets both and offers app
/// protocols `1,2`, so that one launch tells it what a binary speaks; a binary on
/// this SDK then answers as a Drover plugin, exactly as it always did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// `drover.plugin.v1`, app protocol 1.
    Drover,
    /// Nomad's `hashicorp.nomad.plugins.*`, app protocol 2 (see `server/nomad.rs`).
    Nomad,
}

impl Protocol {
    fn from_env() -> Option<Protocol> {
        let has = |key, value| std::env::var(key).as_deref() == Ok(value);
        if has(handshake::MAGIC_COOKIE_KEY, handshake::MAGIC_COOKIE_VALUE) {
            Some(Protocol::Drover)
        } else if has(
            handshake::NOMAD_MAGIC_COOKIE_KEY,
            handshake::NOMAD_MAGIC_COOKIE_VALUE,
        ) {
            Some(Protocol::Nomad)
        } else {
            None
        }
    }

    fn app_protocol_versions(self) -> &'static [u32] {
        match self {
            Protocol::Drover => handshake::APP_PROTOCOL_VERSIONS,
            Protocol::Nomad => &[handshake::NOMAD_APP_PROTOCOL_VERSION],
        }
    }
}

/// Name the process after its binary. A host that runs the checked file through its
/// descriptor (`execveat`) leaves the kernel's name as the descriptor number ("3"),
/// which is what `ps` and `top` show.
fn set_process_name() {
    let Some(arg0) = std::env::args_os().next() else {
        return;
    };
    let base = Path::new(&arg0)
        .file_name()
        .map(|n| n.as_encoded_bytes().to_vec())
        .unwrap_or_default();
    // The kernel keeps 15 bytes.
    let base: Vec<u8> = base.into_iter().take(15).collect();
    if let Ok(name) = std::ffi::CString::new(base)
        && !name.is_empty()
    {
        let _ = nix::sys::prctl::set_name(&name);
    }
}

/// How the directory [`socket_dir`] makes for the socket is named: this, then random
/// characters. Hosts (and the agent's sweep) know a plugin's directory by it.
pub(crate) const SOCKET_DIR_PREFIX: &str = "drover-plugin-";

/// Create the 0700 socket directory and return it with the socket path inside.
fn socket_dir() -> Result<(tempfile::TempDir, PathBuf), ServeError> {
    let base = std::env::var_os(handshake::ENV_UNIX_SOCKET_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix(SOCKET_DIR_PREFIX)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(&base)
        .map_err(|source| ServeError::SocketDir {
            dir: base.clone(),
            source,
        })?;
    let path = dir.path().join("plugin.sock");
    check_socket_path(&path)?;
    Ok((dir, path))
}

/// Refuse a socket path longer than `sun_path` with a clear error rather than letting
/// bind fail with a cryptic one (or, on some systems, silently truncate it).
pub(crate) fn check_socket_path(path: &Path) -> Result<(), ServeError> {
    let len = path.as_os_str().len();
    if len > handshake::MAX_UNIX_SOCKET_PATH {
        return Err(ServeError::SocketPathTooLong {
            path: path.to_owned(),
            len,
            max: handshake::MAX_UNIX_SOCKET_PATH,
        });
    }
    Ok(())
}

/// What the host asked for through go-plugin's transport variables: how to carry
/// connections, and the handshake's 6th and 7th fields.
fn transport_from_env() -> Result<(ServerTransport, Option<String>, Option<bool>), ServeError> {
    let mut transport = ServerTransport::default();
    let mut server_cert = None;
    // go-plugin reads both with os.Getenv: set-but-empty is unset.
    let client_cert = std::env::var(handshake::ENV_CLIENT_CERT).unwrap_or_default();
    if !client_cert.is_empty() {
        let trusted = tls::parse_pem_certs(handshake::ENV_CLIENT_CERT, &client_cert)
            .map_err(|e| ServeError::AutoMtls(e.to_string()))?;
        let own = tls::generate_cert().map_err(|e| ServeError::AutoMtls(e.to_string()))?;
        transport.tls = Some(
            tls::server_config(&own, trusted).map_err(|e| ServeError::AutoMtls(e.to_string()))?,
        );
        server_cert = Some(tls::encode_handshake_cert(&own.der));
    }
    let multiplex = std::env::var(handshake::ENV_MULTIPLEX_GRPC).unwrap_or_default();
    transport.multiplex = handshake::parse_go_bool(&multiplex) == Some(true);
    // As go-plugin: any non-empty value gets `|true`, even one that parsed false (the
    // host then reads "supported" and does not ask for it).
    let multiplex_field = (!multiplex.is_empty()).then_some(true);
    Ok((transport, server_cert, multiplex_field))
}

async fn serve_async<D: DriverPlugin>(driver: D, protocol: Protocol) -> Result<(), ServeError> {
    let stop = CancellationToken::new();
    let driver = Arc::new(driver);
    let router = match protocol {
        Protocol::Drover => plugin_router(driver.clone(), stop.clone()).await,
        Protocol::Nomad => nomad_router(driver.clone(), stop.clone()).await,
    };
    serve_router(protocol.app_protocol_versions(), router, stop, async move {
        shutdown_driver(driver.as_ref()).await;
    })
    .await
}

/// Serve `router` on a fresh socket, announce it, and return once `stop` is cancelled
/// (SIGTERM, the host's Shutdown, or orphaned) and `shutdown` has run.
async fn serve_router(
    app_protocol_versions: &[u32],
    router: tonic::transport::server::Router,
    stop: CancellationToken,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (transport, server_cert, multiplex_grpc) = transport_from_env()?;
    let app_version = handshake::negotiate_app_protocol(
        app_protocol_versions,
        std::env::var(handshake::ENV_PROTOCOL_VERSIONS)
            .ok()
            .as_deref(),
    );
    let (dir, path) = socket_dir()?;
    let listener = tokio::net::UnixListener::bind(&path).map_err(|source| ServeError::Bind {
        path: path.clone(),
        source,
    })?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServeError::Bind {
            path: path.clone(),
            source,
        }
    })?;

    let socket_id = std::fs::symlink_metadata(&path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|source| ServeError::Bind {
            path: path.clone(),
            source,
        })?;

    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let incoming = crate::transport::accept_loop(
        listener,
        move |stream| Counted::new(stream, counter.clone()),
        transport,
    );
    let server_stop = stop.clone();
    let server = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, server_stop.cancelled_owned())
            .await
    });

    // The listener is bound and being served: only now announce it.
    let line = HandshakeLine {
        core_protocol_version: handshake::CORE_PROTOCOL_VERSION,
        app_protocol_version: app_version,
        addr: PluginAddr::Unix(path.clone()),
        server_cert,
        multiplex_grpc,
    };
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(ServeError::Handshake)?;
    }
    tracing::debug!(socket = %path.display(), "plugin serving");

    spawn_signal_handlers(stop.clone());
    spawn_orphan_watch(path.clone(), socket_id, connections, stop.clone());
    stop.cancelled().await;
    shutdown.await;
    // Open streams (Fingerprint, WaitTask) and the host's idle connection keep a
    // graceful shutdown waiting forever; give in-flight calls a moment, then exit.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
    drop(dir);
    Ok(())
}

/// The services a plugin serves, built here once for both forms (a plugin process's
/// socket and an in-process plugin's socket pairs): health, go-plugin's controller
/// (its Shutdown cancels `stop`), stdio and broker, and Drover's BasePlugin and Driver
/// over `driver`.
pub(crate) async fn plugin_router<D: DriverPlugin>(
    driver: Arc<D>,
    stop: CancellationToken,
) -> tonic::transport::server::Router {
    goplugin_router(stop.clone())
        .await
        .add_service(
            pb::base_plugin_server::BasePluginServer::new(BaseService(driver.clone()))
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
        .add_service(
            pb::driver_server::DriverServer::new(DriverService(driver, stop))
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
}

/// What a Nomad agent talks to: go-plugin's services and Nomad's BasePlugin and Driver
/// over `driver`.
async fn nomad_router<D: DriverPlugin>(
    driver: Arc<D>,
    stop: CancellationToken,
) -> tonic::transport::server::Router {
    let router = goplugin_router(stop.clone()).await;
    nomad::add_services(router, driver, stop)
}

/// go-plugin's own services: health ("plugin" serving), controller (its Shutdown
/// cancels `stop`), stdio and broker.
async fn goplugin_router(stop: CancellationToken) -> tonic::transport::server::Router {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("plugin", tonic_health::ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(goplugin::grpc_controller_server::GrpcControllerServer::new(
            Controller { stop: stop.clone() },
        ))
        .add_service(goplugin::grpc_stdio_server::GrpcStdioServer::new(Stdio {
            stop: stop.clone(),
        }))
        .add_service(goplugin::grpc_broker_server::GrpcBrokerServer::new(
            Broker { stop },
        ))
}

/// `DriverPlugin::shutdown`, bounded to 1 s, a panic in it logged and contained.
pub(crate) async fn shutdown_driver<D: DriverPlugin>(driver: &D) {
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        contained("Shutdown", driver.shutdown()),
    )
    .await;
}

/// Run one call into the driver, turning a panic into `Status::internal` for this RPC
/// alone: the plugin keeps serving every other call (in process, the panic would
/// otherwise end the plugin's runtime).
async fn contained<T>(rpc: &'static str, call: impl Future<Output = T>) -> Result<T, Status> {
    std::panic::AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .map_err(|payload| panicked(rpc, payload.as_ref()))
}

/// [`contained`] for the driver's synchronous methods.
fn contained_sync<T>(rpc: &'static str, call: impl FnOnce() -> T) -> Result<T, Status> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
        .map_err(|payload| panicked(rpc, payload.as_ref()))
}

fn panicked(rpc: &str, payload: &(dyn std::any::Any + Send)) -> Status {
    let message = panic_message(payload);
    tracing::error!(rpc, "driver panicked: {message}");
    Status::internal(format!("driver panicked in {rpc}: {message}"))
}

/// The text of a panic (`panic!("...")` carries a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// SIGINT is ignored (a Ctrl-C at the agent's terminal must not kill plugins; the
/// host drives shutdown). SIGTERM shuts down gracefully.
fn spawn_signal_handlers(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    if let Ok(mut int) = signal(SignalKind::interrupt()) {
        tokio::spawn(async move { while int.recv().await.is_some() {} });
    }
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        tokio::spawn(async move {
            if term.recv().await.is_some() {
                tracing::info!("SIGTERM received, shutting down");
                stop.cancel();
            }
        });
    }
}

/// Exit (through `stop`) once no host is connected and the socket at `path` is no
/// longer the one this process bound (`socket_id`: device and inode).
fn spawn_orphan_watch(
    path: PathBuf,
    socket_id: (u64, u64),
    connections: Arc<AtomicUsize>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(ORPHAN_CHECK_INTERVAL) => {}
                () = stop.cancelled() => return,
            }
            if connections.load(Ordering::SeqCst) > 0 {
                continue;
            }
            let gone = match std::fs::symlink_metadata(&path) {
                Ok(m) => (m.dev(), m.ino()) != socket_id,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            };
            if gone {
                tracing::warn!(
                    socket = %path.display(),
                    "no host is connected and the plugin socket is gone (its agent's data dir \
                     was deleted?): no host can reach this plugin again; exiting, tasks keep running"
                );
                stop.cancel();
                return;
            }
        }
    });
}

/// A host connection, counted while it is open (a multiplexed session counts once).
struct Counted {
    stream: tokio::net::UnixStream,
    open: Arc<AtomicUsize>,
}

impl Counted {
    fn new(stream: tokio::net::UnixStream, open: Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Counted { stream, open }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

struct Controller {
    stop: CancellationToken,
}

#[tonic::async_trait]
impl goplugin::grpc_controller_server::GrpcController for Controller {
    async fn shutdown(
        &self,
        _: Request<goplugin::Empty>,
    ) -> Result<Response<goplugin::Empty>, Status> {
        tracing::debug!("shutdown requested by host");
        // Stop at once: the server shuts down gracefully, which still sends this very
        // answer (an RPC in flight is finished, only new ones are refused), and the
        // plugin-lifetime streams (stdio, broker, fingerprints) end with `stop`, so a
        // host with nothing else in flight sees the process exit right after the answer.
        self.stop.cancel();
        Ok(Response::new(goplugin::Empty {}))
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A stream that sends nothing and ends when the plugin stops: a subscription for the
/// plugin's lifetime must not hold up its shutdown.
fn silent_until<T: Send + 'static>(stop: &CancellationToken) -> BoxStream<T> {
    let stopped = stop.clone().cancelled_owned();
    Box::pin(futures_util::StreamExt::filter_map(
        futures_util::stream::once(stopped),
        |()| async { None },
    ))
}

/// go-plugin's stdio mirror. Drover plugins log to stderr directly, so the stream stays
/// open and sends nothing until the plugin stops.
struct Stdio {
    stop: CancellationToken,
}

#[tonic::async_trait]
impl goplugin::grpc_stdio_server::GrpcStdio for Stdio {
    type StreamStdioStream = BoxStream<goplugin::StdioData>;
    async fn stream_stdio(
        &self,
        _: Request<()>,
    ) -> Result<Response<Self::StreamStdioStream>, Status> {
        Ok(Response::new(silent_until(&self.stop)))
    }
}

/// go-plugin's connection broker. Drover multiplexes nothing over it; the stream stays
/// open and sends nothing until the plugin stops.
struct Broker {
    stop: CancellationToken,
}

#[tonic::async_trait]
impl goplugin::grpc_broker_server::GrpcBroker for Broker {
    type StartStreamStream = BoxStream<goplugin::ConnInfo>;
    async fn start_stream(
        &self,
        _: Request<tonic::Streaming<goplugin::ConnInfo>>,
    ) -> Result<Response<Self::StartStreamStream>, Status> {
        Ok(Response::new(silent_until(&self.stop)))
    }
}

/// The fingerprint stream of either protocol: `driver.fingerprint()` now and every
/// `fingerprint_interval`, sent (as `map` makes it) when it changed and at least every
/// [`FINGERPRINT_HEARTBEAT`]; it ends when the plugin stops.
fn fingerprint_stream<D: DriverPlugin, T: Send + 'static>(
    driver: Arc<D>,
    stop: CancellationToken,
    map: fn(crate::Fingerprint) -> T,
) -> BoxStream<T> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut last = None;
        let mut last_sent = Instant::now();
        loop {
            let fp = match contained("Fingerprint", driver.fingerprint()).await {
                Ok(fp) => fp,
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            if last.as_ref() != Some(&fp) || last_sent.elapsed() >= FINGERPRINT_HEARTBEAT {
                if tx.send(Ok(map(fp.clone()))).await.is_err() {
                    return;
                }
                last_sent = Instant::now();
                last = Some(fp);
            }
            tokio::select! {
                () = tokio::time::sleep(driver.fingerprint_interval()) => {}
                () = tx.closed() => return,
                // Dropping `tx` ends the stream: the host learns the plugin is going.
                () = stop.cancelled() => return,
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The stats stream of either protocol: a sample of `task_id` every `interval` (at
/// least 100 ms), as `map` makes it. The first sample answers the call, so an
/// unsupported or unknown task fails the call itself.
async fn stats_stream<D: DriverPlugin, T: Send + 'static>(
    driver: Arc<D>,
    task_id: String,
    interval: Duration,
    map: impl Fn(crate::TaskStats) -> T + Send + 'static,
) -> Result<BoxStream<T>, Status> {
    let interval = interval.max(Duration::from_millis(100));
    let first = contained("TaskStats", driver.task_stats(&task_id)).await??;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut sample = Ok(first);
        loop {
            let msg = sample.map(&map).map_err(Status::from);
            let failed = msg.is_err();
            if tx.send(msg).await.is_err() || failed {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = tx.closed() => return,
            }
            sample = match contained("TaskStats", driver.task_stats(&task_id)).await {
                Ok(sample) => sample,
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// The task event stream of either protocol, as `map` makes each event; a driver
/// without events answers UNIMPLEMENTED, one that fell behind DATA_LOSS.
fn events_stream<D: DriverPlugin, T: Send + 'static>(
    driver: &D,
    map: impl Fn(crate::TaskEvent) -> T + Send + 'static,
) -> Result<BoxStream<T>, Status> {
    let Some(mut events) = contained_sync("TaskEvents", || driver.task_events())? else {
        return Err(DriverError::Unimplemented("TaskEvents".into()).into());
    };
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let msg = match events.recv().await {
                Ok(e) => Ok(map(e)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    Err(Status::data_loss(format!("{n} task events were dropped")))
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(msg).await.is_err() {
                return;
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

fn schema_json<T: schemars::JsonSchema>() -> String {
    serde_json::to_string(&schemars::schema_for!(T)).unwrap_or_else(|_| "{}".into())
}

/// Parse JSON text into a typed config; an empty text is an empty object.
fn parse_config<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Result<T, DriverError> {
    let text = if json.trim().is_empty() { "{}" } else { json };
    serde_json::from_str(text).map_err(|e| DriverError::InvalidConfig(format!("{what}: {e}")))
}

struct BaseService<D>(Arc<D>);

#[tonic::async_trait]
impl<D: DriverPlugin> pb::base_plugin_server::BasePlugin for BaseService<D> {
    async fn plugin_info(
        &self,
        _: Request<pb::PluginInfoRequest>,
    ) -> Result<Response<pb::PluginInfoResponse>, Status> {
        let info = contained_sync("PluginInfo", || self.0.info())?;
        Ok(Response::new(pb::PluginInfoResponse {
            r#type: pb::PluginType::Driver as i32,
            name: info.name,
            plugin_version: info.version,
            plugin_api_versions: contained_sync("PluginInfo", || self.0.api_versions())?,
        }))
    }

    async fn config_schema(
        &self,
        _: Request<pb::ConfigSchemaRequest>,
    ) -> Result<Response<pb::ConfigSchemaResponse>, Status> {
        Ok(Response::new(pb::ConfigSchemaResponse {
            json_schema: schema_json::<D::Config>(),
        }))
    }

    async fn set_config(
        &self,
        req: Request<pb::SetConfigRequest>,
    ) -> Result<Response<pb::SetConfigResponse>, Status> {
        let req = req.into_inner();
        let config: D::Config = parse_config("plugin config", &req.config_json)?;
        let agent = req.agent_config.unwrap_or_default();
        let info = AgentInfo {
            alloc_dir: agent.alloc_dir.into(),
            plugin_state_dir: agent.plugin_state_dir.into(),
            api_version: req.plugin_api_version,
        };
        contained("SetConfig", self.0.set_config(config, info)).await??;
        Ok(Response::new(pb::SetConfigResponse {}))
    }
}

/// The driver's services; `.1` is the plugin's stop, which ends its fingerprint streams.
struct DriverService<D>(Arc<D>, CancellationToken);

#[tonic::async_trait]
impl<D: DriverPlugin> pb::driver_server::Driver for DriverService<D> {
    async fn task_config_schema(
        &self,
        _: Request<pb::TaskConfigSchemaRequest>,
    ) -> Result<Response<pb::TaskConfigSchemaResponse>, Status> {
        Ok(Response::new(pb::TaskConfigSchemaResponse {
            json_schema: schema_json::<D::TaskConfig>(),
        }))
    }

    async fn capabilities(
        &self,
        _: Request<pb::CapabilitiesRequest>,
    ) -> Result<Response<pb::CapabilitiesResponse>, Status> {
        Ok(Response::new(pb::CapabilitiesResponse {
            capabilities: Some(contained_sync("Capabilities", || self.0.capabilities())?.into()),
        }))
    }

    type FingerprintStream = BoxStream<pb::FingerprintResponse>;

    async fn fingerprint(
        &self,
        _: Request<pb::FingerprintRequest>,
    ) -> Result<Response<Self::FingerprintStream>, Status> {
        Ok(Response::new(fingerprint_stream(
            self.0.clone(),
            self.1.clone(),
            pb::FingerprintResponse::from,
        )))
    }

    async fn start_task(
        &self,
        req: Request<pb::StartTaskRequest>,
    ) -> Result<Response<pb::StartTaskResponse>, Status> {
        let task = req
            .into_inner()
            .task
            .ok_or_else(|| Status::invalid_argument("StartTask without a task"))?;
        let spec = TaskSpec::from(task);
        validate_task_id(&spec.id)?;
        let config: D::TaskConfig = parse_config("task config", &spec.driver_config_json)?;
        let id = spec.id.clone();
        let handle = contained("StartTask", self.0.start_task(spec, config)).await??;
        // The task's facts ride along, saving the host an InspectTask round trip; a
        // driver that cannot say yet leaves them out and the host asks.
        // Bounded: a slow InspectTask must not hold up the start's answer.
        let inspect = contained("InspectTask", self.0.inspect_task(&id));
        let attributes = match tokio::time::timeout(START_ATTRIBUTES_TIMEOUT, inspect).await {
            Ok(Ok(Ok(status))) => status.attributes.into_iter().collect(),
            _ => Default::default(),
        };
        Ok(Response::new(pb::StartTaskResponse {
            handle: Some(handle.into()),
            attributes,
        }))
    }

    async fn wait_task(
        &self,
        req: Request<pb::WaitTaskRequest>,
    ) -> Result<Response<pb::WaitTaskResponse>, Status> {
        let result = contained("WaitTask", self.0.wait_task(&req.into_inner().task_id)).await??;
        Ok(Response::new(pb::WaitTaskResponse {
            result: Some(result.into()),
        }))
    }

    async fn stop_task(
        &self,
        req: Request<pb::StopTaskRequest>,
    ) -> Result<Response<pb::StopTaskResponse>, Status> {
        let req = req.into_inner();
        let timeout = from_duration(req.timeout).unwrap_or(Duration::from_secs(5));
        // The wire's empty signal is the protocol's default, SIGTERM.
        let signal = Signal::parse_or_default(&req.signal).map_err(DriverError::from)?;
        contained("StopTask", self.0.stop_task(&req.task_id, timeout, signal)).await??;
        Ok(Response::new(pb::StopTaskResponse {}))
    }

    async fn destroy_task(
        &self,
        req: Request<pb::DestroyTaskRequest>,
    ) -> Result<Response<pb::DestroyTaskResponse>, Status> {
        let req = req.into_inner();
        contained("DestroyTask", self.0.destroy_task(&req.task_id, req.force)).await??;
        Ok(Response::new(pb::DestroyTaskResponse {}))
    }

    async fn inspect_task(
        &self,
        req: Request<pb::InspectTaskRequest>,
    ) -> Result<Response<pb::InspectTaskResponse>, Status> {
        let status = contained(
            "InspectTask",
            self.0.inspect_task(&req.into_inner().task_id),
        )
        .await??;
        Ok(Response::new(pb::InspectTaskResponse {
            task: Some(status.into()),
        }))
    }

    async fn recover_task(
        &self,
        req: Request<pb::RecoverTaskRequest>,
    ) -> Result<Response<pb::RecoverTaskResponse>, Status> {
        let req = req.into_inner();
        let handle = req
            .handle
            .ok_or_else(|| Status::invalid_argument("RecoverTask without a handle"))?;
        let mut handle = crate::TaskHandle::from(handle);
        if handle.spec.id.is_empty() {
            handle.spec.id = req.task_id;
        }
        validate_task_id(&handle.spec.id)?;
        contained("RecoverTask", self.0.recover_task(handle)).await??;
        Ok(Response::new(pb::RecoverTaskResponse {}))
    }

    async fn signal_task(
        &self,
        req: Request<pb::SignalTaskRequest>,
    ) -> Result<Response<pb::SignalTaskResponse>, Status> {
        let req = req.into_inner();
        // Empty is SIGTERM here too, as it always was on the wire.
        let signal = Signal::parse_or_default(&req.signal).map_err(DriverError::from)?;
        contained("SignalTask", self.0.signal_task(&req.task_id, signal)).await??;
        Ok(Response::new(pb::SignalTaskResponse {}))
    }

    type TaskStatsStream = BoxStream<pb::TaskStatsResponse>;

    async fn task_stats(
        &self,
        req: Request<pb::TaskStatsRequest>,
    ) -> Result<Response<Self::TaskStatsStream>, Status> {
        let req = req.into_inner();
        let interval = from_duration(req.interval)
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(100));
        let task_id = req.task_id;
        let stream = stats_stream(self.0.clone(), task_id.clone(), interval, move |s| {
            s.into_pb(task_id.clone())
        })
        .await?;
        Ok(Response::new(stream))
    }

    type TaskEventsStream = BoxStream<pb::DriverTaskEvent>;

    async fn task_events(
        &self,
        _: Request<pb::TaskEventsRequest>,
    ) -> Result<Response<Self::TaskEventsStream>, Status> {
        Ok(Response::new(events_stream(
            self.0.as_ref(),
            pb::DriverTaskEvent::from,
        )?))
    }

    async fn exec_task(
        &self,
        req: Request<pb::ExecTaskRequest>,
    ) -> Result<Response<pb::ExecTaskResponse>, Status> {
        let req = req.into_inner();
        if req.command.is_empty() {
            return Err(Status::invalid_argument("ExecTask needs a command"));
        }
        let timeout = from_duration(req.timeout).unwrap_or(Duration::from_secs(60));
        let out = contained(
            "ExecTask",
            self.0.exec_task(&req.task_id, req.command, timeout),
        )
        .await??;
        Ok(Response::new(pb::ExecTaskResponse {
            stdout: out.stdout,
            stderr: out.stderr,
            result: Some(out.result.into()),
        }))
    }

    type ExecTaskStreamingStream = BoxStream<pb::ExecTaskStreamingResponse>;

    async fn exec_task_streaming(
        &self,
        req: Request<tonic::Streaming<pb::ExecTaskStreamingRequest>>,
    ) -> Result<Response<Self::ExecTaskStreamingStream>, Status> {
        use pb::exec_task_streaming_request::Msg as In;
        use pb::exec_task_streaming_response::Msg as Out;
        let mut inbound = req.into_inner();
        let setup = match inbound.message().await? {
            Some(pb::ExecTaskStreamingRequest {
                msg: Some(In::Setup(setup)),
            }) => setup,
            _ => {
                return Err(Status::invalid_argument(
                    "ExecTaskStreaming: the first message must be the setup",
                ));
            }
        };
        if setup.command.is_empty() {
            return Err(Status::invalid_argument(
                "ExecTaskStreaming needs a command",
            ));
        }
        let inputs = async_stream_of(inbound, |m| match m.msg {
            Some(In::Stdin(data)) => Some(ExecInput::Stdin(data)),
            Some(In::StdinClose(true)) => Some(ExecInput::StdinClosed),
            Some(In::TtySize(size)) => Some(ExecInput::Resize(TerminalSize {
                rows: u16::try_from(size.rows).unwrap_or(u16::MAX),
                cols: u16::try_from(size.cols).unwrap_or(u16::MAX),
            })),
            _ => None,
        });
        Ok(Response::new(exec_session_stream(
            self.0.clone(),
            setup.task_id,
            setup.command,
            setup.tty,
            inputs,
            |chunk| pb::ExecTaskStreamingResponse {
                msg: Some(match chunk {
                    ExecChunk::Stdout(d) => Out::Stdout(d),
                    ExecChunk::Stderr(d) => Out::Stderr(d),
                }),
            },
            |result| pb::ExecTaskStreamingResponse {
                msg: Some(Out::Exited(result.into())),
            },
        )))
    }
}

/// The inputs of a client stream of exec requests, mapped by `map` (`None`: ignored),
/// fed into a channel until the stream ends or fails.
pub(crate) fn async_stream_of<M: Send + 'static>(
    mut inbound: tonic::Streaming<M>,
    map: impl Fn(M) -> Option<ExecInput> + Send + 'static,
) -> tokio::sync::mpsc::Receiver<ExecInput> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok(Some(m)) = inbound.message().await {
            if let Some(input) = map(m)
                && tx.send(input).await.is_err()
            {
                return;
            }
        }
    });
    rx
}

/// Run the driver's interactive exec of `command` in `task_id` with `inputs`, as a
/// stream of answers: what the command writes (`chunk`), then how it ended
/// (`exited`), or the driver's error. The command is killed when the stream's
/// receiver goes away (the driver sees its input end).
pub(crate) fn exec_session_stream<D: DriverPlugin, T: Send + 'static>(
    driver: Arc<D>,
    task_id: String,
    command: Vec<String>,
    tty: bool,
    mut inputs: tokio::sync::mpsc::Receiver<ExecInput>,
    chunk: impl Fn(ExecChunk) -> T + Send + 'static,
    exited: impl FnOnce(crate::types::ExitResult) -> T + Send + 'static,
) -> BoxStream<T> {
    let (session, in_tx, mut out_rx) = ExecSession::channel(command, tty, 16);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<T, Status>>(16);
    // The caller's inputs, until the caller goes (its stream ends or the answer's
    // receiver is dropped): then the driver's input ends and it kills the command.
    let closed = tx.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                input = inputs.recv() => match input {
                    Some(i) => if in_tx.send(i).await.is_err() { return },
                    None => break,
                },
                () = closed.closed() => return,
            }
        }
        // The request stream ended: keep the driver's input open until the answer's
        // receiver goes (a client may half-close after its last input).
        closed.closed().await;
    });
    tokio::spawn(async move {
        let run = contained(
            "ExecTaskStreaming",
            driver.exec_task_streaming(&task_id, session),
        );
        tokio::pin!(run);
        let result = loop {
            tokio::select! {
                r = &mut run => break r,
                Some(c) = out_rx.recv() => {
                    if tx.send(Ok(chunk(c))).await.is_err() {
                        // The caller went away: the driver sees its output close
                        // (and its input end) and kills the command.
                        out_rx.close();
                    }
                }
                () = tx.closed(), if !out_rx.is_closed() => out_rx.close(),
            }
        };
        // What the driver sent before it returned.
        out_rx.close();
        while let Ok(c) = out_rx.try_recv() {
            let _ = tx.send(Ok(chunk(c))).await;
        }
        let last = match result {
            Ok(Ok(r)) => Ok(exited(r)),
            Ok(Err(e)) => Err(Status::from(e)),
            Err(status) => Err(status),
        };
        let _ = tx.send(last).await;
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
