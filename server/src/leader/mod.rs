//! Leadership: the election ([`Election`]) and what a server does as one of several
//! on one store: campaign, lead a term, follow the leader's commits between terms
//! (`terms.rs`). While it leads, the server runs one loop per job for its term: the
//! evaluation broker's workers (`worker.rs`), the plan applier (`plan_apply.rs`), the
//! client update batcher (`client_updates.rs`), the heartbeat timers
//! (`heartbeat.rs`), blocked and delayed evaluations (`blocked.rs`) and garbage
//! collection (`gc.rs`).

pub(crate) mod blocked;
pub(crate) mod broker;
pub(crate) mod client_updates;
pub mod election;
pub(crate) mod gc;
pub(crate) mod heartbeat;
pub mod plan_apply;
pub(crate) mod terms;
pub(crate) mod worker;

pub use election::{Election, ServerInfo, SoleLeader, Term};
