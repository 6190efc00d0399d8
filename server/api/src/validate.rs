//! Checks a [`JobSpec`] before the server accepts it (registration, `job plan`) and
//! before the CLI sends it: what the types alone cannot say (names, counts, constraint
//! syntax, resources). Every error names the field, as a path into the job
//! (`group[0].task[1].resources.memory_mb`), which the job-file parser maps back to a
//! line.
//!
//! The constraint helpers ([`version_requirement`], [`lenient_version`],
//! [`interpolation_target`]) are what the scheduler evaluates with, so that a job the
//! server accepted is read the same way when it is placed.

use std::collections::BTreeSet;

use drover_api::{MAX_KILL_TIMEOUT, MAX_RESTART_DURATION};

use crate::services::{MAX_SERVICE_NAME_BYTES, MAX_SERVICES_PER_ALLOC};
use crate::taskfiles::Root;
use crate::types::{
    CHECK_TYPES, CheckSpec, Constraint, ConstraintOperator, JobSpec, JobType, LifecycleHook,
    NOMAD_SERVICE_PROVIDER, NetworkSpec, ReschedulePolicy, ServiceSpec, Task, TaskGroup,
    UpdateStrategy,
};

/// Most copies of one group a job may ask for.
pub const MAX_COUNT: u32 = 10_000;

/// Longest job, group or task name.
pub const MAX_NAME_LEN: usize = 128;

/// Most groups in one job. The caps below bound what one registration makes the
/// server store, keep in memory and send to nodes (a job is copied into every
/// version kept and its group into every allocation a client receives).
pub const MAX_GROUPS: usize = 100;
/// Most tasks in one group.
pub const MAX_TASKS: usize = 50;
/// Most copies of all groups of a job together.
pub const MAX_JOB_COUNT: u64 = 10_000;
/// Most constraints on a job or on a group.
pub const MAX_CONSTRAINTS: usize = 64;
/// Datacenter patterns per job (each is matched against every node per evaluation).
pub const MAX_DATACENTERS: usize = 64;
/// Most entries of a task's `env`, of a job's or a group's `meta`.
pub const MAX_MAP_ENTRIES: usize = 256;
/// Most bytes (keys and values) of a task's `env`, of a job's or a group's `meta`.
pub const MAX_MAP_BYTES: usize = 64 * 1024;
/// Most bytes of a task's `config` as JSON.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// Most reschedule attempts per interval a group may allow.
pub const MAX_RESCHEDULE_ATTEMPTS: u32 = 100;
/// Longest reschedule delay, maximum delay or interval.
pub const MAX_RESCHEDULE_DURATION: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);
/// Longest duration of an `update` block.
pub const MAX_UPDATE_DURATION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Most ports of one group's network.
pub const MAX_PORTS: usize = 64;
/// Most services of a group, or of a task.
pub const MAX_SERVICES: usize = 32;
/// Most checks of one service.
pub const MAX_CHECKS: usize = 16;
/// Most tags of one service.
pub const MAX_TAGS: usize = 64;
/// Shortest time between two runs of a check (Nomad's minimum).
pub const MIN_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest check interval or timeout.
pub const MAX_CHECK_DURATION: std::time::Duration = std::time::Duration::from_secs(3600);
/// Longest service tag.
pub const MAX_TAG_LEN: usize = 256;
/// Most arguments of a script check.
pub const MAX_CHECK_ARGS: usize = 64;
/// Most header names of an http check.
pub const MAX_CHECK_HEADERS: usize = 32;
/// Most values of one header of an http check.
pub const MAX_CHECK_HEADER_VALUES: usize = 16;
/// Most bytes of an http check's headers (names and values).
pub const MAX_CHECK_HEADER_BYTES: usize = 8 * 1024;

/// Why a job spec was refused. Displays as `FIELD: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// Path of the field, e.g. `group[0].task[1].resources.memory_mb` (`name` for the
    /// job's name).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn fail(field: impl Into<String>, message: impl Into<String>) -> ValidationError {
    ValidationError {
        field: field.into(),
        message: message.into(),
    }
}

/// Check `spec`; the first problem found is returned.
pub fn validate(spec: &JobSpec) -> Result<(), ValidationError> {
    check_name("name", &spec.name)?;
    crate::namespaces::check_namespace_name(&spec.namespace)
        .map_err(|why| fail("namespace", why))?;
    if !(1..=100).contains(&spec.priority) {
        return Err(fail(
            "priority",
            format!("{} is not within 1..=100", spec.priority),
        ));
    }
    check_len("constraint", spec.constraints.len(), MAX_CONSTRAINTS)?;
    for (i, c) in spec.constraints.iter().enumerate() {
        check_constraint(&format!("constraint[{i}]"), c)?;
    }
    check_map("meta", &spec.meta)?;
    check_len("datacenters", spec.datacenters.len(), MAX_DATACENTERS)?;
    for (i, dc) in spec.datacenters.iter().enumerate() {
        if dc.is_empty()
            || dc.len() > MAX_NAME_LEN
            || dc.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(fail(
                format!("datacenters[{i}]"),
                format!(
                    "{dc:?} is not a datacenter or pattern: expected 1 to {MAX_NAME_LEN} \
                     characters without spaces, `*` for any run of characters (\"dc1\", \"eu-*\")"
                ),
            ));
        }
    }
    if spec.groups.is_empty() {
        return Err(fail("group", "a job needs at least one group"));
    }
    if spec.groups.len() > MAX_GROUPS {
        return Err(fail(
            "group",
            format!("{} groups, at most {MAX_GROUPS} per job", spec.groups.len()),
        ));
    }
    check_update("update", spec.job_type, &spec.update, None)?;
    let mut groups = BTreeSet::new();
    for (i, g) in spec.groups.iter().enumerate() {
        let path = format!("group[{i}]");
        check_group(&path, g)?;
        let (upath, u) = match &g.update {
            Some(u) => (format!("{path}.update"), u),
            None => ("update".to_owned(), &spec.update),
        };
        check_update(&upath, spec.job_type, u, Some(g))?;
        if !groups.insert(g.name.as_str()) {
            return Err(fail(
                format!("{path}.name"),
                format!("group name {:?} is used twice", g.name),
            ));
        }
    }
    let total: u64 = spec.groups.iter().map(|g| u64::from(g.count)).sum();
    if total > MAX_JOB_COUNT {
        return Err(fail(
            "group.count",
            format!(
                "the groups' counts add up to {total}, more than the maximum of {MAX_JOB_COUNT} per job"
            ),
        ));
    }
    Ok(())
}

/// An update strategy (`path`: where it was written), for `group` when given.
fn check_update(
    path: &str,
    job_type: JobType,
    u: &UpdateStrategy,
    group: Option<&TaskGroup>,
) -> Result<(), ValidationError> {
    let human = drover_api::human_duration;
    for (field, d) in [
        ("min_healthy_time", u.min_healthy_time),
        ("healthy_deadline", u.healthy_deadline),
        ("progress_deadline", u.progress_deadline),
        ("stagger", u.stagger),
    ] {
        if d > MAX_UPDATE_DURATION {
            return Err(fail(
                format!("{path}.{field}"),
                format!(
                    "{} is longer than the maximum of {}",
                    human(d),
                    human(MAX_UPDATE_DURATION)
                ),
            ));
        }
    }
    if u.healthy_deadline.is_zero() {
        return Err(fail(
            format!("{path}.healthy_deadline"),
            "must be more than 0s",
        ));
    }
    if u.min_healthy_time >= u.healthy_deadline {
        return Err(fail(
            format!("{path}.min_healthy_time"),
            format!(
                "{} is not shorter than healthy_deadline ({}): no allocation could turn healthy",
                human(u.min_healthy_time),
                human(u.healthy_deadline)
            ),
        ));
    }
    if !u.progress_deadline.is_zero() && u.healthy_deadline >= u.progress_deadline {
        return Err(fail(
            format!("{path}.progress_deadline"),
            format!(
                "{} is not longer than healthy_deadline ({}) (0 turns it off)",
                human(u.progress_deadline),
                human(u.healthy_deadline)
            ),
        ));
    }
    if u.canary > 0 && job_type != JobType::Service {
        return Err(fail(
            format!("{path}.canary"),
            format!(
                "canaries are for service jobs, not {} jobs",
                job_type.as_str()
            ),
        ));
    }
    if u.canary > 0 && !u.deploys() {
        return Err(fail(
            format!("{path}.canary"),
            "canaries need a deployment: set max_parallel to 1 or more",
        ));
    }
    if u.auto_promote && u.canary == 0 && group.is_some() {
        return Err(fail(
            format!("{path}.auto_promote"),
            "auto_promote promotes canaries: set canary to 1 or more",
        ));
    }
    if let Some(g) = group
        && u.canary > g.count
    {
        return Err(fail(
            format!("{path}.canary"),
            format!(
                "{} canaries is more than group {:?}'s count of {}",
                u.canary, g.name, g.count
            ),
        ));
    }
    Ok(())
}

fn check_len(field: &str, len: usize, max: usize) -> Result<(), ValidationError> {
    if len > max {
        return Err(fail(field, format!("{len} entries, at most {max}")));
    }
    Ok(())
}

/// `env` and `meta`: bounded in entries and bytes.
fn check_map(
    field: &str,
    map: &std::collections::BTreeMap<String, String>,
) -> Result<(), ValidationError> {
    check_len(field, map.len(), MAX_MAP_ENTRIES)?;
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(fail(
            field,
            format!("{bytes} bytes of keys and values, at most {MAX_MAP_BYTES}"),
        ));
    }
    Ok(())
}

fn check_reschedule(path: &str, r: &ReschedulePolicy) -> Result<(), ValidationError> {
    for (name, d) in [
        ("delay", r.delay),
        ("max_delay", r.max_delay),
        ("interval", r.interval),
    ] {
        if d > MAX_RESCHEDULE_DURATION {
            return Err(fail(
                format!("{path}.{name}"),
                format!(
                    "{} is longer than the maximum of {}",
                    drover_api::human_duration(d),
                    drover_api::human_duration(MAX_RESCHEDULE_DURATION)
                ),
            ));
        }
    }
    if r.delay.is_zero() {
        // No delay is the endless replace loop the policy exists to prevent.
        return Err(fail(format!("{path}.delay"), "must be more than 0s"));
    }
    if r.max_delay < r.delay {
        return Err(fail(
            format!("{path}.max_delay"),
            format!(
                "{} is shorter than delay ({})",
                drover_api::human_duration(r.max_delay),
                drover_api::human_duration(r.delay)
            ),
        ));
    }
    if !r.unlimited {
        if r.attempts > MAX_RESCHEDULE_ATTEMPTS {
            return Err(fail(
                format!("{path}.attempts"),
                format!(
                    "{} is more than the maximum of {MAX_RESCHEDULE_ATTEMPTS}",
                    r.attempts
                ),
            ));
        }
        if r.attempts > 0 && r.interval.is_zero() {
            return Err(fail(
                format!("{path}.interval"),
                "must be more than 0s when attempts are counted (or set unlimited = true)",
            ));
        }
    }
    Ok(())
}

fn check_name(field: &str, name: &str) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(fail(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(fail(
            field,
            format!(
                "is {} characters long, more than {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(fail(
            field,
            format!(
                "{name:?} contains {bad:?}: only letters, digits, '_', '.' and '-' are allowed"
            ),
        ));
    }
    Ok(())
}

fn check_group(path: &str, g: &TaskGroup) -> Result<(), ValidationError> {
    check_name(&format!("{path}.name"), &g.name)?;
    if g.count > MAX_COUNT {
        return Err(fail(
            format!("{path}.count"),
            format!("{} is more than the maximum of {MAX_COUNT}", g.count),
        ));
    }
    check_len(
        &format!("{path}.constraint"),
        g.constraints.len(),
        MAX_CONSTRAINTS,
    )?;
    for (i, c) in g.constraints.iter().enumerate() {
        check_constraint(&format!("{path}.constraint[{i}]"), c)?;
    }
    check_map(&format!("{path}.meta"), &g.meta)?;
    if let Some(r) = &g.reschedule {
        check_reschedule(&format!("{path}.reschedule"), r)?;
    }
    if g.tasks.is_empty() {
        return Err(fail(
            format!("{path}.task"),
            "a group needs at least one task",
        ));
    }
    if g.tasks.len() > MAX_TASKS {
        return Err(fail(
            format!("{path}.task"),
            format!("{} tasks, at most {MAX_TASKS} per group", g.tasks.len()),
        ));
    }
    if let Some(n) = &g.network {
        check_network(&format!("{path}.network"), n)?;
    }
    check_services(&format!("{path}.service"), &g.services, g, None)?;
    check_volumes(path, g)?;
    let mut names = BTreeSet::new();
    for (i, t) in g.tasks.iter().enumerate() {
        let tpath = format!("{path}.task[{i}]");
        check_task(&tpath, t)?;
        check_services(&format!("{tpath}.service"), &t.services, g, Some(t))?;
        if !names.insert(t.name.as_str()) {
            return Err(fail(
                format!("{tpath}.name"),
                format!("task name {:?} is used twice in group {:?}", t.name, g.name),
            ));
        }
    }
    // One allocation of the group registers all of these: the server takes at most
    // this many from it, so a bigger group is refused here, not its node's reports.
    let services = g.services.len() + g.tasks.iter().map(|t| t.services.len()).sum::<usize>();
    if services > MAX_SERVICES_PER_ALLOC {
        return Err(fail(
            format!("{path}.service"),
            format!(
                "the group and its tasks have {services} services, at most \
                 {MAX_SERVICES_PER_ALLOC} per group"
            ),
        ));
    }
    if g.tasks.iter().all(|t| t.lifecycle.is_some()) {
        return Err(fail(
            format!("{path}.task"),
            format!(
                "group {:?} has no main task: every task has a lifecycle hook",
                g.name
            ),
        ));
    }
    Ok(())
}

fn check_network(path: &str, n: &NetworkSpec) -> Result<(), ValidationError> {
    check_len(&format!("{path}.port"), n.ports.len(), MAX_PORTS)?;
    let mut labels = BTreeSet::new();
    for (i, p) in n.ports.iter().enumerate() {
        let ppath = format!("{path}.port[{i}]");
        // The label ends up in variable names (NOMAD_PORT_<label>).
        if p.label.is_empty()
            || p.label.len() > MAX_NAME_LEN
            || !p
                .label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(fail(
                format!("{ppath}.label"),
                format!(
                    "{:?} is not a port label: 1 to {MAX_NAME_LEN} letters, digits, '_' or '-'",
                    p.label
                ),
            ));
        }
        if !labels.insert(p.label.as_str()) {
            return Err(fail(
                format!("{ppath}.label"),
                format!("port label {:?} is used twice", p.label),
            ));
        }
        if p.static_port > u32::from(u16::MAX) {
            return Err(fail(
                format!("{ppath}.static"),
                format!("{} is not a port: 1-65535", p.static_port),
            ));
        }
        if !(-1..=i32::from(u16::MAX)).contains(&p.to) {
            return Err(fail(
                format!("{ppath}.to"),
                format!(
                    "{} is not a port: 1-65535 (or -1: the same as the node's)",
                    p.to
                ),
            ));
        }
        if !(p.host_network.is_empty() || p.host_network == "default") {
            return Err(fail(
                format!("{ppath}.host_network"),
                format!(
                    "host network {:?}: Drover nodes have only the \"default\" one",
                    p.host_network
                ),
            ));
        }
    }
    Ok(())
}

/// A service's (or check's) `port`: a label of the group's network, or (for a
/// service's own port only, which is advertised but never probed) a number. A check
/// probes only a port of its allocation: a number would let a job probe any port
/// of the node's address.
fn check_port_ref(
    field: String,
    port: &str,
    g: &TaskGroup,
    number_allowed: bool,
) -> Result<(), ValidationError> {
    if port.parse::<u16>().is_ok_and(|p| p > 0) {
        if number_allowed {
            return Ok(());
        }
        return Err(fail(
            field,
            format!(
                "port {port:?}: an http or tcp check probes a port label of group {:?}'s \
                 network (network {{ port \"http\" {{}} }}), not a number",
                g.name
            ),
        ));
    }
    let labels: Vec<&str> = g
        .network
        .iter()
        .flat_map(|n| n.ports.iter().map(|p| p.label.as_str()))
        .collect();
    if labels.contains(&port) {
        return Ok(());
    }
    Err(fail(
        field,
        if labels.is_empty() {
            format!(
                "port {port:?}: group {:?} has no network ports (add network {{ port {port:?} {{}} }})",
                g.name
            )
        } else {
            format!(
                "port {port:?} is not a port label of group {:?} (it has {})",
                g.name,
                labels.join(", ")
            )
        },
    ))
}

/// Most volumes of a group, and most volume mounts of a task.
pub const MAX_VOLUMES: usize = 64;
/// Longest volume destination.
pub const MAX_VOLUME_DESTINATION_BYTES: usize = 4096;

/// A group's `volume "x" { type = "csi", source, access_mode, attachment_mode }`: the
/// volume's id, and Nomad's spellings of the modes when given.
fn check_csi_volume_request(vpath: &str, v: &crate::VolumeRequest) -> Result<(), ValidationError> {
    if v.source.is_empty()
        || v.source.len() > MAX_NAME_LEN
        || v.source.chars().any(char::is_control)
        || v.source.contains('/')
    {
        return Err(fail(
            format!("{vpath}.source"),
            format!(
                "must name the CSI volume's id (1 to {MAX_NAME_LEN} characters without \
                 control characters or '/'), as in source = \"shared-data\""
            ),
        ));
    }
    if !v.access_mode.is_empty() && crate::csi::CsiAccessMode::parse(&v.access_mode).is_none() {
        return Err(fail(
            format!("{vpath}.access_mode"),
            format!(
                "unknown {:?}: expected one of {}",
                v.access_mode,
                crate::csi::CsiAccessMode::ALL
                    .map(|m| m.as_str())
                    .join(", ")
            ),
        ));
    }
    if !v.attachment_mode.is_empty()
        && crate::csi::CsiAttachmentMode::parse(&v.attachment_mode).is_none()
    {
        return Err(fail(
            format!("{vpath}.attachment_mode"),
            format!(
                "unknown {:?}: expected file-system or block-device",
                v.attachment_mode
            ),
        ));
    }
    if v.attachment_mode == "block-device" {
        return Err(fail(
            format!("{vpath}.attachment_mode"),
            "block-device CSI volumes are not supported by Drover yet",
        ));
    }
    Ok(())
}

/// A group's `volume` blocks and its tasks' `volume_mount`s: host volumes with a
/// source, mounts of volumes the group has at absolute destinations without `..`.
fn check_volumes(path: &str, g: &TaskGroup) -> Result<(), ValidationError> {
    check_len(&format!("{path}.volume"), g.volumes.len(), MAX_VOLUMES)?;
    for (name, v) in &g.volumes {
        let vpath = format!("{path}.volume[{name:?}]");
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(fail(
                vpath,
                format!(
                    "a volume's name must be 1 to {MAX_NAME_LEN} characters without control characters"
                ),
            ));
        }
        match v.volume_type.as_str() {
            "host" => {}
            "csi" => {
                check_csi_volume_request(&vpath, v)?;
                continue;
            }
            "" => return Err(fail(format!("{vpath}.type"), "missing: type = \"host\"")),
            other => {
                return Err(fail(
                    format!("{vpath}.type"),
                    format!("unknown volume type {other:?}: expected \"host\" or \"csi\""),
                ));
            }
        }
        if v.source.is_empty()
            || v.source.len() > MAX_NAME_LEN
            || v.source.chars().any(char::is_control)
        {
            return Err(fail(
                format!("{vpath}.source"),
                format!(
                    "must name the node's host volume (1 to {MAX_NAME_LEN} characters \
                     without control characters), as in source = \"shared-data\""
                ),
            ));
        }
        for (field, value) in [
            ("access_mode", &v.access_mode),
            ("attachment_mode", &v.attachment_mode),
        ] {
            if !value.is_empty() {
                return Err(fail(
                    format!("{vpath}.{field}"),
                    "host volumes have no access or attachment mode (CSI volumes do)",
                ));
            }
        }
    }
    for (i, t) in g.tasks.iter().enumerate() {
        let tpath = format!("{path}.task[{i}]");
        check_len(
            &format!("{tpath}.volume_mount"),
            t.volume_mounts.len(),
            MAX_VOLUMES,
        )?;
        let mut destinations = BTreeSet::new();
        for (j, m) in t.volume_mounts.iter().enumerate() {
            let mpath = format!("{tpath}.volume_mount[{j}]");
            if !g.volumes.contains_key(&m.volume) {
                return Err(fail(
                    format!("{mpath}.volume"),
                    format!(
                        "volume {:?} is not a volume of group {:?} (add volume {:?} {{ type = \"host\", source = ... }} to the group)",
                        m.volume, g.name, m.volume
                    ),
                ));
            }
            check_volume_destination(&format!("{mpath}.destination"), &m.destination)?;
            if !destinations.insert(m.destination.trim_end_matches('/')) {
                return Err(fail(
                    format!("{mpath}.destination"),
                    format!("{:?} is mounted twice in the task", m.destination),
                ));
            }
        }
    }
    Ok(())
}

/// A volume's destination: an absolute path below `/`, no `..`, no NUL.
fn check_volume_destination(field: &str, dest: &str) -> Result<(), ValidationError> {
    let bad = |why: &str| {
        Err(fail(
            field,
            format!("{dest:?} {why} (expected an absolute path such as \"/data\")"),
        ))
    };
    if dest.len() > MAX_VOLUME_DESTINATION_BYTES {
        return bad(&format!(
            "is longer than {MAX_VOLUME_DESTINATION_BYTES} bytes"
        ));
    }
    if !dest.starts_with('/') {
        return bad("is not an absolute path");
    }
    if dest.contains('\0') {
        return bad("contains a NUL byte");
    }
    if dest.split('/').any(|c| c == "..") {
        return bad("contains \"..\"");
    }
    if dest.split('/').all(|c| c.is_empty() || c == ".") {
        return bad("is the task's root itself");
    }
    Ok(())
}

fn check_services(
    path: &str,
    services: &[ServiceSpec],
    g: &TaskGroup,
    task: Option<&Task>,
) -> Result<(), ValidationError> {
    check_len(path, services.len(), MAX_SERVICES)?;
    let mut known = BTreeSet::new();
    for (i, s) in services.iter().enumerate() {
        let spath = format!("{path}[{i}]");
        // As Nomad: one registration per name and port.
        if !known.insert((s.name.as_str(), s.port.as_str())) {
            return Err(fail(
                format!("{spath}.name"),
                format!("service {:?} on port {:?} is given twice", s.name, s.port),
            ));
        }
        if s.name.trim().is_empty() || s.name.len() > MAX_SERVICE_NAME_BYTES {
            return Err(fail(
                format!("{spath}.name"),
                format!("must be 1 to {MAX_SERVICE_NAME_BYTES} bytes"),
            ));
        }
        // The name is a path segment of /v1/service/<name>; `${...}` is the client's
        // to fill in.
        if !s.name.contains("${")
            && !s
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(fail(
                format!("{spath}.name"),
                format!(
                    "{:?} is not a service name: letters, digits, '-', '_' or '.'",
                    s.name
                ),
            ));
        }
        if s.provider != NOMAD_SERVICE_PROVIDER {
            return Err(fail(
                format!("{spath}.provider"),
                format!(
                    "provider {:?} is not supported: Drover keeps services itself: provider = \"nomad\"",
                    s.provider
                ),
            ));
        }
        if !s.port.is_empty() {
            check_port_ref(format!("{spath}.port"), &s.port, g, true)?;
        }
        check_len(&format!("{spath}.tags"), s.tags.len(), MAX_TAGS)?;
        for (t, tag) in s.tags.iter().enumerate() {
            if tag.len() > MAX_TAG_LEN || tag.chars().any(char::is_control) {
                return Err(fail(
                    format!("{spath}.tags[{t}]"),
                    format!("at most {MAX_TAG_LEN} bytes, without control characters"),
                ));
            }
        }
        check_map(&format!("{spath}.meta"), &s.meta)?;
        // A group service names the task its checks restart or run in.
        let own_task = match task {
            Some(t) => {
                if !(s.task.is_empty() || s.task == t.name) {
                    return Err(fail(
                        format!("{spath}.task"),
                        "only a group's service names a task",
                    ));
                }
                Some(t)
            }
            None if s.task.is_empty() => None,
            None => Some(g.tasks.iter().find(|t| t.name == s.task).ok_or_else(|| {
                fail(
                    format!("{spath}.task"),
                    format!("group {:?} has no task {:?}", g.name, s.task),
                )
            })?),
        };
        check_len(&format!("{spath}.check"), s.checks.len(), MAX_CHECKS)?;
        let mut check_names = BTreeSet::new();
        for (j, c) in s.checks.iter().enumerate() {
            let cpath = format!("{spath}.check[{j}]");
            // Printed by `drover service info`, kept by the server up to its limit.
            if c.name.len() > MAX_SERVICE_NAME_BYTES || c.name.chars().any(char::is_control) {
                return Err(fail(
                    format!("{cpath}.name"),
                    format!("at most {MAX_SERVICE_NAME_BYTES} bytes, without control characters"),
                ));
            }
            check_check(&cpath, c, s, g, own_task)?;
            if !check_names.insert(c.name.as_str()) {
                return Err(fail(
                    format!("{cpath}.name"),
                    format!(
                        "check name {:?} is used twice in service {:?} (give each check a name)",
                        c.name, s.name
                    ),
                ));
            }
        }
        if let Some(r) = &s.check_restart
            && r.grace > MAX_CHECK_DURATION
        {
            return Err(fail(
                format!("{spath}.check_restart.grace"),
                format!("{:?} is more than the maximum of 1h", r.grace),
            ));
        }
        if s.check_restart.is_some()
            && own_task.is_none()
            && s.checks.iter().all(|c| c.task.is_empty())
        {
            return Err(fail(
                format!("{spath}.check_restart"),
                "a group's service restarts a task only when it names one (task = \"...\")",
            ));
        }
    }
    Ok(())
}

/// An http check's headers: names are HTTP tokens, values hold no line breaks (they
/// become request lines), bounded in count and bytes.
fn check_headers(
    path: &str,
    header: &std::collections::BTreeMap<String, Vec<String>>,
) -> Result<(), ValidationError> {
    check_len(path, header.len(), MAX_CHECK_HEADERS)?;
    let mut bytes = 0;
    for (name, values) in header {
        let hpath = format!("{path}.{name}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
        {
            return Err(fail(hpath, format!("{name:?} is not a header name")));
        }
        check_len(&hpath, values.len(), MAX_CHECK_HEADER_VALUES)?;
        for v in values {
            if v.chars().any(|c| c.is_control() && c != '\t') {
                return Err(fail(
                    hpath,
                    "a header value may not hold line breaks or control characters",
                ));
            }
            bytes += v.len();
        }
        bytes += name.len();
    }
    if bytes > MAX_CHECK_HEADER_BYTES {
        return Err(fail(
            path,
            format!("{bytes} bytes of names and values, at most {MAX_CHECK_HEADER_BYTES}"),
        ));
    }
    Ok(())
}

fn check_check(
    path: &str,
    c: &CheckSpec,
    s: &ServiceSpec,
    g: &TaskGroup,
    task: Option<&Task>,
) -> Result<(), ValidationError> {
    if !CHECK_TYPES.contains(&c.check_type.as_str()) {
        return Err(fail(
            format!("{path}.type"),
            format!(
                "unknown check type {:?} (one of {})",
                c.check_type,
                CHECK_TYPES.join(", ")
            ),
        ));
    }
    if c.expose && c.check_type != "http" {
        return Err(fail(
            format!("{path}.expose"),
            format!("expose is for http checks, not {}", c.check_type),
        ));
    }
    check_len(&format!("{path}.args"), c.args.len(), MAX_CHECK_ARGS)?;
    if let Some(r) = &c.check_restart
        && r.grace > MAX_CHECK_DURATION
    {
        return Err(fail(
            format!("{path}.check_restart.grace"),
            format!("{:?} is more than the maximum of 1h", r.grace),
        ));
    }
    let too_long = |field: &str, d: std::time::Duration| {
        fail(
            format!("{path}.{field}"),
            format!("{d:?} is more than the maximum of 1h"),
        )
    };
    if c.interval < MIN_CHECK_INTERVAL {
        return Err(fail(
            format!("{path}.interval"),
            format!("{:?} is less than the minimum of 1s", c.interval),
        ));
    }
    if c.interval > MAX_CHECK_DURATION {
        return Err(too_long("interval", c.interval));
    }
    if c.timeout.is_zero() {
        return Err(fail(format!("{path}.timeout"), "must be more than 0"));
    }
    if c.timeout > MAX_CHECK_DURATION {
        return Err(too_long("timeout", c.timeout));
    }
    match c.check_type.as_str() {
        "script" => {
            if c.command.trim().is_empty() {
                return Err(fail(
                    format!("{path}.command"),
                    "a script check needs a command",
                ));
            }
            let runs_in = if c.task.is_empty() {
                task.map(|t| t.name.as_str())
            } else {
                Some(c.task.as_str())
            };
            match runs_in {
                None => {
                    return Err(fail(
                        format!("{path}.task"),
                        "a script check of a group's service needs the task to run in",
                    ));
                }
                Some(name) if !g.tasks.iter().any(|t| t.name == name) => {
                    return Err(fail(
                        format!("{path}.task"),
                        format!("group {:?} has no task {name:?}", g.name),
                    ));
                }
                Some(_) => {}
            }
        }
        _ => {
            let port = if c.port.is_empty() { &s.port } else { &c.port };
            if port.is_empty() {
                return Err(fail(
                    format!("{path}.port"),
                    format!(
                        "a {} check needs a port: the service's or its own",
                        c.check_type
                    ),
                ));
            }
            let field = if c.port.is_empty() {
                // The service's port is the one probed: say so.
                format!("{path}.port (the service's port)")
            } else {
                format!("{path}.port")
            };
            check_port_ref(field, port, g, false)?;
            if c.check_type == "http" {
                if c.path.is_empty() {
                    return Err(fail(
                        format!("{path}.path"),
                        "an http check needs a path (such as \"/health\")",
                    ));
                }
                if !c.path.starts_with('/') || c.path.chars().any(|ch| ch.is_control() || ch == ' ')
                {
                    return Err(fail(
                        format!("{path}.path"),
                        format!(
                            "{:?} must start with '/' and hold no spaces or control characters",
                            c.path
                        ),
                    ));
                }
                if !c.method.is_empty()
                    && (c.method.len() > 16 || !c.method.chars().all(|ch| ch.is_ascii_alphabetic()))
                {
                    return Err(fail(
                        format!("{path}.method"),
                        format!(
                            "{:?} is not an HTTP method (GET, POST, HEAD, ...)",
                            c.method
                        ),
                    ));
                }
                check_headers(&format!("{path}.header"), &c.header)?;
                if !matches!(c.protocol.as_str(), "" | "http" | "https") {
                    return Err(fail(
                        format!("{path}.protocol"),
                        format!("{:?}: http or https", c.protocol),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_task(path: &str, t: &Task) -> Result<(), ValidationError> {
    check_name(&format!("{path}.name"), &t.name)?;
    if t.driver.trim().is_empty() {
        return Err(fail(format!("{path}.driver"), "must not be empty"));
    }
    if !(t.config.is_object() || t.config.is_null()) {
        return Err(fail(
            format!("{path}.config"),
            "must be a table of the driver's settings",
        ));
    }
    // The encoded size, as it is stored and sent; a value that does not encode has
    // no size worth checking here (the store refuses it).
    let config_bytes = serde_json::to_vec(&t.config).map_or(0, |v| v.len());
    if config_bytes > MAX_CONFIG_BYTES {
        return Err(fail(
            format!("{path}.config"),
            format!("{config_bytes} bytes as JSON, at most {MAX_CONFIG_BYTES}"),
        ));
    }
    check_map(&format!("{path}.env"), &t.env)?;
    check_map(&format!("{path}.meta"), &t.meta)?;
    let r = &t.resources;
    if r.cpu < 1 {
        return Err(fail(
            format!("{path}.resources.cpu"),
            "must be at least 1 (MHz)",
        ));
    }
    if r.memory_mb < 1 {
        return Err(fail(
            format!("{path}.resources.memory_mb"),
            "must be at least 1 (MiB)",
        ));
    }
    if r.memory_max_mb != 0 && r.memory_max_mb < r.memory_mb {
        return Err(fail(
            format!("{path}.resources.memory_max_mb"),
            format!(
                "{} is less than memory_mb ({}): use 0 for no separate limit",
                r.memory_max_mb, r.memory_mb
            ),
        ));
    }
    check_devices(path, &t.devices)?;
    if let Some(d) = t.kill_timeout
        && d > MAX_KILL_TIMEOUT
    {
        return Err(fail(
            format!("{path}.kill_timeout"),
            format!(
                "{} is longer than the maximum of {}",
                drover_api::human_duration(d),
                drover_api::human_duration(MAX_KILL_TIMEOUT)
            ),
        ));
    }
    if let Some(restart) = &t.restart {
        for (name, d) in [("interval", restart.interval), ("delay", restart.delay)] {
            if d > MAX_RESTART_DURATION {
                return Err(fail(
                    format!("{path}.restart.{name}"),
                    format!(
                        "{} is longer than the maximum of {}",
                        drover_api::human_duration(d),
                        drover_api::human_duration(MAX_RESTART_DURATION)
                    ),
                ));
            }
        }
    }
    if let Some(logs) = &t.logs
        && let Err(message) = logs.check()
    {
        return Err(fail(format!("{path}.logs"), message));
    }
    if let Some(l) = &t.lifecycle
        && l.hook == LifecycleHook::Poststop
        && l.sidecar
    {
        return Err(fail(
            format!("{path}.lifecycle.sidecar"),
            "a poststop task cannot be a sidecar (it runs after the main tasks ended)",
        ));
    }
    check_artifacts(path, t)?;
    check_templates(path, t)?;
    Ok(())
}

/// A task's `artifact` blocks (see [`crate::taskfiles`]).
fn check_artifacts(path: &str, t: &Task) -> Result<(), ValidationError> {
    use crate::taskfiles as tf;
    check_len(
        &format!("{path}.artifact"),
        t.artifacts.len(),
        tf::MAX_ARTIFACTS,
    )?;
    for (i, a) in t.artifacts.iter().enumerate() {
        let apath = format!("{path}.artifact[{i}]");
        tf::check_source(&a.source).map_err(|m| fail(format!("{apath}.source"), m))?;
        tf::task_path(&a.destination).map_err(|m| fail(format!("{apath}.destination"), m))?;
        for (k, v) in &a.options {
            if !tf::ARTIFACT_OPTIONS.contains(&k.as_str()) {
                return Err(fail(
                    format!("{apath}.options.{k}"),
                    format!(
                        "option {k:?} is not supported (only {})",
                        tf::ARTIFACT_OPTIONS.join(", ")
                    ),
                ));
            }
            let checked = match k.as_str() {
                "checksum" => tf::parse_checksum(v).map(|_| ()),
                _ => tf::archive_option(&a.options).map(|_| ()),
            };
            checked.map_err(|m| fail(format!("{apath}.options.{k}"), m))?;
        }
        check_len(
            &format!("{apath}.headers"),
            a.headers.len(),
            tf::MAX_HEADERS,
        )?;
        let bytes: usize = a.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        if bytes > tf::MAX_HEADER_BYTES {
            return Err(fail(
                format!("{apath}.headers"),
                format!("{bytes} bytes, at most {}", tf::MAX_HEADER_BYTES),
            ));
        }
        for (k, v) in &a.headers {
            let token = !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                return Err(fail(
                    format!("{apath}.headers"),
                    format!("{k:?} is not a valid header name"),
                ));
            }
            if v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(fail(
                    format!("{apath}.headers.{k}"),
                    "a header value cannot hold a line break or NUL",
                ));
            }
        }
    }
    Ok(())
}

/// A task's `template` blocks (see [`crate::taskfiles`]).
fn check_templates(path: &str, t: &Task) -> Result<(), ValidationError> {
    use crate::taskfiles as tf;
    check_len(
        &format!("{path}.template"),
        t.templates.len(),
        tf::MAX_TEMPLATES,
    )?;
    let mut seen = BTreeSet::new();
    for (i, tm) in t.templates.iter().enumerate() {
        let tpath = format!("{path}.template[{i}]");
        match (tm.data.is_empty(), tm.source.is_empty()) {
            (true, true) => {
                return Err(fail(
                    format!("{tpath}.data"),
                    "give the template as data, or a source file",
                ));
            }
            (false, false) => {
                return Err(fail(
                    format!("{tpath}.source"),
                    "give data or source, not both",
                ));
            }
            _ => {}
        }
        if tm.data.len() > tf::MAX_TEMPLATE_DATA {
            return Err(fail(
                format!("{tpath}.data"),
                format!("{} bytes, at most {}", tm.data.len(), tf::MAX_TEMPLATE_DATA),
            ));
        }
        if !tm.source.is_empty() {
            tf::task_path(&tm.source).map_err(|m| fail(format!("{tpath}.source"), m))?;
        }
        if tm.destination.is_empty() {
            return Err(fail(format!("{tpath}.destination"), "must not be empty"));
        }
        let dest =
            tf::task_path(&tm.destination).map_err(|m| fail(format!("{tpath}.destination"), m))?;
        if dest.trailing_slash || dest.rel.components().count() < 2 && dest.root == Root::Task {
            return Err(fail(
                format!("{tpath}.destination"),
                format!("{:?} names a directory; give a file path", tm.destination),
            ));
        }
        if !seen.insert((dest.root == Root::Alloc, dest.rel.clone())) {
            return Err(fail(
                format!("{tpath}.destination"),
                format!(
                    "{:?}: another template writes the same file",
                    tm.destination
                ),
            ));
        }
        if tm.change_mode == crate::types::ChangeMode::Signal {
            match tm.change_signal.as_deref() {
                None | Some("") => {
                    return Err(fail(
                        format!("{tpath}.change_signal"),
                        "required with change_mode = \"signal\" (e.g. \"SIGHUP\")",
                    ));
                }
                Some(sig) if !is_signal_name(sig) => {
                    return Err(fail(
                        format!("{tpath}.change_signal"),
                        format!("{sig:?} is not a signal name like SIGHUP"),
                    ));
                }
                Some(_) => {}
            }
        }
        tf::parse_perms(&tm.perms).map_err(|m| fail(format!("{tpath}.perms"), m))?;
        for (name, d) in [
            ("left_delimiter", &tm.left_delimiter),
            ("right_delimiter", &tm.right_delimiter),
        ] {
            if d.is_empty() || d.len() > 16 || d.chars().any(char::is_whitespace) {
                return Err(fail(
                    format!("{tpath}.{name}"),
                    "1 to 16 characters, no white space",
                ));
            }
        }
        if tm.splay > tf::MAX_SPLAY {
            return Err(fail(
                format!("{tpath}.splay"),
                format!(
                    "{} is longer than the maximum of {}",
                    drover_api::human_duration(tm.splay),
                    drover_api::human_duration(tf::MAX_SPLAY)
                ),
            ));
        }
    }
    Ok(())
}

/// `SIGHUP`, `SIGUSR1` ...: upper-case letters and digits after `SIG`.
fn is_signal_name(s: &str) -> bool {
    s.strip_prefix("SIG").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    })
}

/// Most instances one `device` block may ask for (Nomad has no limit; a request for
/// more is surely a mistake, and bounds the scheduler's work).
pub const MAX_DEVICE_COUNT: u32 = 64;
/// Most `device` blocks per task.
const MAX_DEVICE_REQUESTS: usize = 16;

fn check_devices(path: &str, devices: &[crate::DeviceRequest]) -> Result<(), ValidationError> {
    if devices.len() > MAX_DEVICE_REQUESTS {
        return Err(fail(
            format!("{path}.devices"),
            format!(
                "{} device blocks, at most {MAX_DEVICE_REQUESTS}",
                devices.len()
            ),
        ));
    }
    for (i, d) in devices.iter().enumerate() {
        let at = format!("{path}.device[{i}]");
        let parts: Vec<&str> = d.name.split('/').collect();
        let part_ok = |p: &&str| {
            !p.is_empty()
                && p.len() <= 128
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        };
        if parts.len() > 3 || !parts.iter().all(part_ok) {
            return Err(fail(
                format!("{at}.name"),
                format!(
                    "{:?} is not a device name: write type, vendor/type or vendor/type/name \
                     (letters, digits, '-', '_', '.', ':')",
                    d.name
                ),
            ));
        }
        if d.count < 1 || d.count > MAX_DEVICE_COUNT {
            return Err(fail(
                format!("{at}.count"),
                format!("must be 1 to {MAX_DEVICE_COUNT}, got {}", d.count),
            ));
        }
        for (j, c) in d.constraints.iter().enumerate() {
            let cpath = format!("{at}.constraint[{j}]");
            if c.operator == crate::ConstraintOperator::DistinctHosts {
                return Err(fail(
                    format!("{cpath}.operator"),
                    "distinct_hosts is not a device constraint",
                ));
            }
            // Device targets are checked here; the operator's own rules (a regular
            // expression that compiles, ...) by check_constraint, with each device
            // target standing in as an interpolation it accepts.
            let mut stand_in = c.clone();
            for (side, text) in [
                ("attribute", &mut stand_in.attribute),
                ("value", &mut stand_in.value),
            ] {
                match device_target(text) {
                    Ok(DeviceTarget::Literal(_)) => {}
                    Ok(_) => *text = "${attr.device}".to_owned(),
                    Err(message) => return Err(fail(format!("{cpath}.{side}"), message)),
                }
            }
            check_constraint(&cpath, &stand_in)?;
        }
    }
    Ok(())
}

/// What a side of a device constraint names (Nomad's `${device.*}` targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceTarget<'a> {
    /// `${device.vendor}`.
    Vendor,
    /// `${device.type}`.
    Type,
    /// `${device.model}` (the group's name).
    Model,
    /// `${device.attr.KEY}`.
    Attribute(&'a str),
    /// Not an interpolation: the text itself.
    Literal(&'a str),
}

/// Parse one side of a device constraint.
pub fn device_target(text: &str) -> Result<DeviceTarget<'_>, String> {
    let t = text.trim();
    let Some(inner) = t.strip_prefix("${") else {
        return Ok(DeviceTarget::Literal(text));
    };
    let Some(inner) = inner.strip_suffix('}') else {
        return Err(format!("{text:?} is missing its closing '}}'"));
    };
    match inner {
        "device.vendor" => Ok(DeviceTarget::Vendor),
        "device.type" => Ok(DeviceTarget::Type),
        "device.model" => Ok(DeviceTarget::Model),
        _ => match inner.strip_prefix("device.attr.") {
            Some(k) if !k.is_empty() => Ok(DeviceTarget::Attribute(k)),
            _ => Err(format!(
                "{text:?} is not something a device has: use ${{device.vendor}}, \
                 ${{device.type}}, ${{device.model}} or ${{device.attr.KEY}}"
            )),
        },
    }
}

fn check_constraint(path: &str, c: &Constraint) -> Result<(), ValidationError> {
    use ConstraintOperator::*;
    let op = c.operator.as_str();
    for (side, text) in [("attribute", &c.attribute), ("value", &c.value)] {
        if let Err(message) = check_interpolation(text) {
            return Err(fail(format!("{path}.{side}"), message));
        }
    }
    match c.operator {
        DistinctHosts => {
            if !c.attribute.is_empty() {
                return Err(fail(
                    format!("{path}.attribute"),
                    "distinct_hosts takes no attribute",
                ));
            }
            if !matches!(c.value.trim(), "" | "true" | "false") {
                return Err(fail(
                    format!("{path}.value"),
                    format!(
                        "distinct_hosts takes \"true\", \"false\" or nothing, not {:?}",
                        c.value
                    ),
                ));
            }
            return Ok(());
        }
        _ if c.attribute.trim().is_empty() => {
            return Err(fail(
                format!("{path}.attribute"),
                format!("operator {op} needs an attribute such as \"${{node.meta.rack}}\""),
            ));
        }
        Regexp if !is_interpolation(&c.value) => {
            if let Err(e) = regex::Regex::new(&c.value) {
                return Err(fail(
                    format!("{path}.value"),
                    format!(
                        "{:?} is not a regular expression: {}",
                        c.value,
                        one_line(&e.to_string())
                    ),
                ));
            }
        }
        Version if !is_interpolation(&c.value) => {
            if let Err(message) = version_requirement(&c.value) {
                return Err(fail(format!("{path}.value"), message));
            }
        }
        SetContains | SetContainsAny if set_items(&c.value).next().is_none() => {
            return Err(fail(
                format!("{path}.value"),
                format!("operator {op} needs a comma-separated list of values"),
            ));
        }
        _ => {}
    }
    Ok(())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where a constraint side reads from on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// `${node.unique.name}` (or `${node.name}`).
    NodeName,
    /// `${node.unique.id}` (or `${node.id}`).
    NodeId,
    /// `${node.datacenter}`.
    NodeDatacenter,
    /// `${node.class}`: Drover nodes have no class, so it is empty on every node (as
    /// on a Nomad node without `node_class`).
    NodeClass,
    /// `${attr.KEY}`.
    Attribute(&'a str),
    /// `${node.meta.KEY}` or `${meta.KEY}`.
    Meta(&'a str),
    /// `${driver.NAME.KEY}`: an attribute the driver reported.
    Driver(&'a str, &'a str),
    /// Anything else without `${`: the text itself.
    Literal(&'a str),
}

fn is_interpolation(text: &str) -> bool {
    text.trim_start().starts_with("${")
}

/// What a constraint side (`${attr.kernel.name}`, `${node.meta.rack}`, a literal)
/// refers to, or why it refers to nothing known.
pub fn interpolation_target(text: &str) -> Result<Target<'_>, String> {
    let t = text.trim();
    let Some(inner) = t.strip_prefix("${") else {
        return Ok(Target::Literal(text));
    };
    let Some(inner) = inner.strip_suffix('}') else {
        return Err(format!("{text:?} is missing its closing '}}'"));
    };
    let target = match inner {
        "node.name" | "node.unique.name" => Target::NodeName,
        "node.id" | "node.unique.id" => Target::NodeId,
        "node.datacenter" => Target::NodeDatacenter,
        "node.class" => Target::NodeClass,
        _ => {
            if let Some(k) = inner.strip_prefix("attr.") {
                Target::Attribute(k)
            } else if let Some(k) = inner
                .strip_prefix("node.meta.")
                .or_else(|| inner.strip_prefix("meta."))
            {
                Target::Meta(k)
            } else if let Some(rest) = inner.strip_prefix("driver.") {
                match rest.split_once('.') {
                    Some((name, key)) if !name.is_empty() && !key.is_empty() => {
                        Target::Driver(name, key)
                    }
                    _ => {
                        return Err(format!(
                            "{text:?} names no driver attribute: write ${{driver.NAME.KEY}}"
                        ));
                    }
                }
            } else {
                return Err(format!(
                    "{text:?} is not something a node has: use ${{node.unique.name}}, \
                     ${{node.unique.id}}, ${{node.datacenter}}, ${{node.class}}, ${{attr.KEY}}, \
                     ${{meta.KEY}} (or ${{node.meta.KEY}}) or ${{driver.NAME.KEY}}"
                ));
            }
        }
    };
    match target {
        Target::Attribute("") | Target::Meta("") => Err(format!("{text:?} names no key")),
        t => Ok(t),
    }
}

fn check_interpolation(text: &str) -> Result<(), String> {
    interpolation_target(text).map(|_| ())
}

/// The items of a `set_contains` list: comma-separated, trimmed, empty ones dropped.
pub fn set_items(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// A `version` constraint's requirement, as Nomad users write it: comma-separated
/// comparisons (`>= 5.10, < 7`); a bare version means exactly that version (`5.10` is
/// `= 5.10`), not semver's caret.
pub fn version_requirement(text: &str) -> Result<semver::VersionReq, String> {
    let parts: Vec<String> = text
        .split(',')
        .map(str::trim)
        .map(|p| {
            if p.starts_with(|c: char| c.is_ascii_digit()) {
                format!("={p}")
            } else {
                p.to_owned()
            }
        })
        .collect();
    if parts.iter().any(String::is_empty) {
        return Err(format!(
            "{text:?} is not a version requirement such as \">= 5.10, < 7\""
        ));
    }
    semver::VersionReq::parse(&parts.join(", "))
        .map_err(|e| format!("{text:?} is not a version requirement such as \">= 5.10, < 7\": {e}"))
}

/// A node attribute read as a version, leniently: the leading `N[.N[.N]]` of it, so
/// `5.10` is 5.10.0 and a kernel's `6.1.0-18-amd64` is 6.1.0. `None` when it does not
/// start with a number.
pub fn lenient_version(text: &str) -> Option<semver::Version> {
    let t = text.trim().trim_start_matches(['v', 'V']);
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let mut nums = t[..end].split('.').filter(|s| !s.is_empty());
    let major = nums.next()?.parse().ok()?;
    let minor = nums.next().map_or(Some(0), |s| s.parse().ok())?;
    let patch = nums.next().map_or(Some(0), |s| s.parse().ok())?;
    Some(semver::Version::new(major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Lifecycle, TaskResources};

    fn task(name: &str) -> Task {
        Task {
            devices: Default::default(),
            volume_mounts: Default::default(),
            services: Default::default(),
            meta: Default::default(),
            name: name.into(),
            driver: "rawexec".into(),
            config: serde_json::json!({"command": "/bin/true"}),
            env: Default::default(),
            kill_signal: None,
            kill_timeout: None,
            restart: None,
            resources: TaskResources::default(),
            logs: None,
            lifecycle: None,
            artifacts: Vec::new(),
            templates: Vec::new(),
            identity: None,
        }
    }

    fn job() -> JobSpec {
        JobSpec {
            namespace: crate::DEFAULT_NAMESPACE.into(),
            datacenters: Vec::new(),
            name: "web".into(),
            job_type: Default::default(),
            priority: 50,
            constraints: vec![],
            update: Default::default(),
            meta: Default::default(),
            groups: vec![TaskGroup {
                volumes: Default::default(),
                update: Default::default(),
                network: Default::default(),
                services: Default::default(),
                reschedule: None,
                name: "app".into(),
                count: 3,
                constraints: vec![],
                meta: Default::default(),
                tasks: vec![task("main"), task("side")],
            }],
        }
    }

    fn refused(change: impl FnOnce(&mut JobSpec)) -> String {
        let mut j = job();
        change(&mut j);
        validate(&j).unwrap_err().to_string()
    }

    fn constraint(attribute: &str, operator: ConstraintOperator, value: &str) -> Constraint {
        Constraint {
            attribute: attribute.into(),
            operator,
            value: value.into(),
        }
    }

    #[test]
    fn a_good_job_passes() {
        validate(&job()).unwrap();
        let mut j = job();
        j.groups[0].count = 0;
        j.groups[0].tasks[1].lifecycle = Some(Lifecycle {
            hook: LifecycleHook::Prestart,
            sidecar: true,
        });
        j.constraints = vec![
            constraint(
                "${attr.kernel.version}",
                ConstraintOperator::Version,
                ">= 5.10, < 7",
            ),
            constraint("${node.meta.rack}", ConstraintOperator::Regexp, "^r[0-9]+$"),
            constraint("", ConstraintOperator::DistinctHosts, ""),
            constraint("${driver.docker.version}", ConstraintOperator::IsSet, ""),
            constraint("${meta.tags}", ConstraintOperator::SetContains, "a, b"),
        ];
        validate(&j).unwrap();
    }

    #[test]
    fn names() {
        assert_eq!(
            refused(|j| j.name = String::new()),
            "name: must not be empty"
        );
        assert!(refused(|j| j.name = "we b".into()).starts_with("name: \"we b\" contains ' '"));
        assert!(refused(|j| j.namespace = "a_b".into()).starts_with("namespace: "));
        assert!(refused(|j| j.name = "x".repeat(129)).starts_with("name: is 129 characters"));
        validate(&JobSpec {
            name: "A-z_0.9".repeat(18),
            ..job()
        })
        .unwrap();
        assert!(
            refused(|j| j.groups[0].name = "a/b".into())
                .starts_with("group[0].name: \"a/b\" contains '/'")
        );
        assert!(
            refused(|j| j.groups[0].tasks[1].name = "".into())
                .starts_with("group[0].task[1].name: must not be empty")
        );
    }

    #[test]
    fn groups_and_tasks() {
        assert_eq!(
            refused(|j| j.groups.clear()),
            "group: a job needs at least one group"
        );
        assert_eq!(
            refused(|j| {
                let g = j.groups[0].clone();
                j.groups.push(g);
            }),
            "group[1].name: group name \"app\" is used twice"
        );
        assert_eq!(
            refused(|j| j.groups[0].tasks[1].name = "main".into()),
            "group[0].task[1].name: task name \"main\" is used twice in group \"app\""
        );
        assert_eq!(
            refused(|j| j.groups[0].tasks.clear()),
            "group[0].task: a group needs at least one task"
        );
        assert_eq!(
            refused(|j| {
                for t in &mut j.groups[0].tasks {
                    t.lifecycle = Some(Lifecycle {
                        hook: LifecycleHook::Prestart,
                        sidecar: false,
                    });
                }
            }),
            "group[0].task: group \"app\" has no main task: every task has a lifecycle hook"
        );
        assert!(
            refused(|j| j.groups[0].tasks[0].lifecycle = Some(Lifecycle {
                hook: LifecycleHook::Poststop,
                sidecar: true,
            }))
            .starts_with("group[0].task[0].lifecycle.sidecar: a poststop task cannot be a sidecar")
        );
        assert_eq!(
            refused(|j| j.groups[0].count = 10_001),
            "group[0].count: 10001 is more than the maximum of 10000"
        );
        assert_eq!(
            refused(|j| j.groups[0].tasks[0].driver = " ".into()),
            "group[0].task[0].driver: must not be empty"
        );
        assert_eq!(
            refused(|j| j.groups[0].tasks[0].config = serde_json::json!("x")),
            "group[0].task[0].config: must be a table of the driver's settings"
        );
        assert_eq!(
            refused(|j| j.priority = 0),
            "priority: 0 is not within 1..=100"
        );
        assert_eq!(
            refused(|j| j.priority = 101),
            "priority: 101 is not within 1..=100"
        );
        assert!(
            refused(|j| j.groups[0].tasks[0].kill_timeout =
                Some(std::time::Duration::from_secs(2 * 86400)))
            .starts_with("group[0].task[0].kill_timeout: 2days is longer")
        );
        assert!(
            refused(|j| j.groups[0].tasks[0].logs = Some(drover_api::LogConfig {
                max_files: 0,
                max_file_size_mb: 1
            }))
            .starts_with("group[0].task[0].logs: logs.max_files must be at least 1")
        );
    }

    #[test]
    fn sizes_are_capped_naming_the_field() {
        let many = |n: usize| {
            (0..n)
                .map(|i| (format!("K{i}"), "v".to_owned()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(
            refused(|j| {
                let g = j.groups[0].clone();
                j.groups = (0..101)
                    .map(|i| TaskGroup {
                        name: format!("g{i}"),
                        count: 1,
                        ..g.clone()
                    })
                    .collect();
            }),
            "group: 101 groups, at most 100 per job"
        );
        assert_eq!(
            refused(|j| {
                j.groups[0].tasks = (0..51).map(|i| task(&format!("t{i}"))).collect();
            }),
            "group[0].task: 51 tasks, at most 50 per group"
        );
        assert_eq!(
            refused(|j| {
                let g = j.groups[0].clone();
                j.groups = (0..3)
                    .map(|i| TaskGroup {
                        name: format!("g{i}"),
                        count: 4000,
                        ..g.clone()
                    })
                    .collect();
            }),
            "group.count: the groups' counts add up to 12000, more than the maximum of 10000 per job"
        );
        // 10 groups of 1000 (drover-bench schedule's jobs are 1000 copies) pass.
        let mut j = job();
        let g = j.groups[0].clone();
        j.groups = (0..10)
            .map(|i| TaskGroup {
                name: format!("g{i}"),
                count: 1000,
                ..g.clone()
            })
            .collect();
        validate(&j).unwrap();
        assert_eq!(
            refused(|j| j.groups[0].tasks[1].env = many(257)),
            "group[0].task[1].env: 257 entries, at most 256"
        );
        assert!(
            refused(|j| {
                j.groups[0].tasks[0].env =
                    std::collections::BTreeMap::from([("BIG".into(), "x".repeat(65 * 1024))]);
            })
            .starts_with("group[0].task[0].env: 66563 bytes of keys and values, at most 65536")
        );
        assert!(
            refused(|j| {
                j.groups[0].tasks[0].config = serde_json::json!({"args": ["y".repeat(70_000)]});
            })
            .starts_with("group[0].task[0].config: 70013 bytes as JSON, at most 65536")
        );
        assert_eq!(
            refused(|j| j.meta = many(300)),
            "meta: 300 entries, at most 256"
        );
        assert!(
            refused(|j| {
                j.groups[0].meta =
                    std::collections::BTreeMap::from([("m".into(), "z".repeat(70_000))]);
            })
            .starts_with("group[0].meta: 70001 bytes")
        );
        assert!(
            refused(|j| {
                j.groups[0].tasks[0].meta =
                    std::collections::BTreeMap::from([("m".into(), "z".repeat(70_000))]);
            })
            .starts_with("group[0].task[0].meta: 70001 bytes")
        );
        assert_eq!(
            refused(|j| j.groups[0].constraints =
                vec![constraint("${attr.a}", ConstraintOperator::IsSet, ""); 65]),
            "group[0].constraint: 65 entries, at most 64"
        );
    }

    #[test]
    fn reschedule_policies() {
        use std::time::Duration;
        let policy = ReschedulePolicy {
            attempts: 3,
            interval: Duration::from_secs(3600),
            delay: Duration::from_secs(5),
            max_delay: Duration::from_secs(60),
            unlimited: false,
        };
        let mut j = job();
        j.groups[0].reschedule = Some(policy);
        validate(&j).unwrap();
        assert_eq!(
            refused(|j| j.groups[0].reschedule = Some(ReschedulePolicy {
                delay: Duration::ZERO,
                ..policy
            })),
            "group[0].reschedule.delay: must be more than 0s"
        );
        assert!(
            refused(|j| j.groups[0].reschedule = Some(ReschedulePolicy {
                max_delay: Duration::from_secs(1),
                ..policy
            }))
            .starts_with("group[0].reschedule.max_delay: 1s is shorter than delay (5s)")
        );
        assert!(
            refused(|j| j.groups[0].reschedule = Some(ReschedulePolicy {
                attempts: 101,
                ..policy
            }))
            .starts_with("group[0].reschedule.attempts: 101 is more than")
        );
        assert!(
            refused(|j| j.groups[0].reschedule = Some(ReschedulePolicy {
                interval: Duration::ZERO,
                ..policy
            }))
            .starts_with("group[0].reschedule.interval: must be more than 0s")
        );
    }

    #[test]
    fn resources() {
        assert_eq!(
            refused(|j| j.groups[0].tasks[1].resources.cpu = 0),
            "group[0].task[1].resources.cpu: must be at least 1 (MHz)"
        );
        assert_eq!(
            refused(|j| j.groups[0].tasks[1].resources.memory_mb = 0),
            "group[0].task[1].resources.memory_mb: must be at least 1 (MiB)"
        );
        assert!(
            refused(|j| {
                j.groups[0].tasks[0].resources.memory_mb = 64;
                j.groups[0].tasks[0].resources.memory_max_mb = 32;
            })
            .starts_with(
                "group[0].task[0].resources.memory_max_mb: 32 is less than memory_mb (64)"
            )
        );
        let mut j = job();
        j.groups[0].tasks[0].resources.memory_max_mb = 300;
        validate(&j).unwrap();
    }

    #[test]
    fn constraints() {
        use ConstraintOperator::*;
        let with = |c: Constraint| refused(move |j| j.groups[0].constraints = vec![c]);
        assert_eq!(
            with(constraint("${attr.os.name}", DistinctHosts, "")),
            "group[0].constraint[0].attribute: distinct_hosts takes no attribute"
        );
        assert!(
            with(constraint("", DistinctHosts, "yes"))
                .starts_with("group[0].constraint[0].value: distinct_hosts takes")
        );
        for op in [
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
            IsSet,
            IsNotSet,
        ] {
            let e = with(constraint(" ", op, "1"));
            assert!(
                e.starts_with(&format!(
                    "group[0].constraint[0].attribute: operator {} needs an attribute",
                    op.as_str()
                )),
                "{e}"
            );
        }
        assert!(
            with(constraint("${node.meta.rack}", Regexp, "r[0-9"))
                .starts_with("group[0].constraint[0].value: \"r[0-9\" is not a regular expression")
        );
        assert!(
            with(constraint("${attr.kernel.version}", Version, ">= five")).starts_with(
                "group[0].constraint[0].value: \">= five\" is not a version requirement"
            )
        );
        assert!(
            with(constraint("${attr.kernel.version}", Version, ">= 5,")).starts_with(
                "group[0].constraint[0].value: \">= 5,\" is not a version requirement"
            )
        );
        assert!(
            with(constraint("${meta.tags}", SetContains, " , "))
                .starts_with("group[0].constraint[0].value: operator set_contains needs")
        );
        assert!(with(constraint("${node.rack}", Equal, "r1")).starts_with(
            "group[0].constraint[0].attribute: \"${node.rack}\" is not something a node has"
        ));
        assert!(with(constraint("${attr.os.name", Equal, "linux")).contains("missing its closing"));
        assert!(
            with(constraint("${driver.docker}", IsSet, "")).contains("names no driver attribute")
        );
        assert!(with(constraint("${attr.}", IsSet, "")).contains("names no key"));
        assert!(
            refused(|j| j.constraints = vec![constraint("${attr.x}", Equal, "${bogus}")])
                .starts_with("constraint[0].value: \"${bogus}\" is not something a node has")
        );
    }

    #[test]
    fn datacenter_patterns_are_names_or_star_globs() {
        let mut ok = job();
        ok.datacenters = vec!["dc1".into(), "eu-*".into(), "*".into()];
        assert!(validate(&ok).is_ok());
        for bad in ["", "dc 1", "dc\n"] {
            let e = refused(|j| j.datacenters = vec!["dc1".into(), bad.into()]);
            assert!(
                e.starts_with(&format!("datacenters[1]: {bad:?} is not a datacenter")),
                "{e}"
            );
        }
        let e = refused(|j| j.datacenters = vec!["dc".into(); MAX_DATACENTERS + 1]);
        assert!(e.starts_with("datacenters: 65 entries, at most 64"), "{e}");
    }

    #[test]
    fn versions_are_read_leniently() {
        let v = |s| lenient_version(s);
        assert_eq!(v("5.10"), Some(semver::Version::new(5, 10, 0)));
        assert_eq!(v("6.1.0-18-amd64"), Some(semver::Version::new(6, 1, 0)));
        assert_eq!(v("v1.2.3.4"), Some(semver::Version::new(1, 2, 3)));
        assert_eq!(v("7"), Some(semver::Version::new(7, 0, 0)));
        assert_eq!(v("linux"), None);
        let req = version_requirement(">= 5.10, < 7").unwrap();
        assert!(req.matches(&v("6.1.0-18-amd64").unwrap()));
        assert!(!req.matches(&v("5.4.0").unwrap()));
        assert!(!req.matches(&v("7.0").unwrap()));
        // A bare version is that version, not semver's caret.
        let exact = version_requirement("5.10").unwrap();
        assert!(exact.matches(&v("5.10").unwrap()));
        assert!(!exact.matches(&v("5.11").unwrap()));
    }

    #[test]
    fn targets() {
        assert_eq!(interpolation_target("${node.name}"), Ok(Target::NodeName));
        assert_eq!(interpolation_target("${node.id}"), Ok(Target::NodeId));
        assert_eq!(
            interpolation_target("${attr.kernel.name}"),
            Ok(Target::Attribute("kernel.name"))
        );
        assert_eq!(
            interpolation_target("${node.meta.rack}"),
            Ok(Target::Meta("rack"))
        );
        assert_eq!(
            interpolation_target("${meta.rack}"),
            Ok(Target::Meta("rack"))
        );
        assert_eq!(
            interpolation_target("${driver.docker.version}"),
            Ok(Target::Driver("docker", "version"))
        );
        assert_eq!(interpolation_target("linux"), Ok(Target::Literal("linux")));
        assert_eq!(set_items(" a, b ,,c").collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    fn with_web_port(mut j: JobSpec) -> JobSpec {
        j.groups[0].network = Some(crate::types::NetworkSpec {
            mode: crate::types::NetworkMode::Host,
            ports: vec![crate::types::PortSpec {
                label: "http".into(),
                ..Default::default()
            }],
        });
        j
    }

    fn service(port: &str) -> ServiceSpec {
        ServiceSpec {
            name: "web".into(),
            port: port.into(),
            provider: NOMAD_SERVICE_PROVIDER.into(),
            ..Default::default()
        }
    }

    fn check(kind: &str) -> CheckSpec {
        CheckSpec {
            name: String::new(),
            check_type: kind.into(),
            interval: std::time::Duration::from_secs(5),
            timeout: std::time::Duration::from_secs(1),
            path: "/".into(),
            method: String::new(),
            protocol: String::new(),
            header: Default::default(),
            port: String::new(),
            command: String::new(),
            args: Vec::new(),
            task: String::new(),
            expose: false,
            check_restart: None,
        }
    }

    #[test]
    fn a_service_on_a_port_label_the_group_lacks_is_refused_by_field() {
        let mut j = with_web_port(job());
        j.groups[0].services = vec![service("http")];
        validate(&j).unwrap();
        j.groups[0].tasks[0].services = vec![service("admin")];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].task[0].service[0].port");
        assert!(
            e.message.contains("\"admin\"") && e.message.contains("http"),
            "{e}"
        );
        let mut bare = job();
        bare.groups[0].services = vec![service("http")];
        let e = validate(&bare).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].port");
        assert!(e.message.contains("no network ports"), "{e}");
    }

    #[test]
    fn a_services_check_restart_grace_is_bounded() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        s.task = j.groups[0].tasks[0].name.clone();
        s.checks = vec![check("http")];
        s.check_restart = Some(crate::CheckRestart {
            limit: 3,
            grace: std::time::Duration::from_secs(2 * 3600),
            ignore_warnings: false,
        });
        j.groups[0].services = vec![s];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check_restart.grace");
    }

    fn artifact(source: &str, dest: &str) -> crate::types::ArtifactSpec {
        crate::types::ArtifactSpec {
            source: source.into(),
            destination: dest.into(),
            mode: Default::default(),
            options: Default::default(),
            headers: Default::default(),
        }
    }

    fn template(dest: &str) -> crate::types::TemplateSpec {
        serde_json::from_value(serde_json::json!({"data": "x", "destination": dest})).unwrap()
    }

    #[test]
    fn artifacts_and_templates_are_refused_by_field() {
        let mut j = job();
        j.groups[0].tasks[0].artifacts = vec![artifact("https://example.com/a.tgz", "local/")];
        j.groups[0].tasks[0].templates = vec![template("secrets/app.env")];
        validate(&j).unwrap();

        let e = refused(|j| {
            j.groups[0].tasks[0].artifacts = vec![artifact("file:///etc/passwd", "local/")]
        });
        assert!(e.starts_with("group[0].task[0].artifact[0].source:"), "{e}");
        let e = refused(|j| {
            j.groups[0].tasks[0].artifacts = vec![artifact("http://h/a", "local/../../etc")]
        });
        assert!(
            e.starts_with("group[0].task[0].artifact[0].destination:") && e.contains(".."),
            "{e}"
        );
        let e = refused(|j| {
            let mut a = artifact("http://h/a", "local/");
            a.options.insert("checksum".into(), "sha256:00".into());
            j.groups[0].tasks[0].artifacts = vec![a];
        });
        assert!(
            e.starts_with("group[0].task[0].artifact[0].options.checksum:"),
            "{e}"
        );
        let e = refused(|j| {
            let mut a = artifact("http://h/a", "local/");
            a.options.insert("aws_access_key_id".into(), "x".into());
            j.groups[0].tasks[0].artifacts = vec![a];
        });
        assert!(e.contains("options.aws_access_key_id"), "{e}");
        let e = refused(|j| {
            let mut a = artifact("http://h/a", "local/");
            a.headers.insert("X-A".into(), "a\r\nInjected: 1".into());
            j.groups[0].tasks[0].artifacts = vec![a];
        });
        assert!(e.contains("headers.X-A"), "{e}");

        let e = refused(|j| j.groups[0].tasks[0].templates = vec![template("../x")]);
        assert!(
            e.starts_with("group[0].task[0].template[0].destination:"),
            "{e}"
        );
        let e = refused(|j| j.groups[0].tasks[0].templates = vec![template("/etc/passwd")]);
        assert!(
            e.starts_with("group[0].task[0].template[0].destination:"),
            "{e}"
        );
        let e = refused(|j| {
            let mut t = template("local/a");
            t.change_mode = crate::types::ChangeMode::Signal;
            j.groups[0].tasks[0].templates = vec![t];
        });
        assert!(
            e.starts_with("group[0].task[0].template[0].change_signal:"),
            "{e}"
        );
        let e = refused(|j| {
            let mut t = template("local/a");
            t.perms = "4755".into();
            j.groups[0].tasks[0].templates = vec![t];
        });
        assert!(e.starts_with("group[0].task[0].template[0].perms:"), "{e}");
        let e = refused(|j| {
            let mut t = template("local/a");
            t.data.clear();
            j.groups[0].tasks[0].templates = vec![t];
        });
        assert!(e.starts_with("group[0].task[0].template[0].data:"), "{e}");
    }

    #[test]
    fn a_check_of_an_unknown_type_is_refused_by_field() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        s.checks = vec![check("http"), check("grpc")];
        j.groups[0].services = vec![s];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[1].type");
        assert!(
            e.message.contains("\"grpc\"") && e.message.contains("http, tcp, script"),
            "{e}"
        );
    }

    #[test]
    fn a_static_port_outside_the_port_numbers_is_refused_by_field() {
        let mut j = with_web_port(job());
        j.groups[0].network.as_mut().unwrap().ports[0].static_port = 70000;
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].network.port[0].static");
        j.groups[0].network.as_mut().unwrap().ports[0].static_port = 8080;
        validate(&j).unwrap();
        j.groups[0]
            .network
            .as_mut()
            .unwrap()
            .ports
            .push(crate::types::PortSpec {
                label: "http".into(),
                ..Default::default()
            });
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].network.port[1].label");
    }

    #[test]
    fn script_checks_need_a_command_and_a_task_of_the_group() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        let mut c = check("script");
        c.command = "/bin/true".into();
        s.checks = vec![c];
        j.groups[0].services = vec![s.clone()];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[0].task");
        j.groups[0].services[0].task = "main".into();
        validate(&j).unwrap();
        j.groups[0].services[0].task = "nope".into();
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].task");
        // At task level the check runs in its task.
        j.groups[0].services.clear();
        j.groups[0].tasks[0].services = vec![s];
        validate(&j).unwrap();
    }

    #[test]
    fn http_checks_need_a_path_a_method_and_headers_that_are_http() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        let mut c = check("http");
        c.path = String::new();
        s.checks = vec![c];
        j.groups[0].services = vec![s];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[0].path");
        assert!(e.message.contains("needs a path"), "{e}");
        let c = &mut j.groups[0].services[0].checks[0];
        c.path = "/health".into();
        c.method = "GET /x HTTP/1.1".into();
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[0].method");
        let c = &mut j.groups[0].services[0].checks[0];
        c.method = "HEAD".into();
        c.header = [("X-Evil".to_owned(), vec!["a\r\nHost: b".to_owned()])].into();
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[0].header.X-Evil");
        let c = &mut j.groups[0].services[0].checks[0];
        c.header = [("X Bad".to_owned(), vec!["v".to_owned()])].into();
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[0].header.X Bad");
        let c = &mut j.groups[0].services[0].checks[0];
        c.header = [("X-Ok".to_owned(), vec!["v".to_owned()])].into();
        validate(&j).unwrap();
    }

    #[test]
    fn expose_is_for_http_checks() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        let mut c = check("tcp");
        c.expose = true;
        s.checks = vec![c];
        j.groups[0].services = vec![s];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[0].expose");
    }

    #[test]
    fn names_of_services_and_checks_are_unique_and_fit_a_url() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        s.checks = vec![check("tcp"), check("tcp")];
        s.checks[0].name = "c".into();
        s.checks[1].name = "c".into();
        j.groups[0].services = vec![s.clone()];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].check[1].name");
        s.checks[1].name = "d".into();
        j.groups[0].services = vec![s.clone(), s.clone()];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[1].name");
        assert!(e.message.contains("given twice"), "{e}");
        s.name = "web/../x".into();
        j.groups[0].services = vec![s.clone()];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].name");
        // Interpolated by the client: left to it.
        s.name = "web-${NOMAD_ALLOC_INDEX}".into();
        j.groups[0].services = vec![s];
        validate(&j).unwrap();
    }

    #[test]
    fn a_check_probes_a_port_label_never_a_number() {
        let mut j = with_web_port(job());
        // A numeric service port is only advertised: it may stay, without checks.
        j.groups[0].services = vec![service("8080")];
        validate(&j).unwrap();
        for kind in ["http", "tcp"] {
            j.groups[0].services[0].checks = vec![check(kind)];
            let e = validate(&j).unwrap_err();
            assert_eq!(
                e.field,
                "group[0].service[0].check[0].port (the service's port)"
            );
            assert!(e.message.contains("not a number"), "{e}");
            let mut own = check(kind);
            own.port = "22".into();
            j.groups[0].services[0].checks = vec![own];
            let e = validate(&j).unwrap_err();
            assert_eq!(e.field, "group[0].service[0].check[0].port");
            j.groups[0].services[0].checks[0].port = "http".into();
            validate(&j).unwrap();
        }
    }

    #[test]
    fn a_group_has_at_most_the_services_one_allocation_may_register() {
        let mut j = with_web_port(job());
        let named = |i: usize| ServiceSpec {
            name: format!("s{i}"),
            ..service("http")
        };
        j.groups[0].services = (0..MAX_SERVICES).map(named).collect();
        j.groups[0].tasks[0].services = (MAX_SERVICES..MAX_SERVICES_PER_ALLOC).map(named).collect();
        validate(&j).unwrap();
        let mut second = j.groups[0].tasks[0].clone();
        second.name = "second".into();
        second.services = vec![named(MAX_SERVICES_PER_ALLOC)];
        j.groups[0].tasks.push(second);
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service");
        assert!(e.message.contains("65 services"), "{e}");
    }

    #[test]
    fn names_of_services_and_checks_fit_the_servers_limit_without_control_characters() {
        let mut j = with_web_port(job());
        let mut s = service("http");
        s.name = "w".repeat(MAX_SERVICE_NAME_BYTES + 1);
        j.groups[0].services = vec![s];
        let e = validate(&j).unwrap_err();
        assert_eq!(e.field, "group[0].service[0].name");
        let mut s = service("http");
        s.checks = vec![check("tcp")];
        for bad in [
            "c".repeat(MAX_SERVICE_NAME_BYTES + 1),
            "ok\x1b[2Jfake".into(),
        ] {
            s.checks[0].name = bad;
            j.groups[0].services = vec![s.clone()];
            let e = validate(&j).unwrap_err();
            assert_eq!(e.field, "group[0].service[0].check[0].name");
        }
        s.checks[0].name = "a check: with spaces".into();
        j.groups[0].services = vec![s];
        validate(&j).unwrap();
    }

    #[test]
    fn update_strategies_are_checked_by_field() {
        let mut j = job();
        j.groups[0].count = 2;
        j.update.canary = 3;
        let e = validate(&j).unwrap_err().to_string();
        assert!(
            e.starts_with("update.canary: 3 canaries is more than group"),
            "{e}"
        );
        let mut j = job();
        j.groups[0].count = 2;
        j.groups[0].update = Some(UpdateStrategy {
            canary: 5,
            ..UpdateStrategy::default()
        });
        assert!(
            validate(&j)
                .unwrap_err()
                .to_string()
                .starts_with("group[0].update.canary:")
        );
        let e = refused(|j| {
            j.update.min_healthy_time = std::time::Duration::from_secs(400);
        });
        assert!(
            e.starts_with("update.min_healthy_time: 6m 40s is not shorter"),
            "{e}"
        );
        let e = refused(|j| {
            j.update.progress_deadline = std::time::Duration::from_secs(60);
        });
        assert!(e.starts_with("update.progress_deadline:"), "{e}");
        let e = refused(|j| {
            j.update.auto_promote = true;
        });
        assert!(e.starts_with("update.auto_promote:"), "{e}");
        let e = refused(|j| {
            j.job_type = JobType::Batch;
            j.update.canary = 1;
        });
        assert!(
            e.starts_with("update.canary: canaries are for service jobs"),
            "{e}"
        );
        let e = refused(|j| {
            j.update.canary = 1;
            j.update.max_parallel = 0;
        });
        assert!(
            e.starts_with("update.canary: canaries need a deployment"),
            "{e}"
        );
        let mut ok = job();
        ok.groups[0].count = 3;
        ok.update.canary = 3;
        ok.update.auto_promote = true;
        validate(&ok).unwrap();
    }

    /// Issue 27: volumes of type host with a source; mounts of the group's volumes at
    /// absolute destinations without `..`; CSI refused for now.
    #[test]
    fn volumes_and_their_mounts_are_checked() {
        let with = |volume_type: &str, source: &str, mount: &str, dest: &str| {
            let mut j = job();
            j.groups[0].volumes.insert(
                "data".into(),
                crate::VolumeRequest {
                    volume_type: volume_type.into(),
                    source: source.into(),
                    read_only: false,
                    access_mode: String::new(),
                    attachment_mode: String::new(),
                },
            );
            j.groups[0].tasks[0].volume_mounts.push(crate::VolumeMount {
                volume: mount.into(),
                destination: dest.into(),
                read_only: false,
            });
            validate(&j)
        };
        with("host", "shared", "data", "/data").unwrap();
        with("csi", "vol1", "data", "/data").unwrap();
        let e = with("csi", "", "data", "/data").unwrap_err();
        assert_eq!(e.field, "group[0].volume[\"data\"].source");
        let e = with("nfs", "x", "data", "/data").unwrap_err();
        assert!(e.message.contains("unknown volume type \"nfs\""), "{e:?}");
        let e = with("host", "", "data", "/data").unwrap_err();
        assert_eq!(e.field, "group[0].volume[\"data\"].source");
        let e = with("host", "shared", "dta", "/data").unwrap_err();
        assert_eq!(e.field, "group[0].task[0].volume_mount[0].volume");
        assert!(
            e.message
                .contains("volume \"dta\" is not a volume of group \"app\""),
            "{e:?}"
        );
        for bad in ["data", "/data/../etc", "/", "/./", ""] {
            let e = with("host", "shared", "data", bad).unwrap_err();
            assert_eq!(
                e.field, "group[0].task[0].volume_mount[0].destination",
                "{bad}"
            );
        }
    }
}
