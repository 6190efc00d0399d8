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
}
