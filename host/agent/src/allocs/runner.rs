//! One runner per allocation: drives its group's tasks through the task manager in
//! lifecycle order, and reports every change.
//!
//! ```text
//!  Prestart ──ephemeral prestart ok, sidecars running──► Main ──main tasks dead, a
//!     │                                                   │     failure, or stop──► Stopping
//!     └──failure or stop────────────────────────────────────────────────────────────► Stopping
//!  Stopping ──every task but poststop stopped──► Poststop ──poststop tasks dead──► Done
//! ```
//!
//! The runner is a reconciler: every wake-up (a change of one of its tasks, from the
//! task manager's change notification, or a change from the server) it looks at the
//! record and the tasks' current state and does the next thing. Every decision is
//! written to the record before it is acted on (a task's id before the task is
//! started, the phase before its stops are sent), so an agent restart at any point
//! carries on where it stopped, without starting anything twice.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use drover_api::{Resources, RunRequest, TaskLifecycle, TaskView};
use drover_plugin_sdk::DriverError;
use drover_server_api::{
    AllocClientUpdate, ClientAllocation, ClientStatus, DesiredStatus, LifecycleHook,
    MAX_SERVICES_PER_ALLOC, NetworkMode, ServiceHealth, Task, TaskRunState, TaskState,
};
use tokio::time::Instant;

use super::health::{ChecksSeen, HealthDecision, HealthTracker, Observation};
use super::hooks::{HookContext, HookState, JobVersionHook, version_note};
use super::record::{AllocRecord, Phase, TaskSlot};
use super::{AllocManager, Handle};
use crate::network::{Bridge, BridgeConfig, PortMapping};

use crate::services::{AllocServices, Waker, Wanted};
use crate::tasks::RunOptions;

/// Pauses between attempts to stop tasks whose stop failed (a driver away).
const STOP_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));
/// Pauses between attempts to start a task whose driver is unavailable.
const START_RETRY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));

/// Which tasks of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Prestart { sidecar: bool },
    Main,
    Poststart,
    Poststop,
}

fn kind(t: &Task) -> Kind {
    match t.lifecycle {
        None => Kind::Main,
        Some(l) => match l.hook {
            LifecycleHook::Prestart => Kind::Prestart { sidecar: l.sidecar },
            LifecycleHook::Poststart => Kind::Poststart,
            LifecycleHook::Poststop => Kind::Poststop,
        },
    }
}

/// What the runner makes of a task now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Not started yet, or waiting for a restart.
    Pending,
    Running,
    /// Dead: exited 0, or stopped by the runner.
    Succeeded,
    /// Dead for good otherwise, or could not be started: why.
    Failed(String),
}

fn successful(v: &TaskView) -> bool {
    v.exit_code == Some(0) && v.signal.is_none() && !v.oom_killed && v.error.is_none()
}

fn describe(v: &TaskView) -> String {
    if let Some(e) = &v.error {
        return e.clone();
    }
    let mut s = match (v.signal, v.exit_code) {
        (Some(sig), _) => format!("killed by signal {sig}"),
        (None, Some(code)) => format!("exit code {code}"),
        (None, None) => "ended without an exit code".to_owned(),
    };
    if v.oom_killed {
        s.push_str(", OOM killed");
    }
    s
}

/// The allocation's ports as its drivers get them.
fn task_ports(ports: &[drover_server_api::AllocatedPort]) -> Vec<drover_plugin_sdk::TaskPort> {
    ports
        .iter()
        .map(|p| {
            drover_plugin_sdk::TaskPort::new(p.label.clone(), p.value)
                .with_to(p.to)
                .with_host_ip(p.host_ip.clone())
        })
        .collect()
}

/// The job's task as the task manager's request (hooks add the allocation's part).
fn request(alloc: &ClientAllocation, task: &Task) -> RunRequest {
    RunRequest {
        driver: task.driver.clone(),
        config: task.config.clone(),
        name: Some(format!("{}.{}", alloc.alloc.name, task.name)),
        env: task.env.clone(),
        kill_signal: task.kill_signal.clone(),
        kill_timeout: task.kill_timeout,
        restart: task.restart.clone(),
        resources: Some(Resources {
            cpu_shares: i64::from(task.resources.cpu),
            memory_mb: i64::from(task.resources.memory_mb),
            memory_max_mb: i64::from(task.resources.memory_max_mb),
        }),
        logs: task.logs,
    }
}

/// The port mappings of the group's bridge network, `Ok(None)` when the group is not
/// in bridge mode. Each port the allocation was given is forwarded from the node's
/// port (on the node's address) to its `to` inside the namespace, TCP and UDP, as
/// Nomad does. Only the scheduler's assignments are forwarded: a port of the group
/// the allocation lists no assignment for is not forwarded, and a static one fails
/// the allocation (forwarding it as written would bypass the node's reserved and used
/// ports).
fn bridge_ports(alloc: &ClientAllocation) -> Result<Option<Vec<PortMapping>>, String> {
    let Some(network) = alloc.group.network.as_ref() else {
        return Ok(None);
    };
    if network.mode != NetworkMode::Bridge {
        return Ok(None);
    }
    if let Some(spec) = network.ports.iter().find(|spec| {
        spec.static_port != 0 && !alloc.alloc.ports.iter().any(|p| p.label == spec.label)
    }) {
        return Err(format!(
            "network port {:?} (static {}) has no port assigned to this allocation by \
             the scheduler; only assigned ports are forwarded",
            spec.label, spec.static_port
        ));
    }
    let assigned: Vec<(u16, u16, String)> = alloc
        .alloc
        .ports
        .iter()
        .map(|p| {
            let to = if p.to == 0 { p.value } else { p.to };
            (p.value, to, p.host_ip.clone())
        })
        .collect();
    let mut mappings = Vec::new();
    for (host_port, container_port, host_ip) in assigned {
        for protocol in ["tcp", "udp"] {
            mappings.push(PortMapping {
                host_port,
                container_port,
                protocol: protocol.into(),
                host_ip: host_ip.clone(),
            });
        }
    }
    Ok(Some(mappings))
}

pub(super) struct Runner {
    mgr: Arc<AllocManager>,
    handle: Arc<Handle>,
    rec: AllocRecord,
    /// `<data_dir>/alloc/<alloc id>`.
    root: PathBuf,
    /// `<root>/alloc`.
    shared: PathBuf,
    restored: bool,
    /// Collection got past the stop hooks and destroying the tasks: a later attempt
    /// (the directory could not be removed) does not repeat them.
    released: bool,
    last: Option<AllocClientUpdate>,
    stop_pause: Duration,
    start_pause: Duration,
    /// The allocation's registered service instances and their running checks.
    services: AllocServices,
    /// The deployment the allocation belongs to and the tracker deciding its health
    /// in it; `None` outside a deployment.
    health: Option<(String, HealthTracker)>,
    /// Tasks whose prestart hooks failed, not tried again before this instant.
    prestart_retry: BTreeMap<String, Instant>,
}

impl Runner {
    pub(super) fn new(
        mgr: Arc<AllocManager>,
        handle: Arc<Handle>,
        rec: AllocRecord,
        restored: bool,
    ) -> Self {
        let root = mgr.tasks.alloc_dir().join(&rec.alloc.alloc.id);
        Runner {
            shared: root.join("alloc"),
            root,
            mgr,
            handle,
            rec,
            restored,
            released: false,
            last: None,
            stop_pause: STOP_RETRY.0,
            start_pause: START_RETRY.0,
            services: AllocServices::default(),
            health: None,
            prestart_retry: BTreeMap::new(),
        }
    }

    fn id(&self) -> &str {
        &self.rec.alloc.alloc.id
    }

    pub(super) async fn run(mut self) {
        for (name, slot) in &self.rec.tasks {
            self.handle.set_task_id(name, &slot.id);
            self.mgr.own(&slot.id, self.id());
        }
        if self.restored {
            self.prestart_again().await;
        }
        let stop = self.mgr.stop.clone();
        loop {
            if stop.is_cancelled() {
                return;
            }
            self.absorb_control().await;
            self.track_health();
            if self.rec.phase == Phase::Done {
                self.handle.set_terminal(self.rec.terminal_at);
                if self.handle.control.borrow().collect && self.collect().await {
                    return;
                }
            }
            let progressed = self.step().await;
            self.observe().await;
            self.sync_services();
            self.judge_health().await;
            self.report();
            if progressed {
                continue;
            }
            // The health timers (end of `min_healthy_time`, the deadline) wake the
            // runner too: a decision is reported when it is made.
            let health_wake = self.health.as_ref().and_then(|(_, t)| t.next_wake());
            tokio::select! {
                () = self.handle.notify.notified() => {}
                () = sleep_until(health_wake) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Durable when it returns; a failure is logged (the runner goes on: the next
    /// change writes the record again).
    async fn save(&self) -> bool {
        let bytes = match self.rec.encode() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(alloc = %self.id(), "{e}");
                return false;
            }
        };
        let store = self.mgr.store.clone();
        let id = self.id().to_owned();
        match tokio::task::spawn_blocking(move || store.put_alloc(&id, &bytes)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::error!(alloc = %self.id(), "cannot record the allocation: {e}");
                false
            }
            Err(e) => {
                tracing::error!(alloc = %self.id(), "recording the allocation panicked: {e}");
                false
            }
        }
    }

    /// Take the server's latest view of the allocation. Only the allocation's own
    /// fields are taken: the group keeps the spec its tasks were started with (the
    /// server replaces an allocation whose tasks changed; a new job version on the
    /// same allocation is not applied in place, the update hooks are told).
    async fn absorb_control(&mut self) {
        let (alloc, update, forget) = {
            let c = self.handle.control.borrow();
            (c.alloc.alloc.clone(), c.alloc.update, c.forget)
        };
        let mut changed = false;
        // The update strategy comes with the deployment the allocation (now) belongs
        // to: it says how its health is decided, not how its tasks run.
        if update != self.rec.alloc.update {
            self.rec.alloc.update = update;
            changed = true;
        }
        if alloc != self.rec.alloc.alloc {
            let moved = alloc.job_version != self.rec.alloc.alloc.job_version
                || alloc.desired_status != self.rec.alloc.alloc.desired_status;
            self.rec.alloc.alloc = alloc;
            changed = true;
            if moved {
                self.run_hooks(HookCall::Update).await;
            }
        }
        if forget && !self.rec.forget {
            self.rec.forget = true;
            changed = true;
        }
        if changed {
            self.save().await;
        }
    }

    fn names(&self, want: impl Fn(Kind) -> bool) -> Vec<String> {
        self.rec
            .alloc
            .group
            .tasks
            .iter()
            .filter(|t| want(kind(t)))
            .map(|t| t.name.clone())
            .collect()
    }

    fn task(&self, name: &str) -> Option<Task> {
        self.rec
            .alloc
            .group
            .tasks
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    fn view(&self, name: &str) -> Option<TaskView> {
        let slot = self.rec.tasks.get(name)?;
        if slot.id.is_empty() {
            return None;
        }
        self.mgr.tasks.status(&slot.id).ok()
    }

    fn seen(&self, name: &str) -> Seen {
        let Some(slot) = self.rec.tasks.get(name) else {
            return Seen::Pending;
        };
        if let Some(e) = &slot.start_error {
            return Seen::Failed(e.clone());
        }
        match self.mgr.tasks.status(&slot.id) {
            Err(_) if slot.started => Seen::Failed(
                "the task manager no longer knows the task (destroyed by hand?)".into(),
            ),
            Err(_) => Seen::Pending,
            Ok(v) => match v.state {
                TaskLifecycle::Pending => Seen::Pending,
                TaskLifecycle::Running => Seen::Running,
                TaskLifecycle::Dead if slot.stopped || successful(&v) => Seen::Succeeded,
                TaskLifecycle::Dead => Seen::Failed(describe(&v)),
            },
        }
    }

    /// The task has run (or runs) at least once.
    fn has_started(&self, name: &str) -> bool {
        match self.seen(name) {
            Seen::Running | Seen::Succeeded | Seen::Failed(_) => true,
            Seen::Pending => self.view(name).is_some_and(|v| v.started_at.is_some()),
        }
    }

    fn stop_wanted(&self) -> bool {
        self.rec.forget || self.rec.alloc.alloc.desired_status == DesiredStatus::Stop
    }

    /// Do the next thing; true when something changed (look again at once).
    async fn step(&mut self) -> bool {
        match self.rec.phase {
            Phase::Prestart => {
                if self.stop_wanted() {
                    self.rec.description = "stopped as asked".into();
                    return self.enter(Phase::Stopping).await;
                }
                // The group's network exists before its first task starts.
                match self.ensure_network().await {
                    Ok(true) => {}
                    Ok(false) => return false,
                    Err(why) => return self.fail(why).await,
                }
                let names = self.names(|k| matches!(k, Kind::Prestart { .. }));
                let mut progressed = false;
                for n in &names {
                    progressed |= self.ensure_started(n).await;
                }
                let mut ready = true;
                for n in &names {
                    let sidecar = self
                        .task(n)
                        .is_some_and(|t| matches!(kind(&t), Kind::Prestart { sidecar: true }));
                    match self.seen(n) {
                        Seen::Failed(why) => {
                            return self.fail(format!("prestart task {n} failed: {why}")).await;
                        }
                        Seen::Pending => ready = false,
                        Seen::Running if !sidecar => ready = false,
                        Seen::Running | Seen::Succeeded => {}
                    }
                }
                if ready {
                    return self.enter(Phase::Main).await;
                }
                progressed
            }
            Phase::Main => {
                if self.stop_wanted() {
                    self.rec.description = "stopped as asked".into();
                    return self.enter(Phase::Stopping).await;
                }
                let mains = self.names(|k| k == Kind::Main);
                let mut progressed = false;
                for n in &mains {
                    progressed |= self.ensure_started(n).await;
                }
                // A failure of anything running now fails the allocation (before any
                // poststart task is started for main tasks that did not make it).
                for n in self.names(|k| k != Kind::Poststop) {
                    if let Seen::Failed(why) = self.seen(&n) {
                        return self.fail(format!("task {n} failed: {why}")).await;
                    }
                }
                if mains.iter().all(|n| self.has_started(n)) {
                    for n in self.names(|k| k == Kind::Poststart) {
                        progressed |= self.ensure_started(&n).await;
                    }
                }
                if mains.iter().all(|n| self.seen(n) == Seen::Succeeded) {
                    self.rec.description = "all main tasks completed".into();
                    return self.enter(Phase::Stopping).await;
                }
                progressed
            }
            Phase::Stopping => self.stop_all().await,
            Phase::Poststop => {
                let names = self.names(|k| k == Kind::Poststop);
                let mut progressed = false;
                for n in &names {
                    progressed |= self.ensure_started(n).await;
                }
                let mut all_dead = true;
                for n in &names {
                    match self.seen(n) {
                        Seen::Failed(why) => {
                            if !self.rec.failed {
                                self.rec.failed = true;
                                self.rec.description = format!("poststop task {n} failed: {why}");
                                progressed = true;
                            }
                        }
                        Seen::Succeeded => {}
                        Seen::Pending | Seen::Running => all_dead = false,
                    }
                }
                if all_dead {
                    // Every task of the group is dead: its network goes, and its CSI
                    // volumes are unpublished before the end is reported (which frees
                    // their claims on the server).
                    self.release_network().await;
                    self.release_csi().await;
                    return self.enter(Phase::Done).await;
                }
                if progressed {
                    self.save().await;
                }
                progressed
            }
            Phase::Done => false,
        }
    }

    /// Make the group's bridge network unless the group has none or it is made: true
    /// when the tasks may start, false when not yet (the record could not be
    /// written), the reason when the allocation fails.
    ///
    /// The plan is recorded before anything is made, so that an agent killed in the
    /// middle tears down what it made; a plan without an address (the agent died in
    /// the setup, before any task started) is set up again from a clean slate.
    async fn ensure_network(&mut self) -> Result<bool, String> {
        let Some(ports) = bridge_ports(&self.rec.alloc)? else {
            return Ok(true);
        };
        if self
            .rec
            .network
            .as_ref()
            .is_some_and(|n| n.address.is_some())
        {
            // A network made before this agent started (a restart): its guard rule
            // may be gone with a firewall reload; put it back.
            if let Some(bridge) = self.mgr.bridge()
                && let Err(e) = bridge.ensure_localhost_guard().await
            {
                tracing::warn!(alloc = %self.rec.alloc.alloc.id, "{e}");
            }
            return Ok(true);
        }
        let Some(bridge) = self.mgr.bridge() else {
            return Err(
                "the group asks for a bridge network, and this node offers none \
                        (bridge networking is off or misconfigured in the agent's config)"
                    .into(),
            );
        };
        if self.rec.network.is_none() {
            self.rec.network = Some(bridge.plan(self.id(), ports));
            if !self.save().await {
                self.rec.network = None;
                return Ok(false);
            }
        }
        let Some(mut st) = self.rec.network.clone() else {
            return Ok(false);
        };
        match bridge.setup(&mut st).await {
            Ok(()) => {
                tracing::info!(
                    alloc = %self.id(),
                    netns = %st.netns.display(),
                    address = st.address.as_deref().unwrap_or_default(),
                    "bridge network set up"
                );
                self.rec.network = Some(st);
                if !self.save().await {
                    // Not durable: the tasks do not start in it yet. Tried again (from
                    // a clean slate) on the next wake-up.
                    if let Some(n) = self.rec.network.as_mut() {
                        n.address = None;
                        n.result = None;
                    }
                    return Ok(false);
                }
                Ok(true)
            }
            Err(e) => Err(format!("cannot set up the group's bridge network: {e}")),
        }
    }

    /// Stage and publish the group's CSI volumes (none: nothing to do): their targets
    /// by volume id.
    async fn publish_csi(&self) -> Result<BTreeMap<String, std::path::PathBuf>, String> {
        if self.rec.alloc.csi_volumes.is_empty()
            && !self
                .rec
                .alloc
                .group
                .volumes
                .values()
                .any(|v| v.volume_type == "csi")
        {
            return Ok(BTreeMap::new());
        }
        match self.mgr.csi_mounts() {
            Some(m) => m.publish(&self.rec.alloc).await,
            None => Err("this node runs no CSI plugins".into()),
        }
    }

    /// Unpublish (and unstage) the group's CSI volumes; false when it failed (tried
    /// again when the allocation is collected).
    async fn release_csi(&mut self) -> bool {
        if self.rec.alloc.csi_volumes.is_empty() {
            return true;
        }
        let Some(m) = self.mgr.csi_mounts() else {
            return true;
        };
        match m.unpublish(&self.rec.alloc).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(alloc = %self.id(), "cannot unpublish the CSI volumes yet: {e}");
                false
            }
        }
    }

    /// Tear the group's bridge network down (every task is dead). A failure keeps the
    /// network in the record: collecting the allocation tries again, and the record
    /// stays until it succeeds, so nothing is lost track of.
    async fn release_network(&mut self) -> bool {
        let Some(st) = self.rec.network.clone() else {
            return true;
        };
        let bridge = match self.mgr.bridge() {
            Some(b) => b,
            // Bridge networking was turned off since: the record has all teardown needs.
            None => match Bridge::new(BridgeConfig::default()) {
                Ok(b) => Arc::new(b),
                Err(e) => {
                    tracing::error!(alloc = %self.id(), "cannot tear down the bridge network: {e}");
                    return false;
                }
            },
        };
        match bridge.teardown(&st).await {
            Ok(()) => {
                tracing::info!(alloc = %self.id(), netns = %st.netns.display(), "bridge network torn down");
                self.rec.network = None;
                self.save().await
            }
            Err(e) => {
                tracing::warn!(alloc = %self.id(), "cannot tear down the bridge network yet (tried again when the allocation is collected): {e}");
                false
            }
        }
    }

    async fn enter(&mut self, phase: Phase) -> bool {
        tracing::info!(alloc = %self.id(), from = ?self.rec.phase, to = ?phase, "allocation phase");
        self.rec.phase = phase;
        if phase == Phase::Done {
            self.rec.terminal_at = Some(SystemTime::now());
        }
        self.save().await;
        if phase == Phase::Done {
            self.handle.set_terminal(self.rec.terminal_at);
            self.mgr.gc_soon();
        }
        true
    }

    async fn fail(&mut self, why: String) -> bool {
        tracing::warn!(alloc = %self.id(), "allocation failed: {why}");
        self.rec.failed = true;
        self.rec.description = why;
        self.enter(Phase::Stopping).await
    }

    /// Start task `name` unless that was done (or tried and refused). The id is
    /// recorded before the start, so that after a crash the same id is asked for again
    /// and the task manager says whether it exists.
    async fn ensure_started(&mut self, name: &str) -> bool {
        let Some(task) = self.task(name) else {
            return false;
        };
        let slot = self.rec.tasks.entry(name.to_owned()).or_default();
        if slot.started || slot.start_error.is_some() {
            return false;
        }
        if slot.id.is_empty() {
            slot.id = uuid::Uuid::new_v4().simple().to_string();
            let id = slot.id.clone();
            if !self.save().await {
                // Not durable: not acted on. Tried again on the next wake-up.
                if let Some(s) = self.rec.tasks.get_mut(name) {
                    s.id.clear();
                }
                return false;
            }
            self.handle.set_task_id(name, &id);
            self.mgr.own(&id, self.id());
        }
        if self
            .prestart_retry
            .get(name)
            .is_some_and(|at| Instant::now() < *at)
        {
            return false;
        }
        let id = self.rec.tasks[name].id.clone();
        if self.mgr.tasks.status(&id).is_ok() {
            // Started before an agent restart cut the runner short.
            self.mark_started(name, None).await;
            return true;
        }
        let mut req = request(&self.rec.alloc, &task);
        if let Err(e) = self.prestart_hooks(name, &task, &id, &mut req, false).await {
            if self.retry_prestart(name, &task, &e).await {
                return false;
            }
            self.mark_started(name, Some(e)).await;
            return true;
        }
        self.prestart_retry.remove(name);
        if let Some(slot) = self.rec.tasks.get_mut(name) {
            slot.prestart_error = None;
        }
        let csi = match self.publish_csi().await {
            Ok(c) => c,
            Err(e) => {
                self.mark_started(name, Some(format!("cannot start task {name}: {e}")))
                    .await;
                return true;
            }
        };
        let volumes = match crate::csi::mounts::task_volumes(
            &self.rec.alloc.group,
            &task,
            &self.mgr.host_volumes(),
            &csi,
        ) {
            Ok(v) => v,
            Err(e) => {
                self.mark_started(name, Some(format!("cannot start task {name}: {e}")))
                    .await;
                return true;
            }
        };
        // The device nodes and mounts the device hook reserved for this start.
        let reserved = super::devices::reserved(
            self.rec
                .tasks
                .get(name)
                .and_then(|s| s.hooks.get("devices")),
        );
        let opts = RunOptions {
            id: Some(id.clone()),
            alloc_dir: Some(self.shared.clone()),
            netns: self
                .rec
                .network
                .as_ref()
                .filter(|n| n.address.is_some())
                .map(|n| n.netns.clone()),

            ports: task_ports(&self.rec.alloc.alloc.ports),
            volumes,
            devices: reserved.devices,
            device_mounts: reserved.mounts,
        };
        let outcome = match self.mgr.tasks.run_with(req, opts).await {
            Ok(_) | Err(DriverError::AlreadyExists(_)) => None,
            Err(DriverError::Unavailable(why)) => {
                // The driver is away (its plugin is being relaunched, or still loading
                // at agent start): try again later rather than fail the allocation.
                let pause = self.start_pause;
                self.start_pause = (pause * 2).min(START_RETRY.1);
                tracing::info!(
                    alloc = %self.id(), task = name,
                    "cannot start the task yet ({why}); trying again in {pause:?}"
                );
                let handle = self.handle.clone();
                let stop = self.mgr.stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => handle.notify.notify_one(),
                        () = stop.cancelled() => {}
                    }
                });
                return false;
            }
            Err(e) => Some(format!("cannot start task {name}: {e}")),
        };
        self.mark_started(name, outcome).await;
        true
    }

    /// A prestart hook failed: under the task's restart policy (attempts left), the
    /// start is tried again after its `delay` (true); otherwise the task fails (false).
    /// Attempts are counted over the allocation's life on this node.
    async fn retry_prestart(&mut self, name: &str, task: &Task, why: &str) -> bool {
        let Some(policy) = task.restart.clone() else {
            return false;
        };
        let Some(slot) = self.rec.tasks.get_mut(name) else {
            return false;
        };
        if slot.prestart_failures >= policy.attempts {
            return false;
        }
        slot.prestart_failures += 1;
        slot.prestart_error = Some(format!(
            "{why} (attempt {} of {}; trying again in {})",
            slot.prestart_failures,
            policy.attempts,
            drover_api::human_duration(policy.delay)
        ));
        tracing::warn!(alloc = %self.id(), task = name, "{why}; trying again in {:?}", policy.delay);
        self.save().await;
        self.prestart_retry
            .insert(name.to_owned(), Instant::now() + policy.delay);
        let handle = self.handle.clone();
        let stop = self.mgr.stop.clone();
        let delay = policy.delay;
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => handle.notify.notify_one(),
                () = stop.cancelled() => {}
            }
        });
        true
    }

    async fn mark_started(&mut self, name: &str, error: Option<String>) {
        if let Some(slot) = self.rec.tasks.get_mut(name) {
            match error {
                None => slot.started = true,
                Some(e) => {
                    tracing::warn!(alloc = %self.rec.alloc.alloc.id, task = name, "{e}");
                    slot.start_error = Some(e);
                }
            }
        }
        self.save().await;
    }

    async fn prestart_hooks(
        &mut self,
        name: &str,
        task: &Task,
        id: &str,
        req: &mut RunRequest,
        restored: bool,
    ) -> Result<(), String> {
        let alloc = self.rec.alloc.clone();
        let mut states = self
            .rec
            .tasks
            .get(name)
            .map(|s| s.hooks.clone())
            .unwrap_or_default();
        let node = self.mgr.node();
        let task_dir = self.mgr.tasks.task_dir(id);
        let ctx = HookContext {
            alloc: &alloc,
            task,
            task_id: id,
            alloc_root: &self.root,
            shared_dir: &self.shared,
            task_dir: &task_dir,
            fs_isolation: self.mgr.tasks.fs_isolation(&task.driver),
            node: &node,
            restored,
            tasks: &self.mgr.tasks,
        };
        let mut result = Ok(());
        for hook in &self.mgr.hooks {
            let state = states.entry(hook.name().to_owned()).or_default();
            if state.done {
                continue;
            }
            if let Err(e) = hook.prestart(&ctx, req, state).await {
                result = Err(format!("{} hook: {e}", hook.name()));
                break;
            }
            state.bound(hook.name(), name);
        }
        if let Some(slot) = self.rec.tasks.get_mut(name) {
            slot.hooks = states;
        }
        result
    }

    /// After an agent restart: the prestart hooks of every started task that are not
    /// done run again (their request changes are not used: the task runs already).
    async fn prestart_again(&mut self) {
        let started: Vec<(String, String)> = self
            .rec
            .tasks
            .iter()
            .filter(|(_, s)| s.started)
            .map(|(n, s)| (n.clone(), s.id.clone()))
            .collect();
        if started.is_empty() {
            return;
        }
        for (name, id) in started {
            let Some(task) = self.task(&name) else {
                continue;
            };
            let mut scratch = request(&self.rec.alloc, &task);
            if let Err(e) = self
                .prestart_hooks(&name, &task, &id, &mut scratch, true)
                .await
            {
                tracing::warn!(alloc = %self.id(), task = %name, "after restart: {e}");
            }
        }
        self.save().await;
    }

    /// Stop everything but the poststop tasks (their kill signal and timeout), then
    /// move on to the poststop phase.
    async fn stop_all(&mut self) -> bool {
        let names = self.names(|k| k != Kind::Poststop);
        let mut to_stop = Vec::new();
        for n in &names {
            let Some(v) = self.view(n) else { continue };
            if v.state != TaskLifecycle::Dead {
                to_stop.push((n.clone(), v.id.clone()));
            }
        }
        if !to_stop.is_empty() {
            for (n, _) in &to_stop {
                if let Some(s) = self.rec.tasks.get_mut(n) {
                    s.stopped = true;
                }
            }
            for (n, _) in &to_stop {
                self.run_task_hooks(n, HookCall::Prekill).await;
            }
            // Durable first: an agent restart now finishes these stops.
            self.save().await;
            let mut set = tokio::task::JoinSet::new();
            for (n, id) in to_stop {
                let tasks = self.mgr.tasks.clone();
                set.spawn(async move { (n, tasks.stop(&id, None, None).await) });
            }
            let mut failed = false;
            while let Some(r) = set.join_next().await {
                match r {
                    Ok((_, Ok(_))) | Ok((_, Err(DriverError::NotFound(_)))) => {}
                    Ok((n, Err(e))) => {
                        failed = true;
                        tracing::warn!(alloc = %self.id(), task = %n, "stopping the task failed: {e}");
                    }
                    Err(e) => {
                        failed = true;
                        tracing::error!(alloc = %self.id(), "a stop panicked: {e}");
                    }
                }
            }
            if failed {
                // Never go on while something may still run: try again.
                let pause = self.stop_pause;
                self.stop_pause = (pause * 2).min(STOP_RETRY.1);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = self.mgr.stop.cancelled() => {}
                }
                return true;
            }
        }
        self.enter(Phase::Poststop).await
    }

    /// Poststart hooks once per start seen, exited hooks once the task is dead.
    async fn observe(&mut self) {
        let names: Vec<String> = self.rec.tasks.keys().cloned().collect();
        let mut dirty = false;
        for n in names {
            let Some(v) = self.view(&n) else { continue };
            let starts = v.restarts + u32::from(v.started_at.is_some());
            let slot = &self.rec.tasks[&n];
            if starts > slot.poststarts && v.started_at.is_some() {
                self.run_task_hooks(&n, HookCall::Poststart(&v)).await;
                if let Some(s) = self.rec.tasks.get_mut(&n) {
                    s.poststarts = starts;
                }
                dirty = true;
            }
            if v.state == TaskLifecycle::Dead && !self.rec.tasks[&n].exited {
                self.run_task_hooks(&n, HookCall::Exited(&v)).await;
                if let Some(s) = self.rec.tasks.get_mut(&n) {
                    s.exited = true;
                }
                dirty = true;
            }
        }
        if dirty {
            self.save().await;
        }
    }

    async fn run_hooks(&mut self, call: HookCall<'_>) {
        let names: Vec<String> = self.rec.tasks.keys().cloned().collect();
        for n in names {
            self.run_task_hooks(&n, call).await;
        }
    }

    async fn run_task_hooks(&mut self, name: &str, call: HookCall<'_>) {
        let Some(task) = self.task(name) else { return };
        let Some(slot) = self.rec.tasks.get(name) else {
            return;
        };
        let id = slot.id.clone();
        let mut states = slot.hooks.clone();
        let alloc = self.rec.alloc.clone();
        let node = self.mgr.node();
        let task_dir = self.mgr.tasks.task_dir(&id);
        let ctx = HookContext {
            alloc: &alloc,
            task: &task,
            task_id: &id,
            alloc_root: &self.root,
            shared_dir: &self.shared,
            task_dir: &task_dir,
            fs_isolation: self.mgr.tasks.fs_isolation(&task.driver),
            node: &node,
            restored: self.restored,
            tasks: &self.mgr.tasks,
        };
        for hook in &self.mgr.hooks {
            let state: &mut HookState = states.entry(hook.name().to_owned()).or_default();
            match call {
                HookCall::Poststart(v) => hook.poststart(&ctx, v, state).await,
                HookCall::Prekill => hook.prekill(&ctx, state).await,
                HookCall::Exited(v) => hook.exited(&ctx, v, state).await,
                HookCall::Update => hook.update(&ctx, state).await,
                HookCall::Stop => hook.stop(&ctx, state).await,
            }
            state.bound(hook.name(), name);
        }
        if let Some(slot) = self.rec.tasks.get_mut(name) {
            slot.hooks = states;
        }
    }

    fn client_status(&self) -> ClientStatus {
        if let Some(s) = self.rec.terminal_status() {
            return s;
        }
        let mains = self.names(|k| k == Kind::Main);
        if self.rec.phase >= Phase::Main && mains.iter().all(|n| self.has_started(n)) {
            ClientStatus::Running
        } else {
            ClientStatus::Pending
        }
    }

    fn task_state(&self, name: &str) -> TaskState {
        let slot: Option<&TaskSlot> = self.rec.tasks.get(name);
        let note = version_note(slot.and_then(|s| s.hooks.get(JobVersionHook::NAME)));
        let mut st = TaskState {
            task_id: slot.map(|s| s.id.clone()).unwrap_or_default(),
            ..TaskState::default()
        };
        if let Some(e) = slot.and_then(|s| s.start_error.clone()) {
            st.state = TaskRunState::Dead;
            st.failed = true;
            st.message = e;
            return st;
        }
        match self.view(name) {
            Some(v) => {
                st.state = match v.state {
                    TaskLifecycle::Pending => TaskRunState::Pending,
                    TaskLifecycle::Running => TaskRunState::Running,
                    TaskLifecycle::Dead => TaskRunState::Dead,
                };
                let stopped = slot.is_some_and(|s| s.stopped);
                st.failed = v.state == TaskLifecycle::Dead && !stopped && !successful(&v);
                st.exit_code = v.exit_code;
                st.restarts = v.restarts;
                st.starts = v.restarts + u32::from(v.started_at.is_some());
                st.started_at = v.started_at.clone();
                st.finished_at = v.finished_at.clone();
                st.message = note
                    .or_else(|| v.events.last().map(|e| e.message.clone()))
                    .unwrap_or_default();
            }
            None if self.rec.phase == Phase::Done => {
                st.state = TaskRunState::Dead;
                st.message = "not started: the allocation ended first".into();
            }
            None => {
                if let Some(e) = slot.and_then(|s| s.prestart_error.clone()) {
                    st.message = e;
                }
            }
        }
        st
    }

    fn update(&self) -> AllocClientUpdate {
        let task_states: BTreeMap<String, TaskState> = self
            .rec
            .alloc
            .group
            .tasks
            .iter()
            .map(|t| (t.name.clone(), self.task_state(&t.name)))
            .collect();
        let has_services = !self.rec.alloc.group.services.is_empty()
            || self
                .rec
                .alloc
                .group
                .tasks
                .iter()
                .any(|t| !t.services.is_empty());
        AllocClientUpdate {
            healthy: self.health.as_ref().and_then(|(_, t)| t.decision()),
            id: self.id().to_owned(),
            client_status: self.client_status(),
            client_description: self.rec.description.clone(),
            task_states,
            services: has_services.then(|| self.services.snapshot()),
        }
    }

    /// The service instances that should be registered now: the group's while the
    /// allocation runs, a task's while the task runs; none once it stops.
    fn wanted_services(&self) -> Vec<Wanted> {
        let mut out = Vec::new();
        if self.stop_wanted() || self.rec.phase >= Phase::Stopping {
            return out;
        }
        let a = &self.rec.alloc;
        let node = self.mgr.node();
        let address = node
            .attributes
            .get("unique.network.ip-address")
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".to_owned());
        let task_id = |name: &str| {
            self.rec
                .tasks
                .get(name)
                .map(|s| s.id.clone())
                .filter(|id| !id.is_empty())
        };
        // What the server would refuse is dropped here (with a warning), so that one
        // job never gets its node's whole report refused.
        let mut add = |w: Result<Wanted, String>| match w {
            Ok(w) if out.len() >= MAX_SERVICES_PER_ALLOC => tracing::warn!(
                alloc = %a.alloc.id,
                service = %w.instance.service_name,
                "cannot register a service: the allocation has more than \
                 {MAX_SERVICES_PER_ALLOC} services"
            ),
            Ok(w) => out.push(w),
            Err(e) => tracing::warn!(alloc = %a.alloc.id, "cannot register a service: {e}"),
        };
        if self.client_status() == ClientStatus::Running {
            let mains = self.names(|k| k == Kind::Main);
            for s in &a.group.services {
                // The task `check_restart` restarts: the service's, or the only main
                // task.
                let task = if !s.task.is_empty() {
                    Some(s.task.as_str())
                } else if let Some(t) = s.checks.iter().find(|c| !c.task.is_empty()) {
                    Some(t.task.as_str())
                } else if mains.len() == 1 {
                    Some(mains[0].as_str())
                } else {
                    None
                };
                add(Wanted::of(
                    s,
                    &format!("group-{}", a.group.name),
                    (&a.alloc.job_name, &a.group.name, "", &a.alloc.id),
                    &a.alloc.ports,
                    &address,
                    task.and_then(task_id),
                    &task_id,
                ));
            }
        }
        for t in &a.group.tasks {
            if t.services.is_empty()
                || !self
                    .view(&t.name)
                    .is_some_and(|v| v.state == TaskLifecycle::Running)
            {
                continue;
            }
            for s in &t.services {
                add(Wanted::of(
                    s,
                    &t.name,
                    (&a.alloc.job_name, &a.group.name, &t.name, &a.alloc.id),
                    &a.alloc.ports,
                    &address,
                    task_id(&t.name),
                    &task_id,
                ));
            }
        }
        out
    }

    /// Register the service instances wanted now, deregister the others.
    fn sync_services(&mut self) {
        let wanted = self.wanted_services();
        let handle = self.handle.clone();
        let wake: Waker = Arc::new(move || handle.notify.notify_one());
        self.services.sync(wanted, &self.mgr.tasks, &wake);
    }

    /// Keep the health tracker in step with the allocation's deployment: none outside
    /// one; a new one (its deadline counted from now) when the allocation joins a
    /// deployment, unless the record holds the decision made for it before.
    fn track_health(&mut self) {
        let deployment = self.rec.alloc.alloc.deployment_id.clone();
        let Some((deployment, strategy)) = deployment.zip(self.rec.alloc.update) else {
            self.health = None;
            return;
        };
        if self.health.as_ref().is_some_and(|(d, _)| *d == deployment) {
            return;
        }
        let tracker = match &self.rec.health {
            Some(d) if d.deployment_id == deployment => {
                HealthTracker::decided(&strategy, d.healthy)
            }
            _ => HealthTracker::new(&strategy, Instant::now()),
        };
        self.health = Some((deployment, tracker));
    }

    /// Let the health tracker look; a decision is recorded (final across agent
    /// restarts) and goes into every report from now on.
    async fn judge_health(&mut self) {
        if self
            .health
            .as_ref()
            .is_none_or(|(_, t)| t.decision().is_some())
        {
            return;
        }
        let obs = self.health_observation();
        let Some((deployment, tracker)) = self.health.as_mut() else {
            return;
        };
        let Some(healthy) = tracker.observe(Instant::now(), &obs) else {
            return;
        };
        let deployment = deployment.clone();
        tracing::info!(
            alloc = %self.id(),
            deployment = %deployment,
            healthy,
            why = obs.failed.as_deref().unwrap_or_default(),
            "allocation health decided"
        );
        self.rec.health = Some(HealthDecision {
            deployment_id: deployment,
            healthy,
        });
        self.save().await;
    }

    /// What the health tracker looks at: the tasks that must run (main tasks and
    /// sidecars), the ephemeral ones, the checks of the registered services.
    fn health_observation(&self) -> Observation {
        let mut obs = Observation {
            stopping: self.stop_wanted(),
            tasks_running: true,
            ..Observation::default()
        };
        if self.rec.failed {
            obs.failed = Some(self.rec.description.clone());
            return obs;
        }
        if self.rec.phase >= Phase::Stopping {
            obs.failed = Some(format!(
                "the allocation ended before it was healthy ({})",
                self.rec.description
            ));
            return obs;
        }
        let mut expected = 0;
        for t in &self.rec.alloc.group.tasks {
            let sidecar = t.lifecycle.is_some_and(|l| l.sidecar);
            let must_run = match kind(t) {
                Kind::Poststop => continue,
                Kind::Main => true,
                Kind::Prestart { .. } | Kind::Poststart => sidecar,
            };
            let seen = self.seen(&t.name);
            if let Seen::Failed(why) = &seen {
                obs.failed = Some(format!("task {} failed: {why}", t.name));
                return obs;
            }
            if !must_run {
                // Ephemeral: a prestart task is done once it succeeded, a poststart
                // one once it started.
                let done = match kind(t) {
                    Kind::Prestart { .. } => seen == Seen::Succeeded,
                    _ => seen != Seen::Pending,
                };
                obs.tasks_running &= done;
                continue;
            }
            expected += t.services.iter().map(|s| s.checks.len()).sum::<usize>();
            if let Some(v) = self.view(&t.name) {
                obs.starts += u64::from(v.restarts) + u64::from(v.started_at.is_some());
            }
            match seen {
                Seen::Running => {}
                Seen::Pending => obs.tasks_running = false,
                Seen::Succeeded => {
                    obs.failed = Some(format!("task {} ended before it was healthy", t.name));
                    return obs;
                }
                Seen::Failed(_) => {}
            }
        }
        expected += self
            .rec
            .alloc
            .group
            .services
            .iter()
            .map(|s| s.checks.len())
            .sum::<usize>();
        let mut checks = ChecksSeen {
            expected,
            ..ChecksSeen::default()
        };
        for i in self.services.snapshot() {
            checks.registered += i.checks.len();
            checks.passing += i
                .checks
                .iter()
                .filter(|c| c.status == ServiceHealth::Passing)
                .count();
        }
        obs.checks = checks;
        obs
    }

    /// Send the allocation's status when it changed.
    fn report(&mut self) {
        let u = self.update();
        if self.last.as_ref() == Some(&u) {
            return;
        }
        self.handle.set_status(u.clone());
        if self.mgr.updates.send(u.clone()).is_err() {
            tracing::debug!(alloc = %self.id(), "nobody takes allocation updates");
        }
        self.last = Some(u);
    }

    /// Run the stop hooks and destroy the allocation's tasks; false when a task could
    /// not be destroyed yet.
    async fn release_tasks(&mut self) -> bool {
        let names: Vec<String> = self.rec.tasks.keys().cloned().collect();
        for n in &names {
            self.run_task_hooks(n, HookCall::Stop).await;
        }
        for n in &names {
            let id = self.rec.tasks[n].id.clone();
            if id.is_empty() {
                continue;
            }
            match self.mgr.tasks.destroy(&id, true).await {
                Ok(()) | Err(DriverError::NotFound(_)) => self.mgr.disown(&id),
                Err(e) => {
                    tracing::warn!(alloc = %self.id(), task = %n, "cannot destroy the task yet: {e}");
                    return false;
                }
            }
        }
        true
    }

    /// Forget the terminal allocation: stop hooks, its tasks destroyed in the task
    /// manager, its directory removed (without following links tasks left in it),
    /// its record deleted. False when something could not be done (tried again later).
    async fn collect(&mut self) -> bool {
        if !self.released {
            if !self.release_tasks().await {
                return false;
            }
            self.released = true;
        }
        if !self.release_network().await {
            return false;
        }
        if !self.release_csi().await {
            return false;
        }
        let root = self.root.clone();
        let removed = tokio::task::spawn_blocking(move || {
            // std's remove_dir_all removes links, never what they point to.
            match std::fs::remove_dir_all(&root) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        })
        .await;
        if let Ok(Err(e)) | Err(e) = removed.map_err(std::io::Error::other) {
            // Keep the allocation and its record: deleting the record would leave the
            // directory (the task's data, maybe large) on disk for ever, with nothing
            // left that knows it is there. The next collection pass tries again, and
            // so does the next agent start.
            let failures = self
                .handle
                .removal_failures
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if failures == 0 {
                tracing::warn!(alloc = %self.id(), dir = %self.root.display(), "cannot remove the allocation directory (tried again at each collection pass): {e}");
            } else {
                tracing::debug!(alloc = %self.id(), dir = %self.root.display(), failures = failures + 1, "still cannot remove the allocation directory: {e}");
            }
            return false;
        }
        let store = self.mgr.store.clone();
        let id = self.id().to_owned();
        match tokio::task::spawn_blocking(move || store.delete_alloc(&id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(alloc = %self.id(), "cannot delete the allocation record: {e}");
                return false;
            }
            Err(e) => {
                tracing::error!(alloc = %self.id(), "deleting the allocation record panicked: {e}");
                return false;
            }
        }
        self.mgr.forget(self.id());
        tracing::info!(alloc = %self.id(), "allocation collected");
        true
    }
}

/// Until `at`, or for ever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[derive(Clone, Copy)]
enum HookCall<'a> {
    Poststart(&'a TaskView),
    Prekill,
    Exited(&'a TaskView),
    Update,
    Stop,
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_server_api::{
        AllocResources, AllocatedPort, Allocation, JobType, NetworkSpec, PortSpec, TaskGroup,
    };

    fn bridge_alloc(ports: Vec<PortSpec>, assigned: Vec<AllocatedPort>) -> ClientAllocation {
        ClientAllocation {
            update: Default::default(),
            alloc: Allocation {
                task_devices: Default::default(),
                namespace: "default".into(),
                deployment_id: Default::default(),
                deployment_status: Default::default(),
                ports: assigned,
                reschedule_events: Vec::new(),
                id: "a1".into(),
                name: "web.app[0]".into(),
                index: 0,
                job_name: "web".into(),
                job_version: 0,
                group: "app".into(),
                node_id: "n".into(),
                node_name: "n".into(),
                resources: AllocResources::default(),
                desired_status: DesiredStatus::Run,
                desired_description: String::new(),
                client_status: ClientStatus::Pending,
                client_description: String::new(),
                task_states: BTreeMap::new(),
                eval_id: "e".into(),
                previous_allocation: None,
                next_allocation: None,
                create_index: 1,
                modify_index: 1,
                alloc_modify_index: 1,
                create_time: 0,
                modify_time: 0,
            },
            job_type: JobType::Service,
            group: TaskGroup {
                volumes: Default::default(),
                update: Default::default(),
                network: Some(NetworkSpec {
                    mode: NetworkMode::Bridge,
                    ports,
                }),
                services: Default::default(),
                reschedule: None,
                name: "app".into(),
                count: 1,
                constraints: vec![],
                meta: BTreeMap::new(),
                tasks: vec![],
            },
            job_meta: BTreeMap::new(),
            region: drover_server_api::DEFAULT_REGION.to_owned(),
            identities: BTreeMap::new(),
            csi_volumes: BTreeMap::new(),
        }
    }

    /// Only the scheduler's assignments are forwarded: a static port the allocation
    /// was not given (which would bypass the node's reserved ports) fails it, naming
    /// the port.
    #[test]
    fn a_static_port_without_an_assignment_is_refused_not_forwarded() {
        let ssh = PortSpec {
            label: "ssh".into(),
            static_port: 22,
            ..Default::default()
        };
        let err = bridge_ports(&bridge_alloc(vec![ssh.clone()], vec![])).unwrap_err();
        assert!(err.contains("\"ssh\"") && err.contains("22"), "{err}");

        let given = AllocatedPort {
            label: "ssh".into(),
            value: 2222,
            to: 22,
            host_ip: "127.0.0.1".into(),
        };
        let mappings = bridge_ports(&bridge_alloc(vec![ssh], vec![given]))
            .unwrap()
            .unwrap();
        assert_eq!(mappings.len(), 2, "{mappings:?}");
        assert!(
            mappings
                .iter()
                .all(|m| (m.host_port, m.container_port) == (2222, 22))
        );
    }
}
