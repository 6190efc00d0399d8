//! The cluster end to end, as the issue's acceptance list drives it: a real `drover
//! server` and real client agents on 127.0.0.1 with separate data and plugin dirs, jobs
//! submitted from job files with the `drover` CLI, processes observed in /proc.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::cluster::{
    ServerProc, allocs_with, client_agent, job_file, kill_running, pids_running,
};
use common::nix_kill;

/// A sleep no other test runs, so that its copies can be counted in /proc.
fn sleeper(tag: &str) -> Vec<String> {
    let n = 900_000 + (std::process::id() % 1000) * 100 + tag.len() as u32;
    vec!["/bin/sleep".into(), n.to_string()]
}

fn sleeper_job(name: &str, count: u32, argv: &[String]) -> String {
    format!(
        r#"
name = "{name}"
type = "service"

[[group]]
name = "app"
count = {count}

[[group.task]]
name = "main"
driver = "rawexec"
config = {{ command = "{}", args = ["{}"] }}
resources = {{ cpu = 100, memory_mb = 32 }}
"#,
        argv[0], argv[1]
    )
}

struct Cleanup(Vec<String>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let argv: Vec<&str> = self.0.iter().map(String::as_str).collect();
        kill_running(&argv);
    }
}

/// Acceptance 2: one server, three clients; a count-6 job is placed; `kill -9` of one
/// client agent and its tasks makes its node `down` after TTL + grace and its
/// allocations run elsewhere (count 6 again); when that agent starts again its old
/// allocations are stopped, and exactly 6 copies run.
#[test]
fn a_dead_node_is_replaced_and_its_allocations_stopped_when_it_returns() {
    dead_node(true);
}

/// As above, but only the agent and its plugins die: its tasks keep running through the
/// outage (a partitioned node). Replacements run elsewhere meanwhile; when the agent is
/// back, it stops the old copies: exactly 6 again, never two copies for long.
#[test]
fn a_partitioned_node_stops_its_replaced_allocations_when_it_returns() {
    dead_node(false);
}

fn dead_node(kill_tasks: bool) {
    let root = tempfile::tempdir().unwrap();
    // TTL 2 s (+ 2 s grace): with 1 s, a live agent that waits 1.5 s for the CPU on a
    // loaded machine is marked down and its allocations replaced.
    let server = ServerProc::start(root.path(), "2s", &[]);
    let mut agents: Vec<_> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| client_agent(root.path(), &server, n, &[]))
        .collect();
    for a in &mut agents {
        a.end_tasks = true;
    }
    server.wait_json(
        &["node", "status", "--json"],
        Duration::from_secs(30),
        "three ready nodes with raw_exec healthy",
        |v| {
            // Ready is not enough: a node registers before its drivers' first
            // fingerprints, and reports them in a later registration.
            v.as_array().is_some_and(|n| {
                n.iter()
                    .filter(|n| {
                        n["status"] == "ready" && n["drivers"]["raw_exec"]["healthy"] == true
                    })
                    .count()
                    == 3
            })
        },
    );
    let argv = sleeper(if kill_tasks {
        "dead-node"
    } else {
        "partitioned-node"
    });
    let _cleanup = Cleanup(argv.clone());
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let file = job_file(root.path(), "six", &sleeper_job("six", 6, &argv));
    let out = server.cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let status = server.wait_json(
        &["job", "status", "six", "--json"],
        Duration::from_secs(60),
        "6 running allocations",
        |v| allocs_with(v, "running").len() == 6,
    );
    assert_eq!(pids_running(&argv_ref).len(), 6);

    // The node with the most allocations dies with its tasks.
    let running = allocs_with(&status, "running");
    let victim_name = ["n1", "n2", "n3"]
        .into_iter()
        .max_by_key(|n| running.iter().filter(|a| a["node_name"] == *n).count())
        .unwrap();
    let on_victim: BTreeSet<String> = running
        .iter()
        .filter(|a| a["node_name"] == victim_name)
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!on_victim.is_empty());
    let victim = agents
        .iter_mut()
        .position(|a| a.data_dir.parent().unwrap().ends_with(victim_name))
        .unwrap();
    {
        let a = &mut agents[victim];
        // The agent first (reaped, so it can neither restart a task nor report one),
        // then its plugins and executors (they carry its marker), and its tasks (their
        // environment names its allocation dirs).
        let _ = nix_kill(a.child.id(), 9);
        let _ = a.child.wait();
        let mut pids = a.marked_pids();
        if kill_tasks {
            pids.extend(common::cluster::pids_with_env_mentioning(
                &a.data_dir.join("alloc"),
            ));
        }
        for pid in pids {
            let _ = nix_kill(pid, 9);
        }
        a.end_tasks = false;
    }

    // Down after TTL + grace (2s + 2s), and count 6 again on the two others.
    server.wait_node_status(
        victim_name,
        "down",
        Duration::from_secs(20),
        "the killed node is down",
    );
    let status = server.wait_json(
        &["job", "status", "six", "--json"],
        Duration::from_secs(60),
        "6 running allocations on the live nodes",
        |v| {
            let r = allocs_with(v, "running");
            r.len() == 6 && r.iter().all(|a| a["node_name"] != victim_name)
        },
    );
    for a in status["allocations"].as_array().unwrap() {
        if on_victim.contains(a["id"].as_str().unwrap()) {
            assert_eq!(a["client_status"], "lost", "{a:#}");
            assert_eq!(a["desired_status"], "stop", "{a:#}");
        }
    }
    // Killed tasks: 6 copies. Partitioned: the old ones still run beside their
    // replacements until the node is back.
    let during = if kill_tasks { 6 } else { 6 + on_victim.len() };
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the expected copies in /proc",
        || pids_running(&argv_ref).len() == during,
    );

    // The agent comes back on the same dirs: its old allocations are stopped, never
    // started again; exactly 6 copies run.
    let dir = root.path().join(victim_name);
    let rpc = server.rpc_addr();
    let mut back = common::Agent::start(
        &dir,
        &dir.join("plugins"),
        &["--servers", &rpc, "--node-name", victim_name],
    );
    back.end_tasks = true;
    server.wait_node_status(
        victim_name,
        "ready",
        Duration::from_secs(30),
        "the node is ready again",
    );
    // Its old allocations are stopped (partitioned: their tasks are killed; killed:
    // they are not started again): exactly 6 copies, and it stays so.
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "exactly 6 copies after the node returned",
        || pids_running(&argv_ref).len() == 6,
    );
    for _ in 0..20 {
        assert_eq!(
            pids_running(&argv_ref).len(),
            6,
            "exactly 6 copies must run; agent log:\n{}",
            back.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let tasks = back.cli_json(&["task", "list", "--json"]);
    for t in tasks.as_array().unwrap() {
        assert_ne!(t["state"], "running", "an old task runs again: {t:#}");
    }
    let out = server.cli(&["job", "stop", "six"]);
    assert!(out.status.success());
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "no copy left",
        || pids_running(&argv_ref).is_empty(),
    );
    drop(agents);
}

/// Acceptance 3: `kill -9` of the server while allocations run: tasks keep running;
/// after a restart the state is intact and no task was restarted.
#[test]
fn a_killed_server_comes_back_with_its_state_and_no_task_restarts() {
    let root = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(root.path(), "2s", &[]);
    let mut a1 = client_agent(root.path(), &server, "s1", &[]);
    let mut a2 = client_agent(root.path(), &server, "s2", &[]);
    a1.end_tasks = true;
    a2.end_tasks = true;
    server.wait_json(
        &["node", "status", "--json"],
        Duration::from_secs(30),
        "two ready nodes with raw_exec healthy",
        |v| {
            // Ready is not enough: a node registers before its drivers' first
            // fingerprints, and reports them in a later registration.
            v.as_array().is_some_and(|n| {
                n.iter()
                    .filter(|n| {
                        n["status"] == "ready" && n["drivers"]["raw_exec"]["healthy"] == true
                    })
                    .count()
                    == 2
            })
        },
    );
    let argv = sleeper("server-kill");
    let _cleanup = Cleanup(argv.clone());
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let file = job_file(root.path(), "keep", &sleeper_job("keep", 4, &argv));
    assert!(
        server
            .cli(&["job", "run", file.to_str().unwrap()])
            .status
            .success()
    );
    let before = server.wait_json(
        &["job", "status", "keep", "--json"],
        Duration::from_secs(60),
        "4 running allocations",
        |v| allocs_with(v, "running").len() == 4,
    );
    let pids = pids_running(&argv_ref);
    assert_eq!(pids.len(), 4);
    let ids = |v: &serde_json::Value| -> BTreeSet<String> {
        allocs_with(v, "running")
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_owned())
            .collect()
    };

    server.kill9();
    // Tasks keep running without a server, for longer than TTL + grace.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        pids_running(&argv_ref),
        pids,
        "tasks changed without a server"
    );

    server.spawn();
    // Give the clients time to reconnect and report (and the server a full TTL +
    // grace, in which it must not declare them down).
    let after = server.wait_json(
        &["job", "status", "keep", "--json"],
        Duration::from_secs(30),
        "the same 4 allocations running",
        |v| ids(v) == ids(&before),
    );
    std::thread::sleep(Duration::from_secs(5));
    let nodes = server.cli_json(&["node", "status", "--json"]);
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["status"] == "ready"),
        "{nodes:#}"
    );
    let after2 = server.cli_json(&["job", "status", "keep", "--json"]);
    assert_eq!(ids(&after2), ids(&before));
    assert_eq!(after["version"], before["version"]);
    assert_eq!(pids_running(&argv_ref), pids, "a task was restarted");
    for a in allocs_with(&after2, "running") {
        let main = &a["task_states"]["main"];
        assert_eq!(main["starts"], 1, "{a:#}");
        assert_eq!(main["restarts"], 0, "{a:#}");
    }
    assert!(server.cli(&["job", "stop", "keep"]).status.success());
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "no copy left",
        || pids_running(&argv_ref).is_empty(),
    );
}

/// Acceptance 5 (server side): a misspelt key is refused naming the key and line; a
/// job that needs a driver no node has, or more memory than the cluster has, is
/// accepted and `job status` shows why it is blocked; a client with a wrong token is
/// refused and the server keeps serving.
#[test]
fn bad_jobs_and_bad_clients_get_clear_answers() {
    let root = tempfile::tempdir().unwrap();
    let token_file = root.path().join("token");
    std::fs::write(&token_file, "s3cret-token-for-tests\n").unwrap();
    let bad_token = root.path().join("bad-token");
    std::fs::write(&bad_token, "wrong\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    for f in [&token_file, &bad_token] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut server = ServerProc::start_with_token(
        root.path(),
        "2s",
        &["--token-file", token_file.to_str().unwrap()],
        Some("s3cret-token-for-tests"),
    );
    // Without the token: refused.
    let mut anon = ServerProc {
        child: None,
        data_dir: server.data_dir.clone(),
        http: server.http,
        rpc: server.rpc,
        log: server.log.clone(),
        extra: vec![],
        token: None,
    };
    let out = anon.cli(&["node", "status", "--json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("token") || err.contains("401") || err.contains("unauthor"),
        "{err}"
    );
    anon.child = None;

    let mut good = client_agent(
        root.path(),
        &server,
        "good",
        &["--token-file", token_file.to_str().unwrap()],
    );
    good.end_tasks = true;
    let mut bad = client_agent(
        root.path(),
        &server,
        "bad",
        &["--token-file", bad_token.to_str().unwrap()],
    );
    bad.end_tasks = true;
    server.wait_node_status(
        "good",
        "ready",
        Duration::from_secs(30),
        "the good node ready",
    );
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "the bad client says why",
        || {
            let log = bad.log_text().to_lowercase();
            log.contains("unauthenticated") || log.contains("token")
        },
    );
    let nodes = server.cli_json(&["node", "status", "--json"]);
    assert!(
        nodes.as_array().unwrap().iter().all(|n| n["name"] != "bad"),
        "a client with a wrong token registered: {nodes:#}"
    );

    // A misspelt key: refused, naming the key and its line.
    let typo = job_file(
        root.path(),
        "typo",
        "name = \"typo\"\n[[group]]\nname = \"g\"\ncuont = 2\n[[group.task]]\nname = \"t\"\ndriver = \"rawexec\"\n",
    );
    let out = server.cli(&["job", "run", typo.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cuont") && err.contains(":4"), "{err}");

    // A driver no node has: accepted, blocked with the reason.
    let qemu = job_file(
        root.path(),
        "vm",
        "name = \"vm\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"qemu\"\n",
    );
    let _ = server.cli(&["job", "run", "--detach", qemu.to_str().unwrap()]);
    let v = server.wait_json(
        &["job", "status", "vm", "--json"],
        Duration::from_secs(20),
        "the qemu job blocked",
        |v| {
            v["placement_failures"]["g"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("no node has driver qemu"))
        },
    );
    assert!(v["allocations"].as_array().unwrap().is_empty(), "{v:#}");
    let human = server.cli(&["job", "status", "vm"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("no node has driver qemu"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );

    // More memory than the cluster has: accepted, blocked with the reason.
    let big = job_file(
        root.path(),
        "big",
        "name = \"big\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"rawexec\"\n\
         config = { command = \"/bin/true\" }\nresources = { cpu = 100, memory_mb = 100000000 }\n",
    );
    let _ = server.cli(&["job", "run", "--detach", big.to_str().unwrap()]);
    server.wait_json(
        &["job", "status", "big", "--json"],
        Duration::from_secs(20),
        "the big job blocked on memory",
        |v| {
            v["placement_failures"]["g"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("memory exhausted on 1 of 1 nodes"))
        },
    );
    // The server kept serving throughout.
    assert!(server.cli(&["node", "status"]).status.success());
    assert!(server.child.as_mut().unwrap().try_wait().unwrap().is_none());
}

/// Issue 26, acceptance 2: raw_exec is off on an agent that was not told otherwise (as
/// Nomad's): a job needing it is accepted but blocked, and the reason says what the
/// operator must change; once the agent's config enables it, the same job runs.
#[test]
fn raw_exec_is_off_on_a_default_agent_and_a_job_needing_it_says_why() {
    let root = tempfile::tempdir().unwrap();
    let server = ServerProc::start(root.path(), "10s", &[]);
    let dir = root.path().join("plain");
    std::fs::create_dir_all(dir.join("plugins")).unwrap();
    let rpc = server.rpc_addr();
    let node_args = ["--servers", rpc.as_str(), "--node-name", "plain"];
    let mut plain = common::Agent::start_with_defaults(&dir, &dir.join("plugins"), &node_args);
    plain.end_tasks = true;
    server.wait_node_status(
        "plain",
        "ready",
        Duration::from_secs(30),
        "the default node ready",
    );
    let argv = sleeper("raw-off");
    let _cleanup = Cleanup(argv.clone());
    let job = job_file(
        root.path(),
        "raw",
        &sleeper_job("raw", 1, &argv).replace("\"rawexec\"", "\"raw_exec\""),
    );
    let out = server.cli(&["job", "run", "--detach", job.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let v = server.wait_json(
        &["job", "status", "raw", "--json"],
        Duration::from_secs(20),
        "the raw_exec job blocked with the reason",
        |v| {
            v["placement_failures"]["app"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("raw_exec is disabled"))
        },
    );
    let reason = v["placement_failures"]["app"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("no node has driver raw_exec healthy")
            && reason.contains("[plugin.raw_exec] config = { enabled = true }"),
        "{reason}"
    );
    assert!(v["allocations"].as_array().unwrap().is_empty(), "{v:#}");
    assert!(pids_running(&argv.iter().map(String::as_str).collect::<Vec<_>>()).is_empty());

    // The operator enables it: the agent comes back with the config, the job runs.
    plain.stop();
    drop(plain);
    let enable = common::enable_raw_exec(&dir);
    let mut args = vec!["--config", enable.to_str().unwrap()];
    args.extend_from_slice(&node_args);
    let mut enabled = common::Agent::start_with_defaults(&dir, &dir.join("plugins"), &args);
    enabled.end_tasks = true;
    server.wait_json(
        &["job", "status", "raw", "--json"],
        Duration::from_secs(30),
        "the raw_exec job running once raw_exec is enabled",
        |v| allocs_with(v, "running").len() == 1,
    );
}

/// Issue 26 (node identity): client agents carry the node-introduction token, not the
/// cluster token. With it a node registers and runs its allocations; as a user's token
/// on the HTTP API it opens nothing (no job submitted, no node or allocation read).
#[test]
fn a_node_token_registers_nodes_and_opens_nothing_else() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = tempfile::tempdir().unwrap();
    let cluster_token = "cluster-token-for-the-servers-and-users";
    let node_token = "node-introduction-token-for-the-clients";
    let token_file = root.path().join("token");
    let node_token_file = root.path().join("node-token");
    for (f, t) in [(&token_file, cluster_token), (&node_token_file, node_token)] {
        std::fs::write(f, t).unwrap();
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let server = ServerProc::start_with_token(
        root.path(),
        "10s",
        &[
            "--token-file",
            token_file.to_str().unwrap(),
            "--node-token-file",
            node_token_file.to_str().unwrap(),
        ],
        Some(cluster_token),
    );
    let mut node = client_agent(
        root.path(),
        &server,
        "n1",
        &["--token-file", node_token_file.to_str().unwrap()],
    );
    node.end_tasks = true;
    server.wait_node_status(
        "n1",
        "ready",
        Duration::from_secs(30),
        "the node registered with the node token",
    );
    let argv = sleeper("node-token");
    let _cleanup = Cleanup(argv.clone());
    let job = job_file(root.path(), "nt", &sleeper_job("nt", 1, &argv));
    let out = server.cli(&["job", "run", "--detach", job.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    server.wait_json(
        &["job", "status", "nt", "--json"],
        Duration::from_secs(30),
        "the job running on the node",
        |v| allocs_with(v, "running").len() == 1,
    );

    // The node's token as a user's: refused everywhere, nothing changes.
    let as_node = ServerProc {
        child: None,
        data_dir: server.data_dir.clone(),
        http: server.http,
        rpc: server.rpc,
        log: server.log.clone(),
        extra: vec![],
        token: Some(node_token.to_owned()),
    };
    let other = job_file(root.path(), "intruder", &sleeper_job("intruder", 1, &argv));
    for args in [
        vec!["job", "run", "--detach", other.to_str().unwrap()],
        vec!["node", "status", "--json"],
        vec!["job", "status", "nt", "--json"],
    ] {
        let out = as_node.cli(&args);
        assert!(
            !out.status.success(),
            "{args:?} with the node token: {out:?}"
        );
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(
            err.contains("permission denied") || err.contains("token"),
            "{args:?}: {err}"
        );
    }
    let out = server.cli(&["job", "status", "intruder", "--json"]);
    assert!(
        !out.status.success(),
        "a job was submitted with the node token: {out:?}"
    );
}
