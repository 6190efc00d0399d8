//! The cgroup limits of exec tasks, measured: memory (an OOM kill is reported as
//! such), pids (a fork bomb stops at the limit), CPU quota; and stats read from the
//! cgroup.

mod common;

use std::time::{Duration, Instant};

use common::*;
use drover_plugin_sdk::{LogConfig, Signal};
use serde_json::json;

#[tokio::test]
async fn a_task_past_its_memory_limit_is_oom_killed_and_says_so() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let mut spec = p.spec(
        "hog",
        // dd fills a 256 MiB buffer: far past the 32 MiB limit.
        sh("echo start; dd if=/dev/zero of=/dev/null bs=256M count=1; echo survived"),
    );
    spec.resources.memory_mb = 32;
    p.start_spec(spec).await;
    let cg = p.cgroup("hog");
    assert_eq!(cg.memory_max(), 32 << 20, "memory limit ({:?})", cg.version);
    let exit = p.wait("hog").await;
    // The shell went on after dd died, so the task's own exit is the shell's: what
    // matters is that the OOM kill inside it is reported.
    assert!(exit.oom_killed, "{exit:?}\n{}", p.log("hog", "stderr"));
    assert!(!exit.successful());
    // The kernel counted it where the driver looked (v1 memory.oom_control, v2
    // memory.events).
    assert_eq!(cg.oom_kills(), 1, "OOM kills counted ({:?})", cg.version);

    // A task that is itself the victim reports the signal too.
    let mut spec = p.spec("hog2", json!({ "command": "/bin/dd", "args": ["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"] }));
    spec.resources.memory_mb = 32;
    p.start_spec(spec).await;
    let exit = p.wait("hog2").await;
    assert!(exit.oom_killed, "{exit:?}");
    assert_eq!(exit.signal, 9, "{exit:?}");

    // And a task within its limit is not flagged. Given a reservation below its
    // maximum, it gets both (v1: the soft limit; v2: memory.low), and no swap past the
    // maximum.
    let mut spec = p.spec("fits", sh("dd if=/dev/zero of=/dev/null bs=4M count=1"));
    spec.resources.memory_mb = 16;
    spec.resources.memory_max_mb = 64;
    p.start_spec(spec).await;
    let exit = p.wait("fits").await;
    assert!(exit.successful(), "{exit:?}");
    let cg = p.cgroup("fits");
    assert_eq!(cg.memory_max(), 64 << 20, "{:?}", cg.version);
    assert_eq!(cg.memory_reservation(), 16 << 20, "{:?}", cg.version);
    match cg.swap_past_the_limit() {
        Some(swap) => assert_eq!(swap, 0, "swap allowed past the limit ({:?})", cg.version),
        None => eprintln!("no swap accounting here: the swap limit is not checked"),
    }
    assert_eq!(cg.oom_kills(), 0);
}

#[tokio::test]
async fn a_fork_bomb_stops_at_the_pids_limit_and_stop_kills_all_of_it() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let mut spec = p.spec(
        "bomb",
        // bash, unlike dash, keeps going when a fork fails: the bomb stays at work.
        json!({
            "command": "/bin/bash",
            "args": ["-c", "echo ready; while :; do sleep 1000 & done"],
            "pids_limit": 32,
        }),
    );
    // The failing forks complain on stderr as fast as they can.
    spec.logs = LogConfig::new(2, 1);
    p.start_spec(spec).await;
    let cg = p.cgroup("bomb");
    assert_eq!(cg.pids_max(), "32");
    // It reaches the limit, and never goes past it.
    let deadline = Instant::now() + PROMPT;
    while cg.pids_current() < 32 {
        assert!(
            Instant::now() < deadline,
            "the bomb never reached the pids limit: pids.current {}, refused {}\nstdout: {}\nstderr: {}",
            cg.pids_current(),
            cg.pids_refused(),
            p.stdout("bomb"),
            p.log("bomb", "stderr")
                .chars()
                .take(2000)
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // At the limit it stays there, and forks are refused: sampled for at least half a
    // second, and until a refusal is counted (a slow guest under TCG may take longer
    // to try its next fork).
    let sample_until = Instant::now() + Duration::from_millis(500);
    let deadline = Instant::now() + PROMPT;
    while Instant::now() < sample_until || cg.pids_refused() == 0 {
        let n = cg.pids_current();
        assert!(n <= 32, "pids.current {n} above the limit of 32");
        assert!(
            Instant::now() < deadline,
            "no fork was refused within {PROMPT:?} at the limit\nstderr: {}",
            p.log("bomb", "stderr")
                .chars()
                .take(2000)
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = within(
        PROMPT,
        "stats",
        p.client.task_stats("bomb", Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let mut stats = stats;
    let sample = within(
        PROMPT,
        "first sample",
        tokio_stream::StreamExt::next(&mut stats),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        (30..=32).contains(&sample.process_count),
        "stats count {} processes",
        sample.process_count
    );
    let procs_file = cg.procs_file();
    let pids = procs(&procs_file);
    within(
        PROMPT,
        "stop",
        p.client
            .stop_task("bomb", Duration::from_secs(1), Signal::TERM),
    )
    .await
    .unwrap();
    let exit = p.wait("bomb").await;
    assert!(!exit.successful(), "{exit:?}");
    until(PROMPT, "every process of the bomb is gone", || {
        pids.iter().all(|&pid| !alive(pid)) && procs(&procs_file).is_empty()
    })
    .await;
    within(PROMPT, "destroy", p.client.destroy_task("bomb", false))
        .await
        .unwrap();
    assert!(!cg.exists(), "the cgroup is left ({:?})", cg.version);
}

#[tokio::test]
async fn the_cpu_quota_holds() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    // Two busy loops: without the quota they would take both cores.
    p.start(
        "busy",
        sh_with(
            "echo ready; while :; do :; done & while :; do :; done",
            json!({ "cpu_limit": 0.5 }),
        ),
    )
    .await;
    p.printed("busy", "ready").await;
    let cg = p.cgroup("busy");
    assert_eq!(
        cg.cpu_quota(),
        (50_000, 100_000),
        "quota ({:?})",
        cg.version
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The quota holds: measured usage within 20 % of it (0.4 to 0.6 cores). No window
    // may exceed it; one quiet enough window must reach it (on a machine busy with
    // other tests the task can get less than its quota for a while).
    let mut cores = 0.0;
    for _ in 0..5 {
        let (t0, u0) = (Instant::now(), cg.cpu_usage());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (t1, u1) = (Instant::now(), cg.cpu_usage());
        cores = (u1 - u0).as_secs_f64() / (t1 - t0).as_secs_f64();
        assert!(
            cores <= 0.6,
            "measured {cores:.3} cores under a quota of 0.5"
        );
        if cores >= 0.4 {
            break;
        }
    }
    assert!(
        (0.4..=0.6).contains(&cores),
        "measured {cores:.3} cores under a quota of 0.5"
    );
    assert!(cg.cpu_throttled() > 0, "never throttled");
    // Stats agree with the cgroup: a sample (of a few) shows the quota's share of a core.
    let mut stats = within(
        PROMPT,
        "stats",
        p.client.task_stats("busy", Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let _ = within(PROMPT, "sample", tokio_stream::StreamExt::next(&mut stats)).await;
    let mut s = None;
    for _ in 0..5 {
        let sample = within(PROMPT, "sample", tokio_stream::StreamExt::next(&mut stats))
            .await
            .unwrap()
            .unwrap();
        assert!(
            sample.cpu_percent <= 70.0,
            "stats say {:.1}% of a core",
            sample.cpu_percent
        );
        let done = sample.cpu_percent >= 30.0;
        s = Some(sample);
        if done {
            break;
        }
    }
    let s = s.unwrap();
    assert!(
        (30.0..=70.0).contains(&s.cpu_percent),
        "stats say {:.1}% of a core",
        s.cpu_percent
    );
    assert!(
        s.cpu_user + s.cpu_system > Duration::from_millis(500),
        "{s:?}"
    );
    assert!(s.memory_rss_bytes > 0 && s.process_count >= 2, "{s:?}");
    within(PROMPT, "destroy", p.client.destroy_task("busy", true))
        .await
        .unwrap();
}
