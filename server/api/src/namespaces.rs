//! Namespaces (Nomad's): every job, and with it its allocations, evaluations,
//! deployments, services and the variables it reads, lives in one. ACL policies grant
//! capabilities per namespace, so two teams on one cluster see and touch only their
//! own. `default` always exists; others are made with `PUT /v1/namespace/:name`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Index;

/// The namespace of everything that names none (Nomad's).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name (Nomad's `^[a-zA-Z0-9-]{1,128}$`).
pub const MAX_NAMESPACE_NAME: usize = 128;

/// Longest description, in bytes (Nomad's 256).
pub const MAX_NAMESPACE_DESCRIPTION: usize = 256;

/// Most `meta` entries of one namespace (a bound: the document is read on every
/// namespace list).
pub const MAX_NAMESPACE_META: usize = 64;

/// Most namespaces one cluster holds (Nomad leaves this unbounded; a bound keeps one
/// operator's script from filling the store).
pub const MAX_NAMESPACES: usize = 1024;

/// The serde default of a `namespace` field: [`DEFAULT_NAMESPACE`].
pub fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_owned()
}

/// Is `name` a namespace name Nomad would take (`[a-zA-Z0-9-]{1,128}`)? The error
/// says why not, for people.
///
/// ```
/// use drover_server_api::namespaces::check_namespace_name;
/// assert!(check_namespace_name("team-a").is_ok());
/// assert!(check_namespace_name("a/b").is_err());
/// ```
pub fn check_namespace_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a namespace name must not be empty".into());
    }
    if name.len() > MAX_NAMESPACE_NAME {
        return Err(format!(
            "namespace name is {} characters, at most {MAX_NAMESPACE_NAME}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(format!(
            "namespace name {name:?} contains {c:?}: only letters, digits and '-'"
        ));
    }
    Ok(())
}

/// A namespace as the server keeps it (and serves it, in Nomad's PascalCase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Namespace {
    /// Its name.
    pub name: String,
    /// What it is for, for people.
    #[serde(default)]
    pub description: String,
    /// Free-form metadata.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// Index of creation.
    #[serde(default)]
    pub create_index: Index,
    /// Index of the last change.
    #[serde(default)]
    pub modify_index: Index,
}

impl Namespace {
    /// The `default` namespace as it is before anyone wrote it.
    pub fn default_one() -> Namespace {
        Namespace {
            name: DEFAULT_NAMESPACE.to_owned(),
            description: "Default shared namespace".to_owned(),
            meta: BTreeMap::new(),
            create_index: 1,
            modify_index: 1,
        }
    }

    /// Check a namespace as a user wrote it: the name, and the bounds on the rest.
    pub fn check(&self) -> Result<(), String> {
        check_namespace_name(&self.name)?;
        if self.description.len() > MAX_NAMESPACE_DESCRIPTION {
            return Err(format!(
                "description is {} bytes, at most {MAX_NAMESPACE_DESCRIPTION}",
                self.description.len()
            ));
        }
        if self.meta.len() > MAX_NAMESPACE_META {
            return Err(format!(
                "meta has {} entries, at most {MAX_NAMESPACE_META}",
                self.meta.len()
            ));
        }
        if let Some((k, v)) = self.meta.iter().find(|(k, v)| k.len() + v.len() > 1024) {
            return Err(format!(
                "meta entry {k:?} is {} bytes, at most 1024",
                k.len() + v.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_nomads_rule() {
        for ok in ["default", "team-a", "A1", &"x".repeat(128)] {
            check_namespace_name(ok).unwrap();
        }
        for bad in ["", "a/b", "a b", "a_b", "*", "é", &"x".repeat(129)] {
            assert!(check_namespace_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_namespace_is_bounded() {
        let mut ns = Namespace::default_one();
        ns.check().unwrap();
        ns.description = "d".repeat(257);
        assert!(ns.check().unwrap_err().contains("description"));
        ns.description.clear();
        ns.meta = (0..65).map(|i| (i.to_string(), String::new())).collect();
        assert!(ns.check().unwrap_err().contains("meta"));
    }
}
