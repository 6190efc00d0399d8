//! What a task of the exec driver sees and can do, checked from inside the task,
//! through the real plugin binary: capabilities, no_new_privs, its pid namespace, its
//! root, its user; and what the plugin refuses before anything starts.

mod common;

use common::*;
use drover_plugin_sdk::DriverError;
use drover_plugin_sdk::Health;
use serde_json::json;

/// `CapBnd` etc. of a `/proc/<pid>/status` text, as a mask.
fn cap_field(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in:\n{status}"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

fn status_field<'a>(status: &'a str, field: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in:\n{status}"))
        .trim()
}

/// The default capability set minus `chown`, as a mask (bit n = capability n).
fn default_without_chown() -> u64 {
    let all = drover_isolation::caps::default_set();
    all & !(1 << 0)
}

#[tokio::test]
async fn a_task_sees_its_capabilities_pid_root_and_user() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    // A host file outside the chroot list, next to the task's own directory.
    let outside = dir.path().join("outside-marker");
    std::fs::write(&outside, "secret").unwrap();
    let script = format!(
        "cat /proc/self/status > /local/status; \
         echo pid=$$; echo uid=$(id -u); echo gid=$(id -g); \
         echo root=$(ls / | tr '\\n' ' '); \
         if [ -e {outside} ]; then echo outside=visible; else echo outside=invisible; fi; \
         if [ -e /work ] || [ -e /root ] || [ -e /home ]; then echo host=visible; else echo host=invisible; fi; \
         if echo x >> /etc/passwd 2>/dev/null; then echo etc=written; else echo etc=refused; fi; \
         if touch /usr/drover-x 2>/dev/null; then echo usr=written; else echo usr=refused; fi; \
         if touch /new-file 2>/dev/null; then echo rootdir=written; else echo rootdir=refused; fi; \
         if echo hi > /local/out && echo hi > /tmp/out; then echo own=written; else echo own=refused; fi; \
         echo procs=$(ls /proc | grep -c '^[0-9]'); echo done",
        outside = outside.display()
    );
    p.start("caps", sh_with(&script, json!({ "cap_drop": ["chown"] })))
        .await;
    let exit = p.wait("caps").await;
    let out = p.stdout("caps");
    assert!(
        exit.successful(),
        "{exit:?}\nstdout:\n{out}\nstderr:\n{}",
        p.log("caps", "stderr")
    );
    let status = std::fs::read_to_string(dir.path().join("caps/local/status")).unwrap();
    assert_eq!(
        cap_field(&status, "CapBnd"),
        default_without_chown(),
        "bounding set: {status}"
    );
    for set in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
        assert_eq!(
            cap_field(&status, set),
            0,
            "{set} of a nobody task: {status}"
        );
    }
    assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
    let line = |key: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
            .to_owned()
    };
    let pid: u32 = line("pid").parse().unwrap();
    assert!(pid <= 3, "the task's pid in its namespace is {pid}");
    assert_eq!(line("uid"), "65534");
    assert_eq!(line("outside"), "invisible");
    assert_eq!(line("host"), "invisible", "root: {}", line("root"));
    assert_eq!(line("etc"), "refused");
    assert_eq!(line("usr"), "refused");
    assert_eq!(line("rootdir"), "refused");
    assert_eq!(line("own"), "written");
    // Only the task's namespace is in its /proc: the init, the shell, a subshell and
    // the pipeline that looked (the host has many more).
    let procs: u32 = line("procs").parse().unwrap();
    assert!(procs <= 5, "{procs} processes visible in the task's /proc");
    let root = line("root");
    for dir in ["bin", "dev", "local", "proc", "secrets", "tmp", "usr"] {
        assert!(root.split(' ').any(|d| d == dir), "no /{dir} in {root}");
    }
    // The files it wrote belong to its user, on the host.
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(dir.path().join("caps/local/out")).unwrap();
    assert_eq!(meta.uid(), 65534);
}

#[tokio::test]
async fn root_tasks_hold_exactly_the_bounding_set_and_cap_add_reaches_nobody() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(
        dir.path(),
        json!({
            "allow_caps": ["chown", "kill", "net_admin", "net_bind_service"],
            "user_denylist": [],
        }),
    )
    .await;
    p.start(
        "root",
        sh_with(
            "cat /proc/self/status > /local/status",
            json!({ "user": "root" }),
        ),
    )
    .await;
    p.start(
        "nobody",
        sh_with(
            "cat /proc/self/status > /local/status",
            json!({ "cap_add": ["net_admin"] }),
        ),
    )
    .await;
    for id in ["root", "nobody"] {
        let exit = p.wait(id).await;
        assert!(exit.successful(), "{id}: {exit:?}: {}", p.log(id, "stderr"));
    }
    let read =
        |id: &str| std::fs::read_to_string(dir.path().join(id).join("local/status")).unwrap();
    let names = |m: u64| drover_isolation::caps::mask_names(m);
    let root = read("root");
    // The defaults cut down to the allowlist; root holds them all, and nothing else.
    assert_eq!(
        names(cap_field(&root, "CapBnd")),
        ["chown", "kill", "net_bind_service"]
    );
    assert_eq!(cap_field(&root, "CapEff"), cap_field(&root, "CapBnd"));
    let nobody = read("nobody");
    assert_eq!(
        names(cap_field(&nobody, "CapBnd")),
        ["chown", "kill", "net_bind_service", "net_admin"]
    );
    // A non-root task holds what it added, and only that.
    for set in ["CapEff", "CapPrm", "CapAmb"] {
        assert_eq!(
            names(cap_field(&nobody, set)),
            ["net_admin"],
            "{set}: {nobody}"
        );
    }
}

#[tokio::test]
async fn capabilities_outside_the_allowlist_and_bad_configs_are_refused_by_name() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let p = &p;
    let refused = |config| {
        let spec = p.spec("refused", config);
        async move {
            within(PROMPT, "start", p.client.start_task(spec))
                .await
                .unwrap_err()
        }
    };
    let err = refused(sh_with("true", json!({ "cap_add": ["sys_admin", "kill"] }))).await;
    assert!(matches!(err, DriverError::InvalidConfig(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("sys_admin") && !text.contains("sys_admin, kill"),
        "{text}"
    );
    let err = refused(json!({ "command": "/usr/bin/no-such-program" })).await;
    assert!(
        err.to_string().contains("/usr/bin/no-such-program"),
        "{err}"
    );
    let err = refused(json!({ "command": "/work/anything" })).await;
    assert!(
        err.to_string().contains("not inside the task's root"),
        "{err}"
    );
    let err = refused(sh_with("true", json!({ "user": "no-such-user-x" }))).await;
    assert!(err.to_string().contains("no-such-user-x"), "{err}");
    // A step that fails in the task's init or the task, after the cgroup was made:
    // the error names the step, and nothing is left either.
    let err = refused(sh_with("true", json!({ "cwd": "/nonexistent" }))).await;
    assert!(
        err.to_string().contains("working directory /nonexistent"),
        "{err}"
    );
    // Nothing was left behind: no cgroup, no executor directory.
    assert!(!p.cgroup("refused").exists(), "cgroup left");
    let executors = state_dir(dir.path()).join("exec");
    let left: Vec<_> = std::fs::read_dir(&executors)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "executor dirs left: {left:?}");

    // A plugin config that allows more makes the same request work.
    let p2 = Plugin::launch(dir.path(), json!({ "allow_caps": ["sys_admin"] })).await;
    p2.start(
        "allowed",
        sh_with("true", json!({ "cap_add": ["sys_admin"] })),
    )
    .await;
    assert!(p2.wait("allowed").await.successful());
    // And a plugin config naming an unknown capability is refused at SetConfig.
    let mut options = drover_plugin_sdk::client::LaunchOptions::new("exec", BIN);
    options.handshake_timeout = PROMPT;
    let bad = drover_plugin_sdk::client::PluginProcess::launch(options)
        .await
        .unwrap();
    let err = bad
        .client()
        .set_config(
            json!({ "allow_caps": ["sys_admn"] }).to_string(),
            &drover_plugin_sdk::AgentInfo::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("sys_admn"), "{err}");
    let _ = bad.kill().await;
}

#[tokio::test]
async fn network_none_has_only_a_loopback_device_which_is_up_and_host_keeps_the_hosts_interfaces() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let script = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
    p.start("none", sh_with(script, json!({ "network_mode": "none" })))
        .await;
    p.start("host", sh(script)).await;
    for id in ["none", "host"] {
        assert!(p.wait(id).await.successful(), "{}", p.log(id, "stderr"));
    }
    assert_eq!(p.stdout("none").trim(), "lo");
    let host: Vec<String> = std::fs::read_to_string("/proc/net/dev")
        .unwrap()
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned()))
        .collect();
    let out = p.stdout("host");
    let seen: Vec<&str> = out.lines().collect();
    assert_eq!(seen.len(), host.len(), "{seen:?} vs {host:?}");

    // The loopback device is up, as in Docker's `none` network.
    if !std::path::Path::new("/bin/busybox").exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: /bin/busybox (busybox-static) is needed to check the loopback device"
        );
        eprintln!("#### SKIPPED the loopback check: no /bin/busybox (install busybox-static)");
        return;
    }
    p.start(
        "lo",
        json!({ "command": "/bin/busybox", "args": ["ip", "-o", "link", "show", "lo"],
                "network_mode": "none" }),
    )
    .await;
    assert!(p.wait("lo").await.successful(), "{}", p.log("lo", "stderr"));
    let link = p.stdout("lo");
    assert!(link.contains("<LOOPBACK,UP"), "{link}");
}

/// A namespace the test makes (`ip netns add`), removed when dropped.
struct TestNetns(String);

impl TestNetns {
    fn new() -> Option<TestNetns> {
        let name = format!("drover-exec-test-{}", std::process::id());
        let ip = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ip(&["netns", "add", &name]) {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: `ip netns add` failed (iproute2 and root are needed)"
            );
            eprintln!("#### SKIPPED: `ip netns add` failed (iproute2 and root are needed)");
            return None;
        }
        let ns = TestNetns(name);
        Some(ns)
    }
    fn path(&self) -> std::path::PathBuf {
        std::path::Path::new("/run/netns").join(&self.0)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

#[tokio::test]
async fn tasks_given_a_group_namespace_join_it_and_share_it() {
    if !isolation_possible() {
        return;
    }
    let Some(ns) = TestNetns::new() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    // The namespace a process is in, by inode: the same as the bind mount's.
    let script = "readlink /proc/self/ns/net";
    for (id, config) in [
        ("first", json!({})),
        // A task that names the host's network still gets the group's namespace
        // (`none` is refused in a bridge group: engine's check_network_mode).
        ("second", json!({ "network_mode": "host" })),
    ] {
        let spec = p
            .spec(id, sh_with(script, config))
            .with_netns_path(ns.path());
        p.start_spec(spec).await;
    }
    use std::os::unix::fs::MetadataExt as _;
    let group = format!("net:[{}]", std::fs::metadata(ns.path()).unwrap().ino());
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(
        host.to_string_lossy(),
        group,
        "the test's namespace is not the host's"
    );
    for id in ["first", "second"] {
        assert!(p.wait(id).await.successful(), "{}", p.log(id, "stderr"));
        assert_eq!(
            p.stdout(id).trim(),
            group,
            "{id} is in the group's namespace"
        );
    }
    // A namespace that is not there: refused by name, nothing runs.
    let spec = p
        .spec("lost", sh("true"))
        .with_netns_path("/run/netns/drover-no-such-namespace");
    let e = p.client.start_task(spec).await.unwrap_err();
    assert!(
        e.to_string().contains("drover-no-such-namespace"),
        "the error names the namespace: {e}"
    );
}

#[tokio::test]
async fn fingerprint_is_healthy_with_the_cgroup_version_and_capabilities_tell_the_truth() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    let fp = p.first_fingerprint().await;
    assert_eq!(fp.health, Health::Healthy, "{fp:?}");
    let v = &fp.attributes["driver.exec.cgroup_version"];
    assert_eq!(v, cgroups().name());
    let caps = p.client.capabilities().await.unwrap();
    assert_eq!(caps.fs_isolation, drover_plugin_sdk::FsIsolation::Chroot);
    assert!(caps.send_signals && caps.exec && caps.recover && caps.task_stats);
    assert!(caps.network_modes.host && caps.network_modes.none && !caps.network_modes.bridge);
    assert!(
        caps.network_modes.group,
        "exec joins its group's network namespace"
    );
}

#[tokio::test]
async fn rlimits_hostname_and_cwd_apply_inside() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start(
        "limits",
        sh_with(
            "echo soft=$(ulimit -n) hard=$(ulimit -Hn) host=$(hostname) cwd=$(pwd)",
            json!({
                "rlimits": { "nofile": { "soft": 100, "hard": 200 } },
                "hostname": "box-1",
                "cwd": "/local",
            }),
        ),
    )
    .await;
    let exit = p.wait("limits").await;
    assert!(exit.successful(), "{exit:?}: {}", p.log("limits", "stderr"));
    assert_eq!(
        p.stdout("limits").trim(),
        "soft=100 hard=200 host=box-1 cwd=/local"
    );
}

/// `ExecTask` (script checks; `alloc exec` is the same path, streamed): the command
/// runs with the task's rlimits, cwd, user, seccomp filter and namespaces, and its
/// exit code and output come back.
#[tokio::test]
async fn an_exec_enters_the_tasks_sandbox() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start(
        "host",
        sh_with(
            "readlink /proc/self/ns/pid > /local/pidns; exec sleep 1000",
            json!({
                "rlimits": { "nofile": { "soft": 100, "hard": 200 } },
                "cwd": "/local",
            }),
        ),
    )
    .await;
    let script = "until [ -s /local/pidns ]; do sleep 0.05; done; \
        echo uid=$(id -u) nofile=$(ulimit -n) cwd=$(pwd) pidns=$(cat /local/pidns) \
        mine=$(readlink /proc/self/ns/pid); grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; exit 4";
    let out = p
        .client
        .exec_task(
            "host",
            vec!["/bin/sh".into(), "-c".into(), script.into()],
            std::time::Duration::from_secs(20),
        )
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.result.exit_code,
        4,
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("uid=65534 nofile=100 cwd=/local"), "{text}");
    let pidns = text
        .split("pidns=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap();
    assert!(
        text.contains(&format!("mine={pidns}")),
        "not in the task's pid namespace: {text}"
    );
    assert!(
        text.contains("Seccomp:\t2") && text.contains("NoNewPrivs:\t1"),
        "{text}"
    );
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    // A command that is no program is refused by name, the task keeps running.
    let e = p
        .client
        .exec_task(
            "host",
            vec!["/nope".into()],
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("/nope"), "{e}");
}

#[tokio::test]
async fn a_root_task_cannot_reach_devices_or_kernel_tunables() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({ "user_denylist": [] })).await;
    // CAP_MKNOD is in the default set: the node can be made, never opened (nodev);
    // /dev itself takes no new nodes; /proc/sys is read-only; /proc/kcore is empty.
    let script = "mknod /local/mem c 1 1 && echo made; \
                  if head -c1 /local/mem >/dev/null 2>&1; then echo mem=opened; else echo mem=refused; fi; \
                  if mknod /dev/mem2 c 1 1 2>/dev/null; then echo dev=made; else echo dev=refused; fi; \
                  if echo x > /proc/sys/kernel/hostname 2>/dev/null; then echo sysctl=written; else echo sysctl=refused; fi; \
                  echo kcore=$(head -c 16 /proc/kcore | wc -c); \
                  echo hello > /dev/shm/x && echo shm=written";
    p.start("rooted", sh_with(script, json!({ "user": "root" })))
        .await;
    let exit = p.wait("rooted").await;
    assert!(exit.successful(), "{exit:?}: {}", p.log("rooted", "stderr"));
    assert_eq!(
        p.stdout("rooted").lines().collect::<Vec<_>>(),
        [
            "made",
            "mem=refused",
            "dev=refused",
            "sysctl=refused",
            "kcore=0",
            "shm=written"
        ]
    );
}

/// A cgroup that a process runs in, made by hand in the unified hierarchy; the process
/// is killed and the cgroup removed on drop.
struct BusyCgroup {
    name: String,
    process: std::process::Child,
}

impl Drop for BusyCgroup {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        remove_cgroup_tree(&self.name);
    }
}

/// cgroup v2's "no internal processes" rule (v1 has none): a `cgroup_parent` inside a
/// cgroup that processes run in (say the agent's own service cgroup) cannot hold task
/// cgroups with controllers. The start is refused naming that cgroup, and nothing is
/// left.
#[tokio::test]
async fn on_cgroup_v2_a_parent_inside_a_cgroup_with_processes_is_refused_by_name() {
    if !isolation_possible() {
        return;
    }
    if cgroups() != Cgroups::V2 {
        eprintln!("cgroup v1 has no such rule: this test runs in the cgroup v2 guest");
        return;
    }
    let name = format!("drover-test-busy-{}", std::process::id());
    let dir = std::path::Path::new("/sys/fs/cgroup").join(&name);
    std::fs::create_dir(&dir).unwrap();
    let busy = BusyCgroup {
        name: name.clone(),
        process: std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap(),
    };
    std::fs::write(dir.join("cgroup.procs"), busy.process.id().to_string()).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let p = Plugin::launch_below(tmp.path(), json!({}), format!("{name}/tasks")).await;
    let spec = p.spec("inside", sh("true"));
    let err = within(PROMPT, "start", p.client.start_task(spec))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&dir.display().to_string()) && text.contains("holds processes"),
        "{text}"
    );
    assert!(!p.cgroup("inside").exists(), "cgroup left");
    // The fingerprint says so too: the driver is unhealthy with that reason.
    let fp = p.first_fingerprint().await;
    assert_eq!(fp.health, Health::Unhealthy, "{fp:?}");
    assert!(fp.description.contains("holds processes"), "{fp:?}");
    // The process it runs is untouched.
    assert!(alive(busy.process.id()));
}
