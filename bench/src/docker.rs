//! `drover-bench docker-start --count N`: how long a docker task takes from StartTask
//! to a running container, next to `docker run -d` on the same daemon, measured
//! interleaved in the same run.
//!
//! Three ways to start the same container (`sleep 3600` in the test image), one after
//! the other for each of N rounds, in a rotating order so that none always goes first:
//! - `docker run -d`: the docker CLI (a process start, create, start);
//! - the docker plugin's `StartTask`, called directly through the SDK client;
//! - the agent's `POST /v1/tasks` (hooks, durable state, then the plugin).
//!
//! Every container stays up until the end (the daemon grows alike for all three), then
//! all are removed.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_plugin_sdk::client::{LaunchOptions, PluginClient};
use drover_plugin_sdk::{AgentInfo, TaskSpec};

use drover_api::{Client, RunRequest, TaskLifecycle};

use crate::tasks::wait_healthy;
use crate::{LaunchedPlugin, ms, stats};

/// Label on the CLI's containers, for the clean-up.
const CLI_LABEL: &str = "drover-bench=docker-start";

pub struct Options {
    pub count: usize,
    pub docker_host: String,
    pub image: String,
}

/// The docker daemon to use when none is given: the test daemon, `DOCKER_HOST`, or the
/// default socket.
pub fn default_host() -> String {
    ["DROVER_TEST_DOCKER_HOST", "DOCKER_HOST"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
}

fn docker_cli(host: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("docker")
        .arg("-H")
        .arg(host)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running the docker CLI")?;
    if !out.status.success() {
        bail!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub async fn run(plugin_bin: &Path, drover: &Path, o: Options) -> anyhow::Result<()> {
    if o.count == 0 {
        bail!("--count must be at least 1");
    }
    let version = docker_cli(
        &o.docker_host,
        &["version", "--format", "{{.Server.Version}}"],
    )
    .with_context(|| format!("no docker daemon answers at {}", o.docker_host))?;
    docker_cli(&o.docker_host, &["image", "inspect", &o.image])
        .with_context(|| format!("image {} is not on the daemon", o.image))?;
    let root = tempfile::Builder::new()
        .prefix("drover-bench-docker-")
        .tempdir()?;
    let alloc = root.path().join("alloc");
    std::fs::create_dir_all(&alloc)?;

    // The plugin, driven directly.
    let mut opts = LaunchOptions::new("docker", plugin_bin);
    opts.socket_dir = Some(root.path().to_owned());
    let plugin = LaunchedPlugin::launch(opts).await?;
    let client = plugin.client();
    let plugin_config = serde_json::json!({
        "endpoint": o.docker_host,
        "gc": { "dangling_containers": { "enabled": false } },
    });
    client
        .set_config(
            plugin_config.to_string(),
            &AgentInfo::new("1.0.0")
                .with_alloc_dir(alloc.clone())
                .with_plugin_state_dir(root.path()),
        )
        .await?;

    // The agent, with the built-in docker driver on the same daemon.
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[plugin.docker]\nconfig = {{ endpoint = \"{}\", gc = {{ dangling_containers = {{ enabled = false }} }} }}\n",
            o.docker_host
        ),
    )?;
    let mut agent = start_agent(drover, root.path(), &config)?;
    let api = Client::new(root.path().join("data/api.sock"));

    let result = measure(&o, &version, &client, &alloc, &api).await;

    // Clean up whatever happened.
    for i in 0..=o.count {
        let _ = client.destroy_task(&format!("bench-{i}"), true).await;
    }
    if let Ok(list) = api.list_tasks().await {
        for t in list {
            let _ = api.destroy_task(&t.id, true).await;
        }
    }
    stop_agent(&mut agent).await;
    plugin.shutdown().await;
    if let Ok(ids) = docker_cli(
        &o.docker_host,
        &["ps", "-aq", "--filter", &format!("label={CLI_LABEL}")],
    ) {
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = docker_cli(&o.docker_host, &args);
        }
    }
    result
}

/// SIGTERM the agent, which (started with `--drain`) stops its plugins too, and wait;
/// SIGKILL it if it takes too long.
async fn stop_agent(agent: &mut Child) {
    if let Some(pid) = i32::try_from(agent.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while matches!(agent.try_wait(), Ok(None)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
}

fn start_agent(drover: &Path, root: &Path, config: &Path) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("agent.log"))?;
    std::fs::create_dir_all(root.join("plugins"))?;
    Command::new(drover)
        // `--drain`: on SIGTERM it stops its plugins, so the bench leaves nothing behind.
        .args(["agent", "--drain", "--log-level", "warn", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(root.join("data"))
        .arg("--plugin-dir")
        .arg(root.join("plugins"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the agent")
}

fn spec(alloc: &Path, id: &str, image: &str) -> anyhow::Result<TaskSpec> {
    let dir = alloc.join(id);
    std::fs::create_dir_all(dir.join("logs"))?;
    Ok(TaskSpec::new(id)
        .with_stdout_path(dir.join("logs/stdout"))
        .with_stderr_path(dir.join("logs/stderr"))
        .with_driver_config_json(
            serde_json::json!({
                "image": image, "command": "sleep", "args": ["3600"],
            })
            .to_string(),
        )
        .with_task_dir(dir.clone()))
}

async fn measure(
    o: &Options,
    version: &str,
    client: &PluginClient,
    alloc: &Path,
    api: &Client,
) -> anyhow::Result<()> {
    wait_healthy(api, "docker", Duration::from_secs(30)).await?;
    let cli_args = |name: &str| -> Vec<String> {
        [
            "run", "-d", "--name", name, "--label", CLI_LABEL, &o.image, "sleep", "3600",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let cli_run = |name: String| {
        let host = o.docker_host.clone();
        let args = cli_args(&name);
        async move {
            let t = Instant::now();
            let out = tokio::process::Command::new("docker")
                .arg("-H")
                .arg(&host)
                .args(&args)
                .stdin(Stdio::null())
                .output()
                .await?;
            let took = t.elapsed();
            if !out.status.success() {
                bail!(
                    "docker run -d: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            anyhow::Ok(took)
        }
    };
    let plugin_start = |i: usize| {
        let spec = spec(alloc, &format!("bench-{i}"), &o.image);
        async move {
            let spec = spec?;
            let t = Instant::now();
            client.start_task(spec).await?;
            anyhow::Ok(t.elapsed())
        }
    };
    let agent_start = |i: usize| {
        let request = RunRequest {
            driver: "docker".into(),
            name: Some(format!("agent-bench-{i}")),
            config: serde_json::json!({ "image": o.image, "command": "sleep", "args": ["3600"] }),
            ..Default::default()
        };
        async move {
            let t = Instant::now();
            let view = api.run_task(&request).await?;
            let took = t.elapsed();
            if view.state != TaskLifecycle::Running {
                bail!("agent task is {} after POST /v1/tasks", view.state);
            }
            anyhow::Ok(took)
        }
    };

    // Warm-up: one of each (image layers and binaries in the page cache), not counted.
    let run_id = std::process::id();
    cli_run(format!("drover-bench-{run_id}-warm")).await?;
    plugin_start(o.count).await?;
    agent_start(o.count).await?;

    let (mut cli, mut plugin, mut agent) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..o.count {
        for k in 0..3 {
            match (i + k) % 3 {
                0 => cli.push(cli_run(format!("drover-bench-{run_id}-{i}")).await?),
                1 => plugin.push(plugin_start(i).await?),
                _ => agent.push(agent_start(i).await?),
            }
        }
    }
    let (c, p, a) = (stats(cli), stats(plugin), stats(agent));
    println!(
        "docker-start benchmark: {} containers each way (sleep 3600 in {}), docker {version} at {}",
        o.count, o.image, o.docker_host
    );
    let line = |what: &str, s: &crate::Stats| {
        println!(
            "  {what:<44} p50 {}  p99 {}  min {}",
            ms(s.median),
            ms(s.p99),
            ms(s.min)
        );
    };
    line("docker run -d (CLI):", &c);
    line("plugin StartTask -> running:", &p);
    line("agent POST /v1/tasks -> running:", &a);
    let pct = |x: Duration, base: Duration| (x.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0;
    println!(
        "  plugin vs docker CLI: p50 {:+.1}%  p99 {:+.1}%",
        pct(p.median, c.median),
        pct(p.p99, c.p99)
    );
    println!(
        "  agent  vs docker CLI: p50 {:+.1}%  p99 {:+.1}%",
        pct(a.median, c.median),
        pct(a.p99, c.p99)
    );
    Ok(())
}
