//! A certificate authority for tests that speak TLS: one CA made in memory, and
//! certificates signed by it for the names a test gives (an IP address such as
//! `127.0.0.1` becomes an IP subject alternative name, anything else a DNS name).
//! Keys are ECDSA P-256; everything comes out as PEM text, for a test to hand to a
//! TLS config or write to the files a real binary reads.
//!
//! Two CAs are two strangers: a peer that trusts one refuses what the other signed,
//! which is how the tests check that the wrong CA is turned away.

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// A CA for one test: its certificate, and the key that signs the test's certificates.
pub struct TestCa {
    /// The CA's certificate (PEM): what a peer that trusts this CA is given.
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    /// A new CA, self-signed, unrelated to every other.
    pub fn new() -> TestCa {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).expect("parameters of a test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("a key for a test CA");
        let cert = params.self_signed(&key).expect("a self-signed test CA");
        TestCa {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `name` signed by this CA: (certificate PEM, private key PEM).
    pub fn leaf(&self, name: &str) -> (String, String) {
        self.leaf_for(&[name])
    }

    /// A certificate for every one of `names` signed by this CA: (certificate PEM,
    /// private key PEM).
    pub fn leaf_for(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("a key for a test certificate");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = CertificateParams::new(names.clone())
            .unwrap_or_else(|e| panic!("parameters of a test certificate for {names:?}: {e}"))
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("a test certificate for {names:?}: {e}"));
        (cert.pem(), key.serialize_pem())
    }
}

impl Default for TestCa {
    fn default() -> TestCa {
        TestCa::new()
    }
}
