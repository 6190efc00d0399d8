//! Tasks: validate, start through the right driver, watch, restart by policy, survive
//! agent and plugin restarts, stop.
//!
//! Every task has a record in the [`StateStore`], written before the call that changed
//! it returns: the pending record (with its spec) before `StartTask` is sent, the handle
//! as soon as `StartTask` answered, then every state change and event (a `Recovered`
//! event that changes nothing else is written with the task's next change, so that
//! recovery costs no disk commit per task). On agent start,
//! [`TaskManager::load`] reads the records back and [`TaskManager::recover`] hands every
//! live task back to its driver (`RecoverTask`), so that nothing is started twice and
//! every exit that happened meanwhile is reported with its real result.
//!
//! One runner (`runner.rs`) per live task owns its lifecycle: wait for the exit, apply
//! the restart policy (`restart.rs`, a pure function), start the next incarnation
//! through the lifecycle hooks (`hooks.rs`), and reattach when the driver's process is
//! replaced.

mod driver;
mod driver_events;
mod hooks;
pub(crate) use hooks::create_task_dir;
mod record;
pub mod restart;
mod runner;
mod store;
#[cfg(test)]
mod tests;
mod validate;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use drover_api::{
    RecoverySummary, RunRequest, TaskEventKind, TaskEventView, TaskLifecycle, TaskView,
};
use drover_plugin_sdk::{DriverError, TaskHandle, TaskSpec, TaskStats};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio_util::sync::CancellationToken;

pub use driver::{Drivers, TaskDriver};

use crate::plugins::catalog::{Catalog, HandoverProgress};
use crate::state::{StateError, StateStore};
use drover_api::PluginState;
use hooks::TaskHook;
use record::{KillRequest, RECORD_VERSION, TaskRecord};
use restart::human;
use runner::{Outcome, Phase, Runner};
use store::Records;
use validate::{Settings, limits};

pub use drover_api::MAX_KILL_TIMEOUT;
/// Default time between the stop signal and SIGKILL.
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// Events kept per task; older ones are dropped and counted in
/// [`TaskView::events_dropped`](drover_api::TaskView::events_dropped).
pub const MAX_EVENTS: usize = 100;
/// Bound on every driver call made while cleaning up, so that a stuck plugin gives a
/// task event instead of a hang.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on `RecoverTask`: longer than the plugin's own waits inside it (rawexec waits
/// up to 30 s for a start of the same task in flight, the executor client 20 s for an
/// executor that is starting), so that a slow answer is not mistaken for a lost task.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(45);
/// Bound on `StartTask`: longer than an executor may take to report its start-up
/// (20 s). A start that times out may have started the task: it is probed by id.
const START_TIMEOUT: Duration = Duration::from_secs(45);
/// Recoveries in flight at once: enough to hand 1000 tasks back within a second or
/// two, few enough not to flood one plugin.
const RECOVERY_CONCURRENCY: usize = 32;

/// The name suffix of a start intent's replacement before it is renamed into place
/// (see [`TaskManager::replace_start_intent`]).
const INTENT_REPLACEMENT: &str = "+new";

/// The name suffix a whole start intent this agent cannot read is kept under when the
/// task's record exists (see [`TaskManager::adopt_start_intents`]).
const INTENT_UNREADABLE: &str = "+unreadable";

/// The name suffix of an empty file that asks the next agent to stop a task (see
/// [`TaskManager::stop_unrecorded`]): written when neither the task's record nor its
/// start intent could be, on a full disk, where an empty file still fits.
const INTENT_STOP: &str = "+stop";

/// The directory of start intents, beside the alloc dir (see
/// [`TaskManager::write_start_intent`]).
const STARTING_DIR: &str = "starting";
/// How long `stop` waits for the exit once the driver acted, beyond the kill timeout.
const STOP_GRACE: Duration = Duration::from_secs(10);

fn now() -> String {
    rfc3339(SystemTime::now())
}

fn rfc3339(t: SystemTime) -> String {
    // RFC 3339 ends with year 9999 (formatting a later time panics): clamp.
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_micros(t.min(last)).to_string()
}

/// What [`TaskManager::run_with`] takes beside the request.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The task id (default: a fresh UUID). Chosen by the caller when it must record
    /// the id before the task exists, so that a crash between the two cannot start
    /// the task twice: it asks for that id again, and is told whether it exists.
    pub id: Option<String>,
    /// The allocation's shared directory ([`TaskSpec::alloc_dir`]).
    pub alloc_dir: Option<PathBuf>,
    /// The group's network namespace the task joins (a group in bridge mode,
    /// [`TaskSpec::netns_path`]); only a driver offering the `group` network mode can.
    pub netns: Option<PathBuf>,

    /// The allocation's ports on the node ([`TaskSpec::ports`]).
    pub ports: Vec<drover_plugin_sdk::TaskPort>,
    /// The host volumes the task mounts ([`TaskSpec::volumes`]); only a driver that
    /// isolates the filesystem can.
    pub volumes: Vec<drover_plugin_sdk::TaskVolume>,
    /// Device nodes a device plugin's reservation gives the task
    /// ([`TaskSpec::devices`]).
    pub devices: Vec<drover_plugin_sdk::TaskDevice>,
    /// Host paths a device plugin's reservation mounts into the task
    /// ([`TaskSpec::mounts`]).
    pub device_mounts: Vec<drover_plugin_sdk::TaskMount>,
}

/// One task: its record and what coordinates the runner with user calls.
pub(crate) struct Task {
    id: String,
    driver: String,
    settings: Settings,
    rec: Mutex<TaskRecord>,
    /// Serialises store writes, so that an older snapshot never overwrites a newer one.
    persist_lock: tokio::sync::Mutex<()>,
    /// Serialises driver lifecycle calls (start, recover, stop, destroy) of this task,
    /// so that a stop never slips between a start and the handle being known.
    ops: tokio::sync::Mutex<()>,
    /// Fired once a user asked the task to stop: cancels a pending restart.
    kill: CancellationToken,
    dead: watch::Sender<bool>,
    /// The current driver process knows the running incarnation.
    attached: AtomicBool,
    /// The driver generation it was last attached on (meaningful while `attached`):
    /// a hand-over to a new plugin instance waits until no task is behind.
    attached_on: AtomicU64,
    /// Destroyed: the record is gone and must not be written again.
    destroyed: AtomicBool,
    /// The driver generation that refused to take the task over during a hand-over,
    /// and why: the hand-over is rolled back instead of the task being lost.
    refused: Mutex<Option<(u64, String)>>,
    /// Why the agent asked for a restart of the running incarnation (a failing
    /// check's `check_restart`): its exit restarts it at once, whatever the restart
    /// policy says.
    restart_wanted: Mutex<Option<String>>,
}

impl Task {
    fn new(rec: TaskRecord, settings: Settings) -> Task {
        let kill = CancellationToken::new();
        if rec.kill.is_some() {
            kill.cancel();
        }
        Task {
            id: rec.view.id.clone(),
            driver: rec.view.driver.clone(),
            settings,
            dead: watch::channel(rec.view.state == TaskLifecycle::Dead).0,
            rec: Mutex::new(rec),
            persist_lock: tokio::sync::Mutex::new(()),
            ops: tokio::sync::Mutex::new(()),
            kill,
            attached: AtomicBool::new(false),
            attached_on: AtomicU64::new(0),
            destroyed: AtomicBool::new(false),
            refused: Mutex::new(None),
            restart_wanted: Mutex::new(None),
        }
    }

    /// Take the reason of a restart the agent asked for, if any.
    pub(crate) fn take_restart_wanted(&self) -> Option<String> {
        self.restart_wanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn rec(&self) -> std::sync::MutexGuard<'_, TaskRecord> {
        // Fields are assigned whole under this lock; a panic cannot leave one half-set.
        self.rec
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Put `kill` in the record unless it asks for a stop already (the first stop
    /// wins); whether it was put.
    fn record_kill(&self, kill: KillRequest) -> bool {
        let mut rec = self.rec();
        if rec.kill.is_some() {
            return false;
        }
        rec.kill = Some(kill);
        true
    }

    /// The stop of a user's stop without a signal of its own: the task's
    /// `kill_signal`, then SIGKILL after its `kill_timeout`.
    fn default_kill(&self) -> KillRequest {
        KillRequest {
            signal: self.settings.kill_signal.clone(),
            timeout: self.settings.kill_timeout,
        }
    }

    fn view(&self) -> TaskView {
        self.rec().view.clone()
    }

    fn state(&self) -> TaskLifecycle {
        self.rec().view.state
    }

    fn is_dead(&self) -> bool {
        self.state() == TaskLifecycle::Dead
    }

    fn event(&self, kind: TaskEventKind, message: impl Into<String>) {
        let message = message.into();
        tracing::info!(task = %self.id, event = kind.as_str(), "{message}");
        let mut rec = self.rec();
        let v = &mut rec.view;
        v.events.push(TaskEventView {
            time: now(),
            kind,
            message,
        });
        if v.events.len() > MAX_EVENTS {
            let extra = v.events.len() - MAX_EVENTS;
            v.events.drain(..extra);
            v.events_dropped += extra as u64;
        }
    }

    /// A `DriverFailure` event, unless it would repeat the last event word for word
    /// (a driver that stays away is polled, and must not flood the event list).
    fn failure(&self, message: String) {
        let repeated = self
            .rec()
            .view
            .events
            .last()
            .is_some_and(|e| e.kind == TaskEventKind::DriverFailure && e.message == message);
        if !repeated {
            self.event(TaskEventKind::DriverFailure, message);
        }
    }

    /// Write the record; durable when this returns.
    async fn persist(&self, store: &Records) -> Result<(), StateError> {
        self.write_record(store, true).await
    }

    /// Write the record when the store next commits, without waiting for it (see
    /// [`Records::put_task`] for when that is enough).
    async fn persist_lazily(&self, store: &Records) -> Result<(), StateError> {
        self.write_record(store, false).await
    }

    async fn write_record(&self, store: &Records, durable: bool) -> Result<(), StateError> {
        self.write_bytes(store, None, durable).await
    }

    /// [`Task::persist`] of `bytes`, the record encoded by the caller a moment ago
    /// (nothing changed it since).
    async fn persist_encoded(&self, store: &Records, bytes: Vec<u8>) -> Result<(), StateError> {
        self.write_bytes(store, Some(bytes), true).await
    }

    async fn write_bytes(
        &self,
        store: &Records,
        bytes: Option<Vec<u8>>,
        durable: bool,
    ) -> Result<(), StateError> {
        let _order = self.persist_lock.lock().await;
        if self.destroyed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let bytes = match bytes {
            Some(b) => b,
            None => self.rec().encode()?,
        };
        let written = store.put_task(self.id.clone(), bytes, durable).await;
        // Nobody listening is fine.
        let _ = store.changes.send(self.id.clone());
        written
    }

    /// [`Task::persist`] where nobody can be told: log a failure.
    async fn save(&self, store: &Records) {
        if let Err(e) = self.persist(store).await {
            tracing::error!(task = %self.id, "cannot record the task's state: {e}");
        }
    }

    /// Mark destroyed and delete the record.
    async fn forget(&self, store: &Records) -> Result<(), StateError> {
        let _order = self.persist_lock.lock().await;
        self.destroyed.store(true, Ordering::SeqCst);
        let deleted = store.delete_task(self.id.clone()).await;
        let _ = store.changes.send(self.id.clone());
        deleted
    }
}

/// Runs tasks through drivers, keeps their records, restarts and recovers them.
pub struct TaskManager {
    drivers: Arc<dyn Drivers>,
    store: Records,
    alloc_dir: PathBuf,
    hooks: Vec<Box<dyn TaskHook>>,
    tasks: RwLock<HashMap<String, Arc<Task>>>,
    recovery_slots: Arc<Semaphore>,
    recovered: AtomicBool,
    /// Set once start-up recovery finished (`None` until then), for the health API.
    recovery: std::sync::Mutex<Option<RecoverySummary>>,
    /// [`RPC_TIMEOUT`]; shorter in tests.
    rpc_timeout: Duration,
    /// [`RECOVER_TIMEOUT`]; shorter in tests.
    recover_timeout: Duration,
    /// [`START_TIMEOUT`]; shorter in tests.
    start_timeout: Duration,
    /// Drivers whose task events are followed (`driver_events`).
    event_watchers: Mutex<HashSet<String>>,
    /// Bumped whenever a task attaches to a driver instance or ends, for a plugin
    /// hand-over waiting on [`TaskManager::handover_progress`].
    attachments: watch::Sender<u64>,
    /// Where a start writes its task's pending record before `StartTask` while the
    /// store writes it durably (see [`TaskManager::run`]): `<data_dir>/starting`.
    starting_dir: PathBuf,
}

impl TaskManager {
    /// A manager running tasks through the catalog's drivers, with task directories
    /// under `alloc_dir` and records in `store`. It starts empty: call
    /// [`TaskManager::load`] to read the stored tasks back.
    pub fn new(catalog: Arc<Catalog>, alloc_dir: PathBuf, store: Arc<dyn StateStore>) -> Self {
        Self::with_drivers(catalog, alloc_dir, store)
    }

    /// Like [`TaskManager::new`] with any source of drivers (tests use a fake).
    pub fn with_drivers(
        drivers: Arc<dyn Drivers>,
        alloc_dir: PathBuf,
        store: Arc<dyn StateStore>,
    ) -> Self {
        TaskManager {
            drivers,
            store: Records::new(store),
            hooks: hooks::default_hooks(),
            tasks: RwLock::new(HashMap::new()),
            recovery_slots: Arc::new(Semaphore::new(RECOVERY_CONCURRENCY)),
            recovered: AtomicBool::new(false),
            recovery: std::sync::Mutex::new(None),
            rpc_timeout: RPC_TIMEOUT,
            recover_timeout: RECOVER_TIMEOUT,
            start_timeout: START_TIMEOUT,
            event_watchers: Mutex::new(HashSet::new()),
            attachments: watch::channel(0).0,
            starting_dir: alloc_dir.with_file_name(STARTING_DIR),
            alloc_dir,
        }
    }

    /// The driver instance of `generation` knows `task`'s running incarnation now.
    fn attached(&self, task: &Task, generation: u64) {
        task.attached_on.store(generation, Ordering::SeqCst);
        task.attached.store(true, Ordering::SeqCst);
        self.attachments.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// `task` is dead (or gone): a hand-over or a retiring driver waits no more for it.
    fn ended(&self, task: &Task) {
        task.dead.send_replace(true);
        self.attachments.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A driver instance on probation (a hand-over in progress) of `generation` refused
    /// `task`: the catalog rolls the hand-over back rather than lose the task.
    fn refused_by(&self, task: &Task, generation: u64, why: String) {
        *task
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((generation, why));
        self.attachments.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Tasks of `driver` that are not dead, how many of them are still attached to a
    /// driver instance older than `generation` (the catalog's hand-over waits until
    /// none is), and the first one the instance of `generation` refused.
    pub fn handover_progress(&self, driver: &str, generation: u64) -> HandoverProgress {
        let mut progress = HandoverProgress::default();
        let Ok(tasks) = self.tasks.read() else {
            return progress;
        };
        let live = tasks
            .values()
            .filter(|t| driven_by(&t.driver, driver) && !t.is_dead());
        for t in live {
            progress.tasks += 1;
            if t.attached.load(Ordering::SeqCst)
                && t.attached_on.load(Ordering::SeqCst) < generation
            {
                progress.behind += 1;
            }
            let refused = t
                .refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            if let Some((g, why)) = refused
                && g == generation
                && progress.refused.is_none()
            {
                progress.refused = Some((t.id.clone(), why));
            }
        }
        progress
    }

    /// The handles of `driver`'s live tasks that have one (a task whose `StartTask` is
    /// still in flight has none yet), for a new instance to prove it can take them.
    pub fn live_handles(&self, driver: &str) -> Vec<(String, TaskHandle)> {
        let Ok(tasks) = self.tasks.read() else {
            return Vec::new();
        };
        tasks
            .values()
            .filter(|t| driven_by(&t.driver, driver) && !t.is_dead())
            .filter_map(|t| t.rec().handle.clone().map(|h| (t.id.clone(), h)))
            .collect()
    }

    /// Sees a change whenever a task attaches to a driver instance or ends.
    pub fn attachments(&self) -> watch::Receiver<u64> {
        self.attachments.subscribe()
    }

    /// Read every stored task into memory, without talking to any driver, so that the
    /// API shows them at once. A record this agent cannot read is an error naming the
    /// task: the agent must refuse to start rather than guess. Returns how many.
    pub fn load(&self) -> Result<usize, StateError> {
        let records = self.store.store.tasks()?;
        let mut loaded = HashMap::new();
        for (id, bytes) in records {
            let rec = TaskRecord::decode(&id, &bytes)?;
            let task = loaded_task(rec, || format!("read task record {id}"))?;
            loaded.insert(id, task);
        }
        self.adopt_start_intents(&mut loaded)?;
        let n = loaded.len();
        if let Ok(mut t) = self.tasks.write() {
            t.extend(loaded);
        }
        tracing::info!(tasks = n, "task records loaded");
        Ok(n)
    }

    /// Hand every pending or running task back to its driver (call once plugin loading
    /// has finished). Returns when each of them is recovered, started (it never was),
    /// dead, or parked until its driver comes back; the runners go on from there. Only
    /// the first call does anything.
    pub async fn recover(self: &Arc<Self>) -> RecoverySummary {
        if self.recovered.swap(true, Ordering::SeqCst) {
            return RecoverySummary::default();
        }
        let started = Instant::now();
        let live: Vec<Arc<Task>> = self
            .tasks
            .read()
            .map(|t| t.values().filter(|t| !t.is_dead()).cloned().collect())
            .unwrap_or_default();
        let mut summary = RecoverySummary {
            tasks: live.len(),
            ..Default::default()
        };
        let mut outcomes = Vec::with_capacity(live.len());
        for task in live {
            let (tx, rx) = oneshot::channel();
            outcomes.push(rx);
            tokio::spawn(Runner::new(self.clone(), task, Some(tx)).run(Phase::Recover));
        }
        for rx in outcomes {
            match rx.await {
                Ok(Outcome::Recovered) => summary.recovered += 1,
                Ok(Outcome::Started) => summary.started += 1,
                Ok(Outcome::Dead) | Err(_) => summary.dead += 1,
                Ok(Outcome::Waiting) => summary.waiting += 1,
            }
        }
        summary.elapsed = started.elapsed();
        tracing::info!(
            tasks = summary.tasks,
            recovered = summary.recovered,
            started = summary.started,
            dead = summary.dead,
            waiting = summary.waiting,
            elapsed_ms = summary.elapsed.as_millis() as u64,
            "task recovery finished"
        );
        *self
            .recovery
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(summary.clone());
        summary
    }

    /// Destroy task `id` of `driver`, whose record could not be written: nothing may
    /// run that no agent knows. True once the driver has no such task.
    async fn destroy_unrecorded(&self, driver: &dyn TaskDriver, id: &str) -> bool {
        match tokio::time::timeout(self.rpc_timeout, driver.destroy_task(id, true)).await {
            Ok(Ok(())) | Ok(Err(DriverError::NotFound(_))) => true,
            Ok(Err(e)) => {
                tracing::error!(task = %id, "cannot destroy a task whose record could not be written: {e}");
                false
            }
            Err(_) => {
                tracing::error!(task = %id, "DestroyTask of a task whose record could not be written timed out");
                false
            }
        }
    }

    /// Task `task` may run, its caller is told it failed (`why`: its record could not be
    /// written), and destroying it failed too. Rather than leave a task running that no
    /// agent knows, it stays, stopped as a user's stop would stop it: the stop goes in
    /// its record and in its start intent (whichever of them can still be written; the
    /// next agent takes it from either), and a runner recovers the task and stops it
    /// once its driver answers. The error for the caller says so.
    async fn stop_unrecorded(self: &Arc<Self>, task: &Arc<Task>, why: String) -> DriverError {
        // Neither forgotten nor destroyed: its record may still be written.
        debug_assert!(!task.destroyed.load(Ordering::SeqCst));
        task.record_kill(task.default_kill());
        task.kill.cancel();
        task.failure(format!(
            "{why}; destroying it failed too: it is stopped once its driver answers"
        ));
        let intent = self.replace_start_intent(task);
        if let Err(e) = &intent {
            tracing::warn!(task = %task.id, "cannot write the stop into the task's start intent: {e}");
        }
        let recorded = task.persist(&self.store).await;
        if let Err(e) = &recorded {
            tracing::error!(task = %task.id, "cannot record the task's state: {e}");
        }
        if recorded.is_err() && intent.is_err() {
            // Neither holds the stop: an agent that died now would recover the task as
            // running, which its caller was told failed. An empty file needs no data
            // block, which is what a full disk has none of.
            let marker = self.starting_dir.join(format!("{}{INTENT_STOP}", task.id));
            match write_new_private_file(&marker, b"") {
                Ok(()) => tracing::warn!(
                    task = %task.id,
                    "the stop is kept in {} for the next agent, should this one die first",
                    marker.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => tracing::error!(
                    task = %task.id,
                    "cannot keep the stop anywhere ({e}): an agent that dies before the \
                     task is stopped leaves it running"
                ),
            }
        }
        crate::metrics::metrics().task_failures.inc();
        tokio::spawn(Runner::new(self.clone(), task.clone(), None).run(Phase::Recover));
        DriverError::Internal(format!(
            "{why}; destroying it failed too: task {} is stopped as soon as its driver \
             answers",
            task.id
        ))
    }

    /// Write `record`, the pending record of task `id`, to `starting/<id>` before its
    /// `StartTask`, while the store writes it durably: the file needs no fsync, since
    /// it only has to outlive this process (a machine that crashes takes the task
    /// with it), and it is removed once the store has the record.
    fn write_start_intent(&self, id: &str, record: &[u8]) -> std::io::Result<()> {
        write_new_private_file(&self.starting_dir.join(id), record)
    }

    /// Replace the start intent of `task` with its record as it is now (with the stop
    /// [`TaskManager::stop_unrecorded`] put in it), atomically: a new file renamed over
    /// the old one, so that an agent that dies meanwhile leaves one whole intent.
    fn replace_start_intent(&self, task: &Task) -> std::io::Result<()> {
        let bytes = task.rec().encode().map_err(std::io::Error::other)?;
        // Never an id (`+` is not in their alphabet, see `validate_task_id`):
        // `adopt_start_intents` removes a leftover one.
        let tmp = self
            .starting_dir
            .join(format!("{}{INTENT_REPLACEMENT}", task.id));
        let _ = std::fs::remove_file(&tmp);
        write_new_private_file(&tmp, &bytes)?;
        std::fs::rename(&tmp, self.starting_dir.join(&task.id)).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    fn remove_start_intent(&self, id: &str) {
        if let Err(e) = std::fs::remove_file(self.starting_dir.join(id))
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(task = %id, "cannot remove the start intent of the task: {e}");
        }
    }

    /// The start intents an agent that died left (see [`TaskManager::run`]): a task
    /// whose record did not reach the store may have been started. Each one whose
    /// task has no record becomes that record (written durably now), so the task is
    /// recovered as any pending task is: found by id if it started, else started once.
    /// Every intent is removed. A directory that cannot be made or read is an error:
    /// the agent must not start tasks it could lose.
    fn adopt_start_intents(
        &self,
        loaded: &mut HashMap<String, Arc<Task>>,
    ) -> Result<(), StateError> {
        let io = |op: &str, e: std::io::Error| StateError::Io {
            op: format!("{op} {}", self.starting_dir.display()),
            reason: e.to_string(),
        };
        crate::dirs::prepare(
            &self.starting_dir,
            "start intent directory",
            crate::dirs::Access::Private,
        )
        .map_err(|e| StateError::Io {
            op: "prepare the start intent directory".into(),
            reason: e.to_string(),
        })?;
        let entries = std::fs::read_dir(&self.starting_dir).map_err(|e| io("read", e))?;
        // Stops kept as markers: obeyed once every intent is adopted.
        let mut stops = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io("read", e))?;
            let path = entry.path();
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .filter(|name| drover_plugin_sdk::validate_task_id(name).is_ok())
                .map(str::to_owned)
            else {
                if name
                    .to_str()
                    .is_some_and(|n| n.ends_with(INTENT_REPLACEMENT))
                {
                    // A replacement never renamed into place: the intent it was for is
                    // still there.
                    let _ = std::fs::remove_file(&path);
                } else if let Some(id) = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(INTENT_STOP))
                    .filter(|id| drover_plugin_sdk::validate_task_id(id).is_ok())
                {
                    stops.push((id.to_owned(), path));
                } else if name
                    .to_str()
                    .is_some_and(|n| n.ends_with(INTENT_UNREADABLE))
                {
                    tracing::warn!(
                        "{} is a start intent an earlier agent could not read, kept aside: \
                         read it with the version that wrote it, then delete it",
                        path.display()
                    );
                } else {
                    tracing::warn!(
                        "{} is not a start intent (its name is no task id): left alone",
                        path.display()
                    );
                }
                continue;
            };
            let bytes = std::fs::read(&path).map_err(|e| io("read", e))?;
            // Whole JSON, for an intent that is not a record this agent reads: a newer
            // agent's, not one cut short while it was written.
            let whole = || serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok();
            let adopted = match (loaded.get(&id), TaskRecord::decode(&id, &bytes)) {
                // The record landed; an intent that asks for a stop (a task the caller
                // was told failed, see `stop_unrecorded`) still gets it. Such an intent
                // is newer than a record without the stop (every write after the stop
                // carries it), so it replaces the record whole: with the handle it may
                // have and the record lacks, which a driver that cannot find its tasks
                // by id needs to reach the task at all.
                (Some(task), Ok(rec)) if rec.kill.is_some() && task.rec().kill.is_none() => Some((
                    rec,
                    "task an earlier agent could not record and was stopping: it is stopped",
                )),
                // The record landed, but this intent, whole and newer than this agent,
                // may hold what the record lacks (a stop, see above): kept aside, not
                // deleted, and said, for the version that wrote it to read.
                (Some(_), Err(e)) if whole() => {
                    let aside = keep_aside(&self.starting_dir, &id, &path)
                        .map_err(|e| io("keep aside", e))?;
                    tracing::warn!(
                        task = %id,
                        "the start intent of task {id} cannot be read ({e}); the task is \
                         loaded from its record, and the intent is kept as {}: read it with \
                         the version that wrote it, then delete it",
                        aside.display()
                    );
                    continue;
                }
                (Some(_), _) => None,
                (None, Ok(rec)) => Some((
                    rec,
                    "task whose record an earlier agent did not finish writing: recovered \
                     from its start intent",
                )),
                // Whole, but not a record this agent can read: as for the store's
                // records, refuse to start rather than lose the task.
                (None, Err(e)) if whole() => {
                    return Err(StateError::Io {
                        op: format!("read the start intent {}", path.display()),
                        reason: format!(
                            "{e}; the agent that wrote it may have started the task: \
                             recover it with that agent's version, or move the file aside"
                        ),
                    });
                }
                // Cut short while it was written: its StartTask was never sent.
                (None, Err(e)) => {
                    tracing::warn!(
                        task = %id,
                        "start intent cut short ({e}): the task was never started"
                    );
                    None
                }
            };
            if let Some((rec, why)) = adopted {
                let task = loaded_task(rec, || format!("read the start intent of task {id}"))?;
                self.store.store.put_task(&id, &bytes)?;
                tracing::warn!(task = %id, "{why}");
                loaded.insert(id.clone(), task);
            }
            std::fs::remove_file(&path).map_err(|e| io("clean", e))?;
        }
        for (id, marker) in stops {
            if let Some(task) = loaded.get(&id)
                && task.record_kill(task.default_kill())
            {
                // What the runner goes by (as for a record loaded with its stop,
                // see `Task::new`): stopped, never started or restarted.
                task.kill.cancel();
                let bytes = task
                    .rec()
                    .encode()
                    .map_err(|e| io("encode", std::io::Error::other(e)))?;
                // Durable before the marker goes; if it cannot be, the marker stays
                // for the next agent, and this one stops the task all the same.
                if let Err(e) = self.store.store.put_task(&id, &bytes) {
                    tracing::warn!(
                        task = %id,
                        "cannot record the stop an earlier agent kept in {} ({e}): \
                         the task is stopped, the file kept",
                        marker.display()
                    );
                    continue;
                }
                tracing::warn!(
                    task = %id,
                    "task an earlier agent could not record and was stopping: it is stopped"
                );
            }
            std::fs::remove_file(&marker).map_err(|e| io("clean", e))?;
        }
        Ok(())
    }

    /// The directory task directories are made in (`<data_dir>/alloc`).
    pub fn alloc_dir(&self) -> &std::path::Path {
        &self.alloc_dir
    }

    /// The directory of the task with id `id` (whether or not it exists yet).
    pub fn task_dir(&self, id: &str) -> PathBuf {
        self.alloc_dir.join(id)
    }

    /// The filesystem isolation of driver `name` ([`FsIsolation::None`](drover_plugin_sdk::FsIsolation::None) for a driver
    /// not loaded: its tasks cannot start anyway).
    pub fn fs_isolation(&self, name: &str) -> drover_plugin_sdk::FsIsolation {
        self.drivers
            .driver(name)
            .map_or(drover_plugin_sdk::FsIsolation::None, |d| d.fs_isolation())
    }

    /// The ids of tasks whose state changed (every change that is recorded: start,
    /// exit, restart pending, dead, destroyed), as they happen. A receiver that falls
    /// behind gets `Lagged` and should read the tasks it watches again.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.store.changes.subscribe()
    }

    /// The outcome of start-up recovery, once it has finished.
    pub fn recovery(&self) -> Option<RecoverySummary> {
        self.recovery
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn entry(&self, id: &str) -> Result<Arc<Task>, DriverError> {
        self.tasks
            .read()
            .ok()
            .and_then(|t| t.get(id).cloned())
            .ok_or_else(|| DriverError::NotFound(format!("no task with id {id:?}")))
    }

    fn driver(&self, name: &str) -> Result<Arc<dyn TaskDriver>, DriverError> {
        // `driver` below resolves an older name (`rawexec`) to the current one.
        self.drivers.driver(name).ok_or_else(|| {
            DriverError::NotFound(format!(
                "no driver named {name:?}; loaded drivers: {}",
                self.drivers.names().join(", ")
            ))
        })
    }

    fn remove(&self, id: &str) {
        if let Ok(mut t) = self.tasks.write() {
            t.remove(id);
        }
    }

    /// Validate and start a task. Nothing is left behind when the request is invalid,
    /// the driver refuses it, or its record cannot be written.
    pub async fn run(self: &Arc<Self>, req: RunRequest) -> Result<TaskView, DriverError> {
        self.run_with(req, RunOptions::default()).await
    }

    /// [`TaskManager::run`] with what only the agent itself may choose (never taken
    /// from an API request): the task id, and the allocation directory to share.
    pub async fn run_with(
        self: &Arc<Self>,
        req: RunRequest,
        opts: RunOptions,
    ) -> Result<TaskView, DriverError> {
        if let Some(id) = &opts.id {
            drover_plugin_sdk::validate_task_id(id)?;
        }
        // In a task of its own: the caller (an HTTP request whose client went away) may
        // be dropped at any await, and a start cut short half-way would leave a task
        // recorded but unwatched, or running but unrecorded.
        let me = self.clone();
        tokio::spawn(async move { me.start_new(req, opts).await })
            .await
            .map_err(|e| DriverError::Internal(format!("starting the task failed: {e}")))?
    }

    async fn start_new(
        self: &Arc<Self>,
        req: RunRequest,
        opts: RunOptions,
    ) -> Result<TaskView, DriverError> {
        let driver = self.driver(&req.driver)?;
        // Recorded under the name of the driver that serves it (`rawexec` asks for
        // `raw_exec`): that is the name shown, matched in hand-overs and recovered by.
        let driver_name = self.drivers.resolve_name(&req.driver);
        if let Some(why) = driver.retiring() {
            return Err(DriverError::FailedPrecondition(format!(
                "driver {:?} takes no new tasks: {why}",
                req.driver
            )));
        }
        let (state, reason) = driver.state();
        if state != PluginState::Healthy {
            return Err(DriverError::Unavailable(format!(
                "driver {:?} is {state:?}: {reason}",
                req.driver
            )));
        }
        let config = if req.config.is_null() {
            serde_json::json!({})
        } else {
            req.config.clone()
        };
        driver.task_schema().validate(&config).map_err(|e| {
            DriverError::InvalidConfig(format!("task config for driver {:?}: {e}", req.driver))
        })?;
        if opts.netns.is_some() && !driver.network_modes().group {
            return Err(DriverError::InvalidConfig(format!(
                "driver {driver_name} cannot join a bridge network (it does not offer the \
                 group network mode): run this task in a group without \
                 network {{ mode = \"bridge\" }}"
            )));
        }
        if let Some(v) = opts.volumes.first()
            && driver.fs_isolation() == drover_plugin_sdk::FsIsolation::None
        {
            return Err(DriverError::InvalidConfig(format!(
                "volume_mount of volume {:?}: driver {driver_name} has no filesystem \
                 isolation, so it cannot mount volumes (use exec, java or docker)",
                v.name
            )));
        }
        let settings = Settings::from_request(&req)?;
        let (resources, logs) = limits(&req)?;

        let id = opts
            .id
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        if self.entry(&id).is_ok() {
            return Err(DriverError::AlreadyExists(format!(
                "a task with id {id:?} exists"
            )));
        }
        let name = req.name.clone().unwrap_or_else(|| driver_name.clone());
        let task_dir = self.task_dir(&id);
        let mut spec = TaskSpec::new(id.clone())
            .with_name(name.clone())
            .with_envs(req.env.clone())
            .with_resources(resources)
            .with_task_dir(task_dir.clone())
            .with_logs(logs)
            .with_driver_config_json(config.to_string());
        if let Some(dir) = opts.alloc_dir {
            spec = spec.with_alloc_dir(dir);
        }
        if let Some(netns) = opts.netns {
            spec = spec.with_netns_path(netns);
        }
        if !opts.ports.is_empty() {
            spec = spec.with_ports(opts.ports);
        }
        if !opts.volumes.is_empty() {
            spec = spec.with_volumes(opts.volumes);
        }
        if !opts.devices.is_empty() {
            spec = spec.with_devices(opts.devices);
        }
        if !opts.device_mounts.is_empty() {
            spec = spec.with_mounts(opts.device_mounts);
        }
        for hook in &self.hooks {
            if let Err(e) = hook.prestart(&mut spec).await {
                let _ = std::fs::remove_dir_all(&task_dir);
                return Err(DriverError::Internal(format!("{} hook: {e}", hook.name())));
            }
        }
        let view = TaskView {
            id: id.clone(),
            name,
            driver: driver_name,
            state: TaskLifecycle::Pending,
            exit_code: None,
            signal: None,
            oom_killed: false,
            error: None,
            task_dir: task_dir.clone(),
            attributes: BTreeMap::new(),
            created_at: now(),
            started_at: None,
            finished_at: None,
            events: Vec::new(),
            events_dropped: 0,
            restarts: 0,
            restart_at: None,
        };
        let task = Arc::new(Task::new(
            TaskRecord {
                version: RECORD_VERSION,
                request: req,
                spec: spec.clone(),
                handle: None,
                view,
                restart: Default::default(),
                kill: None,
            },
            settings,
        ));
        task.event(
            TaskEventKind::Received,
            format!("task received by driver {}", task.driver),
        );
        // Held until the handle is recorded: a stop meanwhile waits, then stops what
        // was started.
        let ops = task.ops.lock().await;
        if let Ok(mut t) = self.tasks.write() {
            t.insert(id.clone(), task.clone());
        }
        // Everything of a start that failed goes.
        let clean_up = || {
            self.remove(&id);
            // Should its removal have failed before, an intent must not bring back a
            // task whose caller heard it failed.
            self.remove_start_intent(&id);
            let _ = std::fs::remove_dir_all(&task_dir);
            // Whoever waits on it (a concurrent stop or wait) is told it is over.
            self.ended(&task);
        };
        let undo = |why: String| {
            clean_up();
            DriverError::Internal(why)
        };
        let generation = *driver.generation().borrow();
        let start = runner::start_in_time(self, &*driver, &task.driver, spec);
        // The pending record must be durable before the caller hears of the task, and
        // survive this agent if the task may have started. With a driver that finds its
        // tasks by id, the record's fsync runs while the driver starts the task: a copy
        // goes first to `starting/<id>` (no fsync: only an agent that dies needs it, a
        // machine that crashes ends the task too), and the next agent takes a task whose
        // record did not land from there (`adopt_start_intents`). Nomad's drivers need
        // the handle they give to find a task again, so theirs is written first, as
        // before; so is any record whose intent cannot be written.
        let intent = if driver.finds_tasks_by_id() {
            task.rec().encode().ok().filter(|bytes| {
                self.write_start_intent(&id, bytes)
                    .inspect_err(|e| {
                        tracing::warn!(task = %id, "cannot write the start intent ({e}): the record is made durable before the start instead")
                    })
                    .is_ok()
            })
        } else {
            None
        };
        let answer = if let Some(record) = intent {
            let written = async {
                let written = task.persist_encoded(&self.store, record).await;
                if written.is_ok() {
                    self.remove_start_intent(&id);
                }
                written
            };
            let (answer, written) = tokio::join!(start, written);
            if let Err(e) = written {
                // Whatever the start did, nothing may run without a record. The intent
                // stays until that is certain: should this agent die first, the next
                // one takes the task from it.
                let started = match &answer {
                    Ok(_) => true,
                    Err(se) if runner::maybe_started(se) => !matches!(
                        runner::probe(self, &task, &*driver).await,
                        runner::Probe::NeverStarted
                    ),
                    Err(_) => false,
                };
                if started && !self.destroy_unrecorded(&*driver, &id).await {
                    drop(ops);
                    return Err(self
                        .stop_unrecorded(
                            &task,
                            format!("cannot record task {id} before starting it ({e})"),
                        )
                        .await);
                }
                task.destroyed.store(true, Ordering::SeqCst);
                return Err(undo(format!(
                    "cannot record task {id} before starting it: {e}"
                )));
            }
            answer
        } else {
            if let Err(e) = task.persist(&self.store).await {
                task.destroyed.store(true, Ordering::SeqCst);
                return Err(undo(format!(
                    "cannot record task {id} before starting it: {e}"
                )));
            }
            start.await
        };
        let failed = match answer {
            Ok(started) => Ok(started),
            Err(e) if runner::maybe_started(&e) => {
                // The plugin died or stalled during the call: the task may or may not
                // have been started. Ask the driver by id before deciding.
                match runner::probe(self, &task, &*driver).await {
                    runner::Probe::Started(h) => Ok((*h, None)),
                    runner::Probe::NeverStarted => Err(e),
                    runner::Probe::Unknown(why) => {
                        // Keep the record (pending, no handle); the runner asks the
                        // (relaunched) driver, and starts it only if it never was.
                        task.failure(format!(
                            "driver {} failed while starting the task ({e}) and cannot say \
                             whether it started ({why}); it is recovered or started once the \
                             driver answers",
                            task.driver
                        ));
                        task.save(&self.store).await;
                        drop(ops);
                        let view = task.view();
                        tokio::spawn(Runner::new(self.clone(), task, None).run(Phase::Recover));
                        return Ok(view);
                    }
                }
            }
            Err(e) => Err(e),
        };
        let (handle, reported) = match failed {
            Ok(started) => started,
            Err(e) => {
                if let Err(se) = task.forget(&self.store).await {
                    tracing::error!(task = %id, "cannot delete the record of a task that failed to start: {se}");
                }
                crate::metrics::metrics().task_failures.inc();
                clean_up();
                return Err(e);
            }
        };
        let attributes = runner::poststart(&self.hooks, &*driver, &handle, reported).await;
        runner::started(&task, handle, attributes, false);
        crate::metrics::metrics().task_starts.inc();
        self.attached(&task, generation);
        // At most one commit per start: the record before the start was durable, and
        // this one is deferred (it rides with the next commit, of any task, within
        // 100 ms). If it is lost in a crash, that one (no handle yet) makes the next
        // agent find the task by probing its driver by id, as for a crash during the
        // start. A driver that cannot be probed by id (Nomad's) gets a durable write.
        let written = if driver.finds_tasks_by_id() {
            task.persist_lazily(&self.store).await
        } else {
            task.persist(&self.store).await
        };
        if let Err(e) = written {
            // The caller hears "failed", so nothing may keep running.
            if !self.destroy_unrecorded(&*driver, &id).await {
                drop(ops);
                return Err(self
                    .stop_unrecorded(
                        &task,
                        format!("cannot record task {id} after starting it ({e})"),
                    )
                    .await);
            }
            if let Err(se) = task.forget(&self.store).await {
                tracing::error!(task = %id, "cannot delete the record of a destroyed task: {se}");
            }
            return Err(undo(format!(
                "cannot record task {id} after starting it (it was destroyed again): {e}"
            )));
        }
        drop(ops);
        let view = task.view();
        tokio::spawn(Runner::new(self.clone(), task, None).run(Phase::Watch { generation }));
        Ok(view)
    }

    /// Commit every task record write still deferred (a started task's handle is
    /// recorded with the next commit, within a bound): an agent going away leaves the
    /// next one the records as they are now.
    pub async fn flush_records(&self) {
        if let Err(e) = self.store.flush().await {
            tracing::error!("cannot commit the last task records: {e}");
        }
    }

    /// The task's current view.
    pub fn status(&self, id: &str) -> Result<TaskView, DriverError> {
        Ok(self.entry(id)?.view())
    }

    /// Every task, newest first.
    pub fn list(&self) -> Vec<TaskView> {
        let mut all: Vec<TaskView> = self
            .tasks
            .read()
            .map(|t| t.values().map(|e| e.view()).collect())
            .unwrap_or_default();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at));
        all
    }

    /// Block until the task is dead (restarts included), then return its view.
    pub async fn wait(&self, id: &str) -> Result<TaskView, DriverError> {
        let task = self.entry(id)?;
        let mut dead = task.dead.subscribe();
        let _ = dead.wait_for(|d| *d).await;
        Ok(task.view())
    }

    /// Stop a task for good: its kill signal (or `signal`), then SIGKILL after its kill
    /// timeout (or `timeout`). A pending restart is cancelled. Returns once it is dead.
    pub async fn stop(
        self: &Arc<Self>,
        id: &str,
        signal: Option<String>,
        timeout: Option<Duration>,
    ) -> Result<TaskView, DriverError> {
        // In a task of its own, like `run`: a stop whose caller went away still reaches
        // the driver.
        let me = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move { me.stop_now(&id, signal, timeout).await })
            .await
            .map_err(|e| DriverError::Internal(format!("stopping the task failed: {e}")))?
    }

    async fn stop_now(
        &self,
        id: &str,
        signal: Option<String>,
        timeout: Option<Duration>,
    ) -> Result<TaskView, DriverError> {
        let task = self.entry(id)?;
        if task.is_dead() {
            return Ok(task.view());
        }
        let signal = signal.unwrap_or_else(|| task.settings.kill_signal.clone());
        let sig = drover_plugin_sdk::Signal::parse_or_default(&signal)?;
        let timeout = timeout.unwrap_or(task.settings.kill_timeout);
        let bound = timeout.checked_add(STOP_GRACE).ok_or_else(|| {
            DriverError::InvalidConfig(format!("stop timeout {} is too long", human(timeout)))
        })?;
        task.record_kill(KillRequest {
            signal: signal.clone(),
            timeout,
        });
        task.event(
            TaskEventKind::Killing,
            format!("sending {signal}, SIGKILL after {}", human(timeout)),
        );
        // Durable first: should the agent die now, recovery finishes the stop.
        task.save(&self.store).await;
        task.kill.cancel();
        let deadline = tokio::time::Instant::now() + bound;
        let timed_out = |what: &str| {
            DriverError::Timeout(format!(
                "task {id} was asked to stop but {what} within {}; it is stopped as soon as \
                 its driver answers",
                human(bound)
            ))
        };
        // The wait for `ops` counts: a start or recovery stuck in a wedged driver must
        // not hold a stop forever.
        let sent = tokio::time::timeout_at(deadline, async {
            let _ops = task.ops.lock().await;
            let running =
                task.attached.load(Ordering::SeqCst) && task.state() == TaskLifecycle::Running;
            if running {
                let driver = self.driver(&task.driver)?;
                let mut pause = Duration::from_millis(100);
                loop {
                    match driver.stop_task(id, timeout, sig).await {
                        // Unavailable: the plugin just died; the runner sends the
                        // recorded stop to the relaunched one, so wait for the exit all
                        // the same.
                        Ok(())
                        | Err(DriverError::NotFound(_))
                        | Err(DriverError::Unavailable(_)) => break,
                        // The call was lost, but the plugin may be alive and its runner
                        // still waiting, and then nobody would send the stop again.
                        // StopTask is idempotent: send it again, until the deadline.
                        Err(DriverError::Transport(e)) => {
                            tracing::debug!(task = %id, "StopTask failed in transport, sending it again: {e}");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(2));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        })
        .await;
        match sent {
            Ok(r) => r?,
            Err(_) => return Err(timed_out("its driver did not act on it")),
        }
        let mut dead = task.dead.subscribe();
        if tokio::time::timeout_at(deadline, dead.wait_for(|d| *d))
            .await
            .is_err()
        {
            return Err(timed_out("its exit was not reported"));
        }
        Ok(task.view())
    }

    /// Restart a running task now (a failing check's `check_restart`): its kill signal,
    /// SIGKILL after its kill timeout, then it is started again at once, whatever its
    /// restart policy says; it counts as a restart, and its events say `why`.
    /// Set `env` in the environment of the task's next incarnations (its own restarts
    /// and the agent's): what a template with `env = true` rendered anew. The running
    /// incarnation keeps the environment it started with.
    pub async fn update_env(
        &self,
        id: &str,
        env: BTreeMap<String, String>,
    ) -> Result<(), DriverError> {
        let task = self.entry(id)?;
        {
            let mut rec = task.rec();
            rec.spec.env.extend(env.clone());
            rec.request.env.extend(env);
        }
        task.save(&self.store).await;
        Ok(())
    }

    pub async fn restart(&self, id: &str, why: &str) -> Result<(), DriverError> {
        let task = self.entry(id)?;
        if task.kill.is_cancelled() || task.state() != TaskLifecycle::Running {
            return Err(DriverError::FailedPrecondition(format!(
                "task {id} is not running"
            )));
        }
        let _ops = task.ops.lock().await;
        if !task.attached.load(Ordering::SeqCst) {
            return Err(DriverError::Unavailable(format!(
                "task {id} is being recovered by driver {}; try again shortly",
                task.driver
            )));
        }
        let sig = drover_plugin_sdk::Signal::parse_or_default(&task.settings.kill_signal)?;
        *task
            .restart_wanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why.to_owned());
        task.event(TaskEventKind::Restarting, why.to_owned());
        task.save(&self.store).await;
        let sent = self
            .driver(&task.driver)?
            .stop_task(id, task.settings.kill_timeout, sig)
            .await;
        if let Err(e) = sent {
            task.take_restart_wanted();
            return Err(e);
        }
        Ok(())
    }

    /// Run a command inside a running task through its driver's `ExecTask` (script
    /// checks), for at most `timeout`.
    pub async fn exec(
        &self,
        id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<drover_plugin_sdk::ExecOutput, DriverError> {
        let task = self.entry(id)?;
        if task.state() != TaskLifecycle::Running || !task.attached.load(Ordering::SeqCst) {
            return Err(DriverError::FailedPrecondition(format!(
                "task {id} is not running"
            )));
        }
        self.driver(&task.driver)?
            .exec_task(id, command, timeout)
            .await
    }

    /// Run a command inside a running task interactively through its driver's
    /// `ExecTaskStreaming` (`alloc exec`): what it writes, then how it ended.
    pub async fn exec_streaming(
        &self,
        id: &str,
        command: Vec<String>,
        tty: bool,
        inputs: tokio::sync::mpsc::Receiver<drover_plugin_sdk::ExecInput>,
    ) -> Result<driver::ExecEventStream, DriverError> {
        let task = self.entry(id)?;
        if task.state() != TaskLifecycle::Running || !task.attached.load(Ordering::SeqCst) {
            return Err(DriverError::FailedPrecondition(format!(
                "task {id} is not running"
            )));
        }
        self.driver(&task.driver)?
            .exec_task_streaming(id, command, tty, inputs)
            .await
    }

    /// Send a signal to a running task.
    pub async fn signal(&self, id: &str, signal: &str) -> Result<TaskView, DriverError> {
        let task = self.entry(id)?;
        let sig = drover_plugin_sdk::Signal::parse_or_default(signal)?;
        match task.state() {
            TaskLifecycle::Running if task.attached.load(Ordering::SeqCst) => {}
            TaskLifecycle::Running => {
                return Err(DriverError::Unavailable(format!(
                    "task {id} is being recovered by driver {}; try again shortly",
                    task.driver
                )));
            }
            state => {
                return Err(DriverError::FailedPrecondition(format!(
                    "task {id} is {}, not running",
                    serde_json::to_value(state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                )));
            }
        }
        self.driver(&task.driver)?.signal_task(id, sig).await?;
        task.event(TaskEventKind::Signaling, format!("sent {signal}"));
        task.save(&self.store).await;
        Ok(task.view())
    }

    /// One resource usage sample of a running task.
    pub async fn stats(&self, id: &str) -> Result<TaskStats, DriverError> {
        let task = self.entry(id)?;
        if task.state() != TaskLifecycle::Running {
            return Err(DriverError::FailedPrecondition(format!(
                "task {id} is not running"
            )));
        }
        let driver = self.driver(&task.driver)?;
        tokio::time::timeout(self.rpc_timeout, driver.task_stats(id))
            .await
            .map_err(|_| {
                DriverError::Timeout(format!(
                    "driver {} gave no stats for task {id} within {}",
                    task.driver,
                    human(self.rpc_timeout)
                ))
            })?
    }

    /// Forget a task (record, driver state, task directory); refuses a running one
    /// unless `force`, which kills it.
    pub async fn destroy(self: &Arc<Self>, id: &str, force: bool) -> Result<(), DriverError> {
        // In a task of its own, like `run`.
        let me = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move { me.destroy_now(&id, force).await })
            .await
            .map_err(|e| DriverError::Internal(format!("destroying the task failed: {e}")))?
    }

    async fn destroy_now(&self, id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.entry(id)?;
        let running = !task.is_dead();
        if running && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {id} is still running; stop it first or destroy it with force"
            )));
        }
        let driver = self.drivers.driver(&task.driver);
        if running {
            // Forgetting a task that may run, without a driver that can kill it, would
            // leave its process running where nobody sees it.
            let Some(_) = &driver else {
                return Err(DriverError::Unavailable(format!(
                    "task {id} may still be running and its driver {} is not loaded; it can \
                     be destroyed once the driver is back",
                    task.driver
                )));
            };
            if task.state() == TaskLifecycle::Running && !task.attached.load(Ordering::SeqCst) {
                let why = task
                    .view()
                    .events
                    .iter()
                    .rev()
                    .find(|e| e.kind == TaskEventKind::DriverFailure)
                    .map(|e| format!(" (last failure: {})", e.message))
                    .unwrap_or_default();
                return Err(DriverError::Unavailable(format!(
                    "task {id} is running but driver {} has not recovered it yet{why}; it can \
                     be destroyed once the driver recovers it",
                    task.driver
                )));
            }
            task.record_kill(KillRequest {
                signal: "SIGKILL".into(),
                timeout: Duration::ZERO,
            });
            task.save(&self.store).await;
            task.kill.cancel();
        }
        let bound = self.rpc_timeout + STOP_GRACE;
        if let Some(driver) = driver {
            let destroyed = tokio::time::timeout(bound, async {
                let _ops = task.ops.lock().await;
                driver.destroy_task(id, force).await
            })
            .await;
            match destroyed {
                Ok(Ok(())) | Ok(Err(DriverError::NotFound(_))) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(DriverError::Timeout(format!(
                        "driver {} did not destroy task {id} within {}",
                        task.driver,
                        human(bound)
                    )));
                }
            }
        }
        task.forget(&self.store).await.map_err(|e| {
            DriverError::Internal(format!(
                "the driver destroyed task {id}, but its record could not be deleted: {e}"
            ))
        })?;
        // A start intent left behind (its removal failed) must not bring the task back.
        self.remove_start_intent(id);
        self.remove(id);
        self.ended(&task);
        let dir = task.view().task_dir;
        let _ = std::fs::remove_dir_all(dir);
        Ok(())
    }

    /// Stop every task that is not dead, concurrently, each with its own kill signal
    /// and timeout: for `drover agent --drain`. Returns how many were stopped.
    pub async fn drain(self: &Arc<Self>) -> usize {
        let ids: Vec<String> = self
            .tasks
            .read()
            .map(|t| {
                t.values()
                    .filter(|t| !t.is_dead())
                    .map(|t| t.id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut set = tokio::task::JoinSet::new();
        for id in ids {
            let me = self.clone();
            set.spawn(async move {
                let r = me.stop(&id, None, None).await;
                (id, r)
            });
        }
        let mut stopped = 0;
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((_, Ok(_))) => stopped += 1,
                Ok((id, Err(e))) => {
                    tracing::error!(task = %id, "drain: stopping the task failed: {e}")
                }
                Err(e) => tracing::error!("drain: a stop panicked: {e}"),
            }
        }
        tracing::info!(stopped, "tasks drained");
        stopped
    }
}

/// The catalog hands an upgraded driver's tasks over through this (it does not know
/// the task manager): the runners re-attach on their own when the driver's
/// generation changes; the catalog only waits until none is behind.
impl crate::plugins::catalog::TaskHandover for TaskManager {
    fn handover_progress(&self, driver: &str, generation: u64) -> HandoverProgress {
        TaskManager::handover_progress(self, driver, generation)
    }
    fn live_handles(&self, driver: &str) -> Vec<(String, TaskHandle)> {
        TaskManager::live_handles(self, driver)
    }
    fn attachments(&self) -> watch::Receiver<u64> {
        TaskManager::attachments(self)
    }
}

/// Whether a task recorded with driver `recorded` is the task of the plugin named
/// `plugin`: the same name, or an older name of it (a task recorded as `rawexec`
/// before the driver took Nomad's name `raw_exec`).
fn driven_by(recorded: &str, plugin: &str) -> bool {
    recorded == plugin || drover_api::canonical_driver_name(recorded) == plugin
}

/// Write `bytes` to `path`, a new file (0600) that nothing may be at yet: `create_new`
/// (O_EXCL) fails on anything there, a link included. A file cut short by a failed
/// write is removed: half a record must not be read as one.
fn write_new_private_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes).inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// A task of a stored record (or start intent): its settings are read from its
/// request, which must still be valid; `op` names what was read, for the error.
fn loaded_task(rec: TaskRecord, op: impl FnOnce() -> String) -> Result<Arc<Task>, StateError> {
    let settings = Settings::from_request(&rec.request).map_err(|e| StateError::Io {
        op: op(),
        reason: format!("its request is no longer valid: {e}"),
    })?;
    Ok(Arc::new(Task::new(rec, settings)))
}

/// Most intents of one task kept aside before the agent refuses to load: each is a
/// downgrade across a change of the intent format, so more is a loop, not history.
const INTENTS_KEPT_ASIDE: u32 = 100;

/// Rename the start intent `path` of task `id` to `<id>+unreadable` in `dir`, or to
/// `<id>+<n>+unreadable` when an earlier one is kept there: never over an intent kept
/// aside before (a task downgraded twice keeps both), and never into a name that is a
/// task id (`+` is not in one), which the next load would read as an intent.
fn keep_aside(dir: &Path, id: &str, path: &Path) -> std::io::Result<PathBuf> {
    for n in 1..=INTENTS_KEPT_ASIDE {
        let aside = if n == 1 {
            dir.join(format!("{id}{INTENT_UNREADABLE}"))
        } else {
            dir.join(format!("{id}+{n}{INTENT_UNREADABLE}"))
        };
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            path,
            rustix::fs::CWD,
            &aside,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => return Ok(aside),
            Err(rustix::io::Errno::EXIST) => continue,
            // A filesystem without RENAME_NOREPLACE (NFS, some FUSE): a hard link
            // never replaces either, and the intent's own name goes after.
            Err(rustix::io::Errno::INVAL) => match std::fs::hard_link(path, &aside) {
                Ok(()) => {
                    std::fs::remove_file(path)?;
                    return Ok(aside);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e.into()),
        }
    }
    Err(std::io::Error::other(format!(
        "{INTENTS_KEPT_ASIDE} unreadable intents of task {id} are already kept aside in {}",
        dir.display()
    )))
}
