//! The connection to etcd: one lazily connected tonic channel per endpoint, a request
//! timeout, and failover to the next endpoint when one cannot be reached.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use drover_proto::etcd::etcdserverpb as pb;
use drover_proto::etcd::v3electionpb::election_client::ElectionClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::watch_client::WatchClient;
use tonic::transport::{Channel, Endpoint};

use super::options::EtcdTls;
use crate::store::StoreError;

/// The TLS settings of the connections to etcd; errors name the file.
fn tls_config(tls: &EtcdTls, host: &str) -> Result<tonic::transport::ClientTlsConfig, StoreError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            StoreError::Backend(format!(
                "cannot read the etcd TLS {what} {}: {e}",
                path.display()
            ))
        })
    };
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&tls.ca, "CA file")?))
        .domain_name(tls.server_name.clone().unwrap_or_else(|| host.to_owned()));
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read(cert, "certificate file")?,
                read(key, "key file")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Backend(
                "etcd TLS: give both the client certificate and its key, or neither".into(),
            ));
        }
    }
    Ok(config)
}

/// Largest message we decode: a range page or a watch response (pages are bounded
/// by key count, values by etcd's request limit, 1.5 MiB by default).
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// Interval of HTTP/2 pings on idle connections, so that a watch or keepalive stream
/// to an etcd that vanished (host down, SIGSTOP) fails instead of hanging. etcd
/// refuses pings more often than every 5 s (`--grpc-keepalive-min-time`).
const PING: Duration = Duration::from_secs(10);

/// Whether a failed call may be sent to the next endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads and other idempotent calls: on any connection failure or timeout.
    Idempotent,
    /// Writes: only when the request surely never reached etcd (the connection could
    /// not be made); otherwise the outcome is unknown and the caller must learn it
    /// by reading again.
    NotSent,
}

pub(crate) struct Client {
    endpoints: Vec<(String, Channel)>,
    current: AtomicUsize,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.urls().collect::<Vec<_>>())
            .finish()
    }
}

impl Client {
    /// Channels to every endpoint (connected on first use). `https://` endpoints need
    /// `tls` (its CA at least).
    pub(crate) fn new(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<&EtcdTls>,
    ) -> Result<Client, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoint given".into()));
        }
        let mut out = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let url = url.trim().trim_end_matches('/').to_owned();
            let secure = url.starts_with("https://");
            if !secure && !url.starts_with("http://") {
                return Err(StoreError::Backend(format!(
                    "etcd endpoint {url:?}: expected http://HOST:PORT or https://HOST:PORT"
                )));
            }
            let mut ep = Endpoint::from_shared(url.clone())
                .map_err(|e| StoreError::Backend(format!("etcd endpoint {url:?}: {e}")))?
                .connect_timeout(timeout)
                .http2_keep_alive_interval(PING)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true)
                .tcp_nodelay(true);
            match (secure, tls) {
                (true, Some(tls)) => {
                    let host = ep.uri().host().unwrap_or_default().to_owned();
                    ep = ep
                        .tls_config(tls_config(tls, &host)?)
                        .map_err(|e| StoreError::Backend(format!("etcd endpoint {url:?}: {e}")))?;
                }
                (true, None) => {
                    return Err(StoreError::Backend(format!(
                        "etcd endpoint {url:?} is https: give the CA that signed etcd's \
                         certificate (--etcd-ca-file)"
                    )));
                }
                (false, Some(_)) => {
                    return Err(StoreError::Backend(format!(
                        "etcd endpoint {url:?} is plain http but TLS files were given: use \
                         https://"
                    )));
                }
                (false, None) => {}
            }
            out.push((url, ep.connect_lazy()));
        }
        Ok(Client {
            endpoints: out,
            current: AtomicUsize::new(0),
            timeout,
        })
    }

    pub(crate) fn urls(&self) -> impl Iterator<Item = &str> {
        self.endpoints.iter().map(|(u, _)| u.as_str())
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The endpoint calls go to now, and its channel.
    pub(crate) fn current(&self) -> (usize, &str, Channel) {
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let (u, c) = &self.endpoints[i];
        (i, u, c.clone())
    }

    /// Endpoint `i` failed: the next calls go to the next one.
    pub(crate) fn failed(&self, i: usize) {
        let next = (i + 1) % self.endpoints.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Channel and URL of endpoint `i`.
    pub(crate) fn endpoint(&self, i: usize) -> (&str, Channel) {
        let (u, c) = &self.endpoints[i % self.endpoints.len()];
        (u, c.clone())
    }

    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Run one unary call (`what` names it in errors) on the current endpoint, with
    /// the request timeout; on a connection failure try the other endpoints as
    /// `retry` allows.
    pub(crate) async fn unary<T, F, Fut>(
        &self,
        what: &str,
        retry: Retry,
        mut call: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let n = self.endpoints.len();
        let (start, _, _) = self.current();
        let mut errors = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            let (url, ch) = self.endpoint(i);
            match tokio::time::timeout(self.timeout, call(ch)).await {
                Ok(Ok(r)) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(r.into_inner());
                }
                Ok(Err(status)) => {
                    let failover = match retry {
                        Retry::Idempotent => is_unavailable(&status) || is_transport(&status),
                        Retry::NotSent => not_sent(&status),
                    };
                    if !failover {
                        if is_unavailable(&status) {
                            self.failed(i);
                        }
                        return Err(status_error(url, what, &status));
                    }
                    errors.push(format!("{url}: {}", describe(&status)));
                    self.failed(i);
                }
                Err(_) => {
                    self.failed(i);
                    let e = format!("{url}: no answer within {:?}", self.timeout);
                    if retry == Retry::NotSent {
                        return Err(StoreError::Backend(format!(
                            "etcd {what}: {e} (the outcome is unknown)"
                        )));
                    }
                    errors.push(e);
                }
            }
        }
        Err(StoreError::Backend(format!(
            "etcd {what}: no endpoint answered: {}",
            errors.join("; ")
        )))
    }
}

pub(crate) fn kv(ch: Channel) -> KvClient<Channel> {
    KvClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

pub(crate) fn watch(ch: Channel) -> WatchClient<Channel> {
    WatchClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

pub(crate) fn lease(ch: Channel) -> LeaseClient<Channel> {
    LeaseClient::new(ch)
}

pub(crate) fn maintenance(ch: Channel) -> MaintenanceClient<Channel> {
    MaintenanceClient::new(ch)
}

pub(crate) fn election(ch: Channel) -> ElectionClient<Channel> {
    ElectionClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// The endpoint could not be used (down, unreachable, no raft leader): another one
/// may serve the call.
pub(crate) fn is_unavailable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    ) && !s.message().contains("compacted")
}

/// The connection failed under the call (reset, closed, broken pipe): another
/// endpoint may serve a call that is safe to repeat.
pub(crate) fn is_transport(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unknown && s.message().contains("transport error")
}

/// The call failed before its request could reach etcd: the connection could not be
/// made (refused, unreachable, DNS), or writing it found the connection already
/// closed by etcd (a broken pipe: etcd had gone before the request's last frame, so
/// no handler ran it). A reset or a timeout after sending is not: etcd may have
/// applied it.
pub(crate) fn not_sent(s: &tonic::Status) -> bool {
    if !matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown) {
        return false;
    }
    const BEFORE_SENDING: [&str; 5] = [
        "tcp connect error",
        "error trying to connect",
        "Connection refused",
        "dns error",
        "broken pipe",
    ];
    let mut texts = vec![s.message().to_owned()];
    let mut e: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(err) = e {
        texts.push(err.to_string());
        e = err.source();
    }
    texts
        .iter()
        .any(|t| BEFORE_SENDING.iter().any(|m| t.contains(m)))
}

/// A status as a short human text, with its transport cause when there is one.
pub(crate) fn describe(s: &tonic::Status) -> String {
    let mut out = format!("{:?}: {}", s.code(), s.message());
    let mut e: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    let mut depth = 0;
    while let Some(err) = e
        && depth < 4
    {
        let t = err.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        e = err.source();
        depth += 1;
    }
    out
}

pub(crate) fn status_error(url: &str, what: &str, s: &tonic::Status) -> StoreError {
    StoreError::Backend(format!("etcd {what} at {url}: {}", describe(s)))
}

/// The end of the range of keys that start with `prefix` (etcd's `range_end`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): every key from `prefix` on.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/drover/"), b"/drover0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[tokio::test]
    async fn a_refused_connection_counts_as_not_sent() {
        // Nothing listens on port 1: the request cannot have reached an etcd.
        let c = Client::new(&["http://127.0.0.1:1".into()], Duration::from_secs(2), None).unwrap();
        let (_, _, ch) = c.current();
        let st = kv(ch).range(pb::RangeRequest::default()).await.unwrap_err();
        assert!(not_sent(&st), "{st:?}");
        assert!(is_unavailable(&st), "{st:?}");
        let e = c
            .unary("commit", Retry::NotSent, |ch| async move {
                kv(ch).txn(pb::TxnRequest::default()).await
            })
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("no endpoint answered: http://127.0.0.1:1"),
            "{e}"
        );
    }

    #[test]
    fn endpoints_must_be_http_urls() {
        let t = Duration::from_secs(1);
        let e = Client::new(&["127.0.0.1:2379".into()], t, None).unwrap_err();
        assert!(e.to_string().contains("expected http://HOST:PORT"), "{e}");
        let e = Client::new(&[], t, None).unwrap_err();
        assert!(e.to_string().contains("no etcd endpoint"), "{e}");
        let e = Client::new(&["https://127.0.0.1:2379".into()], t, None).unwrap_err();
        assert!(e.to_string().contains("--etcd-ca-file"), "{e}");
        let tls = EtcdTls {
            ca: "/nonexistent/ca.pem".into(),
            cert: None,
            key: None,
            server_name: None,
        };
        let e = Client::new(&["http://127.0.0.1:2379".into()], t, Some(&tls)).unwrap_err();
        assert!(e.to_string().contains("use https://"), "{e}");
        let e = Client::new(&["https://127.0.0.1:2379".into()], t, Some(&tls)).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }
}
