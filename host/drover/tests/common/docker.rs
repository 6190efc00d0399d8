//! Helpers for the docker end-to-end tests: the daemon they use (a private dockerd
//! started by `scripts/test.sh`), an agent configured for it, and the docker CLI.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::Agent;

pub use drover_test_support::docker::{DockerEnv, docker, docker_env, inspect};

/// Write the agent config for a docker daemon at `host` under `root`; `extra` is
/// TOML inside the docker plugin's config table (e.g. `allow_privileged = true`).
pub fn agent_config(root: &Path, host: &str, extra: &str) -> PathBuf {
    let path = root.join("agent.toml");
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    std::fs::write(
        &path,
        format!("[plugin.docker]\nconfig = {{ endpoint = \"{host}\"{extra} }}\n"),
    )
    .expect("write agent config");
    path
}

/// Start an agent on `root` (data dir `root/data`) with the config at `config`, and
/// wait until its docker driver is in `state`.
pub fn start_agent(root: &Path, config: &Path, state: &str) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    // A killed agent leaves its socket file; the helper waits for the file to appear.
    let _ = std::fs::remove_file(root.join("data").join("api.sock"));
    let agent = Agent::start(
        root,
        &plugins,
        &["--config", config.to_str().expect("utf-8 path")],
    );
    wait_docker(&agent, state, Duration::from_secs(30));
    agent
}

/// The docker row of `plugin status`, once its state is `state`.
pub fn wait_docker(agent: &Agent, state: &str, within: Duration) -> serde_json::Value {
    let rows = agent.wait_plugins(within, |rows| {
        rows.iter()
            .any(|r| r["name"] == "docker" && r["state"] == state)
    });
    rows.into_iter()
        .find(|r| r["name"] == "docker" && r["state"] == state)
        .expect("docker row")
}

/// Run a docker task from flags; returns its id.
pub fn run(agent: &Agent, config: &serde_json::Value, extra: &[&str]) -> String {
    let config = config.to_string();
    let mut args = vec![
        "task", "run", "--driver", "docker", "--config", &config, "--json",
    ];
    args.extend_from_slice(extra);
    let task = agent.cli_json(&args);
    task["id"].as_str().expect("task id").to_owned()
}

pub fn status(agent: &Agent, id: &str) -> serde_json::Value {
    agent.cli_json(&["task", "status", id, "--json"])
}

pub fn container_id(agent: &Agent, id: &str) -> String {
    status(agent, id)["attributes"]["container_id"]
        .as_str()
        .unwrap_or_else(|| panic!("task {id} has no container_id attribute"))
        .to_owned()
}

/// `drover task logs ID` (stdout).
pub fn logs(agent: &Agent, id: &str) -> String {
    let out = agent.cli(&["task", "logs", id]);
    assert!(
        out.status.success(),
        "task logs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Poll `cond` every 50 ms (each look may run the docker CLI) until it holds,
/// panicking with `what` after `within`.
pub fn until(within: Duration, what: &str, cond: impl FnMut() -> bool) {
    drover_test_support::until_blocking(within, Duration::from_millis(50), what, cond)
}

/// Removes every container of an agent's tasks (labelled with its alloc dir) on drop,
/// also when the test fails.
pub struct Containers {
    pub host: String,
    pub alloc_dir: PathBuf,
}

impl Drop for Containers {
    fn drop(&mut self) {
        let out = docker(
            &self.host,
            &[
                "ps",
                "-aq",
                "--filter",
                &format!("label=drover.alloc_dir={}", self.alloc_dir.display()),
            ],
        );
        let ids = String::from_utf8_lossy(&out.stdout).into_owned();
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = docker(&self.host, &args);
        }
    }
}

/// The agent's alloc dir under `root` (where task directories live).
pub fn alloc_dir(root: &Path) -> PathBuf {
    root.join("data").join("alloc")
}
