//! Helpers for the docker driver's tests: the daemon they run against, the real plugin
//! binary driven through the SDK client, and clean-up of everything a test made.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{LaunchOptions, PluginClient, PluginProcess};
use drover_plugin_sdk::{AgentInfo, TaskSpec};

pub const BIN: &str = env!("CARGO_BIN_EXE_drover-driver-docker");
/// Label (value: the scratch dir) on containers a test makes with the docker CLI, so
/// that they are removed even when the test fails.
pub const TEST_LABEL: &str = "drover-test.scratch";
/// Upper bound for anything that should happen "at once".
pub const PROMPT: Duration = Duration::from_secs(20);

/// The Docker daemon and image the tests use (set up by `scripts/test.sh`).
#[derive(Debug, Clone)]
pub struct DockerEnv {
    /// `unix:///…/docker.sock`.
    pub host: String,
    /// An image with busybox in it, present on that daemon.
    pub image: String,
}

/// The test daemon, or `None` (after saying so loudly) when there is none. Under
/// `CI=true` a missing daemon fails the test instead.
pub fn docker_env() -> Option<DockerEnv> {
    match std::env::var("DROVER_TEST_DOCKER_HOST") {
        Ok(host) if !host.is_empty() => Some(DockerEnv {
            host,
            image: std::env::var("DROVER_TEST_DOCKER_IMAGE")
                .unwrap_or_else(|_| "drover-test/busybox:latest".into()),
        }),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "DROVER_TEST_DOCKER_HOST is not set: run the tests through scripts/test.sh, \
                 which starts a private dockerd"
            );
            eprintln!(
                "SKIPPED: DROVER_TEST_DOCKER_HOST is not set (scripts/test.sh starts a private \
                 dockerd and sets it)"
            );
            None
        }
    }
}

impl DockerEnv {
    /// Run the docker CLI against the test daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        std::process::Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .output()
            .expect("run the docker CLI")
    }

    /// Run the docker CLI and return its trimmed stdout; panics on failure.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "docker {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `docker inspect` of one object as JSON.
    pub fn inspect(&self, what: &str) -> Option<serde_json::Value> {
        let out = self.cli(&["inspect", what]);
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array()?.first().cloned()
    }

    /// Remove every container labelled with `alloc_dir` as its agent's, or as the test
    /// that made it by hand ([`TEST_LABEL`]): a test's leftovers.
    pub fn remove_containers_of(&self, alloc_dir: &Path) {
        let mut ids = String::new();
        for label in ["drover.alloc_dir", TEST_LABEL] {
            ids.push_str(&self.cli_ok(&[
                "ps",
                "-aq",
                "--filter",
                &format!("label={label}={}", alloc_dir.display()),
            ]));
            ids.push(' ');
        }
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = self.cli(&args);
        }
    }
}

/// Fail the test with `what` if `fut` does not finish within `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {limit:?}"))
}

/// Poll `cond` every 50 ms until it holds, failing the test after `limit`.
pub async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A scratch directory (the agent's alloc dir) whose containers are removed on drop,
/// also when the test fails.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub env: DockerEnv,
}

impl Scratch {
    pub fn new(env: &DockerEnv) -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
            env: env.clone(),
        }
    }

    pub fn alloc_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// A task spec with a task directory (`local/`, `secrets/`, `logs/`) and log base
    /// paths, like the agent makes.
    pub fn spec(&self, id: &str, config: serde_json::Value) -> TaskSpec {
        let task_dir = self.dir.path().join(id);
        for sub in ["local", "secrets", "logs"] {
            std::fs::create_dir_all(task_dir.join(sub)).expect("task dir");
        }
        TaskSpec::new(id)
            .with_name(format!("test-{id}"))
            .with_stdout_path(task_dir.join("logs/stdout"))
            .with_stderr_path(task_dir.join("logs/stderr"))
            .with_driver_config_json(config.to_string())
            .with_task_dir(task_dir.clone())
    }

    /// Everything written to the task's stdout (or stderr) files, in order.
    pub fn log(&self, id: &str, stream: &str) -> String {
        let base = self.dir.path().join(id).join("logs").join(stream);
        drover_plugin_sdk::logs::log_files(&base)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, p)| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.env.remove_containers_of(self.dir.path());
    }
}

/// A running docker plugin, configured, SIGKILLed on drop.
pub struct Plugin {
    pub process: PluginProcess,
    pub client: PluginClient,
}

impl Plugin {
    /// Launch the plugin and give it `config` (merged over the endpoint) and the
    /// scratch directory as its alloc dir.
    pub async fn launch(s: &Scratch, config: serde_json::Value) -> Plugin {
        let process = within(
            PROMPT,
            "launch",
            PluginProcess::launch(LaunchOptions::new("docker", BIN)),
        )
        .await
        .expect("launch the docker plugin");
        let client = process.client();
        let mut full = serde_json::json!({ "endpoint": s.env.host });
        if let (Some(full), Some(extra)) = (full.as_object_mut(), config.as_object()) {
            full.extend(extra.clone());
        }
        let agent = AgentInfo::new("1.0.0")
            .with_alloc_dir(s.alloc_dir())
            .with_plugin_state_dir(s.alloc_dir());
        within(
            PROMPT,
            "set_config",
            client.set_config(full.to_string(), &agent),
        )
        .await
        .expect("set_config");
        Plugin { process, client }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let pid = self.process.pid() as i32;
        if !self.process.has_exited() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A per-run unique suffix for names shared on the daemon (image tags).
pub fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{prefix}{:x}", h.finish() & 0xffff_ffff)
}
