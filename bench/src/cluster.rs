//! `drover-bench cluster`: from submitting jobs to every allocation reported running
//! by simulated clients over gRPC.
//!
//! An in-process server (real redb store in a temp dir, real scheduler, real plan
//! applier) serves the node RPCs on 127.0.0.1. `--clients` simulated clients, each
//! with its own gRPC connection, register, heartbeat, watch their allocations and
//! acknowledge each one as `running` with `UpdateAllocations`, as a real client does
//! once its tasks started. The clock runs from the first job submitted until the
//! server reports every allocation running.
//!
//! Baseline, in the same run: the time to *place* the same allocations (server side
//! only: from submit until every allocation is committed), so the ratio shows what
//! the round trip to the clients costs on top of scheduling.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_proto::drover::cluster::v1 as pb;
use drover_server::{Server, ServerConfig};
use drover_server_api::{
    AllocClientUpdate, ClientAllocation, ClientStatus, DesiredStatus, DriverInfo, JobSpec, JobType,
    NodeRegistration, NodeResources, Task, TaskGroup, TaskResources, TaskRunState, TaskState,
    UpdateStrategy,
};
use tokio_util::sync::CancellationToken;

/// Run the benchmark and print its numbers.
pub async fn run(clients: usize, allocs: usize, jobs: usize) -> anyhow::Result<()> {
    if clients == 0 || allocs == 0 || jobs == 0 {
        bail!("--clients, --allocs and --jobs must be at least 1");
    }
    println!("drover-bench cluster: {clients} clients, {allocs} allocations in {jobs} jobs");

    // Baseline: placement only, no clients acknowledging.
    let placed = {
        let (server, _dir, stop) = start_server(None).await?;
        register_nodes_direct(&server, clients).await?;
        let t = Instant::now();
        submit(&server, allocs, jobs).await?;
        wait_until(&server, allocs, |a| !a.node_id.is_empty()).await?;
        let e = t.elapsed();
        stop.cancel();
        e
    };

    // The real thing: clients over gRPC.
    let tmp = tempfile::tempdir()?;
    let (server, _dir, stop) = start_server(Some(tmp.path())).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let rpc = tokio::spawn(drover_server::rpc::serve(
        server.clone(),
        listener,
        drover_server::rpc::RpcOptions::default(),
        None,
        stop.clone(),
    ));
    let t_connect = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for i in 0..clients {
        let endpoint = format!("http://{addr}");
        let stop = stop.clone();
        handles.push(tokio::spawn(async move {
            let result = simulated_client(i, endpoint, stop.clone()).await;
            // Calls cut short by the end of the run are not failures.
            if let Err(e) = result
                && !stop.is_cancelled()
            {
                eprintln!("client {i}: {e:#}");
            }
        }));
    }
    wait_nodes(&server, clients).await?;
    let connected = t_connect.elapsed();
    let t = Instant::now();
    submit(&server, allocs, jobs).await?;
    wait_until(&server, allocs, |a| {
        a.client_status == ClientStatus::Running
    })
    .await?;
    let running = t.elapsed();
    stop.cancel();
    for h in handles {
        let _ = h.await;
    }
    let _ = rpc.await;

    println!(
        "  {clients} clients registered over gRPC in {:.2}s",
        connected.as_secs_f64()
    );
    println!(
        "  baseline: {allocs} allocations placed (committed, no clients) in {:.2}s = {:.0}/s",
        placed.as_secs_f64(),
        allocs as f64 / placed.as_secs_f64()
    );
    println!(
        "  submit -> every allocation reported running by its client: {:.2}s = {:.0}/s \
         ({:.2}x the placement-only time; goal < 10 s)",
        running.as_secs_f64(),
        allocs as f64 / running.as_secs_f64(),
        running.as_secs_f64() / placed.as_secs_f64()
    );
    Ok(())
}

async fn start_server(
    dir: Option<&std::path::Path>,
) -> anyhow::Result<(Arc<Server>, Option<tempfile::TempDir>, CancellationToken)> {
    let (path, keep) = match dir {
        Some(d) => (d.join("server"), None),
        None => {
            let t = tempfile::tempdir()?;
            (t.path().join("server"), Some(t))
        }
    };
    std::fs::create_dir_all(&path)?;
    let store = drover_server::store::redb::RedbStore::open(&path)
        .with_context(|| format!("open the store in {}", path.display()))?;
    let mut config = ServerConfig::new(&path);
    // Simulated clients heartbeat; a long TTL keeps a loaded machine from marking
    // them down mid-run.
    config.heartbeat_ttl = Duration::from_secs(60);
    config.heartbeat_grace = Duration::from_secs(60);
    let stop = CancellationToken::new();
    let server = Server::start(config, Arc::new(store), stop.clone()).await?;
    Ok((server, keep, stop))
}

fn registration(i: usize) -> NodeRegistration {
    let mut drivers = BTreeMap::new();
    drivers.insert(
        "raw_exec".to_owned(),
        DriverInfo {
            detected: true,
            healthy: true,
            ..Default::default()
        },
    );
    let mut attributes = BTreeMap::new();
    attributes.insert("os.name".into(), "linux".into());
    attributes.insert("cpu.numcores".into(), "8".into());
    NodeRegistration {
        devices: Default::default(),
        host_volumes: Default::default(),
        csi_plugins: Default::default(),
        network: Default::default(),
        datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
        id: format!("00000000-0000-4000-8000-{i:012}"),
        name: format!("sim-{i}"),
        attributes,
        meta: BTreeMap::new(),
        resources: NodeResources {
            cpu: 8 * 2_000,
            memory_mb: 32 * 1024,
        },
        drivers,
    }
}

/// The secret every simulated node presents (each has its own id, so one secret
/// for all is enough).
const BENCH_NODE_SECRET: &str = "bench-simulated-node-secret";

async fn register_nodes_direct(server: &Server, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        server
            .register_node(registration(i), BENCH_NODE_SECRET)
            .await?;
    }
    Ok(())
}

async fn wait_nodes(server: &Server, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = server
            .nodes()
            .iter()
            .filter(|n| n.status == drover_server_api::NodeStatus::Ready)
            .count();
        if ready >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {ready} of {n} simulated clients registered within 120s");
        }
        let index = server.index();
        server
            .wait_for_index(index, Duration::from_millis(200))
            .await;
    }
}

async fn submit(server: &Server, allocs: usize, jobs: usize) -> anyhow::Result<()> {
    let per_job = allocs / jobs;
    let mut extra = allocs % jobs;
    for j in 0..jobs {
        let count = per_job + usize::from(extra > 0);
        extra = extra.saturating_sub(1);
        let spec = JobSpec {
            namespace: "default".into(),
            datacenters: Vec::new(),
            name: format!("bench-{j}"),
            job_type: JobType::Service,
            priority: 50,
            constraints: vec![],
            update: UpdateStrategy::default(),
            meta: BTreeMap::new(),
            groups: vec![TaskGroup {
                volumes: Default::default(),
                update: Default::default(),
                network: Default::default(),
                services: Default::default(),
                reschedule: None,
                name: "g".into(),
                count: u32::try_from(count)?,
                constraints: vec![],
                meta: BTreeMap::new(),
                tasks: vec![Task {
                    devices: Default::default(),
                    volume_mounts: Default::default(),
                    services: Default::default(),
                    meta: Default::default(),
                    name: "t".into(),
                    driver: "raw_exec".into(),
                    config: serde_json::json!({"command": "/bin/true"}),
                    env: BTreeMap::new(),
                    kill_signal: None,
                    kill_timeout: None,
                    restart: None,
                    resources: TaskResources {
                        cpu: 10,
                        memory_mb: 10,
                        memory_max_mb: 0,
                    },
                    logs: None,
                    lifecycle: None,
                    artifacts: Vec::new(),
                    templates: Vec::new(),
                    identity: None,
                }],
            }],
        };
        server.register_job(spec).await?;
    }
    Ok(())
}

async fn wait_until(
    server: &Server,
    want: usize,
    done: impl Fn(&drover_server_api::Allocation) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let have = server
            .allocations()
            .iter()
            .filter(|a| a.desired_status == DesiredStatus::Run && done(a))
            .count();
        if have >= want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {have} of {want} allocations got there within 600s");
        }
        let index = server.index();
        server
            .wait_for_index(index, Duration::from_millis(500))
            .await;
    }
}

/// One simulated client: register, heartbeat, watch, acknowledge every allocation it
/// is given as running.
async fn simulated_client(
    i: usize,
    endpoint: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    // As a real client: a failed session (a connection reset while 1000 clients
    // connect at once, say) is started again after a short backoff; what was
    // acknowledged stays acknowledged.
    let mut acked: HashSet<String> = HashSet::new();
    let mut backoff = Duration::from_millis(100);
    let mut failures = 0;
    loop {
        let session = stop.child_token();
        let result = client_session(i, &endpoint, &session, &mut acked).await;
        session.cancel();
        match result {
            Ok(()) => return Ok(()),
            Err(_) if stop.is_cancelled() => return Ok(()),
            Err(e) => {
                failures += 1;
                if failures >= 20 {
                    return Err(e.context(format!("{failures} sessions failed")));
                }
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn client_session(
    i: usize,
    endpoint: &str,
    stop: &CancellationToken,
    acked: &mut HashSet<String>,
) -> anyhow::Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())?
        .connect()
        .await?;
    let mut node = pb::node_client::NodeClient::new(channel);
    let reg = registration(i);
    let node_id = reg.id.clone();
    let reply = node
        .register(pb::RegisterRequest {
            node_secret: BENCH_NODE_SECRET.into(),
            node_json: serde_json::to_vec(&reg)?,
        })
        .await?
        .into_inner();
    let ttl = Duration::from_millis(reply.heartbeat_ttl_ms.max(1000));
    let mut hb = node.clone();
    let hb_id = node_id.clone();
    let hb_stop = stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = hb_stop.cancelled() => return,
                () = tokio::time::sleep(ttl / 2) => {}
            }
            let _ = hb
                .heartbeat(pb::HeartbeatRequest {
                    node_secret: BENCH_NODE_SECRET.into(),
                    node_id: hb_id.clone(),
                })
                .await;
        }
    });
    let mut stream = node
        .watch_allocations(pb::WatchAllocationsRequest {
            node_secret: BENCH_NODE_SECRET.into(),
            node_id: node_id.clone(),
            index: 0,
        })
        .await?
        .into_inner();
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            m = stream.message() => m?,
        };
        let Some(msg) = msg else {
            anyhow::bail!("the allocation stream ended")
        };
        let mut updates = Vec::new();
        for raw in &msg.allocations_json {
            let ca: ClientAllocation = serde_json::from_slice(raw)?;
            if ca.alloc.desired_status != DesiredStatus::Run || !acked.insert(ca.alloc.id.clone()) {
                continue;
            }
            let states = ca
                .group
                .tasks
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        TaskState {
                            state: TaskRunState::Running,
                            starts: 1,
                            ..Default::default()
                        },
                    )
                })
                .collect();
            let update = AllocClientUpdate {
                healthy: Default::default(),
                id: ca.alloc.id.clone(),
                client_status: ClientStatus::Running,
                client_description: String::new(),
                task_states: states,
                services: None,
            };
            updates.push(serde_json::to_vec(&update)?);
        }
        if !updates.is_empty() {
            node.update_allocations(pb::UpdateAllocationsRequest {
                node_secret: BENCH_NODE_SECRET.into(),
                node_id: node_id.clone(),
                updates_json: updates,
            })
            .await?;
        }
    }
}
