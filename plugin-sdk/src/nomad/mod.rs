//! Nomad's plugin protocol from Drover's side: what both a Drover host loading a Nomad
//! plugin and a Drover plugin served to a Nomad host need.
//!
//! - [`hclspec`]: Nomad's config specs, their JSON Schema, and configs as msgpack.

pub mod hclspec;
