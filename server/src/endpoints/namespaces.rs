//! Namespaces: list, read, create or update, delete (Nomad's `/v1/namespaces`,
//! `/v1/namespace/:name`). `default` always exists and cannot be deleted; a namespace
//! that holds anything (a job, what is left of a purged one, a variable) cannot be
//! deleted either.

use drover_server_api::namespaces::MAX_NAMESPACES;
use drover_server_api::{DEFAULT_NAMESPACE, Index, Namespace};

use super::NsFilter;
use crate::error::ServerError;
use crate::server::Server;
use crate::state::Batch;

impl Server {
    /// The namespaces `namespaces` takes, by name.
    pub fn namespaces(&self, namespaces: NsFilter<'_>) -> Vec<Namespace> {
        let st = self.core.read();
        st.namespaces()
            .into_iter()
            .filter(|n| namespaces(&n.name))
            .map(|n| n.into_owned())
            .collect()
    }

    /// One namespace.
    pub fn namespace(&self, name: &str) -> Option<Namespace> {
        self.core.read().namespace(name).map(|n| n.into_owned())
    }

    /// Create or update a namespace (its description and meta). The commit's index.
    pub async fn upsert_namespace(&self, mut ns: Namespace) -> Result<Index, ServerError> {
        ns.check().map_err(ServerError::Invalid)?;
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, index, _now| {
                match st.namespace(&ns.name) {
                    Some(old) => {
                        ns.create_index = old.create_index;
                        if old.description == ns.description && old.meta == ns.meta {
                            // Unchanged: nothing to write (as Nomad's upsert of the same).
                            return Ok((Batch::default(), ()));
                        }
                    }
                    None => {
                        if st.namespace_count() >= MAX_NAMESPACES {
                            return Err(ServerError::Invalid(format!(
                                "the cluster holds {MAX_NAMESPACES} namespaces, the most it may"
                            )));
                        }
                        ns.create_index = index;
                    }
                }
                ns.modify_index = index;
                let b = Batch {
                    namespaces: vec![ns.clone()],
                    ..Batch::default()
                };
                Ok((b, ()))
            })
            .await?;
        Ok(index)
    }

    /// Delete an empty namespace other than `default`. The commit's index.
    pub async fn delete_namespace(&self, name: &str) -> Result<Index, ServerError> {
        if name == DEFAULT_NAMESPACE {
            return Err(ServerError::Invalid(
                "default namespace can not be deleted".into(),
            ));
        }
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, _index, _now| {
                if st.namespace(name).is_none() {
                    return Err(ServerError::NotFound(format!(
                        "namespace {name:?} not found"
                    )));
                }
                if st.namespace_in_use(name) {
                    return Err(ServerError::Invalid(format!(
                        "namespace {name:?} has jobs, or allocations or evaluations of a \
                         purged one: stop and purge them (and wait for their collection) first"
                    )));
                }
                let volumes = st.csi_volumes(name).count();
                if volumes > 0 {
                    return Err(ServerError::Invalid(format!(
                        "namespace {name:?} has {volumes} CSI volumes: deregister or delete them first"
                    )));
                }
                let vars = st.var_count(name);
                if vars > 0 {
                    return Err(ServerError::Invalid(format!(
                        "namespace {name:?} has {vars} variables: purge them first"
                    )));
                }
                let b = Batch {
                    drop_namespaces: vec![name.to_owned()],
                    ..Batch::default()
                };
                Ok((b, ()))
            })
            .await?;
        Ok(index)
    }
}
