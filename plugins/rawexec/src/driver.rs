//! The rawexec driver: the [`DriverPlugin`] impl.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use drover_executor::cgroup;
use drover_executor::task::{self, Watched};
use drover_executor::{self as executor, ExecutorHandle, LaunchSpec};
use drover_plugin_sdk::store::TaskEvents;
use drover_plugin_sdk::{
    AgentInfo, Capabilities, DriverError, DriverPlugin, ExecOutput, ExitResult, Fingerprint,
    FsIsolation, NetworkModes, PluginInfo, Signal, TaskEvent, TaskHandle, TaskSpec, TaskStats,
    TaskStatus,
};
use tokio::sync::broadcast;

use crate::config::{Launch, PluginConfig, TaskConfig};
use crate::handle::{HandleState, HandleStateV1, Task};
use crate::store::Store;

/// The driver's name.
pub const PLUGIN_NAME: &str = "rawexec";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the task handle's driver state. Version 2 names the task's executor;
/// version 1 (a bare pid, from before executors) is refused with an explanation.
pub const HANDLE_VERSION: u32 = 2;
/// How old an empty task cgroup must be before a plugin start removes it (see
/// `drover_executor::cgroup::sweep_plain`).
const CGROUP_SWEEP_AGE: Duration = Duration::from_secs(60);
/// `PATH` given to tasks whose environment does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs tasks as plain host processes, each owned by its own executor process and the
/// leader of its own process group.
pub struct RawExecDriver {
    store: Store,
    events: TaskEvents,
    /// Where executors live: `<plugin_state_dir>/rawexec` once SetConfig came.
    state_dir: Mutex<PathBuf>,
    /// The cgroup hierarchy tasks get a cgroup of their own in; `None` where the host
    /// has none we can use (then a task is its process group, which `setsid` leaves).
    cgroups: Option<cgroup::Version>,
    /// `no_cgroups` from the plugin config.
    no_cgroups: AtomicBool,
}

impl Default for RawExecDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl RawExecDriver {
    /// A driver with no tasks.
    pub fn new() -> Self {
        RawExecDriver {
            store: Store::default(),
            events: TaskEvents::default(),
            state_dir: Mutex::new(executor::state_dir(Path::new(""), PLUGIN_NAME)),
            cgroups: cgroup::plain_support(),
            no_cgroups: AtomicBool::new(false),
        }
    }

    fn event(&self, task_id: &str, message: String) {
        self.events.send(task_id, message);
    }

    /// The hierarchy new tasks get their own cgroup in, if any.
    fn task_cgroups(&self) -> Option<cgroup::Version> {
        self.cgroups
            .filter(|_| !self.no_cgroups.load(Ordering::SeqCst))
    }

    fn state_dir(&self) -> PathBuf {
        self.state_dir
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Follow `task` until it exits: a `wait` held open on its executor. If the
    /// executor dies without a result, what is left of the task is killed (see
    /// [`kill_lost`]) before its end, whose status is unknown, is reported.
    fn watch(&self, task: Arc<Task>) {
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
            task.base.record_exit(&events, exit);
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
        let state = (handle.version == HANDLE_VERSION && !handle.driver_state.is_empty())
            .then(|| handle.decode_state::<HandleState>(HANDLE_VERSION).ok())
            .flatten();
        match state {
            Some(s) => {
                drover_executor::lost::kill_lost_task_async(dir, s.pid, s.pgid, s.start_time).await
            }
            None => {
                // No handle: only the cgroup can prove which processes are the task's.
                if drover_executor::lost::nothing_can_run(dir) {
                    return Ok("nothing of the task runs (its executor died before starting it, or its cgroup is gone)".into());
                }
                let d = dir.to_owned();
                let done = tokio::task::spawn_blocking(move || {
                    drover_executor::lost::empty_plain_cgroup(&d)
                })
                .await
                .map_err(DriverError::internal)?
                .map_err(DriverError::Internal)?;
                // Without either, nothing tells which processes were the task's: keep
                // the directory and say so (the host keeps the task and retries, rather
                // than start it again beside a copy that may run).
                done.ok_or_else(|| {
                    DriverError::FailedPrecondition(format!(
                        "the executor of task {} died without a result, and neither a cgroup \
                         nor a task handle tells which processes were the task's, so it may \
                         still run: find and kill them (their working directory is the task \
                         directory), then remove {}",
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
            return Ok(executor::task_dir(&self.state_dir(), id));
        }
        match handle.version {
            HANDLE_VERSION => Ok(handle
                .decode_state::<HandleState>(HANDLE_VERSION)?
                .executor_dir),
            1 => {
                let old: HandleStateV1 = handle.decode_state(1)?;
                Err(DriverError::FailedPrecondition(format!(
                    "task {id} has a version 1 handle, made by a rawexec without executors: its \
                     process (pid {}) cannot be recovered with its exit status; stop its group \
                     by hand (kill -TERM -{}) and start the task again",
                    old.pid, old.pgid
                )))
            }
            v => Err(DriverError::InvalidConfig(format!(
                "task {id} has a handle of version {v}; this rawexec ({PLUGIN_VERSION}) knows \
                 versions 1 and {HANDLE_VERSION}"
            ))),
        }
    }
}

/// The executor of `task` died without reporting its end: kill what is left of the
/// task, proven to be it (its cgroup, else pidfd and start time), and only then return
/// its (unknown) end. Until the kill succeeds the task stays running: reporting its
/// end would let the host's restart policy start a second copy beside the first.
/// `None` if someone else recorded the end meanwhile.
async fn kill_lost(
    task: &Task,
    events: &TaskEvents,
    error: &DriverError,
) -> Option<drover_executor::ExitInfo> {
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

impl DriverPlugin for RawExecDriver {
    type Config = PluginConfig;
    type TaskConfig = TaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(PLUGIN_NAME, PLUGIN_VERSION)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_send_signals(true)
            .with_exec(true)
            .with_fs_isolation(FsIsolation::None)
            .with_task_stats(true)
            .with_task_events(true)
            .with_recover(true)
            // Plain host processes: the host's network, nothing else.
            .with_network_modes(NetworkModes::default().with_host(true))
    }

    async fn set_config(&self, config: PluginConfig, agent: AgentInfo) -> Result<(), DriverError> {
        self.no_cgroups.store(config.no_cgroups, Ordering::SeqCst);
        let dir = executor::state_dir(&agent.plugin_state_dir, PLUGIN_NAME);
        executor::prepare_state_dir(&dir)?;
        if let Some(version) = self.cgroups {
            // Empty task cgroups left by executors killed from outside and never
            // destroyed; in the background, best effort.
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

    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint::healthy("ready")
            .attribute("driver.rawexec.version", PLUGIN_VERSION)
            .attribute(
                "driver.rawexec.cgroup",
                self.task_cgroups().map_or("none", cgroup::Version::name),
            )
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        config.validate()?;
        if !spec.user.is_empty() {
            // Refuse rather than silently run as the plugin's user.
            return Err(DriverError::InvalidConfig(format!(
                "rawexec runs tasks as the plugin's own user; user {:?} is not supported",
                spec.user
            )));
        }
        let reservation = self.store.reserve(&spec.id)?;
        let launch = Launch::new(&spec, Some(&config));
        let mut how = LaunchSpec::new(spec.id.clone(), config.command.clone());
        how.args = config.args.clone();
        how.env = launch.env.clone();
        how.cwd = launch.cwd.clone();
        how.stdout_path = spec.stdout_path.clone();
        how.stderr_path = spec.stderr_path.clone();
        how.logs = spec.logs;
        how.own_cgroup = self.task_cgroups().is_some();
        let exec = executor::launch(&self.state_dir(), &how).await?;
        let task = Arc::new(Task::new(spec.id.clone(), spec.name.clone(), exec, launch));
        let state = task.handle_state();
        reservation.commit(task.clone());
        self.watch(task);
        self.event(&spec.id, format!("task started (pid {})", state.pid));
        TaskHandle::new(spec, HANDLE_VERSION, &state)
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        Ok(self.store.get(task_id)?.base.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        sig: Signal,
    ) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if !task.base.begin_stop(&self.events, sig, timeout) {
            return Ok(()); // it has exited already
        }
        let exit = task.exec.stop(sig, timeout).await?;
        task.base.record_exit(&self.events, exit);
        Ok(())
    }

    async fn signal_task(&self, task_id: &str, sig: Signal) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        task.base.ensure_running()?;
        task.exec.signal(sig).await?;
        self.event(task_id, format!("sent {sig}"));
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if task.base.running() && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} is still running; stop it first or destroy it with force"
            )));
        }
        // Kills the group if it still runs, and removes the executor's directory.
        task.exec.destroy().await?;
        self.store.remove(task_id);
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        Ok(self.store.get(task_id)?.status())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
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
                let done = tokio::task::spawn_blocking(move || {
                    drover_executor::lost::empty_plain_cgroup(&d)
                })
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
        let config: Option<TaskConfig> = serde_json::from_str(&handle.spec.driver_config_json).ok();
        let launch = Launch::new(&handle.spec, config.as_ref());
        let exited = !exec.info().running();
        let pid = exec.info().pid;
        let task = Arc::new(Task::new(
            id.clone(),
            handle.spec.name.clone(),
            exec,
            launch,
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

    async fn task_stats(&self, task_id: &str) -> Result<TaskStats, DriverError> {
        self.store.get(task_id)?.stats()
    }

    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        Some(self.events.subscribe())
    }

    async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let task = self.store.get(task_id)?;
        let (program, args) = command
            .split_first()
            .ok_or_else(|| DriverError::InvalidConfig("exec needs a command".into()))?;
        // The command joins the task's own cgroup before it execs, so that stopping and
        // destroying the task reach it and whatever it starts (`setsid` or not), as
        // they reach the task's own processes. A task with a cgroup whose cgroup is gone
        // has ended: nothing runs outside it in its name.
        let dir = task.exec.dir().to_owned();
        let join = tokio::task::spawn_blocking(move || cgroup::join_plain_task(&dir))
            .await
            .map_err(DriverError::internal)?
            .map_err(|e| {
                DriverError::FailedPrecondition(format!("cannot exec in task {task_id:?}: {e}"))
            })?;
        let in_cgroup = join.is_some();
        let mut cmd = task.launch.command(program, args);
        if let Some(join) = join {
            join.before_exec(cmd.as_std_mut());
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Unlike the task, an exec'd command dies with its call (e.g. on timeout).
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| {
            DriverError::InvalidConfig(if in_cgroup {
                format!("cannot start {program:?} in the cgroup of task {task_id:?}: {e}")
            } else {
                format!("cannot start {program:?}: {e}")
            })
        })?;
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(out)) => Ok(ExecOutput::new(ExitResult::from_status(out.status))
                .with_stdout(out.stdout)
                .with_stderr(out.stderr)),
            Ok(Err(e)) => Err(DriverError::Internal(format!("running {program:?}: {e}"))),
            Err(_) => Ok(ExecOutput::new(
                ExitResult::signaled(Signal::KILL).with_err(format!("timed out after {timeout:?}")),
            )),
        }
    }
}
