//! Nomad's client endpoints for the allocations this node runs, in Nomad 1.0's shape
//! ([`drover_server_api::client_fs`]):
//!
//! - `GET /v1/client/fs/logs/{alloc}?task=T&type=stdout|stderr&follow=&origin=&offset=&plain=`
//! - `GET /v1/client/allocation/{alloc}/stats`
//! - `GET /v1/client/fs/{ls,stat,cat,readat,stream}/{alloc}?path=...` ([`fs`])
//! - `GET /v1/client/allocation/{alloc}/exec?task=&command=&tty=` (WebSocket, [`exec`])
//!
//! An allocation of another node is the servers' to place: the request is forwarded,
//! and the server says which node has it. Errors are Nomad's: a status code and a line
//! of plain text.
//!
//! Logs are read as `GET /v1/tasks/{id}/logs` reads them (`crate::logs`): relative to
//! the log directory's descriptor, never through a link the task planted.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use drover_api::TaskLifecycle;
use drover_server_api::client_fs::{
    AllocResourceUsage, CpuStats, FILE_EVENT_ERROR, FILE_EVENT_SKIPPED, MAX_FRAME_DATA,
    MemoryStats, ResourceUsage, StreamFrame, TaskResourceUsage,
};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiError, ApiState};
use crate::logs::{FilePosition, FollowOptions, LogChunk, LogStart};

/// How long a framed log stream stays silent before it sends a heartbeat (`{}`), as
/// Nomad's: a client that went away is noticed at the next write.
const HEARTBEAT: Duration = Duration::from_secs(1);

mod exec;
mod fs;

/// The routes, merged into the agent's API.
pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/client/fs/logs/{alloc}", get(alloc_logs))
        .route("/v1/client/allocation/{alloc}/stats", get(alloc_stats))
        .route("/v1/client/allocation/{alloc}/exec", get(exec::alloc_exec))
        .merge(fs::routes())
}

/// A Nomad error: a status and a line of plain text.
#[derive(Debug)]
struct NomadError(StatusCode, String);

impl IntoResponse for NomadError {
    fn into_response(self) -> Response {
        (
            self.0,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.1,
        )
            .into_response()
    }
}

impl From<ApiError> for NomadError {
    fn from(e: ApiError) -> Self {
        NomadError(e.0, e.1)
    }
}

impl From<drover_plugin_sdk::DriverError> for NomadError {
    fn from(e: drover_plugin_sdk::DriverError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<crate::limits::CapError> for NomadError {
    fn from(e: crate::limits::CapError) -> Self {
        ApiError::from(e).into()
    }
}

fn bad_request(message: impl Into<String>) -> NomadError {
    NomadError(StatusCode::BAD_REQUEST, message.into())
}

/// Go's `strconv.ParseBool`, which Nomad parses `follow` and `plain` with (python-nomad
/// sends `False`).
fn parse_bool(field: &str, value: Option<&String>) -> Result<bool, NomadError> {
    match value.map(String::as_str) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(other) => Err(bad_request(format!(
            "failed to parse {field} field to boolean: {other:?} is not a boolean"
        ))),
    }
}

/// A non-negative integer parameter (Nomad's `offset`, `limit`), if given.
fn int_param(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, NomadError> {
    match q.get(name).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(text) => {
            let n: i64 = text
                .parse()
                .map_err(|e| bad_request(format!("error parsing {name} {text:?}: {e}")))?;
            u64::try_from(n)
                .map(Some)
                .map_err(|_| bad_request(format!("error parsing {name}: {n} is negative")))
        }
    }
}

/// The parameters of a logs request, checked in Nomad's order.
#[derive(Debug, PartialEq, Eq)]
struct LogsRequest {
    task: String,
    stderr: bool,
    follow: bool,
    plain: bool,
    start: LogStart,
}

impl LogsRequest {
    fn parse(q: &HashMap<String, String>) -> Result<LogsRequest, NomadError> {
        let task = match q.get("task") {
            Some(t) if !t.is_empty() => t.clone(),
            _ => return Err(bad_request("must provide task name")),
        };
        let follow = parse_bool("follow", q.get("follow"))?;
        let plain = parse_bool("plain", q.get("plain"))?;
        let stderr = match q.get("type").map(String::as_str) {
            Some("stdout") => false,
            Some("stderr") => true,
            _ => return Err(bad_request("must provide log type (stdout/stderr)")),
        };
        let offset = int_param(q, "offset")?.unwrap_or(0);
        let start = match q.get("origin").map(String::as_str) {
            None | Some("" | "start") if offset == 0 => LogStart::Beginning,
            None | Some("" | "start") => LogStart::Offset(offset),
            Some("end") => LogStart::FromEnd(offset),
            Some(_) => return Err(bad_request("origin must be start or end")),
        };
        Ok(LogsRequest {
            task,
            stderr,
            follow,
            plain,
            start,
        })
    }
}

/// Nomad's answer for an allocation that is not known.
fn unknown_allocation(alloc: &str) -> NomadError {
    NomadError(
        StatusCode::NOT_FOUND,
        format!("Unknown allocation {alloc:?}"),
    )
}

/// `GET /v1/client/fs/logs/{alloc}`: a task's stdout or stderr, oldest file first;
/// Nomad's JSON frames, or the raw bytes with `plain=true`. With `follow=true`, output
/// as it is written, until the client goes or the task is dead and all was read.
async fn alloc_logs(
    State(s): State<ApiState>,
    stop: Option<Extension<CancellationToken>>,
    Path(alloc): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    req: axum::extract::Request,
) -> Response {
    match logs_response(&s, stop, &alloc, &q).await {
        Ok(r) => r,
        Err(Elsewhere) => match &s.forward {
            Some(f) => f.forward(req).await,
            None => unknown_allocation(&alloc).into_response(),
        },
    }
}

/// The allocation is not on this node.
struct Elsewhere;

async fn logs_response(
    s: &ApiState,
    stop: Option<Extension<CancellationToken>>,
    alloc: &str,
    q: &HashMap<String, String>,
) -> Result<Response, Elsewhere> {
    let request = match LogsRequest::parse(q) {
        Ok(r) => r,
        Err(e) => return Ok(e.into_response()),
    };
    let Some(allocs) = &s.allocs else {
        return Err(Elsewhere);
    };
    let Some(task_ids) = allocs.task_ids(alloc) else {
        return Err(Elsewhere);
    };
    let Some(task_id) = task_ids.get(&request.task).cloned() else {
        let e = if allocs.has_task(alloc, &request.task) {
            not_started(&request.task)
        } else {
            bad_request(format!("unknown task name {:?}", request.task))
        };
        return Ok(e.into_response());
    };
    // Its id is given before the task manager has it: not started yet, all the same.
    if s.tasks.status(&task_id).is_err() {
        return Ok(not_started(&request.task).into_response());
    }
    Ok(stream_logs(s, stop, task_id, request).unwrap_or_else(IntoResponse::into_response))
}

/// Nomad's answer for the logs of a task that has not started.
fn not_started(task: &str) -> NomadError {
    NomadError(
        StatusCode::NOT_FOUND,
        format!("task {task:?} not started yet. No logs available"),
    )
}

fn stream_logs(
    s: &ApiState,
    stop: Option<Extension<CancellationToken>>,
    task_id: String,
    request: LogsRequest,
) -> Result<Response, NomadError> {
    let view = s.tasks.status(&task_id)?;
    // Held by the body's task: the follower counts until its client goes away.
    let permit = if request.follow {
        Some(s.streams.logs.acquire(&task_id)?)
    } else {
        None
    };
    let stream_name = if request.stderr { "stderr" } else { "stdout" };
    let base = view.task_dir.join("logs").join(stream_name);
    let tasks = s.tasks.clone();
    let dead = async move {
        let _ = tasks.wait(&task_id).await;
    };
    let options = FollowOptions {
        follow: request.follow,
        ..Default::default()
    };
    let stop = stop.map(|Extension(t)| t).unwrap_or_default();
    let mut chunks = crate::logs::stream_positioned(base, request.start, options, dead, stop);
    let framer = Framer {
        task: request.task,
        stream: stream_name,
    };
    let plain = request.plain;
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(4);
    tokio::spawn(async move {
        let _counted = permit;
        // Plain: whether the bytes sent so far end a line.
        let mut at_line_start = true;
        loop {
            let next = tokio::select! {
                next = chunks.recv() => next,
                () = tokio::time::sleep(HEARTBEAT), if !plain => {
                    if tx.send(Ok(Bytes::from_static(b"{}"))).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = tx.closed() => return,
            };
            let out = match next {
                None => return,
                Some(Ok((chunk, _))) if plain => Ok(Bytes::from(match chunk {
                    LogChunk::Data(d) => {
                        at_line_start = d.last().is_none_or(|b| *b == b'\n');
                        d
                    }
                    LogChunk::Skipped(n) => {
                        at_line_start = true;
                        format!("{}\n", drover_api::skipped_notice(n)).into_bytes()
                    }
                })),
                Some(Ok((chunk, at))) => Ok(Bytes::from(framer.frames(chunk, at))),
                Some(Err(e)) => {
                    // As Nomad's, the error's text ends the body (framed, after an
                    // error frame, for a client that reads it, such as Drover's CLI):
                    // a Nomad client fails to decode it and reports an error. The body
                    // itself ends well: one cut short would lose what hyper still
                    // buffers before it.
                    let mut out = if plain { Vec::new() } else { framer.error(&e) };
                    if plain && !at_line_start {
                        out.push(b'\n');
                    }
                    out.extend_from_slice(format!("{e}\n").as_bytes());
                    let _ = tx.send(Ok(Bytes::from(out))).await;
                    return;
                }
            };
            if tx.send(out).await.is_err() {
                return;
            }
        }
    });
    let content_type = if plain {
        "text/plain"
    } else {
        "application/json"
    };
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// Turns log chunks into Nomad's frames for one task's stream.
struct Framer {
    task: String,
    stream: &'static str,
}

impl Framer {
    fn file(&self, at: Option<FilePosition>) -> String {
        let index = at.and_then(|p| p.index).unwrap_or(0);
        StreamFrame::log_file_name(&self.task, self.stream, index)
    }

    /// The frames of `chunk` (data in pieces of at most Nomad's frame size, each with
    /// the file offset just after it), one after the other as Nomad writes them.
    fn frames(&self, chunk: LogChunk, at: Option<FilePosition>) -> Vec<u8> {
        let file = self.file(at);
        let mut out = Vec::new();
        match chunk {
            LogChunk::Data(data) => {
                let end = at.map_or(data.len() as u64, |p| p.offset);
                let mut offset = end.saturating_sub(data.len() as u64);
                for piece in data.chunks(MAX_FRAME_DATA) {
                    offset += piece.len() as u64;
                    push_json(
                        &mut out,
                        &StreamFrame {
                            data: piece.to_vec(),
                            file: file.clone(),
                            offset: i64::try_from(offset).unwrap_or(i64::MAX),
                            ..Default::default()
                        },
                    );
                }
            }
            LogChunk::Skipped(n) => push_json(
                &mut out,
                &StreamFrame {
                    file,
                    file_event: FILE_EVENT_SKIPPED.into(),
                    skipped: Some(n),
                    ..Default::default()
                },
            ),
        }
        out
    }

    fn error(&self, e: &io::Error) -> Vec<u8> {
        let mut out = Vec::new();
        push_json(
            &mut out,
            &StreamFrame {
                file_event: FILE_EVENT_ERROR.into(),
                error: Some(e.to_string()),
                ..Default::default()
            },
        );
        out
    }
}

fn push_json(out: &mut Vec<u8>, frame: &StreamFrame) {
    // A frame is plain data: writing it into a Vec cannot fail.
    if let Err(e) = serde_json::to_writer(&mut *out, frame) {
        tracing::error!("cannot encode a log frame: {e}");
    }
}

/// `GET /v1/client/allocation/{alloc}/stats`: the resource use of the allocation's
/// running tasks (CPU over half a second), and their sum.
async fn alloc_stats(
    State(s): State<ApiState>,
    Path(alloc): Path<String>,
    req: axum::extract::Request,
) -> Response {
    let task_ids = s.allocs.as_ref().and_then(|a| a.task_ids(&alloc));
    let Some(task_ids) = task_ids else {
        return match &s.forward {
            Some(f) => f.forward(req).await,
            None => unknown_allocation(&alloc).into_response(),
        };
    };
    match alloc_usage(&s, task_ids).await {
        Ok(usage) => axum::Json(usage).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn alloc_usage(
    s: &ApiState,
    task_ids: BTreeMap<String, String>,
) -> Result<AllocResourceUsage, NomadError> {
    let mut sampling = tokio::task::JoinSet::new();
    for (name, id) in task_ids {
        // A task the task manager does not have yet has not started: no use to show.
        let Ok(view) = s.tasks.status(&id) else {
            continue;
        };
        // Only a running task has use to show (as Nomad's).
        if view.state != TaskLifecycle::Running {
            continue;
        }
        let plugin = crate::api::live_driver(s, &view)?;
        let tasks = s.tasks.clone();
        sampling.spawn(async move {
            let sampled = task_usage(&plugin, &id).await;
            (name, id, tasks, sampled)
        });
    }
    let mut usage = AllocResourceUsage {
        resource_usage: ResourceUsage {
            device_stats: Some(Vec::new()),
            ..Default::default()
        },
        ..Default::default()
    };
    while let Some(done) = sampling.join_next().await {
        let (name, id, tasks, sampled) = done.map_err(|e| {
            NomadError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("sampling a task's stats failed: {e}"),
            )
        })?;
        let task = match sampled {
            Ok(t) => t,
            // A task that ended meanwhile has no use to show, as Nomad's.
            Err(_)
                if tasks
                    .status(&id)
                    .is_ok_and(|v| v.state != TaskLifecycle::Running) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        add(&mut usage.resource_usage, &task.resource_usage);
        usage.timestamp = usage.timestamp.max(task.timestamp);
        usage.tasks.insert(name, task);
    }
    Ok(usage)
}

/// Add `task` into the allocation's `total`.
fn add(total: &mut ResourceUsage, task: &ResourceUsage) {
    let (m, tm) = (&mut total.memory_stats, &task.memory_stats);
    m.rss += tm.rss;
    m.cache += tm.cache;
    for name in &tm.measured {
        if !m.measured.contains(name) {
            m.measured.push(name.clone());
        }
    }
    let (c, tc) = (&mut total.cpu_stats, &task.cpu_stats);
    c.system_mode += tc.system_mode;
    c.user_mode += tc.user_mode;
    c.percent += tc.percent;
    for name in &tc.measured {
        if !c.measured.contains(name) {
            c.measured.push(name.clone());
        }
    }
}

/// Two samples of the driver's, [`crate::api::ONE_SHOT_INTERVAL`] apart: CPU time
/// is cumulative, so the time in each mode over the interval needs both.
async fn task_usage(
    plugin: &crate::plugins::catalog::LoadedPlugin,
    id: &str,
) -> Result<TaskResourceUsage, NomadError> {
    use drover_plugin_sdk::DriverError;
    // Bounded: a wedged plugin must not hold the request forever.
    let bound = Duration::from_secs(10);
    let (first, first_at, mut samples) = tokio::time::timeout(bound, async {
        let mut samples = plugin
            .client()
            .task_stats(id, crate::api::ONE_SHOT_INTERVAL)
            .await?;
        match samples.next().await {
            Some(r) => r.map(|first| (first, Instant::now(), samples)),
            None => Err(DriverError::Internal("the driver sent no sample".into())),
        }
    })
    .await
    .map_err(|_| {
        DriverError::Timeout(format!(
            "the driver gave no stats for task {id} within {bound:?}"
        ))
    })??;
    let second = tokio::time::timeout(crate::api::ONE_SHOT_INTERVAL * 4, samples.next()).await;
    let (sample, modes) = match second {
        Ok(Some(Ok(second))) => {
            let elapsed = first_at.elapsed().as_secs_f64().max(1e-3);
            let percent = |later: Duration, earlier: Duration| {
                later.saturating_sub(earlier).as_secs_f64() / elapsed * 100.0
            };
            let modes = (
                percent(second.cpu_system, first.cpu_system),
                percent(second.cpu_user, first.cpu_user),
            );
            (second, Some(modes))
        }
        // The task ended meanwhile, or the driver is slow: the first sample it is.
        _ => (first, None),
    };
    let mut memory_measured = vec!["RSS".to_owned()];
    if sample.memory_cache_bytes > 0 {
        memory_measured.push("Cache".to_owned());
    }
    let mut cpu_measured = vec!["Percent".to_owned()];
    if modes.is_some() {
        cpu_measured.splice(0..0, ["System Mode".to_owned(), "User Mode".to_owned()]);
    }
    let (system_mode, user_mode) = modes.unwrap_or_default();
    Ok(TaskResourceUsage {
        resource_usage: ResourceUsage {
            memory_stats: MemoryStats {
                rss: sample.memory_rss_bytes,
                cache: sample.memory_cache_bytes,
                measured: memory_measured,
                ..Default::default()
            },
            cpu_stats: CpuStats {
                system_mode,
                user_mode,
                percent: sample.cpu_percent,
                measured: cpu_measured,
                ..Default::default()
            },
            device_stats: None,
        },
        timestamp: now_ns(),
        pids: None,
    })
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn logs_parameters_are_read_as_nomad_reads_them() {
        let ok = |pairs: &[(&str, &str)]| LogsRequest::parse(&query(pairs)).ok().unwrap();
        let err = |pairs: &[(&str, &str)]| match LogsRequest::parse(&query(pairs)) {
            Ok(r) => panic!("accepted {r:?}"),
            Err(NomadError(code, text)) => (code.as_u16(), text),
        };
        // What python-nomad sends by default.
        let r = ok(&[
            ("task", "web"),
            ("type", "stdout"),
            ("follow", "False"),
            ("offset", "0"),
            ("origin", "start"),
            ("plain", "False"),
        ]);
        assert_eq!(
            r,
            LogsRequest {
                task: "web".into(),
                stderr: false,
                follow: false,
                plain: false,
                start: LogStart::Beginning,
            }
        );
        let r = ok(&[
            ("task", "web"),
            ("type", "stderr"),
            ("follow", "true"),
            ("origin", "end"),
            ("offset", "6"),
            ("plain", "1"),
        ]);
        assert!(r.stderr && r.follow && r.plain);
        assert_eq!(r.start, LogStart::FromEnd(6));
        assert_eq!(
            ok(&[("task", "t"), ("type", "stdout"), ("offset", "9")]).start,
            LogStart::Offset(9)
        );
        assert_eq!(
            err(&[("type", "stdout")]),
            (400, "must provide task name".into())
        );
        assert_eq!(
            err(&[("task", "t"), ("type", "x")]),
            (400, "must provide log type (stdout/stderr)".into())
        );
        assert_eq!(
            err(&[("task", "t"), ("type", "stdout"), ("origin", "middle")]),
            (400, "origin must be start or end".into())
        );
        let (code, text) = err(&[("task", "t"), ("type", "stdout"), ("follow", "yes")]);
        assert_eq!(code, 400);
        assert!(
            text.starts_with("failed to parse follow field to boolean"),
            "{text}"
        );
        let (code, text) = err(&[("task", "t"), ("type", "stdout"), ("offset", "-3")]);
        assert_eq!(code, 400);
        assert!(text.contains("negative"), "{text}");
    }

    #[test]
    fn frames_name_nomads_file_and_the_offset_after_their_data() {
        let framer = Framer {
            task: "web".into(),
            stream: "stdout",
        };
        let data = vec![b'x'; MAX_FRAME_DATA + 10];
        let at = Some(FilePosition {
            index: Some(3),
            offset: 100 + data.len() as u64,
        });
        let out = framer.frames(LogChunk::Data(data.clone()), at);
        let frames: Vec<StreamFrame> = serde_json::Deserializer::from_slice(&out)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].file, "alloc/logs/web.stdout.3");
        assert_eq!(frames[0].offset, 100 + MAX_FRAME_DATA as i64);
        assert_eq!(frames[1].offset, 100 + data.len() as i64);
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.data.clone()).collect();
        assert_eq!(joined, data);
        let skip = framer.frames(LogChunk::Skipped(4), at);
        let skip: StreamFrame = serde_json::from_slice(&skip).unwrap();
        assert_eq!(skip.file_event, FILE_EVENT_SKIPPED);
        assert_eq!(skip.skipped, Some(4));
    }
}
