//! A VM's qemu command line, built by a pure function ([`command_line`]) from a
//! checked description ([`Vm`]): the driver and the `qemu-start` benchmark run the
//! same command.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use crate::config::{Accelerator, Checked, Disk, PortForward, Protocol, TaskConfig};

/// The user qemu drops to after it has opened everything (as root).
pub const RUN_AS_USER: &str = "nobody";

/// How qemu confines itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hardening {
    /// The `-sandbox` value (qemu's seccomp filter), if any.
    pub sandbox: Option<String>,
    /// The user to drop to after start-up, and how to say it: `-runas` on qemu < 9.1,
    /// `-run-with user=` from 9.1 on (where `-runas` is deprecated).
    pub run_as: Option<RunAs>,
}

/// qemu's way of dropping root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    /// `-runas USER` (qemu < 9.1).
    Runas(String),
    /// `-run-with user=USER` (qemu ≥ 9.1).
    RunWith(String),
}

/// qemu's `major.minor` from a version string (`7.2.22`, `9.1.0`).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor = parts
        .next()
        .and_then(|m| {
            m.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    Some((major, minor))
}

/// The hardening for qemu `version` (from the fingerprint; `None`: unknown, taken as
/// older than 9.1), run by root or not.
///
/// - seccomp (`-sandbox on`) with `obsolete`, `spawn` and `resourcecontrol` denied;
/// - as root, qemu drops to [`RUN_AS_USER`] once it has opened its files and sockets.
///   Then `elevateprivileges` is left allowed: qemu installs its seccomp filter
///   *before* it drops root, so denying `set*uid` kills qemu with SIGSYS at its own
///   drop (tried with qemu 7.2: `Bad system call`), and once it runs as `nobody` it has
///   no capability to regain root anyway. Not root: nothing to drop, and
///   `elevateprivileges=deny`.
pub fn hardening(version: Option<&str>, root: bool) -> Hardening {
    let new_syntax = version.and_then(major_minor).is_some_and(|v| v >= (9, 1));
    let elevate = if root { "allow" } else { "deny" };
    Hardening {
        sandbox: Some(format!(
            "on,obsolete=deny,elevateprivileges={elevate},spawn=deny,resourcecontrol=deny"
        )),
        run_as: root.then(|| {
            if new_syntax {
                RunAs::RunWith(RUN_AS_USER.into())
            } else {
                RunAs::Runas(RUN_AS_USER.into())
            }
        }),
    }
}

/// Everything a VM's command line is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vm {
    /// `-machine` type; `None`: qemu's default.
    pub machine: Option<String>,
    /// `accel=` of `-machine`.
    pub accelerator: Accelerator,
    /// `-smp`.
    pub cpus: u32,
    /// `-m` in MiB; 0: qemu's default.
    pub memory_mb: u64,
    /// The disk.
    pub disk: Option<Disk>,
    /// `-kernel`.
    pub kernel: Option<PathBuf>,
    /// `-initrd`.
    pub initrd: Option<PathBuf>,
    /// `-append`.
    pub append: Option<String>,
    /// User-mode networking `hostfwd`s; none: the VM has no network device.
    pub port_forwards: Vec<PortForward>,
    /// `restrict=on` of the user-mode network: the guest can open no connection out
    /// (not to the host's loopback at 10.0.2.2, nor anywhere); forwards still reach it.
    pub restrict_network: bool,
    /// The QMP socket qemu listens on.
    pub qmp_socket: PathBuf,
    /// Extra arguments (allowlisted).
    pub args: Vec<String>,
    /// Seccomp and dropping root.
    pub hardening: Hardening,
}

impl Vm {
    /// A VM booting `kernel` with `initrd` and `append` under TCG, 1 CPU, QMP on
    /// `qmp_socket`, unhardened: the benchmark's and tests' starting point.
    pub fn direct_boot(
        kernel: impl Into<PathBuf>,
        initrd: impl Into<PathBuf>,
        append: impl Into<String>,
        qmp_socket: impl Into<PathBuf>,
    ) -> Vm {
        Vm {
            machine: None,
            accelerator: Accelerator::Tcg,
            cpus: 1,
            memory_mb: 0,
            disk: None,
            kernel: Some(kernel.into()),
            initrd: Some(initrd.into()),
            append: Some(append.into()),
            port_forwards: Vec::new(),
            restrict_network: true,
            qmp_socket: qmp_socket.into(),
            args: Vec::new(),
            hardening: Hardening {
                sandbox: None,
                run_as: None,
            },
        }
    }

    /// The VM of a checked task config.
    pub fn of_task(
        config: &TaskConfig,
        checked: Checked,
        memory_mb: u64,
        qmp_socket: PathBuf,
        hardening: Hardening,
    ) -> Vm {
        Vm {
            machine: config.machine.clone(),
            accelerator: config.accelerator,
            cpus: config.cpus.unwrap_or(1),
            memory_mb,
            disk: checked.disk,
            kernel: checked.kernel,
            initrd: checked.initrd,
            append: config.append.clone(),
            port_forwards: config.port_forwards.clone(),
            restrict_network: checked.restrict_network,
            qmp_socket,
            args: config.args.clone(),
            hardening,
        }
    }
}

/// A value inside qemu's `key=value,...` option syntax: a comma is written twice.
fn option_value(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// qemu's arguments (without the program) for `vm`:
/// `-nodefaults -no-user-config -display none -serial stdio` (the serial console is the
/// task's stdout log), QMP on its socket, `-machine`, `-smp`, `-m`, the disk, kernel,
/// initrd and append, the network (only with port forwards; `restrict=on` unless the
/// operator lets guests out), the hardening, and the extra `args` last.
///
/// ```
/// use drover_driver_qemu::vm::{command_line, Vm};
/// let vm = Vm::direct_boot("/k", "/i", "console=ttyS0", "/run/q/qmp");
/// let args = command_line(&vm);
/// assert!(args.windows(2).any(|w| w == ["-qmp", "unix:/run/q/qmp,server=on,wait=off"]));
/// assert!(args.windows(2).any(|w| w == ["-machine", "accel=tcg"]));
/// assert!(!args.iter().any(|a| a == "-netdev"));
/// ```
pub fn command_line(vm: &Vm) -> Vec<String> {
    let mut args: Vec<String> = [
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-serial",
        "stdio",
    ]
    .map(String::from)
    .into();
    let mut push = |a: &str, b: String| {
        args.push(a.to_owned());
        args.push(b);
    };
    push(
        "-qmp",
        format!("unix:{},server=on,wait=off", option_value(&vm.qmp_socket)),
    );
    let accel = match vm.accelerator {
        Accelerator::Tcg => "tcg",
        Accelerator::Kvm => "kvm",
    };
    push(
        "-machine",
        match &vm.machine {
            Some(m) => format!("{m},accel={accel}"),
            None => format!("accel={accel}"),
        },
    );
    push("-smp", vm.cpus.to_string());
    if vm.memory_mb > 0 {
        push("-m", vm.memory_mb.to_string());
    }
    if let Some(disk) = &vm.disk {
        let mut drive = format!(
            "file={},format={},if={}",
            option_value(&disk.path),
            disk.format,
            disk.interface
        );
        if disk.snapshot {
            drive.push_str(",snapshot=on");
        }
        push("-drive", drive);
    }
    if let Some(kernel) = &vm.kernel {
        push("-kernel", kernel.display().to_string());
    }
    if let Some(initrd) = &vm.initrd {
        push("-initrd", initrd.display().to_string());
    }
    if let Some(append) = &vm.append {
        push("-append", append.clone());
    }
    if !vm.port_forwards.is_empty() {
        let mut netdev = String::from("user,id=net0");
        if vm.restrict_network {
            netdev.push_str(",restrict=on");
        }
        for f in &vm.port_forwards {
            let proto = match f.protocol {
                Protocol::Tcp => "tcp",
                Protocol::Udp => "udp",
            };
            let ip = f.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            netdev.push_str(&format!(",hostfwd={proto}:{ip}:{}-:{}", f.host, f.guest));
        }
        push("-netdev", netdev);
        push("-device", "virtio-net-pci,netdev=net0".into());
    }
    if let Some(sandbox) = &vm.hardening.sandbox {
        push("-sandbox", sandbox.clone());
    }
    match &vm.hardening.run_as {
        Some(RunAs::Runas(user)) => push("-runas", user.clone()),
        Some(RunAs::RunWith(user)) => push("-run-with", format!("user={user}")),
        None => {}
    }
    args.extend(vm.args.iter().cloned());
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(args: &[String]) -> Vec<(String, String)> {
        args.windows(2)
            .filter(|w| w[0].starts_with('-'))
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect()
    }

    #[test]
    fn a_full_vm_has_every_part_in_qemu_syntax() {
        let mut vm = Vm::direct_boot("/k", "/i", "console=ttyS0 quiet", "/s/a,b/qmp");
        vm.machine = Some("q35".into());
        vm.cpus = 2;
        vm.memory_mb = 256;
        vm.disk = Some(Disk {
            path: "/images/base,1.qcow2".into(),
            format: "qcow2",
            interface: "virtio".into(),
            snapshot: true,
        });
        vm.port_forwards = vec![
            PortForward {
                host: 8080,
                guest: 80,
                host_ip: None,
                protocol: Protocol::Tcp,
            },
            PortForward {
                host: 5353,
                guest: 53,
                host_ip: Some("0.0.0.0".parse().unwrap()),
                protocol: Protocol::Udp,
            },
        ];
        vm.hardening = hardening(Some("7.2.22"), true);
        vm.args = vec!["-device".into(), "virtio-rng-pci".into()];
        let args = command_line(&vm);
        assert_eq!(
            args[..6],
            [
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-serial",
                "stdio"
            ]
        );
        let p = pairs(&args);
        let has = |k: &str, v: &str| {
            assert!(
                p.contains(&(k.to_owned(), v.to_owned())),
                "{k} {v} missing in {args:?}"
            )
        };
        has("-qmp", "unix:/s/a,,b/qmp,server=on,wait=off");
        has("-machine", "q35,accel=tcg");
        has("-smp", "2");
        has("-m", "256");
        has(
            "-drive",
            "file=/images/base,,1.qcow2,format=qcow2,if=virtio,snapshot=on",
        );
        has("-kernel", "/k");
        has("-initrd", "/i");
        has("-append", "console=ttyS0 quiet");
        has(
            "-netdev",
            "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:8080-:80,hostfwd=udp:0.0.0.0:5353-:53",
        );
        has("-device", "virtio-net-pci,netdev=net0");
        has(
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny",
        );
        has("-runas", "nobody");
        assert_eq!(args[args.len() - 2..], ["-device", "virtio-rng-pci"]);
    }

    #[test]
    fn dropping_root_follows_the_qemu_version() {
        assert_eq!(
            hardening(Some("9.1.0"), true).run_as,
            Some(RunAs::RunWith("nobody".into()))
        );
        assert_eq!(
            hardening(Some("9.0.2"), true).run_as,
            Some(RunAs::Runas("nobody".into()))
        );
        assert_eq!(
            hardening(None, true).run_as,
            Some(RunAs::Runas("nobody".into()))
        );
        let user = hardening(Some("10.0.0"), false);
        assert_eq!(user.run_as, None);
        assert!(user.sandbox.unwrap().contains("elevateprivileges=deny"));
        let mut vm = Vm::direct_boot("/k", "/i", "", "/q");
        vm.hardening = hardening(Some("9.2.0"), true);
        assert!(pairs(&command_line(&vm)).contains(&("-run-with".into(), "user=nobody".into())));
    }

    #[test]
    fn the_network_is_restricted_unless_the_operator_lets_guests_out() {
        let mut vm = Vm::direct_boot("/k", "/i", "", "/q");
        vm.port_forwards = vec![PortForward {
            host: 8080,
            guest: 80,
            host_ip: None,
            protocol: Protocol::Tcp,
        }];
        let netdev = |vm: &Vm| {
            pairs(&command_line(vm))
                .into_iter()
                .find(|(k, _)| k == "-netdev")
                .map(|(_, v)| v)
                .unwrap()
        };
        assert_eq!(
            netdev(&vm),
            "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:8080-:80"
        );
        // From a checked task config: the plugin's guest_outbound_network decides.
        let task: TaskConfig = serde_json::from_str(r#"{"kernel":"/k"}"#).unwrap();
        let checked = |restrict_network| Checked {
            disk: None,
            kernel: Some("/k".into()),
            initrd: None,
            restrict_network,
        };
        let of = |restrict| {
            let mut vm = Vm::of_task(
                &task,
                checked(restrict),
                0,
                "/q".into(),
                vm.hardening.clone(),
            );
            vm.port_forwards = vec![PortForward {
                host: 8080,
                guest: 80,
                host_ip: None,
                protocol: Protocol::Tcp,
            }];
            netdev(&vm)
        };
        assert!(of(true).contains(",restrict=on"));
        assert!(!of(false).contains("restrict"), "{}", of(false));
    }

    #[test]
    fn no_memory_and_no_image_leave_qemus_defaults() {
        let args = command_line(&Vm::direct_boot("/k", "/i", "", "/q"));
        assert!(
            !args
                .iter()
                .any(|a| a == "-m" || a == "-drive" || a == "-device")
        );
    }
}
