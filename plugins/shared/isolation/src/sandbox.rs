//! The Linux sandbox: how an executor starts a task with [`Isolation`] — the fork,
//! the task's init, and every step between fork and exec. [`LinuxSandbox`] is the
//! [`Sandbox`] an isolating driver hands to `drover_executor::run_if_executor`.
//!
//! ```text
//! executor ──fork──▶ init (pid 1 of the task's pid namespace, executor code)
//!                      │ joins cgroups, unshares namespaces, builds the root
//!                      └──fork──▶ task: rlimits, capabilities, ids, no_new_privs,
//!                                 seccomp, exec
//! ```
//!
//! The executor is single-threaded, so after `fork` both children may run ordinary
//! code (allocation included): no other thread can hold a lock at the fork.
//!
//! Three pipes tie them together, all close-on-exec:
//! - the **error pipe**: the init writes a failed step to it and exits; the task writes
//!   a failed step and exits 127. The init closes its end once the task is forked, so
//!   the executor reads end-of-file exactly when the task's `exec` succeeded (or failed
//!   with a message): start-up is synchronous and every failure names its step;
//! - the **status pipe** (`drover_executor::sandbox`): the init reports the task's code
//!   or signal just before it exits itself, so the executor reports the task's real
//!   status rather than the init's;
//! - stdout and stderr of the task, read by the executor into the log files.

use std::ffi::CString;
use std::io::Read as _;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::{CapabilitySet, UnshareFlags};

use drover_executor::sandbox::{TaskExit, report_task_exit};
use drover_executor::{
    Isolation, LaunchSpec, Mount, MountKind, RlimitResource, Sandbox, Sandboxed,
};

/// `PATH` searched for a bare command name when the task's environment has none.
const FALLBACK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Device nodes of the minimal `/dev`.
const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Links of the minimal `/dev`.
const DEV_LINKS: [(&str, &str); 4] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// Namespaces, a `pivot_root` into a root of bind mounts, cgroups, capabilities,
/// `no_new_privs`, a user, rlimits and a seccomp filter, applied between fork and exec
/// by the executor.
///
/// ```no_run
/// // In the main of a driver whose tasks are isolated, before anything else:
/// drover_executor::run_if_executor(Some(&drover_isolation::LinuxSandbox));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxSandbox;

impl Sandbox for LinuxSandbox {
    fn spawn(
        &self,
        spec: &LaunchSpec,
        isolation: &Isolation,
        dir: &Path,
        stdout: bool,
        stderr: bool,
    ) -> Result<Sandboxed, String> {
        spawn(spec, isolation, dir, stdout, stderr)
    }
}

/// Everything the children need, prepared before the fork so that a bad spec is an
/// error of the executor itself.
struct Plan<'a> {
    iso: &'a Isolation,
    /// Where the task's root is built (an empty directory of the executor's).
    root: PathBuf,
    command: &'a str,
    argv: Vec<CString>,
    envp: Vec<CString>,
    /// Directories searched for a bare command name, inside the task's root.
    path: Vec<PathBuf>,
    cwd: &'a Path,
    /// The seccomp filter, converted once, before any fork.
    seccomp: Option<Vec<seccompiler::sock_filter>>,
}

/// The children's ends of the pipes.
struct ChildFds {
    err: OwnedFd,
    status: OwnedFd,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    null: OwnedFd,
}

impl ChildFds {
    fn raw(&self) -> Vec<RawFd> {
        let mut v = vec![
            self.err.as_raw_fd(),
            self.status.as_raw_fd(),
            self.null.as_raw_fd(),
        ];
        v.extend(self.stdout.iter().map(|f| f.as_raw_fd()));
        v.extend(self.stderr.iter().map(|f| f.as_raw_fd()));
        v
    }
}

/// Check what serde cannot: mount targets, and settings that need a namespace.
pub(crate) fn validate(iso: &Isolation) -> Result<(), String> {
    if !iso.mounts.is_empty() && !iso.namespaces.mount {
        return Err("a task root (mounts) needs a mount namespace".into());
    }
    if iso.netns_path.is_some() && iso.namespaces.net {
        return Err("a task joins a network namespace or gets a new one, not both".into());
    }
    if let Some(p) = &iso.netns_path
        && !p.is_absolute()
    {
        return Err(format!(
            "network namespace {} must be an absolute path",
            p.display()
        ));
    }
    if iso.hostname.is_some() && !iso.namespaces.uts {
        return Err("a hostname needs a uts namespace".into());
    }
    for m in &iso.mounts {
        let t = &m.target;
        let normal = t
            .components()
            .skip(1)
            .all(|c| matches!(c, Component::Normal(_)));
        if !t.is_absolute() || !normal || t.components().count() < 2 {
            return Err(format!(
                "mount target {} must be an absolute path below / without `..`",
                t.display()
            ));
        }
        if m.kind == MountKind::DeviceNode
            && !iso
                .mounts
                .iter()
                .any(|d| d.kind == MountKind::Dev && t.starts_with(&d.target) && *t != d.target)
        {
            return Err(format!(
                "device node {} must be below the task's /dev",
                t.display()
            ));
        }
        if matches!(
            m.kind,
            MountKind::Bind | MountKind::HostVolume | MountKind::DeviceNode
        ) && !m.source.is_absolute()
        {
            return Err(format!(
                "bind mount source {} must be an absolute path",
                m.source.display()
            ));
        }
    }
    if let Some(c) = iso.capabilities
        && c.ambient & !c.bounding != 0
    {
        return Err(format!(
            "ambient capabilities {:#x} are not all in the bounding set {:#x}",
            c.ambient, c.bounding
        ));
    }
    Ok(())
}

fn cstring(what: &str, s: impl Into<Vec<u8>>) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} contains a NUL byte"))
}

impl<'a> Plan<'a> {
    fn new(spec: &'a LaunchSpec, iso: &'a Isolation, dir: &Path) -> Result<Self, String> {
        let mut argv = vec![cstring("the command", spec.command.as_str())?];
        for a in &spec.args {
            argv.push(cstring("an argument", a.as_str())?);
        }
        let envp = spec
            .env
            .iter()
            .map(|(k, v)| cstring(&format!("environment variable {k}"), format!("{k}={v}")))
            .collect::<Result<_, _>>()?;
        let path = spec
            .env
            .get("PATH")
            .map_or(FALLBACK_PATH, String::as_str)
            .split(':')
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(Plan {
            iso,
            root: dir.join("root"),
            command: &spec.command,
            argv,
            envp,
            path,
            cwd: &spec.cwd,
            seccomp: iso.seccomp.as_deref().map(crate::seccomp::to_sock_filters),
        })
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("cannot create a pipe: {e}"))
}

/// Start the task of `spec` contained as `iso` says, its init in its own process
/// group. Returns once the task's `exec` succeeded, or the error of the step that
/// failed (the children are gone by then).
fn spawn(
    spec: &LaunchSpec,
    iso: &Isolation,
    dir: &Path,
    stdout: bool,
    stderr: bool,
) -> Result<Sandboxed, String> {
    validate(iso)?;
    let plan = Plan::new(spec, iso, dir)?;
    if !iso.mounts.is_empty() {
        match std::fs::create_dir(&plan.root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", plan.root.display())),
        }
    }
    let (err_r, err_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let out = stdout.then(pipe).transpose()?;
    let errp = stderr.then(pipe).transpose()?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("cannot open /dev/null: {e}"))?;
    if iso.namespaces.pid {
        // Only the executor's next child (the init) enters the new pid namespace, as
        // its pid 1; the executor itself stays where it is, and forks only once.
        // SAFETY: no CLONE_FILES: no descriptor table is split between threads (and
        // the executor has one thread).
        #[allow(unsafe_code)]
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWPID) }
            .map_err(|e| format!("cannot create a pid namespace: {e}"))?;
    }
    let (out_r, out_w) = out.map_or((None, None), |(r, w)| (Some(r), Some(w)));
    let (errp_r, errp_w) = errp.map_or((None, None), |(r, w)| (Some(r), Some(w)));
    let fds = ChildFds {
        err: err_w,
        status: status_w,
        stdout: out_w,
        stderr: errp_w,
        null: null.into(),
    };
    // SAFETY: the executor is single-threaded (a poll loop, no runtime), so the child
    // is a complete copy of a consistent process: it may allocate and take locks.
    #[allow(unsafe_code)]
    let forked = unsafe { nix::unistd::fork() };
    let init = match forked {
        Ok(ForkResult::Child) => init_main(&plan, fds),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => return Err(format!("cannot fork the task's init: {e}")),
    };
    // Also here, so that no signal to the group can come before the child's own call.
    let _ = nix::unistd::setpgid(init, init);
    drop(fds);
    let mut message = Vec::new();
    let read = std::fs::File::from(err_r).read_to_end(&mut message);
    if let Err(e) = read {
        message = format!("cannot read the task's start-up errors: {e}").into_bytes();
    }
    if !message.is_empty() {
        let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(init, None);
        return Err(String::from_utf8_lossy(&message).into_owned());
    }
    Ok(Sandboxed {
        pid: init.as_raw().unsigned_abs(),
        stdout: out_r,
        stderr: errp_r,
        status: status_r,
    })
}

/// Write `message` to the error pipe and exit. Only in the children.
fn fail(err: impl AsFd, message: &str, code: i32) -> ! {
    let mut rest = message.as_bytes();
    while !rest.is_empty() {
        match rustix::io::write(&err, rest) {
            Ok(0) | Err(_) => break,
            Ok(n) => rest = &rest[n..],
        }
    }
    // The children are copies of a single-threaded process: exit() is safe here.
    std::process::exit(code)
}

/// Close every descriptor but stdio and `keep`: the init lives as long as the task
/// and must not hold the executor's socket, its lock (which would make a dead
/// executor look alive) or its log files.
fn close_other_fds(keep: &[RawFd]) {
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2 && !keep.contains(fd))
            .collect(),
        Err(_) => return,
    };
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// The task's init: set up what the whole task shares, start the task, then forward
/// signals and reap until the task exits.
fn init_main(plan: &Plan<'_>, fds: ChildFds) -> ! {
    // The executor's stdout is still its start-up pipe to the plugin.
    for dup in [
        rustix::stdio::dup2_stdin,
        rustix::stdio::dup2_stdout,
        rustix::stdio::dup2_stderr,
    ] {
        let _ = dup(&fds.null);
    }
    close_other_fds(&fds.raw());
    if let Err(m) = init_setup(plan) {
        fail(&fds.err, &m, 1);
    }
    // Blocked from here on, in the init for good (it takes them with sigwait), in the
    // task until just before its exec: nothing sent meanwhile is lost.
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), None);
    // SAFETY: the init is single-threaded (a fork of the single-threaded executor).
    #[allow(unsafe_code)]
    let forked = unsafe { nix::unistd::fork() };
    let task = match forked {
        Ok(ForkResult::Child) => match task_setup(plan, &fds) {
            Err(m) => fail(&fds.err, &m, 127),
        },
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => fail(&fds.err, &format!("cannot fork the task: {e}"), 1),
    };
    let ChildFds {
        err,
        status,
        stdout,
        stderr,
        null,
    } = fds;
    // The task holds the only copies now: the executor sees end-of-file on the error
    // pipe at the task's exec, and on the output pipes once the task closes them.
    drop((err, stdout, stderr, null));
    supervise(task, status)
}

fn init_setup(plan: &Plan<'_>) -> Result<(), String> {
    let iso = plan.iso;
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))
        .map_err(|e| format!("cannot create the task's process group: {e}"))?;
    for procs in &iso.cgroup_procs {
        // "0" is the writer itself, whatever its pid in its namespace.
        std::fs::write(procs, "0")
            .map_err(|e| format!("cannot join cgroup {}: {e}", procs.display()))?;
    }
    if let Some(path) = &iso.netns_path {
        // Before the mount namespace and the new root: the path is the host's.
        let ns = std::fs::File::open(path).map_err(|e| {
            format!(
                "cannot open the group's network namespace {}: {e}",
                path.display()
            )
        })?;
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| {
            format!(
                "cannot join the group's network namespace {}: {e}",
                path.display()
            )
        })?;
    }
    let ns = iso.namespaces;
    let mut flags = UnshareFlags::empty();
    let mut names = Vec::new();
    for (on, flag, name) in [
        (ns.mount, UnshareFlags::NEWNS, "mount"),
        (ns.ipc, UnshareFlags::NEWIPC, "ipc"),
        (ns.uts, UnshareFlags::NEWUTS, "uts"),
        (ns.net, UnshareFlags::NEWNET, "network"),
    ] {
        if on {
            flags |= flag;
            names.push(name);
        }
    }
    if !flags.is_empty() {
        // SAFETY: no CLONE_FILES, and the init has one thread.
        #[allow(unsafe_code)]
        unsafe { rustix::thread::unshare_unsafe(flags) }
            .map_err(|e| format!("cannot create {} namespaces: {e}", names.join(", ")))?;
    }
    if ns.net {
        loopback_up()?;
    }
    if let Some(name) = &iso.hostname {
        rustix::system::sethostname(name.as_bytes())
            .map_err(|e| format!("cannot set hostname {name:?}: {e}"))?;
    }
    if !iso.mounts.is_empty() {
        build_root(&plan.root, &iso.mounts)?;
    }
    Ok(())
}

/// A new network namespace has only a loopback device, and it is down. Programs
/// expect 127.0.0.1 to work (Docker's and Nomad's `none` network have it up), so the
/// init brings it up while it still holds CAP_NET_ADMIN.
#[allow(unsafe_code)]
fn loopback_up() -> Result<(), String> {
    use std::os::fd::FromRawFd as _;
    let fail = |what: &str| {
        format!(
            "cannot bring up the loopback device of the task's network namespace ({what}): {}",
            std::io::Error::last_os_error()
        )
    };
    // SAFETY: plain socket(2); the descriptor is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(fail("socket"));
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the NUL-terminated name and writes ifru_flags of
    // the ifreq it is given, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(fail("SIOCGIFFLAGS"));
    }
    // SAFETY: SIOCGIFFLAGS filled in ifru_flags, the union member read here.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads the ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(fail("SIOCSIFFLAGS"));
    }
    Ok(())
}

fn io_step(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn errno_step(what: impl std::fmt::Display) -> impl FnOnce(rustix::io::Errno) -> String {
    move |e| format!("{what}: {e}")
}

/// Build the task's root at `root` (in the init's own mount namespace) and make it the
/// root: a tmpfs holding only mount points, the mounts, then `pivot_root`.
fn build_root(root: &Path, mounts: &[Mount]) -> Result<(), String> {
    // Nothing mounted from here on may reach the host's mount table.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(errno_step("cannot make the task's mount table private"))?;
    rustix::mount::mount(
        "tmpfs",
        root,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=4m",
    )
    .map_err(errno_step(format_args!(
        "cannot mount the task's root tmpfs on {}",
        root.display()
    )))?;
    for m in mounts {
        let rel = m.target.strip_prefix("/").unwrap_or(&m.target);
        if m.kind == MountKind::HostVolume {
            mount_host_volume(m, root, rel)?;
            continue;
        }
        if m.kind == MountKind::DeviceNode {
            // Made with its /dev (validate: every one is below a Dev mount).
            continue;
        }
        let target = root.join(rel);
        if m.kind == MountKind::Dev {
            // Its device nodes are made before it turns read-only.
            let nodes: Vec<&Mount> = mounts
                .iter()
                .filter(|d| d.kind == MountKind::DeviceNode && d.target.starts_with(&m.target))
                .collect();
            mount_dev(&target, &m.target.display().to_string(), &m.target, &nodes)?;
            continue;
        }
        mount_one(m, &target)?;
    }
    // Only mount points in it: read-only, so the task cannot litter its root.
    rustix::mount::mount_remount(
        root,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .map_err(errno_step("cannot make the task's root read-only"))?;
    // pivot_root(".", "."): the old root ends up stacked on the new one and is
    // detached at once; the task can never reach it again.
    rustix::process::chdir(root)
        .map_err(errno_step(format_args!("cannot enter {}", root.display())))?;
    rustix::process::pivot_root(".", ".").map_err(errno_step(format_args!(
        "cannot pivot_root into {}",
        root.display()
    )))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)
        .map_err(errno_step("cannot detach the host's root"))?;
    rustix::process::chdir("/").map_err(errno_step("cannot enter the task's root"))?;
    Ok(())
}

fn mkdirs(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(io_step(format_args!(
        "cannot create mount point {}",
        path.display()
    )))
}

fn mount_one(m: &Mount, target: &Path) -> Result<(), String> {
    let shown = m.target.display();
    match m.kind {
        MountKind::Bind => {
            let meta = std::fs::symlink_metadata(&m.source).map_err(io_step(format_args!(
                "bind mount source {}",
                m.source.display()
            )))?;
            if let Some(parent) = target.parent() {
                mkdirs(parent)?;
            }
            if meta.file_type().is_symlink() {
                let link = std::fs::read_link(&m.source).map_err(io_step(format_args!(
                    "cannot read link {}",
                    m.source.display()
                )))?;
                return std::os::unix::fs::symlink(&link, target).map_err(io_step(format_args!(
                    "cannot create link {shown} -> {}",
                    link.display()
                )));
            }
            if meta.is_dir() {
                mkdirs(target)?;
            } else {
                std::fs::File::create(target)
                    .map_err(io_step(format_args!("cannot create mount point {shown}")))?;
            }
            rustix::mount::mount_bind_recursive(&m.source, target).map_err(errno_step(
                format_args!("cannot bind {} at {shown}", m.source.display()),
            ))?;
            // Never setuid binaries or device nodes through a bind: a task with
            // CAP_MKNOD could otherwise make a node for a host disk in /local. On every
            // mount of the tree: a remount would change the top one only, and a host
            // mount below a read-only path (say a writable disk under /usr) would stay
            // writable.
            let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
            if m.read_only {
                attrs |= MOUNT_ATTR_RDONLY;
            }
            set_tree_attrs(target, attrs).map_err(errno_step(format_args!(
                "cannot restrict the mounts at {shown}"
            )))
        }
        MountKind::Proc => {
            mkdirs(target)?;
            rustix::mount::mount(
                "proc",
                target,
                "proc",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                None,
            )
            .map_err(errno_step(format_args!("cannot mount proc at {shown}")))?;
            restrict_proc(target, &shown.to_string())
        }
        MountKind::Tmpfs => {
            mkdirs(target)?;
            rustix::mount::mount(
                "tmpfs",
                target,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV,
                c"mode=1777",
            )
            .map_err(errno_step(format_args!("cannot mount a tmpfs at {shown}")))
        }
        MountKind::Dev => mount_dev(target, &shown.to_string(), &m.target, &[]),
        // Mounted by `mount_host_volume`, from the root's descriptor.
        MountKind::HostVolume => Err(format!("host volume at {shown} mounted by path")),
        // Made by `mount_dev`, before the task's /dev turns read-only.
        MountKind::DeviceNode => Err(format!("device node {shown} outside the task's /dev")),
    }
}

/// `openat2` flags that never follow a link, `..` out of the start, or a magic link.
fn no_links() -> rustix::fs::ResolveFlags {
    rustix::fs::ResolveFlags::NO_SYMLINKS
        | rustix::fs::ResolveFlags::NO_MAGICLINKS
        | rustix::fs::ResolveFlags::BENEATH
}

/// Open directory `rel` below `start` as an `O_PATH` descriptor, following no link.
fn open_dir_beneath(start: impl AsFd, rel: &Path) -> Result<OwnedFd, rustix::io::Errno> {
    rustix::fs::openat2(
        start,
        rel,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        no_links(),
    )
}

/// Bind a host volume ([`MountKind::HostVolume`]) at `rel` in `root`: the volume's
/// directory and the mount point are both reached without following any link, and
/// the mount is made on descriptors (`open_tree`, `mount_setattr`, `move_mount`), so
/// no path is looked up again between the checks and the mount.
fn mount_host_volume(m: &Mount, root: &Path, rel: &Path) -> Result<(), String> {
    let shown = m.target.display();
    let source_rel = m.source.strip_prefix("/").unwrap_or(&m.source);
    let host_root = rustix::fs::open(
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(errno_step("cannot open /"))?;
    let source = open_dir_beneath(&host_root, source_rel).map_err(|e| {
        format!(
            "host volume {} at {shown}: cannot open it as a directory without following \
             links ({e}); a link in its path is refused",
            m.source.display()
        )
    })?;
    // The agent only takes root's directories as volumes. Checked again on the
    // descriptor that is mounted: a task of a writable parent volume that replaced a
    // nested volume's directory with one of its own (not a link: a directory it made)
    // must not have it mounted into another task as that volume.
    let owner = rustix::fs::fstat(&source)
        .map_err(errno_step(format_args!(
            "cannot stat host volume {}",
            m.source.display()
        )))?
        .st_uid;
    if owner != 0 {
        return Err(format!(
            "host volume {} at {shown}: its directory is owned by uid {owner}, not root: \
             refused (was it replaced by a task?)",
            m.source.display()
        ));
    }
    let task_root = rustix::fs::open(
        root,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(errno_step(format_args!(
        "cannot open the task's root {}",
        root.display()
    )))?;
    // The mount point, created one component at a time below the task's root; an
    // existing component must be a directory reached without a link.
    let mut walked = PathBuf::new();
    for c in rel.components() {
        walked.push(c);
        match open_dir_beneath(&task_root, &walked) {
            Ok(_) => continue,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                return Err(format!(
                    "volume mount point {shown}: /{} is not a directory reached without \
                     following links ({e})",
                    walked.display()
                ));
            }
        }
        let parent = walked.parent().unwrap_or(Path::new(""));
        let parent_fd = if parent.as_os_str().is_empty() {
            rustix::io::dup(&task_root).map_err(errno_step("cannot duplicate a descriptor"))?
        } else {
            open_dir_beneath(&task_root, parent).map_err(errno_step(format_args!(
                "volume mount point {shown}: /{}",
                parent.display()
            )))?
        };
        // O_PATH descriptors cannot be mkdirat's base: reopen the parent for it.
        let parent_dir = rustix::fs::openat(
            &parent_fd,
            ".",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(errno_step(format_args!("volume mount point {shown}")))?;
        let name = walked.file_name().unwrap_or_default();
        match rustix::fs::mkdirat(&parent_dir, name, rustix::fs::Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(format!(
                    "cannot create volume mount point /{}: {e}",
                    walked.display()
                ));
            }
        }
    }
    let target = open_dir_beneath(&task_root, rel).map_err(|e| {
        format!("volume mount point {shown}: cannot open it without following links ({e})")
    })?;
    let tree = open_tree_clone(&source).map_err(errno_step(format_args!(
        "cannot clone the mount of host volume {}",
        m.source.display()
    )))?;
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if m.read_only {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    set_fd_attrs(&tree, attrs).map_err(errno_step(format_args!(
        "cannot restrict the mount of host volume {}",
        m.source.display()
    )))?;
    move_mount_to(&tree, &target).map_err(errno_step(format_args!(
        "cannot mount host volume {} at {shown}",
        m.source.display()
    )))
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// A detached copy of the mount of the directory `dir` (not of the mounts below it):
/// `open_tree(2)` with `OPEN_TREE_CLONE` (Linux 5.2), which rustix does not wrap.
#[allow(unsafe_code)]
fn open_tree_clone(dir: &OwnedFd) -> Result<OwnedFd, rustix::io::Errno> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: the path is a NUL-terminated empty string and the descriptor is open for
    // the call; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    let fd = RawFd::try_from(rc).map_err(|_| rustix::io::Errno::INVAL)?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mount_setattr(2)` on the detached mount `tree` itself.
#[allow(unsafe_code)]
fn set_fd_attrs(tree: &OwnedFd, attrs: u64) -> Result<(), rustix::io::Errno> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the path is a NUL-terminated empty string and `attr` a valid mount_attr
    // of the size passed; both outlive the call, and the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    Ok(())
}

/// Attach the detached mount `tree` on the directory `target`: `move_mount(2)`.
#[allow(unsafe_code)]
fn move_mount_to(tree: &OwnedFd, target: &OwnedFd) -> Result<(), rustix::io::Errno> {
    // SAFETY: both paths are NUL-terminated empty strings and both descriptors are
    // open for the call; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    Ok(())
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `struct mount_attr` of `mount_setattr(2)` (its first version, 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Set `attrs` (`MOUNT_ATTR_*`) on the mount at `target` and every mount below it:
/// `mount_setattr(2)` with `AT_RECURSIVE` (Linux 5.12), which rustix does not wrap.
#[allow(unsafe_code)]
fn set_tree_attrs(target: &Path, attrs: u64) -> Result<(), rustix::io::Errno> {
    let path = CString::new(target.as_os_str().as_bytes()).map_err(|_| rustix::io::Errno::INVAL)?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the path is NUL-terminated and `attr` is a valid mount_attr of the size
    // passed; both outlive the call, and the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    Ok(())
}

/// Make device node `m` ([`MountKind::DeviceNode`]) at `at` (below the fresh `/dev`
/// tmpfs): the host node, opened without following a link, must be a character or
/// block device on a mount that allows device nodes; it is bind-mounted (through its
/// descriptor) on an empty file at `at`. A bind rather than `mknod`: the init is in
/// the task's devices cgroup already, which grants no `m`. What the task may do with
/// it is the cgroup's rule for it (the driver wrote it from `m.device_permissions`).
fn make_device_node(m: &Mount, at: &Path) -> Result<(), String> {
    use rustix::fs::{FileType, Mode, OFlags};
    let shown = m.target.display();
    let fd = rustix::fs::open(
        &m.source,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno_step(format_args!(
        "device node {shown}: cannot open {}",
        m.source.display()
    )))?;
    let st = rustix::fs::fstat(&fd).map_err(errno_step(format_args!(
        "device node {shown}: cannot stat {}",
        m.source.display()
    )))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if !matches!(kind, FileType::CharacterDevice | FileType::BlockDevice) {
        return Err(format!(
            "device node {shown}: {} is not a character or block device",
            m.source.display()
        ));
    }
    let vfs = rustix::fs::fstatvfs(&fd).map_err(errno_step(format_args!(
        "device node {shown}: cannot read the mount of {}",
        m.source.display()
    )))?;
    if vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::NODEV) {
        return Err(format!(
            "device node {shown}: {} is on a mount that allows no device nodes (nodev)",
            m.source.display()
        ));
    }
    if let Some(parent) = at.parent() {
        mkdirs(parent)?;
    }
    std::fs::File::create(at)
        .map_err(io_step(format_args!("cannot create device node {shown}")))?;
    let by_fd = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::mount::mount_bind(by_fd.as_str(), at).map_err(errno_step(format_args!(
        "cannot bind {} at {shown}",
        m.source.display()
    )))
}

fn mount_dev(target: &Path, shown: &str, inside: &Path, nodes: &[&Mount]) -> Result<(), String> {
    mkdirs(target)?;
    rustix::mount::mount(
        "tmpfs",
        target,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"mode=0755,size=64k",
    )
    .map_err(errno_step(format_args!("cannot mount a tmpfs at {shown}")))?;
    for node in DEV_NODES {
        let host = Path::new("/dev").join(node);
        if !host.exists() {
            continue;
        }
        let at = target.join(node);
        std::fs::File::create(&at)
            .map_err(io_step(format_args!("cannot create {shown}/{node}")))?;
        rustix::mount::mount_bind(&host, &at).map_err(errno_step(format_args!(
            "cannot bind /dev/{node} at {shown}/{node}"
        )))?;
    }
    for (name, to) in DEV_LINKS {
        std::os::unix::fs::symlink(to, target.join(name))
            .map_err(io_step(format_args!("cannot create link {shown}/{name}")))?;
    }
    for m in nodes {
        let Ok(rel) = m.target.strip_prefix(inside) else {
            continue;
        };
        make_device_node(m, &target.join(rel))?;
    }
    let shm = target.join("shm");
    mkdirs(&shm)?;
    rustix::mount::mount(
        "tmpfs",
        &shm,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"mode=1777",
    )
    .map_err(errno_step(format_args!(
        "cannot mount a tmpfs at {shown}/shm"
    )))?;
    // Nothing new in /dev (no device nodes even with CAP_MKNOD); /dev/shm stays
    // writable, being its own mount.
    rustix::mount::mount_remount(
        target,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=0755,size=64k",
    )
    .map_err(errno_step(format_args!("cannot make {shown} read-only")))
}

/// The real, effective and saved uid and gid are all the ones asked for. An id the
/// kernel reads as "unchanged" (`-1`) would otherwise leave the task with the
/// executor's root without an error.
fn check_ids(c: &drover_executor::Credentials) -> Result<(), String> {
    let r = nix::unistd::getresuid().map_err(|e| format!("cannot read the task's uids: {e}"))?;
    let g = nix::unistd::getresgid().map_err(|e| format!("cannot read the task's gids: {e}"))?;
    let uids = [r.real, r.effective, r.saved].map(|u| u.as_raw());
    let gids = [g.real, g.effective, g.saved].map(|g| g.as_raw());
    if uids != [c.uid; 3] || gids != [c.gid; 3] {
        return Err(format!(
            "the task asked for uid {} gid {} but runs with uids {uids:?} gids {gids:?} \
             (real, effective, saved): refusing to start it",
            c.uid, c.gid
        ));
    }
    Ok(())
}

/// Parts of `/proc` that reach beyond the task's namespaces, as container runtimes
/// treat them: read-only (kernel tunables, sysrq) or hidden (kernel memory, keys).
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Hidden as by Docker's defaults (moby's `maskedPaths`), plus `kallsyms`: files under
/// `/dev/null`, directories under an empty read-only tmpfs; missing ones are skipped.
const PROC_MASKED: [&str; 11] = [
    "kcore",
    "keys",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "kallsyms",
    "interrupts",
    "acpi",
    "asound",
    "scsi",
];

fn restrict_proc(proc: &Path, shown: &str) -> Result<(), String> {
    for name in PROC_READ_ONLY {
        let p = proc.join(name);
        if !p.exists() {
            continue;
        }
        rustix::mount::mount_bind(&p, &p)
            .and_then(|()| {
                rustix::mount::mount_remount(
                    &p,
                    MountFlags::BIND
                        | MountFlags::RDONLY
                        | MountFlags::NOSUID
                        | MountFlags::NODEV
                        | MountFlags::NOEXEC,
                    "",
                )
            })
            .map_err(errno_step(format_args!(
                "cannot make {shown}/{name} read-only"
            )))?;
    }
    for name in PROC_MASKED {
        let p = proc.join(name);
        if p.is_dir() {
            rustix::mount::mount(
                "tmpfs",
                &p,
                "tmpfs",
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                c"mode=0555,size=4k",
            )
            .map_err(errno_step(format_args!("cannot hide {shown}/{name}")))?;
        } else if p.is_file() {
            rustix::mount::mount_bind("/dev/null", &p)
                .map_err(errno_step(format_args!("cannot hide {shown}/{name}")))?;
        }
    }
    Ok(())
}

/// The init's life after the task started: take every signal (all are blocked) and
/// forward it to the task's process group; reap every child; when the task itself
/// exits, report its status and exit (with a pid namespace the kernel then kills
/// whatever the task left behind).
fn supervise(task: Pid, status: OwnedFd) -> ! {
    let all = SigSet::all();
    loop {
        let Ok(sig) = all.wait() else {
            continue;
        };
        if sig != Signal::SIGCHLD {
            // The task leads its own session and group, unless it has not got that
            // far yet.
            if nix::sys::signal::killpg(task, sig).is_err() {
                let _ = nix::sys::signal::kill(task, sig);
            }
            continue;
        }
        loop {
            match nix::sys::wait::waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == task => {
                    finish(&status, TaskExit::Code(code), code)
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == task => {
                    let n = sig as i32;
                    finish(&status, TaskExit::Signal(n), 128 + n)
                }
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
    }
}

fn finish(status: &OwnedFd, exit: TaskExit, code: i32) -> ! {
    report_task_exit(status, exit);
    // The children are copies of a single-threaded process: exit() is safe here.
    std::process::exit(code)
}

/// The task between its fork and its exec. Returns only with the failed step.
fn task_setup(plan: &Plan<'_>, fds: &ChildFds) -> Result<std::convert::Infallible, String> {
    let iso = plan.iso;
    rustix::process::setsid().map_err(errno_step("cannot start the task's session"))?;
    rustix::stdio::dup2_stdin(&fds.null).map_err(errno_step("cannot set up stdin"))?;
    rustix::stdio::dup2_stdout(fds.stdout.as_ref().unwrap_or(&fds.null))
        .map_err(errno_step("cannot set up stdout"))?;
    rustix::stdio::dup2_stderr(fds.stderr.as_ref().unwrap_or(&fds.null))
        .map_err(errno_step("cannot set up stderr"))?;
    for r in &iso.rlimits {
        let limit = rustix::process::Rlimit {
            current: r.soft,
            maximum: r.hard,
        };
        rustix::process::setrlimit(resource(r.resource), limit).map_err(errno_step(
            format_args!(
                "cannot set rlimit {} to {:?}/{:?}",
                r.resource.name(),
                r.soft,
                r.hard
            ),
        ))?;
    }
    let creds = iso.credentials.as_ref();
    let root_requested = creds.is_none_or(|c| c.uid == 0);
    if let Some(caps) = iso.capabilities {
        // Before the uid changes: dropping from the bounding set needs CAP_SETPCAP.
        drop_bounding(caps.bounding)?;
        if !root_requested && caps.ambient != 0 {
            rustix::thread::set_keep_capabilities(true)
                .map_err(errno_step("cannot keep capabilities across the uid change"))?;
        }
    }
    if let Some(c) = creds {
        let groups: Vec<rustix::fs::Gid> = c
            .groups
            .iter()
            .map(|&g| rustix::fs::Gid::from_raw(g))
            .collect();
        rustix::thread::set_thread_groups(&groups).map_err(errno_step(format_args!(
            "cannot set supplementary groups {:?}",
            c.groups
        )))?;
        let gid = rustix::fs::Gid::from_raw(c.gid);
        rustix::thread::set_thread_res_gid(gid, gid, gid)
            .map_err(errno_step(format_args!("cannot switch to gid {}", c.gid)))?;
        let uid = rustix::fs::Uid::from_raw(c.uid);
        rustix::thread::set_thread_res_uid(uid, uid, uid)
            .map_err(errno_step(format_args!("cannot switch to uid {}", c.uid)))?;
        check_ids(c)?;
    }
    // From the ids in effect, not the ones asked for: the capabilities kept below
    // depend on it.
    let to_root = rustix::process::getuid().is_root();
    if let Some(caps) = iso.capabilities {
        // Root gets the bounding set as permitted and effective at exec anyway; a
        // non-root task keeps only its ambient capabilities.
        let keep = if to_root { caps.bounding } else { caps.ambient };
        let current = rustix::thread::capabilities(None)
            .map_err(errno_step("cannot read the task's capabilities"))?;
        let keep = CapabilitySet::from_bits_retain(keep) & current.permitted;
        let inheritable = if to_root {
            CapabilitySet::empty()
        } else {
            keep
        };
        rustix::thread::set_capabilities(
            None,
            rustix::thread::CapabilitySets {
                effective: keep,
                permitted: keep,
                inheritable,
            },
        )
        .map_err(errno_step(format_args!(
            "cannot set capabilities {:#x}",
            keep.bits()
        )))?;
        if !to_root {
            for bit in 0..64 {
                let cap = CapabilitySet::from_bits_retain(1 << bit);
                if keep.contains(cap) {
                    rustix::thread::configure_capability_in_ambient_set(cap, true).map_err(
                        errno_step(format_args!(
                            "cannot raise capability {bit} in the ambient set"
                        )),
                    )?;
                }
            }
        }
    }
    if iso.no_new_privs {
        rustix::thread::set_no_new_privs(true).map_err(errno_step("cannot set no_new_privs"))?;
    }
    rustix::process::chdir(plan.cwd).map_err(errno_step(format_args!(
        "working directory {} in the task's root",
        plan.cwd.display()
    )))?;
    let program = find_program(plan)?;
    // Rust ignores SIGPIPE in every binary it builds; a task expects the default.
    // SAFETY: setting a default disposition installs no handler.
    #[allow(unsafe_code)]
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
    if let Some(filter) = &plan.seccomp {
        // Last, so that no step above runs under it (the capability and mount calls
        // would be refused); the calls left (sigprocmask, execve, and the error report
        // if exec fails) are all allowed.
        seccompiler::apply_filter(filter)
            .map_err(|e| format!("cannot install the seccomp filter: {e}"))?;
    }
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    let e = nix::unistd::execve(&program, &plan.argv, &plan.envp).unwrap_err();
    Err(format!(
        "cannot execute {} in the task's root: {e}",
        Path::new(std::ffi::OsStr::from_bytes(program.as_bytes())).display()
    ))
}

/// Drop every capability not in `keep` from the bounding set.
fn drop_bounding(keep: u64) -> Result<(), String> {
    for bit in 0..64 {
        let cap = CapabilitySet::from_bits_retain(1 << bit);
        match rustix::thread::capability_is_in_bounding_set(cap) {
            Ok(true) if keep & (1 << bit) == 0 => {
                rustix::thread::remove_capability_from_bounding_set(cap).map_err(errno_step(
                    format_args!("cannot drop capability {bit} from the bounding set"),
                ))?;
            }
            Ok(_) => {}
            // Beyond the kernel's last capability.
            Err(_) => break,
        }
    }
    Ok(())
}

/// The program to exec: `command` if it has a slash, else the first executable of
/// that name in the task's `PATH` (inside its root).
fn find_program(plan: &Plan<'_>) -> Result<CString, String> {
    if plan.command.contains('/') {
        return cstring("the command", plan.command);
    }
    for dir in &plan.path {
        let candidate = dir.join(plan.command);
        if rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok()
            && candidate.is_file()
        {
            return cstring("the command", candidate.as_os_str().as_bytes());
        }
    }
    Err(format!(
        "command {:?} not found in the task's PATH ({})",
        plan.command,
        plan.path
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    ))
}

pub(crate) fn resource(r: RlimitResource) -> rustix::process::Resource {
    use rustix::process::Resource;
    match r {
        RlimitResource::As => Resource::As,
        RlimitResource::Core => Resource::Core,
        RlimitResource::Cpu => Resource::Cpu,
        RlimitResource::Data => Resource::Data,
        RlimitResource::Fsize => Resource::Fsize,
        RlimitResource::Locks => Resource::Locks,
        RlimitResource::Memlock => Resource::Memlock,
        RlimitResource::Msgqueue => Resource::Msgqueue,
        RlimitResource::Nice => Resource::Nice,
        RlimitResource::Nofile => Resource::Nofile,
        RlimitResource::Nproc => Resource::Nproc,
        RlimitResource::Rss => Resource::Rss,
        RlimitResource::Rtprio => Resource::Rtprio,
        RlimitResource::Rttime => Resource::Rttime,
        RlimitResource::Sigpending => Resource::Sigpending,
        RlimitResource::Stack => Resource::Stack,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_executor::CapabilitySets;

    #[test]
    fn ids_not_in_effect_fail_the_check() {
        let me = |uid, gid| drover_executor::Credentials {
            uid,
            gid,
            groups: Vec::new(),
        };
        let (uid, gid) = (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        );
        check_ids(&me(uid, gid)).unwrap();
        // What setresuid(-1, -1, -1) leaves: the ids asked for are not in effect.
        let e = check_ids(&me(u32::MAX, gid)).unwrap_err();
        assert!(e.contains("asked for uid 4294967295"), "{e}");
        let e = check_ids(&me(uid, gid.wrapping_add(1))).unwrap_err();
        assert!(e.contains("refusing to start"), "{e}");
    }

    #[test]
    fn mount_targets_must_stay_inside_the_root() {
        let mut iso = Isolation::default();
        iso.namespaces.mount = true;
        for bad in ["usr", "/", "/a/../etc"] {
            iso.mounts = vec![Mount::bind("/usr", bad, true)];
            let err = validate(&iso).unwrap_err();
            assert!(err.contains("mount target"), "{bad}: {err}");
        }
        iso.mounts = vec![Mount::bind("usr", "/usr", true)];
        assert!(validate(&iso).unwrap_err().contains("source"));
        iso.mounts = vec![
            Mount::bind("/usr", "/usr/local", true),
            Mount::proc("/proc"),
        ];
        assert!(validate(&iso).is_ok());
        iso.namespaces.mount = false;
        assert!(validate(&iso).unwrap_err().contains("mount namespace"));
    }

    #[test]
    fn ambient_must_be_within_bounding() {
        let mut iso = Isolation::default();
        iso.capabilities = Some(CapabilitySets {
            bounding: 0b01,
            ambient: 0b10,
        });
        assert!(validate(&iso).unwrap_err().contains("ambient"));
        iso.hostname = Some("x".into());
        iso.capabilities = None;
        assert!(validate(&iso).unwrap_err().contains("uts"));
    }
}
