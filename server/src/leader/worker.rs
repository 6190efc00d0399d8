//! Scheduler workers: dequeue an evaluation, run the scheduler on the shared state
//! (under its read lock, for the duration of one `schedule` call), submit the plan to
//! the applier, write the evaluation's result, ack.

use std::sync::Arc;
use std::time::Instant;

use drover_server_api::{EvalStatus, EvalTrigger, Evaluation};

use crate::core::Core;
use crate::error::ServerError;
use crate::leader::broker::Nacked;
use crate::leader::plan_apply::{EvalFinish, finish_eval};
use crate::scheduler::{self, SchedulerOutput};
use crate::state::Batch;
use crate::state::evals::{new_eval, set_eval_status};
use tokio_util::sync::CancellationToken;

/// Plans submitted for one evaluation before it is given up with a `max-plan-attempts`
/// follow-up evaluation.
pub(crate) const MAX_PLAN_ATTEMPTS: u32 = 5;

pub(crate) async fn run(core: Arc<Core>, worker: usize, stop: CancellationToken) {
    loop {
        let (eval, token) = tokio::select! {
            _ = stop.cancelled() => return,
            e = core.broker.dequeue() => e,
        };
        let r = process(&core, &eval).await;
        match r {
            Ok(()) => {
                if let Err(e) = core.broker.ack(&eval.id, &token) {
                    tracing::warn!(worker, eval = %eval.id, "ack: {e}");
                }
            }
            Err(e) => {
                tracing::warn!(worker, eval = %eval.id, job = %eval.job_name, "evaluation failed: {e}");
                match core.broker.nack(&eval.id, &token) {
                    Ok(Nacked::Redelivered) => {}
                    Ok(Nacked::Failed(ev)) => {
                        core.fail_eval(
                            &ev,
                            format!(
                                "gave up after {} deliveries: {e}",
                                core.config.eval_delivery_limit
                            ),
                        )
                        .await
                    }
                    Err(e) => tracing::warn!(worker, eval = %eval.id, "nack: {e}"),
                }
            }
        }
    }
}

/// Redeliver evaluations no worker acknowledged in time, and hand out the delayed
/// ones that became due (within a period: at most a second late).
pub(crate) async fn run_expiry(core: Arc<Core>, stop: CancellationToken) {
    let period = core.broker.expire_period();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        core.broker.promote_due(crate::state::evals::now_nanos());
        for e in core.broker.expire(Instant::now()) {
            core.fail_eval(&e, "not acknowledged by a worker in time, too often".into())
                .await;
        }
    }
}

async fn schedule(core: &Arc<Core>, eval: &Evaluation) -> Result<SchedulerOutput, ServerError> {
    let c = core.clone();
    let ev = eval.clone();
    tokio::task::spawn_blocking(move || {
        let st = c.read();
        scheduler::schedule(&*st, &ev, c.settings())
    })
    .await
    .map_err(|e| ServerError::Unavailable(format!("the scheduler failed: {e}")))
}

pub(crate) async fn process(core: &Arc<Core>, eval: &Evaluation) -> Result<(), ServerError> {
    // Canceled or finished meanwhile (a newer evaluation superseded it): nothing to do.
    if let Some(current) = core.read().eval(&eval.id)
        && current.status != EvalStatus::Pending
    {
        return Ok(());
    }
    for _ in 0..MAX_PLAN_ATTEMPTS {
        let out = schedule(core, eval).await?;
        let finish = EvalFinish {
            eval: eval.clone(),
            failed_tg_allocs: out.failed_tg_allocs,
            queued_allocations: out.queued_allocations,
            follow_up_at: out.follow_up_at,
        };
        if out.plan.is_empty() {
            core.commit(|st, index, now| {
                let mut b = Batch::default();
                finish_eval(st, &finish, index, now, &mut b);
                Ok((b, ()))
            })
            .await?;
            return Ok(());
        }
        let r = core.submit_plan(out.plan, Some(finish)).await?;
        if r.fully_committed() {
            return Ok(());
        }
        tracing::debug!(eval = %eval.id, refused = r.refused, stale = r.stale_job, "plan partly refused; planning again");
    }
    core.commit(|st, index, now| {
        let mut b = Batch::default();
        let current = st.eval(&eval.id).unwrap_or(eval);
        let mut failed = set_eval_status(
            current,
            EvalStatus::Failed,
            format!("plan refused {MAX_PLAN_ATTEMPTS} times; retried by a follow-up evaluation"),
            index,
            now,
        );
        if let Some(job) = scheduler::StateView::job(st, &eval.job_name) {
            let mut next = new_eval(job, EvalTrigger::MaxPlanAttempts, index, now);
            next.previous_eval = Some(eval.id.clone());
            failed.status_description = format!(
                "plan refused {MAX_PLAN_ATTEMPTS} times; retried by evaluation {}",
                next.id
            );
            b.evals.push(next);
        }
        b.evals.push(failed);
        Ok((b, ()))
    })
    .await?;
    Ok(())
}
