//! Errors a driver returns, and their one mapping to and from gRPC status codes.

use tonic::{Code, Status};

/// What went wrong in a driver call. Drivers return it; the SDK turns it into a gRPC
/// status on the plugin side and back into the same variant on the host side.
///
/// ```
/// use drover_plugin_sdk::DriverError;
/// let err = DriverError::NotFound("task t1".into());
/// let status: tonic::Status = err.clone().into();
/// assert_eq!(DriverError::from(status), err);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The task or plugin config is invalid; the message names the field.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// No such task.
    #[error("not found: {0}")]
    NotFound(String),
    /// A task with this id exists already.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The task is in the wrong state for this call (e.g. destroying a running task).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The driver does not implement this optional call.
    #[error("not supported by this driver: {0}")]
    Unimplemented(String),
    /// The call did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The plugin is gone or unreachable (host side only).
    #[error("plugin unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl DriverError {
    /// Shorthand for [`DriverError::Internal`] from anything printable.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        DriverError::Internal(e.to_string())
    }
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::InvalidConfig(m) => Status::invalid_argument(m),
            DriverError::NotFound(m) => Status::not_found(m),
            DriverError::AlreadyExists(m) => Status::already_exists(m),
            DriverError::FailedPrecondition(m) => Status::failed_precondition(m),
            DriverError::Unimplemented(m) => Status::unimplemented(m),
            DriverError::Timeout(m) => Status::deadline_exceeded(m),
            DriverError::Unavailable(m) => Status::unavailable(m),
            DriverError::Internal(m) => Status::internal(m),
        }
    }
}

impl From<Status> for DriverError {
    fn from(s: Status) -> Self {
        let m = s.message().to_owned();
        match s.code() {
            Code::InvalidArgument => DriverError::InvalidConfig(m),
            Code::NotFound => DriverError::NotFound(m),
            Code::AlreadyExists => DriverError::AlreadyExists(m),
            Code::FailedPrecondition => DriverError::FailedPrecondition(m),
            Code::Unimplemented => DriverError::Unimplemented(m),
            Code::DeadlineExceeded => DriverError::Timeout(m),
            Code::Unavailable => DriverError::Unavailable(m),
            _ => DriverError::Internal(m),
        }
    }
}
