//! Heartbeat timers: every live node has a deadline (last heartbeat + TTL + grace)
//! kept in [`Timers`]; one loop of the leader sleeps until the earliest and marks a
//! node whose deadline passed `down`: its non-terminal allocations are stopped as
//! `lost` (the scheduler replaces them) and a `node-update` evaluation is made for
//! every affected job and every system job. Heartbeats are not written to the store
//! (as Nomad's): after a server restart every node gets a fresh TTL + grace.
//! (Registration, authentication and drain are node endpoints: `endpoints/nodes.rs`.)

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_server_api::{ClientStatus, DesiredStatus, EvalTrigger, JobType, NodeStatus};

use crate::core::Core;
use crate::error::ServerError;
use crate::scheduler::StateView;
use crate::state::Batch;
use crate::state::evals::{new_eval, system_job_evals};

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

pub(crate) async fn run(core: Arc<Core>, stop: tokio_util::sync::CancellationToken) {
    loop {
        let changed = core.timers_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let next = core.timers().next();
        let sleep = async {
            match next {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = changed => continue,
            _ = sleep => {}
        }
        let expired = core.timers().pop_expired(Instant::now());
        for node in expired {
            if let Err(e) = core.node_down(&node).await {
                if e.is_not_leader() {
                    // The term ended under this loop (it stops at once): the next
                    // leader's timers decide about the node, after its failover window.
                    tracing::info!(node = %node, "not marking the node down: {e}");
                    return;
                }
                tracing::error!(node = %node, "could not mark the node down: {e}; retrying");
                // Try again soon rather than forget the node.
                core.timers()
                    .reset(&node, Instant::now() + Duration::from_secs(1));
            }
        }
    }
}

impl Core {
    pub(crate) fn timers(&self) -> std::sync::MutexGuard<'_, Timers> {
        self.timers.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn arm(&self, node_id: &str) {
        let deadline = Instant::now() + self.config.heartbeat_ttl + self.config.heartbeat_grace;
        self.timers().reset(node_id, deadline);
        self.timers_changed.notify_one();
    }

    /// Mark a node whose heartbeat deadline passed `down`.
    pub(crate) async fn node_down(&self, node_id: &str) -> Result<(), ServerError> {
        let silent = self.config.heartbeat_ttl + self.config.heartbeat_grace;
        let (index, n) = self
            .commit(|st, index, now| {
                let mut b = Batch::default();
                // A heartbeat or registration that came in since the deadline wins.
                if self.timers().has(node_id) {
                    return Ok((b, 0));
                }
                let Some(node) = st.node(node_id).filter(|n| n.status != NodeStatus::Down) else {
                    return Ok((b, 0));
                };
                let mut node = node.clone();
                node.status = NodeStatus::Down;
                node.status_description =
                    format!("missed heartbeats for {}", humantime_secs(silent));
                node.status_updated_at = now;
                node.modify_index = index;
                let mut jobs = BTreeSet::new();
                for a in st.allocs_on_node(node_id) {
                    if a.is_terminal() {
                        continue;
                    }
                    let mut a = a.clone();
                    a.desired_status = DesiredStatus::Stop;
                    a.desired_description = "node down".into();
                    a.client_status = ClientStatus::Lost;
                    a.client_description = "node down: allocation lost".into();
                    a.alloc_modify_index = index;
                    a.modify_index = index;
                    a.modify_time = now;
                    jobs.insert(a.job_name.clone());
                    b.allocs.push(a);
                }
                let n = b.allocs.len();
                for name in &jobs {
                    if let Some(job) = st.job(name).filter(|j| j.spec.job_type != JobType::System) {
                        let mut e = new_eval(job, EvalTrigger::NodeUpdate, index, now);
                        e.node_id = Some(node_id.to_owned());
                        b.evals.push(e);
                    }
                }
                system_job_evals(st, node_id, index, now, &mut b);
                b.nodes.push(node);
                Ok((b, n))
            })
            .await?;
        tracing::warn!(node = %node_id, index, lost_allocations = n, "node missed its heartbeats: down");
        Ok(())
    }
}

fn humantime_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
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
