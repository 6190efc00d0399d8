//! The qemu driver end to end, as a user drives it: the real `drover agent`, the
//! `drover` CLI, and the VM rig's guest (`scripts/vm-rig.sh`: a Debian cloud kernel and
//! a busybox initramfs, booted directly on a q35 machine under TCG). The guest takes
//! its orders from its kernel command line (`drover.tick=1`, `drover.acpid=0`,
//! `drover.net=1 drover.serve=PORT`).
//!
//! Without the rig or qemu every test says `SKIPPED` (and fails under `CI=true`).
//! The tests hold `serial()`: each boots a VM under TCG, and two at once on a shared
//! two-core machine only make both slow.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::qemu::*;
use common::{Agent, nix_kill, serial};
use drover_test_support::vm::{self, GUEST_STARTED};
use serde_json::{Value, json};

/// What the guest's acpid prints when the power button is pressed.
const POWERING_OFF: &str = "drover-guest: power button pressed, powering off";

/// The plugin config of these tests: images (the rig's kernel and initrd) come from
/// the rig's directory; port forwards may listen on 127.0.0.2 as well as the default
/// 127.0.0.1 (the forward test's `host_ip`).
fn plugin_config(rig: &vm::Rig) -> Value {
    json!({
        "image_paths": [rig_dir(rig)],
        "port_forward_host_ips": ["127.0.0.1", "127.0.0.2"],
    })
}

/// What the task's view says of how it ended: its error and its events' messages.
fn ending(task: &Value) -> String {
    let mut words = vec![task["error"].as_str().unwrap_or_default().to_owned()];
    for e in task["events"].as_array().into_iter().flatten() {
        words.push(format!(
            "{}: {}",
            e["type"].as_str().unwrap_or_default(),
            e["message"].as_str().unwrap_or_default()
        ));
    }
    words.join("\n")
}

/// `drover task stop ID --json [--timeout T]`: the task as it ended, and how long the
/// stop took.
fn stop(agent: &Agent, id: &str, timeout: Option<&str>) -> (Value, Duration) {
    let mut args = vec!["task", "stop", id, "--json"];
    if let Some(t) = timeout {
        args.extend(["--timeout", t]);
    }
    let t = Instant::now();
    let stopped = agent.cli_json(&args);
    (stopped, t.elapsed())
}

/// What docs/qemu.md's security model promises of a running VM, as `/proc` and the
/// file system show it: qemu runs under its own seccomp filter and, started by root,
/// no longer as root; its QMP socket (the task's `qmp_socket` attribute) is not in the
/// task directory but in a directory only its owner (root, here) can enter.
fn confined(vm_pid: u32, task: &Value) {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let status = std::fs::read_to_string(format!("/proc/{vm_pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(
        field("Seccomp:"),
        ["2"],
        "qemu runs without its seccomp filter"
    );
    let root = rustix::process::geteuid().is_root();
    if root {
        let uids = field("Uid:");
        assert!(
            uids.len() == 4 && uids.iter().all(|u| u != "0"),
            "qemu started by root still has uid 0 among real, effective, saved, fs: {uids:?}"
        );
    }
    let qmp = PathBuf::from(
        task["attributes"]["qmp_socket"]
            .as_str()
            .unwrap_or_else(|| panic!("no qmp_socket attribute: {task:#}")),
    );
    let task_dir = PathBuf::from(task["task_dir"].as_str().expect("task_dir"));
    assert!(
        !qmp.starts_with(&task_dir),
        "the QMP socket {} is in the task directory",
        qmp.display()
    );
    let dir = std::fs::metadata(qmp.parent().expect("the socket's directory"))
        .expect("the QMP socket's directory");
    assert_eq!(
        dir.permissions().mode() & 0o777,
        0o700,
        "the QMP socket's directory is open to others"
    );
    if root {
        assert_eq!(dir.uid(), 0, "the QMP socket's directory is not root's");
    }
}

/// One test's world: an agent on fresh dirs whose qemu plugin takes images from the
/// rig's directory (and destroys its tasks when dropped), and a watch over the qemu
/// processes of the test's own marker. Fields drop in order: the agent, then the
/// watch (which kills any VM left), then the dirs.
struct World {
    agent: Agent,
    watch: QemuWatch,
    marker: String,
    rig: vm::Rig,
    _root: tempfile::TempDir,
}

/// The [`World`] of a test named by `what`, or `None` (after a loud `SKIPPED`) without
/// the rig.
fn world(what: &str) -> Option<World> {
    let rig = vm::rig()?;
    let root = tempfile::tempdir().unwrap();
    let mut agent = start_agent(root.path(), &plugin_config(&rig));
    agent.end_tasks = true;
    let marker = marker(what);
    Some(World {
        agent,
        watch: QemuWatch::new(&marker),
        marker,
        rig,
        _root: root,
    })
}

/// Acceptance 1, first half: the guest boots, its serial console is the task's log,
/// `task stats` shows the VM, and a stop with `graceful_shutdown` ends it through the
/// guest's own poweroff: exit code 0, no signal, the guest's acpid on the console, and
/// well before the kill timeout.
#[test]
fn guest_boots_logs_and_powers_off_on_graceful_stop() {
    let _serial = serial();
    let Some(mut w) = world("graceful") else {
        return;
    };

    let config = guest_config(
        &w.rig,
        &w.marker,
        &["drover.tick=1"],
        json!({ "graceful_shutdown": true }),
    );
    let id = run(
        &w.agent,
        &config,
        &["--kill-timeout", "90s", "--memory-mb", "256"],
    );
    let ran = Instant::now();
    let task = status(&w.agent, &id);
    assert_eq!(task["state"], "running", "{task:#}");
    assert_eq!(task["driver"], "qemu");

    // The serial console: the init's first line, then its ticks, in order.
    let log = wait_log(&w.agent, &id, GUEST_STARTED, BOOT);
    eprintln!(
        "task run returned → init's first line in task logs: {:?}",
        ran.elapsed()
    );
    let tick = ticks_past(&w.agent, &id, 1);
    let log_now = logs(&w.agent, &id);
    assert!(
        log_now.starts_with(&log),
        "the log was rewritten, not appended to"
    );
    let started_at = log_now.find(GUEST_STARTED).expect("init line");
    let tick1_at = log_now.find("drover-guest: tick 1").expect("tick 1");
    assert!(started_at < tick1_at, "{log_now}");
    assert!(tick >= 2);

    // The VM is one process; its CPU and memory are the task's.
    let (vm_pid, _) = w.watch.assert_one("while running");
    confined(vm_pid, &task);
    let stats = w.agent.cli_json(&["task", "stats", &id, "--json"]);
    let rss = stats["memory_rss_bytes"].as_u64().unwrap_or(0);
    let cpu = stats["cpu_user_seconds"].as_f64().unwrap_or(0.0)
        + stats["cpu_system_seconds"].as_f64().unwrap_or(0.0);
    assert!(
        rss >= 16 << 20,
        "task stats shows {rss} bytes resident for a booted VM: {stats:#}"
    );
    assert!(
        cpu > 0.1,
        "task stats shows {cpu} s of CPU for a VM that booted under TCG: {stats:#}"
    );

    // Graceful stop: the power button, the guest's acpid, poweroff, qemu exits 0.
    let (stopped, took) = stop(&w.agent, &id, None);
    eprintln!("graceful stop (power button → guest poweroff → qemu exit): {took:?}");
    assert_eq!(stopped["state"], "dead", "{stopped:#}");
    assert_eq!(
        stopped["exit_code"], 0,
        "a guest that powered itself off ends with exit code 0: {stopped:#}"
    );
    assert!(
        stopped["signal"].is_null() || stopped["signal"] == 0,
        "a guest that powered itself off was not killed: {stopped:#}"
    );
    assert!(
        took < Duration::from_secs(60),
        "the graceful stop took {took:?}: did it wait for the kill timeout?"
    );
    let log = logs(&w.agent, &id);
    assert!(
        log.contains(POWERING_OFF),
        "the guest never saw its power button:\n{log}"
    );
    // Exit code 0 and no error is the exit of a guest that powered itself off: the
    // agent takes an error beside code 0 for "the driver could not tell", and `task
    // wait` would then exit 1.
    assert!(
        stopped["error"].is_null(),
        "a clean poweroff is no error: {}",
        ending(&stopped)
    );
    assert_eq!(w.agent.cli(&["task", "wait", &id]).status.code(), Some(0));
    // What tells this exit from qemu quitting on SIGTERM (also code 0): the driver's
    // own word, among the task's events.
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the driver's event that the guest powered off",
        || {
            status(&w.agent, &id)["events"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| {
                    e["type"] == "DriverMessage"
                        && e["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("the guest powered off"))
                })
        },
    );
    w.watch.wait_gone(Duration::from_secs(10));
    assert!(
        !drover_test_support::procs::alive(vm_pid),
        "qemu {vm_pid} outlived its task"
    );
    w.watch.assert_one("after the stop");
    let _ = w.agent.stop();
}

/// Acceptance 1: a guest that ignores the power button (no acpid) is killed once the
/// stop timeout passes, and its exit says it was killed.
#[test]
fn guest_ignoring_the_power_button_is_killed_after_the_timeout() {
    let _serial = serial();
    let Some(mut w) = world("deaf") else { return };

    let config = guest_config(
        &w.rig,
        &w.marker,
        &["drover.tick=1", "drover.acpid=0"],
        json!({ "graceful_shutdown": true }),
    );
    let id = run(&w.agent, &config, &["--kill-timeout", "4s"]);
    // Past its init's set-up: were acpid to run, it would be running by now.
    wait_log(&w.agent, &id, "drover-guest: tick 1", BOOT);
    w.watch.assert_one("while running");

    let (stopped, took) = stop(&w.agent, &id, None);
    assert_eq!(stopped["state"], "dead", "{stopped:#}");
    assert!(
        took >= Duration::from_millis(3900),
        "the stop returned after {took:?}, before the 4 s kill timeout: {stopped:#}"
    );
    assert!(
        took < Duration::from_secs(30),
        "the stop took {took:?} for a 4 s kill timeout"
    );
    assert_eq!(
        stopped["signal"], 9,
        "a guest that ignored the power button is killed: {stopped:#}"
    );
    let how = stopped["error"].as_str().unwrap_or_default();
    assert!(
        how.contains("did not power off") && how.contains("killed"),
        "the task's exit does not say the guest ignored the button and was killed: {}",
        ending(&stopped)
    );
    let log = logs(&w.agent, &id);
    assert!(!log.contains(POWERING_OFF), "acpid ran after all:\n{log}");
    assert_eq!(
        w.agent.cli(&["task", "wait", &id]).status.code(),
        Some(128 + 9)
    );
    w.watch.wait_gone(Duration::from_secs(10));
    w.watch.assert_one("after the stop");
    let _ = w.agent.stop();
}

/// Acceptance 1: `kill -9` of the qemu plugin, then of the agent, leave the VM running:
/// the plugin is relaunched / the agent comes back, the task is still running, its
/// serial log goes on, a graceful stop still reaches the guest afterwards, and there
/// was exactly one qemu process for the task throughout.
#[test]
fn vm_survives_kill_9_of_the_plugin_and_of_the_agent() {
    let _serial = serial();
    let Some(rig) = vm::rig() else { return };
    let root = tempfile::tempdir().unwrap();
    let plugin = plugin_config(&rig);
    let marker = marker("survive");
    // Declared before the agents: dropped after them, it kills the VM should the test
    // fail with the task still running.
    let watch = QemuWatch::new(&marker);
    // Killed agents are kept to the end: dropping one SIGKILLs the plugin processes it
    // started, which the next agent may have reattached to.
    let mut retired = Vec::new();
    let mut agent = start_agent(root.path(), &plugin);

    let config = guest_config(
        &rig,
        &marker,
        &["drover.tick=1"],
        json!({ "graceful_shutdown": true }),
    );
    let id = run(&agent, &config, &["--kill-timeout", "90s"]);
    wait_log(&agent, &id, GUEST_STARTED, BOOT);
    let mut tick = ticks_past(&agent, &id, 0);
    let (vm, _) = watch.assert_one("before any kill");

    // 1. The plugin dies; the agent relaunches it, and it recovers the VM.
    let old = wait_qemu_plugin(&agent, BOOT, |_| true)["pid"]
        .as_u64()
        .expect("qemu plugin pid") as u32;
    nix_kill(old, 9).expect("kill -9 the qemu plugin");
    let relaunched = wait_qemu_plugin(&agent, BOOT, |r| r["pid"].as_u64() != Some(old.into()));
    assert_ne!(relaunched["pid"], json!(old));
    let task = status(&agent, &id);
    assert_eq!(
        task["state"], "running",
        "after the plugin's death: {task:#}"
    );
    tick = ticks_past(&agent, &id, tick);
    assert_eq!(watch.assert_one("after kill -9 of the plugin").0, vm);

    // 2. The agent dies; the VM runs on meanwhile; the next agent recovers it.
    kill9_agent(&mut agent);
    retired.push(agent);
    let dir_log = PathBuf::from(task["task_dir"].as_str().expect("task_dir")).join("logs");
    let before = last_tick(&drover_test_support::read_log(&dir_log.join("stdout")));
    drover_test_support::until_blocking(
        BOOT,
        Duration::from_millis(100),
        "the guest ticks while no agent runs",
        || last_tick(&drover_test_support::read_log(&dir_log.join("stdout"))) > before,
    );
    agent = start_agent(root.path(), &plugin);
    agent.end_tasks = true;
    wait_recovered(&agent, BOOT);
    let task = status(&agent, &id);
    assert_eq!(
        task["state"], "running",
        "after the agent's death: {task:#}"
    );
    tick = ticks_past(&agent, &id, tick.max(before));
    assert_eq!(watch.assert_one("after kill -9 of the agent").0, vm);

    // 3. The recovered task still reaches its guest: a graceful stop powers it off.
    let (stopped, _) = stop(&agent, &id, None);
    assert_eq!(stopped["exit_code"], 0, "{stopped:#}");
    let log = logs(&agent, &id);
    assert!(log.contains(POWERING_OFF), "{log}");
    // Every tick once, in order: nothing lost or doubled across the restarts.
    let ticks: Vec<u64> = log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("drover-guest: tick "))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let want: Vec<u64> = (1..=ticks.len() as u64).collect();
    assert_eq!(ticks, want, "ticks lost or repeated in the log:\n{log}");
    assert!(ticks.len() as u64 >= tick);
    watch.wait_gone(Duration::from_secs(10));
    watch.assert_one("at the end");
    drop(agent);
    drop(retired);
}

/// Acceptance 2: a guest service on a forwarded port answers on 127.0.0.1, and the
/// forward listens on 127.0.0.1 only; a forward with a `host_ip` listens there.
#[test]
fn forwarded_port_answers_on_loopback_only() {
    let _serial = serial();
    let Some(mut w) = world("forward") else {
        return;
    };

    let host_port = free_port();
    let other_port = free_port();
    let other_ip = Ipv4Addr::new(127, 0, 0, 2);
    let config = guest_config(
        &w.rig,
        &w.marker,
        &["drover.net=1", "drover.serve=8080"],
        json!({ "port_forwards": [
            { "host": host_port, "guest": 8080 },
            { "host": other_port, "guest": 8080, "host_ip": other_ip, "protocol": "tcp" },
        ] }),
    );
    let id = run(&w.agent, &config, &[]);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port));
    let said = read_when_served(addr, "drover-guest says hello", BOOT).unwrap_or_else(|last| {
        panic!(
            "nothing answered \"drover-guest says hello\" on {addr} within {BOOT:?} \
             (last: {last}); guest console:\n{}\nagent log:\n{}",
            logs(&w.agent, &id),
            w.agent.log_text()
        )
    });
    assert_eq!(said.trim(), "drover-guest says hello");
    // A second connection is served too.
    assert!(read_when_served(addr, "says hello", Duration::from_secs(30)).is_ok());

    let listening = tcp_listeners(host_port);
    assert_eq!(
        listening,
        vec![std::net::IpAddr::from(Ipv4Addr::LOCALHOST)],
        "the forward of port {host_port} must listen on 127.0.0.1 only (no host_ip given)"
    );
    assert_eq!(
        tcp_listeners(other_port),
        vec![std::net::IpAddr::from(other_ip)],
        "the forward of port {other_port} must listen on its host_ip {other_ip} only"
    );
    let other = SocketAddr::from((other_ip, other_port));
    assert!(
        read_when_served(other, "says hello", Duration::from_secs(30)).is_ok(),
        "nothing answered on {other}"
    );
    w.watch.assert_one("while serving");
    let (stopped, _) = stop(&w.agent, &id, Some("2s"));
    assert_eq!(stopped["state"], "dead");
    w.watch.wait_gone(Duration::from_secs(10));
    assert!(
        tcp_listeners(host_port).is_empty() && tcp_listeners(other_port).is_empty(),
        "ports {host_port}, {other_port} still listened on after the VM ended"
    );
    let _ = w.agent.stop();
}

/// Acceptance 3: bad task configs are refused through the CLI before qemu starts, each
/// with a message naming the problem; no task is created, no qemu process ever
/// appears, and the agent and its qemu plugin keep running.
#[test]
fn bad_input_is_refused_before_qemu_starts() {
    let _serial = serial();
    let Some(rig) = vm::rig() else { return };
    let root = tempfile::tempdir().unwrap();
    // A real kernel, outside the task dir and image_paths: were the path check
    // missing, qemu would boot it. A second images directory holds a link to it.
    let outside = root.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let outside_kernel = outside.join("vmlinuz");
    std::fs::copy(&rig.kernel, &outside_kernel).unwrap();
    let images = root.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let linked = images.join("vmlinuz");
    std::os::unix::fs::symlink(&outside_kernel, &linked).unwrap();
    let dotdot = images.join("../outside/vmlinuz");
    let missing = rig_dir(&rig).join("no-such-image.qcow2");

    let plugin = json!({ "image_paths": [rig_dir(&rig), images], "args_allowlist": ["-rtc"] });
    let mut agent = start_agent(root.path(), &plugin);
    agent.end_tasks = true;
    let plugin_pid = wait_qemu_plugin(&agent, BOOT, |_| true)["pid"].clone();

    struct Case {
        what: &'static str,
        extra: Value,
        /// Every one of these must be in the CLI's error.
        says: Vec<String>,
    }
    let cases = [
        Case {
            what: "kernel outside image_paths",
            extra: json!({ "kernel": outside_kernel }),
            // The path, and where images may come from instead.
            says: vec![
                outside_kernel.display().to_string(),
                rig_dir(&rig).display().to_string(),
            ],
        },
        Case {
            what: "link under image_paths to a file outside",
            extra: json!({ "kernel": linked }),
            says: vec![linked.display().to_string(), "outside".into()],
        },
        Case {
            what: "`..` out of image_paths",
            extra: json!({ "kernel": dotdot }),
            says: vec![dotdot.display().to_string(), "outside".into()],
        },
        Case {
            what: "argument outside args_allowlist",
            extra: json!({ "args": ["-device", "pci-testdev"] }),
            says: vec!["-device".into(), "args_allowlist".into()],
        },
        Case {
            what: "missing image",
            extra: json!({ "image_path": missing }),
            says: vec![missing.display().to_string()],
        },
        Case {
            what: "misspelt field",
            extra: json!({ "grace_shutdown": true }),
            says: vec!["grace_shutdown".into()],
        },
    ];
    for case in &cases {
        let marker = marker("refused");
        let watch = QemuWatch::new(&marker);
        let config = guest_config(&rig, &marker, &["drover.tick=1"], case.extra.clone());
        let out = run_cli(&agent, &config, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{}: the task was accepted: {}",
            case.what,
            String::from_utf8_lossy(&out.stdout)
        );
        for word in &case.says {
            assert!(
                err.contains(word.as_str()),
                "{}: the error does not name {word:?}: {err}",
                case.what
            );
        }
        eprintln!("{}: refused with: {}", case.what, err.trim());
        let seen = watch.seen();
        assert!(
            seen.processes.is_empty() && seen.looks > 0,
            "{}: a qemu process was started: {seen:?}",
            case.what
        );
        assert_eq!(
            agent.cli_json(&["task", "list", "--json"]),
            json!([]),
            "{}: a task was created",
            case.what
        );
        assert!(
            agent.child.try_wait().unwrap().is_none(),
            "{}: the agent died:\n{}",
            case.what,
            agent.log_text()
        );
        let row = wait_qemu_plugin(&agent, BOOT, |_| true);
        assert_eq!(
            row["pid"], plugin_pid,
            "{}: the qemu plugin restarted",
            case.what
        );
    }

    // The same config without the fault starts (the refusals were for the faults).
    let marker = marker("accepted");
    let watch = QemuWatch::new(&marker);
    let config = guest_config(
        &rig,
        &marker,
        &["drover.tick=1"],
        json!({ "args": ["-rtc", "base=utc"] }),
    );
    let id = run(&agent, &config, &[]);
    wait_log(&agent, &id, GUEST_STARTED, BOOT);
    watch.assert_one("an allowed argument");
    let (stopped, _) = stop(&agent, &id, Some("2s"));
    assert_eq!(stopped["state"], "dead");
    watch.wait_gone(Duration::from_secs(10));
    let _ = agent.stop();
}

/// The fingerprint is the plugin's health description in `plugin status`: qemu's
/// version and whether KVM *worked* when tried. Where it did not (these machines: a
/// `/dev/kvm` under which a guest hangs), a task asking for KVM is refused with the
/// reason, before qemu starts.
#[test]
fn fingerprint_tells_whether_kvm_works_and_kvm_tasks_follow_it() {
    let _serial = serial();
    let Some(w) = world("kvm") else { return };
    let row = wait_qemu_plugin(&w.agent, BOOT, |_| true);
    let reason = row["reason"].as_str().unwrap_or_default().to_owned();
    eprintln!("qemu plugin: {reason}");
    assert!(
        reason.starts_with("qemu ")
            && (reason.contains("KVM works") || reason.contains("TCG only:")),
        "the health description does not give qemu's version and the KVM trial's result: {row:#}"
    );
    if reason.contains("KVM works") {
        eprintln!("KVM works on this host: a kvm task would start, nothing to refuse");
        return;
    }
    let config = guest_config(
        &w.rig,
        &w.marker,
        &["drover.tick=1"],
        json!({ "accelerator": "kvm" }),
    );
    let out = run_cli(&w.agent, &config, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a kvm task started where KVM does not work"
    );
    assert!(
        err.contains("accelerator kvm") && err.contains("KVM does not work"),
        "{err}"
    );
    let seen = w.watch.seen();
    assert!(seen.processes.is_empty(), "qemu was started: {seen:?}");
}

/// With no `qemu-system-*` where the plugin looks, the driver is `undetected` and says
/// where it looked, and a qemu task is refused. Needs no rig: the plugin is pointed at
/// an empty directory.
#[test]
fn without_qemu_the_driver_is_undetected_and_says_why() {
    let root = tempfile::tempdir().unwrap();
    let empty = root.path().join("no-emulators");
    std::fs::create_dir(&empty).unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(&config, agent_config(&json!({ "emulators": [empty] }))).unwrap();
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &["--config", config.to_str().expect("utf-8 path")],
    );
    agent.end_tasks = true;
    let rows = agent.wait_plugins(BOOT, |rows| {
        rows.iter()
            .any(|r| r["name"] == "qemu" && r["state"] == "undetected")
    });
    let row = common::row(&rows, "qemu");
    let reason = row["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no qemu-system-*") && reason.contains(&empty.display().to_string()),
        "the reason does not say what is missing where: {row:#}"
    );
    let out = run_cli(&agent, &json!({ "kernel": "/nonexistent/vmlinuz" }), &[]);
    assert!(
        !out.status.success(),
        "a qemu task was accepted without qemu"
    );
    eprintln!(
        "refused without qemu: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    assert_eq!(agent.cli_json(&["task", "list", "--json"]), json!([]));
}
