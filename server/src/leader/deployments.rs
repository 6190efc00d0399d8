//! The deployment watcher: moves the running deployments on from what is in the
//! state (so that a new leader resumes them where the old one left them).
//!
//! Every tick, for each running deployment:
//! - its job moved to another version, or was stopped: cancelled;
//! - an allocation of it turned unhealthy: failed ("Failed due to unhealthy
//!   allocations");
//! - a group made no progress by its `require_progress_by`: failed ("Failed due to
//!   progress deadline");
//! - a failure with `auto_revert` registers the job's newest stable version again
//!   (one that differs from the failed one);
//! - canaries all healthy with `auto_promote`: promoted;
//! - every group complete (its placements healthy, nothing left of the old version,
//!   its count running): successful, and the job version is marked stable.
//!
//! Allocation health comes from the clients (see `client_updates.rs`), which also
//! evaluate the job when an allocation turns healthy, so that the next batch goes
//! without waiting for a tick.

use std::sync::Arc;
use std::time::Duration;

use drover_server_api::{
    Deployment, DeploymentGroup, DeploymentStatus, EvalTrigger, Index, Job, JobType,
};
use tokio_util::sync::CancellationToken;

use crate::endpoints::jobs::submit;
use crate::error::ServerError;
use crate::leader::term::LeaderTerm;
use crate::scheduler;
use crate::state::evals::new_eval;
use crate::state::{Batch, State};

/// How often the running deployments are looked at.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_millis(500);

pub(crate) async fn run(term: Arc<LeaderTerm>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(WATCH_INTERVAL) => {}
        }
        let r = term
            .commit(|st, index, now| Ok((watch(st, index, now), ())))
            .await;
        if let Err(e) = r {
            tracing::warn!("deployment watcher: {e}");
        }
    }
}

/// What the watcher changes now (an empty batch: nothing).
pub(crate) fn watch(st: &State, index: Index, now: i64) -> Batch {
    let mut b = Batch::default();
    let running: Vec<&Deployment> = st
        .all_deployments()
        .filter(|d| d.status == DeploymentStatus::Running)
        .collect();
    for d in running {
        let job = st.job_in(&d.namespace, &d.job_name);
        let current = job.filter(|j| {
            !j.stop && j.version == d.job_version && j.create_index == d.job_create_index
        });
        let Some(job) = current else {
            let why = match job {
                Some(j) if j.stop => "Cancelled because job is stopped",
                Some(_) => "Cancelled because job is being updated",
                None => "Cancelled because job was purged",
            };
            b.deployments
                .push(with_status(d, DeploymentStatus::Cancelled, why, index, now));
            continue;
        };
        if d.groups.values().any(|g| g.unhealthy_allocs > 0) {
            fail(
                st,
                &mut b,
                d,
                DeploymentStatus::Failed,
                "Failed due to unhealthy allocations",
                index,
                now,
            );
            continue;
        }
        // A group whose canaries are all healthy waits for its promotion, not for
        // progress (as Nomad's watcher does).
        let late = d.groups.iter().any(|(name, g)| {
            let awaits_promotion = g.desired_canaries > 0
                && !g.promoted
                && canaries_healthy(st, g) >= g.desired_canaries;
            g.require_progress_by != 0
                && now > g.require_progress_by
                && !awaits_promotion
                && !group_complete(st, job, d, name, g)
        });
        if late {
            fail(
                st,
                &mut b,
                d,
                DeploymentStatus::Failed,
                "Failed due to progress deadline",
                index,
                now,
            );
            continue;
        }
        if d.has_unpromoted_canaries() && auto_promotable(st, d) {
            let mut promoted = d.clone();
            if promote(st, &mut promoted, None, index, now).is_ok() {
                promoted.status_description = "Deployment is running".into();
                b.deployments.push(promoted);
                b.evals
                    .push(new_eval(job, EvalTrigger::DeploymentWatcher, index, now));
            }
            continue;
        }
        if d.groups
            .iter()
            .all(|(name, g)| group_complete(st, job, d, name, g))
        {
            b.deployments.push(with_status(
                d,
                DeploymentStatus::Successful,
                "Deployment completed successfully",
                index,
                now,
            ));
            mark_stable(st, &mut b, job, index);
        }
    }
    b
}

fn with_status(
    d: &Deployment,
    status: DeploymentStatus,
    why: &str,
    index: Index,
    now: i64,
) -> Deployment {
    let mut d = d.clone();
    d.status = status;
    d.status_description = why.to_owned();
    d.modify_index = index;
    d.modify_time = now;
    d
}

/// The job's current version (and its kept copy) is stable.
fn mark_stable(st: &State, b: &mut Batch, job: &Job, index: Index) {
    if job.stable {
        return;
    }
    let mut j = job.clone();
    j.stable = true;
    j.modify_index = index;
    b.jobs.push(j);
    if let Some(v) = st.job_at_version(&job.spec.namespace, &job.spec.name, job.version) {
        let mut v = v.clone();
        v.stable = true;
        b.versions.push(v);
    }
}

/// Every allocation the deployment placed in `group` is healthy, none of the group's
/// live allocations runs an older spec, and the group has its count running.
fn group_complete(st: &State, job: &Job, d: &Deployment, name: &str, g: &DeploymentGroup) -> bool {
    if g.desired_canaries > 0 && !g.promoted {
        return false;
    }
    let Some(group) = job.spec.groups.iter().find(|tg| tg.name == name) else {
        return true;
    };
    let mut live = 0u32;
    for a in st.allocs_of_job(&job.spec.namespace, &job.spec.name) {
        if a.group != name || a.is_terminal() {
            continue;
        }
        if a.deployment_id.as_deref() == Some(d.id.as_str()) {
            if a.deployment_status.as_ref().and_then(|s| s.healthy) != Some(true) {
                return false;
            }
        } else if scheduler::changed(st, job, group, a) {
            return false;
        }
        live += 1;
    }
    live >= g.desired_total
}

/// Every group with canaries auto-promotes, and its canaries are all placed and
/// healthy.
fn auto_promotable(st: &State, d: &Deployment) -> bool {
    d.groups.values().all(|g| {
        g.desired_canaries == 0
            || g.promoted
            || (g.auto_promote && canaries_healthy(st, g) >= g.desired_canaries)
    })
}

fn canaries_healthy(st: &State, g: &DeploymentGroup) -> u32 {
    g.placed_canaries
        .iter()
        .filter_map(|id| st.alloc(id))
        .filter(|a| {
            !a.is_terminal() && a.deployment_status.as_ref().and_then(|s| s.healthy) == Some(true)
        })
        .count() as u32
}

/// Promote the canaries of `groups` (every group with canaries when `None`).
pub(crate) fn promote(
    st: &State,
    d: &mut Deployment,
    groups: Option<&[String]>,
    index: Index,
    now: i64,
) -> Result<(), ServerError> {
    if d.status != DeploymentStatus::Running {
        return Err(ServerError::Invalid(format!(
            "deployment {} is {}: only a running one can be promoted",
            d.id,
            d.status.as_str()
        )));
    }
    if let Some(names) = groups {
        for n in names {
            if !d.groups.contains_key(n) {
                return Err(ServerError::Invalid(format!(
                    "deployment {} has no task group {n:?}",
                    d.id
                )));
            }
        }
    }
    let mut any = false;
    for (name, g) in d.groups.iter_mut() {
        if groups.is_some_and(|names| !names.contains(name)) {
            continue;
        }
        if g.desired_canaries == 0 || g.promoted {
            continue;
        }
        let healthy = canaries_healthy(st, g);
        if healthy < g.desired_canaries {
            return Err(ServerError::Invalid(format!(
                "task group {name:?} has {healthy}/{} healthy canaries: promote once they are healthy",
                g.desired_canaries
            )));
        }
        g.promoted = true;
        if !g.progress_deadline.is_zero() {
            g.require_progress_by = now.saturating_add(nanos(g.progress_deadline));
        }
        any = true;
    }
    if !any {
        return Err(ServerError::Invalid(format!(
            "deployment {} has no canaries to promote",
            d.id
        )));
    }
    d.modify_index = index;
    d.modify_time = now;
    Ok(())
}

pub(crate) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Mark `d` failed (or `status`), and when a group of it auto-reverts, register the
/// job's newest stable version that differs from the failed one. The evaluation made
/// and the version reverted to.
pub(crate) fn fail(
    st: &State,
    b: &mut Batch,
    d: &Deployment,
    status: DeploymentStatus,
    why: &str,
    index: Index,
    now: i64,
) -> (String, Option<u64>) {
    let mut out = with_status(d, status, why, index, now);
    let job = st
        .job_in(&d.namespace, &d.job_name)
        .filter(|j| !j.stop && j.version == d.job_version);
    let mut reverted = None;
    let mut eval_id = String::new();
    if let Some(job) = job {
        let auto_revert = d.groups.values().any(|g| g.auto_revert);
        let target = auto_revert.then(|| revert_target(st, job)).flatten();
        if auto_revert {
            match &target {
                Some(t) => {
                    out.status_description =
                        format!("{why} - rolling back to job version {}", t.version)
                }
                None => {
                    out.status_description =
                        format!("{why} - no stable job version to auto revert to")
                }
            }
        }
        match target {
            Some(t) => {
                let (new, id) = submit(st, b, t.spec.clone(), EvalTrigger::JobRegister, index, now);
                tracing::info!(
                    job = %job.spec.name,
                    failed = job.version,
                    to = t.version,
                    new = new.version,
                    "deployment failed: reverting the job"
                );
                reverted = Some(new.version);
                eval_id = id;
            }
            None => {
                let e = new_eval(job, EvalTrigger::DeploymentWatcher, index, now);
                eval_id = e.id.clone();
                b.evals.push(e);
            }
        }
    }
    b.deployments.push(out);
    (eval_id, reverted)
}

/// The newest stable version of `job` older than its current one whose spec differs.
fn revert_target<'a>(st: &'a State, job: &Job) -> Option<&'a Job> {
    if job.spec.job_type != JobType::Service {
        return None;
    }
    st.job_versions(&job.spec.namespace, &job.spec.name)?
        .values()
        .rev()
        .find(|v| {
            v.version < job.version
                && v.stable
                && v.spec != job.spec
                // Kept from before a rule was tightened: not registered again.
                && drover_server_api::validate::validate(&v.spec).is_ok()
        })
}
