//! The plugin lifecycle: how a driver plugin comes to serve, keeps serving, and is
//! replaced or leaves, while the agent runs and across its restarts.
//!
//! A plugin is a file in `plugin_dir` (an executable, or a driver library loaded into
//! the agent) or a built-in driver (the agent's own binary re-executed). At start every
//! candidate is checked, launched (or its still-running process from the last agent
//! taken over) and fingerprinted, one plugin is picked per name, configured and
//! supervised; later, changes in `plugin_dir` add, upgrade and remove plugins without a
//! restart, handing running tasks from an old instance to a new one.
//!
//! - [`loader`]: finding candidates, checking their files and the operator's policy,
//!   launching and fingerprinting them; [`loader::library`] loads a driver library
//!   into the agent.
//! - [`instance`]: one running plugin, a process or a loaded library.
//! - [`catalog`]: the plugins that serve, by name, with their status rows; start-up
//!   (reattach, launch, pick, sweep) and the supervisor that relaunches a dead plugin;
//!   `catalog/reload.rs` adds, upgrades and removes plugins while the agent runs.
//! - [`watch`]: watching `plugin_dir`, so that a change starts a reload.

pub mod catalog;
pub mod instance;
pub mod loader;
pub mod watch;
