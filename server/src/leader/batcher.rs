//! The one batch-commit loop the plan applier and the client update batcher share:
//! take every request waiting (up to a bound), commit them in one transaction, and
//! answer each with its own verdict, or all with the commit's error. A thousand
//! clients reporting at once, or a dozen workers planning, cost a few commits.

use drover_server_api::Index;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;

/// A request in a batcher's queue, with where its answer goes.
pub(crate) struct Queued<Q, A> {
    pub request: Q,
    pub reply: oneshot::Sender<Result<A, ServerError>>,
}

/// Queue `request` on `queue` and wait for its answer; `None` when the loop is gone
/// (the term ended, or the server shuts down).
pub(crate) async fn submit<Q, A>(
    queue: &mpsc::Sender<Queued<Q, A>>,
    request: Q,
) -> Option<Result<A, ServerError>> {
    let (reply, answer) = oneshot::channel();
    queue.send(Queued { request, reply }).await.ok()?;
    answer.await.ok()
}

/// Commit what waits on `rx`, at most `max` requests at once, until `stop`.
/// `commit` builds and commits one batch and gives one verdict per request;
/// `answer` turns a verdict and the commit's index into the request's answer. When
/// the commit fails, every request of the batch is answered `Unavailable`, naming
/// `what` was not committed.
pub(crate) async fn run<Q, V, A, C>(
    mut rx: mpsc::Receiver<Queued<Q, A>>,
    max: usize,
    stop: CancellationToken,
    what: &str,
    commit: impl Fn(Vec<Q>) -> C,
    answer: impl Fn(V, Index) -> Result<A, ServerError>,
) where
    C: Future<Output = Result<(Index, Vec<V>), ServerError>>,
{
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let (requests, replies): (Vec<Q>, Vec<_>) =
            batch.into_iter().map(|q| (q.request, q.reply)).unzip();
        match commit(requests).await {
            Ok((index, verdicts)) => {
                for (reply, v) in replies.into_iter().zip(verdicts) {
                    let _ = reply.send(answer(v, index));
                }
            }
            Err(e) => {
                tracing::error!("{what}: commit failed: {e}");
                let msg = e.to_string();
                for reply in replies {
                    let _ = reply.send(Err(ServerError::Unavailable(format!(
                        "{what} not committed: {msg}"
                    ))));
                }
            }
        }
    }
}
