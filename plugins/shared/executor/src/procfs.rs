//! The few facts executor-backed drivers read from `/proc`.

use std::time::Duration;

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
}

/// Parse `/proc/<pid>/stat`. Field 2 (`comm`) is in parentheses and may itself contain
/// spaces and parentheses, so the fields are counted from after the *last* `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let (_, rest) = text.rsplit_once(')')?;
    // rest starts at field 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(ProcStat {
        state: field(3)?.chars().next()?,
        utime: field(14)?.parse().ok()?,
        stime: field(15)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
    })
}

/// Read and parse `/proc/<pid>/stat`.
pub fn read_stat(pid: u32) -> std::io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text)
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat format")))
}

/// `VmRSS` from `/proc/<pid>/status`, in bytes; 0 when absent (a zombie has none).
pub fn parse_vm_rss(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
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
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[test]
    fn own_process_parses() {
        let me = read_stat(std::process::id()).unwrap();
        assert_eq!(
            me.start_time,
            drover_plugin_sdk::client::process_start_time(std::process::id()).unwrap()
        );
        assert!(read_vm_rss(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn vm_rss() {
        assert_eq!(parse_vm_rss("Name:\tx\nVmRSS:\t    1234 kB\n"), 1234 * 1024);
        assert_eq!(parse_vm_rss("Name:\tx\n"), 0);
    }

    #[test]
    fn ticks_convert() {
        let hz = clock_ticks_per_second();
        assert_eq!(ticks(hz * 3), Duration::from_secs(3));
        assert_eq!(ticks(hz / 2), Duration::from_millis(500));
    }
}
