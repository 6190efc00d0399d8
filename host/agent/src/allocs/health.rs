//! An allocation's health in its deployment, decided on the client (Nomad's
//! `client/allochealth`).
//!
//! The runner feeds the tracker what it sees of the allocation at every wake-up
//! ([`Observation`]) and wakes itself at [`HealthTracker::next_wake`], so that the
//! `min_healthy_time` timer and the `healthy_deadline` cause a decision (and a report)
//! when they pass, not at the next unrelated change:
//!
//! - `task_states`: every task that must run (main tasks and sidecars) runs, the
//!   ephemeral prestart tasks succeeded, the ephemeral poststart tasks started; once
//!   that holds, it must keep holding for `min_healthy_time`. A task leaving `running`
//!   (or restarting between two looks: its start count moved) starts the wait over.
//! - `checks`: as `task_states`, and every check of the allocation's services (group
//!   and task services) is registered and passing; a check leaving passing starts the
//!   wait over. Without checks it is `task_states`.
//! - `manual`: the client decides nothing.
//!
//! A task failing for good, or the allocation failing or ending, is unhealthy at once;
//! so is the deadline (counted from when the runner began tracking) passing first. A
//! stop asked by the server decides nothing. The first decision is final.

use std::time::Duration;

use drover_server_api::{HealthCheckMode, UpdateStrategy};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// A decision, as the allocation's record keeps it (an agent restart does not decide
/// again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HealthDecision {
    /// The deployment it was decided for (an allocation moved to another deployment
    /// is tracked again).
    pub deployment_id: String,
    /// Healthy or not.
    pub healthy: bool,
}

/// The checks of the allocation's services, as seen now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChecksSeen {
    /// Checks the group's and its running tasks' services declare.
    pub expected: usize,
    /// Checks registered (running on the agent).
    pub registered: usize,
    /// Registered checks whose latest result is passing.
    pub passing: usize,
}

impl ChecksSeen {
    fn all_passing(&self) -> bool {
        self.registered >= self.expected && self.passing == self.registered
    }
}

/// What the runner sees of the allocation at one look.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observation {
    /// The server asked the allocation to stop: nothing is decided from then on.
    pub stopping: bool,
    /// Why the allocation cannot become healthy any more (a task failed, the
    /// allocation failed or ended).
    pub failed: Option<String>,
    /// Every task that must run runs (and every ephemeral one got where it should).
    pub tasks_running: bool,
    /// Starts so far of the tasks that must run: a change means one restarted.
    pub starts: u64,
    /// The allocation's checks.
    pub checks: ChecksSeen,
}

/// Decides one allocation's health for one deployment.
#[derive(Debug, Clone)]
pub(crate) struct HealthTracker {
    mode: HealthCheckMode,
    min_healthy_time: Duration,
    deadline: Instant,
    /// Since when everything has been healthy without a break; `None`: not now.
    healthy_since: Option<Instant>,
    /// [`Observation::starts`] at the last look.
    starts: u64,
    stopping: bool,
    decided: Option<bool>,
}

impl HealthTracker {
    /// Tracking from `start` (when the runner began): unhealthy unless healthy by
    /// `start + healthy_deadline`.
    pub(crate) fn new(strategy: &UpdateStrategy, start: Instant) -> Self {
        HealthTracker {
            mode: strategy.health_check,
            min_healthy_time: strategy.min_healthy_time,
            deadline: start + strategy.healthy_deadline,
            healthy_since: None,
            starts: 0,
            stopping: false,
            decided: None,
        }
    }

    /// A tracker whose decision was made before (kept in the record).
    pub(crate) fn decided(strategy: &UpdateStrategy, healthy: bool) -> Self {
        let mut t = HealthTracker::new(strategy, Instant::now());
        t.decided = Some(healthy);
        t
    }

    /// The decision, once made.
    pub(crate) fn decision(&self) -> Option<bool> {
        self.decided
    }

    /// Look at the allocation at `now`; `Some` when this look decided (once).
    pub(crate) fn observe(&mut self, now: Instant, obs: &Observation) -> Option<bool> {
        if self.decided.is_some() || self.mode == HealthCheckMode::Manual {
            return None;
        }
        if obs.stopping {
            self.stopping = true;
            self.healthy_since = None;
            return None;
        }
        if obs.failed.is_some() {
            return self.decide(false);
        }
        if obs.starts != self.starts {
            // A task restarted since the last look (maybe running again already): the
            // wait starts over.
            self.starts = obs.starts;
            self.healthy_since = None;
        }
        let healthy_now = obs.tasks_running
            && (self.mode == HealthCheckMode::TaskStates
                || obs.checks.expected == 0
                || obs.checks.all_passing());
        if !healthy_now {
            self.healthy_since = None;
        } else {
            let since = *self.healthy_since.get_or_insert(now);
            let healthy_at = since + self.min_healthy_time;
            if healthy_at <= now && healthy_at <= self.deadline {
                return self.decide(true);
            }
        }
        if now >= self.deadline {
            return self.decide(false);
        }
        None
    }

    fn decide(&mut self, healthy: bool) -> Option<bool> {
        self.decided = Some(healthy);
        self.healthy_since = None;
        Some(healthy)
    }

    /// When the runner must look again even if nothing changes: the end of the
    /// `min_healthy_time` wait, or the deadline. `None`: decided, manual, or stopping.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        if self.decided.is_some() || self.mode == HealthCheckMode::Manual || self.stopping {
            return None;
        }
        let deadline = self.deadline;
        Some(match self.healthy_since {
            Some(since) => (since + self.min_healthy_time).min(deadline),
            None => deadline,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Time is given to the tracker explicitly (a fixed origin plus offsets), so the
    //! tests are deterministic without sleeping or a paused clock.
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn strategy(mode: HealthCheckMode) -> UpdateStrategy {
        UpdateStrategy {
            health_check: mode,
            min_healthy_time: 10 * SEC,
            healthy_deadline: 60 * SEC,
            ..UpdateStrategy::default()
        }
    }

    fn running(starts: u64) -> Observation {
        Observation {
            tasks_running: true,
            starts,
            ..Observation::default()
        }
    }

    fn pending(starts: u64) -> Observation {
        Observation {
            tasks_running: false,
            starts,
            ..Observation::default()
        }
    }

    fn with_checks(mut o: Observation, expected: usize, passing: usize) -> Observation {
        o.checks = ChecksSeen {
            expected,
            registered: expected,
            passing,
        };
        o
    }

    /// Drive the tracker the way the runner does: look at each change, and at every
    /// wake-up the tracker asked for until `until`.
    fn drive(
        t: &mut HealthTracker,
        t0: Instant,
        changes: &[(u64, Observation)],
        until: u64,
    ) -> Option<(u64, bool)> {
        let mut changes = changes.iter().peekable();
        let mut current = Observation::default();
        let mut now = t0;
        loop {
            if let Some(d) = t.observe(now, &current) {
                return Some(((now - t0).as_secs(), d));
            }
            let next_change = changes.peek().map(|(at, _)| t0 + Duration::from_secs(*at));
            let next = match (next_change, t.next_wake()) {
                (Some(c), Some(w)) => c.min(w),
                (Some(c), None) => c,
                (None, Some(w)) => w,
                (None, None) => return None,
            };
            if next > t0 + Duration::from_secs(until) {
                return None;
            }
            now = next;
            while changes
                .peek()
                .is_some_and(|(at, _)| t0 + Duration::from_secs(*at) <= now)
            {
                if let Some((_, o)) = changes.next() {
                    current = o.clone();
                }
            }
        }
    }

    #[test]
    fn healthy_after_min_healthy_time_of_running() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        assert_eq!(t.observe(t0, &pending(0)), None);
        assert_eq!(t.next_wake(), Some(t0 + 60 * SEC), "only the deadline");
        assert_eq!(t.observe(t0 + 2 * SEC, &running(1)), None);
        assert_eq!(
            t.next_wake(),
            Some(t0 + 12 * SEC),
            "the runner wakes when min_healthy_time has passed"
        );
        assert_eq!(t.observe(t0 + 11 * SEC, &running(1)), None, "not yet");
        assert_eq!(t.observe(t0 + 12 * SEC, &running(1)), Some(true));
        assert_eq!(t.decision(), Some(true));
        assert_eq!(t.next_wake(), None);
        // Final: a later failure changes nothing.
        let failed = Observation {
            failed: Some("task web failed".into()),
            ..running(1)
        };
        assert_eq!(t.observe(t0 + 13 * SEC, &failed), None);
        assert_eq!(t.decision(), Some(true));
    }

    #[test]
    fn a_restart_starts_the_wait_over() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        // Running at 1 s, restarting at 6 s (pending), running again at 8 s.
        let decided = drive(
            &mut t,
            t0,
            &[(1, running(1)), (6, pending(1)), (8, running(2))],
            100,
        );
        assert_eq!(decided, Some((18, true)));

        // A restart fast enough to be running again at the next look: its start count
        // moved, which starts the wait over just the same.
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        let decided = drive(&mut t, t0, &[(1, running(1)), (9, running(2))], 100);
        assert_eq!(decided, Some((19, true)));
    }

    #[test]
    fn checks_gate_health_and_a_failing_check_starts_the_wait_over() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::Checks), t0);
        // Tasks run from 1 s; the check passes from 3 s, fails at 7 s, passes at 9 s.
        let decided = drive(
            &mut t,
            t0,
            &[
                (1, with_checks(running(1), 1, 0)),
                (3, with_checks(running(1), 1, 1)),
                (7, with_checks(running(1), 1, 0)),
                (9, with_checks(running(1), 1, 1)),
            ],
            100,
        );
        assert_eq!(decided, Some((19, true)));

        // A check not registered yet (its task's services come with the task) is not
        // passing.
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::Checks), t0);
        let mut o = running(1);
        o.checks = ChecksSeen {
            expected: 2,
            registered: 1,
            passing: 1,
        };
        assert_eq!(drive(&mut t, t0, &[(1, o)], 100), Some((60, false)));

        // task_states ignores the checks.
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        let decided = drive(&mut t, t0, &[(1, with_checks(running(1), 1, 0))], 100);
        assert_eq!(decided, Some((11, true)));

        // checks without any check is task_states.
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::Checks), t0);
        assert_eq!(
            drive(&mut t, t0, &[(1, with_checks(running(1), 0, 0))], 100),
            Some((11, true))
        );
    }

    #[test]
    fn unhealthy_when_the_deadline_passes_first() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        // Never running.
        assert_eq!(
            drive(&mut t, t0, &[(1, pending(0))], 100),
            Some((60, false))
        );
        // Running from 55 s: the 10 s wait would end after the deadline.
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        assert_eq!(
            drive(&mut t, t0, &[(55, running(1))], 100),
            Some((60, false))
        );
        // A look that comes late (the runner was busy) still goes by the times: the
        // wait ended at 20 s, before the deadline.
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        assert_eq!(t.observe(t0 + 10 * SEC, &running(1)), None);
        assert_eq!(t.observe(t0 + 90 * SEC, &running(1)), Some(true));
    }

    #[test]
    fn a_task_failure_is_unhealthy_at_once() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::Checks), t0);
        let failed = Observation {
            failed: Some("task web failed: exit code 1".into()),
            ..pending(1)
        };
        assert_eq!(
            drive(&mut t, t0, &[(1, running(1)), (4, failed)], 100),
            Some((4, false))
        );
        assert_eq!(t.next_wake(), None);
    }

    #[test]
    fn a_stop_decides_nothing() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::TaskStates), t0);
        let stopping = Observation {
            stopping: true,
            ..running(1)
        };
        assert_eq!(
            drive(&mut t, t0, &[(1, running(1)), (4, stopping)], 100),
            None
        );
        assert_eq!(t.decision(), None);
    }

    #[test]
    fn manual_never_decides() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(&strategy(HealthCheckMode::Manual), t0);
        assert_eq!(t.next_wake(), None);
        assert_eq!(t.observe(t0 + 500 * SEC, &running(1)), None);
        let failed = Observation {
            failed: Some("x".into()),
            ..running(1)
        };
        assert_eq!(t.observe(t0 + 501 * SEC, &failed), None);
        assert_eq!(t.decision(), None);
        assert_eq!(t.next_wake(), None);
    }

    #[test]
    fn a_recorded_decision_stays() {
        let t0 = Instant::now();
        let mut t = HealthTracker::decided(&strategy(HealthCheckMode::TaskStates), false);
        assert_eq!(t.decision(), Some(false));
        assert_eq!(t.next_wake(), None);
        assert_eq!(t.observe(t0 + 100 * SEC, &running(1)), None);
        assert_eq!(t.decision(), Some(false));
    }
}
