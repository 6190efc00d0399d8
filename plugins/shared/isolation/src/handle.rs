//! One task: its executor (while one answers for it), its cgroup, its exit result.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use drover_executor::ExecutorHandle;
use drover_executor::task::ExecutorTask;
use drover_plugin_sdk::{DriverError, TaskStats, TaskStatus};
use serde::{Deserialize, Serialize};

use crate::cgroup::{TaskCgroup, Version};

/// What a task handle carries (version [`crate::HANDLE_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HandleState {
    /// The task's executor directory.
    pub executor_dir: PathBuf,
    /// The task's init (pid 1 of its pid namespace), in the host's numbering.
    pub pid: u32,
    /// Its start time in ticks since boot.
    pub start_time: u64,
    /// The executor's pid.
    pub executor_pid: u32,
    /// The task's cgroup: hierarchy and path below its roots.
    pub cgroup_version: Version,
    pub cgroup_path: String,
}

/// One task this plugin process tracks.
pub(crate) struct Task {
    /// What every executor-backed driver keeps: identity, exit result, stop timeout.
    pub base: ExecutorTask,
    /// `None` when the executor died without recording a result: the task's
    /// processes, if any are left, are reachable only through the cgroup.
    pub exec: Option<ExecutorHandle>,
    pub state: HandleState,
    pub cgroup: Arc<dyn TaskCgroup>,
}

impl Task {
    pub(crate) fn new(
        id: String,
        name: String,
        exec: Option<ExecutorHandle>,
        state: HandleState,
        cgroup: Arc<dyn TaskCgroup>,
    ) -> Self {
        let started_at = exec
            .as_ref()
            .map_or_else(SystemTime::now, |e| e.info().started_at);
        Task {
            base: ExecutorTask::new(id, name, started_at),
            exec,
            state,
            cgroup,
        }
    }

    pub(crate) fn status(&self) -> TaskStatus {
        let s = &self.state;
        self.base
            .status()
            .with_attribute("pid", s.pid.to_string())
            .with_attribute("executor_pid", s.executor_pid.to_string())
            .with_attribute("executor_dir", s.executor_dir.display().to_string())
            .with_attribute("cgroup", s.cgroup_path.clone())
            .with_attribute("cgroup_version", s.cgroup_version.name())
    }

    /// A usage sample of the whole task, from its cgroup.
    pub(crate) fn stats(&self) -> Result<TaskStats, DriverError> {
        self.base.ensure_running()?;
        let u = self.cgroup.usage();
        let cpu_percent = self.base.cpu_percent(u.cpu_total);
        Ok(TaskStats::default()
            .with_memory_rss_bytes(u.rss)
            .with_cpu_time(u.cpu_user, u.cpu_system)
            .with_cpu_percent(cpu_percent)
            .with_memory_cache_bytes(u.cache)
            .with_process_count(u.pids))
    }
}
