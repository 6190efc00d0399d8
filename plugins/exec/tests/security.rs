//! Issue 10, scenario 4 and the task-escape suite, inside real exec tasks: the
//! default seccomp filter (`Seccomp: 2`, no user namespace, no keyctl, bpf, mount,
//! ptrace, …), what relaxes it, root refused unless the plugin allows it, default
//! memory and pids limits, read-only binds that stay read-only below, and the task's
//! open-file limit.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use drover_plugin_sdk::{DriverError, TaskSpec};
use serde_json::json;

/// The probe's source (shared with the java tests).
const ESCAPE_C: &str = include_str!("escape.c");

/// Build the escape probe into `<task dir>/local/escape` (`/local/escape` inside).
/// A missing C compiler fails the test: the suite cannot run without it.
fn build_escape(task_dir: &Path) -> PathBuf {
    std::fs::create_dir_all(task_dir.join("local")).unwrap();
    let src = task_dir.join("escape.c");
    std::fs::write(&src, ESCAPE_C).unwrap();
    let out = task_dir.join("local/escape");
    let cc = Command::new("cc")
        .args(["-O", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("the task-escape suite needs a C compiler (cc)");
    assert!(
        cc.status.success(),
        "cc escape.c: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    out
}

/// The probe's lines, `probe -> outcome`.
fn outcomes(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect()
}

/// Every probe refused (`EPERM`; `clone3`: `ENOSYS`, so that libc falls back to
/// `clone`), and the calls that must keep working (`allowed-*`) did.
fn assert_all_refused(out: &str) {
    assert!(
        out.lines().any(|l| l == "done"),
        "the probe did not finish:\n{out}"
    );
    let got = outcomes(out);
    assert!(got.len() > 40, "too few probes:\n{out}");
    let mut wrong = Vec::new();
    for (probe, outcome) in &got {
        let want = if probe.starts_with("allowed-") {
            "ok"
        } else if probe == "clone3" {
            "ENOSYS"
        } else {
            "EPERM"
        };
        if outcome != want {
            wrong.push(format!("{probe}: {outcome}, expected {want}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}\nfull output:\n{out}",
        wrong.join("\n")
    );
}

/// Scenario 4 exactly: inside an exec task, `grep Seccomp /proc/self/status` shows 2,
/// `unshare -Urn` fails, and keyctl, bpf and every other denied class are refused.
#[tokio::test]
async fn scenario_4_an_exec_task_runs_under_the_default_seccomp_filter() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let spec = p.spec(
        "escape",
        sh("grep Seccomp /proc/self/status; \
            if unshare -Urn true 2>/dev/null; then echo unshare-Urn=ok; else echo unshare-Urn=refused; fi; \
            if unshare -U true 2>/dev/null; then echo unshare-U=ok; else echo unshare-U=refused; fi; \
            if mount -t tmpfs none /tmp 2>/dev/null; then echo mount=ok; else echo mount=refused; fi; \
            /local/escape"),
    );
    build_escape(&dir.path().join("escape"));
    p.start_spec(spec).await;
    let exit = p.wait("escape").await;
    let out = p.stdout("escape");
    assert!(
        exit.successful(),
        "{exit:?}\n{out}\n{}",
        p.log("escape", "stderr")
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&"Seccomp:\t2"),
        "no seccomp filter on the task:\n{out}"
    );
    for l in ["unshare-Urn=refused", "unshare-U=refused", "mount=refused"] {
        assert!(lines.contains(&l), "{l} not in:\n{out}");
    }
    assert_all_refused(&out);
}

/// The operator relaxes the filter per plugin: names in `seccomp_allow` pass, the
/// rest stays denied; `unconfined` has no filter; a name the filter does not deny
/// is refused at SetConfig, naming it.
#[tokio::test]
async fn seccomp_allow_and_unconfined_relax_the_filter_and_bad_names_are_refused() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let relaxed = Plugin::launch(
        dir.path(),
        json!({ "seccomp_allow": ["keyctl", "ptrace", "clone3", "clone", "unshare", "io_uring_setup"] }),
    )
    .await;
    build_escape(&dir.path().join("relaxed"));
    relaxed.start("relaxed", sh("/local/escape")).await;
    assert!(relaxed.wait("relaxed").await.successful());
    let out = relaxed.stdout("relaxed");
    // ptrace-attach-init: pid 1 is the task's init, which runs as root: refused by
    // permissions rather than by the filter, so only "not EPERM" can't hold there.
    let got = outcomes(&out);
    let get = |probe: &str| {
        got.iter()
            .find(|(p, _)| p == probe)
            .map(|(_, o)| o.as_str())
            .unwrap_or_else(|| panic!("no {probe} in:\n{out}"))
    };
    assert_eq!(get("keyctl"), "ok", "{out}");
    assert_eq!(get("ptrace-traceme"), "ok", "{out}");
    assert_ne!(get("clone3"), "ENOSYS", "{out}");
    assert_eq!(get("io_uring_setup"), "ok", "{out}");
    for still in [
        "add_key",
        "bpf",
        "mount",
        "process_vm_readv",
        "io_uring_enter",
        "io_uring_register",
    ] {
        assert_eq!(get(still), "EPERM", "{still}: {out}");
    }
    drop(relaxed);

    let dir = tempfile::tempdir().unwrap();
    let open = Plugin::launch(dir.path(), json!({ "seccomp": "unconfined" })).await;
    open.start("open", sh("grep Seccomp /proc/self/status"))
        .await;
    assert!(open.wait("open").await.successful());
    let out = open.stdout("open");
    assert!(out.lines().any(|l| l == "Seccomp:\t0"), "{out}");

    for (config, word) in [
        (json!({ "seccomp_allow": ["keyctll"] }), "keyctll"),
        (json!({ "seccomp_allow": ["read"] }), "\"read\""),
        (json!({ "seccomp": "off" }), "off"),
        // clone3's flags are out of the filter's sight: alone it would let
        // clone3(CLONE_NEWUSER) through while clone and unshare refuse.
        (json!({ "seccomp_allow": ["clone3"] }), "CLONE_NEWUSER"),
        (
            json!({ "seccomp_allow": ["clone3", "clone"] }),
            "\"unshare\"",
        ),
        (
            json!({ "seccomp": "unconfined", "seccomp_allow": ["bpf"] }),
            "unconfined",
        ),
    ] {
        let err = within(
            PROMPT,
            "set config",
            open.client.set_config(
                config.to_string(),
                &drover_plugin_sdk::AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
                    .with_alloc_dir(dir.path())
                    .with_plugin_state_dir(state_dir(dir.path())),
            ),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains(word), "{config}: {err}");
    }
}

/// Root is refused by default, by name or by number, with an error naming the
/// plugin option; `user_denylist = []` allows it, and root stays under the filter.
#[tokio::test]
async fn root_is_refused_by_default_and_allowed_with_the_opt_in() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    for user in ["root", "0", "0:0"] {
        let spec = p.spec("rooted", sh_with("id -u", json!({ "user": user })));
        let err = refused(&p, spec).await;
        assert!(
            matches!(err, DriverError::InvalidConfig(_)),
            "{user}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("user_denylist") && text.contains("uid 0"),
            "{user}: {text}"
        );
    }
    // The task spec's own user (from the agent) is checked too.
    let spec = p.spec("rooted", sh("id -u")).with_user("root");
    let err = refused(&p, spec).await;
    assert!(err.to_string().contains("user_denylist"), "{err}");
    // Nothing was left behind by the refusals.
    assert!(!p.cgroup_dir("memory", "rooted").exists());
    drop(p);

    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({ "user_denylist": [] })).await;
    build_escape(&dir.path().join("rooted"));
    p.start(
        "rooted",
        sh_with(
            "id -u; grep Seccomp /proc/self/status; /local/escape",
            json!({ "user": "root" }),
        ),
    )
    .await;
    let exit = p.wait("rooted").await;
    let out = p.stdout("rooted");
    assert!(exit.successful(), "{exit:?}\n{out}");
    assert_eq!(out.lines().next(), Some("0"), "{out}");
    assert!(out.lines().any(|l| l == "Seccomp:\t2"), "{out}");
    // With root's capabilities, the filter is all that stands in the way here.
    assert_all_refused(&out);

    // A denylist of another user refuses that one and lets root through.
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({ "user_denylist": ["nobody"] })).await;
    let spec = p.spec("nobody", sh("id -u"));
    let err = refused(&p, spec).await;
    assert!(err.to_string().contains("\"nobody\""), "{err}");
}

/// Ids the kernel reads as "unchanged" are refused: `4294967295` is `(uid_t)-1`, and
/// setresuid(-1, -1, -1) would leave the task with the executor's uid 0 (and gid 0
/// with `65534:4294967295`), past `user_denylist`. Nothing starts, nothing is left.
#[tokio::test]
async fn uid_or_gid_minus_one_is_refused_not_left_as_root() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    for (user, word) in [
        ("4294967295", "uid 4294967295 is out of range"),
        ("65534:4294967295", "gid 4294967295 is out of range"),
        ("4294967295:65534", "uid 4294967295 is out of range"),
        ("2147483648", "uid 2147483648 is out of range"),
    ] {
        let spec = p.spec("minus1", sh_with("id", json!({ "user": user })));
        let err = refused(&p, spec).await;
        assert!(
            matches!(err, DriverError::InvalidConfig(_)),
            "{user}: {err:?}"
        );
        assert!(err.to_string().contains(word), "{user}: {err}");
        assert!(!p.cgroup_dir("memory", "minus1").exists(), "{user}");
    }
    // The task spec's own user too.
    let spec = p.spec("minus1", sh("id")).with_user("4294967295");
    let err = refused(&p, spec).await;
    assert!(err.to_string().contains("out of range"), "{err}");
    // Even with root allowed, -1 is not a way to any id.
    drop(p);
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({ "user_denylist": [] })).await;
    let spec = p.spec(
        "minus1",
        sh_with("id", json!({ "user": "65534:4294967295" })),
    );
    let err = refused(&p, spec).await;
    assert!(err.to_string().contains("gid 4294967295"), "{err}");
}

/// While root is denied, so is its group: `65534:0` would run with gid 0 (root's
/// group owns root's files), as primary or supplementary group. With root allowed,
/// `65534:0` runs with gid 0 as asked.
#[tokio::test]
async fn gid_0_is_refused_while_root_is_denied() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let spec = p.spec("gid0", sh_with("id -g", json!({ "user": "65534:0" })));
    let err = refused(&p, spec).await;
    assert!(matches!(err, DriverError::InvalidConfig(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("gid 0") && text.contains("user_denylist") && text.contains("primary"),
        "{text}"
    );
    assert!(!p.cgroup_dir("memory", "gid0").exists());
    drop(p);

    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({ "user_denylist": [] })).await;
    p.start(
        "gid0",
        sh_with("id -u; id -g", json!({ "user": "65534:0" })),
    )
    .await;
    assert!(p.wait("gid0").await.successful());
    assert_eq!(p.stdout("gid0"), "65534\n0\n");
}

/// Docker's masked `/proc` paths are hidden here too (those this kernel has): the
/// directories (`acpi`, `scsi`, `asound`) are an empty read-only tmpfs, the files
/// (`interrupts`, `timer_stats`, `latency_stats`, …) read empty, even for root.
#[tokio::test]
async fn dockers_masked_proc_paths_are_hidden() {
    if !isolation_possible() {
        return;
    }
    let dirs: Vec<&str> = ["acpi", "scsi", "asound"]
        .into_iter()
        .filter(|d| Path::new("/proc").join(d).is_dir())
        .collect();
    let files: Vec<&str> = [
        "interrupts",
        "timer_stats",
        "latency_stats",
        "kcore",
        "keys",
        "timer_list",
        "sched_debug",
        "kallsyms",
    ]
    .into_iter()
    .filter(|f| Path::new("/proc").join(f).is_file())
    .collect();
    assert!(
        !dirs.is_empty() && files.contains(&"interrupts"),
        "nothing to check on this kernel: {dirs:?} {files:?}"
    );
    let mut script = String::new();
    for d in &dirs {
        script += &format!(
            "echo {d}=$(ls -A /proc/{d} | wc -l); echo {d}-fs=$(stat -f -c %T /proc/{d}); \
             if echo 1 > /proc/{d}/x 2>/dev/null; then echo {d}-write=ok; else echo {d}-write=refused; fi; "
        );
    }
    for f in &files {
        script += &format!("echo {f}=$(cat /proc/{f} 2>/dev/null | wc -c); ");
    }
    let dir = tempfile::tempdir().unwrap();
    // As root (allowed here), which could read all of them unmasked.
    let p = Plugin::launch(dir.path(), json!({ "user_denylist": [] })).await;
    p.start("masked", sh_with(&script, json!({ "user": "root" })))
        .await;
    let exit = p.wait("masked").await;
    let out = p.stdout("masked");
    assert!(
        exit.successful(),
        "{exit:?}\n{out}\n{}",
        p.log("masked", "stderr")
    );
    let lines: Vec<&str> = out.lines().collect();
    for d in &dirs {
        assert!(lines.contains(&format!("{d}=0").as_str()), "{d}: {out}");
        assert!(
            lines.contains(&format!("{d}-fs=tmpfs").as_str()),
            "{d}: {out}"
        );
        assert!(
            lines.contains(&format!("{d}-write=refused").as_str()),
            "{d}: {out}"
        );
    }
    for f in &files {
        assert!(lines.contains(&format!("{f}=0").as_str()), "{f}: {out}");
    }
}

/// rlimits that let `nobody` out-schedule the host are refused at start: `rtprio`
/// above 0 (SCHED_FIFO 99 runs past CPU shares) and `nice` above 20; so is memory
/// too large to be counted in bytes (which used to wrap).
#[tokio::test]
async fn scheduling_rlimits_and_huge_memory_are_refused() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    for (rlimits, word) in [
        (
            json!({ "rtprio": { "soft": 99 } }),
            "rtprio 99/99 is refused",
        ),
        (
            json!({ "nice": { "soft": 0, "hard": 40 } }),
            "nice 0/40 is refused",
        ),
    ] {
        let spec = p.spec(
            "sched",
            sh_with("chrt -f 99 true", json!({ "rlimits": rlimits })),
        );
        let err = refused(&p, spec).await;
        assert!(matches!(err, DriverError::InvalidConfig(_)), "{err:?}");
        assert!(err.to_string().contains(word), "{err}");
    }
    let mut spec = p.spec("huge", sh("true"));
    spec.resources.memory_max_mb = 1 << 44;
    let err = refused(&p, spec).await;
    assert!(err.to_string().contains("memory_max_mb"), "{err}");
    assert!(!p.cgroup_dir("memory", "huge").exists());
    // What is allowed still runs.
    p.start(
        "sched",
        sh_with(
            "ulimit -r",
            json!({ "rlimits": { "rtprio": { "soft": 0 }, "nice": { "soft": 0 } } }),
        ),
    )
    .await;
    assert!(p.wait("sched").await.successful());
    assert_eq!(p.stdout("sched").trim(), "0");
}

/// A task that gives no resources still gets a memory and a pids limit (and CPU
/// shares), read from its cgroup.
#[tokio::test]
async fn a_task_with_no_resources_gets_a_memory_and_pids_limit() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start("bare", sh("echo ready; sleep 1000")).await;
    p.printed("bare", "ready").await;
    let cg = p.cgroup("bare");
    assert_eq!(cg.memory_max(), 300 << 20);
    assert_eq!(cg.pids_max(), "1024");
    // 100 shares; on v2 the weight they convert to (1024 shares, v1's default, would
    // be v2's default weight of 100).
    let weight = match cg.version {
        Cgroups::V1 => 100,
        Cgroups::V2 => 17,
    };
    assert_eq!(cg.cpu_weight(), weight, "{:?}", cg.version);
    within(PROMPT, "destroy", p.client.destroy_task("bare", true))
        .await
        .unwrap();
}

/// A host path bound read-only stays read-only below, where the host has another
/// mount: the binds are read-only recursively, not just at the top.
#[tokio::test]
async fn read_only_binds_are_read_only_below_too() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A host directory with a writable mount under it.
    let host = dir.path().join("hostdata");
    let sub = host.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=1777,size=1m", "drover-test"])
        .arg(&sub)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs on {}", sub.display());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(sub.clone());
    let mut chroot: serde_json::Map<String, serde_json::Value> =
        drover_isolation::rootfs::DEFAULT_CHROOT
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| ((*p).to_owned(), json!(p)))
            .collect();
    chroot.insert(host.display().to_string(), json!("/data"));
    let p = Plugin::launch(dir.path(), json!({ "chroot_env": chroot })).await;
    p.start(
        "ro",
        sh("if touch /data/top 2>/dev/null; then echo top=written; else echo top=refused; fi; \
            if touch /data/sub/below 2>/dev/null; then echo below=written; else echo below=refused; fi; \
            grep ' /data/sub ' /proc/self/mountinfo | cut -d' ' -f6"),
    )
    .await;
    let exit = p.wait("ro").await;
    let out = p.stdout("ro");
    assert!(
        exit.successful(),
        "{exit:?}\n{out}\n{}",
        p.log("ro", "stderr")
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["top=refused", "below=refused"], "{out}");
    assert!(
        lines[2].split(',').any(|o| o == "ro"),
        "mount options {out}"
    );
    assert!(!sub.join("below").exists());
}

/// The plugin raises its own open-file limit; a task gets the one the plugin was
/// started with (the operator's), not the raised one.
#[tokio::test]
async fn a_task_gets_the_operators_open_file_limit_not_the_plugins() {
    if !isolation_possible() {
        return;
    }
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.expect("a finite open-file hard limit");
    assert!(hard > 1024, "hard open-file limit {hard}: too low to tell");
    // The plugin inherits this soft limit, and raises its own towards the hard one.
    // (Process-wide: the other tests of this binary get 1024 descriptors, plenty.)
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(1024),
            maximum: Some(hard),
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start("nofile", sh("ulimit -n")).await;
    let plugin = std::fs::read_to_string(format!("/proc/{}/limits", p.process.pid())).unwrap();
    let plugin_soft = plugin
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .to_owned();
    assert!(p.wait("nofile").await.successful());
    assert_eq!(
        p.stdout("nofile").trim(),
        "1024",
        "the plugin runs with {plugin_soft}"
    );
}

/// The error a start of `spec` is refused with (within [`PROMPT`]).
async fn refused(p: &Plugin, spec: TaskSpec) -> DriverError {
    within(PROMPT, "start", p.client.start_task(spec))
        .await
        .unwrap_err()
}
