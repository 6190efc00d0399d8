//! The executor spawner: a fork server for executors.
//!
//! Starting an executor by `execve` costs most of a task start on a virtual machine:
//! the kernel maps the program, the dynamic loader maps and relocates it and three
//! libraries, the C library probes the CPU (each `cpuid` traps to the hypervisor),
//! and every page touched on the way faults in, while a `fork` of an executor that is
//! already running costs a fraction of that (measured here: 0.79 ms for `posix_spawn`
//! of `drover-executor` and its exit, 0.19 ms for a fork of a small process that
//! touches 50 pages). So a driver starts one executor program in spawner mode, once,
//! and asks it for each task's executor: the spawner forks, and the child becomes the
//! executor of that task exactly as an executed one does ([`crate::daemon::run`]): its
//! own session, only its lock on stdin and the start-up pipe on stdout, every other
//! descriptor closed, the plugin's open-file limit put back.
//!
//! The spawner is the same checked program file as the executors (the dedicated
//! `drover-executor`, or the driver's own binary), started like one: with an empty
//! environment but for [`ENV_SPAWNER_SOCKET`], and stdin a `SOCK_SEQPACKET` socket
//! whose other end only the driver holds (no path in the filesystem). It is
//! single-threaded, holds nothing of the driver's, reaps the executors it forked (once
//! a second: at the latest two seconds after they exit), and exits when the driver's
//! end closes (the driver exited): the executors it started live on, as executors
//! always outlived their driver.
//!
//! One request, one datagram: its number, the task id and the executor directory, the
//! open-file limit to put back, and two descriptors (the directory's lock and the write
//! end of the start-up pipe) as `SCM_RIGHTS`. One answer: the request's number and the
//! executor's pid, with a pidfd of it opened before it could be reaped (so the driver
//! never signals a reused pid), or an errno. The executor writes
//! [`STARTED_MARK`] on the pipe before anything else, then its start-up line.
//! Everything after that (the start-up line, the task) is the same as for an executor
//! that was executed directly. A spawner that cannot be reached, or answers that its
//! fork failed, has started nothing: the driver executes that executor itself. One
//! that was sent the request but gave no answer (it died, or took over 2 s) may have
//! forked: it is killed, and the start-up pipe decides, since only an executor it
//! forked can still hold its write end. A line on it is that executor's reply; an end
//! after the mark alone is an executor that died (the start failed, and is not
//! retried); an end with nothing on it means no executor ever ran, and the driver
//! executes one itself. Never both: a task never gets two executors. The next task
//! gets a new spawner. So does the next task after a spawner exited between requests
//! (killed from outside, say): the driver reaps a spawner the moment it exits, and
//! sees through its pidfd that it has.
//!
//! The spawner forks one executor ahead of time, a spare (`drover-executor: spare` in
//! `ps`), which waits on a socket of its own: a request goes to it, with its two
//! descriptors, and the spawner answers with the spare's pid and pidfd, then forks the
//! next spare. A start thus waits for no fork. A spare that is gone (killed while it
//! waited) takes nothing with it: the request is forked for as before. A spare exits
//! when its spawner does.
//!
//! Executors forked by one spawner share its address-space layout, stack-protector
//! canary and hash seeds (made once, at the spawner's `execve`). An executor holds no
//! secret, and a task cannot read its executor's memory; `DROVER_EXECUTOR_SPAWNER=off`
//! in the driver's environment executes every executor afresh instead.

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tokio::io::unix::AsyncFd;

use super::sandbox::Sandbox;

/// Set (to `0`, the descriptor of its request socket) in the environment of an
/// executor program started as a spawner. Internal: only a driver sets it, for its
/// own spawner.
pub(crate) const ENV_SPAWNER_SOCKET: &str = "DROVER_EXECUTOR_SPAWNER_FD";

/// In a driver's environment, `off` (or `0`, `false`, `no`) makes the driver execute
/// every executor directly instead of forking it from a spawner.
///
/// ```
/// assert_eq!(drover_executor::ENV_EXECUTOR_SPAWNER, "DROVER_EXECUTOR_SPAWNER");
/// ```
pub const ENV_EXECUTOR_SPAWNER: &str = "DROVER_EXECUTOR_SPAWNER";

/// What the spawner's command line says, and room behind it for an executor's
/// (`drover-executor: <task id>`, a task id being at most 128 bytes): a forked
/// executor writes its own over it.
const SPAWNER_ARG0: &str = "drover-executor: spawner";
const ARG0_ROOM: usize = super::client::EXECUTOR_ARG0.len() + 128;

/// Version of the request datagram.
const REQUEST_VERSION: u8 = 1;
/// Largest request: the version, its number, the limit, the id's length, a 128-byte
/// id and a directory path.
const MAX_REQUEST: usize = 1 + 4 + 8 + 1 + 128 + 4096;
/// No limit to put back.
const NO_NOFILE: u64 = u64::MAX;

/// How long a driver waits for the spawner's answer (a fork) before it gives up on
/// this spawner and executes the executor itself.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------
// The spawner process.

/// Run as the spawner on the request socket `fd` (stdin) and return the exit code:
/// 0 once the driver's end is closed.
pub(crate) fn serve(sandbox: Option<&dyn Sandbox>) -> i32 {
    name_process(SPAWNER_ARG0.as_bytes());
    // Only the request socket (stdin) and /dev/null (stdout, stderr) are the
    // spawner's: whatever else the driver's exec left open must not reach executors.
    super::daemon::close_inherited_fds();
    let _ = std::env::set_current_dir("/");
    let socket_ok = rustix::net::sockopt::socket_type(rustix::stdio::stdin())
        .is_ok_and(|t| t == SocketType::SEQPACKET);
    if !socket_ok {
        eprintln!(
            "drover-executor: {ENV_SPAWNER_SOCKET} is set, but stdin is not a spawner's \
             request socket; only a Drover driver starts a spawner"
        );
        return 2;
    }
    ignore_terminal_signals_and_sigpipe();
    // Reaping is this process's own (see `reap_exited`): SIGCHLD at its default
    // whatever the driver's parent left it at.
    default_children();
    let mut buf = vec![0u8; MAX_REQUEST];
    let requests = rustix::stdio::stdin();
    super::cgroup::remember_v1_mounts();
    // Work every executor does once, done here once for all of them: they are forked
    // from this process and inherit the result. sha2 asks the CPU for its features
    // (`cpuid`, which traps to the hypervisor on a virtual machine) at its first use.
    let _ = super::task_dir(Path::new("/"), "");
    let mut spare = fork_spare(sandbox, &mut buf);
    let mut chores_done = std::time::Instant::now();
    loop {
        // Once a second, busy or idle:
        // - the mounts the next executors start with are read again;
        // - executors that exited are reaped (at the latest two seconds after they
        //   exit): until then they are zombies, which keeps their pid from being reused
        //   while a driver may still hold it (it holds a pidfd, see `fork_executor`).
        //   Not at every request: each `waitpid` walks every child, a thousand of them
        //   with a thousand tasks.
        if chores_done.elapsed() >= CHORES_EVERY {
            super::cgroup::remember_v1_mounts();
            reap_exited();
            chores_done = std::time::Instant::now();
        }
        let mut ready = [rustix::event::PollFd::new(
            &requests,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut ready, Some(&timeout)) {
            // A second without a request: the chores above are due.
            Ok(0) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return 1,
        }
        let request = match receive(requests, &mut buf) {
            Ok(Some(r)) => r,
            // The driver closed its end: it exited.
            Ok(None) => return 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return 1,
        };
        let (sequence, answer, pidfd) = match request {
            Ok(request) => {
                let sequence = request.sequence;
                let handed = match spare.take() {
                    Some(s) => s.hand(request),
                    None => Err(request),
                };
                match handed.or_else(|request| fork_executor(request, sandbox)) {
                    Ok((pid, pidfd)) => (sequence, pid, pidfd),
                    Err(errno) => (sequence, -errno, None),
                }
            }
            Err((sequence, errno)) => (sequence, -errno.raw_os_error(), None),
        };
        if send_answer(sequence, answer, pidfd.as_ref()).is_err() {
            return 1;
        }
        // Not to be inherited by the next spare.
        drop(pidfd);
        // After the answer, so that the fork is not in the start's way.
        if spare.is_none() {
            spare = fork_spare(sandbox, &mut buf);
        }
    }
}

/// How often the spawner reads the mounts again and reaps its exited executors.
const CHORES_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What a spare's command line says until it is given a task.
const SPARE_ARG0: &str = "drover-executor: spare";

/// An executor forked ahead of its request, waiting on a socket of its own for it, so
/// that the fork (and what the child does before it needs its task) is not part of a
/// task's start. One at a time; the spawner forks the next after it answered.
struct Spare {
    pid: i32,
    pidfd: Option<OwnedFd>,
    /// The spawner's end: the request goes here. Closed, it ends the spare (the
    /// spawner exited, or never needed it).
    socket: OwnedFd,
}

impl Spare {
    /// Give `request` to this spare: its pid and pidfd, or the request back when the
    /// spare is gone (then it saw nothing of it).
    fn hand(self, request: SpawnRequest) -> Result<(i32, Option<OwnedFd>), SpawnRequest> {
        let bytes = encode_request(
            request.sequence,
            &request.task_id,
            &request.dir,
            request.nofile,
        );
        let fds = [request.lock.as_fd(), request.startup.as_fd()];
        match send_datagram(self.socket.as_fd(), &bytes, &fds) {
            // Delivered whole (a datagram): the spare has the only copies that count
            // now, ours close with `request`.
            Ok(()) => Ok((self.pid, self.pidfd)),
            // A spare that died (EPIPE) or is killed later is reaped by `reap_exited`;
            // this request goes to a fresh fork.
            Err(_) => Err(request),
        }
    }
}

/// Fork a spare executor (see [`Spare`]); `None` if the fork failed (requests are then
/// forked as they come).
/// `buf` is the spawner's request buffer: the spare receives its request into its copy
/// of it, rather than allocate one (a first large allocation in a forked child makes
/// the C library consolidate the free chunks it inherited, writing to, and so
/// copying, a dozen of the spawner's heap pages).
fn fork_spare(sandbox: Option<&dyn Sandbox>, buf: &mut [u8]) -> Option<Spare> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    // SAFETY: as in `fork_executor`: single-threaded, and the child never returns
    // into the spawner's loop.
    #[allow(unsafe_code)]
    let forked = unsafe { nix::unistd::fork() };
    match forked {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ours);
            std::process::exit(spare_child(theirs, sandbox, buf))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(theirs);
            let pidfd = super::lost::pidfd_of_child(child.as_raw());
            Some(Spare {
                pid: child.as_raw(),
                pidfd,
                socket: ours,
            })
        }
        Err(_) => None,
    }
}

/// In a spare: wait for a request on `socket`, then become its executor exactly as a
/// child forked for it does. Exits 0 when the spawner closes its end first.
fn spare_child(socket: OwnedFd, sandbox: Option<&dyn Sandbox>, buf: &mut [u8]) -> i32 {
    name_process(SPARE_ARG0.as_bytes());
    // The request socket is the spawner's alone: /dev/null (the spawner's stdout) in
    // its place until the lock comes. A spare that kept it would hide the driver's exit
    // from the spawner.
    if rustix::stdio::dup2_stdin(rustix::stdio::stdout()).is_err() {
        return 1;
    }
    loop {
        match receive(socket.as_fd(), buf) {
            Ok(Some(Ok(request))) => {
                drop(socket);
                return executor_child(request, sandbox);
            }
            Err(rustix::io::Errno::INTR) => continue,
            // The spawner is gone (or sent what it never sends): nothing to do.
            Ok(None) => return 0,
            Ok(Some(Err(_))) | Err(_) => return 1,
        }
    }
}

/// Reap every executor of this spawner that has exited.
fn reap_exited() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// A request as received: the descriptors are owned, and closed in the spawner once
/// the child has its copies.
struct SpawnRequest {
    sequence: u32,
    task_id: Vec<u8>,
    dir: PathBuf,
    nofile: Option<u64>,
    lock: OwnedFd,
    startup: OwnedFd,
}

/// A request that cannot be served: its number (0 when unreadable) and why.
type Refused = (u32, rustix::io::Errno);

/// Read one request; `None` at the end of the stream. A request that is malformed
/// (truncated, the wrong number of descriptors) is answered `EINVAL`.
fn receive(
    from: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
) -> Result<Option<Result<SpawnRequest, Refused>>, rustix::io::Errno> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        from,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let truncated = msg
        .flags
        .intersects(rustix::net::ReturnFlags::TRUNC | rustix::net::ReturnFlags::CTRUNC);
    let Some((sequence, task_id, dir, nofile)) = parse_request(&buf[..msg.bytes]) else {
        return Ok(Some(Err((0, rustix::io::Errno::INVAL))));
    };
    let fds: Result<[OwnedFd; 2], _> = fds.try_into();
    match fds {
        Ok([lock, startup]) if !truncated => Ok(Some(Ok(SpawnRequest {
            sequence,
            task_id,
            dir,
            nofile,
            lock,
            startup,
        }))),
        _ => Ok(Some(Err((sequence, rustix::io::Errno::INVAL)))),
    }
}

/// The request's fields: version, its number (echoed in the answer), open-file limit
/// (little-endian, [`NO_NOFILE`] for none), the task id's length and bytes, then the
/// directory, which must be absolute.
fn encode_request(sequence: u32, task_id: &[u8], dir: &Path, nofile: Option<u64>) -> Vec<u8> {
    let dir = dir.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(14 + task_id.len() + dir.len());
    out.push(REQUEST_VERSION);
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&nofile.unwrap_or(NO_NOFILE).to_le_bytes());
    // Task ids are at most 128 bytes (validate_task_id); a longer one is cut.
    let id = &task_id[..task_id.len().min(128)];
    out.push(id.len() as u8);
    out.extend_from_slice(id);
    out.extend_from_slice(dir);
    out
}

/// What [`encode_request`] made: (number, task id, directory, open-file limit).
type Request = (u32, Vec<u8>, PathBuf, Option<u64>);

fn parse_request(bytes: &[u8]) -> Option<Request> {
    let (&version, rest) = bytes.split_first()?;
    if version != REQUEST_VERSION {
        return None;
    }
    let (sequence, rest) = rest.split_at_checked(4)?;
    let sequence = u32::from_le_bytes(sequence.try_into().ok()?);
    let (limit, rest) = rest.split_at_checked(8)?;
    let nofile = u64::from_le_bytes(limit.try_into().ok()?);
    let (&id_len, rest) = rest.split_first()?;
    let (id, dir) = rest.split_at_checked(usize::from(id_len))?;
    let dir = PathBuf::from(OsString::from_vec(dir.to_vec()));
    if !dir.is_absolute() || id.len() > 128 {
        return None;
    }
    Some((
        sequence,
        id.to_vec(),
        dir,
        (nofile != NO_NOFILE).then_some(nofile),
    ))
}

/// An answer: the request's number, then the pid or a negative errno.
const ANSWER_LEN: usize = 8;

fn encode_answer(sequence: u32, answer: i32) -> [u8; ANSWER_LEN] {
    let mut out = [0u8; ANSWER_LEN];
    out[..4].copy_from_slice(&sequence.to_le_bytes());
    out[4..].copy_from_slice(&answer.to_le_bytes());
    out
}

fn decode_answer(bytes: [u8; ANSWER_LEN]) -> (u32, i32) {
    let mut sequence = [0u8; 4];
    let mut answer = [0u8; 4];
    sequence.copy_from_slice(&bytes[..4]);
    answer.copy_from_slice(&bytes[4..]);
    (u32::from_le_bytes(sequence), i32::from_le_bytes(answer))
}

fn send_answer(sequence: u32, answer: i32, pidfd: Option<&OwnedFd>) -> rustix::io::Result<()> {
    let fds: Vec<std::os::fd::BorrowedFd<'_>> = pidfd.iter().map(|f| f.as_fd()).collect();
    send_datagram(
        rustix::stdio::stdin(),
        &encode_answer(sequence, answer),
        &fds,
    )
}

/// Send `bytes` as one datagram on `to` with `fds` (at most two) as `SCM_RIGHTS`,
/// blocking; a closed peer is `EPIPE`, never a signal.
fn send_datagram(
    to: std::os::fd::BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> rustix::io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(rustix::io::Errno::INVAL);
    }
    loop {
        match rustix::net::sendmsg(
            to,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return other.map(|_| ()),
        }
    }
}

/// Fork the executor of `request`: its pid and a pidfd of it, or the errno of the
/// failed fork.
///
/// The pidfd is opened before this spawner could have reaped the child (only
/// `reap_exited` does, later), so it is of that child for certain, and its driver
/// signals it through that, never by a pid that may have been reused.
fn fork_executor(
    request: SpawnRequest,
    sandbox: Option<&dyn Sandbox>,
) -> Result<(i32, Option<OwnedFd>), i32> {
    // SAFETY: the spawner is single-threaded (it never starts a thread, and is
    // executed fresh by the driver), so the child is a complete copy of it, with no
    // lock held by another thread; the child runs the executor and exits, never
    // returning into this loop.
    #[allow(unsafe_code)]
    let forked = unsafe { nix::unistd::fork() };
    match forked {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = executor_child(request, sandbox);
            std::process::exit(code)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let pidfd = super::lost::pidfd_of_child(child.as_raw());
            Ok((child.as_raw(), pidfd))
        }
        Err(errno) => Err(errno as i32),
    }
}

/// The byte a forked executor writes to its start-up pipe before anything else: with
/// it, the driver tells "no executor ever ran" (the pipe ends empty) from "it ran and
/// died before its reply" (the pipe ends after this byte), which matters when the
/// spawner gave no answer (see [`Outcome::Unanswered`]).
pub(crate) const STARTED_MARK: u8 = b'+';

/// In the forked child: become the executor of `request`, as an executed executor
/// starts (stdin the lock, stdout the start-up pipe, stderr /dev/null as the
/// spawner's), and run it.
fn executor_child(request: SpawnRequest, sandbox: Option<&dyn Sandbox>) -> i32 {
    default_children();
    let mut title = super::client::EXECUTOR_ARG0.as_bytes().to_vec();
    title.extend_from_slice(&request.task_id);
    name_process(&title);
    // The request socket (stdin) goes: replaced by the lock.
    if rustix::stdio::dup2_stdin(&request.lock).is_err()
        || rustix::stdio::dup2_stdout(&request.startup).is_err()
    {
        return 1;
    }
    drop(request.lock);
    drop(request.startup);
    // A driver that is gone by now needs no mark; the executor carries on either way.
    let _ = rustix::io::write(rustix::stdio::stdout(), &[STARTED_MARK]);
    super::daemon::run(request.dir, sandbox, request.nofile)
}

/// Set the disposition of `signals` to `handler` (`SIG_IGN`, `SIG_DFL`, or a handler
/// that is async-signal-safe), in this single-threaded process.
pub(crate) fn set_disposition(
    signals: &[nix::sys::signal::Signal],
    handler: nix::sys::signal::SigHandler,
    flags: nix::sys::signal::SaFlags,
) {
    use nix::sys::signal::{SigAction, SigSet, sigaction};
    let action = SigAction::new(handler, flags, SigSet::empty());
    for &s in signals {
        // SAFETY: every caller passes SIG_IGN, SIG_DFL or a handler that is
        // async-signal-safe, and the process is single-threaded.
        #[allow(unsafe_code)]
        let _ = unsafe { sigaction(s, &action) };
    }
}

/// A Ctrl-C or hang-up of the agent's terminal reaches its whole process group, the
/// spawner with it: as plugins do, the spawner stays (each executor catches both
/// itself). A closed start-up pipe is an EPIPE error, never a signal, for the spawner
/// and for an executor's first write (its mark) alike, as for an executor executed by
/// the `drover` binary; each executor then installs its own handler (`daemon::run`).
fn ignore_terminal_signals_and_sigpipe() {
    use nix::sys::signal::{SaFlags, SigHandler, Signal};
    set_disposition(
        &[Signal::SIGINT, Signal::SIGHUP, Signal::SIGPIPE],
        SigHandler::SigIgn,
        SaFlags::empty(),
    );
}

/// An executor waits for its task: `SIGCHLD` at its default (as the spawner has it; set
/// again should that ever change), or the kernel would reap the task and its exit
/// status would be lost.
pub(crate) fn default_children() {
    use nix::sys::signal::{SaFlags, SigHandler, Signal};
    set_disposition(&[Signal::SIGCHLD], SigHandler::SigDfl, SaFlags::empty());
}

/// How long argv[0] was when this process started (the spawner measures it before it
/// first renames itself; its forked executors inherit the figure), 0 until measured.
static ARG0_LEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Name this process for `ps` and `top`: `comm` (what a spawner executed through a
/// descriptor would otherwise show: the descriptor's number) and its command line,
/// written over the room its `argv[0]` has ([`ARG0_ROOM`] for a spawner and its
/// executors). The byte that ended `argv[0]` is overwritten too, so that the kernel
/// reads the command line up to the new end (as for `setproctitle`).
fn name_process(title: &[u8]) {
    let _ = nix::sys::prctl::set_name(c"drover-executor");
    #[allow(unsafe_code)]
    unsafe extern "C" {
        // glibc's pointer to argv[0], the first byte of the command-line area.
        static mut program_invocation_name: *mut std::ffi::c_char;
    }
    // SAFETY: glibc sets `program_invocation_name` to argv[0] before `main` and this
    // process never changes it; argv[0]'s bytes (and its NUL) are the process's own,
    // writable memory at the top of the stack, read by nothing else in this
    // single-threaded process but Rust's `std::env::args`, which the executor does not
    // call. Writes stay within argv[0]'s original length, its NUL included.
    #[allow(unsafe_code)]
    unsafe {
        let start = program_invocation_name.cast::<u8>();
        if start.is_null() {
            return;
        }
        let mut room = ARG0_LEN.load(std::sync::atomic::Ordering::Relaxed);
        if room == 0 {
            room = std::ffi::CStr::from_ptr(start.cast()).to_bytes().len();
            ARG0_LEN.store(room, std::sync::atomic::Ordering::Relaxed);
        }
        if room < ARG0_ROOM || title.len() >= room {
            return;
        }
        std::ptr::copy_nonoverlapping(title.as_ptr(), start, title.len());
        // The new end, then filler up to where argv[0] ended; its old NUL becomes a
        // space, which tells the kernel the area was rewritten.
        *start.add(title.len()) = 0;
        for i in title.len() + 1..=room {
            *start.add(i) = b' ';
        }
    }
}

// ---------------------------------------------------------------------------------
// The driver's side.

/// Whether this driver forks executors from a spawner ([`ENV_EXECUTOR_SPAWNER`]).
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let off = std::env::var(ENV_EXECUTOR_SPAWNER).is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "off" | "0" | "false" | "no"
            )
        });
        !off
    })
}

/// A running spawner, as its driver holds it. Killed when dropped: a spawner that
/// stopped answering is replaced.
struct Spawner {
    socket: AsyncFd<OwnedFd>,
    /// Number of the last request sent.
    sequence: u32,
    /// How it is watched and killed.
    process: SpawnerProcess,
}

/// The spawner process. With a pidfd, a task of the driver's runtime waits for it (it
/// is reaped the moment it exits, whoever killed it) and the pidfd tells that it has
/// exited and kills it; without one (a kernel before 5.3), the child handle kills it
/// when dropped and it is reaped after. Either way the end of the driver's runtime
/// kills it (the waiting task's child handle goes), as the driver's exit would end it:
/// its executors are sessions of their own and live on.
enum SpawnerProcess {
    Watched(OwnedFd),
    Held { _child: tokio::process::Child },
}

impl Spawner {
    /// Whether the spawner has exited (killed from outside, say): the next request
    /// then goes to a new one rather than to a socket nobody reads.
    fn exited(&self) -> bool {
        match &self.process {
            SpawnerProcess::Watched(pidfd) => super::lost::wait_exit(pidfd, Duration::ZERO),
            SpawnerProcess::Held { .. } => false,
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        if let SpawnerProcess::Watched(pidfd) = &self.process {
            // A pidfd names this process alone, so an exited (even reaped) one's pid
            // reused since is never signalled.
            let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
        }
    }
}

/// The driver's spawner, started at its first executor.
fn slot() -> &'static tokio::sync::Mutex<Option<Spawner>> {
    static SLOT: OnceLock<tokio::sync::Mutex<Option<Spawner>>> = OnceLock::new();
    SLOT.get_or_init(|| tokio::sync::Mutex::new(None))
}

/// What asking the spawner came to.
pub(crate) enum Outcome {
    /// Forked: the executor's pid and the read end of its start-up pipe.
    Spawned {
        pid: u32,
        /// Opened by the spawner before the executor could be reaped.
        pidfd: Option<OwnedFd>,
        startup: tokio::net::unix::pipe::Receiver,
    },
    /// No executor was forked for this request (the request never reached a spawner,
    /// or it answered that its fork failed): the caller executes one itself.
    NotForked(std::io::Error),
    /// The request reached the spawner but no answer came (it died, or was too slow:
    /// it is killed now). It may have forked an executor before that, which then holds
    /// the only write end of `startup` left: a line on it is that executor's start-up
    /// reply; the end of it without a line means no executor of this task exists.
    Unanswered {
        startup: tokio::net::unix::pipe::Receiver,
        why: std::io::Error,
    },
}

/// Ask this driver's spawner (started now if there is none) for the executor of
/// `task_id` in `dir`, with `lock` as its stdin.
///
/// The spawner is out of the driver's hands while a request is in flight: a caller
/// cancelled half-way drops it (and so kills it), so that no answer is ever left
/// behind on its socket for the next request to read. Each answer also echoes its
/// request's number.
pub(crate) async fn spawn(
    dir: &Path,
    lock: &std::fs::File,
    task_id: &str,
    nofile: Option<u64>,
) -> Outcome {
    let (read, write) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(p) => p,
        Err(e) => return Outcome::NotForked(e.into()),
    };
    let startup = match tokio::net::unix::pipe::Receiver::from_owned_fd(read) {
        Ok(r) => r,
        Err(e) => return Outcome::NotForked(e),
    };
    let mut slot = slot().lock().await;
    let mut spawner = match slot.take().filter(|s| !s.exited()) {
        Some(s) => s,
        None => match start_spawner() {
            Ok(s) => s,
            Err(e) => return Outcome::NotForked(e),
        },
    };
    spawner.sequence = spawner.sequence.wrapping_add(1);
    let request = encode_request(spawner.sequence, task_id.as_bytes(), dir, nofile);
    if let Err(e) = send(&spawner, &request, [lock.as_fd(), write.as_fd()]).await {
        // Nothing reached it: a dead spawner (EPIPE), and it is dropped.
        return Outcome::NotForked(e);
    }
    // From here on the spawner may have forked; only its answer, or the pipe, says.
    drop(write);
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, answer(&spawner)).await;
    let why = match answer {
        Ok(Ok((sequence, answer, pidfd))) if sequence == spawner.sequence => {
            *slot = Some(spawner);
            if answer <= 0 {
                return Outcome::NotForked(std::io::Error::from_raw_os_error(-answer));
            }
            return Outcome::Spawned {
                pid: answer as u32,
                pidfd,
                startup,
            };
        }
        Ok(Ok((sequence, _, _))) => std::io::Error::other(format!(
            "the executor spawner answered request {sequence} to request {}",
            spawner.sequence
        )),
        Ok(Err(e)) => e,
        Err(_) => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the executor spawner gave no answer within {ANSWER_TIMEOUT:?}"),
        ),
    };
    // Killed with its process handle: its copy of the pipe closes.
    drop(spawner);
    Outcome::Unanswered { startup, why }
}

/// Send one request with its two descriptors.
async fn send(
    spawner: &Spawner,
    request: &[u8],
    fds: [std::os::fd::BorrowedFd<'_>; 2],
) -> std::io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("descriptor message does not fit"));
    }
    loop {
        let mut ready = spawner.socket.writable().await?;
        match ready.try_io(|fd| {
            rustix::net::sendmsg(
                fd,
                &[IoSlice::new(request)],
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            )
            .map_err(std::io::Error::from)
        }) {
            Ok(sent) => return sent.map(|_| ()),
            Err(_would_block) => continue,
        }
    }
}

/// Read one answer: the request's number, the pid or a negative errno, and the
/// executor's pidfd.
async fn answer(spawner: &Spawner) -> std::io::Result<(u32, i32, Option<OwnedFd>)> {
    loop {
        let mut ready = spawner.socket.readable().await?;
        let mut answer = [0u8; ANSWER_LEN];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        match ready.try_io(|fd| {
            rustix::net::recvmsg(
                fd,
                &mut [IoSliceMut::new(&mut answer)],
                &mut control,
                RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)
        }) {
            Ok(Ok(msg)) if msg.bytes == ANSWER_LEN => {
                let mut fds: Vec<OwnedFd> = Vec::new();
                for message in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(rights) = message {
                        fds.extend(rights);
                    }
                }
                let (sequence, answer) = decode_answer(answer);
                return Ok((sequence, answer, fds.pop()));
            }
            Ok(Ok(_)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the executor spawner closed its socket (it exited)",
                ));
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Execute the executor program as a spawner, on a fresh socket pair.
fn start_spawner() -> std::io::Result<Spawner> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    // The spawner blocks on its end.
    rustix::io::ioctl_fionbio(&theirs, false)?;
    let mut arg0 = String::from(SPAWNER_ARG0);
    // Room for an executor's name over it (see `name_process`).
    while arg0.len() < ARG0_ROOM + 1 {
        arg0.push(' ');
    }
    // Registered before the spawn, so that no failure leaves a spawner without its
    // `Spawner` (whose drop kills it).
    // SAFETY: the descriptor is owned by the AsyncFd, open and unchanged until it is
    // dropped.
    #[allow(unsafe_code)]
    let socket = unsafe { AsyncFd::register(ours) }.map_err(std::io::Error::from)?;
    let mut cmd = tokio::process::Command::new(super::program::program().exec_path());
    cmd.arg0(arg0)
        .env_clear()
        .env(ENV_SPAWNER_SOCKET, "0")
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    super::failpoint::hand_on(&mut cmd);
    let mut child = cmd.spawn()?;
    let pidfd = child
        .id()
        .and_then(|pid| super::lost::pidfd_of_child(pid as i32));
    // Still unreaped after the pidfd was opened (as nothing else of this driver reaps
    // it, unless SIGCHLD is ignored and the kernel does): the pidfd is the spawner's,
    // not that of a process that got its pid since.
    let pidfd = match child.try_wait() {
        Ok(None) => pidfd,
        Ok(Some(status)) => {
            return Err(std::io::Error::other(format!(
                "the executor spawner exited at once ({status})"
            )));
        }
        Err(e) => {
            // Reaped by someone else: its pid may be another process's already, which
            // the child handle's `kill_on_drop` would signal.
            std::mem::forget(child);
            return Err(std::io::Error::other(format!(
                "the executor spawner was reaped by another ({e})"
            )));
        }
    };
    let process = match pidfd {
        Some(pidfd) => {
            tokio::spawn(async move {
                if child.wait().await.is_err() {
                    // Not this driver's to reap any more (someone else did: a SIGCHLD
                    // ignored, which plugins on the SDK set back at start): its pid may
                    // be another process's by now, which `kill_on_drop` would signal.
                    // The pidfd still kills the spawner, if it lives.
                    std::mem::forget(child);
                }
            });
            SpawnerProcess::Watched(pidfd)
        }
        None => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "no pidfd of the executor spawner (a kernel before 5.3, or the call is \
                     filtered): a spawner killed from outside stays a zombie until the next \
                     task start, which then executes its executor directly"
                );
            });
            SpawnerProcess::Held { _child: child }
        }
    };
    Ok(Spawner {
        socket,
        sequence: 0,
        process,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let bytes = encode_request(7, b"web-1", Path::new("/data/x/0123"), Some(1024));
        let (sequence, id, dir, nofile) = parse_request(&bytes).unwrap();
        assert_eq!(sequence, 7);
        assert_eq!(id, b"web-1");
        assert_eq!(dir, Path::new("/data/x/0123"));
        assert_eq!(nofile, Some(1024));
        let bytes = encode_request(1, b"a", Path::new("/d"), None);
        assert_eq!(parse_request(&bytes).unwrap().3, None);
        assert_eq!(decode_answer(encode_answer(9, -11)), (9, -11));
    }

    #[test]
    fn malformed_requests_are_refused() {
        assert!(parse_request(&[]).is_none());
        assert!(parse_request(&[9, 0, 0]).is_none(), "unknown version");
        let relative = encode_request(1, b"a", Path::new("d"), None);
        assert!(parse_request(&relative).is_none(), "relative directory");
        let mut short = encode_request(1, b"abc", Path::new("/d"), None);
        short.truncate(15);
        assert!(parse_request(&short).is_none(), "cut inside the id");
    }
}
