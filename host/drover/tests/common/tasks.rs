//! Helpers of the tests that drive tasks through the agent's HTTP API
//! (`drover_api::Client`): run a task, wait for its view, read its events.
#![allow(dead_code, unused_imports)]

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use drover_api::{RunRequest, TaskEventKind, TaskEventView, TaskView};
use drover_server_api::{
    AllocResources, Allocation, ClientAllocation, ClientStatus, DesiredStatus, JobType, Task,
    TaskGroup,
};

use crate::common::Agent;

#[allow(unused_imports)] // not every test binary that declares `common` uses it
pub use crate::common::rawexec_agent as agent;

/// A run request from its JSON, as a client would send it (the JSON must be one).
pub fn request(body: serde_json::Value) -> RunRequest {
    serde_json::from_value(body.clone())
        .unwrap_or_else(|e| panic!("not a run request ({e}): {body:#}"))
}

/// Run a task through the API; panics with the agent's answer and log if it refuses.
pub fn run(agent: &Agent, body: serde_json::Value) -> TaskView {
    let api = agent.api();
    api.block_on(api.run_task(&request(body)))
        .unwrap_or_else(|e| panic!("the agent refused the task: {e}\n{}", agent.log_text()))
}

/// The agent's own events of a task view, oldest first. What the driver says about the
/// task (`DriverMessage`, from its task events stream) comes in beside them, at times
/// only the driver knows: the lifecycle is told without them.
pub fn agent_events(task: &TaskView) -> Vec<&TaskEventView> {
    task.events
        .iter()
        .filter(|e| e.kind != TaskEventKind::DriverMessage)
        .collect()
}

/// Event types of [`agent_events`], oldest first.
pub fn kinds(task: &TaskView) -> Vec<String> {
    agent_events(task)
        .iter()
        .map(|e| e.kind.to_string())
        .collect()
}

/// The task's pid, from its attributes.
pub fn pid_of(task: &TaskView) -> Option<u32> {
    task.attributes.get("pid")?.parse().ok()
}

/// Poll the task until `cond` holds for its view, or panic after `within`.
pub fn until(
    agent: &Agent,
    id: &str,
    within: Duration,
    what: &str,
    cond: impl Fn(&TaskView) -> bool,
) -> TaskView {
    let api = agent.api();
    let deadline = Instant::now() + within;
    loop {
        let task = api.block_on(api.get_task(id));
        if let Ok(task) = &task
            && cond(task)
        {
            return task.clone();
        }
        assert!(
            Instant::now() < deadline,
            "task never {what}: {task:#?}\nagent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is a running process (a zombie is not: it only waits to be reaped,
/// which an orphan's init may never do in a container).
pub use drover_test_support::procs::alive as running;

/// Allocation `id` of job `web`, group `app` holding `tasks`, on node `n1`, as a
/// client receives it: the allocation runners' tests build theirs from it.
pub fn alloc(id: &str, job_type: JobType, tasks: Vec<Task>) -> ClientAllocation {
    let group = TaskGroup {
        volumes: Default::default(),
        update: Default::default(),
        network: Default::default(),
        services: Default::default(),
        reschedule: None,
        name: "app".into(),
        count: 1,
        constraints: vec![],
        meta: BTreeMap::new(),
        tasks,
    };
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
            node_id: "node-1".into(),
            node_name: "n1".into(),
            resources: AllocResources::default(),
            desired_status: DesiredStatus::Run,
            desired_description: String::new(),
            client_status: ClientStatus::Pending,
            client_description: String::new(),
            task_states: BTreeMap::new(),
            eval_id: "e1".into(),
            previous_allocation: None,
            next_allocation: None,
            create_index: 1,
            modify_index: 1,
            alloc_modify_index: 1,
            create_time: 0,
            modify_time: 0,
        },
        job_type,
        group,
        job_meta: BTreeMap::new(),
        region: drover_server_api::DEFAULT_REGION.to_owned(),
        identities: BTreeMap::new(),
        csi_volumes: BTreeMap::new(),
    }
}
