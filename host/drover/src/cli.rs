//! The `drover` command-line client: talks to the agent's API through
//! [`drover_api::Client`] and prints its typed answers.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use drover_api::{
    Client, Frame, LogStream, LogsOptions, PluginState, PluginStatus, RestartMode, RestartPolicy,
    RunRequest, StatsView, TaskEventView, TaskView,
};
use drover_host::config::default_api_socket;
use drover_host::spec::SpecFile;

/// Resolve the agent address: `--address`/`DROVER_ADDR` (`unix:///path` or a path),
/// else the system agent's socket if present, else the dev agent's.
pub fn resolve_address(given: Option<&str>) -> anyhow::Result<PathBuf> {
    if let Some(a) = given {
        let path = a
            .strip_prefix("unix://")
            .or_else(|| a.strip_prefix("unix:"))
            .unwrap_or(a);
        if a.starts_with("http://") || a.starts_with("tcp://") {
            bail!("address {a:?}: only unix sockets are supported (unix:///path/to/api.sock)");
        }
        return Ok(PathBuf::from(path));
    }
    let system = default_api_socket(Path::new("/var/lib/drover"));
    if system.exists() {
        return Ok(system);
    }
    let dev = drover_host::config::AgentConfig {
        dev: true,
        ..Default::default()
    };
    Ok(dev.api_socket())
}

/// An API error as the CLI reports it: a connection failure says what to check.
pub fn api_error(e: drover_api::Error) -> anyhow::Error {
    match e {
        drover_api::Error::Connect { .. } => {
            anyhow!("{e} (is `drover agent` running? set --address or DROVER_ADDR)")
        }
        e => anyhow::Error::new(e),
    }
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

/// Print task events: time, type, message.
pub fn print_events(events: &[TaskEventView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(events)?);
        return Ok(());
    }
    println!("{:<28} {:<16} MESSAGE", "TIME", "TYPE");
    for e in events {
        println!("{:<28} {:<16} {}", e.time, e.kind.as_str(), e.message);
    }
    Ok(())
}

/// Bytes as a short human size (KiB, MiB, GiB).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The header of the `task stats` table.
pub fn stats_header() -> String {
    format!(
        "{:<28} {:>8} {:>12} {:>10}",
        "TIME", "CPU %", "MEMORY", "CPU TIME"
    )
}

/// One sample as a row of the `task stats` table.
pub fn stats_row(sample: &StatsView) -> String {
    format!(
        "{:<28} {:>7.1}% {:>12} {:>9.2}s",
        sample.time,
        sample.cpu_percent,
        human_bytes(sample.memory_rss_bytes),
        sample.cpu_user_seconds + sample.cpu_system_seconds
    )
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

/// `value` of `flag` as a duration.
pub fn check_duration(flag: &str, value: &str) -> anyhow::Result<Duration> {
    humantime::parse_duration(value)
        .with_context(|| format!("{flag} {value:?} is not a duration like \"5s\" or \"1m30s\""))
}

/// The request `drover task run` sends: the spec file's, with the flags on top.
/// Errors name the flag at fault.
pub fn run_request(spec: Option<&mut SpecFile>, flags: RunFlags) -> anyhow::Result<RunRequest> {
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

/// Print plugin status rows.
pub fn print_plugins(rows: &[PluginStatus], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<9} {:<10} {:<10} {:<8} {:<8} PATH / REASON",
        "NAME", "SOURCE", "STATE", "VERSION", "API", "PID"
    );
    for r in rows {
        let pid = match r.pid {
            Some(p) => p.to_string(),
            None if r.in_process => "in-agent".into(),
            None => "-".into(),
        };
        let detail = if r.state == PluginState::Healthy {
            r.path.display().to_string()
        } else {
            format!("{}: {}", r.path.display(), r.reason)
        };
        println!(
            "{:<16} {:<9} {:<10} {:<10} {:<8} {:<8} {}",
            r.name,
            r.source.as_str(),
            r.state.as_str(),
            r.version,
            r.api_version,
            pid,
            detail
        );
    }
    Ok(())
}

/// Print what `drover plugin reload` changed, one line each.
pub fn print_reload(report: &drover_api::ReloadReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    if report.changes.is_empty() {
        println!("no plugin changed");
    }
    for c in &report.changes {
        println!(
            "{:<9} {:<16} {}: {}",
            c.kind.as_str(),
            c.name,
            c.path.display(),
            c.message
        );
    }
    Ok(())
}

/// An optional number as table text: `-` when absent.
fn or_dash(value: Option<i32>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Print one task.
pub fn print_task(task: &TaskView, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(task)?);
        return Ok(());
    }
    println!("ID          = {}", task.id);
    println!("Name        = {}", task.name);
    println!("Driver      = {}", task.driver);
    println!("State       = {}", task.state);
    println!("Exit Code   = {}", or_dash(task.exit_code));
    if let Some(signal) = task.signal {
        println!("Signal      = {signal}");
    }
    if let Some(error) = &task.error {
        println!("Error       = {error}");
    }
    println!("Task Dir    = {}", task.task_dir.display());
    println!("Events:");
    for e in &task.events {
        println!("  {}  {:<14} {}", e.time, e.kind.as_str(), e.message);
    }
    Ok(())
}

/// Print a task list.
pub fn print_tasks(tasks: &[TaskView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(tasks)?);
        return Ok(());
    }
    println!(
        "{:<34} {:<16} {:<10} {:<8} EXIT",
        "ID", "NAME", "DRIVER", "STATE"
    );
    for t in tasks {
        // A task killed by a signal has exit code 0; show the signal instead.
        let exit = match t.signal {
            Some(sig) => format!("signal {sig}"),
            None => or_dash(t.exit_code),
        };
        println!(
            "{:<34} {:<16} {:<10} {:<8} {exit}",
            t.id,
            t.name,
            t.driver,
            t.state.as_str()
        );
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

/// The cluster flags of `drover agent`, as given.
#[derive(Debug, Clone, Default)]
pub struct ClusterFlags {
    /// `--servers` (each may hold several, comma-separated).
    pub servers: Vec<String>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// `--meta KEY=VALUE`, repeatable.
    pub meta: Vec<String>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
    /// `--tls-ca-file`.
    pub tls_ca_file: Option<PathBuf>,
    /// `--tls-cert-file`.
    pub tls_cert_file: Option<PathBuf>,
    /// `--tls-key-file`.
    pub tls_key_file: Option<PathBuf>,
}

impl ClusterFlags {
    /// The flags that were given, as config keys (`servers`, `node_name`, `meta`,
    /// `token_file`, `tls`) for the figment flags layer. A `--meta` that is not
    /// `KEY=VALUE` is an error naming it.
    pub fn into_flags(self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        use serde_json::Value;
        let path = |p: PathBuf| Value::from(p.display().to_string());
        let mut flags = serde_json::Map::new();
        let servers: Vec<Value> = self
            .servers
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Value::from)
            .collect();
        if !servers.is_empty() {
            flags.insert("servers".into(), Value::Array(servers));
        }
        if let Some(n) = self.node_name {
            flags.insert("node_name".into(), n.into());
        }
        if !self.meta.is_empty() {
            let mut meta = serde_json::Map::new();
            for kv in &self.meta {
                let Some((k, v)) = kv.split_once('=') else {
                    bail!("--meta {kv:?}: expected KEY=VALUE, e.g. --meta rack=r1");
                };
                let k = k.trim();
                if k.is_empty() {
                    bail!("--meta {kv:?}: the key is empty (expected KEY=VALUE)");
                }
                meta.insert(k.to_owned(), v.into());
            }
            flags.insert("meta".into(), Value::Object(meta));
        }
        if let Some(t) = self.token_file {
            flags.insert("token_file".into(), path(t));
        }
        let mut tls = serde_json::Map::new();
        if let Some(p) = self.tls_ca_file {
            tls.insert("ca_file".into(), path(p));
        }
        if let Some(p) = self.tls_cert_file {
            tls.insert("cert_file".into(), path(p));
        }
        if let Some(p) = self.tls_key_file {
            tls.insert("key_file".into(), path(p));
        }
        if !tls.is_empty() {
            flags.insert("tls".into(), Value::Object(tls));
        }
        Ok(flags)
    }
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

    fn spec() -> SpecFile {
        drover_host::spec::parse(SPEC, "job.toml").unwrap()
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
        let mut no_driver = drover_host::spec::parse("name = \"x\"\n", "j.toml").unwrap();
        assert_eq!(
            run_request(Some(&mut no_driver), RunFlags::default())
                .unwrap_err()
                .to_string(),
            "j.toml: no driver: add `driver = \"...\"` or give --driver"
        );
    }

    #[test]
    fn small_helpers() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
    }

    #[test]
    fn cluster_flags_become_config_keys() {
        use drover_host::config::AgentConfig;
        let flags = ClusterFlags {
            servers: vec!["127.0.0.1:4647,10.0.0.2:4647".into(), "h:1".into()],
            node_name: Some("n1".into()),
            meta: vec!["rack=r1".into(), "zone=a=b".into()],
            token_file: Some("/etc/drover/token".into()),
            tls_ca_file: Some("/etc/drover/ca.pem".into()),
            tls_cert_file: None,
            tls_key_file: None,
        }
        .into_flags()
        .unwrap();
        let c = AgentConfig::load(&[], vec![], &flags).unwrap();
        assert_eq!(c.servers, vec!["127.0.0.1:4647", "10.0.0.2:4647", "h:1"]);
        assert_eq!(c.node_name.as_deref(), Some("n1"));
        assert_eq!(c.meta["rack"], "r1");
        assert_eq!(c.meta["zone"], "a=b");
        assert_eq!(c.token_file, Some(PathBuf::from("/etc/drover/token")));
        assert_eq!(
            c.tls.map(|t| t.ca_file),
            Some(PathBuf::from("/etc/drover/ca.pem"))
        );

        for bad in ["rack", "=r1"] {
            let err = ClusterFlags {
                meta: vec![bad.into()],
                ..Default::default()
            }
            .into_flags()
            .unwrap_err()
            .to_string();
            assert!(err.contains(bad) && err.contains("KEY=VALUE"), "{err}");
        }
        assert!(ClusterFlags::default().into_flags().unwrap().is_empty());
    }
}
