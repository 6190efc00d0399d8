//! The cluster API on the agent's socket: `/v1/jobs`, `/v1/nodes`, ... are not the
//! agent's own, so it forwards them to a server over the `Api.Forward` RPC and streams
//! the answer back unchanged (status, `X-Nomad-Index` and Nomad's other headers,
//! body). Blocking queries and the event stream pass through: the RPC lasts as long
//! as the server holds the query.
//!
//! The agent sends its own cluster token (`token_file`) with every forwarded request;
//! whoever can reach the agent's socket (mode 0600) acts with the agent's rights, as
//! with every other endpoint of the socket, unless the servers enforce ACLs: then the
//! caller's own `X-Nomad-Token` (passed on) says what it may do.
//!
//! The agent forwards over the cluster client's connections ([`Forwarder::new`] with
//! its channels and token); [`Forwarder::from_config`] makes channels of its own.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use drover_plugin_sdk::proto::drover::cluster::v1::ForwardRequest;
use drover_plugin_sdk::proto::drover::cluster::v1::api_client::ApiClient;
use tokio_stream::StreamExt as _;
use tonic::transport::{Channel, Endpoint};

use crate::config::{AgentConfig, ClientTls};

/// Largest request body forwarded (the server refuses more than this anyway).
pub const MAX_FORWARD_BODY: usize = 4 * 1024 * 1024;

/// Largest message accepted from the server (one piece of an answer).
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// Longest a forwarded request may take: a blocking query's longest wait (5 minutes)
/// and a margin. A server that accepted the connection but never answers must not
/// hold the caller for ever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(6 * 60);

/// How long connecting to a server may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Request headers the server acts on; nothing else is forwarded. The caller's own
/// `X-Nomad-Token` goes on too: a server with ACLs checks it (the agent's cluster token
/// authenticates the RPC, and is no user credential there); one without ignores it.
const FORWARDED_HEADERS: [&str; 3] = ["content-type", "accept", "x-nomad-token"];

/// Forwards requests to the configured servers, in order, the next one when a server
/// cannot be reached.
pub struct Forwarder {
    servers: Vec<(String, Channel)>,
    /// The token, or why it could not be read (every forwarded request then fails
    /// with that reason instead of reaching a server without it).
    token: Result<Option<tonic::metadata::AsciiMetadataValue>, String>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token never reaches a log line, a panic message or `{:?}` output.
        let token = match &self.token {
            Ok(None) => "none",
            Ok(Some(_)) => "<redacted>",
            Err(_) => "<unreadable>",
        };
        f.debug_struct("Forwarder")
            .field(
                "servers",
                &self.servers.iter().map(|(a, _)| a).collect::<Vec<_>>(),
            )
            .field("token", &token)
            .finish()
    }
}

/// A setting that makes forwarding impossible.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ForwardError(String);

/// The `x-drover-token` metadata key.
const TOKEN_KEY: &str = "x-drover-token";

/// An error as the server (and Nomad) answers them: the status and a plain-text
/// message.
fn text_error(status: StatusCode, message: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message,
    )
        .into_response()
}

fn tls_config(
    tls: &ClientTls,
    host: &str,
) -> Result<tonic::transport::ClientTlsConfig, ForwardError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            ForwardError(format!(
                "cannot read the cluster TLS {what} {}: {e}",
                path.display()
            ))
        })
    };
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&tls.ca_file, "CA file")?))
        .domain_name(tls.server_name.clone().unwrap_or_else(|| host.to_owned()));
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read(cert, "certificate file")?,
                read(key, "key file")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(ForwardError(
                "cluster TLS: give both cert_file and key_file, or neither".into(),
            ));
        }
    }
    Ok(config)
}

impl Forwarder {
    /// A forwarder over channels made elsewhere (the cluster client's connection:
    /// `(address, channel)` per server, in the order to try them) with `token`.
    pub fn new(servers: Vec<(String, Channel)>, token: Option<&str>) -> Forwarder {
        let token = match token {
            None => Ok(None),
            Some(t) => t
                .parse()
                .map(Some)
                .map_err(|_| "the cluster token holds characters a header cannot carry".to_owned()),
        };
        Forwarder { servers, token }
    }

    /// A forwarder to `config.servers`, or `None` when the agent is no cluster client.
    /// Nothing connects until the first request.
    pub fn from_config(config: &AgentConfig) -> Result<Option<Forwarder>, ForwardError> {
        if config.servers.is_empty() {
            return Ok(None);
        }
        let mut servers = Vec::new();
        for addr in &config.servers {
            let scheme = if config.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
                .map_err(|e| ForwardError(format!("server address {addr:?}: {e}")))?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true);
            if let Some(tls) = &config.tls {
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                endpoint = endpoint
                    .tls_config(tls_config(tls, host)?)
                    .map_err(|e| ForwardError(format!("cluster TLS for {addr}: {e}")))?;
            }
            servers.push((addr.clone(), endpoint.connect_lazy()));
        }
        let token = match &config.token_file {
            None => Ok(None),
            Some(file) => crate::private_file::read_token(file)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    t.parse().map(Some).map_err(|_| {
                        format!(
                            "the token in {} holds characters a header cannot carry",
                            file.display()
                        )
                    })
                }),
        };
        if let Err(e) = &token {
            tracing::error!("forwarding the cluster API will fail: {e}");
        }
        Ok(Some(Forwarder { servers, token }))
    }

    /// `GET path_and_query` on a server for the agent itself (templates: services,
    /// variables): the status and the body (at most [`MAX_FORWARD_BODY`] bytes). A
    /// task's workload identity token, when given, goes as `X-Nomad-Token` (the
    /// server reads variables with the task's rights, not the agent's).
    pub async fn get(
        &self,
        path_and_query: &str,
        workload_token: Option<&str>,
    ) -> Result<(u16, bytes::Bytes), String> {
        let mut headers = HashMap::new();
        headers.insert("accept".to_owned(), "application/json".to_owned());
        if let Some(t) = workload_token {
            headers.insert("x-nomad-token".to_owned(), t.to_owned());
        }
        let message = ForwardRequest {
            method: "GET".to_owned(),
            path_and_query: path_and_query.to_owned(),
            headers,
            body: Vec::new(),
        };
        let answer = self.send(message).await;
        let status = answer.status().as_u16();
        let body = axum::body::to_bytes(answer.into_body(), MAX_FORWARD_BODY)
            .await
            .map_err(|e| format!("reading the server's answer: {e}"))?;
        Ok((status, body))
    }

    /// Forward `req` to a server and stream its answer back.
    pub async fn forward(&self, req: Request) -> Response {
        // An unreadable token fails before the body is read.
        if let Err(e) = &self.token {
            return text_error(StatusCode::SERVICE_UNAVAILABLE, e.clone());
        }
        let (parts, body) = req.into_parts();
        let body = match axum::body::to_bytes(body, MAX_FORWARD_BODY).await {
            Ok(b) => b,
            Err(_) => {
                return text_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request body larger than {} MiB",
                        MAX_FORWARD_BODY / (1024 * 1024)
                    ),
                );
            }
        };
        let mut headers = HashMap::new();
        for name in FORWARDED_HEADERS {
            if let Some(v) = parts.headers.get(name).and_then(|v| v.to_str().ok()) {
                headers.insert(name.to_owned(), v.to_owned());
            }
        }
        let message = ForwardRequest {
            method: parts.method.to_string(),
            path_and_query: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.to_string()),
            headers,
            body: body.to_vec(),
        };
        self.send(message).await
    }

    /// Send one forwarded request to the first server that answers.
    async fn send(&self, message: ForwardRequest) -> Response {
        let token = match &self.token {
            Ok(t) => t.clone(),
            Err(e) => return text_error(StatusCode::SERVICE_UNAVAILABLE, e.clone()),
        };
        let mut last_error = String::new();
        for (addr, channel) in &self.servers {
            let mut client = ApiClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE);
            let mut request = tonic::Request::new(message.clone());
            request.set_timeout(REQUEST_TIMEOUT);
            if let Some(t) = &token {
                request.metadata_mut().insert(TOKEN_KEY, t.clone());
            }
            match client.forward(request).await {
                Ok(answer) => return stream_answer(addr, answer.into_inner()).await,
                // Not reached (refused, down): the next server may answer.
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tracing::debug!(server = %addr, error = %status.message(), "server unavailable for a forwarded request");
                    last_error = format!("{addr}: {}", status.message());
                }
                Err(status) if status.code() == tonic::Code::Unauthenticated => {
                    return text_error(
                        StatusCode::UNAUTHORIZED,
                        format!(
                            "server {addr} refused this agent's token ({}); check the agent's token_file",
                            status.message()
                        ),
                    );
                }
                Err(status) => {
                    return text_error(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "server {addr} failed the forwarded request: {}",
                            status.message()
                        ),
                    );
                }
            }
        }
        text_error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no cluster server answers ({last_error})"),
        )
    }
}

/// The server's answer as an HTTP response: the first message's status and headers,
/// then every message's body piece as it arrives.
async fn stream_answer(
    addr: &str,
    mut answer: tonic::codec::Streaming<
        drover_plugin_sdk::proto::drover::cluster::v1::ForwardResponse,
    >,
) -> Response {
    let first = match answer.message().await {
        Ok(Some(first)) => first,
        Ok(None) => {
            return text_error(
                StatusCode::BAD_GATEWAY,
                format!("server {addr} sent an empty answer"),
            );
        }
        Err(status) => {
            return text_error(
                StatusCode::BAD_GATEWAY,
                format!("server {addr}: {}", status.message()),
            );
        }
    };
    let status = u16::try_from(first.status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let head = axum::body::Bytes::from(first.body);
    let rest = answer.map(|piece| match piece {
        Ok(p) => Ok(axum::body::Bytes::from(p.body)),
        Err(status) => Err(std::io::Error::other(status.message().to_owned())),
    });
    let body = tokio_stream::once(Ok::<_, std::io::Error>(head)).chain(rest);
    let mut resp = Response::new(Body::from_stream(body));
    *resp.status_mut() = status;
    for (k, v) in first.headers {
        // Hop-by-hop headers belong to the server's own connection, not this one.
        if matches!(
            k.as_str(),
            "connection" | "transfer-encoding" | "content-length"
        ) {
            continue;
        }
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            resp.headers_mut().insert(k, v);
        }
    }
    if !resp.headers().contains_key(header::CONTENT_TYPE) {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    resp
}

/// A stand-in for a server's `Api.Forward` (written on the cluster-rpc branch): it
/// records what arrives and answers as told, so the agent's side can be tested alone.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    use drover_plugin_sdk::proto::drover::cluster::v1::api_server::{Api, ApiServer};
    use drover_plugin_sdk::proto::drover::cluster::v1::{ForwardRequest, ForwardResponse};

    /// What the fake server saw: the request and the token metadata.
    pub type Seen = Arc<Mutex<Vec<(ForwardRequest, Option<String>)>>>;

    struct Fake {
        seen: Seen,
        token: Option<String>,
    }

    #[tonic::async_trait]
    impl Api for Fake {
        type ForwardStream =
            tokio_stream::Iter<std::vec::IntoIter<Result<ForwardResponse, tonic::Status>>>;

        async fn forward(
            &self,
            request: tonic::Request<ForwardRequest>,
        ) -> Result<tonic::Response<Self::ForwardStream>, tonic::Status> {
            let token = request
                .metadata()
                .get("x-drover-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if token != self.token {
                return Err(tonic::Status::unauthenticated("invalid token"));
            }
            let req = request.into_inner();
            let echo = format!(
                "{} {} {}",
                req.method,
                req.path_and_query,
                String::from_utf8_lossy(&req.body)
            );
            self.seen.lock().unwrap().push((req, token));
            let first = ForwardResponse {
                status: 201,
                headers: [
                    ("x-nomad-index".to_owned(), "7".to_owned()),
                    ("content-type".to_owned(), "application/json".to_owned()),
                ]
                .into(),
                body: b"[\"".to_vec(),
            };
            let rest = ForwardResponse {
                status: 0,
                headers: Default::default(),
                body: format!("{echo}\"]").into_bytes(),
            };
            Ok(tonic::Response::new(tokio_stream::iter(vec![
                Ok(first),
                Ok(rest),
            ])))
        }
    }

    /// Serve a fake `Api` on 127.0.0.1 that wants `token`; its address and what it saw.
    pub async fn fake_server(token: Option<&str>) -> (String, Seen) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Seen::default();
        let fake = Fake {
            seen: seen.clone(),
            token: token.map(str::to_owned),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ApiServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (addr, seen)
    }

    /// An address nothing listens on.
    pub async fn dead_address() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{dead_address, fake_server};
    use super::*;

    /// A token file only its owner can read, as the cluster client requires.
    fn write_private(path: &std::path::Path, text: &str) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn config(servers: Vec<String>, token_file: Option<std::path::PathBuf>) -> AgentConfig {
        AgentConfig {
            servers,
            token_file,
            ..Default::default()
        }
    }

    async fn body_of(resp: Response) -> (StatusCode, Option<String>, String) {
        let status = resp.status();
        let index = resp
            .headers()
            .get("x-nomad-index")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, index, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn forwards_to_the_first_server_that_answers_with_the_agents_token() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        write_private(&token, "s3cret\n");
        let (live, seen) = fake_server(Some("s3cret")).await;
        let f = Forwarder::from_config(&config(vec![dead_address().await, live], Some(token)))
            .unwrap()
            .unwrap();
        let req = Request::builder()
            .method("PUT")
            .uri("/v1/jobs?index=3&wait=1s")
            .header("content-type", "application/json")
            .header("x-nomad-token", "the caller's")
            .header("x-drover-token", "never forwarded")
            .body(Body::from("{\"job\":1}"))
            .unwrap();
        let (status, index, body) = body_of(f.forward(req).await).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(index.as_deref(), Some("7"));
        assert_eq!(body, "[\"PUT /v1/jobs?index=3&wait=1s {\"job\":1}\"]");
        let seen = seen.lock().unwrap();
        let (req, token) = &seen[0];
        assert_eq!(token.as_deref(), Some("s3cret"));
        assert_eq!(
            req.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
        // The caller's ACL token goes along (the server checks it when ACLs are on);
        // the RPC itself carries the agent's.
        assert_eq!(
            req.headers.get("x-nomad-token").map(String::as_str),
            Some("the caller's")
        );
        assert!(!req.headers.contains_key("x-drover-token"));
    }

    #[tokio::test]
    async fn refusals_and_unreachable_servers_are_reported_as_such() {
        let (live, seen) = fake_server(Some("right")).await;
        let dir = tempfile::tempdir().unwrap();
        let wrong = dir.path().join("wrong");
        write_private(&wrong, "wrong");
        let f = Forwarder::from_config(&config(vec![live.clone()], Some(wrong)))
            .unwrap()
            .unwrap();
        let get = || {
            Request::builder()
                .uri("/v1/nodes")
                .body(Body::empty())
                .unwrap()
        };
        let (status, _, body) = body_of(f.forward(get()).await).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            body.contains(&format!("server {live} refused this agent's token")),
            "{body}"
        );
        assert!(seen.lock().unwrap().is_empty());

        let dead = dead_address().await;
        let f = Forwarder::from_config(&config(vec![dead.clone()], None))
            .unwrap()
            .unwrap();
        let (status, _, body) = body_of(f.forward(get()).await).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("no cluster server answers") && body.contains(&dead),
            "{body}"
        );

        let missing = dir.path().join("missing");
        let f = Forwarder::from_config(&config(vec![live], Some(missing.clone())))
            .unwrap()
            .unwrap();
        let (status, _, body) = body_of(f.forward(get()).await).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains(&format!("token file {}", missing.display())),
            "{body}"
        );

        let big = Request::builder()
            .method("PUT")
            .uri("/v1/jobs")
            .body(Body::from(vec![b'x'; MAX_FORWARD_BODY + 1]))
            .unwrap();
        let f = Forwarder::from_config(&config(vec![dead], None))
            .unwrap()
            .unwrap();
        let (status, _, body) = body_of(f.forward(big).await).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(body.contains("larger than 4 MiB"), "{body}");
    }

    #[tokio::test]
    async fn a_token_file_others_can_read_is_refused_and_debug_hides_the_token() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        write_private(&token, "s3cret-t0ken");
        let f = Forwarder::from_config(&config(vec![dead_address().await], Some(token.clone())))
            .unwrap()
            .unwrap();
        let shown = format!("{f:?}");
        assert!(!shown.contains("s3cret-t0ken"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let shown = format!("{:?}", Forwarder::new(Vec::new(), Some("s3cret-t0ken")));
        assert!(!shown.contains("s3cret-t0ken"), "{shown}");

        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = crate::private_file::read_token(&token)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&token.display().to_string()) && err.contains("644"),
            "{err}"
        );
        let f = Forwarder::from_config(&config(vec![dead_address().await], Some(token)))
            .unwrap()
            .unwrap();
        let req = Request::builder()
            .uri("/v1/nodes")
            .body(Body::empty())
            .unwrap();
        let (status, _, body) = body_of(f.forward(req).await).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("every user"), "{body}");
    }

    #[tokio::test]
    async fn a_forwarder_over_given_channels_sends_the_given_token() {
        let (live, seen) = fake_server(Some("t0k")).await;
        let channel = Endpoint::from_shared(format!("http://{live}"))
            .unwrap()
            .connect_lazy();
        let f = Forwarder::new(vec![(live, channel)], Some("t0k"));
        let req = Request::builder()
            .uri("/v1/nodes")
            .body(Body::empty())
            .unwrap();
        let (status, _, _) = body_of(f.forward(req).await).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(seen.lock().unwrap()[0].1.as_deref(), Some("t0k"));
    }

    #[test]
    fn no_servers_no_forwarder_and_bad_settings_are_named() {
        assert!(
            Forwarder::from_config(&AgentConfig::default())
                .unwrap()
                .is_none()
        );
        let err = Forwarder::from_config(&config(vec!["not an address".into()], None)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("server address \"not an address\""),
            "{err}"
        );
        let mut c = config(vec!["127.0.0.1:1".into()], None);
        c.tls = Some(ClientTls {
            ca_file: "/nonexistent/ca.pem".into(),
            cert_file: None,
            key_file: None,
            server_name: None,
        });
        let err = Forwarder::from_config(&c).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read the cluster TLS CA file /nonexistent/ca.pem"),
            "{err}"
        );
    }
}
