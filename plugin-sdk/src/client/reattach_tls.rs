//! The AutoMTLS material a host keeps for a plugin it launched with TLS: made at the
//! launch (`process.rs`), stored in the reattach record (`reattach.rs`), and turned
//! back into a TLS client configuration by either to connect.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::transport::tls;

/// The AutoMTLS material of a launched plugin, to reconnect to it with TLS.
///
/// ```
/// use drover_plugin_sdk::client::ReattachTls;
/// let tls = ReattachTls {
///     client_cert_pem: "-----BEGIN CERTIFICATE-----\n...".into(),
///     client_key_pem: "-----BEGIN PRIVATE KEY-----\nSECRET".into(),
///     server_cert: "MIIC...".into(),
/// };
/// assert!(!format!("{tls:?}").contains("SECRET"));
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReattachTls {
    /// The host's certificate (PEM), the one the plugin got as `PLUGIN_CLIENT_CERT`.
    pub client_cert_pem: String,
    /// The host's private key (PKCS#8 PEM). Secret.
    pub client_key_pem: String,
    /// The plugin's certificate as its handshake line carried it: DER, base64 without
    /// padding (go-plugin's encoding). Only this certificate is accepted.
    pub server_cert: String,
}

impl std::fmt::Debug for ReattachTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReattachTls")
            .field("client_cert_pem", &self.client_cert_pem)
            .field("client_key_pem", &"<redacted>")
            .field("server_cert", &self.server_cert)
            .finish()
    }
}

/// The private key is wiped from memory when the record is dropped (copies made by
/// serialising it are the serialiser's).
impl Drop for ReattachTls {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.client_key_pem);
    }
}

impl ReattachTls {
    /// The TLS client configuration this material describes.
    pub(super) fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let own = tls::parse_pem_certs("the host's AutoMTLS certificate", &self.client_cert_pem)
            .map_err(|e| e.to_string())?;
        let key = tls::parse_pem_key(&self.client_key_pem).map_err(|e| e.to_string())?;
        let theirs = tls::decode_handshake_cert(&self.server_cert).map_err(|e| e.to_string())?;
        let first = own.into_iter().next().ok_or("no host certificate")?;
        tls::client_config(first, &key, theirs).map_err(|e| e.to_string())
    }
}
