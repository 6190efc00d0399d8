//! Job endpoints: register, plan, stop, and the reads of jobs with their
//! allocations and evaluations.

use std::collections::{BTreeMap, BTreeSet};

use drover_server_api::{
    Allocation, ClientStatus, EvalStatus, EvalTrigger, Evaluation, GroupPlanSummary, GroupSummary,
    Job, JobListStub, JobPlanResponse, JobRegisterResponse, JobSpec, JobStatus, JobType, Node,
    NodeStatus,
};

use super::{NsFilter, newest_first};
use crate::core::Core;
use crate::error::ServerError;
use crate::scheduler;
use crate::server::Server;
use crate::state::evals::{new_eval, now_nanos, set_eval_status};
use crate::state::{Batch, KEPT_VERSIONS, Overlay, State, job_id};

/// The same checks as the CLI's (`drover_server_api::validate`): a job refused here
/// names the field (`group[0].task[1].resources.memory_mb: ...`).
fn validate_spec(spec: &JobSpec) -> Result<(), ServerError> {
    drover_server_api::validate::validate(spec).map_err(|e| ServerError::Invalid(e.to_string()))
}

/// What validation cannot know alone: a static port inside the dynamic port range of a
/// node that could run the group (`group[0].network.port[0].static: 20500 is inside
/// the dynamic port range 20000-32000 of node ...`).
fn check_ports(st: &State, spec: &JobSpec) -> Result<(), ServerError> {
    let has_static = spec.groups.iter().any(|g| {
        g.network
            .as_ref()
            .is_some_and(|n| n.ports.iter().any(|p| p.static_port != 0))
    });
    if !has_static {
        return Ok(());
    }
    let nodes: Vec<&Node> = st.all_nodes().collect();
    scheduler::ports::check_static_ports(spec, &nodes)
        .map_err(|(field, message)| ServerError::Invalid(format!("{field}: {message}")))
}

/// A job's status, derived from its allocations and evaluations.
pub(crate) fn job_status(st: &State, job: &Job) -> JobStatus {
    let mut any = false;
    let (ns, name) = (&job.spec.namespace, &job.spec.name);
    for a in st.allocs_of_job(ns, name) {
        if !a.is_terminal() {
            return JobStatus::Running;
        }
        any = true;
    }
    if job.stop {
        return JobStatus::Dead;
    }
    let waiting = st.blocked_eval(ns, name).is_some()
        || st
            .evals_of_job(ns, name)
            .any(|e| e.status == EvalStatus::Pending);
    if job.spec.job_type == JobType::Batch && any && !waiting {
        return JobStatus::Dead;
    }
    JobStatus::Pending
}

/// A job's allocation counts by group and client status, with what is queued.
fn group_summaries(st: &State, j: &Job) -> BTreeMap<String, GroupSummary> {
    let mut summary: BTreeMap<String, GroupSummary> = j
        .spec
        .groups
        .iter()
        .map(|g| (g.name.clone(), GroupSummary::default()))
        .collect();
    for a in st.allocs_of_job(&j.spec.namespace, &j.spec.name) {
        let s = summary.entry(a.group.clone()).or_default();
        match a.client_status {
            ClientStatus::Pending => s.pending += 1,
            ClientStatus::Running => s.running += 1,
            ClientStatus::Complete => s.complete += 1,
            ClientStatus::Failed => s.failed += 1,
            ClientStatus::Lost => s.lost += 1,
        }
    }
    if let Some(b) = st.blocked_eval(&j.spec.namespace, &j.spec.name) {
        for (g, n) in &b.queued_allocations {
            summary.entry(g.clone()).or_default().queued += n;
        }
    }
    summary
}

/// What registering and scaling share: `spec` becomes the job's next version (unless
/// it is the running job's already), the oldest versions past [`KEPT_VERSIONS`] go, and
/// a new evaluation supersedes a blocked one; all into `b`. The job as it will be, and
/// the evaluation's id.
pub(crate) fn submit(
    st: &State,
    b: &mut Batch,
    spec: JobSpec,
    trigger: EvalTrigger,
    index: drover_server_api::Index,
    now: i64,
) -> (Job, String) {
    let existing = st.job_in(&spec.namespace, &spec.name);
    let changed = existing.is_none_or(|j| j.spec != spec || j.stop);
    let job = match existing {
        Some(old) if !changed => old.clone(),
        _ => Job {
            stable: Default::default(),
            version: existing.map_or(0, |old| old.version + 1),
            create_index: existing.map_or(index, |old| old.create_index),
            spec,
            stop: false,
            status: JobStatus::Pending,
            submit_time: now,
            modify_index: index,
            job_modify_index: index,
        },
    };
    if changed {
        b.jobs.push(job.clone());
        b.versions.push(job.clone());
        if let Some(vs) = st.job_versions(&job.spec.namespace, &job.spec.name) {
            // Keep the newest KEPT_VERSIONS (the new one included).
            let drop = (vs.len() + 1).saturating_sub(KEPT_VERSIONS);
            let id = job_id(&job.spec.namespace, &job.spec.name);
            b.drop_versions
                .extend(vs.keys().take(drop).map(|v| (id.clone(), *v)));
        }
    }
    let eval = new_eval(&job, trigger, index, now);
    if let Some(blocked) = st.blocked_eval(&job.spec.namespace, &job.spec.name) {
        b.evals.push(set_eval_status(
            blocked,
            EvalStatus::Canceled,
            format!("superseded by evaluation {}", eval.id),
            index,
            now,
        ));
    }
    let id = eval.id.clone();
    b.evals.push(eval);
    (job, id)
}

fn job_with_status(st: &State, job: &Job) -> Job {
    let mut j = job.clone();
    j.status = job_status(st, job);
    j
}

impl Server {
    // --- jobs ---------------------------------------------------------------------

    /// Register a job or a new version of it, and create its evaluation. Validates the
    /// spec (`ServerError::Invalid` names the field). Re-registering an unchanged spec
    /// creates no version but still an evaluation (as `nomad job run`).
    pub async fn register_job(&self, spec: JobSpec) -> Result<JobRegisterResponse, ServerError> {
        validate_spec(&spec)?;
        let term = self.leadership.require()?;
        let (index, (eval_id, job_modify_index, warnings)) = term
            .commit(|st, index, now| {
                if st.namespace(&spec.namespace).is_none() {
                    return Err(ServerError::Invalid(format!(
                        "job {:?} is in nonexistent namespace {:?}",
                        spec.name, spec.namespace
                    )));
                }
                check_ports(st, &spec)?;
                let mut b = Batch::default();
                // The job's allocations get workload identities: the keyring needs a
                // key to sign them with before the first is placed.
                crate::variables::ensure_root_key(&self.keyring, st, &mut b, index, now)?;
                let (job, eval_id) = submit(
                    st,
                    &mut b,
                    spec.clone(),
                    EvalTrigger::JobRegister,
                    index,
                    now,
                );
                let warnings = driver_warnings(st, &job.spec);
                Ok((b, (eval_id, job.job_modify_index, warnings)))
            })
            .await?;
        Ok(JobRegisterResponse {
            eval_id,
            job_modify_index,
            index,
            warnings,
        })
    }

    /// What registering `spec` would do; commits nothing. The scheduler runs on a
    /// blocking thread (as a worker's does): a big job must not hold an async worker
    /// thread of the HTTP server for the whole placement.
    pub async fn plan_job(&self, spec: JobSpec) -> Result<JobPlanResponse, ServerError> {
        validate_spec(&spec)?;
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || plan_job_blocking(&core, spec))
            .await
            .map_err(|e| ServerError::Unavailable(format!("the scheduler failed: {e}")))?
    }
    /// Stop job `name` of namespace `ns` (its allocations are stopped); with `purge`
    /// also forget it.
    pub async fn stop_job(
        &self,
        ns: &str,
        name: &str,
        purge: bool,
    ) -> Result<JobRegisterResponse, ServerError> {
        let term = self.leadership.require()?;
        let (index, (eval_id, job_modify_index)) = term
            .commit(|st, index, now| {
                let Some(old) = st.job_in(ns, name) else {
                    return Err(ServerError::NotFound("job not found".into()));
                };
                let mut b = Batch::default();
                let mut job = old.clone();
                job.stop = true;
                job.modify_index = index;
                // A plan made for the running spec must not place anything any more.
                job.job_modify_index = index;
                let eval = new_eval(&job, EvalTrigger::JobDeregister, index, now);
                if purge {
                    b.purge.push(job_id(ns, name));
                    // What already ended goes with the job; the rest once its client
                    // reports it ended (garbage collection).
                    b.drop_allocs.extend(
                        st.allocs_of_job(ns, name)
                            .filter(|a| a.client_status.is_terminal())
                            .map(|a| a.id.clone()),
                    );
                } else {
                    b.jobs.push(job.clone());
                }
                if let Some(blocked) = st.blocked_eval(ns, name) {
                    b.evals.push(set_eval_status(
                        blocked,
                        EvalStatus::Canceled,
                        format!("job stopped (evaluation {})", eval.id),
                        index,
                        now,
                    ));
                }
                let r = (eval.id.clone(), job.job_modify_index);
                b.evals.push(eval);
                Ok((b, r))
            })
            .await?;
        Ok(JobRegisterResponse {
            eval_id,
            job_modify_index,
            index,
            warnings: Vec::new(),
        })
    }

    /// Every job, by namespace and name.
    pub fn jobs(&self) -> Vec<JobListStub> {
        let st = self.core.read();
        let mut out: Vec<JobListStub> = st
            .jobs()
            .map(|j| {
                let summary = group_summaries(&st, j);
                JobListStub {
                    namespace: j.spec.namespace.clone(),
                    name: j.spec.name.clone(),
                    job_type: j.spec.job_type,
                    priority: j.spec.priority,
                    status: job_status(&st, j),
                    stop: j.stop,
                    version: j.version,
                    summary,
                    create_index: j.create_index,
                    modify_index: j.modify_index,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// The job named `name` in namespace `ns`.
    pub fn job(&self, ns: &str, name: &str) -> Option<Job> {
        let st = self.core.read();
        st.job_in(ns, name).map(|j| job_with_status(&st, j))
    }

    /// The jobs of the namespaces `namespaces` takes whose name starts with `prefix`,
    /// with their allocation counts by group, by namespace and name.
    pub fn jobs_with_summaries(
        &self,
        namespaces: NsFilter<'_>,
        prefix: &str,
    ) -> Vec<(Job, BTreeMap<String, GroupSummary>)> {
        let st = self.core.read();
        let mut out: Vec<(Job, BTreeMap<String, GroupSummary>)> = st
            .jobs()
            .filter(|j| j.spec.name.starts_with(prefix) && namespaces(&j.spec.namespace))
            .map(|j| (job_with_status(&st, j), group_summaries(&st, j)))
            .collect();
        out.sort_by(|a, b| {
            (&a.0.spec.namespace, &a.0.spec.name).cmp(&(&b.0.spec.namespace, &b.0.spec.name))
        });
        out
    }

    /// A job's summary: allocation counts by group (`None`: no such job).
    pub fn job_summary(
        &self,
        ns: &str,
        name: &str,
    ) -> Option<(Job, BTreeMap<String, GroupSummary>)> {
        let st = self.core.read();
        let j = st.job_in(ns, name)?;
        Some((job_with_status(&st, j), group_summaries(&st, j)))
    }

    /// A job's kept versions, newest first (`None`: no such job).
    pub fn job_versions(&self, ns: &str, name: &str) -> Option<Vec<Job>> {
        let st = self.core.read();
        let current = st.job_in(ns, name)?;
        let mut out: Vec<Job> = st
            .job_versions(ns, name)
            .map(|vs| vs.values().rev().cloned().collect())
            .unwrap_or_default();
        match out.first_mut() {
            // The current version carries the current stop flag and status.
            Some(first) if first.version == current.version => {
                *first = job_with_status(&st, current);
            }
            _ => out.insert(0, job_with_status(&st, current)),
        }
        Some(out)
    }

    /// Set the count of `group` of job `name` to `count` as a new version of the job,
    /// and evaluate it (Nomad's `/v1/job/:id/scale`). A stopped job is refused.
    pub async fn scale_job(
        &self,
        ns: &str,
        name: &str,
        group: &str,
        count: u32,
    ) -> Result<JobRegisterResponse, ServerError> {
        let term = self.leadership.require()?;
        let (index, (eval_id, job_modify_index)) = term
            .commit(|st, index, now| {
                let Some(old) = st.job_in(ns, name) else {
                    return Err(ServerError::NotFound("job not found".into()));
                };
                if old.stop {
                    return Err(ServerError::Invalid(format!(
                        "job {name} is stopped: scaling a stopped job is not allowed"
                    )));
                }
                let mut spec = old.spec.clone();
                let Some(g) = spec.groups.iter_mut().find(|g| g.name == group) else {
                    return Err(ServerError::Invalid(format!(
                        "job {name} has no task group {group:?}"
                    )));
                };
                g.count = count;
                validate_spec(&spec)?;
                let mut b = Batch::default();
                let (job, eval_id) = submit(st, &mut b, spec, EvalTrigger::JobScaling, index, now);
                Ok((b, (eval_id, job.job_modify_index)))
            })
            .await?;
        Ok(JobRegisterResponse {
            eval_id,
            job_modify_index,
            index,
            warnings: Vec::new(),
        })
    }

    /// A job's allocations, newest first.
    pub fn job_allocations(&self, ns: &str, name: &str) -> Vec<Allocation> {
        let st = self.core.read();
        let mut v: Vec<Allocation> = st.allocs_of_job(ns, name).cloned().collect();
        newest_first(&mut v, |a| (a.create_index, &a.id));
        v
    }

    /// A job's evaluations, newest first.
    pub fn job_evaluations(&self, ns: &str, name: &str) -> Vec<Evaluation> {
        let st = self.core.read();
        let mut v: Vec<Evaluation> = st.evals_of_job(ns, name).cloned().collect();
        newest_first(&mut v, |e| (e.create_index, &e.id));
        v
    }
}

/// "no ready node has driver X": said at registration, the job is still accepted.
fn driver_warnings(st: &State, spec: &JobSpec) -> Vec<String> {
    let drivers: BTreeSet<&str> = spec
        .groups
        .iter()
        .flat_map(|g| g.tasks.iter().map(|t| t.driver.as_str()))
        .collect();
    let mut out = Vec::new();
    let nodes: Vec<&Node> = st
        .all_nodes()
        .filter(|n| n.status == NodeStatus::Ready)
        .collect();
    for d in drivers {
        let ok = nodes
            .iter()
            .any(|n| n.driver(d).is_some_and(|i| i.detected && i.healthy));
        if !ok {
            out.push(format!("no ready node has driver {d} healthy"));
        }
    }
    out
}

/// `Server::plan_job` on the calling (blocking) thread, under the state's read lock.
fn plan_job_blocking(core: &Core, spec: JobSpec) -> Result<JobPlanResponse, ServerError> {
    let st = core.read();
    check_ports(&st, &spec)?;
    if st.namespace(&spec.namespace).is_none() {
        return Err(ServerError::Invalid(format!(
            "job {:?} is in nonexistent namespace {:?}",
            spec.name, spec.namespace
        )));
    }
    let existing = st.job_in(&spec.namespace, &spec.name);
    let changed = existing.is_none_or(|j| j.spec != spec || j.stop);
    let version = match existing {
        None => 0,
        Some(j) if changed => j.version + 1,
        Some(j) => j.version,
    };
    let job_modify_index = existing.map_or(0, |j| j.job_modify_index);
    let job = Job {
        stable: Default::default(),
        spec: spec.clone(),
        version,
        stop: false,
        status: JobStatus::Pending,
        submit_time: now_nanos(),
        create_index: existing.map_or(st.index + 1, |j| j.create_index),
        modify_index: st.index + 1,
        job_modify_index: if changed {
            st.index + 1
        } else {
            job_modify_index
        },
    };
    let eval = new_eval(&job, EvalTrigger::JobRegister, st.index + 1, now_nanos());
    let overlay = Overlay { base: &st, job };
    let out = scheduler::schedule(&overlay, &eval, core.settings());
    let mut groups: BTreeMap<String, GroupPlanSummary> = spec
        .groups
        .iter()
        .map(|g| (g.name.clone(), GroupPlanSummary::default()))
        .collect();
    let stopped: std::collections::HashSet<&str> = out
        .plan
        .node_update
        .values()
        .flatten()
        .map(|s| s.alloc_id.as_str())
        .collect();
    for a in out.plan.node_allocation.values().flatten() {
        let g = groups.entry(a.group.clone()).or_default();
        if a.previous_allocation
            .as_deref()
            .is_some_and(|p| stopped.contains(p))
        {
            g.update += 1;
        } else {
            g.place += 1;
        }
    }
    for s in out.plan.node_update.values().flatten() {
        if let Some(a) = st.alloc(&s.alloc_id) {
            groups.entry(a.group.clone()).or_default().stop += 1;
        }
    }
    for g in groups.values_mut() {
        g.stop = g.stop.saturating_sub(g.update);
    }
    for a in st.allocs_of_job(&spec.namespace, &spec.name) {
        if !a.is_terminal() && !stopped.contains(a.id.as_str()) {
            groups.entry(a.group.clone()).or_default().ignore += 1;
        }
    }
    Ok(JobPlanResponse {
        job_version: version,
        changed,
        groups,
        failed_tg_allocs: out.failed_tg_allocs,
        job_modify_index,
    })
}
