//! The dedicated executor: tasks of the built-in drivers run under `drover-executor`
//! (installed beside `drover`), which is small; a stale or foreign executor binary is
//! refused with an error naming it, and tasks then run under the driver's own binary.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use drover_test_support::procs;

fn executor_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drover-executor"))
}

/// Start a sleeping rawexec task; its id and pid.
fn sleeper(agent: &Agent, name: &str) -> (String, u32) {
    let out = agent.cli_json(&[
        "task",
        "run",
        "--driver",
        "raw_exec",
        "--name",
        name,
        "--config",
        r#"{"command":"/bin/sleep","args":["1000"]}"#,
        "--json",
    ]);
    let id = out["id"].as_str().expect("task id").to_owned();
    let pid = out["attributes"]["pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid: {out:#}"));
    (id, pid)
}

fn executor_of(task_pid: u32) -> u32 {
    procs::stat(task_pid)
        .unwrap_or_else(|| panic!("task {task_pid} is gone"))
        .ppid
}

fn exe(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap()
}

/// Proportional set size and private dirty memory of a live `pid`, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    drover_test_support::procs::memory_kib(pid).unwrap_or_else(|| panic!("process {pid} is gone"))
}

#[test]
fn builtin_drivers_run_tasks_under_the_small_dedicated_executor() {
    let (_root, mut agent) = rawexec_agent();
    agent.end_tasks = true;
    let mut executors = Vec::new();
    for i in 0..4 {
        let (_, pid) = sleeper(&agent, &format!("small-{i}"));
        executors.push(executor_of(pid));
    }
    let expected = executor_binary().canonicalize().unwrap();
    for &e in &executors {
        assert_eq!(exe(e), expected, "executor {e} is not drover-executor");
        let cmdline = std::fs::read(format!("/proc/{e}/cmdline")).unwrap();
        assert!(
            cmdline.starts_with(b"drover-executor: "),
            "{:?}",
            String::from_utf8_lossy(&cmdline)
        );
    }
    let samples: Vec<(u64, u64)> = executors.iter().map(|&pid| memory_kib(pid)).collect();
    eprintln!("executor memory (KiB, pss/private dirty), 4 running, debug build: {samples:?}");
    // A debug build: the release figure is drover-bench's (`tasks`). The bound catches a
    // runtime, a big buffer or the agent's stack linked back into the executor (the
    // driver's own binary as executor is ~1,100 KiB private dirty here).
    for (pss, dirty) in samples {
        assert!(
            pss < 2048 && dirty <= 1024,
            "pss {pss} KiB, dirty {dirty} KiB"
        );
    }
    let out = std::process::Command::new(executor_binary())
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && version.contains(drover_executor::BUILD_ID),
        "{version}"
    );
    // Run by hand, it says what it is and does nothing.
    let out = std::process::Command::new(executor_binary())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not run by hand"));
}

/// Copy `from` to `to`, mode 0755.
fn install(from: &Path, to: &Path) {
    crate::common::copy_exec(from, to);
}

#[test]
fn a_stale_executor_binary_is_refused_and_tasks_run_under_the_driver_binary() {
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    install(&drover(), &bin.join("drover"));
    // Another build of the executor: the same program with another build id.
    let mut bytes = std::fs::read(executor_binary()).unwrap();
    let id = drover_executor::BUILD_ID.as_bytes();
    let mut patched = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(id.len()).position(|w| w == id) {
        let last = at + i + id.len() - 1;
        bytes[last] = if bytes[last] == b'0' { b'1' } else { b'0' };
        patched += 1;
        at = last + 1;
    }
    assert!(
        patched > 0,
        "no build id in {}",
        executor_binary().display()
    );
    let stale = bin.join("drover-executor");
    crate::common::write_exec_bytes(&stale, &bytes, 0o755);

    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let mut agent = Agent::start_binary(&bin.join("drover"), root.path(), &plugins, &[]);
    agent.end_tasks = true;
    agent.wait_plugins(Duration::from_secs(10), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    let (_, pid) = sleeper(&agent, "under-stale");
    let executor = executor_of(pid);
    assert_eq!(
        exe(executor),
        bin.join("drover").canonicalize().unwrap(),
        "the task did not run under the driver's own binary"
    );
    let log = agent.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("refusing the executor binary"))
        .unwrap_or_else(|| panic!("no refusal in the agent log:\n{log}"));
    assert!(
        line.contains(&stale.display().to_string())
            && line.contains(drover_executor::BUILD_ID)
            && line.contains("same build"),
        "{line}"
    );
}

#[test]
fn tasks_under_the_driver_binary_are_recovered_once_the_executor_is_installed() {
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    install(&drover(), &bin.join("drover"));
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let healthy = |agent: &Agent| {
        agent.wait_plugins(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
        });
    };

    // No drover-executor installed: the earlier form, drover re-executed.
    let mut first = Agent::start_binary(&bin.join("drover"), root.path(), &plugins, &[]);
    healthy(&first);
    let (old, old_pid) = sleeper(&first, "before-upgrade");
    let old_executor = executor_of(old_pid);
    assert_eq!(
        exe(old_executor),
        bin.join("drover").canonicalize().unwrap()
    );
    // kill -9 of the agent and of its plugin processes: a plugin process keeps the
    // executor it chose for its life, and is reattached by the next agent; the
    // recovery by a driver that uses drover-executor is what is tested here.
    let plugin_pids = first.marked_pids();
    assert!(!plugin_pids.is_empty(), "no plugin process");
    first.child.kill().expect("kill -9 the agent");
    first.child.wait().expect("reap the agent");
    for pid in plugin_pids {
        let _ = nix_kill(pid, 9);
    }
    assert!(procs::alive(old_pid) && procs::alive(old_executor));

    // The executor is installed; the next agent recovers the old task and starts new
    // ones under drover-executor.
    install(&executor_binary(), &bin.join("drover-executor"));
    // The killed agent's socket file is left; the start waits for the new one.
    std::fs::remove_file(&first.socket).unwrap();
    let mut second = Agent::start_binary(&bin.join("drover"), root.path(), &plugins, &[]);
    second.end_tasks = true;
    healthy(&second);
    let task = common::tasks::until(&second, &old, Duration::from_secs(30), "recovered", |t| {
        common::tasks::kinds(t).iter().any(|k| k == "Recovered")
    });
    assert_eq!(common::tasks::pid_of(&task), Some(old_pid), "{task:#?}");
    let (_, new_pid) = sleeper(&second, "after-upgrade");
    assert_eq!(
        exe(executor_of(new_pid)),
        bin.join("drover-executor").canonicalize().unwrap()
    );
    let stopped = second.cli_json(&["task", "stop", &old, "--json"]);
    assert_eq!(stopped["signal"], 15, "{stopped:#}");
    assert!(
        !procs::alive(old_pid),
        "the recovered task survived its stop"
    );
    drop(second);
    drop(first);
}
