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
/// Upper bound for anything that should happen "at once". A deadline, not a wait:
/// generous because these tests also run in the cgroup v2 guest, an emulated (TCG)
/// machine where a task start under load took more than 15 s.
pub const PROMPT: Duration = Duration::from_secs(60);
/// Controllers whose directories a v1 task cgroup has. On v2 a task cgroup is one
/// directory, and [`Plugin::cgroup_dir`] gives it for every controller name.
pub const CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

/// The cgroup hierarchy of this machine as the tests see it: found from the mount
/// table, not from the driver, so that the tests can check the driver's own finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cgroups {
    /// One hierarchy per controller under `/sys/fs/cgroup/<controller>`.
    V1,
    /// `/sys/fs/cgroup` itself is cgroup2: the unified hierarchy, nothing else.
    V2,
}

impl Cgroups {
    /// `v1` or `v2`, as the driver's `driver.exec.cgroup_version` attribute says it.
    pub fn name(self) -> &'static str {
        match self {
            Cgroups::V1 => "v1",
            Cgroups::V2 => "v2",
        }
    }
}

/// This machine's cgroup hierarchy: v2 when `/sys/fs/cgroup` is a cgroup2 mount.
pub fn cgroups() -> Cgroups {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_else(|e| panic!("/proc/self/mountinfo: {e}"));
    // Fields: id parent major:minor root mount-point options ... - fstype source ...
    let unified = mountinfo.lines().any(|l| {
        l.split(' ').nth(4) == Some("/sys/fs/cgroup")
            && l.split_once(" - ")
                .is_some_and(|(_, rest)| rest.starts_with("cgroup2 "))
    });
    if unified { Cgroups::V2 } else { Cgroups::V1 }
}

/// Set by the cgroup v2 guest run (`cgroup_v2_guest.rs`) to `v1` or `v2`: the tests
/// must find that hierarchy and must not skip.
pub const EXPECT_CGROUPS: &str = "DROVER_TEST_EXEC_CGROUPS";

/// Whether the isolation tests can run here: as root. Under `CI=true` they must:
/// a missing prerequisite fails the test instead of skipping it. With
/// `$DROVER_TEST_EXEC_CGROUPS` set, the machine must also have that cgroup hierarchy.
pub fn isolation_possible() -> bool {
    if let Ok(expected) = std::env::var(EXPECT_CGROUPS) {
        assert_eq!(
            cgroups().name(),
            expected,
            "{EXPECT_CGROUPS}={expected}, but /sys/fs/cgroup says otherwise"
        );
        assert!(
            rustix::process::geteuid().is_root(),
            "{EXPECT_CGROUPS} is set and the exec tests need root"
        );
    }
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
    /// The first fingerprint the plugin sends.
    pub async fn first_fingerprint(&self) -> drover_plugin_sdk::Fingerprint {
        let mut stream = within(PROMPT, "fingerprint", self.client.fingerprint())
            .await
            .unwrap();
        within(
            PROMPT,
            "first fingerprint",
            tokio_stream::StreamExt::next(&mut stream),
        )
        .await
        .unwrap()
        .unwrap()
    }

    /// Launch the plugin with plugin config `config` (a JSON object; a
    /// `cgroup_parent` is added).
    pub async fn launch(dir: &Path, config: Value) -> Plugin {
        let parent = unique_parent();
        Self::launch_with(dir, config, parent).await
    }

    /// Launch the plugin with `cgroup_parent` set to `/<parent>` (below the hierarchy
    /// roots); on drop it removes that cgroup tree as with [`Plugin::launch`].
    pub async fn launch_below(dir: &Path, config: Value, parent: String) -> Plugin {
        Self::launch_with(dir, config, parent).await
    }

    /// Launch another plugin process on the same directory and cgroup parent (after
    /// the first was killed).
    pub async fn relaunch(&self) -> Plugin {
        Self::launch_with(&self.dir, self.config.clone(), self.parent.clone()).await
    }

    async fn launch_with(dir: &Path, mut config: Value, parent: String) -> Plugin {
        config["cgroup_parent"] = json!(format!("/{parent}"));
        let mut options = LaunchOptions::new("exec", BIN);
        // These tests also run in the cgroup v2 guest, under TCG emulation on a loaded
        // machine, where a launch has been seen to take nearly the default 5 s; what
        // they check is the driver, not launch speed (drover-bench measures that).
        options.handshake_timeout = PROMPT;
        let process = within(PROMPT, "launch", PluginProcess::launch(options))
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

    /// The directory of task `id`'s cgroup in `controller` (v1), or its one directory
    /// in the unified hierarchy (v2, whatever `controller` says).
    pub fn cgroup_dir(&self, controller: &str, id: &str) -> PathBuf {
        let root = Path::new("/sys/fs/cgroup");
        match cgroups() {
            Cgroups::V1 => root.join(controller).join(&self.parent).join(id),
            Cgroups::V2 => root.join(&self.parent).join(id),
        }
    }

    /// The cgroup files of task `id`, by what they mean rather than by name.
    pub fn cgroup(&self, id: &str) -> TaskCgroup<'_> {
        TaskCgroup {
            plugin: self,
            id: id.to_owned(),
            version: cgroups(),
        }
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
        drover_test_support::remove_plugin_socket_dir(&self.process.handshake().addr);
        remove_cgroup_tree(&self.parent);
    }
}

/// A task's cgroup, read through the files of this machine's hierarchy: what the
/// tests check (the memory, CPU and pids limits, usage, OOM kills) has other file
/// names and formats on v1 and v2.
pub struct TaskCgroup<'a> {
    plugin: &'a Plugin,
    id: String,
    /// The hierarchy the files are read from.
    pub version: Cgroups,
}

fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn parse_u64(path: &Path, text: &str) -> u64 {
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {text:?} is not a number: {e}", path.display()))
}

/// The value of `key` in a file of `key value` lines (`memory.events`, `cpu.stat`).
fn keyed(path: &Path, key: &str) -> u64 {
    let text = read_trimmed(path);
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {key} in {}:\n{text}", path.display()));
    parse_u64(path, value.trim())
}

impl TaskCgroup<'_> {
    fn file(&self, v1_controller: &str, name: &str) -> PathBuf {
        self.plugin.cgroup_dir(v1_controller, &self.id).join(name)
    }

    fn number(&self, v1_controller: &str, name: &str) -> u64 {
        let path = self.file(v1_controller, name);
        parse_u64(&path, &read_trimmed(&path))
    }

    /// The hard memory limit in bytes (v1 `memory.limit_in_bytes`, v2 `memory.max`).
    pub fn memory_max(&self) -> u64 {
        match self.version {
            Cgroups::V1 => self.number("memory", "memory.limit_in_bytes"),
            Cgroups::V2 => self.number("memory", "memory.max"),
        }
    }

    /// The memory reservation in bytes (v1 `memory.soft_limit_in_bytes`, v2
    /// `memory.low`).
    pub fn memory_reservation(&self) -> u64 {
        match self.version {
            Cgroups::V1 => self.number("memory", "memory.soft_limit_in_bytes"),
            Cgroups::V2 => self.number("memory", "memory.low"),
        }
    }

    /// Swap its processes may use beyond the memory limit (v1: `memory.memsw.limit_in_bytes`
    /// minus the limit; v2: `memory.swap.max`); `None` without swap accounting.
    pub fn swap_past_the_limit(&self) -> Option<u64> {
        let file = match self.version {
            Cgroups::V1 => self.file("memory", "memory.memsw.limit_in_bytes"),
            Cgroups::V2 => self.file("memory", "memory.swap.max"),
        };
        if !file.exists() {
            return None;
        }
        let value = parse_u64(&file, &read_trimmed(&file));
        Some(match self.version {
            Cgroups::V1 => value.saturating_sub(self.memory_max()),
            Cgroups::V2 => value,
        })
    }

    /// How many processes the OOM killer killed in it (v1 `memory.oom_control`, v2
    /// `memory.events`: `oom_kill N` in both).
    pub fn oom_kills(&self) -> u64 {
        match self.version {
            Cgroups::V1 => keyed(&self.file("memory", "memory.oom_control"), "oom_kill"),
            Cgroups::V2 => keyed(&self.file("memory", "memory.events"), "oom_kill"),
        }
    }

    /// `pids.max` (the same file on v1 and v2).
    pub fn pids_max(&self) -> String {
        read_trimmed(&self.file("pids", "pids.max"))
    }

    /// Processes and threads in it now: `pids.current`.
    pub fn pids_current(&self) -> u64 {
        self.number("pids", "pids.current")
    }

    /// Forks refused at the limit: `max N` of `pids.events`.
    pub fn pids_refused(&self) -> u64 {
        keyed(&self.file("pids", "pids.events"), "max")
    }

    /// The `cgroup.procs` file that lists its processes.
    pub fn procs_file(&self) -> PathBuf {
        self.file("pids", "cgroup.procs")
    }

    /// The CPU quota as (quota, period) in microseconds (v1 `cpu.cfs_quota_us` and
    /// `cpu.cfs_period_us`, v2 `cpu.max`).
    pub fn cpu_quota(&self) -> (u64, u64) {
        match self.version {
            Cgroups::V1 => (
                self.number("cpu", "cpu.cfs_quota_us"),
                self.number("cpu", "cpu.cfs_period_us"),
            ),
            Cgroups::V2 => {
                let path = self.file("cpu", "cpu.max");
                let text = read_trimmed(&path);
                let (quota, period) = text
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("{}: {text:?}", path.display()));
                (parse_u64(&path, quota), parse_u64(&path, period))
            }
        }
    }

    /// The relative CPU weight (v1 `cpu.shares`, v2 `cpu.weight`).
    pub fn cpu_weight(&self) -> u64 {
        match self.version {
            Cgroups::V1 => self.number("cpu", "cpu.shares"),
            Cgroups::V2 => self.number("cpu", "cpu.weight"),
        }
    }

    /// All CPU time its processes used (v1 `cpuacct.usage`, v2 `usage_usec` of
    /// `cpu.stat`).
    pub fn cpu_usage(&self) -> Duration {
        match self.version {
            Cgroups::V1 => Duration::from_nanos(self.number("cpuacct", "cpuacct.usage")),
            Cgroups::V2 => {
                Duration::from_micros(keyed(&self.file("cpu", "cpu.stat"), "usage_usec"))
            }
        }
    }

    /// Periods in which the quota throttled it: `nr_throttled` of `cpu.stat`.
    pub fn cpu_throttled(&self) -> u64 {
        keyed(&self.file("cpu", "cpu.stat"), "nr_throttled")
    }

    /// Whether any directory of it is left (each v1 controller's, or the v2 one).
    pub fn exists(&self) -> bool {
        match self.version {
            Cgroups::V1 => CONTROLLERS
                .iter()
                .any(|c| self.plugin.cgroup_dir(c, &self.id).exists()),
            Cgroups::V2 => self.plugin.cgroup_dir("", &self.id).exists(),
        }
    }
}

/// Kill every process under `<parent>` (in each v1 controller, or in the unified
/// hierarchy) and remove the directories, children first.
pub fn remove_cgroup_tree(parent: &str) {
    if cgroups() == Cgroups::V2 {
        remove_unified_tree(&Path::new("/sys/fs/cgroup").join(parent));
        return;
    }
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

/// v2: `cgroup.kill` kills everything below `root` at once; then the directories go,
/// deepest first.
fn remove_unified_tree(root: &Path) {
    fn dirs_below(dir: &Path, out: &mut Vec<PathBuf>) {
        out.push(dir.to_owned());
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.filter_map(|e| e.ok()) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs_below(&e.path(), out);
                }
            }
        }
    }
    for _ in 0..50 {
        if !root.exists() {
            return;
        }
        let _ = std::fs::write(root.join("cgroup.kill"), "1");
        let mut dirs = Vec::new();
        dirs_below(root, &mut dirs);
        for d in dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
