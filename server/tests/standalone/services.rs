//! Service registrations (Nomad's native discovery) on a real redb store, served over
//! real HTTP on 127.0.0.1: registered by a node's status reports, served healthy-only
//! by `/v1/service/<name>` (all with `?all=true`), woken blocking queries, refused for
//! another node's allocation, removed with their allocation or their lost node, kept
//! across a server restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use drover_server_api::{
    AllocClientUpdate, CheckStatus, ClientStatus, NodeStatus, ServiceHealth, ServiceInstance,
};
use drover_test_support::until;
use http_body_util::BodyExt as _;
use serde_json::Value;

/// Serve the HTTP API of `s` on 127.0.0.1.
async fn http(s: &Running) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = drover_server::http::router(s.server.clone(), None);
    tokio::spawn(drover_server::http::serve(
        router,
        listener,
        None,
        s.shutdown.clone(),
    ));
    addr
}

/// One request: status, X-Nomad-Index, JSON body.
async fn call(addr: SocketAddr, method: hyper::Method, path: &str) -> (u16, u64, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let index = resp
        .headers()
        .get("X-Nomad-Index")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, index, json)
}

async fn get(addr: SocketAddr, path: &str) -> (u64, Value) {
    let (status, index, json) = call(addr, hyper::Method::GET, path).await;
    assert_eq!(status, 200, "GET {path}: {json}");
    (index, json)
}

fn instance(name: &str, port: u16, health: ServiceHealth) -> ServiceInstance {
    ServiceInstance {
        service_name: name.into(),
        owner: "group-web".into(),
        port_label: "http".into(),
        tags: vec!["v1".into(), "edge".into()],
        address: "127.0.0.1".into(),
        port,
        health,
        checks: vec![CheckStatus {
            name: "alive".into(),
            status: health,
            output: "HTTP GET /health: 200 OK".into(),
        }],
    }
}

fn report(alloc: &str, status: ClientStatus, services: Vec<ServiceInstance>) -> AllocClientUpdate {
    AllocClientUpdate {
        healthy: Default::default(),
        id: alloc.into(),
        client_status: status,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        services: Some(services),
    }
}

/// A server with node n1 (and n2) and one allocation of job `web` on n1.
async fn with_alloc(s: &Running) -> String {
    for n in ["n1", "n2"] {
        s.server
            .register_node(node(n, 1000, 1000), SECRET)
            .await
            .unwrap();
    }
    s.server
        .register_job(job("web", 1, 100, 100))
        .await
        .unwrap();
    s.server
        .apply_plan(plan(
            &s.server,
            "web",
            vec![("n1", placement("web", 0, 100, 100))],
        ))
        .await
        .unwrap();
    s.server.node_allocations("n1")[0].id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_are_served_healthy_only_wake_blocking_queries_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let alloc = with_alloc(&s).await;
    let addr = http(&s).await;
    assert_eq!(get(addr, "/v1/services").await.1, serde_json::json!([]));

    let index = s
        .server
        .update_allocations(
            "n1",
            vec![report(
                &alloc,
                ClientStatus::Running,
                vec![
                    instance("web", 23456, ServiceHealth::Passing),
                    instance("db", 23457, ServiceHealth::Critical),
                ],
            )],
        )
        .await
        .unwrap();
    let (at, list) = get(addr, "/v1/services").await;
    assert!(at >= index);
    assert_eq!(list[0]["Namespace"], "default");
    let names: Vec<&str> = list[0]["Services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ServiceName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["db", "web"]);
    assert_eq!(
        list[0]["Services"][1]["Tags"],
        serde_json::json!(["edge", "v1"])
    );

    let (_, web) = get(addr, "/v1/service/web").await;
    let web = web.as_array().unwrap();
    assert_eq!(web.len(), 1, "{web:?}");
    let r = &web[0];
    assert_eq!(r["ID"], format!("_nomad-task-{alloc}-group-web-web-http"));
    assert_eq!(r["ServiceName"], "web");
    assert_eq!(r["Namespace"], "default");
    assert_eq!(r["NodeID"], "n1");
    assert_eq!(r["Datacenter"], "dc1");
    assert_eq!(r["JobID"], "web");
    assert_eq!(r["AllocID"], alloc.as_str());
    assert_eq!(r["Address"], "127.0.0.1");
    assert_eq!(r["Port"], 23456);
    assert_eq!(r["Status"], "passing");
    assert_eq!(r["CreateIndex"], index);
    // The critical instance is registered, not served as healthy.
    assert_eq!(get(addr, "/v1/service/db").await.1, serde_json::json!([]));
    let (_, all) = get(addr, "/v1/service/db?all=true").await;
    assert_eq!(all[0]["Status"], "critical");
    assert_eq!(all[0]["Checks"][0]["Output"], "HTTP GET /health: 200 OK");

    // A blocking query on web returns when web turns critical: it leaves the list.
    let (settled, _) = get(addr, "/v1/service/web").await;
    let waiter = tokio::spawn(async move {
        get(addr, &format!("/v1/service/web?index={settled}&wait=20s")).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the blocking query waits");
    let turned = s
        .server
        .update_allocations(
            "n1",
            vec![report(
                &alloc,
                ClientStatus::Running,
                vec![
                    instance("web", 23456, ServiceHealth::Critical),
                    instance("db", 23457, ServiceHealth::Critical),
                ],
            )],
        )
        .await
        .unwrap();
    let (woke_at, list) = tokio::time::timeout(LONG, waiter).await.unwrap().unwrap();
    assert!(woke_at >= turned, "{woke_at} < {turned}");
    assert_eq!(list, serde_json::json!([]));
    let (_, all) = get(addr, "/v1/service/web?all=true").await;
    assert_eq!(all[0]["ModifyIndex"], turned);
    assert_eq!(
        all[0]["CreateIndex"], index,
        "the same registration, changed"
    );

    // Passing again: back in the list. Then a restart from the store keeps it.
    s.server
        .update_allocations(
            "n1",
            vec![report(
                &alloc,
                ClientStatus::Running,
                vec![instance("web", 23456, ServiceHealth::Passing)],
            )],
        )
        .await
        .unwrap();
    let (_, web) = get(addr, "/v1/service/web").await;
    assert_eq!(web.as_array().unwrap().len(), 1);
    assert_eq!(
        get(addr, "/v1/service/db?all=true").await.1,
        serde_json::json!([]),
        "left out of the allocation's set: deregistered"
    );
    s.stop().await;

    let s = start(config(dir.path())).await;
    let addr = http(&s).await;
    let (_, kept) = get(addr, "/v1/service/web").await;
    assert_eq!(kept, web, "kept in the store across a restart");

    // The allocation completes: its registrations go in the same commit.
    let done = s
        .server
        .update_allocations("n1", vec![report(&alloc, ClientStatus::Complete, vec![])])
        .await
        .unwrap();
    let (at, all) = get(addr, "/v1/service/web?all=true").await;
    assert!(at >= done);
    assert_eq!(all, serde_json::json!([]));
    // A report after that registers nothing for the ended allocation.
    s.server
        .update_allocations(
            "n1",
            vec![report(
                &alloc,
                ClientStatus::Complete,
                vec![instance("web", 23456, ServiceHealth::Passing)],
            )],
        )
        .await
        .unwrap();
    assert_eq!(
        get(addr, "/v1/service/web?all=true").await.1,
        serde_json::json!([])
    );
    assert_eq!(get(addr, "/v1/services").await.1, serde_json::json!([]));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_register_for_another_nodes_allocation_and_too_many_or_too_long_are_skipped()
{
    let dir = tempfile::tempdir().unwrap();
    let s = start(config(dir.path())).await;
    let alloc = with_alloc(&s).await;
    let addr = http(&s).await;
    let err = s
        .server
        .update_allocations(
            "n2",
            vec![report(
                &alloc,
                ClientStatus::Running,
                vec![instance("web", 1, ServiceHealth::Passing)],
            )],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("belongs to node n1"), "{err}");
    // Services the server cannot keep are skipped, not the node's report: its
    // allocation's status is still taken.
    let too_many = (0..65)
        .map(|i| instance(&format!("s{i}"), 1, ServiceHealth::Passing))
        .collect();
    s.server
        .update_allocations("n1", vec![report(&alloc, ClientStatus::Running, too_many)])
        .await
        .unwrap();
    assert_eq!(get(addr, "/v1/services").await.1, serde_json::json!([]));
    assert_eq!(
        s.server.allocation(&alloc).unwrap().client_status,
        ClientStatus::Running,
        "the report is taken without its services"
    );
    let mut long = instance("web", 1, ServiceHealth::Passing);
    long.tags = vec!["t".repeat(300)];
    s.server
        .update_allocations(
            "n1",
            vec![report(&alloc, ClientStatus::Running, vec![long])],
        )
        .await
        .unwrap();
    assert_eq!(get(addr, "/v1/services").await.1, serde_json::json!([]));
    // A check's output is kept cut to a bound: it is replicated with every change.
    let mut loud = instance("web", 1, ServiceHealth::Passing);
    loud.checks[0].output = "o".repeat(10_000);
    s.server
        .update_allocations(
            "n1",
            vec![report(&alloc, ClientStatus::Running, vec![loud])],
        )
        .await
        .unwrap();
    let all = get(addr, "/v1/service/web?all=true").await.1;
    assert_eq!(
        all[0]["Checks"][0]["Output"].as_str().map(str::len),
        Some(drover_server_api::MAX_CHECK_OUTPUT_BYTES),
        "{all}"
    );
    assert_eq!(drover_server_api::MAX_CHECK_OUTPUT_BYTES, 256);

    // DELETE removes one registration (its client registers it again next report).
    s.server
        .update_allocations(
            "n1",
            vec![report(
                &alloc,
                ClientStatus::Running,
                vec![instance("web", 23456, ServiceHealth::Passing)],
            )],
        )
        .await
        .unwrap();
    let id = format!("_nomad-task-{alloc}-group-web-web-http");
    let (status, _, _) = call(
        addr,
        hyper::Method::DELETE,
        &format!("/v1/service/web/{id}"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        get(addr, "/v1/service/web?all=true").await.1,
        serde_json::json!([])
    );
    let (status, _, _) = call(
        addr,
        hyper::Method::DELETE,
        &format!("/v1/service/web/{id}"),
    )
    .await;
    assert_eq!(status, 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_nodes_registrations_are_removed_when_its_allocations_are_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.heartbeat_ttl = Duration::from_millis(500);
    cfg.heartbeat_grace = Duration::from_millis(500);
    let s = start(cfg).await;
    let alloc = with_alloc(&s).await;
    let addr = http(&s).await;
    s.server
        .update_allocations(
            "n1",
            vec![report(
                &alloc,
                ClientStatus::Running,
                vec![instance("web", 23456, ServiceHealth::Passing)],
            )],
        )
        .await
        .unwrap();
    assert_eq!(
        get(addr, "/v1/service/web")
            .await
            .1
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let srv = s.server.clone();
    until(LONG, "n1 is down", || {
        srv.node("n1").unwrap().status == NodeStatus::Down
    })
    .await;
    assert_eq!(
        s.server.allocation(&alloc).unwrap().client_status,
        ClientStatus::Lost
    );
    assert_eq!(
        get(addr, "/v1/service/web?all=true").await.1,
        serde_json::json!([]),
        "removed with the lost allocation"
    );
    s.stop().await;
}
