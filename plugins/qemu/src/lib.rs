//! # drover-driver-qemu
//!
//! The `qemu` task driver: runs a virtual machine under `qemu-system-*`, one qemu
//! process per task, owned by the shared executor (`drover_executor`) so that the VM
//! survives restarts of the agent and of this plugin, exactly like a rawexec task.
//!
//! - **Task config** ([`TaskConfig`]): `image_path` (a disk image, inside the task
//!   directory or under one of the plugin's `image_paths`) and/or `kernel`/`initrd`/
//!   `append` for direct boot; `accelerator` (`tcg` | `kvm`), `machine`, `cpus`,
//!   `drive_interface`, `port_forwards` (user-mode networking `hostfwd`, on 127.0.0.1
//!   unless `host_ip` says otherwise), `args` (each checked against the plugin's
//!   `args_allowlist`), `graceful_shutdown`. Memory is the task's `memory_mb`.
//!   Unknown fields are refused, naming the field.
//! - **Plugin config** ([`PluginConfig`]): `image_paths`, `args_allowlist`,
//!   `emulators` (where the `qemu-system-*` binaries are).
//! - **Control over QMP** ([`qmp`]): a unix socket in the task's private driver
//!   directory; stop with `graceful_shutdown` sends `system_powerdown`, waits for the
//!   guest's `SHUTDOWN` event up to the kill timeout, then kills. The exit says which
//!   way the VM ended.
//! - **Serial console** = the task's stdout log (`-serial stdio` into the executor's
//!   log pipe).
//! - **Fingerprint** ([`probe`]): qemu's version, the emulators found, and whether KVM
//!   *works* (a tiny guest is tried under `accel=kvm`, not inferred from `/dev/kvm`).
//!
//! ```no_run
//! drover_executor::run_if_executor(None);
//! drover_plugin_sdk::serve(drover_driver_qemu::QemuDriver::new())
//! ```
#![warn(missing_docs)]

pub mod config;
mod driver;
pub mod probe;
pub mod qmp;
pub mod vm;

pub use config::{PluginConfig, TaskConfig};
pub use driver::{HANDLE_VERSION, PLUGIN_NAME, PLUGIN_VERSION, QMP_SOCKET, QemuDriver};
