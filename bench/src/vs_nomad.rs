//! `drover-bench vs-nomad`: the same workload on a Nomad 1.0.18 dev agent and on a
//! Drover dev agent, one after the other in one run, on 127.0.0.1 only.
//!
//! The workload is one job registered through each agent's Nomad HTTP API (`PUT
//! /v1/jobs`, the same JSON): one group of `--tasks` allocations, each one raw_exec
//! task `/bin/sleep 3600` with small resources (cpu 20, memory 10). One difference:
//! Nomad's copy says `EphemeralDisk.SizeMB = 10`, because Nomad reserves 300 MB of disk
//! per allocation by default (100 of them would not fit on most disks), while Drover
//! reserves no disk and refuses a size other than the default.
//!
//! Measured on each, with a fresh agent (private data dir under `$TMPDIR`, free ports)
//! per measurement, the job registered once the machine is quiet again (90 % idle for
//! 300 ms: the previous agent's teardown is not the next one's cost):
//! - time to running: from sending the registration to every allocation reported
//!   `running` by `GET /v1/job/:id/allocations`, a blocking query on the index of the
//!   last answer (each change is seen when the server records it);
//! - runtime memory: PSS (`/proc/PID/smaps_rollup`) summed over the agent and every
//!   process that belongs to it (its descendants, and any process whose command line or
//!   environment names the agent's private directory, in case one left the tree), the
//!   tasks themselves (the sleeps) apart; once idle with the node ready, once with every
//!   task running, each read when two readings 1 s apart are within 2 %. Runtime memory
//!   per task = (loaded - idle) / N. The tasks' own PSS is shown for reference.
//!
//! The ratios are Drover's over Nomad's; the acceptance targets (time <= 0.25x, memory
//! per task <= 0.1x) are printed as PASS or FAIL, which does not change the exit code.
//! `--rounds R` alternates the order (Nomad first in odd rounds) and reports medians.
//!
//! Whatever happens, every agent is stopped (SIGTERM, SIGKILL after a deadline), every
//! process that belonged to it killed by pid, Nomad's leftover mounts (the tmpfs of a
//! task's `secrets` dir, when run as root) unmounted and the directories removed: the
//! [`Agent`] guard does it on drop, and Ctrl-C ends the run through it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use crate::tasks::{
    all_pids, mib, proc_kib, raise_nofile_limit, start_agent_with, wait_machine_quiet,
    with_descendants,
};

/// Acceptance targets: Drover's time to running and memory per task, over Nomad's.
const TIME_TARGET: f64 = 0.25;
const MEMORY_TARGET: f64 = 0.1;

/// The job's ID on both agents.
const JOB_ID: &str = "vs-nomad";

/// The drivers both dev agents have built in, waited for in the node's fingerprint
/// (for 20 s at most) before the idle reading.
const BUILTIN_DRIVERS: [&str; 5] = ["docker", "exec", "java", "qemu", "raw_exec"];

/// Readings 1 s apart that must agree (same processes, PSS within 2 %) for memory to
/// count as settled: 6, i.e. 5 s, longer than a process that comes and goes at start
/// lives (Drover's qemu driver runs a trial guest after its first fingerprint, for up
/// to 3 s when KVM hangs).
const SETTLE_READINGS: usize = 6;

/// How often the allocations are polled while waiting for them to run, when a
/// blocking query cannot be made.
const POLL: Duration = Duration::from_millis(50);

pub(crate) struct Options {
    pub(crate) tasks: usize,
    pub(crate) rounds: usize,
    /// The Nomad agent; default: the test peers archive's, unpacked and checked.
    pub(crate) nomad: Option<PathBuf>,
    pub(crate) drover: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Nomad,
    Drover,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Nomad => "Nomad 1.0.18",
            Side::Drover => "Drover",
        }
    }
}

/// What one agent's measurement gave.
struct Measured {
    to_running: Duration,
    /// From the registration to every allocation listed (placed), and to the first
    /// one running, as the blocking queries see them.
    all_placed: Duration,
    first_running: Duration,
    idle: Memory,
    loaded: Memory,
}

/// One reading of an agent's processes.
#[derive(Default, Clone)]
struct Memory {
    /// PSS (KiB) of the agent and its processes, the tasks apart.
    runtime_kib: u64,
    /// How many processes that is.
    runtime_count: usize,
    /// PSS (KiB) of the tasks, and how many there are.
    tasks_kib: u64,
    tasks_count: usize,
    /// Per kind of process (the agent, "nomad logmon", "drover-executor", ...): how
    /// many, PSS KiB.
    kinds: BTreeMap<String, (usize, u64)>,
    /// The processes of `runtime_kib`.
    pids: BTreeSet<u32>,
    /// Whether the readings settled (see [`Agent::settled_memory`]) before the deadline.
    settled: bool,
}

pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    if opts.tasks == 0 || opts.rounds == 0 {
        bail!("--tasks and --rounds must be at least 1");
    }
    raise_nofile_limit();
    let nomad = match opts.nomad {
        Some(p) => p,
        None => drover_test_support::nomad::peers()
            .context(
                "the Nomad 1.0.18 agent is needed: ../shared/nomad/nomad-peers-v1.0.18.tar.xz \
                 (or DROVER_NOMAD_PEERS), unpacked and matching its SHA256SUMS (see the line \
                 above); or give the agent with --nomad PATH",
            )?
            .nomad(),
    };
    for (what, p) in [("Nomad agent", &nomad), ("drover binary", &opts.drover)] {
        if !p.is_file() {
            bail!("the {what} {} is not a file", p.display());
        }
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!("vs-nomad benchmark: `{command}`");
    println!("  Nomad   {}", nomad.display());
    println!("  Drover  {}", opts.drover.display());
    println!(
        "  workload: one job, one group of count = {} raw_exec tasks `/bin/sleep 3600` (cpu 20, \
         memory 10), registered with PUT /v1/jobs; {} round(s), order alternating",
        opts.tasks, opts.rounds
    );

    let mut results: Vec<(Side, Measured)> = Vec::new();
    let all = async {
        for round in 1..=opts.rounds {
            let order = if round % 2 == 1 {
                [Side::Nomad, Side::Drover]
            } else {
                [Side::Drover, Side::Nomad]
            };
            for side in order {
                // Both sides create and delete thousands of files: say what the
                // filesystem costs at the moment each one is measured.
                println!("round {round}, {}: {}", side.label(), crate::fs_note());
                let m = measure(side, &nomad, &opts.drover, opts.tasks).await?;
                print_one(round, side, &m, opts.tasks);
                results.push((side, m));
            }
        }
        anyhow::Ok(())
    };
    // Ctrl-C drops the run, and with it the agent guard, which cleans up.
    tokio::select! {
        r = all => r?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted; the agents were stopped"),
    }
    print_summary(&results, opts.tasks);
    Ok(())
}

/// Start a fresh agent of `side`, measure, stop it.
async fn measure(
    side: Side,
    nomad: &Path,
    drover: &Path,
    tasks: usize,
) -> anyhow::Result<Measured> {
    let mut agent = match side {
        Side::Nomad => Agent::start_nomad(nomad)?,
        Side::Drover => Agent::start_drover(drover).await?,
    };
    let measured = agent.measure(tasks).await;
    let stopped = agent.stop_job().await;
    agent.stop();
    let measured = measured.with_context(|| format!("measuring {}", side.label()))?;
    stopped.with_context(|| format!("stopping the job on {}", side.label()))?;
    Ok(measured)
}

/// Nomad's HTTP API of one agent on 127.0.0.1.
struct NomadHttp {
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    base: String,
    token: Option<String>,
}

impl NomadHttp {
    fn new(port: u16, token: Option<String>) -> NomadHttp {
        NomadHttp {
            client: hyper_util::client::legacy::Client::builder(
                hyper_util::rt::TokioExecutor::new(),
            )
            .build_http(),
            base: format!("http://127.0.0.1:{port}"),
            token,
        }
    }

    /// The answer's status and body; an error when there is no answer within 10 s.
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        self.call_indexed(method, path, body)
            .await
            .map(|(status, body, _)| (status, body))
    }

    /// As [`NomadHttp::call`], with the answer's `X-Nomad-Index` (the state index it
    /// was read at), if any.
    async fn call_indexed(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Vec<u8>, Option<u64>)> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(token) = &self.token {
            req = req.header("x-nomad-token", token);
        }
        let body = match body {
            Some(v) => bytes::Bytes::from(serde_json::to_vec(v)?),
            None => bytes::Bytes::new(),
        };
        let req = req.body(http_body_util::Full::new(body))?;
        let answer = async {
            let resp = self.client.request(req).await?;
            let status = resp.status().as_u16();
            let index = resp
                .headers()
                .get("x-nomad-index")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let body = resp.into_body().collect().await?.to_bytes().to_vec();
            anyhow::Ok((status, body, index))
        };
        tokio::time::timeout(Duration::from_secs(10), answer)
            .await
            .with_context(|| format!("no answer to {path} within 10 s"))?
            .with_context(|| format!("calling {}{path}", self.base))
    }

    /// GET `path`, a 200 answer's JSON.
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let (status, body) = self.call(http::Method::GET, path, None).await?;
        if status != 200 {
            bail!(
                "GET {path}: {status}: {}",
                String::from_utf8_lossy(&body).trim()
            );
        }
        serde_json::from_slice(&body).with_context(|| format!("GET {path}: not JSON"))
    }
}

/// An agent of this run, with its private directory. Dropping it stops the agent and
/// everything that belonged to it, unmounts what was left mounted there and removes the
/// directory.
struct Agent {
    side: Side,
    child: Child,
    api: NomadHttp,
    /// Every process seen belonging to the agent, with its start time (a pid alone may
    /// be another process's by the time it is killed).
    seen: BTreeMap<u32, u64>,
    /// Whether [`Agent::stop`] ran (the agent exiting on its own leaves its processes
    /// to clean up all the same).
    stopped: bool,
    /// Last, so that it is removed after the clean-up in `drop`.
    root: tempfile::TempDir,
}

impl Agent {
    fn start_nomad(nomad: &Path) -> anyhow::Result<Agent> {
        let root = private_root("nomad")?;
        let data = root.path().join("data");
        std::fs::create_dir(&data)?;
        let port = || drover_test_support::net::free_local_addr().port();
        let (http, rpc, serf) = (port(), port(), port());
        let config = drover_test_support::nomad::loopback_agent_hcl(
            &data,
            [http, rpc, serf],
            "plugin \"raw_exec\" { config { enabled = true } }\n",
        );
        let config_file = root.path().join("agent.hcl");
        std::fs::write(&config_file, config)?;
        let log = std::fs::File::create(root.path().join("agent.log"))?;
        let child = Command::new(nomad)
            .args(["agent", "-dev", "-config"])
            .arg(&config_file)
            // Its plugins' sockets in the private directory, not a shared /tmp.
            .env("TMPDIR", root.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", nomad.display()))?;
        Ok(Agent {
            side: Side::Nomad,
            child,
            api: NomadHttp::new(http, None),
            seen: BTreeMap::new(),
            stopped: false,
            root,
        })
    }

    async fn start_drover(drover: &Path) -> anyhow::Result<Agent> {
        let root = private_root("drover")?;
        std::fs::create_dir(root.path().join("plugins"))?;
        let started = start_agent_with(drover, root.path(), &[])?;
        let mut agent = Agent {
            side: Side::Drover,
            child: started.child,
            // Its port is known once it listens.
            api: NomadHttp::new(0, None),
            seen: BTreeMap::new(),
            stopped: false,
            root,
        };
        let token_file = agent.root.path().join("data/server/dev-token");
        let deadline = Instant::now() + Duration::from_secs(60);
        // The dev server's HTTP API is on a port the OS picked: the one of the agent's
        // listening sockets on 127.0.0.1 that answers Nomad's API.
        loop {
            agent.check_alive()?;
            if let Ok(token) = std::fs::read_to_string(&token_file) {
                for port in listening_ports(agent.child.id()) {
                    let api = NomadHttp::new(port, Some(token.trim().to_owned()));
                    if api.get("/v1/nodes").await.is_ok() {
                        agent.api = api;
                        return Ok(agent);
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the Drover agent's Nomad API did not answer within 60 s\n{}",
                    agent.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.root.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "{} agent log (last lines):\n{}",
            self.side.label(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!(
                "the {} agent exited: {status}\n{}",
                self.side.label(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Until the agent's one node is ready with raw_exec healthy and every built-in
    /// driver fingerprinted.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let all_drivers_deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.check_alive()?;
            let last = match self.node().await {
                Ok(node) => {
                    let raw_exec = &node["Drivers"]["raw_exec"];
                    // Every built-in driver fingerprinted once: the node as its user
                    // sees it once started.
                    let fingerprinted = BUILTIN_DRIVERS
                        .iter()
                        .all(|d| node["Drivers"][d].is_object());
                    if node["Status"] == "ready"
                        && raw_exec["Detected"] == true
                        && raw_exec["Healthy"] == true
                        && (fingerprinted || Instant::now() > all_drivers_deadline)
                    {
                        return Ok(());
                    }
                    format!("status {}, raw_exec {raw_exec}", node["Status"])
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "the {} node was not ready with raw_exec healthy within 60 s (last: {last})\n{}",
                    self.side.label(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn node(&self) -> anyhow::Result<Value> {
        let nodes = self.api.get("/v1/nodes").await?;
        let id = nodes[0]["ID"].as_str().context("no node yet")?;
        self.api.get(&format!("/v1/node/{id}")).await
    }

    /// The job, as this agent takes it.
    fn job(&self, tasks: usize) -> Value {
        let mut group = json!({
            "Name": "sleepers",
            "Count": tasks,
            "Tasks": [{
                "Name": "sleep",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": ["3600"]},
                "Resources": {"CPU": 20, "MemoryMB": 10},
                "LogConfig": {"MaxFiles": 1, "MaxFileSizeMB": 1}
            }]
        });
        if self.side == Side::Nomad {
            // Nomad reserves 300 MB of disk per allocation unless told otherwise.
            group["EphemeralDisk"] = json!({"SizeMB": 10});
        }
        json!({"Job": {
            "ID": JOB_ID,
            "Name": JOB_ID,
            "Type": "service",
            "Datacenters": ["dc1"],
            "TaskGroups": [group]
        }})
    }

    async fn measure(&mut self, tasks: usize) -> anyhow::Result<Measured> {
        self.wait_ready().await?;
        let idle = self.settled_memory().await;
        self.check_alive()?;

        // Whatever the machine still does for the previous agent (its tasks' cgroups
        // and directories being removed, pages written back) slows whichever side
        // comes next: both start on a quiet machine.
        wait_machine_quiet(Duration::from_secs(30)).await;
        let job = self.job(tasks);
        let t = Instant::now();
        let (status, body) = self
            .api
            .call(http::Method::PUT, "/v1/jobs", Some(&job))
            .await?;
        if status != 200 {
            bail!(
                "registering the job: {status}: {}",
                String::from_utf8_lossy(&body).trim()
            );
        }
        let deadline = Duration::from_secs(300);
        let mut counts = BTreeMap::new();
        let (mut all_placed, mut first_running) = (None, None);
        // A blocking query (both agents answer one): it returns as soon as the state
        // changes past `index`, so each moment is seen when the server records it, not
        // up to a polling step later (50 ms was a sixth of Drover's whole time).
        let mut index: Option<u64> = None;
        loop {
            let path = match index {
                Some(i) => format!("/v1/job/{JOB_ID}/allocations?index={i}&wait=5s"),
                None => format!("/v1/job/{JOB_ID}/allocations"),
            };
            let answer = self
                .api
                .call_indexed(http::Method::GET, &path, None)
                .await
                .ok()
                .filter(|(status, _, _)| *status == 200);
            let blocked = answer.as_ref().is_some_and(|(_, _, i)| i.is_some());
            index = answer.as_ref().and_then(|(_, _, i)| *i);
            let allocs =
                answer.and_then(|(_, body, _)| serde_json::from_slice::<Value>(&body).ok());
            if let Some(allocs) = allocs {
                counts.clear();
                for a in allocs.as_array().into_iter().flatten() {
                    let status = a["ClientStatus"].as_str().unwrap_or("?").to_owned();
                    *counts.entry(status).or_insert(0usize) += 1;
                }
                if all_placed.is_none() && counts.values().sum::<usize>() >= tasks {
                    all_placed = Some(t.elapsed());
                }
                if first_running.is_none() && counts.contains_key("running") {
                    first_running = Some(t.elapsed());
                }
                if counts.get("running") == Some(&tasks) {
                    break;
                }
                if let Some(failed) = counts.get("failed") {
                    bail!(
                        "{failed} allocation(s) failed; allocations by client status: {counts:?}\n{}",
                        self.log_tail()
                    );
                }
            }
            if t.elapsed() > deadline {
                bail!(
                    "the {tasks} allocations were not all running within {deadline:?}; by client \
                     status: {counts:?}\n{}",
                    self.log_tail()
                );
            }
            self.check_alive()?;
            if !blocked {
                // No index to block on (an error, or an answer without one): poll.
                tokio::time::sleep(POLL).await;
            }
        }
        let to_running = t.elapsed();

        let loaded = self.settled_memory().await;
        // Its processes outlive it: a reading after its death would still look right.
        self.check_alive()?;
        if loaded.tasks_count != tasks {
            bail!(
                "{} allocations are running, but {} `/bin/sleep 3600` task processes were found \
                 among the agent's",
                tasks,
                loaded.tasks_count
            );
        }
        Ok(Measured {
            to_running,
            all_placed: all_placed.unwrap_or(to_running),
            first_running: first_running.unwrap_or(to_running),
            idle,
            loaded,
        })
    }

    /// Read memory every second until [`SETTLE_READINGS`] readings in a row see the
    /// same processes with runtime PSS within 2 % of each other (90 s at most).
    async fn settled_memory(&mut self) -> Memory {
        let mut window: Vec<Memory> = vec![self.memory()];
        for _ in 0..90 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            window.push(self.memory());
            if window.len() > SETTLE_READINGS {
                window.remove(0);
            }
            let kib = window.iter().map(|m| m.runtime_kib as f64);
            let (low, high) = kib.fold((f64::MAX, 0.0f64), |(l, h), k| (l.min(k), h.max(k)));
            let same = window
                .iter()
                .all(|m| m.pids == window[0].pids && m.tasks_count == window[0].tasks_count);
            if window.len() == SETTLE_READINGS && same && high - low <= 0.02 * high {
                let last = window.pop().unwrap_or_default();
                return Memory {
                    settled: true,
                    ..last
                };
            }
        }
        window.pop().unwrap_or_default()
    }

    /// One reading of the agent's processes (remembering them for the clean-up).
    fn memory(&mut self) -> Memory {
        let mut m = Memory::default();
        for pid in belonging(self.pid(), self.root.path()) {
            let Some(cmdline) = cmdline(pid) else {
                continue;
            };
            let Some(start) = drover_test_support::procs::start_time(pid) else {
                continue;
            };
            self.seen.insert(pid, start);
            // A process gone since the listing costs nothing.
            let Some(pss) = proc_kib(pid, "smaps_rollup", "Pss:") else {
                continue;
            };
            if cmdline == ["/bin/sleep", "3600"] {
                m.tasks_kib += pss;
                m.tasks_count += 1;
                continue;
            }
            m.runtime_kib += pss;
            m.runtime_count += 1;
            m.pids.insert(pid);
            let kind = if pid == self.pid() {
                "the agent".to_owned()
            } else {
                kind(&cmdline)
            };
            let k = m.kinds.entry(kind).or_default();
            k.0 += 1;
            k.1 += pss;
        }
        m
    }

    /// Stop the job (purged) and wait until its tasks are gone.
    async fn stop_job(&mut self) -> anyhow::Result<()> {
        let (status, body) = self
            .api
            .call(
                http::Method::DELETE,
                &format!("/v1/job/{JOB_ID}?purge=true"),
                None,
            )
            .await?;
        if status != 200 && status != 404 {
            bail!(
                "DELETE /v1/job/{JOB_ID}: {status}: {}",
                String::from_utf8_lossy(&body).trim()
            );
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = self.memory().tasks_count;
            if left == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{left} task(s) still running 60 s after the job was stopped");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, SIGKILL after 30 s; then kill whatever of it is left, by pid, and
    /// unmount what is left mounted in its directory.
    fn stop(&mut self) {
        self.stopped = true;
        // What belongs to it now, before its processes are re-parented.
        let _ = self.memory();
        signal(self.pid(), rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its processes that outlived it: the ones seen, if still the same process, and
        // any naming its directory.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut left: BTreeSet<u32> = self
                .seen
                .iter()
                .filter(|(pid, start)| {
                    drover_test_support::procs::alive(**pid)
                        && drover_test_support::procs::start_time(**pid) == Some(**start)
                })
                .map(|(pid, _)| *pid)
                .collect();
            left.extend(mentioning(self.root.path()));
            left.remove(&std::process::id());
            if left.is_empty() || Instant::now() > deadline {
                if !left.is_empty() {
                    eprintln!(
                        "warning: {} process(es) of the {} agent outlived it and SIGKILL: {left:?}",
                        left.len(),
                        self.side.label()
                    );
                }
                break;
            }
            for pid in left {
                signal(pid, rustix::process::Signal::KILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unmount_under(self.root.path());
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if !self.stopped {
            self.stop();
        }
    }
}

/// A private (0700) directory for one agent.
fn private_root(what: &str) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("drover-bench-vs-nomad-{what}-"))
        .tempdir()
        .context("making the agent's directory")
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// `/proc/<pid>/cmdline` split at its NULs (a program that rewrote its title into one
/// string is split at spaces instead).
fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if args.len() == 1 && args[0].contains(' ') {
        args = args[0].split_whitespace().map(str::to_owned).collect();
    }
    Some(args)
}

/// A short name for what a process is: its program's file name and its leading
/// subcommand words ("nomad logmon", "drover plugin serve raw_exec", "drover-executor").
fn kind(cmdline: &[String]) -> String {
    let Some(first) = cmdline.first() else {
        return "?".into();
    };
    let program = Path::new(first)
        .file_name()
        .map_or_else(|| first.clone(), |n| n.to_string_lossy().into_owned());
    let mut out = program.trim_end_matches(':').to_owned();
    for word in cmdline.iter().skip(1).take(3) {
        let is_word = !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '-');
        if !is_word {
            break;
        }
        out.push(' ');
        out.push_str(word);
    }
    out
}

/// The agent `agent` and the processes that belong to it: its descendants, and any
/// process whose command line or environment names `root` (one that left its tree),
/// with their descendants.
fn belonging(agent: u32, root: &Path) -> BTreeSet<u32> {
    let mut roots: BTreeSet<u32> = [agent].into();
    roots.extend(mentioning(root));
    roots.remove(&std::process::id());
    let mut out = with_descendants(roots);
    out.retain(|p| drover_test_support::procs::alive(*p));
    out
}

/// Processes whose command line or environment names `root`.
fn mentioning(root: &Path) -> BTreeSet<u32> {
    let needle = root.as_os_str().as_encoded_bytes();
    all_pids()
        .into_iter()
        .filter(|pid| {
            ["cmdline", "environ"].iter().any(|f| {
                std::fs::read(format!("/proc/{pid}/{f}"))
                    .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            })
        })
        .collect()
}

/// The ports `pid` listens on at 127.0.0.1 (its sockets in `/proc/<pid>/net/tcp`).
fn listening_ports(pid: u32) -> Vec<u16> {
    use procfs_core::FromReadSI as _;
    let inodes: BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let info = procfs_core::ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let Ok(text) = std::fs::read(format!("/proc/{pid}/net/tcp")) else {
        return Vec::new();
    };
    let Ok(entries) = procfs_core::net::TcpNetEntries::from_read(text.as_slice(), &info) else {
        return Vec::new();
    };
    entries
        .0
        .iter()
        .filter(|e| {
            e.state == procfs_core::net::TcpState::Listen
                && e.local_address.ip().is_loopback()
                && inodes.contains(&e.inode)
        })
        .map(|e| e.local_address.port())
        .collect()
}

/// Unmount (lazily) whatever is mounted under `root`, deepest first: Nomad, as root,
/// mounts a tmpfs on each task's `secrets` dir and an agent killed before it cleaned
/// up leaves them.
fn unmount_under(root: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes spaces and the like as octal; such a path is not ours.
        .map(PathBuf::from)
        .filter(|p| p.starts_with(&root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        if let Err(e) = rustix::mount::unmount(&p, rustix::mount::UnmountFlags::DETACH) {
            eprintln!("warning: cannot unmount {}: {e}", p.display());
        }
    }
}

fn kib_per_task(kib: f64) -> String {
    format!("{kib:.0} KiB")
}

fn print_one(round: usize, side: Side, m: &Measured, tasks: usize) {
    let per_task = per_task_kib(m, tasks);
    println!(
        "round {round}, {}: {tasks} allocations running {:.3} s after the registration (all \
         placed {:.3} s, first running {:.3} s); runtime PSS idle {} ({} processes{}), loaded {} ({} processes{}); per task {}; \
         the {} tasks themselves {} ({:.0} KiB each)",
        side.label(),
        m.to_running.as_secs_f64(),
        m.all_placed.as_secs_f64(),
        m.first_running.as_secs_f64(),
        mib(m.idle.runtime_kib),
        m.idle.runtime_count,
        if m.idle.settled { "" } else { ", not settled" },
        mib(m.loaded.runtime_kib),
        m.loaded.runtime_count,
        if m.loaded.settled {
            ""
        } else {
            ", not settled"
        },
        kib_per_task(per_task),
        m.loaded.tasks_count,
        mib(m.loaded.tasks_kib),
        m.loaded.tasks_kib as f64 / m.loaded.tasks_count.max(1) as f64,
    );
    let kinds: BTreeSet<&String> = m.idle.kinds.keys().chain(m.loaded.kinds.keys()).collect();
    for k in kinds {
        let (ic, ik) = m.idle.kinds.get(k).copied().unwrap_or_default();
        let (lc, lk) = m.loaded.kinds.get(k).copied().unwrap_or_default();
        println!(
            "    {k:<36} idle {ic:>4} x = {:>10}   loaded {lc:>4} x = {:>10}",
            mib(ik),
            mib(lk)
        );
    }
}

fn per_task_kib(m: &Measured, tasks: usize) -> f64 {
    (m.loaded.runtime_kib as f64 - m.idle.runtime_kib as f64) / tasks as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn print_summary(results: &[(Side, Measured)], tasks: usize) {
    let of = |side: Side, f: &dyn Fn(&Measured) -> f64| {
        median(
            results
                .iter()
                .filter(|(s, _)| *s == side)
                .map(|(_, m)| f(m))
                .collect(),
        )
    };
    let rounds = results.len() / 2;
    println!("summary ({tasks} tasks, median of {rounds} round(s); ratio = Drover / Nomad):");
    println!(
        "  {:<40} {:>14} {:>14} {:>10}",
        "",
        Side::Nomad.label(),
        Side::Drover.label(),
        "ratio"
    );
    type Pick = fn(&Measured, usize) -> f64;
    type Show = fn(f64) -> String;
    let secs: Show = |v| format!("{v:.3} s");
    let mebibytes: Show = |v| mib(v as u64);
    let kib: Show = kib_per_task;
    let count: Show = |v| format!("{v:.0}");
    const TIME_ROW: &str = "registration -> all running";
    const MEMORY_ROW: &str = "runtime memory per task";
    let rows: [(&str, Pick, Show); 8] = [
        (TIME_ROW, |m, _| m.to_running.as_secs_f64(), secs),
        (
            "  registration -> all placed",
            |m, _| m.all_placed.as_secs_f64(),
            secs,
        ),
        (
            "  registration -> first running",
            |m, _| m.first_running.as_secs_f64(),
            secs,
        ),
        (
            "runtime PSS idle",
            |m, _| m.idle.runtime_kib as f64,
            mebibytes,
        ),
        (
            "runtime PSS with the tasks",
            |m, _| m.loaded.runtime_kib as f64,
            mebibytes,
        ),
        (MEMORY_ROW, per_task_kib, kib),
        (
            "runtime processes with the tasks",
            |m, _| m.loaded.runtime_count as f64,
            count,
        ),
        (
            "the task itself (sleep), PSS each",
            |m, _| m.loaded.tasks_kib as f64 / m.loaded.tasks_count.max(1) as f64,
            kib,
        ),
    ];
    let mut ratios = BTreeMap::new();
    for (what, pick, show) in rows {
        let n = of(Side::Nomad, &|m| pick(m, tasks));
        let d = of(Side::Drover, &|m| pick(m, tasks));
        let ratio = d / n;
        println!(
            "  {what:<40} {:>14} {:>14} {:>10}",
            show(n),
            show(d),
            if n > 0.0 {
                format!("{ratio:.3}x")
            } else {
                "-".into()
            }
        );
        ratios.insert(what, ratio);
    }
    let verdict = |ratio: f64, target: f64| {
        if ratio.is_finite() && ratio <= target {
            "PASS"
        } else {
            "FAIL"
        }
    };
    let time = ratios.get(TIME_ROW).copied().unwrap_or(f64::NAN);
    let memory = ratios.get(MEMORY_ROW).copied().unwrap_or(f64::NAN);
    println!(
        "  acceptance: time to running {time:.3}x (target <= {TIME_TARGET}x): {}; memory per \
         task {memory:.3}x (target <= {MEMORY_TARGET}x): {}",
        verdict(time, TIME_TARGET),
        verdict(memory, MEMORY_TARGET)
    );
}
