//! The docker driver's health follows the daemon: stopping dockerd makes it
//! `unhealthy` within seconds, with the reason; starting dockerd again makes it
//! `healthy`, without restarting the agent or the plugin; a container the daemon's
//! stop killed is reported dead once it answers again. This test runs its own
//! private dockerd (own socket, data and exec dirs) so it disturbs no other test.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::docker::*;
use common::nix_kill;

/// A dockerd of this test only, stopped (SIGTERM, then SIGKILL) on drop.
struct Dockerd {
    child: Option<Child>,
}

impl Dockerd {
    fn socket(dir: &Path) -> PathBuf {
        dir.join("docker.sock")
    }

    fn host(dir: &Path) -> String {
        format!("unix://{}", Self::socket(dir).display())
    }

    fn start(dir: &Path) -> Dockerd {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("dockerd.log"))
            .unwrap();
        let child = Command::new("dockerd")
            .arg("--host")
            .arg(Self::host(dir))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .args([
                "--bridge",
                "none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start dockerd");
        let d = Dockerd { child: Some(child) };
        let host = Self::host(dir);
        until(Duration::from_secs(30), "private dockerd answers", || {
            docker(&host, &["version"]).status.success()
        });
        d
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = nix_kill(child.id(), 15);
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn health_follows_the_daemon_without_restarts() {
    // Runs where the shared test daemon runs (scripts/test.sh), with a dockerd of its own.
    let Some(shared) = docker_env() else { return };
    let root = tempfile::tempdir().unwrap();
    let dockerd_dir = root.path().join("d");
    std::fs::create_dir(&dockerd_dir).unwrap();
    let mut dockerd = Dockerd::start(&dockerd_dir);
    let host = Dockerd::host(&dockerd_dir);
    let config = agent_config(root.path(), &host, "");
    let agent = start_agent(root.path(), &config, "healthy");
    let row = wait_docker(&agent, "healthy", Duration::from_secs(10));
    let pid = row["pid"].as_u64().unwrap();
    let version = String::from_utf8_lossy(
        &docker(&host, &["version", "--format", "{{.Server.Version}}"]).stdout,
    )
    .trim()
    .to_owned();
    assert!(
        row["reason"].as_str().unwrap().contains(&version),
        "{row:#}"
    );

    // Its image copied over from the shared daemon, a task runs on it.
    let copied = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "docker -H '{}' save '{}' | docker -H '{host}' load",
            shared.host, shared.image
        ))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{copied:?}");
    let sleeper = run(
        &agent,
        &serde_json::json!({ "image": shared.image, "command": "sleep", "args": ["1000"] }),
        &[],
    );

    // (dockerd takes its time: it stops the sleeper first, SIGKILL after 10 s.)
    dockerd.stop();
    let t = Instant::now();
    let row = wait_docker(&agent, "unhealthy", Duration::from_secs(10));
    eprintln!("unhealthy {:?} after dockerd stopped", t.elapsed());
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains(&Dockerd::socket(&dockerd_dir).display().to_string()),
        "reason does not name the daemon: {reason}"
    );
    assert_eq!(row["pid"].as_u64(), Some(pid));

    let mut _dockerd = Dockerd::start(&dockerd_dir);
    let t = Instant::now();
    let row = wait_docker(&agent, "healthy", Duration::from_secs(10));
    eprintln!("healthy {:?} after dockerd answered again", t.elapsed());
    assert_eq!(row["pid"].as_u64(), Some(pid), "the plugin was restarted");
    // The daemon's stop killed the sleeper (no live-restore); its end is reported once
    // the daemon answers again.
    let out = agent.cli(&["task", "wait", &sleeper]);
    assert!(!out.status.success(), "{out:?}");
    let st = status(&agent, &sleeper);
    assert_eq!(st["state"], "dead", "{st:#}");
    assert!(st["exit_code"].as_i64().is_some_and(|c| c != 0), "{st:#}");
    // And new tasks run.
    let id = run(
        &agent,
        &serde_json::json!({ "image": shared.image, "command": "echo", "args": ["back"] }),
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    assert_eq!(logs(&agent, &id), "back\n");
}
