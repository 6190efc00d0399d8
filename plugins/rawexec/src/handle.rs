//! One task: its process, its exit result once known, and how to signal it.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use drover_plugin_sdk::{DriverError, ExitResult, TaskState, TaskStats, TaskStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::Launch;
use crate::procfs;

/// What a task handle carries (version [`crate::HANDLE_VERSION`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HandleState {
    /// The task's main process.
    pub pid: u32,
    /// Its process group (the task's processes).
    pub pgid: u32,
    /// Its start time in ticks since boot, to tell it from a later process with the
    /// same pid.
    pub start_time: u64,
}

/// One task this plugin process tracks.
pub(crate) struct Task {
    pub id: String,
    pub name: String,
    pub state: HandleState,
    pub started_at: SystemTime,
    /// Environment and directory, for `ExecTask`.
    pub launch: Launch,
    exit: watch::Sender<Option<(ExitResult, SystemTime)>>,
    last_cpu: Mutex<Option<(Instant, Duration)>>,
}

impl Task {
    pub(crate) fn new(
        id: String,
        name: String,
        state: HandleState,
        started_at: SystemTime,
        launch: Launch,
    ) -> Self {
        Task {
            id,
            name,
            state,
            started_at,
            launch,
            exit: watch::channel(None).0,
            last_cpu: Mutex::new(None),
        }
    }

    pub(crate) fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Record how the task ended; the first result wins.
    pub(crate) fn finish(&self, result: ExitResult) -> bool {
        self.exit.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some((result, SystemTime::now()));
            true
        })
    }

    /// Wait until the task has exited.
    pub(crate) async fn wait(&self) -> ExitResult {
        let mut rx = self.exit.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(slot) => slot.as_ref().map(|(r, _)| r.clone()).unwrap_or_default(),
            // The sender lives in `self`, so it cannot be gone while we borrow it.
            Err(_) => ExitResult::default(),
        }
    }

    /// Send `signal` to the task's whole process group. A group that is already gone
    /// is not an error.
    pub(crate) fn signal_group(&self, signal: i32) -> Result<(), DriverError> {
        let sig = nix::sys::signal::Signal::try_from(signal)
            .map_err(|_| DriverError::InvalidConfig(format!("unknown signal number {signal}")))?;
        let pgid = i32::try_from(self.state.pgid).map_err(DriverError::internal)?;
        match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(DriverError::Internal(format!(
                "cannot send {sig} to task {}: {e}",
                self.id
            ))),
        }
    }

    /// InspectTask's answer.
    pub(crate) fn status(&self) -> TaskStatus {
        let exit = self.exit.borrow().clone();
        TaskStatus {
            id: self.id.clone(),
            name: self.name.clone(),
            state: if exit.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            started_at: Some(self.started_at),
            completed_at: exit.as_ref().map(|(_, at)| *at),
            exit_result: exit.map(|(r, _)| r),
            attributes: [
                ("pid".to_owned(), self.state.pid.to_string()),
                ("pgid".to_owned(), self.state.pgid.to_string()),
            ]
            .into_iter()
            .collect(),
        }
    }

    /// A resource usage sample of the main process.
    pub(crate) fn stats(&self) -> Result<TaskStats, DriverError> {
        if !self.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {} has exited",
                self.id
            )));
        }
        let stat = procfs::read_stat(self.state.pid).map_err(|e| {
            DriverError::Internal(format!("reading /proc/{}/stat: {e}", self.state.pid))
        })?;
        let rss = procfs::read_vm_rss(self.state.pid).unwrap_or(0);
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
        Ok(TaskStats {
            memory_rss_bytes: rss,
            cpu_user,
            cpu_system,
            cpu_percent,
        })
    }
}

/// Wait, without being its parent, for a process that a previous plugin process
/// started: a pidfd becomes readable when the process exits. Its exit status is not
/// ours to collect (it was reparented to init), so the result says so.
///
/// This is the interim recovery path until each task gets its own executor process
/// that records the exit status durably.
pub(crate) async fn watch_adopted(pid: u32) -> ExitResult {
    let unknown = |why: String| ExitResult {
        err: Some(format!(
            "exit status unavailable: task was recovered by a new plugin process ({why})"
        )),
        ..Default::default()
    };
    // The process is gone: its status went to its new parent (init), not to us.
    let exited = || unknown("executor support pending".into());
    let Some(raw) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return unknown(format!("bad pid {pid}"));
    };
    let fd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return exited(),
        Err(e) => return unknown(format!("pidfd_open: {e}")),
    };
    // SAFETY: `register` requires the fd to stay open while registered. The OwnedFd is
    // moved into the AsyncFd, which deregisters it before dropping (closing) it.
    #[allow(unsafe_code)]
    let registered = unsafe { tokio::io::unix::AsyncFd::register(fd) };
    match registered {
        Ok(async_fd) => {
            let _ = async_fd.readable().await;
            exited()
        }
        Err(e) => unknown(format!("watching pidfd: {e}")),
    }
}
