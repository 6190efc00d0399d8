//! End-to-end tests of the cluster: `drover server`, agents that join it, the cluster
//! CLI, `--dev`, several servers on etcd. One test binary for the area, so that CI links
//! it once; each file is a module.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod agent_cluster;
mod alloc_health;
mod artifacts;
mod cluster;
mod cluster_cli;
mod cluster_dev;
mod cluster_ha;
mod cluster_join;
mod cluster_ports;
mod csi;
mod deployments;
mod device_nodes;
mod devices;
mod exec;
mod metrics;
mod rollouts;
mod server_names;
mod services;
mod ui;
mod variables;
mod volumes;

mod templates;
