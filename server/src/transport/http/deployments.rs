//! `/v1/deployments`, `/v1/deployment/:id`, `/v1/deployment/allocations/:id`,
//! `/v1/deployment/promote/:id`, `/v1/deployment/fail/:id`, and a job's
//! `/v1/job/:id/deployment[s]` and `/v1/job/:id/revert`.

use axum::Extension;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use drover_server_api::nomad;
use tokio_util::sync::CancellationToken;

use super::scope::Scope;
use super::{Api, ApiError, ApiResult, Params, answer, block, json_body, wire};

/// A deployment update's answer in Nomad's shape (`DeploymentUpdateResponse`).
fn update_response(
    r: &drover_server_api::DeploymentUpdateResponse,
) -> nomad::DeploymentUpdateResponse {
    nomad::DeploymentUpdateResponse {
        eval_id: r.eval_id.clone(),
        // The evaluation is written in the same commit as the update.
        eval_create_index: if r.eval_id.is_empty() { 0 } else { r.index },
        deployment_modify_index: r.deployment_modify_index,
        reverted_job_version: r.reverted_job_version,
        index: r.index,
    }
}

/// `GET /v1/deployments[?prefix=]`: every deployment, newest first.
pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix();
    let list: Vec<nomad::Deployment> = api
        .server
        .deployments()
        .iter()
        .filter(|d| d.id.starts_with(prefix) && scope.lists(&d.namespace, "read-job"))
        .map(nomad::Deployment::from)
        .collect();
    answer(index, list)
}

/// Deployment `id` (or unique id prefix), if the caller may use `capability` in its
/// namespace.
fn find_deployment(
    api: &Api,
    scope: &Scope,
    id: &str,
    capability: &str,
) -> Result<drover_server_api::Deployment, ApiError> {
    scope.find(
        api.server.deployment(id),
        id,
        |d| &d.id,
        |d| &d.namespace,
        capability,
        // The writes name the id (`drover deployment fail` prints it), as before.
        &if capability == "read-job" {
            "deployment not found".to_owned()
        } else {
            format!("deployment {id} not found")
        },
    )
}

/// `GET /v1/deployment/:id` (an id or a unique prefix).
pub(super) async fn get(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let d = find_deployment(&api, &scope, &id, "read-job")?;
    answer(index, nomad::Deployment::from(&d))
}

/// `GET /v1/deployment/allocations/:id`: the allocations it placed, as stubs.
pub(super) async fn allocations(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let d = find_deployment(&api, &scope, &id, "read-job")?;
    let allocs = api
        .server
        .deployment_allocations(&d.id)
        .ok_or_else(|| ApiError::not_found("deployment not found"))?;
    let stubs: Vec<_> = allocs
        .iter()
        .map(|a| wire::alloc_stub(&api.server, a))
        .collect();
    answer(index, stubs)
}

/// `PUT /v1/deployment/promote/:id` with `{"All": true}` or `{"Groups": [...]}`.
pub(super) async fn promote(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let req: nomad::DeploymentPromoteRequest = json_body(body)?;
    let groups = match (req.all, req.groups.is_empty()) {
        (true, _) => None,
        (false, false) => Some(req.groups),
        (false, true) => {
            return Err(ApiError::bad_request(
                "promote request names no groups: set \"All\": true or list \"Groups\"",
            ));
        }
    };
    // The whole id from here on: a prefix is resolved (and checked) once.
    let id = find_deployment(&api, &scope, &id, "submit-job")?.id;
    let resp = api.server.promote_deployment(&id, groups).await?;
    answer(resp.index, update_response(&resp))
}

/// `PUT /v1/deployment/fail/:id`.
pub(super) async fn fail(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
) -> ApiResult {
    let id = find_deployment(&api, &scope, &id, "submit-job")?.id;
    let resp = api.server.fail_deployment(&id).await?;
    answer(resp.index, update_response(&resp))
}

/// `GET /v1/job/:id/deployments` (newest first) and `GET /v1/job/:id/deployment`
/// (the newest, `null` when the job has none).
pub(super) async fn of_job(
    State(api): State<Api>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let list = api
        .server
        .job_deployments(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("job not found"))?;
    if uri.path().ends_with("/deployments") {
        let list: Vec<nomad::Deployment> = list.iter().map(nomad::Deployment::from).collect();
        answer(index, list)
    } else {
        answer(index, list.first().map(nomad::Deployment::from))
    }
}

/// `PUT /v1/job/:id/revert` with `{"JobID", "JobVersion", "EnforcePriorVersion"}`:
/// answered as a registration.
pub(super) async fn revert(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let req: nomad::JobRevertRequest = json_body(body)?;
    if !req.job_id.is_empty() && req.job_id != id {
        return Err(ApiError::bad_request("Job ID does not match"));
    }
    // The version gone back to mounts what it mounts: the caller must be allowed to.
    if let Some(old) = api
        .server
        .job_versions(scope.namespace(), &id)
        .and_then(|vs| vs.into_iter().find(|j| j.version == req.job_version))
    {
        scope.check_volumes(&old.spec)?;
    }
    let resp = api
        .server
        .revert_job(
            scope.namespace(),
            &id,
            req.job_version,
            req.enforce_prior_version,
        )
        .await?;
    answer(resp.index, wire::register_response(&resp))
}
