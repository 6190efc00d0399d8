//! `drover task`: run a task from a task file and/or flags, and watch, signal, stop
//! and forget tasks, through the agent's API ([`drover_api::Client`]).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::Subcommand;
use drover_api::taskfile::TaskFile;
use drover_api::{
    Client, Frame, LogStream, LogsOptions, RestartMode, RestartPolicy, RunRequest, StopRequest,
    TaskView,
};

use super::api_error;
use crate::render;

#[derive(Subcommand)]
pub enum TaskCommand {
    /// Start a task, from a spec file (TOML) and/or flags; flags override the file.
    Run {
        /// Task spec file (TOML): driver, name, `[config]`, `[env]`, kill_signal,
        /// kill_timeout, `[resources]`, `[restart]`, `[logs]`.
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        #[command(flatten)]
        flags: RunFlags,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a task.
    Status {
        /// Task id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List tasks.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Wait for a task to exit; exit with its exit code (128+N if killed by signal N).
    Wait {
        /// Task id.
        id: String,
        /// Print the task as JSON when it exits.
        #[arg(long)]
        json: bool,
    },
    /// Stop a task: kill signal, then SIGKILL after the kill timeout.
    Stop {
        /// Task id.
        id: String,
        /// Signal instead of the task's kill signal.
        #[arg(long)]
        signal: Option<String>,
        /// Timeout instead of the task's kill timeout, e.g. "2s".
        #[arg(long)]
        timeout: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a signal to a task.
    Signal {
        /// Task id.
        id: String,
        /// Signal name, e.g. SIGHUP.
        signal: String,
    },
    /// Print a task's output: stdout, or stderr with --stderr.
    Logs {
        /// Task id.
        id: String,
        /// Keep printing as the task writes, until it is dead.
        #[arg(short, long)]
        follow: bool,
        /// Print stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
        /// Start with the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
    },
    /// Print what happened to a task: time, type, message.
    Events {
        /// Task id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a task's CPU and memory use (CPU % over half a second), or follow it.
    Stats {
        /// Task id.
        id: String,
        /// Print a sample every --interval until the task is dead.
        #[arg(short, long)]
        follow: bool,
        /// Time between samples when following.
        #[arg(long, default_value = "1s")]
        interval: String,
        /// Print JSON (one object per line when following).
        #[arg(long)]
        json: bool,
    },
    /// Forget a dead task (or a running one with --force, killing it).
    Destroy {
        /// Task id.
        id: String,
        /// Kill it first if it is running.
        #[arg(long)]
        force: bool,
    },
}

pub async fn task_command(c: Client, cmd: TaskCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TaskCommand::Run { file, flags, json } => {
            let mut spec = match &file {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read task spec {}", path.display()))?;
                    Some(drover_api::taskfile::parse(
                        &text,
                        &path.display().to_string(),
                        &check_kill_signal,
                    )?)
                }
                None => None,
            };
            let request = run_request(spec.as_mut(), flags)?;
            let task = match c.run_task(&request).await {
                Ok(task) => task,
                Err(e) => {
                    // A config problem only the agent can see: point at the file's line.
                    let located = spec
                        .as_ref()
                        .and_then(|s| s.locate_config_error(&e.to_string()));
                    return Err(located.map_or_else(|| api_error(e), |l| anyhow::anyhow!("{l}")));
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&task)?);
            } else {
                println!("{}", task.id);
            }
        }
        TaskCommand::Status { id, json } => {
            let task = c.get_task(&id).await.map_err(api_error)?;
            render::print_task(&task, json)?;
        }
        TaskCommand::List { json } => {
            let tasks = c.list_tasks().await.map_err(api_error)?;
            render::print_tasks(&tasks, json)?;
        }
        TaskCommand::Wait { id, json } => {
            let task = c.wait_task(&id).await.map_err(api_error)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&task)?);
            }
            let code = task_exit_code(&task);
            return Ok(ExitCode::from(
                u8::try_from(code.clamp(0, 255)).unwrap_or(1),
            ));
        }
        TaskCommand::Stop {
            id,
            signal,
            timeout,
            json,
        } => {
            let request = StopRequest {
                signal,
                timeout: timeout
                    .map(|t| check_duration("--timeout", &t))
                    .transpose()?,
            };
            let task = c.stop_task(&id, &request).await.map_err(api_error)?;
            render::print_task(&task, json)?;
        }
        TaskCommand::Signal { id, signal } => {
            c.signal_task(&id, &signal).await.map_err(api_error)?;
        }
        TaskCommand::Logs {
            id,
            follow,
            stderr,
            tail,
        } => {
            let args = LogsArgs {
                stderr,
                follow,
                tail,
            };
            print_logs(&c, &id, &args).await?;
        }
        TaskCommand::Events { id, json } => {
            let events = c.task_events(&id).await.map_err(api_error)?;
            render::print_events(&events, json)?;
        }
        TaskCommand::Stats {
            id,
            follow,
            interval,
            json,
        } => {
            if follow {
                let interval = check_duration("--interval", &interval)?;
                let mut samples = c
                    .follow_task_stats(&id, Some(interval))
                    .await
                    .map_err(api_error)?;
                if !json {
                    println!("{}", render::stats_header());
                }
                while let Some(sample) = samples.next().await.map_err(api_error)? {
                    if json {
                        println!("{}", serde_json::to_string(&sample)?);
                    } else {
                        println!("{}", render::stats_row(&sample));
                    }
                }
            } else {
                let sample = c.task_stats(&id).await.map_err(api_error)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&sample)?);
                } else {
                    println!("{}", render::stats_header());
                    println!("{}", render::stats_row(&sample));
                }
            }
        }
        TaskCommand::Destroy { id, force } => {
            c.destroy_task(&id, force).await.map_err(api_error)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `drover task run` flags. Given together with a spec file, each flag that is set
/// replaces the file's value; `--env` adds to the file's `[env]`, and `--config`
/// replaces the top-level keys of the file's `[config]` that it names.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunFlags {
    /// Driver name (required without a spec file).
    #[arg(long)]
    pub driver: Option<String>,
    /// Driver task config as JSON. With a spec file, its keys replace the file's.
    #[arg(long)]
    pub config: Option<String>,
    /// Task name.
    #[arg(long)]
    pub name: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Signal sent by stop (default SIGTERM).
    #[arg(long)]
    pub kill_signal: Option<String>,
    /// Time between the stop signal and SIGKILL, e.g. "5s".
    #[arg(long)]
    pub kill_timeout: Option<String>,
    /// Restarts allowed within the restart interval.
    #[arg(long)]
    pub restart_attempts: Option<u32>,
    /// Window the restart attempts are counted in, e.g. "30m".
    #[arg(long)]
    pub restart_interval: Option<String>,
    /// Wait before each restart, e.g. "15s".
    #[arg(long)]
    pub restart_delay: Option<String>,
    /// When the attempts are used up: fail, or delay until the interval is over.
    #[arg(long, value_parser = ["fail", "delay"])]
    pub restart_mode: Option<String>,
    /// Memory for the task in MiB.
    #[arg(long)]
    pub memory_mb: Option<u32>,
    /// Log files kept per stream.
    #[arg(long)]
    pub log_max_files: Option<u32>,
    /// Size of one log file in MiB.
    #[arg(long)]
    pub log_max_file_size_mb: Option<u32>,
}

/// Why `name` is no signal a task can be stopped with, as the agent would say it: the
/// task file's check of `kill_signal`.
fn check_kill_signal(name: &str) -> Result<(), String> {
    drover_plugin_sdk::Signal::parse_or_default(name)
        .map(drop)
        .map_err(|e| drover_plugin_sdk::DriverError::from(e).to_string())
}

/// `value` of `flag` as a duration.
pub fn check_duration(flag: &str, value: &str) -> anyhow::Result<Duration> {
    humantime::parse_duration(value)
        .with_context(|| format!("{flag} {value:?} is not a duration like \"5s\" or \"1m30s\""))
}

/// The request `drover task run` sends: the spec file's, with the flags on top.
/// Errors name the flag at fault.
pub fn run_request(spec: Option<&mut TaskFile>, flags: RunFlags) -> anyhow::Result<RunRequest> {
    let mut req = match &spec {
        Some(s) => s.request.clone(),
        None => RunRequest {
            config: serde_json::json!({}),
            ..Default::default()
        },
    };
    if let Some(d) = flags.driver {
        req.driver = d;
    }
    if req.driver.is_empty() {
        match &spec {
            Some(s) => bail!(
                "{}: no driver: add `driver = \"...\"` or give --driver",
                s.file
            ),
            None => bail!("give a task spec file or --driver"),
        }
    }
    if let Some(config) = flags.config {
        let value: serde_json::Value = serde_json::from_str(&config)
            .with_context(|| format!("--config is not valid JSON: {config}"))?;
        match (spec, value) {
            (Some(spec), serde_json::Value::Object(flag_keys)) => {
                let mut merged = req.config.as_object().cloned().unwrap_or_default();
                for (k, v) in flag_keys {
                    spec.forget_config_key(&k);
                    merged.insert(k, v);
                }
                req.config = serde_json::Value::Object(merged);
            }
            (Some(_), _) => bail!("--config must be a JSON object when given with a spec file"),
            (None, value) => req.config = value,
        }
    }
    if let Some(n) = flags.name {
        req.name = Some(n);
    }
    for kv in flags.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
        req.env.insert(k.to_owned(), v.to_owned());
    }
    if let Some(s) = flags.kill_signal {
        drover_plugin_sdk::Signal::parse_or_default(&s)
            .map_err(|e| anyhow!("--kill-signal: {}", drover_plugin_sdk::DriverError::from(e)))?;
        req.kill_signal = Some(s);
    }
    if let Some(t) = flags.kill_timeout {
        req.kill_timeout = Some(check_duration("--kill-timeout", &t)?);
    }
    if flags.restart_attempts.is_some()
        || flags.restart_interval.is_some()
        || flags.restart_delay.is_some()
        || flags.restart_mode.is_some()
    {
        let mut policy = req.restart.take().unwrap_or_else(RestartPolicy::default);
        if let Some(a) = flags.restart_attempts {
            policy.attempts = a;
        }
        if let Some(i) = flags.restart_interval {
            policy.interval = check_duration("--restart-interval", &i)?;
        }
        if let Some(d) = flags.restart_delay {
            policy.delay = check_duration("--restart-delay", &d)?;
        }
        if let Some(m) = flags.restart_mode {
            policy.mode = match m.as_str() {
                "fail" => RestartMode::Fail,
                "delay" => RestartMode::Delay,
                other => bail!("--restart-mode {other:?}: expected fail or delay"),
            };
        }
        req.restart = Some(policy);
    }
    if let Some(m) = flags.memory_mb {
        req.resources.get_or_insert_with(Default::default).memory_mb = i64::from(m);
    }
    if flags.log_max_files.is_some() || flags.log_max_file_size_mb.is_some() {
        let logs = req.logs.get_or_insert_with(Default::default);
        for (flag, value, slot) in [
            ("--log-max-files", flags.log_max_files, &mut logs.max_files),
            (
                "--log-max-file-size-mb",
                flags.log_max_file_size_mb,
                &mut logs.max_file_size_mb,
            ),
        ] {
            match value {
                Some(0) => bail!("{flag} must be at least 1"),
                Some(v) => *slot = v,
                None => {}
            }
        }
    }
    Ok(req)
}

/// Which log stream, and from where.
#[derive(Debug, Clone, Default)]
pub struct LogsArgs {
    /// stderr instead of stdout.
    pub stderr: bool,
    /// Keep following until the task is dead.
    pub follow: bool,
    /// Only the last N lines (then follow).
    pub tail: Option<u64>,
}

/// `drover task logs`: copy the task's log stream to stdout; notices about files
/// removed by rotation go to stderr. Ends at the end of the stream (with `follow`,
/// once the task is dead and all was shown), or quietly when stdout is closed.
pub async fn print_logs(c: &Client, id: &str, args: &LogsArgs) -> anyhow::Result<()> {
    let options = LogsOptions {
        stream: if args.stderr {
            LogStream::Stderr
        } else {
            LogStream::Stdout
        },
        follow: args.follow,
        tail: args.tail,
        offset: None,
    };
    let mut frames = c.task_logs(id, &options).await.map_err(api_error)?;
    let mut out = std::io::stdout().lock();
    while let Some(frame) = frames.next().await.map_err(api_error)? {
        match frame {
            Frame::Data(d) => {
                let written = out.write_all(&d).and_then(|()| out.flush());
                match written {
                    Ok(()) => {}
                    // `drover task logs ID | head`: the reader has seen enough.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(e).context("writing to stdout"),
                }
            }
            Frame::Skipped(n) => eprintln!("{}", drover_api::skipped_notice(n)),
            // LogFrames turns an error frame into an error.
            Frame::Error(e) => bail!("{e}"),
        }
    }
    Ok(())
}

/// The process exit code `drover task wait` uses for a dead task: its exit code, or
/// 128 + signal as shells do, or 1 when the driver could not tell.
pub fn task_exit_code(task: &TaskView) -> i32 {
    if let Some(sig) = task.signal {
        return 128 + sig;
    }
    if task.error.is_some() && task.exit_code == Some(0) {
        return 1;
    }
    task.exit_code.unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"driver = "rawexec"
name = "file"
kill_timeout = "9s"
[config]
command = "/bin/sh"
args = ["-c", "true"]
[env]
A = "file"
[restart]
attempts = 5
delay = "2s"
[logs]
max_files = 4
"#;

    fn spec() -> TaskFile {
        drover_api::taskfile::parse(SPEC, "job.toml", &check_kill_signal).unwrap()
    }

    #[test]
    fn flags_override_the_file_field_by_field() {
        let mut spec = spec();
        let flags = RunFlags {
            name: Some("flag".into()),
            config: Some(r#"{"args":["-c","false"],"cwd":"local"}"#.into()),
            env: vec!["A=flag".into(), "B=x=y".into()],
            restart_delay: Some("3s".into()),
            restart_mode: Some("delay".into()),
            memory_mb: Some(128),
            log_max_file_size_mb: Some(2),
            ..Default::default()
        };
        let req = run_request(Some(&mut spec), flags).unwrap();
        assert_eq!(req.driver, "rawexec");
        assert_eq!(req.name.as_deref(), Some("flag"));
        assert_eq!(req.kill_timeout, Some(Duration::from_secs(9)));
        assert_eq!(
            req.config,
            serde_json::json!({"command": "/bin/sh", "args": ["-c", "false"], "cwd": "local"})
        );
        assert_eq!(req.env["A"], "flag");
        assert_eq!(req.env["B"], "x=y");
        let restart = req.restart.unwrap();
        assert_eq!(
            (restart.attempts, restart.delay, restart.mode),
            (5, Duration::from_secs(3), RestartMode::Delay)
        );
        assert_eq!(req.resources.unwrap().memory_mb, 128);
        let logs = req.logs.unwrap();
        assert_eq!((logs.max_files, logs.max_file_size_mb), (4, 2));
        // The replaced config keys are now the flag's to answer for.
        let located = spec
            .locate_config_error(
                "task config for driver \"rawexec\": /args/0: bad; /command: worse",
            )
            .unwrap();
        assert_eq!(
            located,
            "--config: config.args[0]: bad\njob.toml:5: config.command: worse"
        );
    }

    #[test]
    fn flags_alone_make_a_request() {
        let req = run_request(
            None,
            RunFlags {
                driver: Some("rawexec".into()),
                restart_attempts: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(req.config, serde_json::json!({}));
        assert_eq!(
            req.restart,
            Some(RestartPolicy {
                attempts: 1,
                ..Default::default()
            })
        );
        assert!(req.logs.is_none() && req.resources.is_none());
    }

    #[test]
    fn bad_flags_are_named() {
        let err = |flags: RunFlags| {
            run_request(Some(&mut spec()), flags)
                .unwrap_err()
                .to_string()
        };
        assert!(
            err(RunFlags {
                restart_interval: Some("a while".into()),
                ..Default::default()
            })
            .starts_with("--restart-interval \"a while\" is not a duration")
        );
        assert!(
            err(RunFlags {
                kill_signal: Some("SIGFOO".into()),
                ..Default::default()
            })
            .starts_with("--kill-signal: ")
        );
        assert_eq!(
            err(RunFlags {
                log_max_files: Some(0),
                ..Default::default()
            }),
            "--log-max-files must be at least 1"
        );
        assert_eq!(
            err(RunFlags {
                config: Some("[1]".into()),
                ..Default::default()
            }),
            "--config must be a JSON object when given with a spec file"
        );
        assert!(
            err(RunFlags {
                env: vec!["NOEQUALS".into()],
                ..Default::default()
            })
            .contains("is not KEY=VALUE")
        );
        let mut no_driver =
            drover_api::taskfile::parse("name = \"x\"\n", "j.toml", &check_kill_signal).unwrap();
        assert_eq!(
            run_request(Some(&mut no_driver), RunFlags::default())
                .unwrap_err()
                .to_string(),
            "j.toml: no driver: add `driver = \"...\"` or give --driver"
        );
    }

    /// The agent's validator and this mapping must agree on the message format.
    #[test]
    fn agent_validation_messages_map_back_to_lines() {
        let schema = serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["command"],
            "properties": {
                "command": { "type": "string" },
                "args": { "type": "array", "items": { "type": "string" } },
            },
        });
        let text = "driver = \"rawexec\"\n[config]\ncommand = \"/bin/echo\"\nargs = [\"a\", 5]\ncomand = \"x\"\n";
        let spec = drover_api::taskfile::parse(text, "t.toml", &check_kill_signal).unwrap();
        let problems = drover_host::plugins::loader::Schema::new(schema)
            .unwrap()
            .validate(&spec.request.config)
            .unwrap_err();
        let message = format!(
            "{}",
            drover_plugin_sdk::DriverError::InvalidConfig(format!(
                "task config for driver \"rawexec\": {problems}"
            ))
        );
        assert_eq!(
            spec.locate_config_error(&message).unwrap(),
            "t.toml:5: config.comand: unknown field \"comand\" (expected one of: args, command)\n\
             t.toml:4: config.args[1]: 5 is not of type \"string\""
        );
    }

    #[test]
    fn a_task_files_kill_signal_is_checked_as_the_agent_does() {
        let e = drover_api::taskfile::parse(
            "\nkill_signal = \"SIGNOPE\"\n",
            "t.toml",
            &check_kill_signal,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "t.toml:2: kill_signal: invalid config: unknown signal \"SIGNOPE\" (expected a name \
             like SIGTERM or TERM, or a number like 15)"
        );
    }
}
