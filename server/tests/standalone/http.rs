//! The HTTP API over a real listener on 127.0.0.1, as Nomad's clients use it: Nomad's
//! paths, PascalCase JSON, `X-Nomad-Index`/`X-Nomad-Token`, plain-text errors with
//! Nomad's codes and texts, blocking queries and the event stream; tokens, TLS, and
//! the server core's answers through it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_server::store::Store;
use drover_server::store::redb::RedbStore;
use drover_server::{Server, ServerConfig};
use drover_server_api::client::{Client, ClientOptions, QueryOptions};
use drover_server_api::{AllocClientUpdate, ClientStatus, MAX_BLOCKING_WAIT};
use drover_test_support::pki::TestCa;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::{SECRET, node};

struct Running {
    _dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    server: Arc<Server>,
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

    fn http(&self, token: Option<&str>) -> Http {
        Http {
            addr: self.addr,
            token: token.map(str::to_owned),
        }
    }
}

async fn start_with(token: Option<&str>, workers: usize) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path()).unwrap());
    let mut config = ServerConfig::new(dir.path());
    config.workers = workers;
    let server = Server::start(config, store, stop.clone()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = drover_server::http::router(server.clone(), token.map(str::to_owned));
    let served = tokio::spawn(drover_server::http::serve(
        router,
        listener,
        None,
        stop.clone(),
    ));
    Running {
        _dir: dir,
        addr,
        server,
        stop,
        served,
    }
}

/// A server with its scheduler workers (placements happen) and no token.
async fn start(token: Option<&str>) -> Running {
    start_with(token, 1).await
}

/// A plain HTTP/1.1 client, as a Nomad client speaks to the API (no typed client:
/// the wire is what is under test).
struct Http {
    addr: std::net::SocketAddr,
    token: Option<String>,
}

/// An answer: status, headers, body.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn index(&self) -> u64 {
        self.headers
            .get("X-Nomad-Index")
            .unwrap_or_else(|| panic!("no X-Nomad-Index in {self:?}"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Http {
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> hyper::Response<hyper::body::Incoming> {
        let stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        if let Some(t) = &self.token {
            req = req.header("X-Nomad-Token", t);
        }
        let body = http_body_util::Full::new(bytes::Bytes::from(body.unwrap_or_default()));
        sender.send_request(req.body(body).unwrap()).await.unwrap()
    }

    async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Answer {
        use http_body_util::BodyExt as _;
        let resp = self.send(method, path, body).await;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.request(Method::GET, path, None).await
    }

    /// GET `path`, which must answer 200 with JSON.
    async fn read(&self, path: &str) -> (Value, u64) {
        let a = self.get(path).await;
        assert_eq!(a.status, StatusCode::OK, "GET {path}: {}", a.text());
        (a.json(), a.index())
    }

    async fn write(&self, method: Method, path: &str, body: Value) -> Answer {
        self.request(method, path, Some(serde_json::to_vec(&body).unwrap()))
            .await
    }
}

/// A job as Nomad's API carries it (what `nomad job run -output` prints).
fn nomad_job(id: &str, count: u32) -> Value {
    json!({
        "ID": id,
        "Name": id,
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "app",
            "Count": count,
            "Tasks": [{
                "Name": "main",
                "Driver": "rawexec",
                "Config": {"command": "/bin/sleep", "args": ["1000"]},
                "Resources": {"CPU": 100, "MemoryMB": 64}
            }]
        }]
    })
}

async fn register(h: &Http, id: &str, count: u32) -> Value {
    let a = h
        .write(
            Method::PUT,
            "/v1/jobs",
            json!({ "Job": nomad_job(id, count) }),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "register {id}: {}", a.text());
    a.json()
}

/// Poll `path` until `cond` holds of its JSON (deadline 20 s).
async fn poll(h: &Http, path: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (v, _) = h.read(path).await;
        if cond(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The allocations of `job` that the server wants running.
fn running_wanted(allocs: &Value) -> Vec<Value> {
    allocs
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["DesiredStatus"] == "run")
        .cloned()
        .collect()
}

#[tokio::test]
async fn every_read_route_answers_json_with_nomads_headers() {
    let s = start(None).await;
    let h = s.http(None);
    for path in [
        "/v1/jobs",
        "/v1/nodes",
        "/v1/allocations",
        "/v1/evaluations",
        "/v1/status/peers",
        "/v1/regions",
        "/v1/job/nope/allocations",
        "/v1/job/nope/evaluations",
    ] {
        let a = h.get(path).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text());
        a.index();
        assert_eq!(a.headers["X-Nomad-KnownLeader"], "true", "{path}");
        assert!(a.headers.contains_key("X-Nomad-LastContact"), "{path}");
        assert!(a.json().is_array(), "{path}: {}", a.text());
    }
    // Nomad's texts, as plain text (clients read the code and the text).
    for (path, code, text) in [
        ("/v1/job/nope", 404, "job not found"),
        ("/v1/job/nope/summary", 404, "job not found"),
        ("/v1/job/nope/deployment", 404, "job not found"),
        ("/v1/job/nope/versions", 404, "job versions not found"),
        ("/v1/node/nope", 404, "node not found"),
        ("/v1/node/nope/allocations", 404, "node not found"),
        ("/v1/allocation/nope", 404, "alloc not found"),
        ("/v1/evaluation/nope", 404, "eval not found"),
    ] {
        let a = h.get(path).await;
        assert_eq!(a.status.as_u16(), code, "{path}");
        assert_eq!(a.text(), text, "{path}");
        assert!(
            a.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain"),
            "{path}"
        );
        a.index();
    }
    // Nomad's client endpoints (the agents' own; a server without one in its process
    // says which node has the allocation) answer as Nomad's: a line of text.
    for path in [
        "/v1/client/fs/logs/nope?task=main&type=stdout",
        "/v1/client/allocation/nope/stats",
    ] {
        let a = h.get(path).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(a.text(), "Unknown allocation \"nope\"", "{path}");
    }
    let a = h.get("/v1/nosuch").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = h.request(Method::PATCH, "/v1/jobs", None).await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(a.text(), "Invalid method");
}

#[tokio::test]
async fn agent_and_status_routes_describe_the_server_as_nomads_clients_read_it() {
    let s = start(None).await;
    let h = s.http(None);
    let (me, _) = h.read("/v1/agent/self").await;
    assert_eq!(me["config"]["Region"], "global");
    assert_eq!(me["config"]["Datacenter"], "dc1");
    assert!(me["config"]["Version"]["Version"].is_string(), "{me}");
    assert_eq!(me["member"]["Tags"]["region"], "global");
    assert_eq!(me["member"]["Tags"]["dc"], "dc1");
    assert_eq!(me["member"]["Status"], "alive");
    assert_eq!(me["stats"]["nomad"]["leader"], "true");
    let (members, _) = h.read("/v1/agent/members").await;
    assert_eq!(members["ServerRegion"], "global");
    assert_eq!(members["ServerDC"], "dc1");
    assert_eq!(members["Members"].as_array().unwrap().len(), 1);
    assert_eq!(members["Members"][0]["Status"], "alive");
    let (health, _) = h.read("/v1/agent/health").await;
    assert_eq!(health, json!({"server": {"ok": true, "message": "ok"}}));
    let (leader, _) = h.read("/v1/status/leader").await;
    assert_eq!(leader, json!(s.server.info().rpc_addr));
    let (peers, _) = h.read("/v1/status/peers").await;
    assert_eq!(peers, json!([s.server.info().rpc_addr]));
    let (regions, _) = h.read("/v1/regions").await;
    assert_eq!(regions, json!(["global"]));
    // Drover's own status endpoint stays (the CLI's `server status`).
    let (servers, _) = h.read("/v1/status/servers").await;
    assert!(servers["leader"].is_object(), "{servers}");
    // A query for another region has no path there.
    let a = h.get("/v1/jobs?region=mars").await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(a.text().starts_with("No path to region"), "{}", a.text());
}

#[tokio::test]
async fn bad_requests_are_refused_naming_what_is_wrong() {
    let s = start(None).await;
    let h = s.http(None);
    let mut other_region = nomad_job("a", 1);
    other_region["Region"] = json!("mars");
    let cases: Vec<(Method, &str, Vec<u8>, &str)> = vec![
        (
            Method::PUT,
            "/v1/jobs",
            b"{not json".to_vec(),
            "Failed to decode request body",
        ),
        (Method::PUT, "/v1/jobs", Vec::new(), "Request body is empty"),
        (
            Method::PUT,
            "/v1/jobs",
            br#"{"Nope": 1}"#.to_vec(),
            "Job must be specified",
        ),
        (
            Method::PUT,
            "/v1/job/b",
            serde_json::to_vec(&json!({"Job": nomad_job("a", 1)})).unwrap(),
            "Job ID does not match name",
        ),
        (
            Method::PUT,
            "/v1/jobs",
            serde_json::to_vec(&json!({"Job": other_region})).unwrap(),
            "No path to region",
        ),
        (
            Method::POST,
            "/v1/node/n1/eligibility",
            br#"{"Eligibility": "maybe"}"#.to_vec(),
            "invalid scheduling eligibility \"maybe\"",
        ),
        (
            Method::POST,
            "/v1/job/a/scale",
            br#"{"Count": 2, "Target": {}}"#.to_vec(),
            "missing task group name",
        ),
        (
            Method::GET,
            "/v1/jobs?index=3&wait=soon",
            Vec::new(),
            "Invalid wait time",
        ),
        (Method::GET, "/v1/jobs?index=x", Vec::new(), "Invalid index"),
        (
            Method::DELETE,
            "/v1/job/a?purge=perhaps",
            Vec::new(),
            "Failed to parse value of \"purge\"",
        ),
        (
            Method::GET,
            "/v1/event/stream?topic=Job:a:b",
            Vec::new(),
            "Invalid topic query",
        ),
        (
            Method::GET,
            "/v1/event/stream?topic=Weather",
            Vec::new(),
            "Invalid topic query",
        ),
    ];
    for (method, path, body, want) in cases {
        let a = h
            .request(method.clone(), path, (!body.is_empty()).then_some(body))
            .await;
        assert_eq!(
            a.status,
            StatusCode::BAD_REQUEST,
            "{method} {path}: {}",
            a.text()
        );
        assert!(a.text().starts_with(want), "{method} {path}: {}", a.text());
    }
    // Nothing was registered by any of them.
    let (jobs, _) = h.read("/v1/jobs").await;
    assert_eq!(jobs, json!([]));
}

#[tokio::test]
async fn a_token_is_required_everywhere_and_refusals_change_nothing() {
    let s = start(Some("s3cret")).await;
    let good = s.http(Some("s3cret"));
    for token in [None, Some("wrong"), Some("s3cret2")] {
        let h = s.http(token);
        for (method, path, body) in [
            (Method::GET, "/v1/jobs", None),
            (Method::GET, "/v1/nosuch", None),
            (Method::GET, "/v1/agent/self", None),
            (Method::GET, "/v1/event/stream", None),
            (
                Method::PUT,
                "/v1/jobs",
                Some(serde_json::to_vec(&json!({"Job": nomad_job("a", 1)})).unwrap()),
            ),
            (Method::DELETE, "/v1/job/a?purge=true", None),
            (
                Method::POST,
                "/v1/node/n/drain",
                Some(br#"{"DrainSpec": {"Deadline": 0}}"#.to_vec()),
            ),
        ] {
            let a = h.request(method.clone(), path, body).await;
            assert_eq!(a.status, StatusCode::FORBIDDEN, "{method} {path}");
            assert!(
                a.text().starts_with("Permission denied"),
                "{method} {path}: {}",
                a.text()
            );
        }
    }
    // The server still serves the right token, and nothing was registered.
    let (jobs, _) = good.read("/v1/jobs").await;
    assert_eq!(jobs, json!([]));
    assert_eq!(good.get("/v1/job/a").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_and_the_server_keeps_serving() {
    let s = start(None).await;
    let c = s.client(None);
    let mut big = br#"{"Job": {"ID": "big", "Meta": {"x": ""#.to_vec();
    big.extend(std::iter::repeat_n(
        b'a',
        drover_server::http::MAX_BODY_BYTES + 1,
    ));
    big.extend(br#""}, "TaskGroups": []}}"#);
    let raw = c.raw(Method::PUT, "/v1/jobs", Some(big)).await.unwrap();
    assert_eq!(raw.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        String::from_utf8_lossy(&raw.body),
        "request body larger than 4 MiB"
    );
    let raw = c.raw(Method::GET, "/v1/jobs", None).await.unwrap();
    assert_eq!(raw.status, StatusCode::OK);
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

#[tokio::test]
async fn a_job_round_trips_through_register_read_scale_stop_and_purge() {
    let s = start_with(None, 0).await;
    let h = s.http(None);
    let registered = register(&h, "web", 2).await;
    assert!(
        !registered["EvalID"].as_str().unwrap().is_empty(),
        "{registered}"
    );
    let reg_index = registered["Index"].as_u64().unwrap();
    assert!(reg_index > 0);
    let (job, index) = h.read("/v1/job/web").await;
    assert!(index >= reg_index);
    assert_eq!(job["ID"], "web");
    assert_eq!(job["Version"], 0);
    assert_eq!(job["TaskGroups"][0]["Count"], 2);
    assert_eq!(
        job["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        64
    );
    // PUT on the job's own path registers too.
    let a = h
        .write(
            Method::POST,
            "/v1/job/web",
            json!({"Job": nomad_job("web", 2)}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let (stubs, _) = h.read("/v1/jobs?prefix=we").await;
    assert_eq!(stubs.as_array().unwrap().len(), 1, "{stubs}");
    assert_eq!(stubs[0]["ID"], "web");
    assert!(
        stubs[0]["JobSummary"]["Summary"]["app"].is_object(),
        "{stubs}"
    );
    let (none, _) = h.read("/v1/jobs?prefix=zz").await;
    assert_eq!(none, json!([]));
    // No deployment (no scheduler here): what Nomad's clients read as "none".
    let (latest, _) = h.read("/v1/job/web/deployment").await;
    assert_eq!(latest, Value::Null);
    let (all, _) = h.read("/v1/job/web/deployments").await;
    assert_eq!(all, json!([]));
    let (summary, _) = h.read("/v1/job/web/summary").await;
    assert_eq!(summary["JobID"], "web");
    assert!(summary["Summary"]["app"].is_object(), "{summary}");
    let (evals, _) = h.read("/v1/job/web/evaluations").await;
    assert!(
        evals
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["ID"] == registered["EvalID"]),
        "{evals}"
    );
    let (eval, _) = h
        .read(&format!(
            "/v1/evaluation/{}",
            registered["EvalID"].as_str().unwrap()
        ))
        .await;
    assert_eq!(eval["JobID"], "web");
    // A plan of the same job changes nothing.
    let a = h
        .write(
            Method::POST,
            "/v1/job/web/plan",
            json!({"Job": nomad_job("web", 2), "Diff": true}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.json()["Changed"], false, "{}", a.text());
    // Scaling makes a new version with the group's new count.
    let a = h
        .write(
            Method::POST,
            "/v1/job/web/scale",
            json!({"Count": 3, "Target": {"Group": "app"}, "Message": "more"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert!(!a.json()["EvalID"].as_str().unwrap().is_empty());
    let (job, _) = h.read("/v1/job/web").await;
    assert_eq!(job["Version"], 1);
    assert_eq!(job["TaskGroups"][0]["Count"], 3);
    let (scale, _) = h.read("/v1/job/web/scale").await;
    assert_eq!(scale["TaskGroups"]["app"]["Desired"], 3, "{scale}");
    let (versions, _) = h.read("/v1/job/web/versions").await;
    let counts: Vec<(u64, u64)> = versions["Versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["Version"].as_u64().unwrap(),
                v["TaskGroups"][0]["Count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [(1, 3), (0, 2)]);
    let a = h
        .write(
            Method::POST,
            "/v1/job/web/scale",
            json!({"Count": 1, "Target": {"Group": "db"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().contains("no task group \"db\""), "{}", a.text());
    // Deregister stops it; purge forgets it.
    let a = h.request(Method::DELETE, "/v1/job/web", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert!(!a.json()["EvalID"].as_str().unwrap().is_empty());
    let (job, _) = h.read("/v1/job/web").await;
    assert_eq!(job["Stop"], true);
    let a = h
        .request(Method::DELETE, "/v1/job/web?purge=true", None)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let a = h.get("/v1/job/web").await;
    assert_eq!(
        (a.status, a.text()),
        (StatusCode::NOT_FOUND, "job not found".into())
    );
    let a = h.request(Method::DELETE, "/v1/job/web", None).await;
    assert_eq!(
        (a.status, a.text()),
        (StatusCode::NOT_FOUND, "job not found".into())
    );
}

/// Wait until the server commits nothing more for a while; its index then.
async fn settled(h: &Http) -> u64 {
    let (_, mut index) = h.read("/v1/jobs").await;
    for _ in 0..50 {
        let a = h.get(&format!("/v1/jobs?index={index}&wait=300ms")).await;
        if a.index() == index {
            return index;
        }
        index = a.index();
    }
    panic!("the index never settled");
}

async fn report_running(s: &Running, node_id: &str, alloc_id: &str) {
    s.server
        .update_allocations(
            node_id,
            vec![AllocClientUpdate {
                healthy: Default::default(),
                id: alloc_id.to_owned(),
                client_status: ClientStatus::Running,
                client_description: String::new(),
                task_states: Default::default(),
                services: None,
            }],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_blocking_query_on_a_jobs_allocations_returns_when_one_changes() {
    let s = start(None).await;
    let h = s.http(None);
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    register(&h, "web", 1).await;
    let allocs = poll(&h, "/v1/job/web/allocations", "a placement", |v| {
        v.as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    let alloc_id = allocs[0]["ID"].as_str().unwrap().to_owned();
    assert_eq!(allocs[0]["ClientStatus"], "pending");
    let index = settled(&h).await;
    let waiter = {
        let h = s.http(None);
        tokio::spawn(async move {
            let began = Instant::now();
            let a = h
                .get(&format!("/v1/job/web/allocations?index={index}&wait=60s"))
                .await;
            (a, began.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the query did not block");
    report_running(&s, "n1", &alloc_id).await;
    let (a, took) =
        drover_test_support::within(Duration::from_secs(10), "the blocking query", waiter)
            .await
            .unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.index() > index, "X-Nomad-Index did not move on");
    assert_eq!(a.json()[0]["ClientStatus"], "running", "{}", a.text());
    assert!(took < Duration::from_secs(10), "{took:?}");
    // With nothing committed, the query waits its whole wait and answers at the same
    // index.
    let index = settled(&h).await;
    let began = Instant::now();
    let a = h
        .get(&format!("/v1/job/web/allocations?index={index}&wait=400ms"))
        .await;
    assert!(began.elapsed() >= Duration::from_millis(400));
    assert_eq!(a.index(), index);
}

/// Reads ndjson lines off an event stream.
struct Lines {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl Lines {
    async fn next(&mut self) -> Value {
        use http_body_util::BodyExt as _;
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                return serde_json::from_slice(&line[..line.len() - 1]).unwrap_or_else(|e| {
                    panic!(
                        "not a JSON line ({e}): {:?}",
                        String::from_utf8_lossy(&line)
                    )
                });
            }
            let frame = drover_test_support::within(
                Duration::from_secs(20),
                "the next event",
                self.body.frame(),
            )
            .await
            .expect("the stream ended")
            .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

async fn subscribe(h: &Http, query: &str) -> Lines {
    let resp = h
        .send(Method::GET, &format!("/v1/event/stream?{query}"), None)
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    Lines {
        body: resp.into_body(),
        buf: Vec::new(),
    }
}

#[tokio::test]
async fn the_event_stream_delivers_a_registration_then_the_allocation_updates_in_order() {
    let s = start(None).await;
    let h = s.http(None);
    let mut stream = subscribe(&h, "topic=Job:web&topic=Allocation:web").await;
    // `{}` at once: the stream is open.
    assert_eq!(stream.next().await, json!({}));
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    register(&h, "other", 1).await;
    register(&h, "web", 1).await;
    let mut seen: Vec<(u64, String, String)> = Vec::new();
    let mut last_index = 0;
    let mut alloc_id = None;
    while !seen
        .iter()
        .any(|(_, t, status)| t == "AllocationUpdated" && status == "running")
    {
        let line = stream.next().await;
        if line == json!({}) {
            continue;
        }
        let index = line["Index"].as_u64().unwrap();
        assert!(
            index > last_index,
            "batches out of order: {index} after {last_index}"
        );
        last_index = index;
        for e in line["Events"].as_array().unwrap() {
            assert_eq!(e["Index"], index);
            assert_eq!(e["Namespace"], "default");
            match e["Topic"].as_str().unwrap() {
                "Job" => {
                    assert_eq!(e["Key"], "web", "{e}");
                    assert_eq!(e["Payload"]["Job"]["ID"], "web", "{e}");
                    seen.push((index, e["Type"].as_str().unwrap().into(), String::new()));
                }
                "Allocation" => {
                    let a = &e["Payload"]["Allocation"];
                    assert_eq!(a["JobID"], "web", "{e}");
                    assert_eq!(e["FilterKeys"][0], "web", "{e}");
                    let id = a["ID"].as_str().unwrap().to_owned();
                    if alloc_id.is_none() {
                        alloc_id = Some(id.clone());
                        // The client reports it running: the next event of it.
                        report_running(&s, "n1", &id).await;
                    }
                    seen.push((
                        index,
                        e["Type"].as_str().unwrap().into(),
                        a["ClientStatus"].as_str().unwrap().into(),
                    ));
                }
                other => panic!("topic {other} was not asked for: {e}"),
            }
        }
    }
    assert_eq!(seen[0].1, "JobRegistered", "{seen:?}");
    assert_eq!(seen[1].1, "PlanResult", "{seen:?}");
    assert_eq!(seen[1].2, "pending", "{seen:?}");
    // A subscriber from an index replays what the ring still holds, from there.
    let mut replay = subscribe(&h, &format!("topic=Job&index={}", seen[0].0)).await;
    assert_eq!(replay.next().await, json!({}));
    let first = replay.next().await;
    assert_eq!(first["Index"], seen[0].0);
    assert_eq!(first["Events"][0]["Type"], "JobRegistered");
}

#[tokio::test]
async fn stopping_an_allocation_replaces_it() {
    let s = start(None).await;
    let h = s.http(None);
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    register(&h, "web", 1).await;
    let allocs = poll(&h, "/v1/job/web/allocations", "a placement", |v| {
        v.as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    let old = allocs[0]["ID"].as_str().unwrap().to_owned();
    let (full, _) = h.read(&format!("/v1/allocation/{old}")).await;
    assert_eq!(full["ID"], old.as_str());
    assert_eq!(full["JobID"], "web");
    let (stubs, _) = h
        .read(&format!("/v1/allocations?prefix={}", &old[..8]))
        .await;
    assert_eq!(stubs.as_array().unwrap().len(), 1);
    let a = h
        .request(Method::POST, &format!("/v1/allocation/{old}/stop"), None)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let stopped = a.json();
    assert!(!stopped["EvalID"].as_str().unwrap().is_empty(), "{stopped}");
    assert!(stopped["Index"].as_u64().unwrap() > 0);
    let allocs = poll(&h, "/v1/job/web/allocations", "a replacement", |v| {
        let wanted = running_wanted(v);
        wanted.len() == 1 && wanted[0]["ID"] != old.as_str()
    })
    .await;
    let old_now = allocs
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["ID"] == old.as_str())
        .unwrap();
    assert_eq!(old_now["DesiredStatus"], "stop");
    let a = h
        .request(Method::POST, "/v1/allocation/nope/stop", None)
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_ineligible_node_gets_no_placements_and_a_drain_moves_allocations_off() {
    let s = start(None).await;
    let h = s.http(None);
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    let a = h
        .write(
            Method::POST,
            "/v1/node/n1/eligibility",
            json!({"Eligibility": "ineligible"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert!(a.json()["NodeModifyIndex"].as_u64().unwrap() > 0);
    let (n, _) = h.read("/v1/node/n1").await;
    assert_eq!(n["SchedulingEligibility"], "ineligible", "{n}");
    // The node's next registration (an agent restart) keeps it ineligible.
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    let (n, _) = h.read("/v1/node/n1").await;
    assert_eq!(n["SchedulingEligibility"], "ineligible", "{n}");
    register(&h, "web", 1).await;
    poll(&h, "/v1/job/web/summary", "the job queued", |v| {
        v["Summary"]["app"]["Queued"].as_u64() == Some(1)
    })
    .await;
    assert_eq!(h.read("/v1/job/web/allocations").await.0, json!([]));
    // Eligible again: the blocked placement happens there.
    let a = h
        .write(
            Method::POST,
            "/v1/node/n1/eligibility",
            json!({"Eligibility": "eligible"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let allocs = poll(&h, "/v1/job/web/allocations", "a placement on n1", |v| {
        running_wanted(v).len() == 1
    })
    .await;
    assert_eq!(allocs[0]["NodeID"], "n1");
    let (on_node, _) = h.read("/v1/node/n1/allocations").await;
    assert_eq!(on_node.as_array().unwrap().len(), 1);
    // A drain moves it off: nowhere else to go, it waits.
    let a = h
        .write(
            Method::POST,
            "/v1/node/n1/drain",
            json!({"DrainSpec": {"Deadline": 3_600_000_000_000_i64, "IgnoreSystemJobs": false}, "MarkEligible": false}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let (n, _) = h.read("/v1/node/n1").await;
    assert_eq!(n["Drain"], true, "{n}");
    assert_eq!(n["SchedulingEligibility"], "ineligible", "{n}");
    poll(
        &h,
        "/v1/job/web/allocations",
        "the allocation stopped",
        |v| running_wanted(v).is_empty(),
    )
    .await;
    // The drain ends; marked eligible, the node takes the job back.
    let a = h
        .write(
            Method::POST,
            "/v1/node/n1/drain",
            json!({"DrainSpec": null, "MarkEligible": true}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let (n, _) = h.read("/v1/node/n1").await;
    assert_eq!(n["Drain"], false, "{n}");
    assert_eq!(n["SchedulingEligibility"], "eligible", "{n}");
    poll(&h, "/v1/job/web/allocations", "a placement again", |v| {
        running_wanted(v).len() == 1
    })
    .await;
    let (stubs, _) = h.read("/v1/nodes").await;
    assert_eq!(stubs[0]["ID"], "n1");
    assert_eq!(stubs[0]["SchedulingEligibility"], "eligible");
    let a = h
        .write(
            Method::POST,
            "/v1/node/nope/eligibility",
            json!({"Eligibility": "eligible"}),
        )
        .await;
    assert_eq!(
        (a.status, a.text()),
        (StatusCode::NOT_FOUND, "node not found".into())
    );
}

#[tokio::test]
async fn an_hcl_job_file_parses_into_nomads_job_json() {
    let s = start(None).await;
    let h = s.http(None);
    let hcl = r#"
variable "n" {
  default = 2
}
job "web" {
  datacenters = ["dc1"]
  group "app" {
    count = var.n
    task "main" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["1000"]
      }
    }
  }
}
"#;
    for canonicalize in [false, true] {
        let a = h
            .write(
                Method::POST,
                "/v1/jobs/parse",
                json!({"JobHCL": hcl, "Canonicalize": canonicalize}),
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        let job = a.json();
        assert_eq!(job["ID"], "web", "{job}");
        assert_eq!(job["TaskGroups"][0]["Count"], 2, "{job}");
        assert_eq!(
            job["TaskGroups"][0]["Tasks"][0]["Config"]["command"],
            "/bin/sleep"
        );
        if canonicalize {
            assert_eq!(job["Region"], "global", "{job}");
            assert_eq!(job["Type"], "service", "{job}");
        }
    }
    // Errors name the place; nothing is read from the server's files.
    let a = h
        .write(
            Method::POST,
            "/v1/jobs/parse",
            json!({"JobHCL": "job \"x\" {\n  group \"g\" {\n"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().starts_with("error parsing: "), "{}", a.text());
    assert!(a.text().contains("job.hcl"), "{}", a.text());
    let a = h
        .write(
            Method::POST,
            "/v1/jobs/parse",
            json!({"JobHCL": "job \"x\" {\n  meta { k = file(\"/etc/passwd\") }\n}\n"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(!a.text().contains("root:"), "{}", a.text());
    let a = h
        .write(Method::POST, "/v1/jobs/parse", json!({"JobHCL": ""}))
        .await;
    assert_eq!(
        (a.status, a.text()),
        (StatusCode::BAD_REQUEST, "Job HCL must be specified".into())
    );

    // What used to overflow the server's stack (locals wrapping each other 60 levels at
    // a time) and what used to take gigabytes (nested fors): refused, several at once,
    // and the server goes on parsing.
    let wrap = |inner: &str| format!("{}{inner}{}", "[".repeat(60), "]".repeat(60));
    let mut deep = format!("locals {{\n  l0 = {}\n", wrap("1"));
    for i in 1..3000 {
        deep.push_str(&format!(
            "  l{i} = {}\n",
            wrap(&format!("local.l{}", i - 1))
        ));
    }
    deep.push_str("}\njob \"x\" {\n  meta { m = jsonencode(local.l2999) }\n}\n");
    let nested = "job \"x\" {\n  meta { m = jsonencode([for a in range(1024) : [for b in range(64) : format(\"%4096s\", \"\")]]) }\n}\n";
    let attacks = (0..4).map(|i| {
        let text = if i % 2 == 0 {
            deep.clone()
        } else {
            nested.to_owned()
        };
        let h = &h;
        async move {
            h.write(Method::POST, "/v1/jobs/parse", json!({"JobHCL": text}))
                .await
        }
    });
    for (i, a) in futures_util::future::join_all(attacks)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
        let expected = if i % 2 == 0 {
            "nested deeper than 64 levels"
        } else {
            "a for expression inside another is not supported by Drover"
        };
        assert!(a.text().contains(expected), "{}", a.text());
    }
    let a = h
        .write(Method::POST, "/v1/jobs/parse", json!({"JobHCL": hcl}))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
}

#[tokio::test]
async fn deployment_routes_answer_nomads_shapes_and_refuse_unknown_ids() {
    let s = start_with(None, 0).await;
    let h = s.http(None);
    // Nothing deployed: empty lists, a job's latest deployment is null.
    let (all, _) = h.read("/v1/deployments").await;
    assert_eq!(all, json!([]));
    register(&h, "web", 2).await;
    let (latest, _) = h.read("/v1/job/web/deployment").await;
    assert_eq!(latest, Value::Null);
    let (list, _) = h.read("/v1/job/web/deployments").await;
    assert_eq!(list, json!([]));
    let (none, _) = h.read("/v1/deployments?prefix=0b").await;
    assert_eq!(none, json!([]));
    // A job that does not exist, a deployment that does not exist: 404 with the words.
    for (path, words) in [
        ("/v1/job/nope/deployment", "job not found"),
        ("/v1/job/nope/deployments", "job not found"),
        ("/v1/deployment/0b23b149", "deployment not found"),
        (
            "/v1/deployment/allocations/0b23b149",
            "deployment not found",
        ),
    ] {
        let a = h.get(path).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "GET {path}: {}", a.text());
        assert_eq!(a.text(), words, "GET {path}");
        a.index();
    }
    for method in [Method::PUT, Method::POST] {
        let a = h
            .write(
                method.clone(),
                "/v1/deployment/promote/0b23b149",
                json!({"All": true}),
            )
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.text());
        assert!(
            a.text().contains("deployment 0b23b149 not found"),
            "{}",
            a.text()
        );
        let a = h
            .request(method, "/v1/deployment/fail/0b23b149", None)
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.text());
        assert!(
            a.text().contains("deployment 0b23b149 not found"),
            "{}",
            a.text()
        );
    }
    // A promote naming nothing to promote is refused before anything is looked up.
    let a = h
        .write(Method::PUT, "/v1/deployment/promote/0b23b149", json!({}))
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(a.text().contains("\"All\""), "{}", a.text());
    // Reads only on GET.
    let a = h
        .request(Method::DELETE, "/v1/deployment/0b23b149", None)
        .await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{}", a.text());
}

#[tokio::test]
async fn a_job_reverts_to_an_earlier_version_as_a_new_one() {
    let s = start_with(None, 0).await;
    let h = s.http(None);
    register(&h, "web", 2).await;
    let a = h
        .write(
            Method::PUT,
            "/v1/job/web/scale",
            json!({"Count": 5, "Target": {"Group": "app"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let (job, _) = h.read("/v1/job/web").await;
    assert_eq!(
        (
            job["Version"].clone(),
            job["TaskGroups"][0]["Count"].clone()
        ),
        (json!(1), json!(5))
    );
    // Refusals: the current version, a version not kept, another job's id, a prior
    // version that is not the current one; each names why and changes nothing.
    for (body, status, words) in [
        (
            json!({"JobID": "web", "JobVersion": 1}),
            StatusCode::BAD_REQUEST,
            "can't revert to current version 1",
        ),
        (
            json!({"JobID": "web", "JobVersion": 9}),
            StatusCode::NOT_FOUND,
            "job web has no version 9 kept",
        ),
        (
            json!({"JobID": "api", "JobVersion": 0}),
            StatusCode::BAD_REQUEST,
            "Job ID does not match",
        ),
        (
            json!({"JobID": "web", "JobVersion": 0, "EnforcePriorVersion": 0}),
            StatusCode::BAD_REQUEST,
            "current job has version 1; enforcing version 0",
        ),
    ] {
        let a = h
            .write(Method::PUT, "/v1/job/web/revert", body.clone())
            .await;
        assert_eq!(a.status, status, "{body}: {}", a.text());
        assert!(a.text().contains(words), "{body}: {}", a.text());
    }
    let a = h
        .write(Method::PUT, "/v1/job/nope/revert", json!({"JobVersion": 0}))
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.text());
    let (job, _) = h.read("/v1/job/web").await;
    assert_eq!(job["Version"], 1, "a refused revert changed the job");
    // The revert: a registration's answer, and version 2 is version 0's spec.
    let a = h
        .write(
            Method::POST,
            "/v1/job/web/revert",
            json!({"JobID": "web", "JobVersion": 0, "EnforcePriorVersion": 1}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let r = a.json();
    assert!(!r["EvalID"].as_str().unwrap().is_empty(), "{r}");
    assert!(r["JobModifyIndex"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(a.index(), r["Index"].as_u64().unwrap());
    let (job, _) = h.read("/v1/job/web").await;
    assert_eq!(job["Version"], 2);
    assert_eq!(job["TaskGroups"][0]["Count"], 2);
    let (versions, _) = h.read("/v1/job/web/versions").await;
    let numbers: Vec<u64> = versions["Versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["Version"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [2, 1, 0]);
    // The typed client (the CLI's) reads the same.
    let c = s.client(None);
    let versions = c
        .job_versions("web", &QueryOptions::default())
        .await
        .unwrap()
        .value;
    assert_eq!(
        versions.iter().map(|j| j.version).collect::<Vec<_>>(),
        [2, 1, 0]
    );
    let r = c.revert_job("web", 1, Some(2)).await.unwrap();
    assert!(!r.eval_id.is_empty());
    let r = c.scale_job("web", "app", 3).await.unwrap();
    assert!(!r.eval_id.is_empty());
    let job = c.job("web", &QueryOptions::default()).await.unwrap().value;
    assert_eq!((job.version, job.spec.groups[0].count), (4, 3));
    assert_eq!(
        c.latest_job_deployment("web", &QueryOptions::default())
            .await
            .unwrap()
            .value,
        None
    );
    assert!(
        c.job_deployments("web", &QueryOptions::default())
            .await
            .unwrap()
            .value
            .is_empty()
    );
    assert!(
        c.deployments(&QueryOptions::default())
            .await
            .unwrap()
            .value
            .is_empty()
    );
    let err = c.fail_deployment("0b23").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = c.promote_deployment("0b23", None).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = c
        .deployment("0b23", &QueryOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    s.stop.cancel();
    let _ = s.served.await;
}

#[tokio::test]
async fn a_service_jobs_deployment_reads_through_every_route_and_refuses_a_promote_without_canaries()
 {
    let s = start(None).await;
    let h = s.http(None);
    s.server
        .register_node(node("n1", 4000, 4096), SECRET)
        .await
        .unwrap();
    let mut stream = subscribe(&h, "topic=Deployment:web").await;
    assert_eq!(stream.next().await, json!({}));
    let mut job = nomad_job("web", 2);
    job["Update"] = json!({"MaxParallel": 1, "HealthCheck": "task_states", "AutoRevert": false});
    let a = h
        .write(Method::PUT, "/v1/jobs", json!({ "Job": job }))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let list = poll(&h, "/v1/deployments", "a deployment", |v| {
        v.as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    let d = &list[0];
    let id = d["ID"].as_str().unwrap().to_owned();
    assert_eq!(d["JobID"], "web");
    assert_eq!(d["JobVersion"], 0);
    assert_eq!(d["Status"], "running", "{d:#}");
    assert_eq!(d["Namespace"], "default");
    assert_eq!(d["TaskGroups"]["app"]["DesiredTotal"], 2, "{d:#}");
    assert_eq!(d["TaskGroups"]["app"]["DesiredCanaries"], 0, "{d:#}");
    // Its creation came through the event stream (topic `Deployment`, keyed by its id
    // and selected by its job).
    let created = loop {
        let line = stream.next().await;
        if line == json!({}) {
            continue;
        }
        break line;
    };
    let event = &created["Events"][0];
    assert_eq!(event["Topic"], "Deployment", "{created:#}");
    assert_eq!(event["Type"], "DeploymentStatusUpdate", "{created:#}");
    assert_eq!(event["Key"], id.as_str(), "{created:#}");
    assert_eq!(
        event["Payload"]["Deployment"]["JobID"], "web",
        "{created:#}"
    );
    // The same deployment by id, by prefix, as the job's latest and in its list.
    let (one, _) = h.read(&format!("/v1/deployment/{id}")).await;
    assert_eq!(one["ID"], id.as_str());
    let (by_prefix, _) = h.read(&format!("/v1/deployment/{}", &id[..8])).await;
    assert_eq!(by_prefix["ID"], id.as_str());
    let (latest, _) = h.read("/v1/job/web/deployment").await;
    assert_eq!(latest["ID"], id.as_str());
    let (of_job, _) = h.read("/v1/job/web/deployments").await;
    assert_eq!(of_job.as_array().unwrap().len(), 1, "{of_job:#}");
    let (prefixed, _) = h
        .read(&format!("/v1/deployments?prefix={}", &id[..4]))
        .await;
    assert_eq!(prefixed.as_array().unwrap().len(), 1);
    // The allocations it placed (max_parallel 1: one first), as stubs with the id.
    let allocs = poll(
        &h,
        &format!("/v1/deployment/allocations/{id}"),
        "its first placement",
        |v| v.as_array().is_some_and(|a| !a.is_empty()),
    )
    .await;
    assert_eq!(allocs[0]["JobID"], "web");
    // Nomad's stubs carry no deployment id: the full allocation does.
    let (full, _) = h
        .read(&format!(
            "/v1/allocation/{}",
            allocs[0]["ID"].as_str().unwrap()
        ))
        .await;
    assert_eq!(full["DeploymentID"], id.as_str(), "{full:#}");
    // Nothing to promote: 400 saying why; the deployment goes on.
    let a = h
        .write(
            Method::PUT,
            &format!("/v1/deployment/promote/{id}"),
            json!({"All": true}),
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(a.text().contains("no canaries to promote"), "{}", a.text());
    let a = h
        .write(
            Method::PUT,
            &format!("/v1/deployment/promote/{id}"),
            json!({"Groups": ["nope"]}),
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(a.text().contains("no task group \"nope\""), "{}", a.text());
    // An operator fails it: Nomad's update answer; it is failed and says so; a second
    // fail is refused naming its status.
    let a = h
        .request(Method::POST, &format!("/v1/deployment/fail/{id}"), None)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let r = a.json();
    assert!(r["DeploymentModifyIndex"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(a.index(), r["Index"].as_u64().unwrap());
    let (failed, _) = h.read(&format!("/v1/deployment/{id}")).await;
    assert_eq!(failed["Status"], "failed", "{failed:#}");
    assert_eq!(failed["StatusDescription"], "Deployment marked as failed");
    let a = h
        .request(Method::PUT, &format!("/v1/deployment/fail/{id}"), None)
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert!(a.text().contains("is failed"), "{}", a.text());
    // The typed client reads the same.
    let c = s.client(None);
    let d = c
        .deployment(&id[..8], &QueryOptions::default())
        .await
        .unwrap()
        .value;
    assert_eq!(
        (
            d.id.as_str(),
            d.status.as_str(),
            d.groups["app"].desired_total
        ),
        (id.as_str(), "failed", 2)
    );
    let allocs = c
        .deployment_allocations(&id, &QueryOptions::default())
        .await
        .unwrap()
        .value;
    assert!(!allocs.is_empty());
}
