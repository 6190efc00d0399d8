//! `drover agent --dev`: a server and a client in one process, driven through the
//! agent's socket with job files (acceptance 1), and the task-group lifecycle order
//! (acceptance 4).

use crate::common;

use std::time::Duration;

use common::Agent;
use common::cluster::{allocs_with, job_file, wait_dev_node_ready, wait_job};

fn dev_agent(root: &std::path::Path) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut agent = Agent::start(root, &plugins, &["--dev"]);
    agent.end_tasks = true;
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        ["raw_exec", "exec"].iter().all(|n| {
            rows.iter()
                .any(|r| r["name"] == *n && r["state"] == "healthy")
        })
    });
    // Healthy plugins are not yet a node the server can place on: the client
    // registers after it has recovered its tasks, and says its drivers' health.
    wait_dev_node_ready(&agent, &["raw_exec", "exec"], Duration::from_secs(30));
    agent
}

fn cli_ok(agent: &Agent, args: &[&str]) -> String {
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

/// Acceptance 1.
#[test]
fn dev_mode_runs_service_and_batch_jobs_from_files_through_the_socket() {
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());
    let web = job_file(
        root.path(),
        "web",
        r#"
name = "web"
type = "service"

[[group]]
name = "app"
count = 3

[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sh", args = ["-c", "echo hello from $DROVER_ALLOC_ID; exec sleep 1000"] }
resources = { cpu = 100, memory_mb = 32 }

[[group]]
name = "iso"

[[group.task]]
name = "main"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", "echo isolated; exec sleep 1000"] }
resources = { cpu = 100, memory_mb = 64 }
"#,
    );
    let once = job_file(
        root.path(),
        "once",
        r#"
name = "once"
type = "batch"

[[group]]
name = "work"

[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sh", args = ["-c", "echo batch done"] }
resources = { cpu = 100, memory_mb = 32 }
"#,
    );
    let out = cli_ok(&agent, &["job", "run", web.to_str().unwrap()]);
    assert!(out.contains("web"), "{out}");
    cli_ok(&agent, &["job", "run", once.to_str().unwrap()]);

    let web_status = wait_job(&agent, "web", "4 running allocations", |v| {
        allocs_with(v, "running").len() == 4
    });
    assert_eq!(web_status["status"], "running", "{web_status:#}");
    let groups: Vec<&str> = allocs_with(&web_status, "running")
        .iter()
        .map(|a| a["group"].as_str().unwrap())
        .collect();
    assert_eq!(groups.iter().filter(|g| **g == "app").count(), 3);
    assert_eq!(groups.iter().filter(|g| **g == "iso").count(), 1);
    for a in allocs_with(&web_status, "running") {
        assert_eq!(a["task_states"]["main"]["state"], "running", "{a:#}");
        assert!(a["node_id"].as_str().is_some_and(|s| !s.is_empty()));
    }
    let batch = wait_job(&agent, "once", "the batch allocation complete", |v| {
        allocs_with(v, "complete").len() == 1
    });
    assert_eq!(
        allocs_with(&batch, "complete")[0]["task_states"]["main"]["exit_code"],
        0
    );

    // Logs of a task of an allocation.
    let app = allocs_with(&web_status, "running")
        .into_iter()
        .find(|a| a["group"] == "app")
        .unwrap();
    let id = app["id"].as_str().unwrap();
    let mut logs = String::new();
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the task's output in alloc logs",
        || {
            logs = String::from_utf8_lossy(&agent.cli(&["alloc", "logs", id, "main"]).stdout)
                .into_owned();
            logs.contains(&format!("hello from {id}"))
        },
    );
    let iso = allocs_with(&web_status, "running")
        .into_iter()
        .find(|a| a["group"] == "iso")
        .unwrap();
    let mut iso_logs = String::new();
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the sandboxed task's output in alloc logs",
        || {
            iso_logs = cli_ok(
                &agent,
                &["alloc", "logs", iso["id"].as_str().unwrap(), "main"],
            );
            iso_logs.contains("isolated")
        },
    );

    // The `task` commands keep working beside `job`: the job's tasks are there.
    let tasks = agent.cli_json(&["task", "list", "--json"]);
    let running = tasks
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "running")
        .count();
    assert_eq!(running, 4, "{tasks:#}");

    // `job stop` leaves no task process behind.
    cli_ok(&agent, &["job", "stop", "web"]);
    wait_job(&agent, "web", "every allocation stopped", |v| {
        v["allocations"].as_array().is_some_and(|a| {
            a.iter()
                .all(|a| a["desired_status"] == "stop" && a["client_status"] == "complete")
        })
    });
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "no task process of the job",
        || {
            let tasks = agent.cli_json(&["task", "list", "--json"]);
            tasks
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["state"] != "running")
        },
    );
    // Only plugin processes (and no executor or task) carry the agent's marker.
    let plugins = agent.cli_json(&["plugin", "status", "--json"]);
    let plugin_pids: Vec<u64> = plugins
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "no task or executor process left",
        || {
            agent
                .marked_pids()
                .iter()
                .all(|p| plugin_pids.contains(&u64::from(*p)))
        },
    );
}

/// Acceptance 4: a prestart task writes into alloc/data, a prestart sidecar runs beside
/// the main task, the main task reads the file, a poststop task runs after it; the
/// order is asserted from timestamps the tasks write, and the sidecar is stopped at
/// the end.
#[test]
fn group_lifecycle_runs_in_order_with_a_shared_alloc_dir() {
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());
    let job = job_file(
        root.path(),
        "life",
        r#"
name = "life"
type = "batch"

[[group]]
name = "g"

[[group.task]]
name = "init"
driver = "rawexec"
lifecycle = { hook = "prestart" }
config = { command = "/bin/sh", args = ["-c", "sleep 0.2; echo payload > $DROVER_ALLOC_DIR/data/file; date +%s%N > $DROVER_ALLOC_DIR/data/init.end"] }

[[group.task]]
name = "side"
driver = "rawexec"
lifecycle = { hook = "prestart", sidecar = true }
config = { command = "/bin/sh", args = ["-c", "date +%s%N > $DROVER_ALLOC_DIR/data/side.start; trap 'date +%s%N > $DROVER_ALLOC_DIR/data/side.stop; exit 0' TERM; while :; do sleep 0.05; done"] }

[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sh", args = ["-c", "date +%s%N > $DROVER_ALLOC_DIR/data/main.start; cat $DROVER_ALLOC_DIR/data/file > $DROVER_ALLOC_DIR/data/main.read; sleep 1; date +%s%N > $DROVER_ALLOC_DIR/data/main.end"] }

[[group.task]]
name = "after"
driver = "rawexec"
lifecycle = { hook = "poststop" }
config = { command = "/bin/sh", args = ["-c", "date +%s%N > $DROVER_ALLOC_DIR/data/after.start"] }
"#,
    );
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let status = wait_job(&agent, "life", "the allocation complete", |v| {
        allocs_with(v, "complete").len() == 1
    });
    let alloc = allocs_with(&status, "complete")[0];
    let id = alloc["id"].as_str().unwrap();
    for t in ["init", "side", "main", "after"] {
        assert_eq!(alloc["task_states"][t]["state"], "dead", "{t}: {alloc:#}");
    }
    assert_eq!(alloc["task_states"]["main"]["exit_code"], 0, "{alloc:#}");
    assert_eq!(alloc["task_states"]["after"]["exit_code"], 0, "{alloc:#}");

    let data = agent.data_dir.join("alloc").join(id).join("alloc/data");
    let read = |name: &str| -> u128 {
        let text = std::fs::read_to_string(data.join(name))
            .unwrap_or_else(|e| panic!("{name} in {}: {e}", data.display()));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"))
    };
    let (init_end, side_start, side_stop) =
        (read("init.end"), read("side.start"), read("side.stop"));
    let (main_start, main_end, after_start) =
        (read("main.start"), read("main.end"), read("after.start"));
    assert!(init_end < main_start, "main started before prestart ended");
    assert!(side_start < main_end, "the sidecar did not run beside main");
    assert!(
        side_stop >= main_end,
        "the sidecar stopped before main ended"
    );
    assert!(after_start >= main_end, "poststop ran before main ended");
    assert!(
        side_stop <= after_start,
        "the sidecar was not stopped before poststop"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("main.read")).unwrap(),
        "payload\n",
        "main did not read the prestart's file"
    );
}

/// A free port on 127.0.0.1 below the nodes' dynamic range (20000-32000), where a
/// static port must be.
fn free_static_port() -> u16 {
    for _ in 0..1000 {
        let port = drover_test_support::net::free_local_addr().port();
        if port < 20000 {
            return port;
        }
    }
    panic!("no free port between 10000 and 20000 on 127.0.0.1");
}

/// `GET /` on 127.0.0.1:`port`: the body, or why not.
fn http_get(port: u16) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let mut c = std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_secs(2),
    )
    .map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut s = String::new();
    c.read_to_string(&mut s).map_err(|e| e.to_string())?;
    s.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .ok_or_else(|| format!("not an HTTP answer: {s:?}"))
}

/// A bridge group: `server` serves `hello from <alloc id>` on 8080 of the group's
/// namespace, `fetch` gets it from 127.0.0.1:8080 into alloc/data/fetched; the node's
/// `port` is mapped to 8080.
fn bridge_job(root: &std::path::Path, port: u16) -> std::path::PathBuf {
    job_file(
        root,
        "bridged",
        &format!(
            r#"
name = "bridged"
type = "service"

[[group]]
name = "web"

[group.network]
mode = "bridge"

[[group.network.port]]
label = "http"
static = {port}
to = 8080

[[group.task]]
name = "server"
driver = "exec"
config = {{ command = "/bin/sh", args = ["-c", "echo \"hello from $NOMAD_ALLOC_ID\" > /local/index.html; exec /bin/busybox httpd -f -p 8080 -h /local"] }}
resources = {{ cpu = 100, memory_mb = 64 }}

[[group.task]]
name = "fetch"
driver = "exec"
config = {{ command = "/bin/sh", args = ["-c", "until /bin/busybox wget -q -O /alloc/data/fetched.part http://127.0.0.1:8080/; do sleep 0.1; done; mv /alloc/data/fetched.part /alloc/data/fetched; exec sleep 1000"] }}
resources = {{ cpu = 100, memory_mb = 64 }}
"#
        ),
    )
}

/// The running allocation of job `bridged` once its tasks talked over 127.0.0.1 and
/// it answers through `port`: its id and its network's footprint.
fn bridge_running(agent: &Agent, port: u16) -> (String, drover_test_support::cni::Footprint) {
    let status = wait_job(agent, "bridged", "the bridge allocation running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let id = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let fetched = agent
        .data_dir
        .join("alloc")
        .join(&id)
        .join("alloc/data/fetched");
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(50),
        "the group's tasks talk over 127.0.0.1",
        || fetched.exists(),
    );
    let want = format!("hello from {id}\n");
    assert_eq!(std::fs::read_to_string(&fetched).unwrap(), want);
    assert_eq!(
        http_get(port).as_deref(),
        Ok(want.as_str()),
        "through the node port"
    );
    let netns = std::path::Path::new("/run/netns").join(&id);
    let seen = drover_test_support::cni::Footprint::observe("drover", &id, &netns);
    assert!(seen.ip.is_some() && seen.host_ifindex.is_some(), "{seen:?}");
    (id, seen)
}

fn nothing_left(agent: &Agent, seen: &drover_test_support::cni::Footprint) {
    let mut last = Vec::new();
    let gone = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drover_test_support::until_blocking(
            Duration::from_secs(30),
            Duration::from_millis(100),
            "the allocation's network torn down",
            || {
                last = seen.remains();
                last.is_empty()
            },
        )
    }));
    assert!(
        gone.is_ok(),
        "left behind: {last:#?}\nagent log:\n{}",
        common::cluster::tail(&agent.log_text())
    );
}

/// Acceptance 2 of issue 25 (bridge networking): the group's two tasks share a
/// namespace (127.0.0.1), the node port reaches it; after `job stop`, and after a
/// `kill -9` of the agent, a restart and a stop, no namespace, veth, rule or address
/// reservation is left.
#[test]
fn a_bridge_group_is_reached_through_its_port_and_leaves_nothing_after_stop_or_agent_crash() {
    if drover_test_support::cni::plugins().is_none() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut agent = dev_agent(root.path());
    let port = free_static_port();
    let job = bridge_job(root.path(), port);
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let (_, seen) = bridge_running(&agent, port);
    cli_ok(&agent, &["job", "stop", "bridged"]);
    nothing_left(&agent, &seen);
    assert!(http_get(port).is_err(), "nothing answers on the node port");

    // Again, and the agent dies with the allocation running.
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let (_, seen) = bridge_running(&agent, port);
    let _ = common::nix_kill(agent.child.id(), 9);
    let _ = agent.child.wait();
    assert!(
        http_get(port).is_ok(),
        "the tasks and their network outlive the agent"
    );
    // Kept (dead) until the end: dropping it would end its plugins, which the next
    // agent takes over.
    agent.end_tasks = false;
    let _killed = agent;
    let plugins = root.path().join("plugins");
    let mut agent = Agent::start(root.path(), &plugins, &["--dev"]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec", "exec"], Duration::from_secs(30));
    cli_ok(&agent, &["job", "stop", "bridged"]);
    nothing_left(&agent, &seen);
}

/// Issue 25, ports (scheduler side): on a dev agent's one node, a job of three copies
/// on static port 8080 gets one running and two blocked with the port named; dynamic
/// ports are distinct, in the node's range; a static port inside that range is refused
/// at `job run` with the field named.
#[test]
fn static_ports_clash_on_one_node_and_dynamic_ports_are_distinct() {
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());
    let ports_job = |name: &str, count: u32, port: &str| {
        job_file(
            root.path(),
            name,
            &format!(
                r#"
name = "{name}"
type = "service"

[[group]]
name = "app"
count = {count}

[group.network]
mode = "host"

[[group.network.port]]
label = "http"
{port}

[[group.task]]
name = "main"
driver = "rawexec"
config = {{ command = "/bin/sh", args = ["-c", "exec sleep 1000"] }}
resources = {{ cpu = 50, memory_mb = 16 }}
"#
            ),
        )
    };
    let fixed = ports_job("fixed", 3, "static = 8080");
    let out = agent.cli(&["job", "run", "--detach", fixed.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = wait_job(
        &agent,
        "fixed",
        "one running, two blocked on port 8080",
        |v| {
            allocs_with(v, "running").len() == 1
                && v["placement_failures"]["app"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("port 8080 in use on 1 of 1 nodes"))
        },
    );
    let running = allocs_with(&v, "running");
    assert_eq!(running[0]["ports"][0]["value"], 8080, "{v:#}");
    assert_eq!(running[0]["ports"][0]["label"], "http", "{v:#}");
    assert_eq!(v["allocations"].as_array().unwrap().len(), 1, "{v:#}");
    let human = cli_ok(&agent, &["job", "status", "fixed"]);
    assert!(
        human.contains("port 8080 in use on 1 of 1 nodes"),
        "{human}"
    );

    let dynamic = ports_job("dynamic", 3, "");
    cli_ok(
        &agent,
        &["job", "run", "--detach", dynamic.to_str().unwrap()],
    );
    let v = wait_job(&agent, "dynamic", "three running", |v| {
        allocs_with(v, "running").len() == 3
    });
    let mut ports: Vec<u64> = allocs_with(&v, "running")
        .iter()
        .map(|a| a["ports"][0]["value"].as_u64().unwrap())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "{v:#}");
    assert!(
        ports.iter().all(|p| (20000..=32000).contains(p)),
        "{ports:?}"
    );

    let inside = ports_job("inside", 1, "static = 20500");
    let out = agent.cli(&["job", "run", "--detach", inside.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "group[0].network.port[0].static: 20500 is inside the dynamic port range 20000-32000"
        ),
        "{err}"
    );
    cli_ok(&agent, &["job", "stop", "fixed"]);
    cli_ok(&agent, &["job", "stop", "dynamic"]);
}

/// Issue 28, acceptance 3: `drover alloc fs` lists an isolated (exec) task's
/// allocation directory and prints its files, by Nomad's paths; a link the task
/// planted to `/etc/shadow` is shown as a link and refused when read, through the
/// agent's socket and through the server's HTTP address alike.
#[test]
fn alloc_fs_lists_and_reads_a_tasks_files_and_refuses_its_planted_links() {
    let root = tempfile::tempdir().unwrap();
    let (agent, api) = common::cluster::dev_agent_with_api(root.path());
    // The exec driver too (the helper waits for raw_exec only).
    common::cluster::wait_dev_node_ready(&agent, &["raw_exec", "exec"], Duration::from_secs(30));
    let job = job_file(
        root.path(),
        "files",
        r#"
name = "files"
type = "service"

[[group]]
name = "app"

[[group.task]]
name = "main"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", "printf 'one\ntwo\nthree\n' > /local/notes.txt; ln -s /etc/shadow /local/shadow; ln -s /etc /local/etc; echo planted; exec sleep 1000"] }
resources = { cpu = 100, memory_mb = 64 }
"#,
    );
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let status = wait_job(&agent, "files", "the allocation running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let id = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "the task's output in alloc fs",
        || {
            let out = agent.cli(&["alloc", "fs", &id, "alloc/logs/main.stdout.0"]);
            out.status.success() && out.stdout == b"planted\n"
        },
    );
    let listing = cli_ok(&agent, &["alloc", "fs", &id]);
    assert!(
        listing.contains(" alloc/\n") && listing.contains(" main/\n"),
        "{listing}"
    );
    let local = cli_ok(&agent, &["alloc", "fs", &id[..8], "main/local"]);
    assert!(local.contains("notes.txt"), "{local}");
    assert!(
        local
            .lines()
            .any(|l| l.starts_with("Lrwxrwxrwx") && l.ends_with(" shadow")),
        "{local}"
    );
    assert_eq!(
        cli_ok(&agent, &["alloc", "fs", &id, "main/local/notes.txt"]),
        "one\ntwo\nthree\n"
    );
    assert_eq!(
        cli_ok(
            &agent,
            &[
                "alloc",
                "fs",
                "-tail",
                "-n",
                "2",
                &id,
                "main/local/notes.txt"
            ]
        ),
        "two\nthree\n"
    );
    assert_eq!(
        cli_ok(
            &agent,
            &[
                "alloc",
                "fs",
                "--tail",
                "-c",
                "3",
                &id,
                "main/local/notes.txt"
            ]
        ),
        "ee\n"
    );
    let stat: serde_json::Value = serde_json::from_str(&cli_ok(
        &agent,
        &[
            "alloc",
            "fs",
            "-stat",
            "--json",
            &id,
            "main/local/notes.txt",
        ],
    ))
    .unwrap();
    assert_eq!(stat["Size"], 14, "{stat}");
    assert_eq!(stat["IsDir"], false);

    for path in ["main/local/shadow", "main/local/etc/shadow", "main/secrets"] {
        let out = agent.cli(&["alloc", "fs", &id, path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path}: {err}");
        assert!(
            err.contains("403") || err.contains("refusing") || err.contains("prohibited"),
            "{path}: {err}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("root:"),
            "{path} leaked"
        );
    }
    // The same through the server's HTTP address (Nomad's clients ask it).
    let (code, body) = api
        .call(
            http::Method::GET,
            &format!("/v1/client/fs/cat/{id}?path=main/local/notes.txt"),
            None,
        )
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "one\ntwo\nthree\n"));
    let (code, body) = api
        .call(
            http::Method::GET,
            &format!("/v1/client/fs/cat/{id}?path=main/local/shadow"),
            None,
        )
        .unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("root:"), "{body}");
}
