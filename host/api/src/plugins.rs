//! Plugins: the rows of `GET /v1/plugins` (`drover plugin status`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Older names of drivers, each with the name the driver has now. Drover's raw exec
/// driver was `rawexec` before it took Nomad's name `raw_exec`; task files, job files
/// and scripts that say `rawexec` keep working, and run on the driver named `raw_exec`
/// (built-in, or an operator's plugin of that name, which wins over the built-in).
pub const DRIVER_ALIASES: &[(&str, &str)] = &[("rawexec", "raw_exec")];

/// The driver name `name` stands for: the current name of an older one (see
/// [`DRIVER_ALIASES`]), else `name` itself.
///
/// ```
/// assert_eq!(drover_api::canonical_driver_name("rawexec"), "raw_exec");
/// assert_eq!(drover_api::canonical_driver_name("raw_exec"), "raw_exec");
/// assert_eq!(drover_api::canonical_driver_name("docker"), "docker");
/// ```
pub fn canonical_driver_name(name: &str) -> &str {
    DRIVER_ALIASES
        .iter()
        .find(|(old, _)| *old == name)
        .map_or(name, |(_, new)| new)
}

/// What a plugin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    /// A task driver.
    #[default]
    Driver,
    /// A device plugin (Nomad's device protocol): fingerprints devices tasks ask for.
    Device,
}

/// Where a plugin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginSource {
    /// Linked into the `drover` binary.
    Builtin,
    /// A binary in `plugin_dir`.
    External,
}

/// The state shown for each plugin binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginState {
    /// Loaded, fingerprint healthy.
    Healthy,
    /// Loaded but not working right now (or being relaunched).
    Unhealthy,
    /// Loaded, but the driver cannot run on this node.
    Undetected,
    /// Not loaded; `reason` says why.
    Skipped,
}

/// The driver protocol a plugin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginProtocol {
    /// Drover's own (`drover.plugin.v1`).
    #[default]
    Drover,
    /// Nomad's driver plugin protocol: an unmodified Nomad task driver.
    Nomad,
}

impl PluginProtocol {
    /// The name on the wire, e.g. `"nomad"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginProtocol::Drover => "drover",
            PluginProtocol::Nomad => "nomad",
        }
    }
}

/// One row of `drover plugin status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginStatus {
    /// Plugin name (the file name while unknown).
    pub name: String,
    /// Plugin type.
    #[serde(rename = "type")]
    pub kind: PluginKind,
    /// Plugin version, when known.
    pub version: String,
    /// Negotiated plugin API version, when known.
    pub api_version: String,
    /// Built-in or external.
    pub source: PluginSource,
    /// The binary.
    pub path: PathBuf,
    /// State.
    pub state: PluginState,
    /// Why it is in that state.
    pub reason: String,
    /// Its pid while running.
    pub pid: Option<u32>,
    /// The process was started by an earlier agent and taken over, not launched by this
    /// one. Its stdout/stderr went to that agent and are not captured any more.
    pub reattached: bool,
    /// A driver library loaded into the agent (`in_process = true`), not a process of
    /// its own: `pid` is then empty, and a crash of the driver is a crash of the agent.
    #[serde(default)]
    pub in_process: bool,
    /// The driver protocol it speaks (Drover's, or Nomad's for a Nomad task driver).
    #[serde(default)]
    pub protocol: PluginProtocol,
}

impl PluginSource {
    /// The name on the wire, e.g. `"builtin"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginSource::Builtin => "builtin",
            PluginSource::External => "external",
        }
    }
}

impl PluginState {
    /// The name on the wire, e.g. `"healthy"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginState::Healthy => "healthy",
            PluginState::Unhealthy => "unhealthy",
            PluginState::Undetected => "undetected",
            PluginState::Skipped => "skipped",
        }
    }
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for PluginState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a reload did to one plugin file or name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PluginChangeKind {
    /// A new plugin serves (no restart).
    Added,
    /// A new instance replaced the serving one and took its tasks over.
    Upgraded,
    /// Its file was removed: it takes no new tasks and leaves once its tasks end.
    Removing,
    /// It left the catalog (its file was removed and it has no running task).
    Removed,
    /// A new or changed file could not serve; whatever served keeps serving.
    Failed,
    /// A file that serves nothing (another file wins its name, or it is refused).
    Skipped,
}

impl PluginChangeKind {
    /// The word shown by `drover plugin reload`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginChangeKind::Added => "added",
            PluginChangeKind::Upgraded => "upgraded",
            PluginChangeKind::Removing => "removing",
            PluginChangeKind::Removed => "removed",
            PluginChangeKind::Failed => "failed",
            PluginChangeKind::Skipped => "skipped",
        }
    }
}

/// One change a reload made, for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginChange {
    /// The plugin name (the file name while unknown).
    pub name: String,
    /// The file the change is about.
    pub path: PathBuf,
    /// What happened.
    pub kind: PluginChangeKind,
    /// What and why, in a sentence.
    pub message: String,
}

/// The answer of `POST /v1/plugins/reload` (`drover plugin reload`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReloadReport {
    /// What changed, one entry per plugin file or name; empty when nothing did.
    pub changes: Vec<PluginChange>,
    /// Every plugin row after the reload (as `GET /v1/plugins`).
    pub plugins: Vec<PluginStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_row_reads_and_writes_the_agents_json_unchanged() {
        let text = r#"[{"name":"rawexec","type":"driver","version":"0.1.0","api_version":"1.0.0","source":"builtin","path":"/usr/bin/drover","state":"healthy","reason":"ready","pid":42,"reattached":false,"in_process":false,"protocol":"drover"},{"name":"raw_exec","type":"driver","version":"0.1.0","api_version":"0.1.0","source":"external","path":"/p/raw_exec","state":"healthy","reason":"Healthy","pid":43,"reattached":false,"in_process":false,"protocol":"nomad"},{"name":"bad","type":"driver","version":"","api_version":"","source":"external","path":"/p/bad","state":"skipped","reason":"not executable","pid":null,"reattached":false,"in_process":false,"protocol":"drover"}]"#;
        let rows: Vec<PluginStatus> = serde_json::from_str(text).unwrap();
        assert_eq!(rows[0].state, PluginState::Healthy);
        assert_eq!(rows[0].kind, PluginKind::Driver);
        assert_eq!(rows[1].protocol, PluginProtocol::Nomad);
        assert_eq!(rows[2].source, PluginSource::External);
        assert_eq!(rows[2].state.to_string(), "skipped");
        assert_eq!(serde_json::to_string(&rows).unwrap(), text);
        // Rows of an agent from before protocols were shown: Drover's.
        let old = r#"{"name":"rawexec","type":"driver","version":"0.1.0","api_version":"1.0.0","source":"builtin","path":"/usr/bin/drover","state":"healthy","reason":"ready","pid":42,"reattached":false,"in_process":false}"#;
        let row: PluginStatus = serde_json::from_str(old).unwrap();
        assert_eq!(row.protocol, PluginProtocol::Drover);
    }

    #[test]
    fn a_reload_report_names_each_change_in_lowercase() {
        let report = ReloadReport {
            changes: vec![PluginChange {
                name: "rawexec".into(),
                path: "/p/rawexec".into(),
                kind: PluginChangeKind::Upgraded,
                message: "version 0.1.0 replaced by version 0.2.0".into(),
            }],
            plugins: Vec::new(),
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["changes"][0]["kind"], "upgraded");
        let back: ReloadReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }
}
