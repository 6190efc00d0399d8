//! The cluster API on the agent's socket: `/v1/jobs`, `/v1/nodes`, ... are not the
//! agent's own, so it forwards them to a server over the `Api.Forward` RPC and streams
//! the answer back unchanged (status, `X-Drover-Index`, body). Blocking queries pass
//! through: the RPC lasts as long as the server holds the query.
//!
//! The agent sends its own cluster token (`token_file`) with every forwarded request;
//! whoever can reach the agent's socket (mode 0600) acts with the agent's rights, as
//! with every other endpoint of the socket.
//!
//! The channels here are this module's own. The cluster client (`cluster::run`) holds
//! connections to the same servers; sharing one channel per server is the next step
//! once both exist on one branch.

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

/// How long connecting to a server may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Request headers the server acts on; nothing else is forwarded (never a token).
const FORWARDED_HEADERS: [&str; 2] = ["content-type", "accept"];

/// Forwards requests to the configured servers, in order, the next one when a server
/// cannot be reached.
#[derive(Debug)]
pub struct Forwarder {
    servers: Vec<(String, Channel)>,
    /// The token, or why it could not be read (every forwarded request then fails
    /// with that reason instead of reaching a server without it).
    token: Result<Option<tonic::metadata::AsciiMetadataValue>, String>,
}

/// A setting that makes forwarding impossible.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ForwardError(String);

/// The `x-drover-token` metadata key.
const TOKEN_KEY: &str = "x-drover-token";

fn json_error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
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

/// The token in `file`, trimmed; an empty file is an error (a token of nothing would
/// let anyone in on a server that accepted it).
pub fn read_token(file: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read the token file {}: {e}", file.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", file.display()));
    }
    Ok(token.to_owned())
}

impl Forwarder {
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
            Some(file) => read_token(file).and_then(|t| {
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

    /// Forward `req` to a server and stream its answer back.
    pub async fn forward(&self, req: Request) -> Response {
        let token = match &self.token {
            Ok(t) => t.clone(),
            Err(e) => return json_error(StatusCode::SERVICE_UNAVAILABLE, e.clone()),
        };
        let (parts, body) = req.into_parts();
        let body = match axum::body::to_bytes(body, MAX_FORWARD_BODY).await {
            Ok(b) => b,
            Err(_) => {
                return json_error(
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
        let mut last_error = String::new();
        for (addr, channel) in &self.servers {
            let mut client = ApiClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE);
            let mut request = tonic::Request::new(message.clone());
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
                    return json_error(
                        StatusCode::UNAUTHORIZED,
                        format!(
                            "server {addr} refused this agent's token ({}); check the agent's token_file",
                            status.message()
                        ),
                    );
                }
                Err(status) => {
                    return json_error(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "server {addr} failed the forwarded request: {}",
                            status.message()
                        ),
                    );
                }
            }
        }
        json_error(
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
            return json_error(
                StatusCode::BAD_GATEWAY,
                format!("server {addr} sent an empty answer"),
            );
        }
        Err(status) => {
            return json_error(
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
