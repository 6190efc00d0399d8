//! A conformance harness for plugin authors: launch your real plugin binary (or load
//! your driver library into the test, as an agent with `in_process = true` does) and
//! check that it behaves as the host expects. Enable the `testing` feature.
//!
//! Both forms run the same checks. For the library form, the harness needs a program
//! the driver's executors can run (`.executor(...)`): in a test the host is the test
//! binary, which is no executor; pass the driver's own binary, whose `main` calls
//! `drover_executor::run_if_executor` first.
//!
//! ```no_run
//! # async fn demo() {
//! use drover_plugin_sdk::testing::Conformance;
//! let deps = std::env::current_exe().unwrap().parent().unwrap().to_owned();
//! Conformance::shared_library(deps.join("libdrover_driver_rawexec.so"))
//!     .executor("target/debug/drover-driver-rawexec")
//!     .sample_task(serde_json::json!({"command": "/bin/true"}))
//!     .long_task(serde_json::json!({"command": "/bin/sleep", "args": ["1000"]}))
//!     .run()
//!     .await
//!     .expect("the library conforms");
//! # }
//! ```
//!
//! ```no_run
//! # async fn demo() {
//! use drover_plugin_sdk::testing::Conformance;
//! // In a test of the plugin's own crate: env!("CARGO_BIN_EXE_<your-binary>").
//! let report = Conformance::new("target/debug/drover-skeleton-driver")
//!     .sample_task(serde_json::json!({"run_for_ms": 100}))
//!     .long_task(serde_json::json!({}))
//!     .run()
//!     .await
//!     .expect("plugin conforms");
//! println!("{report}");
//! # }
//! ```

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_stream::StreamExt as _;

use crate::client::{
    InProcessOptions, InProcessPlugin, LaunchOptions, PluginClient, PluginProcess, sealed_copy,
};
use crate::version::{negotiate_api_version, parse_version, supported_api_range};
use crate::{AgentInfo, DriverError, ExitOutcome, Signal, TaskHandle, TaskSpec, TaskState};

/// What to check and how to start tasks with the driver under test.
#[derive(Debug, Clone)]
pub struct Conformance {
    form: Form,
    args: Vec<OsString>,
    executor: Option<PathBuf>,
    sample_task: serde_json::Value,
    long_task: serde_json::Value,
    plugin_config: serde_json::Value,
}

/// The shared library `file_name` (e.g. `libdrover_driver_rawexec.so`) cargo built
/// beside this test's executable (target/*/deps holds the `cdylib`s of the crates a
/// test depends on), or `None` after a loud `SKIPPED` line when it is not there. Under
/// `CI=true` a missing library fails the test instead.
///
/// ```no_run
/// let lib = drover_plugin_sdk::testing::built_library("libdrover_driver_rawexec.so");
/// ```
pub fn built_library(file_name: &str) -> Option<PathBuf> {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
    if let Some(path) = dir.map(|d| d.join(file_name))
        && path.is_file()
    {
        return Some(path);
    }
    let why = format!(
        "{file_name} is not next to the test executable: build the driver crate with \
         crate-type = [\"rlib\", \"cdylib\"]"
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true and {why}"
    );
    eprintln!("SKIPPED: {why}");
    None
}

/// Which form of the driver is checked.
#[derive(Debug, Clone)]
enum Form {
    /// A plugin binary, launched as a process.
    Process(PathBuf),
    /// A driver library, loaded into this process.
    Library(PathBuf),
}

/// The plugin being checked, in either form.
enum UnderTest {
    Process(Box<PluginProcess>),
    Library(InProcessPlugin),
}

impl UnderTest {
    fn client(&self) -> PluginClient {
        match self {
            UnderTest::Process(p) => p.client(),
            UnderTest::Library(p) => p.client(),
        }
    }

    async fn shutdown(&self) -> ExitOutcome {
        match self {
            UnderTest::Process(p) => p.shutdown().await,
            UnderTest::Library(p) => p.shutdown().await,
        }
    }

    /// After a failure: a process is killed; a library cannot be, so it is stopped.
    async fn kill(&self) -> ExitOutcome {
        match self {
            UnderTest::Process(p) => p.kill().await,
            UnderTest::Library(p) => p.shutdown().await,
        }
    }
}

/// One passed step and how long it took.
#[derive(Debug, Clone)]
pub struct Step {
    /// What was checked.
    pub name: &'static str,
    /// How long it took.
    pub elapsed: Duration,
}

/// Every step that passed, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The steps.
    pub steps: Vec<Step>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.steps {
            writeln!(f, "ok  {:<48} {:?}", s.name, s.elapsed)?;
        }
        Ok(())
    }
}

/// The first step that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("conformance step {step:?} failed: {reason}")]
pub struct ConformanceError {
    /// The step.
    pub step: &'static str,
    /// Why.
    pub reason: String,
}

fn fail(step: &'static str, reason: impl fmt::Display) -> ConformanceError {
    ConformanceError {
        step,
        reason: reason.to_string(),
    }
}

/// Run one step with a time limit, recording it in the report.
async fn step<T>(
    report: &mut Report,
    name: &'static str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, ConformanceError> {
    let started = Instant::now();
    let out = tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| fail(name, format!("no answer within {limit:?}")))?
        .map_err(|r| fail(name, r))?;
    report.steps.push(Step {
        name,
        elapsed: started.elapsed(),
    });
    Ok(out)
}

const RPC: Duration = Duration::from_secs(5);
/// StartTask may pull together a container, a namespace set or a JVM.
const START: Duration = Duration::from_secs(20);

/// Every task id the checks may start, for the clean-up after a failure.
const TASK_IDS: [&str; 4] = [
    "conformance-sample",
    "conformance-typo",
    "conformance-long",
    "conformance-recover",
];

impl Conformance {
    /// Check the plugin binary at `binary`. Set the task configs before running.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self::of(Form::Process(binary.into()))
    }

    /// Check the driver library (`cdylib` built with [`crate::export_driver!`]) at
    /// `path`, loaded into this process as an agent loads it with `in_process = true`.
    /// Set [`Self::executor`] when its tasks run in executors.
    pub fn shared_library(path: impl Into<PathBuf>) -> Self {
        Self::of(Form::Library(path.into()))
    }

    fn of(form: Form) -> Self {
        Conformance {
            form,
            args: Vec::new(),
            executor: None,
            sample_task: serde_json::json!({}),
            long_task: serde_json::json!({}),
            plugin_config: serde_json::json!({}),
        }
    }

    /// The plugin config SetConfig sends (default `{}`): for a driver whose tasks need
    /// one, e.g. qemu's `image_paths` for the images its sample task boots.
    pub fn plugin_config(mut self, config: serde_json::Value) -> Self {
        self.plugin_config = config;
        self
    }

    /// Arguments the binary needs to serve (e.g. `plugin serve rawexec`).
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// The program a library's executors run (library form only; default: this test
    /// binary, which is no executor). Pass the driver's own binary, e.g.
    /// `env!("CARGO_BIN_EXE_drover-driver-rawexec")`, which calls
    /// `drover_executor::run_if_executor` first thing.
    pub fn executor(mut self, program: impl Into<PathBuf>) -> Self {
        self.executor = Some(program.into());
        self
    }

    /// A task config that starts a task which exits 0 within a few seconds.
    pub fn sample_task(mut self, config: serde_json::Value) -> Self {
        self.sample_task = config;
        self
    }

    /// A task config that starts a task which runs until stopped.
    pub fn long_task(mut self, config: serde_json::Value) -> Self {
        self.long_task = config;
        self
    }

    async fn launch(&self, dir: &std::path::Path) -> Result<UnderTest, String> {
        match &self.form {
            Form::Process(binary) => {
                let mut opts = LaunchOptions::new("conformance", binary.clone());
                opts.args = self.args.clone();
                opts.socket_dir = Some(dir.to_owned());
                PluginProcess::launch(opts)
                    .await
                    .map(|p| UnderTest::Process(Box::new(p)))
                    .map_err(|e| e.to_string())
            }
            Form::Library(path) => {
                let file = std::fs::File::open(path)
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                let sealed = sealed_copy(&file.into(), "conformance")
                    .map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
                let mut opts = InProcessOptions::new("conformance", sealed, path.clone());
                opts.executor = self.executor.clone();
                InProcessPlugin::load(opts)
                    .await
                    .map(UnderTest::Library)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// A fresh plugin after `old` shut down: a new process, or a fresh runtime in the
    /// same library (what an agent's supervisor does).
    async fn relaunch(&self, old: &UnderTest, dir: &std::path::Path) -> Result<UnderTest, String> {
        match old {
            UnderTest::Process(_) => self.launch(dir).await,
            UnderTest::Library(p) => p
                .restart(Duration::from_secs(5))
                .await
                .map(UnderTest::Library)
                .map_err(|e| e.to_string()),
        }
    }

    fn spec(&self, dir: &std::path::Path, id: &str, config: &serde_json::Value) -> TaskSpec {
        let task_dir = dir.join(id);
        let _ = std::fs::create_dir_all(&task_dir);
        TaskSpec::new(id)
            .with_stdout_path(task_dir.join("stdout"))
            .with_stderr_path(task_dir.join("stderr"))
            .with_task_dir(task_dir)
            .with_driver_config_json(config.to_string())
    }

    /// Run every check against a fresh plugin (process or loaded library). Stops at
    /// the first failure.
    pub async fn run(&self) -> Result<Report, ConformanceError> {
        let dir = tempfile::tempdir().map_err(|e| fail("setup", e))?;
        let root = dir.path();
        let mut r = Report::default();
        let plugin = step(
            &mut r,
            match self.form {
                Form::Process(_) => "launch and handshake",
                Form::Library(_) => "load the library, start it, health check",
            },
            Duration::from_secs(10),
            self.launch(root),
        )
        .await?;
        let result = self.checks(&mut r, &plugin, root).await;
        if result.is_err() {
            // Leave nothing running: a failed check may have left a long task behind.
            let c = plugin.client();
            for id in TASK_IDS {
                let _ = tokio::time::timeout(RPC, c.destroy_task(id, true)).await;
            }
            plugin.kill().await;
        }
        result.map(|()| r)
    }

    async fn checks(
        &self,
        r: &mut Report,
        plugin: &UnderTest,
        root: &std::path::Path,
    ) -> Result<(), ConformanceError> {
        let c = plugin.client();
        let api = step(r, "PluginInfo: name, version, API version", RPC, async {
            let info = c.plugin_info().await.map_err(|e| e.to_string())?;
            let ok_name = !info.name.is_empty()
                && info.name.len() <= 64
                && info.name.chars().all(|ch| {
                    ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_' || ch == '-'
                });
            if !ok_name {
                return Err(format!(
                    "name {:?} is not 1-64 characters of [a-z0-9_-]",
                    info.name
                ));
            }
            parse_version(&info.version).map_err(|e| format!("plugin_version: {e}"))?;
            negotiate_api_version(&info.api_versions, &supported_api_range())
                .map_err(|e| e.to_string())
        })
        .await?;
        for (name, fut) in [
            (
                "ConfigSchema is a JSON Schema object",
                Box::pin(c.config_schema())
                    as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
            ),
            (
                "TaskConfigSchema is a JSON Schema object",
                Box::pin(c.task_config_schema()),
            ),
        ] {
            step(r, name, RPC, async {
                let text = fut.await.map_err(|e| e.to_string())?;
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
                if v.is_object() {
                    Ok(())
                } else {
                    Err(format!("not an object: {text}"))
                }
            })
            .await?;
        }
        step(
            r,
            "SetConfig with the plugin config ({} unless given)",
            RPC,
            async {
                let agent = AgentInfo::new(api.to_string())
                    .with_alloc_dir(root)
                    .with_plugin_state_dir(root);
                c.set_config(self.plugin_config.to_string(), &agent)
                    .await
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        let caps = step(r, "Capabilities", RPC, async {
            c.capabilities().await.map_err(|e| e.to_string())
        })
        .await?;
        step(
            r,
            "first Fingerprint within 5 s",
            Duration::from_secs(5),
            async {
                let mut s = Box::pin(c.fingerprint().await.map_err(|e| e.to_string())?);
                match s.next().await {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(e)) => Err(e.to_string()),
                    None => Err("stream ended without a fingerprint".into()),
                }
            },
        )
        .await?;

        let sample = self.spec(root, "conformance-sample", &self.sample_task);
        step(
            r,
            "StartTask, InspectTask, WaitTask twice, DestroyTask",
            Duration::from_secs(20),
            async {
                c.start_task(sample.clone())
                    .await
                    .map_err(|e| format!("start: {e}"))?;
                let st = c
                    .inspect_task(&sample.id)
                    .await
                    .map_err(|e| format!("inspect: {e}"))?;
                if st.state == TaskState::Unknown {
                    return Err("InspectTask says the state is unknown".into());
                }
                let first = c
                    .wait_task(&sample.id)
                    .await
                    .map_err(|e| format!("wait: {e}"))?;
                if first.outcome() != ExitOutcome::Code(0) || !first.successful() {
                    return Err(format!("sample task did not exit 0: {first:?}"));
                }
                let again = c
                    .wait_task(&sample.id)
                    .await
                    .map_err(|e| format!("second wait: {e}"))?;
                if again != first {
                    return Err(format!(
                        "WaitTask changed its answer: {first:?} then {again:?}"
                    ));
                }
                c.destroy_task(&sample.id, false)
                    .await
                    .map_err(|e| format!("destroy: {e}"))?;
                match c.inspect_task(&sample.id).await {
                    Err(DriverError::NotFound(_)) => Ok(()),
                    other => Err(format!("destroyed task still answers: {other:?}")),
                }
            },
        )
        .await?;

        step(
            r,
            "misspelt task config field is refused by name",
            RPC,
            async {
                let mut config = self.sample_task.clone();
                if let Some(map) = config.as_object_mut() {
                    map.insert("conformance_typo_field".into(), serde_json::json!(1));
                }
                let spec = self.spec(root, "conformance-typo", &config);
                match c.start_task(spec).await {
                    Err(DriverError::InvalidConfig(m)) if m.contains("conformance_typo_field") => {
                        Ok(())
                    }
                    other => Err(format!(
                        "expected InvalidConfig naming the field, got {other:?}"
                    )),
                }
            },
        )
        .await?;
        step(r, "unsafe task id is refused", RPC, async {
            match c
                .start_task(self.spec(root, "x", &self.sample_task).with_id("../x"))
                .await
            {
                Err(DriverError::InvalidConfig(_)) => Ok(()),
                other => Err(format!("expected InvalidConfig, got {other:?}")),
            }
        })
        .await?;
        step(r, "unknown task id is NotFound", RPC, async {
            match (
                c.inspect_task("conformance-nosuch").await,
                c.wait_task("conformance-nosuch").await,
            ) {
                (Err(DriverError::NotFound(_)), Err(DriverError::NotFound(_))) => Ok(()),
                other => Err(format!("expected NotFound twice, got {other:?}")),
            }
        })
        .await?;

        let long = self.spec(root, "conformance-long", &self.long_task);
        let handle = step(
            r,
            "running task: destroy refused, bad signal refused, stop escalates after its timeout",
            Duration::from_secs(20),
            async {
                let handle = c
                    .start_task(long.clone())
                    .await
                    .map_err(|e| format!("start: {e}"))?;
                match c.destroy_task(&long.id, false).await {
                    Err(DriverError::FailedPrecondition(_)) => {}
                    other => {
                        return Err(format!(
                            "destroying a running task without force: {other:?}"
                        ));
                    }
                }
                c.recover_task(handle.clone())
                    .await
                    .map_err(|e| format!("RecoverTask of a tracked task must be harmless: {e}"))?;
                // The typed client cannot send a name that is no signal: go to the wire.
                let bogus = crate::proto::v1::StopTaskRequest {
                    task_id: long.id.clone(),
                    timeout: None,
                    signal: "SIGNOPE".into(),
                };
                match c
                    .raw_driver()
                    .stop_task(bogus)
                    .await
                    .map_err(DriverError::from)
                {
                    Err(DriverError::InvalidConfig(m)) if m.contains("SIGNOPE") => {}
                    other => {
                        return Err(format!(
                            "StopTask with signal \"SIGNOPE\": expected InvalidConfig naming \
                             it, got {other:?}"
                        ));
                    }
                }
                let t = Instant::now();
                c.stop_task(&long.id, Duration::from_secs(2), Signal::TERM)
                    .await
                    .map_err(|e| format!("stop: {e}"))?;
                // Generous for a loaded CI machine; one that never escalates hangs.
                if t.elapsed() > Duration::from_secs(8) {
                    return Err(format!(
                        "StopTask took {:?} with a 2 s timeout",
                        t.elapsed()
                    ));
                }
                c.wait_task(&long.id)
                    .await
                    .map_err(|e| format!("wait after stop: {e}"))?;
                c.destroy_task(&long.id, false)
                    .await
                    .map_err(|e| format!("destroy after stop: {e}"))?;
                Ok(handle)
            },
        )
        .await?;
        let _ = handle;

        if caps.recover {
            let spec = self.spec(root, "conformance-recover", &self.long_task);
            let handle = step(r, "start a task to recover", START, async {
                c.start_task(spec.clone()).await.map_err(|e| e.to_string())
            })
            .await?;
            let _ = plugin.shutdown().await;
            let fresh = step(
                r,
                "relaunch the plugin",
                Duration::from_secs(10),
                self.relaunch(plugin, root),
            )
            .await?;
            let c2 = fresh.client();
            step(
                r,
                "RecoverTask probing by id a task never started answers NotFound",
                RPC,
                async {
                    // What the agent sends when a StartTask ended in doubt: only the
                    // spec, no driver state. NotFound tells it to start the task; any
                    // other error makes it give the task up as lost.
                    let never = self.spec(root, "conformance-never-started", &self.long_task);
                    match c2.recover_task(TaskHandle::for_spec(never)).await {
                        Err(DriverError::NotFound(_)) => Ok(()),
                        Ok(()) => Err("answered Ok: a task that was never started was \
                                       recovered"
                            .to_string()),
                        Err(e) => Err(format!(
                            "answered {e:?}; the agent would give up a task it may still \
                             start (answer NotFound)"
                        )),
                    }
                },
            )
            .await?;
            let checked = step(
                r,
                "RecoverTask in a new plugin keeps the task running",
                Duration::from_secs(20),
                async {
                    c2.recover_task(handle)
                        .await
                        .map_err(|e| format!("recover: {e}"))?;
                    let st = c2
                        .inspect_task(&spec.id)
                        .await
                        .map_err(|e| format!("inspect: {e}"))?;
                    if st.state != TaskState::Running {
                        return Err(format!("recovered task is {:?}, not running", st.state));
                    }
                    c2.stop_task(&spec.id, Duration::from_secs(2), Signal::TERM)
                        .await
                        .map_err(|e| format!("stop: {e}"))?;
                    c2.wait_task(&spec.id)
                        .await
                        .map_err(|e| format!("wait: {e}"))?;
                    c2.destroy_task(&spec.id, false)
                        .await
                        .map_err(|e| format!("destroy: {e}"))
                },
            )
            .await;
            let exited = step(
                r,
                "Shutdown exits within 2 s",
                // The SDK kills a plugin 2 s after asking it to exit; this bound
                // only guards against a hang.
                Duration::from_secs(10),
                async { Ok::<_, String>(fresh.shutdown().await) },
            )
            .await;
            checked?;
            exited?;
            return Ok(());
        }
        step(
            r,
            "Shutdown exits within 2 s",
            Duration::from_secs(10),
            async {
                let how = plugin.shutdown().await;
                if how == ExitOutcome::Code(0) {
                    Ok(())
                } else {
                    Err(format!("plugin exited with {how}"))
                }
            },
        )
        .await?;
        Ok(())
    }
}
