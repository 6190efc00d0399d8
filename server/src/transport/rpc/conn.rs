//! The RPC listener's connections: at most so many open, and so many per peer
//! address; a connection that makes no call past the token check within its first-call
//! deadline is dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Request;

/// The default [`RpcOptions::first_call_deadline`](super::RpcOptions::first_call_deadline): an agent makes its first call
/// (registration) right after connecting, so 10 s is ample even over a slow link.
pub const FIRST_CALL_DEADLINE: Duration = Duration::from_secs(10);
/// The default [`RpcOptions::max_connections_per_ip`](super::RpcOptions::max_connections_per_ip): a quarter of
/// [`MAX_CONNECTIONS`], so one address cannot take every slot, yet high enough for
/// many agents behind one NAT address and for `drover-bench cluster`, whose 1,000
/// simulated clients each hold a connection from 127.0.0.1.
pub const MAX_CONNECTIONS_PER_IP: usize = 4_096;
/// Descriptors kept free below the open-file limit when sizing the connection cap:
/// the HTTP listener's connections, the store, log files.
const DESCRIPTOR_HEADROOM: u64 = 1_024;
/// Connections served at once; more wait in the listen backlog until one closes. A
/// client agent holds one, so this bounds the nodes one server serves directly. The
/// listener uses less when the open-file limit is lower (see [`connection_cap`]).
pub const MAX_CONNECTIONS: usize = 16_384;

/// What the RPC handlers learn of a connection: its addresses, and the flag that lifts
/// its first-call deadline.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The TCP addresses.
    pub tcp: tonic::transport::server::TcpConnectInfo,
    first_call: Arc<AtomicBool>,
}

/// A call passed the token check: lift its connection's first-call deadline.
pub(super) fn first_call_made(req: &Request<()>) {
    // Over TLS too: tonic inserts the inner connection's info beside the TLS one.
    if let Some(info) = req.extensions().get::<ConnInfo>() {
        info.first_call.store(true, Ordering::Relaxed);
    }
}

/// Connections open per peer address, for [`RpcOptions::max_connections_per_ip`](super::RpcOptions::max_connections_per_ip).
type PerIp = Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>;

/// A peer address's share of the open connections, given back on drop.
struct IpSlot {
    per_ip: PerIp,
    ip: IpAddr,
}

impl IpSlot {
    /// One more connection for `ip`, or `None` when it already has `max`.
    fn take(per_ip: &PerIp, ip: IpAddr, max: usize) -> Option<IpSlot> {
        let mut map = per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            per_ip: per_ip.clone(),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// An accepted connection holding its slot among the listener's connections (and its
/// peer address's) until closed. Until a call on it passes the token check, a read
/// past the deadline fails, which makes hyper (or the TLS handshake) drop it.
pub(super) struct Conn {
    io: TcpStream,
    first_call: Arc<AtomicBool>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
    _ip_slot: IpSlot,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            tcp: self.io.connect_info(),
            first_call: self.first_call.clone(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Polling the timer also registers this read's waker with it, so a peer that
        // sends nothing at all is woken and closed at the deadline.
        if !self.first_call.load(Ordering::Relaxed) && self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no authenticated call within the first-call deadline",
            )));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Raise the open-file soft limit to the hard one (the default 1,024 is sized for
/// `select(2)`, which nothing here uses) and size the connection cap to what is then
/// allowed, leaving 1,024 descriptors free: past the limit, accept fails with EMFILE
/// for every listener of the process, the HTTP API's included.
pub fn connection_cap() -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let mut soft = limit.current;
    if let Some(hard) = limit.maximum
        && limit.current != Some(hard)
    {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        ) {
            Ok(()) => soft = Some(hard),
            Err(e) => tracing::warn!("could not raise the open-file limit to {hard}: {e}"),
        }
    }
    let cap = match soft {
        None => MAX_CONNECTIONS,
        Some(soft) => usize::try_from(soft.saturating_sub(DESCRIPTOR_HEADROOM))
            .unwrap_or(usize::MAX)
            .clamp(16, MAX_CONNECTIONS),
    };
    tracing::info!(
        open_file_limit = ?soft,
        max_connections = cap,
        "RPC connection cap"
    );
    cap
}

/// Accepted connections, at most `max` open at once and `per_ip_max` per peer address.
pub(super) fn incoming(
    listener: TcpListener,
    max: usize,
    per_ip_max: usize,
    deadline: Duration,
) -> impl futures_util::Stream<Item = Result<Conn, std::io::Error>> {
    let slots = Arc::new(Semaphore::new(max));
    let per_ip: PerIp = Arc::default();
    futures_util::stream::unfold(
        (listener, slots, per_ip),
        move |(listener, slots, per_ip)| async move {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return None;
            };
            loop {
                match listener.accept().await {
                    Ok((io, peer)) => {
                        let Some(ip_slot) = IpSlot::take(&per_ip, peer.ip(), per_ip_max) else {
                            // Dropping the stream closes it: this address has its share.
                            tracing::debug!(
                                peer = %peer.ip(),
                                "RPC listener: refused a connection over the per-address cap"
                            );
                            continue;
                        };
                        let _ = io.set_nodelay(true);
                        let conn = Conn {
                            io,
                            first_call: Arc::default(),
                            deadline: Box::pin(tokio::time::sleep(deadline)),
                            _slot: slot,
                            _ip_slot: ip_slot,
                        };
                        return Some((Ok(conn), (listener, slots, per_ip)));
                    }
                    Err(e) => {
                        // Out of descriptors or a connection reset before accept: keep
                        // serving the connections we have; pause so that a persistent
                        // EMFILE does not spin.
                        tracing::warn!("RPC listener: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        },
    )
}
