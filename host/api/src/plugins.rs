//! Plugins: the rows of `GET /v1/plugins` (`drover plugin status`).

use std::path::PathBuf;

use serde::Serialize;

/// Where a plugin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginSource {
    /// Linked into the `drover` binary.
    Builtin,
    /// A binary in `plugin_dir`.
    External,
}

/// The state shown for each plugin binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

/// One row of `drover plugin status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginStatus {
    /// Plugin name (the file name while unknown).
    pub name: String,
    /// Plugin type.
    #[serde(rename = "type")]
    pub kind: String,
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
}
