//! Allocation status reports waiting for a server: the newest per allocation only, so
//! the queue never holds more entries than the node has allocations, however long no
//! server answers.

use std::collections::HashMap;
use std::time::Duration;

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
