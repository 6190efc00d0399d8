//! go-plugin 1.6's gRPC broker multiplexing (`PLUGIN_MULTIPLEX_GRPC`): one yamux session
//! over the host's single connection, each gRPC connection a stream of it. The plugin is
//! the yamux server, the host the client (go-plugin's `grpcmux`).
//!
//! Wire compatibility with HashiCorp's yamux (what Go hosts and plugins run): the same
//! spec (v0 frames, odd client / even server stream ids, 256 KiB initial windows). Go's
//! keepalive pings (every 30 s on the session, stream id 0) are answered by the yamux
//! connection as long as it is polled, which the session tasks here always do. Larger
//! window updates than 256 KiB (this implementation's auto-tuning) are accepted by Go.

// The host half is used only with the `launcher` feature.
#![cfg_attr(not(feature = "launcher"), allow(dead_code))]

use std::future::poll_fn;
use std::task::Poll;

use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt as _, TokioAsyncReadCompatExt as _};

use super::Io;

/// Most streams one session carries at a time (go-plugin opens one per gRPC connection:
/// one, plus one per brokered server). Bounds what a hostile peer can make us hold.
const MAX_STREAMS: usize = 64;
/// Upper bound of all stream receive windows of a session together.
const MAX_SESSION_WINDOW: usize = 64 * 1024 * 1024;

/// A multiplexed gRPC connection: a yamux stream as a tokio byte stream.
pub(crate) type MuxStream = Compat<yamux::Stream>;

fn config() -> yamux::Config {
    let mut config = yamux::Config::default();
    config
        .set_max_num_streams(MAX_STREAMS)
        .set_max_connection_receive_window(Some(MAX_SESSION_WINDOW));
    config
}

/// The plugin side: run `conn` as a yamux server session and hand every stream the host
/// opens to `on_stream`. Returns when the session ends (the host closed it, or it broke).
///
/// go-plugin routes a stream to a brokered server when a "knock" for it came first;
/// Drover plugins serve no brokered servers, so no knock ever comes and every stream is
/// a connection to the plugin's own gRPC server.
pub(crate) async fn serve_session<C: Io>(conn: C, mut on_stream: impl FnMut(MuxStream)) {
    let mut session = yamux::Connection::new(conn.compat(), config(), yamux::Mode::Server);
    loop {
        match poll_fn(|cx| session.poll_next_inbound(cx)).await {
            Some(Ok(stream)) => on_stream(stream.compat()),
            Some(Err(e)) => {
                tracing::debug!("multiplexed host session ended: {e}");
                return;
            }
            None => return,
        }
    }
}

type OpenReply = oneshot::Sender<yamux::Result<yamux::Stream>>;

/// The host side: a yamux client session over one connection to the plugin, driven by
/// its own task; [`MuxClient::open`] opens a stream for a gRPC connection. The session
/// is closed when the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct MuxClient {
    open: mpsc::Sender<OpenReply>,
}

impl MuxClient {
    /// Start a client session on `conn`.
    pub(crate) fn start<C: Io>(conn: C) -> Self {
        let (open, mut requests) = mpsc::channel::<OpenReply>(8);
        tokio::spawn(async move {
            let mut session = yamux::Connection::new(conn.compat(), config(), yamux::Mode::Client);
            let mut waiting: Option<OpenReply> = None;
            // Open streams on request while reading the session (which also answers the
            // plugin's pings and window updates), until every handle is gone or the
            // session ends.
            let handles_gone = poll_fn(|cx| {
                loop {
                    if waiting.is_none() {
                        match requests.poll_recv(cx) {
                            Poll::Ready(Some(reply)) => waiting = Some(reply),
                            Poll::Ready(None) => return Poll::Ready(true),
                            Poll::Pending => {}
                        }
                    }
                    if let Some(reply) = waiting.take() {
                        match session.poll_new_outbound(cx) {
                            Poll::Ready(stream) => {
                                let _ = reply.send(stream);
                                continue;
                            }
                            Poll::Pending => waiting = Some(reply),
                        }
                    }
                    match session.poll_next_inbound(cx) {
                        // go-plugin plugins open streams only to reach brokered servers
                        // of the host, which Drover hosts do not run.
                        Poll::Ready(Some(Ok(stream))) => drop(stream),
                        Poll::Ready(Some(Err(e))) => {
                            tracing::debug!("multiplexed plugin session ended: {e}");
                            return Poll::Ready(false);
                        }
                        Poll::Ready(None) => return Poll::Ready(false),
                        Poll::Pending => return Poll::Pending,
                    }
                }
            })
            .await;
            if handles_gone {
                let _ = poll_fn(|cx| session.poll_close(cx)).await;
            }
        });
        MuxClient { open }
    }

    /// Open a new stream (one gRPC connection).
    pub(crate) async fn open(&self) -> std::io::Result<MuxStream> {
        let closed = || std::io::Error::other("the multiplexed session to the plugin is closed");
        let (reply, answer) = oneshot::channel();
        self.open.send(reply).await.map_err(|_| closed())?;
        let stream = answer
            .await
            .map_err(|_| closed())?
            .map_err(|e| std::io::Error::other(format!("cannot open a multiplexed stream: {e}")))?;
        Ok(stream.compat())
    }
}
