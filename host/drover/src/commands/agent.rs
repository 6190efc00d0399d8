//! `drover agent`: the flags, the config they load, and the daemon's life: logging,
//! the working directory, the in-process server of `--dev`, the signals that stop it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use drover_host::config::{AgentConfig, LogFormat};
use drover_host::plugins::candidate::Builtin;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::BUILTINS;

#[derive(Args)]
pub struct AgentArgs {
    /// Dev mode: data in $TMPDIR/drover-dev-$UID (refused if another user made it or
    /// it is open to others), plugin_dir created if missing.
    #[arg(long)]
    dev: bool,
    /// TOML config file (repeatable; later files win).
    #[arg(long = "config", value_name = "FILE")]
    config: Vec<PathBuf>,
    /// State, task directories and the API socket live here.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Directory scanned for plugin binaries.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// API socket path (default <data_dir>/api.sock).
    #[arg(long)]
    api_socket: Option<PathBuf>,
    /// Plugin handshake timeout, e.g. "5s".
    #[arg(long)]
    handshake_timeout: Option<String>,
    /// Log filter, e.g. "info" or "drover=debug".
    #[arg(long)]
    log_level: Option<String>,
    /// Log format: human or json.
    #[arg(long)]
    log_format: Option<String>,
    /// On SIGTERM/SIGINT stop every task and plugin (default: leave them running for
    /// the next agent to reattach to).
    #[arg(long)]
    drain: bool,
    /// Cluster servers' RPC addresses, HOST:PORT (repeatable or comma-separated): the
    /// agent joins the cluster as a client node.
    #[arg(long = "servers", value_name = "ADDR", value_delimiter = ',')]
    servers: Vec<String>,
    /// The node's name in the cluster (default: the host name).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// The node's datacenter (default dc1): jobs are placed only in the datacenters
    /// their `datacenters` name.
    #[arg(long, value_name = "NAME")]
    datacenter: Option<String>,
    /// Node metadata for job constraints (`${node.meta.KEY}`), repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    meta: Vec<String>,
    /// The interface whose first IPv4 address allocations' ports are on (default: the
    /// one the agent reaches its servers from; 127.0.0.1 with --dev).
    #[arg(long, value_name = "NAME")]
    network_interface: Option<String>,
    /// File holding the cluster token sent with every RPC (must not be readable by
    /// other users).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// With --dev: enforce ACLs on the dev server's HTTP API (as `[acl] enabled =
    /// true` in the config); `drover acl bootstrap` makes the first management token.
    #[arg(long)]
    acl_enabled: bool,
    /// With --dev: where the dev server's HTTP API listens (Nomad's 127.0.0.1:4646 by
    /// default; port 0 picks a free one).
    #[arg(long, value_name = "IP:PORT", default_value = super::server::DEV_HTTP_ADDR)]
    dev_http_addr: std::net::SocketAddr,
    /// CA the servers' certificates must chain to (PEM): TLS towards the servers.
    #[arg(long, value_name = "FILE")]
    tls_ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM), with --tls-key-file.
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// Client key for mutual TLS (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
}

fn agent_flags(args: &AgentArgs) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut flags = serde_json::Map::new();
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            flags.insert(k.to_owned(), v);
        }
    };
    put("dev", args.dev.then_some(true.into()));
    put(
        "data_dir",
        args.data_dir
            .as_ref()
            .map(|p| p.display().to_string().into()),
    );
    put(
        "plugin_dir",
        args.plugin_dir
            .as_ref()
            .map(|p| p.display().to_string().into()),
    );
    put(
        "api_socket",
        args.api_socket
            .as_ref()
            .map(|p| p.display().to_string().into()),
    );
    put(
        "handshake_timeout",
        args.handshake_timeout.clone().map(Into::into),
    );
    put("log_level", args.log_level.clone().map(Into::into));
    put("log_format", args.log_format.clone().map(Into::into));
    put("drain_on_shutdown", args.drain.then_some(true.into()));
    let cluster = ClusterFlags {
        servers: args.servers.clone(),
        node_name: args.node_name.clone(),
        datacenter: args.datacenter.clone(),
        meta: args.meta.clone(),
        network_interface: args.network_interface.clone(),
        token_file: args.token_file.clone(),
        tls_ca_file: args.tls_ca_file.clone(),
        tls_cert_file: args.tls_cert_file.clone(),
        tls_key_file: args.tls_key_file.clone(),
    };
    flags.extend(cluster.into_flags()?);
    Ok(flags)
}

pub fn run_agent(args: AgentArgs) -> ExitCode {
    // Before anything could install a SIGCHLD handler: the agent reaps its children
    // (plugins, CNI and CSI programs), and its plugins inherit what it has.
    let sigchld_was_ignored = drover_plugin_sdk::signal::reset_ignored_sigchld();
    // Pure config parse first: a bad config exits before any socket opens.
    let flags = match agent_flags(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drover: {e}");
            return ExitCode::from(2);
        }
    };
    // Absolute now: SIGHUP reads the same files again after the agent has moved to `/`.
    let config_files: Vec<PathBuf> = match std::path::absolute(PathBuf::new()) {
        Ok(cwd) => args.config.iter().map(|f| cwd.join(f)).collect(),
        Err(_) => args.config.clone(),
    };
    let config = match AgentConfig::load(&config_files, std::env::vars(), &flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover: {e}");
            return ExitCode::from(2);
        }
    };
    let log = crate::service::init_logging(&config.log_level, config.log_format == LogFormat::Json);
    if sigchld_was_ignored {
        tracing::warn!(
            "the agent was started with SIGCHLD ignored; set back to its default, so that \
             it and its plugins reap their own children"
        );
    }
    let reload = Reload {
        files: config_files,
        flags,
        loaded: config.clone(),
        log,
    };
    let mut config = config;
    if args.acl_enabled {
        config.acl.enabled = true;
    }
    if let Err(e) = leave_working_directory(&mut config) {
        tracing::error!("{e}");
        return ExitCode::FAILURE;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let dev_server = if config.dev && config.servers.is_empty() {
        match start_dev_server(&mut config, args.dev_http_addr, stop.clone()) {
            Ok(thread) => Some(thread),
            Err(e) => {
                tracing::error!("{e:#}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot find the drover binary to run built-in drivers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let builtins = BUILTINS
        .iter()
        // The device plugin runs only where the operator asked for it: a process per
        // agent for devices most nodes do not offer would be a cost for nothing.
        .filter(|(name, _)| {
            *name != drover_device_nodes::PLUGIN_NAME || config.plugin.contains_key(*name)
        })
        .map(|(name, _)| Builtin {
            name: (*name).to_owned(),
            command: exe.clone(),
            args: ["plugin", "serve", name]
                .iter()
                .map(OsString::from)
                .collect(),
        })
        .collect();
    // One thread: the agent is I/O-bound control-plane code. Cross-thread wake-ups cost
    // tens of microseconds each on VMs, which dominated plugin launch latency with a
    // multi-threaded runtime (drover-bench handshake: 3.1 ms vs 2.3 ms median).
    // Blocking work goes to `spawn_blocking`.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let agent_stop = stop.clone();
    let code = runtime.block_on(async move {
        tokio::spawn(stop_on_signals(agent_stop.clone()));
        // At once: SIGHUP's default action would end the agent. Handled once it is ready.
        let hangups = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!("cannot handle SIGHUP (configuration reloads): {e}");
                None
            }
        };
        crate::service::spawn_watchdog();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(serve_service_manager(ready_rx, hangups, reload));
        match drover_host::agent::run_with(config, builtins, agent_stop, Some(ready_tx)).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        }
    });
    // The agent's tasks go with its runtime: their connections to the dev server
    // (the templates' forwarder, the cluster client) close, so the dev server's
    // graceful stop does not wait for them. A blocking call still running (a template
    // render past its deadline) is not waited for long.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    // The agent is done (stopped, or failed to start): so is its dev server.
    stop.cancel();
    if let Some(thread) = dev_server {
        let _ = thread.join();
    }
    code
}

/// Make the config's paths absolute against the directory the agent was started in,
/// then make `/` the agent's working directory: nothing the agent loads or runs may
/// resolve a path against a directory someone else controls (a driver library's
/// relative search path, or one of its dependencies, would be looked for there).
/// Plugins and executors start in `/` too; a relative path in a plugin's own config
/// (`[plugin.NAME] config`) is the plugin's to resolve.
fn leave_working_directory(config: &mut AgentConfig) -> anyhow::Result<()> {
    let started_in = std::env::current_dir();
    let mut paths: Vec<&mut PathBuf> = [
        &mut config.data_dir,
        &mut config.plugin_dir,
        &mut config.api_socket,
        &mut config.token_file,
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(tls) = &mut config.tls {
        paths.push(&mut tls.ca_file);
        paths.extend(tls.cert_file.iter_mut());
        paths.extend(tls.key_file.iter_mut());
    }
    for path in paths.into_iter().filter(|p| p.is_relative()) {
        let dir = started_in.as_ref().map_err(|e| {
            anyhow::anyhow!(
                "{} is a relative path, and the working directory cannot be read ({e}): \
                 give an absolute path",
                path.display()
            )
        })?;
        *path = dir.join(&*path);
    }
    std::env::set_current_dir("/")
        .map_err(|e| anyhow::anyhow!("cannot change the working directory to /: {e}"))
}

/// `--dev`: a server in this process, its store in `<data_dir>/server`, its HTTP API
/// on `http_addr` (Nomad's 127.0.0.1:4646 unless `--dev-http-addr` says otherwise),
/// its RPCs on 127.0.0.1 with a port the OS picks; the agent registers with it as its
/// only server. `drover job ...` reaches it through the agent's socket too.
fn start_dev_server(
    config: &mut AgentConfig,
    http_addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use drover_host::dirs::{Access, prepare};
    let data_dir = config.data_dir();
    let what = if config.data_dir.is_none() {
        "dev data directory"
    } else {
        "data directory"
    };
    // As the agent prepares it (it does again, harmlessly): the server's store lives
    // inside, so the directory must be safe before the server writes there.
    prepare(&data_dir, what, Access::Private)?;
    let server_dir = data_dir.join("server");
    prepare(&server_dir, "dev server directory", Access::Private)?;
    // The dev server listens on 127.0.0.1, where every local user can connect, and a
    // job can run commands as root (rawexec): it gets a fresh random token, kept in a
    // 0600 file in its 0700 directory, which the agent sends. Users reach it through
    // the agent's 0600 socket.
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let token_file = server_dir.join("dev-token");
    write_private(&token_file, &token)
        .with_context(|| format!("cannot write the dev token {}", token_file.display()))?;
    let (http, rpc, thread) = super::server::start_dev(
        server_dir,
        token,
        http_addr,
        config.api_socket(),
        config.acl.enabled,
        stop,
    )?;
    tracing::info!(
        http = %format!("http://{http}"),
        rpc = %rpc,
        token_file = %token_file.display(),
        "dev server started; `drover job ...` reaches it through this agent's socket; \
         Nomad's clients at http://{http} with the token file's token in the \
         X-Nomad-Token header (NOMAD_TOKEN)"
    );
    if config.acl.enabled {
        tracing::info!(
            "ACLs are enabled: the dev token is no user credential on the HTTP API; \
             run `drover acl bootstrap` for a management token"
        );
    }
    // The dev server's ports are on this node: never given to a task (a static port
    // in bridge mode would take them over).
    config.reserved.add_port(http.port());
    config.reserved.add_port(rpc.port());
    config.servers = vec![rpc.to_string()];
    config.token_file = Some(token_file);
    Ok(thread)
}

/// Replace `path` with a new file holding `text`, mode 0600, never through a link.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // O_CREAT|O_EXCL: fails on any existing name, a link included.
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// What a SIGHUP reloads from: the config's sources as the agent started with them.
struct Reload {
    /// `--config` files, absolute.
    files: Vec<PathBuf>,
    /// The flags given.
    flags: serde_json::Map<String, serde_json::Value>,
    /// The config as loaded at start (before `--dev` filled in its server), to tell
    /// what a reload changed.
    loaded: AgentConfig,
    log: crate::service::LogReload,
}

/// Tell the service manager when the agent is ready, then handle SIGHUP: RELOADING=1,
/// the reload, READY=1 again.
async fn serve_service_manager(
    ready: tokio::sync::oneshot::Receiver<drover_host::agent::Ready>,
    hangups: Option<Signal>,
    mut reload: Reload,
) {
    // Dropped unsent: the agent stopped or failed before it was ready.
    let Ok(ready) = ready.await else { return };
    let status = |ready: &drover_host::agent::Ready| {
        format!(
            "serving on {}; plugins: {}",
            ready.api_socket.display(),
            ready.catalog.names().join(", ")
        )
    };
    tracing::info!("drover agent ready");
    crate::service::ready(&status(&ready));
    let Some(mut hangups) = hangups else { return };
    while hangups.recv().await.is_some() {
        crate::service::reloading();
        reload_on_hangup(&ready, &mut reload).await;
        crate::service::ready(&status(&ready));
    }
}

/// SIGHUP: read the config again and apply what can change while the agent runs, the
/// log filter; rescan `plugin_dir` as `drover plugin reload` does (new, upgraded and
/// removed plugin files; failed ones tried again). A config that does not load is
/// logged and the one in use kept. Other changed settings are named: they apply at the
/// next start, and a restart keeps every task.
async fn reload_on_hangup(ready: &drover_host::agent::Ready, reload: &mut Reload) {
    tracing::info!("SIGHUP: reloading the configuration");
    match AgentConfig::load(&reload.files, std::env::vars(), &reload.flags) {
        Err(e) => {
            tracing::error!("the configuration cannot be loaded, keeping the one in use: {e}")
        }
        Ok(new) => {
            reload.log.apply(&new.log_level);
            // Shown only if the new filter lets debug lines through.
            tracing::debug!(files = ?reload.files, "configuration read again");
            let mut unchanged = new.clone();
            unchanged.log_level.clone_from(&reload.loaded.log_level);
            if unchanged.plugin != reload.loaded.plugin {
                tracing::warn!(
                    "[plugin.*] settings changed: running plugins keep theirs until the \
                     agent restarts (`systemctl restart drover-agent` keeps every task)"
                );
            }
            unchanged.plugin.clone_from(&reload.loaded.plugin);
            if unchanged != reload.loaded {
                tracing::warn!(
                    "settings other than log_level and [plugin.*] changed: they apply when \
                     the agent restarts (which keeps every task)"
                );
            }
            if new.tls.is_some() {
                tracing::info!(
                    "the cluster TLS files ([tls]) are read when the agent starts: restart \
                     it to use new certificates (tasks keep running)"
                );
            }
            reload.loaded.log_level = new.log_level;
        }
    }
    let changes = ready.catalog.reload(true).await;
    tracing::info!(changes = changes.len(), "plugin directory rescanned");
}

/// First SIGINT/SIGTERM: graceful stop. Second: exit at once.
pub async fn stop_on_signals(stop: tokio_util::sync::CancellationToken) {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::info!("signal received; stopping (send again to exit at once)");
    crate::service::stopping();
    stop.cancel();
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    std::process::exit(130);
}

/// The cluster flags of `drover agent`, as given.
#[derive(Debug, Clone, Default)]
pub struct ClusterFlags {
    /// `--servers` (each may hold several, comma-separated).
    pub servers: Vec<String>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// `--datacenter`.
    pub datacenter: Option<String>,
    /// `--meta KEY=VALUE`, repeatable.
    pub meta: Vec<String>,
    /// `--network-interface`.
    pub network_interface: Option<String>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
    /// `--tls-ca-file`.
    pub tls_ca_file: Option<PathBuf>,
    /// `--tls-cert-file`.
    pub tls_cert_file: Option<PathBuf>,
    /// `--tls-key-file`.
    pub tls_key_file: Option<PathBuf>,
}

impl ClusterFlags {
    /// The flags that were given, as config keys (`servers`, `node_name`, `meta`,
    /// `token_file`, `tls`) for the figment flags layer. A `--meta` that is not
    /// `KEY=VALUE` is an error naming it.
    pub fn into_flags(self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        use serde_json::Value;
        let path = |p: PathBuf| Value::from(p.display().to_string());
        let mut flags = serde_json::Map::new();
        let servers: Vec<Value> = self
            .servers
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Value::from)
            .collect();
        if !servers.is_empty() {
            flags.insert("servers".into(), Value::Array(servers));
        }
        if let Some(n) = self.node_name {
            flags.insert("node_name".into(), n.into());
        }
        if let Some(dc) = self.datacenter {
            flags.insert("datacenter".into(), dc.into());
        }
        if let Some(name) = self.network_interface {
            flags.insert("network_interface".into(), name.into());
        }
        if !self.meta.is_empty() {
            let mut meta = serde_json::Map::new();
            for kv in &self.meta {
                let Some((k, v)) = kv.split_once('=') else {
                    bail!("--meta {kv:?}: expected KEY=VALUE, e.g. --meta rack=r1");
                };
                let k = k.trim();
                if k.is_empty() {
                    bail!("--meta {kv:?}: the key is empty (expected KEY=VALUE)");
                }
                meta.insert(k.to_owned(), v.into());
            }
            flags.insert("meta".into(), Value::Object(meta));
        }
        if let Some(t) = self.token_file {
            flags.insert("token_file".into(), path(t));
        }
        let mut tls = serde_json::Map::new();
        if let Some(p) = self.tls_ca_file {
            tls.insert("ca_file".into(), path(p));
        }
        if let Some(p) = self.tls_cert_file {
            tls.insert("cert_file".into(), path(p));
        }
        if let Some(p) = self.tls_key_file {
            tls.insert("key_file".into(), path(p));
        }
        if !tls.is_empty() {
            flags.insert("tls".into(), Value::Object(tls));
        }
        Ok(flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_flags_become_config_keys() {
        use drover_host::config::AgentConfig;
        let flags = ClusterFlags {
            servers: vec!["127.0.0.1:4647,10.0.0.2:4647".into(), "h:1".into()],
            node_name: Some("n1".into()),
            datacenter: Some("eu-west".into()),
            meta: vec!["rack=r1".into(), "zone=a=b".into()],
            network_interface: Some("lo".into()),
            token_file: Some("/etc/drover/token".into()),
            tls_ca_file: Some("/etc/drover/ca.pem".into()),
            tls_cert_file: None,
            tls_key_file: None,
        }
        .into_flags()
        .unwrap();
        let c = AgentConfig::load(&[], vec![], &flags).unwrap();
        assert_eq!(c.servers, vec!["127.0.0.1:4647", "10.0.0.2:4647", "h:1"]);
        assert_eq!(c.node_name.as_deref(), Some("n1"));
        assert_eq!(c.datacenter, "eu-west");
        assert_eq!(c.meta["rack"], "r1");
        assert_eq!(c.meta["zone"], "a=b");
        assert_eq!(c.network_interface.as_deref(), Some("lo"));
        assert_eq!(c.token_file, Some(PathBuf::from("/etc/drover/token")));
        assert_eq!(
            c.tls.map(|t| t.ca_file),
            Some(PathBuf::from("/etc/drover/ca.pem"))
        );

        for bad in ["rack", "=r1"] {
            let err = ClusterFlags {
                meta: vec![bad.into()],
                ..Default::default()
            }
            .into_flags()
            .unwrap_err()
            .to_string();
            assert!(err.contains(bad) && err.contains("KEY=VALUE"), "{err}");
        }
        assert!(ClusterFlags::default().into_flags().unwrap().is_empty());
    }
}
