//! TLS settings shared by the HTTP and RPC listeners (rustls).

use std::path::PathBuf;

/// Certificate files, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// CA that client certificates must chain to (mutual TLS), when set.
    pub client_ca: Option<PathBuf>,
}
