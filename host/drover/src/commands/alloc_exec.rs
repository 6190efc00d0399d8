//! `drover alloc exec [-i] [-t] [--task T] ALLOC [TASK] COMMAND...`: a command inside a
//! running task, interactively (Nomad's `alloc exec`), over the exec WebSocket of
//! the agent that runs the allocation (through a server with a local agent).
//!
//! With a terminal (`-t`, the default when stdin is one), the caller's terminal is put
//! in raw mode for the session (restored however it ends) and its size follows the
//! window (`SIGWINCH`). The exit code is the command's.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use drover_server_api::client::{Client, QueryOptions};
use drover_server_api::exec::{ExecFrame, ExecIo, TtySize};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio_tungstenite::tungstenite::Message;

use super::cluster_error;

/// The caller's terminal in raw mode until dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)
            .context("setting the terminal to raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The caller's terminal size, if stdout (or stdin) is a terminal.
fn terminal_size() -> Option<TtySize> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (size.ws_row > 0 && size.ws_col > 0).then_some(TtySize {
        height: size.ws_row,
        width: size.ws_col,
    })
}

fn text(frame: &ExecFrame) -> Message {
    // A frame is plain data: encoding it cannot fail.
    Message::Text(serde_json::to_string(frame).unwrap_or_default().into())
}

/// Which task of the allocation, and the command: `--task` names it; else the first
/// argument if it is a task's name and a command follows; else the only task.
fn task_and_command(
    tasks: &[String],
    task: Option<String>,
    mut args: Vec<String>,
) -> anyhow::Result<(String, Vec<String>)> {
    if let Some(t) = task {
        if !tasks.contains(&t) {
            bail!(
                "the allocation has no task {t:?}; its tasks: {}",
                tasks.join(", ")
            );
        }
        return Ok((t, args));
    }
    if args.len() >= 2 && tasks.contains(&args[0]) {
        let t = args.remove(0);
        return Ok((t, args));
    }
    match tasks {
        [only] => Ok((only.clone(), args)),
        _ => bail!(
            "the allocation has several tasks: name one with --task (or as the first \
             argument); its tasks: {}",
            tasks.join(", ")
        ),
    }
}

/// Run `alloc exec`.
pub async fn alloc_exec(
    c: &Client,
    alloc: &str,
    task: Option<String>,
    stdin_open: bool,
    tty: Option<bool>,
    args: Vec<String>,
) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal as _;
    let a = c
        .allocation(alloc, &QueryOptions::default())
        .await
        .map_err(cluster_error)?
        .value;
    let tasks: Vec<String> = a.task_states.keys().cloned().collect();
    let (task, command) = if tasks.is_empty() {
        // No task state reported yet: the task named is taken as given (the agent
        // says if it is not one).
        match (task, args.split_first()) {
            (Some(t), _) => (t, args),
            (None, Some((t, rest))) if !rest.is_empty() => (t.clone(), rest.to_vec()),
            _ => bail!(
                "allocation {} reports no task yet: name the task (--task or first argument)",
                a.id
            ),
        }
    } else {
        task_and_command(&tasks, task, args)?
    };
    if command.is_empty() {
        bail!("give the command to run (e.g. /bin/sh)");
    }
    let tty = tty.unwrap_or_else(|| std::io::stdin().is_terminal());
    let mut socket = c
        .alloc_exec(&a.id, &task, &command, tty)
        .await
        .map_err(cluster_error)?;
    let size = if tty { terminal_size() } else { None };
    if let Some(size) = size {
        socket
            .send(text(&ExecFrame {
                tty_size: Some(size),
                ..Default::default()
            }))
            .await
            .context("sending the terminal size")?;
    }
    // Raw only when our own stdin is a terminal: keys go to the remote one as typed.
    let _raw = if tty && std::io::stdin().is_terminal() {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .context("watching the terminal's size")?;
    // Stdin is read on a thread of its own: a read of an interactive terminal blocks
    // until a key, and must not hold up the end of the program (the thread is left).
    let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    if stdin_open {
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut input = std::io::stdin().lock();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if stdin_tx.blocking_send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    let mut stdin_open = stdin_open;
    if !stdin_open {
        socket
            .send(text(&ExecFrame {
                stdin: Some(ExecIo {
                    data: Vec::new(),
                    close: true,
                }),
                ..Default::default()
            }))
            .await?;
    }
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    loop {
        tokio::select! {
            message = socket.next() => match message {
                Some(Ok(Message::Text(t))) => {
                    let frame: ExecFrame = serde_json::from_str(t.as_str())
                        .with_context(|| format!("not an exec frame: {t}"))?;
                    if let Some(o) = frame.stdout {
                        out.write_all(&o.data)?;
                        out.flush()?;
                    }
                    if let Some(e) = frame.stderr {
                        err.write_all(&e.data)?;
                        err.flush()?;
                    }
                    if frame.exited {
                        let code = frame.result.map_or(0, |r| r.exit_code);
                        return Ok(ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(255)));
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    let reason = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                    drop(_raw);
                    bail!("the exec ended without an exit code{}", if reason.is_empty() { String::new() } else { format!(": {reason}") });
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    drop(_raw);
                    bail!("the exec connection failed: {e}");
                }
                None => {
                    drop(_raw);
                    bail!("the exec connection closed without an exit code");
                }
            },
            data = stdin_rx.recv(), if stdin_open => {
                let frame = match data {
                    None => {
                        stdin_open = false;
                        ExecFrame { stdin: Some(ExecIo { data: Vec::new(), close: true }), ..Default::default() }
                    }
                    Some(data) => ExecFrame { stdin: Some(ExecIo { data, close: false }), ..Default::default() },
                };
                socket.send(text(&frame)).await.context("sending stdin")?;
            }
            _ = winch.recv(), if tty => {
                if let Some(size) = terminal_size() {
                    socket.send(text(&ExecFrame { tty_size: Some(size), ..Default::default() })).await?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_task_is_named_by_flag_first_argument_or_is_the_only_one() {
        let one = v(&["web"]);
        let two = v(&["web", "db"]);
        assert_eq!(
            task_and_command(&one, None, v(&["sh"])).unwrap(),
            ("web".into(), v(&["sh"]))
        );
        assert_eq!(
            task_and_command(&two, None, v(&["db", "sh", "-c", "id"])).unwrap(),
            ("db".into(), v(&["sh", "-c", "id"]))
        );
        assert_eq!(
            task_and_command(&two, Some("web".into()), v(&["db"])).unwrap(),
            ("web".into(), v(&["db"]))
        );
        assert!(task_and_command(&two, None, v(&["sh"])).is_err());
        assert!(task_and_command(&two, Some("nope".into()), v(&["sh"])).is_err());
        // A lone argument that names the task is the command of the only task.
        assert_eq!(
            task_and_command(&one, None, v(&["web"])).unwrap(),
            ("web".into(), v(&["web"]))
        );
    }
}
