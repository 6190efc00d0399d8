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

#[cfg(test)]
mod tests {
    use drover_server_api::csi::*;

    use super::*;

    fn vol(mode: CsiAccessMode) -> CsiVolume {
        CsiVolume {
            id: "v".into(),
            namespace: "default".into(),
            name: "v".into(),
            external_id: "e".into(),
            plugin_id: "p".into(),
            provider: String::new(),
            capacity_min: 0,
            capacity_max: 0,
            capacity: 0,
            capabilities: vec![CsiCapability {
                access_mode: mode,
                attachment_mode: CsiAttachmentMode::FileSystem,
            }],
            mount_options: Default::default(),
            parameters: Default::default(),
            context: Default::default(),
            created: false,
            create_index: 0,
            modify_index: 0,
        }
    }

    fn node(id: &str, plugin: Option<bool>) -> Node {
        let mut n = crate::scheduler::tests::node(id, 1000, 1000);
        n.id = id.into();
        if let Some(healthy) = plugin {
            n.csi_plugins.insert(
                "p".into(),
                CsiPluginFingerprint {
                    plugin_id: "p".into(),
                    plugin_type: CsiPluginType::Node,
                    healthy,
                    health_description: String::new(),
                    provider: String::new(),
                    provider_version: String::new(),
                    node_id: id.into(),
                    max_volumes: 0,
                    topology: Default::default(),
                    node: Some(CsiNodeCapabilities::default()),
                    controller: None,
                },
            );
        }
        n
    }

    fn need(write: bool) -> CsiNeed<'static> {
        CsiNeed {
            source: "v",
            write,
            access_mode: None,
        }
    }

    #[test]
    fn claims_fit_the_access_mode_and_the_node_plugin() {
        use CsiAccessMode::*;
        let n1 = node("n1", Some(true));
        let snw = vol(SingleNodeWriter);
        assert!(
            check_claim(None, &need(true), &n1, &[])
                .unwrap_err()
                .contains("not found")
        );
        let e = check_claim(Some(&snw), &need(true), &node("n1", None), &[]).unwrap_err();
        assert!(e.contains("missing CSI node plugin \"p\""), "{e}");
        let e = check_claim(Some(&snw), &need(true), &node("n1", Some(false)), &[]).unwrap_err();
        assert!(e.contains("unhealthy"), "{e}");
        check_claim(Some(&snw), &need(true), &n1, &[]).unwrap();
        let one_writer = [("n1".to_owned(), true)];
        let e = check_claim(Some(&snw), &need(true), &n1, &one_writer).unwrap_err();
        assert!(
            e.contains("no free write claim (single-node-writer, 1 of 1 taken)"),
            "{e}"
        );
        // A reader beside the writer on its node, not on another node.
        check_claim(Some(&snw), &need(false), &n1, &one_writer).unwrap();
        let e = check_claim(
            Some(&snw),
            &need(false),
            &node("n2", Some(true)),
            &one_writer,
        )
        .unwrap_err();
        assert!(e.contains("claimed on another node"), "{e}");
        // Reader-only modes take no writer; multi-node-multi-writer any.
        let e = check_claim(Some(&vol(MultiNodeReaderOnly)), &need(true), &n1, &[]).unwrap_err();
        assert!(e.contains("read-only"), "{e}");
        let many = [("n1".to_owned(), true), ("n2".to_owned(), true)];
        check_claim(Some(&vol(MultiNodeMultiWriter)), &need(true), &n1, &many).unwrap();
        let e = check_claim(
            Some(&vol(MultiNodeSingleWriter)),
            &need(true),
            &n1,
            &many[..1],
        )
        .unwrap_err();
        assert!(e.contains("no free write claim"), "{e}");
        // An access mode the volume does not offer.
        let asked = CsiNeed {
            access_mode: Some(MultiNodeMultiWriter),
            ..need(true)
        };
        let e = check_claim(Some(&snw), &asked, &n1, &[]).unwrap_err();
        assert!(
            e.contains("does not offer access mode multi-node-multi-writer"),
            "{e}"
        );
    }
}
