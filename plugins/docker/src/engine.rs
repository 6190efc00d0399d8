//! The connection to the Docker daemon: made lazily (bollard refuses to build a client
//! for a unix socket that does not exist yet, and the daemon may start after the
//! plugin), version-negotiated once, and shared by every call. Plus the one mapping of
//! bollard errors to driver errors.

use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use drover_plugin_sdk::DriverError;

/// Default daemon address when neither the plugin config nor `DOCKER_HOST` gives one.
pub const DEFAULT_ENDPOINT: &str = "unix:///var/run/docker.sock";

/// Per-request limit for everything but pulls and loads (which have `pull_timeout`):
/// the time until the daemon answers with headers; streams then run unbounded.
const REQUEST_TIMEOUT_SECS: u64 = 60;
/// How long connecting and negotiating the API version may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket path.
    Unix(String),
    /// `tcp://host:port` or `http://host:port` (no TLS).
    Tcp(String),
}

impl Endpoint {
    /// Parse `unix:///path`, `/path` or `tcp://host:port`.
    ///
    /// ```
    /// use drover_driver_docker::Endpoint;
    /// assert_eq!(Endpoint::parse("unix:///run/docker.sock").unwrap(), Endpoint::Unix("/run/docker.sock".into()));
    /// assert_eq!(Endpoint::parse("/run/docker.sock").unwrap(), Endpoint::Unix("/run/docker.sock".into()));
    /// assert!(matches!(Endpoint::parse("tcp://127.0.0.1:2375").unwrap(), Endpoint::Tcp(_)));
    /// assert!(Endpoint::parse("ssh://host").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Endpoint, DriverError> {
        let t = text.trim();
        if let Some(path) = t.strip_prefix("unix://") {
            if path.starts_with('/') {
                return Ok(Endpoint::Unix(path.to_owned()));
            }
        } else if t.starts_with('/') {
            return Ok(Endpoint::Unix(t.to_owned()));
        } else if t.starts_with("tcp://") || t.starts_with("http://") {
            return Ok(Endpoint::Tcp(t.to_owned()));
        }
        Err(DriverError::InvalidConfig(format!(
            "endpoint {text:?} is not unix:///path/to/docker.sock, an absolute socket path, or \
             tcp://host:port"
        )))
    }

    /// The configured endpoint, else `DOCKER_HOST`, else [`DEFAULT_ENDPOINT`].
    pub fn resolve(configured: Option<&str>) -> Result<Endpoint, DriverError> {
        match configured {
            Some(e) => Endpoint::parse(e),
            None => match std::env::var("DOCKER_HOST") {
                Ok(h) if !h.trim().is_empty() => Endpoint::parse(&h)
                    .map_err(|e| DriverError::InvalidConfig(format!("DOCKER_HOST: {e}"))),
                _ => Endpoint::parse(DEFAULT_ENDPOINT),
            },
        }
    }

    /// Whether the daemon is simply not there: a unix socket that does not exist.
    pub(crate) fn absent(&self) -> bool {
        match self {
            Endpoint::Unix(p) => !std::path::Path::new(p).exists(),
            Endpoint::Tcp(_) => false,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix://{p}"),
            Endpoint::Tcp(a) => f.write_str(a),
        }
    }
}

/// The shared, lazily made client.
pub(crate) struct Engine {
    endpoint: Endpoint,
    docker: tokio::sync::Mutex<Option<Docker>>,
}

impl Engine {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Engine {
            endpoint,
            docker: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The client, connecting first if need be. Every request opens its own connection
    /// to the endpoint (bollard keeps no idle ones), so a client made once keeps
    /// working across daemon restarts.
    pub(crate) async fn client(&self) -> Result<Docker, DriverError> {
        let mut slot = self.docker.lock().await;
        if let Some(d) = slot.as_ref() {
            return Ok(d.clone());
        }
        let docker = self.connect().await?;
        *slot = Some(docker.clone());
        Ok(docker)
    }

    async fn connect(&self) -> Result<Docker, DriverError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            DriverError::Internal(format!(
                "docker daemon at {} is unreachable: {e}",
                self.endpoint
            ))
        };
        let docker = match &self.endpoint {
            Endpoint::Unix(path) => {
                Docker::connect_with_unix(path, REQUEST_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
            }
            Endpoint::Tcp(addr) => {
                Docker::connect_with_http(addr, REQUEST_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
            }
        }
        .map_err(|e| unreachable(&e))?;
        // Speak the daemon's API level (Debian's 20.10 daemon is 1.41; bollard's
        // default is newer).
        match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(unreachable(&e)),
            Err(_) => Err(unreachable(&format!(
                "no answer within {CONNECT_TIMEOUT:?}"
            ))),
        }
    }
}

/// The HTTP status of a daemon error response.
pub(crate) fn status_of(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether the error says the daemon could not be reached (rather than that it
/// answered no): such calls are worth retrying later.
pub(crate) fn is_transport(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::SocketNotFoundError(_)
            | DockerError::HyperLegacyError { .. }
            | DockerError::HyperResponseError { .. }
            | DockerError::IOError { .. }
            | DockerError::RequestTimeoutError
    )
}

/// A daemon answer as a driver error, naming what was being done.
pub(crate) fn docker_err(op: impl std::fmt::Display, e: DockerError) -> DriverError {
    let msg = match &e {
        DockerError::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    };
    let text = format!("{op}: {msg}");
    match status_of(&e) {
        Some(404) => DriverError::NotFound(text),
        Some(409) => DriverError::FailedPrecondition(text),
        Some(400) => DriverError::InvalidConfig(text),
        _ if matches!(e, DockerError::RequestTimeoutError) => DriverError::Timeout(text),
        _ => DriverError::Internal(text),
    }
}
