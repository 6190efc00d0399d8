//! `GET /v1/event/stream`: Nomad's event stream as ndjson — one
//! `{"Index": N, "Events": [...]}` per commit with events the subscription selects,
//! `{}` at once and then every [`HEARTBEAT`] so that proxies and clients see the
//! stream alive. Query: `topic=Job:*` (repeatable; `Topic` alone is `Topic:*`; none:
//! every topic), `index` (start at that commit, or at the oldest one kept), and
//! `namespace`.

use std::time::Duration;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use drover_server_api::Index;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::scope::Scope;
use super::{Api, ApiError, ApiResult, Params, wire};
use crate::events::{EventBatch, Subscription, Topic};

/// How often an idle stream says it is alive (Nomad's 10 s).
pub(super) const HEARTBEAT: Duration = Duration::from_secs(10);

/// What a subscription selects: `(topic, key)` pairs, `None` for every topic.
#[derive(Clone)]
pub(super) struct Filter {
    topics: Vec<(Option<Topic>, String)>,
    /// The namespace asked for (`*`: those where the caller may `read-job`).
    scope: Scope,
}

impl Filter {
    pub(super) fn parse(q: &Params, scope: Scope) -> Result<Filter, ApiError> {
        let mut topics = Vec::new();
        for raw in q.all("topic") {
            let (topic, key) = match raw.split(':').collect::<Vec<_>>().as_slice() {
                [t] => (*t, "*"),
                [t, k] => (*t, *k),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "Invalid topic query: error parsing topics: Invalid key value pair for topic, topic: {raw}"
                    )));
                }
            };
            let topic = match topic {
                "*" => None,
                t => Some(Topic::parse(t).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "Invalid topic query: unknown topic {t:?} (Drover has Job, Evaluation, Allocation, Node and *)"
                    ))
                })?),
            };
            topics.push((topic, key.to_owned()));
        }
        if topics.is_empty() {
            topics.push((None, "*".to_owned()));
        }
        Ok(Filter { topics, scope })
    }

    /// The batch's events this filter selects, as Nomad's JSON line (`None`: none).
    pub(super) fn line(&self, batch: &EventBatch) -> Option<Bytes> {
        let events: Vec<serde_json::Value> = batch
            .events
            .iter()
            .filter(|e| {
                // Nodes have no namespace (Nomad's): they pass any namespace filter.
                e.namespace()
                    .is_none_or(|ns| self.scope.lists(ns, "read-job"))
                    && self.topics.iter().any(|(t, k)| e.matches(*t, k))
            })
            .map(|e| {
                json!({
                    "Topic": e.topic.name(),
                    "Type": e.kind,
                    "Key": e.key,
                    "Namespace": e.namespace().unwrap_or(""),
                    "FilterKeys": if e.filter_keys.is_empty() { None } else { Some(&e.filter_keys) },
                    "Index": e.index,
                    "Payload": wire::event_payload(&e.payload),
                })
            })
            .collect();
        if events.is_empty() {
            return None;
        }
        let mut line = serde_json::to_vec(&json!({ "Index": batch.index, "Events": events }))
            .unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        Some(Bytes::from(line))
    }
}

struct Stream {
    sub: Subscription,
    filter: Filter,
    heartbeat: tokio::time::Interval,
    stop: Option<CancellationToken>,
    /// The first `{}` was sent (Nomad's: it tells the client the stream is open).
    opened: bool,
    done: bool,
}

impl Stream {
    async fn next_line(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.opened {
            self.opened = true;
            return Some(Bytes::from_static(b"{}\n"));
        }
        let stopped = async {
            match &self.stop {
                Some(s) => s.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                // A stream closing ends at once.
                biased;
                () = &mut stopped => return None,
                _ = self.heartbeat.tick() => return Some(Bytes::from_static(b"{}\n")),
                batch = self.sub.next() => match batch {
                    Ok(batch) => {
                        if let Some(line) = self.filter.line(&batch) {
                            return Some(line);
                        }
                    }
                    Err(e) => {
                        // A reader left behind: say why, then end (it resubscribes).
                        self.done = true;
                        let mut line = serde_json::to_vec(&json!({ "Error": e.to_string() }))
                            .unwrap_or_default();
                        line.push(b'\n');
                        return Some(Bytes::from(line));
                    }
                },
            }
        }
    }
}

pub(super) async fn stream(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index: Index = match q.get("index") {
        None | Some("") => 0,
        Some(i) => i
            .parse()
            .map_err(|e| ApiError::bad_request(format!("Unable to parse index: {e}")))?,
    };
    let filter = Filter::parse(&q, scope)?;
    let sub = api.server.subscribe_events(index);
    let mut heartbeat =
        tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = Stream {
        sub,
        filter,
        heartbeat,
        stop: stop.map(|Extension(s)| s),
        opened: false,
        done: false,
    };
    let body = futures_util::stream::unfold(state, |mut st| async move {
        st.next_line()
            .await
            .map(|line| (Ok::<_, std::convert::Infallible>(line), st))
    });
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}
