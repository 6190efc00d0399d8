//! The isolation engine shared by the exec and java drivers: [`IsolatedDriver`]
//! implements the whole driver (cgroups, root, capabilities, user, executor,
//! recovery, stats) and asks a [`Flavor`] only what differs — the task
//! configuration and how it becomes a command line.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use drover_executor::task::{self, Watched, unknown_exit};
use drover_executor::{
    self as executor, Credentials, ExecutorHandle, ExitInfo, Isolation, LaunchSpec, Namespaces,
};
use drover_plugin_sdk::schemars::JsonSchema;
use drover_plugin_sdk::serde::de::DeserializeOwned;
use drover_plugin_sdk::store::TaskEvents;
use drover_plugin_sdk::{
    AgentInfo, Capabilities, DriverError, DriverPlugin, ExecSession, ExitResult, Fingerprint,
    FsIsolation, NetworkModes, PluginInfo, Signal, TaskEvent, TaskHandle, TaskSpec, TaskStats,
    TaskStatus,
};
use tokio::sync::broadcast;

use crate::caps::{self, CapSet};
use crate::cgroup::{self, Limits, TaskCgroup, Version};
use crate::config::{IsolationConfig, NetworkMode, PluginConfig};
use crate::handle::{HandleState, Task};
use crate::rootfs::{ChrootEnv, TaskRoot};
use crate::seccomp::Policy;
use crate::store::Store;
use crate::{probe, user};

/// Version of the task handle's driver state.
pub const HANDLE_VERSION: u32 = 1;
/// `PATH` given to tasks whose environment does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Default parent of task cgroups.
pub const DEFAULT_CGROUP_PARENT: &str = "/drover";
/// Memory limit of a task whose `resources` give none (Nomad's default task memory).
pub const DEFAULT_MEMORY_MB: u64 = 300;
/// CPU shares of a task whose `resources` give none (Nomad's default 100 MHz is 100
/// shares in its exec driver).
pub const DEFAULT_CPU_SHARES: u64 = 100;
/// Pids limit of a task whose config gives none: room for a JVM's threads or a busy
/// shell pipeline, not for a fork bomb.
pub const DEFAULT_PIDS_LIMIT: u64 = 1024;
/// Who tasks may not run as unless the plugin config says otherwise.
pub const DEFAULT_USER_DENYLIST: [&str; 1] = ["root"];

/// How often the cgroup of a task without executor is checked for its end.
const ORPHAN_POLL: Duration = Duration::from_millis(200);
/// Limit for emptying and removing a cgroup.
const CGROUP_EMPTY: Duration = Duration::from_secs(10);

/// A task's program and arguments, as paths inside its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    /// Program: absolute, or found in the task's `PATH` (inside its root).
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
}

/// What a flavor sees of a task being started.
pub struct TaskContext<'a> {
    /// The task.
    pub spec: &'a TaskSpec,
    /// Its root: check paths in it with [`TaskRoot::host_path`] and
    /// [`TaskRoot::find_command`].
    pub root: &'a TaskRoot,
    /// Its working directory inside the root.
    pub cwd: &'a Path,
    /// Its `PATH`.
    pub path: &'a str,
}

/// What makes a driver on [`IsolatedDriver`] what it is.
pub trait Flavor: Send + Sync + 'static {
    /// The task configuration. Derive `Deserialize` and `JsonSchema` with
    /// `#[serde(deny_unknown_fields)]`.
    type TaskConfig: DeserializeOwned + JsonSchema + Send + Sync;
    /// The driver's name (`exec`, `java`).
    const NAME: &'static str;
    /// The plugin's version.
    const VERSION: &'static str;

    /// The isolation part of a task's configuration.
    fn isolation(&self, config: &Self::TaskConfig) -> IsolationConfig;

    /// The command line of a task. Check everything that can be checked against the
    /// root here: an error refuses the start before anything exists.
    fn command(
        &self,
        task: &TaskContext<'_>,
        config: &Self::TaskConfig,
    ) -> Result<CommandLine, DriverError>;

    /// Host paths this flavor needs in every task's root besides the chroot list
    /// (skipped when missing). Default: none.
    fn chroot_extra(&self) -> Vec<PathBuf> {
        Vec::new()
    }

    /// The fingerprint, given the isolation's (healthy only if isolation works).
    /// Default: that one.
    fn fingerprint(&self, isolation: Fingerprint) -> impl Future<Output = Fingerprint> + Send {
        async { isolation }
    }
}

/// Settings from `SetConfig`.
struct Settings {
    state_dir: PathBuf,
    allow: CapSet,
    chroot: ChrootEnv,
    cgroup_parent: String,
    version: Version,
    seccomp: Policy,
    /// `user_denylist` entries and the uid each resolved to.
    denied_users: Vec<(String, u32)>,
}

/// Resolve `user_denylist` (default: root) to uids, once, at SetConfig.
fn denied_users(list: Option<&[String]>) -> Result<Vec<(String, u32)>, DriverError> {
    let default: Vec<String> = DEFAULT_USER_DENYLIST.map(String::from).to_vec();
    list.unwrap_or(&default)
        .iter()
        .map(|entry| {
            let creds = user::resolve(entry).map_err(|e| {
                DriverError::InvalidConfig(format!("user_denylist: entry {entry:?}: {e}"))
            })?;
            Ok((entry.clone(), creds.uid))
        })
        .collect()
}

/// A task driver that contains every task: mount, pid, ipc and uts namespaces
/// (network optional), a chroot built from a list of host paths, a cgroup with
/// memory, CPU and pids limits, a bounded capability set, `no_new_privs`, a non-root
/// user and rlimits. Each task is owned by an executor process, so it outlives the
/// plugin; its cgroup outlives even the executor, so DestroyTask always kills all of
/// it.
pub struct IsolatedDriver<F: Flavor> {
    flavor: F,
    store: Store,
    events: TaskEvents,
    settings: RwLock<Arc<Settings>>,
}

/// Record how `task` ended, with the OOM flag from its cgroup, and tell subscribers,
/// once.
fn record_exit(events: &TaskEvents, task: &Task, mut exit: ExitInfo) {
    exit.result.oom_killed = task.cgroup.oom_kills() > 0;
    task.base.record_exit(events, exit);
}

/// Run blocking cgroup work off the runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DriverError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DriverError::Internal(format!("cgroup work failed: {e}")))
}

/// Kill everything in `cg` and remove it.
/// The devices cgroup rules of a task given `devices`: its minimal `/dev`, and each
/// given node (read without following a link; it must be a character or block
/// device) with its permissions.
fn device_rules(
    devices: &[drover_plugin_sdk::TaskDevice],
) -> Result<Vec<cgroup::DeviceRule>, DriverError> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let mut rules = cgroup::minimal_dev_rules();
    for d in devices {
        let meta = std::fs::symlink_metadata(&d.host_path).map_err(|e| {
            DriverError::InvalidConfig(format!(
                "device node {}: cannot read {}: {e}",
                d.task_path.display(),
                d.host_path.display()
            ))
        })?;
        let block = meta.file_type().is_block_device();
        if !block && !meta.file_type().is_char_device() {
            return Err(DriverError::InvalidConfig(format!(
                "device node {}: {} is not a character or block device",
                d.task_path.display(),
                d.host_path.display()
            )));
        }
        let rdev = meta.rdev();
        rules.push(cgroup::DeviceRule {
            block,
            major: rustix::fs::major(rdev),
            minor: rustix::fs::minor(rdev),
            access: d.permissions.clone(),
        });
    }
    Ok(rules)
}

async fn remove_cgroup(cg: Arc<dyn TaskCgroup>) -> Result<(), DriverError> {
    blocking(move || cgroup::empty_and_remove(&*cg, CGROUP_EMPTY))
        .await?
        .map_err(DriverError::Internal)
}

/// The task's environment: a default `PATH` under the spec's variables, and the
/// agent's `DROVER_*` directory variables rewritten to where those directories are
/// inside the task's root (the task directory is `/` there).
fn task_env(spec: &TaskSpec) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if !spec.task_dir.as_os_str().is_empty() {
        for (k, v) in &mut env {
            if k.starts_with("DROVER_")
                && let Ok(rest) = Path::new(v.as_str()).strip_prefix(&spec.task_dir)
            {
                *v = Path::new("/").join(rest).display().to_string();
            }
        }
    }
    if !spec.alloc_dir.as_os_str().is_empty() {
        // The shared allocation directory is mounted at /alloc (`TaskRoot::with_alloc_dir`).
        env.insert(
            "DROVER_ALLOC_DIR".to_owned(),
            crate::rootfs::ALLOC_MOUNT_POINT.to_owned(),
        );
    }
    env
}

/// `local/` (0755), `secrets/` and `tmp/` (0700) exist and belong to the task's user,
/// who must be able to write its own directories, and no other user can use `tmp/`.
/// They are reached from the task directory's descriptor without following links
/// (a previous incarnation of the task may have planted some): a link there is
/// refused, never chown'ed through.
fn prepare_task_dir(dir: &Path, creds: &Credentials) -> Result<(), DriverError> {
    use drover_plugin_sdk::taskdir::Dir;
    let task = Dir::open(dir).map_err(|e| {
        DriverError::Internal(format!("cannot open task dir {}: {e}", dir.display()))
    })?;
    for (sub, mode) in [("local", 0o755), ("secrets", 0o700), ("tmp", 0o700)] {
        let io = |what: &str, e: std::io::Error| {
            DriverError::Internal(format!("cannot {what} {}: {e}", dir.join(sub).display()))
        };
        let d = task.create_dir(sub, mode).map_err(|e| io("create", e))?;
        d.set_owner(creds.uid, creds.gid)
            .map_err(|e| io("give the task's user", e))?;
        d.set_mode(mode).map_err(|e| io("set the mode of", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod task_dir_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    /// The task's directories go to its user with the documented modes; a link
    /// planted in place of one is refused, and its target left alone. Needs root
    /// (chown), like every isolation test.
    #[test]
    fn task_dirs_go_to_the_task_user_and_links_are_refused() {
        assert!(
            rustix::process::geteuid().is_root(),
            "the isolation tests run as root (scripts/test.sh)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t1");
        std::fs::create_dir(&dir).unwrap();
        let nobody = Credentials {
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        };
        prepare_task_dir(&dir, &nobody).unwrap();
        for (sub, mode) in [("local", 0o755), ("secrets", 0o700), ("tmp", 0o700)] {
            let m = std::fs::symlink_metadata(dir.join(sub)).unwrap();
            assert_eq!((m.uid(), m.gid()), (65534, 65534), "{sub}");
            assert_eq!(m.mode() & 0o7777, mode, "{sub}");
        }
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::remove_dir(dir.join("tmp")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("tmp")).unwrap();
        let e = prepare_task_dir(&dir, &nobody).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
    }
}

/// The cgroup limits of a task: its `resources` and config, with defaults where they
/// say nothing, so that no isolated task runs without a memory and a pids limit.
/// A task of a group in bridge mode (given the group's namespace) that asks for
/// `network_mode = "none"` is refused: it would join the bridge, silently getting the
/// network it asked not to have.
fn check_network_mode(spec: &TaskSpec, iso: &IsolationConfig) -> Result<(), DriverError> {
    if iso.network_mode == NetworkMode::None && !spec.netns_path.as_os_str().is_empty() {
        return Err(DriverError::InvalidConfig(format!(
            "network_mode = \"none\": the task's group is in bridge mode (network \
             namespace {}), and a task of it joins the group's network; remove \
             network_mode, or move the task to a group without a bridge network",
            spec.netns_path.display()
        )));
    }
    Ok(())
}

fn limits(spec: &TaskSpec, iso: &IsolationConfig) -> Result<Limits, DriverError> {
    // Checked: a shift would wrap a huge value into a small (or zero) limit.
    let mib = |m: i64, field: &str| -> Result<Option<u64>, DriverError> {
        match u64::try_from(m).ok().filter(|m| *m > 0) {
            None => Ok(None),
            Some(m) => m.checked_mul(1 << 20).map(Some).ok_or_else(|| {
                DriverError::InvalidConfig(format!(
                    "resources.{field} = {m} MiB is too large: it does not fit in bytes"
                ))
            }),
        }
    };
    let (max, reserved) = (
        mib(spec.resources.memory_max_mb, "memory_max_mb")?,
        mib(spec.resources.memory_mb, "memory_mb")?,
    );
    Ok(Limits {
        memory: Some(max.or(reserved).unwrap_or(DEFAULT_MEMORY_MB << 20)),
        memory_soft: max.and(reserved).filter(|r| Some(*r) < max),
        cpu_shares: Some(
            u64::try_from(spec.resources.cpu_shares)
                .ok()
                .filter(|s| *s > 0)
                .unwrap_or(DEFAULT_CPU_SHARES),
        ),
        cpu_cores: iso.cpu_limit,
        pids: Some(iso.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT)),
    })
}

impl<F: Flavor + Default> IsolatedDriver<F> {
    /// A driver of the default flavor, with no tasks.
    pub fn new() -> Self {
        Self::with_flavor(F::default())
    }
}

impl<F: Flavor + Default> Default for IsolatedDriver<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F: Flavor> IsolatedDriver<F> {
    /// A driver of flavor `flavor`, with no tasks and the default settings until
    /// `SetConfig`.
    pub fn with_flavor(flavor: F) -> Self {
        IsolatedDriver {
            flavor,
            store: Store::default(),
            events: TaskEvents::default(),
            settings: RwLock::new(Arc::new(Settings {
                state_dir: executor::state_dir(Path::new(""), F::NAME),
                allow: caps::default_set(),
                chroot: ChrootEnv::default_list(),
                cgroup_parent: DEFAULT_CGROUP_PARENT.to_owned(),
                version: Version::detect(),
                seccomp: Policy::default(),
                denied_users: DEFAULT_USER_DENYLIST
                    .iter()
                    .map(|u| ((*u).to_owned(), 0))
                    .collect(),
            })),
        }
    }

    /// The flavor.
    pub fn flavor(&self) -> &F {
        &self.flavor
    }

    fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn event(&self, task_id: &str, message: String) {
        self.events.send(task_id, message);
    }

    /// Deny the task every device but its minimal `/dev` and the device nodes it was
    /// given: on cgroup v1 a devices cgroup beside its others. cgroup v2 has no devices
    /// files (its rules are eBPF programs, not made here): there the task's `/dev`,
    /// read-only and holding only those nodes, is the only limit, and a task event
    /// says so.
    async fn restrict_devices(
        &self,
        spec: &TaskSpec,
        cg: &Arc<dyn TaskCgroup>,
    ) -> Result<(), DriverError> {
        let rules = device_rules(&spec.devices)?;
        match cg.version() {
            Version::V1 => {
                let path = cg.path().to_owned();
                blocking(move || cgroup::restrict_devices_v1(&path, &rules))
                    .await?
                    .map_err(DriverError::Internal)
            }
            Version::V2 => {
                self.event(
                    &spec.id,
                    "cgroup v2: the device nodes' permissions are not enforced by a devices \
                     cgroup; the task's /dev holds only its minimal nodes and the ones it was given"
                        .into(),
                );
                Ok(())
            }
        }
    }

    /// Follow `task` until it exits: a `wait` on its executor, or, without a live
    /// executor, its cgroup until it is empty.
    fn watch(&self, task: Arc<Task>) {
        let events = self.events.clone();
        tokio::spawn(async move {
            if let Some(exec) = &task.exec {
                match task::watch(&task.base, exec, &events).await {
                    Watched::Exited(exit) => return record_exit(&events, &task, exit),
                    Watched::Recorded => return,
                    Watched::ExecutorLost(error) => events.send(
                        &task.base.id,
                        format!(
                            "lost the task's executor (pid {}): {error}; following the task \
                             through its cgroup {}",
                            task.state.executor_pid, task.state.cgroup_path
                        ),
                    ),
                }
            }
            // No executor: the task ends when its cgroup is empty; how, nobody knows.
            while task.base.running() {
                let cg = task.cgroup.clone();
                let empty = blocking(move || cg.pids().is_empty())
                    .await
                    .unwrap_or(false);
                if empty {
                    let exit = unknown_exit(format!(
                        "the task's executor (pid {}) died before it, so its exit status is \
                         unknown; its cgroup {} is empty now",
                        task.state.executor_pid, task.state.cgroup_path
                    ));
                    return record_exit(&events, &task, exit);
                }
                tokio::time::sleep(ORPHAN_POLL).await;
            }
        });
    }

    /// Stop a task whose executor is gone: the signal to its init (which forwards it),
    /// once the init is proven to be the task's (pidfd and start time: a bare pid may
    /// be someone else's by now), then SIGKILL to the whole cgroup after `timeout`
    /// (the freezer or `cgroup.kill`: membership is the proof). Without a live init
    /// nothing is signalled by pid: the kernel killed the init's pid namespace with
    /// it, so the cgroup is emptying already.
    async fn stop_orphan(&self, task: &Task, sig: Signal, timeout: Duration) -> ExitInfo {
        let (init, start_time) = (task.state.pid, task.state.start_time);
        if init != 0 {
            let raw = sig.as_raw();
            let sent =
                blocking(move || drover_executor::lost::signal_proven(init, start_time, raw))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r);
            match sent {
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    task = %task.base.id,
                    "not signalling init {init} of a task without executor: {e}"
                ),
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut escalated = false;
        loop {
            let cg = task.cgroup.clone();
            if blocking(move || cg.pids().is_empty())
                .await
                .unwrap_or(false)
            {
                break;
            }
            if tokio::time::Instant::now() >= deadline && !escalated {
                escalated = true;
                let cg = task.cgroup.clone();
                let _ = blocking(move || cg.kill_all()).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ExitInfo {
            killed_after_timeout: escalated,
            ..unknown_exit(format!(
                "stopped without its executor (pid {}), so its exit status is unknown",
                task.state.executor_pid
            ))
        }
    }

    /// Start `spec` with `cmd`, contained as `iso` says.
    async fn start(
        &self,
        spec: TaskSpec,
        iso: IsolationConfig,
        config: &F::TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        let settings = self.settings();
        iso.validate()?;
        check_network_mode(&spec, &iso)?;
        let capabilities = caps::task_caps(settings.allow, &iso.cap_add, &iso.cap_drop)?;
        let rlimits = iso.rlimits()?;
        let lim = limits(&spec, &iso)?;
        let name = iso
            .user
            .as_deref()
            .or((!spec.user.is_empty()).then_some(spec.user.as_str()))
            .unwrap_or(user::DEFAULT_USER);
        let creds = user::resolve(name)?;
        if let Some((entry, uid)) = settings.denied_users.iter().find(|(_, u)| *u == creds.uid) {
            return Err(DriverError::InvalidConfig(format!(
                "user {name:?} (uid {uid}) is refused by the {} plugin's user_denylist (entry \
                 {entry:?}); run the task as another user, or take {entry:?} out of \
                 user_denylist in the plugin's config",
                F::NAME
            )));
        }
        // Group 0 owns root's files on most hosts (and `/etc/shadow` on some): when
        // root is denied, so is running with its group.
        if settings.denied_users.iter().any(|(_, u)| *u == 0)
            && (creds.gid == 0 || creds.groups.contains(&0))
        {
            let which = if creds.gid == 0 {
                "primary"
            } else {
                "supplementary"
            };
            return Err(DriverError::InvalidConfig(format!(
                "user {name:?} (uid {}, gid {}) has gid 0 as its {which} group, refused because \
                 the {} plugin's user_denylist denies root; run the task with another group \
                 (e.g. \"{}:{}\"), or take root out of user_denylist",
                creds.uid,
                creds.gid,
                F::NAME,
                creds.uid,
                creds.uid.max(1)
            )));
        }
        if spec.task_dir.as_os_str().is_empty() {
            return Err(DriverError::InvalidConfig(format!(
                "{} builds each task's root in its task directory, and this task has none",
                F::NAME
            )));
        }
        let root = TaskRoot::build(&settings.chroot, &spec.task_dir)?
            .with_alloc_dir(&spec.alloc_dir)
            .with_volumes(&spec.volumes)?
            .with_devices(&spec.devices)?
            .with_device_mounts(&spec.mounts)?;
        let env = task_env(&spec);
        let cwd = PathBuf::from(iso.cwd.as_deref().unwrap_or("/"));
        let path = env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
        let cmd = self.flavor.command(
            &TaskContext {
                spec: &spec,
                root: &root,
                cwd: &cwd,
                path,
            },
            config,
        )?;
        let reservation = self.store.reserve(&spec.id)?;
        prepare_task_dir(&spec.task_dir, &creds)?;

        let exec_dir = executor::task_dir(&settings.state_dir, &spec.id);
        let cg: Arc<dyn TaskCgroup> = Arc::from(cgroup::open(
            settings.version,
            &settings.cgroup_parent,
            &spec.id,
        ));
        if cg.exists() {
            if let Ok(h) = ExecutorHandle::connect(&exec_dir).await
                && h.info().running()
            {
                return Err(DriverError::AlreadyExists(format!(
                    "task {} is running already (executor pid {}); recover it instead",
                    spec.id,
                    h.info().executor_pid
                )));
            }
            // Left by an earlier run of this id whose executor is gone.
            remove_cgroup(cg.clone()).await?;
            self.event(
                &spec.id,
                format!(
                    "removed the leftover cgroup {} of an earlier run",
                    cg.path()
                ),
            );
        }
        let limits_shown = format!(
            "memory {} MiB, pids {}",
            lim.memory.unwrap_or(0) >> 20,
            lim.pids.unwrap_or(0)
        );
        let created = cg.clone();
        blocking(move || created.create(&lim))
            .await?
            .map_err(DriverError::Internal)?;
        if !spec.devices.is_empty()
            && let Err(e) = self.restrict_devices(&spec, &cg).await
        {
            let _ = remove_cgroup(cg.clone()).await;
            return Err(e);
        }

        let mut isolation = Isolation::default();
        isolation.cgroup_procs = cg.procs_files();
        isolation.namespaces = Namespaces {
            mount: true,
            pid: true,
            ipc: true,
            uts: true,
            // A task of a group in bridge mode joins its group's namespace instead.
            net: iso.network_mode == NetworkMode::None && spec.netns_path.as_os_str().is_empty(),
        };
        if !spec.netns_path.as_os_str().is_empty() {
            isolation.netns_path = Some(spec.netns_path.clone());
        }
        isolation.hostname = iso.hostname.clone();
        isolation.mounts = root.mounts();
        isolation.rlimits = rlimits;
        isolation.credentials = Some(creds);
        isolation.capabilities = Some(capabilities);
        isolation.no_new_privs = true;
        isolation.seccomp = settings.seccomp.program().cloned();
        let mut how = LaunchSpec::new(spec.id.clone(), cmd.program);
        how.args = cmd.args;
        how.env = env;
        how.cwd = cwd;
        how.stdout_path = spec.stdout_path.clone();
        how.stderr_path = spec.stderr_path.clone();
        how.logs = spec.logs;
        how.isolation = Some(isolation);
        let exec = match executor::launch(&settings.state_dir, &how).await {
            Ok(exec) => exec,
            Err(e) => {
                if !matches!(e, DriverError::AlreadyExists(_))
                    && let Err(ce) = remove_cgroup(cg.clone()).await
                {
                    tracing::warn!(task = %spec.id, "cannot remove the cgroup of a failed start: {ce}");
                }
                return Err(e);
            }
        };
        let info = exec.info().clone();
        let state = HandleState {
            executor_dir: exec.dir().to_owned(),
            pid: info.pid,
            start_time: info.start_time,
            executor_pid: info.executor_pid,
            cgroup_version: cg.version(),
            cgroup_path: cg.path().to_owned(),
        };
        let task = Arc::new(Task::new(
            spec.id.clone(),
            spec.name.clone(),
            Some(exec),
            state.clone(),
            cg,
        ));
        reservation.commit(task.clone());
        self.watch(task);
        self.event(
            &spec.id,
            format!(
                "task started (init pid {}, cgroup {}, user {name}, {limits_shown}, seccomp {})",
                state.pid,
                state.cgroup_path,
                if settings.seccomp.program().is_some() {
                    "default"
                } else {
                    "unconfined"
                }
            ),
        );
        TaskHandle::new(spec, HANDLE_VERSION, &state)
    }

    /// Destroy what is left of a task this plugin process does not track: its
    /// executor (found by id) and its cgroup.
    async fn destroy_unknown(&self, task_id: &str) -> Result<(), DriverError> {
        let settings = self.settings();
        let dir = executor::task_dir(&settings.state_dir, task_id);
        let cg: Arc<dyn TaskCgroup> = Arc::from(cgroup::open(
            settings.version,
            &settings.cgroup_parent,
            task_id,
        ));
        let mut found = false;
        if dir.exists() {
            found = true;
            match ExecutorHandle::connect(&dir).await {
                Ok(exec) => exec.destroy().await?,
                Err(_) => {
                    if let Err(e) = std::fs::remove_dir_all(&dir)
                        && e.kind() != std::io::ErrorKind::NotFound
                    {
                        return Err(DriverError::Internal(format!(
                            "cannot remove {}: {e}",
                            dir.display()
                        )));
                    }
                }
            }
        }
        if cg.exists() {
            found = true;
            remove_cgroup(cg).await?;
        }
        if found {
            self.event(task_id, "destroyed what was left of the task".into());
            Ok(())
        } else {
            Err(DriverError::NotFound(format!("task {task_id}")))
        }
    }

    /// The executor directory and cgroup a recovery handle points at; from the id
    /// alone when the host never got the handle.
    fn recovery_state(&self, handle: &TaskHandle) -> Result<HandleState, DriverError> {
        let id = &handle.spec.id;
        if handle.driver_state.is_empty() {
            let s = self.settings();
            let cg = cgroup::open(s.version, &s.cgroup_parent, id);
            return Ok(HandleState {
                executor_dir: executor::task_dir(&s.state_dir, id),
                pid: 0,
                start_time: 0,
                executor_pid: 0,
                cgroup_version: cg.version(),
                cgroup_path: cg.path().to_owned(),
            });
        }
        match handle.version {
            HANDLE_VERSION => handle.decode_state::<HandleState>(HANDLE_VERSION),
            v => Err(DriverError::InvalidConfig(format!(
                "task {id} has a handle of version {v}; this {} ({}) knows version \
                 {HANDLE_VERSION}",
                F::NAME,
                F::VERSION
            ))),
        }
    }
}

impl<F: Flavor> DriverPlugin for IsolatedDriver<F> {
    type Config = PluginConfig;
    type TaskConfig = F::TaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(F::NAME, F::VERSION)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_send_signals(true)
            // A command joins the task's namespaces, cgroup and sandbox (crate::exec).
            .with_exec(true)
            .with_fs_isolation(FsIsolation::Chroot)
            .with_task_stats(true)
            .with_task_events(true)
            .with_recover(true)
            .with_network_modes(
                NetworkModes::default()
                    .with_host(true)
                    .with_none(true)
                    .with_bridge(false)
                    // Joins the namespace its group's runner made (TaskSpec::netns_path).
                    .with_group(true),
            )
    }

    async fn set_config(&self, config: PluginConfig, agent: AgentInfo) -> Result<(), DriverError> {
        let allow = match &config.allow_caps {
            Some(list) => caps::parse_list("allow_caps", list)?,
            None => caps::default_set(),
        };
        let chroot = match &config.chroot_env {
            Some(map) => ChrootEnv::from_config(map)?,
            None => ChrootEnv::default_list(),
        }
        .with(self.flavor.chroot_extra());
        let cgroup_parent = config
            .cgroup_parent
            .clone()
            .unwrap_or_else(|| DEFAULT_CGROUP_PARENT.to_owned());
        let plain = |c: std::path::Component<'_>| matches!(c, std::path::Component::Normal(_));
        let p = Path::new(&cgroup_parent);
        if !p.is_absolute() || p.components().count() < 2 || !p.components().skip(1).all(plain) {
            return Err(DriverError::InvalidConfig(format!(
                "cgroup_parent {cgroup_parent:?} must be an absolute path below the cgroup \
                 root, like /drover"
            )));
        }
        let seccomp = Policy::new(config.seccomp, &config.seccomp_allow)?;
        let denied_users = denied_users(config.user_denylist.as_deref())?;
        let state_dir = executor::state_dir(&agent.plugin_state_dir, F::NAME);
        executor::prepare_state_dir(&state_dir)?;
        *self
            .settings
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(Settings {
            state_dir,
            allow,
            chroot,
            cgroup_parent,
            version: Version::detect(),
            seccomp,
            denied_users,
        });
        Ok(())
    }

    async fn fingerprint(&self) -> Fingerprint {
        let parent = self.settings().cgroup_parent.clone();
        let fp = match blocking(move || probe::isolation(F::NAME, &parent)).await {
            Ok((fp, _)) => fp,
            Err(e) => Fingerprint::not_ready(drover_plugin_sdk::Health::Unhealthy, e.to_string()),
        };
        let fp = fp.attribute(format!("driver.{}.version", F::NAME), F::VERSION);
        self.flavor.fingerprint(fp).await
    }

    async fn exec_task_streaming(
        &self,
        task_id: &str,
        session: ExecSession,
    ) -> Result<ExitResult, DriverError> {
        let task = self.store.get(task_id)?;
        task.base.ensure_running()?;
        let (program, args) = session
            .command
            .split_first()
            .ok_or_else(|| DriverError::InvalidConfig("exec needs a command".into()))?;
        crate::exec::check_program(program).map_err(DriverError::InvalidConfig)?;
        let dir = task.state.executor_dir.clone();
        let (pid, start_time) = (task.state.pid, task.state.start_time);
        let procs = task.cgroup.procs_files();
        let tty = session.tty;
        let (plan, env) = blocking(move || {
            let spec = executor::read_launch_spec(&dir)?;
            let plan = crate::exec::ExecPlan::new(&spec, pid, start_time, &procs, tty)?;
            Ok::<_, String>((plan, spec.env))
        })
        .await?
        .map_err(|e| {
            DriverError::FailedPrecondition(format!("cannot exec in task {task_id}: {e}"))
        })?;
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(&env)
            // The intermediate leads a group, which the relay kills when the caller
            // goes; the command dies with it (parent-death signal).
            .process_group(0);
        let spawn_error = |e: std::io::Error| {
            DriverError::InvalidConfig(format!("cannot start {program:?} in task {task_id}: {e}"))
        };
        let event = format!(
            "exec: {program} ({})",
            if tty {
                "with a terminal"
            } else {
                "no terminal"
            }
        );
        if tty {
            let pty =
                drover_plugin_sdk::exec::Pty::open(session.size).map_err(DriverError::internal)?;
            let slave = |p: &drover_plugin_sdk::exec::Pty| p.slave().map_err(DriverError::internal);
            cmd.stdin(slave(&pty)?)
                .stdout(slave(&pty)?)
                .stderr(slave(&pty)?);
            plan.apply(&mut cmd);
            let child = tokio::process::Command::from(cmd)
                // A call dropped (timed out, cancelled) takes the command with it.
                .kill_on_drop(true)
                .spawn()
                .map_err(spawn_error)?;
            self.event(task_id, event);
            drover_plugin_sdk::exec::relay_pty(pty, child, session).await
        } else {
            cmd.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            plan.apply(&mut cmd);
            let child = tokio::process::Command::from(cmd)
                // A call dropped (timed out, cancelled) takes the command with it.
                .kill_on_drop(true)
                .spawn()
                .map_err(spawn_error)?;
            self.event(task_id, event);
            drover_plugin_sdk::exec::relay_pipes(child, session).await
        }
    }

    async fn exec_task(
        &self,
        task_id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<drover_plugin_sdk::ExecOutput, DriverError> {
        // The interactive path with no input and no terminal, output kept up to the
        // limit (the rest is read and dropped, so the command never blocks on it).
        let (session, input, mut output) = ExecSession::channel(command, false, 16);
        drop(input);
        let (tx, keep_open) = tokio::sync::mpsc::channel::<drover_plugin_sdk::ExecInput>(1);
        let session = ExecSession {
            input: keep_open,
            ..session
        };
        let run = self.exec_task_streaming(task_id, session);
        let collect = async {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            while let Some(chunk) = output.recv().await {
                let (buf, data) = match chunk {
                    drover_plugin_sdk::ExecChunk::Stdout(d) => (&mut out, d),
                    drover_plugin_sdk::ExecChunk::Stderr(d) => (&mut err, d),
                    _ => continue,
                };
                let room = drover_plugin_sdk::EXEC_OUTPUT_LIMIT.saturating_sub(buf.len());
                buf.extend_from_slice(&data[..data.len().min(room)]);
            }
            (out, err)
        };
        match tokio::time::timeout(timeout, async { tokio::join!(run, collect) }).await {
            Ok((result, (out, err))) => {
                drop(tx);
                Ok(drover_plugin_sdk::ExecOutput::new(result?)
                    .with_stdout(out)
                    .with_stderr(err))
            }
            // Dropping the call drops the input's sender: the command is killed.
            Err(_) => Ok(drover_plugin_sdk::ExecOutput::new(
                ExitResult::signaled(Signal::KILL)
                    .with_err(format!("timed out after {timeout:?}: killed")),
            )),
        }
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: F::TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        let iso = self.flavor.isolation(&config);
        self.start(spec, iso, &config).await
    }

    async fn wait_task(&self, task_id: &str) -> Result<ExitResult, DriverError> {
        Ok(self.store.get(task_id)?.base.wait().await)
    }

    async fn stop_task(
        &self,
        task_id: &str,
        timeout: Duration,
        sig: Signal,
    ) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        if !task.base.begin_stop(&self.events, sig, timeout) {
            return Ok(()); // it has exited already
        }
        let exit = match &task.exec {
            Some(exec) if exec.executor_alive() => exec.stop(sig, timeout).await?,
            _ => self.stop_orphan(&task, sig, timeout).await,
        };
        record_exit(&self.events, &task, exit);
        Ok(())
    }

    async fn signal_task(&self, task_id: &str, sig: Signal) -> Result<(), DriverError> {
        let task = self.store.get(task_id)?;
        task.base.ensure_running()?;
        match &task.exec {
            // To the init's group: the init forwards it to the task's.
            Some(exec) if exec.executor_alive() => exec.signal(sig).await?,
            _ => {
                // Only the init proven by pidfd and start time: the pid alone may name
                // another process by now.
                let (pid, start_time, raw) = (task.state.pid, task.state.start_time, sig.as_raw());
                if pid == 0 {
                    return Err(DriverError::FailedPrecondition(format!(
                        "task {task_id} has no executor and no known init process to signal"
                    )));
                }
                let sent =
                    blocking(move || drover_executor::lost::signal_proven(pid, start_time, raw))
                        .await?
                        .map_err(|e| {
                            DriverError::FailedPrecondition(format!(
                                "task {task_id} has no executor, and its init {pid} cannot be \
                             signalled: {e}"
                            ))
                        })?;
                if !sent {
                    return Err(DriverError::FailedPrecondition(format!(
                        "task {task_id} has no executor, and its init {pid} has exited"
                    )));
                }
            }
        }
        self.event(task_id, format!("sent {sig}"));
        Ok(())
    }

    async fn destroy_task(&self, task_id: &str, force: bool) -> Result<(), DriverError> {
        let task = match self.store.get(task_id) {
            Ok(t) => t,
            Err(DriverError::NotFound(_)) if force => return self.destroy_unknown(task_id).await,
            Err(e) => return Err(e),
        };
        if task.base.running() && !force {
            return Err(DriverError::FailedPrecondition(format!(
                "task {task_id} is still running; stop it first or destroy it with force"
            )));
        }
        if let Some(exec) = &task.exec {
            // Kills the init's group if it still runs (with it the whole pid
            // namespace), and removes the executor's directory. An executor that died
            // meanwhile leaves the cgroup to do it.
            if let Err(e) = exec.destroy().await {
                tracing::warn!(
                    task = task_id,
                    "executor destroy failed, using the cgroup: {e}"
                );
            }
        }
        remove_cgroup(task.cgroup.clone()).await?;
        let dir = &task.state.executor_dir;
        if let Err(e) = std::fs::remove_dir_all(dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(DriverError::Internal(format!(
                "cannot remove {}: {e}",
                dir.display()
            )));
        }
        if task.base.running() {
            record_exit(
                &self.events,
                &task,
                ExitInfo {
                    result: ExitResult::signaled(Signal::KILL),
                    exited_at: SystemTime::now(),
                    killed_after_timeout: false,
                },
            );
        }
        self.store.remove(task_id);
        Ok(())
    }

    async fn inspect_task(&self, task_id: &str) -> Result<TaskStatus, DriverError> {
        Ok(self.store.get(task_id)?.status())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        let id = handle.spec.id.clone();
        if task::settle_start(&self.store, &id).await {
            return Ok(());
        }
        let mut state = self.recovery_state(&handle)?;
        let reservation = self.store.reserve(&id)?;
        let cg: Arc<dyn TaskCgroup> =
            Arc::from(cgroup::open_path(state.cgroup_version, &state.cgroup_path));
        let (exec, message) = match ExecutorHandle::connect(&state.executor_dir).await {
            Ok(exec) => {
                let info = exec.info();
                if info.task_id != id {
                    return Err(DriverError::InvalidConfig(format!(
                        "the executor in {} runs task {:?}, not {id:?}",
                        state.executor_dir.display(),
                        info.task_id
                    )));
                }
                state.pid = info.pid;
                state.executor_pid = info.executor_pid;
                state.start_time = info.start_time;
                let message = if info.running() {
                    format!("task recovered (init pid {})", info.pid)
                } else {
                    format!(
                        "task recovered (init pid {}); it had exited meanwhile",
                        info.pid
                    )
                };
                (Some(exec), message)
            }
            Err(DriverError::NotFound(why)) => {
                let probe = cg.clone();
                let (exists, pids) = blocking(move || (probe.exists(), probe.pids())).await?;
                if handle.driver_state.is_empty() && !exists {
                    // A probe by id: this task was never started here.
                    return Err(DriverError::NotFound(why));
                }
                let message = if pids.is_empty() {
                    format!("task recovered without its executor ({why}); it is gone")
                } else {
                    format!(
                        "task recovered without its executor ({why}); its processes {pids:?} \
                         are followed through cgroup {}",
                        state.cgroup_path
                    )
                };
                (None, message)
            }
            Err(e) => return Err(e),
        };
        let task = Arc::new(Task::new(
            id.clone(),
            handle.spec.name.clone(),
            exec,
            state,
            cg,
        ));
        reservation.commit(task.clone());
        self.watch(task);
        self.event(&id, message);
        Ok(())
    }

    async fn task_stats(&self, task_id: &str) -> Result<TaskStats, DriverError> {
        let task = self.store.get(task_id)?;
        blocking(move || task.stats()).await?
    }

    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        Some(self.events.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_mode_none_in_a_bridge_group_is_refused() {
        let none = IsolationConfig {
            network_mode: NetworkMode::None,
            ..IsolationConfig::default()
        };
        let bridged = TaskSpec::default().with_netns_path("/run/netns/a1");
        let err = check_network_mode(&bridged, &none).unwrap_err().to_string();
        assert!(
            err.contains("network_mode") && err.contains("bridge"),
            "{err}"
        );
        assert!(check_network_mode(&TaskSpec::default(), &none).is_ok());
        assert!(check_network_mode(&bridged, &IsolationConfig::default()).is_ok());
    }

    #[test]
    fn drover_dirs_point_inside_the_root() {
        let mut spec = TaskSpec::default().with_task_dir("/data/alloc/t1");
        for (k, v) in [
            ("DROVER_TASK_DIR", "/data/alloc/t1"),
            ("DROVER_LOCAL_DIR", "/data/alloc/t1/local"),
            ("OTHER", "/data/alloc/t1/local"),
        ] {
            spec.env.insert(k.into(), v.into());
        }
        let env = task_env(&spec);
        assert_eq!(env["DROVER_TASK_DIR"], "/");
        assert_eq!(env["DROVER_LOCAL_DIR"], "/local");
        assert_eq!(env["OTHER"], "/data/alloc/t1/local");
        assert_eq!(env["PATH"], DEFAULT_PATH);
    }

    #[test]
    fn memory_limits_from_resources() {
        let mut spec = TaskSpec::default();
        let iso = IsolationConfig::default();
        // Nothing given: the defaults, never "unlimited".
        let l = limits(&spec, &iso).unwrap();
        assert_eq!(l.memory, Some(DEFAULT_MEMORY_MB << 20));
        assert_eq!(l.cpu_shares, Some(DEFAULT_CPU_SHARES));
        assert_eq!(l.pids, Some(DEFAULT_PIDS_LIMIT));
        assert_eq!(l.memory_soft, None);
        spec.resources.memory_mb = 64;
        assert_eq!(limits(&spec, &iso).unwrap().memory, Some(64 << 20));
        spec.resources.memory_max_mb = 128;
        let l = limits(&spec, &iso).unwrap();
        assert_eq!((l.memory, l.memory_soft), (Some(128 << 20), Some(64 << 20)));
    }

    #[test]
    fn memory_too_large_for_bytes_is_refused_not_wrapped() {
        let mut spec = TaskSpec::default();
        let iso = IsolationConfig::default();
        // 2^44 MiB is 2^64 bytes: a shift wraps it to 0.
        spec.resources.memory_max_mb = 1 << 44;
        let e = limits(&spec, &iso).unwrap_err();
        assert!(matches!(e, DriverError::InvalidConfig(_)), "{e:?}");
        assert!(e.to_string().contains("memory_max_mb"), "{e}");
        spec.resources.memory_max_mb = 0;
        spec.resources.memory_mb = i64::MAX;
        let e = limits(&spec, &iso).unwrap_err();
        assert!(e.to_string().contains("memory_mb"), "{e}");
        spec.resources.memory_mb = (1 << 44) - 1;
        assert_eq!(
            limits(&spec, &iso).unwrap().memory,
            Some(((1u64 << 44) - 1) << 20)
        );
    }
}
