//! The server's state in memory, indexed for the scheduler, and the [`Batch`] of
//! changes every write is made of.
//!
//! Writes go through `Core::commit` (core.rs): a `Batch` is built against the
//! current state, turned into one store transaction, and applied here only after the
//! store committed it, with the transaction's revision as index. Readers (workers,
//! API) take the state's read lock for the duration of one call.

pub(crate) mod acl;
pub(crate) mod csi;
pub(crate) mod evals;
pub(crate) mod services;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use drover_server_api::{
    AllocResources, Allocation, DEFAULT_NAMESPACE, Deployment, EvalStatus, Evaluation, Index, Job,
    Namespace, Node, ServiceRegistration, TaskGroup,
};

use crate::scheduler::{StateView, UsedPorts};
use crate::store::{KeyValue, Op, StoreChange, StoreError};

/// A job's identity: (namespace, name). Names are unique within a namespace only.
pub(crate) type JobKey = (String, String);

/// The [`JobKey`] of a job in `namespace` named `name`.
pub(crate) fn job_id(namespace: &str, name: &str) -> JobKey {
    (namespace.to_owned(), name.to_owned())
}

/// Key of a job's current version: `job/<name>` in `default` (the key of the jobs
/// written before namespaces existed, so that they need no migration),
/// `job/<namespace>/<name>` in the others. Neither a job name nor a namespace name
/// holds a `/` (validate.rs), so the two shapes cannot be confused.
pub(crate) fn job_key(ns: &str, name: &str) -> String {
    if ns == DEFAULT_NAMESPACE {
        format!("job/{name}")
    } else {
        format!("job/{ns}/{name}")
    }
}

/// Key of one kept version of a job: `jobv/[<namespace>/]<name>/<version>`, the
/// namespace left out for `default` as in [`job_key`].
pub(crate) fn version_key(ns: &str, name: &str, version: u64) -> String {
    if ns == DEFAULT_NAMESPACE {
        format!("jobv/{name}/{version:020}")
    } else {
        format!("jobv/{ns}/{name}/{version:020}")
    }
}

/// The job of the rest of a `job/` or `jobv/` key (after the version is cut off).
fn job_of_key_rest(rest: &str) -> JobKey {
    match rest.split_once('/') {
        Some((ns, name)) => job_id(ns, name),
        None => job_id(DEFAULT_NAMESPACE, rest),
    }
}

/// Key of a namespace other than an unwritten `default`.
pub(crate) fn namespace_key(name: &str) -> String {
    format!("namespace/{name}")
}

/// Key of a deployment.
pub(crate) fn deployment_key(id: &str) -> String {
    format!("deployment/{id}")
}

/// Key of an allocation: `alloc/<create index, 20 digits>/<id>`.
///
/// Allocations are created in index order, so the allocations of one plan are
/// neighbours in the store and a commit of a thousand placements writes the few
/// hundred B-tree pages at the right edge of the tree. Keyed by their random (v4) id
/// alone, each placement landed on a page of its own anywhere in the tree: with
/// 100,000 allocations stored, a plan's commit wrote about one page per placement and
/// took five times as long (`drover-bench schedule`).
///
/// Allocations that older servers wrote keep their key (`alloc/<id>`): see
/// [`State::alloc_store_key`].
pub(crate) fn alloc_key(create_index: Index, id: &str) -> String {
    format!("alloc/{create_index:020}/{id}")
}

/// The allocation id of the rest of an `alloc/` key: `<create index>/<id>`, or the
/// `<id>` of the older form.
fn alloc_id_of_key_rest(rest: &str) -> &str {
    rest.rsplit_once('/').map_or(rest, |(_, id)| id)
}

/// Key of a root key of the keyring (metadata and wrapped material).
pub(crate) fn root_key_key(id: &str) -> String {
    format!("rootkey/{id}")
}

/// Deployments kept per job (the newest; an active one is never dropped).
pub(crate) const KEPT_DEPLOYMENTS: usize = 10;

/// Key of the hash of a node's secret.
pub(crate) fn node_secret_key(id: &str) -> String {
    format!("nodesecret/{id}")
}

/// A key that is not part of the state: the store's own ones (the schema, the etcd
/// store's bookkeeping: index counter, election, server registrations) are expected;
/// anything else is worth a warning (a newer server's kind of key).
fn note_unknown_key(key: &str) {
    let kind = key.split_once('/').map_or(key, |(k, _)| k);
    if !matches!(kind, "schema" | "meta" | "election" | "servers") {
        tracing::warn!(key = %key, "ignoring an unknown key in the store");
    }
}

/// Versions of a job kept besides the current one (as Nomad's default of 6).
pub(crate) const KEPT_VERSIONS: usize = 6;

/// Changes committed together in one store transaction.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Jobs written (current version).
    pub jobs: Vec<Job>,
    /// Job versions written.
    pub versions: Vec<Job>,
    /// Versions removed (job, version).
    pub drop_versions: Vec<(JobKey, u64)>,
    /// Jobs forgotten (purged), with every version the state holds.
    pub purge: Vec<JobKey>,
    /// Namespaces written.
    pub namespaces: Vec<Namespace>,
    /// Namespaces removed, by name.
    pub drop_namespaces: Vec<String>,
    /// Nodes written.
    pub nodes: Vec<Node>,
    /// Node secrets bound: (node id, hex SHA-256 of the secret). Kept under keys of
    /// their own (`nodesecret/<id>`), never in the node document the API serves.
    pub node_secrets: Vec<(String, String)>,
    /// Allocations written.
    pub allocs: Vec<Allocation>,
    /// Allocations of `allocs` stored under another key than [`alloc_key`] of their
    /// create index (written by an older server): (id, key). Only a follower's
    /// batches, made of another server's commits, have them.
    pub alloc_keys: Vec<(String, String)>,
    /// Evaluations written.
    pub evals: Vec<Evaluation>,
    /// Evaluations deleted (old terminal ones).
    pub drop_evals: Vec<String>,
    /// Allocations deleted (garbage collection: terminal on the server and the client).
    pub drop_allocs: Vec<String>,
    /// Nodes deleted (garbage collection: down for long, no allocation left).
    pub drop_nodes: Vec<String>,
    /// Node secrets deleted (only seen by followers, in another server's commits).
    pub drop_node_secrets: Vec<String>,
    /// Service registrations written.
    pub services: Vec<ServiceRegistration>,
    /// Service registrations removed, by id.
    pub drop_services: Vec<String>,
    /// Deployments written.
    pub deployments: Vec<Deployment>,
    /// Deployments removed, by id.
    pub drop_deployments: Vec<String>,
    /// ACL policies written.
    pub acl_policies: Vec<drover_server_api::acl::AclPolicy>,
    /// ACL policies removed, by name.
    pub drop_acl_policies: Vec<String>,
    /// ACL tokens written.
    pub acl_tokens: Vec<drover_server_api::acl::AclToken>,
    /// ACL tokens removed, by accessor id.
    pub drop_acl_tokens: Vec<String>,
    /// The ACL bootstrap was done (at this batch's index).
    pub acl_bootstrap: Option<Index>,

    /// Variables written (encrypted; see `crate::variables`).
    pub vars: Vec<crate::variables::StoredVariable>,
    /// Variables removed: (namespace, path).
    pub drop_vars: Vec<(String, String)>,
    /// Root keys written (metadata and wrapped material; see `crate::keyring`).
    pub root_keys: Vec<crate::keyring::StoredRootKey>,
    /// CSI volumes written.
    pub csi_volumes: Vec<drover_server_api::csi::CsiVolume>,
    /// CSI volumes removed: (namespace, id).
    pub drop_csi_volumes: Vec<(String, String)>,
    /// Capacity may have been freed: retry blocked evaluations after the commit.
    pub unblock: bool,
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.versions.is_empty()
            && self.drop_versions.is_empty()
            && self.purge.is_empty()
            && self.namespaces.is_empty()
            && self.drop_namespaces.is_empty()
            && self.nodes.is_empty()
            && self.node_secrets.is_empty()
            && self.allocs.is_empty()
            && self.evals.is_empty()
            && self.drop_evals.is_empty()
            && self.drop_allocs.is_empty()
            && self.drop_nodes.is_empty()
            && self.drop_node_secrets.is_empty()
            && self.services.is_empty()
            && self.drop_services.is_empty()
            && self.deployments.is_empty()
            && self.drop_deployments.is_empty()
            && self.acl_policies.is_empty()
            && self.drop_acl_policies.is_empty()
            && self.acl_tokens.is_empty()
            && self.drop_acl_tokens.is_empty()
            && self.acl_bootstrap.is_none()
            && self.vars.is_empty()
            && self.drop_vars.is_empty()
            && self.root_keys.is_empty()
            && self.csi_volumes.is_empty()
            && self.drop_csi_volumes.is_empty()
    }

    /// The batch a follower applies for one change the leader committed (or one part
    /// of a split commit): puts and deletes by the kind of their key. A value that
    /// does not decode is an error naming the key; keys that are not state (the
    /// schema, the store's own bookkeeping) are skipped.
    pub(crate) fn from_change(change: &StoreChange) -> Result<Batch, StoreError> {
        fn decode<T: serde::de::DeserializeOwned>(kv: &KeyValue) -> Result<T, StoreError> {
            serde_json::from_slice(&kv.value)
                .map_err(|e| StoreError::Corrupt(format!("value of {}: {e}", kv.key)))
        }
        let mut b = Batch::default();
        for key in &change.deletes {
            let (kind, rest) = key.split_once('/').unwrap_or((key.as_str(), ""));
            match kind {
                "job" => b.purge.push(job_of_key_rest(rest)),
                "jobv" => {
                    let parsed = rest
                        .rsplit_once('/')
                        .and_then(|(job, v)| Some((job_of_key_rest(job), v.parse::<u64>().ok()?)));
                    match parsed {
                        Some(nv) => b.drop_versions.push(nv),
                        None => {
                            return Err(StoreError::Corrupt(format!(
                                "deleted key {key}: not jobv/[<namespace>/]<job>/<version>"
                            )));
                        }
                    }
                }
                "namespace" => b.drop_namespaces.push(rest.to_owned()),
                "node" => b.drop_nodes.push(rest.to_owned()),
                "nodesecret" => b.drop_node_secrets.push(rest.to_owned()),
                "alloc" => b.drop_allocs.push(alloc_id_of_key_rest(rest).to_owned()),
                "eval" => b.drop_evals.push(rest.to_owned()),
                "service" => b.drop_services.push(rest.to_owned()),
                "deployment" => b.drop_deployments.push(rest.to_owned()),
                "aclpolicy" => b.drop_acl_policies.push(rest.to_owned()),
                "acltoken" => b.drop_acl_tokens.push(rest.to_owned()),

                "csivol" => match rest.split_once('/') {
                    Some((ns, id)) => b.drop_csi_volumes.push((ns.to_owned(), id.to_owned())),
                    None => {
                        return Err(StoreError::Corrupt(format!(
                            "deleted key {key}: not csivol/<namespace>/<id>"
                        )));
                    }
                },
                "var" => match rest.split_once('/') {
                    Some((ns, path)) => b.drop_vars.push((ns.to_owned(), path.to_owned())),
                    None => {
                        return Err(StoreError::Corrupt(format!(
                            "deleted key {key}: not var/<namespace>/<path>"
                        )));
                    }
                },
                _ => note_unknown_key(key),
            }
        }
        for kv in &change.puts {
            let (kind, rest) = kv.key.split_once('/').unwrap_or((kv.key.as_str(), ""));
            match kind {
                "job" => b.jobs.push(decode(kv)?),
                "jobv" => b.versions.push(decode(kv)?),
                "namespace" => b.namespaces.push(decode(kv)?),
                "node" => b.nodes.push(decode(kv)?),
                "nodesecret" => b.node_secrets.push((rest.to_owned(), decode(kv)?)),
                "alloc" => {
                    let a: Allocation = decode(kv)?;
                    if alloc_key(a.create_index, &a.id) != kv.key {
                        b.alloc_keys.push((a.id.clone(), kv.key.clone()));
                    }
                    b.allocs.push(a);
                }
                "eval" => b.evals.push(decode(kv)?),
                "service" => b.services.push(decode(kv)?),
                "deployment" => b.deployments.push(decode(kv)?),
                "aclpolicy" => b.acl_policies.push(decode(kv)?),
                "acltoken" => b.acl_tokens.push(decode(kv)?),
                "aclbootstrap" => b.acl_bootstrap = Some(decode(kv)?),

                "var" => b.vars.push(decode(kv)?),
                "rootkey" => b.root_keys.push(decode(kv)?),
                "csivol" => b.csi_volumes.push(decode(kv)?),
                _ => note_unknown_key(&kv.key),
            }
        }
        Ok(b)
    }

    /// The store operations of this batch. `state` is the state it was built on (for
    /// the version keys of purged jobs).
    pub(crate) fn ops(&self, state: &State) -> Result<Vec<Op>, StoreError> {
        fn put<T: serde::Serialize>(key: String, v: &T) -> Result<Op, StoreError> {
            let value = serde_json::to_vec(v)
                .map_err(|e| StoreError::Backend(format!("encode {key}: {e}")))?;
            Ok(Op::Put { key, value })
        }
        let mut ops = Vec::with_capacity(
            self.jobs.len()
                + self.versions.len()
                + self.nodes.len()
                + self.allocs.len()
                + self.evals.len()
                + self.drop_versions.len(),
        );
        for (ns, name) in &self.purge {
            ops.push(Op::Delete {
                key: job_key(ns, name),
            });
            for d in state.deployments_of_job(ns, name) {
                ops.push(Op::Delete {
                    key: deployment_key(&d.id),
                });
            }
            if let Some(vs) = state.versions.get(&job_id(ns, name)) {
                for v in vs.keys() {
                    ops.push(Op::Delete {
                        key: version_key(ns, name, *v),
                    });
                }
            }
        }
        for ((ns, name), v) in &self.drop_versions {
            ops.push(Op::Delete {
                key: version_key(ns, name, *v),
            });
        }
        for name in &self.drop_namespaces {
            ops.push(Op::Delete {
                key: namespace_key(name),
            });
        }
        for n in &self.namespaces {
            ops.push(put(namespace_key(&n.name), n)?);
        }
        for id in &self.drop_evals {
            ops.push(Op::Delete {
                key: format!("eval/{id}"),
            });
        }
        for id in &self.drop_allocs {
            ops.push(Op::Delete {
                key: state.alloc_store_key(id, None),
            });
        }
        for id in &self.drop_nodes {
            ops.push(Op::Delete {
                key: format!("node/{id}"),
            });
        }
        for id in &self.drop_node_secrets {
            ops.push(Op::Delete {
                key: node_secret_key(id),
            });
        }
        for id in &self.drop_services {
            ops.push(Op::Delete {
                key: services::service_key(id),
            });
        }
        for id in &self.drop_deployments {
            ops.push(Op::Delete {
                key: deployment_key(id),
            });
        }
        for (ns, path) in &self.drop_vars {
            ops.push(Op::Delete {
                key: crate::variables::var_key(ns, path),
            });
        }
        // Root keys before the variables they encrypt (a split transaction's prefix
        // never holds a ciphertext whose key is missing).
        for k in &self.root_keys {
            ops.push(put(root_key_key(&k.meta.key_id), k)?);
        }
        for v in &self.vars {
            ops.push(put(crate::variables::var_key(&v.namespace, &v.path), v)?);
        }
        for j in &self.jobs {
            ops.push(put(job_key(&j.spec.namespace, &j.spec.name), j)?);
        }
        for j in &self.versions {
            ops.push(put(
                version_key(&j.spec.namespace, &j.spec.name, j.version),
                j,
            )?);
        }
        for n in &self.nodes {
            ops.push(put(format!("node/{}", n.id), n)?);
        }
        for (id, hash) in &self.node_secrets {
            ops.push(put(node_secret_key(id), hash)?);
        }
        for a in &self.allocs {
            ops.push(put(state.alloc_store_key(&a.id, Some(a.create_index)), a)?);
        }
        for r in &self.services {
            ops.push(put(services::service_key(&r.id), r)?);
        }
        for e in &self.evals {
            ops.push(put(format!("eval/{}", e.id), e)?);
        }
        for d in &self.deployments {
            ops.push(put(deployment_key(&d.id), d)?);
        }
        for name in &self.drop_acl_policies {
            ops.push(Op::Delete {
                key: acl::policy_key(name),
            });
        }
        for accessor in &self.drop_acl_tokens {
            ops.push(Op::Delete {
                key: acl::token_key(accessor),
            });
        }
        for p in &self.acl_policies {
            ops.push(put(acl::policy_key(&p.name), p)?);
        }
        for t in &self.acl_tokens {
            ops.push(put(acl::token_key(&t.accessor_id), t)?);
        }
        if let Some(index) = self.acl_bootstrap {
            ops.push(put(acl::BOOTSTRAP_KEY.to_owned(), &index)?);
        }
        for (ns, id) in &self.drop_csi_volumes {
            ops.push(Op::Delete {
                key: csi::csi_volume_key(ns, id),
            });
        }
        for v in &self.csi_volumes {
            ops.push(put(csi::csi_volume_key(&v.namespace, &v.id), v)?);
        }
        Ok(ops)
    }
}

/// `a` (live until now) no longer holds its ports.
fn free_ports(ports: &mut HashMap<String, UsedPorts>, a: &Allocation) {
    if a.ports.is_empty() {
        return;
    }
    if let Some(used) = ports.get_mut(&a.node_id) {
        used.remove_alloc(a);
        if used.is_empty() {
            ports.remove(&a.node_id);
        }
    }
}

/// Everything the server knows, indexed.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The index of the last applied commit.
    pub index: Index,
    jobs: HashMap<JobKey, Job>,
    versions: HashMap<JobKey, BTreeMap<u64, Job>>,
    /// Namespaces written (`default` is there only once someone wrote it).
    namespaces: BTreeMap<String, Namespace>,
    nodes: BTreeMap<String, Node>,
    /// Hex SHA-256 of each node's secret, by node id (see `endpoints/nodes.rs`).
    node_secrets: HashMap<String, String>,
    allocs: HashMap<String, Allocation>,
    /// The store keys of the allocations not stored under [`alloc_key`] of their
    /// create index (`alloc/<id>`: written by a server before that key), by id.
    alloc_keys: HashMap<String, String>,
    by_job: HashMap<JobKey, HashSet<String>>,
    by_node: HashMap<String, HashSet<String>>,
    usage: HashMap<String, AllocResources>,
    /// The ports the non-terminal allocations of each node hold (only nodes where some
    /// do), kept with `usage`: placing tests a bit instead of scanning allocations.
    ports: HashMap<String, UsedPorts>,
    evals: HashMap<String, Evaluation>,
    evals_by_job: HashMap<JobKey, Vec<String>>,
    /// The blocked evaluation of each job that has one.
    blocked: HashMap<JobKey, String>,
    /// Service registrations, indexed by name and by allocation.
    services: services::Registry,
    deployments: HashMap<String, Deployment>,
    /// Each job's deployments by creation index (and id: two made in one commit).
    deployments_by_job: HashMap<JobKey, BTreeSet<(Index, String)>>,
    /// ACL policies and tokens.
    pub(crate) acl: acl::AclState,

    /// Variables by (namespace, path), their items encrypted.
    vars: BTreeMap<(String, String), crate::variables::StoredVariable>,
    /// The keyring's root keys by id (their material wrapped).
    root_keys: BTreeMap<String, crate::keyring::StoredRootKey>,
    /// CSI volumes by (namespace, id).
    csi_volumes: BTreeMap<(String, String), drover_server_api::csi::CsiVolume>,
}

impl State {
    /// Rebuild the state from everything the store holds.
    pub(crate) fn load(kvs: Vec<KeyValue>, index: Index) -> Result<State, StoreError> {
        fn decode<T: serde::de::DeserializeOwned>(kv: &KeyValue) -> Result<T, StoreError> {
            serde_json::from_slice(&kv.value)
                .map_err(|e| StoreError::Corrupt(format!("value of {}: {e}", kv.key)))
        }
        let mut s = State {
            index,
            ..State::default()
        };
        for kv in &kvs {
            let (kind, _) = kv.key.split_once('/').unwrap_or((kv.key.as_str(), ""));
            match kind {
                "job" => {
                    let j: Job = decode(kv)?;
                    s.jobs.insert(job_id(&j.spec.namespace, &j.spec.name), j);
                }
                "jobv" => {
                    let j: Job = decode(kv)?;
                    s.versions
                        .entry(job_id(&j.spec.namespace, &j.spec.name))
                        .or_default()
                        .insert(j.version, j);
                }
                "namespace" => {
                    let n: Namespace = decode(kv)?;
                    s.namespaces.insert(n.name.clone(), n);
                }
                "node" => s.put_node(decode(kv)?),
                "nodesecret" => {
                    let id = kv.key.split_once('/').map_or("", |(_, id)| id).to_owned();
                    s.node_secrets.insert(id, decode(kv)?);
                }
                "alloc" => {
                    let a: Allocation = decode(kv)?;
                    if alloc_key(a.create_index, &a.id) != kv.key {
                        s.alloc_keys.insert(a.id.clone(), kv.key.clone());
                    }
                    s.put_alloc(a);
                }
                "eval" => s.put_eval(decode(kv)?),
                "service" => s.services.put(decode(kv)?),
                "deployment" => s.put_deployment(decode(kv)?),
                "aclpolicy" => s.acl.put_policy(decode(kv)?),
                "acltoken" => s.acl.put_token(decode(kv)?),
                "aclbootstrap" => s.acl.set_bootstrapped(decode(kv)?),

                "var" => s.put_var(decode(kv)?),
                "rootkey" => {
                    let k: crate::keyring::StoredRootKey = decode(kv)?;
                    s.root_keys.insert(k.meta.key_id.clone(), k);
                }
                "csivol" => s.put_csi_volume(decode(kv)?),
                _ => note_unknown_key(&kv.key),
            }
        }
        // Evaluations in creation order within each job (the store returns key order).
        let evals = &s.evals;
        for ids in s.evals_by_job.values_mut() {
            ids.sort_by_key(|id| evals.get(id).map_or(0, |e| e.create_index));
        }
        Ok(s)
    }

    /// Apply a committed batch.
    pub(crate) fn apply(&mut self, batch: Batch, index: Index) {
        for job in batch.purge {
            self.jobs.remove(&job);
            self.versions.remove(&job);
            if let Some(ids) = self.deployments_by_job.remove(&job) {
                for (_, id) in &ids {
                    self.deployments.remove(id);
                }
            }
        }
        for (job, v) in batch.drop_versions {
            if let Some(vs) = self.versions.get_mut(&job) {
                vs.remove(&v);
            }
        }
        for j in batch.versions {
            self.versions
                .entry(job_id(&j.spec.namespace, &j.spec.name))
                .or_default()
                .insert(j.version, j);
        }
        for j in batch.jobs {
            self.jobs.insert(job_id(&j.spec.namespace, &j.spec.name), j);
        }
        for name in batch.drop_namespaces {
            self.namespaces.remove(&name);
        }
        for n in batch.namespaces {
            self.namespaces.insert(n.name.clone(), n);
        }
        for n in batch.nodes {
            self.put_node(n);
        }
        for (id, hash) in batch.node_secrets {
            self.node_secrets.insert(id, hash);
        }
        self.alloc_keys.extend(batch.alloc_keys);
        for a in batch.allocs {
            self.put_alloc(a);
        }
        for id in batch.drop_evals {
            self.remove_eval(&id);
        }
        for e in batch.evals {
            self.put_eval(e);
        }
        for id in batch.drop_allocs {
            self.remove_alloc(&id);
        }
        for id in batch.drop_nodes {
            self.nodes.remove(&id);
            self.usage.remove(&id);
            self.ports.remove(&id);
        }
        for id in batch.drop_node_secrets {
            self.node_secrets.remove(&id);
        }
        for id in batch.drop_services {
            self.services.remove(&id);
        }
        for r in batch.services {
            self.services.put(r);
        }
        for id in batch.drop_deployments {
            self.remove_deployment(&id);
        }
        for d in batch.deployments {
            self.put_deployment(d);
        }
        for name in batch.drop_acl_policies {
            self.acl.remove_policy(&name);
        }
        for accessor in batch.drop_acl_tokens {
            self.acl.remove_token(&accessor);
        }
        for p in batch.acl_policies {
            self.acl.put_policy(p);
        }
        for t in batch.acl_tokens {
            self.acl.put_token(t);
        }
        if let Some(i) = batch.acl_bootstrap {
            self.acl.set_bootstrapped(i);
        }
        for k in batch.root_keys {
            self.root_keys.insert(k.meta.key_id.clone(), k);
        }
        for (ns, path) in batch.drop_vars {
            self.vars.remove(&(ns, path));
        }
        for v in batch.vars {
            self.put_var(v);
        }
        for (ns, id) in batch.drop_csi_volumes {
            self.remove_csi_volume(&ns, &id);
        }
        for v in batch.csi_volumes {
            self.put_csi_volume(v);
        }
        self.index = index;
    }

    fn put_var(&mut self, v: crate::variables::StoredVariable) {
        self.vars.insert((v.namespace.clone(), v.path.clone()), v);
    }

    /// A variable (encrypted) by namespace and path.
    pub(crate) fn var(
        &self,
        namespace: &str,
        path: &str,
    ) -> Option<&crate::variables::StoredVariable> {
        self.vars.get(&(namespace.to_owned(), path.to_owned()))
    }

    /// The variables of `namespace` (every namespace for `*`) whose path starts with
    /// `prefix`, in (namespace, path) order.
    pub(crate) fn vars_with_prefix<'a>(
        &'a self,
        namespace: &'a str,
        prefix: &'a str,
    ) -> impl Iterator<Item = &'a crate::variables::StoredVariable> + 'a {
        self.vars.values().filter(move |v| {
            (namespace == "*" || v.namespace == namespace) && v.path.starts_with(prefix)
        })
    }

    /// How many variables `namespace` holds.
    pub(crate) fn var_count(&self, namespace: &str) -> usize {
        self.vars.keys().filter(|(ns, _)| ns == namespace).count()
    }

    /// Every root key, by id.
    pub(crate) fn root_keys(&self) -> &BTreeMap<String, crate::keyring::StoredRootKey> {
        &self.root_keys
    }

    /// The active root key, if any.
    pub(crate) fn active_root_key(&self) -> Option<&crate::keyring::StoredRootKey> {
        self.root_keys
            .values()
            .filter(|k| k.meta.state == crate::keyring::ACTIVE)
            .max_by_key(|k| (k.meta.create_index, k.meta.create_time))
    }

    fn put_deployment(&mut self, d: Deployment) {
        self.deployments_by_job
            .entry(job_id(&d.namespace, &d.job_name))
            .or_default()
            .insert((d.create_index, d.id.clone()));
        self.deployments.insert(d.id.clone(), d);
    }

    fn remove_deployment(&mut self, id: &str) {
        let Some(d) = self.deployments.remove(id) else {
            return;
        };
        let job = job_id(&d.namespace, &d.job_name);
        if let Some(ids) = self.deployments_by_job.get_mut(&job) {
            ids.remove(&(d.create_index, d.id.clone()));
            if ids.is_empty() {
                self.deployments_by_job.remove(&job);
            }
        }
    }

    /// A deployment by id.
    pub(crate) fn deployment(&self, id: &str) -> Option<&Deployment> {
        self.deployments.get(id)
    }

    /// Every deployment.
    pub(crate) fn all_deployments(&self) -> impl Iterator<Item = &Deployment> {
        self.deployments.values()
    }

    /// A job's deployments, oldest first.
    pub(crate) fn deployments_of_job(
        &self,
        ns: &str,
        job: &str,
    ) -> impl DoubleEndedIterator<Item = &Deployment> {
        self.deployments_by_job
            .get(&job_id(ns, job))
            .into_iter()
            .flat_map(|ids| ids.iter())
            .filter_map(|(_, id)| self.deployments.get(id))
    }

    fn remove_alloc(&mut self, id: &str) {
        self.alloc_keys.remove(id);
        let Some(a) = self.allocs.remove(id) else {
            return;
        };
        if !a.is_terminal() {
            if let Some(u) = self.usage.get_mut(&a.node_id) {
                u.cpu = u.cpu.saturating_sub(a.resources.cpu);
                u.memory_mb = u.memory_mb.saturating_sub(a.resources.memory_mb);
            }
            free_ports(&mut self.ports, &a);
        }
        let job = job_id(&a.namespace, &a.job_name);
        if let Some(ids) = self.by_job.get_mut(&job) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_job.remove(&job);
            }
        }
        if let Some(ids) = self.by_node.get_mut(&a.node_id) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_node.remove(&a.node_id);
            }
        }
    }

    fn put_node(&mut self, n: Node) {
        self.nodes.insert(n.id.clone(), n);
    }

    fn put_alloc(&mut self, a: Allocation) {
        match self.allocs.get(&a.id) {
            Some(old) => {
                if !old.is_terminal() {
                    if let Some(u) = self.usage.get_mut(&old.node_id) {
                        u.cpu = u.cpu.saturating_sub(old.resources.cpu);
                        u.memory_mb = u.memory_mb.saturating_sub(old.resources.memory_mb);
                    }
                    free_ports(&mut self.ports, old);
                }
            }
            None => {
                self.by_job
                    .entry(job_id(&a.namespace, &a.job_name))
                    .or_default()
                    .insert(a.id.clone());
                // Looked up before inserting: an owned key costs an allocation, and a
                // node's entry mostly exists already.
                match self.by_node.get_mut(&a.node_id) {
                    Some(ids) => {
                        ids.insert(a.id.clone());
                    }
                    None => {
                        self.by_node
                            .insert(a.node_id.clone(), HashSet::from([a.id.clone()]));
                    }
                }
            }
        }
        if !a.is_terminal() {
            if !self.usage.contains_key(&a.node_id) {
                self.usage
                    .insert(a.node_id.clone(), AllocResources::default());
            }
            if let Some(u) = self.usage.get_mut(&a.node_id) {
                u.cpu += a.resources.cpu;
                u.memory_mb += a.resources.memory_mb;
            }
            if !a.ports.is_empty() {
                match self.ports.get_mut(&a.node_id) {
                    Some(used) => used.add_alloc(&a),
                    None => {
                        let mut used = UsedPorts::default();
                        used.add_alloc(&a);
                        self.ports.insert(a.node_id.clone(), used);
                    }
                }
            }
        }
        self.allocs.insert(a.id.clone(), a);
    }

    fn put_eval(&mut self, e: Evaluation) {
        let job = job_id(&e.namespace, &e.job_name);
        if !self.evals.contains_key(&e.id) {
            self.evals_by_job
                .entry(job.clone())
                .or_default()
                .push(e.id.clone());
        }
        if e.status == EvalStatus::Blocked {
            self.blocked.insert(job, e.id.clone());
        } else if self.blocked.get(&job) == Some(&e.id) {
            self.blocked.remove(&job);
        }
        self.evals.insert(e.id.clone(), e);
    }

    fn remove_eval(&mut self, id: &str) {
        let Some(e) = self.evals.remove(id) else {
            return;
        };
        let job = job_id(&e.namespace, &e.job_name);
        if let Some(ids) = self.evals_by_job.get_mut(&job) {
            ids.retain(|x| x != id);
            if ids.is_empty() {
                self.evals_by_job.remove(&job);
            }
        }
        if self.blocked.get(&job).map(String::as_str) == Some(id) {
            self.blocked.remove(&job);
        }
    }

    // --- reads ------------------------------------------------------------------------

    pub(crate) fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    /// The namespace named `name`: `default` exists even when never written.
    pub(crate) fn namespace(&self, name: &str) -> Option<Cow<'_, Namespace>> {
        match self.namespaces.get(name) {
            Some(n) => Some(Cow::Borrowed(n)),
            None if name == DEFAULT_NAMESPACE => Some(Cow::Owned(Namespace::default_one())),
            None => None,
        }
    }

    /// Every namespace, by name (`default` among them).
    pub(crate) fn namespaces(&self) -> Vec<Cow<'_, Namespace>> {
        let mut all: Vec<_> = self.namespaces.values().map(Cow::Borrowed).collect();
        if !self.namespaces.contains_key(DEFAULT_NAMESPACE) {
            all.push(Cow::Owned(Namespace::default_one()));
            all.sort_by(|a, b| a.name.cmp(&b.name));
        }
        all
    }

    /// How many namespaces are written (`default` counts once written).
    pub(crate) fn namespace_count(&self) -> usize {
        self.namespaces.len()
    }

    /// Whether anything lives in namespace `ns`: a job (a stopped one too) or
    /// allocations, evaluations or deployments left of a purged one.
    pub(crate) fn namespace_in_use(&self, ns: &str) -> bool {
        self.jobs.keys().any(|(n, _)| n == ns)
            || self.by_job.keys().any(|(n, _)| n == ns)
            || self.evals_by_job.keys().any(|(n, _)| n == ns)
            || self.deployments_by_job.keys().any(|(n, _)| n == ns)
    }

    /// The job named `name` in namespace `ns`.
    pub(crate) fn job_in(&self, ns: &str, name: &str) -> Option<&Job> {
        self.jobs.get(&job_id(ns, name))
    }

    /// The job at `version`, if that version is kept.
    pub(crate) fn job_at_version(&self, ns: &str, name: &str, version: u64) -> Option<&Job> {
        let job = job_id(ns, name);
        self.versions
            .get(&job)
            .and_then(|vs| vs.get(&version))
            .or_else(|| self.jobs.get(&job).filter(|j| j.version == version))
    }

    pub(crate) fn job_versions(&self, ns: &str, name: &str) -> Option<&BTreeMap<u64, Job>> {
        self.versions.get(&job_id(ns, name))
    }

    /// The current version of an allocation's job.
    fn job_of(&self, a: &Allocation) -> Option<&Job> {
        self.job_in(&a.namespace, &a.job_name)
    }

    /// The group an allocation runs: at its job version if kept, else the current
    /// version's (a purged job's allocations get an empty group: the client only has to
    /// stop them).
    pub(crate) fn alloc_group(&self, a: &Allocation) -> TaskGroup {
        let from = |j: &Job| j.spec.groups.iter().find(|g| g.name == a.group).cloned();
        self.job_at_version(&a.namespace, &a.job_name, a.job_version)
            .and_then(from)
            .or_else(|| self.job_of(a).and_then(from))
            .unwrap_or_else(|| TaskGroup {
                volumes: Default::default(),
                update: Default::default(),
                network: Default::default(),
                services: Default::default(),
                reschedule: None,
                name: a.group.clone(),
                count: 0,
                constraints: Vec::new(),
                meta: BTreeMap::new(),
                tasks: Vec::new(),
            })
    }

    /// The update strategy of the allocation's group at its version, when the
    /// allocation belongs to a deployment (the client decides its health by it).
    pub(crate) fn alloc_update(&self, a: &Allocation) -> Option<drover_server_api::UpdateStrategy> {
        a.deployment_id.as_ref()?;
        let job = self
            .job_at_version(&a.namespace, &a.job_name, a.job_version)
            .or_else(|| self.job_of(a))?;
        let group = job.spec.groups.iter().find(|g| g.name == a.group)?;
        Some(job.spec.update_of(group))
    }

    /// The job's `meta` at the allocation's version (the current job's when that
    /// version is no longer kept; empty when the job is gone).
    pub(crate) fn alloc_job_meta(&self, a: &Allocation) -> BTreeMap<String, String> {
        self.job_at_version(&a.namespace, &a.job_name, a.job_version)
            .or_else(|| self.job_of(a))
            .map(|j| j.spec.meta.clone())
            .unwrap_or_default()
    }

    /// The hex SHA-256 of a node's secret, once one was bound.
    pub(crate) fn node_secret_hash(&self, id: &str) -> Option<&str> {
        self.node_secrets.get(id).map(String::as_str)
    }

    pub(crate) fn all_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub(crate) fn alloc(&self, id: &str) -> Option<&Allocation> {
        self.allocs.get(id)
    }

    pub(crate) fn all_allocs(&self) -> impl Iterator<Item = &Allocation> {
        self.allocs.values()
    }

    pub(crate) fn job_count(&self) -> usize {
        self.jobs.len()
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn alloc_count(&self) -> usize {
        self.allocs.len()
    }

    pub(crate) fn eval(&self, id: &str) -> Option<&Evaluation> {
        self.evals.get(id)
    }

    pub(crate) fn all_evals(&self) -> impl Iterator<Item = &Evaluation> {
        self.evals.values()
    }

    /// Jobs that have evaluations (purged ones included).
    pub(crate) fn jobs_with_evals(&self) -> impl Iterator<Item = &JobKey> {
        self.evals_by_job.keys()
    }

    /// Jobs that have allocations (purged ones included).
    pub(crate) fn jobs_with_allocs(&self) -> impl Iterator<Item = &JobKey> {
        self.by_job.keys()
    }

    pub(crate) fn evals_of_job(&self, ns: &str, job: &str) -> impl Iterator<Item = &Evaluation> {
        self.evals_by_job
            .get(&job_id(ns, job))
            .into_iter()
            .flatten()
            .filter_map(|id| self.evals.get(id))
    }

    /// The job's blocked evaluation, if any.
    pub(crate) fn blocked_eval(&self, ns: &str, job: &str) -> Option<&Evaluation> {
        self.blocked
            .get(&job_id(ns, job))
            .and_then(|id| self.evals.get(id))
    }

    /// Every blocked evaluation.
    pub(crate) fn blocked_evals(&self) -> impl Iterator<Item = &Evaluation> {
        self.blocked.values().filter_map(|id| self.evals.get(id))
    }

    /// The ports the node's live allocations hold (the index the scheduler and the
    /// plan applier test ports against).
    pub(crate) fn used_ports(&self, node_id: &str) -> Option<&UsedPorts> {
        self.ports.get(node_id)
    }

    /// The store key of allocation `id`: where it is stored if the state holds it,
    /// else [`alloc_key`] of `create_index` (a new allocation); the older form
    /// `alloc/<id>` when neither is known (a delete of an allocation the state does
    /// not hold: there is nothing else it could be stored under).
    pub(crate) fn alloc_store_key(&self, id: &str, create_index: Option<Index>) -> String {
        if let Some(key) = self.alloc_keys.get(id) {
            return key.clone();
        }
        match self.allocs.get(id).map(|a| a.create_index).or(create_index) {
            Some(index) => alloc_key(index, id),
            None => format!("alloc/{id}"),
        }
    }

    /// The node's allocations, by iteration over its index only.
    pub(crate) fn allocs_on_node(&self, node_id: &str) -> impl Iterator<Item = &Allocation> {
        self.by_node
            .get(node_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.allocs.get(id))
    }

    pub(crate) fn allocs_of_job(&self, ns: &str, job: &str) -> impl Iterator<Item = &Allocation> {
        self.by_job
            .get(&job_id(ns, job))
            .into_iter()
            .flatten()
            .filter_map(|id| self.allocs.get(id))
    }
}

impl StateView for State {
    fn index(&self) -> Index {
        self.index
    }

    fn job(&self, ns: &str, name: &str) -> Option<&Job> {
        self.job_in(ns, name)
    }

    fn job_version(&self, ns: &str, name: &str, version: u64) -> Option<&Job> {
        self.job_at_version(ns, name, version)
    }

    fn nodes(&self) -> Vec<&Node> {
        self.nodes.values().collect()
    }

    fn csi_volume(&self, ns: &str, id: &str) -> Option<&drover_server_api::csi::CsiVolume> {
        State::csi_volume(self, ns, id)
    }

    fn csi_claims(&self, ns: &str, id: &str) -> Vec<drover_server_api::csi::CsiClaim> {
        State::csi_claims(self, ns, id)
    }

    fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id)
    }

    fn job_allocs(&self, ns: &str, job: &str) -> Vec<&Allocation> {
        self.allocs_of_job(ns, job).collect()
    }

    fn node_allocs(&self, node_id: &str) -> Vec<&Allocation> {
        self.allocs_on_node(node_id).collect()
    }

    fn node_usage(&self, node_id: &str) -> AllocResources {
        self.usage.get(node_id).copied().unwrap_or_default()
    }

    fn node_ports(&self, node_id: &str) -> Option<Cow<'_, UsedPorts>> {
        self.ports.get(node_id).map(Cow::Borrowed)
    }

    fn latest_deployment(&self, ns: &str, job: &str) -> Option<&Deployment> {
        self.deployments_of_job(ns, job).next_back()
    }
}

/// The state with one job replaced: what `job plan` schedules against.
pub(crate) struct Overlay<'a> {
    pub base: &'a State,
    pub job: Job,
}

impl StateView for Overlay<'_> {
    fn index(&self) -> Index {
        self.base.index
    }
    fn job(&self, ns: &str, name: &str) -> Option<&Job> {
        if name == self.job.spec.name && ns == self.job.spec.namespace {
            Some(&self.job)
        } else {
            self.base.job(ns, name)
        }
    }
    fn job_version(&self, ns: &str, name: &str, version: u64) -> Option<&Job> {
        if name == self.job.spec.name
            && ns == self.job.spec.namespace
            && version == self.job.version
        {
            Some(&self.job)
        } else {
            self.base.job_version(ns, name, version)
        }
    }
    fn nodes(&self) -> Vec<&Node> {
        self.base.nodes()
    }
    fn node(&self, id: &str) -> Option<&Node> {
        self.base.node(id)
    }
    fn job_allocs(&self, ns: &str, job: &str) -> Vec<&Allocation> {
        self.base.job_allocs(ns, job)
    }
    fn node_allocs(&self, node_id: &str) -> Vec<&Allocation> {
        self.base.node_allocs(node_id)
    }
    fn latest_deployment(&self, ns: &str, job: &str) -> Option<&Deployment> {
        self.base.latest_deployment(ns, job)
    }
    fn node_usage(&self, node_id: &str) -> AllocResources {
        self.base.node_usage(node_id)
    }
    fn node_ports(&self, node_id: &str) -> Option<Cow<'_, UsedPorts>> {
        self.base.node_ports(node_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &[u8]) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.to_vec(),
            create_revision: 1,
            mod_revision: 1,
        }
    }

    #[test]
    fn a_change_becomes_a_batch_by_key_kind() {
        let change = StoreChange {
            revision: Some(7),
            puts: vec![kv("nodesecret/n1", b"\"abcd\""), kv("meta/index", b"7")],
            deletes: vec![
                "job/web".into(),
                "job/ops/db".into(),
                "jobv/web/00000000000000000003".into(),
                "jobv/ops/db/00000000000000000004".into(),
                "namespace/ops".into(),
                "node/n2".into(),
                "nodesecret/n2".into(),
                "alloc/a1".into(),
                "eval/e1".into(),
                "schema".into(),
            ],
        };
        let b = Batch::from_change(&change).unwrap();
        assert_eq!(b.purge, [job_id("default", "web"), job_id("ops", "db")]);
        assert_eq!(
            b.drop_versions,
            [(job_id("default", "web"), 3), (job_id("ops", "db"), 4)]
        );
        assert_eq!(b.drop_namespaces, ["ops"]);
        assert_eq!(b.drop_nodes, ["n2"]);
        assert_eq!(b.drop_node_secrets, ["n2"]);
        assert_eq!(b.drop_allocs, ["a1"]);
        assert_eq!(b.drop_evals, ["e1"]);
        assert_eq!(b.node_secrets, [("n1".to_owned(), "abcd".to_owned())]);

        let mut st = State::default();
        st.apply(b, 7);
        assert_eq!(st.index, 7);
        assert_eq!(st.node_secret_hash("n1"), Some("abcd"));
    }

    #[test]
    fn a_value_that_does_not_decode_is_an_error_naming_its_key() {
        let change = StoreChange {
            revision: Some(3),
            puts: vec![kv("alloc/a1", b"{not json")],
            deletes: vec![],
        };
        let err = Batch::from_change(&change).unwrap_err().to_string();
        assert!(err.contains("value of alloc/a1"), "{err}");
        let change = StoreChange {
            revision: Some(3),
            puts: vec![],
            deletes: vec!["jobv/web".into()],
        };
        let err = Batch::from_change(&change).unwrap_err().to_string();
        assert!(err.contains("jobv/web"), "{err}");
    }
}

#[cfg(test)]
mod ports_tests {
    use drover_server_api::{AllocatedPort, DesiredStatus};

    use super::*;
    use crate::scheduler::tests::node;

    fn alloc(id: &str, ports: &[u16]) -> Allocation {
        let mut a: Allocation = serde_json::from_value(serde_json::json!({
            "id": id, "name": "web.g[0]", "index": 0, "job_name": "web", "job_version": 0,
            "group": "g", "node_id": "id-n1", "node_name": "n1",
            "resources": {"cpu": 10, "memory_mb": 10},
            "desired_status": "run", "desired_description": "",
            "client_status": "running", "client_description": "",
            "task_states": {}, "eval_id": "e", "create_index": 2, "modify_index": 2,
            "alloc_modify_index": 2, "create_time": 0, "modify_time": 0
        }))
        .expect("an allocation");
        a.ports = ports
            .iter()
            .map(|p| AllocatedPort {
                label: format!("p{p}"),
                value: *p,
                to: *p,
                host_ip: "127.0.0.1".into(),
            })
            .collect();
        a
    }

    fn kv(key: String, value: Vec<u8>) -> KeyValue {
        KeyValue {
            key,
            value,
            create_revision: 2,
            mod_revision: 2,
        }
    }

    #[test]
    fn a_state_read_back_from_the_store_knows_the_ports_held_and_frees_them_on_stop() {
        let n = node("n1", 4000, 4096);
        let mut stopped = alloc("old", &[7000]);
        stopped.desired_status = DesiredStatus::Stop;
        let kvs = vec![
            kv("node/id-n1".into(), serde_json::to_vec(&n).unwrap()),
            kv(
                "alloc/a".into(),
                serde_json::to_vec(&alloc("a", &[8080, 20001])).unwrap(),
            ),
            kv("alloc/old".into(), serde_json::to_vec(&stopped).unwrap()),
        ];
        let mut st = State::load(kvs, 2).unwrap();
        let used = st.used_ports("id-n1").expect("the node's ports");
        assert!(used.contains(8080) && used.contains(20001));
        assert!(!used.contains(7000), "a stopped allocation holds no port");
        assert_eq!(
            StateView::node_ports(&st, "id-n1").map(|u| u.contains(8080)),
            Some(true)
        );
        // The client reports it failed: its ports are free.
        let mut a = alloc("a", &[8080, 20001]);
        a.client_status = drover_server_api::ClientStatus::Failed;
        st.apply(
            Batch {
                allocs: vec![a],
                ..Batch::default()
            },
            3,
        );
        assert!(st.used_ports("id-n1").is_none());
        // Garbage collection of a live one frees them too.
        st.apply(
            Batch {
                allocs: vec![alloc("b", &[9000])],
                ..Batch::default()
            },
            4,
        );
        assert!(st.used_ports("id-n1").is_some_and(|u| u.contains(9000)));
        st.apply(
            Batch {
                drop_allocs: vec!["b".into()],
                ..Batch::default()
            },
            5,
        );
        assert!(st.used_ports("id-n1").is_none());
    }
}

#[cfg(test)]
mod alloc_key_tests {
    use super::*;

    fn alloc(id: &str, create_index: Index) -> Allocation {
        serde_json::from_value(serde_json::json!({
            "id": id, "name": "web.g[0]", "index": 0, "job_name": "web", "job_version": 0,
            "group": "g", "node_id": "id-n1", "node_name": "n1",
            "resources": {"cpu": 10, "memory_mb": 10},
            "desired_status": "run", "desired_description": "",
            "client_status": "running", "client_description": "",
            "task_states": {}, "eval_id": "e", "create_index": create_index,
            "modify_index": create_index, "alloc_modify_index": create_index,
            "create_time": 0, "modify_time": 0
        }))
        .expect("an allocation")
    }

    fn keys(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Put { key, .. } => format!("put {key}"),
                Op::Delete { key } => format!("delete {key}"),
            })
            .collect()
    }

    #[test]
    fn allocations_are_stored_in_creation_order() {
        // Ids in reverse order, indexes ascending: the keys sort by index.
        let mut ks = [
            alloc_key(9, "ffff"),
            alloc_key(10, "eeee"),
            alloc_key(1_000_000, "0000"),
        ];
        let created = ks.clone();
        ks.sort();
        assert_eq!(ks, created);
        assert_eq!(
            alloc_key(12, "a1"),
            "alloc/00000000000000000012/a1",
            "the index is zero-padded to the width of u64::MAX"
        );
    }

    #[test]
    fn an_allocation_keeps_its_key_when_rewritten_and_deleted() {
        let st = State::default();
        let b = Batch {
            allocs: vec![alloc("a1", 12)],
            ..Batch::default()
        };
        assert_eq!(
            keys(&b.ops(&st).unwrap()),
            ["put alloc/00000000000000000012/a1"]
        );
        let mut st = State::default();
        st.apply(b, 12);
        // Rewritten later (a client's report): same key.
        let b = Batch {
            allocs: vec![alloc("a1", 12)],
            drop_allocs: vec![],
            ..Batch::default()
        };
        assert_eq!(
            keys(&b.ops(&st).unwrap()),
            ["put alloc/00000000000000000012/a1"]
        );
        let b = Batch {
            drop_allocs: vec!["a1".into()],
            ..Batch::default()
        };
        assert_eq!(
            keys(&b.ops(&st).unwrap()),
            ["delete alloc/00000000000000000012/a1"]
        );
    }

    #[test]
    fn allocations_an_older_server_wrote_keep_their_key() {
        let kvs = vec![
            KeyValue {
                key: "alloc/old".into(),
                value: serde_json::to_vec(&alloc("old", 3)).unwrap(),
                create_revision: 3,
                mod_revision: 3,
            },
            KeyValue {
                key: alloc_key(4, "new"),
                value: serde_json::to_vec(&alloc("new", 4)).unwrap(),
                create_revision: 4,
                mod_revision: 4,
            },
        ];
        let st = State::load(kvs, 4).unwrap();
        let b = Batch {
            allocs: vec![alloc("old", 3), alloc("new", 4)],
            drop_allocs: vec!["old".into(), "new".into()],
            ..Batch::default()
        };
        assert_eq!(
            keys(&b.ops(&st).unwrap()),
            [
                "delete alloc/old",
                "delete alloc/00000000000000000004/new",
                "put alloc/old",
                "put alloc/00000000000000000004/new",
            ]
        );
    }

    #[test]
    fn a_follower_learns_the_keys_from_the_leaders_commits() {
        let change = StoreChange {
            revision: Some(5),
            puts: vec![
                KeyValue {
                    key: "alloc/old".into(),
                    value: serde_json::to_vec(&alloc("old", 3)).unwrap(),
                    create_revision: 3,
                    mod_revision: 5,
                },
                KeyValue {
                    key: alloc_key(5, "new"),
                    value: serde_json::to_vec(&alloc("new", 5)).unwrap(),
                    create_revision: 5,
                    mod_revision: 5,
                },
            ],
            deletes: vec![],
        };
        let mut st = State::default();
        st.apply(Batch::from_change(&change).unwrap(), 5);
        assert_eq!(st.alloc_store_key("old", None), "alloc/old");
        assert_eq!(st.alloc_store_key("new", None), alloc_key(5, "new"));
        // Both forms of a deleted key name the allocation.
        let change = StoreChange {
            revision: Some(6),
            puts: vec![],
            deletes: vec!["alloc/old".into(), alloc_key(5, "new")],
        };
        let b = Batch::from_change(&change).unwrap();
        assert_eq!(b.drop_allocs, ["old", "new"]);
        st.apply(b, 6);
        assert!(st.alloc("old").is_none() && st.alloc("new").is_none());
        assert!(st.alloc_keys.is_empty());
    }
}
