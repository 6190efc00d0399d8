//! `drover-bench exec-start [--iterations N]`: how long StartTask takes until the task
//! runs, for isolated exec tasks and, interleaved in the same run, for rawexec tasks
//! (the same executor without isolation). The difference is what isolation costs:
//! cgroup creation, namespaces, the chroot's mounts and `pivot_root`, capabilities.
//!
//! A second exec plugin of the same build runs with `seccomp = "unconfined"`; the two
//! exec plugins alternate ABBA (filtered first in even rounds, unconfined first in odd
//! ones), so that the difference is what the default seccomp filter costs a start:
//! moving the program to the executor, and installing it in the task.
//!
//! Both plugins are the real binaries, driven through the SDK client; each task is
//! `sleep 1000` and is destroyed (untimed) before the next start. StartTask returns
//! once the executor reports the task's `exec` done, so the time is StartTask → running.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_plugin_sdk::client::{InProcessPlugin, LaunchOptions, PluginClient};
use drover_plugin_sdk::{AgentInfo, TaskSpec};

use crate::{LaunchedPlugin, ms, sibling_binary, stats};

/// What serves a driver: a plugin process, or a driver library loaded into this
/// process.
pub(crate) enum Served {
    /// Boxed: a `PluginProcess` is far bigger than an `InProcessPlugin` handle.
    Process(Box<LaunchedPlugin>),
    Library(InProcessPlugin),
}

impl Served {
    fn client(&self) -> PluginClient {
        match self {
            Served::Process(p) => p.client(),
            Served::Library(l) => l.client(),
        }
    }

    pub(crate) async fn shutdown(&self) {
        match self {
            Served::Process(p) => p.shutdown().await,
            Served::Library(l) => l.shutdown().await,
        };
    }
}

pub(crate) struct Driver {
    name: &'static str,
    pub(crate) process: Served,
    pub(crate) client: PluginClient,
    config: serde_json::Value,
}

pub(crate) async fn launch(
    name: &'static str,
    binary: &Path,
    root: &Path,
    plugin_config: serde_json::Value,
    task_config: serde_json::Value,
) -> anyhow::Result<Driver> {
    let process = LaunchedPlugin::launch(LaunchOptions::new(name, binary))
        .await
        .with_context(|| format!("launching {}", binary.display()))?;
    configure(
        name,
        Served::Process(Box::new(process)),
        root,
        plugin_config,
        task_config,
    )
    .await
}

/// Configure the driver `served` serves (`SetConfig` with `root`'s alloc and state
/// directories), ready for [`Driver::once`].
pub(crate) async fn configure(
    name: &'static str,
    process: Served,
    root: &Path,
    plugin_config: serde_json::Value,
    task_config: serde_json::Value,
) -> anyhow::Result<Driver> {
    let client = process.client();
    let agent = AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
        .with_alloc_dir(root.join("alloc"))
        .with_plugin_state_dir(root.join("plugin-state"));
    client
        .set_config(plugin_config.to_string(), &agent)
        .await
        .with_context(|| format!("SetConfig of {name}"))?;
    Ok(Driver {
        name,
        process,
        client,
        config: task_config,
    })
}

impl Driver {
    /// Start one task and return the StartTask latency; destroy it afterwards.
    pub(crate) async fn once(&self, root: &Path, n: usize) -> anyhow::Result<Duration> {
        let id = format!("{}-{n}", self.name);
        let task_dir = root.join("alloc").join(&id);
        for sub in ["local", "secrets", "tmp", "logs"] {
            std::fs::create_dir_all(task_dir.join(sub))?;
        }
        let spec = TaskSpec::new(id.clone())
            .with_stdout_path(task_dir.join("logs/stdout"))
            .with_stderr_path(task_dir.join("logs/stderr"))
            .with_driver_config_json(self.config.to_string())
            .with_task_dir(task_dir.clone());
        let t = Instant::now();
        self.client
            .start_task(spec)
            .await
            .with_context(|| format!("StartTask {id}"))?;
        let elapsed = t.elapsed();
        self.client
            .destroy_task(&id, true)
            .await
            .with_context(|| format!("DestroyTask {id}"))?;
        let _ = std::fs::remove_dir_all(&task_dir);
        Ok(elapsed)
    }
}

pub(crate) async fn run(iterations: usize) -> anyhow::Result<()> {
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if !rustix::process::geteuid().is_root() {
        bail!("exec-start needs root: the exec driver creates namespaces, cgroups and chroots");
    }
    let rawexec_bin = sibling_binary("drover-driver-rawexec", "drover-driver-rawexec")?;
    let exec_bin = sibling_binary("drover-driver-exec", "drover-driver-exec")?;
    let root = tempfile::Builder::new()
        .prefix("drover-bench-exec")
        .tempdir()?;
    let parent = format!("/drover-bench-{}", std::process::id());
    let sleep = serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] });
    let rawexec = launch(
        "rawexec",
        &rawexec_bin,
        root.path(),
        // raw_exec is off unless enabled, as Nomad's (only `--dev` agents turn it on).
        serde_json::json!({ "enabled": true }),
        sleep.clone(),
    )
    .await?;
    let exec = launch(
        "exec",
        &exec_bin,
        root.path(),
        serde_json::json!({ "cgroup_parent": parent }),
        sleep.clone(),
    )
    .await?;
    let unconfined = launch(
        "exec-unconfined",
        &exec_bin,
        root.path(),
        serde_json::json!({ "cgroup_parent": parent, "seccomp": "unconfined" }),
        sleep,
    )
    .await?;

    // Measured apart, so that the plugins are shut down and the cgroup parent removed
    // (once empty: a task whose DestroyTask failed stays in it) also after an error.
    let measured = async {
        // Warm-up: page cache, the executor binary, the cgroup parent.
        for n in 0..3 {
            rawexec.once(root.path(), 1_000_000 + n).await?;
            exec.once(root.path(), 1_000_000 + n).await?;
            unconfined.once(root.path(), 1_000_000 + n).await?;
        }
        let mut raw_samples = Vec::with_capacity(iterations);
        let mut exec_samples = Vec::with_capacity(iterations);
        let mut open_samples = Vec::with_capacity(iterations);
        let mut pair_diffs = Vec::with_capacity(iterations);
        for n in 0..iterations {
            // Interleaved, so that load from elsewhere hits all alike; the two exec
            // flavours ABBA, so that neither always runs right after rawexec.
            raw_samples.push(rawexec.once(root.path(), n).await?);
            let (with, without) = if n % 2 == 0 {
                let w = exec.once(root.path(), n).await?;
                (w, unconfined.once(root.path(), n).await?)
            } else {
                let wo = unconfined.once(root.path(), n).await?;
                (exec.once(root.path(), n).await?, wo)
            };
            exec_samples.push(with);
            open_samples.push(without);
            pair_diffs.push(with.as_secs_f64() - without.as_secs_f64());
        }
        anyhow::Ok((raw_samples, exec_samples, open_samples, pair_diffs))
    }
    .await;
    for d in [&rawexec, &exec, &unconfined] {
        d.process.shutdown().await;
    }
    for c in ["memory", "cpu", "cpuacct", "pids", "freezer"] {
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(&parent[1..]));
    }
    let (raw_samples, exec_samples, open_samples, mut pair_diffs) = measured?;
    let r = stats(raw_samples);
    let e = stats(exec_samples);
    let o = stats(open_samples);
    pair_diffs.sort_by(f64::total_cmp);
    let pair_median = pair_diffs[pair_diffs.len() / 2];
    println!(
        "exec-start benchmark: {iterations} tasks per driver, StartTask -> running (`sleep 1000`)"
    );
    println!(
        "  rawexec (executor, no isolation):                          median {}  p99 {}  min {}",
        ms(r.median),
        ms(r.p99),
        ms(r.min)
    );
    println!(
        "  exec (namespaces, chroot, cgroup, caps, nobody, seccomp): median {}  p99 {}  min {}",
        ms(e.median),
        ms(e.p99),
        ms(e.min)
    );
    println!(
        "  exec, seccomp unconfined (same build):                     median {}  p99 {}  min {}",
        ms(o.median),
        ms(o.p99),
        ms(o.min)
    );
    println!(
        "  isolation cost: median {}  p99 {}  (goal: under 10 ms at the median)",
        signed_ms(e.median, r.median),
        signed_ms(e.p99, r.p99)
    );
    println!(
        "  seccomp filter cost: median {} (median of ABBA pair differences {:+.3} ms)  \
         (goal: at most 1 ms at the median)",
        signed_ms(e.median, o.median),
        pair_median * 1000.0
    );
    Ok(())
}

pub(crate) fn signed_ms(a: Duration, b: Duration) -> String {
    if a >= b {
        format!("+{}", ms(a - b))
    } else {
        format!("-{}", ms(b - a))
    }
}
