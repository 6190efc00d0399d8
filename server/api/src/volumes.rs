//! Volumes (issue 27): host volumes an agent's config offers, and what a group asks
//! for (`volume "NAME" { type, source, read_only }`) and a task mounts
//! (`volume_mount { volume, destination, read_only }`), as in Nomad.

use serde::{Deserialize, Serialize};

/// A host volume of a node (`host_volume "NAME" { path, read_only }` in the agent's
/// config). The path is the operator's; what is inside it may be a task's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostVolume {
    /// The directory on the node.
    pub path: String,
    /// Offered read-only: no task may mount it writable.
    #[serde(default)]
    pub read_only: bool,
}

/// A group's `volume "NAME" { ... }` (Nomad's `VolumeRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeRequest {
    /// `host` or `csi`.
    #[serde(rename = "type")]
    pub volume_type: String,
    /// The host volume's name in the agent's config, or the CSI volume's id.
    pub source: String,
    /// Mounted read-only in every task.
    #[serde(default)]
    pub read_only: bool,
    /// CSI: `single-node-reader-only`, `single-node-writer`, `multi-node-reader-only`,
    /// `multi-node-single-writer`, `multi-node-multi-writer`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub access_mode: String,
    /// CSI: `file-system` or `block-device`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attachment_mode: String,
}

/// A task's `volume_mount { volume, destination, read_only }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The group's volume name.
    pub volume: String,
    /// Where the task sees it (inside its filesystem).
    pub destination: String,
    /// Mounted read-only.
    #[serde(default)]
    pub read_only: bool,
}
