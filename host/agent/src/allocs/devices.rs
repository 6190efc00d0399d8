//! The device hook (issue 27): before a task that was given device instances starts,
//! the device plugin that reported them is asked to `Reserve` them, and what it
//! answers is applied to the task: its environment variables (as Nomad does), plus
//! Drover's own `DROVER_DEVICE_<VENDOR>_<TYPE>_<NAME>` listing the ids the task got.
//! Mounts and device nodes a plugin returns are not applied yet (no driver takes
//! them): they are logged, and the task runs without them.

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
        _state: &mut HookState,
    ) -> Result<(), String> {
        let Some(given) = ctx.alloc.alloc.task_devices.get(&ctx.task.name) else {
            return Ok(());
        };
        if ctx.restored || given.is_empty() {
            return Ok(());
        }
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
            let reservation = plugin
                .client()
                .reserve_devices(d.device_ids.clone())
                .await
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
            if !reservation.mounts.is_empty() || !reservation.devices.is_empty() {
                tracing::warn!(
                    alloc = %ctx.alloc.alloc.id,
                    task = %ctx.task.name,
                    device = %group,
                    mounts = reservation.mounts.len(),
                    device_nodes = reservation.devices.len(),
                    "the device plugin's mounts and device nodes are not applied (not supported yet); the task gets its environment only"
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
