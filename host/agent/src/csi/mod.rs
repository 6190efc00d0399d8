//! CSI: Drover as a container orchestrator of the Container Storage Interface.
//!
//! - [`client`]: the spec's Identity, Controller and Node calls over a plugin's socket.
//! - [`controller`]: the controller calls (`volume create|delete`) the servers queue.
//! - [`mounts`]: NodeStage and NodePublish of allocations' volumes, and the reverse.
//! - [`plugins`]: the plugins of the agent's config (`[csi_plugin.ID]`), launched,
//!   supervised and fingerprinted by the agent.

pub mod client;
pub mod controller;
pub mod mounts;
pub mod plugins;

pub use client::{Capability, CsiClient, CsiError};
