//! Downloading an artifact over http(s): hyper's client on rustls (ring, the system's
//! roots), redirects followed (at most [`MAX_REDIRECTS`], only to http(s)), the body
//! streamed into a file with its bytes counted against a cap and hashed on the way.

use std::collections::BTreeMap;
use std::io::Write as _;

use bytes::Bytes;
use drover_server_api::taskfiles::{Checksum, ChecksumKind};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use md5::Digest as _;

/// Redirects followed at most (Go's http client's default, which go-getter uses).
pub(crate) const MAX_REDIRECTS: usize = 10;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Why a download failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// The URL cannot be used.
    #[error("bad URL: {0}")]
    Url(String),
    /// Connecting or the exchange failed.
    #[error("{0}")]
    Http(String),
    /// The server answered something other than 2xx.
    #[error("the server answered {0}")]
    Status(http::StatusCode),
    /// More bytes than the cap.
    #[error("larger than {0} bytes (the agent's artifact.max_download_bytes)")]
    TooLarge(u64),
    /// Writing the download failed.
    #[error("cannot keep the download: {0}")]
    Io(#[from] std::io::Error),
}

/// The URL without user info, query or fragment: what logs and messages show (a
/// token in the query string stays out of them).
pub(crate) fn redact(url: &str) -> String {
    match url.parse::<http::Uri>() {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme_str().unwrap_or("?"),
            u.authority()
                .map(|a| a.as_str().rsplit('@').next().unwrap_or_default().to_owned())
                .unwrap_or_default(),
            u.path()
        ),
        Err(_) => "(an unparsable URL)".to_owned(),
    }
}

/// The digest of one of the checksum kinds.
pub(crate) enum Hasher {
    Md5(md5::Md5),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub(crate) fn new(kind: ChecksumKind) -> Hasher {
        match kind {
            ChecksumKind::Md5 => Hasher::Md5(md5::Md5::new()),
            ChecksumKind::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            ChecksumKind::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }
    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }
    fn finish(self) -> Vec<u8> {
        match self {
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        }
    }
}

/// Whether `got` is the `want`ed digest (messages give both in hex).
pub(crate) fn verify(want: &Checksum, got: &[u8]) -> Result<(), String> {
    if want.digest == got {
        return Ok(());
    }
    Err(format!(
        "checksum mismatch: expected {}:{}, the download is {}:{}",
        want.kind.as_str(),
        hex::encode(&want.digest),
        want.kind.as_str(),
        hex::encode(got)
    ))
}

/// The http(s) client of the artifact hook, made once.
pub(crate) struct Downloader {
    client: Result<HttpsClient, String>,
}

impl Downloader {
    /// A client trusting the system's root certificates (none found: only http works,
    /// and https fails verifying the server's certificate).
    pub(crate) fn new() -> Downloader {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(b) => Ok(b),
            Err(e) => {
                tracing::warn!(
                    "no system root certificates for https artifacts ({e}); https downloads will fail"
                );
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map(|b| {
                        let c = b
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth();
                        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(c)
                    })
                    .map_err(|e| format!("cannot configure TLS: {e}"))
            }
        };
        Downloader {
            client: builder.map(|b| {
                Client::builder(TokioExecutor::new())
                    .build(b.https_or_http().enable_http1().build())
            }),
        }
    }

    /// GET `url` with `headers` into `out`, at most `max_bytes`, hashing with `hasher`.
    /// Returns the bytes written. The caller bounds the time.
    pub(crate) async fn fetch(
        &self,
        url: &str,
        headers: &BTreeMap<String, String>,
        max_bytes: u64,
        out: &mut std::fs::File,
        mut hasher: Option<&mut Option<Hasher>>,
    ) -> Result<u64, FetchError> {
        let mut uri: http::Uri = url
            .parse()
            .map_err(|e| FetchError::Url(format!("{}: {e}", redact(url))))?;
        let mut redirects = 0;
        // The job's headers (credentials, often) go only to the host it named: a
        // redirect elsewhere is followed without them, as Go's client does.
        // Scheme and host: an https URL redirected to http on the same host would
        // send them in clear.
        let origin_of = |u: &http::Uri| {
            (
                u.scheme_str().map(str::to_ascii_lowercase),
                u.authority().map(|a| a.as_str().to_ascii_lowercase()),
            )
        };
        let origin = origin_of(&uri);
        let resp = loop {
            match uri.scheme_str() {
                Some("http") | Some("https") => {}
                _ => {
                    return Err(FetchError::Url(format!(
                        "{}: only http and https are fetched",
                        redact(&uri.to_string())
                    )));
                }
            }
            let mut req = http::Request::get(uri.clone());
            let same_host = origin_of(&uri) == origin;
            for (k, v) in headers.iter().filter(|_| same_host) {
                req = req.header(k.as_str(), v.as_str());
            }
            if !headers.keys().any(|k| k.eq_ignore_ascii_case("user-agent")) {
                req = req.header(http::header::USER_AGENT, "drover-artifact");
            }
            let req = req
                .body(Empty::<Bytes>::new())
                .map_err(|e| FetchError::Url(e.to_string()))?;
            let client = self
                .client
                .as_ref()
                .map_err(|e| FetchError::Http(e.clone()))?;
            let resp = client
                .request(req)
                .await
                .map_err(|e| FetchError::Http(error_chain(&e)))?;
            if resp.status().is_redirection()
                && let Some(loc) = resp.headers().get(http::header::LOCATION)
            {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(FetchError::Http(format!(
                        "more than {MAX_REDIRECTS} redirects"
                    )));
                }
                let loc = loc
                    .to_str()
                    .map_err(|_| FetchError::Http("a redirect to a non-text Location".into()))?;
                uri = resolve(&uri, loc)?;
                continue;
            }
            break resp;
        };
        if !resp.status().is_success() {
            return Err(FetchError::Status(resp.status()));
        }
        if let Some(len) = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > max_bytes
        {
            return Err(FetchError::TooLarge(max_bytes));
        }
        let mut body = resp.into_body();
        let mut written: u64 = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| FetchError::Http(error_chain(&e)))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            written += data.len() as u64;
            if written > max_bytes {
                return Err(FetchError::TooLarge(max_bytes));
            }
            if let Some(Some(h)) = hasher.as_deref_mut() {
                h.update(&data);
            }
            // Small synchronous writes into the agent's own file: not worth a thread.
            out.write_all(&data)?;
        }
        out.flush()?;
        Ok(written)
    }
}

/// The digest of what `hasher` saw.
pub(crate) fn finish(hasher: Hasher) -> Vec<u8> {
    hasher.finish()
}

/// A Location header against the URL that answered it.
fn resolve(base: &http::Uri, loc: &str) -> Result<http::Uri, FetchError> {
    let bad = |e: &dyn std::fmt::Display| FetchError::Http(format!("bad redirect: {e}"));
    let target: http::Uri = loc.parse().map_err(|e| bad(&e))?;
    if target.scheme().is_some() {
        return Ok(target);
    }
    let mut parts = base.clone().into_parts();
    let pq = if loc.starts_with('/') {
        loc.to_owned()
    } else {
        let path = base.path();
        let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        format!("{dir}{loc}")
    };
    parts.path_and_query = Some(pq.parse().map_err(|e| bad(&e))?);
    http::Uri::from_parts(parts).map_err(|e| bad(&e))
}

/// An error with its causes, for messages.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_in_messages() {
        assert_eq!(
            redact("https://user:secret@example.com/a/b.tgz?token=xyz#f"),
            "https://example.com/a/b.tgz"
        );
        assert_eq!(redact("http://h:8080/x"), "http://h:8080/x");
    }

    #[test]
    fn redirects_resolve_against_the_answering_url() {
        let base: http::Uri = "http://h/a/b?q".parse().unwrap();
        assert_eq!(resolve(&base, "/c").unwrap().to_string(), "http://h/c");
        assert_eq!(
            resolve(&base, "c.tgz").unwrap().to_string(),
            "http://h/a/c.tgz"
        );
        assert_eq!(
            resolve(&base, "https://o/x").unwrap().to_string(),
            "https://o/x"
        );
    }
}
