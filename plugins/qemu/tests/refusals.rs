//! Bad task configs are refused before qemu starts: no executor, no executor
//! directory, no qemu process; the error names what is wrong. Real plugin binary,
//! real files (the images are stand-ins: nothing boots).

mod common;

use common::*;
use drover_plugin_sdk::DriverError;
use serde_json::{Value, json};

struct Setup {
    _dir: tempfile::TempDir,
    plugin: Plugin,
    images: std::path::PathBuf,
}

async fn setup(extra: Value) -> Option<Setup> {
    // Refusals need no guest, but they do need a qemu for the driver to be detected.
    rig()?;
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("vmlinuz"), "not really a kernel").unwrap();
    let mut config = json!({ "image_paths": [images], "args_allowlist": ["-device"] });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let plugin = Plugin::launch(dir.path(), config).await;
    Some(Setup {
        _dir: dir,
        plugin,
        images,
    })
}

/// Start `config` as task `id`, expect a refusal, check that nothing started, and
/// return the message.
async fn refused(s: &Setup, id: &str, config: Value) -> String {
    let err = match s.plugin.try_start(id, &config).await {
        Err(e) => e,
        Ok(_) => panic!("{config} was accepted"),
    };
    assert!(
        matches!(err, DriverError::InvalidConfig(_)),
        "{config}: {err:?}"
    );
    assert!(!s.plugin.executor_dir(id).exists(), "no executor for {id}");
    assert!(
        qemus_with(&s.plugin.dir.display().to_string()).is_empty(),
        "no qemu for {id}"
    );
    err.to_string()
}

#[tokio::test]
async fn each_bad_input_is_refused_before_qemu_starts_naming_it() {
    let Some(s) = setup(json!({})).await else {
        return;
    };
    let kernel = s.images.join("vmlinuz");

    // Outside the task dir and image_paths (a real file: refused for where it is).
    let m = refused(&s, "outside", json!({ "kernel": "/etc/hostname" })).await;
    assert!(
        m.contains("\"/etc/hostname\"") && m.contains(&s.images.display().to_string()),
        "{m}"
    );
    // A link under image_paths that leads out is judged by where it leads.
    std::os::unix::fs::symlink("/etc/hostname", s.images.join("escape")).unwrap();
    let m = refused(&s, "escape", json!({ "kernel": s.images.join("escape") })).await;
    assert!(m.contains("outside the places images may come from"), "{m}");

    // A symlink in the task dir is not followed, even to an allowed image.
    let task_dir = s.plugin.task_dir("link");
    std::fs::create_dir_all(task_dir.join("local")).unwrap();
    std::os::unix::fs::symlink(&kernel, task_dir.join("local/vmlinuz")).unwrap();
    let m = refused(&s, "link", json!({ "kernel": "local/vmlinuz" })).await;
    assert!(
        m.contains("local/vmlinuz") && m.contains("links in the task directory are not followed"),
        "{m}"
    );
    // Also through an absolute path into the task dir.
    let m = refused(
        &s,
        "link",
        json!({ "kernel": task_dir.join("local/vmlinuz") }),
    )
    .await;
    assert!(m.contains("links in the task directory"), "{m}");

    // Missing files, named.
    let m = refused(&s, "missing", json!({ "image_path": "local/disk.qcow2" })).await;
    assert!(
        m.contains("local/disk.qcow2") && m.contains("does not exist"),
        "{m}"
    );
    let gone = s.images.join("gone.img");
    let m = refused(&s, "missing2", json!({ "image_path": gone })).await;
    assert!(
        m.contains(&gone.display().to_string()) && m.contains("does not exist"),
        "{m}"
    );

    // A flag not in args_allowlist; an allowed flag passes this check.
    let m = refused(
        &s,
        "args",
        json!({ "kernel": kernel, "args": ["-device", "virtio-rng-pci", "-chardev", "file,id=x,path=/etc/shadow"] }),
    )
    .await;
    assert!(
        m.contains("-chardev") && m.contains("args_allowlist"),
        "{m}"
    );

    // A typo'd field, named (refused by the SDK's parsing, before the driver).
    let err = s
        .plugin
        .try_start("typo", &json!({ "kernel": kernel, "grace_shutdown": true }))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("grace_shutdown"), "{err}");
    assert!(!s.plugin.executor_dir("typo").exists());

    // Values that would add qemu options.
    let m = refused(
        &s,
        "machine",
        json!({ "kernel": kernel, "machine": "q35,memory-backend=x" }),
    )
    .await;
    assert!(m.contains("machine"), "{m}");
    let m = refused(&s, "nothing", json!({ "cpus": 2 })).await;
    assert!(m.contains("image_path") && m.contains("kernel"), "{m}");
}

/// A qcow2 image from the task dir naming another file (a backing file, an external
/// data file) is refused: qemu would open the host file it names.
#[tokio::test]
async fn a_task_image_with_a_backing_file_is_refused() {
    let Some(s) = setup(json!({})).await else {
        return;
    };
    let local = s.plugin.task_dir("backing").join("local");
    std::fs::create_dir_all(&local).unwrap();
    let mut header = vec![0u8; 512];
    header[..4].copy_from_slice(b"QFI\xfb");
    header[7] = 3; // version 3
    header[15] = 0x80; // backing file name at offset 128
    std::fs::write(local.join("disk.qcow2"), &header).unwrap();
    let m = refused(&s, "backing", json!({ "image_path": "local/disk.qcow2" })).await;
    assert!(m.contains("a backing file"), "{m}");
    // An external data file is a host file named in the image too.
    header[15] = 0;
    header[79] = 0x04; // incompatible features: external data file
    std::fs::write(local.join("disk.qcow2"), &header).unwrap();
    let m = refused(&s, "backing", json!({ "image_path": "local/disk.qcow2" })).await;
    assert!(m.contains("an external data file"), "{m}");
}

/// accelerator kvm is refused, saying why, where the fingerprint found KVM not
/// working (as on these machines).
#[tokio::test]
async fn kvm_is_refused_where_it_does_not_work() {
    let Some(s) = setup(json!({})).await else {
        return;
    };
    let fp = s.plugin.fingerprinted().await;
    if fp.attributes.get("driver.qemu.kvm").map(String::as_str) != Some("false") {
        eprintln!("SKIPPED: KVM works here ({fp:?}); nothing to refuse");
        return;
    }
    let why = fp.attributes["driver.qemu.kvm_reason"].clone();
    let m = refused(
        &s,
        "kvm",
        json!({ "kernel": s.images.join("vmlinuz"), "accelerator": "kvm" }),
    )
    .await;
    assert!(m.contains("KVM does not work") && m.contains(&why), "{m}");
}

/// Unknown plugin config fields, relative image_paths and non-flags in
/// args_allowlist are refused at SetConfig.
#[tokio::test]
async fn bad_plugin_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let process = launch_unconfigured().await;
    let agent = drover_plugin_sdk::AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
        .with_plugin_state_dir(dir.path().join("state"));
    for (config, names) in [
        (r#"{"image_path":["/srv"]}"#, "image_path"),
        (r#"{"image_paths":["images"]}"#, "images"),
        (
            r#"{"image_paths":["/nonexistent/images"]}"#,
            "/nonexistent/images",
        ),
        (r#"{"args_allowlist":["device"]}"#, "device"),
    ] {
        let err = within(
            PROMPT,
            "set config",
            process.client().set_config(config.into(), &agent),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains(names), "{config}: {err}");
    }
    let _ = within(PROMPT, "kill", process.kill()).await;
}
