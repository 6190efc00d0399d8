//! Drover's host side (the SDK client the agent launches plugins with) against a real
//! go-plugin 1.6.3 plugin (tests/goplugin16, built by scripts/go-plugin-16.sh): with
//! AutoMTLS and gRPC broker multiplexing each on and off it connects, the health check
//! (`ping`) passes, Drover RPCs get answers over that transport, and Shutdown ends the process;
//! and a fresh host reattaches to it over AutoMTLS from the stored reattach record.
//! The other direction (a go-plugin 1.6.3 host launching Drover plugins) is in
//! goplugin16.rs.

use std::path::Path;
use std::time::Duration;

use drover_plugin_sdk::DriverError;
use drover_plugin_sdk::client::{LaunchOptions, PluginProcess, ReattachConfig};
use drover_test_support::procs::alive;
use drover_test_support::{goplugin, until, within};

/// The name the Go plugin gives in its PluginInfo answer.
const GO_PLUGIN_NAME: &str = "goplugin16";

/// Generous for a loaded machine: what these tests catch is a hang or a refusal.
const BUDGET: Duration = Duration::from_secs(10);

async fn launch_go_plugin(
    program: &Path,
    socket_dir: &Path,
    auto_mtls: bool,
    multiplex_grpc: bool,
) -> PluginProcess {
    let mut opts = LaunchOptions::new(GO_PLUGIN_NAME, program);
    opts.socket_dir = Some(socket_dir.to_owned());
    opts.handshake_timeout = BUDGET;
    opts.auto_mtls = auto_mtls;
    opts.multiplex_grpc = multiplex_grpc;
    // `launch` returns once connected over the transport the handshake set up (with
    // AutoMTLS: the TLS handshake done, the plugin's certificate checked).
    let started = std::time::Instant::now();
    let plugin = within(BUDGET, "launching the go-plugin 1.6.3 plugin", async {
        PluginProcess::launch(opts).await
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the go-plugin 1.6.3 plugin (AutoMTLS {auto_mtls}, multiplexing {multiplex_grpc}) \
             did not launch: {e}"
        )
    });
    eprintln!(
        "Drover host -> go-plugin 1.6.3 plugin (AutoMTLS {auto_mtls}, multiplexing \
         {multiplex_grpc}): launch to connected {} ms",
        started.elapsed().as_millis()
    );
    // As the agent does: go-plugin plugins mirror their stdio over GRPCStdio.
    plugin.mirror_stdio();
    plugin
}

/// Drover RPCs reach the Go plugin and its answers come back: its PluginInfo, and a
/// gRPC status (UNIMPLEMENTED) for a Driver RPC it does not serve.
async fn assert_round_trips(plugin: &PluginProcess) {
    let client = plugin.client();
    // go-plugin's Ping: its health service says `plugin` is SERVING.
    within(BUDGET, "Ping", client.ping())
        .await
        .expect("the go-plugin 1.6.3 plugin's health service says SERVING");
    let info = within(BUDGET, "PluginInfo", client.plugin_info())
        .await
        .expect("PluginInfo from the go-plugin 1.6.3 plugin");
    assert_eq!(info.name, GO_PLUGIN_NAME);
    assert_eq!(info.api_versions, vec!["1.0.0".to_owned()]);
    match within(BUDGET, "Capabilities", client.capabilities()).await {
        Err(DriverError::Unimplemented(_)) => {}
        other => panic!(
            "a Driver RPC the Go plugin does not serve must come back UNIMPLEMENTED, got {other:?}"
        ),
    }
}

async fn drover_host_uses_go_plugin(auto_mtls: bool, multiplex_grpc: bool) {
    let Some(program) = goplugin::program_16() else {
        return;
    };
    let socket_dir = tempfile::tempdir().expect("temp dir");
    let plugin = launch_go_plugin(&program, socket_dir.path(), auto_mtls, multiplex_grpc).await;
    let line = plugin.handshake();
    assert_eq!(
        line.server_cert.is_some(),
        auto_mtls,
        "the plugin's certificate (6th field) is there exactly with AutoMTLS: {line}"
    );
    assert_eq!(
        line.multiplex_grpc,
        multiplex_grpc.then_some(true),
        "go-plugin 1.6.3 offers multiplexing (7th field) exactly when asked: {line}"
    );
    assert_round_trips(&plugin).await;
    let asked = std::time::Instant::now();
    let how = within(BUDGET, "shutdown", plugin.shutdown()).await;
    eprintln!(
        "Drover host -> go-plugin 1.6.3 plugin (AutoMTLS {auto_mtls}, multiplexing \
         {multiplex_grpc}): Shutdown to exit {} µs",
        asked.elapsed().as_micros()
    );
    assert!(
        how.is_success(),
        "the Go plugin must exit 0 on GRPCController.Shutdown, not be killed: {how}"
    );
}

#[tokio::test]
async fn drover_host_uses_go_plugin_plain() {
    drover_host_uses_go_plugin(false, false).await;
}

#[tokio::test]
async fn drover_host_uses_go_plugin_over_automtls() {
    drover_host_uses_go_plugin(true, false).await;
}

#[tokio::test]
async fn drover_host_uses_go_plugin_with_broker_multiplexing() {
    drover_host_uses_go_plugin(false, true).await;
}

#[tokio::test]
async fn drover_host_uses_go_plugin_over_automtls_with_broker_multiplexing() {
    drover_host_uses_go_plugin(true, true).await;
}

#[tokio::test]
async fn drover_host_reattaches_to_go_plugin_over_automtls() {
    let Some(program) = goplugin::program_16() else {
        return;
    };
    let socket_dir = tempfile::tempdir().expect("temp dir");
    let launched = launch_go_plugin(&program, socket_dir.path(), true, false).await;
    let pid = launched.pid();
    // What the agent stores: it goes through JSON, as in its state store.
    let record = launched.reattach_config();
    assert!(
        record.tls.is_some(),
        "an AutoMTLS plugin's reattach record must hold the TLS material"
    );
    let debug = format!("{record:?}");
    assert!(
        !debug.contains("PRIVATE KEY"),
        "the reattach record's Debug output shows the private key: {debug}"
    );
    let stored = serde_json::to_string(&record).expect("serialize the reattach record");
    drop(launched);

    // Without the certificates, nothing proves the plugin's identity: refused.
    let mut without_tls: ReattachConfig =
        serde_json::from_str(&stored).expect("deserialize the reattach record");
    without_tls.tls = None;
    let refused = PluginProcess::reattach(GO_PLUGIN_NAME, without_tls, BUDGET).await;
    assert!(
        refused.is_err(),
        "reattach to an AutoMTLS plugin without its certificates must fail"
    );

    // A fresh host, from the stored record alone.
    let restored: ReattachConfig =
        serde_json::from_str(&stored).expect("deserialize the reattach record");
    let plugin = within(
        BUDGET,
        "reattaching",
        PluginProcess::reattach(GO_PLUGIN_NAME, restored, BUDGET),
    )
    .await
    .unwrap_or_else(|e| panic!("reattach over AutoMTLS to the go-plugin 1.6.3 plugin: {e}"));
    assert!(plugin.is_reattached());
    assert_eq!(plugin.pid(), pid);
    assert_round_trips(&plugin).await;
    within(BUDGET, "shutdown after reattach", plugin.shutdown()).await;
    until(BUDGET, "the reattached Go plugin to exit", || !alive(pid)).await;
}
