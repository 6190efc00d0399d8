//! # drover-isolation
//!
//! The sandbox of Drover's isolated drivers (exec, java): a task runs as a process
//! contained for real, without a container image.
//!
//! - namespaces: mount, pid, ipc and uts always; network with `network_mode = "none"`;
//! - a root built on a tmpfs from a list of host paths bound read-only
//!   ([`rootfs::DEFAULT_CHROOT`] or the plugin's `chroot_env`), the task directory's
//!   `local/`, `secrets/` and `tmp/` writable, a fresh `/proc` and a minimal `/dev`,
//!   entered with `pivot_root`;
//! - a cgroup (v1 or v2, through cgroups-rs) at `<cgroup_parent>/<task id>`: memory
//!   limit (an OOM kill is reported with `oom_killed`), CPU shares and quota, pids
//!   limit; stats come from it, and DestroyTask kills every process in it even when
//!   the task's executor is gone;
//! - capabilities: a bounding set from a default allowlist, `cap_add` checked against
//!   the plugin's `allow_caps`, `cap_drop`; `no_new_privs` always;
//! - a seccomp filter in the spirit of Docker's default profile ([`seccomp`]),
//!   installed last, right before `exec`; relaxable per plugin (`seccomp`,
//!   `seccomp_allow`);
//! - a user (default `nobody`; root only where the plugin's `user_denylist` allows
//!   it) and rlimits;
//! - default resources for a task that gives none: 300 MiB of memory, 100 CPU
//!   shares, 1024 pids ([`engine::DEFAULT_MEMORY_MB`] and neighbours).
//!
//! Each task is owned by an executor process (`drover-executor`), which applies the
//! isolation between fork and exec through [`LinuxSandbox`] and runs a small init as
//! pid 1 of the task's pid namespace: a driver built on this crate passes it to
//! `drover_executor::run_if_executor` first thing in `main`. The [`engine`] is generic over a [`engine::Flavor`]: exec and java are
//! two flavors of one [`IsolatedDriver`], each with its own task configuration.
#![warn(missing_docs)]

pub mod caps;
// Moved to drover-executor (rawexec tasks get a cgroup too); re-exported so that
// `drover_isolation::cgroup` and `crate::cgroup` keep working.
pub use drover_executor::cgroup;
mod config;
pub mod engine;
pub mod exec;
mod handle;
mod probe;
pub mod rootfs;
mod sandbox;
pub mod seccomp;
mod store;
pub mod user;

pub use config::{IsolationConfig, NamespaceMode, NetworkMode, PluginConfig, RlimitConfig};
pub use engine::{
    CommandLine, DEFAULT_CGROUP_PARENT, DEFAULT_PATH, Flavor, HANDLE_VERSION, IsolatedDriver,
    TaskContext,
};
pub use sandbox::LinuxSandbox;
