//! Adding, upgrading and removing plugins while the agent runs (issue 14, acceptance
//! point 3), through the real `drover` binary: a newer rawexec dropped into plugin_dir
//! takes 50 running tasks over without restarting any of them, a broken newer one
//! leaves the serving one in place, a removed file leaves its tasks running and
//! stoppable; a new plugin appears without a restart, and `drover plugin reload` does
//! it on demand when watching is off. A newer version that cannot take the running
//! tasks, before or after the swap, leaves the old one serving them; a file that only
//! claims a served name takes nothing over; one reload launches a bounded number of
//! files at once.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use drover_api::{PluginState, PluginStatus, RunRequest, TaskEventKind, TaskLifecycle, TaskView};
use drover_test_support::procs::{alive, start_time};
use drover_test_support::until_blocking;

/// Running tasks handed over by the upgrade.
const TASKS: usize = 50;
/// From the drop of the file to the new version serving (the acceptance bound).
const SERVED_WITHIN: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(10);

fn request(v: serde_json::Value) -> RunRequest {
    serde_json::from_value(v).expect("a valid run request")
}

fn sleeper(driver: &str, name: &str) -> RunRequest {
    request(serde_json::json!({
        "driver": driver,
        "name": name,
        "kill_timeout": "2s",
        "config": {"command": "/bin/sleep", "args": ["3600"]},
    }))
}

/// A wrapper script running the fixture plugin with `env`, written outside
/// plugin_dir and renamed into it (one `MOVED_TO`, never a half-written file), as an
/// operator installs a binary. Returns the path in plugin_dir and when it appeared.
fn install(root: &Path, plugin_dir: &Path, name: &str, env: &str) -> (PathBuf, Instant) {
    let staging = root.join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let fixture = workspace_bin("drover-fixture-plugin");
    let staged = staging.join(name);
    write_exec(
        &staged,
        &format!("#!/bin/sh\n{env} exec {} \"$@\"\n", fixture.display()),
        0o755,
    );
    let target = plugin_dir.join(name);
    std::fs::rename(&staged, &target).unwrap();
    (target, Instant::now())
}

fn plugins(api: &Api) -> Vec<PluginStatus> {
    api.block_on(api.plugins())
        .unwrap_or_else(|e| panic!("plugin status: {e}"))
}

fn serving<'a>(rows: &'a [PluginStatus], name: &str) -> Option<&'a PluginStatus> {
    rows.iter()
        .find(|r| r.name == name && r.state != PluginState::Skipped)
}

fn task(api: &Api, id: &str) -> TaskView {
    api.block_on(api.get_task(id))
        .unwrap_or_else(|e| panic!("task {id}: {e}"))
}

/// The pid rawexec reported for a running task.
fn task_pid(view: &TaskView) -> u32 {
    view.attributes
        .get("pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("task {} has no pid attribute: {view:?}", view.id))
}

fn count(view: &TaskView, kind: TaskEventKind) -> usize {
    view.events.iter().filter(|e| e.kind == kind).count()
}

/// Every task still running as the same process, started once: its pid alive with
/// the start time it had, and `Started` once in its events.
fn assert_same_processes(api: &Api, pids: &BTreeMap<String, (u32, u64)>) {
    for (id, (pid, started)) in pids {
        let view = task(api, id);
        assert_eq!(view.state, TaskLifecycle::Running, "task {id}: {view:?}");
        assert_eq!(task_pid(&view), *pid, "task {id} changed pid");
        assert_eq!(
            start_time(*pid),
            Some(*started),
            "task {id}: pid {pid} is no longer the process that was started"
        );
        assert_eq!(
            count(&view, TaskEventKind::Started),
            1,
            "task {id} was started again: {:?}",
            view.events
        );
        assert_eq!(view.restarts, 0, "task {id} was restarted");
    }
}

#[test]
fn a_newer_rawexec_takes_50_running_tasks_over_and_a_removed_one_leaves_them_running() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let builtin = serving(&plugins(&api), "raw_exec").unwrap().clone();
    assert_eq!(builtin.source, drover_api::PluginSource::Builtin);
    let builtin_pid = builtin.pid.expect("the built-in rawexec runs as a process");

    let mut pids = BTreeMap::new();
    for i in 0..TASKS {
        let view = api
            .block_on(api.run_task(&sleeper("rawexec", &format!("sleeper-{i}"))))
            .unwrap_or_else(|e| panic!("start task {i}: {e}"));
        let pid = task_pid(&view);
        pids.insert(
            view.id.clone(),
            (pid, start_time(pid).expect("task pid alive")),
        );
    }

    // A newer rawexec, dropped in as operators do.
    let (newer, dropped) = install(
        root.path(),
        &agent.plugin_dir,
        "rawexec",
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0",
    );
    let mut served_after = None;
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "the newer rawexec serving",
        || {
            let rows = plugins(&api);
            let ok = serving(&rows, "raw_exec").is_some_and(|r| {
                r.version == "99.0.0" && r.path == newer && r.state == PluginState::Healthy
            });
            if ok && served_after.is_none() {
                served_after = Some(dropped.elapsed());
            }
            ok
        },
    );
    let served_after = served_after.unwrap();
    println!(
        "hot upgrade: rawexec 99.0.0 served {} ms after the file was dropped, with {TASKS} running tasks",
        served_after.as_millis()
    );
    assert!(
        served_after <= SERVED_WITHIN,
        "the newer rawexec served only after {served_after:?} (bound {SERVED_WITHIN:?}); log:\n{}",
        agent.log_text()
    );
    let upgraded = serving(&plugins(&api), "raw_exec").unwrap().clone();
    let new_pid = upgraded.pid.expect("the new rawexec runs as a process");
    assert_ne!(new_pid, builtin_pid);

    // Every task handed over: recovered by the new instance, same process, never
    // started again.
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "every task recovered",
        || {
            pids.keys()
                .all(|id| count(&task(&api, id), TaskEventKind::Recovered) >= 1)
        },
    );
    assert_same_processes(&api, &pids);
    until_blocking(
        Duration::from_secs(10),
        POLL,
        "the old rawexec gone",
        || !alive(builtin_pid),
    );
    let (id, _) = pids.first_key_value().unwrap();
    let out = agent.cli(&["task", "status", id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("running"), "{text}");
    // The line is written once the old process is reaped, a moment after it is gone
    // from /proc.
    let handed_over = format!("{TASKS} running tasks handed over");
    until_blocking(
        Duration::from_secs(10),
        POLL,
        "the upgrade saying it handed every task over",
        || agent.log_text().contains(&handed_over),
    );
    let log = agent.log_text();
    if let Some(line) = log.lines().find(|l| l.contains(&handed_over)) {
        println!("{line}");
    }

    // A broken newer one (it refuses its configuration) leaves 99.0.0 serving. It is
    // named after the plugin, as a file taking a served name over must be.
    let (broken, _) = install(
        root.path(),
        &agent.plugin_dir,
        "drover-driver-rawexec",
        "FIXTURE_MODE=rawexec-bad-config FIXTURE_VERSION=100.0.0",
    );
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter().any(|r| {
            r["path"] == broken.display().to_string()
                && r["state"] == "skipped"
                && r["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("SetConfig"))
        })
    });
    let now = serving(&plugins(&api), "raw_exec").unwrap().clone();
    assert_eq!((now.version.as_str(), now.pid), ("99.0.0", Some(new_pid)));
    assert!(
        now.reason.contains("upgrade to version 100.0.0") && now.reason.contains("failed"),
        "the serving row does not say the upgrade failed: {now:?}"
    );
    println!("broken upgrade: {:#}", row(&rows, "raw_exec"));
    assert_same_processes(&api, &pids);

    // The broken one goes; then the serving file goes: the built-in provides rawexec
    // still and takes the tasks over; they keep running and are stoppable.
    std::fs::remove_file(&broken).unwrap();
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        !rows
            .iter()
            .any(|r| r["path"] == broken.display().to_string())
            && !row(rows, "raw_exec")["reason"]
                .as_str()
                .is_some_and(|r| r.contains("failed"))
    });
    std::fs::remove_file(&newer).unwrap();
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "the built-in serving again",
        || {
            serving(&plugins(&api), "raw_exec")
                .is_some_and(|r| r.source == drover_api::PluginSource::Builtin && r.pid.is_some())
        },
    );
    until_blocking(
        Duration::from_secs(10),
        POLL,
        "the removed rawexec gone",
        || !alive(new_pid),
    );
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "every task recovered again",
        || {
            pids.keys()
                .all(|id| count(&task(&api, id), TaskEventKind::Recovered) >= 2)
        },
    );
    assert_same_processes(&api, &pids);
    for (id, (pid, _)) in &pids {
        let out = agent.cli(&["task", "stop", id]);
        assert!(
            out.status.success(),
            "stop {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let view = task(&api, id);
        assert_eq!(view.state, TaskLifecycle::Dead, "task {id}: {view:?}");
        assert_eq!(view.signal, Some(15), "task {id}: {view:?}");
        until_blocking(
            Duration::from_secs(5),
            POLL,
            "the task's process gone",
            || !alive(*pid),
        );
    }
}

#[test]
fn a_new_plugin_is_served_without_a_restart_and_a_removed_one_serves_its_tasks_until_they_end() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let (file, dropped) = install(
        root.path(),
        &agent.plugin_dir,
        "extra-rawexec",
        "FIXTURE_MODE=rawexec FIXTURE_NAME=rawexec2 FIXTURE_VERSION=1.0.0",
    );
    until_blocking(Duration::from_secs(20), POLL, "rawexec2 added", || {
        serving(&plugins(&api), "rawexec2").is_some_and(|r| r.state == PluginState::Healthy)
    });
    println!(
        "hot add: rawexec2 served {} ms after its file was dropped",
        dropped.elapsed().as_millis()
    );
    let pid = serving(&plugins(&api), "rawexec2").unwrap().pid.unwrap();
    let ids: Vec<String> = (0..3)
        .map(|i| {
            api.block_on(api.run_task(&sleeper("rawexec2", &format!("extra-{i}"))))
                .unwrap_or_else(|e| panic!("start task {i} on rawexec2: {e}"))
                .id
        })
        .collect();

    std::fs::remove_file(&file).unwrap();
    until_blocking(Duration::from_secs(20), POLL, "rawexec2 retiring", || {
        serving(&plugins(&api), "rawexec2").is_some_and(|r| r.reason.contains("was removed"))
    });
    // No new tasks; the running ones keep running, managed.
    let refused = api
        .block_on(api.run_task(&sleeper("rawexec2", "too-late")))
        .expect_err("a removed plugin takes no new task");
    assert!(refused.to_string().contains("was removed"), "{refused}");
    for id in &ids {
        let view = task(&api, id);
        assert_eq!(view.state, TaskLifecycle::Running, "{view:?}");
        assert!(alive(task_pid(&view)));
    }
    assert!(
        alive(pid),
        "the removed plugin's process went before its tasks ended"
    );
    // Stopping the last of them lets the plugin go.
    for id in &ids {
        let out = agent.cli(&["task", "stop", id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(task(&api, id).state, TaskLifecycle::Dead);
    }
    until_blocking(Duration::from_secs(20), POLL, "rawexec2 gone", || {
        plugins(&api).iter().all(|r| r.name != "rawexec2") && !alive(pid)
    });
}

#[test]
fn plugin_reload_applies_changes_on_demand_when_watching_is_off() {
    let _serial = serial();
    let (root, agent) = rawexec_agent_with_config("watch_plugin_dir = false\n");
    let api = agent.api();
    install(
        root.path(),
        &agent.plugin_dir,
        "late",
        "FIXTURE_NAME=late FIXTURE_VERSION=0.2.0",
    );
    // Logged once the catalog is loaded, which can be a moment after rawexec is
    // healthy.
    until_blocking(
        Duration::from_secs(10),
        POLL,
        "the agent saying it is not watching plugin_dir",
        || agent.log_text().contains("watch_plugin_dir = false"),
    );
    assert!(serving(&plugins(&api), "late").is_none());
    let out = agent.cli(&["plugin", "reload"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("added") && text.contains("late"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = plugins(&api);
    let late = serving(&rows, "late").expect("late serves after the reload");
    assert_eq!(late.version, "0.2.0");
    let pid = late.pid.unwrap();
    // Nothing changed since: a second reload says so.
    let out = agent.cli(&["plugin", "reload"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "no plugin changed"
    );
    // The same file replaced by new bytes is an upgrade in place.
    install(
        root.path(),
        &agent.plugin_dir,
        "late",
        "FIXTURE_NAME=late FIXTURE_VERSION=0.3.0",
    );
    let out = agent.cli(&["plugin", "reload"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("upgraded") && text.contains("0.3.0"),
        "{text}"
    );
    let rows = plugins(&api);
    let late = serving(&rows, "late").unwrap();
    assert_eq!(late.version, "0.3.0");
    until_blocking(
        Duration::from_secs(10),
        POLL,
        "the replaced instance gone",
        || !alive(pid),
    );
    // A file that cannot serve is a row with its reason, not an error.
    write_exec(
        &agent.plugin_dir.join("garbage"),
        "#!/bin/sh\nexit 3\n",
        0o755,
    );
    let report = api.block_on(api.reload_plugins()).expect("reload");
    let failed = report
        .changes
        .iter()
        .find(|c| c.name == "garbage")
        .unwrap_or_else(|| panic!("no change for the bad file: {report:?}"));
    assert_eq!(failed.kind, drover_api::PluginChangeKind::Failed);
    // The watcher tries a file again only when its bytes change; an explicit reload
    // retries failed files (a handshake timed out on a busy machine, say).
    let again = api.block_on(api.reload_plugins()).expect("reload");
    assert!(
        again
            .changes
            .iter()
            .any(|c| c.name == "garbage" && c.kind == drover_api::PluginChangeKind::Failed),
        "{again:?}"
    );
    assert!(
        report.plugins.iter().any(|r| r.name == "garbage"
            && r.state == PluginState::Skipped
            && !r.reason.is_empty())
    );
}

#[test]
fn an_upgraded_plugin_is_reattached_by_the_next_agent_with_its_tasks() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    let mut agent = Agent::start(root.path(), &dir, &[]);
    agent.wait_plugins(Duration::from_secs(10), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    let api = agent.api();
    let view = api
        .block_on(api.run_task(&sleeper("rawexec", "survivor")))
        .expect("start a task");
    let (id, pid) = (view.id.clone(), task_pid(&view));
    install(
        root.path(),
        &dir,
        "rawexec",
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0",
    );
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "the newer rawexec serving",
        || serving(&plugins(&api), "raw_exec").is_some_and(|r| r.version == "99.0.0"),
    );
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "the task handed over",
        || count(&task(&api, &id), TaskEventKind::Recovered) == 1,
    );
    let upgraded_pid = serving(&plugins(&api), "raw_exec").unwrap().pid.unwrap();
    // The agent goes; the plugin it upgraded to and the task stay.
    assert!(agent.stop().success());
    drop(api);
    let mut next = Agent::start(root.path(), &dir, &[]);
    next.end_tasks = true;
    let api = next.api();
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "rawexec 99.0.0 reattached",
        || {
            serving(&plugins(&api), "raw_exec").is_some_and(|r| {
                r.version == "99.0.0" && r.reattached && r.pid == Some(upgraded_pid)
            })
        },
    );
    // The hand-over's Recovered event is written with the task's next change (none
    // came), so the record may hold only this agent's.
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "the task recovered again",
        || {
            api.block_on(api.health())
                .is_ok_and(|h| h.recovery.is_some_and(|r| r.recovered == 1))
        },
    );
    let view = task(&api, &id);
    assert_eq!((view.state, task_pid(&view)), (TaskLifecycle::Running, pid));
    assert_eq!(count(&view, TaskEventKind::Started), 1);
}

#[test]
fn a_plugin_dir_created_after_the_start_is_loaded_when_it_appears() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("later");
    let agent = Agent::start(root.path(), &dir, &[]);
    let api = agent.api();
    until_blocking(
        Duration::from_secs(10),
        POLL,
        "the built-ins loaded",
        || serving(&plugins(&api), "raw_exec").is_some(),
    );
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    install(root.path(), &dir, "early-bird", "FIXTURE_NAME=early-bird");
    until_blocking(Duration::from_secs(20), POLL, "early-bird served", || {
        serving(&plugins(&api), "early-bird").is_some()
    });
}

/// rawexec recovers handles of its own encoding version whatever version of the plugin
/// wrote them (the upgrade test above), and refuses a handle from a newer encoding it
/// cannot read, saying which versions.
#[test]
fn rawexec_refuses_a_handle_of_a_newer_encoding_with_a_clear_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = drover_plugin_sdk::client::LaunchOptions::new("rawexec", drover());
        opts.args = vec!["plugin".into(), "serve".into(), "rawexec".into()];
        opts.socket_dir = Some(dir.path().to_owned());
        let plugin = drover_plugin_sdk::client::PluginProcess::launch(opts)
            .await
            .expect("launch the built-in rawexec");
        let mut handle = drover_plugin_sdk::TaskHandle::new(
            drover_plugin_sdk::TaskSpec::new("from-the-future"),
            drover_driver_rawexec::HANDLE_VERSION + 1,
            &serde_json::json!({"executor_dir": "/nonexistent"}),
        )
        .unwrap();
        handle.state = drover_plugin_sdk::TaskState::Running;
        let err = plugin
            .client()
            .recover_task(handle)
            .await
            .expect_err("a handle of a newer encoding is refused");
        let text = err.to_string();
        plugin.shutdown().await;
        assert!(
            text.contains(&format!(
                "handle of version {}",
                drover_driver_rawexec::HANDLE_VERSION + 1
            )) && text.contains(&format!(
                "knows version {}",
                drover_driver_rawexec::HANDLE_VERSION
            )),
            "{text}"
        );
    });
}

/// Starts `n` sleepers on `driver`; returns their ids and pids.
fn sleepers(api: &Api, driver: &str, n: usize) -> BTreeMap<String, (u32, u64)> {
    (0..n)
        .map(|i| {
            let view = api
                .block_on(api.run_task(&sleeper(driver, &format!("sleeper-{i}"))))
                .unwrap_or_else(|e| panic!("start task {i}: {e}"));
            let pid = task_pid(&view);
            (view.id, (pid, start_time(pid).expect("task pid alive")))
        })
        .collect()
}

/// The built-in rawexec still serves as the same process, healthy, and its tasks
/// were neither lost nor restarted; then every task stops through the CLI.
fn assert_builtin_kept_its_tasks(
    agent: &Agent,
    api: &Api,
    builtin_pid: u32,
    pids: &BTreeMap<String, (u32, u64)>,
) {
    let now = serving(&plugins(api), "raw_exec").unwrap().clone();
    assert_eq!(
        (now.source, now.pid),
        (drover_api::PluginSource::Builtin, Some(builtin_pid)),
        "{now:?}"
    );
    assert!(alive(builtin_pid));
    assert_same_processes(api, pids);
    for (id, (pid, _)) in pids {
        let view = task(api, id);
        assert!(
            !view
                .events
                .iter()
                .any(|e| e.message.contains("could not recover")),
            "task {id} was given up: {:?}",
            view.events
        );
        let out = agent.cli(&["task", "stop", id]);
        assert!(
            out.status.success(),
            "stop {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let view = task(api, id);
        assert_eq!(
            (view.state, view.signal),
            (TaskLifecycle::Dead, Some(15)),
            "task {id}: {view:?}"
        );
        until_blocking(
            Duration::from_secs(5),
            POLL,
            "the task's process gone",
            || !alive(*pid),
        );
    }
}

/// The skipped row of `path` once its reason contains `needle`.
fn skipped_row(agent: &Agent, path: &Path, needle: &str) -> serde_json::Value {
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter().any(|r| {
            r["path"] == path.display().to_string()
                && r["state"] == "skipped"
                && r["reason"].as_str().is_some_and(|s| s.contains(needle))
        })
    });
    rows.into_iter()
        .find(|r| r["path"] == path.display().to_string())
        .unwrap()
}

/// A newer rawexec that cannot read the running tasks' handles is found out before it
/// serves (it is asked to recover each of them while the old one still serves): the
/// upgrade is refused, both rows say why, and the tasks stay with the old instance.
#[test]
fn a_newer_rawexec_that_cannot_read_the_handles_does_not_take_the_tasks() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let builtin_pid = serving(&plugins(&api), "raw_exec").unwrap().pid.unwrap();
    let pids = sleepers(&api, "rawexec", 3);
    let (newer, _) = install(
        root.path(),
        &agent.plugin_dir,
        "rawexec",
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0 FIXTURE_RECOVER_ACCEPT=0",
    );
    let row = skipped_row(&agent, &newer, "cannot take task");
    println!("refused upgrade: {row:#}");
    let serving_row = serving(&plugins(&api), "raw_exec").unwrap().clone();
    assert!(
        serving_row
            .reason
            .contains("version 99.0.0 cannot take task")
            && serving_row.reason.contains("keeps serving"),
        "the serving row does not say why the upgrade was refused: {serving_row:?}"
    );
    for id in pids.keys() {
        assert_eq!(count(&task(&api, id), TaskEventKind::Recovered), 0);
    }
    assert_builtin_kept_its_tasks(&agent, &api, builtin_pid, &pids);
}

/// A newer rawexec that passes the probe but refuses the tasks once it serves (here:
/// it recovers only as many tasks as were probed) is rolled back: the old instance is
/// put back and keeps serving, never shut down, and the tasks stay managed.
#[test]
fn a_newer_rawexec_refusing_tasks_after_the_swap_is_rolled_back() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let (builtin_pid, pids, row) = rolled_back_upgrade(
        root.path(),
        &agent,
        &api,
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0 FIXTURE_RECOVER_ACCEPT=2",
    );
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains("version 99.0.0 cannot take task")),
        "{row:#}"
    );
    assert_builtin_kept_its_tasks(&agent, &api, builtin_pid, &pids);
}

/// With two sleepers on the built-in rawexec, installs a newer rawexec run with `env`
/// into `agent`'s plugin_dir and waits until its upgrade is rolled back and the
/// built-in serves again, healthy. Returns the built-in's pid, the sleepers and the
/// new file's skipped row.
fn rolled_back_upgrade(
    root: &Path,
    agent: &Agent,
    api: &Api,
    env: &str,
) -> (u32, BTreeMap<String, (u32, u64)>, serde_json::Value) {
    let builtin_pid = serving(&plugins(api), "raw_exec").unwrap().pid.unwrap();
    let pids = sleepers(api, "rawexec", 2);
    let (newer, _) = install(root, &agent.plugin_dir, "rawexec", env);
    let row = skipped_row(agent, &newer, "rolled back");
    println!("rolled back: {row:#}");
    until_blocking(
        Duration::from_secs(20),
        POLL,
        "the built-in serving, healthy",
        || {
            serving(&plugins(api), "raw_exec").is_some_and(|r| {
                r.source == drover_api::PluginSource::Builtin
                    && r.state == PluginState::Healthy
                    && r.reason.contains("rolled back")
            })
        },
    );
    (builtin_pid, pids, row)
}

/// A newer rawexec that crashes on the first handle it is asked to recover is found
/// out before it serves: the upgrade is refused, and the old instance keeps the tasks.
#[test]
fn a_newer_rawexec_crashing_on_the_probe_does_not_take_the_tasks() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let builtin_pid = serving(&plugins(&api), "raw_exec").unwrap().pid.unwrap();
    let pids = sleepers(&api, "rawexec", 2);
    let (newer, _) = install(
        root.path(),
        &agent.plugin_dir,
        "rawexec",
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0 FIXTURE_RECOVER_CRASH=0",
    );
    let row = skipped_row(&agent, &newer, "upgrade to version 99.0.0");
    println!("refused upgrade: {row:#}");
    let serving_row = serving(&plugins(&api), "raw_exec").unwrap().clone();
    assert!(
        serving_row.reason.contains("upgrade to version 99.0.0")
            && serving_row.reason.contains("keeps serving"),
        "the serving row does not say why the upgrade was refused: {serving_row:?}"
    );
    assert_builtin_kept_its_tasks(&agent, &api, builtin_pid, &pids);
}

/// A newer rawexec that passes the probe but crashes once it serves (on the first
/// handle after the probed ones) is rolled back: the old instance, never shut down,
/// serves again and keeps the tasks, which stay stoppable.
#[test]
fn a_newer_rawexec_crashing_after_the_swap_is_rolled_back() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let (builtin_pid, pids, _) = rolled_back_upgrade(
        root.path(),
        &agent,
        &api,
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0 FIXTURE_RECOVER_CRASH=2",
    );
    assert_builtin_kept_its_tasks(&agent, &api, builtin_pid, &pids);
    // New tasks start (on the old instance) after the rollback.
    let more = sleepers(&api, "rawexec", 1);
    assert_builtin_kept_its_tasks(&agent, &api, builtin_pid, &more);
}

/// A file that calls itself by a served name, but is neither named after it nor
/// pinned, takes nothing over: a skipped row says why and how to allow it.
#[test]
fn a_file_only_claiming_a_served_name_takes_nothing_over() {
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let builtin_pid = serving(&plugins(&api), "raw_exec").unwrap().pid.unwrap();
    let pids = sleepers(&api, "rawexec", 2);
    let (claimer, _) = install(
        root.path(),
        &agent.plugin_dir,
        "acme-gpu",
        "FIXTURE_MODE=rawexec FIXTURE_VERSION=99.0.0",
    );
    let row = skipped_row(&agent, &claimer, "to allow the takeover");
    println!("refused takeover: {row:#}");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("drover-driver-rawexec") && reason.contains("sha256"),
        "{reason}"
    );
    for id in pids.keys() {
        assert_eq!(count(&task(&api, id), TaskEventKind::Recovered), 0);
    }
    assert_builtin_kept_its_tasks(&agent, &api, builtin_pid, &pids);
}

/// Files dropped together are launched by one reload at most 4 at a time: each
/// fixture holds its start-up for a while and logs when, so the windows overlap by
/// the number launched at once.
#[test]
fn one_reload_launches_at_most_four_files_at_once() {
    const FILES: usize = 8;
    let _serial = serial();
    let (root, agent) = rawexec_agent();
    let api = agent.api();
    let log = root.path().join("launches.log");
    let staging = root.path().join("burst");
    std::fs::create_dir_all(&staging).unwrap();
    let fixture = workspace_bin("drover-fixture-plugin");
    for i in 0..FILES {
        write_exec(
            &staging.join(format!("burst-{i}")),
            &format!(
                "#!/bin/sh\nFIXTURE_NAME=burst-{i} FIXTURE_LAUNCH_LOG={} \
                 FIXTURE_LAUNCH_DELAY_MS=400 exec {} \"$@\"\n",
                log.display(),
                fixture.display()
            ),
            0o755,
        );
    }
    for i in 0..FILES {
        let name = format!("burst-{i}");
        std::fs::rename(staging.join(&name), agent.plugin_dir.join(&name)).unwrap();
    }
    until_blocking(Duration::from_secs(30), POLL, "every file served", || {
        let rows = plugins(&api);
        (0..FILES).all(|i| serving(&rows, &format!("burst-{i}")).is_some())
    });
    let windows: Vec<(u128, u128)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    assert_eq!(windows.len(), FILES, "{windows:?}");
    let most = windows
        .iter()
        .map(|(start, _)| {
            windows
                .iter()
                .filter(|(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap();
    println!("{FILES} files dropped at once: at most {most} launched together");
    assert!(
        most <= 4,
        "{most} launches ran at once (bound 4): {windows:?}"
    );
}
