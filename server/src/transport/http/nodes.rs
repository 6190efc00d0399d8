//! `/v1/nodes`, `/v1/node/:id[/allocations|/drain|/eligibility]`.

use axum::Extension;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{Api, ApiError, ApiResult, Params, answer, block, json_body, wire};

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix();
    let stubs: Vec<_> = api
        .server
        .nodes()
        .iter()
        .filter(|n| n.id.starts_with(prefix))
        .map(wire::node_stub)
        .collect();
    answer(index, stubs)
}

/// A node by id, id prefix or name; Nomad's text when there is none.
fn node(api: &Api, id: &str) -> Result<drover_server_api::Node, ApiError> {
    match api.server.node(id) {
        Ok(n) => Ok(n),
        Err(crate::error::ServerError::NotFound(_)) => Err(ApiError::not_found("node not found")),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let n = node(&api, &id)?;
    answer(index, wire::node(&n))
}

pub(super) async fn allocations(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: super::scope::Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let n = node(&api, &id)?;
    // `node:read` shows the node; its allocations only where the caller may read
    // their namespace (Nomad's).
    let allocs: Vec<_> = api
        .server
        .node_allocations(&n.id)
        .iter()
        .filter(|a| scope.allows(&a.namespace, "read-job"))
        .map(|a| {
            let job = api.server.job_version_of(a);
            wire::alloc(&api.server, a, job.as_ref())
        })
        .collect();
    answer(index, allocs)
}

/// Nomad's `NodeUpdateDrainRequest`: `DrainSpec` null ends the drain.
#[derive(Debug, Deserialize)]
struct DrainRequest {
    #[serde(rename = "DrainSpec", alias = "drain_spec", default)]
    drain_spec: Option<serde_json::Value>,
    #[serde(rename = "MarkEligible", alias = "mark_eligible", default)]
    mark_eligible: bool,
}

/// Nomad's `NodeDrainUpdateResponse` (and `NodeEligibilityUpdateResponse`).
fn node_update_response(index: drover_server_api::Index) -> serde_json::Value {
    serde_json::json!({
        "NodeModifyIndex": index,
        "EvalIDs": null,
        "EvalCreateIndex": index,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": true,
    })
}

/// `POST /v1/node/:id/drain`. A drain's `Deadline` is not kept: Drover moves the
/// allocations off at once (as a deadline reached), and `IgnoreSystemJobs` is what it
/// does anyway (system jobs are not moved, they stop with the drain).
pub(super) async fn drain(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let req: DrainRequest = json_body(body)?;
    let enable = req.drain_spec.as_ref().is_some_and(|s| !s.is_null());
    let n = node(&api, &id)?;
    let index = api
        .server
        .update_drain(&n.id, enable, req.mark_eligible)
        .await?;
    answer(index, node_update_response(index))
}

/// Nomad's `NodeUpdateEligibilityRequest`.
#[derive(Debug, Deserialize)]
struct EligibilityRequest {
    #[serde(rename = "Eligibility", alias = "eligibility", default)]
    eligibility: String,
}

pub(super) async fn eligibility(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let req: EligibilityRequest = json_body(body)?;
    let eligible = match req.eligibility.as_str() {
        "eligible" => true,
        "ineligible" => false,
        other => {
            return Err(ApiError::bad_request(format!(
                "invalid scheduling eligibility {other:?}"
            )));
        }
    };
    let n = node(&api, &id)?;
    let index = api.server.set_node_eligibility(&n.id, eligible).await?;
    answer(index, node_update_response(index))
}
