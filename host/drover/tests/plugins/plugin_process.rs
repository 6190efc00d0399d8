//! What the SDK promises about a plugin process, checked on real plugin binaries.

use crate::common;

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

/// A plugin that is killed cannot remove its socket directory; the host knows where it
/// is and removes it, whether it killed the plugin or something else did.
#[tokio::test]
async fn a_killed_plugins_socket_dir_is_removed_by_the_host() {
    let root = tempfile::tempdir().unwrap();
    for external_kill in [false, true] {
        let mut opts = LaunchOptions::new("skeleton", workspace_bin("drover-skeleton-driver"));
        opts.socket_dir = Some(root.path().to_owned());
        let plugin = PluginProcess::launch(opts).await.expect("launch");
        let PluginAddr::Unix(sock) = plugin.handshake().addr.clone() else {
            panic!("expected a unix socket");
        };
        let dir = sock.parent().unwrap().to_owned();
        assert!(dir.is_dir());
        let how = if external_kill {
            nix_kill(plugin.pid(), nix::sys::signal::Signal::SIGKILL as i32).unwrap();
            plugin.exited().await
        } else {
            plugin.kill().await
        };
        assert_eq!(
            how,
            ExitOutcome::Signal(drover_plugin_sdk::Signal::KILL),
            "{how}"
        );
        assert!(
            !dir.exists(),
            "the killed plugin's socket dir {} was left behind (external kill: {external_kill})",
            dir.display()
        );
    }
    // Nothing else was touched: the base dir itself stays, empty.
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

/// A plugin's handshake line may name any socket: the host connects only to one that a
/// process of the plugin's own group serves. A plugin that names another plugin's live
/// socket is refused before any RPC (the host would otherwise identify, configure and
/// at last shut down the other plugin as if it were the liar), and the other plugin is
/// left serving.
#[tokio::test]
async fn a_plugin_naming_another_plugins_socket_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut opts = LaunchOptions::new("skeleton", workspace_bin("drover-skeleton-driver"));
    opts.socket_dir = Some(root.path().to_owned());
    let honest = PluginProcess::launch(opts).await.expect("launch");
    let PluginAddr::Unix(sock) = honest.handshake().addr.clone() else {
        panic!("expected a unix socket");
    };
    let liar = root.path().join("liar");
    let pid_file = root.path().join("liar.pid");
    write_exec(
        &liar,
        &format!(
            "#!/bin/sh\necho $$ > '{}'\necho '1|1|unix|{}|grpc'\nexec sleep 1000\n",
            pid_file.display(),
            sock.display()
        ),
        0o755,
    );
    let Err(err) = PluginProcess::launch(LaunchOptions::new("liar", &liar)).await else {
        panic!("a plugin naming another plugin's socket was accepted");
    };
    let msg = err.to_string();
    assert!(
        matches!(err, LaunchError::Connect { .. })
            && msg.contains(&sock.display().to_string())
            && msg.contains("is not the plugin's socket")
            && msg.contains(&format!("process group {}", honest.pid())),
        "{msg}"
    );
    // The liar was killed with its launch.
    let liar_pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !drover_test_support::procs::alive(liar_pid),
        "the refused plugin {liar_pid} still runs"
    );
    assert!(sock.exists(), "the honest plugin's socket was removed");
    let info = honest
        .client()
        .plugin_info()
        .await
        .expect("still reachable");
    assert_eq!(info.name, "skeleton");
    honest.shutdown().await;
}

/// The serving process may be a child of the one the host launched (a wrapper script
/// that does not `exec`): it is in the plugin's process group, so it is accepted.
#[tokio::test]
async fn a_plugin_served_by_a_child_of_its_wrapper_is_accepted() {
    let root = tempfile::tempdir().unwrap();
    let wrapper = root.path().join("wrapper");
    write_exec(
        &wrapper,
        &format!(
            "#!/bin/sh\n'{}'\n",
            workspace_bin("drover-skeleton-driver").display()
        ),
        0o755,
    );
    let mut opts = LaunchOptions::new("skeleton", &wrapper);
    opts.socket_dir = Some(root.path().to_owned());
    let plugin = PluginProcess::launch(opts)
        .await
        .expect("launch via a wrapper");
    let info = plugin.client().plugin_info().await.expect("plugin info");
    assert_eq!(info.name, "skeleton");
    plugin.kill().await;
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

/// A plugin that dies before its handshake takes whatever it forked along: its whole
/// process group is killed, not only the leader reaped.
#[tokio::test]
async fn a_plugin_exiting_before_the_handshake_takes_its_helpers_along() {
    let root = tempfile::tempdir().unwrap();
    let pidfile = root.path().join("helper.pid");
    let plugin = root.path().join("forks-and-dies");
    write_exec(
        &plugin,
        &format!(
            "#!/bin/sh\nsleep 1000 </dev/null >/dev/null 2>&1 &\necho $! > {}\nexit 3\n",
            pidfile.display()
        ),
        0o755,
    );
    let err = PluginProcess::launch(LaunchOptions::new("forks-and-dies", &plugin))
        .await
        .expect_err("a plugin that exits cannot launch");
    assert!(
        matches!(err, LaunchError::Exited { .. }) && err.to_string().contains("exit code 3"),
        "{err}"
    );
    let helper: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Should the test fail, the helper must not outlive it either.
    struct Reap(u32);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = nix_kill(self.0, 9);
        }
    }
    let _reap = Reap(helper);
    drover_test_support::until(
        std::time::Duration::from_secs(2),
        &format!("the helper (pid {helper}) the plugin forked is killed with the failed launch"),
        || !drover_test_support::procs::alive(helper),
    )
    .await;
}

/// With `executable` set, the launcher runs the open file, not whatever the path names:
/// here the path does not even exist. A `#!` script runs from its descriptor too.
#[tokio::test]
async fn the_launcher_executes_the_descriptor_it_is_given() {
    let root = tempfile::tempdir().unwrap();
    let skeleton = std::fs::File::open(workspace_bin("drover-skeleton-driver")).unwrap();
    let mut opts = LaunchOptions::new("skeleton", root.path().join("no-such-file"));
    opts.executable = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(skeleton)));
    opts.socket_dir = Some(root.path().to_owned());
    let plugin = PluginProcess::launch(opts)
        .await
        .expect("launch from the fd");
    assert_eq!(
        plugin.client().plugin_info().await.unwrap().name,
        "skeleton"
    );
    // The kernel names a process run from a descriptor after the fd number; serve()
    // names it after its argv[0] again.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", plugin.pid())).unwrap();
    assert_eq!(comm.trim(), "no-such-file");
    assert!(plugin.shutdown().await.is_success());

    let script = root.path().join("wrapper");
    write_exec(
        &script,
        &format!(
            "#!/bin/sh\nexec {} \"$@\"\n",
            workspace_bin("drover-skeleton-driver").display()
        ),
        0o755,
    );
    let mut opts = LaunchOptions::new("wrapper", &script);
    opts.executable = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(
        std::fs::File::open(&script).unwrap(),
    )));
    opts.socket_dir = Some(root.path().to_owned());
    // The path now names something else: the descriptor still runs the script.
    std::fs::remove_file(&script).unwrap();
    let plugin = PluginProcess::launch(opts)
        .await
        .expect("launch a script from its fd");
    assert_eq!(
        plugin.client().plugin_info().await.unwrap().name,
        "skeleton"
    );
    assert!(plugin.shutdown().await.is_success());
}
