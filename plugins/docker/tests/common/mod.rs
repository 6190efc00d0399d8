//! Helpers for the docker driver's tests: the daemon they run against, the real plugin
//! binary driven through the SDK client, and clean-up of everything a test made.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_plugin_sdk::client::{LaunchOptions, PluginClient, PluginProcess};
use drover_plugin_sdk::{AgentInfo, TaskSpec};

pub const BIN: &str = env!("CARGO_BIN_EXE_drover-driver-docker");
/// Label (value: the scratch dir) on containers a test makes with the docker CLI, so
/// that they are removed even when the test fails.
pub const TEST_LABEL: &str = "drover-test.scratch";
/// Upper bound for anything that should happen "at once".
pub const PROMPT: Duration = Duration::from_secs(20);

pub use drover_test_support::docker::{DockerEnv, docker_env};
pub use drover_test_support::within;

/// Remove every container labelled with `alloc_dir` as its agent's, or as the test
/// that made it by hand ([`TEST_LABEL`]): a test's leftovers.
pub fn remove_containers_of(env: &DockerEnv, alloc_dir: &Path) {
    for label in ["drover.alloc_dir", TEST_LABEL] {
        env.remove_labelled(label, &alloc_dir.display().to_string());
    }
}

/// Poll `cond` every 50 ms (each look may run the docker CLI) until it holds, failing
/// the test after `limit`.
pub async fn until(limit: Duration, what: &str, cond: impl FnMut() -> bool) {
    drover_test_support::until_every(limit, Duration::from_millis(50), what, cond).await
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
        remove_containers_of(&self.env, self.dir.path());
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
        drover_test_support::remove_plugin_socket_dir(&self.process.handshake().addr);
    }
}

/// A per-run unique suffix for names shared on the daemon (image tags).
pub fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{prefix}{:x}", h.finish() & 0xffff_ffff)
}
