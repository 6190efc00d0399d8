//! The rules for a task's extra qemu arguments (`args`) and the plugin's
//! `args_allowlist`.
//!
//! qemu reads its command line as flags (`-name`, `--name`), each followed by exactly
//! one value when the flag takes one, and takes **any other argument as a disk image**
//! (`-hda`), opened as root read-write. So `args` is parsed the way qemu parses it:
//! every element is an allowlisted flag, or the one value of the flag just before it
//! when that flag is in [`TAKES_VALUE`]; anything else is refused. A flag missing from
//! [`TAKES_VALUE`] that does take a value only gets refused (its value reads as a
//! stray argument); the table errs on that side.
//!
//! Some flags no allowlist can enable ([`DENIED`]): the ones the driver sets itself
//! and the ones that name host files, devices or sockets, or undo qemu's confinement.
//! The values of allowed flags are checked as well ([`check_value`]): none may name a
//! host file.

/// qemu flags (without their dashes) that take a value: the `HAS_ARG` options of
/// qemu 7.2's `qemu-options.hx`, as `qemu-system-x86_64 -FLAG` answers "requires an
/// argument" (checked one by one against qemu 7.2.22), plus `run-with` (qemu 9.1).
pub const TAKES_VALUE: &[&str] = &[
    "D",
    "L",
    "M",
    "accel",
    "acpitable",
    "action",
    "add-fd",
    "append",
    "audio",
    "audiodev",
    "bios",
    "blockdev",
    "boot",
    "cdrom",
    "chardev",
    "chroot",
    "compat",
    "cpu",
    "d",
    "debugcon",
    "device",
    "dfilter",
    "display",
    "drive",
    "dtb",
    "dump-vmstate",
    "echr",
    "fda",
    "fdb",
    "fsdev",
    "fw_cfg",
    "g",
    "gdb",
    "global",
    "hda",
    "hdb",
    "hdc",
    "hdd",
    "icount",
    "incoming",
    "initrd",
    "iscsi",
    "k",
    "kernel",
    "loadvm",
    "m",
    "machine",
    "mem-path",
    "mon",
    "monitor",
    "msg",
    "mtdblock",
    "name",
    "net",
    "netdev",
    "nic",
    "numa",
    "object",
    "option-rom",
    "overcommit",
    "parallel",
    "pflash",
    "pidfile",
    "plugin",
    "prom-env",
    "qmp",
    "qmp-pretty",
    "qtest",
    "qtest-log",
    "readconfig",
    "rotate",
    "rtc",
    "run-with",
    "runas",
    "sandbox",
    "sd",
    "seed",
    "semihosting-config",
    "serial",
    "set",
    "smbios",
    "smp",
    "spice",
    "tpmdev",
    "trace",
    "usbdevice",
    "uuid",
    "vga",
    "virtfs",
    "vnc",
    "watchdog-action",
    "xen-domid",
];

/// Flags (without dashes) that no `args_allowlist` can enable, by why:
pub const DENIED: &[&str] = &[
    // Set by the driver: a second one would override or add to its choice (disk,
    // kernel, console, QMP, accelerator, memory, network).
    "nodefaults",
    "no-user-config",
    "display",
    "nographic",
    "serial",
    "qmp",
    "qmp-pretty",
    "machine",
    "M",
    "accel",
    "enable-kvm",
    "smp",
    "m",
    "drive",
    "kernel",
    "initrd",
    "append",
    "netdev",
    // Undo qemu's confinement (seccomp, dropping root) or let it escape its executor.
    "sandbox",
    "runas",
    "run-with",
    "chroot",
    "daemonize",
    "preconfig",
    // Open host files, devices or directories (as root, before qemu drops it).
    "blockdev",
    "hda",
    "hdb",
    "hdc",
    "hdd",
    "fda",
    "fdb",
    "cdrom",
    "mtdblock",
    "sd",
    "pflash",
    "snapshot",
    "bios",
    "L",
    "option-rom",
    "dtb",
    "acpitable",
    "fw_cfg",
    "mem-path",
    "add-fd",
    "readconfig",
    "pidfile",
    "D",
    "d",
    "dfilter",
    "trace",
    "dump-vmstate",
    "plugin",
    "virtfs",
    "fsdev",
    "object",
    "tpmdev",
    "audiodev",
    "audio",
    "iscsi",
    "semihosting",
    "semihosting-config",
    "loadvm",
    "incoming",
    "usbdevice",
    "xen-domid",
    "xen-attach",
    "xen-domid-restrict",
    // Open sockets or listen on host ports, or reach other backends by name.
    "chardev",
    "mon",
    "monitor",
    "parallel",
    "debugcon",
    "gdb",
    "s",
    "qtest",
    "qtest-log",
    "net",
    "nic",
    "spice",
    "vnc",
    // Change any option or device type's properties, the driver's included
    // (`-set drive.…`, `-global virtio-net-pci.romfile=…`).
    "set",
    "global",
];

/// Fragments of a `key=` in a flag's value that name a host file, directory, device,
/// descriptor or socket, or a qemu backend (which the task cannot create, but the
/// driver's own are there): `file=`, `romfile=`, `path=`, `mem-path=`, `script=`,
/// `sock=`, `dir=`, `fd=`, `host=`, `sysfsdev=`, `chardev=`, `drive=`, `netdev=`,
/// `pcap=` (every USB device's capture file, created or emptied as root, relative to
/// qemu's working directory `/`), …
const FILE_KEY_FRAGMENTS: &[&str] = &[
    "file", "path", "rom", "script", "sock", "dir", "fd", "host", "dev", "drive", "splash", "data",
    "log", "pcap",
];

/// Device models (`-device`'s driver, by prefix) that reach the host without any
/// key naming it: they open host devices (`/dev/vhost-vsock`, `/dev/vhost-scsi`,
/// `/dev/vfio/…`), pass host USB devices through (`usb-host` with no filter takes any),
/// or read host files by default (`ccid-card-emulated`'s NSS database).
const DENIED_DEVICES: &[&str] = &[
    "vfio",
    "vhost",
    "usb-host",
    "usb-redir",
    "pci-assign",
    "kvm-pci-assign",
    "xen",
    "ivshmem",
    "virtio-9p",
    "ccid-card",
    // Hands a host U2F security key (found by scanning /dev/hidraw*) to the guest.
    "u2f",
];

/// `-flag` or `--flag` → `flag`; `None` for anything else (a plain argument, `-`,
/// `---flag`).
pub fn flag_name(arg: &str) -> Option<&str> {
    let name = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    (!name.is_empty() && !name.starts_with('-')).then_some(name)
}

/// Why an `args_allowlist` entry is refused, if it is.
pub fn check_allowlist_entry(entry: &str) -> Result<(), String> {
    let Some(name) = flag_name(entry) else {
        return Err(format!(
            "args_allowlist entry {entry:?} is not a qemu flag (flags are `-name` or `--name`)"
        ));
    };
    if DENIED.contains(&name) {
        return Err(format!(
            "args_allowlist entry {entry:?} can never be allowed: the driver sets it itself, \
             or it names host files, devices or sockets, or it undoes qemu's confinement"
        ));
    }
    Ok(())
}

/// Why `value`, given to the allowed flag `flag`, is refused, if it is: it names a
/// host file (any `/`, or a key such as `file=`, `romfile=`, `path=`), or is JSON
/// (whose keys are not checked here).
pub fn check_value(flag: &str, value: &str) -> Result<(), String> {
    let refuse = |why: &str| {
        Err(format!(
            "args: value {value:?} of {flag} is refused: {why}; qemu opens such files as \
             root"
        ))
    };
    if value.contains('/') {
        return refuse("it contains `/`, a host path");
    }
    if value.trim_start().starts_with('{') {
        return refuse("JSON option values are not accepted");
    }
    // qemu's `key=value,…`, where `,,` is a literal comma; `-device`'s first item
    // may be its driver without `driver=`.
    let is_device = flag_name(flag) == Some("device");
    for (i, item) in value.replace(",,", "\u{0}").split(',').enumerate() {
        let model = match item.split_once('=') {
            Some(("driver", model)) => Some(model),
            None if i == 0 => Some(item),
            _ => None,
        };
        if let Some(model) = model.filter(|_| is_device)
            && let Some(denied) = DENIED_DEVICES.iter().find(|d| model.starts_with(*d))
        {
            return Err(format!(
                "args: value {value:?} of {flag} is refused: device models {denied}* reach \
                 host devices or files"
            ));
        }
        let Some((key, _)) = item.split_once('=') else {
            continue;
        };
        let lower = key.to_ascii_lowercase();
        if let Some(fragment) = FILE_KEY_FRAGMENTS.iter().find(|f| lower.contains(*f)) {
            return refuse(&format!(
                "its key {key:?} (like every key containing {fragment:?}) may name a host \
                 file, device or socket"
            ));
        }
    }
    Ok(())
}

/// Check a task's `args` against `allowlist` (entries already checked by
/// [`check_allowlist_entry`]): each element an allowed flag, or the one value of the
/// flag before it when that flag takes one; each value checked by [`check_value`].
pub fn check_args(args: &[String], allowlist: &[String]) -> Result<(), String> {
    if args.is_empty() {
        return Ok(());
    }
    if allowlist.is_empty() {
        return Err(format!(
            "args {args:?} are not allowed: the plugin's args_allowlist is empty, so no \
             extra qemu arguments may be given"
        ));
    }
    let allowed = |name: &str| {
        allowlist
            .iter()
            .filter_map(|a| flag_name(a))
            .any(|a| a == name)
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(name) = flag_name(arg) else {
            return Err(format!(
                "args: {arg:?} is neither a flag nor the value of the flag before it, and \
                 qemu would open it as a disk image"
            ));
        };
        if DENIED.contains(&name) || !allowed(name) {
            return Err(format!(
                "args: flag {arg} is not in the plugin's args_allowlist ({})",
                allowlist.join(", ")
            ));
        }
        if TAKES_VALUE.contains(&name) {
            let Some(value) = rest.next() else {
                return Err(format!("args: flag {arg} needs a value after it"));
            };
            check_value(arg, value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    fn check(args: &[&str], allow: &[&str]) -> Result<(), String> {
        check_args(&strings(args), &strings(allow))
    }

    #[test]
    fn a_plain_argument_is_refused_as_a_would_be_disk_image() {
        // The review's attack: no flag at all, nothing to allowlist.
        let err = check(&["/etc/shadow"], &[]).unwrap_err();
        assert!(
            err.contains("/etc/shadow") && err.contains("args_allowlist is empty"),
            "{err}"
        );
        for args in [
            &["/etc/shadow"][..],
            &["-device", "virtio-rng-pci", "/dev/sda"],
            &["nbd:localhost:10809"],
            // -no-reboot takes no value: what follows is a stray argument.
            &["-no-reboot", "shadow"],
        ] {
            let err = check(args, &["-device", "-no-reboot"]).unwrap_err();
            assert!(
                err.contains(args[args.len() - 1]) && err.contains("disk image"),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn a_flags_value_is_taken_even_when_it_starts_with_a_dash() {
        assert_eq!(check(&["-rtc", "-x"], &["-rtc"]), Ok(()));
        assert_eq!(
            check(
                &["--device", "virtio-rng-pci", "-no-reboot"],
                &["-device", "--no-reboot"]
            ),
            Ok(())
        );
        let err = check(&["-device"], &["-device"]).unwrap_err();
        assert!(err.contains("-device needs a value"), "{err}");
    }

    #[test]
    fn flags_are_one_or_two_dashes_and_allowlisted() {
        assert_eq!(flag_name("-device"), Some("device"));
        assert_eq!(flag_name("--device"), Some("device"));
        assert_eq!(flag_name("---device"), None);
        assert_eq!(flag_name("-"), None);
        assert_eq!(flag_name("device"), None);
        let err = check(&["-usb"], &["-device"]).unwrap_err();
        assert!(err.contains("-usb") && err.contains("-device"), "{err}");
    }

    #[test]
    fn denied_flags_cannot_be_allowlisted() {
        for flag in [
            "-drive",
            "--blockdev",
            "-hda",
            "-cdrom",
            "-chardev",
            "-netdev",
            "-nic",
            "-object",
            "-qmp",
            "-monitor",
            "-serial",
            "-kernel",
            "-append",
            "-incoming",
            "-loadvm",
            "-plugin",
            "-virtfs",
            "-sandbox",
            "-runas",
            "-run-with",
            "-chroot",
            "-readconfig",
            "-bios",
            "-option-rom",
            "-fw_cfg",
            "-acpitable",
            "-D",
            "-pidfile",
            "-mem-path",
            "-add-fd",
            "-L",
            "-trace",
            "-d",
            "-global",
            "-set",
            "-s",
            "-gdb",
            "-daemonize",
        ] {
            let err = check_allowlist_entry(flag).unwrap_err();
            assert!(err.contains(flag) && err.contains("never"), "{flag}: {err}");
        }
        assert_eq!(check_allowlist_entry("-smbios"), Ok(()));
        assert!(check_allowlist_entry("smbios").is_err());
        // Even if an entry slipped through, the task's flag is refused.
        assert!(check(&["-drive", "x"], &["-drive"]).is_err());
    }

    #[test]
    fn values_naming_host_files_are_refused() {
        for (flag, value) in [
            ("-smbios", "file=/root-only"),
            ("-smbios", "file=shadow"),
            ("-device", "loader,file=/root-only,addr=0x200000"),
            ("-device", "loader,file=x,addr=0x200000"),
            ("-device", "e1000,romfile=x"),
            ("-device", "vfio-pci,host=01:00.0"),
            ("-device", "vfio-pci,sysfsdev=x"),
            ("-device", "usb-host,hostbus=1,hostaddr=2"),
            ("-device", "isa-serial,chardev=compat_monitor0"),
            ("-device", "vhost-vsock-pci,vhostfd=3"),
            ("-device", r#"{"driver":"loader","file":"x"}"#),
            ("-boot", "splash=x"),
            ("-icount", "shift=1,rr=record,rrfile=x"),
            ("-device", "usb-kbd,pcap=vmlinuz"),
        ] {
            let err = check(&[flag, value], &[flag]).unwrap_err();
            assert!(
                err.contains(flag) && err.contains(&format!("{value:?}")),
                "{err}"
            );
        }
        for value in [
            "vhost-vsock-pci,guest-cid=3",
            "usb-host",
            "driver=vfio-pci",
            "vhost-scsi-pci,wwpn=x",
            "ccid-card-emulated",
            "u2f-passthru",
        ] {
            let err = check(&["--device", value], &["-device"]).unwrap_err();
            assert!(err.contains("device models"), "{value}: {err}");
        }
        // Not a device: the same words are no model name to -name.
        assert_eq!(check(&["-name", "usb-host"], &["-name"]), Ok(()));
        // `,,` is a comma inside a value, not a new key.
        assert_eq!(check(&["-smbios", "type=1,,file=x"], &["-smbios"]), Ok(()));
        for (flag, value) in [
            ("-smbios", "type=1,manufacturer=drover"),
            ("-device", "virtio-rng-pci"),
            ("-rtc", "base=utc,clock=vm"),
        ] {
            assert_eq!(check(&[flag, value], &[flag]), Ok(()), "{value}");
        }
    }
}
