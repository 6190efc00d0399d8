//! Nomad's file endpoints for an allocation this node runs
//! ([`drover_server_api::client_fs`]):
//!
//! - `GET /v1/client/fs/ls/{alloc}?path=P`: the entries of a directory;
//! - `GET /v1/client/fs/stat/{alloc}?path=P`: one entry;
//! - `GET /v1/client/fs/cat/{alloc}?path=P`: a file's bytes;
//! - `GET /v1/client/fs/readat/{alloc}?path=P&offset=O&limit=L`: `L` bytes from `O`;
//! - `GET /v1/client/fs/stream/{alloc}?path=P&offset=&origin=start|end&follow=&plain=`:
//!   a file as Nomad's frames (or raw with `plain=true`), following it as it grows.
//!
//! Paths are those of Nomad's allocation directory: `/` holds `alloc/` (the shared
//! directory every task of the group mounts) and one directory per started task, by
//! task name. `alloc/logs/` shows the tasks' logs under Nomad's names
//! (`<task>.stdout.0`), read from each task's own `logs/`.
//!
//! Everything here is hostile ground: the task owns its directory and may plant links,
//! FIFOs and device nodes there. Every path is resolved beneath a descriptor of the
//! directory it belongs to ([`drover_plugin_sdk::taskdir`]): a link in any component
//! is refused, never followed (a listing shows it as a link), only regular files with
//! one name are opened, and `secrets/` is refused as Nomad refuses it. Listings,
//! reads and followers are bounded.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, Read as _, Seek as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use drover_plugin_sdk::taskdir::{self, Dir, FileKind, Metadata, OpenOptions, Refused};
use drover_server_api::client_fs::{
    AllocFileInfo, FileType, MAX_FRAME_DATA, StreamFrame, go_file_mode,
};
use tokio_util::sync::CancellationToken;

use super::{NomadError, bad_request, int_param, parse_bool, push_json, unknown_allocation};
use crate::api::ApiState;

/// At most this many entries in one listing: a task can fill a directory with
/// millions of names, and a listing is held in memory whole.
pub(crate) const MAX_LISTING: usize = 10_000;
/// The header that says a listing stopped at [`MAX_LISTING`] entries.
pub(crate) const TRUNCATED_HEADER: &str = "x-drover-listing-truncated";
/// How often a followed file is looked at for new bytes, deletion or truncation.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How long a framed stream stays silent before it sends a heartbeat (`{}`).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Nomad's `FileEvent` of a stream whose file was deleted.
const FILE_DELETED: &str = "file deleted";
/// Nomad's `FileEvent` of a stream whose file shrank under it.
const FILE_TRUNCATED: &str = "file truncated";

/// The routes, merged into the agent's API.
pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/client/fs/ls/{alloc}", get(ls))
        .route("/v1/client/fs/stat/{alloc}", get(stat))
        .route("/v1/client/fs/cat/{alloc}", get(cat))
        .route("/v1/client/fs/readat/{alloc}", get(readat))
        .route("/v1/client/fs/stream/{alloc}", get(stream))
}

type Params = std::collections::HashMap<String, String>;

/// The allocation's directory on this node: where `alloc/` is and each started task's
/// directory by task name.
struct AllocFs {
    /// `<data_dir>/alloc/<alloc id>`, holding `alloc/`.
    root: PathBuf,
    /// Task name → its directory.
    tasks: BTreeMap<String, PathBuf>,
}

impl AllocFs {
    /// The allocation's directories, or `None` when it does not run on this node.
    fn of(s: &ApiState, alloc: &str) -> Option<AllocFs> {
        let task_ids = s.allocs.as_ref()?.task_ids(alloc)?;
        Some(AllocFs {
            root: s.tasks.alloc_dir().join(alloc),
            tasks: task_ids
                .into_iter()
                .map(|(name, id)| (name, s.tasks.task_dir(&id)))
                .collect(),
        })
    }
}

/// Where a path of the allocation's directory is.
enum Place {
    /// `/`: `alloc/` and the tasks' directories.
    Root,
    /// `alloc/logs`: the tasks' logs, by Nomad's names.
    LogDir,
    /// A real file or directory: `rel` beneath `dir` (`rel` empty: `dir` itself).
    Beneath { dir: Dir, rel: PathBuf },
}

/// A path as the caller gave it, cleaned: its names, without `.` and empty ones.
fn components(path: &str) -> Result<Vec<&str>, NomadError> {
    let mut names = Vec::new();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => {
                return Err(bad_request(format!(
                    "path {path:?} escapes the allocation directory (no `..`)"
                )));
            }
            n => names.push(n),
        }
    }
    Ok(names)
}

fn not_found(path: &str) -> NomadError {
    NomadError(
        StatusCode::NOT_FOUND,
        format!("{path}: no such file or directory"),
    )
}

/// An I/O error about `path` (as the caller named it), in Nomad's terms: a refusal by
/// [`taskdir`] is 403 and says why without the host's paths.
fn io_error(path: &str, e: &io::Error) -> NomadError {
    if let Some(r) = taskdir::refusal(e) {
        let why = match r {
            Refused::Link { .. } => {
                "a symbolic link is on its way (links in an allocation's directory are never \
                 followed)"
                    .to_owned()
            }
            Refused::Escape { .. } => "it is not beneath the allocation directory".to_owned(),
            Refused::NotRegular { kind, .. } => format!("it is {kind}, not a regular file"),
            Refused::HardLinked { links, .. } => format!(
                "it has {links} hard links (a file that may have another name outside the \
                 allocation is not read)"
            ),
            Refused::NotDir { kind, .. } => format!("it is {kind}, not a directory"),
            _ => "it is not a plain file of the allocation".to_owned(),
        };
        return NomadError(StatusCode::FORBIDDEN, format!("refusing {path}: {why}"));
    }
    match e.kind() {
        io::ErrorKind::NotFound => not_found(path),
        io::ErrorKind::NotADirectory => NomadError(
            StatusCode::NOT_FOUND,
            format!("{path}: no such file or directory"),
        ),
        _ => NomadError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read {path}: {}", e.kind()),
        ),
    }
}

/// Where `path` is in `fs`.
fn resolve(fs: &AllocFs, path: &str) -> Result<Place, NomadError> {
    let names = components(path)?;
    let Some((first, rest)) = names.split_first() else {
        return Ok(Place::Root);
    };
    if *first == "alloc" {
        if rest.first() == Some(&"logs") {
            return match rest {
                [_] => Ok(Place::LogDir),
                [_, file] => {
                    let (task, file) = nomad_log_name(file).ok_or_else(|| not_found(path))?;
                    let dir = fs.tasks.get(task).ok_or_else(|| not_found(path))?;
                    let dir = Dir::open(dir).map_err(|e| io_error(path, &e))?;
                    Ok(Place::Beneath {
                        dir,
                        rel: Path::new("logs").join(file),
                    })
                }
                _ => Err(not_found(path)),
            };
        }
        let dir = Dir::open(fs.root.join("alloc")).map_err(|e| io_error(path, &e))?;
        return Ok(Place::Beneath {
            dir,
            rel: rest.iter().collect(),
        });
    }
    let Some(task_dir) = fs.tasks.get(*first) else {
        return Err(not_found(path));
    };
    if rest.first() == Some(&"secrets") {
        return Err(NomadError(
            StatusCode::FORBIDDEN,
            format!("reading secret files is prohibited: {path}"),
        ));
    }
    let dir = Dir::open(task_dir).map_err(|e| io_error(path, &e))?;
    Ok(Place::Beneath {
        dir,
        rel: rest.iter().collect(),
    })
}

/// `<task>.<stdout|stderr>.<index>` → the task and its log file's own name
/// (`stdout.<index>`). Task names may hold dots: the last two are the separators.
fn nomad_log_name(name: &str) -> Option<(&str, String)> {
    let mut parts = name.rsplitn(3, '.');
    let index = parts.next()?;
    let stream = parts.next()?;
    let task = parts.next()?;
    index.parse::<u64>().ok()?;
    matches!(stream, "stdout" | "stderr").then(|| (task, format!("{stream}.{index}")))
}

/// `stdout.<index>` → `<task>.stdout.<index>`, for a task's log file.
fn log_file_name(task: &str, name: &str) -> Option<String> {
    let (stream, index) = name.split_once('.')?;
    index.parse::<u64>().ok()?;
    matches!(stream, "stdout" | "stderr").then(|| format!("{task}.{name}"))
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::File,
        FileKind::Dir => FileType::Dir,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::Fifo,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        _ => FileType::Other,
    }
}

fn info(name: String, m: &Metadata) -> AllocFileInfo {
    AllocFileInfo {
        name,
        is_dir: m.kind == FileKind::Dir,
        size: i64::try_from(m.len).unwrap_or(i64::MAX),
        file_mode: go_file_mode(file_type(m.kind), m.mode),
        mod_time: m
            .modified
            .map(|t| humantime::format_rfc3339_nanos(t).to_string())
            .unwrap_or_default(),
        content_type: String::new(),
    }
}

/// The entries of the directory at `path`, sorted by name, and whether the listing
/// stopped at [`MAX_LISTING`].
fn list(fs: &AllocFs, path: &str) -> Result<(Vec<AllocFileInfo>, bool), NomadError> {
    let mut out = Vec::new();
    let mut truncated = false;
    match resolve(fs, path)? {
        Place::Root => {
            if let Ok(m) = Dir::open(&fs.root).and_then(|d| d.metadata("alloc")) {
                out.push(info("alloc".into(), &m));
            }
            for (name, dir) in &fs.tasks {
                // A task whose directory is not made yet has nothing to show.
                if let Ok(m) = Dir::open(dir).and_then(|d| d.own_metadata()) {
                    out.push(info(name.clone(), &m));
                }
            }
        }
        Place::LogDir => {
            for (task, dir) in &fs.tasks {
                let Ok(logs) = Dir::open(dir).and_then(|d| d.open_dir("logs")) else {
                    continue;
                };
                let (names, more) = logs
                    .entries_limited(MAX_LISTING)
                    .map_err(|e| io_error(path, &e))?;
                truncated |= more;
                for name in names {
                    let Some(shown) = name.to_str().and_then(|n| log_file_name(task, n)) else {
                        continue;
                    };
                    if let Ok(m) = logs.metadata(&name) {
                        out.push(info(shown, &m));
                    }
                }
            }
        }
        Place::Beneath { dir, rel } => {
            let sub = dir.open_dir(&rel).map_err(|e| io_error(path, &e))?;
            let (names, more) = sub
                .entries_limited(MAX_LISTING)
                .map_err(|e| io_error(path, &e))?;
            truncated = more;
            for name in names {
                // Gone since it was read: not listed.
                let Ok(m) = sub.metadata(&name) else { continue };
                out.push(info(shown_name(name), &m));
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.truncate(MAX_LISTING);
    Ok((out, truncated))
}

/// A file name as JSON can carry it (not UTF-8: with U+FFFD where it is not).
fn shown_name(name: OsString) -> String {
    name.into_string()
        .unwrap_or_else(|n| n.to_string_lossy().into_owned())
}

/// What `path` is.
fn stat_path(fs: &AllocFs, path: &str) -> Result<AllocFileInfo, NomadError> {
    let last = components(path)?.last().copied().unwrap_or("/").to_owned();
    match resolve(fs, path)? {
        Place::Root => {
            let m = Dir::open(&fs.root)
                .and_then(|d| d.own_metadata())
                .map_err(|e| io_error(path, &e))?;
            Ok(info("/".into(), &m))
        }
        Place::LogDir => {
            let m = Dir::open(fs.root.join("alloc"))
                .and_then(|d| d.metadata("logs"))
                .map_err(|e| io_error(path, &e))?;
            Ok(info(last, &m))
        }
        Place::Beneath { dir, rel } => {
            let m = if rel.as_os_str().is_empty() {
                dir.own_metadata()
            } else {
                dir.metadata(&rel)
            }
            .map_err(|e| io_error(path, &e))?;
            let mut i = info(last, &m);
            if m.kind == FileKind::File {
                i.content_type = content_type(&dir, &rel);
            }
            Ok(i)
        }
    }
}

/// A content type from a file's first bytes, as Nomad's `stat` gives one: text or not.
fn content_type(dir: &Dir, rel: &Path) -> String {
    let Ok(mut f) = dir.open_file(rel, &OpenOptions::new().read(true).single_link(true)) else {
        return String::new();
    };
    let mut head = [0u8; 512];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let head = &head[..n];
    // A cut UTF-8 sequence at the end of the sample is still text.
    let text = match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && e.valid_up_to() + 4 > head.len(),
    };
    if text && !head.contains(&0) {
        "text/plain; charset=utf-8".into()
    } else {
        "application/octet-stream".into()
    }
}

/// The regular file at `path`, open for reading.
fn open_file(fs: &AllocFs, path: &str) -> Result<std::fs::File, NomadError> {
    match resolve(fs, path)? {
        Place::Root | Place::LogDir => Err(bad_request(format!("{path} is a directory"))),
        Place::Beneath { dir, rel } => {
            if rel.as_os_str().is_empty() {
                return Err(bad_request(format!("{path} is a directory")));
            }
            if let Ok(m) = dir.metadata(&rel)
                && m.kind == FileKind::Dir
            {
                return Err(bad_request(format!("{path} is a directory")));
            }
            dir.open_file(&rel, &OpenOptions::new().read(true).single_link(true))
                .map_err(|e| io_error(path, &e))
        }
    }
}

/// Whether the request is for this node; the request goes to the servers if not.
enum Here {
    Yes(AllocFs),
    Elsewhere(Response),
}

async fn here(s: &ApiState, alloc: &str, req: axum::extract::Request) -> Here {
    match AllocFs::of(s, alloc) {
        Some(fs) => Here::Yes(fs),
        None => Here::Elsewhere(match &s.forward {
            Some(f) => f.forward(req).await,
            None => unknown_allocation(alloc).into_response(),
        }),
    }
}

fn path_param(q: &Params) -> String {
    q.get("path")
        .filter(|p| !p.is_empty())
        .cloned()
        .unwrap_or_else(|| "/".to_owned())
}

/// Runs blocking file work off the runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NomadError> + Send + 'static,
) -> Result<T, NomadError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(NomadError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the file request failed: {e}"),
        ))
    })
}

async fn ls(
    State(s): State<ApiState>,
    UrlPath(alloc): UrlPath<String>,
    Query(q): Query<Params>,
    req: axum::extract::Request,
) -> Response {
    let fs = match here(&s, &alloc, req).await {
        Here::Yes(fs) => fs,
        Here::Elsewhere(r) => return r,
    };
    let path = path_param(&q);
    match blocking(move || list(&fs, &path)).await {
        Ok((entries, truncated)) => {
            let mut r = axum::Json(entries).into_response();
            if truncated {
                r.headers_mut()
                    .insert(TRUNCATED_HEADER, header::HeaderValue::from_static("true"));
            }
            r
        }
        Err(e) => e.into_response(),
    }
}

async fn stat(
    State(s): State<ApiState>,
    UrlPath(alloc): UrlPath<String>,
    Query(q): Query<Params>,
    req: axum::extract::Request,
) -> Response {
    let fs = match here(&s, &alloc, req).await {
        Here::Yes(fs) => fs,
        Here::Elsewhere(r) => return r,
    };
    let path = path_param(&q);
    match blocking(move || stat_path(&fs, &path)).await {
        Ok(i) => axum::Json(i).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn cat(
    State(s): State<ApiState>,
    UrlPath(alloc): UrlPath<String>,
    Query(q): Query<Params>,
    req: axum::extract::Request,
) -> Response {
    let fs = match here(&s, &alloc, req).await {
        Here::Yes(fs) => fs,
        Here::Elsewhere(r) => return r,
    };
    let permit = match s.streams.logs.acquire(&format!("alloc {alloc}")) {
        Ok(p) => p,
        Err(e) => return NomadError::from(e).into_response(),
    };
    let path = path_param(&q);
    match blocking(move || open_file(&fs, &path)).await {
        Ok(f) => raw_body(f, 0, None, permit),
        Err(e) => e.into_response(),
    }
}

async fn readat(
    State(s): State<ApiState>,
    UrlPath(alloc): UrlPath<String>,
    Query(q): Query<Params>,
    req: axum::extract::Request,
) -> Response {
    let fs = match here(&s, &alloc, req).await {
        Here::Yes(fs) => fs,
        Here::Elsewhere(r) => return r,
    };
    let (offset, limit) = match (int_param(&q, "offset"), int_param(&q, "limit")) {
        (Ok(Some(o)), Ok(Some(l))) => (o, l),
        (Err(e), _) | (_, Err(e)) => return e.into_response(),
        (Ok(None), _) => return bad_request("must provide offset").into_response(),
        (_, Ok(None)) => return bad_request("must provide limit").into_response(),
    };
    let permit = match s.streams.logs.acquire(&format!("alloc {alloc}")) {
        Ok(p) => p,
        Err(e) => return NomadError::from(e).into_response(),
    };
    let path = path_param(&q);
    match blocking(move || open_file(&fs, &path)).await {
        Ok(f) => raw_body(f, offset, Some(limit), permit),
        Err(e) => e.into_response(),
    }
}

/// `file` from `offset`, at most `limit` bytes, as a body read a piece at a time (a
/// file of any size costs one piece of memory). Each piece is read on a blocking
/// thread of its own and sent from the runtime: a client that reads slowly holds no
/// thread, only `permit` (counted with the log followers).
fn raw_body(
    file: std::fs::File,
    offset: u64,
    limit: Option<u64>,
    permit: crate::limits::StreamPermit,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(2);
    tokio::spawn(async move {
        let _counted = permit;
        let mut file = Some(file);
        let mut at = offset;
        let mut left = limit.unwrap_or(u64::MAX);
        while left > 0 {
            let Some(mut f) = file.take() else { return };
            let want = usize::try_from(left).map_or(MAX_FRAME_DATA, |l| l.min(MAX_FRAME_DATA));
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; want];
                let r = f
                    .seek(io::SeekFrom::Start(at))
                    .and_then(|_| f.read(&mut buf))
                    .map(|n| {
                        buf.truncate(n);
                        buf
                    });
                (f, r)
            })
            .await;
            let Ok((f, r)) = read else { return };
            file = Some(f);
            let piece = match r {
                Ok(p) if p.is_empty() => return,
                Ok(p) => p,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            at += piece.len() as u64;
            left -= piece.len() as u64;
            if tx.send(Ok(Bytes::from(piece))).await.is_err() {
                return;
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

/// The parameters of `fs stream`.
#[derive(Debug, PartialEq, Eq)]
struct StreamRequest {
    path: String,
    /// From the start, or back from the end.
    from_end: bool,
    offset: u64,
    follow: bool,
    plain: bool,
}

impl StreamRequest {
    fn parse(q: &Params) -> Result<StreamRequest, NomadError> {
        let path = match q.get("path") {
            Some(p) if !p.is_empty() => p.clone(),
            _ => return Err(bad_request("must provide a file path")),
        };
        let from_end = match q.get("origin").map(String::as_str) {
            None | Some("" | "start") => false,
            Some("end") => true,
            Some(_) => return Err(bad_request("origin must be start or end")),
        };
        // Nomad's stream follows the file unless told not to.
        let follow = match q.get("follow") {
            None => true,
            v => parse_bool("follow", v)?,
        };
        Ok(StreamRequest {
            path,
            from_end,
            offset: int_param(q, "offset")?.unwrap_or(0),
            follow,
            plain: parse_bool("plain", q.get("plain"))?,
        })
    }
}

async fn stream(
    State(s): State<ApiState>,
    stop: Option<Extension<CancellationToken>>,
    UrlPath(alloc): UrlPath<String>,
    Query(q): Query<Params>,
    req: axum::extract::Request,
) -> Response {
    let request = match StreamRequest::parse(&q) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let fs = match here(&s, &alloc, req).await {
        Here::Yes(fs) => fs,
        Here::Elsewhere(r) => return r,
    };
    // A stream holds its file open until its client goes: counted with the log
    // followers, per allocation (a slow reader of a big file as much as a follower).
    let permit = match s.streams.logs.acquire(&format!("alloc {alloc}")) {
        Ok(p) => p,
        Err(e) => return NomadError::from(e).into_response(),
    };
    let path = request.path.clone();
    let mut file = match blocking(move || open_file(&fs, &path)).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let stop = stop.map(|Extension(t)| t).unwrap_or_default();
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(4);
    tokio::spawn(async move {
        let _counted = permit;
        let frame_file = request.path.trim_start_matches('/').to_owned();
        let plain = request.plain;
        let start = match file.metadata() {
            Ok(m) if request.from_end => m.len().saturating_sub(request.offset),
            Ok(m) => request.offset.min(m.len()),
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let mut offset = start;
        let mut last_sent = tokio::time::Instant::now();
        loop {
            // What is there now, from `offset`, in frame-sized pieces.
            let read = tokio::task::spawn_blocking(move || {
                let r = read_piece(&mut file, offset);
                (file, r)
            })
            .await;
            let Ok((f, piece)) = read else { return };
            file = f;
            let out = match piece {
                Ok(Piece::Data(data)) => {
                    offset += data.len() as u64;
                    if plain {
                        Bytes::from(data)
                    } else {
                        frame(StreamFrame {
                            data,
                            file: frame_file.clone(),
                            offset: i64::try_from(offset).unwrap_or(i64::MAX),
                            ..Default::default()
                        })
                    }
                }
                Ok(Piece::Truncated(len)) => {
                    offset = 0;
                    if plain {
                        let _ = len;
                        continue;
                    }
                    frame(StreamFrame {
                        file: frame_file.clone(),
                        file_event: FILE_TRUNCATED.into(),
                        ..Default::default()
                    })
                }
                Ok(Piece::Deleted) => {
                    if !plain {
                        let _ = tx
                            .send(Ok(frame(StreamFrame {
                                file: frame_file.clone(),
                                file_event: FILE_DELETED.into(),
                                ..Default::default()
                            })))
                            .await;
                    }
                    return;
                }
                Ok(Piece::Nothing) if !request.follow => return,
                Ok(Piece::Nothing) => {
                    let heartbeat = !plain && last_sent.elapsed() >= HEARTBEAT;
                    if heartbeat {
                        if tx.send(Ok(Bytes::from_static(b"{}"))).await.is_err() {
                            return;
                        }
                        last_sent = tokio::time::Instant::now();
                    }
                    tokio::select! {
                        () = tokio::time::sleep(FOLLOW_POLL) => continue,
                        () = tx.closed() => return,
                        () = stop.cancelled() => return,
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            if tx.send(Ok(out)).await.is_err() {
                return;
            }
            last_sent = tokio::time::Instant::now();
        }
    });
    let content_type = if request.plain {
        "text/plain"
    } else {
        "application/json"
    };
    (
        [(header::CONTENT_TYPE, content_type)],
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

fn frame(f: StreamFrame) -> Bytes {
    let mut out = Vec::new();
    push_json(&mut out, &f);
    Bytes::from(out)
}

/// What a look at a followed file found.
enum Piece {
    /// Bytes from the offset asked.
    Data(Vec<u8>),
    /// The file is shorter than the offset: it was truncated (its length now).
    Truncated(u64),
    /// The file has no name left.
    Deleted,
    /// Nothing new.
    Nothing,
}

fn read_piece(file: &mut std::fs::File, offset: u64) -> io::Result<Piece> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = file.metadata()?;
    if meta.len() < offset {
        return Ok(Piece::Truncated(meta.len()));
    }
    if meta.len() == offset {
        return Ok(if meta.nlink() == 0 {
            Piece::Deleted
        } else {
            Piece::Nothing
        });
    }
    file.seek(io::SeekFrom::Start(offset))?;
    let want =
        usize::try_from(meta.len() - offset).map_or(MAX_FRAME_DATA, |n| n.min(MAX_FRAME_DATA));
    let mut buf = vec![0u8; want];
    let n = file.read(&mut buf)?;
    buf.truncate(n);
    Ok(if n == 0 {
        Piece::Nothing
    } else {
        Piece::Data(buf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs_in(tmp: &Path) -> AllocFs {
        let root = tmp.join("a1");
        std::fs::create_dir_all(root.join("alloc/data")).unwrap();
        std::fs::create_dir_all(root.join("alloc/logs")).unwrap();
        let web = tmp.join("t1");
        std::fs::create_dir_all(web.join("local")).unwrap();
        std::fs::create_dir_all(web.join("secrets")).unwrap();
        std::fs::create_dir_all(web.join("logs")).unwrap();
        std::fs::write(web.join("local/hello.txt"), "hello\n").unwrap();
        std::fs::write(web.join("secrets/token"), "s3cr3t").unwrap();
        std::fs::write(web.join("logs/stdout.0"), "out\n").unwrap();
        std::fs::write(web.join("logs/stderr.0"), "").unwrap();
        std::fs::write(web.join("logs/.stdout.fifo"), "").unwrap();
        AllocFs {
            root,
            tasks: [("web.v2".to_owned(), web)].into_iter().collect(),
        }
    }

    fn names(fs: &AllocFs, path: &str) -> Vec<String> {
        list(fs, path)
            .unwrap()
            .0
            .into_iter()
            .map(|i| i.name)
            .collect()
    }

    fn read(fs: &AllocFs, path: &str) -> Result<String, NomadError> {
        let mut s = String::new();
        open_file(fs, path)?.read_to_string(&mut s).unwrap();
        Ok(s)
    }

    #[test]
    fn the_root_holds_alloc_and_the_tasks_and_alloc_logs_has_nomads_names() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = fs_in(tmp.path());
        assert_eq!(names(&fs, "/"), ["alloc", "web.v2"]);
        assert_eq!(names(&fs, ""), ["alloc", "web.v2"]);
        assert_eq!(names(&fs, "alloc"), ["data", "logs"]);
        assert_eq!(
            names(&fs, "/alloc/logs/"),
            ["web.v2.stderr.0", "web.v2.stdout.0"]
        );
        assert_eq!(read(&fs, "alloc/logs/web.v2.stdout.0").unwrap(), "out\n");
        assert_eq!(read(&fs, "web.v2/local/hello.txt").unwrap(), "hello\n");
        assert_eq!(read(&fs, "/web.v2/./local//hello.txt").unwrap(), "hello\n");
        let listing = list(&fs, "web.v2/local").unwrap().0;
        assert_eq!(listing[0].file_mode.len(), 10, "{listing:?}");
        assert!(!listing[0].is_dir);
        assert_eq!(listing[0].size, 6);
        assert!(listing[0].mod_time.ends_with('Z'), "{listing:?}");
        let stat = stat_path(&fs, "web.v2/local/hello.txt").unwrap();
        assert_eq!(stat.name, "hello.txt");
        assert_eq!(stat.content_type, "text/plain; charset=utf-8");
        assert!(stat_path(&fs, "web.v2/local").unwrap().is_dir);
    }

    #[test]
    fn links_dotdot_secrets_and_special_files_are_refused_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = fs_in(tmp.path());
        let local = fs.tasks["web.v2"].join("local");
        std::os::unix::fs::symlink("/etc/shadow", local.join("shadow")).unwrap();
        std::os::unix::fs::symlink("/etc", local.join("etc")).unwrap();
        std::fs::hard_link(local.join("hello.txt"), local.join("again.txt")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            local.join("pipe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RWXU,
            0,
        )
        .unwrap();
        for path in [
            "web.v2/local/shadow",
            "web.v2/local/etc/passwd",
            "web.v2/local/again.txt",
            "web.v2/local/pipe",
            "web.v2/secrets/token",
        ] {
            let e = read(&fs, path).expect_err(path);
            assert_eq!(e.0, StatusCode::FORBIDDEN, "{path}: {}", e.1);
            assert!(
                !e.1.contains(tmp.path().to_str().unwrap()),
                "host path: {}",
                e.1
            );
        }
        assert_eq!(
            list(&fs, "web.v2/local/etc").err().unwrap().0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            list(&fs, "web.v2/secrets").err().unwrap().0,
            StatusCode::FORBIDDEN
        );
        // Listed as what they are, never as their targets.
        let listing = list(&fs, "web.v2/local").unwrap().0;
        let shadow = listing.iter().find(|i| i.name == "shadow").unwrap();
        assert!(shadow.file_mode.starts_with('L'), "{shadow:?}");
        assert_eq!(
            stat_path(&fs, "web.v2/local/etc").unwrap().file_mode,
            "Lrwxrwxrwx"
        );
        for path in ["../a1", "web.v2/../../etc/passwd", "/alloc/.."] {
            assert_eq!(
                read(&fs, path).err().unwrap().0,
                StatusCode::BAD_REQUEST,
                "{path}"
            );
        }
        for path in [
            "nope",
            "web.v2/local/nope",
            "alloc/logs/nope.stdout.0",
            "alloc/logs/x",
        ] {
            assert_eq!(
                read(&fs, path).err().unwrap().0,
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
        assert_eq!(read(&fs, "/").err().unwrap().0, StatusCode::BAD_REQUEST);
        assert_eq!(
            read(&fs, "web.v2/local").err().unwrap().0,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn a_listing_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = fs_in(tmp.path());
        let many = fs.tasks["web.v2"].join("local/many");
        std::fs::create_dir(&many).unwrap();
        for n in 0..MAX_LISTING + 5 {
            std::fs::write(many.join(n.to_string()), "").unwrap();
        }
        let (entries, truncated) = list(&fs, "web.v2/local/many").unwrap();
        assert_eq!(entries.len(), MAX_LISTING);
        assert!(truncated);
    }

    #[test]
    fn nomad_log_names_map_to_the_tasks_log_files() {
        assert_eq!(
            nomad_log_name("web.v2.stdout.12"),
            Some(("web.v2", "stdout.12".to_owned()))
        );
        assert_eq!(nomad_log_name("web.stdin.1"), None);
        assert_eq!(nomad_log_name("web.stdout.x"), None);
        assert_eq!(
            log_file_name("web", "stderr.3").as_deref(),
            Some("web.stderr.3")
        );
        assert_eq!(log_file_name("web", ".stdout.fifo"), None);
    }

    #[test]
    fn stream_parameters_follow_nomads() {
        let q = |pairs: &[(&str, &str)]| -> Params {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let r = StreamRequest::parse(&q(&[("path", "web/local/x")])).unwrap();
        assert!(r.follow && !r.plain && !r.from_end && r.offset == 0);
        let r = StreamRequest::parse(&q(&[
            ("path", "x"),
            ("origin", "end"),
            ("offset", "10"),
            ("follow", "false"),
            ("plain", "true"),
        ]))
        .unwrap();
        assert!(!r.follow && r.plain && r.from_end && r.offset == 10);
        assert!(StreamRequest::parse(&q(&[])).is_err());
        assert!(StreamRequest::parse(&q(&[("path", "x"), ("offset", "-1")])).is_err());
        assert!(StreamRequest::parse(&q(&[("path", "x"), ("origin", "middle")])).is_err());
    }
}
