//! Ports through the server: a static port inside a node's dynamic range refused at
//! registration naming the field, a static port of one node given once (the rest
//! blocked with the reason), a port two plans picked committed once, and a node's bad
//! port ranges refused. Real redb store in a temp dir.

use std::time::Duration;

use crate::common::*;
use drover_server::ServerError;
use drover_server_api::{
    AllocatedPort, Allocation, EvalStatus, JobSpec, NetworkSpec, NodeNetwork, PortRange, PortSpec,
};
use drover_test_support::until;

const LIMIT: Duration = Duration::from_secs(20);

fn with_static(mut j: JobSpec, port: u32) -> JobSpec {
    j.groups[0].network = Some(NetworkSpec {
        ports: vec![PortSpec {
            label: "http".into(),
            static_port: port,
            ..PortSpec::default()
        }],
        ..NetworkSpec::default()
    });
    j
}

fn live(s: &Running, job: &str) -> Vec<Allocation> {
    s.server
        .job_allocations("default", job)
        .into_iter()
        .filter(|a| !a.is_terminal())
        .collect()
}

fn invalid(r: Result<drover_server_api::JobRegisterResponse, ServerError>) -> String {
    match r {
        Err(ServerError::Invalid(m)) => m,
        other => panic!("expected the job refused as invalid, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_port_inside_a_dynamic_range_is_refused_at_registration_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.workers = 1;
    let s = start(cfg).await;
    // No node yet: Nomad's default range.
    let m = invalid(
        s.server
            .register_job(with_static(job("web", 1, 10, 10), 25000))
            .await,
    );
    assert!(
        m.starts_with("group[0].network.port[0].static: 25000 is inside the default dynamic port range 20000-32000"),
        "{m}"
    );
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    let m = invalid(
        s.server
            .register_job(with_static(job("web", 1, 10, 10), 20500))
            .await,
    );
    assert!(
        m.starts_with(
            "group[0].network.port[0].static: 20500 is inside the dynamic port range \
             20000-32000 of node name-n1 (n1)"
        ),
        "{m}"
    );
    // `job plan` says the same, and nothing was registered.
    let m = match s
        .server
        .plan_job(with_static(job("web", 1, 10, 10), 20500))
        .await
    {
        Err(ServerError::Invalid(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(
        m.starts_with("group[0].network.port[0].static: 20500"),
        "{m}"
    );
    assert!(s.server.job("default", "web").is_none());

    // A node whose range is elsewhere: the port is fine there (n1 still counts, so a
    // job that only n2 can run is the one accepted).
    let mut n2 = node("n2", 4000, 4000);
    n2.network.min_dynamic_port = 40000;
    n2.network.max_dynamic_port = 41000;
    n2.datacenter = "dc2".into();
    s.server.register_node(n2, SECRET).await.unwrap();
    let mut j = with_static(job("web", 1, 10, 10), 20500);
    j.datacenters = vec!["dc2".into()];
    s.server.register_job(j).await.unwrap();
    until(LIMIT, "the allocation placed on n2", || {
        live(&s, "web").iter().any(|a| a.node_id == "n2")
    })
    .await;
    let a = &live(&s, "web")[0];
    assert_eq!(
        a.ports,
        [AllocatedPort {
            label: "http".into(),
            value: 20500,
            to: 20500,
            host_ip: "127.0.0.1".into(),
        }]
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_port_job_of_three_on_one_node_places_one_and_blocks_two_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.workers = 1;
    let s = start(cfg).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server
        .register_job(with_static(job("web", 3, 10, 10), 8080))
        .await
        .unwrap();
    let blocked = || {
        s.server
            .job_evaluations("default", "web")
            .into_iter()
            .find(|e| e.status == EvalStatus::Blocked)
    };
    until(LIMIT, "a blocked evaluation", || blocked().is_some()).await;
    let live = live(&s, "web");
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].ports[0].value, 8080);
    let b = blocked().unwrap();
    let f = &b.failed_tg_allocs["app"];
    assert_eq!(f.unplaced, 2);
    assert_eq!(f.reason, "port 8080 in use on 1 of 1 nodes");
    assert_eq!(b.queued_allocations["app"], 2);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_two_plans_picked_on_a_node_is_committed_once_and_freed_by_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .unwrap();
    s.server.register_job(job("web", 2, 10, 10)).await.unwrap();
    let with_port = |index: u32, port: u16| {
        let mut a = placement("web", index, 10, 10);
        a.ports = vec![AllocatedPort {
            label: "http".into(),
            value: port,
            to: port,
            host_ip: "127.0.0.1".into(),
        }];
        a
    };
    let first = plan(&s.server, "web", vec![("n1", with_port(0, 20001))]);
    let second = plan(&s.server, "web", vec![("n1", with_port(1, 20001))]);
    let (r1, r2) = tokio::join!(s.server.apply_plan(first), s.server.apply_plan(second));
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!(r1.placed + r2.placed, 1, "{r1:?} {r2:?}");
    assert_eq!(r1.refused + r2.refused, 1, "{r1:?} {r2:?}");
    let refused = if r1.refused == 1 { &r1 } else { &r2 };
    assert_eq!(refused.refused_nodes["n1"], "port 20001 in use");
    // Stopping the holder frees the port for the next plan.
    let holder = live(&s, "web").remove(0);
    let mut p = plan(&s.server, "web", vec![("n1", with_port(1, 20001))]);
    p.node_update.insert("n1".into(), vec![stop(&holder.id)]);
    let r = s.server.apply_plan(p).await.unwrap();
    assert_eq!((r.placed, r.refused), (1, 0), "{r:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_bad_port_ranges_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let cases: Vec<(NodeNetwork, &str)> = vec![
        (
            NodeNetwork {
                min_dynamic_port: 30000,
                max_dynamic_port: 20000,
                ..NodeNetwork::default()
            },
            "node n1: network: the dynamic port range 30000-20000",
        ),
        (
            NodeNetwork {
                reserved_ports: vec![PortRange {
                    first: 90,
                    last: 80,
                }],
                ..NodeNetwork::default()
            },
            "node n1: network.reserved_ports[0]: 90-80",
        ),
        (
            NodeNetwork {
                address: "not an address".into(),
                ..NodeNetwork::default()
            },
            "node n1: network.address",
        ),
    ];
    for (network, want) in cases {
        let mut n = node("n1", 4000, 4000);
        n.network = network;
        match s.server.register_node(n, SECRET).await {
            Err(ServerError::Invalid(m)) => assert!(m.starts_with(want), "{m}"),
            other => panic!("{want}: {other:?}"),
        }
    }
    assert!(s.server.nodes().is_empty());
    s.stop().await;
}
