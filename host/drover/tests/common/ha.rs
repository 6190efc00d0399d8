//! Several `drover server`s on one etcd, with client agents that know all of them: the
//! cluster of `tests/cluster/cluster_ha.rs`, as real processes on 127.0.0.1, driven through the
//! `drover` CLI as a user drives it.
//!
//! Every process started here is ended by pid: the servers and the agents when the
//! cluster is dropped (also when a test panics, after the logs' tails were printed),
//! etcd by its harness. [`HaCluster::shutdown`] ends everything and checks that no
//! process of the cluster is left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use drover_test_support::etcd::Etcd;
use drover_test_support::procs;
use serde_json::Value;

use super::cluster::free_port;
use super::{Agent, drover, nix_kill};

/// The lease TTL of every server: a leader that stops renewing leads at most this long.
pub const LEASE_TTL: Duration = Duration::from_secs(3);

/// How often the cluster is looked at while waiting for something.
const POLL: Duration = Duration::from_millis(100);

/// One `drover server` of the cluster.
pub struct HaServer {
    /// `s1`, `s2`, ...: its `--name`.
    pub name: String,
    /// The process; `None` once killed.
    pub child: Option<Child>,
    /// Stopped with SIGSTOP (and not continued yet): nothing can be asked of it.
    pub paused: bool,
    /// Its `--data-dir`.
    pub data_dir: PathBuf,
    /// HTTP port.
    pub http: u16,
    /// RPC port.
    pub rpc: u16,
    /// Its log (stderr).
    pub log: PathBuf,
    /// Every argument after `server`.
    pub args: Vec<String>,
    /// Marks its environment, to find it in /proc.
    pub marker: String,
}

impl HaServer {
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("server log");
        let child = Command::new(drover())
            .arg("server")
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env("DROVER_TEST_MARKER", &self.marker)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start drover server");
        self.child = Some(child);
        self.paused = false;
    }

    /// Start it again (after [`HaServer::kill9`]) with the same name, dirs and ports,
    /// and wait until it answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} still runs", self.name);
        self.spawn();
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Err(e) = self.status() {
            if self.is_dead() {
                panic!(
                    "{} exited at its restart:\n{}",
                    self.name,
                    tail(&self.log_text(), 40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} never answered again: {e}",
                self.name
            );
            std::thread::sleep(POLL);
        }
    }

    /// Its pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Killed (and reaped)?
    pub fn is_dead(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => c.try_wait().ok().flatten().is_some(),
        }
    }

    /// `http://127.0.0.1:PORT`, for `DROVER_ADDR`.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// `127.0.0.1:PORT`, for an agent's `--servers`.
    pub fn rpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.rpc)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9`: returns when the process is gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix_kill(c.id(), 9);
            let _ = c.wait();
        }
        self.paused = false;
    }

    /// SIGSTOP: the process stays, frozen; the kernel still queues connections to it.
    pub fn pause(&mut self) {
        let pid = self.pid().expect("a running server to pause");
        nix_kill(pid, 19).expect("SIGSTOP");
        // The signal is delivered asynchronously: wait until the kernel says stopped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while procs::stat(pid).is_none_or(|s| s.state != 'T') {
            assert!(Instant::now() < deadline, "{} never stopped", self.name);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.paused = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        let pid = self.pid().expect("a paused server to resume");
        nix_kill(pid, 18).expect("SIGCONT");
        self.paused = false;
    }

    /// Run the CLI against this server (its HTTP API), at most `limit`: a CLI still
    /// running then is killed and the answer is an error saying so.
    pub fn cli_within(&self, args: &[&str], limit: Duration) -> Result<Output, String> {
        cli_within(&self.http_url(), args, limit)
    }

    /// Run the CLI against this server; a call may take up to 60 s.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_within(args, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `drover server status --json` of this server, or why there is none.
    pub fn status(&self) -> Result<Value, String> {
        let out = self.cli_within(&["server", "status", "--json"], Duration::from_secs(10))?;
        json_of(&out, &["server", "status", "--json"])
    }

    /// Run the CLI and parse its JSON, or say why not.
    pub fn json(&self, args: &[&str]) -> Result<Value, String> {
        json_of(&self.cli_within(args, Duration::from_secs(30))?, args)
    }
}

impl Drop for HaServer {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // A stopped process does not act on SIGTERM until continued.
        let _ = nix_kill(c.id(), 18);
        let _ = nix_kill(c.id(), 15);
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix_kill(c.id(), 9);
        let _ = c.wait();
    }
}

/// Run the CLI against `address` for at most `limit` (then it is killed by pid).
pub fn cli_within(address: &str, args: &[&str], limit: Duration) -> Result<Output, String> {
    let child = Command::new(drover())
        .args(args)
        .env("DROVER_ADDR", address)
        .env_remove("DROVER_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run drover cli");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => Ok(out.expect("wait for drover cli")),
        Err(_) => {
            let _ = nix_kill(pid, 9);
            let out = rx.recv().ok().and_then(Result::ok);
            Err(format!(
                "drover {args:?} at {address}: no answer within {limit:?}{}",
                out.map(|o| format!("; stderr: {}", text(&o.stderr)))
                    .unwrap_or_default()
            ))
        }
    }
}

/// The JSON a CLI call printed, or why it did not.
pub fn json_of(out: &Output, args: &[&str]) -> Result<Value, String> {
    if !out.status.success() {
        return Err(format!(
            "drover {args:?} failed ({}): {}{}",
            out.status,
            text(&out.stderr).trim(),
            text(&out.stdout).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "drover {args:?} printed non-JSON ({e}): {}",
            text(&out.stdout)
        )
    })
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A task process of an allocation, as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaskProc {
    /// `DROVER_ALLOC_ID` in its environment.
    pub alloc_id: String,
    pub pid: u32,
    /// Start time (clock ticks since boot): with the pid, one process for good.
    pub start_time: u64,
    /// The agent (node name) whose allocation directory its environment names.
    pub node: String,
}

/// Three (or N) servers on an etcd of their own and M client agents given every server.
pub struct HaCluster {
    /// Everything lives under it (deleted last).
    pub root: tempfile::TempDir,
    /// The etcd, started by the harness: tests kill and restart it (`None` only
    /// once [`HaCluster::shutdown`] ended it).
    pub etcd: Option<Etcd>,
    /// `s1`, `s2`, ... in that order.
    pub servers: Vec<HaServer>,
    /// `n1`, `n2`, ... in that order; they destroy their tasks when dropped.
    pub agents: Vec<Agent>,
    /// Key prefix of this cluster in etcd.
    pub prefix: String,
}

impl HaCluster {
    /// Start etcd, `servers` servers (names `s1..`, lease TTL [`LEASE_TTL`], node
    /// heartbeat TTL and grace `heartbeat`), wait until one leads, then `agents` client
    /// agents (names `n1..`, `--servers` every server, n1 the leader first, n2 the next
    /// server first, ...) and wait until their
    /// nodes are ready with rawexec healthy. `None` when there is no etcd here (the
    /// harness said why, loudly; under `CI=true` it fails instead).
    pub fn start(servers: usize, agents: usize, heartbeat: &str) -> Option<HaCluster> {
        let etcd = Etcd::start()?;
        let root = tempfile::tempdir().expect("temp dir");
        let endpoint = etcd.endpoint().to_string();
        let prefix = format!("/drover-e2e-{}/", std::process::id());
        let mut cluster = HaCluster {
            root,
            etcd: Some(etcd),
            servers: Vec::new(),
            agents: Vec::new(),
            prefix,
        };
        let lease = format!("{}s", LEASE_TTL.as_secs());
        // One keyring KEK for every server (as an operator gives them): each unwraps
        // the root keys the others made.
        let kek = cluster.root.path().join("keyring-kek");
        drover_server::keyring::Keyring::open(&kek, true).expect("the KEK file");
        for i in 1..=servers {
            let name = format!("s{i}");
            let dir = cluster.root.path().join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            let http = free_port();
            let rpc = free_port();
            let args: Vec<String> = [
                "--store",
                "etcd",
                "--etcd-endpoints",
                &endpoint,
                "--etcd-prefix",
                &cluster.prefix,
                "--name",
                &name,
                "--leader-lease-ttl",
                &lease,
                "--data-dir",
                dir.join("data").to_str().unwrap(),
                "--http-addr",
                &format!("127.0.0.1:{http}"),
                "--rpc-addr",
                &format!("127.0.0.1:{rpc}"),
                "--heartbeat-ttl",
                heartbeat,
                "--heartbeat-grace",
                heartbeat,
                "--keyring-kek-file",
                kek.to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut server = HaServer {
                marker: format!("drover-ha-{}-{name}-{http}", std::process::id()),
                name,
                child: None,
                paused: false,
                data_dir: dir.join("data"),
                http,
                rpc,
                log: dir.join("server.log"),
                args,
            };
            server.spawn();
            cluster.servers.push(server);
        }
        for i in 0..servers {
            cluster.poll(Duration::from_secs(20), "the server answers", || {
                let s = &cluster.servers[i];
                if s.pid().is_none_or(|p| !procs::alive(p)) {
                    panic!("server {} exited at start", s.name);
                }
                s.status().map(|_| ())
            });
        }
        let (leader, _) = cluster.wait_leader(Duration::from_secs(20), None);
        for i in 1..=agents {
            // Every agent knows every server; agent n1 tries the leader first, n2 the
            // next server, ...: a leader that dies takes a client session with it, a
            // follower that dies another.
            let addrs: Vec<String> = (0..servers)
                .map(|k| cluster.servers[(leader + i - 1 + k) % servers].rpc_addr())
                .collect();
            let addrs = addrs.join(",");
            let name = format!("n{i}");
            let dir = cluster.root.path().join(&name);
            std::fs::create_dir_all(dir.join("plugins")).unwrap();
            let mut agent = Agent::start(
                &dir,
                &dir.join("plugins"),
                &["--servers", &addrs, "--node-name", &name],
            );
            agent.end_tasks = true;
            cluster.agents.push(agent);
        }
        cluster.wait_nodes_ready(Duration::from_secs(30));
        Some(cluster)
    }

    /// The cluster's etcd.
    pub fn etcd(&mut self) -> &mut Etcd {
        self.etcd.as_mut().expect("etcd runs until shutdown")
    }

    /// Wait until every agent's node is `ready` with rawexec healthy, as the leader
    /// says.
    pub fn wait_nodes_ready(&self, within: Duration) -> Value {
        let n = self.agents.len();
        self.poll(within, "every node ready with rawexec healthy", || {
            let leader = self.leader_index()?;
            let nodes = self.servers[leader].json(&["node", "status", "--json"])?;
            let ready = nodes
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["status"] == "ready" && n["drivers"]["raw_exec"]["healthy"] == true)
                .count();
            if ready == n {
                Ok(nodes)
            } else {
                Err(format!("{ready} of {n} ready: {nodes:#}"))
            }
        })
    }

    /// Poll `look` every 100 ms until it gives `Ok`, or fail the test after `within`
    /// with `what` and its last answer (the logs' tails follow from the drop).
    pub fn poll<T>(
        &self,
        within: Duration,
        what: &str,
        mut look: impl FnMut() -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            match look() {
                Ok(v) => return v,
                Err(last) => {
                    if Instant::now() >= deadline {
                        panic!("{what}: not within {within:?}; last: {last}");
                    }
                }
            }
            std::thread::sleep(POLL);
        }
    }

    /// Index of the server that leads now: a live server names it as leader and it
    /// names itself. Servers paused or killed are not asked.
    pub fn leader_index(&self) -> Result<usize, String> {
        self.leader_except(None).map(|(i, _)| i)
    }

    /// The leader (index, term) if it is not `not`, confirmed by itself and by every
    /// other live server. The term is the one the leader itself reports (a follower
    /// that could not ask the leader reports 0).
    pub fn leader_except(&self, not: Option<&str>) -> Result<(usize, u64), String> {
        let mut claimed: Option<String> = None;
        let mut views = Vec::new();
        let mut terms = BTreeMap::new();
        for s in self.live() {
            let status = s.status()?;
            let name = status["leader"]["name"].as_str().map(str::to_owned);
            views.push(format!("{} says {:?}", s.name, name));
            if status["this"] != s.name.as_str() {
                return Err(format!("{} calls itself {}", s.name, status["this"]));
            }
            terms.insert(s.name.clone(), status["leader"]["term"].as_u64());
            match (&claimed, name) {
                (_, None) => return Err(format!("no leader yet: {}", views.join(", "))),
                (None, Some(n)) => claimed = Some(n),
                (Some(c), Some(n)) if *c != n => {
                    return Err(format!("servers disagree: {}", views.join(", ")));
                }
                _ => {}
            }
        }
        let name = claimed.ok_or("no live server")?;
        if not == Some(name.as_str()) {
            return Err(format!("still the old leader: {}", views.join(", ")));
        }
        let i = self
            .servers
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| format!("unknown leader {name:?}"))?;
        let Some(Some(term)) = terms.get(&name) else {
            return Err(format!(
                "{name} is named leader but is not running: {}",
                views.join(", ")
            ));
        };
        // The store names a server leader as soon as it won the election; it leads
        // (commits, and reports its term) once it has loaded the state. Until then its
        // own status says term 0: not a leader a user can write to yet.
        if *term == 0 {
            return Err(format!(
                "{name} won the election and is still taking over: {}",
                views.join(", ")
            ));
        }
        Ok((i, *term))
    }

    /// Wait until a leader other than `not` leads; its index and term.
    pub fn wait_leader(&self, within: Duration, not: Option<&str>) -> (usize, u64) {
        self.poll(within, "a leader every live server agrees on", || {
            self.leader_except(not)
        })
    }

    /// Servers neither killed nor paused.
    pub fn live(&self) -> impl Iterator<Item = &HaServer> {
        self.servers
            .iter()
            .filter(|s| s.child.is_some() && !s.paused)
    }

    /// Some live server other than `i`.
    pub fn follower_of(&self, i: usize) -> usize {
        (0..self.servers.len())
            .find(|&j| j != i && self.servers[j].child.is_some() && !self.servers[j].paused)
            .expect("a live follower")
    }

    /// `job status NAME --json` from the leader.
    pub fn job(&self, name: &str) -> Result<Value, String> {
        let leader = self.leader_index()?;
        self.servers[leader].json(&["job", "status", name, "--json"])
    }

    /// Task processes running `argv` on the agents, by allocation id.
    pub fn task_procs(&self, argv: &[String]) -> BTreeMap<String, TaskProc> {
        let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
        let mut found = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if std::fs::read(format!("/proc/{pid}/cmdline")).ok().as_ref() != Some(&want) {
                continue;
            }
            let Some(info) = procs::stat(pid).filter(|s| s.state != 'Z' && s.state != 'X') else {
                continue;
            };
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let var = |name: &str| -> Option<String> {
                env.split(|b| *b == 0).find_map(|kv| {
                    kv.strip_prefix(name.as_bytes())
                        .and_then(|v| v.strip_prefix(b"="))
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
            };
            let alloc_id = var("DROVER_ALLOC_ID").unwrap_or_else(|| format!("pid-{pid}"));
            let dir = var("DROVER_ALLOC_DIR").unwrap_or_default();
            let node = self
                .agents
                .iter()
                .zip(1..)
                .find(|(a, _)| Path::new(&dir).starts_with(a.data_dir.join("alloc")))
                .map(|(_, i)| format!("n{i}"))
                .unwrap_or_else(|| format!("? ({dir})"));
            let previous = found.insert(
                alloc_id.clone(),
                TaskProc {
                    alloc_id: alloc_id.clone(),
                    pid,
                    start_time: info.start_time,
                    node,
                },
            );
            assert!(
                previous.is_none(),
                "two processes run allocation {alloc_id}: {previous:?} and {pid}"
            );
        }
        found
    }

    /// The tails of every log, for a failure's message.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for s in &self.servers {
            out += &format!(
                "\n===== server {} ({}) log tail =====\n{}\n",
                s.name,
                s.http_url(),
                tail(&s.log_text(), 80)
            );
        }
        for (a, i) in self.agents.iter().zip(1..) {
            out += &format!(
                "\n===== agent n{i} log tail =====\n{}\n",
                tail(&a.log_text(), 40)
            );
        }
        if let Some(etcd) = &self.etcd {
            out += &format!(
                "\n===== etcd log tail =====\n{}\n",
                tail(&etcd.log_text(), 40)
            );
        }
        out
    }

    /// End every process of the cluster (servers, agents with their plugins and
    /// tasks, etcd) and check that none is left.
    pub fn shutdown(mut self) {
        if std::env::var_os("DROVER_TEST_DUMP_LOGS").is_some() {
            eprintln!("{}", self.dump());
        }
        let mut pids: Vec<u32> = self.servers.iter().filter_map(HaServer::pid).collect();
        for a in &self.agents {
            pids.push(a.child.id());
            pids.extend(a.marked_pids());
            pids.extend(super::cluster::pids_with_env_mentioning(
                &a.data_dir.join("alloc"),
            ));
        }
        pids.extend(self.etcd.as_ref().and_then(Etcd::pid));
        let server_markers: Vec<String> = self.servers.iter().map(|s| s.marker.clone()).collect();
        self.agents.clear();
        self.servers.clear();
        drop(self.etcd.take());
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut left: Vec<u32> = pids.iter().copied().filter(|p| procs::alive(*p)).collect();
            left.extend(marked(&server_markers));
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "processes of the cluster left running: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Pids of live processes whose environment carries one of `markers`.
fn marked(markers: &[String]) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|kv| {
            markers
                .iter()
                .any(|m| kv == format!("DROVER_TEST_MARKER={m}").as_bytes())
        }) && procs::alive(pid)
        {
            pids.push(pid);
        }
    }
    pids
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        // `DROVER_TEST_DUMP_LOGS=1`: the tails also after a test that passed.
        if std::thread::panicking() || std::env::var_os("DROVER_TEST_DUMP_LOGS").is_some() {
            eprintln!("{}", self.dump());
        }
        // Agents first (they destroy their tasks through their own sockets), then the
        // servers; etcd (the harness) and the temp dir go with the fields.
        self.agents.clear();
        self.servers.clear();
    }
}

/// The last `n` lines of `log`.
pub fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
