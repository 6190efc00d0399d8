//! The server's JSON HTTP API (`/v1/...`), Nomad-shaped, with blocking queries.
//!
//! FOUNDATION STUB: `router` and `serve` are the contract the `drover server` command
//! and the RPC layer (forwarding) call; the bodies are written on the `cluster-http`
//! branch.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;
use crate::server::Server;

/// The API's routes over `server`; `token`, when set, is required on every request
/// (`x-drover-token` header).
pub fn router(server: Arc<Server>, token: Option<String>) -> axum::Router {
    let _ = (server, token);
    axum::Router::new()
}

/// Serve `router` on `listener` (TLS when `tls` is set) until `shutdown` fires.
pub async fn serve(
    router: axum::Router,
    listener: TcpListener,
    tls: Option<crate::tls::TlsFiles>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let _ = (router, listener, tls);
    shutdown.cancelled().await;
    Ok(())
}
