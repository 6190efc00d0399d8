//! The raw_exec driver: the [`DriverPlugin`] impl.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use drover_executor::LaunchSpec;
use drover_executor::cgroup;
use drover_executor::plain::PlainEngine;
use drover_plugin_sdk::exec::{Pty, relay_pipes, relay_pty};
use drover_plugin_sdk::{
    AgentInfo, Capabilities, DriverError, DriverPlugin, ExecOutput, ExecSession, ExitResult,
    Fingerprint, FsIsolation, Health, NetworkModes, PluginInfo, Signal, TaskHandle, TaskSpec,
    read_exec_output,
};
use serde::Deserialize;

use crate::config::{Launch, PluginConfig, TaskConfig};

/// The driver's name, Nomad's (`rawexec`, its name before, is an alias the agent
/// resolves: `drover_api::DRIVER_ALIASES`).
pub const PLUGIN_NAME: &str = "raw_exec";
/// The directory under the agent's plugin state directory that holds the executors'
/// sockets and specs: still the driver's old name, so that an agent upgraded across
/// the rename finds the executors of the tasks it already runs.
const STATE_DIR_NAME: &str = "rawexec";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the task handle's driver state. Version 2 names the task's executor;
/// version 1 (a bare pid, from before executors) is refused with an explanation.
pub const HANDLE_VERSION: u32 = 2;

/// Why a raw_exec that was not enabled refuses to run anything (its fingerprint's
/// description, so the scheduler's reason and `drover plugin status` say it).
pub const DISABLED: &str = "raw_exec is disabled: it runs tasks as the agent's user with no \
     isolation; enable it in the agent config with [plugin.raw_exec] config = { enabled = true }";

/// Version 1 of the handle state, from before tasks had executors. Decoded only to
/// say precisely why such a task cannot be recovered.
#[derive(Debug, Clone, Copy, Deserialize)]
struct HandleStateV1 {
    pid: u32,
    pgid: u32,
}

/// SIGKILLs the process group of an exec'd command when dropped: a script check runs
/// at every interval, and must leave no process behind.
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.0) {
            // ESRCH (the group is empty) is the usual answer.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Runs tasks as plain host processes, each owned by its own executor process and the
/// leader of its own process group: the shared [`PlainEngine`], whose tasks keep
/// their environment and directory (`Launch`) for `ExecTask`.
pub struct RawExecDriver {
    engine: PlainEngine<Launch>,
    /// `PluginConfig::enabled`, from the last `SetConfig` (off until then).
    enabled: AtomicBool,
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
            engine: PlainEngine::new(STATE_DIR_NAME, HANDLE_VERSION),
            enabled: AtomicBool::new(false),
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
            // Plain host processes: the host's network, or their group's namespace
            // (bridge mode), joined between fork and exec.
            .with_network_modes(NetworkModes::default().with_host(true).with_group(true))
    }

    async fn set_config(&self, config: PluginConfig, agent: AgentInfo) -> Result<(), DriverError> {
        self.engine.configure(&agent, config.no_cgroups).await?;
        self.enabled.store(config.enabled, Ordering::Release);
        Ok(())
    }

    async fn fingerprint(&self) -> Fingerprint {
        if !self.enabled.load(Ordering::Acquire) {
            // Nomad's answer for a raw_exec that is not enabled: undetected, so no
            // job is placed here, and the reason travels with the node.
            return Fingerprint::not_ready(Health::Undetected, DISABLED);
        }
        Fingerprint::healthy("ready")
            .attribute("driver.raw_exec.version", PLUGIN_VERSION)
            .attribute(
                "driver.raw_exec.cgroup",
                self.engine
                    .task_cgroups()
                    .map_or("none", cgroup::Version::name),
            )
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        if !self.enabled.load(Ordering::Acquire) {
            return Err(DriverError::FailedPrecondition(DISABLED.into()));
        }
        config.validate()?;
        if !spec.devices.is_empty() || !spec.mounts.is_empty() {
            drover_plugin_sdk::tracing::info!(
                task = %spec.id,
                device_nodes = spec.devices.len(),
                mounts = spec.mounts.len(),
                "raw_exec has no filesystem isolation: the device nodes and mounts of the task's device reservation are not applied (the task sees the host's /dev; its environment has the device variables), as in Nomad"
            );
        }
        if let Some(v) = spec.volumes.first() {
            return Err(DriverError::InvalidConfig(format!(
                "volume_mount of volume {:?}: raw_exec has no filesystem isolation, so it \
                 cannot mount volumes (use exec, java or docker)",
                v.name
            )));
        }
        if !spec.user.is_empty() {
            // Refuse rather than silently run as the plugin's user.
            return Err(DriverError::InvalidConfig(format!(
                "rawexec runs tasks as the plugin's own user; user {:?} is not supported",
                spec.user
            )));
        }
        let launch = Launch::new(&spec, Some(&config));
        let mut how = LaunchSpec::new(spec.id.clone(), config.command.clone());
        how.args = config.args.clone();
        how.env = launch.env.clone();
        how.cwd = launch.cwd.clone();
        how.stdout_path = spec.stdout_path.clone();
        how.stderr_path = spec.stderr_path.clone();
        how.logs = spec.logs;
        if !spec.netns_path.as_os_str().is_empty() {
            how.netns_path = Some(spec.netns_path.clone());
        }
        self.engine.start(spec, how, launch).await
    }

    async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        sig: Signal,
    ) -> Result<(), DriverError> {
        self.engine.stop(task_id, timeout, sig).await
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if handle.version == 1 && !handle.driver_state.is_empty() {
            let old: HandleStateV1 = handle.decode_state(1)?;
            return Err(DriverError::FailedPrecondition(format!(
                "task {} has a version 1 handle, made by a rawexec without executors: its \
                 process (pid {}) cannot be recovered with its exit status; stop its group \
                 by hand (kill -TERM -{}) and start the task again",
                handle.spec.id, old.pid, old.pgid
            )));
        }
        self.engine
            .recover(handle, |handle, _| {
                let config: Option<TaskConfig> =
                    serde_json::from_str(&handle.spec.driver_config_json).ok();
                Launch::new(&handle.spec, config.as_ref())
            })
            .await
    }

    async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let task = self.engine.get(task_id)?;
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
        let mut cmd = task.extra.command(program, args);
        if let Some(join) = join {
            join.before_exec(cmd.as_std_mut());
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Unlike the task, an exec'd command dies with its call (e.g. on timeout).
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            DriverError::InvalidConfig(if in_cgroup {
                format!("cannot start {program:?} in the cgroup of task {task_id:?}: {e}")
            } else {
                format!("cannot start {program:?}: {e}")
            })
        })?;
        // The command leads its own process group (`Launch::command`): whatever it
        // started there dies when the call ends, however it ends (answered, timed
        // out, or dropped by a caller that went away).
        let _group = child.id().map(KillGroupOnDrop);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        // At most `EXEC_OUTPUT_LIMIT` of each is kept; the rest is drained so that
        // the command never blocks on a full pipe.
        let run = async {
            let (stdout, stderr, status) = tokio::join!(
                async {
                    match stdout {
                        Some(r) => read_exec_output(r).await,
                        None => Ok(Vec::new()),
                    }
                },
                async {
                    match stderr {
                        Some(r) => read_exec_output(r).await,
                        None => Ok(Vec::new()),
                    }
                },
                child.wait(),
            );
            Ok::<_, std::io::Error>(
                ExecOutput::new(ExitResult::from_status(status?))
                    .with_stdout(stdout?)
                    .with_stderr(stderr?),
            )
        };
        let outcome = tokio::time::timeout(timeout, run).await;
        match outcome {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(DriverError::Internal(format!("running {program:?}: {e}"))),
            Err(_) => {
                let _ = child.kill().await;
                Ok(ExecOutput::new(
                    ExitResult::signaled(Signal::KILL)
                        .with_err(format!("timed out after {timeout:?}: killed")),
                ))
            }
        }
    }

    async fn exec_task_streaming(
        &self,
        task_id: &str,
        session: ExecSession,
    ) -> Result<ExitResult, DriverError> {
        let task = self.engine.get(task_id)?;
        let (program, args) = session
            .command
            .split_first()
            .ok_or_else(|| DriverError::InvalidConfig("exec needs a command".into()))?;
        // As `exec_task`: in the task's cgroup, so that stopping the task stops it.
        let dir = task.exec.dir().to_owned();
        let join = tokio::task::spawn_blocking(move || cgroup::join_plain_task(&dir))
            .await
            .map_err(DriverError::internal)?
            .map_err(|e| {
                DriverError::FailedPrecondition(format!("cannot exec in task {task_id:?}: {e}"))
            })?;
        let mut cmd = task.extra.command_in_env(program, args);
        // A call dropped (cancelled) takes the command with it.
        cmd.kill_on_drop(true);
        if let Some(join) = join {
            join.before_exec(cmd.as_std_mut());
        }
        let spawn_error = |e: std::io::Error| {
            DriverError::InvalidConfig(format!("cannot start {program:?} in task {task_id:?}: {e}"))
        };
        if session.tty {
            let pty = Pty::open(session.size).map_err(DriverError::internal)?;
            pty.attach(cmd.as_std_mut())
                .map_err(DriverError::internal)?;
            let child = cmd.spawn().map_err(spawn_error)?;
            relay_pty(pty, child, session).await
        } else {
            cmd.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0);
            let child = cmd.spawn().map_err(spawn_error)?;
            relay_pipes(child, session).await
        }
    }

    drover_executor::plain_engine_calls!(engine: wait_task signal_task destroy_task inspect_task task_stats task_events);
}
