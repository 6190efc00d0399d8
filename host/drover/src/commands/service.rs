//! `drover service list|info`: the services registered by the allocations that run
//! (Nomad's native service discovery).

use std::process::ExitCode;

use clap::Subcommand;
use drover_server_api::client::{Client, QueryOptions};

use super::cluster_error;
use crate::render::{print_json, short};

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// List the registered services and their tags.
    List {
        /// Print JSON (`GET /v1/services`).
        #[arg(long)]
        json: bool,
    },
    /// Show the instances of a service: address, port, allocation, node, health.
    Info {
        /// The service's name.
        name: String,
        /// Every instance, the unhealthy ones too (by default only the instances whose
        /// checks pass or warn, as `GET /v1/service/<name>` serves them).
        #[arg(long)]
        all: bool,
        /// Print JSON (`GET /v1/service/<name>`).
        #[arg(long)]
        json: bool,
    },
}

/// Run a `service` subcommand.
pub async fn service_command(c: &Client, cmd: ServiceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ServiceCommand::List { json } => {
            let list = c
                .services(&QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                return print_json(&list).map(|()| ExitCode::SUCCESS);
            }
            if list.iter().all(|ns| ns.services.is_empty()) {
                println!("No services registered");
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<32} TAGS", "SERVICE NAME");
            for ns in &list {
                for s in &ns.services {
                    println!("{:<32} [{}]", s.service_name, s.tags.join(","));
                }
            }
        }
        ServiceCommand::Info { name, all, json } => {
            let list = c
                .service(&name, all, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                return print_json(&list).map(|()| ExitCode::SUCCESS);
            }
            if list.is_empty() {
                println!(
                    "No {}instances of service {name:?}",
                    if all { "" } else { "healthy " }
                );
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<10} {:<28} {:<10} {:<10} {:<10} TAGS",
                "JOB", "ADDRESS", "STATUS", "NODE", "ALLOC"
            );
            for r in &list {
                let address = if r.address.contains(':') {
                    format!("[{}]:{}", r.address, r.port)
                } else {
                    format!("{}:{}", r.address, r.port)
                };
                println!(
                    "{:<10} {:<28} {:<10} {:<10} {:<10} [{}]",
                    r.job_id,
                    address,
                    r.status.as_str(),
                    short(&r.node_id),
                    short(&r.alloc_id),
                    r.tags.join(",")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
