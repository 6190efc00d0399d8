//! `/v1/namespaces`, `/v1/namespace[/:name]` (Nomad's). A list shows the namespaces
//! where the caller has any capability; reading one needs the same; writes are
//! management's (the RULES table).

use axum::Extension;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use drover_server_api::Namespace;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::scope::Scope;
use super::{Api, ApiError, ApiResult, Params, answer, block, json_body};

/// A namespace as a client writes it (`{"Name", "Description", "Meta"}`; Nomad's
/// `Quota`, `Capabilities`, ... are accepted and left unused).
#[derive(Debug, Deserialize)]
struct NamespaceWrite {
    #[serde(rename = "Name", alias = "name", default)]
    name: String,
    #[serde(rename = "Description", alias = "description", default)]
    description: Option<String>,
    #[serde(rename = "Meta", alias = "meta", default)]
    meta: Option<std::collections::BTreeMap<String, String>>,
}

pub(super) async fn list(
    State(api): State<Api>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    let prefix = q.prefix();
    let list = api
        .server
        .namespaces(&|ns: &str| ns.starts_with(prefix) && scope.may_see_namespace(ns));
    answer(index, list)
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(name): Path<String>,
    q: Params,
    scope: Scope,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let index = block(&api, &q, stop).await?;
    if !scope.may_see_namespace(&name) {
        return Err(super::acl::denied());
    }
    let ns = api
        .server
        .namespace(&name)
        .ok_or_else(|| ApiError::not_found("Namespace not found"))?;
    answer(index, ns)
}

async fn upsert(
    api: &Api,
    name: Option<&str>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    let w: NamespaceWrite = json_body(body)?;
    let name = match (name, w.name.as_str()) {
        (Some(path), "") => path.to_owned(),
        (Some(path), body) if body == path => path.to_owned(),
        (Some(_), _) => {
            return Err(ApiError::bad_request(
                "Namespace name does not match request path",
            ));
        }
        (None, "") => return Err(ApiError::bad_request("Namespace name required")),
        (None, body) => body.to_owned(),
    };
    let ns = Namespace {
        name,
        description: w.description.unwrap_or_default(),
        meta: w.meta.unwrap_or_default(),
        create_index: 0,
        modify_index: 0,
    };
    let index = api.server.upsert_namespace(ns).await?;
    answer(index, serde_json::json!({ "Index": index }))
}

/// `PUT /v1/namespace/:name`.
pub(super) async fn put(
    State(api): State<Api>,
    Path(name): Path<String>,
    _q: Params,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    upsert(&api, Some(&name), body).await
}

/// `PUT /v1/namespace` (the name in the body).
pub(super) async fn put_unnamed(
    State(api): State<Api>,
    _q: Params,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> ApiResult {
    upsert(&api, None, body).await
}

pub(super) async fn delete(
    State(api): State<Api>,
    Path(name): Path<String>,
    _q: Params,
) -> ApiResult {
    let index = api.server.delete_namespace(&name).await?;
    answer(index, serde_json::json!({ "Index": index }))
}
