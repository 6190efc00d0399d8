//! The bookkeeping every executor-backed driver keeps around its tasks, written once:
//! rawexec, the isolation engine (exec, java) and qemu differ in how they start and
//! contain a task, not in how they follow it.
//!
//! - [`TaskEvents`]: the driver's task event feed (`TaskEvents` RPC), logged as well
//!   (the SDK's, re-exported: drivers without executors use it too).
//! - [`ExecutorTask`]: one task's identity, its exit result once known (the first one
//!   recorded wins), the timeout of its last stop and its CPU sampling.
//! - [`watch`]: follow a task on its executor until it exits, riding out an executor
//!   that is alive but briefly out of reach.
//! - [`settle_start`]: let a start of the same id that is in flight finish before a
//!   recovery looks.
//!
//! A driver's own task type holds an [`ExecutorTask`] next to what only it needs (its
//! [`ExecutorHandle`], a cgroup, ...):
//!
//! ```no_run
//! use std::sync::Arc;
//! use drover_executor::task::{self, ExecutorTask, TaskEvents, Watched};
//! use drover_executor::ExecutorHandle;
//!
//! struct MyTask { base: ExecutorTask, exec: ExecutorHandle }
//!
//! fn follow(task: Arc<MyTask>, events: TaskEvents) {
//!     tokio::spawn(async move {
//!         let exit = match task::watch(&task.base, &task.exec, &events).await {
//!             Watched::Exited(exit) => exit,
//!             Watched::Recorded => return, // a stop got the result first
//!             Watched::ExecutorLost(why) => {
//!                 task::unknown_exit(format!("lost the executor: {why}"))
//!             }
//!         };
//!         task.base.record_exit(&events, exit);
//!     });
//! }
//! ```

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

pub use drover_plugin_sdk::store::TaskEvents;
use drover_plugin_sdk::store::{ExitSlot, TaskStore};
use drover_plugin_sdk::{DriverError, ExitResult, Signal, TaskState, TaskStatus};

use crate::{ExecutorHandle, ExitInfo};

/// How often [`watch`] retries an executor that is alive but cannot be reached (its
/// socket was removed, or the plugin ran out of descriptors).
pub const WATCH_RETRY: Duration = Duration::from_secs(1);

/// How long [`settle_start`] waits for a start of the same task that is in flight.
pub const START_IN_FLIGHT: Duration = Duration::from_secs(30);

/// What every executor-backed task carries, whatever its driver: identity, how it
/// ended once it has, the timeout of its last stop (for the event saying SIGKILL was
/// sent), and the previous CPU sample (for a CPU percentage).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use drover_executor::task::{ExecutorTask, TaskEvents, unknown_exit};
/// let task = ExecutorTask::new("web-1", "web", std::time::SystemTime::now());
/// assert!(task.running());
/// task.record_exit(&TaskEvents::default(), unknown_exit("gone".into()));
/// assert!(!task.running());
/// assert_eq!(task.wait().await.err.as_deref(), Some("gone"));
/// # });
/// ```
#[derive(Debug)]
pub struct ExecutorTask {
    /// Task id.
    pub id: String,
    /// Task name.
    pub name: String,
    /// When it started.
    pub started_at: SystemTime,
    exit: ExitSlot,
    stop_timeout: Mutex<Option<Duration>>,
    last_cpu: Mutex<Option<(Instant, Duration)>>,
}

impl ExecutorTask {
    /// A running task.
    pub fn new(id: impl Into<String>, name: impl Into<String>, started_at: SystemTime) -> Self {
        ExecutorTask {
            id: id.into(),
            name: name.into(),
            started_at,
            exit: ExitSlot::default(),
            stop_timeout: Mutex::new(None),
            last_cpu: Mutex::new(None),
        }
    }

    /// Whether no exit has been recorded yet.
    pub fn running(&self) -> bool {
        !self.exit.is_set()
    }

    /// `FailedPrecondition` once the task has exited: for calls that need it running
    /// (signals, stats).
    pub fn ensure_running(&self) -> Result<(), DriverError> {
        if self.running() {
            Ok(())
        } else {
            Err(DriverError::FailedPrecondition(format!(
                "task {} has exited",
                self.id
            )))
        }
    }

    /// Until the task has exited; its result (`WaitTask`).
    pub async fn wait(&self) -> ExitResult {
        self.exit.wait().await
    }

    /// Id, name, state, times and exit result, for `InspectTask`; the driver adds its
    /// attributes.
    pub fn status(&self) -> TaskStatus {
        let exit = self.exit.get();
        let state = if exit.is_some() {
            TaskState::Exited
        } else {
            TaskState::Running
        };
        let status = TaskStatus::new(self.id.clone(), state)
            .with_name(self.name.clone())
            .with_started_at(self.started_at);
        match exit {
            Some((result, at)) => status.with_exit_result(result).with_completed_at(at),
            None => status,
        }
    }

    /// Note a stop being sent (`false`, and nothing noted, if the task has exited
    /// already): remembers `timeout` for the SIGKILL event and tells subscribers.
    pub fn begin_stop(&self, events: &TaskEvents, signal: Signal, timeout: Duration) -> bool {
        if !self.running() {
            return false;
        }
        *self
            .stop_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(timeout);
        events.send(&self.id, format!("sent {signal}"));
        true
    }

    /// Record how the task ended and tell subscribers, once: the watcher and a stop
    /// both learn the result, and whichever comes first reports it. Returns whether
    /// this call recorded it.
    pub fn record_exit(&self, events: &TaskEvents, exit: ExitInfo) -> bool {
        let result = exit.result;
        let oom = if result.oom_killed {
            " (killed by the OOM killer at the memory limit)"
        } else {
            ""
        };
        let message = match (result.signal, &result.err) {
            (_, Some(e)) => format!("task exited: {e}{oom}"),
            (0, None) => format!("task exited: code {}{oom}", result.exit_code),
            (sig, None) => format!("task exited: signal {sig}{oom}"),
        };
        if !self.exit.finish(result, exit.exited_at) {
            return false;
        }
        if exit.killed_after_timeout {
            let after = self
                .stop_timeout
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map_or_else(|| "the stop timeout".to_owned(), |t| format!("{t:?}"));
            events.send(
                &self.id,
                format!("sent SIGKILL: still running after {after}"),
            );
        }
        events.send(&self.id, message);
        true
    }

    /// Percent of one core used since the previous call, given the task's total CPU
    /// time now (0 on the first call).
    pub fn cpu_percent(&self, cpu_total: Duration) -> f64 {
        let now = Instant::now();
        let mut last = self.last_cpu.lock().unwrap_or_else(PoisonError::into_inner);
        let percent = match *last {
            Some((at, before)) if now > at => {
                cpu_total.saturating_sub(before).as_secs_f64() / (now - at).as_secs_f64() * 100.0
            }
            _ => 0.0,
        };
        *last = Some((now, cpu_total));
        percent
    }
}

/// An exit whose status nobody knows, now: `why` says what happened.
///
/// ```
/// let e = drover_executor::task::unknown_exit("the executor died".into());
/// assert_eq!(e.result.err.as_deref(), Some("the executor died"));
/// ```
pub fn unknown_exit(why: String) -> ExitInfo {
    ExitInfo {
        result: ExitResult::unknown(why),
        exited_at: SystemTime::now(),
        killed_after_timeout: false,
    }
}

/// How [`watch`] ended. Exhaustive on purpose: a new way for it to end must be
/// handled by every driver.
#[derive(Debug)]
pub enum Watched {
    /// The executor reported the exit: record it.
    Exited(ExitInfo),
    /// Someone else (a stop) recorded the exit meanwhile.
    Recorded,
    /// The executor died without reporting; the task's fate is the driver's to find
    /// out. Why the last call failed.
    ExecutorLost(DriverError),
}

/// Follow `task` until it exits: a `wait` held open on its executor. While the
/// executor is alive but cannot be reached, retry every [`WATCH_RETRY`] (saying so
/// once in an event); once it is dead without having answered, return
/// [`Watched::ExecutorLost`].
pub async fn watch(task: &ExecutorTask, exec: &ExecutorHandle, events: &TaskEvents) -> Watched {
    let mut warned = false;
    loop {
        let error = match exec.wait().await {
            Ok(exit) => return Watched::Exited(exit),
            Err(e) => e,
        };
        if !task.running() {
            return Watched::Recorded;
        }
        if !exec.executor_alive() {
            return Watched::ExecutorLost(error);
        }
        if !warned {
            // Once: the task still runs, only its executor is out of reach.
            events.send(
                &task.id,
                format!("cannot reach the task's executor, retrying: {error}"),
            );
            warned = true;
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}

/// Before recovering `id`: wait (up to [`START_IN_FLIGHT`]) for a start of it that is
/// in flight (the host crashed while waiting for its reply, and now recovers it), then
/// say whether the store has it, in which case there is nothing to recover.
pub async fn settle_start<T>(store: &TaskStore<T>, id: &str) -> bool {
    let deadline = tokio::time::Instant::now() + START_IN_FLIGHT;
    while store.starting(id) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.get(id).is_ok()
}

#[cfg(test)]
mod tests {
    use drover_plugin_sdk::TaskEvent;
    use tokio::sync::broadcast;

    use super::*;

    fn exit(result: ExitResult, killed_after_timeout: bool) -> ExitInfo {
        ExitInfo {
            result,
            exited_at: SystemTime::now(),
            killed_after_timeout,
        }
    }

    fn messages(rx: &mut broadcast::Receiver<TaskEvent>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok().map(|e| e.message)).collect()
    }

    #[test]
    fn the_first_exit_wins_and_is_told_once() {
        let events = TaskEvents::default();
        let mut rx = events.subscribe();
        let task = ExecutorTask::new("t1", "t1", SystemTime::now());
        assert!(task.record_exit(&events, exit(ExitResult::code(3), false)));
        assert!(!task.record_exit(&events, exit(ExitResult::code(0), false)));
        assert_eq!(messages(&mut rx), ["task exited: code 3"]);
        assert_eq!(task.status().exit_result, Some(ExitResult::code(3)));
        assert_eq!(task.status().state, TaskState::Exited);
        assert!(matches!(
            task.ensure_running(),
            Err(DriverError::FailedPrecondition(_))
        ));
    }

    #[test]
    fn a_stop_that_escalated_says_so_before_the_exit() {
        let events = TaskEvents::default();
        let mut rx = events.subscribe();
        let task = ExecutorTask::new("t1", "t1", SystemTime::now());
        assert!(task.begin_stop(&events, Signal::TERM, Duration::from_secs(2)));
        task.record_exit(&events, exit(ExitResult::signaled(Signal::KILL), true));
        assert_eq!(
            messages(&mut rx),
            [
                "sent SIGTERM",
                "sent SIGKILL: still running after 2s",
                "task exited: signal 9"
            ]
        );
        assert!(!task.begin_stop(&events, Signal::TERM, Duration::from_secs(2)));
        assert!(messages(&mut rx).is_empty());
    }

    #[test]
    fn messages_say_oom_and_unknown_ends() {
        let events = TaskEvents::default();
        let mut rx = events.subscribe();
        let oom = ExecutorTask::new("a", "a", SystemTime::now());
        oom.record_exit(
            &events,
            exit(
                ExitResult::signaled(Signal::KILL).with_oom_killed(true),
                false,
            ),
        );
        let lost = ExecutorTask::new("b", "b", SystemTime::now());
        lost.record_exit(&events, unknown_exit("executor gone".into()));
        assert_eq!(
            messages(&mut rx),
            [
                "task exited: signal 9 (killed by the OOM killer at the memory limit)",
                "task exited: executor gone"
            ]
        );
    }

    #[test]
    fn cpu_percent_starts_at_zero() {
        let task = ExecutorTask::new("t1", "t1", SystemTime::now());
        assert_eq!(task.cpu_percent(Duration::from_secs(1)), 0.0);
        std::thread::sleep(Duration::from_millis(10));
        assert!(task.cpu_percent(Duration::from_secs(1)) == 0.0);
    }
}
