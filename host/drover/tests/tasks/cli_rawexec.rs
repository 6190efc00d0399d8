//! rawexec end to end through the `drover` CLI, as a user drives it.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

use common::rawexec_agent as agent;

fn run(agent: &Agent, config: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "task", "run", "--driver", "rawexec", "--config", config, "--json",
    ];
    args.extend_from_slice(extra);
    let task = agent.cli_json(&args);
    task["id"].as_str().expect("task id").to_owned()
}

#[test]
fn echo_runs_and_wait_returns_its_exit_code() {
    let (_root, agent) = agent();
    let id = run(
        &agent,
        r#"{"command":"/bin/echo","args":["hello from drover"]}"#,
        &[],
    );
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    assert_eq!(status["state"], "dead");
    assert_eq!(status["exit_code"], 0);
    let stdout = std::fs::read_to_string(
        std::path::Path::new(status["task_dir"].as_str().unwrap()).join("logs/stdout.0"),
    )
    .unwrap();
    assert_eq!(stdout, "hello from drover\n");

    let id = run(
        &agent,
        r#"{"command":"/bin/sh","args":["-c","exit 3"]}"#,
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(3));
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    assert_eq!(status["exit_code"], 3);
}

#[test]
fn long_task_stops_within_the_kill_timeout() {
    let (_root, agent) = agent();
    let id = run(
        &agent,
        r#"{"command":"/bin/sleep","args":["1000"]}"#,
        &["--kill-timeout", "3s"],
    );
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    assert_eq!(status["state"], "running");
    let pid: i32 = status["attributes"]["pid"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let t = Instant::now();
    let out = agent.cli(&["task", "stop", &id, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "stop took {:?} though sleep dies of SIGTERM at once (kill timeout 3 s)",
        t.elapsed()
    );
    let stopped: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stopped["state"], "dead");
    assert_eq!(stopped["signal"], 15);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "sleep {pid} still alive"
    );
    assert_eq!(
        agent.cli(&["task", "wait", &id]).status.code(),
        Some(128 + 15)
    );

    // A task that ignores SIGTERM is SIGKILLed once the kill timeout passes. It says
    // when its trap is in place, so the stop cannot land before it.
    let id = run(
        &agent,
        r#"{"command":"/bin/sh","args":["-c","trap '' TERM; echo ready; while :; do sleep 0.1; done"]}"#,
        &["--kill-timeout", "1s"],
    );
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    let stdout = std::path::Path::new(status["task_dir"].as_str().unwrap()).join("logs/stdout.0");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&stdout).unwrap_or_default() != "ready\n" {
        assert!(Instant::now() < deadline, "the task never said ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    let stopped = agent.cli_json(&["task", "stop", &id, "--json"]);
    let took = t.elapsed();
    // The upper bound is generous for a loaded machine; a stop that does not escalate
    // never returns.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "stop took {took:?}"
    );
    assert_eq!(stopped["signal"], 9, "{stopped:#}");
}

#[test]
fn misspelt_config_field_is_refused_and_creates_nothing() {
    let (_root, agent) = agent();
    let out = agent.cli(&[
        "task",
        "run",
        "--driver",
        "rawexec",
        "--config",
        r#"{"comand":"/bin/echo"}"#,
        "--json",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("comand"),
        "error does not name the field: {err}"
    );
    let tasks = agent.cli_json(&["task", "list", "--json"]);
    assert_eq!(tasks, serde_json::json!([]), "a task was created");

    let out = agent.cli(&["task", "run", "--driver", "nosuch", "--config", "{}"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no driver named \"nosuch\""));
}

#[test]
fn signal_and_destroy() {
    let (_root, agent) = agent();
    let id = run(
        &agent,
        r#"{"command":"/bin/sh","args":["-c","trap 'exit 42' USR1; while :; do sleep 0.1; done"]}"#,
        &[],
    );
    // Destroying a running task is refused without --force.
    let out = agent.cli(&["task", "destroy", &id]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("still running"));
    // Give the shell a moment to install its trap: wait until it has a sleep child.
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    let pid = status["attributes"]["pid"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "shell never started its loop");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        agent
            .cli(&["task", "signal", &id, "SIGUSR1"])
            .status
            .success()
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(42));
    assert!(agent.cli(&["task", "destroy", &id]).status.success());
    assert!(!agent.cli(&["task", "status", &id]).status.success());
}
