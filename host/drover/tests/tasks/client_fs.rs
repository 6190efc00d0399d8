//! Nomad's client endpoints of the agent, `/v1/client/fs/logs/:alloc` and
//! `/v1/client/allocation/:id/stats`, over real rawexec tasks (the `drover` binary's
//! driver) of allocations a real allocation manager runs: what Nomad's clients
//! (python-nomad, the `nomad` CLI) and Drover's CLI read, on the agent's socket and
//! through a server that passes them to its local agent (`agent --dev`).

use crate::common;
use common::tasks::alloc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use drover_api::TaskLifecycle;
use drover_host::allocs::AllocManager;
use drover_host::api::ApiState;
use drover_host::config::AgentConfig;
use drover_host::limits::StreamCaps;
use drover_host::plugins::candidate::Builtin;
use drover_host::plugins::catalog::{Catalog, LoadContext};
use drover_host::state::{RedbStore, StateStore};
use drover_host::tasks::TaskManager;
use drover_server_api::client_fs::{AllocResourceUsage, FILE_EVENT_ERROR, StreamFrame};
use drover_server_api::{AllocClientUpdate, AllocLogsQuery, JobType, Task, TaskResources};
use drover_test_support::until;
use http_body_util::{BodyExt as _, Empty};
use hyper::StatusCode;
use hyper::body::Incoming;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(30);

/// An agent serving its API on a unix socket, with rawexec loaded and an allocation
/// manager.
struct Agent {
    root: tempfile::TempDir,
    tasks: Arc<TaskManager>,
    allocs: Arc<AllocManager>,
    streams: Arc<StreamCaps>,
    socket: PathBuf,
    stop: CancellationToken,
    _updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
}

impl Agent {
    async fn start() -> Agent {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        let plugin_dir = dir.join("plugins");
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::create_dir_all(&run_dir).unwrap();
        let store: Arc<dyn StateStore> = Arc::new(RedbStore::open(dir).unwrap());
        let config = AgentConfig {
            plugin_dir: Some(plugin_dir),
            data_dir: Some(dir.to_owned()),
            ..AgentConfig::default()
        };
        let builtins = vec![Builtin {
            name: "rawexec".into(),
            command: common::drover(),
            args: ["plugin", "serve", "rawexec"].map(Into::into).to_vec(),
        }];
        let ctx = Arc::new(LoadContext {
            timeout: LIMIT,
            socket_dir: run_dir,
            accepted: drover_plugin_sdk::version::supported_api_range(),
            agent: drover_plugin_sdk::AgentInfo::new(String::new())
                .with_alloc_dir(dir.join("alloc"))
                .with_plugin_state_dir(dir.join("plugin-state")),
            // raw_exec runs nothing unless enabled.
            settings: BTreeMap::from([(
                "raw_exec".to_owned(),
                drover_host::config::PluginSettings {
                    config: serde_json::json!({ "enabled": true }),
                    ..Default::default()
                },
            )]),
            plugin_pass_env: Vec::new(),
            plugin_auto_mtls: false,
            nomad: None,
        });
        let catalog = Arc::new(Catalog::new(store.clone()));
        let tasks = Arc::new(TaskManager::new(
            catalog.clone(),
            dir.join("alloc"),
            store.clone(),
        ));
        tasks.load().unwrap();
        catalog
            .load(&config, &builtins, ctx, CancellationToken::new())
            .await;
        tasks.recover().await;
        let (tx, updates) = mpsc::unbounded_channel();
        let allocs = AllocManager::new(tasks.clone(), store, tx);
        allocs.restore().await;
        let socket = dir.join("api.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let streams = Arc::new(StreamCaps::new(&config.limits));
        let stop = CancellationToken::new();
        tokio::spawn(drover_host::api::serve(
            listener,
            64,
            Duration::from_secs(10),
            ApiState {
                catalog,
                tasks: tasks.clone(),
                streams: streams.clone(),
                allocs: Some(allocs.clone()),
                forward: None,
            },
            stop.clone(),
            Duration::from_secs(1),
        ));
        Agent {
            root,
            tasks,
            allocs,
            streams,
            socket,
            stop,
            _updates: updates,
        }
    }

    /// Run allocation `id` with `tasks` (a batch job: a task that exits 0 is done).
    async fn run(&self, id: &str, tasks: Vec<Task>) {
        self.allocs
            .apply(vec![alloc(id, JobType::Batch, tasks)], false)
            .await;
    }

    /// Until `task` of allocation `alloc` runs; its directory.
    async fn task_dir(&self, alloc: &str, task: &str) -> PathBuf {
        let allocs = self.allocs.clone();
        let what = format!(
            "task {task} of {alloc} started (plugins: {:?})",
            self.tasks.list()
        );
        let deadline = tokio::time::Instant::now() + LIMIT;
        let tasks = self.tasks.clone();
        let started = || {
            allocs.task_id(alloc, task).is_some_and(|id| {
                tasks
                    .status(&id)
                    .is_ok_and(|v| v.state == TaskLifecycle::Running)
            })
        };
        while !started() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {LIMIT:?}; status {:?}",
                allocs.statuses()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let id = self.allocs.task_id(alloc, task).unwrap();
        self.tasks.status(&id).unwrap().task_dir
    }

    /// A file only this test writes, which a task's script waits for (bounded).
    fn gate(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// `GET target` on the agent's socket.
    async fn get(&self, target: &str) -> http::Response<Incoming> {
        let io = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
        request(io, target, &[]).await
    }

    /// Until `GET target` answers with a body (read whole) that satisfies `done`.
    async fn poll_body(&self, target: &str, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let resp = self.get(target).await;
            assert_eq!(resp.status(), StatusCode::OK, "{target}");
            let (body, _) = read_all(resp.into_body()).await;
            if done(&body) {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{target}: last answer {:?}",
                String::from_utf8_lossy(&body)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Leave no task running behind a failed test.
        self.allocs.shutdown();
        let tasks = self.tasks.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                for t in tasks.list() {
                    let _ = tasks.destroy(&t.id, true).await;
                }
            });
        });
        self.stop.cancel();
    }
}

fn sh(name: &str, script: &str) -> Task {
    Task {
        devices: Default::default(),
        volume_mounts: Default::default(),
        services: Default::default(),
        meta: Default::default(),
        name: name.into(),
        driver: "rawexec".into(),
        config: serde_json::json!({ "command": "/bin/sh", "args": ["-c", script] }),
        env: BTreeMap::new(),
        kill_signal: None,
        kill_timeout: Some(Duration::from_secs(3)),
        restart: None,
        resources: TaskResources::default(),
        logs: None,
        lifecycle: None,
        artifacts: Vec::new(),
        templates: Vec::new(),
        identity: None,
    }
}

/// A shell line that waits (at most 30 s) until `gate` exists.
fn wait_for(gate: &Path) -> String {
    format!(
        "i=0; while [ ! -e '{}' ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
        gate.display()
    )
}

/// `GET target` over `io`, with `headers`.
async fn request<IO>(io: IO, target: &str, headers: &[(&str, &str)]) -> http::Response<Incoming>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::get(target).header("host", "localhost");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    tokio::time::timeout(
        LIMIT,
        sender.send_request(req.body(Empty::<Bytes>::new()).unwrap()),
    )
    .await
    .expect("no answer")
    .unwrap()
}

/// The whole body, and the error that cut it short, if one did.
async fn read_all(mut body: Incoming) -> (Vec<u8>, Option<String>) {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(LIMIT, body.frame()).await {
            Err(_) => panic!(
                "the body did not end; so far {:?}",
                String::from_utf8_lossy(&out)
            ),
            Ok(None) => return (out, None),
            Ok(Some(Err(e))) => return (out, Some(e.to_string())),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
        }
    }
}

/// Nomad's frames, one JSON object after the other.
fn frames(body: &[u8]) -> Vec<StreamFrame> {
    serde_json::Deserializer::from_slice(body)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(body)))
}

fn data_of(frames: &[StreamFrame]) -> Vec<u8> {
    frames.iter().flat_map(|f| f.data.iter().copied()).collect()
}

fn content_type(resp: &http::Response<Incoming>) -> String {
    resp.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A task's stdout and stderr, as frames and as plain bytes, from the start and from
/// the end; Nomad's errors for what is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_nomads_frames_or_plain_bytes_of_the_tasks_exact_output() {
    let agent = Agent::start().await;
    let gate = agent.gate("done");
    let script = format!(
        "printf 'hello\\nworld\\n'; echo oops >&2; {}; echo bye",
        wait_for(&gate)
    );
    agent
        .run(
            "aaaaaaaa-0000-4000-8000-0000000000a1",
            vec![sh("web", &script)],
        )
        .await;
    agent
        .task_dir("aaaaaaaa-0000-4000-8000-0000000000a1", "web")
        .await;
    let base = "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a1?task=web";
    // What python-nomad sends.
    let nomad_default =
        format!("{base}&type=stdout&follow=False&offset=0&origin=start&plain=False");
    let body = agent
        .poll_body(&nomad_default, |b| data_of(&frames(b)) == b"hello\nworld\n")
        .await;
    let got = frames(&body);
    let last = got.last().unwrap();
    assert_eq!(last.file, "alloc/logs/web.stdout.0");
    assert_eq!(last.offset, 12, "the offset after the data in its file");
    let resp = agent.get(&nomad_default).await;
    assert_eq!(content_type(&resp), "application/json");

    let plain = agent.get(&format!("{base}&type=stdout&plain=true")).await;
    assert_eq!(plain.status(), StatusCode::OK);
    assert_eq!(content_type(&plain), "text/plain");
    assert_eq!(
        read_all(plain.into_body()).await,
        (b"hello\nworld\n".to_vec(), None)
    );
    for (query, want) in [
        ("type=stdout&origin=end&offset=6&plain=true", "world\n"),
        ("type=stdout&origin=start&offset=6&plain=true", "world\n"),
        ("type=stdout&origin=end&plain=true", ""),
        (
            "type=stdout&origin=end&offset=1000&plain=true",
            "hello\nworld\n",
        ),
        ("type=stderr&plain=true", "oops\n"),
    ] {
        let resp = agent.get(&format!("{base}&{query}")).await;
        let (body, broken) = read_all(resp.into_body()).await;
        assert_eq!(
            (String::from_utf8_lossy(&body).as_ref(), broken),
            (want, None),
            "{query}"
        );
    }
    let stderr = frames(
        &read_all(agent.get(&format!("{base}&type=stderr")).await.into_body())
            .await
            .0,
    );
    assert_eq!(data_of(&stderr), b"oops\n");
    assert_eq!(stderr[0].file, "alloc/logs/web.stderr.0");

    // Drover's CLI reads the same frames.
    let client = drover_server_api::client::Client::new(
        &format!("unix://{}", agent.socket.display()),
        Default::default(),
    )
    .unwrap();
    let mut logs = client
        .alloc_logs(
            "aaaaaaaa-0000-4000-8000-0000000000a1",
            &AllocLogsQuery {
                task: "web".into(),
                stream: drover_api::LogStream::Stdout,
                follow: false,
                tail: None,
                framed: true,
            },
        )
        .await
        .unwrap();
    let mut read = Vec::new();
    while let Some(frame) = logs.next().await.unwrap() {
        match frame {
            drover_api::Frame::Data(d) => read.extend(d),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(read, b"hello\nworld\n");

    for (target, code, text) in [
        (
            "/v1/client/fs/logs/nope?task=web&type=stdout".to_owned(),
            404,
            "Unknown allocation \"nope\"",
        ),
        (
            format!("{base}x&type=stdout"),
            400,
            "unknown task name \"webx\"",
        ),
        (
            base.to_owned(),
            400,
            "must provide log type (stdout/stderr)",
        ),
        (
            "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a1?type=stdout".to_owned(),
            400,
            "must provide task name",
        ),
        (
            format!("{base}&type=stdout&origin=middle"),
            400,
            "origin must be start or end",
        ),
        (
            "/v1/client/allocation/nope/stats".to_owned(),
            404,
            "Unknown allocation \"nope\"",
        ),
    ] {
        let resp = agent.get(&target).await;
        assert_eq!(resp.status().as_u16(), code, "{target}");
        let (body, _) = read_all(resp.into_body()).await;
        assert_eq!(String::from_utf8_lossy(&body), text, "{target}");
    }
    std::fs::write(&gate, "").unwrap();
}

/// `follow=true`: what is there, heartbeats while the task is quiet, the lines it
/// writes later, and the end of the stream once the task is dead; a client that goes
/// away frees its follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_delivers_later_lines_with_heartbeats_until_the_task_ends() {
    let agent = Agent::start().await;
    let gate = agent.gate("go");
    let script = format!("echo first; {}; echo later; echo last", wait_for(&gate));
    agent
        .run(
            "aaaaaaaa-0000-4000-8000-0000000000a2",
            vec![sh("web", &script)],
        )
        .await;
    agent
        .task_dir("aaaaaaaa-0000-4000-8000-0000000000a2", "web")
        .await;
    let target =
        "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a2?task=web&type=stdout&follow=true";
    agent
        .poll_body("/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a2?task=web&type=stdout&plain=true", |b| {
            b == b"first\n"
        })
        .await;
    let resp = agent.get(target).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut raw = Vec::new();
    let mut gate_opened = false;
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let next = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap_or_else(|_| panic!("stream stalled: {:?}", String::from_utf8_lossy(&raw)));
        match next {
            None => break,
            Some(Ok(f)) => raw.extend_from_slice(&f.into_data().unwrap_or_default()),
            Some(Err(e)) => panic!("{e}"),
        }
        let got = frames(&raw);
        // The task waits for the gate: once its first line and a heartbeat came, let
        // it go on.
        if !gate_opened && data_of(&got) == b"first\n" && got.iter().any(StreamFrame::is_heartbeat)
        {
            std::fs::write(&gate, "").unwrap();
            gate_opened = true;
        }
    }
    assert!(gate_opened, "{:?}", String::from_utf8_lossy(&raw));
    assert_eq!(data_of(&frames(&raw)), b"first\nlater\nlast\n");

    // A follower whose client goes away is freed.
    let resp = agent.get(target).await;
    let mut body = resp.into_body();
    let _ = body.frame().await;
    assert_eq!(agent.streams.logs.active(), 1);
    drop(body);
    let streams = agent.streams.clone();
    until(LIMIT, "the follower freed", || streams.logs.active() == 0).await;
}

/// A task plants a link to a root-only file as its next log file: the stream gives
/// the output before it and then ends with why, never the file's content; plain, the
/// body is cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_planted_in_the_log_directory_is_not_followed() {
    let agent = Agent::start().await;
    let secret = agent.root.path().join("secret");
    std::fs::write(&secret, "root only\n").unwrap();
    let gate = agent.gate("done");
    agent
        .run(
            "aaaaaaaa-0000-4000-8000-0000000000a3",
            vec![sh("web", &format!("echo mine; {}", wait_for(&gate)))],
        )
        .await;
    let dir = agent
        .task_dir("aaaaaaaa-0000-4000-8000-0000000000a3", "web")
        .await;
    agent
        .poll_body("/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a3?task=web&type=stdout&plain=true", |b| {
            b == b"mine\n"
        })
        .await;
    std::os::unix::fs::symlink(&secret, dir.join("logs").join("stdout.1")).unwrap();

    let target = "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a3?task=web&type=stdout";
    let resp = agent.get(target).await;
    let (body, broken) = read_all(resp.into_body()).await;
    assert_eq!(broken, None);
    assert!(!String::from_utf8_lossy(&body).contains("root only"));
    // The frames before the link, an error frame, then the error's text (as Nomad
    // ends a failed stream: its clients fail to decode it, and say so).
    let mut stream = serde_json::Deserializer::from_slice(&body).into_iter::<StreamFrame>();
    let mut got = Vec::new();
    while let Some(Ok(frame)) = stream.next() {
        got.push(frame);
    }
    let text = String::from_utf8_lossy(&body[stream.byte_offset()..]).into_owned();
    assert_eq!(data_of(&got), b"mine\n");
    let error = got.last().unwrap();
    assert_eq!(error.file_event, FILE_EVENT_ERROR);
    let message = error.error.clone().unwrap_or_default();
    assert!(message.contains("stdout.1"), "{error:?}");
    assert_eq!(text, format!("{message}\n"));

    let resp = agent.get(&format!("{target}&plain=true&follow=true")).await;
    let (body, broken) = read_all(resp.into_body()).await;
    assert_eq!(broken, None);
    assert_eq!(String::from_utf8_lossy(&body), format!("mine\n{message}\n"));

    // Drover's CLI says why the stream ended, after the output before the link.
    let client = drover_server_api::client::Client::new(
        &format!("unix://{}", agent.socket.display()),
        Default::default(),
    )
    .unwrap();
    let query = AllocLogsQuery {
        task: "web".into(),
        stream: drover_api::LogStream::Stdout,
        follow: false,
        tail: None,
        framed: true,
    };
    let mut logs = client
        .alloc_logs("aaaaaaaa-0000-4000-8000-0000000000a3", &query)
        .await
        .unwrap();
    assert_eq!(
        logs.next().await.unwrap(),
        Some(drover_api::Frame::Data(b"mine\n".to_vec()))
    );
    let e = logs.next().await.unwrap_err();
    assert_eq!(e.to_string(), message);
    std::fs::write(&gate, "").unwrap();
}

/// `/v1/client/allocation/:id/stats`: each running task's use, and their sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_stats_are_nomads_alloc_resource_usage() {
    let agent = Agent::start().await;
    let gate = agent.gate("done");
    let idle = wait_for(&gate);
    // Busy until the gate opens (at most 30 s).
    let busy = format!(
        "i=0; while [ ! -e '{}' ] && [ $i -lt 3000000 ]; do i=$((i+1)); done",
        gate.display()
    );
    agent
        .run(
            "aaaaaaaa-0000-4000-8000-0000000000a4",
            vec![sh("idle", &idle), sh("busy", &busy)],
        )
        .await;
    agent
        .task_dir("aaaaaaaa-0000-4000-8000-0000000000a4", "idle")
        .await;
    agent
        .task_dir("aaaaaaaa-0000-4000-8000-0000000000a4", "busy")
        .await;
    let resp = agent
        .get("/v1/client/allocation/aaaaaaaa-0000-4000-8000-0000000000a4/stats")
        .await;
    let (status, content_type) = (resp.status(), content_type(&resp));
    let (body, _) = read_all(resp.into_body()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/json");
    std::fs::write(&gate, "").unwrap();
    let raw: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let usage: AllocResourceUsage = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(
        usage.tasks.keys().map(String::as_str).collect::<Vec<_>>(),
        ["busy", "idle"],
        "{raw}"
    );
    let (busy, idle) = (&usage.tasks["busy"], &usage.tasks["idle"]);
    for task in [busy, idle] {
        assert!(task.resource_usage.memory_stats.rss > 0, "{raw}");
        assert!(
            task.timestamp > 0 && task.timestamp <= usage.timestamp,
            "{raw}"
        );
        assert!(
            task.resource_usage
                .memory_stats
                .measured
                .contains(&"RSS".to_owned())
        );
    }
    assert!(busy.resource_usage.cpu_stats.percent > 10.0, "{raw}");
    let total = &usage.resource_usage;
    assert_eq!(
        total.memory_stats.rss,
        busy.resource_usage.memory_stats.rss + idle.resource_usage.memory_stats.rss
    );
    let sum = busy.resource_usage.cpu_stats.percent + idle.resource_usage.cpu_stats.percent;
    assert!((total.cpu_stats.percent - sum).abs() < 1e-6, "{raw}");
    // Nomad's keys, as its clients read them.
    assert!(raw["ResourceUsage"]["MemoryStats"]["RSS"].is_u64(), "{raw}");
    assert!(
        raw["ResourceUsage"]["CpuStats"]["Percent"].is_f64(),
        "{raw}"
    );
    assert!(raw["Tasks"]["busy"]["Timestamp"].is_i64(), "{raw}");
}

/// A server with a local agent (`agent --dev`) passes the client endpoints to it,
/// after its token check: Nomad's clients ask the server's HTTP address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_passes_client_requests_to_its_local_agent_after_the_token_check() {
    let agent = Agent::start().await;
    let gate = agent.gate("done");
    agent
        .run(
            "aaaaaaaa-0000-4000-8000-0000000000a5",
            vec![sh("web", &format!("echo through; {}", wait_for(&gate)))],
        )
        .await;
    agent
        .task_dir("aaaaaaaa-0000-4000-8000-0000000000a5", "web")
        .await;
    agent
        .poll_body("/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a5?task=web&type=stdout&plain=true", |b| {
            b == b"through\n"
        })
        .await;

    let server_dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let store: Arc<dyn drover_server::store::Store> =
        Arc::new(drover_server::store::MemStore::new());
    let server = drover_server::Server::start(
        drover_server::ServerConfig::new(server_dir.path()),
        store,
        stop.clone(),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(drover_server::http::serve(
        drover_server::http::router_with_local_agent(
            server,
            Some("s3cret".into()),
            Some(agent.socket.clone()),
        ),
        listener,
        None,
        stop.clone(),
    ));
    let get = |target: &'static str, token: Option<&'static str>| async move {
        let io = tokio::net::TcpStream::connect(addr).await.unwrap();
        let headers: Vec<(&str, &str)> = token
            .map(|t| vec![(drover_server_api::TOKEN_HEADER, t)])
            .unwrap_or_default();
        request(io, target, &headers).await
    };
    let resp = get(
        "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a5?task=web&type=stdout&plain=true",
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = get(
        "/v1/client/allocation/aaaaaaaa-0000-4000-8000-0000000000a5/stats",
        Some("wrong"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);

    let resp = get(
        "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a5?task=web&type=stdout",
        Some("s3cret"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(content_type(&resp), "application/json");
    let (body, broken) = read_all(resp.into_body()).await;
    assert_eq!(
        (data_of(&frames(&body)), broken),
        (b"through\n".to_vec(), None)
    );
    let resp = get(
        "/v1/client/allocation/aaaaaaaa-0000-4000-8000-0000000000a5/stats",
        Some("s3cret"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (body, _) = read_all(resp.into_body()).await;
    let usage: AllocResourceUsage = serde_json::from_slice(&body).unwrap();
    assert!(
        usage.tasks.contains_key("web"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    // The agent's own errors come through as they are.
    let resp = get(
        "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a5?task=nope&type=stdout",
        Some("s3cret"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        read_all(resp.into_body()).await.0,
        b"unknown task name \"nope\""
    );

    // A follower through the server is freed on the agent when its client goes.
    let resp = get(
        "/v1/client/fs/logs/aaaaaaaa-0000-4000-8000-0000000000a5?task=web&type=stdout&follow=true",
        Some("s3cret"),
    )
    .await;
    let mut body = resp.into_body();
    let _ = body.frame().await;
    assert_eq!(agent.streams.logs.active(), 1);
    drop(body);
    let streams = agent.streams.clone();
    until(LIMIT, "the follower freed", || streams.logs.active() == 0).await;
    stop.cancel();
    std::fs::write(&gate, "").unwrap();
}

/// `fs ls/stat/cat/readat/stream` of a running task's allocation: what the task wrote
/// is listed and read, by Nomad's paths; a link the task planted to `/etc/shadow` is
/// listed as a link and refused when read, as is anything in `secrets/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_files_are_listed_and_read_and_planted_links_refused() {
    let agent = Agent::start().await;
    let gate = agent.gate("more");
    let stop_gate = agent.gate("stop");
    let id = "aaaaaaaa-0000-4000-8000-0000000000a6";
    let script = format!(
        "printf 'line one\\nline two\\n' > \"$NOMAD_TASK_DIR/notes.txt\"; \
         echo shared > \"$NOMAD_ALLOC_DIR/data/shared.txt\"; \
         ln -s /etc/shadow \"$NOMAD_TASK_DIR/shadow\"; \
         ln -s /etc \"$NOMAD_TASK_DIR/etc\"; \
         echo hunter2 > \"$NOMAD_SECRETS_DIR/password\"; \
         echo ready; {}; echo 'line three' >> \"$NOMAD_TASK_DIR/notes.txt\"; {}",
        wait_for(&gate),
        wait_for(&stop_gate)
    );
    agent.run(id, vec![sh("web", &script)]).await;
    agent.task_dir(id, "web").await;
    agent
        .poll_body(
            &format!("/v1/client/fs/logs/{id}?task=web&type=stdout&plain=true"),
            |b| b == b"ready\n",
        )
        .await;
    let json = |body: &[u8]| -> serde_json::Value {
        serde_json::from_slice(body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(body)))
    };
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["Name"].as_str().unwrap().to_owned())
            .collect()
    };
    let get_ok = |target: String| {
        let agent = &agent;
        async move {
            let resp = agent.get(&target).await;
            let status = resp.status();
            let (body, broken) = read_all(resp.into_body()).await;
            assert_eq!(
                (status, broken),
                (StatusCode::OK, None),
                "{target}: {}",
                String::from_utf8_lossy(&body)
            );
            body
        }
    };
    let base = "/v1/client/fs";

    let root = json(&get_ok(format!("{base}/ls/{id}?path=/")).await);
    assert_eq!(names(&root), ["alloc", "web"], "{root}");
    assert_eq!(root[0]["IsDir"], true);
    assert!(
        root[0]["FileMode"].as_str().unwrap().starts_with('d'),
        "{root}"
    );
    let shared = json(&get_ok(format!("{base}/ls/{id}?path=alloc/data")).await);
    assert_eq!(names(&shared), ["shared.txt"]);
    let logs = json(&get_ok(format!("{base}/ls/{id}?path=alloc/logs")).await);
    assert!(names(&logs).contains(&"web.stdout.0".to_owned()), "{logs}");
    assert_eq!(
        get_ok(format!("{base}/cat/{id}?path=alloc/logs/web.stdout.0")).await,
        b"ready\n"
    );
    let local = json(&get_ok(format!("{base}/ls/{id}?path=web/local")).await);
    assert_eq!(names(&local), ["etc", "notes.txt", "shadow"], "{local}");
    let shadow = &local[2];
    assert_eq!(shadow["FileMode"], "Lrwxrwxrwx", "{local}");
    assert_eq!(shadow["IsDir"], false);
    let notes = json(&get_ok(format!("{base}/stat/{id}?path=/web/local/notes.txt")).await);
    assert_eq!(notes["Name"], "notes.txt");
    assert_eq!(notes["Size"], 18);
    assert_eq!(notes["ContentType"], "text/plain; charset=utf-8");
    assert_eq!(
        get_ok(format!("{base}/cat/{id}?path=web/local/notes.txt")).await,
        b"line one\nline two\n"
    );
    assert_eq!(
        get_ok(format!(
            "{base}/readat/{id}?path=web/local/notes.txt&offset=5&limit=7"
        ))
        .await,
        b"one\nlin"
    );

    // Refused: the planted links (read, or walked through), `secrets/`, `..`.
    for (path, status) in [
        ("web/local/shadow", StatusCode::FORBIDDEN),
        ("web/local/etc/shadow", StatusCode::FORBIDDEN),
        ("web/secrets/password", StatusCode::FORBIDDEN),
        ("web/../../../etc/shadow", StatusCode::BAD_REQUEST),
        ("web/local/missing", StatusCode::NOT_FOUND),
    ] {
        for op in ["cat", "stat", "stream", "readat"] {
            if op == "stat" && path == "web/local/shadow" {
                continue; // described as a link: checked above
            }
            let target = format!("{base}/{op}/{id}?path={path}&offset=0&limit=10");
            let resp = agent.get(&target).await;
            let got = resp.status();
            let (body, _) = read_all(resp.into_body()).await;
            let text = String::from_utf8_lossy(&body).into_owned();
            assert_eq!(got, status, "{target}: {text}");
            assert!(
                !text.contains("root:"),
                "{target} leaked the host's file: {text}"
            );
            assert!(
                !text.contains(&*agent.root.path().to_string_lossy()),
                "{target} names host paths: {text}"
            );
        }
    }
    let resp = agent
        .get(&format!("{base}/ls/{id}?path=web/local/etc"))
        .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // An allocation this node does not run (and no servers to ask).
    let resp = agent
        .get(&format!(
            "{base}/ls/aaaaaaaa-0000-4000-8000-00000000ffff?path=/"
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);

    // A stream follows the file as the task appends to it, from an offset.
    let resp = agent
        .get(&format!(
            "{base}/stream/{id}?path=web/local/notes.txt&offset=9"
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(content_type(&resp), "application/json");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    std::fs::write(&gate, "").unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while data_of(&frames(&got)) != b"line two\nline three\n" {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap_or_else(|_| panic!("so far {:?}", String::from_utf8_lossy(&got)))
            .expect("the stream ended")
            .unwrap();
        if let Ok(d) = frame.into_data() {
            got.extend_from_slice(&d);
        }
    }
    let last = frames(&got)
        .into_iter()
        .rev()
        .find(|f| !f.data.is_empty())
        .unwrap();
    assert_eq!(
        (last.file.as_str(), last.offset),
        ("web/local/notes.txt", 29)
    );
    assert_eq!(agent.streams.logs.active(), 1, "a follower is counted");
    drop(body);
    let streams = agent.streams.clone();
    until(LIMIT, "the follower freed", || streams.logs.active() == 0).await;
    // Without follow, the stream ends at the end of the file.
    let plain = get_ok(format!(
        "{base}/stream/{id}?path=web/local/notes.txt&origin=end&offset=11&follow=false&plain=true"
    ))
    .await;
    assert_eq!(plain, b"line three\n");
    std::fs::write(&stop_gate, "").unwrap();
}
