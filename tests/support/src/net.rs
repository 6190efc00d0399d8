//! Ports for the servers tests start on 127.0.0.1.

use std::net::{SocketAddr, TcpListener};

/// Where the kernel's ephemeral ports start when `/proc` does not say.
const EPHEMERAL_LOW_DEFAULT: u16 = 32768;

/// The lowest port this hands out: above the well-known and most registered
/// services' ports.
const LOWEST: u16 = 10000;

/// An address on 127.0.0.1 with a port free now, for a server a test is about to
/// start (which binds it itself).
///
/// The port is below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`),
/// never from `bind(0)`: a port `bind(0)` gave out and we released is in that range,
/// and the kernel may give it to any outgoing connection (another test's client, a
/// daemon) before our server binds it. CI lost an etcd member so ("bind: address
/// already in use" on a port picked this way a moment earlier). Below the range only
/// another test picking the same random port can take it.
pub fn free_local_addr() -> SocketAddr {
    let high = ephemeral_low().max(LOWEST + 1000);
    for _ in 0..10_000 {
        let port = fastrand::u16(LOWEST..high);
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().expect("local address of a bound listener");
        }
    }
    panic!("no free port on 127.0.0.1 between {LOWEST} and {high}");
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_LOW_DEFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_and_below_the_ephemeral_range() {
        let low = ephemeral_low().max(LOWEST + 1000);
        let a = free_local_addr();
        assert!((LOWEST..low).contains(&a.port()), "{a}");
        assert!(a.ip().is_loopback());
        // Free: our own bind of it succeeds.
        drop(TcpListener::bind(a).expect("the port handed out is free"));
    }
}
