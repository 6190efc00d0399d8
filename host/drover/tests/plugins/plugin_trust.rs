//! A plugin binary is checked before it runs, every time, on the bytes that run.
//!
//! Issue 10, scenario 2: "a pinned plugin's check runs after the binary already ran".

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn plugin_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir(&dir).unwrap();
    dir
}

fn sha256(path: &Path) -> String {
    drover_host::plugins::trust::sha256_file(path).unwrap()
}

fn by_path<'a>(rows: &'a [serde_json::Value], file: &str) -> Option<&'a serde_json::Value> {
    rows.iter().find(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.ends_with(&format!("/{file}")))
    })
}

/// A script that leaves `marker` behind if it ever runs, then execs the real skeleton
/// plugin (so that, run, it would even work).
fn marking_script(marker: &Path) -> String {
    format!(
        "#!/bin/sh\necho ran > {}\nexec {} \"$@\"\n",
        marker.display(),
        workspace_bin("drover-skeleton-driver").display()
    )
}

/// Scenario 2, as the issue tells it: `[plugin.skeleton] sha256 = "…"` in the agent
/// config and an unrelated script named `drover-skeleton-driver` in `plugin_dir`. The
/// script must not run at all.
#[test]
fn a_pin_is_checked_before_the_binary_runs_whatever_its_file_is_called() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    let skeleton = workspace_bin("drover-skeleton-driver");
    // The genuine, pinned plugin, under a name of the operator's choosing.
    crate::common::copy_exec(&skeleton, dir.join("skeleton"));
    let marker = root.path().join("the-script-ran");
    write_exec(
        &dir.join("drover-skeleton-driver"),
        &format!("#!/bin/sh\necho ran > {}\nexit 1\n", marker.display()),
        0o755,
    );
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!("[plugin.skeleton]\nsha256 = \"{}\"\n", sha256(&skeleton)),
    )
    .unwrap();
    let agent = Agent::start(root.path(), &dir, &["--config", config.to_str().unwrap()]);
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        by_path(rows, "drover-skeleton-driver").is_some_and(|r| r["state"] == "skipped")
            && rows
                .iter()
                .any(|r| r["name"] == "skeleton" && r["state"] == "healthy")
            && rows.iter().all(|r| r["state"] != "unhealthy")
    });
    assert!(
        !marker.exists(),
        "the unpinned script named drover-skeleton-driver ran; rows: {rows:#?}"
    );
    let script = by_path(&rows, "drover-skeleton-driver").unwrap();
    let reason = script["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("not pinned"), "{script:#?}");
    assert!(script["pid"].is_null(), "{script:#?}");
    // Built-ins need no pin.
    assert_eq!(row(&rows, "raw_exec")["state"], "healthy");
    agent.assert_only_healthy_plugins_run(&rows);
}

/// Swap the file of the running plugin `file` (as an operator's `mv new file` would)
/// for `body` with `mode`, kill the plugin, and wait until its relaunch either ran the
/// new file (the marker appears) or was refused with a reason containing `refusal`.
fn swap_and_crash(agent: &Agent, file: &str, body: &str, mode: u32, marker: &Path, refusal: &str) {
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "skeleton" && r["state"] == "healthy")
    });
    let pid = row(&rows, "skeleton")["pid"].as_u64().unwrap() as u32;
    let staged = agent.plugin_dir.join(".staged");
    write_exec(&staged, body, mode);
    // write_exec's chmod is subject to nothing, but be explicit about the mode kept.
    std::fs::set_permissions(
        &staged,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(mode),
    )
    .unwrap();
    std::fs::rename(&staged, agent.plugin_dir.join(file)).unwrap();
    nix_kill(pid, 9).unwrap();
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        marker.exists()
            || rows.iter().any(|r| {
                r["name"] == "skeleton" && r["reason"].as_str().is_some_and(|s| s.contains(refusal))
            })
    });
    assert!(
        !marker.exists(),
        "the swapped-in file ran when the crashed plugin was relaunched; rows: {rows:#?}\nlog:\n{}",
        agent.log_text()
    );
    let r = row(&rows, "skeleton");
    assert_eq!(r["state"], "unhealthy", "{r:#?}");
    assert!(r["pid"].is_null(), "{r:#?}");
}

/// A relaunch after a crash checks the pin on the bytes it executes.
#[test]
fn a_crashed_plugin_is_not_relaunched_from_a_binary_that_fails_its_pin() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    let skeleton = workspace_bin("drover-skeleton-driver");
    crate::common::copy_exec(&skeleton, dir.join("skeleton"));
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!("[plugin.skeleton]\nsha256 = \"{}\"\n", sha256(&skeleton)),
    )
    .unwrap();
    let agent = Agent::start(root.path(), &dir, &["--config", config.to_str().unwrap()]);
    let marker = root.path().join("the-swapped-file-ran");
    swap_and_crash(
        &agent,
        "skeleton",
        &marking_script(&marker),
        0o755,
        &marker,
        "pins",
    );
}

/// A relaunch after a crash checks owner and mode again, on the file it executes.
#[test]
fn a_crashed_plugin_is_not_relaunched_from_a_world_writable_binary() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    crate::common::copy_exec(
        workspace_bin("drover-skeleton-driver"),
        dir.join("skeleton"),
    );
    let agent = Agent::start(root.path(), &dir, &[]);
    let marker = root.path().join("the-swapped-file-ran");
    swap_and_crash(
        &agent,
        "skeleton",
        &marking_script(&marker),
        0o777,
        &marker,
        "world-writable",
    );
}

/// The file is opened once: what is hashed is what runs, even if the path is replaced
/// between the check and the exec.
#[tokio::test]
async fn the_bytes_checked_are_the_bytes_executed() {
    use drover_host::plugins::candidate::Candidate;
    use drover_host::plugins::{loader, trust};
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    let path = dir.join("skeleton");
    crate::common::copy_exec(workspace_bin("drover-skeleton-driver"), &path);
    let candidate = Candidate {
        path: path.clone(),
        args: Vec::new(),
        source: drover_api::PluginSource::External,
        label: "skeleton".into(),
    };
    let (fd, _) = trust::open_checked(&candidate).unwrap();
    let binary = trust::Binary {
        sha256: trust::sha256_fd(&fd).unwrap(),
        fd: std::sync::Arc::new(fd),
    };
    assert_eq!(binary.sha256, sha256(&path));
    // Checked. Now the path is swapped for something else.
    let marker = root.path().join("the-swapped-file-ran");
    let staged = dir.join(".staged");
    write_exec(&staged, &marking_script(&marker), 0o755);
    std::fs::rename(&staged, &path).unwrap();
    let fp = loader::fingerprint(
        &candidate,
        &binary,
        Duration::from_secs(10),
        root.path(),
        &drover_plugin_sdk::version::supported_api_range(),
        &loader::LaunchSettings::default(),
    )
    .await
    .expect("the checked binary launches");
    assert_eq!(fp.info.name, "skeleton");
    assert!(!marker.exists(), "the file swapped in after the check ran");
    let pid = fp.process.pid().expect("a plugin process");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        exe.to_string_lossy().ends_with("(deleted)"),
        "the process runs {exe:?}, not the checked (since replaced) file"
    );
    fp.process.shutdown().await;
}

/// `drover plugin status --json`, or a failure if it takes longer than `limit`.
fn plugin_status_within(agent: &Agent, limit: Duration) -> Vec<serde_json::Value> {
    let mut child = std::process::Command::new(drover())
        .args(["plugin", "status", "--json"])
        .env("DROVER_ADDR", format!("unix://{}", agent.socket.display()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "drover plugin status did not answer within {limit:?}; agent log:\n{}",
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    rows.as_array().cloned().unwrap_or_default()
}

/// Security review of issue 10: a FIFO in `plugin_dir` was opened for reading before
/// its type was checked, and that open blocks until a writer comes: plugin loading hung
/// for good. Now it is skipped with its reason, and the agent loads the rest and serves.
#[test]
fn a_fifo_in_plugin_dir_is_skipped_and_the_agent_serves() {
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    let fifo = dir.join("drover-fifo-driver");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o755),
        0,
    )
    .unwrap();
    let agent = Agent::start(root.path(), &dir, &[]);
    // Each `plugin status` bounded in time too: a hung agent fails the test, not hangs it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let rows = plugin_status_within(&agent, Duration::from_secs(5));
        if by_path(&rows, "drover-fifo-driver").is_some()
            && rows
                .iter()
                .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
        {
            break rows;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "plugin loading did not finish within 20 s with a FIFO in plugin_dir: {rows:#?}\n\
             agent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let row = by_path(&rows, "drover-fifo-driver").unwrap();
    assert_eq!(row["state"], "skipped", "{row:#}");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("{} is a FIFO, not a regular file", fifo.display())),
        "{reason}"
    );
    // The agent serves: a task runs to completion.
    let run = agent.cli_json(&[
        "task",
        "run",
        "--driver",
        "rawexec",
        "--config",
        &drover_test_support::sh("exit 0").to_string(),
        "--json",
    ]);
    let id = run["id"].as_str().unwrap();
    assert_eq!(agent.cli(&["task", "wait", id]).status.code(), Some(0));
}

/// Security review of issue 10: with the agent's own binary group-writable (built with
/// umask 002, mode 0775), every built-in driver was refused with a warning naming
/// "file", and nothing said the agent's binary was the cause. The built-ins are still
/// refused (others could replace what runs as the agent), but the agent logs it at
/// error level naming the binary and the fix, and `plugin status` says the same.
#[test]
fn a_group_writable_agent_binary_is_an_error_naming_it_and_the_fix() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    let bin_dir = root.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let binary = bin_dir.join("drover");
    crate::common::copy_exec(drover(), &binary);
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o775)).unwrap();
    let agent = Agent::start_binary(&binary, root.path(), &dir, &[]);
    let fix = format!("chmod go-w {}", binary.display());
    let builtin_rows = |rows: &[serde_json::Value]| -> Vec<serde_json::Value> {
        rows.iter()
            .filter(|r| r["source"] == "builtin")
            .cloned()
            .collect()
    };
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        builtin_rows(rows).iter().any(|r| r["name"] == "raw_exec")
    });
    let builtins = builtin_rows(&rows);
    assert!(!builtins.is_empty());
    for row in &builtins {
        assert_eq!(row["state"], "skipped", "{row:#}");
        let reason = row["reason"].as_str().unwrap();
        assert!(
            reason.contains("the agent's own binary")
                && reason.contains(&format!("{} is group-writable", binary.display()))
                && reason.contains(&fix),
            "{reason}"
        );
    }
    let log = agent.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("the built-in drivers will not run"))
        .unwrap_or_else(|| panic!("no error-level line about the built-ins:\n{log}"));
    assert!(
        line.contains(&binary.display().to_string()) && line.contains(&fix),
        "{line}"
    );
}
