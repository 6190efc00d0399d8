//! ACLs on the HTTP API: who a request comes from ([`resolve`], a middleware that runs
//! first), what each route needs ([`RULES`], one table for every route, checked by
//! [`enforce`] after routing), and Nomad's `/v1/acl/*` endpoints.
//!
//! With ACLs off none of this runs (the shared token, when set, is checked instead).
//! Outside all of it: the JWKS and the web UI's page and assets under `/ui/`, which
//! hold no data (see `ui.rs`); every `/v1/` route is in [`RULES`].
//!
//! What a route needs, by method: reads (`GET`, `HEAD`) and writes (every other
//! method) may need different things. The namespace of a namespaced capability is the
//! request's `?namespace=` (`default` when absent; `*`: the capability in some
//! namespace, and lists show only the namespaces where the caller has it), or for
//! [`Need::Obj`] the namespace of the object the request reaches, which only its
//! handler knows (see `scope.rs`).

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, body::Bytes, extract::rejection::BytesRejection};
use drover_server_api::nomad::{self, AclPolicyListStub, AclTokenListStub};

use super::{Api, ApiError, ApiResult, PERMISSION_DENIED, Params, TOKEN_HEADER, answer, json_body};
use crate::endpoints::acl::{Identity, TokenRefusal};

/// What a route needs from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: anyone (Nomad's status endpoints, the bootstrap).
    Public,
    /// No route for this method (the router answers 405).
    NotRouted,
    /// A valid token, or the anonymous identity; the handler decides the rest.
    Caller,
    /// A management token.
    Management,
    /// A namespace capability in `?namespace=`.
    Ns(&'static str),
    /// A namespace capability in the namespace of the object the request reaches (an
    /// allocation, evaluation or deployment by id; the job in a register's body),
    /// which the handler checks (`Scope::check`): here only that the caller has it
    /// in some namespace.
    Obj(&'static str),
    /// `node:read`.
    NodeRead,
    /// `node:write`.
    NodeWrite,
    /// `plugin:list`.
    PluginList,
    /// `plugin:read`.
    PluginRead,
    /// `agent:read`.
    AgentRead,
    /// `operator:read`.
    OperatorRead,
    /// `operator:write`.
    OperatorWrite,
    /// Per topic of the event stream: `Node` needs `node:read`, job-ish topics
    /// `read-job` in the namespace, ACL topics management; `*` all of them.
    Events,
    /// The variables endpoints check each path themselves; a workload identity
    /// (an unresolved JWT) reaches them.
    Variables,
}

use Need::*;

/// Every route's needs: (path as routed, reads, writes). A route missing here cannot
/// be added: the router refuses to build (see [`rule`]).
pub(crate) const RULES: &[(&str, Need, Need)] = &[
    ("/v1/jobs", Ns("list-jobs"), Obj("submit-job")),
    ("/v1/jobs/parse", NotRouted, Ns("parse-job")),
    ("/v1/job/{id}", Ns("read-job"), Obj("submit-job")),
    ("/v1/job/{id}/allocations", Ns("read-job"), NotRouted),
    ("/v1/job/{id}/evaluations", Ns("read-job"), NotRouted),
    ("/v1/job/{id}/summary", Ns("read-job"), NotRouted),
    ("/v1/job/{id}/versions", Ns("read-job"), NotRouted),
    ("/v1/job/{id}/deployment", Ns("read-job"), NotRouted),
    ("/v1/job/{id}/deployments", Ns("read-job"), NotRouted),
    ("/v1/job/{id}/revert", NotRouted, Ns("submit-job")),
    ("/v1/job/{id}/plan", NotRouted, Obj("submit-job")),
    ("/v1/job/{id}/dispatch", NotRouted, Ns("dispatch-job")),
    (
        "/v1/job/{id}/scale",
        Ns("read-job-scaling"),
        Ns("scale-job"),
    ),
    ("/v1/deployments", Ns("read-job"), NotRouted),
    ("/v1/deployment/{id}", Obj("read-job"), NotRouted),
    (
        "/v1/deployment/allocations/{id}",
        Obj("read-job"),
        NotRouted,
    ),
    ("/v1/deployment/promote/{id}", NotRouted, Obj("submit-job")),
    ("/v1/deployment/fail/{id}", NotRouted, Obj("submit-job")),
    ("/v1/allocations", Ns("read-job"), NotRouted),
    ("/v1/allocation/{id}", Obj("read-job"), NotRouted),
    (
        "/v1/allocation/{id}/stop",
        NotRouted,
        Obj("alloc-lifecycle"),
    ),
    ("/v1/evaluations", Ns("read-job"), NotRouted),
    ("/v1/evaluation/{id}", Obj("read-job"), NotRouted),
    (
        "/v1/evaluation/{id}/allocations",
        Obj("read-job"),
        NotRouted,
    ),
    ("/v1/plugins", PluginList, NotRouted),
    ("/v1/volumes", Ns("csi-list-volume"), NotRouted),
    (
        "/v1/volume/csi/{id}",
        Ns("csi-read-volume"),
        Ns("csi-write-volume"),
    ),
    (
        "/v1/volume/csi/{id}/create",
        NotRouted,
        Ns("csi-write-volume"),
    ),
    (
        "/v1/volume/csi/{id}/delete",
        NotRouted,
        Ns("csi-write-volume"),
    ),
    ("/v1/plugin/csi/{id}", PluginRead, NotRouted),
    ("/v1/nodes", NodeRead, NotRouted),
    ("/v1/node/{id}", NodeRead, NotRouted),
    ("/v1/node/{id}/allocations", NodeRead, NotRouted),
    ("/v1/node/{id}/drain", NotRouted, NodeWrite),
    ("/v1/node/{id}/eligibility", NotRouted, NodeWrite),
    ("/v1/agent/self", AgentRead, NotRouted),
    ("/v1/agent/members", AgentRead, NotRouted),
    ("/v1/agent/health", Public, NotRouted),
    // Outside the token check (as Nomad 1.0's, which resolves no token for it); here
    // for the record, routed beside the JWKS.
    ("/v1/metrics", Public, NotRouted),
    ("/v1/status/leader", Public, NotRouted),
    ("/v1/status/peers", Public, NotRouted),
    ("/v1/status/servers", OperatorRead, NotRouted),
    ("/v1/status/term", Public, NotRouted),
    ("/v1/regions", Public, NotRouted),
    ("/v1/event/stream", Events, NotRouted),
    ("/v1/services", Ns("read-job"), NotRouted),
    ("/v1/service/{name}", Ns("read-job"), NotRouted),
    ("/v1/service/{name}/{id}", NotRouted, Ns("submit-job")),
    // The agents' endpoints, passed to the agent that runs the allocation.
    ("/v1/client/fs/logs/{alloc}", Obj("read-logs"), NotRouted),
    // A WebSocket outside the token middleware (a browser sends its token in the first
    // message): its handler checks alloc-exec, and alloc-node-exec for raw_exec
    // (exec_route.rs).
    ("/v1/client/allocation/{alloc}/exec", Caller, NotRouted),
    ("/v1/client/fs/ls/{alloc}", Obj("read-fs"), NotRouted),
    ("/v1/client/fs/stat/{alloc}", Obj("read-fs"), NotRouted),
    ("/v1/client/fs/cat/{alloc}", Obj("read-fs"), NotRouted),
    ("/v1/client/fs/readat/{alloc}", Obj("read-fs"), NotRouted),
    ("/v1/client/fs/stream/{alloc}", Obj("read-fs"), NotRouted),
    (
        "/v1/client/allocation/{alloc}/stats",
        Obj("read-job"),
        NotRouted,
    ),
    // ACLs: the handlers decide who sees which policy and token.
    ("/v1/acl/bootstrap", NotRouted, Public),
    ("/v1/acl/policies", Caller, NotRouted),
    ("/v1/acl/policy/{name}", Caller, Management),
    ("/v1/acl/tokens", Management, NotRouted),
    ("/v1/acl/token", NotRouted, Management),
    ("/v1/acl/token/self", Caller, NotRouted),
    ("/v1/acl/token/{accessor}", Caller, Management),
    // Variables (their handlers check the path against the caller's ACL or workload
    // identity) and namespaces (listing is filtered by the handler).
    ("/v1/vars", Variables, NotRouted),
    ("/v1/var/{*path}", Variables, Variables),
    ("/v1/namespaces", Caller, NotRouted),
    ("/v1/namespace", NotRouted, Management),
    ("/v1/namespace/{name}", Caller, Management),
    ("/v1/operator/raft/configuration", OperatorRead, NotRouted),
    (
        "/v1/operator/scheduler/configuration",
        OperatorRead,
        OperatorWrite,
    ),
    ("/v1/operator/keyring/keys", Management, NotRouted),
    ("/v1/operator/keyring/rotate", NotRouted, Management),
];

/// The needs of the route at `path` (as routed): (reads, writes).
pub(crate) fn rule(path: &str) -> Option<(Need, Need)> {
    RULES
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, r, w)| (*r, *w))
}

/// The outcome of looking a request's token up, for [`enforce`] and the handlers.
#[derive(Debug, Clone)]
pub(crate) struct TokenLookup(pub Result<Identity, TokenRefusal>);

/// The token of a request: `X-Nomad-Token`, else `Authorization: Bearer`.
pub(super) fn token_of(headers: &HeaderMap) -> Option<&str> {
    if let Some(t) = headers.get(TOKEN_HEADER) {
        return t.to_str().ok();
    }
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = auth.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Look the caller's token up (once, before anything else) and keep the outcome
/// with the request: the [`Identity`], or why the token was refused.
pub(crate) async fn resolve(State(api): State<Api>, mut req: Request, next: Next) -> Response {
    let outcome = {
        let token = token_of(req.headers());
        // A header that is no text is a token that cannot be anyone's.
        if req.headers().contains_key(TOKEN_HEADER) && token.is_none() {
            Err(TokenRefusal::NotFound)
        } else {
            api.server.resolve_token(token)
        }
    };
    if let Ok(id) = &outcome {
        req.extensions_mut().insert(id.clone());
    }
    req.extensions_mut().insert(TokenLookup(outcome));
    next.run(req).await
}

pub(super) fn denied() -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, PERMISSION_DENIED)
}

fn namespace_of(req: &Request) -> String {
    super::scope::query_namespace(req.uri().query().unwrap_or(""))
        .unwrap_or_else(|| drover_server_api::DEFAULT_NAMESPACE.to_owned())
}

/// Is the event stream of this request allowed: each topic asked for (all of them
/// when none is) by what it shows?
fn events_allowed(acl: &drover_server_api::acl::Acl, req: &Request, ns: &str) -> bool {
    let query = req.uri().query().unwrap_or("");
    let topics: Vec<String> = super::serde_urlencoded_pairs(query)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == "topic")
        .map(|(_, v)| v.split_once(':').map_or(v.clone(), |(t, _)| t.to_owned()))
        .collect();
    let topics = if topics.is_empty() {
        vec!["*".to_owned()]
    } else {
        topics
    };
    topics.iter().all(|t| match t.as_str() {
        "Node" | "NodeDrain" | "NodePool" => acl.allow_node_read(),
        "Job" | "Evaluation" | "Allocation" | "Deployment" | "Service" => {
            acl.allow_namespace_op(ns, "read-job")
        }
        _ => acl.is_management(),
    })
}

/// Check the caller against the needs of the route the request reached (a route
/// layer: after routing, so the route is known). Fails closed: a route with no rule
/// is refused.
pub(crate) async fn enforce(req: Request, next: Next) -> Response {
    let Some(path) = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
    else {
        return denied().into_response();
    };
    let read = req.method() == http::Method::GET || req.method() == http::Method::HEAD;
    let need = match rule(&path) {
        Some((r, w)) => {
            if read {
                r
            } else {
                w
            }
        }
        None => {
            tracing::error!(route = %path, "no ACL rule for this route: refused");
            return denied().into_response();
        }
    };
    if matches!(need, Public | NotRouted) {
        return next.run(req).await;
    }
    let identity = match req.extensions().get::<TokenLookup>() {
        Some(TokenLookup(Ok(id))) => id.clone(),
        Some(TokenLookup(Err(why))) => {
            return ApiError::new(StatusCode::FORBIDDEN, why.message()).into_response();
        }
        // `resolve` did not run: ACLs are off on this router.
        None => return next.run(req).await,
    };
    let Some(acl) = identity.acl() else {
        // A JWT that is no ACL token: only the variables endpoints take it.
        if need == Variables {
            return next.run(req).await;
        }
        return ApiError::new(StatusCode::FORBIDDEN, TokenRefusal::NotFound.message())
            .into_response();
    };
    let ns = namespace_of(&req);
    let allowed = match need {
        Public | NotRouted | Caller | Variables => true,
        // The handler checks the object's namespace; a caller who has the capability
        // in no namespace at all is refused before anything is read.
        Obj(cap) => acl.allow_namespace_op("*", cap),
        Management => acl.is_management(),
        Ns(cap) => acl.allow_namespace_op(&ns, cap),
        NodeRead => acl.allow_node_read(),
        NodeWrite => acl.allow_node_write(),
        PluginList => acl.allow_plugin_list(),
        PluginRead => acl.allow_plugin_read(),
        AgentRead => acl.allow_agent_read(),
        OperatorRead => acl.allow_operator_read(),
        OperatorWrite => acl.allow_operator_write(),
        Events => events_allowed(acl, &req, &ns),
    };
    if !allowed {
        tracing::debug!(
            route = %path,
            method = %req.method(),
            accessor = identity.token().map_or("anonymous", |t| t.accessor_id.as_str()),
            "ACL: permission denied"
        );
        return denied().into_response();
    }
    next.run(req).await
}

fn acl_disabled(api: &Api) -> Result<(), ApiError> {
    if api.server.acl_enabled() {
        Ok(())
    } else {
        Err(ApiError::bad_request("ACL support disabled"))
    }
}

fn identity(id: Option<Extension<Identity>>) -> Result<Identity, ApiError> {
    id.map(|Extension(i)| i).ok_or_else(denied)
}

fn empty(index: drover_server_api::Index) -> ApiResult {
    let mut resp = StatusCode::OK.into_response();
    resp.headers_mut()
        .insert(super::INDEX_HEADER, HeaderValue::from(index));
    Ok(resp)
}

pub(super) async fn bootstrap(
    State(api): State<Api>,
    _q: Params,
    _body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    acl_disabled(&api)?;
    let (index, token) = api.server.acl_bootstrap().await?;
    answer(index, token)
}

pub(super) async fn list_policies(
    State(api): State<Api>,
    _q: Params,
    id: Option<Extension<Identity>>,
) -> ApiResult {
    acl_disabled(&api)?;
    let id = identity(id)?;
    let own: Option<&[String]> = match &id {
        Identity::Token { token, .. } if token.is_management() => None,
        Identity::Token { token, .. } => Some(token.policies.as_slice()),
        _ => Some(&[][..]),
    };
    let policies: Vec<AclPolicyListStub> = api
        .server
        .acl_policies()
        .iter()
        .filter(|p| own.is_none_or(|own| own.contains(&p.name)))
        .map(AclPolicyListStub::from)
        .collect();
    answer(api.server.index(), policies)
}

pub(super) async fn get_policy(
    State(api): State<Api>,
    Path(name): Path<String>,
    _q: Params,
    id: Option<Extension<Identity>>,
) -> ApiResult {
    acl_disabled(&api)?;
    let may = match identity(id)? {
        Identity::Token { token, .. } => token.is_management() || token.policies.contains(&name),
        _ => false,
    };
    if !may {
        return Err(denied());
    }
    match api.server.acl_policy(&name) {
        Some(p) => answer(api.server.index(), nomad::AclPolicy::from(&p)),
        None => Err(ApiError::not_found("ACL policy not found")),
    }
}

pub(super) async fn put_policy(
    State(api): State<Api>,
    Path(name): Path<String>,
    _q: Params,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    acl_disabled(&api)?;
    let mut p: nomad::AclPolicy = json_body(body)?;
    if p.name.is_empty() {
        p.name.clone_from(&name);
    }
    if p.name != name {
        return Err(ApiError::bad_request(
            "ACL policy name does not match request path",
        ));
    }
    let index = api.server.upsert_acl_policy(p).await?;
    empty(index)
}

pub(super) async fn delete_policy(
    State(api): State<Api>,
    Path(name): Path<String>,
    _q: Params,
) -> ApiResult {
    acl_disabled(&api)?;
    let index = api.server.delete_acl_policy(&name).await?;
    empty(index)
}

pub(super) async fn list_tokens(State(api): State<Api>, _q: Params) -> ApiResult {
    acl_disabled(&api)?;
    let tokens: Vec<AclTokenListStub> = api
        .server
        .acl_tokens()
        .iter()
        .map(AclTokenListStub::from)
        .collect();
    answer(api.server.index(), tokens)
}

pub(super) async fn create_token(
    State(api): State<Api>,
    _q: Params,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    acl_disabled(&api)?;
    let t: nomad::AclToken = json_body(body)?;
    if !t.accessor_id.is_empty() {
        // Nomad's `POST /v1/acl/token` with an accessor updates it.
        let accessor = t.accessor_id.clone();
        let (index, token) = api.server.upsert_acl_token(Some(&accessor), t).await?;
        return answer(index, token);
    }
    let (index, token) = api.server.upsert_acl_token(None, t).await?;
    answer(index, token)
}

pub(super) async fn token_self(
    State(api): State<Api>,
    _q: Params,
    id: Option<Extension<Identity>>,
) -> ApiResult {
    acl_disabled(&api)?;
    match identity(id)? {
        Identity::Token { token, .. } => answer(
            api.server.index(),
            // The caller holds the secret already; Nomad serves it back.
            nomad::AclToken::from_stored(&token, None),
        ),
        _ => Err(ApiError::not_found("ACL token not found")),
    }
}

pub(super) async fn get_token(
    State(api): State<Api>,
    Path(accessor): Path<String>,
    _q: Params,
    id: Option<Extension<Identity>>,
) -> ApiResult {
    acl_disabled(&api)?;
    let may = match identity(id)? {
        Identity::Token { token, .. } => token.is_management() || token.accessor_id == accessor,
        _ => false,
    };
    if !may {
        return Err(denied());
    }
    match api.server.acl_token(&accessor) {
        // Only the hash is kept: the secret cannot be served again, to anyone.
        Some(t) => answer(api.server.index(), nomad::AclToken::from_stored(&t, None)),
        None => Err(ApiError::not_found("ACL token not found")),
    }
}

pub(super) async fn update_token(
    State(api): State<Api>,
    Path(accessor): Path<String>,
    _q: Params,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    acl_disabled(&api)?;
    let t: nomad::AclToken = json_body(body)?;
    if !t.accessor_id.is_empty() && t.accessor_id != accessor {
        return Err(ApiError::bad_request(
            "ACL token accessor does not match request path",
        ));
    }
    let (index, token) = api.server.upsert_acl_token(Some(&accessor), t).await?;
    answer(index, token)
}

pub(super) async fn delete_token(
    State(api): State<Api>,
    Path(accessor): Path<String>,
    _q: Params,
) -> ApiResult {
    acl_disabled(&api)?;
    let index = api.server.delete_acl_token(&accessor).await?;
    empty(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_is_for_one_path_once() {
        let mut seen = std::collections::HashSet::new();
        for (p, _, _) in RULES {
            assert!(seen.insert(*p), "{p} twice in RULES");
            assert!(p.starts_with("/v1/"), "{p}");
        }
    }

    #[test]
    fn tokens_come_from_the_nomad_header_or_a_bearer() {
        let mut h = HeaderMap::new();
        assert_eq!(token_of(&h), None);
        h.insert("authorization", HeaderValue::from_static("Bearer abc"));
        assert_eq!(token_of(&h), Some("abc"));
        h.insert(TOKEN_HEADER, HeaderValue::from_static("xyz"));
        assert_eq!(token_of(&h), Some("xyz"));
    }
}
