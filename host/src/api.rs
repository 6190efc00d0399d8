//! The agent's JSON HTTP API, served on a unix socket.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use drover_plugin_sdk::DriverError;
use serde::Deserialize;

use crate::catalog::Catalog;
use crate::tasks::{RunRequest, TaskManager};

/// What handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The plugin catalog.
    pub catalog: Arc<Catalog>,
    /// The task manager.
    pub tasks: Arc<TaskManager>,
}

/// An API error: a status code and `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl From<DriverError> for ApiError {
    fn from(e: DriverError) -> Self {
        let code = match &e {
            DriverError::InvalidConfig(_) => StatusCode::BAD_REQUEST,
            DriverError::NotFound(_) => StatusCode::NOT_FOUND,
            DriverError::AlreadyExists(_) | DriverError::FailedPrecondition(_) => {
                StatusCode::CONFLICT
            }
            DriverError::Unimplemented(_) => StatusCode::NOT_IMPLEMENTED,
            DriverError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            DriverError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
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
        .route("/v1/plugins", get(plugins))
        .route("/v1/tasks", get(list_tasks).post(run_task))
        .route("/v1/tasks/{id}", get(task_status).delete(destroy_task))
        .route("/v1/tasks/{id}/wait", get(wait_task))
        .route("/v1/tasks/{id}/stop", post(stop_task))
        .route("/v1/tasks/{id}/signal", post(signal_task))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such API endpoint".into()) })
        .with_state(state)
}

async fn health() -> ApiResult {
    ok(serde_json::json!({ "status": "ok" }))
}

async fn plugins(State(s): State<ApiState>) -> ApiResult {
    ok(s.catalog.status())
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StopBody {
    signal: Option<String>,
    timeout: Option<String>,
}

async fn stop_task(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let body: StopBody = if body.is_empty() {
        StopBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {e}"),
            )
        })?
    };
    let timeout = body
        .timeout
        .map(|t| {
            humantime::parse_duration(&t).map_err(|e| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("timeout {t:?} is not a duration: {e}"),
                )
            })
        })
        .transpose()?;
    ok(s.tasks.stop(&id, body.signal, timeout).await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalBody {
    signal: String,
}

async fn signal_task(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let body: SignalBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    ok(s.tasks.signal(&id, &body.signal).await?)
}

#[derive(Debug, Default, Deserialize)]
struct DestroyQuery {
    #[serde(default)]
    force: bool,
}

async fn destroy_task(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<DestroyQuery>,
) -> ApiResult {
    s.tasks.destroy(&id, q.force).await?;
    ok(serde_json::json!({ "id": id, "destroyed": true }))
}

/// Serve the API on `listener` until `stop` fires, then drain for up to `grace`.
pub async fn serve(
    listener: tokio::net::UnixListener,
    state: ApiState,
    stop: tokio_util::sync::CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    let server =
        axum::serve(listener, router(state)).with_graceful_shutdown(stop.clone().cancelled_owned());
    let handle = tokio::spawn(async move { server.await });
    stop.cancelled().await;
    match tokio::time::timeout(grace, handle).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) | Err(_) => Ok(()),
    }
}
