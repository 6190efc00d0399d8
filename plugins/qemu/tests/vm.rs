//! The qemu driver against real guests: the VM rig's kernel and busybox initramfs,
//! booted under TCG on q35 through the real plugin binary and its executors.

mod common;

use std::time::{Duration, Instant};

use common::*;
use drover_driver_qemu::GUEST_POWERED_OFF;
use drover_plugin_sdk::{ExitOutcome, Signal};
use serde_json::json;

/// Boot, serial console in the stdout log, stats of the qemu process, qemu confined
/// (seccomp, no root), and a graceful stop that ends by the guest's own poweroff.
#[tokio::test]
async fn a_guest_boots_logs_its_console_and_powers_off_on_a_graceful_stop() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let config = guest(
        &rig,
        &["drover.tick=1"],
        json!({ "graceful_shutdown": true }),
    );
    // As under the agent, the first fingerprint (which tries KVM) comes first: the
    // time to the first serial line is then StartTask's alone.
    plugin.fingerprinted().await;
    let asked = Instant::now();
    let (_, pid) = plugin.start("vm1", &config).await;
    plugin.console_shows("vm1", GUEST_STARTED).await;
    eprintln!(
        "StartTask to the guest's first serial line: {:?}",
        asked.elapsed()
    );
    plugin.console_shows("vm1", "drover-guest: tick 1").await;

    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(
        cmdline.iter().any(|a| a.starts_with("on,obsolete=deny")),
        "{cmdline:?}"
    );
    assert!(
        cmdline.iter().any(|a| a == "256"),
        "memory_mb is -m: {cmdline:?}"
    );
    assert!(
        !cmdline.iter().any(|a| a == "-netdev"),
        "no forwards, no network: {cmdline:?}"
    );
    if rustix::process::geteuid().is_root() {
        let uid = uid_of(pid).expect("qemu's uid");
        assert_ne!(uid, 0, "qemu dropped root");
    }
    // The QMP socket is in the plugin's private executor directory.
    assert!(plugin.executor_dir("vm1").join("qmp").exists());

    use tokio_stream::StreamExt as _;
    let samples = within(
        PROMPT,
        "stats",
        plugin.client.task_stats("vm1", Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let mut samples = std::pin::pin!(samples);
    let stats = within(PROMPT, "stats", samples.next())
        .await
        .expect("a sample")
        .unwrap();
    assert!(stats.memory_rss_bytes > 10 << 20, "{stats:?}");
    assert!(!stats.cpu_user.is_zero(), "{stats:?}");

    let mut told = events(&plugin).await;
    let asked = Instant::now();
    let exit = plugin.stop("vm1", 20, Signal::TERM).await;
    // A clean exit (code 0, no error: the host shows the code), and an event saying
    // that the guest powered off.
    assert_eq!(exit, drover_plugin_sdk::ExitResult::code(0));
    event_seen(&mut told, "vm1", GUEST_POWERED_OFF).await;
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "no wait for the timeout"
    );
    assert!(plugin.console("vm1").contains("power button pressed"));
    assert!(!alive(pid));
    within(PROMPT, "destroy", plugin.client.destroy_task("vm1", false))
        .await
        .unwrap();
    assert!(!plugin.executor_dir("vm1").exists());
}

/// A guest that ignores the power button (no acpid) is killed at the timeout, and
/// its exit says so.
#[tokio::test]
async fn a_guest_ignoring_the_power_button_is_killed_after_the_timeout() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let config = guest(
        &rig,
        &["drover.tick=1", "drover.acpid=0"],
        json!({ "graceful_shutdown": true }),
    );
    let (_, pid) = plugin.start("deaf", &config).await;
    plugin.console_shows("deaf", "drover-guest: tick 1").await;
    let asked = Instant::now();
    let exit = plugin.stop("deaf", 2, Signal::TERM).await;
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "waited for the guest"
    );
    assert_eq!(
        exit.outcome(),
        ExitOutcome::Signal(Signal::KILL),
        "{exit:?}"
    );
    assert_eq!(
        exit.err.as_deref(),
        Some("guest did not power off within 2s of system_powerdown: killed")
    );
    assert!(!alive(pid));
}

/// Without graceful_shutdown, stop is the executor's: a signal to qemu; the image
/// here is a relative path in the task dir.
#[tokio::test]
async fn without_graceful_shutdown_stop_signals_qemu() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), json!({})).await;
    let local = plugin.task_dir("plain").join("local");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::copy(&rig.kernel, local.join("vmlinuz")).unwrap();
    std::fs::copy(&rig.initrd, local.join("initrd.img")).unwrap();
    let config = json!({
        "kernel": "local/vmlinuz",
        "initrd": "local/initrd.img",
        "append": rig.append(&["drover.tick=1"]),
    });
    let (_, pid) = plugin.start("plain", &config).await;
    plugin.console_shows("plain", "drover-guest: tick 1").await;
    let mut told = events(&plugin).await;
    let exit = plugin.stop("plain", 5, Signal::TERM).await;
    // qemu ends with code 0 on SIGTERM; the event says the guest was not shut down.
    assert_eq!(exit, drover_plugin_sdk::ExitResult::code(0));
    event_seen(
        &mut told,
        "plain",
        "qemu stopped with SIGTERM, without a guest shutdown (graceful_shutdown is off)",
    )
    .await;
    assert!(!plugin.console("plain").contains("power button pressed"));
    assert!(!alive(pid));
}

/// kill -9 of the plugin leaves the VM running; a new plugin recovers it (the same
/// qemu process) and stops it gracefully over a fresh QMP connection.
#[tokio::test]
async fn a_vm_outlives_a_killed_plugin_and_is_recovered() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let first = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let config = guest(
        &rig,
        &["drover.tick=1"],
        json!({ "graceful_shutdown": true }),
    );
    let (handle, pid) = first.start("kept", &config).await;
    first.console_shows("kept", "drover-guest: tick 1").await;
    let how = within(PROMPT, "kill the plugin", first.process.kill()).await;
    assert_eq!(how, ExitOutcome::Signal(Signal::KILL));
    assert!(alive(pid), "qemu outlives the plugin");

    let second = Plugin::launch(dir.path(), rig_config(&rig)).await;
    second.track(pid);
    within(PROMPT, "recover", second.client.recover_task(handle))
        .await
        .unwrap();
    assert_eq!(second.pid("kept").await, pid, "the same qemu");
    assert_eq!(qemus_with(&plugin_dir_text(&second)).len(), 1, "one qemu");
    let ticks = second.console("kept").matches("tick").count();
    until(BOOT, "the guest ticks on", || {
        second.console("kept").matches("tick").count() > ticks
    })
    .await;
    let mut told = events(&second).await;
    let exit = second.stop("kept", 20, Signal::TERM).await;
    assert_eq!(exit, drover_plugin_sdk::ExitResult::code(0));
    event_seen(&mut told, "kept", GUEST_POWERED_OFF).await;
    assert!(!alive(pid));
}

fn plugin_dir_text(p: &Plugin) -> String {
    p.dir.display().to_string()
}

/// A free TCP port on 127.0.0.1 for qemu to take, below the ephemeral range (see
/// [`drover_test_support::net::free_local_addr`]).
fn free_port() -> u16 {
    drover_test_support::net::free_local_addr().port()
}

/// A port forward reaches the guest's service on 127.0.0.1, and a shared image under
/// image_paths is attached with snapshot=on and read by the guest.
#[tokio::test]
async fn a_forwarded_port_reaches_the_guest_and_a_shared_image_is_attached_read_only() {
    use std::io::Read as _;
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    let mut disk = b"drover test disk\n".to_vec();
    disk.resize(1 << 20, 0);
    std::fs::write(images.join("disk.img"), &disk).unwrap();
    let mut plugin_config = rig_config(&rig);
    plugin_config["image_paths"]
        .as_array_mut()
        .unwrap()
        .push(json!(images));
    let plugin = Plugin::launch(dir.path(), plugin_config).await;
    let port = free_port();
    let config = guest(
        &rig,
        &["drover.net=1", "drover.serve=8000", "drover.disk=/dev/vda"],
        json!({
            "image_path": images.join("disk.img"),
            "drive_interface": "virtio",
            "port_forwards": [{ "host": port, "guest": 8000 }],
        }),
    );
    let (_, pid) = plugin.start("net", &config).await;
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .replace('\0', " ");
    assert!(
        cmdline.contains("format=raw,if=virtio,snapshot=on"),
        "{cmdline}"
    );
    assert!(
        cmdline.contains(&format!("hostfwd=tcp:127.0.0.1:{port}-:8000")),
        "{cmdline}"
    );
    plugin
        .console_shows("net", "drover-guest: disk: drover test disk")
        .await;
    plugin
        .console_shows("net", "drover-guest: serving on port 8000")
        .await;
    let mut said = String::new();
    until(BOOT, "the guest answers on the forwarded port", || {
        said.clear();
        std::net::TcpStream::connect(("127.0.0.1", port))
            .and_then(|mut c| {
                c.set_read_timeout(Some(Duration::from_secs(5)))?;
                c.read_to_string(&mut said)
            })
            .is_ok_and(|_| said.contains("drover-guest says hello"))
    })
    .await;
    plugin.stop("net", 5, Signal::KILL).await;
    assert!(!alive(pid));
    // The shared image is unchanged.
    assert_eq!(std::fs::read(images.join("disk.img")).unwrap(), disk);
}

/// A self-contained qcow2 image in the task dir is the task's own: attached as qcow2,
/// without snapshot=on, and the guest reads it.
#[tokio::test]
async fn a_qcow2_image_in_the_task_dir_is_attached_as_the_tasks_own() {
    let Some(rig) = rig() else { return };
    let Some(qemu_img) = ["/usr/bin/qemu-img", "/usr/local/bin/qemu-img"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
    else {
        eprintln!("SKIPPED: qemu-img is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let local = plugin.task_dir("own").join("local");
    std::fs::create_dir_all(&local).unwrap();
    let mut raw = b"drover qcow2 disk\n".to_vec();
    raw.resize(1 << 20, 0);
    std::fs::write(dir.path().join("raw.img"), &raw).unwrap();
    let converted = std::process::Command::new(qemu_img)
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(dir.path().join("raw.img"))
        .arg(local.join("disk.qcow2"))
        .status()
        .unwrap();
    assert!(converted.success());
    let config = guest(
        &rig,
        &["drover.disk=/dev/vda"],
        json!({ "image_path": "local/disk.qcow2", "drive_interface": "virtio" }),
    );
    let (_, pid) = plugin.start("own", &config).await;
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .replace('\0', " ");
    assert!(
        cmdline.contains(&format!(
            "file={},format=qcow2,if=virtio ",
            local.join("disk.qcow2").display()
        )),
        "{cmdline}"
    );
    plugin
        .console_shows("own", "drover-guest: disk: drover qcow2 disk")
        .await;
    plugin.stop("own", 5, Signal::KILL).await;
    assert!(!alive(pid));
}
