//! # drover-driver-docker
//!
//! The `docker` task driver: runs each task as a Docker container through the Docker
//! Engine API (bollard), on a daemon reached over its unix socket (or TCP).
//!
//! - **Start**: the image is made present (loaded from a tarball in the task directory,
//!   or pulled when missing or when `force_pull`, bounded by `pull_timeout`), the
//!   container is created with Drover labels (`drover.task_id`, `drover.task_name`,
//!   `drover.alloc_dir`) and started. The task handle holds the container id.
//! - **Exit**: the container's wait endpoint and its state give the exit code and the
//!   OOM flag; on the daemon's host the plugin also watches the container's memory
//!   cgroup for OOM kills, which Docker misses when its OOM event comes late (`oom`).
//!   **Stop** sends the signal, then SIGKILL after the timeout.
//! - **Logs**: the container's stdout and stderr are copied into the task's rotated log
//!   files; a cursor next to them lets a new plugin process continue exactly where the
//!   last one stopped.
//! - **Recovery**: `RecoverTask` re-attaches to the container by id (or, without a
//!   handle, by its task-id label): exit watching, logs and stats resume. Containers of
//!   this agent that no task owns are reported, and removed if configured.
//! - **Fingerprint**: healthy with the engine's version when the daemon answers,
//!   unhealthy with the reason when it does not, and healthy again by itself.
//!
//! The crate is a library (so the `drover` binary can link it and re-execute itself as
//! the driver) plus a one-line `main.rs`:
//!
//! ```no_run
//! drover_plugin_sdk::serve(drover_driver_docker::DockerDriver::new())
//! ```
//!
//! Layout: [`driver`](DockerDriver) (the trait impl), `config` (plugin and task config,
//! and the container they make), `engine` (the daemon connection and error mapping),
//! `handle` (one task: exit watching and stats), `logs` (the task's log files and
//! their cursor), `follower` (the log follower), `image` (pull, load, garbage
//! collection), `dangling` (containers no task owns), `store` (the task map).
#![warn(missing_docs)]

mod config;
mod dangling;
mod driver;
mod engine;
mod follower;
mod handle;
mod image;
mod logs;
mod oom;
mod store;
mod volumes;

pub use config::{
    AuthConfig, CONTAINER_LOCAL_DIR, CONTAINER_SECRETS_DIR, DEFAULT_ALLOW_CAPS, DanglingConfig,
    DeviceConfig, GcConfig, HostNamespace, LABEL_ALLOC_DIR, LABEL_TASK_ID, LABEL_TASK_NAME,
    MountConfig, MountKind, PluginConfig, PortSpec, TaskConfig, UNSUPPORTED_KEYS, VolumesConfig,
    normalize_image,
};
pub use driver::{DockerDriver, HANDLE_VERSION, PLUGIN_NAME, PLUGIN_VERSION};
pub use engine::{AddressSource, DEFAULT_ENDPOINT, DaemonAddress, Endpoint};
pub use logs::CURSOR_FILE;
