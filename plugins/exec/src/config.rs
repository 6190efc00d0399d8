//! The exec task configuration.

use std::collections::BTreeMap;

use drover_isolation::{IsolationConfig, NamespaceMode, NetworkMode, RlimitConfig};
use schemars::JsonSchema;
use serde::Deserialize;

/// Configuration of one exec task.
///
/// ```
/// let c: drover_driver_exec::TaskConfig = serde_json::from_str(
///     r#"{"command":"/bin/sh","args":["-c","id"],"user":"nobody","cap_drop":["chown"]}"#).unwrap();
/// assert_eq!(c.user.as_deref(), Some("nobody"));
/// let err = serde_json::from_str::<drover_driver_exec::TaskConfig>(r#"{"command":"x","cap_ad":[]}"#)
///     .unwrap_err();
/// assert!(err.to_string().contains("cap_ad"));
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// The program, inside the task's root: an absolute path, a path relative to
    /// `cwd`, or a name looked up in the task's `PATH`.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// User to run as: a name from the host's `/etc/passwd`, or `uid` / `uid:gid`.
    /// Default `nobody`; root only where the plugin's `user_denylist` allows it.
    #[serde(default)]
    pub user: Option<String>,
    /// Capabilities to add to the default set (each must be in the plugin's
    /// `allow_caps`). A task running as a non-root user holds exactly these.
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// Capabilities to remove (`all` removes every one).
    #[serde(default)]
    pub cap_drop: Vec<String>,
    /// `host` (default) or `none`.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// CPU time limit in cores (`0.5`: half a core), enforced by CFS quota.
    #[serde(default)]
    pub cpu_limit: Option<f64>,
    /// Most processes and threads the task may have at once (default 1024).
    #[serde(default)]
    pub pids_limit: Option<u64>,
    /// Resource limits by name (`nofile`, `nproc`, `core`, …).
    #[serde(default)]
    pub rlimits: BTreeMap<String, RlimitConfig>,
    /// Hostname inside the task (default: the host's).
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
    /// The isolation part.
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

    fn iso(json: &str) -> IsolationConfig {
        let c: TaskConfig = serde_json::from_str(json).unwrap();
        c.isolation()
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (r#"{"command":"x","cpu_limit":0}"#, "cpu_limit"),
            (r#"{"command":"x","pids_limit":0}"#, "pids_limit"),
            (r#"{"command":"x","hostname":"a b"}"#, "hostname"),
            (r#"{"command":"x","cwd":"local"}"#, "cwd"),
            (
                r#"{"command":"x","rlimits":{"nofiles":{"soft":1}}}"#,
                "nofiles",
            ),
            (
                r#"{"command":"x","rlimits":{"nofile":{"soft":9,"hard":1}}}"#,
                "hard",
            ),
        ];
        for (json, word) in cases {
            let err = iso(json).validate().unwrap_err().to_string();
            assert!(err.contains(word), "{json}: {err}");
        }
        let ok = iso(r#"{"command":"x","rlimits":{"NOFILE":{"soft":64}},"network_mode":"none"}"#);
        ok.validate().unwrap();
        assert_eq!(ok.rlimits().unwrap()[0].hard, Some(64));
        assert_eq!(ok.network_mode, NetworkMode::None);
    }

    /// Every key of Nomad's exec task config (`command`, `args`, `pid_mode`,
    /// `ipc_mode`) decodes; `host` namespaces are refused with the reason.
    #[test]
    fn nomads_exec_keys_decode_and_host_namespaces_are_refused() {
        let c: TaskConfig = serde_json::from_str(
            r#"{"command":"/bin/sh","args":["-c","id"],"pid_mode":"private","ipc_mode":"private"}"#,
        )
        .unwrap();
        assert_eq!((c.command.as_str(), c.args.len()), ("/bin/sh", 2));
        c.isolation().validate().unwrap();
        for (key, word) in [("pid_mode", "pid namespace"), ("ipc_mode", "ipc namespace")] {
            let json = format!(r#"{{"command":"x","{key}":"host"}}"#);
            let err = iso(&json).validate().unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(word), "{err}");
        }
        let err = serde_json::from_str::<TaskConfig>(r#"{"command":"x","pid_mode":"shared"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shared"), "{err}");
    }

    #[test]
    fn schema_forbids_extra_fields() {
        let schema = serde_json::to_value(schemars::schema_for!(TaskConfig)).unwrap();
        assert_eq!(schema["additionalProperties"], false, "{schema:#}");
        assert_eq!(schema["required"], serde_json::json!(["command"]));
    }
}
