//! Bridge networking of allocations (a group's `network { mode = "bridge" }`), as
//! Nomad does it: the allocation gets a network namespace of its own, shared by its
//! tasks, attached to the host's bridge `drover` through a veth pair, with an address
//! from the bridge's subnet and its mapped ports forwarded from the host, all made by
//! the real CNI plugins (loopback, bridge with host-local addresses, firewall,
//! portmap with SNAT: Nomad's own chain) and removed by them.
//!
//! - [`Bridge::plan`] says what the allocation's network will be ([`NetworkState`]:
//!   its namespace path, the exact config list, the port mappings); the runner records
//!   it *before* anything is made, so that an agent killed at any point can still
//!   remove everything: [`Bridge::teardown`] needs nothing but the record.
//! - [`Bridge::setup`] makes the namespace and runs the chain's ADD; the result (the
//!   address) goes in the record too.
//! - [`Bridge::teardown`] runs the chain's DEL (each plugin removes its rules, the
//!   bridge plugin the veth, host-local the address reservation) and removes the
//!   namespace. When the ADD's result was never recorded (the agent died right in
//!   it), the address is found in host-local's reservations, so the firewall plugin
//!   still finds its rules.

pub mod cni;
pub mod netns;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use cni::{CniError, ConfList, PortMapping};

/// The bridge's default name (Nomad's is `nomad`).
pub const DEFAULT_BRIDGE: &str = "drover";
/// The bridge's default subnet (Nomad's is 172.26.64.0/20; this is the /20 after it).
pub const DEFAULT_SUBNET: &str = "172.26.80.0/20";
/// Where CNI plugins are looked for by default: Debian's package, then the upstream
/// default.
pub const DEFAULT_CNI_PATH: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];
/// The interface inside the allocation's namespace.
pub const ALLOC_IFNAME: &str = "eth0";
/// The filter chain the firewall plugin jumps to first; holds the one rule that
/// lets forwarded traffic reach the bridge's subnet (Nomad's `NOMAD-ADMIN`).
pub const ADMIN_CHAIN: &str = "DROVER-ADMIN";
/// Where host-local keeps its reservations (its default `dataDir`).
const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks";
/// Most one plugin call may take.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of a setup whose plugin failed.
const SETUP_ATTEMPTS: u32 = 3;

/// How this agent's bridge network looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// The bridge (and CNI network) name; at most 15 characters.
    pub name: String,
    /// `a.b.c.d/len`: allocations get addresses from it, the bridge the first one.
    pub subnet: String,
    /// Directories searched for the CNI plugins.
    pub cni_path: Vec<PathBuf>,
    /// Where allocation namespaces are made (`ip netns` sees them there).
    pub netns_dir: PathBuf,
    /// The bridge plugin's `hairpinMode` (an allocation reaching itself through its
    /// own mapped port).
    pub hairpin: bool,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            name: DEFAULT_BRIDGE.into(),
            subnet: DEFAULT_SUBNET.into(),
            cni_path: DEFAULT_CNI_PATH.iter().map(PathBuf::from).collect(),
            netns_dir: PathBuf::from(netns::DEFAULT_DIR),
            hairpin: false,
        }
    }
}

/// What went wrong with an allocation's network.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The agent's bridge settings are wrong.
    #[error("bridge network config: {0}")]
    Config(String),
    /// A CNI plugin failed.
    #[error(transparent)]
    Cni(#[from] CniError),
    /// Making or removing the namespace failed.
    #[error("network namespace {path}: {reason}")]
    Netns {
        /// Its path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The plugins gave the allocation no address.
    #[error("the CNI plugins gave the allocation no address (result: {0})")]
    NoAddress(String),
}

/// Everything about one allocation's bridge network that tearing it down needs,
/// recorded before it is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkState {
    /// The CNI container id: the allocation id.
    pub container_id: String,
    /// The namespace's path.
    pub netns: PathBuf,
    /// The interface inside it.
    pub ifname: String,
    /// The config list the plugins were (or are to be) called with.
    pub conflist: ConfList,
    /// Ports forwarded from the host.
    pub ports: Vec<PortMapping>,
    /// The chain's ADD result, once it succeeded (every DEL gets it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The allocation's address in the bridge's subnet, once set up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// The bridge networks of one agent.
#[derive(Debug, Clone)]
pub struct Bridge {
    config: BridgeConfig,
    prefix: u8,
    runner: cni::Runner,
}

/// `a.b.c.d/len` → (address, len).
fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = s.split_once('/')?;
    Some((ip.parse().ok()?, len.parse().ok().filter(|l| *l <= 32)?))
}

impl Bridge {
    /// The agent's bridge; its settings checked.
    pub fn new(config: BridgeConfig) -> Result<Self, NetworkError> {
        let name_ok = !config.name.is_empty()
            && config.name.len() <= 15
            && config
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(NetworkError::Config(format!(
                "bridge_network_name {:?} must be 1-15 characters of [A-Za-z0-9_.-] (an \
                 interface name)",
                config.name
            )));
        }
        let Some((_, prefix)) = parse_cidr(&config.subnet).filter(|(_, l)| (8..=30).contains(l))
        else {
            return Err(NetworkError::Config(format!(
                "bridge_network_subnet {:?} must be an IPv4 subnet a.b.c.d/len with len \
                 between 8 and 30",
                config.subnet
            )));
        };
        if config.cni_path.is_empty() {
            return Err(NetworkError::Config(
                "cni_path must name at least one directory".into(),
            ));
        }
        Ok(Bridge {
            runner: cni::Runner {
                path: config.cni_path.clone(),
                timeout: PLUGIN_TIMEOUT,
            },
            prefix,
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &BridgeConfig {
        &self.config
    }

    /// Nomad's bridge config list, with this agent's bridge, subnet and admin chain.
    pub fn conflist(&self) -> ConfList {
        let v = serde_json::json!({
            "cniVersion": cni::CNI_VERSION,
            "name": self.config.name,
            "plugins": [
                { "type": "loopback" },
                {
                    "type": "bridge",
                    "bridge": self.config.name,
                    "ipMasq": true,
                    "isGateway": true,
                    "forceAddress": true,
                    "hairpinMode": self.config.hairpin,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.config.subnet }]],
                        "routes": [{ "dst": "0.0.0.0/0" }]
                    }
                },
                { "type": "firewall", "backend": "iptables", "iptablesAdminChainName": ADMIN_CHAIN },
                { "type": "portmap", "capabilities": { "portMappings": true }, "snat": true }
            ]
        });
        // A literal of the right shape: it always converts.
        serde_json::from_value(v).unwrap_or_else(|_| ConfList {
            cni_version: cni::CNI_VERSION.into(),
            name: self.config.name.clone(),
            plugins: Vec::new(),
        })
    }

    /// What allocation `alloc_id`'s network will be: nothing is made yet.
    pub fn plan(&self, alloc_id: &str, ports: Vec<PortMapping>) -> NetworkState {
        NetworkState {
            container_id: alloc_id.to_owned(),
            netns: self.config.netns_dir.join(alloc_id),
            ifname: ALLOC_IFNAME.into(),
            conflist: self.conflist(),
            ports,
            result: None,
            address: None,
        }
    }

    fn invocation<'a>(&self, st: &'a NetworkState) -> cni::Invocation<'a> {
        cni::Invocation {
            container_id: &st.container_id,
            netns: &st.netns,
            ifname: &st.ifname,
            port_mappings: &st.ports,
        }
    }

    /// Make the namespace and attach it: `st.result` and `st.address` are set. What an
    /// earlier, unfinished attempt left (the agent died in it) is removed first; a
    /// failure removes what this attempt made.
    pub async fn setup(&self, st: &mut NetworkState) -> Result<(), NetworkError> {
        // Two allocations making the bridge at the same moment can make one bridge
        // plugin fail (Nomad retries for the same reason); a plugin that failed is
        // tried again twice, from a clean slate, before the setup fails.
        let mut attempt = 1;
        loop {
            match self.setup_once(st).await {
                Err(NetworkError::Cni(e @ (CniError::Failed { .. } | CniError::Exec { .. })))
                    if attempt < SETUP_ATTEMPTS =>
                {
                    tracing::warn!(alloc = %st.container_id, attempt, "network setup failed, trying again: {e}");
                    tokio::time::sleep(Duration::from_millis(500 + fastrand::u64(0..500))).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn setup_once(&self, st: &mut NetworkState) -> Result<(), NetworkError> {
        if st.netns.exists() {
            self.teardown(st).await?;
        }
        let dir = st.netns.parent().unwrap_or(Path::new("/")).to_owned();
        let name = st
            .netns
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let made = tokio::task::spawn_blocking(move || netns::create(&dir, &name))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
        if let Err(e) = made {
            return Err(NetworkError::Netns {
                path: st.netns.clone(),
                reason: format!("cannot create it: {e}"),
            });
        }
        // The guard first: portmap turns route_localnet on as it adds the mapping.
        if let Err(e) = self.ensure_localhost_guard().await {
            if let Err(te) = self.teardown(st).await {
                tracing::warn!(alloc = %st.container_id, "cleaning up a failed network setup: {te}");
            }
            return Err(e);
        }
        let added = self.runner.add(&st.conflist, &self.invocation(st)).await;
        let outcome = match added {
            Ok(result) => match address_of(&result, &st.ifname) {
                Some(a) => {
                    st.address = Some(a);
                    st.result = Some(result);
                    self.ensure_admin_rule().await
                }
                None => Err(NetworkError::NoAddress(result.to_string())),
            },
            Err(e) => Err(e.into()),
        };
        if let Err(e) = outcome {
            if let Err(te) = self.teardown(st).await {
                tracing::warn!(alloc = %st.container_id, "cleaning up a failed network setup: {te}");
            }
            st.result = None;
            st.address = None;
            return Err(e);
        }
        Ok(())
    }

    /// Check with the plugins that the allocation's network is still as set up.
    /// (portmap 1.1.1 fails its CHECK of mapped ports on hosts with ip6tables: it
    /// looks for an IPv6 chain it never made.)
    pub async fn check(&self, st: &NetworkState) -> Result<(), NetworkError> {
        let Some(result) = &st.result else {
            return Err(NetworkError::NoAddress("not set up".into()));
        };
        Ok(self
            .runner
            .check(&st.conflist, &self.invocation(st), result)
            .await?)
    }

    /// Remove the allocation's network: DEL through every plugin (rules, veth, the
    /// address reservation), then the namespace. Idempotent.
    pub async fn teardown(&self, st: &NetworkState) -> Result<(), NetworkError> {
        let found;
        let result = match &st.result {
            Some(r) => Some(r),
            None => {
                found = self.reserved_result(st).await;
                found.as_ref()
            }
        };
        let deleted = self
            .runner
            .del(&st.conflist, &self.invocation(st), result)
            .await;
        // The namespace goes even when a plugin failed: a DEL tried again later needs
        // no namespace (the plugins' rules and reservations are found by container id
        // and address), and its veth goes with it.
        let path = st.netns.clone();
        let removed = tokio::task::spawn_blocking(move || netns::remove(&path))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
        deleted?;
        removed.map_err(|e| NetworkError::Netns {
            path: st.netns.clone(),
            reason: format!("cannot remove it: {e}"),
        })
    }

    /// A result naming the address host-local reserved for this container, for a DEL
    /// whose ADD result was never recorded.
    async fn reserved_result(&self, st: &NetworkState) -> Option<Value> {
        let dir = Path::new(HOST_LOCAL_DIR).join(&st.conflist.name);
        let id = st.container_id.clone();
        let ifname = st.ifname.clone();
        let found = tokio::task::spawn_blocking(move || reserved_address(&dir, &id, &ifname))
            .await
            .ok()
            .flatten()?;
        Some(serde_json::json!({
            "cniVersion": st.conflist.cni_version,
            "interfaces": [{ "name": st.ifname, "sandbox": st.netns }],
            "ips": [{ "version": "4", "address": format!("{found}/{}", self.prefix), "interface": 0 }],
        }))
    }

    /// The rule that keeps an allocation from reaching the host's 127.0.0.0/8. The
    /// portmap plugin (with `snat`, which makes the node's own `127.0.0.1:<host port>`
    /// work) turns on `route_localnet` for the bridge: the kernel would then accept a
    /// packet for 127.0.0.1 arriving from a namespace on the bridge, and a task able to
    /// send one (a route of its own, a raw socket) would reach every service the node
    /// keeps to loopback — the agent's API, etcd (Kubernetes' CVE-2020-8558). Dropped
    /// at INPUT unless it is the answer of a connection or a forwarded port (conntrack
    /// `RELATED,ESTABLISHED,DNAT`), as kubelet's rule does; added once, kept after the
    /// last allocation (like the admin chain's rule).
    pub async fn ensure_localhost_guard(&self) -> Result<(), NetworkError> {
        let rule = localhost_guard_rule(&self.config.name);
        let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
        ensure_rule(
            &["-C", "INPUT"],
            &["-I", "INPUT", "1"],
            &rule,
            "iptables -I INPUT (the rule keeping allocations off the node's 127.0.0.0/8)",
        )
        .await
    }

    /// The rule that lets forwarded traffic into the bridge's subnet (Nomad adds the
    /// same to its admin chain: hosts whose FORWARD policy is DROP, Docker's, would
    /// drop it). The firewall plugin made the chain; the rule is added once.
    async fn ensure_admin_rule(&self) -> Result<(), NetworkError> {
        let rule = [
            "-o",
            self.config.name.as_str(),
            "-d",
            self.config.subnet.as_str(),
            "-j",
            "ACCEPT",
        ];
        ensure_rule(
            &["-C", ADMIN_CHAIN],
            &["-A", ADMIN_CHAIN],
            &rule,
            "iptables -A DROVER-ADMIN",
        )
        .await
    }
}

/// Add `rule` with `add` (e.g. `-A CHAIN`) unless `check` (`-C CHAIN`) finds it;
/// `what` names the command in the error.
async fn ensure_rule(
    check: &[&str],
    add: &[&str],
    rule: &[&str],
    what: &str,
) -> Result<(), NetworkError> {
    let check: Vec<&str> = check.iter().chain(rule).copied().collect();
    let add: Vec<&str> = add.iter().chain(rule).copied().collect();
    if let Ok(Ok(o)) = iptables(&check).await
        && o.status.success()
    {
        return Ok(());
    }
    match iptables(&add).await {
        Ok(Ok(o)) if o.status.success() => Ok(()),
        Ok(Ok(o)) => Err(NetworkError::Config(format!(
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
        Ok(Err(e)) => Err(NetworkError::Config(format!("cannot run iptables: {e}"))),
        Err(_) => Err(NetworkError::Config(
            "iptables did not finish in time".into(),
        )),
    }
}

/// `iptables -w -t filter ARGS`, bounded in time.
async fn iptables(
    args: &[&str],
) -> Result<std::io::Result<std::process::Output>, tokio::time::error::Elapsed> {
    tokio::time::timeout(
        PLUGIN_TIMEOUT,
        tokio::process::Command::new("iptables")
            .args(["-w", "-t", "filter"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
}

/// The INPUT rule of [`Bridge::ensure_localhost_guard`] for bridge `bridge`.
fn localhost_guard_rule(bridge: &str) -> Vec<String> {
    [
        "-i",
        bridge,
        "-d",
        "127.0.0.0/8",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "RELATED,ESTABLISHED,DNAT",
        "-m",
        "comment",
        "--comment",
        "drover: allocations may not reach the node's loopback",
        "-j",
        "DROP",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// The allocation's address in a CNI result: the first address on an interface
/// inside the namespace named `ifname`, else the first address (as Nomad picks it).
pub fn address_of(result: &Value, ifname: &str) -> Option<String> {
    let view: cni::ResultView = serde_json::from_value(result.clone()).ok()?;
    let in_sandbox = view.ips.iter().find(|ip| {
        ip.interface
            .and_then(|i| view.interfaces.get(i))
            .is_some_and(|i| !i.sandbox.is_empty() && i.name == ifname)
    });
    let ip = in_sandbox.or(view.ips.first())?;
    Some(ip.address.split('/').next().unwrap_or_default().to_owned())
}

/// The address host-local reserved in `dir` for container `id` (a file named by the
/// address, holding the id and the interface name on their own lines).
fn reserved_address(dir: &Path, id: &str, ifname: &str) -> Option<Ipv4Addr> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let Ok(ip) = entry.file_name().to_string_lossy().parse::<Ipv4Addr>() else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut lines = text.lines().map(str::trim);
        if lines.next() == Some(id) && lines.next().is_none_or(|i| i == ifname) {
            return Some(ip);
        }
    }
    None
}

#[cfg(test)]
mod tests;
