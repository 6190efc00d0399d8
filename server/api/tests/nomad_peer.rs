//! The CLI's client against a real Nomad 1.0.18 dev agent: the paths, bodies, headers
//! and answers it uses are Nomad's, so it drives Nomad itself (register, plan, read
//! jobs, allocations with their task states, evaluations, nodes, stop). Skips loudly
//! without the Nomad programs (a failure under CI=true).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use drover_server_api::client::{Client, ClientOptions, QueryOptions};
use drover_server_api::{
    ClientStatus, DesiredStatus, EvalStatus, EvalTrigger, JobSpec, JobStatus, NodeStatus,
    TaskRunState,
};
use drover_test_support::net::free_local_addr;
use drover_test_support::within;

const LIMIT: Duration = Duration::from_secs(60);
const EVERY: Duration = Duration::from_millis(200);

/// A Nomad dev agent on free ports; stopped (SIGINT, then SIGKILL) when dropped.
struct NomadAgent {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl NomadAgent {
    fn start(nomad: &Path) -> NomadAgent {
        let dir = tempfile::tempdir().expect("temporary dir");
        let (http, rpc, serf) = (free_local_addr(), free_local_addr(), free_local_addr());
        let config = dir.path().join("agent.hcl");
        std::fs::write(
            &config,
            format!(
                "ports {{\n  http = {}\n  rpc = {}\n  serf = {}\n}}\n\
                 plugin \"raw_exec\" {{\n  config {{\n    enabled = true\n  }}\n}}\n",
                http.port(),
                rpc.port(),
                serf.port()
            ),
        )
        .expect("agent config");
        let log = std::fs::File::create(dir.path().join("agent.log")).expect("log file");
        let child = Command::new(nomad)
            .args([
                "agent",
                "-dev",
                "-bind",
                "127.0.0.1",
                "-network-interface",
                "lo",
            ])
            .arg("-config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("nomad agent starts");
        NomadAgent {
            child,
            address: format!("http://{http}"),
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("agent.log")).unwrap_or_default()
    }
}

impl Drop for NomadAgent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the Nomad agent's log ---\n{}", self.log());
        }
        // SIGINT lets the dev agent stop its tasks; SIGKILL if it does not end.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spec() -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": "peer",
        "datacenters": ["dc1"],
        "meta": {"owner": "drover"},
        "group": [{
            "name": "g",
            "count": 2,
            "task": [{
                "name": "t",
                "driver": "raw_exec",
                "config": {"command": "/bin/sh", "args": ["-c", "echo hello; exec sleep 300"]},
                "env": {"GREETING": "hi"},
                "resources": {"cpu": 50, "memory_mb": 32}
            }]
        }]
    }))
    .expect("a job spec")
}

/// A service job: a dynamic port, a group service and a task service with checks
/// (Nomad 1.0 registers them in Consul, which is not there: the task runs anyway).
fn web_spec() -> JobSpec {
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "peer-web",
        "datacenters": ["dc1"],
        "group": [{
            "name": "web",
            "network": {"mode": "host", "port": [{"label": "http"}]},
            "service": [{
                "name": "peer-web-group",
                "port": "http",
                "tags": ["v1"],
                "meta": {"team": "a"},
                "check": [{"name": "alive", "type": "tcp", "interval": "10s", "timeout": "2s"}]
            }],
            "task": [{
                "name": "server",
                "driver": "raw_exec",
                "config": {"command": "/bin/sh", "args": ["-c", "exec sleep 300"]},
                "resources": {"cpu": 50, "memory_mb": 32},
                "service": [{
                    "name": "peer-web-server",
                    "port": "http",
                    "check": [{
                        "name": "ready",
                        "type": "http",
                        "path": "/ready",
                        "interval": "5s",
                        "timeout": "1s",
                        "check_restart": {"limit": 3, "grace": "10s"}
                    }]
                }]
            }]
        }]
    }))
    .expect("a job spec");
    drover_server_api::validate(&spec).expect("a valid spec");
    spec
}

/// Polls a read of the client until `done` holds for its answer.
async fn wait_for<T, F, Fut>(what: &str, mut read: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, drover_server_api::client::Error>>,
{
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        match read().await {
            Ok(v) if done(&v) => return v,
            Ok(_) | Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(EVERY).await
            }
            Ok(_) => panic!("{what}: not true within {LIMIT:?}"),
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_drives_a_real_nomad_agent() {
    let Some(peers) = drover_test_support::nomad::peers() else {
        return;
    };
    let agent = NomadAgent::start(&peers.nomad());
    let c = Client::new(&agent.address, ClientOptions::default()).expect("client");
    let q = QueryOptions::default();

    // Nodes: the dev agent's own, ready with raw_exec.
    let nodes = wait_for(
        "a ready node with raw_exec",
        || async { c.nodes(&q).await.map(|a| a.value) },
        |nodes| {
            nodes.iter().any(|n| {
                n.status == NodeStatus::Ready
                    && n.drivers.get("raw_exec").is_some_and(|d| d.healthy)
            })
        },
    )
    .await;
    let node = c.node(&nodes[0].id, &q).await.expect("node").value;
    assert_eq!(node.datacenter, "dc1");
    assert!(node.attributes.contains_key("kernel.name"), "{node:?}");
    assert!(node.resources.cpu > 0 && node.resources.memory_mb > 0);

    // Plan, then register the job.
    let spec = spec();
    let plan = c.plan_job(&spec).await.expect("plan");
    assert!(plan.changed, "a new job is a change: {plan:?}");
    assert_eq!(plan.groups["g"].place, 2, "{plan:?}");
    let registered = c.register_job(&spec).await.expect("register");
    assert!(!registered.eval_id.is_empty());
    assert!(registered.index > 0);

    // Its allocations run, with their task states; a blocking query returns.
    let allocs = wait_for(
        "two running allocations",
        || async { c.job_allocations("peer", &q).await },
        |a| {
            a.value.len() == 2
                && a.value
                    .iter()
                    .all(|a| a.client_status == ClientStatus::Running)
        },
    )
    .await;
    let blocking = QueryOptions::blocking(allocs.index.saturating_sub(1), Duration::from_secs(5));
    let again = within(
        Duration::from_secs(10),
        "a blocking query on an older index",
        c.job_allocations("peer", &blocking),
    )
    .await
    .expect("blocking read");
    assert_eq!(again.value.len(), 2);
    let alloc = c
        .allocation(&allocs.value[0].id, &q)
        .await
        .expect("allocation")
        .value;
    assert_eq!(alloc.job_name, "peer");
    assert_eq!(alloc.group, "g");
    assert_eq!(alloc.name, format!("peer.g[{}]", alloc.index));
    assert_eq!((alloc.resources.cpu, alloc.resources.memory_mb), (50, 32));
    let task = &alloc.task_states["t"];
    assert_eq!(task.state, TaskRunState::Running);
    assert_eq!(task.starts, 1);
    assert!(task.started_at.is_some());
    assert_eq!(alloc.node_id, node.id);

    // The job as Nomad keeps it converts back into Drover's.
    let job = c.job("peer", &q).await.expect("job").value;
    assert_eq!(job.spec.name, "peer");
    assert_eq!(job.spec.datacenters, ["dc1"]);
    assert_eq!(job.spec.meta["owner"], "drover");
    let t = &job.spec.groups[0].tasks[0];
    assert_eq!(
        (job.spec.groups[0].count, t.driver.as_str()),
        (2, "raw_exec")
    );
    assert_eq!(t.config, spec.groups[0].tasks[0].config);
    assert_eq!(t.env["GREETING"], "hi");
    assert_eq!((t.resources.cpu, t.resources.memory_mb), (50, 32));
    let jobs = c.jobs(&q).await.expect("jobs").value;
    let stub = jobs.iter().find(|j| j.name == "peer").expect("listed");
    assert_eq!(stub.status, JobStatus::Running);
    assert_eq!(stub.summary["g"].running, 2);

    // Evaluations.
    let evals = c.job_evaluations("peer", &q).await.expect("evals").value;
    let first = evals
        .iter()
        .find(|e| e.id == registered.eval_id)
        .expect("the registration's evaluation");
    assert_eq!(first.triggered_by, EvalTrigger::JobRegister);
    assert_eq!(first.status, EvalStatus::Complete);
    let eval = c.evaluation(&first.id, &q).await.expect("eval").value;
    assert_eq!(eval.job_name, "peer");
    let all = c.evaluations(&q).await.expect("all evals").value;
    assert!(all.iter().any(|e| e.id == first.id));
    let on_node = c
        .node_allocations(&node.id, &q)
        .await
        .expect("node allocs")
        .value;
    assert_eq!(on_node.iter().filter(|a| a.job_name == "peer").count(), 2);

    // Ports and services: Nomad takes them as Drover sends them, places the port, and
    // its job, allocation and node read back into Drover's types.
    let web = web_spec();
    c.register_job(&web)
        .await
        .expect("register a job with ports");
    let running = wait_for(
        "a running allocation with a port",
        || async { c.job_allocations("peer-web", &q).await.map(|a| a.value) },
        |a| a.len() == 1 && a[0].client_status == ClientStatus::Running,
    )
    .await;
    let alloc = c
        .allocation(&running[0].id, &q)
        .await
        .expect("allocation")
        .value;
    assert_eq!(alloc.ports.len(), 1, "{:?}", alloc.ports);
    let port = &alloc.ports[0];
    assert_eq!(port.label, "http");
    assert!(
        (20000..=32000).contains(&port.value),
        "a port of Nomad's dynamic range: {port:?}"
    );
    assert_eq!(port.host_ip, "127.0.0.1");
    // Nomad's job (canonicalized by its server) reads back as the job Drover would
    // store from the same spec.
    let job = c.job("peer-web", &q).await.expect("job").value;
    let ours = drover_server_api::nomad::Job::from(&web)
        .to_spec()
        .expect("converts")
        .spec;
    let g = &job.spec.groups[0];
    assert_eq!(g.network, ours.groups[0].network);
    assert_eq!(g.services, ours.groups[0].services);
    assert_eq!(g.tasks[0].services, ours.groups[0].tasks[0].services);
    assert_eq!(node.network.address, "127.0.0.1", "{:?}", node.network);
    c.stop_job("peer-web", false).await.expect("stop");

    // Errors keep Nomad's status.
    let missing = c.job("no-such-job", &q).await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");

    // Stop: the allocations stop.
    let stopped = c.stop_job("peer", false).await.expect("stop");
    assert!(!stopped.eval_id.is_empty());
    wait_for(
        "the allocations stopped",
        || async { c.job_allocations("peer", &q).await.map(|a| a.value) },
        |a| {
            a.iter()
                .all(|a| a.desired_status == DesiredStatus::Stop && a.client_status.is_terminal())
        },
    )
    .await;
    let job = c.job("peer", &q).await.expect("job").value;
    assert!(job.stop);
    drop(agent);
}
