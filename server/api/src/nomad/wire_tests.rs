//! The served objects in Nomad's shape: what a real Nomad 1.0.18 dev agent answered
//! decodes (the fixtures under `tests/fixtures/nomad/`), and Drover's objects survive
//! the trip to the wire and back.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::json;

use super::job_tests::{Rng, sample_spec};
use super::*;
use crate::types::{self as internal, ClientStatus, DesiredStatus, EvalStatus, EvalTrigger};

fn fixture<T: DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/nomad/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// --- what a Nomad server answers decodes --------------------------------------------

#[test]
fn nomads_job_list_and_summary_decode() {
    let jobs: Vec<JobListStub> = fixture("jobs.json");
    let stub = internal::JobListStub::from(&jobs[0]);
    assert_eq!(stub.name, "fixture");
    assert_eq!(stub.status, internal::JobStatus::Running);
    assert_eq!(stub.summary["g"].running, 2);
    assert_eq!(jobs[0].submit_time, 1_795_920_765_818_464_810);
    let summary: JobSummary = fixture("job-summary.json");
    assert_eq!(summary.summary["g"].running, 2);
    let versions: JobVersionsResponse = fixture("job-versions.json");
    assert_eq!(versions.versions[0].id.as_deref(), Some("fixture"));
    let job: Job = fixture("job.json");
    let stored = job.to_internal().unwrap();
    assert_eq!((stored.version, stored.job_modify_index), (0, 10));
}

#[test]
fn nomads_register_deregister_and_plan_answers_decode() {
    let r: JobRegisterResponse = fixture("register-response.json");
    let r = internal::JobRegisterResponse::from(&r);
    assert_eq!(r.eval_id, "3389fb8c-b857-1834-3ed8-bd2053db8623");
    assert_eq!((r.index, r.job_modify_index), (10, 10));
    assert!(r.warnings.is_empty());
    let d: JobDeregisterResponse = fixture("deregister-response.json");
    assert_eq!(d.eval_create_index, 26);
    let plan: JobPlanResponse = fixture("plan-response.json");
    let plan = internal::JobPlanResponse::from(&plan);
    assert!(plan.changed);
    assert_eq!(plan.groups["g"].place, 1);
    let plan: JobPlanResponse = fixture("plan-response-failed.json");
    let plan = internal::JobPlanResponse::from(&plan);
    let failed = &plan.failed_tg_allocs["g"];
    assert_eq!(failed.unplaced, 3, "CoalescedFailures 2 + the one reported");
    assert_eq!(failed.nodes_exhausted["memory"], 1);
    assert!(failed.reason.contains("memory"), "{}", failed.reason);
}

#[test]
fn nomads_allocations_decode_with_their_task_states() {
    let a: Allocation = fixture("allocation.json");
    assert!(a.job.is_some(), "the embedded job decodes");
    let a = a.to_internal();
    assert_eq!((a.job_name.as_str(), a.group.as_str()), ("fixture", "g"));
    assert_eq!(a.index, alloc_index_of(&a.name));
    assert_eq!(a.client_status, ClientStatus::Running);
    assert_eq!(a.desired_status, DesiredStatus::Run);
    assert_eq!((a.resources.cpu, a.resources.memory_mb), (50, 32));
    let t = &a.task_states["t"];
    assert_eq!(t.state, internal::TaskRunState::Running);
    assert_eq!(t.starts, 1);
    assert!(t.started_at.is_some() && t.finished_at.is_none());

    let failed: Allocation = fixture("allocation-failed.json");
    let failed = failed.to_internal();
    assert_eq!(failed.client_status, ClientStatus::Failed);
    let t = &failed.task_states["t"];
    assert_eq!(t.state, internal::TaskRunState::Dead);
    assert!(t.failed);
    assert_eq!(t.exit_code, Some(3), "from the Terminated event");
    assert_eq!(t.message, "Policy allows no restarts");

    let stubs: Vec<AllocationListStub> = fixture("job-allocations.json");
    assert_eq!(stubs.len(), 2);
    for s in &stubs {
        let a = s.to_internal();
        assert_eq!(a.job_name, "fixture");
        assert_eq!(a.client_status, ClientStatus::Running);
        assert_eq!(s.job_type, "service");
    }
    let on_node: Vec<Allocation> = fixture("node-allocations.json");
    assert!(!on_node.is_empty());
}

#[test]
fn nomads_evaluations_decode() {
    let e: Evaluation = fixture("evaluation.json");
    let e = e.to_internal();
    assert_eq!(e.triggered_by, EvalTrigger::JobRegister);
    assert_eq!(e.status, EvalStatus::Complete);
    assert_eq!(e.queued_allocations["g"], 0);
    let evals: Vec<Evaluation> = fixture("job-evaluations-blocked.json");
    let blocked = evals[0].to_internal();
    assert_eq!(blocked.status, EvalStatus::Blocked);
    assert_eq!(blocked.triggered_by, EvalTrigger::QueuedAllocs);
    let placed = evals[1].to_internal();
    assert_eq!(placed.blocked_eval.as_deref(), Some(evals[0].id.as_str()));
    assert_eq!(placed.failed_tg_allocs["g"].unplaced, 2);
    let _: Vec<Evaluation> = fixture("job-evaluations.json");
}

#[test]
fn nomads_nodes_decode() {
    let n: Node = fixture("node.json");
    let n = n.to_internal();
    assert_eq!(n.datacenter, "dc1");
    assert_eq!(n.status, internal::NodeStatus::Ready);
    assert!(n.resources.cpu > 0 && n.resources.memory_mb > 0);
    assert!(n.drivers["raw_exec"].healthy);
    assert!(n.attributes.contains_key("kernel.name"));
    assert!(n.status_updated_at > 1_000_000_000 * 1_000_000_000_i64);
    let stubs: Vec<NodeListStub> = fixture("nodes.json");
    let s = stubs[0].to_internal();
    assert_eq!(s.id, stubs[0].id);
    assert_eq!(stubs[0].version, "1.0.18");
}

// --- Drover's objects on the wire ----------------------------------------------------

#[test]
fn a_dead_task_has_a_terminated_event_with_its_exit_code_and_message() {
    let t = internal::TaskState {
        state: internal::TaskRunState::Dead,
        failed: true,
        exit_code: Some(3),
        restarts: 1,
        starts: 2,
        started_at: Some("2026-01-02T03:04:05.000000006Z".into()),
        finished_at: Some("2026-01-02T03:04:07Z".into()),
        task_id: "abc.t.1".into(),
        message: "exited with code 3".into(),
    };
    let wire = serde_json::to_value(TaskState::from(&t)).unwrap();
    assert_eq!(wire["State"], "dead");
    assert_eq!(wire["Failed"], true);
    assert_eq!(wire["Restarts"], 1);
    assert_eq!(wire["StartedAt"], "2026-01-02T03:04:05.000000006Z");
    assert_eq!(wire["TaskID"], "abc.t.1");
    let events = wire["Events"].as_array().unwrap();
    assert_eq!(events[0]["Type"], "Started");
    let last = events.last().unwrap();
    assert_eq!(last["Type"], "Terminated");
    assert_eq!(last["ExitCode"], 3);
    assert_eq!(last["FailsTask"], true);
    assert_eq!(
        last["DisplayMessage"],
        "Exit Code: 3, Exit Message: \"exited with code 3\""
    );
    assert_eq!(last["Time"], 1_767_323_047_000_000_000_i64);
}

#[test]
fn a_draining_node_is_ready_and_ineligible_as_nomad_says_it() {
    let mut n = sample_node(&mut Rng(1));
    n.status = internal::NodeStatus::Draining;
    n.drain = true;
    let v = serde_json::to_value(Node::from(&n)).unwrap();
    assert_eq!(v["Status"], "ready");
    assert_eq!(v["Drain"], true);
    assert_eq!(v["SchedulingEligibility"], "ineligible");
    assert!(v["DrainStrategy"].is_object());
    // Without Drover's extra key, Nomad's words still read as draining.
    let mut stripped = v.clone();
    stripped.as_object_mut().unwrap().remove("DroverStatus");
    let back: Node = serde_json::from_value(stripped).unwrap();
    assert_eq!(back.to_internal().status, internal::NodeStatus::Draining);
}

#[test]
fn job_list_stub_and_summary_carry_nomads_counts() {
    let spec = sample_spec(&mut Rng(11));
    let job = internal::Job {
        stable: Default::default(),
        spec,
        version: 2,
        stop: false,
        status: internal::JobStatus::Running,
        submit_time: 5,
        create_index: 1,
        modify_index: 3,
        job_modify_index: 2,
    };
    let summary = BTreeMap::from([(
        "g".to_owned(),
        internal::GroupSummary {
            queued: 1,
            pending: 2,
            running: 3,
            complete: 4,
            failed: 5,
            lost: 6,
        },
    )]);
    let v = serde_json::to_value(JobListStub::new(&job, &summary)).unwrap();
    assert_eq!(v["ID"], job.spec.name);
    assert_eq!(v["Status"], "running");
    assert_eq!(
        v["JobSummary"]["Summary"]["g"],
        json!({"Queued": 1, "Starting": 2, "Running": 3, "Complete": 4, "Failed": 5, "Lost": 6})
    );
    let back: JobListStub = serde_json::from_value(v).unwrap();
    let internal_stub = internal::JobListStub::from(&back);
    assert_eq!(internal_stub.summary, summary);
    assert_eq!(internal_stub.version, 2);
}

#[test]
fn register_and_plan_answers_round_trip() {
    let r = internal::JobRegisterResponse {
        eval_id: "e1".into(),
        job_modify_index: 4,
        index: 9,
        warnings: vec!["one".into(), "two".into()],
    };
    let wire = JobRegisterResponse::from(&r);
    assert_eq!(wire.warnings, "one\ntwo");
    assert_eq!(wire.eval_create_index, 9);
    assert_eq!(internal::JobRegisterResponse::from(&wire), r);
    let plan = internal::JobPlanResponse {
        job_version: 3,
        changed: true,
        groups: BTreeMap::from([(
            "g".into(),
            internal::GroupPlanSummary {
                canary: Default::default(),
                place: 1,
                stop: 2,
                update: 3,
                ignore: 4,
            },
        )]),
        failed_tg_allocs: BTreeMap::from([("g".into(), sample_failure(&mut Rng(5)))]),
        job_modify_index: 7,
    };
    let wire = JobPlanResponse::new("j", &plan, true, &[]);
    let v = serde_json::to_value(&wire).unwrap();
    assert_eq!(v["Diff"]["Type"], "Edited");
    assert_eq!(
        v["Annotations"]["DesiredTGUpdates"]["g"]["DestructiveUpdate"],
        3
    );
    let back: JobPlanResponse = serde_json::from_value(v).unwrap();
    assert_eq!(internal::JobPlanResponse::from(&back), plan);
}

#[test]
fn allocations_evaluations_and_nodes_round_trip_over_varied_values() {
    let mut rng = Rng(0xa11c);
    for round in 0..300 {
        let a = sample_alloc(&mut rng);
        let json = serde_json::to_string(&Allocation::from(&a)).unwrap();
        let back: Allocation = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_internal(), a, "round {round}: {json}");

        let e = sample_eval(&mut rng);
        let json = serde_json::to_string(&Evaluation::from(&e)).unwrap();
        let back: Evaluation = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_internal(), e, "round {round}: {json}");

        let n = sample_node(&mut rng);
        let json = serde_json::to_string(&Node::from(&n)).unwrap();
        let back: Node = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_internal(), n, "round {round}: {json}");
    }
}

// --- generators -------------------------------------------------------------------------

fn opt_word(rng: &mut Rng) -> Option<String> {
    rng.bool().then(|| rng.word())
}

fn time(rng: &mut Rng) -> i64 {
    // 2001 .. 2065, nanoseconds.
    1_000_000_000_000_000_000 + rng.below(2_000_000_000_000_000_000) as i64
}

fn sample_failure(rng: &mut Rng) -> internal::PlacementFailure {
    internal::PlacementFailure {
        unplaced: 1 + rng.below(9) as u32,
        reason: rng.word(),
        nodes_evaluated: rng.below(100) as u32,
        nodes_filtered: (0..rng.below(3))
            .map(|_| (rng.word(), rng.below(50) as u32))
            .collect(),
        nodes_exhausted: (0..rng.below(3))
            .map(|_| (rng.word(), rng.below(50) as u32))
            .collect(),
    }
}

fn sample_task_state(rng: &mut Rng) -> internal::TaskState {
    use internal::TaskRunState::*;
    let state = [Pending, Running, Dead][rng.below(3) as usize];
    let stamp = |rng: &mut Rng| rfc3339_from_nanos(time(rng));
    internal::TaskState {
        state,
        failed: rng.bool(),
        exit_code: rng.bool().then(|| rng.below(256) as i32 - 1),
        restarts: rng.below(5) as u32,
        starts: rng.below(6) as u32,
        started_at: rng.bool().then(|| stamp(rng)),
        finished_at: rng.bool().then(|| stamp(rng)),
        task_id: if rng.bool() {
            rng.word()
        } else {
            String::new()
        },
        message: if rng.bool() {
            rng.word()
        } else {
            String::new()
        },
    }
}

fn sample_alloc(rng: &mut Rng) -> internal::Allocation {
    let index = rng.below(20) as u32;
    let job = rng.word();
    let group = rng.word();
    internal::Allocation {
        task_devices: Default::default(),
        namespace: crate::DEFAULT_NAMESPACE.into(),
        deployment_id: Default::default(),
        deployment_status: Default::default(),
        ports: Default::default(),
        id: rng.word(),
        name: format!("{job}.{group}[{index}]"),
        index,
        job_name: job,
        job_version: rng.below(10),
        group,
        node_id: rng.word(),
        node_name: rng.word(),
        resources: internal::AllocResources {
            cpu: rng.below(100_000),
            memory_mb: rng.below(100_000),
        },
        desired_status: if rng.bool() {
            DesiredStatus::Run
        } else {
            DesiredStatus::Stop
        },
        desired_description: rng.word(),
        client_status: [
            ClientStatus::Pending,
            ClientStatus::Running,
            ClientStatus::Complete,
            ClientStatus::Failed,
            ClientStatus::Lost,
        ][rng.below(5) as usize],
        client_description: rng.word(),
        task_states: (0..rng.below(3))
            .map(|_| (rng.word(), sample_task_state(rng)))
            .collect(),
        eval_id: rng.word(),
        previous_allocation: opt_word(rng),
        next_allocation: opt_word(rng),
        reschedule_events: (0..rng.below(3))
            .map(|_| internal::RescheduleEvent {
                time: time(rng),
                prev_alloc_id: rng.word(),
                delay: Duration::from_nanos(rng.below(1 << 40)),
            })
            .collect(),
        create_index: rng.below(1000),
        modify_index: rng.below(1000),
        alloc_modify_index: rng.below(1000),
        create_time: time(rng),
        modify_time: time(rng),
    }
}

fn sample_eval(rng: &mut Rng) -> internal::Evaluation {
    use EvalTrigger::*;
    let triggers = [
        JobRegister,
        JobDeregister,
        NodeUpdate,
        NodeDrain,
        AllocFailure,
        QueuedAllocs,
        RollingUpdate,
        MaxPlanAttempts,
    ];
    let statuses = [
        EvalStatus::Pending,
        EvalStatus::Blocked,
        EvalStatus::Complete,
        EvalStatus::Failed,
        EvalStatus::Canceled,
    ];
    internal::Evaluation {
        namespace: crate::DEFAULT_NAMESPACE.into(),
        id: rng.word(),
        job_name: rng.word(),
        job_type: [
            internal::JobType::Service,
            internal::JobType::Batch,
            internal::JobType::System,
        ][rng.below(3) as usize],
        priority: rng.below(101) as u8,
        triggered_by: triggers[rng.below(triggers.len() as u64) as usize],
        status: statuses[rng.below(statuses.len() as u64) as usize],
        status_description: if rng.bool() {
            rng.word()
        } else {
            String::new()
        },
        node_id: opt_word(rng),
        failed_tg_allocs: (0..rng.below(3))
            .map(|_| (rng.word(), sample_failure(rng)))
            .collect(),
        queued_allocations: (0..rng.below(3))
            .map(|_| (rng.word(), rng.below(100) as u32))
            .collect(),
        blocked_eval: opt_word(rng),
        previous_eval: opt_word(rng),
        wait_until: rng.bool().then(|| time(rng)),
        job_modify_index: rng.below(1000),
        create_index: rng.below(1000),
        modify_index: rng.below(1000),
        create_time: time(rng),
        modify_time: time(rng),
    }
}

fn sample_node(rng: &mut Rng) -> internal::Node {
    use internal::NodeStatus::*;
    internal::Node {
        devices: Default::default(),
        host_volumes: Default::default(),
        csi_plugins: Default::default(),
        network: Default::default(),
        id: rng.word(),
        name: rng.word(),
        datacenter: rng.word(),
        status: [Initializing, Ready, Down, Draining][rng.below(4) as usize],
        status_description: if rng.bool() {
            rng.word()
        } else {
            String::new()
        },
        drain: rng.bool(),
        ineligible: false,
        attributes: rng.map(),
        meta: rng.map(),
        resources: internal::NodeResources {
            cpu: rng.below(1_000_000),
            memory_mb: rng.below(1_000_000),
        },
        drivers: (0..rng.below(3))
            .map(|_| {
                (
                    rng.word(),
                    internal::DriverInfo {
                        detected: rng.bool(),
                        healthy: rng.bool(),
                        health_description: if rng.bool() {
                            rng.word()
                        } else {
                            String::new()
                        },
                        attributes: rng.map(),
                    },
                )
            })
            .collect(),
        status_updated_at: time(rng),
        create_index: rng.below(1000),
        modify_index: rng.below(1000),
    }
}

#[test]
fn nomads_drain_answer_and_drover_drain_request_have_nomads_shape() {
    let r: NodeDrainUpdateResponse = fixture("node-drain-response.json");
    assert_eq!((r.index, r.node_modify_index), (74, 74));
    let start = NodeDrainRequest {
        node_id: "n1".into(),
        drain_spec: Some(DrainSpec::default()),
        mark_eligible: false,
        meta: None,
    };
    let v = serde_json::to_value(&start).unwrap();
    assert_eq!(
        v["DrainSpec"],
        json!({"Deadline": 0, "IgnoreSystemJobs": false})
    );
    let end: NodeDrainRequest =
        serde_json::from_value(json!({"NodeID": "n1", "DrainSpec": null, "MarkEligible": true}))
            .unwrap();
    assert!(end.drain_spec.is_none() && end.mark_eligible);
}
