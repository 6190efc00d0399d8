//! Life as a system service, shared by `drover agent` and `drover server`: systemd's
//! `sd_notify` protocol (readiness, status, watchdog, reload and stop notices; each a
//! no-op when `NOTIFY_SOCKET` is unset) and logging whose filter SIGHUP can change.
//!
//! `NOTIFY_SOCKET` stays in the environment (every notice reads it), and that is safe:
//! plugins, executors and tasks are started with a cleared environment (only listed
//! variables pass), and the units say `NotifyAccess=main`, so systemd ignores any
//! notice that does not come from the daemon's own pid.

use std::time::Duration;

use sd_notify::NotifyState;
use tracing_subscriber::EnvFilter;

/// Send `states` to the service manager, if there is one. A failed send is logged,
/// never fatal: the daemon serves whether or not systemd hears about it.
pub fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("cannot notify the service manager (NOTIFY_SOCKET): {e}");
    }
}

/// READY=1 with a STATUS line.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// RELOADING=1: a SIGHUP is being handled; [`ready`] follows.
pub fn reloading() {
    notify(&[
        NotifyState::Reloading,
        NotifyState::Status("reloading the configuration"),
    ]);
}

/// STOPPING=1.
pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// When the service manager asked for a watchdog (`WatchdogSec=`: `WATCHDOG_USEC`, and
/// `WATCHDOG_PID` naming this process if set), a task on the current runtime that
/// sends WATCHDOG=1 at half the period. It runs on the daemon's own runtime on purpose:
/// a runtime that stops scheduling (a blocked thread of the agent's single-threaded
/// runtime, a deadlock) stops the keep-alives, and systemd restarts the unit.
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let period = watchdog_period(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )?;
    tracing::debug!(
        period_ms = period.as_millis() as u64,
        "systemd watchdog enabled"
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        // A late tick (a busy moment) is sent once, not in a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            notify(&[NotifyState::Watchdog]);
        }
    }))
}

/// The keep-alive period (half the watchdog timeout), as sd_watchdog_enabled(3) reads
/// the variables: `WATCHDOG_USEC` a positive number; `WATCHDOG_PID`, when set, this
/// process. (sd-notify's `watchdog_enabled` also requires `WATCHDOG_PID`, which
/// systemd always sets but the man page makes optional.)
fn watchdog_period(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    Some(Duration::from_micros(usec) / 2)
}

/// Changes the log filter of the running process (SIGHUP).
pub struct LogReload(Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>);

impl LogReload {
    /// Apply `level` (an `EnvFilter` directive such as `info` or `drover=debug`),
    /// unless `RUST_LOG` is set: it wins over the config at start, and still does. A
    /// bad directive is logged and the current filter kept.
    pub fn apply(&self, level: &str) {
        if let Some(env) = rust_log() {
            tracing::info!(
                rust_log = %env,
                "RUST_LOG is set and wins over log_level: the log filter is unchanged"
            );
            return;
        }
        match EnvFilter::try_new(level) {
            Ok(filter) => match (self.0)(filter) {
                Ok(()) => tracing::info!(log_level = %level, "log filter changed"),
                Err(e) => tracing::error!("cannot change the log filter: {e}"),
            },
            Err(e) => tracing::error!(
                log_level = %level,
                "log_level is not a valid log filter ({e}); keeping the current one"
            ),
        }
    }
}

/// `RUST_LOG`, when set to something (`RUST_LOG=` in a unit file means unset).
fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Log to stderr (the journal, under systemd) with the filter `RUST_LOG`, else `level`,
/// else `info`; colours only on a terminal, so that journald and log files get plain
/// text. Returns the handle SIGHUP changes the filter with.
pub fn init_logging(level: &str, json: bool) -> LogReload {
    let filter = rust_log()
        .and_then(|env| EnvFilter::try_new(env).ok())
        .or_else(|| EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        let builder = builder.json().with_filter_reloading();
        let handle = builder.reload_handle();
        builder.init();
        LogReload(Box::new(move |f| {
            handle.reload(f).map_err(|e| e.to_string())
        }))
    } else {
        let builder = builder.with_filter_reloading();
        let handle = builder.reload_handle();
        builder.init();
        LogReload(Box::new(move |f| {
            handle.reload(f).map_err(|e| e.to_string())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_is_on_for_this_process_only_with_a_positive_timeout() {
        let half = Some(Duration::from_millis(500));
        assert_eq!(watchdog_period(Some("1000000"), None, 7), half);
        assert_eq!(watchdog_period(Some("1000000"), Some("7"), 7), half);
        assert_eq!(watchdog_period(Some("1000000"), Some("8"), 7), None);
        assert_eq!(watchdog_period(Some("0"), None, 7), None);
        assert_eq!(watchdog_period(Some("soon"), None, 7), None);
        assert_eq!(watchdog_period(None, Some("7"), 7), None);
    }
}
