//! Allocations on a client node: one runner per allocation drives its group's tasks
//! through the task manager, in the group lifecycle order (prestart, main + sidecars,
//! poststart, poststop), with a shared allocation directory.
//!
//! - Records: every allocation has a record in the agent's [`StateStore`] (the
//!   allocation and its group spec, the node-local task id per task name, per-task hook
//!   state, the runner's phase), written before the runner acts on what it says.
//! - Watching: the task manager announces every recorded task change
//!   ([`TaskManager::subscribe`]); one dispatcher wakes the runner owning the task.
//! - Restarts: [`AllocManager::restore`] (after the task manager recovered its tasks)
//!   makes a runner per record, which carries on from its phase; running tasks are
//!   left alone.
//! - Wiring (agent): `new` once the task manager exists; `restore` after
//!   `TaskManager::recover` (an `apply` before it restores first, so a recorded
//!   allocation is never started twice); `shutdown` when the agent stops (runners end,
//!   tasks keep running).
//! - Garbage: an allocation terminal here and on the server is collected (its tasks
//!   destroyed, its directory and record removed) after [`GC_AFTER`], or at once when
//!   more than [`MAX_TERMINAL_KEPT`] are kept; one missing from a complete set is
//!   stopped and collected as soon as it is terminal.

mod artifacts;
mod devices;
mod health;
mod hooks;
mod identity;
mod record;
mod runner;
pub(crate) mod task_user;
mod templates;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use drover_server_api::{AllocClientUpdate, ClientAllocation, DesiredStatus};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

/// For implementing [`AllocTaskHook`] outside this crate.
pub use tonic::async_trait;

pub use artifacts::ArtifactLimits;
pub use devices::{DeviceHook, device_env_name};
pub use hooks::{
    AllocTaskHook, HookContext, HookState, MAX_HOOK_STATE, configured_hooks, default_hooks,
};
use record::AllocRecord;
use runner::Runner;
pub use templates::{TemplateServer, TemplateSources, VariableSource};

use crate::network::{Bridge, BridgeConfig};
use crate::state::StateStore;
use crate::taskenv::NodeEnv;
use crate::tasks::TaskManager;

/// How long an allocation terminal here and on the server is kept (its directory, task
/// logs and records) before it is collected.
pub const GC_AFTER: Duration = Duration::from_secs(3600);
/// Terminal allocations kept at most; beyond, the oldest are collected at once.
pub const MAX_TERMINAL_KEPT: usize = 50;
/// How often the collector looks at terminal allocations.
const GC_TICK: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the manager tells a runner.
#[derive(Debug, Clone)]
struct Control {
    /// The server's latest view.
    alloc: ClientAllocation,
    /// Missing from a complete set: stop it, collect it once terminal.
    forget: bool,
    /// Collect it (it is terminal).
    collect: bool,
}

/// The manager's side of one runner.
struct Handle {
    control: watch::Sender<Control>,
    notify: Notify,
    status: Mutex<Option<AllocClientUpdate>>,
    task_ids: Mutex<BTreeMap<String, String>>,
    terminal_at: Mutex<Option<SystemTime>>,
    /// Times removing the allocation's directory failed; the allocation (and its
    /// record) stays until a later collection removes it.
    removal_failures: std::sync::atomic::AtomicU64,
}

impl Handle {
    fn set_task_id(&self, name: &str, id: &str) {
        lock(&self.task_ids).insert(name.to_owned(), id.to_owned());
    }
    fn set_status(&self, u: AllocClientUpdate) {
        *lock(&self.status) = Some(u);
    }
    fn set_terminal(&self, at: Option<SystemTime>) {
        *lock(&self.terminal_at) = at;
    }
}

/// Runs the allocations the servers give this node.
pub struct AllocManager {
    tasks: Arc<TaskManager>,
    store: Arc<dyn StateStore>,
    updates: mpsc::UnboundedSender<AllocClientUpdate>,
    hooks: Vec<Box<dyn AllocTaskHook>>,
    handles: Mutex<HashMap<String, Arc<Handle>>>,
    /// Task id → allocation id, for the dispatcher.
    owners: Mutex<HashMap<String, String>>,
    /// Serialises `apply` and `restore`.
    apply_lock: tokio::sync::Mutex<()>,
    background: AtomicBool,
    restored: AtomicBool,
    /// Allocations whose record this agent cannot read.
    unreadable: Mutex<HashSet<String>>,
    gc_wake: Arc<Notify>,
    gc_policy: Mutex<(Duration, usize)>,
    stop: CancellationToken,
    /// The node, for the tasks' environment (`NOMAD_DC`, `${node.unique.id}`, ...).
    node: Mutex<Arc<NodeEnv>>,
    /// Bridge networking of groups in `bridge` mode; `None`: not offered here.
    bridge: Mutex<Option<Arc<Bridge>>>,
    /// The node's host volumes (the agent's config, checked at start), by name.
    host_volumes: Mutex<Arc<BTreeMap<String, drover_server_api::HostVolume>>>,
    /// The node's CSI plugins, which publish allocations' CSI volumes; `None`: none.
    csi: Mutex<Option<Arc<crate::csi::mounts::CsiMounts>>>,
}

impl AllocManager {
    /// A manager that starts tasks through `tasks`, keeps its records in `store`, and
    /// sends every change of an allocation's client status or task states to
    /// `updates` (the cluster client batches and forwards them).
    pub fn new(
        tasks: Arc<TaskManager>,
        store: Arc<dyn StateStore>,
        updates: mpsc::UnboundedSender<AllocClientUpdate>,
    ) -> Arc<Self> {
        Self::with_hooks(tasks, store, updates, hooks::default_hooks())
    }

    /// [`AllocManager::new`] with other task hooks (e.g. [`default_hooks`] plus one's
    /// own; tests count calls with theirs).
    pub fn with_hooks(
        tasks: Arc<TaskManager>,
        store: Arc<dyn StateStore>,
        updates: mpsc::UnboundedSender<AllocClientUpdate>,
        hooks: Vec<Box<dyn AllocTaskHook>>,
    ) -> Arc<Self> {
        Arc::new(AllocManager {
            tasks,
            store,
            updates,
            hooks,
            handles: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
            apply_lock: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
            restored: AtomicBool::new(false),
            unreadable: Mutex::new(HashSet::new()),
            gc_wake: Arc::new(Notify::new()),
            gc_policy: Mutex::new((GC_AFTER, MAX_TERMINAL_KEPT)),
            stop: CancellationToken::new(),
            node: Mutex::new(Arc::new(NodeEnv::default())),
            bridge: Mutex::new(Bridge::new(BridgeConfig::default()).ok().map(Arc::new)),
            host_volumes: Mutex::new(Arc::new(BTreeMap::new())),
            csi: Mutex::new(None),
        })
    }

    /// The bridge network groups in `bridge` mode get (default: [`BridgeConfig`]'s
    /// defaults); `None`: such groups fail here with the reason. An allocation set up
    /// on another bridge is torn down from its own record, whatever this says.
    pub fn set_bridge(&self, bridge: Option<Bridge>) {
        *lock(&self.bridge) = bridge.map(Arc::new);
    }

    fn bridge(&self) -> Option<Arc<Bridge>> {
        lock(&self.bridge).clone()
    }

    /// The node the allocations run on (its id, name, datacenter, attributes and
    /// meta), for the environment and interpolation of the tasks started from now on.
    /// The agent sets it before the first allocation arrives.
    pub fn set_node(&self, node: NodeEnv) {
        *lock(&self.node) = Arc::new(node);
    }

    /// The node's host volumes, for the mounts of the tasks started from now on
    /// (checked by the caller: [`crate::volumes::check_host_volumes`]).
    pub fn set_host_volumes(&self, volumes: BTreeMap<String, drover_server_api::HostVolume>) {
        *lock(&self.host_volumes) = Arc::new(volumes);
    }

    /// Publish allocations' CSI volumes through `mounts`.
    pub fn set_csi_mounts(&self, mounts: Arc<crate::csi::mounts::CsiMounts>) {
        *lock(&self.csi) = Some(mounts);
    }

    fn csi_mounts(&self) -> Option<Arc<crate::csi::mounts::CsiMounts>> {
        lock(&self.csi).clone()
    }

    fn host_volumes(&self) -> Arc<BTreeMap<String, drover_server_api::HostVolume>> {
        lock(&self.host_volumes).clone()
    }

    fn node(&self) -> Arc<NodeEnv> {
        lock(&self.node).clone()
    }

    /// Keep terminal allocations `after` at most, and at most `keep` of them
    /// (defaults [`GC_AFTER`], [`MAX_TERMINAL_KEPT`]).
    pub fn set_gc_policy(&self, after: Duration, keep: usize) {
        *lock(&self.gc_policy) = (after, keep);
        self.gc_wake.notify_one();
    }

    /// Stop the runners (not the tasks: they keep running, and a later
    /// [`AllocManager::restore`] carries on), e.g. when the agent stops.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    /// Restore the allocations recorded before an agent restart (after the task
    /// manager recovered its tasks): their runners carry on without restarting tasks.
    ///
    /// Only the first call (or the first [`AllocManager::apply`], which restores first
    /// so that a recorded allocation is never started a second time) does anything.
    pub async fn restore(self: &Arc<Self>) {
        let _one = self.apply_lock.lock().await;
        self.restore_locked().await;
    }

    /// False when the records could not be read (tried again on the next call).
    async fn restore_locked(self: &Arc<Self>) -> bool {
        self.start_background();
        if self.restored.load(Ordering::SeqCst) {
            return true;
        }
        let store = self.store.clone();
        let records = match tokio::task::spawn_blocking(move || store.allocs()).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::error!("cannot read allocation records; none restored: {e}");
                return false;
            }
            Err(e) => {
                tracing::error!("reading allocation records panicked: {e}");
                return false;
            }
        };
        self.restored.store(true, Ordering::SeqCst);
        let mut restored = 0;
        for (id, bytes) in records {
            if lock(&self.handles).contains_key(&id) {
                continue;
            }
            match AllocRecord::decode(&id, &bytes) {
                Ok(rec) => {
                    self.spawn(rec, true);
                    restored += 1;
                }
                // Kept as it is (a newer agent may read it), and never overwritten.
                Err(e) => {
                    tracing::error!(alloc = %id, "allocation not restored: {e}");
                    lock(&self.unreadable).insert(id);
                }
            }
        }
        tracing::info!(allocs = restored, "allocations restored");
        true
    }

    /// The server's allocations for this node. With `complete`, `allocs` is every
    /// allocation the node should know: a local one missing from it is stopped and
    /// forgotten. Else they are changes (new allocations, new desired status or job
    /// version).
    ///
    /// A new allocation is recorded before its runner starts; one the node does not
    /// know that is already stopped or terminal on the server is ignored. A changed
    /// job version on a known allocation is not applied in place (the server replaces
    /// allocations whose tasks changed): the record takes the new allocation fields,
    /// the task hooks' `update` is called, the tasks keep running as started.
    pub async fn apply(self: &Arc<Self>, allocs: Vec<ClientAllocation>, complete: bool) {
        let _one = self.apply_lock.lock().await;
        if !self.restore_locked().await {
            // Starting allocations without knowing the recorded ones could start a
            // second copy of one: wait for the store (the next call tries again).
            tracing::error!("allocation records unreadable; allocation changes not applied");
            return;
        }
        let mut listed = HashSet::new();
        // New allocations: (id, record, encoded record), written together below.
        let mut received = Vec::new();
        for ca in allocs {
            let id = ca.alloc.id.clone();
            // The id becomes a directory name beside the task directories (whose ids
            // have no dashes): only a UUID is taken.
            if !is_uuid(&id) {
                tracing::error!(alloc = ?id, "allocation refused: its id is not a UUID");
                continue;
            }
            // New allocations start only after the loop: a second copy of one in the same
            // update (a server that lies or repeats itself) would start it twice.
            if !listed.insert(id.clone()) {
                tracing::error!(alloc = %id, "allocation listed twice in one update; the later copy is ignored");
                continue;
            }
            if lock(&self.unreadable).contains(&id) {
                tracing::error!(alloc = %id, "allocation ignored: its record is unreadable");
                continue;
            }
            let known = lock(&self.handles).get(&id).cloned();
            if let Some(h) = known {
                h.control.send_if_modified(|c| {
                    if c.alloc == ca {
                        return false;
                    }
                    c.alloc = ca;
                    true
                });
                h.notify.notify_one();
                continue;
            }
            if ca.alloc.desired_status == DesiredStatus::Stop
                || ca.alloc.client_status.is_terminal()
            {
                continue;
            }
            let rec = AllocRecord::new(ca);
            let bytes = match rec.encode() {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(alloc = %id, "{e}");
                    continue;
                }
            };
            received.push((id, rec, bytes));
        }
        // Every new allocation recorded in one durable write, then all started at once:
        // a job of 100 allocations on one node costs one fsync before its tasks start,
        // not 100 in a row.
        if !received.is_empty() {
            let store = self.store.clone();
            let batch: Vec<(String, Vec<u8>)> = received
                .iter_mut()
                .map(|(id, _, bytes)| (id.clone(), std::mem::take(bytes)))
                .collect();
            let written = tokio::task::spawn_blocking(move || {
                let records: Vec<(&str, &[u8])> = batch
                    .iter()
                    .map(|(id, bytes)| (id.as_str(), bytes.as_slice()))
                    .collect();
                // A store call that panics fails like one that errs, so that the others
                // still get their own write.
                let guarded = |call: &dyn Fn() -> Result<(), crate::state::StateError>| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
                        .unwrap_or_else(|_| {
                            Err(crate::state::StateError::Io {
                                op: "put alloc".into(),
                                reason: "the store call panicked".into(),
                            })
                        })
                        .map_err(|e| e.to_string())
                };
                match guarded(&|| store.put_allocs(&records)) {
                    Ok(()) => vec![Ok(()); records.len()],
                    // One at a time again: one bad record must not keep the others
                    // from starting.
                    Err(_) => records
                        .iter()
                        .map(|(id, bytes)| guarded(&|| store.put_alloc(id, bytes)))
                        .collect(),
                }
            })
            .await;
            match written {
                Ok(results) => {
                    for ((id, rec, _), result) in received.into_iter().zip(results) {
                        match result {
                            Ok(()) => {
                                tracing::info!(alloc = %id, name = %rec.alloc.alloc.name, "allocation received");
                                self.spawn(rec, false);
                            }
                            // Not started: the next complete set or change brings it
                            // again.
                            Err(e) => tracing::error!(
                                alloc = %id,
                                "cannot record the allocation; not started: {e}"
                            ),
                        }
                    }
                }
                Err(e) => {
                    tracing::error!("recording {} allocations panicked: {e}", received.len())
                }
            }
        }
        if complete {
            let gone: Vec<Arc<Handle>> = lock(&self.handles)
                .iter()
                .filter(|(id, _)| !listed.contains(*id))
                .map(|(_, h)| h.clone())
                .collect();
            for h in gone {
                h.control
                    .send_if_modified(|c| !std::mem::replace(&mut c.forget, true));
                h.notify.notify_one();
            }
        }
        self.gc_soon();
    }

    /// The current status of every local allocation (sent again after a reconnect).
    pub fn statuses(&self) -> Vec<AllocClientUpdate> {
        lock(&self.handles)
            .values()
            .filter_map(|h| lock(&h.status).clone())
            .collect()
    }

    /// How many times removing allocation `alloc_id`'s directory has failed so far, or
    /// `None` once it is collected (or was never here). The allocation is kept, with
    /// its record, and the removal tried again at each collection pass.
    pub fn removal_failures(&self, alloc_id: &str) -> Option<u64> {
        let h = lock(&self.handles).get(alloc_id).cloned()?;
        Some(h.removal_failures.load(Ordering::SeqCst))
    }

    /// The node-local task id of `task` in allocation `alloc_id` (`alloc logs`).
    pub fn task_id(&self, alloc_id: &str, task: &str) -> Option<String> {
        let h = lock(&self.handles).get(alloc_id).cloned()?;
        lock(&h.task_ids).get(task).cloned()
    }

    /// Every started task of every allocation here: (allocation id, task name, task
    /// id) — the metrics' per-allocation series.
    pub fn all_task_ids(&self) -> Vec<(String, String, String)> {
        let handles: Vec<(String, Arc<Handle>)> = lock(&self.handles)
            .iter()
            .map(|(id, h)| (id.clone(), h.clone()))
            .collect();
        let mut out = Vec::new();
        for (alloc_id, h) in handles {
            for (task, id) in lock(&h.task_ids).iter() {
                out.push((alloc_id.clone(), task.clone(), id.clone()));
            }
        }
        out
    }

    /// The node-local task ids of allocation `alloc_id`'s started tasks by task name,
    /// or `None` when the allocation is not on this node (Nomad's client endpoints).
    pub fn task_ids(&self, alloc_id: &str) -> Option<BTreeMap<String, String>> {
        let h = lock(&self.handles).get(alloc_id).cloned()?;
        let ids = lock(&h.task_ids).clone();
        Some(ids)
    }

    /// Whether `task` is a task of allocation `alloc_id`'s group (started or not).
    pub fn has_task(&self, alloc_id: &str, task: &str) -> bool {
        let Some(h) = lock(&self.handles).get(alloc_id).cloned() else {
            return false;
        };
        h.control
            .borrow()
            .alloc
            .group
            .tasks
            .iter()
            .any(|t| t.name == task)
    }

    fn spawn(self: &Arc<Self>, rec: AllocRecord, restored: bool) {
        let handle = Arc::new(Handle {
            control: watch::channel(Control {
                alloc: rec.alloc.clone(),
                forget: rec.forget,
                collect: false,
            })
            .0,
            notify: Notify::new(),
            status: Mutex::new(None),
            task_ids: Mutex::new(BTreeMap::new()),
            terminal_at: Mutex::new(rec.terminal_at),
            removal_failures: std::sync::atomic::AtomicU64::new(0),
        });
        lock(&self.handles).insert(rec.alloc.alloc.id.clone(), handle.clone());
        tokio::spawn(Runner::new(self.clone(), handle, rec, restored).run());
    }

    fn own(&self, task_id: &str, alloc_id: &str) {
        if !task_id.is_empty() {
            lock(&self.owners).insert(task_id.to_owned(), alloc_id.to_owned());
        }
    }

    fn disown(&self, task_id: &str) {
        lock(&self.owners).remove(task_id);
    }

    fn forget(&self, alloc_id: &str) {
        lock(&self.handles).remove(alloc_id);
    }

    /// Ask the collector to look now.
    fn gc_soon(&self) {
        self.gc_wake.notify_one();
    }

    /// The dispatcher (task changes → runners) and the collector, once. They hold the
    /// manager weakly and end with it (or with [`AllocManager::shutdown`]).
    fn start_background(self: &Arc<Self>) {
        if self.background.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut changes = self.tasks.subscribe();
        let me = Arc::downgrade(self);
        let stop = self.stop.clone();
        let gc_wake = self.gc_wake.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(GC_TICK);
            loop {
                let event = tokio::select! {
                    r = changes.recv() => Event::Task(r),
                    _ = tick.tick() => Event::Gc,
                    () = gc_wake.notified() => Event::Gc,
                    () = stop.cancelled() => return,
                };
                let Some(mgr) = me.upgrade() else { return };
                match event {
                    Event::Task(Ok(task_id)) => {
                        let owner = lock(&mgr.owners).get(&task_id).cloned();
                        if let Some(h) = owner.and_then(|a| lock(&mgr.handles).get(&a).cloned()) {
                            h.notify.notify_one();
                        }
                    }
                    Event::Task(Err(broadcast::error::RecvError::Lagged(n))) => {
                        tracing::debug!(missed = n, "task changes missed; waking every runner");
                        for h in lock(&mgr.handles).values() {
                            h.notify.notify_one();
                        }
                    }
                    Event::Task(Err(broadcast::error::RecvError::Closed)) => return,
                    Event::Gc => mgr.gc_pass(),
                }
            }
        });
    }

    /// Mark for collection the allocations that are terminal here and wanted by
    /// nobody: missing from a complete set, or terminal on the server too, once older
    /// than the policy's age or beyond its count (oldest first).
    fn gc_pass(&self) {
        let (after, keep) = *lock(&self.gc_policy);
        let now = SystemTime::now();
        let mut kept: Vec<(SystemTime, Arc<Handle>)> = Vec::new();
        for h in lock(&self.handles).values() {
            let Some(at) = *lock(&h.terminal_at) else {
                continue;
            };
            let (forget, server_done) = {
                let c = h.control.borrow();
                (c.forget, c.alloc.alloc.is_terminal())
            };
            if forget {
                collect(h);
            } else if server_done {
                kept.push((at, h.clone()));
            }
        }
        kept.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        for (i, (at, h)) in kept.iter().enumerate() {
            let old = now.duration_since(*at).unwrap_or_default() >= after;
            if old || i >= keep {
                collect(h);
            }
        }
    }
}

/// `8-4-4-4-12` hex digits: allocation ids as the server makes them.
fn is_uuid(id: &str) -> bool {
    id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn collect(h: &Handle) {
    h.control
        .send_if_modified(|c| !std::mem::replace(&mut c.collect, true));
    h.notify.notify_one();
}

enum Event {
    Task(Result<String, broadcast::error::RecvError>),
    Gc,
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_uuids_are_allocation_ids() {
        assert!(super::is_uuid("11111111-0000-4000-8000-000000000001"));
        for bad in [
            "",
            "..",
            "../../etc/passwd-0000-0000-000000000000",
            "0123456789abcdef0123456789abcdef",
            "11111111-0000-4000-8000-00000000000g",
            "11111111-0000-4000-8000-0000000000011",
        ] {
            assert!(!super::is_uuid(bad), "{bad:?}");
        }
    }
}
