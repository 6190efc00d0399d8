//! The plugin catalog, the registry of the plugin lifecycle: which plugin serves
//! which name, its live state, the status rows of the files that do not serve, and
//! the plugin records in the state store.
//!
//! Plugin processes outlive the agent. Each one the catalog serves has a
//! [`PluginRecord`] in the state store, so that the next agent takes it over again
//! instead of launching a second one. The catalog is filled at start by
//! [`Catalog::load`] (in `recover.rs`) and changed while the agent runs by
//! [`Catalog::reload`] (in `reload.rs`); `supervise.rs` keeps each plugin's instance
//! running. What the catalog needs from the task manager, to hand a driver's tasks to
//! a new instance, is the [`TaskHandover`] seam.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use drover_api::{PluginKind, PluginState, PluginStatus};
use drover_plugin_sdk::client::PluginClient;
use drover_plugin_sdk::{AgentInfo, Capabilities};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::candidate::{Builtin, Candidate};
use super::instance::PluginInstance;
use super::loader::{self, Fingerprinted};
use super::trust;
use crate::config::AgentConfig;
use crate::state::{MemStore, PluginRecord, StateError, StateStore};

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
    /// What Nomad task drivers in plugin_dir need (their log FIFOs' directory, the log
    /// relay program); `None`: only Drover plugins load.
    pub nomad: Option<drover_plugin_sdk::client::NomadHostOptions>,
}

impl LoadContext {
    /// Settings of plugin `name` (defaults when not configured).
    pub fn settings(&self, name: &str) -> crate::config::PluginSettings {
        self.settings.get(name).cloned().unwrap_or_default()
    }

    /// How the plugin labelled `label` is launched: its environment, its transport.
    /// The docker driver also gets the docker client's variables
    /// ([`crate::config::DOCKER_CLIENT_ENV`]) the agent has.
    pub fn launch_settings(&self, label: &str) -> loader::LaunchSettings {
        let settings = self.settings.get(label);
        let docker_env = crate::config::DOCKER_CLIENT_ENV
            .iter()
            .filter(|_| crate::config::DOCKER_PLUGIN_LABELS.contains(&label))
            .map(|n| (*n).to_owned())
            .collect::<Vec<String>>();
        loader::LaunchSettings::new(
            self.plugin_pass_env
                .iter()
                .chain(&docker_env)
                .chain(settings.into_iter().flat_map(|s| s.pass_env.iter())),
            settings.into_iter().flat_map(|s| s.env.iter()),
        )
        .with_auto_mtls(self.auto_mtls(label))
        .with_nomad(self.nomad.clone())
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

pub(super) struct Live {
    /// A task driver or a device plugin.
    pub(super) kind: PluginKind,
    /// A device plugin's device groups, from its last fingerprint (empty until the
    /// first, and after a failed one).
    pub(super) devices: Vec<drover_plugin_sdk::device::DeviceGroup>,
    /// The file (and arguments) the instance runs: replaced by an upgrade.
    pub(super) candidate: Candidate,
    /// sha256 of the bytes the instance runs.
    pub(super) sha256: String,
    pub(super) process: PluginInstance,
    pub(super) reattached: bool,
    pub(super) version: String,
    pub(super) api_version: String,
    pub(super) task_schema: super::loader::Schema,
    pub(super) capabilities: Capabilities,
    pub(super) state: PluginState,
    pub(super) reason: String,
    /// Attributes of the last fingerprint (`driver.<name>.<key>`), for the node's
    /// registration with the cluster servers.
    pub(super) attributes: BTreeMap<String, String>,
    /// The file whose attempt to replace this instance failed, and why (the instance
    /// keeps serving); cleared once that file is gone or something replaces this.
    pub(super) upgrade_failed: Option<(PathBuf, String)>,
    /// Set once its file is gone: why it takes no new tasks.
    pub(super) retiring: Option<String>,
}

/// One loaded plugin. Its process may be replaced by the supervisor; callers take a
/// fresh [`LoadedPlugin::client`] for each call.
pub struct LoadedPlugin {
    /// The plugin's name.
    pub name: String,
    pub(super) live: Mutex<Live>,
    pub(super) generation: watch::Sender<u64>,
    /// Held while the instance is being replaced (relaunch after a crash, upgrade), so
    /// that two replacements never race.
    pub(super) swap: tokio::sync::Mutex<()>,
    /// The generation of an instance that replaced the previous one in a hand-over
    /// still in progress (0: none): a task it refuses rolls the hand-over back.
    pub(super) probation: std::sync::atomic::AtomicU64,
    /// Stops this plugin's supervisor (its plugin left the catalog, or the agent stops).
    pub(super) stop: CancellationToken,
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
    pub(super) fn candidate(&self) -> Candidate {
        self.live().candidate.clone()
    }

    /// Why the plugin takes no new tasks (its file was removed); `None` normally.
    pub fn retiring(&self) -> Option<String> {
        self.live().retiring.clone()
    }

    /// Note on the serving row that replacing it with `file` failed, and why.
    pub(super) fn set_upgrade_failed(&self, failed: Option<(PathBuf, String)>) {
        let mut live = self.live();
        if live.upgrade_failed != failed {
            live.upgrade_failed = failed;
            drop(live);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Mark the plugin as taking no new tasks, and why.
    pub(super) fn set_retiring(&self, why: String) {
        self.live().retiring = Some(why);
        self.changes.send_modify(|n| *n += 1);
    }

    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, Live> {
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

    /// The JSON Schema of the task config, compiled.
    pub fn task_schema(&self) -> super::loader::Schema {
        self.live().task_schema.clone()
    }

    /// Whether the current instance speaks Drover's driver protocol (a Nomad driver
    /// finds a task again only with the handle it gave).
    pub fn speaks_drover(&self) -> bool {
        self.live().process.protocol() == drover_api::PluginProtocol::Drover
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

    /// A task driver or a device plugin.
    pub fn kind(&self) -> PluginKind {
        self.live().kind
    }

    /// A device plugin's device groups, from its last fingerprint.
    pub fn devices(&self) -> Vec<drover_plugin_sdk::device::DeviceGroup> {
        self.live().devices.clone()
    }

    pub(super) fn set_devices(&self, devices: Vec<drover_plugin_sdk::device::DeviceGroup>) {
        let mut live = self.live();
        if live.devices != devices {
            live.devices = devices;
            drop(live);
            self.changes.send_modify(|n| *n += 1);
        }
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

    pub(super) fn set_state(&self, state: PluginState, reason: String) {
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

    pub(super) fn set_attributes(&self, attributes: BTreeMap<String, String>) {
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
            kind: live.kind,
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
            protocol: live.process.protocol(),
        }
    }

    pub(super) fn process(&self) -> PluginInstance {
        self.live().process.clone()
    }
}

pub(super) fn live_from(fp: Fingerprinted) -> Live {
    Live {
        kind: fp.kind,
        devices: Vec::new(),
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
pub(super) struct Records {
    pub(super) store: Arc<dyn StateStore>,
    /// sha256 by path, valid while the file's identity ([`trust::FileKey`], taken on
    /// the open descriptor) is unchanged: the `drover` binary serves every built-in and
    /// is tens of MB.
    hashes: Mutex<HashMap<PathBuf, (trust::FileKey, String)>>,
    /// One lock per path, held while hashing it, so that the built-ins, launched
    /// together from one binary, hash it once and the others find it in `hashes`.
    hashing: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Records {
    /// Open and check `c`'s binary ([`trust::open_checked`]) and hash the bytes behind
    /// the descriptor, off the async thread.
    pub(super) async fn check(&self, c: &Candidate) -> Result<trust::Binary, String> {
        let cand = c.clone();
        let (fd, key) = tokio::task::spawn_blocking(move || trust::open_checked(&cand))
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
                let h = tokio::task::spawn_blocking(move || trust::sha256_fd(&hashed))
                    .await
                    .map_err(|e| format!("hashing {}: {e}", c.path.display()))?
                    .map_err(|e| format!("cannot hash {}: {e}", c.path.display()))?;
                lock(&self.hashes).insert(c.path.clone(), (key, h.clone()));
                h
            }
        };
        Ok(trust::Binary { fd, sha256 })
    }

    /// The sha256 the last check of `path` found, if it was hashed.
    pub(super) fn cached_sha(&self, path: &Path) -> Option<String> {
        lock(&self.hashes).get(path).map(|(_, h)| h.clone())
    }

    /// Remember a serving plugin process so the next agent can reattach to it.
    pub(super) async fn save(&self, fp: &Fingerprinted) {
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
    pub(super) async fn save_live(&self, name: &str, live: &Live) {
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

    pub(super) async fn forget(&self, name: &str) {
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

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How far initial loading got: plugins inserted so far, and whether it finished.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Progress {
    pub(super) inserted: u64,
    pub(super) done: bool,
}

/// A candidate that does not serve, with its status row. The file's sha256 (when it
/// was hashed) tells a reload whether the file changed since.
#[derive(Debug, Clone)]
pub(super) struct Skipped {
    /// The file (and arguments) the row is about, as it would be launched.
    pub(super) candidate: Candidate,
    pub(super) sha256: Option<String>,
    pub(super) row: PluginStatus,
    /// It works, but another file serves its name (not worth trying again unless
    /// something changes); otherwise it failed, and `drover plugin reload` retries it.
    pub(super) lost: bool,
}

impl Skipped {
    /// The row of a file refused before it was hashed (by the scan, or the allow and
    /// deny lists): the candidate is what the row names.
    pub(super) fn refused(row: PluginStatus) -> Self {
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
    pub(super) fn is_of(&self, c: &Candidate) -> bool {
        self.candidate.path == c.path && self.candidate.args == c.args
    }
}

/// Where a hand-over stands, from [`TaskHandover::handover_progress`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandoverProgress {
    /// Tasks of the driver that are not dead.
    pub tasks: usize,
    /// How many of them are still attached to an older instance.
    pub behind: usize,
    /// The first task the instance on probation refused, and its answer.
    pub refused: Option<(String, String)>,
}

/// What the catalog needs from whoever runs tasks (the task manager), so that it can
/// hand a driver's tasks to a new instance without knowing the task manager's types.
/// Installed at wiring with [`Catalog::set_handover`].
pub trait TaskHandover: Send + Sync {
    /// Tasks of `driver` that are not dead, how many of them are still attached to an
    /// instance older than `generation`, and which one the instance of `generation`
    /// refused (see [`crate::tasks::TaskDriver::on_probation`]).
    fn handover_progress(&self, driver: &str, generation: u64) -> HandoverProgress;
    /// The ids and handles of `driver`'s live tasks that have a handle, for a new
    /// instance to prove with `RecoverTask` that it can take them before it serves.
    fn live_handles(&self, driver: &str) -> Vec<(String, drover_plugin_sdk::TaskHandle)>;
    /// Sees a change whenever a task attaches to a driver instance or ends.
    fn attachments(&self) -> watch::Receiver<u64>;
}

/// What a reload needs, kept from [`Catalog::load`].
pub(super) struct ReloadEnv {
    pub(super) plugin_dir: PathBuf,
    pub(super) prefer_builtin: bool,
    pub(super) builtins: Vec<Builtin>,
    pub(super) ctx: Arc<LoadContext>,
    pub(super) policy: Arc<trust::Policy>,
    /// Parent of every plugin's supervisor token.
    pub(super) stop: CancellationToken,
}

/// All plugins: loaded ones by name, and rows for every binary that was skipped.
pub struct Catalog {
    pub(super) loaded: RwLock<BTreeMap<String, Arc<LoadedPlugin>>>,
    pub(super) skipped: RwLock<Vec<Skipped>>,
    pub(super) records: Arc<Records>,
    /// What a reload needs, set by [`Catalog::load`].
    pub(super) reload_env: Mutex<Option<Arc<ReloadEnv>>>,
    /// One reload at a time (the watcher's and `drover plugin reload`'s).
    pub(super) reloading: tokio::sync::Mutex<()>,
    /// Who moves tasks between instances of a driver (the task manager), installed at
    /// wiring; without one an upgrade does not wait for the tasks to move.
    pub(super) handover: RwLock<Option<std::sync::Weak<dyn TaskHandover>>>,
    pub(super) progress: watch::Sender<Progress>,
    /// Bumped when any loaded driver's state, reason or attributes change, or a
    /// driver is loaded: the cluster client registers again at once.
    pub(super) changes: Arc<watch::Sender<u64>>,
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

    /// The plugin a task's `driver` names: the plugin of that name, else the one of
    /// the name it is an older spelling of (`rawexec` → `raw_exec`, see
    /// [`drover_api::DRIVER_ALIASES`]). For user-given names only: the catalog's own
    /// bookkeeping (reload, upgrades) goes by exact names through [`Catalog::get`].
    pub fn driver_named(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        // The driver's current name first: a plugin reporting an older name must not
        // take the tasks of the driver that carries it now.
        self.get(drover_api::canonical_driver_name(name))
            .or_else(|| self.get(name))
            .filter(|p| p.kind() == PluginKind::Driver)
    }

    /// The loaded device plugins.
    pub fn device_plugins(&self) -> Vec<Arc<LoadedPlugin>> {
        self.loaded
            .read()
            .map(|l| {
                l.values()
                    .filter(|p| p.kind() == PluginKind::Device)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
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
    pub(super) fn skip(&self, row: PluginStatus) {
        self.push_skipped(Skipped::refused(row));
    }

    /// Skip candidate `c`, whose bytes hash to `sha256` (`None`: what the last check
    /// of its file found, if any).
    pub(super) fn skip_of(&self, c: &Candidate, sha256: Option<String>, row: PluginStatus) {
        let sha256 = sha256.or_else(|| self.records.cached_sha(&c.path));
        self.push_skipped(Skipped {
            candidate: c.clone(),
            sha256,
            row,
            lost: false,
        });
    }

    /// Skip candidate `c`, which works but lost its name to another file.
    pub(super) fn skip_lost(&self, c: &Candidate, sha256: String, row: PluginStatus) {
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

    pub(super) fn set_reload_env(
        &self,
        config: &AgentConfig,
        builtins: &[Builtin],
        ctx: &Arc<LoadContext>,
        policy: &Arc<trust::Policy>,
        stop: &CancellationToken,
    ) {
        *lock(&self.reload_env) = Some(Arc::new(ReloadEnv {
            plugin_dir: config.plugin_dir(),
            prefer_builtin: config.prefer_builtin,
            builtins: builtins.to_vec(),
            ctx: ctx.clone(),
            policy: policy.clone(),
            stop: stop.clone(),
        }));
    }

    /// Put a configured plugin in the catalog (its supervisor is started by the caller).
    pub(super) fn insert(&self, fp: Fingerprinted, stop: &CancellationToken) -> Arc<LoadedPlugin> {
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
