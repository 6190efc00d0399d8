//! The scheduler against a small in-memory state (plain vectors), applying its plans
//! the way the plan applier does, so that multi-step scenarios (rolling updates, node
//! failures) run through several evaluations.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use drover_server_api::{
    AllocResources, Allocation, ClientStatus, Constraint, ConstraintOperator, DeploymentStatus,
    DesiredStatus, DriverInfo, EvalStatus, EvalTrigger, Evaluation, Job, JobSpec, JobStatus,
    JobType, Node, NodeResources, NodeStatus, Task, TaskGroup, TaskResources, UpdateStrategy,
};

use super::feasible::{self, Compiled};
use super::place::{Placed, Placer};
use super::*;

#[derive(Default)]
struct TestState {
    index: Index,
    /// Every version of every job.
    jobs: Vec<Job>,
    nodes: Vec<Node>,
    allocs: Vec<Allocation>,
    deployments: Vec<Deployment>,
}

impl StateView for TestState {
    fn index(&self) -> Index {
        self.index
    }
    fn job(&self, ns: &str, name: &str) -> Option<&Job> {
        self.jobs
            .iter()
            .filter(|j| j.spec.name == name && j.spec.namespace == ns)
            .max_by_key(|j| j.version)
    }
    fn job_version(&self, ns: &str, name: &str, version: u64) -> Option<&Job> {
        self.jobs
            .iter()
            .find(|j| j.spec.name == name && j.spec.namespace == ns && j.version == version)
    }
    fn nodes(&self) -> Vec<&Node> {
        self.nodes.iter().collect()
    }
    fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }
    fn job_allocs(&self, ns: &str, job: &str) -> Vec<&Allocation> {
        self.allocs
            .iter()
            .filter(|a| a.job_name == job && a.namespace == ns)
            .collect()
    }
    fn node_allocs(&self, node_id: &str) -> Vec<&Allocation> {
        self.allocs
            .iter()
            .filter(|a| a.node_id == node_id)
            .collect()
    }
    fn latest_deployment(&self, ns: &str, job: &str) -> Option<&Deployment> {
        self.deployments
            .iter()
            .filter(|d| d.job_name == job && d.namespace == ns)
            .max_by_key(|d| d.create_index)
    }
    fn node_usage(&self, node_id: &str) -> AllocResources {
        let mut r = AllocResources::default();
        for a in self
            .allocs
            .iter()
            .filter(|a| a.node_id == node_id && !a.is_terminal())
        {
            r.cpu += a.resources.cpu;
            r.memory_mb += a.resources.memory_mb;
        }
        r
    }
}

impl TestState {
    fn add_node(&mut self, node: Node) {
        self.nodes.push(node);
    }

    /// Register `spec` as the job's next version.
    fn register(&mut self, spec: JobSpec) {
        self.index += 1;
        let version = self.job("default", &spec.name).map_or(0, |j| j.version + 1);
        self.jobs.push(Job {
            stable: Default::default(),
            spec,
            version,
            stop: false,
            status: JobStatus::Pending,
            submit_time: 0,
            create_index: self.index,
            modify_index: self.index,
            job_modify_index: self.index,
        });
    }

    fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.name == name).unwrap()
    }

    /// What the plan applier does with a plan that fits.
    fn apply(&mut self, out: &SchedulerOutput) {
        self.index += 1;
        for stops in out.plan.node_update.values() {
            for s in stops {
                let a = self.allocs.iter_mut().find(|a| a.id == s.alloc_id).unwrap();
                a.desired_status = DesiredStatus::Stop;
                a.desired_description = s.desired_description.clone();
                if s.lost {
                    a.client_status = ClientStatus::Lost;
                }
            }
        }
        if let Some(d) = &out.plan.deployment {
            match self.deployments.iter_mut().find(|o| o.id == d.id) {
                Some(o) => {
                    for (name, g) in &d.groups {
                        o.groups.entry(name.clone()).or_insert_with(|| g.clone());
                    }
                }
                None => {
                    let mut d = d.clone();
                    d.create_index = self.index;
                    self.deployments.push(d);
                }
            }
        }
        for allocs in out.plan.node_allocation.values() {
            for a in allocs {
                let mut a = a.clone();
                a.create_index = self.index;
                a.modify_index = self.index;
                if let Some(d) = a
                    .deployment_id
                    .as_ref()
                    .and_then(|id| self.deployments.iter_mut().find(|d| &d.id == id))
                    && let Some(g) = d.groups.get_mut(&a.group)
                {
                    g.placed_allocs += 1;
                    if a.deployment_status.as_ref().is_some_and(|s| s.canary) {
                        g.placed_canaries.push(a.id.clone());
                    }
                }
                self.allocs.push(a);
            }
        }
    }

    /// Every live allocation of `job` in a deployment is running and healthy (what
    /// the clients report, and the server counts).
    fn report_healthy(&mut self, job: &str) {
        for a in &mut self.allocs {
            if a.job_name != job || a.is_terminal() {
                continue;
            }
            a.client_status = ClientStatus::Running;
            let Some(id) = a.deployment_id.clone() else {
                continue;
            };
            let status = a.deployment_status.get_or_insert_with(Default::default);
            if status.healthy.is_some() {
                continue;
            }
            status.healthy = Some(true);
            if let Some(g) = self
                .deployments
                .iter_mut()
                .find(|d| d.id == id)
                .and_then(|d| d.groups.get_mut(&a.group))
            {
                g.healthy_allocs += 1;
            }
        }
    }

    fn deployment(&self, job: &str) -> &Deployment {
        self.latest_deployment("default", job).unwrap()
    }

    /// Every live allocation of `job` reports `status`.
    fn report(&mut self, job: &str, status: ClientStatus) {
        for a in &mut self.allocs {
            if a.job_name == job && !a.is_terminal() {
                a.client_status = status;
            }
        }
    }

    fn live(&self, job: &str) -> Vec<&Allocation> {
        let mut v: Vec<&Allocation> = self
            .allocs
            .iter()
            .filter(|a| a.job_name == job && !a.is_terminal())
            .collect();
        v.sort_by_key(|a| (a.group.clone(), a.index));
        v
    }

    fn node_name(&self, id: &str) -> String {
        self.node(id).unwrap().name.clone()
    }
}

pub(crate) fn node(name: &str, cpu: u64, memory_mb: u64) -> Node {
    let healthy = DriverInfo {
        detected: true,
        healthy: true,
        health_description: String::new(),
        attributes: BTreeMap::from([("version".to_owned(), "1.2.3".to_owned())]),
    };
    Node {
        devices: Default::default(),
        host_volumes: Default::default(),
        csi_plugins: Default::default(),
        network: Default::default(),
        datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
        id: format!("id-{name}"),
        name: name.into(),
        status: NodeStatus::Ready,
        status_description: String::new(),
        drain: false,
        ineligible: false,
        attributes: BTreeMap::from([
            ("kernel.name".to_owned(), "linux".to_owned()),
            ("kernel.version".to_owned(), "6.1.0-18-amd64".to_owned()),
            ("cpu.numcores".to_owned(), "8".to_owned()),
        ]),
        meta: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
        resources: NodeResources { cpu, memory_mb },
        drivers: BTreeMap::from([("rawexec".to_owned(), healthy)]),
        status_updated_at: 0,
        create_index: 1,
        modify_index: 1,
    }
}

fn task(name: &str, driver: &str, cpu: u32, memory_mb: u32) -> Task {
    Task {
        devices: Default::default(),
        volume_mounts: Default::default(),
        services: Default::default(),
        meta: Default::default(),
        name: name.into(),
        driver: driver.into(),
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
    }
}

pub(crate) fn group(name: &str, count: u32, cpu: u32, memory_mb: u32) -> TaskGroup {
    TaskGroup {
        volumes: Default::default(),
        update: Default::default(),
        network: Default::default(),
        services: Default::default(),
        reschedule: None,
        name: name.into(),
        count,
        constraints: vec![],
        meta: BTreeMap::new(),
        tasks: vec![task("main", "rawexec", cpu, memory_mb)],
    }
}

pub(crate) fn spec(name: &str, job_type: JobType, groups: Vec<TaskGroup>) -> JobSpec {
    JobSpec {
        namespace: "default".into(),
        datacenters: Vec::new(),
        name: name.into(),
        job_type,
        priority: 50,
        constraints: vec![],
        update: UpdateStrategy::default(),
        meta: BTreeMap::new(),
        groups,
    }
}

fn constraint(attribute: &str, operator: ConstraintOperator, value: &str) -> Constraint {
    Constraint {
        attribute: attribute.into(),
        operator,
        value: value.into(),
    }
}

fn eval(state: &TestState, job: &str, id: &str) -> Evaluation {
    let j = state.job("default", job);
    Evaluation {
        namespace: "default".into(),
        wait_until: None,
        id: id.into(),
        job_name: job.into(),
        job_type: j.map_or(JobType::Service, |j| j.spec.job_type),
        priority: 50,
        triggered_by: EvalTrigger::JobRegister,
        status: EvalStatus::Pending,
        status_description: String::new(),
        node_id: None,
        failed_tg_allocs: BTreeMap::new(),
        queued_allocations: BTreeMap::new(),
        blocked_eval: None,
        previous_eval: None,
        job_modify_index: j.map_or(0, |j| j.job_modify_index),
        create_index: 0,
        modify_index: 0,
        create_time: 0,
        modify_time: 0,
    }
}

/// "Now" for the scheduler in these tests: long after the allocations' times (0), so
/// failed ones are due for their replacement.
const NOW: i64 = 1_000_000_000_000_000_000;

const BINPACK: SchedulerSettings = SchedulerSettings {
    now: NOW,
    algorithm: SchedulerAlgorithm::BinPack,
};
const SPREAD: SchedulerSettings = SchedulerSettings {
    now: NOW,
    algorithm: SchedulerAlgorithm::Spread,
};

fn run(state: &TestState, job: &str) -> SchedulerOutput {
    schedule(
        state,
        &eval(state, job, &format!("eval-{}", state.index)),
        BINPACK,
    )
}

fn run_and_apply(state: &mut TestState, job: &str) -> SchedulerOutput {
    let out = run(state, job);
    state.apply(&out);
    out
}

fn placed(out: &SchedulerOutput) -> Vec<&Allocation> {
    let mut v: Vec<&Allocation> = out.plan.node_allocation.values().flatten().collect();
    v.sort_by_key(|a| (a.group.clone(), a.index));
    v
}

fn stopped(out: &SchedulerOutput) -> Vec<&AllocStop> {
    out.plan.node_update.values().flatten().collect()
}

fn three_nodes() -> TestState {
    let mut s = TestState::default();
    for n in ["a", "b", "c"] {
        s.add_node(node(n, 4000, 4096));
    }
    s
}

#[test]
fn a_service_job_gets_count_allocations_with_every_field_filled() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    let out = run(&s, "web");
    let new = placed(&out);
    assert_eq!(new.len(), 3);
    for (i, a) in new.iter().enumerate() {
        assert_eq!(a.name, format!("web.app[{i}]"));
        assert_eq!(a.index, i as u32);
        assert_eq!(a.job_name, "web");
        assert_eq!(a.job_version, 0);
        assert_eq!(a.group, "app");
        assert_eq!(a.node_name, s.node_name(&a.node_id));
        assert_eq!(
            a.resources,
            AllocResources {
                cpu: 100,
                memory_mb: 64
            }
        );
        assert_eq!(a.desired_status, DesiredStatus::Run);
        assert_eq!(a.client_status, ClientStatus::Pending);
        assert_eq!(a.eval_id, "eval-1");
        assert_eq!(a.previous_allocation, None);
        assert_eq!(a.id.len(), 36);
        assert_eq!((a.create_index, a.modify_index, a.create_time), (0, 0, 0));
    }
    let ids: BTreeSet<&str> = new.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    // Anti-affinity: one per node although bin-packing would stack them.
    let nodes: BTreeSet<&str> = new.iter().map(|a| a.node_id.as_str()).collect();
    assert_eq!(nodes.len(), 3);
    assert!(out.failed_tg_allocs.is_empty());
    assert_eq!(out.queued_allocations, BTreeMap::from([("app".into(), 0)]));
    assert_eq!(out.plan.eval_id, "eval-1");
    assert_eq!(out.plan.job_name, "web");
    assert_eq!(out.plan.job_modify_index, 1);
    assert_eq!(out.plan.snapshot_index, 1);
    assert_eq!(out.desired_tg_updates["app"].place, 3);
    assert!(!out.rolling_update_pending);

    // Applied, the job is satisfied: the next evaluation changes nothing.
    s.apply(&out);
    let again = run(&s, "web");
    assert!(again.plan.is_empty(), "{:?}", again.plan);
    assert_eq!(again.desired_tg_updates["app"].ignore, 3);
}

#[test]
fn a_count_change_only_adds_or_stops_the_highest_indexes() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report("web", ClientStatus::Running);

    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 5, 100, 64)],
    ));
    let out = run_and_apply(&mut s, "web");
    assert!(stopped(&out).is_empty());
    let idx: Vec<u32> = placed(&out).iter().map(|a| a.index).collect();
    assert_eq!(idx, [3, 4]);
    assert!(placed(&out).iter().all(|a| a.job_version == 1));
    // The three old ones stay at their version: same tasks, nothing to replace.
    assert_eq!(out.desired_tg_updates["app"].ignore, 3);

    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 2, 100, 64)],
    ));
    let out = run_and_apply(&mut s, "web");
    assert!(placed(&out).is_empty());
    let stops = stopped(&out);
    assert_eq!(stops.len(), 3);
    assert!(
        stops
            .iter()
            .all(|st| st.desired_description == "scaled down" && !st.lost)
    );
    let idx: Vec<u32> = s.live("web").iter().map(|a| a.index).collect();
    assert_eq!(idx, [0, 1]);
}

#[test]
fn failed_and_lost_allocations_are_replaced() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report("web", ClientStatus::Running);

    // One fails on its node: a new copy at its index, preferably elsewhere.
    let failed = s.live("web")[1].clone();
    s.allocs
        .iter_mut()
        .find(|a| a.id == failed.id)
        .unwrap()
        .client_status = ClientStatus::Failed;
    let out = run_and_apply(&mut s, "web");
    let new = placed(&out);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].index, 1);
    assert_eq!(
        new[0].previous_allocation.as_deref(),
        Some(failed.id.as_str())
    );
    assert_ne!(
        new[0].node_id, failed.node_id,
        "the node it failed on is penalized"
    );
    assert!(stopped(&out).is_empty());
    s.report("web", ClientStatus::Running);

    // A node goes down: its allocations are lost and placed elsewhere.
    let victim = s.live("web")[0].clone();
    let there: BTreeSet<String> = s
        .live("web")
        .iter()
        .filter(|a| a.node_id == victim.node_id)
        .map(|a| a.id.clone())
        .collect();
    s.nodes
        .iter_mut()
        .find(|n| n.id == victim.node_id)
        .unwrap()
        .status = NodeStatus::Down;
    let out = run(&s, "web");
    let stops = stopped(&out);
    let stopped_ids: BTreeSet<String> = stops.iter().map(|st| st.alloc_id.clone()).collect();
    assert_eq!(stopped_ids, there);
    assert!(
        stops
            .iter()
            .all(|st| st.lost && st.desired_description == "node down")
    );
    let new = placed(&out);
    let previous: BTreeSet<String> = new
        .iter()
        .filter_map(|a| a.previous_allocation.clone())
        .collect();
    assert_eq!(previous, there);
    assert!(new.iter().any(|a| a.index == victim.index));
    assert!(new.iter().all(|a| a.node_id != victim.node_id));
    s.apply(&out);
    assert_eq!(s.live("web").len(), 3);

    // A node removed from the state entirely is as good as down.
    let victim = s.live("web")[2].clone();
    let there = s
        .live("web")
        .iter()
        .filter(|a| a.node_id == victim.node_id)
        .count();
    s.nodes.retain(|n| n.id != victim.node_id);
    let out = run(&s, "web");
    assert!(
        stopped(&out)
            .iter()
            .any(|st| st.alloc_id == victim.id && st.lost)
    );
    assert_eq!(stopped(&out).len(), there);
    assert_eq!(placed(&out).len(), there);
    assert!(placed(&out).iter().all(|a| a.node_id != victim.node_id));
}

/// The scheduler at time `now` (unix nanoseconds).
fn run_at(state: &TestState, job: &str, now: i64) -> SchedulerOutput {
    let settings = SchedulerSettings { now, ..BINPACK };
    schedule(
        state,
        &eval(state, job, &format!("eval-{}", state.index)),
        settings,
    )
}

#[test]
fn a_failed_allocation_is_replaced_after_a_delay_that_doubles() {
    const S: i64 = 1_000_000_000;
    let mut s = three_nodes();
    let mut g = group("app", 1, 100, 64);
    g.reschedule = Some(drover_server_api::ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay: Duration::from_secs(10),
        max_delay: Duration::from_secs(25),
        unlimited: true,
    });
    s.register(spec("web", JobType::Service, vec![g]));
    run_and_apply(&mut s, "web");
    // Fails at t = 100s.
    let fail = |s: &mut TestState, at: i64| {
        let a = s.allocs.iter_mut().find(|a| !a.is_terminal()).unwrap();
        a.client_status = ClientStatus::Failed;
        a.modify_time = at;
        a.id.clone()
    };
    let first = fail(&mut s, 100 * S);
    let out = run_at(&s, "web", 105 * S);
    assert!(placed(&out).is_empty(), "not replaced before its delay");
    assert_eq!(out.follow_up_at, Some(110 * S), "evaluated again when due");
    assert_eq!(out.desired_tg_updates["app"].ignore, 1);
    let out = run_at(&s, "web", 110 * S);
    let new = placed(&out);
    assert_eq!(new.len(), 1, "replaced once due");
    assert_eq!(new[0].previous_allocation.as_deref(), Some(first.as_str()));
    assert_eq!(new[0].reschedule_events.len(), 1);
    assert_eq!(new[0].reschedule_events[0].delay, Duration::from_secs(10));
    assert_eq!(out.follow_up_at, None);
    s.allocs
        .iter_mut()
        .find(|a| a.id == first)
        .unwrap()
        .next_allocation = Some(new[0].id.clone());
    s.apply(&out);

    // The replacement fails too, at once: 20s this time, then 25s (the ceiling).
    fail(&mut s, 111 * S);
    assert_eq!(run_at(&s, "web", 130 * S).follow_up_at, Some(131 * S));
    let out = run_at(&s, "web", 131 * S);
    assert_eq!(
        placed(&out)[0].reschedule_events.len(),
        1,
        "unlimited keeps the last"
    );
    assert_eq!(
        placed(&out)[0].reschedule_events[0].delay,
        Duration::from_secs(20)
    );
    let prev = s
        .allocs
        .iter()
        .find(|a| a.client_status == ClientStatus::Failed && a.next_allocation.is_none())
        .unwrap()
        .id
        .clone();
    s.allocs
        .iter_mut()
        .find(|a| a.id == prev)
        .unwrap()
        .next_allocation = Some(placed(&out)[0].id.clone());
    s.apply(&out);
    fail(&mut s, 132 * S);
    assert_eq!(run_at(&s, "web", 132 * S).follow_up_at, Some(157 * S));

    // A batch job's default: one replacement per 24h, after 5s.
    let mut s = three_nodes();
    s.register(spec("b", JobType::Batch, vec![group("g", 1, 100, 64)]));
    run_and_apply(&mut s, "b");
    let first = fail(&mut s, 100 * S);
    assert_eq!(run_at(&s, "b", 100 * S).follow_up_at, Some(105 * S));
    let out = run_at(&s, "b", 105 * S);
    assert_eq!(placed(&out).len(), 1);
    s.allocs
        .iter_mut()
        .find(|a| a.id == first)
        .unwrap()
        .next_allocation = Some(placed(&out)[0].id.clone());
    s.apply(&out);
    fail(&mut s, 106 * S);
    let out = run_at(&s, "b", 1_000 * S);
    assert!(placed(&out).is_empty(), "the one attempt is used up");
    assert_eq!(out.follow_up_at, None, "and nothing to come back for");
}

#[test]
fn a_batch_allocation_that_completed_is_never_replaced() {
    let mut s = three_nodes();
    s.register(spec("b", JobType::Batch, vec![group("g", 3, 100, 64)]));
    run_and_apply(&mut s, "b");
    let live = s.live("b");
    let (done, failed) = (live[0].id.clone(), live[1].id.clone());
    for a in &mut s.allocs {
        if a.id == done {
            a.client_status = ClientStatus::Complete;
        } else if a.id == failed {
            a.client_status = ClientStatus::Failed;
        } else {
            a.client_status = ClientStatus::Running;
        }
    }
    let out = run(&s, "b");
    let new = placed(&out);
    assert_eq!(new.len(), 1, "only the failed one is replaced");
    assert_eq!(new[0].index, 1);
    assert_eq!(new[0].previous_allocation.as_deref(), Some(failed.as_str()));

    // A service allocation that ended is replaced: services are kept running.
    let mut s = three_nodes();
    s.register(spec("svc", JobType::Service, vec![group("g", 1, 100, 64)]));
    run_and_apply(&mut s, "svc");
    s.report("svc", ClientStatus::Complete);
    assert_eq!(placed(&run(&s, "svc")).len(), 1);
}

/// `rawexec` is the raw exec driver's older name: a job that says it is placed on a
/// node whose driver is `raw_exec` (Nomad's name, what agents fingerprint now), as a
/// job that says `raw_exec` is; `${driver.rawexec.*}` reads raw_exec's attributes.
#[test]
fn a_job_saying_rawexec_is_placed_on_nodes_with_raw_exec() {
    let mut s = TestState::default();
    let mut n = node("a", 4000, 4096);
    let info = n.drivers.remove("rawexec").unwrap();
    n.drivers.insert("raw_exec".to_owned(), info);
    s.add_node(n.clone());
    for driver in ["rawexec", "raw_exec"] {
        let mut g = group("g", 1, 100, 64);
        g.tasks[0].driver = driver.into();
        s.register(spec(driver, JobType::Service, vec![g]));
        let out = run(&s, driver);
        assert_eq!(
            placed(&out).len(),
            1,
            "{driver}: {:?}",
            out.failed_tg_allocs
        );
    }
    let mut compiled = Compiled::default();
    let c = constraint(
        "${driver.rawexec.version}",
        ConstraintOperator::Equal,
        "1.2.3",
    );
    assert!(feasible::holds(&n, &c, &mut compiled));
}

#[test]
fn a_system_job_runs_once_on_every_feasible_ready_node() {
    let mut s = three_nodes();
    let mut no_driver = node("d", 4000, 4096);
    no_driver.drivers.clear();
    s.add_node(no_driver);
    let mut init = node("e", 4000, 4096);
    init.status = NodeStatus::Initializing;
    s.add_node(init);
    s.register(spec(
        "sys",
        JobType::System,
        vec![group("agent", 1, 100, 64)],
    ));
    let out = run_and_apply(&mut s, "sys");
    let on: BTreeSet<String> = placed(&out).iter().map(|a| a.node_name.clone()).collect();
    assert_eq!(on, BTreeSet::from(["a".into(), "b".into(), "c".into()]));
    assert!(
        out.failed_tg_allocs.is_empty(),
        "{:?}",
        out.failed_tg_allocs
    );
    assert!(run(&s, "sys").plan.is_empty());

    // A new node gets one; the initializing one once it is ready.
    s.add_node(node("f", 4000, 4096));
    s.node_mut("e").status = NodeStatus::Ready;
    let out = run_and_apply(&mut s, "sys");
    let on: BTreeSet<String> = placed(&out).iter().map(|a| a.node_name.clone()).collect();
    assert_eq!(on, BTreeSet::from(["e".into(), "f".into()]));

    // A node that goes down loses its copy, which is not moved elsewhere.
    s.node_mut("a").status = NodeStatus::Down;
    let out = run_and_apply(&mut s, "sys");
    assert!(placed(&out).is_empty());
    let stops = stopped(&out);
    assert_eq!(stops.len(), 1);
    assert!(stops[0].lost);

    // A node too full for it: reported, the others run it.
    let mut full = node("g", 50, 4096);
    full.meta.insert("rack".into(), "r2".into());
    s.add_node(full);
    let out = run(&s, "sys");
    assert!(placed(&out).is_empty());
    let f = &out.failed_tg_allocs["agent"];
    assert_eq!(f.unplaced, 1);
    assert_eq!(f.reason, "cpu exhausted on 1 of 7 nodes");
    assert_eq!(out.queued_allocations["agent"], 1);
}

fn rolling_state(max_parallel: u32) -> TestState {
    let mut s = three_nodes();
    let mut j = spec("web", JobType::Service, vec![group("app", 4, 100, 64)]);
    j.update.max_parallel = max_parallel;
    s.register(j);
    run_and_apply(&mut s, "web");
    s.report("web", ClientStatus::Running);
    s
}

fn changed_task(max_parallel: u32) -> JobSpec {
    let mut j = spec("web", JobType::Service, vec![group("app", 4, 100, 64)]);
    j.update.max_parallel = max_parallel;
    j.groups[0].tasks[0].config = serde_json::json!({"command": "/bin/sleep", "args": ["2000"]});
    j
}

#[test]
fn a_changed_task_is_rolled_out_max_parallel_at_a_time() {
    let mut s = rolling_state(2);
    s.register(changed_task(2));
    let out = run_and_apply(&mut s, "web");
    let stops = stopped(&out);
    assert_eq!(stops.len(), 2);
    assert!(
        stops
            .iter()
            .all(|st| st.desired_description == "replaced by version 1")
    );
    let new = placed(&out);
    assert_eq!(new.len(), 2);
    assert!(
        new.iter()
            .all(|a| a.job_version == 1 && a.previous_allocation.is_some())
    );
    let replaced: BTreeSet<&str> = stops.iter().map(|st| st.alloc_id.as_str()).collect();
    let previous: BTreeSet<&str> = new
        .iter()
        .filter_map(|a| a.previous_allocation.as_deref())
        .collect();
    assert_eq!(replaced, previous);
    assert!(out.rolling_update_pending);
    assert_eq!(out.desired_tg_updates["app"].update, 2);
    assert_eq!(out.desired_tg_updates["app"].ignore, 2);

    // The new ones are not healthy yet: they count against max_parallel, running
    // or not.
    let out = run(&s, "web");
    assert!(out.plan.is_empty(), "{:?}", out.plan);
    assert!(out.rolling_update_pending);
    s.report("web", ClientStatus::Running);
    let out = run(&s, "web");
    assert!(out.plan.is_empty(), "{:?}", out.plan);

    // They are healthy: the next batch.
    s.report_healthy("web");
    let out = run_and_apply(&mut s, "web");
    assert_eq!(stopped(&out).len(), 2);
    assert_eq!(placed(&out).len(), 2);
    assert!(!out.rolling_update_pending);
    s.report_healthy("web");
    assert!(run(&s, "web").plan.is_empty());
    let live = s.live("web");
    assert_eq!(live.len(), 4);
    assert!(live.iter().all(|a| a.job_version == 1));
    let idx: Vec<u32> = live.iter().map(|a| a.index).collect();
    assert_eq!(idx, [0, 1, 2, 3]);
}

#[test]
fn max_parallel_zero_replaces_everything_at_once() {
    let mut s = rolling_state(0);
    s.register(changed_task(0));
    let out = run(&s, "web");
    assert_eq!(stopped(&out).len(), 4);
    assert_eq!(placed(&out).len(), 4);
    assert!(!out.rolling_update_pending);
}

#[test]
fn a_version_the_state_no_longer_knows_counts_as_changed() {
    let mut s = rolling_state(1);
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 4, 100, 64)],
    ));
    s.jobs.retain(|j| j.version != 0);
    let out = run(&s, "web");
    assert_eq!(stopped(&out).len(), 1);
    assert!(out.rolling_update_pending);
}

#[test]
fn the_plan_frees_what_it_stops_for_what_it_places() {
    // One node exactly full: an update can only go where the old copy was.
    let mut s = TestState::default();
    s.add_node(node("only", 100, 64));
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 1, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report("web", ClientStatus::Running);
    let mut j = spec("web", JobType::Service, vec![group("app", 1, 100, 64)]);
    j.groups[0].tasks[0].env.insert("V".into(), "2".into());
    s.register(j);
    let out = run(&s, "web");
    assert_eq!(stopped(&out).len(), 1);
    assert_eq!(placed(&out).len(), 1);
    assert!(out.failed_tg_allocs.is_empty());
}

#[test]
fn a_draining_node_is_emptied_and_gets_nothing_new() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report("web", ClientStatus::Running);
    let on_a: Vec<String> = s
        .live("web")
        .iter()
        .filter(|a| a.node_name == "a")
        .map(|a| a.id.clone())
        .collect();
    assert_eq!(on_a.len(), 1);
    s.node_mut("a").drain = true;
    let out = run(&s, "web");
    let stops = stopped(&out);
    assert_eq!(stops.len(), 1);
    assert_eq!(stops[0].alloc_id, on_a[0]);
    assert_eq!(stops[0].desired_description, "node draining");
    assert!(!stops[0].lost);
    let new = placed(&out);
    assert_eq!(new.len(), 1);
    assert_ne!(new[0].node_name, "a");
    assert_eq!(
        new[0].previous_allocation.as_deref(),
        Some(on_a[0].as_str())
    );

    // The status form of draining too.
    let mut s = three_nodes();
    s.node_mut("b").status = NodeStatus::Draining;
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 4, 100, 64)],
    ));
    let out = run(&s, "web");
    assert!(placed(&out).iter().all(|a| a.node_name != "b"));
}

#[test]
fn binpack_fills_one_node_before_the_next() {
    let mut s = TestState::default();
    s.add_node(node("a", 1000, 1024));
    s.add_node(node("b", 1000, 1024));
    let mut order = Vec::new();
    for i in 0..6 {
        let name = format!("j{i}");
        s.register(spec(&name, JobType::Service, vec![group("g", 1, 300, 300)]));
        let out = run_and_apply(&mut s, &name);
        order.push(placed(&out)[0].node_name.clone());
    }
    // Three fit a node: the first node is filled before the second is used.
    assert_eq!(order[0], order[1]);
    assert_eq!(order[1], order[2]);
    assert_ne!(order[2], order[3]);
    assert_eq!(order[3], order[4]);
    assert_eq!(order[4], order[5]);
}

#[test]
fn spread_uses_the_emptiest_node() {
    let mut s = TestState::default();
    s.add_node(node("a", 1000, 1024));
    s.add_node(node("b", 1000, 1024));
    let mut order = Vec::new();
    for i in 0..4 {
        let name = format!("j{i}");
        s.register(spec(&name, JobType::Service, vec![group("g", 1, 300, 300)]));
        let out = schedule(&s, &eval(&s, &name, "e"), SPREAD);
        s.apply(&out);
        order.push(placed(&out)[0].node_name.clone());
    }
    assert_ne!(order[0], order[1]);
    assert_ne!(order[2], order[3]);
    assert_eq!(s.node_usage("id-a"), s.node_usage("id-b"));
}

#[test]
fn anti_affinity_spreads_a_jobs_copies_under_binpack() {
    let mut s = TestState::default();
    for n in ["a", "b"] {
        s.add_node(node(n, 1000, 1024));
    }
    // Another job already uses `a`: bin-packing alone would stack everything there.
    s.register(spec(
        "other",
        JobType::Service,
        vec![group("g", 1, 100, 100)],
    ));
    run_and_apply(&mut s, "other");
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 2, 100, 100)],
    ));
    let out = run(&s, "web");
    let nodes: BTreeSet<String> = placed(&out).iter().map(|a| a.node_name.clone()).collect();
    assert_eq!(nodes.len(), 2);
}

#[test]
fn distinct_hosts_allows_one_copy_per_node() {
    let mut s = TestState::default();
    s.add_node(node("a", 4000, 4096));
    s.add_node(node("b", 4000, 4096));
    let mut j = spec("web", JobType::Service, vec![group("app", 3, 100, 64)]);
    j.constraints
        .push(constraint("", ConstraintOperator::DistinctHosts, ""));
    s.register(j);
    let out = run(&s, "web");
    let new = placed(&out);
    assert_eq!(new.len(), 2);
    assert_ne!(new[0].node_id, new[1].node_id);
    let f = &out.failed_tg_allocs["app"];
    assert_eq!(f.unplaced, 1);
    assert_eq!(f.reason, "distinct_hosts filtered 2 of 2 nodes");
    assert_eq!(f.nodes_filtered["distinct_hosts"], 2);
    assert_eq!(out.queued_allocations["app"], 1);

    // On a group, two groups may share a node; on the job they may not.
    let mut s = TestState::default();
    s.add_node(node("a", 4000, 4096));
    let mut g1 = group("one", 1, 100, 64);
    g1.constraints
        .push(constraint("", ConstraintOperator::DistinctHosts, "true"));
    let mut g2 = g1.clone();
    g2.name = "two".into();
    s.register(spec(
        "per-group",
        JobType::Service,
        vec![g1.clone(), g2.clone()],
    ));
    let out = run(&s, "per-group");
    assert_eq!(placed(&out).len(), 2);
    let mut j = spec(
        "per-job",
        JobType::Service,
        vec![group("one", 1, 100, 64), group("two", 1, 100, 64)],
    );
    j.constraints
        .push(constraint("", ConstraintOperator::DistinctHosts, ""));
    s.register(j);
    let out = run(&s, "per-job");
    assert_eq!(placed(&out).len(), 1);
    assert_eq!(out.failed_tg_allocs["two"].unplaced, 1);
}

#[test]
fn every_constraint_operator() {
    use ConstraintOperator::*;
    let mut n = node("n1", 4000, 4096);
    n.meta.insert("tags".into(), "ssd, gpu ,fast".into());
    n.meta.insert("weight".into(), "10".into());
    n.meta.insert("zone".into(), "b".into());
    let mut compiled = Compiled::default();
    let mut holds = |attribute: &str, op, value: &str| {
        feasible::holds(&n, &constraint(attribute, op, value), &mut compiled)
    };
    let cases: &[(&str, ConstraintOperator, &str, bool)] = &[
        ("${node.meta.rack}", Equal, "r1", true),
        ("${meta.rack}", Equal, "r2", false),
        ("${node.meta.missing}", Equal, "", false),
        ("${node.name}", Equal, "n1", true),
        ("${node.id}", Equal, "id-n1", true),
        ("${attr.kernel.name}", Equal, "linux", true),
        ("${driver.rawexec.version}", Equal, "1.2.3", true),
        ("${node.meta.rack}", Equal, "${meta.rack}", true),
        ("${node.meta.rack}", NotEqual, "r1", false),
        ("${node.meta.rack}", NotEqual, "r2", true),
        ("${node.meta.missing}", NotEqual, "r2", true),
        // Numeric when both are numbers: 10 > 9, though "10" < "9" as text.
        ("${node.meta.weight}", Greater, "9", true),
        ("${node.meta.weight}", Less, "9", false),
        ("${node.meta.weight}", LessEqual, "10", true),
        ("${node.meta.weight}", GreaterEqual, "10.5", false),
        ("${node.meta.weight}", GreaterEqual, "10", true),
        // Lexical otherwise.
        ("${node.meta.zone}", Less, "c", true),
        ("${node.meta.zone}", Greater, "c", false),
        ("${node.meta.missing}", Less, "c", false),
        ("${attr.kernel.version}", Version, ">= 5.10, < 7", true),
        ("${attr.kernel.version}", Version, ">= 6.2", false),
        ("${attr.kernel.version}", Version, "6.1", true),
        ("${attr.cpu.numcores}", Version, ">= 4", true),
        ("${attr.kernel.name}", Version, ">= 1", false),
        (
            "${attr.kernel.version}",
            Version,
            "not a requirement",
            false,
        ),
        ("${attr.kernel.version}", Regexp, "^6\\.[0-9]+", true),
        ("${attr.kernel.version}", Regexp, "amd64$", true),
        ("${attr.kernel.version}", Regexp, "^5", false),
        ("${attr.kernel.version}", Regexp, "(", false),
        ("${node.meta.tags}", SetContains, "gpu,ssd", true),
        ("${node.meta.tags}", SetContains, "gpu, nvme", false),
        ("${node.meta.tags}", SetContainsAny, "nvme, fast", true),
        ("${node.meta.tags}", SetContainsAny, "nvme", false),
        ("${node.meta.rack}", IsSet, "", true),
        ("${node.meta.missing}", IsSet, "", false),
        ("${node.meta.missing}", IsNotSet, "", true),
        ("${node.meta.rack}", IsNotSet, "", false),
        ("${driver.docker.version}", IsNotSet, "", true),
        // Nomad's own names of the node's fields.
        ("${node.unique.name}", Equal, "n1", true),
        ("${node.unique.id}", Equal, "id-n1", true),
        ("${node.datacenter}", Equal, "dc1", true),
        ("${node.datacenter}", Regexp, "^dc[0-9]$", true),
        ("${node.datacenter}", Equal, "dc2", false),
        // No node classes in Drover: empty, but set.
        ("${node.class}", Equal, "", true),
        ("${node.class}", IsSet, "", true),
        ("${node.class}", Equal, "gpu", false),
    ];
    for (attribute, op, value, want) in cases {
        assert_eq!(
            holds(attribute, *op, value),
            *want,
            "{attribute} {} {value}",
            op.as_str()
        );
    }
}

#[test]
fn a_constraint_no_node_meets_is_named_in_the_reason() {
    let mut s = three_nodes();
    let mut g = group("app", 2, 100, 64);
    g.constraints.push(constraint(
        "${node.meta.rack}",
        ConstraintOperator::Equal,
        "r9",
    ));
    s.register(spec("web", JobType::Service, vec![g]));
    let out = run(&s, "web");
    assert!(out.plan.is_empty());
    let f = &out.failed_tg_allocs["app"];
    assert_eq!(
        f.reason,
        "constraint ${node.meta.rack} = r9 filtered 3 of 3 nodes"
    );
    assert_eq!(f.unplaced, 2);
    assert_eq!(f.nodes_evaluated, 3);
    assert_eq!(
        f.nodes_filtered,
        BTreeMap::from([("constraint ${node.meta.rack} = r9".into(), 3)])
    );
    assert_eq!(out.queued_allocations["app"], 2);

    // A job constraint applies to every group; the matching node is used.
    let mut s = three_nodes();
    s.node_mut("b").meta.insert("rack".into(), "r9".into());
    let mut j = spec("web", JobType::Service, vec![group("app", 1, 100, 64)]);
    j.constraints.push(constraint(
        "${node.meta.rack}",
        ConstraintOperator::Equal,
        "r9",
    ));
    s.register(j);
    let out = run(&s, "web");
    assert_eq!(placed(&out)[0].node_name, "b");
}

#[test]
fn a_missing_or_unhealthy_driver_is_the_reason() {
    let mut s = three_nodes();
    s.nodes[0].drivers.insert(
        "qemu".into(),
        DriverInfo {
            detected: true,
            healthy: false,
            health_description: "no kvm".into(),
            attributes: BTreeMap::new(),
        },
    );
    let mut g = group("vm", 1, 100, 64);
    g.tasks.push(task("vm", "qemu", 100, 64));
    s.register(spec("web", JobType::Service, vec![g]));
    let out = run(&s, "web");
    let f = &out.failed_tg_allocs["vm"];
    assert_eq!(f.reason, "no node has driver qemu healthy");
    assert_eq!(
        f.nodes_filtered,
        BTreeMap::from([
            ("driver qemu not detected".into(), 2),
            ("driver qemu unhealthy".into(), 1)
        ])
    );
    // Healthy on one node: that one is used.
    s.nodes[0].drivers.get_mut("qemu").unwrap().healthy = true;
    let out = run(&s, "web");
    assert_eq!(placed(&out)[0].node_name, "a");
}

/// A driver that every node reports undetected with one reason (raw_exec not enabled):
/// the reason says it, so the job's submitter learns what the operator must change.
#[test]
fn what_the_nodes_say_of_a_driver_is_in_the_reason() {
    let mut s = three_nodes();
    let disabled =
        "raw_exec is disabled: enable it with [plugin.raw_exec] config = { enabled = true }";
    for n in &mut s.nodes {
        n.drivers.insert(
            "raw_exec".into(),
            DriverInfo {
                detected: false,
                healthy: false,
                health_description: disabled.into(),
                attributes: BTreeMap::new(),
            },
        );
    }
    let mut g = group("app", 1, 100, 64);
    g.tasks[0].driver = "raw_exec".into();
    s.register(spec("web", JobType::Service, vec![g]));
    let out = run(&s, "web");
    assert_eq!(
        out.failed_tg_allocs["app"].reason,
        format!("no node has driver raw_exec healthy ({disabled})")
    );
    // Nodes that say different things: no quote.
    s.nodes[0]
        .drivers
        .get_mut("raw_exec")
        .unwrap()
        .health_description = "something else".into();
    let out = run(&s, "web");
    assert_eq!(
        out.failed_tg_allocs["app"].reason,
        "no node has driver raw_exec healthy"
    );
}

#[test]
fn exhausted_resources_are_the_reason() {
    let mut s = three_nodes();
    s.register(spec(
        "big",
        JobType::Service,
        vec![group("g", 1, 100, 8192)],
    ));
    let f = run(&s, "big").failed_tg_allocs["g"].clone();
    assert_eq!(f.reason, "memory exhausted on 3 of 3 nodes");
    assert_eq!(f.nodes_exhausted, BTreeMap::from([("memory".into(), 3)]));

    let mut s = TestState::default();
    s.add_node(node("a", 50, 4096));
    s.add_node(node("b", 50, 4096));
    s.add_node(node("c", 4000, 32));
    s.register(spec("web", JobType::Service, vec![group("g", 1, 100, 64)]));
    let f = run(&s, "web").failed_tg_allocs["g"].clone();
    assert_eq!(
        f.reason,
        "cpu exhausted on 2 of 3 nodes; memory exhausted on 1 of 3 nodes"
    );

    // What other jobs use counts, and what this plan already placed.
    let mut s = TestState::default();
    s.add_node(node("a", 1000, 1000));
    s.register(spec(
        "other",
        JobType::Service,
        vec![group("g", 1, 500, 500)],
    ));
    run_and_apply(&mut s, "other");
    s.register(spec("web", JobType::Service, vec![group("g", 3, 200, 200)]));
    let out = run(&s, "web");
    assert_eq!(placed(&out).len(), 2);
    let f = &out.failed_tg_allocs["g"];
    assert_eq!(f.unplaced, 1);
    assert_eq!(f.reason, "cpu exhausted on 1 of 1 nodes");
}

#[test]
fn no_ready_node_is_the_reason() {
    let mut s = three_nodes();
    s.node_mut("a").status = NodeStatus::Down;
    s.node_mut("b").status = NodeStatus::Initializing;
    s.node_mut("c").drain = true;
    s.register(spec("web", JobType::Service, vec![group("g", 1, 100, 64)]));
    let f = run(&s, "web").failed_tg_allocs["g"].clone();
    assert_eq!(f.reason, "no node is ready");
    assert_eq!(
        f.nodes_filtered,
        BTreeMap::from([
            ("node down".into(), 1),
            ("node draining".into(), 1),
            ("node initializing".into(), 1)
        ])
    );
    let mut empty = TestState::default();
    empty.register(spec("web", JobType::Service, vec![group("g", 1, 100, 64)]));
    assert_eq!(
        run(&empty, "web").failed_tg_allocs["g"].reason,
        "no node is ready"
    );

    // Mixed: the main reason first, the rest after it.
    let mut s = three_nodes();
    s.node_mut("a").status = NodeStatus::Down;
    s.register(spec(
        "big",
        JobType::Service,
        vec![group("g", 1, 100, 8192)],
    ));
    assert_eq!(
        run(&s, "big").failed_tg_allocs["g"].reason,
        "memory exhausted on 2 of 3 nodes; 1 of 3 nodes not ready"
    );
}

#[test]
fn a_stopped_or_purged_job_stops_everything_still_running() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report("web", ClientStatus::Running);
    // Already ended or already stopping: left alone.
    s.allocs[0].client_status = ClientStatus::Failed;
    s.allocs[1].desired_status = DesiredStatus::Stop;
    let down = s.allocs[2].node_id.clone();
    s.nodes.iter_mut().find(|n| n.id == down).unwrap().status = NodeStatus::Down;
    s.jobs.last_mut().unwrap().stop = true;
    let out = run(&s, "web");
    let stops = stopped(&out);
    assert_eq!(stops.len(), 1);
    assert_eq!(stops[0].alloc_id, s.allocs[2].id);
    assert_eq!(stops[0].desired_description, "job stopped");
    assert!(stops[0].lost, "its node is down");
    assert!(placed(&out).is_empty());
    assert!(out.queued_allocations.is_empty());

    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 2, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.jobs.clear();
    let out = run(&s, "web");
    assert_eq!(stopped(&out).len(), 2);
    assert!(
        stopped(&out)
            .iter()
            .all(|st| st.desired_description == "job purged")
    );
    assert_eq!(out.plan.job_modify_index, 0);
}

#[test]
fn a_group_removed_from_the_job_is_stopped() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 1, 100, 64), group("old", 2, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 1, 100, 64)],
    ));
    let out = run(&s, "web");
    let stops = stopped(&out);
    assert_eq!(stops.len(), 2);
    assert!(
        stops
            .iter()
            .all(|st| st.desired_description == "group removed from the job")
    );
    assert!(placed(&out).is_empty());
}

#[test]
fn the_same_evaluation_places_the_same_way() {
    let mut s = TestState::default();
    for i in 0..50 {
        s.add_node(node(&format!("n{i}"), 4000, 4096));
    }
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 20, 100, 64)],
    ));
    let where_ = |id: &str| -> Vec<String> {
        placed(&schedule(&s, &eval(&s, "web", id), SPREAD))
            .iter()
            .map(|a| a.node_name.clone())
            .collect()
    };
    assert_eq!(where_("eval-a"), where_("eval-a"));
    assert_ne!(where_("eval-a"), where_("eval-b"));
}

/// Placing is O(limit + skipped) per allocation, not O(nodes): 10,000 copies over
/// 5,000 nodes look at a bounded number of nodes each (counted, not timed).
#[test]
fn placing_visits_a_bounded_sample_of_nodes() {
    let mut s = TestState::default();
    for i in 0..5000 {
        s.add_node(node(&format!("n{i}"), 4000, 8192));
    }
    s.register(spec(
        "big",
        JobType::Service,
        vec![group("app", 10_000, 100, 64)],
    ));
    let job = s.job("default", "big").unwrap();
    let g = &job.spec.groups[0];
    let mut placer = Placer::new(&s, job, &[], "eval", SchedulerAlgorithm::BinPack);
    let mut per_node = vec![0u32; 5000];
    for _ in 0..10_000 {
        match placer.place(g, None, None) {
            Placed::Node(i) => per_node[i] += 1,
            _ => panic!("not placed"),
        }
    }
    // 13 candidates per placement (ceil(log2 5000)), and a few set aside.
    assert!(
        placer.visits <= 10_000 * (13 + 3),
        "visited {} nodes",
        placer.visits
    );
    assert!(per_node.iter().all(|&k| k <= 40), "no node is overfilled");
}

/// The whole of `schedule` at the size of the benchmark step: every copy placed,
/// no node over its capacity. The time is printed for `cargo test --release -- --nocapture`
/// (not asserted: the machine is shared).
#[test]
fn ten_thousand_allocations_over_five_thousand_nodes() {
    let mut s = TestState::default();
    for i in 0..5000 {
        s.add_node(node(&format!("n{i}"), 4000, 8192));
    }
    s.register(spec(
        "big",
        JobType::Service,
        vec![group("app", 10_000, 100, 64)],
    ));
    let started = std::time::Instant::now();
    let out = run(&s, "big");
    let took = started.elapsed();
    eprintln!(
        "schedule: 10000 allocations over 5000 nodes in {took:?} ({:.0} placements/s)",
        10_000.0 / took.as_secs_f64()
    );
    assert!(out.failed_tg_allocs.is_empty());
    let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
    for a in placed(&out) {
        *per_node.entry(a.node_id.as_str()).or_default() += a.resources.cpu;
    }
    assert_eq!(placed(&out).len(), 10_000);
    assert!(per_node.values().all(|&cpu| cpu <= 4000));
    let idx: BTreeSet<u32> = placed(&out).iter().map(|a| a.index).collect();
    assert_eq!(idx.len(), 10_000);
}

/// What one evaluation costs apart from its placements (node list, visiting order,
/// per-group tables): one-copy jobs over 5,000 nodes. Printed, not asserted.
#[test]
fn small_evaluations_over_many_nodes() {
    let mut s = TestState::default();
    for i in 0..5000 {
        s.add_node(node(&format!("n{i}"), 4000, 8192));
    }
    s.register(spec(
        "one",
        JobType::Service,
        vec![group("app", 1, 100, 64)],
    ));
    let rounds = 200;
    let started = std::time::Instant::now();
    for r in 0..rounds {
        let out = schedule(&s, &eval(&s, "one", &format!("e{r}")), BINPACK);
        assert_eq!(placed(&out).len(), 1);
    }
    let took = started.elapsed();
    eprintln!(
        "schedule: one-copy evaluation over 5000 nodes: {:?} each",
        took / rounds
    );
}

fn in_dc(mut n: Node, dc: &str) -> Node {
    n.datacenter = dc.into();
    n
}

fn dcs(patterns: &[&str]) -> Vec<String> {
    patterns.iter().map(|p| (*p).to_owned()).collect()
}

#[test]
fn a_job_is_placed_only_in_its_datacenters() {
    let mut s = TestState::default();
    for (name, dc) in [
        ("a", "dc1"),
        ("b", "eu-west"),
        ("c", "eu-east"),
        ("d", "us-east"),
    ] {
        s.add_node(in_dc(node(name, 4000, 4096), dc));
    }
    let mut j = spec("web", JobType::Service, vec![group("app", 6, 100, 64)]);
    j.datacenters = dcs(&["eu-*"]);
    s.register(j);
    let out = run_and_apply(&mut s, "web");
    assert!(
        out.failed_tg_allocs.is_empty(),
        "{:?}",
        out.failed_tg_allocs
    );
    let on: BTreeSet<String> = placed(&out).iter().map(|a| a.node_name.clone()).collect();
    assert_eq!(on, BTreeSet::from(["b".to_owned(), "c".to_owned()]));

    // No pattern at all: every datacenter.
    let mut j = spec("any", JobType::Service, vec![group("app", 8, 100, 64)]);
    j.datacenters = Vec::new();
    s.register(j);
    let on: BTreeSet<String> = placed(&run(&s, "any"))
        .iter()
        .map(|a| a.node_name.clone())
        .collect();
    assert_eq!(on.len(), 4, "{on:?}");

    // System jobs: one copy per node of the datacenters, nothing planned elsewhere.
    let mut j = spec("sys", JobType::System, vec![group("agent", 1, 100, 64)]);
    j.datacenters = dcs(&["dc1", "us-*"]);
    s.register(j);
    let out = run(&s, "sys");
    let on: BTreeSet<String> = placed(&out).iter().map(|a| a.node_name.clone()).collect();
    assert_eq!(on, BTreeSet::from(["a".to_owned(), "d".to_owned()]));
    assert_eq!(out.desired_tg_updates["agent"].place, 2);
    assert!(out.failed_tg_allocs.is_empty());
}

#[test]
fn no_node_in_the_datacenters_is_the_reason() {
    let mut s = three_nodes();
    let mut j = spec("web", JobType::Service, vec![group("app", 2, 100, 64)]);
    j.datacenters = dcs(&["dc2"]);
    s.register(j);
    let out = run(&s, "web");
    assert!(out.plan.is_empty());
    let f = &out.failed_tg_allocs["app"];
    assert_eq!(f.reason, "no node in datacenters [dc2]");
    assert_eq!(f.unplaced, 2);
    assert_eq!(f.nodes_evaluated, 3);
    assert_eq!(
        f.nodes_filtered,
        BTreeMap::from([("not in datacenters [dc2]".into(), 3)])
    );

    // Some nodes in the datacenters but full: both reasons, the bigger first.
    let mut s = three_nodes();
    s.add_node(in_dc(node("small", 4000, 100), "dc2"));
    let mut j = spec("big", JobType::Service, vec![group("app", 1, 100, 2048)]);
    j.datacenters = dcs(&["dc2", "dc3"]);
    s.register(j);
    let f = &run(&s, "big").failed_tg_allocs["app"];
    assert_eq!(
        f.reason,
        "3 of 4 nodes not in datacenters [dc2, dc3]; memory exhausted on 1 of 4 nodes"
    );
    assert_eq!(f.nodes_filtered["not in datacenters [dc2, dc3]"], 3);
    assert_eq!(f.nodes_exhausted["memory"], 1);
}

// --- ports ---------------------------------------------------------------------------

pub(crate) fn ports_group(name: &str, count: u32, ports: &[(&str, u32)]) -> TaskGroup {
    let mut g = group(name, count, 10, 10);
    g.network = Some(drover_server_api::NetworkSpec {
        mode: drover_server_api::NetworkMode::Host,
        ports: ports
            .iter()
            .map(|(label, static_port)| drover_server_api::PortSpec {
                label: (*label).into(),
                static_port: *static_port,
                ..Default::default()
            })
            .collect(),
    });
    g
}

pub(crate) fn with_range(mut n: Node, min: u16, max: u16, reserved: &[(u16, u16)]) -> Node {
    n.network = drover_server_api::NodeNetwork {
        address: format!("10.0.0.{}", n.name.len()),
        min_dynamic_port: min,
        max_dynamic_port: max,
        reserved_ports: reserved
            .iter()
            .map(|(first, last)| drover_server_api::PortRange {
                first: *first,
                last: *last,
            })
            .collect(),
    };
    n
}

#[test]
fn dynamic_ports_are_distinct_per_node_in_its_range_and_never_reserved() {
    let mut s = TestState::default();
    s.add_node(with_range(
        node("a", 4000, 4096),
        20000,
        20019,
        &[(20000, 20004)],
    ));
    s.add_node(with_range(
        node("bb", 4000, 4096),
        30000,
        30019,
        &[(30010, 30014)],
    ));
    // 3 dynamic ports per allocation (one mapped): the 15 free ports of each node
    // fit 5 allocations there, 10 in all.
    let mut g = ports_group("web", 10, &[("http", 0), ("admin", 0), ("metrics", 0)]);
    if let Some(net) = g.network.as_mut() {
        net.ports[1].to = 9090;
    }
    s.register(spec("web", JobType::Service, vec![g]));
    let out = run_and_apply(&mut s, "web");
    assert!(
        out.failed_tg_allocs.is_empty(),
        "{:?}",
        out.failed_tg_allocs
    );
    let live = s.live("web");
    assert_eq!(live.len(), 10);
    let mut per_node: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for a in &live {
        let node = s.node(&a.node_id).unwrap();
        assert_eq!(
            a.ports.iter().map(|p| p.label.as_str()).collect::<Vec<_>>(),
            ["http", "admin", "metrics"]
        );
        for p in &a.ports {
            let net = &node.network;
            assert!(
                (net.min_dynamic_port..=net.max_dynamic_port).contains(&p.value),
                "{p:?} outside the range of {}",
                node.name
            );
            assert!(
                !net.reserved_ports
                    .iter()
                    .any(|r| (r.first..=r.last).contains(&p.value)),
                "{p:?} is reserved on {}",
                node.name
            );
            assert_eq!(p.host_ip, net.address);
            per_node.entry(node.name.clone()).or_default().push(p.value);
        }
        assert_eq!(a.ports[0].to, a.ports[0].value);
        assert_eq!(a.ports[1].to, 9090);
    }
    for (name, mut ports) in per_node {
        let n = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), n, "a port given twice on {name}");
    }
    // Every free dynamic port is given: one more finds none.
    s.register(spec(
        "more",
        JobType::Service,
        vec![ports_group("g", 1, &[("http", 0)])],
    ));
    let out = run(&s, "more");
    let f = &out.failed_tg_allocs["g"];
    assert_eq!(f.reason, "no free dynamic port on 2 of 2 nodes");
    assert_eq!(
        f.nodes_exhausted,
        BTreeMap::from([("network: no free dynamic port".into(), 2)])
    );
}

#[test]
fn a_static_port_taken_on_the_only_node_places_one_and_says_why_for_the_rest() {
    let mut s = TestState::default();
    s.add_node(node("a", 4000, 4096));
    s.register(spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 3, &[("http", 8080)])],
    ));
    let out = run_and_apply(&mut s, "web");
    assert_eq!(placed(&out).len(), 1);
    assert_eq!(placed(&out)[0].ports[0].value, 8080);
    let f = &out.failed_tg_allocs["g"];
    assert_eq!(f.unplaced, 2);
    assert_eq!(f.reason, "port 8080 in use on 1 of 1 nodes");
    assert_eq!(
        f.nodes_exhausted,
        BTreeMap::from([("network: port 8080 in use".into(), 1)])
    );
    assert_eq!(out.queued_allocations["g"], 2);

    // Another job asking for the same port: the same reason, over every node.
    s.add_node(node("b", 4000, 4096));
    s.add_node(node("c", 4000, 4096));
    s.register(spec(
        "other",
        JobType::Service,
        vec![ports_group("g", 3, &[("http", 8080)])],
    ));
    let out = run_and_apply(&mut s, "other");
    assert_eq!(placed(&out).len(), 2);
    let f = &out.failed_tg_allocs["g"];
    assert_eq!(f.reason, "port 8080 in use on 3 of 3 nodes");
}

#[test]
fn a_reserved_static_port_is_never_given() {
    let mut s = TestState::default();
    s.add_node(with_range(
        node("a", 4000, 4096),
        20000,
        32000,
        &[(22, 22), (8000, 8100)],
    ));
    s.register(spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 1, &[("http", 8080)])],
    ));
    let out = run(&s, "web");
    assert!(placed(&out).is_empty());
    assert_eq!(
        out.failed_tg_allocs["g"].reason,
        "port 8080 reserved on 1 of 1 nodes"
    );
}

#[test]
fn a_stopped_allocation_frees_its_ports() {
    let mut s = TestState::default();
    s.add_node(node("a", 4000, 4096));
    s.register(spec(
        "one",
        JobType::Service,
        vec![ports_group("g", 1, &[("http", 8080)])],
    ));
    run_and_apply(&mut s, "one");
    s.register(spec(
        "two",
        JobType::Service,
        vec![ports_group("g", 1, &[("http", 8080)])],
    ));
    assert!(!run(&s, "two").failed_tg_allocs.is_empty());
    // The client reports the first one failed (its reschedule is due later): the port
    // is free.
    s.report("one", ClientStatus::Complete);
    let out = run(&s, "two");
    assert!(
        out.failed_tg_allocs.is_empty(),
        "{:?}",
        out.failed_tg_allocs
    );
    assert_eq!(placed(&out)[0].ports[0].value, 8080);

    // Within one plan: a destructive update on the only node stops the old copy and
    // gives its static port to the new one.
    let mut s = TestState::default();
    s.add_node(node("a", 4000, 4096));
    s.register(spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 1, &[("http", 8080)])],
    ));
    run_and_apply(&mut s, "web");
    let mut v2 = ports_group("g", 1, &[("http", 8080)]);
    v2.tasks[0].env.insert("V".into(), "2".into());
    s.register(spec("web", JobType::Service, vec![v2]));
    let out = run(&s, "web");
    assert_eq!(stopped(&out).len(), 1);
    assert_eq!(placed(&out).len(), 1, "{:?}", out.failed_tg_allocs);
    assert_eq!(placed(&out)[0].ports[0].value, 8080);
}

#[test]
fn an_unchanged_network_keeps_the_ports_and_a_changed_one_replaces_the_allocation() {
    let mut s = TestState::default();
    s.add_node(node("a", 4000, 4096));
    s.register(spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 2, &[("http", 0)])],
    ));
    run_and_apply(&mut s, "web");
    let before: Vec<(String, u16)> = s
        .live("web")
        .iter()
        .map(|a| (a.id.clone(), a.ports[0].value))
        .collect();
    // Metadata and count changes: nothing is replaced, the ports stay.
    let mut g = ports_group("g", 3, &[("http", 0)]);
    g.meta.insert("owner".into(), "ops".into());
    s.register(spec("web", JobType::Service, vec![g]));
    let out = run_and_apply(&mut s, "web");
    assert!(stopped(&out).is_empty());
    assert_eq!(placed(&out).len(), 1);
    let after: Vec<(String, u16)> = s
        .live("web")
        .iter()
        .map(|a| (a.id.clone(), a.ports[0].value))
        .collect();
    assert_eq!(after[..2], before[..]);
    assert_ne!(after[2].1, after[0].1);
    assert_ne!(after[2].1, after[1].1);
    // A new port label: every allocation is replaced (a destructive update).
    let mut v3 = spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 3, &[("http", 0), ("admin", 0)])],
    );
    v3.update.max_parallel = 0;
    s.register(v3);
    let out = run(&s, "web");
    assert_eq!(stopped(&out).len(), 3);
    assert_eq!(placed(&out).len(), 3);
    assert!(placed(&out).iter().all(|a| a.ports.len() == 2));
    assert_eq!(out.desired_tg_updates["g"].update, 3);
}

#[test]
fn a_system_job_with_a_taken_static_port_says_why_per_node() {
    let mut s = three_nodes();
    s.register(spec(
        "holder",
        JobType::Service,
        vec![ports_group("g", 1, &[("dns", 53)])],
    ));
    run_and_apply(&mut s, "holder");
    s.register(spec(
        "sys",
        JobType::System,
        vec![ports_group("g", 1, &[("dns", 53)])],
    ));
    let out = run(&s, "sys");
    assert_eq!(placed(&out).len(), 2);
    let f = &out.failed_tg_allocs["g"];
    assert_eq!(f.unplaced, 1);
    assert_eq!(f.reason, "port 53 in use on 1 of 3 nodes");
}

#[test]
fn the_static_ports_of_a_job_are_checked_against_the_nodes_that_could_run_it() {
    let a = with_range(node("a", 4000, 4096), 20000, 32000, &[]);
    let mut b = with_range(node("bb", 4000, 4096), 40000, 50000, &[]);
    b.drivers.clear();
    let web = |port: u32| {
        spec(
            "web",
            JobType::Service,
            vec![ports_group("g", 1, &[("http", port)])],
        )
    };
    // No node: the default range.
    let (field, msg) = super::ports::check_static_ports(&web(20500), &[]).unwrap_err();
    assert_eq!(field, "group[0].network.port[0].static");
    assert!(
        msg.contains("default dynamic port range 20000-32000"),
        "{msg}"
    );
    let (_, msg) = super::ports::check_static_ports(&web(20500), &[&a, &b]).unwrap_err();
    assert!(
        msg.contains("20500 is inside the dynamic port range 20000-32000 of node a"),
        "{msg}"
    );
    // Node bb has no rawexec: its range does not matter.
    assert!(super::ports::check_static_ports(&web(45000), &[&a, &b]).is_ok());
    assert!(super::ports::check_static_ports(&web(8080), &[&a, &b]).is_ok());
    // The same port asked twice by a group.
    let twice = spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 1, &[("http", 8080), ("alt", 8080)])],
    );
    let (field, msg) = super::ports::check_static_ports(&twice, &[&a]).unwrap_err();
    assert_eq!(field, "group[0].network.port[1].static");
    assert!(msg.contains("asked twice"), "{msg}");
}

#[test]
fn the_same_evaluation_picks_the_same_ports() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![ports_group("g", 6, &[("http", 0), ("grpc", 0)])],
    ));
    let ports = |out: &SchedulerOutput| -> Vec<Vec<u16>> {
        placed(out)
            .iter()
            .map(|a| a.ports.iter().map(|p| p.value).collect())
            .collect()
    };
    assert_eq!(ports(&run(&s, "web")), ports(&run(&s, "web")));
}

#[test]
fn a_service_job_rolls_out_through_a_deployment_its_placements_join() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    let out = run_and_apply(&mut s, "web");
    let d = out
        .plan
        .deployment
        .as_ref()
        .expect("a deployment for version 0");
    assert_eq!((d.job_version, d.groups["app"].desired_total), (0, 3));
    assert!(
        placed(&out)
            .iter()
            .all(|a| a.deployment_id.as_deref() == Some(d.id.as_str()))
    );
    assert_eq!(s.deployment("web").groups["app"].placed_allocs, 3);
    // A batch job has none.
    s.register(spec("b", JobType::Batch, vec![group("app", 1, 100, 64)]));
    let out = run(&s, "b");
    assert!(out.plan.deployment.is_none());
    assert!(placed(&out).iter().all(|a| a.deployment_id.is_none()));
}

#[test]
fn canaries_wait_next_to_the_old_copies_until_promoted_then_replace_them() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 3, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report_healthy("web");
    let mut v1 = changed_task(1);
    v1.groups[0].count = 3;
    v1.update.canary = 1;
    s.register(v1);
    let out = run_and_apply(&mut s, "web");
    assert!(stopped(&out).is_empty(), "canaries replace nothing yet");
    let canaries = placed(&out);
    assert_eq!(canaries.len(), 1);
    let canary = canaries[0].clone();
    assert!(
        canary
            .deployment_status
            .as_ref()
            .is_some_and(|st| st.canary)
    );
    assert_eq!(out.desired_tg_updates["app"].canary, 1);
    let d = s.deployment("web").clone();
    assert_eq!((d.job_version, d.groups["app"].desired_canaries), (1, 1));
    assert_eq!(
        d.groups["app"].placed_canaries,
        std::slice::from_ref(&canary.id)
    );
    assert_eq!(s.live("web").len(), 4, "three old copies and the canary");

    // Healthy, not promoted: still nothing.
    s.report_healthy("web");
    assert!(run(&s, "web").plan.is_empty());

    // Promoted: the copy at the canary's index goes, and the rollout goes on.
    s.deployments
        .iter_mut()
        .find(|x| x.id == d.id)
        .unwrap()
        .groups
        .get_mut("app")
        .unwrap()
        .promoted = true;
    let out = run_and_apply(&mut s, "web");
    let stops = stopped(&out);
    assert!(
        stops
            .iter()
            .any(|st| st.desired_description == format!("replaced by canary {}", canary.id)),
        "{stops:?}"
    );
    assert_eq!(placed(&out).len(), 1, "max_parallel 1 past the canary");
    s.report_healthy("web");
    run_and_apply(&mut s, "web");
    s.report_healthy("web");
    assert!(run(&s, "web").plan.is_empty());
    let live = s.live("web");
    assert_eq!(live.len(), 3);
    assert!(live.iter().all(|a| a.job_version == 1));
    let idx: BTreeSet<u32> = live.iter().map(|a| a.index).collect();
    assert_eq!(idx, BTreeSet::from([0, 1, 2]));
}

#[test]
fn a_failed_deployment_replaces_nothing_more() {
    let mut s = rolling_state(1);
    s.report_healthy("web");
    s.register(changed_task(1));
    let out = run_and_apply(&mut s, "web");
    assert_eq!(placed(&out).len(), 1);
    let id = s.deployment("web").id.clone();
    s.deployments
        .iter_mut()
        .find(|d| d.id == id)
        .unwrap()
        .status = DeploymentStatus::Failed;
    s.report_healthy("web");
    let out = run(&s, "web");
    assert!(out.plan.is_empty(), "{:?}", out.plan);
    assert_eq!(
        s.live("web").iter().filter(|a| a.job_version == 0).count(),
        3
    );
}

#[test]
fn an_unhealthy_copy_stops_the_rollout_before_the_watcher_fails_the_deployment() {
    let mut s = rolling_state(1);
    s.report_healthy("web");
    s.register(changed_task(1));
    run_and_apply(&mut s, "web");
    let id = s.deployment("web").id.clone();
    // The verdict is in (the client's report), the deployment still says running.
    for a in &mut s.allocs {
        if a.job_version == 1 {
            a.client_status = ClientStatus::Failed;
            a.deployment_status
                .get_or_insert_with(Default::default)
                .healthy = Some(false);
        }
    }
    s.deployments
        .iter_mut()
        .find(|d| d.id == id)
        .unwrap()
        .groups
        .get_mut("app")
        .unwrap()
        .unhealthy_allocs = 1;
    let out = run(&s, "web");
    assert!(
        stopped(&out).is_empty(),
        "no old copy is replaced: {:?}",
        out.plan
    );
}

#[test]
fn the_canaries_of_a_failed_deployment_are_stopped() {
    let mut s = three_nodes();
    s.register(spec(
        "web",
        JobType::Service,
        vec![group("app", 2, 100, 64)],
    ));
    run_and_apply(&mut s, "web");
    s.report_healthy("web");
    let mut v1 = changed_task(1);
    v1.groups[0].count = 2;
    v1.update.canary = 1;
    s.register(v1);
    let out = run_and_apply(&mut s, "web");
    let canary = placed(&out)[0].id.clone();
    let id = s.deployment("web").id.clone();
    s.deployments
        .iter_mut()
        .find(|d| d.id == id)
        .unwrap()
        .status = DeploymentStatus::Failed;
    let out = run(&s, "web");
    let stops = stopped(&out);
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0].alloc_id, canary);
    assert!(placed(&out).is_empty());
}

/// Host volumes (issue 27): a group is placed only on a node with every host volume it
/// asks for, writable where it wants to write; otherwise the reason names the volume.
#[test]
fn a_group_needing_a_host_volume_goes_where_the_volume_is() {
    let mut s = three_nodes();
    let mut g = group("db", 1, 100, 64);
    g.volumes.insert(
        "data".into(),
        drover_server_api::VolumeRequest {
            volume_type: "host".into(),
            source: "pgdata".into(),
            read_only: false,
            access_mode: String::new(),
            attachment_mode: String::new(),
        },
    );
    s.register(spec("web", JobType::Service, vec![g.clone()]));
    let out = run(&s, "web");
    let f = &out.failed_tg_allocs["db"];
    assert_eq!(f.reason, "missing host volume \"pgdata\" on 3 of 3 nodes");
    assert_eq!(
        f.nodes_filtered,
        BTreeMap::from([("missing host volume \"pgdata\"".into(), 3)])
    );
    // Offered read-only on b: not for a group that writes.
    let volume = |read_only| drover_server_api::HostVolume {
        path: "/srv/pgdata".into(),
        read_only,
    };
    s.nodes[1]
        .host_volumes
        .insert("pgdata".into(), volume(true));
    let out = run(&s, "web");
    let f = &out.failed_tg_allocs["db"];
    assert!(
        f.reason
            .contains("host volume \"pgdata\" is read-only on 1 of 3 nodes"),
        "{}",
        f.reason
    );
    // A read-only request fits there.
    let mut ro = g.clone();
    ro.volumes.get_mut("data").unwrap().read_only = true;
    s.register(spec("web", JobType::Service, vec![ro]));
    let out = run(&s, "web");
    assert_eq!(placed(&out)[0].node_name, "b");
    // Writable on c: the writing group goes there.
    s.nodes[2]
        .host_volumes
        .insert("pgdata".into(), volume(false));
    s.register(spec("web", JobType::Service, vec![g]));
    let out = run(&s, "web");
    assert_eq!(placed(&out)[0].node_name, "c");
}
