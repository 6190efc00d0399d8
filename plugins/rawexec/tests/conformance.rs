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

/// The same checks against rawexec built as a library (`libdrover_driver_rawexec.so`,
/// next to this test's executable in target/*/deps), loaded into this process as an
/// agent with `in_process = true` loads it. Its executors are the rawexec binary (in a
/// test the host is this test binary, which is no executor).
#[tokio::test]
async fn rawexec_conforms_in_process() {
    let Some(library) = drover_plugin_sdk::testing::built_library("libdrover_driver_rawexec.so")
    else {
        return;
    };
    let report = Conformance::shared_library(library)
        .executor(env!("CARGO_BIN_EXE_drover-driver-rawexec"))
        .sample_task(serde_json::json!({ "command": "/bin/sh", "args": ["-c", "exit 0"] }))
        .long_task(serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
}
