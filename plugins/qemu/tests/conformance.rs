//! The SDK's conformance harness against the real qemu plugin binary, with the VM
//! rig's guest: a sample task that boots and powers itself off (exit 0), a long task
//! that runs until stopped.

mod common;

use common::*;
use drover_plugin_sdk::testing::Conformance;
use serde_json::json;

#[tokio::test]
async fn qemu_conforms() {
    let Some(rig) = rig() else { return };
    let report = Conformance::new(BIN)
        .plugin_config(rig_config(&rig))
        .sample_task(guest(&rig, &["drover.poweroff=1"], json!({})))
        .long_task(guest(&rig, &["drover.tick=1"], json!({})))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
}
