//! Placement: picks a node for each copy reconciliation asked for, keeping track of
//! what the plan so far adds to and frees on every node.
//!
//! Nodes are visited in a random order (seeded by the evaluation, see [`Walk`]) that
//! carries over from one placement to the next, as Nomad's limit iterator over a
//! shuffled node list: each placement scores the next `limit` feasible nodes that fit
//! and takes the best, so it costs O(limit + skipped), not O(nodes). Feasibility that
//! depends only on the node and the group is computed once per node and group, when
//! the node is first visited.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use drover_server_api::{
    AllocResources, Allocation, ClientStatus, DesiredStatus, Job, Node, PlacementFailure, PortSpec,
    TaskGroup,
};

use super::StateView;
use super::devices::{self, DeviceShortage, TaskDevices};
use super::feasible::{self, Compiled, Filter, GroupNeeds};
use super::ports::{self, PortProblem, UsedPorts};
use super::rank::{self, MAX_SKIP, SplitMix64, Walk};
use crate::config::SchedulerAlgorithm;

/// Most characters of a driver's own description quoted in a placement failure.
const MAX_DRIVER_SAYS: usize = 240;

/// A CSI volume as a placement pass sees it: the volume (if it exists) and its claims
/// ((node id, write)), the pass's placements included.
type CsiVolumeClaims<'a> = (
    Option<&'a drover_server_api::csi::CsiVolume>,
    Vec<(String, bool)>,
);

/// Per group: its needs and which nodes are statically feasible (0 unknown, 1 yes, 2 no).
struct GroupCtx<'a> {
    needs: GroupNeeds<'a>,
    ask: AllocResources,
    feasible: Vec<u8>,
    /// Allocations of the group per node (only kept for `distinct_hosts` on the group).
    on_node: Vec<u32>,
    /// The ports each allocation needs (empty: none).
    ports: &'a [PortSpec],
    /// The CSI volumes it claims (empty: none).
    csi: Vec<super::csi::CsiNeed<'a>>,
}

impl<'a> GroupCtx<'a> {
    fn new(job: &'a Job, group: &'a TaskGroup, n: usize) -> Self {
        let needs = GroupNeeds::new(&job.spec, group);
        let on_node = if needs.distinct_group {
            vec![0; n]
        } else {
            Vec::new()
        };
        GroupCtx {
            needs,
            ask: group.resources(),
            feasible: vec![0; n],
            on_node,
            ports: group
                .network
                .as_ref()
                .map_or(&[], |net| net.ports.as_slice()),
            csi: super::csi::csi_needs(group),
        }
    }
}

pub(crate) struct Placer<'a> {
    state: &'a dyn StateView,
    job: &'a Job,
    eval_id: &'a str,
    algorithm: SchedulerAlgorithm,
    nodes: Vec<&'a Node>,
    /// Node id → position, built when first needed (a new job with nothing to stop
    /// never needs it: its evaluations cost no per-node hashing).
    by_id: Option<HashMap<&'a str, usize>>,
    /// The visiting order; it carries over from one placement to the next.
    walk: Walk,
    limit: usize,
    /// Usage from the state, read when a node is first looked at.
    base: Vec<Option<AllocResources>>,
    /// What the plan added (+) or freed (-) per node: cpu, memory.
    delta: Vec<(i64, i64)>,
    /// Live allocations of the job per node, the plan included (anti-affinity,
    /// `distinct_hosts` on the job).
    job_on_node: Vec<u32>,
    /// Per group of the job; `group_ix` finds them by name once per placement.
    groups: Vec<GroupCtx<'a>>,
    group_ix: HashMap<&'a str, usize>,
    compiled: Compiled,
    /// Nodes left out because their datacenter matches none of the job's
    /// `datacenters` (they are not in `nodes`).
    dc_filtered: u32,
    /// Nodes looked at by placements so far (the cost of placing).
    pub(crate) visits: u64,
    /// Ports held on each node according to the state, read when a group with ports
    /// first looks at the node (empty until then: jobs without ports never read them).
    ports_base: Vec<Option<Option<Cow<'a, UsedPorts>>>>,
    /// What the plan took (+) and freed (-) of each node's ports.
    ports_delta: HashMap<usize, PortsDelta>,
    /// Dynamic port picks (seeded by the evaluation, as the visiting order).
    port_rng: SplitMix64,
    /// The ports of the last placement, for [`Placer::allocation`].
    assigned: Vec<u16>,
    /// Device instances held on each node according to the state, read when a group
    /// with devices first looks at the node.
    devices_base: HashMap<usize, HashSet<String>>,
    /// Device instances the plan took and freed on each node.
    devices_delta: HashMap<usize, DevicesDelta>,
    /// The devices of the last placement, for [`Placer::allocation`].
    assigned_devices: TaskDevices,
    /// CSI volumes by id, read when a group claiming one first looks: the volume and
    /// its claims ((node id, write)), this plan's placements included. A stop in the
    /// plan frees no claim: a claim ends when the client reports its allocation
    /// terminal (it still has the volume mounted until then).
    csi: HashMap<&'a str, CsiVolumeClaims<'a>>,
}

#[derive(Default)]
struct DevicesDelta {
    taken: HashSet<String>,
    freed: HashSet<String>,
}

/// What a placement on a node takes besides cpu and memory.
struct Pick {
    ports: Vec<u16>,
    devices: TaskDevices,
}

#[derive(Default)]
struct PortsDelta {
    /// How many times each port was taken or freed: counted, so that a big job
    /// placing many copies on one node tests a port in O(1), not in the number of
    /// ports it placed so far.
    taken: HashMap<u16, u32>,
    freed: HashMap<u16, u32>,
}

/// One placement's outcome.
pub(crate) enum Placed {
    /// On this node.
    Node(usize),
    /// Nowhere: the group's failure is recorded.
    Failed,
    /// A system job's node cannot run the group: nothing to place there.
    Skipped,
}

impl<'a> Placer<'a> {
    pub(crate) fn new(
        state: &'a dyn StateView,
        job: &'a Job,
        allocs: &[&'a Allocation],
        eval_id: &'a str,
        algorithm: SchedulerAlgorithm,
    ) -> Self {
        let mut nodes = state.nodes();
        // The job's datacenters, once per evaluation: a node outside them is never
        // visited (nor counted by the sample limit). No pattern: nothing to do. The
        // plan applier does not check this again: a node's datacenter is fixed at its
        // registration and a plan is made for one job version, so a plan cannot become
        // wrong about datacenters between scheduling and applying.
        let mut dc_filtered = 0u32;
        if !job.spec.datacenters.is_empty() {
            let before = nodes.len();
            nodes.retain(|node| {
                drover_server_api::datacenter_allowed(&job.spec.datacenters, &node.datacenter)
            });
            dc_filtered = (before - nodes.len()) as u32;
        }
        let n = nodes.len();
        let mut rng = SplitMix64::new(rank::seed_for(eval_id));
        let walk = Walk::new(n, &mut rng);
        let groups: Vec<GroupCtx> = job
            .spec
            .groups
            .iter()
            .map(|g| GroupCtx::new(job, g, n))
            .collect();
        let group_ix = job
            .spec
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.as_str(), i))
            .collect();
        let mut placer = Placer {
            state,
            job,
            eval_id,
            algorithm,
            limit: rank::sample_limit(job.spec.job_type, n),
            base: vec![None; n],
            delta: vec![(0, 0); n],
            job_on_node: vec![0; n],
            nodes,
            by_id: None,
            walk,
            groups,
            group_ix,
            compiled: Compiled::default(),
            dc_filtered,
            visits: 0,
            ports_base: Vec::new(),
            ports_delta: HashMap::new(),
            port_rng: SplitMix64::new(rank::seed_for(eval_id) ^ 0x706f_7274_7300_0000),
            assigned: Vec::new(),
            devices_base: HashMap::new(),
            devices_delta: HashMap::new(),
            assigned_devices: TaskDevices::new(),
            csi: HashMap::new(),
        };
        for a in allocs {
            if a.desired_status == DesiredStatus::Run
                && !a.client_status.is_terminal()
                && let Some(i) = placer.index_of(&a.node_id)
            {
                placer.job_on_node[i] += 1;
                if let Some(&gi) = placer.group_ix.get(a.group.as_str())
                    && placer.groups[gi].needs.distinct_group
                {
                    placer.groups[gi].on_node[i] += 1;
                }
            }
        }
        placer
    }

    fn index_of(&mut self, node_id: &str) -> Option<usize> {
        let nodes = &self.nodes;
        self.by_id
            .get_or_insert_with(|| {
                let mut m = HashMap::with_capacity(nodes.len());
                for (i, node) in nodes.iter().enumerate() {
                    m.insert(node.id.as_str(), i);
                }
                m
            })
            .get(node_id)
            .copied()
    }

    /// The plan stops `a`: its resources are free for what follows.
    pub(crate) fn stopped(&mut self, a: &Allocation) {
        if a.desired_status != DesiredStatus::Run || a.client_status.is_terminal() {
            return;
        }
        let Some(i) = self.index_of(&a.node_id) else {
            return;
        };
        self.delta[i].0 -= a.resources.cpu as i64;
        self.delta[i].1 -= a.resources.memory_mb as i64;
        self.job_on_node[i] = self.job_on_node[i].saturating_sub(1);
        if !a.ports.is_empty() {
            let d = self.ports_delta.entry(i).or_default();
            for p in &a.ports {
                *d.freed.entry(p.value).or_default() += 1;
            }
        }
        if !a.task_devices.is_empty() {
            let d = self.devices_delta.entry(i).or_default();
            for k in devices::held_by(a) {
                d.taken.remove(&k);
                d.freed.insert(k);
            }
        }
        if let Some(&gi) = self.group_ix.get(a.group.as_str())
            && self.groups[gi].needs.distinct_group
        {
            let g = &mut self.groups[gi];
            g.on_node[i] = g.on_node[i].saturating_sub(1);
        }
    }

    /// The position of `group`'s context (made on first use for a group the job does
    /// not list, which reconciliation never asks for).
    fn group_index(&mut self, group: &'a TaskGroup) -> usize {
        if let Some(&gi) = self.group_ix.get(group.name.as_str()) {
            return gi;
        }
        self.groups
            .push(GroupCtx::new(self.job, group, self.nodes.len()));
        self.group_ix
            .insert(group.name.as_str(), self.groups.len() - 1);
        self.groups.len() - 1
    }

    fn usage(&mut self, i: usize) -> (u64, u64) {
        let base = *self.base[i].get_or_insert_with(|| self.state.node_usage(&self.nodes[i].id));
        let (dc, dm) = self.delta[i];
        (
            (base.cpu as i64 + dc).max(0) as u64,
            (base.memory_mb as i64 + dm).max(0) as u64,
        )
    }

    /// Which dimension does not fit, if any.
    fn exhausted(&mut self, i: usize, ask: AllocResources) -> Option<&'static str> {
        let (cpu, mem) = self.usage(i);
        let total = self.nodes[i].resources;
        if cpu + ask.cpu > total.cpu {
            Some("cpu")
        } else if mem + ask.memory_mb > total.memory_mb {
            Some("memory")
        } else {
            None
        }
    }

    /// The ports of one allocation of group `gi` on node `i`, or why there are none.
    fn pick_ports(&mut self, gi: usize, i: usize) -> Result<Vec<u16>, PortProblem> {
        let specs = self.groups[gi].ports;
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        if self.ports_base.is_empty() {
            self.ports_base = vec![None; self.nodes.len()];
        }
        let state = self.state;
        let node = self.nodes[i];
        let base = self.ports_base[i]
            .get_or_insert_with(|| state.node_ports(&node.id))
            .as_deref();
        let delta = self.ports_delta.get(&i);
        let used = |p: u16| {
            let mut holders = base.map_or(0, |b| b.holders(p)) as usize;
            if let Some(d) = delta {
                holders = holders.saturating_sub(d.freed.get(&p).copied().unwrap_or(0) as usize);
                holders += d.taken.get(&p).copied().unwrap_or(0) as usize;
            }
            holders > 0
        };
        ports::assign(specs, &node.network, used, &mut self.port_rng)
    }

    /// The device instances of one allocation of group `gi` on node `i`, or which
    /// request cannot be served.
    fn pick_devices(&mut self, gi: usize, i: usize) -> Result<TaskDevices, DeviceShortage> {
        if self.groups[gi].needs.devices.is_empty() {
            return Ok(TaskDevices::new());
        }
        let state = self.state;
        let node = self.nodes[i];
        let base = self
            .devices_base
            .entry(i)
            .or_insert_with(|| devices::held(state.node_allocs(&node.id)));
        let delta = self.devices_delta.get(&i);
        let used = |k: &str| {
            delta.is_some_and(|d| d.taken.contains(k))
                || (base.contains(k) && !delta.is_some_and(|d| d.freed.contains(k)))
        };
        devices::assign(
            node,
            &self.groups[gi].needs.devices,
            used,
            &mut self.compiled,
        )
    }

    /// Whether one allocation of group `gi` on node `i` may claim its CSI volumes;
    /// why not, naming the volume.
    fn pick_csi(&mut self, gi: usize, i: usize) -> Result<(), String> {
        if self.groups[gi].csi.is_empty() {
            return Ok(());
        }
        let state = self.state;
        let ns = self.job.spec.namespace.as_str();
        let node = self.nodes[i];
        for need in &self.groups[gi].csi {
            let (vol, claims) = self.csi.entry(need.source).or_insert_with(|| {
                (
                    state.csi_volume(ns, need.source),
                    super::csi::claim_pairs(&state.csi_claims(ns, need.source)),
                )
            });
            super::csi::check_claim(*vol, need, node, claims)?;
        }
        Ok(())
    }

    /// Ports and devices of one allocation of group `gi` on node `i`, if it gets them.
    fn pick(&mut self, gi: usize, i: usize) -> Option<Pick> {
        self.pick_csi(gi, i).ok()?;
        let ports = self.pick_ports(gi, i).ok()?;
        let devices = self.pick_devices(gi, i).ok()?;
        Some(Pick { ports, devices })
    }

    fn statically_feasible(&mut self, gi: usize, i: usize) -> bool {
        let g = &mut self.groups[gi];
        match g.feasible[i] {
            1 => true,
            2 => false,
            _ => {
                let ok = feasible::check(self.nodes[i], &g.needs, &mut self.compiled).is_ok();
                g.feasible[i] = if ok { 1 } else { 2 };
                ok
            }
        }
    }

    fn distinct_violated(&self, gi: usize, i: usize) -> bool {
        let g = &self.groups[gi];
        (g.needs.distinct_job && self.job_on_node[i] > 0)
            || (g.needs.distinct_group && g.on_node[i] > 0)
    }

    fn score(
        &mut self,
        i: usize,
        ask: AllocResources,
        desired: u32,
        failed_on: Option<&str>,
    ) -> f64 {
        let (cpu, mem) = self.usage(i);
        let node = self.nodes[i];
        let fit = rank::fit_score(
            self.algorithm,
            node.resources,
            cpu + ask.cpu,
            mem + ask.memory_mb,
        );
        rank::final_score(
            fit,
            self.job_on_node[i],
            desired,
            failed_on.is_some_and(|id| id == node.id),
        )
    }

    /// Place one copy of `group` (on `only` for system jobs).
    pub(crate) fn place(
        &mut self,
        group: &'a TaskGroup,
        previous: Option<&Allocation>,
        only: Option<&'a Node>,
    ) -> Placed {
        let gi = self.group_index(group);
        let ask = self.groups[gi].ask;
        if let Some(node) = only {
            let Some(i) = self.index_of(&node.id) else {
                return Placed::Skipped;
            };
            if !self.statically_feasible(gi, i) || self.distinct_violated(gi, i) {
                return Placed::Skipped;
            }
            if self.exhausted(i, ask).is_some() {
                return Placed::Failed;
            }
            let Some(pick) = self.pick(gi, i) else {
                return Placed::Failed;
            };
            self.commit(gi, i, ask, pick);
            return Placed::Node(i);
        }
        let n = self.nodes.len();
        let desired = group.count.max(1);
        let failed_on = previous
            .filter(|p| p.client_status == ClientStatus::Failed)
            .map(|p| p.node_id.clone());
        let mut best: Option<(f64, usize, Pick)> = None;
        let mut candidates = 0;
        let mut skipped: Vec<(f64, usize, Pick)> = Vec::new();
        let mut visited = 0;
        while visited < n && candidates < self.limit {
            let i = self.walk.next_index();
            visited += 1;
            self.visits += 1;
            if !self.statically_feasible(gi, i)
                || self.distinct_violated(gi, i)
                || self.exhausted(i, ask).is_some()
            {
                continue;
            }
            let Some(pick) = self.pick(gi, i) else {
                continue;
            };
            let score = self.score(i, ask, desired, failed_on.as_deref());
            if score < 0.0 && skipped.len() < MAX_SKIP {
                skipped.push((score, i, pick));
                continue;
            }
            candidates += 1;
            if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, i, pick));
            }
        }
        // Too few good candidates: the penalized ones are still better than nothing.
        if candidates < self.limit {
            for (score, i, pick) in skipped {
                if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                    best = Some((score, i, pick));
                }
            }
        }
        match best {
            Some((_, i, pick)) => {
                self.commit(gi, i, ask, pick);
                Placed::Node(i)
            }
            None => Placed::Failed,
        }
    }

    fn commit(&mut self, gi: usize, i: usize, ask: AllocResources, pick: Pick) {
        let Pick { ports, devices } = pick;
        if !devices.is_empty() {
            let d = self.devices_delta.entry(i).or_default();
            for a in devices.values().flatten() {
                let group = format!("{}/{}/{}", a.vendor, a.device_type, a.name);
                for id in &a.device_ids {
                    d.taken.insert(devices::instance_key(&group, id));
                }
            }
        }
        self.assigned_devices = devices;
        if !ports.is_empty() {
            let d = self.ports_delta.entry(i).or_default();
            for p in &ports {
                *d.taken.entry(*p).or_default() += 1;
            }
        }
        self.assigned = ports;
        for need in &self.groups[gi].csi {
            if let Some((_, claims)) = self.csi.get_mut(need.source) {
                claims.push((self.nodes[i].id.clone(), need.write));
            }
        }
        self.delta[i].0 += ask.cpu as i64;
        self.delta[i].1 += ask.memory_mb as i64;
        self.job_on_node[i] += 1;
        let g = &mut self.groups[gi];
        if g.needs.distinct_group {
            g.on_node[i] += 1;
        }
    }

    pub(crate) fn node(&self, i: usize) -> &'a Node {
        self.nodes[i]
    }

    /// A new allocation of `group` on node `i`.
    pub(crate) fn allocation(
        &self,
        group: &TaskGroup,
        index: u32,
        i: usize,
        previous: Option<&Allocation>,
    ) -> Allocation {
        let node = self.nodes[i];
        let specs = group
            .network
            .as_ref()
            .map_or(&[][..], |n| n.ports.as_slice());
        Allocation {
            task_devices: self.assigned_devices.clone(),
            deployment_id: Default::default(),
            deployment_status: Default::default(),
            ports: ports::allocated(specs, &self.assigned, &node.network),
            reschedule_events: Vec::new(),
            id: uuid::Uuid::new_v4().to_string(),
            name: format!("{}.{}[{index}]", self.job.spec.name, group.name),
            index,
            namespace: self.job.spec.namespace.clone(),
            job_name: self.job.spec.name.clone(),
            job_version: self.job.version,
            group: group.name.clone(),
            node_id: node.id.clone(),
            node_name: node.name.clone(),
            resources: group.resources(),
            desired_status: DesiredStatus::Run,
            desired_description: String::new(),
            client_status: ClientStatus::Pending,
            client_description: String::new(),
            task_states: BTreeMap::new(),
            eval_id: self.eval_id.to_owned(),
            previous_allocation: previous.map(|p| p.id.clone()),
            next_allocation: None,
            create_index: 0,
            modify_index: 0,
            alloc_modify_index: 0,
            create_time: 0,
            modify_time: 0,
        }
    }

    /// Why `group` cannot be placed: every node is looked at (this runs once per group
    /// that failed, not per copy).
    pub(crate) fn failure(&mut self, group: &'a TaskGroup, unplaced: u32) -> PlacementFailure {
        let in_dcs = self.nodes.len();
        // Nodes outside the job's datacenters count as filtered, like any other reason.
        let n = in_dcs + self.dc_filtered as usize;
        let gi = self.group_index(group);
        let ask = self.groups[gi].ask;
        let mut filtered: BTreeMap<String, u32> = BTreeMap::new();
        let mut exhausted: BTreeMap<String, u32> = BTreeMap::new();
        // Buckets for the sentence, in the order a tie is reported.
        let mut not_ready = 0u32;
        // Per driver: the nodes it failed on, and what they said about it when all
        // of them said the same (e.g. raw_exec "disabled ... enable it with ...").
        let mut drivers: BTreeMap<&str, (u32, Option<&str>)> = BTreeMap::new();
        let mut constraints: Vec<(String, u32)> = Vec::new();
        let mut volumes: Vec<(String, u32)> = Vec::new();
        let mut distinct = 0u32;
        let dcs = format!("datacenters [{}]", self.job.spec.datacenters.join(", "));
        if self.dc_filtered > 0 {
            filtered.insert(format!("not in {dcs}"), self.dc_filtered);
        }
        for i in 0..in_dcs {
            let check = feasible::check(self.nodes[i], &self.groups[gi].needs, &mut self.compiled);
            match check {
                Err(f) => {
                    *filtered.entry(f.key()).or_default() += 1;
                    match f {
                        Filter::NotReady(_) => not_ready += 1,
                        Filter::DriverMissing(d) | Filter::DriverUnhealthy(d) => {
                            let said = self.nodes[i]
                                .driver(d)
                                .map(|info| info.health_description.as_str())
                                .filter(|s| !s.is_empty());
                            let entry = drivers.entry(d).or_insert((0, said));
                            if entry.0 > 0 && entry.1 != said {
                                entry.1 = None;
                            }
                            entry.0 += 1;
                        }
                        Filter::DeviceMissing(_) => {
                            let what = f.key();
                            match constraints.iter_mut().find(|(w, _)| *w == what) {
                                Some((_, k)) => *k += 1,
                                None => constraints.push((what, 1)),
                            }
                        }
                        Filter::Constraint(c) => {
                            let what = feasible::describe(c);
                            match constraints.iter_mut().find(|(w, _)| *w == what) {
                                Some((_, k)) => *k += 1,
                                None => constraints.push((what, 1)),
                            }
                        }
                        Filter::HostVolumeMissing(_) | Filter::HostVolumeReadOnly(_) => {
                            let what = f.key();
                            match volumes.iter_mut().find(|(w, _)| *w == what) {
                                Some((_, k)) => *k += 1,
                                None => volumes.push((what, 1)),
                            }
                        }
                    }
                }
                Ok(()) if self.distinct_violated(gi, i) => {
                    *filtered.entry("distinct_hosts".into()).or_default() += 1;
                    distinct += 1;
                }
                Ok(()) => {
                    if let Some(dim) = self.exhausted(i, ask) {
                        *exhausted.entry(dim.into()).or_default() += 1;
                    } else if let Err(p) = self.pick_ports(gi, i) {
                        *exhausted.entry(p.key()).or_default() += 1;
                    } else if let Err(d) = self.pick_devices(gi, i) {
                        *exhausted.entry(d.key()).or_default() += 1;
                    } else if let Err(why) = self.pick_csi(gi, i) {
                        *filtered.entry(why.clone()).or_default() += 1;
                        match volumes.iter_mut().find(|(w, _)| *w == why) {
                            Some((_, k)) => *k += 1,
                            None => volumes.push((why, 1)),
                        }
                    }
                }
            }
        }
        let ready = in_dcs as u32 - not_ready;
        let mut parts: Vec<(u32, String)> = Vec::new();
        if self.dc_filtered > 0 {
            let k = self.dc_filtered;
            parts.push((k, format!("{k} of {n} nodes not in {dcs}")));
        }
        for (d, (k, said)) in &drivers {
            let mut sentence = if *k == ready {
                format!("no node has driver {d} healthy")
            } else {
                format!("driver {d} missing or unhealthy on {k} of {n} nodes")
            };
            if let Some(said) = said {
                // Bounded: a driver's description is a plugin's text.
                let said: String = said.chars().take(MAX_DRIVER_SAYS).collect();
                sentence.push_str(&format!(" ({said})"));
            }
            parts.push((*k, sentence));
        }
        for (what, k) in &constraints {
            parts.push((*k, format!("{what} filtered {k} of {n} nodes")));
        }
        for (what, k) in &volumes {
            parts.push((*k, format!("{what} on {k} of {n} nodes")));
        }
        if distinct > 0 {
            parts.push((
                distinct,
                format!("distinct_hosts filtered {distinct} of {n} nodes"),
            ));
        }
        for (dim, k) in &exhausted {
            parts.push((*k, ports::exhausted_sentence(dim, *k, n)));
        }
        // Most nodes first; a stable sort keeps the order above for ties.
        parts.sort_by_key(|p| std::cmp::Reverse(p.0));
        let reason = if in_dcs == 0 && self.dc_filtered > 0 {
            format!("no node in {dcs}")
        } else if ready == 0 {
            "no node is ready".to_owned()
        } else {
            let mut sentences: Vec<String> = parts.into_iter().map(|(_, s)| s).collect();
            if not_ready > 0 {
                sentences.push(format!("{not_ready} of {n} nodes not ready"));
            }
            if sentences.is_empty() {
                // Every node looked fine when checked again: only the sample missed it
                // (cannot happen with a full scan, but say something true).
                "no feasible node was found".to_owned()
            } else {
                sentences.join("; ")
            }
        };
        PlacementFailure {
            unplaced,
            reason,
            nodes_evaluated: n as u32,
            nodes_filtered: filtered,
            nodes_exhausted: exhausted,
        }
    }

    /// A system job's group could not fit on some nodes: why, over those nodes.
    pub(crate) fn system_failure(
        &mut self,
        group: &'a TaskGroup,
        nodes: &[&Node],
    ) -> PlacementFailure {
        let gi = self.group_index(group);
        let ask = self.groups[gi].ask;
        let n = self.nodes.len();
        let mut exhausted: BTreeMap<String, u32> = BTreeMap::new();
        for node in nodes {
            let Some(i) = self.index_of(&node.id) else {
                continue;
            };
            if let Some(dim) = self.exhausted(i, ask) {
                *exhausted.entry(dim.into()).or_default() += 1;
            } else if let Err(p) = self.pick_ports(gi, i) {
                *exhausted.entry(p.key()).or_default() += 1;
            } else if let Err(d) = self.pick_devices(gi, i) {
                *exhausted.entry(d.key()).or_default() += 1;
            }
        }
        let mut parts: Vec<(u32, String)> = exhausted
            .iter()
            .map(|(dim, k)| (*k, ports::exhausted_sentence(dim, *k, n)))
            .collect();
        parts.sort_by_key(|p| std::cmp::Reverse(p.0));
        PlacementFailure {
            unplaced: nodes.len() as u32,
            reason: parts
                .into_iter()
                .map(|(_, s)| s)
                .collect::<Vec<_>>()
                .join("; "),
            nodes_evaluated: n as u32,
            nodes_filtered: BTreeMap::new(),
            nodes_exhausted: exhausted,
        }
    }
}
