//! How to reach etcd: endpoints, prefix, lease, timeouts, limits, TLS.

use std::time::Duration;

use crate::store::TxnLimits;

/// Schema version this build writes and reads under the prefix.
pub const SCHEMA_VERSION: &str = "1";

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `http://HOST:PORT` or `https://HOST:PORT` (with [`EtcdOptions::tls`]), at
    /// least one.
    pub endpoints: Vec<String>,
    /// Prefix of every key (`/drover/` by default; several clusters can share an
    /// etcd). Must end with `/`.
    pub prefix: String,
    /// TTL of this server's lease: how long a leader that stops renewing (killed,
    /// paused, partitioned) keeps its leadership at most. At least 2 s (etcd's
    /// minimum with its default timing); shorter is raised to 2 s.
    pub lease_ttl: Duration,
    /// How long one request may take before the endpoint counts as down.
    pub request_timeout: Duration,
    /// The largest transaction etcd takes (its `--max-txn-ops`,
    /// `--max-request-bytes`).
    pub limits: TxnLimits,
    /// TLS to etcd's client port, for `https://` endpoints (`None`: plain http).
    pub tls: Option<EtcdTls>,
}

/// TLS to etcd (`https://` endpoints): the CA that signed etcd's certificates and,
/// for an etcd run with `--client-cert-auth`, this server's client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the CA (etcd's `--trusted-ca-file` side of the handshake).
    pub ca: std::path::PathBuf,
    /// PEM client certificate (with `key`), when etcd checks client certificates.
    pub cert: Option<std::path::PathBuf>,
    /// PEM key of `cert`.
    pub key: Option<std::path::PathBuf>,
    /// Name to check etcd's certificate against (default: the endpoint's host).
    pub server_name: Option<String>,
}

impl EtcdOptions {
    /// Defaults for `endpoints`: prefix `/drover/`, lease TTL 10 s, requests 5 s,
    /// etcd's default limits (128 ops, 1.5 MiB).
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdOptions {
            endpoints,
            prefix: "/drover/".into(),
            lease_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            limits: TxnLimits {
                max_ops: 128,
                max_bytes: 1536 * 1024,
            },
            tls: None,
        }
    }
}
