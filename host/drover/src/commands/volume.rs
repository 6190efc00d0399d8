//! `drover volume create|register|deregister|delete|status` (Nomad's `nomad volume
//! ...`) for CSI volumes, with Nomad's volume spec files (HCL or JSON).

use std::process::ExitCode;

use anyhow::{Context as _, anyhow, bail};
use clap::Subcommand;
use drover_server_api::client::Client;
use drover_server_api::csi::{CsiVolume, MAX_VOLUME_SPEC_BYTES, parse_volume_spec};
use http::Method;
use serde_json::{Value, json};

use super::cluster_error;
use crate::render::print_json;

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a CSI volume through its plugin's controller, from a volume spec file.
    Create {
        /// The volume spec (`id`, `type = "csi"`, `plugin_id`, `capability { ... }`).
        file: String,
    },
    /// Register an existing CSI volume (its spec names `external_id`).
    Register {
        /// The volume spec.
        file: String,
    },
    /// Forget a volume; its storage stays. Refused while allocations claim it.
    Deregister {
        /// The volume's id.
        id: String,
    },
    /// Delete a created volume through its plugin's controller. Refused while claimed.
    Delete {
        /// The volume's id.
        id: String,
    },
    /// List the CSI volumes, or show one.
    Status {
        /// The volume's id (none: every volume).
        id: Option<String>,
        /// Print JSON (Nomad's `CSIVolume`).
        #[arg(long)]
        json: bool,
    },
}

/// The spec in `file`; a spec naming no namespace takes the CLI's (`-namespace`).
fn read_spec_for(c: &Client, file: &str) -> anyhow::Result<(CsiVolume, Client)> {
    let mut v = read_spec(file)?;
    let text_names_ns = v.namespace != drover_server_api::DEFAULT_NAMESPACE;
    if !text_names_ns && let Some(ns) = c.namespace() {
        v.namespace = ns.to_owned();
    }
    let c = c.with_namespace(&v.namespace);
    Ok((v, c))
}

fn read_spec(file: &str) -> anyhow::Result<CsiVolume> {
    let meta = std::fs::metadata(file).with_context(|| format!("volume spec {file}"))?;
    if meta.len() > MAX_VOLUME_SPEC_BYTES as u64 {
        bail!(
            "volume spec {file}: larger than {} KiB",
            MAX_VOLUME_SPEC_BYTES / 1024
        );
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("volume spec {file}"))?;
    Ok(parse_volume_spec(file, &text)?)
}

/// Nomad's register/create body of `v`.
fn body(v: &CsiVolume) -> Value {
    json!({ "Volumes": [{
        "ID": v.id,
        "Name": v.name,
        "Namespace": v.namespace,
        "ExternalID": v.external_id,
        "PluginID": v.plugin_id,
        "CapacityMin": v.capacity_min,
        "CapacityMax": v.capacity_max,
        "RequestedCapabilities": v.capabilities.iter().map(|c| json!({
            "AccessMode": c.access_mode.as_str(),
            "AttachmentMode": c.attachment_mode.as_str(),
        })).collect::<Vec<_>>(),
        "MountOptions": {
            "FsType": v.mount_options.fs_type,
            "MountFlags": v.mount_options.mount_flags,
        },
        "Parameters": v.parameters,
        "Context": v.context,
    }]})
}

fn segment(id: &str) -> anyhow::Result<String> {
    if id.is_empty() || id.contains('/') || id == "." || id == ".." {
        bail!("volume id {id:?}: must be non-empty, hold no '/' and not be . or ..");
    }
    Ok(id
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect())
}

async fn call(
    c: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let bytes = body.map(|b| serde_json::to_vec(&b)).transpose()?;
    let answer = c
        .raw(method.clone(), path, bytes)
        .await
        .map_err(cluster_error)?;
    if !answer.status.is_success() {
        return Err(anyhow!(
            "{method} {path}: {} ({})",
            answer
                .error_message()
                .unwrap_or_else(|| "no reason given".into()),
            answer.status
        ));
    }
    if answer.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&answer.body).with_context(|| format!("{method} {path}: the answer"))
}

/// Run a `volume` subcommand.
pub async fn volume_command(c: &Client, cmd: VolumeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        VolumeCommand::Create { file } => {
            let (v, c) = read_spec_for(c, &file)?;
            let path = format!("/v1/volume/csi/{}/create", segment(&v.id)?);
            let out = call(&c, Method::PUT, &path, Some(body(&v))).await?;
            let ext = out["Volumes"][0]["ExternalID"].as_str().unwrap_or_default();
            println!("Created external volume {ext} with ID {}", v.id);
        }
        VolumeCommand::Register { file } => {
            let (v, c) = read_spec_for(c, &file)?;
            let path = format!("/v1/volume/csi/{}", segment(&v.id)?);
            call(&c, Method::PUT, &path, Some(body(&v))).await?;
            println!("Volume {:?} registered", v.id);
        }
        VolumeCommand::Deregister { id } => {
            let path = format!("/v1/volume/csi/{}", segment(&id)?);
            call(c, Method::DELETE, &path, None).await?;
            println!("Successfully deregistered volume {id:?}!");
        }
        VolumeCommand::Delete { id } => {
            let path = format!("/v1/volume/csi/{}/delete", segment(&id)?);
            call(c, Method::DELETE, &path, None).await?;
            println!("Successfully deleted volume {id:?}!");
        }
        VolumeCommand::Status { id: None, json } => {
            let list = call(c, Method::GET, "/v1/volumes?type=csi", None).await?;
            if json {
                return print_json(&list).map(|()| ExitCode::SUCCESS);
            }
            println!(
                "{:<20}  {:<20}  {:<20}  {:<11}  Access Mode",
                "ID", "Name", "Plugin ID", "Schedulable"
            );
            for v in list.as_array().into_iter().flatten() {
                println!(
                    "{:<20}  {:<20}  {:<20}  {:<11}  {}",
                    v["ID"].as_str().unwrap_or_default(),
                    v["Name"].as_str().unwrap_or_default(),
                    v["PluginID"].as_str().unwrap_or_default(),
                    v["Schedulable"].as_bool().unwrap_or_default(),
                    v["AccessMode"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .unwrap_or("<none>"),
                );
            }
        }
        VolumeCommand::Status { id: Some(id), json } => {
            let path = format!("/v1/volume/csi/{}", segment(&id)?);
            let v = call(c, Method::GET, &path, None).await?;
            if json {
                return print_json(&v).map(|()| ExitCode::SUCCESS);
            }
            for (label, key) in [
                ("ID", "ID"),
                ("Name", "Name"),
                ("External ID", "ExternalID"),
                ("Plugin ID", "PluginID"),
                ("Provider", "Provider"),
                ("Schedulable", "Schedulable"),
                ("Access Mode", "AccessMode"),
                ("Namespace", "Namespace"),
            ] {
                let value = match &v[key] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                println!("{label:<19} = {value}");
            }
            let allocs = v["Allocations"].as_array().cloned().unwrap_or_default();
            println!("\nAllocations");
            if allocs.is_empty() {
                println!("No allocations placed");
            }
            for a in allocs {
                println!(
                    "{}  node {}  job {}  {}",
                    a["ID"].as_str().unwrap_or_default(),
                    a["NodeID"].as_str().unwrap_or_default(),
                    a["JobID"].as_str().unwrap_or_default(),
                    if a["Write"] == true { "write" } else { "read" }
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
