//! The client update batcher: commits the status reports of clients in batches.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use drover_server_api::{
    AllocClientUpdate, Allocation, ClientStatus, DesiredStatus, EvalTrigger, Index, Job, JobType,
    ServiceInstance,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;
use crate::leader::batcher::{self, Queued};
use crate::leader::requests::UpdateRequest;
use crate::leader::term::LeaderTerm;
use crate::scheduler;
use crate::state::State;
use crate::state::evals::new_eval;
use crate::state::services;
use crate::state::{Batch, JobKey, job_id};

/// Client status updates accepted in one call.
pub const MAX_CLIENT_UPDATES: usize = 10_000;
/// An allocation's `client_description`, and a task state's `message`, are cut to this
/// many bytes: they are for people, and a longer one is kept, not refused, so that one
/// verbose driver error does not cost a node its other reports.
pub const MAX_CLIENT_TEXT_BYTES: usize = 4096;
/// Longest `task_id`, `started_at` or `finished_at` of a reported task state (longer
/// is refused: these are identifiers and timestamps, not prose).
pub const MAX_TASK_FIELD_BYTES: usize = 256;

/// Client updates committed together at most.
const MAX_UPDATE_REQUESTS_PER_COMMIT: usize = 256;

/// Commits client status reports: every request waiting (up to
/// [`MAX_UPDATE_REQUESTS_PER_COMMIT`]) in one transaction, so that a thousand clients
/// reporting at once cost a few commits, not a thousand. A request that is refused
/// (another node's allocation) is answered with its error and changes nothing; the
/// others of the batch commit.
pub(crate) async fn run(
    term: Arc<LeaderTerm>,
    rx: mpsc::Receiver<Queued<UpdateRequest, Index>>,
    stop: CancellationToken,
) {
    let commit = |reqs: Vec<UpdateRequest>| {
        let term = term.clone();
        async move {
            term.commit(|st, index, now| Ok(client_updates(st, &reqs, index, now)))
                .await
        }
    };
    batcher::run(
        rx,
        MAX_UPDATE_REQUESTS_PER_COMMIT,
        stop,
        "allocation updates",
        commit,
        |verdict: Result<(), ServerError>, index| verdict.map(|()| index),
    )
    .await;
}

/// `text` cut to at most [`MAX_CLIENT_TEXT_BYTES`], on a character boundary.
fn truncated(text: &str) -> String {
    if text.len() <= MAX_CLIENT_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_CLIENT_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The task names of an allocation's group (at the version it was placed with), when
/// the server still has its job.
fn group_tasks<'a>(st: &'a State, a: &Allocation) -> Option<Vec<&'a str>> {
    let of = |j: &'a Job| {
        j.spec
            .groups
            .iter()
            .find(|g| g.name == a.group)
            .map(|g| g.tasks.iter().map(|t| t.name.as_str()).collect())
    };
    st.job_at_version(&a.namespace, &a.job_name, a.job_version)
        .and_then(of)
        .or_else(|| st.job_in(&a.namespace, &a.job_name).and_then(of))
}

/// Task states are kept only for tasks of the allocation's group, with bounded fields.
fn check_task_states(st: &State, u: &AllocClientUpdate) -> Result<(), ServerError> {
    let Some(alloc) = st.alloc(&u.id) else {
        return Ok(()); // ignored anyway
    };
    let tasks = group_tasks(st, alloc);
    for (name, ts) in &u.task_states {
        if tasks.as_ref().is_some_and(|t| !t.contains(&name.as_str())) {
            return Err(ServerError::Invalid(format!(
                "allocation {}: task_states: group {} has no task {name:?}",
                u.id, alloc.group
            )));
        }
        let fields = [
            ("task_id", ts.task_id.as_str()),
            ("started_at", ts.started_at.as_deref().unwrap_or("")),
            ("finished_at", ts.finished_at.as_deref().unwrap_or("")),
        ];
        if let Some((field, v)) = fields.iter().find(|(_, v)| v.len() > MAX_TASK_FIELD_BYTES) {
            return Err(ServerError::Invalid(format!(
                "allocation {}: task_states.{name}.{field}: {} bytes, at most \
                 {MAX_TASK_FIELD_BYTES}",
                u.id,
                v.len()
            )));
        }
    }
    Ok(())
}

fn client_updates(
    st: &State,
    reqs: &[UpdateRequest],
    index: Index,
    now: i64,
) -> (Batch, Vec<Result<(), ServerError>>) {
    let mut changed: HashMap<String, Allocation> = HashMap::new();
    let mut b = Batch::default();
    let mut failure_evals: BTreeSet<JobKey> = BTreeSet::new();
    // Per job: does an older version still run (a rolling update in progress)?
    let mut rolling: HashMap<JobKey, bool> = HashMap::new();
    let mut rolling_evals: BTreeSet<JobKey> = BTreeSet::new();
    // Deployments whose counts changed, and jobs to evaluate because an allocation of
    // their deployment turned healthy.
    let mut deployments: HashMap<String, drover_server_api::Deployment> = HashMap::new();
    let mut deployment_evals: BTreeSet<JobKey> = BTreeSet::new();
    let mut verdicts = Vec::with_capacity(reqs.len());
    // Each allocation's reported service instances (its node, the complete set).
    let mut reports: HashMap<String, (&str, &[ServiceInstance])> = HashMap::new();
    for req in reqs {
        let node_id = req.node_id.as_str();
        if scheduler::StateView::node(st, node_id).is_none() {
            verdicts.push(Err(ServerError::NotFound(format!(
                "node {node_id} is not registered"
            ))));
            continue;
        }
        // Check the whole request first: a refused one changes nothing.
        let foreign = req.updates.iter().find_map(|u| {
            st.alloc(&u.id)
                .filter(|a| a.node_id != node_id)
                .map(|a| (u.id.as_str(), a.node_id.as_str()))
        });
        if let Some((id, owner)) = foreign {
            verdicts.push(Err(ServerError::Invalid(format!(
                "allocation {id} belongs to node {owner}, not to node {node_id}"
            ))));
            continue;
        }
        if let Some(e) = req
            .updates
            .iter()
            .find_map(|u| check_task_states(st, u).err())
        {
            verdicts.push(Err(e));
            continue;
        }
        for u in &req.updates {
            let Some(old) = changed.get(&u.id).or_else(|| st.alloc(&u.id)) else {
                tracing::debug!(alloc = %u.id, node = %node_id, "update for an unknown allocation ignored");
                continue;
            };
            if let Some(list) = &u.services {
                // Services the server cannot keep are skipped (the allocation's earlier
                // registrations stay), not the node's whole report: one job must not
                // get its node's status refused.
                match services::check_report(&format!("allocation {}", u.id), list) {
                    // The latest report of the allocation in this batch counts.
                    Ok(()) => {
                        reports.insert(u.id.clone(), (node_id, list.as_slice()));
                    }
                    Err(e) => {
                        tracing::warn!(node = %node_id, "service registrations skipped: {e}");
                    }
                }
            }
            let mut a = old.clone();
            // A terminal client status is final: lost stays lost (the server replaced
            // it), complete/failed do not go back to running.
            if !old.client_status.is_terminal() {
                a.client_status = u.client_status;
                a.client_description = truncated(&u.client_description);
            }
            // Unchecked task names (the allocation's job is gone) are not kept.
            if group_tasks(st, old).is_some() {
                a.task_states = u
                    .task_states
                    .iter()
                    .map(|(name, ts)| {
                        let mut ts = ts.clone();
                        ts.message = truncated(&ts.message);
                        (name.clone(), ts)
                    })
                    .collect();
            }
            // The client's first verdict on the allocation's health in its deployment
            // counts; a later, different one is ignored.
            let mut health_decided = None;
            // A copy that failed before any verdict is unhealthy whatever the health
            // mode (`manual` sends none): a failing version must not roll on.
            let verdict = u
                .healthy
                .or_else(|| (a.client_status == ClientStatus::Failed).then_some(false));
            if let (Some(h), Some(did)) = (verdict, old.deployment_id.as_deref())
                && old
                    .deployment_status
                    .as_ref()
                    .and_then(|s| s.healthy)
                    .is_none()
                // The server stopped it, or it was lost: a late verdict says nothing
                // about the version.
                && old.desired_status == DesiredStatus::Run
                && old.client_status != ClientStatus::Lost
            {
                let mut status = old.deployment_status.clone().unwrap_or_default();
                status.healthy = Some(h);
                status.timestamp = now;
                status.modify_index = index;
                a.deployment_status = Some(status);
                health_decided = Some((did.to_owned(), h));
            }
            if a.client_status == old.client_status
                && a.client_description == old.client_description
                && a.task_states == old.task_states
                && health_decided.is_none()
            {
                continue;
            }
            if let Some((did, h)) = health_decided
                && let Some(d) = deployments
                    .get(&did)
                    .or_else(|| st.deployment(&did))
                    .filter(|d| d.status.is_active())
            {
                let mut d = d.clone();
                if let Some(g) = d.groups.get_mut(&a.group) {
                    if h {
                        g.healthy_allocs += 1;
                        if !g.progress_deadline.is_zero() {
                            g.require_progress_by = now.saturating_add(
                                crate::leader::deployments::nanos(g.progress_deadline),
                            );
                        }
                    } else {
                        g.unhealthy_allocs += 1;
                    }
                }
                d.modify_index = index;
                d.modify_time = now;
                if h {
                    // The next batch of the rollout may go.
                    deployment_evals.insert(job_id(&d.namespace, &d.job_name));
                }
                deployments.insert(did, d);
            }
            a.modify_index = index;
            a.modify_time = now;
            // The second: a stopped allocation's client is done with it, which frees
            // its CSI volume claims (they last until then).
            if (!old.is_terminal() && a.is_terminal())
                || (!old.client_status.is_terminal() && a.client_status.is_terminal())
            {
                b.unblock = true;
            }
            if let Some(job) = st.job_in(&a.namespace, &a.job_name).filter(|j| !j.stop) {
                let name = job_id(&job.spec.namespace, &job.spec.name);
                if a.client_status == ClientStatus::Failed
                    && old.client_status != ClientStatus::Failed
                    && a.desired_status == DesiredStatus::Run
                    && job.spec.job_type != JobType::System
                {
                    failure_evals.insert(name.clone());
                }
                if a.client_status == ClientStatus::Running
                    && old.client_status == ClientStatus::Pending
                    && a.job_version == job.version
                {
                    let in_progress = *rolling.entry(name.clone()).or_insert_with(|| {
                        st.allocs_of_job(&name.0, &name.1)
                            .any(|o| !o.is_terminal() && o.job_version < job.version)
                    });
                    if in_progress {
                        rolling_evals.insert(name.clone());
                    }
                }
            }
            changed.insert(a.id.clone(), a);
        }
        verdicts.push(Ok(()));
    }
    for (alloc_id, (node_id, list)) in &reports {
        let (Some(alloc), Some(node)) = (
            changed.get(alloc_id).or_else(|| st.alloc(alloc_id)),
            scheduler::StateView::node(st, node_id),
        ) else {
            continue;
        };
        let (puts, drops) = services::apply_report(st, alloc, node, list, index);
        b.services.extend(puts);
        b.drop_services.extend(drops);
    }
    b.allocs = changed.into_values().collect();
    b.deployments = deployments.into_values().collect();
    rolling_evals.extend(deployment_evals);
    for (ns, name) in &failure_evals {
        if let Some(job) = st.job_in(ns, name) {
            b.evals
                .push(new_eval(job, EvalTrigger::AllocFailure, index, now));
        }
    }
    // An alloc-failure evaluation of the same job does the rolling update's work too.
    for (ns, name) in rolling_evals.difference(&failure_evals) {
        if let Some(job) = st.job_in(ns, name) {
            let mut e = new_eval(job, EvalTrigger::RollingUpdate, index, now);
            e.previous_eval = st.evals_of_job(ns, name).last().map(|p| p.id.clone());
            b.evals.push(e);
        }
    }
    (b, verdicts)
}

/// At most [`MAX_CLIENT_UPDATES`] in one call.
pub(crate) fn check_count(updates: &[AllocClientUpdate]) -> Result<(), ServerError> {
    if updates.len() > MAX_CLIENT_UPDATES {
        return Err(ServerError::Invalid(format!(
            "{} allocation updates in one call, at most {MAX_CLIENT_UPDATES}",
            updates.len()
        )));
    }
    Ok(())
}
