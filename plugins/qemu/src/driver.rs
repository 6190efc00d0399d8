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
    Health, NetworkModes, PluginInfo, Signal, TaskHandle, TaskSpec, TaskStatus,
};

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
    probed: Arc<ProbeCache>,
}

/// The last probe, when and for which `emulators` it was made; locked while a probe
/// runs, so that callers wait for it rather than start another.
type ProbeCache = tokio::sync::Mutex<Option<(Instant, Vec<PathBuf>, Probe)>>;

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
    /// A driver with no tasks. It starts probing qemu (in `PATH`, the default
    /// `emulators`) at once, on a thread of its own: trying KVM takes up to
    /// [`probe::KVM_TRIAL_LIMIT`], which the host's first fingerprint (after the plugin
    /// is launched and configured) then need not wait for.
    pub fn new() -> Self {
        let probed: Arc<ProbeCache> = Arc::default();
        let early = probed.clone();
        let spawned = std::thread::Builder::new()
            .name("qemu-probe".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return; // the first fingerprint probes instead
                };
                runtime.block_on(async {
                    let mut cached = early.lock().await;
                    if cached.is_none() {
                        *cached = Some((Instant::now(), Vec::new(), probe::probe(&[]).await));
                    }
                });
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot probe qemu in the background ({e}); the first fingerprint will");
        }
        QemuDriver {
            engine: PlainEngine::new(PLUGIN_NAME, HANDLE_VERSION),
            config: Mutex::new(PluginConfig::default()),
            probed,
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
    ///
    /// How it ended is told where the host shows it: a guest that powered off ends
    /// qemu with exit code 0, said by a task event (an `err` next to code 0 would make
    /// the exit read as unknown, see [`ExitResult::outcome`]); a kill carries its
    /// reason in the result's `err`, next to SIGKILL.
    async fn stop_gracefully(
        &self,
        task: Arc<PlainTask<QemuTask>>,
        timeout: Duration,
    ) -> Result<(), DriverError> {
        let started = tokio::time::Instant::now();
        let id = task.base.id.clone();
        let pressed = match Qmp::connect(&task.extra.qmp, QMP_TIMEOUT.min(timeout)).await {
            Ok(mut qmp) => qmp.system_powerdown(QMP_TIMEOUT).await.map(|()| qmp),
            Err(e) => Err(e),
        };
        let mut qmp = match pressed {
            Ok(qmp) => qmp,
            Err(e) => {
                let why = format!("could not press the guest's power button ({e})");
                self.engine.event(&id, format!("{why}; killing qemu"));
                task.set_exit_note(move |r| (!clean(r)).then(|| format!("{why}: killed")));
                return self.kill(&task).await;
            }
        };
        self.engine.event(
            &id,
            format!(
                "pressed the guest's power button (QMP system_powerdown); qemu is killed if \
                 the guest has not powered off within {timeout:?}"
            ),
        );
        let mut announced = false;
        let ended = tokio::time::timeout_at(started + timeout, async {
            let exited = task.base.wait();
            tokio::pin!(exited);
            loop {
                tokio::select! {
                    result = &mut exited => return result,
                    event = qmp.next_event(timeout) => match event {
                        Ok(Some(Event::Shutdown { guest: true, .. })) if !announced => {
                            self.engine.event(&id, GUEST_POWERED_OFF.into());
                            announced = true;
                        }
                        Ok(_) => {}
                        // Closed (qemu is exiting) or broken: its exit tells.
                        Err(_) => return (&mut exited).await,
                    },
                }
            }
        })
        .await;
        match ended {
            Ok(result) => {
                if clean(&result) && !announced {
                    // qemu exits 0 when its guest powers off; the event went unread.
                    self.engine.event(&id, GUEST_POWERED_OFF.into());
                }
                Ok(())
            }
            Err(_) => {
                task.set_exit_note(move |r| {
                    (!clean(r)).then(|| {
                        format!(
                            "guest did not power off within {timeout:?} of system_powerdown: \
                             killed"
                        )
                    })
                });
                self.kill(&task).await
            }
        }
    }

    /// SIGKILL to qemu, and its exit recorded.
    async fn kill(&self, task: &PlainTask<QemuTask>) -> Result<(), DriverError> {
        if !task.base.running() {
            return Ok(());
        }
        let exit = task.exec.stop(Signal::KILL, KILL_TIMEOUT).await?;
        task.record_exit(self.engine.events(), exit);
        Ok(())
    }
}

/// The event of a guest that powered off after its power button was pressed.
pub const GUEST_POWERED_OFF: &str = "the guest powered off (ACPI shutdown after system_powerdown)";

/// Exit code 0, no signal: qemu ended by itself.
fn clean(result: &ExitResult) -> bool {
    result.exit_code == 0 && result.signal == 0 && result.err.is_none()
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
            let skipped = if probe.skipped.is_empty() {
                String::new()
            } else {
                format!("; skipped: {}", probe.skipped.join("; "))
            };
            return Fingerprint::not_ready(
                Health::Undetected,
                format!("no qemu-system-* found in {place} (install qemu-system-x86){skipped}"),
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
        if !probe.skipped.is_empty() {
            fp = fp.attribute("driver.qemu.emulators_skipped", probe.skipped.join("; "));
        }
        fp
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        if !spec.devices.is_empty() || !spec.mounts.is_empty() {
            tracing::info!(
                task = %spec.id,
                device_nodes = spec.devices.len(),
                mounts = spec.mounts.len(),
                "qemu does not pass host devices to its guests: the device nodes and mounts of the task's device reservation are ignored (its environment has the device variables)"
            );
        }
        if let Some(v) = spec.volumes.first() {
            return Err(DriverError::InvalidConfig(format!(
                "volume_mount of volume {:?}: the qemu driver does not share host volumes \
                 with its guests yet",
                v.name
            )));
        }
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
        let group_forwards = config.group_port_forwards(&spec.ports, &plugin)?;
        let Some(emulator) = Self::emulator(&probe) else {
            return Err(DriverError::FailedPrecondition(
                "no qemu-system-* found on this host (install qemu-system-x86)".into(),
            ));
        };
        // The probe may be a minute old: the binary qemu runs as root is checked again.
        probe::check_emulator(emulator).map_err(DriverError::FailedPrecondition)?;
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
        let mut vm = Vm::of_task(
            &config,
            checked,
            memory_mb,
            qmp.clone(),
            vm::hardening(probe.version.as_deref(), root),
        );
        vm.port_forwards.extend(group_forwards);
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
        // qemu exits 0 on SIGTERM: an event says what happened to the guest, and a
        // kill (at the timeout, or a SIGKILL asked for) says it in the exit as well.
        let without =
            format!("qemu stopped with {sig}, without a guest shutdown (graceful_shutdown is off)");
        self.engine.event(task_id, without.clone());
        task.set_exit_note(move |r| (!clean(r)).then(|| without.clone()));
        self.engine.stop(task_id, timeout, sig).await
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

    drover_executor::plain_engine_calls!(engine: wait_task signal_task destroy_task task_stats task_events);
}
