//! `GET /v1/client/allocation/{alloc}/exec` on the server's HTTP address: Nomad's exec
//! WebSocket ([`drover_server_api::exec`]), checked here and relayed to the local
//! agent's socket (`drover agent --dev`), which runs it through the task's driver.
//!
//! The route sits outside the token middleware because a browser cannot set headers
//! on a WebSocket: the token is the request's `X-Nomad-Token` (or `Authorization:
//! Bearer`) when it has one, checked before the upgrade; otherwise the first message
//! must carry it (`{"version":1,"auth_token":"..."}`, Nomad's UI), checked before
//! anything is relayed. With ACLs the caller needs `alloc-exec` in the allocation's
//! namespace, and `alloc-node-exec` too for a task whose driver does not isolate it
//! (`raw_exec`: a shell there is a shell on the node), as Nomad's; without ACLs, the
//! cluster token when the server has one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use drover_server_api::exec::{ExecFrame, close_reason};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio_tungstenite::tungstenite;

use crate::server::Server;
use crate::transport::auth::token_eq;

/// How long a caller without a token header has to send its first message.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest message taken from a caller.
const MAX_MESSAGE: usize = 1024 * 1024;
/// Drivers whose tasks run unisolated on the node (`alloc-node-exec`).
const NODE_EXEC_DRIVERS: [&str; 2] = ["raw_exec", "rawexec"];

#[derive(Clone)]
struct ExecRoute {
    server: Arc<Server>,
    local_agent: Option<Arc<PathBuf>>,
    cluster_token: Option<Arc<[u8]>>,
}

/// The exec route over `server`, relayed to the agent at `local_agent`; `cluster_token`
/// is required of callers when ACLs are off. Merge it outside the token middleware.
pub(super) fn exec_routes<S: Clone + Send + Sync + 'static>(
    server: Arc<Server>,
    local_agent: Option<PathBuf>,
    cluster_token: Option<String>,
) -> Router<S> {
    Router::new()
        .route("/v1/client/allocation/{alloc}/exec", get(exec))
        .with_state(ExecRoute {
            server,
            local_agent: local_agent.map(Arc::new),
            cluster_token: cluster_token.map(|t| Arc::from(t.as_bytes())),
        })
}

fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// The token of a request's headers, if it has one ([`super::acl::token_of`]); a
/// token header that is no text is a token that cannot be anyone's, never none.
fn header_token(headers: &HeaderMap) -> Option<String> {
    super::acl::token_of(headers)
        .map(str::to_owned)
        .or_else(|| {
            headers
                .contains_key(drover_server_api::TOKEN_HEADER)
                .then(|| "\u{0}not text".to_owned())
        })
}

/// What the exec needs: the allocation's namespace, and whether its task runs
/// unisolated.
struct Target {
    alloc_id: String,
    namespace: String,
    node_exec: bool,
}

impl ExecRoute {
    /// May the caller with `secret` exec into `target`?
    fn allowed(&self, secret: Option<&str>, target: &Target) -> bool {
        if self.server.acl_enabled() {
            let Ok(id) = self.server.resolve_token(secret) else {
                return false;
            };
            id.acl().is_some_and(|acl| {
                acl.allow_namespace_op(&target.namespace, "alloc-exec")
                    && (!target.node_exec
                        || acl.allow_namespace_op(&target.namespace, "alloc-node-exec"))
            })
        } else if let Some(want) = &self.cluster_token {
            secret.is_some_and(|s| token_eq(s.as_bytes(), want))
        } else {
            true
        }
    }
}

async fn exec(
    State(route): State<ExecRoute>,
    Path(alloc): Path<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
    req: Request,
) -> Response {
    let unknown = || {
        plain(
            StatusCode::NOT_FOUND,
            format!("Unknown allocation {alloc:?}"),
        )
    };
    let Some(a) = route.server.allocation(&alloc) else {
        return unknown();
    };
    let task = req
        .uri()
        .query()
        .and_then(|q| {
            super::serde_urlencoded_pairs(q)
                .ok()?
                .into_iter()
                .find(|(k, _)| k == "task")
                .map(|(_, v)| v)
        })
        .unwrap_or_default();
    let driver = route.server.job_version_of(&a).and_then(|j| {
        j.spec
            .groups
            .iter()
            .find(|g| g.name == a.group)?
            .tasks
            .iter()
            .find(|t| t.name == task)
            .map(|t| t.driver.clone())
    });
    let target = Target {
        alloc_id: a.id.clone(),
        namespace: a.namespace.clone(),
        // A task not found is refused by the agent; count it as unisolated meanwhile.
        node_exec: driver.is_none_or(|d| NODE_EXEC_DRIVERS.contains(&d.as_str())),
    };
    // A WebSocket has no same-origin protection: a page of another site could open one
    // to this server with whatever the browser holds. A browser always says where the
    // page came from; only this server's own pages (its UI) may.
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest.trim_end_matches('/'));
        if host.is_none() || origin_host != host {
            return plain(
                StatusCode::FORBIDDEN,
                "exec from a page of another origin is refused",
            );
        }
    }
    let header_secret = header_token(req.headers());
    if let Some(secret) = &header_secret
        && !route.allowed(Some(secret), &target)
    {
        // A prefix of an allocation the caller may not see is as unknown as none.
        if a.id != alloc {
            return unknown();
        }
        return plain(StatusCode::FORBIDDEN, super::PERMISSION_DENIED);
    }
    let Some(socket_path) = route.local_agent.clone() else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!(
                "allocation {} runs on node {} ({}): exec through that node's agent \
                 (drover alloc exec --address unix:///<its data dir>/api.sock); this \
                 server does not relay to nodes yet",
                a.id, a.node_name, a.node_id
            ),
        );
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("exec is a WebSocket: send an upgrade request ({e})"),
            );
        }
    };
    // The agent finds its allocations by whole id.
    let path_and_query = match req.uri().query() {
        Some(q) => format!("/v1/client/allocation/{}/exec?{q}", target.alloc_id),
        None => format!("/v1/client/allocation/{}/exec", target.alloc_id),
    };
    ws.max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| async move {
            relay(
                route,
                socket,
                target,
                header_secret.is_some(),
                socket_path,
                path_and_query,
            )
            .await;
        })
}

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: close_reason(reason).into(),
        })))
        .await;
}

async fn relay(
    route: ExecRoute,
    mut socket: WebSocket,
    target: Target,
    checked: bool,
    agent: Arc<PathBuf>,
    path_and_query: String,
) {
    // A first message that only authenticates is not relayed; one that carries input
    // is (a client with a header token sends input at once).
    let mut first: Option<Message> = None;
    if !checked {
        let message = tokio::time::timeout(AUTH_TIMEOUT, socket.recv()).await;
        let Ok(Some(Ok(Message::Text(text)))) = message else {
            close(
                &mut socket,
                1008,
                "expected the first message with auth_token",
            )
            .await;
            return;
        };
        let frame: ExecFrame = serde_json::from_str(text.as_str()).unwrap_or_default();
        if !route.allowed(frame.auth_token.as_deref(), &target) {
            close(&mut socket, 1008, super::PERMISSION_DENIED).await;
            return;
        }
        if frame.stdin.is_some() || frame.tty_size.is_some() {
            let inputs = ExecFrame {
                auth_token: None,
                version: None,
                ..frame
            };
            first = Some(Message::Text(
                serde_json::to_string(&inputs).unwrap_or_default().into(),
            ));
        }
    }
    let stream = match tokio::net::UnixStream::connect(&*agent).await {
        Ok(s) => s,
        Err(e) => {
            close(
                &mut socket,
                1011,
                &format!("the local agent does not answer: {e}"),
            )
            .await;
            return;
        }
    };
    let request = format!("ws://localhost{path_and_query}");
    let (mut upstream, _) = match tokio_tungstenite::client_async(request, stream).await {
        Ok(c) => c,
        Err(tungstenite::Error::Http(resp)) => {
            let body = resp.into_body().unwrap_or_default();
            close(&mut socket, 1008, &String::from_utf8_lossy(&body)).await;
            return;
        }
        Err(e) => {
            close(&mut socket, 1011, &format!("the local agent: {e}")).await;
            return;
        }
    };
    if let Some(m) = first
        && upstream.send(to_upstream(m)).await.is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            from_caller = socket.recv() => match from_caller {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    let _ = upstream.close(None).await;
                    return;
                }
                Some(Ok(m)) => {
                    if upstream.send(to_upstream(m)).await.is_err() {
                        return;
                    }
                }
            },
            from_agent = upstream.next() => match from_agent {
                Some(Ok(tungstenite::Message::Close(frame))) => {
                    let (code, reason) = frame
                        .map(|f| (u16::from(f.code), f.reason.to_string()))
                        .unwrap_or((1000, String::new()));
                    close(&mut socket, code, &reason).await;
                    return;
                }
                Some(Ok(m)) => {
                    if let Some(m) = from_upstream(m)
                        && socket.send(m).await.is_err()
                    {
                        let _ = upstream.close(None).await;
                        return;
                    }
                }
                Some(Err(_)) | None => {
                    close(&mut socket, 1011, "the local agent closed the exec").await;
                    return;
                }
            },
        }
    }
}

fn to_upstream(m: Message) -> tungstenite::Message {
    match m {
        Message::Text(t) => tungstenite::Message::Text(t.as_str().into()),
        Message::Binary(b) => tungstenite::Message::Binary(b),
        Message::Ping(p) => tungstenite::Message::Ping(p),
        Message::Pong(p) => tungstenite::Message::Pong(p),
        Message::Close(_) => tungstenite::Message::Close(None),
    }
}

fn from_upstream(m: tungstenite::Message) -> Option<Message> {
    match m {
        tungstenite::Message::Text(t) => Some(Message::Text(t.as_str().into())),
        tungstenite::Message::Binary(b) => Some(Message::Binary(b)),
        tungstenite::Message::Ping(p) => Some(Message::Ping(p)),
        tungstenite::Message::Pong(p) => Some(Message::Pong(p)),
        _ => None,
    }
}
