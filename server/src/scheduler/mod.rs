//! The scheduler: a pure function of the state and an evaluation that returns a plan.
//!
//! The types below are the contract between the scheduler and the server core that runs
//! it and applies its plans.
//!
//! `schedule` reconciles what the job wants against the allocations it has (per job
//! type: service, batch, system), then places what is missing: feasibility (driver
//! detected and healthy, constraints, resources that fit), ranking (bin-packing by
//! default, spread as an option, anti-affinity between a job's allocations), over a
//! bounded random sample of feasible nodes as Nomad's limit iterator does.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use drover_server_api::{
    AllocDeploymentStatus, AllocResources, Allocation, Deployment, Evaluation, GroupPlanSummary,
    Index, Job, Node, PlacementFailure,
};

use crate::config::SchedulerAlgorithm;

pub(crate) mod csi;
pub(crate) mod devices;
mod feasible;
mod place;
pub(crate) mod ports;
mod rank;
mod reconcile;
#[cfg(test)]
pub(crate) mod tests;

use place::{Placed, Placer};
pub use ports::UsedPorts;
pub(crate) use reconcile::changed;

/// A consistent read of the state the scheduler works on.
pub trait StateView {
    /// The index the view is consistent with.
    fn index(&self) -> Index;
    /// The current version of the job named `name` in namespace `ns` (also a stopped
    /// job: `job.stop`).
    fn job(&self, ns: &str, name: &str) -> Option<&Job>;
    /// The job as it was at `version` (the spec its older allocations run), if still
    /// kept. The scheduler compares an allocation's group at its version with the
    /// current one to tell a destructive update (a task changed) from a count change.
    ///
    /// The default knows only the current version: every allocation of an older
    /// version then counts as changed. A state that keeps `jobv/<name>/<version>`
    /// should answer from it.
    fn job_version(&self, ns: &str, name: &str, version: u64) -> Option<&Job> {
        self.job(ns, name).filter(|j| j.version == version)
    }
    /// The job's newest deployment (of any version, in any status), if any. The
    /// default: none (a state without deployments).
    fn latest_deployment(&self, ns: &str, job: &str) -> Option<&Deployment> {
        let _ = (ns, job);
        None
    }
    /// The CSI volume `id` of namespace `ns`. The default: none (a state without
    /// CSI volumes).
    fn csi_volume(&self, ns: &str, id: &str) -> Option<&drover_server_api::csi::CsiVolume> {
        let _ = (ns, id);
        None
    }
    /// The live claims of CSI volume `id` of namespace `ns`. The default: none.
    fn csi_claims(&self, ns: &str, id: &str) -> Vec<drover_server_api::csi::CsiClaim> {
        let _ = (ns, id);
        Vec::new()
    }
    /// Every node, in a stable order.
    fn nodes(&self) -> Vec<&Node>;
    /// One node.
    fn node(&self, id: &str) -> Option<&Node>;
    /// Every allocation of the job, terminal ones included.
    fn job_allocs(&self, ns: &str, job: &str) -> Vec<&Allocation>;
    /// Every allocation on the node, terminal ones included.
    fn node_allocs(&self, node_id: &str) -> Vec<&Allocation>;
    /// What the node's non-terminal allocations reserve.
    fn node_usage(&self, node_id: &str) -> AllocResources;
    /// The ports the node's non-terminal allocations hold (`None`: none).
    ///
    /// The default builds them from [`StateView::node_allocs`]; the server's state
    /// keeps them indexed and lends them.
    fn node_ports(&self, node_id: &str) -> Option<Cow<'_, UsedPorts>> {
        let mut used = UsedPorts::default();
        for a in self.node_allocs(node_id) {
            if !a.is_terminal() {
                used.add_alloc(a);
            }
        }
        (!used.is_empty()).then_some(Cow::Owned(used))
    }
}

/// An allocation the plan stops or marks lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocStop {
    /// The allocation.
    pub alloc_id: String,
    /// Why, for people ("job stopped", "node down", "replaced by version 3"...).
    pub desired_description: String,
    /// Its node is down: the client status becomes `lost` too.
    pub lost: bool,
}

/// What a worker wants committed for one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The evaluation it answers.
    pub eval_id: String,
    /// The job's namespace.
    pub namespace: String,
    /// The job.
    pub job_name: String,
    /// The job spec index it was made for: a plan for an older spec is refused.
    pub job_modify_index: Index,
    /// The index of the state it was made on.
    pub snapshot_index: Index,
    /// New allocations, by node id. Their ids (UUID v4) are the scheduler's; their
    /// indexes and times are 0 until the applier sets them.
    pub node_allocation: BTreeMap<String, Vec<Allocation>>,
    /// Allocations to stop, by node id.
    pub node_update: BTreeMap<String, Vec<AllocStop>>,
    /// A deployment the plan creates (its counts are the applier's: it adds what it
    /// commits of `node_allocation`), or the job's current one with a change.
    pub deployment: Option<Deployment>,
}

impl Default for Plan {
    /// An empty plan for a job of the `default` namespace.
    fn default() -> Plan {
        Plan {
            eval_id: String::new(),
            namespace: drover_server_api::DEFAULT_NAMESPACE.to_owned(),
            job_name: String::new(),
            job_modify_index: 0,
            snapshot_index: 0,
            node_allocation: BTreeMap::new(),
            node_update: BTreeMap::new(),
            deployment: None,
        }
    }
}

impl Plan {
    /// Nothing to commit.
    pub fn is_empty(&self) -> bool {
        self.node_allocation.values().all(Vec::is_empty)
            && self.node_update.values().all(Vec::is_empty)
            && self.deployment.is_none()
    }
}

/// What the scheduler decided for an evaluation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerOutput {
    /// The plan to apply.
    pub plan: Plan,
    /// Groups that could not be (fully) placed, with reasons.
    pub failed_tg_allocs: BTreeMap<String, PlacementFailure>,
    /// Copies still to place, by group.
    pub queued_allocations: BTreeMap<String, u32>,
    /// A rolling update has more batches to go once the new allocations run.
    pub rolling_update_pending: bool,
    /// What the plan does to each group (places, stops, destructive updates, left
    /// alone): the answer of `job plan`.
    pub desired_tg_updates: BTreeMap<String, GroupPlanSummary>,
    /// A failed allocation waits for its reschedule delay: evaluate the job again at
    /// this time (unix nanoseconds).
    pub follow_up_at: Option<i64>,
}

/// Settings the scheduler reads.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerSettings {
    /// Ranking.
    pub algorithm: SchedulerAlgorithm,
    /// The current time (unix nanoseconds): whether a failed allocation's reschedule
    /// delay has passed.
    pub now: i64,
}

/// Reconcile and place for `eval` on `state`.
///
/// Reads the job, its allocations and the nodes; returns the allocations to stop and
/// to create, and what could not be placed. Nothing is written: the plan applier
/// re-checks the plan against the newest state. The same evaluation id on the same
/// state gives the same placements (nodes are visited in an order seeded by it); only
/// the new allocations' ids differ.
pub fn schedule(
    state: &dyn StateView,
    eval: &Evaluation,
    settings: SchedulerSettings,
) -> SchedulerOutput {
    let job = state.job(&eval.namespace, &eval.job_name);
    let allocs = state.job_allocs(&eval.namespace, &eval.job_name);
    let rec = reconcile::reconcile(state, job, &allocs, settings.now);
    let mut out = SchedulerOutput {
        plan: Plan {
            eval_id: eval.id.clone(),
            namespace: eval.namespace.clone(),
            job_name: eval.job_name.clone(),
            job_modify_index: job.map_or(0, |j| j.job_modify_index),
            snapshot_index: state.index(),
            ..Plan::default()
        },
        rolling_update_pending: rec.rolling_update_pending,
        desired_tg_updates: rec.summary.clone(),
        follow_up_at: rec.follow_up,
        ..SchedulerOutput::default()
    };
    for stop in &rec.stops {
        out.plan
            .node_update
            .entry(stop.alloc.node_id.clone())
            .or_default()
            .push(AllocStop {
                alloc_id: stop.alloc.id.clone(),
                desired_description: stop.description.clone(),
                lost: stop.lost,
            });
    }
    let Some(job) = job.filter(|j| !j.stop) else {
        return out;
    };

    // The deployment the placements join: the one the plan creates or changes, else
    // the job's running one for this version.
    let deployment_id = rec
        .deployment
        .as_ref()
        .map(|d| d.id.clone())
        .or_else(|| rec.active_deployment.map(|d| d.id.clone()));
    out.plan.deployment = rec.deployment.clone();
    let mut placer = Placer::new(state, job, &allocs, &eval.id, settings.algorithm);
    for stop in &rec.stops {
        placer.stopped(stop.alloc);
    }
    for g in &job.spec.groups {
        out.queued_allocations.insert(g.name.clone(), 0);
    }
    // System jobs: the nodes a group did not fit on, by group.
    let mut system_full: HashMap<&str, Vec<&Node>> = HashMap::new();
    // The new allocations by node position, in placement order: keyed by the node's
    // id only once per node at the end, not per placement.
    let mut placed: HashMap<usize, Vec<Allocation>> = HashMap::new();
    for p in &rec.places {
        let name = p.group.name.as_str();
        if let Some(f) = out.failed_tg_allocs.get_mut(name) {
            // Once a copy of a group found no node, the others (same needs, fuller
            // cluster) find none either.
            f.unplaced += 1;
            continue;
        }
        match placer.place(p.group, p.previous, p.node) {
            Placed::Node(i) => {
                let mut alloc = placer.allocation(p.group, p.index, i, p.previous);
                alloc.reschedule_events.clone_from(&p.reschedule_events);
                if p.deployment {
                    alloc.deployment_id = deployment_id.clone();
                    if p.canary {
                        alloc.deployment_status = Some(AllocDeploymentStatus {
                            canary: true,
                            ..AllocDeploymentStatus::default()
                        });
                    }
                }
                placed.entry(i).or_default().push(alloc);
            }
            Placed::Failed => match p.node {
                Some(node) => system_full.entry(name).or_default().push(node),
                None => {
                    let failure = placer.failure(p.group, 1);
                    out.failed_tg_allocs.insert(name.to_owned(), failure);
                }
            },
            Placed::Skipped => {}
        }
    }
    for (i, allocs) in placed {
        out.plan
            .node_allocation
            .insert(placer.node(i).id.clone(), allocs);
    }
    for g in &job.spec.groups {
        if let Some(nodes) = system_full.get(g.name.as_str()) {
            out.failed_tg_allocs
                .insert(g.name.clone(), placer.system_failure(g, nodes));
        }
    }
    for (name, f) in &out.failed_tg_allocs {
        out.queued_allocations.insert(name.clone(), f.unplaced);
    }
    // Nothing placed in the deployment (no node fit): nothing to create or change.
    if let Some(d) = &out.plan.deployment {
        let used = out
            .plan
            .node_allocation
            .values()
            .flatten()
            .any(|a| a.deployment_id.as_deref() == Some(d.id.as_str()));
        if !used {
            out.plan.deployment = None;
        }
    }
    out
}
