//! Node identity and what nodes report, on a real redb store and real TCP on
//! 127.0.0.1: a node's secret is bound at its first registration and every node RPC
//! for its id must present it; a node back from down keeps its name; what a node
//! reports is bounded.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use drover_proto::drover::cluster::v1 as pb;
use drover_server::ServerError;
use drover_server::rpc::{RpcOptions, serve};
use drover_server_api::{
    AllocClientUpdate, ClientStatus, DriverInfo, NodeStatus, TaskRunState, TaskState,
};
use drover_test_support::{until, within};
use pb::node_client::NodeClient;
use tonic::Code;
use tonic::transport::Channel;

const OTHER: &str = "another-node-secret-0123456789abcdef";

/// The node RPCs of `server` on 127.0.0.1; a client connected to them.
async fn rpc(s: &Running) -> NodeClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        s.server.clone(),
        listener,
        RpcOptions::default(),
        None,
        s.shutdown.clone(),
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    NodeClient::new(channel)
}

fn register_req(reg: &drover_server_api::NodeRegistration, secret: &str) -> pb::RegisterRequest {
    pb::RegisterRequest {
        node_json: serde_json::to_vec(reg).unwrap(),
        node_secret: secret.into(),
    }
}

fn update_req(
    node: &str,
    secret: &str,
    updates: &[AllocClientUpdate],
) -> pb::UpdateAllocationsRequest {
    pb::UpdateAllocationsRequest {
        node_id: node.into(),
        updates_json: updates
            .iter()
            .map(|u| serde_json::to_vec(u).unwrap())
            .collect(),
        node_secret: secret.into(),
    }
}

fn upd(id: &str, status: ClientStatus) -> AllocClientUpdate {
    AllocClientUpdate {
        healthy: Default::default(),
        id: id.into(),
        client_status: status,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        services: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_nodes_id_without_its_secret_is_refused_on_every_rpc() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let mut client = rpc(&s).await;
    client
        .register(register_req(&node("n1", 1000, 1000), SECRET))
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
    let alloc = s.server.node_allocations("n1")[0].id.clone();

    for wrong in [OTHER, ""] {
        // Register as n1: its name, resources and drivers stay the real node's.
        let mut fake = node("n1", 1, 1);
        fake.name = "impostor".into();
        fake.drivers.clear();
        let err = client
            .register(register_req(&fake, wrong))
            .await
            .unwrap_err();
        if wrong.is_empty() {
            assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
            assert!(err.message().contains("node_secret"), "{err:?}");
        } else {
            assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
            assert!(!err.message().contains(OTHER), "{err:?}");
        }
        let n1 = s.server.node("n1").unwrap();
        assert_eq!(n1.name, "name-n1");
        assert_eq!(n1.resources.cpu, 1000);
        assert!(n1.drivers.contains_key("rawexec"));

        let err = client
            .heartbeat(pb::HeartbeatRequest {
                node_id: "n1".into(),
                node_secret: wrong.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

        let err = client
            .watch_allocations(pb::WatchAllocationsRequest {
                node_id: "n1".into(),
                index: 0,
                node_secret: wrong.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

        let err = client
            .update_allocations(update_req(
                "n1",
                wrong,
                &[upd(&alloc, ClientStatus::Failed)],
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
        assert_eq!(
            s.server.allocation(&alloc).unwrap().client_status,
            ClientStatus::Pending,
            "a refused update changes nothing"
        );
    }

    // The real node keeps working, on the same connection.
    client
        .heartbeat(pb::HeartbeatRequest {
            node_id: "n1".into(),
            node_secret: SECRET.into(),
        })
        .await
        .unwrap();
    let mut watch = client
        .watch_allocations(pb::WatchAllocationsRequest {
            node_id: "n1".into(),
            index: 0,
            node_secret: SECRET.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = within(LONG, "n1's complete set", watch.message())
        .await
        .unwrap()
        .unwrap();
    assert!(first.complete);
    assert_eq!(first.allocations_json.len(), 1);
    client
        .update_allocations(update_req(
            "n1",
            SECRET,
            &[upd(&alloc, ClientStatus::Running)],
        ))
        .await
        .unwrap();
    assert_eq!(
        s.server.allocation(&alloc).unwrap().client_status,
        ClientStatus::Running
    );
    client
        .register(register_req(&node("n1", 2000, 1000), SECRET))
        .await
        .unwrap();
    assert_eq!(s.server.node("n1").unwrap().resources.cpu, 2000);

    // Neither the secret nor its hash is in what the API serves.
    let served = serde_json::to_string(&s.server.nodes()).unwrap();
    assert!(
        !served.contains(SECRET) && !served.contains("secret"),
        "{served}"
    );
    drop(watch);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_secret_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.stop().await;

    let s = start(config(dir.path())).await;
    let err = s
        .server
        .register_node(node("n1", 1000, 1000), OTHER)
        .await
        .unwrap_err();
    assert!(matches!(err, ServerError::Denied(_)), "{err}");
    let mut client = rpc(&s).await;
    let err = client
        .heartbeat(pb::HeartbeatRequest {
            node_id: "n1".into(),
            node_secret: OTHER.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    client
        .heartbeat(pb::HeartbeatRequest {
            node_id: "n1".into(),
            node_secret: SECRET.into(),
        })
        .await
        .unwrap();
    s.server
        .register_node(node("n1", 1000, 1000), SECRET)
        .await
        .unwrap();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_down_keeps_its_name_and_the_name_becomes_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.heartbeat_ttl = Duration::from_millis(200);
    cfg.heartbeat_grace = Duration::from_millis(200);
    let s = start(cfg).await;
    let mut web = node("n1", 1000, 1000);
    web.name = "web".into();
    s.server.register_node(web.clone(), SECRET).await.unwrap();
    let srv = s.server.clone();
    until(LONG, "n1 down", || {
        srv.node("n1").unwrap().status == NodeStatus::Down
    })
    .await;

    // Another node takes the name while n1 is down.
    let mut squatter = node("n2", 1000, 1000);
    squatter.name = "web".into();
    s.server.register_node(squatter, OTHER).await.unwrap();
    // n1 proves its id: it is back, under its name.
    s.server.register_node(web, SECRET).await.unwrap();
    assert_eq!(s.server.node("n1").unwrap().status, NodeStatus::Ready);
    assert_eq!(s.server.node("n1").unwrap().name, "web");

    let err = s.server.node("web").unwrap_err();
    assert!(matches!(err, ServerError::Invalid(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("ambiguous") && msg.contains("n1") && msg.contains("n2"),
        "{msg}"
    );
    let err = s.server.drain_node("web", true).await.unwrap_err();
    assert!(err.to_string().contains("ambiguous"), "{err}");
    assert!(!s.server.node("n1").unwrap().drain && !s.server.node("n2").unwrap().drain);

    // A new id may not take a live node's name.
    let mut third = node("n3", 1000, 1000);
    third.name = "web".into();
    let err = s.server.register_node(third, OTHER).await.unwrap_err();
    assert!(matches!(err, ServerError::Conflict(_)), "{err}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_node_reports_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let mut client = rpc(&s).await;

    let refused = |field: &'static str| {
        move |r: Result<_, ServerError>| match r {
            Err(ServerError::Invalid(m)) => assert!(m.contains(field), "{field}: {m}"),
            other => panic!("{field}: not refused: {other:?}"),
        }
    };
    let mut reg = node("n1", 1000, 1000);
    reg.attributes = (0..257).map(|i| (format!("k{i}"), "v".into())).collect();
    refused("attributes")(s.server.register_node(reg, SECRET).await);
    let mut reg = node("n1", 1000, 1000);
    reg.meta.insert("big".into(), "x".repeat(4097));
    refused("meta.big")(s.server.register_node(reg, SECRET).await);
    let mut reg = node("n1", 1000, 1000);
    reg.meta.insert("k".repeat(257), "v".into());
    refused("meta")(s.server.register_node(reg, SECRET).await);
    let mut reg = node("n1", 1000, 1000);
    reg.drivers = (0..65)
        .map(|i| (format!("d{i}"), DriverInfo::default()))
        .collect();
    refused("drivers")(s.server.register_node(reg, SECRET).await);
    let mut reg = node("n1", 1000, 1000);
    let d = reg.drivers.get_mut("rawexec").unwrap();
    d.attributes = (0..257).map(|i| (format!("k{i}"), "v".into())).collect();
    refused("drivers.rawexec.attributes")(s.server.register_node(reg.clone(), SECRET).await);
    // Over RPC: INVALID_ARGUMENT naming the field; nothing was registered.
    let err = client
        .register(register_req(&reg, SECRET))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("drivers.rawexec.attributes"),
        "{err:?}"
    );
    assert!(s.server.node("n1").is_err());

    client
        .register(register_req(&node("n1", 1000, 1000), SECRET))
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
    let alloc = s.server.node_allocations("n1")[0].id.clone();
    let running = |message: String| TaskState {
        state: TaskRunState::Running,
        starts: 1,
        message,
        ..TaskState::default()
    };

    // A task the allocation's group does not have: refused, nothing changes.
    let mut u = upd(&alloc, ClientStatus::Running);
    u.task_states
        .insert("intruder".into(), running(String::new()));
    let err = client
        .update_allocations(update_req("n1", SECRET, &[u]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("task_states") && err.message().contains("intruder"),
        "{err:?}"
    );
    // An identifier field too long: refused.
    let mut u = upd(&alloc, ClientStatus::Running);
    let mut ts = running(String::new());
    ts.task_id = "t".repeat(300);
    u.task_states.insert("main".into(), ts);
    let err = client
        .update_allocations(update_req("n1", SECRET, &[u]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("task_states.main.task_id"),
        "{err:?}"
    );
    assert_eq!(
        s.server.allocation(&alloc).unwrap().client_status,
        ClientStatus::Pending
    );

    // Long texts for people are kept, cut to 4 KiB (on a character boundary).
    let mut u = upd(&alloc, ClientStatus::Running);
    u.client_description = "é".repeat(10_000);
    u.task_states
        .insert("main".into(), running("m".repeat(10_000)));
    client
        .update_allocations(update_req("n1", SECRET, &[u]))
        .await
        .unwrap();
    let a = s.server.allocation(&alloc).unwrap();
    assert_eq!(a.client_status, ClientStatus::Running);
    assert_eq!(a.client_description.len(), 4096);
    assert!(a.client_description.chars().all(|c| c == 'é'));
    assert_eq!(a.task_states["main"].message.len(), 4096);
    s.stop().await;
}
