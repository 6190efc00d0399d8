//! Unmodified Nomad task drivers in a Drover agent's plugin_dir: the real Nomad 1.0.18
//! raw_exec and mock drivers (served as external plugins) and the unmodified
//! nomad-skeleton-driver-plugin, loaded, configured through their hclspec, running
//! tasks whose output lands in Drover's log files, and surviving agent and plugin
//! crashes. The programs come from `drover_test_support::nomad::peers`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::tasks::*;
use common::*;
use drover_api::{StopRequest, TaskLifecycle};
use drover_test_support::nomad::{NomadPeers, peers};

/// A plugin_dir with `files` (source, name in the dir) copied in, and an agent on it
/// with `config` (TOML).
fn agent_with(files: &[(&Path, &str)], config: &str) -> (tempfile::TempDir, Agent) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    for (src, name) in files {
        std::fs::copy(src, dir.join(name)).unwrap();
    }
    let file = root.path().join("agent.toml");
    std::fs::write(&file, config).unwrap();
    let mut agent = Agent::start(root.path(), &dir, &["--config", file.to_str().unwrap()]);
    agent.end_tasks = true;
    (root, agent)
}

/// An agent with Nomad's raw_exec as `raw_exec`, enabled, healthy.
fn raw_exec_agent(p: &NomadPeers) -> (tempfile::TempDir, Agent) {
    let (root, agent) = agent_with(
        &[(&p.raw_exec(), "raw_exec")],
        "[plugin.raw_exec]\nconfig = { enabled = true }\n",
    );
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    (root, agent)
}

fn sha256_hex(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a hash")
        .to_owned()
}

fn running(pid: u32) -> bool {
    drover_test_support::procs::alive(pid)
}

fn cli_ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?} failed ({}): {}{}\nagent log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        agent.log_text()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Start a task with the CLI; its id.
fn task_run(agent: &Agent, driver: &str, config: serde_json::Value) -> String {
    let out = cli_ok(
        agent,
        &[
            "task",
            "run",
            "--driver",
            driver,
            "--config",
            &config.to_string(),
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["id"].as_str().expect("task id").to_owned()
}

#[test]
fn the_unmodified_skeleton_loads_as_a_nomad_driver_with_its_config_checked_and_pins_honoured() {
    let Some(p) = peers() else { return };
    let skeleton = p.skeleton();

    // Loaded, as a Nomad driver, with its version and health (the skeleton's
    // fingerprint says "undetected": it is a template with nothing to detect).
    let (_root, agent) = agent_with(
        &[(&skeleton, "skeleton")],
        "[plugin.skeleton]\nconfig = { enabled = true }\n",
    );
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "test-plugin" && r["state"] != "skipped")
    });
    let r = row(&rows, "test-plugin");
    assert_eq!(r["protocol"], "nomad", "{r:#}");
    assert_eq!(r["version"], "0.0.1", "{r:#}");
    assert_eq!(r["api_version"], "0.1.0", "{r:#}");
    assert_eq!(r["source"], "external", "{r:#}");
    assert_eq!(r["state"], "undetected", "{r:#}");
    assert!(r["pid"].as_u64().is_some(), "{r:#}");
    let text = cli_ok(&agent, &["plugin", "status"]);
    let line = text
        .lines()
        .find(|l| l.starts_with("test-plugin"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" nomad "), "{line}");

    // Its task config is checked against its hclspec before anything starts: the
    // required `strconfig` missing, an unknown key named.
    let out = agent.cli(&[
        "task",
        "run",
        "--driver",
        "test-plugin",
        "--config",
        r#"{"boolcfg": true, "strconfg": "x"}"#,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("strconfg"), "{err}");
    assert!(err.contains("strconfig"), "{err}");
    // The skeleton answers StartTask without a task handle: refused with the reason,
    // nothing left behind.
    let out = agent.cli(&[
        "task",
        "run",
        "--driver",
        "test-plugin",
        "--config",
        r#"{"strconfig": "x"}"#,
        "--json",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("no task handle"), "{text}");
    drop(agent);

    // A bad key in its plugin config: not loaded, the key named.
    let (_root, agent) = agent_with(
        &[(&skeleton, "skeleton")],
        "[plugin.skeleton]\nconfig = { enabeld = true }\n",
    );
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter().any(|r| {
            r["path"].as_str().is_some_and(|p| p.ends_with("/skeleton")) && r["state"] == "skipped"
        })
    });
    let r = rows
        .iter()
        .find(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/skeleton")))
        .unwrap();
    let reason = r["reason"].as_str().unwrap();
    assert!(reason.contains("enabeld"), "{reason}");
    agent.assert_only_healthy_plugins_run(&rows);
    drop(agent);

    // Pins: the right hash loads it, a wrong one keeps it from running at all.
    let good = sha256_hex(&skeleton);
    let (_root, agent) = agent_with(
        &[(&skeleton, "skeleton")],
        &format!("[plugin.skeleton]\nsha256 = \"{good}\"\n"),
    );
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "test-plugin" && r["state"] == "undetected")
    });
    drop(agent);
    let bad = "0".repeat(64);
    let (_root, agent) = agent_with(
        &[(&skeleton, "skeleton")],
        &format!("[plugin.skeleton]\nsha256 = \"{bad}\"\n"),
    );
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "skeleton" && r["state"] == "skipped")
    });
    let reason = row(&rows, "skeleton")["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("sha256"), "{reason}");
    agent.assert_only_healthy_plugins_run(&rows);
}

#[test]
fn nomad_raw_exec_runs_tasks_with_logs_exit_codes_signals_and_stops() {
    let Some(p) = peers() else { return };
    let (_root, agent) = raw_exec_agent(&p);

    // Output in task logs, the exit code from task wait.
    let id = task_run(
        &agent,
        "raw_exec",
        serde_json::json!({"command": "/bin/sh", "args": ["-c", "echo hello-nomad; echo oops >&2; exit 3"]}),
    );
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stdout = cli_ok(&agent, &["task", "logs", &id]);
    assert_eq!(stdout, "hello-nomad\n");
    let stderr = cli_ok(&agent, &["task", "logs", "--stderr", &id]);
    assert_eq!(stderr, "oops\n");

    // task logs -f follows the output as it comes, to the task's end.
    let id = task_run(
        &agent,
        "raw_exec",
        serde_json::json!({"command": "/bin/sh", "args": ["-c", "for i in 1 2 3 4 5; do echo line-$i; sleep 0.1; done"]}),
    );
    let followed = cli_ok(&agent, &["task", "logs", "-f", &id]);
    assert_eq!(followed, "line-1\nline-2\nline-3\nline-4\nline-5\n");

    // task signal reaches the task.
    let id = task_run(
        &agent,
        "raw_exec",
        serde_json::json!({"command": "/bin/sh", "args": ["-c",
            "trap 'echo got-usr1; exit 7' USR1; echo ready; while :; do sleep 0.05; done"]}),
    );
    let api = agent.api();
    until(&agent, &id, Duration::from_secs(10), "ready", |_| {
        cli_ok(&agent, &["task", "logs", &id]).contains("ready")
    });
    cli_ok(&agent, &["task", "signal", &id, "SIGUSR1"]);
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert!(cli_ok(&agent, &["task", "logs", &id]).contains("got-usr1"));

    // task stop ends it, and its process.
    let id = task_run(
        &agent,
        "raw_exec",
        serde_json::json!({"command": "/bin/sleep", "args": ["300"]}),
    );
    let task = until(&agent, &id, Duration::from_secs(10), "a pid", |t| {
        pid_of(t).is_some()
    });
    let pid = pid_of(&task).unwrap();
    assert!(running(pid));
    let stopped = api
        .block_on(api.stop_task(&id, &StopRequest::default()))
        .expect("stop");
    assert_eq!(stopped.state, TaskLifecycle::Dead, "{stopped:#?}");
    assert!(!running(pid), "the task's process {pid} survived its stop");
}

#[test]
fn nomad_mock_driver_returns_the_exit_code_and_output_its_config_asks_for() {
    let Some(p) = peers() else { return };
    let (_root, agent) = agent_with(&[(&p.mock(), "mock_driver")], "");
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "mock_driver" && r["state"] == "healthy")
    });
    let id = task_run(
        &agent,
        "mock_driver",
        serde_json::json!({"run_for": "200ms", "exit_code": 5, "stdout_string": "from-mock\n", "stdout_repeat": 3, "stdout_repeat_duration": "10ms"}),
    );
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let stdout = cli_ok(&agent, &["task", "logs", &id]);
    assert!(stdout.starts_with("from-mock\n"), "{stdout:?}");
    // A config key the mock does not have is refused before anything starts.
    let out = agent.cli(&[
        "task",
        "run",
        "--driver",
        "mock_driver",
        "--config",
        r#"{"run_for": "1s", "exit_cod": 1}"#,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exit_cod"));
}

/// The counter a task printed into its stdout: every value once, in order, from 0.
fn assert_counter_complete(text: &str, what: &str) -> u64 {
    let mut expect = 0u64;
    for line in text.lines() {
        let n: u64 = line
            .parse()
            .unwrap_or_else(|_| panic!("{what}: not a counter line {line:?}"));
        assert_eq!(
            n,
            expect,
            "{what}: after {} came {n}",
            expect.wrapping_sub(1)
        );
        expect += 1;
    }
    expect
}

#[test]
fn nomad_raw_exec_tasks_survive_agent_and_plugin_sigkill_without_restarts_or_lost_output() {
    let Some(p) = peers() else { return };
    let _serial = serial();
    let (root, mut agent) = raw_exec_agent(&p);
    agent.end_tasks = false;
    const TASKS: usize = 20;
    let counter = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.01; done";
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        ids.push(task_run(
            &agent,
            "raw_exec",
            serde_json::json!({"command": "/bin/sh", "args": ["-c", counter]}),
        ));
    }
    let mut pids = BTreeMap::new();
    for id in &ids {
        let t = until(&agent, id, Duration::from_secs(20), "a pid", |t| {
            pid_of(t).is_some()
        });
        pids.insert(id.clone(), pid_of(&t).unwrap());
    }

    // kill -9 of the agent; a new one on the same dirs takes every task over.
    let plugin_pid = row(
        agent
            .cli_json(&["plugin", "status", "--json"])
            .as_array()
            .unwrap(),
        "raw_exec",
    )["pid"]
        .as_u64()
        .unwrap() as u32;
    nix_kill(agent.child.id(), 9).unwrap();
    let _ = agent.child.wait();
    std::thread::sleep(Duration::from_millis(300)); // output goes on meanwhile
    let plugin_dir = agent.plugin_dir.clone();
    let config = root.path().join("agent.toml");
    let mut agent = Agent::start(
        root.path(),
        &plugin_dir,
        &["--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    for id in &ids {
        let t = until(&agent, id, Duration::from_secs(30), "recovered", |t| {
            kinds(t).last().map(String::as_str) == Some("Recovered")
        });
        assert_eq!(t.state, TaskLifecycle::Running, "{t:#?}");
        assert_eq!(pid_of(&t), Some(pids[id]), "task {id} has another process");
        assert_eq!(t.restarts, 0, "{t:#?}");
    }
    let rows = agent.cli_json(&["plugin", "status", "--json"]);
    let r = row(rows.as_array().unwrap(), "raw_exec");
    assert_eq!(r["pid"].as_u64(), Some(u64::from(plugin_pid)), "{r:#}");
    assert_eq!(r["reattached"], true, "{r:#}");

    // kill -9 of the plugin: relaunched, every task recovered, none restarted.
    nix_kill(plugin_pid, 9).unwrap();
    let rows = agent.wait_plugins(Duration::from_secs(30), |rows| {
        rows.iter().any(|r| {
            r["name"] == "raw_exec"
                && r["state"] == "healthy"
                && r["pid"]
                    .as_u64()
                    .is_some_and(|p| p != u64::from(plugin_pid))
        })
    });
    drop(rows);
    for id in &ids {
        let t = until(
            &agent,
            id,
            Duration::from_secs(30),
            "recovered again",
            |t| {
                let k = kinds(t);
                k.iter().any(|k| k == "DriverFailure")
                    && k.last().map(String::as_str) == Some("Recovered")
            },
        );
        assert_eq!(t.state, TaskLifecycle::Running, "{t:#?}");
        assert_eq!(pid_of(&t), Some(pids[id]), "task {id} has another process");
        assert_eq!(t.restarts, 0, "{t:#?}");
    }

    // Stop them; each log has every counter value, none twice.
    std::thread::sleep(Duration::from_millis(200));
    let api = agent.api();
    for id in &ids {
        api.block_on(api.stop_task(id, &StopRequest::default()))
            .expect("stop");
        assert!(!running(pids[id]));
    }
    for id in &ids {
        let text = cli_ok(&agent, &["task", "logs", id]);
        let n = assert_counter_complete(&text, id);
        assert!(n > 50, "task {id} printed only {n} lines");
    }
}

#[test]
fn a_cluster_job_on_nomad_raw_exec_runs_shows_its_logs_and_stops_without_leftovers() {
    let Some(p) = peers() else { return };
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(p.raw_exec(), plugins.join("raw_exec")).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(&config, "[plugin.raw_exec]\nconfig = { enabled = true }\n").unwrap();
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &["--dev", "--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    // The node says the Nomad driver's health to the server.
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the dev node ready with raw_exec healthy",
        || {
            let out = agent.cli(&["node", "status", "--json"]);
            let nodes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            out.status.success()
                && nodes.as_array().is_some_and(|n| {
                    n.len() == 1
                        && n[0]["status"] == "ready"
                        && n[0]["drivers"]["raw_exec"]["healthy"] == true
                })
        },
    );
    let job = common::cluster::job_file(
        root.path(),
        "nomadweb",
        r#"
name = "nomadweb"
type = "service"

[[group]]
name = "app"
count = 2

[[group.task]]
name = "main"
driver = "raw_exec"
config = { command = "/bin/sh", args = ["-c", "echo hello from $DROVER_ALLOC_ID; exec sleep 1000"] }
resources = { cpu = 100, memory_mb = 32 }
"#,
    );
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        let v = agent.cli_json(&["job", "status", "nomadweb", "--json"]);
        if common::cluster::allocs_with(&v, "running").len() == 2 {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "2 running allocations: not within 60s; last:\n{v:#}\nagent log:\n{}",
            common::cluster::tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let api = agent.api();
    let mut pids = Vec::new();
    for a in common::cluster::allocs_with(&status, "running") {
        let id = a["id"].as_str().unwrap();
        let mut logs = String::new();
        drover_test_support::until_blocking(
            Duration::from_secs(10),
            Duration::from_millis(100),
            "the task's output in alloc logs",
            || {
                logs = cli_ok(&agent, &["alloc", "logs", id, "main"]);
                logs.contains(&format!("hello from {id}"))
            },
        );
    }
    let tasks = agent.cli_json(&["task", "list", "--json"]);
    for t in tasks.as_array().unwrap() {
        let view = api
            .block_on(api.get_task(t["id"].as_str().unwrap()))
            .expect("task view");
        pids.push(pid_of(&view).expect("raw_exec says its task's pid"));
    }
    assert_eq!(pids.len(), 2, "{tasks:#}");
    assert!(pids.iter().all(|p| running(*p)));

    cli_ok(&agent, &["job", "stop", "nomadweb"]);
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "every task process of the job gone",
        || pids.iter().all(|p| !running(*p)),
    );
}
