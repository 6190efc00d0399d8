//! The few facts executor-backed drivers read from `/proc`, parsed by `procfs-core`
//! (which counts `/proc/<pid>/stat` fields from the *last* `)`, so a command name with
//! spaces or parentheses does not shift them).

use std::time::Duration;

use procfs_core::FromRead as _;
use procfs_core::process::{Stat, Status};

/// Fields of `/proc/<pid>/stat` that drivers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process state letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// User CPU time in clock ticks (field 14).
    pub utime: u64,
    /// System CPU time in clock ticks (field 15).
    pub stime: u64,
    /// Start time in clock ticks since boot (field 22).
    pub start_time: u64,
    /// Resident memory in bytes (field 24, in pages).
    pub rss_bytes: u64,
}

impl From<Stat> for ProcStat {
    fn from(s: Stat) -> Self {
        ProcStat {
            state: s.state,
            utime: s.utime,
            stime: s.stime,
            start_time: s.starttime,
            rss_bytes: s.rss.saturating_mul(rustix::param::page_size() as u64),
        }
    }
}

/// Parse the text of a `/proc/<pid>/stat` file.
///
/// ```
/// let s = drover_executor::procfs::parse_stat(
///     "42 (a b)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 123456 \
///      2000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0").unwrap();
/// assert_eq!((s.state, s.utime, s.stime, s.start_time), ('S', 7, 3, 123456));
/// ```
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    stat_of(text.as_bytes()).ok().map(ProcStat::from)
}

/// `procfs-core` slices around the command name without checking bounds, so text
/// without a pid before it or fields after it would panic there (a kernel never writes
/// such a file, but this is public and runs in the executor): refuse it first.
fn stat_of(text: &[u8]) -> Result<Stat, String> {
    let open = text.iter().position(|&b| b == b'(');
    let close = text.iter().rposition(|&b| b == b')');
    match (open, close) {
        (Some(open), Some(close)) if open >= 2 && close > open && close + 2 < text.len() => {
            Stat::from_read(text).map_err(|e| e.to_string())
        }
        _ => Err("no `pid (comm) state ...` line".into()),
    }
}

/// Read and parse `/proc/<pid>/stat`.
pub fn read_stat(pid: u32) -> std::io::Result<ProcStat> {
    use std::io::Read as _;
    let path = format!("/proc/{pid}/stat");
    // Room for the usual file (300-odd bytes) up front: `fs::read` sizes its buffer
    // from the file's length, which /proc gives as 0, and grew it read by read (six
    // reads). Through `take`, `read_to_end` does not ask the length either (a statx
    // and an lseek): one read, and one that finds the end. A longer file (52 numbers
    // of up to 20 digits could pass 1 KiB) still grows the buffer, up to the bound.
    let mut text = Vec::with_capacity(1024);
    std::fs::File::open(&path)?
        .take(64 * 1024)
        .read_to_end(&mut text)?;
    stat_of(&text)
        .map(ProcStat::from)
        .map_err(|e| std::io::Error::other(format!("unexpected {path} format: {e}")))
}

/// When process `pid` started, in clock ticks since boot: with the pid, it names one
/// process for good (a reused pid has another start time).
pub fn process_start_time(pid: u32) -> std::io::Result<u64> {
    read_stat(pid).map(|s| s.start_time)
}

/// The clock tick since boot it is now, in the unit and from the clock of
/// `/proc/<pid>/stat`'s start time (the kernel's `nsec_to_clock_t` of the boot-time
/// clock: whole ticks, rounded down). `None` where the tick does not divide a second
/// into whole nanoseconds (then the kernel rounds otherwise).
///
/// A process created between two readings that give the same tick started in that
/// tick: its start time is known without reading `/proc`, which costs an executor's
/// start an open of a `/proc` file, a read and a close.
///
/// ```
/// use drover_executor::procfs::{boot_tick_now, process_start_time};
/// let before = boot_tick_now().unwrap();
/// let child = std::process::Command::new("true").spawn().unwrap();
/// let after = boot_tick_now().unwrap();
/// if before == after {
///     assert_eq!(process_start_time(child.id()).unwrap(), before);
/// }
/// ```
pub fn boot_tick_now() -> Option<u64> {
    const NANOS: u64 = 1_000_000_000;
    let hz = clock_ticks_per_second();
    if !NANOS.is_multiple_of(hz) {
        return None;
    }
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let ns = u64::try_from(now.tv_sec)
        .ok()?
        .checked_mul(NANOS)?
        .checked_add(u64::try_from(now.tv_nsec).ok()?)?;
    Some(ns / (NANOS / hz))
}

/// `VmRSS` of the text of a `/proc/<pid>/status` file, in bytes; 0 when absent (a
/// zombie has none) or unreadable.
pub fn parse_vm_rss(status: &str) -> u64 {
    Status::from_read(status.as_bytes())
        .ok()
        .and_then(|s| s.vmrss)
        .map_or(0, |kb| kb * 1024)
}

/// Resident memory of `pid` in bytes.
pub fn read_vm_rss(pid: u32) -> std::io::Result<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map(|s| parse_vm_rss(&s))
}

/// Clock ticks per second (`_SC_CLK_TCK`), the unit of `/proc/<pid>/stat` times.
pub fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// Convert clock ticks to a duration.
pub fn ticks(n: u64) -> Duration {
    let hz = clock_ticks_per_second();
    Duration::from_secs(n / hz) + Duration::from_nanos((n % hz) * 1_000_000_000 / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_with_spaces_and_parens() {
        let line = "4242 (we ird) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 123456 \
                    2000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!((s.utime, s.stime), (7, 3));
        assert_eq!(s.start_time, 123_456);
        for garbage in ["garbage", "1 (x) S 1", "1 (x)", "(x) S", "1 (x) ", ")(", ""] {
            assert_eq!(parse_stat(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn own_process_parses() {
        let me = read_stat(std::process::id()).unwrap();
        assert_eq!(
            me.start_time,
            drover_plugin_sdk::client::process_start_time(std::process::id()).unwrap()
        );
        assert_eq!(
            process_start_time(std::process::id()).unwrap(),
            me.start_time
        );
        assert!(read_vm_rss(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn vm_rss() {
        // A real status file, with VmRSS set to a known value, then without it (as a
        // zombie's).
        let real = std::fs::read_to_string("/proc/self/status").unwrap();
        let others: Vec<&str> = real.lines().filter(|l| !l.starts_with("VmRSS:")).collect();
        let with = format!("{}\nVmRSS:\t    1234 kB\n", others.join("\n"));
        assert_eq!(parse_vm_rss(&with), 1234 * 1024);
        assert_eq!(parse_vm_rss(&others.join("\n")), 0);
        assert_eq!(parse_vm_rss("garbage"), 0);
    }

    #[test]
    fn ticks_convert() {
        let hz = clock_ticks_per_second();
        assert_eq!(ticks(hz * 3), Duration::from_secs(3));
        assert_eq!(ticks(hz / 2), Duration::from_millis(500));
    }

    #[test]
    fn a_process_made_within_one_boot_tick_has_that_tick_as_its_start_time() {
        // Children spawned across a few ticks: every one whose two readings agree has
        // that start time in /proc, and most of them do (a spawn is far shorter than a
        // tick).
        let mut agreed = 0;
        let mut children = Vec::new();
        for _ in 0..60 {
            let before = boot_tick_now().expect("a tick that divides a second");
            let child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let after = boot_tick_now().unwrap();
            assert!(after >= before);
            let started = process_start_time(child.id()).unwrap();
            assert!(
                (before..=after).contains(&started),
                "{started} outside {before}..={after}"
            );
            if before == after {
                assert_eq!(started, before);
                agreed += 1;
            }
            children.push(child);
            std::thread::sleep(Duration::from_millis(1));
        }
        for mut c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(agreed >= 30, "only {agreed} of 60 spawns within one tick");
    }
}
