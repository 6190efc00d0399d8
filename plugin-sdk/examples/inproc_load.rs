//! How long a driver takes to become usable in each form: `InProcessPlugin::load`
//! (sealed copy, dlopen, start, first health answer) against `PluginProcess::launch`
//! (spawn, handshake, connect, first health answer), alternating, N times each.
//!
//! ```text
//! cargo build -p drover-driver-rawexec
//! cargo run -p drover-plugin-sdk --features launcher --example inproc_load -- \
//!     target/debug/libdrover_driver_rawexec.so target/debug/drover-driver-rawexec 20
//! ```
//!
//! Every load puts another copy of the library into this process (a library is never
//! unloaded), as an agent loading N plugins would.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{
    InProcessOptions, InProcessPlugin, LaunchOptions, PluginProcess, sealed_copy,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(library), Some(binary)) = (args.next(), args.next()) else {
        return Err("usage: inproc_load LIBRARY.so PLUGIN-BINARY [ROUNDS]".into());
    };
    let rounds: usize = match args.next() {
        Some(n) => n.to_string_lossy().parse()?,
        None => 10,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (library, binary) = (PathBuf::from(library), PathBuf::from(binary));
        let mut copies = Vec::new();
        let mut loads = Vec::new();
        let mut launches = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            let file = std::fs::File::open(&library)?;
            let sealed = sealed_copy(&file.into(), "rawexec")?;
            copies.push(t.elapsed());
            let mut opts = InProcessOptions::new("rawexec", sealed, library.clone());
            opts.executor = Some(binary.clone());
            let plugin = InProcessPlugin::load(opts).await?;
            loads.push(t.elapsed());
            plugin.shutdown().await;

            let t = Instant::now();
            let process = PluginProcess::launch(LaunchOptions::new("rawexec", &binary)).await?;
            launches.push(t.elapsed());
            process.shutdown().await;
        }
        report("in process: sealed copy of the library", &mut copies);
        report(
            "in process: copy + load (dlopen, start, health)",
            &mut loads,
        );
        report("process: launch (spawn, handshake, health)", &mut launches);
        Ok(())
    })
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: n={} min={:?} p50={:?} max={:?}",
        samples.len(),
        samples[0],
        at(0.5),
        samples[samples.len() - 1]
    );
}
