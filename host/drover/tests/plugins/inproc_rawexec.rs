//! rawexec and the skeleton loaded into the agent from their `.so`, driven through
//! the `drover` CLI as a user drives them, and their tasks across a `kill -9` of the
//! agent.
//!
//! The in-process rawexec and the built-in one both call themselves `rawexec`; the
//! pick rule decides (a plugin from `plugin_dir` beats a built-in unless
//! `prefer_builtin`), so with the default config the library serves and the built-in
//! is listed as skipped.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::inproc::{healthy, rig_with, row_at, started};
use common::tasks::{kinds, running};
use common::*;
use drover_test_support::procs;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `drover task run --driver DRIVER --config CONFIG --json` and the new task's id.
fn run(agent: &Agent, driver: &str, config: &str) -> String {
    started(agent, driver, config)["id"]
        .as_str()
        .expect("task id")
        .to_owned()
}

/// `drover task wait`'s exit code, once the task is dead (within 30 s: a task that
/// never ends fails the test rather than hang it).
fn wait(agent: &Agent, id: &str) -> Option<i32> {
    common::tasks::until(agent, id, Duration::from_secs(30), "dead", |t| {
        t.state == drover_api::TaskLifecycle::Dead
    });
    agent.cli(&["task", "wait", id]).status.code()
}

fn status(agent: &Agent, id: &str) -> serde_json::Value {
    agent.cli_json(&["task", "status", id, "--json"])
}

fn task_pid(task: &serde_json::Value) -> u32 {
    task["attributes"]["pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid: {task:#}"))
}

/// Event types of a task, oldest first, driver messages left out.
fn events(agent: &Agent, id: &str) -> Vec<String> {
    let api = agent.api();
    let task = api
        .block_on(api.get_task(id))
        .unwrap_or_else(|e| panic!("task {id}: {e}"));
    kinds(&task)
}

/// A rawexec config running `script` with `/bin/sh -c`.
fn sh(script: &str) -> String {
    drover_test_support::sh(script).to_string()
}

/// Plugin loading settled with `name` served from `library` in process; returns the
/// rows.
fn served_in_process(agent: &Agent, name: &str, library: &Path) -> Vec<serde_json::Value> {
    healthy(agent, name);
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["path"] == library.display().to_string().as_str() && r["state"] == "healthy")
    });
    let row = row_at(&rows, library);
    assert_eq!(row["name"], name, "{row:#}");
    assert_eq!(row["in_process"], true, "{row:#}");
    assert_eq!(row["source"], "external", "{row:#}");
    assert!(row["pid"].is_null(), "{row:#}");
    rows
}

/// The executor of a rawexec task: the task's parent.
fn executor_of(task_pid: u32) -> u32 {
    procs::stat(task_pid)
        .unwrap_or_else(|| panic!("task {task_pid} is gone"))
        .ppid
}

#[test]
fn rawexec_in_process_runs_tasks_through_the_cli() {
    let Some((rig, library)) = rig_with("drover-driver-rawexec", "rawexec", "rawexec.so") else {
        return;
    };
    let agent = rig.start();
    let rows = served_in_process(&agent, "raw_exec", &library);
    // The built-in rawexec answered too, and lost to the library: skipped, its process
    // shut down.
    let builtin = rows
        .iter()
        .find(|r| r["name"] == "raw_exec" && r["source"] == "builtin")
        .unwrap_or_else(|| panic!("no built-in rawexec row: {rows:#?}"));
    assert_eq!(builtin["state"], "skipped", "{builtin:#}");
    assert!(
        builtin["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("{} (version", library.display())),
        "{builtin:#}"
    );
    assert_eq!(
        row_at(&rows, &library)["version"],
        builtin["version"],
        "the library is not rawexec's version"
    );
    let table = stdout(&agent.cli(&["plugin", "status"]));
    let line = table
        .lines()
        .find(|l| l.contains(&library.display().to_string()))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.starts_with("raw_exec ") && line.contains("healthy") && line.contains("in-agent"),
        "{table}"
    );
    let serving_builtin = || {
        agent.marked_pids().into_iter().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"raw_exec"))
        })
    };
    drover_test_support::until_blocking(
        Duration::from_secs(15),
        Duration::from_millis(50),
        "the built-in rawexec process to be shut down",
        || !serving_builtin(),
    );

    let id = run(&agent, "rawexec", &sh("echo hello from the agent"));
    assert_eq!(wait(&agent, &id), Some(0));
    let out = agent.cli(&["task", "logs", &id]);
    assert_eq!(stdout(&out), "hello from the agent\n", "{}", stderr(&out));
    let id = run(&agent, "rawexec", &sh("exit 3"));
    assert_eq!(wait(&agent, &id), Some(3));

    // A long task runs under the dedicated executor installed beside the agent's
    // binary (the library's build matches it), forked by the agent's executor spawner,
    // in a session of its own: not in the agent's process group, so not killed with it.
    let id = run(
        &agent,
        "rawexec",
        r#"{"command":"/bin/sleep","args":["1000"]}"#,
    );
    let task = status(&agent, &id);
    assert_eq!(task["state"], "running", "{task:#}");
    let pid = task_pid(&task);
    let executor = executor_of(pid);
    let exe = std::fs::read_link(format!("/proc/{executor}/exe")).unwrap();
    assert_eq!(
        exe,
        workspace_bin("drover-executor").canonicalize().unwrap(),
        "the executor is not drover-executor"
    );
    let agent_pid = agent.child.id();
    let agent_group = procs::stat(agent_pid).unwrap().pgid;
    let exec_stat = procs::stat(executor).unwrap();
    let spawner = exec_stat.ppid;
    assert_eq!(
        std::fs::read(format!("/proc/{spawner}/cmdline")).unwrap(),
        b"drover-executor: spawner\0",
        "the executor's parent is not a spawner"
    );
    assert_eq!(
        procs::stat(spawner).unwrap().ppid,
        agent_pid,
        "the agent did not start the spawner"
    );
    assert_eq!(
        exec_stat.pgid, executor,
        "the executor leads no group of its own"
    );
    assert_ne!(exec_stat.pgid, agent_group);
    let out = agent.cli(&["task", "stop", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stopped: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stopped["state"], "dead", "{stopped:#}");
    assert_eq!(stopped["signal"], 15, "{stopped:#}");
    assert!(!running(pid), "sleep {pid} survived its stop");
    // The executor exits once its result was collected, and is reaped.
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(20),
        "the executor to exit and be reaped",
        || procs::stat(executor).is_none(),
    );
}

/// A rawexec task that waits for `flag` to exist, then exits with `code`.
fn exit_on_flag(flag: &Path, code: i32) -> String {
    sh(&format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit {code}",
        flag.display()
    ))
}

#[test]
fn in_process_rawexec_tasks_survive_kill_9_of_the_agent() {
    let Some((rig, library)) = rig_with("drover-driver-rawexec", "rawexec", "librawexec.so") else {
        return;
    };
    let (early, late) = (rig.root.path().join("early"), rig.root.path().join("late"));
    let mut first = rig.start();
    // The next agent takes the tasks over.
    first.end_tasks = false;
    served_in_process(&first, "raw_exec", &library);
    let long = run(
        &first,
        "rawexec",
        r#"{"command":"/bin/sleep","args":["1000"]}"#,
    );
    let exits_while_down = run(&first, "rawexec", &exit_on_flag(&early, 7));
    let exits_after = run(&first, "rawexec", &exit_on_flag(&late, 9));
    let pids: Vec<u32> = [&long, &exits_while_down, &exits_after]
        .iter()
        .map(|id| task_pid(&status(&first, id)))
        .collect();
    let executors: Vec<u32> = pids.iter().map(|p| executor_of(*p)).collect();

    first.child.kill().expect("kill -9 the agent");
    first.child.wait().expect("reap the agent");
    for (pid, executor) in pids.iter().zip(&executors) {
        assert!(running(*pid), "task {pid} died with the agent");
        assert!(
            running(*executor),
            "executor {executor} died with the agent"
        );
    }
    std::fs::write(&early, "").unwrap();
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(20),
        "the early task to exit while no agent runs",
        || !running(pids[1]),
    );

    let second = rig.start();
    served_in_process(&second, "raw_exec", &library);
    // Recovered: the same process, told by a Recovered event.
    let recovered = |id: &str| {
        common::tasks::until(&second, id, Duration::from_secs(30), "recovered", |t| {
            kinds(t).iter().any(|k| k == "Recovered")
        })
    };
    let task = recovered(&long);
    assert_eq!(common::tasks::pid_of(&task), Some(pids[0]), "{task:#?}");
    assert!(running(pids[0]));
    let task = recovered(&exits_after);
    assert_eq!(common::tasks::pid_of(&task), Some(pids[2]), "{task:#?}");
    // The one that exited while no agent ran reports its own exit code.
    assert_eq!(wait(&second, &exits_while_down), Some(7));
    std::fs::write(&late, "").unwrap();
    assert_eq!(wait(&second, &exits_after), Some(9));
    let stopped = second.cli_json(&["task", "stop", &long, "--json"]);
    assert_eq!(stopped["signal"], 15, "{stopped:#}");
    assert!(!running(pids[0]), "the recovered task survived its stop");
    let kinds = events(&second, &long);
    assert!(
        kinds.starts_with(&["Received".into(), "Started".into()])
            && kinds.contains(&"Recovered".into())
            && kinds.ends_with(&["Killing".into(), "Terminated".into(), "Killed".into()]),
        "{kinds:?}"
    );
    // The killed agent is dropped after the second one (its plugin processes, which
    // the second one took over, are ended last).
    drop(second);
    drop(first);
}

#[test]
fn the_skeleton_in_process_runs_tasks_and_recovers_them_after_kill_9() {
    let Some((rig, library)) = rig_with("drover-skeleton-driver", "skeleton", "libskeleton.so")
    else {
        return;
    };
    let mut first = rig.start();
    first.end_tasks = false;
    let rows = served_in_process(&first, "skeleton", &library);
    assert_eq!(
        row_at(&rows, &library)["version"],
        env!("CARGO_PKG_VERSION"),
        "the skeleton shares the workspace version"
    );
    let id = run(&first, "skeleton", r#"{"run_for_ms": 200, "exit_code": 3}"#);
    assert_eq!(wait(&first, &id), Some(3));
    let until_stopped = run(&first, "skeleton", "{}");
    let ends_later = run(
        &first,
        "skeleton",
        r#"{"run_for_ms": 2000, "exit_code": 5}"#,
    );

    first.child.kill().expect("kill -9 the agent");
    first.child.wait().expect("reap the agent");
    let second = rig.start();
    served_in_process(&second, "skeleton", &library);
    for id in [&until_stopped, &ends_later] {
        common::tasks::until(&second, id, Duration::from_secs(30), "recovered", |t| {
            kinds(t).iter().any(|k| k == "Recovered")
        });
    }
    // Recovered from its handle, it ends when it would have, with its own code.
    assert_eq!(wait(&second, &ends_later), Some(5));
    let stopped = second.cli_json(&["task", "stop", &until_stopped, "--json"]);
    assert_eq!(stopped["state"], "dead", "{stopped:#}");
    drop(second);
    drop(first);
}
