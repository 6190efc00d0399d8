//! `drover task logs` end to end: a real agent, rawexec tasks, the CLI as a user runs it.

use crate::common;

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

use common::rawexec_agent as agent;

fn run_sh(agent: &Agent, script: &str, extra: &[&str]) -> (String, std::path::PathBuf) {
    let config = serde_json::json!({ "command": "/bin/sh", "args": ["-c", script] }).to_string();
    let mut args = vec![
        "task", "run", "--driver", "rawexec", "--config", &config, "--json",
    ];
    args.extend_from_slice(extra);
    let task = agent.cli_json(&args);
    (
        task["id"].as_str().unwrap().to_owned(),
        task["task_dir"].as_str().unwrap().into(),
    )
}

/// `drover task logs ARGS…` as a child with stdout and stderr piped.
fn spawn_logs(agent: &Agent, args: &[&str]) -> std::process::Child {
    Command::new(drover())
        .arg("task")
        .arg("logs")
        .args(args)
        .env("DROVER_ADDR", format!("unix://{}", agent.socket.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn logs_print_stdout_stderr_and_the_tail() {
    let (_root, agent) = agent();
    let (id, _) = run_sh(
        &agent,
        "i=1; while [ $i -le 500 ]; do echo \"out $i\"; i=$((i+1)); done; echo oops >&2",
        &[],
    );
    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    let out = agent.cli(&["task", "logs", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let want: String = (1..=500).map(|i| format!("out {i}\n")).collect();
    assert_eq!(text(&out.stdout), want);
    assert_eq!(
        text(&agent.cli(&["task", "logs", &id, "--stderr"]).stdout),
        "oops\n"
    );
    assert_eq!(
        text(&agent.cli(&["task", "logs", &id, "--tail", "3"]).stdout),
        "out 498\nout 499\nout 500\n"
    );
    // A dead task's logs with -f: everything, then the command ends by itself.
    let out = agent.cli(&["task", "logs", &id, "-f", "--tail", "1"]);
    assert_eq!(text(&out.stdout), "out 500\n");

    let out = agent.cli(&["task", "logs", "nosuchtask"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no task with id \"nosuchtask\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn logs_follow_shows_output_as_written_and_ends_with_the_task() {
    let (_root, agent) = agent();
    // The task says it is ready, then waits for the test before writing the rest.
    let (id, dir) = run_sh(
        &agent,
        "echo ready; while [ ! -e local/go ]; do sleep 0.01; done; echo second; echo last",
        &[],
    );
    let mut logs = spawn_logs(&agent, &["-f", &id]);
    let mut out = BufReader::new(logs.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // Still following a running task.
    assert!(logs.try_wait().unwrap().is_none());
    std::fs::write(dir.join("local/go"), "").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "second\nlast\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = logs.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "logs -f did not end after the task"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    assert_eq!(
        agent.cli_json(&["task", "status", &id, "--json"])["state"],
        "dead"
    );
}

/// Acceptance 4: a task writes 50 MB of numbered lines with a 1 MiB × 3 log limit;
/// `logs -f` shows every line once and in order across the rotations, and at most
/// 3 files of at most 1 MiB are left.
///
/// The task writes in bursts of 1 MB (each as fast as `seq` and the executor go, a few
/// ms) with 100 ms between them: 50 rotations in about 5 s. What `logs -f` promises is
/// that nothing is lost as long as the agent gets the CPU within the time the task
/// takes to write `max_files - 1` files (it opens each file the moment it is created,
/// and a file it holds open survives rotation). A task writing 1 MiB files back to back
/// at full speed leaves it a few ms, which a loaded 2-core machine does not always
/// give: CI saw 9 files skipped once, and by hand, with a CI run beside it, the agent's
/// log thread waited 35 to 140 ms for the CPU after a file was created. Whatever is
/// lost is said, never silently dropped: `files_removed_before_they_were_read_are_reported`
/// and the follower tests in the agent's `logs` module check that.
#[test]
fn logs_follow_shows_every_line_across_rotations() {
    const LINES: u64 = 5_000_000; // 10 bytes each
    let (_root, agent) = agent();
    const BURST: u64 = 100_000; // lines: 1 MB
    let script = format!(
        "echo ready; while [ ! -e local/go ]; do sleep 0.01; done; \
         i=0; while [ $i -lt {LINES} ]; do \
           seq -f '%09.0f' $((i + 1)) $((i + {BURST})); i=$((i + {BURST})); sleep 0.1; \
         done"
    );
    let (id, dir) = run_sh(
        &agent,
        &script,
        &["--log-max-files", "3", "--log-max-file-size-mb", "1"],
    );
    let mut logs = spawn_logs(&agent, &["-f", &id]);
    let mut out = BufReader::with_capacity(1 << 20, logs.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let t = Instant::now();
    std::fs::write(dir.join("local/go"), "").unwrap();
    let mut data = Vec::with_capacity(LINES as usize * 10);
    out.read_to_end(&mut data).unwrap();
    let took = t.elapsed();
    let mut err = String::new();
    logs.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(logs.wait().unwrap().success(), "{err}");
    // The agent says whether its followers could watch the log directory.
    let agent_log = || {
        let log = agent.log_text();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    assert!(
        !err.contains("skipped"),
        "the follower fell behind rotation: {err}\nthe agent's log ends:\n{}",
        agent_log()
    );
    assert_eq!(data.len() as u64, LINES * 10, "{err}\n{}", agent_log());
    for (want, chunk) in (1u64..).zip(data.chunks(10)) {
        let n: u64 = std::str::from_utf8(&chunk[..9])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("garbled line {:?} where {want} was due", text(chunk)));
        assert_eq!(n, want, "line out of order");
        assert_eq!(chunk[9], b'\n');
    }
    eprintln!("logs -f followed {} MB in {took:?}", data.len() / 1_000_000);

    assert_eq!(agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    let files = drover_plugin_sdk::logs::log_files(&dir.join("logs/stdout")).unwrap();
    assert!(
        !files.is_empty() && files.len() <= 3,
        "expected 1 to 3 files stdout.N, found {files:?}"
    );
    for (_, path) in &files {
        let len = std::fs::metadata(path).unwrap().len();
        assert!(len <= 1024 * 1024, "{} is {len} bytes", path.display());
    }
    assert!(
        !Path::new(&dir.join("logs/stdout")).exists(),
        "unrotated file left"
    );
}
