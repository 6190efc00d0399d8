//! Ports: which ports of a node are taken, and picking an allocation's ports there.
//!
//! A node's taken ports are kept as a bitset (65,536 bits, 8 KiB) by the state, updated
//! as allocations are written and stop, so that a placement tests a port in O(1)
//! instead of scanning the node's allocations. Ports are picked as Nomad does: static
//! ports as asked; each dynamic one by a few random picks in the node's range, then a
//! scan of the range when those all hit taken ports.

use std::collections::BTreeMap;

use drover_server_api::{
    AllocatedPort, Allocation, DEFAULT_MAX_DYNAMIC_PORT, DEFAULT_MIN_DYNAMIC_PORT, JobSpec, Node,
    NodeNetwork, PortSpec,
};

use super::feasible::{Compiled, GroupNeeds, could_run};
use super::rank::SplitMix64;

const WORDS: usize = (u16::MAX as usize + 1) / 64;

/// Random picks per dynamic port before the range is scanned (Nomad's
/// `maxRandPortAttempts`).
const RANDOM_PICKS: usize = 20;

/// The ports a node's live allocations hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsedPorts {
    bits: Box<[u64]>,
    /// Holders past the first of a port (two allocations on one port cannot be placed,
    /// but the state must not forget the second holder when the first stops).
    extra: BTreeMap<u16, u32>,
    len: usize,
}

impl Default for UsedPorts {
    fn default() -> Self {
        UsedPorts {
            bits: vec![0u64; WORDS].into_boxed_slice(),
            extra: BTreeMap::new(),
            len: 0,
        }
    }
}

impl UsedPorts {
    /// Whether some allocation holds `port`.
    pub fn contains(&self, port: u16) -> bool {
        self.bits[usize::from(port) / 64] & (1 << (port % 64)) != 0
    }

    /// How many allocations hold `port`.
    pub fn holders(&self, port: u16) -> u32 {
        if self.contains(port) {
            1 + self.extra.get(&port).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// No port is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One more holder of `port`.
    pub fn add(&mut self, port: u16) {
        if self.contains(port) {
            *self.extra.entry(port).or_default() += 1;
        } else {
            self.bits[usize::from(port) / 64] |= 1 << (port % 64);
        }
        self.len += 1;
    }

    /// One holder of `port` less.
    pub fn remove(&mut self, port: u16) {
        if !self.contains(port) {
            return;
        }
        self.len -= 1;
        if let Some(k) = self.extra.get_mut(&port) {
            *k -= 1;
            if *k == 0 {
                self.extra.remove(&port);
            }
            return;
        }
        self.bits[usize::from(port) / 64] &= !(1 << (port % 64));
    }

    /// The ports of `a` are held.
    pub fn add_alloc(&mut self, a: &Allocation) {
        for p in &a.ports {
            self.add(p.value);
        }
    }

    /// The ports of `a` are free again.
    pub fn remove_alloc(&mut self, a: &Allocation) {
        for p in &a.ports {
            self.remove(p.value);
        }
    }
}

/// Whether the node keeps `port` out of allocations' reach.
pub(crate) fn reserved(net: &NodeNetwork, port: u16) -> bool {
    net.reserved_ports
        .iter()
        .any(|r| r.first <= port && port <= r.last)
}

/// Why a node has no room for a group's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PortProblem {
    /// A static port another allocation holds.
    InUse(u16),
    /// A static port the node reserves.
    Reserved(u16),
    /// Not enough free ports in the node's dynamic range.
    NoDynamic,
}

impl PortProblem {
    /// The key of `PlacementFailure::nodes_exhausted` (Nomad's dimension, which
    /// starts with `network:` for ports).
    pub(crate) fn key(self) -> String {
        match self {
            PortProblem::InUse(p) => format!("network: port {p} in use"),
            PortProblem::Reserved(p) => format!("network: port {p} reserved"),
            PortProblem::NoDynamic => "network: no free dynamic port".to_owned(),
        }
    }
}

/// The sentence of one exhausted dimension over `k` of `n` nodes: `cpu exhausted on 2
/// of 3 nodes`, `port 8080 in use on 3 of 3 nodes`.
pub(crate) fn exhausted_sentence(dim: &str, k: u32, n: usize) -> String {
    match dim
        .strip_prefix("network: ")
        .or_else(|| dim.strip_prefix("devices: "))
    {
        Some(what) => format!("{what} on {k} of {n} nodes"),
        None => format!("{dim} exhausted on {k} of {n} nodes"),
    }
}

/// Pick a port for each of `specs` on a node offering `net`, where `used(port)` says
/// whether an allocation holds it: the ports' values, in the order of `specs`.
pub(crate) fn assign(
    specs: &[PortSpec],
    net: &NodeNetwork,
    used: impl Fn(u16) -> bool,
    rng: &mut SplitMix64,
) -> Result<Vec<u16>, PortProblem> {
    let mut statics: Vec<u16> = Vec::new();
    // Static ones first: a dynamic pick must not take one of them.
    for s in specs {
        let Ok(p) = u16::try_from(s.static_port) else {
            return Err(PortProblem::NoDynamic);
        };
        if p == 0 {
            continue;
        }
        if reserved(net, p) {
            return Err(PortProblem::Reserved(p));
        }
        if used(p) || statics.contains(&p) {
            return Err(PortProblem::InUse(p));
        }
        statics.push(p);
    }
    let (min, max) = (net.min_dynamic_port.max(1), net.max_dynamic_port);
    let mut out: Vec<u16> = Vec::with_capacity(specs.len());
    let free = |p: u16, taken: &[u16]| {
        !used(p) && !reserved(net, p) && !taken.contains(&p) && !statics.contains(&p)
    };
    let mut next_static = statics.iter();
    for s in specs {
        if s.static_port != 0 {
            out.extend(next_static.next());
            continue;
        }
        if min > max {
            return Err(PortProblem::NoDynamic);
        }
        let span = usize::from(max - min) + 1;
        let mut picked = None;
        for _ in 0..RANDOM_PICKS {
            let p = min + rng.below(span) as u16;
            if free(p, &out) {
                picked = Some(p);
                break;
            }
        }
        if picked.is_none() {
            // The range is crowded: scan it, from a random place so that crowded
            // nodes do not all hand out the same lowest port.
            let start = rng.below(span);
            picked = (0..span)
                .map(|k| min + ((start + k) % span) as u16)
                .find(|p| free(*p, &out));
        }
        match picked {
            Some(p) => out.push(p),
            None => return Err(PortProblem::NoDynamic),
        }
    }
    Ok(out)
}

/// A static port a job asks for that the scheduler could never give: one inside the
/// dynamic port range of a node that could run its group (the scheduler hands those
/// out to other allocations at random), or the same port asked twice by a group.
/// Nodes that could run the group: in the job's datacenters, its drivers detected,
/// its constraints holding; with none such registered, Nomad's default range counts.
/// `Err((field, message))`, the field as validation names it.
pub(crate) fn check_static_ports(spec: &JobSpec, nodes: &[&Node]) -> Result<(), (String, String)> {
    let mut compiled = Compiled::default();
    for (gi, g) in spec.groups.iter().enumerate() {
        let Some(net) = &g.network else { continue };
        if net.ports.iter().all(|p| p.static_port == 0) {
            continue;
        }
        let needs = GroupNeeds::new(spec, g);
        let able: Vec<&Node> = nodes
            .iter()
            .copied()
            .filter(|n| drover_server_api::datacenter_allowed(&spec.datacenters, &n.datacenter))
            .filter(|n| could_run(n, &needs, &mut compiled))
            .collect();
        for (pi, p) in net.ports.iter().enumerate() {
            if p.static_port == 0 {
                continue;
            }
            let field = format!("group[{gi}].network.port[{pi}].static");
            if let Some(twice) = net.ports[..pi]
                .iter()
                .find(|q| q.static_port == p.static_port)
            {
                return Err((
                    field,
                    format!(
                        "port {} is asked twice (by {:?} and {:?})",
                        p.static_port, twice.label, p.label
                    ),
                ));
            }
            let port = p.static_port;
            let inside = |min: u16, max: u16| u32::from(min) <= port && port <= u32::from(max);
            if able.is_empty() {
                if inside(DEFAULT_MIN_DYNAMIC_PORT, DEFAULT_MAX_DYNAMIC_PORT) {
                    return Err((
                        field,
                        format!(
                            "{port} is inside the default dynamic port range \
                             {DEFAULT_MIN_DYNAMIC_PORT}-{DEFAULT_MAX_DYNAMIC_PORT} (no node \
                             that could run the group is registered): pick a port outside it"
                        ),
                    ));
                }
                continue;
            }
            if let Some(n) = able
                .iter()
                .find(|n| inside(n.network.min_dynamic_port, n.network.max_dynamic_port))
            {
                return Err((
                    field,
                    format!(
                        "{port} is inside the dynamic port range {}-{} of node {} ({}): \
                         the scheduler gives those ports to other allocations; pick a port \
                         outside it",
                        n.network.min_dynamic_port, n.network.max_dynamic_port, n.name, n.id
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The allocation's ports, from the group's specs and the values picked for them.
pub(crate) fn allocated(
    specs: &[PortSpec],
    values: &[u16],
    net: &NodeNetwork,
) -> Vec<AllocatedPort> {
    specs
        .iter()
        .zip(values)
        .map(|(s, v)| AllocatedPort {
            label: s.label.clone(),
            value: *v,
            to: u16::try_from(s.to).ok().filter(|t| *t > 0).unwrap_or(*v),
            host_ip: net.address.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_server_api::PortRange;

    fn spec(label: &str, static_port: u32) -> PortSpec {
        PortSpec {
            label: label.into(),
            static_port,
            ..PortSpec::default()
        }
    }

    #[test]
    fn the_bitset_counts_holders() {
        let mut u = UsedPorts::default();
        assert!(u.is_empty());
        u.add(8080);
        u.add(8080);
        u.add(65535);
        assert_eq!(u.holders(8080), 2);
        assert!(u.contains(65535) && !u.contains(8081));
        u.remove(8080);
        assert!(u.contains(8080));
        u.remove(8080);
        assert!(!u.contains(8080));
        u.remove(8080);
        u.remove(65535);
        assert!(u.is_empty());
    }

    #[test]
    fn dynamic_ports_avoid_used_reserved_and_each_other() {
        let net = NodeNetwork {
            min_dynamic_port: 100,
            max_dynamic_port: 109,
            reserved_ports: vec![PortRange {
                first: 100,
                last: 103,
            }],
            ..NodeNetwork::default()
        };
        let specs = [spec("a", 0), spec("b", 0), spec("c", 105), spec("d", 0)];
        let mut rng = SplitMix64::new(7);
        for _ in 0..50 {
            let v = assign(&specs, &net, |p| p == 104 || p == 109, &mut rng).unwrap();
            assert_eq!(v[2], 105);
            let mut d = vec![v[0], v[1], v[3]];
            d.sort_unstable();
            assert_eq!(d, [106, 107, 108], "{v:?}");
        }
        let more = [
            spec("a", 0),
            spec("b", 0),
            spec("c", 0),
            spec("d", 0),
            spec("e", 0),
        ];
        assert_eq!(
            assign(&more, &net, |p| p == 104 || p == 109, &mut rng),
            Err(PortProblem::NoDynamic)
        );
        assert_eq!(
            assign(&[spec("s", 101)], &net, |_| false, &mut rng),
            Err(PortProblem::Reserved(101))
        );
        assert_eq!(
            assign(&[spec("s", 8080)], &net, |p| p == 8080, &mut rng),
            Err(PortProblem::InUse(8080))
        );
    }

    /// Agents reserve the privileged ports by default (`reserved.reserved_ports`):
    /// a static port 22 is refused, the reason naming the port, so that no task in
    /// bridge mode receives the node's SSH connections.
    #[test]
    fn a_static_privileged_port_on_a_default_node_is_refused_naming_it() {
        let net = NodeNetwork {
            reserved_ports: vec![PortRange {
                first: 1,
                last: 1023,
            }],
            ..NodeNetwork::default()
        };
        let mut rng = SplitMix64::new(7);
        let problem = assign(&[spec("ssh", 22)], &net, |_| false, &mut rng).unwrap_err();
        assert_eq!(problem, PortProblem::Reserved(22));
        assert_eq!(problem.key(), "network: port 22 reserved");
        assert!(assign(&[spec("web", 8080)], &net, |_| false, &mut rng).is_ok());
    }

    #[test]
    fn to_defaults_to_the_value() {
        let net = NodeNetwork::default();
        let specs = [
            spec("a", 8080),
            PortSpec {
                to: 80,
                ..spec("b", 8081)
            },
            PortSpec {
                to: -1,
                ..spec("c", 8082)
            },
        ];
        let ports = allocated(&specs, &[8080, 8081, 8082], &net);
        assert_eq!(
            ports.iter().map(|p| p.to).collect::<Vec<_>>(),
            [8080, 80, 8082]
        );
        assert!(ports.iter().all(|p| p.host_ip == "127.0.0.1"));
    }
}
