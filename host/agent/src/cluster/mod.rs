//! The agent as a cluster client: it registers its node with the servers, heartbeats,
//! streams its allocations to the [`AllocManager`](crate::allocs::AllocManager) and
//! reports their status back in batches; it keeps running its tasks while no server
//! answers, and reconciles when one does.
//!
//! FOUNDATION STUB: `run` is the contract the agent calls when `servers` are
//! configured; the body is written on the `cluster-rpc` branch.

use std::sync::Arc;

use drover_server_api::AllocClientUpdate;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::allocs::AllocManager;
use crate::catalog::Catalog;
use crate::config::AgentConfig;

/// Run the client until `stop` fires: register, heartbeat, stream allocations into
/// `allocs`, send what arrives on `updates` to the servers.
pub async fn run(
    config: AgentConfig,
    catalog: Arc<Catalog>,
    allocs: Arc<AllocManager>,
    updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
    stop: CancellationToken,
) {
    let _ = (config, catalog, allocs, updates);
    stop.cancelled().await;
}
