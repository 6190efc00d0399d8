//! `drover`: the agent daemon, its CLI, and (re-executed) the built-in drivers.

mod cli;
mod cluster_cli;
mod server_cmd;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use cli::api_error;
use drover_api::{Client, StopRequest};
use drover_host::config::{AgentConfig, LogFormat};
use drover_host::plugins::candidate::Builtin;

/// Built-in drivers: name and how to serve it. Only this file names drivers.
const BUILTINS: &[(&str, fn() -> !)] = &[
    ("rawexec", || {
        drover_plugin_sdk::serve(drover_driver_rawexec::RawExecDriver::new())
    }),
    ("docker", || {
        drover_plugin_sdk::serve(drover_driver_docker::DockerDriver::new())
    }),
    ("exec", || {
        drover_plugin_sdk::serve(drover_driver_exec::ExecDriver::new())
    }),
    ("java", || {
        drover_plugin_sdk::serve(drover_driver_java::JavaDriver::new())
    }),
    ("qemu", || {
        drover_plugin_sdk::serve(drover_driver_qemu::QemuDriver::new())
    }),
];

#[derive(Parser)]
#[command(
    name = "drover",
    version,
    about = "Run tasks through out-of-process driver plugins"
)]
struct Cli {
    /// Agent API address (unix:///path/to/api.sock); the cluster commands (job, node,
    /// alloc, eval) also take a server's (http://HOST:PORT).
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
    /// Run a cluster server: jobs, scheduling, the HTTP API and the node RPCs (or
    /// `drover server status`: the servers, the leader and the store).
    Server(server_cmd::ServerArgs),
    /// Submit, inspect and stop cluster jobs.
    #[command(subcommand)]
    Job(cluster_cli::JobCommand),
    /// Inspect and drain cluster nodes.
    #[command(subcommand)]
    Node(cluster_cli::NodeCommand),
    /// Inspect allocations and read their tasks' logs.
    #[command(subcommand)]
    Alloc(cluster_cli::AllocCommand),
    /// Inspect evaluations.
    #[command(subcommand)]
    Eval(cluster_cli::EvalCommand),
}

#[derive(Args)]
struct AgentArgs {
    /// Dev mode: data in $TMPDIR/drover-dev-$UID (refused if another user made it or
    /// it is open to others), plugin_dir created if missing.
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
    /// Cluster servers' RPC addresses, HOST:PORT (repeatable or comma-separated): the
    /// agent joins the cluster as a client node.
    #[arg(long = "servers", value_name = "ADDR", value_delimiter = ',')]
    servers: Vec<String>,
    /// The node's name in the cluster (default: the host name).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Node metadata for job constraints (`${node.meta.KEY}`), repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    meta: Vec<String>,
    /// File holding the cluster token sent with every RPC (must not be readable by
    /// other users).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// CA the servers' certificates must chain to (PEM): TLS towards the servers.
    #[arg(long, value_name = "FILE")]
    tls_ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM), with --tls-key-file.
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// Client key for mutual TLS (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Show every plugin binary the agent saw and its state.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Look at plugin_dir now: add new plugins, upgrade to newer ones, retire removed
    /// ones, without restarting the agent (it does this by itself unless
    /// `watch_plugin_dir = false`). Prints what changed.
    Reload {
        /// Print JSON (the changes and every plugin row).
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
    /// Start a task, from a spec file (TOML) and/or flags; flags override the file.
    Run {
        /// Task spec file (TOML): driver, name, `[config]`, `[env]`, kill_signal,
        /// kill_timeout, `[resources]`, `[restart]`, `[logs]`.
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        #[command(flatten)]
        flags: cli::RunFlags,
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
    /// Print a task's output: stdout, or stderr with --stderr.
    Logs {
        /// Task id.
        id: String,
        /// Keep printing as the task writes, until it is dead.
        #[arg(short, long)]
        follow: bool,
        /// Print stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
        /// Start with the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
    },
    /// Print what happened to a task: time, type, message.
    Events {
        /// Task id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a task's CPU and memory use (CPU % over half a second), or follow it.
    Stats {
        /// Task id.
        id: String,
        /// Print a sample every --interval until the task is dead.
        #[arg(short, long)]
        follow: bool,
        /// Time between samples when following.
        #[arg(long, default_value = "1s")]
        interval: String,
        /// Print JSON (one object per line when following).
        #[arg(long)]
        json: bool,
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
    // A per-task executor is this binary re-executed by a built-in driver. Enter it
    // before anything else (argument parsing included): it exists once per task, so
    // every page it does not touch is memory saved a thousand times over.
    drover_executor::run_if_executor(Some(&drover_isolation::LinuxSandbox));
    let cli = Cli::parse();
    match cli.command {
        Command::Plugin(PluginCommand::Serve { name }) => serve_builtin(&name),
        Command::Agent(args) => run_agent(args),
        Command::Plugin(PluginCommand::Status { json }) => {
            client_main(cli.address, |c| async move {
                let rows = c.plugins().await.map_err(api_error)?;
                cli::print_plugins(&rows, json)?;
                Ok(ExitCode::SUCCESS)
            })
        }
        Command::Plugin(PluginCommand::Reload { json }) => {
            client_main(cli.address, |c| async move {
                let report = c.reload_plugins().await.map_err(api_error)?;
                cli::print_reload(&report, json)?;
                Ok(ExitCode::SUCCESS)
            })
        }
        Command::Task(cmd) => client_main(cli.address, |c| task_command(c, cmd)),
        Command::Server(args) => match args.command {
            Some(server_cmd::ServerCommand::Status { json }) => {
                cluster_main(cli.address, |c| async move {
                    cluster_cli::server_status(&c, json).await
                })
            }
            None => server_cmd::run(args),
        },
        Command::Job(cmd) => cluster_main(cli.address, |c| async move {
            cluster_cli::job_command(&c, cmd).await
        }),
        Command::Node(cmd) => cluster_main(cli.address, |c| async move {
            cluster_cli::node_command(&c, cmd).await
        }),
        Command::Alloc(cmd) => cluster_main(cli.address, |c| async move {
            cluster_cli::alloc_command(&c, cmd).await
        }),
        Command::Eval(cmd) => cluster_main(cli.address, |c| async move {
            cluster_cli::eval_command(&c, cmd).await
        }),
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
    // Colours only on a terminal: a log file or journald gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

fn agent_flags(args: &AgentArgs) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
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
    let cluster = cli::ClusterFlags {
        servers: args.servers.clone(),
        node_name: args.node_name.clone(),
        meta: args.meta.clone(),
        token_file: args.token_file.clone(),
        tls_ca_file: args.tls_ca_file.clone(),
        tls_cert_file: args.tls_cert_file.clone(),
        tls_key_file: args.tls_key_file.clone(),
    };
    flags.extend(cluster.into_flags()?);
    Ok(flags)
}

fn run_agent(args: AgentArgs) -> ExitCode {
    // Pure config parse first: a bad config exits before any socket opens.
    let flags = match agent_flags(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drover: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match AgentConfig::load(&args.config, std::env::vars(), &flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&config);
    let mut config = config;
    if let Err(e) = leave_working_directory(&mut config) {
        tracing::error!("{e}");
        return ExitCode::FAILURE;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let dev_server = if config.dev && config.servers.is_empty() {
        match start_dev_server(&mut config, stop.clone()) {
            Ok(thread) => Some(thread),
            Err(e) => {
                tracing::error!("{e:#}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
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
    let agent_stop = stop.clone();
    let code = runtime.block_on(async move {
        tokio::spawn(stop_on_signals(agent_stop.clone()));
        match drover_host::run(config, builtins, agent_stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        }
    });
    // The agent is done (stopped, or failed to start): so is its dev server.
    stop.cancel();
    if let Some(thread) = dev_server {
        let _ = thread.join();
    }
    code
}

/// Make the config's paths absolute against the directory the agent was started in,
/// then make `/` the agent's working directory: nothing the agent loads or runs may
/// resolve a path against a directory someone else controls (a driver library's
/// relative search path, or one of its dependencies, would be looked for there).
/// Plugins and executors start in `/` too; a relative path in a plugin's own config
/// (`[plugin.NAME] config`) is the plugin's to resolve.
fn leave_working_directory(config: &mut AgentConfig) -> anyhow::Result<()> {
    let started_in = std::env::current_dir();
    let mut paths: Vec<&mut PathBuf> = [
        &mut config.data_dir,
        &mut config.plugin_dir,
        &mut config.api_socket,
        &mut config.token_file,
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(tls) = &mut config.tls {
        paths.push(&mut tls.ca_file);
        paths.extend(tls.cert_file.iter_mut());
        paths.extend(tls.key_file.iter_mut());
    }
    for path in paths.into_iter().filter(|p| p.is_relative()) {
        let dir = started_in.as_ref().map_err(|e| {
            anyhow::anyhow!(
                "{} is a relative path, and the working directory cannot be read ({e}): \
                 give an absolute path",
                path.display()
            )
        })?;
        *path = dir.join(&*path);
    }
    std::env::set_current_dir("/")
        .map_err(|e| anyhow::anyhow!("cannot change the working directory to /: {e}"))
}

/// `--dev`: a server in this process, its store in `<data_dir>/server`, listening on
/// 127.0.0.1 with ports the OS picks; the agent registers with it as its only server.
/// `drover job ...` reaches it through the agent's socket (the agent forwards), so no
/// fixed port is needed (a fixed one could clash with another dev agent).
fn start_dev_server(
    config: &mut AgentConfig,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use drover_host::dirs::{Access, prepare};
    let data_dir = config.data_dir();
    let what = if config.data_dir.is_none() {
        "dev data directory"
    } else {
        "data directory"
    };
    // As the agent prepares it (it does again, harmlessly): the server's store lives
    // inside, so the directory must be safe before the server writes there.
    prepare(&data_dir, what, Access::Private)?;
    let server_dir = data_dir.join("server");
    prepare(&server_dir, "dev server directory", Access::Private)?;
    // The dev server listens on 127.0.0.1, where every local user can connect, and a
    // job can run commands as root (rawexec): it gets a fresh random token, kept in a
    // 0600 file in its 0700 directory, which the agent sends. Users reach it through
    // the agent's 0600 socket.
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let token_file = server_dir.join("dev-token");
    write_private(&token_file, &token)
        .with_context(|| format!("cannot write the dev token {}", token_file.display()))?;
    let (http, rpc, thread) = server_cmd::start_dev(server_dir, token, stop)?;
    tracing::info!(
        http = %format!("http://{http}"),
        rpc = %rpc,
        token_file = %token_file.display(),
        "dev server started; `drover job ...` reaches it through this agent's socket, \
         or at --address http://{http} with DROVER_TOKEN from the token file"
    );
    config.servers = vec![rpc.to_string()];
    config.token_file = Some(token_file);
    Ok(thread)
}

/// Replace `path` with a new file holding `text`, mode 0600, never through a link.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // O_CREAT|O_EXCL: fails on any existing name, a link included.
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
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
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let result = (|| {
        let socket = cli::resolve_address(address.as_deref())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(f(Client::new(socket)))
    })();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run a cluster command with a client for `--address`/`DROVER_ADDR` and the
/// `DROVER_TOKEN`/`DROVER_CACERT` of the environment.
fn cluster_main<F, Fut>(address: Option<String>, f: F) -> ExitCode
where
    F: FnOnce(drover_server_api::client::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let result = (|| {
        let address = cluster_cli::cluster_address(address.as_deref())?;
        let client = cluster_cli::client(&address, |k| std::env::var(k).ok())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(f(client))
    })();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn task_command(c: Client, cmd: TaskCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TaskCommand::Run { file, flags, json } => {
            let mut spec = match &file {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read task spec {}", path.display()))?;
                    Some(drover_host::spec::parse(
                        &text,
                        &path.display().to_string(),
                    )?)
                }
                None => None,
            };
            let request = cli::run_request(spec.as_mut(), flags)?;
            let task = match c.run_task(&request).await {
                Ok(task) => task,
                Err(e) => {
                    // A config problem only the agent can see: point at the file's line.
                    let located = spec
                        .as_ref()
                        .and_then(|s| s.locate_config_error(&e.to_string()));
                    return Err(located.map_or_else(|| api_error(e), |l| anyhow::anyhow!("{l}")));
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&task)?);
            } else {
                println!("{}", task.id);
            }
        }
        TaskCommand::Status { id, json } => {
            let task = c.get_task(&id).await.map_err(api_error)?;
            cli::print_task(&task, json)?;
        }
        TaskCommand::List { json } => {
            let tasks = c.list_tasks().await.map_err(api_error)?;
            cli::print_tasks(&tasks, json)?;
        }
        TaskCommand::Wait { id, json } => {
            let task = c.wait_task(&id).await.map_err(api_error)?;
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
            let request = StopRequest {
                signal,
                timeout: timeout
                    .map(|t| cli::check_duration("--timeout", &t))
                    .transpose()?,
            };
            let task = c.stop_task(&id, &request).await.map_err(api_error)?;
            cli::print_task(&task, json)?;
        }
        TaskCommand::Signal { id, signal } => {
            c.signal_task(&id, &signal).await.map_err(api_error)?;
        }
        TaskCommand::Logs {
            id,
            follow,
            stderr,
            tail,
        } => {
            let args = cli::LogsArgs {
                stderr,
                follow,
                tail,
            };
            cli::print_logs(&c, &id, &args).await?;
        }
        TaskCommand::Events { id, json } => {
            let events = c.task_events(&id).await.map_err(api_error)?;
            cli::print_events(&events, json)?;
        }
        TaskCommand::Stats {
            id,
            follow,
            interval,
            json,
        } => {
            if follow {
                let interval = cli::check_duration("--interval", &interval)?;
                let mut samples = c
                    .follow_task_stats(&id, Some(interval))
                    .await
                    .map_err(api_error)?;
                if !json {
                    println!("{}", cli::stats_header());
                }
                while let Some(sample) = samples.next().await.map_err(api_error)? {
                    if json {
                        println!("{}", serde_json::to_string(&sample)?);
                    } else {
                        println!("{}", cli::stats_row(&sample));
                    }
                }
            } else {
                let sample = c.task_stats(&id).await.map_err(api_error)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&sample)?);
                } else {
                    println!("{}", cli::stats_header());
                    println!("{}", cli::stats_row(&sample));
                }
            }
        }
        TaskCommand::Destroy { id, force } => {
            c.destroy_task(&id, force).await.map_err(api_error)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("drover").chain(args.iter().copied()))
    }

    #[test]
    fn cluster_commands_parse_as_the_interface_says() {
        let cli = parse(&["job", "run", "web.toml", "--detach", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Job(cluster_cli::JobCommand::Run { ref file, detach: true, json: true }) if file == std::path::Path::new("web.toml")
        ));
        let cli = parse(&[
            "--address",
            "http://127.0.0.1:4646",
            "job",
            "stop",
            "web",
            "--purge",
        ])
        .unwrap();
        assert_eq!(cli.address.as_deref(), Some("http://127.0.0.1:4646"));
        assert!(matches!(
            cli.command,
            Command::Job(cluster_cli::JobCommand::Stop { purge: true, .. })
        ));
        let cli = parse(&["alloc", "logs", "abc", "main", "-f", "--stderr"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Alloc(cluster_cli::AllocCommand::Logs {
                follow: true,
                stderr: true,
                ..
            })
        ));
        for ok in [
            &["job", "plan", "f.toml"][..],
            &["job", "status", "web", "--json"],
            &["node", "status", "--json"],
            &["node", "drain", "n1"],
            &["alloc", "status", "abc", "--json"],
            &["eval", "status", "e1"],
        ] {
            parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
    }

    #[test]
    fn server_flags_are_checked_before_anything_opens() {
        let cli = parse(&[
            "server",
            "--data-dir",
            "/d",
            "--http-addr",
            "127.0.0.1:1",
            "--rpc-addr",
            "127.0.0.1:2",
            "--heartbeat-ttl",
            "3s",
            "--heartbeat-grace",
            "1m",
            "--workers",
            "4",
            "--scheduler",
            "spread",
        ])
        .unwrap();
        let Command::Server(args) = cli.command else {
            panic!("not server")
        };
        let o = args.options().unwrap();
        assert_eq!(o.http_addr.port(), 1);
        assert_eq!(o.heartbeat_ttl, std::time::Duration::from_secs(3));
        assert_eq!(o.heartbeat_grace, std::time::Duration::from_secs(60));
        assert_eq!(o.workers, Some(4));
        assert_eq!(
            o.algorithm,
            drover_server::config::SchedulerAlgorithm::Spread
        );
        for (bad, want) in [
            (
                &["--http-addr", "localhost"][..],
                "invalid value 'localhost' for '--http-addr",
            ),
            (&["--heartbeat-ttl", "0s"], "must be more than 0"),
            (
                &["--scheduler", "random"],
                "invalid value 'random' for '--scheduler",
            ),
            (&["--workers", "0"], "invalid value '0' for '--workers"),
            (&["--tls-cert-file", "c.pem"], "--tls-key-file"),
        ] {
            let mut args = vec!["server", "--data-dir", "/d"];
            args.extend_from_slice(bad);
            let err = parse(&args)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"))
                .to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("token");
        std::fs::write(&empty, "  \n").unwrap();
        std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let cli = parse(&[
            "server",
            "--data-dir",
            "/d",
            "--token-file",
            empty.to_str().unwrap(),
        ])
        .unwrap();
        let Command::Server(args) = cli.command else {
            panic!("not server")
        };
        let err = args.options().unwrap_err().to_string();
        assert_eq!(
            err,
            format!("--token-file: token file {}: it is empty", empty.display())
        );
    }

    #[test]
    fn server_store_flags_and_status() {
        let cli = parse(&[
            "server",
            "--data-dir",
            "/d",
            "--store",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,https://10.0.0.2:2379",
            "--etcd-ca-file",
            "/ca.pem",
            "--etcd-prefix",
            "/c1/",
            "--name",
            "s1",
            "--leader-lease-ttl",
            "3s",
            "--advertise-rpc",
            "10.0.0.1:4647",
        ])
        .unwrap();
        let Command::Server(args) = cli.command else {
            panic!("not server")
        };
        let o = args.options().unwrap();
        assert_eq!(
            o.store,
            server_cmd::StoreChoice::Etcd {
                endpoints: vec![
                    "http://127.0.0.1:2379".into(),
                    "https://10.0.0.2:2379".into()
                ],
                prefix: "/c1/".into(),
                lease_ttl: std::time::Duration::from_secs(3),
                tls: Some(drover_server::store::etcd::EtcdTls {
                    ca: "/ca.pem".into(),
                    cert: None,
                    key: None,
                    server_name: None,
                }),
            }
        );
        assert_eq!(o.name, "s1");
        assert_eq!(o.advertise_rpc.as_deref(), Some("10.0.0.1:4647"));
        assert_eq!(o.advertise_http, None);

        let embedded = parse(&["server", "--data-dir", "/d"]).unwrap();
        let Command::Server(args) = embedded.command else {
            panic!("not server")
        };
        let o = args.options().unwrap();
        assert_eq!(o.store, server_cmd::StoreChoice::Embedded);
        assert!(!o.name.is_empty(), "the host name by default");

        for (bad, want) in [
            (
                &["--store", "etcd"][..],
                "--store etcd needs --etcd-endpoints",
            ),
            (
                &["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"],
                "must start with http:// or https://",
            ),
            (
                &[
                    "--store",
                    "etcd",
                    "--etcd-endpoints",
                    "http://h:2379",
                    "--etcd-prefix",
                    "x",
                ],
                "ending in /",
            ),
            (
                &["--etcd-endpoints", "http://h:2379"],
                "only used with --store etcd",
            ),
        ] {
            let mut argv = vec!["server", "--data-dir", "/d"];
            argv.extend_from_slice(bad);
            let Command::Server(args) = parse(&argv).unwrap().command else {
                panic!("not server")
            };
            let err = args.options().unwrap_err().to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        for (bad, want) in [
            (&["--leader-lease-ttl", "1s"][..], "at least 2s"),
            (&["--advertise-http", "nohost"], "is not HOST:PORT"),
            (&["--store", "zookeeper"], "invalid value 'zookeeper'"),
        ] {
            let mut argv = vec!["server", "--data-dir", "/d"];
            argv.extend_from_slice(bad);
            let err = parse(&argv).err().expect("refused").to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }

        let status = parse(&["server", "status", "--json", "--address", "http://h:1"]).unwrap();
        assert_eq!(status.address.as_deref(), Some("http://h:1"));
        let Command::Server(args) = status.command else {
            panic!("not server")
        };
        assert!(matches!(
            args.command,
            Some(server_cmd::ServerCommand::Status { json: true })
        ));
    }
}
