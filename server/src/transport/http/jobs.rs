//! `/v1/jobs`, `/v1/jobs/parse` and `/v1/job/:id/...`.

use axum::Extension;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::scope::Scope;
use super::{Api, ApiError, ApiResult, Params, answer, block, json_body, wire};

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let stubs: Vec<_> = api
        .server
        .jobs_with_summaries(&scope.list_filter("list-jobs"), q.prefix())
        .iter()
        .map(|(j, s)| wire::job_stub(j, s))
        .collect();
    answer(index, stubs)
}

/// Register the job of `body` (`{"Job": {...}}`); `id` is the path's, which the
/// job's `ID` must be.
async fn register_body(
    api: &Api,
    scope: &Scope,
    id: Option<&str>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let (mut parsed, request_ns) = wire::register_request(json_body(body)?)?;
    if let Some(id) = id
        && parsed.spec.name != id
    {
        return Err(ApiError::bad_request("Job ID does not match name"));
    }
    check_region(api, parsed.region.as_deref())?;
    place_in_namespace(scope, request_ns, &mut parsed.spec)?;
    let mut resp = api.server.register_job(parsed.spec).await?;
    // What the conversion accepted without acting on it, then the server's own.
    resp.warnings.extend(parsed.warnings);
    answer(resp.index, wire::register_response(&resp))
}

/// The namespace a submitted job goes to, as Nomad decides it: the query's
/// `?namespace=` (the CLI's `-namespace`), else the request's `Namespace`, else the
/// job's own, else `default`; and the caller must have `submit-job` there.
fn place_in_namespace(
    scope: &Scope,
    request_ns: Option<String>,
    spec: &mut drover_server_api::JobSpec,
) -> Result<(), ApiError> {
    if let Some(ns) = scope.query_namespace().map(str::to_owned).or(request_ns) {
        spec.namespace = ns;
    }
    scope.check(&spec.namespace, "submit-job")?;
    scope.check_volumes(spec)?;
    Ok(())
}

/// A job naming another region than this server's is refused (Nomad forwards it to
/// that region's servers; Drover has one region per cluster).
fn check_region(api: &Api, region: Option<&str>) -> Result<(), ApiError> {
    match region {
        Some(r) if !r.is_empty() && r != api.server.region() => {
            Err(ApiError::bad_request(format!(
                "No path to region: the job's region is {r:?}, this server's is {:?}",
                api.server.region()
            )))
        }
        _ => Ok(()),
    }
}

pub(super) async fn register(
    State(api): State<Api>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    register_body(&api, &scope, None, body).await
}

pub(super) async fn register_named(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    register_body(&api, &scope, Some(&id), body).await
}

/// `{"JobHCL": "...", "Canonicalize": true}` of `/v1/jobs/parse`.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ParseRequest {
    #[serde(rename = "JobHCL", alias = "jobhcl", default)]
    job_hcl: String,
    #[serde(rename = "Canonicalize", alias = "canonicalize", default)]
    canonicalize: bool,
    #[serde(rename = "Variables", alias = "variables", default)]
    variables: Option<String>,
}

pub(super) async fn parse(
    State(api): State<Api>,
    _q: Params,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let req: ParseRequest = json_body(body)?;
    if req.job_hcl.trim().is_empty() {
        return Err(ApiError::bad_request("Job HCL must be specified"));
    }
    // A parse may take a while (its work is bounded, not nil): on a blocking thread,
    // a few at a time, so that parses never hold the async workers nor pile up.
    let _slot = PARSE_SLOTS
        .acquire()
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let job = tokio::task::spawn_blocking(move || {
        wire::parse_hcl(&req.job_hcl, req.canonicalize, req.variables.as_deref())
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the parser failed: {e}"),
        )
    })??;
    answer(api.server.index(), job)
}

/// How many `/v1/jobs/parse` requests are parsed at once; the others wait their turn.
const MAX_PARALLEL_PARSES: usize = 2;

static PARSE_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_PARALLEL_PARSES);

pub(super) async fn get(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let job = api
        .server
        .job(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("job not found"))?;
    answer(index, wire::job(&api.server, &job))
}

pub(super) async fn deregister(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
) -> ApiResult {
    let purge = q.flag("purge")?;
    scope.check(scope.namespace(), "submit-job")?;
    let resp = api.server.stop_job(scope.namespace(), &id, purge).await?;
    answer(resp.index, wire::deregister_response(&resp))
}

pub(super) async fn plan(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let (mut parsed, diff) = wire::plan_request(json_body(body)?)?;
    if parsed.spec.name != id {
        return Err(ApiError::bad_request("Job ID does not match"));
    }
    check_region(&api, parsed.region.as_deref())?;
    place_in_namespace(&scope, None, &mut parsed.spec)?;
    let existing = api.server.job(&parsed.spec.namespace, &id);
    let index = api.server.index();
    let plan = api.server.plan_job(parsed.spec).await?;
    answer(
        index,
        wire::plan_response(&plan, existing.as_ref(), &id, diff, parsed.warnings),
    )
}

pub(super) async fn allocations(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    // Nomad answers an unknown job's allocations with an empty list. `?all` (those
    // of an earlier job of the same id too) changes nothing: allocations outlive a
    // purge only until collected, and are listed meanwhile.
    q.flag("all")?;
    let stubs: Vec<_> = api
        .server
        .job_allocations(scope.namespace(), &id)
        .iter()
        .map(|a| wire::alloc_stub(&api.server, a))
        .collect();
    answer(index, stubs)
}

pub(super) async fn evaluations(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let evals: Vec<_> = api
        .server
        .job_evaluations(scope.namespace(), &id)
        .iter()
        .map(wire::eval)
        .collect();
    answer(index, evals)
}

pub(super) async fn summary(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let (job, summary) = api
        .server
        .job_summary(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("job not found"))?;
    answer(index, wire::job_summary(&job, &summary))
}

pub(super) async fn versions(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let versions = api
        .server
        .job_versions(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("job versions not found"))?;
    let known = api.server.known_leader().is_some();
    answer(
        index,
        wire::job_versions(&api.server, &versions, index, known),
    )
}

/// `GET /v1/job/:id/scale`: the groups' counts (Nomad's `JobScaleStatusResponse`).
pub(super) async fn scale_status(
    State(api): State<Api>,
    Path(id): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let (job, summary) = api
        .server
        .job_summary(scope.namespace(), &id)
        .ok_or_else(|| ApiError::not_found("job not found"))?;
    answer(index, wire::scale_status(&job, &summary))
}

/// `{"Count": N, "Target": {"Group": "g"}, "Message": "..."}` of a scale request.
#[derive(Debug, Deserialize)]
struct ScaleRequest {
    #[serde(rename = "Count", alias = "count", default)]
    count: Option<i64>,
    #[serde(rename = "Target", alias = "target", default)]
    target: std::collections::BTreeMap<String, String>,
    #[serde(rename = "Message", alias = "message", default)]
    message: Option<String>,
}

pub(super) async fn scale(
    State(api): State<Api>,
    Path(id): Path<String>,
    _q: Params,
    scope: Scope,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let req: ScaleRequest = json_body(body)?;
    let group = req
        .target
        .get("Group")
        .or_else(|| req.target.get("group"))
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing task group name in scaling request"))?;
    if let Some(job) = req.target.get("Job")
        && *job != id
    {
        return Err(ApiError::bad_request("job ID in payload did not match URL"));
    }
    let Some(count) = req.count else {
        return Err(ApiError::bad_request(
            "Count must be set: Drover's scaling requests change a group's count",
        ));
    };
    let count = u32::try_from(count).map_err(|_| {
        ApiError::bad_request(format!("scaling action count can't be negative ({count})"))
    })?;
    if let Some(message) = &req.message {
        // The submitter's words: quoted (no forged log lines) and cut short.
        let message: String = message.chars().take(256).collect();
        tracing::info!(job = %id, group = %group, count, message = ?message, "scaling a job");
    }
    let resp = api
        .server
        .scale_job(scope.namespace(), &id, group, count)
        .await?;
    answer(resp.index, wire::register_response(&resp))
}
