//! Hot upgrade from the built-in rawexec process to the rawexec library loaded in
//! process, with running tasks.

use crate::common;

use std::time::Duration;

use common::inproc::*;
use common::*;
use drover_test_support::until_blocking;

#[test]
fn running_tasks_move_from_the_rawexec_process_to_rawexec_in_process() {
    let Some(library) = built_library("drover-driver-rawexec") else {
        return;
    };
    let rig = InProcessRig::new("[plugin.rawexec]\nin_process = true\n");
    let agent = rig.start();
    healthy(&agent, "raw_exec");
    let ids: Vec<String> = (0..5)
        .map(|_| {
            started(
                &agent,
                "rawexec",
                r#"{"command":"/bin/sleep","args":["3600"]}"#,
            )["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let pids: Vec<String> = ids
        .iter()
        .map(|id| {
            agent.cli_json(&["task", "status", id, "--json"])["attributes"]["pid"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let staged = rig.root.path().join("rawexec.so");
    std::fs::copy(&library, &staged).unwrap();
    std::fs::rename(&staged, rig.plugins.join("rawexec.so")).unwrap();
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["in_process"] == true && r["state"] == "healthy")
    });
    println!("{:#}", row(&rows, "raw_exec"));
    until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(20),
        "handed over",
        || {
            ids.iter().all(|id| {
                let t = agent.cli_json(&["task", "status", id, "--json"]);
                t["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["type"] == "Recovered")
            })
        },
    );
    for (id, pid) in ids.iter().zip(&pids) {
        let t = agent.cli_json(&["task", "status", id, "--json"]);
        assert_eq!(t["state"], "running");
        assert_eq!(t["attributes"]["pid"].as_str().unwrap(), pid);
        let out = agent.cli(&["task", "stop", id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
