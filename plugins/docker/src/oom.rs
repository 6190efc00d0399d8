//! The container's OOM kills, read from its memory cgroup while it exists.
//!
//! Docker's `State.OOMKilled` comes from containerd's OOM event, and that event is lost
//! when it is late. dockerd takes the flag when it handles the exit event
//! (`libcontainerd`: `ei.OOMKilled = ctr.getOOMKilled()`), so an OOM event that arrives
//! after the exit no longer counts; and containerd's shim drops an OOM notification
//! whose cgroup has been deleted by then (containerd 1.6, `oom_v1.go`). On a loaded
//! machine the shim's OOM watcher runs late and both happen: the container is reported
//! dead with exit code 137 and `OOMKilled: false`.
//!
//! So the plugin watches the cgroup itself when it runs on the daemon's host: it asks
//! the kernel for the cgroup's OOM notifications (cgroup v1: an eventfd registered on
//! `memory.oom_control`; v2: inotify on `memory.events`) and reads the OOM-kill counter
//! at each one, until the cgroup is removed (which is notified too, and after which
//! its files can no longer be read). Nothing here polls.
//!
//! Inotify instances are scarce: `fs.inotify.max_user_instances` is 128 per user by
//! default, shared by every root daemon on the host. The watches hold at most
//! [`MAX_INOTIFY`] at once (a creation watcher between a container's create and the
//! start of its cgroup's watch; on cgroup v2 one per watched cgroup); past that a
//! container has no watch of its own and Docker's flag is all there is. A cgroup v1
//! watch uses an eventfd, no inotify instance.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the watch has seen so far.
pub(crate) struct OomWatch {
    killed: AtomicBool,
    /// The cgroup is gone (or the watch stopped): `killed` is final.
    done: watch::Sender<bool>,
    /// Stops the watch (the task is gone, or its container never started).
    cancel: CancellationToken,
}

impl OomWatch {
    /// Whether the cgroup recorded an OOM kill, once the watch is final or `limit` has
    /// passed: the container's exit is reported after its cgroup is removed, and the
    /// removal is notified, so the wait is normally short.
    pub(crate) async fn killed_within(&self, limit: Duration) -> bool {
        if !self.killed.load(Ordering::Acquire) {
            let mut done = self.done.subscribe();
            let _ = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
        }
        self.killed.load(Ordering::Acquire)
    }

    fn finish(&self) {
        self.done.send_replace(true);
    }

    /// Stop watching.
    pub(crate) fn stop(&self) {
        self.cancel.cancel();
    }
}

/// Which cgroup version the container's memory controller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// The container's memory cgroup directory: from the cgroup of `pid` (the container's
/// init, as the daemon reports it) if it still runs, else from Docker's own naming
/// ([`cgroup_candidates`]).
fn find_cgroup(pid: i64, cid: &str, cgroup_parent: &str) -> Option<(Version, PathBuf)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (version, mount) = memory_hierarchy(&mountinfo)?;
    if pid > 0
        && let Ok(own) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
    {
        let (v1, v2) = memory_paths(&own);
        let path = match version {
            Version::V1 => v1,
            Version::V2 => v2,
        };
        if let Some(p) = path {
            let dir = mount.join(p.trim_start_matches('/'));
            if dir.is_dir() {
                return Some((version, dir));
            }
        }
    }
    cgroup_candidates(cid, cgroup_parent)
        .into_iter()
        .find(|(_, d)| d.is_dir())
}

/// The hierarchy the memory controller is on: the v1 one if there is one (a v2 mount
/// next to it, as on hybrid hosts, has no memory controller), else the v2 one.
fn memory_hierarchy(mountinfo: &str) -> Option<(Version, PathBuf)> {
    match memory_mounts(mountinfo) {
        (Some(v1), _) => Some((Version::V1, v1)),
        (None, Some(v2)) => Some((Version::V2, v2)),
        (None, None) => None,
    }
}

/// Mount points of the cgroup v1 hierarchy with the memory controller and of the
/// cgroup v2 hierarchy, from `/proc/self/mountinfo`.
fn memory_mounts(mountinfo: &str) -> (Option<PathBuf>, Option<PathBuf>) {
    let mut v1 = None;
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        // A mount of a sub-directory of the hierarchy (root other than /) would
        // need the path translated; the host's own mounts are of the root.
        let (Some(root), Some(point), Some(fstype)) = (left.get(3), left.get(4), right.first())
        else {
            continue;
        };
        if *root != "/" {
            continue;
        }
        let super_opts = right.get(2).copied().unwrap_or("");
        match *fstype {
            "cgroup" if super_opts.split(',').any(|o| o == "memory") => {
                v1.get_or_insert_with(|| PathBuf::from(point));
            }
            "cgroup2" => {
                v2.get_or_insert_with(|| PathBuf::from(point));
            }
            _ => {}
        }
    }
    (v1, v2)
}

/// The memory cgroup paths (v1, v2) in a `/proc/PID/cgroup`.
fn memory_paths(text: &str) -> (Option<&str>, Option<&str>) {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    (v1, v2)
}

/// The value of `key` in a `key value` per line cgroup file.
fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Whether the stats file says the cgroup OOM-killed a process (or is in the middle of
/// an OOM: v1 notifies before the kill). `None`: it can no longer be read (removed).
fn oom_seen(version: Version, stats: &File) -> Option<bool> {
    let mut buf = [0u8; 512];
    let n = rustix::io::pread(stats, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let kills = counter(text, "oom_kill").unwrap_or(0);
    let under = version == Version::V1 && counter(text, "under_oom") == Some(1);
    Some(kills > 0 || under)
}

/// The most inotify instances the OOM watches of this plugin hold at once.
pub(crate) const MAX_INOTIFY: usize = 16;

/// Inotify instances held now (see [`Inotify`]).
static INOTIFY_HELD: AtomicUsize = AtomicUsize::new(0);

/// One of the [`MAX_INOTIFY`] inotify instances; given back when dropped.
struct Inotify(OwnedFd);

impl Inotify {
    /// A new instance, or an error when [`MAX_INOTIFY`] are held already.
    fn new() -> std::io::Result<Inotify> {
        use rustix::fs::inotify;
        INOTIFY_HELD
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_INOTIFY).then_some(n + 1)
            })
            .map_err(|n| {
                std::io::Error::other(format!(
                    "the plugin's OOM watches hold {n} inotify instances already, their limit"
                ))
            })?;
        match inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK) {
            Ok(fd) => Ok(Inotify(fd)),
            Err(e) => {
                INOTIFY_HELD.fetch_sub(1, Ordering::AcqRel);
                Err(e.into())
            }
        }
    }
}

impl Drop for Inotify {
    fn drop(&mut self) {
        INOTIFY_HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AsRawFd for Inotify {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for Inotify {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// What tells of the cgroup's OOM events: an eventfd (v1) or an inotify instance (v2).
enum Notifier {
    Event(OwnedFd),
    Inotify(Inotify),
}

impl AsRawFd for Notifier {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Notifier::Event(fd) => fd.as_raw_fd(),
            Notifier::Inotify(i) => i.as_raw_fd(),
        }
    }
}

impl AsFd for Notifier {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Notifier::Event(fd) => fd.as_fd(),
            Notifier::Inotify(i) => i.as_fd(),
        }
    }
}

/// A notifier for the cgroup's OOM events and the stats file to read at each one.
fn register(version: Version, dir: &Path) -> std::io::Result<(Notifier, File)> {
    match version {
        Version::V1 => {
            let stats = File::open(dir.join("memory.oom_control"))?;
            let efd = rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?;
            let mut control = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.event_control"))?;
            // One write: the kernel parses each write to a cgroup file on its own.
            let line = format!("{} {}", efd.as_fd().as_raw_fd(), stats.as_raw_fd());
            control.write_all(line.as_bytes())?;
            Ok((Notifier::Event(efd), stats))
        }
        Version::V2 => {
            use rustix::fs::inotify;
            let stats = File::open(dir.join("memory.events"))?;
            let ifd = Inotify::new()?;
            // MODIFY: a counter changed; the watch's removal (IN_IGNORED) wakes the
            // reader as well when the cgroup goes.
            inotify::add_watch(&ifd, dir.join("memory.events"), inotify::WatchFlags::MODIFY)?;
            Ok((Notifier::Inotify(ifd), stats))
        }
    }
}

/// Make the fd an [`AsyncFd`].
fn async_fd<T: AsRawFd>(fd: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `register` requires the fd to stay open while registered. The owner is
    // moved into the AsyncFd, which deregisters it before dropping (closing) it.
    #[allow(unsafe_code)]
    unsafe {
        AsyncFd::register(fd).map_err(std::io::Error::from)
    }
}

fn new_watch(cancel: &CancellationToken) -> Arc<OomWatch> {
    Arc::new(OomWatch {
        killed: AtomicBool::new(false),
        done: watch::channel(false).0,
        cancel: cancel.clone(),
    })
}

/// Where the cgroup of container `cid` will be, per hierarchy and cgroup driver.
fn cgroup_candidates(cid: &str, cgroup_parent: &str) -> Vec<(Version, PathBuf)> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let Some((version, mount)) = memory_hierarchy(&mountinfo) else {
        return Vec::new();
    };
    let parent = if cgroup_parent.is_empty() {
        "/docker"
    } else {
        cgroup_parent
    };
    [
        format!("{}/{cid}", parent.trim_matches('/')),
        format!("system.slice/docker-{cid}.scope"),
    ]
    .iter()
    .map(|n| (version, mount.join(n)))
    .collect()
}

/// Arm the watch of container `cid` (created, not yet started) before its start: the
/// kernel is asked to report the creation of its cgroup (inotify on the directories
/// it will appear in), and the OOM notification is registered as soon as it exists,
/// before the container's process runs. A container that is OOM killed at once and
/// whose cgroup Docker removes before the start call even returns is covered too.
/// `None` when no such directory exists (no daemon on this host, or not yet any
/// container on it; the watch then starts after the start, see [`watch`]).
pub(crate) fn arm(cid: &str, cgroup_parent: &str) -> Option<Arc<OomWatch>> {
    use rustix::fs::inotify;
    let candidates = cgroup_candidates(cid, cgroup_parent);
    let ifd = Inotify::new()
        .map_err(|e| tracing::debug!(container = cid, "no OOM watch before the start: {e}"))
        .ok()?;
    let mut watched = 0;
    for (_, dir) in &candidates {
        if let Some(parent) = dir.parent()
            && inotify::add_watch(&ifd, parent, inotify::WatchFlags::CREATE).is_ok()
        {
            watched += 1;
        }
    }
    if watched == 0 {
        return None;
    }
    let ifd = async_fd(ifd).ok()?;
    let watch = new_watch(&CancellationToken::new());
    let w = watch.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let found = loop {
            // Looked for after the watches are in place: a creation in between is
            // seen here, a later one wakes the loop.
            if let Some((version, dir)) = candidates.iter().find(|(_, d)| d.is_dir()) {
                break Some((*version, dir));
            }
            let mut ready = tokio::select! {
                r = ifd.readable() => match r {
                    Ok(r) => r,
                    Err(_) => break None,
                },
                () = w.cancel.cancelled() => break None,
            };
            match rustix::io::read(ifd.get_ref(), &mut buf) {
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                Err(_) => break None,
            }
        };
        // The creation watcher is done with: it is not held for the container's life.
        drop(ifd);
        if let Some((version, dir)) = found {
            follow(version, dir, &w).await;
        }
        w.finish();
    });
    Some(watch)
}

/// Start watching the memory cgroup of a running container `cid` (init `pid`,
/// `cgroup_parent` as the container was created with): for a recovered task, or when
/// [`arm`] could not be. `None` when the cgroup cannot be found or watched (a daemon on
/// another host, in another cgroup namespace, a container already removed): Docker's
/// own flag is all there is then.
pub(crate) fn watch(pid: i64, cid: &str, cgroup_parent: &str) -> Option<Arc<OomWatch>> {
    let (version, dir) = find_cgroup(pid, cid, cgroup_parent)?;
    let watch = new_watch(&CancellationToken::new());
    let w = watch.clone();
    tokio::spawn(async move {
        follow(version, &dir, &w).await;
        w.finish();
    });
    Some(watch)
}

/// Follow the cgroup at `dir` until it is removed, recording an OOM kill in `watch`.
async fn follow(version: Version, dir: &Path, watch: &OomWatch) {
    let (notifier, stats) = match register(version, dir).and_then(|(n, s)| Ok((async_fd(n)?, s))) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(cgroup = %dir.display(), "cannot watch for OOM kills: {e}");
            return;
        }
    };
    // An OOM kill before the registration was notified to nobody: read it now.
    match oom_seen(version, &stats) {
        Some(true) => watch.killed.store(true, Ordering::Release),
        Some(false) => {}
        None => return,
    }
    // cgroup v1 counts on the eventfd: each OOM notification adds one, and the
    // removal of the cgroup adds one more. When the counter could not be read in time
    // (the cgroup went before the stats file was read), the count still tells.
    let mut signals = 0u64;
    let mut buf = [0u8; 4096];
    loop {
        let mut ready = tokio::select! {
            r = notifier.readable() => match r {
                Ok(r) => r,
                Err(_) => return,
            },
            () = watch.cancel.cancelled() => return,
        };
        match rustix::io::read(notifier.get_ref(), &mut buf) {
            Ok(n) => {
                if version == Version::V1 && n == 8 {
                    let mut count = [0u8; 8];
                    count.copy_from_slice(&buf[..8]);
                    signals += u64::from_ne_bytes(count);
                }
            }
            Err(rustix::io::Errno::AGAIN) => {
                ready.clear_ready();
                continue;
            }
            Err(_) => return,
        }
        match oom_seen(version, &stats) {
            Some(true) => watch.killed.store(true, Ordering::Release),
            Some(false) => {}
            // The cgroup is gone: nothing more can happen in it.
            None => {
                if version == Version::V1 && signals >= 2 {
                    watch.killed.store(true, Ordering::Release);
                } else if version == Version::V1 && signals == 1 {
                    // One signal: the removal, or an OOM notification whose removal
                    // signal is still on its way (the kernel sends it from a work
                    // queue once the cgroup is offline). A second one settles it.
                    let more = tokio::time::timeout(REMOVAL_SIGNAL, notifier.readable()).await;
                    if more.is_ok() && rustix::io::read(notifier.get_ref(), &mut buf).is_ok() {
                        watch.killed.store(true, Ordering::Release);
                    }
                }
                return;
            }
        }
    }
}

/// How long the kernel's removal signal of a cgroup v1 event may take after the
/// cgroup's files are gone.
const REMOVAL_SIGNAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_memory_hierarchies_and_paths() {
        let mountinfo = "\
25 1 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
30 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
31 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
40 1 0:28 /docker /mnt/sub rw - cgroup cgroup rw,memory";
        let (v1, v2) = memory_mounts(mountinfo);
        assert_eq!(v1.unwrap(), Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(v2.unwrap(), Path::new("/sys/fs/cgroup/unified"));

        let own = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n";
        assert_eq!(memory_paths(own), (Some("/docker/abc"), Some("/")));
        assert_eq!(
            memory_paths("0::/system.slice/docker-abc.scope\n"),
            (None, Some("/system.slice/docker-abc.scope"))
        );
    }

    #[test]
    fn reads_the_oom_counters() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(counter(v1, "oom_kill"), Some(2));
        assert_eq!(counter(v1, "oom_kill_disable"), Some(0));
        let v2 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\noom_group_kill 0\n";
        assert_eq!(counter(v2, "oom_kill"), Some(0));
        assert_eq!(counter(v2, "oom"), Some(1));
        assert_eq!(counter(v2, "nope"), None);
    }

    /// The inotify instances this process holds.
    fn own_inotify_instances() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.as_os_str() == "anon_inode:inotify")
            .count()
    }

    /// A memory cgroup made for the test (root, on the host's memory hierarchy), with
    /// whatever was made in it removed at the end.
    struct TestCgroup {
        name: String,
        dir: PathBuf,
        version: Version,
    }

    impl TestCgroup {
        fn new() -> TestCgroup {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let (version, mount) = memory_hierarchy(&mountinfo)
                .expect("no memory cgroup hierarchy on this host: the test needs one");
            let name = format!("drover-oom-test-{}", std::process::id());
            let dir = mount.join(&name);
            std::fs::create_dir(&dir).unwrap_or_else(|e| {
                panic!("making the cgroup {} (run as root): {e}", dir.display())
            });
            TestCgroup { name, dir, version }
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            if let Ok(children) = std::fs::read_dir(&self.dir) {
                for c in children.flatten() {
                    if c.path().is_dir() {
                        let _ = std::fs::remove_dir(c.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    /// The watcher of a container's cgroup creation is let go once the cgroup exists
    /// (it was held for the container's life), and the watches never hold more than
    /// `MAX_INOTIFY` inotify instances (root has 128 for the whole host). One test:
    /// both count this process's instances.
    #[tokio::test]
    async fn inotify_instances_are_let_go_and_bounded() {
        let cg = TestCgroup::new();
        let before = own_inotify_instances();
        let w = arm("c0", &cg.name).expect("the parent cgroup exists: the watch is armed");
        assert_eq!(own_inotify_instances(), before + 1);
        // The container's cgroup appears: the watch moves on to it.
        std::fs::create_dir(cg.dir.join("c0")).unwrap();
        let following = before + usize::from(cg.version == Version::V2);
        drover_test_support::until(
            Duration::from_secs(5),
            "the creation watcher to be closed once the cgroup exists",
            || own_inotify_instances() == following,
        )
        .await;
        // It follows the cgroup until it goes.
        assert!(!*w.done.subscribe().borrow());
        std::fs::remove_dir(cg.dir.join("c0")).unwrap();
        drover_test_support::within(
            Duration::from_secs(5),
            "the watch to end with its cgroup",
            async {
                let _ = w.done.subscribe().wait_for(|d| *d).await;
            },
        )
        .await;
        assert!(!w.killed_within(Duration::ZERO).await);
        drover_test_support::until(
            Duration::from_secs(5),
            "the watch's instances to be closed",
            || own_inotify_instances() == before,
        )
        .await;

        // Many containers being created at once: at most MAX_INOTIFY instances.
        let armed: Vec<_> = (0..MAX_INOTIFY + 8)
            .filter_map(|i| arm(&format!("n{i}"), &cg.name))
            .collect();
        assert_eq!(armed.len(), MAX_INOTIFY);
        assert_eq!(own_inotify_instances(), before + MAX_INOTIFY);
        for w in &armed {
            w.stop();
        }
        drover_test_support::until(
            Duration::from_secs(5),
            "the stopped watches' instances to be closed",
            || own_inotify_instances() == before,
        )
        .await;
        assert!(
            arm("again", &cg.name).is_some(),
            "an instance is free again"
        );
    }
}
