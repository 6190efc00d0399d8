//! The security review's findings, through the real plugin binary: a task config that
//! would reach host files or ports is refused before anything starts (no executor, no
//! qemu process), naming what is wrong; an emulator others could replace is not used.

mod common;

use common::*;
use drover_plugin_sdk::{DriverError, Health};
use drover_test_support::vm::Rig;
use serde_json::{Value, json};

/// A plugin with the rig's files allowed, `extra` merged into its config.
async fn plugin(rig: &Rig, dir: &std::path::Path, extra: Value) -> Plugin {
    let mut config = rig_config(rig);
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    Plugin::launch(dir, config).await
}

/// Task `id` with `config` is refused as invalid, and neither its executor nor any qemu
/// of this plugin exists; the message.
async fn refused_before_start(p: &Plugin, id: &str, config: Value) -> String {
    let err = match p.try_start(id, &config).await {
        Err(e) => e,
        Ok(_) => panic!("{config} was accepted"),
    };
    assert!(
        matches!(err, DriverError::InvalidConfig(_)),
        "{config}: {err:?}"
    );
    assert!(!p.executor_dir(id).exists(), "an executor for {id}");
    let qemus = qemus_with(&p.dir.display().to_string());
    assert!(qemus.is_empty(), "qemu started for {id}: {qemus:?}");
    err.to_string()
}

/// H1: a plain argument in `args` is a disk image to qemu, opened as root read-write.
/// It is refused with the default (empty) allowlist and after an allowed flag.
#[tokio::test]
async fn a_plain_argument_in_args_is_refused_and_starts_no_qemu() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(&rig, dir.path(), json!({ "args_allowlist": ["-device"] })).await;
    // A stand-in for /etc/shadow: if the check failed, qemu would attach this file.
    let host_file = dir.path().join("host-secret");
    std::fs::write(&host_file, "root only").unwrap();
    let host_file = host_file.display().to_string();
    for (id, args) in [
        ("plain", json!([host_file])),
        ("after", json!(["-device", "virtio-rng-pci", host_file])),
    ] {
        let config = guest(&rig, &[], json!({ "args": args }));
        let m = refused_before_start(&p, id, config).await;
        assert!(
            m.contains(&host_file) && m.contains("disk image"),
            "{id}: {m}"
        );
    }
    // Without an allowlist, any args at all.
    let strict_dir = tempfile::tempdir().unwrap();
    let strict = plugin(&rig, strict_dir.path(), json!({})).await;
    let config = guest(&rig, &[], json!({ "args": [host_file] }));
    let m = refused_before_start(&strict, "strict", config).await;
    assert!(m.contains("args_allowlist is empty"), "{m}");
    // M1: an allowed flag's value naming a host file.
    let config = guest(
        &rig,
        &[],
        json!({ "args": ["-device", format!("loader,file={host_file},addr=0x200000")] }),
    );
    let m = refused_before_start(&p, "value", config).await;
    assert!(m.contains("-device") && m.contains("file="), "{m}");
}

/// M2: a task cannot bind every interface or a privileged port; the operator can allow
/// it in the plugin's settings.
#[tokio::test]
async fn port_forwards_outside_the_operators_settings_are_refused() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(&rig, dir.path(), json!({})).await;
    let config = guest(
        &rig,
        &["drover.net=1"],
        json!({ "port_forwards": [{ "host": 18081, "guest": 80, "host_ip": "0.0.0.0" }] }),
    );
    let m = refused_before_start(&p, "any", config).await;
    assert!(
        m.contains("host_ip 0.0.0.0") && m.contains("port_forward_host_ips"),
        "{m}"
    );
    let config = guest(
        &rig,
        &["drover.net=1"],
        json!({ "port_forwards": [{ "host": 81, "guest": 80 }] }),
    );
    let m = refused_before_start(&p, "low", config).await;
    assert!(
        m.contains("host port 81") && m.contains("port_forward_min_host_port"),
        "{m}"
    );
}

/// H2: a comma in `initrd` would make qemu load a second file (multiboot modules).
#[tokio::test]
async fn a_comma_in_a_file_name_is_refused() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(&rig, dir.path(), json!({})).await;
    let local = p.task_dir("comma").join("local");
    std::fs::create_dir_all(local.join("x,/etc")).unwrap();
    std::fs::write(local.join("x"), "x").unwrap();
    std::fs::write(local.join("x,/etc/shadow"), "x").unwrap();
    let mut config = guest(&rig, &[], json!({}));
    config["initrd"] = json!("local/x,/etc/shadow");
    let m = refused_before_start(&p, "comma", config).await;
    assert!(
        m.contains("initrd") && m.contains("local/x,/etc/shadow"),
        "{m}"
    );
}

/// L2: a qemu binary another user could replace is not used, and the fingerprint
/// says why.
#[tokio::test]
async fn a_writable_emulator_is_skipped_and_the_fingerprint_says_why() {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let emulators = dir.path().join("emulators");
    std::fs::create_dir(&emulators).unwrap();
    let copy = emulators.join("qemu-system-x86_64");
    std::fs::copy(&rig.qemu, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o777)).unwrap();
    let fp = Plugin::launch(dir.path(), json!({ "emulators": [emulators] }))
        .await
        .fingerprinted()
        .await;
    assert_eq!(fp.health, Health::Undetected, "{fp:?}");
    assert!(
        fp.description.contains(&copy.display().to_string())
            && fp.description.contains("world-writable"),
        "{fp:?}"
    );
}
