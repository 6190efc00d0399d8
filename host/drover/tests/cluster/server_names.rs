//! A server's name is its own among the live servers of a cluster (`drover server
//! --name`, by default the host name, so that servers started on one host without
//! `--name` share one): of servers started at once with one name on one etcd, one
//! runs and the others refuse to start, saying which server holds the name and what
//! to do; the same server restarted at the same addresses before its registration
//! expired starts again.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::free_port;
use common::drover;

/// One `drover server --store etcd` of this test, its stderr in `dir/server.log`.
struct Twin {
    child: Child,
    http: u16,
    rpc: u16,
    log: std::path::PathBuf,
}

impl Twin {
    fn start(dir: &Path, endpoint: &str, prefix: &str, http: u16, rpc: u16) -> Twin {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join("server.log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(drover())
            .arg("server")
            .args(["--store", "etcd", "--etcd-endpoints", endpoint])
            .args(["--etcd-prefix", prefix, "--name", "twin"])
            .args(["--leader-lease-ttl", "3s"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--rpc-addr", &format!("127.0.0.1:{rpc}")])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start drover server");
        Twin {
            child,
            http,
            rpc,
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `drover server status --json` answered by this server.
    fn status(&self) -> Result<serde_json::Value, String> {
        let out = Command::new(drover())
            .args(["server", "status", "--json"])
            .env("DROVER_ADDR", format!("http://127.0.0.1:{}", self.http))
            .env_remove("DROVER_TOKEN")
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn servers_started_at_once_with_one_name_one_runs_the_others_say_who_holds_it() {
    let Some(etcd) = drover_test_support::etcd::shared() else {
        return;
    };
    let endpoint = etcd.endpoint();
    let prefix = etcd.unique_prefix();
    let root = tempfile::tempdir().unwrap();
    let mut twins: Vec<Twin> = (0..3)
        .map(|i| {
            Twin::start(
                &root.path().join(format!("s{i}")),
                &endpoint,
                &prefix,
                free_port(),
                free_port(),
            )
        })
        .collect();

    // Two of the three exit; the one left answers. Each start takes well under a
    // second here; 30 s leaves room for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (runner, refused) = loop {
        let mut exited = Vec::new();
        for (i, t) in twins.iter_mut().enumerate() {
            if let Some(status) = t.child.try_wait().unwrap() {
                exited.push((i, status));
            }
        }
        if exited.len() == 2 {
            let runner = (0..3).find(|i| exited.iter().all(|(e, _)| e != i)).unwrap();
            if twins[runner].status().is_ok() {
                break (runner, exited);
            }
        }
        assert!(
            exited.len() < 3,
            "all three servers exited:\n{}",
            twins
                .iter()
                .map(Twin::log_text)
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        assert!(
            Instant::now() < deadline,
            "not exactly one server of the name running after 30 s (exited: {exited:?}):\n{}",
            twins
                .iter()
                .map(Twin::log_text)
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let (http, rpc) = (twins[runner].http, twins[runner].rpc);
    for (i, status) in &refused {
        assert!(
            !status.success(),
            "a refused server exits non-zero: {status}"
        );
        let log = twins[*i].log_text();
        let said = format!(
            "drover: --name twin: a live server already registered this name (rpc \
             127.0.0.1:{rpc}, http 127.0.0.1:{http}); give each server its own name"
        );
        assert!(log.contains(&said), "expected {said:?} in:\n{log}");
    }
    let status = twins[runner].status().unwrap();
    let servers = status["servers"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        servers.len(),
        1,
        "one server registered under the name: {status}"
    );
    assert_eq!(
        servers[0]["rpc_addr"],
        format!("127.0.0.1:{rpc}"),
        "the registered one is the one running: {status}"
    );

    // The runner killed and started again at the same addresses while its old
    // registration (lease TTL 3 s) is still there: it is this server, and it starts.
    let dir = root.path().join(format!("s{runner}"));
    let _ = twins[runner].child.kill();
    let _ = twins[runner].child.wait();
    let mut again = Twin::start(&dir, &endpoint, &prefix, http, rpc);
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = again.status() {
        if let Some(status) = again.child.try_wait().unwrap() {
            panic!(
                "the restarted server exited ({status}):\n{}",
                again.log_text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the restarted server never answered: {e}\n{}",
            again.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !again.log_text().contains("already registered this name"),
        "the restarted server took its own name over:\n{}",
        again.log_text()
    );
}
