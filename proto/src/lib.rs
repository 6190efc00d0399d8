//! Generated gRPC code for the Drover plugin protocol.
//!
//! - [`drover::plugin::v1`]: Drover's own `BasePlugin` and `Driver` services.
//! - [`drover::cluster::v1`]: the cluster protocol between client agents and servers.
//! - [`etcd`]: etcd's v3 API (KV, Watch, Lease, Maintenance, Election), trimmed.
//! - [`nomad`]: Nomad's plugin protocol (`hashicorp.nomad.plugins.*`: BasePlugin,
//!   Driver, hclspec, structs), for Nomad drivers and for serving Nomad agents.
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

/// The CSI spec's `csi.v1` package (Identity, Controller, Node), trimmed to what Drover
/// sends and reads as a container orchestrator: our own `.proto` with the spec's names
/// and field numbers.
pub mod csi {
    /// `csi.v1`
    pub mod v1 {
        tonic::include_proto!("csi.v1");
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

/// Nomad's plugin packages, nested as their names are (`hashicorp.nomad.plugins.*`),
/// which the generated code's cross-package paths need. Use them through [`nomad`].
pub mod hashicorp {
    /// `hashicorp.nomad`
    pub mod nomad {
        /// `hashicorp.nomad.plugins`
        pub mod plugins {
            /// `hashicorp.nomad.plugins.base`
            pub mod base {
                /// `hashicorp.nomad.plugins.base.proto`: BasePlugin.
                pub mod proto {
                    tonic::include_proto!("hashicorp.nomad.plugins.base.proto");
                }
            }
            /// `hashicorp.nomad.plugins.drivers`
            pub mod drivers {
                /// `hashicorp.nomad.plugins.drivers.proto`: Driver.
                pub mod proto {
                    tonic::include_proto!("hashicorp.nomad.plugins.drivers.proto");
                }
            }
            /// `hashicorp.nomad.plugins.device`: DevicePlugin.
            pub mod device {
                tonic::include_proto!("hashicorp.nomad.plugins.device");
            }
            /// `hashicorp.nomad.plugins.shared`
            pub mod shared {
                /// `hashicorp.nomad.plugins.shared.hclspec`: config specs.
                pub mod hclspec {
                    tonic::include_proto!("hashicorp.nomad.plugins.shared.hclspec");
                }
                /// `hashicorp.nomad.plugins.shared.structs`: attributes, stats,
                /// recoverable errors.
                pub mod structs {
                    tonic::include_proto!("hashicorp.nomad.plugins.shared.structs");
                }
            }
        }
    }
}

/// Nomad's plugin protocol: our own copies of Nomad's `.proto` files with its packages,
/// names and field numbers, so a Drover agent loads Nomad's task drivers and a Nomad
/// agent loads drivers built on Drover's SDK.
pub mod nomad {
    pub use crate::hashicorp::nomad::plugins::base::proto as base;
    pub use crate::hashicorp::nomad::plugins::device;
    pub use crate::hashicorp::nomad::plugins::drivers::proto as drivers;
    pub use crate::hashicorp::nomad::plugins::shared::{hclspec, structs};
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
