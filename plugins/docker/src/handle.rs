//! One task: its container, its exit result once known, the background work that
//! watches it (exit and logs), and its resource samples.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use bollard::models::{ContainerState, ContainerStatsResponse};
use drover_plugin_sdk::store::ExitSlot;
use drover_plugin_sdk::{ExitResult, TaskSpec, TaskState, TaskStats, TaskStatus};
use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::engine::{Endpoint, Engine, is_transport, status_of};
use crate::logs::LogTarget;
use crate::oom::{self, OomWatch};

/// What a task handle carries (version [`crate::HANDLE_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HandleState {
    /// The container's full id.
    pub container_id: String,
    /// The image reference the task asked for (for image garbage collection).
    pub image: String,
}

/// How long an exit waits for a log follower that makes no progress to write the
/// container's last lines: a task reported dead has its whole output in its log
/// files unless the follower is stuck (daemon gone, disk full).
const LOG_STALL: Duration = Duration::from_secs(10);

/// The longest an exit waits for a follower that is still copying (a container that
/// wrote far more than the follower could keep up with).
const LOG_DRAIN_MAX: Duration = Duration::from_secs(120);

/// The exit code of a container killed by SIGKILL, which is what the OOM killer sends.
const SIGKILL_EXIT: i32 = 137;

/// How long an exit with code 137 that Docker does not call an OOM kill waits for the
/// plugin's own cgroup watch to become final (see [`crate::oom`]).
const OOM_SETTLE: Duration = Duration::from_secs(2);

/// Pauses between attempts to reach a daemon that does not answer.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(Duration::from_millis(100))
    }
    pub(crate) fn reset(&mut self) {
        self.0 = Duration::from_millis(100);
    }
    /// Sleep for the current pause (or until `cancel`), then double it up to 2 s.
    /// Returns false when cancelled.
    pub(crate) async fn pause(&mut self, cancel: &CancellationToken) -> bool {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = cancel.cancelled() => false,
        }
    }
}

/// One task this plugin process tracks.
pub(crate) struct Task {
    pub id: String,
    pub name: String,
    pub state: HandleState,
    pub started_at: SystemTime,
    /// The daemon the container lives on.
    pub engine: Arc<Engine>,
    /// Where its output goes.
    pub logs: LogTarget,
    /// Stops the exit watcher and the log follower (the task is destroyed).
    pub cancel: CancellationToken,
    exit: ExitSlot,
    logs_done: watch::Sender<bool>,
    /// The container has stopped (its result may still wait for the log follower).
    ended: watch::Sender<bool>,
    /// Messages the log follower has written, to tell a slow follower from a stuck one.
    logs_copied: AtomicU64,
    /// (container CPU ns, system CPU ns) of the previous stats sample.
    last_cpu: Mutex<Option<(u64, u64)>>,
    /// The plugin's own watch of the container's memory cgroup, when it could start one.
    oom: OnceLock<Arc<OomWatch>>,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(w) = self.oom.get() {
            w.stop();
        }
    }
}

impl Task {
    pub(crate) fn new(
        spec: &TaskSpec,
        state: HandleState,
        started_at: SystemTime,
        engine: Arc<Engine>,
    ) -> Self {
        Task {
            id: spec.id.clone(),
            name: spec.name.clone(),
            state,
            started_at,
            engine,
            logs: LogTarget {
                stdout: spec.stdout_path.clone(),
                stderr: spec.stderr_path.clone(),
                limits: spec.logs,
            },
            cancel: CancellationToken::new(),
            exit: ExitSlot::default(),
            logs_done: watch::channel(false).0,
            ended: watch::channel(false).0,
            logs_copied: AtomicU64::new(0),
            last_cpu: Mutex::new(None),
            oom: OnceLock::new(),
        }
    }

    /// The OOM watch armed before the container's start ([`crate::oom::arm`]).
    pub(crate) fn set_oom_watch(&self, watch: Arc<OomWatch>) {
        let _ = self.oom.set(watch);
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

    /// Until the container has stopped: sooner than [`Task::wait`] when the log
    /// follower still copies its last output, so that a stop is not mistaken for a
    /// container that ignores SIGKILL.
    pub(crate) async fn stopped(&self) {
        let mut ended = self.ended.subscribe();
        tokio::select! {
            _ = ended.wait_for(|e| *e) => {}
            _ = self.exit.wait() => {}
        }
    }

    /// The log follower has written everything the container will ever write.
    pub(crate) fn logs_finished(&self) {
        self.logs_done.send_replace(true);
    }

    /// The log follower wrote one more message.
    pub(crate) fn log_copied(&self) {
        self.logs_copied.fetch_add(1, Ordering::Relaxed);
    }

    /// Wait until the log follower has finished, while it keeps making progress:
    /// give up after [`LOG_STALL`] without a new message, or after
    /// [`LOG_DRAIN_MAX`] in all.
    async fn logs_drained(&self) {
        let mut rx = self.logs_done.subscribe();
        let deadline = tokio::time::Instant::now() + LOG_DRAIN_MAX;
        let mut copied = self.logs_copied.load(Ordering::Relaxed);
        loop {
            let check = (tokio::time::Instant::now() + LOG_STALL).min(deadline);
            match tokio::time::timeout_at(check, rx.wait_for(|done| *done)).await {
                Ok(_) => return,
                Err(_) if check >= deadline => break,
                Err(_) => {}
            }
            let now = self.logs_copied.load(Ordering::Relaxed);
            if now == copied {
                break;
            }
            copied = now;
        }
        tracing::warn!(
            task = %self.id,
            "reporting the exit before the log follower wrote all of the container's output"
        );
    }

    /// InspectTask's answer.
    pub(crate) fn status(&self) -> TaskStatus {
        let exit = self.exit.get();
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
        .with_attribute("container_id", self.state.container_id.clone())
        .with_attribute("image", self.state.image.clone());
        if let Some((result, at)) = exit {
            status = status.with_exit_result(result).with_completed_at(at);
        }
        status
    }

    /// A usage sample from one Docker stats reading. CPU percent is over the time since
    /// the previous sample (the first one reads 0), relative to one core.
    pub(crate) fn sample(&self, s: &ContainerStatsResponse) -> TaskStats {
        let cpu = s.cpu_stats.as_ref();
        let usage = cpu.and_then(|c| c.cpu_usage.as_ref());
        let total = usage.and_then(|u| u.total_usage).unwrap_or(0);
        let system = cpu.and_then(|c| c.system_cpu_usage).unwrap_or(0);
        let cpus = cpu
            .and_then(|c| c.online_cpus)
            .filter(|n| *n > 0)
            .or_else(|| {
                usage
                    .and_then(|u| u.percpu_usage.as_ref())
                    .and_then(|p| u32::try_from(p.len()).ok())
            })
            .unwrap_or(1);
        let mut last = self.last_cpu.lock().unwrap_or_else(PoisonError::into_inner);
        let cpu_percent = match *last {
            Some((t0, s0)) if system > s0 && total >= t0 => {
                (total - t0) as f64 / (system - s0) as f64 * f64::from(cpus) * 100.0
            }
            _ => 0.0,
        };
        *last = Some((total, system));
        TaskStats::default()
            .with_memory_rss_bytes(memory_in_use(s))
            .with_cpu_time(
                Duration::from_nanos(usage.and_then(|u| u.usage_in_usermode).unwrap_or(0)),
                Duration::from_nanos(usage.and_then(|u| u.usage_in_kernelmode).unwrap_or(0)),
            )
            .with_cpu_percent(cpu_percent)
            .with_memory_cache_bytes(memory_cache(s))
            .with_process_count(s.pids_stats.as_ref().and_then(|p| p.current).unwrap_or(0))
    }
}

/// Page cache charged to the container (`cache` on cgroup v1, `file` on v2).
fn memory_cache(s: &ContainerStatsResponse) -> u64 {
    s.memory_stats
        .as_ref()
        .and_then(|m| m.stats.as_ref())
        .and_then(|st| ["cache", "file"].iter().find_map(|k| st.get(*k).copied()))
        .unwrap_or(0)
}

/// Memory in use without the reclaimable page cache, as `docker stats` shows it.
fn memory_in_use(s: &ContainerStatsResponse) -> u64 {
    let Some(m) = s.memory_stats.as_ref() else {
        return 0;
    };
    let usage = m.usage.unwrap_or(0);
    let cache = m.stats.as_ref().and_then(|st| {
        // cgroup v1, cgroup v2, older daemons.
        ["total_inactive_file", "inactive_file", "cache"]
            .iter()
            .find_map(|k| st.get(*k).copied())
    });
    usage.saturating_sub(cache.unwrap_or(0))
}

/// A container's end as an exit result.
pub(crate) fn exit_result(state: &ContainerState) -> ExitResult {
    let result = ExitResult::code(
        state
            .exit_code
            .and_then(|c| i32::try_from(c).ok())
            .unwrap_or(-1),
    )
    .with_oom_killed(state.oom_killed.unwrap_or(false));
    match state.error.as_deref().filter(|e| !e.is_empty()) {
        Some(e) => result.with_err(e),
        None => result,
    }
}

/// Docker's RFC 3339 time, `None` for its zero time or garbage.
pub(crate) fn docker_time(text: Option<&str>) -> Option<SystemTime> {
    let text = text?;
    let t = humantime::parse_rfc3339(text)
        .or_else(|_| humantime::parse_rfc3339_weak(text))
        .ok()?;
    (t > SystemTime::UNIX_EPOCH).then_some(t)
}

fn gone(task: &Task) -> ExitResult {
    ExitResult::unknown(format!(
        "container {} was removed outside Drover; its exit status is unknown",
        short(&task.state.container_id)
    ))
}

/// The first 12 characters of a container id, as `docker ps` shows it.
pub(crate) fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Watch the container until it exits, then record the result (after the log follower
/// is done). Survives the daemon going away and coming back: the wait is asked again,
/// and the container's state read once it answers. Returns the result if this call
/// recorded it; `None` when cancelled or when another path recorded one first.
pub(crate) async fn watch_exit(task: Arc<Task>) -> Option<ExitResult> {
    watch_oom(&task).await;
    let (result, at) = wait_for_end(&task).await?;
    // Stopped: a stop in progress need not wait for the OOM verdict or the logs.
    task.ended.send_replace(true);
    let (result, ()) = tokio::join!(with_own_oom(&task, result), task.logs_drained());
    task.finish(result.clone(), at).then_some(result)
}

/// Start watching the container's memory cgroup for OOM kills, when the daemon is on
/// this host (a unix socket) and answers; without it Docker's own flag is used.
async fn watch_oom(task: &Task) {
    if task.oom.get().is_some() || !matches!(task.engine.endpoint(), Endpoint::Unix(_)) {
        return;
    }
    let Ok(docker) = task.engine.client().await else {
        return;
    };
    let cid = task.state.container_id.as_str();
    let Ok(info) = docker.inspect_container(cid, None).await else {
        return;
    };
    let pid = info.state.as_ref().and_then(|s| s.pid).unwrap_or(0);
    let parent = info
        .host_config
        .as_ref()
        .and_then(|h| h.cgroup_parent.clone())
        .unwrap_or_default();
    if let Some(w) = oom::watch(pid, cid, &parent) {
        let _ = task.oom.set(w);
    }
}

/// Docker's exit result, with the OOM kill the plugin saw itself when Docker missed
/// it: a container killed by SIGKILL whose cgroup recorded an OOM kill.
async fn with_own_oom(task: &Task, result: ExitResult) -> ExitResult {
    if result.oom_killed || result.exit_code != SIGKILL_EXIT {
        return result;
    }
    let Some(w) = task.oom.get() else {
        return result;
    };
    if w.killed_within(OOM_SETTLE).await {
        tracing::info!(
            task = %task.id,
            "container {} was OOM killed (seen in its memory cgroup; Docker missed the late OOM event)",
            short(&task.state.container_id)
        );
        return result.with_oom_killed(true);
    }
    result
}

async fn wait_for_end(task: &Task) -> Option<(ExitResult, SystemTime)> {
    let engine = &task.engine;
    let cid = task.state.container_id.as_str();
    let mut backoff = Backoff::new();
    loop {
        if task.cancel.is_cancelled() {
            return None;
        }
        let docker = match engine.client().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(task = %task.id, "waiting for the container: {e}");
                if !backoff.pause(&task.cancel).await {
                    return None;
                }
                continue;
            }
        };
        let options = bollard::query_parameters::WaitContainerOptions {
            condition: "not-running".into(),
        };
        let mut waiter = docker.wait_container(cid, Some(options));
        let answer = tokio::select! {
            a = waiter.next() => a,
            () = task.cancel.cancelled() => return None,
        };
        match answer {
            // A non-zero exit comes as an error from bollard; either way it has exited.
            Some(Ok(_) | Err(bollard::errors::Error::DockerContainerWaitError { .. })) => {}
            Some(Err(e)) if status_of(&e) == Some(404) => {
                return Some((gone(task), SystemTime::now()));
            }
            Some(Err(e)) => {
                if !is_transport(&e) {
                    tracing::warn!(task = %task.id, "waiting for container {}: {e}", short(cid));
                }
                if !backoff.pause(&task.cancel).await {
                    return None;
                }
                continue;
            }
            // The daemon went away mid-wait.
            None => {
                if !backoff.pause(&task.cancel).await {
                    return None;
                }
                continue;
            }
        }
        match docker.inspect_container(cid, None).await {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                if state.running == Some(true) {
                    // Started again by someone between the wait and now: wait again.
                    continue;
                }
                let at = docker_time(state.finished_at.as_deref()).unwrap_or_else(SystemTime::now);
                return Some((exit_result(&state), at));
            }
            Err(e) if status_of(&e) == Some(404) => return Some((gone(task), SystemTime::now())),
            Err(e) => {
                tracing::debug!(task = %task.id, "inspecting container {}: {e}", short(cid));
                if !backoff.pause(&task.cancel).await {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Endpoint;
    use bollard::models::{ContainerCpuStats, ContainerCpuUsage, ContainerMemoryStats};

    fn stats(total: u64, system: u64, mem: u64, cache: u64) -> ContainerStatsResponse {
        ContainerStatsResponse {
            cpu_stats: Some(ContainerCpuStats {
                cpu_usage: Some(ContainerCpuUsage {
                    total_usage: Some(total),
                    usage_in_usermode: Some(total / 2),
                    usage_in_kernelmode: Some(total / 4),
                    ..Default::default()
                }),
                system_cpu_usage: Some(system),
                online_cpus: Some(2),
                ..Default::default()
            }),
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(mem),
                stats: Some([("total_inactive_file".to_owned(), cache)].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_percent_is_per_core_between_samples() {
        let t = Task::new(
            &TaskSpec::default(),
            HandleState {
                container_id: "c".into(),
                image: "i".into(),
            },
            SystemTime::now(),
            Arc::new(Engine::new(crate::engine::DaemonAddress {
                endpoint: Endpoint::Unix("/nonexistent".into()),
                source: crate::engine::AddressSource::Config,
                api_version: None,
            })),
        );
        let first = t.sample(&stats(1_000, 10_000, 100 << 20, 30 << 20));
        assert_eq!(first.cpu_percent, 0.0);
        assert_eq!(first.memory_rss_bytes, 70 << 20);
        assert_eq!(first.cpu_user, Duration::from_nanos(500));
        // 500 ns of container CPU over 1000 ns of system CPU on 2 CPUs: one full core.
        let second = t.sample(&stats(1_500, 11_000, 100 << 20, 0));
        assert!((second.cpu_percent - 100.0).abs() < 1e-9, "{second:?}");
    }

    #[test]
    fn exit_results_and_times() {
        let s = ContainerState {
            exit_code: Some(137),
            oom_killed: Some(true),
            error: Some(String::new()),
            ..Default::default()
        };
        let r = exit_result(&s);
        assert_eq!((r.exit_code, r.oom_killed, r.err), (137, true, None));
        assert!(docker_time(Some("0001-01-01T00:00:00Z")).is_none());
        let t = docker_time(Some("2024-05-01T10:00:00.123456789Z")).unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos(),
            123_456_789
        );
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
    }
}
