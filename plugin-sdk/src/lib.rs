//! # drover-plugin-sdk
//!
//! Write a Drover task driver as one trait impl, serve it as a plugin process that any
//! Drover agent (or HashiCorp go-plugin host using the same cookie) can launch, and
//! connect to plugins from the host side.
//!
//! - Plugin authors: implement [`DriverPlugin`] and call [`serve`] from `main`. See
//!   `examples/skeleton-driver` in the Drover repository for a complete driver to copy.
//! - Drivers whose tasks must outlive the plugin (rawexec, exec, java, qemu) start them
//!   through a per-task executor: the `drover-executor` crate (`plugins/shared/executor`
//!   in the Drover repository).
//! - The same binary also loads in a HashiCorp Nomad agent's `plugin_dir`: started with
//!   Nomad's cookie, [`serve`] speaks Nomad's driver protocol (see [`server`] and the
//!   author's guide, "Your driver in a Nomad agent").
//! - The same driver can also be built as a shared library that a host loads in
//!   process: `crate-type = ["rlib", "cdylib"]` and [`export_driver!`] in its `lib.rs`
//!   (see [`inproc`]).
//! - A plugin is launched at every agent start and after every crash: link its binary
//!   static-pie for the fastest launch (no dynamic loader to map and bind libc, libm
//!   and libgcc_s): `cargo rustc --release --bin my-driver -- -C target-feature=+crt-static`.
//!   Measured on Drover's rawexec (`drover-bench handshake`): launch, handshake and
//!   first RPCs in 1.11 ms against 1.83-2.07 ms linked dynamically. A statically linked
//!   glibc still loads NSS modules at run time (user and host name lookups), which must
//!   match the glibc it was linked with: keep a driver that looks names up dynamically
//!   linked. Drover's `scripts/build-plugins.sh` links its own plugins so.
//! - Hosts and tests (feature `launcher`, which `testing` includes): `client::PluginProcess::launch`
//!   starts a plugin binary, `client::InProcessPlugin::load` loads a driver library,
//!   and both give a typed `client::PluginClient`. A plugin never compiles this side.
//!
//! The wire protocol (go-plugin's handshake plus `drover.plugin.v1`) is described in
//! the `.proto` files of [`drover_proto`], re-exported here so versions never skew.
#![warn(missing_docs)]

#[cfg(feature = "launcher")]
pub mod client;
pub mod device;
pub mod driver;
pub mod error;
pub mod exec;
pub mod handshake;
pub mod inproc;
pub mod logging;
pub mod logs;
pub mod nomad;
pub mod server;
pub mod signal;
pub mod store;
pub mod taskdir;
#[cfg(feature = "testing")]
pub mod testing;
mod transport;
pub mod types;
pub mod version;

pub use driver::{DriverPlugin, EmptyConfig};
pub use error::DriverError;
pub use server::{serve, serve_device};
pub use signal::{ParseSignalError, Signal};
pub use types::*;

pub use drover_proto as proto;
pub use schemars;
pub use serde;
pub use serde_json;
pub use tokio;
pub use tracing;
