//! Allocations as Nomad's API carries them (`api/allocations.go`, `api/tasks.go`'s
//! `TaskState` and `TaskEvent`), and the placement metrics of evaluations and plans.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::PlacementFailure;

/// Why a group could not (all) be placed, in Nomad's shape (`FailedTGAllocs` of an
/// evaluation or a plan), with Drover's one-sentence reason and count.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocationMetric {
    /// Nodes considered.
    #[serde(rename = "NodesEvaluated")]
    pub nodes_evaluated: u64,
    /// Nodes filtered out.
    #[serde(rename = "NodesFiltered")]
    pub nodes_filtered: u64,
    /// Nodes available per datacenter.
    #[serde(rename = "NodesAvailable")]
    pub nodes_available: BTreeMap<String, u64>,
    /// Nodes filtered by class.
    #[serde(rename = "ClassFiltered")]
    pub class_filtered: BTreeMap<String, u64>,
    /// Nodes filtered, by the reason (constraint, missing driver).
    #[serde(rename = "ConstraintFiltered")]
    pub constraint_filtered: BTreeMap<String, u64>,
    /// Nodes feasible but full.
    #[serde(rename = "NodesExhausted")]
    pub nodes_exhausted: u64,
    /// Nodes full by class.
    #[serde(rename = "ClassExhausted")]
    pub class_exhausted: BTreeMap<String, u64>,
    /// Nodes full, by dimension (`memory`, `cpu`).
    #[serde(rename = "DimensionExhausted")]
    pub dimension_exhausted: BTreeMap<String, u64>,
    /// Quotas exhausted (Enterprise).
    #[serde(rename = "QuotaExhausted")]
    pub quota_exhausted: Option<Vec<String>>,
    /// Scores (none in Drover).
    #[serde(rename = "Scores")]
    pub scores: Option<BTreeMap<String, f64>>,
    /// Time the placement took, nanoseconds.
    #[serde(rename = "AllocationTime")]
    pub allocation_time: i64,
    /// Further copies that failed the same way (unplaced − 1).
    #[serde(rename = "CoalescedFailures")]
    pub coalesced_failures: u64,
    /// Drover: copies that could not be placed.
    #[serde(rename = "Unplaced")]
    pub unplaced: Option<u32>,
    /// Drover: why, in one sentence.
    #[serde(rename = "Reason")]
    pub reason: Option<String>,
}

impl From<&PlacementFailure> for AllocationMetric {
    fn from(f: &PlacementFailure) -> AllocationMetric {
        let widen = |m: &BTreeMap<String, u32>| -> BTreeMap<String, u64> {
            m.iter().map(|(k, v)| (k.clone(), u64::from(*v))).collect()
        };
        AllocationMetric {
            nodes_evaluated: u64::from(f.nodes_evaluated),
            nodes_filtered: f.nodes_filtered.values().map(|v| u64::from(*v)).sum(),
            constraint_filtered: widen(&f.nodes_filtered),
            nodes_exhausted: f.nodes_exhausted.values().map(|v| u64::from(*v)).sum(),
            dimension_exhausted: widen(&f.nodes_exhausted),
            coalesced_failures: u64::from(f.unplaced.saturating_sub(1)),
            unplaced: Some(f.unplaced),
            reason: Some(f.reason.clone()),
            ..Default::default()
        }
    }
}

impl From<&AllocationMetric> for PlacementFailure {
    fn from(m: &AllocationMetric) -> PlacementFailure {
        let narrow = |m: &BTreeMap<String, u64>| -> BTreeMap<String, u32> {
            m.iter()
                .map(|(k, v)| (k.clone(), u32::try_from(*v).unwrap_or(u32::MAX)))
                .collect()
        };
        let unplaced = m.unplaced.unwrap_or_else(|| {
            u32::try_from(m.coalesced_failures.saturating_add(1)).unwrap_or(u32::MAX)
        });
        let reason = match &m.reason {
            Some(r) => r.clone(),
            // A Nomad server gives no sentence: make one from its counts.
            None => nomad_reason(m),
        };
        PlacementFailure {
            unplaced,
            reason,
            nodes_evaluated: u32::try_from(m.nodes_evaluated).unwrap_or(u32::MAX),
            nodes_filtered: narrow(&m.constraint_filtered),
            nodes_exhausted: narrow(&m.dimension_exhausted),
        }
    }
}

fn nomad_reason(m: &AllocationMetric) -> String {
    if m.nodes_evaluated == 0 {
        return "no node is eligible".to_owned();
    }
    let mut parts = Vec::new();
    for (why, n) in &m.constraint_filtered {
        parts.push(format!("{why} filtered {n} nodes"));
    }
    for (dim, n) in &m.dimension_exhausted {
        parts.push(format!("{dim} exhausted on {n} nodes"));
    }
    if parts.is_empty() {
        format!("{} nodes evaluated, none feasible", m.nodes_evaluated)
    } else {
        parts.join("; ")
    }
}
