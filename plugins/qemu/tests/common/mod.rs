//! The qemu plugin binary driven through the SDK client, the VM rig's guest, and a
//! cleanup that leaves no qemu behind when a test fails.
#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use drover_plugin_sdk::client::{LaunchOptions, PluginClient, PluginProcess, process_start_time};
use drover_plugin_sdk::{AgentInfo, DriverError, TaskHandle, TaskSpec};
use drover_test_support::vm::Rig;
use serde_json::{Value, json};

pub use drover_test_support::procs::alive;
pub use drover_test_support::vm::{GUEST_STARTED, rig};
pub use drover_test_support::{read_log, until, within};

pub const BIN: &str = env!("CARGO_BIN_EXE_drover-driver-qemu");
/// Bound for calls that answer at once.
pub const PROMPT: Duration = Duration::from_secs(10);
/// Bound for a TCG guest to reach its init (about 2-3 s here, more on a busy host).
pub const BOOT: Duration = Duration::from_secs(60);

/// A qemu plugin with `image_paths` = the rig's directory, and a scratch directory for
/// task dirs and the plugin's state. On drop every qemu and executor it started, and
/// the plugin, are SIGKILLed.
pub struct Plugin {
    pub process: PluginProcess,
    pub client: PluginClient,
    pub dir: PathBuf,
    /// (pid, start time) of group leaders to kill on drop.
    started: Mutex<Vec<(u32, u64)>>,
}

/// The plugin state directory the tests give the plugin (as the agent does).
pub fn state_dir(dir: &Path) -> PathBuf {
    dir.join("state")
}

/// The plugin config letting tasks boot the rig's files in place.
pub fn rig_config(rig: &Rig) -> Value {
    let dir = |p: &Path| p.parent().unwrap().display().to_string();
    json!({ "image_paths": [dir(&rig.kernel), dir(&rig.initrd)] })
}

/// A direct-boot task of the rig's guest with the `drover.*` orders.
pub fn guest(rig: &Rig, orders: &[&str], extra: Value) -> Value {
    let mut config = json!({
        "kernel": rig.kernel,
        "initrd": rig.initrd,
        "append": rig.append(orders),
        "machine": "q35",
        "accelerator": "tcg",
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    config
}

/// The plugin process, launched and not yet configured.
pub async fn launch_unconfigured() -> PluginProcess {
    within(
        PROMPT,
        "launch",
        PluginProcess::launch(LaunchOptions::new("qemu", BIN)),
    )
    .await
    .expect("the qemu plugin launches")
}

impl Plugin {
    pub async fn launch(dir: &Path, config: Value) -> Plugin {
        let process = launch_unconfigured().await;
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
            started: Mutex::new(Vec::new()),
        }
    }

    /// The spec of task `id` (its task dir made) with `config` and `memory_mb`.
    pub fn spec(&self, id: &str, config: &Value) -> TaskSpec {
        let task_dir = self.task_dir(id);
        std::fs::create_dir_all(&task_dir).unwrap();
        TaskSpec::new(id)
            .with_stdout_path(task_dir.join("stdout"))
            .with_stderr_path(task_dir.join("stderr"))
            .with_task_dir(task_dir)
            .with_resources(drover_plugin_sdk::Resources::default().with_memory_mb(256))
            .with_driver_config_json(config.to_string())
    }

    pub fn task_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The executor directory task `id` gets.
    pub fn executor_dir(&self, id: &str) -> PathBuf {
        drover_executor::task_dir(&state_dir(&self.dir).join("qemu"), id)
    }

    pub async fn try_start(&self, id: &str, config: &Value) -> Result<TaskHandle, DriverError> {
        self.try_start_spec(self.spec(id, config)).await
    }

    /// Start `spec` (made by [`Plugin::spec`], then changed), tracking what it runs.
    pub async fn try_start_spec(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError> {
        let id = spec.id.clone();
        let id = id.as_str();
        let result = within(PROMPT, "start", self.client.start_task(spec)).await;
        if result.is_ok() {
            self.track(self.pid(id).await);
            self.track(self.attribute(id, "executor_pid").await);
        }
        result
    }

    /// Start task `id`; its handle and qemu's pid.
    pub async fn start(&self, id: &str, config: &Value) -> (TaskHandle, u32) {
        let handle = self
            .try_start(id, config)
            .await
            .unwrap_or_else(|e| panic!("start {id}: {e}"));
        (handle, self.pid(id).await)
    }

    pub fn track(&self, pid: u32) {
        if let Ok(t) = process_start_time(pid) {
            self.started.lock().unwrap().push((pid, t));
        }
    }

    pub async fn attribute(&self, id: &str, key: &str) -> u32 {
        let status = within(PROMPT, "inspect", self.client.inspect_task(id))
            .await
            .unwrap();
        status.attributes[key].parse().unwrap()
    }

    pub async fn pid(&self, id: &str) -> u32 {
        self.attribute(id, "pid").await
    }

    /// StopTask with `timeout_secs` and `signal`, then WaitTask: how the task ended.
    pub async fn stop(
        &self,
        id: &str,
        timeout_secs: u64,
        signal: drover_plugin_sdk::Signal,
    ) -> drover_plugin_sdk::ExitResult {
        let timeout = Duration::from_secs(timeout_secs);
        within(
            timeout + PROMPT,
            "stop",
            self.client.stop_task(id, timeout, signal),
        )
        .await
        .unwrap_or_else(|e| panic!("stop {id}: {e}"));
        within(PROMPT, "wait", self.client.wait_task(id))
            .await
            .unwrap_or_else(|e| panic!("wait {id}: {e}"))
    }

    /// Until the plugin's first fingerprint.
    pub async fn fingerprinted(&self) -> drover_plugin_sdk::Fingerprint {
        use tokio_stream::StreamExt as _;
        let fps = within(PROMPT, "fingerprint", self.client.fingerprint())
            .await
            .unwrap();
        let mut fps = std::pin::pin!(fps);
        within(PROMPT * 3, "first fingerprint", fps.next())
            .await
            .expect("a fingerprint")
            .unwrap()
    }

    /// The guest's serial console so far.
    pub fn console(&self, id: &str) -> String {
        read_log(&self.task_dir(id).join("stdout"))
    }

    /// Until the guest's console shows `text`.
    pub async fn console_shows(&self, id: &str, text: &str) {
        until(BOOT, &format!("the console of {id} shows {text:?}"), || {
            self.console(id).contains(text)
        })
        .await;
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        let started = std::mem::take(&mut *self.started.lock().unwrap_or_else(|e| e.into_inner()));
        for (pgid, start) in started {
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
        // Executors killed above leave their tasks' cgroups behind.
        if let (Some(version), Ok(dirs)) = (
            drover_executor::cgroup::plain_support(),
            std::fs::read_dir(state_dir(&self.dir).join("qemu")),
        ) {
            for dir in dirs.flatten() {
                let path = drover_executor::cgroup::plain_path(&dir.path());
                let cg = drover_executor::cgroup::open_plain(version, &path);
                let _ = drover_executor::cgroup::empty_and_remove(&*cg, Duration::from_secs(5));
            }
        }
    }
}

/// Every running qemu whose command line mentions `needle`.
pub fn qemus_with(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("qemu-system") && c.contains(needle)
            })
        })
        .collect()
}

/// The real uid of process `pid`.
pub fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The plugin's task events, from now on.
pub async fn events(
    plugin: &Plugin,
) -> std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<drover_plugin_sdk::TaskEvent, DriverError>> + Send>,
> {
    let stream = within(PROMPT, "task events", plugin.client.task_events())
        .await
        .unwrap();
    Box::pin(stream)
}

/// Until task `id` has an event with `message`; the messages of its events seen.
pub async fn event_seen(
    events: &mut std::pin::Pin<
        Box<
            dyn tokio_stream::Stream<Item = Result<drover_plugin_sdk::TaskEvent, DriverError>>
                + Send,
        >,
    >,
    id: &str,
    message: &str,
) -> Vec<String> {
    use tokio_stream::StreamExt as _;
    let mut seen = Vec::new();
    within(PROMPT, &format!("event {message:?} of {id}"), async {
        while let Some(Ok(e)) = events.next().await {
            if e.task_id == id {
                seen.push(e.message.clone());
                if e.message == message {
                    return;
                }
            }
        }
        panic!("the event stream ended before {message:?}: {seen:?}");
    })
    .await;
    seen
}
