//! Service registrations: what `GET /v1/services` and `GET /v1/service/<name>` serve,
//! and removing one by hand.

use std::collections::{BTreeMap, BTreeSet};

use drover_server_api::{Index, ServiceRegistration};

use super::NsFilter;
use crate::error::ServerError;
use crate::server::Server;
use crate::state::Batch;

impl Server {
    /// The services registered in the namespaces `namespaces` takes: per namespace,
    /// each service's name with the union of its instances' tags, by name.
    pub fn services(
        &self,
        namespaces: NsFilter<'_>,
    ) -> BTreeMap<String, Vec<(String, Vec<String>)>> {
        let st = self.core.read();
        let mut out: BTreeMap<String, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
        for name in st.service_names() {
            for r in st.service_instances(name) {
                if !namespaces(&r.namespace) {
                    continue;
                }
                out.entry(r.namespace.clone())
                    .or_default()
                    .entry(name)
                    .or_default()
                    .extend(r.tags.iter().map(String::as_str));
            }
        }
        out.into_iter()
            .map(|(ns, services)| {
                let services = services
                    .into_iter()
                    .map(|(name, tags)| {
                        (
                            name.to_owned(),
                            tags.into_iter().map(str::to_owned).collect(),
                        )
                    })
                    .collect();
                (ns, services)
            })
            .collect()
    }

    /// The registered instances of service `name` in namespace `ns`, oldest first
    /// (then by id).
    pub fn service_registrations(&self, ns: &str, name: &str) -> Vec<ServiceRegistration> {
        let st = self.core.read();
        let mut v: Vec<ServiceRegistration> = st
            .service_instances(name)
            .filter(|r| r.namespace == ns)
            .cloned()
            .collect();
        v.sort_by(|a, b| {
            a.create_index
                .cmp(&b.create_index)
                .then_with(|| a.id.cmp(&b.id))
        });
        v
    }

    /// Remove the registration `id` of service `name` (Nomad's
    /// `DELETE /v1/service/<name>/<id>`). Its client registers it again with its next
    /// report while the allocation runs, as Nomad's does. The commit's index.
    pub async fn delete_service(
        &self,
        ns: &str,
        name: &str,
        id: &str,
    ) -> Result<Index, ServerError> {
        let term = self.leadership.require()?;
        let (index, ()) = term
            .commit(|st, _index, _now| {
                match st.service(id) {
                    Some(r) if r.service_name == name && r.namespace == ns => {}
                    _ => {
                        return Err(ServerError::NotFound(format!(
                            "service registration {id} of service {name} not found"
                        )));
                    }
                }
                let b = Batch {
                    drop_services: vec![id.to_owned()],
                    ..Batch::default()
                };
                Ok((b, ()))
            })
            .await?;
        Ok(index)
    }
}
