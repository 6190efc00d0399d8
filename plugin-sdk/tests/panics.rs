//! A driver that panics in a call: the panic answers that one RPC with an internal
//! error and the plugin keeps serving, in both forms (a plugin process, and in process
//! through the C ABI's entry table).
//!
//! `harness = false`: this binary is also the plugin process under test (re-executed
//! with [`ENV_SERVE`] set), and in process it installs the library's panic hook, which
//! must not take over a test harness's.

use std::time::Duration;

use drover_plugin_sdk::client::{InProcessPlugin, LaunchOptions, PluginClient, PluginProcess};
use drover_plugin_sdk::*;

/// Set in the re-executed copy of this binary: serve the driver as a process.
const ENV_SERVE: &str = "DROVER_SDK_TEST_SERVE_PANICKING";

/// Panics in StartTask (and in InspectTask of a task called "panic-inspect"); answers
/// everything else.
struct PanickingDriver;

impl PanickingDriver {
    fn new() -> Self {
        PanickingDriver
    }
}

impl DriverPlugin for PanickingDriver {
    type Config = EmptyConfig;
    type TaskConfig = EmptyConfig;
    fn info(&self) -> PluginInfo {
        PluginInfo::new("panicking", "0.1.0")
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint::healthy("ready")
    }
    async fn recover_task(&self, h: TaskHandle) -> Result<(), DriverError> {
        Err(DriverError::NotFound(h.spec.id))
    }
    async fn start_task(&self, _: TaskSpec, _: EmptyConfig) -> Result<TaskHandle, DriverError> {
        panic!("boom in start_task");
    }
    async fn wait_task(&self, _: &str) -> Result<ExitResult, DriverError> {
        Ok(ExitResult::code(0))
    }
    async fn stop_task(&self, _: &str, _: Duration, _: Signal) -> Result<(), DriverError> {
        Ok(())
    }
    async fn destroy_task(&self, _: &str, _: bool) -> Result<(), DriverError> {
        Ok(())
    }
    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
        if id == "panic-inspect" {
            let v: Vec<u8> = Vec::new();
            // An index out of bounds, the panic a real bug raises.
            let _ = v[usize::from(id.len() > 1)];
        }
        Err(DriverError::NotFound(id.into()))
    }
}

export_driver!(PanickingDriver::new);

fn main() {
    if std::env::var_os(ENV_SERVE).is_some() {
        serve(PanickingDriver::new());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        in_a_process().await;
        println!("ok  a panic in a plugin process answers one RPC and the plugin keeps serving");
        in_process().await;
        println!(
            "ok  a panic in an in-process plugin answers one RPC and the plugin keeps serving"
        );
    });
}

/// What a user of either form sees: StartTask and InspectTask fail with the panic's
/// message, and the plugin still answers afterwards.
async fn panics_are_contained(c: &PluginClient) {
    match c.start_task(TaskSpec::new("t1")).await {
        Err(DriverError::Internal(m)) => assert!(
            m.contains("driver panicked in StartTask: boom in start_task"),
            "{m}"
        ),
        other => panic!("StartTask of a panicking driver answered {other:?}"),
    }
    match c.inspect_task("panic-inspect").await {
        Err(DriverError::Internal(m)) => {
            assert!(
                m.contains("driver panicked in InspectTask: index out of bounds"),
                "{m}"
            )
        }
        other => panic!("InspectTask of a panicking driver answered {other:?}"),
    }
    let info = c
        .plugin_info()
        .await
        .expect("the plugin still answers after two panics");
    assert_eq!(info.name, "panicking");
    assert!(matches!(
        c.inspect_task("other").await,
        Err(DriverError::NotFound(_))
    ));
}

async fn in_a_process() {
    let exe = std::env::current_exe().expect("this test's executable");
    let mut opts = LaunchOptions::new("panicking", exe);
    opts.env.push((ENV_SERVE.into(), "1".into()));
    let plugin = PluginProcess::launch(opts).await.expect("launches");
    panics_are_contained(&plugin.client()).await;
    assert!(
        !plugin.has_exited(),
        "the plugin process exited after a panic"
    );
    assert!(plugin.shutdown().await.is_success());
}

async fn in_process() {
    let plugin = InProcessPlugin::load_linked(
        "panicking",
        drover_plugin_entry_v1,
        None,
        Duration::from_secs(5),
    )
    .await
    .expect("starts in process");
    panics_are_contained(&plugin.client()).await;
    assert!(!plugin.has_exited(), "the runtime stopped after a panic");
    assert!(plugin.shutdown().await.is_success());
    assert!(plugin.has_exited());
    // A stopped runtime starts again in the same library, with a fresh driver.
    let again = plugin
        .restart(Duration::from_secs(5))
        .await
        .expect("restarts");
    assert_eq!(
        again.client().plugin_info().await.expect("answers").name,
        "panicking"
    );
    let stopped = again.shutdown().await;
    assert!(stopped.is_success(), "{stopped}");
    // The first client fails fast once its runtime stopped.
    assert!(matches!(
        plugin.client().plugin_info().await,
        Err(DriverError::Unavailable(_))
    ));
}
