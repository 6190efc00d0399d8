//! Several servers on etcd, end to end (issue 12's acceptance 1 to 3): a real etcd of
//! the test's own (`drover_test_support::etcd`), three real `drover server`s on it
//! (`--store etcd`, lease TTL 3 s) and real client agents that know every server, with
//! rawexec tasks observed in /proc. What is asserted is what a user would notice: who
//! leads (`drover server status`), the allocations of a job (`drover job status`),
//! the nodes, the task processes, what the CLI says when it fails.
//!
//! The tests run one at a time (they measure a failover against the lease TTL, on a
//! machine of two cores). Without an `etcd` binary they skip, loudly (the harness says
//! why); under `CI=true` they fail instead.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use common::cluster::{allocs_with, job_file, kill_running};
use common::ha::{HaCluster, LEASE_TTL, TaskProc, cli_within, text};
use serde_json::Value;

/// A sleep no other test runs, so that its copies can be found in /proc.
fn sleeper(tag: u32) -> Vec<String> {
    let n = 700_000 + (std::process::id() % 1000) * 100 + tag;
    vec!["/bin/sleep".into(), n.to_string()]
}

fn service_job(name: &str, count: u32, argv: &[String]) -> String {
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
resources = {{ cpu = 50, memory_mb = 16 }}
"#,
        argv[0], argv[1]
    )
}

fn system_job(name: &str, argv: &[String]) -> String {
    service_job(name, 1, argv).replace("type = \"service\"", "type = \"system\"")
}

/// Kills the test's sleeps by their command line when dropped (also on a panic).
struct Cleanup(Vec<Vec<String>>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for argv in &self.0 {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            kill_running(&argv);
        }
    }
}

/// Every allocation of a `job status --json` answer, by id.
fn allocations(job: &Value) -> BTreeMap<String, Value> {
    job["allocations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| (a["id"].as_str().unwrap_or_default().to_owned(), a.clone()))
        .collect()
}

/// The ids of a job's allocations that run (wanted and running).
fn running_ids(job: &Value) -> BTreeSet<String> {
    allocs_with(job, "running")
        .iter()
        .map(|a| a["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// One line per allocation: id, node, desired and client status.
fn describe(job: &Value) -> String {
    allocations(job)
        .values()
        .map(|a| {
            format!(
                "{} on {} {}/{}",
                a["id"].as_str().unwrap_or("?"),
                a["node_name"].as_str().unwrap_or("?"),
                a["desired_status"].as_str().unwrap_or("?"),
                a["client_status"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Wait until `name` has exactly `count` allocations, every one running, and a task
/// process for each; the job and the processes.
fn wait_running(
    c: &HaCluster,
    name: &str,
    count: usize,
    argv: &[String],
    within: Duration,
) -> (Value, BTreeMap<String, TaskProc>) {
    c.poll(
        within,
        &format!("{count} allocations of {name} running"),
        || {
            let job = c.job(name)?;
            let all = allocations(&job);
            let running = running_ids(&job);
            let procs = c.task_procs(argv);
            let pids: BTreeSet<String> = procs.keys().cloned().collect();
            if all.len() == count && running.len() == count && pids == running {
                Ok((job, procs))
            } else {
                Err(format!(
                    "{} allocations, {} running, processes of {pids:?}: {}",
                    all.len(),
                    running.len(),
                    describe(&job)
                ))
            }
        },
    )
}

/// The same allocations still run, each once and never restarted: the same ids, all
/// running, no other allocation of the job, the same task processes (pid and start
/// time), a task started once.
fn assert_untouched(
    c: &HaCluster,
    name: &str,
    before: &Value,
    procs: &BTreeMap<String, TaskProc>,
    argv: &[String],
) {
    let job = c.job(name).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        allocations(&job).keys().collect::<Vec<_>>(),
        allocations(before).keys().collect::<Vec<_>>(),
        "the allocations of {name} changed: before {}; now {}",
        describe(before),
        describe(&job)
    );
    assert_eq!(
        running_ids(&job),
        running_ids(before),
        "not every allocation of {name} runs: {}",
        describe(&job)
    );
    for a in allocs_with(&job, "running") {
        let main = &a["task_states"]["main"];
        assert_eq!(main["restarts"], 0, "a task was restarted: {a:#}");
        if !main["starts"].is_null() {
            assert_eq!(main["starts"], 1, "a task was started again: {a:#}");
        }
    }
    assert_eq!(
        &c.task_procs(argv),
        procs,
        "the task processes of {name} changed"
    );
}

/// Every node is ready, and its status did not change since `before` (a node marked
/// down and back in between would show a newer `status_updated_at`).
fn assert_nodes_untouched(c: &HaCluster, before: &Value) {
    let leader = c.leader_index().unwrap_or_else(|e| panic!("{e}"));
    let now = c.servers[leader]
        .json(&["node", "status", "--json"])
        .unwrap_or_else(|e| panic!("{e}"));
    let key = |v: &Value| -> BTreeMap<String, (String, i64)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                (
                    n["name"].as_str().unwrap_or_default().to_owned(),
                    (
                        n["status"].as_str().unwrap_or_default().to_owned(),
                        n["status_updated_at"].as_i64().unwrap_or_default(),
                    ),
                )
            })
            .collect()
    };
    assert!(
        key(&now).values().all(|(s, _)| s == "ready"),
        "a node is not ready: {now:#}"
    );
    assert_eq!(
        key(&now),
        key(before),
        "a node's status changed (marked down and back?): {now:#}"
    );
}

/// Acceptance 1: three servers, three client agents, a count-6 job. `kill -9` of the
/// leader: another server leads within the lease TTL + 2 s; the 6 allocations run on,
/// untouched; a job submitted to a follower during the failover and one after it are
/// each placed once.
#[test]
fn a_killed_leader_is_replaced_within_the_lease_and_nothing_moves() {
    let _one = common::serial();
    let Some(mut c) = HaCluster::start(3, 3, "2s") else {
        return;
    };
    let six = sleeper(1);
    let during_argv = sleeper(2);
    let after_argv = sleeper(3);
    let _cleanup = Cleanup(vec![six.clone(), during_argv.clone(), after_argv.clone()]);
    let nodes = c.wait_nodes_ready(Duration::from_secs(30));

    let (leader, term) = c.wait_leader(Duration::from_secs(10), None);
    let led_since = Instant::now();
    let file = job_file(c.root.path(), "six", &service_job("six", 6, &six));
    let out = c.servers[leader].cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run: {}{}",
        text(&out.stderr),
        text(&out.stdout)
    );
    let (before, procs) = wait_running(&c, "six", 6, &six, Duration::from_secs(30));
    let spread: BTreeMap<&str, usize> = procs.values().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(p.node.as_str()).or_default() += 1;
        m
    });
    eprintln!(
        "six runs on {spread:?}; pids {:?}",
        procs.values().map(|p| p.pid).collect::<Vec<_>>()
    );

    // A live leader keeps its term: it renews its lease (no step down every TTL).
    while led_since.elapsed() < LEASE_TTL + Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        c.leader_except(None),
        Ok((leader, term)),
        "the leader changed while it lived ({:?} after it was found)",
        led_since.elapsed()
    );

    // kill -9 the leader; at once, a user submits a job to a follower.
    let old = c.servers[leader].name.clone();
    let follower = c.follower_of(leader);
    let during_file = job_file(
        c.root.path(),
        "during",
        &service_job("during", 3, &during_argv),
    );
    let follower_url = c.servers[follower].http_url();
    let killed_at = Instant::now();
    c.servers[leader].kill9();
    let during = {
        let url = follower_url.clone();
        let file = during_file.to_str().unwrap().to_owned();
        std::thread::spawn(move || {
            let started = Instant::now();
            let out = cli_within(&url, &["job", "run", &file], Duration::from_secs(90));
            (started.elapsed(), out)
        })
    };
    let (new_leader, new_term) = c.wait_leader(LEASE_TTL + Duration::from_secs(15), Some(&old));
    let took = killed_at.elapsed();
    eprintln!(
        "failover: {} leads (term {new_term}, was {old} term {term}) {took:?} after kill -9",
        c.servers[new_leader].name
    );
    assert!(
        took <= LEASE_TTL + Duration::from_secs(2),
        "a new leader took {took:?} after kill -9 of {old}: more than the lease TTL \
         {LEASE_TTL:?} + 2 s"
    );
    assert!(
        new_term > term,
        "the new term {new_term} is not after {term}"
    );

    // The job submitted during the failover: the CLI either waited and placed it, or
    // failed saying why, having placed nothing; a user then runs it again.
    let (during_took, out) = during.join().expect("the submitting thread");
    let out = out.unwrap_or_else(|e| panic!("job run during the failover hung: {e}"));
    eprintln!(
        "job run during the failover: {} after {during_took:?}: {}{}",
        out.status,
        text(&out.stderr).trim(),
        text(&out.stdout).trim()
    );
    if !out.status.success() {
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "job run during the failover: {err}"
        );
        assert!(
            err.starts_with("drover: ") && err.trim().len() > "drover: ".len(),
            "job run during the failover failed without saying why: {err:?}"
        );
        assert!(!err.contains("panicked"), "{err}");
        // Placed nothing, or all of it (the registration committed, the CLI lost the
        // answer): never a part.
        if let Ok(job) = c.job("during") {
            let n = allocations(&job).len();
            assert!(n == 0 || n == 3, "half placed: {}", describe(&job));
        }
        let out = c.servers[follower].cli(&["job", "run", during_file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "job run again after the failover: {}{}",
            text(&out.stderr),
            text(&out.stdout)
        );
    }

    // A job submitted to a follower after the failover: a system job, so that every
    // agent must have found a live server to run its copy.
    let after_follower = c.follower_of(new_leader);
    let file = job_file(c.root.path(), "after", &system_job("after", &after_argv));
    let out = c.servers[after_follower].cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run after the failover (through {}): {}{}",
        c.servers[after_follower].name,
        text(&out.stderr),
        text(&out.stdout)
    );
    wait_running(&c, "during", 3, &during_argv, Duration::from_secs(30));
    let (after, after_procs) = wait_running(&c, "after", 3, &after_argv, Duration::from_secs(30));
    let on: BTreeSet<&str> = after_procs.values().map(|p| p.node.as_str()).collect();
    assert_eq!(
        on,
        BTreeSet::from(["n1", "n2", "n3"]),
        "the system job runs once per node: {}",
        describe(&after)
    );

    for (a, i) in c.agents.iter().zip(1..) {
        let log = a.log_text();
        let last = log.lines().rfind(|l| l.contains("node registered"));
        eprintln!("agent n{i}: {}", last.unwrap_or("never registered"));
    }

    // Nothing of the count-6 job moved; no node was marked down.
    assert_untouched(&c, "six", &before, &procs, &six);
    assert_nodes_untouched(&c, &nodes);
    // Followers serve the same reads.
    let want = running_ids(&before);
    c.poll(
        Duration::from_secs(5),
        "the follower reads the same allocations",
        || {
            let job = c.servers[after_follower].json(&["job", "status", "six", "--json"])?;
            (running_ids(&job) == want)
                .then_some(())
                .ok_or_else(|| describe(&job))
        },
    );
    // The CLI through the socket of agent n1, whose first server is the dead one: the
    // agent forwards to the next.
    let out = c.agents[0].cli(&["server", "status", "--json"]);
    let status = common::ha::json_of(&out, &["server", "status", "--json"])
        .unwrap_or_else(|e| panic!("server status through agent n1: {e}"));
    assert_eq!(
        status["leader"]["name"],
        c.servers[new_leader].name.as_str(),
        "{status:#}"
    );

    // The killed server started again (same name and addresses) follows.
    c.servers[leader].restart();
    let (again, _) = c.poll(
        Duration::from_secs(20),
        "the restarted server follows and every server is listed",
        || {
            let (l, t) = c.leader_except(None)?;
            let status = c.servers[leader].status()?;
            let names: BTreeSet<&str> = status["servers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["name"].as_str())
                .collect();
            if names == BTreeSet::from(["s1", "s2", "s3"]) {
                Ok((l, t))
            } else {
                Err(format!("{} lists {names:?}", old))
            }
        },
    );
    assert_eq!(again, new_leader, "leadership moved when {old} came back");
    assert_untouched(&c, "six", &before, &procs, &six);

    // `job stop` through the restarted follower: forwarded, and it returns once the
    // tasks are gone.
    let out = c.servers[leader].cli(&["job", "stop", "six"]);
    assert!(
        out.status.success(),
        "job stop through {old}: {}{}",
        text(&out.stderr),
        text(&out.stdout)
    );
    c.poll(Duration::from_secs(10), "the tasks of six end", || {
        let left = c.task_procs(&six);
        left.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{} still run", left.len()))
    });
    c.shutdown();
}

/// Send `body` as an HTTP/1.1 `PUT path` to `port` and return the connection, with the
/// request in the server's socket (a stopped server's kernel still accepts it).
fn send_http(port: u16, path: &str, body: &str) -> std::net::TcpStream {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        conn,
        "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    conn
}

/// The answer on `conn`: status code and body, within `limit`.
fn read_http(mut conn: std::net::TcpStream, limit: Duration) -> (u16, String) {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut answer = Vec::new();
    if let Err(e) = conn.read_to_end(&mut answer) {
        panic!(
            "no complete answer within {limit:?} ({e}); got: {}",
            text(&answer)
        );
    }
    let answer = text(&answer);
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// Acceptance 2: the leader paused (SIGSTOP) past its lease while another server takes
/// over, then resumed with work to commit (a job registration queued in its socket,
/// heartbeat timers due for nodes that did not reach it): it never commits. No node is
/// marked down, no allocation changes, the queued job is placed at most once (by the
/// real leader), its log says it was fenced or stepped down, and every server names
/// one leader.
#[test]
fn a_paused_leader_resumed_past_its_lease_never_commits() {
    let _one = common::serial();
    // Heartbeats due every 2 s + 2 s grace (not 1 s: a live node that waits 1.5 s for
    // the CPU on a loaded machine would be marked down): the paused leader's timers
    // are all due when it resumes.
    let Some(mut c) = HaCluster::start(3, 2, "2s") else {
        return;
    };
    let base = sleeper(11);
    let queued = sleeper(12);
    let _cleanup = Cleanup(vec![base.clone(), queued.clone()]);
    let nodes = c.wait_nodes_ready(Duration::from_secs(30));
    let (leader, term) = c.wait_leader(Duration::from_secs(10), None);
    let file = job_file(c.root.path(), "base", &service_job("base", 4, &base));
    let out = c.servers[leader].cli(&["job", "run", file.to_str().unwrap()]);
    assert!(out.status.success(), "job run: {}", text(&out.stderr));
    let (before, procs) = wait_running(&c, "base", 4, &base, Duration::from_secs(30));

    let old = c.servers[leader].name.clone();
    let stale_log_len = c.servers[leader].log_text().len();
    c.servers[leader].pause();
    let paused_at = Instant::now();
    let (new_leader, new_term) = c.wait_leader(LEASE_TTL + Duration::from_secs(15), Some(&old));
    eprintln!(
        "{} leads (term {new_term}) {:?} after {old} (term {term}) was paused",
        c.servers[new_leader].name,
        paused_at.elapsed()
    );
    // Its lease is past by its own clock too, and its heartbeat timers (TTL + grace:
    // 4 s) are due; queue a job registration in its socket.
    while paused_at.elapsed() < (LEASE_TTL + Duration::from_secs(1)).max(Duration::from_secs(5)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let job_text = service_job("queued", 2, &queued);
    let spec = drover_server_api::jobfile::parse_and_validate(&job_text, "queued.toml")
        .expect("a valid job");
    let body = serde_json::to_string(&drover_server_api::nomad::JobRegisterRequest::new(
        drover_server_api::nomad::Job::from(&spec),
    ))
    .unwrap();
    let conn = send_http(c.servers[leader].http, "/v1/jobs", &body);

    c.servers[leader].resume();
    let resumed_at = Instant::now();
    let (code, answer) = read_http(conn, Duration::from_secs(30));
    eprintln!(
        "the job registration queued at the paused {old}: {code} {answer} ({:?} after it resumed)",
        resumed_at.elapsed()
    );
    // Every live server, the resumed one too, names the one leader, and only it says
    // it leads.
    let (agreed, _) = c.wait_leader(Duration::from_secs(15), None);
    assert_eq!(
        c.servers[agreed].name, c.servers[new_leader].name,
        "leadership moved again"
    );
    for s in c.live() {
        let status = s.status().unwrap_or_else(|e| panic!("{e}"));
        let leaders: Vec<&Value> = status["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["leader"] == true)
            .collect();
        assert_eq!(
            leaders.len(),
            1,
            "{} shows {} leaders: {status:#}",
            s.name,
            leaders.len()
        );
        assert_eq!(leaders[0]["name"], c.servers[new_leader].name.as_str());
    }
    // Its log says its commits were refused (fenced) or that it stepped down.
    let stale = c.servers[leader].log_text()[stale_log_len..].to_owned();
    let lines: Vec<&str> = stale
        .lines()
        .filter(|l| l.contains("lead") || l.contains("term") || l.contains("refused"))
        .collect();
    eprintln!("{old} after it resumed:\n{}", lines.join("\n"));
    let fenced = stale.contains("the store refused a commit: this server's term is over");
    let stepped_down = stale.contains("leadership lost: following again");
    assert!(
        fenced || stepped_down,
        "the resumed {old} does not log that it was fenced or stepped down:\n{}",
        common::ha::tail(&stale, 40)
    );
    assert!(!stale.contains(": leading "), "{old} led again");
    eprintln!("{old}: a commit fenced: {fenced}, stepped down: {stepped_down}");

    // The queued job: placed once by the real leader, or refused and never placed.
    let queued_job = c.job("queued");
    if (200..300).contains(&code) {
        wait_running(&c, "queued", 2, &queued, Duration::from_secs(30));
    } else {
        // Nomad's errors are a line of text.
        assert!(
            !answer.trim().is_empty() && !answer.trim_start().starts_with('{'),
            "a refused registration says why: {code} {answer}"
        );
        if let Ok(job) = &queued_job {
            assert!(
                allocations(job).is_empty(),
                "a refused registration was placed: {}",
                describe(job)
            );
        }
    }
    // Nothing of the stale leader's timers or plans committed, and it stays so for
    // longer than a heartbeat TTL + grace.
    let settle = Instant::now() + Duration::from_secs(5);
    while Instant::now() < settle {
        assert_nodes_untouched(&c, &nodes);
        assert_untouched(&c, "base", &before, &procs, &base);
        std::thread::sleep(Duration::from_millis(500));
    }
    if (200..300).contains(&code) {
        let job = c.job("queued").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            allocations(&job).len(),
            2,
            "placed twice: {}",
            describe(&job)
        );
    }
    c.shutdown();
}

/// What a user sees of the servers `at` while etcd is down: reads answered from the
/// last known state (the same allocations), `server status` answering with the
/// endpoint unhealthy, a write (`job run`) refused at once with a message naming the
/// store.
fn outage_checks(c: &HaCluster, phase: &str, at: &[usize], before: &Value, file: &std::path::Path) {
    for &i in at {
        let s = &c.servers[i];
        let args = ["job", "status", "first", "--json"];
        let t = Instant::now();
        let out = s
            .cli_within(&args, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("a read at {} {phase}: {e}", s.name));
        let job = common::ha::json_of(&out, &args)
            .unwrap_or_else(|e| panic!("a read at {} {phase} failed: {e}", s.name));
        eprintln!(
            "{phase}: a read at {} answered in {:?}: {}",
            s.name,
            t.elapsed(),
            describe(&job)
        );
        assert_eq!(
            running_ids(&job),
            running_ids(before),
            "{phase}: {} answered another state",
            s.name
        );

        let status = s
            .status()
            .unwrap_or_else(|e| panic!("server status at {} {phase}: {e}", s.name));
        eprintln!(
            "{phase}: server status at {}: leader {}, store {}",
            s.name, status["leader"], status["store"]
        );
        assert_eq!(status["store"]["kind"], "etcd", "{status:#}");
        let endpoints = status["store"]["endpoints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !endpoints.is_empty() && endpoints.iter().all(|e| e["healthy"] == false),
            "{phase}: etcd is down, yet {} says: {status:#}",
            s.name
        );

        let t = Instant::now();
        let out = s
            .cli_within(
                &["job", "run", "--detach", file.to_str().unwrap()],
                Duration::from_secs(30),
            )
            .unwrap_or_else(|e| panic!("a write at {} {phase}: {e}", s.name));
        let err = text(&out.stderr);
        eprintln!(
            "{phase}: a write at {}: {} after {:?}: {}",
            s.name,
            out.status,
            t.elapsed(),
            err.trim()
        );
        assert!(
            !out.status.success(),
            "{phase}: a write succeeded at {}",
            s.name
        );
        assert_eq!(out.status.code(), Some(1), "{err}");
        let lower = err.to_lowercase();
        assert!(
            lower.contains("etcd") || lower.contains("store"),
            "{phase}: the failed write at {} does not name the store: {err}",
            s.name
        );
    }
}

/// Acceptance 3: etcd killed (-9) and started again on its data dir. While it is down,
/// a server answers reads from what it knows or fails clearly, a write fails clearly
/// naming the store, and `server status` shows the endpoint unhealthy; once it is back
/// the servers carry on: a leader, a healthy endpoint, a new job placed, and the first
/// job's allocations untouched.
#[test]
fn an_etcd_restart_loses_nothing_and_writes_fail_clearly_meanwhile() {
    let _one = common::serial();
    let Some(mut c) = HaCluster::start(2, 2, "2s") else {
        return;
    };
    let first = sleeper(21);
    let second = sleeper(22);
    let _cleanup = Cleanup(vec![first.clone(), second.clone()]);
    let nodes = c.wait_nodes_ready(Duration::from_secs(30));
    let (leader, _) = c.wait_leader(Duration::from_secs(10), None);
    let follower = c.follower_of(leader);
    let file = job_file(c.root.path(), "first", &service_job("first", 4, &first));
    let out = c.servers[follower].cli(&["job", "run", file.to_str().unwrap()]);
    assert!(out.status.success(), "job run: {}", text(&out.stderr));
    let (before, procs) = wait_running(&c, "first", 4, &first, Duration::from_secs(30));

    c.etcd().kill9();
    let down_at = Instant::now();
    let file = job_file(c.root.path(), "second", &service_job("second", 2, &second));
    outage_checks(
        &c,
        "just after etcd died",
        &[leader, follower],
        &before,
        &file,
    );
    // Past the lease TTL, by every server's clock: no server may lead any more.
    while down_at.elapsed() < LEASE_TTL + Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
    }
    outage_checks(
        &c,
        "past the lease TTL",
        &[leader, follower],
        &before,
        &file,
    );
    eprintln!("etcd was down {:?}", down_at.elapsed());

    c.etcd().start_again();
    let up_at = Instant::now();
    let (leader, _) = c.poll(
        Duration::from_secs(30),
        "a leader and a healthy etcd endpoint after etcd's restart",
        || {
            let (leader, term) = c.leader_except(None)?;
            for s in c.live() {
                let status = s.status()?;
                let eps = status["store"]["endpoints"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if eps.is_empty() || !eps.iter().all(|e| e["healthy"] == true) {
                    return Err(format!("{}: {}", s.name, status["store"]));
                }
            }
            Ok((leader, term))
        },
    );
    eprintln!(
        "after etcd's restart: {} leads, {:?} after the restart",
        c.servers[leader].name,
        up_at.elapsed()
    );
    // The write refused meanwhile left nothing behind.
    let out = c.servers[leader].cli(&["job", "status", "second", "--json"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("not found"),
        "a write refused while etcd was down was committed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let follower = c.follower_of(leader);
    let out = c.servers[follower].cli(&["job", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run after etcd's restart: {}{}",
        text(&out.stderr),
        text(&out.stdout)
    );
    wait_running(&c, "second", 2, &second, Duration::from_secs(30));
    assert_untouched(&c, "first", &before, &procs, &first);
    assert_nodes_untouched(&c, &nodes);
    c.shutdown();
}

/// A service job of `count` copies of `argv` whose task carries `version` in its
/// environment (a new version replaces the copies), rolled out one at a time, each
/// healthy once it ran for 3 s.
fn rolling_job(name: &str, count: u32, argv: &[String], version: u32) -> String {
    format!(
        r#"
name = "{name}"
type = "service"
update = {{ max_parallel = 1, health_check = "task_states", min_healthy_time = "3s", healthy_deadline = "60s", progress_deadline = "120s" }}

[[group]]
name = "app"
count = {count}

[[group.task]]
name = "main"
driver = "rawexec"
env = {{ ROLL_VERSION = "{version}" }}
config = {{ command = "{}", args = ["{}"] }}
resources = {{ cpu = 50, memory_mb = 16 }}
"#,
        argv[0], argv[1]
    )
}

/// Nomad's API of server `i` of the cluster.
fn nomad_api(c: &HaCluster, i: usize) -> common::nomad_http::NomadApi {
    let url = c.servers[i].http_url();
    let port = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"));
    common::nomad_http::NomadApi::new(port)
}

/// The newest deployment of `job` once `cond` holds for it (asked of the leader of
/// the moment).
fn wait_deployment(
    c: &HaCluster,
    job: &str,
    what: &str,
    limit: Duration,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let began = Instant::now();
    let mut last = Value::Null;
    while began.elapsed() < limit {
        if let Ok(leader) = c.leader_index()
            && let Some(d) = nomad_api(c, leader).get_json(&format!("/v1/job/{job}/deployment"))
        {
            if cond(&d) {
                return d;
            }
            last = d;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{what}: not within {limit:?}; last deployment:\n{last:#}");
}

/// Issue 25, acceptance 4: the leader is killed mid-deployment; the next one finishes
/// it, with no allocation doubled or lost.
#[test]
fn a_deployment_survives_a_leader_kill_and_finishes_without_doubles_or_losses() {
    let _one = common::serial();
    let Some(mut c) = HaCluster::start(3, 2, "2s") else {
        return;
    };
    let argv = sleeper(7);
    let _cleanup = Cleanup(vec![argv.clone()]);
    c.wait_nodes_ready(Duration::from_secs(30));
    let (leader, _) = c.wait_leader(Duration::from_secs(10), None);

    let v0 = job_file(c.root.path(), "roll", &rolling_job("roll", 3, &argv, 0));
    let out = c.servers[leader].cli(&["job", "run", "--detach", v0.to_str().unwrap()]);
    assert!(out.status.success(), "job run v0: {}", text(&out.stderr));
    wait_deployment(&c, "roll", "v0 deployed", Duration::from_secs(60), |d| {
        d["JobVersion"] == 0 && d["Status"] == "successful"
    });

    let v1 = job_file(c.root.path(), "roll", &rolling_job("roll", 3, &argv, 1));
    let out = c.servers[leader].cli(&["job", "run", "--detach", v1.to_str().unwrap()]);
    assert!(out.status.success(), "job run v1: {}", text(&out.stderr));
    // Mid-deployment: one new copy healthy, two to go.
    let mid = wait_deployment(&c, "roll", "v1 one copy in", Duration::from_secs(60), |d| {
        d["JobVersion"] == 1 && d["TaskGroups"]["app"]["HealthyAllocs"] == 1
    });
    assert_eq!(mid["Status"], "running", "{mid:#}");
    let id = mid["ID"].as_str().unwrap().to_owned();
    let old = c.servers[leader].name.clone();
    c.servers[leader].kill9();
    let (new_leader, _) = c.wait_leader(LEASE_TTL + Duration::from_secs(15), Some(&old));
    eprintln!("{} leads after {old} was killed mid-deployment", c.servers[new_leader].name);

    let done = wait_deployment(&c, "roll", "v1 deployed", Duration::from_secs(90), |d| {
        d["ID"] == id.as_str() && d["Status"] != "running"
    });
    assert_eq!(done["Status"], "successful", "{done:#}");
    let group = &done["TaskGroups"]["app"];
    assert_eq!(
        (
            group["PlacedAllocs"].as_u64(),
            group["HealthyAllocs"].as_u64(),
            group["UnhealthyAllocs"].as_u64()
        ),
        (Some(3), Some(3), Some(0)),
        "each copy replaced once: {done:#}"
    );
    let allocs = nomad_api(&c, new_leader)
        .get_json("/v1/job/roll/allocations")
        .unwrap_or_default();
    let allocs = allocs.as_array().cloned().unwrap_or_default();
    let live: Vec<&Value> = allocs.iter().filter(|a| a["DesiredStatus"] == "run").collect();
    let names: BTreeSet<&str> = live.iter().filter_map(|a| a["Name"].as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["roll.app[0]", "roll.app[1]", "roll.app[2]"]),
        "three copies, one per index: {live:#?}"
    );
    assert!(live.iter().all(|a| a["JobVersion"] == 1), "{live:#?}");
    assert!(
        allocs.iter().all(|a| a["ClientStatus"] != "lost"),
        "no allocation lost: {allocs:#?}"
    );
    // And on the nodes: three task processes of the new version, no more.
    let procs = c.poll(Duration::from_secs(30), "three task processes", || {
        let procs = c.task_procs(&argv);
        if procs.len() == 3 {
            Ok(procs)
        } else {
            Err(format!("{procs:?}"))
        }
    });
    let by_alloc: BTreeSet<&str> = live.iter().filter_map(|a| a["ID"].as_str()).collect();
    assert!(
        procs.keys().all(|a| by_alloc.contains(a.as_str())),
        "processes of allocations that should not run: {procs:?} vs {by_alloc:?}"
    );
}
