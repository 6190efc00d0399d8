//! `drover plugin`: the agent's plugins (`status`, `reload`), and `plugin serve`, the
//! agent's way of running a built-in driver as a plugin.

use std::process::ExitCode;

use clap::Subcommand;

use super::api_error;
use crate::render;

use crate::BUILTINS;

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Show every plugin binary the agent saw and its state.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Look at plugin_dir now: add new plugins, upgrade to newer ones, retire removed
    /// ones, without restarting the agent (it does this by itself unless
    /// `watch_plugin_dir = false`). Prints what changed.
    Reload {
        /// Print JSON (the changes and every plugin row).
        #[arg(long)]
        json: bool,
    },
    /// Serve a built-in driver as a plugin (the agent runs this; not for people).
    #[command(hide = true)]
    Serve {
        /// Built-in driver name.
        name: String,
    },
}

pub fn serve_builtin(name: &str) -> ExitCode {
    let name = drover_api::canonical_driver_name(name);
    match BUILTINS.iter().find(|(n, _)| *n == name) {
        Some((_, serve)) => serve(),
        None => {
            let names: Vec<_> = BUILTINS.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "no built-in driver named {name:?}; built-ins: {}",
                names.join(", ")
            );
            ExitCode::from(2)
        }
    }
}

/// `plugin status`: every plugin binary the agent saw and its state.
pub async fn status(c: drover_api::Client, json: bool) -> anyhow::Result<ExitCode> {
    let rows = c.plugins().await.map_err(api_error)?;
    render::print_plugins(&rows, json)?;
    Ok(ExitCode::SUCCESS)
}

/// `plugin reload`: what changed in plugin_dir.
pub async fn reload(c: drover_api::Client, json: bool) -> anyhow::Result<ExitCode> {
    let report = c.reload_plugins().await.map_err(api_error)?;
    render::print_reload(&report, json)?;
    Ok(ExitCode::SUCCESS)
}
