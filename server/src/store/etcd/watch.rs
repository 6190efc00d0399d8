//! [`Store::watch`](crate::store::Store::watch) on etcd: one etcd watch on the prefix,
//! resumed from the last revision seen after a lost connection, turned into one
//! [`StoreChange`] per etcd revision.

use std::sync::{Arc, Weak};
use std::time::Duration;

use drover_proto::etcd::etcdserverpb as pb;
use drover_proto::etcd::mvccpb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::client::{self, Client};
use super::inner::Inner;
use super::keys::{INDEX_KEY, is_state_key};
use crate::store::{KeyValue, StoreChange, StoreError, WatchEvent, WatchStream};

/// Events buffered between the etcd watch and the store's watcher.
const BUFFER: usize = 256;
/// Longest pause between two attempts to reach etcd again.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(2);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

type Tx = mpsc::Sender<Result<WatchEvent, StoreError>>;

pub(super) fn watch(inner: Arc<Inner>, index: u64) -> WatchStream {
    let (tx, rx) = mpsc::channel(BUFFER);
    tokio::spawn(run(inner, index, tx));
    Box::pin(ReceiverStream::new(rx))
}

/// A watch stream on `[key, end)` from etcd revision `start`, on the current
/// endpoint. Keep the returned sender: dropping it ends the watch.
pub(super) async fn open(
    client: &Client,
    key: Vec<u8>,
    end: Vec<u8>,
    start: i64,
) -> Result<
    (
        mpsc::Sender<pb::WatchRequest>,
        tonic::Streaming<pb::WatchResponse>,
    ),
    StoreError,
> {
    let (i, url, ch) = client.current();
    let (req_tx, req_rx) = mpsc::channel(4);
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key,
                range_end: end,
                start_revision: start,
                fragment: true,
                ..Default::default()
            },
        )),
    };
    // The channel has room: this cannot wait.
    let _ = req_tx.send(create).await;
    match tokio::time::timeout(
        client.timeout(),
        client::watch(ch).watch(ReceiverStream::new(req_rx)),
    )
    .await
    {
        Ok(Ok(resp)) => Ok((req_tx, resp.into_inner())),
        Ok(Err(st)) => {
            client.failed(i);
            Err(client::status_error(url, "watch", &st))
        }
        Err(_) => {
            client.failed(i);
            Err(StoreError::Backend(format!(
                "etcd watch at {url}: no answer within {:?}",
                client.timeout()
            )))
        }
    }
}

/// What one watch response means for its watcher.
pub(super) enum Received {
    /// Events (whole revisions), possibly none.
    Events(Vec<mvccpb::Event>),
    /// The start revision was compacted away.
    Compacted(i64),
    /// etcd cancelled the watch for another reason.
    Cancelled(String),
}

/// Reads a watch stream, putting fragments back together.
pub(super) struct Reader {
    stream: tonic::Streaming<pb::WatchResponse>,
    fragments: Vec<mvccpb::Event>,
}

impl Reader {
    pub(super) fn new(stream: tonic::Streaming<pb::WatchResponse>) -> Self {
        Reader {
            stream,
            fragments: Vec::new(),
        }
    }

    /// The next response; `Err` when the stream broke (reconnect), `Ok(None)` when
    /// etcd ended it.
    pub(super) async fn next(&mut self) -> Result<Option<Received>, tonic::Status> {
        loop {
            let Some(resp) = self.stream.message().await? else {
                return Ok(None);
            };
            if resp.compact_revision > 0 {
                return Ok(Some(Received::Compacted(resp.compact_revision)));
            }
            if resp.canceled {
                return Ok(Some(Received::Cancelled(resp.cancel_reason)));
            }
            if resp.fragment {
                self.fragments.extend(resp.events);
                // A runaway fragment stream must not grow without end: etcd's own
                // requests are bounded, so this is far beyond any real revision.
                if self.fragments.len() > 1_000_000 {
                    return Err(tonic::Status::resource_exhausted(
                        "etcd watch: more than 1000000 events in one fragmented response",
                    ));
                }
                continue;
            }
            let mut events = std::mem::take(&mut self.fragments);
            events.extend(resp.events);
            return Ok(Some(Received::Events(events)));
        }
    }
}

async fn backoff(d: &mut Duration, tx: &Tx) -> bool {
    let pause = *d + Duration::from_millis(fastrand::u64(0..=d.as_millis() as u64 / 2));
    *d = (*d * 2).min(MAX_BACKOFF);
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = tx.closed() => false,
    }
}

async fn run(inner: Arc<Inner>, index: u64, tx: Tx) {
    let mut pause = FIRST_BACKOFF;
    let start = loop {
        match inner.watch_from(index).await {
            Ok(Some(r)) => break r + 1,
            Ok(None) => {
                let _ = tx.send(Ok(WatchEvent::Reset)).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "etcd watch: cannot read where to start; retrying");
                if !backoff(&mut pause, &tx).await {
                    return;
                }
            }
        }
    };
    let client = inner.client.clone();
    let closed = inner.closed.clone();
    let prefix = inner.options.prefix.clone();
    let weak = Arc::downgrade(&inner);
    drop(inner);
    let key = prefix.clone().into_bytes();
    let end = client::prefix_end(&key);
    // The next etcd revision to report.
    let mut next = start;
    loop {
        let opened = tokio::select! {
            r = open(&client, key.clone(), end.clone(), next) => r,
            _ = tx.closed() => return,
            _ = closed.cancelled() => return,
        };
        let (req_tx, stream) = match opened {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, from = next, "etcd watch: reconnecting");
                if !backoff(&mut pause, &tx).await {
                    return;
                }
                continue;
            }
        };
        let mut reader = Reader::new(stream);
        loop {
            let got = tokio::select! {
                r = reader.next() => r,
                _ = tx.closed() => return,
                _ = closed.cancelled() => return,
            };
            match got {
                Ok(Some(Received::Events(events))) => {
                    pause = FIRST_BACKOFF;
                    for change in changes(&prefix, events, &weak) {
                        let (rev, change) = change;
                        next = rev + 1;
                        if let Some(c) = change
                            && tx.send(Ok(WatchEvent::Change(c))).await.is_err()
                        {
                            return;
                        }
                    }
                }
                Ok(Some(Received::Compacted(at))) => {
                    tracing::info!(
                        from = next,
                        compacted = at,
                        "etcd watch: compacted past where it was; the watcher reads again"
                    );
                    let _ = tx.send(Ok(WatchEvent::Reset)).await;
                    return;
                }
                Ok(Some(Received::Cancelled(why))) => {
                    tracing::warn!(reason = %why, from = next, "etcd cancelled the watch; reconnecting");
                    break;
                }
                Ok(None) => {
                    tracing::warn!(from = next, "etcd ended the watch; reconnecting");
                    break;
                }
                Err(st) => {
                    let (i, url, _) = client.current();
                    client.failed(i);
                    tracing::warn!(endpoint = url, error = %client::describe(&st), from = next,
                        "etcd watch broke; reconnecting");
                    break;
                }
            }
        }
        drop(req_tx);
        if !backoff(&mut pause, &tx).await {
            return;
        }
    }
}

/// The events as one change per etcd revision, with that revision; `None` for a
/// revision that touched no state key and did not move the index.
fn changes(
    prefix: &str,
    events: Vec<mvccpb::Event>,
    seen: &Weak<Inner>,
) -> Vec<(i64, Option<StoreChange>)> {
    let mut out: Vec<(i64, StoreChange, bool)> = Vec::new();
    for ev in events {
        let Some(kv) = ev.kv else { continue };
        let rev = kv.mod_revision;
        if out.last().is_none_or(|(r, _, _)| *r != rev) {
            out.push((rev, StoreChange::default(), false));
        }
        let (_, change, any) = out.last_mut().expect("pushed above");
        let Some(key) = kv
            .key
            .strip_prefix(prefix.as_bytes())
            .and_then(|k| std::str::from_utf8(k).ok())
        else {
            tracing::warn!(key = %String::from_utf8_lossy(&kv.key), "etcd watch: skipping a key outside the prefix or not UTF-8");
            continue;
        };
        let put = ev.r#type == mvccpb::event::EventType::Put as i32;
        if key == INDEX_KEY {
            if put {
                match std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    Some(i) => {
                        change.revision = Some(i);
                        *any = true;
                    }
                    None => tracing::warn!(
                        value = %String::from_utf8_lossy(&kv.value),
                        "etcd watch: the index key holds no index"
                    ),
                }
            }
            continue;
        }
        if !is_state_key(key) {
            continue;
        }
        *any = true;
        if put {
            change.puts.push(KeyValue {
                key: key.to_owned(),
                value: kv.value,
                create_revision: u64::try_from(kv.create_revision).unwrap_or(0),
                mod_revision: u64::try_from(rev).unwrap_or(0),
            });
        } else {
            change.deletes.push(key.to_owned());
        }
    }
    out.into_iter()
        .map(|(rev, change, any)| {
            if let Some(i) = change.revision
                && let Some(inner) = seen.upgrade()
            {
                inner.note_seen(i, rev);
            }
            (rev, any.then_some(change))
        })
        .collect()
}
