//! One task: its executor (while one answers for it), its cgroup, its exit result.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use drover_executor::ExecutorHandle;
use drover_plugin_sdk::store::ExitSlot;
use drover_plugin_sdk::{DriverError, ExitResult, TaskState, TaskStats, TaskStatus};
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
    pub id: String,
    pub name: String,
    /// `None` when the executor died without recording a result: the task's
    /// processes, if any are left, are reachable only through the cgroup.
    pub exec: Option<ExecutorHandle>,
    pub state: HandleState,
    pub cgroup: Arc<dyn TaskCgroup>,
    pub started_at: SystemTime,
    exit: ExitSlot,
    /// Timeout of the last stop, for the event saying SIGKILL was sent.
    pub stop_timeout: Mutex<Option<Duration>>,
    last_cpu: Mutex<Option<(Instant, Duration)>>,
}

impl Task {
    pub(crate) fn new(
        id: String,
        name: String,
        exec: Option<ExecutorHandle>,
        state: HandleState,
        cgroup: Arc<dyn TaskCgroup>,
    ) -> Self {
        Task {
            id,
            name,
            started_at: exec
                .as_ref()
                .map_or_else(SystemTime::now, |e| e.info().started_at),
            exec,
            state,
            cgroup,
            exit: ExitSlot::default(),
            stop_timeout: Mutex::new(None),
            last_cpu: Mutex::new(None),
        }
    }

    pub(crate) fn running(&self) -> bool {
        !self.exit.is_set()
    }

    /// Record how the task ended; the first result wins.
    pub(crate) fn finish(&self, result: ExitResult, at: SystemTime) -> bool {
        self.exit.finish(result, at)
    }

    pub(crate) async fn wait(&self) -> ExitResult {
        self.exit.wait().await
    }

    pub(crate) fn status(&self) -> TaskStatus {
        let exit = self.exit.get();
        let s = &self.state;
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
        .with_attribute("pid", s.pid.to_string())
        .with_attribute("executor_pid", s.executor_pid.to_string())
        .with_attribute("executor_dir", s.executor_dir.display().to_string())
        .with_attribute("cgroup", s.cgroup_path.clone())
        .with_attribute("cgroup_version", s.cgroup_version.name());
        if let Some((result, at)) = exit {
            status = status.with_exit_result(result).with_completed_at(at);
        }
        status
    }

    /// A usage sample of the whole task, from its cgroup.
    pub(crate) fn stats(&self) -> Result<TaskStats, DriverError> {
        if !self.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {} has exited",
                self.id
            )));
        }
        let u = self.cgroup.usage();
        let now = Instant::now();
        let mut last = self.last_cpu.lock().unwrap_or_else(PoisonError::into_inner);
        let cpu_percent = match *last {
            Some((at, before)) if now > at => {
                u.cpu_total.saturating_sub(before).as_secs_f64() / (now - at).as_secs_f64() * 100.0
            }
            _ => 0.0,
        };
        *last = Some((now, u.cpu_total));
        Ok(TaskStats::default()
            .with_memory_rss_bytes(u.rss)
            .with_cpu_time(u.cpu_user, u.cpu_system)
            .with_cpu_percent(cpu_percent)
            .with_memory_cache_bytes(u.cache)
            .with_process_count(u.pids))
    }
}
