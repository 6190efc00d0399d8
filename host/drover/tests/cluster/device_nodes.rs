//! Device plugins written on the SDK (issue 27, acceptance 2): the fixture device
//! plugin `drover-fixture-device` (the SDK's `DevicePlugin` trait, served with
//! `serve_device`) in a dev agent's plugin_dir, configured with a device node the test
//! made with mknod (the major:minor of /dev/zero, at its own path). Its reservation is
//! that node at `/dev/<id>`: an exec task can read and write it and opens no other
//! device (a second node the plugin was not asked for, the host paths of both); a
//! docker task sees it as well.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Agent;
use common::cluster::{allocs_with, job_file, tail, wait_dev_node_ready, wait_job};

/// A character device node at `path` with the major:minor of `/dev/zero` (1:5) or
/// `/dev/full` (1:7), mode 0666.
fn mknod(path: &Path, minor: u32) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// A directory anyone may write to (exec tasks run as `nobody`).
fn dir(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// A dev agent with the fixture device plugin (configured with `nodes`) in its
/// plugin_dir and a host volume `results` at `results`, ready once `drivers` are
/// healthy and the plugin's instances are on the node.
fn device_agent(
    root: &Path,
    nodes: &[&Path],
    results: &Path,
    extra: &str,
    drivers: &[&str],
) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    crate::common::copy_exec(
        common::workspace_bin("drover-fixture-device"),
        plugins.join("drover-fixture-device"),
    );
    let list: Vec<String> = nodes
        .iter()
        .map(|n| format!("{:?}", n.display().to_string()))
        .collect();
    let config = root.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "{extra}[plugin.drover-fixture-device]\nconfig = {{ nodes = [{}] }}\n\
             [host_volume.results]\npath = {:?}\n",
            list.join(", "),
            results.display().to_string()
        ),
    )
    .unwrap();
    let mut agent = Agent::start(
        root,
        &plugins,
        &["--dev", "--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, drivers, Duration::from_secs(30));
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "drover-fixture-device" && r["state"] == "healthy")
    });
    let row = rows
        .iter()
        .find(|r| r["name"] == "drover-fixture-device")
        .unwrap();
    assert_eq!(row["type"], "device", "{row:#}");
    // The instance reaches the node's registration, healthy.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = agent.cli_json(&["node", "status", "--json"]);
        let id = list[0]["id"].as_str().unwrap_or_default().to_owned();
        let node = agent.cli_json(&["node", "status", &id, "--json"]);
        let healthy = node["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["vendor"] == "drover" && g["type"] == "test" && g["name"] == "node")
            .flat_map(|g| g["instances"].as_array().cloned().unwrap_or_default())
            .filter(|i| i["healthy"] == true)
            .count();
        if healthy == nodes.len() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture's {} instances healthy: not within 30s; node:\n{node:#}\nagent log:\n{}",
            nodes.len(),
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    agent
}

/// A batch job of one task of `driver` (`config` its inline table) asking for one
/// `drover/test/node` and mounting the `results` volume at /out.
fn device_job(name: &str, driver: &str, config: &str) -> String {
    format!(
        r#"
name = "{name}"
type = "batch"

[[group]]
name = "g"

[group.volume.out]
type = "host"
source = "results"

[[group.task]]
name = "t"
driver = "{driver}"
config = {config}
resources = {{ cpu = 100, memory_mb = 64 }}

[[group.task.device]]
name = "drover/test/node"
count = 1

[[group.task.volume_mount]]
volume = "out"
destination = "/out"
"#
    )
}

/// Run job `name` and wait until its task wrote `done` in `results`; `while_running`
/// looks at it then; the task is released and the job must complete.
fn run_and_finish(
    agent: &Agent,
    root: &Path,
    results: &Path,
    name: &str,
    text: &str,
    while_running: impl FnOnce(),
) {
    let file = job_file(root, name, text);
    let out = agent.cli(&["job", "run", "--detach", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run {name}: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&agent.log_text())
    );
    let done = results.join("done");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done.exists() {
        let v = agent.cli_json(&["job", "status", name, "--json"]);
        assert!(
            allocs_with(&v, "failed").is_empty() && std::time::Instant::now() < deadline,
            "job {name}: its task did not get to the end of its script:\n{v:#}\nagent log:\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    while_running();
    std::fs::write(results.join("release"), "").unwrap();
    let v = wait_job(agent, name, &format!("job {name} finished"), |v| {
        !allocs_with(v, "complete").is_empty() || !allocs_with(v, "failed").is_empty()
    });
    assert_eq!(
        allocs_with(&v, "complete").len(),
        1,
        "job {name} did not complete:\n{v:#}\nagent log:\n{}",
        tail(&agent.log_text())
    );
}

/// The script both tasks run: read 16 bytes of the given node, write to it, and try
/// to open the other node (at the task path it would have, and at both host paths).
fn script(given: &Path, other: &Path) -> String {
    format!(
        "head -c 16 /dev/drover-test0 | od -An -tx1 | tr -d \" \\n\" > /out/read; \
         if echo x > /dev/drover-test0; then echo wrote > /out/write; fi; \
         for p in /dev/drover-other0 {given} {other}; do \
           if head -c 1 $p > /dev/null 2>> /out/refusals; then echo \"opened $p\" >> /out/opened; fi; \
         done; \
         echo \"$FIXTURE_DEVICES\" > /out/env; ls /dev > /out/dev; cat /proc/self/cgroup > /out/cgroup; \
         echo done > /out/done; \
         i=0; while [ ! -e /out/release ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
        given = given.display(),
        other = other.display()
    )
}

fn check_results(agent: &Agent, results: &Path, what: &str) {
    let log = || tail(&agent.log_text());
    assert_eq!(
        read(&results.join("done")).trim(),
        "done",
        "{what}\n{}",
        log()
    );
    assert_eq!(
        read(&results.join("read")).trim(),
        "00".repeat(16),
        "{what}: 16 zero bytes from /dev/drover-test0\n{}",
        log()
    );
    assert_eq!(read(&results.join("write")).trim(), "wrote", "{what}");
    assert_eq!(read(&results.join("env")).trim(), "drover-test0", "{what}");
    assert!(
        !results.join("opened").exists(),
        "{what}: opened a device it was not given: {}",
        read(&results.join("opened"))
    );
    let refusals = read(&results.join("refusals"));
    assert_eq!(
        refusals.lines().count(),
        3,
        "{what}: three refused opens:\n{refusals}"
    );
    assert!(
        read(&results.join("dev"))
            .lines()
            .any(|l| l == "drover-test0"),
        "{what}: {}",
        read(&results.join("dev"))
    );
}

#[test]
fn an_sdk_device_plugins_device_node_is_given_to_exec_and_docker_tasks() {
    let root = tempfile::tempdir().unwrap();
    // Nodes at the test's own paths: the plugin is told about `drover-test0` only.
    let nodes = root.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let given = nodes.join("drover-test0");
    let other = nodes.join("drover-other0");
    mknod(&given, 5);
    mknod(&other, 7);
    let results = dir(root.path(), "results");
    // The docker task mounts it writable: nosuid,nodev where the host sees it.
    let _safe = common::NosuidNodev::mount(&results);
    let docker = drover_test_support::docker::docker_env();
    let (extra, drivers): (String, Vec<&str>) = match &docker {
        Some(env) => (
            format!(
                "[plugin.docker]\nconfig = {{ endpoint = \"{}\" }}\n",
                env.host
            ),
            vec!["exec", "docker"],
        ),
        None => (String::new(), vec!["exec"]),
    };
    let agent = device_agent(root.path(), &[&given], &results, &extra, &drivers);

    // exec: the node is in the task's /dev; nothing else is.
    let config = format!(
        "{{ command = \"/bin/sh\", args = [\"-c\", '{}'] }}",
        script(&given, &other)
    );
    run_and_finish(
        &agent,
        root.path(),
        &results,
        "exec-dev",
        &device_job("exec-dev", "exec", &config),
        || {
            // cgroup v1: the task is in a devices cgroup that denies every device but
            // its /dev's (the given node is /dev/zero's 1:5).
            let cgroups = read(&results.join("cgroup"));
            if let Some(path) = cgroups
                .lines()
                .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_owned()))
            {
                let list = read(
                    &Path::new("/sys/fs/cgroup/devices")
                        .join(path.trim_start_matches('/'))
                        .join("devices.list"),
                );
                assert!(
                    !list.contains("a *:* rwm") && list.contains("c 1:5 rw"),
                    "the exec task's devices cgroup {path}: {list}"
                );
            }
        },
    );
    check_results(&agent, &results, "exec");

    // docker: the container sees it too (HostConfig.Devices).
    let Some(env) = docker else {
        return;
    };
    for f in std::fs::read_dir(&results).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    let config = format!(
        "{{ image = \"{}\", command = \"/bin/sh\", args = [\"-c\", '{}'] }}",
        env.image,
        script(&given, &other)
    );
    run_and_finish(
        &agent,
        root.path(),
        &results,
        "docker-dev",
        &device_job("docker-dev", "docker", &config),
        || {},
    );
    check_results(&agent, &results, "docker");
}

/// The built-in device plugin `device_nodes` (served by the `drover` binary itself,
/// nothing in plugin_dir), configured with a node the test made, shared by 2 tasks:
/// the node shows 2 instances; an exec task asking for one gets the node at
/// `/dev/<file name>` and reads it; a job asking for 3 is blocked, naming the device.
#[test]
fn the_built_in_device_nodes_plugin_offers_configured_nodes_in_shares() {
    let root = tempfile::tempdir().unwrap();
    // The plugin takes nodes below /dev only: one of the test's own there, removed
    // at the end.
    struct Removed(PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let file = format!("drover-zero-{}", std::process::id());
    let zero = Path::new("/dev").join(&file);
    let _ = std::fs::remove_file(&zero);
    mknod(&zero, 5);
    let _removed = Removed(zero.clone());
    let results = dir(root.path(), "results");
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[plugin.device_nodes]\nconfig = {{ groups = [{{ vendor = \"drover\", type = \
             \"test\", name = \"zero\", paths = [{:?}], shares = 2, permissions = \"r\" }}] }}\n\
             [host_volume.results]\npath = {:?}\n",
            zero.display().to_string(),
            results.display().to_string()
        ),
    )
    .unwrap();
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &["--dev", "--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["exec"], Duration::from_secs(30));
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "device_nodes" && r["state"] == "healthy")
    });
    let row = rows.iter().find(|r| r["name"] == "device_nodes").unwrap();
    assert_eq!(row["type"], "device", "{row:#}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = agent.cli_json(&["node", "status", "--json"]);
        let id = list[0]["id"].as_str().unwrap_or_default().to_owned();
        let node = agent.cli_json(&["node", "status", &id, "--json"]);
        let mut ids: Vec<String> = node["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["vendor"] == "drover" && g["type"] == "test" && g["name"] == "zero")
            .flat_map(|g| g["instances"].as_array().cloned().unwrap_or_default())
            .filter(|i| i["healthy"] == true)
            .filter_map(|i| i["id"].as_str().map(str::to_owned))
            .collect();
        ids.sort();
        if ids == [format!("{file}-0"), format!("{file}-1")] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "2 shares of {file} on the node: not within 30s; node:\n{node:#}\nagent log:\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let job = device_job(
        "zero-reader",
        "exec",
        &"{ command = \"/bin/sh\", args = [\"-c\", 'head -c 16 /dev/FILE | od -An -tx1 | tr -d \" \\n\" > /out/read; echo done > /out/done; i=0; while [ ! -e /out/release ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done'] }"
            .replace("FILE", &file),
    )
    .replace("drover/test/node", "drover/test/zero");
    run_and_finish(&agent, root.path(), &results, "zero-reader", &job, || {});
    assert_eq!(read(&results.join("read")).trim(), "00".repeat(16));
    let too_many = device_job("too-many", "exec", "{ command = \"/bin/true\" }").replace(
        "name = \"drover/test/node\"\ncount = 1",
        "name = \"drover/test/zero\"\ncount = 3",
    );
    let file = job_file(root.path(), "too-many", &too_many);
    let out = agent.cli(&["job", "run", "--detach", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_job(
        &agent,
        "too-many",
        "too-many blocked, naming the device",
        |v| {
            v["placement_failures"]["g"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("drover/test/zero"))
        },
    );
}
