//! What can go wrong talking to the agent.

use std::path::PathBuf;

use http::StatusCode;

/// An API call that failed: the agent could not be reached, said no, or answered
/// something this client cannot read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing answers on the socket (no agent runs there, or the path is wrong). The
    /// request was not sent.
    #[error("cannot reach the agent at {}: {reason}", socket.display())]
    Connect {
        /// The agent's API socket.
        socket: PathBuf,
        /// Why, e.g. `No such file or directory (os error 2)`.
        reason: String,
    },
    /// The connection failed after the request was sent, before an answer came (the
    /// agent died or closed it): the agent may or may not have acted on it.
    #[error("the request to the agent at {} failed: {reason}", socket.display())]
    Request {
        /// The agent's API socket.
        socket: PathBuf,
        /// Why.
        reason: String,
    },
    /// The agent answered with an error status; `message` is its own words (the
    /// `error` of its [`ErrorBody`](crate::ErrorBody)), e.g. `no task with id "x"`.
    #[error("{message}")]
    Status {
        /// The HTTP status, e.g. 404 for a task that does not exist.
        status: StatusCode,
        /// What the agent said.
        message: String,
    },
    /// The agent's answer is not the JSON the API promises.
    #[error("cannot decode the agent's answer to {request}")]
    Decode {
        /// The request, e.g. `GET /v1/tasks`.
        request: String,
        /// What serde found.
        #[source]
        source: serde_json::Error,
    },
    /// The agent's answer is not what the API promises in another way: an unexpected
    /// success status, content type or log frame, or a stream cut in mid-frame.
    #[error("unexpected answer from the agent to {request}: {detail}")]
    Protocol {
        /// The request, e.g. `GET /v1/tasks/x/logs`.
        request: String,
        /// What was wrong.
        detail: String,
    },
    /// Reading the answer failed part-way (the connection broke).
    #[error("the agent's answer to {request} broke off: {reason}")]
    Body {
        /// The request.
        request: String,
        /// Why.
        reason: String,
    },
    /// A stream (logs, stats) that had begun was ended by an error the agent reported
    /// in it; the message is the agent's.
    #[error("{0}")]
    Stream(String),
    /// The request cannot be made as asked, e.g. an empty task id. Nothing was sent.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl Error {
    /// The HTTP status of an error answer of the agent ([`Error::Status`]).
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The agent answered 404: no such task (or endpoint).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }
}

/// `e` and its causes, joined with `: `, without the generic top line of a client
/// error when there is a cause (`client error (Connect)` says nothing).
pub(crate) fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        parts.push(cause.to_string());
        next = cause.source();
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.dedup();
    parts.join(": ")
}
