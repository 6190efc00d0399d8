//! `kill -9` of the docker plugin, of the agent, and of both, while containers run:
//! after each restart every container is recovered (same container id), its logs go
//! on with every line exactly once, and exit codes arrive, including those of
//! containers that exited while no agent (or no agent and no plugin) watched.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::docker::*;
use common::{Agent, nix_kill};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn docker_pid(agent: &Agent) -> u32 {
    wait_docker(agent, "healthy", WAIT)["pid"]
        .as_u64()
        .expect("docker plugin pid") as u32
}

fn kill9_agent(agent: &mut Agent) {
    agent.child.kill().expect("kill -9 the agent");
    agent.child.wait().expect("reap the agent");
}

fn task_dir(agent: &Agent, id: &str) -> PathBuf {
    PathBuf::from(status(agent, id)["task_dir"].as_str().expect("task_dir"))
}

/// The counter's log must be `line 1` … `line n`, each once, in order; returns n.
fn counted(agent: &Agent, id: &str) -> usize {
    let text = logs(agent, id);
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(
            *l,
            format!("line {}", i + 1),
            "log out of sequence:\n{text}"
        );
    }
    lines.len()
}

/// Wait until the counter has written `more` lines beyond `now`.
fn grows(agent: &Agent, id: &str, now: usize, more: usize) -> usize {
    let mut n = now;
    until(WAIT, "the counter's log grows", || {
        n = counted(agent, id);
        n >= now + more
    });
    n
}

#[test]
fn containers_survive_kill9_of_the_plugin_and_the_agent() {
    let Some(env) = docker_env() else { return };
    let root = tempfile::tempdir().unwrap();
    let config = agent_config(root.path(), &env.host, "");
    let _containers = Containers {
        host: env.host.clone(),
        alloc_dir: alloc_dir(root.path()),
    };
    // Killed agents are kept until the end: dropping one SIGKILLs the plugins it
    // started, which the next agent may have reattached to.
    let mut retired = Vec::new();
    let mut agent = start_agent(root.path(), &config, "healthy");

    let counter = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c",
            "i=0; while [ ! -e /local/stop ]; do i=$((i+1)); echo line $i; sleep 0.05; done; exit 3"] }),
        &[],
    );
    let quitter = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c",
            "echo hello; while [ ! -e /local/go ]; do sleep 0.05; done; echo bye; exit 9"] }),
        &[],
    );
    let late = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c",
            "while [ ! -e /local/go ]; do sleep 0.05; done; echo late; exit 4"] }),
        &[],
    );
    let late_cid = container_id(&agent, &late);
    let late_dir = task_dir(&agent, &late);
    let counter_cid = container_id(&agent, &counter);
    let quitter_cid = container_id(&agent, &quitter);
    let counter_dir = task_dir(&agent, &counter);
    let quitter_dir = task_dir(&agent, &quitter);
    let mut n = grows(&agent, &counter, 0, 5);

    // 1. The plugin dies; the agent relaunches it, which recovers both containers.
    let old = docker_pid(&agent);
    nix_kill(old, 9).unwrap();
    let mut relaunched = 0;
    until(WAIT, "docker plugin relaunched", || {
        let rows = agent.cli_json(&["plugin", "status", "--json"]);
        relaunched = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "docker" && r["state"] == "healthy")
            .and_then(|r| r["pid"].as_u64())
            .unwrap_or(0) as u32;
        relaunched != 0 && relaunched != old
    });
    n = grows(&agent, &counter, n, 10);
    assert_eq!(container_id(&agent, &counter), counter_cid);
    assert_eq!(status(&agent, &quitter)["state"], "running");

    // 2. The agent dies; the plugin lives on. The quitter exits meanwhile.
    let plugin = docker_pid(&agent);
    kill9_agent(&mut agent);
    retired.push(agent);
    std::fs::write(quitter_dir.join("local/go"), "").unwrap();
    until(WAIT, "quitter exits", || {
        inspect(&env.host, &quitter_cid).is_some_and(|v| v["State"]["Running"] == false)
    });
    agent = start_agent(root.path(), &config, "healthy");
    assert_eq!(docker_pid(&agent), plugin, "the plugin was not reattached");
    let out = agent.cli(&["task", "wait", &quitter]);
    assert_eq!(out.status.code(), Some(9), "{}", agent.log_text());
    assert_eq!(logs(&agent, &quitter), "hello\nbye\n");
    assert_eq!(container_id(&agent, &counter), counter_cid);
    n = grows(&agent, &counter, n, 10);

    // 3. Both die at once, and `late` exits while nothing watches it; a new agent
    // starts a new plugin, which recovers the containers and reads late's exit code.
    let plugin = docker_pid(&agent);
    kill9_agent(&mut agent);
    retired.push(agent);
    nix_kill(plugin, 9).unwrap();
    std::fs::write(late_dir.join("local/go"), "").unwrap();
    until(WAIT, "late exits", || {
        inspect(&env.host, &late_cid).is_some_and(|v| v["State"]["Running"] == false)
    });
    agent = start_agent(root.path(), &config, "healthy");
    let out = agent.cli(&["task", "wait", &late]);
    assert_eq!(out.status.code(), Some(4), "{}", agent.log_text());
    assert_eq!(logs(&agent, &late), "late\n");
    assert_ne!(docker_pid(&agent), plugin);
    assert_eq!(status(&agent, &counter)["state"], "running");
    assert_eq!(container_id(&agent, &counter), counter_cid);
    n = grows(&agent, &counter, n, 10);

    // The end: the exit code arrives and the log is whole.
    std::fs::write(counter_dir.join("local/stop"), "").unwrap();
    let out = agent.cli(&["task", "wait", &counter]);
    assert_eq!(out.status.code(), Some(3), "{}", agent.log_text());
    let total = counted(&agent, &counter);
    eprintln!("counter wrote {total} lines; {n} seen before the last restart");
    assert!(total >= n, "{total} < {n}");
    drop(agent);
    drop(retired);
}
