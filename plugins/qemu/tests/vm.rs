//! The qemu driver against real guests: the VM rig's kernel and busybox initramfs,
//! booted under TCG on q35 through the real plugin binary and its executors.

mod common;

use std::time::{Duration, Instant};

use common::*;
use drover_plugin_sdk::{ExitOutcome, Signal};
use serde_json::json;

/// Boot, serial console in the stdout log, stats of the qemu process, qemu confined
/// (seccomp, no root), and a graceful stop that ends by the guest's own poweroff.
#[tokio::test]
async fn a_guest_boots_logs_its_console_and_powers_off_on_a_graceful_stop() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let config = guest(&rig, &["drover.tick=1"], json!({ "graceful_shutdown": true }));
    let (_, pid) = plugin.start("vm1", &config).await;
    plugin.console_shows("vm1", GUEST_STARTED).await;
    plugin.console_shows("vm1", "drover-guest: tick 1").await;

    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(cmdline.iter().any(|a| a.starts_with("on,obsolete=deny")), "{cmdline:?}");
    assert!(cmdline.iter().any(|a| a == "256"), "memory_mb is -m: {cmdline:?}");
    assert!(!cmdline.iter().any(|a| a == "-netdev"), "no forwards, no network: {cmdline:?}");
    if rustix::process::geteuid().is_root() {
        let uid = uid_of(pid).expect("qemu's uid");
        assert_ne!(uid, 0, "qemu dropped root");
    }
    // The QMP socket is in the plugin's private executor directory.
    assert!(plugin.executor_dir("vm1").join("qmp").exists());

    use tokio_stream::StreamExt as _;
    let mut samples = std::pin::pin!(plugin.client.task_stats("vm1", Duration::from_secs(1)));
    let stats = within(PROMPT, "stats", samples.next())
        .await
        .expect("a sample")
        .unwrap();
    assert!(stats.memory_rss_bytes > 10 << 20, "{stats:?}");
    assert!(!stats.cpu_user.is_zero(), "{stats:?}");

    let asked = Instant::now();
    within(
        PROMPT,
        "stop",
        plugin
            .client
            .stop_task("vm1", Duration::from_secs(20), Signal::TERM),
    )
    .await
    .unwrap();
    let exit = within(PROMPT, "wait", plugin.client.wait_task("vm1"))
        .await
        .unwrap();
    assert_eq!((exit.exit_code, exit.signal), (0, 0), "{exit:?}");
    assert_eq!(
        exit.err.as_deref(),
        Some("guest powered off (ACPI shutdown after system_powerdown)")
    );
    assert!(asked.elapsed() < Duration::from_secs(20), "no wait for the timeout");
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
    within(
        PROMPT,
        "stop",
        plugin
            .client
            .stop_task("deaf", Duration::from_secs(2), Signal::TERM),
    )
    .await
    .unwrap();
    assert!(asked.elapsed() >= Duration::from_secs(2), "waited for the guest");
    let exit = within(PROMPT, "wait", plugin.client.wait_task("deaf"))
        .await
        .unwrap();
    assert_eq!(exit.outcome(), ExitOutcome::Signal(Signal::KILL), "{exit:?}");
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
    within(
        PROMPT,
        "stop",
        plugin
            .client
            .stop_task("plain", Duration::from_secs(5), Signal::TERM),
    )
    .await
    .unwrap();
    let exit = within(PROMPT, "wait", plugin.client.wait_task("plain"))
        .await
        .unwrap();
    assert_eq!(
        exit.err.as_deref(),
        Some("qemu stopped with SIGTERM, without a guest shutdown (graceful_shutdown is off)"),
        "{exit:?}"
    );
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
    let config = guest(&rig, &["drover.tick=1"], json!({ "graceful_shutdown": true }));
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
    within(
        PROMPT,
        "stop",
        second
            .client
            .stop_task("kept", Duration::from_secs(20), Signal::TERM),
    )
    .await
    .unwrap();
    let exit = within(PROMPT, "wait", second.client.wait_task("kept"))
        .await
        .unwrap();
    assert_eq!(
        exit.err.as_deref(),
        Some("guest powered off (ACPI shutdown after system_powerdown)"),
        "{exit:?}"
    );
    assert!(!alive(pid));
}

fn plugin_dir_text(p: &Plugin) -> String {
    p.dir.display().to_string()
}
