//! Allocations as Nomad's API carries them (`api/allocations.go`, `api/tasks.go`'s
//! `TaskState` and `TaskEvent`), and the placement metrics of evaluations and plans.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    GO_ZERO_TIME, Job, Resources, allocated_resources, allocation_network, namespace_or_default,
    nanos_from_rfc3339, ports_of_allocated_resources,
};
use crate::types::{
    self as internal, AllocResources, ClientStatus, DesiredStatus, JobType, PlacementFailure,
    TaskRunState,
};

/// Why a group could not (all) be placed, in Nomad's shape (`FailedTGAllocs` of an
/// evaluation or a plan), with Drover's one-sentence reason and count.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocationMetric {
    /// Nodes considered.
    #[serde(rename = "NodesEvaluated")]
    pub nodes_evaluated: u64,
    /// Nodes filtered out.
    #[serde(rename = "NodesFiltered")]
    pub nodes_filtered: u64,
    /// Nodes available per datacenter.
    #[serde(rename = "NodesAvailable", deserialize_with = "super::null_default")]
    pub nodes_available: BTreeMap<String, u64>,
    /// Nodes filtered by class.
    #[serde(rename = "ClassFiltered", deserialize_with = "super::null_default")]
    pub class_filtered: BTreeMap<String, u64>,
    /// Nodes filtered, by the reason (constraint, missing driver).
    #[serde(
        rename = "ConstraintFiltered",
        deserialize_with = "super::null_default"
    )]
    pub constraint_filtered: BTreeMap<String, u64>,
    /// Nodes feasible but full.
    #[serde(rename = "NodesExhausted")]
    pub nodes_exhausted: u64,
    /// Nodes full by class.
    #[serde(rename = "ClassExhausted", deserialize_with = "super::null_default")]
    pub class_exhausted: BTreeMap<String, u64>,
    /// Nodes full, by dimension (`memory`, `cpu`).
    #[serde(
        rename = "DimensionExhausted",
        deserialize_with = "super::null_default"
    )]
    pub dimension_exhausted: BTreeMap<String, u64>,
    /// Quotas exhausted (Enterprise).
    #[serde(rename = "QuotaExhausted")]
    pub quota_exhausted: Option<Vec<String>>,
    /// Scores (none in Drover).
    #[serde(rename = "Scores")]
    pub scores: Option<BTreeMap<String, f64>>,
    /// Time the placement took, nanoseconds.
    #[serde(rename = "AllocationTime")]
    pub allocation_time: i64,
    /// Further copies that failed the same way (unplaced − 1).
    #[serde(rename = "CoalescedFailures")]
    pub coalesced_failures: u64,
    /// Drover: copies that could not be placed.
    #[serde(rename = "Unplaced")]
    pub unplaced: Option<u32>,
    /// Drover: why, in one sentence.
    #[serde(rename = "Reason")]
    pub reason: Option<String>,
}

impl From<&PlacementFailure> for AllocationMetric {
    fn from(f: &PlacementFailure) -> AllocationMetric {
        let widen = |m: &BTreeMap<String, u32>| -> BTreeMap<String, u64> {
            m.iter().map(|(k, v)| (k.clone(), u64::from(*v))).collect()
        };
        AllocationMetric {
            nodes_evaluated: u64::from(f.nodes_evaluated),
            nodes_filtered: f.nodes_filtered.values().map(|v| u64::from(*v)).sum(),
            constraint_filtered: widen(&f.nodes_filtered),
            nodes_exhausted: f.nodes_exhausted.values().map(|v| u64::from(*v)).sum(),
            dimension_exhausted: widen(&f.nodes_exhausted),
            coalesced_failures: u64::from(f.unplaced.saturating_sub(1)),
            unplaced: Some(f.unplaced),
            reason: Some(f.reason.clone()),
            ..Default::default()
        }
    }
}

impl From<&AllocationMetric> for PlacementFailure {
    fn from(m: &AllocationMetric) -> PlacementFailure {
        let narrow = |m: &BTreeMap<String, u64>| -> BTreeMap<String, u32> {
            m.iter()
                .map(|(k, v)| (k.clone(), u32::try_from(*v).unwrap_or(u32::MAX)))
                .collect()
        };
        let unplaced = m.unplaced.unwrap_or_else(|| {
            u32::try_from(m.coalesced_failures.saturating_add(1)).unwrap_or(u32::MAX)
        });
        let reason = match &m.reason {
            Some(r) => r.clone(),
            // A Nomad server gives no sentence: make one from its counts.
            None => nomad_reason(m),
        };
        PlacementFailure {
            unplaced,
            reason,
            nodes_evaluated: u32::try_from(m.nodes_evaluated).unwrap_or(u32::MAX),
            nodes_filtered: narrow(&m.constraint_filtered),
            nodes_exhausted: narrow(&m.dimension_exhausted),
        }
    }
}

fn nomad_reason(m: &AllocationMetric) -> String {
    if m.nodes_evaluated == 0 {
        return "no node is eligible".to_owned();
    }
    let mut parts = Vec::new();
    for (why, n) in &m.constraint_filtered {
        parts.push(format!("{why} filtered {n} nodes"));
    }
    for (dim, n) in &m.dimension_exhausted {
        parts.push(format!("{dim} exhausted on {n} nodes"));
    }
    if parts.is_empty() {
        format!("{} nodes evaluated, none feasible", m.nodes_evaluated)
    } else {
        parts.join("; ")
    }
}

// ---------------------------------------------------------------------------------------
// Task states
// ---------------------------------------------------------------------------------------

/// A task's state within an allocation, in Nomad's shape, with Drover's own facts in
/// extra keys (`TaskID`, `ExitCode`, `Starts`, `Message`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskState {
    /// `pending`, `running` or `dead`.
    #[serde(rename = "State", deserialize_with = "super::null_default")]
    pub state: String,
    /// Dead unsuccessfully.
    #[serde(rename = "Failed")]
    pub failed: bool,
    /// Restarts so far.
    #[serde(rename = "Restarts")]
    pub restarts: u64,
    /// RFC 3339 of the last restart (`null`: none).
    #[serde(rename = "LastRestart")]
    pub last_restart: Option<String>,
    /// RFC 3339 of the last start (`null`: never).
    #[serde(rename = "StartedAt")]
    pub started_at: Option<String>,
    /// RFC 3339 of the end (`null`: not dead).
    #[serde(rename = "FinishedAt")]
    pub finished_at: Option<String>,
    /// What happened, oldest first.
    #[serde(rename = "Events")]
    pub events: Option<Vec<TaskEvent>>,
    /// Drover: the node-local task id (`drover task status ID` on that agent).
    #[serde(rename = "TaskID", skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Drover: the exit code of the last run, once it ended.
    #[serde(rename = "ExitCode", skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Drover: times the task was started (1 + restarts, unless it never started).
    #[serde(rename = "Starts", skip_serializing_if = "Option::is_none")]
    pub starts: Option<u32>,
    /// Drover: the last event, for people.
    #[serde(rename = "Message", skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One event of a task, in Nomad's shape (the fields clients read; the rest of
/// Nomad's are accepted and kept).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskEvent {
    /// `Received`, `Started`, `Terminated`, `Killed`, `Driver Failure`, ...
    #[serde(rename = "Type", deserialize_with = "super::null_default")]
    pub event_type: String,
    /// Nanoseconds since the epoch.
    #[serde(rename = "Time")]
    pub time: i64,
    /// For people.
    #[serde(rename = "DisplayMessage", deserialize_with = "super::null_default")]
    pub display_message: String,
    /// Key/value details (`exit_code`, ...).
    #[serde(rename = "Details", deserialize_with = "super::null_default")]
    pub details: BTreeMap<String, String>,
    /// The raw message.
    #[serde(rename = "Message", deserialize_with = "super::null_default")]
    pub message: String,
    /// The event made the task fail.
    #[serde(rename = "FailsTask")]
    pub fails_task: bool,
    /// Why it restarts.
    #[serde(rename = "RestartReason", deserialize_with = "super::null_default")]
    pub restart_reason: String,
    /// Setup failure.
    #[serde(rename = "SetupError", deserialize_with = "super::null_default")]
    pub setup_error: String,
    /// Driver failure.
    #[serde(rename = "DriverError", deserialize_with = "super::null_default")]
    pub driver_error: String,
    /// Driver message.
    #[serde(rename = "DriverMessage", deserialize_with = "super::null_default")]
    pub driver_message: String,
    /// Exit code (`Terminated`).
    #[serde(rename = "ExitCode")]
    pub exit_code: i64,
    /// Signal (`Terminated`).
    #[serde(rename = "Signal")]
    pub signal: i64,
    /// Why it was killed.
    #[serde(rename = "KillReason", deserialize_with = "super::null_default")]
    pub kill_reason: String,
    /// Kill timeout, nanoseconds.
    #[serde(rename = "KillTimeout")]
    pub kill_timeout: i64,
    /// Kill failure.
    #[serde(rename = "KillError", deserialize_with = "super::null_default")]
    pub kill_error: String,
    /// Restart delay, nanoseconds.
    #[serde(rename = "StartDelay")]
    pub start_delay: i64,
    /// Artifact download failure.
    #[serde(rename = "DownloadError", deserialize_with = "super::null_default")]
    pub download_error: String,
    /// Validation failure.
    #[serde(rename = "ValidationError", deserialize_with = "super::null_default")]
    pub validation_error: String,
    /// Disk limit.
    #[serde(rename = "DiskLimit")]
    pub disk_limit: i64,
    /// The sibling that failed.
    #[serde(rename = "FailedSibling", deserialize_with = "super::null_default")]
    pub failed_sibling: String,
    /// Vault failure.
    #[serde(rename = "VaultError", deserialize_with = "super::null_default")]
    pub vault_error: String,
    /// Why a signal was sent.
    #[serde(rename = "TaskSignalReason", deserialize_with = "super::null_default")]
    pub task_signal_reason: String,
    /// The signal sent.
    #[serde(rename = "TaskSignal", deserialize_with = "super::null_default")]
    pub task_signal: String,
    /// Source of a generic event.
    #[serde(rename = "GenericSource", deserialize_with = "super::null_default")]
    pub generic_source: String,
}

impl TaskEvent {
    fn new(event_type: &str, time: i64, display_message: String) -> TaskEvent {
        TaskEvent {
            event_type: event_type.to_owned(),
            time,
            display_message,
            ..Default::default()
        }
    }
}

fn run_state(s: TaskRunState) -> &'static str {
    match s {
        TaskRunState::Pending => "pending",
        TaskRunState::Running => "running",
        TaskRunState::Dead => "dead",
    }
}

fn time_of(t: &Option<String>) -> i64 {
    t.as_deref().and_then(nanos_from_rfc3339).unwrap_or(0)
}

impl From<&internal::TaskState> for TaskState {
    /// Drover keeps no event history: the events are made from what it keeps (the
    /// start, the end with its exit code, the last message).
    fn from(t: &internal::TaskState) -> TaskState {
        let mut events = Vec::new();
        if t.started_at.is_some() {
            events.push(TaskEvent::new(
                "Started",
                time_of(&t.started_at),
                "Task started by client".to_owned(),
            ));
        }
        if t.state == TaskRunState::Dead {
            let time = time_of(&t.finished_at);
            let mut e = match t.exit_code {
                Some(code) => {
                    let mut e = TaskEvent::new("Terminated", time, format!("Exit Code: {code}"));
                    e.exit_code = i64::from(code);
                    e.details.insert("exit_code".into(), code.to_string());
                    if !t.message.is_empty() {
                        e.display_message =
                            format!("Exit Code: {code}, Exit Message: {:?}", t.message);
                    }
                    e
                }
                // The client's artifact hook failed the task's start (Nomad's event).
                None if t.failed
                    && t.message
                        .strip_prefix(internal::ARTIFACT_HOOK)
                        .is_some_and(|m| m.starts_with(" hook: ")) =>
                {
                    let mut e = TaskEvent::new("Failed Artifact Download", time, t.message.clone());
                    e.download_error = t.message.clone();
                    e
                }
                None if t.failed => TaskEvent::new("Driver Failure", time, t.message.clone()),
                None => TaskEvent::new("Killed", time, "Task successfully killed".to_owned()),
            };
            e.fails_task = t.failed;
            events.push(e);
        } else if !t.message.is_empty() {
            let kind = match t.state {
                TaskRunState::Pending => "Received",
                _ => "Driver",
            };
            events.push(TaskEvent::new(kind, 0, t.message.clone()));
        }
        if let Some(last) = events.last_mut() {
            last.message = t.message.clone();
            if last.display_message.is_empty() {
                last.display_message = t.message.clone();
            }
        }
        TaskState {
            state: run_state(t.state).to_owned(),
            failed: t.failed,
            restarts: u64::from(t.restarts),
            last_restart: None,
            started_at: t.started_at.clone(),
            finished_at: t.finished_at.clone(),
            events: Some(events),
            task_id: Some(t.task_id.clone()).filter(|s| !s.is_empty()),
            exit_code: t.exit_code,
            starts: Some(t.starts),
            message: Some(t.message.clone()),
        }
    }
}

impl From<&TaskState> for internal::TaskState {
    /// Drover's extra keys when present; from a Nomad server, what its events say.
    fn from(t: &TaskState) -> internal::TaskState {
        let when = |s: &Option<String>| s.clone().filter(|s| !s.is_empty() && s != GO_ZERO_TIME);
        let started_at = when(&t.started_at);
        let restarts = u32::try_from(t.restarts).unwrap_or(u32::MAX);
        let events = t.events.as_deref().unwrap_or_default();
        let exit_code = t.exit_code.or_else(|| {
            events
                .iter()
                .rev()
                .find(|e| e.event_type == "Terminated")
                .and_then(|e| i32::try_from(e.exit_code).ok())
        });
        let message = match &t.message {
            Some(m) => m.clone(),
            None => events
                .last()
                .map(|e| {
                    if e.display_message.is_empty() {
                        e.message.clone()
                    } else {
                        e.display_message.clone()
                    }
                })
                .unwrap_or_default(),
        };
        internal::TaskState {
            state: match t.state.as_str() {
                "running" => TaskRunState::Running,
                "dead" => TaskRunState::Dead,
                _ => TaskRunState::Pending,
            },
            failed: t.failed,
            exit_code,
            restarts,
            starts: t.starts.unwrap_or(if started_at.is_some() {
                restarts.saturating_add(1)
            } else {
                0
            }),
            started_at,
            finished_at: when(&t.finished_at),
            task_id: t.task_id.clone().unwrap_or_default(),
            message,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Allocations
// ---------------------------------------------------------------------------------------

/// One replacement of a failed allocation, in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RescheduleEvent {
    /// Nanoseconds since the epoch.
    #[serde(rename = "RescheduleTime")]
    pub reschedule_time: i64,
    /// The failed allocation replaced.
    #[serde(rename = "PrevAllocID", deserialize_with = "super::null_default")]
    pub prev_alloc_id: String,
    /// Its node (Drover does not keep it: empty).
    #[serde(rename = "PrevNodeID", deserialize_with = "super::null_default")]
    pub prev_node_id: String,
    /// The wait before the replacement, nanoseconds.
    #[serde(rename = "Delay", with = "super::duration::plain")]
    pub delay: std::time::Duration,
}

/// The replacements that led to an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RescheduleTracker {
    /// Oldest first.
    #[serde(rename = "Events")]
    pub events: Option<Vec<RescheduleEvent>>,
}

/// An allocation in Nomad's shape (`GET /v1/allocation/:id`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Allocation {
    /// UUID.
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// `default`.
    #[serde(rename = "Namespace", deserialize_with = "super::null_default")]
    pub namespace: String,
    /// The evaluation that placed it.
    #[serde(rename = "EvalID", deserialize_with = "super::null_default")]
    pub eval_id: String,
    /// `job.group[index]`.
    #[serde(rename = "Name", deserialize_with = "super::null_default")]
    pub name: String,
    /// Node id.
    #[serde(rename = "NodeID", deserialize_with = "super::null_default")]
    pub node_id: String,
    /// Node name.
    #[serde(rename = "NodeName", deserialize_with = "super::null_default")]
    pub node_name: String,
    /// The job's id.
    #[serde(rename = "JobID", deserialize_with = "super::null_default")]
    pub job_id: String,
    /// The job at the version the allocation runs (the server fills it in).
    #[serde(rename = "Job")]
    pub job: Option<Box<Job>>,
    /// Group name.
    #[serde(rename = "TaskGroup", deserialize_with = "super::null_default")]
    pub task_group: String,
    /// What it reserves on the node (the sum of its tasks).
    #[serde(rename = "Resources")]
    pub resources: Option<Resources>,
    /// Per task (the server fills it in when it has the group).
    #[serde(rename = "TaskResources")]
    pub task_resources: Option<BTreeMap<String, Resources>>,
    /// Nomad's newer resources shape: Drover fills `Shared.Ports` and
    /// `Shared.Networks` (the allocation's ports); otherwise kept as it came.
    #[serde(rename = "AllocatedResources")]
    pub allocated_resources: Option<Value>,
    /// How it was placed.
    #[serde(rename = "Metrics")]
    pub metrics: Option<AllocationMetric>,
    /// `run` or `stop`.
    #[serde(rename = "DesiredStatus", deserialize_with = "super::null_default")]
    pub desired_status: String,
    /// Why.
    #[serde(
        rename = "DesiredDescription",
        deserialize_with = "super::null_default"
    )]
    pub desired_description: String,
    /// Migration hints (none in Drover).
    #[serde(rename = "DesiredTransition")]
    pub desired_transition: Value,
    /// `pending`, `running`, `complete`, `failed`, `lost`.
    #[serde(rename = "ClientStatus", deserialize_with = "super::null_default")]
    pub client_status: String,
    /// Why.
    #[serde(rename = "ClientDescription", deserialize_with = "super::null_default")]
    pub client_description: String,
    /// By task name.
    #[serde(rename = "TaskStates")]
    pub task_states: Option<BTreeMap<String, TaskState>>,
    /// The deployment that placed it.
    #[serde(rename = "DeploymentID", deserialize_with = "super::null_default")]
    pub deployment_id: String,
    /// Its health in the deployment (see [`super::deployment::alloc_status`]).
    #[serde(rename = "DeploymentStatus")]
    pub deployment_status: Option<Value>,
    /// Follow-up evaluation.
    #[serde(rename = "FollowupEvalID", deserialize_with = "super::null_default")]
    pub followup_eval_id: String,
    /// The allocation it replaces.
    #[serde(
        rename = "PreviousAllocation",
        deserialize_with = "super::null_default"
    )]
    pub previous_allocation: String,
    /// The allocation that replaced it.
    #[serde(rename = "NextAllocation", deserialize_with = "super::null_default")]
    pub next_allocation: String,
    /// The replacements that led to it.
    #[serde(rename = "RescheduleTracker")]
    pub reschedule_tracker: Option<RescheduleTracker>,
    /// Preemptions (none in Drover).
    #[serde(rename = "PreemptedAllocations")]
    pub preempted_allocations: Option<Vec<String>>,
    /// Preemptions (none in Drover).
    #[serde(
        rename = "PreemptedByAllocation",
        deserialize_with = "super::null_default"
    )]
    pub preempted_by_allocation: String,
    /// Index of creation.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
    /// Index of the last change the server made.
    #[serde(rename = "AllocModifyIndex")]
    pub alloc_modify_index: u64,
    /// Nanoseconds since the epoch.
    #[serde(rename = "CreateTime")]
    pub create_time: i64,
    /// Nanoseconds since the epoch.
    #[serde(rename = "ModifyTime")]
    pub modify_time: i64,
    /// Drover: the job version it runs (Nomad's has it in the embedded `Job`).
    #[serde(rename = "JobVersion")]
    pub job_version: u64,
}

/// One line of an allocation list, in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocationListStub {
    /// UUID.
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// The evaluation that placed it.
    #[serde(rename = "EvalID", deserialize_with = "super::null_default")]
    pub eval_id: String,
    /// `job.group[index]`.
    #[serde(rename = "Name", deserialize_with = "super::null_default")]
    pub name: String,
    /// `default`.
    #[serde(rename = "Namespace", deserialize_with = "super::null_default")]
    pub namespace: String,
    /// Node id.
    #[serde(rename = "NodeID", deserialize_with = "super::null_default")]
    pub node_id: String,
    /// Node name.
    #[serde(rename = "NodeName", deserialize_with = "super::null_default")]
    pub node_name: String,
    /// The job's id.
    #[serde(rename = "JobID", deserialize_with = "super::null_default")]
    pub job_id: String,
    /// The job's type.
    #[serde(rename = "JobType", deserialize_with = "super::null_default")]
    pub job_type: String,
    /// The job version it runs.
    #[serde(rename = "JobVersion")]
    pub job_version: u64,
    /// Group name.
    #[serde(rename = "TaskGroup", deserialize_with = "super::null_default")]
    pub task_group: String,
    /// The allocation's ports (`Shared.Ports`, `Shared.Networks`), as Nomad's stub
    /// carries them; absent when it has none.
    #[serde(
        rename = "AllocatedResources",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allocated_resources: Option<Value>,
    /// `run` or `stop`.
    #[serde(rename = "DesiredStatus", deserialize_with = "super::null_default")]
    pub desired_status: String,
    /// Why.
    #[serde(
        rename = "DesiredDescription",
        deserialize_with = "super::null_default"
    )]
    pub desired_description: String,
    /// `pending`, `running`, `complete`, `failed`, `lost`.
    #[serde(rename = "ClientStatus", deserialize_with = "super::null_default")]
    pub client_status: String,
    /// Why.
    #[serde(rename = "ClientDescription", deserialize_with = "super::null_default")]
    pub client_description: String,
    /// Migration hints (none in Drover).
    #[serde(rename = "DesiredTransition")]
    pub desired_transition: Value,
    /// By task name.
    #[serde(rename = "TaskStates")]
    pub task_states: Option<BTreeMap<String, TaskState>>,
    /// Its health in the deployment (see [`super::deployment::alloc_status`]).
    #[serde(rename = "DeploymentStatus")]
    pub deployment_status: Option<Value>,
    /// Follow-up evaluation.
    #[serde(rename = "FollowupEvalID", deserialize_with = "super::null_default")]
    pub followup_eval_id: String,
    /// The replacements that led to it.
    #[serde(rename = "RescheduleTracker")]
    pub reschedule_tracker: Option<RescheduleTracker>,
    /// Preemptions (none in Drover).
    #[serde(rename = "PreemptedAllocations")]
    pub preempted_allocations: Option<Vec<String>>,
    /// Preemptions (none in Drover).
    #[serde(
        rename = "PreemptedByAllocation",
        deserialize_with = "super::null_default"
    )]
    pub preempted_by_allocation: String,
    /// Index of creation.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of the last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
    /// Nanoseconds since the epoch.
    #[serde(rename = "CreateTime")]
    pub create_time: i64,
    /// Nanoseconds since the epoch.
    #[serde(rename = "ModifyTime")]
    pub modify_time: i64,
}

/// `run` or `stop`.
pub fn desired_status(s: DesiredStatus) -> &'static str {
    match s {
        DesiredStatus::Run => "run",
        DesiredStatus::Stop => "stop",
    }
}

fn desired_status_from(s: &str) -> DesiredStatus {
    match s {
        // Nomad's `evict` stops the allocation too.
        "stop" | "evict" => DesiredStatus::Stop,
        _ => DesiredStatus::Run,
    }
}

fn client_status_from(s: &str) -> ClientStatus {
    match s {
        "running" => ClientStatus::Running,
        "complete" => ClientStatus::Complete,
        "failed" => ClientStatus::Failed,
        "lost" => ClientStatus::Lost,
        _ => ClientStatus::Pending,
    }
}

/// The copy index of an allocation name `job.group[3]` (0 when it has none).
pub fn alloc_index_of(name: &str) -> u32 {
    name.strip_suffix(']')
        .and_then(|n| n.rsplit_once('['))
        .and_then(|(_, i)| i.parse().ok())
        .unwrap_or(0)
}

fn task_states(m: &BTreeMap<String, internal::TaskState>) -> Option<BTreeMap<String, TaskState>> {
    Some(
        m.iter()
            .map(|(k, v)| (k.clone(), TaskState::from(v)))
            .collect(),
    )
}

fn internal_task_states(
    m: &Option<BTreeMap<String, TaskState>>,
) -> BTreeMap<String, internal::TaskState> {
    m.iter()
        .flatten()
        .map(|(k, v)| (k.clone(), internal::TaskState::from(v)))
        .collect()
}

fn tracker(events: &[internal::RescheduleEvent]) -> Option<RescheduleTracker> {
    (!events.is_empty()).then(|| RescheduleTracker {
        events: Some(
            events
                .iter()
                .map(|e| RescheduleEvent {
                    reschedule_time: e.time,
                    prev_alloc_id: e.prev_alloc_id.clone(),
                    prev_node_id: String::new(),
                    delay: e.delay,
                })
                .collect(),
        ),
    })
}

fn internal_reschedule_events(t: &Option<RescheduleTracker>) -> Vec<internal::RescheduleEvent> {
    t.iter()
        .flat_map(|t| t.events.iter().flatten())
        .map(|e| internal::RescheduleEvent {
            time: e.reschedule_time,
            prev_alloc_id: e.prev_alloc_id.clone(),
            delay: e.delay,
        })
        .collect()
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl From<&internal::Allocation> for Allocation {
    /// The allocation without its `Job` and `TaskResources` (the server adds them when
    /// it has the job at hand).
    fn from(a: &internal::Allocation) -> Allocation {
        Allocation {
            id: a.id.clone(),
            namespace: a.namespace.clone(),
            eval_id: a.eval_id.clone(),
            name: a.name.clone(),
            node_id: a.node_id.clone(),
            node_name: a.node_name.clone(),
            job_id: a.job_name.clone(),
            job: None,
            task_group: a.group.clone(),
            resources: Some(Resources {
                cpu: Some(i64::try_from(a.resources.cpu).unwrap_or(i64::MAX)),
                memory_mb: Some(i64::try_from(a.resources.memory_mb).unwrap_or(i64::MAX)),
                networks: (!a.ports.is_empty()).then(|| vec![allocation_network(&a.ports, None)]),
                ..Default::default()
            }),
            task_resources: None,
            allocated_resources: Some(with_devices(
                allocated_resources(&a.ports, None),
                &a.task_devices,
            )),
            metrics: None,
            desired_status: desired_status(a.desired_status).to_owned(),
            desired_description: a.desired_description.clone(),
            desired_transition: empty_object(),
            client_status: a.client_status.as_str().to_owned(),
            client_description: a.client_description.clone(),
            task_states: task_states(&a.task_states),
            deployment_id: a.deployment_id.clone().unwrap_or_default(),
            deployment_status: a
                .deployment_status
                .as_ref()
                .map(super::deployment::alloc_status),
            followup_eval_id: String::new(),
            previous_allocation: a.previous_allocation.clone().unwrap_or_default(),
            next_allocation: a.next_allocation.clone().unwrap_or_default(),
            reschedule_tracker: tracker(&a.reschedule_events),
            preempted_allocations: None,
            preempted_by_allocation: String::new(),
            create_index: a.create_index,
            modify_index: a.modify_index,
            alloc_modify_index: a.alloc_modify_index,
            create_time: a.create_time,
            modify_time: a.modify_time,
            job_version: a.job_version,
        }
    }
}

/// `AllocatedResources` with each task's devices under `Tasks.<task>.Devices`, in
/// Nomad's shape (`AllocatedDeviceResource`: Vendor, Type, Name, DeviceIDs).
fn with_devices(
    mut resources: Value,
    devices: &BTreeMap<String, Vec<crate::AllocatedDevices>>,
) -> Value {
    if devices.is_empty() {
        return resources;
    }
    if let Some(tasks) = resources
        .as_object_mut()
        .map(|o| o.entry("Tasks").or_insert_with(empty_object))
        .and_then(Value::as_object_mut)
    {
        for (task, given) in devices {
            let list: Vec<Value> = given
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "Vendor": d.vendor,
                        "Type": d.device_type,
                        "Name": d.name,
                        "DeviceIDs": d.device_ids,
                    })
                })
                .collect();
            let entry = tasks.entry(task.clone()).or_insert_with(empty_object);
            if let Some(o) = entry.as_object_mut() {
                o.insert("Devices".into(), Value::Array(list));
            }
        }
    }
    resources
}

/// Each task's devices read back from `AllocatedResources.Tasks.<task>.Devices`.
fn devices_of_allocated_resources(
    v: Option<&Value>,
) -> BTreeMap<String, Vec<crate::AllocatedDevices>> {
    let mut out = BTreeMap::new();
    let Some(tasks) = v.and_then(|v| v.get("Tasks")).and_then(Value::as_object) else {
        return out;
    };
    for (task, t) in tasks {
        let Some(list) = t.get("Devices").and_then(Value::as_array) else {
            continue;
        };
        let text = |d: &Value, k: &str| {
            d.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let given: Vec<crate::AllocatedDevices> = list
            .iter()
            .map(|d| crate::AllocatedDevices {
                vendor: text(d, "Vendor"),
                device_type: text(d, "Type"),
                name: text(d, "Name"),
                device_ids: d
                    .get("DeviceIDs")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i.as_str().map(str::to_owned))
                    .collect(),
            })
            .collect();
        if !given.is_empty() {
            out.insert(task.clone(), given);
        }
    }
    out
}

impl Allocation {
    /// With the group's tasks: `TaskResources` per task (what Nomad's clients read).
    pub fn with_group(mut self, group: &internal::TaskGroup) -> Allocation {
        // The group tells which ports were static and the network's mode.
        let ports = ports_of_allocated_resources(self.allocated_resources.as_ref());
        if group.network.is_some() || !ports.is_empty() {
            let devices = devices_of_allocated_resources(self.allocated_resources.as_ref());
            self.allocated_resources = Some(with_devices(
                allocated_resources(&ports, Some(group)),
                &devices,
            ));
            if let Some(r) = self.resources.as_mut() {
                r.networks = Some(vec![allocation_network(&ports, Some(group))]);
            }
        }
        self.task_resources = Some(
            group
                .tasks
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        Resources {
                            cpu: Some(i64::from(t.resources.cpu)),
                            memory_mb: Some(i64::from(t.resources.memory_mb)),
                            memory_max_mb: Some(i64::from(t.resources.memory_max_mb)),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        );
        self
    }

    /// The allocation as Drover keeps it (for clients that render internal types).
    pub fn to_internal(&self) -> internal::Allocation {
        let res = self.resources.clone().unwrap_or_default();
        let wide = |v: Option<i64>| u64::try_from(v.unwrap_or(0)).unwrap_or(0);
        let job_version = if self.job_version == 0 {
            self.job
                .as_ref()
                .and_then(|j| j.version)
                .unwrap_or_default()
        } else {
            self.job_version
        };
        internal::Allocation {
            task_devices: devices_of_allocated_resources(self.allocated_resources.as_ref()),
            namespace: namespace_or_default(&self.namespace),
            ports: ports_of_allocated_resources(self.allocated_resources.as_ref()),
            id: self.id.clone(),
            name: self.name.clone(),
            index: alloc_index_of(&self.name),
            job_name: self.job_id.clone(),
            job_version,
            group: self.task_group.clone(),
            node_id: self.node_id.clone(),
            node_name: self.node_name.clone(),
            resources: AllocResources {
                cpu: wide(res.cpu),
                memory_mb: wide(res.memory_mb),
            },
            desired_status: desired_status_from(&self.desired_status),
            desired_description: self.desired_description.clone(),
            client_status: client_status_from(&self.client_status),
            client_description: self.client_description.clone(),
            task_states: internal_task_states(&self.task_states),
            eval_id: self.eval_id.clone(),
            previous_allocation: Some(self.previous_allocation.clone()).filter(|s| !s.is_empty()),
            next_allocation: Some(self.next_allocation.clone()).filter(|s| !s.is_empty()),
            reschedule_events: internal_reschedule_events(&self.reschedule_tracker),
            deployment_id: Some(self.deployment_id.clone()).filter(|s| !s.is_empty()),
            deployment_status: self
                .deployment_status
                .as_ref()
                .and_then(super::deployment::alloc_status_from),
            create_index: self.create_index,
            modify_index: self.modify_index,
            alloc_modify_index: self.alloc_modify_index,
            create_time: self.create_time,
            modify_time: self.modify_time,
        }
    }
}

impl AllocationListStub {
    /// The stub of an allocation of a job of type `job_type`.
    pub fn new(a: &internal::Allocation, job_type: JobType) -> AllocationListStub {
        AllocationListStub {
            id: a.id.clone(),
            eval_id: a.eval_id.clone(),
            name: a.name.clone(),
            namespace: a.namespace.clone(),
            node_id: a.node_id.clone(),
            node_name: a.node_name.clone(),
            job_id: a.job_name.clone(),
            job_type: job_type.as_str().to_owned(),
            job_version: a.job_version,
            task_group: a.group.clone(),
            allocated_resources: (!a.ports.is_empty() || !a.task_devices.is_empty())
                .then(|| with_devices(allocated_resources(&a.ports, None), &a.task_devices)),
            desired_status: desired_status(a.desired_status).to_owned(),
            desired_description: a.desired_description.clone(),
            client_status: a.client_status.as_str().to_owned(),
            client_description: a.client_description.clone(),
            desired_transition: empty_object(),
            task_states: task_states(&a.task_states),
            deployment_status: a
                .deployment_status
                .as_ref()
                .map(super::deployment::alloc_status),
            followup_eval_id: String::new(),
            reschedule_tracker: tracker(&a.reschedule_events),
            preempted_allocations: None,
            preempted_by_allocation: String::new(),
            create_index: a.create_index,
            modify_index: a.modify_index,
            create_time: a.create_time,
            modify_time: a.modify_time,
        }
    }

    /// What a stub tells of the allocation as Drover keeps it: resources, the
    /// replaced and replacing allocations and the server's index are not in a stub
    /// (zero, none); fetch the allocation for them.
    pub fn to_internal(&self) -> internal::Allocation {
        internal::Allocation {
            task_devices: devices_of_allocated_resources(self.allocated_resources.as_ref()),
            namespace: namespace_or_default(&self.namespace),
            ports: ports_of_allocated_resources(self.allocated_resources.as_ref()),
            id: self.id.clone(),
            name: self.name.clone(),
            index: alloc_index_of(&self.name),
            job_name: self.job_id.clone(),
            job_version: self.job_version,
            group: self.task_group.clone(),
            node_id: self.node_id.clone(),
            node_name: self.node_name.clone(),
            resources: AllocResources::default(),
            desired_status: desired_status_from(&self.desired_status),
            desired_description: self.desired_description.clone(),
            client_status: client_status_from(&self.client_status),
            client_description: self.client_description.clone(),
            task_states: internal_task_states(&self.task_states),
            eval_id: self.eval_id.clone(),
            previous_allocation: None,
            next_allocation: None,
            reschedule_events: internal_reschedule_events(&self.reschedule_tracker),
            deployment_id: None,
            deployment_status: self
                .deployment_status
                .as_ref()
                .and_then(super::deployment::alloc_status_from),
            create_index: self.create_index,
            modify_index: self.modify_index,
            alloc_modify_index: self.modify_index,
            create_time: self.create_time,
            modify_time: self.modify_time,
        }
    }
}
