//! Drover's drivers in a real Nomad 1.0.18 agent (issue 23, acceptance 5): the skeleton
//! driver's and rawexec's binaries, unchanged, in a Nomad dev agent's `plugin_dir` load
//! (Nomad runs each with no arguments and its own cookie: `drover-plugin-sdk` then
//! speaks Nomad's driver protocol), fingerprint healthy, and a batch job on rawexec runs
//! to its end with its exit code and its output in Nomad's own logs; a job whose config
//! misspells a key is refused by Nomad, from rawexec's schema, naming the key. The same
//! with rawexec served by the `drover` binary itself (`drover plugin serve rawexec`).
//!
//! The agent is `nomad` from `../shared/nomad/nomad-peers-v1.0.18.tar.xz` (see the README
//! beside it), unpacked into the build tree and checked against its SHA256SUMS by
//! [`drover_test_support::nomad::peers`]. Without the archive the test is skipped
//! loudly; under `CI=true` that is a failure.
//! The agent listens on 127.0.0.1 only, on ports free for this test, with the cloud
//! fingerprinters off.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::nomad_http::NomadApi;
use common::*;
use drover_test_support::{net::free_local_addr, procs, until_blocking};
use serde_json::{Value, json};

/// A Nomad agent of this test: stopped (SIGINT, then SIGKILL) and waited for on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stop the agent by its pid and wait for it; whether it exited within `limit`.
    fn stop(&mut self, limit: Duration) -> bool {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop(Duration::from_secs(10));
        }
    }
}

/// Processes this test left: any whose program is one of the plugin copies in
/// `plugin_dir` (plugins, rawexec's executors), or whose environment has `marker` set
/// to `value` (the agent's children: logmon, executors, tasks).
fn leftovers(plugin_dir: &Path, marker: &str, value: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| procs::alive(pid))
        .filter(|&pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.starts_with(plugin_dir))
                || procs::environ(pid).get(marker).is_some_and(|v| v == value)
        })
        .collect()
}

/// How rawexec is installed in the Nomad agent's plugin_dir.
enum RawExec {
    /// rawexec's own binary, run with no arguments.
    Standalone,
    /// The `drover` binary, which Nomad runs as `drover plugin serve rawexec` (the
    /// arguments of a `plugin "drover"` block).
    DroverBinary,
}

#[test]
fn nomad_agent_loads_drover_drivers_and_runs_a_rawexec_job() {
    run_in_nomad(RawExec::Standalone);
}

#[test]
fn nomad_agent_runs_drover_plugin_serve_rawexec() {
    run_in_nomad(RawExec::DroverBinary);
}

fn run_in_nomad(rawexec: RawExec) {
    let _serial = serial();
    let Some(peers) = drover_test_support::nomad::peers() else {
        return;
    };
    let nomad = peers.nomad();
    let tmp = tempfile::tempdir().unwrap();
    let plugin_dir = tmp.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    // Copies, as an operator installs them; Nomad runs each with no arguments unless a
    // `plugin "<file name>"` block gives some.
    let rawexec_bin = match rawexec {
        RawExec::Standalone => workspace_bin("drover-driver-rawexec"),
        RawExec::DroverBinary => drover(),
    };
    let rawexec_file = match rawexec {
        RawExec::Standalone => "drover-driver-rawexec",
        RawExec::DroverBinary => "drover",
    };
    // raw_exec runs nothing unless enabled (Nomad finds a plugin's block by its file
    // name).
    let plugin_block = match rawexec {
        RawExec::Standalone => {
            "plugin \"drover-driver-rawexec\" {\n  config {\n    enabled = true\n  }\n}\n"
        }
        RawExec::DroverBinary => {
            "plugin \"drover\" {\n  args = [\"plugin\", \"serve\", \"rawexec\"]\n  config {\n    enabled = true\n  }\n}\n"
        }
    };
    crate::common::copy_exec(
        workspace_bin("drover-skeleton-driver"),
        plugin_dir.join("drover-skeleton-driver"),
    );
    crate::common::copy_exec(rawexec_bin, plugin_dir.join(rawexec_file));
    let data_dir = tmp.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let (http, rpc, serf) = (
        free_local_addr().port(),
        free_local_addr().port(),
        free_local_addr().port(),
    );
    let config = tmp.path().join("agent.hcl");
    std::fs::write(
        &config,
        drover_test_support::nomad::loopback_agent_hcl(
            &data_dir,
            [http, rpc, serf],
            &format!("plugin_dir = \"{}\"\n{plugin_block}", plugin_dir.display()),
        ),
    )
    .unwrap();
    let marker = "DROVER_TEST_NOMAD_AGENT";
    let log = tmp.path().join("agent.log");
    let mut agent = Agent {
        child: Command::new(&nomad)
            .args(["agent", "-dev", "-config"])
            .arg(&config)
            .env(marker, tmp.path())
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(tmp.path().join("agent.stderr")).unwrap())
            .spawn()
            .expect("start nomad agent"),
        log,
    };
    let api = NomadApi::new(http);

    // The node, with both drivers detected and healthy.
    let mut node = Value::Null;
    let mut last_drivers = Value::Null;
    let ready = |node: &mut Value, last: &mut Value| -> bool {
        let Some(nodes) = api.get_json("/v1/nodes") else {
            return false;
        };
        let Some(id) = nodes[0]["ID"].as_str() else {
            return false;
        };
        let Some(n) = api.get_json(&format!("/v1/node/{id}")) else {
            return false;
        };
        *last = n["Drivers"].clone();
        let healthy = |name: &str| {
            n["Drivers"][name]["Detected"] == true && n["Drivers"][name]["Healthy"] == true
        };
        let ok = healthy("raw_exec") && healthy("skeleton") && n["Status"] == "ready";
        *node = n;
        ok
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(&mut node, &mut last_drivers) {
        assert!(
            Instant::now() < deadline,
            "Nomad's node did not report drivers raw_exec and skeleton healthy within 60 s; \
             drivers: {last_drivers:#}\nagent log:\n{}",
            agent.log()
        );
        assert!(
            matches!(agent.child.try_wait(), Ok(None)),
            "the Nomad agent exited:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let drivers = &node["Drivers"];
    assert_eq!(
        drivers["raw_exec"]["HealthDescription"], "ready",
        "{drivers:#}"
    );
    assert_eq!(
        drivers["raw_exec"]["Attributes"]["driver.raw_exec.version"],
        env!("CARGO_PKG_VERSION"),
        "raw_exec's fingerprint attributes reach Nomad's node: {drivers:#}"
    );

    // A batch job on Drover's rawexec.
    let job_id = "drover-rawexec-in-nomad";
    let job = json!({"Job": {
        "ID": job_id, "Name": job_id, "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g", "Count": 1,
            "RestartPolicy": {"Attempts": 0, "Mode": "fail"},
            "ReschedulePolicy": {"Attempts": 0, "Unlimited": false},
            "Tasks": [{
                "Name": "hello", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", "echo hello-from-drover; exit 3"]},
                "Resources": {"CPU": 100, "MemoryMB": 64},
                "LogConfig": {"MaxFiles": 2, "MaxFileSizeMB": 1}
            }]
        }]
    }});
    let (status, body) = api
        .call(http::Method::POST, "/v1/jobs", Some(&job))
        .expect("Nomad answers the job registration");
    assert_eq!(status, 200, "registering the job: {body}");

    // Its allocation's task ends dead, with exit code 3 in its events.
    let mut alloc = Value::Null;
    let finished = |alloc: &mut Value| -> bool {
        let Some(allocs) = api.get_json(&format!("/v1/job/{job_id}/allocations")) else {
            return false;
        };
        let Some(id) = allocs[0]["ID"].as_str() else {
            return false;
        };
        let Some(a) = api.get_json(&format!("/v1/allocation/{id}")) else {
            return false;
        };
        *alloc = a;
        alloc["TaskStates"]["hello"]["State"] == "dead"
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !finished(&mut alloc) {
        assert!(
            Instant::now() < deadline,
            "the task did not end within 60 s: {:#}\nagent log:\n{}",
            alloc["TaskStates"],
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let state = &alloc["TaskStates"]["hello"];
    assert_eq!(
        state["Failed"], true,
        "exit code 3 fails the task: {state:#}"
    );
    let events = state["Events"].as_array().cloned().unwrap_or_default();
    let terminated = events
        .iter()
        .find(|e| e["Type"] == "Terminated")
        .unwrap_or_else(|| panic!("no Terminated event: {state:#}"));
    assert_eq!(terminated["ExitCode"], 3, "{terminated:#}");
    assert_eq!(terminated["Details"]["exit_code"], "3", "{terminated:#}");

    // Its stdout, through Nomad's own log reader (logmon) and HTTP API.
    let alloc_id = alloc["ID"].as_str().unwrap().to_owned();
    let path = format!("/v1/client/fs/logs/{alloc_id}?task=hello&type=stdout&plain=true");
    let mut stdout = String::new();
    until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "the task's stdout in Nomad's logs",
        || {
            if let Some((200, body)) = api.call(http::Method::GET, &path, None) {
                stdout = body;
            }
            stdout == "hello-from-drover\n"
        },
    );

    // A misspelt key is refused by Nomad itself, from the hclspec rawexec's JSON Schema
    // became, naming the key, before anything starts.
    let bad_id = "drover-rawexec-bad-config";
    let mut bad = job.clone();
    bad["Job"]["ID"] = json!(bad_id);
    bad["Job"]["Name"] = json!(bad_id);
    bad["Job"]["TaskGroups"][0]["Tasks"][0]["Config"] =
        json!({"comand": "/bin/sh", "args": ["-c", "echo must-not-run"]});
    let (status, body) = api
        .call(http::Method::POST, "/v1/jobs", Some(&bad))
        .expect("Nomad answers the job registration");
    assert_eq!(status, 200, "registering the job: {body}");
    let mut bad_state = Value::Null;
    until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the misconfigured task to fail",
        || {
            let Some(allocs) = api.get_json(&format!("/v1/job/{bad_id}/allocations")) else {
                return false;
            };
            bad_state = allocs[0]["TaskStates"]["hello"].clone();
            bad_state["State"] == "dead"
        },
    );
    let validation = bad_state["Events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["Type"] == "Failed Validation")
        .unwrap_or_else(|| panic!("no Failed Validation event: {bad_state:#}"));
    let why = validation["DisplayMessage"].as_str().unwrap_or_default();
    assert!(
        why.contains("\"comand\""),
        "the message names the key: {why}"
    );
    assert!(
        !bad_state["Events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["Type"] == "Started"),
        "nothing started: {bad_state:#}"
    );

    // Stop the agent by its pid; nothing of this test may be left running.
    assert!(
        agent.stop(Duration::from_secs(30)),
        "the Nomad agent did not exit within 30 s of SIGINT:\n{}",
        agent.log()
    );
    let marker_value = tmp.path().display().to_string();
    let settled = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left = leftovers(&plugin_dir, marker, &marker_value);
        if left.is_empty() || Instant::now() >= settled {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for pid in &left {
        if let Ok(p) = i32::try_from(*pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    assert!(
        left.is_empty(),
        "processes left running after the agent stopped: {left:?}"
    );
}
