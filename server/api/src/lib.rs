//! # drover-server-api
//!
//! What the Drover server and the cluster commands of the CLI exchange: jobs (as
//! submitted and as stored), nodes, allocations and evaluations, in the JSON shape of
//! the server's HTTP API (`/v1/jobs`, `/v1/nodes`, ...). The same types travel inside
//! the node RPCs (as JSON payloads) and are kept by the server's state store.
//!
//! Every object the server stores carries `create_index` and `modify_index`: the state
//! store's revision at which it was created and last changed. The revision is global and
//! only grows, so a blocking query `?index=N` waits until something newer than `N` was
//! committed.
//!
//! [`jobfile`] reads the TOML job files of `drover job run` (errors name the file, line
//! and field); [`validate()`] checks a job spec the way the server does before it
//! accepts one.

pub mod acl;
#[cfg(feature = "client")]
pub mod client;
pub mod client_fs;
#[cfg(feature = "client")]
pub mod client_vars;
pub mod csi;
pub mod devices;
pub mod exec;
pub mod hcl;
pub mod jobfile;
pub mod namespaces;
pub mod nomad;
pub mod services;
pub mod taskfiles;
pub mod types;
pub mod validate;
pub mod variables;
pub mod volumes;

pub use devices::{AllocatedDevices, DeviceRequest, NodeDeviceGroup, NodeDeviceInstance};
pub use jobfile::{JobFile, JobFileError};
pub use namespaces::{DEFAULT_NAMESPACE, Namespace, default_namespace};
pub use services::*;
pub use types::*;
pub use validate::{ValidationError, validate};
pub use volumes::{HostVolume, VolumeMount, VolumeRequest};
