//! Named network namespaces, the way `ip netns` keeps them: a namespace is kept alive
//! by a bind mount of its `/proc/.../ns/net` file on `<dir>/<name>` (so it outlives the
//! thread that made it, and the agent), and `<dir>` itself is a shared mount point, so
//! that removing the mount reaches every mount namespace that has a copy of it.

use std::io;
use std::path::{Path, PathBuf};

use rustix::mount::{MountPropagationFlags, UnmountFlags};

/// Where `ip netns` keeps its namespaces.
pub const DEFAULT_DIR: &str = "/run/netns";

/// Make `dir` (created if missing) a shared mount point, as `ip netns add` does.
fn ensure_shared_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let shared = MountPropagationFlags::SHARED | MountPropagationFlags::REC;
    match rustix::mount::mount_change(dir, shared) {
        Ok(()) => Ok(()),
        // Not a mount point yet: make it one (a bind mount on itself), then share it.
        Err(rustix::io::Errno::INVAL) => {
            rustix::mount::mount_bind(dir, dir)?;
            rustix::mount::mount_change(dir, shared)?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Create the network namespace `<dir>/<name>`; its path. An existing one of that
/// name is an error ([`io::ErrorKind::AlreadyExists`]).
pub fn create(dir: &Path, name: &str) -> io::Result<PathBuf> {
    ensure_shared_dir(dir)?;
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let target = path.clone();
    // A thread of its own enters the new namespace, so that no other thread of the
    // agent ever runs in it; the bind mount keeps the namespace once the thread ends.
    let made = std::thread::Builder::new()
        .name("netns-create".into())
        .spawn(move || -> io::Result<()> {
            // SAFETY: CLONE_NEWNET only, in a thread that does nothing else: it shares
            // no file table change with other threads (no CLONE_FILES), and ends right
            // after the mount below.
            #[allow(unsafe_code)]
            unsafe {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET)?;
            }
            let me = format!(
                "/proc/self/task/{}/ns/net",
                rustix::thread::gettid().as_raw_nonzero()
            );
            rustix::mount::mount_bind(me.as_str(), &target)?;
            Ok(())
        })?
        .join()
        .map_err(|_| io::Error::other("the thread creating the namespace panicked"))?;
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

/// Whether `path` is a namespace mount (rather than a leftover empty file).
pub fn is_mounted(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // The bind-mounted nsfs file is on another device than its directory.
    match (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) {
        (Ok(f), Some(Ok(d))) => f.dev() != d.dev(),
        _ => false,
    }
}

/// Remove the namespace at `path`: unmount it and delete the file. Gone already is
/// not an error. The namespace itself (and the interfaces in it) ends once nothing
/// else holds it (no process in it).
pub fn remove(path: &Path) -> io::Result<()> {
    match rustix::mount::unmount(path, UnmountFlags::DETACH) {
        Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
