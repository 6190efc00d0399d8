//! The SDK's conformance harness against the real rawexec binary.

use drover_plugin_sdk::testing::Conformance;

#[tokio::test]
async fn rawexec_conforms() {
    let report = Conformance::new(env!("CARGO_BIN_EXE_drover-driver-rawexec"))
        .sample_task(serde_json::json!({ "command": "/bin/sh", "args": ["-c", "exit 0"] }))
        .long_task(serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
}
