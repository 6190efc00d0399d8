//! `drover-bench inproc-load [--iterations N]`: how long rawexec takes to become usable
//! in each form, ABBA-interleaved in one run:
//!
//! - in process: open the `.so`, sealed copy (memfd), `dlopen`, start its runtime,
//!   first health answer (`InProcessPlugin::load`), then the first `Fingerprint`;
//! - as a process: spawn, handshake, connect (`PluginProcess::launch`, which makes
//!   no RPC of its own), then the first `Fingerprint`.
//!
//! Also reported alone: the sealed copy (proportional to the library's size) and
//! `load` without it. Every in-process load leaves its library in this process (a
//! library is never unloaded, and its memfd stays open), as in an agent, so the run
//! grows by the library's size per iteration: keep N small.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_plugin_sdk::client::{
    InProcessOptions, InProcessPlugin, LaunchOptions, PluginClient, sealed_copy,
};
use tokio_stream::StreamExt as _;

use crate::{LaunchedPlugin, ms, sibling_binary, stats};

/// The library's file name as cargo builds it.
const LIBRARY: &str = "libdrover_driver_rawexec.so";

pub(crate) async fn run(iterations: usize) -> anyhow::Result<()> {
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let bin = sibling_binary("drover-driver-rawexec", "drover-driver-rawexec")?;
    let lib = sibling_library()?;
    let size = std::fs::metadata(&lib)?.len();
    // Warm-up: page cache for both files, the dynamic loader's first run.
    load_once(&lib, &bin).await?;
    launch_once(&bin).await?;
    let mut copies = Vec::with_capacity(iterations * 2);
    let mut loads = Vec::with_capacity(iterations * 2);
    let mut in_process = Vec::with_capacity(iterations * 2);
    let mut process = Vec::with_capacity(iterations * 2);
    let mut load = async |copies: &mut Vec<Duration>, loads: &mut Vec<Duration>| {
        let t = load_once(&lib, &bin).await?;
        copies.push(t.copy);
        loads.push(t.load);
        in_process.push(t.total);
        anyhow::Ok(())
    };
    for _ in 0..iterations {
        load(&mut copies, &mut loads).await?;
        process.push(launch_once(&bin).await?);
        process.push(launch_once(&bin).await?);
        load(&mut copies, &mut loads).await?;
    }
    let (c, l, i, p) = (
        stats(copies),
        stats(loads),
        stats(in_process),
        stats(process),
    );
    println!(
        "inproc-load benchmark: rawexec, {} rounds of each form (ABBA); library {} ({:.1} MiB)",
        iterations * 2,
        lib.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    let row = |what: &str, s: &crate::Stats| {
        println!(
            "  {what:<58} median {}  p90 {}  min {}",
            ms(s.median),
            ms(s.p90),
            ms(s.min)
        );
    };
    row(
        "in process: open + sealed copy + load + first Fingerprint",
        &i,
    );
    row("process: launch + first Fingerprint", &p);
    row("  in process, the sealed copy alone", &c);
    row("  in process, load alone (dlopen, start, health)", &l);
    println!(
        "  ratio in-process/process: median {:.2}x",
        i.median.as_secs_f64() / p.median.as_secs_f64()
    );
    Ok(())
}

/// `libdrover_driver_rawexec.so` next to this binary (same profile), built when
/// missing.
pub(crate) fn sibling_library() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("bench binary has no directory")?;
    let path = dir.join(LIBRARY);
    if !path.exists() {
        let release = dir.ends_with("release");
        eprintln!("building {LIBRARY}");
        let mut cmd =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-p", "drover-driver-rawexec", "--lib"]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().context("running cargo build")?;
        if !status.success() || !path.exists() {
            bail!(
                "could not build {LIBRARY}; build it with `cargo build --release -p drover-driver-rawexec`"
            );
        }
    }
    Ok(path)
}

struct LoadTimes {
    copy: Duration,
    load: Duration,
    total: Duration,
}

async fn load_once(lib: &Path, executor: &Path) -> anyhow::Result<LoadTimes> {
    let t = Instant::now();
    let file = std::fs::File::open(lib)?;
    let sealed = sealed_copy(&file.into(), "rawexec")?;
    let copy = t.elapsed();
    let mut opts = InProcessOptions::new("rawexec", sealed, lib);
    opts.executor = Some(executor.to_owned());
    let plugin = InProcessPlugin::load(opts).await?;
    let load = t.elapsed() - copy;
    first_fingerprint(&plugin.client()).await?;
    let total = t.elapsed();
    plugin.shutdown().await;
    Ok(LoadTimes { copy, load, total })
}

async fn launch_once(bin: &Path) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let process = LaunchedPlugin::launch(LaunchOptions::new("rawexec", bin)).await?;
    first_fingerprint(&process.client()).await?;
    let elapsed = t.elapsed();
    process.shutdown().await;
    Ok(elapsed)
}

async fn first_fingerprint(client: &PluginClient) -> anyhow::Result<()> {
    let mut stream = Box::pin(client.fingerprint().await?);
    match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        Ok(Some(Ok(_))) => Ok(()),
        Ok(Some(Err(e))) => Err(e.into()),
        Ok(None) => bail!("the fingerprint stream ended without one"),
        Err(_) => bail!("no fingerprint within 5 s"),
    }
}
