//! Heartbeat deadlines of the live nodes, earliest first (the heartbeat loop sleeps
//! until the first).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

/// Heartbeat deadlines, earliest first.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    by_node: HashMap<String, Instant>,
    order: BTreeSet<(Instant, String)>,
}

impl Timers {
    pub(crate) fn reset(&mut self, node: &str, deadline: Instant) {
        if let Some(old) = self.by_node.insert(node.to_owned(), deadline) {
            self.order.remove(&(old, node.to_owned()));
        }
        self.order.insert((deadline, node.to_owned()));
    }

    pub(crate) fn next(&self) -> Option<Instant> {
        self.order.first().map(|(t, _)| *t)
    }

    pub(crate) fn has(&self, node: &str) -> bool {
        self.by_node.contains_key(node)
    }

    /// Remove and return the nodes whose deadline is at or before `now`.
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((t, _)) = self.order.first() {
            if *t > now {
                break;
            }
            if let Some((_, n)) = self.order.pop_first() {
                self.by_node.remove(&n);
                out.push(n);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timers_pop_in_deadline_order_and_reset_moves_a_node() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.reset("a", t0 + Duration::from_secs(1));
        t.reset("b", t0 + Duration::from_secs(2));
        t.reset("a", t0 + Duration::from_secs(3));
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(2)),
            vec!["b".to_string()]
        );
        assert!(t.has("a") && !t.has("b"));
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(3)),
            vec!["a".to_string()]
        );
        assert_eq!(t.next(), None);
    }
}
