//! Service registrations in the state: kept by id, indexed by service name and by
//! allocation; what a client's report changes; and their removal with their
//! allocation, in the commit that ends it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use drover_server_api::{
    Allocation, Index, MAX_SERVICES_PER_ALLOC, Node, ServiceInstance, ServiceRegistration,
};

use super::{Batch, State};
use crate::error::ServerError;

/// Key of a registration.
pub(crate) fn service_key(id: &str) -> String {
    format!("service/{id}")
}

/// Every registration, with its indexes.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    by_id: HashMap<String, ServiceRegistration>,
    by_name: BTreeMap<String, BTreeSet<String>>,
    by_alloc: HashMap<String, BTreeSet<String>>,
}

impl Registry {
    pub(crate) fn put(&mut self, r: ServiceRegistration) {
        self.remove(&r.id);
        self.by_name
            .entry(r.service_name.clone())
            .or_default()
            .insert(r.id.clone());
        self.by_alloc
            .entry(r.alloc_id.clone())
            .or_default()
            .insert(r.id.clone());
        self.by_id.insert(r.id.clone(), r);
    }

    pub(crate) fn remove(&mut self, id: &str) {
        let Some(r) = self.by_id.remove(id) else {
            return;
        };
        if let Some(ids) = self.by_name.get_mut(&r.service_name) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_name.remove(&r.service_name);
            }
        }
        if let Some(ids) = self.by_alloc.get_mut(&r.alloc_id) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_alloc.remove(&r.alloc_id);
            }
        }
    }
}

impl State {
    /// One registration.
    pub(crate) fn service(&self, id: &str) -> Option<&ServiceRegistration> {
        self.services.by_id.get(id)
    }

    /// The registrations of service `name`, by id.
    pub(crate) fn service_instances(
        &self,
        name: &str,
    ) -> impl Iterator<Item = &ServiceRegistration> {
        self.services
            .by_name
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|id| self.services.by_id.get(id))
    }

    /// Every service name with its registrations.
    pub(crate) fn service_names(&self) -> impl Iterator<Item = &str> {
        self.services.by_name.keys().map(String::as_str)
    }

    /// The registrations of one allocation.
    pub(crate) fn services_of_alloc(
        &self,
        alloc_id: &str,
    ) -> impl Iterator<Item = &ServiceRegistration> {
        self.services
            .by_alloc
            .get(alloc_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.services.by_id.get(id))
    }
}

/// Check a client's report of an allocation's instances (`what` names the update in
/// errors); a report that fails has its services skipped, not its node's request.
pub(crate) fn check_report(what: &str, instances: &[ServiceInstance]) -> Result<(), ServerError> {
    if instances.len() > MAX_SERVICES_PER_ALLOC {
        return Err(ServerError::Invalid(format!(
            "{what}.services: {} instances, at most {MAX_SERVICES_PER_ALLOC} per allocation",
            instances.len()
        )));
    }
    for (i, inst) in instances.iter().enumerate() {
        inst.clone()
            .check(&format!("{what}.services[{i}]"))
            .map_err(ServerError::Invalid)?;
    }
    Ok(())
}

/// What registering `instances` (the allocation's complete set) changes: the
/// registrations to write (new or changed ones, at `index`) and the ids to remove.
/// A terminal allocation registers nothing.
pub(crate) fn apply_report(
    st: &State,
    alloc: &Allocation,
    node: &Node,
    instances: &[ServiceInstance],
    index: Index,
) -> (Vec<ServiceRegistration>, Vec<String>) {
    let old: HashMap<&str, &ServiceRegistration> = st
        .services_of_alloc(&alloc.id)
        .map(|r| (r.id.as_str(), r))
        .collect();
    let mut puts = Vec::new();
    let mut kept: HashSet<String> = HashSet::new();
    if !alloc.is_terminal() {
        for inst in instances {
            let mut inst = inst.clone();
            // Checked in `check_report`; this only cuts long outputs.
            if inst.check("services").is_err() {
                continue;
            }
            let id = inst.id(&alloc.id);
            if !kept.insert(id.clone()) {
                continue; // the same instance twice: the first counts
            }
            let mut r = ServiceRegistration {
                id: id.clone(),
                service_name: inst.service_name,
                namespace: alloc.namespace.clone(),
                node_id: alloc.node_id.clone(),
                datacenter: node.datacenter.clone(),
                job_id: alloc.job_name.clone(),
                alloc_id: alloc.id.clone(),
                tags: inst.tags,
                address: inst.address,
                port: inst.port,
                health: inst.health,
                checks: inst.checks,
                create_index: index,
                modify_index: index,
            };
            if let Some(o) = old.get(id.as_str()) {
                r.create_index = o.create_index;
                r.modify_index = o.modify_index;
                if **o == r {
                    continue;
                }
                r.modify_index = index;
            }
            puts.push(r);
        }
    }
    let drops = old
        .keys()
        .filter(|id| !kept.contains(**id))
        .map(|id| (*id).to_owned())
        .collect();
    (puts, drops)
}

/// An allocation that ends in this batch (or is deleted) loses its registrations in
/// the same commit; nothing is registered for an ended allocation.
pub(crate) fn drop_ended(st: &State, batch: &mut Batch) {
    let mut ended: HashSet<&str> = batch
        .allocs
        .iter()
        .filter(|a| a.is_terminal())
        .map(|a| a.id.as_str())
        .collect();
    ended.extend(batch.drop_allocs.iter().map(String::as_str));
    let alive_in_batch: HashSet<&str> = batch
        .allocs
        .iter()
        .filter(|a| !a.is_terminal())
        .map(|a| a.id.as_str())
        .collect();
    let ended_alloc = |id: &str| {
        ended.contains(id)
            || (!alive_in_batch.contains(id) && st.alloc(id).is_none_or(Allocation::is_terminal))
    };
    let mut drops: BTreeSet<String> = BTreeSet::new();
    for id in &ended {
        drops.extend(st.services_of_alloc(id).map(|r| r.id.clone()));
    }
    batch.services.retain(|r| {
        if ended_alloc(&r.alloc_id) {
            drops.insert(r.id.clone());
            false
        } else {
            true
        }
    });
    drops.retain(|id| st.service(id).is_some() && !batch.drop_services.contains(id));
    batch.drop_services.extend(drops);
}

#[cfg(test)]
mod tests {
    use drover_server_api::ServiceHealth;

    use super::*;
    use crate::store::{KeyValue, StoreChange};

    fn reg(id: &str, alloc: &str) -> ServiceRegistration {
        ServiceRegistration {
            id: id.into(),
            service_name: "web".into(),
            namespace: "default".into(),
            node_id: "n1".into(),
            datacenter: "dc1".into(),
            job_id: "web".into(),
            alloc_id: alloc.into(),
            tags: vec![],
            address: "127.0.0.1".into(),
            port: 8080,
            health: ServiceHealth::Passing,
            checks: vec![],
            create_index: 1,
            modify_index: 1,
        }
    }

    #[test]
    fn followers_apply_service_keys_and_the_index_by_name_follows() {
        let change = StoreChange {
            revision: Some(2),
            puts: vec![KeyValue {
                key: "service/s1".into(),
                value: serde_json::to_vec(&reg("s1", "a1")).unwrap(),
                create_revision: 2,
                mod_revision: 2,
            }],
            deletes: vec![],
        };
        let mut st = State::default();
        st.apply(Batch::from_change(&change).unwrap(), 2);
        assert_eq!(st.service_instances("web").count(), 1);
        assert_eq!(st.services_of_alloc("a1").count(), 1);
        let change = StoreChange {
            revision: Some(3),
            puts: vec![],
            deletes: vec!["service/s1".into()],
        };
        st.apply(Batch::from_change(&change).unwrap(), 3);
        assert_eq!(st.service_instances("web").count(), 0);
        assert_eq!(st.service_names().count(), 0);
        assert_eq!(st.services_of_alloc("a1").count(), 0);
    }

    #[test]
    fn a_deleted_allocation_takes_its_registrations_with_it() {
        let mut st = State::default();
        st.apply(
            Batch {
                services: vec![reg("s1", "a1"), reg("s2", "a2")],
                ..Batch::default()
            },
            1,
        );
        let mut b = Batch {
            drop_allocs: vec!["a1".into()],
            ..Batch::default()
        };
        drop_ended(&st, &mut b);
        assert_eq!(b.drop_services, ["s1"]);
    }
}
