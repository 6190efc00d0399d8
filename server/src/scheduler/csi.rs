//! CSI volumes in placement: a group's `volume { type = "csi" }` requests are placed
//! only on nodes whose node plugin of the volume's plugin is healthy, and only while
//! the volume's access mode allows one more claim of the kind asked (a writer, or a
//! reader; single-node modes: on the node of the other claims). The scheduler and the
//! plan applier run the same check ([`check_claim`]).

use drover_server_api::csi::{CsiAccessMode, CsiClaim, CsiVolume};
use drover_server_api::{Node, TaskGroup};

/// A CSI volume a group asks for: its id, whether some request of it writes, and the
/// access mode asked (none: the volume's first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CsiNeed<'a> {
    /// The volume's id (the request's `source`).
    pub source: &'a str,
    /// Some request of it is not read-only.
    pub write: bool,
    /// The access mode asked (`access_mode`), if any.
    pub access_mode: Option<CsiAccessMode>,
}

/// The CSI volumes `group` asks for, each source once.
pub(crate) fn csi_needs(group: &TaskGroup) -> Vec<CsiNeed<'_>> {
    let mut out: Vec<CsiNeed<'_>> = Vec::new();
    for v in group.volumes.values().filter(|v| v.volume_type == "csi") {
        let mode = CsiAccessMode::parse(&v.access_mode);
        match out.iter_mut().find(|n| n.source == v.source) {
            Some(n) => {
                n.write |= !v.read_only;
                n.access_mode = n.access_mode.or(mode);
            }
            None => out.push(CsiNeed {
                source: &v.source,
                write: !v.read_only,
                access_mode: mode,
            }),
        }
    }
    out
}

/// The access mode claims of `vol` are made in: the one asked, else the volume's first.
pub(crate) fn claim_mode(vol: &CsiVolume, need: &CsiNeed<'_>) -> Option<CsiAccessMode> {
    need.access_mode
        .or_else(|| vol.capabilities.first().map(|c| c.access_mode))
}

/// Whether one more claim `need` of volume `vol` may be made on `node`, given the
/// claims it has (`claims`: (node id, write) of each live claim, this plan's too).
/// The error names the volume and says why, as a placement failure reads.
pub(crate) fn check_claim(
    vol: Option<&CsiVolume>,
    need: &CsiNeed<'_>,
    node: &Node,
    claims: &[(String, bool)],
) -> Result<(), String> {
    let id = need.source;
    let Some(vol) = vol else {
        return Err(format!("CSI volume {id:?} not found"));
    };
    match node.csi_plugins.get(&vol.plugin_id) {
        Some(f) if f.plugin_type.is_node() && f.healthy => {}
        Some(f) if f.plugin_type.is_node() => {
            return Err(format!(
                "CSI plugin {:?} of volume {id:?} unhealthy",
                vol.plugin_id
            ));
        }
        _ => {
            return Err(format!(
                "missing CSI node plugin {:?} of volume {id:?}",
                vol.plugin_id
            ));
        }
    }
    let Some(mode) = claim_mode(vol, need) else {
        return Err(format!("CSI volume {id:?} has no capability"));
    };
    if need.access_mode.is_some() && !vol.capabilities.iter().any(|c| c.access_mode == mode) {
        return Err(format!(
            "CSI volume {id:?} does not offer access mode {mode}"
        ));
    }
    if need.write && !mode.allows_write() {
        return Err(format!(
            "CSI volume {id:?} is read-only ({mode}) and the group's request is not"
        ));
    }
    let writers = claims.iter().filter(|(_, w)| *w).count();
    if need.write
        && let Some(max) = mode.max_writers()
        && writers >= max
    {
        return Err(format!(
            "CSI volume {id:?} has no free write claim ({mode}, {writers} of {max} taken)"
        ));
    }
    if mode.single_node() && claims.iter().any(|(n, _)| *n != node.id) {
        return Err(format!(
            "CSI volume {id:?} is claimed on another node ({mode})"
        ));
    }
    Ok(())
}

/// (node id, write) of each claim.
pub(crate) fn claim_pairs(claims: &[CsiClaim]) -> Vec<(String, bool)> {
    claims
        .iter()
        .map(|c| (c.node_id.clone(), c.write))
        .collect()
}
