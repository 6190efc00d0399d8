//! Finding, launching and fingerprinting plugins.
//!
//! Every candidate (each executable in `plugin_dir`, plus the built-in drivers, which
//! are this same binary re-executed) is launched once, concurrently, handshaken,
//! identified and version-negotiated. The process that was fingerprinted is the one
//! that then serves. A driver library (`NAME.so` in `plugin_dir`, allowed with
//! `[plugin.NAME] in_process = true`) is loaded into the agent instead of launched
//! ([`super::library`]) and then identified the same way. Whether a file may run at
//! all is [`super::trust`]'s to say. Anything wrong with a candidate becomes a
//! `skipped` status row with a reason for people; nothing here can take the agent
//! down.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use drover_api::{PluginSource, PluginStatus};
use drover_plugin_sdk::client::{HostEnv, LaunchOptions, PluginProcess};
use drover_plugin_sdk::version::{negotiate_api_version, parse_version};
use drover_plugin_sdk::{Capabilities, DriverError, PluginInfo};

use super::candidate::{Candidate, CandidateKind, skipped_status};
use super::instance::PluginInstance;
use super::library;
use super::trust::{Binary, open_checked};

/// A launched, identified, version-checked plugin, not yet configured.
#[derive(Debug)]
pub struct Fingerprinted {
    /// What was launched.
    pub candidate: Candidate,
    /// The running plugin (a process, or a library loaded into the agent).
    pub process: PluginInstance,
    /// Its identity.
    pub info: PluginInfo,
    /// A task driver or a device plugin.
    pub kind: drover_api::PluginKind,
    /// The negotiated plugin API version.
    pub api_version: semver::Version,
    /// JSON Schema of the plugin config.
    pub config_schema: Schema,
    /// JSON Schema of the task config.
    pub task_schema: Schema,
    /// What it supports.
    pub capabilities: Capabilities,
    /// sha256 of the binary the process runs (checked before it was launched, or
    /// recorded when it was and found unchanged at reattach).
    pub sha256: String,
}

/// List candidates in `dir` (non-recursive, sorted by name): binaries, and driver
/// libraries (`NAME.so`, labelled `NAME`). Files that must not be run or loaded are
/// returned as skipped rows instead. The checks are those of [`open_checked`], which
/// runs again on every launch; whether a library may be loaded at all is the
/// [`super::trust::Policy`]'s to say, before each load.
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
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let candidate = Candidate::external(path.clone());
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            tracing::debug!(path = %path.display(), "ignoring directory in plugin_dir");
            continue;
        }
        match open_checked(&candidate) {
            Ok(_) => candidates.push(candidate),
            Err(reason) => skipped.push(skipped_status(&candidate, reason)),
        }
    }
    (candidates, skipped)
}

fn parse_schema(what: &str, text: &str) -> Result<Schema, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{what} is not JSON: {e}"))?;
    if !value.is_object() && !value.is_boolean() {
        return Err(format!("{what} is not a JSON Schema object"));
    }
    Schema::new(value).map_err(|e| format!("{what} is not a valid JSON Schema: {e}"))
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

/// The agent's variables every plugin gets, whatever the configuration: the search
/// path, and the plugin SDK's log filter.
pub const PLUGIN_BASE_ENV: &[&str] = &["PATH", drover_plugin_sdk::logging::ENV_PLUGIN_LOG];

/// How a plugin process is launched: its environment and its transport.
///
/// The environment is like go-plugin's `SkipHostEnv`: none of the agent's own
/// environment but [`PLUGIN_BASE_ENV`] and what the operator listed
/// (`plugin_pass_env`, `[plugin.NAME] pass_env`), plus `[plugin.NAME] env`. The
/// handshake's variables are added by the launcher. A driver library loaded into the
/// agent shares the agent's environment: it is the agent.
///
/// ```
/// use drover_host::plugins::loader::LaunchSettings;
/// let launch = LaunchSettings::new(["DOCKER_HOST".to_string()].iter(), [].into_iter())
///     .with_auto_mtls(true);
/// assert!(format!("{launch:?}").contains("DOCKER_HOST"));
/// ```
#[derive(Clone)]
pub struct LaunchSettings {
    host_env: HostEnv,
    set: Vec<(OsString, OsString)>,
    auto_mtls: bool,
    nomad: Option<drover_plugin_sdk::client::NomadHostOptions>,
}

impl LaunchSettings {
    /// Pass the agent's `PLUGIN_BASE_ENV` and `pass` variables, then set `set`; plain
    /// (no AutoMTLS).
    pub fn new<'a>(
        pass: impl Iterator<Item = &'a String>,
        set: impl Iterator<Item = (&'a String, &'a String)>,
    ) -> LaunchSettings {
        let mut names: Vec<OsString> = PLUGIN_BASE_ENV.iter().map(OsString::from).collect();
        for name in pass {
            let name = OsString::from(name);
            if !names.contains(&name) {
                names.push(name);
            }
        }
        LaunchSettings {
            host_env: HostEnv::Only(names),
            set: set
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect(),
            auto_mtls: false,
            nomad: None,
        }
    }

    /// Also load plugins that speak Nomad's driver protocol, with these host settings
    /// (`None`: Drover plugins only).
    pub fn with_nomad(
        mut self,
        nomad: Option<drover_plugin_sdk::client::NomadHostOptions>,
    ) -> LaunchSettings {
        self.nomad = nomad;
        self
    }

    /// With go-plugin's automatic mutual TLS on or off.
    pub fn with_auto_mtls(mut self, on: bool) -> LaunchSettings {
        self.auto_mtls = on;
        self
    }
}

/// [`PLUGIN_BASE_ENV`] only, plain.
impl Default for LaunchSettings {
    fn default() -> Self {
        LaunchSettings::new(std::iter::empty(), std::iter::empty())
    }
}

/// Names only: an operator's `env` values may be credentials.
impl std::fmt::Debug for LaunchSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchSettings")
            .field("host_env", &self.host_env)
            .field("set", &self.set.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("auto_mtls", &self.auto_mtls)
            .finish()
    }
}

/// Launch one candidate from its checked `binary` (the descriptor is what runs), or
/// load it into the agent when it is a driver library (a sealed copy of the bytes
/// behind the descriptor is what is loaded, see [`library`]), and fingerprint it. On
/// failure the plugin has been shut down (politely if it got far enough to be asked)
/// and the error is the reason.
///
/// A library must serve under its label (`rawexec.so` serves `rawexec`): its
/// `[plugin.<label>] in_process = true` is the operator's consent for exactly that
/// plugin.
pub async fn fingerprint(
    candidate: &Candidate,
    binary: &Binary,
    timeout: Duration,
    socket_dir: &Path,
    accepted: &semver::VersionReq,
    launch: &LaunchSettings,
) -> Result<Fingerprinted, String> {
    let launched = std::time::Instant::now();
    let instance: PluginInstance = match candidate.kind() {
        CandidateKind::Binary => {
            let mut opts = LaunchOptions::new(candidate.label.clone(), candidate.path.clone());
            opts.args = candidate.args.clone();
            opts.host_env = launch.host_env.clone();
            opts.env = launch.set.clone();
            opts.auto_mtls = launch.auto_mtls;
            // Nomad's protocol is offered to built-ins too: the built-in drivers pick
            // Drover's (their cookie comes first), the built-in device plugin speaks
            // Nomad's device protocol, as every SDK device plugin does.
            opts.nomad = launch.nomad.clone();
            opts.handshake_timeout = timeout;
            opts.socket_dir = Some(socket_dir.to_owned());
            opts.executable = Some(binary.fd.clone());
            PluginProcess::launch(opts)
                .await
                .map_err(|e| e.to_string())?
                .into()
        }
        CandidateKind::Library => library::load(candidate, binary, timeout).await?.into(),
    };
    crate::metrics::metrics()
        .plugin_handshake
        .get_or_create(&crate::metrics::PluginLabel {
            plugin: candidate.label.as_str().into(),
        })
        .observe(launched.elapsed().as_secs_f64());
    let fp = adopt(
        candidate,
        instance,
        binary.sha256.clone(),
        timeout,
        accepted,
    )
    .await?;
    if candidate.kind() == CandidateKind::Library && fp.info.name != candidate.label {
        fp.process.shutdown().await;
        return Err(format!(
            "{} calls itself {name:?}: a driver library serves only the plugin it is named \
             after, so that [plugin.{}] in_process = true allows exactly that plugin; to \
             load it, name it {name}.so and allow it with [plugin.{name}] in_process = true",
            candidate.path.display(),
            candidate.label,
            name = fp.info.name,
        ));
    }
    Ok(fp)
}

/// Fingerprint a running plugin process (just launched, or reattached) whose binary
/// hashes to `sha256`: identity, versions, schemas, capabilities, within `timeout`. On
/// failure the process has been shut down (killed if it stopped answering) and the
/// error is the reason.
pub(super) async fn adopt(
    candidate: &Candidate,
    process: PluginInstance,
    sha256: String,
    timeout: Duration,
    accepted: &semver::VersionReq,
) -> Result<Fingerprinted, String> {
    match tokio::time::timeout(timeout, identify(&process, accepted)).await {
        Ok(Ok((info, kind, api_version, config_schema, task_schema, capabilities))) => {
            process.mirror_stdio();
            Ok(Fingerprinted {
                candidate: candidate.clone(),
                process,
                info,
                kind,
                api_version,
                config_schema,
                task_schema,
                capabilities,
                sha256,
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
    drover_api::PluginKind,
    semver::Version,
    Schema,
    Schema,
    Capabilities,
);

async fn identify(
    process: &PluginInstance,
    accepted: &semver::VersionReq,
) -> Result<Identity, String> {
    let client = process.client();
    let identity = client
        .plugin_info()
        .await
        .map_err(|e| rpc_reason("PluginInfo", e))?;
    let kind = match identity.kind {
        drover_plugin_sdk::client::PluginKind::Driver => drover_api::PluginKind::Driver,
        // Nomad's device plugins (Drover's protocol has no device service yet).
        drover_plugin_sdk::client::PluginKind::Device
            if identity.protocol == drover_plugin_sdk::client::PluginProtocol::Nomad =>
        {
            drover_api::PluginKind::Device
        }
        other => {
            return Err(format!(
                "plugin type {other} is neither a driver nor a Nomad device plugin"
            ));
        }
    };
    let (info, api_versions) = (identity.info(), identity.api_versions);
    // A Nomad driver speaks Nomad's driver API, which the bridge translates.
    let nomad_api;
    let accepted = match identity.protocol {
        drover_plugin_sdk::client::PluginProtocol::Nomad => {
            nomad_api = semver::VersionReq::parse(drover_plugin_sdk::client::NOMAD_DRIVER_API_REQ)
                .map_err(|e| format!("Nomad driver API requirement: {e}"))?;
            &nomad_api
        }
        _ => accepted,
    };
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
    if kind == drover_api::PluginKind::Device {
        // A device plugin has no task config and no driver capabilities.
        return Ok((
            info,
            kind,
            api_version,
            config_schema,
            Schema::any(),
            Capabilities::default(),
        ));
    }
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
    Ok((
        info,
        kind,
        api_version,
        config_schema,
        task_schema,
        capabilities,
    ))
}

/// A plugin's JSON Schema (of its config, or of a task's), compiled once, when the
/// plugin's fingerprint is taken: compiling costs more than validating a task config,
/// and every task start validates one. Cloned cheaply (both parts are shared).
#[derive(Clone)]
pub struct Schema {
    json: Arc<serde_json::Value>,
    validator: Arc<jsonschema::Validator>,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Schema").field(&self.json).finish()
    }
}

impl Schema {
    /// Compile `json`; the error says why it is no JSON Schema.
    pub fn new(json: serde_json::Value) -> Result<Schema, String> {
        let validator = jsonschema::validator_for(&json).map_err(|e| e.to_string())?;
        Ok(Schema {
            json: Arc::new(json),
            validator: Arc::new(validator),
        })
    }

    /// The schema that takes anything (`{}`): a device plugin's task config.
    pub fn any() -> Schema {
        static ANY: LazyLock<Schema> = LazyLock::new(|| {
            Schema::new(serde_json::json!({})).unwrap_or_else(|e| unreachable!("{{}}: {e}"))
        });
        ANY.clone()
    }

    /// The schema as the plugin gave it.
    pub fn json(&self) -> &serde_json::Value {
        &self.json
    }

    /// Validate `value`; the error lists each problem with its location.
    ///
    /// Unknown top-level fields (a typo is the most common mistake) are reported by
    /// name with the fields that are allowed; the validator's own message for them
    /// does not always name the field.
    pub fn validate(&self, value: &serde_json::Value) -> Result<(), String> {
        let mut problems = unknown_fields(&self.json, value);
        let reported_unknown = !problems.is_empty();
        for e in self.validator.iter_errors(value) {
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

/// Which of two fingerprinted plugins with the same name should serve.
/// External beats built-in unless `prefer_builtin`; otherwise the higher
/// `plugin_version` wins; a tie keeps the first.
pub(super) fn prefer(a: &Fingerprinted, b: &Fingerprinted, prefer_builtin: bool) -> bool {
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
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn validate_names_the_field() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
            "additionalProperties": false
        });
        let schema = Schema::new(schema).unwrap();
        let err = schema
            .validate(&serde_json::json!({"comand": "x"}))
            .unwrap_err();
        assert!(
            err.contains("unknown field \"comand\" (expected one of: command)"),
            "{err}"
        );
        assert!(err.contains("\"command\" is a required property"), "{err}");
        let empty = serde_json::json!({"type": "object", "additionalProperties": false});
        let empty = Schema::new(empty).unwrap();
        let err = empty
            .validate(&serde_json::json!({"colour": "blue"}))
            .unwrap_err();
        assert_eq!(err, "unknown field \"colour\" (it takes no fields)");
        let err = schema
            .validate(&serde_json::json!({"command": 3}))
            .unwrap_err();
        assert!(err.contains("/command"), "{err}");
        assert!(
            schema
                .validate(&serde_json::json!({"command": "x"}))
                .is_ok()
        );
    }

    #[test]
    fn scan_refuses_unsafe_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("noexec"), "#!/bin/sh\n").unwrap();
        std::fs::write(p("worldw"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("worldw"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(p("groupw"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("groupw"), std::fs::Permissions::from_mode(0o775)).unwrap();
        std::fs::write(p("good"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("good"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(p("subdir")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1);
        assert_eq!(cands[0].label, "good");
        let reason = |n: &str| skipped.iter().find(|s| s.name == n).unwrap().reason.clone();
        assert!(reason("noexec").contains("not executable"));
        assert!(reason("worldw").contains("world-writable"));
        assert!(
            reason("groupw").contains("group-writable"),
            "{}",
            reason("groupw")
        );

        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert!(cands.is_empty());
        let r = reason_of(&skipped, "good");
        let shown = dir.path().display();
        assert!(
            r.contains(&format!("plugin_dir {shown} is world-writable"))
                && r.contains(&format!("chmod go-w {shown}")),
            "{r}"
        );
    }

    #[test]
    fn scan_skips_a_fifo_without_opening_it_for_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o755),
            0,
        )
        .unwrap();
        // Opening it for reading would block this thread until a writer came.
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert!(cands.is_empty());
        let r = reason_of(&skipped, "fifo");
        assert!(
            r.contains(&format!("{} is a FIFO, not a regular file", fifo.display())),
            "{r}"
        );
    }

    #[test]
    fn scan_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real");
        std::fs::write(&target, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1);
        assert!(
            reason_of(&skipped, "link").contains("symlink"),
            "{skipped:#?}"
        );
    }

    #[test]
    fn scan_takes_libraries_without_exec_bits_and_checks_them_like_binaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let write = |n: &str, mode: u32| {
            std::fs::write(p(n), b"\x7fELF").unwrap();
            std::fs::set_permissions(p(n), std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("librawexec.so", 0o644);
        write("worldw.so", 0o646);
        write("groupw.so", 0o664);
        std::os::unix::fs::symlink(p("librawexec.so"), p("link.so")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1, "{cands:#?} {skipped:#?}");
        assert_eq!(cands[0].label, "raw_exec");
        assert_eq!(cands[0].kind(), CandidateKind::Library);
        assert!(reason_of(&skipped, "worldw").contains("world-writable"));
        assert!(reason_of(&skipped, "groupw").contains("group-writable"));
        let r = reason_of(&skipped, "link");
        assert!(
            r.contains("link.so is a symlink, not a regular file"),
            "{r}"
        );
    }

    fn reason_of(rows: &[PluginStatus], name: &str) -> String {
        rows.iter().find(|s| s.name == name).unwrap().reason.clone()
    }
}
