//! A command run inside a running isolated task (`alloc exec`): it enters the task's
//! sandbox as the task's own processes did, never a looser one.
//!
//! The plugin is multi-threaded, so nothing between fork and exec may allocate or
//! take a lock: everything is prepared before the fork ([`ExecPlan`]), and the child
//! only makes system calls.
//!
//! ```text
//! plugin ──fork──▶ intermediate: joins the task's cgroup, setns into its ipc, uts,
//!                  │             net, pid and mount namespaces (root and cwd become
//!                  │             the task's), then only waits and passes the status on
//!                  └──fork──▶ command (in the task's pid namespace): session and
//!                             terminal, rlimits, bounding set, groups and ids,
//!                             capabilities, no_new_privs, cwd, parent-death signal,
//!                             seccomp, exec
//! ```
//!
//! The settings are the task's own, read from its executor's launch spec (the
//! plugin's state directory, never the task's); the namespaces are those of the
//! task's init, proven by pidfd and start time before they are opened and after.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;

use drover_executor::{Isolation, LaunchSpec};
use rustix::thread::CapabilitySet;

/// The namespaces a task's init holds that a command joins, in this order (the
/// mount namespace last: its `setns` also moves root and cwd into the task's root).
const NAMESPACES: [(&str, rustix::thread::LinkNameSpaceType); 5] = [
    (
        "ipc",
        rustix::thread::LinkNameSpaceType::InterProcessCommunication,
    ),
    (
        "uts",
        rustix::thread::LinkNameSpaceType::HostNameAndNISDomainName,
    ),
    ("net", rustix::thread::LinkNameSpaceType::Network),
    ("pid", rustix::thread::LinkNameSpaceType::ProcessID),
    ("mnt", rustix::thread::LinkNameSpaceType::Mount),
];

/// Everything the children need, made before the fork.
pub struct ExecPlan {
    /// The init's namespaces, open.
    namespaces: Vec<(OwnedFd, rustix::thread::LinkNameSpaceType)>,
    /// The init's root directory (`/proc/<pid>/root`), entered after the mount
    /// namespace: the task's root whatever way the init entered it.
    root: OwnedFd,
    /// The task's cgroup files to write `0` to.
    cgroup_procs: Vec<OwnedFd>,
    rlimits: Vec<(rustix::process::Resource, rustix::process::Rlimit)>,
    bounding: Option<u64>,
    ambient: u64,
    groups: Vec<rustix::fs::Gid>,
    ids: Option<(rustix::fs::Uid, rustix::fs::Gid)>,
    no_new_privs: bool,
    cwd: CString,
    seccomp: Option<Vec<seccompiler::sock_filter>>,
    /// The command gets a terminal: it makes its own session with fd 0 as the
    /// controlling terminal.
    tty: bool,
}

impl std::fmt::Debug for ExecPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecPlan")
            .field("ids", &self.ids)
            .field("tty", &self.tty)
            .finish_non_exhaustive()
    }
}

impl ExecPlan {
    /// The plan for a command inside the task started as `spec`, whose init is
    /// `pid` started at `start_time` (ticks since boot), joining `cgroup_procs`.
    pub fn new(
        spec: &LaunchSpec,
        pid: u32,
        start_time: u64,
        cgroup_procs: &[std::path::PathBuf],
        tty: bool,
    ) -> Result<ExecPlan, String> {
        let iso: &Isolation = spec
            .isolation
            .as_ref()
            .ok_or("the task was started without isolation")?;
        let proof = drover_executor::lost::prove(pid, start_time)?
            .ok_or("the task's init has exited: the task is not running")?;
        let mut namespaces = Vec::new();
        for (name, kind) in NAMESPACES {
            let path = format!("/proc/{pid}/ns/{name}");
            let f = std::fs::File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
            namespaces.push((OwnedFd::from(f), kind));
        }
        let root_path = format!("/proc/{pid}/root");
        let root = rustix::fs::open(
            root_path.as_str(),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {root_path}: {e}"))?;
        // Still the same init: the pid could not have been reused while it lived, so
        // the namespaces and root opened are its.
        if drover_executor::lost::wait_exit(&proof, std::time::Duration::ZERO) {
            return Err("the task's init exited while its namespaces were opened".into());
        }
        let mut procs = Vec::new();
        for file in cgroup_procs {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .map_err(|e| format!("cannot open {} to join it: {e}", file.display()))?;
            procs.push(OwnedFd::from(f));
        }
        let rlimits = iso
            .rlimits
            .iter()
            .map(|r| {
                (
                    crate::sandbox::resource(r.resource),
                    rustix::process::Rlimit {
                        current: r.soft,
                        maximum: r.hard,
                    },
                )
            })
            .collect();
        let (groups, ids) = match &iso.credentials {
            Some(c) => (
                c.groups
                    .iter()
                    .map(|&g| rustix::fs::Gid::from_raw(g))
                    .collect(),
                Some((
                    rustix::fs::Uid::from_raw(c.uid),
                    rustix::fs::Gid::from_raw(c.gid),
                )),
            ),
            None => (Vec::new(), None),
        };
        let cwd = CString::new(spec.cwd.as_os_str().as_bytes())
            .map_err(|_| "the task's working directory has a NUL byte".to_owned())?;
        Ok(ExecPlan {
            namespaces,
            root,
            cgroup_procs: procs,
            rlimits,
            bounding: iso.capabilities.map(|c| c.bounding),
            ambient: iso.capabilities.map_or(0, |c| c.ambient),
            groups,
            ids,
            no_new_privs: iso.no_new_privs,
            cwd,
            seccomp: iso.seccomp.as_deref().map(crate::seccomp::to_sock_filters),
            tty,
        })
    }

    /// Make `cmd` (its program, arguments, environment and stdio set; no cwd, uid or
    /// process group of std's) run inside the task as this plan says.
    pub fn apply(self, cmd: &mut std::process::Command) {
        // SAFETY: the closure runs between fork and exec in a child of a multi-threaded
        // process: it only makes system calls (rustix's, raw) on what it owns, and
        // allocates nothing (errors are bare OS error codes).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || self.in_child());
        }
    }

    fn in_child(&self) -> std::io::Result<()> {
        for fd in &self.cgroup_procs {
            rustix::io::write(fd, b"0")?;
        }
        for (fd, kind) in &self.namespaces {
            rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(fd), Some(*kind))?;
        }
        // The task's root: the mount namespace's own root is it when the init used
        // pivot_root, but not on every kernel and set-up; the init's root always is.
        rustix::process::fchdir(&self.root)?;
        rustix::process::chroot(".")?;
        // The pid namespace takes effect for children only. A raw clone (fork's
        // semantics), not libc's fork: no atfork handlers run in this child of a
        // multi-threaded process.
        // SAFETY: the clone syscall with only SIGCHLD is fork(2); the child goes on
        // with system calls only.
        #[allow(unsafe_code)]
        let pid = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_clone,
                nix::libc::SIGCHLD as nix::libc::c_ulong,
                0 as nix::libc::c_ulong,
                0 as nix::libc::c_ulong,
                0 as nix::libc::c_ulong,
                0 as nix::libc::c_ulong,
            )
        };
        match pid {
            -1 => Err(std::io::Error::last_os_error()),
            0 => self.command_setup(),
            child => intermediate(child as i32),
        }
    }

    /// The command's own steps, as the task's (`sandbox::task_setup`).
    fn command_setup(&self) -> std::io::Result<()> {
        if self.tty {
            rustix::process::setsid()?;
            // SAFETY: fd 0 is the terminal's slave, set up by std before this runs.
            #[allow(unsafe_code)]
            rustix::process::ioctl_tiocsctty(unsafe { std::os::fd::BorrowedFd::borrow_raw(0) })?;
        }
        for (resource, limit) in &self.rlimits {
            rustix::process::setrlimit(*resource, *limit)?;
        }
        let to_root = self.ids.is_none_or(|(u, _)| u.is_root());
        if let Some(bounding) = self.bounding {
            for bit in 0..64 {
                let cap = CapabilitySet::from_bits_retain(1 << bit);
                match rustix::thread::capability_is_in_bounding_set(cap) {
                    Ok(true) if bounding & (1 << bit) == 0 => {
                        rustix::thread::remove_capability_from_bounding_set(cap)?;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            if !to_root && self.ambient != 0 {
                rustix::thread::set_keep_capabilities(true)?;
            }
        }
        if let Some((uid, gid)) = self.ids {
            rustix::thread::set_thread_groups(&self.groups)?;
            rustix::thread::set_thread_res_gid(gid, gid, gid)?;
            rustix::thread::set_thread_res_uid(uid, uid, uid)?;
            if rustix::process::getuid() != uid || rustix::process::getgid() != gid {
                return Err(std::io::Error::from_raw_os_error(libc_eperm()));
            }
        }
        if let Some(bounding) = self.bounding {
            let keep = if to_root { bounding } else { self.ambient };
            let current = rustix::thread::capabilities(None)?;
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
            )?;
            if !to_root {
                for bit in 0..64 {
                    let cap = CapabilitySet::from_bits_retain(1 << bit);
                    if keep.contains(cap) {
                        rustix::thread::configure_capability_in_ambient_set(cap, true)?;
                    }
                }
            }
        }
        if self.no_new_privs {
            rustix::thread::set_no_new_privs(true)?;
        }
        rustix::process::chdir(self.cwd.as_c_str())?;
        // Set after the ids changed (a change clears it): the command dies with the
        // intermediate, which dies with the exec's caller.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
        // Nothing of the plugin's but std's error pipe (close-on-exec) and stdio
        // should be open; make sure nothing else reaches the command.
        close_range(3, true);
        if let Some(filter) = &self.seccomp {
            // Last: the steps above would be refused under it.
            seccompiler::apply_filter(filter)
                .map_err(|_| std::io::Error::from_raw_os_error(libc_eperm()))?;
        }
        Ok(())
    }
}

const fn libc_eperm() -> i32 {
    nix::libc::EPERM
}

/// `close_range(first, ~0)`: close, or with `cloexec` mark close-on-exec, every
/// descriptor from `first` on (Linux 5.9, 5.11 for the flag; older kernels: nothing).
fn close_range(first: u32, cloexec: bool) {
    let flags: nix::libc::c_uint = if cloexec { 1 << 2 } else { 0 }; // CLOSE_RANGE_CLOEXEC
    // SAFETY: a system call on descriptors only.
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::syscall(nix::libc::SYS_close_range, first, u32::MAX, flags);
    }
}

/// The intermediate's life after the fork: close everything but stdio (std's error
/// pipe included, so that the plugin's spawn returns when the command execs, not
/// when it exits), wait for the command, and exit as it did.
fn intermediate(child: i32) -> ! {
    close_range(3, false);
    let mut status: nix::libc::c_int = 0;
    let code = loop {
        // SAFETY: waitpid and _exit are async-signal-safe system calls.
        #[allow(unsafe_code)]
        let r = unsafe { nix::libc::waitpid(child, &mut status, 0) };
        if r == child {
            if nix::libc::WIFEXITED(status) {
                break nix::libc::WEXITSTATUS(status);
            }
            if nix::libc::WIFSIGNALED(status) {
                break 128 + nix::libc::WTERMSIG(status);
            }
        } else if r == -1
            && std::io::Error::last_os_error().raw_os_error() != Some(nix::libc::EINTR)
        {
            break 127;
        }
    };
    // SAFETY: see above.
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::_exit(code)
    }
}

/// Whether `path` names a program the exec can try: with a slash, or a bare name for
/// the task's `PATH` (looked up inside the task's root by the exec itself).
pub fn check_program(program: &str) -> Result<(), String> {
    if program.is_empty() || program.contains('\0') {
        return Err("the command is empty or has a NUL byte".into());
    }
    if Path::new(program).is_absolute() || !program.contains('/') {
        Ok(())
    } else {
        Err(format!(
            "command {program:?}: give an absolute path, or a name to look up in the task's PATH"
        ))
    }
}
