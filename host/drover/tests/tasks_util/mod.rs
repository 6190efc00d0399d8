//! Helpers of the `tasks_*` tests: the agent's HTTP API without a client library.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::Agent;

/// One HTTP/1.1 request over the agent's unix socket; returns status and JSON body.
pub fn http(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut s = UnixStream::connect(socket).expect("connect to the agent API");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: drover\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status: u16 = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {resp}"));
    let json = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let value = serde_json::from_str(json).unwrap_or(serde_json::Value::Null);
    (status, value)
}

#[allow(unused_imports)] // not every test binary that includes this module uses it
pub use crate::common::rawexec_agent as agent;

/// Event types of a task view, oldest first.
pub fn kinds(task: &serde_json::Value) -> Vec<String> {
    task["events"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Poll the task until `cond` holds for its view, or panic after `within`.
pub fn until(
    agent: &Agent,
    id: &str,
    within: Duration,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let (_, task) = http(&agent.socket, "GET", &format!("/v1/tasks/{id}"), None);
        if cond(&task) {
            return task;
        }
        assert!(
            Instant::now() < deadline,
            "task never {what}: {task:#}\nagent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is a running process (a zombie is not: it only waits to be reaped,
/// which an orphan's init may never do in a container).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}
