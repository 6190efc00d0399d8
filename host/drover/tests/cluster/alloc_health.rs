//! The client's health verdict on a deployment's allocation, end to end through a dev
//! agent (embedded server, real raw_exec tasks): a Nomad job file with
//! `update { min_healthy_time = "1s" healthy_deadline = "20s" }` gets a deployment; the
//! agent reports the allocation healthy once its task ran for a second; a version whose
//! task fails is reported unhealthy at once. What is asserted is what a user sees
//! through Nomad's HTTP API: the allocation's `DeploymentStatus.Healthy`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{dev_agent_with_api as dev_agent, tail};
use common::nomad_http::NomadApi;
use serde_json::Value;

fn get(api: &NomadApi, path: &str) -> Value {
    api.get_ok(path)
}

/// Poll `GET path` until `cond` holds for it.
fn wait_for(
    api: &NomadApi,
    agent: &Agent,
    path: &str,
    what: &str,
    limit: Duration,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let began = Instant::now();
    loop {
        // Not there yet (no deployment before the scheduler made one) is not a match.
        let v = match api.call(http::Method::GET, path, None) {
            Some((200, body)) => serde_json::from_str(&body).unwrap_or(Value::Null),
            Some((_, body)) => Value::String(body),
            None => Value::Null,
        };
        if cond(&v) {
            return v;
        }
        assert!(
            began.elapsed() < limit,
            "{what}: not within {limit:?}; last GET {path}:\n{v:#}\njob: {:#}\nallocations: \
             {:#}\nagent log:\n{}",
            api.call(http::Method::GET, "/v1/jobs", None)
                .map(|(_, b)| b)
                .unwrap_or_default(),
            api.call(http::Method::GET, "/v1/allocations", None)
                .map(|(_, b)| b)
                .unwrap_or_default(),
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn job_file(dir: &Path, name: &str, script: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}-{}.nomad.hcl", script.len()));
    std::fs::write(
        &path,
        format!(
            r#"
job "{name}" {{
  datacenters = ["dc1"]
  type        = "service"

  update {{
    health_check      = "task_states"
    min_healthy_time  = "1s"
    healthy_deadline  = "20s"
    progress_deadline = "30s"
  }}

  group "app" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}

    task "main" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      resources {{
        cpu    = 100
        memory = 32
      }}
    }}
  }}
}}
"#
        ),
    )
    .unwrap();
    path
}

/// The allocation of `job` at `version` once its `DeploymentStatus.Healthy` is set.
fn decided_alloc(api: &NomadApi, agent: &Agent, job: &str, version: u64) -> Value {
    let list = wait_for(
        api,
        agent,
        &format!("/v1/job/{job}/allocations"),
        &format!("the health of version {version}'s allocation decided"),
        Duration::from_secs(60),
        |v| {
            v.as_array().is_some_and(|all| {
                all.iter().any(|a| {
                    a["JobVersion"].as_u64() == Some(version)
                        && a["DeploymentStatus"]["Healthy"].is_boolean()
                })
            })
        },
    );
    let id = list
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|a| a["JobVersion"].as_u64() == Some(version))
                .and_then(|a| a["ID"].as_str())
        })
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no allocation of version {version}: {list:#}"));
    get(api, &format!("/v1/allocation/{id}"))
}

#[test]
fn the_agent_reports_a_deployment_allocation_healthy_once_it_ran_min_healthy_time_or_unhealthy_when_its_task_fails()
 {
    let root = tempfile::tempdir().unwrap();
    let (agent, api) = dev_agent(root.path());
    let job = "health-e2e";

    // v0: a task that keeps running is healthy a second after it started.
    let v0 = job_file(root.path(), job, "exec sleep 1000");
    let started = Instant::now();
    let out = agent.cli(&["job", "run", "--detach", v0.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let a = decided_alloc(&api, &agent, job, 0);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "healthy before min_healthy_time"
    );
    assert_eq!(a["DeploymentStatus"]["Healthy"], true, "{a:#}");
    assert_eq!(a["ClientStatus"], "running");
    assert!(
        a["DeploymentID"].as_str().is_some_and(|d| !d.is_empty()),
        "placed by a deployment: {a:#}"
    );

    // v1: a task that fails (no restarts) is unhealthy, long before the 20 s deadline.
    let v1 = job_file(root.path(), job, "sleep 0.3; exit 3");
    let started = Instant::now();
    let out = agent.cli(&["job", "run", "--detach", v1.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let a = decided_alloc(&api, &agent, job, 1);
    assert_eq!(a["DeploymentStatus"]["Healthy"], false, "{a:#}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "unhealthy by the task's failure, not by the deadline: {a:#}"
    );
    // The health decision and the allocation's end travel in separate updates
    // (as in Nomad); the allocation ends failed right after.
    let id = a["ID"].as_str().expect("allocation id").to_owned();
    let a = wait_for(
        &api,
        &agent,
        &format!("/v1/allocation/{id}"),
        "the failed allocation's client status",
        Duration::from_secs(20),
        |v| !matches!(v["ClientStatus"].as_str(), Some("pending" | "running")),
    );
    assert_eq!(a["ClientStatus"], "failed", "{a:#}");
}
