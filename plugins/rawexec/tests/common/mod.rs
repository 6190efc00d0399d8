//! Helpers shared by the rawexec tests: the real plugin binary, driven through the SDK
//! client, and cleanup that leaves no process behind even when a test fails.
#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{LaunchOptions, PluginClient, PluginProcess, process_start_time};
use drover_plugin_sdk::{AgentInfo, DriverError, ExitResult, TaskHandle, TaskSpec};
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_drover-driver-rawexec");
/// Upper bound for anything that should happen "at once".
pub const PROMPT: Duration = Duration::from_secs(10);

pub use drover_test_support::procs::{alive, processes};
pub use drover_test_support::{read_log, sh, until, within};

/// A running rawexec plugin and a scratch directory for its tasks and executors. On
/// drop (also when a test fails) every task it started, their executors and the plugin
/// itself are SIGKILLed, so a failing test leaves no `sleep 1000` behind.
pub struct Plugin {
    pub process: PluginProcess,
    pub client: PluginClient,
    pub dir: PathBuf,
    /// (pid, start time) of every task group leader and executor started, for the
    /// cleanup on drop.
    groups: Mutex<Vec<(u32, u64)>>,
}

/// The plugin state directory the tests give rawexec (as the agent does).
pub fn state_dir(dir: &Path) -> PathBuf {
    dir.join("plugin-state")
}

impl Plugin {
    pub async fn launch(dir: &Path) -> Plugin {
        Self::launch_with(dir, "{}").await
    }

    /// [`Self::launch`] with plugin config `config` (JSON), `enabled` unless it says.
    pub async fn launch_with(dir: &Path, config: &str) -> Plugin {
        let mut config: Value = serde_json::from_str(config).expect("a JSON plugin config");
        if let Some(fields) = config.as_object_mut() {
            fields.entry("enabled").or_insert(Value::Bool(true));
        }
        Self::launch_with_exactly(dir, &config.to_string()).await
    }

    /// [`Self::launch`] with exactly `config` (JSON) as its plugin config.
    pub async fn launch_with_exactly(dir: &Path, config: &str) -> Plugin {
        Self::launch_opts(dir, LaunchOptions::new("rawexec", BIN), config).await
    }

    /// [`Self::launch`] of the plugin as `opts` say (its environment, say).
    pub async fn launch_opts(dir: &Path, opts: LaunchOptions, config: &str) -> Plugin {
        let process = within(PROMPT, "launch", PluginProcess::launch(opts))
            .await
            .expect("rawexec launches");
        let client = process.client();
        let agent = AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
            .with_alloc_dir(dir)
            .with_plugin_state_dir(state_dir(dir));
        within(
            PROMPT,
            "set config",
            client.set_config(config.into(), &agent),
        )
        .await
        .expect("SetConfig");
        Plugin {
            client,
            process,
            dir: dir.to_owned(),
            groups: Mutex::new(Vec::new()),
        }
    }

    pub fn spec(&self, id: &str, config: Value) -> TaskSpec {
        let task_dir = self.dir.join(id);
        std::fs::create_dir_all(&task_dir).unwrap();
        TaskSpec::new(id)
            .with_stdout_path(task_dir.join("stdout"))
            .with_stderr_path(task_dir.join("stderr"))
            .with_task_dir(task_dir)
            .with_driver_config_json(config.to_string())
    }

    pub fn track(&self, pid: u32) {
        if let Ok(t) = process_start_time(pid) {
            self.groups.lock().unwrap().push((pid, t));
        }
    }

    pub async fn start_spec(&self, spec: TaskSpec) -> (TaskHandle, u32) {
        let id = spec.id.clone();
        let handle = within(PROMPT, "start", self.client.start_task(spec))
            .await
            .unwrap_or_else(|e| panic!("start {id}: {e}"));
        let pid = self.pid(&id).await;
        self.track(pid);
        self.track(self.executor_pid(&id).await);
        (handle, pid)
    }

    pub async fn start(&self, id: &str, config: Value) -> (TaskHandle, u32) {
        self.start_spec(self.spec(id, config)).await
    }

    pub async fn pid(&self, id: &str) -> u32 {
        let status = within(PROMPT, "inspect", self.client.inspect_task(id))
            .await
            .unwrap();
        status.attributes["pid"].parse().unwrap()
    }

    pub async fn executor_pid(&self, id: &str) -> u32 {
        let status = within(PROMPT, "inspect", self.client.inspect_task(id))
            .await
            .unwrap();
        status.attributes["executor_pid"].parse().unwrap()
    }

    pub async fn wait(&self, id: &str) -> ExitResult {
        within(PROMPT, "wait", self.client.wait_task(id))
            .await
            .unwrap()
    }

    /// Everything task `id` wrote to `stream`, across its log files.
    pub fn log(&self, id: &str, stream: &str) -> String {
        read_log(&self.dir.join(id).join(stream))
    }

    pub fn stdout(&self, id: &str) -> String {
        self.log(id, "stdout")
    }

    /// Wait until the task has printed `line` (scripts print "ready" once their traps
    /// are installed).
    pub async fn printed(&self, id: &str, line: &str) {
        until(PROMPT, &format!("task {id} prints {line:?}"), || {
            self.stdout(id).lines().any(|l| l == line)
        })
        .await;
    }

    pub async fn shutdown(&self) {
        let how = within(PROMPT, "shutdown", self.process.shutdown()).await;
        assert_eq!(how, drover_plugin_sdk::ExitOutcome::Code(0));
    }

    /// `StopTask` with `signal` as raw wire text, which the typed client cannot send
    /// when it is no signal at all.
    pub async fn raw_stop(&self, id: &str, signal: &str) -> Result<(), DriverError> {
        let req = drover_plugin_sdk::proto::v1::StopTaskRequest {
            task_id: id.into(),
            // The SDK's default (5 s): the signal is checked before the driver is called.
            timeout: None,
            signal: signal.into(),
        };
        within(PROMPT, "raw stop", self.client.raw_driver().stop_task(req))
            .await
            .map(drop)
            .map_err(DriverError::from)
    }

    /// `SignalTask` with `signal` as raw wire text.
    pub async fn raw_signal(&self, id: &str, signal: &str) -> Result<(), DriverError> {
        let req = drover_plugin_sdk::proto::v1::SignalTaskRequest {
            task_id: id.into(),
            signal: signal.into(),
        };
        within(
            PROMPT,
            "raw signal",
            self.client.raw_driver().signal_task(req),
        )
        .await
        .map(drop)
        .map_err(DriverError::from)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        for (pgid, start) in self
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // Only a group whose leader is still the process we started (executors
            // lead their own session and group too).
            if process_start_time(pgid).ok() == Some(start) {
                let _ = killpg(nix::unistd::Pid::from_raw(pgid as i32), Signal::SIGKILL);
            }
        }
        if self.process.exit_status().is_none() {
            let _ = killpg(
                nix::unistd::Pid::from_raw(self.process.pid() as i32),
                Signal::SIGKILL,
            );
        }
        drover_test_support::remove_plugin_socket_dir(&self.process.handshake().addr);
        // Executors killed above leave their tasks' cgroups behind (a driver's destroy
        // would remove them): empty and remove those of this test's executors.
        let executors = state_dir(&self.dir).join("rawexec");
        if let (Some(version), Ok(dirs)) = (
            drover_executor::cgroup::plain_support(),
            std::fs::read_dir(&executors),
        ) {
            for dir in dirs.flatten() {
                let path = drover_executor::cgroup::plain_path(&dir.path());
                let cg = drover_executor::cgroup::open_plain(version, &path);
                let _ = drover_executor::cgroup::empty_and_remove(&*cg, Duration::from_secs(5));
            }
        }
    }
}

pub async fn setup() -> (tempfile::TempDir, Plugin) {
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path()).await;
    (dir, plugin)
}
