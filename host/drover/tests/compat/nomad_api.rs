//! Nomad's HTTP API on a Drover dev agent (issue 24): a real client of Nomad's API,
//! python-nomad (PyPI, pinned by scripts/test.sh), drives it unchanged (acceptance 1);
//! blocking queries return as soon as what they watch changes, with `X-Nomad-Index`
//! moved on, and the event stream delivers a job's registration and its allocations'
//! updates in order (acceptance 4).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{free_port, pids_running, tail, wait_dev_node_ready};
use common::nomad_http::NomadApi;
use serde_json::{Value, json};

/// A dev agent whose server answers Nomad's API on 127.0.0.1:`port`; its token.
fn dev_agent(root: &Path) -> (Agent, u16, String) {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(root, &plugins, &["--dev", "--dev-http-addr", &addr]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    let token_file = agent.data_dir.join("server/dev-token");
    let token = std::fs::read_to_string(&token_file)
        .unwrap_or_else(|e| panic!("the dev token {}: {e}", token_file.display()));
    (agent, port, token.trim().to_owned())
}

/// Processes whose argv is `sleep <marker>`: the tasks of this test.
fn sleepers(marker: &str) -> Vec<u32> {
    pids_running(&["sleep", marker])
}

/// Acceptance 1: python-nomad, unchanged, against the dev agent.
#[test]
fn python_nomad_drives_a_dev_agent() {
    let Some(python) = drover_test_support::nomad::python_nomad() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (agent, port, token) = dev_agent(root.path());
    // A sleep length no other test uses: how the task processes are found.
    let marker = format!("{}", 100_000 + std::process::id() % 100_000);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/python/nomad_client.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args([&port.to_string(), &token, "pyjob", &marker])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python-nomad against the dev agent failed:\n{stdout}\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&agent.log_text())
    );
    assert!(stdout.lines().any(|l| l == "framed logs ok"), "{stdout}");
    assert!(stdout.lines().last() == Some("stopped"), "{stdout}");
    // Stopped means the processes are gone, not only reported so.
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(50),
        "no task process left",
        || sleepers(&marker).is_empty(),
    );
}

fn raw_exec_job(id: &str, count: u32, marker: &str) -> Value {
    json!({"Job": {
        "ID": id,
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": count,
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", format!("exec sleep {marker}")]},
                "Resources": {"CPU": 50, "MemoryMB": 32}
            }]
        }]
    }})
}

/// Acceptance 4: a blocking query returns as soon as an allocation changes, with the
/// index moved on; the event stream delivers the job's registration, then its
/// allocation's updates, in index order.
#[test]
fn blocking_queries_and_the_event_stream_follow_a_job() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, token) = dev_agent(root.path());
    let api = NomadApi::new(port).with_token(&token);
    let marker = format!("{}", 200_000 + std::process::id() % 100_000);

    // Without the token: refused, as Nomad refuses a bad token.
    let anonymous = NomadApi::new(port)
        .answer(http::Method::GET, "/v1/jobs", None, Duration::from_secs(10))
        .expect("an answer");
    assert_eq!(anonymous.status, 403, "{anonymous:?}");

    let start = api
        .answer(http::Method::GET, "/v1/jobs", None, Duration::from_secs(10))
        .expect("an answer");
    assert_eq!(start.status, 200, "{start:?}");
    let start_index = start.index.expect("X-Nomad-Index on /v1/jobs");

    // The event stream from now on, read on a thread of its own while the job runs.
    let events = {
        let api = NomadApi::new(port).with_token(&token);
        std::thread::spawn(move || {
            api.read_lines(
                &format!(
                    "/v1/event/stream?index={start_index}&topic=Job:blocky&topic=Allocation:*"
                ),
                Duration::from_secs(60),
                |lines| {
                    lines
                        .iter()
                        .flat_map(|l| l["Events"].as_array().cloned().unwrap_or_default())
                        .any(|e| {
                            e["Topic"] == "Allocation"
                                && e["Payload"]["Allocation"]["ClientStatus"] == "running"
                                && e["Payload"]["Allocation"]["JobID"] == "blocky"
                        })
                },
            )
        })
    };

    let registered = api
        .answer(
            http::Method::PUT,
            "/v1/jobs",
            Some(&raw_exec_job("blocky", 1, &marker)),
            Duration::from_secs(10),
        )
        .expect("an answer");
    assert_eq!(registered.status, 200, "{registered:?}");

    // Poll until the allocation exists, then block on its change to running.
    let (alloc_index, allocs) = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let a = api
                .answer(
                    http::Method::GET,
                    "/v1/job/blocky/allocations",
                    None,
                    Duration::from_secs(10),
                )
                .expect("an answer");
            let v = a.json("allocations");
            if v.as_array().is_some_and(|l| !l.is_empty()) {
                break (a.index.expect("X-Nomad-Index"), v);
            }
            assert!(
                Instant::now() < deadline,
                "no allocation: {v}\n{}",
                tail(&agent.log_text())
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    if allocs[0]["ClientStatus"] != "running" {
        let asked = Instant::now();
        let blocked = api
            .answer(
                http::Method::GET,
                &format!("/v1/job/blocky/allocations?index={alloc_index}&wait=5s"),
                None,
                Duration::from_secs(10),
            )
            .expect("an answer");
        let waited = asked.elapsed();
        assert_eq!(blocked.status, 200, "{blocked:?}");
        let moved = blocked.index.expect("X-Nomad-Index");
        assert!(
            moved > alloc_index,
            "the index did not move on: {moved} after {alloc_index}"
        );
        assert!(
            waited < Duration::from_secs(5),
            "the blocking query waited its whole wait ({waited:?}) though the allocation changed"
        );
    }
    // A query at an index nothing has reached yet waits its whole wait, then answers
    // with the state as it is.
    let now = api
        .answer(
            http::Method::GET,
            "/v1/job/blocky",
            None,
            Duration::from_secs(10),
        )
        .expect("an answer");
    let asked = Instant::now();
    let idle = api
        .answer(
            http::Method::GET,
            &format!(
                "/v1/job/blocky?index={}&wait=1s",
                now.index.unwrap() + 1_000_000
            ),
            None,
            Duration::from_secs(10),
        )
        .expect("an answer");
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "a blocking query came back before its wait with nothing new"
    );
    assert_eq!(idle.status, 200);
    assert_eq!(idle.json("the job")["ID"], "blocky");

    let lines = events.join().expect("the event stream reader");
    let events: Vec<Value> = lines
        .iter()
        .flat_map(|l| l["Events"].as_array().cloned().unwrap_or_default())
        .collect();
    let registered_at = events
        .iter()
        .position(|e| e["Topic"] == "Job" && e["Key"] == "blocky" && e["Type"] == "JobRegistered")
        .unwrap_or_else(|| panic!("no JobRegistered event for blocky in {events:#?}"));
    let running_at = events
        .iter()
        .position(|e| {
            e["Topic"] == "Allocation" && e["Payload"]["Allocation"]["ClientStatus"] == "running"
        })
        .unwrap_or_else(|| panic!("no running allocation event in {events:#?}"));
    assert!(
        registered_at < running_at,
        "the allocation ran before its job was registered: {events:#?}"
    );
    let indexes: Vec<u64> = events.iter().filter_map(|e| e["Index"].as_u64()).collect();
    assert!(
        indexes.windows(2).all(|w| w[0] <= w[1]),
        "events out of index order: {indexes:?}"
    );

    let stopped = api
        .answer(
            http::Method::DELETE,
            "/v1/job/blocky?purge=true",
            None,
            Duration::from_secs(10),
        )
        .expect("an answer");
    assert_eq!(stopped.status, 200, "{stopped:?}");
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(50),
        "no task process left",
        || sleepers(&marker).is_empty(),
    );
}
