//! The fingerprint's checks: can this plugin really isolate a task here? Root, the
//! cgroup controllers (by creating and removing a probe cgroup), and the namespaces
//! (by creating them in a throwaway child).

use drover_plugin_sdk::{Fingerprint, Health};

use crate::cgroup::{self, Limits, Version};

/// Namespaces every task gets.
const NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET;

/// What the checks found: a fingerprint for `driver` (`exec`, `java`), whose
/// attribute keys are `driver.<driver>.*`. Blocking (it forks and touches cgroupfs):
/// run it from `spawn_blocking`.
pub fn isolation(driver: &str, cgroup_parent: &str) -> (Fingerprint, Option<Version>) {
    let euid = rustix::process::geteuid().as_raw();
    if euid != 0 {
        return (
            Fingerprint::not_ready(
                Health::Undetected,
                format!(
                    "{driver} needs root to create namespaces, cgroups and chroots, and the \
                     plugin runs as uid {euid}"
                ),
            ),
            None,
        );
    }
    let version = Version::detect();
    let missing = cgroup::missing_controllers(version);
    let unhealthy = |why: String| {
        Fingerprint::not_ready(Health::Unhealthy, why)
            .attribute(format!("driver.{driver}.cgroup_version"), version.name())
    };
    if !missing.is_empty() {
        return (
            unhealthy(format!(
                "cgroup {} controllers {} are not available",
                version.name(),
                missing.join(", ")
            )),
            Some(version),
        );
    }
    let probe = cgroup::open(
        version,
        cgroup_parent,
        &format!(".probe-{}", std::process::id()),
    );
    let created = probe.create(&Limits {
        pids: Some(16),
        ..Default::default()
    });
    let removed = probe.delete();
    if let Err(e) = created.and(removed) {
        return (
            unhealthy(format!("cannot create task cgroups: {e}")),
            Some(version),
        );
    }
    if let Err(e) = namespaces_usable() {
        return (
            unhealthy(format!("cannot create namespaces: {e}")),
            Some(version),
        );
    }
    (
        Fingerprint::healthy(format!(
            "ready: namespaces, chroot, cgroup {} and capabilities usable",
            version.name()
        ))
        .attribute(format!("driver.{driver}.cgroup_version"), version.name()),
        Some(version),
    )
}

/// Create the task namespaces in a child that exits at once.
fn namespaces_usable() -> Result<(), String> {
    // SAFETY: the child only makes raw system calls (unshare, _exit), which are
    // async-signal-safe, as required in the fork of a multi-threaded process.
    #[allow(unsafe_code)]
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("cannot fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; errno is this thread's.
        #[allow(unsafe_code)]
        unsafe {
            let code = if libc::unshare(NAMESPACES) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::_exit(code)
        }
    }
    match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
        Ok(nix::sys::wait::WaitStatus::Exited(_, errno)) => Err(format!(
            "unshare(mount, pid, ipc, uts, net): {}",
            std::io::Error::from_raw_os_error(errno)
        )),
        Ok(other) => Err(format!("the probe child ended unexpectedly: {other:?}")),
        Err(e) => Err(format!("cannot wait for the probe child: {e}")),
    }
}
