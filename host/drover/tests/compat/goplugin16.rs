//! Wire compatibility with today's HashiCorp go-plugin, checked against the real thing:
//! a go-plugin 1.6.3 host (tests/goplugin16, built by scripts/go-plugin-16.sh) launches
//! Drover plugins with AutoMTLS and gRPC broker multiplexing each on and off, and a
//! second go-plugin host reattaches to a Drover plugin over AutoMTLS after the host that
//! launched it has exited. The other direction (Drover's host launching a go-plugin
//! 1.6.3 plugin) is in goplugin16_sdk.rs.

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use drover_plugin_sdk::handshake;
use drover_test_support::goplugin::{self, hex_decode};
use drover_test_support::until_blocking;

/// A Drover plugin to launch: its binary, its arguments, the name it gives.
struct DroverPlugin {
    path: PathBuf,
    args: &'static [&'static str],
    name: &'static str,
}

/// The skeleton driver and rawexec: an example plugin and a real driver, both built
/// binaries.
fn drover_plugins() -> [DroverPlugin; 2] {
    [
        DroverPlugin {
            path: workspace_bin("drover-skeleton-driver"),
            args: &[],
            name: "skeleton",
        },
        DroverPlugin {
            path: workspace_bin("drover-driver-rawexec"),
            args: &[],
            name: "raw_exec",
        },
    ]
}

/// Run the go-plugin 1.6.3 program with `args`, then `extra` paths and `tail`; its JSON
/// report.
fn run_go(program: &Path, args: &[&str], extra: &[&Path], tail: &[&str]) -> serde_json::Value {
    goplugin::report(Command::new(program).args(args).args(extra).args(tail))
}

/// The go-plugin host got a healthy connection and the plugin's own PluginInfo answer.
fn assert_answered(report: &serde_json::Value, name: &str) {
    assert_eq!(report["protocol"], "grpc", "{report:#}");
    assert_eq!(
        report["ping"], "ok",
        "health check through go-plugin 1.6.3 failed: {report:#}"
    );
    assert_eq!(report["plugin_info_error"], "", "{report:#}");
    let info = hex_decode(report["plugin_info_hex"].as_str().unwrap_or_default());
    let text = String::from_utf8_lossy(&info);
    assert!(
        text.contains(name) && text.contains("1.0.0"),
        "PluginInfo answer {text:?} lacks the name {name:?} or the API version: {report:#}"
    );
}

/// The plugin exited by itself after go-plugin's Kill (GRPCController.Shutdown), well
/// within go-plugin's 2 s grace, after which it would have been SIGKILLed.
fn assert_exited_on_shutdown(report: &serde_json::Value) {
    assert_eq!(
        report["exited_gracefully"], true,
        "go-plugin had to SIGKILL the plugin: {report:#}"
    );
    let exit_us = report["exit_us"].as_i64().unwrap_or(-1);
    assert!(
        (0..2_000_000).contains(&exit_us),
        "the plugin did not exit within 2 s of Shutdown: {report:#}"
    );
}

/// A go-plugin 1.6.3 host with `flags` loads every Drover plugin, calls it and shuts it
/// down cleanly.
fn go_host_loads_drover_plugins(flags: &[&str]) {
    let Some(program) = goplugin::program_16() else {
        return;
    };
    for plugin in drover_plugins() {
        let mut args = vec!["host"];
        args.extend_from_slice(flags);
        let report = run_go(&program, &args, &[&plugin.path], plugin.args);
        assert_answered(&report, plugin.name);
        assert_exited_on_shutdown(&report);
        eprintln!(
            "go-plugin 1.6.3 host {flags:?} -> {}: launch to first RPC {} ms, Shutdown to exit {} µs",
            plugin.name, report["launch_to_first_rpc_ms"], report["exit_us"]
        );
    }
}

#[test]
fn go_host_plain_loads_drover_plugins() {
    go_host_loads_drover_plugins(&[]);
}

#[test]
fn go_host_with_skip_host_env_loads_drover_plugins() {
    go_host_loads_drover_plugins(&["-skip-host-env"]);
}

#[test]
fn go_host_with_automtls_loads_drover_plugins() {
    go_host_loads_drover_plugins(&["-automtls"]);
}

#[test]
fn go_host_with_broker_multiplexing_loads_drover_plugins() {
    go_host_loads_drover_plugins(&["-multiplex"]);
}

#[test]
fn go_host_with_automtls_and_multiplexing_loads_drover_plugins() {
    go_host_loads_drover_plugins(&["-automtls", "-multiplex", "-skip-host-env"]);
}

/// Whether process `pid` runs (exists and is not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

#[test]
fn go_host_reattaches_over_automtls_after_the_launching_host_exited() {
    let Some(program) = goplugin::program_16() else {
        return;
    };
    for plugin in drover_plugins() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("reattach.json");
        let state_arg = state.to_str().expect("utf-8 temp path");
        // The first host launches the plugin over AutoMTLS, calls it, saves its
        // ReattachConfig and TLS material, and exits without killing it. The plugin's
        // stdout and stderr pipes to that host are closed from now on.
        let launched = run_go(
            &program,
            &["host", "-automtls", "-detach", state_arg],
            &[&plugin.path],
            plugin.args,
        );
        assert_answered(&launched, plugin.name);
        assert_eq!(launched["detached"], true, "{launched:#}");
        let pid = u32::try_from(launched["pid"].as_i64().unwrap_or(0)).unwrap_or(0);
        assert!(pid > 0, "no plugin pid: {launched:#}");
        let mode = std::fs::metadata(&state).expect("state file").permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600,
            "the reattach state holds a private key"
        );
        assert!(
            running(pid),
            "the plugin died with the host that launched it"
        );
        // A new host reattaches with the saved certificates, calls it, and kills it.
        let reattached = run_go(&program, &["reattach", state_arg], &[], &[]);
        assert_answered(&reattached, plugin.name);
        let exit_us = reattached["exit_us"].as_i64().unwrap_or(-1);
        assert!(
            (0..2_000_000).contains(&exit_us),
            "the reattached plugin did not exit within 2 s of Shutdown: {reattached:#}"
        );
        until_blocking(
            Duration::from_secs(5),
            Duration::from_millis(20),
            "the reattached plugin's process to end",
            || !running(pid),
        );
    }
}

/// The first line `binary` prints on stdout when started as a go-plugin host starts it,
/// with `PLUGIN_MULTIPLEX_GRPC` set to `multiplex` or unset; the process is killed
/// (its socket directory removed).
fn handshake_line(binary: &Path, multiplex: Option<&str>) -> String {
    // Its socket goes here, and goes away with it.
    let socket_dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(binary);
    cmd.env_clear()
        .env(handshake::ENV_UNIX_SOCKET_DIR, socket_dir.path())
        .env(handshake::MAGIC_COOKIE_KEY, handshake::MAGIC_COOKIE_VALUE)
        .env(handshake::ENV_PROTOCOL_VERSIONS, "1")
        .env(handshake::ENV_MIN_PORT, "10000")
        .env(handshake::ENV_MAX_PORT, "25000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(v) = multiplex {
        cmd.env("PLUGIN_MULTIPLEX_GRPC", v);
    }
    let mut child = cmd.spawn().expect("start the plugin");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout pipe");
    let read = BufReader::new(stdout).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    read.expect("read the handshake line");
    line.trim_end().to_owned()
}

#[test]
fn drover_plugin_offers_broker_multiplexing_exactly_when_go_plugin_does() {
    let Some(program) = goplugin::program_16() else {
        return;
    };
    let drover_plugin = workspace_bin("drover-skeleton-driver");
    for multiplex in [None, Some("true")] {
        let go = handshake_line(&program, multiplex);
        let ours = handshake_line(&drover_plugin, multiplex);
        let go_fields: Vec<&str> = go.split('|').collect();
        let our_fields: Vec<&str> = ours.split('|').collect();
        match multiplex {
            None => {
                assert!(
                    go_fields.len() == 6,
                    "go-plugin 1.6.3 printed {go:?} without PLUGIN_MULTIPLEX_GRPC"
                );
                assert!(
                    (5..=6).contains(&our_fields.len()),
                    "without PLUGIN_MULTIPLEX_GRPC a Drover plugin must print no 7th field \
                     (go-plugin hosts before 1.6 would read it into the certificate): {ours:?}"
                );
            }
            Some(_) => {
                assert_eq!(go_fields.get(6), Some(&"true"), "go-plugin printed {go:?}");
                assert_eq!(
                    our_fields.len(),
                    7,
                    "with PLUGIN_MULTIPLEX_GRPC=true a Drover plugin must print the 7th field: {ours:?}"
                );
                assert_eq!(our_fields[6], "true", "{ours:?}");
            }
        }
    }
}
