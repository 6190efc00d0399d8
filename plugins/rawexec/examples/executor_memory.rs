//! Measure how much memory the per-task executors of rawexec take.
//!
//! ```text
//! cargo build --release -p drover-driver-rawexec
//! cargo run --example executor_memory -- target/release/drover-driver-rawexec 20
//! # the built-in rawexec of the agent binary:
//! cargo run --example executor_memory -- target/release/drover 20 plugin serve rawexec
//! ```
//!
//! Starts N `sleep` tasks through the given plugin binary (and says how long that
//! took), prints the PSS, RSS and
//! private dirty memory of every executor (from `/proc/<pid>/smaps_rollup`) and their
//! mean, then destroys the tasks. PSS divides shared pages (the binary's text, libc)
//! among the processes mapping them, so it drops as executors are added; private dirty
//! memory (heap, stack, relocated data) is what each one costs on its own.

use std::time::Duration;

use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
use drover_plugin_sdk::{AgentInfo, TaskSpec};

fn smaps_kib(pid: u32) -> std::io::Result<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Ok((field("Pss:"), field("Rss:"), field("Private_Dirty:")))
}

/// Where one executor's private dirty memory is, biggest first.
fn print_biggest_mappings(pid: u32) -> std::io::Result<()> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut rows: Vec<(u64, String)> = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: "start-end perms offset dev inode [path]".
            let f: Vec<&str> = line.split_whitespace().collect();
            name = format!(
                "{} {}",
                f.get(1).unwrap_or(&""),
                f.get(5).unwrap_or(&"[anon]")
            );
        } else if let Some(v) = line.strip_prefix("Private_Dirty:") {
            let kib = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            if kib > 0 {
                rows.push((kib, name.clone()));
            }
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    println!("private dirty of executor {pid} by mapping:");
    for (kib, name) in rows.iter().take(12) {
        println!("{kib:>8} KiB  {name}");
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let binary = args
        .next()
        .unwrap_or_else(|| "target/release/drover-driver-rawexec".into());
    let count: usize = args.next().map_or(Ok(10), |n| n.parse())?;
    let dir = tempfile::tempdir()?;
    let mut options = LaunchOptions::new("rawexec", &binary);
    options.args = args.map(Into::into).collect();
    let plugin = PluginProcess::launch(options).await?;
    let client = plugin.client();
    let agent = AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
        .with_alloc_dir(dir.path())
        .with_plugin_state_dir(dir.path().join("plugin-state"));
    client.set_config("{}".into(), &agent).await?;

    let mut ids = Vec::new();
    let mut executors = Vec::new();
    let started = std::time::Instant::now();
    for i in 0..count {
        let id = format!("mem-{i}");
        let task_dir = dir.path().join(&id);
        std::fs::create_dir_all(&task_dir)?;
        let spec = TaskSpec::new(id.clone())
            .with_stdout_path(task_dir.join("stdout"))
            .with_stderr_path(task_dir.join("stderr"))
            .with_driver_config_json(r#"{"command":"/bin/sleep","args":["600"]}"#)
            .with_task_dir(task_dir);
        client.start_task(spec).await?;
        let status = client.inspect_task(&id).await?;
        executors.push(status.attributes["executor_pid"].parse::<u32>()?);
        ids.push(id);
    }
    println!(
        "started {count} tasks one after another in {:?} ({:?} each)",
        started.elapsed(),
        started.elapsed() / count.max(1) as u32
    );
    // Let start-up pages settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sum = (0, 0, 0);
    println!("binary {binary}, {count} executors");
    println!(
        "{:>8} {:>8} {:>8} {:>14}",
        "pid", "pss KiB", "rss KiB", "private dirty"
    );
    for &pid in &executors {
        let (pss, rss, dirty) = smaps_kib(pid)?;
        println!("{pid:>8} {pss:>8} {rss:>8} {dirty:>14}");
        sum = (sum.0 + pss, sum.1 + rss, sum.2 + dirty);
    }
    let n = executors.len().max(1) as u64;
    println!(
        "mean: pss {} KiB, rss {} KiB, private dirty {} KiB",
        sum.0 / n,
        sum.1 / n,
        sum.2 / n
    );
    if let Some(&pid) = executors.first() {
        print_biggest_mappings(pid)?;
    }
    for id in &ids {
        client.destroy_task(id, true).await?;
    }
    plugin.shutdown().await;
    Ok(())
}
