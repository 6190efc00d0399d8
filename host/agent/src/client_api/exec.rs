//! `GET /v1/client/allocation/{alloc}/exec?task=T&command=<JSON array>&tty=<bool>`:
//! Nomad's interactive exec into a task of an allocation this node runs, a WebSocket
//! of [`ExecFrame`]s ([`drover_server_api::exec`]), relayed to the task's driver's
//! `ExecTaskStreaming`. The driver runs the command inside the task's sandbox (its
//! user, namespaces, cgroup, capabilities and seccomp filter).
//!
//! The agent's socket trusts whoever reaches it (root, or the agent's user): the
//! servers check `alloc-exec` (and `alloc-node-exec` for a driver without isolation)
//! before they pass an exec on.

use std::collections::BTreeMap;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use drover_plugin_sdk::{ExecChunk, ExecEvent, ExecInput, TerminalSize};
use drover_server_api::exec::{ExecFrame, ExecIo, close_reason};
use tokio_stream::StreamExt as _;

use super::{NomadError, bad_request, parse_bool, unknown_allocation};
use crate::api::ApiState;

/// WebSocket close codes (RFC 6455): normal, policy violation, server error.
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_POLICY: u16 = 1008;
const CLOSE_ERROR: u16 = 1011;
/// The largest message taken from a caller (a keystroke or a paste; a resize).
const MAX_MESSAGE: usize = 1024 * 1024;
/// The most arguments, and bytes of them, an exec'd command may have.
const MAX_ARGS: usize = 256;
const MAX_ARGS_BYTES: usize = 64 * 1024;
/// The most caller messages held while the command does not take its input.
const MAX_PENDING: usize = 64;

/// The parameters of an exec, checked before the upgrade.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ExecRequest {
    pub(crate) task: String,
    pub(crate) command: Vec<String>,
    pub(crate) tty: bool,
}

impl ExecRequest {
    pub(crate) fn parse(q: &BTreeMap<String, String>) -> Result<ExecRequest, NomadError> {
        let task = match q.get("task") {
            Some(t) if !t.is_empty() => t.clone(),
            _ => return Err(bad_request("missing task name")),
        };
        let command: Vec<String> = match q.get("command") {
            Some(c) if !c.is_empty() => serde_json::from_str(c).map_err(|e| {
                bad_request(format!(
                    "command must be a JSON array of strings ({e}): {c:?}"
                ))
            })?,
            _ => return Err(bad_request("missing command")),
        };
        if command.is_empty() || command[0].is_empty() {
            return Err(bad_request("command is empty"));
        }
        if command.len() > MAX_ARGS
            || command.iter().map(String::len).sum::<usize>() > MAX_ARGS_BYTES
        {
            return Err(bad_request(format!(
                "command too long (at most {MAX_ARGS} arguments, {MAX_ARGS_BYTES} bytes)"
            )));
        }
        if command.iter().any(|a| a.contains('\0')) {
            return Err(bad_request("command has a NUL byte"));
        }
        Ok(ExecRequest {
            task,
            command,
            tty: parse_bool("tty", q.get("tty"))?,
        })
    }
}

/// The exec route's handler.
pub(crate) async fn alloc_exec(
    State(s): State<ApiState>,
    Path(alloc): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let request = match ExecRequest::parse(&q) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let Some(allocs) = &s.allocs else {
        return unknown_allocation(&alloc).into_response();
    };
    let Some(task_ids) = allocs.task_ids(&alloc) else {
        return unknown_allocation(&alloc).into_response();
    };
    let Some(task_id) = task_ids.get(&request.task).cloned() else {
        return if allocs.has_task(&alloc, &request.task) {
            NomadError(
                axum::http::StatusCode::BAD_REQUEST,
                format!("task {:?} is not running", request.task),
            )
            .into_response()
        } else {
            bad_request(format!("unknown task name {:?}", request.task)).into_response()
        };
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            return bad_request(format!(
                "exec is a WebSocket: send an upgrade request ({e})"
            ))
            .into_response();
        }
    };
    // An exec holds a process and a stream open: counted with the log followers of
    // its task.
    let permit = match s.streams.logs.acquire(&task_id) {
        Ok(p) => p,
        Err(e) => return NomadError::from(e).into_response(),
    };
    tracing::info!(
        alloc = %alloc,
        task = %request.task,
        // The program only: its arguments may carry secrets.
        program = ?request.command[0],
        tty = request.tty,
        "exec into a task"
    );
    ws.max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| async move {
            let _counted = permit;
            relay(s, socket, task_id, request).await;
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

fn frame_message(f: &ExecFrame) -> Message {
    // A frame is plain data: encoding it cannot fail.
    Message::Text(serde_json::to_string(f).unwrap_or_default().into())
}

/// What a caller's message asks, if anything.
fn inputs_of(frame: ExecFrame) -> Vec<ExecInput> {
    let mut out = Vec::new();
    if let Some(size) = frame.tty_size
        && size.height > 0
        && size.width > 0
    {
        out.push(ExecInput::Resize(TerminalSize {
            rows: size.height,
            cols: size.width,
        }));
    }
    if let Some(stdin) = frame.stdin {
        if !stdin.data.is_empty() {
            out.push(ExecInput::Stdin(stdin.data));
        }
        if stdin.close {
            out.push(ExecInput::StdinClosed);
        }
    }
    out
}

/// Relay `socket` to the driver's exec of `request` in task `task_id` until the
/// command ends or the caller goes away (which kills the command).
async fn relay(s: ApiState, mut socket: WebSocket, task_id: String, request: ExecRequest) {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut events = match s
        .tasks
        .exec_streaming(&task_id, request.command, request.tty, rx)
        .await
    {
        Ok(e) => e,
        Err(e) => {
            close(&mut socket, CLOSE_ERROR, &e.to_string()).await;
            return;
        }
    };
    // The caller's inputs wait here (bounded) while the driver's input is full, so
    // that the command's output is always relayed meanwhile (a command that does not
    // read its stdin must not stop its output, or the exec's end).
    let mut pending: std::collections::VecDeque<ExecInput> = std::collections::VecDeque::new();
    let mut input_open = true;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(ExecEvent::Output(chunk))) => {
                    let frame = match chunk {
                        ExecChunk::Stdout(data) => ExecFrame { stdout: Some(ExecIo { data, close: false }), ..Default::default() },
                        ExecChunk::Stderr(data) => ExecFrame { stderr: Some(ExecIo { data, close: false }), ..Default::default() },
                        _ => continue,
                    };
                    if socket.send(frame_message(&frame)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(ExecEvent::Exited(result))) => {
                    let _ = socket.send(frame_message(&ExecFrame::exited(result.exit_code))).await;
                    close(&mut socket, CLOSE_NORMAL, "").await;
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    close(&mut socket, CLOSE_ERROR, &e.to_string()).await;
                    return;
                }
                None => {
                    close(&mut socket, CLOSE_ERROR, "the driver ended the exec without an exit code").await;
                    return;
                }
            },
            permit = tx.reserve(), if !pending.is_empty() => match permit {
                Ok(permit) => {
                    if let Some(input) = pending.pop_front() {
                        permit.send(input);
                    }
                }
                // The driver no longer takes input; its output still comes.
                Err(_) => {
                    pending.clear();
                    input_open = false;
                }
            },
            message = socket.recv(), if input_open && pending.len() < MAX_PENDING => match message {
                Some(Ok(Message::Text(text))) => {
                    let frame: ExecFrame = match serde_json::from_str(text.as_str()) {
                        Ok(f) => f,
                        Err(e) => {
                            close(&mut socket, CLOSE_POLICY, &format!("not an exec frame: {e}")).await;
                            return;
                        }
                    };
                    pending.extend(inputs_of(frame));
                }
                // Raw bytes are stdin, as some clients send them.
                Some(Ok(Message::Binary(data))) => pending.push_back(ExecInput::Stdin(data.to_vec())),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                // The caller went away: dropping the input ends the command.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn exec_requests_are_checked_as_nomad_checks_them() {
        let r = ExecRequest::parse(&q(&[
            ("task", "web"),
            ("command", r#"["/bin/sh","-c","id -u"]"#),
            ("tty", "true"),
        ]))
        .unwrap();
        assert_eq!(r.command, ["/bin/sh", "-c", "id -u"]);
        assert!(r.tty);
        for bad in [
            q(&[("command", r#"["sh"]"#)]),
            q(&[("task", "web")]),
            q(&[("task", "web"), ("command", "sh")]),
            q(&[("task", "web"), ("command", "[]")]),
            q(&[("task", "web"), ("command", r#"[""]"#)]),
            q(&[("task", "web"), ("command", r#"["a\u0000b"]"#)]),
            q(&[("task", "web"), ("command", r#"["sh"]"#), ("tty", "maybe")]),
        ] {
            assert!(ExecRequest::parse(&bad).is_err(), "{bad:?}");
        }
        let long = serde_json::to_string(&vec!["x"; MAX_ARGS + 1]).unwrap();
        assert!(ExecRequest::parse(&q(&[("task", "t"), ("command", &long)])).is_err());
    }

    #[test]
    fn caller_frames_become_driver_inputs() {
        let f: ExecFrame = serde_json::from_str(
            r#"{"tty_size":{"height":40,"width":120},"stdin":{"data":"bHMK","close":true}}"#,
        )
        .unwrap();
        assert_eq!(
            inputs_of(f),
            [
                ExecInput::Resize(TerminalSize {
                    rows: 40,
                    cols: 120
                }),
                ExecInput::Stdin(b"ls\n".to_vec()),
                ExecInput::StdinClosed
            ]
        );
        let auth: ExecFrame = serde_json::from_str(r#"{"version":1,"auth_token":"s"}"#).unwrap();
        assert!(inputs_of(auth).is_empty());
        let zero: ExecFrame =
            serde_json::from_str(r#"{"tty_size":{"height":0,"width":0}}"#).unwrap();
        assert!(inputs_of(zero).is_empty());
    }
}
