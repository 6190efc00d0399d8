//! A driver linked into this test binary, served both ways: as a plugin process (this
//! binary re-executed with [`ENV_SERVE`] set) and in process through its C ABI entry
//! table ([`InProcessPlugin::load_linked`]).
//!
//! - A driver that panics in a call: the panic answers that one RPC with an internal
//!   error and the plugin keeps serving, in both forms.
//! - In process, the runtime's life: a stop, a restart with a fresh driver, and
//!   `GRPCController/Shutdown`, which stops the runtime (never the process) and which
//!   the host sees as the plugin's end.
//!
//! `harness = false`: the re-executed binary must print nothing before the handshake,
//! and in process the driver installs the library's panic hook, which must not take
//! over a test harness's.

use std::time::Duration;

use drover_plugin_sdk::client::{InProcessPlugin, LaunchOptions, PluginClient, PluginProcess};
use drover_plugin_sdk::inproc::{CODE_OK, EntryV1, ErrorBuf};
use drover_plugin_sdk::proto::goplugin;
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
    println!("ok  a panic in an in-process plugin answers one RPC and the plugin keeps serving");
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
    println!("ok  an in-process runtime stops, and starts again with a fresh driver");

    // GRPCController/Shutdown, as a go-plugin host sends it: the runtime stops by
    // itself (this process lives on, as this very line shows) and the host notices.
    let third = again
        .restart(Duration::from_secs(5))
        .await
        .expect("restarts again");
    let mut controller = goplugin::grpc_controller_client::GrpcControllerClient::new(
        linked_channel(drover_plugin_entry_v1).await,
    );
    controller
        .shutdown(goplugin::Empty {})
        .await
        .expect("Shutdown answered");
    let how = tokio::time::timeout(Duration::from_secs(5), third.exited())
        .await
        .expect("the runtime stops after GRPCController/Shutdown");
    assert!(how.to_string().contains("stopped by itself"), "{how}");
    assert!(matches!(
        third.client().plugin_info().await,
        Err(DriverError::Unavailable(_))
    ));
    // And it starts again (the stopping runtime is waited for).
    let fourth = third
        .restart(Duration::from_secs(5))
        .await
        .expect("restarts after a Shutdown");
    assert!(fourth.shutdown().await.is_success());
    println!("ok  GRPCController/Shutdown stops an in-process runtime, not the process");
}

/// A gRPC channel of our own to the linked driver's runtime: one end of a socket pair
/// per connection, the other handed to its `connect`, as the host does.
async fn linked_channel(entry: extern "C" fn() -> *const EntryV1) -> tonic::transport::Channel {
    // SAFETY: the entry generated by export_driver! returns a static table.
    #[allow(unsafe_code)]
    let table = unsafe { *entry() };
    tonic::transport::Endpoint::from_static("http://linked")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| async move {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            ours.set_nonblocking(true)?;
            let mut len = 0usize;
            let mut buf = [0u8; 256];
            let error = ErrorBuf {
                ptr: buf.as_mut_ptr(),
                cap: buf.len(),
                len: &mut len,
            };
            // SAFETY: the table's `connect` takes the fd's ownership; the buffer
            // outlives the call.
            #[allow(unsafe_code)]
            let code =
                unsafe { (table.connect)(std::os::fd::IntoRawFd::into_raw_fd(theirs), error) };
            if code != CODE_OK {
                return Err(std::io::Error::other(
                    String::from_utf8_lossy(&buf[..len]).into_owned(),
                ));
            }
            Ok(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::from_std(ours)?,
            ))
        }))
        .await
        .expect("a connection to the linked driver")
}
