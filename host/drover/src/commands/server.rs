//! `drover server`: its flags, a server's start and life (also the in-process server
//! of `drover agent --dev`), and `drover server status`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use drover_server::config::{ForwardOptions, ForwardTls, SchedulerAlgorithm};
use drover_server::store::Store;
use drover_server::tls::TlsFiles;
use drover_server::{Election, NameClaim, ServerInfo};
use drover_server::{Server, ServerConfig};
use tokio_util::sync::CancellationToken;

use super::cluster_error;
use crate::render::{print_json, servers_status_text};

/// `drover server` flags.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ServerArgs {
    /// `drover server status`, instead of running a server.
    #[command(subcommand)]
    pub command: Option<ServerCommand>,
    /// TOML file of settings: each key is one of these flags' long name (`data_dir`
    /// or `data-dir`), e.g. `http_addr = "127.0.0.1:4646"`. A flag given on the command
    /// line wins over the file. SIGHUP reads its `log_level` again.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The server's own files (the embedded store, and with etcd nothing but what
    /// other parts keep there) live here.
    #[arg(long, value_name = "DIR", required = true)]
    pub data_dir: Option<PathBuf>,
    /// Where the state lives: `embedded` (a file in --data-dir, one server) or `etcd`
    /// (an etcd cluster shared by several servers, one of them elected leader).
    #[arg(long, value_parser = ["embedded", "etcd"], default_value = "embedded")]
    pub store: String,
    /// etcd's client URLs (http:// or https://), comma-separated; with --store etcd.
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// CA (PEM) of etcd's certificates, for https:// endpoints.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for an etcd that requires one; with --etcd-key-file.
    #[arg(long, value_name = "FILE", requires = "etcd_key_file")]
    pub etcd_cert_file: Option<PathBuf>,
    /// Key (PEM) of --etcd-cert-file.
    #[arg(long, value_name = "FILE", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,
    /// Prefix of every key in etcd (several clusters can share one etcd).
    #[arg(long, value_name = "PREFIX", default_value = "/drover/")]
    pub etcd_prefix: String,
    /// This server's name among the servers (default: the host name). Must be unique:
    /// two live servers with one name cannot be told apart.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// How long a leader that stops renewing its lease (killed, paused, cut off)
    /// stays leader at most; at least 2s.
    #[arg(long, default_value = "10s", value_parser = parse_lease_ttl)]
    pub leader_lease_ttl: Duration,
    /// Where the other servers and nodes reach this server's RPCs (default: the bound
    /// --rpc-addr).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_host_port)]
    pub advertise_rpc: Option<String>,
    /// Where users reach this server's HTTP API (default: the bound --http-addr).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_host_port)]
    pub advertise_http: Option<String>,
    /// Address of the HTTP API (`/v1/...`); port 0 picks a free one.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:4646")]
    pub http_addr: SocketAddr,
    /// The region this server serves (Nomad's): jobs naming another region are
    /// refused; its clients' tasks see it as `NOMAD_REGION` and `${node.region}`.
    #[arg(long, value_name = "NAME", default_value = drover_server::config::DEFAULT_REGION)]
    pub region: String,
    /// Address of the node RPCs client agents connect to.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:4647")]
    pub rpc_addr: SocketAddr,
    /// File holding the cluster token: every HTTP request and RPC must carry it.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// File holding the node-introduction token: give this one, not the cluster
    /// token, to client agents (their `token_file`). It opens the node RPCs only
    /// (each call also proves the node's own secret), never the HTTP API nor the
    /// servers' forwarding. Needs --token-file.
    #[arg(long, value_name = "FILE", requires = "token_file")]
    pub node_token_file: Option<PathBuf>,
    /// Enforce ACLs on the HTTP API (Nomad's `acl { enabled = true }`): every request
    /// is checked against its token's policies; `drover acl bootstrap` makes the first
    /// management token. The --token-file token then only authenticates servers and
    /// nodes on the RPCs.
    #[arg(long)]
    pub acl_enabled: bool,

    /// The keyring's key-encryption key (base64 of 32 random bytes, mode 0600), which
    /// wraps the root keys that encrypt variables: every server of a cluster must be
    /// given the same file. Default: `<data-dir>/keystore/kek`, generated on first
    /// start (a single server).
    #[arg(long, value_name = "FILE")]
    pub keyring_kek_file: Option<PathBuf>,
    /// Nodes must heartbeat at least this often, e.g. "10s".
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_ttl: Duration,
    /// Extra time after a missed TTL before a node is down.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_grace: Duration,
    /// TLS certificate (PEM) for both listeners; with --tls-key-file.
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// TLS private key (PEM); with --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// CA that client certificates must chain to (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Scheduler workers (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: Option<u16>,
    /// How feasible nodes are ranked.
    #[arg(long, value_parser = ["binpack", "spread"], default_value = "binpack")]
    pub scheduler: String,
    /// Log filter, e.g. "info" or "drover_server=debug".
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

/// `drover server` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ServerCommand {
    /// Show the servers, the leader and the store (--address: any server, or an
    /// agent's socket).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_lease_ttl(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::from_secs(2) {
        return Err(format!("{text} is too short: at least 2s"));
    }
    Ok(d)
}

fn parse_host_port(text: &str) -> Result<String, String> {
    let bad = || format!("{text:?} is not HOST:PORT");
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('/') {
        return Err(bad());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(text.to_owned()),
        _ => Err(format!("{text:?}: the port must be 1 to 65535")),
    }
}

/// An etcd client URL: `http://HOST:PORT` or `https://HOST:PORT`, with at most a
/// trailing `/`. No credentials (`user:password@`): they would be shown in
/// `server status` and in errors, and etcd's user/password auth is not supported
/// anyway. No other path, query or fragment: nothing would use them.
fn check_etcd_endpoint(e: &str) -> Result<(), String> {
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or_else(|| format!("{e:?} must start with http:// or https://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        // Not echoed: the part before '@' may be a password.
        return Err(
            "an endpoint holds credentials (user:password@): refused; etcd's user/password \
             auth is not supported; secure etcd with TLS client certificates \
             (--etcd-cert-file, --etcd-key-file)"
                .to_owned(),
        );
    }
    if tail.contains('?') || tail.contains('#') {
        return Err(format!(
            "{e:?}: no query (?) or fragment (#) in an endpoint"
        ));
    }
    if !tail.is_empty() && tail != "/" {
        return Err(format!(
            "{e:?}: no path in an endpoint (give scheme://HOST:PORT)"
        ));
    }
    parse_host_port(authority).map(|_| ())
}

/// A private key file (`flag`'s): refused when its group or other users can read
/// or change it (whoever reads it can act as this server), as the token file is
/// ([`drover_host::private_file::check_private_file`]).
fn check_key_file(flag: &str, path: &std::path::Path) -> anyhow::Result<()> {
    if !path.exists() {
        // The loader says so, naming the file (certificate first).
        return Ok(());
    }
    let fix = format!("`chmod 600 {}`", path.display());
    drover_host::private_file::check_private_file(path, 0o077, &fix)
        .map_err(|e| anyhow::anyhow!("{flag}: key file {}: {e}", path.display()))
}

/// What a server name may be. The name travels as gRPC metadata (the mark of a
/// forwarded write, which must never be dropped) and in etcd keys: ASCII only.
const SERVER_NAME_RULE: &str = "1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-'";

fn valid_server_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The host name, for the default server name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "drover-server".to_owned())
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like \"10s\": {e}"))?;
    if d.is_zero() {
        return Err("must be more than 0".into());
    }
    Ok(d)
}

/// What a server runs with, checked before anything is opened.
#[derive(Clone)]
pub struct ServerOptions {
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// HTTP listener.
    pub http_addr: SocketAddr,
    /// RPC listener.
    pub rpc_addr: SocketAddr,
    /// Required on every request, when set.
    pub token: Option<String>,
    /// What client agents carry instead of `token` on node RPCs, when set.
    pub node_token: Option<String>,
    /// Both listeners speak TLS, when set.
    pub tls: Option<TlsFiles>,
    /// Heartbeat TTL.
    pub heartbeat_ttl: Duration,
    /// Heartbeat grace.
    pub heartbeat_grace: Duration,
    /// Scheduler workers.
    pub workers: Option<usize>,
    /// Ranking.
    pub algorithm: SchedulerAlgorithm,
    /// Where the state lives.
    pub store: StoreChoice,
    /// This server's name.
    pub name: String,
    /// Advertised RPC address (default: the bound one).
    pub advertise_rpc: Option<String>,
    /// Advertised HTTP address (default: the bound one).
    pub advertise_http: Option<String>,
    /// The region served.
    pub region: String,
    /// The API socket of an agent in this process (`agent --dev`), which answers
    /// Nomad's client endpoints (`/v1/client/fs/logs/...`) on the HTTP address.
    pub local_agent: Option<PathBuf>,
    /// ACLs are enforced on the HTTP API.
    pub acl_enabled: bool,

    /// The keyring's KEK file (`None`: generated in the data dir).
    pub keyring_kek_file: Option<PathBuf>,
}

/// Where the state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// redb in the data dir; this server always leads.
    Embedded,
    /// An etcd cluster; the servers elect a leader through it.
    Etcd {
        /// Client URLs.
        endpoints: Vec<String>,
        /// Key prefix.
        prefix: String,
        /// Leader lease TTL.
        lease_ttl: Duration,
        /// TLS to etcd (https:// endpoints).
        tls: Option<drover_server::store::etcd::EtcdTls>,
    },
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token never reaches a log line, a panic message or `{:?}` output.
        f.debug_struct("ServerOptions")
            .field("data_dir", &self.data_dir)
            .field("http_addr", &self.http_addr)
            .field("rpc_addr", &self.rpc_addr)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "node_token",
                &self.node_token.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.tls)
            .field("heartbeat_ttl", &self.heartbeat_ttl)
            .field("heartbeat_grace", &self.heartbeat_grace)
            .field("workers", &self.workers)
            .field("algorithm", &self.algorithm)
            .field("store", &self.store)
            .field("name", &self.name)
            .field("advertise_rpc", &self.advertise_rpc)
            .field("advertise_http", &self.advertise_http)
            .field("region", &self.region)
            .field("local_agent", &self.local_agent)
            .field("acl_enabled", &self.acl_enabled)
            .finish()
    }
}

impl ServerArgs {
    /// The options, with the token file read and the TLS files checked: errors name
    /// the flag and the file.
    pub fn options(&self) -> anyhow::Result<ServerOptions> {
        let Some(data_dir) = self.data_dir.clone() else {
            bail!("--data-dir is required");
        };
        let store = match self.store.as_str() {
            "etcd" => {
                if self.etcd_endpoints.is_empty() {
                    bail!("--store etcd needs --etcd-endpoints URL[,URL...]");
                }
                for e in &self.etcd_endpoints {
                    check_etcd_endpoint(e)
                        .map_err(|why| anyhow::anyhow!("--etcd-endpoints: {why}"))?;
                }
                if let Some(key) = &self.etcd_key_file {
                    check_key_file("--etcd-key-file", key)?;
                }
                if self.etcd_prefix.is_empty() || !self.etcd_prefix.ends_with('/') {
                    bail!(
                        "--etcd-prefix {:?}: give a non-empty prefix ending in / (e.g. /drover/)",
                        self.etcd_prefix
                    );
                }
                let https = self
                    .etcd_endpoints
                    .iter()
                    .any(|e| e.starts_with("https://"));
                let tls = match &self.etcd_ca_file {
                    Some(ca) => {
                        if !https {
                            bail!("--etcd-ca-file is for https:// --etcd-endpoints");
                        }
                        Some(drover_server::store::etcd::EtcdTls {
                            ca: ca.clone(),
                            cert: self.etcd_cert_file.clone(),
                            key: self.etcd_key_file.clone(),
                            server_name: None,
                        })
                    }
                    None if https => {
                        bail!("https:// --etcd-endpoints need etcd's CA: --etcd-ca-file FILE")
                    }
                    None => None,
                };
                StoreChoice::Etcd {
                    endpoints: self.etcd_endpoints.clone(),
                    prefix: self.etcd_prefix.clone(),
                    lease_ttl: self.leader_lease_ttl,
                    tls,
                }
            }
            _ => {
                if !self.etcd_endpoints.is_empty() || self.etcd_ca_file.is_some() {
                    bail!("--etcd-endpoints and --etcd-ca-file are only used with --store etcd");
                }
                StoreChoice::Embedded
            }
        };
        let name = match &self.name {
            Some(n) if !valid_server_name(n) => {
                bail!("--name {n:?}: {SERVER_NAME_RULE}")
            }
            Some(n) => n.clone(),
            None => {
                let h = host_name();
                if !valid_server_name(&h) {
                    bail!(
                        "the host name {h:?} cannot be this server's name ({SERVER_NAME_RULE}); \
                         pass --name NAME"
                    );
                }
                h
            }
        };
        let region = self.region.trim();
        if region.is_empty()
            || region.len() > 128
            || region.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            bail!(
                "--region {:?}: expected 1 to 128 characters without spaces, e.g. \"global\"",
                self.region
            );
        }
        let token = match &self.token_file {
            None => None,
            Some(f) => Some(
                drover_host::private_file::read_token(f)
                    .map_err(|e| anyhow::anyhow!("--token-file: {e}"))?,
            ),
        };
        let node_token = match &self.node_token_file {
            None => None,
            Some(f) => Some(
                drover_host::private_file::read_token(f)
                    .map_err(|e| anyhow::anyhow!("--node-token-file: {e}"))?,
            ),
        };
        if node_token.is_some() && node_token == token {
            bail!(
                "--node-token-file holds the cluster token (--token-file): the nodes' token \
                 must be another one, or a node could act as a user and as a server"
            );
        }
        let tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => {
                check_key_file("--tls-key-file", key)?;
                let files = TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca_file.clone(),
                };
                // Loaded once here so that a bad file stops the start, not a listener.
                drover_server::http::tls_server_config(&files)?;
                Some(files)
            }
            (None, None) => None,
            _ => bail!("give both --tls-cert-file and --tls-key-file, or neither"),
        };
        Ok(ServerOptions {
            region: region.to_owned(),
            data_dir,
            store,
            name,
            advertise_rpc: self.advertise_rpc.clone(),
            advertise_http: self.advertise_http.clone(),
            local_agent: None,
            acl_enabled: self.acl_enabled,

            keyring_kek_file: self.keyring_kek_file.clone(),
            http_addr: self.http_addr,
            rpc_addr: self.rpc_addr,
            token,
            node_token,
            tls,
            heartbeat_ttl: self.heartbeat_ttl,
            heartbeat_grace: self.heartbeat_grace,
            workers: self.workers.map(usize::from),
            algorithm: match self.scheduler.as_str() {
                "spread" => SchedulerAlgorithm::Spread,
                _ => SchedulerAlgorithm::BinPack,
            },
        })
    }
}

/// A server started by [`start`].
pub struct Started {
    /// Where the HTTP API listens.
    pub http: SocketAddr,
    /// Where the RPCs listen.
    pub rpc: SocketAddr,
    /// Ends when both listeners stopped (after `stop` fired), or with the first error.
    pub done: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Bind both listeners, open the store, start the server and serve until `stop`.
pub async fn start(options: ServerOptions, stop: CancellationToken) -> anyhow::Result<Started> {
    let http_listener = tokio::net::TcpListener::bind(options.http_addr)
        .await
        .with_context(|| format!("cannot listen on {} (--http-addr)", options.http_addr))?;
    let rpc_listener = tokio::net::TcpListener::bind(options.rpc_addr)
        .await
        .with_context(|| format!("cannot listen on {} (--rpc-addr)", options.rpc_addr))?;
    let http = http_listener.local_addr()?;
    let rpc = rpc_listener.local_addr()?;
    create_private_dir(&options.data_dir)?;
    let (store, election): (Arc<dyn Store>, Arc<dyn Election>) = match &options.store {
        StoreChoice::Embedded => (
            Arc::new(
                drover_server::store::redb::RedbStore::open(&options.data_dir).with_context(
                    || {
                        format!(
                            "cannot open the server store in {}",
                            options.data_dir.display()
                        )
                    },
                )?,
            ),
            Arc::new(drover_server::SoleLeader::default()),
        ),
        StoreChoice::Etcd {
            endpoints,
            prefix,
            lease_ttl,
            tls,
        } => {
            let mut etcd = drover_server::EtcdOptions::new(endpoints.clone());
            etcd.prefix = prefix.clone();
            etcd.lease_ttl = *lease_ttl;
            etcd.tls = tls.clone();
            let store = drover_server::EtcdStore::connect(etcd)
                .await
                .with_context(|| {
                    format!(
                        "cannot use etcd at {} (--etcd-endpoints)",
                        endpoints.join(",")
                    )
                })?;
            let election = store.election();
            (Arc::new(store), election)
        }
    };
    let mut config = ServerConfig::new(&options.data_dir);
    config.heartbeat_ttl = options.heartbeat_ttl;
    config.heartbeat_grace = options.heartbeat_grace;
    if let Some(w) = options.workers {
        config.workers = w;
    }
    config.algorithm = options.algorithm;
    config.region.clone_from(&options.region);
    config.acl_enabled = options.acl_enabled;

    config
        .keyring_kek_file
        .clone_from(&options.keyring_kek_file);
    config.forward = ForwardOptions {
        token: options.token.clone(),
        // The other servers' certificates come from the same CA as this one's: the
        // client CA when mutual TLS is on, else this server's own chain (a
        // self-signed certificate shared by the servers, or a file holding the CA
        // after the certificate).
        tls: options.tls.as_ref().map(|files| ForwardTls {
            ca_file: files
                .client_ca
                .clone()
                .unwrap_or_else(|| files.cert.clone()),
            identity: Some((files.cert.clone(), files.key.clone())),
        }),
    };
    let advertised = |given: &Option<String>, bound: SocketAddr, flag: &str| {
        let addr = given.clone().unwrap_or_else(|| bound.to_string());
        if given.is_none() && bound.ip().is_unspecified() && options.store != StoreChoice::Embedded
        {
            tracing::warn!(
                "{flag} is not set and the listener is bound to {bound}: other servers \
                 cannot reach {addr}; set {flag} HOST:PORT"
            );
        }
        addr
    };
    let me = ServerInfo {
        name: options.name.clone(),
        rpc_addr: advertised(&options.advertise_rpc, rpc, "--advertise-rpc"),
        http_addr: advertised(&options.advertise_http, http, "--advertise-http"),
        tls: options.tls.is_some(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started: ServerInfo::now(),
    };
    if let StoreChoice::Etcd { lease_ttl, .. } = &options.store {
        refuse_taken_name(election.as_ref(), &me, *lease_ttl).await?;
    }
    let server = match Server::start_with(config, store, election.clone(), me, stop.clone()).await {
        Ok(server) => server,
        Err(e) => {
            // The name was claimed on this server's lease: give it back now, not after
            // the lease TTL, so that a server started in its place is not refused.
            election.close().await;
            return Err(anyhow::Error::new(e).context("cannot start the server"));
        }
    };
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(
        http = %format!("{scheme}://{http}"),
        rpc = %rpc,
        data_dir = %options.data_dir.display(),
        name = %options.name,
        store = match &options.store {
            StoreChoice::Embedded => "embedded",
            StoreChoice::Etcd { .. } => "etcd",
        },
        token = options.token.is_some(),
        acl = options.acl_enabled,
        tls = options.tls.is_some(),
        "drover server listening"
    );
    if options.token.is_none() && !options.acl_enabled {
        tracing::warn!(
            "no --token-file: anyone who can reach the HTTP or RPC address can submit jobs, \
             which run as root on nodes with the rawexec driver, and register nodes"
        );
    }
    // Forwarded requests were authenticated by the RPC listener (the RPC's token);
    // the API behind it needs none of its own.
    let forwarded = drover_server::http::router(server.clone(), None);
    let rpc_task = tokio::spawn(drover_server::rpc::serve(
        server.clone(),
        rpc_listener,
        drover_server::rpc::RpcOptions {
            token: options.token.clone(),
            node_token: options.node_token.clone(),
            tls: options.tls.clone(),
            ..Default::default()
        },
        Some(forwarded),
        stop.clone(),
    ));
    let core_server = server.clone();
    let http_task = tokio::spawn(drover_server::http::serve(
        drover_server::http::router_with_local_agent(server, options.token, options.local_agent),
        http_listener,
        options.tls,
        stop.clone(),
    ));
    let done = tokio::spawn(async move {
        // Either listener ending (an error, or `stop`) stops the other: a server half
        // up is worse than none.
        let (mut rpc_task, mut http_task) = (rpc_task, http_task);
        let (rpc_result, http_result) = tokio::select! {
            r = &mut rpc_task => { stop.cancel(); (r, http_task.await) }
            r = &mut http_task => { stop.cancel(); (rpc_task.await, r) }
        };
        // The leader loops finish and the server leaves the election (etcd: its lease
        // is revoked, so another server leads at once instead of after the lease
        // TTL). Bounded: a store that does not answer must not hold the exit.
        if tokio::time::timeout(Duration::from_secs(10), core_server.stopped())
            .await
            .is_err()
        {
            tracing::warn!("the server's loops did not stop within 10s; exiting anyway");
        }
        rpc_result
            .context("the RPC listener panicked")?
            .context("RPC listener")?;
        http_result
            .context("the HTTP listener panicked")?
            .context("HTTP listener")?;
        Ok(())
    });
    Ok(Started { http, rpc, done })
}

/// Two live servers with one name cannot be told apart (status, leadership, the
/// forwarding of writes): a server claims its name in the store before it serves, in
/// one step, and does not start when a live server with other addresses holds it (of
/// servers started at once with one name, one starts). The same name at the same
/// addresses is this server restarted before its old registration expired: taken over.
async fn refuse_taken_name(
    election: &dyn Election,
    me: &ServerInfo,
    lease_ttl: Duration,
) -> anyhow::Result<()> {
    match election
        .claim(me.clone())
        .await
        .context("cannot register this server's name in etcd")?
    {
        NameClaim::Claimed => Ok(()),
        NameClaim::HeldBy(other) => bail!(
            "--name {}: a live server already registered this name (rpc {}, http {}); give \
             each server its own name, or, if that was this server before a restart, wait \
             {}s for its registration to expire",
            me.name,
            other.rpc_addr,
            other.http_addr,
            lease_ttl.as_secs()
        ),
    }
}

fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))
}

/// The argument of `drover server --config FILE` in `argv` (the whole command line),
/// if it is one.
fn server_config_arg(argv: &[OsString]) -> Option<PathBuf> {
    // The command is the first word that is neither a flag nor the value of a global
    // flag that takes one (as `jobspec::nomad_style_args` finds it).
    let mut i = 1;
    while i < argv.len() {
        match argv[i].to_str() {
            Some("--address" | "--namespace") => i += 2,
            Some(a) if a.starts_with('-') => i += 1,
            _ => break,
        }
    }
    if argv.get(i).and_then(|a| a.to_str()) != Some("server") {
        return None;
    }
    let mut rest = argv[i + 1..].iter();
    while let Some(arg) = rest.next() {
        match arg.to_str() {
            Some("--") => return None,
            Some("--config") => return rest.next().map(PathBuf::from),
            Some(a) if a.starts_with("--config=") => {
                return Some(PathBuf::from(&a["--config=".len()..]));
            }
            _ => {}
        }
    }
    None
}

/// A TOML value as the text(s) of a flag, or why it cannot be one.
fn config_value_texts(value: &toml::Value, multiple: bool) -> Result<Vec<String>, String> {
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(format!(
            "a {} is not a value of this setting (give a string, a number or true/false)",
            other.type_str()
        )),
    };
    match value {
        toml::Value::Array(items) if multiple => items.iter().map(scalar).collect(),
        toml::Value::Array(_) => Err("takes one value, not a list".to_owned()),
        v => scalar(v).map(|t| vec![t]),
    }
}

/// `drover server --config FILE`: `command` (the whole CLI) with the file's settings as
/// the defaults of the server's flags, so that a flag on the command line wins, the
/// file wins over the built-in defaults, and the file's values are parsed and checked
/// exactly as the flags are. Unchanged without `--config`. Errors name the file and the
/// key: an unknown key, a value of the wrong kind, a value the flag refuses.
pub fn with_config_file(
    command: clap::Command,
    argv: &[OsString],
) -> anyhow::Result<clap::Command> {
    let Some(file) = server_config_arg(argv) else {
        return Ok(command);
    };
    let shown = file.display();
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("--config {shown}: cannot read it"))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("--config {shown}: not valid TOML"))?;
    let Some(server) = command.find_subcommand("server") else {
        return Ok(command);
    };
    let mut defaults: Vec<(clap::Id, Vec<String>)> = Vec::new();
    // The file's values as flags, parsed below exactly as the command line would be.
    let mut as_flags: Vec<String> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = server
            .get_arguments()
            .filter(|_| !matches!(long.as_str(), "config" | "help" | "version"))
            .find(|a| a.get_long() == Some(long.as_str()) && !a.is_global_set())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--config {shown}: unknown setting {key:?} (the settings are the long \
                     names of `drover server --help`'s flags, e.g. http_addr)"
                )
            })?;
        let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        let multiple = arg.get_num_args().is_some_and(|n| n.max_values() > 1)
            || matches!(arg.get_action(), clap::ArgAction::Append);
        let texts = config_value_texts(value, multiple)
            .map_err(|why| anyhow::anyhow!("--config {shown}: {key}: {why}"))?;
        if switch {
            match value {
                toml::Value::Boolean(true) => as_flags.push(format!("--{long}")),
                toml::Value::Boolean(false) => {}
                _ => bail!("--config {shown}: {key}: give true or false"),
            }
        } else {
            as_flags.extend(texts.iter().map(|t| format!("--{long}={t}")));
        }
        defaults.push((arg.get_id().clone(), texts));
    }
    // Required flags may come from the command line: only the values are checked here.
    let check = server
        .clone()
        .no_binary_name(true)
        .mut_args(|a| a.required(false))
        .try_get_matches_from(&as_flags);
    if let Err(e) = check {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        bail!("--config {shown}: {}", first.trim_start_matches("error: "));
    }
    Ok(command.mut_subcommand("server", |mut server| {
        for (id, texts) in defaults {
            // Leaked once per process start: clap's defaults are `&'static str` here
            // (owned ones need clap's `string` feature), and the file is small.
            let texts: Vec<&'static str> = texts.into_iter().map(|t| &*t.leak()).collect();
            server = server.mut_arg(id, |a| a.default_values(texts).required(false));
        }
        server
    }))
}

/// The `log_level` of `--config FILE`, for a SIGHUP (`info` when it has none).
fn config_log_level(file: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file).context("cannot read it")?;
    let table: toml::Table = toml::from_str(&text).context("not valid TOML")?;
    match table.get("log_level").or_else(|| table.get("log-level")) {
        None => Ok("info".to_owned()),
        Some(toml::Value::String(level)) => Ok(level.clone()),
        Some(_) => bail!("log_level: give a string, e.g. \"info\""),
    }
}

/// `drover server`: run until SIGINT/SIGTERM.
pub fn run(args: ServerArgs) -> ExitCode {
    // Flags and files first: a bad one exits before any socket opens.
    let options = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("drover: {e:#}");
            return ExitCode::from(2);
        }
    };
    let log = crate::service::init_logging(&args.log_level, false);
    // A --log-level on the command line wins over the file's, on SIGHUP too.
    let log_level_flag = std::env::args_os().any(|a| {
        a.to_str()
            .is_some_and(|a| a == "--log-level" || a.starts_with("--log-level="))
    });
    let config_file = match (&args.config, log_level_flag) {
        (Some(f), false) => std::path::absolute(f).ok(),
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("drover: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let stop = CancellationToken::new();
        tokio::spawn(super::agent::stop_on_signals(stop.clone()));
        // At once: SIGHUP's default action would end the server.
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        crate::service::spawn_watchdog();
        let tls = options.tls.is_some();
        let started = match start(options, stop.clone()).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("drover: {e:#}");
                return ExitCode::FAILURE;
            }
        };
        let status = format!("serving HTTP on {}, RPC on {}", started.http, started.rpc);
        crate::service::ready(&status);
        match hangups {
            Ok(hangups) => {
                tokio::spawn(reload_on_hangups(hangups, config_file, log, tls, status));
            }
            Err(e) => tracing::error!("cannot handle SIGHUP (configuration reloads): {e}"),
        }
        match started.done.await {
            Ok(Ok(())) => {
                tracing::info!("drover server stopped");
                ExitCode::SUCCESS
            }
            Ok(Err(e)) => {
                tracing::error!("{e:#}");
                ExitCode::FAILURE
            }
            Err(e) => {
                tracing::error!("server task: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGHUP: RELOADING=1, the `log_level` of `--config` applied (unless `--log-level`
/// was given; a file that does not load is logged and the filter kept), READY=1.
async fn reload_on_hangups(
    mut hangups: tokio::signal::unix::Signal,
    config_file: Option<PathBuf>,
    log: crate::service::LogReload,
    tls: bool,
    status: String,
) {
    while hangups.recv().await.is_some() {
        crate::service::reloading();
        tracing::info!("SIGHUP: reloading the configuration");
        match &config_file {
            None => tracing::info!(
                "no --config file (or --log-level given): the log filter is unchanged"
            ),
            Some(file) => match config_log_level(file) {
                Ok(level) => log.apply(&level),
                Err(e) => tracing::error!(
                    "--config {}: {e:#}; keeping the configuration in use",
                    file.display()
                ),
            },
        }
        if tls {
            // The listeners hold the certificates they were started with (rustls and
            // tonic configs built at start): replacing them needs a restart.
            tracing::info!(
                "TLS certificates are read when the server starts: restart it to use new ones"
            );
        }
        crate::service::ready(&status);
    }
}

/// Where the dev agent's HTTP API listens unless told otherwise: Nomad's.
pub const DEV_HTTP_ADDR: &str = "127.0.0.1:4646";

/// The server of `drover agent --dev`, on its own thread and runtime (the agent's
/// runtime is single-threaded by design; scheduling must not stall it). Its store is
/// `<data_dir>/server`, its HTTP API on `http_addr` (Nomad's 127.0.0.1:4646 by
/// default, port 0 for one the OS picks), its RPCs on 127.0.0.1 with a port the OS
/// picks; it stops when `stop` fires. Returns once it listens.
pub fn start_dev(
    data_dir: PathBuf,
    token: String,
    http_addr: SocketAddr,
    local_agent: PathBuf,
    acl_enabled: bool,
    stop: CancellationToken,
) -> anyhow::Result<(SocketAddr, SocketAddr, std::thread::JoinHandle<()>)> {
    // Bound here first for a clear error: a port in use is another dev agent (or
    // Nomad's) most of the time.
    match std::net::TcpListener::bind(http_addr) {
        Ok(probe) => drop(probe),
        Err(e) => bail!(
            "cannot listen on {http_addr} for the dev agent's HTTP API: {e}; \
             is another dev agent (Drover's or Nomad's) running? Choose another address \
             with --dev-http-addr IP:PORT (port 0 picks a free one)"
        ),
    }
    let options = ServerOptions {
        data_dir,
        http_addr,
        region: drover_server::config::DEFAULT_REGION.to_owned(),
        rpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        token: Some(token),
        node_token: None,
        tls: None,
        heartbeat_ttl: Duration::from_secs(10),
        heartbeat_grace: Duration::from_secs(10),
        workers: None,
        algorithm: SchedulerAlgorithm::BinPack,
        store: StoreChoice::Embedded,
        name: "dev".into(),
        advertise_rpc: None,
        advertise_http: None,
        local_agent: Some(local_agent),
        acl_enabled,

        keyring_kek_file: None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("dev-server".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("dev-server")
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(anyhow::anyhow!(
                        "cannot start the dev server's runtime: {e}"
                    )));
                    return;
                }
            };
            runtime.block_on(async move {
                match start(options, stop.clone()).await {
                    Ok(started) => {
                        let _ = tx.send(Ok((started.http, started.rpc)));
                        match started.done.await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => tracing::error!("dev server: {e:#}"),
                            Err(e) => tracing::error!("dev server: {e}"),
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })
        .context("cannot start the dev server's thread")?;
    match rx.recv() {
        Ok(Ok((http, rpc))) => Ok((http, rpc, thread)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            bail!("the dev server's thread ended before it listened")
        }
    }
}

/// `drover server status`: the servers, the leader and the store, as the server at
/// `--address` (any of them, or an agent's socket) sees them.
pub async fn server_status(
    c: &drover_server_api::client::Client,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let status = c.servers_status().await.map_err(cluster_error)?.value;
    if json {
        print_json(&status)?;
    } else {
        print!("{}", servers_status_text(&status));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_token() {
        let options = ServerOptions {
            data_dir: "/d".into(),
            http_addr: "127.0.0.1:1".parse().unwrap(),
            rpc_addr: "127.0.0.1:2".parse().unwrap(),
            token: Some("s3cret-t0ken".into()),
            node_token: Some("n0de-t0ken".into()),
            tls: None,
            heartbeat_ttl: Duration::from_secs(10),
            heartbeat_grace: Duration::from_secs(10),
            workers: None,
            algorithm: SchedulerAlgorithm::default(),
            store: StoreChoice::Embedded,
            name: "s1".into(),
            region: "global".into(),
            advertise_rpc: None,
            advertise_http: None,
            local_agent: None,
            acl_enabled: false,

            keyring_kek_file: None,
        };
        let shown = format!("{options:?}");
        assert!(
            !shown.contains("s3cret-t0ken") && !shown.contains("n0de-t0ken"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    fn args(extra: &[&str]) -> ServerArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            server: ServerArgs,
        }
        let mut argv = vec!["drover-server", "--data-dir", "/tmp/x"];
        argv.extend_from_slice(extra);
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().server
    }

    fn err(extra: &[&str]) -> String {
        format!("{:#}", args(extra).options().unwrap_err())
    }

    /// `drover server ARGS` parsed as main() does, with `--config` files applied.
    fn parse_with_config(argv: &[&str]) -> anyhow::Result<ServerArgs> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Sub,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Server(ServerArgs),
        }
        let argv: Vec<OsString> = ["drover", "server"]
            .iter()
            .chain(argv)
            .map(OsString::from)
            .collect();
        let command = with_config_file(<Cli as clap::CommandFactory>::command(), &argv)?;
        let matches = command.try_get_matches_from(&argv)?;
        let Sub::Server(args) = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?.command;
        Ok(args)
    }

    #[test]
    fn a_config_file_sets_the_flags_defaults_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("server.toml");
        let config = file.to_str().unwrap();
        std::fs::write(
            &file,
            "data_dir = \"/srv/d\"\nhttp-addr = \"127.0.0.1:5646\"\nacl_enabled = true\n\
             workers = 3\netcd_endpoints = [\"http://127.0.0.1:1\", \"http://127.0.0.1:2\"]\n",
        )
        .unwrap();
        let args = parse_with_config(&["--config", config]).unwrap();
        assert_eq!(args.data_dir, Some(PathBuf::from("/srv/d")));
        assert_eq!(args.http_addr, "127.0.0.1:5646".parse().unwrap());
        assert!(args.acl_enabled);
        assert_eq!(args.workers, Some(3));
        assert_eq!(args.etcd_endpoints.len(), 2);
        assert_eq!(args.log_level, "info", "built-in default kept");
        let args = parse_with_config(&[
            &format!("--config={config}"),
            "--http-addr",
            "127.0.0.1:1",
            "--data-dir",
            "/other",
        ])
        .unwrap();
        assert_eq!(args.http_addr, "127.0.0.1:1".parse().unwrap());
        assert_eq!(args.data_dir, Some(PathBuf::from("/other")));

        for (text, expected) in [
            ("datadir = \"/d\"\n", "unknown setting \"datadir\""),
            ("config = \"/x\"\n", "unknown setting \"config\""),
            ("http_addr = \"nope\"\n", "--http-addr"),
            ("workers = 0\n", "workers"),
            ("acl_enabled = \"yes\"\n", "acl_enabled: give true or false"),
            ("data_dir = [\"/a\", \"/b\"]\n", "data_dir: takes one value"),
            ("data_dir = 1.5\n", "data_dir: a float"),
            ("data_dir = \n", "not valid TOML"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = format!(
                "{:#}",
                parse_with_config(&["--config", config]).unwrap_err()
            );
            assert!(e.contains(config) && e.contains(expected), "{text:?}: {e}");
        }
        let e = format!(
            "{:#}",
            parse_with_config(&["--config", "/nonexistent/server.toml"]).unwrap_err()
        );
        assert!(
            e.contains("/nonexistent/server.toml: cannot read it"),
            "{e}"
        );
    }

    #[test]
    fn a_server_name_is_ascii_letters_digits_dot_dash_underscore() {
        for bad in ["", "s\u{e9}rver", "a b", "a/b", &"x".repeat(65)] {
            let e = err(&["--name", bad]);
            assert!(
                e.contains("--name") && e.contains("1 to 64"),
                "{bad:?}: {e}"
            );
        }
        for good in ["s1", "srv-2.example_x", &"x".repeat(64)] {
            assert_eq!(args(&["--name", good]).options().unwrap().name, good);
        }
    }

    #[test]
    fn etcd_endpoints_with_credentials_paths_queries_or_fragments_are_refused() {
        let etcd = |e: &str| err(&["--store", "etcd", "--name", "s1", "--etcd-endpoints", e]);
        let e = etcd("http://root:hunter2@127.0.0.1:2379");
        assert!(
            e.contains("--etcd-endpoints") && e.contains("not supported"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "the password is not echoed: {e}");
        for bad in [
            "http://127.0.0.1:2379/v3",
            "http://127.0.0.1:2379?x=1",
            "http://127.0.0.1:2379/#f",
        ] {
            assert!(etcd(bad).contains("--etcd-endpoints"), "{bad}");
        }
        for good in ["http://127.0.0.1:2379", "http://127.0.0.1:2379/"] {
            args(&["--store", "etcd", "--name", "s1", "--etcd-endpoints", good])
                .options()
                .unwrap();
        }
    }

    #[test]
    fn key_files_group_or_others_can_read_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pem");
        std::fs::write(&key, "not a key").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = err(&[
            "--name",
            "s1",
            "--tls-cert-file",
            key.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ]);
        assert!(
            e.contains("--tls-key-file") && e.contains("chmod 600"),
            "{e}"
        );
        assert!(e.contains(key.to_str().unwrap()), "{e}");
        let e = err(&[
            "--store",
            "etcd",
            "--name",
            "s1",
            "--etcd-endpoints",
            "https://127.0.0.1:2379",
            "--etcd-ca-file",
            key.to_str().unwrap(),
            "--etcd-cert-file",
            key.to_str().unwrap(),
            "--etcd-key-file",
            key.to_str().unwrap(),
        ]);
        assert!(
            e.contains("--etcd-key-file") && e.contains("chmod 600"),
            "{e}"
        );
    }
}
