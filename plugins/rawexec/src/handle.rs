//! One task: its executor, its exit result once known, its resource usage.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use drover_executor::ExecutorHandle;
use drover_plugin_sdk::store::ExitSlot;
use drover_plugin_sdk::{DriverError, ExitResult, TaskState, TaskStats, TaskStatus};
use serde::{Deserialize, Serialize};

use crate::config::Launch;
use drover_executor::procfs;

/// What a task handle carries (version [`crate::HANDLE_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HandleState {
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

/// Version 1 of the handle state, from before tasks had executors. Decoded only to
/// say precisely why such a task cannot be recovered.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct HandleStateV1 {
    pub pid: u32,
    pub pgid: u32,
}

/// One task this plugin process tracks.
pub(crate) struct Task {
    pub id: String,
    pub name: String,
    pub exec: ExecutorHandle,
    pub started_at: SystemTime,
    /// Environment and directory, for `ExecTask`.
    pub launch: Launch,
    exit: ExitSlot,
    /// Timeout of the last stop, for the event saying SIGKILL was sent.
    pub stop_timeout: Mutex<Option<Duration>>,
    last_cpu: Mutex<Option<(Instant, Duration)>>,
}

impl Task {
    pub(crate) fn new(id: String, name: String, exec: ExecutorHandle, launch: Launch) -> Self {
        Task {
            id,
            name,
            started_at: exec.info().started_at,
            exec,
            launch,
            exit: ExitSlot::default(),
            stop_timeout: Mutex::new(None),
            last_cpu: Mutex::new(None),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.exec.info().pid
    }

    pub(crate) fn handle_state(&self) -> HandleState {
        let info = self.exec.info();
        HandleState {
            executor_dir: self.exec.dir().to_owned(),
            pid: info.pid,
            pgid: info.pgid,
            start_time: info.start_time,
            executor_pid: info.executor_pid,
        }
    }

    pub(crate) fn running(&self) -> bool {
        !self.exit.is_set()
    }

    /// Record how the task ended; the first result wins.
    pub(crate) fn finish(&self, result: ExitResult, at: SystemTime) -> bool {
        self.exit.finish(result, at)
    }

    /// Wait until the task has exited.
    pub(crate) async fn wait(&self) -> ExitResult {
        self.exit.wait().await
    }

    /// InspectTask's answer.
    pub(crate) fn status(&self) -> TaskStatus {
        let exit = self.exit.get();
        let info = self.exec.info();
        let mut status = TaskStatus::new(
            self.id.clone(),
            if exit.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
        )
        .with_name(self.name.clone())
        .with_started_at(self.started_at)
        .with_attribute("pid", info.pid.to_string())
        .with_attribute("pgid", info.pgid.to_string())
        .with_attribute("executor_pid", info.executor_pid.to_string())
        .with_attribute("executor_dir", self.exec.dir().display().to_string());
        if let Some((result, at)) = exit {
            status = status.with_exit_result(result).with_completed_at(at);
        }
        status
    }

    /// A resource usage sample of the main process.
    pub(crate) fn stats(&self) -> Result<TaskStats, DriverError> {
        if !self.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {} has exited",
                self.id
            )));
        }
        let pid = self.pid();
        let stat = procfs::read_stat(pid)
            .map_err(|e| DriverError::Internal(format!("reading /proc/{pid}/stat: {e}")))?;
        let rss = procfs::read_vm_rss(pid).unwrap_or(0);
        let cpu_user = procfs::ticks(stat.utime);
        let cpu_system = procfs::ticks(stat.stime);
        let cpu = cpu_user + cpu_system;
        let now = Instant::now();
        let mut last = self
            .last_cpu
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cpu_percent = match *last {
            Some((at, before)) if now > at => {
                cpu.saturating_sub(before).as_secs_f64() / (now - at).as_secs_f64() * 100.0
            }
            _ => 0.0,
        };
        *last = Some((now, cpu));
        Ok(TaskStats::default()
            .with_memory_rss_bytes(rss)
            .with_cpu_time(cpu_user, cpu_system)
            .with_cpu_percent(cpu_percent))
    }
}
