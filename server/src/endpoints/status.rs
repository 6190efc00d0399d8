//! The cluster's status: who leads, in which term, the servers, the store.

use crate::error::ServerError;
use crate::server::Server;

/// How long a `/v1/status/servers` answer is reused.
const STATUS_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

impl Server {
    /// This server's term, when it leads (`GET /v1/status/term`, Drover's own).
    pub fn leader_status(&self) -> Result<drover_server_api::LeaderStatus, ServerError> {
        match self.leadership.term() {
            Some(t) => Ok(drover_server_api::LeaderStatus {
                name: self.leadership.me.name.clone(),
                term: t.id(),
            }),
            None => Err(self.leadership.not_leader()),
        }
    }

    /// The cluster's servers, its leader and its store (`GET /v1/status/servers`).
    /// What the store cannot tell (it is unreachable) is left out: no leader, no
    /// servers, and the endpoints' health says why.
    pub async fn servers_status(&self) -> drover_server_api::ServersStatus {
        let mut cache = self.status_cache.lock().await;
        if let Some((at, status)) = &*cache
            && at.elapsed() < STATUS_CACHE
        {
            let mut status = status.clone();
            // The endpoints' health is always asked anew: an etcd that just went
            // down must show as down.
            status.store.endpoints = self.store_health().await;
            return status;
        }
        let status = self.servers_status_now().await;
        *cache = Some((std::time::Instant::now(), status.clone()));
        status
    }

    async fn store_health(&self) -> Vec<drover_server_api::StoreEndpointHealth> {
        self.core.store.health().await
    }

    async fn servers_status_now(&self) -> drover_server_api::ServersStatus {
        let core = &self.core;
        let leadership = &self.leadership;
        let leader = match self.leader_status() {
            Ok(me) => Some(me),
            Err(_) => match leadership.election.leader().await {
                Ok(Some(l)) => {
                    let term = if l.name == leadership.me.name {
                        0
                    } else {
                        self.forwarder.leader_term(&l).await.unwrap_or(0)
                    };
                    Some(drover_server_api::LeaderStatus { name: l.name, term })
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!("server status: the store does not say who leads: {e}");
                    None
                }
            },
        };
        let members = leadership.election.members().await.unwrap_or_else(|e| {
            tracing::debug!("server status: cannot list the servers: {e}");
            Vec::new()
        });
        let mut servers: Vec<drover_server_api::ServerMember> = members
            .into_iter()
            .map(|m| drover_server_api::ServerMember {
                leader: leader.as_ref().is_some_and(|l| l.name == m.name),
                name: m.name,
                rpc_addr: m.rpc_addr,
                http_addr: m.http_addr,
                version: m.version,
                started: m.started,
            })
            .collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        let endpoints = self.store_health().await;
        drover_server_api::ServersStatus {
            this: leadership.me.name.clone(),
            leader,
            servers,
            store: drover_server_api::StoreStatus {
                kind: core.store.kind().to_owned(),
                endpoints,
            },
        }
    }
}
