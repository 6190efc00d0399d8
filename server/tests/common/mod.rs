//! Shared setup of the server tests: a real redb store in a temp dir, a server on it,
//! nodes and jobs, and plans built by hand (the scheduler is not under test here).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drover_server::ServerConfig;
use drover_server::scheduler::{AllocStop, Plan};
use drover_server::{RedbStore, Server};
use drover_server_api::{
    AllocResources, Allocation, ClientStatus, DesiredStatus, DriverInfo, JobSpec, JobType,
    NodeRegistration, NodeResources, Task, TaskGroup, TaskResources,
};
use tokio_util::sync::CancellationToken;

pub struct Running {
    pub server: Arc<Server>,
    pub shutdown: CancellationToken,
}

impl Running {
    /// Stop the server and release its store.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.server.stopped().await;
    }
}

/// A server without scheduler workers: evaluations stay pending, and the only
/// placements are the plans a test applies by hand (the real scheduler would place the
/// jobs' allocations too and make the counts of these tests its own).
pub fn config(dir: &std::path::Path) -> ServerConfig {
    let mut c = ServerConfig::new(dir);
    c.workers = 0;
    c
}

pub async fn start(cfg: ServerConfig) -> Running {
    // A server stopped just before may still be letting go of the file (its last
    // tasks end after the shutdown), and a process another test forks holds a copy
    // of the lock's descriptor until it execs: wait for the lock, not longer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let store = loop {
        match RedbStore::open(&cfg.data_dir) {
            Ok(store) => break store,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("open store: {e:?}"),
        }
    };
    let shutdown = CancellationToken::new();
    let server = Server::start(cfg, Arc::new(store), shutdown.clone())
        .await
        .expect("start server");
    Running { server, shutdown }
}

pub fn node(id: &str, cpu: u64, memory_mb: u64) -> NodeRegistration {
    NodeRegistration {
        devices: Default::default(),
        host_volumes: Default::default(),
        csi_plugins: Default::default(),
        network: Default::default(),
        datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
        id: id.into(),
        name: format!("name-{id}"),
        attributes: BTreeMap::from([("os.name".into(), "linux".into())]),
        meta: BTreeMap::new(),
        resources: NodeResources { cpu, memory_mb },
        drivers: BTreeMap::from([(
            "rawexec".into(),
            DriverInfo {
                detected: true,
                healthy: true,
                ..DriverInfo::default()
            },
        )]),
    }
}

pub fn job(name: &str, count: u32, cpu: u32, memory_mb: u32) -> JobSpec {
    JobSpec {
        namespace: "default".into(),
        datacenters: Vec::new(),
        name: name.into(),
        job_type: JobType::Service,
        priority: 50,
        constraints: vec![],
        update: Default::default(),
        meta: BTreeMap::new(),
        groups: vec![TaskGroup {
            volumes: Default::default(),
            update: Default::default(),
            network: Default::default(),
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
                driver: "rawexec".into(),
                config: serde_json::json!({"command": "/bin/sleep", "args": ["1000"]}),
                env: BTreeMap::new(),
                kill_signal: None,
                kill_timeout: None,
                restart: None,
                resources: TaskResources {
                    cpu,
                    memory_mb,
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

/// A new allocation as the scheduler would put it in a plan.
pub fn placement(job: &str, index: u32, cpu: u64, memory_mb: u64) -> Allocation {
    Allocation {
        task_devices: Default::default(),
        namespace: "default".into(),
        deployment_id: Default::default(),
        deployment_status: Default::default(),
        ports: Default::default(),
        reschedule_events: Vec::new(),
        id: String::new(),
        name: format!("{job}.app[{index}]"),
        index,
        job_name: job.into(),
        job_version: 0,
        group: "app".into(),
        node_id: String::new(),
        node_name: String::new(),
        resources: AllocResources { cpu, memory_mb },
        desired_status: DesiredStatus::Run,
        desired_description: String::new(),
        client_status: ClientStatus::Pending,
        client_description: String::new(),
        task_states: BTreeMap::new(),
        eval_id: String::new(),
        previous_allocation: None,
        next_allocation: None,
        create_index: 0,
        modify_index: 0,
        alloc_modify_index: 0,
        create_time: 0,
        modify_time: 0,
    }
}

/// A plan for `job` (at its current spec) placing `allocs` on nodes.
pub fn plan(server: &Server, job: &str, allocs: Vec<(&str, Allocation)>) -> Plan {
    let j = server.job("default", job).expect("job registered");
    let mut p = Plan {
        eval_id: "hand-made".into(),
        job_name: job.into(),
        job_modify_index: j.job_modify_index,
        snapshot_index: server.index(),
        ..Plan::default()
    };
    for (node, a) in allocs {
        p.node_allocation
            .entry(node.to_owned())
            .or_default()
            .push(a);
    }
    p
}

pub fn stop(alloc_id: &str) -> AllocStop {
    AllocStop {
        alloc_id: alloc_id.into(),
        desired_description: "test".into(),
        lost: false,
    }
}

pub const LONG: Duration = Duration::from_secs(10);

/// The node secret the in-process tests register their nodes with.
pub const SECRET: &str = "test-node-secret-0123456789abcdef";
