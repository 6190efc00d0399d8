//! Reconciliation: what a job wants against the allocations it has. The result is a
//! list of allocations to stop and of copies to place; placing them is the placer's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use drover_server_api::{
    Allocation, ClientStatus, Deployment, DeploymentGroup, DeploymentStatus, DesiredStatus,
    GroupPlanSummary, Job, JobType, Node, NodeStatus, RescheduleEvent, ReschedulePolicy, TaskGroup,
    UpdateStrategy,
};

use super::StateView;

/// An allocation to stop.
#[derive(Debug)]
pub(crate) struct Stop<'a> {
    pub alloc: &'a Allocation,
    pub description: String,
    /// Its node is down: the allocation is lost.
    pub lost: bool,
}

/// A copy to place.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    pub group: &'a TaskGroup,
    pub index: u32,
    /// The allocation it replaces (failed, lost, drained, or of an older version).
    pub previous: Option<&'a Allocation>,
    /// System jobs: only this node.
    pub node: Option<&'a Node>,
    /// A failed allocation's replacement: the reschedule history it carries on.
    pub reschedule_events: Vec<RescheduleEvent>,
    /// It joins the job's deployment (the plan's new one, or the running one).
    pub deployment: bool,
    /// Placed as a canary: next to the old version, until promoted.
    pub canary: bool,
}

/// What reconciliation decided.
#[derive(Debug, Default)]
pub(crate) struct Reconciled<'a> {
    pub stops: Vec<Stop<'a>>,
    pub places: Vec<Place<'a>>,
    /// Some allocations still run an older version: more batches follow.
    pub rolling_update_pending: bool,
    /// Per group, for `job plan`.
    pub summary: BTreeMap<String, GroupPlanSummary>,
    /// The earliest time (unix nanoseconds) a failed allocation left waiting for its
    /// reschedule delay is due: the evaluation gets a follow-up for then.
    pub follow_up: Option<i64>,
    /// A deployment the plan creates, or the running one with a group added.
    pub deployment: Option<Deployment>,
    /// The job's running deployment of its current version, unchanged by the plan.
    pub active_deployment: Option<&'a Deployment>,
}

/// The job's deployment of its current version as reconciliation sees it.
struct Deploy<'a> {
    /// The job's deployment of this version, in any status.
    existing: Option<&'a Deployment>,
    /// What the plan creates or changes (a copy of `existing` once changed).
    changed: Option<Deployment>,
}

impl Deploy<'_> {
    /// The deployment as the plan will have it.
    fn current(&self) -> Option<&Deployment> {
        self.changed.as_ref().or(self.existing)
    }

    fn status(&self) -> Option<DeploymentStatus> {
        self.current().map(|d| d.status)
    }

    /// The group's state, creating the deployment (for `job`'s version) and the group
    /// as needed. `None` when the version's deployment is over (successful, failed,
    /// cancelled): placements then join none.
    fn group(
        &mut self,
        job: &Job,
        group: &TaskGroup,
        u: &UpdateStrategy,
        canaries: u32,
        now: i64,
    ) -> Option<&mut DeploymentGroup> {
        if self.status().is_some_and(|s| !s.is_active()) {
            return None;
        }
        if self.changed.is_none() {
            self.changed = Some(match self.existing {
                Some(d) => d.clone(),
                None => Deployment {
                    id: uuid::Uuid::new_v4().to_string(),
                    namespace: job.spec.namespace.clone(),
                    job_name: job.spec.name.clone(),
                    job_version: job.version,
                    job_modify_index: job.job_modify_index,
                    job_create_index: job.create_index,
                    status: DeploymentStatus::Running,
                    status_description: "Deployment is running".into(),
                    groups: BTreeMap::new(),
                    create_index: 0,
                    modify_index: 0,
                    create_time: now,
                    modify_time: now,
                },
            });
        }
        let d = self.changed.as_mut()?;
        Some(
            d.groups
                .entry(group.name.clone())
                .or_insert_with(|| DeploymentGroup {
                    auto_revert: u.auto_revert,
                    auto_promote: u.auto_promote,
                    promoted: false,
                    progress_deadline: u.progress_deadline,
                    require_progress_by: 0,
                    desired_canaries: canaries,
                    desired_total: group.count,
                    ..DeploymentGroup::default()
                }),
        )
    }
}

/// Reschedule history kept per allocation at most.
pub(crate) const MAX_RESCHEDULE_EVENTS: usize = 100;

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// What to do with a failed allocation under its group's reschedule policy.
#[derive(Debug, PartialEq)]
pub(crate) enum Reschedule {
    /// Replace it now; the replacement carries this history.
    Now(Vec<RescheduleEvent>),
    /// Its delay runs until then (unix nanoseconds).
    Later(i64),
    /// Its attempts are used up: it stays failed.
    Never,
}

/// Nomad's rules, simplified: the delay doubles with every consecutive replacement
/// (from `delay` up to `max_delay`), and starts over when the allocation ran longer
/// than `max_delay` before failing; it counts from the failure (the allocation's last
/// update). A limited policy allows `attempts` replacements per `interval`.
pub(crate) fn reschedule(policy: &ReschedulePolicy, failed: &Allocation, now: i64) -> Reschedule {
    let events = &failed.reschedule_events;
    let window_start = now.saturating_sub(nanos(policy.interval));
    if !policy.unlimited {
        let recent = events.iter().filter(|e| e.time > window_start).count();
        if recent >= policy.attempts as usize {
            return Reschedule::Never;
        }
    }
    let failed_at = failed.modify_time;
    let delay = match events.last() {
        Some(last) if failed_at.saturating_sub(last.time) <= nanos(policy.max_delay) => last
            .delay
            .saturating_mul(2)
            .clamp(policy.delay, policy.max_delay.max(policy.delay)),
        _ => policy.delay,
    };
    let due = failed_at.saturating_add(nanos(delay));
    if due > now {
        return Reschedule::Later(due);
    }
    let mut kept: Vec<RescheduleEvent> = if policy.unlimited {
        // Only the newest delay matters to an unlimited policy: the one pushed below.
        Vec::new()
    } else {
        events
            .iter()
            .filter(|e| e.time > window_start)
            .cloned()
            .collect()
    };
    kept.push(RescheduleEvent {
        time: now,
        prev_alloc_id: failed.id.clone(),
        delay,
    });
    let excess = kept.len().saturating_sub(MAX_RESCHEDULE_EVENTS);
    kept.drain(..excess);
    Reschedule::Now(kept)
}

/// Where an allocation's node stands.
enum NodeState {
    /// Gone from the state, or down: its allocations are lost.
    Lost,
    /// Draining: its allocations move elsewhere.
    Draining,
    /// Ready (or initializing: registered again, not yet heartbeating).
    Usable,
}

fn node_state(state: &dyn StateView, node_id: &str) -> NodeState {
    match state.node(node_id) {
        None => NodeState::Lost,
        Some(n) if n.status == NodeStatus::Down => NodeState::Lost,
        Some(n) if n.drain || n.status == NodeStatus::Draining => NodeState::Draining,
        Some(_) => NodeState::Usable,
    }
}

/// Desired to run and not ended: it holds its node's resources.
fn live(a: &Allocation) -> bool {
    a.desired_status == DesiredStatus::Run && !a.client_status.is_terminal()
}

/// Whether `a` runs a different spec of `group` than the job's current one: any task
/// or the network differs (a destructive update: new ports need a new placement). A
/// count or metadata change is not one: the allocation is left alone and keeps its
/// ports. When the version `a` was placed with is no longer known, it counts as
/// changed.
pub(crate) fn changed(state: &dyn StateView, job: &Job, group: &TaskGroup, a: &Allocation) -> bool {
    if a.job_version == job.version {
        return false;
    }
    match state.job_version(&job.spec.namespace, &job.spec.name, a.job_version) {
        Some(old) => old
            .spec
            .groups
            .iter()
            .find(|g| g.name == group.name)
            .is_none_or(|g| g.tasks != group.tasks || g.network != group.network),
        None => true,
    }
}

pub(crate) fn reconcile<'a>(
    state: &'a dyn StateView,
    job: Option<&'a Job>,
    allocs: &[&'a Allocation],
    now: i64,
) -> Reconciled<'a> {
    let mut out = Reconciled::default();
    let job = match job {
        Some(j) if !j.stop => j,
        other => {
            let why = if other.is_some() {
                "job stopped"
            } else {
                "job purged"
            };
            for a in allocs.iter().filter(|a| live(a)) {
                let lost = matches!(node_state(state, &a.node_id), NodeState::Lost);
                out.stops.push(Stop {
                    alloc: a,
                    description: why.into(),
                    lost,
                });
                out.summary.entry(a.group.clone()).or_default().stop += 1;
            }
            return out;
        }
    };

    let mut by_group: HashMap<&str, Vec<&'a Allocation>> = HashMap::new();
    for a in allocs {
        by_group.entry(a.group.as_str()).or_default().push(a);
    }
    // Groups the job no longer has.
    let names: HashSet<&str> = job.spec.groups.iter().map(|g| g.name.as_str()).collect();
    let mut gone: Vec<&&'a Allocation> = by_group
        .iter()
        .filter(|(g, _)| !names.contains(*g))
        .flat_map(|(_, v)| v.iter())
        .filter(|a| live(a))
        .collect();
    gone.sort_by(|a, b| a.id.cmp(&b.id));
    for a in gone {
        let lost = matches!(node_state(state, &a.node_id), NodeState::Lost);
        out.stops.push(Stop {
            alloc: a,
            description: "group removed from the job".into(),
            lost,
        });
        out.summary.entry(a.group.clone()).or_default().stop += 1;
    }

    let mut deploy = Deploy {
        existing: state
            .latest_deployment(&job.spec.namespace, &job.spec.name)
            .filter(|d| d.job_version == job.version && d.job_create_index == job.create_index),
        changed: None,
    };
    for group in &job.spec.groups {
        let allocs = by_group.remove(group.name.as_str()).unwrap_or_default();
        match job.spec.job_type {
            JobType::System => system_group(state, job, group, &allocs, &mut out),
            JobType::Service | JobType::Batch => {
                counted_group(state, job, group, &allocs, now, &mut deploy, &mut out)
            }
        }
    }
    // A deployment is created only to place something; the running one is written
    // only when a group joined it.
    let places = out.places.iter().any(|p| p.deployment);
    out.deployment = match (deploy.existing, deploy.changed) {
        (None, Some(new)) if places => Some(new),
        (Some(old), Some(changed)) if changed.groups.len() != old.groups.len() => Some(changed),
        _ => None,
    };
    out.active_deployment = deploy.existing.filter(|d| d.status.is_active());
    if out.deployment.is_none() && out.active_deployment.is_none() {
        for p in out.places.iter_mut() {
            p.deployment = false;
            p.canary = false;
        }
    }
    out
}

/// The allocations of a group that still hold a node, after moving off the lost and
/// draining ones (stopped here, their copies to be placed again).
struct Sorted<'a> {
    live: Vec<&'a Allocation>,
    /// Batch allocations that completed: they count, and are never replaced.
    done: Vec<&'a Allocation>,
    /// Stopped now or ended earlier: what a new copy at the same index replaces.
    replaceable: Vec<&'a Allocation>,
}

fn sort_out<'a>(
    state: &'a dyn StateView,
    job: &Job,
    allocs: &[&'a Allocation],
    out: &mut Reconciled<'a>,
    summary: &mut GroupPlanSummary,
) -> Sorted<'a> {
    let mut s = Sorted {
        live: Vec::new(),
        done: Vec::new(),
        replaceable: Vec::new(),
    };
    let mut allocs = allocs.to_vec();
    allocs.sort_by_key(|a| (a.index, a.create_index));
    for a in allocs {
        if a.desired_status == DesiredStatus::Stop {
            continue;
        }
        if a.client_status.is_terminal() {
            if job.spec.job_type == JobType::Batch && a.client_status == ClientStatus::Complete {
                s.done.push(a);
            } else if a.next_allocation.is_none() {
                s.replaceable.push(a);
            }
            continue;
        }
        match node_state(state, &a.node_id) {
            NodeState::Lost => {
                out.stops.push(Stop {
                    alloc: a,
                    description: "node down".into(),
                    lost: true,
                });
                summary.stop += 1;
                s.replaceable.push(a);
            }
            NodeState::Draining => {
                out.stops.push(Stop {
                    alloc: a,
                    description: "node draining".into(),
                    lost: false,
                });
                summary.stop += 1;
                s.replaceable.push(a);
            }
            NodeState::Usable => s.live.push(a),
        }
    }
    s
}

/// Rolling update: replace at most `max_parallel` changed allocations at a time; new
/// ones still pending count against it. Returns the allocations to replace now.
fn rolling<'a>(
    job: &Job,
    outdated: Vec<&'a Allocation>,
    live: &[&'a Allocation],
    out: &mut Reconciled<'a>,
) -> Vec<&'a Allocation> {
    let max = job.spec.update.max_parallel as usize;
    let budget = if max == 0 {
        usize::MAX
    } else {
        let in_flight = live
            .iter()
            .filter(|a| a.job_version == job.version && a.client_status == ClientStatus::Pending)
            .count();
        max.saturating_sub(in_flight)
    };
    if outdated.len() > budget {
        out.rolling_update_pending = true;
    }
    outdated.into_iter().take(budget).collect()
}

/// Whether `a` is a canary of `d` not yet promoted.
fn unpromoted_canary(d: Option<&Deployment>, a: &Allocation) -> bool {
    let Some(d) = d else {
        return false;
    };
    a.deployment_id.as_deref() == Some(d.id.as_str())
        && a.deployment_status.as_ref().is_some_and(|s| s.canary)
        && d.groups.get(&a.group).is_some_and(|g| !g.promoted)
}

fn healthy(a: &Allocation) -> bool {
    a.deployment_status.as_ref().and_then(|s| s.healthy) == Some(true)
}

/// Service and batch: `count` copies, indexes `0..count`.
///
/// A service group whose update strategy deploys (`max_parallel` > 0) rolls a new
/// version out through the job's deployment: with `canary`, that many new copies
/// first, next to the old ones, until promoted; then at most `max_parallel` old
/// copies replaced at a time, the next only once the new ones are healthy; nothing
/// more once the deployment failed.
fn counted_group<'a>(
    state: &'a dyn StateView,
    job: &'a Job,
    group: &'a TaskGroup,
    allocs: &[&'a Allocation],
    now: i64,
    deploy: &mut Deploy<'a>,
    out: &mut Reconciled<'a>,
) {
    let mut summary = GroupPlanSummary::default();
    let Sorted {
        live: all_live,
        done,
        replaceable,
    } = sort_out(state, job, allocs, out, &mut summary);
    let want = group.count as usize;
    let strategy = job.spec.update_of(group);
    let deploying = job.spec.job_type == JobType::Service && strategy.deploys();

    // Canaries waiting for their promotion stand apart: they neither count toward the
    // group's copies nor replace anything yet.
    let (canaries, mut live): (Vec<&Allocation>, Vec<&Allocation>) = all_live
        .into_iter()
        .partition(|a| deploying && unpromoted_canary(deploy.existing, a));

    // The canaries of a deployment that failed (or was cancelled) go: nothing will
    // promote them.
    let (canaries, dropped): (Vec<&Allocation>, Vec<&Allocation>) = canaries
        .into_iter()
        .partition(|_| deploy.status().is_none_or(|s| s.is_active()));
    for a in dropped {
        out.stops.push(Stop {
            alloc: a,
            description: "canary of a deployment that ended".into(),
            lost: false,
        });
        summary.stop += 1;
    }

    // Two live copies at one index (a promoted canary and the copy it replaces, or a
    // canary of an abandoned version): the one running the current spec stays.
    let mut by_index: BTreeMap<u32, Vec<&Allocation>> = BTreeMap::new();
    for a in &live {
        by_index.entry(a.index).or_default().push(a);
    }
    let mut extra: HashSet<&str> = HashSet::new();
    for (_, mut here) in by_index.into_iter().filter(|(_, v)| v.len() > 1) {
        // Current spec first, then healthy, then newest.
        here.sort_by_key(|a| {
            (
                changed(state, job, group, a),
                !healthy(a),
                std::cmp::Reverse(a.create_index),
            )
        });
        let keep = here[0];
        for a in &here[1..] {
            let description = if keep.deployment_status.as_ref().is_some_and(|s| s.canary) {
                format!("replaced by canary {}", keep.id)
            } else {
                "another copy runs at its index".to_owned()
            };
            out.stops.push(Stop {
                alloc: a,
                description,
                lost: false,
            });
            summary.stop += 1;
            extra.insert(a.id.as_str());
        }
    }
    live.retain(|a| !extra.contains(a.id.as_str()));

    // Scale down: stop the highest indexes (newest first among equals).
    let have = live.len() + done.len();
    if have > want {
        let excess = (have - want).min(live.len());
        live.sort_by_key(|a| (a.index, a.create_index));
        for a in live.split_off(live.len() - excess).into_iter().rev() {
            out.stops.push(Stop {
                alloc: a,
                description: "scaled down".into(),
                lost: false,
            });
            summary.stop += 1;
        }
    }

    let outdated: Vec<&Allocation> = live
        .iter()
        .copied()
        .filter(|a| changed(state, job, group, a))
        .collect();
    // Over, or as good as failed: an allocation of it was unhealthy (the watcher
    // fails it at its next look; meanwhile nothing more is replaced).
    let deployment_over = deploy.current().is_some_and(|d| {
        !d.status.is_active() || d.groups.values().any(|g| g.unhealthy_allocs > 0)
    });
    let promoted = deploy
        .current()
        .and_then(|d| d.groups.get(&group.name))
        .is_some_and(|g| g.promoted);
    let replace_now: Vec<&Allocation> = if !deploying {
        rolling(job, outdated, &live, out)
    } else if deployment_over || outdated.is_empty() {
        Vec::new()
    } else if strategy.canary > 0 && !promoted {
        // Canaries first: as many as asked, at the indexes of copies they will
        // replace once promoted.
        let want_canaries = strategy.canary.min(group.count) as usize;
        let mut taken: HashSet<u32> = canaries.iter().map(|a| a.index).collect();
        let missing = want_canaries.saturating_sub(canaries.len());
        let at: Vec<u32> = outdated
            .iter()
            .map(|a| a.index)
            .filter(|i| taken.insert(*i))
            .take(missing)
            .collect();
        if deploy
            .group(job, group, &strategy, want_canaries as u32, now)
            .is_some()
        {
            for index in at {
                out.places.push(Place {
                    group,
                    index,
                    previous: None,
                    node: None,
                    reschedule_events: Vec::new(),
                    deployment: true,
                    canary: true,
                });
                summary.canary += 1;
            }
        }
        Vec::new()
    } else {
        // The new copies not yet healthy hold the budget; so do those that failed or
        // were lost before a verdict (a failing version must not roll on).
        let in_flight = deploy.existing.map_or(0, |d| {
            allocs
                .iter()
                .filter(|a| {
                    a.deployment_id.as_deref() == Some(d.id.as_str())
                        && !healthy(a)
                        && a.desired_status == DesiredStatus::Run
                        && a.next_allocation.is_none()
                })
                .count()
        });
        let budget = (strategy.max_parallel as usize).saturating_sub(in_flight);
        if outdated.len() > budget {
            out.rolling_update_pending = true;
        }
        outdated.into_iter().take(budget).collect()
    };
    let joins = deploying
        && !replace_now.is_empty()
        && deploy.group(job, group, &strategy, 0, now).is_some();
    for a in &replace_now {
        out.stops.push(Stop {
            alloc: a,
            description: format!("replaced by version {}", job.version),
            lost: false,
        });
        out.places.push(Place {
            group,
            index: a.index,
            previous: Some(a),
            node: None,
            reschedule_events: Vec::new(),
            deployment: joins,
            canary: false,
        });
        summary.update += 1;
    }
    summary.ignore += (live.len() - replace_now.len()) as u32 + done.len() as u32;

    // Missing copies, at the lowest free indexes, each replacing what held the index.
    let mut used: HashSet<u32> = live.iter().chain(&done).map(|a| a.index).collect();
    let missing = want.saturating_sub(live.len() + done.len());
    let mut previous: HashMap<u32, &Allocation> = HashMap::new();
    // The newest allocation at an index is the one a new copy follows.
    for a in &replaceable {
        previous.insert(a.index, a);
    }
    let policy = group
        .reschedule
        .unwrap_or_else(|| ReschedulePolicy::default_for(job.spec.job_type));
    let mut index = 0u32;
    let mut placed_missing = false;
    for _ in 0..missing {
        while used.contains(&index) {
            index += 1;
        }
        used.insert(index);
        let previous = previous.get(&index).copied();
        let mut reschedule_events = Vec::new();
        // A failed copy is replaced after its delay, not at once: a task that fails
        // as it starts would otherwise be replaced in a tight loop, for ever.
        if let Some(p) = previous.filter(|p| p.client_status == ClientStatus::Failed) {
            match reschedule(&policy, p, now) {
                Reschedule::Now(events) => reschedule_events = events,
                Reschedule::Later(due) => {
                    out.follow_up = Some(out.follow_up.map_or(due, |f| f.min(due)));
                    summary.ignore += 1;
                    continue;
                }
                Reschedule::Never => {
                    summary.ignore += 1;
                    continue;
                }
            }
        }
        out.places.push(Place {
            group,
            index,
            previous,
            node: None,
            reschedule_events,
            deployment: false,
            canary: false,
        });
        placed_missing = true;
        summary.place += 1;
    }
    if deploying && placed_missing && deploy.group(job, group, &strategy, 0, now).is_some() {
        for p in out.places.iter_mut().rev() {
            if !std::ptr::eq(p.group, group) {
                break;
            }
            p.deployment = true;
        }
    }
    out.summary.insert(group.name.clone(), summary);
}

/// System: one copy on every ready node of the job's datacenters (the placer skips the
/// infeasible ones). A copy already on a node outside them is left alone, as Nomad
/// does; a new version of the job replaces it with nothing.
fn system_group<'a>(
    state: &'a dyn StateView,
    job: &'a Job,
    group: &'a TaskGroup,
    allocs: &[&'a Allocation],
    out: &mut Reconciled<'a>,
) {
    let mut summary = GroupPlanSummary::default();
    let Sorted {
        live,
        done: _,
        replaceable,
    } = sort_out(state, job, allocs, out, &mut summary);
    let mut on_node: HashMap<&str, Vec<&Allocation>> = HashMap::new();
    for a in &live {
        on_node.entry(a.node_id.as_str()).or_default().push(a);
    }
    let mut last_on_node: HashMap<&str, &Allocation> = HashMap::new();
    for a in &replaceable {
        last_on_node.insert(a.node_id.as_str(), a);
    }
    let mut kept = Vec::new();
    for node in state.nodes() {
        if let Some(mut here) = on_node.remove(node.id.as_str()) {
            here.sort_by_key(|a| a.create_index);
            for extra in here.split_off(1) {
                out.stops.push(Stop {
                    alloc: extra,
                    description: "another copy runs on the node".into(),
                    lost: false,
                });
                summary.stop += 1;
            }
            kept.extend(here);
        } else if node.status == NodeStatus::Ready
            && !node.drain
            && !node.ineligible
            && drover_server_api::datacenter_allowed(&job.spec.datacenters, &node.datacenter)
        {
            out.places.push(Place {
                group,
                index: 0,
                previous: last_on_node.get(node.id.as_str()).copied(),
                node: Some(node),
                reschedule_events: Vec::new(),
                deployment: false,
                canary: false,
            });
            summary.place += 1;
        }
    }
    let outdated: Vec<&Allocation> = kept
        .iter()
        .copied()
        .filter(|a| changed(state, job, group, a))
        .collect();
    let replace_now = rolling(job, outdated, &kept, out);
    for a in &replace_now {
        out.stops.push(Stop {
            alloc: a,
            description: format!("replaced by version {}", job.version),
            lost: false,
        });
        if let Some(node) = state.node(&a.node_id) {
            out.places.push(Place {
                group,
                index: 0,
                previous: Some(a),
                node: Some(node),
                reschedule_events: Vec::new(),
                deployment: false,
                canary: false,
            });
        }
        summary.update += 1;
    }
    summary.ignore += (kept.len() - replace_now.len()) as u32;
    out.summary.insert(group.name.clone(), summary);
}
