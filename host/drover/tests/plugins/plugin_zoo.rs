//! A plugin_dir full of good and bad binaries: good ones load, bad ones are skipped
//! with a reason a person understands, nothing is left running, the agent serves on.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use common::*;

/// Long enough that a good plugin is never cut off on a loaded machine; two plugins
/// that never answer prove by the load time that fingerprints run concurrently.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn zoo_of_plugins_loads_good_skips_bad_and_leaves_nothing_behind() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fixture = workspace_bin("drover-fixture-plugin");

    // Good plugins, copied in as an operator would.
    crate::common::copy_exec(
        workspace_bin("drover-skeleton-driver"),
        dir.join("skeleton"),
    );
    crate::common::copy_exec(
        workspace_bin("drover-driver-rawexec"),
        dir.join("rawexec-external"),
    );
    let wrap = |name: &str, env: &str| {
        write_exec(
            &dir.join(name),
            &format!("#!/bin/sh\n{env} exec {} \"$@\"\n", fixture.display()),
            0o755,
        );
    };
    // Same name twice: the higher plugin_version must serve.
    wrap("dup-old", "FIXTURE_NAME=dup FIXTURE_VERSION=0.1.0");
    wrap("dup-new", "FIXTURE_NAME=dup FIXTURE_VERSION=0.10.0");
    // Bad plugins.
    write_exec(&dir.join("not-executable"), "#!/bin/sh\nexit 0\n", 0o644);
    write_exec(&dir.join("world-writable"), "#!/bin/sh\nexit 0\n", 0o777);
    // chmod after write: umask may have masked the world bit.
    std::fs::set_permissions(
        dir.join("world-writable"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    write_exec(
        &dir.join("garbage"),
        "#!/bin/sh\necho 'hello, I am a shell script'\nsleep 100\n",
        0o755,
    );
    for name in ["silent-hang", "silent-hang-2"] {
        write_exec(&dir.join(name), "#!/bin/sh\nsleep 1000 &\nwait\n", 0o755);
    }
    write_exec(
        &dir.join("exit3"),
        "#!/bin/sh\necho 'cannot open /etc/foo.conf' >&2\nexit 3\n",
        0o755,
    );
    write_exec(
        &dir.join("wrong-core"),
        "#!/bin/sh\necho '2|1|unix|/tmp/x.sock|grpc'\nsleep 100\n",
        0o755,
    );
    write_exec(
        &dir.join("no-socket"),
        "#!/bin/sh\necho '1|1|unix|/nonexistent/drover-zoo.sock|grpc'\nsleep 100\n",
        0o755,
    );
    wrap(
        "incompatible-api",
        "FIXTURE_NAME=futuristic FIXTURE_API_VERSIONS=2.0.0,3.1.0",
    );
    wrap("other-app", "FIXTURE_MODE=goplugin-only");
    wrap("mute", "FIXTURE_MODE=mute-after-handshake");

    let agent = Agent::start(
        root.path(),
        &dir,
        &[
            "--handshake-timeout",
            &format!("{}ms", HANDSHAKE_TIMEOUT.as_millis()),
        ],
    );
    // 12 binaries in plugin_dir + the built-ins rawexec, exec and java; the dup loser
    // and the superseded built-in also get rows.
    let settled = |rows: &[serde_json::Value]| {
        rows.len() >= 16 && rows.iter().all(|r| r["state"] != "unhealthy")
    };
    let rows = agent.wait_plugins(Duration::from_secs(30), settled);
    let elapsed = agent.started.elapsed();
    eprintln!(
        "zoo: {} plugin rows settled {elapsed:?} after the agent started",
        rows.len()
    );
    // The acceptance bound: under the handshake timeout plus two seconds (the mute
    // plugin's identity RPCs get the timeout once it is launched, which takes a
    // moment of its own). One after the other, the two silent plugins and the mute one
    // would take three times the timeout.
    assert!(
        elapsed < HANDSHAKE_TIMEOUT + Duration::from_secs(2),
        "loading took {elapsed:?}; fingerprints must run concurrently (timeout {HANDSHAKE_TIMEOUT:?})"
    );

    let by_path = |file: &str| {
        rows.iter()
            .find(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("/{file}")))
            })
            .unwrap_or_else(|| panic!("no row for {file}: {rows:#?}"))
            .clone()
    };
    let expect_skipped = |file: &str, words: &[&str]| {
        let r = by_path(file);
        assert_eq!(r["state"], "skipped", "{file}: {r:#?}");
        let reason = r["reason"].as_str().unwrap_or_default();
        for w in words {
            assert!(reason.contains(w), "{file}: reason {reason:?} lacks {w:?}");
        }
        assert!(
            r["pid"].is_null(),
            "{file}: skipped plugin has a pid: {r:#?}"
        );
    };

    // Good plugins are healthy, with identity filled in.
    // The isolating built-ins (exec, java) are healthy only with root and a JVM, qemu
    // only where qemu is installed; they have their own tests (exec_agent.rs,
    // qemu*.rs).
    let healthy: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["state"] == "healthy")
        .filter(|r| !matches!(r["name"].as_str(), Some("exec" | "java" | "qemu")))
        .collect();
    let names: BTreeSet<&str> = healthy.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["dup", "raw_exec", "skeleton"]),
        "{rows:#?}"
    );
    for r in &healthy {
        assert_eq!(r["type"], "driver");
        assert_eq!(r["api_version"], "1.0.0");
        assert!(r["pid"].as_u64().is_some(), "{r:#?}");
    }
    let skeleton = by_path("skeleton");
    assert_eq!(skeleton["source"], "external");
    // External plugins win over built-ins of the same name.
    let rawexec = by_path("rawexec-external");
    assert_eq!(rawexec["state"], "healthy");
    let builtin = rows
        .iter()
        .find(|r| r["source"] == "builtin" && r["name"] == "raw_exec")
        .expect("builtin rawexec row");
    assert_eq!(builtin["state"], "skipped");
    assert!(
        builtin["reason"]
            .as_str()
            .unwrap()
            .contains("rawexec-external"),
        "{builtin:#?}"
    );
    // Highest plugin_version wins.
    assert_eq!(by_path("dup-new")["state"], "healthy");
    assert_eq!(by_path("dup-new")["version"], "0.10.0");
    expect_skipped("dup-old", &["dup-new", "0.10.0"]);

    expect_skipped("not-executable", &["not executable", "0644"]);
    expect_skipped("world-writable", &["world-writable"]);
    expect_skipped("garbage", &["bad handshake", "hello, I am a shell script"]);
    expect_skipped("silent-hang", &["no handshake line within"]);
    expect_skipped("silent-hang-2", &["no handshake line within"]);
    expect_skipped("exit3", &["exit code 3", "cannot open /etc/foo.conf"]);
    expect_skipped("wrong-core", &["core protocol 2"]);
    expect_skipped("no-socket", &["/nonexistent/drover-zoo.sock", "connect"]);
    expect_skipped(
        "incompatible-api",
        &["incompatible plugin API version", "2.0.0, 3.1.0", "^1.0.0"],
    );
    expect_skipped("other-app", &["does not serve drover.plugin.v1"]);
    // A launch makes no RPC of its own: the identity RPCs find the plugin mute, within
    // the same bound, and it is killed (checked below with the others).
    expect_skipped("mute", &["did not answer its identity RPCs within"]);

    // Nothing is left behind: the only processes carrying the agent's marker are the
    // healthy plugins.
    agent.assert_only_healthy_plugins_run(&rows);

    // The agent keeps serving: run a task on the third-party skeleton driver.
    let task = agent.cli_json(&[
        "task",
        "run",
        "--driver",
        "skeleton",
        "--config",
        r#"{"run_for_ms": 50, "exit_code": 4}"#,
        "--json",
    ]);
    let id = task["id"].as_str().unwrap().to_owned();
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Every plugin was logged, once each.
    let log = agent.log_text();
    for file in [
        "garbage",
        "silent-hang",
        "exit3",
        "wrong-core",
        "no-socket",
        "other-app",
        "mute",
        "not-executable",
    ] {
        assert!(
            log.contains(file),
            "agent log does not mention {file}:\n{log}"
        );
    }
    assert!(log.contains("plugin loaded"), "{log}");
}

#[test]
fn crashed_plugin_is_relaunched() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    let agent = Agent::start(root.path(), &dir, &[]);
    let healthy_rawexec = |rows: &[serde_json::Value]| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    };
    let rows = agent.wait_plugins(Duration::from_secs(10), healthy_rawexec);
    let old_pid = row(&rows, "raw_exec")["pid"].as_u64().unwrap() as u32;
    nix_kill(old_pid, 9).unwrap();
    let rows = agent.wait_plugins(Duration::from_secs(10), |rows| {
        rows.iter().any(|r| {
            r["name"] == "raw_exec"
                && r["state"] == "healthy"
                && r["pid"].as_u64().is_some_and(|p| p as u32 != old_pid)
        })
    });
    let new_pid = row(&rows, "raw_exec")["pid"].as_u64().unwrap();
    assert_ne!(new_pid as u32, old_pid);
    assert!(
        agent.log_text().contains("plugin relaunched"),
        "{}",
        agent.log_text()
    );
}

#[test]
fn operator_settings_allow_deny_pin_and_config_are_enforced() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    let skeleton = workspace_bin("drover-skeleton-driver");
    crate::common::copy_exec(&skeleton, dir.join("skeleton"));
    let fixture = workspace_bin("drover-fixture-plugin");
    let wrap = |name: &str, env: &str| {
        write_exec(
            &dir.join(name),
            &format!("#!/bin/sh\n{env} exec {} \"$@\"\n", fixture.display()),
            0o755,
        );
    };
    wrap("denied", "FIXTURE_NAME=denied");
    wrap("pinned", "FIXTURE_NAME=pinned");
    wrap("configured", "FIXTURE_NAME=configured");
    wrap("unpinned", "FIXTURE_NAME=unpinned");
    // Once any pin is set, every external binary needs one: pin the good ones.
    let sha = |p: &std::path::Path| drover_host::plugins::trust::sha256_file(p).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "plugin_deny = [\"denied\"]\n\
             [plugin.pinned]\nsha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\n\
             [plugin.skeleton]\nsha256 = \"{}\"\n\
             [plugin.configured]\nsha256 = \"{}\"\nconfig = {{ colour = \"blue\" }}\n",
            sha(&skeleton),
            sha(&dir.join("configured")),
        ),
    )
    .unwrap();
    let agent = Agent::start(root.path(), &dir, &["--config", config.to_str().unwrap()]);
    let rows = agent.wait_plugins(Duration::from_secs(15), |rows| {
        rows.len() >= 6 && rows.iter().all(|r| r["state"] != "unhealthy")
    });
    let reason = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no row {name}: {rows:#?}"))["reason"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(reason("denied").contains("plugin_deny"), "{rows:#?}");
    assert!(reason("pinned").contains("sha256"), "{rows:#?}");
    assert!(reason("unpinned").contains("not pinned"), "{rows:#?}");
    let r = reason("configured");
    assert!(
        r.contains("[plugin.configured]") && r.contains("colour"),
        "{r}"
    );
    assert_eq!(row(&rows, "skeleton")["state"], "healthy");
    assert_eq!(row(&rows, "raw_exec")["state"], "healthy");
    agent.assert_only_healthy_plugins_run(&rows);

    // A plugin's stderr is the agent's log feed: lines show up under the plugin's name.
    let log = agent.log_text();
    assert!(log.contains("plugin loaded"), "{log}");
}

#[test]
fn plugin_stderr_is_forwarded_into_the_agent_log() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    write_exec(
        &dir.join("chatty"),
        "#!/bin/sh\n\
         echo '{\"@level\":\"warn\",\"@message\":\"disk nearly full\",\"@module\":\"chatty\",\"free_mb\":12}' >&2\n\
         echo 'plain text line' >&2\n\
         exit 5\n",
        0o755,
    );
    let agent = Agent::start(root.path(), &dir, &[]);
    agent.wait_plugins(Duration::from_secs(10), |rows| {
        rows.iter().any(|r| r["name"] == "chatty") && rows.iter().any(|r| r["state"] == "healthy")
    });
    // The log file is written by the agent's logger a moment after the row exists.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = agent.log_text();
        if (log.contains("disk nearly full") && log.contains("plain text line"))
            || std::time::Instant::now() >= deadline
        {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let line = log
        .lines()
        .find(|l| l.contains("disk nearly full"))
        .unwrap_or_else(|| panic!("plugin JSON log line not forwarded:\n{log}"));
    assert!(
        line.contains("WARN") && line.contains("chatty") && line.contains("free_mb"),
        "{line}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("plain text line") && l.contains("chatty")),
        "{log}"
    );
}
