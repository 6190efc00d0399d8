//! The `drover` command-line client: talks JSON to the agent's API socket.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyperlocal::{UnixClientExt as _, UnixConnector};

use crate::config::default_api_socket;

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
    let dev = crate::config::AgentConfig {
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

    /// Send a request; returns the JSON body of a 2xx answer, or the API's error text.
    pub async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let uri: hyper::Uri = hyperlocal::Uri::new(&self.socket, path).into();
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .context("building request")?;
        let resp = self.client.request(req).await.map_err(|e| {
            anyhow!(
                "cannot reach the agent at {}: {e} (is `drover agent` running? set --address or DROVER_ADDR)",
                self.socket.display()
            )
        })?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .context("reading the agent's answer")?
            .to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(
            |_| serde_json::json!({ "error": String::from_utf8_lossy(&body).into_owned() }),
        );
        if !status.is_success() {
            let msg = value
                .get("error")
                .and_then(|e| e.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| value.to_string());
            bail!("{msg}");
        }
        Ok(value)
    }
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
