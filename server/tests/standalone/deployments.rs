//! Deployments on one server with its real scheduler, a real redb store and a node
//! whose client is played by the test (its status reports, with the health verdicts
//! a real agent would send): a version rolls out through a deployment, success marks
//! it stable, an unhealthy allocation fails the next one and auto-revert registers the
//! stable version again; canaries wait for a promotion, which is refused while they
//! are not healthy; an operator can fail a deployment.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use drover_server_api::{
    AllocClientUpdate, Allocation, ClientStatus, Deployment, DeploymentStatus, JobSpec,
    UpdateStrategy,
};

/// Poll `look` until it gives something, failing the test after [`LONG`].
async fn until<T>(what: &str, mut look: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        if let Some(v) = look() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {LONG:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server that schedules (one worker), with node n1 ready.
async fn scheduling_server(dir: &std::path::Path) -> Running {
    let mut cfg = config(dir);
    cfg.workers = 1;
    let s = start(cfg).await;
    s.server
        .register_node(node("n1", 100_000, 100_000), SECRET)
        .await
        .unwrap();
    s.server.heartbeat("n1").await.unwrap();
    s
}

fn web(count: u32, version: &str, update: UpdateStrategy) -> JobSpec {
    let mut j = job("web", count, 100, 64);
    j.update = update;
    j.groups[0].tasks[0]
        .env
        .insert("WEB_VERSION".into(), version.into());
    j
}

fn strategy() -> UpdateStrategy {
    UpdateStrategy {
        max_parallel: 1,
        auto_revert: true,
        ..UpdateStrategy::default()
    }
}

/// The job's allocations wanted to run.
fn live(s: &Running) -> Vec<Allocation> {
    let mut v: Vec<Allocation> = s
        .server
        .job_allocations("default", "web")
        .into_iter()
        .filter(|a| !a.is_terminal())
        .collect();
    v.sort_by_key(|a| (a.index, a.create_index));
    v
}

/// n1's client reports `ids` running, with a health verdict.
async fn report(s: &Running, ids: &[String], healthy: Option<bool>) {
    let updates = ids
        .iter()
        .map(|id| AllocClientUpdate {
            id: id.clone(),
            client_status: ClientStatus::Running,
            client_description: String::new(),
            task_states: BTreeMap::new(),
            services: None,
            healthy,
        })
        .collect();
    s.server.update_allocations("n1", updates).await.unwrap();
}

fn newest(s: &Running) -> Deployment {
    s.server
        .job_deployments("default", "web")
        .unwrap()
        .into_iter()
        .next()
        .expect("a deployment")
}

async fn wait_live(
    s: &Running,
    what: &str,
    cond: impl Fn(&[Allocation]) -> bool,
) -> Vec<Allocation> {
    until(what, || {
        let v = live(s);
        cond(&v).then_some(v)
    })
    .await
}

async fn wait_deployment(
    s: &Running,
    what: &str,
    cond: impl Fn(&Deployment) -> bool,
) -> Deployment {
    until(what, || {
        s.server
            .job_deployments("default", "web")
            .and_then(|v| v.into_iter().next())
            .filter(|d| cond(d))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_version_fails_its_deployment_and_auto_revert_restores_the_stable_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = scheduling_server(dir.path()).await;

    // v0: a deployment; healthy copies make it successful and v0 stable.
    s.server
        .register_job(web(2, "0", strategy()))
        .await
        .unwrap();
    let v0 = wait_live(&s, "two copies of v0", |v| v.len() == 2).await;
    let d0 = newest(&s);
    assert_eq!(
        (d0.job_version, d0.status, d0.groups["app"].desired_total),
        (0, DeploymentStatus::Running, 2)
    );
    assert!(
        v0.iter()
            .all(|a| a.deployment_id.as_deref() == Some(d0.id.as_str()))
    );
    let ids: Vec<String> = v0.iter().map(|a| a.id.clone()).collect();
    report(&s, &ids, None).await;
    // Running is not healthy: nothing moves yet.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(newest(&s).status, DeploymentStatus::Running);
    report(&s, &ids, Some(true)).await;
    let d0 = wait_deployment(&s, "v0 successful", |d| {
        d.status == DeploymentStatus::Successful
    })
    .await;
    assert_eq!(d0.groups["app"].healthy_allocs, 2);
    assert!(s.server.job("default", "web").unwrap().stable);

    // v1: one copy replaced (max_parallel 1), which turns unhealthy.
    s.server
        .register_job(web(2, "1", strategy()))
        .await
        .unwrap();
    let now = wait_live(&s, "one copy of v1", |v| {
        v.iter().filter(|a| a.job_version == 1).count() == 1
    })
    .await;
    assert_eq!(
        now.len(),
        2,
        "max_parallel 1: one old copy replaced: {now:#?}"
    );
    let new: Vec<String> = now
        .iter()
        .filter(|a| a.job_version == 1)
        .map(|a| a.id.clone())
        .collect();
    let kept = now.iter().find(|a| a.job_version == 0).unwrap().id.clone();
    // Not healthy yet: the other copy is not replaced.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        live(&s).iter().filter(|a| a.job_version == 1).count(),
        1,
        "the next copy waits for the first one's health"
    );
    report(&s, &new, Some(false)).await;
    let failed = until("v1's deployment failed", || {
        s.server
            .job_deployments("default", "web")
            .unwrap()
            .into_iter()
            .find(|d| d.job_version == 1 && d.status == DeploymentStatus::Failed)
    })
    .await;
    assert_eq!(
        failed.status_description,
        "Failed due to unhealthy allocations - rolling back to job version 0"
    );
    assert_eq!(failed.groups["app"].unhealthy_allocs, 1);
    let job = s.server.job("default", "web").unwrap();
    assert_eq!(job.version, 2);
    assert_eq!(job.spec.groups[0].tasks[0].env["WEB_VERSION"], "0");
    // v2 (= v0's spec) replaces the failed copy; v0's copy that was never replaced
    // stays.
    let back = wait_live(&s, "v2 replaces v1's copy", |v| {
        v.len() == 2 && v.iter().all(|a| a.job_version != 1)
    })
    .await;
    assert!(back.iter().any(|a| a.id == kept), "{back:#?}");
    let d2 = newest(&s);
    assert_eq!((d2.job_version, d2.status), (2, DeploymentStatus::Running));
    let fresh: Vec<String> = back
        .iter()
        .filter(|a| a.job_version == 2)
        .map(|a| a.id.clone())
        .collect();
    report(&s, &fresh, Some(true)).await;
    wait_deployment(&s, "v2 successful", |d| {
        d.job_version == 2 && d.status == DeploymentStatus::Successful
    })
    .await;
    let versions = s.server.job_versions("default", "web").unwrap();
    let stable: Vec<(u64, bool)> = versions.iter().map(|j| (j.version, j.stable)).collect();
    assert_eq!(stable, [(2, true), (1, false), (0, true)]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_wait_for_a_promotion_refused_until_they_are_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let s = scheduling_server(dir.path()).await;
    let canary = UpdateStrategy {
        canary: 1,
        ..strategy()
    };
    s.server.register_job(web(3, "0", canary)).await.unwrap();
    let v0 = wait_live(&s, "three copies of v0", |v| v.len() == 3).await;
    let ids: Vec<String> = v0.iter().map(|a| a.id.clone()).collect();
    report(&s, &ids, Some(true)).await;
    wait_deployment(&s, "v0 successful", |d| {
        d.status == DeploymentStatus::Successful
    })
    .await;

    s.server.register_job(web(3, "1", canary)).await.unwrap();
    let now = wait_live(&s, "a canary next to the old copies", |v| v.len() == 4).await;
    let c: Vec<String> = now
        .iter()
        .filter(|a| a.job_version == 1)
        .map(|a| a.id.clone())
        .collect();
    assert_eq!(c.len(), 1);
    let d = newest(&s);
    assert_eq!(d.groups["app"].placed_canaries, c);
    let err = s.server.promote_deployment(&d.id, None).await.unwrap_err();
    assert!(err.to_string().contains("0/1 healthy canaries"), "{err}");
    report(&s, &c, Some(true)).await;
    // Healthy, not promoted: the deployment waits.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(live(&s).len(), 4);
    assert_eq!(newest(&s).status, DeploymentStatus::Running);
    // An unknown group is refused; promoting by the id's prefix works.
    assert!(
        s.server
            .promote_deployment(&d.id, Some(vec!["nope".into()]))
            .await
            .is_err()
    );
    s.server.promote_deployment(&d.id[..8], None).await.unwrap();
    // The canary replaces the copy at its index, the rest rolls one at a time.
    for _ in 0..3 {
        let fresh: Vec<String> = live(&s)
            .iter()
            .filter(|a| a.job_version == 1)
            .map(|a| a.id.clone())
            .collect();
        report(&s, &fresh, Some(true)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let done = wait_live(&s, "three copies of v1", |v| {
        v.len() == 3 && v.iter().all(|a| a.job_version == 1)
    })
    .await;
    assert!(done.iter().any(|a| a.id == c[0]), "the canary is kept");
    let fresh: Vec<String> = done.iter().map(|a| a.id.clone()).collect();
    report(&s, &fresh, Some(true)).await;
    let v1 = wait_deployment(&s, "v1 successful", |d| {
        d.job_version == 1 && d.status == DeploymentStatus::Successful
    })
    .await;
    // Every copy it placed is counted, the canary and the two rolled after it.
    assert_eq!(
        (
            v1.groups["app"].placed_allocs,
            v1.groups["app"].healthy_allocs
        ),
        (3, 3)
    );

    // An operator fails a running deployment: nothing more is replaced, and without
    // auto-revert the job stays where it is.
    let no_revert = UpdateStrategy {
        auto_revert: false,
        ..strategy()
    };
    s.server.register_job(web(3, "2", no_revert)).await.unwrap();
    wait_live(&s, "one copy of v2", |v| {
        v.iter().filter(|a| a.job_version == 2).count() == 1
    })
    .await;
    let d = newest(&s);
    let r = s.server.fail_deployment(&d.id).await.unwrap();
    assert_eq!(r.reverted_job_version, None);
    assert_eq!(newest(&s).status_description, "Deployment marked as failed");
    let fresh: Vec<String> = live(&s)
        .iter()
        .filter(|a| a.job_version == 2)
        .map(|a| a.id.clone())
        .collect();
    report(&s, &fresh, Some(true)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        live(&s).iter().filter(|a| a.job_version == 2).count(),
        1,
        "a failed deployment replaces nothing more"
    );
    assert_eq!(s.server.job("default", "web").unwrap().version, 3 - 1);
    assert!(s.server.fail_deployment(&d.id).await.is_err());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_fails_without_a_verdict_fails_the_deployment_and_stops_the_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let s = scheduling_server(dir.path()).await;
    // Manual health: the client decides nothing; a canary that fails must still stop
    // the rollout (not be replaced again and again).
    let manual = UpdateStrategy {
        health_check: drover_server_api::HealthCheckMode::Manual,
        progress_deadline: Duration::ZERO,
        ..strategy()
    };
    s.server.register_job(web(3, "0", manual)).await.unwrap();
    let v0 = wait_live(&s, "three copies of v0", |v| v.len() == 3).await;
    let ids: Vec<String> = v0.iter().map(|a| a.id.clone()).collect();
    report(&s, &ids, Some(true)).await;
    wait_deployment(&s, "v0 successful", |d| {
        d.status == DeploymentStatus::Successful
    })
    .await;
    s.server.register_job(web(3, "1", manual)).await.unwrap();
    let now = wait_live(&s, "one copy of v1", |v| {
        v.iter().filter(|a| a.job_version == 1).count() == 1
    })
    .await;
    let new = now.iter().find(|a| a.job_version == 1).unwrap().id.clone();
    let failed = AllocClientUpdate {
        id: new.clone(),
        client_status: ClientStatus::Failed,
        client_description: "exited 3".into(),
        task_states: BTreeMap::new(),
        services: None,
        healthy: None,
    };
    s.server
        .update_allocations("n1", vec![failed])
        .await
        .unwrap();
    let d = until("v1's deployment failed", || {
        s.server
            .job_deployments("default", "web")
            .unwrap()
            .into_iter()
            .find(|d| d.job_version == 1 && d.status == DeploymentStatus::Failed)
    })
    .await;
    assert_eq!(d.groups["app"].unhealthy_allocs, 1);
    let a = s.server.allocation(&new).unwrap();
    assert_eq!(
        a.deployment_status.and_then(|st| st.healthy),
        Some(false),
        "a failure is the verdict"
    );
    // Nothing more of v1 is placed, old copies keep running.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let live_now = live(&s);
    assert_eq!(
        live_now.iter().filter(|a| a.job_version == 0).count(),
        2,
        "{live_now:#?}"
    );
    assert!(
        s.server
            .job_allocations("default", "web")
            .iter()
            .filter(|a| a.job_version == 1)
            .count()
            <= 2,
        "the failed copy may be rescheduled once at most, never replaced in a loop"
    );
    s.stop().await;
}
