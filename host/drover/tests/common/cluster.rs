//! Cluster helpers: a real `drover server` and real client agents on 127.0.0.1, driven
//! through the `drover` CLI exactly as a user does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{Agent, drover, nix_kill};

/// A free TCP port on 127.0.0.1 for a server to take, below the ephemeral range (see
/// [`drover_test_support::net::free_local_addr`]).
pub fn free_port() -> u16 {
    drover_test_support::net::free_local_addr().port()
}

/// A running `drover server`, killed when dropped.
pub struct ServerProc {
    pub child: Option<Child>,
    pub data_dir: PathBuf,
    pub http: u16,
    pub rpc: u16,
    pub log: PathBuf,
    pub extra: Vec<String>,
    pub token: Option<String>,
}

impl ServerProc {
    /// Start a server on fresh ports with its data under `root/server`, heartbeat TTL
    /// and grace of `ttl` each.
    pub fn start(root: &Path, ttl: &str, extra: &[&str]) -> ServerProc {
        ServerProc::start_with_token(root, ttl, extra, None)
    }

    /// [`ServerProc::start`] for a server whose `--token-file` (in `extra`) holds
    /// `token`: the CLI sends it.
    pub fn start_with_token(
        root: &Path,
        ttl: &str,
        extra: &[&str],
        token: Option<&str>,
    ) -> ServerProc {
        let mut s = ServerProc {
            child: None,
            data_dir: root.join("server"),
            http: free_port(),
            rpc: free_port(),
            log: root.join("server.log"),
            extra: ["--heartbeat-ttl", ttl, "--heartbeat-grace", ttl]
                .iter()
                .chain(extra)
                .map(|s| s.to_string())
                .collect(),
            token: token.map(str::to_owned),
        };
        s.spawn();
        s
    }

    /// Start (again) on the same dirs and ports.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(drover())
            .arg("server")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", self.http))
            .arg("--rpc-addr")
            .arg(format!("127.0.0.1:{}", self.rpc))
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start drover server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.cli(&["node", "status", "--json"]);
            if out.status.success() {
                break;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("drover server exited ({status}); log:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "drover server never answered; last: {}\nlog:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `--servers` value for agents.
    pub fn rpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.rpc)
    }

    /// `DROVER_ADDR` for the CLI.
    pub fn http_addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9` the server.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Run the CLI against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(drover());
        cmd.args(args).env("DROVER_ADDR", self.http_addr());
        match &self.token {
            Some(t) => cmd.env("DROVER_TOKEN", t),
            None => cmd.env_remove("DROVER_TOKEN"),
        };
        cmd.output().expect("run drover cli")
    }

    /// Run the CLI, expect success, parse stdout as JSON.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "drover {args:?} failed: {}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
            tail(&self.log_text())
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "drover {args:?} printed non-JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Poll `node status` until the node named `name` has `status`, or panic after
    /// `within` saying `what`.
    pub fn wait_node_status(&self, name: &str, status: &str, within: Duration, what: &str) {
        self.wait_json(&["node", "status", "--json"], within, what, |v| {
            v.as_array()
                .is_some_and(|n| n.iter().any(|n| n["name"] == name && n["status"] == status))
        });
    }

    /// Poll `what` (a CLI JSON answer) until `done` holds, or panic after `within`.
    pub fn wait_json(
        &self,
        args: &[&str],
        within: Duration,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let out = self.cli(args);
            if out.status.success() {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
                    if done(&v) {
                        return v;
                    }
                    if Instant::now() >= deadline {
                        panic!(
                            "{what}: not within {within:?}; last {args:?}:\n{v:#}\nserver log:\n{}",
                            tail(&self.log_text())
                        );
                    }
                }
            } else if Instant::now() >= deadline {
                panic!(
                    "{what}: not within {within:?}; {args:?} failed: {}\nserver log:\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    tail(&self.log_text())
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = nix_kill(c.id(), 15);
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The last 60 lines of a log.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A client agent of `server` named `name`, on fresh dirs under `root/name`.
pub fn client_agent(root: &Path, server: &ServerProc, name: &str, extra: &[&str]) -> Agent {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("plugins")).unwrap();
    let rpc = server.rpc_addr();
    let mut args = vec!["--servers", rpc.as_str(), "--node-name", name];
    args.extend_from_slice(extra);
    Agent::start(&dir, &dir.join("plugins"), &args)
}

/// Write a job file under `dir` and return its path.
pub fn job_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Allocations of `job status --json` whose client status is `status`.
pub fn allocs_with<'a>(
    status: &'a serde_json::Value,
    client_status: &str,
) -> Vec<&'a serde_json::Value> {
    status["allocations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["client_status"] == client_status && a["desired_status"] == "run")
        .collect()
}

/// Pids of live processes whose command line is exactly `argv`.
pub fn pids_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want) {
            pids.push(pid);
        }
    }
    pids.sort();
    pids
}

/// Pids of live processes whose environment mentions `dir` (the tasks of an agent's
/// allocations carry `DROVER_ALLOC_DIR=<data_dir>/alloc/...`).
pub fn pids_with_env_mentioning(dir: &Path) -> Vec<u32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.windows(needle.len()).any(|w| w == needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Kill every process whose command line is exactly `argv` (test clean-up).
pub fn kill_running(argv: &[&str]) {
    for pid in pids_running(argv) {
        let _ = nix_kill(pid, 9);
    }
}

/// Poll `job status JOB --json` on `agent` (a dev agent) until `done` holds for it, or
/// panic after 60 s with the last status and the agent's log tail.
pub fn wait_job(
    agent: &Agent,
    job: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = agent.cli_json(&["job", "status", job, "--json"]);
        if done(&v) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 60s; last:\n{v:#}\nagent log:\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until `agent` (a dev agent, server and client in one) lists its one node
/// `ready` with every one of `drivers` healthy: plugins being healthy is not yet a node
/// the server can place on (the client registers once it has recovered its tasks).
pub fn wait_dev_node_ready(agent: &Agent, drivers: &[&str], limit: Duration) {
    drover_test_support::until_blocking(
        limit,
        Duration::from_millis(100),
        &format!("the dev node ready with {} healthy", drivers.join(" and ")),
        || {
            let out = agent.cli(&["node", "status", "--json"]);
            let nodes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            out.status.success()
                && nodes.as_array().is_some_and(|n| {
                    n.len() == 1
                        && n[0]["status"] == "ready"
                        && drivers
                            .iter()
                            .all(|d| n[0]["drivers"][*d]["healthy"] == true)
                })
        },
    );
}

/// A dev agent (server and client in one) whose server answers Nomad's API on
/// 127.0.0.1, ready with raw_exec; the API client with the agent's dev token.
pub fn dev_agent_with_api(root: &Path) -> (Agent, super::nomad_http::NomadApi) {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(root, &plugins, &["--dev", "--dev-http-addr", &addr]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    let token_file = agent.data_dir.join("server/dev-token");
    let token = std::fs::read_to_string(&token_file)
        .unwrap_or_else(|e| panic!("the dev token {}: {e}", token_file.display()));
    (
        agent,
        super::nomad_http::NomadApi::new(port).with_token(token.trim()),
    )
}

/// python3, or `None` after saying loudly why the test cannot run (a failure under
/// `CI=true`).
pub fn python3() -> Option<String> {
    let found = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("python3".into());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "python3 is missing (CI=true: the tests that serve HTTP with it must run)"
    );
    eprintln!("SKIPPED: python3 is missing; a test that serves HTTP with it did not run");
    None
}
