//! One task: its executor, its exit result once known, its resource usage.

use std::path::PathBuf;

use drover_executor::ExecutorHandle;
use drover_executor::task::ExecutorTask;
use drover_plugin_sdk::{DriverError, TaskStats, TaskStatus};
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
    /// What every executor-backed driver keeps: identity, exit result, stop timeout.
    pub base: ExecutorTask,
    pub exec: ExecutorHandle,
    /// Environment and directory, for `ExecTask`.
    pub launch: Launch,
}

impl Task {
    pub(crate) fn new(id: String, name: String, exec: ExecutorHandle, launch: Launch) -> Self {
        Task {
            base: ExecutorTask::new(id, name, exec.info().started_at),
            exec,
            launch,
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

    /// InspectTask's answer.
    pub(crate) fn status(&self) -> TaskStatus {
        let info = self.exec.info();
        self.base
            .status()
            .with_attribute("pid", info.pid.to_string())
            .with_attribute("pgid", info.pgid.to_string())
            .with_attribute("executor_pid", info.executor_pid.to_string())
            .with_attribute("executor_dir", self.exec.dir().display().to_string())
    }

    /// A resource usage sample of the main process.
    pub(crate) fn stats(&self) -> Result<TaskStats, DriverError> {
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
}
