//! `drover-bench qemu-start [--iterations N]`: how long a qemu task takes from
//! StartTask until the guest's first serial line ("drover-guest: init started") is in
//! the task's stdout log, next to running the *same* `qemu-system-x86_64` command by
//! hand (spawn it, read its stdout until that line), in the same run.
//!
//! The guest is the VM rig's (`scripts/vm-rig.sh`: Debian cloud kernel, busybox
//! initramfs) under TCG. The by-hand command line is not rebuilt here: it is read from
//! `/proc/PID/cmdline` (and `/proc/PID/cwd`) of the qemu process the driver started
//! for the first task, so both sides boot exactly the same VM. The two alternate ABBA
//! (driver, by hand, by hand, driver per round), so that a machine that slows down over
//! the run hits both alike. Each VM is destroyed or killed (untimed) before the next.
//!
//! The driver side is the real plugin binary (`drover-driver-qemu`) driven through the
//! SDK client, as the agent drives it; its serial console goes through the executor's
//! log pipe into the rotated stdout files, which are watched every
//! [`LOG_POLL`] (a fifth of a percent of a boot), reading only what was added.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_plugin_sdk::{Resources, TaskSpec};
use drover_test_support::vm::{self, GUEST_STARTED};
use tokio::io::AsyncReadExt as _;

use crate::exec_start::{Driver, launch, signed_ms};
use crate::{ms, sibling_binary, stats};

/// How often the task's stdout log is looked at.
const LOG_POLL: Duration = Duration::from_millis(5);
/// A boot that takes longer than this is a failure, not a sample.
const BOOT_LIMIT: Duration = Duration::from_secs(120);
/// Guest memory, the same on both sides (the driver's `memory_mb`).
const MEMORY_MB: i64 = 256;
/// Most serial output read by hand before the first line must have come.
const SERIAL_LIMIT: usize = 1 << 20;

/// The command the driver ran: argv and working directory.
struct QemuCommand {
    argv: Vec<OsString>,
    cwd: PathBuf,
}

impl std::fmt::Display for QemuCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let words: Vec<String> = self
            .argv
            .iter()
            .map(|w| {
                let w = w.to_string_lossy();
                if w.is_empty() || w.contains(|c: char| c.is_whitespace() || "'\"$\\".contains(c)) {
                    format!("'{}'", w.replace('\'', r"'\''"))
                } else {
                    w.into_owned()
                }
            })
            .collect();
        write!(f, "(cd {} && {})", self.cwd.display(), words.join(" "))
    }
}

pub(crate) async fn run(iterations: usize) -> anyhow::Result<()> {
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let Some(rig) = vm::rig() else {
        bail!("the VM rig is missing (see the SKIPPED line above): run scripts/vm-rig.sh");
    };
    let bin = sibling_binary("drover-driver-qemu", "drover-driver-qemu")?;
    let root = tempfile::Builder::new()
        .prefix("drover-bench-qemu")
        .tempdir()?;
    let image_dirs: Vec<&Path> = [&rig.kernel, &rig.initrd]
        .iter()
        .filter_map(|p| p.parent())
        .collect();
    let task_config = serde_json::json!({
        "kernel": rig.kernel,
        "initrd": rig.initrd,
        "append": rig.append(&[]),
        "accelerator": "tcg",
        "machine": "q35",
    });
    let driver = launch(
        "qemu",
        &bin,
        root.path(),
        serde_json::json!({ "image_paths": image_dirs }),
        task_config.clone(),
    )
    .await?;

    // The first task is the warm-up of the driver side and where the command comes from.
    let warm_up = driver_once(&driver, &task_config, root.path(), 1_000_000, true).await?;
    let command = warm_up
        .command
        .context("the command line of the driver's qemu")?;
    println!("qemu-start: the driver's qemu command line, run by hand as is:");
    println!("  {command}");
    by_hand_once(&command, root.path()).await?; // warm-up of the by-hand side

    let mut a = Vec::with_capacity(2 * iterations);
    let mut b = Vec::with_capacity(2 * iterations);
    let mut rpc = Vec::with_capacity(2 * iterations);
    // Per round, (A1 + A2 - B1 - B2) / 2: what is left of the difference when the
    // machine's load over the round is the same for both.
    let mut round_diffs = Vec::with_capacity(iterations);
    for n in 0..iterations {
        let a1 = driver_once(&driver, &task_config, root.path(), 2 * n, false).await?;
        let b1 = by_hand_once(&command, root.path()).await?;
        let b2 = by_hand_once(&command, root.path()).await?;
        let a2 = driver_once(&driver, &task_config, root.path(), 2 * n + 1, false).await?;
        round_diffs.push(
            (a1.booted.as_secs_f64() + a2.booted.as_secs_f64()
                - b1.as_secs_f64()
                - b2.as_secs_f64())
                / 2.0,
        );
        a.extend([a1.booted, a2.booted]);
        rpc.extend([a1.start_task, a2.start_task]);
        b.extend([b1, b2]);
    }
    driver.process.shutdown().await;
    round_diffs.sort_by(f64::total_cmp);
    let round_median = round_diffs[round_diffs.len() / 2];

    let ratio = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64();
    let (samples_a, samples_b) = (a.len(), b.len());
    let (a, b, rpc) = (stats(a), stats(b), stats(rpc));
    println!(
        "qemu-start benchmark: {samples_a} driver starts and {samples_b} by-hand runs (ABBA), \
         until the guest's first serial line {GUEST_STARTED:?}; guest: {} + {}, TCG, {MEMORY_MB} MiB",
        rig.kernel.display(),
        rig.initrd.display()
    );
    let line = |what: &str, s: &crate::Stats| {
        println!(
            "  {what}: median {}  p90 {}  min {}",
            ms(s.median),
            ms(s.p90),
            ms(s.min)
        );
    };
    line("driver: StartTask -> line in the task's stdout log", &a);
    line("by hand: spawn qemu -> line on its stdout        ", &b);
    line("  of which StartTask itself returned after      ", &rpc);
    let (median, p90) = (ratio(a.median, b.median), ratio(a.p90, b.p90));
    println!("  ratio driver/by hand: median {median:.3}  p90 {p90:.3}");
    println!(
        "  driver - by hand: median {}, median of ABBA round differences {:+.1} ms",
        signed_ms(a.median, b.median),
        round_median * 1000.0
    );
    println!(
        "  goal (median within 5 % of by hand): {}",
        if median <= 1.05 { "met" } else { "NOT met" }
    );
    Ok(())
}

/// One driver-side sample.
struct DriverRun {
    /// StartTask until [`GUEST_STARTED`] is in the stdout log.
    booted: Duration,
    /// StartTask until it returned.
    start_task: Duration,
    /// The qemu command line, when asked for.
    command: Option<QemuCommand>,
}

/// One task through the driver: StartTask until [`GUEST_STARTED`] is in its stdout log.
/// With `capture`, also the command line of the qemu it started. The task is destroyed
/// (untimed) before returning.
async fn driver_once(
    driver: &Driver,
    config: &serde_json::Value,
    root: &Path,
    n: usize,
    capture: bool,
) -> anyhow::Result<DriverRun> {
    let id = format!("qemu-{n}");
    let task_dir = root.join("alloc").join(&id);
    for sub in ["local", "secrets", "tmp", "logs"] {
        std::fs::create_dir_all(task_dir.join(sub))?;
    }
    let stdout = task_dir.join("logs/stdout");
    let spec = TaskSpec::new(id.clone())
        .with_stdout_path(&stdout)
        .with_stderr_path(task_dir.join("logs/stderr"))
        .with_driver_config_json(config.to_string())
        .with_resources(Resources::default().with_memory_mb(MEMORY_MB))
        .with_task_dir(task_dir.clone());
    let t = Instant::now();
    driver
        .client
        .start_task(spec)
        .await
        .with_context(|| format!("StartTask {id}"))?;
    let start_task = t.elapsed();
    // The first log file, opened once and read incrementally: cheap enough at this
    // rate not to take CPU from the guest on a busy machine.
    let first_file = task_dir.join("logs/stdout.0");
    let mut log: Option<std::fs::File> = None;
    let mut seen = Vec::new();
    let booted = loop {
        if log.is_none() {
            log = std::fs::File::open(&first_file).ok();
        }
        if let Some(file) = log.as_mut() {
            std::io::Read::read_to_end(file, &mut seen)?;
            if contains(&seen, GUEST_STARTED.as_bytes()) {
                break Ok(t.elapsed());
            }
            if seen.len() > SERIAL_LIMIT {
                break Err(anyhow::anyhow!(
                    "task {id}: {SERIAL_LIMIT} bytes of serial output without {GUEST_STARTED:?}"
                ));
            }
        }
        if t.elapsed() > BOOT_LIMIT {
            break Err(anyhow::anyhow!(
                "task {id}: no {GUEST_STARTED:?} in its stdout log within {BOOT_LIMIT:?}; \
                 stderr: {}",
                drover_test_support::read_log(&task_dir.join("logs/stderr"))
            ));
        }
        tokio::time::sleep(LOG_POLL).await;
    };
    let pid = qemu_pid(driver, &id, &task_dir).await;
    let command = match (&booted, capture, &pid) {
        (Ok(_), true, Ok(pid)) => Some(command_of(*pid)?),
        _ => None,
    };
    driver
        .client
        .destroy_task(&id, true)
        .await
        .with_context(|| format!("DestroyTask {id}"))?;
    // The by-hand run may reuse the same socket paths: the VM must be gone first.
    if let Ok(pid) = pid {
        let gone = Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists()
            && drover_test_support::procs::alive(pid)
        {
            if gone.elapsed() > Duration::from_secs(10) {
                bail!("task {id}: qemu {pid} still runs 10 s after DestroyTask");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let booted = booted?;
    let _ = std::fs::remove_dir_all(&task_dir);
    Ok(DriverRun {
        booted,
        start_task,
        command,
    })
}

/// The pid of the task's qemu: InspectTask's `pid` attribute when it names a
/// `qemu-system-*` process, else the `qemu-system-*` process whose command line
/// mentions the task directory.
async fn qemu_pid(driver: &Driver, id: &str, task_dir: &Path) -> anyhow::Result<u32> {
    let is_qemu = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            let argv0 = c.split(|&b| b == 0).next().unwrap_or_default();
            Path::new(std::ffi::OsStr::from_bytes(argv0))
                .file_name()
                .is_some_and(|n| n.as_bytes().starts_with(b"qemu-system-"))
        })
    };
    let status = driver.client.inspect_task(id).await?;
    if let Some(pid) = status.attributes.get("pid").and_then(|p| p.parse().ok())
        && is_qemu(pid)
    {
        return Ok(pid);
    }
    let marker = task_dir.as_os_str().as_bytes();
    let mut found = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            is_qemu(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| contains(&c, marker))
        });
    found
        .next()
        .with_context(|| format!("task {id}: no qemu-system-* process found for it"))
}

fn command_of(pid: u32) -> anyhow::Result<QemuCommand> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("reading /proc/{pid}/cmdline"))?;
    let argv: Vec<OsString> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| std::ffi::OsStr::from_bytes(w).to_owned())
        .collect();
    if argv.is_empty() {
        bail!("qemu {pid} has an empty command line");
    }
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .with_context(|| format!("reading /proc/{pid}/cwd"))?;
    Ok(QemuCommand { argv, cwd })
}

/// Run `command` by hand until [`GUEST_STARTED`] is on its stdout; kill it (untimed).
async fn by_hand_once(command: &QemuCommand, root: &Path) -> anyhow::Result<Duration> {
    // Paths the driver put under its task directory (the QMP socket's) may be gone
    // with the task: their directories are made again, so qemu can bind there.
    for word in &command.argv {
        let word = word.to_string_lossy();
        for part in word.split([',', '=', ':']) {
            let path = Path::new(part);
            if path.is_absolute()
                && path.starts_with(root)
                && let Some(parent) = path.parent()
            {
                std::fs::create_dir_all(parent)?;
            }
        }
    }
    std::fs::create_dir_all(&command.cwd)?;
    let t = Instant::now();
    let mut child = tokio::process::Command::new(&command.argv[0])
        .args(&command.argv[1..])
        .current_dir(&command.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning {}", command.argv[0].to_string_lossy()))?;
    let mut stdout = child.stdout.take().context("qemu's stdout")?;
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    let wait = async {
        loop {
            let n = stdout.read(&mut chunk).await?;
            if n == 0 {
                bail!("qemu closed its stdout before {GUEST_STARTED:?}");
            }
            seen.extend_from_slice(&chunk[..n]);
            if contains(&seen, GUEST_STARTED.as_bytes()) {
                return Ok(());
            }
            if seen.len() > SERIAL_LIMIT {
                bail!("{SERIAL_LIMIT} bytes of serial output without {GUEST_STARTED:?}");
            }
        }
    };
    let result = tokio::time::timeout(BOOT_LIMIT, wait).await;
    let elapsed = t.elapsed();
    let _ = child.kill().await;
    match result {
        Ok(Ok(())) => Ok(elapsed),
        Ok(Err(e)) => {
            let mut err = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                let _ = (&mut stderr).take(4096).read_to_string(&mut err).await;
            }
            Err(e.context(format!("by-hand qemu: {}", err.trim())))
        }
        Err(_) => bail!("by-hand qemu: no {GUEST_STARTED:?} within {BOOT_LIMIT:?}"),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
