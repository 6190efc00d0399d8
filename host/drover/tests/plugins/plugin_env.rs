//! Plugins start with a clean environment: the agent's own variables (its secrets
//! among them) reach a plugin, and through it its tasks, only when the operator lists
//! them.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use drover_test_support::procs::environ;

const SECRET: (&str, &str) = ("DROVER_TEST_AGENT_SECRET", "hunter2");
const LISTED: (&str, &str) = ("DROVER_TEST_LISTED", "listed-value");

/// An agent with `SECRET` and `LISTED` in its environment, `pass_env` as its
/// `DROVER_PLUGIN_PASS_ENV` and `config` as its config file; waits for rawexec.
fn agent(root: &Path, pass_env: &str, config: &str) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let file = root.join("agent.toml");
    std::fs::write(&file, config).unwrap();
    let mut agent = Agent::start_env(
        root,
        &plugins,
        &["--config", file.to_str().unwrap()],
        &[SECRET, LISTED, ("DROVER_PLUGIN_PASS_ENV", pass_env)],
    );
    agent.end_tasks = true;
    agent.wait_plugins(Duration::from_secs(10), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    agent
}

fn rawexec_pid(agent: &Agent) -> u32 {
    let rows = agent.cli_json(&["plugin", "status", "--json"]);
    let rows = rows.as_array().expect("plugin rows");
    row(rows, "raw_exec")["pid"]
        .as_u64()
        .expect("rawexec runs as a process") as u32
}

/// What a task's `sh -c 'echo …'` printed.
fn task_output(agent: &Agent, script: &str) -> String {
    let config = serde_json::json!({"command": "/bin/sh", "args": ["-c", script]}).to_string();
    let task = agent.cli_json(&[
        "task", "run", "--driver", "rawexec", "--config", &config, "--json",
    ]);
    let id = task["id"].as_str().expect("task id").to_owned();
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    std::fs::read_to_string(Path::new(status["task_dir"].as_str().unwrap()).join("logs/stdout.0"))
        .unwrap()
}

#[test]
fn a_plugin_gets_none_of_the_agents_environment_unless_listed() {
    let root = tempfile::tempdir().unwrap();
    let agent = agent(root.path(), "DOCKER_HOST,DROVER_TEST_MARKER", "");
    let env = environ(rawexec_pid(&agent));
    assert!(
        !env.contains_key(SECRET.0) && !env.contains_key(LISTED.0),
        "the plugin inherited the agent's variables: {env:?}"
    );
    // What it needs is there: the search path and the handshake's variables.
    assert!(env.contains_key("PATH"), "{env:?}");
    assert_eq!(
        env.get("DROVER_PLUGIN_MAGIC_COOKIE").map(String::as_str),
        Some(drover_plugin_sdk::handshake::MAGIC_COOKIE_VALUE)
    );
    assert!(env.contains_key("PLUGIN_PROTOCOL_VERSIONS"), "{env:?}");
    // Nor does a task of that plugin see them.
    assert_eq!(
        task_output(
            &agent,
            "echo secret=${DROVER_TEST_AGENT_SECRET:-unset} listed=${DROVER_TEST_LISTED:-unset}"
        ),
        "secret=unset listed=unset\n"
    );
}

#[test]
fn listed_variables_and_set_ones_reach_the_plugin_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let agent = agent(
        root.path(),
        "DOCKER_HOST,DROVER_TEST_MARKER,DROVER_TEST_LISTED",
        "[plugin.rawexec]\nenv = { DROVER_TEST_SET = \"set-value\" }\n\
         [plugin.docker]\npass_env = [\"DROVER_TEST_AGENT_SECRET\"]\n",
    );
    let env = environ(rawexec_pid(&agent));
    assert_eq!(env.get(LISTED.0).map(String::as_str), Some(LISTED.1));
    assert_eq!(
        env.get("DROVER_TEST_SET").map(String::as_str),
        Some("set-value")
    );
    // Passed to the docker plugin only, not to rawexec.
    assert!(!env.contains_key(SECRET.0), "{env:?}");
}

#[test]
fn a_handshake_variable_in_the_config_is_refused_with_the_key_named() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("agent.toml");
    std::fs::write(
        &file,
        "[plugin.rawexec]\nenv = { PLUGIN_MULTIPLEX_GRPC = \"true\" }\n",
    )
    .unwrap();
    let out = std::process::Command::new(drover())
        .args(["agent", "--dev", "--dev-http-addr", "127.0.0.1:0"])
        .args(["--config", file.to_str().unwrap()])
        .arg("--data-dir")
        .arg(root.path().join("data"))
        .output()
        .expect("run drover agent");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[plugin.rawexec] env")
            && stderr.contains("PLUGIN_MULTIPLEX_GRPC")
            && stderr.contains("handshake variable"),
        "{stderr}"
    );
}
