//! # drover-api
//!
//! The Drover agent's JSON HTTP API, shared by the agent that serves it and the
//! clients that call it: the request and response types, and the framing of the log
//! stream.

mod agent;
mod client;
mod duration;
mod error;
mod logs;
mod path;
mod plugins;
mod tasks;

pub use agent::{AgentHealth, ErrorBody, HealthStatus, RecoverySummary};
pub use client::{Client, LogFrames, LogsOptions, RawResponse, StatsStream};
pub use duration::{MAX_KILL_TIMEOUT, MAX_RESTART_DURATION, human_duration};
pub use error::Error;
pub use http::StatusCode;
pub use logs::{Frame, FrameDecoder, FrameError, LOG_FRAMES_CONTENT_TYPE, skipped_notice};
pub use path::encode_path_segment;
pub use plugins::{PluginKind, PluginSource, PluginState, PluginStatus};
pub use tasks::{
    DestroyQuery, Destroyed, LogConfig, LogStream, LogsQuery, Resources, RestartMode,
    RestartPolicy, RunRequest, SignalRequest, StatsQuery, StatsView, StopRequest, TaskEventKind,
    TaskEventView, TaskLifecycle, TaskView,
};
