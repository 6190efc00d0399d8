//! Variables (Nomad's `/v1/var/:path`, `/v1/vars`) and the keyring that encrypts them
//! (`/v1/operator/keyring/...`): the wire shapes, which are Nomad's (PascalCase), and
//! the rules a variable's path and size follow (Nomad 1.6's).
//!
//! A variable is a map of string items at a path in a namespace. The server keeps its
//! items encrypted (see `docs/security.md`); path and namespace stay in clear, as in
//! Nomad, so that lists and prefix queries need no key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Index;

/// The namespace of a variable that names none (Nomad's).
pub use crate::namespaces::DEFAULT_NAMESPACE;

/// Longest path (Nomad's `^[a-zA-Z0-9-_~/]{1,128}$`).
pub const MAX_PATH_BYTES: usize = 128;

/// Largest total of a variable's item keys and values (Nomad's 64 KiB).
pub const MAX_VARIABLE_BYTES: usize = 64 * 1024;

/// Most items in one variable (Nomad bounds only the size; a bound on the count keeps
/// a variable of many empty items from costing more than its bytes say).
pub const MAX_ITEMS: usize = 1024;

/// Most variables in one namespace (Nomad leaves this to quotas, which Drover has
/// not: a bound keeps one writer from filling the store).
pub const MAX_VARIABLES_PER_NAMESPACE: usize = 10_000;

/// A variable with its items, as Nomad's API serves and takes it (`GET/PUT
/// /v1/var/:path`). On a `PUT`, only `Items` is read (path and namespace come from the
/// URL, the indexes and times from the server).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Variable {
    /// The namespace.
    #[serde(default)]
    pub namespace: String,
    /// The path.
    #[serde(default)]
    pub path: String,
    /// The index of the commit that created it.
    #[serde(default)]
    pub create_index: Index,
    /// The index of the commit that last wrote it: the `cas` a writer passes.
    #[serde(default)]
    pub modify_index: Index,
    /// Creation time, Unix nanoseconds.
    #[serde(default)]
    pub create_time: i64,
    /// Last write, Unix nanoseconds.
    #[serde(default)]
    pub modify_time: i64,
    /// The items.
    #[serde(default)]
    pub items: BTreeMap<String, String>,
}

/// A variable without its items (`GET /v1/vars`, Nomad's `VariableMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VariableMetadata {
    /// The namespace.
    pub namespace: String,
    /// The path.
    pub path: String,
    /// The index of the commit that created it.
    pub create_index: Index,
    /// Creation time, Unix nanoseconds.
    pub create_time: i64,
    /// The index of the commit that last wrote it.
    pub modify_index: Index,
    /// Last write, Unix nanoseconds.
    pub modify_time: i64,
}

impl Variable {
    /// The variable without its items.
    pub fn metadata(&self) -> VariableMetadata {
        VariableMetadata {
            namespace: self.namespace.clone(),
            path: self.path.clone(),
            create_index: self.create_index,
            create_time: self.create_time,
            modify_index: self.modify_index,
            modify_time: self.modify_time,
        }
    }

    /// The bytes its items count for against [`MAX_VARIABLE_BYTES`] (keys and values,
    /// as Nomad counts them).
    pub fn items_size(&self) -> usize {
        self.items.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

/// Whether `path` is a path a variable may have (Nomad 1.6's rules): 1 to 128 of
/// `a-z A-Z 0-9 - _ ~ /`, no empty segment (so no leading, trailing or doubled `/`),
/// and under the top-level `nomad` directory only `nomad/jobs` and below (the paths
/// workload identities read) or one level below `nomad/job-templates`. `..` cannot be
/// written with these characters.
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("variable requires path".into());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "invalid path: longer than {MAX_PATH_BYTES} bytes ({})",
            path.len()
        ));
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '~' | '/')))
    {
        return Err(format!(
            "invalid path {path:?}: {c:?} is not allowed (only letters, digits, '-', '_', '~' and '/')"
        ));
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!(
            "invalid path {path:?}: it must not start or end with '/' nor hold an empty segment"
        ));
    }
    if parts[0] != "nomad" {
        return Ok(());
    }
    if parts.len() == 1 {
        return Err(
            "\"nomad\" is a reserved top-level directory path, but you may write \
                    variables to \"nomad/jobs\" or below"
                .into(),
        );
    }
    match parts[1] {
        "jobs" => Ok(()),
        "job-templates" if parts.len() == 3 => Ok(()),
        "job-templates" => Err(
            "\"nomad/job-templates\" is a reserved directory path, but you \
                                may write variables at the level below it, for example, \
                                \"nomad/job-templates/template-name\""
                .into(),
        ),
        _ => Err(
            "only paths at \"nomad/jobs\" or \"nomad/job-templates\" and below are valid \
                  paths under the top-level \"nomad\" directory"
                .into(),
        ),
    }
}

/// Whether a namespace name is one a variable may be put in (Nomad's namespace names:
/// 1 to 128 of letters, digits, `-` and `_`; not the wildcard `*`).
pub fn validate_namespace(namespace: &str) -> Result<(), String> {
    if namespace == "*" {
        return Err("can not target wildcard (\"*\") namespace".into());
    }
    if namespace.is_empty()
        || namespace.len() > 128
        || !namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    {
        return Err(format!(
            "invalid namespace {namespace:?}: 1 to 128 letters, digits, '-' or '_'"
        ));
    }
    Ok(())
}

/// The items of a variable to be written: at least one, at most [`MAX_ITEMS`], keys
/// not empty, and at most [`MAX_VARIABLE_BYTES`] in all.
pub fn validate_items(items: &BTreeMap<String, String>) -> Result<(), String> {
    if items.is_empty() {
        return Err("variable missing required Items object".into());
    }
    if items.len() > MAX_ITEMS {
        return Err(format!(
            "variables are limited to {MAX_ITEMS} items ({} given)",
            items.len()
        ));
    }
    if items.keys().any(String::is_empty) {
        return Err("Items: an item key must not be empty".into());
    }
    let size: usize = items.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_VARIABLE_BYTES {
        return Err(format!(
            "variables are limited to 64KiB in total size ({size} bytes given)"
        ));
    }
    Ok(())
}

/// One root key of the keyring without its material (Nomad's `RootKeyMeta`,
/// `GET /v1/operator/keyring/keys`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RootKeyMeta {
    /// The key's id (a UUID), stored beside each ciphertext it made.
    #[serde(rename = "KeyID")]
    pub key_id: String,
    /// `aes256-gcm`.
    pub algorithm: String,
    /// Creation time, Unix nanoseconds.
    pub create_time: i64,
    /// The index of the commit that created it.
    pub create_index: Index,
    /// The index of the commit that last changed it (its state).
    pub modify_index: Index,
    /// `active` (new encryptions use it; one key at a time) or `inactive` (kept to
    /// decrypt what it encrypted and to verify what it signed).
    pub state: String,
}

/// `PUT /v1/operator/keyring/rotate`'s answer (Nomad's `KeyringRotateRootKeyResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeyringRotateResponse {
    /// The new active key.
    pub key: RootKeyMeta,
    /// The index of the commit that made it active.
    pub index: Index,
}

/// The claims of a workload identity (Nomad 1.6's `IdentityClaims`): the JWT the
/// server signs for each task of an allocation, which the task finds in
/// `secrets/nomad_token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadClaims {
    /// The job's namespace.
    pub nomad_namespace: String,
    /// The job.
    pub nomad_job_id: String,
    /// The allocation.
    pub nomad_allocation_id: String,
    /// The task.
    pub nomad_task: String,
    /// The subject: the allocation id.
    pub sub: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_nomads_rules() {
        for ok in [
            "a",
            "app/config",
            "nomad/jobs",
            "nomad/jobs/web",
            "nomad/jobs/web/g/t",
            "nomad/job-templates/x",
            "x~y_z-1",
            &"a".repeat(128),
        ] {
            validate_path(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("", "requires path"),
            ("/a", "start or end"),
            ("a/", "start or end"),
            ("a//b", "empty segment"),
            ("../etc", "'.' is not allowed"),
            ("a/../b", "'.' is not allowed"),
            ("a b", "' ' is not allowed"),
            ("nomad", "reserved"),
            ("nomad/other", "only paths at"),
            ("nomad/job-templates", "reserved directory"),
            ("nomad/job-templates/a/b", "reserved directory"),
            (&"a".repeat(129), "longer than 128"),
        ] {
            let err = validate_path(bad).expect_err(bad);
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn items_are_bounded() {
        let mut items = BTreeMap::new();
        assert!(validate_items(&items).unwrap_err().contains("Items"));
        items.insert("k".into(), "v".repeat(MAX_VARIABLE_BYTES - 1));
        validate_items(&items).unwrap();
        items.insert("k".into(), "v".repeat(MAX_VARIABLE_BYTES));
        assert!(validate_items(&items).unwrap_err().contains("64KiB"));
        let many: BTreeMap<String, String> = (0..=MAX_ITEMS)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(validate_items(&many).unwrap_err().contains("items"));
    }

    #[test]
    fn the_wire_shape_is_nomads() {
        let v: Variable = serde_json::from_str(
            r#"{"Namespace":"default","Path":"a/b","Items":{"k":"v"},"CreateIndex":3,
                "ModifyIndex":4,"CreateTime":5,"ModifyTime":6}"#,
        )
        .unwrap();
        assert_eq!(v.items["k"], "v");
        assert_eq!(v.modify_index, 4);
        let meta = serde_json::to_value(v.metadata()).unwrap();
        assert_eq!(meta["Path"], "a/b");
        assert!(meta.get("Items").is_none());
        let k = RootKeyMeta {
            key_id: "id".into(),
            algorithm: "aes256-gcm".into(),
            create_time: 1,
            create_index: 2,
            modify_index: 2,
            state: "active".into(),
        };
        assert_eq!(serde_json::to_value(&k).unwrap()["KeyID"], "id");
    }
}
