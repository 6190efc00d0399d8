//! The per-task executor: a small process that owns one task so that the task outlives
//! the plugin process (and the agent).
//!
//! A driver calls [`launch`] to start a task. It runs the dedicated executor binary
//! `drover-executor` ([`executor_main`]) when a good one of the same build is
//! installed beside the driver (see [`EXECUTOR_BINARY`] for where it is looked for and what is checked), and
//! otherwise re-executes the plugin binary (`/proc/self/exe`) with [`ENV_EXECUTOR_DIR`]
//! set; the plugin's `main` calls [`run_if_executor`] first thing, which notices the
//! variable and runs the executor instead of the plugin. The executor detaches
//! (`setsid`), starts the task, drains its stdout/stderr into rotated log files
//! ([`drover_plugin_sdk::logs::RotatingWriter`]), reaps it, writes its exit result durably to
//! `exit.json`, and answers [`ExecutorHandle`] calls over a unix socket. It is one
//! thread with a `poll` loop, no async runtime, so it stays small.
//!
//! Every task has a directory `<state_dir>/<16 hex of sha256(task id)>/` (mode 0700),
//! derivable from the task id alone ([`task_dir`]), holding:
//!
//! | file | written by | what |
//! |---|---|---|
//! | `task.json` | the plugin, before the executor starts | the [`LaunchSpec`] |
//! | `lock` | the plugin creates it, the executor holds it | held (`flock`) for the executor's whole life; once the task runs, the executor's pid, then the task's pid and start time (which prove the task's process should the executor die before its start-up reply: [`lost::kill_unreported_task`]) |
//! | `sock` | the executor | its unix socket |
//! | `exit.json` | the executor, durably, before any client hears the result | the final [`ExecutorStatus`] |
//! | `executor.log` | the executor | problems it met after start-up (disk full, …) |
//!
//! Rules the executor keeps:
//! - it exits only once the task has exited, `exit.json` is durable, and a client
//!   received the result (a `wait` or `stop` reply), or when `destroy` was asked (which
//!   also removes the directory). Until then it keeps serving, so a plugin that crashed
//!   and came back finds the real result;
//! - if `exit.json` cannot be written (disk full), clients still get the result, the
//!   failure goes to `executor.log`, and the executor retries every second and does
//!   not exit before it succeeds: it is then the only keeper of the result;
//! - it never kills the task on its own: only `stop`, `destroy` and `signal` do;
//! - `stop` escalates to SIGKILL by itself at the deadline, so a plugin dying in the
//!   middle of a stop does not leave a half-stopped task.
//!
//! **Isolation.** A [`LaunchSpec`] with [`LaunchSpec::isolation`] set (exec, java) is
//! started through the [`Sandbox`] the plugin's `main` passed to [`run_if_executor`]
//! (`drover-isolation`'s `LinuxSandbox`), in two forks: an init process that joins the
//! task's cgroups, creates its namespaces and builds its root (then stays, as pid 1
//! of the pid namespace: it forwards signals to the task, reaps, and reports the
//! task's own exit status on a pipe), and the task, which sets rlimits, ids,
//! capabilities and `no_new_privs` and execs. [`ExecutorStatus::pid`] is then the
//! init's; a failed step is the start-up error, naming the step. Without isolation
//! the task is the executor's direct child (rawexec). See [`Isolation`].
//!
//! The wire protocol is newline-delimited JSON, one request and one reply per
//! connection, each message carrying the protocol version `v` ([`PROTOCOL_VERSION`]);
//! a request of a newer version than the executor's is refused. Requests
//! (`{"v":1,"op":…}`) and when they are answered:
//!
//! | op | fields | answered |
//! |---|---|---|
//! | `status` | | at once, with the [`ExecutorStatus`] |
//! | `stats` | | at once, with memory and CPU time of the task's main process |
//! | `wait` | | when the task has exited (at once if it has), with the status |
//! | `signal` | `signal` (number) | at once, after signalling the task's process group |
//! | `stop` | `signal`, `timeout_ms` | on exit; SIGKILL to the group (and the task's own cgroup) after the timeout |
//! | `destroy` | | after killing the group (if running), emptying and removing the task's own cgroup, and removing the directory |
//!
//! **A plain task's own cgroup.** With [`LaunchSpec::own_cgroup`] (rawexec, where
//! [`cgroup::plain_support`] says the host allows) the executor creates
//! [`cgroup::plain_path`] of its directory, and the task joins it between fork and exec:
//! SIGKILLs of `stop` and `destroy`, and the leftovers of a stopped task, then reach
//! every process it started, `setsid` or not. A task whose executor died is killed by
//! proof with [`lost::kill_lost_task`].
//!
//! **Plain drivers.** A driver whose task is one plain process under its executor
//! (rawexec's command, qemu's VM) need not write the driver side either: [`plain`] is
//! the engine that starts, follows, stops, recovers and destroys such tasks.
//!
//! A reply is `{"v":1,"status":{…}}` (plus `"stats"` for `stats`) or
//! `{"v":1,"error":"…","kind":"invalid"|"exited"|"spawn"|"internal"}`. The executor's
//! start-up line to the plugin is such a reply too.
//!
//! ```no_run
//! # async fn demo() -> Result<(), drover_plugin_sdk::DriverError> {
//! use drover_executor::{self as executor, LaunchSpec};
//! let state = executor::state_dir(std::path::Path::new("/var/lib/drover/plugin-state"), "mydriver");
//! let mut spec = LaunchSpec::new("web-1", "/bin/sleep");
//! spec.args = vec!["60".into()];
//! let task = executor::launch(&state, &spec).await?;
//! println!("task pid {} owned by executor {}", task.pid(), task.status().await?.executor_pid);
//! let exit = task.stop(drover_plugin_sdk::Signal::TERM, std::time::Duration::from_secs(5)).await?;
//! println!("{:?}", exit.result);
//! task.destroy().await?;
//! # Ok(()) }
//! ```

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use drover_plugin_sdk::DriverError;

pub mod cgroup;
mod client;
mod daemon;
mod failpoint;
mod files;
pub mod lost;
pub mod plain;
pub mod procfs;
mod program;
mod proto;
pub mod sandbox;
mod spawn;
mod spawner;
pub mod task;

pub use client::{ExecutorHandle, launch};
pub use failpoint::ENV_EXECUTOR_FAILPOINT;
pub use files::read_exit_file;
pub use program::{BUILD_ID, ENV_EXECUTOR_PROGRAM, EXECUTOR_BINARY};
pub use proto::{
    BpfInstruction, CapabilitySets, Credentials, ExecutorStatus, ExitInfo, Isolation, LaunchSpec,
    Mount, MountKind, Namespaces, Rlimit, RlimitResource,
};
pub use sandbox::{Sandbox, Sandboxed};
pub use spawner::ENV_EXECUTOR_SPAWNER;

/// Environment variable that switches the plugin binary into executor mode. Its value
/// is the task's executor directory.
///
/// ```
/// assert_eq!(drover_executor::ENV_EXECUTOR_DIR, "DROVER_EXECUTOR_DIR");
/// ```
pub const ENV_EXECUTOR_DIR: &str = "DROVER_EXECUTOR_DIR";

/// Version of the executor's socket protocol and files. Every message carries it; a
/// newer plugin can tell an old executor (started by the previous plugin version)
/// from one that understands new requests.
///
/// ```
/// assert!(drover_executor::PROTOCOL_VERSION >= 1);
/// ```
pub const PROTOCOL_VERSION: u32 = 1;

/// The plugin's own soft open-file limit before the SDK raised it; the executor puts
/// it back so that the task gets the limit the operator set.
pub(crate) const ENV_EXECUTOR_NOFILE: &str = "DROVER_EXECUTOR_NOFILE";

pub(crate) const SOCKET_FILE: &str = "sock";
pub(crate) const LOCK_FILE: &str = "lock";
pub(crate) const SPEC_FILE: &str = "task.json";

/// The launch spec an executor was started with, from its directory `dir` (the
/// plugin's own, never the task's): what a command run inside the task later (an
/// interactive exec) must match, its sandbox included.
pub fn read_launch_spec(dir: &Path) -> Result<LaunchSpec, String> {
    let file = dir.join(SPEC_FILE);
    let bytes = std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("cannot parse {}: {e}", file.display()))
}
pub(crate) const EXIT_FILE: &str = "exit.json";
pub(crate) const LOG_FILE: &str = "executor.log";

/// If this process was started as an executor, run it and exit; otherwise return at
/// once. A plugin binary whose driver calls [`launch`] must call it at the top of
/// `main`, before anything else (no async runtime, no threads, no logging set up: the
/// executor exists once per task and must stay small). `sandbox` starts the tasks
/// that ask for isolation; `None` in a driver that never does (rawexec), and then such
/// a task is refused with an error.
///
/// ```no_run
/// fn main() {
///     drover_executor::run_if_executor(None);
///     start_the_plugin();
/// }
/// # fn start_the_plugin() {}
/// ```
pub fn run_if_executor(sandbox: Option<&dyn Sandbox>) {
    if let Some(code) = run_executor_mode(sandbox) {
        std::process::exit(code);
    }
}

/// Run the mode the environment asks for, a spawner or one task's executor, and return
/// its exit code; `None` when it asks for neither.
fn run_executor_mode(sandbox: Option<&dyn Sandbox>) -> Option<i32> {
    if std::env::var_os(spawner::ENV_SPAWNER_SOCKET).is_some() {
        return Some(spawner::serve(sandbox));
    }
    let dir = std::env::var_os(ENV_EXECUTOR_DIR)?;
    Some(daemon::run(
        PathBuf::from(dir),
        sandbox,
        daemon::nofile_from_env(),
    ))
}

/// The `main` of the dedicated executor binary, `drover-executor`: run the executor of
/// the task directory in [`ENV_EXECUTOR_DIR`] and exit with its code. `--version`
/// prints the build ([`BUILD_ID`]); anything else is refused, since only a driver
/// starts an executor. `sandbox` isolates the tasks that ask for it (exec, java).
///
/// The binary links nothing else: no async runtime, no gRPC, no TLS, so that the
/// private memory each running task costs stays small.
///
/// ```no_run
/// // The whole `main` of an executor program whose tasks never ask for isolation:
/// drover_executor::executor_main(None);
/// ```
pub fn executor_main(sandbox: Option<&dyn Sandbox>) -> ! {
    run_if_executor(sandbox);
    let marker = program::BUILD_MARKER.trim_end_matches('\0');
    let build = marker.rsplit(':').next().unwrap_or(marker);
    if std::env::args_os().nth(1).is_some_and(|a| a == "--version") {
        println!("drover-executor {build} (protocol {PROTOCOL_VERSION})");
        std::process::exit(0);
    }
    eprintln!(
        "drover-executor {build}: Drover's drivers start this program, one per running task \
         (with {ENV_EXECUTOR_DIR} set); it is not run by hand. `--version` prints its build."
    );
    std::process::exit(2);
}

/// The executor directory of task `task_id` under `state_dir`: 16 hex digits of the
/// sha256 of the id. Hashing keeps the socket path short and of fixed length (a unix
/// socket path must fit in 107 bytes), and any id maps to a safe file name.
///
/// ```
/// use std::path::Path;
/// let d = drover_executor::task_dir(Path::new("/var/lib/drover/x"), "web-1");
/// assert_eq!(d.parent(), Some(Path::new("/var/lib/drover/x")));
/// assert_eq!(d.file_name().unwrap().len(), 16);
/// ```
pub fn task_dir(state_dir: &Path, task_id: &str) -> PathBuf {
    let digest = sha2::Sha256::digest(task_id.as_bytes());
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    state_dir.join(name)
}

/// The socket of the executor in `dir`.
///
/// ```
/// use std::path::Path;
/// assert_eq!(drover_executor::socket_path(Path::new("/s/0123456789abcdef")),
///            Path::new("/s/0123456789abcdef/sock"));
/// ```
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_FILE)
}

/// Where a plugin named `plugin` keeps its executors: `<plugin_state_dir>/<plugin>`,
/// where `plugin_state_dir` comes from [`drover_plugin_sdk::AgentInfo`] in `set_config`. When the
/// host sent none (an empty path: tests, the conformance harness), a per-user directory
/// under the temp dir: `<tmp>/drover-executors-<uid>/<plugin>`.
///
/// ```
/// use std::path::Path;
/// let d = drover_executor::state_dir(Path::new("/data/plugin-state"), "rawexec");
/// assert_eq!(d, Path::new("/data/plugin-state/rawexec"));
/// let fallback = drover_executor::state_dir(Path::new(""), "rawexec");
/// assert!(fallback.starts_with(std::env::temp_dir()));
/// ```
pub fn state_dir(plugin_state_dir: &Path, plugin: &str) -> PathBuf {
    if plugin_state_dir.as_os_str().is_empty() {
        let uid = rustix::process::geteuid().as_raw();
        std::env::temp_dir()
            .join(format!("drover-executors-{uid}"))
            .join(plugin)
    } else {
        plugin_state_dir.join(plugin)
    }
}

/// Create `dir` (and missing parents) with mode 0700, and refuse one that another user
/// owns: executor sockets and task specs live there, and the fallback location is in
/// the world-writable temp dir, where someone else could have created it first.
///
/// ```
/// let tmp = tempfile::tempdir().unwrap();
/// let d = tmp.path().join("plugin-state/rawexec");
/// drover_executor::prepare_state_dir(&d).unwrap();
/// use std::os::unix::fs::PermissionsExt as _;
/// assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
/// ```
pub fn prepare_state_dir(dir: &Path) -> Result<(), DriverError> {
    let err = |what: &str, e: std::io::Error| {
        DriverError::Internal(format!(
            "cannot {what} executor state directory {}: {e}",
            dir.display()
        ))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| err("create", e))?;
    // Check every level we may have created under the temp dir, and the dir itself.
    let meta = std::fs::symlink_metadata(dir).map_err(|e| err("inspect", e))?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me {
        return Err(DriverError::Internal(format!(
            "executor state directory {} is not a directory owned by uid {me}; remove it or \
             set the agent's data_dir",
            dir.display()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| err("restrict the mode of", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_dirs_are_fixed_length_distinct_and_stable() {
        let root = Path::new("/r");
        let a = task_dir(root, "a");
        assert_eq!(a, task_dir(root, "a"));
        assert_ne!(a, task_dir(root, "b"));
        // sha256("a") starts with ca978112ca1bbdca.
        assert_eq!(a, Path::new("/r/ca978112ca1bbdca"));
        let long = "x".repeat(128);
        assert_eq!(task_dir(root, &long).as_os_str().len(), a.as_os_str().len());
    }

    #[test]
    fn prepare_tightens_our_own_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("s");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_state_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn prepare_refuses_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        std::fs::write(&f, "").unwrap();
        let err = prepare_state_dir(&f).unwrap_err().to_string();
        assert!(err.contains(&f.display().to_string()), "{err}");
    }
}
