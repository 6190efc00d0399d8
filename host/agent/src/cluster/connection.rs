//! How a client agent reaches its servers: the addresses, TLS and the token, checked
//! once at start. [`connect`] is also what the agent's `/v1/*` forwarding uses.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::ClusterError;
use crate::config::{AgentConfig, ClientTls};

/// Time to open a connection (TCP and TLS) to one server before trying the next.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message the agent decodes: a node's complete allocation set comes in one
/// message (the server allows the same).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The configured servers, with TLS and the token: what every RPC to a server needs.
#[derive(Clone)]
pub struct ServerConnection {
    servers: Vec<(String, Endpoint)>,
    token: Option<Arc<str>>,
    interceptor: TokenInterceptor,
}

impl std::fmt::Debug for ServerConnection {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConnection")
            .field("servers", &self.addresses())
            .field("token", &self.token.is_some())
            .finish()
    }
}

/// Adds the cluster token (when there is one) to every call as `x-drover-token`
/// metadata: `XClient::with_interceptor(channel, conn.interceptor())`.
#[derive(Clone)]
pub struct TokenInterceptor(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            // The cluster's own key (lowercase, as gRPC metadata keys must be), not the
            // HTTP API's `X-Nomad-Token`.
            req.metadata_mut().insert("x-drover-token", token.clone());
        }
        Ok(req)
    }
}

/// The servers of `config` (`servers`, `tls`, `token_file`), checked: every address
/// parses, the TLS files read, the token file is private and not empty. Nothing is
/// dialled yet.
pub fn connect(config: &AgentConfig) -> Result<ServerConnection, ClusterError> {
    if config.servers.is_empty() {
        return Err(ClusterError::Config("no servers configured".into()));
    }
    let tls = config.tls.as_ref().map(client_tls).transpose()?;
    let mut servers = Vec::new();
    for given in &config.servers {
        // `--servers a:1,b:2` arrives as one entry from some sources; accept both.
        for addr in given.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            servers.push((addr.to_owned(), endpoint(addr, tls.as_ref())?));
        }
    }
    if servers.is_empty() {
        return Err(ClusterError::Config(format!(
            "servers = {:?} names no address (expected HOST:PORT)",
            config.servers
        )));
    }
    let token = config
        .token_file
        .as_deref()
        .map(|path| {
            crate::private_file::read_token(path).map_err(|e| ClusterError::Config(e.to_string()))
        })
        .transpose()?;
    warn_token_in_clear_text(&servers, tls.is_some() || token.is_none());
    let interceptor = TokenInterceptor(
        token
            .as_deref()
            .map(|t| {
                t.parse().map_err(|_| {
                    ClusterError::Config("the token is not a valid metadata value".into())
                })
            })
            .transpose()?,
    );
    Ok(ServerConnection {
        servers,
        token: token.map(Arc::from),
        interceptor,
    })
}

impl ServerConnection {
    /// How many servers there are (at least one).
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Never: [`connect`] refuses an empty list.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The servers' addresses as configured, in order.
    pub fn addresses(&self) -> Vec<&str> {
        self.servers.iter().map(|(a, _)| a.as_str()).collect()
    }

    /// The address of server `i` (modulo the count).
    pub fn address(&self, i: usize) -> &str {
        &self.servers[i % self.servers.len()].0
    }

    /// A channel to server `i` (modulo the count) that connects on its first call,
    /// and again after it broke.
    pub fn channel(&self, i: usize) -> Channel {
        self.servers[i % self.servers.len()].1.connect_lazy()
    }

    /// Connect to server `i` (modulo the count) now; fails within
    /// [`CONNECT_TIMEOUT`] when it does not answer.
    pub async fn connect(&self, i: usize) -> Result<Channel, tonic::transport::Error> {
        self.servers[i % self.servers.len()].1.connect().await
    }

    /// The token, when one is configured (for a header on forwarded requests).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The interceptor that adds the token to every call.
    pub fn interceptor(&self) -> TokenInterceptor {
        self.interceptor.clone()
    }
}

fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, ClusterError> {
    let bad = |why: &str| ClusterError::Config(format!("server address {addr:?}: {why}"));
    let uri = match addr.split_once("://") {
        Some(("http", _)) if tls.is_some() => {
            return Err(bad(
                "http:// while [tls] is configured; write https://HOST:PORT or HOST:PORT",
            ));
        }
        Some(("https", _)) if tls.is_none() => {
            return Err(bad(
                "https:// needs the servers' CA: set --tls-ca-file (tls.ca_file)",
            ));
        }
        Some(("http" | "https", _)) => addr.to_owned(),
        Some((scheme, _)) => return Err(bad(&format!("unknown scheme {scheme}://"))),
        None if tls.is_some() => format!("https://{addr}"),
        None => format!("http://{addr}"),
    };
    let parsed: http::Uri = uri.parse().map_err(|e| bad(&format!("{e}")))?;
    if parsed.port_u16().is_none() {
        return Err(bad("no port (expected HOST:PORT)"));
    }
    if parsed.path() != "/" && !parsed.path().is_empty() {
        return Err(bad("a path is not allowed (expected HOST:PORT)"));
    }
    let mut ep = Endpoint::from_shared(uri)
        .map_err(|e| bad(&e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        // A server host that vanished without closing is noticed within ~20 s even
        // while the allocation stream is idle.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if let Some(tls) = tls {
        ep = ep
            .tls_config(tls.clone())
            .map_err(|e| bad(&format!("TLS: {e}")))?;
    }
    Ok(ep)
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, ClusterError> {
    std::fs::read(path)
        .map_err(|e| ClusterError::Config(format!("cannot read {what} {}: {e}", path.display())))
}

fn pem_with(what: &str, path: &Path, pem: &[u8], marker: &str) -> Result<(), ClusterError> {
    if String::from_utf8_lossy(pem).contains(marker) {
        Ok(())
    } else {
        Err(ClusterError::Config(format!(
            "{what} {}: no PEM {marker} block in it",
            path.display()
        )))
    }
}

fn client_tls(tls: &ClientTls) -> Result<ClientTlsConfig, ClusterError> {
    let ca = read_file("the servers' CA (tls.ca_file)", &tls.ca_file)?;
    pem_with("tls.ca_file", &tls.ca_file, &ca, "CERTIFICATE")?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let cert_pem = read_file("the client certificate (tls.cert_file)", cert)?;
            pem_with("tls.cert_file", cert, &cert_pem, "CERTIFICATE")?;
            let key_pem = read_file("the client key (tls.key_file)", key)?;
            pem_with("tls.key_file", key, &key_pem, "PRIVATE KEY")?;
            config = config.identity(Identity::from_pem(cert_pem, key_pem));
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(ClusterError::Config(
                "tls.cert_file is set without tls.key_file: mutual TLS needs both".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(ClusterError::Config(
                "tls.key_file is set without tls.cert_file: mutual TLS needs both".into(),
            ));
        }
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

/// The servers, among `servers`, that a token would reach in clear text: not TLS and
/// not on this host (a loopback address or `localhost`).
fn clear_text_servers(servers: &[(String, Endpoint)]) -> Vec<&str> {
    servers
        .iter()
        .filter(|(_, ep)| {
            let uri = ep.uri();
            let host = uri.host().unwrap_or("").trim_matches(['[', ']']);
            let local = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            uri.scheme_str() != Some("https") && !local
        })
        .map(|(addr, _)| addr.as_str())
        .collect()
}

/// Warn, once per process, that the token travels in clear text to servers off this
/// host: whoever can watch the network can then act as a node or submit jobs. `safe`
/// is true when there is no token or TLS carries it.
fn warn_token_in_clear_text(servers: &[(String, Endpoint)], safe: bool) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if safe {
        return;
    }
    let clear = clear_text_servers(servers);
    if clear.is_empty() {
        return;
    }
    WARNED.call_once(|| {
        tracing::warn!(
            servers = ?clear,
            "the cluster token travels in clear text to these servers (no [tls]): \
             anyone on the network path can read it and act as this node"
        );
    });
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn config(servers: &[&str]) -> AgentConfig {
        AgentConfig {
            servers: servers.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn servers_a_token_reaches_in_clear_text_are_the_plain_ones_off_this_host() {
        let c = connect(&config(&[
            "127.0.0.1:4647",
            "localhost:4647",
            "[::1]:4647",
            "10.0.0.2:4647",
            "http://b.example:1",
        ]))
        .unwrap();
        assert_eq!(
            clear_text_servers(&c.servers),
            vec!["10.0.0.2:4647", "http://b.example:1"]
        );
    }

    #[test]
    fn addresses_parse_and_bad_ones_are_named() {
        let c = connect(&config(&[
            "127.0.0.1:4647",
            "http://10.0.0.2:4647,b.example:1",
        ]))
        .unwrap();
        assert_eq!(
            c.addresses(),
            vec!["127.0.0.1:4647", "http://10.0.0.2:4647", "b.example:1"]
        );
        assert_eq!(c.address(4), "http://10.0.0.2:4647");
        assert!(c.token().is_none());
        for (bad, says) in [
            ("127.0.0.1", "no port"),
            ("ftp://h:1", "unknown scheme"),
            ("https://h:1", "CA"),
            ("h:1/x", "path"),
        ] {
            let err = connect(&config(&[bad])).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains(says), "{bad}: {err}");
        }
        assert!(connect(&config(&[])).is_err());
        assert!(connect(&config(&[" , "])).is_err());
    }

    #[test]
    fn the_token_file_must_be_private_and_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = config(&["127.0.0.1:1"]);
        c.token_file = Some(path.clone());
        assert_eq!(connect(&c).unwrap().token(), Some("s3cret"));
        assert!(!format!("{:?}", connect(&c).unwrap()).contains("s3cret"));

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = connect(&c).unwrap_err().to_string();
        assert!(err.contains("644") && err.contains("token"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(connect(&c).is_ok(), "group-readable is allowed");

        std::fs::write(&path, " \n").unwrap();
        let err = connect(&c).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
        c.token_file = Some(dir.path().join("missing"));
        let err = connect(&c).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }

    #[test]
    fn tls_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "nothing").unwrap();
        let mut c = config(&["127.0.0.1:1"]);
        c.tls = Some(ClientTls {
            ca_file: ca.clone(),
            cert_file: None,
            key_file: None,
            server_name: None,
        });
        let err = connect(&c).unwrap_err().to_string();
        assert!(err.contains("ca.pem"), "{err}");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        if let Some(t) = c.tls.as_mut() {
            t.cert_file = Some(ca.clone());
        }
        let err = connect(&c).unwrap_err().to_string();
        assert!(err.contains("key_file"), "{err}");
        c.servers = vec!["http://127.0.0.1:1".into()];
        if let Some(t) = c.tls.as_mut() {
            t.cert_file = None;
        }
        let err = connect(&c).unwrap_err().to_string();
        assert!(err.contains("http://"), "{err}");
    }
}
