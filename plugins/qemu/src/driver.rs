//! The qemu driver: the [`DriverPlugin`] impl, over the shared engine of plain executor
//! tasks ([`drover_executor::plain`]): qemu is the executor's task, like a rawexec
//! command, so the VM outlives the plugin and the agent.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use drover_executor::LaunchSpec;
use drover_executor::plain::{PlainEngine, PlainTask};
use drover_plugin_sdk::{
    AgentInfo, Capabilities, DriverError, DriverPlugin, ExitResult, Fingerprint, FsIsolation,
    Health, NetworkModes, PluginInfo, Signal, TaskEvent, TaskHandle, TaskSpec, TaskStats,
    TaskStatus,
};
use tokio::sync::broadcast;

use crate::config::{PluginConfig, TaskConfig};
use crate::probe::{self, Probe};
use crate::qmp::{Event, Qmp};
use crate::vm::{self, Vm};

/// The driver's name.
pub const PLUGIN_NAME: &str = "qemu";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the task handle's driver state
/// ([`HandleState`](drover_executor::plain::HandleState)).
pub const HANDLE_VERSION: u32 = 1;
/// The QMP socket's name in the task's executor directory: that directory is the
/// plugin's (0700, under its state dir), unlike the task dir, where the job submitter
/// could plant a link where qemu creates the socket.
pub const QMP_SOCKET: &str = "qmp";
/// How long a fingerprint's probe is reused: trying KVM starts a guest.
const PROBE_FOR: Duration = Duration::from_secs(60);
/// Bound on connecting to QMP and on one command.
const QMP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a kill of qemu may take to be reported by its executor.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the driver keeps per task beside its executor.
#[derive(Debug)]
struct QemuTask {
    /// The VM's QMP socket.
    qmp: PathBuf,
    /// The task's `graceful_shutdown`.
    graceful: bool,
}

/// Runs each task as a qemu VM owned by its own executor.
pub struct QemuDriver {
    engine: PlainEngine<QemuTask>,
    config: Mutex<PluginConfig>,
    /// The last probe, when and for which `emulators` it was made.
    probed: tokio::sync::Mutex<Option<(Instant, Vec<PathBuf>, Probe)>>,
}

impl Default for QemuDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for QemuDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QemuDriver").finish_non_exhaustive()
    }
}

impl QemuDriver {
    /// A driver with no tasks.
    pub fn new() -> Self {
        QemuDriver {
            engine: PlainEngine::new(PLUGIN_NAME, HANDLE_VERSION),
            config: Mutex::new(PluginConfig::default()),
            probed: tokio::sync::Mutex::new(None),
        }
    }

    fn plugin_config(&self) -> PluginConfig {
        self.config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The emulators, qemu's version and whether KVM works; probed at most every
    /// [`PROBE_FOR`] (or when `emulators` changed).
    async fn probe(&self) -> Probe {
        let dirs = self.plugin_config().emulators;
        let mut cached = self.probed.lock().await;
        if let Some((at, for_dirs, probe)) = &*cached
            && at.elapsed() < PROBE_FOR
            && *for_dirs == dirs
        {
            return probe.clone();
        }
        let probe = probe::probe(&dirs).await;
        *cached = Some((Instant::now(), dirs, probe.clone()));
        probe
    }

    /// The `qemu-system-*` a task runs: x86_64's, else the first found.
    fn emulator(probe: &Probe) -> Option<&Path> {
        probe
            .emulators
            .iter()
            .find(|e| e.arch == "x86_64")
            .or_else(|| probe.emulators.first())
            .map(|e| e.path.as_path())
    }

    /// Stop by the guest's power button, then by SIGKILL after `timeout`.
    async fn stop_gracefully(
        &self,
        task: Arc<PlainTask<QemuTask>>,
        timeout: Duration,
    ) -> Result<(), DriverError> {
        let started = tokio::time::Instant::now();
        let id = task.base.id.clone();
        // qemu exits 0 when the guest powers off (no -no-shutdown); set before the
        // button is pressed, since the watcher may record the exit before this stop
        // hears of it.
        task.set_exit_note(|r| {
            (r.exit_code == 0 && r.signal == 0)
                .then(|| "guest powered off (ACPI shutdown after system_powerdown)".to_owned())
        });
        let pressed = match Qmp::connect(&task.extra.qmp, QMP_TIMEOUT.min(timeout)).await {
            Ok(mut qmp) => match qmp.system_powerdown(QMP_TIMEOUT).await {
                Ok(()) => Ok(qmp),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let pressed_ok = pressed.is_ok();
        let powered_off = match pressed {
            Ok(mut qmp) => {
                self.engine.event(
                    &id,
                    format!(
                        "pressed the guest's power button (QMP system_powerdown); qemu is \
                         killed if the guest has not powered off within {timeout:?}"
                    ),
                );
                let deadline = started + timeout;
                tokio::time::timeout_at(deadline, async {
                    let exited = task.base.wait();
                    tokio::pin!(exited);
                    loop {
                        tokio::select! {
                            _ = &mut exited => return,
                            event = qmp.next_event(timeout) => match event {
                                Ok(Some(Event::Shutdown { guest: true, .. })) => {
                                    self.engine.event(&id, "the guest powered off".into());
                                }
                                Ok(_) => {}
                                // Closed (qemu is exiting) or broken: its exit tells.
                                Err(_) => {
                                    (&mut exited).await;
                                    return;
                                }
                            },
                        }
                    }
                })
                .await
                .is_ok()
            }
            Err(e) => {
                let why = format!("could not press the guest's power button ({e})");
                self.engine.event(&id, format!("{why}; killing qemu"));
                task.set_exit_note(move |_| Some(format!("{why}: killed")));
                false
            }
        };
        if powered_off || !task.base.running() {
            return Ok(());
        }
        if pressed_ok {
            task.set_exit_note(move |_| {
                Some(format!(
                    "guest did not power off within {timeout:?} of system_powerdown: killed"
                ))
            });
        }
        let exit = task.exec.stop(Signal::KILL, KILL_TIMEOUT).await?;
        task.record_exit(self.engine.events(), exit);
        Ok(())
    }
}

impl DriverPlugin for QemuDriver {
    type Config = PluginConfig;
    type TaskConfig = TaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(PLUGIN_NAME, PLUGIN_VERSION)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_send_signals(true)
            .with_exec(false)
            .with_fs_isolation(FsIsolation::Image)
            .with_task_stats(true)
            .with_task_events(true)
            .with_recover(true)
            // User-mode networking: forwarded ports bind on the host.
            .with_network_modes(NetworkModes::default().with_host(true))
    }

    async fn set_config(&self, config: PluginConfig, agent: AgentInfo) -> Result<(), DriverError> {
        let config = config.check()?;
        self.engine.configure(&agent, false).await?;
        *self.config.lock().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    async fn fingerprint(&self) -> Fingerprint {
        let probe = self.probe().await;
        if probe.emulators.is_empty() {
            let dirs = self.plugin_config().emulators;
            let place = if dirs.is_empty() {
                "PATH".to_owned()
            } else {
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Fingerprint::not_ready(
                Health::Undetected,
                format!("no qemu-system-* found in {place} (install qemu-system-x86)"),
            );
        }
        let arches: Vec<&str> = probe.emulators.iter().map(|e| e.arch.as_str()).collect();
        let version = probe.version.clone().unwrap_or_else(|| "unknown".into());
        let mut fp = Fingerprint::healthy(match &probe.kvm {
            Ok(()) => format!("qemu {version}, KVM works"),
            Err(why) => format!("qemu {version}, TCG only: {why}"),
        })
        .attribute("driver.qemu.version", version)
        .attribute("driver.qemu.emulators", arches.join(","))
        .attribute("driver.qemu.kvm", probe.kvm.is_ok().to_string());
        if let Err(why) = &probe.kvm {
            fp = fp.attribute("driver.qemu.kvm_reason", why.clone());
        }
        fp
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        if !spec.user.is_empty() {
            return Err(DriverError::InvalidConfig(format!(
                "qemu runs as the plugin's user and drops to {} itself; user {:?} is not \
                 supported",
                vm::RUN_AS_USER,
                spec.user
            )));
        }
        let plugin = self.plugin_config();
        let probe = self.probe().await;
        let checked = config.check(&spec.task_dir, &plugin, &probe.kvm)?;
        let Some(emulator) = Self::emulator(&probe) else {
            return Err(DriverError::FailedPrecondition(
                "no qemu-system-* found on this host (install qemu-system-x86)".into(),
            ));
        };
        let qmp = self.engine.executor_dir(&spec.id).join(QMP_SOCKET);
        if !drover_plugin_sdk::handshake::socket_path_fits(&qmp) {
            return Err(DriverError::InvalidConfig(format!(
                "the VM's QMP socket {} is {} bytes, longer than the {} a unix socket \
                 allows; use a shorter data_dir for the agent",
                qmp.display(),
                qmp.as_os_str().len(),
                drover_plugin_sdk::handshake::MAX_UNIX_SOCKET_PATH
            )));
        }
        let root = rustix::process::geteuid().is_root();
        let memory_mb = u64::try_from(spec.resources.memory_mb).unwrap_or(0);
        let vm = Vm::of_task(
            &config,
            checked,
            memory_mb,
            qmp.clone(),
            vm::hardening(probe.version.as_deref(), root),
        );
        let mut how = LaunchSpec::new(spec.id.clone(), emulator.display().to_string());
        how.args = vm::command_line(&vm);
        // qemu opens nothing relative; the task dir (the job submitter's) is no place
        // for it to stand in.
        how.cwd = PathBuf::from("/");
        how.stdout_path = spec.stdout_path.clone();
        how.stderr_path = spec.stderr_path.clone();
        how.logs = spec.logs;
        let task = QemuTask {
            qmp,
            graceful: config.graceful_shutdown,
        };
        self.engine.start(spec, how, task).await
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        self.engine.wait(task_id).await
    }

    async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        sig: Signal,
    ) -> Result<(), DriverError> {
        let task = self.engine.get(task_id)?;
        if !task.base.running() {
            return Ok(());
        }
        if task.extra.graceful {
            return self.stop_gracefully(task, timeout).await;
        }
        task.set_exit_note(move |_| {
            Some(format!(
                "qemu stopped with {sig}, without a guest shutdown (graceful_shutdown is off)"
            ))
        });
        self.engine.stop(task_id, timeout, sig).await
    }

    async fn signal_task(&self, task_id: &str, sig: Signal) -> Result<(), DriverError> {
        self.engine.signal(task_id, sig).await
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        self.engine.destroy(task_id, force).await
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        let task = self.engine.get(task_id)?;
        Ok(task
            .status()
            .with_attribute("qmp_socket", task.extra.qmp.display().to_string()))
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        // QMP is not connected here: each stop connects when it needs it.
        self.engine
            .recover(handle, |handle, exec| {
                let config: Option<TaskConfig> =
                    serde_json::from_str(&handle.spec.driver_config_json).ok();
                QemuTask {
                    qmp: exec.dir().join(QMP_SOCKET),
                    graceful: config.is_some_and(|c| c.graceful_shutdown),
                }
            })
            .await
    }

    async fn task_stats(&self, task_id: &str) -> Result<TaskStats, DriverError> {
        self.engine.stats(task_id)
    }

    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        Some(self.engine.subscribe())
    }
}
