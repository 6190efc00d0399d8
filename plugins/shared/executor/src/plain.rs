//! The engine of drivers whose task is one plain host process owned by its executor,
//! with no isolation: rawexec (a command) and qemu (a `qemu-system-*` process). It
//! starts, follows, stops, signals, recovers, inspects and destroys such tasks, and
//! kills what is left of one whose executor died (proven by its cgroup, or pidfd and
//! start time) before its end is reported, so that it is never restarted beside a
//! running copy. Written once: the drivers differ in how they validate a task's
//! config and build its [`LaunchSpec`], not in how they follow it.
//!
//! A driver holds a [`PlainEngine<X>`], where `X` is what it keeps per task beside
//! the executor (rawexec: the environment for `ExecTask`; qemu: the QMP socket), and
//! forwards the trait's calls to it:
//!
//! ```no_run
//! # async fn demo(spec: drover_plugin_sdk::TaskSpec) -> Result<(), drover_plugin_sdk::DriverError> {
//! use drover_executor::plain::PlainEngine;
//! use drover_executor::LaunchSpec;
//! let engine: PlainEngine<()> = PlainEngine::new("mydriver", 1);
//! let how = LaunchSpec::new(spec.id.clone(), "/bin/sleep");
//! let handle = engine.start(spec, how, ()).await?;
//! let exit = engine.wait(&handle.spec.id).await?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use drover_plugin_sdk::store::{TaskEvents, TaskStore};
use drover_plugin_sdk::{
    AgentInfo, DriverError, ExitResult, Signal, TaskEvent, TaskHandle, TaskSpec, TaskStats,
    TaskStatus,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::task::{self, ExecutorTask, Watched};
use crate::{ExecutorHandle, ExitInfo, LaunchSpec, cgroup, procfs};

/// How old an empty task cgroup must be before a plugin start removes it (see
/// [`cgroup::sweep_plain`]).
const CGROUP_SWEEP_AGE: Duration = Duration::from_secs(60);

/// What a plain task's handle carries: enough to reconnect to its executor, and to
/// prove which process was the task's if the executor died.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleState {
    /// The task's executor directory (socket, `exit.json`).
    pub executor_dir: PathBuf,
    /// The task's main process.
    pub pid: u32,
    /// Its process group (the task's processes).
    pub pgid: u32,
    /// Its start time in ticks since boot, to tell it from a later process with the
    /// same pid.
    pub start_time: u64,
    /// The executor's pid.
    pub executor_pid: u32,
}

/// Says how a task ended, given its result (`None`: nothing to add). See
/// [`PlainTask::set_exit_note`].
pub type ExitNote = Box<dyn Fn(&ExitResult) -> Option<String> + Send + Sync>;

/// One task a plain driver tracks: its executor, the shared bookkeeping, and the
/// driver's own facts `X`.
pub struct PlainTask<X> {
    /// What every executor-backed driver keeps: identity, exit result, stop timeout.
    pub base: ExecutorTask,
    /// The task's executor.
    pub exec: ExecutorHandle,
    /// The driver's own per-task facts.
    pub extra: X,
    exit_note: Mutex<Option<ExitNote>>,
}

impl<X> PlainTask<X> {
    fn new(id: String, name: String, exec: ExecutorHandle, extra: X) -> Self {
        PlainTask {
            base: ExecutorTask::new(id, name, exec.info().started_at),
            exec,
            extra,
            exit_note: Mutex::new(None),
        }
    }

    /// The task's main process.
    pub fn pid(&self) -> u32 {
        self.exec.info().pid
    }

    /// What the task's handle carries.
    pub fn handle_state(&self) -> HandleState {
        let info = self.exec.info();
        HandleState {
            executor_dir: self.exec.dir().to_owned(),
            pid: info.pid,
            pgid: info.pgid,
            start_time: info.start_time,
            executor_pid: info.executor_pid,
        }
    }

    /// InspectTask's answer.
    pub fn status(&self) -> TaskStatus {
        let info = self.exec.info();
        self.base
            .status()
            .with_attribute("pid", info.pid.to_string())
            .with_attribute("pgid", info.pgid.to_string())
            .with_attribute("executor_pid", info.executor_pid.to_string())
            .with_attribute("executor_dir", self.exec.dir().display().to_string())
    }

    /// A resource usage sample of the main process.
    pub fn stats(&self) -> Result<TaskStats, DriverError> {
        self.base.ensure_running()?;
        let pid = self.pid();
        let stat = procfs::read_stat(pid)
            .map_err(|e| DriverError::Internal(format!("reading /proc/{pid}/stat: {e}")))?;
        let rss = procfs::read_vm_rss(pid).unwrap_or(0);
        let cpu_user = procfs::ticks(stat.utime);
        let cpu_system = procfs::ticks(stat.stime);
        let cpu_percent = self.base.cpu_percent(cpu_user + cpu_system);
        Ok(TaskStats::default()
            .with_memory_rss_bytes(rss)
            .with_cpu_time(cpu_user, cpu_system)
            .with_cpu_percent(cpu_percent))
    }

    /// Say how the task ended once it does: whoever records the exit (the watcher or
    /// a stop) puts `note`'s answer in the result's `err`, unless it has one already,
    /// or, for a clean exit (code 0, no signal), in a task event instead: the agent
    /// reads `err` beside code 0 and no signal as "the driver could not tell how the
    /// task ended" and drops the exit code. For ends the exit status alone does not
    /// explain (qemu exiting 0 because the guest powered off, or killed because it did
    /// not). The last note set wins.
    pub fn set_exit_note(
        &self,
        note: impl Fn(&ExitResult) -> Option<String> + Send + Sync + 'static,
    ) {
        *self
            .exit_note
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(note));
    }

    /// Record how the task ended (with its note, see [`Self::set_exit_note`]), once.
    pub fn record_exit(&self, events: &TaskEvents, mut exit: ExitInfo) -> bool {
        let note = match &*self
            .exit_note
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(note) if exit.result.err.is_none() => note(&exit.result),
            _ => None,
        };
        let clean = exit.result.exit_code == 0 && exit.result.signal == 0;
        let as_event = match note {
            Some(note) if clean => Some(note),
            Some(note) => {
                exit.result.err = Some(note);
                None
            }
            // No note: an err the result has (a lost executor's) stays.
            None => None,
        };
        let recorded = self.base.record_exit(events, exit);
        if recorded && let Some(note) = as_event {
            events.send(&self.base.id, note);
        }
        recorded
    }
}

/// Starts and follows plain tasks, each owned by its own executor and the leader of
/// its own process group, in a cgroup of its own where the host has cgroups.
pub struct PlainEngine<X> {
    plugin: &'static str,
    handle_version: u32,
    store: TaskStore<PlainTask<X>>,
    events: TaskEvents,
    /// Where executors live: `<plugin_state_dir>/<plugin>` once SetConfig came.
    state_dir: Mutex<PathBuf>,
    /// The cgroup hierarchy tasks get a cgroup of their own in; `None` where the host
    /// has none we can use (then a task is its process group, which `setsid` leaves).
    /// Found on first use (SetConfig), not in `new`: reading the mounts is no part of
    /// the plugin's launch before its handshake.
    cgroups: std::sync::OnceLock<Option<cgroup::Version>>,
    /// The plugin config's `no_cgroups`.
    no_cgroups: AtomicBool,
}

impl<X: Send + Sync + 'static> PlainEngine<X> {
    /// An engine with no tasks for the plugin named `plugin`, whose handles carry
    /// [`HandleState`] as version `handle_version`.
    pub fn new(plugin: &'static str, handle_version: u32) -> Self {
        PlainEngine {
            plugin,
            handle_version,
            store: TaskStore::default(),
            events: TaskEvents::default(),
            state_dir: Mutex::new(crate::state_dir(Path::new(""), plugin)),
            cgroups: std::sync::OnceLock::new(),
            no_cgroups: AtomicBool::new(false),
        }
    }

    /// Tell subscribers about task `task_id`.
    pub fn event(&self, task_id: &str, message: String) {
        self.events.send(task_id, message);
    }

    /// The task events, to send to.
    pub fn events(&self) -> &TaskEvents {
        &self.events
    }

    /// The task event feed (`TaskEvents` RPC).
    pub fn subscribe(&self) -> broadcast::Receiver<TaskEvent> {
        self.events.subscribe()
    }

    /// The hierarchy new tasks get their own cgroup in, if any.
    pub fn task_cgroups(&self) -> Option<cgroup::Version> {
        self.cgroup_support()
            .filter(|_| !self.no_cgroups.load(Ordering::SeqCst))
    }

    fn cgroup_support(&self) -> Option<cgroup::Version> {
        *self.cgroups.get_or_init(cgroup::plain_support)
    }

    /// Where executors live.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The executor directory task `task_id` gets (or has).
    pub fn executor_dir(&self, task_id: &str) -> PathBuf {
        crate::task_dir(&self.state_dir(), task_id)
    }

    /// SetConfig's part: executors under the agent's plugin state directory, tasks in
    /// cgroups of their own unless `no_cgroups`; sweeps empty task cgroups left by
    /// executors killed from outside (in the background, best effort).
    pub async fn configure(&self, agent: &AgentInfo, no_cgroups: bool) -> Result<(), DriverError> {
        self.no_cgroups.store(no_cgroups, Ordering::SeqCst);
        let dir = crate::state_dir(&agent.plugin_state_dir, self.plugin);
        crate::prepare_state_dir(&dir)?;
        if let Some(version) = self.cgroup_support() {
            tokio::task::spawn_blocking(move || {
                let removed = cgroup::sweep_plain(version, CGROUP_SWEEP_AGE);
                if removed > 0 {
                    tracing::info!(removed, "removed empty task cgroups left behind");
                }
            });
        }
        *self
            .state_dir
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = dir;
        Ok(())
    }

    /// Start `spec` as `how` (its `own_cgroup` is set here) with the driver's `extra`;
    /// the task's handle.
    pub async fn start(
        &self,
        spec: TaskSpec,
        mut how: LaunchSpec,
        extra: X,
    ) -> Result<TaskHandle, DriverError> {
        let reservation = self.store.reserve(&spec.id)?;
        how.own_cgroup = self.task_cgroups().is_some();
        let exec = crate::launch(&self.state_dir(), &how).await?;
        let task = Arc::new(PlainTask::new(
            spec.id.clone(),
            spec.name.clone(),
            exec,
            extra,
        ));
        let state = task.handle_state();
        reservation.commit(task.clone());
        self.watch(task);
        self.event(&spec.id, format!("task started (pid {})", state.pid));
        TaskHandle::new(spec, self.handle_version, &state)
    }

    /// The task `task_id`.
    pub fn get(&self, task_id: &str) -> Result<Arc<PlainTask<X>>, DriverError> {
        self.store.get(task_id)
    }

    /// WaitTask: until the task has exited.
    pub async fn wait(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        Ok(self.get(task_id)?.base.wait().await)
    }

    /// StopTask: `sig` to the task's group, SIGKILL after `timeout`.
    pub async fn stop(
        &self,
        task_id: &str,
        timeout: Duration,
        sig: Signal,
    ) -> Result<(), DriverError> {
        let task = self.get(task_id)?;
        if !task.base.begin_stop(&self.events, sig, timeout) {
            return Ok(()); // it has exited already
        }
        let exit = task.exec.stop(sig, timeout).await?;
        task.record_exit(&self.events, exit);
        Ok(())
    }

    /// SignalTask.
    pub async fn signal(&self, task_id: &str, sig: Signal) -> Result<(), DriverError> {
        let task = self.get(task_id)?;
        task.base.ensure_running()?;
        task.exec.signal(sig).await?;
        self.event(task_id, format!("sent {sig}"));
        Ok(())
    }

    /// DestroyTask: refused while it runs unless `force`; kills the group if it still
    /// runs and removes the executor's directory.
    pub async fn destroy(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.get(task_id)?;
        if task.base.running() && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} is still running; stop it first or destroy it with force"
            )));
        }
        task.exec.destroy().await?;
        self.store.remove(task_id);
        Ok(())
    }

    /// InspectTask.
    pub fn inspect(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        Ok(self.get(task_id)?.status())
    }

    /// TaskStats.
    pub fn stats(&self, task_id: &str) -> Result<TaskStats, DriverError> {
        self.get(task_id)?.stats()
    }

    /// RecoverTask: reconnect to the task's executor and follow it again, with the
    /// driver's `extra` for it (made from the handle and the executor). A task whose
    /// executor died meanwhile is killed (by proof) before it is reported gone.
    pub async fn recover(
        &self,
        handle: TaskHandle,
        extra: impl FnOnce(&TaskHandle, &ExecutorHandle) -> X,
    ) -> Result<(), DriverError> {
        let id = handle.spec.id.clone();
        if task::settle_start(&self.store, &id).await {
            // Already tracked: the host recovers after its own restart while this
            // plugin process lived on.
            return Ok(());
        }
        let dir = self.recovery_dir(&handle)?;
        let reservation = self.store.reserve(&id)?;
        let exec = match ExecutorHandle::connect(&dir).await {
            Ok(exec) => exec,
            Err(DriverError::NotFound(why)) if dir.exists() => {
                // The executor died without a result while the host was away: the task
                // may run on, unmanaged. Kill it (by proof) before saying it is gone,
                // so that nothing starts it again beside a running copy.
                let done = self.kill_unrecoverable(&handle, &dir).await?;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(DriverError::NotFound(format!("{why}; {done}")));
            }
            Err(DriverError::NotFound(why)) => {
                // No directory, but its cgroup may still hold a copy (a start of the
                // same id refused beside it removed the directory): empty it too.
                let d = dir.clone();
                let done = tokio::task::spawn_blocking(move || crate::lost::empty_plain_cgroup(&d))
                    .await
                    .map_err(DriverError::internal)?
                    .map_err(DriverError::Internal)?;
                return Err(DriverError::NotFound(match done {
                    Some(done) => format!("{why}; {done}"),
                    None => why,
                }));
            }
            Err(e) => return Err(e),
        };
        if exec.info().task_id != id {
            return Err(DriverError::InvalidConfig(format!(
                "the executor in {} runs task {:?}, not {id:?}",
                dir.display(),
                exec.info().task_id
            )));
        }
        let extra = extra(&handle, &exec);
        let exited = !exec.info().running();
        let pid = exec.info().pid;
        let task = Arc::new(PlainTask::new(
            id.clone(),
            handle.spec.name.clone(),
            exec,
            extra,
        ));
        reservation.commit(task.clone());
        // An exited task's result is collected the same way: its wait answers at once.
        self.watch(task);
        self.event(
            &id,
            if exited {
                format!("task recovered (pid {pid}); it had exited meanwhile")
            } else {
                format!("task recovered (pid {pid})")
            },
        );
        Ok(())
    }

    /// Follow `task` until it exits: a `wait` held open on its executor. If the
    /// executor dies without a result, what is left of the task is killed (see
    /// [`kill_lost`]) before its end, whose status is unknown, is reported.
    fn watch(&self, task: Arc<PlainTask<X>>) {
        let events = self.events.clone();
        tokio::spawn(async move {
            let exit = match task::watch(&task.base, &task.exec, &events).await {
                Watched::Exited(exit) => exit,
                Watched::Recorded => return,
                Watched::ExecutorLost(error) => match kill_lost(&task, &events, &error).await {
                    Some(exit) => exit,
                    None => return,
                },
            };
            task.record_exit(&events, exit);
        });
    }

    /// Kill what is left of a task whose executor in `dir` died without a result,
    /// found at recovery: its cgroup, else its main process proven by the handle's
    /// pid and start time. An error while a copy may still run.
    async fn kill_unrecoverable(
        &self,
        handle: &TaskHandle,
        dir: &Path,
    ) -> Result<String, DriverError> {
        let state = (handle.version == self.handle_version && !handle.driver_state.is_empty())
            .then(|| handle.decode_state::<HandleState>(self.handle_version).ok())
            .flatten();
        match state {
            Some(s) => crate::lost::kill_lost_task_async(dir, s.pid, s.pgid, s.start_time).await,
            None => {
                // No handle: the host never got the start-up reply. The cgroup, or the
                // proof the executor left in its lock file, tells which processes were
                // the task's. Without either, keep the directory and say so (the host
                // keeps the task and retries, rather than start it again beside a copy
                // that may run).
                if crate::files::lock_state(dir).held() {
                    return Err(DriverError::FailedPrecondition(format!(
                        "task {}: its executor in {} is alive but cannot be reached; it \
                         owns the task, which is recovered once it answers",
                        handle.spec.id,
                        dir.display()
                    )));
                }
                let d = dir.to_owned();
                tokio::task::spawn_blocking(move || crate::lost::kill_unreported_task(&d))
                    .await
                    .map_err(DriverError::internal)?
                    .map_err(|why| {
                        DriverError::FailedPrecondition(format!(
                            "task {}: {why}: find and kill them (their working directory is \
                             the task directory), then remove {}",
                            handle.spec.id,
                            dir.display()
                        ))
                    })
            }
        }
    }

    /// The executor directory a recovery handle points at.
    fn recovery_dir(&self, handle: &TaskHandle) -> Result<PathBuf, DriverError> {
        let id = &handle.spec.id;
        if handle.driver_state.is_empty() {
            // The host never got this task's StartTask reply: find it by id.
            return Ok(self.executor_dir(id));
        }
        if handle.version == self.handle_version {
            return Ok(handle
                .decode_state::<HandleState>(self.handle_version)?
                .executor_dir);
        }
        Err(DriverError::InvalidConfig(format!(
            "task {id} has a handle of version {}; this {} knows version {}",
            handle.version, self.plugin, self.handle_version
        )))
    }
}

/// The executor of `task` died without reporting its end: kill what is left of the
/// task, proven to be it (its cgroup, else pidfd and start time), and only then return
/// its (unknown) end. Until the kill succeeds the task stays running: reporting its
/// end would let the host's restart policy start a second copy beside the first.
/// `None` if someone else recorded the end meanwhile.
async fn kill_lost<X>(
    task: &PlainTask<X>,
    events: &TaskEvents,
    error: &DriverError,
) -> Option<ExitInfo> {
    let executor_pid = task.exec.info().executor_pid;
    let mut warned = false;
    loop {
        if !task.base.running() {
            return None;
        }
        match task.exec.kill_lost_task().await {
            Ok(done) => {
                return Some(task::unknown_exit(format!(
                    "lost the task's executor (pid {executor_pid}: {error}), so its exit \
                     status is unknown; {done}"
                )));
            }
            Err(e) => {
                if !warned {
                    events.send(
                        &task.base.id,
                        format!(
                            "lost the task's executor (pid {executor_pid}), and cannot kill \
                             what is left of the task yet: {e}; retrying, and the task is not \
                             reported ended while a copy of it may run"
                        ),
                    );
                    warned = true;
                }
                tokio::time::sleep(task::WATCH_RETRY).await;
            }
        }
    }
}

/// The [`DriverPlugin`](drover_plugin_sdk::DriverPlugin) methods a plain driver answers
/// from its [`PlainEngine`] unchanged: `wait_task`, `signal_task`, `destroy_task`,
/// `inspect_task`, `task_stats` and `task_events`. Expand it inside the driver's
/// `impl DriverPlugin`, naming the engine's field; write the others (and any of these
/// the driver answers differently, leaving it out of the list) by hand. The expansion
/// names `drover_plugin_sdk` and `tokio`, which every driver crate depends on.
///
/// ```text
/// impl DriverPlugin for MyDriver {
///     // ... info, capabilities, set_config, fingerprint, start_task, stop_task, recover_task
///     drover_executor::plain_engine_calls!(engine: wait_task signal_task destroy_task task_stats task_events);
/// }
/// ```
#[macro_export]
macro_rules! plain_engine_calls {
    ($engine:ident: $($call:ident)*) => {
        $($crate::plain_engine_calls!(@one $engine $call);)*
    };
    (@one $engine:ident wait_task) => {
        async fn wait_task(
            &self,
            task_id: &str,
        ) -> ::std::result::Result<::drover_plugin_sdk::ExitResult, ::drover_plugin_sdk::DriverError>
        {
            self.$engine.wait(task_id).await
        }
    };
    (@one $engine:ident signal_task) => {
        async fn signal_task(
            &self,
            task_id: &str,
            sig: ::drover_plugin_sdk::Signal,
        ) -> ::std::result::Result<(), ::drover_plugin_sdk::DriverError> {
            self.$engine.signal(task_id, sig).await
        }
    };
    (@one $engine:ident destroy_task) => {
        async fn destroy_task(
            &self,
            task_id: &str,
            force: bool,
        ) -> ::std::result::Result<(), ::drover_plugin_sdk::DriverError> {
            self.$engine.destroy(task_id, force).await
        }
    };
    (@one $engine:ident inspect_task) => {
        async fn inspect_task(
            &self,
            task_id: &str,
        ) -> ::std::result::Result<::drover_plugin_sdk::TaskStatus, ::drover_plugin_sdk::DriverError>
        {
            self.$engine.inspect(task_id)
        }
    };
    (@one $engine:ident task_stats) => {
        async fn task_stats(
            &self,
            task_id: &str,
        ) -> ::std::result::Result<::drover_plugin_sdk::TaskStats, ::drover_plugin_sdk::DriverError>
        {
            self.$engine.stats(task_id)
        }
    };
    (@one $engine:ident task_events) => {
        fn task_events(
            &self,
        ) -> ::std::option::Option<
            ::tokio::sync::broadcast::Receiver<::drover_plugin_sdk::TaskEvent>,
        > {
            ::std::option::Option::Some(self.$engine.subscribe())
        }
    };
}
