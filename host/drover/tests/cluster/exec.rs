//! Issue 28, acceptance 2: `drover alloc exec -i -t` into running tasks, driven through
//! a real pseudo-terminal as a user types: the command runs inside the task's sandbox
//! (its user, seccomp mode and cgroup), its exit code is the CLI's, and it dies with
//! its caller; the same into a docker task; through the server's HTTP address with a
//! browser's first-message token.

use crate::common;

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{allocs_with, job_file, wait_job};
use drover_plugin_sdk::TerminalSize;
use drover_plugin_sdk::exec::Pty;

const LIMIT: Duration = Duration::from_secs(30);

/// `drover ARGS` on a terminal of its own, and what it prints there.
struct OnTerminal {
    child: Child,
    master: std::fs::File,
    seen: mpsc::Receiver<Vec<u8>>,
    transcript: Vec<u8>,
}

impl OnTerminal {
    fn start(agent: &Agent, args: &[&str]) -> OnTerminal {
        let pty = Pty::open(Some(TerminalSize {
            rows: 30,
            cols: 100,
        }))
        .unwrap();
        let slave = || -> OwnedFd { pty.slave().unwrap() };
        let mut cmd = Command::new(common::drover());
        cmd.args(args)
            .env("DROVER_ADDR", format!("unix://{}", agent.socket.display()))
            .stdin(Stdio::from(slave()))
            .stdout(Stdio::from(slave()))
            .stderr(Stdio::from(slave()));
        pty.attach(&mut cmd).unwrap();
        let child = cmd.spawn().unwrap();
        let master = pty.master_file().unwrap();
        drop(pty);
        let mut reader = master.try_clone().unwrap();
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        OnTerminal {
            child,
            master,
            seen,
            transcript: Vec::new(),
        }
    }

    fn type_line(&mut self, line: &str) {
        self.master.write_all(line.as_bytes()).unwrap();
        self.master.write_all(b"\r").unwrap();
    }

    /// Until the terminal shows `want` (after what was seen before); the transcript.
    fn expect(&mut self, want: &str) -> String {
        let start = self.transcript.len();
        let deadline = Instant::now() + LIMIT;
        loop {
            let text = String::from_utf8_lossy(&self.transcript[start..]).into_owned();
            if text.contains(want) {
                return text;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{want:?} not on the terminal within {LIMIT:?}; it shows:\n{}",
                String::from_utf8_lossy(&self.transcript)
            );
            if let Ok(data) = self.seen.recv_timeout(left.min(Duration::from_millis(200))) {
                self.transcript.extend(data);
            }
        }
    }

    fn exit_code(&mut self) -> i32 {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "alloc exec did not end; the terminal shows:\n{}",
                String::from_utf8_lossy(&self.transcript)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OnTerminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli_ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        common::cluster::tail(&agent.log_text())
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one running allocation of job `name`, once its task wrote `local/ready`.
fn running_alloc(agent: &Agent, name: &str, task: &str) -> String {
    let status = wait_job(agent, name, "its allocation running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let id = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(100),
        "the task ready",
        || {
            agent
                .cli(&["alloc", "fs", &id, &format!("{task}/local/ready")])
                .status
                .success()
        },
    );
    id
}

/// Processes whose command line is exactly `argv` (joined by NULs in /proc).
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let want = argv.join("\0") + "\0";
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

fn exec_job(root: &Path) -> std::path::PathBuf {
    job_file(
        root,
        "shell",
        r#"
name = "shell"
type = "service"

[[group]]
name = "g"

[[group.task]]
name = "box"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", "cat /proc/self/cgroup > /local/cgroup; readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/net > /local/ns; touch /local/ready; exec sleep 1000"] }
resources = { cpu = 100, memory_mb = 64 }
"#,
    )
}

#[test]
fn alloc_exec_into_an_exec_task_runs_in_its_sandbox_on_a_terminal() {
    let root = tempfile::tempdir().unwrap();
    let (agent, api) = common::cluster::dev_agent_with_api(root.path());
    // The exec driver too (the helper waits for raw_exec only).
    common::cluster::wait_dev_node_ready(&agent, &["raw_exec", "exec"], Duration::from_secs(30));
    cli_ok(
        &agent,
        &["job", "run", exec_job(root.path()).to_str().unwrap()],
    );
    let id = running_alloc(&agent, "shell", "box");
    let task_cgroup = cli_ok(&agent, &["alloc", "fs", &id, "box/local/cgroup"]);
    let pids_cgroup = task_cgroup
        .lines()
        .find(|l| l.contains(":pids:") || l.starts_with("0::"))
        .unwrap_or_else(|| panic!("no pids cgroup in {task_cgroup}"))
        .to_owned();

    let mut term = OnTerminal::start(
        &agent,
        &["alloc", "exec", "-i", "-t", &id, "box", "/bin/sh"],
    );
    term.type_line("echo uid=$(id -u)");
    term.expect("uid=65534");
    term.type_line("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr '\\t' ' '");
    // NoNewPrivs comes first in /proc/self/status.
    let status = term.expect("Seccomp: 2");
    assert!(status.contains("NoNewPrivs: 1"), "{status}");
    // Markers are computed by the shell, so that the terminal's echo of the typed
    // line never matches them.
    term.type_line("cat /proc/self/cgroup; echo cgroup-$((6*7))");
    let cgroups = term.expect("cgroup-42");
    assert!(
        cgroups.contains(pids_cgroup.trim()),
        "the exec'd shell is not in the task's cgroup {pids_cgroup:?}:\n{cgroups}"
    );
    // The task's own root and namespaces (as the task recorded them at its start).
    let task_ns = cli_ok(&agent, &["alloc", "fs", &id, "box/local/ns"]);
    term.type_line("[ -f /local/ready ] && echo in-root-$((1+1)); readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/net; echo ns-$((3+3))");
    let ns = term.expect("ns-6");
    assert!(ns.contains("in-root-2"), "{ns}");
    for line in task_ns.lines() {
        assert!(
            ns.contains(line.trim()),
            "not in the task's namespace {line}:\n{ns}"
        );
    }
    term.type_line("[ -t 0 ] && echo tty-$((2+2))");
    term.expect("tty-4");
    term.type_line("exit 3");
    assert_eq!(
        term.exit_code(),
        3,
        "{}",
        String::from_utf8_lossy(&term.transcript)
    );

    // Without a terminal: output and exit code, through the server's address too.
    let out = agent.cli(&[
        "alloc",
        "exec",
        "-t=false",
        &id,
        "/bin/sh",
        "-c",
        "echo out; echo err >&2; exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));

    // A command the caller leaves dies with it (and does not outlive it in the task).
    let mut caller = Command::new(common::drover())
        .args(["alloc", "exec", "-t=false", &id, "/bin/sleep", "4242"])
        .env("DROVER_ADDR", format!("unix://{}", agent.socket.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "the exec'd sleep running",
        || !processes_running(&["/bin/sleep", "4242"]).is_empty(),
    );
    caller.kill().unwrap();
    caller.wait().unwrap();
    drover_test_support::until_blocking(
        LIMIT,
        Duration::from_millis(50),
        "the exec'd sleep gone with its caller",
        || processes_running(&["/bin/sleep", "4242"]).is_empty(),
    );

    // A browser: no header, the token in the first message (Nomad's UI).
    let base = api.base().trim_start_matches("http://").to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures_util::{SinkExt as _, StreamExt as _};
        use tokio_tungstenite::tungstenite::Message;
        let command = serde_json::to_string(&["/bin/sh", "-c", "id -u; exit 4"]).unwrap();
        let q = format!(
            "task=box&tty=false&command={}",
            drover_api::encode_path_segment(&command)
        );
        let url = format!("ws://{base}/v1/client/allocation/{id}/exec?{q}");
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(Message::Text(
            format!(r#"{{"version":1,"auth_token":"{}"}}"#, api.token().unwrap()).into(),
        ))
        .await
        .unwrap();
        let mut out = Vec::new();
        let code = loop {
            let m = tokio::time::timeout(LIMIT, ws.next()).await.unwrap();
            let Some(Ok(Message::Text(t))) = m else {
                panic!("the exec ended without an exit code: {m:?}");
            };
            let f: drover_server_api::exec::ExecFrame = serde_json::from_str(t.as_str()).unwrap();
            if let Some(o) = f.stdout {
                out.extend(o.data);
            }
            if f.exited {
                break f.result.unwrap().exit_code;
            }
        };
        assert_eq!((code, String::from_utf8_lossy(&out).trim()), (4, "65534"));
        // A wrong token: closed with a policy violation, nothing run.
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(Message::Text(
            r#"{"version":1,"auth_token":"wrong"}"#.into(),
        ))
        .await
        .unwrap();
        match tokio::time::timeout(LIMIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(Some(f)))) => {
                assert_eq!(u16::from(f.code), 1008, "{f:?}");
            }
            other => panic!("expected a close for a wrong token, got {other:?}"),
        }
        // A header token that is wrong: refused before the upgrade.
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                url.as_str(),
            )
            .unwrap();
        req.headers_mut()
            .insert("X-Nomad-Token", "wrong".parse().unwrap());
        match tokio_tungstenite::connect_async(req).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 403)
            }
            other => panic!("expected 403 for a wrong header token, got {other:?}"),
        }
    });
}

#[test]
fn alloc_exec_into_a_docker_task_runs_in_its_container_on_a_terminal() {
    let Some(env) = drover_test_support::docker::docker_env() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("docker.toml");
    std::fs::write(
        &config,
        format!(
            "[plugin.docker]\nconfig = {{ endpoint = \"{}\" }}\n",
            env.host
        ),
    )
    .unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &["--dev", "--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    common::cluster::wait_dev_node_ready(&agent, &["docker"], Duration::from_secs(60));
    let job = job_file(
        root.path(),
        "boxed",
        &format!(
            r#"
name = "boxed"
type = "service"

[[group]]
name = "g"

[[group.task]]
name = "c"
driver = "docker"
config = {{ image = "{}", command = "/bin/sh", args = ["-c", "mkdir -p /local; touch /local/ready; exec sleep 1000"], user = "1234" }}
resources = {{ cpu = 100, memory_mb = 64 }}
"#,
            env.image
        ),
    );
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let status = wait_job(&agent, "boxed", "its allocation running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let id = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut term = OnTerminal::start(&agent, &["alloc", "exec", "-i", "-t", &id, "c", "/bin/sh"]);
    term.type_line("echo uid=$(id -u)");
    term.expect("uid=1234");
    term.type_line("grep Seccomp: /proc/self/status | tr '\\t' ' '");
    term.expect("Seccomp: 2");
    term.type_line("[ -t 0 ] && echo tty-$((2+2))");
    term.expect("tty-4");
    term.type_line("exit 3");
    assert_eq!(
        term.exit_code(),
        3,
        "{}",
        String::from_utf8_lossy(&term.transcript)
    );
}
