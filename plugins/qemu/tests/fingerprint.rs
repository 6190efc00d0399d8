//! The fingerprint through the real plugin binary: qemu found (version, emulators,
//! whether KVM works, and why not), or undetected, saying where it looked.

mod common;

use common::*;
use drover_plugin_sdk::{Fingerprint, Health};
use serde_json::{Value, json};

async fn first_fingerprint(config: Value) -> Fingerprint {
    let dir = tempfile::tempdir().unwrap();
    Plugin::launch(dir.path(), config)
        .await
        .fingerprinted()
        .await
}

#[tokio::test]
async fn qemu_found_is_reported_with_its_version_emulators_and_kvm() {
    // The rig's check finds qemu (and says so loudly when it is missing).
    if rig().is_none() {
        return;
    }
    let fp = first_fingerprint(json!({})).await;
    assert_eq!(fp.health, Health::Healthy, "{fp:?}");
    let version = &fp.attributes["driver.qemu.version"];
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{fp:?}"
    );
    assert!(
        fp.attributes["driver.qemu.emulators"]
            .split(',')
            .any(|a| a == "x86_64"),
        "{fp:?}"
    );
    match fp.attributes["driver.qemu.kvm"].as_str() {
        "true" => assert!(!fp.attributes.contains_key("driver.qemu.kvm_reason")),
        "false" => assert!(
            !fp.attributes["driver.qemu.kvm_reason"].is_empty()
                && fp
                    .description
                    .contains(&fp.attributes["driver.qemu.kvm_reason"]),
            "{fp:?}"
        ),
        other => panic!("driver.qemu.kvm is {other:?}"),
    }
}

#[tokio::test]
async fn without_qemu_the_driver_is_undetected_saying_where_it_looked() {
    let empty = tempfile::tempdir().unwrap();
    let fp = first_fingerprint(json!({ "emulators": [empty.path()] })).await;
    assert_eq!(fp.health, Health::Undetected, "{fp:?}");
    assert!(
        fp.description.contains("no qemu-system-*")
            && fp.description.contains(&empty.path().display().to_string()),
        "{fp:?}"
    );
}

/// The KVM trial qemu of a plugin that exits mid-trial dies with it (under a KVM that
/// hangs guests, as here, it would otherwise run forever).
#[tokio::test]
async fn a_plugin_shut_down_mid_kvm_trial_leaves_no_trial_behind() {
    if rig().is_none() {
        return;
    }
    let process = launch_unconfigured().await;
    // The plugin probes at start-up; its trial guest's image names the plugin's pid.
    let marker = format!("drover-qemu-probe-{}-", process.pid());
    let trials = || qemus_with(&marker);
    let started = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while trials().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    if started.is_err() {
        eprintln!("SKIPPED: no KVM trial seen running (it ended at once: KVM works or is absent)");
        let _ = within(PROMPT, "shutdown", process.shutdown()).await;
        return;
    }
    let _ = within(PROMPT, "shutdown", process.shutdown()).await;
    until(PROMPT, "the trial qemu dies with its plugin", || {
        trials().is_empty()
    })
    .await;
}
