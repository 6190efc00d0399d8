//! The driver's side: start an executor, and talk to one (async, tokio).

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, BufReader,
};

use drover_plugin_sdk::types::{TaskStats, validate_task_id};
use drover_plugin_sdk::{DriverError, Signal};

use super::proto::{ErrorKind, Op, Reply, Request};
use super::{
    ENV_EXECUTOR_DIR, ENV_EXECUTOR_NOFILE, ExecutorStatus, ExitInfo, LOCK_FILE, LaunchSpec,
    SPEC_FILE, files, prepare_state_dir, socket_path, task_dir,
};

/// How long an executor may take to start its task and answer.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Limit for calls that are answered at once (status, signal).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest reply line read.
const MAX_REPLY: u64 = 1024 * 1024;
/// Open-file limit a plugin raises itself to (within the hard limit): it holds one
/// connection per running task (its `wait`), and the usual soft limit of 1024 would
/// cap a node at about a thousand tasks.
const WANTED_NOFILE: u64 = 65536;

/// Raise this process's soft open-file limit once, and return the limit it had before
/// (to be restored in executors, so that tasks get the limit the operator set).
fn fd_headroom() -> Option<u64> {
    static ORIGINAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *ORIGINAL.get_or_init(|| {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        let current = limit.current?;
        let wanted = limit
            .maximum
            .map_or(WANTED_NOFILE, |max| max.min(WANTED_NOFILE));
        if wanted <= current {
            return None;
        }
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(wanted),
                maximum: limit.maximum,
            },
        )
        .ok()?;
        Some(current)
    })
}

/// Start an executor for `spec` under `state_dir` (see [`super::state_dir`]) and
/// return once the task runs. The executor is the dedicated `drover-executor` binary
/// when a good one is installed (see [`super::EXECUTOR_BINARY`]), else the plugin binary
/// re-executed (`/proc/self/exe`; for a driver loaded into a host, the program the host
/// named, by default the host's own binary:
/// [`drover_plugin_sdk::inproc::executor_program`]) in executor mode; the executor is
/// the plugin's child only until the plugin exits: it is never killed with the plugin.
///
/// Errors: [`DriverError::InvalidConfig`] when the task cannot start (no such command,
/// bad working directory, log directory missing), naming what is wrong, and then
/// nothing is left behind; [`DriverError::AlreadyExists`] when a live executor owns
/// this task id already.
///
/// ```no_run
/// # async fn demo() -> Result<(), drover_plugin_sdk::DriverError> {
/// use drover_executor::{self as executor, LaunchSpec};
/// let spec = LaunchSpec::new("job-1", "/bin/true");
/// let task = executor::launch(std::path::Path::new("/run/drover/mydriver"), &spec).await?;
/// assert!(task.wait().await?.result.successful());
/// # Ok(()) }
/// ```
pub async fn launch(state_dir: &Path, spec: &LaunchSpec) -> Result<ExecutorHandle, DriverError> {
    validate_task_id(&spec.task_id)?;
    prepare_state_dir(state_dir)?;
    let dir = task_dir(state_dir, &spec.task_id);
    let sock = socket_path(&dir);
    if !drover_plugin_sdk::handshake::socket_path_fits(&sock) {
        return Err(DriverError::InvalidConfig(format!(
            "executor socket path {} is {} bytes, longer than the {} a unix socket allows; \
             use a shorter data_dir for the agent",
            sock.display(),
            sock.as_os_str().len(),
            drover_plugin_sdk::handshake::MAX_UNIX_SOCKET_PATH
        )));
    }
    let io_err = |what: &str, path: &Path, e: std::io::Error| {
        DriverError::Internal(format!("cannot {what} {}: {e}", path.display()))
    };
    let make_dir = || std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let made = match make_dir() {
        // Already there (a first look would cost every start a stat for this rare
        // case): a live executor's, or a dead one's leftovers (an earlier run of this id
        // that was never destroyed, or a start that died half-way).
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if files::lock_state(&dir).held() {
                return Err(DriverError::AlreadyExists(format!(
                    "task {} already has a live executor in {}; recover it instead of \
                     starting it again",
                    spec.task_id,
                    dir.display()
                )));
            }
            std::fs::remove_dir_all(&dir).map_err(|e| io_err("remove stale", &dir, e))?;
            make_dir()
        }
        made => made,
    };
    made.map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => DriverError::AlreadyExists(format!(
            "task {} is being started concurrently",
            spec.task_id
        )),
        _ => io_err("create", &dir, e),
    })?;
    let cleanup = |dir: &Path| {
        let _ = std::fs::remove_dir_all(dir);
    };
    let spec_json = serde_json::to_vec(spec).map_err(DriverError::internal)?;
    if let Err(e) = std::fs::write(dir.join(SPEC_FILE), spec_json) {
        cleanup(&dir);
        return Err(io_err("write", &dir.join(SPEC_FILE), e));
    }

    // Held from now until the executor dies: it inherits the lock as its stdin, so
    // there is no moment in which the directory looks abandoned while its executor is
    // starting (a recovery by id would then wrongly find nothing, and a second start
    // would run the task twice).
    let lock = match files::create_lock(&dir) {
        Ok(l) => l,
        Err(e) => {
            cleanup(&dir);
            return Err(io_err("lock", &dir.join(LOCK_FILE), e));
        }
    };
    // Forked by this driver's spawner when it can (see `spawner`), else executed.
    let mut forked: Option<Started> = None;
    if super::spawner::enabled() {
        use super::spawner::Outcome;
        match super::spawner::spawn(&dir, &lock, &spec.task_id, fd_headroom()).await {
            Outcome::Spawned {
                pid,
                pidfd,
                startup,
            } => {
                forked = Some(Started {
                    pid: Some(pid),
                    pidfd,
                    startup: Box::new(startup),
                    marked: true,
                });
            }
            Outcome::NotForked(e) => tracing::warn!(
                task_id = %spec.task_id,
                "the executor spawner did not fork this task's executor ({e}); executing it \
                 directly"
            ),
            Outcome::Unanswered { startup, why } => {
                // Only an executor it forked can still write on the pipe, and one that
                // ran wrote its mark first.
                let mut first = String::new();
                let read = tokio::time::timeout(
                    STARTUP_TIMEOUT,
                    BufReader::new(startup.take(MAX_REPLY)).read_line(&mut first),
                )
                .await;
                match read {
                    Ok(Ok(0)) => tracing::warn!(
                        task_id = %spec.task_id,
                        "the executor spawner failed ({why}) without starting this task's \
                         executor; executing it directly"
                    ),
                    // It did fork one: that executor's reply stands (its pid is not
                    // known here: it reports its own).
                    Ok(Ok(_)) => {
                        forked = Some(Started {
                            pid: None,
                            pidfd: None,
                            startup: Box::new(std::io::Cursor::new(first)),
                            marked: true,
                        });
                    }
                    Ok(Err(e)) => {
                        // Something wrote: an executor it forked may run. Its directory
                        // and lock stay; recovery by id decides.
                        return Err(DriverError::Timeout(format!(
                            "the executor spawner failed ({why}), and reading the start-up \
                             reply of an executor it may have forked for task {} failed: \
                             {e}; it may still start the task, which is then found by \
                             recovering it by id",
                            spec.task_id
                        )));
                    }
                    Err(_) => {
                        return Err(DriverError::Timeout(format!(
                            "the executor spawner failed ({why}), and an executor it may have \
                             forked for task {} gave no start-up reply within \
                             {STARTUP_TIMEOUT:?}; it may still start the task, which is then \
                             found by recovering it by id",
                            spec.task_id
                        )));
                    }
                }
            }
        }
    }
    let Started {
        pid: executor_pid,
        pidfd: executor_pidfd,
        startup,
        marked,
    } = match forked {
        Some(started) => {
            // The executor's copy of the lock keeps it held.
            drop(lock);
            started
        }
        None => {
            let mut command = executor_command(&dir, lock, &spec.task_id);
            let spawned = command.spawn();
            // Our copy of the lock goes with the command; the executor's copy keeps it
            // held.
            drop(command);
            let mut child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    cleanup(&dir);
                    return Err(DriverError::Internal(format!(
                        "cannot start an executor (running {}): {e}",
                        super::program::program().display_path().display()
                    )));
                }
            };
            // Always piped; without it the reply is empty.
            let stdout: Box<dyn AsyncRead + Unpin + Send> = match child.stdout.take() {
                Some(out) => Box::new(out),
                None => Box::new(tokio::io::empty()),
            };
            let pid = child.id();
            // Opened before anything waits for it: our child cannot have been reaped
            // yet, so the pidfd is of this executor for certain.
            let pidfd = pid.and_then(|p| super::lost::pidfd_of_child(p as i32));
            // Reap the executor whenever it exits (no zombies), but never kill it on
            // drop: it owns the task.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
            Started {
                pid,
                pidfd,
                startup: stdout,
                marked: false,
            }
        }
    };
    let line = async {
        let mut line = String::new();
        BufReader::new(startup.take(MAX_REPLY))
            .read_line(&mut line)
            .await
            .map(|_| line)
    };
    let outcome = tokio::time::timeout(STARTUP_TIMEOUT, line).await;
    let text = match outcome {
        Err(_) => {
            // It may be running the task already (a loaded machine): killing it could
            // orphan the task, and removing its directory would hide it. Leave both;
            // the lock says whether it lives, and recovery by id decides.
            return Err(DriverError::Timeout(format!(
                "executor for task {} (pid {}) gave no start-up reply within \
                 {STARTUP_TIMEOUT:?}; it may still start the task, which is then found by \
                 recovering it by id",
                spec.task_id,
                executor_pid.unwrap_or_default()
            )));
        }
        Ok(Err(e)) => {
            let why = format!("reading its start-up reply: {e}");
            return Err(abandon_start(&dir, executor_pidfd, true, &spec.task_id, why).await);
        }
        Ok(Ok(t)) => t,
    };
    // A forked executor marks its start before its reply.
    let text = if marked {
        text.strip_prefix(char::from(super::spawner::STARTED_MARK))
            .map(str::to_owned)
            .unwrap_or(text)
    } else {
        text
    };
    if text.is_empty() {
        let why = "exited without a start-up reply".to_owned();
        return Err(abandon_start(&dir, executor_pidfd, false, &spec.task_id, why).await);
    }
    let reply: Reply = match serde_json::from_str(text.trim_end()) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("bad start-up reply {text:?}: {e}");
            return Err(abandon_start(&dir, executor_pidfd, true, &spec.task_id, why).await);
        }
    };
    match reply {
        Reply {
            status: Some(status),
            ..
        } => Ok(ExecutorHandle { dir, status }),
        Reply { error, kind, .. } => {
            // The executor exits by itself after reporting an error.
            cleanup(&dir);
            let message = error.unwrap_or_else(|| "start-up failed".into());
            Err(match kind {
                Some(ErrorKind::Spawn) => DriverError::InvalidConfig(message),
                _ => {
                    DriverError::Internal(format!("executor for task {}: {message}", spec.task_id))
                }
            })
        }
    }
}

/// Give up on a start whose executor (still `alive`, or gone) gave no start-up reply
/// that can be trusted: stop the executor through its pidfd (never by a pid that may
/// have been reused by now), wait until it is dead, and kill whatever of the task it
/// may have started, by proof ([`crate::lost::kill_unreported_task`]: an executor dies
/// between its task's `execve` and its reply when the OOM killer or an operator's
/// `kill -9` picks it). Only then is the directory removed, and the error is final.
/// Where nothing proves which processes are the task's (or the executor cannot be
/// stopped from here), the directory and lock stay and the error is
/// [`DriverError::Timeout`]: the host then recovers the task by id, which kills it
/// once it can, rather than start it again beside a copy that may run.
async fn abandon_start(
    dir: &Path,
    executor: Option<std::os::fd::OwnedFd>,
    alive: bool,
    task_id: &str,
    why: String,
) -> DriverError {
    let kept = |more: String| {
        DriverError::Timeout(format!(
            "executor for task {task_id}: {why}; {more}; its directory {} stays, and \
             recovering the task by id finds it",
            dir.display()
        ))
    };
    if alive {
        let Some(fd) = &executor else {
            return kept("it cannot be stopped from here and may still start the task".into());
        };
        let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
    }
    let d = dir.to_owned();
    let settled = tokio::task::spawn_blocking(move || {
        // While the executor lives it may still start the task: decide only once it is
        // dead. Its lock goes with it (the task never inherits it).
        if let Some(fd) = &executor
            && !crate::lost::wait_exit(fd, crate::lost::KILL_LIMIT)
        {
            return Err(format!(
                "its executor is still alive {:?} after SIGKILL",
                crate::lost::KILL_LIMIT
            ));
        }
        let deadline = Instant::now() + crate::lost::KILL_LIMIT;
        while files::lock_state(&d).held() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "its executor still holds {} {:?} after its start failed",
                    d.join(LOCK_FILE).display(),
                    crate::lost::KILL_LIMIT
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        crate::lost::kill_unreported_task(&d)
    })
    .await
    .unwrap_or_else(|e| Err(format!("the check of what it left panicked: {e}")));
    match settled {
        Ok(done) => {
            let _ = std::fs::remove_dir_all(dir);
            DriverError::Internal(format!("executor for task {task_id}: {why}; {done}"))
        }
        Err(more) => kept(more),
    }
}

/// An executor just started, forked or executed.
struct Started {
    pid: Option<u32>,
    /// To kill it by if its reply is not understood.
    pidfd: Option<std::os::fd::OwnedFd>,
    /// Its start-up pipe.
    startup: Box<dyn AsyncRead + Unpin + Send>,
    /// Forked: its reply is preceded by [`super::spawner::STARTED_MARK`].
    marked: bool,
}

/// The executor program (the dedicated `drover-executor` if a good one is installed,
/// else the plugin binary again: `/proc/self/exe`, or the host's program for a driver
/// loaded in process, [`drover_plugin_sdk::inproc::executor_program`]), in executor
/// mode, with the directory's lock as stdin. Executor mode is chosen by the environment, not the arguments: it gets
/// none, and an argv[0] of its own (`drover-executor: <task id>`), so that `ps` tells
/// executors from plugins and `pkill -f "plugin serve rawexec"` does not reach them.
/// Its environment is only the executor variables: the task's environment comes from
/// the spec.
fn executor_command(dir: &Path, lock: std::fs::File, task_id: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(super::program::program().exec_path());
    cmd.arg0(format!("{EXECUTOR_ARG0}{task_id}"))
        .env_clear()
        .env(ENV_EXECUTOR_DIR, dir)
        .stdin(Stdio::from(lock))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(false);
    // After env_clear(), which drops explicitly set variables too: set before it, the
    // executor never learnt the original limit and its task kept the plugin's raised one.
    if let Some(original) = fd_headroom() {
        cmd.env(ENV_EXECUTOR_NOFILE, original.to_string());
    }
    super::failpoint::hand_on(&mut cmd);
    cmd
}

/// How an executor's command line starts; the task id follows.
pub const EXECUTOR_ARG0: &str = "drover-executor: ";

/// One task's executor, as a driver talks to it. Every call opens its own connection,
/// so a handle stays valid across executor and plugin restarts; once the executor has
/// exited (after its result was collected) calls are answered from `exit.json`.
///
/// ```no_run
/// # async fn demo() -> Result<(), drover_plugin_sdk::DriverError> {
/// use drover_executor::{ExecutorHandle, state_dir, task_dir};
/// // After a plugin restart, with nothing but the task id:
/// let dir = task_dir(&state_dir(std::path::Path::new("/data/plugin-state"), "rawexec"), "web-1");
/// let task = ExecutorHandle::connect(&dir).await?;
/// if task.info().running() {
///     task.signal(drover_plugin_sdk::Signal::HUP).await?; // to its process group
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ExecutorHandle {
    dir: PathBuf,
    status: ExecutorStatus,
}

/// What a request got: a live executor's answer, or the final status on disk because
/// the executor has exited.
enum Answer {
    Live(ExecutorStatus, Option<TaskStats>),
    Final(ExecutorStatus),
}

impl ExecutorHandle {
    /// Find the executor in `dir` (from a task handle, or [`task_dir`] of the task id)
    /// and ask its status. A task whose executor has exited is found through its
    /// `exit.json`. [`DriverError::NotFound`] says which socket could not be reached
    /// and whether the executor is alive.
    pub async fn connect(dir: &Path) -> Result<Self, DriverError> {
        let _ = fd_headroom();
        let status = match request(dir, Op::Status, CALL_TIMEOUT).await? {
            Answer::Live(s, _) | Answer::Final(s) => s,
        };
        Ok(ExecutorHandle {
            dir: dir.to_owned(),
            status,
        })
    }

    /// The executor directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The task's status when this handle was made (launch or connect).
    pub fn info(&self) -> &ExecutorStatus {
        &self.status
    }

    /// The task's main process id.
    pub fn pid(&self) -> u32 {
        self.status.pid
    }

    /// The task's status now.
    pub async fn status(&self) -> Result<ExecutorStatus, DriverError> {
        match request(&self.dir, Op::Status, CALL_TIMEOUT).await? {
            Answer::Live(s, _) | Answer::Final(s) => Ok(s),
        }
    }

    /// Memory and CPU time of the task's main process, as the executor reads them
    /// (`cpu_percent` is left to the caller, which knows the sampling interval).
    /// [`DriverError::FailedPrecondition`] if the task has exited.
    pub async fn stats(&self) -> Result<TaskStats, DriverError> {
        match request(&self.dir, Op::Stats, CALL_TIMEOUT).await? {
            Answer::Live(_, Some(stats)) => Ok(stats),
            Answer::Live(s, None) => Err(DriverError::Internal(format!(
                "executor of task {} answered stats without any",
                s.task_id
            ))),
            Answer::Final(s) => Err(DriverError::FailedPrecondition(format!(
                "task {} has exited",
                s.task_id
            ))),
        }
    }

    /// Wait for the task to exit; at once if it has. Receiving the result lets the
    /// executor exit (it stays on disk in `exit.json` until [`Self::destroy`]).
    pub async fn wait(&self) -> Result<ExitInfo, DriverError> {
        let status = match request_unbounded(&self.dir, Op::Wait).await? {
            Answer::Live(s, _) | Answer::Final(s) => s,
        };
        exit_of(status, &self.dir)
    }

    /// Send `signal` to the task's process group.
    /// [`DriverError::FailedPrecondition`] if the task has exited.
    pub async fn signal(&self, signal: Signal) -> Result<(), DriverError> {
        let op = Op::Signal {
            signal: signal.as_raw(),
        };
        match request(&self.dir, op, CALL_TIMEOUT).await? {
            Answer::Live(..) => Ok(()),
            Answer::Final(s) => Err(DriverError::FailedPrecondition(format!(
                "task {} has exited",
                s.task_id
            ))),
        }
    }

    /// Send `signal` to the task's process group, SIGKILL the group if it is still
    /// running after `timeout`, and return how it ended. The executor escalates by
    /// itself, so the stop completes even if this caller goes away.
    pub async fn stop(&self, signal: Signal, timeout: Duration) -> Result<ExitInfo, DriverError> {
        let op = Op::Stop {
            signal: signal.as_raw(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        // Beyond the timeout, SIGKILL takes effect at once unless the process is stuck
        // in the kernel; then give up rather than hang.
        let limit = timeout.saturating_add(Duration::from_secs(10));
        let status = match request(&self.dir, op, limit).await? {
            Answer::Live(s, _) | Answer::Final(s) => s,
        };
        exit_of(status, &self.dir)
    }

    /// Kill the task's process group (and its cgroup, when it has one) if it still
    /// runs, remove the executor directory and let the executor exit. Destroying a
    /// task that is already gone is not an error. With the executor dead, what is left
    /// of the task is killed first ([`crate::lost::kill_lost_task`]), and an error
    /// returned (the directory kept) while a copy may still run.
    pub async fn destroy(&self) -> Result<(), DriverError> {
        match request(&self.dir, Op::Destroy, Duration::from_secs(15)).await {
            Ok(Answer::Live(..)) => Ok(()),
            Ok(Answer::Final(_)) => {
                // The executor exited after its task; processes the task left behind
                // may still be in its cgroup.
                let dir = self.dir.clone();
                tokio::task::spawn_blocking(move || crate::lost::empty_plain_cgroup(&dir))
                    .await
                    .map_err(DriverError::internal)?
                    .map_err(DriverError::Internal)?;
                remove_dir(&self.dir)
            }
            Err(DriverError::NotFound(_)) if !self.dir.exists() => Ok(()),
            Err(DriverError::NotFound(_))
                if !files::lock_state(&self.dir).held()
                    && !self.dir.join(super::EXIT_FILE).exists() =>
            {
                // The executor died without a result; its task may run on, unmanaged.
                self.kill_lost_task().await?;
                remove_dir(&self.dir)
            }
            Err(e) => Err(e),
        }
    }

    /// The executor is dead without having reported the task's end: kill what is left
    /// of the task, by proof (its cgroup, else pidfd and start time; see
    /// [`crate::lost`]). Returns what was done; an error while a copy may still run.
    pub async fn kill_lost_task(&self) -> Result<String, DriverError> {
        let s = &self.status;
        crate::lost::kill_lost_task_async(&self.dir, s.pid, s.pgid, s.start_time).await
    }

    /// Whether the executor process is alive (it holds its lock), whether or not its
    /// socket can be reached.
    pub fn executor_alive(&self) -> bool {
        files::lock_state(&self.dir).held()
    }
}

fn remove_dir(dir: &Path) -> Result<(), DriverError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DriverError::Internal(format!(
            "cannot remove {}: {e}",
            dir.display()
        ))),
    }
}

fn exit_of(status: ExecutorStatus, dir: &Path) -> Result<ExitInfo, DriverError> {
    status.exit.ok_or_else(|| {
        DriverError::Internal(format!(
            "executor in {} answered without an exit result",
            dir.display()
        ))
    })
}

async fn request(dir: &Path, op: Op, limit: Duration) -> Result<Answer, DriverError> {
    let what = op_name(&op);
    tokio::time::timeout(limit, request_unbounded(dir, op))
        .await
        .unwrap_or_else(|_| {
            Err(DriverError::Timeout(format!(
                "executor at {} did not answer {what} within {limit:?}",
                socket_path(dir).display()
            )))
        })
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Status => "status",
        Op::Stats => "stats",
        Op::Wait => "wait",
        Op::Signal { .. } => "signal",
        Op::Stop { .. } => "stop",
        Op::Destroy => "destroy",
    }
}

async fn request_unbounded(dir: &Path, op: Op) -> Result<Answer, DriverError> {
    let sock = socket_path(dir);
    let started = Instant::now();
    let stream = loop {
        match tokio::net::UnixStream::connect(&sock).await {
            Ok(s) => break s,
            Err(e) => {
                if let Some(done) = files::read_exit_file(dir)? {
                    return Ok(Answer::Final(done));
                }
                let absent = matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                );
                // Still starting: its socket comes once its task runs.
                let starting = files::lock_state(dir) == files::LockState::Starting;
                if absent && starting && started.elapsed() < STARTUP_TIMEOUT {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                return Err(unreachable(dir, &sock, &e));
            }
        }
    };
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(&Request::new(op)).map_err(DriverError::internal)?;
    line.push(b'\n');
    let mut reply = String::new();
    let exchanged = async {
        write.write_all(&line).await?;
        BufReader::new(read.take(MAX_REPLY))
            .read_line(&mut reply)
            .await
    }
    .await;
    match exchanged {
        Ok(n) if n > 0 => {}
        other => {
            // The executor went away mid-call: it may have exited after another client
            // collected the result, which is then on disk.
            if let Some(done) = files::read_exit_file(dir)? {
                return Ok(Answer::Final(done));
            }
            let why = match other {
                Err(e) => e.to_string(),
                Ok(_) => "connection closed without an answer".into(),
            };
            return Err(DriverError::Unavailable(format!(
                "executor at {} did not answer: {why}",
                sock.display()
            )));
        }
    }
    let reply: Reply = serde_json::from_str(reply.trim_end()).map_err(|e| {
        DriverError::Internal(format!(
            "executor at {} sent a bad reply: {e}",
            sock.display()
        ))
    })?;
    match reply {
        Reply {
            status: Some(s),
            stats,
            ..
        } => Ok(Answer::Live(s, stats)),
        Reply { error, kind, .. } => {
            let m = error.unwrap_or_else(|| "request failed".into());
            Err(match kind {
                Some(ErrorKind::Invalid) => DriverError::InvalidConfig(m),
                Some(ErrorKind::Exited) => DriverError::FailedPrecondition(m),
                _ => DriverError::Internal(format!("executor at {}: {m}", sock.display())),
            })
        }
    }
}

/// The error for an executor that cannot be reached and left no `exit.json`: NotFound
/// when nothing runs under it, FailedPrecondition when the executor is alive (it holds
/// its lock) and so may still run the task.
fn unreachable(dir: &Path, sock: &Path, e: &std::io::Error) -> DriverError {
    if !dir.exists() {
        return DriverError::NotFound(format!(
            "executor directory {} does not exist: the task was never started here, or was \
             destroyed",
            dir.display()
        ));
    }
    let cannot = format!("cannot reach the executor at {}: {e}", sock.display());
    match files::lock_state(dir) {
        files::LockState::Ready(pid) => DriverError::FailedPrecondition(format!(
            "{cannot}; the executor is alive (pid {pid} holds {}) but its socket is gone, \
             and the task has not exited",
            dir.join(LOCK_FILE).display()
        )),
        files::LockState::Starting => DriverError::FailedPrecondition(format!(
            "{cannot}; the executor has been starting for longer than {STARTUP_TIMEOUT:?}"
        )),
        files::LockState::Free if sock.exists() => DriverError::NotFound(format!(
            "{cannot}; the executor is dead and left no exit.json in {}, so the task's exit \
             status is unknown",
            dir.display()
        )),
        files::LockState::Free => DriverError::NotFound(format!(
            "{cannot}; no executor got going in {} (its start was interrupted), so the task \
             never ran",
            dir.display()
        )),
    }
}
