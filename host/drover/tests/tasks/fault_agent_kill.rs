//! Fault tests: `kill -9` of the agent while tasks run and while tasks are starting.
//! After a restart on the same data dir every task is found again: long tasks still
//! run with the same pid, tasks that exited while no agent watched report their real
//! exit code, and no task was ever started twice (each task appends its pid to a mark
//! file when it starts, so a second start shows up as a second line).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::tasks::*;
use common::*;
use drover_api::{RunRequest, StopRequest, TaskLifecycle, TaskView};

/// SIGKILLs every task process the test started, whatever happens to the test.
#[derive(Default)]
struct TaskReaper {
    marks: PathBuf,
}

impl Drop for TaskReaper {
    fn drop(&mut self) {
        for pids in read_marks(&self.marks).values() {
            for pid in pids {
                let _ = nix_kill(*pid, 9);
            }
        }
    }
}

/// Mark file name → pids written to it, one line per start.
fn read_marks(dir: &Path) -> BTreeMap<String, Vec<u32>> {
    let mut marks = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "go" {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let pids = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        marks.insert(name, pids);
    }
    marks
}

fn new_agent(root: &Path) -> Agent {
    // A killed agent leaves its socket file; the new agent replaces it, but the test
    // helper waits for the file to appear, so it must not see the stale one.
    let _ = std::fs::remove_file(root.join("data").join("api.sock"));
    let agent = Agent::start(root, &root.join("plugins"), &[]);
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    agent
}

fn kill9(agent: &mut Agent) {
    agent.child.kill().expect("kill -9 the agent");
    agent.child.wait().expect("reap the agent");
}

/// A task that records its start, then runs `tail` (shell code).
fn task_body(name: &str, marks: &Path, tail: &str) -> RunRequest {
    request(serde_json::json!({
        "driver": "rawexec",
        "name": name,
        "env": {"MARKS": marks.display().to_string()},
        "kill_timeout": "1s",
        "config": {
            "command": "/bin/sh",
            "args": ["-c", format!("echo $$ >> \"$MARKS/$DROVER_TASK_NAME\"; {tail}")],
        },
    }))
}

fn all_tasks(agent: &Agent) -> Vec<TaskView> {
    let api = agent.api();
    api.block_on(api.list_tasks())
        .unwrap_or_else(|e| panic!("list the tasks: {e}"))
}

/// Wait until the restarted agent has finished start-up recovery (its health says
/// so), then until every task is settled: running, or dead with its exit reported.
/// Tasks that exited while no agent ran turn dead right after recovery, when their
/// driver reports the result it kept.
fn settled(agent: &Agent, within: Duration, done: impl Fn(&TaskView) -> bool) -> Vec<TaskView> {
    let deadline = Instant::now() + within;
    let api = agent.api();
    loop {
        let health = api.block_on(api.health());
        if health.as_ref().is_ok_and(|h| h.recovery.is_some()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "recovery did not finish within {within:?}: {health:?}\nagent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    loop {
        let tasks = all_tasks(agent);
        if tasks.iter().all(&done) {
            return tasks;
        }
        assert!(
            Instant::now() < deadline,
            "tasks did not settle within {within:?}: {tasks:#?}\nagent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop_all(agent: &Agent) {
    let ids: Vec<String> = all_tasks(agent)
        .iter()
        .filter(|t| t.state != TaskLifecycle::Dead)
        .map(|t| t.id.clone())
        .collect();
    let stop = StopRequest {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    std::thread::scope(|s| {
        for id in &ids {
            let stop = &stop;
            s.spawn(move || {
                let api = agent.api();
                let _ = api.block_on(api.stop_task(id, stop));
            });
        }
    });
}

#[test]
fn fifty_tasks_survive_kill_9_of_the_agent() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let marks = root.path().join("marks");
    std::fs::create_dir_all(root.path().join("plugins")).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    let _reaper = TaskReaper {
        marks: marks.clone(),
    };
    let mut first = new_agent(root.path());

    // 25 long tasks and 25 short ones; the short ones exit (each with its own code)
    // only once the test creates `go`, which it does after killing the agent.
    let bodies: Vec<(String, Option<i32>, RunRequest)> = (0..50)
        .map(|i| {
            let name = format!("t{i:02}");
            if i % 2 == 0 {
                let body = task_body(&name, &marks, "exec sleep 1000");
                (name, None, body)
            } else {
                let code = 10 + i;
                let tail =
                    format!("while [ ! -e \"$MARKS/go\" ]; do sleep 0.05; done; exit {code}");
                let body = task_body(&name, &marks, &tail);
                (name, Some(code), body)
            }
        })
        .collect();
    let started: Vec<(String, Option<i32>, TaskView)> = std::thread::scope(|s| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|(name, code, body)| {
                let socket = first.socket.clone();
                s.spawn(move || {
                    let api = Api::new(&socket);
                    let view = api
                        .block_on(api.run_task(body))
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    (name.clone(), *code, view)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every task is running and has written its mark before the agent dies.
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_marks(&marks).len() < 50 {
        assert!(Instant::now() < deadline, "not every task started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids: BTreeMap<String, u32> = started
        .iter()
        .map(|(name, _, view)| {
            (
                name.clone(),
                pid_of(view).unwrap_or_else(|| panic!("{name} has no pid: {view:#?}")),
            )
        })
        .collect();

    kill9(&mut first);
    std::fs::write(marks.join("go"), "").unwrap();
    // The short tasks exit while no agent runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    for (name, code, _) in &started {
        if code.is_some() {
            while running(pids[name]) {
                assert!(Instant::now() < deadline, "{name} did not exit");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    let second = new_agent(root.path());
    let short: std::collections::BTreeSet<&str> = started
        .iter()
        .filter(|(_, code, _)| code.is_some())
        .map(|(name, _, _)| name.as_str())
        .collect();
    let tasks = settled(&second, Duration::from_secs(30), |t| {
        if short.contains(t.name.as_str()) {
            t.state == TaskLifecycle::Dead
        } else {
            t.state == TaskLifecycle::Running && kinds(t).iter().any(|k| k == "Recovered")
        }
    });
    assert_eq!(tasks.len(), 50, "{tasks:#?}");
    let by_name: BTreeMap<String, &TaskView> = tasks.iter().map(|t| (t.name.clone(), t)).collect();
    for (name, code, _) in &started {
        let t = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{name} was lost: {tasks:#?}"));
        match code {
            None => {
                assert_eq!(t.state, TaskLifecycle::Running, "{name}: {t:#?}");
                assert_eq!(pid_of(t), Some(pids[name]), "{name} changed pid: {t:#?}");
                assert!(running(pids[name]), "{name} is not running any more");
            }
            Some(code) => {
                assert_eq!(t.state, TaskLifecycle::Dead, "{name}: {t:#?}");
                assert_eq!(t.exit_code, Some(*code), "{name}: wrong exit code: {t:#?}");
            }
        }
    }
    for (name, starts) in read_marks(&marks) {
        assert_eq!(starts.len(), 1, "{name} was started {} times", starts.len());
    }
    stop_all(&second);
}

/// Run a task; `None` when the kill cut the connection (an expected outcome here),
/// or the agent did not answer with the started task.
fn try_run(socket: &Path, body: &RunRequest) -> Option<TaskView> {
    let api = Api::new(socket);
    api.block_on(api.run_task(body)).ok()
}

/// A tiny deterministic generator, seeded from the clock and printed, so a failing run
/// can be repeated with `DROVER_FAULT_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn kill_9_at_random_points_of_task_start_up_twenty_times() {
    let _serial = serial();
    let seed = std::env::var("DROVER_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("DROVER_FAULT_SEED={seed}");
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().unwrap();
    let marks = root.path().join("marks");
    std::fs::create_dir_all(root.path().join("plugins")).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    let _reaper = TaskReaper {
        marks: marks.clone(),
    };
    // Killed agents are kept until the end: dropping one would kill the plugin it
    // launched, which later agents reattached to.
    let mut agents = Vec::new();
    // name → pid the API reported, for starts whose answer arrived.
    let mut answered: BTreeMap<String, u32> = BTreeMap::new();
    for round in 0..20 {
        let mut agent = new_agent(root.path());
        let kill_after = Duration::from_micros(rng.next() % 300_000);
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| {
                    let socket = agent.socket.clone();
                    let body = task_body(&format!("r{round:02}-{i}"), &marks, "exec sleep 1000");
                    s.spawn(move || try_run(&socket, &body))
                })
                .collect();
            std::thread::sleep(kill_after);
            kill9(&mut agent);
            handles
                .into_iter()
                .filter_map(|h| h.join().ok().flatten())
                .collect::<Vec<_>>()
        });
        for view in results {
            if let Some(pid) = pid_of(&view) {
                answered.insert(view.name.clone(), pid);
            }
        }
        agents.push(agent);
    }

    let last = new_agent(root.path());
    let known = settled(&last, Duration::from_secs(60), |t| {
        t.state != TaskLifecycle::Pending
    });
    let by_name: BTreeMap<String, &TaskView> = known.iter().map(|t| (t.name.clone(), t)).collect();
    // A task the recovering agent started last may be running before its shell has
    // written its mark (and `>>` creates the file before writing to it): give the
    // marks a moment to catch up with what the agent says.
    let deadline = Instant::now() + Duration::from_secs(30);
    let marks_now = loop {
        let m = read_marks(&marks);
        let complete = m.values().all(|pids| !pids.is_empty())
            && by_name
                .keys()
                .all(|name| m.get(name).is_some_and(|pids| !pids.is_empty()));
        if complete || Instant::now() >= deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let context = || format!("seed {seed}\nmarks {marks_now:?}\ntasks {known:#?}");
    // Nothing was started twice.
    for (name, starts) in &marks_now {
        assert_eq!(
            starts.len(),
            1,
            "{name} started {} times; {}",
            starts.len(),
            context()
        );
    }
    // Every start the API confirmed is still running, with the same pid.
    for (name, pid) in &answered {
        let t = by_name
            .get(name)
            .unwrap_or_else(|| panic!("confirmed task {name} was lost; {}", context()));
        assert_eq!(t.state, TaskLifecycle::Running, "{name}; {}", context());
        assert_eq!(pid_of(t), Some(*pid), "{name} changed pid; {}", context());
    }
    // Every task that started at all is known, running, and is that very process:
    // no task runs behind the agent's back.
    for (name, starts) in &marks_now {
        let t = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{name} runs but the agent does not know it; {}", context()));
        assert_eq!(t.state, TaskLifecycle::Running, "{name}; {}", context());
        assert_eq!(pid_of(t), starts.first().copied(), "{name}; {}", context());
    }
    // And every task the agent knows has started exactly once by now (a task that
    // was only accepted before a kill is started by the recovering agent).
    for (name, t) in &by_name {
        assert!(
            marks_now.contains_key(name),
            "{name} is known but never started: {t:#?}; {}",
            context()
        );
    }
    eprintln!(
        "kill -9 rounds: {} tasks confirmed, {} known after recovery, {} started",
        answered.len(),
        by_name.len(),
        marks_now.len()
    );
    stop_all(&last);
    drop(last);
    drop(agents);
}
