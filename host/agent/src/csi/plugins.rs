//! CSI plugins of the agent's config (`[csi_plugin.ID]`): the agent launches each as a
//! child process (as root: node plugins mount), serves it a unix socket in a private
//! directory, restarts it with backoff when it exits, probes its health and reads its
//! node info and capabilities, which the cluster client fingerprints to the servers.
//!
//! Plugins run as tasks with a `csi_plugin` block (Nomad's way) are not supported yet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use drover_server_api::csi::{CsiPluginFingerprint, CsiPluginType};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::{CsiClient, CsiError};

/// How often a running plugin is probed.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a launched plugin has to serve its socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of one probe (connect and call).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// First and longest delay before relaunching a plugin that exited.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));
/// The socket's file name in the plugin's private directory.
const SOCKET: &str = "csi.sock";

/// `[csi_plugin.ID]` of the agent's config: a CSI plugin the agent runs itself.
///
/// In `args` and the values of `env`, `{endpoint}` is replaced by the socket's URL
/// (`unix:///...`), `{socket}` by its path, `{mount_dir}` by the mount directory and
/// `{node_id}` by the Drover node's id. `CSI_ENDPOINT` is set to the URL, as Nomad
/// does for plugin tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsiPluginConfig {
    /// `node`, `controller` or `monolith` (Nomad's `csi_plugin { type }`).
    #[serde(rename = "type")]
    pub plugin_type: CsiPluginType,
    /// The plugin program (an absolute path).
    pub command: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment (the agent's own is not passed on, beyond `PATH`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where volumes are staged and published on this node (Nomad's `mount_dir`);
    /// default `<data_dir>/csi/<ID>/mounts`. Made 0700 owned by root.
    #[serde(default)]
    pub mount_dir: Option<PathBuf>,
}

/// Check the plugins of the config: ids usable as path segments, absolute commands.
pub fn check_config(plugins: &BTreeMap<String, CsiPluginConfig>) -> Result<(), String> {
    for (id, p) in plugins {
        if id.is_empty()
            || id.len() > 128
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            || id.starts_with('.')
        {
            return Err(format!(
                "csi_plugin.{id}: the id must be 1-128 of [A-Za-z0-9._-], not starting with '.'"
            ));
        }
        if !p.command.is_absolute() {
            return Err(format!(
                "csi_plugin.{id}.command: {} is not an absolute path",
                p.command.display()
            ));
        }
        if let Some(m) = &p.mount_dir
            && !m.is_absolute()
        {
            return Err(format!(
                "csi_plugin.{id}.mount_dir: {} is not an absolute path",
                m.display()
            ));
        }
    }
    Ok(())
}

/// One configured plugin, as it runs.
#[derive(Debug)]
pub struct CsiPlugin {
    id: String,
    config: CsiPluginConfig,
    socket: PathBuf,
    mount_dir: PathBuf,
    state: watch::Sender<CsiPluginFingerprint>,
}

impl CsiPlugin {
    /// The plugin's id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// What it serves.
    pub fn plugin_type(&self) -> CsiPluginType {
        self.config.plugin_type
    }
    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
    /// Where its volumes are staged and published.
    pub fn mount_dir(&self) -> &Path {
        &self.mount_dir
    }
    /// Its fingerprint now.
    pub fn fingerprint(&self) -> CsiPluginFingerprint {
        self.state.borrow().clone()
    }
    /// Watch its fingerprint.
    pub fn subscribe(&self) -> watch::Receiver<CsiPluginFingerprint> {
        self.state.subscribe()
    }
    /// A client of its socket.
    pub async fn client(&self) -> Result<CsiClient, CsiError> {
        CsiClient::connect(&self.socket, PROBE_TIMEOUT).await
    }

    fn set_unhealthy(&self, why: String) {
        self.state.send_if_modified(|f| {
            let changed = f.healthy || f.health_description != why;
            f.healthy = false;
            f.health_description = why;
            changed
        });
    }
}

/// Every configured plugin.
#[derive(Debug, Default)]
pub struct CsiPlugins {
    plugins: BTreeMap<String, Arc<CsiPlugin>>,
    changes: Option<watch::Sender<u64>>,
}

impl CsiPlugins {
    /// Make the plugins' directories under `data_dir` and launch them; each is
    /// supervised until `stop`. `node_id` is the Drover node's id.
    pub fn start(
        configs: &BTreeMap<String, CsiPluginConfig>,
        data_dir: &Path,
        node_id: &str,
        stop: CancellationToken,
    ) -> Result<Self, String> {
        check_config(configs)?;
        let (changes, _) = watch::channel(0u64);
        let mut plugins = BTreeMap::new();
        for (id, config) in configs {
            let base = data_dir.join("csi").join(id);
            let sock_dir = base.join("plugin");
            let mount_dir = config
                .mount_dir
                .clone()
                .unwrap_or_else(|| base.join("mounts"));
            for dir in [&sock_dir, &mount_dir] {
                make_private_dir(dir).map_err(|e| format!("csi_plugin.{id}: {e}"))?;
            }
            let socket = sock_dir.join(SOCKET);
            if !drover_plugin_sdk::handshake::socket_path_fits(&socket) {
                return Err(format!(
                    "csi_plugin.{id}: its socket {} is longer than a unix socket path \
                     allows; choose a shorter data_dir",
                    socket.display()
                ));
            }
            let (state, _) = watch::channel(CsiPluginFingerprint {
                plugin_id: id.clone(),
                plugin_type: config.plugin_type,
                healthy: false,
                health_description: "starting".into(),
                provider: String::new(),
                provider_version: String::new(),
                node_id: String::new(),
                max_volumes: 0,
                topology: BTreeMap::new(),
                node: None,
                controller: None,
            });
            let plugin = Arc::new(CsiPlugin {
                id: id.clone(),
                config: config.clone(),
                socket,
                mount_dir,
                state,
            });
            tokio::spawn(supervise(
                plugin.clone(),
                node_id.to_owned(),
                changes.clone(),
                stop.clone(),
            ));
            plugins.insert(id.clone(), plugin);
        }
        Ok(Self {
            plugins,
            changes: Some(changes),
        })
    }

    /// The plugin `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<CsiPlugin>> {
        self.plugins.get(id)
    }

    /// Whether some plugin serves the Controller service.
    pub fn any_controller(&self) -> bool {
        self.plugins
            .values()
            .any(|p| p.plugin_type().is_controller())
    }

    /// Every plugin's fingerprint, by id.
    pub fn fingerprints(&self) -> BTreeMap<String, CsiPluginFingerprint> {
        self.plugins
            .iter()
            .map(|(id, p)| (id.clone(), p.fingerprint()))
            .collect()
    }

    /// Fires when any plugin's fingerprint changed.
    pub fn changes(&self) -> Option<watch::Receiver<u64>> {
        self.changes.as_ref().map(watch::Sender::subscribe)
    }

    /// Wait until plugin `id` is healthy, up to `timeout`.
    pub async fn wait_healthy(&self, id: &str, timeout: Duration) -> Result<(), String> {
        let plugin = self.get(id).ok_or_else(|| format!("no CSI plugin {id}"))?;
        let mut rx = plugin.subscribe();
        let last = tokio::time::timeout(timeout, rx.wait_for(|f| f.healthy))
            .await
            .map_err(|_| {
                format!(
                    "CSI plugin {id} not healthy within {timeout:?}: {}",
                    plugin.fingerprint().health_description
                )
            })?;
        last.map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Make `dir` (and its parents) and leave it 0700, owned by the agent's user.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn substitute(s: &str, plugin: &CsiPlugin, node_id: &str) -> String {
    let socket = plugin.socket.to_string_lossy();
    s.replace("{endpoint}", &format!("unix://{socket}"))
        .replace("{socket}", &socket)
        .replace("{mount_dir}", &plugin.mount_dir.to_string_lossy())
        .replace("{node_id}", node_id)
}

/// Launch, watch and relaunch one plugin until `stop`.
async fn supervise(
    plugin: Arc<CsiPlugin>,
    node_id: String,
    changes: watch::Sender<u64>,
    stop: CancellationToken,
) {
    // Every fingerprint change bumps the shared counter.
    let mut rx = plugin.subscribe();
    let bump = {
        let changes = changes.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = rx.changed() => if r.is_err() { return },
                    () = stop.cancelled() => return,
                }
                changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        })
    };
    let mut delay = BACKOFF.0;
    loop {
        // A socket left by an earlier run would make the new plugin fail to listen.
        let _ = std::fs::remove_file(&plugin.socket);
        let mut cmd = tokio::process::Command::new(&plugin.config.command);
        cmd.args(
            plugin
                .config
                .args
                .iter()
                .map(|a| substitute(a, &plugin, &node_id)),
        )
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        )
        .env(
            "CSI_ENDPOINT",
            format!("unix://{}", plugin.socket.to_string_lossy()),
        )
        .envs(
            plugin
                .config
                .env
                .iter()
                .map(|(k, v)| (k, substitute(v, &plugin, &node_id))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        // The plugin dies with the agent, even a killed one (SIGKILL has no drop):
        // the next agent launches its own instead of finding an orphan on a socket
        // path it reuses. Volumes it published stay mounted (mounts outlive their
        // maker) and the next instance unpublishes them. SAFETY: only prctl runs
        // between fork and exec (async-signal-safe, no allocation); the death signal
        // follows the forking thread, a runtime worker that lives as long as the agent.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                Ok(())
            });
        }
        let started = tokio::time::Instant::now();
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                plugin.set_unhealthy(format!(
                    "cannot launch {}: {e}",
                    plugin.config.command.display()
                ));
                tracing::warn!(plugin = %plugin.id, retry_in = ?delay, "CSI plugin: cannot launch: {e}");
                if sleep_or_stop(delay, &stop).await {
                    break;
                }
                delay = (delay * 2).min(BACKOFF.1);
                continue;
            }
        };
        tracing::info!(plugin = %plugin.id, pid = ?child.id(), "CSI plugin launched");
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(plugin.id.clone(), stderr));
        }
        let exited = tokio::select! {
            status = child.wait() => Some(status),
            () = watch_health(&plugin) => None,
            () = stop.cancelled() => None,
        };
        match exited {
            Some(status) => {
                let why = match status {
                    Ok(s) => format!("the plugin exited ({s})"),
                    Err(e) => format!("waiting for the plugin: {e}"),
                };
                plugin.set_unhealthy(why.clone());
                tracing::warn!(plugin = %plugin.id, retry_in = ?delay, "CSI plugin: {why}");
            }
            None => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                if stop.is_cancelled() {
                    plugin.set_unhealthy("the agent stopped".into());
                    break;
                }
            }
        }
        // A plugin that ran a while before exiting starts over with a short delay.
        if started.elapsed() > BACKOFF.1 {
            delay = BACKOFF.0;
        }
        if sleep_or_stop(delay, &stop).await {
            break;
        }
        delay = (delay * 2).min(BACKOFF.1);
    }
    bump.abort();
}

async fn sleep_or_stop(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => false,
        () = stop.cancelled() => true,
    }
}

/// The plugin's stderr as agent log lines, bounded per line.
async fn log_stderr(id: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(mut line)) = lines.next_line().await {
        if line.len() > 2048 {
            let mut cut = 2048;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        tracing::debug!(plugin = %id, "CSI plugin: {line}");
    }
}

/// Wait for the socket, read the plugin's identity and capabilities, then probe it
/// every [`PROBE_INTERVAL`]; never returns (the caller races it with the process).
async fn watch_health(plugin: &CsiPlugin) {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    let client = loop {
        match CsiClient::connect(&plugin.socket, PROBE_TIMEOUT).await {
            Ok(c) => match c.probe().await {
                Ok(_) => break c,
                Err(e) => plugin.set_unhealthy(e.to_string()),
            },
            Err(e) => plugin.set_unhealthy(format!("starting: {e}")),
        }
        if tokio::time::Instant::now() > deadline {
            plugin.set_unhealthy(format!("no answer on its socket within {START_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut known = loop {
        match describe(plugin, &client).await {
            Ok(f) => break f,
            Err(e) => {
                plugin.set_unhealthy(e.to_string());
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        }
    };
    loop {
        let result = tokio::time::timeout(PROBE_TIMEOUT, client.probe()).await;
        let (healthy, why) = match result {
            Ok(Ok(true)) => (true, String::new()),
            Ok(Ok(false)) => (false, "Probe: not ready".to_owned()),
            Ok(Err(e)) => (false, e.to_string()),
            Err(_) => (false, format!("Probe: no answer within {PROBE_TIMEOUT:?}")),
        };
        known.healthy = healthy;
        known.health_description = why;
        let next = known.clone();
        plugin.state.send_if_modified(|f| {
            let changed = *f != next;
            *f = next;
            changed
        });
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// The plugin's fingerprint from its Identity, Node and Controller answers.
async fn describe(
    plugin: &CsiPlugin,
    client: &CsiClient,
) -> Result<CsiPluginFingerprint, CsiError> {
    let info = client.plugin_info().await?;
    let kind = plugin.config.plugin_type;
    let mut f = plugin.fingerprint();
    f.provider = info.name;
    f.provider_version = info.vendor_version;
    if kind.is_node() {
        let node = client.node_info().await?;
        f.node_id = node.node_id;
        f.max_volumes = node.max_volumes;
        f.topology = node.topology;
        f.node = Some(client.node_capabilities().await?);
    }
    if kind.is_controller() {
        let caps = client.plugin_capabilities().await?;
        f.controller = Some(if caps.controller_service {
            client.controller_capabilities().await?
        } else {
            Default::default()
        });
    }
    Ok(f)
}
