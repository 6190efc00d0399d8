//! The fingerprint's facts: which `qemu-system-*` emulators exist, qemu's version, and
//! whether KVM works here.
//!
//! KVM is *tried*, not inferred: a `/dev/kvm` that opens is not enough (on some hosts
//! it is a paravirtual hypervisor under which a stock guest kernel hangs). The probe
//! starts `qemu-system-x86_64 -machine <m>,accel=kvm` on a tiny guest that needs no
//! image (e.g. `-machine none` is not enough: it creates no vCPU; a few bytes of
//! real-mode code that writes to the debug exit port, or `-kernel` of a tiny blob), and
//! only a clean exit within a short bound says "works". The result is cached per
//! emulator path + mtime: the fingerprint runs every few seconds.

use std::path::PathBuf;

/// One emulator binary found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emulator {
    /// The target architecture (`x86_64`, `aarch64`, …), from `qemu-system-<arch>`.
    pub arch: String,
    /// The binary.
    pub path: PathBuf,
}

/// Everything the fingerprint reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Emulators found (in the plugin's `emulators` dirs, else `PATH`), by arch.
    pub emulators: Vec<Emulator>,
    /// `qemu-system-x86_64 --version`'s first line's version (`7.2.22`), when found.
    pub version: Option<String>,
    /// Whether a guest ran under KVM; `Err(reason)` otherwise (no /dev/kvm, the trial
    /// guest hung or failed: the reason says which).
    pub kvm: Result<(), String>,
}

/// Look for emulators in `dirs` (or `PATH` when empty), ask the x86_64 one (else the
/// first) for its version, and try KVM. Never panics; a missing qemu is `emulators`
/// empty.
pub async fn probe(dirs: &[PathBuf]) -> Probe {
    let _ = dirs;
    Probe {
        emulators: Vec::new(),
        version: None,
        kvm: Err("FOUNDATION STUB".into()),
    }
}
