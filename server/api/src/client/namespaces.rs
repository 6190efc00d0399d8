//! `/v1/namespaces`, `/v1/namespace/:name` (Nomad's namespace endpoints).

use hyper::Method;

use super::{Answer, Client, Error, QueryOptions};
use crate::{Index, Namespace};

impl Client {
    /// `GET /v1/namespaces`: the namespaces the caller may see, by name.
    pub async fn namespaces(&self) -> Result<Answer<Vec<Namespace>>, Error> {
        self.read(&["v1", "namespaces"], &QueryOptions::default())
            .await
    }

    /// `GET /v1/namespace/:name`.
    pub async fn namespace_info(&self, name: &str) -> Result<Answer<Namespace>, Error> {
        self.read(&["v1", "namespace", name], &QueryOptions::default())
            .await
    }

    /// `PUT /v1/namespace/:name`: create or update (description and meta).
    pub async fn apply_namespace(&self, ns: &Namespace) -> Result<Index, Error> {
        let body = serde_json::to_vec(ns)
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the namespace: {e}")))?;
        self.write_no_answer(Method::PUT, &["v1", "namespace", &ns.name], Some(body))
            .await
    }

    /// `DELETE /v1/namespace/:name`: delete an empty namespace.
    pub async fn delete_namespace(&self, name: &str) -> Result<Index, Error> {
        self.write_no_answer(Method::DELETE, &["v1", "namespace", name], None)
            .await
    }
}
