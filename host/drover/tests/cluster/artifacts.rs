//! Artifacts end to end (issue 26, acceptance 4): a dev agent fetches each task's
//! `artifact` from a loopback `python3 -m http.server` before the task starts. A
//! tar.gz with the right checksum unpacks into `local/` and the task (raw_exec) reads
//! it; a wrong checksum fails the task with the reason (Nomad's "Failed Artifact
//! Download" event); each hostile archive (`../` entry, absolute path, symlink out,
//! hard link out, character device, size bomb) fails the task naming the entry and
//! nothing appears outside the task directory (a sentinel directory stays as it was);
//! a link a sibling task planted in the shared `alloc/` is not followed.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::Agent;
use common::cluster::{free_port, job_file, python3, wait_dev_node_ready, wait_job};
use common::nomad_http::NomadApi;
use serde_json::Value;

/// Builds the archives the tests serve, with Python's own tarfile (it writes the
/// hostile headers as given) and gzip/zipfile. argv: www dir, sentinel dir.
const MAKE_ARCHIVES: &str = r#"
import gzip, hashlib, io, os, sys, tarfile
www, outside = sys.argv[1], sys.argv[2]

def tgz(name, entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for e in entries:
            info = tarfile.TarInfo(e["name"])
            info.type = e.get("type", tarfile.REGTYPE)
            info.mode = e.get("mode", 0o644)
            data = e.get("data", b"")
            if info.type == tarfile.REGTYPE:
                info.size = len(data)
            info.linkname = e.get("link", "")
            if info.type == tarfile.CHRTYPE:
                info.devmajor, info.devminor = 1, 3
            t.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    with open(os.path.join(www, name), "wb") as f:
        f.write(gzip.compress(buf.getvalue(), 1))

tgz("app.tar.gz", [
    {"name": "bin/", "type": tarfile.DIRTYPE, "mode": 0o755},
    {"name": "hello.txt", "data": b"hello from an artifact\n", "mode": 0o4755},
])
deep = "../" * 30
tgz("dotdot.tar.gz", [{"name": deep + outside.lstrip("/") + "/evil-dotdot", "data": b"x"}])
tgz("absolute.tar.gz", [{"name": outside + "/evil-absolute", "data": b"x"}])
tgz("symlink.tar.gz", [
    {"name": "out", "type": tarfile.SYMTYPE, "link": outside},
    {"name": "out/evil-symlink", "data": b"x"},
])
tgz("hardlink.tar.gz", [{"name": "hard", "type": tarfile.LNKTYPE, "link": outside + "/target"}])
tgz("device.tar.gz", [{"name": "null", "type": tarfile.CHRTYPE}])
tgz("bomb.tar.gz", [{"name": "zeros", "data": bytes(16 << 20)}])
with open(os.path.join(www, "plain.txt"), "wb") as f:
    f.write(b"plain\n")
print(hashlib.sha256(open(os.path.join(www, "app.tar.gz"), "rb").read()).hexdigest())
"#;

/// `python3 -m http.server` on 127.0.0.1 serving `dir`, killed on drop.
struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    fn start(python: &str, dir: &Path) -> HttpServer {
        let port = free_port();
        let child = Command::new(python)
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        drover_test_support::until_blocking(
            Duration::from_secs(20),
            Duration::from_millis(50),
            "the http.server listening",
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        HttpServer { child, port }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A dev agent with a 1 MiB cap on unpacked bytes (the bomb unpacks to 16 MiB), its
/// Nomad API with the dev token.
fn dev_agent(root: &Path) -> (Agent, NomadApi) {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let config = root.join("agent.toml");
    std::fs::write(
        &config,
        "[artifact]\nmax_unpacked_bytes = 1048576\nmax_entries = 1000\ntimeout = \"60s\"\n",
    )
    .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(
        root,
        &plugins,
        &[
            "--dev",
            "--dev-http-addr",
            &addr,
            "--config",
            config.to_str().unwrap(),
        ],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    let token = std::fs::read_to_string(agent.data_dir.join("server/dev-token")).unwrap();
    (agent, NomadApi::new(port).with_token(token.trim()))
}

/// A batch job whose one task runs `script` (sh) after its `artifact` tables; no
/// restarts, no rescheduling: one allocation, which fails for good.
fn job(name: &str, script: &str, artifacts: &str, prestart: &str) -> String {
    format!(
        r#"name = "{name}"
type = "batch"

[[group]]
name = "g"
reschedule = {{ attempts = 0 }}
{prestart}
[[group.task]]
name = "t"
driver = "raw_exec"
config = {{ command = "/bin/sh", args = ["-c", '{script}'] }}
resources = {{ cpu = 100, memory_mb = 64 }}
restart = {{ attempts = 0, mode = "fail" }}
{artifacts}
"#
    )
}

fn artifact(port: u16, file: &str, dest: &str, options: &str) -> String {
    format!(
        "[[group.task.artifact]]\nsource = \"http://127.0.0.1:{port}/{file}\"\ndestination = \"{dest}\"\n{options}\n"
    )
}

fn run(agent: &Agent, root: &Path, name: &str, text: &str) {
    let file = job_file(root, name, text);
    let out = agent.cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The job's one allocation once it is `status` (`complete` or `failed`).
fn alloc_ending(agent: &Agent, job: &str, status: &str) -> Value {
    let v = wait_job(agent, job, &format!("{job}'s allocation {status}"), |v| {
        v["allocations"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["client_status"] == status))
    });
    v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["client_status"] == status)
        .unwrap()
        .clone()
}

/// The message of the failed task `t`, and whether the Nomad API shows a "Failed
/// Artifact Download" event for it.
fn failure(agent: &Agent, api: &NomadApi, job: &str) -> (String, bool) {
    let a = alloc_ending(agent, job, "failed");
    let id = a["id"].as_str().unwrap();
    let full = agent.cli_json(&["alloc", "status", id, "--json"]);
    let message = full["task_states"]["t"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let nomad = api.get_ok(&format!("/v1/allocation/{id}"));
    let event = nomad["TaskStates"]["t"]["Events"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| {
            e["Type"] == "Failed Artifact Download"
                && e["DownloadError"].as_str().is_some_and(|d| !d.is_empty())
        });
    (message, event)
}

/// Everything beneath `dir`, relative, sorted (the sentinel's contents).
fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                todo.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().to_owned());
        }
    }
    out.sort();
    out
}

#[test]
fn artifacts_are_fetched_verified_and_hostile_archives_are_refused() {
    let Some(python) = python3() else { return };
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let www = root.join("www");
    let outside = root.join("outside");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("target"), "sentinel\n").unwrap();
    let made = Command::new(&python)
        .args(["-c", MAKE_ARCHIVES])
        .arg(&www)
        .arg(&outside)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let sha = String::from_utf8(made.stdout).unwrap().trim().to_owned();
    let server = HttpServer::start(&python, &www);
    let port = server.port;
    let (agent, api) = dev_agent(root);

    // --- a good tar.gz with its checksum, and a plain file ---------------------------
    let seen = root.join("seen");
    let ok = job(
        "fetch-ok",
        &format!(
            "cat ${{NOMAD_TASK_DIR}}/app/hello.txt ${{NOMAD_TASK_DIR}}/plain.txt > {seen}; \
             stat -c %a ${{NOMAD_TASK_DIR}}/app/hello.txt >> {seen}",
            seen = seen.display()
        ),
        &format!(
            "{}{}",
            artifact(
                port,
                "app.tar.gz",
                "local/app",
                &format!("options = {{ checksum = \"sha256:{sha}\" }}")
            ),
            artifact(port, "plain.txt", "local/", "")
        ),
        "",
    );
    run(&agent, root, "fetch-ok", &ok);

    // --- a wrong checksum ------------------------------------------------------------
    let wrong = "0".repeat(64);
    let bad_sum = job(
        "fetch-badsum",
        "true",
        &artifact(
            port,
            "app.tar.gz",
            "local/app",
            &format!("options = {{ checksum = \"sha256:{wrong}\" }}"),
        ),
        "",
    );
    run(&agent, root, "fetch-badsum", &bad_sum);

    // --- hostile archives --------------------------------------------------------------
    let hostile = [
        ("dotdot", "evil-dotdot"),
        ("absolute", "evil-absolute"),
        ("symlink", "symbolic link"),
        ("hardlink", "hard link"),
        ("device", "character device"),
        ("bomb", "more than 1048576 bytes"),
    ];
    for (name, _) in hostile {
        let text = job(
            &format!("hostile-{name}"),
            "true",
            &artifact(port, &format!("{name}.tar.gz"), "local/x", ""),
            "",
        );
        run(&agent, root, &format!("hostile-{name}"), &text);
    }

    // --- a link planted in the shared alloc dir by a sibling prestart task ------------
    let planter = format!(
        r#"[[group.task]]
name = "plant"
driver = "raw_exec"
lifecycle = {{ hook = "prestart" }}
config = {{ command = "/bin/ln", args = ["-s", "{}", "${{NOMAD_ALLOC_DIR}}/data/planted"] }}
resources = {{ cpu = 100, memory_mb = 64 }}
restart = {{ attempts = 0, mode = "fail" }}
"#,
        outside.display()
    );
    let planted = job(
        "fetch-planted",
        "true",
        &artifact(port, "plain.txt", "alloc/data/planted/", ""),
        &planter,
    );
    run(&agent, root, "fetch-planted", &planted);

    // --- a download that fails at first is tried again under the restart policy --------
    let later_seen = root.join("later-seen");
    let later = job(
        "fetch-later",
        &format!(
            "cat ${{NOMAD_TASK_DIR}}/later.txt > {}",
            later_seen.display()
        ),
        &artifact(port, "later.txt", "local/", ""),
        "",
    )
    .replace(
        "restart = { attempts = 0, mode = \"fail\" }",
        "restart = { attempts = 5, delay = \"1s\", mode = \"fail\" }",
    );
    run(&agent, root, "fetch-later", &later);
    let v = wait_job(&agent, "fetch-later", "the failed download retried", |v| {
        v["allocations"].as_array().is_some_and(|a| {
            a.iter().any(|a| {
                let id = a["id"].as_str().unwrap_or_default();
                let full = agent.cli_json(&["alloc", "status", id, "--json"]);
                full["task_states"]["t"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("404") && m.contains("trying again"))
            })
        })
    });
    assert_eq!(v["allocations"].as_array().unwrap().len(), 1, "{v:#}");
    std::fs::write(www.join("later.txt"), "later\n").unwrap();

    // --- what the user sees -------------------------------------------------------------
    alloc_ending(&agent, "fetch-ok", "complete");
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        "hello from an artifact\nplain\n755\n",
        "the task read what was unpacked (setuid dropped from 4755)"
    );

    let (message, event) = failure(&agent, &api, "fetch-badsum");
    assert!(
        message.contains("checksum mismatch") && message.contains(&wrong),
        "{message}"
    );
    assert!(event, "no Failed Artifact Download event");

    for (name, why) in hostile {
        let (message, event) = failure(&agent, &api, &format!("hostile-{name}"));
        assert!(
            message.contains(FAILURE) && message.contains(why),
            "{name}: {message}"
        );
        assert!(event, "{name}: no Failed Artifact Download event");
    }

    let (message, _) = failure(&agent, &api, "fetch-planted");
    assert!(
        message.contains("planted") && message.contains("symbolic link"),
        "{message}"
    );

    alloc_ending(&agent, "fetch-later", "complete");
    assert_eq!(std::fs::read_to_string(&later_seen).unwrap(), "later\n");

    // Nothing appeared outside: the sentinel directory is as it was.
    assert_eq!(listing(&outside), vec![PathBuf::from("target")]);
    assert_eq!(
        std::fs::read_to_string(outside.join("target")).unwrap(),
        "sentinel\n"
    );
    drop(server);
}

/// How a task's message starts when an artifact failed it.
const FAILURE: &str = "failed to download artifact";
