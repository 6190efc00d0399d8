//! Restart policies end to end: the real agent, the real rawexec driver, a task that
//! crash-loops, driven through the HTTP API.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::tasks::*;
use common::*;
use drover_api::{StopRequest, TaskEventKind, TaskLifecycle};

/// Run a shell script that appends its start time (ns) to `marker`, then `exit 3`.
fn crash_loop(agent: &Agent, marker: &Path, restart: serde_json::Value) -> String {
    let script = format!("date +%s%N >> {}; exit 3", marker.display());
    let task = run(
        agent,
        serde_json::json!({
            "driver": "rawexec",
            "config": {"command": "/bin/sh", "args": ["-c", script]},
            "restart": restart,
        }),
    );
    task.id
}

/// Start times recorded by the task, in nanoseconds.
fn starts(marker: &Path) -> Vec<u128> {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().expect("date +%s%N line"))
        .collect()
}

#[test]
fn crash_loop_in_fail_mode_starts_exactly_attempts_plus_one_times() {
    let (root, agent) = agent();
    let marker = root.path().join("starts");
    let id = crash_loop(
        &agent,
        &marker,
        serde_json::json!({"attempts": 2, "interval": "1m", "delay": "200ms", "mode": "fail"}),
    );
    let api = agent.api();
    let dead = api.block_on(api.wait_task(&id)).expect("wait for the task");
    assert_eq!(dead.state, TaskLifecycle::Dead);
    assert_eq!(dead.exit_code, Some(3));
    assert_eq!(dead.restarts, 2);
    assert_eq!(
        kinds(&dead),
        [
            "Received",
            "Started",
            "Terminated",
            "Restarting",
            "Started",
            "Terminated",
            "Restarting",
            "Started",
            "Terminated",
            "NotRestarting"
        ],
        "{dead:#?}"
    );
    let events = agent_events(&dead);
    assert_eq!(events[2].message, "exit code 3");
    assert_eq!(events[3].message, "restarting in 200ms, attempt 1 of 2");
    assert_eq!(events[6].message, "restarting in 200ms, attempt 2 of 2");
    assert_eq!(events[9].message, "exceeded 2 attempts in 1m (mode fail)");
    assert!(
        events[1]
            .message
            .starts_with("task started by driver raw_exec (pid "),
        "{dead:#?}"
    );

    let starts = starts(&marker);
    assert_eq!(starts.len(), 3, "the task ran {} times", starts.len());
    for pair in starts.windows(2) {
        let gap = Duration::from_nanos((pair[1] - pair[0]) as u64);
        assert!(
            gap >= Duration::from_millis(200),
            "restart after {gap:?}, the policy says 200ms"
        );
    }
    // Nothing happens after NotRestarting.
    let again = api.block_on(api.get_task(&id)).expect("the task");
    assert_eq!(kinds(&again).len(), 10);
    assert_eq!(self::starts(&marker).len(), 3);
}

#[test]
fn crash_loop_in_delay_mode_waits_for_the_interval_and_restarts_again() {
    let (root, agent) = agent();
    let marker = root.path().join("starts");
    let id = crash_loop(
        &agent,
        &marker,
        // The interval leaves a loaded machine time to make the first restart in it.
        serde_json::json!({"attempts": 1, "interval": "5s", "delay": "100ms", "mode": "delay"}),
    );
    // Start 1, restart (1 of 1) after 100ms, start 2, attempts used up → wait until the
    // window (opened at the first exit) closes → start 3, restart → start 4.
    let api = agent.api();
    let deadline = Instant::now() + Duration::from_secs(30);
    while starts(&marker).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "only {} starts; task: {:#?}",
            starts(&marker).len(),
            api.block_on(api.get_task(&id))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = api
        .block_on(api.stop_task(&id, &StopRequest::default()))
        .expect("stop the task");
    assert_eq!(stopped.state, TaskLifecycle::Dead);
    let kinds = kinds(&stopped);
    assert!(!kinds.contains(&"NotRestarting".to_owned()), "{stopped:#?}");
    let started = kinds.iter().filter(|k| *k == "Started").count();
    assert!(
        started >= 4,
        "{started} Started events for 4 starts: {stopped:#?}"
    );
    let delayed = stopped
        .events
        .iter()
        .find(|e| e.kind == TaskEventKind::Restarting && e.message.contains("mode delay"))
        .unwrap_or_else(|| panic!("no delay-mode restart: {stopped:#?}"));
    assert!(
        delayed
            .message
            .starts_with("exceeded 1 attempts in 5s; restarting in "),
        "{delayed:#?}"
    );

    let s = starts(&marker);
    let ms = |a: u128, b: u128| Duration::from_nanos((b - a) as u64);
    assert!(ms(s[0], s[1]) >= Duration::from_millis(100));
    assert!(
        ms(s[0], s[1]) < Duration::from_secs(3),
        "first restart took {:?}",
        ms(s[0], s[1])
    );
    // The window opened at the first exit, right after start 1, and lasts 5s.
    assert!(
        ms(s[0], s[2]) >= Duration::from_millis(4950),
        "the delayed restart came {:?} after the first start, before the interval ended",
        ms(s[0], s[2])
    );
    // After the wait the count started over: the next restart is a normal one.
    assert!(ms(s[2], s[3]) >= Duration::from_millis(100));
    assert!(
        ms(s[2], s[3]) < Duration::from_secs(3),
        "the count did not start over: {:?}",
        ms(s[2], s[3])
    );
}
