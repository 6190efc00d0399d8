//! The CNI plugins of bridge networking (Debian's `containernetworking-plugins`), and
//! what a network made for one container leaves on the host: its namespace, its veth,
//! iptables rules naming it or its address, host-local's address reservation.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugins bridge networking calls.
const NEEDED: [&str; 5] = ["bridge", "host-local", "portmap", "firewall", "loopback"];

/// The directory holding the CNI plugins (`$DROVER_TEST_CNI_PATH`, else
/// `/usr/lib/cni`, else `/opt/cni/bin`), when this test can use them: the plugins are
/// there, `iptables` runs, and the test is root. `None` (said loudly) otherwise; a
/// failure under `CI=true`.
pub fn plugins() -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = match std::env::var_os("DROVER_TEST_CNI_PATH") {
        Some(p) if !p.is_empty() => vec![PathBuf::from(p)],
        _ => vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()],
    };
    let Some(dir) = dirs
        .into_iter()
        .find(|d| NEEDED.iter().all(|p| d.join(p).is_file()))
    else {
        return skip(
            "the CNI plugins (bridge, host-local, portmap, firewall, loopback) are not installed: apt-get install containernetworking-plugins",
        );
    };
    if !rustix::process::geteuid().is_root() {
        return skip("bridge networking needs root");
    }
    let iptables = Command::new("iptables")
        .args(["-w", "-S", "FORWARD"])
        .output();
    if !iptables.is_ok_and(|o| o.status.success()) {
        return skip("iptables does not run: apt-get install iptables");
    }
    Some(dir)
}

fn skip(why: &str) -> Option<PathBuf> {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but {why}"
    );
    eprintln!("SKIPPED: {why}");
    None
}

/// What one container's bridge network consists of on the host, seen while it is
/// set up, to look for leftovers once it is torn down.
#[derive(Debug, Clone)]
pub struct Footprint {
    /// The CNI container id (Drover: the allocation id).
    pub container_id: String,
    /// The CNI network name (host-local's directory).
    pub network: String,
    /// The namespace's path.
    pub netns: PathBuf,
    /// Its address on the bridge.
    pub ip: Option<String>,
    /// The interface index of the host side of its veth pair.
    pub host_ifindex: Option<u32>,
}

impl Footprint {
    /// Look at the network of `container_id` in namespace `netns` (interface
    /// `eth0`): its address and the host end of its veth.
    pub fn observe(network: &str, container_id: &str, netns: &Path) -> Footprint {
        let in_ns = |args: &[&str]| {
            Command::new("nsenter")
                .arg(format!("--net={}", netns.display()))
                .arg("ip")
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let addr = in_ns(&["-4", "-o", "addr", "show", "dev", "eth0"]);
        let ip = addr
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .map(str::to_owned);
        // "2: eth0@if123: <...>": the peer's index on the host.
        let link = in_ns(&["-o", "link", "show", "dev", "eth0"]);
        let host_ifindex = link
            .split_once("@if")
            .and_then(|(_, rest)| rest.split(':').next()?.parse().ok());
        Footprint {
            container_id: container_id.to_owned(),
            network: network.to_owned(),
            netns: netns.to_owned(),
            ip,
            host_ifindex,
        }
    }

    /// What is still there, each said in a line; empty when nothing is.
    pub fn remains(&self) -> Vec<String> {
        let mut left = Vec::new();
        if self.netns.exists() {
            left.push(format!("namespace {}", self.netns.display()));
        }
        if let Some(i) = self.host_ifindex {
            let links = Command::new("ip")
                .args(["-o", "link", "show"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let prefix = format!("{i}: ");
            if let Some(l) = links.lines().find(|l| l.starts_with(&prefix)) {
                left.push(format!("host veth {l}"));
            }
        }
        for table in ["nat", "filter"] {
            let rules = Command::new("iptables-save")
                .args(["-t", table])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for line in rules.lines() {
                let names_ip = self.ip.as_ref().is_some_and(|ip| {
                    line.contains(&format!("{ip}/32")) || line.contains(&format!("{ip}:"))
                });
                if line.contains(&self.container_id) || names_ip {
                    left.push(format!("iptables {table}: {line}"));
                }
            }
        }
        let dir = Path::new("/var/lib/cni/networks").join(&self.network);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                if text.contains(&self.container_id) {
                    left.push(format!("address reservation {}", e.path().display()));
                }
            }
        }
        left
    }
}
