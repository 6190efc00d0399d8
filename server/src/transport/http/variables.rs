//! `/v1/vars`, `/v1/var/:path` (Nomad's variables) and `/v1/operator/keyring/{keys,
//! rotate}`.
//!
//! Who may do what, until ACLs decide it: the cluster token (or anyone, on a server
//! without one) does everything; a workload identity (a task's JWT from
//! `secrets/nomad_token`, in `X-Nomad-Token`) may only read (get, list) the variables
//! of its own job in its namespace: `nomad/jobs/<job>`, `.../<group>`,
//! `.../<group>/<task>`, while its allocation is not terminal. Everything else it
//! asks for is 403. [`admits_workload_identity`] is the one place that lets such a
//! token past the cluster-token check. With ACLs, an ACL token may do what its
//! policies' `variables` rules grant (`list`, `read`, `write`, `destroy`; management:
//! everything), and the resolver hands a workload identity over as `Unresolved`.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::IntoResponse;
use drover_server_api::Index;
use drover_server_api::variables::Variable;
use tokio_util::sync::CancellationToken;

use super::{
    Api, ApiError, ApiResult, INDEX_HEADER, Params, TOKEN_HEADER, answer, block, json_body,
};
use crate::endpoints::acl::Identity;
use crate::variables::{VarCaller, VarWrite};
use drover_server_api::acl::VariableOp;

/// Set on a request whose token is the cluster token (checked by `check_token`).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClusterTokenChecked;

/// Whether `token` has the shape of a JWT: three dot-separated base64url parts (a
/// workload identity; the cluster token is never checked against it).
pub(crate) fn looks_like_jwt(token: &[u8]) -> bool {
    let parts: Vec<&[u8]> = token.split(|b| *b == b'.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        })
}

/// Whether a request that does not carry the cluster token may still reach its
/// handler: a read of variables with a workload identity, which the handler verifies.
/// (With ACLs this becomes one more kind of token the ACL resolver knows.)
pub(super) fn admits_workload_identity(method: &Method, path: &str, token: &[u8]) -> bool {
    (method == Method::GET || method == Method::HEAD)
        && (path == "/v1/vars" || path.starts_with("/v1/var/"))
        && looks_like_jwt(token)
}

/// Who asks: the operator, or a verified workload identity (403 when it does not
/// verify).
fn caller(
    api: &Api,
    headers: &HeaderMap,
    checked: Option<&ClusterTokenChecked>,
    identity: Option<&Identity>,
) -> Result<VarCaller, ApiError> {
    if checked.is_some() {
        return Ok(VarCaller::Operator);
    }
    // With ACLs: the resolved token's variables rules, or a workload identity (the
    // one kind of token the resolver leaves to this module).
    if let Some(identity) = identity {
        return match identity {
            Identity::Unresolved(token) => Ok(VarCaller::Workload(
                api.server.verify_workload_identity(token)?,
            )),
            Identity::Anonymous(acl) | Identity::Token { acl, .. } => {
                Ok(VarCaller::Acl(acl.clone()))
            }
        };
    }
    match headers.get(TOKEN_HEADER).map(HeaderValue::as_bytes) {
        Some(t) if looks_like_jwt(t) => {
            let token = std::str::from_utf8(t)
                .map_err(|_| ApiError::new(StatusCode::FORBIDDEN, "Permission denied"))?;
            Ok(VarCaller::Workload(
                api.server.verify_workload_identity(token)?,
            ))
        }
        _ => Ok(VarCaller::Operator),
    }
}

fn cas(q: &Params) -> Result<Option<Index>, ApiError> {
    match q.get("cas") {
        None | Some("") => Ok(None),
        Some(c) => c
            .parse::<Index>()
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("can not parse cas: {e}"))),
    }
}

fn write_answer(w: VarWrite, delete: bool) -> ApiResult {
    match w {
        VarWrite::Conflict(current) => {
            let mut resp = answer(current.modify_index, &current)?;
            *resp.status_mut() = StatusCode::CONFLICT;
            Ok(resp)
        }
        VarWrite::Done { index, .. } if delete => {
            let mut resp = StatusCode::NO_CONTENT.into_response();
            resp.headers_mut()
                .insert(INDEX_HEADER, HeaderValue::from(index));
            Ok(resp)
        }
        VarWrite::Done { variable, index } => answer(index, variable),
    }
}

/// 403 unless `c` may `op` the variable at `path` of the request's namespace.
fn may_write(c: &VarCaller, q: &Params, path: &str, op: VariableOp) -> Result<(), ApiError> {
    let ns = crate::variables::namespace_of(q.get("namespace"))?;
    if c.may(&ns, path, op) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "Permission denied"))
    }
}

pub(super) async fn list(
    State(api): State<Api>,
    headers: HeaderMap,
    checked: Option<Extension<ClusterTokenChecked>>,
    identity: Option<Extension<Identity>>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let who = caller(&api, &headers, checked.as_deref(), identity.as_deref())?;
    let index = block(&api, &q, stop).await?;
    let list = api
        .server
        .variables(who.namespace_or(q.get("namespace")), q.prefix(), &who)?;
    answer(index, list)
}

pub(super) async fn get(
    State(api): State<Api>,
    Path(path): Path<String>,
    headers: HeaderMap,
    checked: Option<Extension<ClusterTokenChecked>>,
    identity: Option<Extension<Identity>>,
    q: Params,
    stop: Option<Extension<CancellationToken>>,
) -> ApiResult {
    let who = caller(&api, &headers, checked.as_deref(), identity.as_deref())?;
    let index = block(&api, &q, stop).await?;
    match api
        .server
        .variable(who.namespace_or(q.get("namespace")), &path, &who)?
    {
        Some(v) => answer(index, v),
        None => Err(ApiError::not_found("variable not found")),
    }
}

pub(super) async fn put(
    State(api): State<Api>,
    Path(path): Path<String>,
    headers: HeaderMap,
    checked: Option<Extension<ClusterTokenChecked>>,
    identity: Option<Extension<Identity>>,
    q: Params,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let who = caller(&api, &headers, checked.as_deref(), identity.as_deref())?;
    may_write(&who, &q, &path, VariableOp::Write)?;
    let cas = cas(&q)?;
    let v: Variable = json_body(body)?;
    let w = api
        .server
        .put_variable(q.get("namespace"), &path, v.items, cas)
        .await?;
    write_answer(w, false)
}

pub(super) async fn delete(
    State(api): State<Api>,
    Path(path): Path<String>,
    headers: HeaderMap,
    checked: Option<Extension<ClusterTokenChecked>>,
    identity: Option<Extension<Identity>>,
    q: Params,
) -> ApiResult {
    let who = caller(&api, &headers, checked.as_deref(), identity.as_deref())?;
    may_write(&who, &q, &path, VariableOp::Destroy)?;
    let cas = cas(&q)?;
    let w = api
        .server
        .delete_variable(q.get("namespace"), &path, cas)
        .await?;
    write_answer(w, true)
}

pub(super) async fn keyring_keys(State(api): State<Api>, q: Params) -> ApiResult {
    let _ = q;
    answer(api.server.index(), api.server.keyring_keys())
}

/// `GET /.well-known/jwks.json`: the public keys that verify workload identities.
/// Unauthenticated, as in Nomad: a third party checks a task's token with them, and
/// they are public keys only.
pub(super) async fn jwks(State(api): State<Api>) -> ApiResult {
    answer(api.server.index(), api.server.jwks())
}

pub(super) async fn keyring_rotate(State(api): State<Api>, q: Params) -> ApiResult {
    let full = q.0.iter().any(|(k, _)| k == "full");
    let r = api.server.rotate_keyring(full).await?;
    answer(r.index, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_variable_reads_with_a_jwt_pass_without_the_cluster_token() {
        let jwt = b"eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln";
        assert!(admits_workload_identity(
            &Method::GET,
            "/v1/var/nomad/jobs/web",
            jwt
        ));
        assert!(admits_workload_identity(&Method::GET, "/v1/vars", jwt));
        assert!(!admits_workload_identity(
            &Method::PUT,
            "/v1/var/nomad/jobs/web",
            jwt
        ));
        assert!(!admits_workload_identity(&Method::DELETE, "/v1/var/x", jwt));
        assert!(!admits_workload_identity(&Method::GET, "/v1/jobs", jwt));
        assert!(!admits_workload_identity(
            &Method::GET,
            "/v1/variables",
            jwt
        ));
        assert!(!admits_workload_identity(
            &Method::GET,
            "/v1/var/x",
            b"secret-token"
        ));
        assert!(!admits_workload_identity(&Method::GET, "/v1/var/x", b"a.b"));
        assert!(!admits_workload_identity(
            &Method::GET,
            "/v1/var/x",
            b"a..c"
        ));
        assert!(!admits_workload_identity(
            &Method::GET,
            "/v1/var/x",
            b"a.b.c=+"
        ));
    }
}
