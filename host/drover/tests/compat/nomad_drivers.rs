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
        crate::common::copy_exec(src, dir.join(name));
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

/// Live processes whose command line mentions `text`.
fn processes_mentioning(text: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| running(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(text))
        })
        .collect()
}

/// Every built-in driver has loaded and no plugin is still starting: the moment to
/// check which processes run.
fn settled(rows: &[serde_json::Value]) -> bool {
    ["raw_exec", "exec", "java", "qemu", "docker"]
        .iter()
        .all(|n| rows.iter().any(|r| r["name"] == *n && r["pid"].is_u64()))
        && rows.iter().all(|r| r["state"] != "unhealthy")
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
        "[plugin.test-plugin]\nconfig = { enabled = true }\n",
    );
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "test-plugin" && r["state"] == "undetected")
    });
    let r = row(&rows, "test-plugin");
    assert_eq!(r["protocol"], "nomad", "{r:#}");
    assert_eq!(r["version"], "0.0.1", "{r:#}");
    assert_eq!(r["api_version"], "0.1.0", "{r:#}");
    assert_eq!(r["source"], "external", "{r:#}");
    assert_eq!(r["state"], "undetected", "{r:#}");
    assert!(
        r["reason"].as_str().unwrap().contains("not detected"),
        "{r:#}"
    );
    assert!(r["pid"].as_u64().is_some(), "{r:#}");
    let text = cli_ok(&agent, &["plugin", "status"]);
    let line = text
        .lines()
        .find(|l| l.starts_with("test-plugin"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" nomad "), "{line}");

    drop(agent);

    // A bad key in its plugin config: not loaded, the key named.
    let (_root, agent) = agent_with(
        &[(&skeleton, "skeleton")],
        "[plugin.test-plugin]\nconfig = { enabeld = true }\n",
    );
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter().any(|r| {
            r["path"].as_str().is_some_and(|p| p.ends_with("/skeleton")) && r["state"] == "skipped"
        }) && settled(rows)
    });
    let r = rows
        .iter()
        .find(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/skeleton")))
        .unwrap();
    let reason = r["reason"].as_str().unwrap();
    assert!(reason.contains("enabeld"), "{reason}");
    assert_eq!(r["protocol"], "nomad", "{r:#}");
    agent.assert_only_healthy_plugins_run(&rows);
    drop(agent);

    // Pins: the right hash under its name loads it; a wrong hash under its file's name
    // keeps it from running at all.
    let good = sha256_hex(&skeleton);
    let (_root, agent) = agent_with(
        &[(&skeleton, "skeleton")],
        &format!("[plugin.test-plugin]\nsha256 = \"{good}\"\n"),
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
            && settled(rows)
    });
    let reason = row(&rows, "skeleton")["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("sha256"), "{reason}");
    agent.assert_only_healthy_plugins_run(&rows);
}

/// Drover's built-in driver is named `raw_exec` too, as Nomad names it: the operator's
/// Nomad raw_exec in plugin_dir wins the name (an external plugin beats a built-in of
/// the same name unless `prefer_builtin`), the built-in is not run, and a task that
/// says `rawexec` (the built-in's older name) runs on the plugin that serves
/// `raw_exec`, recorded under that name.
#[test]
fn nomads_raw_exec_in_plugin_dir_wins_the_name_over_the_built_in() {
    let Some(p) = peers() else { return };
    let (_root, agent) = raw_exec_agent(&p);
    let rows = agent.wait_plugins(Duration::from_secs(30), settled_with_nomads_raw_exec);
    let serving: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
        .collect();
    assert_eq!(serving.len(), 1, "{rows:#?}");
    assert_eq!(serving[0]["protocol"], "nomad", "{:#}", serving[0]);
    assert_eq!(serving[0]["source"], "external", "{:#}", serving[0]);
    let builtin = rows
        .iter()
        .find(|r| r["name"] == "raw_exec" && r["source"] == "builtin")
        .unwrap_or_else(|| panic!("no row of the built-in raw_exec: {rows:#?}"));
    assert!(
        builtin["pid"].is_null(),
        "the built-in runs too: {builtin:#}"
    );
    eprintln!("the built-in's row: {builtin:#}");
    agent.assert_only_healthy_plugins_run(&rows);

    let id = task_run(
        &agent,
        "rawexec",
        serde_json::json!({"command": "/bin/sh", "args": ["-c", "echo via-the-alias"]}),
    );
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(cli_ok(&agent, &["task", "logs", &id]), "via-the-alias\n");
    let view: serde_json::Value =
        serde_json::from_str(&cli_ok(&agent, &["task", "status", &id, "--json"])).unwrap();
    assert_eq!(view["driver"], "raw_exec", "{view:#}");
}

/// Every driver has loaded, Nomad's raw_exec serves `raw_exec`, and no plugin is still
/// starting.
fn settled_with_nomads_raw_exec(rows: &[serde_json::Value]) -> bool {
    ["exec", "java", "qemu", "docker"]
        .iter()
        .all(|n| rows.iter().any(|r| r["name"] == *n && r["pid"].is_u64()))
        && rows
            .iter()
            .any(|r| r["name"] == "raw_exec" && r["protocol"] == "nomad" && r["pid"].is_u64())
        && rows.iter().all(|r| r["state"] != "unhealthy")
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
    // Once it has exited, the driver's executor for it is gone (Nomad's raw_exec keeps
    // one until DestroyTask) and so are its FIFOs; its status still answers.
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "no process of the exited task left (raw_exec's executor names its task dir)",
        || processes_mentioning(&id).is_empty(),
    );
    let fifos: Vec<_> = std::fs::read_dir(agent.data_dir.join("nomad-fifos"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(id.as_str()))
        .collect();
    assert!(fifos.is_empty(), "{fifos:?}");
    let status = cli_ok(&agent, &["task", "status", &id]);
    assert!(status.contains("Exit Code   = 3"), "{status}");

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
    // The plugin process was reattached; a Go plugin whose stderr pipe broke with the
    // old agent dies at its next log line (SIGPIPE), and is then relaunched: either
    // way one raw_exec process serves, never two.
    let rows = agent.wait_plugins(Duration::from_secs(30), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    let plugin_now = row(&rows, "raw_exec")["pid"].as_u64().unwrap() as u32;
    assert!(
        plugin_now == plugin_pid || !running(plugin_pid),
        "the old raw_exec plugin {plugin_pid} still runs beside {plugin_now}"
    );
    let plugin_pid = plugin_now;

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
    crate::common::copy_exec(p.raw_exec(), plugins.join("raw_exec"));
    let config = root.path().join("agent.toml");
    std::fs::write(&config, "[plugin.raw_exec]\nconfig = { enabled = true }\n").unwrap();
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &["--dev", "--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    // The node says the Nomad driver's health to the server.
    common::cluster::wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(60));
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
    let status = common::cluster::wait_job(&agent, "nomadweb", "2 running allocations", |v| {
        common::cluster::allocs_with(v, "running").len() == 2
    });
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

/// The bridge against the real skeleton, without an agent: its hclspec turned into a
/// JSON Schema that names its fields, its config checked; and a StartTask that kills
/// it (the template answers with a nil handle, on which Nomad's own plugin server
/// panics) fails the start with the reason and leaves nothing behind: no FIFO, no
/// log relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nomad_driver_that_dies_in_start_task_fails_the_start_and_leaves_nothing() {
    use drover_plugin_sdk::client::{
        LaunchOptions, NomadHostOptions, PluginProcess, PluginProtocol,
    };
    let Some(p) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let fifos = dir.path().join("fifos");
    std::fs::create_dir(&fifos).unwrap();
    std::fs::set_permissions(&fifos, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut opts = LaunchOptions::new("skeleton", p.skeleton());
    opts.nomad = Some(NomadHostOptions::new(&fifos, drover()));
    let plugin = PluginProcess::launch(opts)
        .await
        .expect("launch the skeleton");
    assert_eq!(plugin.protocol(), PluginProtocol::Nomad);
    let client = plugin.client();
    let id = client.plugin_info().await.unwrap();
    assert_eq!(
        (id.name.as_str(), id.version.as_str()),
        ("test-plugin", "0.0.1")
    );
    assert_eq!(id.protocol, PluginProtocol::Nomad);
    let schema: serde_json::Value =
        serde_json::from_str(&client.task_config_schema().await.unwrap()).unwrap();
    assert!(schema["properties"]["strconfig"].is_object(), "{schema:#}");
    assert!(
        schema["required"]
            .as_array()
            .unwrap()
            .contains(&"strconfig".into()),
        "{schema:#}"
    );
    let err = client
        .set_config(r#"{"enabled": "yes"}"#.into(), &Default::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("enabled"), "{err}");
    client
        .set_config(r#"{"enabled": true}"#.into(), &Default::default())
        .await
        .expect("SetConfig");

    let task_dir = dir.path().join("alloc").join("t1");
    std::fs::create_dir_all(&task_dir).unwrap();
    let mut spec = drover_plugin_sdk::TaskSpec::new("t1");
    spec.task_dir = task_dir.clone();
    spec.stdout_path = task_dir.join("stdout");
    spec.stderr_path = task_dir.join("stderr");
    spec.driver_config_json = r#"{"strconfig": "x"}"#.into();
    let err = client.start_task(spec).await.unwrap_err();
    assert!(
        matches!(
            err,
            drover_plugin_sdk::DriverError::Unavailable(_)
                | drover_plugin_sdk::DriverError::Transport(_)
        ),
        "{err:?}"
    );
    // The start left nothing: no FIFO, and no log relay (a relay holds the FIFOs open).
    assert_eq!(std::fs::read_dir(&fifos).unwrap().count(), 0);
    let holders = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .filter(|e| {
                std::fs::read_dir(e.path().join("fd"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.starts_with(&fifos)))
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    // The relay was told to stop (SIGTERM): it exits at once, nothing to drain.
    drover_test_support::until_blocking(
        Duration::from_secs(5),
        Duration::from_millis(20),
        "no process holding the FIFOs",
        || holders().is_empty(),
    );
    let how = plugin.exited().await;
    assert!(!how.is_success(), "{how}");
}

/// Bad Nomad plugins: a real Nomad driver that exits at start (run without its cookie,
/// it says it is a plugin and exits 1) is skipped with its own words; the agent keeps
/// serving and nothing of it is left running.
#[test]
fn a_nomad_plugin_that_exits_at_start_is_skipped_with_its_reason() {
    let Some(p) = peers() else { return };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    write_exec(
        &dir.join("crashing"),
        &format!(
            "#!/bin/sh\nunset NOMAD_PLUGIN_MAGIC_COOKIE\nexec {}\n",
            p.raw_exec().display()
        ),
        0o755,
    );
    let mut agent = Agent::start(root.path(), &dir, &[]);
    agent.end_tasks = true;
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "crashing" && r["state"] == "skipped")
            && rows
                .iter()
                .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
            && settled(rows)
    });
    let reason = row(&rows, "crashing")["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("exited"), "{reason}");
    assert!(reason.contains("This binary is a plugin"), "{reason}");
    agent.assert_only_healthy_plugins_run(&rows);
}

/// A Nomad driver that never sends its first fingerprint (the fixture plugin served
/// under Nomad's protocol, by a wrapper that drops Drover's cookie) is reported as
/// hanging in Fingerprint, takes no task, and the agent goes on serving.
#[test]
fn a_nomad_driver_hanging_in_fingerprint_is_reported_and_takes_no_tasks() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    write_exec(
        &dir.join("hanging"),
        &format!(
            "#!/bin/sh\nunset DROVER_PLUGIN_MAGIC_COOKIE\nFIXTURE_MODE=hang-fingerprint FIXTURE_NAME=hanging exec {}\n",
            workspace_bin("drover-fixture-plugin").display()
        ),
        0o755,
    );
    let mut agent = Agent::start(root.path(), &dir, &[]);
    agent.end_tasks = true;
    let rows = agent.wait_plugins(Duration::from_secs(40), |rows| {
        rows.iter().any(|r| {
            r["name"] == "hanging"
                && r["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("hangs in Fingerprint"))
        })
    });
    let r = row(&rows, "hanging");
    assert_eq!(r["protocol"], "nomad", "{r:#}");
    assert_eq!(r["state"], "unhealthy", "{r:#}");
    let out = agent.cli(&["task", "run", "--driver", "hanging", "--config", "{}"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hangs in Fingerprint"), "{err}");
    // The agent still serves its other drivers.
    let id = task_run(
        &agent,
        "rawexec",
        serde_json::json!({"command": "/bin/true"}),
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
}
