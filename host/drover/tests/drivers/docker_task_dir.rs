//! A docker task's directory is hostile territory (issue 10, scenario 1): a task must
//! not reach host files through links it plants there. Against a real dockerd and the
//! real agent and docker plugin:
//! - a writable bind of `logs` (the scenario exactly: `ln -sf <secret> /hl/stdout.0`)
//!   is refused, so `drover task logs` cannot print a root-only host file;
//! - a link planted in the log directory (by a task of an older plugin, or anything
//!   else of the task's) is neither written through by the plugin after a restart nor
//!   read through by `drover task logs`;
//! - a relative `volumes` source that a previous incarnation replaced with a link is
//!   refused at the restart instead of being bound;
//! - the task directory, log directory and log files have the documented modes.

use crate::common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::docker::*;
use common::{Agent, nix_kill};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const SECRET: &str = "TOP SECRET: root only\n";

fn setup() -> Option<(tempfile::TempDir, Agent, DockerEnv, Containers)> {
    let env = docker_env()?;
    let root = tempfile::tempdir().unwrap();
    let config = agent_config(root.path(), &env.host, "");
    let containers = Containers {
        host: env.host.clone(),
        alloc_dir: alloc_dir(root.path()),
    };
    let agent = start_agent(root.path(), &config, "healthy");
    Some((root, agent, env, containers))
}

/// A root-only file (0600 in a 0700 directory) standing for `/root/secret`.
fn secret(root: &Path) -> PathBuf {
    let dir = root.join("root-home");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, SECRET).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn task_dir(agent: &Agent, id: &str) -> PathBuf {
    PathBuf::from(status(agent, id)["task_dir"].as_str().expect("task_dir"))
}

fn docker_pid(agent: &Agent) -> u32 {
    wait_docker(agent, "healthy", WAIT)["pid"]
        .as_u64()
        .expect("docker plugin pid") as u32
}

/// Scenario 1 as the issue tells it: a docker task with
/// `"mounts":[{"type":"bind","source":"logs","target":"/hl"}]` runs
/// `ln -sf /root/secret /hl/stdout.0`; then `drover task logs ID` printed the
/// root-only host file, and the plugin appended the container's output to it.
#[test]
fn scenario_1_a_writable_bind_of_logs_is_refused() {
    let Some((root, agent, env, _c)) = setup() else {
        return;
    };
    let secret = secret(root.path());
    let config = json!({
        "image": env.image,
        "command": "sh",
        "args": ["-c", format!(
            "ln -sf {} /hl/stdout.0; echo written after the link; sleep 1; echo again",
            secret.display()
        )],
        "mounts": [{"type": "bind", "source": "logs", "target": "/hl"}],
    })
    .to_string();
    let out = agent.cli(&[
        "task", "run", "--driver", "docker", "--config", &config, "--json",
    ]);
    if out.status.success() {
        // The mount was let through: show what the task got, then fail.
        let task: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = task["id"].as_str().unwrap().to_owned();
        let _ = agent.cli(&["task", "wait", &id]);
        let logs = agent.cli(&["task", "logs", &id]);
        panic!(
            "a writable bind of the task's logs/ was accepted; `drover task logs` printed \
             {:?}; the root-only file now holds {:?}",
            String::from_utf8_lossy(&logs.stdout),
            std::fs::read_to_string(&secret).unwrap()
        );
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mounts") && err.contains("logs/") && err.contains("read-only"),
        "{err}"
    );
    assert_eq!(agent.cli_json(&["task", "list", "--json"]), json!([]));
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), SECRET);

    // Read-only, the log directory may be mounted: the task cannot plant anything.
    let config = json!({
        "image": env.image,
        "command": "sh",
        "args": ["-c", format!(
            "echo mine; ln -sf {} /hl/stdout.0 || echo refused by the read-only mount >&2",
            secret.display()
        )],
        "mounts": [{"type": "bind", "source": "logs", "target": "/hl", "readonly": true}],
    });
    let id = run(&agent, &config, &[]);
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    until(WAIT, "both streams copied", || {
        let err = agent.cli(&["task", "logs", &id, "--stderr"]);
        String::from_utf8_lossy(&err.stdout).contains("refused by the read-only mount")
    });
    assert_eq!(logs(&agent, &id), "mine\n");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), SECRET);
}

/// A link planted in the log directory (as a task given a writable bind by an older
/// plugin did): after a plugin restart the plugin re-opens the log files and must not
/// append the container's output through the link, as root; `drover task logs` must
/// not read through it.
#[test]
fn a_link_planted_in_the_log_dir_is_neither_written_nor_read_through() {
    let Some((root, agent, env, _c)) = setup() else {
        return;
    };
    let secret = secret(root.path());
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c",
            "echo before; while [ ! -e /local/go ]; do sleep 0.05; done; echo after; exec sleep 1000"],
            "init": true }),
        &["--kill-timeout", "1s"],
    );
    until(WAIT, "first line copied", || {
        logs(&agent, &id) == "before\n"
    });
    let dir = task_dir(&agent, &id);
    let cid = container_id(&agent, &id);

    // The link replaces the log file; the plugin is killed so that the next one opens
    // the files again.
    std::fs::remove_file(dir.join("logs/stdout.0")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("logs/stdout.0")).unwrap();
    let old = docker_pid(&agent);
    nix_kill(old, 9).unwrap();
    until(WAIT, "docker plugin relaunched", || {
        agent
            .cli_json(&["plugin", "status", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "docker" && r["state"] == "healthy" && r["pid"] != old)
    });
    std::fs::write(dir.join("local/go"), "").unwrap();
    until(WAIT, "the container printed `after`", || {
        String::from_utf8_lossy(&env.cli(&["logs", &cid]).stdout).contains("after")
    });
    // The new plugin either wrote through the link or refused it (and says so).
    until(
        WAIT,
        "the plugin wrote through the link or refused it",
        || {
            std::fs::read_to_string(&secret).unwrap() != SECRET
                || agent.log_text().contains("is a symbolic link")
        },
    );
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        SECRET,
        "the plugin appended the container's output to a root-only host file"
    );
    assert!(
        std::fs::symlink_metadata(dir.join("logs/stdout.0"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    let out = agent.cli(&["task", "logs", &id]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !printed.contains("TOP SECRET"),
        "`drover task logs` printed the host file: {printed:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("symbolic link"),
        "{}: {printed:?} {err}",
        out.status
    );
    assert!(agent.cli(&["task", "stop", &id]).status.success());
}

/// A relative `volumes` source is resolved at every start. The first incarnation
/// replaces `local/data` with a link to a host directory and fails; the restart must
/// refuse the link instead of binding the host directory writable at `/data`.
#[test]
fn a_volume_source_linked_by_a_previous_incarnation_is_refused_at_restart() {
    let Some((root, agent, env, _c)) = setup() else {
        return;
    };
    let host = root.path().join("host-dir");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("precious"), "keep\n").unwrap();
    let script = format!(
        "if [ -L /local/data ]; then echo pwned > /data/pwned; ls /data; exit 0; fi; \
         rm -rf /local/data && ln -s {} /local/data && echo planted; exit 3",
        host.display()
    );
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c", script],
                 "volumes": ["local/data:/data"] }),
        &[
            "--restart-attempts",
            "1",
            "--restart-delay",
            "100ms",
            "--restart-mode",
            "fail",
        ],
    );
    let out = agent.cli(&["task", "wait", &id]);
    let view = agent.cli_json(&["task", "status", &id, "--json"]);
    assert!(
        !host.join("pwned").exists(),
        "the restarted container wrote into the host directory: {view:#}"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("precious")).unwrap(),
        "keep\n"
    );
    assert_ne!(out.status.code(), Some(0), "{view:#}");
    let events = agent.cli(&["task", "events", &id]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(
        events.contains("local/data") && events.contains("symbolic link"),
        "{events}"
    );
}

/// The task directory keeps other host users out; the log directory and files are
/// the agent's (root's) alone.
#[test]
fn task_dir_and_log_modes_are_as_documented() {
    let Some((_root, agent, env, _c)) = setup() else {
        return;
    };
    let id = run(
        &agent,
        &json!({ "image": env.image, "command": "sh", "args": ["-c", "echo out; echo err >&2"] }),
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    until(WAIT, "output copied", || logs(&agent, &id) == "out\n");
    let dir = task_dir(&agent, &id);
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    let owner = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
    let me = rustix::process::geteuid().as_raw();
    assert_eq!(mode(&dir), 0o700);
    for (sub, m) in [
        ("logs", 0o700),
        ("tmp", 0o700),
        ("secrets", 0o700),
        ("local", 0o755),
    ] {
        assert_eq!(mode(&dir.join(sub)), m, "{sub}/");
    }
    assert_eq!(owner(&dir.join("logs")), me);
    for f in ["stdout.0", "stderr.0", ".docker-logs.cursor"] {
        let p = dir.join("logs").join(f);
        assert_eq!((mode(&p), owner(&p)), (0o600, me), "{f}");
    }
}
