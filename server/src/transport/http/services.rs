//! `/v1/services`, `/v1/service/:name`, `DELETE /v1/service/:name/:id` (Nomad's
//! native service discovery).
//!
//! `GET /v1/service/:name` serves the instances that are healthy: their checks pass
//! or warn, or they have none (Nomad serves every instance; Consul's health API does
//! this with `?passing`). `?all=true` serves every instance; each carries its `Status`
//! (`passing`, `warning`, `critical`, `pending`) either way.

use axum::Extension;
use axum::extract::{Path, State};
use drover_server_api::{NomadServiceNamespace, NomadServiceRegistration, NomadServiceStub};
use tokio_util::sync::CancellationToken;

use super::scope::Scope;
use super::{Api, ApiResult, Params, answer, block};

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let list: Vec<NomadServiceNamespace> = api
        .server
        .services(&scope.list_filter("read-job"))
        .into_iter()
        .map(|(namespace, services)| NomadServiceNamespace {
            namespace,
            services: services
                .into_iter()
                .map(|(service_name, tags)| NomadServiceStub { service_name, tags })
                .collect(),
        })
        .collect();
    answer(index, list)
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(name): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let all = q.flag("all")?;
    let index = block(&api, &q, stop).await?;
    let regs: Vec<NomadServiceRegistration> = api
        .server
        .service_registrations(scope.namespace(), &name)
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
    scope: Scope,
) -> ApiResult {
    let index = api
        .server
        .delete_service(scope.namespace(), &name, &id)
        .await?;
    answer(index, serde_json::json!({ "Index": index }))
}
