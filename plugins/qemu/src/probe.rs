//! The fingerprint's facts: which `qemu-system-*` emulators exist, qemu's version, and
//! whether KVM works here.
//!
//! KVM is *tried*, not inferred: a `/dev/kvm` that opens is not enough (on some hosts
//! it is a paravirtual hypervisor under which a stock guest kernel hangs). The probe
//! starts `qemu-system-x86_64 -machine pc,accel=kvm` on a tiny guest that needs no
//! image (a few dozen bytes of x86 code, booted as the BIOS): it goes from real mode to 64-bit mode,
//! as every kernel does, and writes to the `isa-debug-exit` port. Only that exit within
//! [`KVM_TRIAL_LIMIT`] says "works"; code that stayed in real mode would not do (it
//! exits fine under the hypervisor that hangs kernels). The same guest is proven to
//! exit under TCG by the tests, so a "does not work" is about KVM, not the trial. The
//! result is cached per emulator path + mtime: the fingerprint runs every few seconds.

use std::collections::HashMap;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use tokio::io::AsyncReadExt as _;
use tokio::process::Command;

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
    /// Emulators found but not used, each with why ([`check_emulator`]): one someone
    /// else could replace would run as root.
    pub skipped: Vec<String>,
    /// `qemu-system-x86_64 --version`'s first line's version (`7.2.22`), when found.
    pub version: Option<String>,
    /// Whether a guest ran under KVM; `Err(reason)` otherwise (no /dev/kvm, the trial
    /// guest hung or failed: the reason says which).
    pub kvm: Result<(), String>,
}

/// The KVM device.
const KVM_DEVICE: &str = "/dev/kvm";

/// How long the trial guest may take. It runs a few dozen instructions: under KVM it
/// exits in well under 100 ms, so anything near this bound is a hang.
pub const KVM_TRIAL_LIMIT: Duration = Duration::from_secs(3);

/// How long `qemu-system-* --version` may take, and how much of its output is read.
const VERSION_LIMIT: Duration = Duration::from_secs(5);
const OUTPUT_LIMIT: u64 = 4096;

/// What the trial guest writes to the `isa-debug-exit` port; qemu then exits with
/// `(value << 1) | 1`.
const TRIAL_EXIT_VALUE: u8 = 0x2a;
const TRIAL_EXIT_STATUS: i32 = ((TRIAL_EXIT_VALUE as i32) << 1) | 1;

/// The trial guest: x86 code run as the BIOS (`-bios`), no image needed. It does what
/// every 64-bit kernel does first, and what hangs under a KVM that cannot run stock
/// guests (tried here: on these machines' PVM hypervisor the switch to protected mode
/// already never completes, while code that stays in real mode exits fine, so a
/// real-mode-only trial would say "works" and lie):
/// real mode → protected mode → PAE paging and long mode → 64-bit code that writes
/// [`TRIAL_EXIT_VALUE`] to port 0xf4 and halts.
///
/// Placed at the start of a 64 KiB BIOS image, which qemu maps at 0xF0000 (linear);
/// the reset vector (F000:FFF0) jumps to F000:0000. Page tables are written into RAM at
/// 0x1000–0x3FFF, identity-mapping the first 2 MiB with one large page.
#[rustfmt::skip]
const TRIAL_CODE: &[u8] = &[
    // 0x00 (16-bit)
    0xfa,                                     // cli
    0x2e, 0x66, 0x0f, 0x01, 0x16, 0xa0, 0x00, // lgdtl %cs:0xa0   (gdtr below)
    0x0f, 0x20, 0xc0,                         // mov %cr0,%eax
    0x66, 0x83, 0xc8, 0x01,                   // or $1,%eax       (PE)
    0x0f, 0x22, 0xc0,                         // mov %eax,%cr0
    0x66, 0xea, 0x1a, 0x00, 0x0f, 0x00, 0x08, 0x00, // ljmpl $0x08,$0xf001a
    // 0x1a (32-bit)
    0x66, 0xb8, 0x10, 0x00,                   // mov $0x10,%ax
    0x8e, 0xd8,                               // mov %ax,%ds
    0x8e, 0xc0,                               // mov %ax,%es
    0x8e, 0xd0,                               // mov %ax,%ss
    0xc7, 0x05, 0x00, 0x10, 0x00, 0x00, 0x03, 0x20, 0x00, 0x00, // movl $0x2003,0x1000 (PML4[0])
    0xc7, 0x05, 0x00, 0x20, 0x00, 0x00, 0x03, 0x30, 0x00, 0x00, // movl $0x3003,0x2000 (PDPT[0])
    0xc7, 0x05, 0x00, 0x30, 0x00, 0x00, 0x83, 0x00, 0x00, 0x00, // movl $0x83,0x3000   (PD[0]: 2 MiB page)
    0x0f, 0x20, 0xe0,                         // mov %cr4,%eax
    0x83, 0xc8, 0x20,                         // or $0x20,%eax    (PAE)
    0x0f, 0x22, 0xe0,                         // mov %eax,%cr4
    0xb8, 0x00, 0x10, 0x00, 0x00,             // mov $0x1000,%eax
    0x0f, 0x22, 0xd8,                         // mov %eax,%cr3
    0xb9, 0x80, 0x00, 0x00, 0xc0,             // mov $0xc0000080,%ecx (EFER)
    0x0f, 0x32,                               // rdmsr
    0x0d, 0x00, 0x01, 0x00, 0x00,             // or $0x100,%eax   (LME)
    0x0f, 0x30,                               // wrmsr
    0x0f, 0x20, 0xc0,                         // mov %cr0,%eax
    0x0d, 0x00, 0x00, 0x00, 0x80,             // or $0x80000000,%eax (PG)
    0x0f, 0x22, 0xc0,                         // mov %eax,%cr0
    0xea, 0x73, 0x00, 0x0f, 0x00, 0x18, 0x00, // ljmp $0x18,$0xf0073
    // 0x73 (64-bit)
    0xb0, TRIAL_EXIT_VALUE,                   // mov $TRIAL_EXIT_VALUE,%al
    0xe6, 0xf4,                               // out %al,$0xf4
    0xf4,                                     // 1: hlt
    0xeb, 0xfd,                               // jmp 1b
    0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00,       // nop (align the GDT to 8)
    // 0x80: the GDT
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // null
    0xff, 0xff, 0x00, 0x00, 0x00, 0x9a, 0xcf, 0x00, // 0x08: 32-bit code, 4 GiB
    0xff, 0xff, 0x00, 0x00, 0x00, 0x92, 0xcf, 0x00, // 0x10: data, 4 GiB
    0xff, 0xff, 0x00, 0x00, 0x00, 0x9a, 0xaf, 0x00, // 0x18: 64-bit code
    // 0xa0: gdtr (limit, base)
    0x1f, 0x00, 0x80, 0x00, 0x0f, 0x00,
];

/// A 64 KiB BIOS image (qemu wants a multiple of 64 KiB) with `code` at its start and
/// a reset vector that jumps to it.
fn bios_image(code: &[u8]) -> Vec<u8> {
    const SIZE: usize = 64 * 1024;
    const RESET_VECTOR: usize = 0xfff0;
    let mut image = vec![0u8; SIZE];
    image[..code.len()].copy_from_slice(code);
    // ljmp $0xf000,$0x0000
    image[RESET_VECTOR..RESET_VECTOR + 5].copy_from_slice(&[0xea, 0x00, 0x00, 0x00, 0xf0]);
    image
}

/// Look for emulators in `dirs` (or `PATH` when empty), ask the x86_64 one (else the
/// first) for its version, and try KVM. Never panics; a missing qemu is `emulators`
/// empty.
pub async fn probe(dirs: &[PathBuf]) -> Probe {
    let searched: Vec<PathBuf> = if dirs.is_empty() {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default()
    } else {
        dirs.to_vec()
    };
    let (emulators, skipped) = find_emulators(&searched);
    let Some(main) = emulators
        .iter()
        .find(|e| e.arch == "x86_64")
        .or(emulators.first())
    else {
        let shown: Vec<String> = searched.iter().map(|d| d.display().to_string()).collect();
        return Probe {
            emulators,
            skipped,
            version: None,
            kvm: Err(format!(
                "no qemu-system-* emulator in {}",
                if shown.is_empty() {
                    "PATH (unset)".to_owned()
                } else {
                    shown.join(":")
                }
            )),
        };
    };
    let facts = FACTS.facts(main, Path::new(KVM_DEVICE)).await;
    Probe {
        emulators,
        skipped,
        version: facts.version,
        kvm: facts.kvm,
    }
}

/// Why the emulator binary at `path` must not be run (as root), if it must not: it,
/// its directory, or (for a link) the file it leads to and that file's directory are
/// writable by group or others, or owned by someone other than root or the plugin's
/// user. Anyone who could replace it would have their program run as root.
pub fn check_emulator(path: &Path) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    let check = |what: &str, path: &Path| -> Result<(), String> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(format!(
                "{what} {} is {}-writable (mode {mode:04o}): another user could replace \
                 qemu, which runs as root; fix: chmod go-w {}",
                path.display(),
                if mode & 0o002 != 0 { "world" } else { "group" },
                path.display()
            ));
        }
        if meta.uid() != 0 && meta.uid() != me {
            return Err(format!(
                "{what} {} is owned by uid {}, not by root or the plugin's uid {me}; \
                 fix: chown root {}",
                path.display(),
                meta.uid(),
                path.display()
            ));
        }
        Ok(())
    };
    let parent = |p: &Path| p.parent().map(Path::to_owned).unwrap_or_else(|| "/".into());
    check("directory", &parent(path))?;
    let target = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if target != path {
        check("directory", &parent(&target))?;
    }
    check("emulator", &target)
}

/// The `qemu-system-<arch>` executables in `dirs` that pass [`check_emulator`] (the
/// others are returned as reasons); the first directory holding an arch wins (as in
/// `PATH`). Sorted by arch.
fn find_emulators(dirs: &[PathBuf]) -> (Vec<Emulator>, Vec<String>) {
    let mut found: Vec<Emulator> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "emulator directory unreadable");
                continue;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(arch) = name.to_str().and_then(|n| n.strip_prefix("qemu-system-")) else {
                continue;
            };
            // Debian's `qemu-system-x86_64-microvm` is a build of x86_64 for one
            // machine type, not another architecture.
            let is_arch =
                !arch.is_empty() && arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !is_arch || found.iter().any(|e| e.arch == arch) {
                continue;
            }
            let path = entry.path();
            let executable = std::fs::metadata(&path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if !executable {
                continue;
            }
            match check_emulator(&path) {
                Ok(()) => found.push(Emulator {
                    arch: arch.to_owned(),
                    path,
                }),
                Err(why) => {
                    tracing::warn!(emulator = %path.display(), reason = %why, "emulator skipped");
                    // Bounded: PATH holds few directories, each a few qemu binaries.
                    if skipped.len() < 16 {
                        skipped.push(why);
                    }
                }
            }
        }
    }
    found.sort_by(|a, b| a.arch.cmp(&b.arch));
    (found, skipped)
}

/// What is learned by running an emulator: cached, since it costs up to
/// [`KVM_TRIAL_LIMIT`] and the fingerprint asks every few seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Facts {
    version: Option<String>,
    kvm: Result<(), String>,
}

/// [`Facts`] per emulator path, valid while the binary's mtime is unchanged (an
/// upgrade replaces it). One entry per path, so it stays as small as the emulator list.
struct FactsCache {
    entries: tokio::sync::Mutex<HashMap<PathBuf, (SystemTime, Facts)>>,
    /// How many times facts were computed rather than cached (for tests).
    computed: std::sync::atomic::AtomicUsize,
}

static FACTS: LazyLock<FactsCache> = LazyLock::new(FactsCache::new);

impl FactsCache {
    fn new() -> FactsCache {
        FactsCache {
            entries: tokio::sync::Mutex::new(HashMap::new()),
            computed: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The facts of `emulator`, from the cache when its mtime has not changed. The lock
    /// is held while computing, so concurrent fingerprints run one trial, not several.
    async fn facts(&self, emulator: &Emulator, kvm_device: &Path) -> Facts {
        let mtime = std::fs::metadata(&emulator.path).and_then(|m| m.modified());
        let mut entries = self.entries.lock().await;
        if let (Ok(mtime), Some((cached_mtime, facts))) = (&mtime, entries.get(&emulator.path))
            && cached_mtime == mtime
        {
            return facts.clone();
        }
        self.computed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let facts = Facts {
            version: version(&emulator.path).await,
            kvm: if emulator.arch == "x86_64" {
                try_kvm(&emulator.path, kvm_device).await
            } else {
                Err(format!(
                    "no qemu-system-x86_64 to try KVM with (found {})",
                    emulator.path.display()
                ))
            },
        };
        match &facts.kvm {
            Ok(()) => tracing::info!(emulator = %emulator.path.display(), "KVM works"),
            Err(why) => {
                tracing::info!(emulator = %emulator.path.display(), reason = %why, "KVM does not work")
            }
        }
        if let Ok(mtime) = mtime {
            entries.insert(emulator.path.clone(), (mtime, facts.clone()));
        }
        facts
    }
}

/// `qemu --version`'s version, bounded in time and output.
async fn version(qemu: &Path) -> Option<String> {
    let mut child = Command::new(qemu)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| tracing::warn!(qemu = %qemu.display(), error = %e, "cannot run --version"))
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let run = async {
        let mut out = Vec::new();
        let read = (&mut stdout).take(OUTPUT_LIMIT).read_to_end(&mut out).await;
        drop(stdout);
        let _ = child.wait().await;
        read.ok().map(|_| out)
    };
    let out = tokio::time::timeout(VERSION_LIMIT, run).await.ok()??;
    let parsed = parse_version(&String::from_utf8_lossy(&out));
    if parsed.is_none() {
        tracing::warn!(qemu = %qemu.display(), "no version in --version's output");
    }
    parsed
}

/// `QEMU emulator version 7.2.22 (Debian …)` → `7.2.22`.
fn parse_version(output: &str) -> Option<String> {
    let first = output.lines().next()?;
    let (_, rest) = first.split_once("version ")?;
    let version = rest.split_whitespace().next()?;
    let plausible = version.len() <= 32
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version.chars().all(|c| c.is_ascii_digit() || c == '.');
    plausible.then(|| version.to_owned())
}

/// Whether a guest runs under KVM with `qemu`: `kvm_device` must exist, then the
/// trial guest must exit as it should within [`KVM_TRIAL_LIMIT`].
async fn try_kvm(qemu: &Path, kvm_device: &Path) -> Result<(), String> {
    if std::env::consts::ARCH != "x86_64" {
        return Err(format!(
            "the KVM trial guest is x86-64 code; this host is {}",
            std::env::consts::ARCH
        ));
    }
    if !kvm_device.exists() {
        return Err(format!("no {}", kvm_device.display()));
    }
    let label = format!("drover-qemu-probe-{}-kvm", std::process::id());
    run_trial(qemu, "kvm", TRIAL_CODE, &label, KVM_TRIAL_LIMIT).await
}

/// Boot `code` as the BIOS of a `pc` machine under `accel` and expect it to exit
/// through `isa-debug-exit` with [`TRIAL_EXIT_STATUS`] within `limit`; a hang is
/// killed. `label` names the image (a memfd, visible in `/proc/PID/fd`) and the VM
/// (`-name`, visible in `ps`).
///
/// The image is an anonymous memory file handed to qemu as `/dev/fd/N`: nothing is
/// written to a shared temp directory, and nothing is left there when the plugin dies
/// mid-trial. qemu gets SIGKILL when the plugin dies (`PR_SET_PDEATHSIG`): a trial hung
/// under a broken KVM would otherwise outlive a plugin killed during its fingerprint,
/// spinning forever (seen here, from test runs that killed the plugin).
async fn run_trial(
    qemu: &Path,
    accel: &str,
    code: &[u8],
    label: &str,
    limit: Duration,
) -> Result<(), String> {
    let image = rustix::fs::memfd_create(label, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| format!("cannot make the trial guest's image (memfd_create): {e}"))?;
    let mut file = std::fs::File::from(image);
    std::io::Write::write_all(&mut file, &bios_image(code))
        .map_err(|e| format!("cannot write the trial guest's image: {e}"))?;
    let image = std::os::fd::OwnedFd::from(file);
    let image_fd = image.as_raw_fd();
    let mut command = Command::new(qemu);
    command
        .arg("-machine")
        .arg(format!("pc,accel={accel}"))
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-m",
            "16",
        ])
        .args(["-name", label])
        .arg("-bios")
        .arg(format!("/dev/fd/{image_fd}"))
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec and makes two system calls
    // (prctl, fcntl), both async-signal-safe, allocating nothing. The image descriptor
    // is open in the child (CLOEXEC closes it only at exec, which this clears for the
    // child alone); `image` outlives the spawn. The death signal follows the thread
    // that forks: a runtime worker, which lives as long as the plugin does.
    // The plugin's pid, for the child to see that its parent is still the plugin once
    // the death signal is armed (a parent killed before that never sends it).
    let parent = rustix::process::getpid();
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            if rustix::process::getppid() != Some(parent) {
                return Err(rustix::io::Errno::SRCH.into());
            }
            let fd = std::os::fd::BorrowedFd::borrow_raw(image_fd);
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    drop(image);
    let mut stderr = child.stderr.take();
    let run = async {
        let mut err = Vec::new();
        if let Some(stderr) = stderr.as_mut() {
            let _ = stderr.take(OUTPUT_LIMIT).read_to_end(&mut err).await;
        }
        drop(stderr);
        (child.wait().await, err)
    };
    let (status, err) = match tokio::time::timeout(limit, run).await {
        Ok(done) => done,
        Err(_) => {
            let _ = child.kill().await;
            return Err(format!(
                "a tiny guest entering 64-bit mode did not finish within {limit:?} under \
                 accel={accel} (a guest kernel would hang the same way)"
            ));
        }
    };
    let status = status.map_err(|e| format!("waiting for {}: {e}", qemu.display()))?;
    if status.code() == Some(TRIAL_EXIT_STATUS) {
        return Ok(());
    }
    // qemu's own complaint, without its warnings about CPU features.
    let err = String::from_utf8_lossy(&err);
    let complaint: Vec<&str> = err
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("warning:"))
        .collect();
    let mut complaint = complaint.join("; ");
    if complaint.len() > 300 {
        let mut cut = 300;
        while !complaint.is_char_boundary(cut) {
            cut -= 1;
        }
        complaint.truncate(cut);
        complaint.push('…');
    }
    Err(format!(
        "the trial guest under accel={accel} ended with {status} instead of exit status \
         {TRIAL_EXIT_STATUS}{}",
        if complaint.is_empty() {
            String::new()
        } else {
            format!(": {complaint}")
        }
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use drover_test_support::{procs, until, vm};

    use super::*;

    fn qemu() -> Option<PathBuf> {
        vm::rig().map(|r| r.qemu)
    }

    /// Live processes holding the trial image named `label`.
    fn trial_qemus(label: &str) -> Vec<u32> {
        let Ok(proc) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        proc.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                procs::alive(*pid)
                    && std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                        fds.flatten().any(|fd| {
                            std::fs::read_link(fd.path())
                                .is_ok_and(|l| l.to_string_lossy().contains(label))
                        })
                    })
            })
            .collect()
    }

    fn label(test: &str) -> String {
        format!("drover-probe-test-{test}-{}", std::process::id())
    }

    #[tokio::test]
    async fn the_trial_guest_exits_under_tcg() {
        let Some(qemu) = qemu() else { return };
        // Generous: TCG on a loaded machine; it takes well under a second here.
        let t = Instant::now();
        let result = run_trial(
            &qemu,
            "tcg",
            TRIAL_CODE,
            &label("tcg"),
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(
            result,
            Ok(()),
            "the trial guest must work where the CPU is emulated"
        );
        eprintln!("trial guest under TCG: {:?}", t.elapsed());
    }

    #[tokio::test]
    async fn a_hanging_trial_is_killed_and_reported() {
        let Some(qemu) = qemu() else { return };
        let label = label("hang");
        // jmp . : spins forever, like a guest stuck under a broken KVM.
        let limit = Duration::from_secs(1);
        let t = Instant::now();
        let result = run_trial(&qemu, "tcg", &[0xeb, 0xfe], &label, limit).await;
        let took = t.elapsed();
        match result {
            Err(why) => assert!(why.contains("did not finish within 1s"), "{why}"),
            Ok(()) => panic!("a spinning guest passed the trial"),
        }
        assert!(took < limit + Duration::from_secs(5), "took {took:?}");
        let left = trial_qemus(&label);
        assert!(left.is_empty(), "trial qemu still running: {left:?}");
    }

    const TRIAL_CHILD: &str = "DROVER_PROBE_TEST_TRIAL_CHILD";

    /// Not a test on its own: the process that `a_hung_trial_dies_with_its_parent`
    /// starts and kills (does nothing without its variable).
    #[tokio::test]
    async fn trial_child_process() {
        let Ok(label) = std::env::var(TRIAL_CHILD) else {
            return;
        };
        let Some(qemu) = qemu() else { return };
        let _ = run_trial(&qemu, "tcg", &[0xeb, 0xfe], &label, Duration::from_secs(60)).await;
    }

    #[tokio::test]
    async fn a_hung_trial_dies_with_its_parent() {
        let Some(_) = qemu() else { return };
        let label = label("orphan");
        let mut parent = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "probe::tests::trial_child_process"])
            .env(TRIAL_CHILD, &label)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the test binary");
        until(Duration::from_secs(30), "the child's trial qemu", || {
            !trial_qemus(&label).is_empty()
        })
        .await;
        // SIGKILL: no destructor runs, as when an agent kill -9s the plugin.
        parent.kill().expect("kill the child");
        parent.wait().expect("reap the child");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left = trial_qemus(&label);
        while !left.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            left = trial_qemus(&label);
        }
        // Not left running when the test fails.
        for pid in &left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(
            left.is_empty(),
            "the trial qemu outlived its parent: {left:?}"
        );
    }

    #[tokio::test]
    async fn a_trial_that_exits_otherwise_says_how() {
        let Some(qemu) = qemu() else { return };
        let label = label("other");
        // mov $0x10,%al; out %al,$0xf4: qemu exits 33.
        let code = [0xb0, 0x10, 0xe6, 0xf4, 0xf4];
        let result = run_trial(&qemu, "tcg", &code, &label, Duration::from_secs(30)).await;
        match result {
            Err(why) => assert!(why.contains("exit status: 33"), "{why}"),
            Ok(()) => panic!("a wrong exit status passed the trial"),
        }
        // And an accelerator qemu does not have: its own error is in the reason.
        let result = run_trial(&qemu, "nosuch", TRIAL_CODE, &label, Duration::from_secs(30)).await;
        match result {
            Err(why) => assert!(why.contains("nosuch"), "{why}"),
            Ok(()) => panic!("an unknown accelerator passed the trial"),
        }
    }

    #[tokio::test]
    async fn no_kvm_device_is_the_reason() {
        let Some(qemu) = qemu() else { return };
        assert_eq!(
            try_kvm(&qemu, Path::new("/nonexistent/kvm")).await,
            Err("no /nonexistent/kvm".to_owned())
        );
    }

    #[tokio::test]
    async fn probe_here_finds_qemu_its_version_and_tries_kvm() {
        let Some(qemu) = qemu() else { return };
        let dir = qemu.parent().expect("qemu's directory").to_owned();
        let probe = probe(&[dir]).await;
        assert!(
            probe
                .emulators
                .iter()
                .any(|e| e.arch == "x86_64" && e.path == qemu),
            "{probe:?}"
        );
        let version = probe.version.clone().expect("a version");
        assert!(
            version.split('.').count() >= 2 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
            "{version}"
        );
        match &probe.kvm {
            Ok(()) => eprintln!("KVM here: works (qemu {version})"),
            Err(why) => {
                assert!(!why.is_empty());
                eprintln!("KVM here: {why} (qemu {version})");
            }
        }
    }

    #[tokio::test]
    async fn facts_are_cached_until_the_binary_changes() {
        let Some(qemu) = qemu() else { return };
        let dir = tempfile::tempdir().expect("temp dir");
        let copy = dir.path().join("qemu-system-x86_64");
        std::fs::copy(&qemu, &copy).expect("copy qemu");
        let emulator = Emulator {
            arch: "x86_64".into(),
            path: copy.clone(),
        };
        let cache = FactsCache::new();
        // No KVM device: the facts are cheap, and the cache is what is tested.
        let no_kvm = Path::new("/nonexistent/kvm");
        let first = cache.facts(&emulator, no_kvm).await;
        assert!(first.version.is_some(), "{first:?}");
        assert_eq!(cache.facts(&emulator, no_kvm).await, first);
        assert_eq!(
            cache.computed.load(Ordering::Relaxed),
            1,
            "asked twice, ran once"
        );
        let file = std::fs::File::options()
            .write(true)
            .open(&copy)
            .expect("open copy");
        file.set_modified(SystemTime::now() + Duration::from_secs(10))
            .expect("set mtime");
        // Executing a file open for writing fails (ETXTBSY).
        drop(file);
        assert_eq!(cache.facts(&emulator, no_kvm).await, first);
        assert_eq!(
            cache.computed.load(Ordering::Relaxed),
            2,
            "a changed binary is asked again"
        );
    }

    #[tokio::test]
    async fn emulators_are_found_by_name_and_mode() {
        let first = tempfile::tempdir().expect("temp dir");
        let second = tempfile::tempdir().expect("temp dir");
        let make = |dir: &Path, name: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            path
        };
        let x86 = make(first.path(), "qemu-system-x86_64", 0o755);
        make(first.path(), "qemu-system-x86_64-microvm", 0o755);
        make(first.path(), "qemu-system-arm", 0o644); // not executable
        make(first.path(), "qemu-system-", 0o755);
        make(first.path(), "qemu-img", 0o755);
        make(second.path(), "qemu-system-x86_64", 0o755); // shadowed by the first dir
        let aarch64 = make(second.path(), "qemu-system-aarch64", 0o755);
        std::fs::create_dir(first.path().join("qemu-system-riscv64")).expect("mkdir");
        let (found, skipped) = find_emulators(&[
            first.path().to_owned(),
            PathBuf::from("/nonexistent"),
            second.path().to_owned(),
        ]);
        assert_eq!(skipped, Vec::<String>::new());
        assert_eq!(
            found,
            vec![
                Emulator {
                    arch: "aarch64".into(),
                    path: aarch64
                },
                Emulator {
                    arch: "x86_64".into(),
                    path: x86
                },
            ]
        );
    }

    #[test]
    fn emulators_others_could_replace_are_skipped_saying_why() {
        let make = |dir: &Path, mode: u32| {
            let path = dir.join("qemu-system-x86_64");
            std::fs::write(&path, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            path
        };
        // A world-writable binary, in a sound directory.
        let writable = tempfile::tempdir().expect("temp dir");
        let file = make(writable.path(), 0o757);
        // A sound binary in a group-writable directory (anyone in the group could
        // swap it).
        let open_dir = tempfile::tempdir().expect("temp dir");
        make(open_dir.path(), 0o755);
        std::fs::set_permissions(open_dir.path(), std::fs::Permissions::from_mode(0o775))
            .expect("chmod");
        // A link from a sound directory to a binary in a world-writable one.
        let sticky = tempfile::tempdir().expect("temp dir");
        let target = make(sticky.path(), 0o755);
        std::fs::set_permissions(sticky.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        let linked = tempfile::tempdir().expect("temp dir");
        std::os::unix::fs::symlink(&target, linked.path().join("qemu-system-x86_64"))
            .expect("symlink");
        for (dir, words) in [
            (
                writable.path(),
                [
                    format!("emulator {}", file.display()),
                    "world-writable".into(),
                ],
            ),
            (
                open_dir.path(),
                [
                    format!("directory {}", open_dir.path().display()),
                    "group-writable".into(),
                ],
            ),
            (
                linked.path(),
                [
                    format!("directory {}", sticky.path().display()),
                    "world-writable".into(),
                ],
            ),
        ] {
            let (found, skipped) = find_emulators(&[dir.to_owned()]);
            assert_eq!(found, vec![], "{dir:?}");
            assert_eq!(skipped.len(), 1, "{skipped:?}");
            for w in &words {
                assert!(
                    skipped[0].contains(w.as_str()),
                    "{:?} lacks {w:?}",
                    skipped[0]
                );
            }
        }
        // The same binary, fixed, is used.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(find_emulators(&[writable.path().to_owned()]).0.len(), 1);
        // The installed qemu passes.
        if let Some(qemu) = qemu() {
            assert_eq!(check_emulator(&qemu), Ok(()));
        }
    }

    #[tokio::test]
    async fn no_emulator_is_reported_with_where_it_looked() {
        let empty = tempfile::tempdir().expect("temp dir");
        let probe = probe(&[empty.path().to_owned()]).await;
        assert!(probe.emulators.is_empty());
        assert_eq!(probe.version, None);
        let why = probe.kvm.expect_err("no KVM without qemu");
        assert!(
            why.contains("no qemu-system-*") && why.contains(&empty.path().display().to_string()),
            "{why}"
        );
    }

    #[test]
    fn versions_are_read_from_the_first_line() {
        assert_eq!(
            parse_version(
                "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022"
            ),
            Some("7.2.22".into())
        );
        assert_eq!(
            parse_version("QEMU emulator version 10.0.2\n"),
            Some("10.0.2".into())
        );
        assert_eq!(parse_version("qemu: unknown option\n"), None);
        assert_eq!(parse_version("version v1;rm -rf\n"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn the_bios_image_jumps_to_the_code() {
        let image = bios_image(TRIAL_CODE);
        assert_eq!(image.len(), 64 * 1024);
        assert_eq!(&image[..TRIAL_CODE.len()], TRIAL_CODE);
        assert_eq!(&image[0xfff0..0xfff5], &[0xea, 0x00, 0x00, 0x00, 0xf0]);
        // The GDT and its pointer sit where the code's lgdt and far jumps expect.
        assert_eq!(&TRIAL_CODE[0xa0..], &[0x1f, 0x00, 0x80, 0x00, 0x0f, 0x00]);
        assert_eq!(TRIAL_CODE[0x73..0x75], [0xb0, TRIAL_EXIT_VALUE]);
    }
}
