//! Launching a plugin binary: spawn, handshake, connect; its liveness and shutdown.

use std::collections::VecDeque;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_proto::goplugin;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tonic::transport::{Channel, Endpoint};

use crate::handshake::{self, HandshakeError, HandshakeLine, PluginAddr};
use crate::types::ExitOutcome;

use super::PluginClient;
use super::reattach_tls::ReattachTls;
use crate::transport::{ClientTransport, Io, mux, tls};

/// How many lines of a plugin's stderr are kept to explain a failed launch.
const STDERR_TAIL_LINES: usize = 8;
/// Longest handshake line accepted; a plugin that prints more without a newline is
/// printing garbage.
const MAX_HANDSHAKE_LINE: u64 = 4096;
/// Longest stdout/stderr line of a plugin that is kept; the rest of a longer line is
/// dropped, so a plugin printing an endless line cannot grow the host's memory.
pub const MAX_PLUGIN_LINE: usize = 16 * 1024;
/// How long a plugin may take to exit after `GRPCController.Shutdown` (go-plugin's value).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How to start a plugin.
///
/// ```
/// use drover_plugin_sdk::client::LaunchOptions;
/// let opts = LaunchOptions::new("rawexec", "/usr/lib/drover/plugins/rawexec");
/// assert_eq!(opts.handshake_timeout, std::time::Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LaunchOptions {
    /// Name used in logs until the plugin tells its own.
    pub name: String,
    /// The executable.
    pub command: PathBuf,
    /// Its arguments (built-in drivers: `plugin serve NAME`).
    pub args: Vec<OsString>,
    /// Which of the host's environment variables the plugin inherits.
    pub host_env: HostEnv,
    /// Extra environment, on top of what `host_env` passes. The handshake's own
    /// variables (the cookie, `PLUGIN_*`) are set last and always win.
    pub env: Vec<(OsString, OsString)>,
    /// Time from spawn to a healthy connection.
    pub handshake_timeout: Duration,
    /// Passed as `PLUGIN_UNIX_SOCKET_DIR` when set.
    pub socket_dir: Option<PathBuf>,
    /// App protocol versions the host speaks.
    pub app_protocol_versions: Vec<u32>,
    /// An open descriptor of the binary to run. When set, the process executes exactly
    /// this open file (`execveat(fd, "", AT_EMPTY_PATH)`) and `command` is only its
    /// `argv[0]` and the name in messages: a host that checked the file's owner, mode and
    /// hash on this descriptor runs the bytes it checked, whatever happens to the path
    /// meanwhile. A `#!` script is run too: its interpreter reads the same open file as
    /// `/dev/fd/N` (so the script sees `$0 = /dev/fd/N`). When `None`, `command` is
    /// executed by path.
    ///
    /// ```no_run
    /// use std::os::fd::OwnedFd;
    /// use drover_plugin_sdk::client::LaunchOptions;
    /// let file = std::fs::File::open("/usr/lib/drover/plugins/skeleton").unwrap();
    /// let mut opts = LaunchOptions::new("skeleton", "/usr/lib/drover/plugins/skeleton");
    /// opts.executable = Some(std::sync::Arc::new(OwnedFd::from(file)));
    /// ```
    pub executable: Option<Arc<OwnedFd>>,
    /// go-plugin's automatic mutual TLS: send the plugin a fresh certificate
    /// (`PLUGIN_CLIENT_CERT`), require its own in the handshake line, and speak TLS with
    /// exactly that certificate on the other end. The certificates go into
    /// [`PluginProcess::reattach_config`], so a later host reconnects with TLS too.
    pub auto_mtls: bool,
    /// go-plugin 1.6's gRPC broker multiplexing: set `PLUGIN_MULTIPLEX_GRPC=true`,
    /// require the plugin's handshake to say it supports it, and run the gRPC
    /// connections as streams of one yamux session over a single connection.
    pub multiplex_grpc: bool,
    /// Also accept plugins that speak Nomad's driver protocol: the plugin is started
    /// with Nomad's cookie beside Drover's and offered app protocols 1 and 2, so one
    /// launch tells which it speaks (its handshake names the version it chose). A Nomad
    /// plugin is then driven through a bridge that needs these host settings. `None`:
    /// Drover plugins only.
    pub nomad: Option<super::NomadHostOptions>,
}

impl LaunchOptions {
    /// Options with the defaults: 5 s handshake timeout, the SDK's app protocols.
    pub fn new(name: impl Into<String>, command: impl Into<PathBuf>) -> Self {
        LaunchOptions {
            name: name.into(),
            command: command.into(),
            args: Vec::new(),
            host_env: HostEnv::All,
            env: Vec::new(),
            handshake_timeout: Duration::from_secs(5),
            socket_dir: None,
            app_protocol_versions: handshake::APP_PROTOCOL_VERSIONS.to_vec(),
            executable: None,
            auto_mtls: false,
            multiplex_grpc: false,
            nomad: None,
        }
    }

    /// The app protocol versions this launch offers: the host's, plus Nomad's when
    /// Nomad plugins are accepted.
    fn offered_app_protocols(&self) -> Vec<u32> {
        let mut v = self.app_protocol_versions.clone();
        if self.nomad.is_some() && !v.contains(&handshake::NOMAD_APP_PROTOCOL_VERSION) {
            v.push(handshake::NOMAD_APP_PROTOCOL_VERSION);
        }
        v
    }
}

/// Which of the host's environment variables a plugin is started with.
///
/// go-plugin passes a plugin the host's whole environment unless the host sets
/// `SkipHostEnv`; a host that runs third-party plugins should not hand them its
/// secrets, and passes [`HostEnv::Only`] what they need.
///
/// ```
/// use drover_plugin_sdk::client::{HostEnv, LaunchOptions};
/// let mut opts = LaunchOptions::new("rawexec", "/usr/lib/drover/plugins/rawexec");
/// assert_eq!(opts.host_env, HostEnv::All);
/// opts.host_env = HostEnv::Only(vec!["PATH".into()]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostEnv {
    /// The host's whole environment (go-plugin's default).
    All,
    /// Only the named variables, those of them the host has (go-plugin's
    /// `SkipHostEnv`, plus a list).
    Only(Vec<OsString>),
}

impl HostEnv {
    /// The host's variables this policy passes, in the host's order.
    ///
    /// ```
    /// use drover_plugin_sdk::client::HostEnv;
    /// let passed = HostEnv::Only(vec!["PATH".into()]).from_host();
    /// assert!(passed.iter().all(|(k, _)| k == "PATH"));
    /// ```
    pub fn from_host(&self) -> Vec<(OsString, OsString)> {
        match self {
            HostEnv::All => std::env::vars_os().collect(),
            HostEnv::Only(names) => std::env::vars_os()
                .filter(|(k, _)| names.iter().any(|n| n == k))
                .collect(),
        }
    }
}

/// The whole environment of a plugin launched with `opts`: what [`HostEnv`] passes,
/// then `opts.env`, then the handshake's variables; a later entry replaces an earlier
/// one of the same name.
fn launch_env(opts: &LaunchOptions, client_cert: Option<&str>) -> Vec<(OsString, OsString)> {
    launch_env_over(opts.host_env.from_host(), opts, client_cert)
}

/// [`launch_env`] over `host`, what the host's environment passes.
fn launch_env_over(
    host: Vec<(OsString, OsString)>,
    opts: &LaunchOptions,
    client_cert: Option<&str>,
) -> Vec<(OsString, OsString)> {
    let mut handshake_env: Vec<(OsString, OsString)> = vec![
        (
            handshake::MAGIC_COOKIE_KEY.into(),
            handshake::MAGIC_COOKIE_VALUE.into(),
        ),
        (
            handshake::ENV_PROTOCOL_VERSIONS.into(),
            opts.offered_app_protocols()
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
                .into(),
        ),
        (handshake::ENV_MIN_PORT.into(), "10000".into()),
        (handshake::ENV_MAX_PORT.into(), "25000".into()),
    ];
    if opts.nomad.is_some() {
        handshake_env.push((
            handshake::NOMAD_MAGIC_COOKIE_KEY.into(),
            handshake::NOMAD_MAGIC_COOKIE_VALUE.into(),
        ));
    }
    if let Some(pem) = client_cert {
        handshake_env.push((handshake::ENV_CLIENT_CERT.into(), pem.into()));
    }
    if opts.multiplex_grpc {
        handshake_env.push((handshake::ENV_MULTIPLEX_GRPC.into(), "true".into()));
    }
    if let Some(dir) = &opts.socket_dir {
        handshake_env.push((handshake::ENV_UNIX_SOCKET_DIR.into(), dir.into()));
    }
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    // The handshake's variables describe this launch only: a `PLUGIN_*` (or the cookie)
    // in the host's own environment, from a go-plugin host above it, is dropped, or a
    // plugin would see, say, `PLUGIN_MULTIPLEX_GRPC=true` that this host never offered.
    let inherited = host.into_iter().filter(|(k, _)| {
        let k = k.as_encoded_bytes();
        !k.starts_with(b"PLUGIN_")
            && k != handshake::MAGIC_COOKIE_KEY.as_bytes()
            && k != handshake::NOMAD_MAGIC_COOKIE_KEY.as_bytes()
    });
    for (k, v) in inherited
        .chain(opts.env.iter().cloned())
        .chain(handshake_env)
    {
        env.retain(|(e, _)| *e != k);
        env.push((k, v));
    }
    env
}

/// Why a plugin could not be launched. Every message is meant for an operator.
///
/// ```
/// let e = drover_plugin_sdk::client::LaunchError::AppProtocol { plugin: 2, host: vec![1] };
/// assert_eq!(e.to_string(), "plugin chose app protocol version 2, host speaks [1]");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The binary could not be started at all.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The executable.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// It exited before completing the handshake.
    #[error("exited ({status}) before the handshake{stderr}")]
    Exited {
        /// How it exited.
        status: String,
        /// The last stderr lines, formatted for appending.
        stderr: String,
    },
    /// No handshake line within the timeout.
    #[error("no handshake line within {after:?} (is it a Drover plugin?){stderr}")]
    Timeout {
        /// The timeout.
        after: Duration,
        /// The last stderr lines, formatted for appending.
        stderr: String,
    },
    /// It printed something that is not a handshake line.
    #[error("bad handshake: {error}{stderr}")]
    BadHandshake {
        /// What was wrong.
        error: HandshakeError,
        /// The last stderr lines, formatted for appending.
        stderr: String,
    },
    /// It printed more than a line's worth of bytes without a newline.
    #[error("printed {MAX_HANDSHAKE_LINE} bytes on stdout without a newline; not a handshake")]
    Garbage,
    /// It chose an app protocol version the host does not speak.
    #[error("plugin chose app protocol version {plugin}, host speaks {host:?}")]
    AppProtocol {
        /// The plugin's choice.
        plugin: u32,
        /// The host's versions.
        host: Vec<u32>,
    },
    /// The handshake named an address nothing answers on.
    #[error("handshake named {addr} but connecting failed: {error}")]
    Connect {
        /// The address.
        addr: PluginAddr,
        /// The cause.
        error: String,
    },
    /// The health service did not report `plugin` as SERVING (a driver library
    /// loaded into the host, checked when it starts).
    #[error("health check failed: {0}")]
    Health(String),
    /// Automatic mTLS was asked for and failed: no certificate could be made, or the
    /// plugin sent none (it does not support AutoMTLS) or an unusable one. Also: the
    /// plugin asks for TLS though the launch did not offer it.
    #[error("automatic mTLS: {0}")]
    AutoMtls(String),
    /// Multiplexing was asked for and the plugin's handshake does not say it supports it.
    #[error(
        "plugin does not support gRPC broker multiplexing (its handshake line {line:?} has no \
         7th field `true`); for Go plugins, update github.com/hashicorp/go-plugin to 1.6 or later"
    )]
    Multiplex {
        /// The handshake line received.
        line: String,
    },
}

pub(super) fn format_tail(tail: &Mutex<VecDeque<String>>) -> String {
    let lines = tail
        .lock()
        .map(|t| t.iter().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with: {}", lines.join(" | "))
    }
}

/// Kill a plugin's whole process group. Plugins are started as group leaders, so this
/// also takes any helper they forked, but not tasks, which run in groups of their own.
fn kill_group(pid: u32) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A running, connected plugin process (its first RPC proves it serves).
///
/// ```no_run
/// # async fn demo() -> Result<(), drover_plugin_sdk::client::LaunchError> {
/// use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
/// let plugin = PluginProcess::launch(LaunchOptions::new("skeleton", "./drover-skeleton-driver")).await?;
/// println!("pid {} at {}", plugin.pid(), plugin.handshake().addr);
/// let how = plugin.shutdown().await;
/// assert!(how.is_success(), "plugin exited with {how}");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PluginProcess {
    pub(super) name: String,
    pub(super) pid: u32,
    pub(super) line: HandshakeLine,
    pub(super) path: PathBuf,
    pub(super) channel: Channel,
    pub(super) exit: watch::Receiver<Option<Exit>>,
    /// How a kill reaches it, which also tells whether we launched it.
    pub(super) kill_via: KillVia,
    /// The AutoMTLS material, for the reattach record.
    pub(super) tls: Option<Arc<ReattachTls>>,
    /// Whether the connection is multiplexed, for the reattach record.
    pub(super) multiplex_grpc: bool,
    /// The bridge to a plugin that speaks Nomad's protocol.
    pub(super) nomad: Option<Arc<super::nomad::NomadBridge>>,
}

/// How a plugin process ended.
#[derive(Debug, Clone)]
pub(super) struct Exit {
    /// Its wait status; `None` when it was not our child (reattached).
    pub(super) status: Option<ExitStatus>,
    /// Typed; prints for people as "exit code 0", "killed by signal 9", ...
    pub(super) outcome: ExitOutcome,
}

impl Exit {
    fn of(status: ExitStatus) -> Self {
        Exit {
            status: Some(status),
            outcome: ExitOutcome::from_status(status),
        }
    }
}

/// Start the plugin binary as the handshake wants it: cookie and protocol versions in
/// its environment, stdout and stderr piped, in its own process group (a Ctrl-C at the
/// agent's terminal does not reach it, and a failed launch can be killed as a whole).
/// `client_cert` is the AutoMTLS certificate (PEM) to pass, if any.
fn spawn(
    opts: &LaunchOptions,
    client_cert: Option<&str>,
) -> Result<tokio::process::Child, LaunchError> {
    let spawn_error = |source| LaunchError::Spawn {
        path: opts.command.clone(),
        source,
    };
    let env = launch_env(opts, client_cert);
    let mut cmd = tokio::process::Command::new(&opts.command);
    cmd.args(&opts.args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    let exec = match &opts.executable {
        Some(fd) => {
            Some(ExecFd::prepare(fd, &opts.command, &opts.args, &env).map_err(spawn_error)?)
        }
        None => None,
    };
    let nofile = PLUGIN_NOFILE_SOFT.load(Ordering::Relaxed);
    if exec.is_some() || nofile != 0 {
        // SAFETY: the closure runs in the forked child before exec. It only makes raw
        // system calls (prlimit, fcntl, execveat) on memory prepared before the fork: no
        // allocation, no locks, nothing another thread of the parent could have held.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                if nofile != 0 {
                    restore_nofile_soft(nofile)?;
                }
                match &exec {
                    Some(exec) => exec.exec(),
                    None => Ok(()),
                }
            });
        }
    }
    cmd.spawn().map_err(spawn_error)
}

/// The open-file soft limit plugins start with; 0 leaves the inherited one.
static PLUGIN_NOFILE_SOFT: AtomicU64 = AtomicU64::new(0);

/// Start every plugin launched from now on with `soft` as its open-file soft limit
/// (capped at the hard limit), whatever this process raised its own to.
///
/// A host that raises its own limit (the agent raises its soft limit to the hard limit
/// for its connections and followers) calls this with the limit it was started with,
/// so that plugins, and through their executors the tasks, get what the operator set,
/// not the host's raised one. Go's runtime does the same for the children of a
/// program whose limit it raised.
///
/// ```
/// use rustix::process::{getrlimit, Resource};
/// let started_with = getrlimit(Resource::Nofile).current.unwrap_or(1024);
/// // ... raise this process's own limit ...
/// drover_plugin_sdk::client::set_plugin_nofile_soft_limit(started_with);
/// ```
pub fn set_plugin_nofile_soft_limit(soft: u64) {
    PLUGIN_NOFILE_SOFT.store(soft, Ordering::Relaxed);
}

/// In the forked child: set the open-file soft limit back to `soft` (at most the hard
/// limit). Only system calls: safe between fork and exec.
fn restore_nofile_soft(soft: u64) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.maximum.map_or(soft, |hard| soft.min(hard));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(soft),
            maximum: limit.maximum,
        },
    )
    .map_err(std::io::Error::from)
}

/// Everything `execveat` needs, built before the fork so the child only makes the call.
struct ExecFd {
    /// The checked binary, at fd 3 or above (the child's stdio takes 0-2).
    fd: OwnedFd,
    /// Whether it starts with `#!`: then its interpreter must be able to read it as
    /// `/dev/fd/N`, so the descriptor stays open across the exec.
    script: bool,
    /// Owners of the bytes `argv` and `envp` point into.
    _strings: Vec<CString>,
    /// NULL-terminated pointer arrays, as addresses (raw pointers are not `Send`).
    argv: Vec<usize>,
    envp: Vec<usize>,
}

impl ExecFd {
    fn prepare(
        fd: &OwnedFd,
        command: &std::path::Path,
        args: &[OsString],
        env: &[(OsString, OsString)],
    ) -> std::io::Result<Self> {
        let fd = rustix::io::fcntl_dupfd_cloexec(fd.as_fd(), 3)?;
        let mut head = [0u8; 2];
        let n = rustix::io::pread(&fd, &mut head, 0)?;
        let script = n == 2 && head == *b"#!";
        let cstring = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "argument or environment entry {:?} contains a NUL byte",
                        String::from_utf8_lossy(bytes)
                    ),
                )
            })
        };
        let mut strings = Vec::new();
        strings.push(cstring(command.as_os_str().as_bytes())?);
        for a in args {
            strings.push(cstring(a.as_bytes())?);
        }
        let argc = strings.len();
        for (k, v) in env {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(OsStr::as_bytes(v));
            strings.push(cstring(&kv)?);
        }
        let ptrs = |s: &[CString]| {
            s.iter()
                .map(|c| c.as_ptr() as usize)
                .chain(std::iter::once(0))
                .collect::<Vec<usize>>()
        };
        let argv = ptrs(&strings[..argc]);
        let envp = ptrs(&strings[argc..]);
        Ok(ExecFd {
            fd,
            script,
            _strings: strings,
            argv,
            envp,
        })
    }

    /// In the child: execute the descriptor. Returns only on failure.
    fn exec(&self) -> std::io::Result<()> {
        use nix::libc;
        let fd = self.fd.as_raw_fd();
        // SAFETY: plain system calls. `fd` is open (owned by self); `argv` and `envp`
        // are NULL-terminated arrays of pointers to NUL-terminated strings owned by
        // `self._strings`, alive for the call; a `usize` array has the layout of a
        // pointer array. The empty path with AT_EMPTY_PATH means "fd itself".
        #[allow(unsafe_code)]
        unsafe {
            if self.script && libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::syscall(
                libc::SYS_execveat,
                fd,
                c"".as_ptr(),
                self.argv.as_ptr().cast::<*const libc::c_char>(),
                self.envp.as_ptr().cast::<*const libc::c_char>(),
                libc::AT_EMPTY_PATH,
            );
        }
        Err(std::io::Error::last_os_error())
    }
}

/// A launched plugin that handshook and is connected.
struct Established {
    line: HandshakeLine,
    channel: Channel,
    tls: Option<ReattachTls>,
    /// When the handshake line came, and when the connection stood, from the spawn.
    line_at: Duration,
    connected_at: Duration,
}

/// Why a launch did not get that far.
enum Unestablished {
    /// The plugin closed stdout without a handshake line (usually: it exited).
    StdoutClosed,
    /// Anything else, explained.
    Failed(LaunchError),
}

impl From<LaunchError> for Unestablished {
    fn from(e: LaunchError) -> Self {
        Unestablished::Failed(e)
    }
}

/// Read and check the handshake line and connect to plugin `pid`, all within the
/// handshake timeout counted from `started`.
/// The stderr tail of an error is filled in by the caller, once the plugin is gone.
async fn establish(
    opts: &LaunchOptions,
    pid: u32,
    client_cert: Option<&tls::GeneratedCert>,
    stdout: &mut BufReader<tokio::process::ChildStdout>,
    started: Instant,
) -> Result<Established, Unestablished> {
    let first = tokio::time::timeout(opts.handshake_timeout, read_handshake_line(stdout)).await;
    let line_text = match first {
        Err(_) => {
            return Err(LaunchError::Timeout {
                after: opts.handshake_timeout,
                stderr: String::new(),
            }
            .into());
        }
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(None)) => return Err(Unestablished::StdoutClosed),
        Ok(Ok(Some(line))) => line,
    };
    let line_at = started.elapsed();
    let line: HandshakeLine = line_text
        .parse()
        .map_err(|error| LaunchError::BadHandshake {
            error,
            stderr: String::new(),
        })?;
    if !opts
        .offered_app_protocols()
        .contains(&line.app_protocol_version)
    {
        return Err(LaunchError::AppProtocol {
            plugin: line.app_protocol_version,
            host: opts.offered_app_protocols(),
        }
        .into());
    }
    let (transport, tls) = client_transport(opts, pid, client_cert, &line, line_text.trim_end())?;
    let remaining = || {
        opts.handshake_timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(100))
    };
    let limit = remaining();
    let channel = match tokio::time::timeout(limit, connect(&line.addr, limit, &transport)).await {
        Ok(Ok(c)) => c,
        Ok(Err(error)) => {
            return Err(LaunchError::Connect {
                addr: line.addr.clone(),
                error,
            }
            .into());
        }
        Err(_) => {
            return Err(LaunchError::Connect {
                addr: line.addr.clone(),
                error: format!("no answer within {limit:?}"),
            }
            .into());
        }
    };
    let connected_at = started.elapsed();
    // No health check here: go-plugin's host makes none before its first RPC either,
    // and that RPC proves the plugin serves (or fails with why, bounded by the
    // caller's timeout). A health round trip first would add one more to every launch
    // (about a tenth of a launch's time).
    Ok(Established {
        line,
        channel,
        tls,
        line_at,
        connected_at,
    })
}

/// How to reach the plugin, from what the launch offered and what its handshake `line`
/// (`text`) answered; with AutoMTLS, the material for the reattach record.
fn client_transport(
    opts: &LaunchOptions,
    plugin_pid: u32,
    client_cert: Option<&tls::GeneratedCert>,
    line: &HandshakeLine,
    text: &str,
) -> Result<(ClientTransport, Option<ReattachTls>), LaunchError> {
    // go-plugin hosts take a 6th field for a certificate only when it is longer than 50
    // characters (older plugins printed other short things there).
    let server_cert = line.server_cert.as_deref().filter(|c| c.len() > 50);
    let mut transport = ClientTransport {
        tls: None,
        multiplex: opts.multiplex_grpc,
        served_by_group: plugin_pid,
    };
    if opts.multiplex_grpc && line.multiplex_grpc != Some(true) {
        return Err(LaunchError::Multiplex {
            line: text.to_owned(),
        });
    }
    let tls = match (client_cert, server_cert) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(LaunchError::AutoMtls(
                "the plugin sent a server certificate (it speaks TLS), but this launch did not \
                 offer automatic mTLS; enable it for this plugin"
                    .into(),
            ));
        }
        // A go-plugin host would go on and fail the TLS handshake against the plain
        // plugin ("first record does not look like a TLS handshake"). Saying why here is
        // kinder, and the same outcome: no connection without the TLS asked for.
        (Some(_), None) => {
            return Err(LaunchError::AutoMtls(format!(
                "the plugin's handshake line {text:?} carries no server certificate: it does \
                 not support AutoMTLS (PLUGIN_CLIENT_CERT); launch it without automatic mTLS"
            )));
        }
        (Some(own), Some(theirs)) => {
            let record = ReattachTls {
                client_cert_pem: own.pem.clone(),
                client_key_pem: own.key_pem(),
                server_cert: theirs.to_owned(),
            };
            transport.tls = Some(record.client_config().map_err(LaunchError::AutoMtls)?);
            Some(record)
        }
    };
    Ok((transport, tls))
}

/// `e` with the plugin's last stderr lines, for the errors that show them.
fn with_stderr_tail(e: LaunchError, tail: &Mutex<VecDeque<String>>) -> LaunchError {
    match e {
        LaunchError::Timeout { after, .. } => LaunchError::Timeout {
            after,
            stderr: format_tail(tail),
        },
        LaunchError::BadHandshake { error, .. } => LaunchError::BadHandshake {
            error,
            stderr: format_tail(tail),
        },
        other => other,
    }
}

/// Kill a failed launch's process group and reap it (bounded), so nothing is left.
async fn kill_and_reap(pid: u32, mut child: tokio::process::Child) {
    kill_group(pid);
    let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
}

/// How [`PluginProcess::start_kill`] reaches a plugin.
#[derive(Debug, Clone)]
pub(super) enum KillVia {
    /// Our child, which leads its process group: the group, through its gate.
    Launched(Arc<ReapGate>),
    /// Reattached (not our child): its pidfd, which tells when it exits and which
    /// signals cannot reach a later process that reuses the pid.
    Reattached(Arc<OwnedFd>),
}

/// Whether a launched child's process group may still be signalled. Its pid is also
/// its group's id, and either can be taken by a later process only once it is reaped:
/// so the group is signalled only under this lock and only while the gate is open,
/// and the exit watcher closes it, under the lock, before it reaps (with a pidfd that
/// tells the exit without reaping). A kill then never reaches a process that reused
/// the pid, even when it races the plugin's exit. Without a usable pidfd the gate
/// closes just after the reap, which leaves that narrow window where a pidfd is
/// impossible. Closed, the gate also stays closed: a kill after that sends nothing.
#[derive(Debug, Default)]
pub(super) struct ReapGate {
    closed: Mutex<bool>,
}

impl ReapGate {
    /// SIGKILL the child's process group, unless the gate is closed.
    fn kill_group(&self, pid: u32) {
        let closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        if !*closed {
            kill_group(pid);
        }
    }

    /// From now on, nothing signals the group.
    fn close(&self) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    #[cfg(test)]
    fn is_closed(&self) -> bool {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The child the exit watcher owns, with its gate: dropped (the watcher cut short by a
/// runtime shutting down), it closes the gate before the child is dropped, since
/// tokio's `Child` reaps an exited process as it drops and hands a running one to its
/// orphan reaper, either of which frees the pid.
struct Watched {
    gate: Arc<ReapGate>,
    child: tokio::process::Child,
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Runs before the fields are dropped, so before the child is.
        self.gate.close();
    }
}

/// Wait for our child in the background; the receiver holds how it ended.
/// `within`: the directory the plugin was told to make its socket in (see
/// [`super::dead_socket`]). `pidfd` (opened before the child could be reaped) tells
/// when it exited without reaping it, so `gate` is closed before the pid is freed.
/// Without one (a kernel before 5.3, no descriptor left), or one that cannot be
/// watched, the gate closes just after the reap: the old narrow window, where a
/// pidfd is impossible, rather than a gate closed on a running plugin.
fn watch_exit(
    child: tokio::process::Child,
    pidfd: Option<OwnedFd>,
    gate: Arc<ReapGate>,
    addr: PluginAddr,
    within: PathBuf,
) -> watch::Receiver<Option<Exit>> {
    let (exit_tx, exit_rx) = watch::channel(None);
    let mut watched = Watched { gate, child };
    tokio::spawn(async move {
        let seen = match pidfd {
            Some(fd) => exited(fd).await,
            None => false,
        };
        if seen {
            watched.gate.close();
        }
        let exit = match watched.child.wait().await {
            Ok(status) => Exit::of(status),
            Err(e) => Exit {
                status: None,
                outcome: ExitOutcome::Other(format!("exit status unknown: wait failed: {e}")),
            },
        };
        // Closes the gate (without a pidfd, this is where it closes).
        drop(watched);
        super::dead_socket::remove_dead_socket(&addr, Some(&within)).await;
        let _ = exit_tx.send(Some(exit));
    });
    exit_rx
}

/// Read the first stdout line, bounded in length.
async fn read_handshake_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Result<Option<String>, LaunchError> {
    let mut buf = Vec::new();
    let n = (&mut *reader)
        .take(MAX_HANDSHAKE_LINE)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| LaunchError::Exited {
            status: format!("stdout unreadable: {e}"),
            stderr: String::new(),
        })?;
    if n == 0 {
        return Ok(None);
    }
    if !buf.ends_with(b"\n") && n as u64 >= MAX_HANDSHAKE_LINE {
        return Err(LaunchError::Garbage);
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// One connection to the plugin's address; a unix socket must be served by a process
/// of process group `served_by_group`.
async fn dial(addr: &PluginAddr, served_by_group: u32) -> std::io::Result<Box<dyn Io>> {
    Ok(match addr {
        PluginAddr::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path).await?;
            check_served_by(&stream, path, served_by_group)?;
            Box::new(stream)
        }
        PluginAddr::Tcp(a) => {
            let stream = tokio::net::TcpStream::connect(a.as_str()).await?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        }
    })
}

/// Refuse a unix socket that no process of the plugin's process `group` serves.
///
/// The kernel records who called `listen` on the socket (`SO_PEERCRED`); the
/// plugin leads its own process group, so its listener, or that of a child it
/// forked, is in that group. Another plugin's socket, named in a confused or lying
/// handshake line or a stale reattach record, is not. This is a consistency check,
/// not a wall: a plugin runs as the agent's user and could relay its own socket to
/// another's (AutoMTLS, with its per-launch client certificate, stops that).
fn check_served_by(
    stream: &tokio::net::UnixStream,
    path: &std::path::Path,
    group: u32,
) -> std::io::Result<()> {
    let refuse = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not the plugin's socket: {why}, and the plugin's process group is {group}",
                path.display()
            ),
        )
    };
    let server = stream
        .peer_cred()
        .map_err(|e| {
            refuse(format!(
                "the credentials of its server are unreadable ({e})"
            ))
        })?
        .pid()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| refuse("its server's pid is not visible from here".into()))?;
    let server_group = rustix::process::getpgid(Some(server)).map_err(|e| {
        refuse(format!(
            "its server, pid {}, is gone ({e})",
            server.as_raw_nonzero()
        ))
    })?;
    if server_group.as_raw_nonzero().get() as u32 != group {
        return Err(refuse(format!(
            "it is served by pid {} of process group {}",
            server.as_raw_nonzero(),
            server_group.as_raw_nonzero()
        )));
    }
    Ok(())
}

/// A gRPC channel to the plugin at `addr`, carried as `transport` says: each (re)connect
/// dials the address, or opens a stream of the one multiplexed session; then, with
/// AutoMTLS, runs the TLS handshake on it.
pub(super) async fn connect(
    addr: &PluginAddr,
    timeout: Duration,
    transport: &ClientTransport,
) -> Result<Channel, String> {
    let mux = if transport.multiplex {
        let conn = tokio::time::timeout(timeout, dial(addr, transport.served_by_group))
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
            .map_err(|e| e.to_string())?;
        Some(mux::MuxClient::start(conn))
    } else {
        None
    };
    let tls = transport.tls.clone().map(tokio_rustls::TlsConnector::from);
    let served_by_group = transport.served_by_group;
    let endpoint = Endpoint::try_from("http://plugin")
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout);
    let addr = addr.clone();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (addr, mux, tls) = (addr.clone(), mux.clone(), tls.clone());
            async move {
                let conn: Box<dyn Io> = match mux {
                    Some(mux) => Box::new(mux.open().await?),
                    None => dial(&addr, served_by_group).await?,
                };
                let conn: Box<dyn Io> = match tls {
                    Some(tls) => Box::new(tls.connect(tls::server_name(), conn).await?),
                    None => conn,
                };
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(conn))
            }
        }))
        .await
        .map_err(|e| {
            // tonic wraps the io error; the innermost cause is what an operator needs.
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = s.to_string();
                src = s.source();
            }
            msg
        })
}

pub(super) async fn check_health(channel: Channel) -> Result<(), LaunchError> {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "plugin".into(),
        })
        .await
        .map_err(|s| LaunchError::Health(format!("{}: {}", s.code(), s.message())))?;
    let status = resp.into_inner().status;
    if status != ServingStatus::Serving as i32 {
        return Err(LaunchError::Health(format!(
            "service \"plugin\" is {:?}, not SERVING",
            ServingStatus::try_from(status).unwrap_or(ServingStatus::Unknown)
        )));
    }
    Ok(())
}

impl PluginProcess {
    /// Start the plugin, read and check its handshake and connect to it, all within
    /// `opts.handshake_timeout`. On any failure the process group is killed and reaped
    /// before returning, so nothing is left behind.
    ///
    /// Like go-plugin's host, the launch makes no RPC of its own: the caller's first
    /// one (usually [`crate::client::PluginClient::plugin_info`]) is the proof that the plugin serves,
    /// and the caller bounds it. A plugin that answers the handshake but serves no
    /// gRPC fails that RPC.
    ///
    /// The plugin's stderr is forwarded into `tracing` (see
    /// [`crate::logging::forward_plugin_log`]) for as long as it runs.
    pub async fn launch(opts: LaunchOptions) -> Result<Self, LaunchError> {
        let started = Instant::now();
        let client_cert = if opts.auto_mtls {
            Some(tls::generate_cert().map_err(|e| LaunchError::AutoMtls(e.to_string()))?)
        } else {
            None
        };
        let mut child = spawn(&opts, client_cert.as_ref().map(|c| c.pem.as_str()))?;
        // Known until the child is reaped, which nothing has done yet; 0 would make
        // every kill below one of our own process group.
        let Some(pid) = child.id().filter(|&pid| pid != 0) else {
            return Err(LaunchError::Exited {
                status: "its pid is unknown".into(),
                stderr: String::new(),
            });
        };
        // Opened while the child cannot have been reaped yet: it tells when the plugin
        // exits without reaping it, so its group can still be killed safely then.
        let pidfd = match rustix::process::Pid::from_raw(pid as i32)
            .map(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()))
        {
            Some(Ok(fd)) => Some(fd),
            Some(Err(e)) => {
                tracing::debug!(plugin = %opts.name, pid, "no pidfd for the plugin: {e}");
                None
            }
            None => None,
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_done = child
            .stderr
            .take()
            .map(|err| spawn_stderr_forwarder(opts.name.clone(), err, tail.clone()));
        let Some(stdout) = child.stdout.take() else {
            kill_group(pid);
            return Err(LaunchError::Exited {
                status: "no stdout pipe".into(),
                stderr: String::new(),
            });
        };
        let mut stdout = BufReader::new(stdout);
        let outcome = establish(&opts, pid, client_cert.as_ref(), &mut stdout, started).await;
        let established = match outcome {
            Ok(e) => e,
            Err(Unestablished::Failed(e)) => {
                kill_and_reap(pid, child).await;
                // Read the tail after the kill: the plugin's last words are in by now.
                return Err(with_stderr_tail(e, &tail));
            }
            Err(Unestablished::StdoutClosed) => {
                // stdout closed without a line: it exited (or closed stdout and hangs).
                // Whatever it forked stays in its group: kill the group while the
                // leader is an unreaped zombie (its pid, the group's id, cannot be
                // reused until then), and only then reap it for its status.
                let exited = match pidfd {
                    Some(fd) => exited_within(fd, Duration::from_secs(1)).await,
                    None => false,
                };
                let status = if exited {
                    kill_group(pid);
                    match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
                        Ok(Ok(s)) => ExitOutcome::from_status(s).to_string(),
                        _ => "exited; exit status unknown".into(),
                    }
                } else {
                    kill_and_reap(pid, child).await;
                    "closed stdout without a handshake".into()
                };
                // Let the stderr reader catch the last lines it printed.
                if let Some(done) = stderr_done {
                    let _ = tokio::time::timeout(Duration::from_secs(1), done).await;
                }
                return Err(LaunchError::Exited {
                    status,
                    stderr: format_tail(&tail),
                });
            }
        };
        tracing::debug!(
            plugin = %opts.name,
            pid,
            handshake_us = established.line_at.as_micros() as u64,
            connected_us = established.connected_at.as_micros() as u64,
            "plugin launched"
        );
        // Connected. Keep draining stdout so a chatty plugin never blocks on a full pipe.
        let name = opts.name.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Ok(Some(cut)) =
                read_bounded_line(&mut stdout, &mut buf, MAX_PLUGIN_LINE).await
            {
                let l = String::from_utf8_lossy(&buf);
                let more = if cut { " [line cut]" } else { "" };
                tracing::info!(target: "drover::plugin", plugin = %name, "stdout: {l}{more}");
            }
        });
        // Where the plugin was told to make its socket: the dir given, or the temp
        // dir of an environment like this host's.
        let within = opts.socket_dir.clone().unwrap_or_else(std::env::temp_dir);
        let reap_gate = Arc::new(ReapGate::default());
        let exit = watch_exit(
            child,
            pidfd,
            reap_gate.clone(),
            established.line.addr.clone(),
            within,
        );
        let nomad = match (&opts.nomad, established.line.app_protocol_version) {
            (Some(host), handshake::NOMAD_APP_PROTOCOL_VERSION) => {
                Some(Arc::new(super::nomad::NomadBridge::new(
                    opts.name.clone(),
                    established.channel.clone(),
                    host.clone(),
                )))
            }
            _ => None,
        };
        Ok(PluginProcess {
            nomad,
            name: opts.name,
            pid,
            line: established.line,
            path: opts.command,
            channel: established.channel,
            exit,
            kill_via: KillVia::Launched(reap_gate),
            tls: established.tls.map(Arc::new),
            multiplex_grpc: opts.multiplex_grpc,
        })
    }

    /// Whether this process was reattached rather than launched by us.
    pub fn is_reattached(&self) -> bool {
        matches!(self.kill_via, KillVia::Reattached(_))
    }

    /// Read the plugin's `GRPCStdio` stream for as long as it runs and log what comes.
    /// go-plugin plugins written in Go mirror their stdout/stderr there and block when
    /// nobody reads it; Drover plugins send nothing on it. Call it once the plugin has
    /// been identified: it is off the launch's critical path.
    pub fn mirror_stdio(&self) {
        let mut client = goplugin::grpc_stdio_client::GrpcStdioClient::new(self.channel.clone());
        let name = self.name.clone();
        let mut exit = self.exit.clone();
        tokio::spawn(async move {
            let Ok(resp) = client.stream_stdio(()).await else {
                return;
            };
            let mut stream = resp.into_inner();
            loop {
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(Ok(data)) => {
                            for line in String::from_utf8_lossy(&data.data).lines() {
                                crate::logging::forward_plugin_log(&name, line);
                            }
                        }
                        _ => return,
                    },
                    _ = exit.wait_for(Option::is_some) => return,
                }
            }
        });
    }

    /// The plugin's pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The name given at launch.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which driver protocol it speaks.
    pub fn protocol(&self) -> super::PluginProtocol {
        if self.nomad.is_some() {
            super::PluginProtocol::Nomad
        } else {
            super::PluginProtocol::Drover
        }
    }

    /// The handshake line it printed.
    pub fn handshake(&self) -> &HandshakeLine {
        &self.line
    }

    /// Exit status, once it has exited. Always `None` for a reattached process, whose
    /// status goes to its new parent: use [`Self::has_exited`] to ask whether it runs.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.exit.borrow().as_ref().and_then(|e| e.status)
    }

    /// Whether the process has exited.
    pub fn has_exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Resolves when the process exits; returns how it exited. For a reattached
    /// process (not our child) that is an [`ExitOutcome::Other`] saying its status is
    /// unknown.
    pub async fn exited(&self) -> ExitOutcome {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(e) => e
                .as_ref()
                .map_or_else(|| ExitOutcome::Other(String::new()), |e| e.outcome.clone()),
            Err(_) => ExitOutcome::Other("watcher gone".into()),
        }
    }

    /// A typed client for this plugin's RPCs.
    pub fn client(&self) -> PluginClient {
        PluginClient {
            name: self.name.clone(),
            channel: self.channel.clone(),
            exit: self.exit.clone(),
            nomad: self.nomad.clone(),
        }
    }

    /// Ask the plugin to exit (`GRPCController.Shutdown`), wait up to
    /// [`SHUTDOWN_GRACE`], then SIGKILL its process group. Returns how it exited: a
    /// plugin that obeyed exits with [`ExitOutcome::Code`] 0.
    pub async fn shutdown(&self) -> ExitOutcome {
        if !self.has_exited() {
            let mut ctl =
                goplugin::grpc_controller_client::GrpcControllerClient::new(self.channel.clone());
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, ctl.shutdown(goplugin::Empty {})).await;
            if tokio::time::timeout(SHUTDOWN_GRACE, self.exited())
                .await
                .is_err()
            {
                tracing::warn!(plugin = %self.name, pid = self.pid, "plugin did not exit after Shutdown; killing it");
                self.start_kill();
            }
        }
        self.exited().await
    }

    /// SIGKILL the plugin's process group at once and wait for it.
    pub async fn kill(&self) -> ExitOutcome {
        self.start_kill();
        self.exited().await
    }

    /// SIGKILL the plugin at once, without waiting for it (what [`Self::kill`] does
    /// first): for a `Drop`, where nothing can be awaited. A launched plugin is killed
    /// with its process group (helpers it forked; not tasks, which run in sessions of
    /// their own), a reattached one alone, through its pidfd.
    ///
    /// Nothing is sent once the SDK has seen the plugin exit, so the signal never
    /// reaches a later process that reused its pid; on a kernel without pidfds (before
    /// 5.3) a narrow window remains between the reap and that moment. Nothing is sent
    /// either once the runtime that launched it has shut down (the plugin may then run
    /// on: plugins outlive their host by design).
    ///
    /// ```no_run
    /// use drover_plugin_sdk::client::PluginProcess;
    ///
    /// /// A plugin that must not outlive the scope holding it.
    /// struct Scoped(PluginProcess);
    ///
    /// impl Drop for Scoped {
    ///     fn drop(&mut self) {
    ///         self.0.start_kill();
    ///     }
    /// }
    /// ```
    pub fn start_kill(&self) {
        match &self.kill_via {
            KillVia::Launched(gate) => gate.kill_group(self.pid),
            KillVia::Reattached(fd) => {
                let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Forward a plugin's log (a process's stderr, an in-process plugin's log pipe) line
/// by line into `tracing`, keeping the last lines in `tail`; the task ends at end of
/// file.
pub(super) fn spawn_stderr_forwarder(
    name: String,
    stderr: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr);
        let mut buf = Vec::new();
        while let Ok(Some(cut)) = read_bounded_line(&mut reader, &mut buf, MAX_PLUGIN_LINE).await {
            let mut line = String::from_utf8_lossy(&buf).into_owned();
            if cut {
                line.push_str(" [line cut]");
            }
            crate::logging::forward_plugin_log(&name, &line);
            if let Ok(mut t) = tail.lock() {
                if t.len() == STDERR_TAIL_LINES {
                    t.pop_front();
                }
                let shown = crate::logging::PluginLogLine::parse(&line)
                    .map(|l| l.message)
                    .unwrap_or(line);
                t.push_back(shown.chars().take(300).collect());
            }
        }
    })
}

/// Whether the process behind `pidfd` exits within `limit` (a pidfd turns readable when
/// its process exits; it is not reaped by this).
async fn exited_within(pidfd: OwnedFd, limit: Duration) -> bool {
    matches!(tokio::time::timeout(limit, exited(pidfd)).await, Ok(true))
}

/// Waits until the process behind `pidfd` has exited (it is not reaped by this) and
/// returns `true`; `false` at once when the pidfd cannot be watched.
async fn exited(pidfd: OwnedFd) -> bool {
    // SAFETY: `register` requires the fd to stay open while registered. The OwnedFd is
    // moved into the AsyncFd, which deregisters it before dropping (closing) it.
    #[allow(unsafe_code)]
    let Ok(fd) = (unsafe { tokio::io::unix::AsyncFd::register(pidfd) }) else {
        return false;
    };
    fd.readable().await.is_ok()
}

/// Read one line into `buf` (without its newline), keeping at most `max` bytes of it:
/// the rest of a longer line is read and dropped, so memory stays bounded whatever a
/// plugin prints. Returns `Ok(Some(cut))` for a line (`cut` when it was longer than
/// `max`), `Ok(None)` at the end of the stream.
async fn read_bounded_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut cut = false;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let newline = chunk.iter().position(|b| *b == b'\n');
        let line_part = newline.unwrap_or(chunk.len());
        let room = max.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..line_part.min(room)]);
        cut |= line_part > room;
        let consumed = newline.map_or(chunk.len(), |i| i + 1);
        reader.consume(consumed);
        if newline.is_some() {
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Some(cut));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kill path's guarantee, on a real process group: while the gate is open a
    /// kill takes the group; once the exit watcher has closed it (it reaps next, and
    /// the pid may then be reused) a kill sends nothing at all. Which signal ended the
    /// child tells: a SIGKILL sent before our SIGTERM would have ended it first.
    #[test]
    fn a_kill_after_the_reap_gate_closed_sends_nothing() {
        use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
        /// Killed when dropped: a failed assertion leaves no `sleep` behind.
        struct Leader(std::process::Child);
        impl Drop for Leader {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let spawn_leader = || {
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("30").process_group(0);
            Leader(cmd.spawn().expect("spawn sleep"))
        };
        let mut closed = spawn_leader();
        let gate = ReapGate::default();
        gate.close();
        gate.kill_group(closed.0.id());
        let pid = rustix::process::Pid::from_raw(closed.0.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let status = closed.0.wait().expect("wait");
        assert_eq!(
            status.signal(),
            Some(15),
            "a closed gate let SIGKILL through"
        );

        let mut open = spawn_leader();
        ReapGate::default().kill_group(open.0.id());
        let status = open.0.wait().expect("wait");
        assert_eq!(status.signal(), Some(9), "an open gate must kill the group");
    }

    /// `sleep 30` leading a process group of its own, killed if the test drops it.
    fn spawn_sleeping_leader() -> tokio::process::Child {
        tokio::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sleep")
    }

    /// The exit watcher keeps the gate open while the plugin runs (a kill ends it)
    /// and closes it by the time the exit is published: with the pidfd that launch
    /// opens, and without one (where a pidfd is impossible).
    #[tokio::test]
    async fn the_exit_watcher_closes_the_gate_only_once_the_plugin_exited() {
        use std::os::unix::process::ExitStatusExt as _;
        for with_pidfd in [true, false] {
            let dir = tempfile::tempdir().expect("tempdir");
            let child = spawn_sleeping_leader();
            let pid = child.id().expect("pid");
            let pidfd = with_pidfd.then(|| {
                let p = rustix::process::Pid::from_raw(pid as i32).expect("pid");
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                    .expect("pidfd_open")
            });
            let gate = Arc::new(ReapGate::default());
            let mut exit = watch_exit(
                child,
                pidfd,
                gate.clone(),
                PluginAddr::Unix(dir.path().join("plugin.sock")),
                dir.path().to_owned(),
            );
            // Let the watcher start waiting: a gate it closed too early shows now.
            tokio::task::yield_now().await;
            assert!(
                !gate.is_closed(),
                "gate closed on a running plugin (pidfd: {with_pidfd})"
            );
            gate.kill_group(pid);
            let ended =
                tokio::time::timeout(Duration::from_secs(10), exit.wait_for(Option::is_some))
                    .await
                    .expect("exit published within 10 s")
                    .expect("watcher alive")
                    .clone()
                    .expect("an exit");
            assert_eq!(
                ended.status.and_then(|s| s.signal()),
                Some(9),
                "the kill through an open gate ended it (pidfd: {with_pidfd})"
            );
            assert!(
                gate.is_closed(),
                "gate still open after the reap (pidfd: {with_pidfd})"
            );
        }
    }

    /// A watcher cut short (its runtime shut down while the plugin ran) closes the
    /// gate as it goes: the child it held is then tokio's orphan reaper's, which may
    /// free the pid at any time.
    #[test]
    fn a_watcher_cut_short_closes_the_gate() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let gate = Arc::new(ReapGate::default());
        {
            let _in_runtime = rt.enter();
            let child = spawn_sleeping_leader();
            let _exit = watch_exit(
                child,
                None,
                gate.clone(),
                PluginAddr::Unix(dir.path().join("plugin.sock")),
                dir.path().to_owned(),
            );
        }
        rt.block_on(tokio::task::yield_now());
        assert!(!gate.is_closed(), "gate closed on a running plugin");
        drop(rt);
        assert!(gate.is_closed(), "a dropped watcher left the gate open");
    }

    #[test]
    fn handshake_variables_of_the_hosts_own_environment_do_not_pass() {
        let opts = LaunchOptions::new("p", "/bin/true");
        let host = vec![
            ("PLUGIN_MULTIPLEX_GRPC".into(), "true".into()),
            ("PLUGIN_CLIENT_CERT".into(), "stale".into()),
            (handshake::MAGIC_COOKIE_KEY.into(), "other".into()),
            ("HOME".into(), "/root".into()),
        ];
        let env = launch_env_over(host, &opts, None);
        let get = |k: &str| env.iter().find(|(e, _)| e == k).map(|(_, v)| v.clone());
        assert_eq!(get("PLUGIN_MULTIPLEX_GRPC"), None);
        assert_eq!(get("PLUGIN_CLIENT_CERT"), None);
        assert_eq!(get("HOME"), Some("/root".into()));
        assert_eq!(
            get(handshake::MAGIC_COOKIE_KEY),
            Some(handshake::MAGIC_COOKIE_VALUE.into())
        );
    }

    #[test]
    fn only_listed_host_variables_pass_and_the_handshake_ones_win() {
        let mut opts = LaunchOptions::new("p", "/bin/true");
        opts.host_env = HostEnv::Only(vec!["PATH".into(), "NO_SUCH_VARIABLE_HERE".into()]);
        opts.env = vec![
            ("X".into(), "1".into()),
            (handshake::MAGIC_COOKIE_KEY.into(), "forged".into()),
        ];
        let env = launch_env(&opts, None);
        let names: Vec<&OsString> = env.iter().map(|(k, _)| k).collect();
        let expected_path = std::env::var_os("PATH").map(|_| OsString::from("PATH"));
        assert_eq!(
            names.iter().filter(|k| ***k == "PATH").count(),
            usize::from(expected_path.is_some())
        );
        assert!(!names.iter().any(|k| *k == "NO_SUCH_VARIABLE_HERE"));
        assert!(names.iter().any(|k| *k == "X"));
        let cookie: Vec<_> = env
            .iter()
            .filter(|(k, _)| k == handshake::MAGIC_COOKIE_KEY)
            .collect();
        assert_eq!(cookie.len(), 1);
        assert_eq!(cookie[0].1, handshake::MAGIC_COOKIE_VALUE);
        // Nothing else of this process's environment.
        assert!(
            env.iter().all(|(k, _)| k == "PATH"
                || k == "X"
                || k.to_string_lossy().starts_with("PLUGIN_")
                || k == handshake::MAGIC_COOKIE_KEY),
            "{env:?}"
        );
    }

    #[tokio::test]
    async fn an_endless_line_is_cut_and_memory_stays_bounded() {
        // 1 MiB without a newline, then a normal line, then a last line without one.
        let mut input = vec![b'x'; 1 << 20];
        input.extend_from_slice(b"\nnext\r\nlast");
        let mut reader = BufReader::with_capacity(4096, input.as_slice());
        let mut buf = Vec::new();
        assert_eq!(
            read_bounded_line(&mut reader, &mut buf, 100).await.unwrap(),
            Some(true)
        );
        assert_eq!(buf, vec![b'x'; 100]);
        assert!(
            buf.capacity() < 4096 + 100,
            "buffer grew to {}",
            buf.capacity()
        );
        assert_eq!(
            read_bounded_line(&mut reader, &mut buf, 100).await.unwrap(),
            Some(false)
        );
        assert_eq!(buf, b"next");
        assert_eq!(
            read_bounded_line(&mut reader, &mut buf, 100).await.unwrap(),
            Some(false)
        );
        assert_eq!(buf, b"last");
        assert_eq!(
            read_bounded_line(&mut reader, &mut buf, 100).await.unwrap(),
            None
        );
    }
}
