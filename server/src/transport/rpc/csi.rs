//! `drover.cluster.v1.CsiController`: agents running a CSI controller plugin take the
//! controller calls queued for their node and answer them (see `endpoints/csi.rs`).

use std::sync::Arc;

use drover_proto::drover::cluster::v1 as pb;
use drover_server_api::csi::{ControllerCall, ControllerOutcome};
use pb::csi_controller_server::CsiController;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{decode, encode, status_from};
use crate::server::Server;

pub(super) struct CsiControllerRpc {
    pub(super) server: Arc<Server>,
    pub(super) shutdown: CancellationToken,
}

#[tonic::async_trait]
impl CsiController for CsiControllerRpc {
    type WatchStream = ReceiverStream<Result<pb::CsiControllerCall, Status>>;

    async fn watch(
        &self,
        request: Request<pb::CsiControllerWatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let pb::CsiControllerWatchRequest {
            node_id,
            node_secret,
        } = request.into_inner();
        if node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is empty"));
        }
        self.server
            .authenticate_node(&node_id, &node_secret)
            .map_err(status_from)?;
        let (tx, rx) = mpsc::channel(16);
        let server = self.server.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let queue = server.csi_controller_queue();
            loop {
                let notified = queue.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                for (id, call) in queue.take(&node_id) {
                    let call_json = match encode(&call) {
                        Ok(j) => j,
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    };
                    if tx
                        .send(Ok(pb::CsiControllerCall { id, call_json }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                tokio::select! {
                    () = notified => {}
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn call(
        &self,
        request: Request<pb::CsiControllerCallRequest>,
    ) -> Result<Response<pb::CsiControllerCallResponse>, Status> {
        let pb::CsiControllerCallRequest {
            node_id,
            node_secret,
            call_json,
        } = request.into_inner();
        self.server
            .authenticate_node(&node_id, &node_secret)
            .map_err(status_from)?;
        let call: ControllerCall = decode("call_json", &call_json)?;
        let outcome = self
            .server
            .csi_node_controller_call(&node_id, call)
            .await
            .map_err(status_from)?;
        Ok(Response::new(pb::CsiControllerCallResponse {
            outcome_json: encode(&outcome)?,
        }))
    }

    async fn reply(
        &self,
        request: Request<pb::CsiControllerReplyRequest>,
    ) -> Result<Response<pb::CsiControllerReplyResponse>, Status> {
        let pb::CsiControllerReplyRequest {
            node_id,
            node_secret,
            id,
            outcome_json,
        } = request.into_inner();
        self.server
            .authenticate_node(&node_id, &node_secret)
            .map_err(status_from)?;
        let outcome: ControllerOutcome = decode("outcome_json", &outcome_json)?;
        if !self
            .server
            .csi_controller_queue()
            .answer(&node_id, &id, outcome)
        {
            tracing::debug!(node = %node_id, call = %id, "CSI controller answer nobody waits for");
        }
        Ok(Response::new(pb::CsiControllerReplyResponse {}))
    }
}
