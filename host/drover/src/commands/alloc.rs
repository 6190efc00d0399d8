//! `drover alloc`: show an allocation, print its tasks' output and its directory's
//! files (the server asks the agent of the node the allocation runs on).

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
    /// Run a command inside a running task, interactively (Nomad's `alloc exec`):
    /// `alloc exec -i -t ALLOC [TASK] /bin/sh`. Its exit code is the command's.
    Exec {
        /// The task (default: the first argument if it names one, else the only task).
        #[arg(long)]
        task: Option<String>,
        /// Send stdin to the command (`-i=false`: none).
        #[arg(short = 'i', long = "stdin", num_args = 0..=1, default_value = "true",
              default_missing_value = "true", require_equals = true, value_name = "BOOL")]
        stdin: bool,
        /// Give the command a terminal (default: when stdin is one).
        #[arg(short = 't', long = "tty", num_args = 0..=1, default_missing_value = "true",
              require_equals = true, value_name = "BOOL")]
        tty: Option<bool>,
        /// Allocation id (or a unique prefix).
        alloc: String,
        /// The task (optional, see --task), then the command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
    /// List a directory of the allocation, or print a file (Nomad's `alloc fs`). `/`
    /// holds `alloc/` (shared by the group's tasks; its `logs/` has every task's
    /// output) and one directory per task; `<task>/secrets` is never shown.
    Fs {
        /// Allocation id (or a unique prefix).
        alloc: String,
        /// A path in the allocation's directory (`web/local/app.conf`).
        #[arg(default_value = "/")]
        path: String,
        /// Describe the path instead of listing or printing it.
        #[arg(long)]
        stat: bool,
        /// Keep printing the file as it grows (until it is deleted, or Ctrl-C).
        #[arg(short, long)]
        follow: bool,
        /// Print the end of the file: the last `-n` lines (10 by default) or `-c` bytes.
        #[arg(long)]
        tail: bool,
        /// With --tail: how many lines.
        #[arg(short = 'n', long = "lines", value_name = "N")]
        lines: Option<u64>,
        /// With --tail: how many bytes (instead of lines).
        #[arg(
            short = 'c',
            long = "bytes",
            value_name = "N",
            conflicts_with = "lines"
        )]
        bytes: Option<u64>,
        /// Print JSON (listings and --stat).
        #[arg(long)]
        json: bool,
    },
}

/// Write `data` to stdout; `false` when stdout is gone (a closed pipe ends quietly).
fn write_out(out: &mut impl std::io::Write, data: &[u8]) -> anyhow::Result<bool> {
    match out.write_all(data).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

/// The offset the last `lines` lines of a file of `size` bytes start at: windows from
/// the end, doubling, until enough line ends are seen or the start is reached.
async fn tail_lines_offset(
    c: &Client,
    alloc: &str,
    path: &str,
    size: u64,
    lines: u64,
) -> anyhow::Result<u64> {
    let mut window: u64 = 4096;
    loop {
        let start = size.saturating_sub(window);
        let mut bytes = c
            .alloc_fs_read(alloc, path, Some((start, size - start)))
            .await
            .map_err(cluster_error)?;
        let mut data = Vec::new();
        while let Some(piece) = bytes.next().await.map_err(cluster_error)? {
            data.extend_from_slice(&piece);
        }
        // A last line without its end counts too.
        let body = data.strip_suffix(b"\n").unwrap_or(&data);
        let ends: Vec<usize> = body
            .iter()
            .enumerate()
            .filter_map(|(i, b)| (*b == b'\n').then_some(i))
            .collect();
        if let Some(cut) = usize::try_from(lines)
            .ok()
            .and_then(|l| ends.len().checked_sub(l))
            .map(|k| ends[k])
        {
            return Ok(start + cut as u64 + 1);
        }
        if start == 0 {
            return Ok(0);
        }
        window = window.saturating_mul(2);
    }
}

async fn alloc_fs(
    c: &Client,
    alloc: &str,
    path: &str,
    stat: bool,
    follow: bool,
    tail: Option<(Option<u64>, Option<u64>)>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let info = c.alloc_fs_stat(alloc, path).await.map_err(cluster_error)?;
    if stat {
        if json {
            print_json(&info)?;
        } else {
            print!(
                "{}",
                crate::render::file_listing(std::slice::from_ref(&info))
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if info.is_dir {
        let entries = c.alloc_fs_ls(alloc, path).await.map_err(cluster_error)?;
        if json {
            print_json(&entries)?;
        } else {
            print!("{}", crate::render::file_listing(&entries));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let size = u64::try_from(info.size).unwrap_or(0);
    let start = match tail {
        None => 0,
        Some((_, Some(bytes))) => size.saturating_sub(bytes),
        Some((lines, None)) => tail_lines_offset(c, alloc, path, size, lines.unwrap_or(10)).await?,
    };
    let mut out = std::io::stdout().lock();
    if follow {
        let mut frames = c
            .alloc_fs_stream(alloc, path, start, false, true)
            .await
            .map_err(cluster_error)?;
        while let Some(frame) = frames.next().await.map_err(cluster_error)? {
            if let drover_api::Frame::Data(d) = frame
                && !write_out(&mut out, &d)?
            {
                break;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let range = (start > 0).then(|| (start, size - start));
    let mut bytes = c
        .alloc_fs_read(alloc, path, range)
        .await
        .map_err(cluster_error)?;
    while let Some(piece) = bytes.next().await.map_err(cluster_error)? {
        if !write_out(&mut out, &piece)? {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
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
        AllocCommand::Exec {
            task,
            stdin,
            tty,
            alloc,
            args,
        } => {
            return super::alloc_exec::alloc_exec(c, &alloc, task, stdin, tty, args).await;
        }
        AllocCommand::Fs {
            alloc,
            path,
            stat,
            follow,
            tail,
            lines,
            bytes,
            json,
        } => {
            if (lines.is_some() || bytes.is_some()) && !tail {
                bail!("-n and -c count from the end of the file: give --tail (-tail) too");
            }
            // The full id: the agent finds its local allocations by it.
            let a = c
                .allocation(&alloc, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            let tail = tail.then_some((lines, bytes));
            return alloc_fs(c, &a.id, &path, stat, follow, tail, json).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}
