//! Finding, launching and fingerprinting plugins.
//!
//! Every candidate (each executable in `plugin_dir`, plus the built-in drivers, which
//! are this same binary re-executed) is launched once, concurrently, handshaken,
//! identified and version-negotiated. The process that was fingerprinted is the one
//! that then serves. Anything wrong with a candidate becomes a `skipped` status row
//! with a reason for people; nothing here can take the agent down.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_api::{PluginKind, PluginSource, PluginState, PluginStatus};
use drover_plugin_sdk::client::{LaunchOptions, PluginProcess};
use drover_plugin_sdk::version::{negotiate_api_version, parse_version};
use drover_plugin_sdk::{Capabilities, DriverError, PluginInfo};
use sha2::Digest as _;

/// A plugin binary to try.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The executable.
    pub path: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Where it came from.
    pub source: PluginSource,
    /// File name (external) or built-in name, for logs and allow/deny lists.
    pub label: String,
}

/// A built-in driver the `drover` binary can serve by re-executing itself.
#[derive(Debug, Clone)]
pub struct Builtin {
    /// Driver name.
    pub name: String,
    /// The executable (normally the running `drover` binary).
    pub command: PathBuf,
    /// Arguments that make it serve this driver, e.g. `plugin serve rawexec`.
    pub args: Vec<OsString>,
}

/// The status row of a candidate that was not loaded.
pub(crate) fn skipped_status(c: &Candidate, reason: impl Into<String>) -> PluginStatus {
    PluginStatus {
        name: c.label.clone(),
        kind: PluginKind::Driver,
        version: String::new(),
        api_version: String::new(),
        source: c.source,
        path: c.path.clone(),
        state: PluginState::Skipped,
        reason: reason.into(),
        pid: None,
        reattached: false,
    }
}

/// A launched, identified, version-checked plugin, not yet configured.
#[derive(Debug)]
pub struct Fingerprinted {
    /// What was launched.
    pub candidate: Candidate,
    /// The running process.
    pub process: PluginProcess,
    /// Its identity.
    pub info: PluginInfo,
    /// The negotiated plugin API version.
    pub api_version: semver::Version,
    /// JSON Schema of the plugin config.
    pub config_schema: serde_json::Value,
    /// JSON Schema of the task config.
    pub task_schema: serde_json::Value,
    /// What it supports.
    pub capabilities: Capabilities,
}

/// List candidates in `dir` (non-recursive, sorted by name). Files that must not be
/// run are returned as skipped rows instead.
pub fn scan_plugin_dir(dir: &Path) -> (Vec<Candidate>, Vec<PluginStatus>) {
    let mut candidates = Vec::new();
    let mut skipped = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(plugin_dir = %dir.display(), "plugin_dir does not exist; no external plugins");
            return (candidates, skipped);
        }
        Err(e) => {
            tracing::error!(plugin_dir = %dir.display(), "cannot read plugin_dir: {e}");
            return (candidates, skipped);
        }
    };
    let dir_insecure = match std::fs::metadata(dir) {
        Ok(m) => insecure_reason(&m, "plugin_dir"),
        Err(e) => Some(format!("cannot stat plugin_dir: {e}")),
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let label = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let candidate = Candidate {
            path: path.clone(),
            args: Vec::new(),
            source: PluginSource::External,
            label,
        };
        // metadata() follows symlinks: what matters is the file that would run.
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                skipped.push(skipped_status(&candidate, format!("cannot stat: {e}")));
                continue;
            }
        };
        if meta.is_dir() {
            tracing::debug!(path = %path.display(), "ignoring directory in plugin_dir");
            continue;
        }
        if !meta.is_file() {
            skipped.push(skipped_status(&candidate, "not a regular file"));
            continue;
        }
        if let Some(reason) = &dir_insecure {
            skipped.push(skipped_status(&candidate, reason.clone()));
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & 0o111 == 0 {
            skipped.push(skipped_status(
                &candidate,
                format!(
                    "not executable (mode {:04o}); chmod +x it to load it",
                    mode & 0o7777
                ),
            ));
            continue;
        }
        if let Some(reason) = insecure_reason(&meta, "file") {
            skipped.push(skipped_status(&candidate, reason));
            continue;
        }
        candidates.push(candidate);
    }
    (candidates, skipped)
}

/// Why a file or directory is not safe to run plugins from: writable by others, or
/// owned by someone other than us or root.
fn insecure_reason(meta: &std::fs::Metadata, what: &str) -> Option<String> {
    let mode = meta.permissions().mode();
    if mode & 0o002 != 0 {
        return Some(format!(
            "{what} is world-writable (mode {:04o}): anyone could replace the plugin; chmod o-w it",
            mode & 0o7777
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Some(format!(
            "{what} is owned by uid {}, not by root or the agent's uid {me}",
            meta.uid()
        ));
    }
    None
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

fn parse_schema(what: &str, text: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{what} is not JSON: {e}"))?;
    if !value.is_object() && !value.is_boolean() {
        return Err(format!("{what} is not a JSON Schema object"));
    }
    jsonschema::validator_for(&value)
        .map_err(|e| format!("{what} is not a valid JSON Schema: {e}"))?;
    Ok(value)
}

/// Explain an RPC failure during fingerprinting.
fn rpc_reason(rpc: &str, e: DriverError) -> String {
    match e {
        DriverError::Unimplemented(_) => format!(
            "does not serve drover.plugin.v1 ({rpc} is unimplemented): it answers the go-plugin \
             handshake but is a plugin for another application"
        ),
        other => format!("{rpc} failed: {other}"),
    }
}

/// Launch one candidate and fingerprint it. On failure the process has been shut
/// down (politely if it got far enough to be asked) and the error is the reason.
pub async fn fingerprint(
    candidate: &Candidate,
    timeout: Duration,
    socket_dir: &Path,
    accepted: &semver::VersionReq,
) -> Result<Fingerprinted, String> {
    let mut opts = LaunchOptions::new(candidate.label.clone(), candidate.path.clone());
    opts.args = candidate.args.clone();
    opts.handshake_timeout = timeout;
    opts.socket_dir = Some(socket_dir.to_owned());
    let process = PluginProcess::launch(opts)
        .await
        .map_err(|e| e.to_string())?;
    adopt(candidate, process, timeout, accepted).await
}

/// Fingerprint a running plugin process (just launched, or reattached): identity,
/// versions, schemas, capabilities, within `timeout`. On failure the process has been
/// shut down (killed if it stopped answering) and the error is the reason.
pub async fn adopt(
    candidate: &Candidate,
    process: PluginProcess,
    timeout: Duration,
    accepted: &semver::VersionReq,
) -> Result<Fingerprinted, String> {
    match tokio::time::timeout(timeout, identify(&process, accepted)).await {
        Ok(Ok((info, api_version, config_schema, task_schema, capabilities))) => {
            process.mirror_stdio();
            Ok(Fingerprinted {
                candidate: candidate.clone(),
                process,
                info,
                api_version,
                config_schema,
                task_schema,
                capabilities,
            })
        }
        Ok(Err(reason)) => {
            process.shutdown().await;
            Err(reason)
        }
        Err(_) => {
            process.kill().await;
            Err(format!(
                "plugin did not answer its identity RPCs within {timeout:?}"
            ))
        }
    }
}

type Identity = (
    PluginInfo,
    semver::Version,
    serde_json::Value,
    serde_json::Value,
    Capabilities,
);

async fn identify(
    process: &PluginProcess,
    accepted: &semver::VersionReq,
) -> Result<Identity, String> {
    let client = process.client();
    let identity = client
        .plugin_info()
        .await
        .map_err(|e| rpc_reason("PluginInfo", e))?;
    if identity.kind != drover_plugin_sdk::client::PluginKind::Driver {
        return Err(format!("plugin type {} is not a driver", identity.kind));
    }
    let (info, api_versions) = (identity.info(), identity.api_versions);
    let name_ok = !info.name.is_empty()
        && info.name.len() <= 64
        && info
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !name_ok {
        return Err(format!(
            "plugin name {:?} is not 1-64 characters of [a-z0-9_-]",
            info.name
        ));
    }
    parse_version(&info.version).map_err(|e| format!("plugin_version: {e}"))?;
    let api_version = negotiate_api_version(&api_versions, accepted)
        .map_err(|e| format!("incompatible plugin API version: {e}"))?;
    let config_schema = parse_schema(
        "config schema",
        &client
            .config_schema()
            .await
            .map_err(|e| rpc_reason("ConfigSchema", e))?,
    )?;
    let task_schema = parse_schema(
        "task config schema",
        &client
            .task_config_schema()
            .await
            .map_err(|e| rpc_reason("TaskConfigSchema", e))?,
    )?;
    let capabilities = client
        .capabilities()
        .await
        .map_err(|e| rpc_reason("Capabilities", e))?;
    Ok((info, api_version, config_schema, task_schema, capabilities))
}

/// Validate `value` against `schema`; the error lists each problem with its location.
///
/// Unknown top-level fields (a typo is the most common mistake) are reported by name
/// with the fields that are allowed; the validator's own message for them does not
/// always name the field.
pub fn validate(schema: &serde_json::Value, value: &serde_json::Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| format!("bad schema: {e}"))?;
    let mut problems = unknown_fields(schema, value);
    let reported_unknown = !problems.is_empty();
    for e in validator.iter_errors(value) {
        let at = e.instance_path().to_string();
        let about_extra_fields = matches!(
            e.kind(),
            jsonschema::error::ValidationErrorKind::AdditionalProperties { .. }
                | jsonschema::error::ValidationErrorKind::FalseSchema
        );
        if at.is_empty() && about_extra_fields && reported_unknown {
            continue;
        }
        problems.push(if at.is_empty() {
            e.to_string()
        } else {
            format!("{at}: {e}")
        });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn unknown_fields(schema: &serde_json::Value, value: &serde_json::Value) -> Vec<String> {
    let (Some(object), Some(false)) = (
        value.as_object(),
        schema
            .get("additionalProperties")
            .and_then(serde_json::Value::as_bool),
    ) else {
        return Vec::new();
    };
    let known: Vec<&str> = schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let allowed = if known.is_empty() {
        "it takes no fields".to_owned()
    } else {
        format!("expected one of: {}", known.join(", "))
    };
    object
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| format!("unknown field {k:?} ({allowed})"))
        .collect()
}

/// Is `name` allowed by the allow and deny lists?
pub fn allowed(name: &str, allow: &[String], deny: &[String]) -> Result<(), String> {
    if deny.iter().any(|d| d == name) {
        return Err(format!("{name:?} is in plugin_deny"));
    }
    if !allow.is_empty() && !allow.iter().any(|a| a == name) {
        return Err(format!("{name:?} is not in plugin_allow"));
    }
    Ok(())
}

/// Which of two fingerprinted plugins with the same name should serve.
/// External beats built-in unless `prefer_builtin`; otherwise the higher
/// `plugin_version` wins; a tie keeps the first.
pub fn prefer(a: &Fingerprinted, b: &Fingerprinted, prefer_builtin: bool) -> bool {
    if a.candidate.source != b.candidate.source {
        let a_builtin = a.candidate.source == PluginSource::Builtin;
        return a_builtin == prefer_builtin;
    }
    let va = parse_version(&a.info.version).ok();
    let vb = parse_version(&b.info.version).ok();
    va >= vb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_and_deny() {
        assert!(allowed("x", &[], &[]).is_ok());
        assert!(allowed("x", &[], &["x".into()]).is_err());
        assert!(allowed("x", &["y".into()], &[]).is_err());
        assert!(allowed("y", &["y".into()], &[]).is_ok());
    }

    #[test]
    fn validate_names_the_field() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
            "additionalProperties": false
        });
        let err = validate(&schema, &serde_json::json!({"comand": "x"})).unwrap_err();
        assert!(
            err.contains("unknown field \"comand\" (expected one of: command)"),
            "{err}"
        );
        assert!(err.contains("\"command\" is a required property"), "{err}");
        let empty = serde_json::json!({"type": "object", "additionalProperties": false});
        let err = validate(&empty, &serde_json::json!({"colour": "blue"})).unwrap_err();
        assert_eq!(err, "unknown field \"colour\" (it takes no fields)");
        let err = validate(&schema, &serde_json::json!({"command": 3})).unwrap_err();
        assert!(err.contains("/command"), "{err}");
        assert!(validate(&schema, &serde_json::json!({"command": "x"})).is_ok());
    }

    #[test]
    fn scan_refuses_unsafe_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("noexec"), "#!/bin/sh\n").unwrap();
        std::fs::write(p("worldw"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("worldw"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(p("good"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("good"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(p("subdir")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1);
        assert_eq!(cands[0].label, "good");
        let reason = |n: &str| skipped.iter().find(|s| s.name == n).unwrap().reason.clone();
        assert!(reason("noexec").contains("not executable"));
        assert!(reason("worldw").contains("world-writable"));

        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert!(cands.is_empty());
        assert!(reason_of(&skipped, "good").contains("plugin_dir is world-writable"));
    }

    fn reason_of(rows: &[PluginStatus], name: &str) -> String {
        rows.iter().find(|s| s.name == name).unwrap().reason.clone()
    }
}
