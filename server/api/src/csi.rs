//! CSI (Container Storage Interface) types shared by the agent and the server: access
//! and attachment modes as Nomad spells them, and what a node tells the server about
//! the CSI plugins it runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How many nodes and writers a volume may have at once (Nomad's `access_mode`, the
/// CSI spec's `VolumeCapability.AccessMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CsiAccessMode {
    /// One node, read-only.
    SingleNodeReaderOnly,
    /// One node, one writer.
    SingleNodeWriter,
    /// Any number of nodes, read-only.
    MultiNodeReaderOnly,
    /// Any number of readers, one writer.
    MultiNodeSingleWriter,
    /// Any number of readers and writers.
    MultiNodeMultiWriter,
}

impl CsiAccessMode {
    /// Every mode, for error messages.
    pub const ALL: [CsiAccessMode; 5] = [
        Self::SingleNodeReaderOnly,
        Self::SingleNodeWriter,
        Self::MultiNodeReaderOnly,
        Self::MultiNodeSingleWriter,
        Self::MultiNodeMultiWriter,
    ];

    /// Nomad's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleNodeReaderOnly => "single-node-reader-only",
            Self::SingleNodeWriter => "single-node-writer",
            Self::MultiNodeReaderOnly => "multi-node-reader-only",
            Self::MultiNodeSingleWriter => "multi-node-single-writer",
            Self::MultiNodeMultiWriter => "multi-node-multi-writer",
        }
    }

    /// Parse Nomad's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// Whether a claim may write.
    pub fn allows_write(self) -> bool {
        !matches!(self, Self::SingleNodeReaderOnly | Self::MultiNodeReaderOnly)
    }

    /// Most writers at once (`None`: no bound).
    pub fn max_writers(self) -> Option<usize> {
        match self {
            Self::SingleNodeReaderOnly | Self::MultiNodeReaderOnly => Some(0),
            Self::SingleNodeWriter | Self::MultiNodeSingleWriter => Some(1),
            Self::MultiNodeMultiWriter => None,
        }
    }

    /// Whether claims must all be on one node.
    pub fn single_node(self) -> bool {
        matches!(self, Self::SingleNodeReaderOnly | Self::SingleNodeWriter)
    }
}

impl std::fmt::Display for CsiAccessMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a volume reaches a task (Nomad's `attachment_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CsiAttachmentMode {
    /// A mounted file system: a directory.
    FileSystem,
    /// A raw block device.
    BlockDevice,
}

impl CsiAttachmentMode {
    /// Nomad's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FileSystem => "file-system",
            Self::BlockDevice => "block-device",
        }
    }

    /// Parse Nomad's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::FileSystem, Self::BlockDevice]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

impl std::fmt::Display for CsiAttachmentMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a CSI plugin serves (Nomad's `csi_plugin { type }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CsiPluginType {
    /// The Node service only: stages and publishes volumes on its node.
    Node,
    /// The Controller service only: creates, deletes and attaches volumes.
    Controller,
    /// Both in one process.
    Monolith,
}

impl CsiPluginType {
    /// Nomad's spelling (`node`, `controller`, `monolith`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Controller => "controller",
            Self::Monolith => "monolith",
        }
    }
    /// Whether the plugin serves the Node service.
    pub fn is_node(self) -> bool {
        matches!(self, Self::Node | Self::Monolith)
    }
    /// Whether the plugin serves the Controller service.
    pub fn is_controller(self) -> bool {
        matches!(self, Self::Controller | Self::Monolith)
    }
}

/// What a node's CSI plugin can do, as its `NodeGetCapabilities` said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiNodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`: NodeStageVolume must come before NodePublishVolume.
    #[serde(default)]
    pub stage_unstage: bool,
}

/// What a controller plugin can do, as its `ControllerGetCapabilities` said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiControllerCapabilities {
    /// `CREATE_DELETE_VOLUME`.
    #[serde(default)]
    pub create_delete: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`: ControllerPublishVolume must come before
    /// NodeStageVolume.
    #[serde(default)]
    pub publish_unpublish: bool,
    /// `PUBLISH_READONLY`.
    #[serde(default)]
    pub publish_readonly: bool,
}

/// A CSI plugin a node runs, as fingerprinted (Nomad's `CSIInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiPluginFingerprint {
    /// The plugin id of the config (`[csi_plugin.ID]`), what volumes' `plugin_id` name.
    pub plugin_id: String,
    /// What it serves.
    #[serde(rename = "type")]
    pub plugin_type: CsiPluginType,
    /// Whether it answered `Probe` ready at the last look.
    pub healthy: bool,
    /// Why it is unhealthy, or empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_description: String,
    /// `GetPluginInfo`'s name (e.g. `hostpath.csi.k8s.io`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// `GetPluginInfo`'s vendor version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider_version: String,
    /// The node's id as the plugin knows it (`NodeGetInfo`), what ControllerPublish
    /// is given; empty for a controller-only plugin.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_id: String,
    /// Most volumes the plugin publishes on this node (0: no bound).
    #[serde(default)]
    pub max_volumes: i64,
    /// The node's topology segments, as the plugin reports them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topology: BTreeMap<String, String>,
    /// Node service capabilities (node and monolith plugins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<CsiNodeCapabilities>,
    /// Controller service capabilities (controller and monolith plugins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<CsiControllerCapabilities>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_nomads_spelling() {
        for m in CsiAccessMode::ALL {
            assert_eq!(CsiAccessMode::parse(m.as_str()), Some(m));
            let json = serde_json::to_string(&m).expect("serialize");
            assert_eq!(json, format!("\"{}\"", m.as_str()));
        }
        assert_eq!(CsiAccessMode::parse("single-node"), None);
        assert_eq!(
            CsiAttachmentMode::parse("file-system"),
            Some(CsiAttachmentMode::FileSystem)
        );
        assert_eq!(CsiAccessMode::SingleNodeWriter.max_writers(), Some(1));
        assert!(!CsiAccessMode::MultiNodeReaderOnly.allows_write());
    }
}

/// One way a volume may be used: an access mode with an attachment mode (Nomad's
/// `capability { access_mode, attachment_mode }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiCapability {
    /// Access mode.
    pub access_mode: CsiAccessMode,
    /// Attachment mode.
    pub attachment_mode: CsiAttachmentMode,
}

/// `mount_options { fs_type, mount_flags }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiMountOptions {
    /// File system type (empty: the plugin's default).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fs_type: String,
    /// Mount flags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
}

/// A CSI volume as the server keeps it (Nomad's `CSIVolume`), namespaced like jobs.
/// Its claims are not stored: they are the live allocations whose group asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiVolume {
    /// Its id in the namespace (what groups' `volume { source }` name).
    pub id: String,
    /// Its namespace.
    #[serde(default = "crate::namespaces::default_namespace")]
    pub namespace: String,
    /// Display name (the id when not given); the name `CreateVolume` is given.
    pub name: String,
    /// The plugin's id of the volume.
    pub external_id: String,
    /// The CSI plugin that serves it (`[csi_plugin.ID]` of the nodes).
    pub plugin_id: String,
    /// The plugin's provider name, as its nodes fingerprinted it at registration.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// Smallest size asked at creation, bytes (0: none).
    #[serde(default)]
    pub capacity_min: i64,
    /// Largest size asked at creation, bytes (0: none).
    #[serde(default)]
    pub capacity_max: i64,
    /// Size the plugin created, bytes (0: unknown).
    #[serde(default)]
    pub capacity: i64,
    /// The ways it may be used.
    pub capabilities: Vec<CsiCapability>,
    /// How it is mounted.
    #[serde(default)]
    pub mount_options: CsiMountOptions,
    /// Parameters given to CreateVolume.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// The volume context the plugin returned (or the register spec gave): handed
    /// back in every Node and ControllerPublish call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, String>,
    /// Made by `volume create` (a `delete` asks the controller to DeleteVolume);
    /// false for registered ones.
    #[serde(default)]
    pub created: bool,
    /// Index of the first write.
    #[serde(default)]
    pub create_index: crate::Index,
    /// Index of the last write.
    #[serde(default)]
    pub modify_index: crate::Index,
}

/// A claim of a volume by a live allocation (derived, never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiClaim {
    /// The allocation.
    pub alloc_id: String,
    /// Its node.
    pub node_id: String,
    /// Its job.
    pub job: String,
    /// Whether it may write (the group's request is not read-only).
    pub write: bool,
}

/// Most bytes of a volume spec file.
pub const MAX_VOLUME_SPEC_BYTES: usize = 64 << 10;
/// Most capabilities, parameters or context entries of a volume.
pub const MAX_VOLUME_ENTRIES: usize = 64;
/// Longest id, name, plugin id or external id.
pub const MAX_VOLUME_ID_BYTES: usize = 256;

/// A volume spec file that cannot be used; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct VolumeSpecError {
    /// The file.
    pub file: String,
    /// The field (`capability[1].access_mode`, ...).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Parse a volume spec in Nomad's HCL (`id`, `name`, `type = "csi"`, `plugin_id`,
/// `external_id` (register only), `capacity_min`, `capacity_max`, `capability {
/// access_mode, attachment_mode }` (one or more), `mount_options { fs_type,
/// mount_flags }`, `parameters { .. }`, `context { .. }`, `namespace`) or in JSON
/// (the same fields). The indexes are left 0.
pub fn parse_volume_spec(file: &str, text: &str) -> Result<CsiVolume, VolumeSpecError> {
    let fail = |field: &str, message: String| VolumeSpecError {
        file: file.to_owned(),
        field: field.to_owned(),
        message,
    };
    if text.len() > MAX_VOLUME_SPEC_BYTES {
        return Err(fail(
            "",
            format!("larger than {} KiB", MAX_VOLUME_SPEC_BYTES / 1024),
        ));
    }
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| fail("", format!("not JSON: {e}")))?
    } else {
        ::hcl::from_str(text).map_err(|e| fail("", format!("not HCL: {e}")))?
    };
    let serde_json::Value::Object(mut top) = value else {
        return Err(fail("", "not an object of fields".into()));
    };
    const FIELDS: &[&str] = &[
        "id",
        "name",
        "type",
        "namespace",
        "plugin_id",
        "external_id",
        "capacity_min",
        "capacity_max",
        "capability",
        "access_mode",
        "attachment_mode",
        "mount_options",
        "parameters",
        "context",
        "secrets",
        "topology_request",
        "snapshot_id",
        "clone_id",
    ];
    if let Some(k) = top.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(fail(
            k,
            format!("unknown field (known: {})", FIELDS.join(", ")),
        ));
    }
    for unsupported in ["secrets", "topology_request", "snapshot_id", "clone_id"] {
        if top.contains_key(unsupported) {
            return Err(fail(unsupported, "not supported by Drover yet".into()));
        }
    }
    let mut string = |key: &str, required: bool| -> Result<String, VolumeSpecError> {
        match top.remove(key) {
            None if required => Err(fail(key, "missing".into())),
            None => Ok(String::new()),
            Some(serde_json::Value::String(s)) => {
                if s.len() > MAX_VOLUME_ID_BYTES || s.chars().any(char::is_control) {
                    return Err(fail(
                        key,
                        format!("at most {MAX_VOLUME_ID_BYTES} bytes, no control characters"),
                    ));
                }
                Ok(s)
            }
            Some(other) => Err(fail(key, format!("expected a string, got {other}"))),
        }
    };
    let id = string("id", true)?;
    if id.is_empty() || id.contains('/') {
        return Err(fail("id", "must be non-empty and hold no '/'".into()));
    }
    let kind = string("type", true)?;
    if kind != "csi" {
        return Err(fail(
            "type",
            format!("{kind:?}: only \"csi\" volumes are created or registered"),
        ));
    }
    let name = string("name", false)?;
    let namespace = string("namespace", false)?;
    let plugin_id = string("plugin_id", true)?;
    if plugin_id.is_empty() {
        return Err(fail("plugin_id", "must not be empty".into()));
    }
    let external_id = string("external_id", false)?;
    let capacity_min = capacity(&mut top, "capacity_min").map_err(|m| fail("capacity_min", m))?;
    let capacity_max = capacity(&mut top, "capacity_max").map_err(|m| fail("capacity_max", m))?;
    if capacity_max > 0 && capacity_min > capacity_max {
        return Err(fail(
            "capacity_max",
            format!("{capacity_max} bytes is less than capacity_min ({capacity_min})"),
        ));
    }
    // Nomad 1.0's spec: one `access_mode` and `attachment_mode` at the top.
    let old_style = match (top.remove("access_mode"), top.remove("attachment_mode")) {
        (None, None) => None,
        (a, b) => Some(serde_json::json!({
            "access_mode": a.unwrap_or_default(),
            "attachment_mode": b.unwrap_or_default(),
        })),
    };
    let caps = match top.remove("capability").or(old_style) {
        None => {
            return Err(fail(
                "capability",
                "missing: at least one capability { access_mode, attachment_mode }".into(),
            ));
        }
        Some(serde_json::Value::Array(a)) => a,
        Some(v @ serde_json::Value::Object(_)) => vec![v],
        Some(other) => return Err(fail("capability", format!("expected blocks, got {other}"))),
    };
    if caps.is_empty() || caps.len() > MAX_VOLUME_ENTRIES {
        return Err(fail(
            "capability",
            format!("1 to {MAX_VOLUME_ENTRIES} capability blocks"),
        ));
    }
    let mut capabilities = Vec::new();
    for (i, c) in caps.iter().enumerate() {
        let at = format!("capability[{i}]");
        let field = |k: &str| c.get(k).and_then(serde_json::Value::as_str);
        if let Some(obj) = c.as_object()
            && let Some(k) = obj
                .keys()
                .find(|k| !["access_mode", "attachment_mode"].contains(&k.as_str()))
        {
            return Err(fail(&format!("{at}.{k}"), "unknown field".into()));
        }
        let access_mode = field("access_mode")
            .and_then(CsiAccessMode::parse)
            .ok_or_else(|| {
                fail(
                    &format!("{at}.access_mode"),
                    format!(
                        "expected one of {}",
                        CsiAccessMode::ALL.map(CsiAccessMode::as_str).join(", ")
                    ),
                )
            })?;
        let attachment_mode = field("attachment_mode")
            .and_then(CsiAttachmentMode::parse)
            .ok_or_else(|| {
                fail(
                    &format!("{at}.attachment_mode"),
                    "expected file-system or block-device".into(),
                )
            })?;
        capabilities.push(CsiCapability {
            access_mode,
            attachment_mode,
        });
    }
    let mount_options = match top.remove("mount_options") {
        None => CsiMountOptions::default(),
        Some(v) => {
            let v = match v {
                serde_json::Value::Array(mut a) if a.len() == 1 => a.remove(0),
                v => v,
            };
            serde_json::from_value::<MountOptionsSpec>(v)
                .map(|m| CsiMountOptions {
                    fs_type: m.fs_type,
                    mount_flags: m.mount_flags,
                })
                .map_err(|e| fail("mount_options", e.to_string()))?
        }
    };
    let mut map = |key: &str| -> Result<BTreeMap<String, String>, VolumeSpecError> {
        let Some(v) = top.remove(key) else {
            return Ok(BTreeMap::new());
        };
        let v = match v {
            serde_json::Value::Array(mut a) if a.len() == 1 => a.remove(0),
            v => v,
        };
        let m: BTreeMap<String, String> = serde_json::from_value(v)
            .map_err(|e| fail(key, format!("expected a block of strings: {e}")))?;
        if m.len() > MAX_VOLUME_ENTRIES {
            return Err(fail(key, format!("at most {MAX_VOLUME_ENTRIES} entries")));
        }
        Ok(m)
    };
    let parameters = map("parameters")?;
    let context = map("context")?;
    Ok(CsiVolume {
        name: if name.is_empty() { id.clone() } else { name },
        id,
        namespace: if namespace.is_empty() {
            crate::DEFAULT_NAMESPACE.to_owned()
        } else {
            namespace
        },
        external_id,
        plugin_id,
        provider: String::new(),
        capacity_min,
        capacity_max,
        capacity: 0,
        capabilities,
        mount_options,
        parameters,
        context,
        created: false,
        create_index: 0,
        modify_index: 0,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MountOptionsSpec {
    #[serde(default)]
    fs_type: String,
    #[serde(default)]
    mount_flags: Vec<String>,
}

/// A size: a number of bytes, or a number with a unit (`10GiB`, `500MB`, `1G`).
fn capacity(
    top: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<i64, String> {
    match top.remove(key) {
        None => Ok(0),
        Some(serde_json::Value::Number(n)) => n
            .as_i64()
            .filter(|n| *n >= 0)
            .ok_or_else(|| format!("{n}: not a size in bytes")),
        Some(serde_json::Value::String(s)) => parse_size(&s),
        Some(other) => Err(format!("expected a size such as \"10GiB\", got {other}")),
    }
}

/// `10GiB`, `500MB`, `1G`, `4096`.
pub fn parse_size(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size such as \"10GiB\""))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)"
            ));
        }
    };
    let bytes = n * mult;
    if !(0.0..9.0e18).contains(&bytes) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(bytes as i64)
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    #[test]
    fn a_nomad_volume_spec_parses() {
        let v = parse_volume_spec(
            "v.hcl",
            r#"
id        = "data"
name      = "data volume"
type      = "csi"
plugin_id = "hostpath"
capacity_min = "1MiB"
capacity_max = "1GiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}
mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}
parameters {
  kind = "fast"
}
"#,
        )
        .expect("parses");
        assert_eq!(v.id, "data");
        assert_eq!(v.namespace, "default");
        assert_eq!(v.capacity_min, 1 << 20);
        assert_eq!(v.capacity_max, 1 << 30);
        assert_eq!(v.capabilities.len(), 2);
        assert_eq!(
            v.capabilities[1].access_mode,
            CsiAccessMode::SingleNodeReaderOnly
        );
        assert_eq!(v.mount_options.mount_flags, ["noatime"]);
        assert_eq!(v.parameters["kind"], "fast");

        let one = parse_volume_spec(
            "v.hcl",
            "id = \"x\"\ntype = \"csi\"\nplugin_id = \"p\"\ncapability {\naccess_mode = \"multi-node-multi-writer\"\nattachment_mode = \"file-system\"\n}\n",
        )
        .expect("one capability");
        assert_eq!(one.capabilities.len(), 1);
        assert_eq!(one.name, "x");

        // Nomad 1.0's top-level modes.
        let old = parse_volume_spec(
            "v.hcl",
            "id = \"x\"\ntype = \"csi\"\nplugin_id = \"p\"\nexternal_id = \"e\"\n\
             access_mode = \"single-node-writer\"\nattachment_mode = \"file-system\"\n",
        )
        .expect("Nomad 1.0 style");
        assert_eq!(
            old.capabilities[0].access_mode,
            CsiAccessMode::SingleNodeWriter
        );
    }

    #[test]
    fn bad_specs_name_the_field() {
        let base = "id = \"x\"\ntype = \"csi\"\nplugin_id = \"p\"\n";
        let e = parse_volume_spec("v.hcl", base).unwrap_err();
        assert_eq!(e.field, "capability");
        let e = parse_volume_spec(
            "v.hcl",
            &format!("{base}capability {{\naccess_mode = \"single-node\"\nattachment_mode = \"file-system\"\n}}\n"),
        )
        .unwrap_err();
        assert_eq!(e.field, "capability[0].access_mode", "{e}");
        let e = parse_volume_spec("v.hcl", "id = \"x\"\ntype = \"host\"\n").unwrap_err();
        assert_eq!(e.field, "type");
        let e = parse_volume_spec("v.hcl", &format!("{base}capacity_min = \"1 parsec\"\ncapability {{\naccess_mode = \"single-node-writer\"\nattachment_mode = \"file-system\"\n}}\n")).unwrap_err();
        assert_eq!(e.field, "capacity_min");
        let e = parse_volume_spec("v.hcl", &format!("{base}plugin = \"x\"\n")).unwrap_err();
        assert_eq!(e.field, "plugin");
    }
}

/// A controller call the server queues for an agent running the plugin's controller
/// (see `drover.cluster.v1.CsiController`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "call")]
pub enum ControllerCall {
    /// `CreateVolume`.
    Create {
        /// The plugin.
        plugin_id: String,
        /// The name CreateVolume is given (idempotent by name).
        name: String,
        /// Smallest size, bytes (0: none).
        capacity_min: i64,
        /// Largest size, bytes (0: none).
        capacity_max: i64,
        /// Capabilities asked.
        capabilities: Vec<CsiCapability>,
        /// Mount options (their fs_type and flags go into the capabilities).
        mount_options: CsiMountOptions,
        /// Parameters.
        parameters: BTreeMap<String, String>,
    },
    /// `DeleteVolume`.
    Delete {
        /// The plugin.
        plugin_id: String,
        /// The plugin's id of the volume.
        external_id: String,
    },
    /// `ControllerPublishVolume` to a node (asked by that node's agent).
    Publish {
        /// The plugin.
        plugin_id: String,
        /// The plugin's id of the volume.
        external_id: String,
        /// The node as the plugin knows it (its node plugin's `NodeGetInfo`).
        node_id: String,
        /// How the volume is used.
        capability: CsiCapability,
        /// Its mount options.
        mount_options: CsiMountOptions,
        /// Published read-only.
        readonly: bool,
        /// The volume context.
        context: BTreeMap<String, String>,
    },
    /// `ControllerUnpublishVolume` from a node (asked by that node's agent).
    Unpublish {
        /// The plugin.
        plugin_id: String,
        /// The plugin's id of the volume.
        external_id: String,
        /// The node as the plugin knows it.
        node_id: String,
    },
}

impl ControllerCall {
    /// The plugin it is for.
    pub fn plugin_id(&self) -> &str {
        match self {
            Self::Create { plugin_id, .. }
            | Self::Delete { plugin_id, .. }
            | Self::Publish { plugin_id, .. }
            | Self::Unpublish { plugin_id, .. } => plugin_id,
        }
    }
}

/// What an agent answers to a [`ControllerCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum ControllerOutcome {
    /// CreateVolume succeeded.
    Created {
        /// The plugin's id of the volume.
        external_id: String,
        /// Its size, bytes (0: unknown).
        capacity: i64,
        /// Its volume context.
        context: BTreeMap<String, String>,
    },
    /// DeleteVolume succeeded.
    Deleted,
    /// ControllerPublishVolume succeeded: the context the Node calls get.
    Published {
        /// The publish context.
        publish_context: BTreeMap<String, String>,
    },
    /// ControllerUnpublishVolume succeeded.
    Unpublished,
    /// The plugin's controllers do not publish (no `PUBLISH_UNPUBLISH_VOLUME`, or no
    /// controller at all): the node goes on without.
    NotRequired,
    /// The call failed; why.
    Failed {
        /// The plugin's error.
        error: String,
    },
}

/// Nomad's `CSIInfo` of a node's plugin (what `Node.CSINodePlugins` and
/// `Node.CSIControllerPlugins` hold, by plugin id).
pub fn nomad_csi_info(f: &CsiPluginFingerprint) -> serde_json::Value {
    serde_json::json!({
        "PluginID": f.plugin_id,
        "AllocID": "",
        "Healthy": f.healthy,
        "HealthDescription": f.health_description,
        "Provider": f.provider,
        "ProviderVersion": f.provider_version,
        "RequiresControllerPlugin": f.controller.as_ref().is_some_and(|c| c.publish_unpublish),
        "RequiresTopologies": !f.topology.is_empty(),
        "ControllerInfo": f.controller.as_ref().map(|c| serde_json::json!({
            "SupportsCreateDelete": c.create_delete,
            "SupportsAttachDetach": c.publish_unpublish,
            "SupportsReadOnlyAttach": c.publish_readonly,
        })),
        "NodeInfo": f.node.as_ref().map(|n| serde_json::json!({
            "ID": f.node_id,
            "MaxVolumes": f.max_volumes,
            "AccessibleTopology": (!f.topology.is_empty()).then(|| serde_json::json!({"Segments": f.topology})),
            "RequiresNodeStageVolume": n.stage_unstage,
        })),
    })
}

/// Nomad's `CSINodePlugins` and `CSIControllerPlugins` of a node (maps of `CSIInfo`
/// by plugin id) of the fingerprints `plugins`: `(controllers, nodes)`, `None` when
/// empty (as Nomad's null).
pub fn nomad_csi_maps(
    plugins: &BTreeMap<String, CsiPluginFingerprint>,
) -> (Option<serde_json::Value>, Option<serde_json::Value>) {
    let pick = |want: fn(CsiPluginType) -> bool| {
        let m: serde_json::Map<String, serde_json::Value> = plugins
            .iter()
            .filter(|(_, f)| want(f.plugin_type))
            .map(|(id, f)| (id.clone(), nomad_csi_info(f)))
            .collect();
        (!m.is_empty()).then_some(serde_json::Value::Object(m))
    };
    (
        pick(CsiPluginType::is_controller),
        pick(CsiPluginType::is_node),
    )
}

/// The fingerprints of a node from Nomad's `CSIControllerPlugins` and
/// `CSINodePlugins` (what is missing or unreadable is left out).
pub fn from_nomad_csi_maps(
    controllers: Option<&serde_json::Value>,
    nodes: Option<&serde_json::Value>,
) -> BTreeMap<String, CsiPluginFingerprint> {
    use serde_json::Value;
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let b = |v: &Value, k: &str| v.get(k).and_then(Value::as_bool).unwrap_or_default();
    let mut out: BTreeMap<String, CsiPluginFingerprint> = BTreeMap::new();
    for (is_controller, map) in [(true, controllers), (false, nodes)] {
        for (id, info) in map.and_then(Value::as_object).into_iter().flatten() {
            let entry = out
                .entry(id.clone())
                .or_insert_with(|| CsiPluginFingerprint {
                    plugin_id: id.clone(),
                    plugin_type: if is_controller {
                        CsiPluginType::Controller
                    } else {
                        CsiPluginType::Node
                    },
                    healthy: b(info, "Healthy"),
                    health_description: s(info, "HealthDescription"),
                    provider: s(info, "Provider"),
                    provider_version: s(info, "ProviderVersion"),
                    node_id: String::new(),
                    max_volumes: 0,
                    topology: BTreeMap::new(),
                    node: None,
                    controller: None,
                });
            if is_controller {
                if let Some(c) = info.get("ControllerInfo").filter(|c| c.is_object()) {
                    entry.controller = Some(CsiControllerCapabilities {
                        create_delete: b(c, "SupportsCreateDelete"),
                        publish_unpublish: b(c, "SupportsAttachDetach"),
                        publish_readonly: b(c, "SupportsReadOnlyAttach"),
                    });
                }
            } else {
                if entry.plugin_type == CsiPluginType::Controller {
                    entry.plugin_type = CsiPluginType::Monolith;
                }
                if let Some(n) = info.get("NodeInfo").filter(|n| n.is_object()) {
                    entry.node_id = s(n, "ID");
                    entry.max_volumes = n.get("MaxVolumes").and_then(Value::as_i64).unwrap_or(0);
                    entry.topology = n
                        .pointer("/AccessibleTopology/Segments")
                        .and_then(|t| serde_json::from_value(t.clone()).ok())
                        .unwrap_or_default();
                    entry.node = Some(CsiNodeCapabilities {
                        stage_unstage: b(n, "RequiresNodeStageVolume"),
                    });
                }
            }
        }
    }
    out
}
