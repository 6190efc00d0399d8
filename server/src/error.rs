//! Errors of the server's operations, mapped to HTTP statuses and gRPC codes by the
//! API layers.

use crate::store::StoreError;

/// Why a server operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The request is malformed or invalid (HTTP 400, gRPC INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The object does not exist (HTTP 404, gRPC NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// A check-and-set or uniqueness rule failed (HTTP 409, gRPC ABORTED).
    #[error("{0}")]
    Conflict(String),
    /// The caller may not act as what it claims to be: a node RPC without its node's
    /// secret (HTTP 403, gRPC PERMISSION_DENIED).
    #[error("{0}")]
    Denied(String),
    /// The state store failed; nothing was committed (HTTP 500, gRPC UNAVAILABLE).
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    /// The server is shutting down or not serving (HTTP 503, gRPC UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// This server does not lead: writes go to the leader (HTTP 503, gRPC UNAVAILABLE;
    /// the API layers forward writes before they get here, so a caller sees this only
    /// when leadership moved in between: retry).
    #[error("{NOT_LEADER_PREFIX}{}", match leader {
        Some(l) => format!("the leader is {l}; retry"),
        None => NO_KNOWN_LEADER.to_owned() + "; retry",
    })]
    NotLeader {
        /// The leader as this server knows it (`name (rpc address)`), if any.
        leader: Option<String>,
    },
    /// This server led, but the store refused its commit because its term is over
    /// (its lease expired or was revoked, another server leads now). Nothing was
    /// committed; the server stepped down (HTTP 503, gRPC UNAVAILABLE).
    #[error("{LEADERSHIP_LOST_PREFIX}{0}")]
    LeadershipLost(String),
}

/// How a [`ServerError::NotLeader`] message starts (people and gRPC callers read it;
/// the HTTP layer marks such answers by the variant, [`ServerError::is_not_leader`],
/// so that a forwarding server knows to look for the leader again).
pub const NOT_LEADER_PREFIX: &str = "this server is not the leader: ";
/// What a [`ServerError::NotLeader`] says when this server knows no leader: an election
/// may be under way, or it stepped down while it handled the request (another server
/// may lead already; a retry reaches it).
pub const NO_KNOWN_LEADER: &str = "it does not know the leader at the moment (an election may be under way, or it just stepped down)";
/// How a [`ServerError::LeadershipLost`] message starts.
pub const LEADERSHIP_LOST_PREFIX: &str = "leadership lost, nothing was committed: ";

impl ServerError {
    /// Leadership is elsewhere (or being elected): the request belongs to the leader.
    pub fn is_not_leader(&self) -> bool {
        matches!(
            self,
            ServerError::NotLeader { .. } | ServerError::LeadershipLost(_)
        )
    }
}
