//! Plugin configuration and the isolation settings of a task ([`IsolationConfig`]),
//! shared by every driver built on the [`IsolatedDriver`](crate::IsolatedDriver)
//! engine (exec, java).

use std::collections::BTreeMap;

use drover_executor::{Rlimit, RlimitResource};
use drover_plugin_sdk::DriverError;
use schemars::JsonSchema;
use serde::Deserialize;

/// Plugin configuration (`[plugin.exec] config = {...}` in the agent config). Every
/// field is optional.
///
/// ```
/// let c: drover_isolation::PluginConfig = serde_json::from_str(
///     r#"{"allow_caps":["chown","net_admin"],"cgroup_parent":"/drover",
///         "seccomp":"default","seccomp_allow":["ptrace"],"user_denylist":["root"]}"#).unwrap();
/// assert_eq!(c.allow_caps.unwrap().len(), 2);
/// assert_eq!(c.seccomp_allow, ["ptrace"]);
/// assert!(serde_json::from_str::<drover_isolation::PluginConfig>(r#"{"allow_cap":[]}"#).is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Capabilities a task may have: its `cap_add` must stay within this list, and
    /// the default set is cut down to it. Names like `net_bind_service` (or
    /// `CAP_NET_BIND_SERVICE`), or `all`. Default: `audit_write, chown, dac_override,
    /// fowner, fsetid, kill, mknod, net_bind_service, setfcap, setgid, setpcap, setuid,
    /// sys_chroot`.
    #[serde(default)]
    pub allow_caps: Option<Vec<String>>,
    /// Host paths bind-mounted read-only into every task's root, host path → path in
    /// the task's root. Replaces the default list (`/bin`, `/lib`, `/lib64`, `/usr`,
    /// `/sbin`, `/etc/ld.so.cache`, `/etc/passwd`, `/etc/group`, `/etc/hosts`,
    /// `/etc/resolv.conf`, `/etc/ssl`, …), whose missing entries are skipped; an entry
    /// given here must exist.
    #[serde(default)]
    pub chroot_env: Option<BTreeMap<String, String>>,
    /// Where task cgroups go, in every controller hierarchy: a task's cgroup is
    /// `<cgroup_parent>/<task id>`. Default `/drover`. Give each agent on a machine
    /// its own.
    #[serde(default)]
    pub cgroup_parent: Option<String>,
    /// `default` (the default): every task runs under the default seccomp filter
    /// (see [`crate::seccomp`]); `unconfined`: no filter.
    #[serde(default)]
    pub seccomp: crate::seccomp::Mode,
    /// System calls the default filter denies that this plugin's tasks may make after
    /// all (e.g. `ptrace` for debuggers, `unshare` and `clone` for tasks that build
    /// their own namespaces). A name the filter does not deny is an error, and so is
    /// `clone3` without `clone` and `unshare` (its flags are out of a filter's sight).
    #[serde(default)]
    pub seccomp_allow: Vec<String>,
    /// Users tasks may not run as, by name or uid; a task whose user resolves to the
    /// uid of an entry is refused (`root` also refuses `0`, `0:0` and any other name
    /// of uid 0). While uid 0 is denied, so is gid 0 as a task's primary or
    /// supplementary group (`65534:0`). Default `["root"]`; `[]` lets tasks run as root.
    #[serde(default)]
    pub user_denylist: Option<Vec<String>>,
}

/// Network of a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The host's network stack (default).
    #[default]
    Host,
    /// An own network namespace with only a loopback device (up: 127.0.0.1, and ::1
    /// where IPv6 is enabled, work inside the task; nothing reaches outside).
    None,
}

/// A task's pid or ipc namespace: Nomad's `pid_mode` / `ipc_mode` of the exec and java
/// drivers. Drover gives every task its own of both (`private`, the default);
/// `host` is refused (see [`IsolationConfig::validate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceMode {
    /// The task's own (default).
    #[default]
    Private,
    /// The host's: refused.
    Host,
}

/// One resource limit: `{"soft": 1024, "hard": 4096}`; `hard` defaults to `soft`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RlimitConfig {
    /// Soft limit.
    pub soft: u64,
    /// Hard limit (default: the soft one).
    #[serde(default)]
    pub hard: Option<u64>,
}

/// How a task is contained: the part of the task configuration that the exec and
/// java drivers share. Resources (memory, CPU shares) come from the task's
/// `resources`; the rest is here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct IsolationConfig {
    /// User to run as: a name from the host's `/etc/passwd`, or `uid` / `uid:gid`.
    /// Default `nobody`.
    pub user: Option<String>,
    /// Capabilities to add to the default set (each must be in the plugin's
    /// `allow_caps`). A task running as a non-root user holds exactly these.
    pub cap_add: Vec<String>,
    /// Capabilities to remove (`all` removes every one).
    pub cap_drop: Vec<String>,
    /// `host` (default) or `none`.
    pub network_mode: NetworkMode,
    /// CPU time limit in cores (`0.5`: half a core), enforced by CFS quota.
    pub cpu_limit: Option<f64>,
    /// Most processes and threads the task may have at once (default
    /// [`crate::engine::DEFAULT_PIDS_LIMIT`]).
    pub pids_limit: Option<u64>,
    /// Resource limits by name (`nofile`, `nproc`, `core`, …). `rtprio` above 0 and
    /// `nice` above 20 are refused: they let a task out-schedule the host.
    pub rlimits: BTreeMap<String, RlimitConfig>,
    /// Hostname inside the task (default: the host's).
    pub hostname: Option<String>,
    /// Working directory inside the task's root (default `/`, the task directory).
    pub cwd: Option<String>,
    /// Pid namespace (Nomad's `pid_mode`): only `private`.
    pub pid_mode: NamespaceMode,
    /// Ipc namespace (Nomad's `ipc_mode`): only `private`.
    pub ipc_mode: NamespaceMode,
}

impl IsolationConfig {
    /// Checks serde cannot express.
    pub fn validate(&self) -> Result<(), DriverError> {
        let bad = |m: String| Err(DriverError::InvalidConfig(m));
        if let Some(c) = self.cpu_limit
            && !(c.is_finite() && c > 0.0)
        {
            return bad(format!(
                "cpu_limit must be a positive number of cores, not {c}"
            ));
        }
        if self.pids_limit == Some(0) {
            return bad("pids_limit must be at least 1".into());
        }
        if let Some(h) = &self.hostname {
            let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            if h.is_empty() || h.len() > 63 || !h.chars().all(ok) {
                return bad(format!(
                    "hostname {h:?} must be 1-63 characters of [A-Za-z0-9.-]"
                ));
            }
        }
        if let Some(cwd) = &self.cwd
            && !cwd.starts_with('/')
        {
            return bad(format!(
                "cwd {cwd:?} must be an absolute path inside the task's root (e.g. /local)"
            ));
        }
        // Nomad lets an operator allow `host` (its plugin's `default_pid_mode`); Drover
        // does not: a task in the host's pid namespace sees and can signal every
        // process of the host, and one in its ipc namespace reaches every process's
        // shared memory and semaphores.
        if self.pid_mode == NamespaceMode::Host {
            return bad(
                "pid_mode = \"host\" is refused: a task in the host's pid namespace \
                 sees and can signal every process on the host; Drover runs every task in \
                 a pid namespace of its own (pid_mode = \"private\")"
                    .into(),
            );
        }
        if self.ipc_mode == NamespaceMode::Host {
            return bad(
                "ipc_mode = \"host\" is refused: a task in the host's ipc namespace \
                 reaches the shared memory and semaphores of every process on the host; \
                 Drover runs every task in an ipc namespace of its own (ipc_mode = \
                 \"private\")"
                    .into(),
            );
        }
        self.rlimits()?;
        Ok(())
    }

    /// The rlimits, checked.
    pub fn rlimits(&self) -> Result<Vec<Rlimit>, DriverError> {
        self.rlimits
            .iter()
            .map(|(name, l)| {
                let resource = RlimitResource::from_name(name).ok_or_else(|| {
                    DriverError::InvalidConfig(format!(
                        "rlimits: unknown limit {name:?}; known: {}",
                        RlimitResource::ALL.map(RlimitResource::name).join(", ")
                    ))
                })?;
                let hard = l.hard.unwrap_or(l.soft);
                if l.soft > hard {
                    return Err(DriverError::InvalidConfig(format!(
                        "rlimits: {name} soft limit {} is above its hard limit {hard}",
                        l.soft
                    )));
                }
                // The two limits that let an unprivileged task raise its own
                // scheduling: real-time priority (SCHED_FIFO runs past CPU shares and
                // can starve the host) and a nice value below 0.
                let ceiling = match resource {
                    RlimitResource::Rtprio => Some((0, "real-time scheduling (SCHED_FIFO/RR)")),
                    RlimitResource::Nice => Some((20, "a nice value below 0")),
                    _ => None,
                };
                if let Some((max, what)) = ceiling
                    && hard > max
                {
                    return Err(DriverError::InvalidConfig(format!(
                        "rlimits: {name} {}/{hard} is refused: above {max} it lets the task \
                         use {what} and escape its CPU limits; give at most {max}",
                        l.soft
                    )));
                }
                Ok(Rlimit {
                    resource,
                    soft: Some(l.soft),
                    hard: Some(hard),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, soft: u64, hard: Option<u64>) -> IsolationConfig {
        IsolationConfig {
            rlimits: [(name.to_owned(), RlimitConfig { soft, hard })].into(),
            ..IsolationConfig::default()
        }
    }

    /// Nomad's `pid_mode` / `ipc_mode`: `private` is what every task gets; `host` is
    /// refused with the reason.
    #[test]
    fn host_pid_and_ipc_namespaces_are_refused_with_the_reason() {
        let private = IsolationConfig {
            pid_mode: NamespaceMode::Private,
            ipc_mode: NamespaceMode::Private,
            ..IsolationConfig::default()
        };
        private.validate().unwrap();
        for (iso, word) in [
            (
                IsolationConfig {
                    pid_mode: NamespaceMode::Host,
                    ..IsolationConfig::default()
                },
                "pid_mode = \"host\" is refused",
            ),
            (
                IsolationConfig {
                    ipc_mode: NamespaceMode::Host,
                    ..IsolationConfig::default()
                },
                "ipc_mode = \"host\" is refused",
            ),
        ] {
            let e = iso.validate().unwrap_err().to_string();
            assert!(e.contains(word), "{e}");
        }
        let bad: Result<NamespaceMode, _> = serde_json::from_str("\"shared\"");
        assert!(bad.is_err());
    }

    #[test]
    fn rtprio_and_nice_that_raise_scheduling_are_refused() {
        for (name, soft, hard, word) in [
            ("rtprio", 99, None, "rtprio 99/99"),
            ("rtprio", 0, Some(1), "rtprio 0/1"),
            ("nice", 40, None, "nice 40/40"),
            ("nice", 0, Some(21), "nice 0/21"),
        ] {
            let e = with(name, soft, hard).validate().unwrap_err();
            assert!(matches!(e, DriverError::InvalidConfig(_)), "{e:?}");
            assert!(e.to_string().contains(word), "{e}");
            assert!(e.to_string().contains("CPU limits"), "{e}");
        }
        with("rtprio", 0, None).validate().unwrap();
        with("nice", 20, None).validate().unwrap();
        with("nofile", 1 << 20, None).validate().unwrap();
    }
}
