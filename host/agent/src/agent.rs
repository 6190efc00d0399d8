//! The agent daemon: config in, plugins loaded, API served, until told to stop.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::allocs::AllocManager;
use crate::config::AgentConfig;
use crate::dirs::{Access, DirError};
use crate::plugins::candidate::Builtin;
use crate::plugins::catalog::{Catalog, LoadContext};
use crate::state::{RedbStore, StateError, StateStore};
use crate::tasks::TaskManager;

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A directory could not be prepared, or is not safe from other host users
    /// (wrong owner, writable or readable by others); the message says how to fix it.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The state store could not be opened (corrupt, newer schema, in use). The agent
    /// refuses to start rather than guess; the message says what to do.
    #[error("{0}")]
    State(#[from] StateError),
    /// The cluster settings (servers, TLS, token file) or the node id are unusable.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The cluster API cannot be forwarded as configured (server address, TLS files).
    #[error(transparent)]
    Forward(#[from] crate::cluster::forward::ForwardError),
    /// The agent's own binary, which Nomad drivers' log relays run, cannot be found.
    #[error("cannot find the agent's own binary (Nomad drivers' log relays run it): {0}")]
    OwnBinary(std::io::Error),
    /// The API socket could not be bound.
    #[error("cannot listen on {path}: {reason}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Bind the API socket (mode 0600). A stale socket file left by a dead agent is
/// replaced; one that a live agent answers on is an error.
fn bind_api(path: &Path) -> Result<tokio::net::UnixListener, AgentError> {
    let listen_err = |reason: String| AgentError::Listen {
        path: path.to_owned(),
        reason,
    };
    if !drover_plugin_sdk::handshake::socket_path_fits(path) {
        return Err(listen_err(format!(
            "the path is {} bytes, longer than a unix socket allows (107); choose a shorter data_dir or api_socket",
            path.as_os_str().len()
        )));
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(listen_err("another agent is already serving on it".into()));
        }
        std::fs::remove_file(path)
            .map_err(|e| listen_err(format!("cannot remove stale socket: {e}")))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| listen_err(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| listen_err(e.to_string()))?;
    Ok(listener)
}

/// Raise the open-file limit (see [`crate::limits::raise_nofile_limit`]) and warn
/// when it is still below what the configured bounds can use together.
fn raise_nofile_limit(config: &AgentConfig) {
    let now = match crate::limits::raise_nofile_limit() {
        Ok(l) => {
            if l.now != l.was {
                tracing::debug!(was = l.was, now = l.now, "raised the open-file limit");
                // Plugins, and through their executors the tasks, get the limit the
                // operator started the agent with, not the agent's raised one.
                drover_plugin_sdk::client::set_plugin_nofile_soft_limit(l.was);
            }
            l.now
        }
        Err(e) => {
            tracing::warn!("cannot raise the open-file limit to its hard limit: {e}");
            rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .unwrap_or(u64::MAX)
        }
    };
    let budget = crate::limits::descriptor_budget(&config.limits);
    if now < budget {
        tracing::warn!(
            limit = now,
            budget,
            "the open-file limit is below what the configured [limits] can use together; \
             raise the hard limit (e.g. LimitNOFILE= in the systemd unit) or lower them"
        );
    }
}

/// Say loudly, at error level, when the binary the built-in drivers run from (the
/// agent's own) fails the checks every plugin binary must pass, e.g. a `drover` built
/// with umask 002 and so group-writable. The built-ins are still refused (a binary
/// other users can write must not run as the agent), and `plugin status` shows each
/// one skipped with the same reason; without this line the operator would only see
/// every driver missing.
fn check_builtins_binary(builtins: &[Builtin]) {
    let mut seen = std::collections::BTreeSet::new();
    for b in builtins {
        if !seen.insert(&b.command) {
            continue;
        }
        let c = crate::plugins::candidate::Candidate {
            path: b.command.clone(),
            args: b.args.clone(),
            source: drover_api::PluginSource::Builtin,
            label: b.name.clone(),
        };
        if let Err(reason) = crate::plugins::trust::open_checked(&c) {
            let names: Vec<&str> = builtins
                .iter()
                .filter(|o| o.command == b.command)
                .map(|o| o.name.as_str())
                .collect();
            tracing::error!(
                path = %b.command.display(),
                builtins = %names.join(", "),
                "the built-in drivers will not run: {reason}"
            );
        }
    }
}

/// Run the agent until `stop` fires: open the state store (a bad one stops everything
/// here, before any socket or plugin), prepare directories, bind the API, reattach to or
/// launch plugins, serve.
///
/// On stop: stop serving and supervising. Plugin processes (and so the tasks they
/// watch) keep running for the next agent to reattach to, unless
/// `config.drain_on_shutdown` is set: then tasks are stopped, then plugins.
pub async fn run(
    config: AgentConfig,
    builtins: Vec<Builtin>,
    stop: CancellationToken,
) -> Result<(), AgentError> {
    run_with(config, builtins, stop, None).await
}

/// The agent is up: its API serves, its plugins were launched (or reattached to) and
/// its stored tasks recovered; a cluster client has started to join its servers.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The plugins, for what acts on them later (a SIGHUP's reload of `plugin_dir`).
    pub catalog: Arc<Catalog>,
    /// The API socket.
    pub api_socket: PathBuf,
}

/// [`run`], telling `ready` once the agent is up (see [`Ready`]); nothing is sent when
/// it stops or fails first.
pub async fn run_with(
    config: AgentConfig,
    builtins: Vec<Builtin>,
    stop: CancellationToken,
    ready: Option<tokio::sync::oneshot::Sender<Ready>>,
) -> Result<(), AgentError> {
    raise_nofile_limit(&config);
    check_builtins_binary(&builtins);
    let data_dir = config.data_dir();
    // `--dev`'s default is a fixed name in the shared temp dir, which any host user
    // can create first. Refusing it (rather than moving to a fresh random dir) keeps
    // the name the CLI looks for, and tells the operator someone tried.
    let what = if config.dev && config.data_dir.is_none() {
        "dev data directory"
    } else {
        "data directory"
    };
    crate::dirs::prepare(&data_dir, what, Access::Private)?;
    let store: Arc<dyn StateStore> = Arc::new(RedbStore::open(&data_dir)?);
    let plugin_dir = config.plugin_dir();
    if config.dev || plugin_dir.exists() {
        crate::dirs::prepare(&plugin_dir, "plugin directory", Access::RootMayOwn(0o700))?;
    }
    let run_dir = data_dir.join("run");
    crate::dirs::prepare(&run_dir, "plugin socket directory", Access::Private)?;
    let alloc_dir = data_dir.join("alloc");
    crate::dirs::prepare(
        &alloc_dir,
        "task directory root",
        Access::NotWritableByOthers(0o711),
    )?;
    let plugin_state_dir = data_dir.join("plugin-state");
    crate::dirs::prepare(&plugin_state_dir, "plugin state directory", Access::Private)?;
    // Nomad task drivers' log FIFOs: the agent's own, out of every task's reach.
    let nomad_fifo_dir = data_dir.join("nomad-fifos");
    crate::dirs::prepare(
        &nomad_fifo_dir,
        "Nomad driver FIFO directory",
        Access::Private,
    )?;
    // The log relays of Nomad drivers' tasks are this binary, re-executed.
    let nomad_host = drover_plugin_sdk::client::NomadHostOptions::new(
        nomad_fifo_dir,
        std::env::current_exe().map_err(AgentError::OwnBinary)?,
    );
    // With servers, the agent is a cluster client: its settings and node id are
    // checked here, so that a bad token file or TLS file stops the start.
    let cluster = if config.servers.is_empty() {
        None
    } else {
        Some(crate::cluster::prepare(&config)?)
    };
    // The cluster API on the agent's socket is forwarded to the servers over the same
    // connections (TLS, token) the cluster client uses.
    let forward = cluster.as_ref().map(|c| {
        let conn = c.connection();
        let servers = (0..conn.len())
            .map(|i| (conn.address(i).to_owned(), conn.channel(i)))
            .collect();
        Arc::new(crate::cluster::forward::Forwarder::new(
            servers,
            conn.token(),
        ))
    });
    let api_path = config.api_socket();
    if let Some(dir) = api_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::dirs::prepare(dir, "API socket directory", Access::RootMayOwn(0o700))?;
    }
    let listener = bind_api(&api_path)?;
    tracing::info!(
        api = %api_path.display(),
        data_dir = %data_dir.display(),
        plugin_dir = %plugin_dir.display(),
        dev = config.dev,
        "drover agent starting"
    );

    let ctx = Arc::new(LoadContext {
        timeout: config.handshake_timeout,
        socket_dir: run_dir,
        accepted: drover_plugin_sdk::version::supported_api_range(),
        agent: drover_plugin_sdk::AgentInfo::new(String::new())
            .with_alloc_dir(alloc_dir.clone())
            .with_plugin_state_dir(plugin_state_dir),
        settings: config.plugin.clone(),
        plugin_pass_env: config.plugin_pass_env.clone(),
        plugin_auto_mtls: config.plugin_auto_mtls,
        nomad: Some(nomad_host),
    });
    let catalog = Arc::new(Catalog::new(store.clone()));
    let tasks = Arc::new(TaskManager::new(catalog.clone(), alloc_dir, store.clone()));
    tasks.load()?;
    // An upgraded plugin's tasks move to its new instance through the task manager.
    let handover: Arc<dyn crate::plugins::catalog::TaskHandover> = tasks.clone();
    catalog.set_handover(Arc::downgrade(&handover));
    let plugins_stop = stop.child_token();
    // Allocation runners report every status change here; the cluster client batches
    // them to the servers.
    let (alloc_updates, alloc_updates_rx) = tokio::sync::mpsc::unbounded_channel();
    // CSI plugins of the config, launched and supervised until the agent stops; the
    // cluster client fingerprints them.
    let csi_plugins = match &cluster {
        Some(prepared) => Arc::new(
            crate::csi::plugins::CsiPlugins::start(
                &config.csi_plugin,
                &data_dir,
                prepared.node_id(),
                stop.child_token(),
            )
            .map_err(|e| AgentError::Cluster(crate::cluster::ClusterError::CsiPlugin(e)))?,
        ),
        None => Arc::default(),
    };
    let allocs = cluster.as_ref().map(|prepared| {
        let mut hooks = crate::allocs::configured_hooks(
            config.artifact,
            forward
                .clone()
                .map(|f| f as Arc<dyn crate::allocs::TemplateSources>),
        );
        // Last: the device plugins' variables are set over the task's own.
        hooks.push(Box::new(crate::allocs::DeviceHook::new(catalog.clone())));
        let allocs = AllocManager::with_hooks(tasks.clone(), store.clone(), alloc_updates, hooks);
        allocs.set_node(prepared.node_env());
        allocs.set_host_volumes(prepared.host_volumes().clone());
        allocs.set_csi_mounts(Arc::new(crate::csi::mounts::CsiMounts::new(
            csi_plugins.clone(),
            Some(crate::csi::controller::ControllerLink::new(
                prepared.connection().clone(),
                prepared.node_id().to_owned(),
                prepared.node_secret().clone(),
            )),
        )));
        // Checked when the config was loaded.
        allocs.set_bridge(config.bridge().ok());
        allocs
    });

    // Serve the API at once: `plugin status` answers while plugins are still loading.
    let api = tokio::spawn(crate::api::serve(
        listener,
        config.limits.max_connections,
        config.limits.header_read_timeout,
        crate::api::ApiState {
            catalog: catalog.clone(),
            tasks: tasks.clone(),
            streams: Arc::new(crate::limits::StreamCaps::new(&config.limits)),
            // The cluster client's AllocManager, once `cluster::run` is wired here.
            allocs: allocs.clone(),
            forward,
        },
        stop.clone(),
        Duration::from_secs(5),
    ));
    // Not raced with `stop`: loading is bounded by the handshake timeout, and cutting it
    // short would leave processes launched but not yet recorded, which no later agent
    // could find again. A second SIGINT/SIGTERM still exits at once.
    catalog
        .load(&config, &builtins, ctx, plugins_stop.clone())
        .await;
    if config.watch_plugin_dir {
        tokio::spawn(crate::plugins::watch::run(
            catalog.clone(),
            plugin_dir.clone(),
            plugins_stop.clone(),
        ));
    } else {
        tracing::info!("watch_plugin_dir = false: plugin changes apply on `drover plugin reload`");
    }
    // Every stored task is recovered through its driver, bounded in time and
    // concurrency, while the API already serves. Recovery only reads what drivers
    // report, so cutting it short on stop loses nothing.
    let recovered = tokio::select! {
        _ = tasks.recover() => true,
        () = stop.cancelled() => false,
    };
    // Allocations are restored once their tasks are recovered, then the client
    // joins the cluster (a complete set from the servers reconciles the rest).
    let client = match (cluster, &allocs) {
        (Some(prepared), Some(allocs)) if recovered => {
            allocs.restore().await;
            tokio::spawn(crate::csi::controller::serve(
                prepared.connection().clone(),
                prepared.node_id().to_owned(),
                prepared.node_secret().clone(),
                csi_plugins.clone(),
                stop.child_token(),
            ));
            Some(tokio::spawn(crate::cluster::run_prepared(
                prepared,
                catalog.clone(),
                allocs.clone(),
                csi_plugins.clone(),
                alloc_updates_rx,
                stop.child_token(),
            )))
        }
        _ => None,
    };
    if let (true, Some(ready)) = (recovered, ready) {
        let _ = ready.send(Ready {
            catalog: catalog.clone(),
            api_socket: api_path.clone(),
        });
    }
    stop.cancelled().await;
    if let Some(client) = client {
        let _ = client.await;
    }
    // Runners stop acting (their tasks keep running for the next agent, unless drained
    // below): nothing may start or stop a task while the agent goes away.
    if let Some(allocs) = &allocs {
        allocs.shutdown();
    }
    tracing::info!(drain = config.drain_on_shutdown, "drover agent stopping");
    let _ = api.await;
    tasks.flush_records().await;
    plugins_stop.cancel();
    if config.drain_on_shutdown {
        let stopped = tasks.drain().await;
        tracing::info!(tasks = stopped, "drained: tasks stopped");
        catalog.shutdown_all().await;
    } else {
        tracing::info!(
            plugins = catalog.names().len(),
            "leaving plugin processes and their tasks running; the next agent reattaches \
             to them (use --drain to stop them instead)"
        );
    }
    // Again: a start that was under way at the first flush may have deferred a record
    // since (the timer that would commit it ends with the runtime).
    tasks.flush_records().await;
    let _ = std::fs::remove_file(&api_path);
    drop(store);
    tracing::info!("drover agent stopped");
    Ok(())
}
