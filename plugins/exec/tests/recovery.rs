//! Lifecycle of exec tasks through the real binary: signals reach the task through
//! its init and its own exit status is reported; tasks survive the plugin; and after
//! `kill -9` of both the plugin and the task's executor, DestroyTask still kills every
//! process of the task through its cgroup.

mod common;

use std::time::Duration;

use common::*;
use drover_plugin_sdk::{ExitOutcome, Signal, TaskState};
use serde_json::json;

fn kill9(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[tokio::test]
async fn signals_reach_the_task_through_its_init_and_its_own_exit_is_reported() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start("three", sh("exit 3")).await;
    p.start("killed", sh("kill -KILL $$")).await;
    p.start(
        "term",
        sh("trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done"),
    )
    .await;
    p.start(
        "usr1",
        sh("trap 'exit 7' USR1; echo ready; while :; do sleep 0.05; done"),
    )
    .await;
    // A plain process as pid 2 gets SIGTERM's default action.
    p.start("sleeper", json!({ "command": "sleep", "args": ["1000"] }))
        .await;
    assert_eq!(p.wait("three").await.exit_code, 3);
    let killed = p.wait("killed").await;
    assert_eq!((killed.exit_code, killed.signal), (0, 9), "{killed:?}");
    p.printed("term", "ready").await;
    p.printed("usr1", "ready").await;
    within(
        PROMPT,
        "stop",
        p.client
            .stop_task("term", Duration::from_secs(5), Signal::TERM),
    )
    .await
    .unwrap();
    assert_eq!(p.wait("term").await.exit_code, 42);
    within(PROMPT, "signal", p.client.signal_task("usr1", Signal::USR1))
        .await
        .unwrap();
    assert_eq!(p.wait("usr1").await.exit_code, 7);
    within(
        PROMPT,
        "stop",
        p.client
            .stop_task("sleeper", Duration::from_secs(5), Signal::TERM),
    )
    .await
    .unwrap();
    let r = p.wait("sleeper").await;
    assert_eq!(r.signal, 15, "{r:?}");
    for id in ["three", "killed", "term", "usr1", "sleeper"] {
        within(PROMPT, "destroy", p.client.destroy_task(id, false))
            .await
            .unwrap();
        assert!(!p.cgroup_dir("memory", id).exists(), "{id}: cgroup left");
    }
}

#[tokio::test]
async fn tasks_outlive_the_plugin_and_are_recovered_with_their_exit_codes() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = Plugin::launch(dir.path(), json!({})).await;
    let handle = first
        .start(
            "long",
            sh("trap 'exit 5' TERM; echo ready; while :; do sleep 0.05; done"),
        )
        .await;
    first.printed("long", "ready").await;
    let init: u32 = first.attribute("long", "pid").await.parse().unwrap();
    let how = within(PROMPT, "kill the plugin", first.process.kill()).await;
    assert_eq!(how, ExitOutcome::Signal(Signal::KILL), "{how}");
    assert!(alive(init), "the task died with its plugin");
    let second = first.relaunch().await;
    within(PROMPT, "recover", second.client.recover_task(handle))
        .await
        .unwrap();
    let status = within(PROMPT, "inspect", second.client.inspect_task("long"))
        .await
        .unwrap();
    assert_eq!(status.state, TaskState::Running);
    assert_eq!(status.attributes["pid"], init.to_string());
    within(
        PROMPT,
        "stop",
        second
            .client
            .stop_task("long", Duration::from_secs(5), Signal::TERM),
    )
    .await
    .unwrap();
    assert_eq!(second.wait("long").await.exit_code, 5);
}

/// Start a task with children, then kill -9 its plugin and its executor. Returns the
/// handle, the relaunched plugin and the pids in the task's cgroup.
async fn orphan(
    dir: &std::path::Path,
    id: &str,
) -> (Plugin, drover_plugin_sdk::TaskHandle, Vec<u32>) {
    let first = Plugin::launch(dir, json!({})).await;
    let handle = first
        .start(id, sh("sleep 1000 & sleep 1000 & echo ready; wait"))
        .await;
    first.printed(id, "ready").await;
    let executor: u32 = first.attribute(id, "executor_pid").await.parse().unwrap();
    let procs_file = first.cgroup_dir("pids", id).join("cgroup.procs");
    let pids = procs(&procs_file);
    assert!(pids.len() >= 4, "init, shell and two sleeps: {pids:?}");
    assert!(
        !pids.contains(&executor),
        "the executor is not in the task's cgroup"
    );
    let how = within(PROMPT, "kill the plugin", first.process.kill()).await;
    assert_eq!(how, ExitOutcome::Signal(Signal::KILL), "{how}");
    kill9(executor);
    until(PROMPT, "the executor dies", || !alive(executor)).await;
    assert!(
        pids.iter().all(|&p| alive(p)),
        "the task died with its executor"
    );
    let second = first.relaunch().await;
    // `first` is dropped here without its cleanup touching the cgroups `second` uses.
    std::mem::forget(first);
    (second, handle, pids)
}

async fn assert_all_gone(p: &Plugin, id: &str, pids: &[u32]) {
    until(PROMPT, "every process of the task is gone", || {
        pids.iter().all(|&pid| !alive(pid))
    })
    .await;
    let cg = p.cgroup(id);
    assert!(
        !cg.exists(),
        "the cgroup of {id} is left ({:?})",
        cg.version
    );
    let executors = state_dir(&p.dir).join("exec");
    let left: Vec<_> = std::fs::read_dir(&executors)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "executor dirs left: {left:?}");
}

#[tokio::test]
async fn destroy_kills_everything_after_kill_9_of_plugin_and_executor() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, handle, pids) = orphan(dir.path(), "orphan").await;
    within(PROMPT, "recover", p.client.recover_task(handle))
        .await
        .unwrap();
    let status = within(PROMPT, "inspect", p.client.inspect_task("orphan"))
        .await
        .unwrap();
    assert_eq!(status.state, TaskState::Running, "{status:?}");
    let err = within(PROMPT, "destroy", p.client.destroy_task("orphan", false))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("still running"), "{err}");
    within(PROMPT, "destroy", p.client.destroy_task("orphan", true))
        .await
        .unwrap();
    assert_all_gone(&p, "orphan", &pids).await;
}

#[tokio::test]
async fn destroy_by_id_works_even_without_a_recovery() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, _handle, pids) = orphan(dir.path(), "unknown").await;
    within(PROMPT, "destroy", p.client.destroy_task("unknown", true))
        .await
        .unwrap();
    assert_all_gone(&p, "unknown", &pids).await;
}

#[tokio::test]
async fn a_task_without_executor_is_stopped_and_waited_for_through_its_cgroup() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, handle, pids) = orphan(dir.path(), "stray").await;
    within(PROMPT, "recover", p.client.recover_task(handle))
        .await
        .unwrap();
    within(
        PROMPT,
        "stop",
        p.client
            .stop_task("stray", Duration::from_secs(2), Signal::TERM),
    )
    .await
    .unwrap();
    let exit = p.wait("stray").await;
    let why = exit.err.unwrap_or_default();
    assert!(why.contains("exit status is unknown"), "{why}");
    until(PROMPT, "every process of the task is gone", || {
        pids.iter().all(|&pid| !alive(pid))
    })
    .await;
    within(PROMPT, "destroy", p.client.destroy_task("stray", false))
        .await
        .unwrap();
    assert_all_gone(&p, "stray", &pids).await;
}
