//! One runner per live task: it owns the task's lifecycle from `StartTask` (or
//! recovery) until the task is dead for good.
//!
//! ```text
//!  Recover ──► Watch ──exit──► decide ──restart──► RestartAt ──► Start ──► Watch …
//!     │          │                └──complete/fail/stopped──► Done
//!     │          └─driver gone──► (re)attach: wait for the relaunch, RecoverTask
//!     └─pending, driver never started it──► Start
//! ```
//!
//! Every driver call made here is bounded (`RPC_TIMEOUT`) except `WaitTask`, which
//! blocks by design and fails fast when the plugin process dies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use drover_api::TaskEventKind;
use drover_plugin_sdk::{DriverError, ExitResult, Signal, TaskHandle, TaskSpec};
use tokio::sync::oneshot;

use super::hooks::{Started, TaskHook};
use super::restart::{Decision, decide, human};
use super::{Task, TaskLifecycle, TaskManager, TaskRecord, now, rfc3339};
use crate::tasks::driver::TaskDriver;

/// Polling a driver that is not loaded at all: from the first to the last interval.
const MISSING_DRIVER_POLL: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));

/// Pauses before asking a driver again after an error that may be transient (the
/// plugin died mid-call); about 1.5 s in all, longer than a plugin takes to be reaped.
const RETRY_PAUSES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

/// Errors after which asking again may well succeed: the call or its answer was lost
/// (a plugin killed mid-call breaks the connection before its exit is noticed), it
/// took too long, or the driver failed in a way that may pass (its executor was busy).
fn retryable(e: &DriverError) -> bool {
    matches!(
        e,
        DriverError::Transport(_) | DriverError::Internal(_) | DriverError::Timeout(_)
    )
}

/// Answers to `RecoverTask` by which a driver says it cannot take the task: it does
/// not know it, cannot read its handle, or does not recover at all. Anything else
/// (a timeout, a broken connection) says nothing about the task.
pub(crate) fn refuses_task(e: &DriverError) -> bool {
    matches!(
        e,
        DriverError::NotFound(_)
            | DriverError::InvalidConfig(_)
            | DriverError::Unimplemented(_)
            | DriverError::AlreadyExists(_)
    )
}

/// How often a task refused by a driver instance on probation looks whether the
/// probation ended without a rollback (the generation change that a rollback makes
/// wakes it at once).
const PROBATION_POLL: Duration = Duration::from_millis(250);

/// Pauses between recoveries of a task the driver cannot account for yet although it
/// may be running (RecoverTask timed out, or the executor is alive but unreachable):
/// from the first to the last.
const STUCK_POLL: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Errors from `StartTask` after which the task may have been started all the same: the
/// plugin died or stalled mid-call (a killed plugin often shows up as a transport error,
/// before its exit is noticed), or failed half-way. Only the driver can tell: [`probe`]
/// asks it by id.
pub(super) fn maybe_started(e: &DriverError) -> bool {
    matches!(
        e,
        DriverError::Unavailable(_)
            | DriverError::Transport(_)
            | DriverError::Internal(_)
            | DriverError::Timeout(_)
    )
}

/// What the driver says about a task whose `StartTask` ended in doubt.
pub(super) enum Probe {
    /// It runs (or ran): the driver knows it now, under this handle.
    Started(Box<TaskHandle>),
    /// The driver never started it.
    NeverStarted,
    /// The driver cannot say now (it is away, or failed again): why.
    Unknown(String),
}

/// Ask the driver by id whether a `StartTask` that ended in doubt started the task.
/// Call with the task's `ops` held.
pub(super) async fn probe(mgr: &TaskManager, task: &Task, driver: &dyn TaskDriver) -> Probe {
    let handle = probe_handle(&task.rec());
    let answer = tokio::time::timeout(mgr.recover_timeout, driver.recover_task(handle.clone()))
        .await
        .unwrap_or_else(|_| {
            Err(DriverError::Timeout(format!(
                "driver {} did not answer RecoverTask within {}",
                task.driver,
                human(mgr.recover_timeout)
            )))
        });
    match answer {
        Ok(()) => Probe::Started(Box::new(handle)),
        Err(DriverError::NotFound(_)) => Probe::NeverStarted,
        Err(e) => Probe::Unknown(e.to_string()),
    }
}

/// Where a runner is.
#[derive(Debug)]
pub(super) enum Phase {
    /// Hand the stored task back to its driver (agent start).
    Recover,
    /// The driver process of `generation` knows the incarnation: wait for its exit.
    Watch {
        /// Driver generation the incarnation was started or recovered on.
        generation: u64,
    },
    /// A restart is due at this time.
    RestartAt(SystemTime),
    /// Start a new incarnation now.
    Start {
        /// Counts as a restart.
        restart: bool,
    },
    /// The task is dead for good (or destroyed).
    Done,
}

/// The first outcome of a recovered task, for [`super::RecoverySummary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Recovered,
    Started,
    Dead,
    Waiting,
}

enum Attach {
    /// The driver process of this generation knows the task now.
    Attached(u64),
    /// The task had no handle and the driver has never heard of it.
    NeverStarted,
    /// The driver cannot take the task back.
    Lost(String),
}

/// `StartTask` of `spec` on `driver` (named `name`), bounded by the manager's start
/// timeout: the handle, with the attributes the driver sent along if it did.
pub(super) async fn start_in_time(
    mgr: &TaskManager,
    driver: &dyn TaskDriver,
    name: &str,
    spec: TaskSpec,
) -> Result<(TaskHandle, Option<BTreeMap<String, String>>), DriverError> {
    tokio::time::timeout(mgr.start_timeout, driver.start_task_reporting(spec))
        .await
        .unwrap_or_else(|_| {
            Err(DriverError::Timeout(format!(
                "driver {name} did not answer StartTask within {}",
                human(mgr.start_timeout)
            )))
        })
}

/// Run the poststart hooks; returns the driver facts they found.
pub(super) async fn poststart(
    hooks: &[Box<dyn TaskHook>],
    driver: &dyn TaskDriver,
    handle: &TaskHandle,
    reported: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut started = Started {
        driver,
        handle,
        reported,
        attributes: BTreeMap::new(),
    };
    for hook in hooks {
        hook.poststart(&mut started).await;
    }
    started.attributes
}

/// Record a started incarnation: handle, running, fresh exit fields, `Started` event.
pub(super) fn started(
    task: &Task,
    handle: TaskHandle,
    attributes: BTreeMap<String, String>,
    restart: bool,
) {
    let pid = attributes.get("pid").cloned();
    {
        let mut rec = task.rec();
        rec.handle = Some(handle);
        rec.restart.restart_at = None;
        let v = &mut rec.view;
        v.state = TaskLifecycle::Running;
        v.started_at = Some(now());
        v.finished_at = None;
        v.exit_code = None;
        v.signal = None;
        v.oom_killed = false;
        v.error = None;
        v.restart_at = None;
        v.attributes = attributes;
        if restart {
            v.restarts += 1;
        }
    }
    let msg = match pid {
        Some(pid) => format!("task started by driver {} (pid {pid})", task.driver),
        None => format!("task started by driver {}", task.driver),
    };
    task.event(TaskEventKind::Started, msg);
}

/// What the driver is asked to find when the agent never learnt the task's handle:
/// the stored spec and no driver state, which drivers read as "find it by its id".
fn probe_handle(rec: &TaskRecord) -> TaskHandle {
    TaskHandle::for_spec(rec.spec.clone())
}

/// An exit the driver could not read: no code, no signal, only an error.
fn unknown_exit(result: &ExitResult) -> bool {
    result.err.is_some() && result.exit_code == 0 && result.signal == 0 && !result.oom_killed
}

fn describe(result: &ExitResult) -> String {
    if let (true, Some(e)) = (unknown_exit(result), &result.err) {
        return e.clone();
    }
    let mut msg = if result.signal != 0 {
        format!("killed by signal {}", result.signal)
    } else {
        format!("exit code {}", result.exit_code)
    };
    if result.oom_killed {
        msg.push_str(", OOM killed");
    }
    if let Some(e) = &result.err {
        msg.push_str(&format!(" ({e})"));
    }
    msg
}

pub(super) struct Runner {
    mgr: Arc<TaskManager>,
    task: Arc<Task>,
    ready: Option<oneshot::Sender<Outcome>>,
    /// A stop asked for before the (re)attach was sent by this runner.
    stop_sent: bool,
    /// How often a start refused with AlreadyExists may fall back to a recovery.
    probes_left: u32,
}

impl Runner {
    pub(super) fn new(
        mgr: Arc<TaskManager>,
        task: Arc<Task>,
        ready: Option<oneshot::Sender<Outcome>>,
    ) -> Self {
        // What the driver says about the task lands in its events from now on.
        mgr.watch_driver_events(&task.driver);
        Runner {
            mgr,
            task,
            ready,
            stop_sent: false,
            probes_left: 3,
        }
    }

    fn report(&mut self, outcome: Outcome) {
        if let Some(tx) = self.ready.take() {
            let _ = tx.send(outcome);
        }
    }

    pub(super) async fn run(mut self, mut phase: Phase) {
        loop {
            if self.task.destroyed.load(Ordering::SeqCst) {
                phase = Phase::Done;
            }
            phase = match phase {
                Phase::Recover => self.recover().await,
                Phase::Watch { generation } => self.watch(generation).await,
                Phase::RestartAt(at) => self.restart_at(at).await,
                Phase::Start { restart } => self.start(restart).await,
                Phase::Done => {
                    self.report(Outcome::Dead);
                    return;
                }
            };
        }
    }

    async fn recover(&mut self) -> Phase {
        let restart_at = self.task.rec().restart.restart_at;
        if let Some(at) = restart_at {
            // It was waiting to be restarted: the old incarnation is destroyed (and
            // handed back first if need be) when the restart is due.
            return Phase::RestartAt(at);
        }
        match self.attach().await {
            Attach::Attached(generation) => {
                self.report(Outcome::Recovered);
                Phase::Watch { generation }
            }
            Attach::NeverStarted => {
                if self.task.kill.is_cancelled() {
                    self.task
                        .event(TaskEventKind::Killed, "task stopped before it was started");
                    return self.finish().await;
                }
                self.task.event(
                    TaskEventKind::Recovered,
                    format!(
                        "driver {} never started the task before the agent stopped; starting it now",
                        self.task.driver
                    ),
                );
                Phase::Start { restart: false }
            }
            Attach::Lost(why) => self.lost(why).await,
        }
    }

    /// Make the driver's current process know the task: `RecoverTask` with the stored
    /// handle (or a probe by id when there is none). Waits for a driver that is away.
    async fn attach(&mut self) -> Attach {
        let mut poll = MISSING_DRIVER_POLL.0;
        let mut stuck = STUCK_POLL.0;
        let mut retries = RETRY_PAUSES.to_vec();
        loop {
            if self.task.destroyed.load(Ordering::SeqCst) {
                return Attach::Lost("the task was destroyed".into());
            }
            let name = self.task.driver.clone();
            let Some(driver) = self.mgr.drivers.driver(&name) else {
                self.task.failure(format!(
                    "driver {name} is not loaded; the task is kept and recovered once it is"
                ));
                self.task.save(&self.mgr.store).await;
                self.report(Outcome::Waiting);
                tokio::time::sleep(poll).await;
                poll = (poll * 2).min(MISSING_DRIVER_POLL.1);
                continue;
            };
            let mut generation = driver.generation();
            let seen = *generation.borrow_and_update();
            let permit = self.mgr.recovery_slots.clone().acquire_owned().await.ok();
            let ops = self.task.ops.lock().await;
            let (handle, probe) = {
                let rec = self.task.rec();
                match &rec.handle {
                    Some(h) => (h.clone(), false),
                    None => (probe_handle(&rec), true),
                }
            };
            let answer = tokio::time::timeout(
                self.mgr.recover_timeout,
                driver.recover_task(handle.clone()),
            )
            .await;
            match answer {
                Ok(Ok(())) => {
                    if probe {
                        // StartTask had reached the driver: this is the end of that start.
                        let attributes = poststart(&self.mgr.hooks, &*driver, &handle, None).await;
                        started(&self.task, handle, attributes, false);
                    }
                    let pid = self.task.rec().view.attributes.get("pid").cloned();
                    self.task.event(
                        TaskEventKind::Recovered,
                        match pid {
                            Some(pid) => format!("task recovered by driver {name} (pid {pid})"),
                            None => format!("task recovered by driver {name}"),
                        },
                    );
                    self.mgr.attached(&self.task, seen);
                    if probe {
                        // The handle is new: it must be durable before anything else.
                        self.task.save(&self.mgr.store).await;
                    }
                    // Otherwise only the Recovered event is new: it is written with the
                    // task's next change, so that recovering 1000 tasks costs 1000
                    // RPCs, not 1000 synchronous disk commits. A crash before then
                    // loses nothing but that event.
                    drop(ops);
                    drop(permit);
                    self.send_pending_stop(driver);
                    return Attach::Attached(seen);
                }
                Ok(Err(DriverError::NotFound(_))) if probe => return Attach::NeverStarted,
                answer if driver.on_probation(seen) => {
                    // A new instance still on probation (a hand-over in progress)
                    // refused the task, failed on it, or did not answer: the old
                    // instance still runs it, and the catalog rolls the hand-over back
                    // when told. `attached` stays as it is (on the old instance). Wait
                    // for that (a generation change), or for the probation to end,
                    // then ask again.
                    drop(ops);
                    drop(permit);
                    let why = match answer {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!(
                            "no answer to RecoverTask within {}",
                            human(self.mgr.recover_timeout)
                        ),
                    };
                    tracing::warn!(task = %self.task.id, plugin = %name, "the new instance of the driver did not take the task during a hand-over: {why}");
                    self.mgr.refused_by(&self.task, seen, why);
                    while *generation.borrow_and_update() == seen && driver.on_probation(seen) {
                        tokio::select! {
                            changed = generation.changed() => if changed.is_err() { break },
                            () = tokio::time::sleep(PROBATION_POLL) => {}
                        }
                    }
                    continue;
                }
                Ok(Err(DriverError::Unavailable(why))) => {
                    self.task.attached.store(false, Ordering::SeqCst);
                    self.task.failure(format!(
                        "driver {name} is unavailable ({why}); the task is recovered once the \
                         driver is relaunched"
                    ));
                    self.task.save(&self.mgr.store).await;
                    drop(ops);
                    drop(permit);
                    self.report(Outcome::Waiting);
                    if generation.changed().await.is_err() {
                        tokio::time::sleep(poll).await;
                    }
                    continue;
                }
                Ok(Err(e)) if retryable(&e) && !retries.is_empty() => {
                    // RecoverTask is idempotent; see `RETRY_PAUSES`.
                    drop(ops);
                    drop(permit);
                    tracing::debug!(task = %self.task.id, "RecoverTask failed, retrying: {e}");
                    tokio::time::sleep(retries.remove(0)).await;
                    continue;
                }
                Ok(Err(e)) if refuses_task(&e) => {
                    return Attach::Lost(format!("driver {name} could not recover the task: {e}"));
                }
                answer => {
                    // The driver did not say the task is gone: it timed out, failed, or
                    // found the executor alive but unreachable. The task may well be
                    // running, so it stays running (a stop is sent once it is
                    // recovered) and recovery is retried, ever more slowly.
                    drop(ops);
                    drop(permit);
                    let why = match answer {
                        Ok(Err(e)) => format!("driver {name} could not recover the task: {e}"),
                        _ => format!(
                            "driver {name} did not answer RecoverTask within {}",
                            human(self.mgr.recover_timeout)
                        ),
                    };
                    self.task.attached.store(false, Ordering::SeqCst);
                    self.task.failure(format!(
                        "{why}; the task may still be running: it is kept and recovery is retried"
                    ));
                    self.task.save(&self.mgr.store).await;
                    self.report(Outcome::Waiting);
                    tokio::time::sleep(stuck).await;
                    stuck = (stuck * 2).min(STUCK_POLL.1);
                    retries = RETRY_PAUSES.to_vec();
                    continue;
                }
            }
        }
    }

    /// A user's stop that arrived while the driver did not know the task: send it now.
    fn send_pending_stop(&mut self, driver: Arc<dyn TaskDriver>) {
        if self.stop_sent {
            return;
        }
        let Some(kill) = self.task.rec().kill.clone() else {
            return;
        };
        self.stop_sent = true;
        let id = self.task.id.clone();
        // In the background: the runner must be waiting for the exit meanwhile.
        tokio::spawn(async move {
            // Checked when the stop was asked for; a record edited since is refused here.
            let sent = match Signal::parse_or_default(&kill.signal) {
                Ok(signal) => driver.stop_task(&id, kill.timeout, signal).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = sent {
                tracing::warn!(task = %id, "stopping the recovered task failed: {e}");
            }
        });
    }

    async fn watch(&mut self, mut attached_on: u64) -> Phase {
        let mut retries = RETRY_PAUSES.to_vec();
        // Pause before attaching again after WaitTask kept failing in transport while
        // RecoverTask succeeds: doubled each time (up to a minute), so that a driver in
        // that state costs two events a minute, not two every second and a half.
        let mut unreachable_pause = STUCK_POLL.0;
        loop {
            let driver = match self.mgr.drivers.driver(&self.task.driver) {
                Some(d) if *d.generation().borrow() == attached_on => d,
                // No driver, or its process was replaced since the task was attached:
                // the new one has to be told about the task before it can answer for it.
                _ => {
                    match self.attach().await {
                        Attach::Attached(g) => {
                            attached_on = g;
                            retries = RETRY_PAUSES.to_vec();
                        }
                        Attach::NeverStarted => return self.lost_handle().await,
                        Attach::Lost(why) => return self.lost(why).await,
                    }
                    continue;
                }
            };
            let mut replaced = driver.generation();
            let waited = tokio::select! {
                waited = driver.wait_task(&self.task.id) => waited,
                () = async {
                    if replaced.wait_for(|g| *g != attached_on).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                } => {
                    // A new instance replaced the driver's (an upgrade, or a relaunch):
                    // hand the task over to it now rather than when the old one goes
                    // away; the plugin's upgrade waits for every task to move.
                    continue;
                }
            };
            match waited {
                Ok(result) => return self.exited(result).await,
                Err(DriverError::Unavailable(_)) => {
                    // The plugin process died; the task did not. `attach` waits for the
                    // relaunch, says so in the events, and hands the task back.
                    self.task.attached.store(false, Ordering::SeqCst);
                    match self.attach().await {
                        Attach::Attached(g) => {
                            attached_on = g;
                            retries = RETRY_PAUSES.to_vec();
                        }
                        Attach::NeverStarted => return self.lost_handle().await,
                        Attach::Lost(why) => return self.lost(why).await,
                    }
                }
                Err(DriverError::NotFound(_)) if *driver.generation().borrow() != attached_on => {}
                Err(e) if retryable(&e) && !retries.is_empty() => {
                    // A plugin killed mid-call breaks the connection before its exit is
                    // noticed; WaitTask is idempotent, so ask again: a dead plugin then
                    // answers Unavailable and the task is reattached.
                    tracing::debug!(task = %self.task.id, "WaitTask failed, retrying: {e}");
                    let pause = retries.remove(0);
                    tokio::time::sleep(pause).await;
                }
                Err(e @ DriverError::Transport(_)) => {
                    // Still no answer: the driver cannot be reached, which says nothing
                    // about the task. Attach again, which keeps the task and retries
                    // until the driver answers for it.
                    self.task.attached.store(false, Ordering::SeqCst);
                    self.task.failure(format!(
                        "waiting for the task through driver {} failed: {e}; the task may \
                         still be running: it is kept and recovered once the driver answers",
                        self.task.driver
                    ));
                    tokio::time::sleep(unreachable_pause).await;
                    unreachable_pause = (unreachable_pause * 2).min(STUCK_POLL.1);
                    match self.attach().await {
                        Attach::Attached(g) => {
                            attached_on = g;
                            retries = RETRY_PAUSES.to_vec();
                        }
                        Attach::NeverStarted => return self.lost_handle().await,
                        Attach::Lost(why) => return self.lost(why).await,
                    }
                }
                Err(e) => {
                    return self
                        .lost(format!(
                            "waiting for the task through driver {} failed: {e}",
                            self.task.driver
                        ))
                        .await;
                }
            }
        }
    }

    async fn lost_handle(&mut self) -> Phase {
        self.lost(format!(
            "driver {} no longer knows the task",
            self.task.driver
        ))
        .await
    }

    /// An incarnation ended: record it, then apply the restart policy.
    async fn exited(&mut self, result: ExitResult) -> Phase {
        self.ended(result, true).await
    }

    /// An incarnation could not be started: the restart policy decides, as for a
    /// failed exit (the `DriverFailure` event already said why).
    async fn start_failed(&mut self, why: String) -> Phase {
        let result = ExitResult::unknown(why);
        self.ended(result, false).await
    }

    async fn ended(&mut self, result: ExitResult, ran: bool) -> Phase {
        self.task.attached.store(false, Ordering::SeqCst);
        if !result.successful() {
            crate::metrics::metrics().task_failures.inc();
        }
        {
            let mut rec = self.task.rec();
            let v = &mut rec.view;
            // An exit the driver could not read has no code; `error` says why.
            v.exit_code = (!unknown_exit(&result)).then_some(result.exit_code);
            v.signal = (result.signal != 0).then_some(result.signal);
            v.oom_killed = result.oom_killed;
            v.error = result.err.clone();
        }
        if ran {
            self.task
                .event(TaskEventKind::Terminated, describe(&result));
        }
        let spec = self.task.rec().spec.clone();
        for hook in &self.mgr.hooks {
            hook.exited(&spec, &result).await;
        }
        if self.task.destroyed.load(Ordering::SeqCst) {
            return Phase::Done;
        }
        if self.task.kill.is_cancelled() {
            self.task.event(TaskEventKind::Killed, "task stopped");
            return self.finish().await;
        }
        let now = SystemTime::now();
        if let Some(why) = self.task.take_restart_wanted() {
            // The agent stopped it to restart it (a failing check): at once, whatever
            // the policy says; the restart window is not used up by it.
            {
                let mut rec = self.task.rec();
                rec.restart.restart_at = Some(now);
                rec.view.state = TaskLifecycle::Pending;
                rec.view.restart_at = Some(rfc3339(now));
            }
            self.task
                .event(TaskEventKind::Restarting, format!("restarting now: {why}"));
            self.task.save(&self.mgr.store).await;
            return Phase::RestartAt(now);
        }
        let window = self.task.rec().restart.window.clone();
        match decide(&self.task.settings.policy, &window, now, &result) {
            Decision::Complete => self.finish().await,
            Decision::Fail { message } => {
                // Without a `restart` section nobody expects restarts: no event to say so.
                if self.task.rec().request.restart.is_some() {
                    self.task.event(TaskEventKind::NotRestarting, message);
                }
                self.finish().await
            }
            Decision::Restart {
                wait,
                window,
                message,
            } => {
                // Policy durations are capped (a year), so this cannot overflow; should
                // it anyway, restart at once rather than panic.
                let at = now.checked_add(wait).unwrap_or(now);
                {
                    let mut rec = self.task.rec();
                    rec.restart.window = window;
                    rec.restart.restart_at = Some(at);
                    rec.view.state = TaskLifecycle::Pending;
                    rec.view.restart_at = Some(rfc3339(at));
                }
                self.task.event(TaskEventKind::Restarting, message);
                self.task.save(&self.mgr.store).await;
                Phase::RestartAt(at)
            }
        }
    }

    async fn restart_at(&mut self, at: SystemTime) -> Phase {
        self.report(Outcome::Recovered);
        let wait = at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        tokio::select! {
            () = tokio::time::sleep(wait) => Phase::Start { restart: true },
            () = self.task.kill.cancelled() => {
                if self.task.destroyed.load(Ordering::SeqCst) {
                    return Phase::Done;
                }
                self.task.event(TaskEventKind::Killed, "task stopped; its restart is cancelled");
                self.finish().await
            }
        }
    }

    /// Start a new incarnation (a restart, or a pending task the driver never saw).
    async fn start(&mut self, restart: bool) -> Phase {
        let ops = self.task.ops.lock().await;
        if self.task.kill.is_cancelled() {
            drop(ops);
            if self.task.destroyed.load(Ordering::SeqCst) {
                return Phase::Done;
            }
            self.task.event(
                TaskEventKind::Killed,
                "task stopped before it was started again",
            );
            return self.finish().await;
        }
        let name = self.task.driver.clone();
        let Some(driver) = self.mgr.drivers.driver(&name) else {
            drop(ops);
            let why = format!("cannot start the task: driver {name} is not loaded");
            self.task.failure(why.clone());
            return self.start_failed(why).await;
        };
        let generation = *driver.generation().borrow();
        if restart {
            self.destroy_previous(&*driver).await;
        }
        let mut spec = {
            let mut rec = self.task.rec();
            rec.handle = None;
            rec.restart.restart_at = None;
            rec.view.state = TaskLifecycle::Pending;
            rec.view.restart_at = None;
            rec.spec.clone()
        };
        // From here a crash leaves a pending task without a handle: recovery asks the
        // driver by id and starts it only if it never was.
        self.task.save(&self.mgr.store).await;
        for hook in &self.mgr.hooks {
            if let Err(e) = hook.prestart(&mut spec).await {
                drop(ops);
                let why = format!("cannot start the task: {} hook: {e}", hook.name());
                self.task.failure(why.clone());
                return self.start_failed(why).await;
            }
        }
        let answer = start_in_time(&self.mgr, &*driver, &name, spec).await;
        let answer = match answer {
            Err(e) if maybe_started(&e) => match probe(&self.mgr, &self.task, &*driver).await {
                Probe::Started(handle) => Ok((*handle, None)),
                Probe::NeverStarted => Err(e),
                Probe::Unknown(why) => {
                    // It may or may not have been started: ask the driver again until
                    // it can say.
                    self.task.failure(format!(
                        "driver {name} failed while starting the task ({e}) and cannot say \
                         whether it started ({why})"
                    ));
                    self.task.save(&self.mgr.store).await;
                    drop(ops);
                    return Phase::Recover;
                }
            },
            other => other,
        };
        match answer {
            Ok((handle, reported)) => {
                let attributes = poststart(&self.mgr.hooks, &*driver, &handle, reported).await;
                started(&self.task, handle, attributes, restart);
                let m = crate::metrics::metrics();
                m.task_starts.inc();
                if restart {
                    m.task_restarts.inc();
                }
                self.mgr.attached(&self.task, generation);
                self.task.save(&self.mgr.store).await;
                drop(ops);
                self.report(Outcome::Started);
                Phase::Watch { generation }
            }
            Err(DriverError::AlreadyExists(why)) if self.probes_left > 0 => {
                // The driver has the id after all: a StartTask sent by the agent before
                // it died finished after our probe asked. Take that one over.
                self.probes_left -= 1;
                tracing::info!(task = %self.task.id, "StartTask: {why}; recovering the existing task");
                drop(ops);
                Phase::Recover
            }
            Err(e) => {
                drop(ops);
                let why = format!("driver {name} could not start the task: {e}");
                self.task.failure(why.clone());
                self.start_failed(why).await
            }
        }
    }

    /// Remove the driver's state of the previous incarnation so that the same id can
    /// be started again. A driver process that never knew it (it was relaunched since)
    /// gets the old handle back first, so that its executor is cleaned up too.
    async fn destroy_previous(&self, driver: &dyn TaskDriver) {
        let id = &self.task.id;
        let destroy = || tokio::time::timeout(self.mgr.rpc_timeout, driver.destroy_task(id, true));
        match destroy().await {
            Ok(Ok(())) => {}
            Ok(Err(DriverError::NotFound(_))) => {
                let handle = self.task.rec().handle.clone();
                if let Some(handle) = handle
                    && let Ok(Ok(())) =
                        tokio::time::timeout(self.mgr.recover_timeout, driver.recover_task(handle))
                            .await
                    && let Ok(Err(e)) = destroy().await
                {
                    tracing::warn!(task = %id, "destroying the previous incarnation failed: {e}");
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(task = %id, "destroying the previous incarnation failed: {e}");
            }
            Err(_) => tracing::warn!(task = %id, "destroying the previous incarnation timed out"),
        }
    }

    /// The driver cannot account for the task: it is dead, with the cause. It is not
    /// restarted, because it may still be running where nobody can see it.
    async fn lost(&mut self, why: String) -> Phase {
        self.task.attached.store(false, Ordering::SeqCst);
        self.task.failure(why.clone());
        {
            let mut rec = self.task.rec();
            rec.view.exit_code = None;
            rec.view.error = Some(why);
        }
        self.finish().await
    }

    /// Dead for good: record it durably, then wake the waiters.
    async fn finish(&mut self) -> Phase {
        {
            let mut rec = self.task.rec();
            rec.restart.restart_at = None;
            rec.view.state = TaskLifecycle::Dead;
            rec.view.restart_at = None;
            rec.view.finished_at = Some(now());
        }
        self.task.save(&self.mgr.store).await;
        self.mgr.ended(&self.task);
        let spec = self.task.rec().spec.clone();
        for hook in &self.mgr.hooks {
            hook.stop(&spec).await;
        }
        self.report(Outcome::Dead);
        Phase::Done
    }
}
