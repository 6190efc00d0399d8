//! End-to-end tests of the agent and its tasks: the CLI and API a user drives, restart
//! policies, recovery after a kill, allocations, task directories and logs, the agent's
//! own bounds, directories and state file. One test binary for the area, so that CI
//! links it once; each file is a module.

#[path = "../common/mod.rs"]
mod common;

mod agent_bounds;
mod agent_dirs;
mod allocs;
mod cli_logs;
mod cli_rawexec;
mod cli_tasks;
mod client_fs;
mod fault_agent_kill;
mod rawexec_one_copy;
mod state_corrupt;
mod task_dir_modes;
mod task_log_bound;
mod tasks_recover;
mod tasks_restart;
