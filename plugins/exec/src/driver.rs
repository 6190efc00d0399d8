//! The exec driver: [`IsolatedDriver`] running the task config's command.

use drover_plugin_sdk::DriverError;

use drover_isolation::IsolationConfig;

use crate::config::TaskConfig;
use drover_isolation::{CommandLine, Flavor, IsolatedDriver, TaskContext};

/// The driver's name.
pub const PLUGIN_NAME: &str = "exec";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What makes exec exec: a command and its arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct Exec;

impl Flavor for Exec {
    type TaskConfig = TaskConfig;
    const NAME: &'static str = PLUGIN_NAME;
    const VERSION: &'static str = PLUGIN_VERSION;

    fn isolation(&self, config: &TaskConfig) -> IsolationConfig {
        config.isolation()
    }

    fn command(
        &self,
        task: &TaskContext<'_>,
        config: &TaskConfig,
    ) -> Result<CommandLine, DriverError> {
        if config.command.trim().is_empty() {
            return Err(DriverError::InvalidConfig(
                "command must not be empty".into(),
            ));
        }
        // Refused here, naming the command, rather than by the executor after the
        // cgroup and the root were made.
        task.root
            .find_command(&config.command, task.cwd, task.path)?;
        Ok(CommandLine {
            program: config.command.clone(),
            args: config.args.clone(),
        })
    }
}

/// The exec driver.
pub type ExecDriver = IsolatedDriver<Exec>;
