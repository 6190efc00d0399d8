//! A driver plugin killed with SIGKILL while tasks run: the agent relaunches it and the
//! task runner hands every task back to the new process, restarting none.

use crate::common;

use std::time::Duration;

use common::tasks::*;
use common::*;
use drover_api::{StatusCode, StopRequest, TaskEventKind, TaskLifecycle, TaskView};

/// `pid` of the rawexec row of `plugin status`.
fn rawexec_pid(agent: &Agent) -> u32 {
    let rows = agent.cli_json(&["plugin", "status", "--json"]);
    let rows = rows.as_array().cloned().unwrap_or_default();
    row(&rows, "raw_exec")["pid"]
        .as_u64()
        .expect("rawexec has a pid") as u32
}

fn task_pid(task: &TaskView) -> u32 {
    pid_of(task).unwrap_or_else(|| panic!("no pid: {task:#?}"))
}

/// Kills the task processes when the test ends, passed or not: they are not children
/// of the test and carry no marker the agent helper could find.
struct Reap(Vec<u32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            if running(*pid) {
                let _ = nix_kill(*pid, 9);
            }
        }
    }
}

#[test]
fn killed_plugin_is_relaunched_and_every_task_recovered_not_restarted() {
    let (root, agent) = agent();
    let marker = root.path().join("starts");
    let mut tasks = Vec::new();
    let mut reap = Reap(Vec::new());
    for _ in 0..3 {
        // Each start appends a line: a restart would show as a second line.
        let script = format!("echo $$ >> {}; exec sleep 1000", marker.display());
        let task = run(
            &agent,
            serde_json::json!({
                "driver": "rawexec",
                "config": {"command": "/bin/sh", "args": ["-c", script]},
                "restart": {"attempts": 3, "interval": "1m", "delay": "100ms"},
            }),
        );
        reap.0.push(task_pid(&task));
        tasks.push((task.id.clone(), task_pid(&task)));
    }

    let old = rawexec_pid(&agent);
    nix_kill(old, 9).unwrap();

    for (id, pid) in &tasks {
        let task = until(&agent, id, Duration::from_secs(15), "recovered", |t| {
            kinds(t).last().map(String::as_str) == Some("Recovered")
        });
        assert_eq!(task.state, TaskLifecycle::Running, "{task:#?}");
        assert_eq!(task_pid(&task), *pid, "a different process runs the task");
        assert!(running(*pid), "task process {pid} is gone");
        let kinds = kinds(&task);
        assert_eq!(
            kinds,
            ["Received", "Started", "DriverFailure", "Recovered"],
            "{task:#?}"
        );
        let failure = &agent_events(&task)[2].message;
        assert!(
            failure.contains("driver raw_exec is unavailable"),
            "{failure}"
        );
    }
    assert_ne!(rawexec_pid(&agent), old, "the plugin was not relaunched");
    let lines = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(
        lines.lines().count(),
        3,
        "a task was started twice: {lines}"
    );

    // The recovered tasks answer to the new plugin process.
    let api = agent.api();
    for (id, pid) in &tasks {
        let stopped = api
            .block_on(api.stop_task(id, &StopRequest::default()))
            .expect("stop the task");
        assert_eq!(stopped.state, TaskLifecycle::Dead);
        assert_eq!(stopped.restarts, 0);
        assert!(kinds(&stopped).ends_with(&[
            "Killing".into(),
            "Terminated".into(),
            "Killed".into()
        ]));
        assert!(!running(*pid), "task process {pid} survived its stop");
    }
}

/// A task that waits for `flag` to exist, then exits with `code`.
fn exit_on_flag(flag: &std::path::Path, code: i32) -> serde_json::Value {
    serde_json::json!({
        "driver": "rawexec",
        "config": {"command": "/bin/sh", "args": ["-c", format!(
            "while [ ! -e {} ]; do sleep 0.05; done; exit {code}", flag.display()
        )]},
    })
}

#[test]
fn exit_codes_arrive_across_a_plugin_crash_and_a_broken_executor_socket_is_reported() {
    let (root, agent) = agent();
    let early = root.path().join("early");
    let late = root.path().join("late");
    let mut reap = Reap(Vec::new());
    let mut start = |body: serde_json::Value| {
        let task = run(&agent, body);
        reap.0.push(task_pid(&task));
        task
    };
    // Exits while the plugin is dead, exits after it is back, never exits.
    let a = start(exit_on_flag(&early, 7));
    let b = start(exit_on_flag(&late, 9));
    let c = start(serde_json::json!({
        "driver": "rawexec",
        "config": {"command": "/bin/sleep", "args": ["1000"]},
    }));
    let id = |t: &TaskView| t.id.clone();
    // Break c's executor socket, then crash the plugin: the relaunched plugin cannot
    // reach c's executor.
    let sock = std::path::Path::new(&c.attributes["executor_dir"]).join("sock");
    std::fs::remove_file(&sock).unwrap();
    nix_kill(rawexec_pid(&agent), 9).unwrap();
    std::fs::write(&early, "").unwrap();

    let a_done = until(&agent, &id(&a), Duration::from_secs(20), "dead", |t| {
        t.state == TaskLifecycle::Dead
    });
    assert_eq!(a_done.exit_code, Some(7), "{a_done:#?}");
    // c still runs (its executor is alive): it is not reported as exited, but a
    // DriverFailure event names the broken socket, promptly.
    let c_now = until(&agent, &id(&c), Duration::from_secs(20), "reported", |t| {
        t.events.iter().any(|e| {
            e.kind == TaskEventKind::DriverFailure
                && e.message.contains(&sock.display().to_string())
        })
    });
    assert_eq!(c_now.state, TaskLifecycle::Running, "{c_now:#?}");
    assert!(c_now.exit_code.is_none(), "{c_now:#?}");
    assert!(
        !kinds(&c_now).iter().any(|k| k == "Terminated"),
        "{c_now:#?}"
    );
    // Forgetting it would leak its process: refused, saying why.
    let api = agent.api();
    let refused = api
        .block_on(api.destroy_task(&id(&c), true))
        .expect_err("destroying a task nobody can kill");
    assert_eq!(
        refused.status(),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "{refused:?}"
    );

    let b_recovered = until(&agent, &id(&b), Duration::from_secs(20), "recovered", |t| {
        kinds(t).iter().any(|k| k == "Recovered")
    });
    assert_eq!(
        b_recovered.state,
        TaskLifecycle::Running,
        "{b_recovered:#?}"
    );
    std::fs::write(&late, "").unwrap();
    let out = agent.cli(&["task", "wait", &id(&b)]);
    assert_eq!(
        out.status.code(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
