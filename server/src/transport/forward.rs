//! Forwarding writes from a follower to the leader.
//!
//! - HTTP writes (every method but `GET`/`HEAD`) go to the leader's `Api.Forward` RPC
//!   with this server's own token, marked with [`FORWARDED_HEADER`]; the answer
//!   (status, headers, body) comes back as the leader gave it.
//! - Node RPCs that write (`Register`, `Heartbeat`, `UpdateAllocations`) go to the
//!   leader's `Node` service; the node's secret passes through unchanged and the
//!   leader checks it. `WatchAllocations` is served by every server from its own state.
//! - Who leads: [`Election::leader`](crate::Election::leader), cached, asked again when a forward fails. While
//!   there is none (an election in progress), a request waits up to the lease TTL plus
//!   5 s for one, then fails with 503 / `UNAVAILABLE` saying so.
//! - No loops: a forwarded request that reaches a server that does not lead is not
//!   forwarded again; it answers 503 marked with [`NOT_LEADER_HEADER`] (or
//!   `UNAVAILABLE`), and the forwarding server looks for the leader again and retries
//!   within the same deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::RPC_TOKEN_KEY;
use pb::api_client::ApiClient;
use pb::node_client::NodeClient;
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::config::ServerConfig;
use crate::core::Core;
use crate::error::ServerError;
use crate::leader::ServerInfo;
use crate::leader::leadership::Leadership;
use crate::store::BoxFuture;

/// Marks a request (HTTP header, RPC metadata) forwarded by a follower; its value is
/// the follower's name. A server that does not lead answers such a request with 503
/// instead of forwarding it again.
pub const FORWARDED_HEADER: &str = "x-drover-forwarded-by";

/// A forwarded write as the router sees it: the gRPC metadata mark
/// ([`FORWARDED_HEADER`]) of the `Api.Forward` call, carried into the inner HTTP
/// request as an extension. An extension, not a header: a header could be sent (or
/// dropped) by any client, and the mark must come from the forwarding call itself, or
/// a follower would forward a forwarded write again (to itself, in a loop, when a
/// stale leader address points back at it).
#[derive(Clone, Debug)]
pub struct ForwardedBy(pub String);
/// Marks a 503 answer that means "this server is not the leader": the forwarding
/// server looks for the leader again and retries.
pub const NOT_LEADER_HEADER: &str = "x-drover-not-leader";

/// How long connecting to the leader may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a forwarded write may take (its head: the leader's answer begins).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);
/// Bounds of a forwarded node RPC's timeout (half the heartbeat TTL).
const NODE_TIMEOUT_MIN: Duration = Duration::from_millis(500);
const NODE_TIMEOUT_MAX: Duration = Duration::from_secs(10);
/// How long a forwarded write's answer waits for this server to apply its commit.
pub(crate) const APPLY_WAIT: Duration = Duration::from_secs(5);
/// How often the leader is asked for while there is none.
const LEADER_POLL: Duration = Duration::from_millis(250);
/// How long a leader lookup's answer serves every request that asks.
const LEADER_SHARE: Duration = Duration::from_millis(200);
/// Beyond the lease TTL, how long a request waits for a leader to be elected.
const ELECTION_GRACE: Duration = Duration::from_secs(5);
/// Largest message either way (as the RPC listener's).
const MAX_MESSAGE_BYTES: usize = super::MAX_MESSAGE_BYTES;

/// Where a request goes.
pub enum Forwarded<T> {
    /// This server leads (now): handle it here.
    Local,
    /// The leader's answer (or why there was none).
    Remote(T),
}

/// Connections to the leader, and who it is.
pub(crate) struct Forwarder {
    /// Whether this server leads, the election to ask who does, and the leader as
    /// last seen.
    leadership: Arc<Leadership>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    tls: Option<ClientTlsConfig>,
    /// Lazily connecting channels per server address and [`Lane`] (bounded by the
    /// servers there are; dropped when a call through it fails).
    channels: Mutex<HashMap<(Lane, String), Channel>>,
    /// How long a forwarded node RPC may take: well under the heartbeat TTL, so a
    /// slow leader fails a heartbeat in time for the node to try another server.
    node_timeout: Duration,
    /// The last leader lookup and when it was answered (see [`Forwarder::ask_leader`]).
    lookup: tokio::sync::Mutex<Option<(Instant, LeaderAnswer)>>,
}

/// What the store said about who leads (the error as text: shared by the waiters).
type LeaderAnswer = Result<Option<ServerInfo>, String>;

/// Which connection to the leader a call takes. Node RPCs (heartbeats above all)
/// and forwarded HTTP writes have a connection each: each HTTP/2 connection has its
/// own stream limit, so slow writes filling one cannot starve heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    Node,
    Http,
}

fn read_pem(what: &str, path: &std::path::Path) -> Result<Vec<u8>, ServerError> {
    std::fs::read(path)
        .map_err(|e| ServerError::Invalid(format!("cannot read {what} {}: {e}", path.display())))
}

impl Forwarder {
    pub(crate) fn new(
        config: &ServerConfig,
        leadership: Arc<Leadership>,
    ) -> Result<Forwarder, ServerError> {
        let token = match &config.forward.token {
            None => None,
            Some(t) => Some(t.parse().map_err(|_| {
                ServerError::Invalid("the token holds characters metadata cannot carry".into())
            })?),
        };
        let tls = match &config.forward.tls {
            None => None,
            Some(t) => {
                let ca = read_pem("the servers' CA file", &t.ca_file)?;
                let mut c = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some((cert, key)) = &t.identity {
                    c = c.identity(Identity::from_pem(
                        read_pem("the TLS certificate", cert)?,
                        read_pem("the TLS key", key)?,
                    ));
                }
                Some(c)
            }
        };
        Ok(Forwarder {
            leadership,
            token,
            tls,
            channels: Mutex::new(HashMap::new()),
            lookup: tokio::sync::Mutex::new(None),
            node_timeout: (config.heartbeat_ttl / 2).clamp(NODE_TIMEOUT_MIN, NODE_TIMEOUT_MAX),
        })
    }

    /// The leader as last seen.
    pub(crate) fn cached_leader(&self) -> Option<ServerInfo> {
        self.leadership.known_leader()
    }

    pub(crate) fn set_leader(&self, leader: Option<ServerInfo>) {
        self.leadership.set_known_leader(leader);
    }

    /// Who leads, as the store says: one lookup at a time for every request that
    /// waits for a leader. A caller that waited while another asked takes that
    /// answer (it was asked after this caller began waiting) instead of asking again,
    /// and so does one that comes within [`LEADER_SHARE`] of the last answer: however
    /// many requests wait, the store is asked a few times per second at most.
    async fn ask_leader(&self) -> LeaderAnswer {
        let asked = Instant::now();
        let mut last = self.lookup.lock().await;
        if let Some((at, answer)) = &*last
            && (*at >= asked || at.elapsed() < LEADER_SHARE)
        {
            return answer.clone();
        }
        let answer = self
            .leadership
            .election
            .leader()
            .await
            .map_err(|e| e.to_string());
        *last = Some((Instant::now(), answer.clone()));
        answer
    }

    /// Whether `l` is this server: its name, or its RPC address (a leader announcing
    /// this server's address would have every forward come back here).
    fn is_me(&self, l: &ServerInfo) -> bool {
        l.name == self.leadership.me.name || l.rpc_addr == self.leadership.me.rpc_addr
    }

    /// Until when a request waits for a leader.
    fn deadline(&self) -> Instant {
        Instant::now() + self.leadership.election.lease_ttl() + ELECTION_GRACE
    }

    /// The leader to send a write to; `None` when this server leads. Waits for an
    /// election until `deadline`. `refresh`: ask the store, not the cache.
    pub(crate) async fn target(
        &self,
        core: &Core,
        mut refresh: bool,
        deadline: Instant,
    ) -> Result<Option<ServerInfo>, ServerError> {
        loop {
            if self.leadership.is_leader() {
                return Ok(None);
            }
            if !refresh && let Some(l) = self.cached_leader().filter(|l| !self.is_me(l)) {
                return Ok(Some(l));
            }
            let said = match self.ask_leader().await {
                Ok(Some(l)) if !self.is_me(&l) => {
                    self.set_leader(Some(l.clone()));
                    return Ok(Some(l));
                }
                // A leader announcing this server's own RPC address: forwarding there
                // would come back here. Wait for a leader that is somewhere else.
                Ok(Some(l)) if l.name != self.leadership.me.name => {
                    tracing::warn!(
                        leader = %l.name,
                        rpc_addr = %l.rpc_addr,
                        "the leader announces this server's own RPC address; not forwarding there"
                    );
                    format!(
                        "the leader {} announces this server's own RPC address {}",
                        l.name, l.rpc_addr
                    )
                }
                // This server, while it does not lead: its term is starting or ending.
                Ok(Some(_)) => "this server's own term is starting or ending".to_owned(),
                Ok(None) => "no leader (an election is in progress)".to_owned(),
                Err(e) => e,
            };
            refresh = true;
            if Instant::now() >= deadline {
                return Err(ServerError::Unavailable(format!(
                    "no leader elected yet; the store says: {said}"
                )));
            }
            tokio::select! {
                () = tokio::time::sleep(LEADER_POLL) => {}
                () = core.shutdown.cancelled() => {
                    return Err(ServerError::Unavailable("the server is shutting down".into()));
                }
            }
        }
    }

    fn channel(&self, to: &ServerInfo, lane: Lane) -> Result<Channel, ServerError> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let key = (lane, to.rpc_addr.clone());
        if let Some(c) = channels.get(&key) {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let bad = |e: &dyn std::fmt::Display| {
            ServerError::Unavailable(format!(
                "the leader {} announced the RPC address {:?}: {e}",
                to.name, to.rpc_addr
            ))
        };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{}", to.rpc_addr))
            .map_err(|e| bad(&e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10));
        if let Some(tls) = &self.tls {
            ep = ep.tls_config(tls.clone()).map_err(|e| bad(&e))?;
        }
        let channel = ep.connect_lazy();
        channels.insert(key, channel.clone());
        Ok(channel)
    }

    /// A call through `to` failed: connect again next time, and ask who leads.
    fn forget(&self, to: &ServerInfo) {
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(_, addr), _| *addr != to.rpc_addr);
        self.leadership.forget_known_leader(&to.name);
    }

    /// `msg` as a call to the leader: this server's token, the forwarded mark.
    pub(crate) fn outgoing<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            req.metadata_mut().insert(RPC_TOKEN_KEY, t.clone());
        }
        if let Ok(v) = self.leadership.me.name.parse() {
            req.metadata_mut().insert(FORWARDED_HEADER, v);
        }
        req.set_timeout(FORWARD_TIMEOUT);
        req
    }

    /// [`Forwarder::outgoing`] for a node RPC: its timeout is the node lane's.
    pub(crate) fn outgoing_node<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = self.outgoing(msg);
        req.set_timeout(self.node_timeout);
        req
    }

    /// A node RPC to the leader: `call` makes it on a client of the leader's `Node`
    /// service (build its request with [`Forwarder::outgoing`]). Retried against the
    /// leader found anew while the leader is unreachable or not the leader any more,
    /// within the election deadline.
    pub(crate) async fn node_call<R>(
        &self,
        core: &Core,
        call: impl Fn(NodeClient<Channel>) -> BoxFuture<'static, Result<R, Status>>,
    ) -> Forwarded<Result<R, Status>> {
        let deadline = self.deadline();
        let mut refresh = false;
        loop {
            let to = match self.target(core, refresh, deadline).await {
                Ok(Some(to)) => to,
                Ok(None) => return Forwarded::Local,
                Err(e) => return Forwarded::Remote(Err(crate::transport::rpc::status_from(e))),
            };
            let channel = match self.channel(&to, Lane::Node) {
                Ok(c) => c,
                Err(e) => return Forwarded::Remote(Err(crate::transport::rpc::status_from(e))),
            };
            let client = NodeClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            match call(client).await {
                Err(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {
                    tracing::debug!(leader = %to.name, "forwarding a node call failed: {}; retrying", s.message());
                    self.forget(&to);
                    refresh = true;
                    tokio::time::sleep(LEADER_POLL).await;
                }
                r => return Forwarded::Remote(r),
            }
        }
    }

    /// An HTTP request to the leader, through its `Api.Forward`.
    pub(crate) async fn http(
        &self,
        core: &Core,
        request: pb::ForwardRequest,
    ) -> Forwarded<axum::response::Response> {
        let deadline = self.deadline();
        let mut refresh = false;
        loop {
            let to = match self.target(core, refresh, deadline).await {
                Ok(Some(to)) => to,
                Ok(None) => return Forwarded::Local,
                Err(e) => return Forwarded::Remote(error_response(503, &e.to_string(), false)),
            };
            let channel = match self.channel(&to, Lane::Http) {
                Ok(c) => c,
                Err(e) => return Forwarded::Remote(error_response(503, &e.to_string(), false)),
            };
            let mut client = ApiClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            let call = async {
                let mut stream = client
                    .forward(self.outgoing(request.clone()))
                    .await?
                    .into_inner();
                let head = stream.message().await?.ok_or_else(|| {
                    Status::unavailable("the leader ended the forwarded call without an answer")
                })?;
                Ok::<_, Status>((head, stream))
            };
            let failure = match tokio::time::timeout(FORWARD_TIMEOUT, call).await {
                Ok(Ok((head, stream))) => {
                    let not_leader =
                        head.status == 503 && head.headers.contains_key(NOT_LEADER_HEADER);
                    if !not_leader || Instant::now() >= deadline {
                        // Read your writes: answer once this server's state has the
                        // commit (the client's next read may come here).
                        if let Some(index) = head
                            .headers
                            .get(crate::transport::http::INDEX_HEADER)
                            .and_then(|v| v.parse().ok())
                        {
                            core.wait_applied(index, APPLY_WAIT).await;
                        }
                        return Forwarded::Remote(response(head, stream));
                    }
                    format!("{} does not lead any more", to.name)
                }
                Ok(Err(s)) if s.code() == Code::Unavailable => s.message().to_owned(),
                Ok(Err(s)) => {
                    let hint = if s.code() == Code::Unauthenticated {
                        " (the servers must share one token)"
                    } else {
                        ""
                    };
                    return Forwarded::Remote(error_response(
                        502,
                        &format!(
                            "forwarding to the leader {} ({}) failed: {}{hint}",
                            to.name,
                            to.rpc_addr,
                            s.message()
                        ),
                        false,
                    ));
                }
                Err(_) => {
                    return Forwarded::Remote(error_response(
                        504,
                        &format!(
                            "the leader {} ({}) did not answer within {}s",
                            to.name,
                            to.rpc_addr,
                            FORWARD_TIMEOUT.as_secs()
                        ),
                        false,
                    ));
                }
            };
            self.forget(&to);
            if Instant::now() >= deadline {
                return Forwarded::Remote(error_response(
                    503,
                    &format!(
                        "cannot reach the leader {} ({}): {failure}",
                        to.name, to.rpc_addr
                    ),
                    false,
                ));
            }
            tracing::debug!(leader = %to.name, "forwarding failed: {failure}; looking for the leader again");
            refresh = true;
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// The leader's term id, asked of the leader (`GET /v1/status/term`); `None`
    /// when it cannot be reached quickly.
    pub(crate) async fn leader_term(&self, to: &ServerInfo) -> Option<u64> {
        let channel = self.channel(to, Lane::Http).ok()?;
        let mut client = ApiClient::new(channel);
        let req = pb::ForwardRequest {
            method: "GET".into(),
            path_and_query: "/v1/status/term".into(),
            headers: HashMap::new(),
            body: Vec::new(),
        };
        let call = async {
            let mut stream = client.forward(self.outgoing(req)).await.ok()?.into_inner();
            let mut body = Vec::new();
            let head = stream.message().await.ok()??;
            if head.status != 200 {
                return None;
            }
            while let Some(m) = stream.message().await.ok()? {
                body.extend_from_slice(&m.body);
                if body.len() > 64 * 1024 {
                    return None;
                }
            }
            let v: drover_server_api::LeaderStatus = serde_json::from_slice(&body).ok()?;
            (v.name == to.name).then_some(v.term)
        };
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .ok()
            .flatten()
    }
}

/// The leader's answer as an HTTP response: its status and headers, then its body as
/// it streams in.
fn response(
    head: pb::ForwardResponse,
    stream: tonic::Streaming<pb::ForwardResponse>,
) -> axum::response::Response {
    let status = u16::try_from(head.status)
        .ok()
        .and_then(|s| http::StatusCode::from_u16(s).ok())
        .unwrap_or(http::StatusCode::BAD_GATEWAY);
    let first = (!head.body.is_empty()).then(|| Bytes::from(head.body));
    let rest = futures_util::stream::unfold(stream, |mut s| async move {
        match s.message().await {
            Ok(Some(m)) => Some((Ok::<_, Status>(Bytes::from(m.body)), s)),
            Ok(None) => None,
            Err(e) => Some((Err(e), s)),
        }
    });
    let body = futures_util::StreamExt::chain(
        futures_util::stream::iter(first.map(Ok::<_, Status>)),
        rest,
    );
    let mut resp = axum::response::Response::new(axum::body::Body::from_stream(body));
    *resp.status_mut() = status;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "content-length" | "transfer-encoding" | "connection" | "keep-alive"
        ) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(lower.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            resp.headers_mut().append(n, v);
        }
    }
    resp
}

/// `message` as plain text with `status` (Nomad answers errors as text); `not_leader`
/// adds [`NOT_LEADER_HEADER`].
pub(crate) fn error_response(
    status: u16,
    message: &str,
    not_leader: bool,
) -> axum::response::Response {
    let status = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let mut resp = axum::response::IntoResponse::into_response((
        status,
        [(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message.to_owned(),
    ));
    if not_leader {
        resp.headers_mut()
            .insert(NOT_LEADER_HEADER, http::HeaderValue::from_static("1"));
    }
    resp
}
