//! The CSI client and the agent's plugin supervisor against the real kubernetes-csi
//! hostpath plugin (a test peer from `../shared/csi/`): launched from a
//! `[csi_plugin.ID]` config, fingerprinted, then a volume's whole life: CreateVolume,
//! NodeStage, NodePublish (a real bind mount) with data written through it, the reverse,
//! a second publish reading the data back, DeleteVolume.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_host::csi::plugins::{CsiPluginConfig, CsiPlugins};
use drover_host::csi::{Capability, CsiError};
use drover_server_api::csi::{CsiAccessMode, CsiPluginType};
use tokio_util::sync::CancellationToken;

/// Whether `path` is a mount point, from /proc/self/mountinfo (field 5).
fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == want)
}

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("the CSI hostpath test needs root (it mounts): CI=true, a failure");
    }
    eprintln!("SKIPPED: the CSI hostpath test needs root (the plugin mounts)");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_plugin_stages_publishes_and_keeps_data() {
    let Some(peers) = drover_test_support::csi::peers() else {
        return;
    };
    if !root_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let state_dir = tmp.path().join("hostpath-state");
    let config = CsiPluginConfig {
        plugin_type: CsiPluginType::Monolith,
        command: peers.hostpath(),
        args: [
            "-endpoint",
            "{endpoint}",
            "-nodeid",
            "{node_id}",
            "-statedir",
            &state_dir.to_string_lossy(),
        ]
        .map(String::from)
        .to_vec(),
        env: BTreeMap::new(),
        mount_dir: None,
    };
    let configs = BTreeMap::from([("hostpath".to_owned(), config)]);
    let stop = CancellationToken::new();
    let plugins = CsiPlugins::start(&configs, tmp.path(), "node-under-test", stop.clone())
        .expect("start the plugins");
    plugins
        .wait_healthy("hostpath", Duration::from_secs(30))
        .await
        .expect("hostpath becomes healthy");
    let plugin = plugins.get("hostpath").expect("configured");

    // The fingerprint the servers would get.
    let f = plugin.fingerprint();
    assert!(f.healthy, "{f:?}");
    assert_eq!(f.provider, "hostpath.csi.k8s.io");
    assert_eq!(f.node_id, "node-under-test", "{{node_id}} reaches -nodeid");
    assert!(f.node.as_ref().is_some_and(|n| n.stage_unstage), "{f:?}");
    assert!(
        f.controller.as_ref().is_some_and(|c| c.create_delete),
        "{f:?}"
    );
    // The socket's directory is private.
    use std::os::unix::fs::PermissionsExt;
    let sock_dir = plugin.socket().parent().expect("socket dir");
    let mode = std::fs::metadata(sock_dir)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "{}", sock_dir.display());

    let client = plugin.client().await.expect("connect");
    let cap = Capability::file_system(CsiAccessMode::SingleNodeWriter);
    let none = BTreeMap::new();
    let vol = client
        .create_volume(
            "drover-test-vol",
            (1 << 20, 0),
            std::slice::from_ref(&cap),
            &none,
            &none,
        )
        .await
        .expect("CreateVolume");
    assert!(!vol.external_id.is_empty());
    // Idempotent by name (the spec): the same volume again.
    let again = client
        .create_volume(
            "drover-test-vol",
            (1 << 20, 0),
            std::slice::from_ref(&cap),
            &none,
            &none,
        )
        .await
        .expect("CreateVolume again");
    assert_eq!(again.external_id, vol.external_id);

    let staging = plugin.mount_dir().join("staging").join("drover-test-vol");
    std::fs::create_dir_all(&staging).expect("staging dir");
    let alloc_a = plugin.mount_dir().join("per-alloc").join("a");
    std::fs::create_dir_all(&alloc_a).expect("target parent");
    let target_a = alloc_a.join("drover-test-vol");

    // The plugin advertises STAGE_UNSTAGE: publishing before staging is refused.
    let early = client
        .node_publish(
            &vol.external_id,
            Some(&staging),
            &target_a,
            &cap,
            false,
            &none,
            &vol.context,
            &none,
        )
        .await;
    match early {
        Err(CsiError::Rpc { code, .. }) => assert_eq!(code, tonic::Code::FailedPrecondition),
        other => panic!("NodePublish before NodeStage: {other:?}"),
    }

    client
        .node_stage(&vol.external_id, &staging, &cap, &none, &vol.context, &none)
        .await
        .expect("NodeStage");
    client
        .node_publish(
            &vol.external_id,
            Some(&staging),
            &target_a,
            &cap,
            false,
            &none,
            &vol.context,
            &none,
        )
        .await
        .expect("NodePublish");
    assert!(
        is_mount_point(&target_a),
        "{} is a bind mount",
        target_a.display()
    );
    std::fs::write(target_a.join("data.txt"), b"kept by the volume")
        .expect("write through the mount");
    client
        .node_unpublish(&vol.external_id, &target_a)
        .await
        .expect("NodeUnpublish");
    assert!(!is_mount_point(&target_a));
    assert!(
        !target_a.join("data.txt").exists(),
        "the data was in the volume, not the target dir"
    );

    // A second "allocation" reads it back.
    let alloc_b = plugin.mount_dir().join("per-alloc").join("b");
    std::fs::create_dir_all(&alloc_b).expect("target parent");
    let target_b = alloc_b.join("drover-test-vol");
    client
        .node_publish(
            &vol.external_id,
            Some(&staging),
            &target_b,
            &cap,
            true,
            &none,
            &vol.context,
            &none,
        )
        .await
        .expect("NodePublish read-only");
    let data = std::fs::read(target_b.join("data.txt")).expect("read back");
    assert_eq!(data, b"kept by the volume");
    assert!(
        std::fs::write(target_b.join("other.txt"), b"x").is_err(),
        "a read-only publish refuses writes"
    );
    client
        .node_unpublish(&vol.external_id, &target_b)
        .await
        .expect("NodeUnpublish");
    client
        .node_unstage(&vol.external_id, &staging)
        .await
        .expect("NodeUnstage");
    client
        .delete_volume(&vol.external_id, &none)
        .await
        .expect("DeleteVolume");
    // Deleting a volume that is gone is not an error (the spec).
    client
        .delete_volume(&vol.external_id, &none)
        .await
        .expect("DeleteVolume again");

    stop.cancel();
    drover_test_support::until(Duration::from_secs(10), "the plugin marked stopped", || {
        !plugin.fingerprint().healthy
    })
    .await;
}

/// The hostpath plugin processes this test process launched whose command line names
/// `state_dir`.
fn plugin_pids(state_dir: &Path) -> Vec<u32> {
    let me = std::process::id();
    let want = state_dir.to_string_lossy().into_owned();
    drover_test_support::procs::processes(|ppid, _| ppid == me)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&want))
                .unwrap_or(false)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_dies_is_relaunched_and_healthy_again() {
    let Some(peers) = drover_test_support::csi::peers() else {
        return;
    };
    if !root_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let state_dir = tmp.path().join("relaunch-state");
    let config = CsiPluginConfig {
        plugin_type: CsiPluginType::Node,
        command: peers.hostpath(),
        args: vec![
            "-endpoint".into(),
            "{endpoint}".into(),
            "-nodeid".into(),
            "n".into(),
            "-statedir".into(),
            state_dir.to_string_lossy().into_owned(),
        ],
        env: BTreeMap::new(),
        mount_dir: None,
    };
    let stop = CancellationToken::new();
    let plugins = CsiPlugins::start(
        &BTreeMap::from([("hp".to_owned(), config)]),
        tmp.path(),
        "n",
        stop.clone(),
    )
    .expect("start");
    plugins
        .wait_healthy("hp", Duration::from_secs(30))
        .await
        .expect("healthy");
    let plugin = plugins.get("hp").expect("configured");
    assert!(plugin.fingerprint().node.is_some() && plugin.fingerprint().controller.is_none());
    let first = plugin_pids(&state_dir);
    assert_eq!(first.len(), 1, "{first:?}");
    let killed = std::process::Command::new("kill")
        .args(["-9", &first[0].to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    drover_test_support::until(
        Duration::from_secs(10),
        "the plugin marked unhealthy",
        || !plugin.fingerprint().healthy,
    )
    .await;
    plugins
        .wait_healthy("hp", Duration::from_secs(30))
        .await
        .expect("healthy again");
    let second = plugin_pids(&state_dir);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first, "a new process");
    stop.cancel();
    drover_test_support::until(
        Duration::from_secs(10),
        "the plugin gone with the stop",
        || plugin_pids(&state_dir).is_empty(),
    )
    .await;
}
