//! ACLs on one server over a real listener: the bootstrap, policies and tokens kept in
//! the store (a restarted server still knows them, and the bootstrap stays done), and
//! the checks of the routes.

use std::sync::Arc;

use drover_server::store::Store;
use drover_server::store::redb::RedbStore;
use drover_server::{Server, ServerConfig};
use drover_server_api::client::{Client, ClientOptions};
use drover_server_api::nomad::{AclPolicy, AclToken};
use hyper::{Method, StatusCode};
use tokio_util::sync::CancellationToken;

struct Running {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<Result<(), drover_server::ServerError>>,
    server: Arc<Server>,
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

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.served.await;
        self.server.stopped().await;
    }
}

async fn start(dir: &std::path::Path) -> Running {
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir).unwrap());
    let mut config = ServerConfig::new(dir);
    config.workers = 0;
    config.acl_enabled = true;
    let server = Server::start(config, store, stop.clone()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The cluster token is set, as on a real server: with ACLs it is no user
    // credential.
    let router = drover_server::http::router(server.clone(), Some("cluster-secret".into()));
    let served = tokio::spawn(drover_server::http::serve(
        router,
        listener,
        None,
        stop.clone(),
    ));
    Running {
        addr,
        stop,
        served,
        server,
    }
}

#[tokio::test]
async fn acl_objects_live_in_the_store_and_the_bootstrap_stays_done() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let anon = s.client(None);
    let r = anon.raw(Method::GET, "/v1/jobs", None).await.unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(String::from_utf8_lossy(&r.body), "Permission denied");
    let r = s
        .client(Some("cluster-secret"))
        .raw(Method::GET, "/v1/jobs", None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(String::from_utf8_lossy(&r.body), "ACL token not found");

    let boot = anon.acl_bootstrap().await.unwrap();
    assert_eq!(boot.token_type, "management");
    let mgmt = s.client(Some(&boot.secret_id));
    mgmt.put_acl_policy(&AclPolicy {
        name: "reader".into(),
        rules: r#"namespace "default" { policy = "read" }"#.into(),
        ..AclPolicy::default()
    })
    .await
    .unwrap();
    let reader = mgmt
        .create_acl_token(&AclToken {
            name: "r".into(),
            token_type: "client".into(),
            policies: vec!["reader".into()],
            ..AclToken::default()
        })
        .await
        .unwrap();
    // Served back without its secret, even to management: only its hash is kept.
    let shown = mgmt.acl_token(&reader.accessor_id).await.unwrap().value;
    assert_eq!(shown.secret_id, "");
    // A client token needs policies that exist.
    let e = mgmt
        .create_acl_token(&AclToken {
            token_type: "client".into(),
            policies: vec!["nope".into()],
            ..AclToken::default()
        })
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains(r#"ACL policy "nope" does not exist"#),
        "{e}"
    );
    s.stop().await;

    // Restarted on the same store: everything is still there.
    let s = start(dir.path()).await;
    let reader_client = s.client(Some(&reader.secret_id));
    let me = reader_client.acl_token_self().await.unwrap().value;
    assert_eq!(me.name, "r");
    let r = reader_client
        .raw(Method::GET, "/v1/jobs", None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let r = reader_client
        .raw(Method::PUT, "/v1/jobs", Some(b"{}".to_vec()))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let e = s.client(None).acl_bootstrap().await.unwrap_err();
    assert!(e.to_string().contains("ACL bootstrap already done"), "{e}");
    assert_eq!(e.status(), Some(StatusCode::BAD_REQUEST));
    // Policies: management sees all, a client token its own.
    let mgmt = s.client(Some(&boot.secret_id));
    assert_eq!(mgmt.acl_policies().await.unwrap().value.len(), 1);
    assert_eq!(reader_client.acl_policies().await.unwrap().value.len(), 1);
    mgmt.delete_acl_token(&reader.accessor_id).await.unwrap();
    let r = reader_client
        .raw(Method::GET, "/v1/jobs", None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    s.stop().await;
}

#[tokio::test]
async fn with_acls_off_the_acl_endpoints_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path()).unwrap());
    let mut config = ServerConfig::new(dir.path());
    config.workers = 0;
    let server = Server::start(config, store, stop.clone()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(drover_server::http::serve(
        drover_server::http::router(server.clone(), None),
        listener,
        None,
        stop.clone(),
    ));
    let c = Client::new(&format!("http://{addr}"), ClientOptions::default()).unwrap();
    let e = c.acl_bootstrap().await.unwrap_err();
    assert!(e.to_string().contains("ACL support disabled"), "{e}");
    let r = c.raw(Method::GET, "/v1/jobs", None).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    stop.cancel();
    let _ = served.await;
}

/// A job mounting a host volume needs the volume's `host_volume` rule (Nomad's): a
/// submitter without one is refused, naming the volume; `read` allows a read-only
/// request only; management mounts anything. Reverting to a version with a volume is
/// checked the same way.
#[tokio::test]
async fn a_host_volume_is_mounted_only_as_the_tokens_host_volume_rules_allow() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let boot = s.client(None).acl_bootstrap().await.unwrap();
    let mgmt = s.client(Some(&boot.secret_id));
    mgmt.put_acl_policy(&AclPolicy {
        name: "team".into(),
        rules: r#"namespace "default" { policy = "write" }
host_volume "shared" { policy = "read" }"#
            .into(),
        ..AclPolicy::default()
    })
    .await
    .unwrap();
    let team = mgmt
        .create_acl_token(&AclToken {
            name: "t".into(),
            token_type: "client".into(),
            policies: vec!["team".into()],
            ..AclToken::default()
        })
        .await
        .unwrap();
    let team = s.client(Some(&team.secret_id));
    let job = |source: &str, read_only: bool| {
        serde_json::to_vec(&serde_json::json!({"Job": {
            "ID": "v", "Datacenters": ["dc1"],
            "TaskGroups": [{
                "Name": "g",
                "Volumes": {"data": {"Type": "host", "Source": source, "ReadOnly": read_only}},
                "Tasks": [{"Name": "t", "Driver": "exec",
                    "Config": {"command": "/bin/true"},
                    "VolumeMounts": [{"Volume": "data", "Destination": "/data", "ReadOnly": read_only}]}]
            }]
        }}))
        .unwrap()
    };
    for (source, read_only, want) in [
        ("secrets", true, StatusCode::FORBIDDEN),
        ("shared", false, StatusCode::FORBIDDEN),
        ("shared", true, StatusCode::OK),
    ] {
        let r = team
            .raw(Method::PUT, "/v1/jobs", Some(job(source, read_only)))
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status, want, "{source} read_only={read_only}: {body}");
        if want == StatusCode::FORBIDDEN {
            assert!(body.contains(&format!("host volume {source:?}")), "{body}");
        }
    }
    // Management registers a version the team may not mount; the team cannot go
    // back to it once another version is current.
    let r = mgmt
        .raw(Method::PUT, "/v1/jobs", Some(job("secrets", false)))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let r = mgmt
        .raw(Method::PUT, "/v1/jobs", Some(job("shared", true)))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let r = team
        .raw(
            Method::PUT,
            "/v1/job/v/revert",
            Some(br#"{"JobID": "v", "JobVersion": 1}"#.to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    s.stop().await;
}

/// The web UI's page and assets hold no data: anyone gets them, with ACLs on, while
/// the API they call stays behind the token.
#[tokio::test]
async fn the_web_ui_is_public_and_the_api_it_calls_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let anon = s.client(None);
    let page = anon.raw(Method::GET, "/ui/jobs", None).await.unwrap();
    assert_eq!(page.status, StatusCode::OK);
    let html = String::from_utf8_lossy(&page.body).into_owned();
    let script = html
        .split('"')
        .find(|p| p.starts_with("/ui/assets/") && p.ends_with("/app.js"))
        .unwrap_or_else(|| panic!("no app.js in the page: {html}"));
    let app = anon.raw(Method::GET, script, None).await.unwrap();
    assert_eq!(app.status, StatusCode::OK);
    let root = anon.raw(Method::GET, "/", None).await.unwrap();
    assert_eq!(root.status, StatusCode::TEMPORARY_REDIRECT);
    for path in ["/v1/jobs", "/v1/nodes", "/v1/event/stream"] {
        let r = anon.raw(Method::GET, path, None).await.unwrap();
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
    }
    s.stop().await;
}
