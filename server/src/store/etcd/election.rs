//! Leader election on etcd: etcd's `v3election` service on one lease per store
//! instance, kept alive by one task.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use drover_proto::etcd::etcdserverpb as pb;
use drover_proto::etcd::v3electionpb as epb;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

mod registry;

use super::client::{self, Client, Retry, kv};
use super::watch::{MAX_BACKOFF, Reader, Received, open};
use crate::store::election::{Election, NameClaim, ServerInfo, Term};
use crate::store::{BoxFuture, Condition, StoreError};

/// One lease of this store instance.
#[derive(Debug, Clone)]
struct Lease {
    id: i64,
    /// Fires when the lease is gone or may be (no keepalive answered for a TTL).
    lost: CancellationToken,
}

/// The term this instance holds.
#[derive(Debug)]
struct Held {
    leader: epb::LeaderKey,
    lost: CancellationToken,
}

pub(crate) struct EtcdElection {
    client: Arc<Client>,
    prefix: String,
    ttl: Duration,
    lease: tokio::sync::Mutex<Option<Lease>>,
    term: std::sync::Mutex<Option<Held>>,
    /// [`Election::close`] was called: no new lease, registration ends.
    closed: CancellationToken,
}

/// etcd's answer to a request on a lease it no longer has.
fn lease_not_found(e: &str) -> bool {
    e.contains("requested lease not found")
}

impl Drop for EtcdElection {
    fn drop(&mut self) {
        // Stop the keepalive task (etcd expires the lease after its TTL).
        self.closed.cancel();
        if let Some(l) = self.lease.get_mut().take() {
            l.lost.cancel();
        }
    }
}

impl EtcdElection {
    pub(crate) fn new(client: Arc<Client>, prefix: String, ttl: Duration) -> Self {
        EtcdElection {
            client,
            prefix,
            ttl,
            lease: tokio::sync::Mutex::new(None),
            term: std::sync::Mutex::new(None),
            closed: CancellationToken::new(),
        }
    }

    fn name(&self) -> Vec<u8> {
        format!("{}election", self.prefix).into_bytes()
    }

    /// The live lease, granting a new one (and starting its keepalive) when there is
    /// none or the last one was lost.
    async fn lease(&self) -> Result<Lease, StoreError> {
        let mut slot = self.lease.lock().await;
        if self.closed.is_cancelled() {
            return Err(StoreError::Backend(
                "the etcd election of this server was closed (shutting down)".into(),
            ));
        }
        if let Some(l) = slot.as_ref()
            && !l.lost.is_cancelled()
        {
            return Ok(l.clone());
        }
        let ttl = i64::try_from(self.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let sent = Instant::now();
        let resp = self
            .client
            .unary("lease grant", Retry::NotSent, |ch| async move {
                client::lease(ch)
                    .lease_grant(pb::LeaseGrantRequest { ttl, id: 0 })
                    .await
            })
            .await?;
        if !resp.error.is_empty() || resp.id == 0 {
            return Err(StoreError::Backend(format!(
                "etcd lease grant refused: {}",
                resp.error
            )));
        }
        let granted = Duration::from_secs(u64::try_from(resp.ttl).unwrap_or(0).max(1));
        let lease = Lease {
            id: resp.id,
            lost: CancellationToken::new(),
        };
        tracing::debug!(lease = format!("{:x}", lease.id), ttl = ?granted, "etcd lease granted");
        tokio::spawn(keep_alive(
            self.client.clone(),
            lease.clone(),
            granted,
            sent,
        ));
        *slot = Some(lease.clone());
        Ok(lease)
    }

    async fn do_campaign(&self, me: ServerInfo) -> Result<Term, StoreError> {
        let value = serde_json::to_vec(&me)
            .map_err(|e| StoreError::Backend(format!("encode server info: {e}")))?;
        loop {
            let lease = self.lease().await?;
            let (i, url, ch) = self.client.current();
            let req = epb::CampaignRequest {
                name: self.name(),
                lease: lease.id,
                value: value.clone(),
            };
            // No timeout: Campaign answers once this server leads.
            let mut ec = client::election(ch);
            let r = tokio::select! {
                r = ec.campaign(req) => r,
                _ = lease.lost.cancelled() => {
                    tracing::info!("etcd lease lost while campaigning; campaigning on a new one");
                    continue;
                }
            };
            let resp = match r {
                Ok(r) => r.into_inner(),
                Err(st) if lease_not_found(&st.to_string()) => {
                    lease.lost.cancel();
                    tracing::info!(
                        "etcd lease gone before the keepalive noticed; campaigning on a new one"
                    );
                    continue;
                }
                Err(st) => {
                    if client::is_unavailable(&st) {
                        self.client.failed(i);
                    }
                    return Err(client::status_error(url, "campaign", &st));
                }
            };
            let Some(leader) = resp.leader else {
                return Err(StoreError::Backend(format!(
                    "etcd campaign at {url}: answer without a leader key"
                )));
            };
            if lease.lost.is_cancelled() {
                continue;
            }
            let key = String::from_utf8_lossy(&leader.key).into_owned();
            let fence_key = key
                .strip_prefix(&self.prefix)
                .map(str::to_owned)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "etcd leader key {key:?} is outside the prefix {:?}",
                        self.prefix
                    ))
                })?;
            let lost = lease.lost.child_token();
            tokio::spawn(watch_leader_key(
                self.client.clone(),
                leader.key.clone(),
                leader.rev,
                lost.clone(),
            ));
            let id = u64::try_from(leader.rev).unwrap_or(0);
            tracing::info!(term = id, key = %key, "leading");
            *self.term.lock().unwrap_or_else(|p| p.into_inner()) = Some(Held {
                leader,
                lost: lost.clone(),
            });
            return Ok(Term {
                fence: vec![Condition::CreateRevision {
                    key: fence_key,
                    revision: id,
                }],
                lost,
                id,
            });
        }
    }

    async fn do_resign(&self) {
        let held = self.term.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(held) = held else { return };
        held.lost.cancel();
        let req = epb::ResignRequest {
            leader: Some(held.leader),
        };
        if let Err(e) = self
            .client
            .unary("resign", Retry::Idempotent, |ch| {
                let r = req.clone();
                async move { client::election(ch).resign(r).await }
            })
            .await
        {
            tracing::warn!(error = %e, "etcd resign failed; the lease's expiry ends the term");
        }
    }

    async fn do_close(&self) {
        self.closed.cancel();
        self.do_resign().await;
        let lease = self.lease.lock().await.take();
        let Some(lease) = lease else { return };
        lease.lost.cancel();
        let id = lease.id;
        if let Err(e) = self
            .client
            .unary("lease revoke", Retry::Idempotent, |ch| async move {
                client::lease(ch)
                    .lease_revoke(pb::LeaseRevokeRequest { id })
                    .await
            })
            .await
        {
            tracing::warn!(error = %e, "etcd lease revoke failed; it expires after its TTL");
        }
    }

    async fn do_leader(&self) -> Result<Option<ServerInfo>, StoreError> {
        let req = epb::LeaderRequest { name: self.name() };
        let r = self
            .client
            .unary("leader", Retry::Idempotent, |ch| {
                let r = req.clone();
                async move { client::election(ch).leader(r).await }
            })
            .await;
        match r {
            Ok(resp) => match resp.kv {
                Some(kv) if !kv.value.is_empty() => {
                    serde_json::from_slice(&kv.value).map(Some).map_err(|e| {
                        StoreError::Corrupt(format!(
                            "etcd leader key {:?}: {e}",
                            String::from_utf8_lossy(&kv.key)
                        ))
                    })
                }
                _ => Ok(None),
            },
            // etcd answers "election: no leader" when nobody campaigns.
            Err(e) if e.to_string().contains("no leader") => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Election for EtcdElection {
    fn campaign(&self, me: ServerInfo) -> BoxFuture<'_, Result<Term, StoreError>> {
        Box::pin(self.do_campaign(me))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<ServerInfo>, StoreError>> {
        Box::pin(self.do_leader())
    }

    fn register(&self, me: ServerInfo) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.do_register(me))
    }

    fn claim(&self, me: ServerInfo) -> BoxFuture<'_, Result<NameClaim, StoreError>> {
        Box::pin(self.do_claim(me))
    }

    fn members(&self) -> BoxFuture<'_, Result<Vec<ServerInfo>, StoreError>> {
        Box::pin(self.do_members())
    }

    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    fn resign(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.do_resign())
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.do_close())
    }
}

/// Keep `lease` alive every TTL/3 until it is lost: etcd says it is gone, or no
/// keepalive was answered for 95% of a TTL after it was sent (the lease may expire
/// soon: conservative, by the local clock). A dead or stuck endpoint is left for the
/// next one.
async fn keep_alive(client: Arc<Client>, lease: Lease, ttl: Duration, granted_at: Instant) {
    if keep_alive_until_lost(&client, &lease, ttl, granted_at).await {
        revoke_lost(&client, lease.id, ttl).await;
    }
}

/// The lease was given up unanswered (etcd down, paused or cut off): revoke it once
/// etcd answers again, so that its election key and registration go at once and the
/// next leader need not wait for its expiry (etcd renews every lease's TTL when it
/// restarts or elects a new raft leader). Tries for three TTLs at most.
async fn revoke_lost(client: &Client, id: i64, ttl: Duration) {
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        let r = client
            .unary(
                "revoke of a lost lease",
                Retry::Idempotent,
                |ch| async move {
                    client::lease(ch)
                        .lease_revoke(pb::LeaseRevokeRequest { id })
                        .await
                },
            )
            .await;
        match r {
            Ok(_) => {
                tracing::info!(lease = format!("{id:x}"), "revoked the lost etcd lease");
                return;
            }
            Err(e) if lease_not_found(&e.to_string()) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Keepalives until the lease is lost; `true` when it was given up for want of
/// answers (rather than etcd saying it is gone, or a revoke/close).
async fn keep_alive_until_lost(
    client: &Client,
    lease: &Lease,
    ttl: Duration,
    granted_at: Instant,
) -> bool {
    let period = (ttl / 3).max(Duration::from_millis(300));
    // The lease lives at least until the send of the last answered request + TTL;
    // give the term up a little before that (timers fire late by up to a tick, a
    // request may be answered just as etcd stops), so that it is never held past it.
    let deadline = ttl - ttl / 20;
    let mut alive_from = granted_at;
    let mut pause = Duration::from_millis(100);
    let lost = |why: &str| {
        tracing::warn!(lease = format!("{:x}", lease.id), why, "etcd lease lost");
        lease.lost.cancel();
    };
    loop {
        if lease.lost.is_cancelled() {
            return false;
        }
        let (i, url, ch) = client.current();
        let (tx, rx) = mpsc::channel::<pb::LeaseKeepAliveRequest>(4);
        // etcd answers the call (headers included) only with its first response: the
        // first request must be on its way before the call returns.
        let _ = tx.try_send(pb::LeaseKeepAliveRequest { id: lease.id });
        let mut sent: VecDeque<Instant> = VecDeque::from([Instant::now()]);
        let mut lc = client::lease(ch);
        let opened = tokio::select! {
            r = tokio::time::timeout(client.timeout(), lc.lease_keep_alive(ReceiverStream::new(rx))) => r,
            _ = tokio::time::sleep_until(alive_from + deadline) => { lost("no keepalive answered for its TTL"); return true; }
            _ = lease.lost.cancelled() => return false,
        };
        let mut stream = match opened {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(st)) => {
                client.failed(i);
                tracing::warn!(endpoint = url, error = %client::describe(&st), "etcd lease keepalive: reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = tokio::time::sleep_until(alive_from + deadline) => { lost("no keepalive answered for its TTL"); return true; }
                    _ = lease.lost.cancelled() => return false,
                }
                pause = (pause * 2).min(period);
                continue;
            }
            Err(_) => {
                client.failed(i);
                continue;
            }
        };
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = lease.lost.cancelled() => return false,
                _ = tokio::time::sleep_until(alive_from + deadline) => {
                    lost("no keepalive answered for its TTL");
                    return true;
                }
                _ = tick.tick() => {
                    // Never wait here: a dead connection stops taking requests, and
                    // the TTL deadline above must still be able to fire. A full queue
                    // or unanswered requests beyond a few mean the stream is stuck.
                    if tx.try_send(pb::LeaseKeepAliveRequest { id: lease.id }).is_err()
                        || sent.len() >= 3
                    {
                        client.failed(i);
                        tracing::warn!(endpoint = url, "etcd lease keepalive stuck; reconnecting");
                        break;
                    }
                    sent.push_back(Instant::now());
                }
                msg = stream.message() => match msg {
                    Ok(Some(r)) => {
                        let at = sent.pop_front();
                        if r.ttl <= 0 {
                            lost("etcd says the lease is gone");
                            return false;
                        }
                        if let Some(at) = at {
                            alive_from = alive_from.max(at);
                        }
                        pause = Duration::from_millis(100);
                    }
                    Ok(None) => {
                        client.failed(i);
                        break;
                    }
                    Err(st) => {
                        client.failed(i);
                        tracing::warn!(endpoint = url, error = %client::describe(&st), "etcd lease keepalive broke; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

/// Fire `lost` when the leader key (created at `rev`) is deleted: resigned, its lease
/// revoked or expired.
async fn watch_leader_key(client: Arc<Client>, key: Vec<u8>, rev: i64, lost: CancellationToken) {
    let mut next = rev + 1;
    let mut pause = Duration::from_millis(100);
    let end = {
        let mut e = key.clone();
        e.push(0);
        e
    };
    loop {
        let opened = tokio::select! {
            r = open(&client, key.clone(), end.clone(), next) => r,
            _ = lost.cancelled() => return,
        };
        if let Ok((_req, stream)) = opened {
            let mut reader = Reader::new(stream);
            loop {
                let got = tokio::select! {
                    r = reader.next() => r,
                    _ = lost.cancelled() => return,
                };
                match got {
                    Ok(Some(Received::Events(events))) => {
                        pause = Duration::from_millis(100);
                        for ev in events {
                            if ev.r#type
                                == drover_proto::etcd::mvccpb::event::EventType::Delete as i32
                            {
                                tracing::warn!(key = %String::from_utf8_lossy(&key), "the leader key is gone: leadership lost");
                                lost.cancel();
                                return;
                            }
                            if let Some(kv) = ev.kv {
                                next = next.max(kv.mod_revision + 1);
                            }
                        }
                    }
                    Ok(Some(Received::Compacted(_))) => {
                        // History is gone: look at the key itself.
                        match still_held(&client, &key, rev).await {
                            Ok((true, at)) => {
                                next = at + 1;
                                break;
                            }
                            Ok((false, _)) => {
                                lost.cancel();
                                return;
                            }
                            Err(_) => break,
                        }
                    }
                    Ok(Some(Received::Cancelled(_))) | Ok(None) | Err(_) => break,
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = lost.cancelled() => return,
        }
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// Whether the leader key still exists with create revision `rev`, and the revision
/// it was read at.
async fn still_held(client: &Client, key: &[u8], rev: i64) -> Result<(bool, i64), StoreError> {
    let req = pb::RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    };
    let resp = client
        .unary("leader key", Retry::Idempotent, |ch| {
            let r = req.clone();
            async move { kv(ch).range(r).await }
        })
        .await?;
    let at = super::keys::header_revision(resp.header.as_ref());
    Ok((
        resp.kvs.first().is_some_and(|kv| kv.create_revision == rev),
        at,
    ))
}
