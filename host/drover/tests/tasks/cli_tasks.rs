//! Task spec files, events, stats and API errors through the real `drover` binary.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::rawexec_agent as agent;
use drover_api::{LogsOptions, StatusCode};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tasks")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The agent's error answer: its status and message.
fn refusal(e: drover_api::Error) -> (StatusCode, String) {
    match e {
        drover_api::Error::Status { status, message } => (status, message),
        other => panic!("not an error answer of the agent: {other:?}"),
    }
}

#[test]
fn every_example_spec_parses() {
    let mut seen = 0;
    for entry in std::fs::read_dir(examples()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let spec = drover_api::taskfile::parse(&text, &path.display().to_string(), &|name| {
                drover_plugin_sdk::Signal::parse_or_default(name)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
            .unwrap_or_else(|e| panic!("{e}"));
            assert!(!spec.request.driver.is_empty(), "{}", path.display());
            seen += 1;
        }
    }
    assert!(seen > 0, "no example specs in {}", examples().display());
}

#[test]
fn the_example_spec_runs_with_every_section_applied() {
    let (_root, agent) = agent();
    let file = examples().join("ticker.toml");
    let task = agent.cli_json(&["task", "run", file.to_str().unwrap(), "--json"]);
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(task["name"], "ticker");
    let out = agent.cli(&["task", "wait", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // [env] reached the task, [config] ran it.
    let out = agent.cli(&["task", "logs", &id]);
    let want: String = (1..=20).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(stdout(&out), want);
    let out = agent.cli(&["task", "logs", &id, "--stderr"]);
    assert_eq!(stdout(&out), "done\n");

    let out = agent.cli(&["task", "events", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("TIME") && header.contains("TYPE") && header.contains("MESSAGE"),
        "{text}"
    );
    let events = agent.cli_json(&["task", "events", &id, "--json"]);
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    let order = ["Received", "Started", "Terminated"];
    let positions: Vec<usize> = order
        .iter()
        .map(|k| {
            kinds
                .iter()
                .position(|x| x == k)
                .unwrap_or_else(|| panic!("no {k} in {kinds:?}"))
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{kinds:?}");
    for e in events.as_array().unwrap() {
        assert!(
            humantime::parse_rfc3339(e["time"].as_str().unwrap()).is_ok(),
            "{e}"
        );
        assert!(text.contains(e["message"].as_str().unwrap()), "{text}");
    }
}

#[test]
fn spec_errors_name_the_file_the_line_and_the_field() {
    let (root, agent) = agent();
    let write = |name: &str, text: &str| {
        let path = root.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let cases = [
        (
            write("syntax.toml", "driver = \"rawexec\"\nname = web\n"),
            ":2: invalid TOML at column 8",
        ),
        (
            write(
                "restart.toml",
                "driver = \"rawexec\"\n[config]\ncommand = \"/bin/true\"\n\n[restart]\natempts = 3\n",
            ),
            ":6: restart.atempts: unknown field `atempts`",
        ),
        (
            write(
                "type.toml",
                "driver = \"rawexec\"\n[resources]\nmemory_mb = \"lots\"\n",
            ),
            ":3: resources.memory_mb: invalid type: string \"lots\"",
        ),
        (
            write(
                "duration.toml",
                "driver = \"rawexec\"\nkill_timeout = \"soon\"\n",
            ),
            ":2: kill_timeout: \"soon\" is not a duration",
        ),
        // Only the agent knows the driver's schema; the answer points into the file.
        (
            write(
                "config.toml",
                "driver = \"rawexec\"\nname = \"x\"\n\n[config]\nargs = [\"hi\"]\n\ncomand = \"/bin/echo\"\n",
            ),
            ":7: config.comand: unknown field \"comand\"",
        ),
        (
            write("nodriver.toml", "[config]\ncommand = \"/bin/true\"\n"),
            ": no driver: add `driver = \"...\"` or give --driver",
        ),
    ];
    for (file, want) in &cases {
        let out = agent.cli(&["task", "run", file]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{file} was accepted");
        assert!(
            err.contains(&format!("{file}{want}")),
            "{file}: expected {want:?} in:\n{err}"
        );
    }
    let out = agent.cli(&["task", "run", "/nonexistent/job.toml"]);
    assert!(stderr(&out).contains("cannot read task spec /nonexistent/job.toml"));
    assert_eq!(
        agent.cli_json(&["task", "list", "--json"]),
        serde_json::json!([]),
        "a refused spec created a task"
    );
}

#[test]
fn flags_override_the_spec_file() {
    let (root, agent) = agent();
    let file = root.path().join("job.toml");
    std::fs::write(
        &file,
        "driver = \"rawexec\"\nname = \"from-file\"\n\n[config]\ncommand = \"/bin/sh\"\n\
         args = [\"-c\", \"exit 3\"]\n\n[env]\nA = \"file\"\nB = \"file\"\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let task = agent.cli_json(&[
        "task",
        "run",
        file,
        "--name",
        "from-flag",
        "--config",
        r#"{"args":["-c","echo $A $B; exit 7"]}"#,
        "--env",
        "B=flag",
        "--json",
    ]);
    let id = task["id"].as_str().unwrap();
    assert_eq!(task["name"], "from-flag");
    assert_eq!(agent.cli(&["task", "wait", id]).status.code(), Some(7));
    assert_eq!(stdout(&agent.cli(&["task", "logs", id])), "file flag\n");

    // A mistake in a --config key is the flag's, not the file's.
    let out = agent.cli(&["task", "run", file, "--config", r#"{"comand":"x"}"#]);
    assert!(
        stderr(&out).contains("--config: config.comand: unknown field \"comand\""),
        "{}",
        stderr(&out)
    );
    // Without a file the flags alone still work, and --driver is required.
    let out = agent.cli(&["task", "run", "--config", "{}"]);
    assert!(stderr(&out).contains("give a task spec file or --driver"));
}

#[test]
fn stats_events_and_api_errors() {
    let (_root, agent) = agent();
    let task = agent.cli_json(&[
        "task",
        "run",
        "--driver",
        "rawexec",
        "--config",
        r#"{"command":"/bin/sleep","args":["1000"]}"#,
        "--json",
    ]);
    let id = task["id"].as_str().unwrap().to_owned();

    let sample = agent.cli_json(&["task", "stats", &id, "--json"]);
    assert_eq!(sample["task_id"], id.as_str());
    assert!(sample["memory_rss_bytes"].as_u64().unwrap() > 0, "{sample}");
    assert!(sample["cpu_percent"].as_f64().unwrap() >= 0.0, "{sample}");
    let out = agent.cli(&["task", "stats", &id]);
    let text = stdout(&out);
    assert!(
        text.starts_with("TIME") && text.contains("CPU %") && text.contains("iB"),
        "{text}"
    );

    // API errors: JSON with a message and the right status.
    let api = agent.api();
    let (code, message) = refusal(
        api.block_on(api.task_logs("nosuch", &LogsOptions::default()))
            .unwrap_err(),
    );
    assert_eq!(code, StatusCode::NOT_FOUND, "{message}");
    assert!(message.contains("nosuch"));
    assert_eq!(
        refusal(api.block_on(api.task_events("nosuch")).unwrap_err()).0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        refusal(api.block_on(api.task_stats("nosuch")).unwrap_err()).0,
        StatusCode::NOT_FOUND
    );
    // Values the typed client cannot send: a stream that is no stream, an interval
    // that is no duration.
    let raw = api
        .block_on(api.get_raw(&["v1", "tasks", &id, "logs"], &[("stream", "stdin")]))
        .unwrap();
    assert_eq!(raw.status, StatusCode::BAD_REQUEST, "{raw:?}");
    let message = raw.error_message().unwrap();
    assert!(message.contains("stream"), "{message}");
    let both = LogsOptions {
        tail: Some(3),
        offset: Some(5),
        ..Default::default()
    };
    let (code, message) = refusal(api.block_on(api.task_logs(&id, &both)).unwrap_err());
    assert_eq!(code, StatusCode::BAD_REQUEST, "{message}");
    let raw = api
        .block_on(api.get_raw(&["v1", "tasks", &id, "stats"], &[("interval", "often")]))
        .unwrap();
    assert_eq!(raw.status, StatusCode::BAD_REQUEST, "{raw:?}");
    let message = raw.error_message().unwrap();
    assert!(message.contains("often"), "{message}");

    agent.cli_json(&["task", "stop", &id, "--json"]);
    let (code, message) = refusal(api.block_on(api.task_stats(&id)).unwrap_err());
    assert_eq!(code, StatusCode::CONFLICT, "{message}");
    let out = agent.cli(&["task", "stats", &id]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not running"), "{}", stderr(&out));
    let kinds: Vec<String> = agent
        .cli_json(&["task", "events", &id, "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(kinds.contains(&"Killing".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"Terminated".to_owned()), "{kinds:?}");
}

#[test]
fn stats_follow_streams_until_the_task_exits() {
    let (_root, agent) = agent();
    let task = agent.cli_json(&[
        "task",
        "run",
        "--driver",
        "rawexec",
        "--config",
        r#"{"command":"/bin/sleep","args":["3"]}"#,
        "--json",
    ]);
    let id = task["id"].as_str().unwrap();
    let t = Instant::now();
    let out = agent.cli(&[
        "task",
        "stats",
        id,
        "--follow",
        "--interval",
        "200ms",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let samples: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(samples.len() >= 3, "{samples:?}");
    assert!(samples.iter().all(|s| s["task_id"] == id));
    // It ended because the task did (3 s), not at some timeout.
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    assert_eq!(
        agent.cli_json(&["task", "status", id, "--json"])["state"],
        "dead"
    );
}

/// The CLI's run of `args`: it failed cleanly (exit code 1, no panic, which is exit
/// code 101 and "panicked" on stderr) and said `want`. Returns stderr.
fn refused_cleanly(agent: &common::Agent, args: &[&str], want: &str) -> String {
    let out = agent.cli(args);
    let err = stderr(&out);
    assert_ne!(
        out.status.code(),
        Some(101),
        "drover {args:?} panicked: {err}"
    );
    assert!(!err.contains("panicked"), "drover {args:?} panicked: {err}");
    assert_eq!(out.status.code(), Some(1), "drover {args:?}: {err}");
    assert!(
        err.contains(want),
        "drover {args:?}: expected {want:?} in:\n{err}"
    );
    err
}

#[test]
fn odd_task_ids_get_the_agents_answer_not_a_panic() {
    let (_root, agent) = agent();
    // A space made the CLI panic building the request URI.
    refused_cleanly(
        &agent,
        &["task", "status", "a b"],
        "no task with id \"a b\"",
    );
    // A path in the id took the request to another endpoint.
    let err = refused_cleanly(
        &agent,
        &["task", "logs", "../../x"],
        "no task with id \"../../x\"",
    );
    assert!(!err.contains("no such API endpoint"), "{err}");
    // Every subcommand that takes an id, with ids that are paths, queries, escapes.
    for id in [
        "a b",
        "../../x",
        "..",
        ".",
        "a/b",
        "x?stream=stderr",
        "100%",
        "%2F",
        "ünï ☃",
    ] {
        let want = format!("no task with id {id:?}");
        for args in [
            vec!["task", "status", id],
            vec!["task", "logs", id],
            vec!["task", "logs", id, "--stderr", "--tail", "3"],
            vec!["task", "events", id],
            vec!["task", "stats", id],
            vec!["task", "stats", id, "--follow"],
            vec!["task", "wait", id],
            vec!["task", "stop", id],
            vec!["task", "signal", id, "SIGHUP"],
            vec!["task", "destroy", id, "--force"],
        ] {
            refused_cleanly(&agent, &args, &want);
        }
    }
    refused_cleanly(&agent, &["task", "status", ""], "the task id is empty");

    // The id reaches the logs endpoint itself, as one segment: the logs endpoint, and
    // only it, checks its query before it looks the task up.
    let api = agent.api();
    let raw = api
        .block_on(api.get_raw(&["v1", "tasks", "../../x", "logs"], &[("stream", "stdin")]))
        .unwrap();
    assert_eq!(raw.status, StatusCode::BAD_REQUEST, "{raw:?}");
    let message = raw.error_message().unwrap();
    assert!(message.contains("stream"), "{message}");
    let (code, message) = refusal(
        api.block_on(api.task_logs("../../x", &LogsOptions::default()))
            .unwrap_err(),
    );
    assert_eq!(code, StatusCode::NOT_FOUND, "{message}");
    assert!(message.contains("no task with id \"../../x\""), "{message}");
    // And a real task is still found by its id.
    let task = agent.cli_json(&[
        "task",
        "run",
        "--driver",
        "rawexec",
        "--config",
        r#"{"command":"/bin/echo","args":["hi"]}"#,
        "--json",
    ]);
    let id = task["id"].as_str().unwrap();
    assert_eq!(agent.cli(&["task", "wait", id]).status.code(), Some(0));
    assert_eq!(stdout(&agent.cli(&["task", "logs", id])), "hi\n");
}
