//! Ranking of feasible nodes, and the random order nodes are visited in.

use drover_server_api::{JobType, NodeResources};

use crate::config::SchedulerAlgorithm;

/// How many scored candidates a placement looks at before it picks the best (Nomad's
/// limit iterator): a bounded sample keeps placing O(limit + skipped) per allocation
/// instead of O(nodes). Batch jobs care less about the best fit than about throughput;
/// system jobs are placed on given nodes and do not sample.
pub(crate) fn sample_limit(job_type: JobType, nodes: usize) -> usize {
    match job_type {
        JobType::Batch => 2,
        JobType::Service | JobType::System => {
            let log2 = if nodes <= 1 {
                0
            } else {
                // ceil(log2 n) without floats.
                (usize::BITS - (nodes - 1).leading_zeros()) as usize
            };
            log2.max(2)
        }
    }
}

/// Candidates with a negative final score (anti-affinity, a failed allocation's node)
/// are set aside, at most this many per placement, and only used when too few other
/// candidates were found (Nomad's `maxSkip`).
pub(crate) const MAX_SKIP: usize = 3;

/// How well an allocation fits a node once placed, in 0..=1 (higher wins).
///
/// Bin-packing is Nomad's fit score: `20 - (10^freeCpu + 10^freeMem)` over the free
/// fractions left after placing, which is 18 for a node filled to the brim and 0 for
/// an empty one, normalized by 18. Spread is its mirror: the emptiest node wins.
pub(crate) fn fit_score(
    algorithm: SchedulerAlgorithm,
    total: NodeResources,
    used_cpu: u64,
    used_mem: u64,
) -> f64 {
    let free = |used: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            (1.0 - used as f64 / total as f64).clamp(0.0, 1.0)
        }
    };
    let sum = 10f64.powf(free(used_cpu, total.cpu)) + 10f64.powf(free(used_mem, total.memory_mb));
    let score = match algorithm {
        SchedulerAlgorithm::BinPack => 20.0 - sum,
        SchedulerAlgorithm::Spread => sum - 2.0,
    };
    (score / 18.0).clamp(0.0, 1.0)
}

/// The final score of a candidate: the fit, averaged with an anti-affinity penalty when
/// allocations of the same job already run there (`-(collisions + 1) / count`, as
/// Nomad's job anti-affinity) and with -1 when the node is where the allocation being
/// replaced failed (Nomad's rescheduling penalty).
pub(crate) fn final_score(fit: f64, collisions: u32, desired: u32, failed_here: bool) -> f64 {
    let mut sum = fit;
    let mut scores = 1.0;
    if collisions > 0 {
        let penalty = f64::from(collisions + 1) / f64::from(desired.max(1));
        sum -= penalty.min(1.0);
        scores += 1.0;
    }
    if failed_here {
        sum -= 1.0;
        scores += 1.0;
    }
    sum / scores
}

/// SplitMix64: a tiny, well-known PRNG (Steele et al., used to seed xoroshiro). Only the
/// order nodes are visited in depends on it, so a statistical generator with a seed a
/// test can fix is all that is needed; no crate for ten lines.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by Lemire's multiply-shift (the bias for n far below
    /// 2^64 does not matter for a visiting order).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// The seed of an evaluation: FNV-1a of its id, so the same evaluation on the same state
/// makes the same plan (and a test can choose it).
pub(crate) fn seed_for(eval_id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in eval_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `0..n` in a random order, without materializing it: `start + k * stride (mod n)`
/// with a random start and a random stride coprime with `n` visits every node exactly
/// once per `n` steps. Setting it up is O(1), where a shuffle would cost O(nodes) per
/// evaluation; an arithmetic walk is less random than a shuffle, but all it has to do
/// is start each evaluation's sample somewhere else and not favour any node.
#[derive(Debug, Clone)]
pub(crate) struct Walk {
    n: u64,
    next: u64,
    stride: u64,
}

impl Walk {
    pub(crate) fn new(n: usize, rng: &mut SplitMix64) -> Self {
        let n = n as u64;
        if n <= 1 {
            return Walk {
                n,
                next: 0,
                stride: 0,
            };
        }
        let start = rng.below(n as usize) as u64;
        let stride = loop {
            let s = 1 + rng.below(n as usize - 1) as u64;
            if gcd(s, n) == 1 {
                break s;
            }
        };
        Walk {
            n,
            next: start,
            stride,
        }
    }

    /// The next position (`n` must be > 0).
    pub(crate) fn next_index(&mut self) -> usize {
        let i = self.next;
        self.next = (self.next + self.stride) % self.n.max(1);
        i as usize
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(sample_limit(JobType::Batch, 5000), 2);
        assert_eq!(sample_limit(JobType::Service, 1), 2);
        assert_eq!(sample_limit(JobType::Service, 4), 2);
        assert_eq!(sample_limit(JobType::Service, 5), 3);
        assert_eq!(sample_limit(JobType::Service, 1024), 10);
        assert_eq!(sample_limit(JobType::Service, 5000), 13);
    }

    #[test]
    fn binpack_prefers_fuller_nodes_and_spread_emptier_ones() {
        let total = NodeResources {
            cpu: 1000,
            memory_mb: 1000,
        };
        let full = fit_score(SchedulerAlgorithm::BinPack, total, 1000, 1000);
        let half = fit_score(SchedulerAlgorithm::BinPack, total, 500, 500);
        let empty = fit_score(SchedulerAlgorithm::BinPack, total, 0, 0);
        assert!(
            (full - 1.0).abs() < 1e-9 && empty.abs() < 1e-9,
            "{full} {empty}"
        );
        assert!(full > half && half > empty);
        let s_half = fit_score(SchedulerAlgorithm::Spread, total, 500, 500);
        let s_low = fit_score(SchedulerAlgorithm::Spread, total, 100, 100);
        assert!(s_low > s_half);
    }

    #[test]
    fn penalties_lower_the_score() {
        assert_eq!(final_score(0.5, 0, 3, false), 0.5);
        assert!(final_score(0.5, 1, 3, false) < 0.5);
        assert!(final_score(0.5, 2, 3, false) < final_score(0.5, 1, 3, false));
        assert!(final_score(0.9, 0, 3, true) < 0.0);
    }

    fn walk(n: usize, eval: &str) -> Vec<usize> {
        let mut w = Walk::new(n, &mut SplitMix64::new(seed_for(eval)));
        (0..n).map(|_| w.next_index()).collect()
    }

    #[test]
    fn the_order_visits_every_node_once_and_is_fixed_by_the_seed() {
        for n in [1, 2, 3, 64, 100, 5000] {
            let a = walk(n, "eval-1");
            let mut sorted = a.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<usize>>(), "n = {n}");
            assert_eq!(a, walk(n, "eval-1"));
        }
        assert_ne!(walk(100, "eval-1"), walk(100, "eval-2"));
        // Different evaluations start in different places.
        let starts: std::collections::BTreeSet<usize> =
            (0..20).map(|i| walk(5000, &format!("e{i}"))[0]).collect();
        assert!(starts.len() > 15, "{starts:?}");
    }
}
