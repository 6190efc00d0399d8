//! The java task configuration: what to run, plus the exec driver's isolation
//! settings (the same fields, with the same meaning).

use std::collections::BTreeMap;

use drover_isolation::{IsolationConfig, NamespaceMode, NetworkMode, RlimitConfig};
use drover_plugin_sdk::DriverError;
use schemars::JsonSchema;
use serde::Deserialize;

/// Configuration of one java task: `jar_path`, or `class` (with `class_path`).
///
/// ```
/// let c: drover_driver_java::TaskConfig = serde_json::from_str(
///     r#"{"jar_path":"local/app.jar","jvm_options":["-Xmx64m"],"args":["serve"]}"#).unwrap();
/// assert!(c.validate().is_ok());
/// let both: drover_driver_java::TaskConfig = serde_json::from_str(
///     r#"{"jar_path":"local/app.jar","class":"app.Main"}"#).unwrap();
/// assert!(both.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// The jar to run (`java -jar`), relative to the task directory (for example
    /// `local/app.jar`) or an absolute path inside the task's root. Checked to exist
    /// before anything starts.
    #[serde(default)]
    pub jar_path: Option<String>,
    /// The main class to run instead of a jar.
    #[serde(default)]
    pub class: Option<String>,
    /// Class path for `class`, `:`-separated, entries relative to the task directory.
    #[serde(default)]
    pub class_path: Option<String>,
    /// Options for the JVM, before the jar or class (`-Xmx256m`, `-Dkey=value`).
    #[serde(default)]
    pub jvm_options: Vec<String>,
    /// Arguments for the program.
    #[serde(default)]
    pub args: Vec<String>,
    /// User to run as (default `nobody`; root only where the plugin's
    /// `user_denylist` allows it); see the exec driver.
    #[serde(default)]
    pub user: Option<String>,
    /// Capabilities to add (within the plugin's `allow_caps`).
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// Capabilities to remove.
    #[serde(default)]
    pub cap_drop: Vec<String>,
    /// `host` (default) or `none`.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// CPU time limit in cores.
    #[serde(default)]
    pub cpu_limit: Option<f64>,
    /// Most processes and threads at once (a JVM has dozens of threads; default 1024).
    #[serde(default)]
    pub pids_limit: Option<u64>,
    /// Resource limits by name.
    #[serde(default)]
    pub rlimits: BTreeMap<String, RlimitConfig>,
    /// Hostname inside the task.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Working directory inside the task's root (default `/`, the task directory).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Nomad's `pid_mode`: `private` (default, what every task gets); `host` is refused.
    #[serde(default)]
    pub pid_mode: NamespaceMode,
    /// Nomad's `ipc_mode`: `private` (default, what every task gets); `host` is refused.
    #[serde(default)]
    pub ipc_mode: NamespaceMode,
}

impl TaskConfig {
    /// Exactly one of `jar_path` and `class`; `class_path` only with `class`.
    pub fn validate(&self) -> Result<(), DriverError> {
        let bad = |m: &str| Err(DriverError::InvalidConfig(m.into()));
        match (&self.jar_path, &self.class) {
            (None, None) => bad("java needs jar_path or class"),
            (Some(_), Some(_)) => bad("give jar_path or class, not both"),
            (Some(j), None) if j.trim().is_empty() => bad("jar_path must not be empty"),
            (None, Some(c)) if c.trim().is_empty() => bad("class must not be empty"),
            (Some(_), None) if self.class_path.is_some() => {
                bad("class_path goes with class; a jar names its class path in its manifest")
            }
            _ => Ok(()),
        }
    }

    /// The isolation part, as the exec driver reads it.
    pub fn isolation(&self) -> IsolationConfig {
        IsolationConfig {
            user: self.user.clone(),
            cap_add: self.cap_add.clone(),
            cap_drop: self.cap_drop.clone(),
            network_mode: self.network_mode,
            cpu_limit: self.cpu_limit,
            pids_limit: self.pids_limit,
            rlimits: self.rlimits.clone(),
            hostname: self.hostname.clone(),
            cwd: self.cwd.clone(),
            pid_mode: self.pid_mode,
            ipc_mode: self.ipc_mode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> TaskConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn jar_or_class() {
        assert!(parse(r#"{}"#).validate().is_err());
        assert!(
            parse(r#"{"class":"a.B","class_path":"local/lib"}"#)
                .validate()
                .is_ok()
        );
        let err = parse(r#"{"jar_path":"a.jar","class_path":"x"}"#)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("class_path"), "{err}");
        assert!(serde_json::from_str::<TaskConfig>(r#"{"jar":"a.jar"}"#).is_err());
    }

    /// Every key of Nomad's java task config decodes with Nomad's meaning; `host`
    /// namespaces are refused with the reason.
    #[test]
    fn nomads_java_keys_decode() {
        let c = parse(
            r#"{"class":"app.Main","class_path":"local/lib:local/app.jar","jvm_options":["-Xmx64m"],
                "args":["serve"],"pid_mode":"private","ipc_mode":"private"}"#,
        );
        c.validate().unwrap();
        c.isolation().validate().unwrap();
        assert_eq!(c.class.as_deref(), Some("app.Main"));
        assert_eq!(c.jvm_options, ["-Xmx64m"]);
        assert_eq!(c.args, ["serve"]);
        let jar = parse(r#"{"jar_path":"local/app.jar"}"#);
        jar.validate().unwrap();
        let err = parse(r#"{"jar_path":"a.jar","pid_mode":"host"}"#)
            .isolation()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("pid_mode = \"host\" is refused"), "{err}");
    }

    #[test]
    fn isolation_fields_carry_over() {
        let c = parse(r#"{"class":"A","user":"root","cap_drop":["all"],"pids_limit":64}"#);
        let iso = c.isolation();
        assert_eq!(iso.user.as_deref(), Some("root"));
        assert_eq!(iso.cap_drop, ["all"]);
        assert_eq!(iso.pids_limit, Some(64));
    }
}
