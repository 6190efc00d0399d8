//! What carries the gRPC connections between host and plugin, both ends: a plain
//! connection, TLS with go-plugin's automatic mutual TLS ([`tls`]), and go-plugin 1.6's
//! multiplexing of gRPC connections over one connection ([`mux`]). With both, TLS runs
//! inside each multiplexed stream, as in go-plugin.

// The host half is used only with the `launcher` feature.
#![cfg_attr(not(feature = "launcher"), allow(dead_code))]

pub(crate) mod mux;
pub(crate) mod tls;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Semaphore, mpsc};

/// A byte stream a gRPC connection can run on.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Longest a host may take to complete a TLS handshake with a plugin. A peer that stalls
/// holds only its own task: other connections are accepted meanwhile.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes a plugin runs at once; more connections wait their turn.
const MAX_PENDING_TLS_HANDSHAKES: usize = 8;
/// Multiplexed (yamux) sessions a plugin holds at once; go-plugin hosts open one.
const MAX_MUX_SESSIONS: usize = 8;

/// How a plugin carries the connections it accepts, from its environment
/// (`PLUGIN_CLIENT_CERT`, `PLUGIN_MULTIPLEX_GRPC`).
#[derive(Clone, Default)]
pub(crate) struct ServerTransport {
    /// AutoMTLS: every connection (or stream) is TLS with this config.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// Every accepted connection is a yamux session of gRPC connections.
    pub(crate) multiplex: bool,
}

/// One gRPC connection a plugin serves, whatever carries it.
pub(crate) struct ServedConn(Box<dyn Io>);

impl tonic::transport::server::Connected for ServedConn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for ServedConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServedConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_shutdown(cx)
    }
}

/// Accept host connections on `listener` for as long as the returned stream is read, and
/// yield the gRPC connections they carry: each accepted connection (wrapped by `wrap`)
/// as it is, or after a TLS handshake, or, multiplexed, each stream of its yamux
/// session (each after a TLS handshake when AutoMTLS is on). Handshakes run in tasks of
/// their own, bounded by [`TLS_HANDSHAKE_TIMEOUT`].
pub(crate) fn accept_loop<C: Io>(
    listener: tokio::net::UnixListener,
    wrap: impl Fn(tokio::net::UnixStream) -> C + Send + 'static,
    transport: ServerTransport,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<ServedConn>> {
    let (tx, rx) = mpsc::channel(16);
    let acceptor = transport.tls.map(tokio_rustls::TlsAcceptor::from);
    let handshakes = Arc::new(Semaphore::new(MAX_PENDING_TLS_HANDSHAKES));
    let sessions = Arc::new(Semaphore::new(MAX_MUX_SESSIONS));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let conn = match accepted {
                Ok((stream, _)) => wrap(stream),
                Err(e) => {
                    // As the listener stream tonic read before: it decides.
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            if transport.multiplex {
                // Each session holds up to 64 streams and their windows: a host has one
                // (go-plugin opens exactly one), a flood of them is refused.
                let Ok(session) = sessions.clone().try_acquire_owned() else {
                    tracing::warn!(
                        "refused a host connection: {MAX_MUX_SESSIONS} multiplexed sessions are open"
                    );
                    continue;
                };
                let (tx, acceptor, handshakes) = (tx.clone(), acceptor.clone(), handshakes.clone());
                tokio::spawn(async move {
                    mux::serve_session(conn, move |stream| {
                        offer(stream, acceptor.clone(), handshakes.clone(), tx.clone());
                    })
                    .await;
                    drop(session);
                });
            } else {
                offer(conn, acceptor.clone(), handshakes.clone(), tx.clone());
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Hand one connection to the server, after a TLS handshake if `acceptor` is set.
fn offer<C: Io>(
    conn: C,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    handshakes: Arc<Semaphore>,
    tx: mpsc::Sender<std::io::Result<ServedConn>>,
) {
    tokio::spawn(async move {
        let served = match acceptor {
            None => ServedConn(Box::new(conn)),
            Some(acceptor) => {
                // Each handshake costs a P-521 signature: a few at a time, the rest wait
                // (within the same time limit) rather than pile up.
                let handshake = async {
                    let _turn = handshakes.acquire_owned().await;
                    acceptor.accept(conn).await
                };
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(tls)) => ServedConn(Box::new(tls)),
                    Ok(Err(e)) => {
                        tracing::warn!("refused a host connection: TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(
                            "refused a host connection: no TLS handshake within {TLS_HANDSHAKE_TIMEOUT:?}"
                        );
                        return;
                    }
                }
            }
        };
        let _ = tx.send(Ok(served)).await;
    });
}

/// How a host reaches a plugin's gRPC server.
#[derive(Clone)]
pub(crate) struct ClientTransport {
    /// AutoMTLS: TLS with this config, checked for the name `localhost`.
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    /// Multiplexing: gRPC connections are streams of one yamux session.
    pub(crate) multiplex: bool,
    /// The process group that must serve a unix socket: the plugin's (it leads its
    /// own group). The address comes from the plugin's handshake line, so without this
    /// a plugin could name another plugin's live socket and have the host identify and
    /// shut down that one as if it were itself.
    pub(crate) served_by_group: u32,
}
