//! Measure what an isolated task costs in memory: its executor and its init (pid 1 of
//! the task's pid namespace, a fork of the executor).
//!
//! ```text
//! cargo build --release -p drover-driver-exec
//! sudo cargo run --release -p drover-driver-exec --example isolated_memory -- target/release/drover-driver-exec 20
//! ```
//!
//! Starts N `sleep` tasks through the exec plugin binary, prints PSS and private dirty
//! memory (`/proc/<pid>/smaps_rollup`) of every executor and init and their means,
//! then destroys the tasks.

use std::time::Duration;

use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
use drover_plugin_sdk::{AgentInfo, TaskSpec};

fn smaps_kib(pid: u32) -> std::io::Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Ok((field("Pss:"), field("Private_Dirty:")))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let binary = args
        .next()
        .unwrap_or_else(|| "target/release/drover-driver-exec".into());
    let count: usize = args.next().map_or(Ok(10), |n| n.parse())?;
    let dir = tempfile::tempdir()?;
    let plugin = PluginProcess::launch(LaunchOptions::new("exec", &binary)).await?;
    let client = plugin.client();
    let agent = AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
        .with_alloc_dir(dir.path())
        .with_plugin_state_dir(dir.path().join("plugin-state"));
    let parent = format!("/drover-memory-{}", std::process::id());
    client
        .set_config(format!(r#"{{"cgroup_parent":"{parent}"}}"#), &agent)
        .await?;
    let mut ids = Vec::new();
    let mut pids = Vec::new();
    for i in 0..count {
        let id = format!("mem-{i}");
        let task_dir = dir.path().join(&id);
        std::fs::create_dir_all(task_dir.join("logs"))?;
        let spec = TaskSpec::new(id.clone())
            .with_stdout_path(task_dir.join("logs/stdout"))
            .with_stderr_path(task_dir.join("logs/stderr"))
            .with_driver_config_json(r#"{"command":"/bin/sleep","args":["600"]}"#)
            .with_task_dir(task_dir);
        client.start_task(spec).await?;
        let status = client.inspect_task(&id).await?;
        pids.push((
            status.attributes["executor_pid"].parse::<u32>()?,
            status.attributes["pid"].parse::<u32>()?,
        ));
        ids.push(id);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("binary {binary}, {count} isolated tasks");
    println!(
        "{:>9} {:>9} {:>9} {:>9}",
        "executor", "pss KiB", "init", "pss KiB"
    );
    let (mut exec_sum, mut init_sum, mut dirty_sum) = ((0, 0), (0, 0), 0);
    for &(executor, init) in &pids {
        let (e_pss, e_dirty) = smaps_kib(executor)?;
        let (i_pss, i_dirty) = smaps_kib(init)?;
        println!("{executor:>9} {e_pss:>9} {init:>9} {i_pss:>9}");
        exec_sum = (exec_sum.0 + e_pss, exec_sum.1 + e_dirty);
        init_sum = (init_sum.0 + i_pss, init_sum.1 + i_dirty);
        dirty_sum += e_dirty + i_dirty;
    }
    let n = pids.len().max(1) as u64;
    println!(
        "mean: executor pss {} KiB (private dirty {} KiB), init pss {} KiB (private dirty {} KiB); \
         per task {} KiB pss, {} KiB private dirty",
        exec_sum.0 / n,
        exec_sum.1 / n,
        init_sum.0 / n,
        init_sum.1 / n,
        (exec_sum.0 + init_sum.0) / n,
        dirty_sum / n
    );
    for id in &ids {
        client.destroy_task(id, true).await?;
    }
    plugin.shutdown().await;
    for c in ["memory", "cpu", "cpuacct", "pids", "freezer"] {
        let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{c}{parent}"));
    }
    Ok(())
}
