//! Blocked evaluations: what a job could not place waits in its (only) blocked
//! evaluation, with the reasons, until capacity may have appeared: a node registered,
//! became ready, changed drivers or resources, or allocations stopped or ended. Then
//! every blocked evaluation is retried: canceled, and a new `queued-allocs` evaluation
//! made in its place, all in one commit. Triggers arriving while a retry commits are
//! coalesced into the next one.

use std::sync::Arc;

use drover_server_api::{EvalStatus, EvalTrigger};

use crate::error::ServerError;
use crate::leader::term::LeaderTerm;
use crate::state::Batch;
use crate::state::evals::{new_eval, set_eval_status};

pub(crate) async fn run(term: Arc<LeaderTerm>, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = term.unblock.notified() => {}
        }
        if let Err(e) = unblock_all(&term).await {
            tracing::warn!("could not retry blocked evaluations: {e}");
        }
    }
}

/// Retry every blocked evaluation; how many were retried.
pub(crate) async fn unblock_all(term: &LeaderTerm) -> Result<usize, ServerError> {
    let (_, n) = term
        .commit(|st, index, now| {
            let mut b = Batch::default();
            let mut n = 0;
            for blocked in st.blocked_evals() {
                match st
                    .job_in(&blocked.namespace, &blocked.job_name)
                    .filter(|j| !j.stop)
                {
                    Some(job) => {
                        let mut e = new_eval(job, EvalTrigger::QueuedAllocs, index, now);
                        e.previous_eval = Some(blocked.id.clone());
                        b.evals.push(set_eval_status(
                            blocked,
                            EvalStatus::Canceled,
                            format!("capacity changed: retried by evaluation {}", e.id),
                            index,
                            now,
                        ));
                        b.evals.push(e);
                        n += 1;
                    }
                    None => b.evals.push(set_eval_status(
                        blocked,
                        EvalStatus::Canceled,
                        "the job is stopped or purged".into(),
                        index,
                        now,
                    )),
                }
            }
            Ok((b, n))
        })
        .await?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use drover_server_api::{
        DriverInfo, EvalStatus, EvalTrigger, JobSpec, NodeRegistration, NodeResources,
        PlacementFailure, Task, TaskGroup, TaskResources,
    };
    use tokio_util::sync::CancellationToken;

    use crate::leader::plan_apply::{EvalFinish, finish_eval};
    use crate::state::Batch;
    use crate::{RedbStore, Server, ServerConfig};

    fn job() -> JobSpec {
        JobSpec {
            namespace: "default".into(),
            datacenters: Vec::new(),
            name: "big".into(),
            job_type: Default::default(),
            priority: 50,
            constraints: vec![],
            update: Default::default(),
            meta: BTreeMap::new(),
            groups: vec![TaskGroup {
                volumes: Default::default(),
                update: Default::default(),
                network: Default::default(),
                services: Default::default(),
                reschedule: None,
                name: "app".into(),
                count: 1,
                constraints: vec![],
                meta: BTreeMap::new(),
                tasks: vec![Task {
                    devices: Default::default(),
                    volume_mounts: Default::default(),
                    services: Default::default(),
                    meta: Default::default(),
                    name: "t".into(),
                    driver: "rawexec".into(),
                    config: serde_json::Value::Null,
                    env: BTreeMap::new(),
                    kill_signal: None,
                    kill_timeout: None,
                    restart: None,
                    resources: TaskResources::default(),
                    logs: None,
                    lifecycle: None,
                    artifacts: Vec::new(),
                    templates: Vec::new(),
                    identity: None,
                }],
            }],
        }
    }

    fn node(id: &str) -> NodeRegistration {
        NodeRegistration {
            devices: Default::default(),
            host_volumes: Default::default(),
            csi_plugins: Default::default(),
            network: Default::default(),
            datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
            id: id.into(),
            name: id.into(),
            attributes: BTreeMap::new(),
            meta: BTreeMap::new(),
            resources: NodeResources {
                cpu: 1000,
                memory_mb: 1000,
            },
            drivers: BTreeMap::from([("rawexec".into(), DriverInfo::default())]),
        }
    }

    /// What a worker writes for an evaluation that could not place "app".
    async fn fail_to_place(server: &Server, eval_id: &str) {
        let eval = server.evaluation(eval_id).unwrap();
        let finish = EvalFinish {
            eval,
            failed_tg_allocs: BTreeMap::from([(
                "app".into(),
                PlacementFailure {
                    unplaced: 1,
                    reason: "memory exhausted on 1 of 1 nodes".into(),
                    ..PlacementFailure::default()
                },
            )]),
            queued_allocations: BTreeMap::from([("app".into(), 1)]),
            follow_up_at: None,
        };
        server
            .term()
            .commit(|st, index, now| {
                let mut b = Batch::default();
                finish_eval(st, &finish, index, now, &mut b);
                Ok((b, ()))
            })
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_blocked_evaluation_per_job_retried_when_a_node_registers() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig::new(dir.path());
        cfg.workers = 0; // evaluations stay pending, where the test can see them
        let shutdown = CancellationToken::new();
        let store = Arc::new(RedbStore::open(dir.path()).unwrap());
        let server = Server::start(cfg, store, shutdown.clone()).await.unwrap();

        let first = server.register_job(job()).await.unwrap();
        fail_to_place(&server, &first.eval_id).await;
        let e = server.evaluation(&first.eval_id).unwrap();
        assert_eq!(e.status, EvalStatus::Complete);
        let blocked1 = server
            .evaluation(e.blocked_eval.as_deref().unwrap())
            .unwrap();
        assert_eq!(blocked1.status, EvalStatus::Blocked);
        assert_eq!(
            blocked1.failed_tg_allocs["app"].reason, "memory exhausted on 1 of 1 nodes",
            "the reason is kept"
        );
        assert_eq!(server.jobs()[0].summary["app"].queued, 1);

        // A second evaluation that fails too replaces the blocked one: one per job.
        let rolling = {
            let core = server.term();
            let (_, id) = core
                .commit(|st, index, now| {
                    let mut b = Batch::default();
                    let job = st.job_in("default", "big").unwrap();
                    let e = crate::state::evals::new_eval(job, EvalTrigger::NodeUpdate, index, now);
                    let id = e.id.clone();
                    b.evals.push(e);
                    Ok((b, id))
                })
                .await
                .unwrap();
            id
        };
        fail_to_place(&server, &rolling).await;
        let blocked: Vec<_> = server
            .job_evaluations("default", "big")
            .into_iter()
            .filter(|e| e.status == EvalStatus::Blocked)
            .collect();
        assert_eq!(blocked.len(), 1);
        assert_ne!(blocked[0].id, blocked1.id);
        assert_eq!(
            server.evaluation(&blocked1.id).unwrap().status,
            EvalStatus::Canceled
        );

        // A node registers: the blocked evaluation is retried as queued-allocs.
        let at = server.index();
        server
            .register_node(node("n1"), "blocked-test-node-secret")
            .await
            .unwrap();
        let id = blocked[0].id.clone();
        drover_test_support::until(
            Duration::from_secs(10),
            "blocked evaluation retried",
            || {
                server
                    .evaluation(&id)
                    .is_some_and(|e| e.status == EvalStatus::Canceled)
            },
        )
        .await;
        let retry: Vec<_> = server
            .job_evaluations("default", "big")
            .into_iter()
            .filter(|e| e.triggered_by == EvalTrigger::QueuedAllocs)
            .collect();
        assert_eq!(retry.len(), 1);
        assert_eq!(retry[0].status, EvalStatus::Pending);
        assert_eq!(retry[0].previous_eval.as_deref(), Some(id.as_str()));
        assert!(retry[0].create_index > at);
        assert_eq!(server.stats().blocked_evaluations, 0);

        // A heartbeat-style re-registration with nothing new retries nothing.
        fail_to_place(&server, &retry[0].id).await;
        let before = server.index();
        server
            .register_node(node("n1"), "blocked-test-node-secret")
            .await
            .unwrap();
        assert_eq!(server.index(), before, "an unchanged node is not rewritten");
        assert_eq!(server.stats().blocked_evaluations, 1);
        shutdown.cancel();
        server.stopped().await;
    }
}
