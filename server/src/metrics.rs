//! The server's metrics (`GET /v1/metrics`; every name in docs/metrics.md).
//!
//! Two kinds: what moves as work is done (counters and latency histograms, updated
//! where the work is: the HTTP and RPC layers, the workers, the plan applier, the
//! commit, the heartbeat timers), and what the state is (gauges: nodes, jobs and
//! allocations by status, the broker's queues, leadership), read from the state
//! when a scrape asks ([`ServerMetrics::refresh`]). Labels are bounded: route
//! templates, methods, status classes, enumerated statuses; never raw paths or ids.

use std::collections::HashMap;

use drover_metrics::prometheus_client::encoding::EncodeLabelSet;
use drover_metrics::prometheus_client::metrics::counter::Counter;
use drover_metrics::prometheus_client::metrics::family::Family;
use drover_metrics::prometheus_client::metrics::gauge::Gauge;
use drover_metrics::prometheus_client::metrics::histogram::Histogram;
use drover_metrics::prometheus_client::registry::{Registry, Unit};
use drover_metrics::{LabelText, PREFIX};
use drover_server_api::{ClientStatus, JobStatus, NodeStatus};

use crate::state::State;

/// A status as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabel {
    pub status: &'static str,
}

/// An HTTP request as labels: the route as routed (`/v1/job/{id}`, `unmatched` for a
/// 404 of no route), the method, the status class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HttpLabels {
    pub route: LabelText,
    pub method: &'static str,
    pub status: &'static str,
}

/// An RPC as labels: its gRPC method path (`unknown` for a method no service has).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RpcLabels {
    pub method: LabelText,
}

/// An evaluation's end in a worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabel {
    pub outcome: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The server's metrics and the registry that exposes them.
pub(crate) struct ServerMetrics {
    registry: Registry,
    is_leader: Gauge,
    broker_ready: Gauge,
    broker_unacked: Gauge,
    broker_delayed: Gauge,
    blocked_evals: Gauge,
    plan_queue_depth: Gauge,
    nodes: Family<StatusLabel, Gauge>,
    jobs: Family<StatusLabel, Gauge>,
    allocs: Family<StatusLabel, Gauge>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: HistogramFamily<HttpLabels>,
    pub rpc_requests: Family<RpcLabels, Counter>,
    pub rpc_duration: HistogramFamily<RpcLabels>,
    pub plan_apply_duration: Histogram,
    pub plans_applied: Counter,
    pub scheduler_duration: Histogram,
    pub placement_failures: Counter,
    pub evaluations: Family<OutcomeLabel, Counter>,
    pub store_commit_duration: Histogram,
    pub heartbeats_missed: Counter,
}

/// What a scrape reads from outside the state: the leader's term, when leading.
pub(crate) struct TermGauges {
    pub ready: usize,
    pub unacked: usize,
    pub delayed: usize,
    pub plan_queue_depth: usize,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerMetrics {
    pub(crate) fn new() -> ServerMetrics {
        let hist = drover_metrics::latency_histogram as fn() -> Histogram;
        let m = ServerMetrics {
            registry: Registry::default(),
            is_leader: Gauge::default(),
            broker_ready: Gauge::default(),
            broker_unacked: Gauge::default(),
            broker_delayed: Gauge::default(),
            blocked_evals: Gauge::default(),
            plan_queue_depth: Gauge::default(),
            nodes: Family::default(),
            jobs: Family::default(),
            allocs: Family::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(hist),
            rpc_requests: Family::default(),
            rpc_duration: Family::new_with_constructor(hist),
            plan_apply_duration: drover_metrics::latency_histogram(),
            plans_applied: Counter::default(),
            scheduler_duration: drover_metrics::latency_histogram(),
            placement_failures: Counter::default(),
            evaluations: Family::default(),
            store_commit_duration: drover_metrics::latency_histogram(),
            heartbeats_missed: Counter::default(),
        };
        let mut r = Registry::with_prefix(format!("{PREFIX}_server"));
        r.register(
            "is_leader",
            "1 while this server leads, else 0",
            m.is_leader.clone(),
        );
        r.register(
            "broker_ready_evaluations",
            "Evaluations in the leader's broker waiting for a worker (ready, or behind another evaluation of their job)",
            m.broker_ready.clone(),
        );
        r.register(
            "broker_unacked_evaluations",
            "Evaluations a worker holds and has not acknowledged yet",
            m.broker_unacked.clone(),
        );
        r.register(
            "broker_delayed_evaluations",
            "Evaluations waiting for their wait_until (reschedule delays)",
            m.broker_delayed.clone(),
        );
        r.register(
            "blocked_evaluations",
            "Blocked evaluations: placements waiting for capacity",
            m.blocked_evals.clone(),
        );
        r.register(
            "plan_queue_depth",
            "Plans waiting for the plan applier",
            m.plan_queue_depth.clone(),
        );
        r.register("nodes", "Client nodes by status", m.nodes.clone());
        r.register("jobs", "Jobs by status", m.jobs.clone());
        r.register(
            "allocations",
            "Allocations by client status (terminal ones until garbage collected)",
            m.allocs.clone(),
        );
        r.register(
            "http_requests",
            "HTTP API requests answered, by route template, method and status class",
            m.http_requests.clone(),
        );
        r.register_with_unit(
            "http_request_duration",
            "Time to answer an HTTP API request (to the response head; blocking queries wait up to their wait time)",
            Unit::Seconds,
            m.http_duration.clone(),
        );
        r.register(
            "rpc_requests",
            "Cluster RPCs served (agents and other servers), by gRPC method",
            m.rpc_requests.clone(),
        );
        r.register_with_unit(
            "rpc_request_duration",
            "Time to answer a cluster RPC (to the response head: a stream counts until it starts)",
            Unit::Seconds,
            m.rpc_duration.clone(),
        );
        r.register_with_unit(
            "plan_apply_duration",
            "Time the plan applier takes to check and commit one batch of plans",
            Unit::Seconds,
            m.plan_apply_duration.clone(),
        );
        r.register(
            "plans_applied",
            "Plans the plan applier checked and committed",
            m.plans_applied.clone(),
        );
        r.register_with_unit(
            "scheduler_placement_duration",
            "Time one scheduling pass of an evaluation takes (reconcile, feasibility, ranking)",
            Unit::Seconds,
            m.scheduler_duration.clone(),
        );
        r.register(
            "scheduler_placement_failures",
            "Allocations a scheduling pass could not place (each pass of a blocked evaluation counts again)",
            m.placement_failures.clone(),
        );
        r.register(
            "evaluations",
            "Evaluations a worker finished, by outcome (acked, nacked, failed)",
            m.evaluations.clone(),
        );
        r.register_with_unit(
            "store_commit_duration",
            "Time a commit's store transaction takes",
            Unit::Seconds,
            m.store_commit_duration.clone(),
        );
        r.register(
            "heartbeats_missed",
            "Nodes marked down because their heartbeats stopped",
            m.heartbeats_missed.clone(),
        );
        ServerMetrics { registry: r, ..m }
    }

    /// Set the gauges from the state and the leader's term (`None`: following).
    pub(crate) fn refresh(&self, st: &State, leading: bool, term: Option<TermGauges>) {
        self.is_leader.set(i64::from(leading));
        let term = term.unwrap_or(TermGauges {
            ready: 0,
            unacked: 0,
            delayed: 0,
            plan_queue_depth: 0,
        });
        self.broker_ready.set(to_i64(term.ready));
        self.broker_unacked.set(to_i64(term.unacked));
        self.broker_delayed.set(to_i64(term.delayed));
        self.plan_queue_depth.set(to_i64(term.plan_queue_depth));
        self.blocked_evals.set(to_i64(st.blocked_evals().count()));
        // Every status is set, 0 when none: a series never goes stale.
        let mut nodes: HashMap<&'static str, i64> = [
            NodeStatus::Initializing,
            NodeStatus::Ready,
            NodeStatus::Down,
            NodeStatus::Draining,
        ]
        .iter()
        .map(|s| (s.as_str(), 0))
        .collect();
        for n in st.all_nodes() {
            *nodes.entry(n.status.as_str()).or_default() += 1;
        }
        set_all(&self.nodes, nodes);
        let job_status = |s: JobStatus| match s {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Dead => "dead",
        };
        let mut jobs: HashMap<&'static str, i64> =
            [JobStatus::Pending, JobStatus::Running, JobStatus::Dead]
                .iter()
                .map(|s| (job_status(*s), 0))
                .collect();
        for j in st.jobs() {
            // As the API shows it: derived from the job's allocations and evaluations.
            let status = crate::endpoints::jobs::job_status(st, j);
            *jobs.entry(job_status(status)).or_default() += 1;
        }
        set_all(&self.jobs, jobs);
        let mut allocs: HashMap<&'static str, i64> = [
            ClientStatus::Pending,
            ClientStatus::Running,
            ClientStatus::Complete,
            ClientStatus::Failed,
            ClientStatus::Lost,
        ]
        .iter()
        .map(|s| (s.as_str(), 0))
        .collect();
        for a in st.all_allocs() {
            *allocs.entry(a.client_status.as_str()).or_default() += 1;
        }
        set_all(&self.allocs, allocs);
    }

    /// The registry's families (OpenMetrics, no `# EOF`).
    pub(crate) fn families(&self) -> String {
        drover_metrics::families(&self.registry)
    }
}

fn set_all(family: &Family<StatusLabel, Gauge>, counts: HashMap<&'static str, i64>) {
    for (status, n) in counts {
        family.get_or_create(&StatusLabel { status }).set(n);
    }
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
