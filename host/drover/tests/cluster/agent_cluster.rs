//! `drover agent --servers`: the real agent, with its built-in drivers, joins a cluster
//! through a Node service on 127.0.0.1 that records what it is sent (the server core is
//! tested on its own). Bad cluster settings stop the agent with the setting named.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::NodeRegistration;
use pb::node_server::{Node, NodeServer};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

const LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
enum Call {
    Register(Box<NodeRegistration>),
    Heartbeat(String),
    Watch(String, u64),
}

#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    tokens: Mutex<Vec<Option<String>>>,
    /// The node secret of every register, heartbeat and watch call.
    secrets: Mutex<Vec<String>>,
    watches: Mutex<Vec<tokio::sync::mpsc::Sender<Result<pb::AllocationsUpdate, Status>>>>,
}

#[derive(Clone)]
struct Fake(Arc<Recorder>);

impl Fake {
    fn secret(&self, secret: &str) {
        self.0.secrets.lock().unwrap().push(secret.to_owned());
    }

    fn see<T>(&self, r: &Request<T>, call: Call) {
        let t = r
            .metadata()
            .get("x-drover-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.0.tokens.lock().unwrap().push(t);
        self.0.calls.lock().unwrap().push(call);
    }
}

#[tonic::async_trait]
impl Node for Fake {
    async fn register(
        &self,
        r: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let reg: NodeRegistration = serde_json::from_slice(&r.get_ref().node_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.secret(&r.get_ref().node_secret);
        self.see(&r, Call::Register(Box::new(reg)));
        Ok(Response::new(pb::RegisterResponse {
            heartbeat_ttl_ms: 1000,
            index: 1,
        }))
    }
    async fn heartbeat(
        &self,
        r: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.secret(&r.get_ref().node_secret);
        self.see(&r, Call::Heartbeat(r.get_ref().node_id.clone()));
        Ok(Response::new(pb::HeartbeatResponse {
            heartbeat_ttl_ms: 1000,
            index: 1,
        }))
    }
    type WatchAllocationsStream = ReceiverStream<Result<pb::AllocationsUpdate, Status>>;
    async fn watch_allocations(
        &self,
        r: Request<pb::WatchAllocationsRequest>,
    ) -> Result<Response<Self::WatchAllocationsStream>, Status> {
        let req = r.get_ref().clone();
        self.secret(&req.node_secret);
        self.see(&r, Call::Watch(req.node_id, req.index));
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        // The complete set, empty: this node has no allocations.
        tx.send(Ok(pb::AllocationsUpdate {
            index: 1,
            complete: true,
            allocations_json: vec![],
        }))
        .await
        .unwrap();
        self.0.watches.lock().unwrap().push(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
    async fn update_allocations(
        &self,
        _r: Request<pb::UpdateAllocationsRequest>,
    ) -> Result<Response<pb::UpdateAllocationsResponse>, Status> {
        Ok(Response::new(pb::UpdateAllocationsResponse { index: 1 }))
    }
}

/// A recording Node service on 127.0.0.1, served by `rt`.
fn fake_server(rt: &tokio::runtime::Runtime) -> (Arc<Recorder>, String) {
    let rec = Arc::new(Recorder::default());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let svc = NodeServer::new(Fake(rec.clone()));
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (rec, addr)
}

fn registrations(rec: &Recorder) -> Vec<NodeRegistration> {
    rec.calls
        .lock()
        .unwrap()
        .iter()
        .filter_map(|c| match c {
            Call::Register(r) => Some((**r).clone()),
            _ => None,
        })
        .collect()
}

fn token_file(dir: &Path, mode: u32) -> String {
    let path = dir.join("cluster.token");
    std::fs::write(&path, "tok-123\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.display().to_string()
}

#[test]
fn an_agent_with_servers_registers_its_node_heartbeats_and_watches() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (rec, addr) = fake_server(&rt);
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let token = token_file(root.path(), 0o600);
    let args = [
        "--servers",
        addr.as_str(),
        "--node-name",
        "edge-1",
        "--meta",
        "rack=r1",
        "--meta",
        "zone=z9",
        "--token-file",
        token.as_str(),
    ];
    let mut agent = Agent::start(root.path(), &plugins, &args);
    agent.end_tasks = true;

    // Registered with the built-in rawexec healthy and docker, which has no daemon in
    // the tests, loaded but not detected: at once, or again once each driver's first
    // fingerprint arrived (the drivers fingerprint independently, so an earlier
    // registration may show docker still waiting for its first).
    let settled = |r: &NodeRegistration| {
        r.drivers
            .get("raw_exec")
            .is_some_and(|d| d.detected && d.healthy)
            && r.drivers
                .get("docker")
                .is_none_or(|d| !d.detected && !d.healthy)
    };
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "a registration with rawexec healthy and docker undetected",
        || registrations(&rec).iter().any(settled),
    );
    let reg = registrations(&rec)
        .into_iter()
        .rfind(settled)
        .expect("the registration just seen");
    assert_eq!(reg.name, "edge-1");
    assert_eq!(
        reg.meta,
        BTreeMap::from([("rack".into(), "r1".into()), ("zone".into(), "z9".into())])
    );
    assert!(
        reg.resources.cpu > 0 && reg.resources.memory_mb > 0,
        "{reg:?}"
    );
    assert_eq!(reg.attributes["kernel.name"], "linux");
    let id_file = agent.data_dir.join("node-id");
    let id = std::fs::read_to_string(&id_file).unwrap().trim().to_owned();
    assert_eq!(reg.id, id);
    assert_eq!(
        std::fs::metadata(&id_file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "heartbeats and a watch from 0",
        || {
            let calls = rec.calls.lock().unwrap();
            calls
                .iter()
                .filter(|c| matches!(c, Call::Heartbeat(n) if *n == id))
                .count()
                >= 2
                && calls
                    .iter()
                    .any(|c| matches!(c, Call::Watch(n, 0) if *n == id))
        },
    );
    assert!(
        rec.tokens
            .lock()
            .unwrap()
            .iter()
            .all(|t| t.as_deref() == Some("tok-123")),
        "every call carries the token"
    );
    assert!(
        !agent.log_text().contains("tok-123"),
        "the token is never logged"
    );
    // The node secret: made once, private, sent on every call, never logged.
    let secret_file = agent.data_dir.join("node-secret");
    let secret = std::fs::read_to_string(&secret_file)
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(secret.len(), 64, "{secret}");
    assert_eq!(
        std::fs::metadata(&secret_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(
        rec.secrets.lock().unwrap().iter().all(|s| *s == secret),
        "every call carries the node secret"
    );
    assert!(
        !agent.log_text().contains(&secret),
        "the node secret is never logged"
    );
    // The agent's own socket keeps serving beside the cluster client.
    assert!(agent.cli(&["plugin", "status"]).status.success());
    assert!(agent.stop().success());

    // The same data dir: the same node, watching from 0 again (a restart).
    let before = rec.calls.lock().unwrap().len();
    let mut again = Agent::start(root.path(), &plugins, &args);
    again.end_tasks = true;
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "the restarted agent's registration",
        || {
            rec.calls.lock().unwrap()[before..]
                .iter()
                .any(|c| matches!(c, Call::Register(r) if r.id == id))
        },
    );
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "the restarted agent's watch from 0",
        || {
            rec.calls.lock().unwrap()[before..]
                .iter()
                .any(|c| matches!(c, Call::Watch(n, 0) if *n == id))
        },
    );
    let secrets = rec.secrets.lock().unwrap().clone();
    assert!(
        secrets.len() > before && secrets.iter().all(|s| *s == secret),
        "the restarted agent presents the same secret"
    );
    assert_eq!(
        std::fs::read_to_string(&secret_file).unwrap().trim(),
        secret,
        "the secret file is kept across restarts"
    );
    assert!(again.stop().success());
}

/// Run `drover agent ARGS…` expecting it to exit by itself; (exit code, its stderr).
fn agent_refuses(root: &Path, args: &[&str]) -> (Option<i32>, String) {
    let log = root.join("refused.log");
    let mut child = Command::new(drover())
        .arg("agent")
        .arg("--data-dir")
        .arg(root.join("data"))
        .arg("--plugin-dir")
        .arg(root.join("plugins"))
        .args(args)
        .env("DOCKER_HOST", "unix:///nonexistent/drover-test/docker.sock")
        .env("DROVER_PLUGIN_PASS_ENV", "DOCKER_HOST,DROVER_TEST_MARKER")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drover_test_support::until_blocking(
            LIMIT,
            Duration::from_millis(20),
            "the agent to refuse and exit",
            || {
                status = child.try_wait().unwrap();
                status.is_some()
            },
        )
    }));
    if waited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the agent did not refuse to start; its log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let status = status.unwrap();
    assert!(!status.success());
    assert!(
        !root.join("data").join("api.sock").exists(),
        "a refused agent left its socket behind"
    );
    (status.code(), std::fs::read_to_string(&log).unwrap())
}

#[test]
fn bad_cluster_settings_stop_the_agent_naming_them() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();

    let token = token_file(root.path(), 0o644);
    let (_, log) = agent_refuses(
        root.path(),
        &["--servers", "127.0.0.1:4647", "--token-file", &token],
    );
    assert!(log.contains(&token) && log.contains("chmod"), "{log}");
    assert!(!log.contains("tok-123"), "the token is never logged: {log}");

    let (code, log) = agent_refuses(
        root.path(),
        &["--servers", "127.0.0.1:4647", "--meta", "rack"],
    );
    assert_eq!(code, Some(2));
    assert!(
        log.contains("--meta \"rack\"") && log.contains("KEY=VALUE"),
        "{log}"
    );

    let (_, log) = agent_refuses(root.path(), &["--servers", "127.0.0.1"]);
    assert!(
        log.contains("127.0.0.1") && log.contains("no port"),
        "{log}"
    );

    std::fs::create_dir_all(root.path().join("data")).unwrap();
    std::fs::set_permissions(
        root.path().join("data"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(root.path().join("data").join("node-id"), "garbage\n").unwrap();
    let (_, log) = agent_refuses(root.path(), &["--servers", "127.0.0.1:4647"]);
    assert!(log.contains("node-id") && log.contains("UUID"), "{log}");

    // A damaged node secret stops the agent too, naming the file, and is left alone.
    std::fs::remove_file(root.path().join("data").join("node-id")).unwrap();
    let secret_file = root.path().join("data").join("node-secret");
    std::fs::write(&secret_file, "damaged-secret\n").unwrap();
    let (_, log) = agent_refuses(root.path(), &["--servers", "127.0.0.1:4647"]);
    assert!(log.contains(&secret_file.display().to_string()), "{log}");
    assert!(
        !log.contains("damaged-secret"),
        "its content is not shown: {log}"
    );
    assert_eq!(
        std::fs::read_to_string(&secret_file).unwrap(),
        "damaged-secret\n"
    );
}
