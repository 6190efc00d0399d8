//! Hardening of exec tasks (issue 10), inside real exec tasks: read-only binds that
//! stay read-only below, and the task's open-file limit.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::json;

/// A host path bound read-only stays read-only below, where the host has another
/// mount: the binds are read-only recursively, not just at the top.
#[tokio::test]
async fn read_only_binds_are_read_only_below_too() {
    if !isolation_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A host directory with a writable mount under it.
    let host = dir.path().join("hostdata");
    let sub = host.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=1777,size=1m", "drover-test"])
        .arg(&sub)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs on {}", sub.display());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(sub.clone());
    let mut chroot: serde_json::Map<String, serde_json::Value> =
        drover_isolation::rootfs::DEFAULT_CHROOT
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| ((*p).to_owned(), json!(p)))
            .collect();
    chroot.insert(host.display().to_string(), json!("/data"));
    let p = Plugin::launch(dir.path(), json!({ "chroot_env": chroot })).await;
    p.start(
        "ro",
        sh("if touch /data/top 2>/dev/null; then echo top=written; else echo top=refused; fi; \
            if touch /data/sub/below 2>/dev/null; then echo below=written; else echo below=refused; fi; \
            grep ' /data/sub ' /proc/self/mountinfo | cut -d' ' -f6"),
    )
    .await;
    let exit = p.wait("ro").await;
    let out = p.stdout("ro");
    assert!(
        exit.successful(),
        "{exit:?}\n{out}\n{}",
        p.log("ro", "stderr")
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["top=refused", "below=refused"], "{out}");
    assert!(
        lines[2].split(',').any(|o| o == "ro"),
        "mount options {out}"
    );
    assert!(!sub.join("below").exists());
}

/// The plugin raises its own open-file limit; a task gets the one the plugin was
/// started with (the operator's), not the raised one.
#[tokio::test]
async fn a_task_gets_the_operators_open_file_limit_not_the_plugins() {
    if !isolation_possible() {
        return;
    }
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.expect("a finite open-file hard limit");
    assert!(hard > 1024, "hard open-file limit {hard}: too low to tell");
    // The plugin inherits this soft limit, and raises its own towards the hard one.
    // (Process-wide: the other tests of this binary get 1024 descriptors, plenty.)
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(1024),
            maximum: Some(hard),
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start("nofile", sh("ulimit -n")).await;
    let plugin = std::fs::read_to_string(format!("/proc/{}/limits", p.process.pid())).unwrap();
    let plugin_soft = plugin
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .to_owned();
    assert!(p.wait("nofile").await.successful());
    assert_eq!(
        p.stdout("nofile").trim(),
        "1024",
        "the plugin runs with {plugin_soft}"
    );
}
