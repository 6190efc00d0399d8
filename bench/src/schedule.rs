//! `drover-bench schedule`: placements per second of an in-process server, store
//! commits included.
//!
//! A server on the real redb store in a temp dir, `--nodes` simulated nodes registered
//! through the server's facade (as the node RPC does), then `--jobs` service jobs
//! submitted at once whose counts add up to `--allocs` small allocations. Measured:
//! first submit until every allocation is committed. Baseline, same run, same store:
//! the same number of allocation documents committed straight to a fresh store in
//! transactions of one job's size (the store's own ceiling for this work), and the
//! latency of a one-key commit.
//!
//! Then the same on the etcd store (`--stores both`, the default): a private etcd
//! (`/usr/bin/etcd`, data dir in a temp dir) unless `--etcd-endpoints` names one (the
//! bench then works under a prefix of its own and deletes it afterwards), and the
//! ratio of the two placement rates.
//!
//! `--ports`: the placement rate of jobs whose allocations each ask for two dynamic
//! ports against the same jobs without ports, on the embedded store, in one run:
//! `--rounds` rounds, each placing both ways on a fresh server and store (the order
//! alternates from round to round so that neither always runs on a warmer machine);
//! reported per round, as medians, and their ratio.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use drover_server::store::{Op, Store};
use drover_server::{EtcdOptions, EtcdStore, RedbStore, Server, ServerConfig};
use drover_server_api::{
    AllocResources, Allocation, ClientStatus, DesiredStatus, DriverInfo, JobSpec, JobType,
    NodeRegistration, NodeResources, Task, TaskGroup, TaskResources,
};
use tokio_util::sync::CancellationToken;

pub(crate) struct Options {
    pub nodes: usize,
    pub allocs: usize,
    pub jobs: usize,
    pub workers: Option<usize>,
    pub timeout: Duration,
    pub stores: Stores,
    pub etcd_endpoints: Option<Vec<String>>,
    /// Compare placing with dynamic ports against placing without.
    pub ports: bool,
    /// Rounds of the `--ports` comparison.
    pub rounds: usize,
}

/// Dynamic ports each allocation asks for in the `--ports` runs.
const PORTS_PER_ALLOC: usize = 2;

fn node(i: usize) -> NodeRegistration {
    NodeRegistration {
        devices: Default::default(),
        host_volumes: Default::default(),
        csi_plugins: Default::default(),
        network: Default::default(),
        datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
        id: format!("00000000-0000-4000-8000-{i:012}"),
        name: format!("bench-node-{i}"),
        attributes: BTreeMap::from([
            ("os.name".into(), "linux".into()),
            ("cpu.arch".into(), "x86_64".into()),
            ("cpu.numcores".into(), "8".into()),
        ]),
        meta: BTreeMap::from([("rack".into(), format!("r{}", i % 10))]),
        resources: NodeResources {
            cpu: 8 * 2400,
            memory_mb: 32 * 1024,
        },
        drivers: BTreeMap::from([(
            "raw_exec".into(),
            DriverInfo {
                detected: true,
                healthy: true,
                ..DriverInfo::default()
            },
        )]),
    }
}

fn job(i: usize, count: u32, ports: usize) -> JobSpec {
    let network = (ports > 0).then(|| drover_server_api::NetworkSpec {
        mode: drover_server_api::NetworkMode::Host,
        ports: (0..ports)
            .map(|k| drover_server_api::PortSpec {
                label: format!("p{k}"),
                ..Default::default()
            })
            .collect(),
    });
    JobSpec {
        namespace: "default".into(),
        datacenters: Vec::new(),
        name: format!("bench-{i}"),
        job_type: JobType::Service,
        priority: 50,
        constraints: vec![],
        update: Default::default(),
        meta: BTreeMap::new(),
        groups: vec![TaskGroup {
            volumes: Default::default(),
            update: Default::default(),
            network,
            services: Default::default(),
            reschedule: None,
            name: "app".into(),
            count,
            constraints: vec![],
            meta: BTreeMap::new(),
            tasks: vec![Task {
                devices: Default::default(),
                volume_mounts: Default::default(),
                services: Default::default(),
                meta: Default::default(),
                name: "main".into(),
                driver: "raw_exec".into(),
                config: serde_json::json!({"command": "/bin/sleep", "args": ["3600"]}),
                env: BTreeMap::new(),
                kill_signal: None,
                kill_timeout: None,
                restart: None,
                resources: TaskResources {
                    cpu: 20,
                    memory_mb: 32,
                    memory_max_mb: 0,
                },
                logs: None,
                lifecycle: None,
                artifacts: Vec::new(),
                templates: Vec::new(),
                identity: None,
            }],
        }],
    }
}

/// Which stores `schedule` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Stores {
    /// The embedded store and the etcd store, one after the other.
    Both,
    /// The embedded (redb) store only.
    Embedded,
    /// The etcd store only.
    Etcd,
}

/// One store's run.
struct Placement {
    placed: usize,
    rate: f64,
}

pub(crate) async fn run(o: Options) -> anyhow::Result<()> {
    if o.nodes == 0 || o.jobs == 0 || o.allocs < o.jobs {
        bail!("--nodes and --jobs must be at least 1, --allocs at least --jobs");
    }
    // Jobs: counts adding up to --allocs.
    let base = o.allocs / o.jobs;
    let counts: Vec<u32> = (0..o.jobs)
        .map(|i| (base + usize::from(i < o.allocs % o.jobs)) as u32)
        .collect();
    let doc = serde_json::to_vec(&sample_alloc())?;
    if o.ports {
        return compare_ports(&o, &counts).await;
    }

    let mut embedded = None;
    if o.stores != Stores::Etcd {
        let dir = tempfile::tempdir()?;
        let data_dir = dir.path().join("server");
        let store = RedbStore::open(&data_dir).context("open the store")?;
        embedded = Some(
            place(
                &o,
                &counts,
                &data_dir,
                Arc::new(store),
                "embedded (redb) store",
                0,
            )
            .await?,
        );
        let bdir = tempfile::tempdir()?;
        let store = RedbStore::open(bdir.path())?;
        baseline(&store, &counts, &doc).await?;
    }
    if o.stores == Stores::Embedded {
        return Ok(());
    }

    // etcd: the endpoints given, or a private etcd in a temp dir.
    let mut own = None;
    let endpoints = match &o.etcd_endpoints {
        Some(e) => e.clone(),
        None => match drover_test_support::etcd::Etcd::start() {
            Some(e) => {
                let ep = vec![e.endpoint()];
                println!(
                    "etcd: a private {} (pid {}) at {}, data dir in a temp dir",
                    drover_test_support::etcd::etcd_bin()
                        .map(|b| b.display().to_string())
                        .unwrap_or_default(),
                    e.pid().unwrap_or(0),
                    ep[0]
                );
                own = Some(e);
                ep
            }
            None => bail!(
                "no etcd binary for the etcd store's run (install etcd-server or give --etcd-endpoints)"
            ),
        },
    };
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let prefix = format!("/drover-bench-{run_id}/");
    let mut options = EtcdOptions::new(endpoints.clone());
    options.prefix = prefix.clone();
    let store = EtcdStore::connect(options.clone())
        .await
        .with_context(|| format!("connect to etcd at {endpoints:?}"))?;
    let dir = tempfile::tempdir()?;
    let etcd = place(
        &o,
        &counts,
        &dir.path().join("server"),
        Arc::new(store),
        "etcd store",
        0,
    )
    .await;
    let bprefix = format!("/drover-bench-{run_id}-baseline/");
    let base_result = async {
        let mut options = options.clone();
        options.prefix = bprefix.clone();
        let store = EtcdStore::connect(options).await?;
        baseline(&store, &counts, &doc).await
    }
    .await;
    if own.is_none() {
        // Someone else's etcd: leave nothing behind.
        for p in [&prefix, &bprefix] {
            if let Err(e) = delete_prefix(&endpoints[0], p).await {
                println!("  WARNING: could not delete the bench's keys under {p}: {e:#}");
            }
        }
    }
    drop(own);
    let etcd = etcd?;
    base_result?;
    if let Some(e) = embedded
        && e.placed > 0
        && etcd.placed > 0
    {
        println!(
            "etcd store / embedded store: {:.0} / {:.0} placements/s = {:.2}",
            etcd.rate,
            e.rate,
            etcd.rate / e.rate
        );
    }
    Ok(())
}

/// `--ports`: rounds of placing without ports and with [`PORTS_PER_ALLOC`] dynamic
/// ports per allocation, alternating which goes first, each on a fresh embedded store.
async fn compare_ports(o: &Options, counts: &[u32]) -> anyhow::Result<()> {
    let rounds = o.rounds.max(1);
    let mut without = Vec::with_capacity(rounds);
    let mut with = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 {
            [0, PORTS_PER_ALLOC]
        } else {
            [PORTS_PER_ALLOC, 0]
        };
        for ports in order {
            let dir = tempfile::tempdir()?;
            let data_dir = dir.path().join("server");
            let store = RedbStore::open(&data_dir).context("open the store")?;
            let what = if ports == 0 {
                format!("round {}, no ports", round + 1)
            } else {
                format!("round {}, {ports} dynamic ports per allocation", round + 1)
            };
            let p = place(o, counts, &data_dir, Arc::new(store), &what, ports).await?;
            if p.placed < o.allocs {
                bail!("{what}: only {} of {} placed", p.placed, o.allocs);
            }
            if ports == 0 {
                without.push(p.rate);
            } else {
                with.push(p.rate);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, wo) = (median(&mut with), median(&mut without));
    println!(
        "ports: {rounds} rounds, {} nodes, {} allocations each way; placements/s without \
         ports {:?}, with {PORTS_PER_ALLOC} dynamic ports {:?}",
        o.nodes,
        o.allocs,
        without.iter().map(|r| r.round()).collect::<Vec<_>>(),
        with.iter().map(|r| r.round()).collect::<Vec<_>>()
    );
    println!(
        "ports: median with / without = {w:.0} / {wo:.0} placements/s = {:.0} % (goal: at \
         least 70 %)",
        100.0 * w / wo
    );
    Ok(())
}

/// Delete every key under `prefix` (the bench's keys on an etcd it did not start).
async fn delete_prefix(endpoint: &str, prefix: &str) -> anyhow::Result<()> {
    use drover_proto::etcd::etcdserverpb::{DeleteRangeRequest, kv_client::KvClient};
    let mut c = KvClient::connect(endpoint.to_owned()).await?;
    let key = prefix.as_bytes().to_vec();
    let mut end = key.clone();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    c.delete_range(DeleteRangeRequest {
        key,
        range_end: end,
    })
    .await?;
    Ok(())
}

/// Start a server on `store`, register the nodes, submit the jobs, wait until every
/// allocation is placed; print and return the rate.
async fn place(
    o: &Options,
    counts: &[u32],
    data_dir: &std::path::Path,
    store: Arc<dyn Store>,
    what: &str,
    ports: usize,
) -> anyhow::Result<Placement> {
    let mut cfg = ServerConfig::new(data_dir.to_path_buf());
    // Nobody heartbeats here: no node may go down during the run.
    cfg.heartbeat_ttl = Duration::from_secs(3600);
    if let Some(w) = o.workers {
        cfg.workers = w;
    }
    let workers = cfg.workers;
    let shutdown = CancellationToken::new();
    let server = Server::start(cfg, store, shutdown.clone()).await?;

    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let per = o.nodes.div_ceil(16);
    for chunk in 0..16 {
        let server = server.clone();
        let range = (chunk * per)..((chunk + 1) * per).min(o.nodes);
        set.spawn(async move {
            for i in range {
                server
                    .register_node(node(i), "bench-schedule-node-secret")
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let register = t.elapsed();

    let before = server.stats();
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in counts.iter().enumerate() {
        let server = server.clone();
        let spec = job(i, *c, ports);
        set.spawn(async move { server.register_job(spec).await });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let submitted = t.elapsed();
    let mut index = server.index();
    let placed = loop {
        let s = server.stats();
        let placed = s.allocations - before.allocations;
        if placed >= o.allocs {
            break placed;
        }
        if s.evaluations_in_broker == 0 && server.index() == index {
            // Every evaluation was handled and nothing is committing: done placing.
            break placed;
        }
        if t.elapsed() > o.timeout {
            bail!(
                "{what}: only {placed} of {} allocations placed after {:?}",
                o.allocs,
                o.timeout
            );
        }
        index = server
            .wait_for_index(index, Duration::from_millis(50))
            .await;
    };
    let elapsed = t.elapsed();
    let stats = server.stats();
    if ports > 0 {
        // The placements really carry their ports, distinct on each node.
        let mut per_node: std::collections::HashMap<String, Vec<u16>> = Default::default();
        for i in 0..counts.len() {
            for a in server.job_allocations("default", &format!("bench-{i}")) {
                if a.ports.len() != ports {
                    bail!(
                        "{what}: allocation {} has {} ports, not {ports}",
                        a.id,
                        a.ports.len()
                    );
                }
                per_node
                    .entry(a.node_id.clone())
                    .or_default()
                    .extend(a.ports.iter().map(|p| p.value));
            }
        }
        for (node, mut v) in per_node {
            let n = v.len();
            v.sort_unstable();
            v.dedup();
            if v.len() != n {
                bail!("{what}: a port was given twice on node {node}");
            }
        }
    }
    shutdown.cancel();
    server.stopped().await;
    drop(server);

    println!(
        "schedule benchmark, {what}: {} nodes, {} jobs x ~{} allocations = {} allocations, {workers} workers",
        o.nodes,
        o.jobs,
        o.allocs / o.jobs,
        o.allocs
    );
    println!(
        "  {} nodes registered in {:.2} s ({:.0} registrations/s, one commit each)",
        o.nodes,
        register.as_secs_f64(),
        o.nodes as f64 / register.as_secs_f64()
    );
    let rate = placed as f64 / elapsed.as_secs_f64();
    if placed == 0 {
        println!(
            "  NOTHING PLACED: every evaluation completed without a placement. This build's \
             scheduler is the foundation stub (scheduler::schedule returns an empty plan); \
             no placement rate to report"
        );
    } else {
        println!(
            "  placed {placed} allocations in {:.2} s from the first submit (submits took {:.2} s): \
             {rate:.0} placements/s, store commits included; index {} -> {}",
            elapsed.as_secs_f64(),
            submitted.as_secs_f64(),
            before.index,
            stats.index
        );
        if placed < o.allocs {
            println!(
                "  WARNING: {} allocations were not placed ({} blocked evaluations)",
                o.allocs - placed,
                stats.blocked_evaluations
            );
        }
    }
    Ok(Placement { placed, rate })
}

/// The store alone, same documents, same transaction size, fresh store.
async fn baseline(store: &dyn Store, counts: &[u32], doc: &[u8]) -> anyhow::Result<()> {
    let t = Instant::now();
    let mut written = 0;
    for (j, c) in counts.iter().enumerate() {
        let ops = (0..*c)
            .map(|i| Op::Put {
                key: format!("alloc/{j:08}-{i:08}-0000-4000-8000-000000000000"),
                value: doc.to_vec(),
            })
            .collect();
        let r = store.txn(Vec::new(), ops).await?;
        if !r.succeeded {
            bail!("baseline commit {j} refused by the {} store", store.kind());
        }
        written += *c as usize;
    }
    let bulk = t.elapsed();
    let n = 200;
    let t = Instant::now();
    for i in 0..n {
        store
            .txn(
                Vec::new(),
                vec![Op::Put {
                    key: format!("node/{i}"),
                    value: doc.to_vec(),
                }],
            )
            .await?;
    }
    let single = t.elapsed() / n;
    println!(
        "  baseline ({} store alone): {written} allocation documents ({} bytes each) in {} txns: \
         {:.0} docs/s in {:.2} s; one-key commit {:.2} ms ({:.0} commits/s)",
        store.kind(),
        doc.len(),
        counts.len(),
        written as f64 / bulk.as_secs_f64(),
        bulk.as_secs_f64(),
        single.as_secs_f64() * 1000.0,
        1.0 / single.as_secs_f64()
    );
    Ok(())
}

fn sample_alloc() -> Allocation {
    Allocation {
        task_devices: Default::default(),
        namespace: "default".into(),
        deployment_id: Default::default(),
        deployment_status: Default::default(),
        ports: Default::default(),
        reschedule_events: Vec::new(),
        id: "00000000-0000-4000-8000-000000000000".into(),
        name: "bench-0.app[0]".into(),
        index: 0,
        job_name: "bench-0".into(),
        job_version: 0,
        group: "app".into(),
        node_id: "00000000-0000-4000-8000-000000000001".into(),
        node_name: "bench-node-1".into(),
        resources: AllocResources {
            cpu: 20,
            memory_mb: 32,
        },
        desired_status: DesiredStatus::Run,
        desired_description: String::new(),
        client_status: ClientStatus::Pending,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        eval_id: "00000000-0000-4000-8000-000000000002".into(),
        previous_allocation: None,
        next_allocation: None,
        create_index: 1,
        modify_index: 1,
        alloc_modify_index: 1,
        create_time: 1,
        modify_time: 1,
    }
}
