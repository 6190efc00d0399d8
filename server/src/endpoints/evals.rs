//! Evaluation reads.

use drover_server_api::Evaluation;

use super::{by_id_or_prefix, newest_first};
use crate::server::Server;

impl Server {
    /// Every evaluation, newest first.
    pub fn evaluations(&self) -> Vec<Evaluation> {
        let st = self.core.read();
        let mut v: Vec<Evaluation> = st.all_evals().cloned().collect();
        newest_first(&mut v, |e| (e.create_index, &e.id));
        v
    }

    /// One evaluation, by id or unique id prefix.
    pub fn evaluation(&self, id: &str) -> Option<Evaluation> {
        let st = self.core.read();
        by_id_or_prefix(st.eval(id), st.all_evals(), |e| &e.id, id).cloned()
    }
}
