//! Heartbeat timers: every live node has a deadline (last heartbeat + TTL + grace)
//! kept in [`Timers`]; one loop of the leader sleeps until the earliest and marks a
//! node whose deadline passed `down`: its non-terminal allocations are stopped as
//! `lost` (the scheduler replaces them) and a `node-update` evaluation is made for
//! every affected job and every system job. Heartbeats are not written to the store
//! (as Nomad's): after a server restart every node gets a fresh TTL + grace.
//! (Registration, authentication and drain are node endpoints: `endpoints/nodes.rs`.)

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_server_api::{ClientStatus, DesiredStatus, EvalTrigger, JobType, NodeStatus};

use crate::error::ServerError;
use crate::leader::term::LeaderTerm;
use crate::scheduler::StateView;
use crate::state::Batch;
use crate::state::evals::{new_eval, system_job_evals};

pub(crate) async fn run(term: Arc<LeaderTerm>, stop: tokio_util::sync::CancellationToken) {
    loop {
        let changed = term.timers_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let next = term.timers().next();
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
        let expired = term.timers().pop_expired(Instant::now());
        for node in expired {
            if let Err(e) = term.node_down(&node).await {
                if e.is_not_leader() {
                    // The term ended under this loop (it stops at once): the next
                    // leader's timers decide about the node, after its failover window.
                    tracing::info!(node = %node, "not marking the node down: {e}");
                    return;
                }
                tracing::error!(node = %node, "could not mark the node down: {e}; retrying");
                // Try again soon rather than forget the node.
                term.timers()
                    .reset(&node, Instant::now() + Duration::from_secs(1));
            }
        }
    }
}

impl LeaderTerm {
    /// Mark a node whose heartbeat deadline passed `down`.
    pub(crate) async fn node_down(&self, node_id: &str) -> Result<(), ServerError> {
        let silent = self.core.config.heartbeat_ttl + self.core.config.heartbeat_grace;
        let (index, n) = self
            .commit(|st, index, now| {
                let mut b = Batch::default();
                // A heartbeat or registration that came in since the deadline wins.
                if self.timers().has(node_id) {
                    return Ok((b, None));
                }
                let Some(node) = st.node(node_id).filter(|n| n.status != NodeStatus::Down) else {
                    return Ok((b, None));
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
                    jobs.insert((a.namespace.clone(), a.job_name.clone()));
                    b.allocs.push(a);
                }
                let n = b.allocs.len();
                for (ns, name) in &jobs {
                    if let Some(job) = st
                        .job_in(ns, name)
                        .filter(|j| j.spec.job_type != JobType::System)
                    {
                        let mut e = new_eval(job, EvalTrigger::NodeUpdate, index, now);
                        e.node_id = Some(node_id.to_owned());
                        b.evals.push(e);
                    }
                }
                system_job_evals(st, node_id, index, now, &mut b);
                b.nodes.push(node);
                Ok((b, Some(n)))
            })
            .await?;
        // Not marked down after all (a heartbeat came, or it was down already).
        let Some(n) = n else { return Ok(()) };
        self.core.metrics.heartbeats_missed.inc();
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
