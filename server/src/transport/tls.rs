//! TLS settings shared by the HTTP and RPC listeners (rustls with ring).
//!
//! The PEM files are read and checked here, once, so that a missing file, a file
//! without a certificate or key, or a key that does not belong to the certificate is
//! an error naming the file before any listener accepts a connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

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

/// Why the TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {}: {reason}", path.display())]
    Read {
        /// Which file (`TLS certificate`, `TLS key`, `TLS client CA`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file is not what it should be (no PEM certificate or key in it, a key that
    /// does not match the certificate).
    #[error("{what} {}: {reason}", path.display())]
    Invalid {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The PEM contents of [`TlsFiles`], checked.
#[derive(Debug)]
pub struct LoadedTls {
    /// The certificate chain, PEM as read.
    pub cert_pem: Vec<u8>,
    /// The private key, PEM as read.
    pub key_pem: Vec<u8>,
    /// The client CA, PEM as read.
    pub client_ca_pem: Option<Vec<u8>>,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Vec<CertificateDer<'static>>,
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// The certificates of a PEM file: at least one, each well-formed.
pub fn pem_certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let invalid = |reason: String| TlsError::Invalid {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            "no certificate in it (expected a \"-----BEGIN CERTIFICATE-----\" block)".into(),
        ));
    }
    Ok(certs)
}

impl TlsFiles {
    /// Read and check the files: the certificate chain and its key (which must match),
    /// and the client CA when set.
    pub fn load(&self) -> Result<LoadedTls, TlsError> {
        let cert_pem = read("TLS certificate", &self.cert)?;
        let key_pem = read("TLS key", &self.key)?;
        let certs = pem_certificates("TLS certificate", &self.cert, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Invalid {
            what: "TLS key",
            path: self.key.clone(),
            reason: format!(
                "no usable private key in it (expected a PEM \"PRIVATE KEY\" block): {e}"
            ),
        })?;
        let (client_ca_pem, client_ca) = match &self.client_ca {
            Some(path) => {
                let pem = read("TLS client CA", path)?;
                let certs = pem_certificates("TLS client CA", path, &pem)?;
                (Some(pem), certs)
            }
            None => (None, Vec::new()),
        };
        let loaded = LoadedTls {
            cert_pem,
            key_pem,
            client_ca_pem,
            certs,
            key,
            client_ca,
        };
        // Building the rustls config proves the key belongs to the certificate and
        // that the CA parses, so neither fails later on the first handshake.
        loaded.rustls_server_config(self)?;
        Ok(loaded)
    }
}

impl LoadedTls {
    /// The tonic settings for the RPC listener: this identity, and client
    /// certificates required (chained to the client CA) when one is set.
    pub fn tonic_server_config(&self) -> tonic::transport::ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        let mut config = tonic::transport::ServerTlsConfig::new()
            .identity(identity)
            // A client that opens TCP and never finishes its handshake must not hold
            // a connection slot for ever.
            .timeout(std::time::Duration::from_secs(10));
        if let Some(ca) = &self.client_ca_pem {
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        config
    }

    /// A rustls server config (ring) for a listener that does its own accepting (the
    /// HTTP API): ALPN `h2` and `http/1.1`.
    pub fn rustls_server_config(
        &self,
        files: &TlsFiles,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid {
                what: "TLS settings",
                path: files.cert.clone(),
                reason: e.to_string(),
            })?;
        let builder = if self.client_ca.is_empty() {
            builder.with_no_client_auth()
        } else {
            let ca_path = files.client_ca.clone().unwrap_or_default();
            let mut roots = rustls::RootCertStore::empty();
            for cert in &self.client_ca {
                roots.add(cert.clone()).map_err(|e| TlsError::Invalid {
                    what: "TLS client CA",
                    path: ca_path.clone(),
                    reason: format!("not a usable CA certificate: {e}"),
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| TlsError::Invalid {
                what: "TLS client CA",
                path: ca_path,
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        };
        let mut config = builder
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Invalid {
                what: "TLS key",
                path: files.key.clone(),
                reason: format!(
                    "does not go with the certificate {}: {e}",
                    files.cert.display()
                ),
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let c = dir.join("cert.pem");
        let k = dir.join("key.pem");
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        TlsFiles {
            cert: c,
            key: k,
            client_ca: None,
        }
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TlsFiles {
            cert: dir.path().join("nope.pem"),
            key: dir.path().join("key.pem"),
            client_ca: None,
        };
        let err = missing.load().unwrap_err().to_string();
        assert!(
            err.contains("TLS certificate") && err.contains("nope.pem"),
            "{err}"
        );

        let not_pem = files(dir.path(), "hello", "world");
        let err = not_pem.load().unwrap_err().to_string();
        assert!(
            err.contains("cert.pem") && err.contains("no certificate"),
            "{err}"
        );

        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let no_key = files(dir.path(), &ck.cert.pem(), "nothing");
        let err = no_key.load().unwrap_err().to_string();
        assert!(
            err.contains("key.pem") && err.contains("private key"),
            "{err}"
        );

        let wrong_key = files(
            dir.path(),
            &ck.cert.pem(),
            &other.signing_key.serialize_pem(),
        );
        let err = wrong_key.load().unwrap_err().to_string();
        assert!(err.contains("does not go with the certificate"), "{err}");

        let good = files(dir.path(), &ck.cert.pem(), &ck.signing_key.serialize_pem());
        good.load().unwrap();
        let bad_ca = TlsFiles {
            client_ca: Some(dir.path().join("key.pem")),
            ..good
        };
        let err = bad_ca.load().unwrap_err().to_string();
        assert!(
            err.contains("TLS client CA") && err.contains("key.pem"),
            "{err}"
        );
    }
}
