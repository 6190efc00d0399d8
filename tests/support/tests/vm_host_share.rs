//! `Rig::run_on_host`: the program runs in the guest on cgroup v2 alone, its exit code
//! and output come back, and the guest cannot write the host's files, not even by
//! mounting the share again read-write as root, nor reach the host's `/proc`; a program
//! under the host's `/tmp` runs too, in a guest whose `/tmp` is otherwise its own.

use std::time::Duration;

use drover_test_support::vm::{self, HostRunOptions};

#[test]
fn a_host_program_runs_in_a_cgroup_v2_guest_that_cannot_write_the_host() {
    let Some(rig) = vm::rig() else { return };
    let dir = tempfile::Builder::new()
        .prefix("vm-host-share-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a directory for the guest script");
    let planted = dir.path().join("written-by-the-guest");
    let script = dir.path().join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             echo \"cgroup fs: $(stat -fc %T /sys/fs/cgroup)\"\n\
             echo \"v1 memory hierarchy: $(ls -d /sys/fs/cgroup/memory 2>/dev/null || echo none)\"\n\
             touch {planted} && echo 'overlay write: ok'\n\
             mkdir -p /run/share\n\
             mount -t virtiofs host /run/share && echo 'share mounted rw'\n\
             if touch /run/share{planted} 2>/dev/null; then echo 'host write: done'; else echo 'host write: refused'; fi\n\
             echo \"host proc entries: $(ls /run/share/proc | wc -l)\"\n\
             exit 7\n",
            planted = planted.display()
        ),
    )
    .expect("write the guest script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod the guest script");
    let options = HostRunOptions {
        memory_mib: 512,
        cpus: 1,
        limit: Duration::from_secs(120),
        ..HostRunOptions::default()
    };
    let Some(run) = rig.run_on_host(&script, &options) else {
        return;
    };
    let out = &run.output;
    assert_eq!(run.exit_code, 7, "{out}");
    for line in [
        "cgroup fs: cgroup2fs",
        "v1 memory hierarchy: none",
        // Writes land in the guest's overlay...
        "overlay write: ok",
        "share mounted rw",
        // ...and never on the host, even through a read-write mount of the share.
        "host write: refused",
        // The kernel's filesystems are not in the share.
        "host proc entries: 0",
    ] {
        assert!(
            out.lines().any(|l| l.trim() == line),
            "no {line:?} in:\n{out}"
        );
    }
    assert!(!planted.exists(), "the guest wrote {}", planted.display());
    assert!(run.elapsed < options.limit);
}

/// A program under the host's `/tmp` (a checkout there) runs at its own path in the
/// guest, whose `/tmp` is otherwise its own; the host's `/tmp` is under `/host`.
#[test]
fn a_program_under_tmp_runs_and_the_guest_keeps_its_own_tmp() {
    let Some(rig) = vm::rig() else { return };
    let dir = tempfile::Builder::new()
        .prefix("vm-host-tmp-")
        .tempdir_in("/tmp")
        .expect("a directory under /tmp");
    let beside = tempfile::Builder::new()
        .prefix("vm-host-tmp-beside-")
        .tempdir_in("/tmp")
        .expect("a second directory under /tmp");
    let host_file = beside.path().join("host-file");
    std::fs::write(&host_file, "from the host\n").expect("write the host's file");
    let script = dir.path().join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             echo \"guest tmp: $(stat -fc %T /tmp)\"\n\
             if [ -e {host_file} ]; then echo 'beside: seen'; else echo 'beside: not in the guest tmp'; fi\n\
             echo \"through {tree}: $(cat {tree}{host_file})\"\n\
             echo \"own dir: $(ls {dir})\"\n\
             exit 3\n",
            host_file = host_file.display(),
            dir = dir.path().display(),
            tree = vm::GUEST_HOST_TREE,
        ),
    )
    .expect("write the guest script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod the guest script");
    let options = HostRunOptions {
        memory_mib: 512,
        cpus: 1,
        limit: Duration::from_secs(120),
        ..HostRunOptions::default()
    };
    let Some(run) = rig.run_on_host(&script, &options) else {
        return;
    };
    let out = &run.output;
    assert_eq!(run.exit_code, 3, "{out}");
    for line in [
        "guest tmp: tmpfs".to_owned(),
        "beside: not in the guest tmp".to_owned(),
        format!("through {}: from the host", vm::GUEST_HOST_TREE),
        "own dir: run.sh".to_owned(),
    ] {
        assert!(
            out.lines().any(|l| l.trim() == line),
            "no {line:?} in:\n{out}"
        );
    }
}

#[test]
#[should_panic(expected = "which the guest has its own of")]
fn a_program_under_proc_is_refused() {
    let rig = vm::Rig {
        kernel: "/nonexistent/vmlinuz".into(),
        initrd: "/nonexistent/initrd.img".into(),
        qemu: "/nonexistent/qemu-system-x86_64".into(),
    };
    let _ = rig.run_on_host(
        std::path::Path::new("/proc/self/run.sh"),
        &HostRunOptions::default(),
    );
}
