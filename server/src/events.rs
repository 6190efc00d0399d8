//! The event broker behind Nomad's `/v1/event/stream`: every commit a server applies
//! to its state in memory (its own as leader, the leader's as follower) becomes one
//! batch of events at the commit's index — a job registered or deregistered, an
//! evaluation, an allocation or a node written.
//!
//! Events are made and kept from the first subscription on: a server nobody streams
//! from pays nothing for them on its commits (placements measured ~10% slower with
//! every allocation of every plan copied into the ring).
//!
//! Batches are kept in a bounded ring (the newest [`MAX_BUFFERED_EVENTS`] events); a
//! subscriber is a cursor into it, not a queue of its own, so a slow reader costs no
//! memory: once the ring moved past its cursor, its stream ends with an error (as
//! Nomad's "event dropped from buffer"), and it resubscribes from an index. A
//! subscription from an index older than the ring starts at the oldest batch kept
//! (Nomad's `StartAtClosest`).
//!
//! Payloads are the internal types, shared (`Arc`); the HTTP layer turns them into
//! Nomad's wire shapes when it writes them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use drover_server_api::{Allocation, Evaluation, Index, Job, Node};
use tokio::sync::watch;

use crate::state::{Batch, State};

/// Events kept for subscribers that start in the past or read slowly. A batch bigger
/// than this (a plan placing thousands of allocations) is kept whole, alone.
pub const MAX_BUFFERED_EVENTS: usize = 4096;

/// About the most bytes of payloads the ring keeps: a job can be a few MiB, and 4096
/// versions of one would otherwise stay in memory on every server.
pub const MAX_BUFFERED_BYTES: usize = 256 * 1024 * 1024;

/// About what an event's payload holds. A job is measured (its spec: the config,
/// env and meta are what can be large); the other objects are bounded and small, and
/// measuring every allocation of a big plan would cost placements.
fn approx_bytes(p: &Payload) -> usize {
    const SMALL: usize = 2048;
    match p {
        Payload::Job(job) => serde_json::to_vec(&job.spec).map_or(SMALL, |v| v.len() + SMALL),
        Payload::Evaluation(_)
        | Payload::Allocation(_)
        | Payload::Node(_)
        | Payload::Deployment(_) => SMALL,
    }
}

/// Nomad's event topics (those Drover has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    Job,
    Evaluation,
    Allocation,
    Node,
    Deployment,
}

impl Topic {
    /// The topic as Nomad names it.
    pub fn name(self) -> &'static str {
        match self {
            Topic::Job => "Job",
            Topic::Evaluation => "Evaluation",
            Topic::Allocation => "Allocation",
            Topic::Node => "Node",
            Topic::Deployment => "Deployment",
        }
    }

    /// The topic Nomad names `name` (case as Nomad's).
    pub fn parse(name: &str) -> Option<Topic> {
        Some(match name {
            "Job" => Topic::Job,
            "Evaluation" => Topic::Evaluation,
            "Allocation" => Topic::Allocation,
            "Node" => Topic::Node,
            "Deployment" => Topic::Deployment,
            _ => return None,
        })
    }
}

/// What an event carries: the object as written at the event's index.
#[derive(Debug, Clone)]
pub enum Payload {
    Job(Arc<Job>),
    Evaluation(Arc<Evaluation>),
    Allocation(Arc<Allocation>),
    Node(Arc<Node>),
    Deployment(Arc<drover_server_api::Deployment>),
}

/// One event (Nomad's `structs.Event`).
#[derive(Debug, Clone)]
pub struct Event {
    pub topic: Topic,
    /// Nomad's event type: `JobRegistered`, `JobDeregistered`, `EvaluationUpdated`,
    /// `PlanResult`, `AllocationUpdated`, `NodeRegistration`, `NodeDeregistration`,
    /// `NodeDrain`, `NodeEligibility`, `NodeStreamEvent`, `DeploymentStatusUpdate`,
    /// `DeploymentPromotion`, `DeploymentAllocHealth`.
    pub kind: &'static str,
    /// The object's id (a job's name).
    pub key: String,
    /// More keys a subscription can select it by (an allocation's and an
    /// evaluation's job).
    pub filter_keys: Vec<String>,
    pub index: Index,
    pub payload: Payload,
}

impl Event {
    /// The namespace of the object (`None` for a node: nodes have none).
    pub fn namespace(&self) -> Option<&str> {
        match &self.payload {
            Payload::Job(j) => Some(&j.spec.namespace),
            Payload::Evaluation(e) => Some(&e.namespace),
            Payload::Allocation(a) => Some(&a.namespace),
            Payload::Deployment(d) => Some(&d.namespace),
            Payload::Node(_) => None,
        }
    }

    /// Whether a subscription to `topic:key` selects this event (`*` for any).
    pub fn matches(&self, topic: Option<Topic>, key: &str) -> bool {
        if topic.is_some_and(|t| t != self.topic) {
            return false;
        }
        key == "*" || self.key == key || self.filter_keys.iter().any(|k| k == key)
    }
}

/// The events of one commit.
#[derive(Debug)]
pub struct EventBatch {
    pub index: Index,
    pub events: Vec<Event>,
}

struct Ring {
    batches: VecDeque<Arc<EventBatch>>,
    /// Events in `batches`.
    events: usize,
    /// About the bytes of their payloads ([`approx_bytes`]), by batch.
    bytes: usize,
    batch_bytes: VecDeque<usize>,
    /// The newest index whose batch was evicted (0: none yet).
    evicted_up_to: Index,
}

/// The ring of recent event batches and the watch subscribers wait on.
pub struct EventBroker {
    ring: Mutex<Ring>,
    /// The index of the newest batch published.
    published: watch::Sender<Index>,
    capacity: usize,
    max_bytes: usize,
    /// Someone subscribed once: events are made and kept from then on.
    wanted: std::sync::atomic::AtomicBool,
}

impl Default for EventBroker {
    fn default() -> Self {
        EventBroker::with_capacity(MAX_BUFFERED_EVENTS)
    }
}

impl std::fmt::Debug for EventBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBroker")
            .field("published", &*self.published.borrow())
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Why a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The reader fell behind by more than the ring holds.
    #[error(
        "event dropped from buffer: this reader fell more than {0} events behind; \
         subscribe again (index={1} resumes after the last event received)"
    )]
    Dropped(usize, Index),
}

impl EventBroker {
    /// A broker keeping about `capacity` events.
    pub fn with_capacity(capacity: usize) -> EventBroker {
        EventBroker {
            ring: Mutex::new(Ring {
                batches: VecDeque::new(),
                events: 0,
                bytes: 0,
                batch_bytes: VecDeque::new(),
                evicted_up_to: 0,
            }),
            published: watch::channel(0).0,
            capacity: capacity.max(1),
            max_bytes: MAX_BUFFERED_BYTES,
            wanted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether events are wanted: someone subscribed once. Until then a commit need
    /// not make its events.
    pub fn wanted(&self) -> bool {
        self.wanted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Publish the events of the commit at `index`. Indexes only grow: a batch at or
    /// below the newest published one is ignored (a commit seen twice).
    pub fn publish(&self, index: Index, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        {
            let mut ring = self.ring();
            if ring.batches.back().is_some_and(|b| b.index >= index) {
                return;
            }
            let bytes: usize = events.iter().map(|e| approx_bytes(&e.payload)).sum();
            ring.events += events.len();
            ring.bytes += bytes;
            ring.batch_bytes.push_back(bytes);
            ring.batches
                .push_back(Arc::new(EventBatch { index, events }));
            while (ring.events > self.capacity || ring.bytes > self.max_bytes)
                && ring.batches.len() > 1
            {
                if let Some(old) = ring.batches.pop_front() {
                    ring.events -= old.events.len();
                    ring.bytes -= ring.batch_bytes.pop_front().unwrap_or(0);
                    ring.evicted_up_to = old.index;
                }
            }
        }
        self.published.send_replace(index);
    }

    /// Forget every batch kept: the state was replaced whole at `index` (a reload
    /// from the store) and the changes between are not known as events. Readers
    /// behind `index` are told they missed events; new ones start after it.
    pub fn reset(&self, index: Index) {
        {
            let mut ring = self.ring();
            ring.batches.clear();
            ring.batch_bytes.clear();
            ring.events = 0;
            ring.bytes = 0;
            ring.evicted_up_to = ring.evicted_up_to.max(index);
        }
        self.published.send_modify(|i| *i = (*i).max(index));
    }

    /// A cursor that yields the batches from `index` on (the one at `index`
    /// included, as Nomad's); from an index older than the ring (0 among them), from
    /// the oldest batch kept.
    pub fn subscribe(self: &Arc<Self>, index: Index) -> Subscription {
        self.wanted
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let ring = self.ring();
        // The cursor is the index after which batches are delivered.
        let after = index.saturating_sub(1).max(ring.evicted_up_to);
        if index > 0 && index <= ring.evicted_up_to {
            tracing::debug!(
                requested = index,
                oldest_kept = ring.evicted_up_to + 1,
                "event stream: the requested index is no longer in the buffer; starting at the oldest kept"
            );
        }
        Subscription {
            broker: self.clone(),
            after,
            published: self.published.subscribe(),
        }
    }

    /// The index of the newest batch published (0: none).
    pub fn newest(&self) -> Index {
        *self.published.borrow()
    }
}

/// One reader's place in the ring.
pub struct Subscription {
    broker: Arc<EventBroker>,
    /// Batches with an index above this are still to deliver.
    after: Index,
    published: watch::Receiver<Index>,
}

impl Subscription {
    /// The next batch, waiting for one; an error once the ring dropped batches this
    /// reader had not read yet.
    pub async fn next(&mut self) -> Result<Arc<EventBatch>, StreamError> {
        loop {
            {
                let ring = self.broker.ring();
                if ring.evicted_up_to > self.after {
                    return Err(StreamError::Dropped(self.broker.capacity, self.after + 1));
                }
                // Batches are in index order: the first one past the cursor.
                let at = ring.batches.partition_point(|b| b.index <= self.after);
                if let Some(b) = ring.batches.get(at) {
                    self.after = b.index;
                    return Ok(b.clone());
                }
            }
            // Nothing new: wait for a publish (the value is re-read under the lock).
            self.published.borrow_and_update();
            {
                let ring = self.broker.ring();
                if ring.batches.back().is_some_and(|b| b.index > self.after)
                    || ring.evicted_up_to > self.after
                {
                    continue;
                }
            }
            if self.published.changed().await.is_err() {
                // The broker is gone with its server: nothing more will come.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The events of `batch`, committed at `index`, against `st`, the state before it is
/// applied (to tell a new node from a changed one, and for the purged jobs' last
/// version). In the order a reader expects: jobs, evaluations, allocations,
/// deployments, nodes.
pub(crate) fn of_batch(st: &State, batch: &Batch, index: Index) -> Vec<Event> {
    use crate::scheduler::StateView as _;
    let mut out = Vec::new();
    for j in &batch.jobs {
        out.push(Event {
            topic: Topic::Job,
            kind: if j.stop {
                "JobDeregistered"
            } else {
                "JobRegistered"
            },
            key: j.spec.name.clone(),
            filter_keys: Vec::new(),
            index,
            payload: Payload::Job(Arc::new(j.clone())),
        });
    }
    for (ns, name) in &batch.purge {
        if let Some(j) = st.job_in(ns, name) {
            let mut j = j.clone();
            j.stop = true;
            out.push(Event {
                topic: Topic::Job,
                kind: "JobDeregistered",
                key: name.clone(),
                filter_keys: Vec::new(),
                index,
                payload: Payload::Job(Arc::new(j)),
            });
        }
    }
    for e in &batch.evals {
        out.push(Event {
            topic: Topic::Evaluation,
            kind: "EvaluationUpdated",
            key: e.id.clone(),
            filter_keys: vec![e.job_name.clone()],
            index,
            payload: Payload::Evaluation(Arc::new(e.clone())),
        });
    }
    for a in &batch.allocs {
        // Placed or stopped by a plan (what the server wants changed), else a
        // client's report.
        let kind = match st.alloc(&a.id) {
            Some(old) if old.desired_status == a.desired_status => "AllocationUpdated",
            _ => "PlanResult",
        };
        out.push(Event {
            topic: Topic::Allocation,
            kind,
            key: a.id.clone(),
            filter_keys: vec![a.job_name.clone()],
            index,
            payload: Payload::Allocation(Arc::new(a.clone())),
        });
    }
    for d in &batch.deployments {
        // Nomad's kinds: a new deployment or a new status, a promotion, else its
        // counts moved (an allocation's health).
        let kind = match st.deployment(&d.id) {
            Some(old) if old.status == d.status && old.promoted() != d.promoted() => {
                "DeploymentPromotion"
            }
            Some(old) if old.status == d.status => "DeploymentAllocHealth",
            _ => "DeploymentStatusUpdate",
        };
        out.push(Event {
            topic: Topic::Deployment,
            kind,
            key: d.id.clone(),
            filter_keys: vec![d.job_name.clone()],
            index,
            payload: Payload::Deployment(Arc::new(d.clone())),
        });
    }
    for n in &batch.nodes {
        let kind = match st.node(&n.id) {
            None => "NodeRegistration",
            Some(old) if old.drain != n.drain => "NodeDrain",
            Some(old) if old.ineligible != n.ineligible => "NodeEligibility",
            Some(old)
                if old.status != n.status && n.status == drover_server_api::NodeStatus::Ready =>
            {
                "NodeRegistration"
            }
            Some(_) => "NodeStreamEvent",
        };
        out.push(Event {
            topic: Topic::Node,
            kind,
            key: n.id.clone(),
            filter_keys: Vec::new(),
            index,
            payload: Payload::Node(Arc::new(n.clone())),
        });
    }
    for id in &batch.drop_nodes {
        if let Some(n) = st.node(id) {
            out.push(Event {
                topic: Topic::Node,
                kind: "NodeDeregistration",
                key: id.clone(),
                filter_keys: Vec::new(),
                index,
                payload: Payload::Node(Arc::new(n.clone())),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_event(id: &str, index: Index) -> Event {
        let node: Node = serde_json::from_value(serde_json::json!({
            "id": id, "name": id, "status": "ready", "drain": false,
            "attributes": {}, "meta": {},
            "resources": {"cpu": 1000, "memory_mb": 1024},
            "drivers": {}, "status_updated_at": 0, "create_index": index, "modify_index": index,
        }))
        .expect("a node");
        Event {
            topic: Topic::Node,
            kind: "NodeRegistration",
            key: id.into(),
            filter_keys: Vec::new(),
            index,
            payload: Payload::Node(Arc::new(node)),
        }
    }

    #[tokio::test]
    async fn batches_come_in_index_order_from_where_the_reader_starts() {
        let broker = Arc::new(EventBroker::with_capacity(100));
        broker.publish(3, vec![node_event("a", 3)]);
        broker.publish(5, vec![node_event("b", 5)]);
        let mut from_start = broker.subscribe(0);
        let mut from_5 = broker.subscribe(5);
        let mut from_4 = broker.subscribe(4);
        assert_eq!(from_start.next().await.unwrap().index, 3);
        assert_eq!(from_start.next().await.unwrap().index, 5);
        assert_eq!(from_5.next().await.unwrap().index, 5);
        assert_eq!(from_4.next().await.unwrap().index, 5);
        // A batch seen again (a follower's replay) is not published twice.
        broker.publish(5, vec![node_event("b", 5)]);
        let waiter = tokio::spawn(async move { from_start.next().await.map(|b| b.index) });
        broker.publish(9, vec![node_event("c", 9)]);
        assert_eq!(waiter.await.unwrap(), Ok(9));
    }

    #[tokio::test]
    async fn the_ring_is_bounded_and_a_reader_left_behind_is_told() {
        let broker = Arc::new(EventBroker::with_capacity(4));
        let mut slow = broker.subscribe(1);
        for i in 1..=10 {
            broker.publish(i, vec![node_event("n", i)]);
        }
        assert!(broker.ring().events <= 4);
        let err = slow.next().await.unwrap_err();
        assert!(
            err.to_string().contains("event dropped from buffer"),
            "{err}"
        );
        // A reader from before the ring starts at its oldest batch (Nomad's
        // StartAtClosest).
        let mut late = broker.subscribe(1);
        assert_eq!(late.next().await.unwrap().index, 7);
    }

    #[tokio::test]
    async fn events_are_wanted_from_the_first_subscription_on() {
        let broker = Arc::new(EventBroker::with_capacity(100));
        assert!(
            !broker.wanted(),
            "nobody subscribed: commits need not make events"
        );
        let mut reader = broker.subscribe(0);
        assert!(broker.wanted());
        broker.publish(3, vec![node_event("a", 3)]);
        assert_eq!(reader.next().await.unwrap().index, 3);
    }

    #[tokio::test]
    async fn the_ring_is_bounded_in_bytes_too() {
        // Small events by count, but more bytes than allowed: the oldest go.
        let mut broker = EventBroker::with_capacity(1000);
        broker.max_bytes = 5 * 2048;
        for i in 1..=10 {
            broker.publish(i, vec![node_event("n", i)]);
        }
        let ring = broker.ring();
        assert_eq!(ring.batches.len(), 5);
        assert_eq!(ring.bytes, 5 * 2048);
        assert_eq!(ring.batch_bytes.len(), 5);
        assert_eq!(ring.evicted_up_to, 5);
    }

    #[tokio::test]
    async fn a_reload_tells_readers_they_missed_events() {
        let broker = Arc::new(EventBroker::with_capacity(100));
        broker.publish(3, vec![node_event("a", 3)]);
        let mut reader = broker.subscribe(0);
        assert_eq!(reader.next().await.unwrap().index, 3);
        broker.reset(10);
        assert!(reader.next().await.is_err());
        let mut fresh = broker.subscribe(0);
        broker.publish(11, vec![node_event("b", 11)]);
        assert_eq!(fresh.next().await.unwrap().index, 11);
    }

    #[test]
    fn subscriptions_select_by_topic_and_key_or_filter_key() {
        let mut e = node_event("n1", 1);
        e.filter_keys = vec!["job".into()];
        assert!(e.matches(None, "*"));
        assert!(e.matches(Some(Topic::Node), "*"));
        assert!(e.matches(Some(Topic::Node), "n1"));
        assert!(e.matches(Some(Topic::Node), "job"));
        assert!(!e.matches(Some(Topic::Job), "*"));
        assert!(!e.matches(Some(Topic::Node), "n2"));
    }
}
