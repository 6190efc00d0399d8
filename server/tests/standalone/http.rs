//! The HTTP API over a real listener on 127.0.0.1, through the typed client: tokens,
//! TLS, and the server core's answers through it (jobs stored, evaluations made,
//! blocking queries woken by commits).

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_server::store::Store;
use drover_server::store::redb::RedbStore;
use drover_server::{Server, ServerConfig};
use drover_server_api::client::{Client, ClientOptions, QueryOptions};
use drover_server_api::{JobSpec, MAX_BLOCKING_WAIT};
use drover_test_support::pki::TestCa;
use hyper::{Method, StatusCode};
use tokio_util::sync::CancellationToken;

struct Running {
    _dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<Result<(), drover_server::ServerError>>,
}

impl Running {
    fn client(&self, token: Option<&str>) -> Client {
        Client::new(
            &format!("http://{}", self.addr),
            ClientOptions {
                token: token.map(str::to_owned),
                ..Default::default()
            },
        )
        .unwrap()
    }
}

async fn start(token: Option<&str>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path()).unwrap());
    let server = Server::start(ServerConfig::new(dir.path()), store, stop.clone())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = drover_server::http::router(server, token.map(str::to_owned));
    let served = tokio::spawn(drover_server::http::serve(
        router,
        listener,
        None,
        stop.clone(),
    ));
    Running {
        _dir: dir,
        addr,
        stop,
        served,
    }
}

fn error_of(raw: &drover_server_api::client::RawAnswer) -> String {
    raw.error_message()
        .unwrap_or_else(|| panic!("no JSON error in {:?}", String::from_utf8_lossy(&raw.body)))
}

#[tokio::test]
async fn every_read_route_answers_json_with_the_index() {
    let s = start(None).await;
    let c = s.client(None);
    for path in [
        "/v1/jobs",
        "/v1/nodes",
        "/v1/allocations",
        "/v1/evaluations",
    ] {
        let raw = c.raw(Method::GET, path, None).await.unwrap();
        assert_eq!(raw.status, StatusCode::OK, "{path}");
        assert!(raw.index.is_some(), "{path}: no X-Drover-Index");
        let v: serde_json::Value = serde_json::from_slice(&raw.body).unwrap();
        assert!(v.is_array(), "{path}: {v}");
    }
    for (path, what) in [
        ("/v1/job/nope", "job \"nope\" not found"),
        ("/v1/job/nope/allocations", "job \"nope\" not found"),
        ("/v1/job/nope/evaluations", "job \"nope\" not found"),
        ("/v1/node/nope", "node \"nope\" not found"),
        ("/v1/node/nope/allocations", "node \"nope\" not found"),
        ("/v1/allocation/nope", "allocation \"nope\" not found"),
        ("/v1/evaluation/nope", "evaluation \"nope\" not found"),
        ("/v1/nosuch", "no such API endpoint"),
    ] {
        let raw = c.raw(Method::GET, path, None).await.unwrap();
        assert_eq!(raw.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(error_of(&raw), what, "{path}");
        assert!(raw.index.is_some(), "{path}: no X-Drover-Index");
    }
    // Nomad's client endpoints answer as Nomad's: a line of text.
    for path in [
        "/v1/client/fs/logs/nope?task=main&type=stdout",
        "/v1/client/allocation/nope/stats",
    ] {
        let raw = c.raw(Method::GET, path, None).await.unwrap();
        assert_eq!(raw.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            String::from_utf8_lossy(&raw.body),
            "Unknown allocation \"nope\""
        );
    }
    // The typed client says what the server said.
    let err = c.job("nope", &QueryOptions::default()).await.unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(err.to_string(), "job \"nope\" not found");
    let raw = c.raw(Method::PATCH, "/v1/jobs", None).await.unwrap();
    assert_eq!(raw.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_of(&raw), "PATCH is not allowed on /v1/jobs");
}

#[tokio::test]
async fn bad_requests_are_refused_naming_what_is_wrong() {
    let s = start(None).await;
    let c = s.client(None);
    let cases: [(Method, &str, &[u8], &str); 6] = [
        (
            Method::PUT,
            "/v1/jobs",
            b"{not json",
            "invalid request body: key must be a string",
        ),
        (Method::PUT, "/v1/jobs", b"", "the request body is empty"),
        (
            Method::PUT,
            "/v1/jobs",
            br#"{"job": {"name": "a", "group": [], "colour": 1}}"#,
            "invalid request body: unknown field `colour`",
        ),
        (
            Method::PUT,
            "/v1/job/b/plan",
            br#"{"job": {"name": "a", "group": []}}"#,
            "the job in the body is named \"a\", the path names \"b\"",
        ),
        (
            Method::POST,
            "/v1/node/n1/drain",
            br#"{"enable": "yes"}"#,
            "invalid request body: invalid type: string \"yes\", expected a boolean",
        ),
        (
            Method::GET,
            "/v1/jobs?index=3&wait=soon",
            b"",
            "invalid query: wait=\"soon\" is not a duration",
        ),
    ];
    for (method, path, body, want) in cases {
        let raw = c
            .raw(
                method.clone(),
                path,
                (!body.is_empty()).then(|| body.to_vec()),
            )
            .await
            .unwrap();
        assert_eq!(raw.status, StatusCode::BAD_REQUEST, "{method} {path}");
        let msg = error_of(&raw);
        assert!(msg.starts_with(want), "{method} {path}: {msg}");
    }
    let raw = c.raw(Method::GET, "/v1/jobs?index=x", None).await.unwrap();
    assert_eq!(raw.status, StatusCode::BAD_REQUEST);
    assert!(error_of(&raw).starts_with("invalid query"));
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_and_the_server_keeps_serving() {
    let s = start(None).await;
    let c = s.client(None);
    let mut big = br#"{"job": {"name": "big", "meta": {"x": ""#.to_vec();
    big.extend(std::iter::repeat_n(
        b'a',
        drover_server::http::MAX_BODY_BYTES + 1,
    ));
    big.extend(br#""}, "group": []}}"#);
    let raw = c.raw(Method::PUT, "/v1/jobs", Some(big)).await.unwrap();
    assert_eq!(raw.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_of(&raw), "request body larger than 4 MiB");
    let raw = c.raw(Method::GET, "/v1/jobs", None).await.unwrap();
    assert_eq!(raw.status, StatusCode::OK);
}

#[tokio::test]
async fn a_token_is_required_everywhere_and_refusals_change_nothing() {
    let s = start(Some("s3cret")).await;
    let good = s.client(Some("s3cret"));
    for (client, want) in [
        (s.client(None), "this server requires a token"),
        (s.client(Some("wrong")), "invalid token"),
        (s.client(Some("s3cret2")), "invalid token"),
    ] {
        for (method, path, body) in [
            (Method::GET, "/v1/jobs", None),
            (Method::GET, "/v1/nosuch", None),
            (
                Method::PUT,
                "/v1/jobs",
                Some(br#"{"job": {"name": "a", "group": []}}"#.to_vec()),
            ),
            (Method::DELETE, "/v1/job/a?purge=true", None),
            (
                Method::POST,
                "/v1/node/n/drain",
                Some(br#"{"enable": true}"#.to_vec()),
            ),
        ] {
            let raw = client.raw(method.clone(), path, body).await.unwrap();
            assert_eq!(raw.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert!(error_of(&raw).starts_with(want), "{method} {path}");
        }
        let err = client.jobs(&QueryOptions::default()).await.unwrap_err();
        assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED));
    }
    // The server still serves the right token, and nothing was registered.
    let jobs = good.jobs(&QueryOptions::default()).await.unwrap();
    assert!(jobs.value.is_empty());
    assert!(
        good.job("a", &QueryOptions::default())
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn shutdown_ends_serving_promptly_even_with_a_blocking_query_open() {
    let s = start(None).await;
    let c = s.client(None);
    // A query that could block for the longest wait allowed.
    let blocked = tokio::spawn(async move {
        c.jobs(&QueryOptions::blocking(u64::MAX / 2, MAX_BLOCKING_WAIT))
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = Instant::now();
    s.stop.cancel();
    drover_test_support::within(Duration::from_secs(10), "serve to return", s.served)
        .await
        .unwrap()
        .unwrap();
    let answered = drover_test_support::within(Duration::from_secs(10), "the query", blocked)
        .await
        .unwrap();
    assert!(answered.is_ok(), "{answered:?}");
    assert!(began.elapsed() < Duration::from_secs(6));
    // Nothing listens any more.
    assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
}

/// A CA (`ca.pem`) and a certificate for 127.0.0.1 signed by it (`server.pem`, its key
/// in `server.key`, readable by its owner only as a real key file would be) in `dir`.
fn certificates(dir: &std::path::Path) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let ca = TestCa::new();
    let (cert, key) = ca.leaf("127.0.0.1");
    std::fs::write(dir.join("ca.pem"), &ca.ca_pem).unwrap();
    std::fs::write(dir.join("server.pem"), cert).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("server.key"))
        .and_then(|mut f| f.write_all(key.as_bytes()))
        .unwrap();
}

#[tokio::test]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path()).unwrap());
    let server = Server::start(ServerConfig::new(dir.path()), store, stop.clone())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = drover_server::tls::TlsFiles {
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server.key"),
        client_ca: None,
    };
    let served = tokio::spawn(drover_server::http::serve(
        drover_server::http::router(server, None),
        listener,
        Some(tls),
        stop.clone(),
    ));
    let https = Client::new(
        &format!("https://{addr}"),
        ClientOptions {
            ca_file: Some(dir.path().join("ca.pem")),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        https
            .jobs(&QueryOptions::default())
            .await
            .unwrap()
            .value
            .is_empty()
    );
    // A client that does not trust the CA is refused in the handshake.
    let untrusting = Client::new(
        &format!("https://{addr}"),
        ClientOptions {
            ca_file: Some(dir.path().join("server.pem")),
            ..Default::default()
        },
    )
    .unwrap();
    let err = untrusting.jobs(&QueryOptions::default()).await.unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    // Plain HTTP gets no answer, and the server keeps serving TLS.
    let plain = Client::new(&format!("http://{addr}"), ClientOptions::default()).unwrap();
    assert!(plain.jobs(&QueryOptions::default()).await.is_err());
    assert!(https.jobs(&QueryOptions::default()).await.is_ok());
    stop.cancel();
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn bad_tls_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.pem"), "").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path()).unwrap());
    let server = Server::start(ServerConfig::new(dir.path()), store, stop.clone())
        .await
        .unwrap();
    let missing = dir.path().join("missing.pem");
    let err = drover_server::http::serve(
        drover_server::http::router(server.clone(), None),
        listener,
        Some(drover_server::tls::TlsFiles {
            cert: missing.clone(),
            key: missing.clone(),
            client_ca: None,
        }),
        stop.clone(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "cannot read the TLS certificate file {}",
            missing.display()
        )),
        "{err}"
    );
    let err = drover_server::http::tls_server_config(&drover_server::tls::TlsFiles {
        cert: dir.path().join("empty.pem"),
        key: missing,
        client_ca: None,
    })
    .unwrap_err();
    assert!(err.to_string().contains("holds no certificate"), "{err}");
}

// --- the server core's answers --------------------------------------------------------

fn web_job() -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": "web",
        "type": "service",
        "group": [{
            "name": "app",
            "count": 2,
            "task": [{
                "name": "main",
                "driver": "rawexec",
                "config": {"command": "/bin/sleep", "args": ["1000"]},
                "resources": {"cpu": 100, "memory_mb": 64}
            }]
        }]
    }))
    .unwrap()
}

#[tokio::test]
async fn a_job_round_trips_through_register_read_stop_and_purge() {
    let s = start(None).await;
    let c = s.client(None);
    let registered = c.register_job(&web_job()).await.unwrap();
    assert!(!registered.eval_id.is_empty());
    assert!(registered.index > 0);
    let job = c.job("web", &QueryOptions::default()).await.unwrap();
    assert_eq!(job.value.spec, web_job());
    assert_eq!(job.value.version, 0);
    assert!(job.index >= registered.index);
    let jobs = c.jobs(&QueryOptions::default()).await.unwrap();
    assert_eq!(jobs.value.len(), 1);
    assert_eq!(jobs.value[0].name, "web");
    let evals = c
        .job_evaluations("web", &QueryOptions::default())
        .await
        .unwrap();
    assert!(evals.value.iter().any(|e| e.id == registered.eval_id));
    let eval = c
        .evaluation(&registered.eval_id, &QueryOptions::default())
        .await
        .unwrap();
    assert_eq!(eval.value.job_name, "web");
    // Re-registering the same spec makes no new version.
    c.register_job(&web_job()).await.unwrap();
    assert_eq!(
        c.job("web", &QueryOptions::default())
            .await
            .unwrap()
            .value
            .version,
        0
    );
    let plan = c.plan_job(&web_job()).await.unwrap();
    assert!(!plan.changed);
    let stopped = c.stop_job("web", false).await.unwrap();
    assert!(stopped.index > registered.index);
    assert!(
        c.job("web", &QueryOptions::default())
            .await
            .unwrap()
            .value
            .stop
    );
    c.stop_job("web", true).await.unwrap();
    assert!(
        c.job("web", &QueryOptions::default())
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn blocking_queries_wait_until_a_commit_or_the_wait_ends() {
    let s = start(None).await;
    let c = s.client(None);
    // Index 0 is "answer at once" (as Nomad's): commit something first.
    let mut other = web_job();
    other.name = "other".into();
    c.register_job(&other).await.unwrap();
    // The index is the store's: it moves with every commit (the registration's
    // evaluation is processed meanwhile). A query returns before its wait only with a
    // newer index; once nothing is committed any more, it waits the whole wait.
    let mut first = c.jobs(&QueryOptions::default()).await.unwrap();
    assert!(first.index > 0);
    let mut waited_whole = false;
    for _ in 0..50 {
        let began = Instant::now();
        let next = c
            .jobs(&QueryOptions::blocking(
                first.index,
                Duration::from_millis(400),
            ))
            .await
            .unwrap();
        let took = began.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}");
        // Decided on the index, not the time: a query woken by a commit late in its
        // wait can answer after 400 ms on a loaded machine.
        if next.index > first.index {
            first = next;
            continue;
        }
        assert_eq!(next.index, first.index);
        assert!(
            took >= Duration::from_millis(400),
            "early after {took:?} at the same index"
        );
        waited_whole = true;
        break;
    }
    assert!(waited_whole, "the index never settled");
    // A commit during the wait ends it early, with the new state and a newer index.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.jobs(&QueryOptions::blocking(
                first.index,
                Duration::from_secs(60),
            ))
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let began = Instant::now();
    c.register_job(&web_job()).await.unwrap();
    let woke = drover_test_support::within(Duration::from_secs(10), "the blocking query", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(began.elapsed() < Duration::from_secs(5));
    assert!(woke.index > first.index);
    assert_eq!(woke.value.len(), 2);
}
