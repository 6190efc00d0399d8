//! Plugin processes outlive the agent: kill -9 or stop the agent, start it again on the
//! same data dir, and it takes the same plugin process over instead of launching a
//! second one. A plugin that died meanwhile, or whose binary changed, is replaced.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

fn healthy(name: &'static str) -> impl Fn(&[serde_json::Value]) -> bool {
    move |rows| {
        rows.iter()
            .any(|r| r["name"] == name && r["state"] == "healthy")
    }
}

/// Start an agent on `root` (data under `root/data`) and wait for `name` to be healthy.
/// A killed agent leaves its API socket file behind, so "the socket exists" does not
/// mean the new agent serves yet: poll the API itself.
fn start(root: &Path, extra: &[&str], name: &'static str) -> (Agent, serde_json::Value) {
    let agent = Agent::start(root, &root.join("plugins"), extra);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !agent.cli(&["plugin", "status", "--json"]).status.success() {
        assert!(
            Instant::now() < deadline,
            "agent never answered; log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rows = agent.wait_plugins(Duration::from_secs(15), healthy(name));
    let r = row(&rows, name).clone();
    (agent, r)
}

fn pid_of(row: &serde_json::Value) -> u32 {
    row["pid"].as_u64().expect("pid") as u32
}

use drover_test_support::procs::{alive, environ};

fn wait_dead(pid: u32) {
    // A retired plugin gets a Shutdown, 2 s of grace and then SIGKILL; 15 s leaves a
    // loaded machine room for that.
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} is still alive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process group of `pid`.
fn pgrp(pid: u32) -> u32 {
    drover_test_support::procs::stat(pid)
        .unwrap_or_else(|| panic!("no process {pid}"))
        .pgid
}

/// Signal `signal` is in the `SigIgn` mask of /proc/<pid>/status.
fn ignores(pid: u32, signal: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap();
    mask & (1 << (signal - 1)) != 0
}

/// SIGPIPE (13) is in the `SigIgn` mask of /proc/<pid>/status.
fn sigpipe_ignored(pid: u32) -> bool {
    ignores(pid, 13)
}

/// An agent started with SIGCHLD ignored (a careless supervisor; the disposition
/// survives exec) would have the kernel reap its children and its plugins' children:
/// exit statuses lost, pids reused under handles that kill by pid. It sets SIGCHLD
/// back, says so, and its plugins start with the default.
#[test]
fn an_agent_started_with_sigchld_ignored_sets_it_back() {
    const SIGCHLD: u32 = 17;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    // bash hands an ignored SIGCHLD on through exec (dash does not).
    let wrapper = root.path().join("drover-sigchld-ignored");
    write_exec(
        &wrapper,
        &format!(
            "#!/bin/bash\ntrap '' CHLD\nexec {} \"$@\"\n",
            drover().display()
        ),
        0o755,
    );
    let probe = std::process::Command::new("/bin/bash")
        .args(["-c", "trap '' CHLD; exec cat /proc/self/status"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&probe.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("SigIgn:"))
            .filter_map(|m| u64::from_str_radix(m.trim(), 16).ok())
            .any(|mask| mask & (1 << (SIGCHLD - 1)) != 0),
        "the wrapper does not hand on an ignored SIGCHLD"
    );

    let mut agent = Agent::start_binary(&wrapper, root.path(), &root.path().join("plugins"), &[]);
    let rows = agent.wait_plugins(Duration::from_secs(15), healthy("raw_exec"));
    let plugin = pid_of(row(&rows, "raw_exec"));
    assert!(
        !ignores(agent.child.id(), SIGCHLD),
        "the agent ignores SIGCHLD"
    );
    assert!(!ignores(plugin, SIGCHLD), "its plugin ignores SIGCHLD");
    assert!(
        agent.log_text().contains("started with SIGCHLD ignored"),
        "{}",
        agent.log_text()
    );
    assert_eq!(run_sh(&agent, "exit 7"), Some(7));
    assert!(agent.stop().success());
}

fn kill9(agent: &mut Agent) {
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
}

/// Every live `drover plugin serve rawexec` process started by the agents carrying
/// these test markers (inherited through the environment).
fn rawexec_processes(markers: &[&str]) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let ours = markers.iter().any(|m| {
            let needle = format!("DROVER_TEST_MARKER={m}");
            env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes())
        });
        if ours && cmd.ends_with(b"plugin\0serve\0raw_exec\0") && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn killed_agent_reattaches_to_the_same_plugin_process() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let (mut first, row1) = start(root.path(), &[], "raw_exec");
    let plugin = pid_of(&row1);
    assert_eq!(row1["reattached"], false);
    // Its own process group: a Ctrl-C at the agent's terminal does not reach it.
    assert_eq!(pgrp(plugin), plugin);
    assert_ne!(pgrp(plugin), pgrp(first.child.id()));
    // A task, so there is something to lose.
    let task = first.cli_json(&[
        "task",
        "run",
        "--driver",
        "rawexec",
        "--json",
        "--config",
        r#"{"command":"/bin/sleep","args":["300"]}"#,
    ]);
    let task_pid: u32 = task["attributes"]["pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("task pid");
    let _task_guard = KillOnDrop(task_pid);

    // SIGPIPE ignored (Rust's runtime does so at start), so writing its logs into the
    // pipe of a dead agent is an EPIPE it drops, not a signal that kills it.
    assert!(
        sigpipe_ignored(plugin),
        "the plugin does not ignore SIGPIPE"
    );
    kill9(&mut first);
    assert!(alive(plugin), "the plugin died with the agent");
    assert!(alive(task_pid), "the task died with the agent");

    let (second, row2) = start(root.path(), &[], "raw_exec");
    assert_eq!(
        pid_of(&row2),
        plugin,
        "a different plugin process serves: {row2:#}"
    );
    assert_eq!(row2["reattached"], true);
    assert_eq!(
        rawexec_processes(&[&first.marker, &second.marker]),
        vec![plugin],
        "a second rawexec process was launched"
    );
    assert!(
        second.log_text().contains("reattached"),
        "{}",
        second.log_text()
    );
    // The reattached plugin works, although its stderr pipe (to the dead agent) is
    // broken: serving a task makes it log, which must not kill it.
    assert_eq!(run_sh(&second, "exit 7"), Some(7));
    assert!(alive(plugin));
    assert!(alive(task_pid));

    // The supervisor watches a reattached plugin like a launched one: it crashes, a
    // fresh one is launched.
    nix_kill(plugin, 9).unwrap();
    let rows = second.wait_plugins(Duration::from_secs(15), |rows| {
        rows.iter().any(|r| {
            r["name"] == "raw_exec"
                && r["state"] == "healthy"
                && r["pid"].as_u64().is_some_and(|p| p as u32 != plugin)
        })
    });
    assert_eq!(row(&rows, "raw_exec")["reattached"], false);
}

/// Run `/bin/sh -c SCRIPT` on rawexec through the CLI and return its exit code.
fn run_sh(agent: &Agent, script: &str) -> Option<i32> {
    let config = serde_json::json!({"command": "/bin/sh", "args": ["-c", script]}).to_string();
    let id = agent.cli_json(&[
        "task", "run", "--driver", "rawexec", "--json", "--config", &config,
    ])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    agent.cli(&["task", "wait", &id]).status.code()
}

/// With `plugin_auto_mtls`, a plugin is launched with go-plugin's AutoMTLS and the
/// certificates go into the reattach record: an agent killed with -9 comes back to
/// the same plugin process over TLS, and that plugin takes tasks.
#[test]
fn killed_agent_reattaches_over_automtls() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        "plugin_auto_mtls = true\n[plugin.docker]\nauto_mtls = false\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let (mut first, row1) = start(root.path(), &args, "raw_exec");
    let plugin = pid_of(&row1);
    // It was asked for TLS: the handshake's client certificate is in its environment.
    assert!(
        environ(plugin)
            .get("PLUGIN_CLIENT_CERT")
            .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")),
        "rawexec was not launched with AutoMTLS"
    );
    // [plugin.docker] auto_mtls = false wins over the agent-wide setting.
    let rows = first.cli_json(&["plugin", "status", "--json"]);
    let docker = pid_of(row(rows.as_array().expect("plugin rows"), "docker"));
    assert!(
        !environ(docker).contains_key("PLUGIN_CLIENT_CERT"),
        "docker got AutoMTLS though its config turned it off"
    );
    kill9(&mut first);
    assert!(alive(plugin), "the plugin died with the agent");

    let (second, row2) = start(root.path(), &args, "raw_exec");
    assert_eq!(pid_of(&row2), plugin, "not reattached: {row2:#}");
    assert_eq!(row2["reattached"], true);
    assert_eq!(run_sh(&second, "exit 5"), Some(5));
    // The record holds the agent's private key: the state file is the agent's alone.
    let state = root.path().join("data/state.db");
    let meta = std::fs::metadata(&state).expect("the agent's state file");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(meta.permissions().mode() & 0o077, 0, "{}", state.display());

    // AutoMTLS turned off while the agent was down: the plugin launched over TLS does
    // not match the config any more and is replaced by a plain one.
    let mut second = second;
    kill9(&mut second);
    std::fs::write(&config, "plugin_auto_mtls = false\n").unwrap();
    let (_third, row3) = start(root.path(), &args, "raw_exec");
    let fresh = pid_of(&row3);
    assert_ne!(
        fresh, plugin,
        "the AutoMTLS plugin was reattached: {row3:#}"
    );
    assert!(
        !environ(fresh).contains_key("PLUGIN_CLIENT_CERT"),
        "the new rawexec still got AutoMTLS"
    );
    wait_dead(plugin);
}

/// An AutoMTLS plugin whose record was lost (the state file deleted while the agent
/// was down) cannot be asked who it is in plain text, and the key to ask over TLS
/// went with the record: the next agent launches a new one and removes the stray's
/// socket, and the stray exits by itself instead of running for ever.
#[test]
fn a_stray_automtls_plugin_whose_record_is_lost_goes_away() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(&config, "plugin_auto_mtls = true\n").unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let (mut first, row1) = start(root.path(), &args, "raw_exec");
    let stray = pid_of(&row1);
    kill9(&mut first);
    assert!(alive(stray), "the plugin died with the agent");
    std::fs::remove_file(root.path().join("data/state.db")).unwrap();

    let (second, row2) = start(root.path(), &args, "raw_exec");
    let fresh = pid_of(&row2);
    assert_ne!(fresh, stray, "reattached without a record: {row2:#}");
    // The sweep removes its socket after the start; the plugin sees that within its
    // orphan check interval (2 s) and exits.
    wait_dead(stray);
    assert!(
        second.log_text().contains("cannot be asked who it is"),
        "{}",
        second.log_text()
    );
    assert!(alive(fresh));
    assert_eq!(run_sh(&second, "exit 4"), Some(4));
}

/// The test's long task is killed however the test ends.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix_kill(self.0, 9);
    }
}

#[test]
fn plugin_that_died_while_the_agent_was_down_is_launched_afresh() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let (mut first, row1) = start(root.path(), &[], "raw_exec");
    let old = pid_of(&row1);
    kill9(&mut first);
    nix_kill(old, 9).unwrap();
    wait_dead(old);

    let (second, row2) = start(root.path(), &[], "raw_exec");
    let new = pid_of(&row2);
    assert_ne!(new, old);
    assert_eq!(row2["reattached"], false);
    assert_eq!(
        rawexec_processes(&[&first.marker, &second.marker]),
        vec![new]
    );
}

#[test]
fn graceful_stop_leaves_plugins_running_and_drain_stops_them() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let (mut first, row1) = start(root.path(), &[], "raw_exec");
    let plugin = pid_of(&row1);
    assert!(first.stop().success(), "agent failed on SIGTERM");
    assert!(
        alive(plugin),
        "a graceful stop (no --drain) stopped the plugin"
    );

    let (mut second, row2) = start(root.path(), &["--drain"], "raw_exec");
    assert_eq!(pid_of(&row2), plugin);
    assert_eq!(row2["reattached"], true);
    // SIGINT (Ctrl-C) is as graceful as SIGTERM.
    nix_kill(second.child.id(), 2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = second.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent did not exit on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}\n{}", second.log_text());
    wait_dead(plugin);
    assert!(
        rawexec_processes(&[&first.marker, &second.marker]).is_empty(),
        "--drain left plugin processes running"
    );

    // Nothing to reattach to: the next agent launches.
    let (third, row3) = start(root.path(), &[], "raw_exec");
    assert_eq!(row3["reattached"], false);
    drop(third);
}

#[test]
fn upgraded_plugin_binary_replaces_the_old_process() {
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let bin = plugins.join("skeleton");
    crate::common::copy_exec(workspace_bin("drover-skeleton-driver"), &bin);
    let (mut first, row1) = start(root.path(), &[], "skeleton");
    let old = pid_of(&row1);
    kill9(&mut first);

    // Same binary: reattached.
    let (mut second, row2) = start(root.path(), &[], "skeleton");
    assert_eq!(pid_of(&row2), old);
    assert_eq!(row2["reattached"], true);
    kill9(&mut second);

    // A new build installed the usual way (write beside, rename over): the old process
    // is shut down cleanly and a fresh one runs the new binary.
    let mut bytes = std::fs::read(workspace_bin("drover-skeleton-driver")).unwrap();
    bytes.extend_from_slice(b"upgrade");
    let staged = root.path().join("skeleton.new");
    write_exec(&staged, "", 0o755);
    std::fs::write(&staged, &bytes).unwrap();
    std::fs::rename(&staged, &bin).unwrap();
    let (third, row3) = start(root.path(), &[], "skeleton");
    assert_ne!(pid_of(&row3), old);
    assert_eq!(row3["reattached"], false);
    wait_dead(old);
    assert!(
        third.log_text().contains("binary changed (upgrade)"),
        "{}",
        third.log_text()
    );
    drop(first);
    drop(second);
}

#[test]
fn unrecorded_plugin_and_dead_sockets_are_cleaned_up_at_start() {
    use drover_host::state::{RedbStore, StateStore as _};
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let (mut first, row1) = start(root.path(), &[], "raw_exec");
    let stray = pid_of(&row1);
    kill9(&mut first);
    // As if the agent had been killed between launching the plugin and recording it.
    {
        let store = RedbStore::open(&first.data_dir).unwrap();
        store.delete_plugin("raw_exec").unwrap();
    }
    // And a socket dir of a plugin that was kill -9ed long ago.
    let dead = first.data_dir.join("run/drover-plugin-dead");
    std::fs::create_dir(&dead).unwrap();
    drop(std::os::unix::net::UnixListener::bind(dead.join("plugin.sock")).unwrap());

    let (second, row2) = start(root.path(), &[], "raw_exec");
    assert_ne!(pid_of(&row2), stray);
    assert_eq!(row2["reattached"], false);
    wait_dead(stray);
    assert_eq!(
        rawexec_processes(&[&first.marker, &second.marker]),
        vec![pid_of(&row2)]
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while dead.exists() {
        assert!(
            Instant::now() < deadline,
            "dead plugin's socket dir left behind"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The agent logs the sweep once it saw the process end, which can be a moment
    // after the process is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !second.log_text().contains("stray plugin") {
        assert!(Instant::now() < deadline, "{}", second.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An agent that dies while a task's pending record is on its way to the disk (the
/// record is written while the driver starts the task) leaves a running task whose
/// record is only in `starting/<id>`, the start intent. The next agent takes the task
/// from there: known, running, the very same process, started once.
#[test]
fn a_task_whose_record_never_landed_is_recovered_from_its_start_intent() {
    use drover_host::state::{RedbStore, StateStore as _};
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("plugins")).unwrap();
    let (mut first, _) = start(root.path(), &[], "raw_exec");
    let config = serde_json::json!({"command": "/bin/sleep", "args": ["3600"]}).to_string();
    let view = first.cli_json(&[
        "task", "run", "--driver", "rawexec", "--json", "--config", &config,
    ]);
    let id = view["id"].as_str().unwrap().to_owned();
    let pid: u32 = view["attributes"]["pid"].as_str().unwrap().parse().unwrap();
    let starting = first.data_dir.join("starting");
    assert_eq!(
        std::fs::read_dir(&starting).unwrap().count(),
        0,
        "a start intent outlived its durable record"
    );
    kill9(&mut first);
    // As if the agent had died before the record landed: the pending record (no
    // handle yet) is in the intent, not in the store.
    {
        let store = RedbStore::open(&first.data_dir).unwrap();
        let (_, bytes) = store
            .tasks()
            .unwrap()
            .into_iter()
            .find(|(i, _)| *i == id)
            .unwrap();
        let mut rec: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        rec["handle"] = serde_json::Value::Null;
        rec["view"]["state"] = "pending".into();
        rec["view"]["attributes"] = serde_json::json!({});
        std::fs::write(starting.join(&id), serde_json::to_vec(&rec).unwrap()).unwrap();
        store.delete_task(&id).unwrap();
    }

    let (second, _) = start(root.path(), &[], "raw_exec");
    let status = || second.cli_json(&["task", "status", &id, "--json"]);
    drover_test_support::until_blocking(
        Duration::from_secs(15),
        Duration::from_millis(20),
        "the task to be recovered, running with its pid",
        || {
            let t = status();
            t["state"] == "running" && t["attributes"]["pid"].is_string()
        },
    );
    let task = status();
    assert_eq!(
        task["attributes"]["pid"].as_str().unwrap(),
        pid.to_string(),
        "the task was started again instead of found"
    );
    assert!(alive(pid));
    assert!(!starting.join(&id).exists(), "the intent was kept");
    assert!(
        second
            .log_text()
            .contains("recovered from its start intent"),
        "{}",
        second.log_text()
    );
    assert!(second.cli(&["task", "stop", &id]).status.success());
    wait_dead(pid);
    drop(first);
    drop(second);
}
