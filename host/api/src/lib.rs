//! # drover-api
//!
//! The Drover agent's JSON HTTP API, shared by the agent that serves it (`drover-host`)
//! and everything that calls it (the `drover` CLI, the benchmarks, the end-to-end
//! tests, your own tools):
//!
//! - the request and response types, with the agent's JSON field names: tasks
//!   ([`RunRequest`], [`TaskView`], [`StopRequest`], [`StatsView`], ...), plugins
//!   ([`PluginStatus`]), the agent ([`AgentHealth`]) and errors ([`ErrorBody`]);
//!   durations are [`Duration`](std::time::Duration)s written as text (`"30s"`), closed
//!   sets are enums;
//! - the framing of the log stream ([`Frame`], [`FrameDecoder`]);
//! - [`Client`], an async client over the agent's unix socket with one typed method per
//!   endpoint, and its [`Error`];
//! - [`taskfile`]: the TOML task files of `drover task run`, read into a [`RunRequest`]
//!   (errors name the file, line and field), with [`tomlfile`], the helpers it shares
//!   with the job files of `drover job run` (`drover_server_api::jobfile`).
//!
//! The endpoints (under `<data_dir>/api.sock`):
//!
//! | method and path | [`Client`] method |
//! |---|---|
//! | `GET /v1/agent/health` | [`Client::health`] |
//! | `GET /v1/plugins` | [`Client::plugins`] |
//! | `POST /v1/plugins/reload` | [`Client::reload_plugins`] |
//! | `GET /v1/tasks` | [`Client::list_tasks`] |
//! | `POST /v1/tasks` | [`Client::run_task`] |
//! | `GET /v1/tasks/{id}` | [`Client::get_task`] |
//! | `DELETE /v1/tasks/{id}` | [`Client::destroy_task`] |
//! | `GET /v1/tasks/{id}/wait` | [`Client::wait_task`] |
//! | `POST /v1/tasks/{id}/stop` | [`Client::stop_task`] |
//! | `POST /v1/tasks/{id}/signal` | [`Client::signal_task`] |
//! | `GET /v1/tasks/{id}/events` | [`Client::task_events`] |
//! | `GET /v1/tasks/{id}/stats` | [`Client::task_stats`], [`Client::follow_task_stats`] |
//! | `GET /v1/tasks/{id}/logs` | [`Client::task_logs`] |
//!
//! `{id}` is one path segment, percent-encoded ([`encode_path_segment`]).
//!
//! ```no_run
//! # async fn example() -> Result<(), drover_api::Error> {
//! let client = drover_api::Client::new("/var/lib/drover/api.sock");
//! for task in client.list_tasks().await? {
//!     println!("{} {} {}", task.id, task.name, task.state);
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod agent;
mod client;
mod duration;
mod error;
mod logs;
mod path;
mod plugins;
pub mod taskfile;
mod tasks;
pub mod tomlfile;

pub use agent::{AgentHealth, ErrorBody, HealthStatus, RecoverySummary};
pub use client::{Client, LogFrames, LogsOptions, RawResponse, StatsStream};
pub use duration::{MAX_KILL_TIMEOUT, MAX_RESTART_DURATION, human_duration};
pub use error::Error;
pub use http::StatusCode;
pub use logs::{Frame, FrameDecoder, FrameError, LOG_FRAMES_CONTENT_TYPE, skipped_notice};
pub use path::encode_path_segment;
pub use plugins::{
    DRIVER_ALIASES, PluginChange, PluginChangeKind, PluginKind, PluginProtocol, PluginSource,
    PluginState, PluginStatus, ReloadReport, canonical_driver_name,
};
pub use tasks::{
    DestroyQuery, Destroyed, LogConfig, LogStream, LogsQuery, MAX_LOG_MB_PER_STREAM, Resources,
    RestartMode, RestartPolicy, RunRequest, SignalRequest, StatsQuery, StatsView, StopRequest,
    TaskEventKind, TaskEventView, TaskLifecycle, TaskView,
};
