//! Allocation reads.

use drover_server_api::Allocation;

use super::{by_id_or_prefix, newest_first};
use crate::server::Server;

impl Server {
    // --- allocations and evaluations ---------------------------------------------

    /// Every allocation, newest first.
    pub fn allocations(&self) -> Vec<Allocation> {
        let st = self.core.read();
        let mut v: Vec<Allocation> = st.all_allocs().cloned().collect();
        newest_first(&mut v, |a| (a.create_index, &a.id));
        v
    }

    /// One allocation, by id or unique id prefix.
    pub fn allocation(&self, id: &str) -> Option<Allocation> {
        let st = self.core.read();
        by_id_or_prefix(st.alloc(id), st.all_allocs(), |a| &a.id, id).cloned()
    }
}
