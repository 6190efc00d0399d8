//! Leadership and following: what a server does as one of several on one store.
//!
//! A server campaigns for leadership in a loop ([`crate::leader::Election`]); while
//! it waits it **follows**: it applies the leader's commits from [`Store::watch`] to
//! its state in memory (so every read, blocking queries and node allocation watches
//! included, is served from it) and hands nothing to a broker. Once elected, for its
//! **term** it reloads the whole state from the store, enqueues the pending
//! evaluations, gives every live node the failover window (as after a restart, so
//! that no healthy node is marked down by the failover itself) and starts the leader
//! loops (plan applier, client update batcher, heartbeat timers, blocked and delayed
//! evaluations, garbage collection, workers). When the term is lost (lease expired or
//! revoked, a commit refused by the fence) or the server shuts down, the loops stop,
//! the term's broker and timers go with it ([`LeaderTerm`]), and the server follows
//! again.
//!
//! The one server on the embedded store always leads ([`crate::leader::SoleLeader`]):
//! its first term starts at once and lasts until shutdown.

use std::sync::Arc;
use std::time::Duration;

use drover_server_api::{EvalStatus, Evaluation, NodeStatus};
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::core::{Core, Fence};
use crate::error::ServerError;
use crate::leader::Term;
use crate::leader::leadership::Leadership;
use crate::leader::term::LeaderTerm;
use crate::state::Batch;
use crate::store::{StoreChange, WatchEvent};

/// Pause before campaigning again after the store failed.
const CAMPAIGN_RETRY: Duration = Duration::from_secs(1);
/// A new leader that cannot load the state this many times, or for this long,
/// resigns: while it holds the term no other server can lead.
const LOAD_ATTEMPTS: u32 = 3;
const LOAD_GIVE_UP: Duration = Duration::from_secs(10);
/// Pause after resigning before campaigning again.
const RESIGNED_PAUSE: Duration = Duration::from_secs(2);
/// Pause before following again after the watch or a reload failed.
const FOLLOW_RETRY: Duration = Duration::from_secs(1);
/// Longest pause between attempts to read the state again.
const MAX_FOLLOW_RETRY: Duration = Duration::from_secs(5);
/// Parts of one split commit a follower keeps at most before it gives up on the
/// watch and reloads (a store that never sends the part that moves the revision).
const MAX_STAGED_PARTS: usize = 10_000;

/// Campaign, lead, follow, until shutdown; then hand leadership over at once
/// ([`crate::leader::Election::close`]: etcd revokes this server's lease).
pub(crate) async fn run(core: Arc<Core>, leadership: Arc<Leadership>) {
    run_terms(&core, &leadership).await;
    leadership.election.close().await;
    tracing::info!(server = %leadership.me.name, "left the election");
}

async fn run_terms(core: &Arc<Core>, leadership: &Leadership) {
    // The state was just loaded by `start_with`: the first term or follow need not
    // read it again if nothing was committed since.
    let mut fresh = true;
    loop {
        let follow_stop = core.shutdown.child_token();
        let follower = tokio::spawn(follow(core.clone(), follow_stop.clone(), !fresh));
        let term = campaign(core, leadership).await;
        follow_stop.cancel();
        let _ = follower.await;
        let Some(term) = term else {
            return; // shutdown
        };
        let gave_up = lead(core, leadership, term, fresh).await;
        fresh = false;
        if gave_up {
            // Campaign again only after a pause: the others queue up meanwhile, and a
            // lone server does not spin on a state it cannot read.
            tokio::select! {
                () = tokio::time::sleep(RESIGNED_PAUSE) => {}
                () = core.shutdown.cancelled() => return,
            }
        }
        if core.shutdown.is_cancelled() {
            return;
        }
    }
}

/// Keep this server registered as a member while it runs.
pub(crate) async fn keep_registered(core: Arc<Core>, leadership: Arc<Leadership>) {
    loop {
        let r = tokio::select! {
            r = leadership.election.register(leadership.me.clone()) => r,
            () = core.shutdown.cancelled() => return,
        };
        if let Err(e) = r {
            tracing::warn!("cannot register this server in the store: {e}; retrying");
        }
        tokio::select! {
            () = tokio::time::sleep(CAMPAIGN_RETRY) => {}
            () = core.shutdown.cancelled() => return,
        }
    }
}

/// Campaign until elected; `None` on shutdown.
async fn campaign(core: &Core, leadership: &Leadership) -> Option<Term> {
    loop {
        let r = tokio::select! {
            r = leadership.election.campaign(leadership.me.clone()) => r,
            () = core.shutdown.cancelled() => return None,
        };
        match r {
            Ok(term) => return Some(term),
            Err(e) => {
                tracing::warn!("campaign for leadership failed: {e}; retrying");
                tokio::select! {
                    () = tokio::time::sleep(CAMPAIGN_RETRY) => {}
                    () = core.shutdown.cancelled() => return None,
                }
            }
        }
    }
}

/// One term: set up, run the leader loops until the term is lost or shutdown, then
/// tear down. `true`: the term was given up because the state could not be loaded.
async fn lead(core: &Arc<Core>, leadership: &Leadership, term: Term, fresh: bool) -> bool {
    let Term { fence, lost, id } = term;
    let stop = core.shutdown.child_token();
    let (leader_term, queues) = {
        let _writer = core.commit_lock.lock().await;
        // The whole state, as the store has it now: a follower's state may lag, and
        // the term must start from what the previous leader committed last.
        let started = std::time::Instant::now();
        let mut attempts = 0;
        loop {
            let current = match core.store.revision().await {
                Ok(r) if fresh && r == core.read().index => break,
                Ok(_) => core.reload().await.map(|_| ()),
                Err(e) => Err(ServerError::Store(e)),
            };
            attempts += 1;
            match current {
                Ok(()) => break,
                // While this server holds the term nobody else can lead: after a few
                // failures give the others a chance (the state may be fine for a
                // server of another version, or the fault may be this server's).
                Err(e) if attempts >= LOAD_ATTEMPTS || started.elapsed() >= LOAD_GIVE_UP => {
                    tracing::error!(
                        server = %leadership.me.name,
                        term = id,
                        attempts,
                        "cannot load the state for the new term: {e}; resigning so that \
                         another server can try"
                    );
                    leadership.election.resign().await;
                    return true;
                }
                Err(e) => {
                    tracing::warn!(
                        term = id,
                        attempts,
                        "cannot load the state for the new term: {e}; retrying"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(CAMPAIGN_RETRY) => {}
                        () = lost.cancelled() => return false,
                        () = core.shutdown.cancelled() => return false,
                    }
                }
            }
        }
        let (leader_term, queues) = LeaderTerm::new(
            core.clone(),
            Fence {
                term: id,
                holder: leadership.me.name.clone(),
                conditions: fence,
                lost: lost.clone(),
                ended: stop.clone(),
            },
        );
        let st = core.read();
        let mut pending: Vec<&Evaluation> = st
            .all_evals()
            .filter(|e| e.status == EvalStatus::Pending)
            .collect();
        pending.sort_by_key(|e| e.create_index);
        for e in pending {
            leader_term.broker.enqueue(e.clone());
        }
        // Every live node gets a fresh window: the previous leader (or this server,
        // before a restart) heard its heartbeats, not this term; its client may be in
        // a reconnect backoff.
        let deadline = std::time::Instant::now()
            + (core.config.heartbeat_ttl + core.config.heartbeat_grace)
                .max(core.config.failover_heartbeat_ttl);
        {
            let mut timers = leader_term.timers();
            for n in st.all_nodes().filter(|n| n.status != NodeStatus::Down) {
                timers.reset(&n.id, deadline);
            }
        }
        tracing::info!(
            server = %leadership.me.name,
            term = id,
            index = st.index,
            nodes = st.all_nodes().count(),
            pending_evals = leader_term.broker.len(),
            "leading"
        );
        let leader_term = Arc::new(leader_term);
        leadership.begin(leader_term.clone());
        (leader_term, queues)
    };
    leadership.set_known_leader(Some(leadership.me.clone()));
    let term = leader_term;
    let mut tasks = vec![
        tokio::spawn(crate::leader::plan_apply::run(
            term.clone(),
            queues.plans,
            stop.clone(),
        )),
        tokio::spawn(crate::leader::client_updates::run(
            term.clone(),
            queues.updates,
            stop.clone(),
        )),
        tokio::spawn(crate::leader::heartbeat::run(term.clone(), stop.clone())),
        tokio::spawn(crate::leader::blocked::run(term.clone(), stop.clone())),
        tokio::spawn(crate::leader::worker::run_expiry(
            term.clone(),
            stop.clone(),
        )),
        tokio::spawn(crate::leader::gc::run(term.clone(), stop.clone())),
        tokio::spawn(crate::leader::deployments::run(term.clone(), stop.clone())),
    ];
    for i in 0..core.config.workers {
        tasks.push(tokio::spawn(crate::leader::worker::run(
            term.clone(),
            i,
            stop.clone(),
        )));
    }
    leadership.announce(id);
    tokio::select! {
        () = lost.cancelled() => {
            tracing::warn!(server = %leadership.me.name, term = id, "leadership lost: following again");
        }
        () = core.shutdown.cancelled() => {}
    }
    // Writes are refused from here on; the loops finish what they hold (their
    // commits fail) and stop. The broker and the timers go with the term.
    leadership.end();
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    false
}

/// Follow the leader's commits until `stop`. `reload` first when the state may be
/// behind the store (after a term of our own: its last commits may have failed).
async fn follow(core: Arc<Core>, stop: CancellationToken, mut reload: bool) {
    // Doubles while reading the state keeps failing (a store that is down, a value
    // that does not decode): retried for ever, logged less and less often.
    let mut backoff = FOLLOW_RETRY;
    loop {
        if reload {
            let r = {
                let _writer = core.commit_lock.lock().await;
                core.reload().await
            };
            if let Err(e) = r {
                tracing::warn!(
                    "cannot read the state from the store: {e}; retrying in {}s",
                    backoff.as_secs()
                );
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(MAX_FOLLOW_RETRY);
                continue;
            }
            backoff = FOLLOW_RETRY;
        }
        reload = true;
        let from = core.read().index;
        let mut changes = core.store.watch(from);
        let mut staged: Vec<StoreChange> = Vec::new();
        loop {
            let event = tokio::select! {
                e = changes.next() => e,
                () = stop.cancelled() => return,
            };
            match event {
                Some(Ok(WatchEvent::Change(change))) => {
                    let revision = change.revision;
                    staged.push(change);
                    let Some(index) = revision else {
                        if staged.len() > MAX_STAGED_PARTS {
                            tracing::warn!(
                                parts = staged.len(),
                                "a split commit never completed in the watch; reloading"
                            );
                            break;
                        }
                        continue;
                    };
                    let parts = std::mem::take(&mut staged);
                    match apply(&core, &parts, index).await {
                        Ok(()) => {}
                        Err(e) => {
                            tracing::error!(
                                index,
                                "cannot apply the leader's commit: {e}; reloading"
                            );
                            pause(&stop).await;
                            break;
                        }
                    }
                }
                Some(Ok(WatchEvent::Reset)) => {
                    tracing::info!("the store's watch cannot go on from where it was; reloading");
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!("watching the store failed: {e}; reloading");
                    pause(&stop).await;
                    break;
                }
                None => {
                    tracing::warn!("the store's watch ended; reloading");
                    pause(&stop).await;
                    break;
                }
            }
        }
    }
}

async fn pause(stop: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(FOLLOW_RETRY) => {}
        () = stop.cancelled() => {}
    }
}

/// Apply one commit of the leader (all its parts) at `index`.
async fn apply(core: &Core, parts: &[StoreChange], index: u64) -> Result<(), ServerError> {
    let batches = parts
        .iter()
        .map(Batch::from_change)
        .collect::<Result<Vec<_>, _>>()?;
    let _writer = core.commit_lock.lock().await;
    let current = core.read().index;
    if index <= current {
        return Ok(()); // seen already (a watch restarted from an older revision)
    }
    if index != current + 1 {
        return Err(ServerError::Unavailable(format!(
            "the watch skipped from index {current} to {index}"
        )));
    }
    core.apply_followed(batches, index);
    Ok(())
}
