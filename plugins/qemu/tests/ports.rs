//! Nomad's `port_map { http = 8080 }` on the qemu driver: the allocation's port on the
//! node's address reaches the guest's port through qemu's user-mode network, on the
//! VM rig's guest (`drover.net=1 drover.serve=8080` answers on TCP 8080).

mod common;

use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use drover_plugin_sdk::{DriverError, TaskPort};
use serde_json::json;

/// A port on 127.0.0.1 that nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// What `addr` says once something there says `want`, or the last thing seen.
async fn read_when_served(addr: SocketAddr, want: &str, limit: Duration) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        let attempt =
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut text = String::new();
                s.read_to_string(&mut text)?;
                Ok(text)
            });
        let last = match attempt {
            Ok(text) if text.contains(want) => return Ok(text),
            Ok(text) => format!("read {text:?}"),
            Err(e) => format!("error: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_port_map_label_forwards_the_allocations_port_to_the_guest() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let host_port = free_port();
    let config = guest(
        &rig,
        &["drover.net=1", "drover.serve=8080"],
        json!({ "port_map": [{ "http": 8080 }] }),
    );
    let spec = plugin
        .spec("web", &config)
        .with_ports([TaskPort::new("http", host_port).with_host_ip("127.0.0.1")]);
    plugin
        .try_start_spec(spec)
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let pid = plugin.pid("web").await;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains(&format!("hostfwd=tcp:127.0.0.1:{host_port}-:8080"))
            && cmdline.contains(&format!("hostfwd=udp:127.0.0.1:{host_port}-:8080")),
        "{cmdline}"
    );
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port));
    let said = read_when_served(addr, "drover-guest says hello", BOOT)
        .await
        .unwrap_or_else(|last| {
            panic!(
                "nothing answered on {addr} within {BOOT:?} (last: {last}); console:\n{}",
                plugin.console("web")
            )
        });
    assert_eq!(said.trim(), "drover-guest says hello");
    plugin.stop("web", 1, drover_plugin_sdk::Signal::KILL).await;
}

#[tokio::test]
async fn a_port_map_label_the_group_lacks_starts_no_qemu_and_is_named() {
    let Some(rig) = rig() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::launch(dir.path(), rig_config(&rig)).await;
    let config = guest(
        &rig,
        &["drover.tick=1"],
        json!({ "port_map": { "ssh": 22 } }),
    );
    let spec = plugin
        .spec("bad", &config)
        .with_ports([TaskPort::new("http", free_port()).with_host_ip("127.0.0.1")]);
    match plugin.try_start_spec(spec).await {
        Err(DriverError::InvalidConfig(m)) => assert!(
            m.contains(
                "port_map: port \"ssh\" not found in the group's network block (it has http)"
            ),
            "{m}"
        ),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert!(
        qemus_with(&dir.path().display().to_string()).is_empty(),
        "no qemu was started"
    );
}
