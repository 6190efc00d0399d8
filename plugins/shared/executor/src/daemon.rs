//! The executor process itself: one thread, one `poll` loop, no async runtime.
//!
//! It watches its listening socket, its clients, the task's stdout/stderr pipes and a
//! pidfd of the task. Memory is what matters here (one executor per task), so buffers
//! are small and nothing is allocated per loop beyond the poll list.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, WaitId, WaitIdOptions};

use drover_plugin_sdk::ExitResult;
use drover_plugin_sdk::logs::RotatingWriter;

use super::cgroup::{self, TaskCgroup};
use super::proto::{ErrorKind, Op, Reply, Request};
use super::{
    ExecutorStatus, ExitInfo, LaunchSpec, PROTOCOL_VERSION, SPEC_FILE, Sandbox, files, sandbox,
    socket_path, spawn,
};

/// Bytes read from a task pipe at a time. Small on purpose: the buffer is part of
/// every executor's private memory.
const READ_CHUNK: usize = 16 * 1024;
/// Reads of one pipe per loop turn, so that a task writing without pause cannot starve
/// the socket.
const READS_PER_TURN: usize = 16;
/// Longest request line accepted.
const MAX_REQUEST: usize = 64 * 1024;
/// Clients connected at once; more are turned away (closed at once).
const MAX_CLIENTS: usize = 64;
/// How often a failed write of `exit.json` is retried.
const PERSIST_RETRY: Duration = Duration::from_secs(1);

const SIGKILL: i32 = 9;
/// How long `destroy` waits for a plain task's cgroup to empty after SIGKILL.
const CGROUP_EMPTY: Duration = Duration::from_secs(5);

/// Create the cgroup of the plain task in `dir` and open the files its process writes
/// to join it. A cgroup of that path that still holds processes is an earlier copy of
/// the task (its executor died, and nobody killed it): refused, never joined, so that
/// two copies never run side by side.
fn plain_cgroup(
    dir: &Path,
    task_id: &str,
) -> Result<(Box<dyn TaskCgroup>, cgroup::Join), StartError> {
    let path = cgroup::plain_path(dir);
    if let Some(made) = cgroup::create_plain_v1_quickly(&path) {
        return made.map_err(|e| (ErrorKind::Internal, e));
    }
    let version = cgroup::Version::detect();
    let cg = cgroup::open_plain(version, &path);
    if cg.exists() {
        let left = cg.pids();
        if !left.is_empty() {
            return Err((
                ErrorKind::Internal,
                format!(
                    "an earlier copy of task {task_id} still runs in cgroup {} (processes \
                     {left:?}); destroy the task first",
                    cg.path()
                ),
            ));
        }
        let _ = cg.delete();
    }
    cg.create(&cgroup::Limits::default())
        .map_err(|e| (ErrorKind::Internal, e))?;
    match cgroup::Join::open(&*cg) {
        Ok(join) => Ok((cg, join)),
        Err(e) => {
            let _ = cg.delete();
            Err((ErrorKind::Internal, e))
        }
    }
}

/// Run the executor for the task directory `dir`, isolating with `sandbox` a task that
/// asks for it. Returns the process exit code.
/// `nofile` is the open-file limit to put back (see [`super::ENV_EXECUTOR_NOFILE`]).
pub(crate) fn run(dir: PathBuf, sandbox: Option<&dyn Sandbox>, nofile: Option<u64>) -> i32 {
    // Own session first: from here on a signal to the plugin's process group (the host
    // kills a plugin's whole group) no longer reaches the executor, and the task it
    // starts is not in the plugin's session.
    let _ = rustix::process::setsid();
    // `ps` and `top` show `comm`: executed through a descriptor it would be that
    // descriptor's number.
    let _ = nix::sys::prctl::set_name(c"drover-executor");
    // It waits for its task: an ignored SIGCHLD inherited from above would let the
    // kernel reap the task and lose its exit status.
    super::spawner::default_children();
    close_inherited_fds();
    block_signals();
    restore_fd_limit(nofile);
    let _ = std::env::set_current_dir("/");
    if !dir.is_absolute() {
        report(&Reply::err(
            ErrorKind::Internal,
            format!("executor directory {} is not absolute", dir.display()),
        ));
        return 1;
    }
    // stdin is the directory's lock, taken by the plugin: keep it before stdin goes.
    let lock = files::inherit_lock(&dir);
    // stdout stays the start-up pipe to the plugin until the first line is written.
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    if let Ok(null) = &devnull {
        let _ = rustix::stdio::dup2_stdin(null);
        let _ = rustix::stdio::dup2_stderr(null);
    }
    let executor = match Executor::start(dir.clone(), lock, sandbox) {
        Ok(e) => e,
        Err((kind, message)) => {
            // The socket may have been bound before the failure; the plugin removes
            // the directory itself.
            let _ = std::fs::remove_file(socket_path(&dir));
            report(&Reply::err(kind, message));
            return 1;
        }
    };
    // The spawner's reading of the cgroup mounts served the start; from here on the
    // executor reads them afresh.
    super::cgroup::forget_v1_mounts();
    super::failpoint::die_at("before-reply");
    report(&Reply::ok(executor.status.clone()));
    // Nothing more goes to the plugin: it may be gone by now, and the pipe must close
    // so that it sees the end of the start-up reply.
    if let Ok(null) = &devnull {
        let _ = rustix::stdio::dup2_stdout(null);
    }
    drop(devnull);
    executor.serve()
}

/// Write the start-up line. A plugin that died meanwhile makes this fail; the task is
/// running anyway and can be recovered by its id, so the error is ignored.
fn report(reply: &Reply) {
    if let Ok(mut line) = serde_json::to_vec(reply) {
        line.push(b'\n');
        let mut out = io::stdout().lock();
        let _ = out.write_all(&line).and_then(|()| out.flush());
    }
}

/// The open-file limit to put back, from [`super::ENV_EXECUTOR_NOFILE`].
pub(crate) fn nofile_from_env() -> Option<u64> {
    std::env::var(super::ENV_EXECUTOR_NOFILE)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
}

/// Put back the open-file limit the plugin had before it raised its own (see
/// [`super::ENV_EXECUTOR_NOFILE`]), so the task inherits what the operator set.
fn restore_fd_limit(original: Option<u64>) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Some(original) = original else {
        return;
    };
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(original),
            maximum: limit.maximum,
        },
    );
}

/// Close every descriptor above stderr: the executor lives for as long as its task,
/// and must not keep, say, the plugin's gRPC socket or the agent's pipes open.
pub(crate) fn close_inherited_fds() {
    // One system call where the kernel has it (Linux 5.9): listing /proc/self/fd
    // costs an open, directory reads and a close per descriptor on every task start.
    #[allow(unsafe_code)]
    // SAFETY: close_range(2) takes plain integers; closing descriptors this process
    // does not use is the point (nothing of the executor's above stderr is open yet).
    let closed =
        unsafe { nix::libc::syscall(nix::libc::SYS_close_range, 3u32, u32::MAX, 0u32) == 0 };
    if closed {
        return;
    }
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is in the list; it is closed by now, so closing
    // that number again just fails with EBADF.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// SIGINT and SIGHUP (a terminal going away, a Ctrl-C meant for the agent) must not
/// end the executor, nor SIGTERM (a `pkill` or a service manager aimed at the plugins
/// or the agent: the executor outlives them by design, and a task is stopped through its
/// executor, never by killing it), and a client hanging up must not raise SIGPIPE.
///
/// They are caught by a handler that does nothing, rather than blocked or ignored: a
/// blocked signal stays blocked and an ignored one stays ignored in the task across
/// exec, whereas a caught one reverts to its default there. The poll loop and every
/// read and write already retry on EINTR.
fn block_signals() {
    use nix::sys::signal::{SaFlags, SigHandler, Signal};
    // Async-signal-safe: it does nothing.
    extern "C" fn nothing(_: nix::libc::c_int) {}
    super::spawner::set_disposition(
        &[
            Signal::SIGINT,
            Signal::SIGHUP,
            Signal::SIGTERM,
            Signal::SIGPIPE,
        ],
        SigHandler::Handler(nothing),
        SaFlags::SA_RESTART,
    );
}

/// Memory and CPU time of process `pid`, from `/proc/<pid>/stat`.
fn read_usage(pid: u32) -> io::Result<drover_plugin_sdk::TaskStats> {
    let stat = crate::procfs::read_stat(pid)?;
    Ok(drover_plugin_sdk::TaskStats::default()
        .with_memory_rss_bytes(stat.rss_bytes)
        .with_cpu_time(
            crate::procfs::ticks(stat.utime),
            crate::procfs::ticks(stat.stime),
        ))
}

/// One of the task's output streams.
struct Output {
    pipe: File,
    writer: RotatingWriter,
    what: &'static str,
    /// A write failed (disk full…); noted once, output dropped meanwhile.
    failing: bool,
    closed: bool,
}

enum Pending {
    /// `wait` or `stop`: answer with the status once the task has exited.
    Exit,
    /// `destroy`: answer once the task has exited and the directory is gone.
    Destroy,
}

enum ConnState {
    Reading,
    Waiting(Pending),
    Replying { carries_exit: bool },
    Closed,
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    sent: usize,
    state: ConnState,
}

struct Executor {
    dir: PathBuf,
    /// Held for the executor's whole life: tells live executors from dead ones.
    lock: File,
    listener: UnixListener,
    status: ExecutorStatus,
    /// The task's pidfd while it runs (of its init, with isolation).
    pidfd: Option<OwnedFd>,
    /// A plain task's own cgroup ([`LaunchSpec::own_cgroup`]): every process it
    /// started, whatever its process group or session.
    cgroup: Option<Box<dyn TaskCgroup>>,
    /// With isolation: the pipe on which the task's init reports the task's status.
    init_status: Option<OwnedFd>,
    outputs: Vec<Output>,
    conns: Vec<Conn>,
    /// When a `stop` escalates to SIGKILL.
    kill_at: Option<Instant>,
    escalated: bool,
    /// A stop or destroy was asked: whatever is left of the group goes when the main
    /// process exits.
    kill_leftovers: bool,
    destroying: bool,
    /// A client received the exit result.
    collected: bool,
    /// `exit.json` is on disk.
    durable: bool,
    persist_retry_at: Option<Instant>,
    /// The directory is gone (destroyed, or removed under us): exit once replies are out.
    done: bool,
    /// Next look at whether the directory was removed under an uncollected result.
    orphan_check_at: Option<Instant>,
    /// The buffer output is copied through, [`READ_CHUNK`] bytes once the task first
    /// writes any (many never do: zeroing it at the start cost every executor four
    /// pages).
    chunk: Vec<u8>,
}

/// How often an executor whose task has exited, but whose result nobody collected yet,
/// checks that its directory still exists. Once it is gone (the operator or a test
/// removed the state dir), nobody can ever collect the result: the executor exits
/// instead of lingering forever.
const ORPHAN_CHECK: Duration = Duration::from_secs(5);

type StartError = (ErrorKind, String);

impl Executor {
    fn start(
        dir: PathBuf,
        lock: io::Result<File>,
        sandbox: Option<&dyn Sandbox>,
    ) -> Result<Self, StartError> {
        let internal = |m: String| (ErrorKind::Internal, m);
        let mut lock = lock.map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                internal(format!("another executor already owns {}", dir.display()))
            } else {
                internal(format!(
                    "cannot lock executor directory {}: {e}",
                    dir.display()
                ))
            }
        })?;
        let spec_path = dir.join(SPEC_FILE);
        let spec: LaunchSpec = std::fs::read(&spec_path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            .map_err(|e| internal(format!("cannot read {}: {e}", spec_path.display())))?;

        let sock = socket_path(&dir);
        if !drover_plugin_sdk::handshake::socket_path_fits(&sock) {
            return Err(internal(format!(
                "executor socket path {} is longer than the {} bytes a unix socket allows",
                sock.display(),
                drover_plugin_sdk::handshake::MAX_UNIX_SOCKET_PATH
            )));
        }
        // We hold the lock, so a socket file here is a dead executor's leftover.
        match std::fs::remove_file(&sock) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(internal(format!("cannot remove {}: {e}", sock.display()))),
        }
        let listener = UnixListener::bind(&sock)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| internal(format!("cannot listen on {}: {e}", sock.display())))?;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| internal(format!("cannot restrict {}: {e}", sock.display())))?;

        let open_log = |what: &str, base: &Path| -> Result<Option<RotatingWriter>, StartError> {
            if base.as_os_str().is_empty() {
                return Ok(None);
            }
            RotatingWriter::open(base, spec.logs)
                .map(Some)
                .map_err(|e| {
                    (
                        ErrorKind::Spawn,
                        format!("cannot open the {what} log {}: {e}", base.display()),
                    )
                })
        };
        let (stdout_log, stderr_log) = if spec.stdout_path.parent() != spec.stderr_path.parent()
            || spec.stdout_path.as_os_str().is_empty()
            || spec.stderr_path.as_os_str().is_empty()
        {
            (
                open_log("stdout", &spec.stdout_path)?,
                open_log("stderr", &spec.stderr_path)?,
            )
        } else {
            // Both in one directory (as every driver asks): it is opened and listed
            // once. An error names the file where it is about one file.
            let (out, err) =
                RotatingWriter::open_pair(&spec.stdout_path, &spec.stderr_path, spec.logs)
                    .map_err(|e| {
                        (
                            ErrorKind::Spawn,
                            format!(
                                "cannot open the stdout and stderr logs {} and {}: {e}",
                                spec.stdout_path.display(),
                                spec.stderr_path.display()
                            ),
                        )
                    })?;
            (Some(out), Some(err))
        };
        let (cgroup, join) = if spec.own_cgroup && spec.isolation.is_none() {
            let (cg, join) = plain_cgroup(&dir, &spec.task_id)?;
            (Some(cg), join)
        } else {
            (None, cgroup::Join::default())
        };
        // The task is created between these two readings: where they agree, that is
        // its start time (see `boot_tick_now`).
        let tick_before = crate::procfs::boot_tick_now();
        let spawned = spawn::spawn(
            &spec,
            &dir,
            stdout_log.is_some(),
            stderr_log.is_some(),
            sandbox,
            join,
        )
        .map_err(|m| {
            if let Some(cg) = &cgroup {
                let _ = cg.delete();
            }
            (ErrorKind::Spawn, m)
        })?;
        let tick_after = crate::procfs::boot_tick_now();
        let started_at = SystemTime::now();
        let pid = spawned.pid;
        // The child is not reaped before we wait for it, so its pid cannot be reused
        // between spawn and pidfd_open.
        let raw = i32::try_from(pid).ok().and_then(Pid::from_raw);
        let pidfd = raw
            .ok_or_else(|| std::io::Error::other(format!("bad pid {pid}")))
            .and_then(|p| {
                rustix::process::pidfd_open(p, PidfdFlags::empty()).map_err(io::Error::from)
            });
        let pidfd = match pidfd {
            Ok(fd) => fd,
            Err(e) => {
                // Without a pidfd we could not watch it: take it down again.
                if let Some(p) = raw {
                    let p = nix::unistd::Pid::from_raw(p.as_raw_nonzero().get());
                    let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
                    let _ = nix::sys::wait::waitpid(p, None);
                }
                if let Some(cg) = &cgroup {
                    let _ = cgroup::empty_and_remove(&**cg, CGROUP_EMPTY);
                }
                return Err(internal(format!("cannot watch task process {pid}: {e}")));
            }
        };
        let mut outputs = Vec::with_capacity(2);
        let pipes: [(Option<OwnedFd>, Option<RotatingWriter>, &'static str); 2] = [
            (spawned.stdout, stdout_log, "stdout"),
            (spawned.stderr, stderr_log, "stderr"),
        ];
        for (pipe, writer, what) in pipes {
            if let (Some(pipe), Some(writer)) = (pipe, writer) {
                let _ = rustix::io::ioctl_fionbio(&pipe, true);
                outputs.push(Output {
                    pipe: File::from(pipe),
                    writer,
                    what,
                    failing: false,
                    closed: false,
                });
            }
        }
        let start_time = match (tick_before, tick_after) {
            (Some(before), Some(after)) if before == after => before,
            _ => crate::procfs::process_start_time(pid).unwrap_or(0),
        };
        // From now on a client that finds no socket knows it was removed, rather than
        // not bound yet; and should this executor die before its start-up reply, the
        // plugin can still prove which process is its task.
        let proof = files::TaskProof { pid, start_time };
        if let Err(e) = files::mark_ready(&mut lock, std::process::id(), proof) {
            files::note(
                &dir,
                &format!("cannot write the pid into the lock file: {e}"),
            );
        }
        let status = ExecutorStatus {
            task_id: spec.task_id.clone(),
            pid,
            pgid: pid,
            start_time,
            started_at,
            executor_pid: std::process::id(),
            exit: None,
        };
        Ok(Executor {
            dir,
            lock,
            listener,
            status,
            pidfd: Some(pidfd),
            cgroup,
            init_status: spawned.status,
            outputs,
            conns: Vec::new(),
            kill_at: None,
            escalated: false,
            kill_leftovers: false,
            destroying: false,
            collected: false,
            durable: false,
            persist_retry_at: None,
            done: false,
            orphan_check_at: None,
            chunk: Vec::new(),
        })
    }

    fn running(&self) -> bool {
        self.pidfd.is_some()
    }

    /// The loop. Returns the process exit code.
    fn serve(mut self) -> i32 {
        loop {
            if self.should_exit() {
                // The cgroup goes with its executor when nothing of the task is left:
                // after a stop, whose SIGKILL to the leftovers takes a moment, or when the
                // task left nothing behind. One that still holds processes the task left
                // running stays for `destroy` to empty (the plugin finds it from the
                // directory).
                if let Some(cg) = &self.cgroup
                    && cg.exists()
                {
                    if self.kill_leftovers {
                        let _ = cgroup::empty_and_remove(&**cg, Duration::from_secs(1));
                    } else if cg.pids().is_empty() {
                        let _ = cg.delete();
                    }
                }
                if !self.done {
                    // Clients now find the socket gone and read `exit.json` instead.
                    let _ = std::fs::remove_file(socket_path(&self.dir));
                }
                return 0;
            }
            let timeout = self.next_timeout();
            let has_pidfd = self.pidfd.is_some();
            let revents: Vec<PollFlags> = {
                let mut fds = Vec::with_capacity(2 + self.outputs.len() + self.conns.len());
                fds.push(PollFd::new(&self.listener, PollFlags::IN));
                if let Some(p) = &self.pidfd {
                    fds.push(PollFd::new(p, PollFlags::IN));
                }
                for o in &self.outputs {
                    fds.push(PollFd::new(&o.pipe, PollFlags::IN));
                }
                for c in &self.conns {
                    let events = match c.state {
                        ConnState::Replying { .. } => PollFlags::OUT,
                        _ => PollFlags::IN,
                    };
                    fds.push(PollFd::new(&c.stream, events));
                }
                match rustix::event::poll(&mut fds, timeout.as_ref()) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        files::note(&self.dir, &format!("poll failed: {e}"));
                        // Do not spin on a persistent error.
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                }
                fds.iter().map(PollFd::revents).collect()
            };
            let ready = |f: PollFlags| !f.is_empty();
            let mut at = 1;
            let pidfd_ready = has_pidfd && ready(revents[at]);
            if has_pidfd {
                at += 1;
            }
            for i in 0..self.outputs.len() {
                if ready(revents[at + i]) {
                    self.drain(i, READS_PER_TURN);
                }
            }
            at += self.outputs.len();
            let conn_events: Vec<PollFlags> = revents[at..].to_vec();

            if pidfd_ready {
                self.on_task_exit();
            }
            self.on_timers();
            for (i, ev) in conn_events.into_iter().enumerate() {
                if ev.intersects(PollFlags::OUT) {
                    self.flush(i);
                } else if !ev.is_empty() {
                    self.read_request(i);
                }
            }
            self.conns.retain(|c| !matches!(c.state, ConnState::Closed));
            self.outputs.retain(|o| !o.closed);
            if ready(revents[0]) {
                self.accept();
            }
        }
    }

    fn should_exit(&self) -> bool {
        !self.running()
            && (self.done || (self.durable && self.collected))
            && !self
                .conns
                .iter()
                .any(|c| matches!(c.state, ConnState::Replying { .. }))
    }

    fn next_timeout(&self) -> Option<Timespec> {
        let next = [self.kill_at, self.persist_retry_at, self.orphan_check_at]
            .into_iter()
            .flatten()
            .min()?;
        let d = next.saturating_duration_since(Instant::now());
        Some(Timespec {
            tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(d.subsec_nanos()),
        })
    }

    /// Copy what the task wrote into its log files, at most `reads` chunks.
    fn drain(&mut self, i: usize, reads: usize) {
        let Some(out) = self.outputs.get_mut(i) else {
            return;
        };
        if self.chunk.is_empty() {
            self.chunk.resize(READ_CHUNK, 0);
        }
        for _ in 0..reads {
            match out.pipe.read(&mut self.chunk) {
                Ok(0) => {
                    out.closed = true;
                    return;
                }
                Ok(n) => {
                    if let Err(e) = out.writer.write_all(&self.chunk[..n]) {
                        if !out.failing {
                            files::note(
                                &self.dir,
                                &format!("cannot write the task's {} log: {e}", out.what),
                            );
                        }
                        out.failing = true;
                    } else {
                        out.failing = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    files::note(&self.dir, &format!("reading the task's {}: {e}", out.what));
                    out.closed = true;
                    return;
                }
            }
        }
    }

    fn signal_group(&self, signal: i32) -> Result<(), String> {
        let sig = nix::sys::signal::Signal::try_from(signal)
            .map_err(|_| format!("unknown signal number {signal}"))?;
        let pgid = i32::try_from(self.status.pgid).map_err(|e| e.to_string())?;
        match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(format!("cannot send {sig} to process group {pgid}: {e}")),
        }
    }

    /// SIGKILL the task's process group and, with a cgroup, every process in it (the
    /// freezer or `cgroup.kill`: none escapes by forking or by `setsid`).
    fn kill_everything(&self) {
        let _ = self.signal_group(SIGKILL);
        if let Some(cg) = &self.cgroup
            && let Err(e) = cg.kill_all()
        {
            files::note(&self.dir, &format!("cannot kill the task's cgroup: {e}"));
        }
    }

    /// The pidfd is readable: the task's main process has exited. Reap it, record the
    /// result durably, then answer whoever waits.
    fn on_task_exit(&mut self) {
        let Some(pidfd) = &self.pidfd else {
            return;
        };
        if self.kill_leftovers {
            // Before reaping: the unreaped main process keeps its pid (the group id)
            // from being reused, so this cannot hit an unrelated group.
            self.kill_everything();
        }
        let result = match rustix::process::waitid(
            WaitId::PidFd(pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        ) {
            Ok(Some(st)) => match (st.exit_status(), st.terminating_signal()) {
                (Some(code), _) if st.exited() => ExitResult::code(code),
                (_, Some(sig)) => ExitResult::signaled(sig),
                _ => {
                    ExitResult::unknown(format!("unexpected wait status (code {})", st.raw_code()))
                }
            },
            // Not exited after all.
            Ok(None) => return,
            Err(e) => ExitResult::unknown(format!("cannot collect the task's exit status: {e}")),
        };
        self.pidfd = None;
        // With isolation the child was the task's init: the task's own status is what
        // the init reported before exiting. None if the init itself was killed (then
        // so was the task, and the init's signal is the answer).
        let result = match self
            .init_status
            .take()
            .and_then(|p| sandbox::read_status(&p))
        {
            Some(task) if result.err.is_none() => task,
            _ => result,
        };
        // What the task wrote before exiting is in the pipes: into the logs first, so
        // that a client reading them after `wait` sees everything. A pipe holds at most
        // 64 KiB, so a few reads do; leftover processes may keep writing, hence a bound.
        for i in 0..self.outputs.len() {
            self.drain(i, 64);
        }
        self.kill_at = None;
        // rawexec cannot tell an OOM kill; drivers with a cgroup set `oom_killed` here.
        self.status.exit = Some(ExitInfo {
            result,
            exited_at: SystemTime::now(),
            killed_after_timeout: self.escalated,
        });
        // Durable first, then told. A failed write is retried on a timer; waiting
        // clients are answered anyway, since holding the answer back would not make
        // the disk any less full.
        self.persist();
        let status = self.status.clone();
        for i in 0..self.conns.len() {
            if matches!(self.conns[i].state, ConnState::Waiting(Pending::Exit)) {
                self.reply(i, &Reply::ok(status.clone()), true);
            }
        }
        if self.destroying {
            self.destroy_now();
        }
    }

    /// Write `exit.json`; retried on the timer until it works.
    fn persist(&mut self) {
        match files::write_exit_file(&self.dir, &self.status) {
            Ok(()) => {
                self.durable = true;
                self.persist_retry_at = None;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.dir.exists() => {
                // Our directory was removed: nobody can find this executor any more.
                self.done = true;
                self.persist_retry_at = None;
            }
            Err(e) => {
                if self.persist_retry_at.is_none() {
                    files::note(&self.dir, &format!("cannot write exit.json: {e}"));
                }
                self.persist_retry_at = Some(Instant::now() + PERSIST_RETRY);
            }
        }
    }

    fn on_timers(&mut self) {
        let now = Instant::now();
        if self.kill_at.is_some_and(|t| t <= now) {
            self.kill_at = None;
            if self.running() {
                self.escalated = true;
                self.kill_everything();
            }
        }
        if self.persist_retry_at.is_some_and(|t| t <= now) && !self.running() && !self.durable {
            self.persist();
        }
        if self.running() || self.collected || self.done {
            self.orphan_check_at = None;
        } else if self.orphan_check_at.is_none_or(|t| t <= now) {
            // The lock file is held open from the directory: a link count of 0 means
            // the directory (or the file) was deleted.
            let removed = self.lock.metadata().is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt as _;
                m.nlink() == 0
            });
            if removed {
                self.done = true;
                self.orphan_check_at = None;
            } else {
                self.orphan_check_at = Some(now + ORPHAN_CHECK);
            }
        }
    }

    fn destroy_now(&mut self) {
        if let Some(cg) = &self.cgroup
            && let Err(e) = cgroup::empty_and_remove(&**cg, CGROUP_EMPTY)
        {
            // Processes of the task may still run: keep the directory (and this
            // executor, which can be asked again) rather than forget them.
            files::note(&self.dir, &e);
            let reply = Reply::err(ErrorKind::Internal, e);
            for i in 0..self.conns.len() {
                if matches!(self.conns[i].state, ConnState::Waiting(Pending::Destroy)) {
                    self.reply(i, &reply, false);
                }
            }
            self.destroying = false;
            return;
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => files::note(
                &self.dir,
                &format!("cannot remove {}: {e}", self.dir.display()),
            ),
        }
        self.done = true;
        let status = self.status.clone();
        for i in 0..self.conns.len() {
            if matches!(self.conns[i].state, ConnState::Waiting(Pending::Destroy)) {
                self.reply(i, &Reply::ok(status.clone()), false);
            }
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.conns.len() >= MAX_CLIENTS || stream.set_nonblocking(true).is_err() {
                        continue; // dropped: the client sees the connection close
                    }
                    self.conns.push(Conn {
                        stream,
                        buf: Vec::new(),
                        sent: 0,
                        state: ConnState::Reading,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return, // WouldBlock, or a transient error: poll again
            }
        }
    }

    fn read_request(&mut self, i: usize) {
        let mut tmp = [0u8; 1024];
        loop {
            let conn = &mut self.conns[i];
            match conn.stream.read(&mut tmp) {
                Ok(0) => {
                    // The client hung up (a waiter gave up, or sent nothing).
                    conn.state = ConnState::Closed;
                    return;
                }
                Ok(n) => {
                    if matches!(conn.state, ConnState::Reading) {
                        conn.buf.extend_from_slice(&tmp[..n]);
                        if let Some(end) = conn.buf.iter().position(|&b| b == b'\n') {
                            let line = conn.buf[..end].to_vec();
                            conn.buf.clear();
                            self.handle(i, &line);
                            return;
                        }
                        if conn.buf.len() > MAX_REQUEST {
                            conn.buf.clear();
                            self.reply(
                                i,
                                &Reply::err(ErrorKind::Invalid, "request line too long"),
                                false,
                            );
                            return;
                        }
                    }
                    // Anything after the request is ignored.
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    conn.state = ConnState::Closed;
                    return;
                }
            }
        }
    }

    fn handle(&mut self, i: usize, line: &[u8]) {
        let req: Request = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(e) => {
                let r = Reply::err(ErrorKind::Invalid, format!("bad request: {e}"));
                return self.reply(i, &r, false);
            }
        };
        if req.v > PROTOCOL_VERSION {
            let r = Reply::err(
                ErrorKind::Invalid,
                format!(
                    "request has protocol version {}, this executor speaks {PROTOCOL_VERSION}",
                    req.v
                ),
            );
            return self.reply(i, &r, false);
        }
        let exited = !self.running();
        match req.op {
            Op::Status => self.reply(i, &Reply::ok(self.status.clone()), false),
            Op::Stats if exited => {
                let r = Reply::err(
                    ErrorKind::Exited,
                    format!("task {} has exited", self.status.task_id),
                );
                self.reply(i, &r, false);
            }
            Op::Stats => match read_usage(self.status.pid) {
                Ok(stats) => {
                    let mut r = Reply::ok(self.status.clone());
                    r.stats = Some(stats);
                    self.reply(i, &r, false);
                }
                Err(e) => {
                    let m = format!("cannot read /proc/{}: {e}", self.status.pid);
                    self.reply(i, &Reply::err(ErrorKind::Internal, m), false);
                }
            },
            Op::Wait | Op::Stop { .. } if exited => {
                self.reply(i, &Reply::ok(self.status.clone()), true);
            }
            Op::Wait => self.conns[i].state = ConnState::Waiting(Pending::Exit),
            Op::Signal { .. } if exited => {
                let r = Reply::err(
                    ErrorKind::Exited,
                    format!("task {} has exited", self.status.task_id),
                );
                self.reply(i, &r, false);
            }
            Op::Signal { signal } => match self.signal_group(signal) {
                Ok(()) => self.reply(i, &Reply::ok(self.status.clone()), false),
                Err(m) => self.reply(i, &Reply::err(ErrorKind::Invalid, m), false),
            },
            Op::Stop { signal, timeout_ms } => {
                if let Err(m) = self.signal_group(signal) {
                    return self.reply(i, &Reply::err(ErrorKind::Invalid, m), false);
                }
                self.kill_leftovers = true;
                let deadline = Instant::now() + Duration::from_millis(timeout_ms);
                self.kill_at = Some(self.kill_at.map_or(deadline, |t| t.min(deadline)));
                self.conns[i].state = ConnState::Waiting(Pending::Exit);
            }
            Op::Destroy => {
                self.destroying = true;
                self.kill_leftovers = true;
                self.conns[i].state = ConnState::Waiting(Pending::Destroy);
                if exited {
                    self.destroy_now();
                } else {
                    self.kill_everything();
                }
            }
        }
    }

    /// Queue `reply` on connection `i` and try to send it at once.
    fn reply(&mut self, i: usize, reply: &Reply, carries_exit: bool) {
        let conn = &mut self.conns[i];
        conn.buf.clear();
        conn.sent = 0;
        if serde_json::to_writer(&mut conn.buf, reply).is_err() {
            conn.state = ConnState::Closed;
            return;
        }
        conn.buf.push(b'\n');
        conn.state = ConnState::Replying { carries_exit };
        self.flush(i);
    }

    fn flush(&mut self, i: usize) {
        let conn = &mut self.conns[i];
        let ConnState::Replying { carries_exit } = conn.state else {
            return;
        };
        while conn.sent < conn.buf.len() {
            match conn.stream.write(&conn.buf[conn.sent..]) {
                Ok(n) => conn.sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    conn.state = ConnState::Closed;
                    return;
                }
            }
        }
        if carries_exit {
            self.collected = true;
        }
        conn.state = ConnState::Closed;
    }
}
