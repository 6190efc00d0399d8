//! Run the SDK's conformance harness against the real skeleton, in both of its forms:
//! the plugin binary and the shared library. Copy this test along with the driver.

use drover_plugin_sdk::testing::Conformance;

#[tokio::test]
async fn skeleton_driver_conforms() {
    check(Conformance::new(env!(
        "CARGO_BIN_EXE_drover-skeleton-driver"
    )))
    .await;
}

/// The same checks against the skeleton built as a library
/// (`libdrover_skeleton_driver.so`, next to this test's executable), loaded into this
/// process as an agent with `in_process = true` loads it. Its tasks are simulated in
/// the driver, so it needs no executor program.
#[tokio::test]
async fn skeleton_driver_conforms_in_process() {
    let Some(library) = drover_plugin_sdk::testing::built_library("libdrover_skeleton_driver.so")
    else {
        return;
    };
    check(Conformance::shared_library(library)).await;
}

/// Run the harness with the skeleton's tasks, in either form.
async fn check(form: Conformance) {
    let report = form
        .sample_task(serde_json::json!({ "run_for_ms": 50 }))
        .long_task(serde_json::json!({}))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    // The skeleton can recover tasks, so the harness also checked RecoverTask in a
    // fresh plugin (a new process; in process, a fresh runtime and driver in the same
    // library).
    assert!(
        report
            .steps
            .iter()
            .any(|s| s.name.starts_with("RecoverTask in a new plugin")),
        "{report}"
    );
}
