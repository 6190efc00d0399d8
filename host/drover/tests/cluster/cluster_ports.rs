//! Ports (issue 25, acceptance 1 first half): a dev agent registers its address and
//! port range; a service of count 3 whose group asks for a dynamic port `http` runs
//! `python3 -m http.server ${NOMAD_PORT_http} --bind ${NOMAD_IP_http}`, and each
//! allocation answers HTTP on the address and port the API shows for it.

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::Agent;
use common::cluster::{allocs_with, job_file, wait_dev_node_ready, wait_job};

fn dev_agent(root: &std::path::Path) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut agent = Agent::start(root, &plugins, &["--dev"]);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    agent
}

/// The reply to `GET /` at `addr`, or why there is none.
fn http_get(addr: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// The python the tasks run: the system's (a user's shims need their own environment,
/// which a task does not get).
fn python3() -> Option<&'static str> {
    let found = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "python3 is not installed in /usr/bin or /usr/local/bin"
        );
        eprintln!("SKIPPED: no python3 in /usr/bin or /usr/local/bin");
    }
    found
}

/// The node registers its address (127.0.0.1 on a dev agent) and Nomad's default
/// dynamic port range.
#[test]
fn a_dev_node_registers_its_address_and_port_range() {
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());
    let nodes = agent.cli_json(&["node", "status", "--json"]);
    let network = &nodes[0]["network"];
    assert_eq!(network["address"], "127.0.0.1", "{nodes:#}");
    assert_eq!(network["min_dynamic_port"], 20000, "{nodes:#}");
    assert_eq!(network["max_dynamic_port"], 32000, "{nodes:#}");
}

/// Acceptance 1, first half: three allocations of one group on one node, each on a
/// port of its own, each answering HTTP there; the port comes from the allocation's
/// `ports` in the API, the task learns it from `${NOMAD_PORT_http}` and
/// `${NOMAD_IP_http}`.
#[test]
fn three_web_servers_on_dynamic_ports_each_answer_on_their_allocations_address() {
    let Some(python) = python3() else { return };
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path());
    let job = job_file(
        root.path(),
        "web",
        &format!(
            r#"
name = "web"
type = "service"

[[group]]
name = "site"
count = 3

[group.network]
mode = "host"

[[group.network.port]]
label = "http"

[[group.task]]
name = "server"
driver = "raw_exec"
config = {{ command = "{python}", args = ["-m", "http.server", "${{NOMAD_PORT_http}}", "--bind", "${{NOMAD_IP_http}}"] }}
resources = {{ cpu = 100, memory_mb = 64 }}
"#
        ),
    );
    let out = agent.cli(&["job", "run", job.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_job(&agent, "web", "3 running allocations with a port", |v| {
        let running = allocs_with(v, "running");
        running.len() == 3 && running.iter().all(|a| a["ports"][0]["label"] == "http")
    });
    let mut addrs = Vec::new();
    for a in allocs_with(&status, "running") {
        let port = &a["ports"][0];
        assert_eq!(port["host_ip"], "127.0.0.1", "{a:#}");
        let value = port["value"].as_u64().expect("a port number");
        assert!(
            (20000..=32000).contains(&value),
            "a dynamic port is in the node's range: {a:#}"
        );
        let value = u16::try_from(value).expect("a port");
        addrs.push(SocketAddr::from((Ipv4Addr::LOCALHOST, value)));
    }
    let mut distinct = addrs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        3,
        "each allocation has a port of its own: {addrs:?}"
    );

    for addr in addrs {
        let deadline = Instant::now() + Duration::from_secs(30);
        let answer = loop {
            match http_get(addr) {
                Ok(a) if a.starts_with("HTTP/1.0 200") => break a,
                other => {
                    assert!(
                        Instant::now() < deadline,
                        "{addr} did not answer HTTP 200 within 30 s: {other:?}\nagent log:\n{}",
                        common::cluster::tail(&agent.log_text())
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        assert!(answer.contains("Directory listing"), "{answer}");
    }

    let out = agent.cli(&["job", "stop", "web"]);
    assert!(out.status.success(), "job stop");
    wait_job(&agent, "web", "every allocation stopped", |v| {
        v["allocations"].as_array().is_some_and(|a| {
            a.iter()
                .all(|a| a["desired_status"] == "stop" && a["client_status"] == "complete")
        })
    });
}
