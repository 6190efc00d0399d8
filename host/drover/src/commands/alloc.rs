//! `drover alloc`: show an allocation, and print its tasks' output (the server asks
//! the agent of the node the allocation runs on).

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use drover_server_api::AllocLogsQuery;
use drover_server_api::client::{Client, QueryOptions};

use super::cluster_error;
use crate::render::{alloc_text, print_json};

#[derive(Debug, Subcommand)]
pub enum AllocCommand {
    /// Show an allocation: where it runs and its tasks' states.
    Status {
        /// Allocation id (or a unique prefix).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a task's output (ask the agent of the node the allocation runs on).
    Logs {
        /// Allocation id (or a unique prefix).
        alloc: String,
        /// Task name.
        task: String,
        /// Keep printing as the task writes, until it is dead.
        #[arg(short, long)]
        follow: bool,
        /// Print stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
    },
}

/// Run an `alloc` subcommand.
pub async fn alloc_command(c: &Client, cmd: AllocCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AllocCommand::Status { id, json } => {
            let a = c
                .allocation(&id, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&a)?;
            } else {
                print!("{}", alloc_text(&a));
            }
        }
        AllocCommand::Logs {
            alloc,
            task,
            follow,
            stderr,
        } => {
            // The full id: the agent finds its local allocations by it.
            let a = c
                .allocation(&alloc, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if !a.task_states.is_empty() && !a.task_states.contains_key(&task) {
                let names: Vec<&str> = a.task_states.keys().map(String::as_str).collect();
                bail!(
                    "allocation {} has no task named {task:?}; its tasks: {}",
                    a.id,
                    names.join(", ")
                );
            }
            let query = AllocLogsQuery {
                task,
                stream: if stderr {
                    drover_api::LogStream::Stderr
                } else {
                    drover_api::LogStream::Stdout
                },
                follow,
                tail: None,
                framed: true,
            };
            let mut frames = c.alloc_logs(&a.id, &query).await.map_err(cluster_error)?;
            let mut out = std::io::stdout().lock();
            while let Some(frame) = frames.next().await.map_err(cluster_error)? {
                match frame {
                    drover_api::Frame::Data(d) => {
                        match out.write_all(&d).and_then(|()| out.flush()) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                                return Ok(ExitCode::SUCCESS);
                            }
                            Err(e) => return Err(e).context("writing to stdout"),
                        }
                    }
                    drover_api::Frame::Skipped(n) => eprintln!("{}", drover_api::skipped_notice(n)),
                    drover_api::Frame::Error(e) => bail!("{e}"),
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
