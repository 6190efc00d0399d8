//! Garbage collection: what the server no longer needs is deleted through the store,
//! as every change, so that the state (and the store, memory, `GET /v1/allocations`
//! and the complete sets sent to nodes) does not grow with every allocation ever made.
//!
//! Deleted:
//! - an allocation terminal on its client (`complete`, `failed`, `lost`) and done
//!   with on the server (stopped, replaced, its job stopped, its group removed or
//!   scaled below its index), once older than
//!   `alloc_gc_threshold`, or beyond the newest `2 × count` such allocations of its
//!   job; one of a purged job at once. An allocation the client may still run is
//!   never deleted, nor a failed one still waiting for its replacement or a batch
//!   allocation that completed (it counts as done: deleting it would run it again);
//! - the terminal evaluations of a purged job, once older than `alloc_gc_threshold`
//!   (those of a live job are bounded per job where they are made);
//! - a node `down` for longer than `node_gc_threshold` with no allocation left.

use std::sync::Arc;
use std::time::Duration;

use drover_server_api::{Allocation, DesiredStatus, EvalStatus, JobType, NodeStatus};

use crate::error::ServerError;
use crate::leader::term::LeaderTerm;
use crate::state::{Batch, State};

/// Deletions in one commit at most (a bigger backlog is taken in several).
pub(crate) const MAX_DELETIONS_PER_COMMIT: usize = 10_000;

/// Terminal allocations kept per job at least, whatever its count.
const MIN_KEPT_PER_JOB: usize = 10;

pub(crate) async fn run(term: Arc<LeaderTerm>, stop: tokio_util::sync::CancellationToken) {
    let period = term.core.config.gc_interval.max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        // A backlog bigger than one commit is taken at once, commit after commit.
        loop {
            match collect(&term).await {
                Ok(n) if n >= MAX_DELETIONS_PER_COMMIT => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!("garbage collection failed: {e}");
                    break;
                }
            }
        }
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Whether the server is done with `a`: its client reported it ended (or the server
/// marked it lost), and nothing will replace or count it any more.
fn collectable(st: &State, a: &Allocation) -> bool {
    if !a.client_status.is_terminal() {
        return false;
    }
    match st.job_in(&a.namespace, &a.job_name) {
        None => true,
        Some(j) if j.stop => true,
        Some(j) => {
            a.desired_status == DesiredStatus::Stop
                || a.next_allocation.is_some()
                // Its group was removed, or scaled below its index: nothing will
                // replace it or count it.
                || j.spec
                    .groups
                    .iter()
                    .find(|g| g.name == a.group)
                    .is_none_or(|g| j.spec.job_type != JobType::System && a.index >= g.count)
        }
    }
}

/// One collection pass, committed; how many objects it deleted.
pub(crate) async fn collect(term: &LeaderTerm) -> Result<usize, ServerError> {
    let alloc_age = nanos(term.core.config.alloc_gc_threshold);
    let node_age = nanos(term.core.config.node_gc_threshold);
    let (_, n) = term
        .commit(|st, _index, now| {
            let b = garbage(st, now, alloc_age, node_age);
            let n = b.drop_allocs.len() + b.drop_evals.len() + b.drop_nodes.len();
            Ok((b, n))
        })
        .await?;
    if n > 0 {
        tracing::debug!(deleted = n, "garbage collected");
    }
    Ok(n)
}

/// What a pass at `now` deletes.
pub(crate) fn garbage(st: &State, now: i64, alloc_age: i64, node_age: i64) -> Batch {
    let mut b = Batch::default();
    let budget = MAX_DELETIONS_PER_COMMIT;
    let old = |t: i64, age: i64| now.saturating_sub(t) > age;
    let mut jobs: Vec<&(String, String)> = st.jobs_with_allocs().collect();
    jobs.sort_unstable();
    for (ns, name) in jobs {
        let job = st.job_in(ns, name);
        let mut done: Vec<&Allocation> = st
            .allocs_of_job(ns, name)
            .filter(|a| collectable(st, a))
            .collect();
        // Newest first: the cap keeps the newest.
        done.sort_by_key(|a| std::cmp::Reverse((a.modify_index, a.create_index)));
        let keep = job.map_or(0, |j| {
            let count: usize = j.spec.groups.iter().map(|g| g.count as usize).sum();
            (2 * count).max(MIN_KEPT_PER_JOB)
        });
        for (i, a) in done.into_iter().enumerate() {
            if b.drop_allocs.len() >= budget {
                return b;
            }
            if job.is_none() || i >= keep || old(a.modify_time, alloc_age) {
                b.drop_allocs.push(a.id.clone());
            }
        }
    }
    // Purged jobs' evaluations: nothing else ever deletes them.
    let mut purged: Vec<&(String, String)> = st
        .jobs_with_evals()
        .filter(|(ns, name)| st.job_in(ns, name).is_none())
        .collect();
    purged.sort_unstable();
    for (ns, name) in purged {
        for e in st.evals_of_job(ns, name) {
            if b.drop_evals.len() >= budget {
                break;
            }
            if matches!(
                e.status,
                EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled
            ) && old(e.modify_time, alloc_age)
            {
                b.drop_evals.push(e.id.clone());
            }
        }
    }
    let dropping: std::collections::HashSet<&str> =
        b.drop_allocs.iter().map(String::as_str).collect();
    for n in st.all_nodes() {
        if n.status == NodeStatus::Down
            && old(n.status_updated_at, node_age)
            && st
                .allocs_on_node(&n.id)
                .all(|a| dropping.contains(a.id.as_str()))
        {
            b.drop_nodes.push(n.id.clone());
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyValue;

    const S: i64 = 1_000_000_000;

    fn kv(key: String, value: serde_json::Value) -> KeyValue {
        KeyValue {
            key,
            value: serde_json::to_vec(&value).unwrap(),
            create_revision: 1,
            mod_revision: 1,
        }
    }

    fn eval(id: &str, status: &str, modify_time: i64) -> KeyValue {
        kv(
            format!("eval/{id}"),
            serde_json::json!({
                "id": id, "job_name": "purged", "job_type": "service", "priority": 50,
                "triggered_by": "job-register", "status": status, "job_modify_index": 1,
                "create_index": 1, "modify_index": 1, "create_time": 0,
                "modify_time": modify_time,
            }),
        )
    }

    fn node(id: &str, status_updated_at: i64) -> KeyValue {
        kv(
            format!("node/{id}"),
            serde_json::json!({
                "id": id, "name": id, "status": "down", "drain": false, "attributes": {},
                "meta": {}, "resources": {"cpu": 1, "memory_mb": 1}, "drivers": {},
                "status_updated_at": status_updated_at, "create_index": 1, "modify_index": 1,
            }),
        )
    }

    #[test]
    fn purged_jobs_old_terminal_evaluations_and_empty_long_down_nodes_go() {
        let alloc = kv(
            "alloc/a1".into(),
            serde_json::json!({
                "id": "a1", "name": "x.app[0]", "index": 0, "job_name": "live",
                "job_version": 0, "group": "app", "node_id": "busy", "node_name": "busy",
                "resources": {"cpu": 1, "memory_mb": 1}, "desired_status": "run",
                "client_status": "running", "eval_id": "e", "create_index": 1,
                "modify_index": 1, "alloc_modify_index": 1, "create_time": 0,
                "modify_time": 0,
            }),
        );
        let st = State::load(
            vec![
                eval("old", "complete", 0),
                eval("young", "complete", 95 * S),
                eval("waiting", "pending", 0),
                node("empty-old", 0),
                node("empty-young", 95 * S),
                node("busy", 0),
                alloc,
            ],
            1,
        )
        .unwrap();
        let b = garbage(&st, 100 * S, 10 * S, 10 * S);
        assert_eq!(b.drop_evals, ["old"], "old and terminal only");
        assert_eq!(b.drop_nodes, ["empty-old"], "down for long, nothing on it");
        assert!(
            b.drop_allocs.is_empty(),
            "a running allocation is never deleted"
        );
    }
}
