//! # drover-host
//!
//! The Drover agent as a library: configuration, the plugin lifecycle (`plugins/`:
//! loader, catalog, supervision, live reload), the task manager and the HTTP API. The
//! `drover` binary wires these to a CLI and links
//! the built-in drivers; this library never names a driver.

pub mod agent;
pub mod allocs;
pub mod api;
mod client_api;
pub mod cluster;
pub mod config;
pub mod csi;
pub mod dirs;
pub mod limits;
pub mod logs;
mod metrics;
pub mod network;
pub mod plugins;
pub mod private_file;
pub mod services;
pub mod state;
pub mod taskenv;
pub mod tasks;
pub mod volumes;

pub use agent::run;
pub use config::AgentConfig;
