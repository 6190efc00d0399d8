//! The servers' registry on etcd: `<prefix>servers/<name>`, one key a server, bound to
//! its election lease (so that a server that stops renewing leaves it), claimed in one
//! transaction so that two live servers never hold one name.

use std::time::Duration;

use drover_proto::etcd::etcdserverpb as pb;

use super::super::client::{self, Retry, kv};
use super::super::keys::{first_range_kv, range_op};
use super::super::watch::MAX_BACKOFF;
use super::{EtcdElection, Lease, lease_not_found};
use crate::store::StoreError;
use crate::store::election::{NameClaim, ServerInfo};

impl EtcdElection {
    fn server_key(&self, name: &str) -> Vec<u8> {
        format!("{}servers/{name}", self.prefix).into_bytes()
    }

    /// Hold `servers/<name>` under `lease`, in one etcd transaction: created if absent,
    /// taken over if it is this server's own registration from before a restart
    /// ([`ServerInfo::same_server`]), else left to the live server that holds it.
    async fn claim_on(
        &self,
        me: &ServerInfo,
        value: &[u8],
        lease: &Lease,
    ) -> Result<NameClaim, StoreError> {
        use pb::compare::{CompareResult, CompareTarget, TargetUnion};
        let key = self.server_key(&me.name);
        let put = pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                key: key.clone(),
                value: value.to_vec(),
                lease: lease.id,
            })),
        };
        let txn = |compare: pb::Compare, failure: Vec<pb::RequestOp>| pb::TxnRequest {
            compare: vec![compare],
            success: vec![put.clone()],
            failure,
        };
        // The holder can go or change between the two steps: a few rounds at most.
        for _ in 0..4 {
            // Idempotent: a repeat after a lost answer finds its own registration,
            // which is this server's, and takes it over.
            let create = txn(
                pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: key.clone(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                },
                vec![range_op(key.clone())],
            );
            let resp = self
                .client
                .unary("claim server name", Retry::Idempotent, |ch| {
                    let r = create.clone();
                    async move { kv(ch).txn(r).await }
                })
                .await?;
            if resp.succeeded {
                return Ok(NameClaim::Claimed);
            }
            let Some(held) = first_range_kv(&resp.responses) else {
                continue; // gone in between: create it again
            };
            let holder: ServerInfo = serde_json::from_slice(&held.value).map_err(|e| {
                StoreError::Corrupt(format!(
                    "etcd server registration {:?}: {e}",
                    String::from_utf8_lossy(&held.key)
                ))
            })?;
            if !holder.same_server(me) {
                return Ok(NameClaim::HeldBy(holder));
            }
            let take_over = txn(
                pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: key.clone(),
                    target_union: Some(TargetUnion::ModRevision(held.mod_revision)),
                },
                Vec::new(),
            );
            let resp = self
                .client
                .unary("take over server name", Retry::Idempotent, |ch| {
                    let r = take_over.clone();
                    async move { kv(ch).txn(r).await }
                })
                .await?;
            if resp.succeeded {
                return Ok(NameClaim::Claimed);
            }
        }
        Err(StoreError::Backend(format!(
            "the registration of server name {:?} kept changing while this server claimed it",
            me.name
        )))
    }

    pub(super) async fn do_claim(&self, me: ServerInfo) -> Result<NameClaim, StoreError> {
        let value = serde_json::to_vec(&me)
            .map_err(|e| StoreError::Backend(format!("encode server info: {e}")))?;
        let lease = self.lease().await?;
        self.claim_on(&me, &value, &lease).await
    }

    pub(super) async fn do_register(&self, me: ServerInfo) -> Result<(), StoreError> {
        let value = serde_json::to_vec(&me)
            .map_err(|e| StoreError::Backend(format!("encode server info: {e}")))?;
        let mut pause = Duration::from_millis(100);
        loop {
            let claim = async {
                let lease = self.lease().await?;
                let claim = self.claim_on(&me, &value, &lease).await?;
                Ok::<_, StoreError>((lease, claim))
            };
            match claim.await {
                Err(e) if self.closed.is_cancelled() => {
                    tracing::debug!(error = %e, "registration ends: the election is closed");
                    return Ok(());
                }
                Ok((lease, NameClaim::Claimed)) => {
                    pause = Duration::from_millis(100);
                    // Registered until the lease goes; then again on a new one.
                    tokio::select! {
                        _ = lease.lost.cancelled() => {}
                        _ = self.closed.cancelled() => return Ok(()),
                    }
                }
                Ok((_, NameClaim::HeldBy(other))) => {
                    // This server lost its registration (its lease lapsed) and another
                    // server took the name meanwhile: two servers answer to one name.
                    tracing::error!(
                        server = %me.name,
                        other_rpc = %other.rpc_addr,
                        other_http = %other.http_addr,
                        "another live server registered this server's name while this \
                         one's registration had lapsed; give each server its own --name"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        _ = self.closed.cancelled() => return Ok(()),
                    }
                    pause = (pause * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    if let Some(l) = self.lease.lock().await.as_ref()
                        && lease_not_found(&e.to_string())
                    {
                        l.lost.cancel();
                    }
                    tracing::warn!(error = %e, server = %me.name, "etcd registration failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    pub(super) async fn do_members(&self) -> Result<Vec<ServerInfo>, StoreError> {
        let key = format!("{}servers/", self.prefix).into_bytes();
        let req = pb::RangeRequest {
            range_end: client::prefix_end(&key),
            key,
            // Servers of one cluster: a few; bound the answer anyway.
            limit: 10_000,
            ..Default::default()
        };
        let resp = self
            .client
            .unary("members", Retry::Idempotent, |ch| {
                let r = req.clone();
                async move { kv(ch).range(r).await }
            })
            .await?;
        let mut out = Vec::new();
        for kv in resp.kvs {
            match serde_json::from_slice::<ServerInfo>(&kv.value) {
                Ok(s) => out.push(s),
                Err(e) => tracing::warn!(
                    key = %String::from_utf8_lossy(&kv.key),
                    error = %e,
                    "skipping a server registration that does not decode"
                ),
            }
        }
        Ok(out)
    }
}
