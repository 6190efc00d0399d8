//! End-to-end tests of plugins: loading and refusing them (plugin_dir, trust, in-process
//! driver libraries), their processes and environment, reattaching to them, hot upgrades.
//! One test binary for the area, so that CI links it once; each file is a module.
//!
//! The bound on the driver libraries one process keeps (`inproc_retained.rs`) is tested
//! in a binary of its own: the loader keeps every library it mapped for the life of the
//! process, and the tests here map some.

#[path = "../common/mod.rs"]
mod common;

mod executor_binary;
mod hot_inproc;
mod hot_upgrade;
mod inproc_contained;
mod inproc_loader;
mod inproc_rawexec;
mod plugin_env;
mod plugin_orphan;
mod plugin_process;
mod plugin_trust;
mod plugin_zoo;
mod reattach_agent;
mod reattach_process;
