//! Several servers on one real etcd: one leads, the others follow its commits, serve
//! reads from them and forward writes to it; leadership moves when the leader goes
//! or loses its lease, without losing or duplicating placements.
//!
//! Each test runs its servers in-process, each with its own `EtcdStore` (its own
//! connection and lease) on one prefix of its own, serving the HTTP API and the node
//! RPCs on 127.0.0.1 as `drover server` does. Without an etcd binary the tests skip
//! loudly (and fail under `CI=true`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{SECRET, job, node};
use drover_proto::drover::cluster::v1 as pb;
use drover_server::forward::{FORWARDED_HEADER, NOT_LEADER_HEADER};
use drover_server::http::router;
use drover_server::leader::Term;
use drover_server::rpc::RpcOptions;
use drover_server::store::{BoxFuture, EtcdOptions, EtcdStore, StoreError};
use drover_server::{Election, Server, ServerConfig, ServerInfo};
use drover_server_api::client::{Client, ClientOptions, QueryOptions};
use drover_server_api::{ClientStatus, EvalStatus, NodeStatus, RPC_TOKEN_KEY};
use drover_test_support::etcd::{SharedEtcd, shared};
use drover_test_support::pki::TestCa;
use drover_test_support::{until, within};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "ha-test-token-0123456789";
/// The leader's lease: a leader that stops renewing leads this long at most.
const LEASE: Duration = Duration::from_secs(3);

struct Member {
    name: String,
    server: Arc<Server>,
    stop: CancellationToken,
    http: SocketAddr,
    rpc: SocketAddr,
    served: Vec<tokio::task::JoinHandle<Result<(), drover_server::ServerError>>>,
    _dir: tempfile::TempDir,
}

impl Member {
    async fn start(etcd: &SharedEtcd, prefix: &str, name: &str) -> Member {
        Member::start_with(&etcd.endpoint(), prefix, name, false, None).await
    }

    /// `deaf`: the server never hears from the election that its term ended (as a
    /// leader paused past its lease and resumed believes it still leads); only the
    /// store's fence can stop it.
    /// `tls`: both listeners speak TLS with this certificate, and require client
    /// certificates from its CA (the forwarding server presents its own).
    async fn start_with(
        endpoint: &str,
        prefix: &str,
        name: &str,
        deaf: bool,
        tls: Option<&Tls>,
    ) -> Member {
        Member::start_wrapped(endpoint, prefix, name, tls, |e, _| {
            if deaf { Arc::new(Deaf(e)) } else { e }
        })
        .await
    }

    /// `wrap`: the election this server uses, given the store's and its RPC address.
    async fn start_wrapped(
        endpoint: &str,
        prefix: &str,
        name: &str,
        tls: Option<&Tls>,
        wrap: impl FnOnce(Arc<dyn Election>, SocketAddr) -> Arc<dyn Election>,
    ) -> Member {
        Member::start_full(endpoint, prefix, name, tls, false, wrap).await
    }

    /// A server with ACLs enforced on its HTTP API.
    async fn start_acl(etcd: &SharedEtcd, prefix: &str, name: &str) -> Member {
        Member::start_full(&etcd.endpoint(), prefix, name, None, true, |e, _| e).await
    }

    async fn start_full(
        endpoint: &str,
        prefix: &str,
        name: &str,
        tls: Option<&Tls>,
        acl_enabled: bool,
        wrap: impl FnOnce(Arc<dyn Election>, SocketAddr) -> Arc<dyn Election>,
    ) -> Member {
        let dir = tempfile::tempdir().unwrap();
        let mut o = EtcdOptions::new(vec![endpoint.to_owned()]);
        o.prefix = prefix.to_owned();
        o.lease_ttl = LEASE;
        o.request_timeout = Duration::from_secs(3);
        let store = EtcdStore::connect(o)
            .await
            .expect("connect to the test etcd");
        let http_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let rpc_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (http, rpc) = (http_l.local_addr().unwrap(), rpc_l.local_addr().unwrap());
        let election = wrap(store.election(), rpc);
        let mut config = ServerConfig::new(dir.path());
        config.workers = 1;
        config.heartbeat_ttl = Duration::from_secs(1);
        config.heartbeat_grace = Duration::from_secs(2);
        // A new leader gives known nodes this long before it can mark them down.
        config.failover_heartbeat_ttl = Duration::from_secs(5);
        config.forward.token = Some(TOKEN.into());
        config.acl_enabled = acl_enabled;
        let files = tls.map(|t| drover_server::tls::TlsFiles {
            cert: t.cert.clone(),
            key: t.key.clone(),
            client_ca: Some(t.ca.clone()),
        });
        config.forward.tls = tls.map(|t| drover_server::config::ForwardTls {
            ca_file: t.ca.clone(),
            identity: Some((t.cert.clone(), t.key.clone())),
        });
        let me = ServerInfo {
            name: name.to_owned(),
            rpc_addr: rpc.to_string(),
            http_addr: http.to_string(),
            tls: tls.is_some(),
            version: "test".into(),
            started: ServerInfo::now(),
        };
        let stop = CancellationToken::new();
        let server = Server::start_with(config, Arc::new(store), election, me, stop.clone())
            .await
            .expect("start the server");
        let served = vec![
            tokio::spawn(drover_server::http::serve(
                router(server.clone(), Some(TOKEN.into())),
                http_l,
                files.clone(),
                stop.clone(),
            )),
            tokio::spawn(drover_server::rpc::serve(
                server.clone(),
                rpc_l,
                RpcOptions {
                    token: Some(TOKEN.into()),
                    tls: files,
                    ..Default::default()
                },
                Some(router(server.clone(), None)),
                stop.clone(),
            )),
        ];
        Member {
            name: name.to_owned(),
            server,
            stop,
            http,
            rpc,
            served,
            _dir: dir,
        }
    }

    fn api(&self) -> Client {
        Client::new(
            &format!("http://{}", self.http),
            ClientOptions {
                token: Some(TOKEN.into()),
                ..Default::default()
            },
        )
        .unwrap()
    }

    async fn node_client(&self) -> pb::node_client::NodeClient<tonic::transport::Channel> {
        pb::node_client::NodeClient::connect(format!("http://{}", self.rpc))
            .await
            .expect("connect to the node RPCs")
    }

    async fn shutdown(self) {
        self.stop.cancel();
        within(
            Duration::from_secs(15),
            "the server stops",
            self.server.stopped(),
        )
        .await;
        for t in self.served {
            let _ = t.await;
        }
    }
}

/// A CA and one certificate (127.0.0.1, localhost) the servers share, in files.
struct Tls {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn tls_files() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf_for(&["127.0.0.1", "localhost"]);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Tls {
        ca: write("ca.pem", &ca.ca_pem),
        cert: write("cert.pem", &cert),
        key: write("key.pem", &key),
        _dir: dir,
    }
}

/// The etcd election, except that the terms it returns never fire `lost`.
struct Deaf(Arc<dyn Election>);

impl Election for Deaf {
    fn campaign(&self, me: ServerInfo) -> BoxFuture<'_, Result<Term, StoreError>> {
        Box::pin(async move {
            let t = self.0.campaign(me).await?;
            Ok(Term {
                fence: t.fence.clone(),
                lost: CancellationToken::new(),
                id: t.id,
            })
        })
    }
    fn leader(&self) -> BoxFuture<'_, Result<Option<ServerInfo>, StoreError>> {
        self.0.leader()
    }
    fn register(&self, me: ServerInfo) -> BoxFuture<'_, Result<(), StoreError>> {
        self.0.register(me)
    }
    fn members(&self) -> BoxFuture<'_, Result<Vec<ServerInfo>, StoreError>> {
        self.0.members()
    }
    fn lease_ttl(&self) -> Duration {
        self.0.lease_ttl()
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.0.close()
    }
}

/// The etcd election, except that the leader it names announces `.1` (this server's
/// own RPC address) as its RPC address: a stale or forged entry in the store.
struct Misdirected(Arc<dyn Election>, String);

impl Election for Misdirected {
    fn campaign(&self, me: ServerInfo) -> BoxFuture<'_, Result<Term, StoreError>> {
        self.0.campaign(me)
    }
    fn leader(&self) -> BoxFuture<'_, Result<Option<ServerInfo>, StoreError>> {
        Box::pin(async move {
            Ok(self.0.leader().await?.map(|mut l| {
                l.rpc_addr = self.1.clone();
                l
            }))
        })
    }
    fn register(&self, me: ServerInfo) -> BoxFuture<'_, Result<(), StoreError>> {
        self.0.register(me)
    }
    fn members(&self) -> BoxFuture<'_, Result<Vec<ServerInfo>, StoreError>> {
        self.0.members()
    }
    fn lease_ttl(&self) -> Duration {
        self.0.lease_ttl()
    }
    fn resign(&self) -> BoxFuture<'_, ()> {
        self.0.resign()
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.0.close()
    }
}

/// The etcd election, except that it never wins a campaign, and counts the calls
/// asking the store who leads or who the servers are.
struct Counted(Arc<dyn Election>, Arc<std::sync::atomic::AtomicUsize>);

impl Election for Counted {
    fn campaign(&self, _me: ServerInfo) -> BoxFuture<'_, Result<Term, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn leader(&self) -> BoxFuture<'_, Result<Option<ServerInfo>, StoreError>> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.leader()
    }
    fn register(&self, me: ServerInfo) -> BoxFuture<'_, Result<(), StoreError>> {
        self.0.register(me)
    }
    fn members(&self) -> BoxFuture<'_, Result<Vec<ServerInfo>, StoreError>> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.members()
    }
    fn lease_ttl(&self) -> Duration {
        self.0.lease_ttl()
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.0.close()
    }
}

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert(RPC_TOKEN_KEY, TOKEN.parse().unwrap());
    r
}

fn leaders(members: &[Member]) -> Vec<&Member> {
    members.iter().filter(|m| m.server.is_leader()).collect()
}

/// Node n1's client: a heartbeat every 300 ms to `target` (ends after 50 failures).
fn heartbeat_loop(target: SocketAddr) -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async move {
        let mut nc = pb::node_client::NodeClient::connect(format!("http://{target}"))
            .await
            .unwrap();
        let mut failures = 0u32;
        loop {
            let r = nc
                .heartbeat(authed(pb::HeartbeatRequest {
                    node_id: "n1".into(),
                    node_secret: SECRET.into(),
                }))
                .await;
            if r.is_err() {
                failures += 1;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            if failures > 50 {
                return failures;
            }
        }
    })
}

/// Exactly one of `members` leads (waited for, then checked to hold for a while).
async fn one_leader(members: &[Member], limit: Duration) -> String {
    until(limit, "exactly one server leads", || {
        leaders(members).len() == 1
    })
    .await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(leaders(members).len(), 1, "two servers lead at once");
    }
    leaders(members)[0].name.clone()
}

fn by_name<'a>(members: &'a [Member], name: &str) -> &'a Member {
    members.iter().find(|m| m.name == name).unwrap()
}

fn alloc_ids(server: &Server, job: &str) -> Vec<String> {
    let mut ids: Vec<String> = server
        .job_allocations("default", job)
        .into_iter()
        .map(|a| a.id)
        .collect();
    ids.sort();
    ids
}

/// Wait for `eval` to be complete on `server`.
async fn eval_complete(server: &Server, eval: &str) {
    until(Duration::from_secs(15), "the evaluation completes", || {
        server
            .evaluation(eval)
            .is_some_and(|e| e.status == EvalStatus::Complete)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_servers_one_leader_followers_forward_and_a_failover_keeps_every_placement() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let mut members = Vec::new();
    for name in ["s1", "s2", "s3"] {
        members.push(Member::start(&etcd, &prefix, name).await);
    }
    let leader = one_leader(&members, LEASE + Duration::from_secs(5)).await;
    // While its lease is renewed, a leader keeps its term: no flapping.
    let term = by_name(&members, &leader).server.leading();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(
        by_name(&members, &leader).server.leading(),
        term,
        "the leader lost its term though nothing happened to it"
    );
    let followers: Vec<&Member> = members.iter().filter(|m| m.name != leader).collect();
    let (f1, f2) = (followers[0], followers[1]);

    // A node registers and heartbeats through a follower: forwarded to the leader.
    let node_json = serde_json::to_vec(&node("n1", 4000, 4000)).unwrap();
    let mut nc = f1.node_client().await;
    nc.register(authed(pb::RegisterRequest {
        node_json: node_json.clone(),
        node_secret: SECRET.into(),
    }))
    .await
    .expect("register through a follower");
    // Read your writes: the follower answered once its own state had the node.
    assert!(
        f1.server.node("n1").is_ok(),
        "the follower knows the node it registered"
    );
    let heartbeats = heartbeat_loop(f1.rpc);
    let l = by_name(&members, &leader);
    until(
        Duration::from_secs(10),
        "the node reaches the leader",
        || {
            l.server
                .node("n1")
                .is_ok_and(|n| n.status == NodeStatus::Ready)
        },
    )
    .await;

    // A blocking query on a follower wakes when the job registered elsewhere commits.
    let at = f2.api().jobs(&QueryOptions::default()).await.unwrap().index;
    let blocked = {
        let api = f2.api();
        tokio::spawn(async move {
            api.jobs(&QueryOptions::blocking(at, Duration::from_secs(30)))
                .await
        })
    };

    // A job registered through a follower's HTTP API is placed once.
    let registered = f1
        .api()
        .register_job(&job("web", 2, 100, 100))
        .await
        .unwrap();
    f1.api()
        .evaluation(&registered.eval_id, &QueryOptions::default())
        .await
        .expect("the follower that forwarded the write reads it back at once");
    let woke = within(
        Duration::from_secs(10),
        "the follower's blocking query",
        blocked,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(woke.index > at);
    assert!(
        woke.value.iter().any(|j| j.name == "web"),
        "the follower's answer has the job: {:?}",
        woke.value
    );
    eval_complete(&l.server, &registered.eval_id).await;
    assert_eq!(alloc_ids(&l.server, "web").len(), 2);
    let placed = alloc_ids(&l.server, "web");
    until(
        Duration::from_secs(10),
        "the followers see the placements",
        || {
            followers
                .iter()
                .all(|f| alloc_ids(&f.server, "web") == placed)
        },
    )
    .await;
    // A node's allocation watch on a follower: the complete set, from its state.
    let mut watch = f2
        .node_client()
        .await
        .watch_allocations(authed(pb::WatchAllocationsRequest {
            node_id: "n1".into(),
            index: 0,
            node_secret: SECRET.into(),
        }))
        .await
        .expect("watch on a follower")
        .into_inner();
    let first = within(Duration::from_secs(5), "the complete set", watch.message())
        .await
        .unwrap()
        .unwrap();
    assert!(first.complete);
    assert_eq!(first.allocations_json.len(), 2);
    drop(watch);
    // Reads on a follower: the same state as the leader's.
    let on_follower = f2
        .api()
        .job_allocations("web", &QueryOptions::default())
        .await
        .unwrap();
    assert_eq!(on_follower.value.len(), 2);

    // Submitting the unchanged job again (a retried forward) places nothing more.
    let again = f2
        .api()
        .register_job(&job("web", 2, 100, 100))
        .await
        .unwrap();
    eval_complete(&l.server, &again.eval_id).await;
    assert_eq!(alloc_ids(&l.server, "web"), placed, "no second placement");

    // No second hop: a write another server forwarded to a follower is refused (503,
    // marked so that the forwarding server looks for the leader again), and so is a
    // forwarded node call.
    let mut api_rpc = pb::api_client::ApiClient::connect(format!("http://{}", f2.rpc))
        .await
        .unwrap();
    let body = serde_json::to_vec(&drover_server_api::JobRegisterRequest {
        job: job("hop", 1, 100, 100),
    })
    .unwrap();
    // Exactly what a follower sends: the mark in the call's metadata, not among the
    // forwarded HTTP headers.
    let mut hop_write = authed(pb::ForwardRequest {
        method: "PUT".into(),
        path_and_query: "/v1/jobs".into(),
        headers: [("content-type".to_owned(), "application/json".to_owned())].into(),
        body,
    });
    hop_write
        .metadata_mut()
        .insert(FORWARDED_HEADER, "elsewhere".parse().unwrap());
    let mut head = api_rpc.forward(hop_write).await.unwrap().into_inner();
    let head = head.message().await.unwrap().unwrap();
    assert_eq!(head.status, 503);
    assert!(head.headers.contains_key(NOT_LEADER_HEADER), "{head:?}");
    let mut hop = authed(pb::HeartbeatRequest {
        node_id: "n1".into(),
        node_secret: SECRET.into(),
    });
    hop.metadata_mut()
        .insert(FORWARDED_HEADER, "elsewhere".parse().unwrap());
    let err = f2.node_client().await.heartbeat(hop).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        l.server.job("default", "hop").is_none(),
        "the refused write was not made"
    );

    // Server status from a follower.
    let status = f2.api().servers_status().await.unwrap().value;
    assert_eq!(status.this, f2.name);
    let sl = status.leader.expect("a leader");
    assert_eq!(sl.name, leader);
    assert!(sl.term > 0, "the leader's term: {sl:?}");
    assert_eq!(status.servers.len(), 3, "{:?}", status.servers);
    assert_eq!(
        status
            .servers
            .iter()
            .filter(|s| s.leader)
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        [leader.as_str()]
    );
    assert_eq!(status.store.kind, "etcd");
    assert!(
        !status.store.endpoints.is_empty() && status.store.endpoints.iter().all(|e| e.healthy),
        "{:?}",
        status.store.endpoints
    );

    // The leader shuts down: another leads within the lease TTL plus 2 s.
    let gone = members.iter().position(|m| m.name == leader).unwrap();
    let old = members.remove(gone);
    let t0 = Instant::now();
    old.shutdown().await;
    let new_leader = one_leader(&members, LEASE + Duration::from_secs(2)).await;
    eprintln!(
        "leader {leader} shut down: {new_leader} leads {:?} later",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() <= LEASE + Duration::from_secs(3),
        "{:?}",
        t0.elapsed()
    );
    let nl = by_name(&members, &new_leader);
    assert_eq!(alloc_ids(&nl.server, "web"), placed, "placements unchanged");
    assert!(
        nl.server
            .job_allocations("default", "web")
            .iter()
            .all(|a| a.client_status != ClientStatus::Lost),
        "nothing lost"
    );

    // A job submitted to whichever server follows now is placed once.
    let follower = members.iter().find(|m| m.name != new_leader).unwrap();
    let r = follower
        .api()
        .register_job(&job("api", 1, 100, 100))
        .await
        .unwrap();
    eval_complete(&nl.server, &r.eval_id).await;
    assert_eq!(alloc_ids(&nl.server, "api").len(), 1);
    assert_eq!(alloc_ids(&nl.server, "web"), placed);

    // Past the new leader's failover window, the node heartbeating through a follower
    // (or the new leader itself) is still ready: its heartbeats reach the new leader.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let n = nl.server.node("n1").unwrap();
    assert_eq!(n.status, NodeStatus::Ready, "{n:?}");
    assert!(!heartbeats.is_finished(), "heartbeats kept failing");
    heartbeats.abort();

    for m in members {
        m.shutdown().await;
    }
}

/// The leader's lease, revoked with etcd's own API (as if it had expired while the
/// leader was paused).
async fn revoke_leader_lease(endpoint: &str, prefix: &str) {
    use drover_proto::etcd::etcdserverpb::LeaseRevokeRequest;
    use drover_proto::etcd::etcdserverpb::lease_client::LeaseClient;
    use drover_proto::etcd::v3electionpb::LeaderRequest;
    use drover_proto::etcd::v3electionpb::election_client::ElectionClient;
    let mut election = ElectionClient::connect(endpoint.to_owned()).await.unwrap();
    let kv = election
        .leader(LeaderRequest {
            name: format!("{prefix}election").into_bytes(),
        })
        .await
        .expect("etcd says who leads")
        .into_inner()
        .kv
        .expect("a leader key");
    assert_ne!(kv.lease, 0, "the leader key is bound to a lease");
    LeaseClient::connect(endpoint.to_owned())
        .await
        .unwrap()
        .lease_revoke(LeaseRevokeRequest { id: kv.lease })
        .await
        .expect("revoke the leader's lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_lease_is_revoked_behind_its_back_has_its_next_commit_refused_and_steps_down()
 {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    // "old" leads and never hears from the election that its term ended.
    let old = Member::start_with(&etcd.endpoint(), &prefix, "old", true, None).await;
    until(
        LEASE + Duration::from_secs(5),
        "the first server leads",
        || old.server.is_leader(),
    )
    .await;
    let other = Member::start(&etcd, &prefix, "other").await;
    old.server
        .register_node(node("n1", 4000, 4000), SECRET)
        .await
        .expect("the leader commits");
    until(Duration::from_secs(10), "the follower follows", || {
        other.server.node("n1").is_ok()
    })
    .await;

    revoke_leader_lease(&etcd.endpoint(), &prefix).await;
    until(
        LEASE + Duration::from_secs(2),
        "the other server leads",
        || other.server.is_leader(),
    )
    .await;
    assert!(
        old.server.is_leader(),
        "the deaf server still believes it leads"
    );
    // Its next commit is refused by the store's fence, says so, and commits nothing.
    let err = old
        .server
        .register_job(job("stale", 1, 100, 100))
        .await
        .expect_err("a leader without its lease cannot commit");
    assert!(
        matches!(err, drover_server::ServerError::LeadershipLost(_)),
        "{err}"
    );
    assert!(err.to_string().contains("leadership lost"), "{err}");
    until(Duration::from_secs(5), "the old leader steps down", || {
        !old.server.is_leader()
    })
    .await;
    let members = [old, other];
    assert_eq!(one_leader(&members, Duration::from_secs(5)).await, "other");
    let [old, other] = members;
    assert!(
        other.server.job("default", "stale").is_none(),
        "the refused job was not committed"
    );
    assert!(
        old.server.job("default", "stale").is_none(),
        "nor applied by the old leader"
    );
    assert_eq!(
        other.server.node("n1").map(|n| n.status).ok(),
        Some(NodeStatus::Ready),
        "what the old leader committed in its term stays"
    );

    // Through either server, writes reach the new leader.
    for m in [&old, &other] {
        let name = format!("after-{}", m.name);
        let r = m
            .api()
            .register_job(&job(&name, 1, 100, 100))
            .await
            .unwrap();
        eval_complete(&other.server, &r.eval_id).await;
        assert!(other.server.job("default", &name).is_some());
        until(Duration::from_secs(10), "the old leader follows", || {
            old.server.job("default", &name).is_some()
        })
        .await;
    }
    old.shutdown().await;
    other.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_tls_a_follower_forwards_writes_to_the_leader_with_its_own_certificate() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let tls = tls_files();
    let mut members = Vec::new();
    for name in ["t1", "t2"] {
        members.push(Member::start_with(&etcd.endpoint(), &prefix, name, false, Some(&tls)).await);
    }
    let leader = one_leader(&members, LEASE + Duration::from_secs(5)).await;
    let l = by_name(&members, &leader);
    let follower = members.iter().find(|m| m.name != leader).unwrap();
    let api = Client::new(
        &format!("https://{}", follower.http),
        ClientOptions {
            namespace: Default::default(),
            token: Some(TOKEN.into()),
            ca_file: Some(tls.ca.clone()),
            client_cert: Some((tls.cert.clone(), tls.key.clone())),
        },
    )
    .unwrap();
    let r = api
        .register_job(&job("secure", 1, 100, 100))
        .await
        .expect("a write through the follower, over TLS");
    until(Duration::from_secs(10), "the leader has the job", || {
        l.server.job("default", "secure").is_some()
    })
    .await;
    eval_complete(&l.server, &r.eval_id).await;
    for m in members {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_etcd_reads_answer_from_the_last_state_writes_fail_clearly_and_it_carries_on_after()
{
    let Some(mut etcd) = drover_test_support::etcd::Etcd::start() else {
        return;
    };
    let prefix = drover_test_support::etcd::unique_prefix();
    let s = Member::start_with(&etcd.endpoint(), &prefix, "alone", false, None).await;
    until(LEASE + Duration::from_secs(5), "the server leads", || {
        s.server.is_leader()
    })
    .await;
    let api = s.api();
    let first = api.register_job(&job("before", 1, 100, 100)).await.unwrap();
    let node_json = serde_json::to_vec(&node("n1", 4000, 4000)).unwrap();
    s.node_client()
        .await
        .register(authed(pb::RegisterRequest {
            node_json,
            node_secret: SECRET.into(),
        }))
        .await
        .unwrap();
    let heartbeats = heartbeat_loop(s.rpc);
    let retried = api.register_job(&job("before", 1, 100, 100)).await.unwrap();
    eval_complete(&s.server, &retried.eval_id).await;
    let placed = alloc_ids(&s.server, "before");
    assert_eq!(placed.len(), 1);
    assert!(s.server.evaluation(&first.eval_id).is_some());

    etcd.kill9();
    // Its lease cannot be renewed: it stops leading within the TTL (its own clock).
    until(
        LEASE + Duration::from_secs(2),
        "the server steps down",
        || !s.server.is_leader(),
    )
    .await;
    // Reads: the last known state.
    let jobs = api
        .jobs(&QueryOptions::default())
        .await
        .expect("a read without etcd");
    assert!(jobs.value.iter().any(|j| j.name == "before"));
    // Writes: a clear refusal, within the election deadline (lease TTL + 5 s).
    let t0 = Instant::now();
    let err = api
        .register_job(&job("during", 1, 100, 100))
        .await
        .expect_err("no write without etcd");
    assert!(
        t0.elapsed() <= LEASE + Duration::from_secs(7),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503), "{err}");
    assert!(
        err.to_string()
            .contains("no leader elected yet; the store says:"),
        "{err}"
    );

    etcd.start_again();
    until(
        LEASE + Duration::from_secs(10),
        "the server leads again",
        || s.server.is_leader(),
    )
    .await;
    let after = api.register_job(&job("after", 1, 100, 100)).await.unwrap();
    eval_complete(&s.server, &after.eval_id).await;
    assert_eq!(alloc_ids(&s.server, "after").len(), 1);
    assert_eq!(alloc_ids(&s.server, "before"), placed, "nothing replaced");
    // Past the new term's failover window the node, heartbeating again, is ready and
    // its allocation was never lost.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(s.server.node("n1").unwrap().status, NodeStatus::Ready);
    assert!(
        s.server
            .job_allocations("default", "before")
            .iter()
            .all(|a| a.client_status != ClientStatus::Lost),
        "nothing lost"
    );
    heartbeats.abort();
    assert!(s.server.job("default", "during").is_none());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_split_into_parts_reaches_a_follower_whole() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let mut members = Vec::new();
    for name in ["p1", "p2"] {
        members.push(Member::start(&etcd, &prefix, name).await);
    }
    let leader = one_leader(&members, LEASE + Duration::from_secs(5)).await;
    let l = by_name(&members, &leader);
    let f = members.iter().find(|m| m.name != leader).unwrap();
    l.server
        .register_node(node("n1", 100_000, 100_000), SECRET)
        .await
        .unwrap();
    let heartbeats = heartbeat_loop(l.rpc);
    // What the follower shows, as often as it can look, while the plan commits.
    let seen = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let watcher = {
        let (server, seen, stop) = (f.server.clone(), seen.clone(), f.stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let n = server.job_allocations("default", "big").len();
                seen.lock().unwrap().insert(n);
                if n == 300 {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    // 300 allocations and the evaluation in one plan: more ops than etcd takes in
    // one transaction (128), so the store writes it in parts.
    let r = l
        .server
        .register_job(job("big", 300, 10, 10))
        .await
        .unwrap();
    eval_complete(&l.server, &r.eval_id).await;
    assert_eq!(alloc_ids(&l.server, "big").len(), 300);
    within(
        Duration::from_secs(10),
        "the follower sees the plan",
        watcher,
    )
    .await
    .unwrap();
    assert_eq!(alloc_ids(&f.server, "big"), alloc_ids(&l.server, "big"));
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|n| *n == 0 || *n == 300),
        "the follower showed part of a commit: {seen:?}"
    );
    heartbeats.abort();
    for m in members {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_elected_server_that_cannot_load_the_state_resigns_and_another_tries() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let mut members = Vec::new();
    for name in ["s1", "s2", "s3"] {
        members.push(Member::start(&etcd, &prefix, name).await);
    }
    let first = one_leader(&members, LEASE + Duration::from_secs(5)).await;

    // A value under the prefix that does not decode, written with the store's own API
    // (as a server of another version, or a hand edit, could leave it).
    let mut o = EtcdOptions::new(vec![etcd.endpoint()]);
    o.prefix = prefix.clone();
    let raw = EtcdStore::connect(o).await.unwrap();
    use drover_server::store::{Op, Store};
    raw.range("").await.unwrap();
    let outcome = raw
        .txn(
            Vec::new(),
            vec![Op::Put {
                key: "job/broken".into(),
                value: b"{ not json".to_vec(),
            }],
        )
        .await
        .unwrap();
    assert!(outcome.succeeded, "{outcome:?}");

    // The leader goes; each of the two left is elected in turn, cannot load the state,
    // and resigns instead of holding the term (and the cluster) for ever.
    let pos = members.iter().position(|m| m.name == first).unwrap();
    members.remove(pos).shutdown().await;
    let election = raw.election();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while seen.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "leadership never moved on from a server that cannot load the state: {seen:?}"
        );
        if let Ok(Some(l)) = election.leader().await {
            seen.insert(l.name);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for m in &members {
        assert_eq!(
            m.server.leading(),
            None,
            "{} leads on a state it cannot read",
            m.name
        );
        // `server status` still answers.
        let status = m.api().servers_status().await.unwrap();
        assert!(!status.value.servers.is_empty(), "{:?}", status.value);
    }
    for m in members {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_told_the_leader_is_at_its_own_address_does_not_forward_to_itself() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let leader = Member::start(&etcd, &prefix, "lead").await;
    until(Duration::from_secs(10), "the first server leads", || {
        leader.server.is_leader()
    })
    .await;
    let follower = Member::start_wrapped(&etcd.endpoint(), &prefix, "misled", None, |e, rpc| {
        Arc::new(Misdirected(e, rpc.to_string()))
    })
    .await;
    // A write to it fails clearly once the election deadline passes, saying why; it
    // never reaches the leader through a loop.
    let started = Instant::now();
    let err = follower
        .api()
        .register_job(&job("looped", 1, 100, 100))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("this server's own RPC address"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(leader.server.job("default", "looped").is_none());
    // Node heartbeats through it are not stuck behind a loop either: it answers.
    let status = follower.api().servers_status().await.unwrap();
    assert_eq!(status.value.this, "misled");
    follower.shutdown().await;
    leader.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_waiting_for_a_leader_share_the_stores_answer_and_status_is_cached() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    // Alone, and never elected: every write waits for a leader until its deadline
    // (lease + 5 s), asking the store who leads meanwhile.
    let s = Member::start_wrapped(&etcd.endpoint(), &prefix, "waits", None, |e, _| {
        Arc::new(Counted(e, c))
    })
    .await;
    let api = s.api();
    let writes: Vec<_> = (0..20)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move { api.register_job(&job(&format!("w{i}"), 1, 100, 100)).await })
        })
        .collect();
    let started = Instant::now();
    for w in writes {
        assert!(w.await.unwrap().is_err(), "no leader: the write fails");
    }
    let secs = started.elapsed().as_secs_f64();
    let n = calls.swap(0, std::sync::atomic::Ordering::Relaxed);
    // One waiter alone polls 4 times a second; 20 of them share: at most ~5/s.
    assert!(
        (n as f64) < secs * 8.0,
        "{n} leader lookups in {secs:.1}s for 20 waiting writes"
    );
    // Ten status calls in a row: the store is asked once (leader, members).
    for _ in 0..10 {
        api.servers_status().await.unwrap();
    }
    let n = calls.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        n <= 4,
        "{n} store calls for 10 status answers within a second"
    );
    s.shutdown().await;
}

/// With ACLs, a write reaching a follower goes to the leader with the caller's own
/// token, and the leader checks it: the follower's cluster token does not stand in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_acls_a_follower_forwards_the_callers_token_and_the_leader_checks_it() {
    let Some(etcd) = shared() else { return };
    let prefix = etcd.unique_prefix();
    let mut members = Vec::new();
    for name in ["a1", "a2"] {
        members.push(Member::start_acl(&etcd, &prefix, name).await);
    }
    let leader = one_leader(&members, LEASE + Duration::from_secs(5)).await;
    let l = by_name(&members, &leader);
    let follower = members.iter().find(|m| m.name != leader).unwrap();
    let at_follower = |token: Option<&str>| {
        Client::new(
            &format!("http://{}", follower.http),
            ClientOptions {
                token: token.map(str::to_owned),
                ..Default::default()
            },
        )
        .unwrap()
    };
    // Anonymous and the cluster token: refused, through the follower too.
    for token in [None, Some(TOKEN)] {
        let e = at_follower(token)
            .register_job(&job("nope", 1, 100, 100))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(hyper::StatusCode::FORBIDDEN), "{e}");
    }
    assert!(l.server.job("default", "nope").is_none());
    // The bootstrap through the follower; its management token writes through it.
    let boot = at_follower(None).acl_bootstrap().await.expect("bootstrap");
    let mgmt = at_follower(Some(&boot.secret_id));
    mgmt.register_job(&job("yes", 1, 100, 100))
        .await
        .expect("a management write through the follower");
    until(Duration::from_secs(10), "the leader has the job", || {
        l.server.job("default", "yes").is_some()
    })
    .await;
    // The follower knows the token too (it follows the leader's commits).
    let me = mgmt.acl_token_self().await.unwrap().value;
    assert_eq!(me.token_type, "management");
    for m in members {
        m.shutdown().await;
    }
}
