//! Plugin and task configuration of the qemu driver. Every struct denies unknown
//! fields, so a typo (`memroy`, `port_forward`) is refused naming the field.

use std::net::IpAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

/// Plugin configuration (`[plugin.qemu] config = {...}` in the agent config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Host directories tasks may take images (and kernels, initrds) from, besides
    /// their own task directory. An image under one of these is attached read-only to
    /// the VM's disk with `snapshot=on` (the guest's writes go to a temporary file), so
    /// that tasks sharing it cannot change it for each other. Default: none.
    #[serde(default)]
    pub image_paths: Vec<PathBuf>,
    /// qemu command-line flags a task's `args` may use (`-device`, `-smbios`, …).
    /// Default: none, so `args` is refused: unlike Nomad, where an unset list allows
    /// every flag (including ones that hand host devices to the VM), a job submitter
    /// is not trusted with qemu's whole command line.
    #[serde(default)]
    pub args_allowlist: Vec<String>,
    /// Directories holding `qemu-system-<arch>` binaries, searched instead of `PATH`.
    #[serde(default)]
    pub emulators: Vec<PathBuf>,
}

/// Accelerator of a VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    /// Software emulation (works everywhere; the default).
    #[default]
    Tcg,
    /// KVM: refused at start when the fingerprint found that KVM does not work here.
    Kvm,
}

/// Transport protocol of a port forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

/// One user-mode networking `hostfwd`: `host_ip:host` on the host reaches `guest` in
/// the VM (at qemu's user-mode guest address).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortForward {
    /// Port on the host.
    pub host: u16,
    /// Port in the guest.
    pub guest: u16,
    /// Address on the host to bind; default 127.0.0.1.
    #[serde(default)]
    pub host_ip: Option<IpAddr>,
    /// `tcp` (default) or `udp`.
    #[serde(default)]
    pub protocol: Protocol,
}

/// A qemu task's configuration (`config = {...}` of a task with `driver = "qemu"`).
/// Relative paths are relative to the task directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// The VM's disk image (qcow2 or raw): inside the task directory, or under one of
    /// the plugin's `image_paths`. Optional with `kernel`.
    #[serde(default)]
    pub image_path: Option<String>,
    /// A kernel to boot directly (`-kernel`), same places as `image_path`.
    #[serde(default)]
    pub kernel: Option<String>,
    /// The initrd for `kernel` (`-initrd`).
    #[serde(default)]
    pub initrd: Option<String>,
    /// The kernel command line for `kernel` (`-append`). The serial console is the
    /// task's stdout: give `console=ttyS0` to see the kernel there.
    #[serde(default)]
    pub append: Option<String>,
    /// `tcg` (default) or `kvm`.
    #[serde(default)]
    pub accelerator: Accelerator,
    /// `-machine` type (`q35`, `pc`, …); default: qemu's.
    #[serde(default)]
    pub machine: Option<String>,
    /// Virtual CPUs (`-smp`); default 1.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// How the disk is attached (`if=` of `-drive`): `ide` (default, as Nomad),
    /// `virtio`, `scsi`, `none`, …
    #[serde(default)]
    pub drive_interface: Option<String>,
    /// Ports of the guest reachable from the host (user-mode networking).
    #[serde(default)]
    pub port_forwards: Vec<PortForward>,
    /// Extra qemu arguments; each flag (an argument starting with `-`) must be in the
    /// plugin's `args_allowlist`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Stop by pressing the guest's ACPI power button (QMP `system_powerdown`) and
    /// waiting for it to power off, up to the kill timeout, before killing qemu.
    /// Default false: stop kills qemu.
    #[serde(default)]
    pub graceful_shutdown: bool,
}
