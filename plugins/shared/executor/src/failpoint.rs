//! Failure points for tests, in debug builds only: an executor that dies at a moment a
//! test could not otherwise hit on purpose (the few microseconds between its task's
//! `execve` and its start-up reply, say). A release build has no failure points: the
//! functions here do nothing, and the variable is never read.

/// Environment variable of a plugin (debug builds only) naming the point at which each
/// of its executors kills itself with SIGKILL:
/// - `before-reply`: after its task has started, before the start-up reply.
///
/// A driver hands it on to its executors (whose environment is otherwise cleared).
///
/// ```
/// assert_eq!(drover_executor::ENV_EXECUTOR_FAILPOINT, "DROVER_EXECUTOR_FAILPOINT");
/// ```
pub const ENV_EXECUTOR_FAILPOINT: &str = "DROVER_EXECUTOR_FAILPOINT";

/// In an executor: SIGKILL itself if [`ENV_EXECUTOR_FAILPOINT`] names `point`.
#[cfg(debug_assertions)]
pub(crate) fn die_at(point: &str) {
    if std::env::var_os(ENV_EXECUTOR_FAILPOINT).is_some_and(|v| v == point) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub(crate) fn die_at(_point: &str) {}

/// In a driver: hand its failure point, if it has one, on to the executor (or the
/// executor spawner) `cmd` starts.
#[cfg(debug_assertions)]
pub(crate) fn hand_on(cmd: &mut tokio::process::Command) {
    if let Some(point) = std::env::var_os(ENV_EXECUTOR_FAILPOINT) {
        cmd.env(ENV_EXECUTOR_FAILPOINT, point);
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub(crate) fn hand_on(_cmd: &mut tokio::process::Command) {}
