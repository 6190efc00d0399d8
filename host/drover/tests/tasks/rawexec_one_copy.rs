//! Issue 10, scenario 3 ("rawexec starts a task twice"), end to end: the real agent,
//! the real rawexec driver and its executors, real processes, the host's cgroups,
//! driven through the `drover` CLI as a user would.
//!
//! - `kill -9` of a task's executor: the copy it owned is killed before the restart
//!   policy starts the task again, so two copies never run side by side;
//! - `task destroy --force` afterwards leaves no process of the task;
//! - a child that calls `setsid` survives neither `task stop` nor `task destroy`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use drover_test_support::procs::alive;
use drover_test_support::until_blocking;

use common::rawexec_agent as agent;

const LIMIT: Duration = Duration::from_secs(20);

/// These tests are about what a task's own cgroup guarantees: a host without one for
/// rawexec fails them with this message rather than with a confusing assertion.
fn needs_cgroups() {
    assert!(
        drover_executor::cgroup::plain_support().is_some(),
        "this host offers rawexec no cgroups (a mounted v1 freezer or a writable v2 \
         hierarchy), which these tests need"
    );
}
const POLL: Duration = Duration::from_millis(20);

/// pids, one a line, that a task script appended to `file`.
fn pids_in(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The rawexec task cgroup `pid` is in (its path below the hierarchy root), if any.
fn task_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines().find_map(|l| {
        let path = l.splitn(3, ':').nth(2)?;
        path.contains("drover-plain/")
            .then(|| path.trim_start_matches('/').to_owned())
    })
}

/// Whether the task cgroup `path` (None: the task had none, a failure) is gone.
fn cgroup_gone(path: &Option<String>) -> bool {
    let path = path.as_deref().expect("the task was in a task cgroup");
    let version = drover_executor::cgroup::plain_support().expect("cgroups");
    !drover_executor::cgroup::open_plain(version, path).exists()
}

fn run(agent: &Agent, script: &str, extra: &[&str]) -> String {
    let config = serde_json::json!({"command": "/bin/sh", "args": ["-c", script]}).to_string();
    let mut args = vec![
        "task", "run", "--driver", "rawexec", "--config", &config, "--json",
    ];
    args.extend_from_slice(extra);
    let task = agent.cli_json(&args);
    task["id"].as_str().expect("task id").to_owned()
}

fn cli_ok(agent: &Agent, args: &[&str]) {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?} failed: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.log_text()
    );
}

/// A task that, at each start, notes every earlier copy it finds still running
/// (`overlap`), appends its pid (`starts`), starts a child in a session of its own
/// (`children`), and runs until killed.
fn counting_task(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "for p in $(cat {d}/starts 2>/dev/null); do \
           s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); \
           if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo $p >> {d}/overlap; fi; \
         done; \
         echo $$ >> {d}/starts; \
         setsid sleep 1000 & echo $! >> {d}/children; \
         exec sleep 1000"
    )
}

#[test]
fn a_killed_executor_never_leaves_two_copies_and_destroy_force_leaves_none() {
    needs_cgroups();
    let (root, agent) = agent();
    let dir = root.path().join("marks");
    std::fs::create_dir(&dir).unwrap();
    let id = run(
        &agent,
        &counting_task(&dir),
        &[
            "--restart-attempts",
            "3",
            "--restart-interval",
            "10m",
            "--restart-delay",
            "100ms",
            "--restart-mode",
            "fail",
        ],
    );
    let starts = dir.join("starts");
    let children = dir.join("children");
    until_blocking(LIMIT, POLL, "the first copy started", || {
        pids_in(&starts).len() == 1 && pids_in(&children).len() == 1
    });
    let first = pids_in(&starts)[0];
    let first_child = pids_in(&children)[0];
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    let executor: u32 = status["attributes"]["executor_pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no executor_pid attribute: {status:#}"));

    // The scenario: kill -9 of the task's executor.
    nix_kill(executor, 9).expect("kill -9 the executor");

    // The restart policy starts the task again, but only once the first copy is gone.
    until_blocking(LIMIT, POLL, "the task was started again", || {
        pids_in(&starts).len() >= 2
    });
    let overlap = std::fs::read_to_string(dir.join("overlap")).unwrap_or_default();
    assert!(
        overlap.is_empty() && !alive(first) && !alive(first_child),
        "a second copy started while the first ran: copies still running at the second \
         start: {overlap:?}; first copy {first} alive: {}, its setsid child {first_child} \
         alive: {}\nevents: {:#}",
        alive(first),
        alive(first_child),
        agent.cli_json(&["task", "status", &id, "--json"])["events"]
    );
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    let events = status["events"].to_string();
    assert!(
        events.contains("lost the task's executor") && events.contains("killed every process"),
        "the events do not say the lost copy was killed: {events}"
    );

    // destroy --force leaves no process of the task, whichever copy.
    cli_ok(&agent, &["task", "destroy", "--force", &id]);
    let all: Vec<u32> = pids_in(&starts)
        .into_iter()
        .chain(pids_in(&children))
        .collect();
    until_blocking(
        Duration::from_secs(5),
        POLL,
        "no process of the task is left",
        || all.iter().all(|&p| !alive(p)),
    );
    assert_eq!(
        pids_in(&starts).len(),
        2,
        "the task was started again after its destroy"
    );
}

#[test]
fn destroy_force_after_a_killed_executor_leaves_no_process_of_the_task() {
    needs_cgroups();
    let (root, agent) = agent();
    let dir = root.path().join("marks");
    std::fs::create_dir(&dir).unwrap();
    let id = run(&agent, &counting_task(&dir), &[]);
    let starts = dir.join("starts");
    let children = dir.join("children");
    until_blocking(LIMIT, POLL, "the task started", || {
        pids_in(&starts).len() == 1 && pids_in(&children).len() == 1
    });
    let status = agent.cli_json(&["task", "status", &id, "--json"]);
    let executor: u32 = status["attributes"]["executor_pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no executor_pid attribute: {status:#}"));
    nix_kill(executor, 9).expect("kill -9 the executor");
    // At once, before the agent has heard anything of the executor's end.
    cli_ok(&agent, &["task", "destroy", "--force", &id]);
    until_blocking(
        Duration::from_secs(5),
        POLL,
        "no process of the task is left after destroy --force",
        || {
            pids_in(&starts)
                .into_iter()
                .chain(pids_in(&children))
                .all(|p| !alive(p))
        },
    );
}

/// A running task (`run` with `extra`) that started a child which called `setsid`:
/// the task's id and the child's pid.
fn running_with_setsid_child(agent: &Agent, dir: &Path, extra: &[&str]) -> (String, u32) {
    let child = dir.join("child");
    let id = run(
        agent,
        &format!(
            "setsid sleep 1000 & echo $! > {}; exec sleep 1000",
            child.display()
        ),
        extra,
    );
    until_blocking(LIMIT, POLL, "the child started", || {
        pids_in(&child).len() == 1
    });
    let pid = pids_in(&child)[0];
    wait_for_setsid(pid);
    (id, pid)
}

/// Waits until `pid` has called `setsid`: `$!` is written right after the fork, before
/// `setsid` runs in the child, so the pid file alone does not say the child left the
/// task's process group yet.
fn wait_for_setsid(pid: u32) {
    until_blocking(LIMIT, POLL, "the child called setsid", || {
        let info = drover_test_support::procs::stat(pid).expect("the child runs");
        info.pgid == pid
    });
}

#[test]
fn a_setsid_child_does_not_survive_task_stop() {
    needs_cgroups();
    let (root, agent) = agent();
    // The child left the task's process group (and session): a signal to the group
    // misses it.
    let (id, pid) = running_with_setsid_child(&agent, root.path(), &["--kill-timeout", "5s"]);
    let cgroup = task_cgroup(pid);
    cli_ok(&agent, &["task", "stop", &id]);
    until_blocking(
        Duration::from_secs(5),
        POLL,
        "the setsid child is gone after task stop",
        || !alive(pid),
    );
    // Nothing of the task is left, so neither is its cgroup.
    until_blocking(
        Duration::from_secs(5),
        POLL,
        "the task's cgroup is removed",
        || cgroup_gone(&cgroup),
    );
}

#[test]
fn a_setsid_child_does_not_survive_task_destroy() {
    needs_cgroups();
    let (root, agent) = agent();
    let child = root.path().join("child");
    // The task exits at once, leaving its setsid child behind.
    let id = run(
        &agent,
        &format!("setsid sleep 1000 & echo $! > {}", child.display()),
        &[],
    );
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let pid = pids_in(&child)[0];
    assert!(alive(pid), "the setsid child did not outlive its task");
    wait_for_setsid(pid);
    let cgroup = task_cgroup(pid);
    cli_ok(&agent, &["task", "destroy", &id]);
    until_blocking(
        Duration::from_secs(5),
        POLL,
        "the setsid child is gone after task destroy",
        || !alive(pid),
    );
    assert!(cgroup_gone(&cgroup), "destroy left the cgroup {cgroup:?}");
}

#[test]
fn a_running_task_with_a_setsid_child_leaves_nothing_after_destroy_force() {
    needs_cgroups();
    let (root, agent) = agent();
    let (id, pid) = running_with_setsid_child(&agent, root.path(), &[]);
    let main: u32 = agent.cli_json(&["task", "status", &id, "--json"])["attributes"]["pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("pid attribute");
    cli_ok(&agent, &["task", "destroy", "--force", &id]);
    until_blocking(
        Duration::from_secs(5),
        POLL,
        "no process of the task is left after destroy --force",
        || !alive(pid) && !alive(main),
    );
}
