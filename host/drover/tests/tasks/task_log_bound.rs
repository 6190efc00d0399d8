//! Issue 10, "bounded everything": what a task may keep of its logs has an upper
//! bound, `max_files × max_file_size_mb` at most 1024 MiB per stream.

use crate::common;

use common::*;

#[test]
fn log_limits_above_the_bound_are_refused_with_the_reason() {
    let (root, agent) = rawexec_agent();
    // A spec file: refused by the CLI with the line.
    let spec = root.path().join("job.toml");
    std::fs::write(
        &spec,
        "driver = \"rawexec\"\n[config]\ncommand = \"/bin/true\"\n[logs]\nmax_files = 100\nmax_file_size_mb = 100\n",
    )
    .unwrap();
    let out = agent.cli(&["task", "run", spec.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "job.toml:6: logs.max_files × logs.max_file_size_mb is 100 × 100 = 10000 MiB per \
             stream, more than the maximum of 1024 MiB"
        ),
        "{err}"
    );
    // Straight to the API: refused by the agent, which creates nothing.
    let api = agent.api();
    let mut req = drover_api::RunRequest {
        driver: "rawexec".into(),
        config: drover_test_support::sh("true"),
        ..Default::default()
    };
    req.logs = Some(drover_api::LogConfig {
        max_files: 2000,
        max_file_size_mb: 1,
    });
    let e = api.block_on(api.run_task(&req)).unwrap_err();
    assert_eq!(e.status(), Some(drover_api::StatusCode::BAD_REQUEST), "{e}");
    assert!(
        e.to_string()
            .contains("2000 × 1 = 2000 MiB per stream, more than the maximum of 1024 MiB"),
        "{e}"
    );
    assert!(api.block_on(api.list_tasks()).unwrap().is_empty());
    // At the bound is fine.
    req.logs = Some(drover_api::LogConfig {
        max_files: 1024,
        max_file_size_mb: 1,
    });
    api.block_on(api.run_task(&req)).unwrap();
}
