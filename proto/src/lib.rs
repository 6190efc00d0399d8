//! Generated gRPC code for the Drover plugin protocol.
//!
//! - [`drover::plugin::v1`]: Drover's own `BasePlugin` and `Driver` services.
//! - [`drover::cluster::v1`]: the cluster protocol between client agents and servers.
//! - [`etcd`]: etcd's v3 API (KV, Watch, Lease, Maintenance, Election), trimmed.
//! - [`goplugin`]: HashiCorp go-plugin's `plugin` package (`GRPCController`,
//!   `GRPCStdio`, `GRPCBroker`), byte-for-byte wire compatible.
//!
//! The `.proto` files under `proto/` are the contract; read their comments for the
//! semantics each RPC MUST follow.
#![allow(missing_docs)]

/// Drover's own packages.
pub mod drover {
    /// `drover.plugin.*`
    pub mod plugin {
        /// `drover.plugin.v1`: BasePlugin and Driver.
        pub mod v1 {
            tonic::include_proto!("drover.plugin.v1");
        }
    }
    /// `drover.cluster.*`
    pub mod cluster {
        /// `drover.cluster.v1`: client agents and servers.
        pub mod v1 {
            tonic::include_proto!("drover.cluster.v1");
        }
    }
}

/// etcd's v3 API as the server's etcd store uses it: trimmed copies of etcd's own
/// `.proto` files (same packages, names and field numbers), so these speak etcd's wire
/// protocol; fields we do not use are left out and skipped on decode.
pub mod etcd {
    /// `mvccpb`: keys and watch events.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// `etcdserverpb`: the KV, Watch, Lease and Maintenance services.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    /// `v3electionpb`: the Election service.
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}

/// HashiCorp go-plugin's internal `plugin` package.
pub mod goplugin {
    tonic::include_proto!("plugin");
}

pub use drover::plugin::v1;

/// Encoded `FileDescriptorSet` of every Drover proto (for reflection or grpcurl).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/drover_descriptor.bin"));

pub use prost_types;
