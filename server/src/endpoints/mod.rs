//! What the HTTP API and the node RPCs call: the [`crate::Server`] operations on
//! jobs, nodes (registration, authentication, heartbeats, drain), allocations,
//! evaluations and the cluster's status. Reads are served from the state in memory;
//! writes are one commit each (the client status reports go through the leader's
//! batcher).

pub(crate) mod acl;
pub(crate) mod allocs;
pub(crate) mod csi;
pub(crate) mod deployments;
pub(crate) mod evals;
pub(crate) mod jobs;
pub(crate) mod namespaces;
pub(crate) mod nodes;
pub(crate) mod services;
pub(crate) mod status;

use drover_server_api::Index;

/// Which namespaces a list answers for: a test of a namespace's name (one namespace;
/// with `*`, every one the caller may read).
pub type NsFilter<'a> = &'a (dyn Fn(&str) -> bool + Sync);

fn newest_first<T>(v: &mut [T], key: impl Fn(&T) -> (Index, &str)) {
    v.sort_by(|a, b| {
        let (ia, ida) = key(a);
        let (ib, idb) = key(b);
        ib.cmp(&ia).then_with(|| ida.cmp(idb))
    });
}

/// The one item whose id is `id` or starts with `id` (a unique prefix).
fn by_id_or_prefix<'a, T>(
    exact: Option<&'a T>,
    all: impl Iterator<Item = &'a T>,
    id_of: impl Fn(&T) -> &str,
    id: &str,
) -> Option<&'a T> {
    if exact.is_some() {
        return exact;
    }
    if id.is_empty() {
        return None;
    }
    let mut found = None;
    for x in all {
        if id_of(x).starts_with(id) {
            if found.is_some() {
                return None;
            }
            found = Some(x);
        }
    }
    found
}
