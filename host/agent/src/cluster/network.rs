//! What the node offers allocations for ports: its address, the dynamic port range
//! and the reserved ports, as registered with the servers.

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs as _, UdpSocket};

use drover_server_api::NodeNetwork;

use super::ClusterError;
use crate::config::AgentConfig;

/// The node's network as `config` says: the first IPv4 address of
/// `network_interface`, else 127.0.0.1 for a dev agent, else the address this host
/// reaches its first server from (no packet is sent: the kernel's route choice).
///
/// # Errors
/// A port setting out of range, an interface that does not exist or has no IPv4
/// address, or (without `network_interface`) no route to any server.
pub fn node_network(config: &AgentConfig) -> Result<NodeNetwork, ClusterError> {
    let ports = config
        .port_settings()
        .map_err(|e| ClusterError::Config(e.to_string()))?;
    let address = match &config.network_interface {
        Some(name) => interface_ipv4(name)?,
        None if config.dev => Ipv4Addr::LOCALHOST.into(),
        None => route_source(&config.servers).ok_or_else(|| {
            ClusterError::Config(format!(
                "cannot tell the node's address: no route to any of servers = {:?}; set \
                 network_interface to the interface allocations' ports should be on",
                config.servers
            ))
        })?,
    };
    Ok(NodeNetwork {
        address: address.to_string(),
        min_dynamic_port: ports.min_dynamic_port,
        max_dynamic_port: ports.max_dynamic_port,
        reserved_ports: ports.reserved_ports,
    })
}

/// The first IPv4 address of interface `name`.
fn interface_ipv4(name: &str) -> Result<IpAddr, ClusterError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| {
        ClusterError::Config(format!(
            "network_interface = {name:?}: cannot list the interfaces: {e}"
        ))
    })?;
    let mut seen = false;
    for a in addrs.filter(|a| a.interface_name == name) {
        seen = true;
        if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
            return Ok(IpAddr::V4(sin.ip()));
        }
    }
    Err(ClusterError::Config(if seen {
        format!("network_interface = {name:?} has no IPv4 address")
    } else {
        format!("network_interface = {name:?}: no such interface on this host")
    }))
}

/// The local address of a route to the first server that has one.
fn route_source(servers: &[String]) -> Option<IpAddr> {
    servers
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .find_map(|server| {
            // `http(s)://` prefixes are accepted in `servers` elsewhere.
            let host_port = server
                .strip_prefix("http://")
                .or_else(|| server.strip_prefix("https://"))
                .unwrap_or(server);
            let target = host_port.to_socket_addrs().ok()?.next()?;
            let bind: IpAddr = if target.is_ipv4() {
                Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            let socket = UdpSocket::bind((bind, 0)).ok()?;
            socket.connect(target).ok()?;
            Some(socket.local_addr().ok()?.ip())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> AgentConfig {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, toml_text).expect("write config");
        AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
            .expect("valid config")
    }

    #[test]
    fn loopback_interface_gives_127_0_0_1_and_ports_come_from_the_config() {
        let c = config(
            "servers = [\"127.0.0.1:4647\"]\nnetwork_interface = \"lo\"\n\
             min_dynamic_port = 21000\nmax_dynamic_port = 21999\n\
             [reserved]\nreserved_ports = \"22, 80,8000-8100\"\n",
        );
        let n = node_network(&c).expect("lo exists");
        assert_eq!(n.address, "127.0.0.1");
        assert_eq!((n.min_dynamic_port, n.max_dynamic_port), (21000, 21999));
        let ranges: Vec<(u16, u16)> = n.reserved_ports.iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(ranges, [(22, 22), (80, 80), (8000, 8100)]);
    }

    #[test]
    fn without_an_interface_the_route_to_the_server_decides_and_dev_is_loopback() {
        let n = node_network(&config("servers = [\"127.0.0.1:4647\"]\n")).expect("route");
        assert_eq!(n.address, "127.0.0.1");
        assert_eq!((n.min_dynamic_port, n.max_dynamic_port), (20000, 32000));
        let n = node_network(&config("dev = true\nservers = [\"127.0.0.1:4647\"]\n")).expect("dev");
        assert_eq!(n.address, "127.0.0.1");
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = node_network(&config(
            "servers = [\"127.0.0.1:4647\"]\nnetwork_interface = \"nosuch0\"\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("network_interface = \"nosuch0\": no such interface"),
            "{e}"
        );
    }
}
