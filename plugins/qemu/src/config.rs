//! Plugin and task configuration of the qemu driver. Every struct denies unknown
//! fields, so a typo (`memroy`, `port_forward`) is refused naming the field.

mod args;

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use drover_plugin_sdk::taskdir::{self, OpenOptions, Refused};
use drover_plugin_sdk::{DriverError, TaskPort};

use schemars::JsonSchema;
use serde::Deserialize;

/// Plugin configuration (`[plugin.qemu] config = {...}` in the agent config).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Host directories tasks may take images (and kernels, initrds) from, besides
    /// their own task directory. An image under one of these is attached read-only to
    /// the VM's disk with `snapshot=on` (the guest's writes go to a temporary file), so
    /// that tasks sharing it cannot change it for each other. Default: none.
    #[serde(default)]
    pub image_paths: Vec<PathBuf>,
    /// qemu command-line flags a task's `args` may use (`-rtc`, `-no-reboot`, …);
    /// `-flag` and `--flag` are the same flag to qemu, and here. Flags the driver sets
    /// itself or that name host files, devices or sockets can never be allowed
    /// (`-drive`, `-chardev`, `-bios`, …: refused here), and a value naming a file
    /// (`file=`, `romfile=`, any `/`) is refused even after an allowed flag.
    /// Default: none, so `args` is refused: unlike Nomad, where an unset list allows
    /// every flag (including ones that hand host devices to the VM), a job submitter
    /// is not trusted with qemu's whole command line.
    #[serde(default)]
    pub args_allowlist: Vec<String>,
    /// Directories holding `qemu-system-<arch>` binaries, searched instead of `PATH`.
    /// Only binaries owned by root (or the plugin's user) and writable by no one else,
    /// in such a directory, are used.
    #[serde(default)]
    pub emulators: Vec<PathBuf>,
    /// Host addresses a task's `port_forwards` may listen on. Default: 127.0.0.1 only
    /// (a forward on another address, or 0.0.0.0, is an operator's decision).
    #[serde(default = "default_port_forward_host_ips")]
    pub port_forward_host_ips: Vec<IpAddr>,
    /// The lowest host port a task's `port_forwards` may listen on. Default 1024: qemu
    /// binds as root, and a privileged port is one that host services trust.
    #[serde(default = "default_port_forward_min_host_port")]
    pub port_forward_min_host_port: u16,
    /// Let guests open connections out through qemu's user-mode network (to the
    /// host's loopback services, the cloud metadata address, anywhere). Default false:
    /// the network is `restrict=on`, and a guest is reached only through its
    /// `port_forwards`.
    #[serde(default)]
    pub guest_outbound_network: bool,
}

fn default_port_forward_host_ips() -> Vec<IpAddr> {
    vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]
}

fn default_port_forward_min_host_port() -> u16 {
    1024
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            image_paths: Vec::new(),
            args_allowlist: Vec::new(),
            emulators: Vec::new(),
            port_forward_host_ips: default_port_forward_host_ips(),
            port_forward_min_host_port: default_port_forward_min_host_port(),
            guest_outbound_network: false,
        }
    }
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
    /// Extra qemu arguments: flags in the plugin's `args_allowlist`, each followed by
    /// its one value when it takes one. Any other argument is refused (qemu would
    /// open it as a disk image), and so is a value naming a host file.
    #[serde(default)]
    pub args: Vec<String>,
    /// Stop by pressing the guest's ACPI power button (QMP `system_powerdown`) and
    /// waiting for it to power off, up to the kill timeout, before killing qemu.
    /// Default false: stop kills qemu.
    #[serde(default)]
    pub graceful_shutdown: bool,
    /// Nomad's `port_map { http = 80 }`: guest ports by the group network's port
    /// labels. Each label's port on the node (its address and number, as the
    /// scheduler gave them) is forwarded to the guest port, TCP and UDP, like
    /// `port_forwards`; a label the group does not have fails the start.
    #[serde(default)]
    pub port_map: Option<serde_json::Value>,
    /// Nomad's `guest_agent` (a virtio channel to the QEMU guest agent): not supported
    /// yet; `false` is accepted.
    #[serde(default)]
    pub guest_agent: bool,
}

/// How a disk image is attached: see [`TaskConfig::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// The image file (absolute).
    pub path: PathBuf,
    /// `raw` or `qcow2`, told from the file's first bytes (never left to qemu's
    /// probing, which a raw image crafted to look like qcow2 could steer).
    pub format: &'static str,
    /// `if=` of `-drive`.
    pub interface: String,
    /// `snapshot=on`: an image under the plugin's `image_paths` is shared by every
    /// task that names it, so the guest's writes go to a temporary file qemu drops at
    /// exit instead of into the image (one task cannot change it for the next). An
    /// image in the task's own directory is the task's: written in place.
    pub snapshot: bool,
}

/// A task config checked against the task and the plugin: every path located and
/// allowed, every value safe to put on qemu's command line. Made by
/// [`TaskConfig::check`] before anything starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The disk, if any.
    pub disk: Option<Disk>,
    /// The kernel to boot directly.
    pub kernel: Option<PathBuf>,
    /// Its initrd.
    pub initrd: Option<PathBuf>,
    /// The user-mode network is `restrict=on` (the plugin's `guest_outbound_network`
    /// is off): the guest reaches nothing outside, only its forwarded ports reach it.
    pub restrict_network: bool,
}

/// Interfaces `drive_interface` may name (qemu's `if=` values).
pub const DRIVE_INTERFACES: &[&str] = &[
    "ide", "scsi", "sd", "mtd", "floppy", "pflash", "virtio", "none",
];

/// Most virtual CPUs a task may ask for.
pub const MAX_CPUS: u32 = 256;

fn invalid<T>(message: String) -> Result<T, DriverError> {
    Err(DriverError::InvalidConfig(message))
}

impl PluginConfig {
    /// Check the plugin config and resolve `image_paths` (operator-given, so links in
    /// them are followed once, here): each must be an existing directory, each
    /// `args_allowlist` entry a flag.
    pub fn check(mut self) -> Result<PluginConfig, DriverError> {
        for dir in &mut self.image_paths {
            if !dir.is_absolute() {
                return invalid(format!(
                    "image_paths entry {} is not an absolute path",
                    dir.display()
                ));
            }
            let resolved = std::fs::canonicalize(&*dir).map_err(|e| {
                DriverError::InvalidConfig(format!("image_paths entry {}: {e}", dir.display()))
            })?;
            if !resolved.is_dir() {
                return invalid(format!(
                    "image_paths entry {} is not a directory",
                    dir.display()
                ));
            }
            *dir = resolved;
        }
        for entry in &self.args_allowlist {
            args::check_allowlist_entry(entry).map_err(DriverError::InvalidConfig)?;
        }
        if let Some(ip @ IpAddr::V6(_)) = self.port_forward_host_ips.iter().find(|ip| ip.is_ipv6())
        {
            return invalid(format!(
                "port_forward_host_ips entry {ip} is IPv6; qemu's user-mode hostfwd binds \
                 IPv4 addresses only"
            ));
        }
        if self.port_forward_min_host_port == 0 {
            return invalid("port_forward_min_host_port must be at least 1".into());
        }
        Ok(self)
    }
}

impl TaskConfig {
    /// Check everything serde cannot, before qemu (or its executor) starts: at least
    /// one of `image_path` and `kernel`; each file inside `task_dir` (looked at beneath
    /// it without following links: the task dir is the job submitter's) or under one
    /// of the plugin's `image_paths`; `kvm` only when it works here (`kvm` is the
    /// fingerprint's finding); values that go into qemu's option syntax restricted so
    /// that none can add options; each flag of `args` allowlisted.
    pub fn check(
        &self,
        task_dir: &Path,
        plugin: &PluginConfig,
        kvm: &Result<(), String>,
    ) -> Result<Checked, DriverError> {
        if let Some(m) = &self.port_map {
            drover_plugin_sdk::port_map_entries(m)?;
        }
        if self.guest_agent {
            return invalid(
                "guest_agent = true: Drover's qemu driver does not support the QEMU guest \
                 agent yet (graceful_shutdown stops the guest with its ACPI power button)"
                    .into(),
            );
        }
        if self.image_path.is_none() && self.kernel.is_none() {
            return invalid(
                "give image_path (a disk image) or kernel (direct boot), or both".into(),
            );
        }
        if self.kernel.is_none() && (self.initrd.is_some() || self.append.is_some()) {
            return invalid("initrd and append need kernel".into());
        }
        if self.accelerator == Accelerator::Kvm
            && let Err(why) = kvm
        {
            return invalid(format!(
                "accelerator kvm: KVM does not work on this host ({why}); use accelerator \
                 tcg"
            ));
        }
        if let Some(machine) = &self.machine
            && (machine.is_empty()
                || !machine
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
        {
            return invalid(format!(
                "machine {machine:?} is not a machine type name (letters, digits, `.`, `_`, \
                 `-`; e.g. q35): options cannot be added through it"
            ));
        }
        if let Some(cpus) = self.cpus
            && !(1..=MAX_CPUS).contains(&cpus)
        {
            return invalid(format!("cpus {cpus} is not between 1 and {MAX_CPUS}"));
        }
        let interface = self.drive_interface.as_deref().unwrap_or("ide");
        if !DRIVE_INTERFACES.contains(&interface) {
            return invalid(format!(
                "drive_interface {interface:?} is not one of {}",
                DRIVE_INTERFACES.join(", ")
            ));
        }
        if self.drive_interface.is_some() && self.image_path.is_none() {
            return invalid("drive_interface needs image_path".into());
        }
        self.check_port_forwards(plugin)?;
        let texts = self.append.iter().map(|a| ("append", a));
        if let Some((field, _)) = texts
            .chain(self.args.iter().map(|a| ("args", a)))
            .find(|(_, text)| text.contains('\0'))
        {
            return invalid(format!("{field} contains a NUL character"));
        }
        args::check_args(&self.args, &plugin.args_allowlist).map_err(DriverError::InvalidConfig)?;
        let disk = match &self.image_path {
            Some(image) => {
                let found = locate("image_path", image, task_dir, &plugin.image_paths)?;
                let format = disk_format("image_path", image, &found)?;
                Some(Disk {
                    path: found.path,
                    format,
                    interface: interface.to_owned(),
                    snapshot: found.shared,
                })
            }
            None => None,
        };
        let file = |field: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| locate(field, v, task_dir, &plugin.image_paths).map(|f| f.path))
                .transpose()
        };
        Ok(Checked {
            disk,
            kernel: file("kernel", &self.kernel)?,
            initrd: file("initrd", &self.initrd)?,
            restrict_network: !plugin.guest_outbound_network,
        })
    }

    /// The forwards of `port_map`: for each label, the allocation's port of that label
    /// on the node (`ports`, from the scheduler) to the guest port, TCP and UDP, as
    /// Nomad's qemu driver forwards them. The node's address needs no entry in the
    /// plugin's `port_forward_host_ips` (the agent's config chose it); the port must
    /// still be at least `port_forward_min_host_port`, and no host port may be
    /// forwarded twice (counting `port_forwards`).
    ///
    /// # Errors
    /// A label the group does not have, an IPv6 address, a port below the minimum, a
    /// port forwarded twice: each named.
    pub fn group_port_forwards(
        &self,
        ports: &[TaskPort],
        plugin: &PluginConfig,
    ) -> Result<Vec<PortForward>, DriverError> {
        let Some(map) = &self.port_map else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (label, guest) in drover_plugin_sdk::port_map_entries(map)? {
            let Some(port) = ports.iter().find(|p| p.label == label) else {
                let known: Vec<&str> = ports.iter().map(|p| p.label.as_str()).collect();
                return invalid(format!(
                    "port_map: port {label:?} not found in the group's network block ({})",
                    if known.is_empty() {
                        "it has no ports: add network { port \"...\" {} } to the group".to_owned()
                    } else {
                        format!("it has {}", known.join(", "))
                    }
                ));
            };
            let host_ip = if port.host_ip.is_empty() {
                None
            } else {
                let ip: IpAddr = port.host_ip.parse().map_err(|_| {
                    DriverError::InvalidConfig(format!(
                        "port_map: port {label:?} is on {:?}, which is not an IP address",
                        port.host_ip
                    ))
                })?;
                if ip.is_ipv6() {
                    return invalid(format!(
                        "port_map: port {label:?} is on {ip}, an IPv6 address; qemu's \
                         user-mode hostfwd binds IPv4 addresses only"
                    ));
                }
                Some(ip)
            };
            if port.value < plugin.port_forward_min_host_port {
                return invalid(format!(
                    "port_map: port {label:?} is host port {}, below the plugin's \
                     port_forward_min_host_port {}; the operator may lower it",
                    port.value, plugin.port_forward_min_host_port
                ));
            }
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let taken = self
                    .port_forwards
                    .iter()
                    .any(|f| f.host == port.value && f.protocol == protocol);
                if taken {
                    return invalid(format!(
                        "port_map: port {label:?} (host port {}) is also in port_forwards",
                        port.value
                    ));
                }
                out.push(PortForward {
                    host: port.value,
                    guest,
                    host_ip,
                    protocol,
                });
            }
        }
        Ok(out)
    }

    fn check_port_forwards(&self, plugin: &PluginConfig) -> Result<(), DriverError> {
        let mut seen = std::collections::BTreeSet::new();
        for f in &self.port_forwards {
            if f.host == 0 || f.guest == 0 {
                return invalid(format!(
                    "port_forwards: host {} -> guest {}: ports must not be 0",
                    f.host, f.guest
                ));
            }
            if let Some(ip @ IpAddr::V6(_)) = f.host_ip {
                return invalid(format!(
                    "port_forwards: host_ip {ip} is IPv6; qemu's user-mode hostfwd binds IPv4 \
                     addresses only"
                ));
            }
            let ip = f.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            if !plugin.port_forward_host_ips.contains(&ip) {
                let allowed: Vec<String> = plugin
                    .port_forward_host_ips
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                return invalid(format!(
                    "port_forwards: host_ip {ip} (host port {}) is not allowed: the plugin's \
                     port_forward_host_ips allows {}; the operator may add it there",
                    f.host,
                    if allowed.is_empty() {
                        "none".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                ));
            }
            if f.host < plugin.port_forward_min_host_port {
                return invalid(format!(
                    "port_forwards: host port {} is below the plugin's \
                     port_forward_min_host_port {}; the operator may lower it",
                    f.host, plugin.port_forward_min_host_port
                ));
            }
            if !seen.insert((f.host, f.protocol as u8)) {
                return invalid(format!(
                    "port_forwards: host port {} is forwarded twice",
                    f.host
                ));
            }
        }
        Ok(())
    }
}

/// A file a task config names, found and opened (once: its header is read from this
/// descriptor, never by opening the name again).
struct Found {
    path: PathBuf,
    file: File,
    /// Under the plugin's `image_paths` (shared by tasks), not in the task dir.
    shared: bool,
}

/// Why `path` (the value of `field`, or what it was found as) cannot go on qemu's
/// command line as it is: qemu splits `-initrd` on `,` into multiboot modules (each
/// opened as root; a space starts a module's command line), and nothing of a file name
/// is escaped for `-kernel`. So commas, whitespace and control characters are refused
/// in all three file fields.
fn check_file_name(field: &str, value: &str, path: &Path) -> Result<(), DriverError> {
    let shown = path.to_string_lossy();
    if let Some(c) = shown
        .chars()
        .find(|c| *c == ',' || c.is_whitespace() || c.is_control())
    {
        let what = if shown == value {
            String::new()
        } else {
            format!(" (found as {shown:?})")
        };
        return invalid(format!(
            "{field} {value:?}{what} contains {c:?}: commas, whitespace and control \
             characters are not accepted in file names given to qemu (it would split the \
             name at them); rename the file"
        ));
    }
    Ok(())
}

/// Find `value` (field `field`): relative to `task_dir`, or absolute inside it (opened
/// beneath it, no link followed, and with exactly one hard link: the job submitter fills
/// the task dir and can plant links, hard ones too, to root-only host files), or
/// absolute under one of `image_paths` after resolving it. It must be a regular file,
/// and its name must be safe on qemu's command line ([`check_file_name`]).
///
/// The answer is good until qemu opens the file by name, which it does at once as root
/// before it drops to `nobody`: nothing of the task runs on the host before then (the
/// task is the VM), so nothing of it can swap the checked file meanwhile.
fn locate(
    field: &str,
    value: &str,
    task_dir: &Path,
    image_paths: &[PathBuf],
) -> Result<Found, DriverError> {
    if value.is_empty() {
        return invalid(format!("{field} must not be empty"));
    }
    check_file_name(field, value, Path::new(value))?;
    let found = locate_file(field, value, task_dir, image_paths)?;
    check_file_name(field, value, &found.path)?;
    Ok(found)
}

fn locate_file(
    field: &str,
    value: &str,
    task_dir: &Path,
    image_paths: &[PathBuf],
) -> Result<Found, DriverError> {
    let path = Path::new(value);
    let in_task_dir = if path.is_absolute() {
        (!task_dir.as_os_str().is_empty())
            .then(|| path.strip_prefix(task_dir).ok())
            .flatten()
    } else {
        Some(path)
    };
    if let Some(rel) = in_task_dir {
        if task_dir.as_os_str().is_empty() {
            return invalid(format!(
                "{field} {value:?} is relative, and the task has no task directory"
            ));
        }
        let shown = task_dir.join(rel);
        let once = OpenOptions::new().read(true).single_link(true);
        let file = taskdir::Dir::open(task_dir)
            .and_then(|dir| dir.open_file(rel, &once))
            .map_err(|e| {
                let why = match (e.kind(), taskdir::refusal(&e)) {
                    (std::io::ErrorKind::NotFound, _) => {
                        format!("{} does not exist", shown.display())
                    }
                    (_, Some(Refused::HardLinked { links, .. })) => format!(
                        "{} has {links} hard links: a file in the task directory must have \
                         exactly one (another name could be a host file)",
                        shown.display()
                    ),
                    (_, Some(Refused::NotRegular { kind, .. })) => {
                        format!("{} is {kind}, not a regular file", shown.display())
                    }
                    _ => format!(
                        "{}: {e} (links in the task directory are not followed: put the file \
                         itself there)",
                        shown.display()
                    ),
                };
                DriverError::InvalidConfig(format!("{field} {value:?}: {why}"))
            })?;
        let clean: PathBuf = rel
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        return Ok(Found {
            path: task_dir.join(clean),
            file,
            shared: false,
        });
    }
    let allowed = || {
        let mut places = vec![format!("the task directory {}", task_dir.display())];
        places.extend(image_paths.iter().map(|p| p.display().to_string()));
        places.join(", ")
    };
    let resolved = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return invalid(format!("{field} {value:?} does not exist"));
        }
        Err(e) => return invalid(format!("{field} {value:?}: {e}")),
    };
    if !image_paths.iter().any(|dir| resolved.starts_with(dir)) {
        return invalid(format!(
            "{field} {value:?} is outside the places images may come from: {}{}",
            allowed(),
            if image_paths.is_empty() {
                " (the plugin's image_paths is empty)"
            } else {
                ""
            }
        ));
    }
    if !resolved.is_file() {
        return invalid(format!("{field} {value:?} is not a regular file"));
    }
    // Under image_paths: the operator's directory, opened by its resolved name.
    let file = File::open(&resolved)
        .map_err(|e| DriverError::InvalidConfig(format!("{field} {value:?}: {e}")))?;
    Ok(Found {
        path: resolved,
        file,
        shared: true,
    })
}

/// qcow2's magic, `QFI\xfb`.
const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

/// `raw` or `qcow2` from the image's header. A qcow2 image from the task dir must name
/// no other file, which qemu would open on the host as root: no backing file (header
/// bytes 8..16, its name's offset) and no external data file (version 3's
/// incompatible feature bit 2, header bytes 72..80).
fn disk_format(field: &str, value: &str, found: &Found) -> Result<&'static str, DriverError> {
    use std::io::Read as _;
    let mut header = [0u8; 80];
    let mut got = 0;
    let mut reader = (&found.file).take(header.len() as u64);
    loop {
        match reader.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return invalid(format!("{field} {value:?}: {e}")),
        }
    }
    if got < 4 || header[..4] != QCOW2_MAGIC || found.shared {
        // An image under image_paths is the operator's, backing files and all.
        return Ok(if got >= 4 && header[..4] == QCOW2_MAGIC {
            "qcow2"
        } else {
            "raw"
        });
    }
    let field_at = |at: usize| {
        header
            .get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_be_bytes)
    };
    let version = header
        .get(4..8)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_be_bytes);
    let names_a_file = if field_at(8) != 0 {
        Some("a backing file")
    } else if version >= 3 && field_at(72) & EXTERNAL_DATA_FILE != 0 {
        Some("an external data file")
    } else {
        None
    };
    match names_a_file {
        Some(what) => invalid(format!(
            "{field} {value:?} is a qcow2 image with {what}, which qemu would open on the \
             host: give a self-contained image (qemu-img convert -O qcow2)"
        )),
        None => Ok("qcow2"),
    }
}

/// qcow2 v3's incompatible feature "external data file".
const EXTERNAL_DATA_FILE: u64 = 1 << 2;

#[cfg(test)]
mod tests {
    use super::*;

    fn task(json: &str) -> TaskConfig {
        serde_json::from_str(json).unwrap()
    }

    /// `check` of `json` in a task dir holding `local/vmlinuz`.
    fn check(json: &str, plugin: &PluginConfig) -> Result<Checked, String> {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("local")).unwrap();
        std::fs::write(tmp.path().join("local/vmlinuz"), "k").unwrap();
        task(json)
            .check(tmp.path(), plugin, &Err("no /dev/kvm".into()))
            .map(|mut c| {
                // Paths in the (removed) temp dir: keep them relative for comparing.
                c.kernel = c
                    .kernel
                    .map(|k| k.strip_prefix(tmp.path()).unwrap().to_owned());
                c
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_kernel_in_the_task_dir_is_the_tasks_own() {
        let c = check(r#"{"kernel":"local/vmlinuz"}"#, &PluginConfig::default()).unwrap();
        assert_eq!(c.kernel.as_deref(), Some(Path::new("local/vmlinuz")));
        assert_eq!(c.disk, None);
    }

    #[test]
    fn values_are_refused_naming_the_field_and_the_value() {
        let plugin = PluginConfig::default();
        for (json, words) in [
            (
                r#"{"kernel":"local/vmlinuz","accelerator":"kvm"}"#,
                &["accelerator kvm", "no /dev/kvm"][..],
            ),
            (r#"{"kernel":"local/vmlinuz","cpus":0}"#, &["cpus 0"]),
            (
                r#"{"kernel":"local/vmlinuz","image_path":"local/vmlinuz","drive_interface":"virtio,file=/etc/shadow"}"#,
                &["drive_interface", "virtio,file=/etc/shadow"],
            ),
            (
                r#"{"kernel":"local/vmlinuz","drive_interface":"virtio"}"#,
                &["drive_interface needs image_path"],
            ),
            (r#"{"initrd":"local/vmlinuz"}"#, &["image_path", "kernel"]),
            (
                r#"{"image_path":"local/vmlinuz","append":"quiet"}"#,
                &["initrd and append need kernel"],
            ),
            (
                r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":8080,"guest":80,"host_ip":"::1"}]}"#,
                &["host_ip ::1", "IPv4"],
            ),
            (
                r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":8080,"guest":80},{"host":8080,"guest":81}]}"#,
                &["host port 8080 is forwarded twice"],
            ),
            (
                r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":0,"guest":80}]}"#,
                &["must not be 0"],
            ),
            (
                r#"{"kernel":"local/vmlinuz","args":["-device","x"]}"#,
                &["-device", "args_allowlist is empty"],
            ),
            (r#"{"kernel":""}"#, &["kernel must not be empty"]),
            (
                r#"{"kernel":"local/vmlinuz","append":"a\u0000b"}"#,
                &["append contains a NUL"],
            ),
        ] {
            let err = check(json, &plugin).unwrap_err();
            for w in words {
                assert!(err.contains(w), "{json}: {err:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn allowlisted_flags_match_with_one_or_two_dashes() {
        let plugin = PluginConfig {
            args_allowlist: vec!["-device".into()],
            ..Default::default()
        };
        let ok = r#"{"kernel":"local/vmlinuz","args":["--device","virtio-rng-pci","-device","x"]}"#;
        assert!(check(ok, &plugin).is_ok());
        let err = check(
            r#"{"kernel":"local/vmlinuz","args":["-drive","x"]}"#,
            &plugin,
        )
        .unwrap_err();
        assert!(err.contains("-drive") && err.contains("-device"), "{err}");
    }

    #[test]
    fn commas_whitespace_and_control_characters_in_file_names_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let local = tmp.path().join("local");
        std::fs::create_dir_all(&local).unwrap();
        std::fs::write(local.join("k"), "k").unwrap();
        // The review's multiboot attack: `local/x,` is a directory, so the whole
        // string is a regular file in the task dir, and qemu's -initrd would load
        // `local/x` and the host's /etc/shadow as modules.
        std::fs::write(local.join("x"), "x").unwrap();
        std::fs::create_dir_all(local.join("x,/etc")).unwrap();
        std::fs::write(local.join("x,/etc/shadow"), "s").unwrap();
        std::fs::write(local.join("x y"), "x").unwrap();
        std::fs::write(local.join("x\ty"), "x").unwrap();
        let plugin = PluginConfig::default();
        for (field, value) in [
            ("initrd", "local/x,/etc/shadow"),
            ("initrd", "local/x y"),
            ("kernel", "local/x\ty"),
            ("image_path", "local/x y"),
        ] {
            let mut config = TaskConfig {
                kernel: Some("local/k".into()),
                ..Default::default()
            };
            match field {
                "initrd" => config.initrd = Some(value.into()),
                "kernel" => config.kernel = Some(value.into()),
                _ => config.image_path = Some(value.into()),
            }
            let err = config
                .check(tmp.path(), &plugin, &Ok(()))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(field)
                    && err.contains(&format!("{value:?}"))
                    && err.contains("rename"),
                "{field} {value:?}: {err}"
            );
        }
        // A task dir whose own path has a comma: the found path is refused too.
        let odd = tmp.path().join("a,b");
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("k"), "k").unwrap();
        let config = TaskConfig {
            kernel: Some("k".into()),
            ..Default::default()
        };
        let err = config
            .check(&odd, &plugin, &Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("found as") && err.contains("a,b"), "{err}");
    }

    #[test]
    fn a_hard_linked_file_in_the_task_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let local = tmp.path().join("local");
        std::fs::create_dir_all(&local).unwrap();
        // Stand-in for a host file the job submitter hard-linked into the task dir.
        let host_file = tmp.path().join("shadow");
        std::fs::write(&host_file, "root only").unwrap();
        std::fs::hard_link(&host_file, local.join("disk.img")).unwrap();
        std::fs::write(local.join("k"), "k").unwrap();
        std::fs::hard_link(local.join("k"), tmp.path().join("k2")).unwrap();
        let plugin = PluginConfig::default();
        for json in [
            r#"{"image_path":"local/disk.img"}"#,
            r#"{"kernel":"local/k"}"#,
        ] {
            let err = task(json)
                .check(tmp.path(), &plugin, &Ok(()))
                .unwrap_err()
                .to_string();
            assert!(err.contains("2 hard links"), "{json}: {err}");
        }
        // With one link it is the task's own.
        std::fs::remove_file(&host_file).unwrap();
        let checked = task(r#"{"image_path":"local/disk.img"}"#)
            .check(tmp.path(), &plugin, &Ok(()))
            .unwrap();
        assert_eq!(checked.disk.unwrap().path, local.join("disk.img"));
    }

    #[test]
    fn port_forwards_are_limited_to_the_operators_addresses_and_ports() {
        let plugin = PluginConfig::default();
        for (json, words) in [
            (
                r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":8080,"guest":80,"host_ip":"0.0.0.0"}]}"#,
                &["host_ip 0.0.0.0", "port_forward_host_ips", "127.0.0.1"][..],
            ),
            (
                r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":25,"guest":25}]}"#,
                &["host port 25", "port_forward_min_host_port 1024"],
            ),
        ] {
            let err = check(json, &plugin).unwrap_err();
            for w in words {
                assert!(err.contains(w), "{json}: {err:?} lacks {w:?}");
            }
        }
        let ok = r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":1024,"guest":80}]}"#;
        assert!(check(ok, &plugin).is_ok());
        // The operator's settings allow what the defaults do not.
        let wide: PluginConfig = serde_json::from_str(
            r#"{"port_forward_host_ips":["0.0.0.0"],"port_forward_min_host_port":80}"#,
        )
        .unwrap();
        let wide = wide.check().unwrap();
        let json = r#"{"kernel":"local/vmlinuz","port_forwards":[{"host":80,"guest":80,"host_ip":"0.0.0.0"}]}"#;
        assert!(check(json, &wide).is_ok());
        // ... and the default address is then no longer allowed.
        assert!(check(ok, &wide).unwrap_err().contains("host_ip 127.0.0.1"));
        let v6: PluginConfig =
            serde_json::from_str(r#"{"port_forward_host_ips":["::1"]}"#).unwrap();
        assert!(v6.check().unwrap_err().to_string().contains("::1"));
    }

    #[test]
    fn the_plugin_config_refuses_denied_flags_in_the_allowlist() {
        let plugin: PluginConfig =
            serde_json::from_str(r#"{"args_allowlist":["-rtc","--chardev"]}"#).unwrap();
        let err = plugin.check().unwrap_err().to_string();
        assert!(
            err.contains("--chardev") && err.contains("can never be allowed"),
            "{err}"
        );
        // A task's values are checked after an allowed flag.
        let plugin = PluginConfig {
            args_allowlist: vec!["-smbios".into()],
            ..Default::default()
        };
        let err = check(
            r#"{"kernel":"local/vmlinuz","args":["-smbios","file=/etc/shadow"]}"#,
            &plugin,
        )
        .unwrap_err();
        assert!(
            err.contains("-smbios") && err.contains("file=/etc/shadow"),
            "{err}"
        );
    }

    #[test]
    fn the_network_is_restricted_unless_the_plugin_lets_guests_out() {
        let c = check(r#"{"kernel":"local/vmlinuz"}"#, &PluginConfig::default()).unwrap();
        assert!(c.restrict_network);
        let open = PluginConfig {
            guest_outbound_network: true,
            ..Default::default()
        };
        assert!(
            !check(r#"{"kernel":"local/vmlinuz"}"#, &open)
                .unwrap()
                .restrict_network
        );
    }

    /// Nomad's qemu keys: `image_path`, `accelerator`, `args`, `graceful_shutdown`
    /// decode with Nomad's meaning, `port_map` too (as Nomad's job files write it, a
    /// list of maps; a value that is no port is named); `guest_agent = true` is
    /// refused because it is not supported yet.
    #[test]
    fn nomads_qemu_keys_decode_and_bad_ones_are_named() {
        let c = task(
            r#"{"image_path":"local/vmlinuz","accelerator":"tcg","graceful_shutdown":true,
                "args":[],"guest_agent":false}"#,
        );
        assert_eq!(c.image_path.as_deref(), Some("local/vmlinuz"));
        assert_eq!(c.accelerator, Accelerator::Tcg);
        assert!(c.graceful_shutdown);
        check(
            r#"{"image_path":"local/vmlinuz","accelerator":"tcg","graceful_shutdown":true}"#,
            &PluginConfig::default(),
        )
        .unwrap();
        check(
            r#"{"image_path":"local/vmlinuz","port_map":[{"ssh":22}]}"#,
            &PluginConfig::default(),
        )
        .unwrap();
        let err = check(
            r#"{"image_path":"local/vmlinuz","port_map":[{"ssh":"twenty"}]}"#,
            &PluginConfig::default(),
        )
        .unwrap_err();
        assert!(
            err.contains("port_map: ssh = \"twenty\" is not a port"),
            "{err}"
        );
        let err = check(
            r#"{"image_path":"local/vmlinuz","guest_agent":true}"#,
            &PluginConfig::default(),
        )
        .unwrap_err();
        assert!(err.contains("guest_agent"), "{err}");
        let err = serde_json::from_str::<TaskConfig>(r#"{"image_path":"x","acelerator":"kvm"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("acelerator"), "{err}");
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = serde_json::from_str::<TaskConfig>(r#"{"kernal":"x"}"#).unwrap_err();
        assert!(err.to_string().contains("kernal"), "{err}");
        let err = serde_json::from_str::<TaskConfig>(
            r#"{"kernel":"x","port_forwards":[{"host":1,"guest":2,"proto":"tcp"}]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("proto"), "{err}");
        let err = serde_json::from_str::<PluginConfig>(r#"{"args_allow":[]}"#).unwrap_err();
        assert!(err.to_string().contains("args_allow"), "{err}");
    }

    /// `port_map { http = 80 }` forwards the allocation's `http` port on the node's
    /// address to guest port 80, TCP and UDP; a label the group lacks, a port below
    /// the plugin's minimum or one already in `port_forwards` is refused by name.
    #[test]
    fn port_map_forwards_the_allocations_ports() {
        let ports = [
            TaskPort::new("http", 23456).with_host_ip("127.0.0.1"),
            TaskPort::new("low", 80).with_host_ip("127.0.0.1"),
        ];
        let plugin = PluginConfig::default();
        let c = task(r#"{"kernel":"k","port_map":[{"http":8080}]}"#);
        let f = c.group_port_forwards(&ports, &plugin).unwrap();
        let lo = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(
            f,
            [
                PortForward {
                    host: 23456,
                    guest: 8080,
                    host_ip: lo,
                    protocol: Protocol::Tcp
                },
                PortForward {
                    host: 23456,
                    guest: 8080,
                    host_ip: lo,
                    protocol: Protocol::Udp
                },
            ]
        );
        assert!(
            task(r#"{"kernel":"k"}"#)
                .group_port_forwards(&ports, &plugin)
                .unwrap()
                .is_empty()
        );
        for (json, named) in [
            (
                r#"{"kernel":"k","port_map":{"web":80}}"#,
                "port_map: port \"web\" not found in the group's network block (it has http, low)",
            ),
            (
                r#"{"kernel":"k","port_map":{"low":80}}"#,
                "below the plugin's port_forward_min_host_port",
            ),
            (
                r#"{"kernel":"k","port_map":{"http":80},"port_forwards":[{"host":23456,"guest":22}]}"#,
                "port_map: port \"http\" (host port 23456) is also in port_forwards",
            ),
        ] {
            let err = task(json)
                .group_port_forwards(&ports, &plugin)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{json}: {err}");
        }
    }
}
