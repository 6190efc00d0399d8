//! Leadership: what a server does as one of several on one store: campaign (through
//! the store's [`Election`], `store/election.rs`), lead a term, follow the leader's
//! commits between terms (`terms.rs`). A term (`term::LeaderTerm`) owns what the
//! leader runs for it: the
//! evaluation broker and its workers (`broker.rs`, `worker.rs`), the heartbeat timers
//! (`timers.rs`, `heartbeat.rs`), and two queues drained by one shared batch-commit
//! loop (`batcher.rs`): plans for the plan applier (`plan_apply.rs`) and client status
//! reports (`client_updates.rs`); besides, blocked and delayed evaluations
//! (`blocked.rs`) and garbage collection (`gc.rs`). `leadership.rs` says whether this
//! server leads, in which term, and who does otherwise.

pub(crate) mod batcher;
pub(crate) mod blocked;
pub(crate) mod broker;
pub(crate) mod client_updates;
pub(crate) mod deployments;
pub(crate) mod gc;
pub(crate) mod heartbeat;
pub(crate) mod leadership;
pub mod plan_apply;
pub(crate) mod requests;
pub(crate) mod term;
pub(crate) mod terms;
pub(crate) mod timers;
pub(crate) mod worker;

/// The election is the store's (`store/election.rs`): re-exported where leadership is.
pub use crate::store::election::{Election, NameClaim, ServerInfo, SoleLeader, Term};
