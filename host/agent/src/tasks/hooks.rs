//! Lifecycle hooks: the steps around a task's start and end, each in one place.
//!
//! The runner calls, for every incarnation of a task: `prestart` on the spec about to
//! be sent to `StartTask` (the first start and every restart, so a deleted task
//! directory is made again), `poststart` once the driver returned a handle, `exited`
//! when that incarnation ended, and `stop` once the task is dead for good.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use drover_plugin_sdk::{ExitResult, TaskHandle, TaskSpec};

use super::driver::TaskDriver;

/// How long `poststart` waits for the driver to describe a started task.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What `poststart` hooks see and fill in.
pub(crate) struct Started<'a> {
    /// The driver that started the task.
    pub driver: &'a dyn TaskDriver,
    /// Its handle.
    pub handle: &'a TaskHandle,
    /// Driver facts for the task's view, e.g. `pid`.
    pub attributes: BTreeMap<String, String>,
}

/// One step of a task's lifecycle. Every method defaults to doing nothing.
#[tonic::async_trait]
pub(crate) trait TaskHook: Send + Sync {
    /// For logs.
    fn name(&self) -> &'static str;
    /// Before every start. An error refuses the start and says why.
    async fn prestart(&self, _spec: &mut TaskSpec) -> Result<(), String> {
        Ok(())
    }
    /// After `StartTask` returned.
    async fn poststart(&self, _started: &mut Started<'_>) {}
    /// After an incarnation exited (restarted or not).
    async fn exited(&self, _spec: &TaskSpec, _result: &ExitResult) {}
    /// Once the task is dead for good.
    async fn stop(&self, _spec: &TaskSpec) {}
}

/// The hooks every task gets, in order.
pub(crate) fn default_hooks() -> Vec<Box<dyn TaskHook>> {
    vec![
        Box::new(TaskDirHook),
        Box::new(EnvHook),
        Box::new(LogsHook),
        Box::new(AttributesHook),
    ]
}

/// The task directory: `local/`, `secrets/` (0700: only the task's user reads it),
/// `tmp/`, `logs/`.
pub(crate) struct TaskDirHook;

#[tonic::async_trait]
impl TaskHook for TaskDirHook {
    fn name(&self) -> &'static str {
        "task_dir"
    }
    async fn prestart(&self, spec: &mut TaskSpec) -> Result<(), String> {
        create_task_dir(&spec.task_dir)
            .map_err(|e| format!("cannot create task dir {}: {e}", spec.task_dir.display()))
    }
}

fn create_task_dir(dir: &Path) -> std::io::Result<()> {
    for sub in ["local", "tmp", "logs", "secrets"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::set_permissions(dir.join("secrets"), std::fs::Permissions::from_mode(0o700))
}

/// `DROVER_*` variables telling the task who and where it is. They win over the
/// user's `env`, so a task can rely on them.
pub(crate) struct EnvHook;

#[tonic::async_trait]
impl TaskHook for EnvHook {
    fn name(&self) -> &'static str {
        "env"
    }
    async fn prestart(&self, spec: &mut TaskSpec) -> Result<(), String> {
        let dir = spec.task_dir.clone();
        let vars = [
            ("DROVER_TASK_ID", spec.id.clone()),
            ("DROVER_TASK_NAME", spec.name.clone()),
            ("DROVER_TASK_DIR", dir.display().to_string()),
            ("DROVER_LOCAL_DIR", dir.join("local").display().to_string()),
            (
                "DROVER_SECRETS_DIR",
                dir.join("secrets").display().to_string(),
            ),
        ];
        for (k, v) in vars {
            spec.env.insert(k.to_owned(), v);
        }
        Ok(())
    }
}

/// Where the driver writes stdout and stderr: log base paths under `logs/` (the
/// driver rotates `<base>.0`, `<base>.1`, … within the spec's log limits).
pub(crate) struct LogsHook;

#[tonic::async_trait]
impl TaskHook for LogsHook {
    fn name(&self) -> &'static str {
        "logs"
    }
    async fn prestart(&self, spec: &mut TaskSpec) -> Result<(), String> {
        let logs = spec.task_dir.join("logs");
        spec.stdout_path = logs.join("stdout");
        spec.stderr_path = logs.join("stderr");
        Ok(())
    }
}

/// Driver facts (such as the pid) for the task's view and its `Started` event.
pub(crate) struct AttributesHook;

#[tonic::async_trait]
impl TaskHook for AttributesHook {
    fn name(&self) -> &'static str {
        "attributes"
    }
    async fn poststart(&self, started: &mut Started<'_>) {
        let id = &started.handle.spec.id;
        // Facts are nice to have; a slow or failing InspectTask must not hold up a start.
        match tokio::time::timeout(INSPECT_TIMEOUT, started.driver.inspect_task(id)).await {
            Ok(Ok(status)) => started.attributes = status.attributes,
            Ok(Err(e)) => tracing::debug!(task = %id, "InspectTask after start failed: {e}"),
            Err(_) => tracing::debug!(task = %id, "InspectTask after start timed out"),
        }
    }
}
