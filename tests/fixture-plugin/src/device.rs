//! Test-only device plugin built on the SDK's `DevicePlugin` trait: one device group
//! `drover/test/node` with one instance per configured device node (its id the node's
//! file name), healthy while the node is a character device. Reserving instances
//! returns their nodes as device nodes at `/dev/<id>` (read and write) and
//! `FIXTURE_DEVICES=<ids>`.
//!
//! ```toml
//! [plugin.drover-fixture-device]
//! config = { nodes = ["/tmp/x/drover-test0"] }
//! ```

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use drover_plugin_sdk::device::{
    DeviceGroup, DeviceInstance, DeviceNode, DevicePlugin, Reservation,
};
use drover_plugin_sdk::{AgentInfo, DriverError, PluginInfo};

#[derive(Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Device nodes on the host, one instance each.
    #[serde(default)]
    nodes: Vec<String>,
}

#[derive(Default)]
struct FixtureDevices {
    nodes: Mutex<Vec<PathBuf>>,
}

impl FixtureDevices {
    fn nodes(&self) -> Vec<PathBuf> {
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn id_of(node: &std::path::Path) -> String {
    node.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl DevicePlugin for FixtureDevices {
    type Config = Config;

    fn info(&self) -> PluginInfo {
        PluginInfo::new("drover-fixture-device", "0.1.0")
    }

    async fn set_config(&self, config: Config, _agent: AgentInfo) -> Result<(), DriverError> {
        *self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            config.nodes.into_iter().map(PathBuf::from).collect();
        Ok(())
    }

    fn fingerprint_interval(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn fingerprint(&self) -> Result<Vec<DeviceGroup>, DriverError> {
        let nodes = self.nodes();
        let instances = nodes.iter().map(|n| {
            let is_char =
                std::fs::symlink_metadata(n).is_ok_and(|m| m.file_type().is_char_device());
            if is_char {
                DeviceInstance::healthy(id_of(n))
            } else {
                DeviceInstance::unhealthy(id_of(n), "not a character device")
            }
        });
        Ok(vec![
            DeviceGroup::new("drover", "test", "node")
                .with_instances(instances.collect::<Vec<_>>())
                .with_attribute("kind", "char"),
        ])
    }

    async fn reserve(&self, device_ids: Vec<String>) -> Result<Reservation, DriverError> {
        let nodes = self.nodes();
        let wanted: BTreeSet<&String> = device_ids.iter().collect();
        let mut r = Reservation::default().with_env("FIXTURE_DEVICES", device_ids.join(","));
        for id in &wanted {
            let Some(node) = nodes.iter().find(|n| &&id_of(n) == id) else {
                return Err(DriverError::NotFound(format!("no device {id:?}")));
            };
            r = r.with_device(DeviceNode::new(
                node.display().to_string(),
                format!("/dev/{id}"),
                "rw",
            ));
        }
        Ok(r)
    }
}

fn main() {
    drover_plugin_sdk::server::serve_device(FixtureDevices::default())
}
