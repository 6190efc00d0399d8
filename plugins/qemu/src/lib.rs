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
//!   unless `host_ip` says otherwise, within the plugin's `port_forward_host_ips` and
//!   `port_forward_min_host_port`), `args` (read as qemu reads them: allowlisted flags
//!   and their one value each; flags that name host files or undo the confinement are
//!   never allowed), `graceful_shutdown`. Memory is the task's `memory_mb`. Unknown
//!   fields are refused, naming the field.
//! - **Plugin config** ([`PluginConfig`]): `image_paths`, `args_allowlist`,
//!   `emulators` (where the `qemu-system-*` binaries are), `port_forward_host_ips`,
//!   `port_forward_min_host_port`, `guest_outbound_network` (default off: the
//!   user-mode network is `restrict=on`).
//! - **Control over QMP** ([`qmp`]): a unix socket (`qmp`, [`QMP_SOCKET`]) in the
//!   task's executor directory, which is the plugin's (0700 under its state dir), not
//!   in the task dir, where the job submitter could plant a link in its place. QMP is
//!   connected only when a stop needs it, so a recovered task needs nothing more.
//! - **Stop**: with `graceful_shutdown`, `system_powerdown`, then the guest's
//!   `SHUTDOWN` or qemu's exit is awaited up to the stop timeout, then qemu is killed.
//!   How it ended: a guest that powered off ends qemu with a clean exit code 0 and the
//!   task event [`GUEST_POWERED_OFF`] (an `err` beside code 0 would read as an
//!   unknown exit); a kill carries its reason in the exit's `err` beside SIGKILL
//!   ("guest did not power off within 5s of system_powerdown: killed"). Without
//!   `graceful_shutdown`, the executor's stop (the signal, SIGKILL at the timeout),
//!   and an event saying the guest was not shut down.
//! - **Serial console** = the task's stdout log (`-serial stdio` into the executor's
//!   log pipe); qemu's own messages are its stderr log.
//! - **qemu confines itself** ([`vm::hardening`]): its seccomp filter (`-sandbox on`,
//!   obsolete, spawn and resourcecontrol denied) and, run by root, it drops to
//!   `nobody` once it has opened its files and sockets (`-runas`, or `-run-with
//!   user=` from qemu 9.1). The files it opens are checked first
//!   ([`TaskConfig::check`]): no link in the task dir is followed, and an image from
//!   the task dir that is qcow2 with a backing file is refused.
//! - **Command line**: [`vm::command_line`], a pure function of a [`vm::Vm`]; the
//!   `qemu-start` benchmark runs the same command.
//! - **Fingerprint** ([`probe`]): qemu's version, the emulators found, and whether KVM
//!   *works* (a tiny guest is tried under `accel=kvm`, not inferred from `/dev/kvm`);
//!   attributes `driver.qemu.version`, `driver.qemu.emulators`, `driver.qemu.kvm`
//!   and, when it does not work, `driver.qemu.kvm_reason`. Probed at start-up and
//!   reused for a minute.
//! - **Tasks under executors**: the engine is [`drover_executor::plain`], shared with
//!   rawexec: qemu is the executor's task, stats are the qemu process's CPU and
//!   memory, and a task whose executor died is killed by proof before it is reported.
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
pub use driver::{
    GUEST_POWERED_OFF, HANDLE_VERSION, PLUGIN_NAME, PLUGIN_VERSION, QMP_SOCKET, QemuDriver,
};
