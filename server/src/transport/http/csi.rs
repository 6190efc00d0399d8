//! `/v1/plugins?type=csi` and `/v1/plugin/csi/:id`: the CSI plugins the nodes
//! fingerprint, in Nomad's shape (`CSIPluginListStub`, `CSIPlugin` with `Nodes` and
//! `Controllers` maps of `CSIInfo` by node id). Plugins are not stored: they are what
//! the live nodes registered.

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::{Path, State};
use drover_server_api::csi::CsiPluginFingerprint;
use drover_server_api::{Node, NodeStatus};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Api, ApiError, ApiResult, Params, answer, block};

/// A plugin as the nodes report it: node id -> fingerprint.
#[derive(Default)]
struct Plugin {
    nodes: BTreeMap<String, CsiPluginFingerprint>,
    create_index: u64,
    modify_index: u64,
}

fn plugins(nodes: &[Node]) -> BTreeMap<String, Plugin> {
    let mut out: BTreeMap<String, Plugin> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.status != NodeStatus::Down) {
        for (id, f) in &n.csi_plugins {
            let p = out.entry(id.clone()).or_default();
            p.nodes.insert(n.id.clone(), f.clone());
            p.create_index = if p.create_index == 0 {
                n.create_index
            } else {
                p.create_index.min(n.create_index)
            };
            p.modify_index = p.modify_index.max(n.modify_index);
        }
    }
    out
}

fn info(f: &CsiPluginFingerprint) -> Value {
    drover_server_api::csi::nomad_csi_info(f)
}

/// (provider, version, controllers healthy/expected, nodes healthy/expected,
/// controller required).
fn summary(p: &Plugin) -> (String, String, usize, usize, usize, usize, bool) {
    let any = p.nodes.values().next();
    let provider = any.map(|f| f.provider.clone()).unwrap_or_default();
    let version = any.map(|f| f.provider_version.clone()).unwrap_or_default();
    let controllers: Vec<_> = p
        .nodes
        .values()
        .filter(|f| f.plugin_type.is_controller())
        .collect();
    let nodes: Vec<_> = p
        .nodes
        .values()
        .filter(|f| f.plugin_type.is_node())
        .collect();
    let required = controllers
        .iter()
        .any(|f| f.controller.as_ref().is_some_and(|c| c.publish_unpublish));
    (
        provider,
        version,
        controllers.iter().filter(|f| f.healthy).count(),
        controllers.len(),
        nodes.iter().filter(|f| f.healthy).count(),
        nodes.len(),
        required,
    )
}

fn check_type(q: &Params) -> Result<(), ApiError> {
    match q.get("type") {
        Some("csi") => Ok(()),
        _ => Err(ApiError::bad_request(
            "Invalid plugin type: only type=csi is supported",
        )),
    }
}

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    check_type(&q)?;
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix();
    let stubs: Vec<Value> = plugins(&api.server.nodes())
        .iter()
        .filter(|(id, _)| id.starts_with(prefix))
        .map(|(id, p)| {
            let (provider, _, ch, ce, nh, ne, required) = summary(p);
            json!({
                "ID": id,
                "Provider": provider,
                "ControllerRequired": required,
                "ControllersHealthy": ch,
                "ControllersExpected": ce,
                "NodesHealthy": nh,
                "NodesExpected": ne,
                "CreateIndex": p.create_index,
                "ModifyIndex": p.modify_index,
            })
        })
        .collect();
    answer(index, stubs)
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let all = plugins(&api.server.nodes());
    let p = all
        .get(&id)
        .ok_or_else(|| ApiError::not_found("plugin not found"))?;
    let (provider, version, ch, ce, nh, ne, required) = summary(p);
    let by_node = |want: fn(&CsiPluginFingerprint) -> bool| -> BTreeMap<&String, Value> {
        p.nodes
            .iter()
            .filter(|(_, f)| want(f))
            .map(|(n, f)| (n, info(f)))
            .collect()
    };
    answer(
        index,
        json!({
            "ID": id,
            "Provider": provider,
            "Version": version,
            "ControllerRequired": required,
            "Controllers": by_node(|f| f.plugin_type.is_controller()),
            "Nodes": by_node(|f| f.plugin_type.is_node()),
            "Allocations": [],
            "ControllersHealthy": ch,
            "ControllersExpected": ce,
            "NodesHealthy": nh,
            "NodesExpected": ne,
            "CreateIndex": p.create_index,
            "ModifyIndex": p.modify_index,
        }),
    )
}

// ---- Volumes ----

use axum::extract::rejection::BytesRejection;
use drover_server_api::csi::{
    CsiAccessMode, CsiAttachmentMode, CsiCapability, CsiClaim, CsiMountOptions, CsiVolume,
};
use serde::Deserialize;

use super::json_body;
use super::scope::Scope;

/// Nomad's `CSIVolume` of a register or create body (the fields Drover uses; others
/// are ignored, as Nomad's own server ignores what it does not know).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireVolume {
    #[serde(rename = "ID")]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(rename = "ExternalID", default)]
    external_id: String,
    #[serde(rename = "PluginID", default)]
    plugin_id: String,
    #[serde(default)]
    capacity_min: i64,
    #[serde(default)]
    capacity_max: i64,
    #[serde(default)]
    requested_capabilities: Option<Vec<WireCapability>>,
    /// Nomad 1.0's single capability (before `RequestedCapabilities`).
    #[serde(default)]
    access_mode: String,
    #[serde(default)]
    attachment_mode: String,
    #[serde(default)]
    mount_options: Option<WireMountOptions>,
    #[serde(default)]
    parameters: Option<BTreeMap<String, String>>,
    #[serde(default)]
    context: Option<BTreeMap<String, String>>,
    #[serde(default)]
    secrets: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireCapability {
    access_mode: String,
    attachment_mode: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireMountOptions {
    #[serde(default)]
    fs_type: String,
    #[serde(default)]
    mount_flags: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireVolumes {
    volumes: Vec<WireVolume>,
}

fn from_wire(w: WireVolume, ns: &str) -> Result<CsiVolume, ApiError> {
    if !w.namespace.is_empty() && w.namespace != ns {
        return Err(ApiError::bad_request(format!(
            "Volumes[0].Namespace: {:?} is not the request's namespace {ns:?}",
            w.namespace
        )));
    }
    if w.secrets.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(
            "Volumes[0].Secrets: volume secrets are not supported by Drover yet",
        ));
    }
    let mut capabilities = Vec::new();
    let mut requested = w.requested_capabilities.unwrap_or_default();
    if requested.is_empty() && !w.access_mode.is_empty() {
        requested.push(WireCapability {
            access_mode: w.access_mode.clone(),
            attachment_mode: w.attachment_mode.clone(),
        });
    }
    for (i, c) in requested.iter().enumerate() {
        let access_mode = CsiAccessMode::parse(&c.access_mode).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Volumes[0].RequestedCapabilities[{i}].AccessMode: unknown {:?}",
                c.access_mode
            ))
        })?;
        let attachment_mode = CsiAttachmentMode::parse(&c.attachment_mode).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Volumes[0].RequestedCapabilities[{i}].AttachmentMode: unknown {:?}",
                c.attachment_mode
            ))
        })?;
        capabilities.push(CsiCapability {
            access_mode,
            attachment_mode,
        });
    }
    let mo = w.mount_options.unwrap_or_default();
    Ok(CsiVolume {
        name: if w.name.is_empty() {
            w.id.clone()
        } else {
            w.name
        },
        id: w.id,
        namespace: ns.to_owned(),
        external_id: w.external_id,
        plugin_id: w.plugin_id,
        provider: String::new(),
        capacity_min: w.capacity_min,
        capacity_max: w.capacity_max,
        capacity: 0,
        capabilities,
        mount_options: CsiMountOptions {
            fs_type: mo.fs_type,
            mount_flags: mo.mount_flags.unwrap_or_default(),
        },
        parameters: w.parameters.unwrap_or_default(),
        context: w.context.unwrap_or_default(),
        created: false,
        create_index: 0,
        modify_index: 0,
    })
}

/// The one volume of a register or create body, whose id must be the path's.
fn body_volume(
    body: Result<axum::body::Bytes, BytesRejection>,
    id: &str,
    ns: &str,
) -> Result<CsiVolume, ApiError> {
    let w: WireVolumes = json_body(body)?;
    let mut vols = w.volumes.into_iter();
    let (Some(v), None) = (vols.next(), vols.next()) else {
        return Err(ApiError::bad_request(
            "Volumes: exactly one volume per request",
        ));
    };
    if v.id != id {
        return Err(ApiError::bad_request(format!(
            "Volumes[0].ID: {:?} is not the path's volume id {id:?}",
            v.id
        )));
    }
    from_wire(v, ns)
}

/// Nomad's `CSIVolume` (and, with `full = false`, its `CSIVolumeListStub`).
fn volume_json(api: &Api, v: &CsiVolume, claims: &[CsiClaim], full: bool) -> Value {
    let nodes = api.server.nodes();
    let all = plugins(&nodes);
    let (ch, ce, nh, ne, required) = all
        .get(&v.plugin_id)
        .map(|p| {
            let (_, _, ch, ce, nh, ne, r) = summary(p);
            (ch, ce, nh, ne, r)
        })
        .unwrap_or_default();
    let writers: BTreeMap<&str, Value> = claims
        .iter()
        .filter(|c| c.write)
        .map(|c| (c.alloc_id.as_str(), Value::Null))
        .collect();
    let readers: BTreeMap<&str, Value> = claims
        .iter()
        .filter(|c| !c.write)
        .map(|c| (c.alloc_id.as_str(), Value::Null))
        .collect();
    let (access, attachment) = match (claims.is_empty(), v.capabilities.first()) {
        (false, Some(c)) => (c.access_mode.as_str(), c.attachment_mode.as_str()),
        _ => ("", ""),
    };
    let mut out = json!({
        "ID": v.id,
        "Namespace": v.namespace,
        "Name": v.name,
        "ExternalID": v.external_id,
        "PluginID": v.plugin_id,
        "Provider": v.provider,
        "Schedulable": nh > 0,
        "AccessMode": access,
        "AttachmentMode": attachment,
        "CurrentReaders": readers.len(),
        "CurrentWriters": writers.len(),
        "ControllerRequired": required,
        "ControllersHealthy": ch,
        "ControllersExpected": ce,
        "NodesHealthy": nh,
        "NodesExpected": ne,
        "CreateIndex": v.create_index,
        "ModifyIndex": v.modify_index,
    });
    if full && let Some(o) = out.as_object_mut() {
        o.insert("CapacityMin".into(), json!(v.capacity_min));
        o.insert("CapacityMax".into(), json!(v.capacity_max));
        o.insert("Capacity".into(), json!(v.capacity));
        o.insert(
            "RequestedCapabilities".into(),
            json!(
                v.capabilities
                    .iter()
                    .map(|c| json!({
                        "AccessMode": c.access_mode.as_str(),
                        "AttachmentMode": c.attachment_mode.as_str(),
                    }))
                    .collect::<Vec<_>>()
            ),
        );
        o.insert(
            "MountOptions".into(),
            json!({"FsType": v.mount_options.fs_type, "MountFlags": v.mount_options.mount_flags}),
        );
        o.insert("Parameters".into(), json!(v.parameters));
        o.insert("Context".into(), json!(v.context));
        o.insert("ReadAllocs".into(), json!(readers));
        o.insert("WriteAllocs".into(), json!(writers));
        o.insert(
            "Allocations".into(),
            json!(
                claims
                    .iter()
                    .map(|c| json!({
                        "ID": c.alloc_id,
                        "NodeID": c.node_id,
                        "JobID": c.job,
                        "Write": c.write,
                    }))
                    .collect::<Vec<_>>()
            ),
        );
    }
    out
}

fn check_volume_type(q: &Params) -> Result<(), ApiError> {
    match q.get("type") {
        Some("csi") | None => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "unsupported volume type {other:?}: only type=csi volumes are listed"
        ))),
    }
}

pub(super) async fn list_volumes(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    check_volume_type(&q)?;
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix().to_owned();
    let plugin = q.get("plugin_id").map(str::to_owned);
    let filter = scope.list_filter("csi-list-volume");
    let list: Vec<Value> = api
        .server
        .csi_volumes(&filter)
        .iter()
        .filter(|(v, _)| v.id.starts_with(&prefix))
        .filter(|(v, _)| plugin.as_ref().is_none_or(|p| *p == v.plugin_id))
        .map(|(v, c)| volume_json(&api, v, c, false))
        .collect();
    answer(index, list)
}

pub(super) async fn get_volume(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let (v, claims) = api
        .server
        .csi_volume(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("volume not found"))?;
    answer(index, volume_json(&api, &v, &claims, true))
}

pub(super) async fn register_volume(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let v = body_volume(body, &id, scope.namespace())?;
    let index = api.server.register_csi_volume(v).await?;
    answer(index, json!({ "Index": index, "Warnings": "" }))
}

pub(super) async fn deregister_volume(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
) -> ApiResult {
    let index = api
        .server
        .deregister_csi_volume(scope.namespace(), &id)
        .await?;
    answer(index, json!({ "Index": index }))
}

pub(super) async fn create_volume(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let v = body_volume(body, &id, scope.namespace())?;
    let index = api.server.create_csi_volume(v).await?;
    let (v, claims) = api
        .server
        .csi_volume(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("volume not found"))?;
    answer(
        index,
        json!({ "Index": index, "Volumes": [volume_json(&api, &v, &claims, true)], "Warnings": "" }),
    )
}

pub(super) async fn delete_volume(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
) -> ApiResult {
    let index = api.server.delete_csi_volume(scope.namespace(), &id).await?;
    answer(index, json!({ "Index": index }))
}
