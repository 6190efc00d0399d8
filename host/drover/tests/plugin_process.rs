//! What the SDK promises about a plugin process, checked on real plugin binaries.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use common::*;
use drover_plugin_sdk::ExitOutcome;
use drover_plugin_sdk::client::{LaunchError, LaunchOptions, PluginProcess};
use drover_plugin_sdk::handshake::PluginAddr;

#[test]
fn plugin_run_by_hand_explains_itself_and_exits_1() {
    for bin in [
        workspace_bin("drover-skeleton-driver"),
        workspace_bin("drover-driver-rawexec"),
    ] {
        let out = Command::new(&bin)
            .env_remove("DROVER_PLUGIN_MAGIC_COOKIE")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", bin.display());
        assert!(
            out.stdout.is_empty(),
            "a plugin run by hand printed on stdout"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is a Drover plugin") && err.contains("plugin_dir"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn socket_is_private_and_shutdown_is_prompt() {
    let root = tempfile::tempdir().unwrap();
    let mut opts = LaunchOptions::new("skeleton", workspace_bin("drover-skeleton-driver"));
    opts.socket_dir = Some(root.path().to_owned());
    let plugin = PluginProcess::launch(opts).await.expect("launch");
    let PluginAddr::Unix(sock) = plugin.handshake().addr.clone() else {
        panic!("expected a unix socket");
    };
    assert!(
        sock.starts_with(root.path()),
        "PLUGIN_UNIX_SOCKET_DIR ignored: {}",
        sock.display()
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sock), 0o600, "socket mode");
    assert_eq!(mode(sock.parent().unwrap()), 0o700, "socket dir mode");
    let info = plugin.client().plugin_info().await.unwrap();
    assert_eq!(info.name, "skeleton");
    assert_eq!(info.api_versions, ["1.0.0"]);

    let t = std::time::Instant::now();
    let how = plugin.shutdown().await;
    // It exits by itself (exit code 0, not the SIGKILL after the grace period);
    // the bound only catches a hang on a loaded machine.
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert_eq!(how, ExitOutcome::Code(0));
    assert!(!sock.exists(), "socket left behind after shutdown");
    // A dead plugin gives a typed error, not a hang.
    let err = plugin.client().plugin_info().await.unwrap_err();
    assert!(err.to_string().contains("exited"), "{err}");
}

#[tokio::test]
async fn too_long_socket_path_is_a_precise_error() {
    let root = tempfile::tempdir().unwrap();
    let deep = root.path().join("d".repeat(100));
    std::fs::create_dir_all(&deep).unwrap();
    let mut opts = LaunchOptions::new("skeleton", workspace_bin("drover-skeleton-driver"));
    opts.socket_dir = Some(deep);
    let err = PluginProcess::launch(opts).await.unwrap_err();
    assert!(matches!(err, LaunchError::Exited { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("longer than the 107 a unix socket allows"),
        "{msg}"
    );
}
