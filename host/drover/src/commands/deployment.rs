//! `drover deployment list|status|promote|fail`: the rollouts of service jobs'
//! versions (Nomad's deployments), through the servers' HTTP API.

use std::process::ExitCode;

use clap::Subcommand;
use drover_server_api::client::{Client, QueryOptions};

use super::cluster_error;
use crate::render::{deployment_status_text, deployments_text, print_json, short};

#[derive(Debug, Subcommand)]
pub enum DeploymentCommand {
    /// List the deployments, newest first.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a deployment: its status and, per group, how far the rollout is.
    Status {
        /// Deployment id or a unique prefix of it.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Promote a deployment's healthy canaries: the rollout goes on past them.
    Promote {
        /// Deployment id or a unique prefix of it.
        id: String,
        /// Promote only this group's canaries (repeatable; default: every group).
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mark a running deployment failed (with `auto_revert`, the job goes back to its
    /// last stable version).
    Fail {
        /// Deployment id or a unique prefix of it.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run a `deployment` subcommand.
pub async fn deployment_command(c: &Client, cmd: DeploymentCommand) -> anyhow::Result<ExitCode> {
    let q = QueryOptions::default();
    match cmd {
        DeploymentCommand::List { json } => {
            let list = c.deployments(&q).await.map_err(cluster_error)?.value;
            if json {
                print_json(&list)?;
            } else {
                print!("{}", deployments_text(&list));
            }
        }
        DeploymentCommand::Status { id, json } => {
            let d = c.deployment(&id, &q).await.map_err(cluster_error)?.value;
            if json {
                print_json(&d)?;
            } else {
                print!("{}", deployment_status_text(&d));
            }
        }
        DeploymentCommand::Promote { id, groups, json } => {
            let groups = (!groups.is_empty()).then_some(groups);
            let r = c
                .promote_deployment(&id, groups)
                .await
                .map_err(cluster_error)?;
            if json {
                print_json(&r)?;
            } else {
                println!("Deployment \"{}\" promoted", short(&id));
                if !r.eval_id.is_empty() {
                    println!("Evaluation ID: {}", r.eval_id);
                }
            }
        }
        DeploymentCommand::Fail { id, json } => {
            let r = c.fail_deployment(&id).await.map_err(cluster_error)?;
            if json {
                print_json(&r)?;
            } else {
                println!("Deployment \"{}\" failed", short(&id));
                if let Some(v) = r.reverted_job_version {
                    println!("Job reverted to version {v}");
                }
                if !r.eval_id.is_empty() {
                    println!("Evaluation ID: {}", r.eval_id);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
