//! The docker driver: the [`DriverPlugin`] impl.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::{
    CreateContainerOptions, KillContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StatsOptions,
};
use drover_plugin_sdk::{
    AgentInfo, Capabilities, DriverError, DriverPlugin, ExecChunk, ExecInput, ExecOutput,
    ExecSession, ExitResult, Fingerprint, FsIsolation, Health, NetworkModes, PluginInfo, Signal,
    TaskEvent, TaskHandle, TaskSpec, TaskStats, TaskStatus,
};
use futures_util::StreamExt as _;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::{
    LABEL_ALLOC_DIR, LABEL_TASK_ID, Plan, PluginConfig, Policy, TaskConfig, normalize_image,
};
use crate::dangling::Reconciler;
use crate::engine::{DaemonAddress, Endpoint, Engine, docker_err, status_of};
use crate::handle::{HandleState, Task, docker_time, short, watch_exit};
use crate::store::Store;
use crate::{follower, image, logs};

/// The driver's name.
pub const PLUGIN_NAME: &str = "docker";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the task handle's driver state.
pub const HANDLE_VERSION: u32 = 1;

/// How long a container sent SIGKILL may take to be reported gone.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// How long the daemon may take to answer a fingerprint.
const FINGERPRINT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the plugin runs with: its configuration and the daemon connection it implies.
struct Settings {
    policy: Policy,
    engine: Result<Arc<Engine>, String>,
}

impl Settings {
    fn new(config: PluginConfig, agent: &AgentInfo) -> Result<Self, DriverError> {
        let address =
            DaemonAddress::resolve(config.endpoint.as_deref(), |n| std::env::var(n).ok())?;
        let volume_staging = if agent.plugin_state_dir.as_os_str().is_empty() {
            PathBuf::new()
        } else {
            agent.plugin_state_dir.join("docker").join("volumes")
        };
        Ok(Settings {
            policy: Policy {
                config,
                alloc_dir: agent.alloc_dir.display().to_string(),
                volume_staging,
            },
            engine: Ok(Arc::new(Engine::new(address))),
        })
    }

    fn engine(&self) -> Result<Arc<Engine>, DriverError> {
        self.engine.clone().map_err(DriverError::InvalidConfig)
    }
}

/// Runs tasks as Docker containers.
pub struct DockerDriver {
    settings: RwLock<Arc<Settings>>,
    store: Arc<Store>,
    events: broadcast::Sender<TaskEvent>,
    /// The daemon answered at least once: a later failure is "unhealthy", not
    /// "undetected".
    answered: AtomicBool,
    started: Instant,
    reconciler: Mutex<Option<CancellationToken>>,
}

impl Default for DockerDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl DockerDriver {
    /// A driver with the default configuration (daemon from `DOCKER_HOST`, else
    /// `/var/run/docker.sock`) and no tasks.
    pub fn new() -> Self {
        let settings = Settings::new(PluginConfig::default(), &AgentInfo::default())
            .unwrap_or_else(|e| Settings {
                policy: Policy::default(),
                engine: Err(e.to_string()),
            });
        DockerDriver {
            settings: RwLock::new(Arc::new(settings)),
            store: Arc::new(Store::default()),
            events: broadcast::channel(256).0,
            answered: AtomicBool::new(false),
            started: Instant::now(),
            reconciler: Mutex::new(None),
        }
    }

    fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn event(&self, task_id: &str, message: String) {
        event(&self.events, task_id, message);
    }

    /// Follow the task's logs and watch for its exit, in the background.
    fn watch(&self, task: &Arc<Task>) {
        tokio::spawn(follower::follow(task.clone()));
        let events = self.events.clone();
        let task = task.clone();
        tokio::spawn(async move {
            if let Some(result) = watch_exit(task.clone()).await {
                let mut message = match &result.err {
                    Some(e) if result.exit_code == 0 => format!("task exited: {e}"),
                    _ => format!("task exited: code {}", result.exit_code),
                };
                if result.oom_killed {
                    message.push_str(" (OOM killed)");
                }
                event(&events, &task.id, message);
            }
        });
    }

    /// Create the task's container, pulling its image when the daemon does not have it
    /// and taking the name over from a container of the same task that never started.
    async fn create(
        &self,
        docker: &Docker,
        plan: &Plan,
        spec: &TaskSpec,
        pull_timeout: Duration,
    ) -> Result<String, DriverError> {
        let mut pulled = false;
        let mut replaced = false;
        loop {
            let options = CreateContainerOptions {
                name: Some(plan.name.clone()),
                ..Default::default()
            };
            let err = match docker
                .create_container(Some(options), plan.body.clone())
                .await
            {
                Ok(created) => return Ok(created.id),
                Err(e) => e,
            };
            let message = match &err {
                bollard::errors::Error::DockerResponseServerError { message, .. } => message,
                _ => "",
            };
            match status_of(&err) {
                Some(404)
                    if message.contains("No such image") && !pulled && plan.load.is_none() =>
                {
                    self.event(&spec.id, format!("pulling image {}", plan.image));
                    image::pull(docker, &plan.image, plan.auth.clone(), pull_timeout).await?;
                    self.event(&spec.id, format!("image {} pulled", plan.image));
                    pulled = true;
                }
                Some(409) if !replaced => {
                    take_over_name(docker, &plan.name, &spec.id).await?;
                    replaced = true;
                }
                _ => {
                    return Err(docker_err(format!("creating container {}", plan.name), err));
                }
            }
        }
    }

    /// Find the container of task `id` by its label (a probe: the agent has no handle).
    async fn find(
        &self,
        docker: &Docker,
        id: &str,
        alloc_dir: &str,
    ) -> Result<HandleState, DriverError> {
        let mut labels = vec![format!("{LABEL_TASK_ID}={id}")];
        if !alloc_dir.is_empty() {
            labels.push(format!("{LABEL_ALLOC_DIR}={alloc_dir}"));
        }
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), labels)])),
            ..Default::default()
        };
        let list = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| docker_err(format!("looking for the container of task {id}"), e))?;
        let Some(c) = list.into_iter().next() else {
            return Err(DriverError::NotFound(format!(
                "no container for task {id} on the docker daemon"
            )));
        };
        let cid = c.id.unwrap_or_default();
        let state = c.state.map(|s| s.to_string()).unwrap_or_default();
        if state == "created" {
            // Created but never started (the start was interrupted): it never ran, so
            // the task was never started. Remove it so that a start can create it anew.
            remove_container(docker, &cid).await?;
            return Err(DriverError::NotFound(format!(
                "task {id} was never started (its container {} was only created)",
                short(&cid)
            )));
        }
        Ok(HandleState {
            container_id: cid,
            image: c.image.unwrap_or_default(),
        })
    }

    fn restart_reconciler(&self, settings: &Settings) {
        let mut slot = self
            .reconciler
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = slot.take() {
            old.cancel();
        }
        let dangling = &settings.policy.config.gc.dangling_containers;
        let (true, Ok(engine), false) = (
            dangling.enabled,
            settings.engine.clone(),
            settings.policy.alloc_dir.is_empty(),
        ) else {
            return;
        };
        let cancel = CancellationToken::new();
        let reconciler = Reconciler {
            engine,
            store: self.store.clone(),
            events: self.events.clone(),
            config: dangling.clone(),
            alloc_dir: settings.policy.alloc_dir.clone(),
            started: self.started,
        };
        tokio::spawn(reconciler.run(cancel.clone()));
        *slot = Some(cancel);
    }
}

fn event(events: &broadcast::Sender<TaskEvent>, task_id: &str, message: String) {
    tracing::info!(task = task_id, "{message}");
    // No subscriber is fine: events are best-effort notifications.
    let _ = events.send(TaskEvent::new(task_id, message));
}

/// The name `name` is taken. If by a container of the same task that was created but
/// never started, remove it; otherwise the task exists already.
async fn take_over_name(docker: &Docker, name: &str, task_id: &str) -> Result<(), DriverError> {
    let info = docker
        .inspect_container(name, None)
        .await
        .map_err(|e| docker_err(format!("inspecting container {name}"), e))?;
    let ours = info
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(LABEL_TASK_ID))
        .is_some_and(|t| t == task_id);
    let state = info
        .state
        .as_ref()
        .and_then(|s| s.status)
        .map(|s| s.to_string())
        .unwrap_or_default();
    if ours && state == "created" {
        return remove_container(docker, info.id.as_deref().unwrap_or(name)).await;
    }
    Err(DriverError::AlreadyExists(format!(
        "task {task_id}: container {name} exists already ({state})"
    )))
}

async fn remove_container(docker: &Docker, cid: &str) -> Result<(), DriverError> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    match docker.remove_container(cid, Some(options)).await {
        Ok(()) => Ok(()),
        Err(e) if status_of(&e) == Some(404) => Ok(()),
        Err(e) => Err(docker_err(format!("removing container {}", short(cid)), e)),
    }
}

/// Send `signal` to the container; one that is not running is not an error.
async fn kill(docker: &Docker, task: &Task, signal: Signal) -> Result<(), DriverError> {
    // By number: what Docker has always been sent, and it needs no name mapping.
    let signal = signal.as_raw();
    let options = KillContainerOptions {
        signal: signal.to_string(),
    };
    match docker
        .kill_container(&task.state.container_id, Some(options))
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if matches!(status_of(&e), Some(404 | 409)) => Ok(()),
        Err(e) => Err(docker_err(
            format!(
                "sending signal {signal} to container {}",
                short(&task.state.container_id)
            ),
            e,
        )),
    }
}

impl DriverPlugin for DockerDriver {
    type Config = PluginConfig;
    type TaskConfig = TaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(PLUGIN_NAME, PLUGIN_VERSION)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_send_signals(true)
            .with_exec(true)
            .with_fs_isolation(FsIsolation::Image)
            .with_task_stats(true)
            .with_task_events(true)
            .with_recover(true)
            // Whatever the daemon offers: `network_mode` is passed through to Docker.
            .with_network_modes(
                NetworkModes::default()
                    .with_host(true)
                    .with_none(true)
                    .with_bridge(true),
            )
    }

    async fn set_config(&self, config: PluginConfig, agent: AgentInfo) -> Result<(), DriverError> {
        let settings = Arc::new(Settings::new(config, &agent)?);
        self.restart_reconciler(&settings);
        *self
            .settings
            .write()
            .unwrap_or_else(PoisonError::into_inner) = settings;
        Ok(())
    }

    async fn fingerprint(&self) -> Fingerprint {
        let settings = self.settings();
        let engine = match &settings.engine {
            Ok(e) => e.clone(),
            Err(why) => return Fingerprint::not_ready(Health::Unhealthy, why.clone()),
        };
        let endpoint = engine.endpoint().to_string();
        let answer = async {
            let docker = engine.client().await?;
            docker
                .version()
                .await
                .map_err(|e| DriverError::Internal(format!("docker daemon at {endpoint}: {e}")))
        };
        let version = match tokio::time::timeout(FINGERPRINT_TIMEOUT, answer).await {
            Ok(Ok(v)) => v,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!(
                        "docker daemon at {endpoint} did not answer within {FINGERPRINT_TIMEOUT:?}"
                    ),
                };
                if !self.answered.load(Ordering::Relaxed) && engine.endpoint().absent() {
                    return Fingerprint::not_ready(
                        Health::Undetected,
                        format!(
                            "no docker daemon: {endpoint} does not exist ({})",
                            engine.address().origin()
                        ),
                    );
                }
                return Fingerprint::not_ready(Health::Unhealthy, why);
            }
        };
        self.answered.store(true, Ordering::Relaxed);
        let v = |s: Option<String>| s.unwrap_or_else(|| "unknown".into());
        let server = v(version.version);
        let api = v(version.api_version);
        let config = &settings.policy.config;
        Fingerprint::healthy(format!("docker {server} (API {api}) at {endpoint}"))
            .attribute("driver.docker.version", server)
            .attribute("driver.docker.api_version", api)
            .attribute("driver.docker.os", v(version.os))
            .attribute("driver.docker.arch", v(version.arch))
            .attribute("driver.docker.endpoint", endpoint)
            .attribute(
                "driver.docker.privileged.enabled",
                config.allow_privileged.to_string(),
            )
            .attribute(
                "driver.docker.volumes.enabled",
                config.volumes.enabled.to_string(),
            )
    }

    fn fingerprint_interval(&self) -> Duration {
        // Cheap (one GET /version), and a daemon going away should show within seconds.
        Duration::from_secs(2)
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        let settings = self.settings();
        let plan = config.plan(&spec, &settings.policy)?;
        let engine = settings.engine()?;
        let reservation = self.store.reserve(&spec.id)?;
        let docker = engine.client().await?;
        // A task may ask for less time than the operator's limit, never more.
        let pull_timeout = plan
            .pull_timeout
            .map_or(settings.policy.config.pull_timeout, |t| {
                t.min(settings.policy.config.pull_timeout)
            });
        if let Some((tarball, file)) = &plan.load {
            self.event(
                &spec.id,
                format!("loading image tarball {}", tarball.display()),
            );
            image::load(&docker, tarball, file, pull_timeout).await?;
            if !image::present(&docker, &plan.image).await? {
                return Err(DriverError::InvalidConfig(format!(
                    "load: {} did not provide image {}",
                    tarball.display(),
                    plan.image
                )));
            }
        } else if plan.force_pull {
            self.event(&spec.id, format!("pulling image {}", plan.image));
            image::pull(&docker, &plan.image, plan.auth.clone(), pull_timeout).await?;
        }
        let staged =
            crate::volumes::Staged::new(&settings.policy.volume_staging, &spec.id, &spec.volumes)?;
        let cid = self.create(&docker, &plan, &spec, pull_timeout).await?;
        // Before the start: a container can be OOM killed, and its cgroup removed,
        // before the start call returns (see `oom`).
        let oom = match engine.endpoint() {
            Endpoint::Unix(_) => crate::oom::arm(&cid, ""),
            Endpoint::Tcp(_) => None,
        };
        if let Err(e) = docker.start_container(&cid, None).await {
            if let Some(w) = &oom {
                w.stop();
            }
            // Leave nothing behind: a container that did not start never ran.
            if let Err(rm) = remove_container(&docker, &cid).await {
                tracing::warn!(task = %spec.id, "{rm}");
            }
            return Err(docker_err(format!("starting container {}", plan.name), e));
        }
        let state = HandleState {
            container_id: cid,
            image: plan.image.clone(),
        };
        let task = Arc::new(Task::new(&spec, state, SystemTime::now(), engine));
        if let Some(w) = oom {
            task.set_oom_watch(w);
        }
        reservation.commit(task.clone());
        staged.keep();
        self.watch(&task);
        self.event(
            &spec.id,
            format!(
                "container {} started from {}",
                short(&task.state.container_id),
                plan.image
            ),
        );
        TaskHandle::new(spec, HANDLE_VERSION, &task.state)
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        Ok(self.store.get(task_id)?.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        sig: Signal,
    ) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Ok(());
        }
        let docker = task.engine.client().await?;
        kill(&docker, &task, sig).await?;
        self.event(task_id, format!("sent signal {}", sig.as_raw()));
        if tokio::time::timeout(timeout, task.stopped()).await.is_err() {
            kill(&docker, &task, Signal::KILL).await?;
            self.event(
                task_id,
                format!("sent SIGKILL: still running after {timeout:?}"),
            );
            tokio::time::timeout(KILL_GRACE, task.stopped())
                .await
                .map_err(|_| {
                    DriverError::Timeout(format!(
                        "container {} of task {task_id} was not reported stopped within \
                         {KILL_GRACE:?} of SIGKILL",
                        short(&task.state.container_id)
                    ))
                })?;
        }
        Ok(())
    }

    async fn signal_task(&self, task_id: &str, sig: Signal) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} has exited"
            )));
        }
        let docker = task.engine.client().await?;
        kill(&docker, &task, sig).await?;
        self.event(task_id, format!("sent signal {}", sig.as_raw()));
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if task.running() && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} is still running; stop it first or destroy it with force"
            )));
        }
        let settings = self.settings();
        let gc = &settings.policy.config.gc;
        let docker = task.engine.client().await?;
        remove_container(&docker, &task.state.container_id).await?;
        crate::volumes::unstage(&settings.policy.volume_staging, task_id);
        task.cancel.cancel();
        self.store.remove(task_id);
        logs::remove_cursor(&task.logs);
        if gc.image && !task.state.image.is_empty() {
            let engine = task.engine.clone();
            let image = task.state.image.clone();
            let delay = gc.image_delay;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(docker) = engine.client().await {
                    image::collect(&docker, &image).await;
                }
            });
        }
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        Ok(self.store.get(task_id)?.status())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        let id = handle.spec.id.clone();
        if self.store.get(&id).is_ok() {
            return Ok(());
        }
        let settings = self.settings();
        let engine = settings.engine()?;
        let reservation = self.store.reserve(&id)?;
        let state = if handle.version == 0 && handle.driver_state.is_empty() {
            let docker = engine.client().await?;
            match self.find(&docker, &id, &settings.policy.alloc_dir).await {
                Ok(state) => state,
                Err(e) => {
                    // Never started (or gone): nothing will destroy it, so its
                    // volumes are unstaged now.
                    crate::volumes::unstage(&settings.policy.volume_staging, &id);
                    return Err(e);
                }
            }
        } else {
            handle.decode_state::<HandleState>(HANDLE_VERSION)?
        };
        // Look at the container if the daemon answers. If it does not, the handle is
        // taken at its word: the watchers keep asking until the daemon is back.
        let mut started_at = SystemTime::now();
        match engine.client().await {
            Ok(docker) => match docker.inspect_container(&state.container_id, None).await {
                Ok(info) => {
                    if let Some(t) =
                        docker_time(info.state.as_ref().and_then(|s| s.started_at.as_deref()))
                    {
                        started_at = t;
                    }
                }
                Err(e) if status_of(&e) == Some(404) => {
                    crate::volumes::unstage(&settings.policy.volume_staging, &id);
                    return Err(DriverError::NotFound(format!(
                        "container {} of task {id} no longer exists",
                        short(&state.container_id)
                    )));
                }
                Err(e) => tracing::warn!(task = %id, "recovering without inspecting: {e}"),
            },
            Err(e) => tracing::warn!(task = %id, "recovering without inspecting: {e}"),
        }
        let image = if state.image.is_empty() {
            // A probe of a container made by an older plugin: take the config's word.
            serde_json::from_str::<TaskConfig>(&handle.spec.driver_config_json)
                .map(|c| normalize_image(&c.image))
                .unwrap_or_default()
        } else {
            state.image.clone()
        };
        let state = HandleState { image, ..state };
        let task = Arc::new(Task::new(&handle.spec, state, started_at, engine));
        reservation.commit(task.clone());
        self.watch(&task);
        self.event(
            &id,
            format!(
                "task recovered (container {})",
                short(&task.state.container_id)
            ),
        );
        Ok(())
    }

    async fn task_stats(&self, task_id: &str) -> Result<TaskStats, DriverError> {
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} has exited"
            )));
        }
        let docker = task.engine.client().await?;
        let options = StatsOptions {
            stream: false,
            // One reading at once, instead of the daemon waiting for a second one;
            // the CPU percentage comes from consecutive calls.
            one_shot: true,
        };
        let mut readings = docker.stats(&task.state.container_id, Some(options));
        match readings.next().await {
            Some(Ok(s)) => Ok(task.sample(&s)),
            Some(Err(e)) => Err(docker_err(
                format!("stats of container {}", short(&task.state.container_id)),
                e,
            )),
            None => Err(DriverError::Internal(format!(
                "stats of container {}: no answer",
                short(&task.state.container_id)
            ))),
        }
    }

    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        Some(self.events.subscribe())
    }

    async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        if command.is_empty() {
            return Err(DriverError::InvalidConfig("exec needs a command".into()));
        }
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} has exited"
            )));
        }
        let docker = task.engine.client().await?;
        let cid = &task.state.container_id;
        let options = CreateExecOptions {
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            cmd: Some(command.clone()),
            ..Default::default()
        };
        let exec = docker
            .create_exec(cid, options)
            .await
            .map_err(|e| docker_err(format!("exec in container {}", short(cid)), e))?;
        let run = async {
            let mut out = ExecOutput::default();
            if let StartExecResults::Attached { mut output, .. } = docker
                .start_exec(&exec.id, None)
                .await
                .map_err(|e| docker_err(format!("exec {command:?}"), e))?
            {
                while let Some(chunk) = output.next().await {
                    match chunk.map_err(|e| docker_err(format!("exec {command:?}"), e))? {
                        // At most `EXEC_OUTPUT_LIMIT` of each is kept; the rest is
                        // read and dropped, so the command never blocks.
                        bollard::container::LogOutput::StdOut { message } => {
                            ExecOutput::append_capped(&mut out.stdout, &message);
                        }
                        bollard::container::LogOutput::StdErr { message } => {
                            ExecOutput::append_capped(&mut out.stderr, &message);
                        }
                        _ => {}
                    }
                }
            }
            let info = docker
                .inspect_exec(&exec.id)
                .await
                .map_err(|e| docker_err(format!("exec {command:?}"), e))?;
            out.result = ExitResult::code(
                info.exit_code
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(-1),
            );
            Ok::<_, DriverError>(out)
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(r) => r,
            Err(_) => {
                let killed = kill_exec(&docker, &exec.id, cid).await;
                Ok(ExecOutput::new(ExitResult::unknown(format!(
                    "timed out after {timeout:?}{killed}"
                ))))
            }
        }
    }

    async fn exec_task_streaming(
        &self,
        task_id: &str,
        mut session: ExecSession,
    ) -> Result<ExitResult, DriverError> {
        use tokio::io::AsyncWriteExt as _;
        if session.command.is_empty() {
            return Err(DriverError::InvalidConfig("exec needs a command".into()));
        }
        let task = self.store.get(task_id)?;
        if !task.running() {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} has exited"
            )));
        }
        let docker = task.engine.client().await?;
        let cid = task.state.container_id.clone();
        let tty = session.tty;
        // Docker runs it in the container: its user, namespaces, cgroup, capabilities,
        // seccomp and AppArmor profiles, as the task's own processes.
        let options = CreateExecOptions {
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(tty),
            cmd: Some(session.command.clone()),
            ..Default::default()
        };
        let what = format!("exec in container {}", short(&cid));
        let exec = docker
            .create_exec(&cid, options)
            .await
            .map_err(|e| docker_err(what.clone(), e))?;
        let started = docker
            .start_exec(
                &exec.id,
                Some(bollard::exec::StartExecOptions {
                    detach: false,
                    tty,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| docker_err(what.clone(), e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(DriverError::Internal(format!("{what}: not attached")));
        };
        let resize = |size: drover_plugin_sdk::TerminalSize| {
            let docker = docker.clone();
            let id = exec.id.clone();
            async move {
                let _ = docker
                    .resize_exec(
                        &id,
                        bollard::exec::ResizeExecOptions {
                            height: size.rows,
                            width: size.cols,
                        },
                    )
                    .await;
            }
        };
        if tty && let Some(size) = session.size {
            resize(size).await;
        }
        let mut input_open = true;
        let gone = loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    None => break false,
                    Some(Err(e)) => return Err(docker_err(what, e)),
                    Some(Ok(out)) => {
                        let chunk = match out {
                            bollard::container::LogOutput::StdErr { message } => ExecChunk::Stderr(message.to_vec()),
                            bollard::container::LogOutput::StdOut { message }
                            | bollard::container::LogOutput::Console { message } => ExecChunk::Stdout(message.to_vec()),
                            _ => continue,
                        };
                        if session.output.send(chunk).await.is_err() {
                            break true;
                        }
                    }
                },
                msg = session.input.recv(), if input_open => match msg {
                    Some(ExecInput::Stdin(data)) => {
                        if input.write_all(&data).await.is_err() {
                            input_open = false;
                        }
                    }
                    Some(ExecInput::Resize(size)) => resize(size).await,
                    Some(ExecInput::StdinClosed) => {
                        if tty {
                            // The terminal's end-of-file character.
                            let _ = input.write_all(&[0x04]).await;
                        } else {
                            let _ = input.shutdown().await;
                        }
                        input_open = false;
                    }
                    Some(_) => {}
                    None => break true,
                },
            }
        };
        if gone {
            // The caller went away: Docker cannot end an exec; kill its process.
            let _ = kill_exec(&docker, &exec.id, &cid).await;
            return Err(DriverError::Unavailable(
                "the exec's caller went away".into(),
            ));
        }
        let info = docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| docker_err(what, e))?;
        Ok(ExitResult::code(
            info.exit_code
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1),
        ))
    }

    async fn shutdown(&self) {
        if let Some(c) = self
            .reconciler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            c.cancel();
        }
    }
}

/// SIGKILLs an exec'd command that outlived its timeout (a script check runs at every
/// interval: it must not pile up processes). Docker's API cannot kill an exec, so
/// this sends the signal from here to the pid Docker reports, and only when that pid
/// is, in this host's `/proc`, a process of the container (the daemon may be remote
/// or in another pid namespace, where the pid names something else). Says what
/// happened, for the caller's message.
async fn kill_exec(docker: &Docker, exec_id: &str, cid: &str) -> String {
    let info = match docker.inspect_exec(exec_id).await {
        Ok(info) => info,
        Err(e) => return format!("; cannot inspect the exec to kill it: {e}"),
    };
    if info.running != Some(true) {
        return String::new();
    }
    let Some(pid) = info
        .pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    else {
        return "; left running: Docker gave no pid to kill".into();
    };
    let cgroup = tokio::fs::read_to_string(format!("/proc/{}/cgroup", pid.as_raw_nonzero()))
        .await
        .unwrap_or_default();
    if cid.is_empty() || !cgroup.contains(cid) {
        return format!(
            "; left running: pid {} is not a process of the container on this host",
            pid.as_raw_nonzero()
        );
    }
    match rustix::process::kill_process(pid, rustix::process::Signal::KILL) {
        Ok(()) => "; killed".into(),
        Err(e) => format!("; cannot kill it: {e}"),
    }
}
