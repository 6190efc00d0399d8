//! A plugin binary is checked before it runs, every time, on the bytes that run.
//!
//! Issue 10, scenario 2: "a pinned plugin's check runs after the binary already ran".

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn plugin_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir(&dir).unwrap();
    dir
}

fn sha256(path: &Path) -> String {
    drover_host::loader::sha256_file(path).unwrap()
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
    std::fs::copy(&skeleton, dir.join("skeleton")).unwrap();
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
    assert_eq!(row(&rows, "rawexec")["state"], "healthy");
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
    std::fs::copy(&skeleton, dir.join("skeleton")).unwrap();
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
    std::fs::copy(
        workspace_bin("drover-skeleton-driver"),
        dir.join("skeleton"),
    )
    .unwrap();
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
    use drover_host::loader;
    let root = tempfile::tempdir().unwrap();
    let dir = plugin_dir(root.path());
    let path = dir.join("skeleton");
    std::fs::copy(workspace_bin("drover-skeleton-driver"), &path).unwrap();
    let candidate = loader::Candidate {
        path: path.clone(),
        args: Vec::new(),
        source: drover_api::PluginSource::External,
        label: "skeleton".into(),
    };
    let (fd, _) = loader::open_checked(&candidate).unwrap();
    let binary = loader::Binary {
        sha256: loader::sha256_fd(&fd).unwrap(),
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
    )
    .await
    .expect("the checked binary launches");
    assert_eq!(fp.info.name, "skeleton");
    assert!(!marker.exists(), "the file swapped in after the check ran");
    let exe = std::fs::read_link(format!("/proc/{}/exe", fp.process.pid())).unwrap();
    assert!(
        exe.to_string_lossy().ends_with("(deleted)"),
        "the process runs {exe:?}, not the checked (since replaced) file"
    );
    fp.process.shutdown().await;
}
