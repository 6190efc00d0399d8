//! A run request checked and turned into what the task manager keeps: the task's
//! settings (kill signal and timeout, restart policy) and its resource and log limits.

use std::time::Duration;

use drover_api::{MAX_KILL_TIMEOUT, RunRequest};
use drover_plugin_sdk::{DriverError, LogConfig, Resources};

use super::DEFAULT_KILL_TIMEOUT;
use super::restart::{Policy, human};

/// The per-task settings derived from its request.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) kill_signal: String,
    pub(super) kill_timeout: Duration,
    pub(super) policy: Policy,
}

impl Settings {
    pub(super) fn from_request(req: &RunRequest) -> Result<Settings, DriverError> {
        let kill_signal = req.kill_signal.clone().unwrap_or_else(|| "SIGTERM".into());
        // Checked now; kept as written, for events, and parsed again for each stop.
        drover_plugin_sdk::Signal::parse_or_default(&kill_signal)?;
        // A request read from JSON was checked while it was parsed, with the text
        // the user wrote; one built in code is checked here.
        let kill_timeout = req.kill_timeout.unwrap_or(DEFAULT_KILL_TIMEOUT);
        if kill_timeout > MAX_KILL_TIMEOUT {
            return Err(DriverError::InvalidConfig(format!(
                "kill_timeout {:?} is longer than the maximum of {}",
                human(kill_timeout),
                human(MAX_KILL_TIMEOUT)
            )));
        }
        let policy = match &req.restart {
            Some(p) => Policy::parse(p)?,
            None => Policy::default(),
        };
        Ok(Settings {
            kill_signal,
            kill_timeout,
            policy,
        })
    }
}

/// Resource and log limits from the request, checked.
pub(super) fn limits(req: &RunRequest) -> Result<(Resources, LogConfig), DriverError> {
    let r = req.resources.unwrap_or_default();
    let r = Resources::default()
        .with_cpu_shares(r.cpu_shares)
        .with_memory_mb(r.memory_mb)
        .with_memory_max_mb(r.memory_max_mb);
    for (field, value) in [
        ("cpu_shares", r.cpu_shares),
        ("memory_mb", r.memory_mb),
        ("memory_max_mb", r.memory_max_mb),
    ] {
        if value < 0 {
            return Err(DriverError::InvalidConfig(format!(
                "resources.{field} must not be negative (got {value})"
            )));
        }
    }
    if r.memory_max_mb != 0 && r.memory_max_mb < r.memory_mb {
        return Err(DriverError::InvalidConfig(format!(
            "resources.memory_max_mb ({}) must not be below resources.memory_mb ({})",
            r.memory_max_mb, r.memory_mb
        )));
    }
    let l = req.logs.unwrap_or_default();
    l.check().map_err(DriverError::InvalidConfig)?;
    Ok((r, LogConfig::new(l.max_files, l.max_file_size_mb)))
}
