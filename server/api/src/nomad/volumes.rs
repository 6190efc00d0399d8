//! Volumes as Nomad's API carries them: a group's `Volumes` (`api.VolumeRequest`, by
//! name) and a task's `VolumeMounts` (`api.VolumeMount`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ConversionError, join, refuse_unknown, refuse_unsupported};

/// A group's `volume "NAME" { ... }` in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VolumeRequest {
    /// The volume's name in the group (the map's key; Nomad repeats it here).
    #[serde(rename = "Name", alias = "name", default)]
    pub name: Option<String>,
    /// `host` or `csi`.
    #[serde(rename = "Type", alias = "type", default)]
    pub volume_type: Option<String>,
    /// The host volume's name on the node (or the CSI volume's id).
    #[serde(rename = "Source", alias = "source", default)]
    pub source: Option<String>,
    /// Mounted read-only in every task.
    #[serde(rename = "ReadOnly", alias = "read_only", default)]
    pub read_only: Option<bool>,
    /// CSI's access mode.
    #[serde(
        rename = "AccessMode",
        alias = "access_mode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub access_mode: Option<String>,
    /// CSI's attachment mode.
    #[serde(
        rename = "AttachmentMode",
        alias = "attachment_mode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub attachment_mode: Option<String>,
    /// Not supported yet (a volume per allocation, CSI).
    #[serde(rename = "PerAlloc", default, skip_serializing_if = "Option::is_none")]
    pub per_alloc: Option<Value>,
    /// Not supported yet (CSI mount options).
    #[serde(rename = "MountOptions", default)]
    pub mount_options: Option<Value>,
    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A task's `volume_mount { ... }` in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The group's volume.
    #[serde(rename = "Volume", alias = "volume", default)]
    pub volume: Option<String>,
    /// Where the task sees it.
    #[serde(rename = "Destination", alias = "destination", default)]
    pub destination: Option<String>,
    /// Mounted read-only.
    #[serde(rename = "ReadOnly", alias = "read_only", default)]
    pub read_only: Option<bool>,
    /// `private` only (the default); mounts never propagate.
    #[serde(rename = "PropagationMode", alias = "propagation_mode", default)]
    pub propagation_mode: Option<String>,
    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A group's `Volumes` as Drover's requests; `path` is the group's JSON path.
pub(crate) fn volume_requests(
    path: &str,
    volumes: &BTreeMap<String, VolumeRequest>,
) -> Result<BTreeMap<String, crate::VolumeRequest>, ConversionError> {
    let mut out = BTreeMap::new();
    for (name, v) in volumes {
        let vpath = format!("{}[{name:?}]", join(path, "Volumes"));
        refuse_unsupported(
            &vpath,
            &[
                ("PerAlloc", &v.per_alloc),
                ("MountOptions", &v.mount_options),
            ],
        )?;
        refuse_unknown(&vpath, &v.other)?;
        if let Some(n) = v.name.as_deref().filter(|n| !n.is_empty())
            && n != name
        {
            return Err(ConversionError::new(
                join(&vpath, "Name"),
                format!("{n:?} differs from the volume's key {name:?}"),
            ));
        }
        out.insert(
            name.clone(),
            crate::VolumeRequest {
                volume_type: v.volume_type.clone().unwrap_or_default(),
                source: v.source.clone().unwrap_or_default(),
                read_only: v.read_only.unwrap_or(false),
                access_mode: v.access_mode.clone().unwrap_or_default(),
                attachment_mode: v.attachment_mode.clone().unwrap_or_default(),
            },
        );
    }
    Ok(out)
}

/// A task's `VolumeMounts` as Drover's mounts; `path` is the task's JSON path.
pub(crate) fn volume_mounts(
    path: &str,
    mounts: &[VolumeMount],
) -> Result<Vec<crate::VolumeMount>, ConversionError> {
    let mut out = Vec::with_capacity(mounts.len());
    for (i, m) in mounts.iter().enumerate() {
        let mpath = format!("{}[{i}]", join(path, "VolumeMounts"));
        refuse_unknown(&mpath, &m.other)?;
        match m.propagation_mode.as_deref() {
            None | Some("" | "private") => {}
            Some(other) => {
                return Err(ConversionError::new(
                    join(&mpath, "PropagationMode"),
                    format!(
                        "{other:?} is not supported yet by Drover (only \"private\": mounts \
                         made inside a volume stay there)"
                    ),
                ));
            }
        }
        out.push(crate::VolumeMount {
            volume: m.volume.clone().unwrap_or_default(),
            destination: m.destination.clone().unwrap_or_default(),
            read_only: m.read_only.unwrap_or(false),
        });
    }
    Ok(out)
}

impl From<(&String, &crate::VolumeRequest)> for VolumeRequest {
    fn from((name, v): (&String, &crate::VolumeRequest)) -> VolumeRequest {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        VolumeRequest {
            name: Some(name.clone()),
            volume_type: Some(v.volume_type.clone()),
            source: Some(v.source.clone()),
            read_only: Some(v.read_only),
            access_mode: opt(&v.access_mode),
            attachment_mode: opt(&v.attachment_mode),
            per_alloc: None,
            mount_options: None,
            other: BTreeMap::new(),
        }
    }
}

impl From<&crate::VolumeMount> for VolumeMount {
    fn from(m: &crate::VolumeMount) -> VolumeMount {
        VolumeMount {
            volume: Some(m.volume.clone()),
            destination: Some(m.destination.clone()),
            read_only: Some(m.read_only),
            propagation_mode: Some("private".into()),
            other: BTreeMap::new(),
        }
    }
}
