//! The server's JSON HTTP API (`/v1/...`), Nomad-shaped, with blocking queries.
//!
//! - Every answer carries `X-Drover-Index`: the store index the answer was read at
//!   (for a write, the index of its commit).
//! - Every `GET` is a blocking query when it has `?index=N`: the answer waits until
//!   something newer than `N` was committed, or `wait` passed (default and maximum
//!   [`MAX_BLOCKING_WAIT`]), then reads the state as usual.
//! - Errors are `{"error": "..."}` with 400 (bad request), 401 (token), 404, 405, 409,
//!   413 (body too large), 500 (store) or 503 (not serving).
//! - With a token, every request must carry it in `X-Drover-Token`; anything else is
//!   refused with 401 before the request is looked at, and changes nothing.

mod client_routes;
mod serve;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use drover_server_api::{
    INDEX_HEADER, Index, JobRegisterRequest, JobSpec, MAX_BLOCKING_WAIT, NodeDrainRequest,
    NodeDrainResponse, TOKEN_HEADER,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

pub use self::client_routes::client_routes;
pub use self::serve::{serve, tls_server_config};

use crate::error::ServerError;
use crate::server::Server;
use crate::transport::auth::token_eq;
use crate::transport::forward::{FORWARDED_HEADER, Forwarded, ForwardedBy};

/// Largest request body accepted: a job file is a few KiB; this leaves room for big
/// driver configs and refuses anything that would only eat memory.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone)]
struct Api {
    server: Arc<Server>,
}

/// An API error: a status code and `{"error": "..."}`, marked when the request
/// belongs to the leader (the server does not lead, or stopped leading).
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    not_leader: bool,
}

impl ApiError {
    fn new(status: StatusCode, message: String) -> ApiError {
        ApiError {
            status,
            message,
            not_leader: false,
        }
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
        ApiError {
            status: code,
            not_leader: e.is_not_leader(),
            message: e.to_string(),
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

fn not_found(what: &str, name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("{what} {name:?} not found"))
}

/// The API's routes over `server`; `token`, when set, is required on every request
/// (`x-drover-token` header).
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
    let client = client_routes(server.clone(), local_agent);
    let api = Api { server };
    let routes = Router::new()
        .route(
            "/v1/jobs",
            get(list_jobs).put(register_job).post(register_job),
        )
        .route(
            "/v1/job/{name}",
            get(get_job)
                .put(register_named_job)
                .post(register_named_job)
                .delete(stop_job),
        )
        .route(
            "/v1/job/{name}/plan",
            axum::routing::put(plan_job).post(plan_job),
        )
        .route("/v1/job/{name}/allocations", get(job_allocations))
        .route("/v1/job/{name}/evaluations", get(job_evaluations))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/node/{id}", get(get_node))
        .route("/v1/node/{id}/allocations", get(node_allocations))
        .route(
            "/v1/node/{id}/drain",
            axum::routing::post(drain_node).put(drain_node),
        )
        .route("/v1/allocations", get(list_allocations))
        .route("/v1/allocation/{id}", get(get_allocation))
        .route("/v1/evaluations", get(list_evaluations))
        .route("/v1/evaluation/{id}", get(get_evaluation))
        .route("/v1/status/servers", get(servers_status))
        .route("/v1/status/leader", get(leader_status))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such API endpoint".into()) })
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{} is not allowed on {}", req.method(), req.uri().path()),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response_with_state(
            api.clone(),
            with_index,
        ))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            forward_writes,
        ))
        .with_state(api)
        .merge(client);
    match token {
        Some(token) => routes.layer(axum::middleware::from_fn(move |req, next| {
            check_token(Arc::from(token.as_bytes()), req, next)
        })),
        None => routes,
    }
}

/// Every answer behind the token check carries the index, errors too (a 404 of a
/// blocking query is an answer at an index like any other).
async fn with_index(State(api): State<Api>, mut resp: Response) -> Response {
    if !resp.headers().contains_key(INDEX_HEADER) {
        resp.headers_mut()
            .insert(INDEX_HEADER, HeaderValue::from(api.server.index()));
    }
    resp
}

/// Request headers not passed on to the leader: hop-by-hop ones, and the token (the
/// forward carries this server's own).
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
/// again (503, marked: that server looks for the leader anew).
async fn forward_writes(State(api): State<Api>, req: Request, next: Next) -> Response {
    let method = req.method();
    if method == http::Method::GET || method == http::Method::HEAD || api.server.is_leader() {
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
        if NOT_FORWARDED.contains(&name.as_str()) {
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

async fn check_token(token: Arc<[u8]>, req: Request, next: Next) -> Response {
    let given = req.headers().get(TOKEN_HEADER).map(HeaderValue::as_bytes);
    match given {
        Some(given) if token_eq(given, &token) => next.run(req).await,
        Some(_) => {
            // Never the token itself in logs.
            tracing::warn!(method = %req.method(), path = %req.uri().path(), "refused a request with a wrong token");
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid token".into()).into_response()
        }
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("this server requires a token: send it in the {TOKEN_HEADER} header (DROVER_TOKEN for the CLI)"),
        )
        .into_response(),
    }
}

/// `?index=N&wait=30s` of a blocking query.
#[derive(Debug, Default, Deserialize)]
struct BlockingQuery {
    #[serde(default)]
    index: Option<Index>,
    #[serde(default)]
    wait: Option<String>,
}

/// Parse the blocking-query parameters; the longest wait is [`MAX_BLOCKING_WAIT`],
/// which is also the default when only `index` is given (as Nomad's).
fn blocking_wait(q: &BlockingQuery) -> Result<Option<(Index, Duration)>, ApiError> {
    let wait = match &q.wait {
        None => MAX_BLOCKING_WAIT,
        Some(w) => parse_wait(w)?.min(MAX_BLOCKING_WAIT),
    };
    Ok(q.index.filter(|i| *i > 0).map(|i| (i, wait)))
}

/// `30s`, `5m`, `1m30s`, `250ms`, or a bare number of seconds.
fn parse_wait(text: &str) -> Result<Duration, ApiError> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid query: wait={text:?} is not a duration like \"30s\" or \"5m\": {e}"),
        )
    })
}

fn bad_query(e: QueryRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("invalid query: {}", e.body_text()),
    )
}

/// Run the blocking part of a query, if asked; then the index to answer with. The
/// index is read before the state, so the state is at least as new as the index.
async fn block(
    api: &Api,
    query: Result<Query<BlockingQuery>, QueryRejection>,
    shutdown: Option<Extension<CancellationToken>>,
) -> Result<Index, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    if let Some((index, wait)) = blocking_wait(&q)? {
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
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body is empty".into(),
        ));
    }
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

/// The body's job, which must carry the name in the path when there is one.
fn job_from_body(
    name: Option<&str>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<JobSpec, ApiError> {
    let JobRegisterRequest { job } = json_body(body)?;
    if let Some(name) = name
        && job.name != name
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the job in the body is named {:?}, the path names {name:?}",
                job.name
            ),
        ));
    }
    Ok(job)
}

// --- jobs -------------------------------------------------------------------------

async fn list_jobs(
    State(api): State<Api>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    answer(index, api.server.jobs())
}

async fn register_job(
    State(api): State<Api>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let job = job_from_body(None, body)?;
    let resp = api.server.register_job(job).await?;
    answer(resp.index, resp)
}

async fn register_named_job(
    State(api): State<Api>,
    Path(name): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let job = job_from_body(Some(&name), body)?;
    let resp = api.server.register_job(job).await?;
    answer(resp.index, resp)
}

async fn get_job(
    State(api): State<Api>,
    Path(name): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let job = api
        .server
        .job(&name)
        .ok_or_else(|| not_found("job", &name))?;
    answer(index, job)
}

#[derive(Debug, Default, Deserialize)]
struct StopQuery {
    #[serde(default)]
    purge: bool,
}

async fn stop_job(
    State(api): State<Api>,
    Path(name): Path<String>,
    query: Result<Query<StopQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = query.map_err(bad_query)?;
    let resp = api.server.stop_job(&name, q.purge).await?;
    answer(resp.index, resp)
}

async fn plan_job(
    State(api): State<Api>,
    Path(name): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let job = job_from_body(Some(&name), body)?;
    let index = api.server.index();
    answer(index, api.server.plan_job(job).await?)
}

async fn job_allocations(
    State(api): State<Api>,
    Path(name): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let allocs = api.server.job_allocations(&name);
    // A purged job's allocations may outlive it; an unknown name with none is a typo.
    if allocs.is_empty() && api.server.job(&name).is_none() {
        return Err(not_found("job", &name));
    }
    answer(index, allocs)
}

async fn job_evaluations(
    State(api): State<Api>,
    Path(name): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let evals = api.server.job_evaluations(&name);
    if evals.is_empty() && api.server.job(&name).is_none() {
        return Err(not_found("job", &name));
    }
    answer(index, evals)
}

// --- nodes ------------------------------------------------------------------------

async fn list_nodes(
    State(api): State<Api>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    answer(index, api.server.nodes())
}

async fn get_node(
    State(api): State<Api>,
    Path(id): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let node = api.server.node(&id)?;
    answer(index, node)
}

async fn node_allocations(
    State(api): State<Api>,
    Path(id): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let node = api.server.node(&id)?;
    answer(index, api.server.node_allocations(&node.id))
}

async fn drain_node(
    State(api): State<Api>,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let NodeDrainRequest { enable } = json_body(body)?;
    let index = api.server.drain_node(&id, enable).await?;
    answer(index, NodeDrainResponse { index })
}

// --- allocations and evaluations -------------------------------------------------

async fn list_allocations(
    State(api): State<Api>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    answer(index, api.server.allocations())
}

async fn get_allocation(
    State(api): State<Api>,
    Path(id): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let alloc = api
        .server
        .allocation(&id)
        .ok_or_else(|| not_found("allocation", &id))?;
    answer(index, alloc)
}

async fn list_evaluations(
    State(api): State<Api>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    answer(index, api.server.evaluations())
}

async fn get_evaluation(
    State(api): State<Api>,
    Path(id): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> ApiResult {
    let index = block(&api, query, stop).await?;
    let eval = api
        .server
        .evaluation(&id)
        .ok_or_else(|| not_found("evaluation", &id))?;
    answer(index, eval)
}

// --- status -----------------------------------------------------------------------

async fn servers_status(State(api): State<Api>) -> ApiResult {
    let index = api.server.index();
    answer(index, api.server.servers_status().await)
}

async fn leader_status(State(api): State<Api>) -> ApiResult {
    let index = api.server.index();
    answer(index, api.server.leader_status()?)
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
            let message = e.to_string();
            let not_leader = e.is_not_leader();
            let got = ApiError::from(e);
            assert_eq!((got.status, got.message), (code, message));
            assert_eq!(got.not_leader, not_leader);
        }
    }

    #[test]
    fn blocking_waits_are_bounded() {
        let q = |index: Option<u64>, wait: Option<&str>| BlockingQuery {
            index,
            wait: wait.map(str::to_owned),
        };
        assert_eq!(blocking_wait(&q(None, Some("30s"))).unwrap(), None);
        assert_eq!(blocking_wait(&q(Some(0), None)).unwrap(), None);
        assert_eq!(
            blocking_wait(&q(Some(7), Some("30s"))).unwrap(),
            Some((7, Duration::from_secs(30)))
        );
        assert_eq!(
            blocking_wait(&q(Some(7), Some("2"))).unwrap(),
            Some((7, Duration::from_secs(2)))
        );
        assert_eq!(
            blocking_wait(&q(Some(7), Some("1h"))).unwrap(),
            Some((7, MAX_BLOCKING_WAIT))
        );
        assert_eq!(
            blocking_wait(&q(Some(7), None)).unwrap(),
            Some((7, MAX_BLOCKING_WAIT))
        );
        let err = blocking_wait(&q(Some(7), Some("soon"))).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("wait=\"soon\""), "{}", err.message);
    }
}
