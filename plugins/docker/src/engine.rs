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
        DaemonAddress::resolve(configured, |name| std::env::var(name).ok()).map(|a| a.endpoint)
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

/// Where the daemon's address came from, for reasons that tell a user what was tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressSource {
    /// The plugin config's `endpoint`.
    Config,
    /// `DOCKER_HOST` in the plugin's environment.
    DockerHost,
    /// Neither: [`DEFAULT_ENDPOINT`].
    Default,
}

/// The daemon to talk to and how: its address, where that came from, and the API
/// version `DOCKER_API_VERSION` fixes (`None`: negotiated with the daemon). The driver
/// follows the docker client's own variables (`DOCKER_HOST`, `DOCKER_TLS_VERIFY`,
/// `DOCKER_CERT_PATH`, `DOCKER_API_VERSION`) as the `docker` CLI and Nomad's docker
/// driver do; the agent passes them to the docker plugin by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonAddress {
    /// The address.
    pub endpoint: Endpoint,
    /// Where it came from.
    pub source: AddressSource,
    /// `DOCKER_API_VERSION`, `(major, minor)`.
    pub api_version: Option<(usize, usize)>,
}

impl DaemonAddress {
    /// The configured endpoint, else `DOCKER_HOST`, else [`DEFAULT_ENDPOINT`], with
    /// the docker client's other variables read through `env`. A `tcp://` daemon that
    /// `DOCKER_TLS_VERIFY` or `DOCKER_CERT_PATH` says speaks TLS is refused with the
    /// reason: this driver talks plain HTTP only, and sending the daemon's API in
    /// clear to an address that was meant to be protected would be worse.
    ///
    /// ```
    /// use drover_driver_docker::{AddressSource, DaemonAddress, Endpoint};
    /// let env = |vars: &'static [(&'static str, &'static str)]| {
    ///     move |n: &str| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
    /// };
    /// let a = DaemonAddress::resolve(None, env(&[("DOCKER_HOST", "unix:///run/d.sock")])).unwrap();
    /// assert_eq!((a.endpoint, a.source), (Endpoint::Unix("/run/d.sock".into()), AddressSource::DockerHost));
    /// let a = DaemonAddress::resolve(Some("/x.sock"), env(&[("DOCKER_HOST", "/y.sock")])).unwrap();
    /// assert_eq!(a.source, AddressSource::Config);
    /// let a = DaemonAddress::resolve(None, env(&[("DOCKER_API_VERSION", "1.41")])).unwrap();
    /// assert_eq!((a.source, a.api_version), (AddressSource::Default, Some((1, 41))));
    /// assert!(DaemonAddress::resolve(None, env(&[("DOCKER_API_VERSION", "new")])).is_err());
    /// let tls = DaemonAddress::resolve(None, env(&[("DOCKER_HOST", "tcp://h:2376"), ("DOCKER_TLS_VERIFY", "1")]));
    /// assert!(tls.unwrap_err().to_string().contains("DOCKER_TLS_VERIFY"));
    /// ```
    pub fn resolve(
        configured: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<DaemonAddress, DriverError> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let (endpoint, source) = match (configured, set("DOCKER_HOST")) {
            (Some(e), _) => (Endpoint::parse(e)?, AddressSource::Config),
            (None, Some(h)) => (
                Endpoint::parse(&h)
                    .map_err(|e| DriverError::InvalidConfig(format!("DOCKER_HOST: {e}")))?,
                AddressSource::DockerHost,
            ),
            (None, None) => (Endpoint::parse(DEFAULT_ENDPOINT)?, AddressSource::Default),
        };
        if let Endpoint::Tcp(addr) = &endpoint {
            let tls: Vec<&str> = ["DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"]
                .into_iter()
                .filter(|n| set(n).is_some())
                .collect();
            if !tls.is_empty() {
                return Err(DriverError::InvalidConfig(format!(
                    "the docker daemon at {addr} is to be reached over TLS ({} set), which \
                     Drover's docker driver does not support yet: give it a unix socket \
                     (DOCKER_HOST=unix:///path or [plugin.docker] config endpoint), or a \
                     local tunnel to the daemon",
                    tls.join(" and ")
                )));
            }
        }
        let api_version = match set("DOCKER_API_VERSION") {
            None => None,
            Some(v) => Some(parse_api_version(&v).ok_or_else(|| {
                DriverError::InvalidConfig(format!(
                    "DOCKER_API_VERSION={v:?} is not an API version like \"1.41\""
                ))
            })?),
        };
        Ok(DaemonAddress {
            endpoint,
            source,
            api_version,
        })
    }

    /// What a user needs to know about where the address came from, e.g. "the
    /// default address; DOCKER_HOST is not set in the docker driver's environment".
    pub fn origin(&self) -> &'static str {
        match self.source {
            AddressSource::Config => "from [plugin.docker] config endpoint",
            AddressSource::DockerHost => "from DOCKER_HOST",
            AddressSource::Default => {
                "the default address; DOCKER_HOST is not set in the docker driver's environment"
            }
        }
    }
}

/// `"1.41"` → `(1, 41)`.
fn parse_api_version(text: &str) -> Option<(usize, usize)> {
    let (major, minor) = text.trim().trim_start_matches('v').split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The shared, lazily made client.
pub(crate) struct Engine {
    address: DaemonAddress,
    docker: tokio::sync::Mutex<Option<Docker>>,
}

impl Engine {
    pub(crate) fn new(address: DaemonAddress) -> Self {
        Engine {
            address,
            docker: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.address.endpoint
    }

    pub(crate) fn address(&self) -> &DaemonAddress {
        &self.address
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
                "docker daemon at {} ({}) is unreachable: {e}",
                self.address.endpoint,
                self.address.origin()
            ))
        };
        let fixed = self
            .address
            .api_version
            .map(|(major_version, minor_version)| bollard::ClientVersion {
                major_version,
                minor_version,
            });
        let version = fixed.as_ref().unwrap_or(bollard::API_DEFAULT_VERSION);
        let docker = match &self.address.endpoint {
            Endpoint::Unix(path) => Docker::connect_with_unix(path, REQUEST_TIMEOUT_SECS, version),
            Endpoint::Tcp(addr) => Docker::connect_with_http(addr, REQUEST_TIMEOUT_SECS, version),
        }
        .map_err(|e| unreachable(&e))?;
        if fixed.is_some() {
            // DOCKER_API_VERSION: speak that level, as the docker CLI does.
            return Ok(docker);
        }
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
