//! `GET /v1/metrics`: the server's metrics (see `crate::metrics` and
//! docs/metrics.md), and the count and latency of every HTTP request ([`record`]).
//!
//! As Nomad 1.0's (`command/agent/metrics_endpoint.go`: no token is resolved, no ACL
//! checked) it needs no token: it sits beside the JWKS, outside the token check, so
//! that a Prometheus scraper needs no credential. What it shows are counts and
//! latencies; the series per allocation task (ids and task names of every namespace)
//! are on the agent's own socket only, as Nomad publishes them only when told to.
//!
//! A server with a local agent (`drover agent --dev`) answers with the agent's
//! metrics too, read from the agent's socket, in one exposition as Nomad's single
//! agent does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use drover_metrics::Format;
use http_body_util::BodyExt as _;

use crate::metrics::HttpLabels;
use crate::server::Server;

/// How long the local agent may take to answer (it samples its tasks' use).
const AGENT_METRICS_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metrics answer taken from the local agent.
const AGENT_METRICS_MAX_BYTES: usize = 16 * 1024 * 1024;

#[derive(Clone)]
pub(super) struct Metrics {
    pub server: Arc<Server>,
    /// The local agent's API socket (dev agent), whose metrics are added.
    pub local_agent: Option<Arc<PathBuf>>,
}

pub(super) async fn metrics(
    State(m): State<Metrics>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let format_param = super::serde_urlencoded_pairs(req.uri().query().unwrap_or(""))
        .ok()
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "format"))
        .map(|(_, v)| v);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = match Format::negotiate(format_param.as_deref(), accept) {
        Ok(f) => f,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let mut families = m.server.metrics_families();
    if let Some(socket) = &m.local_agent {
        match agent_families(socket).await {
            Ok(agent) => families.push_str(&agent),
            // The server's own metrics still answer; the gap is logged.
            Err(e) => tracing::warn!(
                socket = %socket.display(),
                "metrics: the local agent's metrics are left out: {e}"
            ),
        }
    }
    (
        [(header::CONTENT_TYPE, format.content_type())],
        drover_metrics::render(&families, format),
    )
        .into_response()
}

/// The local agent's metrics as OpenMetrics families (no `# EOF`).
async fn agent_families(socket: &std::path::Path) -> Result<String, String> {
    let fetch = async {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "the connection to the local agent ended");
            }
        });
        let request = http::Request::builder()
            .method(http::Method::GET)
            .uri("/v1/metrics?format=openmetrics&allocations=false")
            .header(header::HOST, "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if !answer.status().is_success() {
            return Err(format!("the agent answered {}", answer.status()));
        }
        let body = http_body_util::Limited::new(answer.into_body(), AGENT_METRICS_MAX_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        String::from_utf8(body.to_vec()).map_err(|_| "the answer is not UTF-8".to_owned())
    };
    let text = tokio::time::timeout(AGENT_METRICS_TIMEOUT, fetch)
        .await
        .map_err(|_| format!("no answer within {AGENT_METRICS_TIMEOUT:?}"))??;
    let mut families = drover_metrics::strip_eof(&text).to_owned();
    if !families.is_empty() && !families.ends_with('\n') {
        families.push('\n');
    }
    Ok(families)
}

/// Count and time every request by route template, method and status class (the
/// outermost layer: refusals of the token check count too). Time is to the
/// response head.
pub(super) async fn record(
    State(server): State<Arc<Server>>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = drover_metrics::method_label(req.method().as_str());
    let resp = next.run(req).await;
    let labels = HttpLabels {
        route: drover_metrics::LabelText(route),
        method,
        status: drover_metrics::status_class(resp.status().as_u16()),
    };
    let m = &server.core.metrics;
    m.http_requests.get_or_create(&labels).inc();
    m.http_duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    resp
}
