//! The plugin catalog: which plugins serve which names, their live status, and the
//! supervisor that relaunches a plugin whose process died.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{PluginClient, PluginProcess};
use drover_plugin_sdk::{AgentInfo, Capabilities, Health};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::loader::{self, Candidate, Fingerprinted, PluginState, PluginStatus, Source};

/// Backoff between relaunches of a crashed plugin: doubles from the first to the last.
const RELAUNCH_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(250), Duration::from_secs(30));
/// A plugin that ran this long before dying starts over at the shortest backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// What the loader needs to (re)launch plugins.
#[derive(Debug, Clone)]
pub struct LoadContext {
    /// Handshake timeout.
    pub timeout: Duration,
    /// Where plugins put their sockets.
    pub socket_dir: PathBuf,
    /// Accepted plugin API versions.
    pub accepted: semver::VersionReq,
    /// Passed to `SetConfig`.
    pub agent: AgentInfo,
    /// `[plugin.NAME]` settings.
    pub settings: BTreeMap<String, crate::config::PluginSettings>,
}

impl LoadContext {
    /// Settings of plugin `name` (defaults when not configured).
    pub fn settings(&self, name: &str) -> crate::config::PluginSettings {
        self.settings.get(name).cloned().unwrap_or_default()
    }
}

struct Live {
    process: PluginProcess,
    version: String,
    api_version: String,
    task_schema: serde_json::Value,
    capabilities: Capabilities,
    state: PluginState,
    reason: String,
}

/// One loaded plugin. Its process may be replaced by the supervisor; callers take a
/// fresh [`LoadedPlugin::client`] for each call.
pub struct LoadedPlugin {
    /// The plugin's name.
    pub name: String,
    candidate: Candidate,
    live: Mutex<Live>,
    generation: watch::Sender<u64>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .finish()
    }
}

impl LoadedPlugin {
    fn new(fp: Fingerprinted) -> Self {
        LoadedPlugin {
            name: fp.info.name.clone(),
            candidate: fp.candidate.clone(),
            live: Mutex::new(live_from(fp)),
            generation: watch::channel(0).0,
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        // A panic while holding this lock cannot leave Live half-written (fields are
        // replaced whole), so a poisoned lock is still usable.
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A client for the current process.
    pub fn client(&self) -> PluginClient {
        self.live().process.client()
    }

    /// The JSON Schema of the task config.
    pub fn task_schema(&self) -> serde_json::Value {
        self.live().task_schema.clone()
    }

    /// What the driver supports.
    pub fn capabilities(&self) -> Capabilities {
        self.live().capabilities
    }

    /// State and reason.
    pub fn state(&self) -> (PluginState, String) {
        let live = self.live();
        (live.state, live.reason.clone())
    }

    /// Bumped each time the plugin process is replaced.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn set_state(&self, state: PluginState, reason: String) {
        let mut live = self.live();
        if live.state != state || live.reason != reason {
            tracing::info!(plugin = %self.name, state = ?state, reason = %reason, "plugin state changed");
        }
        live.state = state;
        live.reason = reason;
    }

    fn status(&self) -> PluginStatus {
        let live = self.live();
        PluginStatus {
            name: self.name.clone(),
            kind: "driver".into(),
            version: live.version.clone(),
            api_version: live.api_version.clone(),
            source: self.candidate.source,
            path: self.candidate.path.clone(),
            state: live.state,
            reason: live.reason.clone(),
            pid: live
                .process
                .exit_status()
                .is_none()
                .then(|| live.process.pid()),
        }
    }

    fn process(&self) -> PluginProcess {
        self.live().process.clone()
    }
}

fn live_from(fp: Fingerprinted) -> Live {
    Live {
        process: fp.process,
        version: fp.info.version,
        api_version: fp.api_version.to_string(),
        task_schema: fp.task_schema,
        capabilities: fp.capabilities,
        // Until the first fingerprint arrives.
        state: PluginState::Unhealthy,
        reason: "waiting for the first fingerprint".into(),
    }
}

/// All plugins: loaded ones by name, and rows for every binary that was skipped.
#[derive(Debug, Default)]
pub struct Catalog {
    loaded: RwLock<BTreeMap<String, Arc<LoadedPlugin>>>,
    skipped: RwLock<Vec<PluginStatus>>,
}

impl Catalog {
    /// The plugin serving `name`.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.loaded.read().ok()?.get(name).cloned()
    }

    /// Names of loaded plugins.
    pub fn names(&self) -> Vec<String> {
        self.loaded
            .read()
            .map(|l| l.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// One row per plugin binary seen: loaded first, then skipped.
    pub fn status(&self) -> Vec<PluginStatus> {
        let mut rows: Vec<PluginStatus> = self
            .loaded
            .read()
            .map(|l| l.values().map(|p| p.status()).collect())
            .unwrap_or_default();
        if let Ok(s) = self.skipped.read() {
            rows.extend(s.iter().cloned());
        }
        rows
    }

    fn skip(&self, row: PluginStatus) {
        tracing::warn!(
            plugin = %row.name,
            path = %row.path.display(),
            source = ?row.source,
            "plugin skipped: {}",
            row.reason
        );
        if let Ok(mut s) = self.skipped.write() {
            s.push(row);
        }
    }

    /// Scan, launch and fingerprint every candidate concurrently, pick one plugin per
    /// name, configure the winners and start their supervisors. Every outcome is
    /// logged, one line per binary.
    pub async fn load(
        self: &Arc<Self>,
        config: &AgentConfig,
        builtins: &[loader::Builtin],
        ctx: Arc<LoadContext>,
        stop: CancellationToken,
    ) {
        let started = Instant::now();
        let (mut candidates, skipped) = loader::scan_plugin_dir(&config.plugin_dir());
        for row in skipped {
            self.skip(row);
        }
        candidates.extend(builtins.iter().map(|b| Candidate {
            path: b.command.clone(),
            args: b.args.clone(),
            source: Source::Builtin,
            label: b.name.clone(),
        }));
        let mut launches = tokio::task::JoinSet::new();
        for c in candidates {
            if let Err(reason) =
                loader::allowed(&c.label, &config.plugin_allow, &config.plugin_deny)
            {
                self.skip(PluginStatus::skipped(&c, reason));
                continue;
            }
            if let Err(reason) = check_pin(
                &c,
                config
                    .plugin
                    .get(&c.label)
                    .and_then(|s| s.sha256.as_deref()),
            ) {
                self.skip(PluginStatus::skipped(&c, reason));
                continue;
            }
            let ctx = ctx.clone();
            launches.spawn(async move {
                let r = loader::fingerprint(&c, ctx.timeout, &ctx.socket_dir, &ctx.accepted).await;
                (c, r)
            });
        }
        let mut by_name: BTreeMap<String, Fingerprinted> = BTreeMap::new();
        let mut losers = Vec::new();
        while let Some(joined) = launches.join_next().await {
            let Ok((c, result)) = joined else { continue };
            let fp = match result {
                Ok(fp) => fp,
                Err(reason) => {
                    self.skip(PluginStatus::skipped(&c, reason));
                    continue;
                }
            };
            match by_name.remove(&fp.info.name) {
                None => {
                    by_name.insert(fp.info.name.clone(), fp);
                }
                Some(other) => {
                    let (win, lose) = if loader::prefer(&other, &fp, config.prefer_builtin) {
                        (other, fp)
                    } else {
                        (fp, other)
                    };
                    losers.push((lose, format!(
                        "another binary also provides {:?}: {} (version {}, {:?}) serves it instead",
                        win.info.name,
                        win.candidate.path.display(),
                        win.info.version,
                        win.candidate.source
                    )));
                    by_name.insert(win.info.name.clone(), win);
                }
            }
        }
        for (fp, reason) in losers {
            let mut row = PluginStatus::skipped(&fp.candidate, reason);
            row.name = fp.info.name.clone();
            row.version = fp.info.version.clone();
            fp.process.shutdown().await;
            self.skip(row);
        }
        let mut configuring = tokio::task::JoinSet::new();
        for (name, fp) in by_name {
            let settings = ctx.settings(&name);
            let ctx = ctx.clone();
            let allow = loader::allowed(&name, &config.plugin_allow, &config.plugin_deny);
            configuring.spawn(async move {
                let r = match allow {
                    Ok(()) => configure(&fp, &settings, &ctx).await,
                    Err(reason) => Err(reason),
                };
                (fp, r)
            });
        }
        while let Some(joined) = configuring.join_next().await {
            let Ok((fp, result)) = joined else { continue };
            if let Err(reason) = result {
                let mut row = PluginStatus::skipped(&fp.candidate, reason);
                row.name = fp.info.name.clone();
                row.version = fp.info.version.clone();
                fp.process.shutdown().await;
                self.skip(row);
                continue;
            }
            tracing::info!(
                plugin = %fp.info.name,
                version = %fp.info.version,
                api_version = %fp.api_version,
                source = ?fp.candidate.source,
                path = %fp.candidate.path.display(),
                pid = fp.process.pid(),
                "plugin loaded"
            );
            let plugin = Arc::new(LoadedPlugin::new(fp));
            if let Ok(mut l) = self.loaded.write() {
                l.insert(plugin.name.clone(), plugin.clone());
            }
            tokio::spawn(supervise(plugin, ctx.clone(), stop.clone()));
        }
        tracing::info!(
            loaded = self.names().len(),
            skipped = self.skipped.read().map(|s| s.len()).unwrap_or(0),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plugin loading finished"
        );
    }

    /// Ask every loaded plugin process to exit.
    pub async fn shutdown_all(&self) {
        let plugins: Vec<_> = self
            .loaded
            .read()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        let mut set = tokio::task::JoinSet::new();
        for p in plugins {
            set.spawn(async move {
                let how = p.process().shutdown().await;
                tracing::info!(plugin = %p.name, "plugin stopped ({how})");
            });
        }
        while set.join_next().await.is_some() {}
    }
}

fn check_pin(c: &Candidate, pin: Option<&str>) -> Result<(), String> {
    let Some(pin) = pin else { return Ok(()) };
    let actual = loader::sha256_file(&c.path)
        .map_err(|e| format!("cannot hash {}: {e}", c.path.display()))?;
    if !actual.eq_ignore_ascii_case(pin.trim()) {
        return Err(format!(
            "sha256 is {actual}, but the configuration pins {pin}"
        ));
    }
    Ok(())
}

/// Validate and apply the plugin's configuration.
async fn configure(
    fp: &Fingerprinted,
    settings: &crate::config::PluginSettings,
    ctx: &LoadContext,
) -> Result<(), String> {
    check_pin(&fp.candidate, settings.sha256.as_deref())?;
    loader::validate(&fp.config_schema, &settings.config)
        .map_err(|e| format!("invalid [plugin.{}] config: {e}", fp.info.name))?;
    let mut agent = ctx.agent.clone();
    agent.api_version = fp.api_version.to_string();
    fp.process
        .client()
        .set_config(settings.config.to_string(), &agent)
        .await
        .map_err(|e| format!("SetConfig failed: {e}"))
}

/// Keep the plugin's state current from its fingerprints, and relaunch its process
/// with backoff whenever it dies.
async fn supervise(plugin: Arc<LoadedPlugin>, ctx: Arc<LoadContext>, stop: CancellationToken) {
    let mut backoff = RELAUNCH_BACKOFF.0;
    loop {
        let process = plugin.process();
        let watcher = tokio::spawn(watch_fingerprints(plugin.clone(), process.client()));
        let launched = Instant::now();
        let mut how = tokio::select! {
            how = process.exited() => how,
            () = stop.cancelled() => {
                watcher.abort();
                return;
            }
        };
        watcher.abort();
        if launched.elapsed() > STABLE_AFTER {
            backoff = RELAUNCH_BACKOFF.0;
        }
        tracing::warn!(plugin = %plugin.name, pid = process.pid(), "plugin process exited ({how})");
        loop {
            plugin.set_state(
                PluginState::Unhealthy,
                format!("plugin process exited ({how}); relaunching in {backoff:?}"),
            );
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(RELAUNCH_BACKOFF.1);
            match relaunch(&plugin, &ctx).await {
                Ok(()) => break,
                Err(reason) => how = reason,
            }
        }
    }
}

async fn relaunch(plugin: &LoadedPlugin, ctx: &LoadContext) -> Result<(), String> {
    let fp = loader::fingerprint(
        &plugin.candidate,
        ctx.timeout,
        &ctx.socket_dir,
        &ctx.accepted,
    )
    .await?;
    if fp.info.name != plugin.name {
        let got = fp.info.name.clone();
        fp.process.shutdown().await;
        return Err(format!("relaunched binary now calls itself {got:?}"));
    }
    configure(&fp, &ctx.settings(&plugin.name), ctx).await?;
    tracing::info!(plugin = %plugin.name, pid = fp.process.pid(), "plugin relaunched");
    *plugin.live() = live_from(fp);
    plugin.generation.send_modify(|g| *g += 1);
    Ok(())
}

async fn watch_fingerprints(plugin: Arc<LoadedPlugin>, client: PluginClient) {
    let mut stream = match client.fingerprint().await {
        Ok(s) => Box::pin(s),
        Err(e) => {
            plugin.set_state(PluginState::Unhealthy, format!("Fingerprint failed: {e}"));
            return;
        }
    };
    while let Some(next) = stream.next().await {
        match next {
            Ok(fp) => {
                let state = match fp.health {
                    Health::Healthy => PluginState::Healthy,
                    Health::Unhealthy => PluginState::Unhealthy,
                    Health::Undetected => PluginState::Undetected,
                };
                plugin.set_state(state, fp.description);
            }
            Err(e) => {
                plugin.set_state(
                    PluginState::Unhealthy,
                    format!("fingerprint stream failed: {e}"),
                );
                return;
            }
        }
    }
}
