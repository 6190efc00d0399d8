//! The server core on a real redb store: durability, the plan applier, heartbeats and
//! node state, blocking queries, client updates, jobs and versions.
//!
//! Plans are built by hand here (the scheduler is tested on its own); tests that run
//! the real scheduler's workers to place allocations say so in their name.

use std::time::{Duration, Instant};

use crate::common::*;
use drover_server_api::{
    AllocClientUpdate, ClientStatus, DesiredStatus, EvalStatus, EvalTrigger, JobStatus, NodeStatus,
};
use drover_test_support::{until, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_pending_evaluations_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path()); // no workers: the evaluation stays pending
    let s = start(cfg.clone()).await;
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    let reg = s.server.register_job(job("web", 2, 100, 64)).await.unwrap();
    let p = plan(
        &s.server,
        "web",
        vec![
            ("n1", placement("web", 0, 100, 64)),
            ("n1", placement("web", 1, 100, 64)),
        ],
    );
    let r = s.server.apply_plan(p).await.unwrap();
    assert_eq!(r.placed, 2);
    let index = s.server.index();
    let allocs = s.server.job_allocations("default", "web");
    s.stop().await;

    let s = start(cfg.clone()).await;
    assert_eq!(s.server.index(), index, "index restored from the store");
    let n = s.server.node("n1").expect("node kept");
    assert_eq!(n.status, NodeStatus::Ready);
    assert_eq!(
        s.server.job_allocations("default", "web"),
        allocs,
        "allocations identical"
    );
    let j = s.server.job("default", "web").unwrap();
    assert_eq!((j.version, j.status), (0, JobStatus::Running));
    let e = s.server.evaluation(&reg.eval_id).expect("evaluation kept");
    assert_eq!(e.status, EvalStatus::Pending);
    assert_eq!(
        s.server.stats().evaluations_in_broker,
        1,
        "re-enqueued at start"
    );
    s.stop().await;

    // With a worker, the pending evaluation is processed after the restart.
    cfg.workers = 1;
    let s = start(cfg).await;
    let id = reg.eval_id.clone();
    let srv = s.server.clone();
    until(
        LONG,
        "the pending evaluation completes after a restart",
        || {
            srv.evaluation(&id)
                .is_some_and(|e| e.status == EvalStatus::Complete)
        },
    )
    .await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applier_commits_only_what_still_fits() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server
        .register_node(node("n2", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("a", 5, 300, 100)).await.unwrap();

    // Two plans made on the same snapshot, both wanting n1's capacity.
    let first = plan(
        &s.server,
        "a",
        vec![
            ("n1", placement("a", 0, 300, 100)),
            ("n1", placement("a", 1, 300, 100)),
        ],
    );
    let second = plan(
        &s.server,
        "a",
        vec![
            ("n1", placement("a", 2, 300, 100)),
            ("n1", placement("a", 3, 300, 100)),
            ("n2", placement("a", 4, 300, 100)),
        ],
    );
    let r1 = s.server.apply_plan(first).await.unwrap();
    assert_eq!((r1.placed, r1.refused), (2, 0));
    assert!(r1.fully_committed());
    let r2 = s.server.apply_plan(second).await.unwrap();
    assert_eq!(
        (r2.placed, r2.refused),
        (2, 1),
        "one more fits on n1 (900 of 1000 cpu) and n2 is free"
    );
    assert!(r2.refused_nodes["n1"].contains("cpu exhausted"), "{r2:?}");
    let on_n1 = s.server.node_allocations("n1");
    assert_eq!(on_n1.len(), 3);
    let cpu: u64 = on_n1.iter().map(|a| a.resources.cpu).sum();
    assert!(cpu <= 1000, "never more than the node has: {cpu}");

    // Submitted at the same time, the plans are still checked against each other.
    s.server
        .register_node(node("n3", 1000, 1000), SECRET)
        .await
        .unwrap();
    let mk = |i| plan(&s.server, "a", vec![("n3", placement("a", i, 400, 100))]);
    let (x, y, z) = tokio::join!(
        s.server.apply_plan(mk(10)),
        s.server.apply_plan(mk(11)),
        s.server.apply_plan(mk(12))
    );
    let placed: usize = [x, y, z].into_iter().map(|r| r.unwrap().placed).sum();
    assert_eq!(placed, 2, "two of three 400-cpu allocations fit in 1000");
    assert_eq!(s.server.node_allocations("n3").len(), 2);

    // Stopping allocations frees their capacity for the same plan.
    let victim = s.server.node_allocations("n3")[0].id.clone();
    let mut p = plan(&s.server, "a", vec![("n3", placement("a", 13, 400, 100))]);
    p.node_update.insert("n3".into(), vec![stop(&victim)]);
    let r = s.server.apply_plan(p).await.unwrap();
    assert_eq!((r.placed, r.stopped, r.refused), (1, 1, 0), "{r:?}");
    let v = s.server.allocation(&victim).unwrap();
    assert_eq!(v.desired_status, DesiredStatus::Stop);
    assert_eq!(v.alloc_modify_index, r.index, "the client sees the stop");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applier_refuses_plans_for_an_old_spec_and_nodes_that_cannot_take_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server
        .register_node(node("n2", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("a", 1, 100, 100)).await.unwrap();
    let old = plan(&s.server, "a", vec![("n1", placement("a", 0, 100, 100))]);
    s.server.register_job(job("a", 1, 200, 100)).await.unwrap();
    let r = s.server.apply_plan(old).await.unwrap();
    assert!(r.stale_job && r.placed == 0, "{r:?}");

    s.server.drain_node("name-n2", true).await.unwrap();
    assert_eq!(s.server.node("n2").unwrap().status, NodeStatus::Draining);
    let p = plan(
        &s.server,
        "a",
        vec![
            ("n2", placement("a", 0, 200, 100)),
            ("gone", placement("a", 1, 200, 100)),
        ],
    );
    let r = s.server.apply_plan(p).await.unwrap();
    assert_eq!((r.placed, r.refused), (0, 2));
    assert_eq!(r.refused_nodes["n2"], "node is draining");
    assert_eq!(r.refused_nodes["gone"], "node not found");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_down_after_ttl_plus_grace_and_its_allocations_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // 500 ms + 500 ms: the job and the plan (fsync'd commits) land well before n1 is
    // down, also on a loaded disk.
    cfg.heartbeat_ttl = Duration::from_millis(500);
    cfg.heartbeat_grace = Duration::from_millis(500);
    let s = start(cfg).await;
    // Taken before the call: n1's deadline is set inside it.
    let registered = Instant::now();
    let (ttl, _) = s
        .server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    assert_eq!(ttl, Duration::from_millis(500));
    s.server
        .register_node(node("n2", 1000, 1000), SECRET)
        .await
        .unwrap();
    // n2 heartbeats from its registration on, n1 is silent.
    let srv = s.server.clone();
    let beat = tokio::spawn(async move {
        loop {
            srv.heartbeat("n2").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    s.server
        .register_job(job("web", 2, 100, 100))
        .await
        .unwrap();
    let p = plan(
        &s.server,
        "web",
        vec![
            ("n1", placement("web", 0, 100, 100)),
            ("n2", placement("web", 1, 100, 100)),
        ],
    );
    s.server.apply_plan(p).await.unwrap();

    let srv = s.server.clone();
    until(LONG, "n1 is down", || {
        srv.node("n1").unwrap().status == NodeStatus::Down
    })
    .await;
    assert!(
        registered.elapsed() >= Duration::from_secs(1),
        "not down before TTL + grace: {:?}",
        registered.elapsed()
    );
    let n1 = s.server.node("n1").unwrap();
    assert_eq!(n1.status_description, "missed heartbeats for 1s");
    let lost = s.server.node_allocations("n1");
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].client_status, ClientStatus::Lost);
    assert_eq!(lost[0].desired_status, DesiredStatus::Stop);
    let evals = s.server.job_evaluations("default", "web");
    assert!(
        evals.iter().any(
            |e| e.triggered_by == EvalTrigger::NodeUpdate && e.node_id.as_deref() == Some("n1")
        ),
        "a node-update evaluation for the job: {evals:?}"
    );
    // The heartbeating node stays ready well past TTL + grace, its allocation running.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(s.server.node("n2").unwrap().status, NodeStatus::Ready);
    assert_eq!(
        s.server.node_allocations("n2")[0].desired_status,
        DesiredStatus::Run
    );
    beat.abort();

    // n1 comes back: ready again, and its lost allocation reaches it as a stop.
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    assert_eq!(s.server.node("n1").unwrap().status, NodeStatus::Ready);
    let set = s
        .server
        .allocations_for_client("n1", 0, Duration::ZERO)
        .await
        .unwrap();
    assert!(set.complete);
    assert_eq!(set.allocations.len(), 1);
    let a = &set.allocations[0].alloc;
    assert_eq!(
        (a.desired_status, a.client_status),
        (DesiredStatus::Stop, ClientStatus::Lost)
    );
    assert_eq!(set.allocations[0].group.name, "app", "with its group spec");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_nodes_get_the_failover_window_and_a_heartbeat_from_a_down_node_revives_it()
{
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.heartbeat_ttl = Duration::from_millis(300);
    cfg.heartbeat_grace = Duration::from_millis(300);
    // Longer than TTL + grace: after a restart, clients may still be in a reconnect
    // backoff; nodes are not down before this window ends.
    cfg.failover_heartbeat_ttl = Duration::from_millis(1200);
    let s = start(cfg.clone()).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.stop().await;
    // Down long enough that the old deadline has passed.
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Taken before the start: the failover window begins inside it.
    let started = Instant::now();
    let s = start(cfg).await;
    assert_eq!(
        s.server.node("n1").unwrap().status,
        NodeStatus::Ready,
        "not marked down at start"
    );
    let srv = s.server.clone();
    until(LONG, "n1 down after the failover window", || {
        srv.node("n1").unwrap().status == NodeStatus::Down
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1150),
        "{:?}",
        started.elapsed()
    );
    s.server.heartbeat("n1").await.unwrap();
    assert_eq!(s.server.node("n1").unwrap().status, NodeStatus::Ready);
    assert!(matches!(
        s.server.heartbeat("unknown").await,
        Err(drover_server::ServerError::NotFound(_))
    ));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_queries_wake_on_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server
        .register_node(node("n2", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("a", 1, 100, 100)).await.unwrap();
    let at = s.server.index();

    let srv = s.server.clone();
    let waiter = tokio::spawn(async move { srv.wait_for_index(at, Duration::from_secs(30)).await });
    let srv = s.server.clone();
    let client = tokio::spawn(async move {
        srv.allocations_for_client("n1", at, Duration::from_secs(30))
            .await
    });
    // A commit for another node wakes the index waiter but not n1's allocation stream.
    s.server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![("n2", placement("a", 0, 100, 100))],
        ))
        .await
        .unwrap();
    let woke = within(Duration::from_secs(5), "index wait wakes", waiter)
        .await
        .unwrap();
    assert!(woke > at);
    assert!(!client.is_finished(), "nothing changed for n1 yet");
    let r = s
        .server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![("n1", placement("a", 1, 100, 100))],
        ))
        .await
        .unwrap();
    let got = within(Duration::from_secs(5), "n1's stream wakes", client)
        .await
        .unwrap()
        .unwrap();
    assert!(!got.complete);
    assert_eq!(got.allocations.len(), 1);
    assert_eq!(got.allocations[0].alloc.alloc_modify_index, r.index);
    assert_eq!(got.index, r.index);

    // Nothing newer: returns after the wait, empty, not complete.
    let t = Instant::now();
    let none = s
        .server
        .allocations_for_client("n1", r.index, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(none.allocations.is_empty() && !none.complete);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_updates_are_checked_and_drive_evaluations_and_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server
        .register_node(node("n2", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("a", 2, 500, 100)).await.unwrap();
    s.server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![
                ("n1", placement("a", 0, 500, 100)),
                ("n1", placement("a", 1, 500, 100)),
            ],
        ))
        .await
        .unwrap();
    let ids: Vec<String> = s
        .server
        .node_allocations("n1")
        .into_iter()
        .map(|a| a.id)
        .collect();
    let upd = |id: &str, st| AllocClientUpdate {
        healthy: Default::default(),
        id: id.into(),
        client_status: st,
        client_description: String::new(),
        task_states: Default::default(),
        services: None,
    };
    let err = s
        .server
        .update_allocations("n2", vec![upd(&ids[0], ClientStatus::Running)])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("belongs to node n1"), "{err}");
    assert_eq!(
        s.server.allocation(&ids[0]).unwrap().client_status,
        ClientStatus::Pending,
        "a refused batch changes nothing"
    );

    let before = s.server.allocation(&ids[0]).unwrap().alloc_modify_index;
    s.server
        .update_allocations(
            "n1",
            vec![
                upd(&ids[0], ClientStatus::Running),
                upd(&ids[1], ClientStatus::Running),
            ],
        )
        .await
        .unwrap();
    let a = s.server.allocation(&ids[0]).unwrap();
    assert_eq!(a.client_status, ClientStatus::Running);
    assert_eq!(
        a.alloc_modify_index, before,
        "client updates do not move it"
    );
    // n1 is full: a third allocation does not fit ...
    let r = s
        .server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![("n1", placement("a", 2, 500, 100))],
        ))
        .await
        .unwrap();
    assert_eq!(r.placed, 0);
    // ... until one fails, which also asks for a replacement.
    s.server
        .update_allocations("n1", vec![upd(&ids[0], ClientStatus::Failed)])
        .await
        .unwrap();
    let evals = s.server.job_evaluations("default", "a");
    assert_eq!(evals[0].triggered_by, EvalTrigger::AllocFailure);
    let r = s
        .server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![("n1", placement("a", 2, 500, 100))],
        ))
        .await
        .unwrap();
    assert_eq!(r.placed, 1, "the failed allocation's capacity is free");
    // A failed allocation does not come back to running.
    s.server
        .update_allocations("n1", vec![upd(&ids[0], ClientStatus::Running)])
        .await
        .unwrap();
    assert_eq!(
        s.server.allocation(&ids[0]).unwrap().client_status,
        ClientStatus::Failed
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_versions_stop_and_purge() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let r0 = s.server.register_job(job("a", 1, 100, 100)).await.unwrap();
    let r1 = s.server.register_job(job("a", 1, 100, 100)).await.unwrap();
    assert_eq!(
        s.server.job("default", "a").unwrap().version,
        0,
        "unchanged spec: same version"
    );
    assert_ne!(r0.eval_id, r1.eval_id, "but a new evaluation");
    assert_eq!(r0.job_modify_index, r1.job_modify_index);
    assert_eq!(
        r1.warnings,
        ["no ready node has driver rawexec healthy"],
        "no node yet"
    );
    let r2 = s.server.register_job(job("a", 3, 100, 100)).await.unwrap();
    let j = s.server.job("default", "a").unwrap();
    assert_eq!(j.version, 1);
    assert_eq!(j.job_modify_index, r2.index);
    assert_eq!(j.status, JobStatus::Pending);

    let bad = s
        .server
        .register_job(job("bad name", 1, 1, 1))
        .await
        .unwrap_err();
    assert!(
        bad.to_string().contains("name: \"bad name\" contains ' '"),
        "{bad}"
    );

    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![("n1", placement("a", 0, 100, 100))],
        ))
        .await
        .unwrap();
    assert_eq!(
        s.server.job("default", "a").unwrap().status,
        JobStatus::Running
    );
    let stop = s.server.stop_job("default", "a", false).await.unwrap();
    let j = s.server.job("default", "a").unwrap();
    assert!(j.stop);
    let e = s.server.evaluation(&stop.eval_id).unwrap();
    assert_eq!(e.triggered_by, EvalTrigger::JobDeregister);
    // A plan made before the stop cannot place anything any more.
    let late = drover_server::scheduler::Plan {
        job_modify_index: r2.index,
        ..plan(&s.server, "a", vec![("n1", placement("a", 1, 100, 100))])
    };
    assert!(s.server.apply_plan(late).await.unwrap().stale_job);

    s.server.stop_job("default", "a", true).await.unwrap();
    assert!(s.server.job("default", "a").is_none(), "purged");
    assert_eq!(
        s.server.job_allocations("default", "a").len(),
        1,
        "allocations kept until terminal"
    );
    assert!(s.server.jobs().is_empty());
    assert!(matches!(
        s.server.stop_job("default", "a", false).await,
        Err(drover_server::ServerError::NotFound(_))
    ));
    s.stop().await;
}

/// With the scheduler's workers: a job no node can hold is blocked, and placed when a
/// node that can registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_scheduler_a_blocked_job_is_placed_when_a_big_enough_node_registers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.workers = 2;
    let s = start(cfg).await;
    s.server
        .register_node(node("small", 1000, 512), SECRET)
        .await
        .unwrap();
    s.server
        .register_job(job("big", 1, 100, 2048))
        .await
        .unwrap();
    let srv = s.server.clone();
    until(LONG, "a blocked evaluation with a memory reason", || {
        srv.job_evaluations("default", "big").iter().any(|e| {
            e.status == EvalStatus::Blocked
                && e.failed_tg_allocs
                    .get("app")
                    .is_some_and(|f| f.reason.contains("memory"))
        })
    })
    .await;
    s.server
        .register_node(node("large", 4000, 8192), SECRET)
        .await
        .unwrap();
    let srv = s.server.clone();
    until(LONG, "the job placed on the new node", || {
        srv.job_allocations("default", "big")
            .iter()
            .any(|a| a.node_id == "large" && a.desired_status == DesiredStatus::Run)
    })
    .await;
    s.stop().await;
}

/// With the scheduler's workers: the allocations of a node that goes down are placed on
/// the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_scheduler_a_down_nodes_allocations_are_replaced_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.workers = 2;
    cfg.heartbeat_ttl = Duration::from_millis(300);
    cfg.heartbeat_grace = Duration::from_millis(300);
    let s = start(cfg).await;
    for n in ["n1", "n2", "n3"] {
        s.server
            .register_node(node(n, 1000, 1000), SECRET)
            .await
            .unwrap();
    }
    let srv = s.server.clone();
    let beat = tokio::spawn(async move {
        loop {
            for n in ["n2", "n3"] {
                srv.heartbeat(n).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    s.server
        .register_job(job("web", 6, 100, 100))
        .await
        .unwrap();
    let srv = s.server.clone();
    let running = move || {
        srv.job_allocations("default", "web")
            .into_iter()
            .filter(|a| a.desired_status == DesiredStatus::Run)
            .collect::<Vec<_>>()
    };
    let r = running.clone();
    until(LONG, "6 allocations placed", || r().len() == 6).await;
    let srv = s.server.clone();
    until(LONG, "n1 down", || {
        srv.node("n1").unwrap().status == NodeStatus::Down
    })
    .await;
    let r = running.clone();
    until(LONG, "6 wanted again, none on n1", || {
        let v = r();
        v.len() == 6 && v.iter().all(|a| a.node_id != "n1")
    })
    .await;
    beat.abort();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_an_undecodable_value_is_refused_naming_the_key() {
    use drover_server::store::{Op, Store};
    let dir = tempfile::tempdir().unwrap();
    {
        let store = drover_server::RedbStore::open(dir.path()).unwrap();
        store
            .txn(
                vec![],
                vec![Op::Put {
                    key: "job/web".into(),
                    value: b"{not json".to_vec(),
                }],
            )
            .await
            .unwrap();
    }
    let store = drover_server::RedbStore::open(dir.path()).unwrap();
    let err = drover_server::Server::start(
        config(dir.path()),
        std::sync::Arc::new(store),
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .err()
    .expect("refused");
    assert!(
        err.to_string().contains("corrupt state: value of job/web"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_makes_drain_evaluations_and_a_client_from_the_future_gets_everything() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("a", 1, 100, 100)).await.unwrap();
    s.server
        .apply_plan(plan(
            &s.server,
            "a",
            vec![("n1", placement("a", 0, 100, 100))],
        ))
        .await
        .unwrap();
    s.server.drain_node("n1", true).await.unwrap();
    let n = s.server.node("n1").unwrap();
    assert!(n.drain);
    assert_eq!(n.status, NodeStatus::Draining);
    let e = &s.server.job_evaluations("default", "a")[0];
    assert_eq!(e.triggered_by, EvalTrigger::NodeDrain);
    assert_eq!(e.node_id.as_deref(), Some("n1"));
    // Re-registering keeps the drain.
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    assert_eq!(s.server.node("n1").unwrap().status, NodeStatus::Draining);
    s.server.drain_node("n1", false).await.unwrap();
    assert_eq!(s.server.node("n1").unwrap().status, NodeStatus::Ready);
    assert!(matches!(
        s.server.drain_node("nope", true).await,
        Err(drover_server::ServerError::NotFound(_))
    ));

    // An index the server never reached (its state was replaced): the complete set.
    let got = s
        .server
        .allocations_for_client("n1", s.server.index() + 1000, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(got.complete);
    assert_eq!(got.allocations.len(), 1);
    assert!(matches!(
        s.server
            .allocations_for_client("nope", 0, Duration::ZERO)
            .await,
        Err(drover_server::ServerError::NotFound(_))
    ));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_client_reports_commit_together_and_a_refused_one_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let nodes: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
    for n in &nodes {
        s.server
            .register_node(node(n, 1000, 1000), SECRET)
            .await
            .unwrap();
    }
    s.server.register_job(job("a", 20, 100, 100)).await.unwrap();
    let placements = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), placement("a", i as u32, 100, 100)))
        .collect();
    s.server
        .apply_plan(plan(&s.server, "a", placements))
        .await
        .unwrap();
    let alloc_of = |n: &str| s.server.node_allocations(n)[0].id.clone();
    let mut set = tokio::task::JoinSet::new();
    for (i, n) in nodes.iter().enumerate() {
        // n0 reports n1's allocation: refused; everyone else reports its own.
        let target = if i == 0 { alloc_of("n1") } else { alloc_of(n) };
        let srv = s.server.clone();
        let n = n.clone();
        set.spawn(async move {
            let r = srv
                .update_allocations(
                    &n,
                    vec![AllocClientUpdate {
                        healthy: Default::default(),
                        id: target,
                        client_status: ClientStatus::Running,
                        client_description: String::new(),
                        task_states: Default::default(),
                        services: None,
                    }],
                )
                .await;
            (n, r)
        });
    }
    while let Some(r) = set.join_next().await {
        let (n, r) = r.unwrap();
        if n == "n0" {
            assert!(r.unwrap_err().to_string().contains("belongs to node n1"));
        } else {
            r.unwrap();
        }
    }
    assert_eq!(
        s.server.node_allocations("n0")[0].client_status,
        ClientStatus::Pending,
        "n0's own allocation untouched"
    );
    for n in &nodes[1..] {
        assert_eq!(
            s.server.node_allocations(n)[0].client_status,
            ClientStatus::Running,
            "{n}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_commits_nothing_and_node_names_are_unique_among_live_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("a", 1, 100, 100)).await.unwrap();
    let before = s.server.index();
    let same = s.server.plan_job(job("a", 1, 100, 100)).await.unwrap();
    assert!(!same.changed);
    assert_eq!(same.job_version, 0);
    let changed = s.server.plan_job(job("a", 2, 100, 100)).await.unwrap();
    assert!(changed.changed);
    assert_eq!(changed.job_version, 1);
    assert!(changed.groups.contains_key("app"));
    assert_eq!(s.server.index(), before, "a plan commits nothing");
    assert_eq!(s.server.job("default", "a").unwrap().version, 0);
    assert!(matches!(
        s.server.plan_job(job("", 1, 1, 1)).await,
        Err(drover_server::ServerError::Invalid(_))
    ));

    let mut other = node("n2", 1000, 1000);
    other.name = "name-n1".into();
    let err = s.server.register_node(other, SECRET).await.unwrap_err();
    assert!(
        matches!(err, drover_server::ServerError::Conflict(_)),
        "{err}"
    );
    assert!(
        err.to_string().contains("already used by live node n1"),
        "{err}"
    );
    s.stop().await;
}

/// With the scheduler's workers: a job runs only in its datacenters (a job whose
/// datacenters have no node is blocked, saying so), and a client gets the job's meta
/// and the server's region with each allocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_scheduler_jobs_run_in_their_datacenters_and_clients_learn_meta_and_region() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.workers = 2;
    cfg.region = "europe".into();
    let s = start(cfg).await;
    for (id, dc) in [("us", "us-east"), ("eu", "eu-west")] {
        let mut n = node(id, 4000, 4096);
        n.datacenter = dc.into();
        s.server.register_node(n, SECRET).await.unwrap();
    }
    let mut web = job("web", 3, 100, 64);
    web.datacenters = vec!["eu-*".into()];
    web.meta.insert("owner".into(), "ops".into());
    s.server.register_job(web).await.unwrap();
    let mut lost = job("lost", 1, 100, 64);
    lost.datacenters = vec!["dc9".into()];
    s.server.register_job(lost).await.unwrap();

    let srv = s.server.clone();
    until(LONG, "web's 3 allocations placed", || {
        srv.job_allocations("default", "web").len() == 3
    })
    .await;
    assert!(
        s.server
            .job_allocations("default", "web")
            .iter()
            .all(|a| a.node_id == "eu"),
        "only on the node in eu-west"
    );
    let set = s
        .server
        .allocations_for_client("eu", 0, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(set.allocations.len(), 3);
    for a in &set.allocations {
        assert_eq!(a.region, "europe");
        assert_eq!(a.job_meta["owner"], "ops");
    }
    until(LONG, "lost blocked: no node in its datacenters", || {
        srv.job_evaluations("default", "lost").iter().any(|e| {
            e.status == EvalStatus::Blocked
                && e.failed_tg_allocs
                    .get("app")
                    .is_some_and(|f| f.reason == "no node in datacenters [dc9]")
        })
    })
    .await;
    assert!(s.server.job_allocations("default", "lost").is_empty());
    s.stop().await;
}
