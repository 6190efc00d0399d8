//! The one place where a task process is created: a plain process group
//! ([`spawn_task`], rawexec), or with the [`super::Isolation`] of the exec and java
//! drivers, through the [`Sandbox`] the plugin's `main` handed to the executor.

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

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
    let stdio = |piped: bool| if piped { Stdio::piped() } else { Stdio::null() };
    let mut child = spawn_task(spec, stdio(stdout), stdio(stderr), join)?;
    let spawned = Spawned {
        pid: child.id(),
        stdout: child.stdout.take().map(OwnedFd::from),
        stderr: child.stderr.take().map(OwnedFd::from),
        status: None,
    };
    // Dropping a std Child neither kills nor waits: the executor's pidfd takes over.
    drop(child);
    Ok(spawned)
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
/// stderr as given. The error names the command and what was wrong.
///
/// The executor blocks SIGINT and SIGHUP for itself; `std::process::Command` gives the
/// child an empty signal mask and a default SIGPIPE disposition, so the task starts
/// with standard signal handling.
///
/// `join`: files (`cgroup.procs`, or v1 `tasks`) the child writes `0` to before it
/// execs, so that it is in its cgroup before it can fork anything: nothing the task
/// starts is ever outside it.
pub(crate) fn spawn_task(
    spec: &LaunchSpec,
    stdout: Stdio,
    stderr: Stdio,
    join: Join,
) -> Result<Child, String> {
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
    let mut command = Command::new(&spec.command);
    join.before_exec(&mut command);
    if let Some(path) = &spec.netns_path {
        let ns = std::fs::File::open(path).map_err(|e| {
            format!(
                "cannot open the group's network namespace {}: {e}",
                path.display()
            )
        })?;
        use std::os::fd::AsFd as _;
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the closure runs between fork and exec; it only calls setns(2),
        // which is async-signal-safe, on a descriptor the closure owns (open in the
        // child), and allocates nothing (an error is a bare OS error code).
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(std::io::Error::from)
            });
        }
    }
    command
        .args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start command {:?} in {}: {e}",
                spec.command,
                spec.cwd.display()
            )
        })
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
