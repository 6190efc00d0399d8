//! What the state store keeps of a task: one JSON record per task, versioned.

use std::time::{Duration, SystemTime};

use drover_plugin_sdk::{TaskHandle, TaskSpec};
use serde::{Deserialize, Serialize};

use super::{RunRequest, TaskView};
use crate::state::StateError;

/// Version of the record encoding this agent writes and reads.
pub(crate) const RECORD_VERSION: u32 = 1;

/// Everything needed to bring a task back after the agent restarts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TaskRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The request as accepted (kill signal, timeout and restart policy come from it).
    pub request: RunRequest,
    /// The spec sent to `StartTask`, after the prestart hooks.
    pub spec: TaskSpec,
    /// The handle of the current incarnation, once `StartTask` returned it. A pending
    /// task without one may have been started by the driver: recovery asks.
    pub handle: Option<TaskHandle>,
    /// What the API shows.
    pub view: TaskView,
    /// Restart bookkeeping.
    #[serde(default)]
    pub restart: RestartState,
    /// Set once a user asked for the task to stop; never cleared.
    #[serde(default)]
    pub kill: Option<KillRequest>,
}

/// Restart bookkeeping of a task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RestartState {
    /// Restart times of the current interval window, oldest first.
    pub window: Vec<SystemTime>,
    /// When the pending restart is due (set between an exit and the next start).
    pub restart_at: Option<SystemTime>,
}

/// A user's stop: how to stop the task, should the agent have to do it after a restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct KillRequest {
    /// Signal name.
    pub signal: String,
    /// Time before SIGKILL.
    pub timeout: Duration,
}

impl TaskRecord {
    /// JSON bytes for the store.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        serde_json::to_vec(self).map_err(|e| StateError::Io {
            op: format!("encode task record {}", self.view.id),
            reason: e.to_string(),
        })
    }

    /// Decode the record stored under `id`, refusing a version this agent does not know
    /// rather than guessing at its meaning.
    pub fn decode(id: &str, bytes: &[u8]) -> Result<TaskRecord, StateError> {
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let bad = |reason: String| StateError::Io {
            op: format!("read task record {id}"),
            reason,
        };
        let v: Versioned = serde_json::from_slice(bytes).map_err(|e| {
            bad(format!(
                "not a task record ({e}); the state file is damaged: move it aside to start \
                 with empty state"
            ))
        })?;
        if v.version != RECORD_VERSION {
            return Err(bad(format!(
                "record version {} is not the version {RECORD_VERSION} this agent understands; \
                 run the agent version that wrote it (or a newer one)",
                v.version
            )));
        }
        let rec: TaskRecord = serde_json::from_slice(bytes).map_err(|e| {
            bad(format!(
                "damaged task record ({e}); move the state file aside to start with empty state"
            ))
        })?;
        if rec.view.id != id {
            return Err(bad(format!(
                "the record stored under {id} describes task {}",
                rec.view.id
            )));
        }
        Ok(rec)
    }
}
