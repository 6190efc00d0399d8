//! What keeps the server's state bounded: failed allocations replaced after a delay
//! (not in a tight loop), delayed evaluations that survive a restart, garbage
//! collection of terminal allocations and down nodes, complete sets without the
//! allocations a node is done with, and job size caps. Real redb store in a temp dir.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use drover_server::ServerError;
use drover_server_api::{
    AllocClientUpdate, Allocation, ClientStatus, EvalStatus, EvalTrigger, Evaluation, JobSpec,
    ReschedulePolicy,
};
use drover_test_support::until;

const LIMIT: Duration = Duration::from_secs(20);

fn upd(id: &str, status: ClientStatus) -> AllocClientUpdate {
    AllocClientUpdate {
        healthy: Default::default(),
        id: id.into(),
        client_status: status,
        client_description: String::new(),
        task_states: Default::default(),
        services: None,
    }
}

/// A service job of one copy whose failures are replaced after `delay`, doubling up
/// to `max_delay`.
fn failing_job(delay: Duration, max_delay: Duration) -> JobSpec {
    let mut j = job("flaky", 1, 100, 100);
    j.groups[0].reschedule = Some(ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay,
        max_delay,
        unlimited: true,
    });
    j
}

/// A server with one scheduler worker (the real scheduler places and replaces).
fn scheduling(dir: &std::path::Path) -> drover_server::ServerConfig {
    let mut c = config(dir);
    c.workers = 1;
    c
}

fn live(s: &Running, job: &str) -> Vec<Allocation> {
    s.server
        .job_allocations("default", job)
        .into_iter()
        .filter(|a| !a.is_terminal())
        .collect()
}

/// The one live allocation of `job`, once placed.
async fn the_live_one(s: &Running, job: &str) -> Allocation {
    until(LIMIT, "an allocation placed", || live(s, job).len() == 1).await;
    live(s, job).remove(0)
}

/// Report `id` failed; the alloc-failure evaluation it makes, once a worker finished
/// it.
async fn fail(s: &Running, node: &str, id: &str) -> Evaluation {
    s.server
        .update_allocations(node, vec![upd(id, ClientStatus::Failed)])
        .await
        .unwrap();
    let failed_at = s.server.allocation(id).unwrap().modify_index;
    let eval = || {
        s.server
            .job_evaluations("default", "flaky")
            .into_iter()
            .find(|e| {
                e.triggered_by == EvalTrigger::AllocFailure
                    && e.create_index == failed_at
                    && e.wait_until.is_none()
            })
    };
    until(LIMIT, "the alloc-failure evaluation done", || {
        eval().is_some_and(|e| e.status == EvalStatus::Complete)
    })
    .await;
    eval().unwrap()
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap()
}

/// The delayed follow-up evaluation of `after`.
fn follow_up(s: &Running, after: &Evaluation) -> Option<Evaluation> {
    s.server
        .job_evaluations("default", "flaky")
        .into_iter()
        .find(|e| e.previous_eval.as_deref() == Some(after.id.as_str()) && e.wait_until.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_service_allocation_is_replaced_after_a_delay_that_grows() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(scheduling(dir.path())).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    let delay = Duration::from_secs(1);
    s.server
        .register_job(failing_job(delay, Duration::from_secs(8)))
        .await
        .unwrap();
    let first = the_live_one(&s, "flaky").await;

    // It fails: evaluated at once, but not replaced before its delay.
    let eval = fail(&s, "n1", &first.id).await;
    let failed = s.server.allocation(&first.id).unwrap();
    assert!(
        live(&s, "flaky").is_empty(),
        "replaced before the delay: {:?}",
        live(&s, "flaky")
    );
    let next = follow_up(&s, &eval).expect("a follow-up evaluation");
    assert_eq!(next.status, EvalStatus::Pending);
    assert_eq!(next.wait_until, Some(failed.modify_time + nanos(delay)));

    let second = the_live_one(&s, "flaky").await;
    assert_eq!(
        second.previous_allocation.as_deref(),
        Some(first.id.as_str())
    );
    assert!(
        second.create_time >= failed.modify_time + nanos(delay),
        "replaced {}ms after the failure, before its delay of 1s",
        (second.create_time - failed.modify_time) / 1_000_000
    );
    assert_eq!(second.reschedule_events.len(), 1);
    assert_eq!(second.reschedule_events[0].delay, delay);
    assert_eq!(
        s.server.allocation(&first.id).unwrap().next_allocation,
        Some(second.id.clone())
    );

    // The replacement fails too: twice the delay this time.
    let eval = fail(&s, "n1", &second.id).await;
    let failed = s.server.allocation(&second.id).unwrap();
    let next = follow_up(&s, &eval).expect("a second follow-up");
    assert_eq!(next.wait_until, Some(failed.modify_time + nanos(2 * delay)));
    assert!(live(&s, "flaky").is_empty());
    let third = the_live_one(&s, "flaky").await;
    assert!(third.create_time >= failed.modify_time + nanos(2 * delay));
    assert_eq!(third.reschedule_events[0].delay, 2 * delay);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_evaluation_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let delay = Duration::from_secs(3);
    let (failed, wait_until) = {
        let s = start(scheduling(dir.path())).await;
        s.server
            .register_node(node("n1", 4000, 4000), SECRET)
            .await
            .unwrap();
        s.server
            .register_job(failing_job(delay, delay))
            .await
            .unwrap();
        let first = the_live_one(&s, "flaky").await;
        let eval = fail(&s, "n1", &first.id).await;
        let next = follow_up(&s, &eval).expect("a follow-up evaluation");
        assert_eq!(s.server.stats().delayed_evaluations, 1);
        s.stop().await;
        (first, next.wait_until.unwrap())
    };
    let s = start(scheduling(dir.path())).await;
    assert_eq!(
        s.server.stats().delayed_evaluations,
        1,
        "the follow-up is loaded and waits again"
    );
    // The node must still be ready for the placement (a restarted server gives it a
    // fresh TTL; heartbeat it meanwhile).
    let replacement = async {
        loop {
            let _ = s.server.heartbeat("n1").await;
            if let Some(a) = live(&s, "flaky").pop() {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let second = tokio::time::timeout(LIMIT, replacement)
        .await
        .expect("replaced after the restart");
    assert_eq!(
        second.previous_allocation.as_deref(),
        Some(failed.id.as_str())
    );
    assert!(
        second.create_time >= wait_until,
        "replaced before the delayed evaluation was due"
    );
    assert_eq!(s.server.stats().delayed_evaluations, 0);
    s.stop().await;
}

/// A server without workers (plans by hand) whose garbage collection runs every 20ms.
fn collecting(dir: &std::path::Path, alloc_age: Duration) -> drover_server::ServerConfig {
    let mut c = config(dir);
    c.gc_interval = Duration::from_millis(20);
    c.alloc_gc_threshold = alloc_age;
    c
}

/// Place `n` copies of `job` on n1 by hand; their ids.
async fn place(s: &Running, job: &str, n: u32) -> Vec<String> {
    let allocs = (0..n).map(|i| ("n1", placement(job, i, 10, 10))).collect();
    let r = s
        .server
        .apply_plan(plan(&s.server, job, allocs))
        .await
        .unwrap();
    assert_eq!(r.placed, n as usize);
    let mut allocs = s.server.job_allocations("default", job);
    allocs.sort_by_key(|a| a.index);
    allocs.into_iter().map(|a| a.id).collect()
}

async fn stop_allocs(s: &Running, job: &str, ids: &[String]) {
    let mut p = plan(&s.server, job, vec![]);
    p.node_update
        .insert("n1".into(), ids.iter().map(|id| stop(id)).collect());
    s.server.apply_plan(p).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_terminal_allocations_are_deleted_and_never_one_the_client_may_run() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(collecting(dir.path(), Duration::from_millis(300))).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("web", 4, 10, 10)).await.unwrap();
    // Index 4 is beyond the count: nothing will replace it once it failed.
    let ids = place(&s, "web", 5).await;
    let (done, stopping, running, failed, beyond) = (&ids[0], &ids[1], &ids[2], &ids[3], &ids[4]);
    // Stopped by the server: one the client says ended, one it still runs.
    stop_allocs(&s, "web", &[done.clone(), stopping.clone()]).await;
    s.server
        .update_allocations(
            "n1",
            vec![
                upd(stopping, ClientStatus::Running),
                upd(running, ClientStatus::Running),
                upd(failed, ClientStatus::Failed),
                upd(beyond, ClientStatus::Failed),
            ],
        )
        .await
        .unwrap();
    s.server
        .update_allocations("n1", vec![upd(done, ClientStatus::Complete)])
        .await
        .unwrap();
    // The newest change is `done`'s: once it is gone, the others were old enough too.
    until(LIMIT, "the stopped and ended allocation deleted", || {
        s.server.allocation(done).is_none()
    })
    .await;
    assert!(
        s.server.allocation(stopping).is_some(),
        "stopped on the server, still running on its client: kept"
    );
    assert!(s.server.allocation(running).is_some());
    assert!(
        s.server.allocation(failed).is_some(),
        "failed, waiting for its replacement: kept"
    );
    assert!(
        s.server.allocation(beyond).is_none(),
        "failed beyond the count: deleted"
    );
    assert_eq!(s.server.allocations().len(), 3);
    s.stop().await;

    // Deleted from the store too, not only from memory.
    let s = start(collecting(dir.path(), Duration::from_secs(3600))).await;
    assert!(s.server.allocation(done).is_none());
    assert_eq!(s.server.allocations().len(), 3);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_allocations_beyond_twice_the_count_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(collecting(dir.path(), Duration::from_secs(3600))).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    // Count 1: 2 × 1 is below the floor of 10 kept.
    s.server.register_job(job("web", 1, 10, 10)).await.unwrap();
    let ids = place(&s, "web", 14).await;
    stop_allocs(&s, "web", &ids[..13]).await;
    s.server
        .update_allocations(
            "n1",
            ids[..13]
                .iter()
                .map(|id| upd(id, ClientStatus::Complete))
                .collect(),
        )
        .await
        .unwrap();
    until(LIMIT, "the job's terminal allocations capped", || {
        s.server.job_allocations("default", "web").len() == 11
    })
    .await;
    assert!(
        s.server.allocation(&ids[13]).is_some(),
        "the live one is never counted against the cap"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_jobs_allocations_are_deleted_once_terminal() {
    let dir = tempfile::tempdir().unwrap();
    // Retention of an hour: what goes here goes because the job was purged.
    let s = start(collecting(dir.path(), Duration::from_secs(3600))).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("gone", 2, 10, 10)).await.unwrap();
    let ids = place(&s, "gone", 2).await;
    s.server
        .update_allocations(
            "n1",
            vec![
                upd(&ids[0], ClientStatus::Complete),
                upd(&ids[1], ClientStatus::Running),
            ],
        )
        .await
        .unwrap();
    s.server.stop_job("default", "gone", true).await.unwrap();
    assert!(
        s.server.allocation(&ids[0]).is_none(),
        "deleted with the purge"
    );
    assert!(
        s.server.allocation(&ids[1]).is_some(),
        "still running on its client: kept"
    );
    // Collection passes run meanwhile; it stays until its client says it ended.
    let at = s.server.index();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(s.server.allocation(&ids[1]).is_some());
    assert_eq!(
        s.server.index(),
        at,
        "nothing to collect, nothing committed"
    );
    s.server
        .update_allocations("n1", vec![upd(&ids[1], ClientStatus::Complete)])
        .await
        .unwrap();
    until(LIMIT, "the purged job's last allocation deleted", || {
        s.server.allocation(&ids[1]).is_none()
    })
    .await;
    assert!(s.server.allocations().is_empty());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_down_node_without_allocations_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = collecting(dir.path(), Duration::from_secs(3600));
    // Down 2 s after registering: n2, the job and the placement (three fsync'd
    // commits) must land on n1 before it is down, also on a loaded disk.
    cfg.heartbeat_ttl = Duration::from_secs(1);
    cfg.heartbeat_grace = Duration::from_secs(1);
    cfg.node_gc_threshold = Duration::from_millis(200);
    let s = start(cfg).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server
        .register_node(node("n2", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("web", 1, 10, 10)).await.unwrap();
    place(&s, "web", 1).await;
    // Neither heartbeats: both go down; n1 keeps its (lost) allocation.
    until(LIMIT, "n2 deleted", || s.server.node("n2").is_err()).await;
    let n1 = s.server.node("n1").expect("n1 still has an allocation");
    assert_eq!(n1.status, drover_server_api::NodeStatus::Down);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_set_holds_only_what_the_node_must_act_on() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(collecting(dir.path(), Duration::from_secs(3600))).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("web", 4, 10, 10)).await.unwrap();
    let ids = place(&s, "web", 4).await;
    let (done, stopping, running, failed) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    stop_allocs(&s, "web", &[done.clone(), stopping.clone()]).await;
    s.server
        .update_allocations(
            "n1",
            vec![
                upd(done, ClientStatus::Complete),
                upd(stopping, ClientStatus::Running),
                upd(running, ClientStatus::Running),
                upd(failed, ClientStatus::Failed),
            ],
        )
        .await
        .unwrap();
    let set = s
        .server
        .allocations_for_client("n1", 0, Duration::ZERO)
        .await
        .unwrap();
    assert!(set.complete);
    let mut sent: Vec<&str> = set
        .allocations
        .iter()
        .map(|a| a.alloc.id.as_str())
        .collect();
    sent.sort();
    let mut want = vec![stopping.as_str(), running.as_str()];
    want.sort();
    assert_eq!(
        sent, want,
        "the stopped-but-running one and the running one; not those the client ended"
    );
    // All four are still on the server (retention of an hour).
    assert_eq!(s.server.allocations().len(), 4);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_jobs_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let mut big = job("big", 1, 10, 10);
    big.groups[0].tasks[0].env = (0..300)
        .map(|i| (format!("V{i}"), "x".into()))
        .collect::<BTreeMap<_, _>>();
    match s.server.register_job(big.clone()).await {
        Err(ServerError::Invalid(m)) => {
            assert_eq!(m, "group[0].task[0].env: 300 entries, at most 256")
        }
        other => panic!("expected invalid, got {other:?}"),
    }
    match s.server.plan_job(big).await {
        Err(ServerError::Invalid(m)) => assert!(m.starts_with("group[0].task[0].env"), "{m}"),
        other => panic!("expected invalid, got {other:?}"),
    }
    let mut many = job("many", 1, 10, 10);
    let g = many.groups[0].clone();
    many.groups = (0..3)
        .map(|i| {
            let mut g = g.clone();
            g.name = format!("g{i}");
            g.count = 5000;
            g
        })
        .collect();
    match s.server.register_job(many).await {
        Err(ServerError::Invalid(m)) => assert!(m.starts_with("group.count: "), "{m}"),
        other => panic!("expected invalid, got {other:?}"),
    }
    assert!(s.server.jobs().is_empty());
    s.stop().await;
}
