//! Integration tests on a real etcd: the etcd store (its semantics, TLS, watches, a
//! three-member cluster), leadership on it, and several servers sharing one etcd.
//! One test binary for the area, so that it is linked once; each file is a module.
//!
//! Tests that only read and write share the etcd of `DROVER_TEST_ETCD_ENDPOINT` (or one
//! started for them), each under a key prefix of its own; tests that kill, pause or
//! compact etcd start a private one. Without an etcd binary they skip loudly (and fail
//! under `CI=true`).

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod election;
mod ha_cluster;
mod store;
mod tls;
mod watch;
