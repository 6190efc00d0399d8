//! Plugin configuration (none) and the task configuration, plus how a task's
//! configuration and spec turn into a concrete command line, environment and directory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use drover_plugin_sdk::{DriverError, TaskSpec};
use schemars::JsonSchema;
use serde::Deserialize;

/// `PATH` given to tasks whose environment does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// raw_exec's plugin configuration (`[plugin.raw_exec] config = {...}` in the agent
/// config). Unknown fields are refused.
///
/// raw_exec runs tasks as the agent's own user (root, usually) with no isolation, so
/// it is **off unless `enabled = true`**, as Nomad's (`plugin "raw_exec" { config {
/// enabled = true } }`); a dev agent (`--dev`) turns it on, as Nomad's `-dev` does.
///
/// ```
/// let c: drover_driver_rawexec::PluginConfig = serde_json::from_str("{}").unwrap();
/// assert!(!c.enabled && !c.no_cgroups);
/// let c: drover_driver_rawexec::PluginConfig =
///     serde_json::from_str(r#"{"enabled":true}"#).unwrap();
/// assert!(c.enabled);
/// let c: drover_driver_rawexec::PluginConfig =
///     serde_json::from_str(r#"{"no_cgroups":true}"#).unwrap();
/// assert!(c.no_cgroups);
/// assert!(serde_json::from_str::<drover_driver_rawexec::PluginConfig>(r#"{"cgroups":0}"#).is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Run tasks at all. Off by default: every raw_exec task runs as the agent's user
    /// (root) with the host's whole view, so a job submitter who can use raw_exec owns
    /// the node. Disabled, the driver reports itself undetected (jobs needing it are
    /// not placed on the node, with the reason) and refuses to start tasks.
    #[serde(default)]
    pub enabled: bool,
    /// Leave every task in its process group only, without a cgroup of its own, even
    /// where the host has cgroups (like Nomad's `raw_exec` `no_cgroups`). A child that
    /// calls `setsid` then escapes stop and destroy, and a task whose executor died is
    /// killed only while its main process lives: see docs/architecture.md, "One copy
    /// of a task, always".
    #[serde(default)]
    pub no_cgroups: bool,
}

/// Configuration of one rawexec task.
///
/// ```
/// let c: drover_driver_rawexec::TaskConfig =
///     serde_json::from_str(r#"{"command":"/bin/echo","args":["hi"]}"#).unwrap();
/// assert_eq!(c.args, ["hi"]);
/// let err = serde_json::from_str::<drover_driver_rawexec::TaskConfig>(r#"{"comand":"/bin/echo"}"#)
///     .unwrap_err();
/// assert!(err.to_string().contains("comand"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// The program to run: an absolute path, or a name looked up in the task's `PATH`.
    pub command: String,
    /// Arguments passed to the program.
    #[serde(default)]
    pub args: Vec<String>,
    /// Working directory. A relative path is taken relative to the task directory.
    /// Default: the task directory, or `/` when the task has none.
    #[serde(default)]
    pub cwd: Option<String>,
}

impl TaskConfig {
    /// Checks serde cannot express.
    pub(crate) fn validate(&self) -> Result<(), DriverError> {
        if self.command.trim().is_empty() {
            return Err(DriverError::InvalidConfig(
                "command must not be empty".into(),
            ));
        }
        if self.cwd.as_deref().is_some_and(str::is_empty) {
            return Err(DriverError::InvalidConfig(
                "cwd must not be empty (leave it out for the task directory)".into(),
            ));
        }
        Ok(())
    }
}

/// Where and with what environment a task's processes run: the task itself (through
/// its executor) and commands of `ExecTask`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launch {
    /// The whole environment (the plugin's own is not inherited).
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: PathBuf,
}

impl Launch {
    /// The environment is the spec's, on top of a default `PATH` (so that commands
    /// can be found) that the spec may override. The directory is `cwd` from the
    /// config, else the task directory, else `/`.
    pub(crate) fn new(spec: &TaskSpec, config: Option<&TaskConfig>) -> Self {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let task_dir = (!spec.task_dir.as_os_str().is_empty()).then_some(spec.task_dir.as_path());
        let cwd = match (config.and_then(|c| c.cwd.as_deref()), task_dir) {
            (Some(cwd), Some(dir)) => dir.join(cwd),
            (Some(cwd), None) => PathBuf::from(cwd),
            (None, Some(dir)) => dir.to_owned(),
            (None, None) => PathBuf::from("/"),
        };
        Launch { env, cwd }
    }

    /// A command for `program` with this environment and directory, stdin closed.
    pub(crate) fn command(&self, program: &str, args: &[String]) -> tokio::process::Command {
        let mut cmd = self.command_in_env(program, args);
        cmd.stdin(std::process::Stdio::null())
            // Its own process group, so that signals reach everything it forks and a
            // Ctrl-C at a terminal reaches none of it.
            .process_group(0)
            // Tasks outlive the plugin: dropping the handle must never kill one.
            .kill_on_drop(false);
        cmd
    }

    /// `program` with `args` in the task's environment and working directory, and
    /// nothing else set (an interactive exec on a terminal makes its own session).
    pub(crate) fn command_in_env(&self, program: &str, args: &[String]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(&self.env)
            .current_dir(&self.cwd);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(json: &str) -> Result<TaskConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn unknown_and_missing_fields_are_named() {
        let err = parse(r#"{"comand":"/bin/echo"}"#).unwrap_err().to_string();
        assert!(err.contains("comand"), "{err}");
        let err = parse(r#"{"args":[]}"#).unwrap_err().to_string();
        assert!(err.contains("command"), "{err}");
        let ok = parse(r#"{"command":"sleep"}"#).unwrap();
        assert!(ok.args.is_empty() && ok.cwd.is_none());
        assert!(ok.validate().is_ok());
        assert!(parse(r#"{"command":" "}"#).unwrap().validate().is_err());
    }

    #[test]
    fn schema_forbids_extra_fields_and_requires_command() {
        let schema = serde_json::to_value(schemars::schema_for!(TaskConfig)).unwrap();
        assert_eq!(schema["additionalProperties"], false, "{schema:#}");
        assert_eq!(
            schema["required"],
            serde_json::json!(["command"]),
            "{schema:#}"
        );
    }

    #[test]
    fn env_has_a_default_path_the_spec_can_override() {
        let mut spec = TaskSpec::default();
        spec.env.insert("A".into(), "1".into());
        let l = Launch::new(&spec, None);
        assert_eq!(l.env["PATH"], DEFAULT_PATH);
        assert_eq!(l.env["A"], "1");
        spec.env.insert("PATH".into(), "/opt/bin".into());
        assert_eq!(Launch::new(&spec, None).env["PATH"], "/opt/bin");
    }

    #[test]
    fn cwd_precedence() {
        let mut spec = TaskSpec::default();
        let cfg = |cwd: Option<&str>| TaskConfig {
            command: "x".into(),
            args: vec![],
            cwd: cwd.map(Into::into),
        };
        assert_eq!(Launch::new(&spec, None).cwd, Path::new("/"));
        assert_eq!(
            Launch::new(&spec, Some(&cfg(Some("/srv")))).cwd,
            Path::new("/srv")
        );
        spec.task_dir = "/alloc/t1".into();
        assert_eq!(
            Launch::new(&spec, Some(&cfg(None))).cwd,
            Path::new("/alloc/t1")
        );
        assert_eq!(
            Launch::new(&spec, Some(&cfg(Some("local")))).cwd,
            Path::new("/alloc/t1/local")
        );
        assert_eq!(
            Launch::new(&spec, Some(&cfg(Some("/srv")))).cwd,
            Path::new("/srv")
        );
    }
}
