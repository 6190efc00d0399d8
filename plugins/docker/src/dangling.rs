//! Containers with this agent's Drover labels whose task the plugin does not track:
//! left behind by a task the agent forgot (its state was wiped, a destroy failed while
//! the daemon was away). They are reported, and removed when the operator enables it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use drover_plugin_sdk::TaskEvent;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::{DanglingConfig, LABEL_ALLOC_DIR, LABEL_TASK_ID};
use crate::engine::Engine;
use crate::handle::short;
use crate::store::Store;

/// The periodic sweep.
pub(crate) struct Reconciler {
    pub engine: Arc<Engine>,
    pub store: Arc<Store>,
    pub events: broadcast::Sender<TaskEvent>,
    pub config: DanglingConfig,
    /// Only containers labelled with this agent's allocation directory are looked at.
    pub alloc_dir: String,
    /// When the plugin process started.
    pub started: Instant,
}

impl Reconciler {
    /// Sweep every `period` until `cancel`.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut reported = HashSet::new();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.period) => {}
                () = cancel.cancelled() => return,
            }
            // A new plugin process knows no task until the agent recovers them.
            if self.started.elapsed() < self.config.creation_grace {
                continue;
            }
            self.sweep(&mut reported).await;
        }
    }

    async fn sweep(&self, reported: &mut HashSet<String>) {
        let Ok(docker) = self.engine.client().await else {
            return;
        };
        let options = bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![format!("{LABEL_ALLOC_DIR}={}", self.alloc_dir)],
            )])),
            ..Default::default()
        };
        let list = match docker.list_containers(Some(options)).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!("listing containers for dangling ones: {e}");
                return;
            }
        };
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let grace = self.config.creation_grace.as_secs();
        for c in list {
            let (Some(id), Some(labels)) = (c.id.as_deref(), c.labels.as_ref()) else {
                continue;
            };
            let Some(task_id) = labels.get(LABEL_TASK_ID) else {
                continue;
            };
            let created = c.created.and_then(|t| u64::try_from(t).ok()).unwrap_or(now);
            if self.store.knows(task_id) || created.saturating_add(grace) > now {
                continue;
            }
            let state = c.state.map(|s| s.to_string()).unwrap_or_default();
            if reported.insert(id.to_owned()) {
                let what = format!(
                    "container {} ({state}) belongs to task {task_id}, which this agent does not \
                     know",
                    short(id)
                );
                let action = if self.config.remove {
                    "removing it"
                } else {
                    "set gc.dangling_containers.remove = true to remove such containers"
                };
                tracing::warn!(container = id, task = %task_id, "dangling {what}; {action}");
                let _ = self.events.send(
                    TaskEvent::new(task_id.clone(), format!("dangling {what}"))
                        .with_annotation("container_id", id)
                        .with_annotation("removed", self.config.remove.to_string()),
                );
            }
            if self.config.remove {
                let options = bollard::query_parameters::RemoveContainerOptions {
                    force: true,
                    v: true,
                    link: false,
                };
                match docker.remove_container(id, Some(options)).await {
                    Ok(()) => tracing::info!(container = id, "dangling container removed"),
                    Err(e) => tracing::warn!(container = id, "removing dangling container: {e}"),
                }
            }
        }
    }
}
