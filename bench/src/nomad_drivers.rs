//! `drover-bench nomad-drivers`: Nomad 1.0.18's `raw_exec` (the unmodified driver,
//! served as an external plugin, through Drover's Nomad bridge) against Drover's own
//! raw exec driver (the `drover-driver-rawexec` binary), side by side in one run. Both
//! are named `raw_exec` (Drover's took Nomad's name; `rawexec` is its alias), so an
//! agent can serve only one of them: parts 2 and 3 use two agents, one per driver.
//!
//! Measured:
//! 1. launch → handshake → first fingerprint: `PluginProcess::launch` (with the Nomad
//!    host options an agent gives every external plugin, so both cookies are set) until
//!    it returns (the handshake is done and the client is connected), then the first
//!    item of the `Fingerprint` stream; `--launches` per driver, ABBA, each plugin shut
//!    down (untimed) before the next launch;
//! 2. StartTask → running through a real agent: two agents, started once and kept for
//!    the whole run, each with one driver's binary alone in its `plugin_dir` (Nomad's
//!    `raw_exec` with `config = { enabled = true }`) and the other built-in drivers
//!    denied; `POST /v1/tasks` of `/bin/sleep 300` to the agent of the driver measured
//!    until the answer says running; `--samples` per driver, ABBA, each task stopped
//!    and destroyed (untimed) before the next start. Both agents run all along, so the
//!    idle one weighs on both drivers' samples alike;
//! 3. memory per running task: `--tasks` sleeping tasks of one driver at a time in its
//!    agent (A B B A), then `Pss` and the private part (USS, `Private_Clean +
//!    Private_Dirty`) of `/proc/<pid>/smaps_rollup` of every process the tasks added on
//!    the host besides the agent and the plugin process: the executors, the log relays
//!    (Nomad drivers write into FIFOs that a relay process reads into Drover's log files;
//!    Drover's executor writes the log files itself), and, apart, the tasks themselves.
//!    A process counts as added when it was not there before the tasks started and it
//!    descends from that driver's agent, holds a FIFO of that agent's `nomad-fifos`
//!    directory, or is a task or a task's parent (never the agent or its plugin
//!    process). The plugin process's growth is shown too.
//!
//! Ratios are Nomad's driver over Drover's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_api::{Client, PluginProtocol, PluginSource, PluginState, RunRequest, TaskLifecycle};
use drover_plugin_sdk::client::{LaunchOptions, NomadHostOptions};
use tokio_stream::StreamExt as _;

use crate::tasks::{
    AgentProc, all_pids, cleanup, parent_pid, proc_kib, raise_nofile_limit, start_agent_with,
    terminate, with_descendants,
};
use crate::{LaunchedPlugin, Stats, ms, sibling_binary, stats};

/// The built-in drivers other than `raw_exec`, denied so that each agent runs the
/// driver compared only (the built-in `raw_exec` loses to the external binary of the
/// same name).
const OTHER_BUILTINS: [&str; 4] = ["docker", "exec", "java", "qemu"];

/// How long the agent is left alone before memory is read (the last start's
/// allocations settled, the relays' first reads done).
const SETTLE: Duration = Duration::from_secs(2);

/// The task every start runs.
fn sleep_config() -> serde_json::Value {
    serde_json::json!({ "command": "/bin/sleep", "args": ["300"] })
}

pub(crate) struct Options {
    pub(crate) launches: usize,
    pub(crate) samples: usize,
    pub(crate) tasks: usize,
    pub(crate) raw_exec: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Driver {
    /// Nomad 1.0.18's raw_exec, through the bridge.
    Nomad,
    /// Drover's raw_exec (`drover-driver-rawexec`).
    Drover,
}

const DRIVERS: [Driver; 2] = [Driver::Nomad, Driver::Drover];

/// A B B A: drift of the machine over the run hits both alike.
const ABBA: [Driver; 4] = [Driver::Nomad, Driver::Drover, Driver::Drover, Driver::Nomad];

impl Driver {
    fn label(self) -> &'static str {
        match self {
            Driver::Nomad => "Nomad raw_exec",
            Driver::Drover => "Drover raw_exec",
        }
    }

    /// The name the agent knows the driver by (its `PluginInfo` name): Nomad's for
    /// both, which is why each has an agent of its own.
    fn name(self) -> &'static str {
        "raw_exec"
    }

    /// The binary's file name in its agent's `plugin_dir`. Nomad's is named as the
    /// plugin is, so that `[plugin.raw_exec]` is its settings whether they are found by
    /// file name or by plugin name.
    fn file_name(self) -> &'static str {
        match self {
            Driver::Nomad => "raw_exec",
            Driver::Drover => "drover-driver-rawexec",
        }
    }

    /// The driver's settings in its agent's config: both run nothing unless enabled.
    fn plugin_settings(self) -> &'static str {
        "[plugin.raw_exec]\nconfig = { enabled = true }\n"
    }

    fn protocol(self) -> PluginProtocol {
        match self {
            Driver::Nomad => PluginProtocol::Nomad,
            Driver::Drover => PluginProtocol::Drover,
        }
    }

    fn index(self) -> usize {
        match self {
            Driver::Nomad => 0,
            Driver::Drover => 1,
        }
    }
}

/// The programs compared, and the agent.
struct Build {
    drover: PathBuf,
    nomad_raw_exec: PathBuf,
    drover_raw_exec: PathBuf,
}

impl Build {
    fn binary(&self, d: Driver) -> &Path {
        match d {
            Driver::Nomad => &self.nomad_raw_exec,
            Driver::Drover => &self.drover_raw_exec,
        }
    }
}

pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    if opts.launches < 2 || opts.samples < 2 || opts.tasks == 0 {
        bail!("--launches and --samples must be at least 2, --tasks at least 1");
    }
    raise_nofile_limit();
    let raw_exec = match opts.raw_exec {
        Some(p) => p,
        None => drover_test_support::nomad::peers()
            .context(
                "the real Nomad 1.0.18 programs are needed (see the SKIPPED line above); \
                 or give the raw_exec plugin binary with --raw-exec PATH",
            )?
            .raw_exec(),
    };
    if !raw_exec.is_file() {
        bail!(
            "Nomad's raw_exec plugin {} is not a file",
            raw_exec.display()
        );
    }
    let build = Build {
        drover: sibling_binary("drover", "drover")?,
        nomad_raw_exec: raw_exec,
        drover_raw_exec: sibling_binary("drover-driver-rawexec", "drover-driver-rawexec")?,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!("nomad-drivers benchmark: `{command}`");
    for d in DRIVERS {
        println!("  {:<15} {}", d.label(), build.binary(d).display());
    }
    println!("  agent           {}", build.drover.display());

    // Each part is printed once measured, so that a later failure keeps it.
    let launches = launch_latencies(&build, opts.launches).await?;
    print_launches(&launches, opts.launches);

    // One agent per driver, in `DRIVERS` order, kept for parts 2 and 3.
    let mut agents: Vec<DriverAgent> = Vec::with_capacity(DRIVERS.len());
    let measured = async {
        for d in DRIVERS {
            agents.push(DriverAgent::start(&build, d).await?);
        }
        let latency = api_latencies(&agents, opts.samples).await?;
        print_latency(latency, opts.samples);
        let mut memory = Vec::new();
        for (round, d) in ABBA.into_iter().enumerate() {
            let agent = &agents[d.index()];
            memory.push((d, measure_memory(agent, opts.tasks, round).await?));
        }
        print_memory(&memory, opts.tasks, &build);
        anyhow::Ok(())
    }
    .await;
    for agent in &mut agents {
        agent.stop().await;
    }
    measured?;
    Ok(())
}

/// One launch's times and what its first fingerprint said.
struct Launch {
    handshake: Duration,
    fingerprint: Duration,
    health: String,
}

/// `launches` launches per driver, ABBA: one `Vec` per driver, in `DRIVERS` order.
async fn launch_latencies(build: &Build, launches: usize) -> anyhow::Result<Vec<Vec<Launch>>> {
    let dir = tempfile::Builder::new()
        .prefix("drover-bench-nomad-launch")
        .tempdir()?;
    let fifo_dir = dir.path().join("fifos");
    let socket_dir = dir.path().join("sockets");
    for d in [&fifo_dir, &socket_dir] {
        private_dir(d)?;
    }
    let once = |d: Driver| launch_once(build, d, &socket_dir, &fifo_dir);
    // Warm-up: page cache, the loader.
    for d in DRIVERS {
        once(d).await?;
    }
    let mut out: Vec<Vec<Launch>> = DRIVERS.iter().map(|_| Vec::new()).collect();
    while out.iter().any(|v| v.len() < launches) {
        for d in ABBA {
            if out[d.index()].len() < launches {
                out[d.index()].push(once(d).await?);
            }
        }
    }
    Ok(out)
}

/// Launch the driver's binary as an agent launches an external plugin, take the first
/// fingerprint, shut it down.
async fn launch_once(
    build: &Build,
    d: Driver,
    socket_dir: &Path,
    fifo_dir: &Path,
) -> anyhow::Result<Launch> {
    let binary = build.binary(d);
    let mut opts = LaunchOptions::new(d.name(), binary);
    opts.socket_dir = Some(socket_dir.to_owned());
    opts.nomad = Some(NomadHostOptions::new(fifo_dir, &build.drover));
    let t = Instant::now();
    let process = LaunchedPlugin::launch(opts)
        .await
        .with_context(|| format!("launching {}", binary.display()))?;
    let handshake = t.elapsed();
    let first = async {
        let mut stream = process.client().fingerprint().await?;
        stream.next().await.transpose()
    };
    let first = tokio::time::timeout(Duration::from_secs(30), first).await;
    let fingerprint = t.elapsed();
    let protocol = process.protocol();
    process.shutdown().await;
    let first = first
        .with_context(|| format!("{} sent no fingerprint within 30 s", d.label()))?
        .with_context(|| format!("Fingerprint of {}", d.label()))?
        .with_context(|| format!("{}'s Fingerprint stream ended at once", d.label()))?;
    let expected = match d {
        Driver::Nomad => drover_plugin_sdk::client::PluginProtocol::Nomad,
        Driver::Drover => drover_plugin_sdk::client::PluginProtocol::Drover,
    };
    if protocol != expected {
        bail!(
            "{} was launched as a {protocol:?} plugin, not {expected:?}",
            binary.display()
        );
    }
    Ok(Launch {
        handshake,
        fingerprint,
        health: format!("{:?}", first.health).to_lowercase(),
    })
}

/// A directory only this user can enter (the SDK refuses FIFOs and sockets in others).
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// A real agent serving one driver: its binary alone in `plugin_dir`, the other
/// built-ins denied.
struct DriverAgent {
    driver: Driver,
    root: tempfile::TempDir,
    agent: AgentProc,
    /// The driver's plugin process.
    plugin_pid: u32,
}

impl DriverAgent {
    async fn start(build: &Build, driver: Driver) -> anyhow::Result<DriverAgent> {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::Builder::new()
            .prefix(&format!("drover-bench-nomad-{driver:?}-").to_lowercase())
            .tempdir()?;
        let plugins = root.path().join("plugins");
        private_dir(&plugins)?;
        let from = build.binary(driver);
        let to = plugins.join(driver.file_name());
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
        let deny = OTHER_BUILTINS.map(|n| format!("{n:?}")).join(", ");
        let config = format!("plugin_deny = [{deny}]\n\n{}", driver.plugin_settings());
        let config_file = root.path().join("agent.toml");
        std::fs::write(&config_file, config)?;
        let agent = start_agent_with(
            &build.drover,
            root.path(),
            &["--config".as_ref(), config_file.as_os_str()],
        )?;
        let mut started = DriverAgent {
            driver,
            root,
            agent,
            plugin_pid: 0,
        };
        match started.wait_served().await {
            Ok(pid) => started.plugin_pid = pid,
            Err(e) => {
                started.stop().await;
                return Err(e);
            }
        }
        Ok(started)
    }

    /// Until `plugin status` shows the driver healthy, in its protocol (Nomad's or
    /// Drover's: both are named `raw_exec`) from the external binary, and no other
    /// plugin process (not the built-in `raw_exec`); its pid.
    async fn wait_served(&self) -> anyhow::Result<u32> {
        let d = self.driver;
        let deadline = Duration::from_secs(60);
        let t = Instant::now();
        loop {
            if let Ok(rows) = self.api().plugins().await {
                let serving = rows
                    .iter()
                    .find(|p| {
                        p.name == d.name()
                            && p.state == PluginState::Healthy
                            && p.source == PluginSource::External
                            && p.protocol == d.protocol()
                    })
                    .and_then(|p| p.pid);
                let processes = rows.iter().filter(|p| p.pid.is_some()).count();
                if let Some(pid) = serving
                    && processes == 1
                {
                    return Ok(pid);
                }
            }
            if t.elapsed() > deadline {
                let log =
                    std::fs::read_to_string(self.root.path().join("agent.log")).unwrap_or_default();
                bail!(
                    "the {} agent did not serve {} alone ({:?} protocol, external, healthy) \
                     within {deadline:?}; plugin status: {:#?}\nagent log:\n{log}",
                    d.label(),
                    d.name(),
                    d.protocol(),
                    self.api().plugins().await
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn api(&self) -> &Client {
        &self.agent.api
    }

    fn pid(&self) -> u32 {
        self.agent.child.id()
    }

    fn fifo_dir(&self) -> PathBuf {
        self.root.path().join("data").join("nomad-fifos")
    }

    /// Stop every task, then the agent (which drains).
    async fn stop(&mut self) {
        cleanup(&self.agent.api).await;
        terminate(&mut self.agent.child);
    }
}

/// Run a sleeping task on `d` through the agent's API; its task id and pid.
async fn run_sleeper(api: &Client, d: Driver, name: String) -> anyhow::Result<(String, u32)> {
    let request = RunRequest {
        driver: d.name().into(),
        name: Some(name),
        config: sleep_config(),
        ..Default::default()
    };
    let view = api
        .run_task(&request)
        .await
        .with_context(|| format!("running a task on {}", d.label()))?;
    if view.state != TaskLifecycle::Running {
        bail!(
            "{} task {} is {:?} after run, not running",
            d.label(),
            view.id,
            view.state
        );
    }
    let pid = view
        .attributes
        .get("pid")
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("{} task {} has no pid attribute", d.label(), view.id))?;
    Ok((view.id, pid))
}

async fn end_task(api: &Client, id: &str) -> anyhow::Result<()> {
    let stop = drover_api::StopRequest {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    api.stop_task(id, &stop).await?;
    api.destroy_task(id, true).await?;
    Ok(())
}

/// StartTask → running through the API of each driver's agent (`agents` in `DRIVERS`
/// order), `samples` per driver, ABBA.
async fn api_latencies(
    agents: &[DriverAgent],
    samples: usize,
) -> anyhow::Result<Vec<Vec<Duration>>> {
    // Warm-up: page cache, the executors' binaries, each driver's first task.
    for d in DRIVERS {
        let api = agents[d.index()].api();
        for n in 0..3 {
            let (id, _) = run_sleeper(api, d, format!("warm-{n}")).await?;
            end_task(api, &id).await?;
        }
    }
    let mut out: Vec<Vec<Duration>> = DRIVERS.iter().map(|_| Vec::new()).collect();
    let mut n = 0;
    while out.iter().any(|v| v.len() < samples) {
        for d in ABBA {
            if out[d.index()].len() == samples {
                continue;
            }
            let api = agents[d.index()].api();
            let t = Instant::now();
            let (id, _) = run_sleeper(api, d, format!("lat-{n}")).await?;
            out[d.index()].push(t.elapsed());
            end_task(api, &id).await?;
            n += 1;
        }
    }
    Ok(out)
}

/// What a process is to the tasks of one run.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Role {
    Executor,
    LogRelay,
    Other,
    Task,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Role::Executor => "executor",
            Role::LogRelay => "log relay",
            Role::Other => "other added processes",
            Role::Task => "the task itself (sleep)",
        }
    }
}

/// PSS and USS (KiB) of the processes of one role, summed, and how many there were.
#[derive(Default, Clone, Copy)]
struct Usage {
    pss: u64,
    uss: u64,
    count: usize,
}

struct MemoryRun {
    /// Per role, over all the run's tasks.
    roles: BTreeMap<Role, Usage>,
    /// The plugin process's PSS before the tasks started and with them running.
    plugin_before: u64,
    plugin_after: u64,
    /// The programs the added processes run, by role.
    exes: BTreeMap<Role, BTreeSet<String>>,
}

/// Start `tasks` tasks on the agent's driver, read what they added, end them.
async fn measure_memory(
    agent: &DriverAgent,
    tasks: usize,
    round: usize,
) -> anyhow::Result<MemoryRun> {
    let d = agent.driver;
    let plugin = agent.plugin_pid;
    tokio::time::sleep(SETTLE).await;
    let before: BTreeSet<u32> = related(agent, &[]).into_iter().collect();
    let plugin_before = pss(plugin)?;
    let mut ids = Vec::with_capacity(tasks);
    let mut task_pids = Vec::with_capacity(tasks);
    let started = async {
        for i in 0..tasks {
            let (id, pid) = run_sleeper(agent.api(), d, format!("mem-{round}-{i}")).await?;
            ids.push(id);
            task_pids.push(pid);
        }
        tokio::time::sleep(SETTLE).await;
        anyhow::Ok(())
    }
    .await;
    let read = started.and_then(|()| {
        let plugin_after = pss(plugin)?;
        let skip: BTreeSet<u32> = [agent.pid(), plugin].into();
        let tasks: BTreeSet<u32> = task_pids.iter().copied().collect();
        let executors: BTreeSet<u32> = task_pids.iter().filter_map(|p| parent_pid(*p)).collect();
        let fifo_holders = fifo_holders(&agent.fifo_dir());
        let agent_exe = std::fs::read_link(format!("/proc/{}/exe", agent.pid())).ok();
        let mut roles: BTreeMap<Role, Usage> = BTreeMap::new();
        let mut exes: BTreeMap<Role, BTreeSet<String>> = BTreeMap::new();
        for pid in related(agent, &task_pids) {
            if before.contains(&pid) || skip.contains(&pid) {
                continue;
            }
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let role = if tasks.contains(&pid) {
                Role::Task
            } else if executors.contains(&pid) {
                Role::Executor
            } else if fifo_holders.contains(&pid) || (exe.is_some() && exe == agent_exe) {
                Role::LogRelay
            } else {
                Role::Other
            };
            // A process that has gone since the listing costs nothing.
            let Some(p) = proc_kib(pid, "smaps_rollup", "Pss:") else {
                continue;
            };
            let u = roles.entry(role).or_default();
            u.pss += p;
            u.uss += uss(pid);
            u.count += 1;
            exes.entry(role).or_default().insert(
                exe.as_deref()
                    .and_then(Path::file_name)
                    .map_or_else(|| "?".into(), |n| n.to_string_lossy().into_owned()),
            );
        }
        Ok(MemoryRun {
            roles,
            plugin_before,
            plugin_after,
            exes,
        })
    });
    for id in &ids {
        end_task(agent.api(), id).await?;
    }
    // The next run's "before" must not hold this run's processes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while task_pids
        .iter()
        .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        if Instant::now() > deadline {
            bail!(
                "{}'s tasks were still running 30 s after being destroyed",
                d.label()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    read
}

fn pss(pid: u32) -> anyhow::Result<u64> {
    proc_kib(pid, "smaps_rollup", "Pss:").with_context(|| format!("no Pss for pid {pid}"))
}

/// The private (unshared) memory of a process, KiB.
fn uss(pid: u32) -> u64 {
    ["Private_Clean:", "Private_Dirty:"]
        .iter()
        .filter_map(|f| proc_kib(pid, "smaps_rollup", f))
        .sum()
}

/// The processes that may belong to the agent's tasks: its descendants, the holders of
/// a FIFO in its FIFO directory (a log relay that left the agent's tree), `tasks` and
/// their parents (an executor that did).
fn related(agent: &DriverAgent, tasks: &[u32]) -> Vec<u32> {
    let mut out = with_descendants([agent.pid()].into());
    out.remove(&agent.pid());
    out.extend(fifo_holders(&agent.fifo_dir()));
    for t in tasks {
        out.insert(*t);
        out.extend(parent_pid(*t).filter(|pp| *pp > 1));
    }
    out.into_iter().collect()
}

/// Processes with a file of `dir` open.
fn fifo_holders(dir: &Path) -> BTreeSet<u32> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.starts_with(&dir)))
        })
        .collect()
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn print_launches(launches: &[Vec<Launch>], n: usize) {
    println!(
        "1. Launch -> handshake -> first fingerprint (PluginProcess::launch with the agent's \
         options, then Fingerprint's first item), {n} launches per driver, ABBA:"
    );
    println!(
        "  {:<34} {:>24} {:>24} {:>14}",
        "",
        Driver::Nomad.label(),
        Driver::Drover.label(),
        "Nomad/Drover"
    );
    type Pick = fn(&Launch) -> Duration;
    let rows: [(&str, Pick); 2] = [
        ("launch -> handshake done", |l| l.handshake),
        ("launch -> first fingerprint", |l| l.fingerprint),
    ];
    for (what, pick) in rows {
        let s: Vec<Stats> = launches
            .iter()
            .map(|v| stats(v.iter().map(pick).collect()))
            .collect();
        for (q, get) in [
            ("p50", (|s: &Stats| s.median) as fn(&Stats) -> Duration),
            ("p99", |s: &Stats| s.p99),
        ] {
            println!(
                "  {:<34} {:>24} {:>24} {:>14}",
                format!("{what} {q}"),
                ms(get(&s[0])),
                ms(get(&s[1])),
                ratio(get(&s[0]).as_secs_f64(), get(&s[1]).as_secs_f64())
            );
        }
    }
    let healths: Vec<String> = DRIVERS
        .iter()
        .map(|d| {
            let seen: BTreeSet<&str> = launches[d.index()]
                .iter()
                .map(|l| l.health.as_str())
                .collect();
            format!(
                "{} {}",
                d.label(),
                seen.into_iter().collect::<Vec<_>>().join("/")
            )
        })
        .collect();
    println!(
        "  first fingerprint's health (no SetConfig before it): {}",
        healths.join("; ")
    );
}

fn print_latency(latency: Vec<Vec<Duration>>, n: usize) {
    println!(
        "2. StartTask -> running through the agent (POST /v1/tasks of `/bin/sleep 300` -> \
         answer says running), {n} per driver, ABBA, one at a time:"
    );
    let s: Vec<Stats> = latency.into_iter().map(stats).collect();
    println!(
        "  {:<34} {:>24} {:>24} {:>14}",
        "",
        Driver::Nomad.label(),
        Driver::Drover.label(),
        "Nomad/Drover"
    );
    for (q, get) in [
        ("p50", (|s: &Stats| s.median) as fn(&Stats) -> Duration),
        ("p99", |s: &Stats| s.p99),
        ("min", |s: &Stats| s.min),
    ] {
        println!(
            "  {:<34} {:>24} {:>24} {:>14}",
            q,
            ms(get(&s[0])),
            ms(get(&s[1])),
            ratio(get(&s[0]).as_secs_f64(), get(&s[1]).as_secs_f64())
        );
    }
}

fn print_memory(runs: &[(Driver, MemoryRun)], tasks: usize, build: &Build) {
    let per_driver = runs.len() / DRIVERS.len();
    println!(
        "3. Memory per running task: {tasks} tasks of one driver at a time in its agent, ABBA, \
         mean of {per_driver} runs; KiB per task, PSS (USS = private pages) from smaps_rollup:"
    );
    println!(
        "  {:<34} {:>24} {:>24} {:>14}",
        "",
        Driver::Nomad.label(),
        Driver::Drover.label(),
        "Nomad/Drover"
    );
    // Mean over a driver's runs of one number per run.
    let mean = |d: Driver, f: &dyn Fn(&MemoryRun) -> f64| -> f64 {
        let v: Vec<f64> = runs
            .iter()
            .filter(|(e, _)| *e == d)
            .map(|(_, r)| f(r))
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let per_task = |roles: &[Role], pick: fn(&Usage) -> u64| {
        let roles = roles.to_vec();
        move |r: &MemoryRun| -> f64 {
            roles
                .iter()
                .filter_map(|role| r.roles.get(role))
                .map(pick)
                .sum::<u64>() as f64
                / tasks as f64
        }
    };
    let host_side = [Role::Executor, Role::LogRelay, Role::Other];
    let rows: Vec<(String, &[Role])> = vec![
        ("executor".into(), &[Role::Executor]),
        ("log relay".into(), &[Role::LogRelay]),
        ("other added processes".into(), &[Role::Other]),
        ("all but the task (executor+relay+other)".into(), &host_side),
        (Role::Task.label().into(), &[Role::Task]),
    ];
    for (what, roles) in rows {
        let pss = DRIVERS.map(|d| mean(d, &per_task(roles, |u| u.pss)));
        let uss = DRIVERS.map(|d| mean(d, &per_task(roles, |u| u.uss)));
        let count = DRIVERS.map(|d| {
            mean(d, &|r: &MemoryRun| {
                roles
                    .iter()
                    .filter_map(|role| r.roles.get(role))
                    .map(|u| u.count)
                    .sum::<usize>() as f64
                    / tasks as f64
            })
        });
        let cell = |i: usize| format!("{:.0} ({:.0}) x{:.2}", pss[i], uss[i], count[i]);
        println!(
            "  {what:<34} {:>24} {:>24} {:>14}",
            cell(0),
            cell(1),
            ratio(pss[0], pss[1])
        );
    }
    println!("  (cells: PSS KiB (USS KiB) xPROCESSES per task; the ratio is of PSS)");
    let growth = DRIVERS.map(|d| {
        mean(d, &|r: &MemoryRun| {
            (r.plugin_after as f64 - r.plugin_before as f64) / tasks as f64
        })
    });
    println!(
        "  {:<34} {:>24} {:>24} {:>14}",
        "plugin process PSS growth per task",
        format!("{:.0}", growth[0]),
        format!("{:.0}", growth[1]),
        ratio(growth[0], growth[1])
    );
    for d in DRIVERS {
        let mut exes: BTreeMap<Role, BTreeSet<String>> = BTreeMap::new();
        for (_, r) in runs.iter().filter(|(e, _)| *e == d) {
            for (role, names) in &r.exes {
                exes.entry(*role).or_default().extend(names.iter().cloned());
            }
        }
        let list: Vec<String> = exes
            .iter()
            .map(|(role, names)| {
                format!(
                    "{}: {}",
                    role.label(),
                    names.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        println!("  {} processes run: {}", d.label(), list.join("; "));
    }
    println!(
        "  (log relays run the agent's binary, {}; PSS splits pages shared with the agent \
         and the plugin among them)",
        build.drover.display()
    );
}
