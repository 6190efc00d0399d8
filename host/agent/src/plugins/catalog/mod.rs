//! The plugin catalog: which plugins serve which names, their live status, and the
//! supervisor that relaunches a plugin whose process died.
//!
//! Plugin processes outlive the agent. Each one the catalog serves has a
//! [`PluginRecord`] in the state store; at the next start the catalog takes the process
//! over again (same binary, same pid and start time, identity proven over RPC) instead
//! of launching a second one. A process that cannot be proven to be our plugin is never
//! signalled.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{PluginClient, PluginProcess};
use drover_plugin_sdk::{AgentInfo, Capabilities, Health};
use tokio::sync::{Semaphore, watch};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::plugins::instance::PluginInstance;
use drover_api::{PluginKind, PluginSource, PluginState, PluginStatus};

use crate::plugins::loader::{self, Candidate, Fingerprinted};
use crate::state::{MemStore, PluginRecord, StateError, StateStore};

mod reload;

pub use reload::{HandoverProgress, TaskHandover};

/// Backoff between relaunches of a crashed plugin: doubles from the first to the last.
const RELAUNCH_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(250), Duration::from_secs(30));
/// A plugin that ran this long before dying starts over at the shortest backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// At most this many stored plugin processes are being reattached at once, so a start
/// with many records (or hung plugins) stays bounded.
const REATTACH_CONCURRENCY: usize = 8;
/// A `StartTask` waits at most this long for a hand-over to end (which it does, in a
/// rollback at worst, within the hand-over timeout).
const HANDOVER_WAIT_CAP: Duration = Duration::from_secs(60);

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
    /// The agent's variables every plugin gets (`plugin_pass_env`).
    pub plugin_pass_env: Vec<String>,
    /// go-plugin AutoMTLS for every plugin process (`plugin_auto_mtls`).
    pub plugin_auto_mtls: bool,
}

impl LoadContext {
    /// Settings of plugin `name` (defaults when not configured).
    pub fn settings(&self, name: &str) -> crate::config::PluginSettings {
        self.settings.get(name).cloned().unwrap_or_default()
    }

    /// How the plugin labelled `label` is launched: its environment, its transport.
    pub fn launch_settings(&self, label: &str) -> loader::LaunchSettings {
        let settings = self.settings.get(label);
        loader::LaunchSettings::new(
            self.plugin_pass_env
                .iter()
                .chain(settings.into_iter().flat_map(|s| s.pass_env.iter())),
            settings.into_iter().flat_map(|s| s.env.iter()),
        )
        .with_auto_mtls(self.auto_mtls(label))
    }

    /// Whether the plugin labelled `label` talks go-plugin AutoMTLS: its own
    /// `[plugin.NAME] auto_mtls`, else the agent-wide `plugin_auto_mtls`.
    pub fn auto_mtls(&self, label: &str) -> bool {
        self.settings
            .get(label)
            .and_then(|s| s.auto_mtls)
            .unwrap_or(self.plugin_auto_mtls)
    }
}

struct Live {
    /// The file (and arguments) the instance runs: replaced by an upgrade.
    candidate: Candidate,
    /// sha256 of the bytes the instance runs.
    sha256: String,
    process: PluginInstance,
    reattached: bool,
    version: String,
    api_version: String,
    task_schema: serde_json::Value,
    capabilities: Capabilities,
    state: PluginState,
    reason: String,
    /// Attributes of the last fingerprint (`driver.<name>.<key>`), for the node's
    /// registration with the cluster servers.
    attributes: BTreeMap<String, String>,
    /// The file whose attempt to replace this instance failed, and why (the instance
    /// keeps serving); cleared once that file is gone or something replaces this.
    upgrade_failed: Option<(PathBuf, String)>,
    /// Set once its file is gone: why it takes no new tasks.
    retiring: Option<String>,
}

/// One loaded plugin. Its process may be replaced by the supervisor; callers take a
/// fresh [`LoadedPlugin::client`] for each call.
pub struct LoadedPlugin {
    /// The plugin's name.
    pub name: String,
    live: Mutex<Live>,
    generation: watch::Sender<u64>,
    /// Held while the instance is being replaced (relaunch after a crash, upgrade), so
    /// that two replacements never race.
    swap: tokio::sync::Mutex<()>,
    /// The generation of an instance that replaced the previous one in a hand-over
    /// still in progress (0: none): a task it refuses rolls the hand-over back.
    probation: std::sync::atomic::AtomicU64,
    /// Stops this plugin's supervisor (its plugin left the catalog, or the agent stops).
    stop: CancellationToken,
    /// The catalog's [`Catalog::driver_changes`], bumped when this plugin's state,
    /// reason or attributes change.
    changes: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .finish()
    }
}

impl LoadedPlugin {
    fn new(fp: Fingerprinted, changes: Arc<watch::Sender<u64>>, stop: CancellationToken) -> Self {
        LoadedPlugin {
            name: fp.info.name.clone(),
            live: Mutex::new(live_from(fp)),
            generation: watch::channel(0).0,
            swap: tokio::sync::Mutex::new(()),
            probation: std::sync::atomic::AtomicU64::new(0),
            stop,
            changes,
        }
    }

    /// The file (and arguments) the current instance runs.
    fn candidate(&self) -> Candidate {
        self.live().candidate.clone()
    }

    /// Why the plugin takes no new tasks (its file was removed); `None` normally.
    pub fn retiring(&self) -> Option<String> {
        self.live().retiring.clone()
    }

    /// Note on the serving row that replacing it with `file` failed, and why.
    fn set_upgrade_failed(&self, failed: Option<(PathBuf, String)>) {
        let mut live = self.live();
        if live.upgrade_failed != failed {
            live.upgrade_failed = failed;
            drop(live);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Mark the plugin as taking no new tasks, and why.
    fn set_retiring(&self, why: String) {
        self.live().retiring = Some(why);
        self.changes.send_modify(|n| *n += 1);
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

    /// The attributes of the driver's last fingerprint (empty until the first, and
    /// after a failed one).
    pub fn attributes(&self) -> BTreeMap<String, String> {
        self.live().attributes.clone()
    }

    /// Bumped each time the plugin process is replaced.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Returns once no hand-over is in progress (bounded: a hand-over ends, in a
    /// rollback at worst, within the catalog's hand-over timeout), so that a new task
    /// starts on the instance that keeps serving, never on one about to be rolled back.
    pub async fn after_handover(&self) {
        let deadline = tokio::time::Instant::now() + HANDOVER_WAIT_CAP;
        let mut generation = self.generation();
        while self.probation.load(std::sync::atomic::Ordering::SeqCst) != 0
            && tokio::time::Instant::now() < deadline
        {
            // Success ends a probation without a generation change: poll as well.
            tokio::select! {
                _ = generation.changed() => {}
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    /// Whether the instance of `generation` is on probation: it replaced the previous
    /// one in a hand-over still in progress.
    pub fn on_probation(&self, generation: u64) -> bool {
        generation != 0 && self.probation.load(std::sync::atomic::Ordering::SeqCst) == generation
    }

    fn set_state(&self, state: PluginState, reason: String) {
        let mut live = self.live();
        let changed = live.state != state || live.reason != reason;
        if changed {
            tracing::info!(plugin = %self.name, state = ?state, reason = %reason, "plugin state changed");
        }
        live.state = state;
        live.reason = reason;
        drop(live);
        if changed {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    fn set_attributes(&self, attributes: BTreeMap<String, String>) {
        let mut live = self.live();
        if live.attributes != attributes {
            live.attributes = attributes;
            drop(live);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    fn status(&self) -> PluginStatus {
        let live = self.live();
        let mut reason = live.reason.clone();
        let failed = live.upgrade_failed.as_ref().map(|(_, why)| why);
        for note in [live.retiring.as_ref(), failed].into_iter().flatten() {
            reason = format!("{reason}; {note}");
        }
        PluginStatus {
            name: self.name.clone(),
            kind: PluginKind::Driver,
            version: live.version.clone(),
            api_version: live.api_version.clone(),
            source: live.candidate.source,
            path: live.candidate.path.clone(),
            state: live.state,
            reason,
            pid: (!live.process.has_exited())
                .then(|| live.process.pid())
                .flatten(),
            reattached: live.reattached,
            in_process: live.process.in_process(),
        }
    }

    fn process(&self) -> PluginInstance {
        self.live().process.clone()
    }
}

fn live_from(fp: Fingerprinted) -> Live {
    Live {
        candidate: fp.candidate,
        sha256: fp.sha256,
        upgrade_failed: None,
        retiring: None,
        reattached: fp.process.is_reattached(),
        process: fp.process,
        version: fp.info.version,
        api_version: fp.api_version.to_string(),
        task_schema: fp.task_schema,
        capabilities: fp.capabilities,
        // Until the first fingerprint arrives.
        state: PluginState::Unhealthy,
        reason: "waiting for the first fingerprint".into(),
        attributes: BTreeMap::new(),
    }
}

/// Plugin records in the state store, and the binary hashes they carry.
struct Records {
    store: Arc<dyn StateStore>,
    /// sha256 by path, valid while the file's identity ([`loader::FileKey`], taken on
    /// the open descriptor) is unchanged: the `drover` binary serves every built-in and
    /// is tens of MB.
    hashes: Mutex<HashMap<PathBuf, (loader::FileKey, String)>>,
    /// One lock per path, held while hashing it, so that the built-ins, launched
    /// together from one binary, hash it once and the others find it in `hashes`.
    hashing: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Records {
    /// Open and check `c`'s binary ([`loader::open_checked`]) and hash the bytes behind
    /// the descriptor, off the async thread.
    async fn check(&self, c: &Candidate) -> Result<loader::Binary, String> {
        let cand = c.clone();
        let (fd, key) = tokio::task::spawn_blocking(move || loader::open_checked(&cand))
            .await
            .map_err(|e| format!("checking {}: {e}", c.path.display()))??;
        let cached = || {
            lock(&self.hashes)
                .get(&c.path)
                .filter(|(k, _)| *k == key)
                .map(|(_, h)| h.clone())
        };
        let path_lock = match cached() {
            Some(_) => None,
            None => Some(
                lock(&self.hashing)
                    .entry(c.path.clone())
                    .or_default()
                    .clone(),
            ),
        };
        let _hashing = match &path_lock {
            Some(l) => Some(l.lock().await),
            None => None,
        };
        let fd = Arc::new(fd);
        let sha256 = match cached() {
            Some(h) => h,
            None => {
                let hashed = fd.clone();
                let h = tokio::task::spawn_blocking(move || loader::sha256_fd(&hashed))
                    .await
                    .map_err(|e| format!("hashing {}: {e}", c.path.display()))?
                    .map_err(|e| format!("cannot hash {}: {e}", c.path.display()))?;
                lock(&self.hashes).insert(c.path.clone(), (key, h.clone()));
                h
            }
        };
        Ok(loader::Binary { fd, sha256 })
    }

    /// The sha256 the last check of `path` found, if it was hashed.
    fn cached_sha(&self, path: &Path) -> Option<String> {
        lock(&self.hashes).get(path).map(|(_, h)| h.clone())
    }

    /// Remember a serving plugin process so the next agent can reattach to it.
    async fn save(&self, fp: &Fingerprinted) {
        self.save_instance(
            &fp.info.name,
            &fp.info.version,
            fp.api_version.to_string(),
            &fp.candidate,
            &fp.sha256,
            &fp.process,
        )
        .await;
    }

    /// [`Records::save`] of an instance that served already (one an upgrade rolled
    /// back to).
    async fn save_live(&self, name: &str, live: &Live) {
        self.save_instance(
            name,
            &live.version,
            live.api_version.clone(),
            &live.candidate,
            &live.sha256,
            &live.process,
        )
        .await;
    }

    async fn save_instance(
        &self,
        name: &str,
        version: &str,
        api_version: String,
        c: &Candidate,
        sha256: &str,
        p: &PluginInstance,
    ) {
        // A library loaded into the agent has no process to take over: the next agent
        // loads it again.
        let Some(reattach) = p.reattach_config() else {
            return;
        };
        let rec = PluginRecord {
            name: name.to_owned(),
            version: version.to_owned(),
            api_version,
            args: c
                .args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            sha256: sha256.to_owned(),
            reattach,
        };
        if let Err(e) = self.write(move |store| store.put_plugin(&rec)).await {
            // Not fatal: the plugin serves. The cost comes at the next start, which
            // cannot find this process again and launches a fresh one beside it.
            tracing::error!(plugin = %name, pid = ?p.pid(), "plugin record not saved: {e}");
        }
    }

    async fn forget(&self, name: &str) {
        let owned = name.to_owned();
        if let Err(e) = self.write(move |store| store.delete_plugin(&owned)).await {
            tracing::warn!(plugin = %name, "stale plugin record not deleted: {e}");
        }
    }

    /// A store write (an fsync) on a blocking thread, off the runtime's workers.
    async fn write(
        &self,
        op: impl FnOnce(&dyn StateStore) -> Result<(), StateError> + Send + 'static,
    ) -> Result<(), String> {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || op(&*store)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the store write panicked or was cancelled: {e}")),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How far initial loading got: plugins inserted so far, and whether it finished.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    inserted: u64,
    done: bool,
}

/// Marks initial loading finished when dropped, so waiters never hang on a load that
/// was cancelled (agent stopping).
struct DoneOnDrop<'a>(&'a watch::Sender<Progress>);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|p| p.done = true);
    }
}

/// A candidate that does not serve, with its status row. The file's sha256 (when it
/// was hashed) tells a reload whether the file changed since.
#[derive(Debug, Clone)]
struct Skipped {
    /// The file (and arguments) the row is about, as it would be launched.
    candidate: Candidate,
    sha256: Option<String>,
    row: PluginStatus,
    /// It works, but another file serves its name (not worth trying again unless
    /// something changes); otherwise it failed, and `drover plugin reload` retries it.
    lost: bool,
}

impl Skipped {
    /// The row of a file refused before it was hashed (by the scan, or the allow and
    /// deny lists): the candidate is what the row names.
    fn refused(row: PluginStatus) -> Self {
        Skipped {
            candidate: Candidate {
                path: row.path.clone(),
                args: Vec::new(),
                source: row.source,
                label: row.name.clone(),
            },
            sha256: None,
            row,
            lost: false,
        }
    }

    /// Is this the row of candidate `c`?
    fn is_of(&self, c: &Candidate) -> bool {
        self.candidate.path == c.path && self.candidate.args == c.args
    }
}

/// All plugins: loaded ones by name, and rows for every binary that was skipped.
pub struct Catalog {
    loaded: RwLock<BTreeMap<String, Arc<LoadedPlugin>>>,
    skipped: RwLock<Vec<Skipped>>,
    records: Arc<Records>,
    /// What a reload needs, set by [`Catalog::load`].
    reload_env: Mutex<Option<Arc<reload::ReloadEnv>>>,
    /// One reload at a time (the watcher's and `drover plugin reload`'s).
    reloading: tokio::sync::Mutex<()>,
    /// Who moves tasks between instances of a driver (the task manager), installed at
    /// wiring; without one an upgrade does not wait for the tasks to move.
    handover: RwLock<Option<std::sync::Weak<dyn TaskHandover>>>,
    progress: watch::Sender<Progress>,
    /// Bumped when any loaded driver's state, reason or attributes change, or a
    /// driver is loaded: the cluster client registers again at once.
    changes: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("loaded", &self.names())
            .finish()
    }
}

impl Default for Catalog {
    /// A catalog whose plugin records live in memory (tests).
    fn default() -> Self {
        Catalog::new(Arc::new(MemStore::default()))
    }
}

impl Catalog {
    /// An empty catalog keeping plugin records in `store`.
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        Catalog {
            loaded: RwLock::new(BTreeMap::new()),
            skipped: RwLock::new(Vec::new()),
            records: Arc::new(Records {
                store,
                hashes: Mutex::new(HashMap::new()),
                hashing: Mutex::new(HashMap::new()),
            }),
            progress: watch::channel(Progress::default()).0,
            changes: Arc::new(watch::channel(0).0),
            reload_env: Mutex::new(None),
            reloading: tokio::sync::Mutex::new(()),
            handover: RwLock::new(None),
        }
    }

    /// Install who moves a driver's tasks to a new instance of it (the task manager);
    /// held weakly, as the task manager holds the catalog.
    pub fn set_handover(&self, handover: std::sync::Weak<dyn TaskHandover>) {
        if let Ok(mut h) = self.handover.write() {
            *h = Some(handover);
        }
    }

    /// A receiver that sees a change whenever a driver is loaded or a loaded
    /// driver's state, reason or fingerprint attributes change.
    pub fn driver_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The plugin serving `name`, once it is loaded; `None` once initial loading has
    /// finished without it (skipped, failed, not installed). Task recovery waits here
    /// for its driver. Returns at once for a plugin that is already loaded.
    pub async fn wait_loaded(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        let mut progress = self.progress.subscribe();
        loop {
            if let Some(p) = self.get(name) {
                return Some(p);
            }
            if progress.borrow_and_update().done {
                return self.get(name);
            }
            if progress.changed().await.is_err() {
                return self.get(name);
            }
        }
    }

    /// Whether initial loading has finished.
    pub fn loading_done(&self) -> bool {
        self.progress.borrow().done
    }

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
            rows.extend(s.iter().map(|s| s.row.clone()));
        }
        rows
    }

    /// Skip a file that was never hashed (refused by the scan).
    fn skip(&self, row: PluginStatus) {
        self.push_skipped(Skipped::refused(row));
    }

    /// Skip candidate `c`, whose bytes hash to `sha256` (`None`: what the last check
    /// of its file found, if any).
    fn skip_of(&self, c: &Candidate, sha256: Option<String>, row: PluginStatus) {
        let sha256 = sha256.or_else(|| self.records.cached_sha(&c.path));
        self.push_skipped(Skipped {
            candidate: c.clone(),
            sha256,
            row,
            lost: false,
        });
    }

    /// Skip candidate `c`, which works but lost its name to another file.
    fn skip_lost(&self, c: &Candidate, sha256: String, row: PluginStatus) {
        self.push_skipped(Skipped {
            candidate: c.clone(),
            sha256: Some(sha256),
            row,
            lost: true,
        });
    }

    fn push_skipped(&self, skipped: Skipped) {
        let row = &skipped.row;
        tracing::warn!(
            plugin = %row.name,
            path = %row.path.display(),
            source = ?row.source,
            "plugin skipped: {}",
            row.reason
        );
        if let Ok(mut s) = self.skipped.write() {
            s.push(skipped);
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
        let _done = DoneOnDrop(&self.progress);
        let started = Instant::now();
        let policy = Arc::new(loader::Policy::from_config(config));
        self.set_reload_env(config, builtins, &ctx, &policy, &stop);
        let candidates = self.candidates(config, builtins);
        let records = match self.records.store.plugins() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot read plugin records; launching every plugin afresh: {e}");
                Vec::new()
            }
        };
        let slots = Arc::new(Semaphore::new(REATTACH_CONCURRENCY));
        let (launches, unclaimed) = self.launch_all(candidates, records, &policy, &ctx, &slots);
        let mut retiring = self.retire_all(unclaimed, &ctx, &slots);
        let winners = self.pick_winners(launches, config).await;
        let serving = self.configure_all(winners, &policy, &ctx, &stop).await;
        while retiring.join_next().await.is_some() {}
        // Every process this start adopted or launched is known now, and supervisors
        // (which create new socket dirs when they relaunch) have not started: what else
        // is in the socket dir is left over from an earlier agent.
        let strays = stray_sockets(&ctx.socket_dir, &serving);
        for plugin in serving {
            tokio::spawn(supervise(
                plugin,
                ctx.clone(),
                self.records.clone(),
                policy.clone(),
            ));
        }
        // Waiters for a plugin that did not load need not wait for the sweep.
        self.progress.send_modify(|p| p.done = true);
        sweep_all(strays, &ctx, &slots).await;
        tracing::info!(
            loaded = self.names().len(),
            skipped = self.skipped.read().map(|s| s.len()).unwrap_or(0),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plugin loading finished"
        );
    }

    /// Every binary in `plugin_dir` that may be a plugin, then the built-ins; files
    /// that cannot be are skipped here, with their reason.
    fn candidates(&self, config: &AgentConfig, builtins: &[loader::Builtin]) -> Vec<Candidate> {
        let (mut candidates, skipped) = loader::scan_plugin_dir(&config.plugin_dir());
        for row in skipped {
            self.skip(row);
        }
        candidates.extend(builtins.iter().map(|b| Candidate {
            path: b.command.clone(),
            args: b.args.clone(),
            source: PluginSource::Builtin,
            label: b.name.clone(),
        }));
        candidates
    }

    /// Start obtaining (reattaching to, or checking, launching and fingerprinting)
    /// every allowed candidate, concurrently. Returns the launches under way and the
    /// plugin records no candidate claims.
    fn launch_all(
        &self,
        candidates: Vec<Candidate>,
        mut records: Vec<PluginRecord>,
        policy: &Arc<loader::Policy>,
        ctx: &Arc<LoadContext>,
        slots: &Arc<Semaphore>,
    ) -> (Launches, Vec<PluginRecord>) {
        let mut launches = tokio::task::JoinSet::new();
        for c in candidates {
            if let Err(reason) = loader::allowed(&c.label, &policy.allow, &policy.deny) {
                self.skip_of(&c, None, loader::skipped_status(&c, reason));
                continue;
            }
            let record = records
                .iter()
                .position(|r| record_matches(r, &c))
                .map(|i| records.swap_remove(i));
            let ctx = ctx.clone();
            let (store, slots, policy) = (self.records.clone(), slots.clone(), policy.clone());
            launches.spawn(async move {
                let r = obtain(&c, record, &ctx, &store, &slots, &policy).await;
                (c, r)
            });
        }
        (launches, records)
    }

    /// Records no candidate claims: the binary is gone, renamed, denied or no longer
    /// pinned. A process proven to be that plugin is no longer wanted.
    fn retire_all(
        &self,
        unclaimed: Vec<PluginRecord>,
        ctx: &LoadContext,
        slots: &Arc<Semaphore>,
    ) -> tokio::task::JoinSet<()> {
        let mut retiring = tokio::task::JoinSet::new();
        for rec in unclaimed {
            let (store, slots, timeout) = (self.records.clone(), slots.clone(), ctx.timeout);
            retiring.spawn(async move {
                let _slot = slots.acquire_owned().await;
                retire(&rec, timeout, "its binary is no longer a plugin candidate").await;
                store.forget(&rec.name).await;
            });
        }
        retiring
    }

    /// Collect the launches and keep one plugin per name (the highest version, or as
    /// `prefer_builtin` says); the others are shut down and listed as skipped, naming
    /// the binary that won.
    async fn pick_winners(
        &self,
        mut launches: Launches,
        config: &AgentConfig,
    ) -> BTreeMap<String, Fingerprinted> {
        let mut by_name: BTreeMap<String, Fingerprinted> = BTreeMap::new();
        let mut losers = Vec::new();
        while let Some(joined) = launches.join_next().await {
            let Ok((c, result)) = joined else { continue };
            let fp = match result {
                Ok(fp) => fp,
                Err(reason) => {
                    self.skip_of(&c, None, loader::skipped_status(&c, reason));
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
            let mut row = loader::skipped_status(&fp.candidate, reason);
            row.name = fp.info.name.clone();
            row.version = fp.info.version.clone();
            if fp.process.is_reattached() {
                // The record is under the winner's name, which the winner rewrites.
                tracing::info!(plugin = %fp.info.name, pid = ?fp.process.pid(), "shutting down a reattached plugin that no longer wins its name");
            }
            fp.process.shutdown().await;
            self.skip_lost(&fp.candidate, fp.sha256.clone(), row);
        }
        by_name
    }

    /// Validate each winner's configuration against its schema and send it
    /// (concurrently); a plugin that refuses it is shut down and skipped. Returns the
    /// plugins now serving, recorded and in the catalog.
    async fn configure_all(
        &self,
        winners: BTreeMap<String, Fingerprinted>,
        policy: &Arc<loader::Policy>,
        ctx: &Arc<LoadContext>,
        stop: &CancellationToken,
    ) -> Vec<Arc<LoadedPlugin>> {
        let mut configuring = tokio::task::JoinSet::new();
        for (name, fp) in winners {
            let settings = ctx.settings(&name);
            let (ctx, policy) = (ctx.clone(), policy.clone());
            configuring.spawn(async move {
                let r = configure(&fp, &settings, &ctx, &policy).await;
                (fp, r)
            });
        }
        let mut serving = Vec::new();
        while let Some(joined) = configuring.join_next().await {
            let Ok((fp, result)) = joined else { continue };
            if let Err(reason) = result {
                let mut row = loader::skipped_status(&fp.candidate, reason);
                row.name = fp.info.name.clone();
                row.version = fp.info.version.clone();
                fp.process.shutdown().await;
                self.records.forget(&fp.info.name).await;
                self.skip_of(&fp.candidate, Some(fp.sha256.clone()), row);
                continue;
            }
            tracing::info!(
                plugin = %fp.info.name,
                version = %fp.info.version,
                api_version = %fp.api_version,
                source = ?fp.candidate.source,
                path = %fp.candidate.path.display(),
                pid = ?fp.process.pid(),
                in_process = fp.process.in_process(),
                reattached = fp.process.is_reattached(),
                "plugin loaded"
            );
            self.records.save(&fp).await;
            let plugin = self.insert(fp, stop);
            self.progress.send_modify(|p| p.inserted += 1);
            serving.push(plugin);
        }
        serving
    }

    /// Put a configured plugin in the catalog (its supervisor is started by the caller).
    fn insert(&self, fp: Fingerprinted, stop: &CancellationToken) -> Arc<LoadedPlugin> {
        let plugin = Arc::new(LoadedPlugin::new(
            fp,
            self.changes.clone(),
            stop.child_token(),
        ));
        if let Ok(mut l) = self.loaded.write() {
            l.insert(plugin.name.clone(), plugin.clone());
        }
        self.changes.send_modify(|n| *n += 1);
        plugin
    }

    /// Ask every loaded plugin process to exit and forget their records (drain). The
    /// supervisors must have been stopped first, or they relaunch what this stops.
    pub async fn shutdown_all(&self) {
        let plugins: Vec<_> = self
            .loaded
            .read()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        let mut set = tokio::task::JoinSet::new();
        for p in plugins {
            let records = self.records.clone();
            set.spawn(async move {
                let how = p.process().shutdown().await;
                records.forget(&p.name).await;
                tracing::info!(plugin = %p.name, "plugin stopped ({how})");
            });
        }
        while set.join_next().await.is_some() {}
    }
}

/// Launches under way: each candidate with what obtaining it gave.
type Launches = tokio::task::JoinSet<(Candidate, Result<Fingerprinted, String>)>;

/// Sweep every stray socket an earlier agent left (bounded by `slots`).
async fn sweep_all(strays: Vec<(PathBuf, PathBuf)>, ctx: &LoadContext, slots: &Arc<Semaphore>) {
    let mut sweeping = tokio::task::JoinSet::new();
    for (dir, sock) in strays {
        let (slots, timeout) = (slots.clone(), ctx.timeout);
        sweeping.spawn(async move {
            let _slot = slots.acquire_owned().await;
            sweep(&dir, &sock, timeout).await;
        });
    }
    while sweeping.join_next().await.is_some() {}
}

/// Plugin socket dirs in `socket_dir` (`drover-plugin-*/plugin.sock`, made by the SDK's
/// `serve`) that no serving plugin uses.
fn stray_sockets(socket_dir: &Path, serving: &[Arc<LoadedPlugin>]) -> Vec<(PathBuf, PathBuf)> {
    let in_use: Vec<PathBuf> = serving
        .iter()
        .filter_map(|p| p.process().socket_path())
        .collect();
    let Ok(entries) = std::fs::read_dir(socket_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("drover-plugin-")
        })
        .map(|e| (e.path(), e.path().join("plugin.sock")))
        .filter(|(_, sock)| !in_use.contains(sock))
        .collect()
}

/// Deal with a socket dir no serving plugin uses. Nobody listening: a plugin that died
/// without cleaning up (kill -9), so the dir goes. A plugin answering: a process an
/// earlier agent launched but was killed before recording (or whose record was lost);
/// it lives in our private socket dir and proves to be a plugin over RPC, so it is shut
/// down. One of our uid that cannot be asked (launched with AutoMTLS, whose key went
/// with the record) loses its socket dir instead: an SDK plugin exits by itself once
/// no host is connected and its socket is gone. Anything else is left alone.
async fn sweep(dir: &Path, sock: &Path, timeout: Duration) {
    let (peer, peer_uid) = match tokio::net::UnixStream::connect(sock).await {
        Ok(s) => match s.peer_cred() {
            Ok(c) => (c.pid(), Some(c.uid())),
            Err(_) => (None, None),
        },
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ) =>
        {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "removed a dead plugin's socket dir")
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), "cannot remove a dead plugin's socket dir: {e}")
                }
            }
            return;
        }
        Err(e) => {
            tracing::debug!(socket = %sock.display(), "leaving socket alone: {e}");
            return;
        }
    };
    let Some(pid) = peer.and_then(|p| u32::try_from(p).ok()) else {
        return;
    };
    let Ok(start_time) = drover_plugin_sdk::client::process_start_time(pid) else {
        return;
    };
    let config = drover_plugin_sdk::client::ReattachConfig {
        addr: drover_plugin_sdk::handshake::PluginAddr::Unix(sock.to_owned()),
        pid,
        start_time,
        app_protocol_version: 1,
        path: std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default(),
        tls: None,
        multiplex_grpc: false,
    };
    // Its name is unknown: ask under a name no plugin can have ("?" is outside
    // [a-z0-9_-]) and take the one it answers with; then prove identity under it.
    let name = match PluginProcess::reattach("?", config.clone(), timeout).await {
        Err(drover_plugin_sdk::client::ReattachError::WrongPlugin { found, .. }) => found,
        Ok(_) => return,
        Err(e @ drover_plugin_sdk::client::ReattachError::Identity(_))
            if peer_uid == Some(rustix::process::geteuid().as_raw()) =>
        {
            // It answered the connection but not the question. Only a process of our
            // uid can have bound in our private (0700) socket dir, and nothing serving
            // uses this socket: its socket goes, then the directory if that is empty.
            let removed = std::fs::remove_file(sock).and_then(|()| std::fs::remove_dir(dir));
            match removed {
                Ok(()) => tracing::warn!(
                    pid,
                    socket = %sock.display(),
                    "a stray plugin process an earlier agent launched cannot be asked who \
                     it is ({e}; launched with AutoMTLS, its key went with its lost \
                     record): removed its socket, so that it exits once idle"
                ),
                Err(e) => tracing::warn!(
                    pid,
                    dir = %dir.display(),
                    "cannot remove a stray plugin's socket dir: {e}"
                ),
            }
            return;
        }
        Err(e) => {
            tracing::warn!(pid, socket = %sock.display(), "unknown process on a plugin socket left alone: {e}");
            return;
        }
    };
    match PluginProcess::reattach(name.clone(), config, timeout).await {
        Ok(p) => {
            let how = p.shutdown().await;
            tracing::warn!(
                plugin = %name,
                pid,
                "shut down a stray plugin process an earlier agent launched but never recorded ({how})"
            );
        }
        Err(e) => tracing::warn!(pid, plugin = %name, "stray plugin process left alone: {e}"),
    }
}

/// Does the stored record describe a process of this candidate (same binary, same
/// arguments)? Built-ins share the `drover` binary and differ by arguments.
fn record_matches(rec: &PluginRecord, c: &Candidate) -> bool {
    rec.reattach.path == c.path
        && rec.args.len() == c.args.len()
        && rec
            .args
            .iter()
            .zip(&c.args)
            .all(|(a, b)| std::ffi::OsStr::new(a) == b.as_os_str())
}

/// A fingerprinted process for `c`: the stored one if it can be taken over, otherwise
/// a freshly launched one.
async fn obtain(
    c: &Candidate,
    record: Option<PluginRecord>,
    ctx: &LoadContext,
    records: &Records,
    slots: &Semaphore,
    policy: &loader::Policy,
) -> Result<Fingerprinted, String> {
    if let Some(rec) = record {
        let attempt = {
            // Bounded: a semaphore slot, and `ctx.timeout` per step inside.
            let _slot = slots.acquire().await;
            try_reattach(c, &rec, ctx, records, policy).await
        };
        match attempt {
            Ok(fp) => return Ok(fp),
            Err(reason) => {
                let still_there = drover_plugin_sdk::client::process_start_time(rec.reattach.pid)
                    .is_ok_and(|t| t == rec.reattach.start_time);
                if still_there {
                    tracing::warn!(
                        plugin = %rec.name,
                        pid = rec.reattach.pid,
                        "not reattaching: {reason}; the process still runs and is left alone \
                         (never signalled unless proven to be the plugin); launching a fresh one"
                    );
                } else {
                    tracing::info!(
                        plugin = %rec.name,
                        pid = rec.reattach.pid,
                        "not reattaching: {reason}; launching a fresh process"
                    );
                }
                records.forget(&rec.name).await;
            }
        }
    }
    let fp = launch_checked(c, ctx, records, policy).await?;
    // Recorded as soon as it is identified, not only once it serves: an agent killed in
    // between must still find this process at its next start.
    records.save(&fp).await;
    Ok(fp)
}

/// Take over the process `rec` describes, or say why not. A binary that changed since
/// the process was launched is an upgrade: the old process is shut down (only once its
/// identity is proven) so that a fresh one runs the new code; tasks live in their
/// executors and survive that.
async fn try_reattach(
    c: &Candidate,
    rec: &PluginRecord,
    ctx: &LoadContext,
    records: &Records,
    policy: &loader::Policy,
) -> Result<Fingerprinted, String> {
    let sha = match records.check(c).await {
        Ok(binary) => binary.sha256,
        Err(reason) => {
            // Not supervised by anyone otherwise, and its file may not run any more.
            retire(
                rec,
                ctx.timeout,
                &format!("its binary fails the checks: {reason}"),
            )
            .await;
            return Err(reason);
        }
    };
    if !sha.eq_ignore_ascii_case(&rec.sha256) {
        retire(rec, ctx.timeout, "its binary changed (upgrade)").await;
        return Err(format!(
            "{} changed since pid {} was launched",
            c.path.display(),
            rec.reattach.pid
        ));
    }
    // The pins may have changed since it was launched: a binary that may not run now
    // does not keep running either.
    if let Err(reason) = policy.before_exec(c, &sha) {
        retire(
            rec,
            ctx.timeout,
            &format!("its binary may no longer run: {reason}"),
        )
        .await;
        return Err(reason);
    }
    // So may `plugin_auto_mtls`: a plugin keeps the transport it was launched with, so
    // one that no longer matches the config is replaced, as a binary that changed is.
    let auto_mtls = ctx.auto_mtls(&c.label);
    if auto_mtls != rec.reattach.tls.is_some() {
        let why = if auto_mtls {
            "AutoMTLS is now on for it (plugin_auto_mtls)"
        } else {
            "AutoMTLS is now off for it (plugin_auto_mtls)"
        };
        retire(rec, ctx.timeout, why).await;
        return Err(format!(
            "pid {} was launched with another transport: {why}",
            rec.reattach.pid
        ));
    }
    let process = PluginProcess::reattach(rec.name.clone(), rec.reattach.clone(), ctx.timeout)
        .await
        .map_err(|e| e.to_string())?;
    // Proven to be our plugin: from here on a failure shuts it down (adopt does).
    let fp = loader::adopt(c, process.into(), sha, ctx.timeout, &ctx.accepted).await?;
    tracing::info!(
        plugin = %rec.name,
        pid = rec.reattach.pid,
        "reattached to the running plugin process (not launched again)"
    );
    Ok(fp)
}

/// Shut down the process `rec` describes if, and only if, it proves to be that plugin.
async fn retire(rec: &PluginRecord, timeout: Duration, why: &str) {
    match PluginProcess::reattach(rec.name.clone(), rec.reattach.clone(), timeout).await {
        Ok(p) => {
            tracing::info!(plugin = %rec.name, pid = p.pid(), "shutting down the old plugin process: {why}");
            let how = p.shutdown().await;
            tracing::info!(plugin = %rec.name, pid = p.pid(), "old plugin process stopped ({how})");
        }
        Err(e) => tracing::info!(
            plugin = %rec.name,
            pid = rec.reattach.pid,
            "old plugin process left alone ({why}), as it is not provably ours: {e}"
        ),
    }
}

/// Open and check `c`'s binary, check it against `policy`, and launch and fingerprint
/// exactly the bytes checked (the launcher executes the checked descriptor). Every
/// launch goes through here: the first one, and each relaunch after a crash.
async fn launch_checked(
    c: &Candidate,
    ctx: &LoadContext,
    records: &Records,
    policy: &loader::Policy,
) -> Result<Fingerprinted, String> {
    let binary = records.check(c).await?;
    policy.before_exec(c, &binary.sha256)?;
    let launch = ctx.launch_settings(&c.label);
    loader::fingerprint(
        c,
        &binary,
        ctx.timeout,
        &ctx.socket_dir,
        &ctx.accepted,
        &launch,
    )
    .await
}

/// Validate and apply the plugin's configuration.
async fn configure(
    fp: &Fingerprinted,
    settings: &crate::config::PluginSettings,
    ctx: &LoadContext,
    policy: &loader::Policy,
) -> Result<(), String> {
    policy.before_serve(&fp.info.name, fp.candidate.source, &fp.sha256)?;
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
/// with backoff whenever it dies. An instance replaced by an upgrade is not relaunched:
/// the supervisor follows the new one. Ends when the plugin's `stop` fires.
async fn supervise(
    plugin: Arc<LoadedPlugin>,
    ctx: Arc<LoadContext>,
    records: Arc<Records>,
    policy: Arc<loader::Policy>,
) {
    let stop = plugin.stop.clone();
    let mut generation = plugin.generation();
    let mut backoff = RELAUNCH_BACKOFF.0;
    loop {
        let seen = *generation.borrow_and_update();
        let process = plugin.process();
        let watcher = tokio::spawn(watch_fingerprints(plugin.clone(), process.client()));
        let launched = Instant::now();
        let mut how = tokio::select! {
            biased;
            () = stop.cancelled() => {
                watcher.abort();
                return;
            }
            changed = generation.changed() => {
                watcher.abort();
                if changed.is_err() {
                    return;
                }
                // Replaced (an upgrade): follow the new instance.
                continue;
            }
            how = process.exited() => how.to_string(),
        };
        watcher.abort();
        if *plugin.generation.borrow() != seen {
            // Replaced meanwhile: this exit is the old instance being shut down.
            continue;
        }
        if plugin.on_probation(seen) {
            // An upgrade's new instance died during its hand-over: the upgrade rolls
            // back to the old instance (a generation change); relaunching the file
            // that just failed would end the probation instead.
            tracing::warn!(plugin = %plugin.name, pid = ?process.pid(), "plugin process exited during its hand-over ({how})");
            tokio::select! {
                () = stop.cancelled() => return,
                _ = generation.changed() => {}
            }
            continue;
        }
        if launched.elapsed() > STABLE_AFTER {
            backoff = RELAUNCH_BACKOFF.0;
        }
        tracing::warn!(plugin = %plugin.name, pid = ?process.pid(), "plugin process exited ({how})");
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
            match relaunch(&plugin, seen, &ctx, &records, &policy).await {
                Ok(()) => break,
                Err(reason) => how = reason,
            }
        }
    }
}

/// Launch the plugin's file again after its instance of generation `seen` died. An
/// instance installed meanwhile (an upgrade) wins: the relaunched one is shut down.
async fn relaunch(
    plugin: &LoadedPlugin,
    seen: u64,
    ctx: &LoadContext,
    records: &Records,
    policy: &loader::Policy,
) -> Result<(), String> {
    let candidate = plugin.candidate();
    let fp = launch_checked(&candidate, ctx, records, policy).await?;
    if fp.info.name != plugin.name {
        let got = fp.info.name.clone();
        fp.process.shutdown().await;
        return Err(format!("relaunched binary now calls itself {got:?}"));
    }
    if let Err(reason) = configure(&fp, &ctx.settings(&plugin.name), ctx, policy).await {
        fp.process.shutdown().await;
        return Err(reason);
    }
    let _swap = plugin.swap.lock().await;
    if *plugin.generation.borrow() != seen {
        tracing::info!(plugin = %plugin.name, pid = ?fp.process.pid(), "relaunched instance not needed: the plugin was replaced meanwhile");
        fp.process.shutdown().await;
        return Ok(());
    }
    tracing::info!(plugin = %plugin.name, pid = ?fp.process.pid(), "plugin relaunched");
    records.save(&fp).await;
    let mut live = plugin.live();
    let retiring = live.retiring.take();
    *live = live_from(fp);
    live.retiring = retiring;
    drop(live);
    plugin.generation.send_modify(|g| *g += 1);
    Ok(())
}

async fn watch_fingerprints(plugin: Arc<LoadedPlugin>, client: PluginClient) {
    let mut stream = match client.fingerprint().await {
        Ok(s) => Box::pin(s),
        Err(e) => {
            plugin.live().attributes.clear();
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
                    // Undetected, and whatever a newer SDK may add: not usable.
                    _ => PluginState::Undetected,
                };
                plugin.set_attributes(fp.attributes);
                plugin.set_state(state, fp.description);
            }
            Err(e) => {
                plugin.live().attributes.clear();
                plugin.set_state(
                    PluginState::Unhealthy,
                    format!("fingerprint stream failed: {e}"),
                );
                return;
            }
        }
    }
}
