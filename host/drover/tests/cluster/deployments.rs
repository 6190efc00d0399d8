//! The deployment commands end to end: a dev agent runs a `python3 -m http.server`
//! service (raw_exec, health from the task states); `drover job run` follows the
//! deployment of the version it registered and exits 0 once it is successful;
//! `drover deployment list|status`, `drover job status` and `drover job history` show
//! it as a user reads them; `job scale` rolls out a new version; `job revert` goes
//! back to the first.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{python3, tail, wait_dev_node_ready};

/// A dev agent (its server embedded; the CLI goes through the agent's socket).
fn dev_agent(root: &Path) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut agent = Agent::start(root, &plugins, &["--dev"]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    agent
}

fn web_hcl(python: &str, count: u32) -> String {
    format!(
        r#"
job "web" {{
  type = "service"
  datacenters = ["dc1"]

  update {{
    max_parallel      = 1
    min_healthy_time  = "1s"
    healthy_deadline  = "20s"
    progress_deadline = "40s"
    health_check      = "task_states"
  }}

  group "app" {{
    count = {count}

    network {{
      port "http" {{}}
    }}

    task "srv" {{
      driver = "raw_exec"

      config {{
        command = "{python}"
        args    = ["-m", "http.server", "${{NOMAD_PORT_http}}", "--bind", "${{NOMAD_IP_http}}"]
      }}

      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
  }}
}}
"#
    )
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `drover ARGS`, which must succeed: its stdout.
fn ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?} failed:\n{}\nagent log:\n{}",
        text(&out),
        tail(&agent.log_text())
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `drover ARGS --json`, which must succeed, parsed.
fn json(agent: &Agent, args: &[&str]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json");
    let out = ok(agent, &args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("drover {args:?}: {e}: {out}"))
}

#[test]
fn job_run_follows_the_deployment_and_the_cli_shows_it() {
    let Some(python) = python3() else { return };
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());
    let file = root.path().join("web.nomad.hcl");
    std::fs::write(&file, web_hcl(&python, 2)).unwrap();

    // `job run` returns once the deployment of v0 is successful.
    let out = agent.cli(&["job", "run", file.to_str().unwrap()]);
    let said = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "job run:\n{said}\nagent log:\n{}",
        tail(&agent.log_text())
    );
    assert!(said.contains("==> Monitoring deployment"), "{said}");
    assert!(said.contains("successful"), "{said}");
    assert!(said.contains("2/2 placed, 2 healthy"), "{said}");

    let list = json(&agent, &["deployment", "list"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0]["status"], "successful", "{list:#?}");
    assert_eq!(list[0]["job_name"], "web");
    let id = list[0]["id"].as_str().unwrap().to_owned();
    let table = ok(&agent, &["deployment", "list"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&id[..8]) && l.contains("successful")),
        "{table}"
    );

    let status = ok(&agent, &["deployment", "status", &id[..8]]);
    assert!(status.contains(&format!("ID          = {id}")), "{status}");
    assert!(status.contains("Job ID      = web"), "{status}");
    assert!(status.contains("Job Version = 0"), "{status}");
    assert!(status.contains("Status      = successful"), "{status}");
    let row = status
        .lines()
        .find(|l| l.starts_with("app "))
        .unwrap_or_else(|| panic!("no row of group app:\n{status}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    // Task Group, Desired, Placed, Healthy, Unhealthy, Progress Deadline.
    assert_eq!(cells[..5], ["app", "2", "2", "2", "0"], "{status}");

    let job_status = ok(&agent, &["job", "status", "web"]);
    assert!(job_status.contains("Latest Deployment"), "{job_status}");
    assert!(
        job_status.contains(&format!("ID          = {}", &id[..8])),
        "{job_status}"
    );

    let history = ok(&agent, &["job", "history", "web"]);
    assert_eq!(
        history.lines().take(2).collect::<Vec<_>>(),
        ["Version     = 0", "Stable      = true"],
        "{history}"
    );

    // Scale to 3: a new version rolled out as a deployment of its own.
    ok(&agent, &["job", "scale", "web", "app", "3"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = json(&agent, &["deployment", "list"]);
        let newest = &d.as_array().unwrap()[0];
        if newest["job_version"] == 1 && newest["status"] == "successful" {
            assert_eq!(newest["groups"]["app"]["desired_total"], 3, "{newest:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the scaled version's deployment never succeeded: {d:#}\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let versions = json(&agent, &["job", "history", "web"]);
    let numbers: Vec<(u64, bool)> = versions
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["version"].as_u64().unwrap(),
                v["stable"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(numbers, [(1, true), (0, true)], "{versions:#}");

    // Revert to v0: v2 has v0's count.
    let said = ok(&agent, &["job", "revert", "web", "0"]);
    assert!(said.contains("reverted to version 0"), "{said}");
    let job = json(&agent, &["job", "status", "web"]);
    assert_eq!(job["version"], 2, "{job:#}");
    assert_eq!(job["group"][0]["count"], 2, "{job:#}");
    // A version that is not kept is refused, naming it.
    let out = agent.cli(&["job", "revert", "web", "9"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no version 9"), "{}", text(&out));
    // An unknown deployment: an error naming it, exit 1.
    let out = agent.cli(&["deployment", "fail", "00000000"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("deployment 00000000 not found"),
        "{}",
        text(&out)
    );
}
