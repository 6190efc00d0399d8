//! The client loop against a Node service on 127.0.0.1 that records what it is sent
//! and answers as the contract says: registration, heartbeats, NOT_FOUND → register
//! again, the watch resuming at the last index after a reconnect, coalesced reports,
//! statuses sent again after a reconnect, failover to the next server.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::{
    AllocClientUpdate, AllocResources, Allocation, ClientAllocation, ClientStatus, DesiredStatus,
    DriverInfo, JobType, NodeRegistration, TaskGroup,
};
use drover_test_support::pki::TestCa;
use pb::node_server::{Node, NodeServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::*;
use crate::config::AgentConfig;

const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
enum Event {
    Register(Box<NodeRegistration>),
    Heartbeat,
    Watch(u64),
    Update(Vec<AllocClientUpdate>),
}

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
    token_seen: Mutex<Vec<Option<String>>>,
    /// The open watch stream's sender (one at a time).
    watch: Mutex<Option<mpsc::Sender<Result<pb::AllocationsUpdate, Status>>>>,
    /// Answer the next heartbeat with NOT_FOUND.
    forget_node: AtomicBool,
    /// Answer heartbeats with UNAVAILABLE.
    fail_heartbeats: AtomicBool,
}

impl Recorder {
    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
    fn push(&self, e: Event) {
        self.events.lock().unwrap().push(e);
    }
    fn see<T>(&self, r: &Request<T>) {
        let token = r
            .metadata()
            .get("x-drover-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.token_seen.lock().unwrap().push(token);
    }
}

#[derive(Clone)]
struct Fake(Arc<Recorder>);

const TTL_MS: u64 = 400;

#[tonic::async_trait]
impl Node for Fake {
    async fn register(
        &self,
        r: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        self.0.see(&r);
        let reg: NodeRegistration = serde_json::from_slice(&r.get_ref().node_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.0.push(Event::Register(Box::new(reg)));
        Ok(Response::new(pb::RegisterResponse {
            heartbeat_ttl_ms: TTL_MS,
            index: 1,
        }))
    }
    async fn heartbeat(
        &self,
        r: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.0.see(&r);
        self.0.push(Event::Heartbeat);
        if self.0.fail_heartbeats.load(Ordering::SeqCst) {
            return Err(Status::unavailable("heartbeats are down"));
        }
        if self.0.forget_node.swap(false, Ordering::SeqCst) {
            return Err(Status::not_found("no such node"));
        }
        Ok(Response::new(pb::HeartbeatResponse {
            heartbeat_ttl_ms: TTL_MS,
            index: 1,
        }))
    }
    type WatchAllocationsStream = ReceiverStream<Result<pb::AllocationsUpdate, Status>>;
    async fn watch_allocations(
        &self,
        r: Request<pb::WatchAllocationsRequest>,
    ) -> Result<Response<Self::WatchAllocationsStream>, Status> {
        self.0.see(&r);
        self.0.push(Event::Watch(r.get_ref().index));
        let (tx, rx) = mpsc::channel(4);
        *self.0.watch.lock().unwrap() = Some(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
    async fn update_allocations(
        &self,
        r: Request<pb::UpdateAllocationsRequest>,
    ) -> Result<Response<pb::UpdateAllocationsResponse>, Status> {
        self.0.see(&r);
        let updates = r
            .get_ref()
            .updates_json
            .iter()
            .map(|j| serde_json::from_slice(j).unwrap())
            .collect();
        self.0.push(Event::Update(updates));
        Ok(Response::new(pb::UpdateAllocationsResponse { index: 2 }))
    }
}

async fn fake_server() -> (Arc<Recorder>, String, CancellationToken) {
    fake_server_with(None).await
}

async fn fake_server_with(
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> (Arc<Recorder>, String, CancellationToken) {
    let rec = Arc::new(Recorder::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let svc = NodeServer::new(Fake(rec.clone()));
    let s = stop.clone();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).unwrap();
    }
    tokio::spawn(async move {
        builder
            .add_service(svc)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                s.cancelled(),
            )
            .await
            .unwrap();
    });
    (rec, addr, stop)
}

#[derive(Default)]
struct Sink {
    applied: Mutex<Vec<(Vec<String>, bool)>>,
    statuses: Vec<AllocClientUpdate>,
}

impl AllocSink for Sink {
    fn apply(&self, allocs: Vec<ClientAllocation>, complete: bool) -> BoxFuture<'_> {
        let ids = allocs.into_iter().map(|a| a.alloc.id).collect();
        self.applied.lock().unwrap().push((ids, complete));
        Box::pin(async {})
    }
    fn statuses(&self) -> Vec<AllocClientUpdate> {
        self.statuses.clone()
    }
}

fn report(id: &str, status: ClientStatus) -> AllocClientUpdate {
    AllocClientUpdate {
        healthy: Default::default(),
        id: id.into(),
        client_status: status,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        services: None,
    }
}

fn allocation(id: &str) -> ClientAllocation {
    ClientAllocation {
        update: Default::default(),
        alloc: Allocation {
            task_devices: Default::default(),
            namespace: "default".into(),
            deployment_id: Default::default(),
            deployment_status: Default::default(),
            ports: Default::default(),
            reschedule_events: Vec::new(),
            id: id.into(),
            name: "web.app[0]".into(),
            index: 0,
            job_name: "web".into(),
            job_version: 0,
            group: "app".into(),
            node_id: "n".into(),
            node_name: "n".into(),
            resources: AllocResources::default(),
            desired_status: DesiredStatus::Run,
            desired_description: String::new(),
            client_status: ClientStatus::Pending,
            client_description: String::new(),
            task_states: BTreeMap::new(),
            eval_id: "e".into(),
            previous_allocation: None,
            next_allocation: None,
            create_index: 3,
            modify_index: 3,
            alloc_modify_index: 3,
            create_time: 0,
            modify_time: 0,
        },
        job_type: JobType::Service,
        group: TaskGroup {
            volumes: Default::default(),
            update: Default::default(),
            network: Default::default(),
            services: Default::default(),
            reschedule: None,
            name: "app".into(),
            count: 1,
            constraints: vec![],
            meta: BTreeMap::new(),
            tasks: vec![],
        },
        job_meta: BTreeMap::new(),
        region: drover_server_api::DEFAULT_REGION.to_owned(),
        identities: BTreeMap::new(),
        csi_volumes: BTreeMap::new(),
    }
}

fn prepared(servers: Vec<String>, data_dir: &std::path::Path, token: Option<&str>) -> Prepared {
    let mut config = AgentConfig {
        servers,
        data_dir: Some(data_dir.to_owned()),
        node_name: Some("node-one".into()),
        datacenter: "eu-west".into(),
        meta: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
        ..Default::default()
    };
    if let Some(t) = token {
        use std::os::unix::fs::PermissionsExt as _;
        let path = data_dir.join("token");
        std::fs::write(&path, t).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        config.token_file = Some(path);
    }
    prepare(&config).unwrap()
}

fn drivers_fn(healthy: Arc<AtomicBool>) -> Drivers {
    Box::new(move || {
        BTreeMap::from([(
            "rawexec".to_owned(),
            DriverInfo {
                detected: true,
                healthy: healthy.load(Ordering::SeqCst),
                ..Default::default()
            },
        )])
    })
}

async fn until_event(rec: &Recorder, what: &str, f: impl Fn(&[Event]) -> bool) {
    drover_test_support::until(LIMIT, what, || f(&rec.events())).await;
}

fn count(events: &[Event], f: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| f(e)).count()
}

#[tokio::test]
async fn a_session_registers_heartbeats_watches_and_reports() {
    let (rec, addr, server_stop) = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let node = prepared(vec![addr], dir.path(), Some("t0ken"));
    let node_id = node.node_id().to_owned();
    let sink = Arc::new(Sink {
        statuses: vec![report("restored", ClientStatus::Running)],
        ..Default::default()
    });
    let (tx, rx) = mpsc::unbounded_channel();
    // Reports made before any server answered: only the newest per allocation goes.
    tx.send(report("x", ClientStatus::Pending)).unwrap();
    tx.send(report("x", ClientStatus::Running)).unwrap();
    let healthy = Arc::new(AtomicBool::new(true));
    let stop = CancellationToken::new();
    let client = Client::new(
        node,
        drivers_fn(healthy.clone()),
        sink.clone(),
        rx,
        stop.clone(),
    );
    let task = tokio::spawn(client.run());

    until_event(&rec, "a registration", |e| {
        count(e, |e| matches!(e, Event::Register(_))) == 1
    })
    .await;
    let Some(Event::Register(reg)) = rec.events().into_iter().next() else {
        panic!("the first call was not a registration: {:?}", rec.events());
    };
    assert_eq!(reg.id, node_id);
    assert_eq!(reg.name, "node-one");
    assert_eq!(
        reg.datacenter, "eu-west",
        "the agent's datacenter is registered"
    );
    assert_eq!(reg.meta["rack"], "r1");
    assert!(reg.drivers["rawexec"].healthy);
    assert!(reg.resources.cpu > 0 && reg.resources.memory_mb > 0);
    assert!(reg.attributes.contains_key("cpu.numcores"));

    until_event(&rec, "the first report batch", |e| {
        count(e, |e| matches!(e, Event::Update(_))) >= 1
    })
    .await;
    let updates: Vec<AllocClientUpdate> = rec
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Update(u) => Some(u),
            _ => None,
        })
        .flatten()
        .collect();
    let x: Vec<_> = updates.iter().filter(|u| u.id == "x").collect();
    assert_eq!(x.len(), 1, "coalesced: {updates:?}");
    assert_eq!(x[0].client_status, ClientStatus::Running);
    assert!(
        updates.iter().any(|u| u.id == "restored"),
        "statuses sent after registering"
    );

    until_event(&rec, "two heartbeats", |e| {
        count(e, |e| matches!(e, Event::Heartbeat)) >= 2
    })
    .await;
    assert!(
        rec.token_seen
            .lock()
            .unwrap()
            .iter()
            .all(|t| t.as_deref() == Some("t0ken")),
        "every call carries the token"
    );

    // The watch starts at 0; a batch goes to the allocation manager.
    until_event(&rec, "a watch", |e| {
        count(e, |e| matches!(e, Event::Watch(0))) == 1
    })
    .await;
    let watch = rec.watch.lock().unwrap().clone().unwrap();
    watch
        .send(Ok(pb::AllocationsUpdate {
            index: 7,
            complete: true,
            allocations_json: vec![
                serde_json::to_vec(&allocation("a1")).unwrap(),
                b"{\"broken\": true}".to_vec(),
            ],
        }))
        .await
        .unwrap();
    drover_test_support::until(LIMIT, "the batch applied", || {
        !sink.applied.lock().unwrap().is_empty()
    })
    .await;
    // A complete set with an entry that does not decode is applied as changes, so
    // that nothing is stopped for a decoding problem.
    assert_eq!(
        sink.applied.lock().unwrap()[0],
        (vec!["a1".to_owned()], false)
    );
    watch
        .send(Ok(pb::AllocationsUpdate {
            index: 9,
            complete: false,
            allocations_json: vec![serde_json::to_vec(&allocation("a2")).unwrap()],
        }))
        .await
        .unwrap();
    drover_test_support::until(LIMIT, "the second batch", || {
        sink.applied.lock().unwrap().len() == 2
    })
    .await;

    // A report while connected goes out within a flush.
    tx.send(report("a2", ClientStatus::Running)).unwrap();
    until_event(&rec, "the a2 report", |e| {
        e.iter()
            .any(|e| matches!(e, Event::Update(u) if u.iter().any(|u| u.id == "a2")))
    })
    .await;

    // The stream breaks: the client reconnects, registers again, resumes the watch
    // at the last index it applied, and sends every status again.
    let before = rec.events().len();
    watch
        .send(Err(Status::unavailable("going away")))
        .await
        .unwrap();
    drop(watch);
    until_event(&rec, "the watch to resume at 9", |e| {
        count(e, |e| matches!(e, Event::Watch(9))) == 1
    })
    .await;
    until_event(&rec, "statuses sent again", |e| {
        e[before..]
            .iter()
            .any(|e| matches!(e, Event::Update(u) if u.iter().any(|u| u.id == "restored")))
    })
    .await;
    assert_eq!(count(&rec.events(), |e| matches!(e, Event::Register(_))), 2);

    // NOT_FOUND on a heartbeat: register again, on the same session.
    rec.forget_node.store(true, Ordering::SeqCst);
    until_event(&rec, "a third registration", |e| {
        count(e, |e| matches!(e, Event::Register(_))) == 3
    })
    .await;
    // A driver's health changes: register again with it.
    healthy.store(false, Ordering::SeqCst);
    until_event(&rec, "a registration with rawexec unhealthy", |e| {
        e.iter()
            .any(|e| matches!(e, Event::Register(r) if !r.drivers["rawexec"].healthy))
    })
    .await;
    assert_eq!(
        count(&rec.events(), |e| matches!(e, Event::Watch(_))),
        2,
        "same session"
    );

    stop.cancel();
    drover_test_support::within(LIMIT, "the client to stop", task)
        .await
        .unwrap();
    server_stop.cancel();
}

#[tokio::test]
async fn with_a_dead_server_first_the_client_fails_over_and_keeps_reports() {
    // A port nothing listens on (bound, then closed).
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (rec, addr, server_stop) = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let node = prepared(vec![dead, addr], dir.path(), None);
    let sink = Arc::new(Sink::default());
    let (tx, rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let client = Client::new(
        node,
        drivers_fn(Arc::new(AtomicBool::new(true))),
        sink,
        rx,
        stop.clone(),
    );
    for i in 0..3 {
        tx.send(report(
            "q",
            [
                ClientStatus::Pending,
                ClientStatus::Running,
                ClientStatus::Complete,
            ][i],
        ))
        .unwrap();
    }
    let task = tokio::spawn(client.run());
    until_event(&rec, "the report on the second server", |e| {
        e.iter()
            .any(|e| matches!(e, Event::Update(u) if u.iter().any(|u| u.id == "q")))
    })
    .await;
    let qs: Vec<ClientStatus> = rec
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Update(u) => Some(u),
            _ => None,
        })
        .flatten()
        .filter(|u| u.id == "q")
        .map(|u| u.client_status)
        .collect();
    assert_eq!(
        qs,
        vec![ClientStatus::Complete],
        "only the newest report is sent"
    );
    assert!(
        rec.token_seen.lock().unwrap().iter().all(Option::is_none),
        "no token configured, none sent"
    );
    stop.cancel();
    drover_test_support::within(LIMIT, "the client to stop", task)
        .await
        .unwrap();
    server_stop.cancel();
}

#[tokio::test]
async fn tls_towards_the_servers_with_a_client_certificate() {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let servers = TestCa::new();
    let clients = TestCa::new();
    // The server's certificate names "cluster.test", not 127.0.0.1: the client checks
    // it against tls.server_name.
    let (cert, key) = servers.leaf("cluster.test");
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(&clients.ca_pem));
    let (rec, addr, server_stop) = fake_server_with(Some(tls)).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let (ccert, ckey) = clients.leaf("node-1");
    let config = |ca: &str, server_name: &str| AgentConfig {
        servers: vec![addr.clone()],
        data_dir: Some(dir.path().to_owned()),
        tls: Some(crate::config::ClientTls {
            ca_file: write("ca.pem", ca),
            cert_file: Some(write("client.pem", &ccert)),
            key_file: Some(write("client-key.pem", &ckey)),
            server_name: Some(server_name.into()),
        }),
        ..Default::default()
    };

    let start = |config: AgentConfig| {
        let stop = CancellationToken::new();
        let (_tx, rx) = mpsc::unbounded_channel();
        let client = Client::new(
            prepare(&config).unwrap(),
            drivers_fn(Arc::new(AtomicBool::new(true))),
            Arc::new(Sink::default()),
            rx,
            stop.clone(),
        );
        (tokio::spawn(client.run()), stop)
    };
    let (task, stop) = start(config(&servers.ca_pem, "cluster.test"));
    until_event(&rec, "a registration over TLS", |e| {
        count(e, |e| matches!(e, Event::Register(_))) == 1
    })
    .await;
    stop.cancel();
    drover_test_support::within(LIMIT, "the client to stop", task)
        .await
        .unwrap();

    // The server requires a client certificate from the client CA, so the
    // registration above also proves the client presented tls.cert_file.
    // Trusting another CA, or expecting another name: nothing gets through. (A client
    // that got through would register within milliseconds of its first attempt; the
    // window covers several reconnect attempts.)
    for (ca_pem, name) in [
        (TestCa::new().ca_pem, "cluster.test"),
        (servers.ca_pem.clone(), "other.test"),
    ] {
        let (task, stop) = start(config(&ca_pem, name));
        let refused = tokio::time::timeout(Duration::from_secs(2), async {
            drover_test_support::until(LIMIT, "a second registration", || {
                count(&rec.events(), |e| matches!(e, Event::Register(_))) > 1
            })
            .await
        })
        .await
        .is_err();
        stop.cancel();
        drover_test_support::within(LIMIT, "the client to stop", task)
            .await
            .unwrap();
        assert!(
            refused,
            "a client expecting {name} behind another CA registered"
        );
    }
    server_stop.cancel();
}

/// An allocation sink whose `apply` waits until released, and records what finished.
#[derive(Default)]
struct SlowSink {
    started: Mutex<Vec<Vec<String>>>,
    finished: Mutex<Vec<Vec<String>>>,
    release: tokio::sync::Notify,
}

impl AllocSink for SlowSink {
    fn apply(&self, allocs: Vec<ClientAllocation>, _complete: bool) -> BoxFuture<'_> {
        let ids: Vec<String> = allocs.into_iter().map(|a| a.alloc.id).collect();
        Box::pin(async move {
            self.started.lock().unwrap().push(ids.clone());
            self.release.notified().await;
            self.finished.lock().unwrap().push(ids);
        })
    }
    fn statuses(&self) -> Vec<AllocClientUpdate> {
        Vec::new()
    }
}

#[tokio::test]
async fn a_failed_session_does_not_cut_an_apply_short_and_resumes_before_it() {
    let (rec, addr, server_stop) = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(SlowSink::default());
    let (_tx, rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let client = Client::new(
        prepared(vec![addr], dir.path(), None),
        drivers_fn(Arc::new(AtomicBool::new(true))),
        sink.clone(),
        rx,
        stop.clone(),
    );
    let task = tokio::spawn(client.run());
    until_event(&rec, "a watch", |e| {
        count(e, |e| matches!(e, Event::Watch(0))) == 1
    })
    .await;
    let watch = rec.watch.lock().unwrap().clone().unwrap();
    watch
        .send(Ok(pb::AllocationsUpdate {
            index: 4,
            complete: true,
            allocations_json: vec![serde_json::to_vec(&allocation("a1")).unwrap()],
        }))
        .await
        .unwrap();
    drover_test_support::until(LIMIT, "the apply to start", || {
        !sink.started.lock().unwrap().is_empty()
    })
    .await;
    // Heartbeats fail while the apply runs: the session ends and a new one begins,
    // resuming the watch before the batch that was not applied yet.
    rec.fail_heartbeats.store(true, Ordering::SeqCst);
    until_event(&rec, "a second registration", |e| {
        count(e, |e| matches!(e, Event::Register(_))) >= 2
    })
    .await;
    rec.fail_heartbeats.store(false, Ordering::SeqCst);
    until_event(&rec, "the new session's watch from 0", |e| {
        count(e, |e| matches!(e, Event::Watch(0))) >= 2
    })
    .await;
    assert!(sink.finished.lock().unwrap().is_empty());
    sink.release.notify_one();
    drover_test_support::until(LIMIT, "the first apply to finish", || {
        sink.finished.lock().unwrap().first() == Some(&vec!["a1".to_owned()])
    })
    .await;
    stop.cancel();
    drover_test_support::within(LIMIT, "the client to stop", task)
        .await
        .unwrap();
    server_stop.cancel();
}

#[test]
fn the_resume_index_follows_complete_sets_and_never_goes_back_on_changes() {
    assert_eq!(next_index(0, 7, true), 7);
    assert_eq!(next_index(7, 9, false), 9);
    assert_eq!(next_index(9, 8, false), 9);
    assert_eq!(next_index(9, 2, true), 2, "a replaced store starts over");
}

#[test]
fn re_registrations_for_changes_are_at_least_a_second_apart() {
    let last = tokio::time::Instant::now();
    let soon = last + Duration::from_millis(200);
    assert_eq!(
        super::reregister_at(last, soon),
        last + super::MIN_REREGISTER_INTERVAL
    );
    let later = last + Duration::from_secs(5);
    assert_eq!(super::reregister_at(last, later), later);
}
