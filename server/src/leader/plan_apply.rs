//! The plan applier: one loop that re-checks every plan against the newest state and
//! commits what still fits, in one store transaction per batch of plans (optimistic
//! concurrency: workers plan in parallel on a shared read of the state; only the
//! applier decides).
//!
//! A plan is checked node by node: the job spec it was made for is still the current
//! one; a node that gets new allocations exists, is `ready` and not draining; and its
//! new allocations fit next to the node's non-terminal allocations (minus those the
//! plan stops, plus what earlier plans of the same batch placed), and their ports are
//! free there (two workers may have picked the same port on a node) and not reserved.
//! New allocations are accepted in order while they fit; the rest is refused and the
//! worker plans it again against the newer state.

use std::collections::HashMap;
use std::sync::Arc;

use drover_server_api::{
    AllocResources, Allocation, ClientStatus, Deployment, DesiredStatus, EvalStatus, EvalTrigger,
    Index,
};
use tokio::sync::mpsc;

use crate::leader::batcher::{self, Queued};
use crate::leader::deployments;
pub use crate::leader::requests::PlanResult;
pub(crate) use crate::leader::requests::{EvalFinish, PlanRequest};
use crate::leader::term::LeaderTerm;
use crate::scheduler::ports::reserved;
use crate::scheduler::{Plan, StateView};
use crate::state::evals::{new_eval, set_eval_status};
use crate::state::{Batch, KEPT_DEPLOYMENTS, State};

/// Plans committed together at most (they wait in the queue while one commits).
const MAX_PLANS_PER_COMMIT: usize = 64;

/// The applier loop: takes every plan waiting (up to [`MAX_PLANS_PER_COMMIT`]) and
/// commits them together (the shared [`batcher`] loop).
pub(crate) async fn run(
    term: Arc<LeaderTerm>,
    rx: mpsc::Receiver<Queued<PlanRequest, PlanResult>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let commit = |reqs: Vec<PlanRequest>| {
        let term = term.clone();
        async move {
            let started = std::time::Instant::now();
            let plans = reqs.len() as u64;
            let committed = term
                .commit(|st, index, now| {
                    let mut batch = Batch::default();
                    let mut ctx = ApplyCtx::default();
                    let results = reqs
                        .into_iter()
                        .map(|mut r| {
                            apply_one(
                                st,
                                &mut r.plan,
                                r.finish.as_ref(),
                                index,
                                now,
                                &mut ctx,
                                &mut batch,
                            )
                        })
                        .collect::<Vec<_>>();
                    Ok((batch, results))
                })
                .await;
            let m = &term.core.metrics;
            m.plan_apply_duration
                .observe(started.elapsed().as_secs_f64());
            if committed.is_ok() {
                m.plans_applied.inc_by(plans);
            }
            committed
        }
    };
    batcher::run(
        rx,
        MAX_PLANS_PER_COMMIT,
        stop,
        "plan",
        commit,
        |mut r: PlanResult, index| {
            r.index = index;
            Ok(r)
        },
    )
    .await;
}

/// What earlier plans of the same commit did.
#[derive(Default)]
struct ApplyCtx {
    /// Change of each node's reserved resources (placed minus stopped).
    delta: HashMap<String, (i128, i128)>,
    /// Existing allocations already rewritten in this batch: index into `batch.allocs`.
    touched: HashMap<String, usize>,
    /// Ports taken and freed on each node by earlier plans (and stops) of the batch.
    ports: HashMap<String, PortsDelta>,
    /// Device instances held on each node in the state, read when a placement with
    /// devices first lands there.
    devices_base: HashMap<String, std::collections::HashSet<String>>,
    /// Device instances taken and freed on each node by earlier plans of the batch.
    devices: HashMap<String, DevicesDelta>,
    /// CSI volume claims ((node id, write)) by (namespace, volume id): the state's,
    /// read when a placement claiming the volume first comes, plus this batch's.
    csi: HashMap<(String, String), Vec<(String, bool)>>,
}

#[derive(Default)]
struct DevicesDelta {
    taken: std::collections::HashSet<String>,
    freed: std::collections::HashSet<String>,
}

/// Why `want`'s device instances cannot be had on its node, if they cannot: one the
/// node does not have (any more), or one a live allocation holds (after this batch's
/// stops and placements), or one asked twice.
fn device_conflict(
    st: &State,
    node: &drover_server_api::Node,
    ctx: &mut ApplyCtx,
    want: &Allocation,
) -> Option<String> {
    use crate::scheduler::StateView as _;
    use crate::scheduler::devices::{held, instance_key};
    let base = ctx
        .devices_base
        .entry(node.id.clone())
        .or_insert_with(|| held(st.node_allocs(&node.id)));
    let delta = ctx.devices.get(&node.id);
    let mut mine = std::collections::HashSet::new();
    for d in want.task_devices.values().flatten() {
        let group = format!("{}/{}/{}", d.vendor, d.device_type, d.name);
        for id in &d.device_ids {
            let exists = node.devices.iter().any(|g| {
                g.vendor == d.vendor
                    && g.device_type == d.device_type
                    && g.name == d.name
                    && g.instances.iter().any(|i| &i.id == id)
            });
            if !exists {
                return Some(format!("device {group} instance {id} not on the node"));
            }
            let k = instance_key(&group, id);
            let used = delta.is_some_and(|d| d.taken.contains(&k))
                || (base.contains(&k) && !delta.is_some_and(|d| d.freed.contains(&k)));
            if used || !mine.insert(k) {
                return Some(format!("device {group} instance {id} in use"));
            }
        }
    }
    None
}

#[derive(Default)]
struct PortsDelta {
    /// Counts per port (a big plan tests each port in O(1)).
    taken: HashMap<u16, u32>,
    freed: HashMap<u16, u32>,
}

/// Why `want`'s ports cannot be had on its node, if they cannot: one reserved by the
/// node, or held by a live allocation (after this batch's stops and placements), or
/// asked twice.
fn port_conflict(
    st: &State,
    node: &drover_server_api::Node,
    delta: Option<&PortsDelta>,
    want: &Allocation,
) -> Option<String> {
    let used = st.used_ports(&node.id);
    for (k, p) in want.ports.iter().enumerate() {
        if reserved(&node.network, p.value) {
            return Some(format!("port {} reserved", p.value));
        }
        let mut holders = used.map_or(0, |u| u.holders(p.value)) as usize;
        if let Some(d) = delta {
            holders = holders.saturating_sub(d.freed.get(&p.value).copied().unwrap_or(0) as usize);
            holders += d.taken.get(&p.value).copied().unwrap_or(0) as usize;
        }
        if holders > 0 || want.ports[..k].iter().any(|q| q.value == p.value) {
            return Some(format!("port {} in use", p.value));
        }
    }
    None
}

fn touch<'a>(
    st: &State,
    ctx: &mut ApplyCtx,
    batch: &'a mut Batch,
    id: &str,
) -> Option<&'a mut Allocation> {
    let i = match ctx.touched.get(id) {
        Some(i) => *i,
        None => {
            let a = st.alloc(id)?.clone();
            batch.allocs.push(a);
            let i = batch.allocs.len() - 1;
            ctx.touched.insert(id.to_owned(), i);
            i
        }
    };
    batch.allocs.get_mut(i)
}

/// Check `plan` against the state and what earlier plans of the batch did; add what
/// fits to `batch`. The plan's new allocations are moved into the batch (the plan is
/// left without them).
fn apply_one(
    st: &State,
    plan: &mut Plan,
    finish: Option<&EvalFinish>,
    index: Index,
    now: i64,
    ctx: &mut ApplyCtx,
    batch: &mut Batch,
) -> PlanResult {
    let mut r = PlanResult::default();
    let job = st.job_in(&plan.namespace, &plan.job_name);
    if let Some(job) = job
        && job.job_modify_index != plan.job_modify_index
    {
        r.stale_job = true;
        r.refused = plan.node_allocation.values().map(Vec::len).sum();
        return r;
    }
    // Stops first: what they free counts for the placements of the same plan.
    for stops in plan.node_update.values() {
        for s in stops {
            let current = match ctx.touched.get(&s.alloc_id) {
                Some(i) => batch.allocs.get(*i),
                None => st.alloc(&s.alloc_id),
            };
            let Some(current) = current else {
                continue;
            };
            // Already stopped (and lost if asked): nothing to write.
            if current.desired_status == DesiredStatus::Stop
                && (!s.lost || current.client_status.is_terminal())
            {
                continue;
            }
            let Some(a) = touch(st, ctx, batch, &s.alloc_id) else {
                continue;
            };
            let was_live = !a.is_terminal();
            a.desired_status = DesiredStatus::Stop;
            a.desired_description = s.desired_description.clone();
            if s.lost && !a.client_status.is_terminal() {
                a.client_status = ClientStatus::Lost;
                a.client_description = "node down: allocation lost".into();
            }
            a.alloc_modify_index = index;
            a.modify_index = index;
            a.modify_time = now;
            r.stopped += 1;
            if was_live {
                let d = ctx.delta.entry(a.node_id.clone()).or_default();
                d.0 -= i128::from(a.resources.cpu);
                d.1 -= i128::from(a.resources.memory_mb);
                if !a.ports.is_empty() {
                    let freed = a.ports.iter().map(|p| p.value);
                    let pd = ctx.ports.entry(a.node_id.clone()).or_default();
                    for p in freed {
                        *pd.freed.entry(p).or_default() += 1;
                    }
                }
                if !a.task_devices.is_empty() {
                    let keys: Vec<String> = crate::scheduler::devices::held_by(a).collect();
                    let dd = ctx.devices.entry(a.node_id.clone()).or_default();
                    for k in keys {
                        dd.taken.remove(&k);
                        dd.freed.insert(k);
                    }
                }
                batch.unblock = true;
            }
        }
    }
    // The deployments this plan places into: the one it creates or changes, and the
    // running one its placements join (their counts go up). Gathered before the
    // placements move into the batch.
    let mut deployment_ids: Vec<String> = plan.deployment.iter().map(|d| d.id.clone()).collect();
    for a in plan.node_allocation.values().flatten() {
        if let Some(id) = a.deployment_id.as_deref()
            && !deployment_ids.iter().any(|d| d == id)
        {
            deployment_ids.push(id.to_owned());
        }
    }
    let placeable = job.is_some_and(|j| !j.stop);
    for (node_id, allocs) in plan.node_allocation.iter_mut() {
        if allocs.is_empty() {
            continue;
        }
        let allocs = std::mem::take(allocs);
        let wanted = allocs.len();
        let refuse = |r: &mut PlanResult, n: usize, why: String| {
            r.refused += n;
            r.refused_nodes.insert(node_id.clone(), why);
        };
        if !placeable {
            refuse(&mut r, wanted, "the job is stopped or purged".into());
            continue;
        }
        let Some(node) = st.node(node_id) else {
            refuse(&mut r, wanted, "node not found".into());
            continue;
        };
        if node.status != drover_server_api::NodeStatus::Ready || node.drain {
            refuse(
                &mut r,
                wanted,
                format!(
                    "node is {}",
                    if node.drain {
                        "draining"
                    } else {
                        node.status.as_str()
                    }
                ),
            );
            continue;
        }
        let usage: AllocResources = st.node_usage(node_id);
        let (d_cpu, d_mem) = ctx.delta.get(node_id).copied().unwrap_or_default();
        let mut used_cpu = i128::from(usage.cpu) + d_cpu;
        let mut used_mem = i128::from(usage.memory_mb) + d_mem;
        let cap_cpu = i128::from(node.resources.cpu);
        let cap_mem = i128::from(node.resources.memory_mb);
        for (i, mut a) in allocs.into_iter().enumerate() {
            let cpu = i128::from(a.resources.cpu);
            let mem = i128::from(a.resources.memory_mb);
            if used_cpu + cpu > cap_cpu || used_mem + mem > cap_mem {
                let dim = if used_cpu + cpu > cap_cpu {
                    "cpu"
                } else {
                    "memory"
                };
                refuse(&mut r, wanted - i, format!("{dim} exhausted"));
                break;
            }
            if !a.ports.is_empty() {
                if let Some(why) = port_conflict(st, node, ctx.ports.get(node_id), &a) {
                    refuse(&mut r, wanted - i, why);
                    break;
                }
                let pd = ctx.ports.entry(node_id.clone()).or_default();
                for p in &a.ports {
                    *pd.taken.entry(p.value).or_default() += 1;
                }
            }
            if !a.task_devices.is_empty() {
                if let Some(why) = device_conflict(st, node, ctx, &a) {
                    refuse(&mut r, wanted - i, why);
                    break;
                }
                let dd = ctx.devices.entry(node_id.clone()).or_default();
                for k in crate::scheduler::devices::held_by(&a) {
                    dd.taken.insert(k);
                }
            }
            let csi_needs = job
                .and_then(|j| j.spec.groups.iter().find(|g| g.name == a.group))
                .map(crate::scheduler::csi::csi_needs)
                .unwrap_or_default();
            if !csi_needs.is_empty() {
                let ns = plan.namespace.as_str();
                let mut conflict = None;
                for need in &csi_needs {
                    let claims = ctx
                        .csi
                        .entry((ns.to_owned(), need.source.to_owned()))
                        .or_insert_with(|| {
                            crate::scheduler::csi::claim_pairs(&st.csi_claims(ns, need.source))
                        });
                    if let Err(why) = crate::scheduler::csi::check_claim(
                        st.csi_volume(ns, need.source),
                        need,
                        node,
                        claims,
                    ) {
                        conflict = Some(why);
                        break;
                    }
                }
                if let Some(why) = conflict {
                    refuse(&mut r, wanted - i, why);
                    break;
                }
                for need in &csi_needs {
                    if let Some(claims) = ctx.csi.get_mut(&(ns.to_owned(), need.source.to_owned()))
                    {
                        claims.push((node_id.clone(), need.write));
                    }
                }
            }
            used_cpu += cpu;
            used_mem += mem;
            let d = ctx.delta.entry(node_id.clone()).or_default();
            d.0 += cpu;
            d.1 += mem;
            // Random ids (UUID v4), not time-ordered ones: users name allocations by
            // their first 8 characters (`drover alloc status 1f0c2a9e`), and the
            // allocations of one plan would share them with v7 ids. The store keeps
            // allocations in creation order anyway (`state::alloc_key`). `clone_from`
            // and the id written in place: no allocation per placement when the
            // scheduler already set the same values.
            a.id.clear();
            a.id.push_str(
                uuid::Uuid::new_v4()
                    .hyphenated()
                    .encode_lower(&mut uuid::Uuid::encode_buffer()),
            );
            a.job_name.clone_from(&plan.job_name);
            a.node_id.clone_from(node_id);
            a.node_name.clone_from(&node.name);
            a.eval_id.clone_from(&plan.eval_id);
            a.desired_status = DesiredStatus::Run;
            a.client_status = ClientStatus::Pending;
            a.next_allocation = None;
            a.create_index = index;
            a.modify_index = index;
            a.alloc_modify_index = index;
            a.create_time = now;
            a.modify_time = now;
            let prev = a.previous_allocation.clone();
            let id = a.id.clone();
            batch.allocs.push(a);
            r.placed += 1;
            if let Some(prev) = prev
                && let Some(p) = touch(st, ctx, batch, &prev)
            {
                p.next_allocation = Some(id);
                p.modify_index = index;
                p.modify_time = now;
            }
        }
    }
    for id in &deployment_ids {
        let planned = plan.deployment.as_ref().filter(|d| &d.id == id);
        write_deployment(st, id, planned, &plan.eval_id, index, now, batch);
    }
    if r.fully_committed()
        && let Some(f) = finish
    {
        finish_eval(st, f, index, now, batch);
    }
    r
}

/// Commit deployment `id` as this plan leaves it: a new one (`planned`; its deadlines
/// start now; the job's oldest ended deployments beyond [`KEPT_DEPLOYMENTS`] go), or
/// the running one (as this batch or the state has it) with the groups the plan
/// added; either way with the counts of what this plan placed in it. An ended one is
/// left as it is.
fn write_deployment(
    st: &State,
    id: &str,
    planned: Option<&Deployment>,
    eval_id: &str,
    index: Index,
    now: i64,
    batch: &mut Batch,
) {
    let current = batch
        .deployments
        .iter()
        .find(|d| d.id == id)
        .or_else(|| st.deployment(id));
    let mut d = match (current, planned) {
        (Some(current), _) => {
            if !current.status.is_active() {
                return;
            }
            let mut d = current.clone();
            for (name, g) in planned.iter().flat_map(|p| p.groups.iter()) {
                d.groups.entry(name.clone()).or_insert_with(|| g.clone());
            }
            d
        }
        (None, Some(planned)) => {
            let mut d = planned.clone();
            d.create_index = index;
            d.create_time = now;
            let mut ended: Vec<&Deployment> = st
                .deployments_of_job(&d.namespace, &d.job_name)
                .filter(|o| !o.status.is_active())
                .collect();
            let excess = (ended.len() + 1).saturating_sub(KEPT_DEPLOYMENTS);
            ended.truncate(excess);
            batch
                .drop_deployments
                .extend(ended.into_iter().map(|o| o.id.clone()));
            d
        }
        (None, None) => return,
    };
    for g in d.groups.values_mut() {
        if g.require_progress_by == 0 && !g.progress_deadline.is_zero() {
            g.require_progress_by = now.saturating_add(deployments::nanos(g.progress_deadline));
        }
    }
    for a in batch.allocs.iter().filter(|a| {
        // This plan's placements (a batch commits several plans).
        a.create_index == index
            && a.eval_id == eval_id
            && a.deployment_id.as_deref() == Some(d.id.as_str())
    }) {
        if let Some(g) = d.groups.get_mut(&a.group) {
            g.placed_allocs += 1;
            if a.deployment_status.as_ref().is_some_and(|s| s.canary) {
                g.placed_canaries.push(a.id.clone());
            }
        }
    }
    d.modify_index = index;
    d.modify_time = now;
    batch.deployments.retain(|o| o.id != d.id);
    batch.deployments.push(d);
}

/// Write an evaluation's result: `complete` with what it could not place; a `blocked`
/// evaluation (the job's only one) holding the reasons when something is unplaced; the
/// job's previous blocked evaluation canceled.
pub(crate) fn finish_eval(st: &State, f: &EvalFinish, index: Index, now: i64, batch: &mut Batch) {
    let current = st.eval(&f.eval.id).unwrap_or(&f.eval);
    let mut e = set_eval_status(current, EvalStatus::Complete, String::new(), index, now);
    e.failed_tg_allocs = f.failed_tg_allocs.clone();
    e.queued_allocations = f.queued_allocations.clone();
    let old_blocked = st
        .blocked_eval(&f.eval.namespace, &f.eval.job_name)
        .filter(|b| b.id != f.eval.id);
    let job = st
        .job_in(&f.eval.namespace, &f.eval.job_name)
        .filter(|j| !j.stop);
    let mut blocked = None;
    if !f.failed_tg_allocs.is_empty()
        && let Some(job) = job
    {
        let mut b = new_eval(job, f.eval.triggered_by, index, now);
        b.status = EvalStatus::Blocked;
        b.status_description = "waiting for capacity".into();
        b.failed_tg_allocs = f.failed_tg_allocs.clone();
        b.queued_allocations = f.queued_allocations.clone();
        b.previous_eval = Some(f.eval.id.clone());
        e.blocked_eval = Some(b.id.clone());
        blocked = Some(b);
    }
    if let Some(old) = old_blocked {
        let why = match &blocked {
            Some(b) => format!("superseded by blocked evaluation {}", b.id),
            None => format!("evaluation {} placed what it waited for", f.eval.id),
        };
        batch
            .evals
            .push(set_eval_status(old, EvalStatus::Canceled, why, index, now));
    }
    if let Some(at) = f.follow_up_at
        && let Some(job) = job
    {
        // One follow-up covers every failed allocation due at or after it (it makes
        // the next one when it runs): no new one while an earlier one waits.
        let waiting = st
            .evals_of_job(&f.eval.namespace, &f.eval.job_name)
            .any(|o| {
                o.id != f.eval.id
                    && o.status == EvalStatus::Pending
                    && o.wait_until.is_some_and(|w| w <= at)
            })
            || batch.evals.iter().any(|o| {
                o.job_name == f.eval.job_name
                    && o.namespace == f.eval.namespace
                    && o.status == EvalStatus::Pending
                    && o.wait_until.is_some_and(|w| w <= at)
            });
        if !waiting {
            let mut next = new_eval(job, EvalTrigger::AllocFailure, index, now);
            next.wait_until = Some(at);
            next.previous_eval = Some(f.eval.id.clone());
            next.status_description = "waiting for a failed allocation's reschedule delay".into();
            batch.evals.push(next);
        }
    }
    batch.evals.push(e);
    batch.evals.extend(blocked);
}

#[cfg(test)]
mod tests {
    use drover_server_api::{AllocatedPort, Job, JobStatus, JobType};

    use super::*;
    use crate::scheduler::tests::{node, ports_group, spec, with_range};

    /// A state with node `n1` (ports 22 and 8000-8100 reserved) and job `web`.
    fn state() -> State {
        let mut st = State::default();
        let n = with_range(
            node("n1", 4000, 4096),
            20000,
            32000,
            &[(22, 22), (8000, 8100)],
        );
        let job = Job {
            stable: Default::default(),
            spec: spec(
                "web",
                JobType::Service,
                vec![ports_group("g", 3, &[("http", 9090)])],
            ),
            version: 0,
            stop: false,
            status: JobStatus::Pending,
            submit_time: 0,
            create_index: 1,
            modify_index: 1,
            job_modify_index: 1,
        };
        st.apply(
            Batch {
                nodes: vec![n],
                jobs: vec![job],
                ..Batch::default()
            },
            1,
        );
        st
    }

    fn alloc(id: &str, port: u16) -> Allocation {
        let mut a: Allocation = serde_json::from_value(serde_json::json!({
            "id": id, "name": "web.g[0]", "index": 0, "job_name": "web", "job_version": 0,
            "group": "g", "node_id": "id-n1", "node_name": "n1",
            "resources": {"cpu": 10, "memory_mb": 10},
            "desired_status": "run", "desired_description": "",
            "client_status": "pending", "client_description": "",
            "task_states": {}, "eval_id": "e", "create_index": 0, "modify_index": 0,
            "alloc_modify_index": 0, "create_time": 0, "modify_time": 0
        }))
        .expect("an allocation");
        a.ports = vec![AllocatedPort {
            label: "http".into(),
            value: port,
            to: port,
            host_ip: "127.0.0.1".into(),
        }];
        a
    }

    fn plan(place: Vec<Allocation>, stop: &[&str]) -> Plan {
        let mut p = Plan {
            eval_id: "e".into(),
            namespace: "default".into(),
            job_name: "web".into(),
            job_modify_index: 1,
            snapshot_index: 1,
            ..Plan::default()
        };
        p.node_allocation.insert("id-n1".into(), place);
        if !stop.is_empty() {
            p.node_update.insert(
                "id-n1".into(),
                stop.iter()
                    .map(|id| crate::scheduler::AllocStop {
                        alloc_id: (*id).into(),
                        desired_description: "replaced".into(),
                        lost: false,
                    })
                    .collect(),
            );
        }
        p
    }

    /// [`state`] where group `g` of `web` claims CSI volume `vol` (single-node-writer)
    /// and the node runs its plugin, healthy.
    fn state_with_csi_volume() -> State {
        use drover_server_api::csi::*;
        let mut st = state();
        let mut job = st.job_in("default", "web").expect("web").clone();
        job.spec.groups[0].volumes.insert(
            "data".into(),
            drover_server_api::VolumeRequest {
                volume_type: "csi".into(),
                source: "vol".into(),
                read_only: false,
                access_mode: "single-node-writer".into(),
                attachment_mode: "file-system".into(),
            },
        );
        let mut n = st.node("id-n1").expect("n1").clone();
        n.csi_plugins.insert(
            "hp".into(),
            CsiPluginFingerprint {
                plugin_id: "hp".into(),
                plugin_type: CsiPluginType::Monolith,
                healthy: true,
                health_description: String::new(),
                provider: "hostpath.csi.k8s.io".into(),
                provider_version: String::new(),
                node_id: "id-n1".into(),
                max_volumes: 0,
                topology: Default::default(),
                node: Some(CsiNodeCapabilities::default()),
                controller: Some(CsiControllerCapabilities::default()),
            },
        );
        let vol = CsiVolume {
            id: "vol".into(),
            namespace: "default".into(),
            name: "vol".into(),
            external_id: "ext".into(),
            plugin_id: "hp".into(),
            provider: String::new(),
            capacity_min: 0,
            capacity_max: 0,
            capacity: 0,
            capabilities: vec![CsiCapability {
                access_mode: CsiAccessMode::SingleNodeWriter,
                attachment_mode: CsiAttachmentMode::FileSystem,
            }],
            mount_options: Default::default(),
            parameters: Default::default(),
            context: Default::default(),
            created: true,
            create_index: 2,
            modify_index: 2,
        };
        st.apply(
            Batch {
                jobs: vec![job],
                nodes: vec![n],
                csi_volumes: vec![vol],
                ..Batch::default()
            },
            2,
        );
        st
    }

    #[test]
    fn a_single_node_writer_csi_volume_is_never_claimed_by_two_live_allocations() {
        let mut st = state_with_csi_volume();
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        // Two plans of one commit: the second writer is refused.
        let first = apply_one(
            &st,
            &mut plan(vec![alloc("a", 9090)], &[]),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        let second = apply_one(
            &st,
            &mut plan(vec![alloc("b", 9091)], &[]),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!((first.placed, first.refused), (1, 0));
        assert_eq!((second.placed, second.refused), (0, 1));
        assert!(
            second.refused_nodes["id-n1"].contains("CSI volume \"vol\" has no free write claim"),
            "{:?}",
            second.refused_nodes
        );
        st.apply(batch, 3);
        // The claim is in the state now: a later plan is refused too, even one that
        // stops the claiming allocation (it holds the volume until its client is done).
        let placed = st
            .allocs_of_job("default", "web")
            .map(|a| a.id.clone())
            .collect::<Vec<_>>();
        assert_eq!(placed.len(), 1);
        assert_eq!(st.csi_claims("default", "vol").len(), 1);
        assert_eq!(
            st.all_csi_claims()[&("default".to_owned(), "vol".to_owned())],
            st.csi_claims("default", "vol")
        );
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        let third = apply_one(
            &st,
            &mut plan(vec![alloc("c", 9092)], &[placed[0].as_str()]),
            None,
            4,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(
            (third.placed, third.refused),
            (0, 1),
            "{:?}",
            third.refused_nodes
        );
        // Once its client reports it complete, the claim is gone and a writer fits.
        let mut done = st.alloc(&placed[0]).expect("placed").clone();
        done.client_status = ClientStatus::Complete;
        st.apply(
            Batch {
                allocs: vec![done],
                ..Batch::default()
            },
            5,
        );
        assert!(st.csi_claims("default", "vol").is_empty());
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        let fourth = apply_one(
            &st,
            &mut plan(vec![alloc("d", 9093)], &[]),
            None,
            6,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(
            (fourth.placed, fourth.refused),
            (1, 0),
            "{:?}",
            fourth.refused_nodes
        );
        // Its node is lost: the allocation is lost, and so is its claim.
        st.apply(batch, 6);
        assert_eq!(st.csi_claims("default", "vol").len(), 1);
        let mut lost = st
            .allocs_of_job("default", "web")
            .find(|a| !a.client_status.is_terminal())
            .expect("the fourth")
            .clone();
        lost.client_status = ClientStatus::Lost;
        lost.desired_status = DesiredStatus::Stop;
        st.apply(
            Batch {
                allocs: vec![lost],
                ..Batch::default()
            },
            7,
        );
        assert!(st.csi_claims("default", "vol").is_empty());
    }

    #[test]
    fn two_plans_picking_the_same_port_on_a_node_commit_only_the_first() {
        let st = state();
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        let first = apply_one(
            &st,
            &mut plan(vec![alloc("a", 9090)], &[]),
            None,
            2,
            0,
            &mut ctx,
            &mut batch,
        );
        let second = apply_one(
            &st,
            &mut plan(vec![alloc("b", 9090)], &[]),
            None,
            2,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!((first.placed, first.refused), (1, 0));
        assert_eq!((second.placed, second.refused), (0, 1));
        assert_eq!(second.refused_nodes["id-n1"], "port 9090 in use");
        // Another port is fine.
        let third = apply_one(
            &st,
            &mut plan(vec![alloc("c", 9091)], &[]),
            None,
            2,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(third.placed, 1);
    }

    #[test]
    fn a_port_held_in_the_state_or_reserved_is_refused_unless_the_plan_frees_it() {
        let mut st = state();
        let mut held = alloc("held", 9090);
        held.create_index = 2;
        st.apply(
            Batch {
                allocs: vec![held],
                ..Batch::default()
            },
            2,
        );
        assert!(st.used_ports("id-n1").is_some_and(|u| u.contains(9090)));
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        let r = apply_one(
            &st,
            &mut plan(vec![alloc("a", 9090)], &[]),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(r.refused_nodes["id-n1"], "port 9090 in use");
        let r = apply_one(
            &st,
            &mut plan(vec![alloc("b", 8080)], &[]),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(r.refused_nodes["id-n1"], "port 8080 reserved");
        // The plan stops the holder: its port is the new allocation's.
        let r = apply_one(
            &st,
            &mut plan(vec![alloc("c", 9090)], &["held"]),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!((r.placed, r.refused, r.stopped), (1, 0, 1));
        st.apply(batch, 3);
        let used = st.used_ports("id-n1").expect("ports held");
        assert_eq!(used.holders(9090), 1);
    }

    /// `state()` with device instances `d1`, `d2` of `nomad/file/mock` on `n1`.
    fn state_with_devices() -> State {
        let mut st = state();
        let mut n = st.node("id-n1").expect("n1").clone();
        n.devices = vec![drover_server_api::NodeDeviceGroup {
            vendor: "nomad".into(),
            device_type: "file".into(),
            name: "mock".into(),
            instances: ["d1", "d2"]
                .iter()
                .map(|id| drover_server_api::NodeDeviceInstance {
                    id: (*id).into(),
                    healthy: true,
                    health_description: String::new(),
                })
                .collect(),
            attributes: Default::default(),
        }];
        st.apply(
            Batch {
                nodes: vec![n],
                ..Batch::default()
            },
            2,
        );
        st
    }

    fn with_device(mut a: Allocation, ids: &[&str]) -> Allocation {
        a.ports.clear();
        a.task_devices.insert(
            "t".into(),
            vec![drover_server_api::AllocatedDevices {
                vendor: "nomad".into(),
                device_type: "file".into(),
                name: "mock".into(),
                device_ids: ids.iter().map(|i| (*i).to_owned()).collect(),
            }],
        );
        a
    }

    #[test]
    fn a_device_instance_is_never_given_twice() {
        let mut st = state_with_devices();
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        let p = |a| plan(vec![a], &[]);
        let r = apply_one(
            &st,
            &mut p(with_device(alloc("a", 1), &["d1"])),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(r.placed, 1);
        // The same instance in a later plan of the batch, or twice in one allocation.
        let r = apply_one(
            &st,
            &mut p(with_device(alloc("b", 1), &["d1"])),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(
            r.refused_nodes["id-n1"],
            "device nomad/file/mock instance d1 in use"
        );
        let r = apply_one(
            &st,
            &mut p(with_device(alloc("c", 1), &["d2", "d2"])),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(
            r.refused_nodes["id-n1"],
            "device nomad/file/mock instance d2 in use"
        );
        let r = apply_one(
            &st,
            &mut p(with_device(alloc("d", 1), &["d9"])),
            None,
            3,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(
            r.refused_nodes["id-n1"],
            "device nomad/file/mock instance d9 not on the node"
        );
        st.apply(batch, 3);
        // Held in the state: refused, unless the same plan stops the holder.
        let held = st
            .node_allocs("id-n1")
            .into_iter()
            .find(|a| !a.task_devices.is_empty())
            .expect("the holder")
            .id
            .clone();
        let mut ctx = ApplyCtx::default();
        let mut batch = Batch::default();
        let r = apply_one(
            &st,
            &mut p(with_device(alloc("e", 1), &["d1"])),
            None,
            4,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!(
            r.refused_nodes["id-n1"],
            "device nomad/file/mock instance d1 in use"
        );
        let r = apply_one(
            &st,
            &mut plan(vec![with_device(alloc("f", 1), &["d1"])], &[held.as_str()]),
            None,
            4,
            0,
            &mut ctx,
            &mut batch,
        );
        assert_eq!((r.placed, r.stopped), (1, 1), "{:?}", r.refused_nodes);
    }
}
