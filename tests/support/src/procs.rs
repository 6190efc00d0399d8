//! Processes as `/proc` shows them (parsed by `procfs-core`).

use procfs_core::FromRead as _;
use procfs_core::process::Stat;

/// What tests look at in `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group.
    pub pgid: u32,
    /// Start time in clock ticks since boot: with the pid, one process for good.
    pub start_time: u64,
}

/// `/proc/<pid>/stat` of `pid`, or `None` when there is no such process.
///
/// ```
/// let me = drover_test_support::procs::stat(std::process::id()).unwrap();
/// assert_ne!(me.state, 'Z');
/// ```
pub fn stat(pid: u32) -> Option<ProcInfo> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let s = Stat::from_read(text.as_slice()).ok()?;
    Some(ProcInfo {
        state: s.state,
        ppid: u32::try_from(s.ppid).ok()?,
        pgid: u32::try_from(s.pgrp).ok()?,
        start_time: s.starttime,
    })
}

/// Start time of `pid` in clock ticks since boot.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.start_time)
}

/// Whether `pid` is a live process: a zombie is not (it only waits to be reaped,
/// which an orphan's init may never do in a container), nor a dead one.
///
/// ```
/// assert!(drover_test_support::procs::alive(std::process::id()));
/// ```
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Live processes whose (ppid, pgid) satisfy `pred`.
pub fn processes(pred: impl Fn(u32, u32) -> bool) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X' && pred(s.ppid, s.pgid))
        })
        .collect()
}

/// The environment of process `pid` (`/proc/<pid>/environ`), by name; empty when it
/// cannot be read (the process is gone).
///
/// ```
/// let env = drover_test_support::procs::environ(std::process::id());
/// assert_eq!(env.get("PATH").cloned(), std::env::var("PATH").ok());
/// ```
pub fn environ(pid: u32) -> std::collections::BTreeMap<String, String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter_map(|e| {
            let e = String::from_utf8_lossy(e);
            e.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Proportional set size and private dirty memory of `pid` in KiB, from
/// `/proc/<pid>/smaps_rollup` (0 for a field it lacks); `None` when there is no such
/// process.
///
/// ```
/// let (pss, _dirty) = drover_test_support::procs::memory_kib(std::process::id()).unwrap();
/// assert!(pss > 0);
/// ```
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Some((field("Pss:"), field("Private_Dirty:")))
}
