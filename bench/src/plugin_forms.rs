//! `drover-bench plugin-forms`: rawexec out of process against in process, from the
//! same source and the same release build, in one run.
//!
//! Three real agents (the release `drover` binary), each with rawexec in one form:
//! - **built-in**: no file in `plugin_dir`; the agent runs `drover plugin serve rawexec`
//!   as a plugin process (what an agent does by default);
//! - **external**: the `drover-driver-rawexec` binary in `plugin_dir` (a plugin process
//!   that shares no file with the agent, as a third-party driver's does);
//! - **in process**: `rawexec.so` (the cdylib) in `plugin_dir` with
//!   `[plugin.rawexec] in_process = true`.
//!
//! The other built-ins are in `plugin_deny`. Each agent's `plugin status` is checked
//! before anything is measured: the row serving rawexec must be the form the agent was
//! set up for (source, pid or `in_process`, the binary the plugin process runs), or the
//! run fails.
//!
//! Measured:
//! 1. memory: `Pss` of `/proc/<pid>/smaps_rollup` of the agent, the plugin process and
//!    the executors, idle once rawexec is healthy and again with `--tasks` sleeping
//!    tasks; one agent at a time (agents of the same binary share pages, which PSS would
//!    split between them), in the order A B C C B A;
//! 2. StartTask through each agent's API (`POST` → running), all three agents up, in
//!    A B C C B A rounds so that drift of the machine hits every form alike; each task
//!    is stopped and destroyed (untimed) before the next start;
//! 3. the driver's StartTask RPC alone, from this process through the SDK client:
//!    `PluginProcess` (the binary) against `InProcessPlugin` (the library), ABBA. Both
//!    use the rawexec binary as their executor (this bench cannot be one), so the
//!    difference is the transport;
//! 4. load time: `inproc-load` (sealed copy + `dlopen` + first fingerprint against
//!    launch + first fingerprint), run at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_api::{
    Client, PluginSource, PluginState, PluginStatus, RunRequest, StopRequest, TaskLifecycle,
};
use drover_plugin_sdk::client::{InProcessOptions, InProcessPlugin, sealed_copy};

use crate::exec_start::{Served, configure};
use crate::tasks::{
    AgentProc, cleanup, parent_pid, proc_kib, raise_nofile_limit, start_agent_with, terminate,
};
use crate::{Stats, ms, sibling_binary, stats};

/// The built-in drivers other than rawexec, denied so that each agent runs rawexec only.
const OTHER_BUILTINS: [&str; 4] = ["docker", "exec", "java", "qemu"];

/// How long an agent is left alone before its memory is read (its first fingerprints,
/// the loser of the plugin pick shut down, allocator caches settled).
const SETTLE: Duration = Duration::from_secs(2);

pub(crate) struct Options {
    pub(crate) tasks: usize,
    pub(crate) samples: usize,
    pub(crate) rpc_samples: usize,
    pub(crate) load_rounds: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    Builtin,
    External,
    InProcess,
}

const FORMS: [Form; 3] = [Form::Builtin, Form::External, Form::InProcess];

impl Form {
    fn label(self) -> &'static str {
        match self {
            Form::Builtin => "built-in (process)",
            Form::External => "external (process)",
            Form::InProcess => "in process (.so)",
        }
    }
}

/// The files the forms are made of, all from this build.
struct Build {
    drover: PathBuf,
    rawexec_bin: PathBuf,
    rawexec_lib: PathBuf,
}

/// An agent serving rawexec in one form.
struct FormAgent {
    form: Form,
    _root: tempfile::TempDir,
    agent: AgentProc,
    /// The plugin process, when the form has one.
    plugin_pid: Option<u32>,
}

impl FormAgent {
    async fn start(form: Form, build: &Build) -> anyhow::Result<FormAgent> {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::Builder::new()
            .prefix("drover-bench-forms-")
            .tempdir()?;
        let plugins = root.path().join("plugins");
        std::fs::create_dir(&plugins)?;
        std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o700))?;
        let deny = OTHER_BUILTINS.map(|n| format!("{n:?}")).join(", ");
        let mut config = format!("plugin_deny = [{deny}]\n");
        match form {
            // raw_exec runs nothing unless enabled (the in-process form says it under
            // the library's name below: both names at once are refused).
            Form::Builtin => config.push_str("[plugin.raw_exec]\nconfig = { enabled = true }\n"),
            Form::External => {
                config.push_str("[plugin.raw_exec]\nconfig = { enabled = true }\n");
                let to = plugins.join("drover-driver-rawexec");
                std::fs::copy(&build.rawexec_bin, &to)?;
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
            }
            Form::InProcess => {
                let to = plugins.join("rawexec.so");
                std::fs::copy(&build.rawexec_lib, &to)?;
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644))?;
                config
                    .push_str("[plugin.rawexec]\nin_process = true\nconfig = { enabled = true }\n");
            }
        }
        let config_file = root.path().join("agent.toml");
        std::fs::write(&config_file, config)?;
        let agent = start_agent_with(
            &build.drover,
            root.path(),
            &["--config".as_ref(), config_file.as_os_str()],
        )?;
        let mut started = FormAgent {
            form,
            _root: root,
            agent,
            plugin_pid: None,
        };
        match started.wait_served(build).await {
            Ok(pid) => started.plugin_pid = pid,
            Err(e) => {
                started.stop().await;
                return Err(e);
            }
        }
        Ok(started)
    }

    /// Until `plugin status` shows rawexec healthy in this agent's form and no other
    /// plugin process; the pid of the plugin process, if the form has one. A rawexec
    /// served in another form fails the run.
    async fn wait_served(&self, build: &Build) -> anyhow::Result<Option<u32>> {
        let deadline = Duration::from_secs(30);
        let t = Instant::now();
        loop {
            if let Ok(rows) = self.agent.api.plugins().await {
                let healthy: Vec<&PluginStatus> = rows
                    .iter()
                    .filter(|p| p.name == "raw_exec" && p.state == PluginState::Healthy)
                    .collect();
                if let [row] = healthy[..] {
                    self.check_form(row, build).with_context(|| {
                        format!(
                            "plugin status of the {} agent: {rows:#?}",
                            self.form.label()
                        )
                    })?;
                    let others = rows.iter().filter(|p| p.pid.is_some()).count()
                        - usize::from(row.pid.is_some());
                    if others == 0 {
                        return Ok(row.pid);
                    }
                }
            }
            if t.elapsed() > deadline {
                bail!(
                    "the {} agent did not serve rawexec alone within {deadline:?}; status: {:#?}",
                    self.form.label(),
                    self.agent.api.plugins().await
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The serving row is this agent's form, or an error saying what it is instead.
    fn check_form(&self, row: &PluginStatus, build: &Build) -> anyhow::Result<()> {
        let exe = row
            .pid
            .and_then(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).ok());
        let runs = |want: &Path| exe.as_deref() == want.canonicalize().ok().as_deref();
        let file_name = row.path.file_name().and_then(|n| n.to_str());
        let ok = match self.form {
            Form::Builtin => {
                row.source == PluginSource::Builtin
                    && !row.in_process
                    && row.pid.is_some()
                    && runs(&build.drover)
            }
            Form::External => {
                row.source == PluginSource::External
                    && !row.in_process
                    && row.pid.is_some()
                    && file_name == Some("drover-driver-rawexec")
                    && exe
                        .as_deref()
                        .and_then(Path::file_name)
                        .is_some_and(|n| n == "drover-driver-rawexec")
            }
            Form::InProcess => {
                row.source == PluginSource::External
                    && row.in_process
                    && row.pid.is_none()
                    && file_name == Some("rawexec.so")
            }
        };
        if !ok {
            bail!(
                "rawexec is not served {}: source {}, in_process {}, pid {:?} (runs {:?}), path {}",
                self.form.label(),
                row.source.as_str(),
                row.in_process,
                row.pid,
                exe,
                row.path.display()
            );
        }
        Ok(())
    }

    fn api(&self) -> &Client {
        &self.agent.api
    }

    fn pid(&self) -> u32 {
        self.agent.child.id()
    }

    /// Stop every task, then the agent (which drains).
    async fn stop(&mut self) {
        cleanup(&self.agent.api).await;
        terminate(&mut self.agent.child);
    }
}

fn sleeper(name: String) -> RunRequest {
    RunRequest {
        driver: "rawexec".into(),
        name: Some(name),
        config: serde_json::json!({"command": "/bin/sleep", "args": ["3600"]}),
        ..Default::default()
    }
}

/// Run a sleeping task through the agent's API; its task id and pid.
async fn run_sleeper(api: &Client, name: String) -> anyhow::Result<(String, u32)> {
    let view = api.run_task(&sleeper(name)).await?;
    if view.state != TaskLifecycle::Running {
        bail!(
            "task {} is {:?} after run, not running",
            view.id,
            view.state
        );
    }
    let pid = view
        .attributes
        .get("pid")
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("task {} has no pid attribute", view.id))?;
    Ok((view.id, pid))
}

async fn end_task(api: &Client, id: &str) -> anyhow::Result<()> {
    let stop = StopRequest {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    api.stop_task(id, &stop).await?;
    api.destroy_task(id, true).await?;
    Ok(())
}

fn pss(pid: u32) -> anyhow::Result<u64> {
    proc_kib(pid, "smaps_rollup", "Pss:").with_context(|| format!("no Pss for pid {pid}"))
}

/// PSS in KiB of one agent's processes at one moment.
#[derive(Default)]
struct Memory {
    agent: u64,
    plugin: u64,
    executors: u64,
    executor_count: usize,
}

impl Memory {
    fn total(&self) -> u64 {
        self.agent + self.plugin + self.executors
    }
}

struct MemoryRun {
    idle: Memory,
    loaded: Memory,
    /// KiB of memfd files the agent holds open (an in-process driver's sealed copy:
    /// shmem, resident for the agent's life), and the part of them in the agent's PSS
    /// (the pages its mappings touched); the rest is in no process's PSS.
    memfd: (u64, u64),
    /// The binary the executors run.
    executor_exe: String,
}

async fn measure_memory(form: Form, build: &Build, tasks: usize) -> anyhow::Result<MemoryRun> {
    let mut agent = FormAgent::start(form, build).await?;
    let result = memory_of(&agent, tasks).await;
    agent.stop().await;
    result
}

async fn memory_of(agent: &FormAgent, tasks: usize) -> anyhow::Result<MemoryRun> {
    let read = |executors: &[u32]| -> anyhow::Result<Memory> {
        let mut m = Memory {
            agent: pss(agent.pid())?,
            plugin: agent.plugin_pid.map(pss).transpose()?.unwrap_or(0),
            ..Default::default()
        };
        for pid in executors {
            m.executors += pss(*pid)?;
        }
        m.executor_count = executors.len();
        Ok(m)
    };
    tokio::time::sleep(SETTLE).await;
    let idle = read(&[])?;
    let mut executors = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let (id, pid) = run_sleeper(agent.api(), format!("mem-{i}")).await?;
        let executor = parent_pid(pid)
            .filter(|pp| *pp != 1 && Some(*pp) != agent.plugin_pid && *pp != agent.pid())
            .with_context(|| format!("task {id} (pid {pid}) has no executor process"))?;
        executors.push(executor);
    }
    tokio::time::sleep(SETTLE).await;
    let loaded = read(&executors)?;
    let executor_exe = executors
        .first()
        .and_then(|p| std::fs::read_link(format!("/proc/{p}/exe")).ok())
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into());
    Ok(MemoryRun {
        idle,
        loaded,
        memfd: memfd_kib(agent.pid())?,
        executor_exe,
    })
}

/// (size of the memfd files `pid` holds open, Pss of its mappings of them), in KiB.
fn memfd_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let is_memfd = |target: &str| target.starts_with("/memfd:");
    let mut held = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let path = entry?.path();
        if std::fs::read_link(&path).is_ok_and(|t| is_memfd(&t.to_string_lossy())) {
            held += std::fs::metadata(&path).map_or(0, |m| m.len()) / 1024;
        }
    }
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut in_memfd = false;
    let mut mapped = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: range perms offset dev inode [path].
            in_memfd = words.nth(4).is_some_and(is_memfd);
        } else if in_memfd && first == "Pss:" {
            mapped += words
                .next()
                .and_then(|k| k.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok((held, mapped))
}

pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    if opts.tasks == 0 || opts.samples < 2 || opts.rpc_samples < 2 || opts.load_rounds == 0 {
        bail!(
            "--tasks and --load-rounds must be at least 1, --samples and --rpc-samples at least 2"
        );
    }
    raise_nofile_limit();
    let build = Build {
        drover: sibling_binary("drover", "drover")?,
        rawexec_bin: sibling_binary("drover-driver-rawexec", "drover-driver-rawexec")?,
        rawexec_lib: crate::inproc_load::sibling_library()?,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!("plugin-forms benchmark: `{command}`");
    println!(
        "  drover {}\n  rawexec binary {}\n  rawexec library {}",
        build.drover.display(),
        build.rawexec_bin.display(),
        build.rawexec_lib.display()
    );

    // 1. Memory, one agent at a time, A B C C B A.
    let mut memory: Vec<(Form, MemoryRun)> = Vec::new();
    for form in FORMS.into_iter().chain(FORMS.into_iter().rev()) {
        eprintln!("memory: {}", form.label());
        memory.push((form, measure_memory(form, &build, opts.tasks).await?));
    }

    // 2. StartTask through the API, all three agents up.
    let mut agents = Vec::with_capacity(FORMS.len());
    for form in FORMS {
        match FormAgent::start(form, &build).await {
            Ok(a) => agents.push(a),
            Err(e) => {
                for a in &mut agents {
                    a.stop().await;
                }
                return Err(e);
            }
        }
    }
    let api_latency = api_latencies(&agents, opts.samples).await;
    for a in &mut agents {
        a.stop().await;
    }
    let api_latency = api_latency?;

    // 3. The driver's StartTask RPC alone, in this process.
    let rpc = rpc_latencies(&build, opts.rpc_samples).await?;

    print_memory(&memory, opts.tasks);
    println!(
        "StartTask through the agent API (POST /tasks -> running, `sleep 3600`), {} per form, ABCCBA:",
        opts.samples
    );
    let api: Vec<Stats> = api_latency.into_iter().map(stats).collect();
    println!("  {:<24} {:>12} {:>12} {:>12}", "", "p50", "p99", "min");
    for (form, s) in FORMS.iter().zip(&api) {
        latency_row(form.label(), s);
    }
    for (i, other) in [(0, "built-in"), (1, "external")] {
        println!(
            "  ratio in-process/{other}: p50 {:.2}x  p99 {:.2}x",
            secs_ratio(api[2].median, api[i].median),
            secs_ratio(api[2].p99, api[i].p99)
        );
    }
    let (process, library) = (stats(rpc.0), stats(rpc.1));
    println!(
        "StartTask RPC alone (SDK client in the bench, executor = rawexec binary for both), {} each, ABBA:",
        opts.rpc_samples
    );
    for (what, s) in [
        ("PluginProcess (binary)", &process),
        ("InProcessPlugin (.so)", &library),
    ] {
        latency_row(what, s);
    }
    println!(
        "  ratio in-process/process: p50 {:.2}x  p99 {:.2}x",
        secs_ratio(library.median, process.median),
        secs_ratio(library.p99, process.p99)
    );

    // 4. Load time.
    crate::inproc_load::run(opts.load_rounds).await
}

fn latency_row(what: &str, s: &Stats) {
    println!(
        "  {what:<24} {:>12} {:>12} {:>12}",
        ms(s.median),
        ms(s.p99),
        ms(s.min)
    );
}

fn secs_ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// StartTask latencies through each agent's API, in `FORMS` order, `samples` each.
async fn api_latencies(agents: &[FormAgent], samples: usize) -> anyhow::Result<Vec<Vec<Duration>>> {
    // Warm-up: page cache, the executor binary, each agent's first task.
    for a in agents {
        for n in 0..3 {
            let (id, _) = run_sleeper(a.api(), format!("warm-{n}")).await?;
            end_task(a.api(), &id).await?;
        }
    }
    let mut out = vec![Vec::with_capacity(samples); agents.len()];
    let mut n = 0;
    while out.iter().any(|v| v.len() < samples) {
        let order: Vec<usize> = if n % 2 == 0 {
            (0..agents.len()).collect()
        } else {
            (0..agents.len()).rev().collect()
        };
        for i in order {
            if out[i].len() == samples {
                continue;
            }
            let api = agents[i].api();
            let t = Instant::now();
            let (id, _) = run_sleeper(api, format!("lat-{n}")).await?;
            out[i].push(t.elapsed());
            end_task(api, &id).await?;
        }
        n += 1;
    }
    Ok(out)
}

/// StartTask RPC latencies: (the rawexec binary as a plugin process, the library loaded
/// into this process).
async fn rpc_latencies(
    build: &Build,
    samples: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let root = tempfile::Builder::new()
        .prefix("drover-bench-forms-rpc")
        .tempdir()?;
    let sleep = serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] });
    // raw_exec runs nothing unless enabled, as Nomad's (only `--dev` agents turn it on).
    let enabled = serde_json::json!({ "enabled": true });
    let process_root = root.path().join("process");
    let library_root = root.path().join("library");
    let process = crate::exec_start::launch(
        "rawexec",
        &build.rawexec_bin,
        &process_root,
        enabled.clone(),
        sleep.clone(),
    )
    .await?;
    let file = std::fs::File::open(&build.rawexec_lib)?;
    let sealed = sealed_copy(&file.into(), "rawexec")?;
    let mut load = InProcessOptions::new("rawexec", sealed, &build.rawexec_lib);
    load.executor = Some(build.rawexec_bin.clone());
    let library = configure(
        "rawexec",
        Served::Library(InProcessPlugin::load(load).await?),
        &library_root,
        enabled,
        sleep,
    )
    .await?;
    let mut a = Vec::with_capacity(samples);
    let mut b = Vec::with_capacity(samples);
    let result = async {
        for n in 0..3 {
            process.once(&process_root, 1_000_000 + n).await?;
            library.once(&library_root, 1_000_000 + n).await?;
        }
        for n in 0..samples.div_ceil(2) {
            let (first, second) = (2 * n, 2 * n + 1);
            a.push(process.once(&process_root, first).await?);
            b.push(library.once(&library_root, first).await?);
            b.push(library.once(&library_root, second).await?);
            a.push(process.once(&process_root, second).await?);
        }
        anyhow::Ok(())
    }
    .await;
    process.process.shutdown().await;
    library.process.shutdown().await;
    result?;
    a.truncate(samples);
    b.truncate(samples);
    Ok((a, b))
}

fn print_memory(runs: &[(Form, MemoryRun)], tasks: usize) {
    println!(
        "Memory: PSS (smaps_rollup) in MiB, one agent at a time, ABCCBA: mean of {} runs per form [min-max]",
        runs.len() / FORMS.len()
    );
    type Pick = fn(&MemoryRun) -> Option<u64>;
    let rows: [(&str, Pick); 7] = [
        ("idle: agent", |r| Some(r.idle.agent)),
        // No row for a form without a plugin process.
        ("idle: plugin process", |r| {
            (r.idle.plugin > 0).then_some(r.idle.plugin)
        }),
        ("idle: agent + plugin", |r| Some(r.idle.total())),
        ("tasks: agent + plugin", |r| {
            Some(r.loaded.agent + r.loaded.plugin)
        }),
        ("tasks: executors, sum", |r| Some(r.loaded.executors)),
        ("tasks: executor, each", |r| {
            (r.loaded.executor_count > 0)
                .then(|| r.loaded.executors / r.loaded.executor_count as u64)
        }),
        ("tasks: all", |r| Some(r.loaded.total())),
    ];
    println!(
        "  {:<28} {:>22} {:>22} {:>22}  {:>9} {:>9}",
        format!("({tasks} tasks)"),
        Form::Builtin.label(),
        Form::External.label(),
        Form::InProcess.label(),
        "in/built",
        "in/ext"
    );
    for (what, pick) in rows {
        let means: Vec<Option<(f64, u64, u64)>> = FORMS
            .iter()
            .map(|f| {
                let v: Vec<u64> = runs
                    .iter()
                    .filter(|(g, _)| g == f)
                    .filter_map(|(_, r)| pick(r))
                    .collect();
                (!v.is_empty()).then(|| {
                    let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
                    (
                        mean,
                        *v.iter().min().unwrap_or(&0),
                        *v.iter().max().unwrap_or(&0),
                    )
                })
            })
            .collect();
        let cell = |m: &Option<(f64, u64, u64)>| match m {
            Some((mean, lo, hi)) => format!(
                "{:.1} [{:.1}-{:.1}]",
                mean / 1024.0,
                *lo as f64 / 1024.0,
                *hi as f64 / 1024.0
            ),
            None => "-".into(),
        };
        let ratio = |other: &Option<(f64, u64, u64)>| match (&means[2], other) {
            (Some((a, ..)), Some((b, ..))) if *b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        println!(
            "  {what:<28} {:>22} {:>22} {:>22}  {:>9} {:>9}",
            cell(&means[0]),
            cell(&means[1]),
            cell(&means[2]),
            ratio(&means[0]),
            ratio(&means[1])
        );
    }
    let exes: Vec<String> = FORMS
        .iter()
        .filter_map(|f| {
            runs.iter()
                .find(|(g, _)| g == f)
                .map(|(_, r)| format!("{}: {}", f.label(), r.executor_exe))
        })
        .collect();
    println!("  executors run: {}", exes.join("; "));
    for (form, run) in runs.iter().filter(|(f, _)| *f == Form::InProcess).take(1) {
        let (held, mapped) = run.memfd;
        println!(
            "  {}: the agent holds {:.1} MiB of sealed library copy (memfd, shmem); {:.1} MiB of it \
             is in its PSS above, {:.1} MiB in no process's PSS",
            form.label(),
            held as f64 / 1024.0,
            mapped as f64 / 1024.0,
            held.saturating_sub(mapped) as f64 / 1024.0
        );
    }
}
