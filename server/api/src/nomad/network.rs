//! Networks, ports, services and checks as Nomad's API carries them (`api/resources.go`,
//! `api/services.go`, `api/allocations.go` of Nomad 1.0; `Provider` is Nomad 1.3's), and
//! their conversions to and from Drover's [`crate::types::NetworkSpec`],
//! [`crate::types::ServiceSpec`], [`crate::types::AllocatedPort`] and
//! [`crate::types::NodeNetwork`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{ConversionError, duration, join, refuse_unknown, refuse_unsupported};
use crate::types::{self as internal, NOMAD_SERVICE_PROVIDER, NetworkMode};

/// Nomad's `check_restart` grace when a block leaves it out (`api.CheckRestart`'s
/// canonical value).
pub const DEFAULT_CHECK_RESTART_GRACE: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------
// Wire types
// ---------------------------------------------------------------------------------------

/// A network in Nomad's shape: a group's (`TaskGroup.Networks`, one per group), an
/// allocation's (`AllocatedResources.Shared.Networks`) or a node's
/// (`NodeResources.Networks`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NetworkResource {
    /// `host` (also empty) or `bridge`.
    #[serde(rename = "Mode", alias = "mode", default)]
    pub mode: Option<String>,
    /// The node's interface (nodes and allocations only).
    #[serde(rename = "Device", alias = "device", default)]
    pub device: Option<String>,
    /// The node's network (nodes only; Drover leaves it empty).
    #[serde(rename = "CIDR", alias = "cidr", default)]
    pub cidr: Option<String>,
    /// The address the ports are on (nodes and allocations only).
    #[serde(rename = "IP", alias = "ip", default)]
    pub ip: Option<String>,
    /// Fixed ports (`port "x" { static = N }`).
    #[serde(rename = "ReservedPorts", alias = "reserved_ports", default)]
    pub reserved_ports: Option<Vec<Port>>,
    /// Ports the scheduler picks (`port "x" {}`).
    #[serde(rename = "DynamicPorts", alias = "dynamic_ports", default)]
    pub dynamic_ports: Option<Vec<Port>>,
    /// Deprecated in Nomad; refused when set.
    #[serde(rename = "MBits", default)]
    pub mbits: Option<Value>,
    /// Not supported yet (bridge mode's resolver).
    #[serde(rename = "DNS", default)]
    pub dns: Option<Value>,
    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A port of a network in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Port {
    /// The port's label (`NOMAD_PORT_<label>`).
    #[serde(
        rename = "Label",
        alias = "label",
        deserialize_with = "super::null_default"
    )]
    pub label: String,
    /// The node's port (0 in a group's dynamic port: the scheduler picks).
    #[serde(rename = "Value", alias = "value", alias = "static")]
    pub value: i64,
    /// The port inside the allocation (0: none; -1: the same as `Value`).
    #[serde(rename = "To", alias = "to")]
    pub to: i64,
    /// The node's host network (only `default`, or empty).
    #[serde(
        rename = "HostNetwork",
        alias = "host_network",
        deserialize_with = "super::null_default"
    )]
    pub host_network: String,
}

/// A port an allocation was given, in Nomad's shape (`AllocatedResources.Shared.Ports`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PortMapping {
    /// The group's label for it.
    #[serde(rename = "Label", deserialize_with = "super::null_default")]
    pub label: String,
    /// The node's port.
    #[serde(rename = "Value")]
    pub value: i64,
    /// The port inside the allocation.
    #[serde(rename = "To")]
    pub to: i64,
    /// The node's address.
    #[serde(rename = "HostIP", deserialize_with = "super::null_default")]
    pub host_ip: String,
}

/// A service in Nomad's shape (`TaskGroup.Services`, `Task.Services`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Service {
    /// Unused by Nomad.
    #[serde(rename = "Id", alias = "ID", default)]
    pub id: Option<String>,
    /// Name (empty: `JOB-GROUP` or `JOB-GROUP-TASK`).
    #[serde(rename = "Name", alias = "name", default)]
    pub name: Option<String>,
    /// Tags.
    #[serde(rename = "Tags", alias = "tags", default)]
    pub tags: Option<Vec<String>>,
    /// Port label (or number) the service is at.
    #[serde(rename = "PortLabel", alias = "port_label", alias = "port", default)]
    pub port_label: Option<String>,
    /// `auto` or `host` (empty: `auto`); Drover advertises the node's address.
    #[serde(rename = "AddressMode", alias = "address_mode", default)]
    pub address_mode: Option<String>,
    /// Health checks.
    #[serde(rename = "Checks", alias = "checks", default)]
    pub checks: Option<Vec<ServiceCheck>>,
    /// Restart on failing checks (merged into every check).
    #[serde(rename = "CheckRestart", alias = "check_restart", default)]
    pub check_restart: Option<CheckRestart>,
    /// Metadata.
    #[serde(rename = "Meta", alias = "meta", default)]
    pub meta: Option<BTreeMap<String, String>>,
    /// A group service's task (for `check_restart` and script checks).
    #[serde(rename = "TaskName", alias = "task_name", alias = "task", default)]
    pub task_name: Option<String>,
    /// Nomad 1.3's provider: `nomad` only (empty: `nomad`).
    #[serde(rename = "Provider", alias = "provider", default)]
    pub provider: Option<String>,

    /// Not supported yet (canaries).
    #[serde(rename = "CanaryTags", default)]
    pub canary_tags: Option<Value>,
    /// Not supported yet (canaries).
    #[serde(rename = "CanaryMeta", default)]
    pub canary_meta: Option<Value>,
    /// Consul's; not supported.
    #[serde(rename = "EnableTagOverride", default)]
    pub enable_tag_override: Option<Value>,
    /// Consul Connect; not supported.
    #[serde(rename = "Connect", default)]
    pub connect: Option<Value>,
    /// Nomad 1.1's; only the default (`require_healthy`).
    #[serde(rename = "OnUpdate", default)]
    pub on_update: Option<String>,
    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A check of a service in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ServiceCheck {
    /// Unused by Nomad.
    #[serde(rename = "Id", alias = "ID", default)]
    pub id: Option<String>,
    /// Name (empty: `service: "<name>" check`).
    #[serde(rename = "Name", alias = "name", default)]
    pub name: Option<String>,
    /// `http`, `tcp` or `script`.
    #[serde(rename = "Type", alias = "type", default)]
    pub check_type: Option<String>,
    /// `script`: the command.
    #[serde(rename = "Command", alias = "command", default)]
    pub command: Option<String>,
    /// `script`: its arguments.
    #[serde(rename = "Args", alias = "args", default)]
    pub args: Option<Vec<String>>,
    /// `http`: the path.
    #[serde(rename = "Path", alias = "path", default)]
    pub path: Option<String>,
    /// `http`: `http` or `https`.
    #[serde(rename = "Protocol", alias = "protocol", default)]
    pub protocol: Option<String>,
    /// The port label to check (empty: the service's).
    #[serde(rename = "PortLabel", alias = "port_label", alias = "port", default)]
    pub port_label: Option<String>,
    /// Through an exposed port (bridge mode).
    #[serde(rename = "Expose", alias = "expose", default)]
    pub expose: Option<bool>,
    /// `host` (or empty).
    #[serde(rename = "AddressMode", alias = "address_mode", default)]
    pub address_mode: Option<String>,
    /// Between two runs, nanoseconds.
    #[serde(
        rename = "Interval",
        alias = "interval",
        default,
        with = "duration::opt"
    )]
    pub interval: Option<Duration>,
    /// One run's limit, nanoseconds.
    #[serde(rename = "Timeout", alias = "timeout", default, with = "duration::opt")]
    pub timeout: Option<Duration>,
    /// `http`: request headers.
    #[serde(rename = "Header", alias = "header", default)]
    pub header: Option<BTreeMap<String, Vec<String>>>,
    /// `http`: the method.
    #[serde(rename = "Method", alias = "method", default)]
    pub method: Option<String>,
    /// Restart on failures of this check.
    #[serde(rename = "CheckRestart", alias = "check_restart", default)]
    pub check_restart: Option<CheckRestart>,
    /// `script` of a group service: the task to run in.
    #[serde(rename = "TaskName", alias = "task_name", alias = "task", default)]
    pub task_name: Option<String>,

    /// Not supported yet.
    #[serde(rename = "InitialStatus", default)]
    pub initial_status: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "TLSSkipVerify", default)]
    pub tls_skip_verify: Option<Value>,
    /// gRPC checks are not supported.
    #[serde(rename = "GRPCService", default)]
    pub grpc_service: Option<Value>,
    /// gRPC checks are not supported.
    #[serde(rename = "GRPCUseTLS", default)]
    pub grpc_use_tls: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "SuccessBeforePassing", default)]
    pub success_before_passing: Option<Value>,
    /// Not supported yet.
    #[serde(rename = "FailuresBeforeCritical", default)]
    pub failures_before_critical: Option<Value>,
    /// Nomad 1.1's; only the default (`require_healthy`).
    #[serde(rename = "OnUpdate", default)]
    pub on_update: Option<String>,
    /// Any other key: refused when it carries a value.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `check_restart` in Nomad's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CheckRestart {
    /// Failures in a row that restart the task.
    #[serde(rename = "Limit", alias = "limit", default)]
    pub limit: Option<i64>,
    /// Failures after a (re)start that do not count, nanoseconds.
    #[serde(rename = "Grace", alias = "grace", default, with = "duration::opt")]
    pub grace: Option<Duration>,
    /// A warning counts as passing.
    #[serde(rename = "IgnoreWarnings", alias = "ignore_warnings", default)]
    pub ignore_warnings: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// Wire → internal
// ---------------------------------------------------------------------------------------

/// A group's `Networks` (at `path`) as its network: at most one, as in Nomad.
pub(crate) fn group_network(
    path: &str,
    networks: &[NetworkResource],
) -> Result<Option<internal::NetworkSpec>, ConversionError> {
    if networks.len() > 1 {
        return Err(ConversionError::new(
            format!("{path}[1]"),
            "a group has one network (as in Nomad): put every port in the first",
        ));
    }
    let Some(n) = networks.first() else {
        return Ok(None);
    };
    let npath = format!("{path}[0]");
    refuse_unsupported(&npath, &[("MBits", &n.mbits), ("DNS", &n.dns)])?;
    refuse_unknown(&npath, &n.other)?;
    for (field, value) in [("Device", &n.device), ("CIDR", &n.cidr), ("IP", &n.ip)] {
        if value.as_deref().is_some_and(|v| !v.is_empty()) {
            return Err(ConversionError::new(
                join(&npath, field),
                "a group's network takes no address: the node's is used",
            ));
        }
    }
    let mode = match n.mode.as_deref() {
        None | Some("") | Some("host") => NetworkMode::Host,
        Some("bridge") => NetworkMode::Bridge,
        Some(other) => {
            return Err(ConversionError::new(
                join(&npath, "Mode"),
                format!("network mode {other:?} is not supported by Drover (host or bridge)"),
            ));
        }
    };
    let mut ports = Vec::new();
    for (key, list, reserved) in [
        ("ReservedPorts", &n.reserved_ports, true),
        ("DynamicPorts", &n.dynamic_ports, false),
    ] {
        for (i, p) in list.iter().flatten().enumerate() {
            let ppath = format!("{npath}.{key}[{i}]");
            if reserved && p.value == 0 {
                return Err(ConversionError::new(
                    join(&ppath, "Value"),
                    "a reserved port needs its number (1-65535)",
                ));
            }
            // A dynamic port's value is the scheduler's: a job read back from a
            // Nomad server may carry one; it asks for nothing.
            let static_port = if reserved {
                u32::try_from(p.value).map_err(|_| {
                    ConversionError::new(
                        join(&ppath, "Value"),
                        format!("{} is not a port: 1-65535", p.value),
                    )
                })?
            } else {
                0
            };
            let to = i32::try_from(p.to).map_err(|_| {
                ConversionError::new(
                    join(&ppath, "To"),
                    format!("{} is not a port: 1-65535", p.to),
                )
            })?;
            ports.push(internal::PortSpec {
                label: p.label.clone(),
                static_port,
                to,
                host_network: host_network_or_default(&p.host_network),
            });
        }
    }
    Ok(Some(internal::NetworkSpec { mode, ports }))
}

/// The node's host network a port is on: `default` when none is named (as a Nomad
/// server fills it in).
pub fn host_network_or_default(name: &str) -> String {
    if name.is_empty() {
        DEFAULT_HOST_NETWORK.to_owned()
    } else {
        name.to_owned()
    }
}

/// The host network every node has (and the only one Drover's nodes have).
pub const DEFAULT_HOST_NETWORK: &str = "default";

/// A task's `Resources.Networks`: refused (Nomad 1.0 still reads them; Drover has
/// group networks only).
pub(crate) fn refuse_task_networks(
    path: &str,
    networks: &Option<Vec<NetworkResource>>,
) -> Result<(), ConversionError> {
    if networks.as_ref().is_some_and(|n| !n.is_empty()) {
        return Err(ConversionError::new(
            path,
            "a task has no network in Drover: move network to the group (TaskGroup.Networks)",
        ));
    }
    Ok(())
}

/// Where a list of services is: `(job, group, task)` names, for Nomad's default names.
pub(crate) struct ServiceOwner<'a> {
    pub(crate) job: &'a str,
    pub(crate) group: &'a str,
    pub(crate) task: Option<&'a str>,
}

impl ServiceOwner<'_> {
    /// Nomad's default service name: `JOB-GROUP`, or `JOB-GROUP-TASK` for a task's.
    pub(crate) fn default_name(&self) -> String {
        match self.task {
            Some(t) => format!("{}-{}-{t}", self.job, self.group),
            None => format!("{}-{}", self.job, self.group),
        }
    }
}

/// Nomad's default check name.
pub fn default_check_name(service: &str) -> String {
    format!("service: {service:?} check")
}

/// `Services` (at `path`) as Drover's, with Nomad's default names filled in.
pub(crate) fn services(
    path: &str,
    list: &[Service],
    owner: &ServiceOwner<'_>,
) -> Result<Vec<internal::ServiceSpec>, ConversionError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| service(&format!("{path}[{i}]"), s, owner))
        .collect()
}

fn text(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

fn service(
    path: &str,
    s: &Service,
    owner: &ServiceOwner<'_>,
) -> Result<internal::ServiceSpec, ConversionError> {
    refuse_unsupported(
        path,
        &[
            ("CanaryTags", &s.canary_tags),
            ("CanaryMeta", &s.canary_meta),
            ("EnableTagOverride", &s.enable_tag_override),
            ("Connect", &s.connect),
        ],
    )?;
    refuse_unknown(path, &s.other)?;
    refuse_on_update(path, &s.on_update)?;
    match s.address_mode.as_deref() {
        None | Some("" | "auto" | "host") => {}
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "AddressMode"),
                format!(
                    "address mode {other:?} is not supported by Drover: services are at the \
                     node's address (auto or host)"
                ),
            ));
        }
    }
    let provider = match s.provider.as_deref() {
        None | Some("") => NOMAD_SERVICE_PROVIDER.to_owned(),
        Some(NOMAD_SERVICE_PROVIDER) => NOMAD_SERVICE_PROVIDER.to_owned(),
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "Provider"),
                format!(
                    "provider {other:?} is not supported: Drover keeps services itself: \
                     provider = \"nomad\""
                ),
            ));
        }
    };
    let name = match s.name.as_deref() {
        None | Some("") => owner.default_name(),
        Some(n) => n.to_owned(),
    };
    let check_restart = s
        .check_restart
        .as_ref()
        .map(|r| check_restart(&join(path, "CheckRestart"), r, None))
        .transpose()?;
    let mut checks = Vec::new();
    for (i, c) in s.checks.iter().flatten().enumerate() {
        checks.push(check(
            &format!("{path}.Checks[{i}]"),
            c,
            &name,
            check_restart.as_ref(),
        )?);
    }
    Ok(internal::ServiceSpec {
        name,
        port: text(&s.port_label),
        tags: s.tags.clone().unwrap_or_default(),
        meta: s.meta.clone().unwrap_or_default(),
        provider,
        task: text(&s.task_name),
        checks,
        check_restart,
    })
}

fn refuse_on_update(path: &str, on_update: &Option<String>) -> Result<(), ConversionError> {
    match on_update.as_deref() {
        None | Some("" | "require_healthy") => Ok(()),
        Some(other) => Err(ConversionError::new(
            join(path, "OnUpdate"),
            format!(
                "on_update {other:?} is not supported by Drover (checks always gate \
                 deployments: require_healthy)"
            ),
        )),
    }
}

/// A `CheckRestart`, over `base` (a check's over its service's, field by field, as
/// Nomad merges them); an absent grace is Nomad's 1s.
fn check_restart(
    path: &str,
    r: &CheckRestart,
    base: Option<&internal::CheckRestart>,
) -> Result<internal::CheckRestart, ConversionError> {
    let limit = match r.limit {
        None | Some(0) => base.map_or(0, |b| b.limit),
        Some(v) => u32::try_from(v).map_err(|_| {
            ConversionError::new(
                join(path, "Limit"),
                format!("Limit must be 0 or more, got {v}"),
            )
        })?,
    };
    Ok(internal::CheckRestart {
        limit,
        grace: r
            .grace
            .or(base.map(|b| b.grace))
            .unwrap_or(DEFAULT_CHECK_RESTART_GRACE),
        ignore_warnings: r.ignore_warnings.unwrap_or(false)
            || base.is_some_and(|b| b.ignore_warnings),
    })
}

fn check(
    path: &str,
    c: &ServiceCheck,
    service_name: &str,
    service_restart: Option<&internal::CheckRestart>,
) -> Result<internal::CheckSpec, ConversionError> {
    refuse_unsupported(
        path,
        &[
            ("InitialStatus", &c.initial_status),
            ("TLSSkipVerify", &c.tls_skip_verify),
            ("GRPCService", &c.grpc_service),
            ("GRPCUseTLS", &c.grpc_use_tls),
            ("SuccessBeforePassing", &c.success_before_passing),
            ("FailuresBeforeCritical", &c.failures_before_critical),
        ],
    )?;
    refuse_unknown(path, &c.other)?;
    refuse_on_update(path, &c.on_update)?;
    match c.address_mode.as_deref() {
        None | Some("" | "host") => {}
        Some(other) => {
            return Err(ConversionError::new(
                join(path, "AddressMode"),
                format!(
                    "address mode {other:?} is not supported by Drover: checks reach the \
                     node's address (host)"
                ),
            ));
        }
    }
    let name = match c.name.as_deref() {
        None | Some("") => default_check_name(service_name),
        Some(n) => n.to_owned(),
    };
    Ok(internal::CheckSpec {
        name,
        // Nomad takes the type in any case.
        check_type: text(&c.check_type).to_ascii_lowercase(),
        interval: c.interval.unwrap_or_default(),
        timeout: c.timeout.unwrap_or_default(),
        path: text(&c.path),
        method: text(&c.method),
        protocol: text(&c.protocol),
        header: c.header.clone().unwrap_or_default(),
        port: text(&c.port_label),
        command: text(&c.command),
        args: c.args.clone().unwrap_or_default(),
        task: text(&c.task_name),
        expose: c.expose.unwrap_or(false),
        check_restart: c
            .check_restart
            .as_ref()
            .map(|r| check_restart(&join(path, "CheckRestart"), r, service_restart))
            .transpose()?,
    })
}

// ---------------------------------------------------------------------------------------
// Internal → wire
// ---------------------------------------------------------------------------------------

impl From<&internal::NetworkSpec> for NetworkResource {
    /// A group's network as Nomad serves it: static ports reserved, the others dynamic.
    fn from(n: &internal::NetworkSpec) -> NetworkResource {
        let port = |p: &internal::PortSpec| Port {
            label: p.label.clone(),
            value: i64::from(p.static_port),
            to: i64::from(p.to),
            host_network: p.host_network.clone(),
        };
        let (reserved, dynamic): (Vec<_>, Vec<_>) =
            n.ports.iter().partition(|p| p.static_port != 0);
        NetworkResource {
            mode: Some(n.mode.as_str().to_owned()),
            device: Some(String::new()),
            cidr: Some(String::new()),
            ip: Some(String::new()),
            reserved_ports: Some(reserved.into_iter().map(port).collect()),
            dynamic_ports: Some(dynamic.into_iter().map(port).collect()),
            ..Default::default()
        }
    }
}

impl From<&internal::CheckRestart> for CheckRestart {
    fn from(r: &internal::CheckRestart) -> CheckRestart {
        CheckRestart {
            limit: Some(i64::from(r.limit)),
            grace: Some(r.grace),
            ignore_warnings: Some(r.ignore_warnings),
        }
    }
}

impl From<&internal::ServiceSpec> for Service {
    fn from(s: &internal::ServiceSpec) -> Service {
        Service {
            id: Some(String::new()),
            name: Some(s.name.clone()),
            tags: Some(s.tags.clone()),
            port_label: Some(s.port.clone()),
            address_mode: Some("auto".to_owned()),
            checks: Some(s.checks.iter().map(ServiceCheck::from).collect()),
            check_restart: s.check_restart.as_ref().map(CheckRestart::from),
            meta: Some(s.meta.clone()),
            task_name: Some(s.task.clone()),
            provider: Some(s.provider.clone()),
            enable_tag_override: Some(Value::Bool(false)),
            ..Default::default()
        }
    }
}

impl From<&internal::CheckSpec> for ServiceCheck {
    fn from(c: &internal::CheckSpec) -> ServiceCheck {
        ServiceCheck {
            id: Some(String::new()),
            name: Some(c.name.clone()),
            check_type: Some(c.check_type.clone()),
            command: Some(c.command.clone()),
            args: Some(c.args.clone()),
            path: Some(c.path.clone()),
            protocol: Some(c.protocol.clone()),
            port_label: Some(c.port.clone()),
            expose: Some(c.expose),
            address_mode: Some(String::new()),
            interval: Some(c.interval),
            timeout: Some(c.timeout),
            header: Some(c.header.clone()),
            method: Some(c.method.clone()),
            check_restart: c.check_restart.as_ref().map(CheckRestart::from),
            task_name: Some(c.task.clone()),
            ..Default::default()
        }
    }
}

impl From<&internal::AllocatedPort> for PortMapping {
    fn from(p: &internal::AllocatedPort) -> PortMapping {
        PortMapping {
            label: p.label.clone(),
            value: i64::from(p.value),
            to: i64::from(p.to),
            host_ip: p.host_ip.clone(),
        }
    }
}

impl From<&PortMapping> for internal::AllocatedPort {
    /// An allocated port read back (a number out of range reads as 0).
    fn from(p: &PortMapping) -> internal::AllocatedPort {
        let port = |v: i64| u16::try_from(v).unwrap_or(0);
        internal::AllocatedPort {
            label: p.label.clone(),
            value: port(p.value),
            to: port(p.to),
            host_ip: p.host_ip.clone(),
        }
    }
}

/// An allocation's network in Nomad's shape: `mode`, the address of its ports, the
/// ports the group fixed (`static`) reserved and the others dynamic.
pub fn allocation_network(
    ports: &[internal::AllocatedPort],
    group: Option<&internal::TaskGroup>,
) -> NetworkResource {
    let spec = group.and_then(|g| g.network.as_ref());
    let is_static = |label: &str| {
        spec.is_some_and(|n| {
            n.ports
                .iter()
                .any(|p| p.label == label && p.static_port != 0)
        })
    };
    let port = |p: &internal::AllocatedPort| Port {
        label: p.label.clone(),
        value: i64::from(p.value),
        to: i64::from(p.to),
        host_network: "default".to_owned(),
    };
    let (reserved, dynamic): (Vec<_>, Vec<_>) = ports.iter().partition(|p| is_static(&p.label));
    NetworkResource {
        mode: Some(
            spec.map_or(NetworkMode::Host, |n| n.mode)
                .as_str()
                .to_owned(),
        ),
        device: Some(String::new()),
        cidr: Some(String::new()),
        ip: Some(ports.first().map(|p| p.host_ip.clone()).unwrap_or_default()),
        reserved_ports: Some(reserved.into_iter().map(port).collect()),
        dynamic_ports: Some(dynamic.into_iter().map(port).collect()),
        ..Default::default()
    }
}

/// `AllocatedResources` of an allocation in Nomad's shape: `Shared.Ports` and
/// `Shared.Networks` (what `nomad alloc status` prints as the allocation's addresses).
pub fn allocated_resources(
    ports: &[internal::AllocatedPort],
    group: Option<&internal::TaskGroup>,
) -> Value {
    let networks = if ports.is_empty() && group.and_then(|g| g.network.as_ref()).is_none() {
        Vec::new()
    } else {
        vec![allocation_network(ports, group)]
    };
    json!({
        "Tasks": {},
        "Shared": {
            "DiskMB": 0,
            "Networks": networks,
            "Ports": ports.iter().map(PortMapping::from).collect::<Vec<_>>(),
        },
    })
}

/// The ports of an allocation read back from `AllocatedResources.Shared.Ports`.
pub fn ports_of_allocated_resources(v: Option<&Value>) -> Vec<internal::AllocatedPort> {
    v.and_then(|v| v.pointer("/Shared/Ports"))
        .and_then(|p| serde_json::from_value::<Vec<PortMapping>>(p.clone()).ok())
        .unwrap_or_default()
        .iter()
        .map(internal::AllocatedPort::from)
        .collect()
}

/// A node's ports in Nomad's shape: its network (`NodeResources.Networks`), and its
/// reserved ports as Nomad writes them (`"22,80,8000-8100"`).
pub fn node_network(n: &internal::NodeNetwork) -> NetworkResource {
    NetworkResource {
        mode: Some("host".to_owned()),
        device: Some(String::new()),
        cidr: Some(if n.address.contains(':') {
            format!("{}/128", n.address)
        } else {
            format!("{}/32", n.address)
        }),
        ip: Some(n.address.clone()),
        ..Default::default()
    }
}

/// Reserved port ranges as Nomad writes them: `22,80,8000-8100`.
pub fn reserved_ports_text(ranges: &[internal::PortRange]) -> String {
    ranges
        .iter()
        .map(|r| {
            if r.first == r.last {
                r.first.to_string()
            } else {
                format!("{}-{}", r.first, r.last)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Nomad's `"22,80,8000-8100"` as ranges (`None`: not that form).
pub fn parse_reserved_ports(text: &str) -> Option<Vec<internal::PortRange>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let p = part.parse().ok()?;
                (p, p)
            }
        };
        if first > last {
            return None;
        }
        out.push(internal::PortRange { first, last });
    }
    Some(out)
}
