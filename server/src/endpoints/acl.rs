//! ACLs: resolving a request's token to what it may do ([`Identity`]), the bootstrap,
//! and policies and tokens (Nomad's `ACL.*` RPCs). Writes are commits like any other:
//! the leader makes them, followers follow.

use std::sync::Arc;
use std::time::Duration;

use drover_server_api::Index;
use drover_server_api::acl::{
    self as api_acl, ANONYMOUS_POLICY, Acl, AclPolicy, AclToken, MAX_TOKEN_POLICIES,
    TOKEN_TYPE_CLIENT, TOKEN_TYPE_MANAGEMENT,
};
use drover_server_api::nomad;
use sha2::{Digest as _, Sha256};

use crate::error::ServerError;
use crate::server::Server;
use crate::state::evals::now_nanos;
use crate::state::{Batch, State};

/// Shortest TTL a token may be given (Nomad's default minimum is a minute; a second
/// here, so that expiry can be tried out).
pub const MIN_TOKEN_TTL: Duration = Duration::from_secs(1);
/// Longest TTL a token may be given (Nomad's default maximum).
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// Most tokens and policies kept (each is small; this bounds the state).
pub const MAX_ACL_OBJECTS: usize = 10_000;

/// Who a request comes from, once its token was looked up. Its `Debug` shows no
/// secret (an unresolved token is redacted; a known one has only its hash).
#[derive(Clone)]
pub enum Identity {
    /// No token: the `anonymous` policy's permissions (none without it).
    Anonymous(Arc<Acl>),
    /// A known, live token and its permissions.
    Token {
        /// The token (its secret only as a hash).
        token: Box<AclToken>,
        /// Its permissions.
        acl: Arc<Acl>,
    },
    /// A token that is no ACL token but has the shape of a JWT (a workload identity):
    /// the variables endpoints verify it themselves; every other endpoint treats it as
    /// an unknown token.
    Unresolved(String),
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Anonymous(_) => f.write_str("Anonymous"),
            Identity::Token { token, .. } => f
                .debug_struct("Token")
                .field("accessor_id", &token.accessor_id)
                .field("type", &token.token_type)
                .finish_non_exhaustive(),
            Identity::Unresolved(_) => f.write_str("Unresolved(<redacted>)"),
        }
    }
}

impl Identity {
    /// The raw token of an unresolved identity (a JWT), for the variables endpoints
    /// to verify as a workload identity.
    pub fn unresolved_token(&self) -> Option<&str> {
        match self {
            Identity::Unresolved(t) => Some(t),
            _ => None,
        }
    }

    /// The permissions, for a resolved identity.
    pub fn acl(&self) -> Option<&Acl> {
        match self {
            Identity::Anonymous(a) | Identity::Token { acl: a, .. } => Some(a),
            Identity::Unresolved(_) => None,
        }
    }

    /// The permissions, shared, for a resolved identity.
    pub fn acl_shared(&self) -> Option<Arc<Acl>> {
        match self {
            Identity::Anonymous(a) | Identity::Token { acl: a, .. } => Some(a.clone()),
            Identity::Unresolved(_) => None,
        }
    }

    /// The token, when the request carried a known one.
    pub fn token(&self) -> Option<&AclToken> {
        match self {
            Identity::Token { token, .. } => Some(token),
            _ => None,
        }
    }
}

/// Why a token was refused (403 with Nomad's texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No token has this secret.
    NotFound,
    /// The token expired.
    Expired,
}

impl TokenRefusal {
    /// Nomad's message.
    pub fn message(self) -> &'static str {
        match self {
            TokenRefusal::NotFound => "ACL token not found",
            TokenRefusal::Expired => "ACL token expired",
        }
    }
}

/// The hex SHA-256 the server keeps of a token's secret.
pub(crate) fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Three dot-separated base64url parts: a JWT (a workload identity).
fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts.iter().take(2).all(|p| !p.is_empty())
        && parts.iter().all(|p| {
            p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn acl_of(st: &State, t: &AclToken) -> Acl {
    if t.is_management() {
        return Acl::management();
    }
    let policies: Vec<_> = t
        .policies
        .iter()
        .filter_map(|p| st.acl.parsed_policy(p))
        .collect();
    Acl::new(policies.iter().map(|p| &**p))
}

fn bad(e: api_acl::PolicyError) -> ServerError {
    ServerError::Invalid(e.0)
}

impl Server {
    /// Are ACLs enforced?
    pub fn acl_enabled(&self) -> bool {
        self.core.config.acl_enabled
    }

    /// Who presents `secret` (none: no token).
    pub fn resolve_token(&self, secret: Option<&str>) -> Result<Identity, TokenRefusal> {
        let st = self.core.read();
        let Some(secret) = secret.filter(|s| !s.is_empty()) else {
            let acl = match st.acl.parsed_policy(ANONYMOUS_POLICY) {
                Some(p) => Acl::new([&*p]),
                None => Acl::deny_all(),
            };
            return Ok(Identity::Anonymous(Arc::new(acl)));
        };
        match st.acl.token_by_hash(&secret_hash(secret)) {
            Some(t) if t.expired(now_nanos()) => Err(TokenRefusal::Expired),
            Some(t) => Ok(Identity::Token {
                acl: Arc::new(acl_of(&st, t)),
                token: Box::new(t.clone()),
            }),
            None if looks_like_jwt(secret) => Ok(Identity::Unresolved(secret.to_owned())),
            None => Err(TokenRefusal::NotFound),
        }
    }

    /// `POST /v1/acl/bootstrap`: the first management token, once. Its secret is in
    /// the answer, and nowhere else.
    pub async fn acl_bootstrap(&self) -> Result<(Index, nomad::AclToken), ServerError> {
        let term = self.leadership.require()?;
        let secret = uuid::Uuid::new_v4().to_string();
        let hash = secret_hash(&secret);
        let (index, token) = term
            .commit(|st, index, now| {
                if let Some(done) = st.acl.bootstrapped() {
                    return Err(ServerError::Invalid(format!(
                        "ACL bootstrap already done (reset index: {done})"
                    )));
                }
                let token = AclToken {
                    accessor_id: uuid::Uuid::new_v4().to_string(),
                    secret_hash: hash,
                    name: "Bootstrap Token".into(),
                    token_type: TOKEN_TYPE_MANAGEMENT.into(),
                    policies: Vec::new(),
                    global: true,
                    create_time: now,
                    expiration_time: None,
                    expiration_ttl: 0,
                    create_index: index,
                    modify_index: index,
                };
                let b = Batch {
                    acl_tokens: vec![token.clone()],
                    acl_bootstrap: Some(index),
                    ..Batch::default()
                };
                Ok((b, token))
            })
            .await?;
        tracing::info!(accessor = %token.accessor_id, "ACL bootstrap done: management token made");
        Ok((index, nomad::AclToken::from_stored(&token, Some(&secret))))
    }

    /// Every policy.
    pub fn acl_policies(&self) -> Vec<AclPolicy> {
        self.core.read().acl.policies().cloned().collect()
    }

    /// A policy by name.
    pub fn acl_policy(&self, name: &str) -> Option<AclPolicy> {
        self.core.read().acl.policy(name).cloned()
    }

    /// Create or replace a policy; its rules must parse.
    pub async fn upsert_acl_policy(&self, p: nomad::AclPolicy) -> Result<Index, ServerError> {
        api_acl::check_policy_name(&p.name).map_err(bad)?;
        api_acl::check_name("Description", &p.description, false).map_err(bad)?;
        api_acl::parse_policy(&p.rules)
            .map_err(|e| ServerError::Invalid(format!("Rules: {}", e.0)))?;
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, _| {
                let old = st.acl.policy(&p.name);
                if old.is_none() && st.acl.policies().count() >= MAX_ACL_OBJECTS {
                    return Err(ServerError::Invalid(format!(
                        "too many ACL policies (at most {MAX_ACL_OBJECTS})"
                    )));
                }
                let stored = AclPolicy {
                    name: p.name.clone(),
                    description: p.description.clone(),
                    rules: p.rules.clone(),
                    create_index: old.map_or(index, |o| o.create_index),
                    modify_index: index,
                };
                Ok((
                    Batch {
                        acl_policies: vec![stored],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await?;
        Ok(index)
    }

    /// Delete a policy (a missing one: not found).
    pub async fn delete_acl_policy(&self, name: &str) -> Result<Index, ServerError> {
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, _, _| {
                if st.acl.policy(name).is_none() {
                    return Err(ServerError::NotFound("ACL policy not found".into()));
                }
                Ok((
                    Batch {
                        drop_acl_policies: vec![name.to_owned()],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await?;
        Ok(index)
    }

    /// Every token.
    pub fn acl_tokens(&self) -> Vec<AclToken> {
        self.core.read().acl.tokens().cloned().collect()
    }

    /// A token by accessor id.
    pub fn acl_token(&self, accessor: &str) -> Option<AclToken> {
        self.core.read().acl.token(accessor).cloned()
    }

    /// Create a token (`accessor` none) or change one (its name, policies, global):
    /// the token as served, with the secret when it was just made.
    pub async fn upsert_acl_token(
        &self,
        accessor: Option<&str>,
        req: nomad::AclToken,
    ) -> Result<(Index, nomad::AclToken), ServerError> {
        api_acl::check_name("Name", &req.name, false).map_err(bad)?;
        let token_type = if req.token_type.is_empty() {
            TOKEN_TYPE_CLIENT.to_owned()
        } else {
            req.token_type.clone()
        };
        match token_type.as_str() {
            TOKEN_TYPE_CLIENT if req.policies.is_empty() => {
                return Err(ServerError::Invalid(
                    "Policies: a client token needs at least one policy".into(),
                ));
            }
            TOKEN_TYPE_CLIENT => {}
            TOKEN_TYPE_MANAGEMENT if !req.policies.is_empty() => {
                return Err(ServerError::Invalid(
                    "Policies: a management token takes no policies".into(),
                ));
            }
            TOKEN_TYPE_MANAGEMENT => {}
            other => {
                return Err(ServerError::Invalid(format!(
                    "Type: {other:?} is neither \"client\" nor \"management\""
                )));
            }
        }
        if req.policies.len() > MAX_TOKEN_POLICIES {
            return Err(ServerError::Invalid(format!(
                "Policies: at most {MAX_TOKEN_POLICIES}"
            )));
        }
        let ttl = req.expiration_ttl;
        if !ttl.is_zero() && !(MIN_TOKEN_TTL..=MAX_TOKEN_TTL).contains(&ttl) {
            return Err(ServerError::Invalid(format!(
                "ExpirationTTL: must be between {} and {}",
                humantime::format_duration(MIN_TOKEN_TTL),
                humantime::format_duration(MAX_TOKEN_TTL)
            )));
        }
        let expiration_time = match &req.expiration_time {
            Some(t) => nomad::parse_time(t)
                .map_err(|e| ServerError::Invalid(format!("ExpirationTime: {e}")))?,
            None => None,
        };
        if expiration_time.is_some() && !ttl.is_zero() {
            return Err(ServerError::Invalid(
                "ExpirationTime and ExpirationTTL: set one or the other".into(),
            ));
        }
        let secret = accessor.is_none().then(|| uuid::Uuid::new_v4().to_string());
        let term = self.leadership.require()?;
        let (index, token) = term
            .commit(|st, index, now| {
                for p in &req.policies {
                    if st.acl.policy(p).is_none() {
                        return Err(ServerError::Invalid(format!(
                            "Policies: ACL policy {p:?} does not exist"
                        )));
                    }
                }
                let token = match accessor {
                    None => {
                        if st.acl.tokens().count() >= MAX_ACL_OBJECTS {
                            return Err(ServerError::Invalid(format!(
                                "too many ACL tokens (at most {MAX_ACL_OBJECTS})"
                            )));
                        }
                        let ttl_nanos = i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX);
                        if let Some(t) = expiration_time
                            && t <= now
                        {
                            return Err(ServerError::Invalid("ExpirationTime: in the past".into()));
                        }
                        AclToken {
                            accessor_id: uuid::Uuid::new_v4().to_string(),
                            secret_hash: secret_hash(secret.as_deref().unwrap_or_default()),
                            name: req.name.clone(),
                            token_type: token_type.clone(),
                            policies: req.policies.clone(),
                            global: req.global,
                            create_time: now,
                            expiration_time: if ttl.is_zero() {
                                expiration_time
                            } else {
                                Some(now.saturating_add(ttl_nanos))
                            },
                            expiration_ttl: ttl_nanos,
                            create_index: index,
                            modify_index: index,
                        }
                    }
                    Some(accessor) => {
                        let Some(old) = st.acl.token(accessor) else {
                            return Err(ServerError::NotFound("ACL token not found".into()));
                        };
                        if old.token_type != token_type {
                            return Err(ServerError::Invalid(
                                "Type: a token's type cannot change".into(),
                            ));
                        }
                        AclToken {
                            name: req.name.clone(),
                            policies: req.policies.clone(),
                            global: req.global,
                            modify_index: index,
                            ..old.clone()
                        }
                    }
                };
                Ok((
                    Batch {
                        acl_tokens: vec![token.clone()],
                        ..Batch::default()
                    },
                    token,
                ))
            })
            .await?;
        Ok((
            index,
            nomad::AclToken::from_stored(&token, secret.as_deref()),
        ))
    }

    /// Delete a token.
    pub async fn delete_acl_token(&self, accessor: &str) -> Result<Index, ServerError> {
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, _, _| {
                if st.acl.token(accessor).is_none() {
                    return Err(ServerError::NotFound("ACL token not found".into()));
                }
                Ok((
                    Batch {
                        drop_acl_tokens: vec![accessor.to_owned()],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await?;
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::looks_like_jwt;

    #[test]
    fn debug_output_shows_no_token() {
        let shown = format!("{:?}", super::Identity::Unresolved("a.b.c-secret".into()));
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn jwts_are_three_base64url_parts() {
        assert!(looks_like_jwt(
            "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln-_"
        ));
        assert!(!looks_like_jwt("0b8e3a6e-8f1d-4c5e-9b1a-2f7c6d5e4a3b"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt("a.b c.d"));
    }
}
