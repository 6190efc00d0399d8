//! Evaluation helpers every part that commits needs: a new evaluation, a new status
//! for one, the clock they are stamped with, and the bound on evaluations kept per job.

use std::collections::{BTreeMap, BTreeSet};

use drover_server_api::{EvalStatus, EvalTrigger, Evaluation, Index, Job, JobType};

use super::{Batch, State};

/// Evaluations kept per job; older terminal ones are deleted with the commit that adds
/// a new one, so the state does not grow with every evaluation ever made.
pub(crate) const MAX_EVALS_PER_JOB: usize = 64;

pub(crate) fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A new pending evaluation of `job`.
pub(crate) fn new_eval(job: &Job, trigger: EvalTrigger, index: Index, now: i64) -> Evaluation {
    Evaluation {
        wait_until: None,
        id: uuid::Uuid::new_v4().to_string(),
        namespace: job.spec.namespace.clone(),
        job_name: job.spec.name.clone(),
        job_type: job.spec.job_type,
        priority: job.spec.priority,
        triggered_by: trigger,
        status: EvalStatus::Pending,
        status_description: String::new(),
        node_id: None,
        failed_tg_allocs: BTreeMap::new(),
        queued_allocations: BTreeMap::new(),
        blocked_eval: None,
        previous_eval: None,
        job_modify_index: job.job_modify_index,
        create_index: index,
        modify_index: index,
        create_time: now,
        modify_time: now,
    }
}

/// `eval` with a new status, stamped at `index`.
pub(crate) fn set_eval_status(
    eval: &Evaluation,
    status: EvalStatus,
    description: String,
    index: Index,
    now: i64,
) -> Evaluation {
    let mut e = eval.clone();
    e.status = status;
    e.status_description = description;
    e.modify_index = index;
    e.modify_time = now;
    e
}

/// Delete the oldest terminal evaluations of jobs that get a new one and hold more
/// than [`MAX_EVALS_PER_JOB`].
pub(crate) fn gc_evals(st: &State, batch: &mut Batch) {
    let mut jobs: BTreeSet<(&str, &str)> = BTreeSet::new();
    for e in &batch.evals {
        if st.eval(&e.id).is_none() {
            jobs.insert((&e.namespace, &e.job_name));
        }
    }
    let keep: std::collections::HashSet<&str> = batch.evals.iter().map(|e| e.id.as_str()).collect();
    let mut drop = Vec::new();
    for (ns, job) in jobs {
        let evals: Vec<&Evaluation> = st.evals_of_job(ns, job).collect();
        if evals.len() < MAX_EVALS_PER_JOB {
            continue;
        }
        let excess = evals.len() + 1 - MAX_EVALS_PER_JOB;
        drop.extend(
            evals
                .iter()
                .filter(|e| {
                    matches!(
                        e.status,
                        EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled
                    ) && !keep.contains(e.id.as_str())
                })
                .take(excess)
                .map(|e| e.id.clone()),
        );
    }
    batch.drop_evals.extend(drop);
}

/// A `node-update` evaluation for every live system job.
pub(crate) fn system_job_evals(st: &State, node_id: &str, index: Index, now: i64, b: &mut Batch) {
    for job in st
        .jobs()
        .filter(|j| j.spec.job_type == JobType::System && !j.stop)
    {
        let mut e = new_eval(job, EvalTrigger::NodeUpdate, index, now);
        e.node_id = Some(node_id.to_owned());
        b.evals.push(e);
    }
}
