//! A task whose executor died: find its processes by proof, never by a bare pid, and
//! kill them, so that a driver can say the task ended (and a restart policy start it
//! again) only once no copy of it runs.
//!
//! Proof, strongest first:
//! - **cgroup membership**: a plain task started with [`crate::LaunchSpec::own_cgroup`]
//!   is in [`crate::cgroup::plain_path`] of its directory with everything it started;
//!   emptying that cgroup (freezer or `cgroup.kill`) kills exactly the task, `setsid`
//!   children included.
//! - **pidfd and start time**: a pidfd opened on the task's pid, then the start time
//!   of that pid read from `/proc` and found equal to the one recorded at launch,
//!   names the task's main process for good (the process held the pid before the
//!   pidfd was opened and still holds it after). Its process group is killed while
//!   the leader is alive (so the group id cannot belong to anyone else), then the
//!   leader through the pidfd. Processes that left the group (`setsid`) are out of
//!   reach without a cgroup.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use drover_plugin_sdk::DriverError;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags};

use crate::{cgroup, files, procfs};

/// How long the processes of a lost task may take to die after SIGKILL.
pub const KILL_LIMIT: Duration = Duration::from_secs(10);

/// A process proven to be the one that had `pid` and `start_time`: its pidfd, or
/// `None` when that process has exited (whatever holds the pid now is someone else).
/// An error when the proof cannot be made (no start time was recorded).
///
/// Init, the calling process and its parent are never a task: naming one is an error.
///
/// ```
/// use drover_executor::{lost::prove, procfs::process_start_time};
/// let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
/// let pid = child.id();
/// let start = process_start_time(pid).unwrap();
/// assert!(prove(pid, start).unwrap().is_some());
/// assert!(prove(pid, start + 1).unwrap().is_none());
/// let me = std::process::id();
/// assert!(prove(me, process_start_time(me).unwrap()).is_err());
/// assert!(prove(1, process_start_time(1).unwrap()).is_err());
/// child.kill().unwrap();
/// child.wait().unwrap();
/// ```
pub fn prove(pid: u32, start_time: u64) -> Result<Option<OwnedFd>, String> {
    if start_time == 0 {
        return Err(format!(
            "no start time was recorded for process {pid}, so it cannot be told from a \
             later process with the same pid"
        ));
    }
    let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Err(format!("impossible pid {pid}"));
    };
    // Never a task's: init, this process or its parent (the plugin's host). Whatever
    // recorded such a pid was wrong or forged.
    let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get().unsigned_abs());
    if pid <= 1 || pid == std::process::id() || Some(pid) == parent {
        return Err(format!(
            "process {pid} is init, this driver or its parent, never a task's; the record \
             naming it is wrong"
        ));
    }
    let pidfd = match rustix::process::pidfd_open(raw, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(None),
        Err(e) => return Err(format!("cannot open a pidfd of process {pid}: {e}")),
    };
    // Read after the pidfd was opened: see the module comment.
    match procfs::process_start_time(pid) {
        Ok(t) if t == start_time => Ok(Some(pidfd)),
        // Another process has the pid now, or it has exited meanwhile.
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the start time of process {pid}: {e}")),
    }
}

/// Send signal number `signal` to the process that had `pid` and `start_time`, through
/// a pidfd once proven ([`prove`]): `Ok(true)` when sent, `Ok(false)` when that process
/// has exited (nothing is sent: the pid may be someone else's now).
pub fn signal_proven(pid: u32, start_time: u64, signal: i32) -> Result<bool, String> {
    let sig = rustix::process::Signal::from_named_raw(signal)
        .ok_or_else(|| format!("unknown signal number {signal}"))?;
    let Some(pidfd) = prove(pid, start_time)? else {
        return Ok(false);
    };
    match rustix::process::pidfd_send_signal(&pidfd, sig) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(format!("cannot send signal {signal} to process {pid}: {e}")),
    }
}

/// A pidfd of `pid`, a child of this process not yet reaped (so its pid cannot have
/// gone to another process); `None` without pidfds (a kernel before 5.3).
pub(crate) fn pidfd_of_child(pid: i32) -> Option<OwnedFd> {
    Pid::from_raw(pid).and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok())
}

/// Wait until the process of `pidfd` has exited (a zombie counts), up to `limit`.
pub fn wait_exit(pidfd: &OwnedFd, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let timeout = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(n) if n > 0 => return true,
            Err(rustix::io::Errno::INTR) => continue,
            _ if left.is_zero() => return false,
            Ok(_) => return false,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Kill the process proven by `pidfd` and, when it leads it, its process group `pgid`;
/// wait until it has exited.
fn kill_proven(pidfd: &OwnedFd, pid: u32, pgid: u32) -> Result<String, String> {
    // A group id of 1 or less would be `kill(-1)` (every process) or worse.
    let group_killed = if pgid == pid
        && pgid > 1
        && let Ok(group) = i32::try_from(pgid)
        && leads_own_group(pidfd, pid)
    {
        // The leader is alive (we hold its pidfd and it has not exited: checked just
        // now), so the group id is still its own.
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(group),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
    } else {
        false
    };
    match rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => return Err(format!("cannot SIGKILL process {pid}: {e}")),
    }
    if wait_exit(pidfd, KILL_LIMIT) {
        let group = if group_killed {
            format!(" and its process group {pgid}")
        } else {
            String::new()
        };
        Ok(format!(
            "killed its process {pid} (identity proven by pidfd and start time){group}"
        ))
    } else {
        Err(format!(
            "process {pid} is still alive {KILL_LIMIT:?} after SIGKILL"
        ))
    }
}

/// Whether the process of `pidfd` (pid `pid`) has not exited and leads the process group
/// of its own pid: only then is a signal to that group id sure to reach its group and
/// nobody else's (a group id stays taken while its leader lives).
fn leads_own_group(pidfd: &OwnedFd, pid: u32) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let exited = !matches!(
        rustix::event::poll(&mut fds, Some(&Timespec::default())),
        Ok(0)
    );
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // nix's, not rustix's: a group outside this pid namespace reads as 0, which
    // rustix's `Pid` cannot hold.
    let leader = nix::unistd::Pid::from_raw(raw);
    !exited && nix::unistd::getpgid(Some(leader)).is_ok_and(|g| g == leader)
}

/// Empty and remove the plain task cgroup of executor directory `dir`, if there is
/// one. `Ok(None)` when there is none (no cgroups here, or it is gone already).
pub fn empty_plain_cgroup(dir: &Path) -> Result<Option<String>, String> {
    let Some(version) = cgroup::plain_support() else {
        return Ok(None);
    };
    let cg = cgroup::open_plain(version, &cgroup::plain_path(dir));
    if !cg.exists() {
        return Ok(None);
    }
    let had = cg.pids();
    cgroup::empty_and_remove(&*cg, KILL_LIMIT)?;
    Ok(Some(if had.is_empty() {
        format!("removed its empty cgroup {}", cg.path())
    } else {
        format!(
            "killed every process in its cgroup {} ({had:?}) and removed it",
            cg.path()
        )
    }))
}

/// Whether nothing of the task of the dead executor in `dir` can run: the executor never bound
/// its socket (which comes before the task's start), or the task was to have a cgroup
/// of its own ([`crate::LaunchSpec::own_cgroup`], created before the task's start and
/// removed only once the task is gone) and there is none.
pub fn nothing_can_run(dir: &Path) -> bool {
    if !crate::socket_path(dir).exists() {
        return true;
    }
    let spec: Option<crate::LaunchSpec> = std::fs::read(dir.join(crate::SPEC_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    match (spec, cgroup::plain_support()) {
        (Some(spec), Some(version)) if spec.own_cgroup && spec.isolation.is_none() => {
            !cgroup::open_plain(version, &cgroup::plain_path(dir)).exists()
        }
        _ => false,
    }
}

/// Kill what is left of the task whose executor directory is `dir`, whose executor is
/// dead: everything in its cgroup, else its main process `pid` (and group `pgid`) once
/// proven by `start_time`. Returns what was done, for the task's events; an error when
/// a copy of the task may still run (the caller must then not report the task as
/// ended). Blocking (up to [`KILL_LIMIT`]): call it from `spawn_blocking`.
pub fn kill_lost_task(dir: &Path, pid: u32, pgid: u32, start_time: u64) -> Result<String, String> {
    kill_left_behind(dir, || kill_process(pid, pgid, start_time))
}

/// Kill what is left of the task whose executor in `dir` died before anyone heard of
/// its task (no start-up reply reached the plugin, so no task handle holds its pid):
/// nothing when the task cannot have started ([`nothing_can_run`]); else everything in
/// its cgroup; else its main process, proven by the pid and start time its executor
/// wrote into the lock file (see [`kill_lost_task`]). An error when none of these can
/// tell which processes are the task's: a copy may then still run, and the caller must
/// keep the directory. Blocking (up to [`KILL_LIMIT`]).
pub fn kill_unreported_task(dir: &Path) -> Result<String, String> {
    kill_left_behind(dir, || {
        if nothing_can_run(dir) {
            return Ok(
                "nothing of the task runs (its executor died before starting it, or its \
                 cgroup is gone)"
                    .into(),
            );
        }
        match files::read_task_proof(dir) {
            Some(task) => kill_process(task.pid, task.pid, task.start_time),
            None => Err(format!(
                "its executor died without a result, and neither a cgroup nor the task's \
                 pid (which it writes into {} once the task runs) tells which processes are \
                 the task's, so the task may still run",
                dir.join(crate::LOCK_FILE).display()
            )),
        }
    })
}

/// What [`kill_lost_task`] and [`kill_unreported_task`] share: nothing while the
/// executor in `dir` lives (it owns the task); else the task's cgroup first, whatever
/// else is known (it holds every process, proven ours by where it is, and a socket
/// file removed by hand must not leave it populated); else `otherwise`.
fn kill_left_behind(
    dir: &Path,
    otherwise: impl FnOnce() -> Result<String, String>,
) -> Result<String, String> {
    if files::lock_state(dir).held() {
        return Err(format!(
            "the executor in {} is alive: it owns the task",
            dir.display()
        ));
    }
    if let Some(done) = empty_plain_cgroup(dir)? {
        return Ok(done);
    }
    otherwise()
}

/// Kill process `pid` (and its group `pgid`) once proven by `start_time`.
fn kill_process(pid: u32, pgid: u32, start_time: u64) -> Result<String, String> {
    match prove(pid, start_time)? {
        None => Ok(format!("its process {pid} had exited already")),
        Some(pidfd) => kill_proven(&pidfd, pid, pgid),
    }
}

/// [`kill_lost_task`] from async code.
pub async fn kill_lost_task_async(
    dir: &Path,
    pid: u32,
    pgid: u32,
    start_time: u64,
) -> Result<String, DriverError> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || kill_lost_task(&dir, pid, pgid, start_time))
        .await
        .map_err(DriverError::internal)?
        .map_err(DriverError::Internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proven_process_group_is_killed_and_a_reused_pid_is_left_alone() {
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = procfs::process_start_time(pid).unwrap();
        // A wrong start time: someone else's process, never touched.
        assert!(prove(pid, start + 7).unwrap().is_none());
        assert!(child.try_wait().unwrap().is_none());
        let tmp = tempfile::tempdir().unwrap();
        let done = kill_lost_task(tmp.path(), pid, pid, start).unwrap();
        assert!(done.contains("killed its process"), "{done}");
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(9));
        assert!(prove(pid, 0).is_err());
    }

    #[test]
    fn a_task_nobody_heard_of_is_found_by_the_proof_in_its_lock_file() {
        use std::os::unix::process::CommandExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // An executor that bound its socket (so its task may have started) and died.
        std::fs::write(crate::socket_path(dir), "").unwrap();
        let spec = crate::LaunchSpec::new("t", "/bin/sleep");
        std::fs::write(
            dir.join(crate::SPEC_FILE),
            serde_json::to_vec(&spec).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.join(crate::LOCK_FILE), "4242\n").unwrap();
        // No cgroup and no proof: it may run, and nothing says which process it is.
        let err = kill_unreported_task(dir).unwrap_err();
        assert!(err.contains("may still run"), "{err}");

        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = procfs::process_start_time(pid).unwrap();
        // A proof naming someone else (a reused pid): left alone, and nothing to kill.
        std::fs::write(
            dir.join(crate::LOCK_FILE),
            format!("4242\n{pid} {}\n", start + 3),
        )
        .unwrap();
        let done = kill_unreported_task(dir).unwrap();
        assert!(done.contains("had exited already"), "{done}");
        assert!(child.try_wait().unwrap().is_none());

        std::fs::write(dir.join(crate::LOCK_FILE), format!("4242\n{pid} {start}\n")).unwrap();
        let done = kill_unreported_task(dir).unwrap();
        assert!(done.contains("killed its process"), "{done}");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(child.wait().unwrap().signal(), Some(9));

        // A forged or wrong proof naming init or this process is refused, not obeyed
        // (init's group id would make the group kill `kill(-1)`).
        let parent = nix::unistd::getppid().as_raw().unsigned_abs();
        for pid in [1, std::process::id(), parent] {
            let start = procfs::process_start_time(pid).unwrap();
            std::fs::write(dir.join(crate::LOCK_FILE), format!("4242\n{pid} {start}\n")).unwrap();
            let err = kill_unreported_task(dir).unwrap_err();
            assert!(err.contains("never a task's"), "{err}");
        }

        // An executor that never bound its socket never started its task.
        std::fs::remove_file(crate::socket_path(dir)).unwrap();
        std::fs::write(dir.join(crate::LOCK_FILE), "").unwrap();
        let done = kill_unreported_task(dir).unwrap();
        assert!(done.contains("nothing of the task runs"), "{done}");
    }
}
