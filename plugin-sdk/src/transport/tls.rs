//! go-plugin's automatic mutual TLS ("AutoMTLS"), both ends.
//!
//! The host generates a throwaway certificate, passes it to the plugin as
//! `PLUGIN_CLIENT_CERT` (PEM); the plugin generates its own and prints its DER, base64
//! (standard alphabet, no padding), as the handshake line's 6th field. Each side then
//! trusts exactly the other's certificate. Both certificates are made as go-plugin's
//! `generateCert` makes them: ECDSA P-521 with SHA-512, CN and DNS name `localhost`,
//! organisation `HashiCorp`, a CA certificate usable for client and server auth.
//!
//! P-521 is what Go hosts and plugins send and sign with, and `ring` can neither sign nor
//! verify it. So the P-521 operations (key generation, certificate and handshake
//! signatures, signature checks) come from aws-lc-rs, while everything else of the TLS
//! session (key exchange, record encryption) is rustls' `ring` provider, selected
//! explicitly per config. rustls' own `aws_lc_rs` feature stays off: with both provider
//! features on, rustls can no longer pick a process default, and tonic's
//! `ServerTlsConfig` (the cluster RPC listener) relies on that default.

// The host half is used only with the `launcher` feature.
#![cfg_attr(not(feature = "launcher"), allow(dead_code))]

use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::{CertifiedKey, Signer, SigningKey};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureAlgorithm, SignatureScheme};
use webpki::aws_lc_rs as algs;

/// The server name both sides use, as go-plugin does (its certificates name only it).
pub(crate) const SERVER_NAME: &str = "localhost";

/// ALPN of gRPC over TLS (grpc-go offers and requires it).
const ALPN_H2: &[u8] = b"h2";

/// Validity of a generated certificate: go-plugin's 262980 hours (30 years).
const CERT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(262_980 * 3600);
/// go-plugin backdates `NotBefore` by 30 s (clock skew between host and plugin).
const CERT_BACKDATE: std::time::Duration = std::time::Duration::from_secs(30);

/// What went wrong setting up AutoMTLS; the message names the certificate or key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    /// Generating a key or certificate failed.
    #[error("cannot generate the AutoMTLS certificate: {0}")]
    Generate(String),
    /// A PEM certificate did not parse.
    #[error("{what} is not a PEM certificate: {reason}")]
    BadPem {
        /// Which certificate.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The plugin's certificate (handshake line or reattach record) is not base64 DER.
    #[error("the plugin's AutoMTLS certificate is not base64 (RawStdEncoding) DER: {0}")]
    BadServerCert(String),
    /// A private key did not parse or is not a P-521 key.
    #[error("the AutoMTLS private key is unusable: {0}")]
    BadKey(String),
    /// rustls refused the configuration.
    #[error("cannot build the TLS configuration: {0}")]
    Config(String),
}

/// A freshly generated certificate and its key, as go-plugin's `generateCert` makes them.
pub(crate) struct GeneratedCert {
    /// The certificate, DER.
    pub(crate) der: CertificateDer<'static>,
    /// The certificate, PEM (what goes into `PLUGIN_CLIENT_CERT`).
    pub(crate) pem: String,
    /// The private key, PKCS#8 DER. Never logged.
    pub(crate) key_pkcs8: Vec<u8>,
}

impl std::fmt::Debug for GeneratedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedCert")
            .field("pem", &self.pem)
            .field("key_pkcs8", &"<redacted>")
            .finish()
    }
}

impl Drop for GeneratedCert {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.key_pkcs8);
    }
}

impl GeneratedCert {
    /// The key as PKCS#8 PEM (for the reattach record).
    pub(crate) fn key_pem(&self) -> String {
        pem_encode("PRIVATE KEY", &self.key_pkcs8)
    }
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    // Wiped when done: `der` may be a private key.
    let b64 = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(der));
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Generate a certificate exactly as go-plugin's `generateCert`: ECDSA P-521 key,
/// self-signed with ECDSA-SHA512, subject O=HashiCorp CN=localhost, DNS name localhost,
/// CA, key usage digitalSignature|keyEncipherment|keyAgreement|certSign, extended key
/// usage client+server auth, a random 128-bit serial, valid from 30 s ago for 262980 h.
pub(crate) fn generate_cert() -> Result<GeneratedCert, TlsSetupError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, SerialNumber,
    };
    let failed = |e: rcgen::Error| TlsSetupError::Generate(e.to_string());
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512).map_err(failed)?;
    let mut params = CertificateParams::new(vec![SERVER_NAME.to_owned()]).map_err(failed)?;
    // Go writes the subject in its fixed order: O before CN.
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "HashiCorp");
    params
        .distinguished_name
        .push(DnType::CommonName, SERVER_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::KeyAgreement,
        KeyUsagePurpose::KeyCertSign,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ClientAuth,
        ExtendedKeyUsagePurpose::ServerAuth,
    ];
    let mut serial = [0u8; 16];
    aws_lc_rs::rand::fill(&mut serial)
        .map_err(|_| TlsSetupError::Generate("no random bytes for the serial".into()))?;
    // A positive, non-zero integer below 2^128 (rcgen adds the DER sign byte).
    serial[15] |= 1;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let now = std::time::SystemTime::now();
    params.not_before = time::OffsetDateTime::from(now - CERT_BACKDATE);
    params.not_after = time::OffsetDateTime::from(now + CERT_LIFETIME);
    let cert = params.self_signed(&key).map_err(failed)?;
    Ok(GeneratedCert {
        pem: cert.pem(),
        der: cert.der().clone(),
        key_pkcs8: key.serialize_der(),
    })
}

/// The certificate DER as go-plugin prints it in the handshake line: base64, standard
/// alphabet, no padding (Go's `base64.RawStdEncoding`).
pub(crate) fn encode_handshake_cert(der: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(der)
}

/// The inverse of [`encode_handshake_cert`]; strict, as Go's decoder is (no padding).
pub(crate) fn decode_handshake_cert(text: &str) -> Result<CertificateDer<'static>, TlsSetupError> {
    let der = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text.trim())
        .map_err(|e| TlsSetupError::BadServerCert(e.to_string()))?;
    // Refuse what is not even a certificate now, rather than in the TLS handshake.
    webpki::EndEntityCert::try_from(&CertificateDer::from(der.as_slice()))
        .map_err(|e| TlsSetupError::BadServerCert(format!("not an X.509 certificate: {e}")))?;
    Ok(CertificateDer::from(der))
}

/// Every certificate in a PEM text. Empty or certificate-less PEM is an error.
pub(crate) fn parse_pem_certs(
    what: &'static str,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    use rustls::pki_types::pem::PemObject as _;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsSetupError::BadPem {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::BadPem {
            what,
            reason: "no CERTIFICATE block".into(),
        });
    }
    for cert in &certs {
        webpki::EndEntityCert::try_from(cert).map_err(|e| TlsSetupError::BadPem {
            what,
            reason: format!("not an X.509 certificate: {e}"),
        })?;
    }
    Ok(certs)
}

/// A PKCS#8 (or SEC1) PEM private key as PKCS#8 DER.
pub(crate) fn parse_pem_key(pem: &str) -> Result<zeroize::Zeroizing<Vec<u8>>, TlsSetupError> {
    use rustls::pki_types::pem::PemObject as _;
    match PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| TlsSetupError::BadKey(e.to_string()))?
    {
        PrivateKeyDer::Pkcs8(k) => Ok(zeroize::Zeroizing::new(k.secret_pkcs8_der().to_vec())),
        _ => Err(TlsSetupError::BadKey(
            "expected a PKCS#8 \"PRIVATE KEY\" block".into(),
        )),
    }
}

/// rustls' `ring` provider with signature checks from aws-lc-rs, which adds P-521.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: LazyLock<Arc<CryptoProvider>> = LazyLock::new(|| {
        Arc::new(CryptoProvider {
            signature_verification_algorithms: SIGNATURE_ALGORITHMS,
            ..rustls::crypto::ring::default_provider()
        })
    });
    PROVIDER.clone()
}

/// Signature algorithms accepted in certificates and handshakes: aws-lc-rs', mapped to
/// TLS schemes as rustls' own aws-lc-rs provider maps them.
static SIGNATURE_ALGORITHMS: WebPkiSupportedAlgorithms = WebPkiSupportedAlgorithms {
    all: &[
        algs::ECDSA_P521_SHA512,
        algs::ECDSA_P521_SHA384,
        algs::ECDSA_P521_SHA256,
        algs::ECDSA_P384_SHA384,
        algs::ECDSA_P384_SHA256,
        algs::ECDSA_P256_SHA256,
        algs::ECDSA_P256_SHA384,
        algs::ED25519,
        algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
        algs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
        algs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
        algs::RSA_PKCS1_2048_8192_SHA256,
        algs::RSA_PKCS1_2048_8192_SHA384,
        algs::RSA_PKCS1_2048_8192_SHA512,
    ],
    mapping: &[
        (
            SignatureScheme::ECDSA_NISTP521_SHA512,
            &[algs::ECDSA_P521_SHA512],
        ),
        (
            SignatureScheme::ECDSA_NISTP384_SHA384,
            &[
                algs::ECDSA_P384_SHA384,
                algs::ECDSA_P256_SHA384,
                algs::ECDSA_P521_SHA384,
            ],
        ),
        (
            SignatureScheme::ECDSA_NISTP256_SHA256,
            &[
                algs::ECDSA_P256_SHA256,
                algs::ECDSA_P384_SHA256,
                algs::ECDSA_P521_SHA256,
            ],
        ),
        (SignatureScheme::ED25519, &[algs::ED25519]),
        (
            SignatureScheme::RSA_PSS_SHA512,
            &[algs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA384,
            &[algs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA256,
            &[algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA512,
            &[algs::RSA_PKCS1_2048_8192_SHA512],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA384,
            &[algs::RSA_PKCS1_2048_8192_SHA384],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA256,
            &[algs::RSA_PKCS1_2048_8192_SHA256],
        ),
    ],
};

/// A P-521 private key signing TLS handshakes (aws-lc-rs; `ring` has no P-521).
#[derive(Debug)]
struct P521Key(Arc<aws_lc_rs::signature::EcdsaKeyPair>);

impl P521Key {
    fn from_pkcs8(der: &[u8]) -> Result<Self, TlsSetupError> {
        aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P521_SHA512_ASN1_SIGNING,
            der,
        )
        .map(|k| P521Key(Arc::new(k)))
        .map_err(|e| TlsSetupError::BadKey(format!("not a P-521 ECDSA key: {e}")))
    }
}

impl SigningKey for P521Key {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP521_SHA512)
            .then(|| Box::new(P521Signer(self.0.clone())) as Box<dyn Signer>)
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

#[derive(Debug)]
struct P521Signer(Arc<aws_lc_rs::signature::EcdsaKeyPair>);

impl Signer for P521Signer {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        self.0
            .sign(&aws_lc_rs::rand::SystemRandom::new(), message)
            .map(|s| s.as_ref().to_vec())
            .map_err(|_| rustls::Error::General("P-521 signing failed".into()))
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP521_SHA512
    }
}

fn certified_key(
    cert: CertificateDer<'static>,
    key_pkcs8: &[u8],
) -> Result<Arc<CertifiedKey>, TlsSetupError> {
    let key = P521Key::from_pkcs8(key_pkcs8)?;
    Ok(Arc::new(CertifiedKey::new(vec![cert], Arc::new(key))))
}

/// The plugin side: serve TLS with `own` and require a client certificate equal to (or
/// issued by) one of `trusted` — the certificates of `PLUGIN_CLIENT_CERT`.
pub(crate) fn server_config(
    own: &GeneratedCert,
    trusted: Vec<CertificateDer<'static>>,
) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let provider = provider();
    let verifier = PinnedClientVerifier::new(trusted, provider.clone())?;
    let key = certified_key(own.der.clone(), &own.key_pkcs8)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
            Arc::unwrap_or_clone(key),
        )));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The host side: present `own_cert`/`own_key_pkcs8` and accept exactly the plugin's
/// certificate `server_cert`, for the name `localhost`.
pub(crate) fn client_config(
    own_cert: CertificateDer<'static>,
    own_key_pkcs8: &[u8],
    server_cert: CertificateDer<'static>,
) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let provider = provider();
    let key = certified_key(own_cert, own_key_pkcs8)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedServerVerifier {
            pinned: server_cert,
            provider,
        }))
        .with_client_cert_resolver(Arc::new(OwnClientCert(key)));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The server name the host checks the plugin's certificate for.
pub(crate) fn server_name() -> ServerName<'static> {
    ServerName::DnsName(
        rustls::pki_types::DnsName::try_from(SERVER_NAME)
            .expect("\"localhost\" is a valid DNS name")
            .to_owned(),
    )
}

/// The host's certificate, sent whenever the plugin asks for one.
#[derive(Debug)]
struct OwnClientCert(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for OwnClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A pinned certificate is still checked for its validity period, as Go's
/// verification checks it for a certificate in its root pool: one made for an earlier
/// session and replayed long after (go-plugin's last 30 years) is refused.
fn check_validity(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    let Some((not_before, not_after)) = validity(cert) else {
        return Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::BadEncoding,
        ));
    };
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if now < not_before {
        return Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidYet,
        ));
    }
    if now > not_after {
        return Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Expired,
        ));
    }
    Ok(())
}

/// `notBefore` and `notAfter` of an X.509 certificate, in Unix seconds (RFC 5280
/// 4.1: `Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }`,
/// the validity being the fifth field of `tbsCertificate`, after an optional version).
fn validity(cert: &[u8]) -> Option<(i64, i64)> {
    use yasna::{ASN1Result, BERReader, Tag};
    fn time(r: BERReader<'_, '_>) -> ASN1Result<i64> {
        if r.lookahead_tag()? == yasna::tags::TAG_UTCTIME {
            Ok(r.read_utctime()?.datetime().unix_timestamp())
        } else {
            Ok(r.read_generalized_time()?.datetime().unix_timestamp())
        }
    }
    yasna::parse_der(cert, |r| {
        r.read_sequence(|r| {
            let validity = r.next().read_sequence(|r| {
                r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der().map(drop)))?;
                r.next().read_der()?; // serialNumber
                r.next().read_der()?; // signature
                r.next().read_der()?; // issuer
                let validity = r
                    .next()
                    .read_sequence(|r| Ok((time(r.next())?, time(r.next())?)))?;
                // subject, subjectPublicKeyInfo, then optional fields.
                while r.read_optional(|r| r.read_der())?.is_some() {}
                Ok(validity)
            })?;
            r.next().read_der()?; // signatureAlgorithm
            r.next().read_der()?; // signatureValue
            Ok(validity)
        })
    })
    .ok()
}

/// The host's check of the plugin: its certificate must be byte for byte the one the
/// plugin announced (go-plugin puts that one certificate alone in the host's root pool),
/// valid for `localhost`; its handshake signature must verify with that certificate's
/// key. Go's path validation would also reject a CA certificate used as a leaf if it
/// were webpki; pinning the exact certificate is the same trust, stated directly.
#[derive(Debug)]
struct PinnedServerVerifier {
    pinned: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() != self.pinned.as_ref() {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ));
        }
        check_validity(end_entity, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The plugin's check of the host: a client certificate is required; it must be one of
/// the `PLUGIN_CLIENT_CERT` certificates (what every go-plugin host sends: the
/// certificate it presents), or be issued by one of them (what Go's `ClientCAs` pool
/// would also accept).
#[derive(Debug)]
struct PinnedClientVerifier {
    trusted: Vec<CertificateDer<'static>>,
    /// Built on the same provider: it checks chains, and every handshake signature.
    chained: Arc<dyn ClientCertVerifier>,
}

impl PinnedClientVerifier {
    fn new(
        trusted: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsSetupError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in &trusted {
            roots.add(cert.clone()).map_err(|e| TlsSetupError::BadPem {
                what: "PLUGIN_CLIENT_CERT",
                reason: e.to_string(),
            })?;
        }
        let chained =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsSetupError::Config(e.to_string()))?;
        Ok(PinnedClientVerifier { trusted, chained })
    }
}

impl ClientCertVerifier for PinnedClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The subjects of the trusted certificates: a Go host picks its certificate by
        // matching its issuer against these.
        self.chained.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self
            .trusted
            .iter()
            .any(|t| t.as_ref() == end_entity.as_ref())
        {
            check_validity(end_entity, now)?;
            return Ok(ClientCertVerified::assertion());
        }
        self.chained
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chained.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chained.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chained.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_cert_is_go_plugins_shape() {
        let c = generate_cert().unwrap();
        let parsed = webpki::EndEntityCert::try_from(&c.der).unwrap();
        parsed
            .verify_is_valid_for_subject_name(&server_name())
            .unwrap();
        assert!(c.pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!format!("{c:?}").contains(&c.key_pem()[30..60]));
        // The handshake text round-trips and has no padding.
        let text = encode_handshake_cert(&c.der);
        assert!(!text.ends_with('='));
        assert_eq!(decode_handshake_cert(&text).unwrap(), c.der);
        assert_eq!(parse_pem_certs("x", &c.pem).unwrap(), vec![c.der.clone()]);
        assert_eq!(*parse_pem_key(&c.key_pem()).unwrap(), c.key_pkcs8);
        // Two certificates differ (fresh key and serial each time).
        assert_ne!(generate_cert().unwrap().der, c.der);
    }

    /// A pinned certificate is refused outside its validity period, as Go refuses it:
    /// by the host checking the plugin's, and by the plugin checking the host's.
    #[test]
    fn a_pinned_certificate_is_refused_outside_its_validity() {
        use std::time::{Duration, SystemTime, UNIX_EPOCH};
        let c = generate_cert().unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let (not_before, not_after) = validity(&c.der).unwrap();
        let now_s = i64::try_from(now.as_secs()).unwrap();
        // go-plugin's shape: 30 s back, 262980 hours ahead (a GeneralizedTime, past 2049).
        assert!(
            (now_s - 40..=now_s - 20).contains(&not_before),
            "{not_before}"
        );
        let lifetime = i64::try_from(CERT_LIFETIME.as_secs()).unwrap();
        assert!((now_s + lifetime - 10..=now_s + lifetime + 10).contains(&not_after));

        let at = |d: Duration| UnixTime::since_unix_epoch(d);
        let later = now + CERT_LIFETIME + Duration::from_secs(3600);
        let earlier = now - Duration::from_secs(3600);
        let server = PinnedServerVerifier {
            pinned: c.der.clone(),
            provider: provider(),
        };
        let verify = |when| server.verify_server_cert(&c.der, &[], &server_name(), &[], at(when));
        assert!(verify(now).is_ok());
        assert_eq!(
            verify(later).unwrap_err(),
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)
        );
        assert_eq!(
            verify(earlier).unwrap_err(),
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidYet)
        );
        let client = PinnedClientVerifier::new(vec![c.der.clone()], provider()).unwrap();
        assert!(client.verify_client_cert(&c.der, &[], at(now)).is_ok());
        assert_eq!(
            client
                .verify_client_cert(&c.der, &[], at(later))
                .unwrap_err(),
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)
        );
        // Not a certificate at all.
        assert_eq!(validity(b"\x30\x03\x02\x01\x01"), None);
    }

    #[test]
    fn garbage_is_refused_with_reasons() {
        assert!(
            parse_pem_certs("PLUGIN_CLIENT_CERT", "hello")
                .unwrap_err()
                .to_string()
                .contains("PLUGIN_CLIENT_CERT is not a PEM certificate")
        );
        let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(
            parse_pem_certs("PLUGIN_CLIENT_CERT", not_der)
                .unwrap_err()
                .to_string()
                .contains("not an X.509 certificate")
        );
        assert!(decode_handshake_cert("!!!").is_err());
    }
}
