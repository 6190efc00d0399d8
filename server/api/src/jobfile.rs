//! Job files: `drover job run web.toml`.
//!
//! ```toml
//! name = "web"
//! type = "service"            # service | batch | system
//! priority = 50               # 1..=100
//! update = { max_parallel = 2 }
//!
//! [[constraint]]              # every group of the job
//! attribute = "${attr.kernel.name}"
//! value = "linux"
//!
//! [[group]]
//! name = "app"
//! count = 3
//! reschedule = { delay = "30s", max_delay = "1h", unlimited = true }
//!
//! [[group.constraint]]
//! attribute = "${node.meta.rack}"
//! operator = "="
//! value = "r1"
//!
//! [[group.task]]              # the fields of a `drover task run` spec file
//! name = "main"
//! driver = "rawexec"
//! config = { command = "/bin/sleep", args = ["1000"] }
//! env = { PORT = 8080 }       # integers, floats and booleans become strings
//! kill_timeout = "10s"
//! resources = { cpu = 100, memory_mb = 64 }
//! restart = { attempts = 2, delay = "5s", mode = "fail" }
//! lifecycle = { hook = "prestart", sidecar = false }   # absent: a main task
//!
//! [group.network]             # absent: host networking, no ports
//! mode = "host"               # host | bridge
//!
//! [[group.network.port]]      # NOMAD_PORT_http; static absent: the scheduler picks
//! label = "http"
//! static = 8080               # a fixed port of the node (optional)
//! to = 80                     # the port inside the allocation (bridge, docker)
//!
//! [[group.service]]           # also [[group.task.service]]
//! name = "web"                # absent: JOB-GROUP (JOB-GROUP-TASK for a task's)
//! port = "http"
//! tags = ["v1"]
//! task = "main"               # a group's service: the task check_restart restarts
//! check_restart = { limit = 3, grace = "10s" }
//!
//! [[group.service.check]]     # name absent: service: "web" check
//! type = "http"               # http | tcp | script
//! path = "/health"
//! interval = "10s"
//! timeout = "2s"
//!
//! [group.volume.data]         # a host volume of the node (agent's [host_volume.NAME])
//! type = "host"
//! source = "shared-data"
//! read_only = false
//!
//! [[group.task.volume_mount]] # the group's volume "data" at /data in the task
//! volume = "data"
//! destination = "/data"
//! read_only = false
//!
//! [[group.task.artifact]]     # fetched into the task dir before it starts
//! source = "https://example.com/app.tar.gz"   # http(s) only; archives are unpacked
//! destination = "local/app"   # default local/
//! options = { checksum = "sha256:..." }
//!
//! [[group.task.template]]     # rendered before the task starts, and on changes
//! data = "PORT={{ env \"NOMAD_PORT_http\" }}"
//! destination = "secrets/app.env"
//! env = true                  # KEY=VALUE lines added to the task's environment
//! change_mode = "restart"     # restart | signal | noop
//! ```
//!
//! [`parse`] is a pure function of the text and the file's name. Every error names the
//! file, the line and the field (`web.toml:9: group[0].cuont: unknown field ...`);
//! [`JobFile::validate`] runs [`crate::validate()`] and places its errors on the line
//! of the field too. The task config is free-form here: the driver on the node checks
//! it.
//!
//! The spans, the error and the TOML-to-JSON conversion are [`drover_api::tomlfile`]'s,
//! shared with the task files of `drover task run` (`drover_api::taskfile`).

use std::collections::BTreeMap;
use std::time::Duration;

use drover_api::tomlfile::{FileError, Source, value as entry};
use drover_api::{LogConfig, MAX_KILL_TIMEOUT, MAX_RESTART_DURATION, RestartMode, RestartPolicy};
use serde::Deserialize;
use serde::de::IgnoredAny;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::nomad::{DEFAULT_CHECK_RESTART_GRACE, default_check_name};
use crate::types::{
    CheckRestart, CheckSpec, Constraint, HealthCheckMode, JobSpec, JobType, Lifecycle,
    NOMAD_SERVICE_PROVIDER, NetworkSpec, ReschedulePolicy, ServiceSpec, Task, TaskGroup,
    TaskResources, UpdateStrategy,
};
use crate::validate::{MAX_CHECK_DURATION, MAX_RESCHEDULE_DURATION, MAX_UPDATE_DURATION};

/// A job file that could not be used. Displays as `FILE:LINE: FIELD: MESSAGE`; the
/// field is a path such as `group[0].task[1].resources.memory_mb`.
pub type JobFileError = FileError;

/// A parsed job file.
#[derive(Debug, Clone)]
pub struct JobFile {
    /// The file name as given.
    pub file: String,
    /// The job it describes (not yet validated: see [`JobFile::validate`]).
    pub spec: JobSpec,
    /// Field path → 1-based line of its key (or of its `[[header]]`).
    field_lines: BTreeMap<String, usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `meta` exists to be accepted by deny_unknown_fields
struct JobDoc {
    name: Option<String>,
    namespace: Option<String>,
    #[serde(rename = "type")]
    job_type: Option<JobType>,
    priority: Option<u8>,
    #[serde(alias = "constraints")]
    constraint: Option<Vec<Constraint>>,
    update: Option<UpdateDoc>,
    meta: Option<IgnoredAny>,
    datacenters: Option<Vec<String>>,
    #[serde(alias = "groups")]
    group: Option<Vec<GroupDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct GroupDoc {
    name: Option<String>,
    count: Option<u32>,
    #[serde(alias = "constraints")]
    constraint: Option<Vec<Constraint>>,
    meta: Option<IgnoredAny>,
    reschedule: Option<RescheduleDoc>,
    update: Option<UpdateDoc>,
    network: Option<NetworkSpec>,
    service: Option<Vec<ServiceDoc>>,
    #[serde(alias = "volumes")]
    volume: Option<BTreeMap<String, crate::VolumeRequest>>,
    #[serde(alias = "tasks")]
    task: Option<Vec<TaskDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `meta` is converted from the spanned tree
struct ServiceDoc {
    name: Option<String>,
    port: Option<String>,
    tags: Option<Vec<String>>,
    meta: Option<IgnoredAny>,
    provider: Option<String>,
    task: Option<String>,
    check: Option<Vec<CheckDoc>>,
    check_restart: Option<CheckRestartDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckDoc {
    name: Option<String>,
    #[serde(rename = "type")]
    check_type: Option<String>,
    interval: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    path: Option<String>,
    method: Option<String>,
    protocol: Option<String>,
    header: Option<BTreeMap<String, Vec<String>>>,
    port: Option<String>,
    command: Option<String>,
    args: Option<Vec<String>>,
    task: Option<String>,
    expose: Option<bool>,
    check_restart: Option<CheckRestartDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRestartDoc {
    limit: Option<u32>,
    grace: Option<Spanned<String>>,
    ignore_warnings: Option<bool>,
}

/// An `update` table: what it leaves out is the job's (for a group) or Nomad's default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateDoc {
    max_parallel: Option<u32>,
    health_check: Option<HealthCheckMode>,
    min_healthy_time: Option<Spanned<String>>,
    healthy_deadline: Option<Spanned<String>>,
    progress_deadline: Option<Spanned<String>>,
    canary: Option<u32>,
    auto_promote: Option<bool>,
    auto_revert: Option<bool>,
    stagger: Option<Spanned<String>>,
}

impl UpdateDoc {
    /// These fields over `base`; durations of at most [`MAX_UPDATE_DURATION`].
    fn over(
        &self,
        source: &Source<'_>,
        base: UpdateStrategy,
        path: &str,
    ) -> Result<UpdateStrategy, JobFileError> {
        let d = |v: &Option<Spanned<String>>, field: &str, default: Duration| match v {
            None => Ok(default),
            Some(v) => source.duration(v, &format!("{path}.{field}"), MAX_UPDATE_DURATION),
        };
        Ok(UpdateStrategy {
            max_parallel: self.max_parallel.unwrap_or(base.max_parallel),
            health_check: self.health_check.unwrap_or(base.health_check),
            min_healthy_time: d(
                &self.min_healthy_time,
                "min_healthy_time",
                base.min_healthy_time,
            )?,
            healthy_deadline: d(
                &self.healthy_deadline,
                "healthy_deadline",
                base.healthy_deadline,
            )?,
            progress_deadline: d(
                &self.progress_deadline,
                "progress_deadline",
                base.progress_deadline,
            )?,
            canary: self.canary.unwrap_or(base.canary),
            auto_promote: self.auto_promote.unwrap_or(base.auto_promote),
            auto_revert: self.auto_revert.unwrap_or(base.auto_revert),
            stagger: d(&self.stagger, "stagger", base.stagger)?,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RescheduleDoc {
    attempts: Option<u32>,
    interval: Option<Spanned<String>>,
    delay: Option<Spanned<String>>,
    max_delay: Option<Spanned<String>>,
    unlimited: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `config` and `env` are converted from the spanned tree
struct TaskDoc {
    name: Option<String>,
    driver: Option<String>,
    config: Option<IgnoredAny>,
    env: Option<IgnoredAny>,
    meta: Option<IgnoredAny>,
    kill_signal: Option<String>,
    kill_timeout: Option<Spanned<String>>,
    restart: Option<RestartDoc>,
    resources: Option<TaskResources>,
    logs: Option<LogConfig>,
    lifecycle: Option<Lifecycle>,
    service: Option<Vec<ServiceDoc>>,
    artifact: Option<Vec<crate::types::ArtifactSpec>>,
    template: Option<Vec<crate::types::TemplateSpec>>,
    identity: Option<crate::types::TaskIdentity>,
    device: Option<Vec<crate::DeviceRequest>>,
    #[serde(alias = "volume_mounts")]
    volume_mount: Option<Vec<crate::VolumeMount>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestartDoc {
    attempts: Option<u32>,
    interval: Option<Spanned<String>>,
    delay: Option<Spanned<String>>,
    mode: Option<RestartMode>,
}

/// Parse the job file in `text`; `file` is the name errors mention.
pub fn parse(text: &str, file: &str) -> Result<JobFile, JobFileError> {
    let source = Source { text, file };
    let err = |span, field, message| source.error(span, field, message);
    let root = source.parse()?;
    let doc: JobDoc = source.deserialize(&root, |field| {
        // Spec files of `drover task run` say `cpu_shares`; a job reserves MHz.
        field
            .ends_with("resources.cpu_shares")
            .then_some(" (a job reserves CPU in MHz: write `cpu`)")
    })?;
    let table = root.get_ref();
    let mut field_lines = BTreeMap::new();
    record_lines(
        &source,
        &DeValue::Table(table.clone()),
        "",
        &mut field_lines,
    );
    // A missing field is reported on the line of the table that lacks it.
    let missing = |path: &str, key: &str| {
        let line = line_for(&field_lines, path).unwrap_or(1);
        JobFileError {
            file: file.to_owned(),
            line,
            field: Some(if path.is_empty() {
                key.to_owned()
            } else {
                format!("{path}.{key}")
            }),
            message: "missing".to_owned(),
        }
    };
    let duration =
        |v: &Spanned<String>, field: String, max: Duration| source.duration(v, &field, max);
    let strings = |value: Option<&Spanned<DeValue<'_>>>,
                   field: &str|
     -> Result<BTreeMap<String, String>, JobFileError> {
        let Some(value) = value else {
            return Ok(BTreeMap::new());
        };
        source.string_map(value, field)
    };

    let name = doc.name.ok_or_else(|| missing("", "name"))?;
    let group_values = array_of(table, &["group", "groups"]);
    let job_update = match &doc.update {
        None => UpdateStrategy::default(),
        Some(u) => u.over(&source, UpdateStrategy::default(), "update")?,
    };
    let mut groups = Vec::new();
    for (i, g) in doc.group.unwrap_or_default().into_iter().enumerate() {
        let gpath = format!("group[{i}]");
        let gvalue = group_values.and_then(|a| a.get(i));
        let gtable = gvalue.and_then(|v| v.get_ref().as_table());
        let task_values = gtable.and_then(|t| array_of(t, &["task", "tasks"]));
        let mut tasks = Vec::new();
        for (j, t) in g.task.unwrap_or_default().into_iter().enumerate() {
            let tpath = format!("{gpath}.task[{j}]");
            let ttable = task_values
                .and_then(|a| a.get(j))
                .and_then(|v| v.get_ref().as_table());
            let config = match ttable.and_then(|t| entry(t, "config")) {
                Some(value) => {
                    let DeValue::Table(_) = value.get_ref() else {
                        return Err(err(
                            Some(value.span()),
                            Some(format!("{tpath}.config")),
                            format!("expected a table, found {}", value.get_ref().type_str()),
                        ));
                    };
                    source.to_json(value, &format!("{tpath}.config"), &mut |_, _| {})?
                }
                None => serde_json::json!({}),
            };
            let restart = match t.restart {
                None => None,
                Some(r) => {
                    let mut policy = RestartPolicy::default();
                    if let Some(a) = r.attempts {
                        policy.attempts = a;
                    }
                    if let Some(v) = &r.interval {
                        policy.interval =
                            duration(v, format!("{tpath}.restart.interval"), MAX_RESTART_DURATION)?;
                    }
                    if let Some(v) = &r.delay {
                        policy.delay =
                            duration(v, format!("{tpath}.restart.delay"), MAX_RESTART_DURATION)?;
                    }
                    if let Some(m) = r.mode {
                        policy.mode = m;
                    }
                    Some(policy)
                }
            };
            let kill_timeout = match &t.kill_timeout {
                Some(v) => Some(duration(
                    v,
                    format!("{tpath}.kill_timeout"),
                    MAX_KILL_TIMEOUT,
                )?),
                None => None,
            };
            let task_name = t.name.ok_or_else(|| missing(&tpath, "name"))?;
            let task_services = read_services(
                &source,
                t.service.unwrap_or_default(),
                ttable.and_then(|t| array_of(t, &["service"])),
                &tpath,
                &format!(
                    "{name}-{}-{task_name}",
                    g.name.as_deref().unwrap_or_default()
                ),
            )?;
            tasks.push(Task {
                devices: t.device.unwrap_or_default(),
                volume_mounts: t.volume_mount.unwrap_or_default(),
                services: task_services,
                name: task_name,
                driver: t.driver.ok_or_else(|| missing(&tpath, "driver"))?,
                config,
                env: strings(
                    ttable.and_then(|t| entry(t, "env")),
                    &format!("{tpath}.env"),
                )?,
                meta: strings(
                    ttable.and_then(|t| entry(t, "meta")),
                    &format!("{tpath}.meta"),
                )?,
                kill_signal: t.kill_signal,
                kill_timeout,
                restart,
                resources: t.resources.unwrap_or_default(),
                logs: t.logs,
                lifecycle: t.lifecycle,
                artifacts: t.artifact.unwrap_or_default(),
                templates: t.template.unwrap_or_default(),
                identity: t.identity,
            });
        }
        if tasks.is_empty() {
            return Err(missing(&gpath, "task"));
        }
        let reschedule = match &g.reschedule {
            None => None,
            Some(r) => {
                // Fields left out keep the job type's default.
                let mut p = ReschedulePolicy::default_for(doc.job_type.unwrap_or_default());
                if let Some(a) = r.attempts {
                    p.attempts = a;
                    // Attempts written without `unlimited` mean a limit.
                    p.unlimited = false;
                }
                if let Some(u) = r.unlimited {
                    p.unlimited = u;
                }
                let path = |f: &str| format!("{gpath}.reschedule.{f}");
                let max = MAX_RESCHEDULE_DURATION;
                if let Some(v) = &r.interval {
                    p.interval = duration(v, path("interval"), max)?;
                }
                if let Some(v) = &r.delay {
                    p.delay = duration(v, path("delay"), max)?;
                    // A delay above the default ceiling raises the ceiling with it.
                    p.max_delay = p.max_delay.max(p.delay);
                }
                if let Some(v) = &r.max_delay {
                    p.max_delay = duration(v, path("max_delay"), max)?;
                }
                Some(p)
            }
        };
        let group_services = read_services(
            &source,
            g.service.unwrap_or_default(),
            gtable.and_then(|t| array_of(t, &["service"])),
            &gpath,
            &format!("{name}-{}", g.name.as_deref().unwrap_or_default()),
        )?;
        let mut network = g.network;
        for p in network.iter_mut().flat_map(|n| n.ports.iter_mut()) {
            p.host_network = crate::nomad::host_network_or_default(&p.host_network);
        }
        let update = match &g.update {
            None => None,
            Some(u) => {
                let merged = u.over(&source, job_update, &format!("{gpath}.update"))?;
                (merged != job_update).then_some(merged)
            }
        };
        groups.push(TaskGroup {
            volumes: g.volume.unwrap_or_default(),
            network,
            services: group_services,
            reschedule,
            update,
            name: g.name.ok_or_else(|| missing(&gpath, "name"))?,
            count: g.count.unwrap_or(1),
            constraints: g.constraint.unwrap_or_default(),
            meta: strings(
                gtable.and_then(|t| entry(t, "meta")),
                &format!("{gpath}.meta"),
            )?,
            tasks,
        });
    }
    if groups.is_empty() {
        return Err(missing("", "group"));
    }
    let spec = JobSpec {
        namespace: doc.namespace.unwrap_or_else(crate::default_namespace),
        name,
        job_type: doc.job_type.unwrap_or_default(),
        priority: doc.priority.unwrap_or(50),
        constraints: doc.constraint.unwrap_or_default(),
        update: job_update,
        meta: strings(entry(table, "meta"), "meta")?,
        datacenters: doc.datacenters.unwrap_or_default(),
        groups,
    };
    Ok(JobFile {
        file: file.to_owned(),
        spec,
        field_lines,
    })
}

/// The `[[service]]` tables of a group or task (at `owner_path`), with Nomad's defaults:
/// the name `default_name` (`JOB-GROUP[-TASK]`), check names `service: "<name>" check`,
/// the service's `check_restart` under each check's own, a 1s grace.
fn read_services(
    source: &Source<'_>,
    docs: Vec<ServiceDoc>,
    values: Option<&toml::de::DeArray<'_>>,
    owner_path: &str,
    default_name: &str,
) -> Result<Vec<ServiceSpec>, JobFileError> {
    let mut out = Vec::with_capacity(docs.len());
    for (i, s) in docs.into_iter().enumerate() {
        let spath = format!("{owner_path}.service[{i}]");
        let table = values
            .and_then(|a| a.get(i))
            .and_then(|v| v.get_ref().as_table());
        let meta = match table.and_then(|t| entry(t, "meta")) {
            Some(v) => source.string_map(v, &format!("{spath}.meta"))?,
            None => BTreeMap::new(),
        };
        let name = s
            .name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| default_name.to_owned());
        let service_restart = s
            .check_restart
            .as_ref()
            .map(|r| check_restart(source, r, None, &format!("{spath}.check_restart")))
            .transpose()?;
        let mut checks = Vec::new();
        for (j, c) in s.check.unwrap_or_default().into_iter().enumerate() {
            let cpath = format!("{spath}.check[{j}]");
            let duration = |v: &Option<Spanned<String>>, field: &str| match v {
                Some(v) => source.duration(v, &format!("{cpath}.{field}"), MAX_CHECK_DURATION),
                // Refused by validation with the field's name.
                None => Ok(Duration::ZERO),
            };
            checks.push(CheckSpec {
                name: c
                    .name
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| default_check_name(&name)),
                check_type: c.check_type.unwrap_or_default().to_ascii_lowercase(),
                interval: duration(&c.interval, "interval")?,
                timeout: duration(&c.timeout, "timeout")?,
                path: c.path.unwrap_or_default(),
                method: c.method.unwrap_or_default(),
                protocol: c.protocol.unwrap_or_default(),
                header: c.header.unwrap_or_default(),
                port: c.port.unwrap_or_default(),
                command: c.command.unwrap_or_default(),
                args: c.args.unwrap_or_default(),
                task: c.task.unwrap_or_default(),
                expose: c.expose.unwrap_or(false),
                check_restart: c
                    .check_restart
                    .as_ref()
                    .map(|r| {
                        check_restart(
                            source,
                            r,
                            s.check_restart.as_ref(),
                            &format!("{cpath}.check_restart"),
                        )
                    })
                    .transpose()?,
            });
        }
        out.push(ServiceSpec {
            name,
            port: s.port.unwrap_or_default(),
            tags: s.tags.unwrap_or_default(),
            meta,
            provider: s
                .provider
                .unwrap_or_else(|| NOMAD_SERVICE_PROVIDER.to_owned()),
            task: s.task.unwrap_or_default(),
            checks,
            check_restart: service_restart,
        });
    }
    Ok(out)
}

/// A `check_restart` table over its service's (`base`), field by field as Nomad merges
/// them; a grace left out is Nomad's 1s.
fn check_restart(
    source: &Source<'_>,
    r: &CheckRestartDoc,
    base: Option<&CheckRestartDoc>,
    path: &str,
) -> Result<CheckRestart, JobFileError> {
    let grace = match r.grace.as_ref().or(base.and_then(|b| b.grace.as_ref())) {
        Some(v) => source.duration(v, &format!("{path}.grace"), MAX_CHECK_DURATION)?,
        None => DEFAULT_CHECK_RESTART_GRACE,
    };
    Ok(CheckRestart {
        limit: r
            .limit
            .filter(|l| *l > 0)
            .or(base.and_then(|b| b.limit))
            .unwrap_or(0),
        grace,
        ignore_warnings: r.ignore_warnings.unwrap_or(false)
            || base.and_then(|b| b.ignore_warnings).unwrap_or(false),
    })
}

/// Parse and validate: the spec a server would accept, or the first problem with its
/// line.
pub fn parse_and_validate(text: &str, file: &str) -> Result<JobSpec, JobFileError> {
    let job = parse(text, file)?;
    job.validate()?;
    Ok(job.spec)
}

impl JobFile {
    /// [`crate::validate()`], with the error placed on the line of its field.
    pub fn validate(&self) -> Result<(), JobFileError> {
        crate::validate::validate(&self.spec).map_err(|e| self.locate(e))
    }

    /// Place a validation error (from this client or from a server's answer) on the
    /// line of its field, or of the nearest enclosing one in the file.
    pub fn locate(&self, e: crate::ValidationError) -> JobFileError {
        JobFileError {
            file: self.file.clone(),
            line: line_for(&self.field_lines, &e.field).unwrap_or(1),
            field: Some(e.field),
            message: e.message,
        }
    }
}

/// The line of `path`, or of the deepest enclosing path the file has.
fn line_for(lines: &BTreeMap<String, usize>, path: &str) -> Option<usize> {
    let mut p = path;
    loop {
        if let Some(line) = lines.get(p) {
            return Some(*line);
        }
        let cut = p.rfind(['.', '['])?;
        p = &p[..cut];
    }
}

fn record_lines(
    source: &Source<'_>,
    value: &DeValue<'_>,
    path: &str,
    out: &mut BTreeMap<String, usize>,
) {
    match value {
        DeValue::Table(t) => {
            for (k, v) in t {
                let key = k.get_ref().to_string();
                // Aliases are recorded under the names validation uses.
                let key = match key.as_str() {
                    "groups" => "group".to_owned(),
                    "tasks" => "task".to_owned(),
                    "constraints" => "constraint".to_owned(),
                    _ => key,
                };
                let p = if path.is_empty() {
                    key
                } else {
                    format!("{path}.{key}")
                };
                out.insert(p.clone(), source.line_of(k.span().start));
                record_lines(source, v.get_ref(), &p, out);
            }
        }
        DeValue::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                let p = format!("{path}[{i}]");
                out.insert(p.clone(), source.line_of(v.span().start));
                record_lines(source, v.get_ref(), &p, out);
            }
        }
        _ => {}
    }
}

fn array_of<'a, 'i>(table: &'a DeTable<'i>, keys: &[&str]) -> Option<&'a toml::de::DeArray<'i>> {
    keys.iter()
        .find_map(|k| entry(table, k))
        .and_then(|v| match v.get_ref() {
            DeValue::Array(a) => Some(a),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ConstraintOperator, LifecycleHook};

    /// The job file of issue 11's interface, plus every other field.
    const FULL: &str = r#"name = "web"
type = "service"
priority = 70
update = { max_parallel = 2 }
meta = { owner = "ops", tier = 1 }

[[constraint]]
attribute = "${attr.kernel.name}"
value = "linux"

[[group]]
name = "app"
count = 3

[[group.constraint]]
attribute = "${node.meta.rack}"
operator = "="
value = "r1"

[[group.constraint]]
operator = "distinct_hosts"

[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sleep", args = ["1000"], nested = { deep = [1, 2.5, true] } }
env = { PORT = 8080, DEBUG = true, NAME = "x" }
kill_signal = "SIGINT"
kill_timeout = "10s"
resources = { cpu = 100, memory_mb = 64 }
restart = { attempts = 2, delay = "5s", mode = "delay" }
logs = { max_files = 3, max_file_size_mb = 1 }

[[group.task]]
name = "prep"
driver = "rawexec"
lifecycle = { hook = "prestart", sidecar = false }

[group.task.config]
command = "/bin/true"

[[group]]
name = "batchy"
[group.meta]
k = "v"
[[group.task]]
name = "t"
driver = "exec"
"#;

    fn error(text: &str) -> String {
        parse(text, "web.toml").unwrap_err().to_string()
    }

    fn invalid(text: &str) -> String {
        parse_and_validate(text, "web.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_field_maps_onto_the_spec() {
        let spec = parse_and_validate(FULL, "web.toml").unwrap();
        assert_eq!(spec.name, "web");
        assert_eq!(spec.job_type, JobType::Service);
        assert_eq!(spec.priority, 70);
        assert_eq!(spec.update.max_parallel, 2);
        assert_eq!(spec.meta["owner"], "ops");
        assert_eq!(spec.meta["tier"], "1");
        assert_eq!(spec.constraints.len(), 1);
        assert_eq!(spec.constraints[0].operator, ConstraintOperator::Equal);
        assert_eq!(spec.groups.len(), 2);
        let g = &spec.groups[0];
        assert_eq!((g.name.as_str(), g.count), ("app", 3));
        assert_eq!(g.constraints[0].attribute, "${node.meta.rack}");
        assert_eq!(g.constraints[0].value, "r1");
        assert_eq!(g.constraints[1].operator, ConstraintOperator::DistinctHosts);
        let t = &g.tasks[0];
        assert_eq!(t.driver, "rawexec");
        assert_eq!(
            t.config,
            serde_json::json!({"command": "/bin/sleep", "args": ["1000"], "nested": {"deep": [1, 2.5, true]}})
        );
        assert_eq!(t.env["PORT"], "8080");
        assert_eq!(t.env["DEBUG"], "true");
        assert_eq!(t.env["NAME"], "x");
        assert_eq!(t.kill_signal.as_deref(), Some("SIGINT"));
        assert_eq!(t.kill_timeout, Some(Duration::from_secs(10)));
        assert_eq!(
            t.resources,
            TaskResources {
                cpu: 100,
                memory_mb: 64,
                memory_max_mb: 0
            }
        );
        assert_eq!(
            t.restart,
            Some(RestartPolicy {
                attempts: 2,
                interval: RestartPolicy::DEFAULT_INTERVAL,
                delay: Duration::from_secs(5),
                mode: RestartMode::Delay
            })
        );
        assert_eq!(
            t.logs,
            Some(LogConfig {
                max_files: 3,
                max_file_size_mb: 1
            })
        );
        assert_eq!(t.lifecycle, None);
        let prep = &g.tasks[1];
        assert_eq!(
            prep.lifecycle.map(|l| l.hook),
            Some(LifecycleHook::Prestart)
        );
        assert_eq!(prep.config, serde_json::json!({"command": "/bin/true"}));
        assert_eq!(prep.resources, TaskResources::default());
        let b = &spec.groups[1];
        assert_eq!((b.name.as_str(), b.count), ("batchy", 1));
        assert_eq!(b.meta["k"], "v");
        assert_eq!(b.tasks[0].config, serde_json::json!({}));
        // What a file gives and what the HTTP API takes are the same spec.
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(serde_json::from_value::<JobSpec>(json).unwrap(), spec);
    }

    #[test]
    fn artifact_and_template_tables() {
        let text = r#"name = "web"
[[group]]
name = "g"
[[group.task]]
name = "t"
driver = "raw_exec"
[[group.task.artifact]]
source = "http://127.0.0.1:8000/app.tgz"
options = { checksum = "md5:0123456789abcdef0123456789abcdef" }
[[group.task.template]]
data = "A={{ env \"NOMAD_TASK_NAME\" }}"
destination = "secrets/a.env"
env = true
change_mode = "noop"
splay = "1s"
"#;
        let spec = parse_and_validate(text, "web.toml").unwrap();
        let t = &spec.groups[0].tasks[0];
        assert_eq!(t.artifacts[0].destination, "local/");
        assert_eq!(t.templates[0].change_mode, crate::types::ChangeMode::Noop);
        assert_eq!(t.templates[0].splay, Duration::from_secs(1));
        assert_eq!(t.templates[0].perms, "644");
        let e = invalid(&text.replace("secrets/a.env", "/etc/a.env"));
        assert!(
            e.contains("group[0].task[0].template[0].destination"),
            "{e}"
        );
        let e = error(&text.replace("change_mode", "chnage_mode"));
        assert!(e.contains("chnage_mode"), "{e}");
    }

    #[test]
    fn the_issue_example_parses() {
        let text = r#"name = "web"
type = "service"            # service | batch | system
[[group]]
name = "app"
count = 3
[[group.constraint]]
attribute = "${node.meta.rack}"
operator = "="
value = "r1"
[[group.task]]
name = "main"
driver = "rawexec"
config = { command = "/bin/sleep", args = ["1000"] }
resources = { cpu = 100, memory_mb = 64 }
lifecycle = { hook = "prestart", sidecar = false }   # optional
[[group.task]]
name = "real"
driver = "rawexec"
"#;
        let spec = parse_and_validate(text, "web.toml").unwrap();
        assert_eq!(spec.groups[0].tasks.len(), 2);
        let batch = parse_and_validate(
            "name = \"b\"\ntype = \"batch\"\n[[groups]]\nname = \"g\"\n[[groups.tasks]]\nname = \"t\"\ndriver = \"rawexec\"\n",
            "b.toml",
        )
        .unwrap();
        assert_eq!(batch.job_type, JobType::Batch);
    }

    #[test]
    fn a_misspelt_key_is_refused_with_its_line() {
        let text = FULL.replace("count = 3", "cuont = 3");
        let e = error(&text);
        assert!(
            e.starts_with("web.toml:13: group[0].cuont: unknown field `cuont`, expected one of"),
            "{e}"
        );
        let e = error(&FULL.replace("kill_timeout = \"10s\"", "kill_timout = \"10s\""));
        assert!(
            e.starts_with("web.toml:29: group[0].task[0].kill_timout: unknown field `kill_timout`"),
            "{e}"
        );
        let e = error(&FULL.replace("memory_mb = 64", "memory = 64"));
        assert!(
            e.starts_with("web.toml:30: group[0].task[0].resources.memory: unknown field `memory`"),
            "{e}"
        );
        let e = error(&FULL.replace("operator = \"=\"", "operater = \"=\""));
        assert!(
            e.starts_with("web.toml:17: group[0].constraint[0].operater: unknown field"),
            "{e}"
        );
        let e = error("nmae = \"web\"\n");
        assert!(
            e.starts_with("web.toml:1: nmae: unknown field `nmae`"),
            "{e}"
        );
        let e = error(&FULL.replace("max_parallel = 2", "max_paralel = 2"));
        assert!(
            e.starts_with("web.toml:4: update.max_paralel: unknown field"),
            "{e}"
        );
        let e = error(&FULL.replace("hook = \"prestart\"", "hook = \"prestrat\""));
        assert!(
            e.starts_with(
                "web.toml:37: group[0].task[1].lifecycle.hook: unknown variant `prestrat`"
            ),
            "{e}"
        );
    }

    #[test]
    fn task_sections_may_be_tables_as_in_spec_files() {
        let text = "name = \"w\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\n\
                    [group.task.resources]\ncpu = 250\nmemory_mb = 128\n[group.task.env]\nA = 1\n";
        let spec = parse_and_validate(text, "w.toml").unwrap();
        let t = &spec.groups[0].tasks[0];
        assert_eq!((t.resources.cpu, t.resources.memory_mb), (250, 128));
        assert_eq!(t.env["A"], "1");
        let e = error(&text.replace("cpu = 250", "cpu_shares = 250"));
        assert!(
            e.starts_with(
                "web.toml:8: group[0].task[0].resources.cpu_shares: unknown field `cpu_shares`"
            ) && e.ends_with("(a job reserves CPU in MHz: write `cpu`)"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_and_values_are_named() {
        let e = error("name = \"web\"\ntype = \"daemon\"\n");
        assert!(
            e.starts_with("web.toml:2: type: unknown variant `daemon`, expected one of"),
            "{e}"
        );
        let e = error(&FULL.replace("count = 3", "count = \"three\""));
        assert!(
            e.starts_with("web.toml:13: group[0].count: invalid type: string"),
            "{e}"
        );
        let e = error(&FULL.replace("operator = \"=\"", "operator = \"~=\""));
        assert!(
            e.starts_with("web.toml:17: group[0].constraint[0].operator: unknown variant `~=`"),
            "{e}"
        );
        let e = error(&FULL.replace("kill_timeout = \"10s\"", "kill_timeout = \"soon\""));
        assert!(
            e.starts_with("web.toml:29: group[0].task[0].kill_timeout: \"soon\" is not a duration"),
            "{e}"
        );
        let e = error(&FULL.replace("kill_timeout = \"10s\"", "kill_timeout = \"2days\""));
        assert_eq!(
            e,
            "web.toml:29: group[0].task[0].kill_timeout: \"2days\" is longer than the maximum of 1day"
        );
        let e = error(&FULL.replace("delay = \"5s\"", "delay = \"later\""));
        assert!(
            e.starts_with(
                "web.toml:31: group[0].task[0].restart.delay: \"later\" is not a duration"
            ),
            "{e}"
        );
        let e = error(&FULL.replace("NAME = \"x\"", "NAME = [1]"));
        assert_eq!(
            e,
            "web.toml:27: group[0].task[0].env.NAME: expected a string, found array"
        );
        let e = error(
            "name = \"w\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\nconfig = \"x\"\n",
        );
        assert_eq!(
            e,
            "web.toml:7: group[0].task[0].config: expected a table, found string"
        );
        let e = error(
            "name = \"w\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\n[group.task.config]\nratio = nan\n",
        );
        assert_eq!(
            e,
            "web.toml:8: group[0].task[0].config.ratio: float cannot be represented in JSON"
        );
        let e = error(&FULL.replace("owner = \"ops\"", "owner = { b = 1 }"));
        assert_eq!(e, "web.toml:5: meta.owner: expected a string, found table");
    }

    #[test]
    fn update_blocks_merge_a_groups_over_the_jobs_and_canaries_beyond_count_are_refused() {
        let text = "name = \"web\"\nupdate = { max_parallel = 2, min_healthy_time = \"2s\", auto_revert = true }\n\
            [[group]]\nname = \"g\"\ncount = 2\nupdate = { canary = 1, health_check = \"task_states\" }\n\
            [[group.task]]\nname = \"t\"\ndriver = \"rawexec\"\n";
        let spec = parse_and_validate(text, "web.toml").unwrap();
        let u = spec.update_of(&spec.groups[0]);
        assert_eq!(
            (
                u.max_parallel,
                u.min_healthy_time,
                u.auto_revert,
                u.canary,
                u.health_check
            ),
            (
                2,
                Duration::from_secs(2),
                true,
                1,
                HealthCheckMode::TaskStates
            )
        );
        let e = parse_and_validate(&text.replace("canary = 1", "canary = 3"), "web.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("web.toml:6: group[0].update.canary: 3 canaries is more than"),
            "{e}"
        );
        let e = parse_and_validate(&text.replace("\"2s\"", "\"soon\""), "web.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("web.toml:2: update.min_healthy_time:"), "{e}");
    }

    #[test]
    fn reschedule_blocks_parse_over_the_job_types_default() {
        let file = |job_type: &str, block: &str| {
            format!(
                "name = \"w\"\ntype = \"{job_type}\"\n[[group]]\nname = \"g\"\n{block}\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\n"
            )
        };
        let spec = parse_and_validate(
            &file(
                "service",
                "reschedule = { delay = \"2s\", max_delay = \"8s\" }",
            ),
            "w.toml",
        )
        .unwrap();
        assert_eq!(
            spec.groups[0].reschedule,
            Some(crate::ReschedulePolicy {
                attempts: 0,
                interval: Duration::ZERO,
                delay: Duration::from_secs(2),
                max_delay: Duration::from_secs(8),
                unlimited: true,
            })
        );
        let spec = parse_and_validate(
            &file("batch", "reschedule = { attempts = 3, interval = \"1h\" }"),
            "w.toml",
        )
        .unwrap();
        let r = spec.groups[0].reschedule.unwrap();
        assert_eq!((r.attempts, r.unlimited), (3, false));
        assert_eq!(r.interval, Duration::from_secs(3600));
        assert_eq!(r.delay, Duration::from_secs(5), "batch default");
        assert_eq!(
            parse_and_validate(&file("service", ""), "w.toml")
                .unwrap()
                .groups[0]
                .reschedule,
            None
        );
        assert_eq!(
            error(&file("service", "reschedule = { delay = \"soon\" }")),
            "web.toml:5: group[0].reschedule.delay: \"soon\" is not a duration like \"5s\" or \"1m30s\": expected number at 0"
        );
        assert_eq!(
            invalid(&file("service", "reschedule = { delay = \"0s\" }")),
            "web.toml:5: group[0].reschedule.delay: must be more than 0s"
        );
        assert!(
            error(&file("service", "reschedule = { dealy = \"1s\" }"))
                .contains("unknown field `dealy`")
        );
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = error("name = \"web\"\n[[group]\n");
        assert!(e.starts_with("web.toml:2: invalid TOML at column "), "{e}");
    }

    #[test]
    fn missing_fields_are_named_on_their_table() {
        assert_eq!(error("type = \"batch\"\n"), "web.toml:1: name: missing");
        assert_eq!(error("name = \"web\"\n"), "web.toml:1: group: missing");
        assert_eq!(
            error(
                "name = \"web\"\n\n[[group]]\ncount = 1\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\n"
            ),
            "web.toml:3: group[0].name: missing"
        );
        assert_eq!(
            error("name = \"web\"\n[[group]]\nname = \"g\"\n"),
            "web.toml:2: group[0].task: missing"
        );
        assert_eq!(
            error("name = \"web\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\n"),
            "web.toml:4: group[0].task[0].driver: missing"
        );
    }

    #[test]
    fn validation_errors_are_placed_on_their_line() {
        let e = invalid(&FULL.replace("memory_mb = 64", "memory_mb = 0"));
        assert_eq!(
            e,
            "web.toml:30: group[0].task[0].resources.memory_mb: must be at least 1 (MiB)"
        );
        let e = invalid(&FULL.replace("name = \"prep\"", "name = \"main\""));
        assert_eq!(
            e,
            "web.toml:35: group[0].task[1].name: task name \"main\" is used twice in group \"app\""
        );
        let e = invalid(
            &FULL
                .replace("value = \"r1\"", "value = \"r1\"\noperator = \"regexp\"")
                .replace("operator = \"=\"\n", "")
                .replace("value = \"r1\"", "value = \"r[1\""),
        );
        assert!(
            e.starts_with(
                "web.toml:17: group[0].constraint[0].value: \"r[1\" is not a regular expression"
            ),
            "{e}"
        );
        // Defaults the file does not write are placed on the enclosing table.
        let e = invalid(
            "name = \"w\"\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\nresources = { cpu = 0 }\n",
        );
        assert_eq!(
            e,
            "web.toml:7: group[0].task[0].resources.cpu: must be at least 1 (MHz)"
        );
        let e = invalid(
            "name = \"w\"\npriority = 0\n[[group]]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"d\"\n",
        );
        assert_eq!(e, "web.toml:2: priority: 0 is not within 1..=100");
    }

    /// A host-mode service with checks, and a bridge one with a mapped port.
    const SERVICES: &str = r#"name = "shop"

[[group]]
name = "web"
count = 3

[group.network]
mode = "host"

[[group.network.port]]
label = "http"

[[group.network.port]]
label = "admin"
static = 8081

[[group.service]]
name = "web"
port = "http"
tags = ["v1"]
meta = { version = 1 }
task = "server"
check_restart = { limit = 3 }

[[group.service.check]]
type = "http"
path = "/health"
interval = "10s"
timeout = "2s"
header = { X-Probe = ["a", "b"] }

[[group.service.check]]
name = "admin answers"
type = "tcp"
port = "admin"
interval = "30s"
timeout = "1s"
check_restart = { grace = "20s" }

[[group.task]]
name = "server"
driver = "rawexec"
config = { command = "python3", args = ["-m", "http.server", "${NOMAD_PORT_http}"] }

[[group.task.service]]
port = "admin"

[[group.task.service.check]]
type = "script"
command = "/bin/true"
interval = "5s"
timeout = "1s"

[[group]]
name = "api"
network = { mode = "bridge", port = [{ label = "http", static = 8080, to = 80 }] }

[[group.service]]
port = "http"

[[group.task]]
name = "api"
driver = "rawexec"
"#;

    #[test]
    fn networks_services_and_checks_parse_with_nomads_defaults() {
        let spec = parse_and_validate(SERVICES, "shop.toml").unwrap_or_else(|e| panic!("{e}"));
        let web = &spec.groups[0];
        let net = web.network.as_ref().expect("a network");
        assert_eq!(net.mode, crate::types::NetworkMode::Host);
        assert_eq!(
            net.ports
                .iter()
                .map(|p| (p.label.as_str(), p.static_port))
                .collect::<Vec<_>>(),
            [("http", 0), ("admin", 8081)]
        );
        let s = &web.services[0];
        assert_eq!((s.name.as_str(), s.port.as_str()), ("web", "http"));
        assert_eq!(s.provider, "nomad");
        assert_eq!(s.meta["version"], "1");
        assert_eq!(s.checks[0].name, "service: \"web\" check");
        assert_eq!(s.checks[0].interval, Duration::from_secs(10));
        assert_eq!(s.checks[0].header["X-Probe"], ["a", "b"]);
        assert_eq!(
            s.check_restart,
            Some(CheckRestart {
                limit: 3,
                grace: Duration::from_secs(1),
                ignore_warnings: false
            })
        );
        // A check's own check_restart over its service's, field by field.
        assert_eq!(
            s.checks[1].check_restart,
            Some(CheckRestart {
                limit: 3,
                grace: Duration::from_secs(20),
                ignore_warnings: false
            })
        );
        let ts = &web.tasks[0].services[0];
        assert_eq!(ts.name, "shop-web-server");
        assert_eq!(ts.checks[0].name, "service: \"shop-web-server\" check");
        let api = &spec.groups[1];
        let net = api.network.as_ref().expect("a network");
        assert_eq!(net.mode, crate::types::NetworkMode::Bridge);
        assert_eq!((net.ports[0].static_port, net.ports[0].to), (8080, 80));
        assert_eq!(api.services[0].name, "shop-api");
    }

    #[test]
    fn service_errors_name_their_field_and_line() {
        let e = error(&SERVICES.replace("path = \"/health\"", "path = \"/health\"\npaht = \"/\""));
        assert!(
            e.starts_with("web.toml:28: group[0].service[0].check[0].paht: unknown field"),
            "{e}"
        );
        let e = error(&SERVICES.replace("interval = \"10s\"", "interval = \"often\""));
        assert!(
            e.starts_with("web.toml:28: group[0].service[0].check[0].interval:"),
            "{e}"
        );
        let e = invalid(&SERVICES.replace("type = \"tcp\"", "type = \"grpc\""));
        assert!(
            e.starts_with(
                "web.toml:34: group[0].service[0].check[1].type: unknown check type \"grpc\""
            ),
            "{e}"
        );
        let e = invalid(&SERVICES.replace("port = \"admin\"\n\n", "port = \"metrics\"\n\n"));
        assert!(
            e.starts_with("web.toml:46: group[0].task[0].service[0].port: port \"metrics\""),
            "{e}"
        );
        let e = invalid(&SERVICES.replace("static = 8081", "static = 80810"));
        assert!(
            e.starts_with("web.toml:15: group[0].network.port[1].static:"),
            "{e}"
        );
        let e = error(&SERVICES.replace("mode = \"host\"", "mode = \"overlay\""));
        assert!(
            e.starts_with("web.toml:8: group[0].network.mode: unknown variant `overlay`"),
            "{e}"
        );
        let e = error(&SERVICES.replace("static = 8081", "statik = 8081"));
        assert!(
            e.starts_with("web.toml:15: group[0].network.port[1].statik: unknown field"),
            "{e}"
        );
        let e = invalid(&SERVICES.replace("tags = [\"v1\"]", "provider = \"consul\""));
        assert!(
            e.starts_with("web.toml:20: group[0].service[0].provider:"),
            "{e}"
        );
    }

    /// A TOML task's `[[group.task.device]]` tables are its device requests, checked
    /// like the others (issue 27).
    #[test]
    fn toml_device_requests() {
        let text = r#"name = "gpu"
[[group]]
name = "g"
[[group.task]]
name = "t"
driver = "raw_exec"
config = { command = "/bin/true" }
[[group.task.device]]
name = "nvidia/gpu"
count = 2
[[group.task.device.constraint]]
attribute = "${device.attr.memory}"
operator = ">="
value = "4"
"#;
        let spec = parse_and_validate(text, "gpu.toml").expect("valid");
        let d = &spec.groups[0].tasks[0].devices;
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].name.as_str(), d[0].count), ("nvidia/gpu", 2));
        assert_eq!(
            d[0].constraints[0].operator,
            ConstraintOperator::GreaterEqual
        );
        let e = parse_and_validate(&text.replace("count = 2", "count = 0"), "gpu.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("count") && e.contains("must be 1 to 64"), "{e}");
    }

    /// Issue 27: `[group.volume.NAME]` and `[[group.task.volume_mount]]`.
    #[test]
    fn volumes_and_volume_mounts_are_read_and_checked() {
        let text = |extra: &str| {
            format!(
                "name = \"v\"\n[[group]]\nname = \"g\"\n[group.volume.data]\ntype = \"host\"\n\
                 source = \"shared\"\nread_only = true\n[[group.task]]\nname = \"t\"\n\
                 driver = \"exec\"\n[[group.task.volume_mount]]\n{extra}"
            )
        };
        let spec = parse_and_validate(
            &text("volume = \"data\"\ndestination = \"/data\"\n"),
            "v.toml",
        )
        .unwrap();
        let g = &spec.groups[0];
        assert!(g.volumes["data"].read_only);
        assert_eq!(g.volumes["data"].source, "shared");
        assert_eq!(g.tasks[0].volume_mounts[0].destination, "/data");
        let e = invalid(&text("volume = \"data\"\ndestination = \"data\"\n"));
        assert!(e.contains("volume_mount[0].destination"), "{e}");
        let e = error(&text("volume = \"data\"\ndestinaton = \"/data\"\n"));
        assert!(e.contains("destinaton"), "{e}");
    }
}
