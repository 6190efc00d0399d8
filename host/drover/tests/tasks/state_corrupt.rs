//! A state file the agent cannot trust stops `drover agent` before it opens a socket
//! or launches a plugin, with a message naming the file and what to do, and the file
//! is left exactly as it was.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Refusal {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// Run `drover agent` on `data_dir` and expect it to exit by itself.
fn run_agent_expecting_exit(root: &Path, data_dir: &Path) -> Refusal {
    let plugin_dir = root.join("plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let marker = format!(
        "state-corrupt-{}-{}",
        std::process::id(),
        data_dir.display()
    );
    let started = Instant::now();
    let mut child = Command::new(drover())
        .arg("agent")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .env("DROVER_TEST_MARKER", &marker)
        .env("DROVER_PLUGIN_PASS_ENV", "DROVER_TEST_MARKER")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = started + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("agent kept running on a bad state file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    // Nothing was launched on its behalf.
    let needle = format!("DROVER_TEST_MARKER={marker}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(env) = std::fs::read(entry.path().join("environ")) {
            assert!(
                !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()),
                "a process was started by the refusing agent: {}",
                entry.path().display()
            );
        }
    }
    Refusal {
        code: status.code(),
        stderr,
        took,
    }
}

fn assert_refuses(root: &Path, data_dir: &Path, what: &str) -> String {
    let state = data_dir.join("state.db");
    let before = std::fs::read(&state).unwrap();
    let r = run_agent_expecting_exit(root, data_dir);
    assert!(
        r.code.is_some_and(|c| c != 0),
        "{what}: exit {:?}\n{}",
        r.code,
        r.stderr
    );
    assert!(r.took < Duration::from_secs(5), "{what}: took {:?}", r.took);
    assert!(
        r.stderr.contains(&state.display().to_string()),
        "{what}: stderr does not name the file:\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("move it aside"),
        "{what}: stderr does not say what to do:\n{}",
        r.stderr
    );
    assert_eq!(
        std::fs::read(&state).unwrap(),
        before,
        "{what}: the state file was changed"
    );
    assert!(
        !data_dir.join("api.sock").exists(),
        "{what}: API socket left behind"
    );
    assert!(
        !data_dir.join("run").exists(),
        "{what}: the agent went on preparing directories"
    );
    r.stderr
}

fn data_dir_with(root: &Path, bytes: &[u8]) -> std::path::PathBuf {
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    // As the agent makes it: it refuses a data dir other users can enter.
    std::fs::set_permissions(
        &data,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(data.join("state.db"), bytes).unwrap();
    data
}

#[test]
fn zero_byte_state_file_stops_the_agent() {
    let root = tempfile::tempdir().unwrap();
    let data = data_dir_with(root.path(), b"");
    let err = assert_refuses(root.path(), &data, "zero bytes");
    assert!(err.contains("empty"), "{err}");
}

#[test]
fn random_bytes_stop_the_agent() {
    let root = tempfile::tempdir().unwrap();
    let mut x: u32 = 0x1234_5678;
    let noise: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect();
    let data = data_dir_with(root.path(), &noise);
    assert_refuses(root.path(), &data, "random bytes");
}

#[test]
fn truncated_state_file_stops_the_agent() {
    // A real state file, written by a real agent (with a plugin record in it).
    let root = tempfile::tempdir().unwrap();
    let plugin_dir = root.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let full = {
        let mut agent = Agent::start(root.path(), &plugin_dir, &["--drain"]);
        agent.wait_plugins(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
        });
        assert!(agent.stop().success());
        std::fs::read(agent.data_dir.join("state.db")).unwrap()
    };
    assert!(full.len() > 8192, "state file is {} bytes", full.len());
    for cut in [full.len() / 2, 4096, 9] {
        let dir = root.path().join(format!("cut-{cut}"));
        let data = data_dir_with(&dir, &full[..cut]);
        assert_refuses(&dir, &data, &format!("truncated to {cut} bytes"));
    }
}

#[test]
fn second_agent_on_the_same_data_dir_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let plugin_dir = root.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let first = Agent::start(root.path(), &plugin_dir, &[]);
    let r = run_agent_expecting_exit(root.path(), &first.data_dir);
    assert!(r.code.is_some_and(|c| c != 0), "{}", r.stderr);
    assert!(
        r.stderr.contains("in use by another process"),
        "{}",
        r.stderr
    );
    // The first agent is undisturbed.
    assert!(first.socket.exists());
    first.cli_json(&["plugin", "status", "--json"]);
}
