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
