//! The evaluation broker: pending evaluations in priority then creation order, at most
//! one in flight per job, at least once (ack / nack, redelivery after a timeout).
//! An evaluation with a `wait_until` in the future is held aside (it does not hold
//! its job back) until [`Broker::promote_due`] finds it due.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::state::{JobKey, job_id};
use drover_server_api::Evaluation;
use tokio::sync::Notify;

/// Why an ack or nack was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum BrokerError {
    /// The evaluation is not in flight with this token (it timed out and was handed to
    /// another worker, or was never dequeued).
    #[error("evaluation {0} is not in flight with this token")]
    NotInFlight(String),
}

/// What a nack did.
#[derive(Debug, PartialEq)]
pub(crate) enum Nacked {
    /// The evaluation will be delivered again.
    Redelivered,
    /// It was delivered `eval_delivery_limit` times: given up. The caller records it as
    /// `failed`.
    Failed(Box<Evaluation>),
}

#[derive(Debug, PartialEq, Eq)]
struct Ready {
    priority: u8,
    seq: Reverse<u64>,
    id: String,
}

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.priority, self.seq).cmp(&(other.priority, other.seq))
    }
}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

struct Unacked {
    token: String,
    deadline: Instant,
}

struct Known {
    eval: Evaluation,
    seq: u64,
    deliveries: u32,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    ready: BinaryHeap<Ready>,
    /// Evaluations of jobs that already have one ready or in flight.
    waiting: HashMap<JobKey, BinaryHeap<Ready>>,
    /// Jobs (namespace, name) with an evaluation ready or in flight.
    busy: HashSet<JobKey>,
    known: HashMap<String, Known>,
    inflight: HashMap<String, Unacked>,
    /// Evaluations waiting for their `wait_until`, by (due time, arrival).
    delayed: BTreeMap<(i64, u64), Evaluation>,
    delayed_ids: HashSet<String>,
}

/// The broker. Shared by the server core and its workers.
pub(crate) struct Broker {
    inner: Mutex<Inner>,
    notify: Notify,
    delivery_limit: u32,
    unack_timeout: Duration,
}

impl Broker {
    pub(crate) fn new(delivery_limit: u32, unack_timeout: Duration) -> Broker {
        Broker {
            inner: Mutex::new(Inner::default()),
            notify: Notify::new(),
            delivery_limit: delivery_limit.max(1),
            unack_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (every method
        // mutates after its checks), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a pending evaluation. An evaluation the broker already holds is ignored;
    /// one whose `wait_until` is later than `now` (unix nanoseconds) is held until
    /// [`Broker::promote_due`] is called at or after that time.
    pub(crate) fn enqueue_at(&self, eval: Evaluation, now: i64) {
        let mut g = self.lock();
        if g.known.contains_key(&eval.id) || g.delayed_ids.contains(&eval.id) {
            return;
        }
        g.seq += 1;
        if let Some(at) = eval.wait_until.filter(|at| *at > now) {
            let seq = g.seq;
            g.delayed_ids.insert(eval.id.clone());
            g.delayed.insert((at, seq), eval);
            return;
        }
        let seq = g.seq;
        let ready = Ready {
            priority: eval.priority,
            seq: Reverse(seq),
            id: eval.id.clone(),
        };
        let job = job_id(&eval.namespace, &eval.job_name);
        g.known.insert(
            eval.id.clone(),
            Known {
                eval,
                seq,
                deliveries: 0,
            },
        );
        if g.busy.contains(&job) {
            g.waiting.entry(job).or_default().push(ready);
        } else {
            g.busy.insert(job);
            g.ready.push(ready);
            drop(g);
            self.notify.notify_one();
        }
    }

    /// Add a pending evaluation (delayed if its `wait_until` is still to come).
    pub(crate) fn enqueue(&self, eval: Evaluation) {
        self.enqueue_at(eval, crate::state::evals::now_nanos());
    }

    /// Hand the delayed evaluations due at `now` (unix nanoseconds) to the workers;
    /// how many.
    pub(crate) fn promote_due(&self, now: i64) -> usize {
        let due: Vec<Evaluation> = {
            let mut g = self.lock();
            let later = g.delayed.split_off(&(now.saturating_add(1), 0));
            let due = std::mem::replace(&mut g.delayed, later);
            for e in due.values() {
                g.delayed_ids.remove(&e.id);
            }
            due.into_values().collect()
        };
        let n = due.len();
        for e in due {
            self.enqueue_at(e, now);
        }
        n
    }

    /// Evaluations waiting for their `wait_until`.
    pub(crate) fn delayed_len(&self) -> usize {
        self.lock().delayed.len()
    }

    fn try_dequeue(&self) -> Option<(Evaluation, String)> {
        let mut g = self.lock();
        let ready = g.ready.pop()?;
        let token = uuid::Uuid::new_v4().to_string();
        let known = g.known.get_mut(&ready.id)?;
        known.deliveries += 1;
        let eval = known.eval.clone();
        g.inflight.insert(
            ready.id,
            Unacked {
                token: token.clone(),
                deadline: Instant::now() + self.unack_timeout,
            },
        );
        let more = !g.ready.is_empty();
        drop(g);
        if more {
            // Another worker may be waiting for the next one.
            self.notify.notify_one();
        }
        Some((eval, token))
    }

    /// The next evaluation and its delivery token, waiting for one.
    pub(crate) async fn dequeue(&self) -> (Evaluation, String) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self.try_dequeue() {
                return e;
            }
            notified.await;
        }
    }

    /// The evaluation was handled: forget it, and let the job's next one go.
    pub(crate) fn ack(&self, id: &str, token: &str) -> Result<(), BrokerError> {
        let mut g = self.lock();
        check_token(&g, id, token)?;
        g.inflight.remove(id);
        if let Some(k) = g.known.remove(id) {
            self.release_job(&mut g, &job_id(&k.eval.namespace, &k.eval.job_name));
        }
        Ok(())
    }

    /// The evaluation could not be handled: deliver it again, or give up after the
    /// delivery limit.
    pub(crate) fn nack(&self, id: &str, token: &str) -> Result<Nacked, BrokerError> {
        let mut g = self.lock();
        check_token(&g, id, token)?;
        g.inflight.remove(id);
        Ok(self.redeliver_or_fail(&mut g, id))
    }

    fn redeliver_or_fail(&self, g: &mut Inner, id: &str) -> Nacked {
        let Some(k) = g.known.get(id) else {
            return Nacked::Redelivered;
        };
        if k.deliveries >= self.delivery_limit {
            let k = g.known.remove(id).map(|k| k.eval);
            match k {
                Some(eval) => {
                    self.release_job(g, &job_id(&eval.namespace, &eval.job_name));
                    Nacked::Failed(Box::new(eval))
                }
                None => Nacked::Redelivered,
            }
        } else {
            g.ready.push(Ready {
                priority: k.eval.priority,
                seq: Reverse(k.seq),
                id: id.to_owned(),
            });
            self.notify.notify_one();
            Nacked::Redelivered
        }
    }

    fn release_job(&self, g: &mut Inner, job: &JobKey) {
        let next = g.waiting.get_mut(job).and_then(BinaryHeap::pop);
        if g.waiting.get(job).is_some_and(BinaryHeap::is_empty) {
            g.waiting.remove(job);
        }
        match next {
            Some(r) => {
                g.ready.push(r);
                self.notify.notify_one();
            }
            None => {
                g.busy.remove(job);
            }
        }
    }

    /// Redeliver evaluations whose worker did not answer within the unack timeout;
    /// those past the delivery limit are returned (to be recorded as failed).
    pub(crate) fn expire(&self, now: Instant) -> Vec<Evaluation> {
        let mut g = self.lock();
        let expired: Vec<String> = g
            .inflight
            .iter()
            .filter(|(_, u)| u.deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let mut failed = Vec::new();
        for id in expired {
            g.inflight.remove(&id);
            tracing::warn!(eval = %id, "evaluation not acknowledged in time; redelivering");
            if let Nacked::Failed(e) = self.redeliver_or_fail(&mut g, &id) {
                failed.push(*e);
            }
        }
        failed
    }

    /// How often [`Broker::expire`] should run.
    pub(crate) fn expire_period(&self) -> Duration {
        (self.unack_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Evaluations waiting for a worker (ready, or behind another of their job) and
    /// evaluations a worker holds unacknowledged (the metrics' gauges).
    pub(crate) fn ready_and_unacked(&self) -> (usize, usize) {
        let g = self.lock();
        let unacked = g.inflight.len();
        (g.known.len().saturating_sub(unacked), unacked)
    }

    /// Evaluations held (ready, waiting or in flight).
    pub(crate) fn len(&self) -> usize {
        self.lock().known.len()
    }
}

fn check_token(g: &Inner, id: &str, token: &str) -> Result<(), BrokerError> {
    match g.inflight.get(id) {
        Some(u) if u.token == token => Ok(()),
        _ => Err(BrokerError::NotInFlight(id.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_server_api::{EvalStatus, EvalTrigger, JobType};

    fn eval(id: &str, job: &str, priority: u8) -> Evaluation {
        Evaluation {
            namespace: "default".into(),
            wait_until: None,
            id: id.into(),
            job_name: job.into(),
            job_type: JobType::Service,
            priority,
            triggered_by: EvalTrigger::JobRegister,
            status: EvalStatus::Pending,
            status_description: String::new(),
            node_id: None,
            failed_tg_allocs: Default::default(),
            queued_allocations: Default::default(),
            blocked_eval: None,
            previous_eval: None,
            job_modify_index: 1,
            create_index: 1,
            modify_index: 1,
            create_time: 0,
            modify_time: 0,
        }
    }

    #[test]
    fn priority_then_fifo_and_one_in_flight_per_job() {
        let b = Broker::new(3, Duration::from_secs(60));
        b.enqueue(eval("a1", "a", 50));
        b.enqueue(eval("a2", "a", 90));
        b.enqueue(eval("b1", "b", 50));
        b.enqueue(eval("c1", "c", 70));
        let (e, t_c) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "c1", "highest priority first");
        let (e, t_a) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "a1", "same priority: first enqueued first");
        let (e, t_b) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "b1");
        assert!(
            b.try_dequeue().is_none(),
            "a2 waits while a1 of the same job is in flight"
        );
        b.ack("a1", &t_a).unwrap();
        let (e, _) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "a2", "job a's next evaluation goes once a1 is acked");
        b.ack("b1", &t_b).unwrap();
        b.ack("c1", &t_c).unwrap();
        assert_eq!(
            b.ack("c1", &t_c),
            Err(BrokerError::NotInFlight("c1".into()))
        );
    }

    #[test]
    fn nack_redelivers_until_the_limit_then_fails() {
        let b = Broker::new(2, Duration::from_secs(60));
        b.enqueue(eval("a1", "a", 50));
        b.enqueue(eval("a2", "a", 50));
        let (_, t) = b.try_dequeue().unwrap();
        assert_eq!(b.nack("a1", &t).unwrap(), Nacked::Redelivered);
        let (e, t) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "a1", "redelivered before the job's next evaluation");
        match b.nack("a1", &t).unwrap() {
            Nacked::Failed(e) => assert_eq!(e.id, "a1"),
            other => panic!("expected failed after 2 deliveries, got {other:?}"),
        }
        let (e, _) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "a2", "a failed evaluation releases its job");
    }

    #[test]
    fn unacked_evaluations_are_redelivered_and_the_stale_token_is_refused() {
        let b = Broker::new(2, Duration::from_millis(10));
        b.enqueue(eval("a1", "a", 50));
        let (_, t1) = b.try_dequeue().unwrap();
        assert!(b.expire(Instant::now()).is_empty(), "not yet expired");
        let later = Instant::now() + Duration::from_millis(20);
        assert!(b.expire(later).is_empty(), "redelivered, not failed");
        let (e, t2) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "a1");
        assert!(
            b.ack("a1", &t1).is_err(),
            "the first worker's token is stale"
        );
        let failed = b.expire(Instant::now() + Duration::from_millis(40));
        assert_eq!(failed.len(), 1, "second timeout reaches the limit of 2");
        assert!(b.ack("a1", &t2).is_err());
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn delayed_evaluations_wait_for_their_time_without_holding_the_job() {
        let b = Broker::new(3, Duration::from_secs(60));
        let mut later = eval("later", "a", 50);
        later.wait_until = Some(1_000);
        b.enqueue_at(later.clone(), 10);
        b.enqueue_at(later, 10);
        assert_eq!((b.len(), b.delayed_len()), (0, 1), "held aside once");
        assert!(b.try_dequeue().is_none(), "not handed out before its time");
        b.enqueue_at(eval("now", "a", 50), 10);
        let (e, t) = b.try_dequeue().unwrap();
        assert_eq!(
            e.id, "now",
            "a delayed evaluation does not hold its job back"
        );
        b.ack("now", &t).unwrap();
        assert_eq!(b.promote_due(999), 0);
        assert!(b.try_dequeue().is_none());
        assert_eq!(b.promote_due(1_000), 1);
        let (e, _) = b.try_dequeue().unwrap();
        assert_eq!(e.id, "later");
        assert_eq!(b.delayed_len(), 0);
    }

    #[tokio::test]
    async fn dequeue_waits_for_an_enqueue() {
        let b = std::sync::Arc::new(Broker::new(3, Duration::from_secs(60)));
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.dequeue().await.0.id });
        tokio::task::yield_now().await;
        b.enqueue(eval("x", "x", 50));
        let id = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("dequeue woke")
            .unwrap();
        assert_eq!(id, "x");
    }
}
