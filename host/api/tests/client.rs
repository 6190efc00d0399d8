//! `drover_api::Client` against an in-process axum server with the agent's routes,
//! which records what reached it: every method reaches its endpoint with its method,
//! query and body; any task id arrives as the one path segment it was; streams and
//! errors come back typed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, RawQuery, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use drover_api::{
    Client, Error, Frame, LOG_FRAMES_CONTENT_TYPE, LogStream, LogsOptions, PluginState, RunRequest,
    StopRequest, TaskEventKind, TaskLifecycle,
};

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: Method,
    route: String,
    id: Option<String>,
    query: Option<String>,
    body: String,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Ids the fake knows; every other id gets the agent's 404.
const KNOWN: [&str; 5] = ["t1", "err", "cut", "plain", "wrong-status"];

fn view(id: &str, state: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id, "name": "web", "driver": "rawexec", "state": state,
        "exit_code": if state == "dead" { serde_json::json!(3) } else { serde_json::Value::Null },
        "signal": null, "oom_killed": false, "error": null, "task_dir": format!("/alloc/{id}"),
        "attributes": {"pid": "42"}, "created_at": "2026-01-02T03:04:05.000006Z",
        "started_at": null, "finished_at": null,
        "events": [{"time": "2026-01-02T03:04:05.000006Z", "type": "Received", "message": "received"}],
        "events_dropped": 0, "restarts": 0, "restart_at": null,
    })
}

fn sample(id: &str, cpu: f64) -> serde_json::Value {
    serde_json::json!({
        "task_id": id, "time": "2026-01-02T03:04:05.000006Z", "cpu_percent": cpu,
        "cpu_user_seconds": 0.5, "cpu_system_seconds": 0.25, "memory_rss_bytes": 4096,
        "memory_cache_bytes": 0, "process_count": 1,
    })
}

fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (status, axum::Json(value)).into_response()
}

async fn handle(
    State(log): State<Log>,
    method: Method,
    matched: MatchedPath,
    params: Option<Path<HashMap<String, String>>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let route = matched.as_str().to_owned();
    let id = params.and_then(|Path(p)| p.get("id").cloned());
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        route: route.clone(),
        id: id.clone(),
        query: query.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    if let Some(id) = &id
        && !KNOWN.contains(&id.as_str())
    {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": format!("no task with id {id:?}")}),
        );
    }
    let id = id.unwrap_or_default();
    let follow = query.as_deref().is_some_and(|q| q.contains("follow=true"));
    match (method, route.as_str()) {
        (Method::GET, "/v1/agent/health") => json(
            StatusCode::OK,
            serde_json::json!({"status": "ok", "recovery": {"tasks": 2, "recovered": 2,
                "started": 0, "dead": 0, "waiting": 0, "elapsed_ms": 7}}),
        ),
        (Method::GET, "/v1/plugins") => json(
            StatusCode::OK,
            serde_json::json!([{"name": "rawexec", "type": "driver", "version": "0.1.0",
                "api_version": "1.0.0", "source": "builtin", "path": "/bin/drover",
                "state": "healthy", "reason": "ready", "pid": 7, "reattached": false}]),
        ),
        (Method::POST, "/v1/plugins/reload") => json(
            StatusCode::OK,
            serde_json::json!({"changes": [{"name": "rawexec", "path": "/p/rawexec",
                "kind": "upgraded", "message": "version 0.1.0 replaced by version 0.2.0"}],
                "plugins": []}),
        ),
        (Method::GET, "/v1/tasks") => {
            json(StatusCode::OK, serde_json::json!([view("t1", "running")]))
        }
        (Method::POST, "/v1/tasks") => match serde_json::from_slice::<RunRequest>(&body) {
            Ok(_) => json(StatusCode::CREATED, view("t1", "running")),
            Err(e) => json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": format!("invalid request body: {e}")}),
            ),
        },
        (Method::GET, "/v1/tasks/{id}") if id == "wrong-status" => {
            json(StatusCode::ACCEPTED, view(&id, "running"))
        }
        (Method::GET, "/v1/tasks/{id}") if id == "err" => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "something broke, not in JSON",
        )
            .into_response(),
        (Method::GET, "/v1/tasks/{id}") if id == "cut" => {
            (StatusCode::OK, "{\"id\": \"cut\"").into_response()
        }
        (Method::GET, "/v1/tasks/{id}") => json(StatusCode::OK, view(&id, "running")),
        (Method::DELETE, "/v1/tasks/{id}") => json(
            StatusCode::OK,
            serde_json::json!({"id": id, "destroyed": true}),
        ),
        (Method::GET, "/v1/tasks/{id}/wait") => json(StatusCode::OK, view(&id, "dead")),
        (Method::POST, "/v1/tasks/{id}/stop") => json(StatusCode::OK, view(&id, "dead")),
        (Method::POST, "/v1/tasks/{id}/signal") => json(StatusCode::OK, view(&id, "running")),
        (Method::GET, "/v1/tasks/{id}/events") => json(
            StatusCode::OK,
            serde_json::json!([{"time": "t", "type": "Started", "message": "started"}]),
        ),
        (Method::GET, "/v1/tasks/{id}/stats") if !follow => json(StatusCode::OK, sample(&id, 12.5)),
        (Method::GET, "/v1/tasks/{id}/stats") => {
            let mut text = format!("{}\n{}\n", sample(&id, 1.0), sample(&id, 2.0));
            if id == "err" {
                text.push_str("{\"error\":\"the driver went away\"}\n");
            } else {
                // The last line may come without its newline.
                text.push_str(&sample(&id, 3.0).to_string());
            }
            ([(header::CONTENT_TYPE, "application/x-ndjson")], text).into_response()
        }
        (Method::GET, "/v1/tasks/{id}/logs") => {
            let mut bytes = Frame::Data(b"hello\n".to_vec()).encode();
            bytes.extend(Frame::Skipped(2).encode());
            match id.as_str() {
                "err" => bytes.extend(Frame::Error("disk gone".into()).encode()),
                "cut" => bytes.extend(&Frame::Data(b"lost".to_vec()).encode()[..6]),
                _ => bytes.extend(Frame::Data(b"bye\n".to_vec()).encode()),
            }
            let content_type = if id == "plain" {
                "text/plain; charset=utf-8"
            } else {
                LOG_FRAMES_CONTENT_TYPE
            };
            ([(header::CONTENT_TYPE, content_type)], bytes).into_response()
        }
        _ => json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "no such API endpoint"}),
        ),
    }
}

/// A fake agent on a socket in a temp dir.
struct Fake {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    log: Log,
}

impl Fake {
    async fn start() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        let log = Log::default();
        let app = Router::new()
            .route("/v1/agent/health", any(handle))
            .route("/v1/plugins", any(handle))
            .route("/v1/plugins/reload", any(handle))
            .route("/v1/tasks", any(handle))
            .route("/v1/tasks/{id}", any(handle))
            .route("/v1/tasks/{id}/wait", any(handle))
            .route("/v1/tasks/{id}/stop", any(handle))
            .route("/v1/tasks/{id}/signal", any(handle))
            .route("/v1/tasks/{id}/events", any(handle))
            .route("/v1/tasks/{id}/logs", any(handle))
            .route("/v1/tasks/{id}/stats", any(handle))
            .fallback(|| async {
                json(
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"error": "no such API endpoint"}),
                )
            })
            .with_state(log.clone());
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Fake {
            _dir: dir,
            socket,
            log,
        }
    }

    fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// The last request the server saw.
    fn last(&self) -> Seen {
        self.log
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("no request")
    }

    fn count(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

fn seen(method: Method, route: &str, id: Option<&str>, query: Option<&str>, body: &str) -> Seen {
    Seen {
        method,
        route: route.into(),
        id: id.map(str::to_owned),
        query: query.map(str::to_owned),
        body: body.into(),
    }
}

#[tokio::test]
async fn every_method_reaches_its_endpoint_with_its_method_query_and_body() {
    let fake = Fake::start().await;
    let c = fake.client();

    let health = c.health().await.unwrap();
    assert_eq!(health.recovery.unwrap().elapsed, Duration::from_millis(7));
    assert_eq!(
        fake.last(),
        seen(Method::GET, "/v1/agent/health", None, None, "")
    );

    let plugins = c.plugins().await.unwrap();
    assert_eq!(plugins[0].state, PluginState::Healthy);
    assert_eq!(plugins[0].pid, Some(7));
    assert_eq!(
        fake.last(),
        seen(Method::GET, "/v1/plugins", None, None, "")
    );

    let reload = c.reload_plugins().await.unwrap();
    assert_eq!(
        reload.changes[0].kind,
        drover_api::PluginChangeKind::Upgraded
    );
    assert_eq!(
        fake.last(),
        seen(Method::POST, "/v1/plugins/reload", None, None, "")
    );

    let tasks = c.list_tasks().await.unwrap();
    assert_eq!(tasks[0].id, "t1");
    assert_eq!(fake.last(), seen(Method::GET, "/v1/tasks", None, None, ""));

    let req = RunRequest {
        driver: "rawexec".into(),
        config: serde_json::json!({"command": "/bin/true"}),
        kill_timeout: Some(Duration::from_secs(3)),
        ..Default::default()
    };
    let task = c.run_task(&req).await.unwrap();
    assert_eq!(task.state, TaskLifecycle::Running);
    assert_eq!(task.attributes["pid"], "42");
    let posted = fake.last();
    assert_eq!(
        (posted.method, posted.route.as_str()),
        (Method::POST, "/v1/tasks")
    );
    let body: serde_json::Value = serde_json::from_str(&posted.body).unwrap();
    assert_eq!(body["kill_timeout"], "3s");
    assert_eq!(body["config"]["command"], "/bin/true");

    assert_eq!(c.get_task("t1").await.unwrap().id, "t1");
    assert_eq!(
        fake.last(),
        seen(Method::GET, "/v1/tasks/{id}", Some("t1"), None, "")
    );

    let dead = c.wait_task("t1").await.unwrap();
    assert_eq!((dead.state, dead.exit_code), (TaskLifecycle::Dead, Some(3)));
    assert_eq!(
        fake.last(),
        seen(Method::GET, "/v1/tasks/{id}/wait", Some("t1"), None, "")
    );

    c.stop_task("t1", &StopRequest::default()).await.unwrap();
    assert_eq!(
        fake.last(),
        seen(Method::POST, "/v1/tasks/{id}/stop", Some("t1"), None, "{}")
    );
    let stop = StopRequest {
        signal: Some("SIGINT".into()),
        timeout: Some(Duration::from_millis(1500)),
    };
    c.stop_task("t1", &stop).await.unwrap();
    assert_eq!(
        fake.last(),
        seen(
            Method::POST,
            "/v1/tasks/{id}/stop",
            Some("t1"),
            None,
            r#"{"signal":"SIGINT","timeout":"1s 500ms"}"#
        )
    );

    c.signal_task("t1", "SIGHUP").await.unwrap();
    assert_eq!(
        fake.last(),
        seen(
            Method::POST,
            "/v1/tasks/{id}/signal",
            Some("t1"),
            None,
            r#"{"signal":"SIGHUP"}"#
        )
    );

    let destroyed = c.destroy_task("t1", true).await.unwrap();
    assert!(destroyed.destroyed && destroyed.id == "t1");
    assert_eq!(
        fake.last(),
        seen(
            Method::DELETE,
            "/v1/tasks/{id}",
            Some("t1"),
            Some("force=true"),
            ""
        )
    );
    c.destroy_task("t1", false).await.unwrap();
    assert_eq!(fake.last().query.as_deref(), Some("force=false"));

    let events = c.task_events("t1").await.unwrap();
    assert_eq!(events[0].kind, TaskEventKind::Started);
    assert_eq!(
        fake.last(),
        seen(Method::GET, "/v1/tasks/{id}/events", Some("t1"), None, "")
    );

    let stats = c.task_stats("t1").await.unwrap();
    assert_eq!((stats.cpu_percent, stats.memory_rss_bytes), (12.5, 4096));
    assert_eq!(
        fake.last(),
        seen(Method::GET, "/v1/tasks/{id}/stats", Some("t1"), None, "")
    );

    let mut samples = c
        .follow_task_stats("t1", Some(Duration::from_millis(250)))
        .await
        .unwrap();
    assert_eq!(
        fake.last().query.as_deref(),
        Some("follow=true&interval=250ms")
    );
    let mut cpu = Vec::new();
    while let Some(s) = samples.next().await.unwrap() {
        cpu.push(s.cpu_percent);
    }
    assert_eq!(cpu, [1.0, 2.0, 3.0]);
    c.follow_task_stats("t1", None).await.unwrap();
    assert_eq!(fake.last().query.as_deref(), Some("follow=true"));

    let options = LogsOptions {
        stream: LogStream::Stderr,
        follow: true,
        tail: Some(3),
        ..Default::default()
    };
    let mut frames = c.task_logs("t1", &options).await.unwrap();
    assert_eq!(
        fake.last().query.as_deref(),
        Some("stream=stderr&follow=true&tail=3&framed=true")
    );
    let mut got = Vec::new();
    while let Some(f) = frames.next().await.unwrap() {
        got.push(f);
    }
    assert_eq!(
        got,
        [
            Frame::Data(b"hello\n".to_vec()),
            Frame::Skipped(2),
            Frame::Data(b"bye\n".to_vec())
        ]
    );
    c.task_logs("t1", &LogsOptions::default()).await.unwrap();
    assert_eq!(
        fake.last().query.as_deref(),
        Some("stream=stdout&follow=false&framed=true")
    );
}

#[tokio::test]
async fn any_id_arrives_as_the_one_segment_it_was() {
    let fake = Fake::start().await;
    let c = fake.client();
    let ids = [
        "a b",
        "../../x",
        "..",
        ".",
        "a/b",
        "/",
        "100%",
        "%2F",
        "ünï/cödé ☃",
        "q?x=1&y#z",
        "tab\tnl\n",
    ];
    for id in ids {
        let not_found = format!("no task with id {id:?}");
        let check = |r: Result<(), Error>, route: &str, method: Method| {
            let e = r.expect_err(id);
            assert_eq!(e.status(), Some(StatusCode::NOT_FOUND), "{id:?}: {e}");
            assert!(e.is_not_found());
            assert_eq!(e.to_string(), not_found);
            let last = fake.last();
            assert_eq!(
                (last.method, last.route.as_str(), last.id.as_deref()),
                (method, route, Some(id)),
                "{id:?}"
            );
        };
        check(
            c.get_task(id).await.map(drop),
            "/v1/tasks/{id}",
            Method::GET,
        );
        check(
            c.wait_task(id).await.map(drop),
            "/v1/tasks/{id}/wait",
            Method::GET,
        );
        check(
            c.stop_task(id, &StopRequest::default()).await.map(drop),
            "/v1/tasks/{id}/stop",
            Method::POST,
        );
        check(
            c.signal_task(id, "SIGHUP").await.map(drop),
            "/v1/tasks/{id}/signal",
            Method::POST,
        );
        check(
            c.destroy_task(id, true).await.map(drop),
            "/v1/tasks/{id}",
            Method::DELETE,
        );
        check(
            c.task_events(id).await.map(drop),
            "/v1/tasks/{id}/events",
            Method::GET,
        );
        check(
            c.task_stats(id).await.map(drop),
            "/v1/tasks/{id}/stats",
            Method::GET,
        );
        check(
            c.follow_task_stats(id, None).await.map(drop),
            "/v1/tasks/{id}/stats",
            Method::GET,
        );
        check(
            c.task_logs(id, &LogsOptions::default()).await.map(drop),
            "/v1/tasks/{id}/logs",
            Method::GET,
        );
    }
}

#[tokio::test]
async fn failures_are_typed() {
    let fake = Fake::start().await;
    let c = fake.client();

    // Nobody listens: the error names the socket.
    let gone = fake.socket.with_file_name("nobody.sock");
    let e = Client::new(&gone).list_tasks().await.unwrap_err();
    assert!(
        matches!(&e, Error::Connect { socket, .. } if *socket == gone),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("cannot reach the agent at {}: ", gone.display()))
            && text.contains("No such file or directory"),
        "{text}"
    );

    // The agent's refusal, its message verbatim; a body that is not JSON as text.
    let e = c.get_task("err").await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    assert_eq!(e.to_string(), "something broke, not in JSON");
    let e = c.get_task("nope").await.unwrap_err();
    assert!(matches!(&e, Error::Status { message, .. } if message == "no task with id \"nope\""));

    // Answers that are not what the API promises.
    let e = c.get_task("wrong-status").await.unwrap_err();
    assert!(matches!(e, Error::Protocol { .. }), "{e:?}");
    assert!(
        e.to_string().contains("202 Accepted, expected 200 OK"),
        "{e}"
    );
    let e = c.get_task("cut").await.unwrap_err();
    assert!(matches!(e, Error::Decode { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "cannot decode the agent's answer to GET /v1/tasks/cut"
    );
    let cause = std::error::Error::source(&e).unwrap().to_string();
    assert!(cause.starts_with("EOF while parsing"), "{cause}");
    let e = c
        .task_logs("plain", &LogsOptions::default())
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("content type \"text/plain; charset=utf-8\""),
        "{e}"
    );

    // Streams: an error the agent reports in them, and one cut in mid-frame.
    let mut frames = c.task_logs("err", &LogsOptions::default()).await.unwrap();
    assert_eq!(
        frames.next().await.unwrap(),
        Some(Frame::Data(b"hello\n".to_vec()))
    );
    assert_eq!(frames.next().await.unwrap(), Some(Frame::Skipped(2)));
    let e = frames.next().await.unwrap_err();
    assert!(matches!(&e, Error::Stream(m) if m == "disk gone"), "{e:?}");
    assert_eq!(frames.next().await.unwrap(), None);
    let mut frames = c.task_logs("cut", &LogsOptions::default()).await.unwrap();
    frames.next().await.unwrap();
    frames.next().await.unwrap();
    let e = frames.next().await.unwrap_err();
    assert!(
        e.to_string().contains("ended in the middle of a frame"),
        "{e}"
    );
    let mut samples = c.follow_task_stats("err", None).await.unwrap();
    assert!(samples.next().await.unwrap().is_some());
    assert!(samples.next().await.unwrap().is_some());
    let e = samples.next().await.unwrap_err();
    assert_eq!(e.to_string(), "the driver went away");
    assert_eq!(samples.next().await.unwrap(), None);

    // Nothing is sent for an empty id.
    let before = fake.count();
    let e = c.get_task("").await.unwrap_err();
    assert!(matches!(e, Error::InvalidRequest(_)), "{e:?}");
    assert_eq!(e.to_string(), "invalid request: the task id is empty");
    assert_eq!(fake.count(), before);
}

#[tokio::test]
async fn get_raw_sends_what_the_typed_methods_cannot() {
    let fake = Fake::start().await;
    let c = fake.client();
    let raw = c
        .get_raw(
            &["v1", "tasks", "a b/c", "logs"],
            &[("stream", "std in"), ("tail", "x&y")],
        )
        .await
        .unwrap();
    assert_eq!(raw.status, StatusCode::NOT_FOUND);
    assert_eq!(
        raw.error_message().as_deref(),
        Some("no task with id \"a b/c\"")
    );
    let last = fake.last();
    assert_eq!(last.route, "/v1/tasks/{id}/logs");
    assert_eq!(last.id.as_deref(), Some("a b/c"));
    assert_eq!(last.query.as_deref(), Some("stream=std+in&tail=x%26y"));

    let raw = c.get_raw(&["v1", "nothing", "here"], &[]).await.unwrap();
    assert_eq!(raw.status, StatusCode::NOT_FOUND);
    assert_eq!(raw.error_message().as_deref(), Some("no such API endpoint"));
    assert_eq!(fake.count(), 1, "the fallback records nothing");

    let raw = c.get_raw(&["v1", "tasks", "t1"], &[]).await.unwrap();
    assert_eq!(raw.status, StatusCode::OK);
    assert_eq!(raw.content_type.as_deref(), Some("application/json"));
    let view: drover_api::TaskView = raw.json().unwrap();
    assert_eq!(view.id, "t1");
}
