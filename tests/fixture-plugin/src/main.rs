//! A plugin for the agent's tests, steered by environment variables (written by the
//! tests into small wrapper scripts in a plugin_dir):
//!
//! - `FIXTURE_NAME` (default `fixture`), `FIXTURE_VERSION` (default `0.1.0`),
//!   `FIXTURE_API_VERSIONS` (comma list, default the SDK's): what `PluginInfo` says.
//! - `FIXTURE_MODE`:
//!   - `normal` (default): a trivial driver whose tasks finish at once with exit 0;
//!   - `goplugin-only`: a go-plugin plugin for another application — handshake, health
//!     and go-plugin's own services, none of Drover's;
//!   - `mute-after-handshake`: prints a handshake line naming a socket it listens on,
//!     then never answers a byte there;
//!   - `crash-after-handshake`: a normal plugin that exits with code 7 after 2 s
//!     (long enough for a loaded machine to finish the handshake first);
//!   - `rawexec`: the real rawexec driver, named `FIXTURE_NAME` (default `raw_exec`) at
//!     `FIXTURE_VERSION` (a "newer rawexec" for the hot-upgrade tests);
//!   - `rawexec-bad-config`: the same, refusing every `SetConfig`;
//!   - `hang-fingerprint`: a normal plugin whose first fingerprint never comes.
//!
//!   Started with Nomad's cookie and without Drover's, any mode speaks Nomad's driver
//!   protocol (the SDK's `serve`): a test's wrapper script that unsets
//!   `DROVER_PLUGIN_MAGIC_COOKIE` makes a misbehaving Nomad driver of it.
//! - `FIXTURE_RECOVER_ACCEPT=N` (rawexec modes): recover only the first N tasks
//!   handed over, refuse every later `RecoverTask` with `InvalidConfig`.
//! - `FIXTURE_RECOVER_CRASH=N` (rawexec modes): abort on every `RecoverTask` after
//!   the first N (see rawexec.rs)
//! - `FIXTURE_LAUNCH_LOG=PATH`, `FIXTURE_LAUNCH_DELAY_MS=N` (any mode): append
//!   `START_NS END_NS` to PATH, the wall-clock window of a start-up delayed by N ms
//!   (how many launches of one reload overlap).

mod rawexec;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::Mutex;
use std::time::Duration;

use drover_plugin_sdk::proto::goplugin;
use drover_plugin_sdk::{
    Capabilities, DriverError, DriverPlugin, EmptyConfig, ExitResult, Fingerprint, PluginInfo,
    Signal, TaskHandle, TaskSpec, TaskState, TaskStatus,
};

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct FixtureTaskConfig {
    #[serde(default)]
    exit_code: i32,
}

#[derive(Default)]
struct Fixture {
    tasks: Mutex<HashMap<String, i32>>,
    /// `FIXTURE_MODE=hang-fingerprint`.
    hang_fingerprint: bool,
}

impl Fixture {
    fn exit_code(&self, id: &str) -> Result<i32, DriverError> {
        self.tasks
            .lock()
            .map_err(DriverError::internal)?
            .get(id)
            .copied()
            .ok_or_else(|| DriverError::NotFound(format!("task {id}")))
    }
}

impl DriverPlugin for Fixture {
    type Config = EmptyConfig;
    type TaskConfig = FixtureTaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(
            env_or("FIXTURE_NAME", "fixture"),
            env_or("FIXTURE_VERSION", "0.1.0"),
        )
    }

    fn api_versions(&self) -> Vec<String> {
        match std::env::var("FIXTURE_API_VERSIONS") {
            Ok(list) => list.split(',').map(|v| v.trim().to_owned()).collect(),
            Err(_) => vec![drover_plugin_sdk::version::PLUGIN_API_VERSION.to_owned()],
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn fingerprint(&self) -> Fingerprint {
        if self.hang_fingerprint {
            // A driver stuck in its health check: the first fingerprint never comes.
            std::future::pending::<()>().await;
        }
        Fingerprint::healthy("fixture ready")
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: FixtureTaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        self.tasks
            .lock()
            .map_err(DriverError::internal)?
            .insert(spec.id.clone(), config.exit_code);
        TaskHandle::new(spec, 1, &config.exit_code)
    }

    async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError> {
        Ok(ExitResult::code(self.exit_code(id)?))
    }

    async fn stop_task(&self, id: &str, _: Duration, _: Signal) -> Result<(), DriverError> {
        self.exit_code(id).map(drop)
    }

    async fn destroy_task(&self, id: &str, _: bool) -> Result<(), DriverError> {
        self.tasks.lock().map_err(DriverError::internal)?.remove(id);
        Ok(())
    }

    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
        let code = self.exit_code(id)?;
        Ok(TaskStatus::new(id, TaskState::Exited).with_exit_result(ExitResult::code(code)))
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        let code: i32 = handle.decode_state(1)?;
        self.tasks
            .lock()
            .map_err(DriverError::internal)?
            .insert(handle.spec.id.clone(), code);
        Ok(())
    }
}

/// `FIXTURE_LAUNCH_LOG` / `FIXTURE_LAUNCH_DELAY_MS`: hold the start-up for the delay
/// and append its wall-clock window to the log, for a test counting how many launches
/// overlap. One `write` of a short line to an `O_APPEND` file: lines do not mix.
fn log_launch() {
    let Ok(log) = std::env::var("FIXTURE_LAUNCH_LOG") else {
        return;
    };
    let delay: u64 = env_or("FIXTURE_LAUNCH_DELAY_MS", "0")
        .parse()
        .expect("FIXTURE_LAUNCH_DELAY_MS is a number");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos()
    };
    let start = now();
    std::thread::sleep(Duration::from_millis(delay));
    let line = format!("{start} {}\n", now());
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .expect("open FIXTURE_LAUNCH_LOG");
    std::io::Write::write_all(&mut file, line.as_bytes()).expect("write FIXTURE_LAUNCH_LOG");
}

fn main() {
    // rawexec's executors are this binary re-executed: become one before anything else.
    drover_executor::run_if_executor(None);
    log_launch();
    match env_or("FIXTURE_MODE", "normal").as_str() {
        mode @ ("rawexec" | "rawexec-bad-config") => {
            drover_plugin_sdk::serve(rawexec::Rawexec::new(
                env_or("FIXTURE_NAME", "raw_exec"),
                env_or("FIXTURE_VERSION", "0.1.0"),
                mode == "rawexec-bad-config",
                std::env::var("FIXTURE_RECOVER_ACCEPT")
                    .ok()
                    .map(|n| n.parse().expect("FIXTURE_RECOVER_ACCEPT is a number")),
            ))
        }
        "goplugin-only" => goplugin_only(),
        "mute-after-handshake" => mute_after_handshake(),
        "crash-after-handshake" => {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_secs(2));
                std::process::exit(7);
            });
            drover_plugin_sdk::serve(Fixture::default())
        }
        "hang-fingerprint" => drover_plugin_sdk::serve(Fixture {
            hang_fingerprint: true,
            ..Fixture::default()
        }),
        _ => drover_plugin_sdk::serve(Fixture::default()),
    }
}

/// go-plugin's controller: Shutdown answers, then the process exits at once.
struct Controller {
    /// The socket directory, removed before exiting (`exit` skips destructors).
    dir: std::path::PathBuf,
}

#[tonic::async_trait]
impl goplugin::grpc_controller_server::GrpcController for Controller {
    async fn shutdown(
        &self,
        _: tonic::Request<goplugin::Empty>,
    ) -> Result<tonic::Response<goplugin::Empty>, tonic::Status> {
        let dir = self.dir.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = std::fs::remove_dir_all(dir);
            std::process::exit(0);
        });
        Ok(tonic::Response::new(goplugin::Empty {}))
    }
}

type Pending<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send>>;

/// go-plugin's stdio mirror: an open stream that sends nothing.
struct Stdio;

#[tonic::async_trait]
impl goplugin::grpc_stdio_server::GrpcStdio for Stdio {
    type StreamStdioStream = Pending<goplugin::StdioData>;
    async fn stream_stdio(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<Self::StreamStdioStream>, tonic::Status> {
        Ok(tonic::Response::new(Box::pin(tokio_stream::pending())))
    }
}

/// go-plugin's broker: an open stream that sends nothing.
struct Broker;

#[tonic::async_trait]
impl goplugin::grpc_broker_server::GrpcBroker for Broker {
    type StartStreamStream = Pending<goplugin::ConnInfo>;
    async fn start_stream(
        &self,
        _: tonic::Request<tonic::Streaming<goplugin::ConnInfo>>,
    ) -> Result<tonic::Response<Self::StartStreamStream>, tonic::Status> {
        Ok(tonic::Response::new(Box::pin(tokio_stream::pending())))
    }
}

/// A 0700 directory named `prefix…` where the host asked for sockets, and the socket
/// path in it.
fn socket_dir(prefix: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let base = std::env::var_os(drover_plugin_sdk::handshake::ENV_UNIX_SOCKET_DIR)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(base)
        .expect("socket dir");
    let path = dir.path().join("plugin.sock");
    (dir, path)
}

/// Print a good handshake line for a socket that takes connections (the kernel queues
/// them on the listener) but never reads or writes one.
fn mute_after_handshake() {
    // The SDK's prefix: the host removes a dead plugin's socket directory only when it
    // is named so, and this plugin ends by SIGKILL (its TempDir is never dropped).
    let (_dir, path) = socket_dir("drover-plugin-");
    let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    println!("1|1|unix|{}|grpc", path.display());
    std::thread::sleep(Duration::from_secs(1000));
}

/// Behave like a go-plugin plugin of some other program that happens to share the
/// cookie: the same handshake, socket modes and go-plugin services as a Drover plugin
/// (health, controller, stdio, broker), but no `drover.plugin.v1` services.
fn goplugin_only() {
    use drover_plugin_sdk::handshake;
    if std::env::var(handshake::MAGIC_COOKIE_KEY).as_deref() != Ok(handshake::MAGIC_COOKIE_VALUE) {
        eprintln!("not started by a host");
        std::process::exit(1);
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (dir, path) = socket_dir("fixture-");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .expect("socket mode");
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("plugin", tonic_health::ServingStatus::Serving)
            .await;
        let server = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(goplugin::grpc_controller_server::GrpcControllerServer::new(
                Controller {
                    dir: dir.path().to_owned(),
                },
            ))
            .add_service(goplugin::grpc_stdio_server::GrpcStdioServer::new(Stdio))
            .add_service(goplugin::grpc_broker_server::GrpcBrokerServer::new(Broker))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener));
        // The listener is bound: connections queue until the server polls it.
        println!("1|1|unix|{}|grpc", path.display());
        let _ = server.await;
    });
}
