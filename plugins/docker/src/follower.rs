//! The log follower: a task's background copy of its container's output into its log
//! files ([`crate::logs`]), for as long as the container runs, across the daemon going
//! away and coming back, and a last read once it has stopped.

use std::sync::Arc;

use futures_util::StreamExt as _;

use crate::engine::{Engine, status_of};
use crate::handle::{Backoff, Task, short};
use crate::logs::Sink;

/// Copy the container's output into the task's log files until the container has
/// stopped and everything it wrote is copied, or the task is destroyed. Keeps trying
/// while the daemon is away.
pub(crate) async fn follow(task: Arc<Task>) {
    if !task.logs.discard() {
        match Sink::open(&task.logs, &task.state.container_id) {
            Ok(sink) => copy(&task.engine, &task, sink).await,
            Err(e) => tracing::warn!(task = %task.id, "cannot open the task's log files: {e}"),
        }
    }
    task.logs_finished();
}

/// How one read of the container's logs ended.
enum Read {
    /// The daemon ended the stream.
    Ended,
    /// The connection broke (daemon going away).
    Broken,
    /// The container or the task is gone, or the log files cannot be written.
    Stop,
}

/// Write what Docker has for the container since the cursor; with `follow`, keep
/// writing until the daemon ends the stream.
async fn read(docker: &bollard::Docker, task: &Task, sink: &mut Sink, follow: bool) -> Read {
    let cid = task.state.container_id.as_str();
    let options = bollard::query_parameters::LogsOptions {
        follow,
        stdout: true,
        stderr: true,
        timestamps: true,
        since: sink.start_read(),
        ..Default::default()
    };
    let mut stream = docker.logs(cid, Some(options));
    loop {
        let item = tokio::select! {
            biased;
            () = task.cancel.cancelled() => return Read::Stop,
            item = stream.next() => item,
        };
        match item {
            None => return Read::Ended,
            Some(Ok(out)) => {
                if let Err(e) = sink.write(out) {
                    tracing::warn!(task = %task.id, "writing the task's logs: {e}");
                    return Read::Stop;
                }
                task.log_copied();
            }
            Some(Err(e)) if status_of(&e) == Some(404) => return Read::Stop,
            Some(Err(e)) => {
                tracing::debug!(task = %task.id, "reading the logs of {}: {e}", short(cid));
                return Read::Broken;
            }
        }
    }
}

async fn copy(engine: &Engine, task: &Task, mut sink: Sink) {
    let cid = task.state.container_id.as_str();
    let mut backoff = Backoff::new();
    loop {
        if task.cancel.is_cancelled() {
            return;
        }
        let Ok(docker) = engine.client().await else {
            if !backoff.pause(&task.cancel).await {
                return;
            }
            continue;
        };
        match read(&docker, task, &mut sink, true).await {
            Read::Stop => return,
            Read::Broken => {
                if !backoff.pause(&task.cancel).await {
                    return;
                }
                continue;
            }
            Read::Ended => backoff.reset(),
        }
        // A follow ends when the container stops, but also early (Docker 20.10 ends
        // it at a log file rotation, and when the container stops before the follower
        // caught up). Once the container has stopped, one plain read from the cursor
        // picks up whatever the follow missed.
        match docker.inspect_container(cid, None).await {
            Ok(info) if info.state.as_ref().and_then(|s| s.running) != Some(true) => {
                match read(&docker, task, &mut sink, false).await {
                    Read::Ended | Read::Stop => return,
                    Read::Broken => {}
                }
            }
            // Still running: follow again from the cursor (after a short pause).
            Ok(_) => {}
            Err(e) if status_of(&e) == Some(404) => return,
            Err(_) => {}
        }
        if !backoff.pause(&task.cancel).await {
            return;
        }
    }
}
