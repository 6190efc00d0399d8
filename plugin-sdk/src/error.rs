//! Errors a driver returns, and their one mapping to and from gRPC status codes.

use tonic::{Code, Status};

/// What went wrong in a driver call. Drivers return it; the SDK turns it into a gRPC
/// status on the plugin side and back into the same variant on the host side.
///
/// On the host side two variants say the driver never answered: [`DriverError::Unavailable`]
/// (its process is known to have exited) and [`DriverError::Transport`] (the call did
/// not get through, or its answer did not come back: the driver may be fine, and may
/// even have done what was asked). [`DriverError::Internal`] is always the driver's own
/// answer.
///
/// ```
/// use drover_plugin_sdk::DriverError;
/// let err = DriverError::NotFound("task t1".into());
/// let status: tonic::Status = err.clone().into();
/// assert_eq!(DriverError::from(status), err);
/// // A driver's own failure stays its own; a broken connection is not one.
/// assert!(matches!(DriverError::from(tonic::Status::internal("disk full")), DriverError::Internal(_)));
/// assert!(matches!(DriverError::from(tonic::Status::unavailable("connection refused")), DriverError::Transport(_)));
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
    /// What the call needed is gone: on the host, the plugin process has exited (the
    /// host watches it); in a driver, a helper it talks to (an executor) did not
    /// answer. Over the wire it arrives as [`DriverError::Transport`]: the host cannot
    /// tell it from a lost call.
    #[error("plugin unavailable: {0}")]
    Unavailable(String),
    /// The call or its answer was lost on the way: connection refused or broken,
    /// stream reset, cancelled (host side only: a driver never returns it). Whether the
    /// driver acted on the call is unknown; idempotent calls may be retried.
    #[error("plugin connection failed: {0}")]
    Transport(String),
    /// Anything else: the driver's own failure.
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
            DriverError::Unavailable(m) | DriverError::Transport(m) => Status::unavailable(m),
            DriverError::Internal(m) => Status::internal(m),
        }
    }
}

impl From<Status> for DriverError {
    /// The host side's reading of a failed call. A status tonic made itself from a
    /// transport, HTTP/2 or connect error carries that error as its source, whatever
    /// its code (a reset stream shows up as `INTERNAL`): that is a
    /// [`DriverError::Transport`], never the driver's [`DriverError::Internal`]. So are
    /// `UNAVAILABLE` and `CANCELLED`, which a driver never answers.
    fn from(s: Status) -> Self {
        let m = s.message().to_owned();
        if std::error::Error::source(&s).is_some() {
            return DriverError::Transport(m);
        }
        match s.code() {
            Code::InvalidArgument => DriverError::InvalidConfig(m),
            Code::NotFound => DriverError::NotFound(m),
            Code::AlreadyExists => DriverError::AlreadyExists(m),
            Code::FailedPrecondition => DriverError::FailedPrecondition(m),
            Code::Unimplemented => DriverError::Unimplemented(m),
            Code::DeadlineExceeded => DriverError::Timeout(m),
            Code::Unavailable | Code::Cancelled => DriverError::Transport(m),
            _ => DriverError::Internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant a driver returns comes back as itself on the host.
    #[test]
    fn driver_errors_survive_the_wire() {
        for e in [
            DriverError::InvalidConfig("field x".into()),
            DriverError::NotFound("task t1".into()),
            DriverError::AlreadyExists("task t1".into()),
            DriverError::FailedPrecondition("running".into()),
            DriverError::Unimplemented("ExecTask".into()),
            DriverError::Timeout("slow".into()),
            DriverError::Internal("disk full".into()),
        ] {
            let back = DriverError::from(Status::from(e.clone()));
            assert_eq!(back, e);
        }
    }

    #[test]
    fn errors_map_to_their_codes() {
        let code = |e: DriverError| Status::from(e).code();
        assert_eq!(
            code(DriverError::InvalidConfig(String::new())),
            Code::InvalidArgument
        );
        assert_eq!(code(DriverError::NotFound(String::new())), Code::NotFound);
        assert_eq!(
            code(DriverError::AlreadyExists(String::new())),
            Code::AlreadyExists
        );
        assert_eq!(
            code(DriverError::FailedPrecondition(String::new())),
            Code::FailedPrecondition
        );
        assert_eq!(
            code(DriverError::Unimplemented(String::new())),
            Code::Unimplemented
        );
        assert_eq!(
            code(DriverError::Timeout(String::new())),
            Code::DeadlineExceeded
        );
        assert_eq!(
            code(DriverError::Unavailable(String::new())),
            Code::Unavailable
        );
        assert_eq!(
            code(DriverError::Transport(String::new())),
            Code::Unavailable
        );
        assert_eq!(code(DriverError::Internal(String::new())), Code::Internal);
    }

    #[test]
    fn lost_calls_are_transport_errors() {
        for s in [
            Status::unavailable("error trying to connect: No such file or directory"),
            Status::cancelled("operation was canceled"),
        ] {
            assert_eq!(
                DriverError::from(s.clone()),
                DriverError::Transport(s.message().into())
            );
        }
        // Made by tonic from an I/O error: INTERNAL or UNKNOWN code, but with a source.
        for code in [Code::Internal, Code::Unknown] {
            let mut s = Status::new(code, "h2 protocol error: broken pipe");
            s.set_source(std::sync::Arc::new(std::io::Error::from(
                std::io::ErrorKind::BrokenPipe,
            )));
            assert_eq!(
                DriverError::from(s),
                DriverError::Transport("h2 protocol error: broken pipe".into())
            );
        }
        // The host's own "plugin exited" travels as a transport error, if ever sent.
        assert!(matches!(
            DriverError::from(Status::from(DriverError::Unavailable("gone".into()))),
            DriverError::Transport(_)
        ));
    }

    #[test]
    fn other_codes_without_a_source_are_the_drivers_own() {
        for code in [Code::Unknown, Code::DataLoss, Code::ResourceExhausted] {
            assert_eq!(
                DriverError::from(Status::new(code, "x")),
                DriverError::Internal("x".into())
            );
        }
    }
}
