//! The agent's metrics (`GET /v1/metrics` on its socket; every name in
//! docs/metrics.md).
//!
//! One agent runs per process, so its counters are process-wide ([`metrics`]):
//! they move where the work is done (a task started, restarted or failed, a plugin
//! relaunched or handshaken) without being threaded through every constructor.
//! Gauges (tasks and plugins by state) are read when a scrape asks, and so is each
//! running allocation task's CPU and memory, sampled from its driver into a registry
//! of that scrape alone: an allocation that is gone has no series in the next one.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use drover_api::{PluginState, TaskLifecycle};
use drover_metrics::{LabelText, PREFIX};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tokio_stream::StreamExt as _;

use crate::api::ApiState;

/// A state as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabel {
    pub state: &'static str,
}

/// A plugin as a label (plugins are the operator's: bounded by the config).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PluginLabel {
    pub plugin: LabelText,
}

/// A task of an allocation on this node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AllocTaskLabels {
    alloc_id: LabelText,
    task: LabelText,
}

/// The agent's counters and histograms, and its gauges by state.
pub(crate) struct AgentMetrics {
    registry: Registry,
    pub task_starts: Counter,
    pub task_restarts: Counter,
    pub task_failures: Counter,
    pub plugin_restarts: Family<PluginLabel, Counter>,
    pub plugin_handshake: Family<PluginLabel, Histogram, fn() -> Histogram>,
    tasks: Family<StateLabel, Gauge>,
    plugins: Family<StateLabel, Gauge>,
}

/// The process's agent metrics.
pub(crate) fn metrics() -> &'static AgentMetrics {
    static METRICS: LazyLock<AgentMetrics> = LazyLock::new(AgentMetrics::new);
    &METRICS
}

impl AgentMetrics {
    fn new() -> AgentMetrics {
        let m = AgentMetrics {
            registry: Registry::default(),
            task_starts: Counter::default(),
            task_restarts: Counter::default(),
            task_failures: Counter::default(),
            plugin_restarts: Family::default(),
            plugin_handshake: Family::new_with_constructor(
                drover_metrics::latency_histogram as fn() -> Histogram,
            ),
            tasks: Family::default(),
            plugins: Family::default(),
        };
        let mut r = Registry::with_prefix(format!("{PREFIX}_agent"));
        r.register(
            "task_starts",
            "Task incarnations a driver started (first starts and restarts)",
            m.task_starts.clone(),
        );
        r.register(
            "task_restarts",
            "Task incarnations started again by the restart policy or a failing check",
            m.task_restarts.clone(),
        );
        r.register(
            "task_failures",
            "Task incarnations that failed to start or exited unsuccessfully (non-zero code, signal, OOM kill, error)",
            m.task_failures.clone(),
        );
        r.register(
            "plugin_restarts",
            "Plugin processes relaunched after they died",
            m.plugin_restarts.clone(),
        );
        r.register_with_unit(
            "plugin_handshake_duration",
            "Time from launching a plugin to its handshake (a library: to its load)",
            Unit::Seconds,
            m.plugin_handshake.clone(),
        );
        r.register("tasks", "Tasks by state", m.tasks.clone());
        r.register("plugins", "Plugins by state", m.plugins.clone());
        AgentMetrics { registry: r, ..m }
    }
}

/// How long a scrape waits for a task's driver to give a sample.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(2);

/// The agent's metrics now, as OpenMetrics families without `# EOF`.
pub(crate) async fn families(s: &ApiState, allocations: bool) -> String {
    let m = metrics();
    let tasks = s.tasks.list();
    let mut by_state = [
        (TaskLifecycle::Pending, 0i64),
        (TaskLifecycle::Running, 0),
        (TaskLifecycle::Dead, 0),
    ];
    for t in &tasks {
        if let Some((_, n)) = by_state.iter_mut().find(|(st, _)| *st == t.state) {
            *n += 1;
        }
    }
    for (state, n) in by_state {
        m.tasks
            .get_or_create(&StateLabel {
                state: state.as_str(),
            })
            .set(n);
    }
    let mut plugins = [
        (PluginState::Healthy, "healthy", 0i64),
        (PluginState::Unhealthy, "unhealthy", 0),
        (PluginState::Undetected, "undetected", 0),
        (PluginState::Skipped, "skipped", 0),
    ];
    for p in s.catalog.status() {
        if let Some((_, _, n)) = plugins.iter_mut().find(|(st, _, _)| *st == p.state) {
            *n += 1;
        }
    }
    for (_, state, n) in plugins {
        m.plugins.get_or_create(&StateLabel { state }).set(n);
    }
    let mut out = drover_metrics::families(&m.registry);
    if allocations {
        out.push_str(&alloc_usage(s).await);
    }
    out
}

/// Each running allocation task's CPU time and memory, sampled from its driver now
/// (one sample each, all at once, each bounded by [`SAMPLE_TIMEOUT`]).
async fn alloc_usage(s: &ApiState) -> String {
    let cpu = Family::<AllocTaskLabels, Counter<f64, AtomicU64>>::default();
    let rss = Family::<AllocTaskLabels, Gauge>::default();
    let mut r = Registry::with_prefix(format!("{PREFIX}_agent"));
    r.register_with_unit(
        "alloc_cpu",
        "CPU time (user and system) of an allocation's running task since it started",
        Unit::Seconds,
        cpu.clone(),
    );
    r.register_with_unit(
        "alloc_memory_rss",
        "Resident memory of an allocation's running task",
        Unit::Bytes,
        rss.clone(),
    );
    let Some(allocs) = &s.allocs else {
        return drover_metrics::families(&r);
    };
    let mut sampling = tokio::task::JoinSet::new();
    for (alloc_id, task, id) in allocs.all_task_ids() {
        let Ok(view) = s.tasks.status(&id) else {
            continue;
        };
        if view.state != TaskLifecycle::Running {
            continue;
        }
        let Ok(plugin) = crate::api::live_driver(s, &view) else {
            continue;
        };
        sampling.spawn(async move {
            let sample = tokio::time::timeout(SAMPLE_TIMEOUT, async {
                let mut samples = plugin
                    .client()
                    .task_stats(&id, crate::api::ONE_SHOT_INTERVAL)
                    .await
                    .ok()?;
                samples.next().await?.ok()
            })
            .await
            .ok()
            .flatten();
            (alloc_id, task, sample)
        });
    }
    while let Some(done) = sampling.join_next().await {
        // A task that ended meanwhile, or a slow driver: no series this time.
        let Ok((alloc_id, task, Some(sample))) = done else {
            continue;
        };
        let labels = AllocTaskLabels {
            alloc_id: LabelText(alloc_id),
            task: LabelText(task),
        };
        cpu.get_or_create(&labels)
            .inc_by((sample.cpu_user + sample.cpu_system).as_secs_f64());
        rss.get_or_create(&labels)
            .set(i64::try_from(sample.memory_rss_bytes).unwrap_or(i64::MAX));
    }
    drover_metrics::families(&r)
}
