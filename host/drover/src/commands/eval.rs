//! `drover eval`: show an evaluation, and what it could not place.

use std::process::ExitCode;

use clap::Subcommand;
use drover_server_api::client::{Client, QueryOptions};

use super::cluster_error;
use crate::render::{eval_text, print_json};

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Show an evaluation: its status and what it could not place.
    Status {
        /// Evaluation id (or a unique prefix).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run an `eval` subcommand.
pub async fn eval_command(c: &Client, cmd: EvalCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        EvalCommand::Status { id, json } => {
            let e = c
                .evaluation(&id, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&e)?;
            } else {
                print!("{}", eval_text(&e));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
