//! # drover-driver-exec
//!
//! The `exec` task driver: runs a command as a process contained for real, without a
//! container image. It is the [`drover_isolation::IsolatedDriver`] engine with the
//! [`Exec`] flavor: the sandbox (namespaces, a `pivot_root` into a root bound from
//! host paths, a cgroup, capabilities, a user, rlimits) lives in `drover-isolation`;
//! this crate adds the task configuration, a command and its arguments.
//!
//! ```no_run
//! drover_plugin_sdk::serve(drover_driver_exec::ExecDriver::new())
//! ```
#![warn(missing_docs)]

mod config;
mod driver;

pub use config::TaskConfig;
pub use driver::{Exec, ExecDriver, PLUGIN_NAME, PLUGIN_VERSION};
