//! `drover-bench tasks --count N`: start N sleeping rawexec tasks through a real agent
//! and report start throughput and latency, agent RSS, executor PSS, agent idle CPU,
//! and the time to reattach every task after `kill -9` of the agent.
//!
//! Baseline, measured in the same run: spawning N `sleep` processes directly (what the
//! kernel costs without Drover), so the throughput is reported as a ratio.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_api::{
    Client, PluginState, RunRequest, StopRequest, TaskEventKind, TaskLifecycle, TaskView,
};

use crate::{ms, stats};

/// Until the agent lists plugin `name` as healthy.
pub(crate) async fn wait_healthy(
    api: &Client,
    name: &str,
    deadline: Duration,
) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        if let Ok(rows) = api.plugins().await
            && rows
                .iter()
                .any(|p| p.name == name && p.state == PluginState::Healthy)
        {
            return Ok(());
        }
        if t.elapsed() > deadline {
            bail!("the agent's {name} driver did not become healthy within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Until the agent and every process under it (its plugins, their fingerprint
/// commands: a JVM for java, qemu for qemu) have used at most 3 % of one core for
/// 300 ms: a latency measured while the agent is still starting its other plugins
/// measures the machine being busy with that. Gives up (saying so) after `deadline`.
pub(crate) async fn wait_settled(agent_pid: u32, deadline: Duration) {
    let hz = rustix::param::clock_ticks_per_second().max(1);
    let started = Instant::now();
    // Busy: the tree's CPU ticks; out of: one core's ticks since we began.
    let sample = || {
        let one_core = (started.elapsed().as_secs_f64() * hz as f64) as u64;
        Some((tree_cpu_ticks(agent_pid), one_core))
    };
    wait_quiet("the agent and its plugins were", 3, deadline, sample).await;
}

/// Until the whole machine has been at least 90 % idle for 300 ms (from `/proc/stat`),
/// or `deadline` passed (then says so).
pub(crate) async fn wait_machine_quiet(deadline: Duration) {
    let sample = || {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal ...
        let total: u64 = v.iter().take(8).sum();
        let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
        Some((total.saturating_sub(idle), total))
    };
    wait_quiet("the machine was", 10, deadline, sample).await;
}

/// Until `sample`'s busy ticks grew by at most `max_percent` of its total ticks over
/// 300 ms; both are running counters. Gives up after `deadline`, saying `who` was
/// still busy; at once if `sample` cannot read.
async fn wait_quiet(
    who: &str,
    max_percent: u64,
    deadline: Duration,
    sample: impl Fn() -> Option<(u64, u64)>,
) {
    let t = Instant::now();
    let Some(mut before) = sample() else {
        return;
    };
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let Some(now) = sample() else {
            return;
        };
        let (busy, total) = (
            now.0.saturating_sub(before.0),
            now.1.saturating_sub(before.1),
        );
        if total > 0 && busy * 100 <= max_percent * total {
            return;
        }
        if t.elapsed() > deadline {
            println!("  note: {who} still busy {deadline:?} later; measuring anyway");
            return;
        }
        before = now;
    }
}

/// CPU ticks (user + system, with reaped children's) of `pid` and every process
/// under it.
fn tree_cpu_ticks(pid: u32) -> u64 {
    with_descendants([pid].into())
        .into_iter()
        .filter_map(|p| proc_stat(p).ok())
        .map(|s| s.utime + s.stime + s.cutime.max(0) as u64 + s.cstime.max(0) as u64)
        .sum()
}

/// Every pid on the host.
pub(crate) fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// `roots` and every process under any of them (those still running).
pub(crate) fn with_descendants(mut roots: BTreeSet<u32>) -> BTreeSet<u32> {
    let parents: HashMap<u32, u32> = all_pids()
        .into_iter()
        .filter_map(|p| Some((p, parent_pid(p)?)))
        .collect();
    // Until nothing is added (the tree is shallow).
    loop {
        let before = roots.len();
        for (pid, parent) in &parents {
            if roots.contains(parent) {
                roots.insert(*pid);
            }
        }
        if roots.len() == before {
            return roots;
        }
    }
}

pub(crate) struct AgentProc {
    pub(crate) child: Child,
    pub(crate) api: Client,
}

fn start_agent(drover: &Path, root: &Path) -> anyhow::Result<AgentProc> {
    start_agent_with(drover, root, &[])
}

/// A `--dev --drain` agent on `root/data` and `root/plugins`, logging warnings to
/// `root/agent.log`, with `extra` arguments (e.g. `--config FILE`).
pub(crate) fn start_agent_with(
    drover: &Path,
    root: &Path,
    extra: &[&std::ffi::OsStr],
) -> anyhow::Result<AgentProc> {
    start_agent_env(drover, root, extra, &[])
}

/// [`start_agent_with`] with `env` added to the agent's environment.
pub(crate) fn start_agent_env(
    drover: &Path,
    root: &Path,
    extra: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> anyhow::Result<AgentProc> {
    let data = root.join("data");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("agent.log"))?;
    let child = Command::new(drover)
        // --drain: the SIGTERM at the end stops every task and the plugin with it.
        .args([
            "agent",
            "--dev",
            "--drain",
            "--log-level",
            "warn",
            "--data-dir",
        ])
        .arg(&data)
        .arg("--plugin-dir")
        .arg(root.join("plugins"))
        // The dev server's HTTP API on a free port: not Nomad's 4646, which another
        // agent (of this bench, or anyone's) may hold.
        .args(["--dev-http-addr", "127.0.0.1:0"])
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the agent")?;
    Ok(AgentProc {
        child,
        api: Client::new(data.join("api.sock")),
    })
}

/// CPU time this process has used so far, all its threads (exited ones too).
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// `/proc/<pid>/stat` of a process.
fn proc_stat(pid: u32) -> anyhow::Result<procfs_core::process::Stat> {
    use procfs_core::FromRead as _;
    let text = std::fs::read(format!("/proc/{pid}/stat"))?;
    Ok(procfs_core::process::Stat::from_read(text.as_slice())?)
}

/// `(utime + stime)` of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = proc_stat(pid)?;
    Ok(stat.utime + stat.stime)
}

pub(crate) fn parent_pid(pid: u32) -> Option<u32> {
    proc_stat(pid).ok().and_then(|s| u32::try_from(s.ppid).ok())
}

/// A `kB` field of `/proc/<pid>/status` or `smaps_rollup`, in KiB.
pub(crate) fn proc_kib(pid: u32, file: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub async fn run(drover: &Path, count: usize, concurrency: usize) -> anyhow::Result<()> {
    if count == 0 {
        bail!("--count must be at least 1");
    }
    raise_nofile_limit();
    let root = tempfile::Builder::new().prefix("drover-bench-").tempdir()?;
    std::fs::create_dir_all(root.path().join("plugins"))?;

    // Baseline: the same number of sleeping processes, spawned directly. Measured again
    // right before the burst: a virtual machine's speed drifts within a run.
    let direct = direct_spawn(count)?;

    let mut agent = start_agent(drover, root.path())?;
    let result = measure(drover, root.path(), &mut agent, count, concurrency, direct).await;
    // Clean up whatever happened: stop every task, then the agent, which drains.
    cleanup(&agent.api).await;
    terminate(&mut agent.child);
    result
}

/// `count` `/bin/sleep 3600` spawned one after the other by this process, then killed.
struct DirectSpawn {
    elapsed: Duration,
    /// CPU time of this process (the spawning) and of the children (their `execve`
    /// and the start of `sleep`), per process.
    parent_cpu: Duration,
    child_cpu: Duration,
}

fn direct_spawn(count: usize) -> anyhow::Result<DirectSpawn> {
    let cpu = process_cpu();
    let t = Instant::now();
    let mut direct = Vec::with_capacity(count);
    for _ in 0..count {
        direct.push(
            Command::new("/bin/sleep")
                .arg("3600")
                .stdin(Stdio::null())
                .spawn()?,
        );
    }
    let elapsed = t.elapsed();
    let parent_cpu = process_cpu().saturating_sub(cpu);
    // A child spawned last may still be starting: wait until each sleeps.
    wait_all_sleeping(direct.iter().map(Child::id));
    let child_ns: u64 = direct.iter().map(|c| runtime_ns(c.id())).sum();
    for mut c in direct {
        let _ = c.kill();
        let _ = c.wait();
    }
    let per = |d: Duration| d / count as u32;
    Ok(DirectSpawn {
        elapsed,
        parent_cpu: per(parent_cpu),
        child_cpu: per(Duration::from_nanos(child_ns)),
    })
}

/// Until every one of `pids` is asleep (state `S`), for at most 5 s.
fn wait_all_sleeping(pids: impl Iterator<Item = u32>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in pids {
        while Instant::now() < deadline
            && proc_stat(pid).is_ok_and(|s| s.state != 'S' && s.state != 'Z')
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Time on a CPU, in ns, of every thread of `pid` alive now (`/proc/<pid>/task/*/
/// schedstat`: exact, where `/proc/<pid>/stat`'s clock ticks are 10 ms coarse, more
/// than a whole task start costs). 0 if it is gone.
fn runtime_ns(pid: u32) -> u64 {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The processes of a running agent, by role, for a CPU account.
struct Roles {
    agent: u32,
    plugin: Option<u32>,
    /// The spawner and every executor: what is under the plugin but the tasks.
    executors: BTreeSet<u32>,
}

impl Roles {
    fn now(agent: u32, plugin: Option<u32>, tasks: &BTreeSet<u32>) -> Self {
        let executors = plugin
            .map(|p| with_descendants([p].into()))
            .unwrap_or_default()
            .into_iter()
            .filter(|p| Some(*p) != plugin && !tasks.contains(p))
            .collect();
        Roles {
            agent,
            plugin,
            executors,
        }
    }

    /// CPU time so far (ns): agent, plugin, executors.
    fn runtime(&self) -> [u64; 3] {
        [
            runtime_ns(self.agent),
            self.plugin.map_or(0, runtime_ns),
            self.executors.iter().map(|p| runtime_ns(*p)).sum(),
        ]
    }
}

async fn measure(
    drover: &Path,
    root: &Path,
    agent: &mut AgentProc,
    count: usize,
    concurrency: usize,
    direct: DirectSpawn,
) -> anyhow::Result<()> {
    wait_healthy(&agent.api, "raw_exec", Duration::from_secs(30)).await?;
    wait_settled(agent.child.id(), Duration::from_secs(30)).await;
    let api = agent.api.clone();
    let body = |i: usize| RunRequest {
        driver: "rawexec".into(),
        name: Some(format!("sleeper-{i}")),
        config: serde_json::json!({"command": "/bin/sleep", "args": ["3600"]}),
        ..Default::default()
    };
    let pid_of = |view: &TaskView| {
        view.attributes
            .get("pid")
            .and_then(|p| p.parse::<u32>().ok())
            .map(|pid| (view.id.clone(), pid))
    };
    let mut task_pids = Vec::with_capacity(count);
    // Latency of one StartTask at a time (nothing queued behind another call).
    let sequential = count.min(100);
    let mut latencies = Vec::with_capacity(sequential);
    for i in 0..sequential {
        let started = Instant::now();
        let view = api.run_task(&body(i)).await?;
        latencies.push(started.elapsed());
        task_pids.extend(pid_of(&view));
    }
    // The baseline again, now, for the drift of the machine's speed.
    let direct_again = direct_spawn(count)?;
    let plugin_pid = api
        .plugins()
        .await?
        .iter()
        .find(|p| p.name == "raw_exec")
        .and_then(|p| p.pid);
    let sequential_tasks: BTreeSet<u32> = task_pids.iter().map(|(_, pid)| *pid).collect();
    let before = Roles::now(agent.child.id(), plugin_pid, &sequential_tasks);
    let cpu_before = before.runtime();
    // Throughput of the rest, `concurrency` calls in flight.
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let client_cpu = process_cpu();
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in sequential..count {
        let api = api.clone();
        let sem = sem.clone();
        let body = body(i);
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let started = Instant::now();
            let view = api.run_task(&body).await?;
            anyhow::Ok((started.elapsed(), view))
        });
    }
    let mut loaded = Vec::with_capacity(count - sequential);
    while let Some(joined) = set.join_next().await {
        let (lat, view) = joined??;
        loaded.push(lat);
        task_pids.extend(pid_of(&view));
    }
    let start_elapsed = t.elapsed();
    // The machine's CPU is what a burst runs out of, and this process (the client
    // making the calls) takes its share of it, which the direct spawn does not pay.
    let client_cpu = process_cpu().saturating_sub(client_cpu);
    let concurrent = count - sequential;
    // The CPU the burst cost, by role: processes that existed before it (the agent,
    // the plugin, the spawner, the first executors) count what they used since; those
    // it made, all they used.
    let burst_tasks: BTreeSet<u32> = task_pids
        .iter()
        .map(|(_, pid)| *pid)
        .filter(|p| !sequential_tasks.contains(p))
        .collect();
    let all_tasks: BTreeSet<u32> = task_pids.iter().map(|(_, pid)| *pid).collect();
    wait_all_sleeping(burst_tasks.iter().copied());
    let mut after = Roles::now(agent.child.id(), plugin_pid, &all_tasks);
    after.executors.extend(before.executors.iter().copied());
    let cpu_after = after.runtime();
    let tasks_ns: u64 = burst_tasks.iter().map(|p| runtime_ns(*p)).sum();
    println!(
        "tasks benchmark: {count} rawexec tasks (/bin/sleep 3600): {sequential} started one at a time, \
         then {concurrent} with {concurrency} StartTask calls in flight"
    );
    println!("  {}", crate::fs_note());
    let l = stats(latencies);
    println!(
        "  StartTask latency, one at a time (API POST -> running, the agent settled): p50 {}  p99 {}",
        ms(l.median),
        ms(l.p99)
    );
    if concurrent > 0 {
        let c = stats(loaded);
        let direct_rate = |d: &DirectSpawn| count as f64 / d.elapsed.as_secs_f64();
        let (first, again) = (direct_rate(&direct), direct_rate(&direct_again));
        let baseline = (first + again) / 2.0;
        let rate = concurrent as f64 / start_elapsed.as_secs_f64();
        println!(
            "  start throughput: {rate:.0} tasks/s ({concurrent} in {:.2} s; latency under load p50 {} p99 {})",
            start_elapsed.as_secs_f64(),
            ms(c.median),
            ms(c.p99),
        );
        println!(
            "  direct spawn of sleep, same run: {first:.0} procs/s at the start, {again:.0} right before \
             the burst; Drover's rate is {:.0} % of their mean {baseline:.0} (goal >= 50 %)",
            rate / baseline * 100.0
        );
        let per = |ns: u64| ms(Duration::from_nanos(ns / concurrent as u64));
        let [agent_ns, plugin_ns, executors_ns] =
            [0, 1, 2].map(|i| cpu_after[i].saturating_sub(cpu_before[i]));
        println!(
            "  CPU per start in the burst: agent {}, plugin {}, spawner and executors {} \
             (Drover: {}); the task itself {} (its execve and the start of sleep); \
             this bench (the API client) {}",
            per(agent_ns),
            per(plugin_ns),
            per(executors_ns),
            per(agent_ns + plugin_ns + executors_ns),
            per(tasks_ns),
            ms(client_cpu / concurrent as u32)
        );
        println!(
            "  CPU per direct spawn (mean of both): {} in the spawning process, {} in the child",
            ms((direct.parent_cpu + direct_again.parent_cpu) / 2),
            ms((direct.child_cpu + direct_again.child_cpu) / 2),
        );
    }
    let agent_pid = agent.child.id();

    // Memory: the agent, the plugin, and every executor (the task's parent).
    let agent_rss = proc_kib(agent_pid, "status", "VmRSS:").unwrap_or(0);
    let plugin_rss = plugin_pid.and_then(|p| proc_kib(p, "status", "VmRSS:"));
    let mut executors: Vec<u32> = task_pids
        .iter()
        .filter_map(|(_, pid)| parent_pid(*pid))
        .filter(|pp| Some(*pp) != plugin_pid && *pp != 1)
        .collect();
    executors.sort_unstable();
    executors.dedup();
    let pss: Vec<u64> = executors
        .iter()
        .filter_map(|p| proc_kib(*p, "smaps_rollup", "Pss:"))
        .collect();
    println!(
        "  agent RSS {}; rawexec plugin RSS {}",
        mib(agent_rss),
        plugin_rss.map_or("?".into(), mib)
    );
    let dedicated_pss = if pss.is_empty() {
        println!("  executor PSS: no executor processes found (tasks are children of the plugin)");
        None
    } else {
        let mut sorted = pss.clone();
        sorted.sort_unstable();
        let avg = pss.iter().sum::<u64>() as f64 / pss.len() as f64;
        let dirty: Vec<u64> = executors
            .iter()
            .filter_map(|p| proc_kib(*p, "smaps_rollup", "Private_Dirty:"))
            .collect();
        println!(
            "  executor PSS over {} executors ({}): mean {:.0} KiB, max {} KiB, private dirty \
             mean {:.0} KiB (goal <= 400 KiB PSS)",
            pss.len(),
            executor_program(executors[0]),
            avg,
            sorted[sorted.len() - 1],
            dirty.iter().sum::<u64>() as f64 / dirty.len().max(1) as f64
        );
        Some(avg)
    };
    reference_shims();

    // Idle CPU of the agent with every task running.
    let before = cpu_ticks(agent_pid)?;
    let plugin_before = plugin_pid.map(cpu_ticks).transpose()?;
    let idle = Duration::from_secs(10);
    tokio::time::sleep(idle).await;
    let hz = rustix::param::clock_ticks_per_second().max(1) as f64;
    let agent_cpu = (cpu_ticks(agent_pid)? - before) as f64 / hz / idle.as_secs_f64() * 100.0;
    let plugin_cpu = match (plugin_pid, plugin_before) {
        (Some(p), Some(b)) => cpu_ticks(p)
            .ok()
            .map(|a| (a - b) as f64 / hz / idle.as_secs_f64() * 100.0),
        _ => None,
    };
    println!(
        "  idle CPU over {idle:?} with {count} tasks: agent {agent_cpu:.2}% of one core (goal < 1%); plugin {}",
        plugin_cpu.map_or("?".into(), |c| format!("{c:.2}%"))
    );

    // kill -9 the agent, start it again, time until every task is recovered.
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    let t = Instant::now();
    *agent = start_agent(drover, root)?;
    let api = agent.api.clone();
    let deadline = Duration::from_secs(120);
    loop {
        if let Ok(rows) = api.list_tasks().await {
            let recovered = rows
                .iter()
                .filter(|r| {
                    r.state == TaskLifecycle::Running
                        && r.events
                            .last()
                            .is_some_and(|e| e.kind == TaskEventKind::Recovered)
                })
                .count();
            if recovered >= count {
                break;
            }
        }
        if t.elapsed() > deadline {
            bail!("tasks were not all recovered within {deadline:?} of the agent restart");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reattach = t.elapsed();
    let same_pids = task_pids
        .iter()
        .filter(|(_, pid)| Path::new(&format!("/proc/{pid}")).exists())
        .count();
    println!(
        "  reattach after kill -9 of the agent: all {count} tasks recovered {} after the new agent was spawned (goal < 2 s); {same_pids}/{} original task pids alive",
        ms(reattach),
        task_pids.len()
    );
    if let Some(dedicated) = dedicated_pss {
        own_binary_baseline(drover, count.min(100), dedicated).await?;
    }
    Ok(())
}

/// The program an executor runs, as `ps` would name it.
fn executor_program(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into())
}

/// Baseline for the executor's memory, same run: `count` tasks on a second agent whose
/// drivers are told to use an executor that does not exist, so that they run the
/// driver's own binary (`drover`) as executor, the form before `drover-executor`, each
/// executed afresh (no spawner).
async fn own_binary_baseline(drover: &Path, count: usize, dedicated: f64) -> anyhow::Result<()> {
    let root = tempfile::Builder::new().prefix("drover-bench-").tempdir()?;
    std::fs::create_dir_all(root.path().join("plugins"))?;
    let missing = root.path().join("no-such-executor");
    let mut agent = start_agent_env(
        drover,
        root.path(),
        &[],
        &[
            ("DROVER_EXECUTOR", missing.as_os_str()),
            // Executed, as that form always was: forked from a spawner, executors share
            // its pages and the comparison of the two programs would be lost.
            ("DROVER_EXECUTOR_SPAWNER", "off".as_ref()),
            (
                "DROVER_PLUGIN_PASS_ENV",
                "DROVER_EXECUTOR,DROVER_EXECUTOR_SPAWNER".as_ref(),
            ),
        ],
    )?;
    let result = async {
        wait_healthy(&agent.api, "raw_exec", Duration::from_secs(30)).await?;
        let mut executors = Vec::with_capacity(count);
        for i in 0..count {
            let view = agent
                .api
                .run_task(&RunRequest {
                    driver: "rawexec".into(),
                    name: Some(format!("own-{i}")),
                    config: serde_json::json!({"command": "/bin/sleep", "args": ["3600"]}),
                    ..Default::default()
                })
                .await?;
            if let Some(pid) = view.attributes.get("pid").and_then(|p| p.parse().ok()) {
                executors.extend(parent_pid(pid));
            }
        }
        let pss: Vec<u64> = executors
            .iter()
            .filter_map(|p| proc_kib(*p, "smaps_rollup", "Pss:"))
            .collect();
        if pss.is_empty() {
            bail!("no executor of the own-binary baseline found");
        }
        let avg = pss.iter().sum::<u64>() as f64 / pss.len() as f64;
        println!(
            "  baseline, same run: {} tasks whose executor is the driver's own binary ({}): \
             executor PSS mean {avg:.0} KiB; the dedicated executor's is {:.2}x of it",
            pss.len(),
            executor_program(executors[0]),
            dedicated / avg
        );
        anyhow::Ok(())
    }
    .await;
    cleanup(&agent.api).await;
    terminate(&mut agent.child);
    result
}

/// SIGTERM, then SIGKILL after 30 s.
pub(crate) fn terminate(child: &mut Child) {
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn reference_shims() {
    for name in ["containerd-shim-runc-v2", "conmon"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(name).exists()));
        let running: Vec<u64> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    // comm is the name cut to 15 bytes.
                    .is_ok_and(|c| {
                        let c = c.trim();
                        c == name || (c.len() == 15 && name.starts_with(c))
                    })
            })
            .filter_map(|pid| proc_kib(pid, "smaps_rollup", "Pss:"))
            .collect();
        match (found, running.is_empty()) {
            (_, false) => println!(
                "  reference: {} running {name} instance(s): mean PSS {:.0} KiB",
                running.len(),
                running.iter().sum::<u64>() as f64 / running.len() as f64
            ),
            (true, true) => {
                println!("  reference: {name} is installed, but no instance is running to measure")
            }
            (false, true) => println!("  reference: {name} is not installed here; no comparison"),
        }
    }
}

pub(crate) async fn cleanup(api: &Client) {
    let Ok(list) = api.list_tasks().await else {
        return;
    };
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut set = tokio::task::JoinSet::new();
    for task in list {
        let api = api.clone();
        let sem = sem.clone();
        set.spawn(async move {
            let _p = sem.acquire_owned().await;
            let stop = StopRequest {
                timeout: Some(Duration::from_secs(1)),
                ..Default::default()
            };
            let _ = api.stop_task(&task.id, &stop).await;
            let _ = api.destroy_task(&task.id, true).await;
        });
    }
    while set.join_next().await.is_some() {}
}

/// 1000 tasks need more than the default 1024 descriptors in this process (one
/// connection per concurrent call) — raise the soft limit to the hard one.
pub(crate) fn raise_nofile_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
}
