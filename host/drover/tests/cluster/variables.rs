//! Variables, the keyring and workload identities end to end (issue 26): a real dev
//! agent (server and client in one, embedded store), the `drover var ...` and
//! `drover operator root keyring ...` CLI, Nomad's HTTP API, and a real raw_exec task
//! that hands its `secrets/nomad_token` to the test. Then several servers on a real
//! etcd sharing one KEK: a variable written through one reads through another, and no
//! key of the store holds its plaintext.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::Agent;
use common::cluster::{free_port, job_file, wait_dev_node_ready};
use common::nomad_http::NomadApi;
use serde_json::{Value, json};

fn dev_agent(root: &Path) -> (Agent, u16, String) {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(root, &plugins, &["--dev", "--dev-http-addr", &addr]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    let token_file = agent.data_dir.join("server/dev-token");
    let token = std::fs::read_to_string(&token_file)
        .unwrap_or_else(|e| panic!("the dev token {}: {e}", token_file.display()));
    (agent, port, token.trim().to_owned())
}

fn ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?} failed: {}\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        common::cluster::tail(&agent.log_text())
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        !out.status.success(),
        "drover {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every byte of every file under `dir`.
fn files_contain(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file()
                && let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

/// A job whose one task copies its workload identity to `out` and sleeps.
fn token_job(name: &str, out: &Path) -> String {
    format!(
        r#"
name = "{name}"
type = "service"

[[group]]
name = "g"

[[group.task]]
name = "t"
driver = "raw_exec"
config = {{ command = "/bin/sh", args = ["-c", "cp \"$NOMAD_SECRETS_DIR/nomad_token\" {out}.tmp && mv {out}.tmp {out} && exec sleep 600"] }}
resources = {{ cpu = 50, memory_mb = 16 }}
"#,
        out = out.display()
    )
}

fn wait_file(path: &Path, agent: &Agent) -> String {
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(100),
        &format!("{} written by the task", path.display()),
        || std::fs::metadata(path).is_ok_and(|m| m.len() > 0),
    );
    let _ = agent;
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn variables_are_written_read_listed_and_purged_with_check_and_set() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, token) = dev_agent(root.path());
    let api = NomadApi::new(port).with_token(&token);
    let marker = format!("plain-marker-{}", std::process::id());

    // --- the CLI ----------------------------------------------------------------
    let out = ok(
        &agent,
        &[
            "var",
            "put",
            "app/config",
            "user=alice",
            &format!("pass={marker}"),
        ],
    );
    assert!(
        out.starts_with("Created variable \"app/config\" with modify index "),
        "{out}"
    );
    let v: Value =
        serde_json::from_str(&ok(&agent, &["var", "get", "app/config", "--out", "json"])).unwrap();
    assert_eq!(v["Items"]["user"], "alice");
    assert_eq!(v["Path"], "app/config");
    assert_eq!(v["Namespace"], "default");
    let first_index = v["ModifyIndex"].as_u64().unwrap();
    assert!(first_index > 0);
    assert_eq!(
        ok(&agent, &["var", "get", "app/config", "-item", "user"]),
        "alice\n"
    );
    let table = ok(&agent, &["var", "get", "app/config"]);
    assert!(
        table.contains("Check Index = ") && table.contains("user = alice"),
        "{table}"
    );
    ok(&agent, &["var", "put", "app/other", "k=v"]);
    ok(&agent, &["var", "put", "web/x", "k=v"]);
    let list = ok(&agent, &["var", "list", "app"]);
    assert!(
        list.contains("app/config") && list.contains("app/other"),
        "{list}"
    );
    assert!(!list.contains("web/x"), "{list}");
    assert_eq!(
        ok(&agent, &["var", "list", "nothing-here"]),
        "No matching variables found\n"
    );

    // --- check-and-set ----------------------------------------------------------
    // cas=0: only if it does not exist: 409 with the variable as it is.
    let body = json!({"Items": {"user": "bob"}});
    let a = api
        .answer(
            http::Method::PUT,
            "/v1/var/app/config?cas=0",
            Some(&body),
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(a.status, 409, "{}", a.body);
    let current = a.json("the conflict");
    assert_eq!(current["ModifyIndex"].as_u64(), Some(first_index));
    assert_eq!(current["Items"]["user"], "alice");
    // The right index writes.
    let a = api
        .answer(
            http::Method::PUT,
            &format!("/v1/var/app/config?cas={first_index}"),
            Some(&body),
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    let written = a.json("the write");
    assert_eq!(written["Items"]["user"], "bob");
    assert!(written["ModifyIndex"].as_u64().unwrap() > first_index);
    // The old index no longer does, through the CLI either.
    let err = fails(
        &agent,
        &[
            "var",
            "put",
            "-check-index",
            &first_index.to_string(),
            "app/config",
            "user=eve",
        ],
    );
    assert!(err.contains("Check-and-Set conflict"), "{err}");
    assert_eq!(
        ok(&agent, &["var", "get", "app/config", "-item", "user"]),
        "bob\n"
    );
    // Bad input names what is wrong and writes nothing.
    for (path, why) in [
        ("/v1/var/nomad/other", "nomad/jobs"),
        ("/v1/var/a%20b", "not allowed"),
    ] {
        let (status, text) = api.call(http::Method::PUT, path, Some(&body)).unwrap();
        assert_eq!(status, 400, "{path}: {text}");
        assert!(text.contains(why), "{path}: {text}");
    }
    let (status, text) = api
        .call(
            http::Method::PUT,
            "/v1/var/app/empty",
            Some(&json!({"Items": {}})),
        )
        .unwrap();
    assert_eq!(status, 400, "{text}");
    let big = json!({"Items": {"k": "x".repeat(65 * 1024)}});
    let (status, text) = api
        .call(http::Method::PUT, "/v1/var/app/big", Some(&big))
        .unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("64KiB"), "{text}");

    // --- purge --------------------------------------------------------------------
    let err = fails(&agent, &["var", "purge", "-check-index", "1", "app/other"]);
    assert!(err.contains("Check-and-Set conflict"), "{err}");
    assert_eq!(
        ok(&agent, &["var", "purge", "app/other"]),
        "Successfully purged variable \"app/other\"!\n"
    );
    let err = fails(&agent, &["var", "get", "app/other"]);
    assert!(err.contains("Variable not found"), "{err}");
    let (status, _) = api
        .call(http::Method::GET, "/v1/var/app/other", None)
        .unwrap();
    assert_eq!(status, 404);
    let (status, _) = api
        .call(http::Method::DELETE, "/v1/var/app/other", None)
        .unwrap();
    assert_eq!(status, 204, "deleting what is not there is no error");

    // --- the keyring --------------------------------------------------------------
    let keys: Value = serde_json::from_str(&ok(
        &agent,
        &["operator", "root", "keyring", "list", "--json"],
    ))
    .unwrap();
    assert_eq!(keys.as_array().map(Vec::len), Some(1), "{keys:#}");
    assert_eq!(keys[0]["State"], "active");
    let old_key = keys[0]["KeyID"].as_str().unwrap().to_owned();
    ok(&agent, &["operator", "root", "keyring", "rotate"]);
    let keys: Value = serde_json::from_str(&ok(
        &agent,
        &["operator", "root", "keyring", "list", "--json"],
    ))
    .unwrap();
    assert_eq!(keys.as_array().map(Vec::len), Some(2), "{keys:#}");
    let states: Vec<(String, String)> = keys
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["KeyID"].as_str().unwrap().to_owned(),
                k["State"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        states.contains(&(old_key.clone(), "inactive".to_owned())),
        "{states:?}"
    );
    assert_eq!(states.iter().filter(|(_, s)| s == "active").count(), 1);
    // What the old key encrypted still reads.
    assert_eq!(
        ok(&agent, &["var", "get", "app/config", "-item", "user"]),
        "bob\n"
    );
    // Re-encrypted with the new key (full), it still reads, its check index unchanged.
    let before: Value =
        serde_json::from_str(&ok(&agent, &["var", "get", "app/config", "--out", "json"])).unwrap();
    ok(&agent, &["operator", "root", "keyring", "rotate", "-full"]);
    let after: Value =
        serde_json::from_str(&ok(&agent, &["var", "get", "app/config", "--out", "json"])).unwrap();
    assert_eq!(after["Items"], before["Items"]);
    assert_eq!(after["ModifyIndex"], before["ModifyIndex"]);

    // --- at rest ----------------------------------------------------------------------
    ok(
        &agent,
        &["var", "put", "app/marked", &format!("m={marker}")],
    );
    let server_dir = agent.data_dir.join("server");
    assert!(server_dir.is_dir(), "{}", server_dir.display());
    let holding = files_contain(&server_dir, marker.as_bytes());
    assert!(
        holding.is_empty(),
        "plaintext of a variable at rest in {holding:?}"
    );
    assert_eq!(
        ok(&agent, &["var", "get", "app/marked", "-item", "m"]).trim(),
        marker
    );
}

#[test]
fn a_workload_identity_reads_its_own_jobs_variables_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, token) = dev_agent(root.path());
    let api = NomadApi::new(port).with_token(&token);
    for (path, value) in [
        ("nomad/jobs/joba", "a"),
        ("nomad/jobs/joba/g", "a-group"),
        ("nomad/jobs/joba/g/t", "a-task"),
        ("nomad/jobs/jobb", "b"),
        ("app/shared", "s"),
    ] {
        ok(&agent, &["var", "put", path, &format!("v={value}")]);
    }
    let out_a = root.path().join("token-a");
    let out_b = root.path().join("token-b");
    let file_a = job_file(root.path(), "joba", &token_job("joba", &out_a));
    let file_b = job_file(root.path(), "jobb", &token_job("jobb", &out_b));
    ok(
        &agent,
        &["job", "run", "--detach", file_a.to_str().unwrap()],
    );
    ok(
        &agent,
        &["job", "run", "--detach", file_b.to_str().unwrap()],
    );
    let jwt_a = wait_file(&out_a, &agent);
    let jwt_b = wait_file(&out_b, &agent);
    assert_eq!(jwt_a.split('.').count(), 3, "a JWT: {jwt_a}");
    assert_ne!(jwt_a, jwt_b);

    // The file in the task's secrets/ is the task user's alone.
    let token_files: Vec<_> = files_contain(&agent.data_dir.join("alloc"), jwt_a.as_bytes())
        .into_iter()
        .filter(|p| p.ends_with("secrets/nomad_token"))
        .collect();
    assert_eq!(token_files.len(), 1, "{token_files:?}");
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(&token_files[0]).unwrap().mode() & 0o777,
        0o600
    );

    let as_a = NomadApi::new(port).with_token(&jwt_a);
    for (path, value) in [
        ("nomad/jobs/joba", "a"),
        ("nomad/jobs/joba/g", "a-group"),
        ("nomad/jobs/joba/g/t", "a-task"),
    ] {
        let v = as_a.get_ok(&format!("/v1/var/{path}"));
        assert_eq!(v["Items"]["v"], value, "{path}");
    }
    for path in [
        "/v1/var/nomad/jobs/jobb",
        "/v1/var/app/shared",
        "/v1/var/nomad/jobs/joba/other",
        "/v1/var/nomad/jobs/joba?namespace=other",
        "/v1/jobs",
        "/v1/operator/keyring/keys",
    ] {
        let (status, text) = as_a.call(http::Method::GET, path, None).unwrap();
        assert_eq!(status, 403, "GET {path} with job A's identity: {text}");
    }
    // Never a write.
    let (status, _) = as_a
        .call(
            http::Method::PUT,
            "/v1/var/nomad/jobs/joba",
            Some(&json!({"Items": {"v": "x"}})),
        )
        .unwrap();
    assert_eq!(status, 403);
    let (status, _) = as_a
        .call(http::Method::DELETE, "/v1/var/nomad/jobs/joba", None)
        .unwrap();
    assert_eq!(status, 403);
    assert_eq!(
        ok(&agent, &["var", "get", "nomad/jobs/joba", "-item", "v"]),
        "a\n"
    );
    // A list shows only what it may read.
    let listed = as_a.get_ok("/v1/vars?prefix=nomad");
    let paths: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "nomad/jobs/joba",
            "nomad/jobs/joba/g",
            "nomad/jobs/joba/g/t"
        ]
    );
    // A forged token (job B's claims under A's signature) is refused.
    let parts: Vec<&str> = jwt_a.split('.').collect();
    let parts_b: Vec<&str> = jwt_b.split('.').collect();
    let forged = format!("{}.{}.{}", parts[0], parts_b[1], parts[2]);
    let (status, _) = NomadApi::new(port)
        .with_token(&forged)
        .call(http::Method::GET, "/v1/var/nomad/jobs/jobb", None)
        .unwrap();
    assert_eq!(status, 403);

    // After a rotation the identity (signed by the old key, kept) still reads.
    ok(&agent, &["operator", "root", "keyring", "rotate"]);
    assert_eq!(as_a.get_ok("/v1/var/nomad/jobs/joba")["Items"]["v"], "a");

    // Once its allocation stopped, it reads nothing.
    ok(&agent, &["job", "stop", "joba"]);
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "job A's identity refused once its allocation stopped",
        || {
            as_a.call(http::Method::GET, "/v1/var/nomad/jobs/joba", None)
                .is_some_and(|(s, _)| s == 403)
        },
    );
    // The operator still reads everything.
    assert_eq!(api.get_ok("/v1/var/nomad/jobs/jobb")["Items"]["v"], "b");
}

#[test]
fn on_etcd_a_variable_written_through_one_server_reads_through_another_and_is_stored_encrypted() {
    let Some(mut cluster) = common::ha::HaCluster::start(2, 0, "10s") else {
        return;
    };
    let marker = format!("etcd-marker-{}", std::process::id());
    let endpoint = cluster.etcd().endpoint();
    let prefix = cluster.prefix.clone();
    let leader = cluster.leader_index().expect("a leader");
    let follower = cluster.follower_of(leader);
    let put = |i: usize, args: &[&str]| {
        let out = cluster.servers[i].cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}\n{}",
            common::ha::text(&out.stderr),
            common::ha::text(&out.stdout)
        );
        common::ha::text(&out.stdout)
    };
    // Written through the follower (forwarded to the leader), read through both.
    put(
        follower,
        &["var", "put", "app/secret", &format!("k={marker}")],
    );
    for i in [leader, follower] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let out = cluster.servers[i].cli(&["var", "get", "app/secret", "-item", "k"]);
            if out.status.success() {
                assert_eq!(common::ha::text(&out.stdout).trim(), marker);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "server {i} never read the variable: {}",
                common::ha::text(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Every key under the cluster's prefix, read from etcd itself.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (kvs, _) = rt.block_on(async {
        let mut o = drover_server::EtcdOptions::new(vec![endpoint]);
        o.prefix = prefix;
        let store = drover_server::EtcdStore::connect(o).await.expect("etcd");
        drover_server::store::Store::range(&store, "")
            .await
            .expect("range")
    });
    assert!(
        kvs.iter()
            .any(|kv| kv.key.contains("var/default/app/secret")),
        "the variable's key"
    );
    assert!(
        kvs.iter().any(|kv| kv.key.contains("rootkey/")),
        "a root key's key"
    );
    for kv in &kvs {
        assert!(
            !kv.value
                .windows(marker.len())
                .any(|w| w == marker.as_bytes()),
            "plaintext under {}",
            kv.key
        );
    }
    // Neither the root keys: a rotation's new key reads through the other server too.
    put(leader, &["operator", "root", "keyring", "rotate", "-full"]);
    let out = cluster.servers[follower].cli(&["var", "get", "app/secret", "-item", "k"]);
    assert_eq!(
        common::ha::text(&out.stdout).trim(),
        marker,
        "{}",
        common::ha::text(&out.stderr)
    );
}

/// The value after `key=` on a line of `log`, once the task has printed it.
fn logged<'a>(log: &'a str, key: &str) -> Option<&'a str> {
    log.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// The one running allocation of `job`, and the output of its task `t` once it holds
/// every line of `keys`.
fn task_output(agent: &Agent, job: &str, keys: &[&str]) -> String {
    let status = common::cluster::wait_job(agent, job, "one running allocation", |v| {
        common::cluster::allocs_with(v, "running").len() == 1
    });
    let alloc = common::cluster::allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut log = String::new();
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        &format!("{job}'s task printing {keys:?}"),
        || {
            log = String::from_utf8_lossy(&agent.cli(&["alloc", "logs", &alloc, "t"]).stdout)
                .into_owned();
            keys.iter().all(|k| logged(&log, k).is_some())
        },
    );
    log
}

/// Exec tasks run as `nobody` (the first says so in its config, the second gets the
/// driver's default): each reads its own workload identity and a template-rendered
/// `secrets/` file, both 0600 and given to its user. Without an `identity` block the
/// token is in `secrets/nomad_token` and not in the environment; with Nomad's
/// `identity { env = true, file = false }` (HCL) it is in `NOMAD_TOKEN` and no file is
/// written, and templates still read variables with it. Each token works as the
/// task's identity.
#[test]
fn non_root_exec_tasks_read_their_identity_and_secrets_as_their_identity_block_says() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port, _token) = dev_agent(root.path());
    wait_dev_node_ready(&agent, &["raw_exec", "exec"], Duration::from_secs(30));
    let marker = format!("id-marker-{}", std::process::id());
    ok(
        &agent,
        &["var", "put", "nomad/jobs/idfile", &format!("pass={marker}")],
    );
    ok(
        &agent,
        &[
            "var",
            "put",
            "nomad/jobs/idenv",
            &format!("pass={marker}-env"),
        ],
    );

    let file_job = job_file(
        root.path(),
        "idfile",
        r#"
name = "idfile"
type = "service"

[[group]]
name = "g"

[[group.task]]
name = "t"
driver = "exec"
config = { command = "/bin/sh", user = "nobody", args = ["-c", 'echo "uid=$(id -u)"; echo "token=$(cat $NOMAD_SECRETS_DIR/nomad_token)"; echo "secret=$(cat $NOMAD_SECRETS_DIR/app.env)"; echo "env=[$NOMAD_TOKEN]"; exec sleep 600'] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task.template]]
data = '{{ with nomadVar "nomad/jobs/idfile" }}PASS={{ .pass }}{{ end }}'
destination = "secrets/app.env"
"#,
    );
    ok(
        &agent,
        &["job", "run", "--detach", file_job.to_str().unwrap()],
    );
    let log = task_output(&agent, "idfile", &["uid", "token", "secret", "env"]);
    let uid = logged(&log, "uid").unwrap();
    assert_ne!(uid, "0", "the exec task runs as nobody: {log}");
    let jwt = logged(&log, "token").unwrap();
    assert_eq!(jwt.split('.').count(), 3, "the task read its token: {log}");
    assert_eq!(
        logged(&log, "secret"),
        Some(format!("PASS={marker}").as_str()),
        "{log}"
    );
    assert_eq!(
        logged(&log, "env"),
        Some("[]"),
        "no NOMAD_TOKEN by default: {log}"
    );
    // On the host: both files the task user's, 0600.
    use std::os::unix::fs::MetadataExt as _;
    for (needle, name) in [
        (jwt.as_bytes(), "secrets/nomad_token"),
        (marker.as_bytes(), "secrets/app.env"),
    ] {
        let files: Vec<_> = files_contain(&agent.data_dir.join("alloc"), needle)
            .into_iter()
            .filter(|p| p.ends_with(name))
            .collect();
        assert_eq!(files.len(), 1, "{name}: {files:?}");
        let m = std::fs::metadata(&files[0]).unwrap();
        assert_eq!(
            (m.uid().to_string().as_str(), m.mode() & 0o777),
            (uid, 0o600),
            "{name}"
        );
    }
    let as_task = NomadApi::new(port).with_token(jwt);
    assert_eq!(
        as_task.get_ok("/v1/var/nomad/jobs/idfile")["Items"]["pass"],
        marker
    );
    verify_with_served_jwks(port, jwt, "idfile");

    // Nomad's HCL: the token in the environment only.
    let env_job = root.path().join("idenv.nomad.hcl");
    std::fs::write(
        &env_job,
        r#"
job "idenv" {
  type = "service"
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args = ["-c", "echo \"uid=$(id -u)\"; if [ -e \"$NOMAD_SECRETS_DIR/nomad_token\" ]; then echo file=yes; else echo file=no; fi; echo \"secret=$(cat $NOMAD_SECRETS_DIR/app.env)\"; echo \"env=$NOMAD_TOKEN\"; exec sleep 600"]
      }
      identity {
        env  = true
        file = false
      }
      template {
        data        = "{{ with nomadVar \"nomad/jobs/idenv\" }}PASS={{ .pass }}{{ end }}"
        destination = "secrets/app.env"
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
"#,
    )
    .unwrap();
    ok(
        &agent,
        &["job", "run", "--detach", env_job.to_str().unwrap()],
    );
    let log = task_output(&agent, "idenv", &["uid", "file", "secret", "env"]);
    assert_ne!(logged(&log, "uid"), Some("0"), "{log}");
    assert_eq!(logged(&log, "file"), Some("no"), "file = false: {log}");
    assert_eq!(
        logged(&log, "secret"),
        Some(format!("PASS={marker}-env").as_str()),
        "{log}"
    );
    let jwt = logged(&log, "env").unwrap();
    assert_eq!(jwt.split('.').count(), 3, "env = true: {log}");
    let as_task = NomadApi::new(port).with_token(jwt);
    assert_eq!(
        as_task.get_ok("/v1/var/nomad/jobs/idenv")["Items"]["pass"],
        format!("{marker}-env")
    );
    let (status, _) = as_task
        .call(http::Method::GET, "/v1/var/nomad/jobs/idfile", None)
        .unwrap();
    assert_eq!(status, 403);
}

/// `jwt` verifies with the key `/.well-known/jwks.json` serves under its `kid`
/// (fetched without a token, as Nomad serves it) and names `job`; the token altered
/// does not.
fn verify_with_served_jwks(port: u16, jwt: &str, job: &str) {
    let (status, text) = NomadApi::new(port)
        .call(http::Method::GET, "/.well-known/jwks.json", None)
        .unwrap();
    assert_eq!(status, 200, "the JWKS without a token: {text}");
    let set: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not a JWK set ({e}): {text}"));
    let kid = jsonwebtoken::decode_header(jwt)
        .unwrap()
        .kid
        .expect("a kid");
    let jwk = set
        .find(&kid)
        .unwrap_or_else(|| panic!("key {kid} not served: {text}"));
    let key = jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    let claims = jsonwebtoken::decode::<Value>(jwt, &key, &validation)
        .unwrap_or_else(|e| panic!("the task's token does not verify with the served key: {e}"))
        .claims;
    assert_eq!(claims["nomad_job_id"], job, "{claims}");
    // One character of the claims changed: the signature no longer holds.
    let parts: Vec<&str> = jwt.split('.').collect();
    let first = if parts[1].starts_with('e') { "f" } else { "e" };
    let forged = format!("{}.{first}{}.{}", parts[0], &parts[1][1..], parts[2]);
    assert!(jsonwebtoken::decode::<Value>(&forged, &key, &validation).is_err());
}
