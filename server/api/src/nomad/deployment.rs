//! Deployments in Nomad's shape: `GET /v1/deployment/:id`, `/v1/deployments`,
//! `/v1/job/:id/deployments`, and an allocation's `DeploymentStatus`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{duration, nanos_from_rfc3339, rfc3339_from_nanos};
use crate::types as internal;

/// A deployment as Nomad's API serves it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Deployment {
    /// UUID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace.
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// Job id.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The version it rolls out.
    #[serde(rename = "JobVersion")]
    pub job_version: u64,
    /// The job's modify index at that version.
    #[serde(rename = "JobModifyIndex")]
    pub job_modify_index: u64,
    /// The job's spec modify index at that version.
    #[serde(rename = "JobSpecModifyIndex")]
    pub job_spec_modify_index: u64,
    /// The job's create index.
    #[serde(rename = "JobCreateIndex")]
    pub job_create_index: u64,
    /// Always false (no multi-region deployments).
    #[serde(rename = "IsMultiregion")]
    pub is_multiregion: bool,
    /// Per group.
    #[serde(rename = "TaskGroups", deserialize_with = "super::null_default")]
    pub task_groups: BTreeMap<String, DeploymentState>,
    /// `running`, `paused`, `successful`, `failed`, `cancelled`.
    #[serde(rename = "Status")]
    pub status: String,
    /// Why.
    #[serde(rename = "StatusDescription")]
    pub status_description: String,
    /// Create index.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Modify index.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
}

/// One group's state in a deployment, in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentState {
    /// Revert on failure.
    #[serde(rename = "AutoRevert")]
    pub auto_revert: bool,
    /// Promote when the canaries are healthy.
    #[serde(rename = "AutoPromote")]
    pub auto_promote: bool,
    /// Nanoseconds.
    #[serde(rename = "ProgressDeadline", with = "duration::plain")]
    pub progress_deadline: Duration,
    /// RFC 3339 (Go's zero time: none).
    #[serde(rename = "RequireProgressBy")]
    pub require_progress_by: String,
    /// Promoted.
    #[serde(rename = "Promoted")]
    pub promoted: bool,
    /// Canary allocation ids.
    #[serde(rename = "PlacedCanaries", deserialize_with = "super::null_default")]
    pub placed_canaries: Vec<String>,
    /// Canaries wanted.
    #[serde(rename = "DesiredCanaries")]
    pub desired_canaries: u32,
    /// Allocations wanted.
    #[serde(rename = "DesiredTotal")]
    pub desired_total: u32,
    /// Placed.
    #[serde(rename = "PlacedAllocs")]
    pub placed_allocs: u32,
    /// Healthy.
    #[serde(rename = "HealthyAllocs")]
    pub healthy_allocs: u32,
    /// Unhealthy.
    #[serde(rename = "UnhealthyAllocs")]
    pub unhealthy_allocs: u32,
}

impl From<&internal::Deployment> for Deployment {
    fn from(d: &internal::Deployment) -> Deployment {
        Deployment {
            id: d.id.clone(),
            namespace: d.namespace.clone(),
            job_id: d.job_name.clone(),
            job_version: d.job_version,
            job_modify_index: d.job_modify_index,
            job_spec_modify_index: d.job_modify_index,
            job_create_index: d.job_create_index,
            is_multiregion: false,
            task_groups: d
                .groups
                .iter()
                .map(|(name, g)| (name.clone(), DeploymentState::from(g)))
                .collect(),
            status: d.status.as_str().to_owned(),
            status_description: d.status_description.clone(),
            create_index: d.create_index,
            modify_index: d.modify_index,
        }
    }
}

impl From<&internal::DeploymentGroup> for DeploymentState {
    fn from(g: &internal::DeploymentGroup) -> DeploymentState {
        DeploymentState {
            auto_revert: g.auto_revert,
            auto_promote: g.auto_promote,
            progress_deadline: g.progress_deadline,
            require_progress_by: if g.require_progress_by == 0 {
                super::GO_ZERO_TIME.to_owned()
            } else {
                rfc3339_from_nanos(g.require_progress_by)
            },
            promoted: g.promoted,
            placed_canaries: g.placed_canaries.clone(),
            desired_canaries: g.desired_canaries,
            desired_total: g.desired_total,
            placed_allocs: g.placed_allocs,
            healthy_allocs: g.healthy_allocs,
            unhealthy_allocs: g.unhealthy_allocs,
        }
    }
}

fn deployment_status_from(word: &str) -> internal::DeploymentStatus {
    match word {
        "paused" => internal::DeploymentStatus::Paused,
        "successful" => internal::DeploymentStatus::Successful,
        "failed" => internal::DeploymentStatus::Failed,
        "cancelled" => internal::DeploymentStatus::Cancelled,
        _ => internal::DeploymentStatus::Running,
    }
}

impl Deployment {
    /// The deployment as Drover keeps it (for clients that render internal types;
    /// times of creation are not in Nomad's shape: zero).
    pub fn to_internal(&self) -> internal::Deployment {
        internal::Deployment {
            namespace: super::namespace_or_default(&self.namespace),
            id: self.id.clone(),
            job_name: self.job_id.clone(),
            job_version: self.job_version,
            job_modify_index: self.job_modify_index,
            job_create_index: self.job_create_index,
            status: deployment_status_from(&self.status),
            status_description: self.status_description.clone(),
            groups: self
                .task_groups
                .iter()
                .map(|(name, g)| {
                    (
                        name.clone(),
                        internal::DeploymentGroup {
                            auto_revert: g.auto_revert,
                            auto_promote: g.auto_promote,
                            promoted: g.promoted,
                            progress_deadline: g.progress_deadline,
                            require_progress_by: nanos_from_rfc3339(&g.require_progress_by)
                                .unwrap_or_default(),
                            desired_canaries: g.desired_canaries,
                            desired_total: g.desired_total,
                            placed_canaries: g.placed_canaries.clone(),
                            placed_allocs: g.placed_allocs,
                            healthy_allocs: g.healthy_allocs,
                            unhealthy_allocs: g.unhealthy_allocs,
                        },
                    )
                })
                .collect(),
            create_index: self.create_index,
            modify_index: self.modify_index,
            create_time: 0,
            modify_time: 0,
        }
    }
}

/// An allocation's `DeploymentStatus` as Nomad writes it.
pub fn alloc_status(s: &internal::AllocDeploymentStatus) -> Value {
    json!({
        "Healthy": s.healthy,
        "Timestamp": if s.timestamp == 0 {
            super::GO_ZERO_TIME.to_owned()
        } else {
            rfc3339_from_nanos(s.timestamp)
        },
        "Canary": s.canary,
        "ModifyIndex": s.modify_index,
    })
}

/// [`alloc_status`] read back (`None`: not an object).
pub fn alloc_status_from(v: &Value) -> Option<internal::AllocDeploymentStatus> {
    let o = v.as_object()?;
    Some(internal::AllocDeploymentStatus {
        healthy: o.get("Healthy").and_then(Value::as_bool),
        timestamp: o
            .get("Timestamp")
            .and_then(Value::as_str)
            .and_then(nanos_from_rfc3339)
            .unwrap_or_default(),
        canary: o.get("Canary").and_then(Value::as_bool).unwrap_or(false),
        modify_index: o.get("ModifyIndex").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// `PUT /v1/deployment/promote/:id`: `{"DeploymentID", "All", "Groups"}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentPromoteRequest {
    /// The deployment (the path's id wins).
    #[serde(rename = "DeploymentID", alias = "deployment_id")]
    pub deployment_id: String,
    /// Promote every group.
    #[serde(rename = "All", alias = "all")]
    pub all: bool,
    /// Promote these groups.
    #[serde(
        rename = "Groups",
        alias = "groups",
        deserialize_with = "super::null_default"
    )]
    pub groups: Vec<String>,
}

/// What a deployment update answers (`DeploymentUpdateResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentUpdateResponse {
    /// The evaluation created.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Its create index.
    #[serde(rename = "EvalCreateIndex")]
    pub eval_create_index: u64,
    /// The deployment's modify index.
    #[serde(rename = "DeploymentModifyIndex")]
    pub deployment_modify_index: u64,
    /// The job version a revert registered, if any.
    #[serde(rename = "RevertedJobVersion", skip_serializing_if = "Option::is_none")]
    pub reverted_job_version: Option<u64>,
    /// The write's index.
    #[serde(rename = "Index")]
    pub index: u64,
}

/// `PUT /v1/job/:id/revert`: `{"JobID", "JobVersion", "EnforcePriorVersion"}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobRevertRequest {
    /// The job (the path's id wins).
    #[serde(rename = "JobID", alias = "job_id")]
    pub job_id: String,
    /// The version to go back to.
    #[serde(rename = "JobVersion", alias = "job_version")]
    pub job_version: u64,
    /// Refuse unless the current version is this one.
    #[serde(rename = "EnforcePriorVersion", alias = "enforce_prior_version")]
    pub enforce_prior_version: Option<u64>,
}
