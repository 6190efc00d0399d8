//! The one place where a task process is created: a plain process group
//! ([`spawn_task`], rawexec), or with the [`super::Isolation`] of the exec and java
//! drivers, through the [`Sandbox`] the plugin's `main` handed to the executor.

use std::os::fd::OwnedFd;
use std::path::Path;

use super::cgroup::Join;
use super::{LaunchSpec, Sandbox};

/// A started task, whichever way it was started.
pub(crate) struct Spawned {
    /// The executor's child: the task itself, or its init with isolation. It leads
    /// its own process group.
    pub pid: u32,
    /// Read ends of the task's stdout and stderr, when they are logged.
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// With isolation: where the init reports the task's own exit status.
    pub status: Option<OwnedFd>,
}

/// Start the task of `spec`, whose executor directory is `dir`; `stdout`/`stderr`:
/// whether to pipe them (else /dev/null). A spec with isolation needs a `sandbox`.
/// `join`: open `cgroup.procs`/`tasks` files of a plain task's cgroup, which the child
/// joins before it execs.
pub(crate) fn spawn(
    spec: &LaunchSpec,
    dir: &Path,
    stdout: bool,
    stderr: bool,
    sandbox: Option<&dyn Sandbox>,
    join: Join,
) -> Result<Spawned, String> {
    if let Some(iso) = &spec.isolation {
        let sandbox = sandbox.ok_or_else(|| {
            "this task asks for isolation, but the plugin binary's executor has no sandbox \
             (its main must pass one to drover_executor::run_if_executor)"
                .to_string()
        })?;
        let t = sandbox.spawn(spec, iso, dir, stdout, stderr)?;
        check_sandboxed_child(t.pid)?;
        return Ok(Spawned {
            pid: t.pid,
            stdout: t.stdout,
            stderr: t.stderr,
            status: Some(t.status),
        });
    }
    spawn_task(spec, stdout, stderr, &join)
}

/// The executor signals the whole process group of the pid a [`Sandbox`] returns and
/// watches it through a pidfd, trusting that the pid cannot be reused before it is
/// reaped. That holds only for the executor's own child that leads its own group:
/// check both, and refuse anything else (without signalling it: it may not be ours).
fn check_sandboxed_child(pid: u32) -> Result<(), String> {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let p = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .map(nix::unistd::Pid::from_raw)
        .ok_or_else(|| format!("the sandbox returned an impossible pid {pid}"))?;
    // WNOWAIT: look, and leave an exited child for the executor to reap.
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    if let Err(e) = waitid(Id::Pid(p), flags) {
        return Err(format!(
            "the sandbox returned pid {pid}, which is not this executor's child ({e})"
        ));
    }
    match nix::unistd::getpgid(Some(p)) {
        Ok(group) if group == p => Ok(()),
        found => {
            // Our own child: take it down rather than run a task we cannot stop whole.
            let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(p, None);
            Err(format!(
                "the sandbox's task {pid} does not lead its own process group ({found:?})"
            ))
        }
    }
}

/// Start the task described by `spec`: its own process group (so that signals reach
/// everything it forks), environment exactly `spec.env`, stdin `/dev/null`, stdout and
/// stderr piped when `stdout`/`stderr` (else `/dev/null`). The error names the command
/// and what was wrong.
///
/// The task starts with an empty signal mask and every signal the executor handles
/// (and SIGPIPE) back at its default disposition: standard signal handling.
///
/// `join`: files (`cgroup.procs`, or v1 `tasks`) the child writes `0` to before it
/// execs, so that it is in its cgroup before it can fork anything: nothing the task
/// starts is ever outside it.
///
/// A command without a `/` is looked up in the `PATH` of `spec.env` (`/bin:/usr/bin`
/// without one), and a file the kernel cannot execute is run by `/bin/sh`: what
/// `execvp(3)` does, as when this was a `std::process::Command`.
pub(crate) fn spawn_task(
    spec: &LaunchSpec,
    stdout: bool,
    stderr: bool,
    join: &Join,
) -> Result<Spawned, String> {
    let fail = |what: &dyn std::fmt::Display| {
        format!(
            "cannot start command {:?} in {}: {what}",
            spec.command,
            spec.cwd.display()
        )
    };
    // Checked first so that the error says which of program and directory is missing
    // (exec reports ENOENT for both).
    match std::fs::metadata(&spec.cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(format!(
                "cannot start command {:?}: working directory {} is not a directory",
                spec.command,
                spec.cwd.display()
            ));
        }
        Err(e) => {
            return Err(format!(
                "cannot start command {:?}: working directory {}: {e}",
                spec.command,
                spec.cwd.display()
            ));
        }
    }
    let program = vfork::Program::new(spec).map_err(|e| fail(&e))?;
    let netns = match &spec.netns_path {
        Some(path) => Some(std::fs::File::open(path).map_err(|e| {
            format!(
                "cannot open the group's network namespace {}: {e}",
                path.display()
            )
        })?),
        None => None,
    };
    // std opens with O_CLOEXEC, and pipes are made with it: in the task, only what
    // the child puts at 0-2 stays open.
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| fail(&format_args!("/dev/null: {e}")))?;
    let pipe = |wanted: bool| -> Result<Option<(OwnedFd, OwnedFd)>, String> {
        if !wanted {
            return Ok(None);
        }
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map(Some)
            .map_err(|e| fail(&std::io::Error::from(e)))
    };
    let out = pipe(stdout)?;
    let err = pipe(stderr)?;
    use std::os::fd::AsRawFd as _;
    let stdio = [
        devnull.as_raw_fd(),
        out.as_ref()
            .map_or(devnull.as_raw_fd(), |(_, w)| w.as_raw_fd()),
        err.as_ref()
            .map_or(devnull.as_raw_fd(), |(_, w)| w.as_raw_fd()),
    ];
    // The child moves them to 0-2 in order: none may be one of 0-2 itself, which an
    // earlier move would replace (the executor keeps 0-2 open, so new ones are above).
    debug_assert!(stdio.iter().all(|&fd| fd > 2), "{stdio:?}");
    let joins: Vec<_> = join.files().iter().map(|f| f.as_raw_fd()).collect();
    let pid = vfork::start(
        &program,
        stdio,
        &joins,
        netns.as_ref().map(|f| f.as_raw_fd()),
    )
    .map_err(|(step, e)| match step {
        vfork::Step::Exec => fail(&e),
        step => fail(&format_args!("{step}: {e}")),
    })?;
    // The write ends are the task's now; ours close here, so the read ends see the
    // end of its output when it (and whatever inherited them) exits.
    Ok(Spawned {
        pid,
        stdout: out.map(|(r, _)| r),
        stderr: err.map(|(r, _)| r),
        status: None,
    })
}

/// Starting a program the way `posix_spawn(3)` does: `clone(CLONE_VM | CLONE_VFORK)`,
/// plus the one step `posix_spawn` has no action for, joining the task's cgroup.
///
/// Why not `fork`: a fork copies the executor's mappings and page tables, every page
/// either side writes afterwards faults to be copied, and the task's `execve` then
/// tears the copy down again. Measured on a task start, that was about a quarter of
/// the executor's CPU time, and on the start's path. Here the child borrows the
/// executor's memory, runs on a stack of its own, and the executor is suspended
/// until the child has called `execve` or `_exit` (`CLONE_VFORK`).
///
/// The rules this makes for the child (`child_main`): it only makes system calls on
/// data prepared before the clone (no allocation, no locks, nothing that can panic),
/// it writes nothing of the executor's but the two result fields of [`Child`] and
/// `errno`, and all signals stay blocked until it has put every handler of the
/// executor back to the default, so no handler of the executor ever runs in it.
mod vfork {
    // The kernel structures below (a 64-bit signal set, `struct sigaction`'s layout)
    // are those of these architectures.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    compile_error!("the executor's task start supports x86_64 and aarch64 Linux only");

    use std::ffi::{CString, c_char, c_int, c_void};
    use std::os::fd::RawFd;
    use std::ptr;

    use nix::libc;

    use crate::LaunchSpec;

    /// The step of the child that failed.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Step {
        Stdio,
        WorkingDirectory,
        ProcessGroup,
        Cgroup,
        NetworkNamespace,
        Exec,
    }

    impl std::fmt::Display for Step {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(match self {
                Step::Stdio => "setting up its stdin, stdout and stderr",
                Step::WorkingDirectory => "entering its working directory",
                Step::ProcessGroup => "making its process group",
                Step::Cgroup => "joining its cgroup",
                Step::NetworkNamespace => "entering the group's network namespace",
                Step::Exec => "executing it",
            })
        }
    }

    /// One file `execve` is tried on, with the arguments for `/bin/sh` should the
    /// kernel not recognise it as a program.
    struct Candidate {
        path: CString,
        /// `/bin/sh`, `path`, then the task's arguments; NULL-terminated.
        script_argv: Vec<*const c_char>,
    }

    /// Everything the child needs, made before the clone.
    pub(super) struct Program {
        /// Kept alive for the pointers below.
        _strings: Vec<CString>,
        candidates: Vec<Candidate>,
        /// The command as given, then the arguments; NULL-terminated.
        argv: Vec<*const c_char>,
        /// `KEY=value` of `spec.env`; NULL-terminated.
        envp: Vec<*const c_char>,
        cwd: CString,
    }

    const SHELL: &std::ffi::CStr = c"/bin/sh";

    impl Program {
        pub(super) fn new(spec: &LaunchSpec) -> Result<Program, String> {
            let c = |what: &str, s: &[u8]| {
                CString::new(s).map_err(|_| format!("its {what} contains a NUL byte"))
            };
            if spec.command.is_empty() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOENT).to_string());
            }
            let mut strings = Vec::new();
            let command = c("command", spec.command.as_bytes())?;
            let mut argv = vec![command.as_ptr()];
            strings.push(command);
            for arg in &spec.args {
                let arg = c("argument", arg.as_bytes())?;
                argv.push(arg.as_ptr());
                strings.push(arg);
            }
            argv.push(ptr::null());
            let mut envp = Vec::with_capacity(spec.env.len() + 1);
            for (key, value) in &spec.env {
                let pair = c("environment", format!("{key}={value}").as_bytes())?;
                envp.push(pair.as_ptr());
                strings.push(pair);
            }
            envp.push(ptr::null());
            // execvp(3): a name with a slash is the file; any other is looked up in
            // PATH, where an empty entry is the working directory.
            let paths: Vec<Vec<u8>> = if spec.command.contains('/') {
                vec![spec.command.as_bytes().to_vec()]
            } else {
                let search = spec.env.get("PATH").map_or("/bin:/usr/bin", String::as_str);
                search
                    .split(':')
                    .map(|dir| match dir {
                        "" => spec.command.as_bytes().to_vec(),
                        dir => {
                            format!("{}/{}", dir.trim_end_matches('/'), spec.command).into_bytes()
                        }
                    })
                    // As execvp(3): a directory too long to hold the name is skipped.
                    .filter(|p| p.len() < libc::PATH_MAX as usize)
                    .collect()
            };
            let mut candidates = Vec::with_capacity(paths.len());
            for path in paths {
                let path = c("command", &path)?;
                let mut script_argv = vec![SHELL.as_ptr(), path.as_ptr()];
                script_argv.extend_from_slice(&argv[1..]);
                candidates.push(Candidate { path, script_argv });
            }
            let cwd = c("working directory", spec.cwd.as_os_str().as_encoded_bytes())?;
            Ok(Program {
                _strings: strings,
                candidates,
                argv,
                envp,
                cwd,
            })
        }
    }

    /// What the child reads, and the two fields it writes when a step fails.
    struct Child<'a> {
        program: &'a Program,
        stdio: [RawFd; 3],
        joins: &'a [RawFd],
        netns: RawFd,
        failed: Step,
        errno: c_int,
    }

    /// The child's stack: ample for the few system calls it makes (at least this,
    /// whole pages), with a guard page below it.
    const STACK: usize = 64 * 1024;

    /// A stack for the child: mapped, not allocated on the heap, so that an overflow
    /// faults on the guard page rather than overwriting the executor's heap.
    struct Stack {
        base: *mut c_void,
        /// The guard page's size: one page, whatever this kernel's page size is.
        guard: usize,
        /// Guard page and stack.
        len: usize,
    }

    impl Stack {
        fn map() -> std::io::Result<Stack> {
            let guard = rustix::param::page_size();
            let len = guard + STACK.next_multiple_of(guard);
            #[allow(unsafe_code)]
            // SAFETY: a fresh anonymous mapping, owned by the returned value, which
            // unmaps it; the guard page is the lowest of it.
            unsafe {
                let base = libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                    -1,
                    0,
                );
                if base == libc::MAP_FAILED {
                    return Err(std::io::Error::last_os_error());
                }
                let stack = Stack { base, guard, len };
                if libc::mprotect(base, guard, libc::PROT_NONE) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(stack)
            }
        }

        /// Its top (stacks grow down), 16-byte aligned as the ABI wants.
        fn top(&self) -> *mut c_void {
            debug_assert!(self.len > self.guard);
            self.base.cast::<u8>().wrapping_add(self.len).cast()
        }
    }

    impl Drop for Stack {
        fn drop(&mut self) {
            #[allow(unsafe_code)]
            // SAFETY: our own mapping, of this size, used by no one any more.
            unsafe {
                libc::munmap(self.base, self.len);
            }
        }
    }

    /// Every signal, glibc's own two included (its `sigfillset` leaves them out).
    const ALL_SIGNALS: u64 = !0;

    /// `rt_sigprocmask(SIG_SETMASK, set)`: the previous mask, or None if it failed.
    fn set_signal_mask(set: u64) -> Option<u64> {
        let mut old: u64 = 0;
        #[allow(unsafe_code)]
        // SAFETY: rt_sigprocmask reads and writes 8-byte masks we own (the kernel's
        // signal set is 64 bits on the architectures this builds for).
        let done = unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                ptr::from_ref(&set),
                ptr::from_mut(&mut old),
                8usize,
            )
        };
        (done == 0).then_some(old)
    }

    /// Start `program` with `stdio` at descriptors 0-2, in a process group of its
    /// own, after writing `0` to each of `joins` and entering `netns`. Its pid, or the
    /// step that failed and why (the child is then reaped).
    pub(super) fn start(
        program: &Program,
        stdio: [RawFd; 3],
        joins: &[RawFd],
        netns: Option<RawFd>,
    ) -> Result<u32, (Step, std::io::Error)> {
        let mut child = Child {
            program,
            stdio,
            joins,
            netns: netns.unwrap_or(-1),
            failed: Step::Exec,
            errno: 0,
        };
        let stack = Stack::map().map_err(|e| (Step::Exec, e))?;
        // Every signal blocked around the clone: the child must not run a handler of
        // the executor's before it has reset them. Put back right after.
        let mask = set_signal_mask(ALL_SIGNALS)
            .ok_or_else(|| (Step::Exec, std::io::Error::last_os_error()))?;
        #[allow(unsafe_code)]
        // SAFETY: clone(2) with CLONE_VM | CLONE_VFORK: the child runs `child_main` on
        // `stack`, which outlives it (the executor is suspended until the child has
        // exec'd or exited, and `stack` is unmapped only after that); `child` is live
        // and only written by the child while the executor is suspended.
        let pid = unsafe {
            libc::clone(
                child_main,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                ptr::from_mut(&mut child).cast::<c_void>(),
            )
        };
        let clone_error = std::io::Error::last_os_error();
        let _ = set_signal_mask(mask);
        drop(stack);
        let Ok(pid) = u32::try_from(pid) else {
            return Err((Step::Exec, clone_error));
        };
        #[allow(unsafe_code)]
        // SAFETY: the child has exec'd or exited (CLONE_VFORK); reading what it may
        // have written, as a volatile read since the compiler did not see it write.
        let errno = unsafe { ptr::read_volatile(&child.errno) };
        if errno == 0 {
            return Ok(pid);
        }
        // It failed and exited: reap it, so that its pid is not left a zombie.
        let raw = nix::unistd::Pid::from_raw(pid.cast_signed());
        while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(raw, None) {}
        Err((child.failed, std::io::Error::from_raw_os_error(errno)))
    }

    /// The kernel's `struct sigaction` (x86-64 and aarch64 layout): what
    /// rt_sigaction(2) takes, unlike the C library's.
    #[repr(C)]
    #[derive(Default)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }

    /// rt_sigaction(2): set `signal`'s disposition to `handler` (flags and mask
    /// cleared); the previous handler, or None for a signal that has none to ask.
    fn swap_handler(signal: c_int, handler: Option<usize>) -> Option<usize> {
        let new = handler.map(|handler| KernelSigaction {
            handler,
            ..KernelSigaction::default()
        });
        let mut old = KernelSigaction::default();
        #[allow(unsafe_code)]
        // SAFETY: rt_sigaction reads `new` and writes `old`, both ours, of the
        // kernel's layout; a signal that cannot be asked about is an error.
        let done = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                new.as_ref().map_or(ptr::null(), ptr::from_ref),
                ptr::from_mut(&mut old),
                8usize,
            )
        };
        (done == 0).then_some(old.handler)
    }

    /// execve(2) as a raw system call; returns its error.
    fn execve(
        path: *const c_char,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int {
        #[allow(unsafe_code)]
        // SAFETY: NUL-terminated strings and NULL-terminated arrays of them, made
        // before the clone and alive until the child is gone.
        let _ = unsafe { libc::syscall(libc::SYS_execve, path, argv, envp) };
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    }

    /// The child: runs on its own stack in the executor's memory, while the executor
    /// is suspended. System calls only, made by rustix's own code or through glibc's
    /// `syscall(3)` (which neither allocates nor locks), never the C library's named
    /// wrappers (`execve`, `write`, ...): a preloaded library (an exec logger, a
    /// security agent) may replace those with code that allocates or takes locks,
    /// which would run in the executor's memory. Never returns.
    extern "C" fn child_main(arg: *mut c_void) -> c_int {
        #[allow(unsafe_code)]
        // SAFETY: `arg` is the `Child` that `start` passed, alive until the child has
        // exec'd or exited; the executor does not touch it meanwhile.
        let child = unsafe { &mut *arg.cast::<Child<'_>>() };
        let give_up = |child: &mut Child<'_>, step: Step, errno: rustix::io::Errno| -> ! {
            child.failed = step;
            child.errno = match errno.raw_os_error() {
                0 => libc::EINVAL,
                e => e,
            };
            exit_127()
        };
        // Out of the executor's process group first: a signal aimed at that group
        // from now on no longer reaches the child.
        if let Err(e) = rustix::process::setpgid(None, None) {
            give_up(child, Step::ProcessGroup, e);
        }
        // A handler of the executor's must never run here: each goes back to the
        // default, and so does SIGPIPE (the task starts with standard signal
        // handling). Ignored first, which throws away an instance already waiting
        // (one that reached the executor's group before the line above): the
        // executor's handlers swallowed those, and the task must not die of one.
        for signal in 1..=64 {
            let Some(handler) = swap_handler(signal, None) else {
                continue;
            };
            let handled = handler != libc::SIG_DFL && handler != libc::SIG_IGN;
            if handled || (signal == libc::SIGPIPE && handler != libc::SIG_DFL) {
                swap_handler(signal, Some(libc::SIG_IGN));
                swap_handler(signal, Some(libc::SIG_DFL));
            }
        }
        for (target, fd) in (0..).zip(child.stdio) {
            #[allow(unsafe_code)]
            // SAFETY: descriptors the executor opened for this and keeps open until
            // the child is gone.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let done = match target {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                _ if std::os::fd::AsRawFd::as_raw_fd(&fd) == target => {
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
                }
                0 => rustix::stdio::dup2_stdin(fd),
                1 => rustix::stdio::dup2_stdout(fd),
                _ => rustix::stdio::dup2_stderr(fd),
            };
            if let Err(e) = done {
                give_up(child, Step::Stdio, e);
            }
        }
        if let Err(e) = rustix::process::chdir(child.program.cwd.as_c_str()) {
            give_up(child, Step::WorkingDirectory, e);
        }
        for &fd in child.joins {
            #[allow(unsafe_code)]
            // SAFETY: an open join file of the executor's (see `Join`).
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            match rustix::io::write(fd, b"0") {
                Ok(1) => {}
                Ok(_) => give_up(child, Step::Cgroup, rustix::io::Errno::IO),
                Err(e) => give_up(child, Step::Cgroup, e),
            }
        }
        if child.netns >= 0 {
            #[allow(unsafe_code)]
            // SAFETY: the group's network namespace file, open in the executor.
            let ns = unsafe { std::os::fd::BorrowedFd::borrow_raw(child.netns) };
            let entered = rustix::thread::move_into_link_name_space(
                ns,
                Some(rustix::thread::LinkNameSpaceType::Network),
            );
            if let Err(e) = entered {
                give_up(child, Step::NetworkNamespace, e);
            }
        }
        let _ = set_signal_mask(0);
        // execvp(3)'s search: a file that cannot be found, entered or executed (nor
        // run by /bin/sh) moves on to the next candidate; any other error ends it.
        // EACCES is reported if met anywhere, else the last error.
        let program = child.program;
        let mut denied = false;
        let mut last = libc::ENOENT;
        for candidate in &program.candidates {
            let mut e = execve(
                candidate.path.as_ptr(),
                program.argv.as_ptr(),
                program.envp.as_ptr(),
            );
            if e == libc::ENOEXEC {
                e = execve(
                    SHELL.as_ptr(),
                    candidate.script_argv.as_ptr(),
                    program.envp.as_ptr(),
                );
            }
            match e {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                other => give_up(
                    child,
                    Step::Exec,
                    rustix::io::Errno::from_raw_os_error(other),
                ),
            }
            last = e;
        }
        let e = if denied { libc::EACCES } else { last };
        give_up(child, Step::Exec, rustix::io::Errno::from_raw_os_error(e))
    }

    /// exit_group(2) with 127, as a raw system call.
    fn exit_127() -> ! {
        #[allow(unsafe_code)]
        // SAFETY: ends this (child) process; nothing of it is left to run.
        unsafe {
            libc::syscall(libc::SYS_exit_group, 127);
        }
        // exit_group does not return.
        #[allow(clippy::empty_loop)]
        loop {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox that hands back a pid of its choice (the executor must not trust it).
    struct Liar(u32);
    impl Sandbox for Liar {
        fn spawn(
            &self,
            _: &LaunchSpec,
            _: &crate::Isolation,
            _: &Path,
            _: bool,
            _: bool,
        ) -> Result<crate::Sandboxed, String> {
            let (status, _w) = rustix::pipe::pipe().map_err(|e| e.to_string())?;
            Ok(crate::Sandboxed {
                pid: self.0,
                stdout: None,
                stderr: None,
                status,
            })
        }
    }

    /// Start `spec` plainly, with its stdout piped; its exit code and output.
    fn run(spec: &LaunchSpec) -> Result<(i32, String), String> {
        use std::io::Read as _;
        let t = spawn(spec, Path::new("/"), true, false, None, Join::default())?;
        let mut output = String::new();
        std::fs::File::from(t.stdout.expect("stdout was piped"))
            .read_to_string(&mut output)
            .expect("the task's output is readable");
        let pid = nix::unistd::Pid::from_raw(t.pid as i32);
        match nix::sys::wait::waitpid(pid, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => Ok((code, output)),
            other => panic!("task {pid} ended otherwise: {other:?}"),
        }
    }

    fn sh(script: &str) -> LaunchSpec {
        let mut spec = LaunchSpec::new("t", "/bin/sh");
        spec.args = vec!["-c".into(), script.into()];
        spec
    }

    #[test]
    fn the_task_gets_its_arguments_environment_directory_and_own_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh(r#"echo "$0|$1|$GREETING|$(pwd)|$(cut -d" " -f5 /proc/$$/stat)|$$""#);
        spec.args.extend(["zero".into(), "one two".into()]);
        spec.env.insert("GREETING".into(), "hello there".into());
        spec.cwd = dir.path().to_path_buf();
        let (code, out) = run(&spec).unwrap();
        assert_eq!(code, 0);
        let fields: Vec<&str> = out.trim().split('|').collect();
        assert_eq!(
            fields[..4],
            [
                "zero",
                "one two",
                "hello there",
                &*dir.path().to_string_lossy()
            ]
        );
        assert_eq!(
            fields[4].trim(),
            fields[5],
            "the task leads its own process group: {out}"
        );
    }

    #[test]
    fn the_environment_is_exactly_the_specs() {
        let mut spec = LaunchSpec::new("t", "/usr/bin/env");
        spec.env.insert("ONLY".into(), "this".into());
        assert_eq!(run(&spec).unwrap(), (0, "ONLY=this\n".to_string()));
    }

    #[test]
    fn the_task_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
        // This test binary ignores SIGPIPE (Rust's runtime does), and the executor
        // blocks signals while it starts the child: neither may reach the task.
        let (code, out) = run(&sh("grep -E '^Sig(Blk|Ign)' /proc/self/status")).unwrap();
        assert_eq!(code, 0);
        let mask = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0, "{out}");
        let sigpipe = 1 << (nix::libc::SIGPIPE - 1);
        assert_eq!(
            mask("SigIgn:") & sigpipe,
            0,
            "SIGPIPE is ignored in the task: {out}"
        );
    }

    #[test]
    fn the_task_inherits_no_descriptor_of_the_executors_beyond_its_stdio() {
        // Descriptors this test process holds without close-on-exec (say, a job
        // server's pipe from cargo) are not the executor's doing; all else is.
        let inheritable: Vec<i32> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd: &i32| {
                #[allow(unsafe_code)]
                // SAFETY: F_GETFD only reads the flags of a descriptor number.
                let flags = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) };
                flags >= 0 && flags & nix::libc::FD_CLOEXEC == 0
            })
            .collect();
        let mut spec = LaunchSpec::new("t", "/bin/ls");
        spec.args = vec!["/proc/self/fd".into()];
        let (code, out) = run(&spec).unwrap();
        assert_eq!(code, 0);
        for fd in out.split_whitespace().map(|f| f.parse::<i32>().unwrap()) {
            // 0-2 are its stdio; 3 is ls's own listing of the directory.
            assert!(
                fd <= 3 || inheritable.contains(&fd),
                "the task holds descriptor {fd} of the executor's: {out}"
            );
        }
    }

    #[test]
    fn a_bare_name_is_found_in_the_specs_path_as_execvp_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let not_executable = dir.path().join("hello");
        std::fs::write(&not_executable, "#!/bin/sh\necho wrong\n").unwrap();
        let mut spec = LaunchSpec::new("t", "echo");
        spec.args = vec!["found".into()];
        // A directory that does not exist, one whose `echo` may not be run, then /bin.
        spec.env.insert(
            "PATH".into(),
            format!("/nonexistent:{}:/bin", dir.path().display()),
        );
        std::fs::copy(&not_executable, dir.path().join("echo")).unwrap();
        assert_eq!(run(&spec).unwrap(), (0, "found\n".to_string()));

        spec.command = "no-such-program-anywhere".into();
        let err = run(&spec).unwrap_err();
        assert!(err.contains("No such file or directory"), "{err}");
        // Found only where it may not be executed: that is the error.
        spec.command = "hello".into();
        let err = run(&spec).unwrap_err();
        assert!(err.contains("Permission denied"), "{err}");
    }

    #[test]
    fn a_file_the_kernel_cannot_execute_runs_under_bin_sh() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("no-shebang");
        // Written by another process: a file this (multi-threaded) test process had
        // open for writing could still be open in a child another test is starting
        // at that moment, and executing it would fail with ETXTBSY.
        let written = std::process::Command::new("/bin/sh")
            .args(["-c", "printf 'echo \"ran with $1\"\\nexit 7\\n' > \"$0\""])
            .arg(&script)
            .status()
            .unwrap();
        assert!(written.success());
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut spec = LaunchSpec::new("t", script.to_string_lossy());
        spec.args = vec!["an argument".into()];
        assert_eq!(
            run(&spec).unwrap(),
            (7, "ran with an argument\n".to_string())
        );
    }

    #[test]
    fn a_failed_step_is_named() {
        let missing = LaunchSpec::new("t", "/nonexistent/program");
        let err = run(&missing).unwrap_err();
        assert!(
            err.starts_with("cannot start command \"/nonexistent/program\" in /:")
                && err.contains("No such file or directory"),
            "{err}"
        );
        let mut nul = LaunchSpec::new("t", "/bin/true");
        nul.args = vec!["a\0b".into()];
        let err = run(&nul).unwrap_err();
        assert!(err.contains("argument contains a NUL byte"), "{err}");
        // A cgroup file that cannot be written: the join step fails, by name.
        let read_only = std::fs::File::open("/dev/null").unwrap();
        let join = Join::from_files(vec![read_only.into()]);
        let Err(err) = spawn(
            &LaunchSpec::new("t", "/bin/true"),
            Path::new("/"),
            false,
            false,
            None,
            join,
        ) else {
            panic!("a start whose cgroup join failed went on");
        };
        assert!(
            err.contains("joining its cgroup: Bad file descriptor"),
            "{err}"
        );
    }

    #[test]
    fn a_pid_that_is_not_the_executors_child_is_refused() {
        let mut spec = LaunchSpec::new("t", "/bin/true");
        spec.isolation = Some(crate::Isolation::default());
        // pid 1 is nobody's child here; our own pid is not our child either.
        for pid in [1, std::process::id()] {
            let Err(err) = spawn(
                &spec,
                Path::new("/nonexistent"),
                false,
                false,
                Some(&Liar(pid)),
                Join::default(),
            ) else {
                panic!("a sandbox's pid {pid} that is not our child was trusted");
            };
            assert!(err.contains("not this executor's child"), "{err}");
        }
    }

    #[test]
    fn isolation_without_a_sandbox_is_refused_before_anything_starts() {
        let mut spec = LaunchSpec::new("t", "/bin/true");
        spec.isolation = Some(crate::Isolation::default());
        let Err(err) = spawn(
            &spec,
            Path::new("/nonexistent"),
            false,
            false,
            None,
            Join::default(),
        ) else {
            panic!("an isolated task started without a sandbox");
        };
        assert!(err.contains("no sandbox"), "{err}");
    }
}
