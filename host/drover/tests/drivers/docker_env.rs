//! The docker driver follows the docker client's variables of the agent's environment,
//! as Nomad's docker driver does: `DOCKER_HOST` reaches the docker plugin (and no other
//! plugin) without any `plugin_pass_env`, and a reason for "no docker daemon" names
//! the address tried and where it came from.

use crate::common;

use std::time::Duration;

use common::docker::*;
use common::*;

/// The agent's environment variables a plugin process started with, by its pid.
fn environ(pid: u64) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

#[test]
fn the_docker_driver_follows_docker_host_of_the_agents_environment() {
    let Some(env) = docker_env() else { return };
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    // No endpoint in the config and DOCKER_HOST in no pass list: only the agent's
    // environment says where the daemon is.
    let agent = Agent::start_env(
        root.path(),
        &plugins,
        &[],
        &[
            ("DOCKER_HOST", env.host.as_str()),
            ("DROVER_PLUGIN_PASS_ENV", "DROVER_TEST_MARKER"),
        ],
    );
    let docker = wait_docker(&agent, "healthy", Duration::from_secs(30));
    let reason = docker["reason"].as_str().unwrap();
    assert!(reason.contains(&env.host), "{docker:#}");
    let docker_pid = docker["pid"].as_u64().unwrap();
    let docker_env = environ(docker_pid);
    assert!(
        docker_env.contains(&format!("DOCKER_HOST={}", env.host)),
        "{docker_env:?}"
    );
    // Only the docker driver gets it.
    let rows = agent.wait_plugins(Duration::from_secs(30), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    let raw_exec_pid = row(&rows, "raw_exec")["pid"].as_u64().unwrap();
    let raw_exec_env = environ(raw_exec_pid);
    assert!(
        !raw_exec_env.iter().any(|v| v.starts_with("DOCKER_HOST=")),
        "{raw_exec_env:?}"
    );
    // And a task runs on that daemon.
    let id = run(
        &agent,
        &serde_json::json!({ "image": env.image, "command": "echo", "args": ["hi"] }),
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    assert_eq!(logs(&agent, &id), "hi\n");
    drop(agent);

    // DOCKER_HOST at a socket that does not exist: the reason names it and says it
    // came from DOCKER_HOST.
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let missing = format!("unix://{}/no-docker.sock", root.path().display());
    let agent = Agent::start_env(
        root.path(),
        &plugins,
        &[],
        &[
            ("DOCKER_HOST", missing.as_str()),
            ("DROVER_PLUGIN_PASS_ENV", "DROVER_TEST_MARKER"),
        ],
    );
    let docker = wait_docker(&agent, "undetected", Duration::from_secs(30));
    let reason = docker["reason"].as_str().unwrap();
    assert_eq!(
        reason,
        format!("no docker daemon: {missing} does not exist (from DOCKER_HOST)"),
        "{docker:#}"
    );
}
