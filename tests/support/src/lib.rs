//! # drover-test-support
//!
//! Helpers that Drover's test crates share, so that each test file holds only what
//! it tests: waiting with a deadline instead of sleeping and hoping ([`within`],
//! [`until`], [`until_blocking`]), reading processes from `/proc` ([`procs`]), the
//! private Docker daemon that `scripts/test.sh` starts ([`docker`]), a real etcd
//! ([`etcd`]), real go-plugin programs ([`goplugin`]), the real Nomad 1.0.18 programs
//! ([`nomad`]), real CSI plugins ([`csi`]), a test certificate authority
//! ([`pki`]), and reading a task's rotated logs ([`read_log`]).
//!
//! Only for tests: every helper panics with a message naming what did not happen.
#![warn(missing_docs)]

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub mod cni;
pub mod csi;
pub mod docker;
pub mod etcd;
pub mod goplugin;
pub mod net;
pub mod nomad;
mod peers;
pub mod pki;
pub mod procs;
pub mod vm;

/// How often [`until`] and [`until_blocking`] look again.
pub const POLL: Duration = Duration::from_millis(20);

/// Fail the test with `what` if `fut` does not finish within `limit`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let n = drover_test_support::within(Duration::from_secs(1), "an answer", async { 42 }).await;
/// assert_eq!(n, 42);
/// # }
/// ```
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {limit:?}"))
}

/// Poll `cond` every [`POLL`] until it holds, failing the test after `limit`.
pub async fn until(limit: Duration, what: &str, cond: impl FnMut() -> bool) {
    until_every(limit, POLL, what, cond).await
}

/// Poll `cond` every `every` until it holds, failing the test after `limit`. For
/// conditions that cost something to check (a `docker inspect`).
pub async fn until_every(
    limit: Duration,
    every: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true within {limit:?}"
        );
        tokio::time::sleep(every).await;
    }
}

/// [`until_every`] for tests without an async runtime: the thread sleeps between looks.
///
/// ```
/// use std::time::Duration;
/// let start = std::time::Instant::now();
/// drover_test_support::until_blocking(Duration::from_secs(5), Duration::from_millis(5),
///     "50 ms to pass", || start.elapsed() >= Duration::from_millis(50));
/// ```
pub fn until_blocking(
    limit: Duration,
    every: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true within {limit:?}"
        );
        std::thread::sleep(every);
    }
}

/// The concatenation of the rotated log files at `base` (`…/stdout` for
/// `stdout.0`, `stdout.1`, …), oldest first; empty when there are none.
pub fn read_log(base: &Path) -> String {
    drover_plugin_sdk::logs::log_files(base)
        .unwrap_or_default()
        .into_iter()
        .map(|(_, p)| std::fs::read_to_string(p).unwrap_or_default())
        .collect()
}

/// A command-driver task config running `script` with `/bin/sh -c`.
///
/// ```
/// let c = drover_test_support::sh("exit 3");
/// assert_eq!(c["args"][1], "exit 3");
/// ```
pub fn sh(script: &str) -> Value {
    json!({ "command": "/bin/sh", "args": ["-c", script] })
}

/// [`sh`] with more settings merged in.
///
/// ```
/// let c = drover_test_support::sh_with("true", serde_json::json!({"user": "nobody"}));
/// assert_eq!(c["user"], "nobody");
/// ```
pub fn sh_with(script: &str, extra: Value) -> Value {
    let mut v = sh(script);
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    v
}

/// Remove the socket directory a plugin announced at `addr`, for a test that killed
/// the plugin from a `Drop` (a killed plugin cannot remove it, and the runtime whose
/// `PluginProcess` would have seen the exit and removed it ends with the test). The
/// test launched the plugin, so the path is trusted here, unlike in a host.
pub fn remove_plugin_socket_dir(addr: &drover_plugin_sdk::handshake::PluginAddr) {
    if let drover_plugin_sdk::handshake::PluginAddr::Unix(sock) = addr
        && let Some(dir) = sock.parent()
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}
