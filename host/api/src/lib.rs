//! # drover-api
//!
//! The Drover agent's JSON HTTP API, shared by the agent that serves it and the
//! clients that call it: the request and response types, and the framing of the log
//! stream.

mod agent;
mod logs;
mod plugins;
mod tasks;

pub use agent::RecoverySummary;
pub use logs::{Frame, FrameDecoder, FrameError, LOG_FRAMES_CONTENT_TYPE, skipped_notice};
pub use plugins::{PluginSource, PluginState, PluginStatus};
pub use tasks::{
    DestroyQuery, LogConfig, LogStream, LogsQuery, Resources, RestartMode, RestartPolicy,
    RunRequest, SignalRequest, StatsQuery, StatsView, StopRequest, TaskEventView, TaskLifecycle,
    TaskView,
};
