//! The record a host stores to find a plugin it launched again ([`ReattachConfig`]),
//! and taking over the plugin process from it after a restart, proving first that it
//! is that plugin ([`PluginProcess::reattach`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use drover_proto::v1 as pb;
use pb::base_plugin_client::BasePluginClient;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::handshake::{self, HandshakeLine, PluginAddr};
use crate::types::ExitOutcome;

use super::PluginProcess;
use super::process::Exit;
use super::process::connect;
use super::reattach_tls::ReattachTls;
use crate::transport::ClientTransport;

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
///     tls: None,
///     multiplex_grpc: false,
/// };
/// let json = serde_json::to_string(&r).unwrap();
/// assert_eq!(serde_json::from_str::<ReattachConfig>(&json).unwrap(), r);
/// // Records written before AutoMTLS and multiplexing existed still load.
/// let old = r#"{"addr":{"network":"unix","address":"/p.sock"},"pid":42,"start_time":1,
///               "app_protocol_version":1,"path":"/x"}"#;
/// assert_eq!(serde_json::from_str::<ReattachConfig>(old).unwrap().tls, None);
/// ```
///
/// A record with [`ReattachConfig::tls`] holds a private key: store it as a secret
/// (mode 0600). Its `Debug` output leaves the key out.
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
    /// AutoMTLS: the host's certificate and key and the plugin's certificate, with which
    /// a later host reconnects. `None`: plain connection. (Left out of the record when
    /// `None`, as is `multiplex_grpc` when false: records of plain plugins stay as they
    /// were, readable by older hosts.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ReattachTls>,
    /// Whether the plugin was launched with gRPC multiplexing (its connections are
    /// streams of a yamux session). Reattaching opens a new connection and session:
    /// Drover plugins accept that; go-plugin plugins accept one session only, and
    /// go-plugin itself refuses to reattach with multiplexing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multiplex_grpc: bool,
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
    /// The record's AutoMTLS material is unusable.
    #[error("the record's AutoMTLS material is unusable: {0}")]
    Tls(String),
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

impl PluginProcess {
    /// Take over a plugin process that an earlier host launched, from the
    /// [`ReattachConfig`] it stored. Identity is proven before anything else is done:
    /// the pid must still be the process that was launched (same start time, checked
    /// after a pidfd was opened on it, so a pid reused in between cannot pass), it must
    /// answer on the recorded address, and its `PluginInfo` must name `name`. All of it
    /// within `timeout`. On any failure nothing was sent to the process.
    ///
    /// The result is not our child: its liveness comes from the pidfd, so
    /// [`Self::exited`] still resolves when it dies and every RPC then fails with
    /// [`DriverError::Unavailable`](crate::DriverError::Unavailable); [`Self::exit_status`] stays `None` (its status goes
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
        Self::reattach_with(name, config, timeout, None).await
    }

    /// [`PluginProcess::reattach`], for a host that also runs Nomad plugins: a record
    /// of one (app protocol 2) is taken over with its bridge, which needs `nomad`.
    pub async fn reattach_with(
        name: impl Into<String>,
        config: ReattachConfig,
        timeout: Duration,
        nomad: Option<super::NomadHostOptions>,
    ) -> Result<Self, ReattachError> {
        let name = name.into();
        let inner = reattach_inner(name, config.clone(), timeout, nomad);
        match tokio::time::timeout(timeout, inner).await {
            Ok(r) => r,
            Err(_) => Err(ReattachError::Identity(format!(
                "pid {} did not prove its identity within {timeout:?}",
                config.pid
            ))),
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
            tls: self.tls.as_deref().cloned(),
            multiplex_grpc: self.multiplex_grpc,
        }
    }
}

pub(super) async fn reattach_inner(
    name: String,
    config: ReattachConfig,
    timeout: Duration,
    nomad_host: Option<super::NomadHostOptions>,
) -> Result<PluginProcess, ReattachError> {
    let pid = config.pid;
    let nomad_host = match (config.app_protocol_version, nomad_host) {
        (handshake::NOMAD_APP_PROTOCOL_VERSION, Some(h)) => Some(h),
        (handshake::NOMAD_APP_PROTOCOL_VERSION, None) => {
            return Err(ReattachError::Identity(format!(
                "pid {pid} speaks Nomad's driver protocol and this host was not set up to \
                 run Nomad plugins"
            )));
        }
        _ => None,
    };
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
    let transport = ClientTransport {
        tls: match &config.tls {
            Some(tls) => Some(tls.client_config().map_err(ReattachError::Tls)?),
            None => None,
        },
        multiplex: config.multiplex_grpc,
        // Launched as its group's leader, the plugin keeps that group after our restart.
        served_by_group: pid,
    };
    let channel = connect(&config.addr, timeout, &transport)
        .await
        .map_err(|error| ReattachError::Connect {
            addr: config.addr.clone(),
            error,
        })?;
    let identity_error = |s: tonic::Status| {
        ReattachError::Identity(format!("PluginInfo: {}: {}", s.code(), s.message()))
    };
    let found = if nomad_host.is_some() {
        drover_proto::nomad::base::base_plugin_client::BasePluginClient::new(channel.clone())
            .plugin_info(drover_proto::nomad::base::PluginInfoRequest {})
            .await
            .map_err(identity_error)?
            .into_inner()
            .name
    } else {
        BasePluginClient::new(channel.clone())
            .plugin_info(pb::PluginInfoRequest {})
            .await
            .map_err(identity_error)?
            .into_inner()
            .name
    };
    if found != name {
        return Err(ReattachError::WrongPlugin {
            pid,
            expected: name,
            found,
        });
    }
    let nomad = nomad_host.map(|host| {
        Arc::new(super::nomad::NomadBridge::new(
            name.clone(),
            channel.clone(),
            host,
        ))
    });
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
    let addr = config.addr.clone();
    tokio::spawn(async move {
        // A pidfd becomes readable when the process exits.
        let how = match async_fd.readable().await {
            Ok(_) => {
                super::dead_socket::remove_dead_socket(&addr, None).await;
                "exited; exit status unknown (reattached, not our child)".to_owned()
            }
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
            server_cert: config.tls.as_ref().map(|t| t.server_cert.clone()),
            multiplex_grpc: config.multiplex_grpc.then_some(true),
        },
        path: config.path,
        channel,
        exit: exit_rx,
        kill_via: super::process::KillVia::Reattached(shared),
        tls: config.tls.map(Arc::new),
        multiplex_grpc: config.multiplex_grpc,
        nomad,
    })
}
