//! The agent itself: `GET /v1/agent/health`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// How start-up task recovery went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    #[serde(
        rename = "elapsed_ms",
        serialize_with = "millis",
        deserialize_with = "from_millis"
    )]
    pub elapsed: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn from_millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// Whether the agent answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// It does (the only answer an agent gives; one that does not answers nothing).
    #[default]
    Ok,
}

/// The answer to `GET /v1/agent/health`: liveness, plus whether start-up task
/// recovery has finished — what an operator or a script waits for after an agent
/// restart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHealth {
    /// Always `ok`.
    pub status: HealthStatus,
    /// How start-up recovery went; `None` (null) until it has finished.
    pub recovery: Option<RecoverySummary>,
}

/// The body of every error answer of the API: `{"error": "..."}`, with a 4xx or 5xx
/// status. A stream (stats with `follow`) that fails after it began sends it as its
/// last line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for people.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reads_and_writes_the_agents_json_unchanged() {
        for text in [
            r#"{"status":"ok","recovery":null}"#,
            r#"{"status":"ok","recovery":{"tasks":3,"recovered":1,"started":1,"dead":1,"waiting":0,"elapsed_ms":12}}"#,
        ] {
            let health: AgentHealth = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&health).unwrap(), text);
        }
        let health: AgentHealth = serde_json::from_str(
            r#"{"status":"ok","recovery":{"tasks":0,"recovered":0,"started":0,"dead":0,"waiting":0,"elapsed_ms":1500}}"#,
        )
        .unwrap();
        assert_eq!(
            health.recovery.map(|r| r.elapsed),
            Some(Duration::from_millis(1500))
        );
    }
}
