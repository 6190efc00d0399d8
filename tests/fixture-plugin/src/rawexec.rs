//! `FIXTURE_MODE=rawexec` and `rawexec-bad-config`: the real rawexec driver under the
//! name and version of `FIXTURE_NAME` (default `raw_exec`) and `FIXTURE_VERSION`, so
//! that tests can drop "a newer rawexec" into a plugin_dir. Its task handles are
//! rawexec's own (same encoding version), so it recovers the built-in's tasks.
//! `rawexec-bad-config` refuses every `SetConfig`: a newer version that cannot serve.
//! With `FIXTURE_RECOVER_ACCEPT=N`, it recovers only the first N tasks it is handed
//! and refuses every later `RecoverTask` as a driver that cannot read the handle does
//! (`InvalidConfig`): a newer version whose handle decoding is incompatible (N = 0),
//! or one that passes a hand-over's probe and refuses afterwards (N = the tasks).
//! With `FIXTURE_RECOVER_CRASH=N`, the process aborts (a crash) on the `RecoverTask`
//! after the first N: a newer version that dies on the handles it is handed, in the
//! probe (N = 0) or once it serves (N = the tasks).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use drover_driver_rawexec::RawExecDriver;
use drover_plugin_sdk::tokio::sync::broadcast;
use drover_plugin_sdk::{
    AgentInfo, Capabilities, DriverError, DriverPlugin, ExecOutput, ExitResult, Fingerprint,
    PluginInfo, Signal, TaskEvent, TaskHandle, TaskSpec, TaskStats, TaskStatus,
};

/// rawexec with another name and version.
pub struct Rawexec {
    inner: RawExecDriver,
    name: String,
    version: String,
    refuse_config: bool,
    /// RecoverTask calls still accepted (`None`: all of them).
    recover_accept: Option<AtomicUsize>,
    /// RecoverTask calls still served before the process aborts (`None`: never).
    recover_crash: Option<AtomicUsize>,
}

impl Rawexec {
    pub fn new(
        name: String,
        version: String,
        refuse_config: bool,
        recover_accept: Option<usize>,
    ) -> Self {
        Rawexec {
            inner: RawExecDriver::new(),
            name,
            version,
            refuse_config,
            recover_accept: recover_accept.map(AtomicUsize::new),
            recover_crash: std::env::var("FIXTURE_RECOVER_CRASH")
                .ok()
                .map(|n| AtomicUsize::new(n.parse().expect("FIXTURE_RECOVER_CRASH is a number"))),
        }
    }
}

type Config = <RawExecDriver as DriverPlugin>::Config;
type TaskConfig = <RawExecDriver as DriverPlugin>::TaskConfig;

impl DriverPlugin for Rawexec {
    type Config = Config;
    type TaskConfig = TaskConfig;

    fn info(&self) -> PluginInfo {
        PluginInfo::new(self.name.clone(), self.version.clone())
    }

    fn api_versions(&self) -> Vec<String> {
        self.inner.api_versions()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn set_config(&self, config: Config, agent: AgentInfo) -> Result<(), DriverError> {
        if self.refuse_config {
            return Err(DriverError::InvalidConfig(format!(
                "fixture {} {} refuses every configuration",
                self.name, self.version
            )));
        }
        // Whatever section its name finds in the test's config: the fixture stands in
        // for a rawexec its operator enabled (raw_exec is off unless `enabled`).
        let config = Config {
            enabled: true,
            ..config
        };
        self.inner.set_config(config, agent).await
    }

    async fn fingerprint(&self) -> Fingerprint {
        self.inner.fingerprint().await
    }

    fn fingerprint_interval(&self) -> Duration {
        self.inner.fingerprint_interval()
    }

    async fn start_task(
        &self,
        spec: TaskSpec,
        config: TaskConfig,
    ) -> Result<TaskHandle, DriverError> {
        self.inner.start_task(spec, config).await
    }

    async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError> {
        self.inner.wait_task(id).await
    }

    async fn stop_task(
        &self,
        id: &str,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        self.inner.stop_task(id, timeout, signal).await
    }

    async fn destroy_task(&self, id: &str, force: bool) -> Result<(), DriverError> {
        self.inner.destroy_task(id, force).await
    }

    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
        self.inner.inspect_task(id).await
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if let Some(left) = &self.recover_crash
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
        {
            eprintln!(
                "fixture {} {} crashes on the handle of task {}",
                self.name, self.version, handle.spec.id
            );
            std::process::abort();
        }
        if let Some(left) = &self.recover_accept {
            let accepted = left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !accepted {
                return Err(DriverError::InvalidConfig(format!(
                    "fixture {} {} cannot read the handle of task {} (version {})",
                    self.name, self.version, handle.spec.id, handle.version
                )));
            }
        }
        self.inner.recover_task(handle).await
    }

    async fn signal_task(&self, id: &str, signal: Signal) -> Result<(), DriverError> {
        self.inner.signal_task(id, signal).await
    }

    async fn task_stats(&self, id: &str) -> Result<TaskStats, DriverError> {
        self.inner.task_stats(id).await
    }

    fn task_events(&self) -> Option<broadcast::Receiver<TaskEvent>> {
        self.inner.task_events()
    }

    async fn exec_task(
        &self,
        id: &str,
        command: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        self.inner.exec_task(id, command, timeout).await
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }
}
