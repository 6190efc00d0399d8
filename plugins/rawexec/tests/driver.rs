//! rawexec as the host sees it: the real plugin binary, launched and driven through
//! the SDK client. Every wait is on a real condition with a bounded timeout.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use drover_plugin_sdk::{DriverError, ExitResult, Signal, TaskState};
use serde_json::json;
use tokio_stream::StreamExt as _;

#[tokio::test]
async fn exit_code_is_reported_and_wait_repeats_it() {
    let (_dir, p) = setup().await;
    p.start("exit3", sh("exit 3")).await;
    let first = p.wait("exit3").await;
    assert_eq!(first, ExitResult::code(3));
    assert_eq!(p.wait("exit3").await, first);
    let status = p.client.inspect_task("exit3").await.unwrap();
    assert_eq!(status.state, TaskState::Exited);
    assert_eq!(status.exit_result, Some(first));
    assert!(status.completed_at >= status.started_at && status.completed_at.is_some());
    p.client.destroy_task("exit3", false).await.unwrap();
    assert!(matches!(
        p.client.wait_task("exit3").await,
        Err(DriverError::NotFound(_))
    ));
    p.shutdown().await;
}

/// StartTask's answer carries what InspectTask says of the task's attributes, so the
/// host needs no second call after a start.
#[tokio::test]
async fn start_answers_with_the_attributes_inspect_gives() {
    let (_dir, p) = setup().await;
    let (handle, reported) = p
        .client
        .start_task_reporting(p.spec(
            "facts",
            json!({ "command": "/bin/sleep", "args": ["1000"] }),
        ))
        .await
        .unwrap();
    assert_eq!(handle.spec.id, "facts");
    let reported = reported.expect("no attributes in the StartTask answer");
    let inspected = p.client.inspect_task("facts").await.unwrap().attributes;
    assert!(reported.contains_key("pid"), "{reported:?}");
    assert_eq!(
        reported,
        inspected.into_iter().collect::<BTreeMap<_, _>>(),
        "StartTask and InspectTask disagree"
    );
    p.client.destroy_task("facts", true).await.unwrap();
    p.shutdown().await;
}

#[tokio::test]
async fn task_killed_from_outside_reports_signal_9() {
    let (_dir, p) = setup().await;
    let (_, pid) = p
        .start(
            "victim",
            json!({ "command": "/bin/sleep", "args": ["1000"] }),
        )
        .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let result = p.wait("victim").await;
    assert_eq!((result.exit_code, result.signal), (0, 9), "{result:?}");
    p.shutdown().await;
}

#[tokio::test]
async fn stop_with_sigterm_returns_promptly_and_the_process_is_gone() {
    let (_dir, p) = setup().await;
    let (_, pid) = p
        .start(
            "sleeper",
            json!({ "command": "/bin/sleep", "args": ["1000"] }),
        )
        .await;
    assert!(alive(pid));
    let t = Instant::now();
    within(
        PROMPT,
        "stop",
        p.client
            .stop_task("sleeper", Duration::from_secs(5), Signal::TERM),
    )
    .await
    .unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        t.elapsed()
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "sleep {pid} is still there"
    );
    assert_eq!(p.wait("sleeper").await, ExitResult::signaled(15));
    // Stopping a task that has exited is fine; a bad signal name is not.
    p.client
        .stop_task("sleeper", Duration::from_secs(1), Signal::TERM)
        .await
        .unwrap();
    let err = p.raw_stop("sleeper", "SIGBOGUS").await.unwrap_err();
    assert!(matches!(err, DriverError::InvalidConfig(_)), "{err:?}");
    p.shutdown().await;
}

#[tokio::test]
async fn task_ignoring_sigterm_is_killed_after_the_timeout() {
    let (_dir, p) = setup().await;
    let mut events = Box::pin(p.client.task_events().await.unwrap());
    let (_, pid) = p
        .start(
            "stubborn",
            sh("trap '' TERM; echo ready; while :; do sleep 0.1; done"),
        )
        .await;
    p.printed("stubborn", "ready").await;
    let t = Instant::now();
    within(
        PROMPT,
        "stop",
        p.client
            .stop_task("stubborn", Duration::from_secs(1), Signal::TERM),
    )
    .await
    .unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(950),
        "stop returned after {took:?}, before the timeout"
    );
    // Generous for a loaded machine; a stop that forgot to escalate never returns.
    assert!(
        took < Duration::from_secs(5),
        "stop took {took:?} with a 1 s timeout"
    );
    assert_eq!(p.wait("stubborn").await, ExitResult::signaled(9));
    // The whole group went, not just the shell.
    until(PROMPT, "the task's process group is empty", || {
        processes(|_, pgid| pgid == pid).is_empty()
    })
    .await;
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.starts_with("task exited")) {
        let e = within(PROMPT, "next event", events.next())
            .await
            .unwrap()
            .unwrap();
        seen.push(e.message);
    }
    assert_eq!(
        seen[1..],
        [
            "sent SIGTERM",
            "sent SIGKILL: still running after 1s",
            "task exited: signal 9"
        ]
    );
    p.shutdown().await;
}

#[tokio::test]
async fn output_goes_to_the_log_files() {
    let (_dir, p) = setup().await;
    p.start("echo", json!({ "command": "/bin/echo", "args": ["hello"] }))
        .await;
    assert!(p.wait("echo").await.successful());
    assert_eq!(p.stdout("echo"), "hello\n");
    p.start("stderr", sh("echo oops >&2")).await;
    p.wait("stderr").await;
    assert_eq!(p.log("stderr", "stderr"), "oops\n");
    assert_eq!(
        std::fs::read_to_string(p.dir.join("stderr/stderr.0")).unwrap(),
        "oops\n"
    );
    p.shutdown().await;
}

#[tokio::test]
async fn environment_is_the_specs_plus_a_default_path() {
    let (_dir, p) = setup().await;
    let mut spec = p.spec(
        "env",
        sh(r#"printf '%s\n' "$GREETING" "$PATH" "${DROVER_PLUGIN_MAGIC_COOKIE:-unset}""#),
    );
    spec.env = BTreeMap::from([("GREETING".to_owned(), "hello from the spec".to_owned())]);
    p.start_spec(spec).await;
    assert!(p.wait("env").await.successful());
    let expected = format!(
        "hello from the spec\n{}\nunset\n",
        drover_driver_rawexec::DEFAULT_PATH
    );
    assert_eq!(
        p.stdout("env"),
        expected,
        "the plugin's own environment must not leak"
    );

    // A PATH in the spec wins, and bare command names are looked up in it.
    let mut spec = p.spec("path", json!({ "command": "echo", "args": ["found"] }));
    spec.env = BTreeMap::from([("PATH".to_owned(), "/bin:/usr/bin".to_owned())]);
    p.start_spec(spec).await;
    assert!(p.wait("path").await.successful());
    assert_eq!(p.stdout("path"), "found\n");
    p.shutdown().await;
}

#[tokio::test]
async fn working_directory_is_the_task_dir_unless_configured() {
    let (_dir, p) = setup().await;
    p.start("pwd", json!({ "command": "/bin/pwd" })).await;
    p.wait("pwd").await;
    assert_eq!(
        p.stdout("pwd").trim_end(),
        p.dir.join("pwd").display().to_string()
    );
    std::fs::create_dir_all(p.dir.join("cwd/local")).unwrap();
    p.start("cwd", json!({ "command": "/bin/pwd", "cwd": "local" }))
        .await;
    p.wait("cwd").await;
    assert_eq!(
        p.stdout("cwd").trim_end(),
        p.dir.join("cwd/local").display().to_string()
    );
    p.shutdown().await;
}

#[tokio::test]
async fn misspelt_field_is_refused_by_name_and_starts_nothing() {
    let (_dir, p) = setup().await;
    let err = p
        .client
        .start_task(p.spec("typo", json!({ "comand": "/bin/echo" })))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DriverError::InvalidConfig(m) if m.contains("comand")),
        "{err:?}"
    );
    assert!(matches!(
        p.client.inspect_task("typo").await,
        Err(DriverError::NotFound(_))
    ));
    let children = processes(|ppid, _| ppid == p.process.pid());
    assert!(children.is_empty(), "the plugin has children: {children:?}");
    p.shutdown().await;
}

#[tokio::test]
async fn command_that_cannot_start_is_refused_and_the_id_stays_free() {
    let (_dir, p) = setup().await;
    let err = p
        .client
        .start_task(p.spec("missing", json!({ "command": "/nonexistent/program" })))
        .await
        .unwrap_err();
    match &err {
        DriverError::InvalidConfig(m) => {
            assert!(
                m.contains("/nonexistent/program") && m.contains("No such file"),
                "{m}"
            )
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert!(matches!(
        p.client.inspect_task("missing").await,
        Err(DriverError::NotFound(_))
    ));
    // Nothing was left holding the id.
    p.start("missing", sh("exit 0")).await;
    assert!(p.wait("missing").await.successful());
    p.shutdown().await;
}

#[tokio::test]
async fn duplicate_id_is_refused() {
    let (_dir, p) = setup().await;
    p.start("dup", json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .await;
    let err = p
        .client
        .start_task(p.spec("dup", sh("exit 0")))
        .await
        .unwrap_err();
    assert!(matches!(err, DriverError::AlreadyExists(_)), "{err:?}");
    p.client.destroy_task("dup", true).await.unwrap();
    p.shutdown().await;
}

#[tokio::test]
async fn destroying_a_running_task_needs_force() {
    let (_dir, p) = setup().await;
    let (_, pid) = p
        .start("busy", json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .await;
    let err = p.client.destroy_task("busy", false).await.unwrap_err();
    assert!(
        matches!(&err, DriverError::FailedPrecondition(m) if m.contains("still running")),
        "{err:?}"
    );
    assert_eq!(
        p.client.inspect_task("busy").await.unwrap().state,
        TaskState::Running
    );
    assert!(alive(pid));
    within(
        PROMPT,
        "forced destroy",
        p.client.destroy_task("busy", true),
    )
    .await
    .unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "sleep {pid} survived a forced destroy"
    );
    assert!(matches!(
        p.client.inspect_task("busy").await,
        Err(DriverError::NotFound(_))
    ));
    p.shutdown().await;
}

#[tokio::test]
async fn an_empty_signal_on_the_wire_means_sigterm() {
    let (_dir, p) = setup().await;
    p.start(
        "quiet",
        json!({ "command": "/bin/sleep", "args": ["1000"] }),
    )
    .await;
    p.raw_stop("quiet", "").await.unwrap();
    assert_eq!(p.wait("quiet").await, ExitResult::signaled(Signal::TERM));
    p.shutdown().await;
}

#[tokio::test]
async fn signal_reaches_the_task() {
    let (_dir, p) = setup().await;
    p.start(
        "usr1",
        sh("trap 'exit 42' USR1; echo ready; while :; do sleep 0.1; done"),
    )
    .await;
    p.printed("usr1", "ready").await;
    let err = p.raw_signal("usr1", "SIGNOPE").await.unwrap_err();
    assert!(matches!(err, DriverError::InvalidConfig(_)), "{err:?}");
    p.client.signal_task("usr1", Signal::USR1).await.unwrap();
    assert_eq!(p.wait("usr1").await, ExitResult::code(42));
    let err = p
        .client
        .signal_task("usr1", Signal::USR1)
        .await
        .unwrap_err();
    assert!(matches!(err, DriverError::FailedPrecondition(_)), "{err:?}");
    p.shutdown().await;
}

#[tokio::test]
async fn events_tell_the_story_in_order() {
    let (_dir, p) = setup().await;
    let mut events = Box::pin(p.client.task_events().await.unwrap());
    let (_, pid) = p
        .start(
            "story",
            json!({ "command": "/bin/sleep", "args": ["1000"] }),
        )
        .await;
    p.client
        .stop_task("story", Duration::from_secs(5), Signal::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.starts_with("task exited")) {
        let e = within(PROMPT, "next event", events.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.task_id, "story");
        seen.push(e.message);
    }
    assert_eq!(
        seen,
        [
            format!("task started (pid {pid})"),
            "sent SIGTERM".to_owned(),
            "task exited: signal 15".to_owned()
        ]
    );
    p.shutdown().await;
}

#[tokio::test]
async fn stats_report_memory_and_cpu() {
    let (_dir, p) = setup().await;
    p.start("spin", sh("while :; do :; done")).await;
    let mut stats = Box::pin(
        p.client
            .task_stats("spin", Duration::from_millis(200))
            .await
            .unwrap(),
    );
    let first = within(PROMPT, "first sample", stats.next())
        .await
        .unwrap()
        .unwrap();
    assert!(first.memory_rss_bytes > 0, "{first:?}");
    // A busy loop uses a good part of a core; allow for a loaded machine.
    let mut busiest: f64 = 0.0;
    for _ in 0..5 {
        let s = within(PROMPT, "sample", stats.next())
            .await
            .unwrap()
            .unwrap();
        busiest = busiest.max(s.cpu_percent);
    }
    assert!(busiest > 5.0, "busy loop at most {busiest}% of a core");
    assert!(first.cpu_user + first.cpu_system <= Duration::from_secs(60));
    p.client.destroy_task("spin", true).await.unwrap();
    p.shutdown().await;
}

#[tokio::test]
async fn exec_runs_in_the_tasks_environment() {
    let (_dir, p) = setup().await;
    let mut spec = p.spec("host", json!({ "command": "/bin/sleep", "args": ["1000"] }));
    spec.env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
    p.start_spec(spec).await;
    let out = within(
        PROMPT,
        "exec",
        p.client.exec_task(
            "host",
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $FOO; pwd; echo err >&2; exit 5".into(),
            ],
            Duration::from_secs(5),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("bar\n{}\n", p.dir.join("host").display())
    );
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.result, ExitResult::code(5));

    let t = Instant::now();
    let out = within(
        PROMPT,
        "exec with timeout",
        p.client.exec_task(
            "host",
            vec!["/bin/sleep".into(), "100".into()],
            Duration::from_millis(300),
        ),
    )
    .await
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(
        out.result
            .err
            .as_deref()
            .is_some_and(|e| e.contains("timed out")),
        "{out:?}"
    );
    p.client.destroy_task("host", true).await.unwrap();
    p.shutdown().await;
}

/// A script check runs the task's own code at every interval: what an exec keeps of
/// its output is capped, and a command that outlives its timeout is killed with all
/// it started, so that neither memory nor processes grow.
#[tokio::test]
async fn exec_output_is_capped_and_a_timed_out_exec_leaves_no_process() {
    use drover_plugin_sdk::EXEC_OUTPUT_LIMIT;
    let (_dir, p) = setup().await;
    p.start("host", json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .await;
    // 4 MiB on each stream, far past the cap: the call returns with the cap of each
    // and the command's own exit code (it was never blocked on a full pipe).
    let out = within(
        PROMPT,
        "exec printing a lot",
        p.client.exec_task(
            "host",
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "head -c 4194304 /dev/zero; head -c 4194304 /dev/zero >&2; exit 7".into(),
            ],
            Duration::from_secs(8),
        ),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout.len(), EXEC_OUTPUT_LIMIT);
    assert_eq!(out.stderr.len(), EXEC_OUTPUT_LIMIT);
    assert_eq!(out.result, ExitResult::code(7));

    // The shell and the sleep it starts in the background (which holds stdout open)
    // both die at the timeout.
    let pids = p.dir.join("host").join("exec-pids");
    let t = Instant::now();
    let out = within(
        PROMPT,
        "exec past its timeout",
        p.client.exec_task(
            "host",
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("/bin/sleep 1000 & echo $$ $! > {}; wait", pids.display()),
            ],
            Duration::from_millis(500),
        ),
    )
    .await
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(
        out.result
            .err
            .as_deref()
            .is_some_and(|e| e.contains("timed out")),
        "{out:?}"
    );
    let pids: Vec<u32> = std::fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids {
        until(PROMPT, &format!("exec'd process {pid} is gone"), || {
            !alive(pid)
        })
        .await;
    }
    p.client.destroy_task("host", true).await.unwrap();
    p.shutdown().await;
}

/// A task given its group's namespace (bridge mode) runs in it: it sees the
/// namespace's interfaces, not the host's.
#[tokio::test]
async fn a_task_given_a_group_namespace_joins_it() {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to the process's effective user.
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: joining a network namespace needs root"
        );
        eprintln!("#### SKIPPED: joining a network namespace needs root");
        return;
    }
    let name = format!("drover-rawexec-test-{}", std::process::id());
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(ip(&["netns", "add", &name]), "ip netns add (iproute2)");
    let made = ip(&[
        "-n", &name, "link", "add", "drv8a", "type", "veth", "peer", "name", "drv8b",
    ]);
    let (_dir, p) = setup().await;
    let caps = p.client.capabilities().await.unwrap();
    assert!(caps.network_modes.group && caps.network_modes.host);
    let spec = p
        .spec(
            "grouped",
            sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"),
        )
        .with_netns_path(Path::new("/run/netns").join(&name));
    p.start_spec(spec).await;
    let exit = p.wait("grouped").await;
    let out = p.stdout("grouped");
    ip(&["netns", "delete", &name]);
    assert!(made, "a veth pair in the test's namespace");
    assert_eq!(exit, ExitResult::code(0));
    assert_eq!(out.trim(), "drv8a drv8b lo");
    p.shutdown().await;
}

/// raw_exec is off unless its config says `enabled = true` (Nomad's default): it then
/// fingerprints undetected with the reason, and refuses to start a task, which
/// leaves nothing behind.
#[tokio::test]
async fn raw_exec_not_enabled_is_undetected_and_starts_nothing() {
    for config in [r#"{}"#, r#"{"enabled":false,"no_cgroups":true}"#] {
        let dir = tempfile::tempdir().unwrap();
        let p = Plugin::launch_with_exactly(dir.path(), config).await;
        let mut prints = p.client.fingerprint().await.unwrap();
        let print = within(PROMPT, "a fingerprint", prints.next())
            .await
            .expect("a fingerprint")
            .expect("a fingerprint, not an error");
        assert_eq!(
            print.health,
            drover_plugin_sdk::Health::Undetected,
            "{config}: {print:?}"
        );
        assert_eq!(print.description, drover_driver_rawexec::DISABLED);
        assert!(print.description.contains("enabled = true"), "{print:?}");

        let marker = dir.path().join("ran");
        let spec = p.spec("off", sh(&format!("touch {}", marker.display())));
        let err = p.client.start_task(spec).await.unwrap_err();
        assert!(
            matches!(&err, DriverError::FailedPrecondition(m) if m == drover_driver_rawexec::DISABLED),
            "{config}: {err:?}"
        );
        assert!(!marker.exists(), "{config}: the refused task ran");
        p.shutdown().await;
    }
}
