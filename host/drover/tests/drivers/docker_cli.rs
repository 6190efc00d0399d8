//! The docker driver end to end through the `drover` CLI, against a real dockerd: a
//! task's output and exit code, stopping within the kill timeout, env and published
//! ports (checked by inspecting the container), the privileged refusal, host and
//! container namespaces only with the operator's opt-in, OOM kills.

use crate::common;

use std::time::{Duration, Instant};

use common::docker::*;
use serde_json::json;

fn setup(extra: &str) -> Option<(tempfile::TempDir, common::Agent, DockerEnv, Containers)> {
    let env = docker_env()?;
    let root = tempfile::tempdir().unwrap();
    let config = agent_config(root.path(), &env.host, extra);
    let containers = Containers {
        host: env.host.clone(),
        alloc_dir: alloc_dir(root.path()),
    };
    let agent = start_agent(root.path(), &config, "healthy");
    Some((root, agent, env, containers))
}

#[test]
fn busybox_task_echoes_to_its_log_and_exits_0() {
    let Some((_root, agent, env, _c)) = setup("") else {
        return;
    };
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "echo", "args": ["hello from a container"] }),
        &[],
    );
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(logs(&agent, &id), "hello from a container\n");
    let st = status(&agent, &id);
    assert_eq!(st["state"], "dead");
    assert_eq!(st["exit_code"], 0);
    let cid = st["attributes"]["container_id"].as_str().unwrap();
    let info = inspect(&env.host, cid).expect("container kept until destroyed");
    assert_eq!(info["Config"]["Labels"]["drover.task_id"], id.as_str());

    // Destroying the task removes its container.
    assert!(agent.cli(&["task", "destroy", &id]).status.success());
    until(Duration::from_secs(10), "container removed", || {
        inspect(&env.host, cid).is_none()
    });

    // A failing one reports its code.
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c", "echo bad >&2; exit 3"] }),
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(3));
    let err = agent.cli(&["task", "logs", &id, "--stderr"]);
    assert_eq!(String::from_utf8_lossy(&err.stdout), "bad\n");
}

#[test]
fn long_running_container_is_stopped_within_its_timeout() {
    let Some((_root, agent, env, _c)) = setup("") else {
        return;
    };
    // `sleep` as PID 1 ignores SIGTERM: the stop escalates to SIGKILL at the timeout.
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sleep", "args": ["1000"] }),
        &["--kill-timeout", "2s"],
    );
    let cid = container_id(&agent, &id);
    assert_eq!(inspect(&env.host, &cid).unwrap()["State"]["Running"], true);
    let t = Instant::now();
    let stopped = agent.cli_json(&["task", "stop", &id, "--json"]);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(10),
        "stop took {took:?}"
    );
    assert_eq!(stopped["state"], "dead", "{stopped:#}");
    assert_eq!(stopped["exit_code"], 137, "{stopped:#}");
    assert_eq!(inspect(&env.host, &cid).unwrap()["State"]["Running"], false);

    // With an init process SIGTERM reaches sleep: the stop is immediate.
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sleep", "args": ["1000"], "init": true }),
        &["--kill-timeout", "20s"],
    );
    let t = Instant::now();
    let stopped = agent.cli_json(&["task", "stop", &id, "--json"]);
    // Well under the 20 s kill timeout, with room for a busy dockerd.
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    assert_eq!(stopped["exit_code"], 143, "{stopped:#}");
}

#[test]
fn env_reaches_the_container_and_ports_are_published() {
    let Some((root, agent, env, _c)) = setup("") else {
        return;
    };
    let spec = root.path().join("web.toml");
    std::fs::write(
        &spec,
        format!(
            r#"driver = "docker"
name = "web"
kill_timeout = "1s"

[env]
GREETING = "hello"

[config]
image = "{}"
command = "sh"
args = ["-c", "echo $GREETING from $DROVER_TASK_NAME in $DROVER_LOCAL_DIR; exec sleep 1000"]
init = true

[config.ports]
"8080" = 18080
"53/udp" = "127.0.0.1:15353"
"#,
            env.image
        ),
    )
    .unwrap();
    let task = agent.cli_json(&["task", "run", spec.to_str().unwrap(), "--json"]);
    let id = task["id"].as_str().unwrap().to_owned();
    until(Duration::from_secs(10), "greeting in the log", || {
        logs(&agent, &id) == "hello from web in /local\n"
    });
    let info = inspect(&env.host, &container_id(&agent, &id)).unwrap();
    let ports = &info["HostConfig"]["PortBindings"];
    assert_eq!(ports["8080/tcp"][0]["HostPort"], "18080", "{ports}");
    assert_eq!(ports["53/udp"][0]["HostIp"], "127.0.0.1", "{ports}");
    assert_eq!(ports["53/udp"][0]["HostPort"], "15353", "{ports}");
    let env_list: Vec<&str> = info["Config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(env_list.contains(&"GREETING=hello"), "{env_list:?}");
    assert!(agent.cli(&["task", "stop", &id]).status.success());
}

#[test]
fn privileged_is_refused_by_default_with_a_clear_error() {
    let Some((_root, agent, env, _c)) = setup("") else {
        return;
    };
    let config = json!({ "image": env.image, "command": "true", "privileged": true }).to_string();
    let out = agent.cli(&["task", "run", "--driver", "docker", "--config", &config]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("privileged containers are not allowed") && err.contains("allow_privileged"),
        "{err}"
    );
    assert_eq!(
        agent.cli_json(&["task", "list", "--json"]),
        json!([]),
        "a task was created"
    );
}

#[test]
fn operator_allowances_let_privileged_and_extra_capabilities_through() {
    let Some((_root, agent, env, _c)) = setup(r#"allow_privileged = true, allow_caps = ["ALL"]"#)
    else {
        return;
    };
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "true", "cap_add": ["sys_admin"] }),
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    let info = inspect(&env.host, &container_id(&agent, &id)).unwrap();
    assert_eq!(info["HostConfig"]["CapAdd"], json!(["SYS_ADMIN"]));

    let config = json!({ "image": env.image, "command": "true", "privileged": true }).to_string();
    let out = agent.cli(&[
        "task", "run", "--driver", "docker", "--config", &config, "--json",
    ]);
    if out.status.success() {
        let task: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = task["id"].as_str().unwrap();
        let info = inspect(&env.host, &container_id(&agent, id)).unwrap();
        assert_eq!(info["HostConfig"]["Privileged"], true);
    } else {
        // Where the test itself runs without every capability (some VMs and CI
        // containers), runc cannot start a privileged container; the driver let it
        // through, and the runtime's reason is passed on.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("not allowed") && err.contains("OCI runtime"),
            "{err}"
        );
    }
}

/// Another container on the task's daemon, not made by Drover and not the task's:
/// `sleep` on its own network. Labelled with the agent's alloc dir so that the test's
/// clean-up removes it.
fn other_container(env: &DockerEnv, c: &Containers) -> String {
    env.cli_ok(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        &format!("drover.alloc_dir={}", c.alloc_dir.display()),
        &env.image,
        "sleep",
        "1000",
    ])
}

fn network_task(env: &DockerEnv, network_mode: &str) -> serde_json::Value {
    json!({ "image": env.image, "command": "readlink", "args": ["/proc/self/ns/net"],
            "network_mode": network_mode })
}

/// Issue 10, scenario 7: `network_mode: "host"` and `"container:<any container>"` are
/// host-level modes. With no opt-in in the plugin config, a task asking for either is
/// refused at `task run` with the option and the setting that allows it named, and
/// nothing is created.
#[test]
fn host_and_container_network_modes_are_refused_without_the_opt_in() {
    let Some((_root, agent, env, c)) = setup("") else {
        return;
    };
    let other = other_container(&env, &c);
    for (mode, setting) in [
        ("host".to_owned(), "allow_host_namespaces"),
        (format!("container:{other}"), "allow_container_namespaces"),
    ] {
        let config = network_task(&env, &mode).to_string();
        let out = agent.cli(&["task", "run", "--driver", "docker", "--config", &config]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "network_mode {mode:?} was accepted");
        assert!(
            err.contains("network_mode") && err.contains(&mode) && err.contains(setting),
            "network_mode {mode:?}: {err}"
        );
    }
    assert_eq!(
        agent.cli_json(&["task", "list", "--json"]),
        json!([]),
        "a task was created"
    );
    let made = env.cli_ok(&[
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &format!("label=drover.alloc_dir={}", c.alloc_dir.display()),
    ]);
    assert_eq!(made, other, "a container was created for a refused task");
}

/// Scenario 7 with the opt-ins: the same two tasks run, each in the network namespace
/// it asked for (the host's, the other container's).
#[test]
fn host_and_container_network_modes_run_with_the_opt_in() {
    let Some((_root, agent, env, c)) =
        setup(r#"allow_host_namespaces = ["network"], allow_container_namespaces = true"#)
    else {
        return;
    };
    let other = other_container(&env, &c);
    let other_ns = env.cli_ok(&["exec", &other, "readlink", "/proc/self/ns/net"]);
    // The test runs in the host's network namespace, which is dockerd's.
    let host_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(other_ns, host_ns.display().to_string());
    for (mode, want) in [
        ("host".to_owned(), host_ns.display().to_string()),
        (format!("container:{other}"), other_ns),
    ] {
        let id = run(&agent, &network_task(&env, &mode), &[]);
        let out = agent.cli(&["task", "wait", &id]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(logs(&agent, &id).trim(), want, "network_mode {mode:?}");
    }
}

#[test]
fn memory_limited_container_over_its_limit_is_reported_oom_killed() {
    let Some((_root, agent, env, _c)) = setup("") else {
        return;
    };
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sh",
                 "args": ["-c", "x=aaaaaaaa; while :; do x=$x$x; done"] }),
        &["--memory-mb", "16"],
    );
    let info = inspect(&env.host, &container_id(&agent, &id)).unwrap();
    assert_eq!(info["HostConfig"]["Memory"], 16 << 20);
    agent.cli(&["task", "wait", &id]);
    let st = status(&agent, &id);
    assert_eq!(st["state"], "dead");
    assert_eq!(st["oom_killed"], true, "{st:#}");
    let events = agent.cli_json(&["task", "events", &id, "--json"]);
    let terminated = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "Terminated")
        .unwrap_or_else(|| panic!("no Terminated event: {events:#}"));
    assert!(
        terminated["message"]
            .as_str()
            .unwrap()
            .contains("OOM killed"),
        "{terminated:#}"
    );
}
