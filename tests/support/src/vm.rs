//! The VM test rig of `scripts/vm-rig.sh`: a Debian cloud kernel and a busybox
//! initramfs that boot under `qemu-system-x86_64 -machine q35,accel=tcg` in a few
//! seconds. [`rig`] finds it (`$DROVER_TEST_VM_KERNEL` / `$DROVER_TEST_VM_INITRD`, which
//! `scripts/test.sh` exports, else `target/drover-vm/` of the workspace); without it,
//! or without qemu, it says so loudly and returns `None`, and under `CI=true` panics.
//!
//! The guest's init takes its orders from the kernel command line (`drover.*=`, see the
//! script's header): [`GUEST_STARTED`] is its first serial line.
//!
//! [`Rig::run_on_host`] runs a host program inside a guest whose only cgroup hierarchy
//! is cgroup v2, on the host's own files (shared read-only over virtiofs, under a
//! tmpfs overlay in the guest): how the exec driver's tests run on cgroup v2 from a
//! cgroup v1 host.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// The guest init's last line in host mode, before it powers off: `drover-guest: exit
/// CODE`, CODE being the run program's exit status.
pub const GUEST_EXIT: &str = "drover-guest: exit ";

/// How [`Rig::run_on_host`] boots its guest.
#[derive(Debug, Clone)]
pub struct HostRunOptions {
    /// Guest memory in MiB. The guest's `/tmp` and the overlay's upper layer are tmpfs
    /// in it: what the program writes takes guest memory.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub cpus: u32,
    /// The whole run, boot and power-off included; past it the guest is killed and
    /// the run fails with what it printed so far.
    pub limit: Duration,
    /// The serial output kept: the last this many bytes (what precedes is counted in
    /// [`HostRun::output_dropped`]).
    pub output_limit: usize,
    /// Host directories the program needs at their own paths, besides its own
    /// directory: e.g. the workspace and the target dir whose paths a test binary has
    /// built in. Those under the guest's own `/tmp` or `/run` (a clone under `/tmp`)
    /// are bound there from the host's tree; the others are where they are anyway.
    pub host_dirs: Vec<PathBuf>,
}

impl Default for HostRunOptions {
    fn default() -> Self {
        HostRunOptions {
            memory_mib: 2048,
            cpus: 2,
            limit: Duration::from_secs(600),
            output_limit: 4 << 20,
            host_dirs: Vec::new(),
        }
    }
}

/// What a guest run of [`Rig::run_on_host`] gave.
#[derive(Debug, Clone)]
pub struct HostRun {
    /// The program's exit status, as the guest's init reported it ([`GUEST_EXIT`]).
    pub exit_code: i32,
    /// The serial console: the guest's init and the program's stdout and stderr (the
    /// last [`HostRunOptions::output_limit`] bytes), lossily UTF-8.
    pub output: String,
    /// Bytes of output before [`HostRun::output`] that were not kept.
    pub output_dropped: usize,
    /// From starting virtiofsd to qemu's exit.
    pub elapsed: Duration,
}

/// Where the guest has the host's whole tree (`/host/tmp` is the host's `/tmp`).
pub const GUEST_HOST_TREE: &str = "/host";

/// The guest's own directories, which hide the host's at those paths: tmpfs (`/tmp`,
/// `/run`), the guest's mount of the host's tree, and its kernel's filesystems.
const GUEST_OWN: [&str; 6] = ["/tmp", "/run", GUEST_HOST_TREE, "/dev", "/proc", "/sys"];

/// Of the guest's own directories, those under which a host directory can be bound:
/// the kernel's filesystems (`/dev`, `/proc`, `/sys`) hold nothing of the host's.
const GUEST_BINDABLE: [&str; 3] = ["/tmp", "/run", GUEST_HOST_TREE];

/// The host directories a run binds at their own paths in the guest
/// (`drover.bind=` of `scripts/vm-rig.sh`): of `dirs`, those under a directory of the
/// guest's own, without any under another of them. Panics on a path the kernel command
/// line cannot carry (relative, whitespace, a comma) or under the guest's `/dev`,
/// `/proc` or `/sys`.
fn guest_binds<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut binds: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let shown = dir.display().to_string();
        assert!(
            dir.is_absolute() && !shown.contains(|c: char| c.is_whitespace() || c == ','),
            "run_on_host: {shown:?} must be an absolute path without whitespace or commas"
        );
        let Some(own) = GUEST_OWN.into_iter().find(|own| dir.starts_with(own)) else {
            continue;
        };
        assert!(
            GUEST_BINDABLE.contains(&own),
            "run_on_host: {shown} is under {own}, which the guest has its own of"
        );
        binds.push(dir.to_path_buf());
    }
    binds.sort();
    binds.dedup();
    let all = binds.clone();
    binds.retain(|d| !all.iter().any(|other| other != d && d.starts_with(other)));
    binds
}

/// The virtiofsd binary: `$DROVER_TEST_VIRTIOFSD`, else where Debian's qemu (7.x,
/// `qemu-system-common`) or the Rust virtiofsd package put it.
fn find_virtiofsd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DROVER_TEST_VIRTIOFSD").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    ["/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Run by `unshare --mount --propagation private` for virtiofsd: the host's `/`
/// bound at `$1`, read-only all the way down, in a mount namespace of its own (so that
/// nothing is mounted or unmounted on the host, and the bind goes away with the
/// process). The kernel's filesystems are left out: the guest mounts its own, and a
/// writable host `/proc` or `/sys` must never be reachable from it. A mount that cannot
/// be made read-only is unmounted; if one is still writable at the end, virtiofsd is
/// not started.
const SHARE_SCRIPT: &str = r#"
set -eu
root=$1 virtiofsd=$2 socket=$3
mount --rbind / "$root"
for sub in proc sys dev run; do
    if mountpoint -q "$root/$sub"; then umount -R "$root/$sub"; fi
done
below() { awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo; }
below | sort -r | while read -r escaped; do
    mp=$(printf '%b' "$escaped")
    mount -o remount,bind,ro "$mp" 2>/dev/null || umount -l "$mp"
done
writable=$(awk -v r="$root" '($5 == r || index($5, r "/") == 1) && $6 !~ /(^|,)ro(,|$)/ { print $5 }' /proc/self/mountinfo)
if [ -n "$writable" ]; then
    echo "still writable in the share: $writable" >&2
    exit 1
fi
exec "$virtiofsd" --socket-path="$socket" -o source="$root" -o cache=none -o sandbox=chroot
"#;

/// The qemu and virtiofsd of one [`Rig::run_on_host`]: both killed by pid when it is
/// dropped, on success, failure or panic.
struct HostGuest {
    qemu: Option<Child>,
    virtiofsd: Option<Child>,
}

impl Drop for HostGuest {
    fn drop(&mut self) {
        for child in [self.qemu.as_mut(), self.virtiofsd.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// The last `limit` bytes of what `source` gives until its end, and how many came
/// before them.
fn read_tail(mut source: impl std::io::Read, limit: usize) -> (Vec<u8>, usize) {
    let mut kept: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut dropped = 0;
    let mut buf = [0u8; 8192];
    loop {
        match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                kept.extend(&buf[..n]);
                if kept.len() > limit {
                    let excess = kept.len() - limit;
                    kept.drain(..excess);
                    dropped += excess;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (kept.into(), dropped)
}

fn not_possible(why: &str) -> Option<HostRun> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and a guest on the host's files cannot run: {why}");
    }
    eprintln!("SKIPPED: a guest on the host's files cannot run: {why}");
    None
}

impl Rig {
    /// Boot a guest on the host's files with cgroup v2 as its only hierarchy and run
    /// `program` (a host path) in it as root; wait for it to end and the guest to power
    /// off. `None` after a loud `SKIPPED` line when this host cannot (not root, no
    /// virtiofsd or `unshare`); under `CI=true` that panics instead.
    ///
    /// The guest (`drover.host=1` of `scripts/vm-rig.sh`) sees the host's `/` as the
    /// read-only lower layer of an overlay on tmpfs, so host binaries run in it as
    /// they are and what they write stays in the guest; `/tmp`, `/run`, `/dev`,
    /// `/proc` and `/sys` are the guest's own, and the host's whole tree is at
    /// [`GUEST_HOST_TREE`]. `program`'s directory and [`HostRunOptions::host_dirs`]
    /// are seen at their host paths wherever they are: those under the guest's `/tmp`
    /// or `/run` (a checkout under `/tmp`) are bound there from the host's tree, and
    /// the rest of the guest's `/tmp` stays its own. The call panics on a path under
    /// `/dev`, `/proc` or `/sys`, or one the kernel command line cannot carry
    /// (whitespace, a comma). The program runs with the guest init's environment; it
    /// learns anything else from files next to it.
    ///
    /// How: virtiofsd serves a read-only recursive bind of `/` made in a mount
    /// namespace of its own (nothing is mounted on the host), on a socket in a private
    /// 0700 directory; qemu (TCG) boots the rig with it as virtiofs tag `host`. The
    /// program's output comes back on the serial console, with the kernel's own
    /// messages silenced so that they do not cut into its lines. Both processes are
    /// killed by pid when the run ends, also when it panics (the limit passed, an
    /// unexpected exit).
    pub fn run_on_host(&self, program: &Path, options: &HostRunOptions) -> Option<HostRun> {
        let shown = program.display().to_string();
        assert!(
            program.is_absolute() && !shown.contains(char::is_whitespace),
            "run_on_host: {shown:?} must be an absolute path without whitespace"
        );
        let binds = guest_binds(
            program
                .parent()
                .into_iter()
                .chain(options.host_dirs.iter().map(PathBuf::as_path)),
        );
        if !rustix::process::geteuid().is_root() {
            return not_possible("it needs root (virtiofsd, a mount namespace)");
        }
        let Some(virtiofsd) = find_virtiofsd() else {
            return not_possible(
                "no virtiofsd (qemu-system-common; scripts/vm-rig.sh installs it)",
            );
        };
        let Some(unshare) = ["/usr/bin/unshare", "/bin/unshare"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
        else {
            return not_possible("no unshare (util-linux)");
        };

        let started = Instant::now();
        // tempfile makes the directory 0700: the socket in it is ours alone.
        let dir = tempfile::Builder::new()
            .prefix("drover-vm-host-")
            .tempdir()
            .unwrap_or_else(|e| panic!("run_on_host: a temporary directory: {e}"));
        let share = dir.path().join("root");
        let socket = dir.path().join("virtiofsd.sock");
        std::fs::create_dir(&share)
            .unwrap_or_else(|e| panic!("run_on_host: {}: {e}", share.display()));
        let virtiofsd_log = dir.path().join("virtiofsd.log");
        let log_file = std::fs::File::create(&virtiofsd_log)
            .unwrap_or_else(|e| panic!("run_on_host: {}: {e}", virtiofsd_log.display()));
        let mut guest = HostGuest {
            qemu: None,
            virtiofsd: None,
        };
        let virtiofsd_child = Command::new(unshare)
            .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(SHARE_SCRIPT)
            .arg("share")
            .arg(&share)
            .arg(&virtiofsd)
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("run_on_host: starting {}: {e}", virtiofsd.display()));
        let virtiofsd_log_text = || {
            let mut text = String::new();
            if let Ok(f) = std::fs::File::open(&virtiofsd_log) {
                let _ = f.take(16 << 10).read_to_string(&mut text);
            }
            text
        };
        let virtiofsd_child = guest.virtiofsd.insert(virtiofsd_child);
        let mut exited = None;
        crate::until_blocking(
            Duration::from_secs(20),
            Duration::from_millis(20),
            "virtiofsd's socket appears",
            || {
                exited = virtiofsd_child.try_wait().ok().flatten();
                exited.is_some() || socket.exists()
            },
        );
        if let Some(status) = exited {
            panic!(
                "run_on_host: virtiofsd (or the read-only share before it) ended with {status}:\n{}",
                virtiofsd_log_text()
            );
        }

        let run = format!("drover.run={shown}");
        let bind = format!(
            "drover.bind={}",
            binds
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let memory = format!("{}M", options.memory_mib);
        let mut qemu = Command::new(&self.qemu);
        qemu.args([
            "-machine",
            "q35,accel=tcg",
            "-nodefaults",
            "-no-user-config",
        ])
        .args(["-display", "none", "-monitor", "none", "-serial", "stdio"])
        .args([
            "-no-reboot",
            "-smp",
            &options.cpus.to_string(),
            "-m",
            &memory,
        ])
        .arg("-kernel")
        .arg(&self.kernel)
        .arg("-initrd")
        .arg(&self.initrd)
        .arg("-append")
        // loglevel=1: the kernel's messages (an OOM kill's report) would otherwise
        // land in the middle of the program's lines on the one console.
        .arg(self.append(&["loglevel=1", "drover.host=1", &run, &bind]))
        .arg("-chardev")
        .arg(format!("socket,id=host,path={}", socket.display()))
        .args(["-device", "vhost-user-fs-pci,chardev=host,tag=host"])
        // vhost-user needs the guest's memory shared with virtiofsd.
        .args([
            "-object",
            &format!("memory-backend-memfd,id=mem,size={memory},share=on"),
        ])
        .args(["-numa", "node,memdev=mem"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let qemu = guest.qemu.insert(
            qemu.spawn()
                .unwrap_or_else(|e| panic!("run_on_host: starting {}: {e}", self.qemu.display())),
        );
        let (tx, rx) = mpsc::channel();
        let (Some(stdout), Some(stderr)) = (qemu.stdout.take(), qemu.stderr.take()) else {
            panic!("run_on_host: qemu's output pipes are missing");
        };
        let limit = options.output_limit;
        std::thread::spawn(move || {
            let _ = tx.send(read_tail(stdout, limit));
        });
        let qemu_errors = std::thread::spawn(move || read_tail(stderr, 64 << 10));
        let deadline = started + options.limit;
        // The serial output ends when qemu does: at the guest's power-off.
        let tail = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        let (bytes, output_dropped) = match tail {
            Ok(tail) => tail,
            Err(_) => {
                // Killing qemu ends the output; the reader then hands over what it got.
                drop(guest.qemu.take().map(|mut q| {
                    let _ = q.kill();
                    q.wait()
                }));
                let (bytes, _) = rx.recv().unwrap_or_default();
                panic!(
                    "run_on_host: {shown} did not finish within {:?} (guest killed); its output:\n{}",
                    options.limit,
                    String::from_utf8_lossy(&bytes)
                );
            }
        };
        let status = qemu
            .wait()
            .unwrap_or_else(|e| panic!("run_on_host: waiting for qemu: {e}"));
        let elapsed = started.elapsed();
        let output = String::from_utf8_lossy(&bytes).into_owned();
        let code = output
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix(GUEST_EXIT)?.trim().parse().ok());
        let Some(exit_code) = code else {
            let errors = qemu_errors.join().map(|(e, _)| e).unwrap_or_default();
            panic!(
                "run_on_host: the guest ended ({status}) without reporting {shown}'s exit;\n\
                 qemu said:\n{}\nvirtiofsd said:\n{}\nthe console:\n{output}",
                String::from_utf8_lossy(&errors),
                virtiofsd_log_text()
            );
        };
        Some(HostRun {
            exit_code,
            output,
            output_dropped,
            elapsed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_kept_and_the_rest_counted() {
        let (kept, dropped) = read_tail(&b"0123456789"[..], 4);
        assert_eq!((kept.as_slice(), dropped), (&b"6789"[..], 6));
        let (kept, dropped) = read_tail(&b"abc"[..], 4);
        assert_eq!((kept.as_slice(), dropped), (&b"abc"[..], 0));
    }

    #[test]
    fn only_host_dirs_under_the_guests_own_are_bound_and_each_once() {
        let dirs = [
            "/tmp/clone/target/tmp/guest-1",
            "/tmp/clone/plugins/exec",
            "/tmp/clone",
            "/work/clone/target",
            "/run/user/0/t",
            "/tmp/clone",
            "/host/checkout",
            "/tmpfoo/not-tmp",
        ];
        let binds = guest_binds(dirs.iter().map(Path::new));
        let binds: Vec<&str> = binds.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(binds, ["/host/checkout", "/run/user/0/t", "/tmp/clone"]);
    }

    #[test]
    #[should_panic(expected = "which the guest has its own of")]
    fn a_host_dir_under_proc_is_refused() {
        guest_binds([Path::new("/proc/self/cwd")]);
    }

    #[test]
    #[should_panic(expected = "without whitespace or commas")]
    fn a_host_dir_with_a_comma_is_refused() {
        guest_binds([Path::new("/tmp/a,b")]);
    }
}
