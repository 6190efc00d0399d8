//! `cargo run --release -p drover-bench -- handshake [--iterations N]`
//! `cargo run --release -p drover-bench -- tasks [--count N]`
//! `cargo run --release -p drover-bench -- docker-start [--count N] [--docker-host URL]`
//! `cargo run --release -p drover-bench -- exec-start [--iterations N]` (as root)
//! `cargo run --release -p drover-bench -- rawexec-start [--iterations N]` (as root)
//! `cargo run --release -p drover-bench -- inproc-load [--iterations N]`
//! `cargo run --release -p drover-bench -- plugin-forms [--tasks N] [--samples N]
//!   [--rpc-samples N] [--load-rounds N]`
//! `cargo run --release -p drover-bench -- qemu-start [--iterations N]` (needs the VM rig)
//! `cargo run --release -p drover-bench -- nomad-drivers [--launches N] [--samples N]
//!   [--tasks N] [--raw-exec PATH]` (Nomad 1.0.18's raw_exec against Drover's)
//! `cargo run --release -p drover-bench -- schedule [--nodes N] [--allocs N] [--jobs N]
//!   [--stores both|embedded|etcd] [--etcd-endpoints URL,…] [--ports [--rounds N]]`
//!
//! `handshake` launches the rawexec plugin N times per transport (plain h2c, go-plugin
//! AutoMTLS, go-plugin 1.6 broker multiplexing) and measures launch → handshake →
//! connect → first RPC (`PluginInfo`), then `GRPCController.Shutdown` → exit observed,
//! next to spawning `/bin/true` and waiting for it (the process-spawn floor on this
//! machine), all interleaved in the same run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};

mod cluster;
mod docker;
mod exec_start;
mod inproc_load;
mod nomad_drivers;
mod plugin_forms;
mod qemu_start;
mod rawexec_start;
mod schedule;
mod tasks;
mod vs_nomad;

#[derive(Parser)]
#[command(name = "drover-bench")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Plugin launch-to-first-RPC latency against the spawn floor.
    Handshake {
        /// How many launches (and as many /bin/true spawns).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Plugin binary (default: drover-driver-rawexec next to this binary, built if missing).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Log each launch's phases (spawn to handshake line, connected).
        #[arg(long)]
        verbose: bool,
        /// Which transports to launch with, comma-separated (to profile one alone;
        /// the ratio to the floor is printed for `plain`).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = Transport::ALL)]
        transports: Vec<Transport>,
    },
    /// Start N sleeping rawexec tasks through a real agent: throughput, latency,
    /// memory, idle CPU, and reattach time after `kill -9` of the agent.
    Tasks {
        /// How many tasks.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// StartTask calls in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// Docker task start latency (plugin StartTask and agent API) against
    /// `docker run -d` on the same daemon.
    DockerStart {
        /// Containers started each way.
        #[arg(long, default_value_t = 50)]
        count: usize,
        /// Docker daemon (default: DROVER_TEST_DOCKER_HOST, DOCKER_HOST, or
        /// unix:///var/run/docker.sock).
        #[arg(long)]
        docker_host: Option<String>,
        /// Image to run `sleep 3600` in; must be on the daemon.
        #[arg(long, default_value = "drover-test/busybox:latest")]
        image: String,
    },
    /// StartTask -> running of isolated exec tasks against rawexec tasks and exec tasks
    /// without the seccomp filter, interleaved in one run (needs root).
    ExecStart {
        /// Tasks per driver.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// StartTask -> running of rawexec tasks in a cgroup of their own against
    /// process-group-only ones (`no_cgroups`), ABBA-interleaved in one run (needs root).
    RawexecStart {
        /// Tasks per variant.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// rawexec loaded in process (sealed copy, dlopen, start, health, first
    /// fingerprint) against launched as a process (spawn, handshake, connect, first
    /// fingerprint), ABBA-interleaved in one run.
    InprocLoad {
        /// Rounds; each loads the library twice and launches the binary twice. Every
        /// load stays in memory (a library is never unloaded): keep it small.
        #[arg(long, default_value_t = 10)]
        iterations: usize,
    },
    /// rawexec built-in, external binary and in process (`.so`), three real agents in
    /// one run: agent + plugin + executor memory (PSS) idle and with tasks, StartTask
    /// latency through the API and of the RPC alone, and load time (`inproc-load`).
    PluginForms {
        /// Sleeping tasks per agent for the loaded memory reading.
        #[arg(long, default_value_t = 20)]
        tasks: usize,
        /// StartTask calls through each agent's API.
        #[arg(long, default_value_t = 200)]
        samples: usize,
        /// StartTask RPCs to each form from this process.
        #[arg(long, default_value_t = 200)]
        rpc_samples: usize,
        /// Rounds of `inproc-load` at the end.
        #[arg(long, default_value_t = 5)]
        load_rounds: usize,
    },
    /// StartTask of a qemu task -> the guest's first serial line in the task's stdout
    /// log, against the same qemu command line run by hand, ABBA-interleaved in one run
    /// (needs the VM rig of scripts/vm-rig.sh).
    QemuStart {
        /// Rounds; each boots two VMs through the driver and two by hand.
        #[arg(long, default_value_t = 10)]
        iterations: usize,
    },
    /// Placements per second of an in-process server (real redb store, then the etcd
    /// store; simulated nodes), store commits included, against each store's own
    /// commit rate.
    Schedule {
        /// Simulated nodes.
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        /// Allocations to place in total.
        #[arg(long, default_value_t = 100_000)]
        allocs: usize,
        /// Jobs the allocations are split over (one group each).
        #[arg(long, default_value_t = 100)]
        jobs: usize,
        /// Scheduler workers (default: one per core).
        #[arg(long)]
        workers: Option<usize>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// The stores to measure, one after the other.
        #[arg(long, value_enum, default_value_t = schedule::Stores::Both)]
        stores: schedule::Stores,
        /// etcd endpoints for the etcd store's run (`http://HOST:PORT`, comma
        /// separated); default: start a private etcd.
        #[arg(long, value_delimiter = ',')]
        etcd_endpoints: Option<Vec<String>>,
        /// Instead: the placement rate with two dynamic ports per allocation against
        /// the rate without, alternated over `--rounds` rounds on the embedded store.
        #[arg(long)]
        ports: bool,
        /// Rounds of the `--ports` comparison.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Nomad 1.0.18's raw_exec (an unmodified Nomad driver, through the bridge) against
    /// Drover's raw_exec, in one run: launch -> handshake -> first fingerprint, StartTask
    /// -> running through a real agent per driver (both are named raw_exec), and memory
    /// per running task (executor, log relay; the task apart).
    NomadDrivers {
        /// Plugin launches per driver.
        #[arg(long, default_value_t = 20)]
        launches: usize,
        /// StartTask calls through the agent's API per driver.
        #[arg(long, default_value_t = 40)]
        samples: usize,
        /// Sleeping tasks per driver for the memory reading.
        #[arg(long, default_value_t = 10)]
        tasks: usize,
        /// Nomad's raw_exec plugin binary (default: the test peers archive's, unpacked
        /// and checked by drover-test-support).
        #[arg(long)]
        raw_exec: Option<PathBuf>,
    },
    /// From submitting jobs to every allocation reported running by simulated clients
    /// over gRPC (in-process server, real store), against placement alone.
    Cluster {
        /// Simulated clients, each with its own gRPC connection.
        #[arg(long, default_value_t = 1000)]
        clients: usize,
        /// Allocations in total.
        #[arg(long, default_value_t = 10_000)]
        allocs: usize,
        /// Jobs the allocations are split over.
        #[arg(long, default_value_t = 10)]
        jobs: usize,
    },
    /// One job of N raw_exec `sleep` tasks on a Nomad 1.0.18 dev agent and on a Drover
    /// dev agent, one after the other: registration -> all allocations running, and the
    /// runtime's memory (PSS of agent, plugins, executors, log relays; tasks apart) idle
    /// and with the tasks, per task, with the ratios Drover / Nomad.
    VsNomad {
        /// Allocations of the job (`count`).
        #[arg(long, default_value_t = 100)]
        tasks: usize,
        /// Rounds; the order alternates (Nomad first in odd rounds); medians reported.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// The Nomad agent (default: the test peers archive's, unpacked and checked
        /// against its SHA256SUMS).
        #[arg(long)]
        nomad: Option<PathBuf>,
        /// The drover binary (default: the one next to this binary).
        #[arg(long)]
        drover: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cpu_before = CpuTimes::read();
    let result = run_bench(Cli::parse().bench);
    if let (Some(before), Some(after)) = (cpu_before, CpuTimes::read()) {
        println!("{}", after.since(&before).steal_note());
    }
    result
}

/// The machine's CPU time counters from `/proc/stat`, in clock ticks: how much of the
/// run the hypervisor gave to other guests (`steal`). On a contended VM every latency
/// and rate here is worse, the baseline's included, and figures from runs with much
/// steal cannot be compared with each other.
#[derive(Debug, Clone, Copy)]
struct CpuTimes {
    total: u64,
    steal: u64,
}

impl CpuTimes {
    fn read() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat
            .lines()
            .find(|l| l.starts_with("cpu "))?
            .split_whitespace()
            .skip(1)
            .map_while(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest counts are in user).
        Some(CpuTimes {
            total: fields.iter().take(8).sum(),
            steal: *fields.get(7)?,
        })
    }

    fn since(&self, before: &CpuTimes) -> CpuTimes {
        CpuTimes {
            total: self.total.saturating_sub(before.total),
            steal: self.steal.saturating_sub(before.steal),
        }
    }

    fn steal_note(&self) -> String {
        let percent = self.steal as f64 * 100.0 / self.total.max(1) as f64;
        format!(
            "machine: {percent:.1} % of CPU time over this run was stolen by the hypervisor \
             (steal in /proc/stat){}",
            if percent >= 5.0 {
                "; figures from a run with this much steal are not comparable with others"
            } else {
                ""
            }
        )
    }
}

fn run_bench(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Handshake {
            iterations,
            plugin,
            verbose,
            transports,
        } => {
            if verbose {
                tracing_subscriber::fmt()
                    .with_env_filter("drover_plugin_sdk=debug")
                    .with_writer(std::io::stderr)
                    .init();
            }
            let plugin = match plugin {
                Some(p) => p,
                None => sibling_binary("drover-driver-rawexec", "drover-driver-rawexec")?,
            };
            // The same runtime flavour as the agent (see host/src/main.rs).
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(handshake(&plugin, iterations, &transports))
        }
        Bench::Tasks { count, concurrency } => {
            let drover = sibling_binary("drover", "drover")?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(tasks::run(&drover, count, concurrency))
        }
        Bench::DockerStart {
            count,
            docker_host,
            image,
        } => {
            let plugin = sibling_binary("drover-driver-docker", "drover-driver-docker")?;
            let drover = sibling_binary("drover", "drover")?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(docker::run(
                &plugin,
                &drover,
                docker::Options {
                    count,
                    docker_host: docker_host.unwrap_or_else(docker::default_host),
                    image,
                },
            ))
        }
        Bench::ExecStart { iterations } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(exec_start::run(iterations))
        }
        Bench::Schedule {
            nodes,
            allocs,
            jobs,
            workers,
            timeout_secs,
            stores,
            etcd_endpoints,
            ports,
            rounds,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(schedule::run(schedule::Options {
                nodes,
                allocs,
                jobs,
                workers,
                timeout: std::time::Duration::from_secs(timeout_secs),
                stores,
                etcd_endpoints,
                ports,
                rounds,
            }))
        }
        Bench::Cluster {
            clients,
            allocs,
            jobs,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(cluster::run(clients, allocs, jobs))
        }
        Bench::RawexecStart { iterations } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(rawexec_start::run(iterations))
        }
        Bench::InprocLoad { iterations } => {
            // The same runtime flavour as the agent.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(inproc_load::run(iterations))
        }
        Bench::PluginForms {
            tasks,
            samples,
            rpc_samples,
            load_rounds,
        } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(plugin_forms::run(plugin_forms::Options {
                tasks,
                samples,
                rpc_samples,
                load_rounds,
            }))
        }
        Bench::NomadDrivers {
            launches,
            samples,
            tasks,
            raw_exec,
        } => {
            // The same runtime flavour as the agent.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(nomad_drivers::run(nomad_drivers::Options {
                launches,
                samples,
                tasks,
                raw_exec,
            }))
        }
        Bench::VsNomad {
            tasks,
            rounds,
            nomad,
            drover,
        } => {
            let drover = match drover {
                Some(p) => p,
                None => sibling_binary("drover", "drover")?,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(vs_nomad::run(vs_nomad::Options {
                tasks,
                rounds,
                nomad,
                drover,
            }))
        }
        Bench::QemuStart { iterations } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(qemu_start::run(iterations))
        }
    }
}

/// The binary `name` from this workspace, next to the running bench (same profile).
/// Built with cargo when missing, since `cargo run -p drover-bench` builds only the bench.
fn sibling_binary(package: &str, name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("bench binary has no directory")?;
    let path = dir.join(name);
    if !path.exists() {
        let release = dir.ends_with("release");
        eprintln!(
            "building {name} ({})",
            if release { "release" } else { "debug" }
        );
        let mut cmd =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-p", package, "--bin", name]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().context("running cargo build")?;
        if !status.success() || !path.exists() {
            bail!("could not build {name}; build it with `cargo build --release -p {package}`");
        }
    }
    Ok(path)
}

pub(crate) struct Stats {
    pub(crate) median: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
    pub(crate) min: Duration,
}

pub(crate) fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        min: samples[0],
    }
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

async fn handshake(
    plugin: &Path,
    iterations: usize,
    transports: &[Transport],
) -> anyhow::Result<()> {
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if transports.is_empty() {
        bail!("--transports names none");
    }
    let socket_dir = tempfile::Builder::new()
        .prefix("drover-bench-")
        .tempdir()
        .context("make the socket dir")?;
    // One warm-up of each, so page cache and dynamic loader state are the same for all.
    for &transport in transports {
        launch_once(plugin, socket_dir.path(), transport).await?;
    }
    std::process::Command::new("/bin/true").status()?;

    let mut launch_samples: Vec<Vec<Duration>> = transports
        .iter()
        .map(|_| Vec::with_capacity(iterations))
        .collect();
    let mut shutdown_samples = Vec::with_capacity(iterations * transports.len());
    let mut spawn_samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let status = tokio::process::Command::new("/bin/true").status().await?;
        spawn_samples.push(t.elapsed());
        if !status.success() {
            bail!("/bin/true failed: {status}");
        }
        // Interleaved, so that drift on the machine touches every form alike.
        for (i, transport) in transports.iter().enumerate() {
            let (launch, shutdown) = launch_once(plugin, socket_dir.path(), *transport).await?;
            launch_samples[i].push(launch);
            shutdown_samples.push(shutdown);
        }
    }
    let s = stats(spawn_samples);
    println!(
        "handshake benchmark: {iterations} iterations, plugin {} ({})",
        plugin.display(),
        linkage(plugin)
    );
    let medians: Vec<(Transport, Stats)> = transports
        .iter()
        .zip(launch_samples)
        .map(|(t, samples)| (*t, stats(samples)))
        .collect();
    let plain_median = medians
        .iter()
        .find(|(t, _)| *t == Transport::Plain)
        .map(|(_, p)| p.median);
    for (transport, p) in &medians {
        let vs_plain = match plain_median {
            Some(plain) if *transport != Transport::Plain => format!(
                "  ({:.2}x plain)",
                p.median.as_secs_f64() / plain.as_secs_f64()
            ),
            _ => String::new(),
        };
        println!(
            "  launch -> handshake -> PluginInfo, {:<19} median {}  p99 {}  min {}{vs_plain}",
            transport.label(),
            ms(p.median),
            ms(p.p99),
            ms(p.min)
        );
    }
    let d = stats(shutdown_samples);
    println!(
        "  GRPCController.Shutdown -> exit observed:        median {}  p99 {}  min {}",
        ms(d.median),
        ms(d.p99),
        ms(d.min)
    );
    println!(
        "  spawn+wait /bin/true (floor):                    median {}  p99 {}  min {}",
        ms(s.median),
        ms(s.p99),
        ms(s.min)
    );
    if let Some(plain) = plain_median {
        println!(
            "  ratio plain launch/floor: median {:.2}x",
            plain.as_secs_f64() / s.median.as_secs_f64()
        );
    }
    Ok(())
}

/// How the binary at `path` is linked, for the report: a plugin linked static-pie
/// (`scripts/build-plugins.sh`) launches faster than cargo's usual dynamically linked
/// build, and a figure must say which it is.
fn linkage(path: &Path) -> String {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let Ok(data) = std::fs::read(path) else {
        return "unreadable".into();
    };
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(&*data) else {
        return "not a 64-bit ELF file".into();
    };
    let Ok(endian) = header.endian() else {
        return "ELF of unknown byte order".into();
    };
    let Ok(segments) = header.program_headers(endian, &*data) else {
        return "ELF without readable program headers".into();
    };
    let interpreted = segments
        .iter()
        .any(|s| s.p_type(endian) == object::elf::PT_INTERP);
    match (interpreted, header.e_type(endian) == object::elf::ET_DYN) {
        (true, _) => "dynamically linked; scripts/build-plugins.sh links it static-pie".into(),
        (false, true) => "static-pie".into(),
        (false, false) => "static, not position independent".into(),
    }
}

/// How the host talks to the plugin.
#[derive(Debug, Clone, Copy, PartialEq, ValueEnum)]
enum Transport {
    /// h2c on the unix socket.
    Plain,
    /// go-plugin AutoMTLS: a P-521 certificate made on each side, TLS on the socket.
    #[value(name = "automtls")]
    AutoMtls,
    /// go-plugin 1.6 broker multiplexing: gRPC in a yamux stream.
    #[value(name = "yamux")]
    Multiplex,
}

impl Transport {
    const ALL: [Transport; 3] = [Transport::Plain, Transport::AutoMtls, Transport::Multiplex];

    fn label(self) -> &'static str {
        match self {
            Transport::Plain => "plain:",
            Transport::AutoMtls => "AutoMTLS:",
            Transport::Multiplex => "yamux:",
        }
    }

    fn apply(self, opts: &mut LaunchOptions) {
        match self {
            Transport::Plain => {}
            Transport::AutoMtls => opts.auto_mtls = true,
            Transport::Multiplex => opts.multiplex_grpc = true,
        }
    }
}

/// Launch, handshake, first RPC; returns the time that took and the time from the
/// Shutdown call to the exit being observed.
async fn launch_once(
    plugin: &Path,
    socket_dir: &Path,
    transport: Transport,
) -> anyhow::Result<(Duration, Duration)> {
    let mut opts = LaunchOptions::new("bench", plugin);
    opts.socket_dir = Some(socket_dir.to_owned());
    transport.apply(&mut opts);
    let t = Instant::now();
    let process = LaunchedPlugin::launch(opts).await?;
    // Bounded: a plugin may take the connection and never answer.
    let info =
        match tokio::time::timeout(Duration::from_secs(10), process.client().plugin_info()).await {
            Ok(Ok(info)) => info,
            failed => {
                process.kill().await;
                match failed {
                    Ok(Err(e)) => bail!("PluginInfo failed: {e}"),
                    _ => bail!("the plugin did not answer PluginInfo within 10 s"),
                }
            }
        };
    let elapsed = t.elapsed();
    if info.name.is_empty() {
        bail!("plugin answered PluginInfo without a name");
    }
    let t = Instant::now();
    let outcome = process.shutdown().await;
    let shutdown = t.elapsed();
    if shutdown >= drover_plugin_sdk::client::SHUTDOWN_GRACE {
        bail!("the plugin did not exit after Shutdown within the grace ({outcome})");
    }
    Ok((elapsed, shutdown))
}

/// A plugin process this bench launched. Plugins outlive their host on purpose (the
/// next agent reattaches), so a run that fails half-way (a `?` between the launch and
/// the `shutdown`) would leave them running: one that is dropped before it exited is
/// killed instead, with its process group (the plugin and its spawner). Executors, and
/// the tasks they hold, are sessions of their own and are not reached: a run destroys
/// its tasks itself. A clone of the inner `PluginProcess` has no such guard.
pub(crate) struct LaunchedPlugin(PluginProcess);

impl LaunchedPlugin {
    /// [`PluginProcess::launch`], killed when dropped before it exited.
    pub(crate) async fn launch(
        opts: LaunchOptions,
    ) -> Result<Self, drover_plugin_sdk::client::LaunchError> {
        PluginProcess::launch(opts).await.map(LaunchedPlugin)
    }
}

impl std::ops::Deref for LaunchedPlugin {
    type Target = PluginProcess;

    fn deref(&self) -> &PluginProcess {
        &self.0
    }
}

impl Drop for LaunchedPlugin {
    fn drop(&mut self) {
        // Sends nothing once the plugin has exited (its pid may be another's by then).
        self.0.start_kill();
    }
}

/// What creating a file costs where the bench keeps its data (`$TMPDIR`), measured
/// now: 200 `mkdir`s in a scratch directory, removed again. Every task start creates
/// about a dozen inodes (task and log directories, log files, the executor's files),
/// on either side of a comparison; on an ext4 without a journal that has just deleted
/// many files the cost grows tenfold for minutes (it will not reuse an inode deleted
/// in the last 60 s and searches for another), and figures taken then say more about
/// the filesystem than about the runtime.
pub(crate) fn fs_note() -> String {
    let base = std::env::temp_dir();
    let Ok(scratch) = tempfile::Builder::new()
        .prefix("drover-bench-fs-")
        .tempdir_in(&base)
    else {
        return format!("filesystem of {}: cannot measure", base.display());
    };
    const N: u32 = 200;
    let t = Instant::now();
    for i in 0..N {
        if std::fs::create_dir(scratch.path().join(i.to_string())).is_err() {
            return format!("filesystem of {}: cannot measure", base.display());
        }
    }
    let each = t.elapsed() / N;
    format!(
        "filesystem of {} ($TMPDIR): {:.0} us per mkdir, now",
        base.display(),
        each.as_secs_f64() * 1e6
    )
}
