//! `device_nodes`: Drover's built-in device plugin. It offers device nodes of the host
//! to tasks as devices, so that a task that needs one (a VM runner needing `/dev/kvm`,
//! a program driving a serial adapter or a USB token) asks for it in its job, is
//! placed only where it exists, and gets exactly that node in its sandbox (exec/java:
//! the node in its `/dev` and its devices cgroup; docker: `--device`), never more.
//!
//! The agent runs it only when its config has a `[plugin.device_nodes]` table. With
//! an empty one (`config = {}`) it offers `/dev/kvm`, when the host has it, as the
//! group `drover/kvm/kvm` with 8 instances (KVM is shared: each instance is one task's
//! right to it, so at most 8 tasks per node use it at once). The config can name
//! other nodes:
//!
//! ```toml
//! [plugin.device_nodes]
//! config = { groups = [
//!   { vendor = "drover", type = "kvm", name = "kvm", paths = ["/dev/kvm"], shares = 8 },
//!   { vendor = "ftdi", type = "serial", name = "ft232", paths = ["/dev/ttyUSB0", "/dev/ttyUSB1"] },
//! ] }
//! ```
//!
//! Each path is one instance (`shares` instances of it when shared), healthy while the
//! path is a character or block device (looked at without following links). A task
//! given an instance gets the node at `/dev/<file name>` with the group's
//! `permissions` (default `rw`).

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use drover_plugin_sdk::device::{
    DeviceGroup, DeviceInstance, DeviceNode, DevicePlugin, Reservation,
};
use drover_plugin_sdk::{AgentInfo, DriverError, PluginInfo};

/// The plugin's name (`[plugin.device_nodes]`).
pub const PLUGIN_NAME: &str = "device_nodes";

/// Most groups, paths per group and shares of one path.
const MAX_GROUPS: usize = 64;
const MAX_PATHS: usize = 256;
const MAX_SHARES: u32 = 64;

/// The plugin config.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The groups of device nodes offered (default: `/dev/kvm` as `drover/kvm/kvm`,
    /// 8 shares).
    #[serde(default = "default_groups")]
    pub groups: Vec<NodeGroup>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            groups: default_groups(),
        }
    }
}

/// Device nodes offered as one device group.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    /// The group's vendor, e.g. `drover`.
    pub vendor: String,
    /// The group's type, e.g. `kvm`.
    #[serde(rename = "type")]
    pub device_type: String,
    /// The group's name, e.g. `kvm`.
    pub name: String,
    /// Absolute paths of device nodes on the host, one instance each.
    pub paths: Vec<String>,
    /// How many tasks may share one node at once (1 to 64): each is an instance.
    #[serde(default = "one")]
    pub shares: u32,
    /// What a task may do with the node: `r`, `w`, `m` (mknod) in any combination.
    #[serde(default = "rw")]
    pub permissions: String,
}

fn one() -> u32 {
    1
}

fn rw() -> String {
    "rw".into()
}

fn default_groups() -> Vec<NodeGroup> {
    vec![NodeGroup {
        vendor: "drover".into(),
        device_type: "kvm".into(),
        name: "kvm".into(),
        paths: vec!["/dev/kvm".into()],
        shares: 8,
        permissions: rw(),
    }]
}

/// One instance: its id, the host node and the group it belongs to.
#[derive(Debug, Clone)]
struct Instance {
    id: String,
    path: PathBuf,
    group: usize,
}

/// The plugin: [`Config`] checked, and its instances.
#[derive(Debug, Default)]
pub struct DeviceNodes {
    state: Mutex<Option<(Config, Vec<Instance>)>>,
}

/// Check a config, and list its instances. An error names the group and the field.
fn instances(config: &Config) -> Result<Vec<Instance>, String> {
    if config.groups.len() > MAX_GROUPS {
        return Err(format!(
            "groups: {} groups, at most {MAX_GROUPS}",
            config.groups.len()
        ));
    }
    let mut out = Vec::new();
    let mut task_paths = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (g, group) in config.groups.iter().enumerate() {
        let at = |field: &str| format!("groups[{g}].{field}");
        for (field, v) in [
            ("vendor", &group.vendor),
            ("type", &group.device_type),
            ("name", &group.name),
        ] {
            let plain = !v.is_empty()
                && v.len() <= 64
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !plain {
                return Err(format!(
                    "{}: {v:?} must be 1 to 64 letters, digits, '-', '_' or '.'",
                    at(field)
                ));
            }
        }
        if !names.insert((&group.vendor, &group.device_type, &group.name)) {
            return Err(format!(
                "{}: {}/{}/{} is named twice",
                at("name"),
                group.vendor,
                group.device_type,
                group.name
            ));
        }
        if group.paths.is_empty() || group.paths.len() > MAX_PATHS {
            return Err(format!("{}: 1 to {MAX_PATHS} paths", at("paths")));
        }
        if !(1..=MAX_SHARES).contains(&group.shares) {
            return Err(format!(
                "{}: {} is not 1 to {MAX_SHARES}",
                at("shares"),
                group.shares
            ));
        }
        if group.permissions.is_empty()
            || !group
                .permissions
                .chars()
                .all(|c| matches!(c, 'r' | 'w' | 'm'))
        {
            return Err(format!(
                "{}: {:?} is not made of r, w and m",
                at("permissions"),
                group.permissions
            ));
        }
        for p in &group.paths {
            let path = Path::new(p);
            let file = path
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or_default();
            // Below /dev only: a node elsewhere could sit in a directory someone else
            // can write, and docker resolves the path again when it creates a container.
            let clean = path.starts_with("/dev")
                && path.components().count() >= 3
                && path
                    .components()
                    .skip(1)
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            let plain_file = !file.is_empty()
                && file
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !clean || !plain_file {
                return Err(format!(
                    "{}: {p:?} must be a path below /dev without `..` whose file name is \
                     letters, digits, '-', '_' or '.'",
                    at("paths")
                ));
            }
            // Each node is at /dev/<file name> in the task: two with one name cannot.
            if !task_paths.insert(file.to_owned()) {
                return Err(format!(
                    "{}: {p:?}: another configured node is also called {file:?} (each is \
                     given to tasks at /dev/<file name>)",
                    at("paths")
                ));
            }
            for share in 0..group.shares {
                let id = if group.shares == 1 {
                    file.to_owned()
                } else {
                    format!("{file}-{share}")
                };
                out.push(Instance {
                    id,
                    path: path.to_owned(),
                    group: g,
                });
            }
        }
    }
    // Ids are what the scheduler hands out and `reserve` looks up: one id, one node
    // (`kvm` shared as `kvm-0` must not meet a node called `kvm-0`).
    let mut ids = BTreeSet::new();
    if let Some(dup) = out.iter().find(|i| !ids.insert(i.id.as_str())) {
        return Err(format!(
            "groups[{}].paths: instance id {:?} would name two nodes (a shared node's \
             instances are <file name>-<n>): rename one",
            dup.group, dup.id
        ));
    }
    Ok(out)
}

impl DeviceNodes {
    fn state(&self) -> (Config, Vec<Instance>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.is_none() {
            // No SetConfig yet: the default (which is always valid).
            let config = Config::default();
            let list = instances(&config).unwrap_or_default();
            *s = Some((config, list));
        }
        s.clone().unwrap_or_default()
    }
}

/// Whether `path` is a device node (not followed if it is a link).
fn is_device(path: &Path) -> Result<(), &'static str> {
    match std::fs::symlink_metadata(path) {
        Err(_) => Err("does not exist"),
        Ok(m) if m.file_type().is_char_device() || m.file_type().is_block_device() => Ok(()),
        Ok(m) if m.file_type().is_symlink() => Err("is a link (not followed)"),
        Ok(_) => Err("is not a device node"),
    }
}

impl DevicePlugin for DeviceNodes {
    type Config = Config;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(PLUGIN_NAME, env!("CARGO_PKG_VERSION"))
    }

    async fn set_config(&self, config: Config, _agent: AgentInfo) -> Result<(), DriverError> {
        // No groups is the default (a config that left `groups` out may arrive as an
        // empty list through the hclspec): offering nothing is done by not
        // configuring the plugin at all.
        let config = if config.groups.is_empty() {
            Config::default()
        } else {
            config
        };
        let list = instances(&config).map_err(DriverError::InvalidConfig)?;
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Some((config, list));
        Ok(())
    }

    fn fingerprint_interval(&self) -> Duration {
        Duration::from_secs(5)
    }

    async fn fingerprint(&self) -> Result<Vec<DeviceGroup>, DriverError> {
        let (config, list) = self.state();
        let mut groups = Vec::new();
        for (g, group) in config.groups.iter().enumerate() {
            // A group none of whose nodes exists is not offered (a host without
            // /dev/kvm has no kvm group, rather than an unhealthy one).
            let mine: Vec<&Instance> = list.iter().filter(|i| i.group == g).collect();
            if mine.iter().all(|i| !i.path.exists()) {
                continue;
            }
            let instances: Vec<DeviceInstance> = mine
                .iter()
                .map(|i| match is_device(&i.path) {
                    Ok(()) => DeviceInstance::healthy(i.id.clone()),
                    Err(why) => DeviceInstance::unhealthy(
                        i.id.clone(),
                        format!("{} {why}", i.path.display()),
                    ),
                })
                .collect();
            groups.push(
                DeviceGroup::new(&group.vendor, &group.device_type, &group.name)
                    .with_instances(instances)
                    .with_attribute("shares", group.shares.to_string()),
            );
        }
        Ok(groups)
    }

    async fn reserve(&self, device_ids: Vec<String>) -> Result<Reservation, DriverError> {
        let (config, list) = self.state();
        let mut r = Reservation::default();
        // Shares of one node give the task that node once.
        let mut given = BTreeSet::new();
        for id in &device_ids {
            let Some(i) = list.iter().find(|i| &i.id == id) else {
                return Err(DriverError::NotFound(format!("no device instance {id:?}")));
            };
            is_device(&i.path).map_err(|why| {
                DriverError::FailedPrecondition(format!("{} {why}", i.path.display()))
            })?;
            if !given.insert(i.path.clone()) {
                continue;
            }
            let file = i.path.file_name().unwrap_or_default().to_string_lossy();
            r = r.with_device(DeviceNode::new(
                i.path.display().to_string(),
                format!("/dev/{file}"),
                config.groups[i.group].permissions.clone(),
            ));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> Config {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_default_offers_kvm_in_8_shares() {
        let list = instances(&Config::default()).unwrap();
        assert_eq!(list.len(), 8);
        assert_eq!(list[0].id, "kvm-0");
        assert!(list.iter().all(|i| i.path == Path::new("/dev/kvm")));
    }

    #[test]
    fn bad_configs_name_the_group_and_field() {
        let bad = |json: serde_json::Value, want: &str| {
            let err = instances(&config(json)).unwrap_err();
            assert!(err.contains(want), "{err} lacks {want}");
        };
        bad(
            serde_json::json!({"groups": [{"vendor": "a b", "type": "t", "name": "n", "paths": ["/dev/x"]}]}),
            "groups[0].vendor",
        );
        bad(
            serde_json::json!({"groups": [{"vendor": "a", "type": "t", "name": "n", "paths": ["dev/x"]}]}),
            "groups[0].paths",
        );
        bad(
            serde_json::json!({"groups": [{"vendor": "a", "type": "t", "name": "n", "paths": ["/dev/../etc/x"]}]}),
            "groups[0].paths",
        );
        bad(
            serde_json::json!({"groups": [{"vendor": "a", "type": "t", "name": "n", "paths": ["/dev/x"], "shares": 0}]}),
            "groups[0].shares",
        );
        bad(
            serde_json::json!({"groups": [{"vendor": "a", "type": "t", "name": "n", "paths": ["/dev/x"], "permissions": "rwx"}]}),
            "groups[0].permissions",
        );
        bad(
            serde_json::json!({"groups": [
                {"vendor": "a", "type": "t", "name": "n", "paths": ["/dev/x"]},
                {"vendor": "b", "type": "t", "name": "n", "paths": ["/dev/sub/x"]}
            ]}),
            "also called \"x\"",
        );
        bad(
            serde_json::json!({"groups": [{"vendor": "a", "type": "t", "name": "n", "paths": ["/srv/x"]}]}),
            "below /dev",
        );
        bad(
            serde_json::json!({"groups": [
                {"vendor": "a", "type": "t", "name": "n", "paths": ["/dev/kvm"], "shares": 2},
                {"vendor": "b", "type": "t", "name": "n", "paths": ["/dev/kvm-0"]}
            ]}),
            "would name two nodes",
        );
        assert!(
            serde_json::from_value::<Config>(serde_json::json!({"groups": [], "typo": 1})).is_err()
        );
    }

    #[tokio::test]
    async fn an_empty_config_offers_kvm() {
        let p = DeviceNodes::default();
        p.set_config(
            config(serde_json::json!({"groups": []})),
            AgentInfo::new("0.1.0"),
        )
        .await
        .unwrap();
        let (config, list) = p.state();
        assert_eq!(config.groups[0].paths, ["/dev/kvm"]);
        assert_eq!(list.len(), 8);
    }

    #[tokio::test]
    async fn nodes_are_fingerprinted_by_kind_and_reserved_once_per_node() {
        // /dev/shm is a directory on every Linux: present, but no device node.
        let p = DeviceNodes::default();
        let cfg = config(serde_json::json!({"groups": [
            {"vendor": "acme", "type": "null", "name": "n", "paths": ["/dev/null"], "shares": 2, "permissions": "r"},
            {"vendor": "acme", "type": "file", "name": "f", "paths": ["/dev/shm"]},
            {"vendor": "acme", "type": "none", "name": "x", "paths": ["/dev/drover-nonexistent0"]}
        ]}));
        p.set_config(cfg, AgentInfo::new("0.1.0")).await.unwrap();
        let groups = p.fingerprint().await.unwrap();
        // The group with no node at all is not offered.
        assert_eq!(groups.len(), 2, "{groups:?}");
        let null = &groups[0];
        assert_eq!(null.instances.len(), 2);
        assert!(null.instances.iter().all(|i| i.healthy));
        let f = &groups[1];
        assert!(!f.instances[0].healthy);
        assert!(
            f.instances[0]
                .health_description
                .contains("not a device node")
        );
        let r = p
            .reserve(vec!["null-0".into(), "null-1".into()])
            .await
            .unwrap();
        assert_eq!(r.devices.len(), 1, "{r:?}");
        assert_eq!(r.devices[0].task_path, "/dev/null");
        assert_eq!(r.devices[0].permissions, "r");
        assert!(p.reserve(vec!["nope".into()]).await.is_err());
        assert!(p.reserve(vec!["shm".into()]).await.is_err());
    }
}
