//! A CSI client: the container orchestrator's side of the CSI spec's `csi.v1`
//! Identity, Controller and Node services, over a plugin's unix socket.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_proto::csi::v1 as pb;
use drover_server_api::csi::{
    CsiAccessMode, CsiAttachmentMode, CsiControllerCapabilities, CsiNodeCapabilities,
};
use pb::controller_client::ControllerClient;
use pb::identity_client::IdentityClient;
use pb::node_client::NodeClient;
use tonic::transport::{Channel, Endpoint};

/// Deadline of one CSI call unless the caller gives one (the spec lets calls take long:
/// a CreateVolume may provision storage; bounded all the same).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest message accepted from a plugin.
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Why a CSI call failed.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// The plugin's socket cannot be reached.
    #[error("CSI plugin at {}: cannot connect: {reason}", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        reason: String,
    },
    /// The plugin answered the RPC with an error.
    #[error("CSI {rpc}: {code:?}: {message}")]
    Rpc {
        /// The RPC, e.g. `NodePublishVolume`.
        rpc: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The plugin's message.
        message: String,
    },
    /// The plugin answered something the spec does not allow.
    #[error("CSI {rpc}: bad answer: {reason}")]
    BadAnswer {
        /// The RPC.
        rpc: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl CsiError {
    fn rpc(rpc: &'static str, status: tonic::Status) -> Self {
        Self::Rpc {
            rpc,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

/// `GetPluginInfo`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The plugin's name (e.g. `hostpath.csi.k8s.io`).
    pub name: String,
    /// Its vendor version.
    pub vendor_version: String,
}

/// `GetPluginCapabilities`' answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginCapabilities {
    /// `CONTROLLER_SERVICE`.
    pub controller_service: bool,
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub accessibility_constraints: bool,
}

/// `NodeGetInfo`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id as the plugin knows it.
    pub node_id: String,
    /// Most volumes it publishes on this node (0: no bound).
    pub max_volumes: i64,
    /// Topology segments.
    pub topology: BTreeMap<String, String>,
}

/// A created volume (`CreateVolume`'s answer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreatedVolume {
    /// The plugin's id of the volume: what every later call names.
    pub external_id: String,
    /// Its size in bytes (0: unknown).
    pub capacity_bytes: i64,
    /// Context to hand back in Node and ControllerPublish calls.
    pub context: BTreeMap<String, String>,
}

/// How a volume is used: access and attachment mode, file system and mount flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// Access mode.
    pub access_mode: CsiAccessMode,
    /// Attachment mode.
    pub attachment_mode: CsiAttachmentMode,
    /// File system type for file-system attachments (empty: the plugin's default).
    pub fs_type: String,
    /// Mount flags for file-system attachments.
    pub mount_flags: Vec<String>,
}

impl Capability {
    /// A file-system capability with `mode` and no options.
    pub fn file_system(access_mode: CsiAccessMode) -> Self {
        Self {
            access_mode,
            attachment_mode: CsiAttachmentMode::FileSystem,
            fs_type: String::new(),
            mount_flags: Vec::new(),
        }
    }

    fn to_proto(&self) -> pb::VolumeCapability {
        use pb::volume_capability::access_mode::Mode;
        let mode = match self.access_mode {
            CsiAccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            CsiAccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
            CsiAccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            CsiAccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            CsiAccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        };
        let access_type = match self.attachment_mode {
            CsiAttachmentMode::FileSystem => {
                pb::volume_capability::AccessType::Mount(pb::volume_capability::MountVolume {
                    fs_type: self.fs_type.clone(),
                    mount_flags: self.mount_flags.clone(),
                    volume_mount_group: String::new(),
                })
            }
            CsiAttachmentMode::BlockDevice => {
                pb::volume_capability::AccessType::Block(pb::volume_capability::BlockVolume {})
            }
        };
        pb::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(pb::volume_capability::AccessMode { mode: mode as i32 }),
        }
    }
}

fn hash_map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn btree_map(m: HashMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter().collect()
}

/// A connection to one CSI plugin's socket; cheap to clone.
#[derive(Debug, Clone)]
pub struct CsiClient {
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
}

impl CsiClient {
    /// Connect to the plugin listening on `socket`, within `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self, CsiError> {
        let path = socket.to_path_buf();
        let err = |reason: String| CsiError::Connect {
            socket: socket.to_path_buf(),
            reason,
        };
        // The URI is required by tonic and never used: the connector dials the socket.
        let endpoint = Endpoint::try_from("http://csi.plugin")
            .map_err(|e| err(e.to_string()))?
            .connect_timeout(timeout)
            .timeout(CALL_TIMEOUT);
        let channel = tokio::time::timeout(
            timeout,
            endpoint.connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let path = path.clone();
                async move {
                    let conn = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(conn))
                }
            })),
        )
        .await
        .map_err(|_| err(format!("no answer within {timeout:?}")))?
        .map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = s.to_string();
                src = s.source();
            }
            err(msg)
        })?;
        Ok(Self {
            identity: IdentityClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            controller: ControllerClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            node: NodeClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES),
        })
    }

    // ---- Identity ----

    /// `GetPluginInfo`.
    pub async fn plugin_info(&self) -> Result<PluginInfo, CsiError> {
        let r = self
            .identity
            .clone()
            .get_plugin_info(pb::GetPluginInfoRequest {})
            .await
            .map_err(|s| CsiError::rpc("GetPluginInfo", s))?
            .into_inner();
        if r.name.is_empty() {
            return Err(CsiError::BadAnswer {
                rpc: "GetPluginInfo",
                reason: "empty name".into(),
            });
        }
        Ok(PluginInfo {
            name: r.name,
            vendor_version: r.vendor_version,
        })
    }

    /// `GetPluginCapabilities`.
    pub async fn plugin_capabilities(&self) -> Result<PluginCapabilities, CsiError> {
        use pb::plugin_capability::service::Type;
        let r = self
            .identity
            .clone()
            .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
            .await
            .map_err(|s| CsiError::rpc("GetPluginCapabilities", s))?
            .into_inner();
        let mut caps = PluginCapabilities::default();
        for c in r.capabilities {
            if let Some(pb::plugin_capability::Type::Service(s)) = c.r#type {
                match s.r#type() {
                    Type::ControllerService => caps.controller_service = true,
                    Type::VolumeAccessibilityConstraints => caps.accessibility_constraints = true,
                    Type::Unknown => {}
                }
            }
        }
        Ok(caps)
    }

    /// `Probe`: whether the plugin is ready (an unset answer means ready).
    pub async fn probe(&self) -> Result<bool, CsiError> {
        let r = self
            .identity
            .clone()
            .probe(pb::ProbeRequest {})
            .await
            .map_err(|s| CsiError::rpc("Probe", s))?
            .into_inner();
        Ok(r.ready.unwrap_or(true))
    }

    // ---- Controller ----

    /// `ControllerGetCapabilities`.
    pub async fn controller_capabilities(&self) -> Result<CsiControllerCapabilities, CsiError> {
        use pb::controller_service_capability::rpc::Type;
        let r = self
            .controller
            .clone()
            .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
            .await
            .map_err(|s| CsiError::rpc("ControllerGetCapabilities", s))?
            .into_inner();
        let mut caps = CsiControllerCapabilities::default();
        for c in r.capabilities {
            if let Some(pb::controller_service_capability::Type::Rpc(rpc)) = c.r#type {
                match rpc.r#type() {
                    Type::CreateDeleteVolume => caps.create_delete = true,
                    Type::PublishUnpublishVolume => caps.publish_unpublish = true,
                    Type::PublishReadonly => caps.publish_readonly = true,
                    _ => {}
                }
            }
        }
        Ok(caps)
    }

    /// `CreateVolume` named `name` (the spec: idempotent by name).
    pub async fn create_volume(
        &self,
        name: &str,
        capacity: (i64, i64),
        capabilities: &[Capability],
        parameters: &BTreeMap<String, String>,
        secrets: &BTreeMap<String, String>,
    ) -> Result<CreatedVolume, CsiError> {
        let capacity_range = (capacity.0 > 0 || capacity.1 > 0).then_some(pb::CapacityRange {
            required_bytes: capacity.0,
            limit_bytes: capacity.1,
        });
        let r = self
            .controller
            .clone()
            .create_volume(pb::CreateVolumeRequest {
                name: name.to_owned(),
                capacity_range,
                volume_capabilities: capabilities.iter().map(Capability::to_proto).collect(),
                parameters: hash_map(parameters),
                secrets: hash_map(secrets),
            })
            .await
            .map_err(|s| CsiError::rpc("CreateVolume", s))?
            .into_inner();
        let v = r.volume.ok_or_else(|| CsiError::BadAnswer {
            rpc: "CreateVolume",
            reason: "no volume".into(),
        })?;
        if v.volume_id.is_empty() {
            return Err(CsiError::BadAnswer {
                rpc: "CreateVolume",
                reason: "empty volume_id".into(),
            });
        }
        Ok(CreatedVolume {
            external_id: v.volume_id,
            capacity_bytes: v.capacity_bytes,
            context: btree_map(v.volume_context),
        })
    }

    /// `DeleteVolume` (the spec: a volume that is already gone is not an error).
    pub async fn delete_volume(
        &self,
        external_id: &str,
        secrets: &BTreeMap<String, String>,
    ) -> Result<(), CsiError> {
        self.controller
            .clone()
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: external_id.to_owned(),
                secrets: hash_map(secrets),
            })
            .await
            .map_err(|s| CsiError::rpc("DeleteVolume", s))?;
        Ok(())
    }

    /// `ControllerPublishVolume` to the plugin's node id `node_id`: the publish context
    /// the Node calls need.
    pub async fn controller_publish(
        &self,
        external_id: &str,
        node_id: &str,
        capability: &Capability,
        readonly: bool,
        context: &BTreeMap<String, String>,
        secrets: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, CsiError> {
        let r = self
            .controller
            .clone()
            .controller_publish_volume(pb::ControllerPublishVolumeRequest {
                volume_id: external_id.to_owned(),
                node_id: node_id.to_owned(),
                volume_capability: Some(capability.to_proto()),
                readonly,
                secrets: hash_map(secrets),
                volume_context: hash_map(context),
            })
            .await
            .map_err(|s| CsiError::rpc("ControllerPublishVolume", s))?
            .into_inner();
        Ok(btree_map(r.publish_context))
    }

    /// `ControllerUnpublishVolume`.
    pub async fn controller_unpublish(
        &self,
        external_id: &str,
        node_id: &str,
        secrets: &BTreeMap<String, String>,
    ) -> Result<(), CsiError> {
        self.controller
            .clone()
            .controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
                volume_id: external_id.to_owned(),
                node_id: node_id.to_owned(),
                secrets: hash_map(secrets),
            })
            .await
            .map_err(|s| CsiError::rpc("ControllerUnpublishVolume", s))?;
        Ok(())
    }

    /// `ValidateVolumeCapabilities`: `Ok(None)` when confirmed, `Ok(Some(why))` when
    /// the plugin does not support them.
    pub async fn validate_capabilities(
        &self,
        external_id: &str,
        capabilities: &[Capability],
        context: &BTreeMap<String, String>,
        parameters: &BTreeMap<String, String>,
    ) -> Result<Option<String>, CsiError> {
        let r = self
            .controller
            .clone()
            .validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest {
                volume_id: external_id.to_owned(),
                volume_context: hash_map(context),
                volume_capabilities: capabilities.iter().map(Capability::to_proto).collect(),
                parameters: hash_map(parameters),
                secrets: HashMap::new(),
            })
            .await
            .map_err(|s| CsiError::rpc("ValidateVolumeCapabilities", s))?
            .into_inner();
        Ok(match r.confirmed {
            Some(_) => None,
            None if r.message.is_empty() => Some("not confirmed".into()),
            None => Some(r.message),
        })
    }

    // ---- Node ----

    /// `NodeGetCapabilities`.
    pub async fn node_capabilities(&self) -> Result<CsiNodeCapabilities, CsiError> {
        use pb::node_service_capability::rpc::Type;
        let r = self
            .node
            .clone()
            .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
            .await
            .map_err(|s| CsiError::rpc("NodeGetCapabilities", s))?
            .into_inner();
        let mut caps = CsiNodeCapabilities::default();
        for c in r.capabilities {
            if let Some(pb::node_service_capability::Type::Rpc(rpc)) = c.r#type
                && rpc.r#type() == Type::StageUnstageVolume
            {
                caps.stage_unstage = true;
            }
        }
        Ok(caps)
    }

    /// `NodeGetInfo`.
    pub async fn node_info(&self) -> Result<NodeInfo, CsiError> {
        let r = self
            .node
            .clone()
            .node_get_info(pb::NodeGetInfoRequest {})
            .await
            .map_err(|s| CsiError::rpc("NodeGetInfo", s))?
            .into_inner();
        if r.node_id.is_empty() {
            return Err(CsiError::BadAnswer {
                rpc: "NodeGetInfo",
                reason: "empty node_id".into(),
            });
        }
        Ok(NodeInfo {
            node_id: r.node_id,
            max_volumes: r.max_volumes_per_node,
            topology: r
                .accessible_topology
                .map(|t| btree_map(t.segments))
                .unwrap_or_default(),
        })
    }

    /// `NodeStageVolume` at `staging_path` (a directory the caller made).
    pub async fn node_stage(
        &self,
        external_id: &str,
        staging_path: &Path,
        capability: &Capability,
        publish_context: &BTreeMap<String, String>,
        context: &BTreeMap<String, String>,
        secrets: &BTreeMap<String, String>,
    ) -> Result<(), CsiError> {
        self.node
            .clone()
            .node_stage_volume(pb::NodeStageVolumeRequest {
                volume_id: external_id.to_owned(),
                publish_context: hash_map(publish_context),
                staging_target_path: staging_path.to_string_lossy().into_owned(),
                volume_capability: Some(capability.to_proto()),
                secrets: hash_map(secrets),
                volume_context: hash_map(context),
            })
            .await
            .map_err(|s| CsiError::rpc("NodeStageVolume", s))?;
        Ok(())
    }

    /// `NodeUnstageVolume`.
    pub async fn node_unstage(
        &self,
        external_id: &str,
        staging_path: &Path,
    ) -> Result<(), CsiError> {
        self.node
            .clone()
            .node_unstage_volume(pb::NodeUnstageVolumeRequest {
                volume_id: external_id.to_owned(),
                staging_target_path: staging_path.to_string_lossy().into_owned(),
            })
            .await
            .map_err(|s| CsiError::rpc("NodeUnstageVolume", s))?;
        Ok(())
    }

    /// `NodePublishVolume` at `target_path` (the plugin makes it: the spec says the
    /// CO makes its parent only).
    #[allow(clippy::too_many_arguments)]
    pub async fn node_publish(
        &self,
        external_id: &str,
        staging_path: Option<&Path>,
        target_path: &Path,
        capability: &Capability,
        readonly: bool,
        publish_context: &BTreeMap<String, String>,
        context: &BTreeMap<String, String>,
        secrets: &BTreeMap<String, String>,
    ) -> Result<(), CsiError> {
        self.node
            .clone()
            .node_publish_volume(pb::NodePublishVolumeRequest {
                volume_id: external_id.to_owned(),
                publish_context: hash_map(publish_context),
                staging_target_path: staging_path
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                target_path: target_path.to_string_lossy().into_owned(),
                volume_capability: Some(capability.to_proto()),
                readonly,
                secrets: hash_map(secrets),
                volume_context: hash_map(context),
            })
            .await
            .map_err(|s| CsiError::rpc("NodePublishVolume", s))?;
        Ok(())
    }

    /// `NodeUnpublishVolume`.
    pub async fn node_unpublish(
        &self,
        external_id: &str,
        target_path: &Path,
    ) -> Result<(), CsiError> {
        self.node
            .clone()
            .node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
                volume_id: external_id.to_owned(),
                target_path: target_path.to_string_lossy().into_owned(),
            })
            .await
            .map_err(|s| CsiError::rpc("NodeUnpublishVolume", s))?;
        Ok(())
    }
}
