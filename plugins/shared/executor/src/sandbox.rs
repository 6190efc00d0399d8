//! The hook through which an executor starts a task whose [`LaunchSpec`] asks for
//! [`Isolation`]. The executor itself knows nothing of namespaces, mounts, cgroups or
//! capabilities: a driver that isolates its tasks (exec, java) hands its [`Sandbox`]
//! to [`crate::run_if_executor`] in `main`; `drover-isolation` has the Linux one.
//!
//! Between the executor and a sandbox's init process there is one small protocol, kept
//! here so that both sides read it in one place: the **status pipe**. The init writes
//! `code N` or `signal N` for the task just before it exits itself
//! ([`report_task_exit`]), so that the executor reports the task's real status rather
//! than the init's.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use drover_plugin_sdk::ExitResult;

use crate::{Isolation, LaunchSpec};

/// Starts isolated tasks for an executor. Implemented by `drover-isolation`.
///
/// ```
/// use std::path::Path;
/// use drover_executor::{Isolation, LaunchSpec, Sandbox, Sandboxed};
///
/// /// A sandbox that refuses everything (a real one forks and isolates).
/// struct Refuse;
/// impl Sandbox for Refuse {
///     fn spawn(&self, _: &LaunchSpec, _: &Isolation, _: &Path, _: bool, _: bool)
///         -> Result<Sandboxed, String> {
///         Err("no sandbox here".into())
///     }
/// }
/// // In a driver's main, before anything else:
/// // drover_executor::run_if_executor(Some(&Refuse));
/// ```
pub trait Sandbox: Sync {
    /// Start the task of `spec` contained as `isolation` says, in its own process
    /// group, from the executor (single-threaded, so forking it is safe). `dir` is the
    /// task's executor directory (the sandbox may build the task's root there);
    /// `stdout`/`stderr`: whether to pipe them to the executor (else `/dev/null`).
    /// Returns once the task's `exec` succeeded, or the error of the step that failed,
    /// naming it, with nothing left running.
    fn spawn(
        &self,
        spec: &LaunchSpec,
        isolation: &Isolation,
        dir: &Path,
        stdout: bool,
        stderr: bool,
    ) -> Result<Sandboxed, String>;
}

/// A task a [`Sandbox`] started.
#[derive(Debug)]
pub struct Sandboxed {
    /// The executor's child (the task's init), which leads its own process group.
    pub pid: u32,
    /// Read end of the task's stdout, when piped.
    pub stdout: Option<OwnedFd>,
    /// Read end of the task's stderr, when piped.
    pub stderr: Option<OwnedFd>,
    /// Read end of the status pipe, written with [`report_task_exit`].
    pub status: OwnedFd,
}

/// How the task under a sandbox's init ended, as the init saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskExit {
    /// It exited with this code.
    Code(i32),
    /// A signal of this number killed it.
    Signal(i32),
}

/// Write the task's end to the status pipe (the init does, just before it exits).
///
/// ```
/// use drover_executor::sandbox::{TaskExit, report_task_exit};
/// let (r, w) = rustix::pipe::pipe().unwrap();
/// report_task_exit(&w, TaskExit::Signal(9));
/// # drop(r);
/// ```
pub fn report_task_exit(pipe: impl AsFd, exit: TaskExit) {
    let text = match exit {
        TaskExit::Code(n) => format!("code {n}"),
        TaskExit::Signal(n) => format!("signal {n}"),
    };
    let _ = rustix::io::write(pipe, text.as_bytes());
}

/// The task's exit status as its init reported it, if it did.
pub(crate) fn read_status(pipe: &OwnedFd) -> Option<ExitResult> {
    let _ = rustix::io::ioctl_fionbio(pipe, true);
    let mut buf = [0u8; 64];
    let n = rustix::io::read(pipe, &mut buf).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let (kind, value) = text.trim().split_once(' ')?;
    let value: i32 = value.parse().ok()?;
    match kind {
        "code" => Some(ExitResult::code(value)),
        "signal" => Some(ExitResult::signaled(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_round_trip() {
        for (exit, want) in [
            (TaskExit::Signal(9), ExitResult::signaled(9)),
            (TaskExit::Code(3), ExitResult::code(3)),
        ] {
            let (r, w) = rustix::pipe::pipe().unwrap();
            report_task_exit(&w, exit);
            drop(w);
            assert_eq!(read_status(&r), Some(want));
        }
        let (r, w) = rustix::pipe::pipe().unwrap();
        drop(w);
        assert_eq!(read_status(&r), None);
    }
}
