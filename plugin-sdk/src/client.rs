//! The host side: launch a plugin binary, check its handshake, connect, call it, and
//! shut it down. Used by the Drover agent, the benchmarks and plugin tests.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_proto::goplugin;
use drover_proto::v1 as pb;
use pb::base_plugin_client::BasePluginClient;
use pb::driver_client::DriverClient;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::{Channel, Endpoint};

use crate::DriverError;
use crate::handshake::{self, HandshakeError, HandshakeLine, PluginAddr};
use crate::signal::Signal;
use crate::types::{
    AgentInfo, Capabilities, ExecOutput, ExitOutcome, ExitResult, Fingerprint, TaskEvent,
    TaskHandle, TaskSpec, TaskStats, TaskStatus, to_duration,
};

/// How many lines of a plugin's stderr are kept to explain a failed launch.
const STDERR_TAIL_LINES: usize = 8;
/// Longest handshake line accepted; a plugin that prints more without a newline is
/// printing garbage.
const MAX_HANDSHAKE_LINE: u64 = 4096;
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
    /// Extra environment, on top of the host's.
    pub env: Vec<(OsString, OsString)>,
    /// Time from spawn to a healthy connection.
    pub handshake_timeout: Duration,
    /// Passed as `PLUGIN_UNIX_SOCKET_DIR` when set.
    pub socket_dir: Option<PathBuf>,
    /// App protocol versions the host speaks.
    pub app_protocol_versions: Vec<u32>,
}

impl LaunchOptions {
    /// Options with the defaults: 5 s handshake timeout, the SDK's app protocols.
    pub fn new(name: impl Into<String>, command: impl Into<PathBuf>) -> Self {
        LaunchOptions {
            name: name.into(),
            command: command.into(),
            args: Vec::new(),
            env: Vec::new(),
            handshake_timeout: Duration::from_secs(5),
            socket_dir: None,
            app_protocol_versions: handshake::APP_PROTOCOL_VERSIONS.to_vec(),
        }
    }
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
    /// The health service did not report `plugin` as SERVING.
    #[error("health check failed: {0}")]
    Health(String),
}

/// Everything needed to find a running plugin again after the host restarts.
///
/// ```
/// use drover_plugin_sdk::client::ReattachConfig;
/// use drover_plugin_sdk::handshake::PluginAddr;
/// let r = ReattachConfig {
///     addr: PluginAddr::Unix("/run/drover/p.sock".into()),
///     pid: 42,
///     start_time: 1234,
///     app_protocol_version: 1,
///     path: "/usr/lib/drover/plugins/x".into(),
/// };
/// let json = serde_json::to_string(&r).unwrap();
/// assert_eq!(serde_json::from_str::<ReattachConfig>(&json).unwrap(), r);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReattachConfig {
    /// Where it listens.
    pub addr: PluginAddr,
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field 22), to tell
    /// it apart from a later process that got the same pid.
    pub start_time: u64,
    /// The negotiated app protocol version.
    pub app_protocol_version: u32,
    /// The binary.
    pub path: PathBuf,
}

/// Start time of a process in clock ticks since boot, from `/proc/<pid>/stat`: with
/// the pid it names one process for good, so a reused pid is not taken for a plugin.
///
/// ```
/// let t = drover_plugin_sdk::client::process_start_time(std::process::id()).unwrap();
/// assert!(t > 0);
/// ```
pub fn process_start_time(pid: u32) -> std::io::Result<u64> {
    use procfs_core::FromRead as _;
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read(&path)?;
    procfs_core::process::Stat::from_read(text.as_slice())
        .map(|s| s.starttime)
        .map_err(|e| std::io::Error::other(format!("unexpected {path} format: {e}")))
}

/// Why a stored plugin process could not be taken over. In every case the process (if
/// any) was left alone: nothing proved it is the plugin, so nothing may be sent to it.
///
/// ```
/// let e = drover_plugin_sdk::client::ReattachError::Gone { pid: 42 };
/// assert_eq!(e.to_string(), "pid 42 is not running");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReattachError {
    /// No process with that pid.
    #[error("pid {pid} is not running")]
    Gone {
        /// The recorded pid.
        pid: u32,
    },
    /// The pid belongs to another process now.
    #[error("pid {pid} is a different process now (start time {found}, recorded {expected})")]
    PidReused {
        /// The recorded pid.
        pid: u32,
        /// Recorded start time.
        expected: u64,
        /// Start time of the process that has the pid now.
        found: u64,
    },
    /// The record has no start time, so the pid cannot be trusted.
    #[error("no start time was recorded for pid {pid}; it cannot be proven to be the plugin")]
    NoStartTime {
        /// The recorded pid.
        pid: u32,
    },
    /// The process could not be watched (pidfd).
    #[error("cannot watch pid {pid}: {reason}")]
    Watch {
        /// The recorded pid.
        pid: u32,
        /// Why.
        reason: String,
    },
    /// Nothing answers on the recorded address.
    #[error("cannot connect to {addr}: {error}")]
    Connect {
        /// The recorded address.
        addr: PluginAddr,
        /// The cause.
        error: String,
    },
    /// Something answers but does not prove to be the plugin (RPC failed or too slow).
    #[error("identity check failed: {0}")]
    Identity(String),
    /// It answers as a different plugin.
    #[error("pid {pid} answers as plugin {found:?}, not {expected:?}")]
    WrongPlugin {
        /// The recorded pid.
        pid: u32,
        /// The name it was stored under.
        expected: String,
        /// The name it gave.
        found: String,
    },
}

async fn reattach_inner(
    name: String,
    config: ReattachConfig,
    timeout: Duration,
) -> Result<PluginProcess, ReattachError> {
    let pid = config.pid;
    if config.start_time == 0 {
        return Err(ReattachError::NoStartTime { pid });
    }
    let raw = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or(ReattachError::Gone { pid })?;
    let pidfd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Err(ReattachError::Gone { pid }),
        Err(e) => {
            return Err(ReattachError::Watch {
                pid,
                reason: format!("pidfd_open: {e}"),
            });
        }
    };
    // Read after the pidfd exists: if the pid was reused before pidfd_open, the start
    // time differs; if our process died after it, the pidfd reports that.
    let found = match process_start_time(pid) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReattachError::Gone { pid });
        }
        Err(e) => {
            return Err(ReattachError::Watch {
                pid,
                reason: format!("reading /proc/{pid}/stat: {e}"),
            });
        }
    };
    if found != config.start_time {
        return Err(ReattachError::PidReused {
            pid,
            expected: config.start_time,
            found,
        });
    }
    let channel = connect(&config.addr, timeout)
        .await
        .map_err(|error| ReattachError::Connect {
            addr: config.addr.clone(),
            error,
        })?;
    let base = BasePluginClient::new(channel.clone());
    let info = base
        .clone()
        .plugin_info(pb::PluginInfoRequest {})
        .await
        .map_err(|s| ReattachError::Identity(format!("PluginInfo: {}: {}", s.code(), s.message())))?
        .into_inner();
    if info.name != name {
        return Err(ReattachError::WrongPlugin {
            pid,
            expected: name,
            found: info.name,
        });
    }
    let shared = Arc::new(pidfd);
    let watched = shared.try_clone().map_err(|e| ReattachError::Watch {
        pid,
        reason: format!("dup pidfd: {e}"),
    })?;
    let (exit_tx, exit_rx) = watch::channel(None);
    // SAFETY: `register` requires the fd to stay open while registered. The OwnedFd is
    // moved into the AsyncFd, which deregisters it before dropping (closing) it.
    #[allow(unsafe_code)]
    let async_fd = unsafe { tokio::io::unix::AsyncFd::register(watched) }.map_err(|e| {
        ReattachError::Watch {
            pid,
            reason: format!("watching pidfd: {e}"),
        }
    })?;
    tokio::spawn(async move {
        // A pidfd becomes readable when the process exits.
        let how = match async_fd.readable().await {
            Ok(_) => "exited; exit status unknown (reattached, not our child)".to_owned(),
            Err(e) => format!("lost track of it: pidfd: {e}"),
        };
        let _ = exit_tx.send(Some(Exit {
            status: None,
            outcome: ExitOutcome::Other(how),
        }));
    });
    tracing::info!(
        plugin = %name,
        pid,
        addr = %config.addr,
        "reattached to plugin process; its stdout/stderr went to the previous host and are not captured"
    );
    Ok(PluginProcess {
        name,
        pid,
        line: HandshakeLine {
            core_protocol_version: handshake::CORE_PROTOCOL_VERSION,
            app_protocol_version: config.app_protocol_version,
            addr: config.addr,
            server_cert: None,
        },
        path: config.path,
        channel,
        exit: exit_rx,
        pidfd: Some(shared),
    })
}

fn format_tail(tail: &Mutex<VecDeque<String>>) -> String {
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

/// A running, connected, healthy plugin process.
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
    name: String,
    pid: u32,
    line: HandshakeLine,
    path: PathBuf,
    channel: Channel,
    exit: watch::Receiver<Option<Exit>>,
    /// Set for a reattached process (not our child): its pidfd, which tells when it
    /// exits and which signals cannot reach a later process that reuses the pid.
    pidfd: Option<Arc<std::os::fd::OwnedFd>>,
}

/// How a plugin process ended.
#[derive(Debug, Clone)]
struct Exit {
    /// Its wait status; `None` when it was not our child (reattached).
    status: Option<ExitStatus>,
    /// Typed; prints for people as "exit code 0", "killed by signal 9", ...
    outcome: ExitOutcome,
}

impl Exit {
    fn of(status: ExitStatus) -> Self {
        Exit {
            status: Some(status),
            outcome: ExitOutcome::from_status(status),
        }
    }
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

async fn connect_unix(path: PathBuf, timeout: Duration) -> Result<Channel, String> {
    let endpoint = Endpoint::try_from("http://plugin")
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
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

async fn connect(addr: &PluginAddr, timeout: Duration) -> Result<Channel, String> {
    match addr {
        PluginAddr::Unix(p) => connect_unix(p.clone(), timeout).await,
        PluginAddr::Tcp(a) => Endpoint::from_shared(format!("http://{a}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(timeout)
            .connect()
            .await
            .map_err(|e| e.to_string()),
    }
}

async fn check_health(channel: Channel) -> Result<(), LaunchError> {
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
    /// Start the plugin, read and check its handshake, connect and health-check it, all
    /// within `opts.handshake_timeout`. On any failure the process group is killed and
    /// reaped before returning, so nothing is left behind.
    ///
    /// The plugin's stderr is forwarded into `tracing` (see
    /// [`crate::logging::forward_plugin_log`]) for as long as it runs.
    pub async fn launch(opts: LaunchOptions) -> Result<Self, LaunchError> {
        let started = Instant::now();
        let mut cmd = tokio::process::Command::new(&opts.command);
        cmd.args(&opts.args)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .env(handshake::MAGIC_COOKIE_KEY, handshake::MAGIC_COOKIE_VALUE)
            .env(
                handshake::ENV_PROTOCOL_VERSIONS,
                opts.app_protocol_versions
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .env(handshake::ENV_MIN_PORT, "10000")
            .env(handshake::ENV_MAX_PORT, "25000")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C at the agent's terminal does not reach it,
            // and a failed launch can be killed as a whole.
            .process_group(0)
            .kill_on_drop(false);
        if let Some(dir) = &opts.socket_dir {
            cmd.env(handshake::ENV_UNIX_SOCKET_DIR, dir);
        }
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            path: opts.command.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
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

        // Whatever goes wrong from here on: kill the group, reap, explain.
        let fail = |child: tokio::process::Child| async move {
            kill_group(pid);
            let mut child = child;
            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
        };

        let first =
            tokio::time::timeout(opts.handshake_timeout, read_handshake_line(&mut stdout)).await;
        let line_text = match first {
            Err(_) => {
                fail(child).await;
                return Err(LaunchError::Timeout {
                    after: opts.handshake_timeout,
                    stderr: format_tail(&tail),
                });
            }
            Ok(Err(e)) => {
                fail(child).await;
                return Err(e);
            }
            Ok(Ok(None)) => {
                // stdout closed without a line: it exited (or closed stdout and hangs).
                let status = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
                let status = match status {
                    Ok(Ok(s)) => ExitOutcome::from_status(s).to_string(),
                    _ => {
                        fail(child).await;
                        "closed stdout without a handshake".into()
                    }
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
            Ok(Ok(Some(line))) => line,
        };
        let line_at = started.elapsed();
        let line: HandshakeLine = match line_text.parse() {
            Ok(l) => l,
            Err(error) => {
                fail(child).await;
                return Err(LaunchError::BadHandshake {
                    error,
                    stderr: format_tail(&tail),
                });
            }
        };
        if !opts
            .app_protocol_versions
            .contains(&line.app_protocol_version)
        {
            fail(child).await;
            return Err(LaunchError::AppProtocol {
                plugin: line.app_protocol_version,
                host: opts.app_protocol_versions.clone(),
            });
        }
        if line.server_cert.is_some() {
            fail(child).await;
            return Err(LaunchError::Connect {
                addr: line.addr.clone(),
                error: "plugin requires automatic mTLS, which this host does not offer".into(),
            });
        }
        let remaining = opts
            .handshake_timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(100));
        let channel = match tokio::time::timeout(remaining, connect(&line.addr, remaining)).await {
            Ok(Ok(c)) => c,
            Ok(Err(error)) => {
                fail(child).await;
                return Err(LaunchError::Connect {
                    addr: line.addr.clone(),
                    error,
                });
            }
            Err(_) => {
                fail(child).await;
                return Err(LaunchError::Connect {
                    addr: line.addr.clone(),
                    error: format!("no answer within {remaining:?}"),
                });
            }
        };
        let connected_at = started.elapsed();
        let remaining = opts
            .handshake_timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(100));
        match tokio::time::timeout(remaining, check_health(channel.clone())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                fail(child).await;
                return Err(e);
            }
            Err(_) => {
                fail(child).await;
                return Err(LaunchError::Health(format!(
                    "no answer within {remaining:?}"
                )));
            }
        }

        tracing::debug!(
            plugin = %opts.name,
            pid,
            handshake_us = line_at.as_micros() as u64,
            connected_us = connected_at.as_micros() as u64,
            healthy_us = started.elapsed().as_micros() as u64,
            "plugin launched"
        );
        // Healthy. Keep draining stdout so a chatty plugin never blocks on a full pipe.
        let name = opts.name.clone();
        tokio::spawn(async move {
            let mut lines = stdout.lines();
            while let Ok(Some(l)) = lines.next_line().await {
                tracing::info!(target: "drover::plugin", plugin = %name, "stdout: {l}");
            }
        });
        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => Exit::of(status),
                Err(e) => Exit {
                    status: None,
                    outcome: ExitOutcome::Other(format!("exit status unknown: wait failed: {e}")),
                },
            };
            let _ = exit_tx.send(Some(exit));
        });
        Ok(PluginProcess {
            name: opts.name,
            pid,
            line,
            path: opts.command,
            channel,
            exit: exit_rx,
            pidfd: None,
        })
    }

    /// Take over a plugin process that an earlier host launched, from the
    /// [`ReattachConfig`] it stored. Identity is proven before anything else is done:
    /// the pid must still be the process that was launched (same start time, checked
    /// after a pidfd was opened on it, so a pid reused in between cannot pass), it must
    /// answer on the recorded address, and its `PluginInfo` must name `name`. All of it
    /// within `timeout`. On any failure nothing was sent to the process.
    ///
    /// The result is not our child: its liveness comes from the pidfd, so
    /// [`Self::exited`] still resolves when it dies and every RPC then fails with
    /// [`DriverError::Unavailable`]; [`Self::exit_status`] stays `None` (its status goes
    /// to its new parent). Its stdout/stderr were pipes to the previous host and are
    /// gone: whatever it logs from now on is lost.
    ///
    /// ```no_run
    /// # async fn demo(saved: drover_plugin_sdk::client::ReattachConfig) {
    /// use drover_plugin_sdk::client::PluginProcess;
    /// match PluginProcess::reattach("rawexec", saved, std::time::Duration::from_secs(5)).await {
    ///     Ok(p) => println!("reattached to pid {}", p.pid()),
    ///     Err(e) => println!("launching a fresh one: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn reattach(
        name: impl Into<String>,
        config: ReattachConfig,
        timeout: Duration,
    ) -> Result<Self, ReattachError> {
        let name = name.into();
        match tokio::time::timeout(timeout, reattach_inner(name, config.clone(), timeout)).await {
            Ok(r) => r,
            Err(_) => Err(ReattachError::Identity(format!(
                "pid {} did not prove its identity within {timeout:?}",
                config.pid
            ))),
        }
    }

    /// Whether this process was reattached rather than launched by us.
    pub fn is_reattached(&self) -> bool {
        self.pidfd.is_some()
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

    /// What a host stores to reattach to this process later.
    pub fn reattach_config(&self) -> ReattachConfig {
        ReattachConfig {
            addr: self.line.addr.clone(),
            pid: self.pid,
            start_time: process_start_time(self.pid).unwrap_or(0),
            app_protocol_version: self.line.app_protocol_version,
            path: self.path.clone(),
        }
    }

    /// A typed client for this plugin's RPCs.
    pub fn client(&self) -> PluginClient {
        PluginClient {
            name: self.name.clone(),
            channel: self.channel.clone(),
            exit: self.exit.clone(),
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
                self.sigkill();
            }
        }
        self.exited().await
    }

    /// SIGKILL the plugin's process group at once and wait for it.
    pub async fn kill(&self) -> ExitOutcome {
        if !self.has_exited() {
            self.sigkill();
        }
        self.exited().await
    }
}

impl PluginProcess {
    /// SIGKILL: our child's whole process group; a reattached process through its
    /// pidfd, which cannot hit a later process that reused the pid.
    fn sigkill(&self) {
        match &self.pidfd {
            None => kill_group(self.pid),
            Some(fd) => {
                let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
            }
        }
    }
}

fn spawn_stderr_forwarder(
    name: String,
    stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
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

/// What a plugin says about itself (`PluginInfo`): who it is and which plugin API
/// versions it speaks.
///
/// ```
/// use drover_plugin_sdk::client::{PluginIdentity, PluginKind};
/// let id = PluginIdentity::new("rawexec", "0.1.0", vec!["1.0.0".into()]);
/// assert_eq!(id.kind, PluginKind::Driver);
/// assert_eq!(id.info().name, "rawexec");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginIdentity {
    /// Its name, lowercase `[a-z0-9_-]` when it follows the rules.
    pub name: String,
    /// Semver of the plugin binary.
    pub version: String,
    /// Plugin API versions it implements (semver).
    pub api_versions: Vec<String>,
    /// What kind of plugin it is.
    pub kind: PluginKind,
}

impl PluginIdentity {
    /// A driver plugin `name` at `version`, speaking `api_versions`.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        api_versions: Vec<String>,
    ) -> Self {
        PluginIdentity {
            name: name.into(),
            version: version.into(),
            api_versions,
            kind: PluginKind::Driver,
        }
    }

    /// Name and version, as the driver's own [`crate::DriverPlugin::info`] says them.
    pub fn info(&self) -> crate::PluginInfo {
        crate::PluginInfo::new(self.name.clone(), self.version.clone())
    }
}

/// The kind of a plugin (the protocol's `PluginType`).
///
/// ```
/// let k = drover_plugin_sdk::client::PluginKind::Other(7);
/// assert_eq!(k.to_string(), "7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginKind {
    /// A task driver.
    Driver,
    /// A type this host does not know (or none): its number on the wire.
    Other(i32),
}

impl PluginKind {
    fn from_wire(n: i32) -> Self {
        match pb::PluginType::try_from(n) {
            Ok(pb::PluginType::Driver) => PluginKind::Driver,
            _ => PluginKind::Other(n),
        }
    }
}

impl std::fmt::Display for PluginKind {
    /// The wire number, which is what hosts have always printed for it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginKind::Driver => write!(f, "{}", pb::PluginType::Driver as i32),
            PluginKind::Other(n) => write!(f, "{n}"),
        }
    }
}

/// Typed calls to one plugin. Every call fails fast with
/// [`DriverError::Unavailable`] once the plugin process has exited, instead of hanging.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
/// let plugin = PluginProcess::launch(LaunchOptions::new("rawexec", "./drover-driver-rawexec")).await?;
/// let info = plugin.client().plugin_info().await?;
/// println!("{} {} speaks {:?}", info.name, info.version, info.api_versions);
/// plugin.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PluginClient {
    name: String,
    channel: Channel,
    exit: watch::Receiver<Option<Exit>>,
}

impl PluginClient {
    fn base(&self) -> BasePluginClient<Channel> {
        BasePluginClient::new(self.channel.clone())
            .max_decoding_message_size(crate::server::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE_SIZE)
    }

    fn driver(&self) -> DriverClient<Channel> {
        DriverClient::new(self.channel.clone())
            .max_decoding_message_size(crate::server::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE_SIZE)
    }

    /// Run one RPC, failing as soon as the plugin process exits.
    async fn guard<T>(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, DriverError> {
        let mut exit = self.exit.clone();
        let exited = |e: Option<&Exit>| {
            DriverError::Unavailable(match e {
                Some(e) => format!("plugin {} exited ({})", self.name, e.outcome),
                None => format!("plugin {} exited (watcher gone)", self.name),
            })
        };
        if let Some(e) = exit.borrow().as_ref() {
            return Err(exited(Some(e)));
        }
        tokio::select! {
            r = call => r.map(tonic::Response::into_inner).map_err(DriverError::from),
            e = exit.wait_for(Option::is_some) => Err(exited(e.ok().as_deref().and_then(Option::as_ref))),
        }
    }

    /// `PluginInfo`: identity plus the plugin API versions it offers.
    pub async fn plugin_info(&self) -> Result<PluginIdentity, DriverError> {
        let r = self
            .guard(self.base().plugin_info(pb::PluginInfoRequest {}))
            .await?;
        Ok(PluginIdentity {
            name: r.name,
            version: r.plugin_version,
            api_versions: r.plugin_api_versions,
            kind: PluginKind::from_wire(r.r#type),
        })
    }

    /// The generated gRPC client of the `Driver` service on this plugin's connection,
    /// for what the typed calls cannot express: tests that send a driver malformed
    /// requests (an unknown signal name, say) to check what it answers. Its calls do
    /// not fail fast when the plugin exits; map a failed call's status with
    /// [`DriverError::from`].
    pub fn raw_driver(&self) -> DriverClient<Channel> {
        self.driver()
    }

    /// `ConfigSchema`: JSON Schema of the plugin configuration.
    pub async fn config_schema(&self) -> Result<String, DriverError> {
        Ok(self
            .guard(self.base().config_schema(pb::ConfigSchemaRequest {}))
            .await?
            .json_schema)
    }

    /// `SetConfig`.
    pub async fn set_config(
        &self,
        config_json: String,
        agent: &AgentInfo,
    ) -> Result<(), DriverError> {
        self.guard(self.base().set_config(pb::SetConfigRequest {
            config_json,
            plugin_api_version: agent.api_version.clone(),
            agent_config: Some(pb::AgentConfig {
                alloc_dir: agent.alloc_dir.display().to_string(),
                plugin_state_dir: agent.plugin_state_dir.display().to_string(),
            }),
        }))
        .await
        .map(drop)
    }

    /// `TaskConfigSchema`: JSON Schema of the driver's task config.
    pub async fn task_config_schema(&self) -> Result<String, DriverError> {
        Ok(self
            .guard(
                self.driver()
                    .task_config_schema(pb::TaskConfigSchemaRequest {}),
            )
            .await?
            .json_schema)
    }

    /// `Capabilities`.
    pub async fn capabilities(&self) -> Result<Capabilities, DriverError> {
        Ok(self
            .guard(self.driver().capabilities(pb::CapabilitiesRequest {}))
            .await?
            .capabilities
            .unwrap_or_default()
            .into())
    }

    /// `Fingerprint`: a stream of fingerprints; the first arrives at once.
    pub async fn fingerprint(
        &self,
    ) -> Result<impl Stream<Item = Result<Fingerprint, DriverError>> + use<>, DriverError> {
        let s = self
            .guard(self.driver().fingerprint(pb::FingerprintRequest {}))
            .await?;
        Ok(s.map(|r| r.map(Fingerprint::from).map_err(DriverError::from)))
    }

    /// `StartTask`.
    pub async fn start_task(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError> {
        let r = self
            .guard(self.driver().start_task(pb::StartTaskRequest {
                task: Some(spec.into()),
            }))
            .await?;
        r.handle
            .map(TaskHandle::from)
            .ok_or_else(|| DriverError::Internal("StartTask answered without a handle".into()))
    }

    /// `WaitTask`: blocks until the task exits.
    pub async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        let r = self
            .guard(self.driver().wait_task(pb::WaitTaskRequest {
                task_id: task_id.into(),
            }))
            .await?;
        Ok(r.result.map(ExitResult::from).unwrap_or_default())
    }

    /// `StopTask`.
    pub async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        self.guard(self.driver().stop_task(pb::StopTaskRequest {
            task_id: task_id.into(),
            timeout: Some(to_duration(timeout)),
            signal: signal.to_string(),
        }))
        .await
        .map(drop)
    }

    /// `DestroyTask`.
    pub async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        self.guard(self.driver().destroy_task(pb::DestroyTaskRequest {
            task_id: task_id.into(),
            force,
        }))
        .await
        .map(drop)
    }

    /// `InspectTask`.
    pub async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        let r = self
            .guard(self.driver().inspect_task(pb::InspectTaskRequest {
                task_id: task_id.into(),
            }))
            .await?;
        r.task
            .map(TaskStatus::from)
            .ok_or_else(|| DriverError::Internal("InspectTask answered without a status".into()))
    }

    /// `RecoverTask`.
    pub async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        self.guard(self.driver().recover_task(pb::RecoverTaskRequest {
            task_id: handle.spec.id.clone(),
            handle: Some(handle.into()),
        }))
        .await
        .map(drop)
    }

    /// `SignalTask`.
    pub async fn signal_task(&self, task_id: &str, signal: Signal) -> Result<(), DriverError> {
        self.guard(self.driver().signal_task(pb::SignalTaskRequest {
            task_id: task_id.into(),
            signal: signal.to_string(),
        }))
        .await
        .map(drop)
    }

    /// `TaskStats`: a sample every `interval`.
    pub async fn task_stats(
        &self,
        task_id: &str,
        interval: Duration,
    ) -> Result<impl Stream<Item = Result<TaskStats, DriverError>> + use<>, DriverError> {
        let s = self
            .guard(self.driver().task_stats(pb::TaskStatsRequest {
                task_id: task_id.into(),
                interval: Some(to_duration(interval)),
            }))
            .await?;
        Ok(s.map(|r| r.map(TaskStats::from).map_err(DriverError::from)))
    }

    /// `TaskEvents`.
    pub async fn task_events(
        &self,
    ) -> Result<impl Stream<Item = Result<TaskEvent, DriverError>> + use<>, DriverError> {
        let s = self
            .guard(self.driver().task_events(pb::TaskEventsRequest {}))
            .await?;
        Ok(s.map(|r| r.map(TaskEvent::from).map_err(DriverError::from)))
    }

    /// `ExecTask`.
    pub async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let r = self
            .guard(self.driver().exec_task(pb::ExecTaskRequest {
                task_id: task_id.into(),
                command,
                timeout: Some(to_duration(timeout)),
            }))
            .await?;
        Ok(
            ExecOutput::new(r.result.map(ExitResult::from).unwrap_or_default())
                .with_stdout(r.stdout)
                .with_stderr(r.stderr),
        )
    }
}
