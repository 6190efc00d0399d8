//! Nomad's client endpoints for allocations on the server's HTTP address:
//! `GET /v1/client/fs/logs/{alloc}`, `GET /v1/client/allocation/{alloc}/stats` and the
//! allocation directory's files, `GET /v1/client/fs/{ls,stat,cat,readat,stream}/{alloc}`.
//!
//! Only the agent of the node that runs an allocation has its logs and its tasks'
//! stats. A server with a local agent (`drover agent --dev`: the server runs inside
//! the agent) passes these requests to that agent's API socket and streams its answer
//! back, so that Nomad's clients (python-nomad, the `nomad` CLI), which ask the address
//! they know, get them; the agent forwards an allocation it does not run back to the
//! servers, which answer below. A server without one says which node has the
//! allocation and how to reach it.
//!
//! The server's token check comes first (these routes sit behind it like every other):
//! the agent's socket trusts whoever reaches it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::StreamExt as _;
use http_body_util::BodyExt as _;
use tokio_util::sync::CancellationToken;

use crate::server::Server;

/// How long the local agent may take to start its answer (a stats answer samples for
/// about a second).
const AGENT_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The agent's header on a directory listing it stopped at its bound.
const LISTING_TRUNCATED: &str = "x-drover-listing-truncated";

#[derive(Clone)]
struct ClientRoutes {
    server: Arc<Server>,
    /// The local agent's API socket (`<data_dir>/api.sock`), when there is one.
    local_agent: Option<Arc<PathBuf>>,
}

/// The routes of Nomad's client endpoints, over `server`: passed to the agent at
/// `local_agent` (its unix socket) when set, else answered with where the allocation
/// runs. Merge them into the server's router before its token check.
pub fn client_routes<S: Clone + Send + Sync + 'static>(
    server: Arc<Server>,
    local_agent: Option<PathBuf>,
) -> Router<S> {
    Router::new()
        .route("/v1/client/fs/logs/{alloc}", get(client_request))
        .route("/v1/client/allocation/{alloc}/stats", get(client_request))
        .route("/v1/client/fs/ls/{alloc}", get(client_request))
        .route("/v1/client/fs/stat/{alloc}", get(client_request))
        .route("/v1/client/fs/cat/{alloc}", get(client_request))
        .route("/v1/client/fs/readat/{alloc}", get(client_request))
        .route("/v1/client/fs/stream/{alloc}", get(client_request))
        .with_state(ClientRoutes {
            server,
            local_agent: local_agent.map(Arc::new),
        })
}

/// A Nomad error: a status and a line of plain text.
fn error(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

async fn client_request(
    State(routes): State<ClientRoutes>,
    Path(alloc): Path<String>,
    stop: Option<Extension<CancellationToken>>,
    req: Request,
) -> Response {
    // With ACLs, the caller needs `read-logs` (logs), `read-fs` (files) or `read-job`
    // (stats) in the allocation's own namespace, as Nomad's (`enforce` let any valid
    // caller through: only here is the allocation known).
    if let Some(super::acl::TokenLookup(lookup)) = req.extensions().get::<super::acl::TokenLookup>()
    {
        let capability = capability_of(req.uri().path());
        let unknown = || {
            error(
                StatusCode::NOT_FOUND,
                format!("Unknown allocation {alloc:?}"),
            )
        };
        let (allowed, whole_id) = match (lookup, routes.server.allocation(&alloc)) {
            (Ok(id), Some(a)) => (
                id.acl()
                    .is_some_and(|acl| acl.allow_namespace_op(&a.namespace, capability)),
                a.id == alloc,
            ),
            (Ok(_), None) => return unknown(),
            (Err(_), _) => (false, true),
        };
        // A prefix of an allocation the caller may not see is as unknown as none:
        // prefixes are no way to learn which ids exist in other namespaces.
        if !allowed && !whole_id {
            return unknown();
        }
        if !allowed {
            return error(StatusCode::FORBIDDEN, super::PERMISSION_DENIED.to_owned());
        }
    }
    match &routes.local_agent {
        Some(socket) => {
            let stop = stop.map(|Extension(t)| t).unwrap_or_default();
            // The agent finds its allocations by whole id: a prefix the server
            // resolved is passed on as the id it names.
            let mut req = req;
            if let Some(a) = routes.server.allocation(&alloc)
                && a.id != alloc
                && let Some(uri) = with_whole_id(req.uri(), &alloc, &a.id)
            {
                *req.uri_mut() = uri;
            }
            proxy(socket, req, stop).await
        }
        None => elsewhere(&routes.server, &alloc, req.uri().path()),
    }
}

/// `uri` with its path segment `prefix` (the allocation as asked) replaced by `id`.
fn with_whole_id(uri: &axum::http::Uri, prefix: &str, id: &str) -> Option<axum::http::Uri> {
    let mut replaced = false;
    let path: Vec<&str> = uri
        .path()
        .split('/')
        .map(|seg| {
            if !replaced && seg == prefix {
                replaced = true;
                id
            } else {
                seg
            }
        })
        .collect();
    let mut text = path.join("/");
    if let Some(q) = uri.query() {
        text.push('?');
        text.push_str(q);
    }
    text.parse().ok()
}

/// The capability a client endpoint needs in the allocation's namespace.
fn capability_of(path: &str) -> &'static str {
    if path.ends_with("/stats") {
        "read-job"
    } else if path.starts_with("/v1/client/fs/logs/") {
        "read-logs"
    } else {
        "read-fs"
    }
}

/// The allocation's node, for a client that asked a server without a local agent.
fn elsewhere(server: &Server, alloc: &str, path: &str) -> Response {
    let Some(a) = server.allocation(alloc) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("Unknown allocation {alloc:?}"),
        );
    };
    let what = match capability_of(path) {
        "read-job" => "the resource use",
        "read-logs" => "the logs",
        _ => "the files",
    };
    error(
        StatusCode::BAD_REQUEST,
        format!(
            "{what} of allocation {} are on node {} ({}): ask that node's agent \
             (drover alloc logs --address unix:///<its data dir>/api.sock, or its \
             socket's /v1/client/... path)",
            a.id, a.node_name, a.node_id
        ),
    )
}

/// Pass `req` (method GET, its path and query, nothing else: no token) to the agent
/// at `socket`, and stream its answer back until it ends, the client goes, or the
/// server stops.
async fn proxy(socket: &std::path::Path, req: Request, stop: CancellationToken) -> Response {
    let unreachable = |e: &dyn std::fmt::Display| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the local agent at {} does not answer: {e}",
                socket.display()
            ),
        )
    };
    let stream = match tokio::net::UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => return unreachable(&e),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await {
            Ok(c) => c,
            Err(e) => return unreachable(&e),
        };
    // Runs until the answer's body is read or dropped (the client went away).
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "the connection to the local agent ended");
        }
    });
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let upstream = match http::Request::builder()
        .method(http::Method::GET)
        .uri(target)
        .header(header::HOST, "localhost")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
    {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad request: {e}")),
    };
    let answer = tokio::time::timeout(AGENT_ANSWER_TIMEOUT, sender.send_request(upstream)).await;
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return unreachable(&e),
        Err(_) => {
            return unreachable(&format!("no answer within {AGENT_ANSWER_TIMEOUT:?}"));
        }
    };
    let (parts, body) = answer.into_parts();
    let body = body.into_data_stream().take_until(stop.cancelled_owned());
    let mut resp = Response::new(axum::body::Body::from_stream(body));
    *resp.status_mut() = parts.status;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("application/octet-stream"));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    // A listing the agent cut short says so.
    if let Some(v) = parts.headers.get(LISTING_TRUNCATED) {
        resp.headers_mut().insert(LISTING_TRUNCATED, v.clone());
    }
    resp
}
