//! The one place where a task process is created. Isolation for the exec and java
//! drivers (namespaces, chroot, cgroup, capabilities, user, rlimits) goes here, applied
//! between fork and exec from optional fields of the [`LaunchSpec`].

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};

use super::LaunchSpec;

/// Start the task described by `spec`: its own process group (so that signals reach
/// everything it forks), environment exactly `spec.env`, stdin `/dev/null`, stdout and
/// stderr as given. The error names the command and what was wrong.
///
/// The executor blocks SIGINT and SIGHUP for itself; `std::process::Command` gives the
/// child an empty signal mask and a default SIGPIPE disposition, so the task starts
/// with standard signal handling.
pub(crate) fn spawn_task(spec: &LaunchSpec, stdout: Stdio, stderr: Stdio) -> Result<Child, String> {
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
    Command::new(&spec.command)
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
