//! The node RPCs and the forwarded API over real TCP on 127.0.0.1, through a real
//! `Server`: token refusal, TLS (with certificates made here), malformed documents,
//! forwarding through an axum router, and the register/heartbeat/watch/update cycle.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use drover_proto::drover::cluster::v1 as pb;
use drover_server::rpc::{FORWARD_CHUNK_BYTES, MAX_UPDATE_BATCH, RpcOptions, serve};
use drover_server::store::MemStore;
use drover_server::tls::TlsFiles;
use drover_server::{Server, ServerConfig};
use drover_server_api::{
    AllocClientUpdate, ClientStatus, DriverInfo, NodeRegistration, NodeResources,
};
use drover_test_support::pki::TestCa;
use drover_test_support::within;
use pb::api_client::ApiClient;
use pb::node_client::NodeClient;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const LIMIT: Duration = Duration::from_secs(20);
/// The node secret these tests' nodes present.
const SECRET: &str = "rpc-test-node-secret-0123456789";

struct Running {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<Result<(), drover_server::ServerError>>,
    _dir: tempfile::TempDir,
}

async fn start(options: RpcOptions, api: Option<axum::Router>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let mut config = ServerConfig::new(dir.path());
    config.workers = 1;
    let server = Server::start(config, Arc::new(MemStore::new()), stop.clone())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(serve(server, listener, options, api, stop.clone()));
    Running {
        addr,
        stop,
        served,
        _dir: dir,
    }
}

impl Running {
    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.stop.cancel();
        within(LIMIT, "the RPC server to stop", self.served)
            .await
            .unwrap()
            .unwrap();
    }
}

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("x-drover-token", token.parse().unwrap());
    r
}

fn registration(id: &str, name: &str) -> NodeRegistration {
    NodeRegistration {
        devices: Default::default(),
        host_volumes: Default::default(),
        csi_plugins: Default::default(),
        network: Default::default(),
        datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
        id: id.into(),
        name: name.into(),
        attributes: BTreeMap::from([("kernel.name".into(), "linux".into())]),
        meta: BTreeMap::new(),
        resources: NodeResources {
            cpu: 4000,
            memory_mb: 4096,
        },
        drivers: BTreeMap::from([(
            "rawexec".into(),
            DriverInfo {
                detected: true,
                healthy: true,
                ..Default::default()
            },
        )]),
    }
}

/// An API router for the forwarding tests: it checks the token header as the real
/// HTTP layer does, echoes what it saw, and serves a large body.
fn test_router(token: Option<&'static str>) -> axum::Router {
    use axum::routing::{get, put};
    let router = axum::Router::new()
        .route(
            "/v1/echo",
            put(
                |headers: http::HeaderMap, uri: http::Uri, body: axum::body::Bytes| async move {
                    let ct = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    (
                        http::StatusCode::CREATED,
                        [("x-nomad-index", "7")],
                        format!("{} {} {}", uri, ct, String::from_utf8_lossy(&body)),
                    )
                },
            ),
        )
        .route(
            "/v1/big",
            get(|| async { vec![b'x'; 3 * FORWARD_CHUNK_BYTES + 5] }),
        );
    router.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| async move {
            if let Some(want) = token
                && req
                    .headers()
                    .get("x-nomad-token")
                    .and_then(|v| v.to_str().ok())
                    != Some(want)
            {
                return axum::response::IntoResponse::into_response((
                    http::StatusCode::UNAUTHORIZED,
                    "token",
                ));
            }
            next.run(req).await
        },
    ))
}

/// Forward one request; the status, headers and the body reassembled, and how many
/// messages carried it.
async fn forward(
    client: &mut ApiClient<Channel>,
    req: tonic::Request<pb::ForwardRequest>,
) -> Result<(u32, HashMap<String, String>, Vec<u8>, usize), tonic::Status> {
    let mut stream = client.forward(req).await?.into_inner();
    let first = stream.message().await?.expect("a first message");
    let mut body = first.body;
    let mut pieces = 0;
    while let Some(m) = stream.message().await? {
        assert!(
            m.body.len() <= FORWARD_CHUNK_BYTES,
            "a piece is {} bytes",
            m.body.len()
        );
        body.extend(m.body);
        pieces += 1;
    }
    Ok((first.status, first.headers, body, pieces))
}

fn get(path: &str) -> pb::ForwardRequest {
    pb::ForwardRequest {
        method: "GET".into(),
        path_and_query: path.into(),
        headers: HashMap::new(),
        body: Vec::new(),
    }
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_refused_and_the_server_keeps_serving() {
    let running = start(
        RpcOptions {
            token: Some("s3cret".into()),
            tls: None,
            ..RpcOptions::default()
        },
        Some(test_router(Some("s3cret"))),
    )
    .await;
    let channel = running.channel().await;
    let mut node = NodeClient::new(channel.clone());
    let mut api = ApiClient::new(channel);

    let hb = || pb::HeartbeatRequest {
        node_secret: SECRET.into(),
        node_id: "n1".into(),
    };
    let err = node.heartbeat(hb()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(
        err.message().contains("x-drover-token"),
        "{}",
        err.message()
    );
    let err = node
        .heartbeat(with_token(hb(), "s3creT"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = node
        .register(with_token(
            pb::RegisterRequest {
                node_secret: SECRET.into(),
                node_json: serde_json::to_vec(&registration("n1", "one")).unwrap(),
            },
            "nope",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = node
        .watch_allocations(pb::WatchAllocationsRequest {
            node_secret: SECRET.into(),
            node_id: "n1".into(),
            index: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = forward(&mut api, tonic::Request::new(get("/v1/big")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    // Still serving, on the same connection: the right token gets through, to the
    // API router too (which checks the token header the server sets).
    let (status, _, body, _) = forward(&mut api, with_token(get("/v1/big"), "s3cret"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(body.len(), 3 * FORWARD_CHUNK_BYTES + 5);
    let err = node.heartbeat(with_token(hb(), "s3cret")).await;
    assert_ne!(err.err().map(|e| e.code()), Some(Code::Unauthenticated));
    running.stop().await;
}

/// A node-introduction token opens the node RPCs only: `Api.Forward` (the servers'
/// own, which runs any HTTP request) refuses it, and the cluster token still opens both
/// (servers forward node RPCs to the leader with it).
#[tokio::test]
async fn the_node_token_opens_node_rpcs_and_not_the_servers_forwarding() {
    let running = start(
        RpcOptions {
            token: Some("s3cret".into()),
            node_token: Some("n0de".into()),
            ..RpcOptions::default()
        },
        Some(test_router(Some("s3cret"))),
    )
    .await;
    let channel = running.channel().await;
    let mut node = NodeClient::new(channel.clone());
    let mut api = ApiClient::new(channel);
    let hb = || pb::HeartbeatRequest {
        node_secret: SECRET.into(),
        node_id: "n1".into(),
    };
    for token in ["n0de", "s3cret"] {
        let answer = node.heartbeat(with_token(hb(), token)).await;
        assert_ne!(
            answer.err().map(|e| e.code()),
            Some(Code::Unauthenticated),
            "{token}"
        );
    }
    let err = node.heartbeat(with_token(hb(), "n0dE")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    let err = forward(&mut api, with_token(get("/v1/big"), "n0de"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let (status, _, _, _) = forward(&mut api, with_token(get("/v1/big"), "s3cret"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    running.stop().await;
}

#[tokio::test]
async fn malformed_documents_are_invalid_arguments_naming_the_field() {
    let running = start(RpcOptions::default(), None).await;
    let mut node = NodeClient::new(running.channel().await);

    let err = node
        .register(pb::RegisterRequest {
            node_secret: SECRET.into(),
            node_json: b"{\"id\": 12".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("node_json"), "{}", err.message());

    let good = serde_json::to_vec(&AllocClientUpdate {
        healthy: Default::default(),
        id: "a1".into(),
        client_status: ClientStatus::Running,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        services: None,
    })
    .unwrap();
    let err = node
        .update_allocations(pb::UpdateAllocationsRequest {
            node_secret: SECRET.into(),
            node_id: "n1".into(),
            updates_json: vec![
                good.clone(),
                b"{\"id\": \"a2\", \"client_status\": \"sleepy\"}".to_vec(),
            ],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("updates_json[1]"),
        "{}",
        err.message()
    );
    assert!(err.message().contains("sleepy"), "{}", err.message());

    let err = node
        .update_allocations(pb::UpdateAllocationsRequest {
            node_secret: SECRET.into(),
            node_id: "n1".into(),
            updates_json: vec![good; MAX_UPDATE_BATCH + 1],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains(&format!("at most {MAX_UPDATE_BATCH}")),
        "{}",
        err.message()
    );

    let err = node
        .heartbeat(pb::HeartbeatRequest {
            node_secret: SECRET.into(),
            node_id: "".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    running.stop().await;
}

#[tokio::test]
async fn forward_runs_the_request_through_the_router_and_streams_the_body_back() {
    let running = start(RpcOptions::default(), Some(test_router(None))).await;
    let mut api = ApiClient::new(running.channel().await);

    let mut req = pb::ForwardRequest {
        method: "PUT".into(),
        path_and_query: "/v1/echo?index=3&wait=1s".into(),
        headers: HashMap::from([("content-type".to_owned(), "application/json".to_owned())]),
        body: b"{\"a\":1}".to_vec(),
    };
    let (status, headers, body, _) = forward(&mut api, tonic::Request::new(req.clone()))
        .await
        .unwrap();
    assert_eq!(status, 201);
    assert_eq!(headers.get("x-nomad-index").map(String::as_str), Some("7"));
    assert_eq!(
        String::from_utf8(body).unwrap(),
        "/v1/echo?index=3&wait=1s application/json {\"a\":1}"
    );

    let (status, _, body, pieces) = forward(&mut api, tonic::Request::new(get("/v1/big")))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(body.iter().all(|b| *b == b'x') && body.len() == 3 * FORWARD_CHUNK_BYTES + 5);
    assert!(
        pieces >= 4,
        "a body of 3 chunks and a bit came in {pieces} pieces"
    );

    let (status, _, _, _) = forward(&mut api, tonic::Request::new(get("/v1/nothing-here")))
        .await
        .unwrap();
    assert_eq!(status, 404);

    req.path_and_query = "/metrics".into();
    let err = forward(&mut api, tonic::Request::new(req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    running.stop().await;
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

async fn tls_channel(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test]
async fn tls_serves_clients_that_trust_its_ca_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestCa::new();
    let (cert, key) = pki.leaf("localhost");
    let files = TlsFiles {
        cert: write(dir.path(), "server.pem", &cert),
        key: write(dir.path(), "server-key.pem", &key),
        client_ca: None,
    };
    let running = start(
        RpcOptions {
            token: None,
            tls: Some(files),
            ..RpcOptions::default()
        },
        Some(test_router(None)),
    )
    .await;

    let channel = tls_channel(running.addr, &pki.ca_pem, None).await.unwrap();
    let (status, _, _, _) = forward(
        &mut ApiClient::new(channel),
        tonic::Request::new(get("/v1/big")),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);

    // A client that trusts another CA does not get through the handshake.
    let other = TestCa::new();
    let refused = match tls_channel(running.addr, &other.ca_pem, None).await {
        Err(_) => true,
        Ok(ch) => forward(&mut ApiClient::new(ch), tonic::Request::new(get("/v1/big")))
            .await
            .is_err(),
    };
    assert!(refused, "a client trusting another CA was served");
    // Plain text to a TLS listener fails too, and the server keeps serving.
    let plain = Endpoint::from_shared(format!("http://{}", running.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(ch) = plain {
        let r = forward(&mut ApiClient::new(ch), tonic::Request::new(get("/v1/big"))).await;
        assert!(r.is_err(), "plain text was served on a TLS listener");
    }
    let channel = tls_channel(running.addr, &pki.ca_pem, None).await.unwrap();
    let (status, _, _, _) = forward(
        &mut ApiClient::new(channel),
        tonic::Request::new(get("/v1/big")),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    running.stop().await;
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let servers = TestCa::new();
    let clients = TestCa::new();
    let (cert, key) = servers.leaf("localhost");
    let files = TlsFiles {
        cert: write(dir.path(), "server.pem", &cert),
        key: write(dir.path(), "server-key.pem", &key),
        client_ca: Some(write(dir.path(), "clients.pem", &clients.ca_pem)),
    };
    let running = start(
        RpcOptions {
            token: None,
            tls: Some(files),
            ..RpcOptions::default()
        },
        Some(test_router(None)),
    )
    .await;
    let good = clients.leaf("node-1");
    let ch = tls_channel(running.addr, &servers.ca_pem, Some(&good))
        .await
        .unwrap();
    let (status, _, _, _) = forward(&mut ApiClient::new(ch), tonic::Request::new(get("/v1/big")))
        .await
        .unwrap();
    assert_eq!(status, 200);

    for identity in [None, Some(servers.leaf("node-2"))] {
        let refused = match tls_channel(running.addr, &servers.ca_pem, identity.as_ref()).await {
            Err(_) => true,
            Ok(ch) => forward(&mut ApiClient::new(ch), tonic::Request::new(get("/v1/big")))
                .await
                .is_err(),
        };
        assert!(
            refused,
            "a client without a certificate from the client CA was served"
        );
    }
    running.stop().await;
}

#[tokio::test]
async fn unreadable_or_invalid_tls_files_stop_serve_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let server = Server::start(
        ServerConfig::new(dir.path()),
        Arc::new(MemStore::new()),
        stop.clone(),
    )
    .await
    .unwrap();
    let options = RpcOptions {
        token: None,
        tls: Some(TlsFiles {
            cert: write(dir.path(), "cert.pem", "not a certificate"),
            key: dir.path().join("missing-key.pem"),
            client_ca: None,
        }),
        ..RpcOptions::default()
    };
    let err = within(
        LIMIT,
        "serve to refuse",
        serve(server, listener, options, None, stop),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("missing-key.pem"), "{err}");
}

// --- the cycle through the server core --------------------------------------------
// These drive the core (`Server::register_node` and friends) through the RPC layer.

#[tokio::test]
async fn register_heartbeat_and_watch_through_the_core() {
    let running = start(
        RpcOptions {
            token: Some("t".into()),
            tls: None,
            ..RpcOptions::default()
        },
        None,
    )
    .await;
    let mut node = NodeClient::new(running.channel().await);
    let reg = node
        .register(with_token(
            pb::RegisterRequest {
                node_secret: SECRET.into(),
                node_json: serde_json::to_vec(&registration("node-a", "a")).unwrap(),
            },
            "t",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(reg.heartbeat_ttl_ms > 0);
    assert!(reg.index > 0);

    let hb = node
        .heartbeat(with_token(
            pb::HeartbeatRequest {
                node_secret: SECRET.into(),
                node_id: "node-a".into(),
            },
            "t",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.heartbeat_ttl_ms, reg.heartbeat_ttl_ms);

    let err = node
        .heartbeat(with_token(
            pb::HeartbeatRequest {
                node_secret: SECRET.into(),
                node_id: "no-such-node".into(),
            },
            "t",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // The first message of a watch from index 0 is the complete set (empty here).
    let mut watch = node
        .watch_allocations(with_token(
            pb::WatchAllocationsRequest {
                node_secret: SECRET.into(),
                node_id: "node-a".into(),
                index: 0,
            },
            "t",
        ))
        .await
        .unwrap()
        .into_inner();
    let first = within(LIMIT, "the complete set", watch.message())
        .await
        .unwrap()
        .unwrap();
    assert!(first.complete);
    assert!(first.allocations_json.is_empty());
    assert!(first.index >= reg.index);

    // A status report travels (decoded, batched) to the core, which answers with
    // the index of its commit or refuses an allocation the node does not have.
    let update = serde_json::to_vec(&AllocClientUpdate {
        healthy: Default::default(),
        id: "not-an-alloc".into(),
        client_status: ClientStatus::Running,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        services: None,
    })
    .unwrap();
    let answer = node
        .update_allocations(with_token(
            pb::UpdateAllocationsRequest {
                node_secret: SECRET.into(),
                node_id: "node-a".into(),
                updates_json: vec![update],
            },
            "t",
        ))
        .await;
    if let Err(err) = answer {
        assert!(
            matches!(err.code(), Code::NotFound | Code::InvalidArgument),
            "{err:?}"
        );
    }
    drop(watch);
    running.stop().await;
}

#[tokio::test]
async fn a_watch_ends_when_the_server_stops() {
    let running = start(RpcOptions::default(), None).await;
    let mut node = NodeClient::new(running.channel().await);
    node.register(pb::RegisterRequest {
        node_secret: SECRET.into(),
        node_json: serde_json::to_vec(&registration("node-b", "b")).unwrap(),
    })
    .await
    .unwrap();
    let mut watch = node
        .watch_allocations(pb::WatchAllocationsRequest {
            node_secret: SECRET.into(),
            node_id: "node-b".into(),
            index: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().unwrap().complete);
    running.stop.cancel();
    // The stream ends (or fails) instead of hanging once the server stops.
    let _ = within(LIMIT, "the watch to end", watch.message()).await;
    within(LIMIT, "the RPC server to stop", running.served)
        .await
        .unwrap()
        .unwrap();
}

// --- connection slots ------------------------------------------------------------

/// Wait until the server closes `conn` (end of stream or reset), failing after LIMIT.
async fn closed_by_server(conn: &mut tokio::net::TcpStream, what: &str) {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 256];
    within(LIMIT, what, async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // Whatever the server says before closing (HTTP/2 settings, a GOAWAY).
                Ok(_) => continue,
            }
        }
    })
    .await;
}

/// A heartbeat that reaches the handler (any answer but a transport or token error).
async fn heartbeat_gets_through(node: &mut NodeClient<Channel>) {
    let r = node
        .heartbeat(with_token(
            pb::HeartbeatRequest {
                node_id: "n1".into(),
                node_secret: SECRET.into(),
            },
            "t",
        ))
        .await;
    if let Err(e) = r {
        assert!(
            !matches!(
                e.code(),
                Code::Unavailable | Code::Unknown | Code::Unauthenticated
            ),
            "{e:?}"
        );
    }
}

/// A channel to `addr` (TLS with `tls`) that counts the TCP connections it opens.
async fn counting_channel(
    addr: std::net::SocketAddr,
    tls: Option<ClientTlsConfig>,
) -> (Channel, Arc<std::sync::atomic::AtomicUsize>) {
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = opened.clone();
    let connector = tower::service_fn(move |_: http::Uri| {
        let count = count.clone();
        async move {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let io = tokio::net::TcpStream::connect(addr).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(io))
        }
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint =
        Endpoint::from_shared(format!("{scheme}://localhost:{}", addr.port())).unwrap();
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    let channel = endpoint.connect_with_connector(connector).await.unwrap();
    (channel, opened)
}

/// Silent and half-preface connections close at the deadline; the client whose call
/// passed the token check keeps its one connection past it (with TLS too, where the
/// connection info reaches the token check wrapped in the TLS layer's).
async fn first_call_deadline_case(tls: bool) {
    use tokio::io::AsyncWriteExt as _;
    const DEADLINE: Duration = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let pki = TestCa::new();
    let (cert, key) = pki.leaf("localhost");
    let files = tls.then(|| TlsFiles {
        cert: write(dir.path(), "server.pem", &cert),
        key: write(dir.path(), "server-key.pem", &key),
        client_ca: None,
    });
    let running = start(
        RpcOptions {
            token: Some("t".into()),
            tls: files,
            first_call_deadline: DEADLINE,
            ..RpcOptions::default()
        },
        None,
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    // Ten of the preface's 24 bytes (with TLS: the start of no valid handshake).
    half.write_all(b"PRI * HTTP").await.unwrap();
    let client_tls = tls.then(|| {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&pki.ca_pem))
            .domain_name("localhost")
    });
    let (channel, opened) = counting_channel(running.addr, client_tls).await;
    let mut node = NodeClient::new(channel);
    heartbeat_gets_through(&mut node).await;

    closed_by_server(&mut silent, "a silent connection to be closed").await;
    closed_by_server(&mut half, "a half-preface connection to be closed").await;
    // The client connected after those two: past its own deadline too, for certain.
    tokio::time::sleep(DEADLINE).await;
    heartbeat_gets_through(&mut node).await;
    assert_eq!(
        opened.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the client's connection was closed at the deadline though its call passed"
    );
    running.stop().await;
}

#[tokio::test]
async fn silent_and_half_preface_connections_are_closed_at_the_first_call_deadline() {
    first_call_deadline_case(false).await;
}

#[tokio::test]
async fn with_tls_a_stalled_handshake_is_closed_at_the_first_call_deadline() {
    first_call_deadline_case(true).await;
}

#[tokio::test]
async fn connections_over_the_per_address_cap_are_closed_while_others_work() {
    let running = start(
        RpcOptions {
            token: Some("t".into()),
            max_connections_per_ip: 2,
            ..RpcOptions::default()
        },
        None,
    )
    .await;
    // Holds one of 127.0.0.1's two slots (the default deadline outlasts the test).
    let silent = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    let mut node = NodeClient::new(running.channel().await);
    heartbeat_gets_through(&mut node).await;

    let mut extra = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    closed_by_server(&mut extra, "the connection over the cap to be closed").await;
    heartbeat_gets_through(&mut node).await;
    drop(silent);
    running.stop().await;
}
