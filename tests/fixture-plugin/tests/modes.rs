//! The fixture's modes behave as the loader tests assume.

use std::time::{Duration, Instant};

use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
use drover_plugin_sdk::{DriverError, ExitOutcome};

const BIN: &str = env!("CARGO_BIN_EXE_drover-fixture-plugin");

async fn launch(env: &[(&str, &str)], socket_dir: &std::path::Path) -> PluginProcess {
    let mut opts = LaunchOptions::new("fixture", BIN);
    opts.env = env
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    opts.socket_dir = Some(socket_dir.to_owned());
    tokio::time::timeout(Duration::from_secs(10), PluginProcess::launch(opts))
        .await
        .expect("launch in time")
        .expect("fixture launches")
}

#[tokio::test]
async fn normal_mode_says_what_the_environment_says() {
    let dir = tempfile::tempdir().unwrap();
    let p = launch(
        &[
            ("FIXTURE_NAME", "dup"),
            ("FIXTURE_VERSION", "0.10.0"),
            ("FIXTURE_API_VERSIONS", "2.0.0, 3.1.0"),
        ],
        dir.path(),
    )
    .await;
    let info = p.client().plugin_info().await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.version.as_str()),
        ("dup", "0.10.0")
    );
    assert_eq!(info.api_versions, ["2.0.0", "3.1.0"]);
    assert_eq!(p.shutdown().await, ExitOutcome::Code(0));
}

#[tokio::test]
async fn goplugin_only_mode_serves_no_drover_services_and_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let p = launch(&[("FIXTURE_MODE", "goplugin-only")], dir.path()).await;
    let err = p.client().plugin_info().await.unwrap_err();
    assert!(matches!(err, DriverError::Unimplemented(_)), "{err:?}");
    let t = Instant::now();
    assert_eq!(p.shutdown().await, ExitOutcome::Code(0));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Its socket directory went with it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn crash_mode_exits_7_shortly_after_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let p = launch(&[("FIXTURE_MODE", "crash-after-handshake")], dir.path()).await;
    let how = tokio::time::timeout(Duration::from_secs(15), p.exited())
        .await
        .expect("crashes in time");
    assert_eq!(how, ExitOutcome::Code(7));
}

#[tokio::test]
async fn mute_mode_connects_never_answers_and_leaves_nothing_once_killed() {
    let dir = tempfile::tempdir().unwrap();
    // A launch makes no RPC of its own: it connects (the kernel queues the connection).
    let p = launch(&[("FIXTURE_MODE", "mute-after-handshake")], dir.path()).await;
    let client = p.client();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), client.ping())
            .await
            .is_err(),
        "a mute plugin answered Ping"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), client.plugin_info())
            .await
            .is_err(),
        "a mute plugin answered PluginInfo"
    );
    assert_eq!(
        p.kill().await,
        ExitOutcome::Signal(drover_plugin_sdk::Signal::KILL)
    );
    // Its socket and the directory it made for it went with it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
