//! Host volumes (`[host_volume.NAME] path = "/srv/data"` in the agent's config): checked
//! at start, registered with the node, and turned into the mounts of the tasks that
//! ask for them.
//!
//! A volume's path is the operator's; what is inside it may be a task's. So the path
//! must be an absolute directory owned by root, with no link anywhere in it (checked
//! here, and again by the driver when it opens the directory to bind it), and drivers
//! bind the directory itself, never a path below it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path};

use drover_plugin_sdk::TaskVolume;
use drover_server_api::{HostVolume, Task, TaskGroup};

/// Longest host volume name.
pub const MAX_HOST_VOLUME_NAME: usize = 128;
/// Most host volumes one agent offers.
pub const MAX_HOST_VOLUMES: usize = 256;

/// Why the host volume `name` cannot be offered, if it cannot: the name must be a
/// name, the path an absolute directory without links in it, owned by root.
pub fn check_host_volume(name: &str, v: &HostVolume) -> Result<(), String> {
    let at = format!("[host_volume.{name}]");
    if name.is_empty()
        || name.len() > MAX_HOST_VOLUME_NAME
        || name.chars().any(|c| c.is_control() || c == '/')
    {
        return Err(format!(
            "{at}: a host volume's name must be 1 to {MAX_HOST_VOLUME_NAME} characters \
             without '/' or control characters"
        ));
    }
    let path = Path::new(&v.path);
    let plain = path.is_absolute()
        && path
            .components()
            .skip(1)
            .all(|c| matches!(c, Component::Normal(_)));
    if !plain || v.path.len() > 4096 {
        return Err(format!(
            "{at} path = {:?} must be an absolute path without `.` or `..`, e.g. \"/srv/data\"",
            v.path
        ));
    }
    // Component by component, never following a link: a link anywhere in the path
    // could later be pointed elsewhere (by a task, if it is inside another volume).
    let mut walked = std::path::PathBuf::from("/");
    for c in path.components().skip(1) {
        walked.push(c);
        let meta = std::fs::symlink_metadata(&walked).map_err(|e| {
            format!(
                "{at} path = {:?}: {}: {e} (the directory must exist)",
                v.path,
                walked.display()
            )
        })?;
        if meta.file_type().is_symlink() {
            return Err(format!(
                "{at} path = {:?}: {} is a symbolic link; give the directory's real path",
                v.path,
                walked.display()
            ));
        }
        if !meta.is_dir() {
            return Err(format!(
                "{at} path = {:?}: {} is not a directory",
                v.path,
                walked.display()
            ));
        }
    }
    let meta =
        std::fs::symlink_metadata(path).map_err(|e| format!("{at} path = {:?}: {e}", v.path))?;
    if meta.uid() != 0 {
        return Err(format!(
            "{at} path = {:?} is owned by uid {}, not root: a host volume's directory must \
             be root's (its contents may be the tasks')",
            v.path,
            meta.uid()
        ));
    }
    Ok(())
}

/// Check every host volume of the config (see [`check_host_volume`]).
pub fn check_host_volumes(volumes: &BTreeMap<String, HostVolume>) -> Result<(), String> {
    if volumes.len() > MAX_HOST_VOLUMES {
        return Err(format!(
            "{} host volumes, at most {MAX_HOST_VOLUMES}",
            volumes.len()
        ));
    }
    for (name, v) in volumes {
        check_host_volume(name, v)?;
    }
    Ok(())
}

/// The host volumes `task` mounts: each `volume_mount` through its group's `volume`
/// request to the node's host volume, read-only when the request, the mount or the
/// node's volume says so. An error names what is missing.
pub fn task_volumes(
    group: &TaskGroup,
    task: &Task,
    node: &BTreeMap<String, HostVolume>,
) -> Result<Vec<TaskVolume>, String> {
    let mut out = Vec::with_capacity(task.volume_mounts.len());
    for m in &task.volume_mounts {
        let Some(req) = group.volumes.get(&m.volume) else {
            return Err(format!(
                "volume_mount of volume {:?}: group {:?} has no such volume",
                m.volume, group.name
            ));
        };
        if req.volume_type != "host" {
            return Err(format!(
                "volume {:?} is of type {:?}: only host volumes are mounted by this agent",
                m.volume, req.volume_type
            ));
        }
        let Some(host) = node.get(&req.source) else {
            return Err(format!(
                "volume {:?}: this node has no host volume {:?} (its agent's config lost it \
                 since the allocation was placed)",
                m.volume, req.source
            ));
        };
        out.push(
            TaskVolume::new(m.volume.clone(), host.path.clone(), m.destination.clone())
                .with_read_only(req.read_only || m.read_only || host.read_only),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(path: &str) -> HostVolume {
        HostVolume {
            path: path.into(),
            read_only: false,
        }
    }

    #[test]
    fn a_volume_must_be_a_real_root_owned_directory() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let s = |p: &Path| p.display().to_string();

        let root = rustix::process::geteuid().is_root();
        let ok = check_host_volume("data", &vol(&s(&real)));
        if root {
            ok.unwrap();
        } else {
            assert!(ok.unwrap_err().contains("not root"));
        }
        let err = check_host_volume("data", &vol(&s(&link))).unwrap_err();
        assert!(
            err.contains("[host_volume.data]") && err.contains("symbolic link"),
            "{err}"
        );
        let err = check_host_volume("data", &vol(&s(&link.join("below")))).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        let err = check_host_volume("data", &vol(&s(&file))).unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
        let err = check_host_volume("data", &vol(&s(&dir.path().join("nope")))).unwrap_err();
        assert!(err.contains("must exist"), "{err}");
        let err = check_host_volume("data", &vol("srv/data")).unwrap_err();
        assert!(err.contains("absolute"), "{err}");
        let err = check_host_volume("data", &vol("/srv/../etc")).unwrap_err();
        assert!(err.contains("absolute"), "{err}");
        let err = check_host_volume("", &vol("/srv")).unwrap_err();
        assert!(err.contains("name"), "{err}");
    }

    #[test]
    fn read_only_if_any_of_the_three_says_so() {
        let mut group: TaskGroup = serde_json::from_value(serde_json::json!({
            "name": "g",
            "task": [{"name": "t", "driver": "exec",
                      "volume_mount": [{"volume": "data", "destination": "/data"}]}],
            "volume": {"data": {"type": "host", "source": "shared"}}
        }))
        .unwrap();
        let mut node = BTreeMap::from([("shared".to_owned(), vol("/srv/shared"))]);
        let task = group.tasks[0].clone();
        let v = task_volumes(&group, &task, &node).unwrap();
        assert_eq!(v[0].host_path, Path::new("/srv/shared"));
        assert_eq!(v[0].destination, Path::new("/data"));
        assert!(!v[0].read_only);
        node.get_mut("shared").unwrap().read_only = true;
        assert!(task_volumes(&group, &task, &node).unwrap()[0].read_only);
        node.get_mut("shared").unwrap().read_only = false;
        let mut ro_mount = task.clone();
        ro_mount.volume_mounts[0].read_only = true;
        assert!(task_volumes(&group, &ro_mount, &node).unwrap()[0].read_only);
        group.volumes.get_mut("data").unwrap().read_only = true;
        assert!(task_volumes(&group, &task, &node).unwrap()[0].read_only);
        let err = task_volumes(&group, &task, &BTreeMap::new()).unwrap_err();
        assert!(err.contains("no host volume \"shared\""), "{err}");
    }
}
