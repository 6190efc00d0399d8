//! Real agents join a real server over the node RPCs (127.0.0.1): the node shows up
//! `ready` with its drivers and metadata; an agent with a wrong token is refused and
//! the server keeps serving the others.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use drover_server::rpc::{RpcOptions, serve};
use drover_server::store::MemStore;
use drover_server::{Server, ServerConfig};
use drover_server_api::NodeStatus;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(30);

fn token_file(dir: &std::path::Path, name: &str, token: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, token).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

#[test]
fn agents_join_a_server_and_a_wrong_token_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let server = rt
        .block_on(Server::start(
            ServerConfig::new(root.path().join("server")),
            Arc::new(MemStore::default()),
            stop.clone(),
        ))
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    rt.spawn(serve(
        server.clone(),
        listener,
        RpcOptions {
            token: Some("right-token".into()),
            tls: None,
            ..RpcOptions::default()
        },
        None,
        stop.clone(),
    ));

    let join = |name: &str, token: &str| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(dir.join("plugins")).unwrap();
        let token = token_file(root.path(), &format!("{name}.token"), token);
        let mut agent = Agent::start(
            &dir,
            &dir.join("plugins"),
            &[
                "--servers",
                &addr,
                "--node-name",
                name,
                "--meta",
                "rack=r1",
                "--token-file",
                &token,
            ],
        );
        agent.end_tasks = true;
        agent
    };
    let good = join("good", "right-token");
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "node good ready with rawexec healthy",
        || {
            server.nodes().iter().any(|n| {
                n.name == "good"
                    && n.status == NodeStatus::Ready
                    && n.meta.get("rack").map(String::as_str) == Some("r1")
                    && n.drivers.get("raw_exec").is_some_and(|d| d.healthy)
            })
        },
    );
    let id = std::fs::read_to_string(good.data_dir.join("node-id")).unwrap();
    assert!(server.node(id.trim()).is_ok());

    let bad = join("bad", "wrong-token");
    // The refused agent keeps trying (and logs why); the server never sees it, and
    // the good node stays ready through several of the bad one's attempts.
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "the refused agent to log the refusal",
        || bad.log_text().contains("Unauthenticated"),
    );
    assert!(server.nodes().iter().all(|n| n.name != "bad"));
    assert!(
        server
            .nodes()
            .iter()
            .any(|n| n.name == "good" && n.status == NodeStatus::Ready)
    );
    assert!(
        !bad.log_text().contains("wrong-token"),
        "the token is never logged"
    );
    drop(bad);
    drop(good);
    stop.cancel();
}
