//! The agent itself: `GET /v1/agent/health`.

use std::time::Duration;

use serde::Serialize;

/// How start-up task recovery went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoverySummary {
    /// Tasks that were pending or running when the agent last stopped.
    pub tasks: usize,
    /// Handed back to their driver (running, or exited meanwhile and being reported).
    pub recovered: usize,
    /// Never started by the driver before the agent stopped, started now.
    pub started: usize,
    /// Dead after recovery: lost by the driver, or stopped.
    pub dead: usize,
    /// Waiting for their driver to come back; recovered when it does.
    pub waiting: usize,
    /// Wall time until every task got one of the outcomes above.
    #[serde(rename = "elapsed_ms", serialize_with = "millis")]
    pub elapsed: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
