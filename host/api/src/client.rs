//! The typed client: one method per endpoint of the agent's API, over its unix socket.

use std::fmt;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client as HttpClient;
use hyperlocal::{UnixClientExt as _, UnixConnector};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::causes;
use crate::path::path;
use crate::{
    AgentHealth, DestroyQuery, Destroyed, Error, ErrorBody, Frame, FrameDecoder,
    LOG_FRAMES_CONTENT_TYPE, LogStream, LogsQuery, PluginStatus, ReloadReport, RunRequest,
    SignalRequest, StatsQuery, StatsView, StopRequest, TaskEventView, TaskView,
};

/// A client of one agent's API, over its unix socket (`<data_dir>/api.sock`).
///
/// Every method is one request. Task ids go into the path as one percent-encoded
/// segment each, so any id reaches the endpoint meant for it (and an unknown one gets
/// the agent's 404, [`Error::Status`]). Cloning is cheap and clones share their
/// connections.
///
/// ```no_run
/// # async fn example() -> Result<(), drover_api::Error> {
/// use drover_api::{Client, RunRequest, StopRequest};
///
/// let client = Client::new("/var/lib/drover/api.sock");
/// let task = client
///     .run_task(&RunRequest {
///         driver: "rawexec".into(),
///         config: serde_json::json!({"command": "/bin/sleep", "args": ["60"]}),
///         kill_timeout: Some(std::time::Duration::from_secs(2)),
///         ..Default::default()
///     })
///     .await?;
/// println!("{} is {:?}", task.id, task.state);
/// let stopped = client.stop_task(&task.id, &StopRequest::default()).await?;
/// println!("stopped: exit code {:?}, signal {:?}", stopped.exit_code, stopped.signal);
/// match client.get_task("no-such-task").await {
///     Err(e) if e.is_not_found() => println!("{e}"), // no task with id "no-such-task"
///     other => println!("{other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    socket: PathBuf,
    /// The URI authority hyperlocal's connector reads the socket path from.
    authority: String,
    http: HttpClient<UnixConnector, Full<Bytes>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// Which part of a task's log [`Client::task_logs`] sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogsOptions {
    /// stdout (default) or stderr.
    pub stream: LogStream,
    /// Keep the answer open and send output as it is written, until the task is dead.
    pub follow: bool,
    /// Start this many bytes after the beginning of the oldest log file present.
    pub offset: Option<u64>,
    /// Start at the last N lines. Not together with `offset` (the agent refuses both).
    pub tail: Option<u64>,
}

/// An answer as it came, for requests the typed methods cannot make: see
/// [`Client::get_raw`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `content-type` header, if any.
    pub content_type: Option<String>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The body as JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The agent's message, when the body is an [`ErrorBody`].
    pub fn error_message(&self) -> Option<String> {
        self.json::<ErrorBody>().ok().map(|b| b.error)
    }
}

/// A request: method and path (for messages too), query and body.
struct Call {
    method: Method,
    path: String,
    query: Option<String>,
    body: Option<Vec<u8>>,
}

impl Call {
    fn get(segments: &[&str]) -> Call {
        Call {
            method: Method::GET,
            path: path(segments),
            query: None,
            body: None,
        }
    }

    fn with_method(mut self, method: Method) -> Call {
        self.method = method;
        self
    }

    fn query(mut self, query: &impl Serialize) -> Result<Call, Error> {
        let q = serde_urlencoded::to_string(query)
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the query: {e}")))?;
        self.query = (!q.is_empty()).then_some(q);
        Ok(self)
    }

    fn json(mut self, body: &impl Serialize) -> Result<Call, Error> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the request body: {e}")))?;
        self.body = Some(bytes);
        Ok(self)
    }

    /// `GET /v1/tasks/x`, for messages.
    fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// `id` checked for use as a path segment.
fn task_id(id: &str) -> Result<&str, Error> {
    if id.is_empty() {
        return Err(Error::InvalidRequest("the task id is empty".into()));
    }
    Ok(id)
}

impl Client {
    /// A client for the agent whose API socket is `socket`. Nothing is connected
    /// until the first call.
    pub fn new(socket: impl Into<PathBuf>) -> Client {
        let socket = socket.into();
        let authority = format!("{}:0", hex::encode(socket.as_os_str().as_bytes()));
        Client {
            socket,
            authority,
            http: HttpClient::unix(),
        }
    }

    /// The agent's API socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /v1/agent/health`: the agent answers, and whether start-up task recovery
    /// has finished.
    pub async fn health(&self) -> Result<AgentHealth, Error> {
        self.json(Call::get(&["v1", "agent", "health"]), StatusCode::OK)
            .await
    }

    /// `GET /v1/plugins`: every plugin binary the agent saw, and its state.
    pub async fn plugins(&self) -> Result<Vec<PluginStatus>, Error> {
        self.json(Call::get(&["v1", "plugins"]), StatusCode::OK)
            .await
    }

    /// `POST /v1/plugins/reload`: bring the plugins in line with `plugin_dir` now (add,
    /// upgrade, remove; what the agent's watcher does by itself unless
    /// `watch_plugin_dir = false`). A file that fails is a change of kind `failed`
    /// with its reason, not an error.
    pub async fn reload_plugins(&self) -> Result<ReloadReport, Error> {
        let call = Call::get(&["v1", "plugins", "reload"]).with_method(Method::POST);
        self.json(call, StatusCode::OK).await
    }

    /// `GET /v1/tasks`: every task, newest first.
    pub async fn list_tasks(&self) -> Result<Vec<TaskView>, Error> {
        self.json(Call::get(&["v1", "tasks"]), StatusCode::OK).await
    }

    /// `GET /v1/tasks/{id}`: one task.
    pub async fn get_task(&self, id: &str) -> Result<TaskView, Error> {
        self.json(Call::get(&["v1", "tasks", task_id(id)?]), StatusCode::OK)
            .await
    }

    /// `POST /v1/tasks`: validate and start a task. Returns it once its driver
    /// started it (or refused: then nothing is left behind).
    pub async fn run_task(&self, request: &RunRequest) -> Result<TaskView, Error> {
        let call = Call::get(&["v1", "tasks"])
            .with_method(Method::POST)
            .json(request)?;
        self.json(call, StatusCode::CREATED).await
    }

    /// `GET /v1/tasks/{id}/wait`: wait until the task is dead (restarts included),
    /// then return it. There is no time limit.
    pub async fn wait_task(&self, id: &str) -> Result<TaskView, Error> {
        self.json(
            Call::get(&["v1", "tasks", task_id(id)?, "wait"]),
            StatusCode::OK,
        )
        .await
    }

    /// `POST /v1/tasks/{id}/stop`: stop a task for good (its kill signal, then SIGKILL
    /// after its kill timeout; `request` may override both). Returns once it is dead.
    pub async fn stop_task(&self, id: &str, request: &StopRequest) -> Result<TaskView, Error> {
        let call = Call::get(&["v1", "tasks", task_id(id)?, "stop"])
            .with_method(Method::POST)
            .json(request)?;
        self.json(call, StatusCode::OK).await
    }

    /// `POST /v1/tasks/{id}/signal`: send `signal` (e.g. `SIGHUP`) to a running task.
    pub async fn signal_task(&self, id: &str, signal: &str) -> Result<TaskView, Error> {
        let call = Call::get(&["v1", "tasks", task_id(id)?, "signal"])
            .with_method(Method::POST)
            .json(&SignalRequest {
                signal: signal.to_owned(),
            })?;
        self.json(call, StatusCode::OK).await
    }

    /// `DELETE /v1/tasks/{id}`: forget a dead task, or with `force` a running one,
    /// killing it.
    pub async fn destroy_task(&self, id: &str, force: bool) -> Result<Destroyed, Error> {
        let call = Call::get(&["v1", "tasks", task_id(id)?])
            .with_method(Method::DELETE)
            .query(&DestroyQuery { force })?;
        self.json(call, StatusCode::OK).await
    }

    /// `GET /v1/tasks/{id}/events`: what happened to the task, oldest first.
    pub async fn task_events(&self, id: &str) -> Result<Vec<TaskEventView>, Error> {
        self.json(
            Call::get(&["v1", "tasks", task_id(id)?, "events"]),
            StatusCode::OK,
        )
        .await
    }

    /// `GET /v1/tasks/{id}/stats`: one resource usage sample of a running task (CPU
    /// over half a second).
    pub async fn task_stats(&self, id: &str) -> Result<StatsView, Error> {
        self.json(
            Call::get(&["v1", "tasks", task_id(id)?, "stats"]),
            StatusCode::OK,
        )
        .await
    }

    /// `GET /v1/tasks/{id}/stats?follow=true`: a sample every `interval` (default 1s,
    /// at least 100ms) until the task is dead.
    pub async fn follow_task_stats(
        &self,
        id: &str,
        interval: Option<Duration>,
    ) -> Result<StatsStream, Error> {
        let call = Call::get(&["v1", "tasks", task_id(id)?, "stats"]).query(&StatsQuery {
            follow: true,
            interval,
        })?;
        let request = call.describe();
        let body = self.stream(call, None).await?;
        Ok(StatsStream {
            request,
            body,
            pending: Vec::new(),
            done: false,
        })
    }

    /// `GET /v1/tasks/{id}/logs?framed=true`: the task's stdout or stderr, oldest
    /// file first, as [`Frame`]s. Ends at the end of the log (with
    /// [`LogsOptions::follow`], once the task is dead and all was sent).
    pub async fn task_logs(&self, id: &str, options: &LogsOptions) -> Result<LogFrames, Error> {
        let call = Call::get(&["v1", "tasks", task_id(id)?, "logs"]).query(&LogsQuery {
            stream: options.stream,
            follow: options.follow,
            offset: options.offset,
            tail: options.tail,
            framed: true,
        })?;
        let request = call.describe();
        let body = self.stream(call, Some(LOG_FRAMES_CONTENT_TYPE)).await?;
        Ok(LogFrames {
            request,
            body,
            decoder: FrameDecoder::default(),
            done: false,
        })
    }

    /// `GET` an endpoint with a query the typed methods cannot send — a stream name or
    /// duration the agent must refuse, say — and return the answer whatever its
    /// status. The path is given as segments (`["v1", "tasks", id, "logs"]`), each
    /// encoded like a task id; the query pairs are form-encoded. Meant for tests of
    /// the agent's own checks; everything else has a typed method.
    pub async fn get_raw(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<RawResponse, Error> {
        let call = Call::get(segments).query(&query)?;
        let request = call.describe();
        let resp = self.send(call).await?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_body(&request, resp.into_body()).await?;
        Ok(RawResponse {
            status,
            content_type,
            body: body.to_vec(),
        })
    }

    fn uri(&self, call: &Call) -> Result<Uri, Error> {
        let path_and_query = match &call.query {
            Some(q) => format!("{}?{q}", call.path),
            None => call.path.clone(),
        };
        Uri::builder()
            .scheme("unix")
            .authority(self.authority.as_str())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| {
                Error::InvalidRequest(format!(
                    "no request URI for {} on socket {}: {e}",
                    call.describe(),
                    self.socket.display()
                ))
            })
    }

    async fn send(&self, call: Call) -> Result<Response<Incoming>, Error> {
        let uri = self.uri(&call)?;
        let mut request = Request::builder().method(call.method.clone()).uri(uri);
        if call.body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(call.body.unwrap_or_default())))
            .map_err(|e| Error::InvalidRequest(format!("{e}")))?;
        self.http.request(request).await.map_err(|e| {
            let reason = causes(&e);
            if e.is_connect() {
                Error::Connect {
                    socket: self.socket.clone(),
                    reason,
                }
            } else {
                Error::Request {
                    socket: self.socket.clone(),
                    reason,
                }
            }
        })
    }

    /// Send `call`; the JSON body of an answer with status `expected`, else an error.
    async fn json<T: DeserializeOwned>(
        &self,
        call: Call,
        expected: StatusCode,
    ) -> Result<T, Error> {
        let request = call.describe();
        let resp = self.send(call).await?;
        let status = resp.status();
        let body = read_body(&request, resp.into_body()).await?;
        if status != expected {
            return Err(refusal(&request, status, expected, &body));
        }
        serde_json::from_slice(&body).map_err(|source| Error::Decode { request, source })
    }

    /// Send `call` whose answer is a stream: its body once the status is 200 (and the
    /// content type `content_type`, if given).
    async fn stream(&self, call: Call, content_type: Option<&str>) -> Result<Incoming, Error> {
        let request = call.describe();
        let resp = self.send(call).await?;
        let status = resp.status();
        if status != StatusCode::OK {
            let body = read_body(&request, resp.into_body()).await?;
            return Err(refusal(&request, status, StatusCode::OK, &body));
        }
        if let Some(want) = content_type {
            let got = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if got != want {
                return Err(Error::Protocol {
                    request,
                    detail: format!("content type {got:?}, expected {want:?}"),
                });
            }
        }
        Ok(resp.into_body())
    }
}

async fn read_body(request: &str, body: Incoming) -> Result<Bytes, Error> {
    body.collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| Error::Body {
            request: request.to_owned(),
            reason: causes(&e),
        })
}

/// The error for an answer with status `status` where `expected` was due.
fn refusal(request: &str, status: StatusCode, expected: StatusCode, body: &[u8]) -> Error {
    if status.is_success() {
        return Error::Protocol {
            request: request.to_owned(),
            detail: format!("status {status}, expected {expected}"),
        };
    }
    let message = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => b.error,
        Err(_) => {
            let text = String::from_utf8_lossy(body).trim().to_owned();
            if text.is_empty() {
                format!("the agent answered {status} to {request}")
            } else {
                text
            }
        }
    };
    Error::Status { status, message }
}

/// The next piece of a streamed body; `None` at its end.
async fn next_bytes(request: &str, body: &mut Incoming) -> Result<Option<Bytes>, Error> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => {
                return Err(Error::Body {
                    request: request.to_owned(),
                    reason: causes(&e),
                });
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A task's log as it arrives, from [`Client::task_logs`].
#[derive(Debug)]
pub struct LogFrames {
    request: String,
    body: Incoming,
    decoder: FrameDecoder,
    done: bool,
}

impl LogFrames {
    /// The next frame: [`Frame::Data`] (log bytes) or [`Frame::Skipped`] (files
    /// removed by rotation before they were read; show
    /// [`skipped_notice`](crate::skipped_notice)); `Ok(None)` at the end of the log.
    /// An error the agent reports in the stream ([`Frame::Error`]) ends it as
    /// [`Error::Stream`].
    pub async fn next(&mut self) -> Result<Option<Frame>, Error> {
        loop {
            let frame = self.decoder.next_frame().map_err(|e| Error::Protocol {
                request: self.request.clone(),
                detail: e.to_string(),
            })?;
            match frame {
                Some(Frame::Error(message)) => {
                    self.done = true;
                    return Err(Error::Stream(message));
                }
                Some(frame) => return Ok(Some(frame)),
                None if self.done => return Ok(None),
                None => {}
            }
            match next_bytes(&self.request, &mut self.body).await? {
                Some(bytes) => self.decoder.push(&bytes),
                None => {
                    self.done = true;
                    if self.decoder.has_partial() {
                        return Err(Error::Protocol {
                            request: self.request.clone(),
                            detail: "the log stream ended in the middle of a frame".into(),
                        });
                    }
                }
            }
        }
    }
}

/// Samples as they arrive, from [`Client::follow_task_stats`].
#[derive(Debug)]
pub struct StatsStream {
    request: String,
    body: Incoming,
    pending: Vec<u8>,
    done: bool,
}

impl StatsStream {
    /// The next sample; `Ok(None)` once the task is dead. An error the agent reports
    /// in the stream ends it as [`Error::Stream`].
    pub async fn next(&mut self) -> Result<Option<StatsView>, Error> {
        loop {
            if let Some(nl) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=nl).collect();
                if let Some(sample) = self.line(&line)? {
                    return Ok(Some(sample));
                }
                continue;
            }
            if self.done {
                // A last line without its newline still counts.
                let rest = std::mem::take(&mut self.pending);
                return self.line(&rest);
            }
            match next_bytes(&self.request, &mut self.body).await? {
                Some(bytes) => self.pending.extend_from_slice(&bytes),
                None => self.done = true,
            }
        }
    }

    fn line(&mut self, line: &[u8]) -> Result<Option<StatsView>, Error> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if let Ok(ErrorBody { error }) = serde_json::from_slice(line) {
            self.done = true;
            self.pending.clear();
            return Err(Error::Stream(error));
        }
        serde_json::from_slice(line)
            .map(Some)
            .map_err(|source| Error::Decode {
                request: self.request.clone(),
                source,
            })
    }
}
