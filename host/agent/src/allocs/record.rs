//! What the state store keeps of an allocation: one JSON record per allocation,
//! versioned, written before the runner acts on it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use drover_server_api::{ClientAllocation, ClientStatus};
use serde::{Deserialize, Serialize};

use super::health::HealthDecision;
use super::hooks::HookState;
use crate::network::NetworkState;
use crate::state::StateError;

/// Version of the record encoding this agent writes and reads.
pub(crate) const RECORD_VERSION: u32 = 1;

/// Where an allocation's runner is. Only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Phase {
    /// Prestart tasks run; main tasks wait for the ephemeral ones to succeed.
    Prestart,
    /// Main tasks (and poststart tasks once every main task started) run.
    Main,
    /// Everything but poststop tasks is being stopped.
    Stopping,
    /// Poststop tasks run to completion.
    Poststop,
    /// Terminal.
    Done,
}

/// One task of the allocation on this node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct TaskSlot {
    /// The node-local task id, chosen and recorded before the task is started.
    pub id: String,
    /// `TaskManager::run_with` succeeded (a recorded id whose task the task manager
    /// does not know was never started, and is started after an agent restart).
    #[serde(default)]
    pub started: bool,
    /// Why the task could not be started (it counts as failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// The runner stopped it: its end is not a failure.
    #[serde(default)]
    pub stopped: bool,
    /// Starts for which the poststart hooks ran.
    #[serde(default)]
    pub poststarts: u32,
    /// The exited hooks ran.
    #[serde(default)]
    pub exited: bool,
    /// Per-hook state, by hook name.
    #[serde(default)]
    pub hooks: BTreeMap<String, HookState>,
    /// Prestart hooks that failed (an artifact that could not be fetched), each retried
    /// under the task's restart policy, as Nomad does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prestart_failures: u32,
    /// The last prestart failure while a retry is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prestart_error: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Everything needed to carry an allocation on after an agent restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AllocRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The allocation as the server last sent it.
    pub alloc: ClientAllocation,
    /// The runner's phase.
    pub phase: Phase,
    /// Tasks by name in the group (only those the runner got to).
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskSlot>,
    /// A task failed for good: the allocation ends failed.
    #[serde(default)]
    pub failed: bool,
    /// Why, for people (the client description).
    #[serde(default)]
    pub description: String,
    /// Missing from a complete set: stopped, and forgotten once terminal.
    #[serde(default)]
    pub forget: bool,
    /// When it became terminal on this node.
    #[serde(default)]
    pub terminal_at: Option<SystemTime>,
    /// Its bridge network (a group in `bridge` mode): recorded before it is made,
    /// with the address once it is; gone once torn down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkState>,
    /// Its health in its deployment once decided (final: an agent restart does not
    /// decide again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthDecision>,
}

impl AllocRecord {
    pub(crate) fn new(alloc: ClientAllocation) -> Self {
        AllocRecord {
            version: RECORD_VERSION,
            alloc,
            phase: Phase::Prestart,
            tasks: BTreeMap::new(),
            failed: false,
            description: String::new(),
            forget: false,
            terminal_at: None,
            network: None,
            health: None,
        }
    }

    /// The client status the record implies (before looking at tasks).
    pub(crate) fn terminal_status(&self) -> Option<ClientStatus> {
        (self.phase == Phase::Done).then_some(if self.failed {
            ClientStatus::Failed
        } else {
            ClientStatus::Complete
        })
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>, StateError> {
        serde_json::to_vec(self).map_err(|e| StateError::Io {
            op: format!("encode alloc record {}", self.alloc.alloc.id),
            reason: e.to_string(),
        })
    }

    /// Decode the record stored under `id`, refusing a version this agent does not
    /// know rather than guessing at its meaning.
    pub(crate) fn decode(id: &str, bytes: &[u8]) -> Result<AllocRecord, StateError> {
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let bad = |reason: String| StateError::Io {
            op: format!("read alloc record {id}"),
            reason,
        };
        let v: Versioned = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not an allocation record ({e})")))?;
        if v.version != RECORD_VERSION {
            return Err(bad(format!(
                "record version {} is not the version {RECORD_VERSION} this agent understands",
                v.version
            )));
        }
        let rec: AllocRecord = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("damaged allocation record ({e})")))?;
        if rec.alloc.alloc.id != id {
            return Err(bad(format!(
                "the record stored under {id} describes allocation {}",
                rec.alloc.alloc.id
            )));
        }
        Ok(rec)
    }
}
