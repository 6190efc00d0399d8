//! Host volumes for containers, staged.
//!
//! dockerd takes a bind's source as a path and looks it up again when it creates the
//! container. A volume's path is the operator's, but its parents may be another
//! volume whose contents a task controls (volume `a` at `/srv`, `b` at `/srv/b`: a
//! task of `a` can swap `/srv/b` between any check of ours and dockerd's lookup). So
//! dockerd never gets the volume's own path: the plugin opens the volume's directory
//! without following links, checks it on that descriptor (a directory owned by root),
//! clones that one mount (`open_tree`, not the mounts below it) and attaches it at a
//! staging directory of its own (`<plugin state dir>/docker/volumes/<task>/<n>`, in
//! directories only root can enter), remounted `nosuid,nodev` (and read-only when
//! asked). dockerd binds the staging directory, and a bind keeps its source's
//! `nosuid,nodev`: a root container cannot leave a setuid file or a device node
//! in a volume for the host's other users.
//!
//! The staging mounts live until the task is destroyed. They are never removed with
//! `remove_dir_all` (that would delete the volume's data through a mount still
//! there): each is unmounted, then its empty directory removed.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use drover_plugin_sdk::{DriverError, TaskVolume};
use rustix::fs::{Mode, OFlags, ResolveFlags, StatVfsMountFlags};
use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};

/// The directory holding task `task_id`'s staging mounts under `root`.
fn task_dir(root: &Path, task_id: &str) -> Result<PathBuf, DriverError> {
    if task_id.is_empty() || task_id.contains('/') || task_id == "." || task_id == ".." {
        return Err(DriverError::InvalidConfig(format!(
            "task id {task_id:?} cannot name a directory"
        )));
    }
    Ok(root.join(task_id))
}

/// Where volume number `index` of task `task_id` is staged (what dockerd binds).
pub(crate) fn staged_path(
    root: &Path,
    task_id: &str,
    index: usize,
) -> Result<PathBuf, DriverError> {
    Ok(task_dir(root, task_id)?.join(index.to_string()))
}

/// Stage every volume of the task (see the module's comment). On an error nothing
/// stays mounted.
pub(crate) fn stage(root: &Path, task_id: &str, volumes: &[TaskVolume]) -> Result<(), DriverError> {
    if volumes.is_empty() {
        return Ok(());
    }
    if root.as_os_str().is_empty() {
        return Err(DriverError::FailedPrecondition(
            "the docker plugin was given no state directory to stage host volumes in".into(),
        ));
    }
    // Left by a start that failed half-way, or by a plugin killed meanwhile.
    unstage(root, task_id);
    let dir = task_dir(root, task_id)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            DriverError::Internal(format!(
                "cannot create the volume staging directory {}: {e}",
                dir.display()
            ))
        })?;
    for (i, v) in volumes.iter().enumerate() {
        if let Err(e) = stage_one(&staged_path(root, task_id, i)?, v) {
            unstage(root, task_id);
            return Err(e);
        }
    }
    Ok(())
}

fn stage_one(at: &Path, v: &TaskVolume) -> Result<(), DriverError> {
    let bad = |why: String| {
        DriverError::InvalidConfig(format!("volume_mount of volume {:?}: {why}", v.name))
    };
    let internal = |what: &str, e: rustix::io::Errno| {
        DriverError::Internal(format!(
            "volume {:?}: cannot {what} for {}: {e}",
            v.name,
            at.display()
        ))
    };
    let source = rustix::fs::openat2(
        rustix::fs::CWD,
        &v.host_path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| {
        bad(format!(
            "cannot open {} as a directory without following links ({e}); a link in its \
             path is refused",
            v.host_path.display()
        ))
    })?;
    // The agent takes only root's directories as volumes; a directory a task made
    // where a nested volume was is not that volume.
    let owner = rustix::fs::fstat(&source)
        .map_err(|e| internal("stat the volume", e))?
        .st_uid;
    if owner != 0 {
        return Err(bad(format!(
            "its directory {} is owned by uid {owner}, not root: refused (was it replaced \
             by a task?)",
            v.host_path.display()
        )));
    }
    // A writable volume must already be nosuid,nodev where the host sees it: a root
    // container can create a setuid-root file or a device node in it, and the staging
    // mount's nosuid,nodev only govern use through the staging mount, not through
    // the operator's own path to the same directory.
    let source_flags = rustix::fs::fstatvfs(&source)
        .map_err(|e| internal("read the volume's mount flags", e))?
        .f_flag;
    let safe = StatVfsMountFlags::NOSUID | StatVfsMountFlags::NODEV;
    if !v.read_only && !source_flags.contains(safe) {
        let p = v.host_path.display();
        return Err(bad(format!(
            "{p} is mounted writable into a container, but its filesystem is not mounted \
             nosuid,nodev: a root container could leave a setuid file or a device node in it \
             for the host's users. Mount it so (e.g. `mount --bind {p} {p} && mount -o \
             remount,bind,nosuid,nodev {p}`), or mount the volume read_only"
        )));
    }
    let tree = rustix::mount::open_tree(
        &source,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::AT_EMPTY_PATH
            | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| internal("clone the volume's mount", e))?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(at)
        .map_err(|e| {
            DriverError::Internal(format!(
                "volume {:?}: cannot create {}: {e}",
                v.name,
                at.display()
            ))
        })?;
    rustix::mount::move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        at,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| internal("attach the volume", e))?;
    // A bind remount sets every flag anew: keep the source's own (read-only, noexec,
    // atime) and add ours.
    let mut flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
    for (theirs, ours) in [
        (StatVfsMountFlags::RDONLY, MountFlags::RDONLY),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if source_flags.contains(theirs) {
            flags |= ours;
        }
    }
    if v.read_only {
        flags |= MountFlags::RDONLY;
    }
    rustix::mount::mount_remount(at, flags, "").map_err(|e| internal("restrict the volume", e))
}

/// A task's staged volumes, unstaged when dropped unless [`Staged::keep`] was called:
/// a start that fails, or whose call is abandoned (a timeout drops it), leaves no
/// mount behind.
pub(crate) struct Staged {
    root: PathBuf,
    task_id: String,
    kept: bool,
}

impl Staged {
    /// Stage the task's volumes ([`stage`]).
    pub(crate) fn new(
        root: &Path,
        task_id: &str,
        volumes: &[TaskVolume],
    ) -> Result<Self, DriverError> {
        stage(root, task_id, volumes)?;
        Ok(Staged {
            root: root.to_owned(),
            task_id: task_id.to_owned(),
            kept: volumes.is_empty(),
        })
    }

    /// The task started: its volumes stay staged until it is destroyed.
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.kept {
            unstage(&self.root, &self.task_id);
        }
    }
}

/// Unmount and remove task `task_id`'s staging directories, as far as possible (a
/// failure is logged; nothing is removed that could still be a mount).
pub(crate) fn unstage(root: &Path, task_id: &str) {
    if root.as_os_str().is_empty() {
        return;
    }
    let Ok(dir) = task_dir(root, task_id) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        match rustix::mount::unmount(&path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            // EINVAL: not a mount point (a start that failed before attaching it).
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(err) => {
                tracing::warn!(task = %task_id, path = %path.display(), "cannot unmount a staged volume: {err}");
                continue;
            }
        }
        if let Err(err) = std::fs::remove_dir(&path) {
            tracing::warn!(task = %task_id, path = %path.display(), "cannot remove a staged volume's directory: {err}");
        }
    }
    let _ = std::fs::remove_dir(&dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_mount_point(p: &Path) -> Option<String> {
        let want = p.to_str()?;
        std::fs::read_to_string("/proc/self/mountinfo")
            .ok()?
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(want))
            .map(str::to_owned)
    }

    /// Needs root (mounts); skipped loudly otherwise, a failure under CI=true.
    fn root_or_skip() -> bool {
        if rustix::process::geteuid().is_root() {
            return true;
        }
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "staging volumes needs root, and CI runs as root"
        );
        eprintln!("SKIPPED: staging volumes needs root");
        false
    }

    /// `dir` bound on itself `nosuid,nodev` (as an operator makes a volume's
    /// filesystem), unmounted when dropped.
    struct SafeMount(PathBuf);

    impl SafeMount {
        fn new(dir: &Path) -> Self {
            rustix::mount::mount_bind(dir, dir).unwrap();
            let m = SafeMount(dir.to_owned());
            rustix::mount::mount_remount(
                dir,
                MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV,
                "",
            )
            .unwrap();
            m
        }
    }

    impl Drop for SafeMount {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.0, UnmountFlags::DETACH);
        }
    }

    #[test]
    fn a_volume_is_staged_nosuid_nodev_and_read_only_when_asked_then_unstaged() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        std::fs::write(vol.join("note"), "hi").unwrap();
        let _safe = SafeMount::new(&vol);
        let root = tmp.path().join("staging");
        let vols = [
            TaskVolume::new("rw", &vol, "/data"),
            TaskVolume::new("ro", &vol, "/ro").with_read_only(true),
        ];
        stage(&root, "t1", &vols).unwrap();
        let rw = staged_path(&root, "t1", 0).unwrap();
        let ro = staged_path(&root, "t1", 1).unwrap();
        let line = is_mount_point(&rw).expect("the rw volume is mounted");
        let opts = line.split(' ').nth(5).unwrap_or_default();
        assert!(opts.contains("nosuid") && opts.contains("nodev"), "{line}");
        assert!(opts.split(',').any(|o| o == "rw"), "{line}");
        assert_eq!(std::fs::read_to_string(rw.join("note")).unwrap(), "hi");
        let line = is_mount_point(&ro).expect("the ro volume is mounted");
        assert!(
            line.split(' ')
                .nth(5)
                .unwrap_or_default()
                .split(',')
                .any(|o| o == "ro"),
            "{line}"
        );
        assert!(std::fs::write(ro.join("x"), "x").is_err());
        unstage(&root, "t1");
        assert!(is_mount_point(&rw).is_none() && is_mount_point(&ro).is_none());
        assert!(!root.join("t1").exists());
        // The volume's data is untouched.
        assert_eq!(std::fs::read_to_string(vol.join("note")).unwrap(), "hi");
    }

    #[test]
    fn a_writable_volume_on_a_filesystem_allowing_setuid_or_devices_is_refused() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        // Bound on itself without nosuid,nodev: whatever the test's tmp is, this is not.
        rustix::mount::mount_bind(&vol, &vol).unwrap();
        let plain = SafeMount(vol.clone());
        rustix::mount::mount_remount(&vol, MountFlags::BIND, "").unwrap();
        let root = tmp.path().join("staging");
        let err = stage(&root, "t1", &[TaskVolume::new("v", &vol, "/v")]).unwrap_err();
        assert!(
            err.to_string().contains("not mounted nosuid,nodev"),
            "{err}"
        );
        assert!(!root.join("t1").exists());
        // Read-only, it is staged: a container cannot write there.
        stage(
            &root,
            "t1",
            &[TaskVolume::new("v", &vol, "/v").with_read_only(true)],
        )
        .unwrap();
        unstage(&root, "t1");
        drop(plain);
    }

    #[test]
    fn a_link_or_a_directory_not_owned_by_root_is_not_staged() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let root = tmp.path().join("staging");
        let err = stage(&root, "t1", &[TaskVolume::new("v", &link, "/v")]).unwrap_err();
        assert!(err.to_string().contains("without following links"), "{err}");
        let _safe = SafeMount::new(&real);
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        rustix::fs::chown(&theirs, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
        let err = stage(
            &root,
            "t1",
            &[
                TaskVolume::new("ok", &real, "/a"),
                TaskVolume::new("v", &theirs, "/v"),
            ],
        )
        .unwrap_err();
        assert!(err.to_string().contains("not root"), "{err}");
        // The first volume, staged before the refusal, is not left mounted.
        assert!(is_mount_point(&staged_path(&root, "t1", 0).unwrap()).is_none());
        assert!(!root.join("t1").exists());
    }
}
