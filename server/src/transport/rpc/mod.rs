//! The node RPCs (`drover.cluster.v1.Node`) and the forwarded HTTP API
//! (`drover.cluster.v1.Api`) on one TCP listener (TLS when configured).
//!
//! Objects travel as JSON documents of the `drover-server-api` types; a document that
//! does not decode is INVALID_ARGUMENT naming the field (and element) that failed.
//! With a token, every call must carry it in the `x-drover-token` metadata entry;
//! anything else is UNAUTHENTICATED before any handler runs. With a node-introduction
//! token as well, node RPCs may carry that one instead (`RpcOptions::node_token`).

mod conn;
mod csi;

use std::sync::Arc;
use std::time::Duration;

use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::{AllocClientUpdate, NodeRegistration};
use http_body_util::BodyExt as _;
use pb::api_server::{Api, ApiServer};
use pb::node_server::{Node, NodeServer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tower::ServiceExt as _;

pub use self::conn::{
    ConnInfo, FIRST_CALL_DEADLINE, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_IP, connection_cap,
};
use self::conn::{first_call_made, incoming};
use crate::error::ServerError;
use crate::server::Server;
use crate::transport::auth::{RPC_TOKEN_KEY, token_eq};
use crate::transport::forward::{FORWARDED_HEADER, Forwarded, ForwardedBy};
use crate::transport::http::TOKEN_HEADER;

/// How the RPC listener authenticates, encrypts and bounds its connections.
#[derive(Clone)]
pub struct RpcOptions {
    /// The cluster token (`x-drover-token`), when set: the servers' own credential.
    /// Every call must carry it, unless `node_token` is set: then a node RPC may carry
    /// that instead, and only the servers' `Api.Forward` still needs this one.
    pub token: Option<String>,
    /// The node-introduction token, when set: what client agents carry instead of the
    /// cluster token. It opens the `Node` service only (register, heartbeat, watch
    /// and update the node's own allocations, each call also proving the node's
    /// secret), never `Api.Forward` nor the HTTP API, so a node holds no credential a
    /// user or a server holds.
    pub node_token: Option<String>,
    /// TLS (rustls), when set.
    pub tls: Option<crate::transport::tls::TlsFiles>,
    /// A connection must complete its first call that passes the token check within
    /// this time of being accepted (TLS handshake and HTTP/2 preface included), or it
    /// is closed: a peer cannot hold a connection slot by sending nothing, or half a
    /// preface. After that call, HTTP/2 keepalive decides when a silent peer is gone.
    pub first_call_deadline: Duration,
    /// Connections one peer IP address may have open at once ([`MAX_CONNECTIONS_PER_IP`]).
    pub max_connections_per_ip: usize,
}

impl Default for RpcOptions {
    fn default() -> Self {
        RpcOptions {
            token: None,
            node_token: None,
            tls: None,
            first_call_deadline: FIRST_CALL_DEADLINE,
            max_connections_per_ip: MAX_CONNECTIONS_PER_IP,
        }
    }
}

impl std::fmt::Debug for RpcOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "node_token",
                &self.node_token.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.tls)
            .field("first_call_deadline", &self.first_call_deadline)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .finish()
    }
}

/// Streams (calls) one connection may have open at once. A client agent has at most
/// a few (watch, heartbeat, status, forwarded requests).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Status reports in one `UpdateAllocations` call (the client sends at most 500).
pub const MAX_UPDATE_BATCH: usize = 2_000;
pub use super::MAX_MESSAGE_BYTES;
/// A forwarded response body travels in pieces of at most this size.
pub const FORWARD_CHUNK_BYTES: usize = 64 << 10;
/// How long one `allocations_for_client` wait lasts before the watch asks again
/// (it also notices a gone client or a shutdown within this time at worst).
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// Messages queued per watch or forward stream before the sender waits for the client.
const STREAM_BUFFER: usize = 4;

/// A server error as a gRPC status.
pub fn status_from(e: ServerError) -> Status {
    match e {
        ServerError::Invalid(m) => Status::invalid_argument(m),
        ServerError::NotFound(m) => Status::not_found(m),
        ServerError::Conflict(m) => Status::aborted(m),
        ServerError::Denied(m) => Status::permission_denied(m),
        e @ ServerError::Store(_) => Status::unavailable(e.to_string()),
        ServerError::Unavailable(m) => Status::unavailable(m),
        e @ (ServerError::NotLeader { .. } | ServerError::LeadershipLost(_)) => {
            Status::unavailable(e.to_string())
        }
    }
}

/// `msg` with the metadata (token, forwarded mark, timeout) of `req`.
fn with<T>(req: Request<()>, msg: T) -> Request<T> {
    let (metadata, extensions, ()) = req.into_parts();
    Request::from_parts(metadata, extensions, msg)
}

/// The interceptor that refuses calls without one of the tokens it accepts (none
/// given: every call passes).
#[derive(Clone)]
struct TokenCheck(Vec<Arc<str>>);

impl TokenCheck {
    /// Accepting each of `tokens` that is set.
    fn new(tokens: &[&Option<Arc<str>>]) -> TokenCheck {
        TokenCheck(tokens.iter().filter_map(|t| (*t).clone()).collect())
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        if self.0.is_empty() {
            first_call_made(&req);
            return Ok(req);
        }
        match req.metadata().get(RPC_TOKEN_KEY) {
            None => Err(Status::unauthenticated(format!(
                "this server requires a token: send it in the {RPC_TOKEN_KEY} metadata entry"
            ))),
            Some(given) => {
                // Every accepted token is compared (no early exit): the answer's time
                // does not tell which one came close.
                let matched = self.0.iter().fold(false, |any, want| {
                    token_eq(given.as_bytes(), want.as_bytes()) | any
                });
                if matched {
                    first_call_made(&req);
                    Ok(req)
                } else {
                    Err(Status::unauthenticated("wrong token"))
                }
            }
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(field: &str, json: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::invalid_argument(format!("{field}: not a valid document: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    serde_json::to_vec(value).map_err(|e| Status::internal(format!("encoding a reply: {e}")))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

struct NodeRpc {
    server: Arc<Server>,
    shutdown: CancellationToken,
}

impl NodeRpc {
    /// A write on a follower goes to the leader (the node's secret passes through;
    /// the leader checks it): its answer, or `None` when this server leads and
    /// handles it. A call another server forwarded here is not forwarded again.
    async fn to_leader<M, R>(
        &self,
        forwarded: bool,
        msg: &M,
        call: impl Fn(
            pb::node_client::NodeClient<tonic::transport::Channel>,
            Request<M>,
        ) -> crate::store::BoxFuture<'static, Result<Response<R>, Status>>,
    ) -> Option<Result<Response<R>, Status>>
    where
        M: Clone,
    {
        if self.server.is_leader() {
            return None;
        }
        if forwarded {
            return Some(Err(Status::unavailable(format!(
                "{}another server forwarded this call here, but this server does not \
                 lead either; retry",
                crate::error::NOT_LEADER_PREFIX
            ))));
        }
        match self
            .server
            .forward_node(|client, req| call(client, with(req, msg.clone())))
            .await
        {
            Forwarded::Local => None,
            Forwarded::Remote(r) => Some(r),
        }
    }
}

fn is_forwarded<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED_HEADER)
}

#[tonic::async_trait]
impl Node for NodeRpc {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let msg = request.into_inner();
        if let Some(r) = self
            .to_leader(forwarded, &msg, |mut c, req| {
                Box::pin(async move { c.register(req).await })
            })
            .await
        {
            // The node's next call (its allocation watch) is served here, from this
            // server's state: answer once that state has the registration.
            if let Ok(resp) = &r {
                self.server
                    .wait_applied(resp.get_ref().index, crate::transport::forward::APPLY_WAIT)
                    .await;
            }
            return r;
        }
        let pb::RegisterRequest {
            node_json,
            node_secret,
        } = msg;
        let registration: NodeRegistration = decode("node_json", &node_json)?;
        if registration.id.is_empty() {
            return Err(Status::invalid_argument("node_json: id is empty"));
        }
        let node_id = registration.id.clone();
        let (ttl, index) = self
            .server
            .register_node(registration, &node_secret)
            .await
            .map_err(status_from)?;
        tracing::debug!(node = %node_id, index, "node registered");
        Ok(Response::new(pb::RegisterResponse {
            heartbeat_ttl_ms: ms(ttl),
            index,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let msg = request.into_inner();
        if let Some(r) = self
            .to_leader(forwarded, &msg, |mut c, req| {
                Box::pin(async move { c.heartbeat(req).await })
            })
            .await
        {
            return r;
        }
        let pb::HeartbeatRequest {
            node_id,
            node_secret,
        } = &msg;
        if node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is empty"));
        }
        self.server
            .authenticate_node(node_id, node_secret)
            .map_err(status_from)?;
        let (ttl, index) = self.server.heartbeat(node_id).await.map_err(status_from)?;
        Ok(Response::new(pb::HeartbeatResponse {
            heartbeat_ttl_ms: ms(ttl),
            index,
        }))
    }

    type WatchAllocationsStream = ReceiverStream<Result<pb::AllocationsUpdate, Status>>;

    async fn watch_allocations(
        &self,
        request: Request<pb::WatchAllocationsRequest>,
    ) -> Result<Response<Self::WatchAllocationsStream>, Status> {
        let pb::WatchAllocationsRequest {
            node_id,
            index,
            node_secret,
        } = request.into_inner();
        if node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is empty"));
        }
        // Once bound, a node's secret never changes: checking it when the stream
        // opens covers the whole stream.
        self.server
            .authenticate_node(&node_id, &node_secret)
            .map_err(status_from)?;
        // The first batch is fetched here so that an unknown node or a server that is
        // not serving fails the call itself, not a stream that already began.
        let first = self
            .server
            .allocations_for_client(&node_id, index, Duration::ZERO)
            .await
            .map_err(status_from)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(watch(
            self.server.clone(),
            node_id,
            first,
            index,
            tx,
            self.shutdown.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn update_allocations(
        &self,
        request: Request<pb::UpdateAllocationsRequest>,
    ) -> Result<Response<pb::UpdateAllocationsResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let msg = request.into_inner();
        if updates_too_many(&msg) {
            return Err(Status::invalid_argument(format!(
                "updates_json: {} updates in one call, at most {MAX_UPDATE_BATCH}",
                msg.updates_json.len()
            )));
        }
        if let Some(r) = self
            .to_leader(forwarded, &msg, |mut c, req| {
                Box::pin(async move { c.update_allocations(req).await })
            })
            .await
        {
            return r;
        }
        let pb::UpdateAllocationsRequest {
            node_id,
            updates_json,
            node_secret,
        } = msg;
        if node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is empty"));
        }
        if updates_json.len() > MAX_UPDATE_BATCH {
            return Err(Status::invalid_argument(format!(
                "updates_json: {} updates in one call, at most {MAX_UPDATE_BATCH}",
                updates_json.len()
            )));
        }
        let updates = updates_json
            .iter()
            .enumerate()
            .map(|(i, json)| decode::<AllocClientUpdate>(&format!("updates_json[{i}]"), json))
            .collect::<Result<Vec<_>, _>>()?;
        self.server
            .authenticate_node(&node_id, &node_secret)
            .map_err(status_from)?;
        let index = self
            .server
            .update_allocations(&node_id, updates)
            .await
            .map_err(status_from)?;
        Ok(Response::new(pb::UpdateAllocationsResponse { index }))
    }
}

fn updates_too_many(msg: &pb::UpdateAllocationsRequest) -> bool {
    msg.updates_json.len() > MAX_UPDATE_BATCH
}

/// Feed one node's watch stream until the client goes, the server stops, or a
/// server error (sent to the client as the stream's status).
async fn watch(
    server: Arc<Server>,
    node_id: String,
    first: crate::server::NodeAllocations,
    asked: u64,
    tx: mpsc::Sender<Result<pb::AllocationsUpdate, Status>>,
    shutdown: CancellationToken,
) {
    let mut next = Some(first);
    // With index 0 the client waits for its complete set: send it even when empty.
    let mut must_send = asked == 0;
    let mut index = asked;
    loop {
        let batch = match next.take() {
            Some(b) => b,
            None => {
                let fetched = tokio::select! {
                    r = server.allocations_for_client(&node_id, index, WATCH_WAIT) => r,
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => return,
                };
                match fetched {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(status_from(e))).await;
                        return;
                    }
                }
            }
        };
        let changed = batch.complete || !batch.allocations.is_empty();
        if changed || must_send {
            let allocations_json = match batch.allocations.iter().map(encode).collect() {
                Ok(v) => v,
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let update = pb::AllocationsUpdate {
                index: batch.index,
                complete: batch.complete,
                allocations_json,
            };
            let sent = tokio::select! {
                r = tx.send(Ok(update)) => r.is_ok(),
                () = shutdown.cancelled() => false,
            };
            if !sent {
                return;
            }
            must_send = false;
        }
        // Changes never move the index back (a batch at an older index would make the
        // next wait return at once, over and over); a complete set is the truth at its
        // own index, even a lower one (the client's index came from a store that was
        // replaced).
        index = if batch.complete {
            batch.index
        } else {
            index.max(batch.index)
        };
        if !changed {
            // Nothing newer within the wait: the core returned at its current index.
            // Ask again (the wait itself paces this loop).
            tokio::task::yield_now().await;
        }
    }
}

struct ApiRpc {
    router: axum::Router,
    token: Option<Arc<str>>,
    /// ACLs are on: the caller's own token travels with the request, and the leader
    /// checks it (the RPC's token only says another server or an agent sent it).
    acl_enabled: bool,
    shutdown: CancellationToken,
}

/// Request headers a forwarded request never carries over: hop-by-hop ones, and the
/// token (the RPC's own metadata carries it; the server sets the header itself).
const DROPPED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-connection",
    "host",
    "content-length",
    TOKEN_HEADER,
    // The token header of the API before it spoke Nomad's.
    "x-drover-token",
    FORWARDED_HEADER,
];

fn forward_request(
    req: pb::ForwardRequest,
    token: Option<&str>,
    acl_enabled: bool,
) -> Result<http::Request<axum::body::Body>, Status> {
    let method = http::Method::from_bytes(req.method.as_bytes()).map_err(|_| {
        Status::invalid_argument(format!("method {:?} is not an HTTP method", req.method))
    })?;
    if !req.path_and_query.starts_with("/v1/") {
        return Err(Status::invalid_argument(format!(
            "path_and_query {:?}: only the API (/v1/...) is forwarded",
            req.path_and_query
        )));
    }
    let uri: http::Uri = req.path_and_query.parse().map_err(|e| {
        Status::invalid_argument(format!("path_and_query {:?}: {e}", req.path_and_query))
    })?;
    let mut builder = http::Request::builder().method(method).uri(uri);
    // A workload identity (a task's JWT, e.g. a template reading its job's variables
    // through its agent) stays the caller's even without ACLs: with the server's token
    // in its place the request would read as the operator's.
    let workload = req.headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case(TOKEN_HEADER)
            && crate::transport::http::looks_like_jwt(value.as_bytes())
    });
    for (name, value) in &req.headers {
        let lower = name.to_ascii_lowercase();
        let caller_token = (acl_enabled || workload) && lower == TOKEN_HEADER;
        if !caller_token
            && DROPPED_HEADERS
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&lower))
        {
            continue;
        }
        let name = http::HeaderName::from_bytes(lower.as_bytes())
            .map_err(|_| Status::invalid_argument(format!("header name {name:?} is not valid")))?;
        let value = http::HeaderValue::from_str(value)
            .map_err(|_| Status::invalid_argument(format!("header {name}: value is not valid")))?;
        builder = builder.header(name, value);
    }
    if let Some(token) = token.filter(|_| !acl_enabled && !workload) {
        // The call was authenticated with this token; the router checks it again.
        let value = http::HeaderValue::from_str(token)
            .map_err(|_| Status::internal("the server's token is not a valid header value"))?;
        builder = builder.header(TOKEN_HEADER, value);
    }
    builder
        .body(axum::body::Body::from(req.body))
        .map_err(|e| Status::invalid_argument(format!("request: {e}")))
}

#[tonic::async_trait]
impl Api for ApiRpc {
    type ForwardStream = ReceiverStream<Result<pb::ForwardResponse, Status>>;

    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<Self::ForwardStream>, Status> {
        let by = request
            .metadata()
            .get(FORWARDED_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let mut http_request = forward_request(
            request.into_inner(),
            self.token.as_deref(),
            self.acl_enabled,
        )?;
        if let Some(by) = by {
            // The router refuses to forward it again (`forward_writes`).
            http_request.extensions_mut().insert(ForwardedBy(by));
        }
        let response = match self.router.clone().oneshot(http_request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let (parts, mut body) = response.into_parts();
        let mut headers = std::collections::HashMap::new();
        for (name, value) in &parts.headers {
            let Ok(value) = value.to_str() else { continue };
            headers
                .entry(name.as_str().to_owned())
                .and_modify(|v: &mut String| {
                    v.push_str(", ");
                    v.push_str(value);
                })
                .or_insert_with(|| value.to_owned());
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let head = pb::ForwardResponse {
            status: u32::from(parts.status.as_u16()),
            headers,
            body: Vec::new(),
        };
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            if tx.send(Ok(head)).await.is_err() {
                return;
            }
            loop {
                // A long body (a blocking query, a followed log) ends when the client
                // goes or the server stops, not only when the router ends it.
                let frame = tokio::select! {
                    f = body.frame() => f,
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => return,
                };
                let data = match frame {
                    None => return,
                    Some(Err(e)) => {
                        let _ = tx
                            .send(Err(Status::internal(format!("response body: {e}"))))
                            .await;
                        return;
                    }
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(d) => d,
                        Err(_) => continue, // trailers: HTTP/1 clients never see them
                    },
                };
                for piece in data.chunks(FORWARD_CHUNK_BYTES) {
                    let msg = pb::ForwardResponse {
                        status: 0,
                        headers: Default::default(),
                        body: piece.to_vec(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Serve the node RPCs (and, once `api` is given, the forwarded HTTP API) on
/// `listener` until `shutdown` fires.
pub async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    options: RpcOptions,
    api: Option<axum::Router>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let metrics_server = server.clone();
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        // Detect clients that vanished without closing (a killed agent's host).
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some(files) = &options.tls {
        let loaded = files
            .load()
            .map_err(|e| ServerError::Invalid(e.to_string()))?;
        builder = builder
            .tls_config(loaded.tonic_server_config())
            .map_err(|e| ServerError::Invalid(format!("RPC TLS settings: {e}")))?;
    }
    let token: Option<Arc<str>> = options.token.as_deref().map(Arc::from);
    let node_token: Option<Arc<str>> = options.node_token.as_deref().map(Arc::from);
    let acl_enabled = server.acl_enabled();
    // Servers forward node RPCs to the leader with the cluster token, so the node
    // service takes both. `Api.Forward` runs any HTTP request: without ACLs it is the
    // servers' alone; with ACLs the request runs as the caller's own ACL token (a
    // node's agent passes its caller's on), so the node token may carry it too.
    let node_check = TokenCheck::new(&[&token, &node_token]);
    let api_check = if acl_enabled {
        TokenCheck::new(&[&token, &node_token])
    } else {
        TokenCheck::new(&[&token])
    };
    let csi = pb::csi_controller_server::CsiControllerServer::new(csi::CsiControllerRpc {
        server: server.clone(),
        shutdown: shutdown.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let csi = tonic::service::interceptor::InterceptedService::new(csi, node_check.clone());
    let node = NodeServer::new(NodeRpc {
        server,
        shutdown: shutdown.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let api = api.map(|router| {
        let svc = ApiServer::new(ApiRpc {
            router,
            token: token.clone(),
            acl_enabled,
            shutdown: shutdown.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        tonic::service::interceptor::InterceptedService::new(svc, api_check)
    });
    let node = tonic::service::interceptor::InterceptedService::new(node, node_check);
    let addr = listener.local_addr().ok();
    tracing::info!(
        addr = ?addr,
        tls = options.tls.is_some(),
        token = options.token.is_some(),
        node_token = options.node_token.is_some(),
        forward = api.is_some(),
        "serving node RPCs"
    );
    builder
        .layer(tower::layer::layer_fn(move |inner| RpcMetrics {
            inner,
            server: metrics_server.clone(),
        }))
        .add_service(node)
        .add_service(csi)
        .add_optional_service(api)
        .serve_with_incoming_shutdown(
            incoming(
                listener,
                connection_cap(),
                options.max_connections_per_ip.max(1),
                options.first_call_deadline,
            ),
            shutdown.cancelled(),
        )
        .await
        .map_err(|e| ServerError::Unavailable(format!("RPC listener: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_codes() {
        use tonic::Code;
        assert_eq!(
            status_from(ServerError::Invalid("x".into())).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            status_from(ServerError::NotFound("x".into())).code(),
            Code::NotFound
        );
        assert_eq!(
            status_from(ServerError::Conflict("x".into())).code(),
            Code::Aborted
        );
        assert_eq!(
            status_from(ServerError::Unavailable("x".into())).code(),
            Code::Unavailable
        );
    }

    #[test]
    fn forwarded_requests_carry_the_servers_token_not_the_callers() {
        let mut headers = std::collections::HashMap::new();
        headers.insert("X-Nomad-Token".to_owned(), "from-client".to_owned());
        headers.insert("content-type".to_owned(), "application/json".to_owned());
        headers.insert("connection".to_owned(), "close".to_owned());
        let req = pb::ForwardRequest {
            method: "PUT".into(),
            path_and_query: "/v1/jobs?x=1".into(),
            headers,
            body: b"{}".to_vec(),
        };
        let r = forward_request(req.clone(), Some("t0k"), false).unwrap();
        assert_eq!(r.method(), http::Method::PUT);
        assert_eq!(r.uri().path_and_query().unwrap().as_str(), "/v1/jobs?x=1");
        assert_eq!(r.headers().get_all(TOKEN_HEADER).iter().count(), 1);
        assert_eq!(r.headers()[TOKEN_HEADER], "t0k");
        assert_eq!(r.headers()["content-type"], "application/json");
        assert!(r.headers().get("connection").is_none());

        // With ACLs the caller's token goes on, and the server's is not added.
        let r = forward_request(req.clone(), Some("t0k"), true).unwrap();
        assert_eq!(r.headers().get_all(TOKEN_HEADER).iter().count(), 1);
        assert_eq!(r.headers()[TOKEN_HEADER], "from-client");

        // A workload identity stays the caller's without ACLs too (a template reading
        // its job's variables must not read as the operator).
        let jwt = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln";
        let mut workload = req.clone();
        workload.method = "GET".into();
        workload.path_and_query = "/v1/var/nomad/jobs/web".into();
        workload
            .headers
            .insert("X-Nomad-Token".to_owned(), jwt.to_owned());
        let r = forward_request(workload, Some("t0k"), false).unwrap();
        assert_eq!(r.headers().get_all(TOKEN_HEADER).iter().count(), 1);
        assert_eq!(r.headers()[TOKEN_HEADER], jwt);

        let err = forward_request(
            pb::ForwardRequest {
                path_and_query: "/etc/passwd".into(),
                ..req.clone()
            },
            None,
            false,
        )
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("/v1/"), "{}", err.message());
        let err = forward_request(
            pb::ForwardRequest {
                method: "GE T".into(),
                ..req
            },
            None,
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("GE T"), "{}", err.message());
    }
}

/// The most distinct method labels the RPC metrics hold: the services' methods are
/// far fewer; anything beyond (a path no check caught) is `other`.
const MAX_RPC_METHOD_LABELS: usize = 128;

/// `path` as a method label, while there is room for new ones.
fn rpc_method_label(path: String) -> String {
    static SEEN: std::sync::Mutex<Option<std::collections::HashSet<String>>> =
        std::sync::Mutex::new(None);
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let seen = seen.get_or_insert_with(Default::default);
    if seen.contains(&path) {
        return path;
    }
    if seen.len() >= MAX_RPC_METHOD_LABELS {
        return "other".to_owned();
    }
    seen.insert(path.clone());
    path
}

/// Counts and times every RPC by its gRPC method (the request's path); a method no
/// service has (answered `Unimplemented`) or one refused before routing (a bad token)
/// is `unknown`, and labels are capped ([`MAX_RPC_METHOD_LABELS`]), so that callers
/// cannot grow the label set. Time is to the response head: a stream counts until it
/// starts.
#[derive(Clone)]
struct RpcMetrics<S> {
    inner: S,
    server: Arc<Server>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = crate::store::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let started = std::time::Instant::now();
        let path = req.uri().path().to_owned();
        let answer = self.inner.call(req);
        let server = self.server.clone();
        Box::pin(async move {
            let r = answer.await;
            // Not routed to a method: no such method (12), or refused before
            // routing for its token (16), whatever path the caller made up.
            let unrouted = r.as_ref().is_ok_and(|resp| {
                resp.headers()
                    .get("grpc-status")
                    .is_some_and(|s| matches!(s.as_bytes(), b"12" | b"16"))
            });
            let method = if unrouted {
                "unknown".to_owned()
            } else {
                rpc_method_label(path)
            };
            let labels = crate::metrics::RpcLabels {
                method: drover_metrics::LabelText(method),
            };
            let m = &server.core.metrics;
            m.rpc_requests.get_or_create(&labels).inc();
            m.rpc_duration
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            r
        })
    }
}
