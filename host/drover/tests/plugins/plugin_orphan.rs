//! A plugin nobody can reach any more does not linger.
//!
//! Issue 10, scenario 8: "plugins left behind forever".

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use drover_test_support::procs::alive;

/// Scenario 8, as the issue tells it: the agent stops gracefully (its plugins keep
/// running for the next agent to reattach to), then its data dir is deleted and no agent
/// ever returns. The plugins must not stay behind.
#[test]
fn plugins_left_behind_exit_once_their_agents_data_dir_is_deleted() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    crate::common::copy_exec(
        workspace_bin("drover-skeleton-driver"),
        dir.join("skeleton"),
    );
    let mut agent = Agent::start(root.path(), &dir, &[]);
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        ["skeleton", "raw_exec"].iter().all(|n| {
            rows.iter()
                .any(|r| r["name"] == *n && r["state"] == "healthy")
        })
    });
    let pids: Vec<u32> = rows
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .map(|p| p as u32)
        .collect();
    assert!(pids.len() >= 2, "{rows:#?}");
    assert!(agent.stop().success(), "{}", agent.log_text());

    // Stopped gracefully, the agent leaves its plugins running, and they stay: a
    // plugin whose socket is still there waits for the next agent. Observing that they
    // stay takes a while by nature: longer than the plugins' orphan check interval.
    std::thread::sleep(drover_plugin_sdk::server::ORPHAN_CHECK_INTERVAL + Duration::from_secs(1));
    for pid in &pids {
        assert!(
            alive(*pid),
            "plugin pid {pid} exited after a graceful agent stop"
        );
    }

    std::fs::remove_dir_all(&agent.data_dir).unwrap();
    let deleted = Instant::now();
    // The bound: one check interval to notice, 1 s for the driver's shutdown hook, the
    // server's short grace, and generous slack for a loaded machine (the wait ends as
    // soon as they are gone; the time taken is printed below).
    let bound = drover_plugin_sdk::server::ORPHAN_CHECK_INTERVAL * 2 + Duration::from_secs(15);
    drover_test_support::until_blocking(
        bound,
        Duration::from_millis(20),
        "every plugin of the deleted data dir exits",
        || pids.iter().all(|p| !alive(*p)),
    );
    eprintln!(
        "plugins exited {:?} after their data dir was deleted",
        deleted.elapsed()
    );
}
