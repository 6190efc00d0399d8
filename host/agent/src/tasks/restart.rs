//! The restart policy: parsing it, and the pure decision of what follows an exit.
//!
//! Semantics, as Nomad users know them: a task that exits unsuccessfully (non-zero
//! code, a signal, the OOM killer, or a driver error) is restarted after `delay` while
//! fewer than `attempts` restarts happened in the current `interval` window. The window
//! opens with the first restart and closes `interval` later; the next failure after
//! that opens a fresh one. Once the attempts are used up, `mode = "fail"` gives up and
//! `mode = "delay"` waits until the window has closed, restarts, and the count starts
//! over with the next failure. A successful exit is never restarted.

use std::time::{Duration, SystemTime};

use drover_plugin_sdk::{DriverError, ExitResult};

use drover_api::{RestartMode, RestartPolicy};

/// A validated [`RestartPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Restarts allowed within `interval`.
    pub attempts: u32,
    /// The window attempts are counted in.
    pub interval: Duration,
    /// Wait before each restart.
    pub delay: Duration,
    /// What happens once the attempts are used up.
    pub mode: RestartMode,
}

impl Default for Policy {
    /// No restarts: what a task without a `restart` section gets.
    fn default() -> Self {
        Policy::parse(&RestartPolicy::default()).unwrap_or(Policy {
            attempts: 0,
            interval: Duration::from_secs(30 * 60),
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        })
    }
}

/// Longest `interval` or `delay` accepted: longer ones mean nothing useful, and would
/// overflow the clock arithmetic (or RFC 3339, which ends at year 9999).
pub const MAX_POLICY_DURATION: Duration = drover_api::MAX_RESTART_DURATION;

/// A request read from JSON was checked while it was parsed, with the text the user
/// wrote; one built in code is checked here.
fn duration(field: &str, d: Duration) -> Result<Duration, DriverError> {
    if d > MAX_POLICY_DURATION {
        return Err(DriverError::InvalidConfig(format!(
            "restart.{field} {:?} is longer than the maximum of {}",
            human(d),
            human(MAX_POLICY_DURATION)
        )));
    }
    Ok(d)
}

impl Policy {
    /// Check `interval`/`delay` and refuse combinations that cannot mean anything.
    pub fn parse(p: &RestartPolicy) -> Result<Policy, DriverError> {
        let interval = duration("interval", p.interval)?;
        let delay = duration("delay", p.delay)?;
        if interval.is_zero() {
            return Err(DriverError::InvalidConfig(
                "restart.interval must be longer than 0s".into(),
            ));
        }
        // With delay >= interval every window closes before the next restart, so
        // `attempts` would never limit anything: almost certainly a mistake.
        if delay >= interval {
            return Err(DriverError::InvalidConfig(format!(
                "restart.delay ({}) must be shorter than restart.interval ({})",
                human(delay),
                human(interval)
            )));
        }
        Ok(Policy {
            attempts: p.attempts,
            interval,
            delay,
            mode: p.mode,
        })
    }
}

/// What follows an exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The task exited successfully and is complete.
    Complete,
    /// Start it again after `wait`. `window` replaces the stored restart times.
    Restart {
        /// How long to wait before starting it again.
        wait: Duration,
        /// The restart times of the current window, to store.
        window: Vec<SystemTime>,
        /// For the `Restarting` event.
        message: String,
    },
    /// Do not restart: the task is dead.
    Fail {
        /// For the `NotRestarting` event.
        message: String,
    },
}

/// A duration as people write it, to the millisecond.
pub fn human(d: Duration) -> String {
    drover_api::human_duration(d)
}

/// Decide what follows `exit` at `now`, given the restart times of the current window
/// (oldest first; the first one opened the window).
pub fn decide(
    policy: &Policy,
    window: &[SystemTime],
    now: SystemTime,
    exit: &ExitResult,
) -> Decision {
    if exit.successful() {
        return Decision::Complete;
    }
    let elapsed = |t: SystemTime| now.duration_since(t).unwrap_or_default();
    let mut window: Vec<SystemTime> = match window.first() {
        Some(first) if elapsed(*first) >= policy.interval => Vec::new(),
        _ => window.to_vec(),
    };
    let used = u32::try_from(window.len()).unwrap_or(u32::MAX);
    if used < policy.attempts {
        window.push(now);
        return Decision::Restart {
            wait: policy.delay,
            window,
            message: format!(
                "restarting in {}, attempt {} of {}",
                human(policy.delay),
                used + 1,
                policy.attempts
            ),
        };
    }
    match policy.mode {
        RestartMode::Fail if policy.attempts == 0 => Decision::Fail {
            message: "the restart policy allows no restarts".into(),
        },
        RestartMode::Fail => Decision::Fail {
            message: format!(
                "exceeded {} attempts in {} (mode fail)",
                policy.attempts,
                human(policy.interval)
            ),
        },
        RestartMode::Delay => {
            // Wait for the window to close; never less than the normal delay.
            let left = window
                .first()
                .map_or(policy.interval, |first| {
                    policy.interval.saturating_sub(elapsed(*first))
                })
                .max(policy.delay);
            Decision::Restart {
                wait: left,
                // The count starts over: the restart after the wait is not counted.
                window: Vec::new(),
                message: format!(
                    "exceeded {} attempts in {}; restarting in {} when the interval ends (mode delay)",
                    policy.attempts,
                    human(policy.interval),
                    human(left)
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(attempts: u32, interval: u64, delay: u64, mode: RestartMode) -> Policy {
        Policy {
            attempts,
            interval: Duration::from_secs(interval),
            delay: Duration::from_secs(delay),
            mode,
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    fn failed() -> ExitResult {
        ExitResult::code(3)
    }

    /// Feed a series of failures at the given times through `decide`, keeping the
    /// window as the runner does; return the decisions.
    fn run(p: &Policy, times: &[u64]) -> Vec<Decision> {
        let mut window = Vec::new();
        let mut out = Vec::new();
        for t in times {
            let d = decide(p, &window, at(*t), &failed());
            if let Decision::Restart { window: w, .. } = &d {
                window = w.clone();
            }
            out.push(d);
        }
        out
    }

    fn kinds(ds: &[Decision]) -> Vec<String> {
        ds.iter()
            .map(|d| match d {
                Decision::Complete => "complete".to_owned(),
                Decision::Restart { wait, .. } => format!("restart {}", human(*wait)),
                Decision::Fail { .. } => "fail".to_owned(),
            })
            .collect()
    }

    #[test]
    fn success_is_never_restarted() {
        let p = policy(5, 60, 1, RestartMode::Delay);
        assert_eq!(
            decide(&p, &[], at(0), &ExitResult::code(0)),
            Decision::Complete
        );
    }

    #[test]
    fn every_kind_of_failure_is_restarted() {
        let p = policy(1, 60, 1, RestartMode::Fail);
        for exit in [
            ExitResult::code(1),
            ExitResult::signaled(9),
            ExitResult::default().with_oom_killed(true),
            ExitResult::unknown("driver lost it"),
        ] {
            assert!(
                matches!(decide(&p, &[], at(0), &exit), Decision::Restart { .. }),
                "{exit:?} was not restarted"
            );
        }
    }

    #[test]
    fn fail_mode_allows_exactly_attempts_within_the_interval() {
        let p = policy(2, 60, 1, RestartMode::Fail);
        let ds = run(&p, &[0, 2, 4]);
        assert_eq!(kinds(&ds), ["restart 1s", "restart 1s", "fail"]);
        let Decision::Restart { message, .. } = &ds[1] else {
            unreachable!()
        };
        assert_eq!(message, "restarting in 1s, attempt 2 of 2");
        let Decision::Fail { message } = &ds[2] else {
            unreachable!()
        };
        assert_eq!(message, "exceeded 2 attempts in 1m (mode fail)");
    }

    #[test]
    fn failures_outside_the_interval_start_a_fresh_window() {
        let p = policy(2, 60, 1, RestartMode::Fail);
        // Window opens at 0 and closes at 60: the failure at 61 counts from zero.
        let ds = run(&p, &[0, 30, 61, 62, 63]);
        assert_eq!(
            kinds(&ds),
            [
                "restart 1s",
                "restart 1s",
                "restart 1s",
                "restart 1s",
                "fail"
            ]
        );
        // Exactly at the end of the window counts as outside.
        let ds = run(&p, &[0, 30, 60]);
        assert_eq!(kinds(&ds), ["restart 1s", "restart 1s", "restart 1s"]);
    }

    #[test]
    fn delay_mode_waits_for_the_window_then_counts_from_zero() {
        let p = policy(2, 60, 1, RestartMode::Delay);
        let mut window = Vec::new();
        for t in [0, 10] {
            let Decision::Restart { window: w, .. } = decide(&p, &window, at(t), &failed()) else {
                panic!("no restart at {t}");
            };
            window = w;
        }
        // Third failure at 25: the window (opened at 0) ends at 60, so wait 35s.
        let d = decide(&p, &window, at(25), &failed());
        let Decision::Restart {
            wait,
            window: w,
            message,
        } = d
        else {
            panic!("delay mode gave up: {d:?}");
        };
        assert_eq!(wait, Duration::from_secs(35));
        assert!(w.is_empty(), "count did not start over: {w:?}");
        assert_eq!(
            message,
            "exceeded 2 attempts in 1m; restarting in 35s when the interval ends (mode delay)"
        );
        // After the wait, the next failures get `attempts` normal restarts again.
        let ds = run(&p, &[61, 62, 63]);
        assert_eq!(kinds(&ds), ["restart 1s", "restart 1s", "restart 58s"]);
    }

    #[test]
    fn delay_mode_never_waits_less_than_the_delay() {
        let p = policy(1, 60, 10, RestartMode::Delay);
        let Decision::Restart { window, .. } = decide(&p, &[], at(0), &failed()) else {
            panic!()
        };
        // The window closes in 1s, but the delay is 10s.
        let Decision::Restart { wait, .. } = decide(&p, &window, at(59), &failed()) else {
            panic!()
        };
        assert_eq!(wait, Duration::from_secs(10));
    }

    #[test]
    fn zero_attempts() {
        let p = policy(0, 60, 1, RestartMode::Fail);
        let Decision::Fail { message } = decide(&p, &[], at(0), &failed()) else {
            panic!()
        };
        assert_eq!(message, "the restart policy allows no restarts");
        // Delay mode with no attempts restarts once per interval.
        let p = policy(0, 60, 1, RestartMode::Delay);
        let Decision::Restart { wait, .. } = decide(&p, &[], at(0), &failed()) else {
            panic!()
        };
        assert_eq!(wait, Duration::from_secs(60));
    }

    #[test]
    fn a_clock_that_went_back_keeps_the_window_open() {
        let p = policy(1, 60, 1, RestartMode::Fail);
        let ds = decide(&p, &[at(100)], at(50), &failed());
        assert!(matches!(ds, Decision::Fail { .. }), "{ds:?}");
    }

    #[test]
    fn parse_names_the_field_and_refuses_nonsense() {
        let d = |text: &str| humantime::parse_duration(text).unwrap();
        let mut p = RestartPolicy {
            attempts: 2,
            interval: d("1m"),
            delay: d("200ms"),
            mode: RestartMode::Fail,
        };
        let parsed = Policy::parse(&p).unwrap();
        assert_eq!(parsed.delay, Duration::from_millis(200));
        assert_eq!(parsed.interval, Duration::from_secs(60));

        p.interval = d("20000y");
        let e = Policy::parse(&p).unwrap_err().to_string();
        assert!(
            e.contains("restart.interval") && e.contains("maximum"),
            "{e}"
        );
        p.interval = d("1m");
        p.delay = d("10000y");
        let e = Policy::parse(&p).unwrap_err().to_string();
        assert!(e.contains("restart.delay") && e.contains("maximum"), "{e}");

        // Text that is no duration never becomes a policy: it is refused as it is read.
        let e = serde_json::from_value::<RestartPolicy>(serde_json::json!({"delay": "soon"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("restart.delay") && e.contains("soon"), "{e}");

        p.delay = d("2m");
        let e = Policy::parse(&p).unwrap_err().to_string();
        assert!(
            e.contains("restart.delay (2m) must be shorter than restart.interval (1m)"),
            "{e}"
        );

        p.delay = d("1s");
        p.interval = d("0s");
        let e = Policy::parse(&p).unwrap_err().to_string();
        assert!(e.contains("restart.interval"), "{e}");

        assert_eq!(Policy::default().attempts, 0);
    }
}
