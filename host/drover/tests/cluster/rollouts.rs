//! Health-gated deployments end to end (issue 25, acceptance 4): a dev agent runs a
//! `python3 -m http.server` service (raw_exec) checked over HTTP; a new version whose
//! check never passes fails within its `healthy_deadline` and the job goes back to
//! its last stable version, whose allocations serve again; a version with a canary
//! waits next to the old copies until `drover deployment promote`. What is asserted
//! is what a user sees: `drover job run`'s exit code, the deployment through Nomad's
//! HTTP API, the allocations, the service answering.
//!
//! The leader change mid-deployment (three servers on etcd) is in `cluster_ha.rs`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{dev_agent_with_api as dev_agent, job_file, python3, tail};
use common::nomad_http::NomadApi;
use serde_json::{Value, json};

/// A service job of `count` copies serving `dir` on the dynamic port `http`, its
/// service `name` checked over HTTP at `check_path` every second; `version` lands in
/// the task's environment (a new version of the task), `update` is the update block.
fn web_job(
    name: &str,
    count: u32,
    dir: &Path,
    python: &str,
    version: u32,
    check_path: &str,
    update: &str,
) -> String {
    format!(
        r#"
name = "{name}"
type = "service"
update = {{ {update} }}

[[group]]
name = "app"
count = {count}

[group.network]
mode = "host"

[[group.network.port]]
label = "http"

[[group.service]]
name = "{name}"
port = "http"
task = "srv"

[[group.service.check]]
name = "health"
type = "http"
path = "{check_path}"
interval = "1s"
timeout = "1s"

[[group.task]]
name = "srv"
driver = "raw_exec"
env = {{ WEB_VERSION = "{version}" }}
config = {{ command = "{python}", args = ["-m", "http.server", "${{NOMAD_PORT_http}}", "--bind", "${{NOMAD_IP_http}}", "--directory", "{dir}"] }}
resources = {{ cpu = 100, memory_mb = 64 }}
"#,
        dir = dir.display(),
    )
}

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
        let v = get(api, path);
        if cond(&v) {
            return v;
        }
        assert!(
            began.elapsed() < limit,
            "{what}: not within {limit:?}; last GET {path}:\n{v:#}\nagent log:\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The allocations of `job` that run (wanted and running), from Nomad's API.
fn running(api: &NomadApi, job: &str) -> Vec<Value> {
    get(api, &format!("/v1/job/{job}/allocations"))
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["DesiredStatus"] == "run" && a["ClientStatus"] == "running")
        .collect()
}

/// `GET /` on an allocation's `http` port: the answer's status line.
fn http_status(api: &NomadApi, alloc_id: &str) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let a = get(api, &format!("/v1/allocation/{alloc_id}"));
    let port = a["AllocatedResources"]["Shared"]["Ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["Label"] == "http"))
        .and_then(|p| p["Value"].as_u64())
        .ok_or_else(|| format!("allocation {alloc_id} has no http port: {a:#}"))?;
    let port = u16::try_from(port).map_err(|e| e.to_string())?;
    let mut c = std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_secs(2),
    )
    .map_err(|e| format!("connect to {port}: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    c.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut s = String::new();
    c.read_to_string(&mut s).map_err(|e| e.to_string())?;
    Ok(s.lines().next().unwrap_or_default().to_owned())
}

/// `drover job run FILE [extra]`: its exit code and output.
fn job_run(agent: &Agent, file: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["job", "run"];
    args.extend_from_slice(extra);
    let file = file.to_str().unwrap();
    args.push(file);
    let out = agent.cli(&args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn a_version_that_never_turns_healthy_fails_and_the_job_goes_back_to_the_stable_one() {
    let Some(python) = python3() else { return };
    let root = tempfile::tempdir().unwrap();
    let (agent, api) = dev_agent(root.path());
    let www = root.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("health"), "ok\n").unwrap();
    std::fs::write(www.join("index.html"), "hello\n").unwrap();
    let update = r#"max_parallel = 1, health_check = "checks", min_healthy_time = "1s", healthy_deadline = "8s", progress_deadline = "30s", auto_revert = true"#;

    // v0: healthy; `job run` follows its deployment to the end.
    let v0 = job_file(
        root.path(),
        "web",
        &web_job("web", 2, &www, &python, 0, "/health", update),
    );
    let (code, out) = job_run(&agent, &v0, &[]);
    assert_eq!(code, 0, "job run of a healthy version:\n{out}");
    let d0 = get(&api, "/v1/job/web/deployment");
    assert_eq!(d0["Status"], "successful", "{d0:#}");
    assert_eq!(d0["JobVersion"], 0);
    assert_eq!(d0["TaskGroups"]["app"]["HealthyAllocs"], 2, "{d0:#}");
    let versions = get(&api, "/v1/job/web/versions");
    assert_eq!(versions["Versions"][0]["Stable"], true, "{versions:#}");
    let v0_allocs: Vec<String> = running(&api, "web")
        .iter()
        .map(|a| a["ID"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(v0_allocs.len(), 2);

    // v1: its check asks for a page that is not there; it never turns healthy.
    let v1 = job_file(
        root.path(),
        "web",
        &web_job("web", 2, &www, &python, 1, "/missing", update),
    );
    let began = Instant::now();
    let (code, out) = job_run(&agent, &v1, &[]);
    let took = began.elapsed();
    assert_ne!(
        code, 0,
        "job run of a version that fails its deployment:\n{out}"
    );
    assert!(
        took < Duration::from_secs(8 + 20),
        "the deployment failed {took:?} after the run: healthy_deadline is 8s\n{out}"
    );
    let deployments = get(&api, "/v1/job/web/deployments");
    let failed = deployments
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["JobVersion"] == 1)
        .unwrap_or_else(|| panic!("no deployment of version 1: {deployments:#}"))
        .clone();
    assert_eq!(failed["Status"], "failed", "{failed:#}");
    let why = failed["StatusDescription"].as_str().unwrap_or_default();
    assert!(
        why.contains("unhealthy") && why.contains("rolling back to job version 0"),
        "{why}"
    );
    assert!(
        out.contains("failed"),
        "job run says the deployment failed:\n{out}"
    );

    // The job is back on v0's spec (as version 2), its deployment succeeds, and two
    // copies of it serve, among them v0's copy that v1 never got to replace.
    let back = wait_for(
        &api,
        &agent,
        "/v1/job/web/deployment",
        "the revert's deployment successful",
        Duration::from_secs(60),
        |d| d["JobVersion"] == 2 && d["Status"] == "successful",
    );
    assert_eq!(back["TaskGroups"]["app"]["DesiredTotal"], 2);
    let job = get(&api, "/v1/job/web");
    assert_eq!(job["Version"], 2);
    assert_eq!(
        job["TaskGroups"][0]["Tasks"][0]["Env"]["WEB_VERSION"], "0",
        "{job:#}"
    );
    let now = running(&api, "web");
    assert_eq!(now.len(), 2, "{now:#?}");
    assert!(
        now.iter()
            .any(|a| v0_allocs.contains(&a["ID"].as_str().unwrap().to_owned())),
        "a copy of v0 that was never replaced still runs: {now:#?}"
    );
    for a in &now {
        let id = a["ID"].as_str().unwrap();
        assert_ne!(a["JobVersion"], 1, "no copy of the failed version runs");
        let status = http_status(&api, id).unwrap();
        assert!(status.contains(" 200 "), "allocation {id}: {status}");
    }
    let healthy = wait_for(
        &api,
        &agent,
        "/v1/service/web",
        "both copies healthy in discovery",
        Duration::from_secs(30),
        |v| v.as_array().is_some_and(|a| a.len() == 2),
    );
    assert_eq!(healthy.as_array().unwrap().len(), 2);
}

#[test]
fn a_canary_waits_next_to_the_old_copies_until_promoted() {
    let Some(python) = python3() else { return };
    let root = tempfile::tempdir().unwrap();
    let (agent, api) = dev_agent(root.path());
    let www = root.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("health"), "ok\n").unwrap();
    std::fs::write(www.join("index.html"), "hello\n").unwrap();
    let update = r#"max_parallel = 1, canary = 1, health_check = "checks", min_healthy_time = "1s", healthy_deadline = "20s""#;
    let v0 = job_file(
        root.path(),
        "canary",
        &web_job("canary", 2, &www, &python, 0, "/health", update),
    );
    let (code, out) = job_run(&agent, &v0, &[]);
    assert_eq!(code, 0, "{out}");
    let old: Vec<String> = running(&api, "canary")
        .iter()
        .map(|a| a["ID"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(old.len(), 2);

    let v1 = job_file(
        root.path(),
        "canary",
        &web_job("canary", 2, &www, &python, 1, "/health", update),
    );
    let (code, out) = job_run(&agent, &v1, &["--detach"]);
    assert_eq!(code, 0, "{out}");
    // One canary, healthy, next to the two old copies; the deployment waits.
    let d = wait_for(
        &api,
        &agent,
        "/v1/job/canary/deployment",
        "the canary healthy",
        Duration::from_secs(60),
        |d| {
            d["JobVersion"] == 1
                && d["TaskGroups"]["app"]["PlacedCanaries"]
                    .as_array()
                    .is_some_and(|c| c.len() == 1)
                && d["TaskGroups"]["app"]["HealthyAllocs"] == 1
        },
    );
    let id = d["ID"].as_str().unwrap().to_owned();
    let canary = d["TaskGroups"]["app"]["PlacedCanaries"][0]
        .as_str()
        .unwrap()
        .to_owned();
    // It stays so: nothing replaces the old copies until the promotion.
    std::thread::sleep(Duration::from_secs(2));
    let d = get(&api, &format!("/v1/deployment/{id}"));
    assert_eq!(
        (
            d["Status"].as_str(),
            d["TaskGroups"]["app"]["Promoted"].as_bool()
        ),
        (Some("running"), Some(false)),
        "{d:#}"
    );
    let now = running(&api, "canary");
    assert_eq!(now.len(), 3, "two old copies and the canary: {now:#?}");
    assert!(
        old.iter()
            .all(|o| now.iter().any(|a| a["ID"] == o.as_str()))
    );
    let c = get(&api, &format!("/v1/allocation/{canary}"));
    assert_eq!(c["DeploymentStatus"]["Canary"], true, "{c:#}");
    assert_eq!(c["DeploymentStatus"]["Healthy"], true, "{c:#}");

    let out = agent.cli(&["deployment", "promote", &id]);
    assert!(
        out.status.success(),
        "deployment promote: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        &api,
        &agent,
        &format!("/v1/deployment/{id}"),
        "the promoted deployment successful",
        Duration::from_secs(60),
        |d| d["Status"] == "successful",
    );
    let now = running(&api, "canary");
    assert_eq!(now.len(), 2, "{now:#?}");
    assert!(now.iter().all(|a| a["JobVersion"] == 1), "{now:#?}");
    assert!(
        now.iter().any(|a| a["ID"] == canary.as_str()),
        "the canary is one of the copies: {now:#?}"
    );
    for a in &now {
        let status = http_status(&api, a["ID"].as_str().unwrap()).unwrap();
        assert!(status.contains(" 200 "), "{status}");
    }
    // A promotion of a finished deployment is refused, saying why.
    let (status, body) = api
        .call(
            http::Method::PUT,
            &format!("/v1/deployment/promote/{id}"),
            Some(&json!({"All": true})),
        )
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("successful"), "{body}");
}
