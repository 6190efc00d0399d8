//! The `drover` command-line client: talks JSON to the agent's API socket.

use std::path::{Path, PathBuf};

use std::io::Write as _;

use anyhow::{Context as _, anyhow, bail};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyperlocal::{UnixClientExt as _, UnixConnector};

use drover_host::config::default_api_socket;
use drover_host::logs::{Frame, FrameDecoder};
use drover_host::spec::SpecFile;
use drover_host::tasks::{RestartMode, RestartPolicy, RunRequest};

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

/// A connection to the agent API.
pub struct ApiClient {
    socket: PathBuf,
    client: Client<UnixConnector, Full<Bytes>>,
}

impl ApiClient {
    /// A client for the agent at `socket`.
    pub fn new(socket: PathBuf) -> Self {
        ApiClient {
            socket,
            client: Client::unix(),
        }
    }

    async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<hyper::Response<Incoming>> {
        let uri: hyper::Uri = hyperlocal::Uri::new(&self.socket, path).into();
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .context("building request")?;
        self.client.request(req).await.map_err(|e| {
            anyhow!(
                "cannot reach the agent at {}: {e} (is `drover agent` running? set --address or DROVER_ADDR)",
                self.socket.display()
            )
        })
    }

    /// Send a request; returns the JSON body of a 2xx answer, or the API's error text.
    pub async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let resp = self.send(method, path, body).await?;
        let status = resp.status();
        let value = json_body(resp).await?;
        if !status.is_success() {
            bail!("{}", error_text(&value));
        }
        Ok(value)
    }

    /// `GET path` whose answer is a stream: the body of a 2xx answer, or the error.
    pub async fn open_stream(&self, path: &str) -> anyhow::Result<Incoming> {
        let resp = self.send(hyper::Method::GET, path, None).await?;
        if resp.status().is_success() {
            return Ok(resp.into_body());
        }
        let value = json_body(resp).await?;
        bail!("{}", error_text(&value));
    }
}

/// The agent's answer as JSON; a body that is not JSON becomes `{"error": <text>}`.
async fn json_body(resp: hyper::Response<Incoming>) -> anyhow::Result<serde_json::Value> {
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the agent's answer")?
        .to_bytes();
    Ok(serde_json::from_slice(&body).unwrap_or_else(
        |_| serde_json::json!({ "error": String::from_utf8_lossy(&body).into_owned() }),
    ))
}

fn error_text(value: &serde_json::Value) -> String {
    value
        .get("error")
        .and_then(|e| e.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| value.to_string())
}

/// The next piece of a streamed body; `None` at its end.
async fn next_bytes(body: &mut Incoming) -> anyhow::Result<Option<Bytes>> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => bail!("the agent's stream broke off: {e}"),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
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
pub async fn print_logs(c: &ApiClient, id: &str, args: &LogsArgs) -> anyhow::Result<()> {
    let mut path = format!(
        "/v1/tasks/{id}/logs?framed=true&stream={}&follow={}",
        if args.stderr { "stderr" } else { "stdout" },
        args.follow
    );
    if let Some(n) = args.tail {
        path.push_str(&format!("&tail={n}"));
    }
    let mut body = c.open_stream(&path).await?;
    let mut frames = FrameDecoder::default();
    let mut out = std::io::stdout().lock();
    while let Some(bytes) = next_bytes(&mut body).await? {
        frames.push(&bytes);
        while let Some(frame) = frames.next_frame()? {
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
                Frame::Skipped(n) => eprintln!("{}", drover_host::logs::skipped_notice(n)),
                Frame::Error(e) => bail!("{e}"),
            }
        }
    }
    if frames.has_partial() {
        bail!("the agent's log stream ended in the middle of a frame");
    }
    Ok(())
}

/// Print the JSON lines of a streamed answer as they come, each through `line`.
pub async fn follow_json_lines(
    c: &ApiClient,
    path: &str,
    mut line: impl FnMut(&serde_json::Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut body = c.open_stream(path).await?;
    let mut pending: Vec<u8> = Vec::new();
    while let Some(bytes) = next_bytes(&mut body).await? {
        pending.extend_from_slice(&bytes);
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let text: Vec<u8> = pending.drain(..=nl).collect();
            let value: serde_json::Value = serde_json::from_slice(&text).with_context(|| {
                format!(
                    "the agent sent a line that is not JSON: {}",
                    String::from_utf8_lossy(&text)
                )
            })?;
            if let Some(e) = value.get("error") {
                bail!("{}", e.as_str().unwrap_or_default());
            }
            line(&value)?;
        }
    }
    Ok(())
}

/// Print task events: time, type, message.
pub fn print_events(events: &serde_json::Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(events).unwrap_or_default()
        );
        return;
    }
    println!("{:<28} {:<16} MESSAGE", "TIME", "TYPE");
    for e in events.as_array().into_iter().flatten() {
        println!(
            "{:<28} {:<16} {}",
            field_text(e, "time"),
            field_text(e, "type"),
            field_text(e, "message")
        );
    }
}

/// `value` percent-encoded for a query string.
pub fn query_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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
pub fn stats_row(sample: &serde_json::Value) -> String {
    let f = |k: &str| {
        sample
            .get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    let rss = sample
        .get("memory_rss_bytes")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    format!(
        "{:<28} {:>7.1}% {:>12} {:>9.2}s",
        field_text(sample, "time"),
        f("cpu_percent"),
        human_bytes(rss),
        f("cpu_user_seconds") + f("cpu_system_seconds")
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

fn check_duration(flag: &str, value: &str) -> anyhow::Result<String> {
    humantime::parse_duration(value)
        .with_context(|| format!("{flag} {value:?} is not a duration like \"5s\" or \"1m30s\""))?;
    Ok(value.to_owned())
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
pub fn print_plugins(rows: &serde_json::Value, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(rows).unwrap_or_default());
        return;
    }
    println!(
        "{:<16} {:<9} {:<10} {:<10} {:<8} {:<8} PATH / REASON",
        "NAME", "SOURCE", "STATE", "VERSION", "API", "PID"
    );
    for r in rows.as_array().into_iter().flatten() {
        let s = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let pid = r
            .get("pid")
            .and_then(|p| p.as_u64())
            .map(|p| p.to_string())
            .unwrap_or_else(|| "-".into());
        let detail = if s("state") == "healthy" {
            s("path")
        } else {
            format!("{}: {}", s("path"), s("reason"))
        };
        println!(
            "{:<16} {:<9} {:<10} {:<10} {:<8} {:<8} {}",
            s("name"),
            s("source"),
            s("state"),
            s("version"),
            s("api_version"),
            pid,
            detail
        );
    }
}

/// A JSON field as table text: strings bare, null or absent as `-`.
fn field_text(value: &serde_json::Value, key: &str) -> String {
    match value.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        None | Some(serde_json::Value::Null) => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// Print one task.
pub fn print_task(task: &serde_json::Value, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(task).unwrap_or_default());
        return;
    }
    let s = |k: &str| field_text(task, k);
    println!("ID          = {}", s("id"));
    println!("Name        = {}", s("name"));
    println!("Driver      = {}", s("driver"));
    println!("State       = {}", s("state"));
    println!("Exit Code   = {}", s("exit_code"));
    if task.get("signal").is_some_and(|v| !v.is_null()) {
        println!("Signal      = {}", s("signal"));
    }
    if task.get("error").is_some_and(|v| !v.is_null()) {
        println!("Error       = {}", s("error"));
    }
    println!("Task Dir    = {}", s("task_dir"));
    println!("Events:");
    for e in task
        .get("events")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
    {
        let f = |k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or("");
        println!("  {}  {:<14} {}", f("time"), f("type"), f("message"));
    }
}

/// Print a task list.
pub fn print_tasks(tasks: &serde_json::Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(tasks).unwrap_or_default()
        );
        return;
    }
    println!(
        "{:<34} {:<16} {:<10} {:<8} EXIT",
        "ID", "NAME", "DRIVER", "STATE"
    );
    for t in tasks.as_array().into_iter().flatten() {
        let s = |k: &str| field_text(t, k);
        // A task killed by a signal has exit code 0; show the signal instead.
        let exit = match t.get("signal").and_then(|v| v.as_i64()) {
            Some(sig) => format!("signal {sig}"),
            None => s("exit_code"),
        };
        println!(
            "{:<34} {:<16} {:<10} {:<8} {exit}",
            s("id"),
            s("name"),
            s("driver"),
            s("state")
        );
    }
}

/// The process exit code `drover task wait` uses for a dead task: its exit code, or
/// 128 + signal as shells do, or 1 when the driver could not tell.
pub fn task_exit_code(task: &serde_json::Value) -> i32 {
    if let Some(sig) = task.get("signal").and_then(|s| s.as_i64()) {
        return 128 + sig as i32;
    }
    if task.get("error").is_some_and(|e| !e.is_null())
        && task.get("exit_code").and_then(|c| c.as_i64()) == Some(0)
    {
        return 1;
    }
    task.get("exit_code")
        .and_then(|c| c.as_i64())
        .map(|c| c as i32)
        .unwrap_or(1)
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
        assert_eq!(req.kill_timeout.as_deref(), Some("9s"));
        assert_eq!(
            req.config,
            serde_json::json!({"command": "/bin/sh", "args": ["-c", "false"], "cwd": "local"})
        );
        assert_eq!(req.env["A"], "flag");
        assert_eq!(req.env["B"], "x=y");
        let restart = req.restart.unwrap();
        assert_eq!(
            (restart.attempts, restart.delay.as_str(), restart.mode),
            (5, "3s", RestartMode::Delay)
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
        assert_eq!(query_escape("1m 30s"), "1m%2030s");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
    }
}
