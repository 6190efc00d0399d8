//! `drover node`: list and show the cluster's nodes, and drain one.

use std::process::ExitCode;

use clap::Subcommand;
use drover_server_api::client::{Client, QueryOptions};

use super::cluster_error;
use crate::render::{alloc_row, node_json, nodes_text, print_json};

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List the nodes (or show one).
    Status {
        /// Node id or name.
        node: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drain a node: nothing new is placed on it and its allocations move elsewhere.
    Drain {
        /// Node id or name.
        node: String,
        /// End the drain: the node takes allocations again.
        #[arg(long)]
        disable: bool,
    },
}

/// Run a `node` subcommand.
pub async fn node_command(c: &Client, cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Status { node: None, json } => {
            let nodes = c
                .nodes(&QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                let view = nodes
                    .iter()
                    .map(node_json)
                    .collect::<anyhow::Result<Vec<_>>>()?;
                print_json(&view)?;
            } else {
                print!("{}", nodes_text(&nodes));
            }
        }
        NodeCommand::Status {
            node: Some(id),
            json,
        } => {
            let node = c
                .node(&id, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&node_json(&node)?)?;
            } else {
                print!("{}", nodes_text(std::slice::from_ref(&node)));
                if !node.devices.is_empty() {
                    println!();
                    println!("Devices");
                    for g in &node.devices {
                        let healthy = g.instances.iter().filter(|i| i.healthy).count();
                        println!(
                            "{}  {healthy}/{} healthy  {}",
                            g.id(),
                            g.instances.len(),
                            g.instances
                                .iter()
                                .map(|i| if i.healthy {
                                    i.id.clone()
                                } else {
                                    format!("{} (unhealthy: {})", i.id, i.health_description)
                                })
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                }
                if !node.host_volumes.is_empty() {
                    println!();
                    println!("Host Volumes");
                    for (name, v) in &node.host_volumes {
                        let mode = if v.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        };
                        println!("{name}  {}  {mode}", v.path);
                    }
                }
                if !node.csi_plugins.is_empty() {
                    println!();
                    println!("CSI Plugins");
                    for (id, f) in &node.csi_plugins {
                        let health = if f.healthy {
                            "healthy".to_owned()
                        } else {
                            format!("unhealthy ({})", f.health_description)
                        };
                        println!("{id}  {}  {}  {health}", f.plugin_type.as_str(), f.provider);
                    }
                }
                let allocs = c
                    .node_allocations(&node.id, &QueryOptions::default())
                    .await
                    .map_err(cluster_error)?
                    .value;
                println!();
                println!("Allocations");
                for a in &allocs {
                    println!("{}", alloc_row(a));
                }
            }
        }
        NodeCommand::Drain { node, disable } => {
            c.drain_node(&node, !disable).await.map_err(cluster_error)?;
            if disable {
                println!("Node {node}: drain ended, it takes allocations again");
            } else {
                println!("Node {node}: draining, its allocations move to other nodes");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
