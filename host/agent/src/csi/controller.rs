//! The controller side of `volume create` and `volume delete`: the server cannot call
//! agents, so an agent running a CSI controller plugin keeps a
//! `CsiController.Watch` stream open to its servers, runs each call it gets against
//! its plugin (CreateVolume, DeleteVolume) and answers with `Reply`.

use std::sync::Arc;
use std::time::Duration;

use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::csi::{ControllerCall, ControllerOutcome};
use pb::csi_controller_client::CsiControllerClient;
use tokio_util::sync::CancellationToken;

use super::client::Capability;
use super::plugins::CsiPlugins;
use crate::cluster::connection::ServerConnection;
use crate::cluster::identity::NodeSecret;
use crate::cluster::queue::Backoff;

/// Deadline of one Reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// Serve controller calls for `node_id` until `stop` (nothing to do without a
/// controller plugin).
pub async fn serve(
    conn: ServerConnection,
    node_id: String,
    secret: NodeSecret,
    plugins: Arc<CsiPlugins>,
    stop: CancellationToken,
) {
    if !plugins.any_controller() {
        return;
    }
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    let mut server = 0usize;
    loop {
        let i = server % conn.len().max(1);
        let why = tokio::select! {
            why = session(&conn, i, &node_id, &secret, &plugins, &mut backoff) => why,
            () = stop.cancelled() => return,
        };
        let delay = backoff.next_delay();
        tracing::debug!(server = %conn.address(i), retry_in = ?delay, "CSI controller calls: {why}");
        server = server.wrapping_add(1);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return,
        }
    }
}

async fn session(
    conn: &ServerConnection,
    i: usize,
    node_id: &str,
    secret: &NodeSecret,
    plugins: &Arc<CsiPlugins>,
    backoff: &mut Backoff,
) -> String {
    let channel = match conn.connect(i).await {
        Ok(c) => c,
        Err(e) => return format!("cannot connect: {e}"),
    };
    let rpc = CsiControllerClient::with_interceptor(channel, conn.interceptor());
    let mut stream = match rpc
        .clone()
        .watch(pb::CsiControllerWatchRequest {
            node_id: node_id.to_owned(),
            node_secret: secret.expose().to_owned(),
        })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(s) => return format!("watch: {}", s.message()),
    };
    backoff.reset();
    loop {
        let call = match stream.message().await {
            Ok(Some(c)) => c,
            Ok(None) => return "the server closed the stream".into(),
            Err(s) => return format!("watch: {}", s.message()),
        };
        let plugins = plugins.clone();
        let mut rpc = rpc.clone();
        let node_id = node_id.to_owned();
        let secret = secret.expose().to_owned();
        tokio::spawn(async move {
            let outcome = match serde_json::from_slice::<ControllerCall>(&call.call_json) {
                Ok(c) => run(&plugins, c).await,
                Err(e) => ControllerOutcome::Failed {
                    error: format!("the agent cannot read the call: {e}"),
                },
            };
            let outcome_json = match serde_json::to_vec(&outcome) {
                Ok(j) => j,
                Err(e) => {
                    tracing::error!("encoding a CSI controller answer: {e}");
                    return;
                }
            };
            let reply = rpc.reply(pb::CsiControllerReplyRequest {
                node_id,
                node_secret: secret,
                id: call.id.clone(),
                outcome_json,
            });
            match tokio::time::timeout(REPLY_TIMEOUT, reply).await {
                Ok(Ok(_)) => {}
                Ok(Err(s)) => {
                    tracing::warn!(call = %call.id, "CSI controller reply: {}", s.message())
                }
                Err(_) => tracing::warn!(call = %call.id, "CSI controller reply: no answer"),
            }
        });
    }
}

/// Run one call against the plugin's controller.
pub async fn run(plugins: &CsiPlugins, call: ControllerCall) -> ControllerOutcome {
    let failed = |error: String| ControllerOutcome::Failed { error };
    let Some(plugin) = plugins.get(call.plugin_id()) else {
        return failed(format!(
            "this node runs no CSI plugin {:?}",
            call.plugin_id()
        ));
    };
    if !plugin.plugin_type().is_controller() {
        return failed(format!(
            "CSI plugin {:?} on this node is not a controller",
            call.plugin_id()
        ));
    }
    let client = match plugin.client().await {
        Ok(c) => c,
        Err(e) => return failed(e.to_string()),
    };
    let none = std::collections::BTreeMap::new();
    match call {
        ControllerCall::Create {
            name,
            capacity_min,
            capacity_max,
            capabilities,
            mount_options,
            parameters,
            ..
        } => {
            let caps: Vec<Capability> = capabilities
                .iter()
                .map(|c| Capability {
                    access_mode: c.access_mode,
                    attachment_mode: c.attachment_mode,
                    fs_type: mount_options.fs_type.clone(),
                    mount_flags: mount_options.mount_flags.clone(),
                })
                .collect();
            match client
                .create_volume(
                    &name,
                    (capacity_min, capacity_max),
                    &caps,
                    &parameters,
                    &none,
                )
                .await
            {
                Ok(v) => ControllerOutcome::Created {
                    external_id: v.external_id,
                    capacity: v.capacity_bytes,
                    context: v.context,
                },
                Err(e) => failed(e.to_string()),
            }
        }
        ControllerCall::Delete { external_id, .. } => {
            match client.delete_volume(&external_id, &none).await {
                Ok(()) => ControllerOutcome::Deleted,
                Err(e) => failed(e.to_string()),
            }
        }
        ControllerCall::Publish {
            external_id,
            node_id,
            capability,
            mount_options,
            readonly,
            context,
            ..
        } => {
            let cap = Capability {
                access_mode: capability.access_mode,
                attachment_mode: capability.attachment_mode,
                fs_type: mount_options.fs_type,
                mount_flags: mount_options.mount_flags,
            };
            match client
                .controller_publish(&external_id, &node_id, &cap, readonly, &context, &none)
                .await
            {
                Ok(publish_context) => ControllerOutcome::Published { publish_context },
                Err(e) => failed(e.to_string()),
            }
        }
        ControllerCall::Unpublish {
            external_id,
            node_id,
            ..
        } => match client
            .controller_unpublish(&external_id, &node_id, &none)
            .await
        {
            Ok(()) => ControllerOutcome::Unpublished,
            Err(e) => failed(e.to_string()),
        },
    }
}

/// How a node's agent asks its servers for its own controller calls
/// (ControllerPublish and ControllerUnpublish of the volumes it stages).
#[derive(Clone)]
pub struct ControllerLink {
    conn: ServerConnection,
    node_id: String,
    secret: NodeSecret,
}

impl std::fmt::Debug for ControllerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerLink")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

/// Deadline of a node's own controller call (the server waits up to a minute for the
/// controller).
const NODE_CALL_TIMEOUT: Duration = Duration::from_secs(75);

impl ControllerLink {
    /// Calls as node `node_id` through `conn`.
    pub fn new(conn: ServerConnection, node_id: String, secret: NodeSecret) -> Self {
        Self {
            conn,
            node_id,
            secret,
        }
    }

    /// Run `call` through the servers (each tried in turn): its outcome.
    pub async fn call(&self, call: &ControllerCall) -> Result<ControllerOutcome, String> {
        let call_json = serde_json::to_vec(call).map_err(|e| e.to_string())?;
        let mut last = String::from("no server");
        for i in 0..self.conn.len() {
            let channel = match self.conn.connect(i).await {
                Ok(c) => c,
                Err(e) => {
                    last = format!("{}: cannot connect: {e}", self.conn.address(i));
                    continue;
                }
            };
            let mut rpc = CsiControllerClient::with_interceptor(channel, self.conn.interceptor());
            let req = pb::CsiControllerCallRequest {
                node_id: self.node_id.clone(),
                node_secret: self.secret.expose().to_owned(),
                call_json: call_json.clone(),
            };
            match tokio::time::timeout(NODE_CALL_TIMEOUT, rpc.call(req)).await {
                Ok(Ok(r)) => {
                    return serde_json::from_slice(&r.into_inner().outcome_json)
                        .map_err(|e| format!("the server's answer: {e}"));
                }
                Ok(Err(s)) if s.code() == tonic::Code::Unavailable => {
                    last = format!("{}: {}", self.conn.address(i), s.message());
                }
                Ok(Err(s)) => return Err(s.message().to_owned()),
                Err(_) => return Err(format!("no answer within {NODE_CALL_TIMEOUT:?}")),
            }
        }
        Err(last)
    }
}
