//! # drover-server
//!
//! The Drover server: it keeps jobs, nodes, evaluations and allocations in a state store
//! and places the task groups of jobs on the client agents (nodes) that can run them.
//! The shape is Nomad's, rebuilt smaller (see `docs/cluster.md`):
//!
//! - every change that needs scheduling (a job registered or stopped, a node down or
//!   draining, an allocation failed) makes an **evaluation**;
//! - the **evaluation broker** hands evaluations to **workers**, at most one in flight
//!   per job, at least once (ack/nack, redelivery);
//! - a worker runs the **scheduler** on the current state: reconcile what the job wants
//!   against the allocations it has, then place what is missing on feasible nodes,
//!   ranked (bin-packing by default). The result is a **plan**;
//! - the **plan applier** re-checks every plan against the newest state and commits
//!   what still fits in one atomic store transaction (optimistic concurrency: workers
//!   never lock each other); what no longer fits is planned again;
//! - what cannot be placed stays in a **blocked** evaluation with a reason, retried
//!   when capacity appears;
//! - nodes register and heartbeat over gRPC; a node that misses its TTL plus grace is
//!   `down` and its allocations `lost` and replaced.
//!
//! The [`store::Store`] trait is a key-value store with revisions and compare-and-set
//! (what etcd offers), implemented by an embedded redb store for a single server and
//! by an etcd store for several. With several servers ([`Server::start_with`]) one is
//! elected leader ([`leader::Election`]) and runs the broker, workers, plan applier and
//! heartbeat timers, every commit fenced by its term; the others follow its commits
//! (serving every read from them) and forward writes to it ([`forward`]).

pub mod config;
mod core;
mod endpoints;
pub mod error;
pub mod events;
pub mod keyring;
pub mod leader;
mod metrics;
pub mod scheduler;
pub mod server;
mod state;
pub mod store;
mod transport;
pub mod variables;

pub use config::ServerConfig;
pub use endpoints::acl::{Identity, TokenRefusal};
pub use error::ServerError;
pub use leader::plan_apply::PlanResult;
pub use leader::{Election, NameClaim, ServerInfo, SoleLeader};
pub use server::{NodeAllocations, Server, ServerStats};
pub use store::{EtcdOptions, EtcdStore, RedbStore};
pub use transport::{forward, http, rpc, tls};
