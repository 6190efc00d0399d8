//! The conversions between the server's internal types and Nomad's wire shapes
//! (`drover_server_api::nomad`), in one place for every route.
//!

use std::collections::BTreeMap;

use drover_server_api::{
    Allocation, Evaluation, GroupSummary, Index, Job, JobPlanResponse, JobRegisterResponse, Node,
    nomad,
};
use serde_json::{Value, json};

use super::ApiError;
use crate::events::Payload;
use crate::server::Server;

/// A submitted job, converted: the spec, the region it names, warnings.
pub(super) type Submitted = nomad::ParsedJob;

fn to_value(v: impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// `{"Job": {...}}` must carry a job (Nomad's "Job must be specified").
fn has_job(body: &Value) -> Result<(), ApiError> {
    match body.get("Job").or_else(|| body.get("job")) {
        Some(j) if !j.is_null() => Ok(()),
        _ => Err(ApiError::bad_request("Job must be specified")),
    }
}

fn convert(job: &nomad::Job) -> Result<Submitted, ApiError> {
    if job.id.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::bad_request("Job ID hasn't been provided"));
    }
    job.to_spec()
        .map_err(|e| ApiError::bad_request(format!("invalid job: {e}")))
}

/// A register request's job, and the request's own `Namespace` (when it names one).
pub(super) fn register_request(body: Value) -> Result<(Submitted, Option<String>), ApiError> {
    has_job(&body)?;
    let req: nomad::JobRegisterRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("Failed to decode request body: {e}")))?;
    let ns = req.namespace.clone().filter(|n| !n.is_empty());
    Ok((convert(&req.job)?, ns))
}

pub(super) fn plan_request(body: Value) -> Result<(Submitted, bool), ApiError> {
    has_job(&body)?;
    let req: nomad::JobPlanRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("Failed to decode request body: {e}")))?;
    Ok((convert(&req.job)?, req.diff))
}

/// `/v1/jobs/parse`: an HCL job file's text as Nomad's API job. Nothing of this
/// machine is read (`file()` and variable files are refused); `canonicalize` fills in
/// the defaults the server would apply (through Drover's own conversion).
pub(super) fn parse_hcl(
    hcl: &str,
    canonicalize: bool,
    variables: Option<&str>,
) -> Result<Value, ApiError> {
    if variables.is_some_and(|v| !v.trim().is_empty()) {
        return Err(ApiError::bad_request(
            "Variables are not supported by this endpoint yet: give the values in the \
             job file's variable defaults, or parse with `drover job run -var` locally",
        ));
    }
    let inputs = drover_server_api::hcl::VarInputs::default();
    let mut wrapped = drover_server_api::hcl::parse_without_files("job.hcl", hcl, &inputs)
        .map_err(|e| ApiError::bad_request(format!("error parsing: {e}")))?;
    let job_value = wrapped
        .get_mut("Job")
        .map(Value::take)
        .ok_or_else(|| ApiError::bad_request("error parsing: no job block"))?;
    if !canonicalize {
        return Ok(job_value);
    }
    let job: nomad::Job = serde_json::from_value(job_value)
        .map_err(|e| ApiError::bad_request(format!("error parsing: {e}")))?;
    let parsed = job
        .to_spec()
        .map_err(|e| ApiError::bad_request(format!("invalid job: {e}")))?;
    let mut out = nomad::Job::from(&parsed.spec);
    out.region = Some(
        parsed
            .region
            .unwrap_or_else(|| nomad::DEFAULT_REGION.to_owned()),
    );
    Ok(to_value(out))
}

pub(super) fn register_response(r: &JobRegisterResponse) -> Value {
    to_value(nomad::JobRegisterResponse::from(r))
}

pub(super) fn deregister_response(r: &JobRegisterResponse) -> Value {
    to_value(nomad::JobDeregisterResponse::from(r))
}

/// A stored job in Nomad's shape, in this server's region.
fn nomad_job(server: &Server, j: &Job) -> nomad::Job {
    let mut out = nomad::Job::from(j);
    out.region = Some(server.region().to_owned());
    out
}

pub(super) fn job(server: &Server, j: &Job) -> Value {
    to_value(nomad_job(server, j))
}

pub(super) fn job_stub(j: &Job, summary: &BTreeMap<String, GroupSummary>) -> Value {
    to_value(nomad::JobListStub::new(j, summary))
}

pub(super) fn job_summary(j: &Job, summary: &BTreeMap<String, GroupSummary>) -> Value {
    to_value(nomad::JobSummary::new(
        &j.spec.namespace,
        &j.spec.name,
        summary,
        j.create_index,
        j.modify_index,
    ))
}

pub(super) fn job_versions(server: &Server, versions: &[Job], index: Index, known: bool) -> Value {
    to_value(nomad::JobVersionsResponse {
        versions: versions.iter().map(|j| nomad_job(server, j)).collect(),
        diffs: None,
        index,
        last_contact: 0,
        known_leader: known,
    })
}

/// Nomad's `JobScaleStatusResponse`.
pub(super) fn scale_status(j: &Job, summary: &BTreeMap<String, GroupSummary>) -> Value {
    let groups: BTreeMap<&str, Value> = j
        .spec
        .groups
        .iter()
        .map(|g| {
            let s = summary.get(&g.name).copied().unwrap_or_default();
            (
                g.name.as_str(),
                json!({
                    "Desired": g.count,
                    "Placed": s.pending + s.running,
                    "Running": s.running,
                    "Healthy": s.running,
                    "Unhealthy": 0,
                    "Events": null,
                }),
            )
        })
        .collect();
    json!({
        "JobID": j.spec.name,
        "Namespace": j.spec.namespace,
        "JobCreateIndex": j.create_index,
        "JobModifyIndex": j.job_modify_index,
        "JobStopped": j.stop,
        "TaskGroups": groups,
    })
}

pub(super) fn plan_response(
    p: &JobPlanResponse,
    existing: Option<&Job>,
    id: &str,
    _diff: bool,
    warnings: Vec<String>,
) -> Value {
    to_value(nomad::JobPlanResponse::new(
        id,
        p,
        existing.is_some(),
        &warnings,
    ))
}

/// An allocation's line in a list.
pub(super) fn alloc_stub(server: &Server, a: &Allocation) -> Value {
    let job_type = server
        .job_type_of(&a.namespace, &a.job_name)
        .unwrap_or_default();
    to_value(nomad::AllocationListStub::new(a, job_type))
}

/// A whole allocation, with the version of its job it runs (and its tasks'
/// resources) when the server still has it.
pub(super) fn alloc(server: &Server, a: &Allocation, job: Option<&Job>) -> Value {
    let mut out = nomad::Allocation::from(a);
    if let Some(j) = job {
        if let Some(g) = j.spec.groups.iter().find(|g| g.name == a.group) {
            out = out.with_group(g);
        }
        out.job = Some(Box::new(nomad_job(server, j)));
    }
    to_value(out)
}

pub(super) fn eval(e: &Evaluation) -> Value {
    to_value(nomad::Evaluation::from(e))
}

pub(super) fn node_stub(n: &Node) -> Value {
    to_value(nomad::NodeListStub::from(n))
}

pub(super) fn node(n: &Node) -> Value {
    to_value(nomad::Node::from(n))
}

pub(super) fn event_payload(p: &Payload) -> Value {
    match p {
        Payload::Job(j) => json!({ "Job": to_value(nomad::Job::from(&**j)) }),
        Payload::Evaluation(e) => json!({ "Evaluation": eval(e) }),
        // Without the job (Nomad's: it keeps the events small).
        Payload::Allocation(a) => json!({ "Allocation": to_value(nomad::Allocation::from(&**a)) }),
        Payload::Node(n) => json!({ "Node": node(n) }),
        Payload::Deployment(d) => json!({ "Deployment": to_value(nomad::Deployment::from(&**d)) }),
    }
}
