//! `drover-bench rawexec-start [--iterations N]`: what a rawexec task's own cgroup
//! costs at start. Two rawexec plugins (the real binary), one with `no_cgroups` (the
//! task is its process group only, as before tasks had cgroups) and one without (the
//! executor creates the task's cgroup and the task joins it between fork and exec),
//! timed StartTask → running (`sleep 1000`) in ABBA order (A B B A per round), so that
//! a machine that slows down over the run hits both alike. Each task is destroyed
//! (untimed) before the next start; with a cgroup, destroy empties and removes it.

use anyhow::bail;
use drover_plugin_sdk::TaskSpec;

use crate::exec_start::{Driver, launch, signed_ms};
use crate::{ms, sibling_binary, stats};

pub(crate) async fn run(iterations: usize) -> anyhow::Result<()> {
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if !rustix::process::geteuid().is_root() {
        bail!("rawexec-start needs root: the task cgroups are created under /sys/fs/cgroup");
    }
    let bin = sibling_binary("drover-driver-rawexec", "drover-driver-rawexec")?;
    let root = tempfile::Builder::new()
        .prefix("drover-bench-rawexec")
        .tempdir()?;
    let sleep = serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] });
    let plain = launch(
        "rawexec",
        &bin,
        root.path(),
        // raw_exec is off unless enabled, as Nomad's (only `--dev` agents turn it on).
        serde_json::json!({ "enabled": true, "no_cgroups": true }),
        sleep.clone(),
    )
    .await?;
    let cg_root = root.path().join("cg");
    std::fs::create_dir_all(&cg_root)?;
    let grouped = launch(
        "rawexec",
        &bin,
        &cg_root,
        serde_json::json!({ "enabled": true }),
        sleep,
    )
    .await?;
    // The comparison means something only if the tasks of one do get a cgroup.
    check_cgroup(&grouped, true).await?;
    check_cgroup(&plain, false).await?;
    // Warm-up: page cache, the executor binary, the cgroup parent.
    for n in 0..3 {
        plain.once(root.path(), 1_000_000 + n).await?;
        grouped.once(&cg_root, 1_000_000 + n).await?;
    }
    let mut a = Vec::with_capacity(iterations);
    let mut b = Vec::with_capacity(iterations);
    for n in 0..iterations {
        let (first, second) = (2 * n, 2 * n + 1);
        a.push(plain.once(root.path(), first).await?);
        b.push(grouped.once(&cg_root, first).await?);
        b.push(grouped.once(&cg_root, second).await?);
        a.push(plain.once(root.path(), second).await?);
    }
    for d in [&plain, &grouped] {
        d.process.shutdown().await;
    }
    let (a, b) = (stats(a), stats(b));
    println!(
        "rawexec-start benchmark: {} tasks per variant (ABBA), StartTask -> running (`sleep 1000`)",
        2 * iterations
    );
    let line = |what: &str, s: &crate::Stats| {
        println!(
            "  {what}: median {}  p99 {}  min {}",
            ms(s.median),
            ms(s.p99),
            ms(s.min)
        );
    };
    line("process group only (no_cgroups)", &a);
    line("own cgroup", &b);
    println!(
        "  cgroup cost: median {}  p99 {}",
        signed_ms(b.median, a.median),
        signed_ms(b.p99, a.p99)
    );
    Ok(())
}

/// Start one task on `driver` and check whether it is in a rawexec task cgroup.
async fn check_cgroup(driver: &Driver, wanted: bool) -> anyhow::Result<()> {
    let id = format!("check-{wanted}");
    let spec = TaskSpec::new(id.clone()).with_driver_config_json(
        serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] }).to_string(),
    );
    driver.client.start_task(spec).await?;
    let pid = driver.client.inspect_task(&id).await?.attributes["pid"].clone();
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    driver.client.destroy_task(&id, true).await?;
    let has = cgroups.contains("drover-plain/");
    if has != wanted {
        bail!(
            "rawexec task {pid} is {}in a task cgroup, expected otherwise: {cgroups}",
            if has { "" } else { "not " }
        );
    }
    Ok(())
}
