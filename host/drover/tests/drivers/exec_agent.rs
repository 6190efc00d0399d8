//! The exec and java drivers through the real `drover` binary: the agent loads them
//! as built-ins, runs contained tasks, reports an OOM kill in the Terminated event,
//! and after `kill -9` of the exec plugin and of a task's executor, destroying the
//! task still kills every process of it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::tasks::*;
use common::*;
use drover_api::{TaskEventKind, TaskLifecycle, TaskView};
use serde_json::json;

const CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

/// Root (and for java, a JDK) or skip loudly; under `CI=true`, fail instead.
fn prerequisites(java: bool) -> bool {
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push("root");
    }
    if java {
        for tool in ["javac", "jar"] {
            if Command::new(tool).arg("-version").output().is_err() {
                missing.push(tool);
            }
        }
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "these tests need {missing:?}, and CI=true forbids skipping"
    );
    eprintln!("SKIPPED: these tests need {missing:?}");
    false
}

/// An agent whose exec and java plugins put task cgroups under a parent of their
/// own; on drop, every process in those cgroups and every executor under the data
/// dir is killed and the cgroups removed.
struct Setup {
    root: tempfile::TempDir,
    agent: Option<Agent>,
    parent: String,
}

impl Setup {
    fn start(extra_toml: &str) -> Setup {
        let root = tempfile::tempdir().unwrap();
        let plugins = root.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        let parent = format!(
            "drover-e2e-{}-{}",
            std::process::id(),
            root.path().file_name().unwrap().to_string_lossy()
        );
        let config = root.path().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[plugin.exec]\nconfig = {{ cgroup_parent = \"/{parent}/exec\" }}\n\
                 [plugin.java]\nconfig = {{ cgroup_parent = \"/{parent}/java\" {extra_toml} }}\n"
            ),
        )
        .unwrap();
        let config = config.display().to_string();
        let agent = Agent::start(root.path(), &plugins, &["--config", &config]);
        agent.wait_plugins(Duration::from_secs(20), |rows| {
            ["exec", "java"].iter().all(|n| {
                rows.iter()
                    .any(|r| r["name"] == *n && r["state"] == "healthy")
            })
        });
        Setup {
            root,
            agent: Some(agent),
            parent,
        }
    }

    fn agent(&self) -> &Agent {
        self.agent.as_ref().unwrap()
    }

    fn run(&self, body: serde_json::Value) -> TaskView {
        run(self.agent(), body)
    }

    fn dead(&self, id: &str) -> TaskView {
        until(self.agent(), id, Duration::from_secs(30), "dead", |t| {
            t.state == TaskLifecycle::Dead
        })
    }

    fn cgroup_dir(&self, controller: &str, driver: &str, id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(&self.parent)
            .join(driver)
            .join(id)
    }

    fn logs(&self, id: &str) -> String {
        let out = self.agent().cli(&["task", "logs", id]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn procs(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

impl Drop for Setup {
    fn drop(&mut self) {
        drop(self.agent.take());
        // Executors carry their directory (under the data dir) in their environment.
        let needle = format!("DROVER_EXECUTOR_DIR={}", self.root.path().display());
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env
                .split(|b| *b == 0)
                .any(|kv| kv.starts_with(needle.as_bytes()))
            {
                let _ = nix_kill(pid, 9);
            }
        }
        for _ in 0..50 {
            let mut left = false;
            for c in CONTROLLERS {
                let base = Path::new("/sys/fs/cgroup").join(c).join(&self.parent);
                let mut dirs = vec![base.clone()];
                for driver in ["exec", "java"] {
                    let d = base.join(driver);
                    dirs.push(d.clone());
                    if let Ok(rd) = std::fs::read_dir(&d) {
                        dirs.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
                    }
                }
                for d in dirs.iter().rev().filter(|d| d.exists()) {
                    left = true;
                    if c == "freezer" {
                        let _ = std::fs::write(d.join("freezer.state"), "THAWED");
                    }
                    for pid in procs(&d.join("cgroup.procs")) {
                        let _ = nix_kill(pid, 9);
                    }
                    let _ = std::fs::remove_dir(d);
                }
            }
            if !left {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn exec_tasks_run_contained_and_oom_kills_are_terminated_events() {
    if !prerequisites(false) {
        return;
    }
    let s = Setup::start("");
    let rows = s.agent().cli_json(&["plugin", "status", "--json"]);
    let rows = rows.as_array().cloned().unwrap_or_default();
    let exec = row(&rows, "exec");
    assert_eq!(exec["state"], "healthy", "{exec:#}");

    let task = s.run(json!({
        "driver": "exec",
        "config": {"command": "/bin/sh", "args": ["-c",
            "echo uid=$(id -u) pid=$$ dir=$DROVER_TASK_DIR local=$DROVER_LOCAL_DIR; \
             grep NoNewPrivs /proc/self/status; exit 4"]},
    }));
    let id = task.id.clone();
    let done = s.dead(&id);
    assert_eq!(done.exit_code, Some(4), "{done:#?}");
    let out = s.logs(&id);
    assert!(out.contains("uid=65534 pid=2 dir=/ local=/local"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");

    let hog = s.run(json!({
        "driver": "exec",
        "config": {"command": "/bin/dd", "args": ["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]},
        "resources": {"memory_mb": 32},
    }));
    let id = hog.id.clone();
    let done = s.dead(&id);
    assert!(done.oom_killed, "{done:#?}");
    let terminated = done
        .events
        .iter()
        .find(|e| e.kind == TaskEventKind::Terminated)
        .unwrap_or_else(|| panic!("no Terminated event: {done:#?}"));
    let message = &terminated.message;
    assert!(message.contains("OOM killed"), "{message}");
}

#[test]
fn destroy_kills_every_process_after_kill_9_of_the_exec_plugin_and_the_executor() {
    if !prerequisites(false) {
        return;
    }
    let s = Setup::start("");
    let task = s.run(json!({
        "driver": "exec",
        "config": {"command": "/bin/sh", "args": ["-c", "sleep 1000 & sleep 1000 & wait"]},
    }));
    let id = task.id.clone();
    let executor: u32 = task
        .attributes
        .get("executor_pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no executor_pid: {task:#?}"));
    let procs_file = s.cgroup_dir("pids", "exec", &id).join("cgroup.procs");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pids = loop {
        let pids = procs(&procs_file);
        if pids.len() >= 4 {
            break pids;
        }
        assert!(
            Instant::now() < deadline,
            "task processes never appeared: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    let rows = s.agent().cli_json(&["plugin", "status", "--json"]);
    let plugin = row(rows.as_array().unwrap(), "exec")["pid"]
        .as_u64()
        .unwrap() as u32;
    nix_kill(plugin, 9).unwrap();
    nix_kill(executor, 9).unwrap();
    // The agent relaunches the plugin, which takes the task over through its cgroup.
    let recovered = until(s.agent(), &id, Duration::from_secs(30), "recovered", |t| {
        kinds(t).iter().any(|k| k == "Recovered")
    });
    assert_eq!(recovered.state, TaskLifecycle::Running, "{recovered:#?}");
    assert!(
        pids.iter().all(|&p| running(p)),
        "the task died with its executor"
    );

    let api = s.agent().api();
    let destroyed = api.block_on(api.destroy_task(&id, true));
    assert!(
        destroyed.as_ref().is_ok_and(|d| d.destroyed),
        "{destroyed:?}\n{}",
        s.agent().log_text()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| running(p)) {
        assert!(
            Instant::now() < deadline,
            "task processes survived the destroy"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in CONTROLLERS {
        let cg = s.cgroup_dir(c, "exec", &id);
        assert!(!cg.exists(), "{} is left", cg.display());
    }
}

#[test]
fn a_java_task_runs_a_jar_through_the_agent() {
    if !prerequisites(true) {
        return;
    }
    // The jar lives in a directory the operator adds to the java plugin's chroot.
    let build = tempfile::tempdir().unwrap();
    std::fs::write(
        build.path().join("Main.java"),
        "public class Main { public static void main(String[] a) { \
         System.out.println(\"java says \" + a[0] + \" \" + System.getProperty(\"who\")); \
         System.exit(6); } }",
    )
    .unwrap();
    let ok = Command::new("javac")
        .current_dir(build.path())
        .args(["-d", "classes", "Main.java"])
        .status()
        .unwrap();
    assert!(ok.success());
    let ok = Command::new("jar")
        .current_dir(build.path())
        .args([
            "--create",
            "--file",
            "app.jar",
            "--main-class",
            "Main",
            "-C",
            "classes",
            ".",
        ])
        .status()
        .unwrap();
    assert!(ok.success());
    let chroot: Vec<String> = ["/bin", "/lib", "/lib64", "/usr", "/etc"]
        .iter()
        .map(|p| format!("\"{p}\" = \"{p}\""))
        .chain([format!("\"{}\" = \"/app\"", build.path().display())])
        .collect();
    let s = Setup::start(&format!(", chroot_env = {{ {} }}", chroot.join(", ")));
    let rows = s.agent().cli_json(&["plugin", "status", "--json"]);
    let java = row(rows.as_array().unwrap(), "java");
    assert_eq!(java["state"], "healthy", "{java:#}");

    let task = s.run(json!({
        "driver": "java",
        "config": {"jar_path": "/app/app.jar", "jvm_options": ["-Dwho=drover"], "args": ["hello"]},
    }));
    let id = task.id.clone();
    let done = s.dead(&id);
    assert_eq!(done.exit_code, Some(6), "{done:#?}");
    let out = s.logs(&id);
    assert!(out.contains("java says hello drover"), "{out}");

    // A jar that is not there is refused when the task is submitted.
    let api = s.agent().api();
    let refused = api
        .block_on(api.run_task(&request(
            json!({"driver": "java", "config": {"jar_path": "local/nope.jar"}}),
        )))
        .expect_err("a jar that is not there");
    let status = refused.status();
    assert!(
        status.is_some_and(|s| s.as_u16() >= 400),
        "{status:?}: {refused:?}"
    );
    assert!(
        refused.to_string().contains("local/nope.jar"),
        "{refused:?}"
    );
}
