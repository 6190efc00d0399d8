//! Nomad's `ports = ["http"]` on the docker driver: the allocation's port on the
//! node's address is published to the container, and answers there.
//!
//! The shared test daemon runs with `--iptables=false --userland-proxy=false`, so
//! nothing forwards its published ports. This test starts a dockerd of its own with
//! Docker's userland proxy (`docker-proxy`, which forwards `127.0.0.1:PORT` to the
//! container without iptables) and a user-defined bridge network for the container,
//! and sends a real request through the node's port.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use drover_plugin_sdk::{DriverError, TaskPort};
use serde_json::json;

/// A dockerd of this test only (own socket, data and exec dirs; no default bridge, no
/// iptables, the userland proxy on), stopped on drop.
struct Dockerd {
    child: Option<Child>,
    host: String,
}

impl Dockerd {
    fn start(dir: &Path) -> Dockerd {
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("dockerd log");
        let host = format!("unix://{}", dir.join("docker.sock").display());
        let child = Command::new("dockerd")
            .arg("--host")
            .arg(&host)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .args([
                "--bridge",
                "none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--userland-proxy=true",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start dockerd");
        let d = Dockerd {
            child: Some(child),
            host,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !drover_test_support::docker::docker(&d.host, &["version"])
            .status
            .success()
        {
            assert!(
                Instant::now() < deadline,
                "the private dockerd did not answer within 30 s: {}",
                std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        d
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A port on 127.0.0.1 that nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET /` from `127.0.0.1:port`: the response, or why there is none.
fn http_get(port: u16) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn copy_image(from: &DockerEnv, to_host: &str) {
    let copied = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "docker -H '{}' save '{}' | docker -H '{to_host}' load",
            from.host, from.image
        ))
        .output()
        .expect("run docker save | docker load");
    assert!(copied.status.success(), "{copied:?}");
}

#[tokio::test]
async fn a_group_port_label_is_published_on_the_nodes_address_and_answers() {
    let Some(shared) = docker_env() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let dockerd_dir: PathBuf = root.path().join("d");
    std::fs::create_dir(&dockerd_dir).expect("dockerd dir");
    let dockerd = Dockerd::start(&dockerd_dir);
    copy_image(&shared, &dockerd.host);
    let env = DockerEnv {
        host: dockerd.host.clone(),
        image: shared.image.clone(),
    };
    let network = unique("drover-ports-");
    env.cli_ok(&["network", "create", "--driver", "bridge", &network]);

    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let host_port = free_port();
    let config = json!({
        "image": env.image,
        "command": "sh",
        "args": ["-c", "mkdir -p /www && echo \"hello from $NOMAD_PORT_http\" > /www/index.html \
                        && exec httpd -f -p 80 -h /www"],
        "ports": ["http"],
        "network_mode": network,
    });
    let spec = s
        .spec("web", config)
        .with_env("NOMAD_PORT_http", "80")
        .with_ports([TaskPort::new("http", host_port)
            .with_to(80)
            .with_host_ip("127.0.0.1")]);
    let handle = within(PROMPT, "start", p.client.start_task(spec))
        .await
        .expect("the task starts");
    let cid = serde_json::from_slice::<serde_json::Value>(&handle.driver_state)
        .expect("driver state")["container_id"]
        .as_str()
        .expect("container id")
        .to_owned();

    // What Docker was told: the node's address and port, to the port's `to`.
    let inspect = env.inspect(&cid).expect("the container exists");
    let bindings = &inspect["HostConfig"]["PortBindings"];
    for key in ["80/tcp", "80/udp"] {
        assert_eq!(
            bindings[key],
            json!([{ "HostIp": "127.0.0.1", "HostPort": host_port.to_string() }]),
            "{bindings:#}"
        );
    }

    // And what a user notices: the container answers on 127.0.0.1:<the node's port>.
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        match http_get(host_port) {
            Ok(a) if a.contains("hello from 80") => break a,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "127.0.0.1:{host_port} did not answer with the page within 20 s: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(answer.starts_with("HTTP/1."), "{answer}");

    p.client
        .destroy_task("web", true)
        .await
        .expect("destroy the task");
    let _ = env.cli(&["network", "rm", &network]);
}

#[tokio::test]
async fn a_port_label_the_group_lacks_fails_the_start_naming_it() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let config = json!({ "image": env.image, "command": "true", "ports": ["http", "admin"] });
    let spec = s
        .spec("bad", config)
        .with_ports([TaskPort::new("http", free_port())
            .with_to(80)
            .with_host_ip("127.0.0.1")]);
    let err = within(PROMPT, "start", p.client.start_task(spec))
        .await
        .expect_err("an unknown label is refused");
    match err {
        DriverError::InvalidConfig(m) => assert!(
            m.contains("port \"admin\" not found in the group's network block")
                && m.contains("it has http"),
            "{m}"
        ),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert_eq!(
        env.cli_ok(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=drover.alloc_dir={}", s.alloc_dir().display())
        ]),
        "",
        "no container was made"
    );
}
