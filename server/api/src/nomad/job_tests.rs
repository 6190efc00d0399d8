//! Jobs in Nomad's shape: what `nomad job run -output` prints converts into the spec
//! Drover runs, what Drover cannot run yet is refused by name, and a spec survives the
//! trip to the wire and back.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_api::{LogConfig as InternalLogConfig, RestartMode, RestartPolicy as InternalRestart};
use serde_json::json;

use super::*;
use crate::types::{self as internal, ConstraintOperator, JobType, LifecycleHook};

fn fixture(name: &str) -> JobRegisterRequest {
    let path = format!("{}/tests/fixtures/nomad/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parse(v: serde_json::Value) -> Result<ParsedJob, ConversionError> {
    let req: JobRegisterRequest = serde_json::from_value(v).expect("decodes");
    req.job.to_spec()
}

#[test]
fn nomad_job_run_output_of_a_service_job_converts_to_its_spec() {
    let parsed = fixture("job-run-output-web.json").job.to_spec().unwrap();
    assert_eq!(parsed.region, None);
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    let spec = parsed.spec;
    assert_eq!(spec.name, "web");
    assert_eq!(spec.job_type, JobType::Service);
    assert_eq!(spec.priority, 50);
    assert_eq!(spec.datacenters, ["dc1"]);
    assert_eq!(spec.meta, BTreeMap::from([("owner".into(), "x".into())]));
    assert_eq!(spec.update.max_parallel, 2);
    let g = &spec.groups[0];
    assert_eq!((g.name.as_str(), g.count), ("g", 2));
    let t = &g.tasks[0];
    assert_eq!((t.name.as_str(), t.driver.as_str()), ("t", "raw_exec"));
    assert_eq!(
        t.config,
        json!({"command": "/bin/sh", "args": ["-c", "echo hi; sleep 1000"]})
    );
    assert_eq!(t.env, BTreeMap::from([("A".into(), "b".into())]));
    assert_eq!((t.resources.cpu, t.resources.memory_mb), (50, 32));
    assert_eq!(t.kill_timeout, Some(Duration::from_secs(7)));
    // The group's restart block, with Nomad's service defaults for what it leaves out.
    assert_eq!(
        t.restart,
        Some(InternalRestart {
            attempts: 3,
            interval: Duration::from_secs(30 * 60),
            delay: Duration::from_secs(10),
            mode: RestartMode::Fail,
        })
    );
    assert_eq!(t.logs, None);
    assert_eq!(t.lifecycle, None);
    crate::validate(&spec).expect("a spec Drover accepts");
}

#[test]
fn nomad_job_run_output_of_a_batch_job_with_a_prestart_task_converts() {
    let spec = fixture("job-run-output-batch.json")
        .job
        .to_spec()
        .unwrap()
        .spec;
    assert_eq!(spec.job_type, JobType::Batch);
    assert_eq!(spec.priority, 70);
    assert_eq!(spec.datacenters, ["dc1", "eu-*"]);
    assert_eq!(
        spec.constraints,
        [internal::Constraint {
            attribute: "${attr.kernel.name}".into(),
            operator: ConstraintOperator::Equal,
            value: "linux".into(),
        }]
    );
    let g = &spec.groups[0];
    assert_eq!(g.meta, BTreeMap::from([("g".into(), "1".into())]));
    assert_eq!(g.constraints[0].operator, ConstraintOperator::DistinctHosts);
    // The job's reschedule block over the batch defaults (a longer delay lifts the
    // default limit of the doubling).
    assert_eq!(
        g.reschedule,
        Some(internal::ReschedulePolicy {
            attempts: 2,
            interval: Duration::from_secs(3600),
            delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(10),
            unlimited: false,
        })
    );
    let setup = &g.tasks[0];
    assert_eq!(
        setup.lifecycle,
        Some(internal::Lifecycle {
            hook: LifecycleHook::Prestart,
            sidecar: false
        })
    );
    assert_eq!(
        setup.restart, None,
        "no restart block anywhere: Drover's default"
    );
    let main = &g.tasks[1];
    assert_eq!(main.driver, "exec");
    assert_eq!(main.config["args"], json!(["${NOMAD_ALLOC_INDEX}"]));
    assert_eq!(main.meta, BTreeMap::from([("t".into(), "x".into())]));
    assert_eq!(main.kill_signal.as_deref(), Some("SIGINT"));
    assert_eq!(
        main.logs,
        Some(InternalLogConfig {
            max_files: 3,
            max_file_size_mb: 5
        })
    );
    // Batch defaults for what the task's restart block leaves out.
    assert_eq!(
        main.restart,
        Some(InternalRestart {
            attempts: 0,
            interval: Duration::from_secs(24 * 3600),
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        })
    );
    assert_eq!((main.resources.cpu, main.resources.memory_mb), (200, 64));
    crate::validate(&spec).expect("a spec Drover accepts");
}

#[test]
fn a_group_network_from_nomad_becomes_the_groups_ports() {
    let spec = fixture("job-run-output-docker-network.json")
        .job
        .to_spec()
        .unwrap()
        .spec;
    assert_eq!(
        spec.groups[0].network,
        Some(internal::NetworkSpec {
            mode: internal::NetworkMode::Host,
            ports: vec![internal::PortSpec {
                label: "http".into(),
                static_port: 5678,
                host_network: "default".into(),
                ..Default::default()
            }],
        })
    );
    let spec = fixture("job-run-output-init-short.json")
        .job
        .to_spec()
        .unwrap()
        .spec;
    assert_eq!(
        spec.groups[0].network.as_ref().map(|n| n.ports.clone()),
        Some(vec![internal::PortSpec {
            label: "db".into(),
            to: 6379,
            host_network: "default".into(),
            ..Default::default()
        }])
    );
    crate::validate(&spec).expect("a spec Drover accepts");
}

#[test]
fn a_partial_job_as_python_nomad_users_write_it_gets_nomads_defaults() {
    let parsed = parse(json!({"Job": {
        "ID": "x",
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec",
            "Config": {"command": "/bin/sleep", "args": ["60"]}}]}]
    }}))
    .unwrap();
    let spec = parsed.spec;
    assert_eq!(spec.name, "x");
    assert_eq!(spec.job_type, JobType::Service);
    assert_eq!(spec.priority, 50);
    assert!(spec.datacenters.is_empty());
    assert_eq!(spec.update, internal::UpdateStrategy::default());
    let g = &spec.groups[0];
    assert_eq!(g.count, 1);
    assert_eq!(g.reschedule, None);
    let t = &g.tasks[0];
    assert_eq!(t.resources, internal::TaskResources::default());
    assert_eq!(t.restart, None);
    assert_eq!(t.kill_timeout, None);
    assert_eq!(t.kill_signal, None);
    crate::validate(&spec).expect("valid");
}

#[test]
fn snake_case_and_lowercase_keys_are_read_as_go_reads_them() {
    let spec = parse(json!({"job": {
        "id": "x", "type": "batch", "datacenters": ["dc1"],
        "task_groups": [{"name": "g", "count": 3, "tasks": [{"name": "t", "driver": "raw_exec",
            "resources": {"cpu": 10, "memory_mb": 20}, "kill_timeout": "3s",
            "restart_policy": {"attempts": 1, "delay": 2000000000}}]}]
    }}))
    .unwrap()
    .spec;
    assert_eq!(spec.job_type, JobType::Batch);
    let t = &spec.groups[0].tasks[0];
    assert_eq!(spec.groups[0].count, 3);
    assert_eq!((t.resources.cpu, t.resources.memory_mb), (10, 20));
    assert_eq!(t.kill_timeout, Some(Duration::from_secs(3)));
    assert_eq!(
        t.restart.as_ref().map(|r| r.delay),
        Some(Duration::from_secs(2))
    );
}

#[test]
fn artifacts_and_templates_in_nomads_json_convert_and_bad_ones_name_the_field() {
    let mut job = json!({"ID": "x", "TaskGroups": [{"Name": "g",
        "Tasks": [{"Name": "t", "Driver": "raw_exec", "Resources": {}}]}]});
    job.pointer_mut("/TaskGroups/0/Tasks/0").unwrap()["Artifacts"] = json!([{
        "GetterSource": "https://example.com/tool",
        "GetterMode": "file",
        "GetterOptions": {"checksum": format!("sha512:{}", "ab".repeat(64))},
    }]);
    job.pointer_mut("/TaskGroups/0/Tasks/0").unwrap()["Templates"] = json!([{
        "EmbeddedTmpl": "x", "DestPath": "local/x", "ChangeMode": "signal",
        "ChangeSignal": "sighup", "Splay": 1_000_000_000_i64, "Perms": "0600",
        "VaultGrace": 0, "Uid": null,
    }]);
    let spec = parse(json!({ "Job": job.clone() })).expect("converts").spec;
    let t = &spec.groups[0].tasks[0];
    // A file with no destination goes to local/<its name>, as Nomad's API has it.
    assert_eq!(t.artifacts[0].destination, "local/tool");
    assert_eq!(t.artifacts[0].mode, crate::ArtifactMode::File);
    assert_eq!(t.templates[0].change_signal.as_deref(), Some("SIGHUP"));
    assert_eq!(t.templates[0].splay, std::time::Duration::from_secs(1));
    crate::validate(&spec).expect("valid");

    let mut bad = job.clone();
    bad.pointer_mut("/TaskGroups/0/Tasks/0/Artifacts/0")
        .unwrap()["GetterMode"] = json!("weird");
    let e = parse(json!({ "Job": bad })).unwrap_err();
    assert_eq!(
        e.path, "TaskGroups[0].Tasks[0].Artifacts[0].GetterMode",
        "{e}"
    );
    let mut bad = job.clone();
    bad.pointer_mut("/TaskGroups/0/Tasks/0/Templates/0")
        .unwrap()["ChangeScript"] = json!({"Command": "/bin/true"});
    let e = parse(json!({ "Job": bad })).unwrap_err();
    assert_eq!(
        e.path, "TaskGroups[0].Tasks[0].Templates[0].ChangeScript",
        "{e}"
    );
    let mut bad = job;
    bad.pointer_mut("/TaskGroups/0/Tasks/0/Templates/0")
        .unwrap()["ChangeMode"] = json!("script");
    let e = parse(json!({ "Job": bad })).unwrap_err();
    assert_eq!(
        e.path, "TaskGroups[0].Tasks[0].Templates[0].ChangeMode",
        "{e}"
    );
}

#[test]
fn an_identity_in_nomads_json_converts_both_ways_and_unknown_keys_are_named() {
    let job = |identity: serde_json::Value| {
        json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g",
            "Tasks": [{"Name": "t", "Driver": "exec", "Resources": {}, "Identity": identity}]}]}})
    };
    let spec = parse(job(json!({"Env": true, "File": false})))
        .expect("converts")
        .spec;
    let want = crate::TaskIdentity {
        env: true,
        file: false,
    };
    assert_eq!(spec.groups[0].tasks[0].identity, Some(want));
    let wire = crate::nomad::Job::from(&spec);
    let again = wire.to_spec().expect("converts back").spec;
    assert_eq!(again.groups[0].tasks[0].identity, Some(want));
    // Null (what Nomad sends for a task without the block): the default.
    let spec = parse(job(serde_json::Value::Null)).expect("converts").spec;
    assert_eq!(
        spec.groups[0].tasks[0].identity(),
        crate::TaskIdentity::DEFAULT
    );
    let e = parse(job(json!({"Env": true, "Audience": ["x"]}))).unwrap_err();
    assert_eq!(e.path, "TaskGroups[0].Tasks[0].Identity.Audience", "{e}");
}

#[test]
fn unsupported_fields_with_a_value_are_errors_naming_the_field() {
    let base = || {
        json!({"ID": "x", "TaskGroups": [{"Name": "g",
            "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Services": [{"PortLabel": "http", "Checks": [{"Type": "tcp"}]}],
            "Tasks": [{"Name": "t", "Driver": "raw_exec", "Resources": {}}]}]})
    };
    let cases = [
        (
            "/TaskGroups/0",
            "Volumes",
            json!({"v": {"Type": "host", "Source": "s", "PerAlloc": true}}),
            "TaskGroups[0].Volumes[\"v\"].PerAlloc",
        ),
        (
            "/TaskGroups/0/Tasks/0",
            "Vault",
            json!({"Policies": ["p"]}),
            "TaskGroups[0].Tasks[0].Vault",
        ),
        ("", "Periodic", json!({"Spec": "* * * * *"}), "Periodic"),
        (
            "",
            "ParameterizedJob",
            json!({"Payload": "required"}),
            "ParameterizedJob",
        ),
        ("", "Affinities", json!([{"LTarget": "a"}]), "Affinities"),
        ("", "Spreads", json!([{"Attribute": "a"}]), "Spreads"),
        (
            "/TaskGroups/0/Services/0",
            "Connect",
            json!({"Native": true}),
            "TaskGroups[0].Services[0].Connect",
        ),
        (
            "/TaskGroups/0/Services/0/Checks/0",
            "TLSSkipVerify",
            json!(true),
            "TaskGroups[0].Services[0].Checks[0].TLSSkipVerify",
        ),
        (
            "/TaskGroups/0/Networks/0",
            "DNS",
            json!({"Servers": ["1.1.1.1"]}),
            "TaskGroups[0].Networks[0].DNS",
        ),
        (
            "/TaskGroups/0/Tasks/0",
            "User",
            json!("nobody"),
            "TaskGroups[0].Tasks[0].User",
        ),
        (
            "/TaskGroups/0/Tasks/0",
            "DispatchPayload",
            json!({"File": "x"}),
            "TaskGroups[0].Tasks[0].DispatchPayload",
        ),
    ];
    for (pointer, key, value, path) in cases {
        let mut job = base();
        job.pointer_mut(pointer).expect("in the base job")[key] = value;
        let err = parse(json!({ "Job": job })).unwrap_err();
        assert_eq!(err.path, path, "{err}");
        assert_eq!(err.message, "not supported yet by Drover");
    }
}

#[test]
fn empty_values_of_unsupported_fields_are_fine() {
    let parsed = parse(json!({"Job": {
        "ID": "x", "Affinities": [], "Spreads": null, "Periodic": null, "AllAtOnce": false,
        "Dispatched": false, "Payload": null,
        "Update": {"Canary": 0, "AutoRevert": false, "MaxParallel": 1},
        "TaskGroups": [{"Name": "g", "Services": [], "Networks": null, "Volumes": {},
            "EphemeralDisk": {"SizeMB": null, "Sticky": null},
            "Tasks": [{"Name": "t", "Driver": "raw_exec", "User": "", "Leader": false,
                "ShutdownDelay": 0, "Kind": "", "Lifecycle": {"Hook": "", "Sidecar": false}}]}]
    }}))
    .unwrap();
    assert_eq!(parsed.spec.groups[0].tasks[0].lifecycle, None);
}

#[test]
fn unknown_keys_with_a_value_are_errors_and_empty_ones_are_not() {
    let err = parse(
        json!({"Job": {"ID": "x", "Datacentres": ["dc1"], "TaskGroups": [
        {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}),
    )
    .unwrap_err();
    assert_eq!(err.path, "Datacentres");
    assert!(err.message.contains("unknown field"), "{err}");
    let err = parse(json!({"Job": {"ID": "x", "TaskGroups": [
        {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Resources": {"Memroy": 5}}]}]}}))
    .unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].Tasks[0].Resources.Memroy");
    parse(
        json!({"Job": {"ID": "x", "SomethingNew": null, "TaskGroups": [
        {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}),
    )
    .expect("a null unknown key carries nothing");
}

#[test]
fn a_jobs_namespace_is_kept_and_checked() {
    let job = |ns: serde_json::Value| {
        json!({"Job": {"ID": "x", "Namespace": ns, "TaskGroups": [
            {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}})
    };
    for (given, kept) in [
        (json!("default"), "default"),
        (json!(""), "default"),
        (json!(null), "default"),
        (json!("prod"), "prod"),
    ] {
        let parsed = parse(job(given)).unwrap();
        assert_eq!(parsed.spec.namespace, kept);
        assert_eq!(
            crate::nomad::Job::from(&parsed.spec).namespace.as_deref(),
            Some(kept)
        );
    }
    let err = parse(job(json!("a/b"))).unwrap_err();
    assert_eq!(err.path, "Namespace");
    assert!(err.message.contains("\"a/b\""), "{err}");
}

#[test]
fn region_is_exposed_and_a_name_unlike_the_id_is_a_warning() {
    let parsed = parse(json!({"Job": {"ID": "x", "Name": "pretty", "Region": "eu",
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}))
    .unwrap();
    assert_eq!(parsed.spec.name, "x");
    assert_eq!(parsed.region.as_deref(), Some("eu"));
    assert_eq!(parsed.warnings.len(), 1);
    assert!(
        parsed.warnings[0].contains("pretty"),
        "{:?}",
        parsed.warnings
    );
}

#[test]
fn group_restart_applies_to_tasks_without_their_own_field_by_field() {
    let spec = parse(json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g",
    "RestartPolicy": {"Attempts": 5, "Mode": "delay"},
    "Tasks": [
        {"Name": "a", "Driver": "raw_exec"},
        {"Name": "b", "Driver": "raw_exec", "RestartPolicy": {"Attempts": 1}}
    ]}]}}))
    .unwrap()
    .spec;
    let a = spec.groups[0].tasks[0].restart.clone().unwrap();
    let b = spec.groups[0].tasks[1].restart.clone().unwrap();
    assert_eq!((a.attempts, a.mode), (5, RestartMode::Delay));
    assert_eq!((b.attempts, b.mode), (1, RestartMode::Delay));
    assert_eq!(b.interval, Duration::from_secs(30 * 60));
}

#[test]
fn a_group_update_merges_over_the_jobs_field_by_field() {
    let job = |group_update: serde_json::Value| {
        json!({"Job": {"ID": "x", "Update": {"MaxParallel": 2, "Canary": 1, "AutoRevert": true},
            "TaskGroups": [{"Name": "g", "Count": 3,
            "Update": group_update,
            "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}})
    };
    // The same as the job's: kept on the job only.
    let same = parse(job(json!({"MaxParallel": 2}))).unwrap().spec;
    assert_eq!(same.groups[0].update, None);
    let own = parse(job(
        json!({"MinHealthyTime": 2_000_000_000_i64, "HealthCheck": "task_states"}),
    ))
    .unwrap()
    .spec;
    let u = own.update_of(&own.groups[0]);
    assert_eq!(
        (
            u.max_parallel,
            u.canary,
            u.auto_revert,
            u.min_healthy_time,
            u.health_check
        ),
        (
            2,
            1,
            true,
            Duration::from_secs(2),
            internal::HealthCheckMode::TaskStates
        )
    );
    let err = parse(job(json!({"HealthCheck": "sometimes"}))).unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].Update.HealthCheck");
}

#[test]
fn update_timings_are_read_in_nanoseconds_or_as_text() {
    let parsed = parse(json!({"Job": {"ID": "x",
        "Update": {"MaxParallel": 1, "MinHealthyTime": 10_000_000_000_i64, "HealthyDeadline": "1m",
            "ProgressDeadline": null, "AutoPromote": false},
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}))
    .unwrap();
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    let u = parsed.spec.update;
    assert_eq!(
        (u.min_healthy_time, u.healthy_deadline, u.progress_deadline),
        (
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_secs(600)
        )
    );
}

#[test]
fn bad_values_are_errors_with_the_path_of_the_field() {
    let job = |task: serde_json::Value| json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}});
    let err = parse(job(
        json!({"Name": "t", "Driver": "raw_exec", "Resources": {"MemoryMB": -1}}),
    ))
    .unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].Tasks[0].Resources.MemoryMB");
    let err = parse(job(json!({"Name": "t"}))).unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].Tasks[0].Driver");
    let err = parse(job(
        json!({"Name": "t", "Driver": "d", "Lifecycle": {"Hook": "later"}}),
    ))
    .unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].Tasks[0].Lifecycle.Hook");
    let err = parse(job(
        json!({"Name": "t", "Driver": "d", "RestartPolicy": {"Mode": "never"}}),
    ))
    .unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].Tasks[0].RestartPolicy.Mode");
    let err = parse(json!({"Job": {"ID": "x", "Type": "cron", "TaskGroups": []}})).unwrap_err();
    assert_eq!(err.path, "Type");
    let err = parse(json!({"Job": {"TaskGroups": []}})).unwrap_err();
    assert_eq!(err.path, "ID");
    // A duration that is not one fails to decode, saying why.
    let bad: Result<JobRegisterRequest, _> =
        serde_json::from_value(job(json!({"Name": "t", "Driver": "d", "KillTimeout": -5})));
    assert!(bad.unwrap_err().to_string().contains("negative"));
}

#[test]
fn the_wire_job_has_nomads_keys() {
    let spec = sample_spec(&mut Rng(7));
    let wire = serde_json::to_value(Job::from(&spec)).unwrap();
    for key in [
        "ID",
        "Name",
        "Type",
        "Priority",
        "Datacenters",
        "TaskGroups",
        "Update",
        "Meta",
        "Namespace",
        "Region",
        "Constraints",
    ] {
        assert!(wire.get(key).is_some(), "{key} in {wire}");
    }
    let task = &wire["TaskGroups"][0]["Tasks"][0];
    for key in [
        "Name",
        "Driver",
        "Config",
        "Env",
        "Meta",
        "Resources",
        "KillTimeout",
        "KillSignal",
        "RestartPolicy",
        "LogConfig",
        "Lifecycle",
    ] {
        assert!(task.get(key).is_some(), "{key} in {task}");
    }
    assert!(task["Resources"].get("MemoryMB").is_some());
    assert!(wire["Update"].get("MaxParallel").is_some());
}

#[test]
fn a_served_job_carries_the_servers_fields() {
    let spec = sample_spec(&mut Rng(3));
    let job = internal::Job {
        stable: Default::default(),
        spec: spec.clone(),
        version: 4,
        stop: true,
        status: internal::JobStatus::Dead,
        submit_time: 1_700_000_000_123_456_789,
        create_index: 10,
        modify_index: 20,
        job_modify_index: 15,
    };
    let wire = Job::from(&job);
    let v = serde_json::to_value(&wire).unwrap();
    assert_eq!(v["Status"], "dead");
    assert_eq!(v["Stop"], true);
    assert_eq!(v["Version"], 4);
    assert_eq!(v["SubmitTime"], 1_700_000_000_123_456_789_i64);
    assert_eq!(v["JobModifyIndex"], 15);
    assert_eq!(v["Namespace"], "default");
    // Re-registering a job read from the API works: the server's fields are ignored.
    let back: Job = serde_json::from_value(v).unwrap();
    assert_eq!(back.to_spec().unwrap().spec, spec);
    assert_eq!(back.to_internal().unwrap(), job);
}

#[test]
fn internal_to_wire_to_internal_is_the_identity_over_varied_jobs() {
    let mut rng = Rng(0x5eed);
    for round in 0..300 {
        let spec = sample_spec(&mut rng);
        let wire = Job::from(&spec);
        let json = serde_json::to_string(&JobRegisterRequest::new(wire)).unwrap();
        let back: JobRegisterRequest = serde_json::from_str(&json).unwrap();
        let parsed = back
            .job
            .to_spec()
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{json}"));
        assert_eq!(parsed.spec, spec, "round {round}: {json}");
        assert!(parsed.warnings.is_empty());
    }
}

// --- a small deterministic generator of varied values -----------------------------

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
    pub(crate) fn word(&mut self) -> String {
        const PARTS: [&str; 8] = ["web", "db", "a-b", "x_y", "ü", "1", "cache.v2", "Z"];
        let n = 1 + self.below(3);
        (0..n)
            .map(|_| PARTS[self.below(PARTS.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join("")
    }
    pub(crate) fn map(&mut self) -> BTreeMap<String, String> {
        (0..self.below(4))
            .map(|_| (self.word(), self.word()))
            .collect()
    }
    pub(crate) fn duration(&mut self) -> Duration {
        Duration::from_nanos(self.below(10_000_000_000_000))
    }
}

pub(crate) fn sample_spec(rng: &mut Rng) -> internal::JobSpec {
    let job_type = [JobType::Service, JobType::Batch, JobType::System][rng.below(3) as usize];
    let groups = (0..1 + rng.below(3))
        .map(|gi| sample_group(rng, gi))
        .collect();
    internal::JobSpec {
        namespace: crate::DEFAULT_NAMESPACE.into(),
        name: rng.word(),
        job_type,
        priority: rng.below(101) as u8,
        constraints: (0..rng.below(3)).map(|_| sample_constraint(rng)).collect(),
        update: internal::UpdateStrategy {
            max_parallel: rng.below(5) as u32,
            ..Default::default()
        },
        meta: rng.map(),
        datacenters: (0..rng.below(3)).map(|_| rng.word()).collect(),
        groups,
    }
}

fn sample_constraint(rng: &mut Rng) -> internal::Constraint {
    use ConstraintOperator::*;
    let ops = [
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        Version,
        Regexp,
        SetContains,
        SetContainsAny,
        DistinctHosts,
        IsSet,
        IsNotSet,
    ];
    internal::Constraint {
        attribute: if rng.bool() {
            format!("${{attr.{}}}", rng.word())
        } else {
            String::new()
        },
        operator: ops[rng.below(ops.len() as u64) as usize],
        value: rng.word(),
    }
}

fn sample_group(rng: &mut Rng, index: u64) -> internal::TaskGroup {
    internal::TaskGroup {
        volumes: Default::default(),
        update: Default::default(),
        network: Default::default(),
        services: Default::default(),
        name: format!("g{index}{}", rng.word()),
        count: rng.below(10) as u32,
        constraints: (0..rng.below(3)).map(|_| sample_constraint(rng)).collect(),
        meta: rng.map(),
        tasks: (0..1 + rng.below(3))
            .map(|ti| sample_task(rng, ti))
            .collect(),
        reschedule: rng.bool().then(|| internal::ReschedulePolicy {
            attempts: rng.below(10) as u32,
            interval: rng.duration(),
            delay: rng.duration(),
            max_delay: rng.duration(),
            unlimited: rng.bool(),
        }),
    }
}

fn sample_task(rng: &mut Rng, index: u64) -> internal::Task {
    let config = match rng.below(4) {
        0 => serde_json::Value::Null,
        1 => json!({"command": rng.word(), "args": [rng.word(), 3, true, null]}),
        2 => json!({"image": rng.word(), "ports": [], "nested": {"k": [1.5, {"z": "y"}]}}),
        _ => json!({}),
    };
    internal::Task {
        devices: Default::default(),
        volume_mounts: Default::default(),
        services: Default::default(),
        name: format!("t{index}{}", rng.word()),
        driver: ["raw_exec", "docker", "exec", "java", "qemu", "rawexec"][rng.below(6) as usize]
            .into(),
        config,
        env: rng.map(),
        meta: rng.map(),
        kill_signal: rng.bool().then(|| "SIGINT".to_owned()),
        kill_timeout: rng.bool().then(|| rng.duration()),
        restart: rng.bool().then(|| InternalRestart {
            attempts: rng.below(10) as u32,
            interval: rng.duration(),
            delay: rng.duration(),
            mode: if rng.bool() {
                RestartMode::Fail
            } else {
                RestartMode::Delay
            },
        }),
        resources: internal::TaskResources {
            cpu: rng.below(5000) as u32,
            memory_mb: rng.below(5000) as u32,
            memory_max_mb: rng.below(5000) as u32,
        },
        logs: rng.bool().then(|| InternalLogConfig {
            max_files: rng.below(20) as u32,
            max_file_size_mb: rng.below(20) as u32,
        }),
        lifecycle: rng.bool().then(|| internal::Lifecycle {
            hook: [
                LifecycleHook::Prestart,
                LifecycleHook::Poststart,
                LifecycleHook::Poststop,
            ][rng.below(3) as usize],
            sidecar: rng.bool(),
        }),
        artifacts: Vec::new(),
        templates: Vec::new(),
        identity: None,
    }
}

#[test]
fn reschedule_delay_functions_map_onto_drovers_doubling_delay() {
    let job = |f: &str| {
        json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g",
            "ReschedulePolicy": {"DelayFunction": f, "Delay": 7_000_000_000_i64,
                "MaxDelay": 60_000_000_000_i64},
            "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}})
    };
    let r = parse(job("constant")).unwrap().spec.groups[0]
        .reschedule
        .unwrap();
    assert_eq!(
        (r.delay, r.max_delay),
        (Duration::from_secs(7), Duration::from_secs(7))
    );
    let r = parse(job("exponential")).unwrap().spec.groups[0]
        .reschedule
        .unwrap();
    assert_eq!(r.max_delay, Duration::from_secs(60));
    let err = parse(job("fibonacci")).unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].ReschedulePolicy.DelayFunction");
}

#[test]
fn a_job_served_by_a_nomad_server_converts_with_warnings_for_what_drover_ignores() {
    // GET /v1/job/:id of a real Nomad 1.0.18 dev agent: Nomad's defaults filled in
    // (EphemeralDisk, Migrate, Update timings), all of which ask nothing Drover lacks.
    let path = format!(
        "{}/tests/fixtures/nomad/job.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let job: Job = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let parsed = job.to_spec().unwrap();
    assert_eq!(parsed.region.as_deref(), Some("global"));
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    assert_eq!(
        parsed.spec.update_of(&parsed.spec.groups[0]),
        internal::UpdateStrategy::default(),
        "Nomad's served defaults are Drover's"
    );
    let spec = parsed.spec;
    assert_eq!(spec.name, "fixture");
    assert_eq!(spec.groups[0].count, 2);
    let t = &spec.groups[0].tasks[0];
    assert_eq!(t.kill_timeout, Some(Duration::from_secs(5)));
    assert_eq!(t.restart, Some(default_restart(JobType::Service)));
    assert_eq!(
        spec.groups[0].reschedule,
        Some(internal::ReschedulePolicy::default_for(JobType::Service))
    );
    crate::validate(&spec).unwrap();
    // A disk bigger than Nomad's default asks for something.
    let mut v = serde_json::to_value(&job).unwrap();
    v["TaskGroups"][0]["EphemeralDisk"]["SizeMB"] = json!(1000);
    let err = serde_json::from_value::<Job>(v)
        .unwrap()
        .to_spec()
        .unwrap_err();
    assert_eq!(err.path, "TaskGroups[0].EphemeralDisk");
}

fn services_fixture() -> Job {
    let path = format!(
        "{}/tests/fixtures/hcl/services.nomad.hcl",
        env!("CARGO_MANIFEST_DIR")
    );
    crate::hcl::parse_job_file(std::path::Path::new(&path), &Default::default())
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn networks_services_and_checks_convert_with_nomads_defaults() {
    let spec = services_fixture().to_spec().unwrap().spec;
    crate::validate(&spec).expect("a spec Drover accepts");
    let web = &spec.groups[0];
    assert_eq!(
        web.network,
        Some(internal::NetworkSpec {
            mode: internal::NetworkMode::Host,
            ports: vec![
                internal::PortSpec {
                    label: "admin".into(),
                    static_port: 8081,
                    host_network: "default".into(),
                    ..Default::default()
                },
                internal::PortSpec {
                    label: "http".into(),
                    host_network: "default".into(),
                    ..Default::default()
                },
            ],
        })
    );
    let s = &web.services[0];
    assert_eq!((s.name.as_str(), s.port.as_str()), ("web", "http"));
    assert_eq!(s.tags, ["v1", "public"]);
    assert_eq!(s.meta, BTreeMap::from([("version".into(), "1".into())]));
    assert_eq!(s.provider, "nomad");
    // Nomad's default check name, and the check's own name kept.
    assert_eq!(s.checks[0].name, "service: \"web\" check");
    assert_eq!(s.checks[0].check_type, "http");
    assert_eq!(s.checks[0].path, "/health");
    assert_eq!(
        (s.checks[0].interval, s.checks[0].timeout),
        (Duration::from_secs(10), Duration::from_secs(2))
    );
    assert_eq!(s.checks[1].name, "admin answers");
    assert_eq!(s.checks[1].port, "admin");
    // A task's service without a name: JOB-GROUP-TASK.
    let ts = &web.tasks[0].services[0];
    assert_eq!(ts.name, "shop-web-server");
    assert_eq!(ts.checks[0].name, "service: \"shop-web-server\" check");
    assert_eq!(ts.checks[0].command, "/bin/test");
    assert_eq!(ts.checks[0].args, ["-f", "${NOMAD_TASK_DIR}/ready"]);
    assert_eq!(
        ts.checks[0].check_restart,
        Some(internal::CheckRestart {
            limit: 3,
            grace: Duration::from_secs(30),
            ignore_warnings: true,
        })
    );

    let api = &spec.groups[1];
    let n = api.network.as_ref().unwrap();
    assert_eq!(n.mode, internal::NetworkMode::Bridge);
    assert_eq!((n.ports[0].static_port, n.ports[0].to), (8080, 80));
    assert_eq!(
        (n.ports[1].to, n.ports[1].host_network.as_str()),
        (-1, "default")
    );
    // A group's service without a name: JOB-GROUP.
    let s = &api.services[0];
    assert_eq!((s.name.as_str(), s.task.as_str()), ("shop-api", "api"));
    let http = &s.checks[0];
    assert_eq!(
        (
            http.method.as_str(),
            http.protocol.as_str(),
            http.port.as_str(),
            http.expose
        ),
        ("POST", "https", "metrics", true)
    );
    assert_eq!(http.header["X-Probe"], ["a", "b"]);
    assert_eq!(s.checks[1].task, "api");
    // The service's check_restart, with Nomad's 1s grace for what it leaves out.
    assert_eq!(
        s.check_restart,
        Some(internal::CheckRestart {
            limit: 2,
            grace: Duration::from_secs(1),
            ignore_warnings: false,
        })
    );
}

#[test]
fn networks_and_services_survive_the_trip_to_the_wire_and_back() {
    let spec = services_fixture().to_spec().unwrap().spec;
    let wire = serde_json::to_value(Job::from(&spec)).unwrap();
    let g = &wire["TaskGroups"][1];
    assert_eq!(g["Networks"][0]["Mode"], "bridge");
    assert_eq!(
        g["Networks"][0]["ReservedPorts"][0],
        json!({"Label": "http", "Value": 8080, "To": 80, "HostNetwork": "default"})
    );
    assert_eq!(g["Services"][0]["Name"], "shop-api");
    assert_eq!(g["Services"][0]["PortLabel"], "http");
    assert_eq!(g["Services"][0]["TaskName"], "api");
    assert_eq!(
        g["Services"][0]["Checks"][0]["Interval"],
        15_000_000_000_i64
    );
    assert_eq!(
        g["Services"][0]["CheckRestart"],
        json!({"Limit": 2, "Grace": 1_000_000_000, "IgnoreWarnings": false})
    );
    assert_eq!(
        wire["TaskGroups"][0]["Tasks"][0]["Services"][0]["Name"],
        "shop-web-server"
    );
    let back = parse(json!({ "Job": wire })).unwrap().spec;
    assert_eq!(back.groups, spec.groups);
}

#[test]
fn what_drover_lacks_of_networks_and_services_is_refused_by_path() {
    let job = |group: serde_json::Value| {
        let mut g = json!({"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]});
        for (k, v) in group.as_object().unwrap() {
            g[k] = v.clone();
        }
        parse(json!({"Job": {"ID": "x", "TaskGroups": [g]}})).unwrap_err()
    };
    let e = job(json!({"Services": [{"Provider": "consul"}]}));
    assert_eq!(e.path, "TaskGroups[0].Services[0].Provider");
    assert!(
        e.message
            .contains("Drover keeps services itself: provider = \"nomad\""),
        "{e}"
    );
    let e = job(json!({"Networks": [{}, {}]}));
    assert_eq!(e.path, "TaskGroups[0].Networks[1]");
    let e = job(json!({"Networks": [{"Mode": "cni/mynet"}]}));
    assert_eq!(e.path, "TaskGroups[0].Networks[0].Mode");
    let e = job(json!({"Services": [{"AddressMode": "driver"}]}));
    assert_eq!(e.path, "TaskGroups[0].Services[0].AddressMode");
    let e = job(json!({"Services": [{"CanaryTags": ["c"]}]}));
    assert_eq!(e.path, "TaskGroups[0].Services[0].CanaryTags");
    let e = job(json!({"Services": [{"Checks": [{"Type": "tcp", "Bogus": 1}]}]}));
    assert_eq!(e.path, "TaskGroups[0].Services[0].Checks[0].Bogus");
    let e = job(json!({"Tasks": [{"Name": "t", "Driver": "raw_exec",
        "Resources": {"Networks": [{"DynamicPorts": [{"Label": "http"}]}]}}]}));
    assert_eq!(e.path, "TaskGroups[0].Tasks[0].Resources.Networks");
    assert!(e.message.contains("move network to the group"), "{e}");
    // A provider of "nomad", as Nomad 1.3 writes it, is Drover's.
    let spec = parse(json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g",
        "Services": [{"Provider": "nomad"}],
        "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}}))
    .unwrap()
    .spec;
    assert_eq!(spec.groups[0].services[0].name, "x-g");
}

#[test]
fn an_allocations_ports_and_a_nodes_network_in_nomads_shape() {
    let mut spec = services_fixture().to_spec().unwrap().spec;
    let group = spec.groups.remove(1);
    let alloc = internal::Allocation {
        ports: vec![
            internal::AllocatedPort {
                label: "http".into(),
                value: 8080,
                to: 80,
                host_ip: "10.0.0.5".into(),
            },
            internal::AllocatedPort {
                label: "metrics".into(),
                value: 23456,
                to: 23456,
                host_ip: "10.0.0.5".into(),
            },
        ],
        ..serde_json::from_value(json!({
            "id": "a1", "name": "shop.api[0]", "index": 0, "job_name": "shop",
            "job_version": 0, "group": "api", "node_id": "n1", "node_name": "n",
            "resources": {"cpu": 100, "memory_mb": 64}, "desired_status": "run",
            "desired_description": "", "client_status": "running",
            "client_description": "", "task_states": {}, "eval_id": "e",
            "create_index": 1, "modify_index": 1, "alloc_modify_index": 1,
            "create_time": 0, "modify_time": 0
        }))
        .expect("an allocation")
    };
    let wire = Allocation::from(&alloc).with_group(&group);
    let v = serde_json::to_value(&wire).unwrap();
    let shared = &v["AllocatedResources"]["Shared"];
    assert_eq!(
        shared["Ports"],
        json!([{"Label": "http", "Value": 8080, "To": 80, "HostIP": "10.0.0.5"},
            {"Label": "metrics", "Value": 23456, "To": 23456, "HostIP": "10.0.0.5"}])
    );
    let net = &shared["Networks"][0];
    assert_eq!(
        (net["Mode"].as_str(), net["IP"].as_str()),
        (Some("bridge"), Some("10.0.0.5"))
    );
    assert_eq!(net["ReservedPorts"][0]["Label"], "http");
    assert_eq!(net["DynamicPorts"][0]["Value"], 23456);
    assert_eq!(v["Resources"]["Networks"][0]["Mode"], "bridge");
    // Read back by a client of the API.
    let back: Allocation = serde_json::from_value(v).unwrap();
    assert_eq!(back.to_internal().ports, alloc.ports);

    let node_network = internal::NodeNetwork {
        address: "10.0.0.5".into(),
        min_dynamic_port: 21000,
        max_dynamic_port: 22000,
        reserved_ports: vec![
            internal::PortRange {
                first: 22,
                last: 22,
            },
            internal::PortRange {
                first: 8000,
                last: 8100,
            },
        ],
    };
    let node: internal::Node = serde_json::from_value(json!({
        "id": "n1", "name": "n", "datacenter": "dc1", "status": "ready",
        "status_description": "", "drain": false, "ineligible": false,
        "attributes": {}, "meta": {}, "resources": {"cpu": 1000, "memory_mb": 1024},
        "drivers": {}, "status_updated_at": 0, "create_index": 1, "modify_index": 1
    }))
    .expect("a node");
    let node = internal::Node {
        network: node_network.clone(),
        ..node
    };
    let v = serde_json::to_value(Node::from(&node)).unwrap();
    assert_eq!(
        v["NodeResources"]["Networks"][0],
        json!({"Mode": "host", "Device": "", "CIDR": "10.0.0.5/32", "IP": "10.0.0.5",
            "ReservedPorts": null, "DynamicPorts": null, "MBits": null, "DNS": null})
    );
    assert_eq!(v["NodeResources"]["MinDynamicPort"], 21000);
    assert_eq!(v["NodeResources"]["MaxDynamicPort"], 22000);
    assert_eq!(
        v["ReservedResources"]["Networks"]["ReservedHostPorts"],
        "22,8000-8100"
    );
    let back: Node = serde_json::from_value(v).unwrap();
    assert_eq!(back.to_internal().network, node_network);
}

/// Issue 27: `Volumes` and `VolumeMounts` convert both ways; what Drover cannot do yet
/// (per-allocation volumes, mount propagation) is refused by name.
#[test]
fn volumes_in_nomads_json_convert_both_ways_and_unsupported_parts_are_named() {
    let job = |volumes: serde_json::Value, mounts: serde_json::Value| {
        json!({"Job": {"ID": "v", "TaskGroups": [{
            "Name": "g",
            "Volumes": volumes,
            "Tasks": [{"Name": "t", "Driver": "exec", "VolumeMounts": mounts}]
        }]}})
    };
    let spec = parse(job(
        json!({"data": {"Type": "host", "Source": "shared", "ReadOnly": true,
                        "AccessMode": "", "AttachmentMode": "", "PerAlloc": false}}),
        json!([{"Volume": "data", "Destination": "/data", "ReadOnly": false,
                "PropagationMode": "private"}]),
    ))
    .unwrap()
    .spec;
    let g = &spec.groups[0];
    assert_eq!(
        g.volumes["data"],
        crate::VolumeRequest {
            volume_type: "host".into(),
            source: "shared".into(),
            read_only: true,
            access_mode: String::new(),
            attachment_mode: String::new(),
        }
    );
    assert_eq!(g.tasks[0].volume_mounts[0].destination, "/data");
    // Served back in Nomad's shape, and converted again to the same spec.
    let wire = Job::from(&spec);
    let back = serde_json::to_value(&wire).unwrap();
    assert_eq!(back["TaskGroups"][0]["Volumes"]["data"]["Source"], "shared");
    assert_eq!(
        back["TaskGroups"][0]["Tasks"][0]["VolumeMounts"][0]["Volume"],
        "data"
    );
    assert_eq!(wire.to_spec().unwrap().spec, spec);

    let e = parse(job(
        json!({"data": {"Type": "host", "Source": "s", "PerAlloc": true}}),
        json!([]),
    ))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "TaskGroups[0].Volumes[\"data\"].PerAlloc: not supported yet by Drover"
    );
    let e = parse(job(
        json!({"data": {"Type": "host", "Source": "s"}}),
        json!([{"Volume": "data", "Destination": "/d", "PropagationMode": "bidirectional"}]),
    ))
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("TaskGroups[0].Tasks[0].VolumeMounts[0].PropagationMode"),
        "{e}"
    );
    let e = parse(job(
        json!({"data": {"Name": "other", "Type": "host", "Source": "s"}}),
        json!([]),
    ))
    .unwrap_err();
    assert!(
        e.to_string().contains("differs from the volume's key"),
        "{e}"
    );
}
