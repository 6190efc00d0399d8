//! `/v1/agent/{self,members,health}`, `/v1/status/{leader,peers,servers}`,
//! `/v1/regions`: who this server is, as Nomad's clients ask it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse as _;
use serde_json::json;

use super::{Api, ApiResult, Params, answer};
use crate::leader::ServerInfo;

/// The Nomad version whose API this one is (what Nomad's clients compare against);
/// Drover's own version travels beside it.
pub(super) const NOMAD_API_VERSION: &str = "1.0.18";

/// `host:port` split; the port 0 when there is none.
fn host_port(addr: &str) -> (String, u16) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_owned(),
            p.parse().unwrap_or(0),
        ),
        None => (addr.to_owned(), 0),
    }
}

/// A server as a member of Nomad's gossip pool (Drover has none: the servers the
/// store knows, each "alive" while registered).
fn member(api: &Api, s: &ServerInfo) -> serde_json::Value {
    let region = api.server.region();
    let (addr, rpc_port) = host_port(&s.rpc_addr);
    json!({
        "Name": format!("{}.{region}", s.name),
        "Addr": addr,
        "Port": rpc_port,
        "Tags": {
            "role": "nomad",
            "region": region,
            "dc": api.server.datacenter(),
            "build": NOMAD_API_VERSION,
            "port": rpc_port.to_string(),
            "rpc_addr": addr,
            "id": s.name,
            "vsn": "1",
            "mvn": "1",
            "drover_version": s.version,
        },
        "Status": "alive",
        "ProtocolMin": 1,
        "ProtocolMax": 5,
        "ProtocolCur": 2,
        "DelegateMin": 2,
        "DelegateMax": 5,
        "DelegateCur": 4,
    })
}

pub(super) async fn agent_self(State(api): State<Api>, _q: Params) -> ApiResult {
    let me = api.server.info().clone();
    let leader = api.server.known_leader();
    let (_, http_port) = host_port(&me.http_addr);
    let (rpc_host, rpc_port) = host_port(&me.rpc_addr);
    let config = json!({
        "Region": api.server.region(),
        "Datacenter": api.server.datacenter(),
        "NodeName": me.name,
        "Version": {
            "Version": NOMAD_API_VERSION,
            "VersionPrerelease": "",
            "VersionMetadata": "",
            "Revision": "",
        },
        "Drover": { "Version": me.version },
        "Ports": { "HTTP": http_port, "RPC": rpc_port, "Serf": 0 },
        "Addresses": { "HTTP": host_port(&me.http_addr).0, "RPC": rpc_host, "Serf": "" },
        "AdvertiseAddrs": { "HTTP": me.http_addr, "RPC": me.rpc_addr, "Serf": "" },
        "ACL": { "Enabled": api.token_required },
        "Server": { "Enabled": true },
        "Client": { "Enabled": false },
        "TLSConfig": { "EnableHTTP": me.tls, "EnableRPC": me.tls },
        "DevMode": false,
    });
    let stats = json!({
        "nomad": {
            "server": "true",
            "leader": api.server.is_leader().to_string(),
            "leader_addr": leader.as_ref().map_or(String::new(), |l| l.rpc_addr.clone()),
            "bootstrap": "false",
            "known_regions": "1",
        },
        "drover": {
            "index": api.server.index().to_string(),
            "store": api.server.store_kind(),
        },
    });
    answer(
        api.server.index(),
        json!({ "config": config, "member": member(&api, &me), "stats": stats }),
    )
}

pub(super) async fn members(State(api): State<Api>, _q: Params) -> ApiResult {
    let me = api.server.info().clone();
    let mut servers = api.server.members().await;
    if servers.is_empty() {
        servers.push(me.clone());
    }
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    let members: Vec<_> = servers.iter().map(|s| member(&api, s)).collect();
    answer(
        api.server.index(),
        json!({
            "ServerName": me.name,
            "ServerRegion": api.server.region(),
            "ServerDC": api.server.datacenter(),
            "Members": members,
        }),
    )
}

/// `{"server": {"ok": true, "message": "ok"}}`; 500 while no leader is known (Nomad
/// answers an unhealthy agent with 500).
pub(super) async fn health(State(api): State<Api>, _q: Params) -> ApiResult {
    let ok =
        api.server.known_leader().is_some() || api.server.leader().await.ok().flatten().is_some();
    let body = json!({
        "server": {
            "ok": ok,
            "message": if ok { "ok" } else { "no known cluster leader" },
        }
    });
    if ok {
        answer(api.server.index(), body)
    } else {
        Ok((StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response())
    }
}

/// The leader's RPC address as a JSON string; `""` while none is elected (Nomad's).
pub(super) async fn leader(State(api): State<Api>, _q: Params) -> ApiResult {
    let leader = api.server.leader().await?;
    answer(
        api.server.index(),
        leader.map_or(String::new(), |l| l.rpc_addr),
    )
}

/// The servers' RPC addresses.
pub(super) async fn peers(State(api): State<Api>, _q: Params) -> ApiResult {
    let mut servers = api.server.members().await;
    if servers.is_empty() {
        servers.push(api.server.info().clone());
    }
    let mut peers: Vec<String> = servers.into_iter().map(|s| s.rpc_addr).collect();
    peers.sort();
    answer(api.server.index(), peers)
}

pub(super) async fn regions(State(api): State<Api>, _q: Params) -> ApiResult {
    answer(api.server.index(), [api.server.region()])
}

/// Drover's own: this server's name and term when it leads (another server's
/// `servers_status` asks the leader this; Nomad's `/v1/status/leader` is an address).
pub(super) async fn leader_term(State(api): State<Api>) -> ApiResult {
    let index = api.server.index();
    answer(index, api.server.leader_status()?)
}

/// Drover's own: the servers, the leader and its term, the store (`drover server
/// status`).
pub(super) async fn servers_status(State(api): State<Api>) -> ApiResult {
    let index = api.server.index();
    answer(index, api.server.servers_status().await)
}
