//! Allocations' CSI volumes on this node: before the tasks start, NodeStageVolume (when
//! the plugin advertises STAGE_UNSTAGE) at a staging path per volume and
//! NodePublishVolume at a target per allocation, both under the plugin's mount dir;
//! the target is what the drivers bind into the task. When the allocation's tasks are
//! all dead: NodeUnpublishVolume, and NodeUnstageVolume once no other allocation of
//! this node has the volume published. Which allocations have a volume published is
//! read from the disk (their target directories), so an agent restart loses nothing.
//!
//! Layout under the plugin's `mount_dir`:
//! `staging/<namespace>/<volume id>` and `per-alloc/<alloc id>/<namespace>/<volume id>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_plugin_sdk::TaskVolume;
use drover_server_api::csi::{
    ControllerCall, ControllerOutcome, CsiAccessMode, CsiAttachmentMode, CsiCapability, CsiVolume,
};
use drover_server_api::{ClientAllocation, HostVolume, Task, TaskGroup};

use super::client::Capability;
use super::plugins::{CsiPlugin, CsiPlugins};

/// The CSI volumes of allocations on this node.
#[derive(Debug)]
pub struct CsiMounts {
    plugins: Arc<CsiPlugins>,
    /// The servers, for ControllerPublish and ControllerUnpublish (none: never asked).
    link: Option<super::controller::ControllerLink>,
    /// One stage/publish or unpublish/unstage at a time: staging decisions read the
    /// per-alloc directories of other allocations.
    lock: tokio::sync::Mutex<()>,
}

fn path_segment(s: &str) -> Result<&str, String> {
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.contains('\0') {
        return Err(format!("{s:?} cannot be a path segment"));
    }
    Ok(s)
}

fn staging_path(plugin: &CsiPlugin, vol: &CsiVolume) -> Result<PathBuf, String> {
    Ok(plugin
        .mount_dir()
        .join("staging")
        .join(path_segment(&vol.namespace)?)
        .join(path_segment(&vol.id)?))
}

fn target_path(plugin: &CsiPlugin, alloc_id: &str, vol: &CsiVolume) -> Result<PathBuf, String> {
    Ok(plugin
        .mount_dir()
        .join("per-alloc")
        .join(path_segment(alloc_id)?)
        .join(path_segment(&vol.namespace)?)
        .join(path_segment(&vol.id)?))
}

/// Whether `path` is a mount point (its device differs from its parent's, or
/// /proc/self/mountinfo lists it: a bind mount of a directory of the same file system).
fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == want)
}

/// Remount the mount at `path` `nosuid,nodev`, keeping its read-only, noexec and
/// atime flags (a bind remount sets every flag anew).
fn restrict_mount(path: &Path) -> Result<(), rustix::io::Errno> {
    use rustix::fs::StatVfsMountFlags as St;
    use rustix::mount::MountFlags as Ms;
    let have = rustix::fs::statvfs(path)?.f_flag;
    let mut flags = Ms::BIND | Ms::NOSUID | Ms::NODEV;
    for (theirs, ours) in [
        (St::RDONLY, Ms::RDONLY),
        (St::NOEXEC, Ms::NOEXEC),
        (St::NOATIME, Ms::NOATIME),
        (St::NODIRATIME, Ms::NODIRATIME),
        (St::RELATIME, Ms::RELATIME),
    ] {
        if have.contains(theirs) {
            flags |= ours;
        }
    }
    rustix::mount::mount_remount(path, flags, "")
}

/// The capability a claim of `vol` by `group` is made in: the request's access mode
/// (else the volume's first), file-system, with the volume's mount options.
fn capability(vol: &CsiVolume, group: &TaskGroup) -> Capability {
    let asked = group
        .volumes
        .values()
        .filter(|v| v.volume_type == "csi" && v.source == vol.id)
        .find_map(|v| CsiAccessMode::parse(&v.access_mode));
    let mode = asked
        .or_else(|| vol.capabilities.first().map(|c| c.access_mode))
        .unwrap_or(CsiAccessMode::SingleNodeWriter);
    Capability {
        access_mode: mode,
        attachment_mode: CsiAttachmentMode::FileSystem,
        fs_type: vol.mount_options.fs_type.clone(),
        mount_flags: node_mount_flags(&vol.mount_options.mount_flags),
    }
}

/// The mount flags the node calls get: the volume's, always with `nosuid,nodev`
/// (and never `suid` or `dev`, which a volume's submitter could ask for): what a
/// plugin mounts on the host must not let a task's setuid file or device node work
/// there, and docker takes a writable volume only from a `nosuid,nodev` mount.
fn node_mount_flags(asked: &[String]) -> Vec<String> {
    let mut out: Vec<String> = asked
        .iter()
        .filter(|f| !matches!(f.as_str(), "suid" | "dev" | "nosuid" | "nodev"))
        .cloned()
        .collect();
    out.push("nosuid".into());
    out.push("nodev".into());
    out
}

/// Whether every request of `vol` in `group` is read-only.
fn read_only(vol: &CsiVolume, group: &TaskGroup) -> bool {
    group
        .volumes
        .values()
        .filter(|v| v.volume_type == "csi" && v.source == vol.id)
        .all(|v| v.read_only)
}

impl CsiMounts {
    /// Mounts through `plugins`, asking the servers (`link`) for the controller's
    /// publish when the plugin's controllers publish.
    pub fn new(plugins: Arc<CsiPlugins>, link: Option<super::controller::ControllerLink>) -> Self {
        Self {
            plugins,
            link,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// ControllerPublishVolume of `vol` to this node, through the servers: the publish
    /// context (empty when the plugin's controllers do not publish).
    async fn controller_publish(
        &self,
        plugin: &CsiPlugin,
        vol: &CsiVolume,
        cap: &Capability,
        readonly: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        let Some(link) = &self.link else {
            return Ok(BTreeMap::new());
        };
        let call = ControllerCall::Publish {
            plugin_id: vol.plugin_id.clone(),
            external_id: vol.external_id.clone(),
            node_id: plugin.fingerprint().node_id,
            capability: CsiCapability {
                access_mode: cap.access_mode,
                attachment_mode: cap.attachment_mode,
            },
            mount_options: vol.mount_options.clone(),
            readonly,
            context: vol.context.clone(),
        };
        match link.call(&call).await {
            Ok(ControllerOutcome::Published { publish_context }) => {
                tracing::info!(volume = %vol.id, "CSI volume published to this node by the controller");
                Ok(publish_context)
            }
            Ok(ControllerOutcome::NotRequired) => Ok(BTreeMap::new()),
            Ok(ControllerOutcome::Failed { error }) => Err(format!(
                "CSI volume {:?}: ControllerPublishVolume: {error}",
                vol.id
            )),
            Ok(other) => Err(format!(
                "CSI volume {:?}: ControllerPublishVolume answered {other:?}",
                vol.id
            )),
            Err(e) => Err(format!(
                "CSI volume {:?}: ControllerPublishVolume: {e}",
                vol.id
            )),
        }
    }

    /// ControllerUnpublishVolume of `vol` from this node, through the servers.
    async fn controller_unpublish(
        &self,
        plugin: &CsiPlugin,
        vol: &CsiVolume,
    ) -> Result<(), String> {
        let Some(link) = &self.link else {
            return Ok(());
        };
        let call = ControllerCall::Unpublish {
            plugin_id: vol.plugin_id.clone(),
            external_id: vol.external_id.clone(),
            node_id: plugin.fingerprint().node_id,
        };
        match link.call(&call).await {
            Ok(ControllerOutcome::Unpublished | ControllerOutcome::NotRequired) => Ok(()),
            Ok(ControllerOutcome::Failed { error }) => Err(format!(
                "CSI volume {:?}: ControllerUnpublishVolume: {error}",
                vol.id
            )),
            Ok(other) => Err(format!(
                "CSI volume {:?}: ControllerUnpublishVolume answered {other:?}",
                vol.id
            )),
            Err(e) => Err(format!(
                "CSI volume {:?}: ControllerUnpublishVolume: {e}",
                vol.id
            )),
        }
    }

    fn node_plugin(&self, vol: &CsiVolume) -> Result<&Arc<CsiPlugin>, String> {
        let plugin = self.plugins.get(&vol.plugin_id).ok_or_else(|| {
            format!(
                "CSI volume {:?}: this node runs no CSI plugin {:?}",
                vol.id, vol.plugin_id
            )
        })?;
        if !plugin.plugin_type().is_node() {
            return Err(format!(
                "CSI volume {:?}: plugin {:?} on this node is not a node plugin",
                vol.id, vol.plugin_id
            ));
        }
        Ok(plugin)
    }

    /// Stage and publish every CSI volume `alloc`'s group asks for (again: both are
    /// idempotent, and a target already mounted is left as it is). The published
    /// target of each, by volume id.
    pub async fn publish(
        &self,
        alloc: &ClientAllocation,
    ) -> Result<BTreeMap<String, PathBuf>, String> {
        let mut out = BTreeMap::new();
        let wanted: Vec<&str> = alloc
            .group
            .volumes
            .values()
            .filter(|v| v.volume_type == "csi")
            .map(|v| v.source.as_str())
            .collect();
        if wanted.is_empty() {
            return Ok(out);
        }
        let _one = self.lock.lock().await;
        for id in wanted {
            if out.contains_key(id) {
                continue;
            }
            let vol = alloc.csi_volumes.get(id).ok_or_else(|| {
                format!("CSI volume {id:?}: the server sent no such volume (deregistered?)")
            })?;
            let plugin = self.node_plugin(vol)?;
            let target = target_path(plugin, &alloc.alloc.id, vol)?;
            if !is_mount_point(&target) {
                self.stage_and_publish(plugin, &alloc.group, vol, &target)
                    .await?;
            }
            out.insert(id.to_owned(), target);
        }
        Ok(out)
    }

    async fn stage_and_publish(
        &self,
        plugin: &CsiPlugin,
        group: &TaskGroup,
        vol: &CsiVolume,
        target: &Path,
    ) -> Result<(), String> {
        let client = plugin.client().await.map_err(|e| e.to_string())?;
        let caps = client
            .node_capabilities()
            .await
            .map_err(|e| e.to_string())?;
        let cap = capability(vol, group);
        let readonly = read_only(vol, group);
        let none = BTreeMap::new();
        let publish_context = self.controller_publish(plugin, vol, &cap, readonly).await?;
        let staging = if caps.stage_unstage {
            let staging = staging_path(plugin, vol)?;
            make_dirs(&staging)?;
            client
                .node_stage(
                    &vol.external_id,
                    &staging,
                    &cap,
                    &publish_context,
                    &vol.context,
                    &none,
                )
                .await
                .map_err(|e| format!("CSI volume {:?}: {e}", vol.id))?;
            Some(staging)
        } else {
            None
        };
        // The target's parent is the CO's to make (the spec); the target too, so that
        // a plugin that mounts nothing (an in-memory one) still leaves a directory to
        // bind. Plugins that mount accept an existing empty directory.
        make_dirs(target)?;
        client
            .node_publish(
                &vol.external_id,
                staging.as_deref(),
                target,
                &cap,
                readonly,
                &publish_context,
                &vol.context,
                &none,
            )
            .await
            .map_err(|e| format!("CSI volume {:?}: {e}", vol.id))?;
        // Plugins need not honour the flags asked for (the hostpath plugin's bind does
        // not): the agent makes the published mount nosuid,nodev itself, keeping its
        // other flags. The target is under the plugin's mount dir, only root's.
        if is_mount_point(target)
            && let Err(e) = restrict_mount(target)
        {
            let _ = client.node_unpublish(&vol.external_id, target).await;
            return Err(format!(
                "CSI volume {:?}: cannot make its mount at {} nosuid,nodev: {e}",
                vol.id,
                target.display()
            ));
        }
        tracing::info!(volume = %vol.id, target = %target.display(), "CSI volume published");
        Ok(())
    }

    /// Unpublish every CSI volume of allocation `alloc`, and unstage those no other
    /// allocation of this node has published. Idempotent.
    pub async fn unpublish(&self, alloc: &ClientAllocation) -> Result<(), String> {
        let vols: Vec<&CsiVolume> = alloc.csi_volumes.values().collect();
        if vols.is_empty() {
            return Ok(());
        }
        let _one = self.lock.lock().await;
        for vol in vols {
            let plugin = self.node_plugin(vol)?;
            let target = target_path(plugin, &alloc.alloc.id, vol)?;
            let client = plugin.client().await.map_err(|e| e.to_string())?;
            let mut undone = false;
            if target.exists() {
                undone = true;
                client
                    .node_unpublish(&vol.external_id, &target)
                    .await
                    .map_err(|e| format!("CSI volume {:?}: {e}", vol.id))?;
                // A plugin that lost track of a publish (the hostpath plugin after it
                // was restarted with the agent's kill -9) answers OK and leaves the
                // mount: the target is the agent's, under the plugin's root-only mount
                // dir, so the agent unmounts what is left itself.
                if is_mount_point(&target) {
                    tracing::warn!(volume = %vol.id, target = %target.display(), "the CSI plugin said the volume was unpublished but left it mounted; unmounting it");
                    rustix::mount::unmount(
                        &target,
                        rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
                    )
                    .map_err(|e| {
                        format!(
                            "CSI volume {:?}: still mounted at {} after NodeUnpublish, and \
                             cannot be unmounted: {e}",
                            vol.id,
                            target.display()
                        )
                    })?;
                }
                // The plugin may leave the target directory: an empty one goes.
                let _ = std::fs::remove_dir(&target);
                tracing::info!(volume = %vol.id, target = %target.display(), "CSI volume unpublished");
            }
            remove_empty_parents(&target, &plugin.mount_dir().join("per-alloc"));
            let staging = staging_path(plugin, vol)?;
            if published_elsewhere(plugin, vol)? {
                continue;
            }
            if staging.exists() {
                undone = true;
                client
                    .node_unstage(&vol.external_id, &staging)
                    .await
                    .map_err(|e| format!("CSI volume {:?}: {e}", vol.id))?;
                let _ = std::fs::remove_dir(&staging);
                tracing::info!(volume = %vol.id, "CSI volume unstaged");
            }
            // The last use of the volume on this node is gone: the controller may
            // detach it.
            if undone {
                self.controller_unpublish(plugin, vol).await?;
            }
        }
        Ok(())
    }
}

/// Whether some allocation of this node still has `vol` published (its target is
/// there).
fn published_elsewhere(plugin: &CsiPlugin, vol: &CsiVolume) -> Result<bool, String> {
    let per_alloc = plugin.mount_dir().join("per-alloc");
    let entries = match std::fs::read_dir(&per_alloc) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", per_alloc.display())),
    };
    for e in entries.flatten() {
        let p = e.path().join(&vol.namespace).join(&vol.id);
        if std::fs::symlink_metadata(&p).is_ok() {
            return Ok(true);
        }
    }
    Ok(false)
}

fn make_dirs(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// Remove the empty directories from `path`'s parent up to (not including) `stop`.
fn remove_empty_parents(path: &Path, stop: &Path) {
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == stop || !d.starts_with(stop) || std::fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// The volumes `task` mounts: CSI ones from their published targets (`csi`, by
/// volume id), host ones as [`crate::volumes::task_volumes`] finds them.
pub fn task_volumes(
    group: &TaskGroup,
    task: &Task,
    host: &BTreeMap<String, HostVolume>,
    csi: &BTreeMap<String, PathBuf>,
) -> Result<Vec<TaskVolume>, String> {
    let is_csi = |name: &str| {
        group
            .volumes
            .get(name)
            .is_some_and(|v| v.volume_type == "csi")
    };
    let mut host_only = task.clone();
    host_only.volume_mounts.retain(|m| !is_csi(&m.volume));
    let mut out = crate::volumes::task_volumes(group, &host_only, host)?;
    for m in task.volume_mounts.iter().filter(|m| is_csi(&m.volume)) {
        let Some(req) = group.volumes.get(&m.volume) else {
            continue;
        };
        let Some(path) = csi.get(&req.source) else {
            return Err(format!(
                "volume {:?}: CSI volume {:?} is not published on this node",
                m.volume, req.source
            ));
        };
        out.push(
            TaskVolume::new(m.volume.clone(), path.clone(), m.destination.clone())
                .with_read_only(req.read_only || m.read_only),
        );
    }
    Ok(out)
}
