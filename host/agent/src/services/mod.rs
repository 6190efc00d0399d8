//! Service registration and health checks of the allocations this node runs (Nomad's
//! native discovery, `provider = "nomad"`).
//!
//! Each allocation runner keeps an [`AllocServices`]: the instances that should be
//! registered now (a group's services while the allocation runs, a task's services
//! while that task runs), each with its checks running on the agent. The runner puts
//! the instances and their health into its status report
//! ([`drover_server_api::AllocClientUpdate::services`], the complete set each time);
//! a check whose status changes wakes the runner, so only changes are reported, and
//! the cluster client's queue batches them with the other reports.
//!
//! `check_restart`: after `limit` failures in a row (not counted during `grace` after
//! the task (re)started) the task is restarted through the task manager
//! ([`TaskManager::restart`]): it counts as a restart of the task, and its events say
//! why.

mod checks;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_server_api::{
    AllocatedPort, CheckRestart, CheckSpec, CheckStatus, MAX_SERVICE_NAME_BYTES, ServiceHealth,
    ServiceInstance, ServiceSpec,
};
use tokio_util::sync::CancellationToken;

use crate::tasks::TaskManager;

pub use checks::{CheckOutcome, CheckTarget};

/// Called when a check's status changed (wakes the allocation's runner).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// Where an instance is reached: the allocation's port for a label, or the node's
/// address and the number for a numeric port.
pub fn resolve_port(
    label: &str,
    ports: &[AllocatedPort],
    node_address: &str,
) -> Option<(String, u16)> {
    if let Some(p) = ports.iter().find(|p| p.label == label) {
        return Some((p.host_ip.clone(), p.value));
    }
    let n: u16 = label.parse().ok()?;
    (n != 0).then(|| (node_address.to_owned(), n))
}

/// Where a check connects: a port of the allocation, by its label only (a number
/// would let a job probe any port of the node's address; validation refuses it).
pub fn resolve_check_port(label: &str, ports: &[AllocatedPort]) -> Option<(String, u16)> {
    ports
        .iter()
        .find(|p| p.label == label)
        .map(|p| (p.host_ip.clone(), p.value))
}

/// Why an interpolated service name cannot be registered: the server's length limit,
/// and the characters validation allows (it is a path segment of
/// `/v1/service/<name>` and printed by `drover service list`).
pub fn bad_service_name(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_SERVICE_NAME_BYTES {
        return Some(format!(
            "a service name of {} bytes: must be 1 to {MAX_SERVICE_NAME_BYTES}",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Some(format!(
            "service name {name:?}: only letters, digits, '-', '_' or '.'"
        ));
    }
    None
}

/// `${...}` in a service name: the job, group and task names and the allocation id
/// (Nomad's default name is `${JOB}-${TASKGROUP}[-${TASK}]`).
pub fn service_name(template: &str, job: &str, group: &str, task: &str, alloc_id: &str) -> String {
    let mut s = template.to_owned();
    for (k, v) in [
        ("JOB", job),
        ("NOMAD_JOB_NAME", job),
        ("TASKGROUP", group),
        ("NOMAD_GROUP_NAME", group),
        ("TASK", task),
        ("NOMAD_TASK_NAME", task),
        ("NOMAD_ALLOC_ID", alloc_id),
    ] {
        s = s.replace(&format!("${{{k}}}"), v);
    }
    s
}

/// One instance that should be registered now.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Its registration (health and checks are filled in by the checks).
    pub instance: ServiceInstance,
    /// Its checks, each with where it connects and the node-local id of the task it
    /// belongs to (a check's own `task`, else the service's: the task a `script`
    /// check runs in and its `check_restart` restarts).
    pub checks: Vec<(CheckSpec, CheckTarget, Option<String>)>,
    /// The service's `check_restart` (a check's own wins).
    pub check_restart: Option<CheckRestart>,
    /// The node-local id of the task `check_restart` restarts and `script` checks run
    /// in.
    pub task_id: Option<String>,
}

impl Wanted {
    /// The instance of `spec` for `owner` (a task's name or `group-<group>`), or why
    /// it cannot be registered. `task_id` is the service's task; `task_id_of` finds
    /// the task a check names itself (`task` of a group service's check).
    pub fn of(
        spec: &ServiceSpec,
        owner: &str,
        names: (&str, &str, &str, &str),
        ports: &[AllocatedPort],
        node_address: &str,
        task_id: Option<String>,
        task_id_of: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Wanted, String> {
        let (job, group, task, alloc_id) = names;
        let name = service_name(&spec.name, job, group, task, alloc_id);
        if let Some(why) = bad_service_name(&name) {
            return Err(why);
        }
        let (address, port) = if spec.port.is_empty() {
            (node_address.to_owned(), 0)
        } else {
            resolve_port(&spec.port, ports, node_address).ok_or_else(|| {
                format!(
                    "service {name}: port {:?} is neither a port of the allocation nor a number",
                    spec.port
                )
            })?
        };
        let mut checks = Vec::new();
        for c in &spec.checks {
            let target = match c.check_type.as_str() {
                "script" => CheckTarget::Script {
                    command: c.command.clone(),
                    args: c.args.clone(),
                },
                kind => {
                    let label = if c.port.is_empty() {
                        &spec.port
                    } else {
                        &c.port
                    };
                    let (host, port) = resolve_check_port(label, ports).ok_or_else(|| {
                        format!(
                            "service {name}: check {:?}: port {label:?} is not a port label \
                             of the allocation",
                            c.name
                        )
                    })?;
                    if kind == "http" {
                        CheckTarget::Http { host, port }
                    } else {
                        CheckTarget::Tcp { host, port }
                    }
                }
            };
            let check = check_name(c, &name);
            if check.len() > MAX_SERVICE_NAME_BYTES {
                return Err(format!(
                    "service {name}: check name of {} bytes, at most {MAX_SERVICE_NAME_BYTES}",
                    check.len()
                ));
            }
            let check_task = if c.task.is_empty() {
                task_id.clone()
            } else {
                task_id_of(&c.task)
            };
            checks.push((c.clone(), target, check_task));
        }
        Ok(Wanted {
            instance: ServiceInstance {
                service_name: name,
                owner: owner.to_owned(),
                port_label: spec.port.clone(),
                tags: spec.tags.clone(),
                address,
                port,
                health: ServiceHealth::Passing,
                checks: Vec::new(),
            },
            checks,
            check_restart: spec.check_restart,
            task_id,
        })
    }

    fn key(&self) -> String {
        self.instance.id("")
    }
}

struct Active {
    instance: ServiceInstance,
    statuses: Vec<Arc<Mutex<CheckStatus>>>,
    stop: CancellationToken,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The registered instances of one allocation and their running checks.
#[derive(Default)]
pub struct AllocServices {
    active: BTreeMap<String, Active>,
}

impl AllocServices {
    /// Register what is wanted and not yet registered (its checks start), deregister
    /// what is no longer wanted (its checks stop).
    pub fn sync(&mut self, wanted: Vec<Wanted>, tasks: &Arc<TaskManager>, wake: &Waker) {
        let keys: std::collections::BTreeSet<String> = wanted.iter().map(Wanted::key).collect();
        self.active.retain(|k, _| keys.contains(k));
        for w in wanted {
            let key = w.key();
            if self.active.contains_key(&key) {
                continue;
            }
            let stop = CancellationToken::new();
            let mut statuses = Vec::new();
            for (spec, target, task_id) in w.checks {
                let status = Arc::new(Mutex::new(CheckStatus {
                    name: check_name(&spec, &w.instance.service_name),
                    status: ServiceHealth::Pending,
                    output: String::new(),
                }));
                statuses.push(status.clone());
                let restart = spec.check_restart.or(w.check_restart);
                tokio::spawn(checks::run(checks::CheckRun {
                    spec,
                    target,
                    restart,
                    task_id,
                    status,
                    tasks: tasks.clone(),
                    wake: wake.clone(),
                    stop: stop.clone(),
                }));
            }
            tracing::debug!(service = %w.instance.service_name, address = %w.instance.address, port = w.instance.port, "service registered");
            self.active.insert(
                key,
                Active {
                    instance: w.instance,
                    statuses,
                    stop,
                },
            );
        }
    }

    /// Deregister everything (the allocation stops).
    pub fn clear(&mut self) {
        self.active.clear();
    }

    /// The registered instances with their checks' latest results.
    pub fn snapshot(&self) -> Vec<ServiceInstance> {
        self.active
            .values()
            .map(|a| {
                let mut i = a.instance.clone();
                i.checks = a.statuses.iter().map(|s| lock(s).clone()).collect();
                i.health = ServiceHealth::worst(i.checks.iter().map(|c| c.status));
                i
            })
            .collect()
    }
}

/// A check's name: its own, or Nomad's default `service: "<name>" check`.
fn check_name(spec: &CheckSpec, service: &str) -> String {
    if spec.name.is_empty() {
        format!("service: {service:?} check")
    } else {
        spec.name.clone()
    }
}

/// Default time a check may take when its spec says 0.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Shortest interval between two runs of a check (a 0 interval would spin).
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> Vec<AllocatedPort> {
        vec![AllocatedPort {
            label: "http".into(),
            value: 23456,
            to: 23456,
            host_ip: "127.0.0.1".into(),
        }]
    }

    fn check(kind: &str, port: &str) -> CheckSpec {
        CheckSpec {
            name: String::new(),
            check_type: kind.into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            path: "/health".into(),
            method: String::new(),
            protocol: String::new(),
            header: Default::default(),
            port: port.into(),
            command: String::new(),
            args: Vec::new(),
            task: String::new(),
            expose: false,
            check_restart: None,
        }
    }

    fn spec(name: &str, port: &str, checks: Vec<CheckSpec>) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            port: port.into(),
            checks,
            ..Default::default()
        }
    }

    fn wanted(s: &ServiceSpec) -> Result<Wanted, String> {
        Wanted::of(
            s,
            "web",
            ("job", "group", "web", "alloc"),
            &ports(),
            "10.0.0.1",
            Some("id-of-web".into()),
            &|name| (name == "sidecar").then(|| "id-of-sidecar".to_owned()),
        )
    }

    #[test]
    fn a_check_naming_its_own_task_runs_in_that_task_the_others_in_the_services() {
        let mut own = check("script", "");
        own.task = "sidecar".into();
        let mut gone = check("script", "");
        gone.task = "not-running".into();
        let w = wanted(&spec("web", "http", vec![check("script", ""), own, gone])).unwrap();
        let ids: Vec<Option<&str>> = w.checks.iter().map(|c| c.2.as_deref()).collect();
        assert_eq!(ids, [Some("id-of-web"), Some("id-of-sidecar"), None]);
    }

    #[test]
    fn checks_probe_only_the_allocations_ports_by_label() {
        let w = wanted(&spec("web", "http", vec![check("tcp", "")])).unwrap();
        assert_eq!(
            w.checks[0].1,
            CheckTarget::Tcp {
                host: "127.0.0.1".into(),
                port: 23456
            }
        );
        // A number (a job file from before validation refused it) is never probed.
        let e = wanted(&spec("web", "http", vec![check("http", "22")])).err();
        assert!(e.is_some_and(|e| e.contains("\"22\"")));
        let e = wanted(&spec("web", "8080", vec![check("tcp", "")])).err();
        assert!(e.is_some_and(|e| e.contains("\"8080\"")));
        // A numeric service port without checks is only advertised.
        let w = wanted(&spec("web", "8080", Vec::new())).unwrap();
        assert_eq!(
            (w.instance.address.as_str(), w.instance.port),
            ("10.0.0.1", 8080)
        );
    }

    #[test]
    fn interpolated_names_the_server_would_refuse_are_not_registered() {
        assert!(wanted(&spec("${TASK}-api", "http", Vec::new())).is_ok());
        let long = "x".repeat(MAX_SERVICE_NAME_BYTES);
        let e = wanted(&spec(&format!("{long}-${{TASK}}"), "http", Vec::new())).err();
        assert!(e.is_some_and(|e| e.contains("bytes")));
        // A job name carrying a control character reaches the name only here.
        let s = spec("${JOB}", "http", Vec::new());
        let e = Wanted::of(
            &s,
            "web",
            ("a\x1b[2J", "g", "t", "alloc"),
            &ports(),
            "h",
            None,
            &|_| None,
        )
        .err();
        assert!(e.is_some_and(|e| e.contains("only letters")));
        // Nomad's default check name quotes the service's: it must fit too.
        let name = "y".repeat(MAX_SERVICE_NAME_BYTES - 4);
        let e = wanted(&spec(&name, "http", vec![check("tcp", "")])).err();
        assert!(e.is_some_and(|e| e.contains("check name")));
    }
}
