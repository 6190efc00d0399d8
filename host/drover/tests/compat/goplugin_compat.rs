//! Wire compatibility with HashiCorp go-plugin, checked against the real thing: a Go
//! program built from Debian's go-plugin package acts as a go-plugin host launching
//! Drover plugins, and as a go-plugin plugin the Drover agent must refuse cleanly.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use drover_test_support::goplugin::{self, hex_decode};

const GOPATH: &str = "/usr/share/gocode";

/// Build tests/goplugin-compat with the system Go in GOPATH mode. Without Go and
/// Debian's go-plugin sources the test cannot run: it fails under CI=true (the test
/// script installs them) and skips loudly elsewhere.
fn build_go_program() -> Option<PathBuf> {
    // Both tests want the program: build it once, not twice into the same path while
    // the other test may be running it.
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_go_program_once).clone()
}

fn build_go_program_once() -> Option<PathBuf> {
    let have_go = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    let have_src = Path::new(GOPATH)
        .join("src/github.com/hashicorp/go-plugin")
        .exists()
        && Path::new(GOPATH)
            .join("src/google.golang.org/grpc")
            .exists();
    if !have_go || !have_src {
        let msg = "go-plugin compatibility test needs `go` and Debian's golang-github-hashicorp-go-plugin-dev \
                   and golang-google-grpc-dev (scripts/test.sh installs them)";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED (loudly): {msg}");
        return None;
    }
    let target = drover().parent().unwrap().to_owned();
    let out = target.join("goplugin-compat");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/goplugin-compat");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOCACHE", target.join("gocache"))
        .status()
        .expect("run go build");
    assert!(status.success(), "go build of tests/goplugin-compat failed");
    Some(out)
}

fn go_host(program: &Path, plugin: &Path, args: &[&str]) -> serde_json::Value {
    goplugin::report(Command::new(program).arg("host").arg(plugin).args(args))
}

fn assert_loaded_by_go(program: &Path, plugin: &Path, args: &[&str], name: &str) {
    let report = go_host(program, plugin, args);
    assert_eq!(report["protocol"], "grpc", "{report:#}");
    assert_eq!(
        report["ping"], "ok",
        "health check through go-plugin failed: {report:#}"
    );
    assert_eq!(report["plugin_info_error"], "", "{report:#}");
    let info = hex_decode(report["plugin_info_hex"].as_str().unwrap());
    let text = String::from_utf8_lossy(&info);
    assert!(
        text.contains(name),
        "PluginInfo answer {text:?} lacks {name:?}"
    );
    assert!(
        text.contains("1.0.0"),
        "PluginInfo answer {text:?} lacks the API version"
    );
    assert_eq!(
        report["exited_gracefully"], true,
        "plugin needed SIGKILL: {report:#}"
    );
    assert!(report["kill_ms"].as_i64().unwrap() < 2000, "{report:#}");
}

#[test]
fn drover_plugins_load_in_a_go_plugin_host() {
    let Some(program) = build_go_program() else {
        return;
    };
    assert_loaded_by_go(
        &program,
        &workspace_bin("drover-skeleton-driver"),
        &[],
        "skeleton",
    );
    assert_loaded_by_go(
        &program,
        &drover(),
        &["plugin", "serve", "raw_exec"],
        "raw_exec",
    );
}

#[test]
fn go_plugin_for_another_app_is_refused_and_shut_down() {
    let Some(program) = build_go_program() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    crate::common::copy_exec(&program, dir.join("go-other-app"));
    let agent = Agent::start(root.path(), &dir, &[]);
    let rows = agent.wait_plugins(Duration::from_secs(15), |rows| {
        // Every plugin settled, the built-ins included.
        ["go-other-app", "raw_exec", "exec", "java"]
            .iter()
            .all(|n| rows.iter().any(|r| r["name"] == *n))
            && rows.iter().all(|r| r["state"] != "unhealthy")
    });
    let row = row(&rows, "go-other-app");
    assert_eq!(row["state"], "skipped");
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("does not serve drover.plugin.v1"),
        "{row:#}"
    );
    agent.assert_only_healthy_plugins_run(&rows);
}
