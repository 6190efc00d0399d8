//! CSI volumes in the state: stored under `csivol/<namespace>/<id>`; their claims are
//! derived from the allocations (a live allocation whose group asks for the volume
//! holds a claim; its claim ends when the client reports it terminal or its node is
//! lost), so no claim can outlive its allocation.

use drover_server_api::csi::{CsiClaim, CsiVolume};
use drover_server_api::{Allocation, TaskGroup};

use super::State;

/// Key of a CSI volume.
pub(crate) fn csi_volume_key(ns: &str, id: &str) -> String {
    format!("csivol/{ns}/{id}")
}

/// Whether allocation `a` still holds its volumes: its client has not reported it
/// terminal (a stop the client has not carried out yet still holds the mount).
pub(crate) fn holds_volumes(a: &Allocation) -> bool {
    !a.client_status.is_terminal()
}

/// The group's CSI volume requests of volume `id`: `Some(write)` when it asks for it,
/// `write` when some request of it is not read-only.
pub(crate) fn group_claims(group: &TaskGroup, id: &str) -> Option<bool> {
    let mut out = None;
    for v in group.volumes.values() {
        if v.volume_type == "csi" && v.source == id {
            out = Some(out.unwrap_or(false) | !v.read_only);
        }
    }
    out
}

impl State {
    /// The job (version) whose group says what allocation `a` claims: its own version,
    /// else (that version pruned from the kept history) the job's current one, so a
    /// live allocation's claim does not vanish with an old version.
    fn claiming_job(&self, a: &Allocation) -> Option<&super::Job> {
        self.job_at_version(&a.namespace, &a.job_name, a.job_version)
            .or_else(|| self.job_of(a))
    }

    /// The volume of any namespace that names the plugin's volume `external_id` of
    /// plugin `plugin_id`, other than (`ns`, `id`) itself.
    pub(crate) fn csi_volume_with_external_id(
        &self,
        plugin_id: &str,
        external_id: &str,
        ns: &str,
        id: &str,
    ) -> Option<&CsiVolume> {
        self.csi_volumes.values().find(|v| {
            v.plugin_id == plugin_id
                && v.external_id == external_id
                && !(v.namespace == ns && v.id == id)
        })
    }

    /// One CSI volume.
    pub(crate) fn csi_volume(&self, ns: &str, id: &str) -> Option<&CsiVolume> {
        self.csi_volumes.get(&(ns.to_owned(), id.to_owned()))
    }

    /// The CSI volumes of namespace `ns` (every namespace for `*`), in (namespace, id)
    /// order.
    pub(crate) fn csi_volumes<'a>(&'a self, ns: &'a str) -> impl Iterator<Item = &'a CsiVolume> {
        self.csi_volumes
            .values()
            .filter(move |v| ns == "*" || v.namespace == ns)
    }

    /// How many CSI volumes the state holds.
    pub(crate) fn csi_volume_count(&self) -> usize {
        self.csi_volumes.len()
    }

    /// The claims of every CSI volume, by (namespace, volume id), in one pass over
    /// the allocations (a list of volumes would otherwise scan them once per volume).
    pub(crate) fn all_csi_claims(
        &self,
    ) -> std::collections::HashMap<(String, String), Vec<CsiClaim>> {
        let mut out: std::collections::HashMap<(String, String), Vec<CsiClaim>> =
            std::collections::HashMap::new();
        if self.csi_volumes.is_empty() {
            return out;
        }
        for a in self.allocs.values().filter(|a| holds_volumes(a)) {
            let Some(job) = self.claiming_job(a) else {
                continue;
            };
            let Some(group) = job.spec.groups.iter().find(|g| g.name == a.group) else {
                continue;
            };
            let mut seen: Vec<&str> = Vec::new();
            for v in group.volumes.values().filter(|v| v.volume_type == "csi") {
                if seen.contains(&v.source.as_str()) {
                    continue;
                }
                seen.push(&v.source);
                let Some(write) = group_claims(group, &v.source) else {
                    continue;
                };
                out.entry((a.namespace.clone(), v.source.clone()))
                    .or_default()
                    .push(CsiClaim {
                        alloc_id: a.id.clone(),
                        node_id: a.node_id.clone(),
                        job: a.job_name.clone(),
                        write,
                    });
            }
        }
        for claims in out.values_mut() {
            claims.sort_by(|a, b| a.alloc_id.cmp(&b.alloc_id));
        }
        out
    }

    /// The claims of volume `id` in `ns`: the live allocations whose group asks for it.
    pub(crate) fn csi_claims(&self, ns: &str, id: &str) -> Vec<CsiClaim> {
        let mut out: Vec<CsiClaim> = self
            .allocs
            .values()
            .filter(|a| a.namespace == ns && holds_volumes(a))
            .filter_map(|a| {
                let job = self.claiming_job(a)?;
                let group = job.spec.groups.iter().find(|g| g.name == a.group)?;
                let write = group_claims(group, id)?;
                Some(CsiClaim {
                    alloc_id: a.id.clone(),
                    node_id: a.node_id.clone(),
                    job: a.job_name.clone(),
                    write,
                })
            })
            .collect();
        out.sort_by(|a, b| a.alloc_id.cmp(&b.alloc_id));
        out
    }

    /// The CSI volumes `group` asks for, by id (missing ones left out).
    pub(crate) fn csi_volumes_of(
        &self,
        ns: &str,
        group: &TaskGroup,
    ) -> std::collections::BTreeMap<String, CsiVolume> {
        group
            .volumes
            .values()
            .filter(|v| v.volume_type == "csi")
            .filter_map(|v| {
                self.csi_volume(ns, &v.source)
                    .map(|vol| (v.source.clone(), vol.clone()))
            })
            .collect()
    }

    pub(crate) fn put_csi_volume(&mut self, v: CsiVolume) {
        self.csi_volumes
            .insert((v.namespace.clone(), v.id.clone()), v);
    }

    pub(crate) fn remove_csi_volume(&mut self, ns: &str, id: &str) {
        self.csi_volumes.remove(&(ns.to_owned(), id.to_owned()));
    }
}
