//! `drover`: the agent daemon, its CLI, and (re-executed) the built-in drivers.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use drover_host::cli::{self, ApiClient};
use drover_host::config::{AgentConfig, LogFormat};
use drover_host::loader::Builtin;
use hyper::Method;

/// Built-in drivers: name and how to serve it. Only this file names drivers.
const BUILTINS: &[(&str, fn() -> !)] = &[("rawexec", || {
    drover_plugin_sdk::serve(drover_driver_rawexec::RawExecDriver::new())
})];

#[derive(Parser)]
#[command(
    name = "drover",
    version,
    about = "Run tasks through out-of-process driver plugins"
)]
struct Cli {
    /// Agent API address (unix:///path/to/api.sock).
    #[arg(long, global = true, env = "DROVER_ADDR")]
    address: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent daemon.
    Agent(AgentArgs),
    /// Inspect plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Run and manage tasks.
    #[command(subcommand)]
    Task(TaskCommand),
}

#[derive(Args)]
struct AgentArgs {
    /// Dev mode: data under the temp dir, plugin_dir created if missing.
    #[arg(long)]
    dev: bool,
    /// TOML config file (repeatable; later files win).
    #[arg(long = "config", value_name = "FILE")]
    config: Vec<PathBuf>,
    /// State, task directories and the API socket live here.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Directory scanned for plugin binaries.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// API socket path (default <data_dir>/api.sock).
    #[arg(long)]
    api_socket: Option<PathBuf>,
    /// Plugin handshake timeout, e.g. "5s".
    #[arg(long)]
    handshake_timeout: Option<String>,
    /// Log filter, e.g. "info" or "drover=debug".
    #[arg(long)]
    log_level: Option<String>,
    /// Log format: human or json.
    #[arg(long)]
    log_format: Option<String>,
    /// On SIGTERM/SIGINT stop every task and plugin (default: leave them running for
    /// the next agent to reattach to).
    #[arg(long)]
    drain: bool,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Show every plugin binary the agent saw and its state.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve a built-in driver as a plugin (the agent runs this; not for people).
    #[command(hide = true)]
    Serve {
        /// Built-in driver name.
        name: String,
    },
}

#[derive(Subcommand)]
enum TaskCommand {
    /// Start a task.
    Run {
        /// Driver name.
        #[arg(long)]
        driver: String,
        /// Driver task config as JSON.
        #[arg(long, default_value = "{}")]
        config: String,
        /// Task name.
        #[arg(long)]
        name: Option<String>,
        /// Environment variable KEY=VALUE (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Signal sent by stop (default SIGTERM).
        #[arg(long)]
        kill_signal: Option<String>,
        /// Time between the stop signal and SIGKILL, e.g. "5s".
        #[arg(long)]
        kill_timeout: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a task.
    Status {
        /// Task id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List tasks.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Wait for a task to exit; exit with its exit code (128+N if killed by signal N).
    Wait {
        /// Task id.
        id: String,
        /// Print the task as JSON when it exits.
        #[arg(long)]
        json: bool,
    },
    /// Stop a task: kill signal, then SIGKILL after the kill timeout.
    Stop {
        /// Task id.
        id: String,
        /// Signal instead of the task's kill signal.
        #[arg(long)]
        signal: Option<String>,
        /// Timeout instead of the task's kill timeout, e.g. "2s".
        #[arg(long)]
        timeout: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a signal to a task.
    Signal {
        /// Task id.
        id: String,
        /// Signal name, e.g. SIGHUP.
        signal: String,
    },
    /// Forget a dead task (or a running one with --force, killing it).
    Destroy {
        /// Task id.
        id: String,
        /// Kill it first if it is running.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Plugin(PluginCommand::Serve { name }) => serve_builtin(&name),
        Command::Agent(args) => run_agent(args),
        Command::Plugin(PluginCommand::Status { json }) => {
            client_main(cli.address, |c| async move {
                let rows = c.call(Method::GET, "/v1/plugins", None).await?;
                cli::print_plugins(&rows, json);
                Ok(ExitCode::SUCCESS)
            })
        }
        Command::Task(cmd) => client_main(cli.address, |c| task_command(c, cmd)),
    }
}

fn serve_builtin(name: &str) -> ExitCode {
    match BUILTINS.iter().find(|(n, _)| *n == name) {
        Some((_, serve)) => serve(),
        None => {
            let names: Vec<_> = BUILTINS.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "no built-in driver named {name:?}; built-ins: {}",
                names.join(", ")
            );
            ExitCode::from(2)
        }
    }
}

fn init_logging(config: &AgentConfig) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

fn agent_flags(args: &AgentArgs) -> serde_json::Map<String, serde_json::Value> {
    let mut flags = serde_json::Map::new();
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            flags.insert(k.to_owned(), v);
        }
    };
    put("dev", args.dev.then_some(true.into()));
    put(
        "data_dir",
        args.data_dir
            .as_ref()
            .map(|p| p.display().to_string().into()),
    );
    put(
        "plugin_dir",
        args.plugin_dir
            .as_ref()
            .map(|p| p.display().to_string().into()),
    );
    put(
        "api_socket",
        args.api_socket
            .as_ref()
            .map(|p| p.display().to_string().into()),
    );
    put(
        "handshake_timeout",
        args.handshake_timeout.clone().map(Into::into),
    );
    put("log_level", args.log_level.clone().map(Into::into));
    put("log_format", args.log_format.clone().map(Into::into));
    put("drain_on_shutdown", args.drain.then_some(true.into()));
    flags
}

fn run_agent(args: AgentArgs) -> ExitCode {
    // Pure config parse first: a bad config exits before any socket opens.
    let config = match AgentConfig::load(&args.config, std::env::vars(), &agent_flags(&args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&config);
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot find the drover binary to run built-in drivers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let builtins = BUILTINS
        .iter()
        .map(|(name, _)| Builtin {
            name: (*name).to_owned(),
            command: exe.clone(),
            args: ["plugin", "serve", name]
                .iter()
                .map(OsString::from)
                .collect(),
        })
        .collect();
    // One thread: the agent is I/O-bound control-plane code. Cross-thread wake-ups cost
    // tens of microseconds each on VMs, which dominated plugin launch latency with a
    // multi-threaded runtime (drover-bench handshake: 3.1 ms vs 2.3 ms median).
    // Blocking work goes to `spawn_blocking`.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(stop_on_signals(stop.clone()));
        match drover_host::run(config, builtins, stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// First SIGINT/SIGTERM: graceful stop. Second: exit at once.
async fn stop_on_signals(stop: tokio_util::sync::CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::info!("signal received; stopping (send again to exit at once)");
    stop.cancel();
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    std::process::exit(130);
}

fn client_main<F, Fut>(address: Option<String>, f: F) -> ExitCode
where
    F: FnOnce(ApiClient) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let result = (|| {
        let socket = cli::resolve_address(address.as_deref())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(f(ApiClient::new(socket)))
    })();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn task_command(c: ApiClient, cmd: TaskCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TaskCommand::Run {
            driver,
            config,
            name,
            env,
            kill_signal,
            kill_timeout,
            json,
        } => {
            let config: serde_json::Value = serde_json::from_str(&config)
                .with_context(|| format!("--config is not valid JSON: {config}"))?;
            let mut env_map = serde_json::Map::new();
            for kv in env {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
                env_map.insert(k.to_owned(), v.into());
            }
            let mut body =
                serde_json::json!({ "driver": driver, "config": config, "env": env_map });
            if let Some(n) = name {
                body["name"] = n.into();
            }
            if let Some(s) = kill_signal {
                body["kill_signal"] = s.into();
            }
            if let Some(t) = kill_timeout {
                body["kill_timeout"] = t.into();
            }
            let task = c.call(Method::POST, "/v1/tasks", Some(body)).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&task)?);
            } else {
                println!(
                    "{}",
                    task.get("id").and_then(|i| i.as_str()).unwrap_or_default()
                );
            }
        }
        TaskCommand::Status { id, json } => {
            let task = c
                .call(Method::GET, &format!("/v1/tasks/{id}"), None)
                .await?;
            cli::print_task(&task, json);
        }
        TaskCommand::List { json } => {
            let tasks = c.call(Method::GET, "/v1/tasks", None).await?;
            cli::print_tasks(&tasks, json);
        }
        TaskCommand::Wait { id, json } => {
            let task = c
                .call(Method::GET, &format!("/v1/tasks/{id}/wait"), None)
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&task)?);
            }
            let code = cli::task_exit_code(&task);
            return Ok(ExitCode::from(
                u8::try_from(code.clamp(0, 255)).unwrap_or(1),
            ));
        }
        TaskCommand::Stop {
            id,
            signal,
            timeout,
            json,
        } => {
            let mut body = serde_json::json!({});
            if let Some(s) = signal {
                body["signal"] = s.into();
            }
            if let Some(t) = timeout {
                body["timeout"] = t.into();
            }
            let task = c
                .call(Method::POST, &format!("/v1/tasks/{id}/stop"), Some(body))
                .await?;
            cli::print_task(&task, json);
        }
        TaskCommand::Signal { id, signal } => {
            c.call(
                Method::POST,
                &format!("/v1/tasks/{id}/signal"),
                Some(serde_json::json!({ "signal": signal })),
            )
            .await?;
        }
        TaskCommand::Destroy { id, force } => {
            c.call(
                Method::DELETE,
                &format!("/v1/tasks/{id}?force={force}"),
                None,
            )
            .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
