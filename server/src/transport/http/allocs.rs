//! `/v1/allocations`, `/v1/allocation/:id[/stop]`, `/v1/evaluations`,
//! `/v1/evaluation/:id[/allocations]`.

use axum::Extension;
use axum::extract::{Path, State};
use tokio_util::sync::CancellationToken;

use super::scope::Scope;
use super::{Api, ApiError, ApiResult, Params, answer, block, wire};

/// Allocation `id` (or unique id prefix), if the caller may use `capability` in its
/// namespace.
fn find_alloc(
    api: &Api,
    scope: &Scope,
    id: &str,
    capability: &str,
) -> Result<drover_server_api::Allocation, ApiError> {
    scope.find(
        api.server.allocation(id),
        id,
        |a| &a.id,
        |a| &a.namespace,
        capability,
        // The stop names the id, as the server's own answer did.
        &if capability == "read-job" {
            "alloc not found".to_owned()
        } else {
            format!("alloc not found: {id}")
        },
    )
}

/// Evaluation `id` (or unique id prefix), if the caller may read its namespace.
fn find_eval(
    api: &Api,
    scope: &Scope,
    id: &str,
) -> Result<drover_server_api::Evaluation, ApiError> {
    scope.find(
        api.server.evaluation(id),
        id,
        |e| &e.id,
        |e| &e.namespace,
        "read-job",
        "eval not found",
    )
}

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix();
    let stubs: Vec<_> = api
        .server
        .allocations()
        .iter()
        .filter(|a| a.id.starts_with(prefix) && scope.lists(&a.namespace, "read-job"))
        .map(|a| wire::alloc_stub(&api.server, a))
        .collect();
    answer(index, stubs)
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let alloc = find_alloc(&api, &scope, &id, "read-job")?;
    let job = api.server.job_version_of(&alloc);
    answer(index, wire::alloc(&api.server, &alloc, job.as_ref()))
}

/// `POST /v1/allocation/:id/stop`: stop it; the scheduler replaces it (Nomad's
/// `AllocStopResponse`).
pub(super) async fn stop(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
) -> ApiResult {
    // The whole id from here on: a prefix is resolved (and checked) once.
    let alloc = find_alloc(&api, &scope, &id, "alloc-lifecycle")?;
    let (eval_id, index) = api.server.stop_allocation(&alloc.id).await?;
    answer(
        index,
        serde_json::json!({ "EvalID": eval_id, "Index": index }),
    )
}

pub(super) async fn list_evals(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix();
    let evals: Vec<_> = api
        .server
        .evaluations()
        .iter()
        .filter(|e| e.id.starts_with(prefix) && scope.lists(&e.namespace, "read-job"))
        .map(wire::eval)
        .collect();
    answer(index, evals)
}

pub(super) async fn get_eval(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let eval = find_eval(&api, &scope, &id)?;
    answer(index, wire::eval(&eval))
}

/// The allocations an evaluation placed or changed.
pub(super) async fn eval_allocs(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let eval = find_eval(&api, &scope, &id)?;
    let stubs: Vec<_> = api
        .server
        .allocations()
        .iter()
        .filter(|a| a.eval_id == eval.id && scope.allows(&a.namespace, "read-job"))
        .map(|a| wire::alloc_stub(&api.server, a))
        .collect();
    answer(index, stubs)
}
