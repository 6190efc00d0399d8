//! Evaluations as Nomad's API carries them (`api/evaluations.go`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    AllocationMetric, GO_ZERO_TIME, job_type_from, nanos_from_rfc3339, rfc3339_from_nanos,
};
use crate::types::{self as internal, EvalStatus, EvalTrigger, PlacementFailure};

/// An evaluation in Nomad's shape (`GET /v1/evaluation/:id`, and the lines of the
/// evaluation lists: Nomad lists whole evaluations).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Evaluation {
    /// UUID.
    #[serde(rename = "ID", deserialize_with = "super::null_default")]
    pub id: String,
    /// The job's priority.
    #[serde(rename = "Priority")]
    pub priority: i64,
    /// The job's type.
    #[serde(rename = "Type", deserialize_with = "super::null_default")]
    pub eval_type: String,
    /// `job-register`, `job-deregister`, `node-update`, `node-drain`, `alloc-failure`,
    /// `queued-allocs`, `rolling-update`, `max-plan-attempts`, ...
    #[serde(rename = "TriggeredBy", deserialize_with = "super::null_default")]
    pub triggered_by: String,
    /// `default`.
    #[serde(rename = "Namespace", deserialize_with = "super::null_default")]
    pub namespace: String,
    /// The job's id.
    #[serde(rename = "JobID", deserialize_with = "super::null_default")]
    pub job_id: String,
    /// Index of the job spec it evaluated.
    #[serde(rename = "JobModifyIndex")]
    pub job_modify_index: u64,
    /// The node concerned (node updates and drains).
    #[serde(rename = "NodeID", deserialize_with = "super::null_default")]
    pub node_id: String,
    /// The node's index (Drover: 0).
    #[serde(rename = "NodeModifyIndex")]
    pub node_modify_index: u64,
    /// Deployment (none in Drover).
    #[serde(rename = "DeploymentID", deserialize_with = "super::null_default")]
    pub deployment_id: String,
    /// `pending`, `blocked`, `complete`, `failed`, `canceled`.
    #[serde(rename = "Status", deserialize_with = "super::null_default")]
    pub status: String,
    /// Why the status.
    #[serde(rename = "StatusDescription", deserialize_with = "super::null_default")]
    pub status_description: String,
    /// Wait before it is handled, nanoseconds (Drover uses `WaitUntil`).
    #[serde(rename = "Wait")]
    pub wait: i64,
    /// RFC 3339 before which it is not handled; absent: none.
    #[serde(rename = "WaitUntil", skip_serializing_if = "Option::is_none")]
    pub wait_until: Option<String>,
    /// The evaluation after this one.
    #[serde(rename = "NextEval", deserialize_with = "super::null_default")]
    pub next_eval: String,
    /// The evaluation this one follows.
    #[serde(rename = "PreviousEval", deserialize_with = "super::null_default")]
    pub previous_eval: String,
    /// The blocked evaluation this one created.
    #[serde(rename = "BlockedEval", deserialize_with = "super::null_default")]
    pub blocked_eval: String,
    /// What could not be placed, per group.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, AllocationMetric>>,
    /// Node classes (none in Drover).
    #[serde(rename = "ClassEligibility")]
    pub class_eligibility: Option<BTreeMap<String, bool>>,
    /// Classes (none in Drover).
    #[serde(rename = "EscapedComputedClass")]
    pub escaped_computed_class: bool,
    /// Quotas (Enterprise).
    #[serde(rename = "QuotaLimitReached", deserialize_with = "super::null_default")]
    pub quota_limit_reached: String,
    /// Plan annotations asked for.
    #[serde(rename = "AnnotatePlan")]
    pub annotate_plan: bool,
    /// Copies still to place, per group.
    #[serde(rename = "QueuedAllocations")]
    pub queued_allocations: Option<BTreeMap<String, i64>>,
    /// The state index the scheduler worked at (Drover: 0).
    #[serde(rename = "SnapshotIndex")]
    pub snapshot_index: u64,
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

/// The name of an internal enum as it serializes (the same words Nomad uses).
fn word<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// An internal enum from its word, `None` when Drover has no such value.
fn from_word<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(Value::String(s.to_owned())).ok()
}

impl From<&internal::Evaluation> for Evaluation {
    fn from(e: &internal::Evaluation) -> Evaluation {
        Evaluation {
            id: e.id.clone(),
            priority: i64::from(e.priority),
            eval_type: e.job_type.as_str().to_owned(),
            triggered_by: word(&e.triggered_by),
            namespace: e.namespace.clone(),
            job_id: e.job_name.clone(),
            job_modify_index: e.job_modify_index,
            node_id: e.node_id.clone().unwrap_or_default(),
            node_modify_index: 0,
            deployment_id: String::new(),
            status: word(&e.status),
            status_description: e.status_description.clone(),
            wait: 0,
            wait_until: e.wait_until.map(rfc3339_from_nanos),
            next_eval: String::new(),
            previous_eval: e.previous_eval.clone().unwrap_or_default(),
            blocked_eval: e.blocked_eval.clone().unwrap_or_default(),
            failed_tg_allocs: Some(
                e.failed_tg_allocs
                    .iter()
                    .map(|(g, f)| (g.clone(), AllocationMetric::from(f)))
                    .collect(),
            ),
            class_eligibility: None,
            escaped_computed_class: false,
            quota_limit_reached: String::new(),
            annotate_plan: false,
            queued_allocations: Some(
                e.queued_allocations
                    .iter()
                    .map(|(g, n)| (g.clone(), i64::from(*n)))
                    .collect(),
            ),
            snapshot_index: 0,
            create_index: e.create_index,
            modify_index: e.modify_index,
            create_time: e.create_time,
            modify_time: e.modify_time,
        }
    }
}

impl Evaluation {
    /// The evaluation as Drover keeps it. A trigger or status Drover has no word for
    /// (Nomad's `periodic-job`, ...) reads as the default (`job-register`, `pending`).
    pub fn to_internal(&self) -> internal::Evaluation {
        let none_if_empty = |s: &str| Some(s.to_owned()).filter(|s| !s.is_empty());
        internal::Evaluation {
            namespace: super::namespace_or_default(&self.namespace),
            id: self.id.clone(),
            job_name: self.job_id.clone(),
            job_type: job_type_from(&self.eval_type),
            priority: u8::try_from(self.priority).unwrap_or(u8::MAX),
            triggered_by: from_word::<EvalTrigger>(&self.triggered_by).unwrap_or_default(),
            status: from_word::<EvalStatus>(&self.status).unwrap_or_default(),
            status_description: self.status_description.clone(),
            node_id: none_if_empty(&self.node_id),
            failed_tg_allocs: self
                .failed_tg_allocs
                .iter()
                .flatten()
                .map(|(g, m)| (g.clone(), PlacementFailure::from(m)))
                .collect(),
            queued_allocations: self
                .queued_allocations
                .iter()
                .flatten()
                .map(|(g, n)| (g.clone(), u32::try_from(*n).unwrap_or(0)))
                .collect(),
            blocked_eval: none_if_empty(&self.blocked_eval),
            previous_eval: none_if_empty(&self.previous_eval),
            wait_until: self
                .wait_until
                .as_deref()
                .filter(|w| *w != GO_ZERO_TIME)
                .and_then(nanos_from_rfc3339),
            job_modify_index: self.job_modify_index,
            create_index: self.create_index,
            modify_index: self.modify_index,
            create_time: self.create_time,
            modify_time: self.modify_time,
        }
    }
}
