//! The SDK's conformance harness against the real exec binary.

mod common;

use drover_plugin_sdk::testing::Conformance;

#[tokio::test]
async fn exec_conforms() {
    if !common::isolation_possible() {
        return;
    }
    let report = Conformance::new(common::BIN)
        .sample_task(serde_json::json!({ "command": "/bin/sh", "args": ["-c", "exit 0"] }))
        .long_task(serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
}
