//! Allocation status reports waiting for a server: the newest per allocation only, so
//! the queue never holds more entries than the node has allocations, however long no
//! server answers.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use drover_server_api::AllocClientUpdate;

/// Pending status reports, newest per allocation.
#[derive(Debug, Default)]
pub struct StatusQueue {
    /// By allocation id: the report and the sequence number it was queued with.
    entries: HashMap<String, (u64, AllocClientUpdate)>,
    seq: u64,
}

/// Reports taken for one call; [`StatusQueue::ack`] them once the server answered.
#[derive(Debug)]
pub struct Batch {
    taken: Vec<(u64, AllocClientUpdate)>,
}

impl Batch {
    /// The reports, oldest first.
    pub fn updates(&self) -> impl Iterator<Item = &AllocClientUpdate> {
        self.taken.iter().map(|(_, u)| u)
    }
    /// How many.
    pub fn len(&self) -> usize {
        self.taken.len()
    }
    /// None.
    pub fn is_empty(&self) -> bool {
        self.taken.is_empty()
    }
}

impl StatusQueue {
    /// Queue `update`, replacing an older report of the same allocation.
    pub fn push(&mut self, update: AllocClientUpdate) {
        self.seq += 1;
        self.entries.insert(update.id.clone(), (self.seq, update));
    }

    /// Reports waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Up to `max` reports, the longest waiting first. They stay queued until acked,
    /// so a call that fails or is cut short loses nothing.
    pub fn batch(&self, max: usize) -> Batch {
        let mut taken: Vec<(u64, AllocClientUpdate)> = self.entries.values().cloned().collect();
        taken.sort_unstable_by_key(|(seq, _)| *seq);
        taken.truncate(max);
        Batch { taken }
    }

    /// The server stored `batch`: forget those reports, unless a newer one of the
    /// same allocation arrived meanwhile (that one is still to send).
    pub fn ack(&mut self, batch: Batch) {
        for (seq, update) in batch.taken {
            if self.entries.get(&update.id).is_some_and(|(s, _)| *s == seq) {
                self.entries.remove(&update.id);
            }
        }
    }
}

/// When queued status reports are sent: a lone report at once (after [`FlushClock::QUIET`]
/// without another), a burst (a job's allocations starting together) as few calls, and
/// never more than one flush per [`FlushClock::MIN_GAP`] per node, so a busy node cannot
/// flood the servers. Nomad's client sends every 200 ms whatever happens; a task that
/// starts or fails here is known to the servers (and the scheduler) within
/// milliseconds when the node is quiet.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlushClock {
    /// When the oldest report not yet sent was queued.
    oldest: Option<Instant>,
    /// When the newest one was.
    newest: Option<Instant>,
    /// When the last call started.
    last_sent: Option<Instant>,
}

impl FlushClock {
    /// Reports that keep coming closer together than this are sent together.
    pub const QUIET: Duration = Duration::from_millis(10);
    /// No report waits longer than this for the burst it is part of to end (unless
    /// the previous call was less than [`FlushClock::MIN_GAP`] ago).
    pub const MAX_WAIT: Duration = Duration::from_millis(100);
    /// Least time between the starts of two flushes (a flush of more reports than one
    /// call takes is several calls in a row).
    pub const MIN_GAP: Duration = Duration::from_millis(50);

    /// A report was queued at `now`.
    pub fn queued(&mut self, now: Instant) {
        self.oldest.get_or_insert(now);
        self.newest = Some(now);
    }

    /// When to send what is queued; `None` while nothing is.
    pub fn due(&self) -> Option<Instant> {
        let (oldest, newest) = (self.oldest?, self.newest?);
        let ready = (newest + Self::QUIET).min(oldest + Self::MAX_WAIT);
        Some(match self.last_sent {
            Some(last) => ready.max(last + Self::MIN_GAP),
            None => ready,
        })
    }

    /// Everything queued until now is being sent, in a flush started at `now`.
    pub fn sent(&mut self, now: Instant) {
        self.oldest = None;
        self.newest = None;
        self.last_sent = Some(now);
    }
}

/// Capped exponential backoff with jitter: the delays before reconnecting grow
/// from `first` to `max`, each taken at random from its upper half, so that many
/// agents that lost the same server do not come back in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// Delays from `first` doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            attempt: 0,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .first
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = base / 2;
        half + half.mul_f64(fastrand::f64())
    }

    /// Start over from `first` (a connection worked).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_server_api::ClientStatus;

    fn update(id: &str, status: ClientStatus) -> AllocClientUpdate {
        AllocClientUpdate {
            healthy: Default::default(),
            id: id.into(),
            client_status: status,
            client_description: String::new(),
            task_states: Default::default(),
            services: None,
        }
    }

    /// Simulates a node's reports at the given offsets (ms) and returns the offsets
    /// of the calls that carry them.
    fn calls_for(reports_ms: &[u64]) -> Vec<u64> {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut clock = FlushClock::default();
        let mut calls = Vec::new();
        let mut pending = reports_ms.iter().copied().peekable();
        loop {
            let next_report = pending.peek().copied().map(at);
            match (next_report, clock.due()) {
                (Some(r), Some(d)) if d <= r => {
                    clock.sent(d);
                    calls.push((d - t0).as_millis() as u64);
                }
                (Some(r), _) => {
                    clock.queued(r);
                    pending.next();
                }
                (None, Some(d)) => {
                    clock.sent(d);
                    calls.push((d - t0).as_millis() as u64);
                }
                (None, None) => return calls,
            }
        }
    }

    #[test]
    fn a_lone_report_is_sent_at_once() {
        assert_eq!(calls_for(&[0]), [10]);
        // Two lone reports far apart: a call each, each soon after its report.
        assert_eq!(calls_for(&[0, 1000]), [10, 1010]);
    }

    #[test]
    fn a_burst_becomes_few_calls_and_its_end_is_not_kept_waiting() {
        // 100 tasks starting 1.5 ms apart (150 ms): one call when the oldest waited
        // MAX_WAIT, one right after the burst ended.
        let burst: Vec<u64> = (0..100).map(|i| i * 3 / 2).collect();
        assert_eq!(calls_for(&burst), [100, 158]);
    }

    #[test]
    fn a_steady_stream_is_sent_at_most_once_per_min_gap() {
        // A report every 12 ms, just over QUIET, for a second: not 80 calls.
        let stream: Vec<u64> = (0..84).map(|i| i * 12).collect();
        let calls = calls_for(&stream);
        for pair in calls.windows(2) {
            assert!(
                pair[1] - pair[0] >= FlushClock::MIN_GAP.as_millis() as u64,
                "calls at {calls:?}"
            );
        }
        assert!(calls.len() <= 21, "calls at {calls:?}");
        // And the last report is not left behind.
        assert!(*calls.last().unwrap() >= 996, "calls at {calls:?}");
    }

    #[test]
    fn the_newest_report_per_allocation_wins() {
        let mut q = StatusQueue::default();
        for i in 0..1000 {
            q.push(update(&format!("a{}", i % 10), ClientStatus::Pending));
        }
        q.push(update("a3", ClientStatus::Running));
        assert_eq!(
            q.len(),
            10,
            "bounded by the allocations, not by the reports"
        );
        let b = q.batch(100);
        assert_eq!(b.len(), 10);
        let a3: Vec<_> = b.updates().filter(|u| u.id == "a3").collect();
        assert_eq!(a3.len(), 1);
        assert_eq!(a3[0].client_status, ClientStatus::Running);
        // Oldest first: a3 was pushed last.
        assert_eq!(b.updates().last().unwrap().id, "a3");
    }

    #[test]
    fn batches_are_bounded_and_kept_until_acked() {
        let mut q = StatusQueue::default();
        for i in 0..1200 {
            q.push(update(&format!("a{i}"), ClientStatus::Running));
        }
        let b = q.batch(500);
        assert_eq!(b.len(), 500);
        assert_eq!(b.updates().next().unwrap().id, "a0");
        // A failed call: nothing is lost.
        drop(b);
        assert_eq!(q.len(), 1200);
        let mut sent = 0;
        while !q.is_empty() {
            let b = q.batch(500);
            assert!(b.len() <= 500);
            sent += b.len();
            q.ack(b);
        }
        assert_eq!(sent, 1200);
    }

    #[test]
    fn a_report_newer_than_the_batch_survives_its_ack() {
        let mut q = StatusQueue::default();
        q.push(update("a", ClientStatus::Pending));
        q.push(update("b", ClientStatus::Pending));
        let b = q.batch(10);
        q.push(update("a", ClientStatus::Running));
        q.ack(b);
        assert_eq!(q.len(), 1);
        let left = q.batch(10);
        let u = left.updates().next().unwrap();
        assert_eq!(
            (u.id.as_str(), u.client_status),
            ("a", ClientStatus::Running)
        );
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let delays: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let base = Duration::from_millis(100)
                .saturating_mul(1 << i)
                .min(Duration::from_secs(5));
            assert!(
                *d >= base / 2 && *d <= base,
                "attempt {i}: {d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
        assert!(delays[11] >= Duration::from_millis(2500));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
        // Jitter: many draws at the cap are not all the same.
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(5));
        let draws: std::collections::BTreeSet<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(draws.len() > 1);
    }
}
