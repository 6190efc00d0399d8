//! The device hook (issue 27): before a task that was given device instances starts,
//! the device plugin that reported them is asked to `Reserve` them, and what it
//! answers is applied to the task: its environment variables (as Nomad does), plus
//! Drover's own `DROVER_DEVICE_<VENDOR>_<TYPE>_<NAME>` listing the ids the task got.
//! The device nodes and mounts a plugin returns are checked (absolute paths without
//! `..`, permissions of `rwm`, bounded in number) and kept in the hook's state
//! ([`reserved`] reads them back), from which the runner gives them to the driver
//! ([`drover_plugin_sdk::TaskSpec::devices`] and [`drover_plugin_sdk::TaskSpec::mounts`]).

use std::sync::Arc;
use std::time::Duration;

use drover_api::RunRequest;

use super::hooks::{AllocTaskHook, HookContext, HookState};
use crate::cluster::fingerprint::device_plugin_of;
use crate::plugins::catalog::Catalog;

/// How long a task waits for the plugin of its devices to fingerprint them (after an
/// agent start, plugins are still being loaded).
const PLUGIN_WAIT: Duration = Duration::from_secs(30);

/// Largest value a plugin may set in one variable, and most variables it may set.
const MAX_ENV_VALUE: usize = 64 * 1024;
const MAX_ENV_VARS: usize = 256;
/// Most device nodes and most mounts one task may be given (all its devices together).
const MAX_DEVICE_NODES: usize = 64;
const MAX_DEVICE_MOUNTS: usize = 64;
/// Longest path a plugin may name.
const MAX_DEVICE_PATH: usize = 1024;
/// How long a plugin may take to answer `Reserve`: a hung plugin fails the task start
/// (retried like any failed start) instead of holding it forever.
const RESERVE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the device plugins' reservations give a task beside its environment, as kept
/// in the hook's state.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reserved {
    /// Device nodes for the task.
    #[serde(default)]
    pub devices: Vec<drover_plugin_sdk::TaskDevice>,
    /// Host paths mounted into the task.
    #[serde(default)]
    pub mounts: Vec<drover_plugin_sdk::TaskMount>,
}

/// The device nodes and mounts the device hook kept in `state` (empty when none).
pub fn reserved(state: Option<&HookState>) -> Reserved {
    state
        .and_then(|s| serde_json::from_value(s.data.clone()).ok())
        .unwrap_or_default()
}

/// An absolute path without `..`, `.` or NUL, of bounded length.
fn plain_absolute(path: &str) -> bool {
    let p = std::path::Path::new(path);
    path.len() <= MAX_DEVICE_PATH
        && !path.contains('\0')
        && p.is_absolute()
        && p.components().count() >= 2
        && p.components()
            .skip(1)
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Check what a plugin's reservation asks for beside the environment, as the driver
/// will get it.
fn checked_nodes_and_mounts(
    plugin: &str,
    group: &str,
    reservation: &drover_plugin_sdk::device::Reservation,
    into: &mut Reserved,
) -> Result<(), String> {
    for d in &reservation.devices {
        let perms_ok = !d.permissions.is_empty()
            && d.permissions.len() <= 3
            && d.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm'));
        if !plain_absolute(&d.host_path) || !plain_absolute(&d.task_path) || !perms_ok {
            return Err(format!(
                "device plugin {plugin} returned an unusable device node for {group} \
                 (host_path {:?}, task_path {:?}, permissions {:?}): paths must be absolute \
                 without `..`, permissions some of \"rwm\"",
                d.host_path, d.task_path, d.permissions
            ));
        }
        into.devices.push(
            drover_plugin_sdk::TaskDevice::new(&d.host_path, &d.task_path)
                .with_permissions(&d.permissions),
        );
    }
    for m in &reservation.mounts {
        if !plain_absolute(&m.host_path) || !plain_absolute(&m.task_path) {
            return Err(format!(
                "device plugin {plugin} returned an unusable mount for {group} (host_path \
                 {:?}, task_path {:?}): paths must be absolute without `..`",
                m.host_path, m.task_path
            ));
        }
        into.mounts.push(
            drover_plugin_sdk::TaskMount::new(&m.host_path, &m.task_path)
                .with_read_only(m.read_only),
        );
    }
    if into.devices.len() > MAX_DEVICE_NODES || into.mounts.len() > MAX_DEVICE_MOUNTS {
        return Err(format!(
            "device plugins returned {} device nodes and {} mounts for the task, at most \
             {MAX_DEVICE_NODES} and {MAX_DEVICE_MOUNTS}",
            into.devices.len(),
            into.mounts.len()
        ));
    }
    Ok(())
}

/// Reserves a task's device instances with their plugin.
pub struct DeviceHook {
    catalog: Arc<Catalog>,
}

impl DeviceHook {
    /// A hook asking the device plugins of `catalog`.
    pub fn new(catalog: Arc<Catalog>) -> Self {
        DeviceHook { catalog }
    }
}

/// `DROVER_DEVICE_<VENDOR>_<TYPE>_<NAME>`: upper case, anything but letters and digits
/// as `_`.
pub fn device_env_name(vendor: &str, device_type: &str, name: &str) -> String {
    let mut out = String::from("DROVER_DEVICE");
    for part in [vendor, device_type, name] {
        out.push('_');
        out.extend(part.chars().map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        }));
    }
    out
}

#[tonic::async_trait]
impl AllocTaskHook for DeviceHook {
    fn name(&self) -> &'static str {
        "devices"
    }

    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        req: &mut RunRequest,
        state: &mut HookState,
    ) -> Result<(), String> {
        let Some(given) = ctx.alloc.alloc.task_devices.get(&ctx.task.name) else {
            return Ok(());
        };
        if ctx.restored || given.is_empty() {
            return Ok(());
        }
        let mut kept = Reserved::default();
        for d in given {
            let group = format!("{}/{}/{}", d.vendor, d.device_type, d.name);
            let deadline = tokio::time::Instant::now() + PLUGIN_WAIT;
            let mut changes = self.catalog.driver_changes();
            let plugin = loop {
                if let Some(p) = device_plugin_of(&self.catalog, &d.vendor, &d.device_type, &d.name)
                {
                    break p;
                }
                if tokio::time::timeout_at(deadline, changes.changed())
                    .await
                    .is_err()
                {
                    return Err(format!(
                        "no device plugin on this node reports device {group} (waited {PLUGIN_WAIT:?})"
                    ));
                }
            };
            let reservation = tokio::time::timeout(
                RESERVE_TIMEOUT,
                plugin.client().reserve_devices(d.device_ids.clone()),
            )
            .await
            .map_err(|_| {
                format!(
                    "device plugin {} did not answer Reserve of {group} {:?} within \
                     {RESERVE_TIMEOUT:?}",
                    plugin.name, d.device_ids
                )
            })?
            .map_err(|e| {
                format!(
                    "device plugin {} refused to reserve {group} {:?}: {e}",
                    plugin.name, d.device_ids
                )
            })?;
            if reservation.envs.len() > MAX_ENV_VARS {
                return Err(format!(
                    "device plugin {} set {} variables for {group}, at most {MAX_ENV_VARS}",
                    plugin.name,
                    reservation.envs.len()
                ));
            }
            checked_nodes_and_mounts(&plugin.name, &group, &reservation, &mut kept)?;
            for (k, v) in reservation.envs {
                if v.len() > MAX_ENV_VALUE || v.contains('\0') || !plugin_env_allowed(&k) {
                    return Err(format!(
                        "device plugin {} set an unusable variable {k:?} for {group}",
                        plugin.name
                    ));
                }
                req.env.insert(k, v);
            }
            req.env.insert(
                device_env_name(&d.vendor, &d.device_type, &d.name),
                d.device_ids.join(","),
            );
        }
        state.data = serde_json::to_value(&kept).unwrap_or_default();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_nodes_and_mounts_are_checked_and_kept() {
        use drover_plugin_sdk::device::{DeviceMount, DeviceNode, Reservation};
        let mut kept = Reserved::default();
        let ok = Reservation::default()
            .with_device(DeviceNode::new("/srv/n/zero0", "/dev/zero0", "rw"))
            .with_mount(DeviceMount::new("/usr/lib/x", "/usr/lib/x", true));
        checked_nodes_and_mounts("p", "a/b/c", &ok, &mut kept).unwrap();
        assert_eq!(
            kept.devices[0].task_path,
            std::path::Path::new("/dev/zero0")
        );
        assert_eq!(kept.devices[0].permissions, "rw");
        assert!(kept.mounts[0].read_only);
        // Kept in the hook's state and read back by the runner.
        let state = HookState {
            done: false,
            data: serde_json::to_value(&kept).unwrap(),
        };
        assert_eq!(reserved(Some(&state)), kept);
        assert_eq!(reserved(None), Reserved::default());
        for bad in [
            DeviceNode::new("rel/zero", "/dev/zero0", "rw"),
            DeviceNode::new("/srv/zero", "/dev/../etc/passwd", "rw"),
            DeviceNode::new("/srv/zero", "/dev/zero0", "rwx"),
            DeviceNode::new("/srv/zero", "/dev/zero0", ""),
        ] {
            let r = Reservation::default().with_device(bad.clone());
            let e =
                checked_nodes_and_mounts("p", "a/b/c", &r, &mut Reserved::default()).unwrap_err();
            assert!(e.contains("device plugin p"), "{bad:?}: {e}");
        }
        let many = (0..=MAX_DEVICE_NODES).fold(Reservation::default(), |r, i| {
            r.with_device(DeviceNode::new("/srv/z", format!("/dev/z{i}"), "r"))
        });
        assert!(checked_nodes_and_mounts("p", "g", &many, &mut Reserved::default()).is_err());
    }

    #[test]
    fn env_names_are_shell_names() {
        assert_eq!(
            device_env_name("nomad", "file", "mock"),
            "DROVER_DEVICE_NOMAD_FILE_MOCK"
        );
        assert_eq!(
            device_env_name("nvidia", "gpu", "1080-ti.x"),
            "DROVER_DEVICE_NVIDIA_GPU_1080_TI_X"
        );
    }
}

/// May a device plugin set variable `name` in a task? A plain name
/// (`[A-Za-z_][A-Za-z0-9_]*`), and none that changes how the task's programs load
/// (`LD_*`, `PATH`) or that the agent sets itself (`NOMAD_*`, `DROVER_*`, `VAULT_*`):
/// a third-party plugin must not reach past its devices.
fn plugin_env_allowed(name: &str) -> bool {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    plain
        && name != "PATH"
        && !["LD_", "NOMAD_", "DROVER_", "VAULT_"]
            .iter()
            .any(|p| name.starts_with(p))
}

#[cfg(test)]
mod env_tests {
    use super::plugin_env_allowed;

    #[test]
    fn a_device_plugin_sets_only_plain_variables_of_its_own() {
        for ok in ["CUDA_VISIBLE_DEVICES", "EXAMPLE_DEVICES", "_X1"] {
            assert!(plugin_env_allowed(ok), "{ok}");
        }
        for bad in [
            "LD_PRELOAD",
            "PATH",
            "NOMAD_TOKEN",
            "DROVER_TASK_DIR",
            "VAULT_TOKEN",
            "A=B",
            "1X",
            "",
            "A B",
        ] {
            assert!(!plugin_env_allowed(bad), "{bad}");
        }
    }
}
