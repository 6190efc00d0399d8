//! Removing the socket (and its directory, if that is left empty) of a plugin that
//! has exited: one that exits cleanly removes them itself, but a killed or crashed
//! one cannot, and without this every such plugin leaves a `drover-plugin-*`
//! directory in the temp dir.
//!
//! The path comes from the plugin's handshake line, so it is not trusted. A plugin
//! that runs with less privilege than its host (a wrapper that drops its uid, a
//! sandbox) must not be able to make the host delete anything of the host's:
//! - only a path with no `.`, `..` or symbolic link in it is looked at, and for a
//!   launched plugin only one in the socket directory the host gave it (or the host's
//!   temp dir), directly or in one directory of its own there;
//! - every step after that is relative to descriptors of the directories, so the
//!   plugin cannot swap a link in between the checks and the removal (directories
//!   are opened with [`Dir`](crate::taskdir::Dir), as task dirs are);
//! - only a unix socket owned by this user is removed, only while nothing listens on
//!   it (a dead plugin's socket refuses connections; a live one, even one that some
//!   other plugin named, is left alone), and only if it is still the very socket
//!   that was checked (device and inode);
//! - its directory only if it is named as an SDK plugin names it (`drover-plugin-*`),
//!   only with `rmdir`, which removes nothing but an empty directory, and again only
//!   if it is still the directory the socket was found in.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd as _};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use rustix::fs::{AtFlags, FileType};

use crate::handshake::PluginAddr;
use crate::taskdir::Dir;

/// Remove the socket at `addr` of a plugin that has exited, if it is dead and safe to
/// remove (see the [module docs](self)). `within`: the directory the socket must be
/// in (directly, or in a directory of its own there); `None` for a plugin the host
/// did not launch (reattached), whose socket may be anywhere without a link. Either
/// way its directory goes too only if it is an SDK plugin's `drover-plugin-*`.
pub(super) async fn remove_dead_socket(addr: &PluginAddr, within: Option<&Path>) {
    let PluginAddr::Unix(path) = addr else {
        return;
    };
    let Some(socket) = DeadSocket::find(path, within) else {
        return;
    };
    // Through the directory's descriptor, not the plugin's path. Non-blocking: a live
    // listener with a full backlog would block a plain connect.
    let through_fd = socket.path_through_fd();
    match tokio::time::timeout(
        Duration::from_millis(200),
        tokio::net::UnixStream::connect(&through_fd),
    )
    .await
    {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        _ => return,
    }
    socket.remove();
}

/// A socket found safe to look at, with descriptors of the directories it is in.
struct DeadSocket {
    /// The directory the socket is in.
    dir: Dir,
    name: OsString,
    /// Device and inode of the socket as checked.
    id: (u64, u64),
    /// The directory `dir` is in, and `dir`'s name there, when `dir` is the plugin's
    /// own directory (to be removed if left empty).
    own_dir: Option<(Dir, OsString)>,
}

impl DeadSocket {
    fn find(path: &Path, within: Option<&Path>) -> Option<DeadSocket> {
        if !path.is_absolute()
            || !path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        {
            return None;
        }
        let name = path.file_name()?.to_owned();
        let parent = path.parent()?;
        let (dir, own_dir) = match within {
            Some(root) => {
                // The host chose `root`; a link in it is the host's own business.
                let rest = parent.strip_prefix(root).ok()?;
                let root = Dir::open(root).ok()?;
                let mut parts = rest.components();
                match (parts.next(), parts.next()) {
                    (None, _) => (root, None),
                    (Some(Component::Normal(own)), None) => {
                        let dir = root.open_dir(own).ok()?;
                        let own_dir = sdk_socket_dir(own).then(|| (root, own.to_owned()));
                        (dir, own_dir)
                    }
                    _ => return None,
                }
            }
            None => {
                let own = parent.file_name()?.to_owned();
                let grand = parent.parent()?.strip_prefix("/").ok()?;
                // Beneath "/", through no link of any kind.
                let grand = Dir::open("/").ok()?.open_dir(grand).ok()?;
                let dir = grand.open_dir(&own).ok()?;
                let ours = sdk_socket_dir(&own);
                (dir, ours.then_some((grand, own)))
            }
        };
        let id = socket_id(&dir, &name)?;
        Some(DeadSocket {
            dir,
            name,
            id,
            own_dir,
        })
    }

    /// `/proc/self/fd/N/NAME`: the socket reached through `dir`'s descriptor.
    fn path_through_fd(&self) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_fd().as_raw_fd()));
        p.push(&self.name);
        p
    }

    fn remove(self) {
        // Still the socket that was checked and found dead.
        if socket_id(&self.dir, &self.name) != Some(self.id)
            || rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty()).is_err()
        {
            return;
        }
        let Some((parent, own)) = &self.own_dir else {
            return;
        };
        let Ok(st) = rustix::fs::fstat(&self.dir) else {
            return;
        };
        let still_ours = rustix::fs::statat(parent, own.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|now| {
                FileType::from_raw_mode(now.st_mode) == FileType::Directory
                    && (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
            });
        if still_ours {
            let _ = rustix::fs::unlinkat(parent, own.as_os_str(), AtFlags::REMOVEDIR);
        }
    }
}

/// Whether a directory named `name` is one an SDK plugin makes for its socket: only
/// such a directory goes with the socket (a plugin could otherwise name a socket in,
/// say, `/tmp/.X11-unix` and have the host remove that directory once empty).
fn sdk_socket_dir(name: &OsStr) -> bool {
    name.as_encoded_bytes()
        .starts_with(crate::server::SOCKET_DIR_PREFIX.as_bytes())
}

/// Device and inode of `name` in `dir` if it is a unix socket owned by this user.
fn socket_id(dir: &Dir, name: &OsStr) -> Option<(u64, u64)> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    (FileType::from_raw_mode(st.st_mode) == FileType::Socket
        && st.st_uid == rustix::process::geteuid().as_raw())
    .then_some((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead socket, bound and closed: connecting to it is refused.
    fn dead_socket(path: &Path) {
        drop(std::os::unix::net::UnixListener::bind(path).unwrap());
    }

    fn addr(path: &Path) -> PluginAddr {
        PluginAddr::Unix(path.to_owned())
    }

    #[tokio::test]
    async fn a_dead_socket_and_its_emptied_directory_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let own = root.path().join("drover-plugin-x");
        std::fs::create_dir(&own).unwrap();
        let sock = own.join("plugin.sock");
        dead_socket(&sock);
        remove_dead_socket(&addr(&sock), Some(root.path())).await;
        assert!(!own.exists(), "the socket's directory is left");
        // In a directory of another name: the socket only, the directory stays.
        let other = root.path().join(".X11-unix");
        std::fs::create_dir(&other).unwrap();
        let sock = other.join("X0");
        dead_socket(&sock);
        remove_dead_socket(&addr(&sock), Some(root.path())).await;
        assert!(!sock.exists());
        assert!(other.exists(), "a directory not a plugin's was removed");
        // Directly in the socket dir (go-plugin's layout): the socket only.
        let sock = root.path().join("plugin123");
        dead_socket(&sock);
        remove_dead_socket(&addr(&sock), Some(root.path())).await;
        assert!(!sock.exists());
        assert!(root.path().exists());
        // A reattached plugin's: anywhere, without links; its directory only if it
        // is named as the SDK names it.
        std::fs::create_dir(&own).unwrap();
        let sock = own.join("plugin.sock");
        dead_socket(&sock);
        remove_dead_socket(&addr(&sock), None).await;
        assert!(!own.exists());
        let other = root.path().join("elsewhere");
        std::fs::create_dir(&other).unwrap();
        let sock = other.join("x.sock");
        dead_socket(&sock);
        remove_dead_socket(&addr(&sock), None).await;
        assert!(!sock.exists());
        assert!(other.exists(), "a directory not the plugin's was removed");
    }

    #[tokio::test]
    async fn a_live_socket_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let sock = root.path().join("plugin.sock");
        let _live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        remove_dead_socket(&addr(&sock), Some(root.path())).await;
        assert!(sock.exists());
    }

    /// The plugin names its socket through a link it repointed at a directory of the
    /// host's, or outside the directory it was given: nothing there is touched.
    #[tokio::test]
    async fn a_path_through_a_link_or_outside_the_socket_dir_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        let sock = victim.path().join("plugin.sock");
        dead_socket(&sock);
        let link = root.path().join("link");
        std::os::unix::fs::symlink(victim.path(), &link).unwrap();
        let through = link.join("plugin.sock");
        remove_dead_socket(&addr(&through), Some(root.path())).await;
        remove_dead_socket(&addr(&through), None).await;
        let dotdot = root.path().join("x/../link/plugin.sock");
        remove_dead_socket(&addr(&dotdot), None).await;
        // Outside the socket dir, or two directories down in it.
        remove_dead_socket(&addr(&sock), Some(root.path())).await;
        let deep = root.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        dead_socket(&deep.join("plugin.sock"));
        remove_dead_socket(&addr(&deep.join("plugin.sock")), Some(root.path())).await;
        assert!(sock.exists(), "a socket reached through a link was removed");
        assert!(deep.join("plugin.sock").exists());
        // A regular file of that name is never a socket to remove.
        let file = root.path().join("file");
        std::fs::write(&file, "x").unwrap();
        remove_dead_socket(&addr(&file), Some(root.path())).await;
        assert!(file.exists());
    }
}
