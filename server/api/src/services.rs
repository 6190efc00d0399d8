//! Service registrations (Nomad's native service discovery, `provider = "nomad"`).
//!
//! A client agent reports the service instances of each allocation it runs, with the
//! health of their checks, inside its allocation status reports
//! ([`crate::AllocClientUpdate::services`]): the complete set of the allocation's
//! instances each time (an empty set deregisters them all). The server keeps one
//! [`ServiceRegistration`] per instance (key `service/<id>` in its store), removes an
//! allocation's registrations in the same commit that makes it terminal (stopped,
//! complete, failed, lost), and serves them at `GET /v1/services` and
//! `GET /v1/service/<name>`.

use serde::{Deserialize, Serialize};

use crate::Index;

/// The namespace every registration is in (Drover has only Nomad's default one).
pub const SERVICE_NAMESPACE: &str = "default";
/// Instances one allocation may register (more is refused, naming the allocation).
pub const MAX_SERVICES_PER_ALLOC: usize = 64;
/// Longest service name, port label or owner (group/task) name, in bytes.
pub const MAX_SERVICE_NAME_BYTES: usize = 256;
/// Tags of one instance, at most.
pub const MAX_SERVICE_TAGS: usize = 64;
/// Longest tag, in bytes.
pub const MAX_SERVICE_TAG_BYTES: usize = 256;
/// Longest address, in bytes (an IPv6 address with a zone fits easily).
pub const MAX_SERVICE_ADDRESS_BYTES: usize = 128;
/// Checks of one instance, at most.
pub const MAX_SERVICE_CHECKS: usize = 32;
/// A check's output is kept up to this many bytes (the rest is cut, not refused).
pub const MAX_CHECK_OUTPUT_BYTES: usize = 256;

/// Health of an instance, or of one of its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceHealth {
    /// Every check passes (or the instance has none).
    #[default]
    Passing,
    /// A check warns (HTTP 429, a script's exit code 1), none fails.
    Warning,
    /// A check fails.
    Critical,
    /// A check has not run yet.
    Pending,
}

impl ServiceHealth {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceHealth::Passing => "passing",
            ServiceHealth::Warning => "warning",
            ServiceHealth::Critical => "critical",
            ServiceHealth::Pending => "pending",
        }
    }

    /// Served by `GET /v1/service/<name>` without `?all`: passing or warning (as
    /// Consul's DNS interface serves them).
    pub fn is_healthy(self) -> bool {
        matches!(self, ServiceHealth::Passing | ServiceHealth::Warning)
    }

    /// The health of an instance with checks of these statuses: the worst one
    /// (critical, then pending, then warning); passing without checks.
    pub fn worst(checks: impl IntoIterator<Item = ServiceHealth>) -> ServiceHealth {
        let rank = |h: ServiceHealth| match h {
            ServiceHealth::Passing => 0,
            ServiceHealth::Warning => 1,
            ServiceHealth::Pending => 2,
            ServiceHealth::Critical => 3,
        };
        checks
            .into_iter()
            .max_by_key(|h| rank(*h))
            .unwrap_or(ServiceHealth::Passing)
    }
}

/// The last result of one check of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CheckStatus {
    /// The check's name.
    pub name: String,
    /// Its status.
    pub status: ServiceHealth,
    /// What the last run said (HTTP status line, connect error, script output), cut
    /// to [`MAX_CHECK_OUTPUT_BYTES`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output: String,
}

/// One service instance of an allocation, as its client reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServiceInstance {
    /// The service's name (interpolated).
    pub service_name: String,
    /// Whose service: the task's name, or `group-<group>` for a group service (the
    /// part of the registration id Nomad puts there).
    pub owner: String,
    /// The port label (or number) the service names.
    #[serde(default)]
    pub port_label: String,
    /// Tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The address clients reach it at.
    pub address: String,
    /// The port clients reach it at.
    pub port: u16,
    /// The instance's health: the worst of its checks.
    pub health: ServiceHealth,
    /// Its checks' last results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckStatus>,
}

/// Nomad's id of an allocation's service instance:
/// `_nomad-task-<alloc>-<task | group-<group>>-<service>-<port label>`.
pub fn service_id(alloc_id: &str, owner: &str, service: &str, port_label: &str) -> String {
    format!("_nomad-task-{alloc_id}-{owner}-{service}-{port_label}")
}

impl ServiceInstance {
    /// Its registration id in allocation `alloc_id`.
    pub fn id(&self, alloc_id: &str) -> String {
        service_id(alloc_id, &self.owner, &self.service_name, &self.port_label)
    }

    /// Refuse what cannot be kept, naming the field (`what` says where it came from);
    /// check outputs longer than [`MAX_CHECK_OUTPUT_BYTES`] are cut, not refused.
    pub fn check(&mut self, what: &str) -> Result<(), String> {
        for (field, v, max) in [
            ("service_name", &self.service_name, MAX_SERVICE_NAME_BYTES),
            ("owner", &self.owner, MAX_SERVICE_NAME_BYTES),
            ("port_label", &self.port_label, MAX_SERVICE_NAME_BYTES),
            ("address", &self.address, MAX_SERVICE_ADDRESS_BYTES),
        ] {
            if v.len() > max {
                return Err(format!("{what}.{field}: {} bytes, at most {max}", v.len()));
            }
        }
        if self.service_name.is_empty() {
            return Err(format!("{what}.service_name is empty"));
        }
        if self.tags.len() > MAX_SERVICE_TAGS {
            return Err(format!(
                "{what}.tags: {} tags, at most {MAX_SERVICE_TAGS}",
                self.tags.len()
            ));
        }
        if let Some((i, t)) = self
            .tags
            .iter()
            .enumerate()
            .find(|(_, t)| t.len() > MAX_SERVICE_TAG_BYTES)
        {
            return Err(format!(
                "{what}.tags[{i}]: {} bytes, at most {MAX_SERVICE_TAG_BYTES}",
                t.len()
            ));
        }
        if self.checks.len() > MAX_SERVICE_CHECKS {
            return Err(format!(
                "{what}.checks: {} checks, at most {MAX_SERVICE_CHECKS}",
                self.checks.len()
            ));
        }
        for (i, c) in self.checks.iter_mut().enumerate() {
            if c.name.len() > MAX_SERVICE_NAME_BYTES {
                return Err(format!(
                    "{what}.checks[{i}].name: {} bytes, at most {MAX_SERVICE_NAME_BYTES}",
                    c.name.len()
                ));
            }
            c.output = truncate_utf8(&c.output, MAX_CHECK_OUTPUT_BYTES);
        }
        Ok(())
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
pub fn truncate_utf8(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// A registered service instance, as the server keeps and serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRegistration {
    /// `_nomad-task-<alloc>-<task | group-<group>>-<service>-<port label>`.
    pub id: String,
    /// The service's name.
    pub service_name: String,
    /// Always [`SERVICE_NAMESPACE`].
    pub namespace: String,
    /// The node of the allocation.
    pub node_id: String,
    /// The node's datacenter.
    pub datacenter: String,
    /// The allocation's job.
    pub job_id: String,
    /// The allocation.
    pub alloc_id: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// Health (the worst of its checks).
    pub health: ServiceHealth,
    /// The checks' last results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckStatus>,
    /// Index it was registered at.
    pub create_index: Index,
    /// Index it last changed at.
    pub modify_index: Index,
}

/// Nomad's wire shape of a registration (`GET /v1/service/<name>`), with Drover's
/// health beside it (`Status`, `Checks`: not in Nomad's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NomadServiceRegistration {
    /// Id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name.
    pub service_name: String,
    /// Namespace.
    pub namespace: String,
    /// Node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Datacenter.
    pub datacenter: String,
    /// Job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Allocation.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// `passing`, `warning`, `critical` or `pending`.
    pub status: ServiceHealth,
    /// The checks' last results.
    #[serde(default)]
    pub checks: Vec<NomadCheckStatus>,
    /// Create index.
    pub create_index: Index,
    /// Modify index.
    pub modify_index: Index,
}

/// One check's result in [`NomadServiceRegistration`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NomadCheckStatus {
    /// Name.
    pub name: String,
    /// Status.
    pub status: ServiceHealth,
    /// Output of the last run.
    #[serde(default)]
    pub output: String,
}

impl From<&ServiceRegistration> for NomadServiceRegistration {
    fn from(r: &ServiceRegistration) -> Self {
        NomadServiceRegistration {
            id: r.id.clone(),
            service_name: r.service_name.clone(),
            namespace: r.namespace.clone(),
            node_id: r.node_id.clone(),
            datacenter: r.datacenter.clone(),
            job_id: r.job_id.clone(),
            alloc_id: r.alloc_id.clone(),
            tags: r.tags.clone(),
            address: r.address.clone(),
            port: r.port,
            status: r.health,
            checks: r
                .checks
                .iter()
                .map(|c| NomadCheckStatus {
                    name: c.name.clone(),
                    status: c.status,
                    output: c.output.clone(),
                })
                .collect(),
            create_index: r.create_index,
            modify_index: r.modify_index,
        }
    }
}

/// One namespace's services in `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NomadServiceNamespace {
    /// Namespace.
    pub namespace: String,
    /// Its services.
    pub services: Vec<NomadServiceStub>,
}

/// One service in `GET /v1/services`: its name and the union of its instances' tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NomadServiceStub {
    /// Name.
    pub service_name: String,
    /// Tags (sorted, without repeats).
    pub tags: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_check_decides() {
        use ServiceHealth::*;
        assert_eq!(ServiceHealth::worst([]), Passing);
        assert_eq!(ServiceHealth::worst([Passing, Warning]), Warning);
        assert_eq!(ServiceHealth::worst([Warning, Pending]), Pending);
        assert_eq!(ServiceHealth::worst([Critical, Pending, Passing]), Critical);
    }

    #[test]
    fn ids_have_nomads_shape_and_long_fields_are_refused_by_name() {
        let mut i = ServiceInstance {
            service_name: "web".into(),
            owner: "group-g".into(),
            port_label: "http".into(),
            address: "127.0.0.1".into(),
            port: 8080,
            ..Default::default()
        };
        assert_eq!(i.id("a1"), "_nomad-task-a1-group-g-web-http");
        i.checks.push(CheckStatus {
            name: "c".into(),
            status: ServiceHealth::Critical,
            output: "é".repeat(MAX_CHECK_OUTPUT_BYTES),
        });
        i.check("services[0]").unwrap();
        assert!(i.checks[0].output.len() <= MAX_CHECK_OUTPUT_BYTES);
        i.tags = vec!["x".repeat(MAX_SERVICE_TAG_BYTES + 1)];
        let e = i.check("services[0]").unwrap_err();
        assert!(e.contains("services[0].tags[0]"), "{e}");
    }
}
