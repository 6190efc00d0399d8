//! # drover-driver-rawexec
//!
//! The `rawexec` task driver: runs a task as a plain process on the host, with no
//! isolation, as the plugin's own user. Each task is the leader of its own process
//! group, which signals go to, and, where the host has cgroups, in a cgroup of its own
//! that stop and destroy empty, so that they reach everything it started (`setsid` or
//! not). A task whose executor dies is killed (proven by its cgroup, or pidfd and start
//! time) before its end is reported, so it is never restarted beside a running copy.
//!
//! The crate is a library (so the `drover` binary can link it and re-execute itself as
//! the driver) plus a `main.rs` of one line:
//!
//! ```no_run
//! // Tasks are owned by executors, which are this binary re-executed.
//! drover_executor::run_if_executor(None);
//! drover_plugin_sdk::serve(drover_driver_rawexec::RawExecDriver::new())
//! ```
//!
//! Built as a shared library too (`libdrover_driver_rawexec.so`), it loads into an
//! agent in process (`[plugin.rawexec] in_process = true`); its executors are then the
//! agent binary re-executed.
//!
//! Layout: [`driver`](RawExecDriver) (the trait impl and constants, over the shared
//! engine of plain executor tasks, `drover_executor::plain`), `config` (plugin and
//! task config, and the default `PATH` a task's environment starts from).
#![warn(missing_docs)]

mod config;
mod driver;

pub use config::{DEFAULT_PATH, PluginConfig, TaskConfig};
pub use driver::{DISABLED, HANDLE_VERSION, PLUGIN_NAME, PLUGIN_VERSION, RawExecDriver};

drover_plugin_sdk::export_driver!(RawExecDriver::new);
