//! Variables (Nomad's `/v1/var/:path`): put with check-and-set, read, list by prefix,
//! delete; their items encrypted with the keyring's active root key (`crate::keyring`)
//! before they reach the store, path and namespace in clear (as Nomad's). And the
//! workload identities: the JWT the server signs for each task of an allocation it
//! hands to a node, and what such a token may read.
//!
//! Keys in the store: `var/<namespace>/<path>` ([`StoredVariable`]), `rootkey/<id>`
//! (`crate::keyring::StoredRootKey`).

use std::collections::BTreeMap;

use drover_server_api::variables::{
    DEFAULT_NAMESPACE, KeyringRotateResponse, MAX_VARIABLES_PER_NAMESPACE, RootKeyMeta, Variable,
    VariableMetadata, WorkloadClaims, validate_items, validate_namespace, validate_path,
};
use drover_server_api::{Allocation, Index, TaskGroup};
use serde::{Deserialize, Serialize};

use crate::error::ServerError;
use crate::keyring::{ACTIVE, INACTIVE, Keyring, StoredRootKey};
use crate::server::Server;
use crate::state::{Batch, State};

/// Key of a variable in the store.
pub(crate) fn var_key(namespace: &str, path: &str) -> String {
    format!("var/{namespace}/{path}")
}

/// A variable as the store keeps it: metadata in clear, items encrypted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredVariable {
    /// The namespace.
    pub namespace: String,
    /// The path.
    pub path: String,
    /// The index of the commit that created it.
    pub create_index: Index,
    /// The index of the commit that last wrote it.
    pub modify_index: Index,
    /// Creation time, Unix nanoseconds.
    pub create_time: i64,
    /// Last write, Unix nanoseconds.
    pub modify_time: i64,
    /// The root key that encrypted `data`.
    pub key_id: String,
    /// Base64 of nonce and AES-256-GCM ciphertext of the items (JSON), with the
    /// namespace and path as associated data.
    pub data: String,
}

impl StoredVariable {
    fn metadata(&self) -> VariableMetadata {
        VariableMetadata {
            namespace: self.namespace.clone(),
            path: self.path.clone(),
            create_index: self.create_index,
            create_time: self.create_time,
            modify_index: self.modify_index,
            modify_time: self.modify_time,
        }
    }
}

/// What a put or a delete did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarWrite {
    /// Written (the variable as it is now; for a delete, with no items), at `index`.
    Done {
        /// The variable.
        variable: Variable,
        /// The commit's index.
        index: Index,
    },
    /// The check-and-set index did not match: the variable as it is (a missing one
    /// has index 0 and no items), nothing written (Nomad's 409 answer).
    Conflict(Variable),
}

/// Who reads variables: the operator (the cluster token, or anyone when the server
/// has none), a task with its workload identity, or an ACL token.
#[derive(Debug, Clone)]
pub enum VarCaller {
    /// Full access.
    Operator,
    /// A verified workload identity: reads of its job's paths in its namespace only.
    Workload(WorkloadAccess),
    /// An ACL token (or the anonymous policy): what its `variables` rules grant.
    Acl(std::sync::Arc<drover_server_api::acl::Acl>),
}

impl VarCaller {
    /// The namespace a request means when it names none: a workload identity's own
    /// (Nomad's templates read their task's namespace), else `default`.
    pub fn namespace_or<'a>(&'a self, named: Option<&'a str>) -> Option<&'a str> {
        match (named.filter(|n| !n.is_empty()), self) {
            (Some(n), _) => Some(n),
            (None, VarCaller::Workload(w)) => Some(&w.namespace),
            (None, _) => None,
        }
    }

    /// May the caller do `op` on the variable at `path` of `namespace`? (A workload
    /// identity only reads.)
    pub fn may(&self, namespace: &str, path: &str, op: drover_server_api::acl::VariableOp) -> bool {
        use drover_server_api::acl::VariableOp;
        match self {
            VarCaller::Operator => true,
            VarCaller::Workload(w) => {
                matches!(op, VariableOp::Read | VariableOp::List) && w.may_read(namespace, path)
            }
            VarCaller::Acl(acl) => acl.allow_variable(namespace, path, op),
        }
    }
}

/// What a verified workload identity may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadAccess {
    /// Its namespace.
    pub namespace: String,
    /// `nomad/jobs/<job>`, `.../<group>`, `.../<group>/<task>`.
    pub paths: [String; 3],
}

impl WorkloadAccess {
    /// Whether the identity may read the variable at `path` of `namespace`.
    pub fn may_read(&self, namespace: &str, path: &str) -> bool {
        namespace == self.namespace && self.paths.iter().any(|p| p == path)
    }
}

fn decode_items(
    keyring: &Keyring,
    st: &State,
    v: &StoredVariable,
) -> Result<BTreeMap<String, String>, ServerError> {
    let key = st.root_keys().get(&v.key_id).ok_or_else(|| {
        ServerError::Unavailable(format!(
            "variable {}: its root key {} is not in the keyring",
            v.path, v.key_id
        ))
    })?;
    let plain = keyring
        .decrypt(key, &v.namespace, &v.path, &v.data)
        .map_err(|e| ServerError::Unavailable(format!("variable {}: {e}", v.path)))?;
    serde_json::from_slice(&plain).map_err(|_| {
        ServerError::Unavailable(format!("variable {}: its items do not decode", v.path))
    })
}

fn decrypted(keyring: &Keyring, st: &State, v: &StoredVariable) -> Result<Variable, ServerError> {
    Ok(Variable {
        namespace: v.namespace.clone(),
        path: v.path.clone(),
        create_index: v.create_index,
        modify_index: v.modify_index,
        create_time: v.create_time,
        modify_time: v.modify_time,
        items: decode_items(keyring, st, v)?,
    })
}

fn encrypt_items(
    keyring: &Keyring,
    key: &StoredRootKey,
    namespace: &str,
    path: &str,
    items: &BTreeMap<String, String>,
) -> Result<String, ServerError> {
    let plain = zeroize::Zeroizing::new(
        serde_json::to_vec(items)
            .map_err(|e| ServerError::Invalid(format!("Items: cannot encode: {e}")))?,
    );
    keyring
        .encrypt(key, namespace, path, &plain)
        .map_err(|e| ServerError::Unavailable(e.to_string()))
}

/// The active root key, or a new one added to `b` when the keyring has none yet (the
/// first variable, the first job: workload identities need a key to sign with).
pub(crate) fn ensure_root_key(
    keyring: &Keyring,
    st: &State,
    b: &mut Batch,
    index: Index,
    now: i64,
) -> Result<StoredRootKey, ServerError> {
    if let Some(k) = st.active_root_key() {
        return Ok(k.clone());
    }
    if let Some(k) = b.root_keys.iter().find(|k| k.meta.state == ACTIVE) {
        return Ok(k.clone());
    }
    let k = keyring
        .new_root_key(ACTIVE, index, now)
        .map_err(|e| ServerError::Unavailable(e.to_string()))?;
    b.root_keys.push(k.clone());
    Ok(k)
}

/// Ciphertext written per commit when a full rotation re-encrypts the variables.
pub const REKEY_BATCH_BYTES: usize = 1024 * 1024;

pub(crate) fn namespace_of(namespace: Option<&str>) -> Result<String, ServerError> {
    let ns = match namespace {
        None | Some("") => DEFAULT_NAMESPACE,
        Some(ns) => ns,
    };
    validate_namespace(ns).map_err(ServerError::Invalid)?;
    Ok(ns.to_owned())
}

impl Server {
    /// The variables of `namespace` (`*`: all) whose path starts with `prefix`,
    /// without their items; a workload identity sees only those it may read.
    pub fn variables(
        &self,
        namespace: Option<&str>,
        prefix: &str,
        caller: &VarCaller,
    ) -> Result<Vec<VariableMetadata>, ServerError> {
        let ns = match namespace {
            Some("*") => "*".to_owned(),
            other => namespace_of(other)?,
        };
        let st = self.core.read();
        Ok(st
            .vars_with_prefix(&ns, prefix)
            .filter(|v| {
                caller.may(
                    &v.namespace,
                    &v.path,
                    drover_server_api::acl::VariableOp::List,
                )
            })
            .map(StoredVariable::metadata)
            .collect())
    }

    /// The variable at `path` of `namespace`, decrypted (`None`: none there).
    /// A workload identity may read only its job's paths (`Denied` otherwise, whether
    /// the variable exists or not).
    pub fn variable(
        &self,
        namespace: Option<&str>,
        path: &str,
        caller: &VarCaller,
    ) -> Result<Option<Variable>, ServerError> {
        let ns = namespace_of(namespace)?;
        if !caller.may(&ns, path, drover_server_api::acl::VariableOp::Read) {
            return Err(ServerError::Denied("Permission denied".into()));
        }
        let st = self.core.read();
        st.var(&ns, path)
            .map(|v| decrypted(&self.keyring, &st, v))
            .transpose()
    }

    /// Put the variable at `path` of `namespace` with `items`, encrypted with the
    /// active root key. `cas`: only if its modify index is that (0: only if it does
    /// not exist); else a [`VarWrite::Conflict`] with the variable as it is.
    pub async fn put_variable(
        &self,
        namespace: Option<&str>,
        path: &str,
        items: BTreeMap<String, String>,
        cas: Option<Index>,
    ) -> Result<VarWrite, ServerError> {
        let ns = namespace_of(namespace)?;
        validate_path(path).map_err(ServerError::Invalid)?;
        validate_items(&items).map_err(ServerError::Invalid)?;
        let keyring = self.keyring.clone();
        let term = self.leadership.require()?;
        let (index, outcome) = term
            .commit(|st, index, now| {
                if st.namespace(&ns).is_none() {
                    return Err(ServerError::Invalid(format!(
                        "namespace {ns:?} does not exist"
                    )));
                }
                let existing = st.var(&ns, path);
                if let Some(conflict) = cas_conflict(&keyring, st, &ns, path, existing, cas)? {
                    return Ok((Batch::default(), VarWrite::Conflict(conflict)));
                }
                if existing.is_none() && st.var_count(&ns) >= MAX_VARIABLES_PER_NAMESPACE {
                    return Err(ServerError::Invalid(format!(
                        "namespace {ns:?} holds {MAX_VARIABLES_PER_NAMESPACE} variables, \
                         the most it may"
                    )));
                }
                let mut b = Batch::default();
                let key = ensure_root_key(&keyring, st, &mut b, index, now)?;
                let data = encrypt_items(&keyring, &key, &ns, path, &items)?;
                let stored = StoredVariable {
                    namespace: ns.clone(),
                    path: path.to_owned(),
                    create_index: existing.map_or(index, |v| v.create_index),
                    modify_index: index,
                    create_time: existing.map_or(now, |v| v.create_time),
                    modify_time: now,
                    key_id: key.meta.key_id.clone(),
                    data,
                };
                let variable = Variable {
                    namespace: ns.clone(),
                    path: path.to_owned(),
                    create_index: stored.create_index,
                    modify_index: index,
                    create_time: stored.create_time,
                    modify_time: now,
                    items: items.clone(),
                };
                b.vars.push(stored);
                Ok((b, VarWrite::Done { variable, index }))
            })
            .await?;
        let _ = index;
        Ok(outcome)
    }

    /// Delete the variable at `path` of `namespace` (a missing one is no error).
    /// `cas` as for [`Server::put_variable`].
    pub async fn delete_variable(
        &self,
        namespace: Option<&str>,
        path: &str,
        cas: Option<Index>,
    ) -> Result<VarWrite, ServerError> {
        let ns = namespace_of(namespace)?;
        validate_path(path).map_err(ServerError::Invalid)?;
        let keyring = self.keyring.clone();
        let term = self.leadership.require()?;
        let (index, outcome) = term
            .commit(|st, index, _now| {
                let existing = st.var(&ns, path);
                if let Some(conflict) = cas_conflict(&keyring, st, &ns, path, existing, cas)? {
                    return Ok((Batch::default(), VarWrite::Conflict(conflict)));
                }
                let mut b = Batch::default();
                if existing.is_some() {
                    b.drop_vars.push((ns.clone(), path.to_owned()));
                }
                let variable = Variable {
                    namespace: ns.clone(),
                    path: path.to_owned(),
                    ..Variable::default()
                };
                Ok((b, VarWrite::Done { variable, index }))
            })
            .await?;
        Ok(match outcome {
            // Nothing to delete: nothing committed, the current index.
            VarWrite::Done { variable, .. } => VarWrite::Done { variable, index },
            c => c,
        })
    }

    /// The keyring's root keys, without their material (newest first).
    pub fn keyring_keys(&self) -> Vec<RootKeyMeta> {
        let st = self.core.read();
        let mut keys: Vec<RootKeyMeta> = st.root_keys().values().map(|k| k.meta.clone()).collect();
        keys.sort_by(|a, b| {
            b.create_index
                .cmp(&a.create_index)
                .then(a.key_id.cmp(&b.key_id))
        });
        keys
    }

    /// The public keys that verify workload identities (`/.well-known/jwks.json`),
    /// newest first.
    pub fn jwks(&self) -> crate::keyring::JwkSet {
        let st = self.core.read();
        let mut keys: Vec<_> = st.root_keys().values().collect();
        keys.sort_by(|a, b| {
            b.meta
                .create_index
                .cmp(&a.meta.create_index)
                .then(a.meta.key_id.cmp(&b.meta.key_id))
        });
        self.keyring.jwks(keys)
    }

    /// A new active root key; the others become inactive and stay, to decrypt and
    /// verify what they made. `full`: every variable is then encrypted again with the
    /// new key, in commits of at most [`REKEY_BATCH_BYTES`] each (a keyring of many
    /// large variables never makes one huge transaction); the answer comes once all
    /// are. Their indexes do not move (their items did not change).
    pub async fn rotate_keyring(&self, full: bool) -> Result<KeyringRotateResponse, ServerError> {
        let keyring = self.keyring.clone();
        let term = self.leadership.require()?;
        let (index, key) = term
            .commit(|st, index, now| {
                let mut b = Batch::default();
                let new = keyring
                    .new_root_key(ACTIVE, index, now)
                    .map_err(|e| ServerError::Unavailable(e.to_string()))?;
                for k in st.root_keys().values() {
                    if k.meta.state != INACTIVE {
                        let mut k = k.clone();
                        k.meta.state = INACTIVE.into();
                        k.meta.modify_index = index;
                        b.root_keys.push(k);
                    }
                }
                let meta = new.meta.clone();
                b.root_keys.push(new);
                Ok((b, meta))
            })
            .await?;
        tracing::info!(key_id = %key.key_id, full, "rotated the keyring's root key");
        let mut last = index;
        if full {
            loop {
                let (at, rekeyed) = term
                    .commit(|st, _index, _now| {
                        let mut b = Batch::default();
                        // Another rotation since: the newer one re-encrypts (if full).
                        let Some(active) =
                            st.active_root_key().filter(|k| k.meta.key_id == key.key_id)
                        else {
                            return Ok((b, 0));
                        };
                        let mut bytes = 0;
                        for v in st.vars_with_prefix("*", "") {
                            if v.key_id == key.key_id {
                                continue;
                            }
                            if bytes >= REKEY_BATCH_BYTES {
                                break;
                            }
                            let items = decode_items(&keyring, st, v)?;
                            let mut v = v.clone();
                            v.data =
                                encrypt_items(&keyring, active, &v.namespace, &v.path, &items)?;
                            v.key_id = key.key_id.clone();
                            bytes += v.data.len();
                            b.vars.push(v);
                        }
                        let n = b.vars.len();
                        Ok((b, n))
                    })
                    .await?;
                last = at;
                if rekeyed == 0 {
                    break;
                }
                tracing::info!(key_id = %key.key_id, variables = rekeyed, "re-encrypted variables with the new root key");
            }
        }
        Ok(KeyringRotateResponse { key, index: last })
    }

    /// The workload identities of `alloc`'s tasks (task name to JWT), signed with the
    /// active root key; empty when the keyring has no key yet or this server cannot
    /// unwrap it (logged).
    pub(crate) fn workload_identities(
        &self,
        st: &State,
        alloc: &Allocation,
        group: &TaskGroup,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if alloc.is_terminal() {
            return out;
        }
        let Some(key) = st.active_root_key() else {
            return out;
        };
        for task in &group.tasks {
            let claims = WorkloadClaims {
                nomad_namespace: alloc.namespace.clone(),
                nomad_job_id: alloc.job_name.clone(),
                nomad_allocation_id: alloc.id.clone(),
                nomad_task: task.name.clone(),
                sub: alloc.id.clone(),
                // Stable per allocation: the same token each time it is sent (Ed25519
                // signatures are deterministic).
                iat: alloc.create_time / 1_000_000_000,
            };
            match self.keyring.sign_identity(key, &claims) {
                Ok(token) => {
                    out.insert(task.name.clone(), token);
                }
                Err(e) => {
                    // The keyring logged why once (a KEK that differs from the peers').
                    tracing::debug!(alloc = %alloc.id, "cannot sign workload identities: {e}");
                    return BTreeMap::new();
                }
            }
        }
        out
    }

    /// Verify a workload identity: signed by one of the keyring's root keys, for an
    /// allocation that exists and is not terminal, of the job, group and task it
    /// names. What it may read, or why not (`Denied`).
    pub fn verify_workload_identity(&self, token: &str) -> Result<WorkloadAccess, ServerError> {
        let denied = |why: String| {
            // The token never reaches the logs, only why it was refused.
            tracing::info!("refused a workload identity: {why}");
            ServerError::Denied("Permission denied: invalid workload identity".into())
        };
        let st = self.core.read();
        let claims = self
            .keyring
            .verify_identity(token, |kid| st.root_keys().get(kid))
            .map_err(denied)?;
        let alloc = st
            .alloc(&claims.nomad_allocation_id)
            .ok_or_else(|| denied("its allocation does not exist".into()))?;
        if alloc.is_terminal() {
            return Err(denied("its allocation is terminal".into()));
        }
        if alloc.job_name != claims.nomad_job_id || claims.nomad_namespace != alloc.namespace {
            return Err(denied("its claims do not match its allocation".into()));
        }
        let group = st.alloc_group(alloc);
        if !group.tasks.iter().any(|t| t.name == claims.nomad_task) {
            return Err(denied("its task is not in its allocation's group".into()));
        }
        let base = format!("nomad/jobs/{}", claims.nomad_job_id);
        Ok(WorkloadAccess {
            namespace: claims.nomad_namespace,
            paths: [
                base.clone(),
                format!("{base}/{}", alloc.group),
                format!("{base}/{}/{}", alloc.group, claims.nomad_task),
            ],
        })
    }
}

/// The check-and-set verdict: `Some(the variable as it is)` when `cas` does not match.
fn cas_conflict(
    keyring: &Keyring,
    st: &State,
    ns: &str,
    path: &str,
    existing: Option<&StoredVariable>,
    cas: Option<Index>,
) -> Result<Option<Variable>, ServerError> {
    let Some(cas) = cas else { return Ok(None) };
    match existing {
        None if cas == 0 => Ok(None),
        Some(v) if v.modify_index == cas => Ok(None),
        None => Ok(Some(Variable {
            namespace: ns.to_owned(),
            path: path.to_owned(),
            ..Variable::default()
        })),
        Some(v) => decrypted(keyring, st, v).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use drover_server_api::JobType;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::config::ServerConfig;
    use crate::scheduler::tests::{group, spec};
    use crate::store::RedbStore;

    async fn server(dir: &Path) -> (Arc<Server>, CancellationToken) {
        let mut cfg = ServerConfig::new(dir);
        cfg.workers = 0;
        let stop = CancellationToken::new();
        let store = Arc::new(RedbStore::open(dir).unwrap());
        let s = Server::start(cfg, store, stop.clone()).await.unwrap();
        (s, stop)
    }

    fn items(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn done(w: VarWrite) -> (Variable, Index) {
        match w {
            VarWrite::Done { variable, index } => (variable, index),
            VarWrite::Conflict(v) => panic!("a conflict: {v:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn check_and_set_writes_only_at_the_index_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let (s, stop) = server(dir.path()).await;
        let op = VarCaller::Operator;
        let (v, i1) = done(
            s.put_variable(None, "a/b", items(&[("k", "1")]), Some(0))
                .await
                .unwrap(),
        );
        assert_eq!((v.create_index, v.modify_index), (i1, i1));
        // 0: only if it does not exist.
        match s
            .put_variable(None, "a/b", items(&[("k", "2")]), Some(0))
            .await
            .unwrap()
        {
            VarWrite::Conflict(c) => {
                assert_eq!(c.modify_index, i1);
                assert_eq!(c.items["k"], "1");
            }
            w => panic!("{w:?}"),
        }
        // A stale index: conflict; the right one: written.
        assert!(matches!(
            s.put_variable(None, "a/b", items(&[("k", "2")]), Some(i1 + 100))
                .await
                .unwrap(),
            VarWrite::Conflict(_)
        ));
        let (v, i2) = done(
            s.put_variable(None, "a/b", items(&[("k", "2")]), Some(i1))
                .await
                .unwrap(),
        );
        assert!(i2 > i1);
        assert_eq!((v.create_index, v.modify_index), (i1, i2));
        assert_eq!(
            s.variable(None, "a/b", &op).unwrap().unwrap().items["k"],
            "2"
        );
        // A missing variable with a non-zero index: conflict, with index 0.
        match s
            .put_variable(None, "x/y", items(&[("k", "1")]), Some(3))
            .await
            .unwrap()
        {
            VarWrite::Conflict(c) => assert_eq!((c.modify_index, c.items.len()), (0, 0)),
            w => panic!("{w:?}"),
        }
        // Deletes check too.
        assert!(matches!(
            s.delete_variable(None, "a/b", Some(i1)).await.unwrap(),
            VarWrite::Conflict(_)
        ));
        done(s.delete_variable(None, "a/b", Some(i2)).await.unwrap());
        assert!(s.variable(None, "a/b", &op).unwrap().is_none());
        // Invalid input is refused before anything is written.
        let index = s.index();
        for (path, its) in [
            ("/a", items(&[("k", "v")])),
            ("nomad", items(&[("k", "v")])),
            ("a", BTreeMap::new()),
        ] {
            let err = s.put_variable(None, path, its, None).await.unwrap_err();
            assert!(matches!(err, ServerError::Invalid(_)), "{path}: {err}");
        }
        assert!(matches!(
            s.put_variable(Some("*"), "a", items(&[("k", "v")]), None)
                .await
                .unwrap_err(),
            ServerError::Invalid(_)
        ));
        assert_eq!(s.index(), index);
        // Namespaces are apart; a variable goes only to one that exists.
        assert!(matches!(
            s.put_variable(Some("team-a"), "p", items(&[("k", "a")]), None)
                .await
                .unwrap_err(),
            ServerError::Invalid(_)
        ));
        s.upsert_namespace(drover_server_api::Namespace {
            name: "team-a".into(),
            ..drover_server_api::Namespace::default_one()
        })
        .await
        .unwrap();
        done(
            s.put_variable(Some("team-a"), "p", items(&[("k", "a")]), None)
                .await
                .unwrap(),
        );
        assert!(s.variable(None, "p", &op).unwrap().is_none());
        assert_eq!(
            s.variable(Some("team-a"), "p", &op).unwrap().unwrap().items["k"],
            "a"
        );
        assert_eq!(s.variables(Some("*"), "", &op).unwrap().len(), 1);
        stop.cancel();
        s.stopped().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rotation_keeps_old_values_readable_and_nothing_is_stored_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let op = VarCaller::Operator;
        let marker = "in-clear-marker-5f2a";
        {
            let (s, stop) = server(dir.path()).await;
            done(
                s.put_variable(None, "old", items(&[("k", marker)]), None)
                    .await
                    .unwrap(),
            );
            let first = s.keyring_keys();
            assert_eq!(first.len(), 1);
            let r = s.rotate_keyring(false).await.unwrap();
            assert_eq!(r.key.state, ACTIVE);
            done(
                s.put_variable(None, "new", items(&[("k", "n")]), None)
                    .await
                    .unwrap(),
            );
            let keys = s.keyring_keys();
            assert_eq!(keys.len(), 2);
            assert_eq!(keys.iter().filter(|k| k.state == ACTIVE).count(), 1);
            {
                let st = s.core.read();
                assert_eq!(st.var("default", "old").unwrap().key_id, first[0].key_id);
                assert_eq!(st.var("default", "new").unwrap().key_id, r.key.key_id);
            }
            assert_eq!(
                s.variable(None, "old", &op).unwrap().unwrap().items["k"],
                marker
            );
            // Full: everything under the newest key, indexes unchanged, in commits of
            // bounded size (20 variables of 60 KiB: more than one batch).
            let big = "x".repeat(60 * 1024);
            for i in 0..20 {
                done(
                    s.put_variable(None, &format!("big/{i}"), items(&[("k", &big)]), None)
                        .await
                        .unwrap(),
                );
            }
            let before = s.variable(None, "old", &op).unwrap().unwrap();
            let index_before = s.index();
            let full = s.rotate_keyring(true).await.unwrap();
            assert!(
                full.index >= index_before + 3,
                "the key, then at least two batches: {index_before} -> {}",
                full.index
            );
            {
                let st = s.core.read();
                assert!(
                    st.vars_with_prefix("*", "")
                        .all(|v| v.key_id == full.key.key_id)
                );
            }
            assert_eq!(s.variable(None, "old", &op).unwrap().unwrap(), before);
            // The store: no item, no key material in clear.
            let (kvs, _) = s.core.store.range("").await.unwrap();
            for kv in &kvs {
                assert!(
                    !kv.value
                        .windows(marker.len())
                        .any(|w| w == marker.as_bytes()),
                    "{}",
                    kv.key
                );
            }
            stop.cancel();
            s.stopped().await;
        }
        // Read back after a restart (the keys from the store, the KEK from its file).
        let (s, stop) = server(dir.path()).await;
        assert_eq!(
            s.variable(None, "old", &op).unwrap().unwrap().items["k"],
            marker
        );
        assert_eq!(s.keyring_keys().len(), 3);
        // A ciphertext moved to another path does not decrypt there.
        {
            let mut moved = s.core.read().var("default", "old").unwrap().clone();
            moved.path = "elsewhere".into();
            let st = s.core.read();
            assert!(decrypted(&s.keyring, &st, &moved).is_err());
        }
        stop.cancel();
        s.stopped().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_workload_identity_reads_only_its_jobs_paths_while_its_allocation_lives() {
        let dir = tempfile::tempdir().unwrap();
        let (s, stop) = server(dir.path()).await;
        s.register_job(spec("web", JobType::Service, vec![group("app", 1, 10, 10)]))
            .await
            .unwrap();
        let alloc: Allocation = serde_json::from_value(serde_json::json!({
            "id": "a1", "name": "web.app[0]", "index": 0, "job_name": "web", "job_version": 0,
            "group": "app", "node_id": "n1", "node_name": "n1",
            "resources": {"cpu": 10, "memory_mb": 10},
            "desired_status": "run", "desired_description": "",
            "client_status": "running", "client_description": "",
            "task_states": {}, "eval_id": "e", "create_index": 2, "modify_index": 2,
            "alloc_modify_index": 2, "create_time": 0, "modify_time": 0
        }))
        .unwrap();
        let a = alloc.clone();
        s.term()
            .commit(move |_, _, _| {
                Ok((
                    Batch {
                        allocs: vec![a],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await
            .unwrap();
        let tokens = {
            let st = s.core.read();
            let g = st.alloc_group(&alloc);
            s.workload_identities(&st, &alloc, &g)
        };
        let token = tokens.get("main").expect("a token for the task").clone();
        let access = s.verify_workload_identity(&token).unwrap();
        assert_eq!(
            access.paths,
            [
                "nomad/jobs/web",
                "nomad/jobs/web/app",
                "nomad/jobs/web/app/main"
            ]
        );
        let w = VarCaller::Workload(access.clone());
        done(
            s.put_variable(None, "nomad/jobs/web", items(&[("k", "w")]), None)
                .await
                .unwrap(),
        );
        done(
            s.put_variable(None, "nomad/jobs/db", items(&[("k", "d")]), None)
                .await
                .unwrap(),
        );
        assert_eq!(
            s.variable(None, "nomad/jobs/web", &w)
                .unwrap()
                .unwrap()
                .items["k"],
            "w"
        );
        assert!(matches!(
            s.variable(None, "nomad/jobs/db", &w),
            Err(ServerError::Denied(_))
        ));
        assert!(matches!(
            s.variable(Some("other"), "nomad/jobs/web", &w),
            Err(ServerError::Denied(_))
        ));
        let listed = s.variables(None, "nomad/", &w).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].path, "nomad/jobs/web");
        // Garbage is refused.
        assert!(s.verify_workload_identity("a.b.c").is_err());
        // Its allocation stopped: refused.
        let mut stopped = alloc.clone();
        stopped.desired_status = drover_server_api::DesiredStatus::Stop;
        s.term()
            .commit(move |_, _, _| {
                Ok((
                    Batch {
                        allocs: vec![stopped],
                        ..Batch::default()
                    },
                    (),
                ))
            })
            .await
            .unwrap();
        assert!(s.verify_workload_identity(&token).is_err());
        stop.cancel();
        s.stopped().await;
    }
}
