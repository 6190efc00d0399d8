//! Driver libraries that must not load, and one that panics inside a call: each is
//! refused or contained with a reason an operator can read, and the agent keeps
//! serving (its API, its other plugins, the library that panicked).

use crate::common;

use common::inproc::{
    InProcessRig, built_library, gcc_library, healthy, row_at, started, task_run,
};

/// A shared library that is not a Drover driver library: no entry symbol.
const NO_ENTRY: &str = "int not_a_drover_driver(void) { return 42; }\n";

/// A library that exports the entry symbol, but whose table says ABI version 99. The
/// host must read the version and nothing else.
const OTHER_ABI: &str = r#"
#include <stdint.h>
struct entry_v99 { uint32_t abi_version; uint32_t size; };
static const struct entry_v99 ENTRY = { 99, sizeof(struct entry_v99) };
const struct entry_v99 *drover_plugin_entry_v1(void) { return &ENTRY; }
"#;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn reason(row: &serde_json::Value) -> &str {
    row["reason"].as_str().unwrap_or_default()
}

#[test]
fn broken_libraries_are_refused_with_reasons_and_a_panic_stays_in_its_call() {
    let Some(fixture) = built_library("drover-fixture-library") else {
        return;
    };
    let rig = InProcessRig::new(
        r#"
[plugin.noentry]
in_process = true
[plugin.otherabi]
in_process = true
[plugin.worldw]
in_process = true
[plugin.fixture-library]
in_process = true
"#,
    );
    let build = rig.root.path().join("build");
    std::fs::create_dir(&build).unwrap();
    let (Some(no_entry), Some(other_abi)) = (
        gcc_library(&build, "noentry.so", NO_ENTRY),
        gcc_library(&build, "otherabi.so", OTHER_ABI),
    ) else {
        return;
    };
    let no_entry = rig.install(&no_entry, "noentry.so", 0o644);
    let other_abi = rig.install(&other_abi, "otherabi.so", 0o644);
    let world_writable = rig.install(&fixture, "worldw.so", 0o666);
    // A driver library the config does not allow in process.
    let not_allowed = rig.install(&fixture, "notallowed.so", 0o644);
    let good = rig.install(&fixture, "fixture-library.so", 0o644);
    let agent = rig.start();

    let expected = [&no_entry, &other_abi, &world_writable, &not_allowed, &good];
    let rows = agent.wait_plugins(std::time::Duration::from_secs(30), |rows| {
        let seen = |p: &std::path::Path| {
            rows.iter()
                .any(|r| r["path"] == p.display().to_string().as_str())
        };
        expected.iter().all(|p| seen(p))
            && rows
                .iter()
                .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
            && rows
                .iter()
                .any(|r| r["name"] == "fixture-library" && r["state"] == "healthy")
    });
    let skipped = |path: &std::path::Path, needle: &str| {
        let r = row_at(&rows, path);
        assert_eq!(r["state"], "skipped", "{r:#}");
        assert!(reason(r).contains(needle), "{needle:?} not in {r:#}");
        assert_eq!(r["in_process"], false, "{r:#}");
    };
    skipped(
        &no_entry,
        "exports no `drover_plugin_entry_v1`: it is not a Drover driver library",
    );
    skipped(
        &other_abi,
        "speaks in-process ABI version 99; this host speaks 1",
    );
    skipped(&world_writable, "is world-writable (mode 0666)");
    skipped(
        &not_allowed,
        "is a driver library, and a library is loaded into the agent only when its config \
         allows it",
    );
    skipped(
        &not_allowed,
        "add `in_process = true` under [plugin.notallowed]",
    );
    let served = row_at(&rows, &good);
    assert_eq!(served["name"], "fixture-library");
    assert_eq!(served["state"], "healthy", "{served:#}");
    assert_eq!(served["in_process"], true, "{served:#}");
    assert!(served["pid"].is_null(), "{served:#}");

    // A panic inside StartTask fails that call with the panic's message ...
    let out = task_run(
        &agent,
        "fixture-library",
        r#"{"panic_in_start": "fixture panic 42"}"#,
    );
    assert!(!out.status.success(), "a panicking start succeeded");
    let err = stderr(&out);
    assert!(
        err.contains("driver panicked in StartTask: fixture panic 42"),
        "{err}\nagent log:\n{}",
        agent.log_text()
    );
    // ... and the agent, the library and the other plugins go on serving.
    let task = started(&agent, "fixture-library", "{}");
    let id = task["id"].as_str().unwrap();
    assert_eq!(task["state"], "running", "{task:#}");
    let stopped = agent.cli_json(&["task", "stop", id, "--json"]);
    assert_eq!(stopped["state"], "dead", "{stopped:#}");
    let task = started(
        &agent,
        "rawexec",
        r#"{"command": "/bin/sh", "args": ["-c", "exit 3"]}"#,
    );
    let out = agent.cli(&["task", "wait", task["id"].as_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let rows = agent.cli_json(&["plugin", "status", "--json"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(row_at(rows, &good)["state"], "healthy", "{rows:#?}");
}

#[test]
fn a_library_whose_bytes_miss_their_pin_is_not_loaded() {
    let Some(fixture) = built_library("drover-fixture-library") else {
        return;
    };
    let pin = "0".repeat(64);
    let rig = InProcessRig::new(&format!(
        "[plugin.fixture-library]\nin_process = true\nsha256 = \"{pin}\"\n"
    ));
    let library = rig.install(&fixture, "libfixture-library.so", 0o644);
    let agent = rig.start();
    // The built-in rawexec loads as usual; the refused library has its row by then.
    healthy(&agent, "raw_exec");
    let rows = agent.wait_plugins(std::time::Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["path"] == library.display().to_string().as_str())
    });
    let row = row_at(&rows, &library);
    assert_eq!(row["state"], "skipped", "{row:#}");
    assert!(
        reason(row).contains(&format!(
            "but [plugin.fixture-library] sha256 pins {pin}; not loaded"
        )),
        "{row:#}"
    );
    // Nothing of it runs: a task for it finds no such driver.
    let out = task_run(&agent, "fixture-library", "{}");
    assert!(!out.status.success(), "a task ran on a refused library");
}

/// A library cut short (an interrupted copy, a full disk) used to reach `dlopen`, whose
/// first touch of a page past the end of the file killed the agent with `SIGBUS`, at
/// every start. It is refused on its ELF image, and the agent serves on.
#[test]
fn a_truncated_library_is_refused_and_the_agent_keeps_serving() {
    let Some(fixture) = built_library("drover-fixture-library") else {
        return;
    };
    let rig = InProcessRig::new(
        r#"
[plugin.truncated]
in_process = true
[plugin.fixture-library]
in_process = true
"#,
    );
    let bytes = std::fs::read(&fixture).unwrap();
    let build = rig.root.path().join("build");
    std::fs::create_dir(&build).unwrap();
    std::fs::write(build.join("truncated.so"), &bytes[..bytes.len() / 2]).unwrap();
    let truncated = rig.install(&build.join("truncated.so"), "truncated.so", 0o644);
    let good = rig.install(&fixture, "fixture-library.so", 0o644);
    let agent = rig.start();
    let rows = agent.wait_plugins(std::time::Duration::from_secs(30), |rows| {
        rows.iter()
            .any(|r| r["path"] == truncated.display().to_string().as_str())
            && rows
                .iter()
                .any(|r| r["name"] == "fixture-library" && r["state"] == "healthy")
    });
    let r = row_at(&rows, &truncated);
    assert_eq!(r["state"], "skipped", "{r:#}");
    assert!(
        reason(r).contains("past the end of the file")
            && reason(r).contains("the file is truncated or still being written"),
        "{r:#}"
    );
    // The agent is alive and serves: the library next to it, and the built-ins.
    let task = started(
        &agent,
        "rawexec",
        r#"{"command": "/bin/sh", "args": ["-c", "exit 4"]}"#,
    );
    let out = agent.cli(&["task", "wait", task["id"].as_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(row_at(&rows, &good)["state"], "healthy", "{rows:#?}");
    // Nothing it loads resolves a path against the directory it was started in.
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", agent.child.id())).unwrap();
    assert_eq!(cwd, std::path::Path::new("/"));
}
