//! The node RPCs (`drover.cluster.v1.Node`) and the forwarded HTTP API
//! (`drover.cluster.v1.Api`) on one TCP listener.
//!
//! FOUNDATION STUB: `serve` is the contract the `drover server` command calls; the
//! body is written on the `cluster-rpc` branch.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;
use crate::server::Server;

/// How the RPC listener authenticates and encrypts.
#[derive(Debug, Clone, Default)]
pub struct RpcOptions {
    /// Every call must carry this token (`x-drover-token`), when set.
    pub token: Option<String>,
    /// TLS (rustls), when set.
    pub tls: Option<crate::tls::TlsFiles>,
}

/// Serve the node RPCs (and, once `api` is given, the forwarded HTTP API) on
/// `listener` until `shutdown` fires.
pub async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    options: RpcOptions,
    api: Option<axum::Router>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let _ = (server, listener, options, api);
    shutdown.cancelled().await;
    Ok(())
}
