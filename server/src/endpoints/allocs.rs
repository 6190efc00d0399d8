//! Allocation reads, and stopping one allocation.

use drover_server_api::{Allocation, DesiredStatus, EvalTrigger, Index};

use super::{by_id_or_prefix, newest_first};
use crate::error::ServerError;
use crate::server::Server;
use crate::state::Batch;
use crate::state::evals::new_eval;

impl Server {
    // --- allocations and evaluations ---------------------------------------------

    /// Every allocation, newest first.
    pub fn allocations(&self) -> Vec<Allocation> {
        let st = self.core.read();
        let mut v: Vec<Allocation> = st.all_allocs().cloned().collect();
        newest_first(&mut v, |a| (a.create_index, &a.id));
        v
    }

    /// One allocation, by id or unique id prefix.
    pub fn allocation(&self, id: &str) -> Option<Allocation> {
        let st = self.core.read();
        by_id_or_prefix(st.alloc(id), st.all_allocs(), |a| &a.id, id).cloned()
    }
}

impl Server {
    /// Stop one allocation so that the scheduler replaces it (Nomad's `nomad alloc
    /// stop`): it is marked to stop, and an evaluation of its job places its
    /// replacement. `id` is an id or a unique id prefix. The evaluation's id and the
    /// commit's index.
    pub async fn stop_allocation(&self, id: &str) -> Result<(String, Index), ServerError> {
        let term = self.leadership.require()?;
        let (index, eval_id) = term
            .commit(|st, index, now| {
                let Some(alloc) = by_id_or_prefix(st.alloc(id), st.all_allocs(), |a| &a.id, id)
                else {
                    return Err(ServerError::NotFound(format!("alloc not found: {id}")));
                };
                let Some(job) = st.job_in(&alloc.namespace, &alloc.job_name) else {
                    return Err(ServerError::NotFound(format!(
                        "job {} of allocation {} not found",
                        alloc.job_name, alloc.id
                    )));
                };
                let mut b = Batch::default();
                if alloc.desired_status != DesiredStatus::Stop {
                    let mut a = alloc.clone();
                    a.desired_status = DesiredStatus::Stop;
                    a.desired_description = "alloc was stopped by a user".into();
                    a.alloc_modify_index = index;
                    a.modify_index = index;
                    a.modify_time = now;
                    b.allocs.push(a);
                    b.unblock = true;
                }
                let mut eval = new_eval(job, EvalTrigger::AllocStop, index, now);
                eval.node_id = Some(alloc.node_id.clone());
                let eval_id = eval.id.clone();
                b.evals.push(eval);
                Ok((b, eval_id))
            })
            .await?;
        Ok((eval_id, index))
    }
}
