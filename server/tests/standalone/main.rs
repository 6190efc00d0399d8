//! Integration tests of one server on a store of its own (the embedded redb store, or
//! the store in memory): the store, the server core, what keeps its state bounded, node
//! identity, the node RPCs and the HTTP API over real listeners on 127.0.0.1.
//! One test binary for the area, so that it is linked once; each file is a module.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod deployments;
mod growth;
mod http;
mod node_auth;
mod ports;
mod rpc;
mod server;
mod services;
mod store;
