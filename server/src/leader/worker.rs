//! Scheduler workers: dequeue an evaluation, run the scheduler on the shared state
//! (under its read lock, for the duration of one `schedule` call), submit the plan to
//! the applier, write the evaluation's result, ack.

use std::sync::Arc;
use std::time::Instant;

use drover_server_api::{EvalStatus, EvalTrigger, Evaluation};

use crate::error::ServerError;
use crate::leader::broker::Nacked;
use crate::leader::plan_apply::{EvalFinish, finish_eval};
use crate::leader::term::LeaderTerm;
use crate::scheduler::{self, SchedulerOutput};
use crate::state::Batch;
use crate::state::evals::{new_eval, set_eval_status};
use tokio_util::sync::CancellationToken;

/// Plans submitted for one evaluation before it is given up with a `max-plan-attempts`
/// follow-up evaluation.
pub(crate) const MAX_PLAN_ATTEMPTS: u32 = 5;

pub(crate) async fn run(term: Arc<LeaderTerm>, worker: usize, stop: CancellationToken) {
    loop {
        let (eval, token) = tokio::select! {
            _ = stop.cancelled() => return,
            e = term.broker.dequeue() => e,
        };
        let r = process(&term, &eval).await;
        let outcome = |outcome| {
            term.core
                .metrics
                .evaluations
                .get_or_create(&crate::metrics::OutcomeLabel { outcome })
                .inc();
        };
        match r {
            Ok(()) => {
                outcome("acked");
                if let Err(e) = term.broker.ack(&eval.id, &token) {
                    tracing::warn!(worker, eval = %eval.id, "ack: {e}");
                }
            }
            Err(e) => {
                tracing::warn!(worker, eval = %eval.id, job = %eval.job_name, "evaluation failed: {e}");
                match term.broker.nack(&eval.id, &token) {
                    Ok(Nacked::Redelivered) => outcome("nacked"),
                    Ok(Nacked::Failed(ev)) => {
                        outcome("failed");
                        term.fail_eval(
                            &ev,
                            format!(
                                "gave up after {} deliveries: {e}",
                                term.core.config.eval_delivery_limit
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
pub(crate) async fn run_expiry(term: Arc<LeaderTerm>, stop: CancellationToken) {
    let period = term.broker.expire_period();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        term.broker.promote_due(crate::state::evals::now_nanos());
        for e in term.broker.expire(Instant::now()) {
            term.fail_eval(&e, "not acknowledged by a worker in time, too often".into())
                .await;
        }
    }
}

async fn schedule(
    term: &Arc<LeaderTerm>,
    eval: &Evaluation,
) -> Result<SchedulerOutput, ServerError> {
    let c = term.clone();
    let ev = eval.clone();
    let out = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let out = {
            let st = c.core.read();
            scheduler::schedule(&*st, &ev, c.core.settings())
        };
        let m = &c.core.metrics;
        m.scheduler_duration
            .observe(started.elapsed().as_secs_f64());
        let unplaced: u64 = out
            .failed_tg_allocs
            .values()
            .map(|f| u64::from(f.unplaced))
            .sum();
        m.placement_failures.inc_by(unplaced);
        out
    })
    .await
    .map_err(|e| ServerError::Unavailable(format!("the scheduler failed: {e}")))?;
    Ok(out)
}

pub(crate) async fn process(term: &Arc<LeaderTerm>, eval: &Evaluation) -> Result<(), ServerError> {
    // Canceled or finished meanwhile (a newer evaluation superseded it): nothing to do.
    if let Some(current) = term.core.read().eval(&eval.id)
        && current.status != EvalStatus::Pending
    {
        return Ok(());
    }
    for _ in 0..MAX_PLAN_ATTEMPTS {
        let out = schedule(term, eval).await?;
        let finish = EvalFinish {
            eval: eval.clone(),
            failed_tg_allocs: out.failed_tg_allocs,
            queued_allocations: out.queued_allocations,
            follow_up_at: out.follow_up_at,
        };
        if out.plan.is_empty() {
            term.commit(|st, index, now| {
                let mut b = Batch::default();
                finish_eval(st, &finish, index, now, &mut b);
                Ok((b, ()))
            })
            .await?;
            return Ok(());
        }
        let r = term.submit_plan(out.plan, Some(finish)).await?;
        if r.fully_committed() {
            return Ok(());
        }
        tracing::debug!(eval = %eval.id, refused = r.refused, stale = r.stale_job, "plan partly refused; planning again");
    }
    term.commit(|st, index, now| {
        let mut b = Batch::default();
        let current = st.eval(&eval.id).unwrap_or(eval);
        let mut failed = set_eval_status(
            current,
            EvalStatus::Failed,
            format!("plan refused {MAX_PLAN_ATTEMPTS} times; retried by a follow-up evaluation"),
            index,
            now,
        );
        if let Some(job) = st.job_in(&eval.namespace, &eval.job_name) {
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
