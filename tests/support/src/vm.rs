//! The VM test rig of `scripts/vm-rig.sh`: a Debian cloud kernel and a busybox
//! initramfs that boot under `qemu-system-x86_64 -machine q35,accel=tcg` in a few
//! seconds. [`rig`] finds it (`$DROVER_TEST_VM_KERNEL` / `$DROVER_TEST_VM_INITRD`, which
//! `scripts/test.sh` exports, else `target/drover-vm/` of the workspace); without it,
//! or without qemu, it says so loudly and returns `None`, and under `CI=true` panics.
//!
//! The guest's init takes its orders from the kernel command line (`drover.*=`, see the
//! script's header): [`GUEST_STARTED`] is its first serial line.

use std::path::{Path, PathBuf};

/// The guest init's first line on the serial console.
pub const GUEST_STARTED: &str = "drover-guest: init started";

/// The rig's files.
#[derive(Debug, Clone)]
pub struct Rig {
    /// The kernel (`-kernel`).
    pub kernel: PathBuf,
    /// The busybox initramfs (`-initrd`).
    pub initrd: PathBuf,
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
}

impl Rig {
    /// The kernel command line for a guest with the given `drover.*` orders (e.g.
    /// `["drover.tick=1"]`): serial console on ttyS0, quiet kernel.
    pub fn append(&self, orders: &[&str]) -> String {
        let mut line = String::from("console=ttyS0 quiet panic=-1");
        for o in orders {
            line.push(' ');
            line.push_str(o);
        }
        line
    }
}

fn workspace_root() -> PathBuf {
    // tests/support → the workspace.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn find_qemu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DROVER_TEST_QEMU").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("qemu-system-x86_64"))
            .find(|p| p.is_file())
    })
}

/// The rig, or `None` after a loud `SKIPPED` line (a panic under `CI=true`).
pub fn rig() -> Option<Rig> {
    let from_env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = workspace_root().join("target/drover-vm");
    let kernel = from_env("DROVER_TEST_VM_KERNEL").unwrap_or_else(|| dir.join("vmlinuz"));
    let initrd = from_env("DROVER_TEST_VM_INITRD").unwrap_or_else(|| dir.join("initrd.img"));
    let missing = if !kernel.is_file() || !initrd.is_file() {
        Some(format!(
            "the VM rig is not built ({} / {}): run scripts/vm-rig.sh, or the tests through \
             scripts/test.sh",
            kernel.display(),
            initrd.display()
        ))
    } else {
        None
    };
    let qemu = find_qemu();
    let why = match (missing, &qemu) {
        (None, Some(qemu)) => {
            return Some(Rig {
                kernel,
                initrd,
                qemu: qemu.clone(),
            });
        }
        (Some(why), _) => why,
        (None, None) => {
            "qemu-system-x86_64 is not installed: run scripts/vm-rig.sh (it installs it)".into()
        }
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and {why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}
