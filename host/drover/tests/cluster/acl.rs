//! ACLs on a dev agent started with `--acl-enabled` (issue 26, acceptance 1): the
//! bootstrap (once), policies in Nomad's rule language, client and management tokens,
//! expiry, and the checks every route makes, through the HTTP API, the `drover acl`
//! CLI and the real python-nomad client.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::Agent;
use common::cluster::{free_port, tail};
use common::nomad_http::NomadApi;
use serde_json::{Value, json};

/// A dev agent with ACLs on; its HTTP port and the dev (cluster) token.
fn acl_dev_agent(root: &Path) -> (Agent, u16, String) {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(
        root,
        &plugins,
        &["--dev", "--dev-http-addr", &addr, "--acl-enabled"],
    );
    agent.end_tasks = true;
    let api = NomadApi::new(port);
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the dev server's HTTP API answering",
        || api.get_json("/v1/status/leader").is_some(),
    );
    let token_file = agent.data_dir.join("server/dev-token");
    let token = std::fs::read_to_string(&token_file)
        .unwrap_or_else(|e| panic!("the dev token {}: {e}", token_file.display()));
    (agent, port, token.trim().to_owned())
}

/// `drover ARGS` against the server at 127.0.0.1:`port` with `token` (none: no token
/// at all, whatever the test's environment holds).
fn cli(port: u16, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(common::drover());
    c.args(args)
        .env("DROVER_ADDR", format!("http://127.0.0.1:{port}"))
        .env_remove("DROVER_TOKEN")
        .env_remove("NOMAD_TOKEN")
        .env_remove("NOMAD_ADDR");
    if let Some(t) = token {
        c.env("DROVER_TOKEN", t);
    }
    c.output().expect("run drover cli")
}

fn ok_json(out: &Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn job(id: &str) -> Value {
    json!({"Job": {
        "ID": id,
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": 1,
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", "exec sleep 300"]},
                "Resources": {"CPU": 50, "MemoryMB": 32}
            }]
        }]
    }})
}

/// Bootstrap through the CLI: the management token's secret.
fn bootstrap(port: u16, agent: &Agent) -> String {
    let out = cli(port, None, &["acl", "bootstrap", "-json"]);
    let t = ok_json(&out, "acl bootstrap");
    assert_eq!(t["Type"], "management", "{t}");
    let secret = t["SecretID"].as_str().unwrap_or_default().to_owned();
    assert!(
        !secret.is_empty(),
        "{t}\nagent log:\n{}",
        tail(&agent.log_text())
    );
    secret
}

#[test]
fn acls_refuse_anonymous_callers_and_grant_what_policies_say() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, dev_token) = acl_dev_agent(root.path());
    let anonymous = NomadApi::new(port);

    // Before anything: anonymous callers get nothing but the status endpoints.
    let (status, body) = anonymous.call(http::Method::GET, "/v1/jobs", None).unwrap();
    assert_eq!((status, body.as_str()), (403, "Permission denied"));
    let (status, _) = anonymous
        .call(http::Method::PUT, "/v1/jobs", Some(&job("anon")))
        .unwrap();
    assert_eq!(status, 403);
    assert!(anonymous.get_json("/v1/status/leader").is_some());
    // The public keys of workload identities are anyone's to read, as in Nomad.
    let jwks = anonymous.get_ok("/.well-known/jwks.json");
    assert!(jwks["keys"].is_array(), "{jwks}");
    // The cluster token (what every node holds) is no user credential.
    let node_cred = NomadApi::new(port).with_token(&dev_token);
    let (status, body) = node_cred.call(http::Method::GET, "/v1/jobs", None).unwrap();
    assert_eq!((status, body.as_str()), (403, "ACL token not found"));
    let (status, _) = node_cred
        .call(http::Method::PUT, "/v1/jobs", Some(&job("node")))
        .unwrap();
    assert_eq!(status, 403);
    let (status, _) = node_cred
        .call(http::Method::GET, "/v1/nodes", None)
        .unwrap();
    assert_eq!(status, 403);

    // The bootstrap works once.
    let mgmt_secret = bootstrap(port, &agent);
    let again = cli(port, None, &["acl", "bootstrap"]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("ACL bootstrap already done"),
        "{}",
        stderr(&again)
    );
    let mgmt = NomadApi::new(port).with_token(&mgmt_secret);
    let agent_self = mgmt.get_ok("/v1/agent/self");
    assert_eq!(agent_self["config"]["ACL"]["Enabled"], true);

    // A policy with a typo is refused, naming the field.
    let bad = root.path().join("bad.hcl");
    std::fs::write(&bad, "namespace \"default\" {\n  polcy = \"read\"\n}\n").unwrap();
    let out = cli(
        port,
        Some(&mgmt_secret),
        &["acl", "policy", "apply", "bad", bad.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(r#"namespace "default": unknown field "polcy""#),
        "{}",
        stderr(&out)
    );

    // A read-only policy on `default`, and a client token with it.
    let rules = root.path().join("reader.hcl");
    std::fs::write(&rules, "namespace \"default\" {\n  policy = \"read\"\n}\n").unwrap();
    let out = cli(
        port,
        Some(&mgmt_secret),
        &[
            "acl",
            "policy",
            "apply",
            "-description",
            "reads default",
            "reader",
            rules.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let info = ok_json(
        &cli(
            port,
            Some(&mgmt_secret),
            &["acl", "policy", "info", "reader", "-json"],
        ),
        "acl policy info",
    );
    assert_eq!(info["Description"], "reads default");
    let reader = ok_json(
        &cli(
            port,
            Some(&mgmt_secret),
            &[
                "acl", "token", "create", "-name", "r", "-type", "client", "-policy", "reader",
                "-json",
            ],
        ),
        "acl token create",
    );
    let reader_secret = reader["SecretID"].as_str().unwrap().to_owned();
    let reader_api = NomadApi::new(port).with_token(&reader_secret);

    // Management can do everything: register a job, read nodes, list tokens.
    let (status, body) = mgmt
        .call(http::Method::PUT, "/v1/jobs", Some(&job("web")))
        .unwrap();
    assert_eq!(status, 200, "{body}");
    mgmt.get_ok("/v1/nodes");
    let tokens = mgmt.get_ok("/v1/acl/tokens");
    assert_eq!(tokens.as_array().map(Vec::len), Some(2), "{tokens}");
    assert!(
        tokens
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.get("SecretID").is_none()),
        "a listing serves no secret: {tokens}"
    );

    // The reader lists and reads default's jobs...
    let jobs = reader_api.get_ok("/v1/jobs");
    assert!(
        jobs.as_array().unwrap().iter().any(|j| j["ID"] == "web"),
        "{jobs}"
    );
    reader_api.get_ok("/v1/job/web");
    reader_api.get_ok("/v1/job/web/allocations");
    // A token of another team's namespace reaches nothing of `default`'s through the
    // namespace it names: `*` lists only its own namespace's, and naming its own on a
    // default job's path finds no such job there.
    let team = root.path().join("team.hcl");
    std::fs::write(&team, "namespace \"team-a\" {\n  policy = \"write\"\n}\n").unwrap();
    let out = cli(
        port,
        Some(&mgmt_secret),
        &["acl", "policy", "apply", "team-a", team.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let team_token = ok_json(
        &cli(
            port,
            Some(&mgmt_secret),
            &[
                "acl", "token", "create", "-name", "a", "-type", "client", "-policy", "team-a",
                "-json",
            ],
        ),
        "acl token create team-a",
    );
    let team_api = NomadApi::new(port).with_token(team_token["SecretID"].as_str().unwrap());
    for (method, path, want) in [
        (http::Method::GET, "/v1/jobs?namespace=*", 200),
        (http::Method::GET, "/v1/jobs", 403),
        (http::Method::GET, "/v1/job/web?namespace=team-a", 404),
        (http::Method::DELETE, "/v1/job/web?namespace=team-a", 404),
        (http::Method::GET, "/v1/job/web", 403),
        (http::Method::GET, "/v1/allocations?namespace=*", 200),
        (http::Method::GET, "/v1/evaluations?namespace=*", 200),
        (http::Method::GET, "/v1/event/stream", 403),
    ] {
        let (status, body) = team_api.call(method.clone(), path, None).unwrap();
        assert_eq!(status, want, "{method} {path}: {body}");
        if status == 200 {
            assert_eq!(
                body.trim(),
                "[]",
                "{method} {path} showed default's objects"
            );
        }
    }
    mgmt.get_ok("/v1/job/web");

    // ...but not another namespace's, not the nodes, and it cannot submit.
    let (status, body) = reader_api
        .call(http::Method::GET, "/v1/jobs?namespace=b", None)
        .unwrap();
    assert_eq!((status, body.as_str()), (403, "Permission denied"));
    let (status, _) = reader_api
        .call(http::Method::GET, "/v1/nodes", None)
        .unwrap();
    assert_eq!(status, 403);
    let (status, _) = reader_api
        .call(http::Method::DELETE, "/v1/job/web", None)
        .unwrap();
    assert_eq!(status, 403);
    let jobfile = root.path().join("web2.nomad.hcl");
    std::fs::write(
        &jobfile,
        r#"job "web2" {
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 300"]
      }
    }
  }
}
"#,
    )
    .unwrap();
    let out = cli(
        port,
        Some(&reader_secret),
        &["job", "run", "-detach", jobfile.to_str().unwrap()],
    );
    assert!(
        !out.status.success(),
        "job run with a read-only token succeeded"
    );
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    // ...and sees itself and its policy, not the others' tokens.
    let me = ok_json(
        &cli(
            port,
            Some(&reader_secret),
            &["acl", "token", "self", "-json"],
        ),
        "acl token self",
    );
    assert_eq!(me["Name"], "r");
    assert_eq!(me["Policies"], json!(["reader"]));
    let (status, _) = reader_api
        .call(http::Method::GET, "/v1/acl/tokens", None)
        .unwrap();
    assert_eq!(status, 403);

    // Through the agent's socket the caller's token goes along: the socket is no way
    // around the ACLs.
    let via_socket = |token: Option<&str>| {
        let mut c = Command::new(common::drover());
        c.args(["job", "status", "--json"])
            .env("DROVER_ADDR", format!("unix://{}", agent.socket.display()))
            .env_remove("DROVER_TOKEN")
            .env_remove("NOMAD_TOKEN");
        if let Some(t) = token {
            c.env("DROVER_TOKEN", t);
        }
        c.output().unwrap()
    };
    let out = via_socket(None);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let out = via_socket(Some(&reader_secret));
    assert!(out.status.success(), "{}", stderr(&out));

    // An expired token is refused as such.
    let short = ok_json(
        &cli(
            port,
            Some(&mgmt_secret),
            &[
                "acl", "token", "create", "-name", "short", "-policy", "reader", "-ttl", "1s",
                "-json",
            ],
        ),
        "acl token create -ttl",
    );
    assert!(short["ExpirationTime"].is_string(), "{short}");
    let short_api = NomadApi::new(port).with_token(short["SecretID"].as_str().unwrap());
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the 1s token refused as expired",
        || {
            short_api.call(http::Method::GET, "/v1/jobs", None)
                == Some((403, "ACL token expired".to_owned()))
        },
    );

    // A deleted token is gone at once.
    let accessor = reader["AccessorID"].as_str().unwrap();
    let out = cli(
        port,
        Some(&mgmt_secret),
        &["acl", "token", "delete", accessor],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (status, body) = reader_api
        .call(http::Method::GET, "/v1/jobs", None)
        .unwrap();
    assert_eq!((status, body.as_str()), (403, "ACL token not found"));

    // An `anonymous` policy opens what it says to callers without a token.
    let out = cli(
        port,
        Some(&mgmt_secret),
        &[
            "acl",
            "policy",
            "apply",
            "anonymous",
            rules.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    anonymous.get_ok("/v1/jobs");
    let (status, _) = anonymous
        .call(http::Method::PUT, "/v1/jobs", Some(&job("anon")))
        .unwrap();
    assert_eq!(status, 403);

    // Nothing logged a secret.
    let log = agent.log_text();
    for s in [&mgmt_secret, &reader_secret] {
        assert!(!log.contains(s.as_str()), "a token secret in the agent log");
    }
}

/// python-nomad, unchanged, with ACL tokens.
#[test]
fn python_nomad_works_with_acl_tokens() {
    let Some(python) = drover_test_support::nomad::python_nomad() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (agent, port, _) = acl_dev_agent(root.path());
    let mgmt = bootstrap(port, &agent);
    let script = r#"
import sys, nomad
port, mgmt = int(sys.argv[1]), sys.argv[2]
m = nomad.Nomad(host="127.0.0.1", port=port, token=mgmt, timeout=10)
m.acl.create_policy("reader", {"Name": "reader", "Rules": 'namespace "default" { policy = "read" }'})
t = m.acl.create_token({"Name": "py", "Type": "client", "Policies": ["reader"]})
secret = t["SecretID"]
m.job.register_job("pyweb", {"Job": {"ID": "pyweb", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["300"]}}]}]}})
m.namespace.create_namespace({"Name": "team-a", "Description": "team a"})
assert m.namespace.get_namespace("team-a")["Description"] == "team a"
ma = nomad.Nomad(host="127.0.0.1", port=port, token=mgmt, namespace="team-a", timeout=10)
ma.job.register_job("pya", {"Job": {"ID": "pya", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["300"]}}]}]}})
assert [(j["Namespace"], j["ID"]) for j in ma.jobs.get_jobs()] == [("team-a", "pya")], ma.jobs.get_jobs()
assert ma.job.get_job("pya")["Namespace"] == "team-a"
r = nomad.Nomad(host="127.0.0.1", port=port, token=secret, timeout=10)
assert [j["ID"] for j in r.jobs.get_jobs()] == ["pyweb"], r.jobs.get_jobs()
assert r.acl.get_self_token()["Name"] == "py"
try:
    r.job.register_job("evil", {"Job": {"ID": "evil", "TaskGroups": []}})
    sys.exit("a read-only token registered a job")
except nomad.api.exceptions.URLNotAuthorizedNomadException:
    print("refused")
anon = nomad.Nomad(host="127.0.0.1", port=port, timeout=10)
try:
    anon.jobs.get_jobs()
    sys.exit("an anonymous caller listed jobs")
except nomad.api.exceptions.URLNotAuthorizedNomadException:
    print("anonymous refused")
m.job.deregister_job("pyweb", purge=True)
ma.job.deregister_job("pya", purge=True)
print("ok")
"#;
    let out = Command::new(&python)
        .args(["-c", script, &port.to_string(), &mgmt])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "python-nomad with ACL tokens failed:\n{stdout}\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&agent.log_text())
    );
}

/// A job running `script` in raw_exec task `t` of group `g`, with `templates` (Nomad's
/// JSON `Templates`).
fn job_with(id: &str, script: &str, templates: Value) -> Value {
    json!({"Job": {
        "ID": id,
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": 1,
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", script]},
                "Resources": {"CPU": 50, "MemoryMB": 32},
                "Templates": templates
            }]
        }]
    }})
}

/// The runs of web's task so far: (secrets/app.env, $PASSWORD, the file's mode).
fn web_runs(dir: &Path) -> Vec<(String, String, String)> {
    // A run's directory is written as `<t>.tmp` and renamed when whole: one still
    // being written (its `mode` file made, not yet filled) is no run yet.
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_none_or(|x| x != "tmp"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .filter_map(|d| {
            let read = |f: &str| std::fs::read_to_string(d.join(f)).ok();
            Some((
                read("file")?,
                read("env")?.trim().to_owned(),
                read("mode")?.trim().to_owned(),
            ))
        })
        .collect()
}

/// Issue 26, acceptance 3, with ACLs on: a variable at `nomad/jobs/web` reaches web's
/// task through a template (read with the task's own workload identity) into
/// `secrets/app.env`, mode 0600, and into its environment; changing the variable
/// restarts the task with the new value within seconds. Another job's task, with its
/// own workload identity, gets 403 on web's variable.
#[test]
fn a_jobs_variable_reaches_its_task_through_a_template_and_a_change_restarts_it() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, _) = acl_dev_agent(root.path());
    let mgmt = bootstrap(port, &agent);
    let put = |value: &str| {
        let out = cli(
            port,
            Some(&mgmt),
            &["var", "put", "nomad/jobs/web", &format!("password={value}")],
        );
        assert!(out.status.success(), "var put: {}", stderr(&out));
    };
    put("first-s3cret");
    let runs = root.path().join("web-runs");
    std::fs::create_dir_all(&runs).unwrap();
    let script = format!(
        "d={}/$(date +%s%N); mkdir -p $d.tmp; cp $NOMAD_SECRETS_DIR/app.env $d.tmp/file; \
         echo \"$PASSWORD\" > $d.tmp/env; stat -c %a $NOMAD_SECRETS_DIR/app.env > $d.tmp/mode; \
         mv $d.tmp $d; exec sleep 600",
        runs.display()
    );
    let templates = json!([{
        "EmbeddedTmpl": "PASSWORD={{ with nomadVar \"nomad/jobs/web\" }}{{ .password }}{{ end }}\n",
        "DestPath": "secrets/app.env",
        "ChangeMode": "restart",
        "Envvars": true,
        "Perms": "644",
        "Splay": 0
    }]);
    let api = NomadApi::new(port).with_token(&mgmt);
    let (status, body) = api
        .call(
            http::Method::PUT,
            "/v1/jobs",
            Some(&job_with("web", &script, templates)),
        )
        .expect("an answer");
    assert_eq!(status, 200, "{body}");
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "web's task started with the variable rendered",
        || !web_runs(&runs).is_empty(),
    );
    let first = web_runs(&runs);
    assert_eq!(
        first[0],
        (
            "PASSWORD=first-s3cret\n".to_owned(),
            "first-s3cret".to_owned(),
            "600".to_owned()
        ),
        "agent log:\n{}",
        tail(&agent.log_text())
    );

    // The variable changes: the task is restarted with the new value.
    let changed = std::time::Instant::now();
    put("second-s3cret");
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "web's task restarted with the new value",
        || {
            web_runs(&runs)
                .last()
                .is_some_and(|r| r.1 == "second-s3cret" && r.0 == "PASSWORD=second-s3cret\n")
        },
    );
    eprintln!(
        "restarted {:?} after the variable changed",
        changed.elapsed()
    );

    // Another job's workload identity: 403 on web's variable (and nothing else opens).
    let token_copy = root.path().join("other-token");
    let script = format!(
        "cp $NOMAD_SECRETS_DIR/nomad_token {}; exec sleep 600",
        token_copy.display()
    );
    let (status, body) = api
        .call(
            http::Method::PUT,
            "/v1/jobs",
            Some(&job_with("other", &script, json!([]))),
        )
        .expect("an answer");
    assert_eq!(status, 200, "{body}");
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the other job's task copied its workload token",
        || std::fs::read_to_string(&token_copy).is_ok_and(|t| t.split('.').count() == 3),
    );
    let other = std::fs::read_to_string(&token_copy).unwrap();
    let as_other = NomadApi::new(port).with_token(other.trim());
    for path in ["/v1/var/nomad/jobs/web", "/v1/jobs", "/v1/var/nomad/jobs"] {
        let (status, body) = as_other
            .call(http::Method::GET, path, None)
            .expect("an answer");
        assert_eq!(
            status, 403,
            "GET {path} with another job's identity: {body}"
        );
    }
    let listed = as_other.get_ok("/v1/vars?prefix=nomad/jobs");
    assert_eq!(
        listed,
        json!([]),
        "another job's identity lists web's variable"
    );
}

/// A job of namespace `ns` in Nomad's JSON (its task prints its namespace, then sleeps).
fn job_in(ns: &str, id: &str) -> Value {
    let mut j = job(id);
    j["Job"]["Namespace"] = json!(ns);
    j["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]["args"] =
        json!(["-c", "echo \"ns=$NOMAD_NAMESPACE\"; exec sleep 300"]);
    j
}

/// The allocations of job `id` in namespace `ns`, once there is one (as `api` sees them).
fn allocs_of(api: &NomadApi, ns: &str, id: &str) -> Vec<Value> {
    let path = format!("/v1/job/{id}/allocations?namespace={ns}");
    let mut found = Vec::new();
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        &format!("an allocation of job {id} in namespace {ns}"),
        || {
            found = api
                .get_json(&path)
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default();
            !found.is_empty()
        },
    );
    found
}

/// Namespaces (issue 26, acceptance 1): two teams' jobs of the same name live apart; a
/// token with `read` on namespace `a` lists and reads `a`'s and nothing of `b`'s, and
/// cannot submit; namespaces are made and deleted with `drover namespace`, and one that
/// holds a job is not deleted.
#[test]
fn namespaces_keep_two_teams_apart() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, _) = acl_dev_agent(root.path());
    let mgmt_secret = bootstrap(port, &agent);
    let mgmt = NomadApi::new(port).with_token(&mgmt_secret);
    let m = |args: &[&str]| cli(port, Some(&mgmt_secret), args);

    // A job in a namespace that does not exist is refused, naming it.
    let (status, body) = mgmt
        .call(http::Method::PUT, "/v1/jobs", Some(&job_in("a", "web")))
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains(r#"nonexistent namespace "a""#), "{body}");

    for (ns, what) in [("a", "team a"), ("b", "team b"), ("c", "empty")] {
        let out = m(&["namespace", "apply", "-description", what, ns]);
        assert!(
            out.status.success(),
            "namespace apply {ns}: {}",
            stderr(&out)
        );
    }
    let list = ok_json(&m(&["namespace", "list", "-json"]), "namespace list");
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["Name"].as_str())
        .collect();
    assert_eq!(names, ["a", "b", "c", "default"], "{list}");
    let a_info = ok_json(
        &m(&["namespace", "status", "a", "-json"]),
        "namespace status",
    );
    assert_eq!(a_info["Description"], "team a");
    let out = m(&["namespace", "apply", "a/b"]);
    assert!(!out.status.success(), "a namespace named a/b was made");

    // The same job name in both: `a`'s through the CLI's -namespace with an HCL file
    // that names none, `b`'s by the Namespace in the job's JSON with no query at all.
    let hcl = root.path().join("web.nomad.hcl");
    std::fs::write(
        &hcl,
        r#"job "web" {
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 300"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"#,
    )
    .unwrap();
    let out = m(&[
        "job",
        "run",
        "-detach",
        "-namespace",
        "a",
        hcl.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "job run -namespace a: {}",
        stderr(&out)
    );
    let (status, body) = mgmt
        .call(http::Method::PUT, "/v1/jobs", Some(&job_in("b", "web")))
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let a_job = mgmt.get_ok("/v1/job/web?namespace=a");
    let b_job = mgmt.get_ok("/v1/job/web?namespace=b");
    assert_eq!(
        (&a_job["Namespace"], &b_job["Namespace"]),
        (&json!("a"), &json!("b"))
    );
    assert_ne!(
        a_job["TaskGroups"], b_job["TaskGroups"],
        "two jobs, not one"
    );
    let (status, _) = mgmt.call(http::Method::GET, "/v1/job/web", None).unwrap();
    assert_eq!(status, 404, "no web in default");
    let a_alloc = allocs_of(&mgmt, "a", "web")[0]["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    let b_alloc = allocs_of(&mgmt, "b", "web")[0]["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(a_alloc, b_alloc);
    let all = mgmt.get_ok("/v1/jobs?namespace=*");
    let ids: Vec<(String, String)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["Namespace"].as_str().unwrap().into(),
                j["ID"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        ids,
        [("a".into(), "web".into()), ("b".into(), "web".into())]
    );
    // The task runs with its namespace in NOMAD_NAMESPACE.
    let b_alloc_full = mgmt.get_ok(&format!("/v1/allocation/{b_alloc}"));
    assert_eq!(b_alloc_full["Namespace"], "b");
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(200),
        "b's task printing its namespace",
        || {
            mgmt.call(
                http::Method::GET,
                &format!("/v1/client/fs/logs/{b_alloc}?task=t&type=stdout&plain=true&origin=start"),
                None,
            )
            .is_some_and(|(s, body)| s == 200 && body.contains("ns=b"))
        },
    );

    // A reader of `a`.
    let rules = root.path().join("a-read.hcl");
    std::fs::write(
        &rules,
        "namespace \"a\" {\n  policy = \"read\"\n}\nnode {\n  policy = \"read\"\n}\n",
    )
    .unwrap();
    let out = m(&["acl", "policy", "apply", "a-read", rules.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = ok_json(
        &m(&[
            "acl", "token", "create", "-name", "ra", "-policy", "a-read", "-json",
        ]),
        "acl token create",
    );
    let reader_secret = token["SecretID"].as_str().unwrap().to_owned();
    let reader = NomadApi::new(port).with_token(&reader_secret);
    let a_jobs = reader.get_ok("/v1/jobs?namespace=a");
    assert_eq!(a_jobs.as_array().map(Vec::len), Some(1), "{a_jobs}");
    assert_eq!(a_jobs[0]["Namespace"], "a");
    let star = reader.get_ok("/v1/jobs?namespace=*");
    assert_eq!(star, a_jobs, "`*` lists only the namespaces it may read");
    reader.get_ok("/v1/job/web?namespace=a");
    reader.get_ok(&format!("/v1/allocation/{a_alloc}"));
    let evals = reader.get_ok("/v1/evaluations?namespace=*");
    assert!(
        evals
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["Namespace"] == "a"),
        "{evals}"
    );
    for (method, path, body) in [
        (http::Method::GET, "/v1/jobs?namespace=b".to_owned(), None),
        (
            http::Method::GET,
            "/v1/job/web?namespace=b".to_owned(),
            None,
        ),
        (http::Method::GET, "/v1/jobs".to_owned(), None),
        (http::Method::GET, format!("/v1/allocation/{b_alloc}"), None),
        (
            http::Method::GET,
            format!("/v1/client/fs/logs/{b_alloc}?task=t&type=stdout"),
            None,
        ),
        (
            http::Method::GET,
            format!("/v1/client/fs/ls/{b_alloc}?path=/"),
            None,
        ),
        // `read` in its own namespace does not grant `read-fs` (Nomad's).
        (
            http::Method::GET,
            format!("/v1/client/fs/ls/{a_alloc}?path=/"),
            None,
        ),
        (
            http::Method::GET,
            format!("/v1/client/fs/cat/{a_alloc}?path=alloc/logs/t.stdout.0"),
            None,
        ),
        (
            http::Method::PUT,
            format!("/v1/allocation/{b_alloc}/stop"),
            None,
        ),
        (
            http::Method::DELETE,
            "/v1/job/web?namespace=b".to_owned(),
            None,
        ),
        (
            http::Method::PUT,
            "/v1/jobs?namespace=a".to_owned(),
            Some(job_in("a", "more")),
        ),
        // The job's own namespace counts when the query names none.
        (
            http::Method::PUT,
            "/v1/jobs".to_owned(),
            Some(job_in("a", "more")),
        ),
        (
            http::Method::PUT,
            "/v1/namespace/d".to_owned(),
            Some(json!({})),
        ),
    ] {
        let (status, text) = reader.call(method.clone(), &path, body.as_ref()).unwrap();
        assert_eq!(status, 403, "{method} {path}: {text}");
    }
    // Whoever holds `read-fs` there sees the allocation's files (its task's directory
    // once the task has started).
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(200),
        "a's allocation directory listed with its task",
        || {
            let listing = mgmt.get_ok(&format!("/v1/client/fs/ls/{a_alloc}?path=/"));
            let names: Vec<&str> = listing
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|e| e["Name"].as_str())
                .collect();
            names == ["alloc", "t"]
        },
    );
    // `alloc exec` (issue 28, acceptance 2): a reader of `a` has no `alloc-exec`; one
    // with `alloc-exec` only cannot exec into a raw_exec task (a shell there is a
    // shell on the node: `alloc-node-exec`, as Nomad's); with both it can.
    let exec_as = |secret: &str| {
        cli(
            port,
            Some(secret),
            &[
                "alloc",
                "exec",
                "-t=false",
                &a_alloc,
                "t",
                "/bin/sh",
                "-c",
                "echo in-a; exit 7",
            ],
        )
    };
    let out = exec_as(&reader_secret);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let exec_token = |name: &str, caps: &str| {
        let rules = root.path().join(format!("{name}.hcl"));
        std::fs::write(
            &rules,
            format!("namespace \"a\" {{\n  capabilities = [{caps}]\n}}\n"),
        )
        .unwrap();
        let out = m(&["acl", "policy", "apply", name, rules.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let t = ok_json(
            &m(&[
                "acl", "token", "create", "-name", name, "-policy", name, "-json",
            ]),
            "acl token create",
        );
        t["SecretID"].as_str().unwrap().to_owned()
    };
    let exec_only = exec_token("a-exec", "\"alloc-exec\", \"read-job\"");
    let out = exec_as(&exec_only);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let node_exec = exec_token(
        "a-node-exec",
        "\"alloc-exec\", \"alloc-node-exec\", \"read-job\"",
    );
    let out = exec_as(&node_exec);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "in-a\n");
    // Not into another namespace's allocation.
    let out = cli(
        port,
        Some(&node_exec),
        &["alloc", "exec", "-t=false", &b_alloc, "t", "/bin/true"],
    );
    assert!(
        !out.status.success(),
        "exec into b's allocation with a's token"
    );
    // An id prefix of another namespace's object is as unknown as none (prefixes are
    // no way to learn which ids exist there); the whole id is refused.
    for path in [
        format!("/v1/allocation/{}", &b_alloc[..8]),
        format!("/v1/client/allocation/{}/stats", &b_alloc[..8]),
    ] {
        let (status, text) = reader.call(http::Method::GET, &path, None).unwrap();
        assert_eq!(status, 404, "{path}: {text}");
    }
    // `node:read` shows a node's allocations only where the namespace may be read.
    let node_id = mgmt.get_ok(&format!("/v1/allocation/{a_alloc}"))["NodeID"]
        .as_str()
        .unwrap()
        .to_owned();
    let on_node = reader.get_ok(&format!("/v1/node/{node_id}/allocations"));
    let seen_ids: Vec<&str> = on_node
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["ID"].as_str())
        .collect();
    assert_eq!(seen_ids, [a_alloc.as_str()], "{on_node}");
    assert_eq!(
        mgmt.get_ok(&format!("/v1/node/{node_id}/allocations"))
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let seen = ok_json(
        &cli(port, Some(&reader_secret), &["namespace", "list", "-json"]),
        "namespace list as a reader",
    );
    assert_eq!(seen.as_array().map(Vec::len), Some(1), "{seen}");
    assert_eq!(seen[0]["Name"], "a");
    // The CLI reads the namespace from NOMAD_NAMESPACE too.
    let status_out = Command::new(common::drover())
        .args(["job", "status", "web", "--json"])
        .env("DROVER_ADDR", format!("http://127.0.0.1:{port}"))
        .env("DROVER_TOKEN", &reader_secret)
        .env("NOMAD_NAMESPACE", "a")
        .env_remove("DROVER_NAMESPACE")
        .output()
        .unwrap();
    assert!(status_out.status.success(), "{}", stderr(&status_out));
    let out = cli(
        port,
        Some(&reader_secret),
        &["job", "status", "-namespace", "b", "web"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );

    // Variables live in a namespace that exists.
    let out = m(&["var", "put", "-namespace", "a", "nomad/jobs/web", "k=v"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = m(&["var", "put", "-namespace", "nope", "nomad/jobs/web", "k=v"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));

    // Deleting: `default` never, a namespace with a job or a variable not, an empty one.
    for (ns, why) in [
        ("default", "can not be deleted"),
        ("b", "has jobs"),
        ("a", "has jobs"),
    ] {
        let out = m(&["namespace", "delete", ns]);
        assert!(!out.status.success(), "namespace {ns} deleted");
        assert!(stderr(&out).contains(why), "{ns}: {}", stderr(&out));
    }
    let out = m(&["namespace", "delete", "c"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (status, _) = mgmt
        .call(http::Method::GET, "/v1/namespace/c", None)
        .unwrap();
    assert_eq!(status, 404);
    mgmt.get_ok("/v1/job/web?namespace=b");
}
