//! The SDK's conformance harness against the real docker plugin binary and daemon.

mod common;

use std::os::unix::fs::PermissionsExt as _;

use common::*;
use drover_plugin_sdk::testing::Conformance;

#[tokio::test]
async fn docker_conforms() {
    let Some(env) = docker_env() else { return };
    // The harness configures the plugin with `{}`: the daemon comes from DOCKER_HOST,
    // which a wrapper script sets for the plugin alone.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("drover-driver-docker");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nDOCKER_HOST='{}' exec '{BIN}' \"$@\"\n",
            env.host
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let report = Conformance::new(&wrapper)
        .sample_task(serde_json::json!({ "image": env.image, "command": "true" }))
        // `init` forwards SIGTERM to sleep, so stops are prompt.
        .long_task(serde_json::json!({
            "image": env.image, "command": "sleep", "args": ["1000"], "init": true,
        }))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
}
