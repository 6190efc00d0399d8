//! The ACL part of the state: policies (with their rules parsed once), tokens (by
//! accessor, and by the hash of their secret), and whether the cluster was
//! bootstrapped.
//!
//! Keys: `aclpolicy/<name>` (`AclPolicy`), `acltoken/<accessor>` (`AclToken`: the
//! secret only as its SHA-256), `aclbootstrap/done` (the index of the bootstrap).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use drover_server_api::Index;
use drover_server_api::acl::{AclPolicy, AclToken, Policy, parse_policy};

/// Key of a policy.
pub(crate) fn policy_key(name: &str) -> String {
    format!("aclpolicy/{name}")
}

/// Key of a token.
pub(crate) fn token_key(accessor: &str) -> String {
    format!("acltoken/{accessor}")
}

/// Key of the bootstrap marker.
pub(crate) const BOOTSTRAP_KEY: &str = "aclbootstrap/done";

/// ACL policies and tokens.
#[derive(Debug, Default)]
pub(crate) struct AclState {
    policies: BTreeMap<String, (AclPolicy, Arc<Policy>)>,
    tokens: BTreeMap<String, AclToken>,
    /// Accessor by hex SHA-256 of the secret.
    by_hash: HashMap<String, String>,
    /// The index of the bootstrap, once done.
    bootstrapped: Option<Index>,
}

impl AclState {
    pub(crate) fn put_policy(&mut self, p: AclPolicy) {
        // Rules were checked when the policy was written; rules that no longer parse
        // (a newer server's) grant nothing rather than stop the server.
        let parsed = parse_policy(&p.rules).unwrap_or_else(|e| {
            tracing::warn!(policy = %p.name, "stored ACL policy does not parse, granting nothing: {e}");
            Policy::default()
        });
        self.policies.insert(p.name.clone(), (p, Arc::new(parsed)));
    }

    pub(crate) fn remove_policy(&mut self, name: &str) {
        self.policies.remove(name);
    }

    pub(crate) fn put_token(&mut self, t: AclToken) {
        if let Some(old) = self.tokens.get(&t.accessor_id) {
            self.by_hash.remove(&old.secret_hash);
        }
        self.by_hash
            .insert(t.secret_hash.clone(), t.accessor_id.clone());
        self.tokens.insert(t.accessor_id.clone(), t);
    }

    pub(crate) fn remove_token(&mut self, accessor: &str) {
        if let Some(old) = self.tokens.remove(accessor) {
            self.by_hash.remove(&old.secret_hash);
        }
    }

    pub(crate) fn set_bootstrapped(&mut self, index: Index) {
        self.bootstrapped = Some(index);
    }

    pub(crate) fn bootstrapped(&self) -> Option<Index> {
        self.bootstrapped
    }

    pub(crate) fn policy(&self, name: &str) -> Option<&AclPolicy> {
        self.policies.get(name).map(|(p, _)| p)
    }

    pub(crate) fn parsed_policy(&self, name: &str) -> Option<Arc<Policy>> {
        self.policies.get(name).map(|(_, p)| p.clone())
    }

    pub(crate) fn policies(&self) -> impl Iterator<Item = &AclPolicy> {
        self.policies.values().map(|(p, _)| p)
    }

    pub(crate) fn token(&self, accessor: &str) -> Option<&AclToken> {
        self.tokens.get(accessor)
    }

    pub(crate) fn tokens(&self) -> impl Iterator<Item = &AclToken> {
        self.tokens.values()
    }

    /// The token whose secret hashes to `hash`; the stored hash is compared again in
    /// constant time (the map lookup only narrows it down).
    pub(crate) fn token_by_hash(&self, hash: &str) -> Option<&AclToken> {
        let accessor = self.by_hash.get(hash)?;
        let t = self.tokens.get(accessor)?;
        crate::transport::auth::token_eq(t.secret_hash.as_bytes(), hash.as_bytes()).then_some(t)
    }
}
