//! Calling CNI plugins the CNI way (spec 0.4.0, as libcni does for a conflist): each
//! plugin of the list is executed with `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME` and `CNI_PATH` in its environment and its own network config on stdin
//! (the list's `name` and `cniVersion`, the previous plugin's result as `prevResult`,
//! the runtime config its `capabilities` ask for); ADD goes down the list, each result
//! feeding the next plugin, DEL goes up it with the final result of the ADD.
//!
//! Everything about a call is bounded: its output (a plugin printing without end is
//! killed), its time, and the size of what is kept of its error.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The CNI spec version of the configs Drover writes.
pub const CNI_VERSION: &str = "0.4.0";
/// Most a plugin may print (a result is a few hundred bytes).
const MAX_OUTPUT: u64 = 1 << 20;
/// Most of a plugin's stderr kept for an error message.
const MAX_STDERR_SHOWN: usize = 2048;

/// A CNI command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Add the container to the network.
    Add,
    /// Remove it (idempotent: what is gone already is not an error).
    Del,
    /// Check that what ADD made is still there.
    Check,
}

impl Command {
    fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
        }
    }
}

/// One port forwarded from the host into the namespace (the `portMappings`
/// capability of the portmap plugin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// The port on the host.
    pub host_port: u16,
    /// The port inside the namespace.
    pub container_port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Only traffic to this host address is forwarded (empty: any).
    #[serde(default, rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

/// A network config list (`.conflist`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfList {
    /// The CNI version of the list.
    pub cni_version: String,
    /// The network's name (host-local keeps its addresses under
    /// `/var/lib/cni/networks/<name>`).
    pub name: String,
    /// The plugins, in ADD order; each an object with at least `type`.
    pub plugins: Vec<Map<String, Value>>,
}

/// The runtime's arguments of a call.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    /// The container's id (Drover: the allocation id).
    pub container_id: &'a str,
    /// The network namespace's path (may be gone at DEL).
    pub netns: &'a Path,
    /// The interface made inside the namespace.
    pub ifname: &'a str,
    /// The `portMappings` runtime config.
    pub port_mappings: &'a [PortMapping],
}

/// The part of a CNI result Drover reads (the rest is kept as it is, to be handed
/// back as `prevResult`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResultView {
    /// Interfaces made.
    #[serde(default)]
    pub interfaces: Vec<ResultInterface>,
    /// Addresses given.
    #[serde(default)]
    pub ips: Vec<ResultIp>,
}

/// An interface of a CNI result.
#[derive(Debug, Clone, Deserialize)]
pub struct ResultInterface {
    /// Its name.
    pub name: String,
    /// The namespace it is in; empty: the host's.
    #[serde(default)]
    pub sandbox: String,
}

/// An address of a CNI result.
#[derive(Debug, Clone, Deserialize)]
pub struct ResultIp {
    /// `a.b.c.d/len`.
    pub address: String,
    /// Index into `interfaces`.
    #[serde(default)]
    pub interface: Option<usize>,
}

/// A CNI plugin's error output.
#[derive(Debug, Deserialize)]
struct PluginError {
    #[serde(default)]
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// What went wrong calling a plugin; every variant names the plugin and the command.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// No executable of that type in the CNI path.
    #[error(
        "CNI plugin {plugin:?} not found in {path} (install containernetworking-plugins, or set cni_path)"
    )]
    NotFound {
        /// The plugin type.
        plugin: String,
        /// The directories searched.
        path: String,
    },
    /// A plugin entry of the config list is malformed.
    #[error("CNI network config: {0}")]
    Config(String),
    /// The plugin could not be run, or did not end in time.
    #[error("CNI plugin {plugin} ({command}): {reason}")]
    Exec {
        /// The plugin type.
        plugin: String,
        /// ADD, DEL or CHECK.
        command: &'static str,
        /// Why.
        reason: String,
    },
    /// The plugin said no.
    #[error("CNI plugin {plugin} ({command}) failed: {message}")]
    Failed {
        /// The plugin type.
        plugin: String,
        /// ADD, DEL or CHECK.
        command: &'static str,
        /// What it said (its error's code, msg and details, or its stderr).
        message: String,
    },
}

/// Runs the plugins of a config list.
#[derive(Debug, Clone)]
pub struct Runner {
    /// Directories searched for plugin executables, in order.
    pub path: Vec<PathBuf>,
    /// Most one plugin call may take.
    pub timeout: Duration,
}

impl Runner {
    fn find(&self, plugin: &str) -> Result<PathBuf, CniError> {
        let plain = !plugin.is_empty()
            && plugin
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && plugin != "."
            && plugin != "..";
        if !plain {
            return Err(CniError::Config(format!(
                "plugin type {plugin:?} is not a plain executable name"
            )));
        }
        for dir in &self.path {
            let candidate = dir.join(plugin);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
        Err(CniError::NotFound {
            plugin: plugin.to_owned(),
            path: self.path_env(),
        })
    }

    fn path_env(&self) -> String {
        self.path
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// ADD every plugin of `list` in order; the last plugin's result.
    pub async fn add(&self, list: &ConfList, inv: &Invocation<'_>) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            let conf = plugin_conf(list, plugin, prev.as_ref(), inv)?;
            let out = self.exec(Command::Add, &conf, inv).await?;
            let result: Value = serde_json::from_slice(&out).map_err(|e| CniError::Failed {
                plugin: plugin_type(plugin),
                command: "ADD",
                message: format!("its result is not JSON ({e})"),
            })?;
            prev = Some(result);
        }
        prev.ok_or_else(|| CniError::Config("the network config lists no plugin".into()))
    }

    /// CHECK every plugin of `list` in order against the ADD's `result`.
    pub async fn check(
        &self,
        list: &ConfList,
        inv: &Invocation<'_>,
        result: &Value,
    ) -> Result<(), CniError> {
        for plugin in &list.plugins {
            let conf = plugin_conf(list, plugin, Some(result), inv)?;
            self.exec(Command::Check, &conf, inv).await?;
        }
        Ok(())
    }

    /// DEL every plugin of `list` in reverse order, each with the ADD's `result` when
    /// it is known. Every plugin is called even when one fails (each removes its own
    /// part); the first failure is returned.
    pub async fn del(
        &self,
        list: &ConfList,
        inv: &Invocation<'_>,
        result: Option<&Value>,
    ) -> Result<(), CniError> {
        let mut first = None;
        for plugin in list.plugins.iter().rev() {
            let outcome = match plugin_conf(list, plugin, result, inv) {
                Ok(conf) => self.exec(Command::Del, &conf, inv).await.map(drop),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                tracing::warn!(container = inv.container_id, "{e}");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Run one plugin; its stdout on success.
    async fn exec(
        &self,
        command: Command,
        conf: &Map<String, Value>,
        inv: &Invocation<'_>,
    ) -> Result<Vec<u8>, CniError> {
        let name = conf
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let exe = self.find(&name)?;
        let fail = |reason: String| CniError::Exec {
            plugin: name.clone(),
            command: command.as_str(),
            reason,
        };
        let stdin = serde_json::to_vec(conf).map_err(|e| fail(format!("config: {e}")))?;
        let mut child = tokio::process::Command::new(&exe)
            .env_clear()
            // The plugins run iptables and friends from PATH.
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", inv.container_id)
            .env("CNI_NETNS", inv.netns)
            .env("CNI_IFNAME", inv.ifname)
            .env("CNI_PATH", self.path_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("cannot run {}: {e}", exe.display())))?;
        let mut input = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let run = async {
            if let Some(mut w) = input.take() {
                // A plugin that exits without reading its config is told by its exit.
                let _ = w.write_all(&stdin).await;
                drop(w);
            }
            let read_bounded = |r: Option<_>| async move {
                let mut buf = Vec::new();
                if let Some(r) = r {
                    let r: tokio::process::ChildStdout = r;
                    r.take(MAX_OUTPUT + 1).read_to_end(&mut buf).await?;
                }
                Ok::<_, std::io::Error>(buf)
            };
            let read_err = async move {
                let mut buf = Vec::new();
                if let Some(r) = stderr {
                    let r: tokio::process::ChildStderr = r;
                    r.take(MAX_OUTPUT).read_to_end(&mut buf).await?;
                }
                Ok::<_, std::io::Error>(buf)
            };
            let (out, err) = tokio::try_join!(read_bounded(stdout), read_err)?;
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, out, err))
        };
        let (status, out, err) = match tokio::time::timeout(self.timeout, run).await {
            Err(_) => {
                return Err(fail(format!(
                    "did not finish within {:?} (killed)",
                    self.timeout
                )));
            }
            Ok(Err(e)) => return Err(fail(format!("cannot talk to it: {e}"))),
            Ok(Ok(r)) => r,
        };
        if out.len() as u64 > MAX_OUTPUT {
            return Err(fail(format!("printed more than {MAX_OUTPUT} bytes")));
        }
        if status.success() {
            return Ok(out);
        }
        let message = match serde_json::from_slice::<PluginError>(&out) {
            Ok(e) if !e.msg.is_empty() => {
                let mut m = format!("{} (code {})", e.msg, e.code);
                if !e.details.is_empty() {
                    m.push_str(&format!(": {}", e.details));
                }
                m
            }
            _ => {
                let text = if err.is_empty() { &out } else { &err };
                let text = String::from_utf8_lossy(text);
                let text = text.trim();
                let shown: String = text.chars().take(MAX_STDERR_SHOWN).collect();
                format!("{status}: {shown}")
            }
        };
        Err(CniError::Failed {
            plugin: name,
            command: command.as_str(),
            message,
        })
    }
}

fn plugin_type(plugin: &Map<String, Value>) -> String {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// One plugin's config as libcni builds it from a list entry.
fn plugin_conf(
    list: &ConfList,
    plugin: &Map<String, Value>,
    prev: Option<&Value>,
    inv: &Invocation<'_>,
) -> Result<Map<String, Value>, CniError> {
    if plugin_type(plugin).is_empty() {
        return Err(CniError::Config(format!(
            "a plugin of network {:?} has no type",
            list.name
        )));
    }
    let mut conf = plugin.clone();
    conf.insert("name".into(), Value::String(list.name.clone()));
    conf.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    let wants_ports = plugin
        .get("capabilities")
        .and_then(|c| c.get("portMappings"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if wants_ports && !inv.port_mappings.is_empty() {
        let mappings = serde_json::to_value(inv.port_mappings)
            .map_err(|e| CniError::Config(format!("port mappings: {e}")))?;
        conf.insert(
            "runtimeConfig".into(),
            serde_json::json!({ "portMappings": mappings }),
        );
    }
    Ok(conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_gets_the_list_name_version_prev_result_and_its_capabilities() {
        let list: ConfList = serde_json::from_value(serde_json::json!({
            "cniVersion": "0.4.0", "name": "drover",
            "plugins": [
                {"type": "bridge"},
                {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
            ]
        }))
        .unwrap();
        let ports = [PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: String::new(),
        }];
        let inv = Invocation {
            container_id: "c",
            netns: Path::new("/run/netns/c"),
            ifname: "eth0",
            port_mappings: &ports,
        };
        let prev = serde_json::json!({"ips": []});
        let bridge = plugin_conf(&list, &list.plugins[0], None, &inv).unwrap();
        assert_eq!(bridge["name"], "drover");
        assert!(bridge.get("runtimeConfig").is_none());
        assert!(bridge.get("prevResult").is_none());
        let portmap = plugin_conf(&list, &list.plugins[1], Some(&prev), &inv).unwrap();
        assert_eq!(portmap["cniVersion"], "0.4.0");
        assert_eq!(portmap["prevResult"], prev);
        assert_eq!(
            portmap["runtimeConfig"]["portMappings"][0],
            serde_json::json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"})
        );
    }

    #[test]
    fn a_plugin_type_is_a_plain_name() {
        let r = Runner {
            path: vec![PathBuf::from("/nonexistent")],
            timeout: Duration::from_secs(1),
        };
        for bad in ["", "..", "../bin/sh", "/bin/sh", "a b"] {
            assert!(matches!(r.find(bad), Err(CniError::Config(_))), "{bad:?}");
        }
        let e = r.find("bridge").unwrap_err().to_string();
        assert!(e.contains("bridge") && e.contains("/nonexistent"), "{e}");
    }
}
