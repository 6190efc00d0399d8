//! What the plugin and the executor say to each other, and what they write to files.
//! Shared by both sides so that they cannot disagree.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use drover_plugin_sdk::types::{ExitResult, LogConfig, TaskStats};

use super::PROTOCOL_VERSION;

/// How the executor starts a task: written by the plugin to `task.json`, read by the
/// executor. The executor is the same binary as the plugin that wrote it, so unknown
/// fields are refused rather than ignored (an isolation setting silently dropped would
/// be worse than a refusal).
///
/// Drivers with isolation (exec, java) set [`LaunchSpec::isolation`]: cgroups,
/// namespaces, a chroot, capabilities, user and rlimits, all applied in one place,
/// between fork and exec (see [`Isolation`]).
///
/// ```
/// let mut spec = drover_executor::LaunchSpec::new("web-1", "/bin/echo");
/// spec.args = vec!["hello".into()];
/// spec.env.insert("PATH".into(), "/bin:/usr/bin".into());
/// assert_eq!(spec.cwd, std::path::Path::new("/"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LaunchSpec {
    /// The task id (also the key of the executor directory).
    pub task_id: String,
    /// The program: an absolute path, or a name looked up in `env["PATH"]`.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The task's whole environment (nothing is inherited from the plugin).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; must exist.
    #[serde(default = "root")]
    pub cwd: PathBuf,
    /// Base path of the stdout log files (`<base>.0`, `<base>.1`, …); empty discards.
    #[serde(default)]
    pub stdout_path: PathBuf,
    /// Base path of the stderr log files; empty discards.
    #[serde(default)]
    pub stderr_path: PathBuf,
    /// Size and count limits of the log files.
    #[serde(default)]
    pub logs: LogConfig,
    /// Containment of the task; `None` starts a plain process (rawexec). With it,
    /// `command` and `cwd` are paths inside the task's root when [`Isolation::mounts`]
    /// builds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// A plain task (no `isolation`) runs in a cgroup of its own,
    /// [`crate::cgroup::plain_path`] of its executor directory, created by the
    /// executor and joined by the task between fork and exec; stop and destroy then
    /// reach every process in it. Set it only where [`crate::cgroup::plain_support`]
    /// says the host allows: the start fails if the cgroup cannot be made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_cgroup: bool,
    /// A network namespace a plain task (no `isolation`) joins between fork and exec:
    /// its group's, in bridge mode. With `isolation`, [`Isolation::netns_path`] says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_path: Option<PathBuf>,
}

fn root() -> PathBuf {
    PathBuf::from("/")
}

impl LaunchSpec {
    /// Run `command` for task `task_id`, with no arguments, an empty environment, in
    /// `/`, output discarded. Set the public fields for the rest.
    pub fn new(task_id: impl Into<String>, command: impl Into<String>) -> Self {
        LaunchSpec {
            task_id: task_id.into(),
            command: command.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: root(),
            stdout_path: PathBuf::new(),
            stderr_path: PathBuf::new(),
            logs: LogConfig::default(),
            isolation: None,
            own_cgroup: false,
            netns_path: None,
        }
    }
}

/// How the executor contains a task. Applied in the forked child, in this order:
/// join the cgroups → join the network namespace `netns_path` → unshare the namespaces → hostname → build the root from
/// `mounts` and `pivot_root` into it → (fork the task under a small init, see below)
/// → rlimits → drop the bounding set → groups, gid, uid → permitted, effective,
/// inheritable and ambient capabilities → `no_new_privs` → exec. A failure at any
/// step stops the start with an error naming the step; nothing keeps running.
///
/// With isolation the executor's direct child is a small init process (still the
/// executor's code) that starts the task as its only child, forwards every signal it
/// receives to the task's process group, reaps whatever the task leaves behind, and
/// reports the task's own exit status. With a pid namespace it is pid 1 there (which
/// would ignore SIGTERM if it were the task) and its exit takes every process of the
/// namespace with it. [`ExecutorStatus::pid`] is this init process.
///
/// ```
/// use drover_executor::{Isolation, Mount};
/// let mut iso = Isolation::default();
/// iso.namespaces.pid = true;
/// iso.namespaces.mount = true;
/// iso.mounts = vec![Mount::bind("/usr", "/usr", true), Mount::proc("/proc")];
/// iso.no_new_privs = true;
/// assert!(iso.mounts[0].read_only);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Isolation {
    /// Cgroup files the task's init joins first by writing `0` (itself) to each, so
    /// that every process of the task is in these cgroups from the start: v2's
    /// `cgroup.procs`, or on v1 each hierarchy's `tasks` (the init is single-threaded,
    /// and moving a thread spares the kernel's global threadgroup lock, which costs an
    /// RCU grace period).
    pub cgroup_procs: Vec<PathBuf>,
    /// Namespaces to create.
    pub namespaces: Namespaces,
    /// An existing network namespace the task joins (setns) instead of the
    /// executor's: its group's, in bridge mode. Not with `namespaces.net`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns_path: Option<PathBuf>,
    /// Hostname set in the new UTS namespace.
    pub hostname: Option<String>,
    /// The task's root, built on an empty tmpfs (read-only once built) in a new mount
    /// namespace; empty: the task sees the host's file system.
    pub mounts: Vec<Mount>,
    /// Resource limits of the task's process.
    pub rlimits: Vec<Rlimit>,
    /// User and groups to run as; `None`: the executor's (root).
    pub credentials: Option<Credentials>,
    /// Capability sets; `None`: unchanged.
    pub capabilities: Option<CapabilitySets>,
    /// Set `no_new_privs`: neither setuid binaries nor file capabilities can raise the
    /// task's privileges.
    pub no_new_privs: bool,
    /// A seccomp filter, installed as the very last step before `exec` (after
    /// `no_new_privs`, which it implies); `None`: no filter. The plugin builds the
    /// program once from its policy; the executor installs it as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<Vec<BpfInstruction>>,
}

/// One classic BPF instruction of a seccomp filter (`struct sock_filter`), written as
/// `[code, jt, jf, k]`.
///
/// ```
/// use drover_executor::BpfInstruction;
/// // BPF_RET | BPF_K, SECCOMP_RET_ALLOW
/// let allow = BpfInstruction { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 };
/// assert_eq!(serde_json::to_string(&allow).unwrap(), "[6,0,0,2147418112]");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u16, u8, u8, u32)", into = "(u16, u8, u8, u32)")]
pub struct BpfInstruction {
    /// Operation.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

impl From<(u16, u8, u8, u32)> for BpfInstruction {
    fn from((code, jt, jf, k): (u16, u8, u8, u32)) -> Self {
        BpfInstruction { code, jt, jf, k }
    }
}

impl From<BpfInstruction> for (u16, u8, u8, u32) {
    fn from(i: BpfInstruction) -> Self {
        (i.code, i.jt, i.jf, i.k)
    }
}

/// Namespaces the task gets. Mount, pid, ipc and uts are what the exec driver always
/// asks for; net is optional (`network_mode = "none"`: only a loopback device, down).
///
/// ```
/// let n = drover_executor::Namespaces::default();
/// assert!(!n.pid && !n.net);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Namespaces {
    /// Own mount table (required for `mounts`).
    pub mount: bool,
    /// Own pid numbering: the task sees small pids, and its init is pid 1.
    pub pid: bool,
    /// Own System V IPC and POSIX message queues.
    pub ipc: bool,
    /// Own hostname.
    pub uts: bool,
    /// Own network stack (no interfaces but a loopback device).
    pub net: bool,
}

/// What one entry of [`Isolation::mounts`] mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountKind {
    /// Bind-mount host path `source` (recursively). A `source` that is a symlink is
    /// copied as a symlink instead (`/bin -> usr/bin` on merged-/usr systems).
    Bind,
    /// A fresh `proc` of the task's pid namespace.
    Proc,
    /// An empty tmpfs (mode 1777).
    Tmpfs,
    /// A minimal `/dev`: a tmpfs with `null`, `zero`, `full`, `random`, `urandom` and
    /// `tty` bound from the host, `fd`/`stdin`/`stdout`/`stderr` links and a `shm`
    /// tmpfs.
    Dev,
    /// A host volume: the directory `source` itself (every component of its path
    /// opened without following a link, so a link a task planted where a nested
    /// volume was is refused, not followed) bound, not recursively, at `target`, whose
    /// path in the task's root is also walked without following links (a task's link
    /// in its own directory cannot move the mount elsewhere).
    HostVolume,
    /// A device node given to the task (a device plugin's reservation): `target` must
    /// be below the root's [`MountKind::Dev`] mount, where the host node `source`
    /// (opened without following a link; a character or block device) is bound.
    /// [`Mount::device_permissions`] (some of `r`, `w`, `m`) is what the driver's
    /// devices cgroup rule for it grants (cgroup v1).
    DeviceNode,
}

/// One mount of the task's root.
///
/// ```
/// use drover_executor::{Mount, MountKind};
/// let m = Mount::bind("/srv/task-1/local", "/local", false);
/// assert_eq!(m.kind, MountKind::Bind);
/// assert_eq!(Mount::dev("/dev").kind, MountKind::Dev);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// What to mount.
    pub kind: MountKind,
    /// Host path (binds only).
    #[serde(default)]
    pub source: PathBuf,
    /// Absolute path inside the task's root; no `..`.
    pub target: PathBuf,
    /// Mount it read-only (binds only; proc, dev and tmpfs are never read-only).
    #[serde(default)]
    pub read_only: bool,
    /// What the task may do with a [`MountKind::DeviceNode`]: some of `r`, `w`, `m`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device_permissions: String,
}

impl Mount {
    /// Bind `source` (host) at `target` (in the task's root).
    pub fn bind(source: impl Into<PathBuf>, target: impl Into<PathBuf>, read_only: bool) -> Self {
        Mount {
            kind: MountKind::Bind,
            source: source.into(),
            target: target.into(),
            read_only,
            device_permissions: String::new(),
        }
    }

    /// The host volume directory `source` at `target` ([`MountKind::HostVolume`]).
    pub fn host_volume(
        source: impl Into<PathBuf>,
        target: impl Into<PathBuf>,
        read_only: bool,
    ) -> Self {
        Mount {
            kind: MountKind::HostVolume,
            source: source.into(),
            target: target.into(),
            read_only,
            device_permissions: String::new(),
        }
    }

    /// The host device node `source` made at `target` (below the root's `/dev`) with
    /// `permissions` ([`MountKind::DeviceNode`]).
    ///
    /// ```
    /// use drover_executor::{Mount, MountKind};
    /// let m = Mount::device_node("/srv/nodes/zero0", "/dev/zero0", "r");
    /// assert_eq!((m.kind, m.device_permissions.as_str()), (MountKind::DeviceNode, "r"));
    /// ```
    pub fn device_node(
        source: impl Into<PathBuf>,
        target: impl Into<PathBuf>,
        permissions: impl Into<String>,
    ) -> Self {
        Mount {
            kind: MountKind::DeviceNode,
            source: source.into(),
            target: target.into(),
            read_only: false,
            device_permissions: permissions.into(),
        }
    }

    /// `proc` at `target`.
    pub fn proc(target: impl Into<PathBuf>) -> Self {
        Self::special(MountKind::Proc, target)
    }

    /// An empty tmpfs at `target`.
    pub fn tmpfs(target: impl Into<PathBuf>) -> Self {
        Self::special(MountKind::Tmpfs, target)
    }

    /// A minimal `/dev` at `target`.
    pub fn dev(target: impl Into<PathBuf>) -> Self {
        Self::special(MountKind::Dev, target)
    }

    fn special(kind: MountKind, target: impl Into<PathBuf>) -> Self {
        Mount {
            kind,
            source: PathBuf::new(),
            target: target.into(),
            read_only: false,
            device_permissions: String::new(),
        }
    }
}

/// A resource limit (`setrlimit`) of the task.
///
/// ```
/// use drover_executor::{Rlimit, RlimitResource};
/// let r: Rlimit = serde_json::from_str(r#"{"resource":"nofile","soft":1024,"hard":4096}"#).unwrap();
/// assert_eq!(r.resource, RlimitResource::Nofile);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    /// Which limit.
    pub resource: RlimitResource,
    /// Soft limit; `None`: unlimited.
    #[serde(default)]
    pub soft: Option<u64>,
    /// Hard limit; `None`: unlimited.
    #[serde(default)]
    pub hard: Option<u64>,
}

/// The limits of `setrlimit(2)`, by their `RLIMIT_*` names in lowercase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)] // the names are the kernel's
pub enum RlimitResource {
    As,
    Core,
    Cpu,
    Data,
    Fsize,
    Locks,
    Memlock,
    Msgqueue,
    Nice,
    Nofile,
    Nproc,
    Rss,
    Rtprio,
    Rttime,
    Sigpending,
    Stack,
}

impl RlimitResource {
    /// Every limit, for listing the valid names.
    pub const ALL: [RlimitResource; 16] = [
        Self::As,
        Self::Core,
        Self::Cpu,
        Self::Data,
        Self::Fsize,
        Self::Locks,
        Self::Memlock,
        Self::Msgqueue,
        Self::Nice,
        Self::Nofile,
        Self::Nproc,
        Self::Rss,
        Self::Rtprio,
        Self::Rttime,
        Self::Sigpending,
        Self::Stack,
    ];

    /// The lowercase name (`nofile`).
    ///
    /// ```
    /// use drover_executor::RlimitResource;
    /// assert_eq!(RlimitResource::Nofile.name(), "nofile");
    /// assert_eq!(RlimitResource::from_name("NOFILE"), Some(RlimitResource::Nofile));
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Self::As => "as",
            Self::Core => "core",
            Self::Cpu => "cpu",
            Self::Data => "data",
            Self::Fsize => "fsize",
            Self::Locks => "locks",
            Self::Memlock => "memlock",
            Self::Msgqueue => "msgqueue",
            Self::Nice => "nice",
            Self::Nofile => "nofile",
            Self::Nproc => "nproc",
            Self::Rss => "rss",
            Self::Rtprio => "rtprio",
            Self::Rttime => "rttime",
            Self::Sigpending => "sigpending",
            Self::Stack => "stack",
        }
    }

    /// The limit named `name` (case-insensitive, with or without `RLIMIT_`).
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let bare = lower.strip_prefix("rlimit_").unwrap_or(&lower);
        Self::ALL.into_iter().find(|r| r.name() == bare)
    }
}

/// Who the task runs as. The driver resolves names; the executor only sets ids.
///
/// ```
/// let c = drover_executor::Credentials { uid: 65534, gid: 65534, groups: vec![] };
/// assert_eq!(c.uid, 65534);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (replacing the executor's).
    #[serde(default)]
    pub groups: Vec<u32>,
}

/// Capability sets as masks, bit `n` for capability number `n` (`CAP_CHOWN` = 0, …).
///
/// - `bounding`: the only capabilities the task can ever hold; every other one is
///   dropped from the bounding set. A task running as root gets exactly these as
///   permitted and effective.
/// - `ambient`: for a task not running as root, capabilities it keeps across its exec
///   (permitted, effective, inheritable and ambient); must be within `bounding`.
///   A non-root task without ambient capabilities has none at all.
///
/// ```
/// let c = drover_executor::CapabilitySets { bounding: 1 << 10, ambient: 0 };
/// assert_eq!(c.bounding.count_ones(), 1); // CAP_NET_BIND_SERVICE
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitySets {
    /// Bounding set.
    pub bounding: u64,
    /// Ambient set (non-root tasks).
    #[serde(default)]
    pub ambient: u64,
}

/// How a task ended, as the executor recorded it.
///
/// ```
/// use drover_plugin_sdk::ExitResult;
/// use drover_executor::ExitInfo;
/// let e = ExitInfo {
///     result: ExitResult::signaled(9),
///     exited_at: std::time::SystemTime::now(),
///     killed_after_timeout: true,
/// };
/// assert!(!e.result.successful());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code or signal (and the OOM flag, for drivers that can tell).
    pub result: ExitResult,
    /// When the executor reaped it.
    pub exited_at: SystemTime,
    /// A `stop` request's timeout ran out and the executor sent SIGKILL.
    #[serde(default)]
    pub killed_after_timeout: bool,
}

/// A task as its executor sees it: answered by every call, and written to `exit.json`
/// (with `exit` set) when the task has exited.
///
/// ```
/// let s = drover_executor::ExecutorStatus {
///     task_id: "web-1".into(),
///     pid: 4242,
///     pgid: 4242,
///     start_time: 123456,
///     started_at: std::time::SystemTime::now(),
///     executor_pid: 4241,
///     exit: None,
/// };
/// assert!(s.running());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorStatus {
    /// The task id from the launch spec: proves the executor is the right one.
    pub task_id: String,
    /// The task's main process.
    pub pid: u32,
    /// Its process group, which signals go to.
    pub pgid: u32,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// When it was started.
    pub started_at: SystemTime,
    /// The executor's own pid.
    pub executor_pid: u32,
    /// How it ended, once it has.
    pub exit: Option<ExitInfo>,
}

impl ExecutorStatus {
    /// The task has not exited yet.
    pub fn running(&self) -> bool {
        self.exit.is_none()
    }
}

/// One request: `{"v":1,"op":"wait"}`, `{"v":1,"op":"signal","signal":10}`, …
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request {
    pub v: u32,
    #[serde(flatten)]
    pub op: Op,
}

impl Request {
    pub(crate) fn new(op: Op) -> Self {
        Request {
            v: PROTOCOL_VERSION,
            op,
        }
    }
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
    /// Answer at once.
    Status,
    /// Resource usage of the task's main process, with the status.
    Stats,
    /// Answer when the task has exited.
    Wait,
    /// Send `signal` to the task's process group.
    Signal { signal: i32 },
    /// Send `signal`, then SIGKILL to the group after `timeout_ms`; answer on exit.
    Stop { signal: i32, timeout_ms: u64 },
    /// SIGKILL the group if running, remove the directory, answer, exit.
    Destroy,
}

/// Why a request failed, so the client can map it to the right [`drover_plugin_sdk::DriverError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorKind {
    /// A bad request (unknown signal, unknown op, newer protocol).
    Invalid,
    /// The task has exited (e.g. signal to an exited task).
    Exited,
    /// The task could not be started (start-up reply only).
    Spawn,
    /// Anything else.
    Internal,
}

/// One reply, and also the start-up line the executor writes to the plugin: the task's
/// status, or an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Reply {
    pub v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ExecutorStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<TaskStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

impl Reply {
    pub(crate) fn ok(status: ExecutorStatus) -> Self {
        Reply {
            v: PROTOCOL_VERSION,
            status: Some(status),
            stats: None,
            error: None,
            kind: None,
        }
    }

    pub(crate) fn err(kind: ErrorKind, message: impl Into<String>) -> Self {
        Reply {
            v: PROTOCOL_VERSION,
            status: None,
            stats: None,
            error: Some(message.into()),
            kind: Some(kind),
        }
    }
}

/// The content of `exit.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExitFile {
    pub v: u32,
    pub status: ExecutorStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_on_the_wire() {
        let text = serde_json::to_string(&Request::new(Op::Stop {
            signal: 15,
            timeout_ms: 500,
        }))
        .unwrap();
        assert_eq!(text, r#"{"v":1,"op":"stop","signal":15,"timeout_ms":500}"#);
        let back: Request = serde_json::from_str(r#"{"op":"wait","v":1}"#).unwrap();
        assert_eq!(back.op, Op::Wait);
        assert!(serde_json::from_str::<Request>(r#"{"v":1,"op":"reboot"}"#).is_err());
    }

    #[test]
    fn launch_spec_refuses_unknown_fields_and_defaults_the_rest() {
        let s: LaunchSpec = serde_json::from_str(r#"{"task_id":"t","command":"x"}"#).unwrap();
        assert_eq!(s, LaunchSpec::new("t", "x"));
        let err =
            serde_json::from_str::<LaunchSpec>(r#"{"task_id":"t","command":"x","chroot":"/srv"}"#)
                .unwrap_err();
        assert!(err.to_string().contains("chroot"), "{err}");
    }

    #[test]
    fn error_replies_omit_the_status() {
        let text = serde_json::to_string(&Reply::err(ErrorKind::Exited, "gone")).unwrap();
        assert_eq!(text, r#"{"v":1,"error":"gone","kind":"exited"}"#);
    }
}
