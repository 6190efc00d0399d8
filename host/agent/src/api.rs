//! The agent's JSON HTTP API, served on a unix socket.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use drover_plugin_sdk::DriverError;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use drover_api::{
    AgentHealth, DestroyQuery, Destroyed, ErrorBody, Frame, HealthStatus, LOG_FRAMES_CONTENT_TYPE,
    LogStream, LogsQuery, RunRequest, SignalRequest, StatsQuery, StatsView, StopRequest,
    TaskLifecycle, TaskView,
};

use crate::allocs::AllocManager;
use crate::cluster::forward::Forwarder;
use crate::limits::{CapError, LimitedListener, StreamCaps};
use crate::logs::{FollowOptions, LogChunk, LogStart};
use crate::plugins::catalog::{Catalog, LoadedPlugin};
use crate::tasks::TaskManager;
use drover_api::PluginState;

/// What handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The plugin catalog.
    pub catalog: Arc<Catalog>,
    /// The task manager.
    pub tasks: Arc<TaskManager>,
    /// Caps on `logs -f` and `stats -f` streams.
    pub streams: Arc<StreamCaps>,
    /// The allocations this node runs, when it is a cluster client: `alloc logs`
    /// answers from their tasks' logs.
    pub allocs: Option<Arc<AllocManager>>,
    /// Forwards the cluster API (`/v1/jobs`, `/v1/nodes`, ...) to the servers, when
    /// the agent has any.
    pub forward: Option<Arc<Forwarder>>,
}

/// An API error: a status code and `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError(pub(crate) StatusCode, pub(crate) String);

impl From<DriverError> for ApiError {
    fn from(e: DriverError) -> Self {
        let code = match &e {
            DriverError::InvalidConfig(_) => StatusCode::BAD_REQUEST,
            DriverError::NotFound(_) => StatusCode::NOT_FOUND,
            DriverError::AlreadyExists(_) | DriverError::FailedPrecondition(_) => {
                StatusCode::CONFLICT
            }
            DriverError::Unimplemented(_) => StatusCode::NOT_IMPLEMENTED,
            DriverError::Unavailable(_) | DriverError::Transport(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            DriverError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl From<CapError> for ApiError {
    fn from(e: CapError) -> Self {
        let code = match &e {
            // The agent as a whole is busy: any client may get in once a stream ends.
            CapError::Agent { .. } => StatusCode::SERVICE_UNAVAILABLE,
            // This task has many followers already: a limit on the caller's request.
            _ => StatusCode::TOO_MANY_REQUESTS,
        };
        ApiError(code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(Json(value).into_response())
}

/// Build the router.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/agent/health", get(health))
        .route("/v1/metrics", get(metrics))
        .route("/v1/plugins", get(plugins))
        .route("/v1/plugins/reload", post(reload_plugins))
        .route("/v1/tasks", get(list_tasks).post(run_task))
        .route("/v1/tasks/{id}", get(task_status).delete(destroy_task))
        .route("/v1/tasks/{id}/wait", get(wait_task))
        .route("/v1/tasks/{id}/stop", post(stop_task))
        .route("/v1/tasks/{id}/signal", post(signal_task))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/tasks/{id}/logs", get(task_logs))
        .route("/v1/tasks/{id}/stats", get(task_stats))
        // Nomad's client endpoints: `/v1/client/fs/logs/{alloc}`, `.../allocation/{alloc}/stats`.
        .merge(crate::client_api::routes())
        .fallback(cluster_api)
        .with_state(state)
}

/// Everything that is not the agent's own: the cluster API, forwarded to a server
/// when the agent is a cluster client.
async fn cluster_api(State(s): State<ApiState>, req: axum::extract::Request) -> Response {
    match &s.forward {
        Some(f) if req.uri().path().starts_with("/v1/") => f.forward(req).await,
        None if req.uri().path().starts_with("/v1/")
            && !req.uri().path().starts_with("/v1/tasks") =>
        {
            ApiError(
                StatusCode::NOT_FOUND,
                format!(
                    "no such API endpoint: {} is the cluster API, and this agent has no servers \
                     (start it with --servers or --dev, or give --address http://SERVER:PORT)",
                    req.uri().path()
                ),
            )
            .into_response()
        }
        _ => ApiError(StatusCode::NOT_FOUND, "no such API endpoint".into()).into_response(),
    }
}

/// Liveness, plus whether start-up task recovery has finished (`recovery` is null
/// until then) — what an operator or a script waits for after an agent restart.
async fn health(State(s): State<ApiState>) -> ApiResult {
    ok(AgentHealth {
        status: HealthStatus::Ok,
        recovery: s.tasks.recovery(),
    })
}

/// `GET /v1/metrics`: the agent's own metrics (never forwarded to the servers; see
/// `drover_metrics` for the formats). `allocations=false` leaves out the series per
/// allocation task (what a public exposition must not show: ids and task names of
/// every namespace).
async fn metrics(
    State(s): State<ApiState>,
    headers: axum::http::HeaderMap,
    query: Result<Query<std::collections::HashMap<String, String>>, QueryRejection>,
) -> ApiResult {
    let Query(q) = query.map_err(bad_query)?;
    let format = q.get("format");
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = drover_metrics::Format::negotiate(format.map(String::as_str), accept)
        .map_err(|why| ApiError(StatusCode::BAD_REQUEST, why))?;
    let allocations = q.get("allocations").is_none_or(|v| v != "false");
    let families = crate::metrics::families(&s, allocations).await;
    Ok((
        [(header::CONTENT_TYPE, format.content_type())],
        drover_metrics::render(&families, format),
    )
        .into_response())
}

async fn plugins(State(s): State<ApiState>) -> ApiResult {
    ok(s.catalog.status())
}

/// Rescan `plugin_dir` and apply what changed; failures are rows, not errors.
async fn reload_plugins(State(s): State<ApiState>) -> ApiResult {
    // In a task of its own: a client that goes away must not cut an upgrade short
    // between the swap and the old instance's shutdown.
    let catalog = s.catalog.clone();
    let changes = tokio::spawn(async move { catalog.reload(true).await })
        .await
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reload failed: {e}"),
            )
        })?;
    ok(drover_api::ReloadReport {
        changes,
        plugins: s.catalog.status(),
    })
}

async fn list_tasks(State(s): State<ApiState>) -> ApiResult {
    ok(s.tasks.list())
}

async fn run_task(State(s): State<ApiState>, body: axum::body::Bytes) -> ApiResult {
    let req: RunRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    let view = s.tasks.run(req).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn task_status(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult {
    ok(s.tasks.status(&id)?)
}

async fn wait_task(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult {
    ok(s.tasks.wait(&id).await?)
}

async fn stop_task(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let body: StopRequest = if body.is_empty() {
        StopRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {e}"),
            )
        })?
    };
    ok(s.tasks.stop(&id, body.signal, body.timeout).await?)
}

async fn signal_task(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let body: SignalRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    ok(s.tasks.signal(&id, &body.signal).await?)
}

async fn destroy_task(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<DestroyQuery>,
) -> ApiResult {
    s.tasks.destroy(&id, q.force).await?;
    ok(Destroyed {
        id,
        destroyed: true,
    })
}

async fn task_events(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult {
    ok(s.tasks.status(&id)?.events)
}

fn bad_query(e: QueryRejection) -> ApiError {
    ApiError(
        StatusCode::BAD_REQUEST,
        format!("invalid query: {}", e.body_text()),
    )
}

/// `GET /v1/tasks/{id}/logs`: the task's stdout or stderr, oldest file first. Plain
/// bytes by default, with a line `[drover: skipped N files removed by rotation]` where
/// rotation deleted files before they were read; framed on request.
async fn task_logs(
    State(s): State<ApiState>,
    stop: Option<Extension<CancellationToken>>,
    Path(id): Path<String>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = query.map_err(bad_query)?;
    logs_response(&s, stop, id, q)
}

/// A task's log as `GET /v1/tasks/{id}/logs` answers it.
fn logs_response(
    s: &ApiState,
    stop: Option<Extension<CancellationToken>>,
    id: String,
    q: LogsQuery,
) -> ApiResult {
    let start = match (q.offset, q.tail) {
        (Some(_), Some(_)) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give offset or tail, not both".into(),
            ));
        }
        (Some(n), None) => LogStart::Offset(n),
        (None, Some(n)) => LogStart::Tail(n),
        (None, None) => LogStart::Beginning,
    };
    let view = s.tasks.status(&id)?;
    // Held by the response body: the follower counts until its client goes away.
    let permit = if q.follow {
        Some(s.streams.logs.acquire(&id)?)
    } else {
        None
    };
    let base = view.task_dir.join("logs").join(match q.stream {
        LogStream::Stdout => "stdout",
        LogStream::Stderr => "stderr",
    });
    let tasks = s.tasks.clone();
    let dead = async move {
        let _ = tasks.wait(&id).await;
    };
    let options = FollowOptions {
        follow: q.follow,
        ..Default::default()
    };
    let stop = stop.map(|Extension(t)| t).unwrap_or_default();
    let chunks = crate::logs::stream(base, start, options, dead, stop);
    let framed = q.framed;
    let body = tokio_stream::wrappers::ReceiverStream::new(chunks).map(move |chunk| {
        let _counted = &permit;
        let bytes = match (chunk, framed) {
            (Ok(LogChunk::Data(d)), false) => d,
            (Ok(LogChunk::Data(d)), true) => Frame::Data(d).encode(),
            (Ok(LogChunk::Skipped(n)), false) => {
                format!("{}\n", drover_api::skipped_notice(n)).into_bytes()
            }
            (Ok(LogChunk::Skipped(n)), true) => Frame::Skipped(n).encode(),
            (Err(e), false) => return Err(e),
            (Err(e), true) => Frame::Error(e.to_string()).encode(),
        };
        Ok::<_, std::io::Error>(axum::body::Bytes::from(bytes))
    });
    let content_type = if framed {
        LOG_FRAMES_CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// One sample of the driver's as the API shows it.
fn stats_view(task_id: &str, s: &drover_plugin_sdk::TaskStats) -> StatsView {
    StatsView {
        task_id: task_id.to_owned(),
        time: humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
        cpu_percent: s.cpu_percent,
        cpu_user_seconds: s.cpu_user.as_secs_f64(),
        cpu_system_seconds: s.cpu_system.as_secs_f64(),
        memory_rss_bytes: s.memory_rss_bytes,
        memory_cache_bytes: s.memory_cache_bytes,
        process_count: s.process_count,
    }
}

/// The driver of a task that can answer now: 409 for a dead task, 503 when its
/// driver is not loaded or not healthy.
pub(crate) fn live_driver(s: &ApiState, view: &TaskView) -> Result<Arc<LoadedPlugin>, ApiError> {
    if view.state == TaskLifecycle::Dead {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("task {} is not running (it is dead)", view.id),
        ));
    }
    let plugin = s.catalog.driver_named(&view.driver).ok_or_else(|| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("driver {:?} is not loaded", view.driver),
        )
    })?;
    let (state, reason) = plugin.state();
    if state != PluginState::Healthy {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("driver {:?} is {state:?}: {reason}", view.driver),
        ));
    }
    Ok(plugin)
}

/// Interval of the two samples a single `stats` answer is computed from: the driver
/// reports CPU use since its previous sample, so one sample alone says little.
pub(crate) const ONE_SHOT_INTERVAL: Duration = Duration::from_millis(500);

/// `GET /v1/tasks/{id}/stats`: one sample (CPU % over half a second), or with
/// `follow=true` a JSON line per `interval` until the task is dead.
async fn task_stats(
    State(s): State<ApiState>,
    stop: Option<Extension<CancellationToken>>,
    Path(id): Path<String>,
    query: Result<Query<StatsQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = query.map_err(bad_query)?;
    let interval = q
        .interval
        .unwrap_or(Duration::from_secs(1))
        .max(Duration::from_millis(100));
    let view = s.tasks.status(&id)?;
    let plugin = live_driver(&s, &view)?;
    if !q.follow {
        // Bounded: a wedged plugin must not hold the request forever.
        let bound = Duration::from_secs(10);
        let first = tokio::time::timeout(bound, async {
            let mut samples = plugin.client().task_stats(&id, ONE_SHOT_INTERVAL).await?;
            match samples.next().await {
                Some(r) => r.map(|first| (first, samples)),
                None => Err(DriverError::Internal("the driver sent no sample".into())),
            }
        })
        .await
        .map_err(|_| {
            DriverError::Timeout(format!(
                "driver {} gave no stats for task {id} within {bound:?}",
                view.driver
            ))
        })?;
        let (first, mut samples) = first?;
        let second = tokio::time::timeout(ONE_SHOT_INTERVAL * 4, samples.next()).await;
        let sample = match second {
            Ok(Some(Ok(s))) => s,
            // The task ended meanwhile, or the driver is slow: the first sample it is.
            _ => first,
        };
        return ok(stats_view(&id, &sample));
    }
    let permit = s.streams.stats.acquire(&id)?;
    let mut samples = plugin.client().task_stats(&id, interval).await?;
    let stop = stop.map(|Extension(t)| t).unwrap_or_default();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(4);
    let tasks = s.tasks.clone();
    tokio::spawn(async move {
        let _counted = permit;
        loop {
            let next = tokio::select! {
                n = samples.next() => n,
                () = stop.cancelled() => return,
                () = tx.closed() => return,
            };
            let line = match next {
                None => return,
                Some(Ok(sample)) => serde_json::to_value(stats_view(&id, &sample)),
                Some(Err(e)) => {
                    // A task that exited ends the stream; anything else is reported.
                    // The driver may notice the exit a moment before the task manager.
                    let ended =
                        tokio::time::timeout(Duration::from_secs(10), tasks.wait(&id)).await;
                    if matches!(ended, Ok(Ok(v)) if v.state == TaskLifecycle::Dead) {
                        return;
                    }
                    serde_json::to_value(ErrorBody {
                        error: e.to_string(),
                    })
                }
            };
            let Ok(line) = line else { return };
            let is_error = line.get("error").is_some();
            let mut bytes = line.to_string().into_bytes();
            bytes.push(b'\n');
            if tx.send(Ok(bytes.into())).await.is_err() || is_error {
                return;
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response())
}

/// Serve the API on `listener` until `stop` fires, then drain for up to `grace`, with
/// at most `max_connections` connections at once.
///
/// A connection that has not sent a whole request head within `header_read_timeout`
/// (counted from when the agent starts waiting for one: on accept, and again after
/// each answer on a kept-alive connection) is closed. Without that, idle connections
/// would hold every `max_connections` slot for ever and lock every later client out,
/// the operator's `drover task stop` included. The timeout covers only reading a
/// request head: a long answer (`logs -f`, `stats -f`, `task wait`) is not cut.
pub async fn serve(
    listener: tokio::net::UnixListener,
    max_connections: usize,
    header_read_timeout: Duration,
    state: ApiState,
    stop: tokio_util::sync::CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    // Streaming answers (`logs -f`, `stats -f`) end when `stop` fires, so that the
    // graceful shutdown does not wait for them.
    let app = router(state).layer(Extension(stop.clone()));
    let mut listener = LimitedListener::new(listener, max_connections);
    // Not `axum::serve`: it builds hyper's connection without a timer, and without one
    // hyper never enforces `header_read_timeout`.
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    // Each connection's task holds a clone of `open`; once all are dropped, `drained`
    // reports that every connection closed.
    let (open, mut drained) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (io, _) = tokio::select! {
            conn = axum::serve::Listener::accept(&mut listener) => conn,
            () = stop.cancelled() => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        // With upgrades: `alloc exec` is a WebSocket.
        let conn = http
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .with_upgrades();
        let stop = stop.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let _open = open;
            let mut conn = std::pin::pin!(conn);
            let done = tokio::select! {
                r = conn.as_mut() => Some(r),
                () = stop.cancelled() => None,
            };
            let r = match done {
                Some(r) => r,
                None => {
                    // Finish the request in flight, if any, then close; an idle
                    // connection closes at once.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                if e.is_timeout() {
                    tracing::debug!(
                        "closed an API connection that sent no request within \
                         limits.header_read_timeout"
                    );
                } else {
                    tracing::debug!(error = %e, "API connection ended with an error");
                }
            }
        });
    }
    // No new connections; the socket's backlog is dropped with the listener.
    drop(listener);
    drop(open);
    let _ = tokio::time::timeout(grace, drained.recv()).await;
    Ok(())
}
