//! Templates end to end (issue 26): a dev agent renders a task's `template` blocks
//! before it starts (`env` and `nomadService`, Go template syntax), applies `perms`
//! (0600 under `secrets/` whatever `perms` says), adds an `env = true` file to the
//! task's environment; when the service changes the file renders differently and
//! `change_mode = "restart"` restarts the task within seconds (`signal` sends the
//! task its `change_signal` instead). A destination with `..`
//! is refused when the job is submitted, and a link planted at a destination (by a
//! sibling task, in the shared `alloc/`) is not followed.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::Agent;
use common::cluster::{job_file, wait_dev_node_ready, wait_job};

fn dev_agent(root: &Path) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut agent = Agent::start(root, &plugins, &["--dev"]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    agent
}

fn run(agent: &Agent, root: &Path, name: &str, text: &str) -> std::process::Output {
    let file = job_file(root, name, text);
    agent.cli(&["job", "run", file.to_str().unwrap()])
}

fn run_ok(agent: &Agent, root: &Path, name: &str, text: &str) {
    let out = run(agent, root, name, text);
    assert!(
        out.status.success(),
        "job run {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A service job whose task sleeps, with a service `backend` on its dynamic port.
const BACKEND: &str = r#"
name = "backend"
type = "service"

[[group]]
name = "b"

[group.network]
mode = "host"

[[group.network.port]]
label = "http"

[[group.service]]
name = "backend"
port = "http"
task = "sleeper"

[[group.task]]
name = "sleeper"
driver = "raw_exec"
config = { command = "/bin/sleep", args = ["600"] }
resources = { cpu = 100, memory_mb = 32 }
"#;

/// The front task: each run copies its rendered files and env into ROOT/runs/<n>.
const FRONT: &str = r#"
name = "front"
type = "service"

[[group]]
name = "f"

[[group.task]]
name = "t"
driver = "raw_exec"
config = { command = "/bin/sh", args = ["-c", 'd=ROOT/runs/$(date +%s%N); mkdir -p $d; cp ${NOMAD_TASK_DIR}/app.conf $d/app.conf; echo "$APP_SECRET" > $d/env; stat -c %a ${NOMAD_SECRETS_DIR}/app.env ${NOMAD_TASK_DIR}/perm.txt > $d/modes; exec sleep 600'] }
resources = { cpu = 100, memory_mb = 32 }

[[group.task.template]]
data = '''
task={{ env "NOMAD_TASK_NAME" }}
{{ range nomadService "backend" }}backend={{ .Address }}:{{ .Port }}
{{ end }}'''
destination = "local/app.conf"
change_mode = "restart"
splay = "0s"

[[group.task.template]]
data = "APP_SECRET={{ \"s3cret\" | toUpper }}\n"
destination = "secrets/app.env"
perms = "644"
env = true
change_mode = "noop"

[[group.task.template]]
data = "x"
destination = "local/perm.txt"
perms = "640"
"#;

/// A task that notes each SIGHUP; its template signals it when `backend` changes.
const SIGNALLED: &str = r#"
name = "signalled"
type = "service"

[[group]]
name = "s"

[[group.task]]
name = "t"
driver = "raw_exec"
config = { command = "/bin/sh", args = ["-c", 'trap "echo hup >> ROOT/hups" HUP; touch ROOT/signalled-started; while :; do sleep 0.2; done'] }
resources = { cpu = 100, memory_mb = 32 }

[[group.task.template]]
data = '{{ range nomadService "backend" }}{{ .Port }}{{ end }}'
destination = "local/ports"
change_mode = "signal"
change_signal = "SIGHUP"
splay = "0s"
"#;

/// The runs of the front task so far: (app.conf, env, modes) of each, oldest first.
fn runs(root: &Path) -> Vec<(String, String, String)> {
    let dir = root.join("runs");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .filter_map(|d| {
            Some((
                std::fs::read_to_string(d.join("app.conf")).ok()?,
                std::fs::read_to_string(d.join("env")).ok()?,
                std::fs::read_to_string(d.join("modes")).ok()?,
            ))
        })
        .collect()
}

fn wait_for<T>(what: &str, agent: &Agent, limit: Duration, f: impl Fn() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {limit:?}\nagent log:\n{}",
            common::cluster::tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn templates_render_before_start_and_a_service_change_restarts_the_task() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let agent = dev_agent(root);

    run_ok(&agent, root, "backend", BACKEND);
    let backend = wait_for(
        "the backend service registered",
        &agent,
        Duration::from_secs(60),
        || {
            let v = agent.cli_json(&["service", "info", "backend", "--json"]);
            let a = v.as_array()?.first()?.clone();
            Some(format!(
                "{}:{}",
                a["Address"].as_str()?,
                a["Port"].as_u64()?
            ))
        },
    );

    let front = FRONT.replace("ROOT", &root.display().to_string());
    run_ok(&agent, root, "front", &front);
    let signalled = SIGNALLED.replace("ROOT", &root.display().to_string());
    run_ok(&agent, root, "signalled", &signalled);
    wait_for(
        "the signalled task running",
        &agent,
        Duration::from_secs(60),
        || root.join("signalled-started").exists().then_some(()),
    );
    let first = wait_for(
        "the front task's first run",
        &agent,
        Duration::from_secs(60),
        || runs(root).into_iter().next(),
    );
    assert_eq!(first.0, format!("task=t\nbackend={backend}\n"));
    assert_eq!(first.1, "S3CRET\n", "env = true added APP_SECRET");
    assert_eq!(
        first.2, "600\n640\n",
        "secrets/ is 0600 whatever perms says; perms applies elsewhere"
    );

    // The service goes: the file renders differently and the task restarts.
    let out = agent.cli(&["job", "stop", "backend"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let began = std::time::Instant::now();
    let second = wait_for(
        "the front task restarted",
        &agent,
        Duration::from_secs(60),
        || runs(root).get(1).cloned(),
    );
    assert_eq!(second.0, "task=t\n");
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "restarted only after {:?}",
        began.elapsed()
    );
    // change_mode = "signal": the other task got SIGHUP and was not restarted.
    wait_for(
        "the signalled task got SIGHUP",
        &agent,
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(root.join("hups"))
                .ok()
                .filter(|s| s.contains("hup"))
        },
    );
    let v = agent.cli_json(&["job", "status", "signalled", "--json"]);
    let id = v["allocations"][0]["id"].as_str().unwrap().to_owned();
    let full = agent.cli_json(&["alloc", "status", &id, "--json"]);
    assert_eq!(full["task_states"]["t"]["restarts"], 0, "{full:#}");
    assert_eq!(full["task_states"]["t"]["state"], "running", "{full:#}");

    let status = wait_job(&agent, "front", "the restart counted", |v| {
        v["allocations"].as_array().is_some_and(|a| {
            a.iter().any(|a| {
                let id = a["id"].as_str().unwrap_or_default();
                let full = agent.cli_json(&["alloc", "status", id, "--json"]);
                full["task_states"]["t"]["restarts"].as_u64() >= Some(1)
            })
        })
    });
    drop(status);
}

#[test]
fn template_destinations_stay_in_the_task_dir() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let agent = dev_agent(root);

    // `..` is refused when the job is submitted, naming the field.
    let escape = r#"
name = "escape"
type = "batch"
[[group]]
name = "g"
[[group.task]]
name = "t"
driver = "raw_exec"
config = { command = "/bin/true" }
[[group.task.template]]
data = "x"
destination = "local/../../../etc/evil"
"#;
    let out = run(&agent, root, "escape", escape);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("group[0].task[0].template[0].destination") && err.contains(".."),
        "{err}"
    );

    // A sibling task plants a link where the template goes: refused, not followed.
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("target"), "sentinel\n").unwrap();
    let planted = format!(
        r#"
name = "planted"
type = "batch"
[[group]]
name = "g"
reschedule = {{ attempts = 0 }}
[[group.task]]
name = "plant"
driver = "raw_exec"
lifecycle = {{ hook = "prestart" }}
config = {{ command = "/bin/ln", args = ["-s", "{target}", "${{NOMAD_ALLOC_DIR}}/data/out.conf"] }}
restart = {{ attempts = 0, mode = "fail" }}
[[group.task]]
name = "t"
driver = "raw_exec"
config = {{ command = "/bin/true" }}
restart = {{ attempts = 0, mode = "fail" }}
[[group.task.template]]
data = "overwritten"
destination = "alloc/data/out.conf"
"#,
        target = outside.join("target").display()
    );
    run_ok(&agent, root, "planted", &planted);
    let v = wait_job(&agent, "planted", "the allocation failed", |v| {
        v["allocations"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["client_status"] == "failed"))
    });
    let id = v["allocations"][0]["id"].as_str().unwrap().to_owned();
    let full = agent.cli_json(&["alloc", "status", &id, "--json"]);
    let message = full["task_states"]["t"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("symbolic link"), "{message}");
    assert_eq!(
        std::fs::read_to_string(outside.join("target")).unwrap(),
        "sentinel\n"
    );
}
