//! Task cgroups, through cgroups-rs, behind [`TaskCgroup`] with a v1 and a v2
//! implementation.
//!
//! The plugin creates a task's cgroup at `<cgroup_parent>/<task id>` in every
//! controller it uses, so that it can always be found again from the task id alone
//! (after the plugin, the executor or both were killed); the task's init joins it
//! before anything else, so every process of the task is in it. DestroyTask empties it
//! (freeze, SIGKILL every process, thaw — v1 has no `cgroup.kill`) and removes it.
//!
//! Plain (rawexec) tasks get one too where the host allows ([`plain_support`]): the
//! executor creates `drover-plain/<hash of its directory>` ([`plain_path`],
//! [`open_plain`]) and the task joins it between fork and exec, so that stopping and
//! destroying reach every process the task started, `setsid` or not.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::FreezerState;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::freezer::FreezerController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{Cgroup, MaxValue, hierarchies};
use serde::{Deserialize, Serialize};

/// Controllers a task cgroup uses on cgroup v1.
pub const V1_CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];
/// Controllers a task cgroup needs on cgroup v2 (the freezer is built in there).
pub const V2_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];
/// CFS period used with a CPU limit.
const CPU_PERIOD_US: u64 = 100_000;
/// Root of the unified hierarchy (cgroups-rs' v2 support is fixed to it).
const UNIFIED_ROOT: &str = "/sys/fs/cgroup";

/// Which cgroup hierarchy the machine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// One hierarchy per controller (`/sys/fs/cgroup/<controller>`).
    V1,
    /// The unified hierarchy at `/sys/fs/cgroup`.
    V2,
}

impl Version {
    /// What this machine has: v2 only when `/sys/fs/cgroup` itself is cgroup2 (a
    /// hybrid host with a cgroup2 mount at `/sys/fs/cgroup/unified` is v1 for us: its
    /// controllers are in the v1 hierarchies).
    pub fn detect() -> Self {
        if hierarchies::is_cgroup2_unified_mode() {
            Version::V2
        } else {
            Version::V1
        }
    }

    /// `v1` or `v2`.
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// Limits of one task.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Hard memory limit in bytes; reaching it OOM-kills.
    pub memory: Option<u64>,
    /// Soft memory limit (reclaimed first under pressure).
    pub memory_soft: Option<u64>,
    /// Relative CPU weight, in cgroup v1 shares (2…262144).
    pub cpu_shares: Option<u64>,
    /// CPU time limit in cores (0.5: half a core).
    pub cpu_cores: Option<f64>,
    /// Most processes and threads at once.
    pub pids: Option<u64>,
}

/// Resource usage read from a task cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Memory charged, page cache included.
    pub memory_usage: u64,
    /// Anonymous memory.
    pub rss: u64,
    /// Page cache.
    pub cache: u64,
    /// CPU time in user mode.
    pub cpu_user: Duration,
    /// CPU time in kernel mode.
    pub cpu_system: Duration,
    /// All CPU time.
    pub cpu_total: Duration,
    /// Processes and threads.
    pub pids: u64,
}

/// One task's cgroup.
pub trait TaskCgroup: Send + Sync + std::fmt::Debug {
    /// Its hierarchy.
    fn version(&self) -> Version;
    /// Its path below the hierarchy roots (`drover/web-1`).
    fn path(&self) -> &str;
    /// Create it with `limits`. On error nothing is left.
    fn create(&self, limits: &Limits) -> Result<(), String>;
    /// Whether it exists.
    fn exists(&self) -> bool;
    /// The files a single-threaded process writes `0` to, to join it (v1: each
    /// hierarchy's `tasks`; v2: `cgroup.procs`).
    fn procs_files(&self) -> Vec<PathBuf>;
    /// The processes in it.
    fn pids(&self) -> Vec<u32>;
    /// Its resource usage.
    fn usage(&self) -> Usage;
    /// How many times the OOM killer killed a process in it.
    fn oom_kills(&self) -> u64;
    /// SIGKILL every process in it, such that none can escape by forking meanwhile.
    fn kill_all(&self) -> Result<(), String>;
    /// Remove it (it must be empty).
    fn delete(&self) -> Result<(), String>;
}

/// The cgroup `<parent>/<task_id>` (parent like `/drover`).
pub fn open(version: Version, parent: &str, task_id: &str) -> Box<dyn TaskCgroup> {
    open_path(version, &format!("{}/{task_id}", parent.trim_matches('/')))
}

/// The cgroup at `path` below the hierarchy roots (as [`TaskCgroup::path`] gave it).
pub fn open_path(version: Version, path: &str) -> Box<dyn TaskCgroup> {
    let path = path.trim_matches('/').to_owned();
    match version {
        Version::V1 => Box::new(V1Cgroup::new(path, &V1_CONTROLLERS)),
        Version::V2 => Box::new(V2Cgroup::new(path, &V2_CONTROLLERS)),
    }
}

/// Root of cgroup v1's devices hierarchy.
const V1_DEVICES_ROOT: &str = "/sys/fs/cgroup/devices";

/// One rule of a v1 devices cgroup: `c 1:5 rw`.
///
/// ```
/// use drover_executor::cgroup::DeviceRule;
/// assert_eq!(DeviceRule::char(1, 5, "rw").to_string(), "c 1:5 rw");
/// assert_eq!(DeviceRule { block: true, major: 8, minor: 0, access: "r".into() }.to_string(), "b 8:0 r");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRule {
    /// A block device (else a character device).
    pub block: bool,
    /// Its major number.
    pub major: u32,
    /// Its minor number.
    pub minor: u32,
    /// Some of `r`, `w`, `m`.
    pub access: String,
}

impl DeviceRule {
    /// Character device `major:minor` with `access`.
    pub fn char(major: u32, minor: u32, access: &str) -> Self {
        DeviceRule {
            block: false,
            major,
            minor,
            access: access.to_owned(),
        }
    }
}

impl std::fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.block { 'b' } else { 'c' };
        write!(f, "{kind} {}:{} {}", self.major, self.minor, self.access)
    }
}

/// The nodes of an isolated task's minimal `/dev` (null, zero, full, random, urandom,
/// tty), read and write.
///
/// ```
/// assert_eq!(drover_executor::cgroup::minimal_dev_rules()[1].to_string(), "c 1:5 rw");
/// ```
pub fn minimal_dev_rules() -> Vec<DeviceRule> {
    [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0)]
        .into_iter()
        .map(|(major, minor)| DeviceRule::char(major, minor, "rw"))
        .collect()
}

/// On cgroup v1, give the task cgroup at `path` (as [`TaskCgroup::path`] says) a
/// devices cgroup that denies every device but `rules`; the task joins it with the
/// others ([`TaskCgroup::procs_files`]) and it is removed with them
/// ([`TaskCgroup::delete`]). Call it after [`TaskCgroup::create`], before the task
/// starts. On error nothing is left.
pub fn restrict_devices_v1(path: &str, rules: &[DeviceRule]) -> Result<(), String> {
    let dir = Path::new(V1_DEVICES_ROOT).join(path.trim_matches('/'));
    if !Path::new(V1_DEVICES_ROOT).join("devices.allow").exists() {
        return Err(format!(
            "the devices cgroup controller is not mounted at {V1_DEVICES_ROOT}: device rules \
             for {path} cannot be set"
        ));
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create devices cgroup {}: {e}", dir.display()))?;
    let write = |file: &str, rule: &str| {
        std::fs::write(dir.join(file), rule).map_err(|e| {
            format!(
                "devices cgroup {}: cannot write {rule:?} to {file}: {e}",
                dir.display()
            )
        })
    };
    let result = write("devices.deny", "a").and_then(|()| {
        rules
            .iter()
            .try_for_each(|r| write("devices.allow", &r.to_string()))
    });
    if result.is_err() {
        let _ = std::fs::remove_dir(&dir);
    }
    result
}

/// The devices cgroup [`restrict_devices_v1`] made for `path`, if it did.
fn v1_devices_dir(path: &str) -> Option<PathBuf> {
    let dir = Path::new(V1_DEVICES_ROOT).join(path);
    dir.join("tasks").exists().then_some(dir)
}

/// Controllers of a plain (rawexec) task's cgroup on v1: the freezer alone, which is
/// what emptying it needs (no limits are set, and every other controller would cost
/// start latency and kernel memory for nothing).
pub const PLAIN_V1_CONTROLLERS: [&str; 1] = ["freezer"];

/// Parent of plain tasks' cgroups, below the hierarchy roots.
pub const PLAIN_PARENT: &str = "drover-plain";

/// The cgroup of the plain task whose executor directory is `dir`:
/// `drover-plain/<16 hex of sha256(dir)>`. Derived from the directory alone, so that a
/// plugin finds it again after its executor died, and two agents on one host (each
/// with its own data dir) never share one for a task id they both use.
///
/// ```
/// let a = drover_executor::cgroup::plain_path(std::path::Path::new("/d/0123456789abcdef"));
/// assert!(a.starts_with("drover-plain/") && a.len() == "drover-plain/".len() + 16);
/// ```
pub fn plain_path(dir: &std::path::Path) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{PLAIN_PARENT}/{name}")
}

/// The cgroup of a plain task at `path` (from [`plain_path`]): only the freezer on v1,
/// no controllers on v2 (`cgroup.kill` and `cgroup.procs` are core files).
pub fn open_plain(version: Version, path: &str) -> Box<dyn TaskCgroup> {
    let path = path.trim_matches('/').to_owned();
    match version {
        Version::V1 => Box::new(V1Cgroup::new(path, &PLAIN_V1_CONTROLLERS)),
        Version::V2 => Box::new(V2Cgroup::new(path, &[])),
    }
}

/// Open files of a cgroup (v2 `cgroup.procs`, or each v1 hierarchy's `tasks`) that a
/// process about to start writes `0` to, to join it between fork and exec
/// ([`Join::before_exec`]): it is in the cgroup before it can fork anything, so nothing
/// it starts is ever outside it. Opened before the fork because opening a file is not
/// async-signal-safe (and may allocate) in the child.
#[derive(Debug, Default)]
pub struct Join(Vec<std::os::fd::OwnedFd>);

impl Join {
    /// Open the join files of `cg` for writing; the error names the file.
    pub fn open(cg: &dyn TaskCgroup) -> Result<Join, String> {
        let mut fds = Vec::new();
        for file in cg.procs_files() {
            // std opens with O_CLOEXEC: the files stay out of the started program.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .map_err(|e| format!("cannot open {} to join it: {e}", file.display()))?;
            fds.push(std::os::fd::OwnedFd::from(f));
        }
        Ok(Join(fds))
    }

    /// A join of already open files (tests).
    #[cfg(test)]
    pub(crate) fn from_files(files: Vec<std::os::fd::OwnedFd>) -> Join {
        Join(files)
    }

    /// The open join files, for a child started without `std::process::Command`.
    pub(crate) fn files(&self) -> &[std::os::fd::OwnedFd] {
        &self.0
    }

    /// Make `command`'s child join the cgroup before it execs; a failed join fails the
    /// spawn with that OS error. The descriptors move into `command` and close when it
    /// is dropped, so they stay open for every spawn of it.
    pub fn before_exec(self, command: &mut std::process::Command) {
        use std::os::unix::process::CommandExt as _;
        if self.0.is_empty() {
            return;
        }
        let fds = self.0;
        // SAFETY: the closure runs between fork and exec; it only calls write(2), which
        // is async-signal-safe, on descriptors the closure itself owns (so they are open
        // in the child), and allocates nothing (an error is a bare OS error code).
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                for fd in &fds {
                    rustix::io::write(fd, b"0").map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
    }
}

/// For a command started beside the plain task of executor directory `dir` (a
/// driver's `ExecTask`): the task's own cgroup to join, so that stopping and
/// destroying the task reach that command and everything it starts too. `Ok(None)`
/// when the task was started without a cgroup of its own
/// ([`crate::LaunchSpec::own_cgroup`] unset: `no_cgroups`, or a host without them).
/// An error when it had one that is gone (the task is no longer running), or when its
/// launch spec cannot be read: the command must then not run outside the task.
///
/// ```no_run
/// # fn f(executor_dir: &std::path::Path) -> Result<(), String> {
/// let mut cmd = std::process::Command::new("/bin/true");
/// if let Some(join) = drover_executor::cgroup::join_plain_task(executor_dir)? {
///     join.before_exec(&mut cmd); // the child joins the task's cgroup, then execs
/// }
/// let _ = cmd.spawn();
/// # Ok(()) }
/// ```
pub fn join_plain_task(dir: &std::path::Path) -> Result<Option<Join>, String> {
    let spec = crate::read_launch_spec(dir)?;
    if !spec.own_cgroup || spec.isolation.is_some() {
        return Ok(None);
    }
    let path = plain_path(dir);
    let version = plain_support().ok_or_else(|| {
        format!(
            "task {} runs in cgroup {path}, but this host offers rawexec no cgroups now",
            spec.task_id
        )
    })?;
    let cg = open_plain(version, &path);
    if !cg.exists() {
        return Err(format!(
            "the cgroup {path} of task {} is gone: the task is no longer running",
            spec.task_id
        ));
    }
    Join::open(&*cg).map(Some)
}

/// Remove the plain task cgroups under [`PLAIN_PARENT`] that are empty and older than
/// `min_age`, and return how many. An executor removes its task's cgroup once nothing of
/// the task is left, and a driver's destroy does; one whose executor and task were
/// killed from outside and that nobody destroyed stays behind empty. The age keeps
/// this away from a cgroup an executor just created and its task is about to join.
/// Best effort: errors are skipped.
pub fn sweep_plain(version: Version, min_age: Duration) -> usize {
    let parent = open_plain(version, PLAIN_PARENT);
    let Some(dir) = parent
        .procs_files()
        .first()
        .and_then(|f| f.parent().map(std::path::Path::to_owned))
    else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() != 16 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let old_enough = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if !old_enough {
            continue;
        }
        let cg = open_plain(version, &format!("{PLAIN_PARENT}/{name}"));
        if cg.pids().is_empty() && cg.delete().is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether plain tasks can get a cgroup here: the hierarchy this host uses, when it
/// has what [`open_plain`] needs (v1: a mounted freezer; v2: the unified hierarchy
/// writable by us). `None` leaves plain tasks to their process group.
pub fn plain_support() -> Option<Version> {
    let version = Version::detect();
    let usable = match version {
        Version::V1 => {
            let v1 = hierarchies::V1::new();
            cgroups_rs::fs::Hierarchy::subsystems(&v1)
                .iter()
                .any(|s| s.controller_name() == PLAIN_V1_CONTROLLERS[0])
        }
        Version::V2 => rustix::fs::access(UNIFIED_ROOT, rustix::fs::Access::WRITE_OK).is_ok(),
    };
    usable.then_some(version)
}

/// The v1 controllers that are not mounted (a task cgroup needs all of
/// [`V1_CONTROLLERS`]), or on v2 those not offered by the root.
pub fn missing_controllers(version: Version) -> Vec<&'static str> {
    match version {
        Version::V1 => {
            let v1 = hierarchies::V1::new();
            let mounted: Vec<String> = cgroups_rs::fs::Hierarchy::subsystems(&v1)
                .iter()
                .map(|s| s.controller_name())
                .collect();
            V1_CONTROLLERS
                .into_iter()
                .filter(|c| !mounted.iter().any(|m| m == c))
                .collect()
        }
        Version::V2 => {
            let offered = std::fs::read_to_string(format!("{UNIFIED_ROOT}/cgroup.controllers"))
                .unwrap_or_default();
            V2_CONTROLLERS
                .into_iter()
                .filter(|c| !offered.split_whitespace().any(|o| o == *c))
                .collect()
        }
    }
}

fn err(path: &str, what: &str) -> impl Fn(cgroups_rs::fs::error::Error) -> String {
    move |e| {
        let cause = std::error::Error::source(&e)
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        format!("cgroup {path}: cannot {what}: {e}{cause}")
    }
}

fn cgroup_pids(cg: &Cgroup) -> Vec<u32> {
    cg.procs()
        .into_iter()
        .filter_map(|p| u32::try_from(p.pid).ok())
        .collect()
}

fn sigkill(pids: &[u32]) {
    for &pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Freeze, SIGKILL all, thaw: a frozen process cannot fork, and the kill takes effect
/// at the thaw.
fn freeze_kill_thaw(freezer: &FreezerController, cg: &Cgroup, path: &str) -> Result<(), String> {
    freezer.freeze().map_err(err(path, "freeze"))?;
    // FREEZING until every task stopped; a task stuck in the kernel can hold it there,
    // and it is killed at the thaw anyway.
    let deadline = Instant::now() + Duration::from_secs(1);
    while !matches!(freezer.state(), Ok(FreezerState::Frozen)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    sigkill(&cgroup_pids(cg));
    freezer.thaw().map_err(err(path, "thaw"))
}

/// cgroup v1: one directory per controller.
#[derive(Debug)]
struct V1Cgroup {
    path: String,
    cg: Cgroup,
    /// How many controllers it was opened with (all must be mounted to create it).
    wanted: usize,
}

/// The cgroup v1 mounts as a spawner last read them, for the executors it forks (see
/// [`remember_v1_mounts`]); `None` in every other process, which reads
/// `/proc/self/mountinfo` for each cgroup it opens.
static V1_MOUNTS: std::sync::Mutex<Option<RememberedV1>> = std::sync::Mutex::new(None);

/// What a spawner read of the v1 mounts, and when.
struct RememberedV1 {
    read_at: std::time::Instant,
    mounts: hierarchies::V1,
    /// The freezer directory of [`PLAIN_PARENT`], where plain tasks' cgroups go
    /// ([`create_plain_v1_quickly`]); `None` without a freezer hierarchy.
    plain_freezer: Option<PathBuf>,
}

/// How long a remembered reading of the mounts is used: the spawner reads them every
/// second, and a spare forked with an older reading (it waited) reads its own.
const MOUNTS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Read the v1 mounts now and keep them for the cgroups this process (and every child it
/// forks from now on) opens: a spawner does this before it forks executors, and again
/// every second, so that a forked executor need not parse `mountinfo` on its way to
/// starting its task. A no-op on cgroup v2.
pub(crate) fn remember_v1_mounts() {
    if Version::detect() != Version::V1 {
        return;
    }
    let mounts = hierarchies::V1::new();
    // A reading without a single cgroup mount is a failed read (cgroups-rs reads an
    // unreadable mountinfo as empty): not kept, each executor reads for itself.
    let found = !cgroups_rs::fs::Hierarchy::subsystems(&mounts).is_empty();
    // Where cgroups-rs puts the freezer of `drover-plain` with these mounts: the fast
    // path makes plain cgroups exactly where the slow one would.
    let plain_freezer = found
        .then(|| {
            let parent = Cgroup::load_with_specified_controllers(
                Box::new(mounts.clone()),
                PLAIN_PARENT,
                PLAIN_V1_CONTROLLERS.map(str::to_owned).to_vec(),
            );
            parent
                .subsystems()
                .first()
                .map(|s| s.to_controller().path().to_owned())
        })
        .flatten();
    *V1_MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = found.then(|| RememberedV1 {
        read_at: std::time::Instant::now(),
        mounts,
        plain_freezer,
    });
}

/// Drop the remembered mounts: an executor does once its task is in its cgroups, so
/// that what it opens later (stats, the kill) reads the mounts of the moment.
pub(crate) fn forget_v1_mounts() {
    *V1_MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
}

/// The v1 mounts: remembered ones less than [`MOUNTS_FRESH_FOR`] old, else read now.
fn v1_mounts() -> hierarchies::V1 {
    let remembered = V1_MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .filter(|r| r.read_at.elapsed() < MOUNTS_FRESH_FOR)
        .map(|r| r.mounts.clone());
    // `V1::default()` reads mountinfo, as `V1::new()` does.
    remembered.unwrap_or_default()
}

/// Make the plain task cgroup `path` (from [`plain_path`]) the short way, in an
/// executor forked by a spawner that remembered the v1 mounts: one `mkdir` of its
/// freezer directory and an `open` of its `tasks` file, where the general path
/// (cgroups-rs) looks the cgroup up in every hierarchy, checks it is not there and
/// creates it (over a third of an executor's start, measured with `perf`). The
/// cgroups-rs view of it is built the first time anything else is asked of it (its
/// processes, the kill at the end). `None` where the short way does not apply: no
/// remembered mounts (cgroup v2, an executor that was executed, not forked), or a
/// directory that already exists or whose parent does not (the general path deals
/// with a stale cgroup and makes the parent).
pub(crate) fn create_plain_v1_quickly(path: &str) -> Option<Result<MadeCgroup, String>> {
    let (parent, mounts) = V1_MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .filter(|r| r.read_at.elapsed() < MOUNTS_FRESH_FOR)
        .and_then(|r| Some((r.plain_freezer.clone()?, r.mounts.clone())))?;
    let name = path.strip_prefix(PLAIN_PARENT)?.strip_prefix('/')?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let dir = parent.join(name);
    match rustix::fs::mkdir(&dir, rustix::fs::Mode::from_raw_mode(0o755)) {
        Ok(()) => {}
        Err(_) => return None,
    }
    let cg = LazyV1Cgroup {
        path: path.to_owned(),
        mounts: std::sync::Mutex::new(Some(mounts)),
        cg: std::sync::OnceLock::new(),
    };
    let tasks = dir.join("tasks");
    let join = match std::fs::OpenOptions::new().write(true).open(&tasks) {
        Ok(f) => Join(vec![std::os::fd::OwnedFd::from(f)]),
        Err(e) => {
            let _ = std::fs::remove_dir(&dir);
            return Some(Err(format!(
                "cannot open {} to join it: {e}",
                tasks.display()
            )));
        }
    };
    Some(Ok((Box::new(cg), join)))
}

/// A task's cgroup, and the files its process writes to join it.
pub(crate) type MadeCgroup = (Box<dyn TaskCgroup>, Join);

/// A plain task's v1 cgroup made by [`create_plain_v1_quickly`]: its cgroups-rs view
/// ([`V1Cgroup`]) made when first needed.
///
/// The view is built from the mounts read before the task started (kept here), never
/// from a reading made later, while the task runs: a reading that failed then (the
/// task can exhaust memory or descriptors) would give a view without the freezer,
/// and the kill at the end would reach nothing.
#[derive(Debug)]
struct LazyV1Cgroup {
    path: String,
    mounts: std::sync::Mutex<Option<hierarchies::V1>>,
    cg: std::sync::OnceLock<V1Cgroup>,
}

impl LazyV1Cgroup {
    fn get(&self) -> &V1Cgroup {
        self.cg.get_or_init(|| {
            let mounts = self
                .mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
                .unwrap_or_default();
            V1Cgroup::with_mounts(self.path.clone(), &PLAIN_V1_CONTROLLERS, mounts)
        })
    }
}

impl TaskCgroup for LazyV1Cgroup {
    fn version(&self) -> Version {
        Version::V1
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn create(&self, limits: &Limits) -> Result<(), String> {
        self.get().create(limits)
    }
    fn exists(&self) -> bool {
        self.get().exists()
    }
    fn procs_files(&self) -> Vec<PathBuf> {
        self.get().procs_files()
    }
    fn pids(&self) -> Vec<u32> {
        self.get().pids()
    }
    fn usage(&self) -> Usage {
        self.get().usage()
    }
    fn oom_kills(&self) -> u64 {
        self.get().oom_kills()
    }
    fn kill_all(&self) -> Result<(), String> {
        self.get().kill_all()
    }
    fn delete(&self) -> Result<(), String> {
        self.get().delete()
    }
}

impl V1Cgroup {
    fn new(path: String, controllers: &[&str]) -> Self {
        Self::with_mounts(path, controllers, v1_mounts())
    }

    fn with_mounts(path: String, controllers: &[&str], mounts: hierarchies::V1) -> Self {
        let cg = Cgroup::load_with_specified_controllers(
            Box::new(mounts),
            &path,
            controllers.iter().map(|c| (*c).to_owned()).collect(),
        );
        V1Cgroup {
            path,
            cg,
            wanted: controllers.len(),
        }
    }

    fn apply(&self, l: &Limits) -> Result<(), String> {
        let p = &self.path;
        let missing = |c: &str| format!("cgroup {p}: the {c} controller is not mounted");
        // A controller is looked up only for a limit it sets: a plain task's cgroup
        // (the freezer alone) has no limits.
        let mem = || -> Result<&MemController, String> {
            self.cg.controller_of().ok_or_else(|| missing("memory"))
        };
        let cpu = || -> Result<&CpuController, String> {
            self.cg.controller_of().ok_or_else(|| missing("cpu"))
        };
        if let Some(bytes) = l.memory {
            let mem = mem()?;
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            mem.set_limit(bytes)
                .map_err(err(p, "set memory.limit_in_bytes"))?;
            // With swap, memory+swap too: the task must be OOM-killed at the limit
            // rather than swap. Without swap accounting the file does not exist.
            if self.cg.subsystems().iter().any(|s| {
                s.to_controller()
                    .path()
                    .join("memory.memsw.limit_in_bytes")
                    .exists()
            }) {
                mem.set_memswap_limit(bytes)
                    .map_err(err(p, "set memory.memsw.limit_in_bytes"))?;
            }
        }
        if let Some(bytes) = l.memory_soft {
            mem()?
                .set_soft_limit(i64::try_from(bytes).unwrap_or(i64::MAX))
                .map_err(err(p, "set memory.soft_limit_in_bytes"))?;
        }
        if let Some(shares) = l.cpu_shares {
            cpu()?
                .set_shares(shares.clamp(2, 262_144))
                .map_err(err(p, "set cpu.shares"))?;
        }
        if let Some(cores) = l.cpu_cores {
            let cpu = cpu()?;
            cpu.set_cfs_period(CPU_PERIOD_US)
                .map_err(err(p, "set cpu.cfs_period_us"))?;
            cpu.set_cfs_quota(quota_us(cores))
                .map_err(err(p, "set cpu.cfs_quota_us"))?;
        }
        if let Some(max) = l.pids {
            let pids: &PidController = self.cg.controller_of().ok_or_else(|| missing("pids"))?;
            pids.set_pid_max(MaxValue::Value(i64::try_from(max).unwrap_or(i64::MAX)))
                .map_err(err(p, "set pids.max"))?;
        }
        Ok(())
    }
}

/// The v2 `cpu.weight` (1…10000, default 100) for v1 `cpu.shares` (2…262144, default
/// 1024), such that the defaults match: a task given v1's default share competes as an
/// equal with the other cgroups (all at weight 100) on v2 too. The linear mapping of
/// 2…262144 onto 1…10000 (runc before 1.3) put 1024 shares at weight 39 and the
/// default 100 shares of a task at 4, a quarter of their v1 share against a sibling.
/// This curve is a parabola in log space through (2, 1), (1024, 100) and
/// (262144, 10000), as runc 1.3 and crun now convert.
fn shares_to_weight(shares: u64) -> u64 {
    let l = (shares.clamp(2, 262_144) as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    let weight = 10f64.powf(exponent);
    // Where the curve meets a whole number (the three points above) float error must
    // not push it to the next one.
    let weight = if (weight - weight.round()).abs() < 1e-6 {
        weight.round()
    } else {
        weight.ceil()
    };
    (weight as u64).clamp(1, 10_000)
}

fn quota_us(cores: f64) -> i64 {
    // At least 1 ms per period: the kernel's minimum.
    ((cores * CPU_PERIOD_US as f64).round() as i64).max(1000)
}

impl TaskCgroup for V1Cgroup {
    fn version(&self) -> Version {
        Version::V1
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn create(&self, limits: &Limits) -> Result<(), String> {
        if self.cg.subsystems().len() < self.wanted {
            return Err(format!(
                "cgroup {}: the controllers it needs are not all mounted (found {:?})",
                self.path,
                self.cg
                    .subsystems()
                    .iter()
                    .map(|s| s.controller_name())
                    .collect::<Vec<_>>()
            ));
        }
        self.cg.create().map_err(err(&self.path, "create"))?;
        self.apply(limits).inspect_err(|_| {
            let _ = self.cg.delete();
        })
    }

    fn exists(&self) -> bool {
        self.cg.exists()
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        // `tasks`, not `cgroup.procs`: the task's init is single-threaded, so moving
        // its one thread moves the process, and the kernel then skips the global
        // threadgroup lock whose write side waits for an RCU grace period (10 ms and
        // more on a busy machine, the bulk of an isolated start otherwise).
        let mut files: Vec<PathBuf> = self
            .cg
            .subsystems()
            .iter()
            .map(|s| s.to_controller().path().join("tasks"))
            .collect();
        if let Some(dir) = v1_devices_dir(&self.path) {
            files.push(dir.join("tasks"));
        }
        files
    }

    fn pids(&self) -> Vec<u32> {
        cgroup_pids(&self.cg)
    }

    fn usage(&self) -> Usage {
        let mut u = Usage::default();
        if let Some(mem) = self.cg.controller_of::<MemController>() {
            let m = mem.memory_stat();
            u.memory_usage = m.usage_in_bytes;
            u.rss = m.stat.total_rss;
            u.cache = m.stat.total_cache;
        }
        if let Some(acct) = self.cg.controller_of::<CpuAcctController>() {
            let a = acct.cpuacct();
            u.cpu_total = Duration::from_nanos(a.usage);
            u.cpu_user = Duration::from_nanos(a.usage_user);
            u.cpu_system = Duration::from_nanos(a.usage_sys);
        }
        if let Some(pids) = self.cg.controller_of::<PidController>() {
            u.pids = pids.get_pid_current().unwrap_or(0);
        }
        u
    }

    fn oom_kills(&self) -> u64 {
        self.cg
            .controller_of::<MemController>()
            .map_or(0, |m| m.memory_stat().oom_control.oom_kill)
    }

    fn kill_all(&self) -> Result<(), String> {
        match self.cg.controller_of::<FreezerController>() {
            Some(f) => freeze_kill_thaw(f, &self.cg, &self.path),
            None => {
                sigkill(&self.pids());
                Ok(())
            }
        }
    }

    fn delete(&self) -> Result<(), String> {
        self.cg.delete().map_err(err(&self.path, "remove"))?;
        if let Some(dir) = v1_devices_dir(&self.path) {
            std::fs::remove_dir(&dir)
                .map_err(|e| format!("cannot remove devices cgroup {}: {e}", dir.display()))?;
        }
        Ok(())
    }
}

/// cgroup v2: one directory in the unified hierarchy.
#[derive(Debug)]
struct V2Cgroup {
    path: String,
    cg: Cgroup,
    /// Whether it has controllers (a plain task's has none).
    controlled: bool,
}

impl V2Cgroup {
    fn new(path: String, controllers: &[&str]) -> Self {
        let cg = Cgroup::load_with_specified_controllers(
            Box::new(hierarchies::V2::new()),
            &path,
            controllers.iter().map(|c| (*c).to_owned()).collect(),
        );
        V2Cgroup {
            path,
            cg,
            controlled: !controllers.is_empty(),
        }
    }

    /// v2's "no internal processes" rule: below the root, a cgroup that holds
    /// processes cannot give controllers to its children (the kernel answers `EBUSY`),
    /// so a task cgroup with controllers cannot be made below one. Said before trying,
    /// naming that cgroup: typically a parent inside the agent's own service cgroup.
    fn check_ancestors_hold_no_processes(&self) -> Result<(), String> {
        let root = Path::new(UNIFIED_ROOT);
        let dir = self.dir();
        for ancestor in dir.ancestors().skip(1) {
            if ancestor == root || !ancestor.starts_with(root) {
                break;
            }
            let procs = std::fs::read_to_string(ancestor.join("cgroup.procs")).unwrap_or_default();
            if let Some(pid) = procs.split_whitespace().next() {
                return Err(format!(
                    "cgroup {}: its parent cgroup {} holds processes (pid {pid} among them), \
                     and on cgroup v2 a cgroup with processes cannot give its children the \
                     memory, cpu and pids controllers: choose a cgroup_parent outside any \
                     cgroup that processes run in (the default /drover is)",
                    self.path,
                    ancestor.display()
                ));
            }
        }
        Ok(())
    }

    fn dir(&self) -> PathBuf {
        PathBuf::from(UNIFIED_ROOT).join(&self.path)
    }

    /// `key value` lines of a file in the cgroup.
    fn keyed(&self, file: &str, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir().join(file)).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// v2's freezer by its files: `1` to `cgroup.freeze`, until `cgroup.events` says
    /// `frozen 1`; SIGKILL every process; `0` (the kills take effect at the thaw). Without
    /// `cgroup.freeze` (kernels before 5.2) the processes are SIGKILLed unfrozen, and
    /// [`empty_and_remove`] repeats it until none is left.
    fn freeze_kill_thaw(&self) -> Result<(), String> {
        let freeze = self.dir().join("cgroup.freeze");
        if !freeze.exists() {
            sigkill(&self.pids());
            return Ok(());
        }
        let write = |value: &str| {
            std::fs::write(&freeze, value)
                .map_err(|e| format!("cgroup {}: cannot write cgroup.freeze: {e}", self.path))
        };
        write("1")?;
        // A task stuck in the kernel can keep it from freezing; it is killed at the thaw
        // anyway.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.keyed("cgroup.events", "frozen") != Some(1) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        sigkill(&self.pids());
        write("0")
    }

    fn apply(&self, l: &Limits) -> Result<(), String> {
        let p = &self.path;
        let missing = |c: &str| format!("cgroup {p}: the {c} controller is not enabled");
        let mem = || -> Result<&MemController, String> {
            self.cg.controller_of().ok_or_else(|| missing("memory"))
        };
        let cpu = || -> Result<&CpuController, String> {
            self.cg.controller_of().ok_or_else(|| missing("cpu"))
        };
        if let Some(bytes) = l.memory {
            let mem = mem()?;
            mem.set_limit(i64::try_from(bytes).unwrap_or(i64::MAX))
                .map_err(err(p, "set memory.max"))?;
            // No swapping past the limit either; absent without swap accounting.
            if self.dir().join("memory.swap.max").exists() {
                mem.set_memswap_limit(0)
                    .map_err(err(p, "set memory.swap.max"))?;
            }
        }
        if let Some(bytes) = l.memory_soft {
            mem()?
                .set_soft_limit(i64::try_from(bytes).unwrap_or(i64::MAX))
                .map_err(err(p, "set memory.low"))?;
        }
        if let Some(shares) = l.cpu_shares {
            cpu()?
                .set_shares(shares_to_weight(shares))
                .map_err(err(p, "set cpu.weight"))?;
        }
        if let Some(cores) = l.cpu_cores {
            cpu()?
                .set_cfs_quota_and_period(Some(quota_us(cores)), Some(CPU_PERIOD_US))
                .map_err(err(p, "set cpu.max"))?;
        }
        if let Some(max) = l.pids {
            let pids: &PidController = self.cg.controller_of().ok_or_else(|| missing("pids"))?;
            pids.set_pid_max(MaxValue::Value(i64::try_from(max).unwrap_or(i64::MAX)))
                .map_err(err(p, "set pids.max"))?;
        }
        Ok(())
    }
}

impl TaskCgroup for V2Cgroup {
    fn version(&self) -> Version {
        Version::V2
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn create(&self, limits: &Limits) -> Result<(), String> {
        if self.controlled {
            self.check_ancestors_hold_no_processes()?;
        }
        self.cg.create().map_err(err(&self.path, "create"))?;
        self.apply(limits).inspect_err(|_| {
            let _ = self.cg.delete();
        })
    }

    fn exists(&self) -> bool {
        self.dir().is_dir()
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        vec![self.dir().join("cgroup.procs")]
    }

    fn pids(&self) -> Vec<u32> {
        cgroup_pids(&self.cg)
    }

    fn usage(&self) -> Usage {
        let micros = |k: &str| Duration::from_micros(self.keyed("cpu.stat", k).unwrap_or(0));
        let current = std::fs::read_to_string(self.dir().join("memory.current"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        Usage {
            memory_usage: current,
            rss: self.keyed("memory.stat", "anon").unwrap_or(0),
            cache: self.keyed("memory.stat", "file").unwrap_or(0),
            cpu_user: micros("user_usec"),
            cpu_system: micros("system_usec"),
            cpu_total: micros("usage_usec"),
            pids: self
                .cg
                .controller_of::<PidController>()
                .and_then(|p| p.get_pid_current().ok())
                .unwrap_or(0),
        }
    }

    fn oom_kills(&self) -> u64 {
        self.keyed("memory.events", "oom_kill").unwrap_or(0)
    }

    fn kill_all(&self) -> Result<(), String> {
        if self.dir().join("cgroup.kill").exists() {
            return self.cg.kill().map_err(err(&self.path, "write cgroup.kill"));
        }
        // Kernels before 5.14 (Debian 11's 5.10) have no cgroup.kill: the freezer does
        // it. It is no controller on v2 (the core file `cgroup.freeze`), so cgroups-rs,
        // opened with this cgroup's controllers, offers none.
        self.freeze_kill_thaw()
    }

    fn delete(&self) -> Result<(), String> {
        self.cg.delete().map_err(err(&self.path, "remove"))
    }
}

/// Kill everything in `cg` and remove it, within `limit`. Blocking (a few
/// milliseconds normally): call it from `spawn_blocking`.
pub fn empty_and_remove(cg: &dyn TaskCgroup, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if !cg.exists() {
            return Ok(());
        }
        let pids = cg.pids();
        let last = Instant::now() >= deadline;
        if pids.is_empty() {
            match cg.delete() {
                Ok(()) => return Ok(()),
                Err(e) if last => return Err(e),
                Err(_) => {}
            }
        } else if last {
            return Err(format!(
                "cgroup {} still holds processes {pids:?} after {limit:?} of SIGKILL",
                cg.path()
            ));
        } else {
            cg.kill_all()?;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_convert_to_weights_with_the_defaults_matching() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 100);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(100), 17);
        // Out of range is clamped, and more shares never weigh less.
        assert_eq!(shares_to_weight(0), 1);
        assert_eq!(shares_to_weight(u64::MAX), 10_000);
        let weights: Vec<u64> = (2..=262_144).step_by(97).map(shares_to_weight).collect();
        assert!(weights.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn quota_is_per_period_with_a_floor() {
        assert_eq!(quota_us(0.5), 50_000);
        assert_eq!(quota_us(2.0), 200_000);
        assert_eq!(quota_us(0.001), 1000);
    }

    #[test]
    fn sweeping_removes_old_empty_task_cgroups_only() {
        let Some(version) = plain_support() else {
            assert!(std::env::var_os("CI").is_none(), "CI needs cgroups");
            eprintln!("skipped: no cgroups for plain tasks here");
            return;
        };
        let unique = format!("{:016x}", u64::from(std::process::id()) << 20 | 0xabcde);
        let old = open_plain(version, &format!("{PLAIN_PARENT}/{unique}"));
        let fresh_name = format!("{:016x}", u64::from(std::process::id()) << 20 | 0xfedcb);
        let fresh = open_plain(version, &format!("{PLAIN_PARENT}/{fresh_name}"));
        old.create(&Limits::default()).unwrap();
        fresh.create(&Limits::default()).unwrap();
        let dir = old.procs_files()[0].parent().unwrap().to_owned();
        let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
        assert!(sweep_plain(version, Duration::from_secs(3600)) >= 1);
        assert!(!old.exists(), "an old empty task cgroup was kept");
        assert!(
            fresh.exists(),
            "a fresh one (its task may be about to join) went"
        );
        fresh.delete().unwrap();
    }

    /// The freezer path of v2's kill, for kernels without `cgroup.kill` (5.2 to
    /// 5.13): a shell forking as fast as it can is emptied, nothing escapes. Needs a
    /// cgroup v2 host: `plugins/exec/tests/cgroup_v2_guest.rs` runs it in one.
    #[test]
    fn v2_freezer_kill_empties_a_forking_cgroup() {
        if Version::detect() != Version::V2 || !rustix::process::geteuid().is_root() {
            assert!(
                std::env::var_os("DROVER_TEST_EXEC_CGROUPS").is_none(),
                "the cgroup v2 guest must run this test"
            );
            eprintln!("not a cgroup v2 host as root: run in the cgroup v2 guest instead");
            return;
        }
        let path = format!("drover-test-freezer-{}", std::process::id());
        let cg = V2Cgroup::new(path.clone(), &V2_CONTROLLERS);
        cg.create(&Limits {
            pids: Some(64),
            ..Limits::default()
        })
        .unwrap();
        // bash, unlike dash, goes on forking when a fork fails at the pids limit.
        let mut cmd = std::process::Command::new("/bin/bash");
        cmd.args(["-c", "while :; do sleep 100 & done"]);
        Join::open(&cg).unwrap().before_exec(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while cg.pids().len() < 20 {
            assert!(
                Instant::now() < deadline,
                "it never forked: {:?}",
                cg.pids()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        cg.freeze_kill_thaw().unwrap();
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cg.pids().is_empty() {
            assert!(
                Instant::now() < deadline,
                "left after one freeze-kill-thaw: {:?}",
                cg.pids()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(cg.keyed("cgroup.events", "frozen"), Some(0), "left frozen");
        cg.delete().unwrap();
    }

    #[test]
    fn paths_are_parent_and_id() {
        let cg = open(Version::V1, "/drover/", "web-1");
        assert_eq!(cg.path(), "drover/web-1");
        let cg = open(Version::V2, "drover", "web-1");
        assert_eq!(
            cg.procs_files(),
            [PathBuf::from("/sys/fs/cgroup/drover/web-1/cgroup.procs")]
        );
    }
}
