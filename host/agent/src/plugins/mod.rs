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
//! - [`candidate`]: what may become a plugin (a file in `plugin_dir`, a built-in), and
//!   the status row of one that does not serve.
//! - [`trust`]: whether a candidate's file may run: the checks on its open
//!   descriptor, its sha256, and the operator's policy (allow, deny, pins).
//! - [`loader`]: scanning `plugin_dir`, launching and fingerprinting candidates.
//! - [`library`]: loading a driver library into the agent, from a sealed copy.
//! - [`instance`]: one running plugin, a process or a loaded library.
//! - [`catalog`]: the registry: which plugin serves which name, status rows, plugin
//!   records; the [`catalog::TaskHandover`] seam to the task manager.
//! - `recover`: start-up ([`catalog::Catalog::load`]): reattach to the processes an
//!   earlier agent left, launch the rest, pick one per name, sweep stray sockets.
//! - `supervise`: every launch under the policy, and the supervisor that follows a
//!   plugin's fingerprints and relaunches its process when it dies.
//! - `reload`: adding, upgrading and removing plugins while the agent runs
//!   ([`catalog::Catalog::reload`]); its `upgrade` replaces a serving instance with a
//!   new one and hands the running tasks over, or rolls back.
//! - [`watch`]: watching `plugin_dir`, so that a change starts a reload.
//!
//! Dependencies go one way: `recover` and `reload` use `supervise`, and all three use
//! the catalog's types; the catalog calls none of them.

pub mod candidate;
pub mod catalog;
pub mod instance;
pub mod library;
pub mod loader;
mod recover;
mod reload;
mod supervise;
pub mod trust;
pub mod watch;
