//! A task's root: the host paths of the chroot list (read-only), the task
//! directory's `local/`, `secrets/` and `tmp/` (writable), a fresh `/proc` and a
//! minimal `/dev`. Also where a path inside the root lives on the host, so that a
//! missing command or jar is refused before anything starts.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use drover_executor::{Mount, MountKind};
use drover_plugin_sdk::DriverError;

/// Host paths bound into every task's root when the plugin config has no
/// `chroot_env`; missing ones are skipped. Like Nomad's default `chroot_env`, but
/// only the files of `/etc` that programs need to start and resolve names, rather
/// than all of it.
pub const DEFAULT_CHROOT: [&str; 21] = [
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/group",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/resolv.conf",
    "/etc/ssl",
    "/run/resolvconf",
];

/// Paths of the root the driver fills itself.
const RESERVED: [&str; 5] = ["/proc", "/dev", "/local", "/secrets", "/tmp"];

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: PathBuf,
    inside: PathBuf,
    /// Skipped when missing on the host (defaults); else a missing one is an error.
    optional: bool,
}

/// The host paths that go into every task's root.
///
/// ```
/// use drover_isolation::rootfs::ChrootEnv;
/// let env = ChrootEnv::default_list();
/// assert!(env.paths().iter().any(|(h, _)| h == std::path::Path::new("/usr")));
/// let map = [("/opt/tools".to_owned(), "/tools".to_owned())].into_iter().collect();
/// assert!(ChrootEnv::from_config(&map).is_ok());
/// let bad = [("/opt".to_owned(), "/proc".to_owned())].into_iter().collect();
/// assert!(ChrootEnv::from_config(&bad).unwrap_err().to_string().contains("/proc"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChrootEnv {
    entries: Vec<Entry>,
}

fn is_plain_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components().count() >= 2
        && p.components()
            .skip(1)
            .all(|c| matches!(c, Component::Normal(_)))
}

impl ChrootEnv {
    /// [`DEFAULT_CHROOT`], each at the same path inside.
    pub fn default_list() -> Self {
        ChrootEnv {
            entries: DEFAULT_CHROOT
                .iter()
                .map(|p| Entry {
                    host: p.into(),
                    inside: p.into(),
                    optional: true,
                })
                .collect(),
        }
    }

    /// The plugin config's `chroot_env` (host path → path inside), checked.
    pub fn from_config(map: &BTreeMap<String, String>) -> Result<Self, DriverError> {
        let mut entries = Vec::new();
        for (host, inside) in map {
            let (h, i) = (PathBuf::from(host), PathBuf::from(inside));
            if !is_plain_absolute(&h) || !is_plain_absolute(&i) {
                return Err(DriverError::InvalidConfig(format!(
                    "chroot_env: {host:?} = {inside:?}: both must be absolute paths below / \
                     without `..`"
                )));
            }
            if let Some(r) = RESERVED.iter().find(|r| i.starts_with(r)) {
                return Err(DriverError::InvalidConfig(format!(
                    "chroot_env: {inside:?} is inside {r}, which the driver provides itself"
                )));
            }
            entries.push(Entry {
                host: h,
                inside: i,
                optional: false,
            });
        }
        Ok(ChrootEnv { entries })
    }

    /// Add host paths a driver needs (the JVM for java), skipped when missing.
    pub fn with(mut self, extra: impl IntoIterator<Item = PathBuf>) -> Self {
        for p in extra {
            // Already visible through an entry that holds it (`/usr` holds `/usr/lib/jvm`).
            if !self.entries.iter().any(|e| p.starts_with(&e.inside)) {
                self.entries.push(Entry {
                    host: p.clone(),
                    inside: p,
                    optional: true,
                });
            }
        }
        self
    }

    /// (host path, path inside) of every entry.
    pub fn paths(&self) -> Vec<(PathBuf, PathBuf)> {
        self.entries
            .iter()
            .map(|e| (e.host.clone(), e.inside.clone()))
            .collect()
    }
}

/// Where the allocation's shared directory is inside a task's root.
pub const ALLOC_MOUNT_POINT: &str = "/alloc";

/// The root of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRoot {
    mounts: Vec<Mount>,
}

impl TaskRoot {
    /// The root of a task whose directory is `task_dir` (with `local/`, `secrets/`,
    /// `tmp/`), from `env`. A required `chroot_env` entry that is missing is an error
    /// naming it.
    pub fn build(env: &ChrootEnv, task_dir: &Path) -> Result<Self, DriverError> {
        let mut mounts = Vec::new();
        for e in &env.entries {
            if std::fs::symlink_metadata(&e.host).is_err() {
                if e.optional {
                    continue;
                }
                return Err(DriverError::InvalidConfig(format!(
                    "chroot_env: host path {} does not exist",
                    e.host.display()
                )));
            }
            mounts.push(Mount::bind(&e.host, &e.inside, true));
        }
        for sub in ["local", "secrets", "tmp"] {
            mounts.push(Mount::bind(task_dir.join(sub), format!("/{sub}"), false));
        }
        mounts.push(Mount::proc("/proc"));
        mounts.push(Mount::dev("/dev"));
        // Parents before children (`/etc` entries after nothing, `/usr` before
        // `/usr/lib/jvm`): a mount must not hide one made earlier.
        mounts.sort_by_key(|m| m.target.components().count());
        Ok(TaskRoot { mounts })
    }

    /// With the allocation's shared directory `alloc_dir` (the agent's
    /// `<alloc id>/alloc`, with `data/`, `logs/`, `tmp/`) bind-mounted read-write at
    /// `/alloc`; nothing for an empty path. The sandbox never follows a link in the
    /// source's place (a link is copied as a link, pointing nowhere in the root).
    ///
    /// ```
    /// use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
    /// use std::path::Path;
    /// let root = TaskRoot::build(&ChrootEnv::default_list(), Path::new("/srv/t1"))
    ///     .unwrap()
    ///     .with_alloc_dir(Path::new("/srv/a1/alloc"));
    /// assert_eq!(root.host_path(Path::new("/alloc/data/x")).unwrap(), Path::new("/srv/a1/alloc/data/x"));
    /// ```
    pub fn with_alloc_dir(mut self, alloc_dir: &Path) -> Self {
        if !alloc_dir.as_os_str().is_empty() {
            self.mounts
                .push(Mount::bind(alloc_dir, ALLOC_MOUNT_POINT, false));
            self.mounts.sort_by_key(|m| m.target.components().count());
        }
        self
    }

    /// With the task's host volumes bound at their destinations
    /// ([`MountKind::HostVolume`]: the volume's directory and the mount point are
    /// reached without following links). A destination that is one of the root's own
    /// mount points (`/proc`, `/dev`, `/local`, ...) or above one is refused.
    ///
    /// ```
    /// use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
    /// use drover_plugin_sdk::TaskVolume;
    /// use std::path::Path;
    /// let root = TaskRoot::build(&ChrootEnv::default_list(), Path::new("/srv/t1"))
    ///     .unwrap()
    ///     .with_volumes(&[TaskVolume::new("data", "/srv/data", "/data")])
    ///     .unwrap();
    /// assert_eq!(root.host_path(Path::new("/data/x")).unwrap(), Path::new("/srv/data/x"));
    /// assert!(TaskRoot::build(&ChrootEnv::default_list(), Path::new("/srv/t1"))
    ///     .unwrap()
    ///     .with_volumes(&[TaskVolume::new("data", "/srv/data", "/usr")])
    ///     .is_err());
    /// ```
    pub fn with_volumes(
        mut self,
        volumes: &[drover_plugin_sdk::TaskVolume],
    ) -> Result<Self, DriverError> {
        for v in volumes {
            let dest = &v.destination;
            let plain = dest.is_absolute()
                && dest.components().count() >= 2
                && dest
                    .components()
                    .skip(1)
                    .all(|c| matches!(c, Component::Normal(_)));
            if !plain || !v.host_path.is_absolute() {
                return Err(DriverError::InvalidConfig(format!(
                    "volume_mount of volume {:?}: destination {} must be an absolute path \
                     below / without `..` (and the volume's path absolute)",
                    v.name,
                    dest.display()
                )));
            }
            if let Some(m) = self.mounts.iter().find(|m| {
                m.target.starts_with(dest)
                    || (m.kind != MountKind::Bind && dest.starts_with(&m.target))
            }) {
                return Err(DriverError::InvalidConfig(format!(
                    "volume_mount of volume {:?}: destination {} would hide or go inside \
                     the task's {}: pick another path, e.g. /data",
                    v.name,
                    dest.display(),
                    m.target.display()
                )));
            }
            self.mounts
                .push(Mount::host_volume(&v.host_path, dest, v.read_only));
        }
        self.mounts.sort_by_key(|m| m.target.components().count());
        Ok(self)
    }

    /// With the device nodes a device plugin's reservation gave the task
    /// ([`MountKind::DeviceNode`]): each made in the task's `/dev` as the host node is,
    /// with only the permissions given. A task path outside `/dev`, or one of `/dev`'s
    /// own entries (`null`, `shm`, `fd`, ...), is refused.
    ///
    /// ```
    /// use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
    /// use drover_plugin_sdk::TaskDevice;
    /// use std::path::Path;
    /// let root = || TaskRoot::build(&ChrootEnv::default_list(), Path::new("/srv/t1")).unwrap();
    /// let r = root().with_devices(&[TaskDevice::new("/srv/nodes/zero0", "/dev/zero0")]).unwrap();
    /// assert!(r.mounts().iter().any(|m| m.target == Path::new("/dev/zero0")));
    /// assert!(root().with_devices(&[TaskDevice::new("/dev/sda", "/etc/sda")]).is_err());
    /// assert!(root().with_devices(&[TaskDevice::new("/dev/sda", "/dev/null")]).is_err());
    /// ```
    pub fn with_devices(
        mut self,
        devices: &[drover_plugin_sdk::TaskDevice],
    ) -> Result<Self, DriverError> {
        const DEV_OWN: [&str; 11] = [
            "null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout", "stderr",
            "shm",
        ];
        for d in devices {
            let t = &d.task_path;
            let below_dev = t.starts_with("/dev")
                && t.components().count() >= 3
                && t.components()
                    .skip(1)
                    .all(|c| matches!(c, Component::Normal(_)));
            let first = t.components().nth(2).map(|c| c.as_os_str().to_owned());
            let own = first.is_some_and(|f| DEV_OWN.iter().any(|o| f == *o));
            if !below_dev || own || !d.host_path.is_absolute() {
                return Err(DriverError::InvalidConfig(format!(
                    "device node {} (host {}): a device node is made below the task's \
                     /dev, not at one of its own entries, from an absolute host path",
                    t.display(),
                    d.host_path.display()
                )));
            }
            if self.mounts.iter().any(|m| m.target == *t) {
                return Err(DriverError::InvalidConfig(format!(
                    "device node {} is given twice",
                    t.display()
                )));
            }
            self.mounts
                .push(Mount::device_node(&d.host_path, t, &d.permissions));
        }
        self.mounts.sort_by_key(|m| m.target.components().count());
        Ok(self)
    }

    /// With the host paths a device plugin's reservation mounts into the task, bound
    /// at their task paths. A task path inside or above another of the root's mounts
    /// (a task's own directory could hold links there) is refused.
    ///
    /// ```
    /// use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
    /// use drover_plugin_sdk::TaskMount;
    /// use std::path::Path;
    /// let root = || TaskRoot::build(&ChrootEnv::default_list(), Path::new("/srv/t1")).unwrap();
    /// let r = root().with_device_mounts(&[TaskMount::new("/opt/acme", "/opt/acme")]).unwrap();
    /// assert_eq!(r.host_path(Path::new("/opt/acme/lib.so")).unwrap(), Path::new("/opt/acme/lib.so"));
    /// assert!(root().with_device_mounts(&[TaskMount::new("/opt/acme", "/local/acme")]).is_err());
    /// ```
    pub fn with_device_mounts(
        mut self,
        mounts: &[drover_plugin_sdk::TaskMount],
    ) -> Result<Self, DriverError> {
        for d in mounts {
            let t = &d.task_path;
            let plain = t.is_absolute()
                && t.components().count() >= 2
                && t.components()
                    .skip(1)
                    .all(|c| matches!(c, Component::Normal(_)));
            if !plain || !d.host_path.is_absolute() {
                return Err(DriverError::InvalidConfig(format!(
                    "device mount {} (host {}): paths must be absolute without `..`",
                    t.display(),
                    d.host_path.display()
                )));
            }
            if let Some(m) = self
                .mounts
                .iter()
                .find(|m| m.target.starts_with(t) || t.starts_with(&m.target))
            {
                return Err(DriverError::InvalidConfig(format!(
                    "device mount {} would hide or go inside the task's {}",
                    t.display(),
                    m.target.display()
                )));
            }
            self.mounts.push(Mount::bind(&d.host_path, t, d.read_only));
        }
        self.mounts.sort_by_key(|m| m.target.components().count());
        Ok(self)
    }

    /// The mounts for the executor.
    pub fn mounts(&self) -> Vec<Mount> {
        self.mounts.clone()
    }

    /// Where `inside` (an absolute path in the task's root) is on the host, if it is
    /// visible in the root at all.
    ///
    /// ```
    /// use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
    /// use std::path::Path;
    /// let root = TaskRoot::build(&ChrootEnv::default_list(), Path::new("/srv/t1")).unwrap();
    /// assert_eq!(root.host_path(Path::new("/local/app.jar")).unwrap(), Path::new("/srv/t1/local/app.jar"));
    /// assert_eq!(root.host_path(Path::new("/root/secret")), None);
    /// ```
    pub fn host_path(&self, inside: &Path) -> Option<PathBuf> {
        self.mount_of(inside).map(|(m, rest)| {
            if rest.as_os_str().is_empty() {
                m.source.clone()
            } else {
                m.source.join(rest)
            }
        })
    }

    /// The mount `inside` is under (the deepest), and the rest of the path below it.
    /// A path with `..` (or `.`) is under none: `/usr/../root` must not be taken for a
    /// path below `/usr`.
    fn mount_of<'a>(&self, inside: &'a Path) -> Option<(&Mount, &'a Path)> {
        if !inside
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        {
            return None;
        }
        self.mounts
            .iter()
            .filter(|m| {
                matches!(m.kind, MountKind::Bind | MountKind::HostVolume)
                    && inside.starts_with(&m.target)
            })
            .max_by_key(|m| m.target.components().count())
            .and_then(|m| Some((m, inside.strip_prefix(&m.target).ok()?)))
    }

    /// What `inside` (an absolute path in the task's root) is, looked at from the host
    /// without ever following a link a task could have planted. Below a mount whose
    /// contents a task controls (its own directories, the allocation's, a host volume,
    /// a writable device mount) the path is opened beneath that mount's directory with
    /// no link followed: `Ok(None)` when it goes through a link (not checked here: the
    /// task's own exec, inside its root, resolves it and says what is wrong), so a
    /// planted `local/x -> /root/secret` tells the task nothing about the host's files
    /// and a legitimate `local/venv/bin/python -> /usr/bin/python3` is not refused.
    /// Below the read-only host directories of the chroot list it is the host's own
    /// path. A path with `..` is under no mount (`NotFound`).
    ///
    /// ```
    /// use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
    /// use std::path::Path;
    /// let dir = tempfile::tempdir().unwrap();
    /// std::fs::create_dir(dir.path().join("local")).unwrap();
    /// std::fs::write(dir.path().join("local/app"), "#!/bin/sh\n").unwrap();
    /// std::os::unix::fs::symlink("/etc/passwd", dir.path().join("local/x")).unwrap();
    /// let root = TaskRoot::build(&ChrootEnv::default_list(), dir.path()).unwrap();
    /// assert!(root.metadata(Path::new("/local/app")).unwrap().unwrap().is_file());
    /// // A link in the task's directory is not followed from the host.
    /// assert!(root.metadata(Path::new("/local/x")).unwrap().is_none());
    /// assert!(root.metadata(Path::new("/local/missing")).is_err());
    /// assert!(root.metadata(Path::new("/usr/bin/env")).unwrap().unwrap().is_file());
    /// assert!(root.metadata(Path::new("/usr/../etc/passwd")).is_err());
    /// ```
    pub fn metadata(&self, inside: &Path) -> std::io::Result<Option<std::fs::Metadata>> {
        let not_in_root = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let (m, rest) = self.mount_of(inside).ok_or_else(not_in_root)?;
        let task_controlled = m.kind == MountKind::HostVolume || !m.read_only;
        if !task_controlled {
            return std::fs::metadata(m.source.join(rest)).map(Some);
        }
        use rustix::fs::{OFlags, ResolveFlags};
        let dir_flags = if m.kind == MountKind::HostVolume {
            // The volume's own path has no link in it (the agent checked, the sandbox
            // checks again when it mounts it).
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
        } else {
            ResolveFlags::NO_MAGICLINKS
        };
        let top = rustix::fs::openat2(
            rustix::fs::CWD,
            &m.source,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
            dir_flags,
        )?;
        let rel = if rest.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rest
        };
        match rustix::fs::openat2(
            &top,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => std::fs::File::from(fd).metadata().map(Some),
            Err(rustix::io::Errno::LOOP) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Check that `command` can be run in the root: an absolute path, one relative to
    /// `cwd`, or a name found in `path` (the task's `PATH`). Returns its path inside.
    pub fn find_command(
        &self,
        command: &str,
        cwd: &Path,
        path: &str,
    ) -> Result<PathBuf, DriverError> {
        let invalid = |m: String| DriverError::InvalidConfig(m);
        if command.contains('/') {
            let inside = if command.starts_with('/') {
                PathBuf::from(command)
            } else {
                cwd.join(command)
            };
            let host = self.host_path(&inside).ok_or_else(|| {
                invalid(format!(
                    "command {command:?} is not inside the task's root: {} is under no \
                     chroot_env entry and not in local/, secrets/ or tmp/",
                    inside.display()
                ))
            })?;
            return match executable(self.metadata(&inside)) {
                Ok(()) => Ok(inside),
                Err(why) => Err(invalid(format!(
                    "command {command:?} ({} on the host) {why}",
                    host.display()
                ))),
            };
        }
        for dir in path.split(':').filter(|d| d.starts_with('/')) {
            let inside = Path::new(dir).join(command);
            if executable(self.metadata(&inside)).is_ok() {
                return Ok(inside);
            }
        }
        Err(invalid(format!(
            "command {command:?} is not in the task's PATH ({path}) within its root"
        )))
    }
}

fn executable(meta: std::io::Result<Option<std::fs::Metadata>>) -> Result<(), &'static str> {
    let meta = match meta {
        // Through a link in a task's directory: the exec inside the root tells.
        Ok(None) => return Ok(()),
        Ok(Some(m)) => Ok(m),
        Err(e) => Err(e),
    };
    match meta {
        Err(_) => Err("does not exist"),
        Ok(m) if !m.is_file() => Err("is not a file"),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err("is not executable"),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_defaults_are_skipped_missing_configured_entries_refused() {
        let env = ChrootEnv::default_list().with([PathBuf::from("/nonexistent-jvm")]);
        let root = TaskRoot::build(&env, Path::new("/t")).unwrap();
        let targets: Vec<_> = root.mounts().into_iter().map(|m| m.target).collect();
        assert!(targets.contains(&PathBuf::from("/usr")));
        assert!(!targets.contains(&PathBuf::from("/nonexistent-jvm")));
        let map = [("/nonexistent".to_owned(), "/x".to_owned())]
            .into_iter()
            .collect();
        let env = ChrootEnv::from_config(&map).unwrap();
        let err = TaskRoot::build(&env, Path::new("/t"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent"), "{err}");
    }

    #[test]
    fn parents_are_mounted_first() {
        let map = [
            ("/usr/lib".to_owned(), "/usr/lib".to_owned()),
            ("/usr".to_owned(), "/usr".to_owned()),
        ]
        .into_iter()
        .collect();
        let root =
            TaskRoot::build(&ChrootEnv::from_config(&map).unwrap(), Path::new("/t")).unwrap();
        let targets: Vec<_> = root.mounts().into_iter().map(|m| m.target).collect();
        let at = |p: &str| targets.iter().position(|t| t == Path::new(p)).unwrap();
        assert!(at("/usr") < at("/usr/lib"));
    }

    #[test]
    fn commands_are_found_in_the_root_only() {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["local", "secrets", "tmp"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let script = dir.path().join("local/run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let root = TaskRoot::build(&ChrootEnv::default_list(), dir.path()).unwrap();
        let err = root
            .find_command("/local/run.sh", Path::new("/"), "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not executable"), "{err}");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            root.find_command("run.sh", Path::new("/"), "/local")
                .unwrap(),
            Path::new("/local/run.sh")
        );
        assert_eq!(
            root.find_command("./run.sh", Path::new("/local"), "")
                .unwrap(),
            Path::new("/local/run.sh")
        );
        assert!(
            root.find_command("sh", Path::new("/"), "/usr/bin:/bin")
                .is_ok()
        );
        let err = root
            .find_command("/root/x", Path::new("/"), "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not inside the task's root"), "{err}");
        let err = root
            .find_command("no-such-tool", Path::new("/"), "/usr/bin")
            .unwrap_err()
            .to_string();
        assert!(err.contains("PATH"), "{err}");
    }
}
