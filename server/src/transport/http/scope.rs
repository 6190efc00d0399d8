//! The namespace side of a request ([`Scope`]): the namespace it asks for
//! (`?namespace=`, `default` when absent, `*` for all) and what the caller may do in
//! each namespace. Lists answer for the namespaces the scope takes; reads and writes
//! of one object check the object's own namespace.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use drover_server_api::DEFAULT_NAMESPACE;
use drover_server_api::acl::Acl;

use super::acl::TokenLookup;
use super::{Api, ApiError};

/// The namespace a request asks for, and the caller's permissions (none to check when
/// ACLs are off).
#[derive(Clone)]
pub(super) struct Scope {
    namespace: String,
    /// The query named the namespace (else it is `default` by default).
    explicit: bool,
    /// `None`: ACLs are off, everything is allowed. With ACLs on, a caller without
    /// ACL permissions (a workload identity) has an empty set.
    acl: Option<Arc<Acl>>,
}

impl Scope {
    /// The namespace asked for: `default` when the query names none, `*` for all.
    pub(super) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The namespace the query names, if it names one.
    pub(super) fn query_namespace(&self) -> Option<&str> {
        self.explicit.then_some(self.namespace.as_str())
    }

    /// Whether the namespace given in the query was `*` (every namespace).
    pub(super) fn is_wildcard(&self) -> bool {
        self.namespace == "*"
    }

    /// May the caller use `capability` in namespace `ns`?
    pub(super) fn allows(&self, ns: &str, capability: &str) -> bool {
        self.acl
            .as_ref()
            .is_none_or(|acl| acl.allow_namespace_op(ns, capability))
    }

    /// 403 unless the caller may mount every volume `spec` asks for: each host volume
    /// as Nomad's `host_volume` rules say (read-only when the group's request is),
    /// naming the first it may not, and CSI volumes with `csi-mount-volume` in the
    /// job's namespace. Checked on every path a job's volumes come in by (register,
    /// plan, revert).
    pub(super) fn check_volumes(&self, spec: &drover_server_api::JobSpec) -> Result<(), ApiError> {
        if spec
            .groups
            .iter()
            .any(|g| g.volumes.values().any(|v| v.volume_type == "csi"))
        {
            self.check(&spec.namespace, "csi-mount-volume")?;
        }
        let Some(acl) = &self.acl else {
            return Ok(());
        };
        for g in &spec.groups {
            for v in g.volumes.values().filter(|v| v.volume_type == "host") {
                // As Nomad: a request that is not read-only needs `mount-readwrite`,
                // whatever its tasks' mounts say.
                let writable = !v.read_only;
                if !acl.allow_host_volume(&v.source, !writable) {
                    return Err(ApiError::new(
                        axum::http::StatusCode::FORBIDDEN,
                        format!(
                            "{}: host volume {:?} ({})",
                            super::PERMISSION_DENIED,
                            v.source,
                            if writable { "read-write" } else { "read-only" }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Has the caller any capability in namespace `ns` (what shows it in a list of
    /// namespaces)?
    pub(super) fn may_see_namespace(&self, ns: &str) -> bool {
        self.acl.as_ref().is_none_or(|acl| acl.allow_namespace(ns))
    }

    /// 403 unless the caller may use `capability` in namespace `ns` (the namespace of
    /// the object a request reaches by id, or of the job in its body).
    pub(super) fn check(&self, ns: &str, capability: &str) -> Result<(), ApiError> {
        if self.allows(ns, capability) {
            Ok(())
        } else {
            Err(super::acl::denied())
        }
    }

    /// The object found for `requested` (an id or a unique id prefix), if the
    /// caller may use `capability` in its namespace. Not found: 404 with
    /// `not_found`. Not allowed: 403 when `requested` was the object's whole id, but
    /// 404 when it was a prefix, so that prefixes are no way to learn which ids exist
    /// in namespaces the caller cannot read.
    pub(super) fn find<T>(
        &self,
        found: Option<T>,
        requested: &str,
        id_of: impl Fn(&T) -> &str,
        ns_of: impl Fn(&T) -> &str,
        capability: &str,
        not_found: &str,
    ) -> Result<T, ApiError> {
        let Some(o) = found else {
            return Err(ApiError::not_found(not_found));
        };
        if self.allows(ns_of(&o), capability) {
            Ok(o)
        } else if id_of(&o) == requested {
            Err(super::acl::denied())
        } else {
            Err(ApiError::not_found(not_found))
        }
    }

    /// Does a list answer for namespace `ns`? The one asked for; with `*`, every one
    /// where the caller may use `capability`.
    pub(super) fn lists(&self, ns: &str, capability: &str) -> bool {
        if self.is_wildcard() {
            self.allows(ns, capability)
        } else {
            ns == self.namespace
        }
    }

    /// [`Scope::lists`] as the filter the server's list reads take.
    pub(super) fn list_filter<'a>(
        &'a self,
        capability: &'a str,
    ) -> impl Fn(&str) -> bool + Sync + 'a {
        move |ns| self.lists(ns, capability)
    }
}

/// The namespace a query string names (its first non-empty `namespace=`), if any:
/// what the ACL middleware checks and the handlers act on, read the same way.
pub(super) fn query_namespace(query: &str) -> Option<String> {
    super::serde_urlencoded_pairs(query)
        .ok()
        .and_then(|pairs| {
            pairs
                .into_iter()
                .find(|(k, _)| k == "namespace")
                .map(|(_, v)| v)
        })
        .filter(|n| !n.is_empty())
}

impl FromRequestParts<Api> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _api: &Api) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let named = query_namespace(query);
        let explicit = named.is_some();
        let namespace = named.unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        let acl = match parts.extensions.get::<TokenLookup>() {
            // ACLs are off on this router (`resolve` did not run).
            None => None,
            Some(TokenLookup(Ok(id))) => Some(id.acl_shared().unwrap_or_default()),
            // `enforce` refused these before any handler; deny all if one gets here.
            Some(TokenLookup(Err(_))) => Some(Arc::new(Acl::default())),
        };
        Ok(Scope {
            namespace,
            explicit,
            acl,
        })
    }
}
