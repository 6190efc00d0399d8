//! Deployment endpoints: the reads of deployments, promote, fail, and a job's revert
//! to an earlier version.

use drover_server_api::{
    Allocation, Deployment, DeploymentStatus, DeploymentUpdateResponse, EvalTrigger,
    JobRegisterResponse,
};

use super::{by_id_or_prefix, newest_first};
use crate::error::ServerError;
use crate::leader::deployments as watcher;
use crate::server::Server;
use crate::state::Batch;
use crate::state::evals::new_eval;

impl Server {
    /// Every deployment, newest first.
    pub fn deployments(&self) -> Vec<Deployment> {
        let st = self.core.read();
        let mut v: Vec<Deployment> = st.all_deployments().cloned().collect();
        newest_first(&mut v, |d| (d.create_index, d.id.as_str()));
        v
    }

    /// One deployment by id or unique id prefix.
    pub fn deployment(&self, id: &str) -> Option<Deployment> {
        let st = self.core.read();
        by_id_or_prefix(st.deployment(id), st.all_deployments(), |d| &d.id, id).cloned()
    }

    /// A job's deployments, newest first (`None`: no such job).
    pub fn job_deployments(&self, ns: &str, job: &str) -> Option<Vec<Deployment>> {
        let st = self.core.read();
        st.job_in(ns, job)?;
        Some(st.deployments_of_job(ns, job).rev().cloned().collect())
    }

    /// The allocations a deployment placed.
    pub fn deployment_allocations(&self, id: &str) -> Option<Vec<Allocation>> {
        let st = self.core.read();
        let d = by_id_or_prefix(st.deployment(id), st.all_deployments(), |d| &d.id, id)?;
        let mut v: Vec<Allocation> = st
            .allocs_of_job(&d.namespace, &d.job_name)
            .filter(|a| a.deployment_id.as_deref() == Some(d.id.as_str()))
            .cloned()
            .collect();
        newest_first(&mut v, |a| (a.create_index, a.id.as_str()));
        Some(v)
    }

    /// Promote the canaries of `groups` (every group when `None`) of a running
    /// deployment: the rollout goes on past them. Refused unless each promoted
    /// group's canaries are placed and healthy.
    pub async fn promote_deployment(
        &self,
        id: &str,
        groups: Option<Vec<String>>,
    ) -> Result<DeploymentUpdateResponse, ServerError> {
        let term = self.leadership.require()?;
        let id = self.full_deployment_id(id)?;
        let (index, (eval_id, modify)) = term
            .commit(|st, index, now| {
                let d = st
                    .deployment(&id)
                    .ok_or_else(|| ServerError::NotFound(format!("deployment {id} not found")))?;
                let mut d = d.clone();
                watcher::promote(st, &mut d, groups.as_deref(), index, now)?;
                let job = st
                    .job_in(&d.namespace, &d.job_name)
                    .ok_or_else(|| ServerError::NotFound("job not found".into()))?;
                let eval = new_eval(job, EvalTrigger::DeploymentWatcher, index, now);
                let eval_id = eval.id.clone();
                let mut b = Batch::default();
                b.evals.push(eval);
                b.deployments.push(d);
                Ok((b, (eval_id, index)))
            })
            .await?;
        Ok(DeploymentUpdateResponse {
            eval_id,
            deployment_modify_index: modify,
            reverted_job_version: None,
            index,
        })
    }

    /// Mark a running deployment failed; with `auto_revert` the job goes back to its
    /// last stable version.
    pub async fn fail_deployment(&self, id: &str) -> Result<DeploymentUpdateResponse, ServerError> {
        let term = self.leadership.require()?;
        let id = self.full_deployment_id(id)?;
        let (index, (eval_id, reverted)) = term
            .commit(|st, index, now| {
                let d = st
                    .deployment(&id)
                    .ok_or_else(|| ServerError::NotFound(format!("deployment {id} not found")))?;
                if !d.status.is_active() {
                    return Err(ServerError::Invalid(format!(
                        "deployment {id} is {}: only a running or paused one can be failed",
                        d.status.as_str()
                    )));
                }
                let mut b = Batch::default();
                let (eval_id, reverted) = watcher::fail(
                    st,
                    &mut b,
                    d,
                    DeploymentStatus::Failed,
                    "Deployment marked as failed",
                    index,
                    now,
                );
                Ok((b, (eval_id, reverted)))
            })
            .await?;
        Ok(DeploymentUpdateResponse {
            eval_id,
            deployment_modify_index: index,
            reverted_job_version: reverted,
            index,
        })
    }

    /// Register version `version` of job `name` again as its newest version (Nomad's
    /// `job revert`). With `enforce_prior_version`, refused unless the job's current
    /// version is that one.
    pub async fn revert_job(
        &self,
        ns: &str,
        name: &str,
        version: u64,
        enforce_prior_version: Option<u64>,
    ) -> Result<JobRegisterResponse, ServerError> {
        let term = self.leadership.require()?;
        let (index, (eval_id, job_modify_index)) = term
            .commit(|st, index, now| {
                let current = st
                    .job_in(ns, name)
                    .ok_or_else(|| ServerError::NotFound("job not found".into()))?;
                if let Some(prior) = enforce_prior_version
                    && prior != current.version
                {
                    return Err(ServerError::Invalid(format!(
                        "current job has version {}; enforcing version {prior}",
                        current.version
                    )));
                }
                if version == current.version {
                    return Err(ServerError::Invalid(format!(
                        "can't revert to current version {version}"
                    )));
                }
                let target = st.job_at_version(ns, name, version).ok_or_else(|| {
                    ServerError::NotFound(format!("job {name} has no version {version} kept"))
                })?;
                // A version kept from before a rule was tightened is refused now.
                drover_server_api::validate::validate(&target.spec).map_err(|e| {
                    ServerError::Invalid(format!("version {version} is no longer valid: {e}"))
                })?;
                let mut b = Batch::default();
                let (job, eval_id) = super::jobs::submit(
                    st,
                    &mut b,
                    target.spec.clone(),
                    EvalTrigger::JobRegister,
                    index,
                    now,
                );
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

    fn full_deployment_id(&self, id: &str) -> Result<String, ServerError> {
        self.deployment(id)
            .map(|d| d.id)
            .ok_or_else(|| ServerError::NotFound(format!("deployment {id} not found")))
    }
}
