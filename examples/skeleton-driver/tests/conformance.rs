//! Run the SDK's conformance harness against the real skeleton binary. Copy this test
//! along with the driver.

use drover_plugin_sdk::testing::Conformance;

#[tokio::test]
async fn skeleton_driver_conforms() {
    let report = Conformance::new(env!("CARGO_BIN_EXE_drover-skeleton-driver"))
        .sample_task(serde_json::json!({ "run_for_ms": 50 }))
        .long_task(serde_json::json!({}))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    // The skeleton can recover tasks, so the harness also checked RecoverTask in a
    // fresh plugin process.
    assert!(
        report
            .steps
            .iter()
            .any(|s| s.name.starts_with("RecoverTask in a new process"))
    );
}
