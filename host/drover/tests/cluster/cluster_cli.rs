//! `drover server`, `drover agent --dev` and the cluster commands, as real processes on
//! 127.0.0.1.
//!
//! Tests marked `needs the merge` drive jobs end to end: they need the server core
//! (cluster-core), the scheduler (cluster-sched), the node RPCs and API forwarding on
//! the server (cluster-rpc) and the allocation runners (cluster-allocs). They are
//! ignored on the cluster-http branch and meant to run once all are merged.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{drover, nix_kill};
use drover_test_support::pki::TestCa;
use drover_test_support::until_blocking;

/// A `drover server` process, stopped when dropped.
struct ServerProc {
    child: Child,
    log: PathBuf,
    http: String,
}

impl ServerProc {
    fn start(root: &Path, extra: &[&str]) -> ServerProc {
        let log = root.join("server.log");
        let child = Command::new(drover())
            .args(["server", "--data-dir"])
            .arg(root.join("server"))
            .args(["--http-addr", "127.0.0.1:0", "--rpc-addr", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start drover server");
        let mut s = ServerProc {
            child,
            log,
            http: String::new(),
        };
        s.http = s.wait_for_log_field("drover server listening", "http=");
        s
    }

    /// The value of `field` on the first log line with `what`.
    fn wait_for_log_field(&mut self, what: &str, field: &str) -> String {
        let mut found = None;
        until_blocking(
            Duration::from_secs(20),
            Duration::from_millis(20),
            what,
            || {
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!("drover server exited with {status}:\n{}", self.log_text());
                }
                found = log_field(&self.log_text(), what, field);
                found.is_some()
            },
        );
        found.unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn cli(&self, token: Option<&str>, args: &[&str]) -> Output {
        cli(&self.http, token, args)
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `field=VALUE` on the first line of `log` that contains `what`.
fn log_field(log: &str, what: &str, field: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains(what))?;
    let at = line.find(field)? + field.len();
    Some(line[at..].split_whitespace().next()?.to_owned())
}

/// Run the CLI against `address`, with `DROVER_TOKEN` set or not.
fn cli(address: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(drover());
    cmd.args(args)
        .env("DROVER_ADDR", address)
        .env_remove("DROVER_TOKEN");
    if let Some(t) = token {
        cmd.env("DROVER_TOKEN", t);
    }
    cmd.output().expect("run drover")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn a_server_starts_answers_and_stops_on_sigterm() {
    let root = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(root.path(), &[]);
    assert!(
        server.http.starts_with("http://127.0.0.1:"),
        "{}",
        server.http
    );
    let out = server.cli(None, &["node", "status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        serde_json::json!([])
    );
    let out = server.cli(None, &["job", "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("ID "),
        "{}",
        text(&out.stdout)
    );
    // An unknown job is the server's 404, said as the server says it.
    let out = server.cli(None, &["job", "status", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("/v1/job/nope") && err.contains("404") && err.contains("job not found"),
        "{err}"
    );
    nix_kill(server.child.id(), 15).unwrap();
    let mut status = None;
    until_blocking(
        Duration::from_secs(15),
        Duration::from_millis(20),
        "server exit after SIGTERM",
        || {
            status = server.child.try_wait().unwrap();
            status.is_some()
        },
    );
    assert!(status.unwrap().success(), "{}", server.log_text());
    assert!(server.log_text().contains("drover server stopped"));
}

#[test]
fn a_server_refuses_bad_flags_naming_them_before_it_listens() {
    let root = tempfile::tempdir().unwrap();
    let private = |path: &Path| {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    };
    let empty = root.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    private(&empty);
    // A token every user of the host can read: anyone could act as a node or submit jobs.
    let readable = root.path().join("readable-token");
    std::fs::write(&readable, "correct-horse\n").unwrap();
    std::fs::set_permissions(
        &readable,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let readable_msg = format!(
        "--token-file: token file {}: mode 644 lets every user",
        readable.display()
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let data = root.path().join("data");
    let data = data.to_str().unwrap();
    let empty = empty.to_str().unwrap();
    let readable = readable.to_str().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (
            &["--http-addr", "localhost:80"],
            "invalid value 'localhost:80' for '--http-addr <IP:PORT>'",
        ),
        (
            &["--rpc-addr", "127.0.0.1"],
            "invalid value '127.0.0.1' for '--rpc-addr <IP:PORT>'",
        ),
        (
            &["--token-file", "/nonexistent/token"],
            "drover: --token-file: token file /nonexistent/token: No such file or directory",
        ),
        (&["--token-file", empty], "is empty"),
        (&["--token-file", readable], &readable_msg),
        (
            &["--heartbeat-grace", "a bit"],
            "invalid value 'a bit' for '--heartbeat-grace",
        ),
        (&["--tls-key-file", "/k.pem"], "--tls-cert-file"),
        (
            &[
                "--tls-cert-file",
                "/nonexistent/c.pem",
                "--tls-key-file",
                "/nonexistent/k.pem",
            ],
            "drover: cannot read the TLS certificate file /nonexistent/c.pem",
        ),
    ];
    for (flags, want) in cases {
        let out = Command::new(drover())
            .args(["server", "--data-dir", data])
            .args(flags)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(want),
            "{flags:?}: {}",
            text(&out.stderr)
        );
        assert!(!Path::new(data).exists(), "{flags:?} created the data dir");
    }
    // A port in use: said with the flag, and nothing is left half started.
    let out = Command::new(drover())
        .args([
            "server",
            "--data-dir",
            data,
            "--http-addr",
            "127.0.0.1:0",
            "--rpc-addr",
            &busy_addr,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {busy_addr} (--rpc-addr)"))
            && err.contains("in use"),
        "{err}"
    );
    assert!(!Path::new(data).exists());
}

#[test]
fn with_a_token_file_every_request_needs_the_token_and_refusals_do_not_stop_the_server() {
    let root = tempfile::tempdir().unwrap();
    let token = root.path().join("token");
    std::fs::write(&token, "correct-horse\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let server = ServerProc::start(root.path(), &["--token-file", token.to_str().unwrap()]);
    assert!(
        !server.log_text().contains("correct-horse"),
        "the token is in the log"
    );
    let job = root.path().join("web.toml");
    std::fs::write(&job, WEB_JOB).unwrap();
    for (given, want) in [
        (None, "this server requires a token"),
        (Some("wrong"), "invalid token"),
    ] {
        for args in [
            &["job", "status"][..],
            &["node", "status"],
            &["job", "run", job.to_str().unwrap()],
            &["job", "stop", "web"],
        ] {
            let out = server.cli(given, args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let err = text(&out.stderr);
            assert!(
                err.contains(want) && err.contains("DROVER_TOKEN"),
                "{args:?}: {err}"
            );
        }
    }
    let out = server.cli(Some("correct-horse"), &["job", "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !server.log_text().contains("correct-horse"),
        "the token is in the log"
    );
}

#[test]
fn a_dev_agent_runs_a_server_beside_it_and_its_tasks_keep_working() {
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let mut agent = common::Agent::start(root.path(), &plugins, &["--dev"]);
    agent.end_tasks = true;
    let mut http = None;
    until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(20),
        "dev server started",
        || {
            http = log_field(&agent.log_text(), "dev server started", "http=");
            http.is_some()
        },
    );
    let http = http.unwrap();
    assert!(http.starts_with("http://127.0.0.1:"), "{http}");
    assert!(agent.data_dir.join("server").is_dir());
    // The server answers on its own address, to whoever has the dev token (a fresh
    // one, in a 0600 file of the agent's data dir): it runs rawexec jobs as root.
    let out = cli(&http, None, &["node", "status", "--json"]);
    assert!(
        !out.status.success(),
        "the dev server answered without its token"
    );
    let token_file = agent.data_dir.join("server/dev-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let token = std::fs::read_to_string(&token_file).unwrap();
    let out = cli(&http, Some(token.trim()), &["node", "status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The task commands keep working beside it.
    let out = agent.cli(&["task", "list", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = agent.stop();
    assert!(status.success(), "{}", agent.log_text());
}

const WEB_JOB: &str = r#"name = "web"
type = "service"
[[group]]
name = "app"
count = 3
[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sh", args = ["-c", "echo hello from $DROVER_ALLOC_ID; exec sleep 1000"] }
resources = { cpu = 100, memory_mb = 64 }
"#;

const BATCH_JOB: &str = r#"name = "once"
type = "batch"
[[group]]
name = "work"
[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sh", args = ["-c", "echo done"] }
resources = { cpu = 100, memory_mb = 32 }
"#;

/// A job for a driver no node has (not qemu: a dev agent on a machine with
/// qemu-system-x86_64 detects it, sooner or later).
const VM_JOB: &str = r#"name = "vm"
[[group]]
name = "g"
[[group.task]]
name = "main"
driver = "firecracker"
config = {}
"#;

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn dev_mode_runs_jobs_from_files_through_the_agent_socket() {
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let mut agent = common::Agent::start(root.path(), &plugins, &["--dev"]);
    agent.end_tasks = true;
    let sock = format!("unix://{}", agent.socket.display());
    let write = |name: &str, body: &str| {
        let p = root.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let web = write("web.toml", WEB_JOB);
    let once = write("once.toml", BATCH_JOB);
    // The node registers with the dev server first.
    until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the node ready",
        || {
            let nodes = json(&cli(&sock, None, &["node", "status", "--json"]));
            // Ready with rawexec fingerprinted: a node can register before its
            // drivers' first fingerprint, and `job run` would then place nothing.
            nodes.as_array().is_some_and(|n| {
                n.len() == 1
                    && n[0]["status"] == "ready"
                    && n[0]["drivers"]["raw_exec"]["healthy"] == true
            })
        },
    );
    let out = cli(&sock, None, &["job", "run", &web]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout).matches("Allocation \"").count(),
        3,
        "{}",
        text(&out.stdout)
    );
    let out = cli(&sock, None, &["job", "run", &once]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "web running",
        || {
            let s = json(&cli(&sock, None, &["job", "status", "web", "--json"]));
            let allocs = s["allocations"].as_array().unwrap();
            allocs.len() == 3
                && allocs.iter().all(|a| {
                    a["client_status"] == "running"
                        && a["task_states"]["main"]["state"] == "running"
                })
        },
    );
    until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "once complete",
        || {
            let s = json(&cli(&sock, None, &["job", "status", "once", "--json"]));
            s["allocations"].as_array().unwrap().iter().any(|a| {
                a["client_status"] == "complete" && a["task_states"]["main"]["exit_code"] == 0
            })
        },
    );
    let s = json(&cli(&sock, None, &["job", "status", "web", "--json"]));
    let alloc = s["allocations"][0]["id"].as_str().unwrap().to_owned();
    // "running" says the task started, not that its output reached the log yet.
    let mut logs = String::new();
    until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the task's line in alloc logs",
        || {
            let out = cli(&sock, None, &["alloc", "logs", &alloc, "main"]);
            assert!(out.status.success(), "{}", text(&out.stderr));
            logs = text(&out.stdout);
            !logs.is_empty()
        },
    );
    assert_eq!(logs, format!("hello from {alloc}\n"));
    let st = json(&cli(
        &sock,
        None,
        &["alloc", "status", &alloc[..8], "--json"],
    ));
    assert_eq!(st["id"], alloc.as_str());
    // A job no node can run is accepted, placed nowhere, and says why.
    let vm = write("vm.toml", VM_JOB);
    let out = cli(&sock, None, &["job", "run", &vm]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("firecracker"),
        "{}",
        text(&out.stdout)
    );
    let out = cli(&sock, None, &["job", "status", "vm"]);
    assert!(
        text(&out.stdout).contains("Placement Failures"),
        "{}",
        text(&out.stdout)
    );
    // Stopping waits until the job's allocations ended, and leaves no task behind
    // (the batch job's task completed; the qemu job placed nothing).
    let out = cli(&sock, None, &["job", "stop", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = json(&cli(&sock, None, &["job", "status", "web", "--json"]));
    assert!(
        s["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["client_status"] == "complete"),
        "{s:#}"
    );
    let tasks = json(&agent.cli(&["task", "list", "--json"]));
    let live: Vec<_> = tasks
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] != "dead")
        .collect();
    assert!(live.is_empty(), "{live:#?}");
    let status = agent.stop();
    assert!(status.success());
}

#[test]
fn a_misspelt_key_in_a_job_file_is_refused_with_its_line_before_anything_is_sent() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("bad.toml");
    std::fs::write(&file, WEB_JOB.replace("count = 3", "cuont = 3")).unwrap();
    // Nothing listens there: the file is refused before any request.
    let out = cli(
        "http://127.0.0.1:1",
        None,
        &["job", "run", file.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:5: group[0].cuont: unknown field `cuont`",
            file.display()
        )),
        "{err}"
    );
    let out = cli(
        "http://127.0.0.1:1",
        None,
        &["job", "plan", file.to_str().unwrap()],
    );
    assert!(
        text(&out.stderr).contains(":5: group[0].cuont"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_client_agent_forwards_the_cluster_commands_with_its_token() {
    let root = tempfile::tempdir().unwrap();
    let token = root.path().join("token");
    std::fs::write(&token, "agent-and-server\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut server = ServerProc::start(root.path(), &["--token-file", token.to_str().unwrap()]);
    let rpc = server.wait_for_log_field("drover server listening", "rpc=");
    let agent_root = root.path().join("agent");
    std::fs::create_dir(&agent_root).unwrap();
    let plugins = agent_root.join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let mut agent = common::Agent::start(
        &agent_root,
        &plugins,
        &[
            "--servers",
            &rpc,
            "--node-name",
            "n1",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    agent.end_tasks = true;
    let sock = format!("unix://{}", agent.socket.display());
    // Through the socket, without DROVER_TOKEN: the agent sends its own.
    until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "n1 ready with rawexec",
        || {
            let nodes = json(&cli(&sock, None, &["node", "status", "--json"]));
            nodes.as_array().is_some_and(|n| {
                n.len() == 1
                    && n[0]["name"] == "n1"
                    && n[0]["status"] == "ready"
                    && n[0]["drivers"]["raw_exec"]["healthy"] == true
            })
        },
    );
    let web = root.path().join("web.toml");
    std::fs::write(&web, WEB_JOB).unwrap();
    let out = cli(&sock, None, &["job", "run", web.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout).matches("node \"n1\"").count(),
        3,
        "{}",
        text(&out.stdout)
    );
    let status = json(&cli(&sock, None, &["job", "status", "web", "--json"]));
    assert_eq!(status["allocations"].as_array().unwrap().len(), 3);
    assert!(
        status["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["node_name"] == "n1" && a["desired_status"] == "run")
    );
    // The same answers straight from the server, with the token.
    let direct = json(&server.cli(
        Some("agent-and-server"),
        &["job", "status", "web", "--json"],
    ));
    // Client statuses move on between the two reads; what was placed does not.
    let placed = |v: &serde_json::Value| -> Vec<String> {
        let mut p: Vec<String> = v["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| format!("{} {} {}", a["id"], a["node_id"], a["group"]))
            .collect();
        p.sort();
        p
    };
    assert_eq!(placed(&direct), placed(&status));
    let out = cli(&sock, None, &["job", "stop", "web", "--detach"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(server.child.try_wait().unwrap().is_none());
}

/// A CA (`ca.pem`) and a certificate for 127.0.0.1 signed by it (`server.pem`,
/// `server.key`, mode 0600 as the server requires of a key), written to `dir`.
fn certificates(dir: &Path) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("127.0.0.1");
    std::fs::write(dir.join("ca.pem"), &ca.ca_pem).unwrap();
    std::fs::write(dir.join("server.pem"), cert).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("server.key"))
        .and_then(|mut f| f.write_all(key.as_bytes()))
        .unwrap();
}

#[test]
fn with_certificates_the_server_speaks_https_to_clients_that_trust_its_ca() {
    let root = tempfile::tempdir().unwrap();
    certificates(root.path());
    let p = |name: &str| root.path().join(name).display().to_string();
    let server = ServerProc::start(
        root.path(),
        &[
            "--tls-cert-file",
            &p("server.pem"),
            "--tls-key-file",
            &p("server.key"),
        ],
    );
    assert!(
        server.http.starts_with("https://127.0.0.1:"),
        "{}",
        server.http
    );
    let run = |address: &str, ca: Option<&str>| {
        let mut cmd = Command::new(drover());
        cmd.args(["node", "status", "--json"])
            .env("DROVER_ADDR", address)
            .env_remove("DROVER_TOKEN")
            .env_remove("DROVER_CACERT");
        if let Some(ca) = ca {
            cmd.env("DROVER_CACERT", ca);
        }
        cmd.output().unwrap()
    };
    let out = run(&server.http, Some(&p("ca.pem")));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
    let out = run(&server.http, None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("DROVER_CACERT"),
        "{}",
        text(&out.stderr)
    );
    // A CA that did not sign the server's certificate: refused in the handshake.
    let out = run(&server.http, Some(&p("server.pem")));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("TLS"), "{}", text(&out.stderr));
    // Plain HTTP to a TLS listener gets no answer.
    let plain = server.http.replace("https://", "http://");
    assert_eq!(run(&plain, None).status.code(), Some(1));
}
