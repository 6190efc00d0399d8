//! Helpers shared by the exec tests: the real plugin binary driven through the SDK
//! client, each plugin with its own cgroup parent, and cleanup that leaves no process
//! or cgroup behind even when a test fails.
#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{LaunchOptions, PluginClient, PluginProcess};
use drover_plugin_sdk::{AgentInfo, ExitResult, TaskHandle, TaskSpec};
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_drover-driver-exec");
/// Upper bound for anything that should happen "at once".
pub const PROMPT: Duration = Duration::from_secs(15);
/// Controllers whose directories a v1 task cgroup has.
pub const CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

/// Whether the isolation tests can run here: as root. Under `CI=true` they must:
/// a missing prerequisite fails the test instead of skipping it.
pub fn isolation_possible() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the exec tests need root (namespaces, cgroups, chroot), and CI=true forbids skipping"
    );
    eprintln!("SKIPPED: the exec tests need root (namespaces, cgroups, chroot)");
    false
}

pub use drover_test_support::procs::alive;
pub use drover_test_support::{read_log, sh, sh_with, until, within};

/// The pids listed in a `cgroup.procs` file (none if it is gone).
pub fn procs(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A running exec plugin, with its own cgroup parent and a scratch directory. On drop
/// every process in its cgroups is SIGKILLed and the cgroups removed.
pub struct Plugin {
    pub process: PluginProcess,
    pub client: PluginClient,
    pub dir: PathBuf,
    /// `drover-test-<pid>-<n>`, below each controller's root.
    pub parent: String,
    pub config: Value,
}

/// The plugin state directory the tests give the plugin (as the agent does).
pub fn state_dir(dir: &Path) -> PathBuf {
    dir.join("plugin-state")
}

fn unique_parent() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "drover-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

impl Plugin {
    /// Launch the plugin with plugin config `config` (a JSON object; a
    /// `cgroup_parent` is added).
    pub async fn launch(dir: &Path, config: Value) -> Plugin {
        let parent = unique_parent();
        Self::launch_with(dir, config, parent).await
    }

    /// Launch another plugin process on the same directory and cgroup parent (after
    /// the first was killed).
    pub async fn relaunch(&self) -> Plugin {
        Self::launch_with(&self.dir, self.config.clone(), self.parent.clone()).await
    }

    async fn launch_with(dir: &Path, mut config: Value, parent: String) -> Plugin {
        config["cgroup_parent"] = json!(format!("/{parent}"));
        let process = within(
            PROMPT,
            "launch",
            PluginProcess::launch(LaunchOptions::new("exec", BIN)),
        )
        .await
        .expect("exec launches");
        let client = process.client();
        let agent = AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
            .with_alloc_dir(dir)
            .with_plugin_state_dir(state_dir(dir));
        within(
            PROMPT,
            "set config",
            client.set_config(config.to_string(), &agent),
        )
        .await
        .expect("SetConfig");
        Plugin {
            process,
            client,
            dir: dir.to_owned(),
            parent,
            config,
        }
    }

    /// A task spec with a task directory as the agent makes it.
    pub fn spec(&self, id: &str, config: Value) -> TaskSpec {
        let task_dir = self.dir.join(id);
        for sub in ["local", "secrets", "tmp", "logs"] {
            std::fs::create_dir_all(task_dir.join(sub)).unwrap();
        }
        TaskSpec::new(id)
            .with_stdout_path(task_dir.join("logs/stdout"))
            .with_stderr_path(task_dir.join("logs/stderr"))
            .with_driver_config_json(config.to_string())
            .with_task_dir(task_dir.clone())
    }

    pub async fn start_spec(&self, spec: TaskSpec) -> TaskHandle {
        let id = spec.id.clone();
        within(PROMPT, "start", self.client.start_task(spec))
            .await
            .unwrap_or_else(|e| panic!("start {id}: {e}"))
    }

    pub async fn start(&self, id: &str, config: Value) -> TaskHandle {
        self.start_spec(self.spec(id, config)).await
    }

    pub async fn attribute(&self, id: &str, key: &str) -> String {
        let status = within(PROMPT, "inspect", self.client.inspect_task(id))
            .await
            .unwrap();
        status.attributes[key].clone()
    }

    pub async fn wait(&self, id: &str) -> ExitResult {
        within(PROMPT, "wait", self.client.wait_task(id))
            .await
            .unwrap()
    }

    /// The directory of task `id`'s cgroup in `controller`.
    pub fn cgroup_dir(&self, controller: &str, id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(&self.parent)
            .join(id)
    }

    /// Everything task `id` wrote to `stream`, across its log files.
    pub fn log(&self, id: &str, stream: &str) -> String {
        read_log(&self.dir.join(id).join("logs").join(stream))
    }

    pub fn stdout(&self, id: &str) -> String {
        self.log(id, "stdout")
    }

    /// Wait until the task has printed `line`.
    pub async fn printed(&self, id: &str, line: &str) {
        let deadline = Instant::now() + PROMPT;
        while !self.stdout(id).lines().any(|l| l == line) {
            assert!(
                Instant::now() < deadline,
                "task {id} never printed {line:?}; stdout:\n{}\nstderr:\n{}",
                self.stdout(id),
                self.log(id, "stderr")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        if self.process.exit_status().is_none() {
            let _ = killpg(
                nix::unistd::Pid::from_raw(self.process.pid() as i32),
                Signal::SIGKILL,
            );
        }
        remove_cgroup_tree(&self.parent);
    }
}

/// Kill every process under `/sys/fs/cgroup/<controller>/<parent>` and remove the
/// directories, children first.
pub fn remove_cgroup_tree(parent: &str) {
    for _ in 0..50 {
        let mut left = false;
        for c in CONTROLLERS {
            let root = Path::new("/sys/fs/cgroup").join(c).join(parent);
            if !root.exists() {
                continue;
            }
            left = true;
            let mut dirs = vec![root.clone()];
            if let Ok(rd) = std::fs::read_dir(&root) {
                dirs.extend(
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.is_dir()),
                );
            }
            if c == "freezer" {
                for d in &dirs {
                    let _ = std::fs::write(d.join("freezer.state"), "THAWED");
                }
            }
            for d in dirs.iter().rev() {
                for pid in procs(&d.join("cgroup.procs")) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = std::fs::remove_dir(d);
            }
        }
        if !left {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
