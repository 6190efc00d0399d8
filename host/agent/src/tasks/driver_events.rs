//! What drivers say about their tasks: one subscriber per driver to its `TaskEvents`
//! stream, started with the first task of that driver, adds each event to its task's
//! events as a `DriverMessage` (e.g. the qemu driver's "the guest powered off", which
//! an exit code alone cannot tell from a stop by signal).
//!
//! A plugin is not trusted to be brief or truthful: an event naming a task of another
//! driver, or none this agent knows, is dropped; messages are cut to
//! [`MAX_DRIVER_MESSAGE`] bytes; the events list keeps its bound
//! ([`super::MAX_EVENTS`]). The subscriber follows the driver across process
//! replacements (its generation) and ends with the task manager.

use std::sync::{Arc, Weak};
use std::time::Duration;

use drover_api::TaskEventKind;
use drover_plugin_sdk::{DriverError, TaskEvent};
use tokio_stream::StreamExt as _;

use super::TaskManager;

/// Longest driver message kept, in bytes (cut at a character boundary).
pub const MAX_DRIVER_MESSAGE: usize = 1024;

/// How long to wait before subscribing again after the stream failed or ended while
/// the driver's process stayed the same.
const RESUBSCRIBE: Duration = Duration::from_secs(2);

impl TaskManager {
    /// Make sure a subscriber to `driver`'s task events runs.
    pub(super) fn watch_driver_events(self: &Arc<Self>, driver: &str) {
        let first = match self.event_watchers.lock() {
            Ok(mut w) => w.insert(driver.to_owned()),
            Err(_) => false,
        };
        if first {
            tokio::spawn(follow(Arc::downgrade(self), driver.to_owned()));
        }
    }

    /// Add `event` to its task, if that task is `driver`'s.
    fn driver_event(&self, driver: &str, event: TaskEvent) {
        let task = match self.tasks.read() {
            Ok(tasks) => tasks.get(&event.task_id).cloned(),
            Err(_) => None,
        };
        let Some(task) = task else {
            tracing::debug!(driver, task = %event.task_id, "event for an unknown task dropped");
            return;
        };
        if task.driver != driver {
            tracing::warn!(driver, task = %event.task_id, "event for another driver's task dropped");
            return;
        }
        task.event(TaskEventKind::DriverMessage, cut(event.message));
    }
}

/// `message` cut to [`MAX_DRIVER_MESSAGE`] bytes, with control characters (a plugin
/// could send terminal escapes to whoever reads `task events`) replaced.
fn cut(message: String) -> String {
    let mut out: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX_DRIVER_MESSAGE {
        let mut end = MAX_DRIVER_MESSAGE;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push('…');
    }
    out
}

async fn follow(manager: Weak<TaskManager>, driver: String) {
    loop {
        let Some(found) = manager.upgrade().map(|m| m.drivers.driver(&driver)) else {
            return;
        };
        let Some(handle) = found else {
            // Not loaded (yet, or any more): look again later.
            tokio::time::sleep(RESUBSCRIBE).await;
            continue;
        };
        let mut generation = handle.generation();
        generation.borrow_and_update();
        match handle.task_events().await {
            Ok(mut stream) => loop {
                tokio::select! {
                    item = stream.next() => match item {
                        Some(Ok(event)) => match manager.upgrade() {
                            Some(m) => m.driver_event(&driver, event),
                            None => return,
                        },
                        Some(Err(e)) => {
                            tracing::debug!(%driver, "task events stream failed: {e}");
                            break;
                        }
                        None => break,
                    },
                    // A new process: subscribe to it.
                    _ = generation.changed() => break,
                }
            },
            // This process has no events to give: ask again only of its successor.
            Err(DriverError::Unimplemented(_)) => {
                if generation.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Err(e) => tracing::debug!(%driver, "cannot subscribe to task events: {e}"),
        }
        if manager.strong_count() == 0 {
            return;
        }
        tokio::select! {
            _ = generation.changed() => {}
            _ = tokio::time::sleep(RESUBSCRIBE) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_and_cleaned() {
        assert_eq!(cut("guest powered off".into()), "guest powered off");
        assert_eq!(cut("a\u{1b}[2Jb\nc".into()), "a [2Jb c");
        let long = "é".repeat(MAX_DRIVER_MESSAGE);
        let c = cut(long);
        assert!(
            c.len() <= MAX_DRIVER_MESSAGE + '…'.len_utf8(),
            "{}",
            c.len()
        );
        assert!(c.ends_with('…'));
    }
}
