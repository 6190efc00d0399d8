//! The server's HTTP API: Nomad's paths and Nomad's JSON (the wire types of
//! `drover_server_api::nomad`), with Nomad's blocking queries and event stream.
//!
//! - Every answer carries `X-Nomad-Index`: the store index the answer was read at
//!   (for a write, the index of its commit), and `X-Nomad-KnownLeader` and
//!   `X-Nomad-LastContact` as Nomad's.
//! - Every `GET` is a blocking query when it has `?index=N`: the answer waits until
//!   something newer than `N` was committed, or `wait` passed (default and maximum
//!   [`MAX_BLOCKING_WAIT`]), then reads the state as usual.
//! - Errors are plain text with Nomad's status codes (as Nomad's `http.go`: clients
//!   read the code and the text): 400 (bad request), 403 `Permission denied` (token),
//!   404 (`job not found`, ...), 405 `Invalid method`, 409, 413 (body too large), 500
//!   (store) or 503 (not serving).
//! - With a token, every request must carry it in `X-Nomad-Token`; anything else is
//!   refused with 403 before the request is looked at, and changes nothing.
//! - With ACLs on (the server's `acl_enabled`), the shared token is no user
//!   credential: each request's token (`X-Nomad-Token` or `Authorization: Bearer`)
//!   is looked up, and each route checks what it needs (see `acl.rs`).
//! - `/v1/client/*` is the agents' (logs, files, stats of an allocation): not routed
//!   here, but merged from [`client_routes`].
//! - `/ui/` is the web UI (`ui.rs`): public, outside the token check, as it holds no
//!   data (its pages call this API with the user's token).

mod acl;
mod agent;
mod allocs;
mod client_routes;
mod csi;
mod deployments;
mod events;
mod exec_route;
mod jobs;
mod metrics;
mod namespaces;
mod nodes;
mod scope;
mod serve;
mod services;
mod ui;
mod variables;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Extension, Json, Router};
use drover_server_api::{Index, MAX_BLOCKING_WAIT};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

pub use self::client_routes::client_routes;
pub use self::serve::{serve, tls_server_config};
pub(crate) use self::variables::looks_like_jwt;

use crate::error::ServerError;
use crate::server::Server;
use crate::transport::auth::token_eq;
use crate::transport::forward::{FORWARDED_HEADER, Forwarded, ForwardedBy};

/// Largest request body accepted: a job file is a few KiB; this leaves room for big
/// driver configs and refuses anything that would only eat memory.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Nomad's index header: the store index an answer was read at (lowercase: header
/// names are case-insensitive, and lowercase is what `HeaderName` takes as is).
pub const INDEX_HEADER: &str = "x-nomad-index";
/// Nomad's token header.
pub const TOKEN_HEADER: &str = "x-nomad-token";
/// Nomad's header saying whether the answering server knows a leader.
pub const KNOWN_LEADER_HEADER: &str = "x-nomad-knownleader";
/// Nomad's header with the milliseconds since the answering server last heard from
/// the leader (0 on the leader).
pub const LAST_CONTACT_HEADER: &str = "x-nomad-lastcontact";

#[derive(Clone)]
struct Api {
    server: Arc<Server>,
    /// A token is required (Nomad's `ACL.Enabled` in `/v1/agent/self`).
    token_required: bool,
}

/// An API error: a status code and a plain-text message (Nomad's), marked when the
/// request belongs to the leader (the server does not lead, or stopped leading).
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    not_leader: bool,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            not_leader: false,
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
}

impl From<ServerError> for ApiError {
    fn from(e: ServerError) -> Self {
        let code = match &e {
            ServerError::Invalid(_) => StatusCode::BAD_REQUEST,
            ServerError::NotFound(_) => StatusCode::NOT_FOUND,
            ServerError::Conflict(_) => StatusCode::CONFLICT,
            ServerError::Denied(_) => StatusCode::FORBIDDEN,
            ServerError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ServerError::Unavailable(_)
            | ServerError::NotLeader { .. }
            | ServerError::LeadershipLost(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let message = match &e {
            // Nomad's texts where clients look for them ("job not found").
            ServerError::NotFound(m) => m.clone(),
            _ => e.to_string(),
        };
        ApiError {
            status: code,
            not_leader: e.is_not_leader(),
            message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A write that reached a server which does not lead (any more): marked, so
        // that a forwarding follower looks for the leader again.
        crate::transport::forward::error_response(
            self.status.as_u16(),
            &self.message,
            self.not_leader,
        )
    }
}

type ApiResult = Result<Response, ApiError>;

/// `value` as JSON with the index header.
fn answer(index: Index, value: impl serde::Serialize) -> ApiResult {
    let mut resp = Json(value).into_response();
    resp.headers_mut()
        .insert(INDEX_HEADER, HeaderValue::from(index));
    Ok(resp)
}

/// The API's routes over `server`; `token`, when set, is required on every request
/// (`X-Nomad-Token` header). `/v1/client/*` is not among them: see
/// [`client_routes`].
pub fn router(server: Arc<Server>, token: Option<String>) -> axum::Router {
    router_with_local_agent(server, token, None)
}

/// [`router`], passing Nomad's client endpoints to the agent at `local_agent` (its
/// API socket; see [`client_routes`]).
pub fn router_with_local_agent(
    server: Arc<Server>,
    token: Option<String>,
    local_agent: Option<std::path::PathBuf>,
) -> axum::Router {
    let metrics_state = metrics::Metrics {
        server: server.clone(),
        local_agent: local_agent.clone().map(Arc::new),
    };
    let exec = exec_route::exec_routes(server.clone(), local_agent.clone(), token.clone());
    let client = client_routes(server.clone(), local_agent);
    let acl_enabled = server.acl_enabled();
    let api = Api {
        server,
        token_required: token.is_some() || acl_enabled,
    };
    let client = if acl_enabled {
        client.route_layer(axum::middleware::from_fn(acl::enforce))
    } else {
        client
    };
    let routes = Router::new()
        .acl_route(
            "/v1/jobs",
            get(jobs::list).put(jobs::register).post(jobs::register),
        )
        .acl_route("/v1/jobs/parse", put(jobs::parse).post(jobs::parse))
        .acl_route(
            "/v1/job/{id}",
            get(jobs::get)
                .put(jobs::register_named)
                .post(jobs::register_named)
                .delete(jobs::deregister),
        )
        .acl_route("/v1/job/{id}/allocations", get(jobs::allocations))
        .acl_route("/v1/job/{id}/evaluations", get(jobs::evaluations))
        .acl_route("/v1/job/{id}/summary", get(jobs::summary))
        .acl_route("/v1/job/{id}/versions", get(jobs::versions))
        .acl_route("/v1/job/{id}/deployment", get(deployments::of_job))
        .acl_route("/v1/job/{id}/deployments", get(deployments::of_job))
        .acl_route(
            "/v1/job/{id}/revert",
            put(deployments::revert).post(deployments::revert),
        )
        .acl_route("/v1/deployments", get(deployments::list))
        .acl_route("/v1/deployment/{id}", get(deployments::get))
        .acl_route(
            "/v1/deployment/allocations/{id}",
            get(deployments::allocations),
        )
        .acl_route(
            "/v1/deployment/promote/{id}",
            put(deployments::promote).post(deployments::promote),
        )
        .acl_route(
            "/v1/deployment/fail/{id}",
            put(deployments::fail).post(deployments::fail),
        )
        .acl_route("/v1/job/{id}/plan", put(jobs::plan).post(jobs::plan))
        .acl_route(
            "/v1/job/{id}/scale",
            get(jobs::scale_status).put(jobs::scale).post(jobs::scale),
        )
        .acl_route("/v1/allocations", get(allocs::list))
        .acl_route("/v1/allocation/{id}", get(allocs::get))
        .acl_route(
            "/v1/allocation/{id}/stop",
            put(allocs::stop).post(allocs::stop),
        )
        .acl_route("/v1/evaluations", get(allocs::list_evals))
        .acl_route("/v1/evaluation/{id}", get(allocs::get_eval))
        .acl_route("/v1/evaluation/{id}/allocations", get(allocs::eval_allocs))
        .acl_route("/v1/plugins", get(csi::list))
        .acl_route("/v1/volumes", get(csi::list_volumes))
        .acl_route(
            "/v1/volume/csi/{id}",
            get(csi::get_volume)
                .put(csi::register_volume)
                .post(csi::register_volume)
                .delete(csi::deregister_volume),
        )
        .acl_route(
            "/v1/volume/csi/{id}/create",
            put(csi::create_volume).post(csi::create_volume),
        )
        .acl_route("/v1/volume/csi/{id}/delete", delete(csi::delete_volume))
        .acl_route("/v1/plugin/csi/{id}", get(csi::get))
        .acl_route("/v1/nodes", get(nodes::list))
        .acl_route("/v1/node/{id}", get(nodes::get))
        .acl_route("/v1/node/{id}/allocations", get(nodes::allocations))
        .acl_route("/v1/node/{id}/drain", put(nodes::drain).post(nodes::drain))
        .acl_route(
            "/v1/node/{id}/eligibility",
            put(nodes::eligibility).post(nodes::eligibility),
        )
        .acl_route("/v1/agent/self", get(agent::agent_self))
        .acl_route("/v1/agent/members", get(agent::members))
        .acl_route("/v1/agent/health", get(agent::health))
        .acl_route("/v1/status/leader", get(agent::leader))
        .acl_route("/v1/status/peers", get(agent::peers))
        .acl_route("/v1/status/servers", get(agent::servers_status))
        .acl_route("/v1/status/term", get(agent::leader_term))
        .acl_route("/v1/regions", get(agent::regions))
        .acl_route("/v1/event/stream", get(events::stream))
        .acl_route("/v1/services", get(services::list))
        .acl_route("/v1/service/{name}", get(services::get))
        .acl_route("/v1/service/{name}/{id}", delete(services::delete))
        .acl_route("/v1/vars", get(variables::list))
        .acl_route(
            "/v1/var/{*path}",
            get(variables::get)
                .put(variables::put)
                .post(variables::put)
                .delete(variables::delete),
        )
        .acl_route("/v1/namespaces", get(namespaces::list))
        .acl_route(
            "/v1/namespace",
            put(namespaces::put_unnamed).post(namespaces::put_unnamed),
        )
        .acl_route(
            "/v1/namespace/{name}",
            get(namespaces::get)
                .put(namespaces::put)
                .post(namespaces::put)
                .delete(namespaces::delete),
        )
        .acl_route("/v1/operator/keyring/keys", get(variables::keyring_keys))
        .acl_route(
            "/v1/operator/keyring/rotate",
            put(variables::keyring_rotate).post(variables::keyring_rotate),
        )
        .acl_route(
            "/v1/acl/bootstrap",
            put(acl::bootstrap).post(acl::bootstrap),
        )
        .acl_route("/v1/acl/policies", get(acl::list_policies))
        .acl_route(
            "/v1/acl/policy/{name}",
            get(acl::get_policy)
                .put(acl::put_policy)
                .post(acl::put_policy)
                .delete(acl::delete_policy),
        )
        .acl_route("/v1/acl/tokens", get(acl::list_tokens))
        .acl_route(
            "/v1/acl/token",
            put(acl::create_token).post(acl::create_token),
        )
        .acl_route("/v1/acl/token/self", get(acl::token_self))
        .acl_route(
            "/v1/acl/token/{accessor}",
            get(acl::get_token)
                .put(acl::update_token)
                .post(acl::update_token)
                .delete(acl::delete_token),
        );
    let routes = if acl_enabled {
        routes.route_layer(axum::middleware::from_fn(acl::enforce))
    } else {
        routes
    };
    let routes = routes
        .fallback(|| async { ApiError::not_found("404 page not found") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Invalid method")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response_with_state(
            api.clone(),
            with_meta,
        ))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            forward_writes,
        ))
        .with_state(api.clone())
        .merge(client);
    // Outside every token check: public keys, which anyone may use to verify, the
    // metrics (no token, as Nomad's: see `metrics.rs`), and the web UI's page and
    // assets (no data: the page calls the API with its token).
    let public = Router::new()
        .route(JWKS_PATH, get(variables::jwks))
        .with_state(api.clone())
        .merge(
            Router::new()
                .route("/v1/metrics", get(metrics::metrics))
                .with_state(metrics_state),
        )
        .merge(ui::routes())
        // Checks its caller itself (a browser's token comes in its first message).
        .merge(exec);
    let server = api.server.clone();
    let routes = match token {
        // With ACLs, each request's own token says who it is; the cluster token is
        // the servers' and nodes' credential on the RPCs, not a user's.
        _ if acl_enabled => routes.layer(axum::middleware::from_fn_with_state(api, acl::resolve)),
        Some(token) => routes.layer(axum::middleware::from_fn(move |req, next| {
            check_token(Arc::from(token.as_bytes()), req, next)
        })),
        None => routes,
    };
    public
        .merge(routes)
        .layer(axum::middleware::from_fn_with_state(
            server,
            metrics::record,
        ))
}

/// Nomad's JSON Web Key Set of the keys that sign workload identities.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// `Router::route` that refuses a path without an ACL rule (a route must say what it
/// needs before it can be served).
trait AclRoute {
    fn acl_route(self, path: &str, method_router: axum::routing::MethodRouter<Api>) -> Self;
}

impl AclRoute for Router<Api> {
    fn acl_route(self, path: &str, method_router: axum::routing::MethodRouter<Api>) -> Self {
        assert!(
            acl::rule(path).is_some(),
            "route {path} has no ACL rule in transport/http/acl.rs RULES"
        );
        self.route(path, method_router)
    }
}

/// Every answer behind the token check carries the index, errors too (a 404 of a
/// blocking query is an answer at an index like any other), and whether a leader is
/// known.
async fn with_meta(State(api): State<Api>, mut resp: Response) -> Response {
    let headers = resp.headers_mut();
    if !headers.contains_key(INDEX_HEADER) {
        headers.insert(INDEX_HEADER, HeaderValue::from(api.server.index()));
    }
    let known = api.server.known_leader().is_some();
    headers.insert(
        KNOWN_LEADER_HEADER,
        HeaderValue::from_static(if known { "true" } else { "false" }),
    );
    // A follower's state moves with the leader's commits as they come (a watch):
    // nothing tells how stale it is beyond that; 0 as Nomad's leader says.
    headers.insert(LAST_CONTACT_HEADER, HeaderValue::from_static("0"));
    resp
}

/// Request headers not passed on to the leader: hop-by-hop ones, and the token (the
/// forward carries this server's own). With ACLs the caller's token is passed on
/// instead: the leader checks it (see `forward_writes`).
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-connection",
    "host",
    "content-length",
    TOKEN_HEADER,
    FORWARDED_HEADER,
];

/// Writes (every method but GET and HEAD) reaching a follower go to the leader; its
/// answer is this answer. A write another server forwarded here is not forwarded
/// again (503, marked: that server looks for the leader anew). `/v1/jobs/parse`
/// writes nothing: any server answers it.
async fn forward_writes(State(api): State<Api>, req: Request, next: Next) -> Response {
    let method = req.method();
    if method == http::Method::GET
        || method == http::Method::HEAD
        || req.uri().path() == "/v1/jobs/parse"
        || api.server.is_leader()
    {
        return next.run(req).await;
    }
    if let Some(ForwardedBy(by)) = req.extensions().get::<ForwardedBy>().cloned() {
        return ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: ServerError::NotLeader { leader: None }.to_string().replace(
                crate::error::NO_KNOWN_LEADER,
                &format!(
                    "server {by} forwarded this write here, but this server does not lead either"
                ),
            ),
            not_leader: true,
        }
        .into_response();
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body larger than {} MiB (or cut short)",
                    MAX_BODY_BYTES / (1024 * 1024)
                ),
            )
            .into_response();
        }
    };
    let mut headers = std::collections::HashMap::new();
    for (name, value) in &parts.headers {
        let keep_token = api.server.acl_enabled() && name.as_str() == TOKEN_HEADER;
        if !keep_token
            && NOT_FORWARDED
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.as_str()))
        {
            continue;
        }
        let Ok(value) = value.to_str() else { continue };
        headers
            .entry(name.as_str().to_owned())
            .and_modify(|v: &mut String| {
                v.push_str(", ");
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    let request = drover_proto::drover::cluster::v1::ForwardRequest {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned()),
        headers,
        body: bytes.to_vec(),
    };
    match api.server.forward_http(request).await {
        Forwarded::Remote(resp) => resp,
        // This server leads now: serve it here.
        Forwarded::Local => next.run(Request::from_parts(parts, bytes.into())).await,
    }
}

/// Nomad's text for a refused token (clients look for it).
pub(crate) const PERMISSION_DENIED: &str = "Permission denied";

async fn check_token(token: Arc<[u8]>, mut req: Request, next: Next) -> Response {
    let given = req.headers().get(TOKEN_HEADER).map(HeaderValue::as_bytes);
    match given {
        Some(given) if token_eq(given, &token) => {
            req.extensions_mut().insert(variables::ClusterTokenChecked);
            next.run(req).await
        }
        // A workload identity reading variables: its handler verifies it.
        Some(given)
            if variables::admits_workload_identity(req.method(), req.uri().path(), given) =>
        {
            next.run(req).await
        }
        Some(_) => {
            // Never the token itself in logs.
            tracing::warn!(method = %req.method(), path = %req.uri().path(), "refused a request with a wrong token");
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "{PERMISSION_DENIED}: invalid token (X-Nomad-Token; NOMAD_TOKEN or \
                     DROVER_TOKEN for the CLI)"
                ),
            )
            .into_response()
        }
        None => ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{PERMISSION_DENIED}: this server requires a token in the X-Nomad-Token header \
                 (NOMAD_TOKEN or DROVER_TOKEN for the CLI)"
            ),
        )
        .into_response(),
    }
}

/// The query parameters of a request, as pairs (a parameter may repeat: `topic`).
/// Taking it checks `region`: this server serves its own only.
#[derive(Debug, Default)]
struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `?purge`, `?purge=true`: present and not false (Go's `strconv.ParseBool`).
    fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None => Ok(false),
            Some("" | "1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(ApiError::bad_request(format!(
                "Failed to parse value of {key:?} ({v:?}) as a bool"
            ))),
        }
    }

    fn prefix(&self) -> &str {
        self.get("prefix").unwrap_or("")
    }
}

impl FromRequestParts<Api> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(query)
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?;
        let params = Params(pairs);
        if let Some(region) = params.get("region")
            && !region.is_empty()
            && region != api.server.region()
        {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "No path to region: this server serves region {:?}, not {region:?}",
                    api.server.region()
                ),
            ));
        }
        Ok(params)
    }
}

fn serde_urlencoded_pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    use axum::extract::Query;
    let uri: http::Uri = format!("/?{query}")
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|Query(v)| v)
        .map_err(|e| e.body_text())
}

/// The blocking part of a query (`index`, `wait`), if asked: the index to wait past
/// and for how long at most ([`MAX_BLOCKING_WAIT`], also the default, as Nomad's).
fn blocking_wait(q: &Params) -> Result<Option<(Index, Duration)>, ApiError> {
    let wait = match q.get("wait") {
        None | Some("") => MAX_BLOCKING_WAIT,
        Some(w) => parse_wait(w)?.min(MAX_BLOCKING_WAIT),
    };
    let index = match q.get("index") {
        None | Some("") => 0,
        Some(i) => i
            .parse::<Index>()
            .map_err(|_| ApiError::bad_request("Invalid index"))?,
    };
    Ok((index > 0).then_some((index, wait)))
}

/// `30s`, `5m`, `1m30s`, `250ms` (Go's durations), or a bare number of seconds.
fn parse_wait(text: &str) -> Result<Duration, ApiError> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text).map_err(|e| {
        ApiError::bad_request(format!(
            "Invalid wait time: {text:?} is not a duration like \"30s\" or \"5m\": {e}"
        ))
    })
}

/// Run the blocking part of a query, if asked; then the index to answer with. The
/// index is read before the state, so the state is at least as new as the index.
async fn block(
    api: &Api,
    q: &Params,
    shutdown: Option<Extension<CancellationToken>>,
) -> Result<Index, ApiError> {
    if let Some((index, wait)) = blocking_wait(q)? {
        let waited = api.server.wait_for_index(index, wait);
        match shutdown {
            Some(Extension(stop)) => {
                tokio::select! {
                    _ = waited => {}
                    // Answer with what there is: the listener is closing.
                    () = stop.cancelled() => {}
                }
            }
            None => {
                waited.await;
            }
        }
    }
    Ok(api.server.index())
}

/// A JSON body of type `T`, with errors that say what was wrong with it.
fn json_body<T: DeserializeOwned>(
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body larger than {} MiB",
                    MAX_BODY_BYTES / (1024 * 1024)
                ),
            )
        } else {
            ApiError::new(
                e.status(),
                format!("cannot read the request body: {}", e.body_text()),
            )
        }
    })?;
    if body.is_empty() {
        return Err(ApiError::bad_request("Request body is empty"));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("Failed to decode request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_map_to_statuses() {
        use crate::store::StoreError;
        for (e, code) in [
            (ServerError::Invalid("x".into()), StatusCode::BAD_REQUEST),
            (ServerError::NotFound("x".into()), StatusCode::NOT_FOUND),
            (ServerError::Conflict("x".into()), StatusCode::CONFLICT),
            (
                ServerError::Store(StoreError::Backend("disk".into())),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                ServerError::Unavailable("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                ServerError::NotLeader { leader: None },
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                ServerError::LeadershipLost("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ] {
            let not_leader = e.is_not_leader();
            let got = ApiError::from(e);
            assert_eq!(got.status, code);
            assert_eq!(got.not_leader, not_leader);
        }
        // Nomad's texts: a not-found error is its message alone.
        let got = ApiError::from(ServerError::NotFound("job not found".into()));
        assert_eq!(got.message, "job not found");
    }

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn blocking_waits_are_bounded() {
        let q = |index: Option<&str>, wait: Option<&str>| {
            let mut v = Vec::new();
            if let Some(i) = index {
                v.push(("index", i));
            }
            if let Some(w) = wait {
                v.push(("wait", w));
            }
            params(&v)
        };
        assert_eq!(blocking_wait(&q(None, Some("30s"))).unwrap(), None);
        assert_eq!(blocking_wait(&q(Some("0"), None)).unwrap(), None);
        assert_eq!(
            blocking_wait(&q(Some("7"), Some("30s"))).unwrap(),
            Some((7, Duration::from_secs(30)))
        );
        assert_eq!(
            blocking_wait(&q(Some("7"), Some("2"))).unwrap(),
            Some((7, Duration::from_secs(2)))
        );
        assert_eq!(
            blocking_wait(&q(Some("7"), Some("1h"))).unwrap(),
            Some((7, MAX_BLOCKING_WAIT))
        );
        assert_eq!(
            blocking_wait(&q(Some("7"), None)).unwrap(),
            Some((7, MAX_BLOCKING_WAIT))
        );
        let err = blocking_wait(&q(Some("7"), Some("soon"))).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(
            err.message.starts_with("Invalid wait time"),
            "{}",
            err.message
        );
        let err = blocking_wait(&q(Some("x"), None)).unwrap_err();
        assert_eq!(err.message, "Invalid index");
    }

    #[test]
    fn flags_read_as_go_reads_bools() {
        assert!(params(&[("purge", "true")]).flag("purge").unwrap());
        assert!(params(&[("purge", "")]).flag("purge").unwrap());
        assert!(!params(&[("purge", "false")]).flag("purge").unwrap());
        assert!(!params(&[]).flag("purge").unwrap());
        assert!(params(&[("purge", "yes please")]).flag("purge").is_err());
    }

    #[test]
    fn query_strings_keep_repeated_keys() {
        let pairs = serde_urlencoded_pairs("topic=Job:*&topic=Allocation:a%20b&index=3").unwrap();
        let p = Params(pairs);
        assert_eq!(
            p.all("topic").collect::<Vec<_>>(),
            ["Job:*", "Allocation:a b"]
        );
        assert_eq!(p.get("index"), Some("3"));
    }
}
