//! `/v1/services`, `/v1/service/:name`, `DELETE /v1/service/:name/:id` (Nomad's
//! native service discovery).
//!
//! `GET /v1/service/:name` serves the instances that are healthy: their checks pass
//! or warn, or they have none (Nomad serves every instance; Consul's health API does
//! this with `?passing`). `?all=true` serves every instance; each carries its `Status`
//! (`passing`, `warning`, `critical`, `pending`) either way.

use axum::Extension;
use axum::extract::{Path, State};
use drover_server_api::{
    NomadServiceNamespace, NomadServiceRegistration, NomadServiceStub, SERVICE_NAMESPACE,
};
use tokio_util::sync::CancellationToken;

use super::{Api, ApiResult, Params, answer, block};

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let services = api.server.services();
    if !q.in_default_namespace() || services.is_empty() {
        return answer(index, Vec::<NomadServiceNamespace>::new());
    }
    let services = services
        .into_iter()
        .map(|(service_name, tags)| NomadServiceStub { service_name, tags })
        .collect();
    answer(
        index,
        vec![NomadServiceNamespace {
            namespace: SERVICE_NAMESPACE.to_owned(),
            services,
        }],
    )
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(name): Path<String>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let all = q.flag("all")?;
    let index = block(&api, &q, stop).await?;
    if !q.in_default_namespace() {
        return answer(index, Vec::<NomadServiceRegistration>::new());
    }
    let regs: Vec<NomadServiceRegistration> = api
        .server
        .service_registrations(&name)
        .iter()
        .filter(|r| all || r.health.is_healthy())
        .map(NomadServiceRegistration::from)
        .collect();
    answer(index, regs)
}

pub(super) async fn delete(
    State(api): State<Api>,
    Path((name, id)): Path<(String, String)>,
    _q: Params,
) -> ApiResult {
    let index = api.server.delete_service(&name, &id).await?;
    answer(index, serde_json::json!({ "Index": index }))
}
