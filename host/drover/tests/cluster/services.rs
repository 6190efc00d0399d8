//! Services and checks end to end (issue 25, acceptance 3): a dev agent runs a
//! `python3 -m http.server` task (raw_exec) that serves a directory with a file
//! `health`; its service's http check asks for `/health` every second. Removing the
//! file turns the instance critical within two intervals and it leaves the healthy
//! results of `/v1/service/<name>` (`drover service info`); putting it back brings
//! it back. With `check_restart { limit = 2 }` the task is restarted after two
//! failures (its restart count goes up, an event says why).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{allocs_with, job_file, python3, wait_dev_node_ready, wait_job};
use serde_json::Value;

fn dev_agent(root: &Path) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut agent = Agent::start(root, &plugins, &["--dev"]);
    agent.end_tasks = true;
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    agent
}

/// A job of one group whose task serves `dir` on its dynamic port `http` (a check
/// probes only a port label of the group's network), with a service `name` on that
/// port checked over HTTP every second.
fn web_job(name: &str, dir: &Path, python: &str, check_restart: &str) -> String {
    format!(
        r#"
name = "{name}"
type = "service"

[[group]]
name = "app"

[group.network]
mode = "host"

[[group.network.port]]
label = "http"

[[group.service]]
name = "{name}"
port = "http"
tags = ["web", "v1"]
task = "srv"
{check_restart}

[[group.service.check]]
name = "health"
type = "http"
path = "/health"
interval = "1s"
timeout = "1s"

[[group.task]]
name = "srv"
driver = "raw_exec"
config = {{ command = "{python}", args = ["-m", "http.server", "${{NOMAD_PORT_http}}", "--bind", "${{NOMAD_IP_http}}", "--directory", "{dir}"] }}
resources = {{ cpu = 100, memory_mb = 64 }}
"#,
        dir = dir.display(),
    )
}

/// `drover service info NAME --json [--all]`.
fn instances(agent: &Agent, name: &str, all: bool) -> Vec<Value> {
    let mut args = vec!["service", "info", name, "--json"];
    if all {
        args.push("--all");
    }
    agent
        .cli_json(&args)
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Poll until `cond` holds for the service's instances (all of them with `all`);
/// the time it took.
fn wait_instances(
    agent: &Agent,
    name: &str,
    all: bool,
    what: &str,
    limit: Duration,
    cond: impl Fn(&[Value]) -> bool,
) -> (Duration, Vec<Value>) {
    let began = Instant::now();
    loop {
        let v = instances(agent, name, all);
        if cond(&v) {
            return (began.elapsed(), v);
        }
        assert!(
            began.elapsed() < limit,
            "{what}: not within {limit:?}; last: {v:#?}\nagent log:\n{}",
            common::cluster::tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_failing_check_turns_the_instance_critical_and_check_restart_restarts_the_task() {
    let Some(python) = python3() else { return };
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());

    // --- a check that starts failing, then passes again ----------------------------
    let www = root.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("health"), "ok\n").unwrap();
    let file = job_file(root.path(), "flip", &web_job("flip", &www, &python, ""));
    let out = agent.cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_job(&agent, "flip", "the allocation running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let alloc = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, healthy) = wait_instances(
        &agent,
        "flip",
        false,
        "the instance registered and passing",
        Duration::from_secs(30),
        |v| v.len() == 1,
    );
    let r = &healthy[0];
    // The scheduler's dynamic port for label `http`, probed by the check.
    let port = r["Port"].as_u64().expect("the dynamic port's number");
    assert!((20000..=32000).contains(&port), "{r:#}");
    assert_eq!(r["ServiceName"], "flip");
    assert_eq!(r["AllocID"], alloc.as_str());
    assert_eq!(r["JobID"], "flip");
    assert_eq!(r["Address"], "127.0.0.1");
    assert_eq!(r["Status"], "passing");
    assert_eq!(r["Tags"], serde_json::json!(["web", "v1"]));
    assert_eq!(r["ID"], format!("_nomad-task-{alloc}-group-app-flip-http"));
    let listed = agent.cli_json(&["service", "list", "--json"]);
    assert!(
        listed[0]["Services"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["ServiceName"] == "flip"),
        "{listed:#}"
    );

    std::fs::remove_file(www.join("health")).unwrap();
    // Two intervals, plus a run's timeout and the report's way to the server.
    let (took, _) = wait_instances(
        &agent,
        "flip",
        false,
        "the instance leaving the healthy results",
        Duration::from_secs(15),
        |v| v.is_empty(),
    );
    assert!(
        took <= Duration::from_secs(4),
        "left the healthy results only after {took:?}"
    );
    let all = instances(&agent, "flip", true);
    assert_eq!(all.len(), 1, "still registered: {all:#?}");
    assert_eq!(all[0]["Status"], "critical");
    let output = all[0]["Checks"][0]["Output"].as_str().unwrap_or_default();
    assert_eq!(
        output, "HTTP GET /health: 404 Not Found",
        "the status line only, never the body"
    );
    let table = agent.cli(&["service", "info", "flip", "--all"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("critical") && table.contains(&format!("127.0.0.1:{port}")),
        "{table}"
    );

    std::fs::write(www.join("health"), "ok\n").unwrap();
    wait_instances(
        &agent,
        "flip",
        false,
        "the instance back in the healthy results",
        Duration::from_secs(15),
        |v| v.len() == 1 && v[0]["Status"] == "passing",
    );
    let restarts = wait_job(&agent, "flip", "the task", |v| {
        allocs_with(v, "running").len() == 1
    });
    assert_eq!(
        allocs_with(&restarts, "running")[0]["task_states"]["srv"]["restarts"],
        0,
        "without check_restart the task is not restarted"
    );

    // --- check_restart { limit = 2 } ---------------------------------------------
    let www2 = root.path().join("www2");
    std::fs::create_dir_all(&www2).unwrap();
    std::fs::write(www2.join("health"), "ok\n").unwrap();
    let file = job_file(
        root.path(),
        "heal",
        &web_job("heal", &www2, &python, "check_restart = { limit = 2 }"),
    );
    let out = agent.cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_instances(
        &agent,
        "heal",
        false,
        "the second service passing",
        Duration::from_secs(30),
        |v| v.len() == 1,
    );
    std::fs::remove_file(www2.join("health")).unwrap();
    let restarted = wait_job(&agent, "heal", "the task restarted by its check", |v| {
        allocs_with(v, "running").first().is_some_and(|a| {
            a["task_states"]["srv"]["restarts"]
                .as_u64()
                .is_some_and(|n| n >= 1)
        })
    });
    let a = allocs_with(&restarted, "running")[0];
    let alloc2 = a["id"].as_str().unwrap().to_owned();
    std::fs::write(www2.join("health"), "ok\n").unwrap();
    // Served again by the restarted task, in the same allocation.
    wait_instances(
        &agent,
        "heal",
        false,
        "the restarted task's instance passing",
        Duration::from_secs(30),
        |v| v.len() == 1 && v[0]["AllocID"] == alloc2.as_str(),
    );
    let task_id = a["task_states"]["srv"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let task = agent.cli_json(&["task", "status", &task_id, "--json"]);
    assert!(
        task["events"].as_array().unwrap().iter().any(|e| {
            e["type"] == "Restarting"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("failed 2 times in a row"))
        }),
        "an event says why: {task:#}"
    );

    // Stopping the job deregisters its instances.
    let out = agent.cli(&["job", "stop", "heal"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_instances(
        &agent,
        "heal",
        true,
        "the stopped job's instance deregistered",
        Duration::from_secs(30),
        |v| v.is_empty(),
    );
}
