//! `drover namespace apply|list|status|delete` (Nomad's `nomad namespace ...`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;
use drover_server_api::Namespace;
use drover_server_api::client::Client;

use super::cluster_error;
use crate::render::print_json;

#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Create a namespace, or update its description and meta.
    Apply {
        /// The namespace's name (letters, digits and '-').
        name: String,
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// Metadata, `key=value` (repeatable).
        #[arg(long, value_name = "KEY=VALUE")]
        meta: Vec<String>,
    },
    /// List the namespaces the token may see.
    List {
        /// Print JSON (`GET /v1/namespaces`).
        #[arg(long)]
        json: bool,
    },
    /// Show one namespace.
    Status {
        /// Its name.
        name: String,
        /// Print JSON (`GET /v1/namespace/<name>`).
        #[arg(long)]
        json: bool,
    },
    /// Delete an empty namespace (no jobs, no variables).
    Delete {
        /// Its name.
        name: String,
    },
}

/// Run a `namespace` subcommand.
pub async fn namespace_command(c: &Client, cmd: NamespaceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NamespaceCommand::Apply {
            name,
            description,
            meta,
        } => {
            let mut ns = match c.namespace_info(&name).await {
                Ok(a) => a.value,
                Err(e) if e.is_not_found() => Namespace {
                    name: name.clone(),
                    description: String::new(),
                    meta: BTreeMap::new(),
                    create_index: 0,
                    modify_index: 0,
                },
                Err(e) => return Err(cluster_error(e)),
            };
            if let Some(d) = description {
                ns.description = d;
            }
            for kv in &meta {
                let Some((k, v)) = kv.split_once('=') else {
                    bail!("--meta {kv:?}: expected key=value");
                };
                ns.meta.insert(k.to_owned(), v.to_owned());
            }
            c.apply_namespace(&ns).await.map_err(cluster_error)?;
            println!("Successfully applied namespace {name:?}!");
        }
        NamespaceCommand::List { json } => {
            let list = c.namespaces().await.map_err(cluster_error)?.value;
            if json {
                return print_json(&list).map(|()| ExitCode::SUCCESS);
            }
            let w = list.iter().map(|n| n.name.len()).max().unwrap_or(0).max(4);
            println!("{:<w$}  Description", "Name");
            for n in &list {
                println!("{:<w$}  {}", n.name, n.description);
            }
        }
        NamespaceCommand::Status { name, json } => {
            let ns = c.namespace_info(&name).await.map_err(cluster_error)?.value;
            if json {
                return print_json(&ns).map(|()| ExitCode::SUCCESS);
            }
            println!("Name        = {}", ns.name);
            println!("Description = {}", ns.description);
            if !ns.meta.is_empty() {
                println!("\nMetadata");
                for (k, v) in &ns.meta {
                    println!("{k} = {v}");
                }
            }
        }
        NamespaceCommand::Delete { name } => {
            c.delete_namespace(&name).await.map_err(cluster_error)?;
            println!("Successfully deleted namespace {name:?}!");
        }
    }
    Ok(ExitCode::SUCCESS)
}
