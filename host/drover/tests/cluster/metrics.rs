//! `/v1/metrics` (issue 28, acceptance 1): the dev agent's metrics, on its HTTP
//! address (server and agent in one exposition) and on the agent's socket, parse with
//! the Prometheus Python client's text parser, and move as work happens: five task
//! starts raise the task-start counter by exactly five; a client agent that stops
//! heartbeating shows as a missed heartbeat and a down node in the server's metrics.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{
    ServerProc, allocs_with, client_agent, free_port, job_file, tail, wait_dev_node_ready, wait_job,
};
use common::{Agent, nix_kill};
use serde_json::Value;

/// A scrape as the Prometheus Python parser read it.
struct Scrape {
    content_type: String,
    types: serde_json::Map<String, Value>,
    samples: Vec<(String, serde_json::Map<String, Value>, f64)>,
}

impl Scrape {
    /// The value of the one sample named `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self.samples.iter().filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).and_then(Value::as_str) == Some(v))
        });
        let (_, _, v) = found.next()?;
        assert!(
            found.next().is_none(),
            "{name} {labels:?}: more than one sample"
        );
        Some(*v)
    }

    fn family_type(&self, family: &str) -> Option<&str> {
        self.types.get(family).and_then(Value::as_str)
    }
}

/// Scrape `target` (`http://127.0.0.1:PORT` or `unix:/path`) and parse it with
/// `prometheus_client.parser.text_string_to_metric_families`.
fn scrape(python: &Path, target: &str) -> Scrape {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/python/metrics_parse.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(target)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "the Prometheus parser refused {target}/v1/metrics?format=prometheus:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    Scrape {
        content_type: v["content_type"].as_str().unwrap_or_default().to_owned(),
        types: v["types"].as_object().cloned().unwrap_or_default(),
        samples: v["samples"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s[0].as_str().unwrap_or_default().to_owned(),
                    s[1].as_object().cloned().unwrap_or_default(),
                    s[2].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect(),
    }
}

/// Acceptance 1: after five task starts the counter rose by exactly five, on the dev
/// agent's HTTP address and on its socket alike; both expositions parse.
#[test]
fn dev_agent_metrics_parse_and_count_five_task_starts() {
    let Some(python) = drover_test_support::nomad::python_prometheus() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(root.path(), &plugins, &["--dev", "--dev-http-addr", &addr]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    let http = format!("http://{addr}");
    let socket = format!("unix:{}", agent.socket.display());

    let before = scrape(&python, &http);
    assert!(
        before.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        before.content_type
    );
    // Typed families of both parts: the server's and the agent's, merged.
    for (family, kind) in [
        ("drover_agent_task_starts", "counter"),
        (
            "drover_agent_plugin_handshake_duration_seconds",
            "histogram",
        ),
        ("drover_agent_tasks", "gauge"),
        ("drover_server_heartbeats_missed", "counter"),
        ("drover_server_is_leader", "gauge"),
        ("drover_server_store_commit_duration_seconds", "histogram"),
        ("drover_server_http_requests", "counter"),
    ] {
        assert_eq!(before.family_type(family), Some(kind), "{family}");
    }
    assert_eq!(before.value("drover_server_is_leader", &[]), Some(1.0));
    assert_eq!(
        before.value("drover_server_nodes", &[("status", "ready")]),
        Some(1.0)
    );
    let starts_before = before
        .value("drover_agent_task_starts_total", &[])
        .expect("a task start counter");

    let marker = format!("{}", 200_000 + std::process::id() % 100_000);
    let job = job_file(
        root.path(),
        "five",
        &format!(
            r#"
name = "five"
type = "service"

[[group]]
name = "g"
count = 5

[[group.task]]
name = "t"
driver = "rawexec"
config = {{ command = "/bin/sleep", args = ["{marker}"] }}
"#
        ),
    );
    let out = agent.cli(&["job", "run", job.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&agent.log_text())
    );
    wait_job(&agent, "five", "five running allocations", |v| {
        allocs_with(v, "running").len() == 5
    });

    let after = scrape(&python, &http);
    let starts_after = after.value("drover_agent_task_starts_total", &[]).unwrap();
    assert_eq!(
        starts_after - starts_before,
        5.0,
        "task starts moved by five"
    );
    assert_eq!(
        after.value("drover_agent_tasks", &[("state", "running")]),
        Some(5.0)
    );
    assert_eq!(
        after.value("drover_server_allocations", &[("status", "running")]),
        Some(5.0)
    );
    assert_eq!(
        after.value("drover_server_jobs", &[("status", "running")]),
        Some(1.0)
    );
    // The scheduler and the plan applier ran; the HTTP layer saw the scrapes by route.
    assert!(
        after
            .value(
                "drover_server_scheduler_placement_duration_seconds_count",
                &[]
            )
            .unwrap()
            >= 1.0
    );
    assert!(
        after
            .value("drover_server_plans_applied_total", &[])
            .unwrap()
            >= 1.0
    );
    assert!(
        after
            .value(
                "drover_server_http_requests_total",
                &[
                    ("route", "/v1/metrics"),
                    ("method", "GET"),
                    ("status", "2xx")
                ],
            )
            .unwrap()
            >= 1.0
    );
    // The public exposition (no token) shows no allocation ids or task names: those
    // are on the agent's socket only (Nomad publishes them only when told to).
    assert!(
        !after
            .samples
            .iter()
            .any(|(n, _, _)| n.starts_with("drover_agent_alloc_")),
        "allocation series on the public address"
    );

    // The agent's socket: its own metrics, the same counter, and each running
    // allocation task's memory, labelled by allocation and task.
    let own = scrape(&python, &socket);
    assert_eq!(
        own.value("drover_agent_task_starts_total", &[]),
        Some(starts_after)
    );
    let rss: Vec<_> = own
        .samples
        .iter()
        .filter(|(n, l, _)| n == "drover_agent_alloc_memory_rss_bytes" && l["task"] == "t")
        .collect();
    assert_eq!(rss.len(), 5, "one memory series per allocation");
    assert!(rss.iter().all(|(_, _, v)| *v > 0.0), "{rss:?}");
    assert_eq!(own.family_type("drover_server_is_leader"), None);
}

/// Acceptance 1: a client agent that stops heartbeating (SIGSTOP) shows in its
/// server's metrics: a missed heartbeat, and the node down.
#[test]
fn a_missed_heartbeat_shows_in_the_servers_metrics() {
    let Some(python) = drover_test_support::nomad::python_prometheus() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let server = ServerProc::start(root.path(), "1s", &[]);
    let agent = client_agent(root.path(), &server, "n1", &[]);
    server.wait_node_status("n1", "ready", Duration::from_secs(30), "n1 is ready");
    let http = format!("http://127.0.0.1:{}", server.http);
    let before = scrape(&python, &http);
    let missed_before = before
        .value("drover_server_heartbeats_missed_total", &[])
        .expect("a missed heartbeat counter");
    assert_eq!(
        before.value("drover_server_nodes", &[("status", "down")]),
        Some(0.0)
    );

    /// Lets the stopped agent go on, whatever happens (its Drop stops it).
    struct Continue(u32);
    impl Drop for Continue {
        fn drop(&mut self) {
            let _ = nix_kill(self.0, 18);
        }
    }
    nix_kill(agent.child.id(), 19).expect("SIGSTOP the agent");
    let _continue = Continue(agent.child.id());

    let mut shown = None;
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(200),
        "the server's metrics show the missed heartbeat and the node down",
        || {
            let s = scrape(&python, &http);
            let missed = s.value("drover_server_heartbeats_missed_total", &[]);
            let down = s.value("drover_server_nodes", &[("status", "down")]);
            shown = Some(s);
            missed == Some(missed_before + 1.0) && down == Some(1.0)
        },
    );
    let shown = shown.unwrap();
    assert_eq!(
        shown.value("drover_server_nodes", &[("status", "ready")]),
        Some(0.0)
    );
    server.wait_node_status("n1", "down", Duration::from_secs(5), "n1 is down");
}
