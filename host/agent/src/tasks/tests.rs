//! The task manager against a scripted driver: restarts, recovery, failures of the
//! driver and of the store, without plugin processes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt as _;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use drover_api::{RestartMode, RestartPolicy};
use drover_plugin_sdk::{ExitResult, Signal, TaskEvent, TaskHandle, TaskStatus};

use super::driver::TaskEventStream;

use super::*;
use crate::state::MemStore;

type Exit = Arc<watch::Sender<Option<ExitResult>>>;

/// A driver whose "machine" (tasks that exist) outlives its "process" (what it knows),
/// like a plugin with per-task executors.
struct Fake {
    generation: watch::Sender<u64>,
    crashed: watch::Sender<u64>,
    s: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    down: bool,
    known: HashSet<String>,
    tasks: HashMap<String, Exit>,
    starts: Vec<(String, Instant, TaskSpec)>,
    destroys: Vec<String>,
    stops: Vec<String>,
    hang_recover: bool,
    /// RecoverTask fails with this (e.g. an executor alive but unreachable).
    recover_error: Option<DriverError>,
    /// StartTask waits for this before doing anything.
    start_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// StartTask calls that arrived.
    start_calls: usize,
    /// The driver is not loaded.
    unloaded: bool,
    /// StartTask fails with this.
    refuse_start: Option<DriverError>,
    /// StartTask starts the task, then the plugin dies and the call fails with this.
    crash_in_start: Option<DriverError>,
    /// A crash breaks in-flight calls with a transport error before the exit is seen.
    crash_breaks_connection: bool,
    /// StartTask of this id finds the task there already (an earlier StartTask
    /// finished late) and answers AlreadyExists.
    late_start: Option<(String, Exit)>,
    /// WaitTask calls that are listening (for the exit and for a crash), by task id.
    waiting: Vec<String>,
    /// The next this many StopTask calls are lost in transport (the plugin lives on).
    lose_stops: usize,
    /// The driver takes no new tasks, for this reason (its plugin file was removed).
    retiring: Option<String>,
    /// Subscribers to TaskEvents.
    event_subscribers: Vec<tokio::sync::mpsc::UnboundedSender<Result<TaskEvent, DriverError>>>,
    /// RecoverTask with a handle made from the spec alone finds a task (as Drover's
    /// drivers do): the manager starts tasks while their pending record is written.
    /// Unset: no (Nomad's drivers), or yes with `DROVER_TEST_FAKE_BY_ID=1`, so that
    /// `scripts/test.sh` runs every test that does not care on both paths.
    by_id: Option<bool>,
    /// StartTask answers with the task's attributes (as Drover's plugins do).
    reports_attributes: bool,
    /// InspectTask calls that arrived.
    inspects: usize,
    /// The next this many DestroyTask calls fail (the plugin is away for them).
    fail_destroys: usize,
}

/// Task config of the fake: exit with `exit_code` after `after_ms`, or run until
/// stopped when `exit_code` is absent.
#[derive(serde::Deserialize, Default)]
struct FakeConfig {
    exit_code: Option<i32>,
    #[serde(default)]
    after_ms: u64,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake {
            generation: watch::channel(0).0,
            crashed: watch::channel(0).0,
            s: Mutex::new(FakeState::default()),
        })
    }

    fn s(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.s.lock().unwrap()
    }

    fn up(&self) -> Result<(), DriverError> {
        if self.s().down {
            return Err(DriverError::Unavailable("fake plugin exited".into()));
        }
        Ok(())
    }

    fn known(&self, id: &str) -> Result<Exit, DriverError> {
        self.up()?;
        let s = self.s();
        if !s.known.contains(id) {
            return Err(DriverError::NotFound(format!("task {id}")));
        }
        s.tasks
            .get(id)
            .cloned()
            .ok_or_else(|| DriverError::NotFound(format!("task {id}")))
    }

    /// The plugin process dies: calls in flight fail, it knows nothing any more.
    fn crash(&self) {
        {
            let mut s = self.s();
            s.down = true;
            s.known.clear();
            // Its event streams end with it.
            s.event_subscribers.clear();
        }
        self.crashed.send_modify(|c| *c += 1);
    }

    /// A new plugin process is up.
    fn relaunch(&self) {
        self.s().down = false;
        self.generation.send_modify(|g| *g += 1);
    }

    /// What a new agent meets: a fresh plugin process; the tasks still exist.
    fn new_process(&self) {
        self.crash();
        self.relaunch();
    }

    fn exit(&self, id: &str, code: i32) {
        let exit = self.s().tasks.get(id).cloned().unwrap();
        exit.send_replace(Some(ExitResult::code(code)));
    }

    fn starts(&self, id: &str) -> Vec<Instant> {
        self.s()
            .starts
            .iter()
            .filter(|(i, _, _)| i == id)
            .map(|(_, t, _)| *t)
            .collect()
    }

    /// The task's executor vanished (its socket deleted): nobody can find it.
    fn lose(&self, id: &str) {
        self.s().tasks.remove(id);
    }

    /// The driver says `message` about task `id` on its TaskEvents stream.
    fn say(&self, id: &str, message: &str) {
        self.s()
            .event_subscribers
            .retain(|tx| tx.send(Ok(TaskEvent::new(id, message))).is_ok());
    }
}

#[tonic::async_trait]
impl TaskDriver for Fake {
    fn state(&self) -> (PluginState, String) {
        (PluginState::Healthy, "ready".into())
    }
    fn task_schema(&self) -> crate::plugins::loader::Schema {
        crate::plugins::loader::Schema::any()
    }
    fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
    fn retiring(&self) -> Option<String> {
        self.s().retiring.clone()
    }
    fn finds_tasks_by_id(&self) -> bool {
        self.s()
            .by_id
            .unwrap_or_else(|| std::env::var_os("DROVER_TEST_FAKE_BY_ID").is_some_and(|v| v == "1"))
    }
    async fn start_task(&self, spec: TaskSpec) -> Result<TaskHandle, DriverError> {
        let gate = {
            let mut s = self.s();
            s.start_calls += 1;
            s.start_gate.clone()
        };
        if let Some(gate) = gate {
            let _pass = gate.acquire().await;
        }
        self.up()?;
        if let Some(e) = self.s().refuse_start.clone() {
            return Err(e);
        }
        {
            let mut s = self.s();
            if s.late_start.as_ref().is_some_and(|(id, _)| *id == spec.id)
                && let Some((id, exit)) = s.late_start.take()
            {
                s.tasks.insert(id.clone(), exit);
                return Err(DriverError::AlreadyExists(format!("task {id}")));
            }
        }
        let config: FakeConfig = serde_json::from_str(&spec.driver_config_json)
            .map_err(|e| DriverError::InvalidConfig(e.to_string()))?;
        let exit: Exit = Arc::new(watch::channel(None).0);
        {
            let mut s = self.s();
            if s.tasks.contains_key(&spec.id) {
                return Err(DriverError::AlreadyExists(spec.id.clone()));
            }
            s.tasks.insert(spec.id.clone(), exit.clone());
            s.known.insert(spec.id.clone());
            s.starts
                .push((spec.id.clone(), Instant::now(), spec.clone()));
        }
        let crash = self.s().crash_in_start.take();
        if let Some(e) = crash {
            self.crash();
            return Err(e);
        }
        if let Some(code) = config.exit_code {
            let after = Duration::from_millis(config.after_ms);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                exit.send_replace(Some(ExitResult::code(code)));
            });
        }
        TaskHandle::new(spec, 1, &serde_json::json!({"executor": "/run/x.sock"}))
    }
    async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError> {
        let exit = self.known(id)?;
        let mut crashed = self.crashed.subscribe();
        let mut rx = exit.subscribe();
        self.s().waiting.push(id.to_owned());
        tokio::select! {
            r = rx.wait_for(Option::is_some) => {
                Ok(r.map_err(DriverError::internal)?.clone().unwrap_or_default())
            }
            _ = crashed.changed() => Err(if self.s().crash_breaks_connection {
                DriverError::Transport("transport error".into())
            } else {
                DriverError::Unavailable("fake plugin exited".into())
            }),
        }
    }
    async fn stop_task(&self, id: &str, _: Duration, _: Signal) -> Result<(), DriverError> {
        let exit = self.known(id)?;
        self.s().stops.push(id.to_owned());
        {
            let mut s = self.s();
            if s.lose_stops > 0 {
                s.lose_stops -= 1;
                return Err(DriverError::Transport("connection reset".into()));
            }
        }
        exit.send_if_modified(|e| {
            if e.is_none() {
                *e = Some(ExitResult::signaled(15));
                true
            } else {
                false
            }
        });
        Ok(())
    }
    async fn destroy_task(&self, id: &str, _force: bool) -> Result<(), DriverError> {
        {
            let mut s = self.s();
            if s.fail_destroys > 0 {
                s.fail_destroys -= 1;
                return Err(DriverError::Unavailable("fake plugin is away".into()));
            }
        }
        self.known(id)?;
        let mut s = self.s();
        s.known.remove(id);
        s.tasks.remove(id);
        s.destroys.push(id.to_owned());
        Ok(())
    }
    async fn start_task_reporting(
        &self,
        spec: TaskSpec,
    ) -> Result<(TaskHandle, Option<BTreeMap<String, String>>), DriverError> {
        let reports = self.s().reports_attributes;
        let handle = self.start_task(spec).await?;
        let attributes = reports.then(|| BTreeMap::from([("pid".to_owned(), "4343".to_owned())]));
        Ok((handle, attributes))
    }
    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
        self.s().inspects += 1;
        self.known(id)?;
        Ok(
            TaskStatus::new(id, drover_plugin_sdk::TaskState::Unknown)
                .with_attribute("pid", "4242"),
        )
    }
    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        if self.s().hang_recover {
            std::future::pending::<()>().await;
        }
        self.up()?;
        if let Some(e) = self.s().recover_error.clone() {
            return Err(e);
        }
        let mut s = self.s();
        let id = handle.spec.id.clone();
        if !s.tasks.contains_key(&id) {
            return Err(DriverError::NotFound(format!(
                "no executor for task {id}: its socket is gone"
            )));
        }
        s.known.insert(id);
        Ok(())
    }
    async fn signal_task(&self, id: &str, _: Signal) -> Result<(), DriverError> {
        self.known(id).map(drop)
    }
    async fn task_stats(&self, id: &str) -> Result<TaskStats, DriverError> {
        self.known(id)?;
        Ok(TaskStats::default())
    }
    async fn task_events(&self) -> Result<TaskEventStream, DriverError> {
        self.up()?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.s().event_subscribers.push(tx);
        Ok(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        ))
    }
}

struct FakeDrivers(Arc<Fake>);

impl Drivers for FakeDrivers {
    fn driver(&self, name: &str) -> Option<Arc<dyn TaskDriver>> {
        (name == "fake" && !self.0.s().unloaded).then(|| self.0.clone() as Arc<dyn TaskDriver>)
    }
    fn names(&self) -> Vec<String> {
        vec!["fake".into()]
    }
}

/// A store whose `put_task` number `fail_put` (1-based) fails, and whose next
/// `put_task` waits until the test sends on `gate`, when one is set.
#[derive(Default)]
struct FlakyStore {
    inner: MemStore,
    puts: AtomicUsize,
    fail_put: AtomicUsize,
    /// Every `put_task` from this number on fails too (0: none).
    fail_from: AtomicUsize,
    gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl StateStore for FlakyStore {
    fn put_plugin(&self, rec: &crate::state::PluginRecord) -> Result<(), StateError> {
        self.inner.put_plugin(rec)
    }
    fn plugins(&self) -> Result<Vec<crate::state::PluginRecord>, StateError> {
        self.inner.plugins()
    }
    fn delete_plugin(&self, name: &str) -> Result<(), StateError> {
        self.inner.delete_plugin(name)
    }
    fn put_task(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        let gate = self.gate.lock().unwrap().take();
        if let Some(gate) = gate {
            let _ = gate.recv();
        }
        let n = self.puts.fetch_add(1, Ordering::SeqCst) + 1;
        let from = self.fail_from.load(Ordering::SeqCst);
        if n == self.fail_put.load(Ordering::SeqCst) || (from != 0 && n >= from) {
            return Err(StateError::Io {
                op: format!("put task {id}"),
                reason: "disk full (injected)".into(),
            });
        }
        self.inner.put_task(id, record)
    }
    fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.inner.tasks()
    }
    fn delete_task(&self, id: &str) -> Result<(), StateError> {
        self.inner.delete_task(id)
    }
    fn put_alloc(&self, id: &str, record: &[u8]) -> Result<(), StateError> {
        self.inner.put_alloc(id, record)
    }
    fn allocs(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.inner.allocs()
    }
    fn delete_alloc(&self, id: &str) -> Result<(), StateError> {
        self.inner.delete_alloc(id)
    }
}

struct Env {
    _dir: tempfile::TempDir,
    alloc: PathBuf,
    fake: Arc<Fake>,
    store: Arc<dyn StateStore>,
    mgr: Arc<TaskManager>,
}

impl Env {
    fn new() -> Env {
        Self::with_store(Arc::new(MemStore::default()))
    }

    fn with_store(store: Arc<dyn StateStore>) -> Env {
        Self::with_store_in(tempfile::tempdir().unwrap(), store)
    }

    /// [`Env::with_store`] in `dir`.
    fn with_store_in(dir: tempfile::TempDir, store: Arc<dyn StateStore>) -> Env {
        let alloc = dir.path().join("alloc");
        std::fs::create_dir(&alloc).unwrap();
        let fake = Fake::new();
        let mgr = manager(&fake, &alloc, &store);
        // As the agent does before it takes tasks (an empty store: nothing to read).
        mgr.load().unwrap();
        Env {
            _dir: dir,
            alloc,
            fake,
            store,
            mgr,
        }
    }

    /// A second agent on the same store, driver and alloc dir.
    /// The agent stops (committing its deferred records, as `drover agent` does) and
    /// a new one starts on the same state.
    fn restart_agent(&self) -> Arc<TaskManager> {
        self.settle();
        manager(&self.fake, &self.alloc, &self.store)
    }

    /// Commit the agent's deferred record writes now, on this thread (nothing else of
    /// the agent runs meanwhile): the store then says what a later look at it would.
    fn settle(&self) {
        self.mgr.store.commit_deferred_now();
    }

    fn stored(&self, id: &str) -> serde_json::Value {
        let (_, bytes) = self
            .store
            .tasks()
            .unwrap()
            .into_iter()
            .find(|(i, _)| i == id)
            .unwrap_or_else(|| panic!("no record for {id}"));
        serde_json::from_slice(&bytes).unwrap()
    }
}

fn manager(
    fake: &Arc<Fake>,
    alloc: &std::path::Path,
    store: &Arc<dyn StateStore>,
) -> Arc<TaskManager> {
    let mut m = TaskManager::with_drivers(
        Arc::new(FakeDrivers(fake.clone())),
        alloc.to_owned(),
        store.clone(),
    );
    m.rpc_timeout = Duration::from_millis(300);
    m.recover_timeout = Duration::from_millis(300);
    m.start_timeout = Duration::from_millis(300);
    Arc::new(m)
}

/// Until the runner of `id` is blocked in WaitTask (so that a crash now breaks it).
async fn until_waiting(fake: &Fake, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fake.s().waiting.iter().any(|w| w == id) {
        assert!(
            Instant::now() < deadline,
            "the runner of {id} never called WaitTask"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn request(config: serde_json::Value, restart: Option<RestartPolicy>) -> RunRequest {
    RunRequest {
        driver: "fake".into(),
        config,
        restart,
        ..Default::default()
    }
}

fn policy(attempts: u32, interval: &str, delay: &str, mode: RestartMode) -> Option<RestartPolicy> {
    Some(RestartPolicy {
        attempts,
        interval: humantime::parse_duration(interval).unwrap(),
        delay: humantime::parse_duration(delay).unwrap(),
        mode,
    })
}

fn kinds(v: &TaskView) -> Vec<&str> {
    v.events.iter().map(|e| e.kind.as_str()).collect()
}

async fn wait_dead(mgr: &TaskManager, id: &str) -> TaskView {
    tokio::time::timeout(Duration::from_secs(10), mgr.wait(id))
        .await
        .unwrap_or_else(|_| panic!("task {id} never died: {:#?}", mgr.status(id)))
        .unwrap()
}

/// Poll `cond` on the task's view until it holds, or panic after 5 s.
async fn until(
    mgr: &TaskManager,
    id: &str,
    what: &str,
    cond: impl Fn(&TaskView) -> bool,
) -> TaskView {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = mgr.status(id).unwrap();
        if cond(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "never {what}: {v:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Until the stored record of `id` satisfies `cond`, for at most 5 s.
async fn until_stored(env: &Env, id: &str, what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rec = env.stored(id);
        if cond(&rec) {
            return;
        }
        assert!(Instant::now() < deadline, "never {what}: {rec:#}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_handle_is_durable_before_run_returns() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(v.state, TaskLifecycle::Running);
    if env.fake.finds_tasks_by_id() {
        // Deferred (see `Records::put_task`): the record before the start stands until
        // the next commit, at most 100 ms away.
        until_stored(&env, &v.id, "the handle recorded", |r| {
            r["handle"].is_object()
        })
        .await;
    }
    let rec = env.stored(&v.id);
    assert_eq!(rec["version"], 1);
    assert_eq!(rec["view"]["state"], "running");
    assert!(rec["handle"]["driver_state"].is_array(), "{rec:#}");
    assert_eq!(kinds(&v), ["Received", "Started"]);
    assert_eq!(
        v.events[1].message,
        "task started by driver fake (pid 4242)"
    );
}

#[tokio::test]
async fn a_driver_without_the_group_network_mode_cannot_join_a_bridge_network() {
    let env = Env::new();
    let req = request(serde_json::json!({ "exit_code": 0 }), None);
    let opts = RunOptions {
        id: Some("bridged-1".into()),
        alloc_dir: None,
        netns: Some("/run/netns/some-alloc".into()),
        ports: Vec::new(),
        volumes: Vec::new(),
        devices: Vec::new(),
        device_mounts: Vec::new(),
    };
    let e = env.mgr.run_with(req, opts).await.unwrap_err();
    assert!(matches!(e, DriverError::InvalidConfig(_)), "{e:?}");
    assert!(
        e.to_string().contains("cannot join a bridge network"),
        "{e}"
    );
    assert!(env.fake.s().starts.is_empty(), "nothing started");
}

#[tokio::test]
async fn run_with_takes_the_callers_id_and_alloc_dir_and_changes_are_announced() {
    let env = Env::new();
    let mut changes = env.mgr.subscribe();
    let shared = env.alloc.join("a1/alloc");
    let mut req = request(serde_json::json!({ "exit_code": 0, "after_ms": 50 }), None);
    req.env.insert("DROVER_TASK_NAME".into(), "main".into());
    req.name = Some("web.app[0].main".into());
    let port = drover_plugin_sdk::TaskPort::new("http", 23456)
        .with_to(80)
        .with_host_ip("127.0.0.1");
    let opts = RunOptions {
        id: Some("chosen-1".into()),
        alloc_dir: Some(shared.clone()),
        netns: None,
        ports: vec![port.clone()],
        volumes: Vec::new(),
        devices: Vec::new(),
        device_mounts: Vec::new(),
    };
    let v = env.mgr.run_with(req.clone(), opts.clone()).await.unwrap();
    assert_eq!(v.id, "chosen-1");
    let spec = env.fake.s().starts[0].2.clone();
    assert_eq!(spec.alloc_dir, shared);
    assert_eq!(
        spec.ports,
        [port],
        "the driver learns the allocation's ports"
    );
    assert_eq!(spec.env["DROVER_ALLOC_DIR"], shared.display().to_string());
    assert_eq!(
        spec.env["DROVER_TASK_NAME"], "main",
        "an allocation's task keeps its name in the group"
    );
    // The same id again: refused, nothing started twice.
    let again = env.mgr.run_with(req.clone(), opts).await.unwrap_err();
    assert!(matches!(again, DriverError::AlreadyExists(_)), "{again:?}");
    assert_eq!(env.fake.s().starts.len(), 1);
    // A bad id never becomes a path.
    let bad = RunOptions {
        id: Some("../x".into()),
        alloc_dir: None,
        netns: None,
        ..Default::default()
    };
    assert!(env.mgr.run_with(req.clone(), bad).await.is_err());
    // Outside an allocation, DROVER_TASK_NAME is the task's name, whatever the env says.
    let plain = env.mgr.run(req).await.unwrap();
    let spec = env.fake.s().starts[1].2.clone();
    assert_eq!(spec.env["DROVER_TASK_NAME"], plain.name);
    assert!(!spec.env.contains_key("DROVER_ALLOC_DIR"));

    // Every recorded change of chosen-1 was announced: pending, running, dead.
    wait_dead(&env.mgr, "chosen-1").await;
    let mut seen = 0;
    while let Ok(id) = changes.try_recv() {
        seen += usize::from(id == "chosen-1");
    }
    assert!(seen >= 3, "{seen} announcements of chosen-1");
}

#[tokio::test]
async fn hooks_prepare_dir_env_and_logs() {
    let env = Env::new();
    let mut req = request(serde_json::json!({}), None);
    req.env.insert("DROVER_TASK_ID".into(), "spoofed".into());
    req.env.insert("MINE".into(), "1".into());
    req.logs = Some(drover_api::LogConfig {
        max_files: 3,
        max_file_size_mb: 1,
    });
    req.resources = Some(drover_api::Resources {
        memory_mb: 64,
        ..Default::default()
    });
    let v = env.mgr.run(req).await.unwrap();
    let spec = env.fake.s().starts[0].2.clone();
    let dir = env.alloc.join(&v.id);
    assert_eq!(spec.task_dir, dir);
    for sub in ["local", "tmp", "logs", "secrets"] {
        assert!(dir.join(sub).is_dir(), "{sub} missing");
    }
    let mode = std::fs::metadata(dir.join("secrets"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(spec.env["DROVER_TASK_ID"], v.id, "user env must not win");
    assert_eq!(spec.env["MINE"], "1");
    assert_eq!(spec.env["DROVER_TASK_NAME"], "fake");
    assert_eq!(spec.env["DROVER_TASK_DIR"], dir.display().to_string());
    assert_eq!(
        spec.env["DROVER_SECRETS_DIR"],
        dir.join("secrets").display().to_string()
    );
    assert_eq!(
        spec.env["DROVER_LOCAL_DIR"],
        dir.join("local").display().to_string()
    );
    assert_eq!(spec.stdout_path, dir.join("logs/stdout"));
    assert_eq!(spec.stderr_path, dir.join("logs/stderr"));
    assert_eq!((spec.logs.max_files, spec.logs.max_file_size_mb), (3, 1));
    assert_eq!(spec.resources.memory_mb, 64);
}

#[tokio::test]
async fn invalid_requests_name_the_field_and_create_nothing() {
    let env = Env::new();
    // Request bodies as the API receives them. A duration that is no duration, or one
    // beyond its maximum, is refused while the body is read (`POST /v1/tasks` answers
    // 400 "invalid request body: ..."), naming the field and the text as written; the
    // rest reach the manager, which refuses them as invalid config (also a 400).
    let body = |extra: &str| format!(r#"{{"driver": "fake", "config": {{}}, {extra}}}"#);
    let cases = [
        (
            body(r#""restart": {"attempts": 2, "interval": "1m", "delay": "2m"}"#),
            "restart.delay (2m) must be shorter than restart.interval (1m)",
        ),
        (
            body(r#""restart": {"attempts": 2, "interval": "often", "delay": "1s"}"#),
            "restart.interval \"often\"",
        ),
        (
            body(r#""logs": {"max_files": 0, "max_file_size_mb": 1}"#),
            "logs.max_files",
        ),
        (body(r#""kill_timeout": "soon""#), "kill_timeout"),
        (
            body(r#""kill_timeout": "100000000y""#),
            "kill_timeout \"100000000y\" is longer than the maximum",
        ),
        (
            body(r#""restart": {"attempts": 2, "interval": "20000y", "delay": "10000y"}"#),
            "restart.interval \"20000y\" is longer than the maximum",
        ),
    ];
    for (body, want) in cases {
        let e = match serde_json::from_str::<RunRequest>(&body) {
            Err(e) => e.to_string(),
            Ok(req) => {
                let e = env.mgr.run(req).await.unwrap_err();
                assert!(matches!(e, DriverError::InvalidConfig(_)), "{e:?}");
                e.to_string()
            }
        };
        assert!(e.contains(want), "{body}: {e} does not name {want}");
    }
    // The same limits hold for a request built in code.
    let cases = [
        (
            RunRequest {
                kill_timeout: Some(Duration::from_secs(2 * 24 * 3600)),
                ..request(serde_json::json!({}), None)
            },
            "kill_timeout \"2days\" is longer than the maximum of 1day",
        ),
        (
            request(
                serde_json::json!({}),
                policy(2, "20000y", "1s", RestartMode::Fail),
            ),
            "restart.interval \"20000years\" is longer than the maximum",
        ),
    ];
    for (req, want) in cases {
        let e = env.mgr.run(req).await.unwrap_err();
        assert!(matches!(e, DriverError::InvalidConfig(_)), "{e:?}");
        assert!(e.to_string().contains(want), "{e} does not name {want}");
    }
    assert!(env.mgr.list().is_empty());
    assert!(env.store.tasks().unwrap().is_empty());
    assert!(env.fake.s().starts.is_empty());
    assert_eq!(std::fs::read_dir(&env.alloc).unwrap().count(), 0);
}

#[tokio::test]
async fn crash_loop_follows_fail_mode_exactly() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({"exit_code": 3}),
            policy(2, "1m", "50ms", RestartMode::Fail),
        ))
        .await
        .unwrap();
    let dead = wait_dead(&env.mgr, &v.id).await;
    let starts = env.fake.starts(&v.id);
    assert_eq!(starts.len(), 3, "{dead:#?}");
    for pair in starts.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(50),
            "restart came too soon"
        );
    }
    assert_eq!(
        kinds(&dead),
        [
            "Received",
            "Started",
            "Terminated",
            "Restarting",
            "Started",
            "Terminated",
            "Restarting",
            "Started",
            "Terminated",
            "NotRestarting"
        ]
    );
    let msgs: Vec<&str> = dead.events.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(msgs[3], "restarting in 50ms, attempt 1 of 2");
    assert_eq!(msgs[6], "restarting in 50ms, attempt 2 of 2");
    assert_eq!(msgs[8], "exit code 3");
    assert_eq!(msgs[9], "exceeded 2 attempts in 1m (mode fail)");
    assert_eq!(dead.state, TaskLifecycle::Dead);
    assert_eq!(dead.exit_code, Some(3));
    assert_eq!(dead.restarts, 2);
    // Each restart removed the previous incarnation from the driver first.
    assert_eq!(env.fake.s().destroys.len(), 2);
    assert_eq!(env.stored(&v.id)["view"]["state"], "dead");
}

#[tokio::test]
async fn delay_mode_waits_for_the_interval_then_restarts_again() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({"exit_code": 1}),
            policy(1, "600ms", "20ms", RestartMode::Delay),
        ))
        .await
        .unwrap();
    // start 1, restart (1 of 1) after 20ms, start 2, exceeded → wait for the window
    // (opened at the first exit) to close, start 3 …
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.fake.starts(&v.id).len() < 4 {
        assert!(Instant::now() < deadline, "{:#?}", env.mgr.status(&v.id));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopped = env.mgr.stop(&v.id, None, None).await.unwrap();
    let starts = env.fake.starts(&v.id);
    assert!(starts[1] - starts[0] < Duration::from_millis(400));
    assert!(
        starts[2] - starts[0] >= Duration::from_millis(550),
        "the delayed restart did not wait for the interval: {:?}",
        starts[2] - starts[0]
    );
    let delayed = stopped
        .events
        .iter()
        .find(|e| e.kind == "Restarting" && e.message.contains("mode delay"))
        .unwrap_or_else(|| panic!("no delay-mode event: {stopped:#?}"));
    assert!(
        delayed
            .message
            .starts_with("exceeded 1 attempts in 600ms; restarting in")
    );
    assert!(!kinds(&stopped).contains(&"NotRestarting"));
    assert_eq!(stopped.state, TaskLifecycle::Dead);
}

#[tokio::test]
async fn success_is_not_restarted() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({"exit_code": 0}),
            policy(5, "1m", "10ms", RestartMode::Delay),
        ))
        .await
        .unwrap();
    let dead = wait_dead(&env.mgr, &v.id).await;
    assert_eq!(env.fake.starts(&v.id).len(), 1);
    assert_eq!(kinds(&dead), ["Received", "Started", "Terminated"]);
    assert_eq!(dead.exit_code, Some(0));
}

#[tokio::test]
async fn stop_during_the_restart_delay_cancels_the_restart() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({"exit_code": 2}),
            policy(3, "1h", "30s", RestartMode::Fail),
        ))
        .await
        .unwrap();
    until(&env.mgr, &v.id, "pending a restart", |v| {
        v.state == TaskLifecycle::Pending && v.restart_at.is_some()
    })
    .await;
    let t = Instant::now();
    let stopped = env.mgr.stop(&v.id, None, None).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "stop waited for the delay"
    );
    assert_eq!(stopped.state, TaskLifecycle::Dead);
    assert_eq!(
        kinds(&stopped),
        [
            "Received",
            "Started",
            "Terminated",
            "Restarting",
            "Killing",
            "Killed"
        ]
    );
    assert_eq!(env.fake.starts(&v.id).len(), 1);
    assert_eq!(stopped.exit_code, Some(2));
}

#[tokio::test]
async fn user_stop_is_never_restarted() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({}),
            policy(3, "1h", "10ms", RestartMode::Fail),
        ))
        .await
        .unwrap();
    let stopped = env.mgr.stop(&v.id, None, None).await.unwrap();
    assert_eq!(stopped.signal, Some(15));
    assert_eq!(
        kinds(&stopped),
        ["Received", "Started", "Killing", "Terminated", "Killed"]
    );
    assert_eq!(env.fake.starts(&v.id).len(), 1);
    // Stopping again is harmless.
    env.mgr.stop(&v.id, None, None).await.unwrap();
}

#[tokio::test]
async fn a_stop_lost_in_transport_is_sent_again_while_the_plugin_lives() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.fake.s().lose_stops = 2;
    // The runner's WaitTask is fine all along, so only the stop itself can send the
    // stop again; a kill timeout of 1 s bounds the whole call at 11 s.
    let stopped = env
        .mgr
        .stop(&v.id, None, Some(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(stopped.signal, Some(15));
    assert_eq!(
        env.fake.s().stops.len(),
        3,
        "two lost StopTask calls, then one that acted"
    );
    assert_eq!(env.fake.starts(&v.id).len(), 1);
}

#[tokio::test]
async fn recovery_reattaches_without_restarting_and_reports_the_real_exit() {
    let env = Env::new();
    let long = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    let done = env
        .mgr
        .run(request(serde_json::json!({"exit_code": 4}), None))
        .await
        .unwrap();
    wait_dead(&env.mgr, &done.id).await;
    let short = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();

    // The agent dies; meanwhile `short` exits with 9; a new agent starts.
    env.fake.new_process();
    env.fake.exit(&short.id, 9);
    let mgr = env.restart_agent();
    assert_eq!(mgr.load().unwrap(), 3);
    // Stored tasks are visible before recovery, as they were.
    assert_eq!(mgr.status(&long.id).unwrap().state, TaskLifecycle::Running);
    let summary = mgr.recover().await;
    assert_eq!((summary.tasks, summary.recovered), (2, 2), "{summary:?}");

    let short_v = wait_dead(&mgr, &short.id).await;
    assert_eq!(short_v.exit_code, Some(9));
    assert!(kinds(&short_v).ends_with(&["Recovered", "Terminated"]));
    let long_v = mgr.status(&long.id).unwrap();
    assert_eq!(long_v.state, TaskLifecycle::Running);
    assert_eq!(mgr.status(&done.id).unwrap().exit_code, Some(4));
    // Nothing was started twice.
    for id in [&long.id, &short.id, &done.id] {
        assert_eq!(env.fake.starts(id).len(), 1, "{id} started again");
    }
    // The recovered task is fully usable.
    let stopped = mgr.stop(&long.id, None, None).await.unwrap();
    assert_eq!(stopped.signal, Some(15));
    // A second recover does nothing.
    assert_eq!(mgr.recover().await, RecoverySummary::default());
}

/// Rewrite a stored record as if the agent died after sending StartTask but before
/// storing the reply.
fn forget_handle(env: &Env, id: &str) {
    env.settle();
    let mut rec = env.stored(id);
    rec["handle"] = serde_json::Value::Null;
    rec["view"]["state"] = "pending".into();
    env.store
        .put_task(id, &serde_json::to_vec(&rec).unwrap())
        .unwrap();
}

#[tokio::test]
async fn pending_without_handle_is_found_by_id_not_started_twice() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    forget_handle(&env, &v.id);
    env.fake.new_process();
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    assert_eq!(mgr.status(&v.id).unwrap().state, TaskLifecycle::Pending);
    let summary = mgr.recover().await;
    assert_eq!(summary.recovered, 1, "{summary:?}");
    assert_eq!(env.fake.starts(&v.id).len(), 1);
    let now = mgr.status(&v.id).unwrap();
    assert_eq!(now.state, TaskLifecycle::Running);
    assert_eq!(now.attributes["pid"], "4242");
    assert!(
        env.stored(&v.id)["handle"].is_object(),
        "adopted handle not stored"
    );
    env.fake.exit(&v.id, 6);
    assert_eq!(wait_dead(&mgr, &v.id).await.exit_code, Some(6));
}

#[tokio::test]
async fn pending_without_handle_that_never_started_is_started_once() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    forget_handle(&env, &v.id);
    // As if StartTask never reached the driver.
    env.fake.new_process();
    env.fake.lose(&v.id);
    env.fake.s().starts.clear();
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = mgr.recover().await;
    assert_eq!(summary.started, 1, "{summary:?}");
    assert_eq!(env.fake.starts(&v.id).len(), 1);
    let now = mgr.status(&v.id).unwrap();
    assert_eq!(now.state, TaskLifecycle::Running);
    assert!(kinds(&now).ends_with(&["Recovered", "Started"]), "{now:#?}");
}

#[tokio::test]
async fn a_lost_executor_is_a_clear_event_not_a_hang() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.fake.new_process();
    env.fake.lose(&v.id);
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(5), mgr.recover())
        .await
        .expect("recovery hung");
    assert_eq!(summary.dead, 1, "{summary:?}");
    let dead = mgr.status(&v.id).unwrap();
    assert_eq!(dead.state, TaskLifecycle::Dead);
    let failure = dead.events.last().unwrap();
    assert_eq!(failure.kind, "DriverFailure");
    assert!(
        failure.message.contains("its socket is gone"),
        "{failure:?}"
    );
    assert!(dead.error.as_deref().unwrap().contains("could not recover"));
    assert_eq!(dead.exit_code, None);
    assert_eq!(env.stored(&v.id)["view"]["state"], "dead");
}

#[tokio::test]
async fn a_hanging_recover_keeps_the_task_running_and_retries() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.fake.new_process();
    env.fake.s().hang_recover = true;
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(5), mgr.recover())
        .await
        .expect("recovery hung");
    assert_eq!(summary.waiting, 1, "{summary:?}");
    let now = mgr.status(&v.id).unwrap();
    assert_eq!(now.state, TaskLifecycle::Running, "{now:#?}");
    let failure = now.events.last().unwrap();
    assert_eq!(failure.kind, "DriverFailure");
    assert!(
        failure
            .message
            .contains("did not answer RecoverTask within 300ms"),
        "{failure:?}"
    );
    assert_eq!(env.stored(&v.id)["view"]["state"], "running");
    env.fake.s().hang_recover = false;
    let back = until(&mgr, &v.id, "recovered", |v| {
        v.events.last().is_some_and(|e| e.kind == "Recovered")
    })
    .await;
    assert_eq!(back.state, TaskLifecycle::Running);
    env.fake.exit(&v.id, 4);
    assert_eq!(wait_dead(&mgr, &v.id).await.exit_code, Some(4));
    assert_eq!(env.fake.starts(&v.id).len(), 1);
}

#[tokio::test]
async fn an_alive_but_unreachable_executor_keeps_the_task_running_and_undestroyable() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.fake.new_process();
    let why = "cannot reach the executor at /x/sock; the executor is alive but its socket is gone";
    env.fake.s().recover_error = Some(DriverError::FailedPrecondition(why.into()));
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(5), mgr.recover())
        .await
        .expect("recovery hung");
    assert_eq!(summary.waiting, 1, "{summary:?}");
    let now = mgr.status(&v.id).unwrap();
    assert_eq!(now.state, TaskLifecycle::Running, "{now:#?}");
    assert_eq!(now.exit_code, None);
    let failure = now.events.last().unwrap();
    assert_eq!(failure.kind, "DriverFailure");
    assert!(failure.message.contains("/x/sock"), "{failure:?}");
    // Forgetting it now would leak its process: refused, saying why.
    let e = mgr.destroy(&v.id, true).await.unwrap_err();
    assert!(
        matches!(&e, DriverError::Unavailable(m) if m.contains("/x/sock")),
        "{e:?}"
    );
    assert!(mgr.status(&v.id).is_ok());
    // Once the executor can be reached again, the task is recovered, not restarted.
    env.fake.s().recover_error = None;
    until(&mgr, &v.id, "recovered", |v| {
        v.events.last().is_some_and(|e| e.kind == "Recovered")
    })
    .await;
    mgr.destroy(&v.id, true).await.unwrap();
    assert_eq!(env.fake.s().destroys, vec![v.id.clone()]);
    assert_eq!(env.fake.starts(&v.id).len(), 1);
}

#[tokio::test]
async fn a_start_whose_caller_went_away_is_finished_and_watched() {
    let env = Env::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    env.fake.s().start_gate = Some(gate.clone());
    let mgr = env.mgr.clone();
    let call = tokio::spawn(async move {
        mgr.run(request(serde_json::json!({"exit_code": 3}), None))
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.fake.s().start_calls == 0 {
        assert!(Instant::now() < deadline, "StartTask never called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The HTTP client disconnects: its request future is dropped mid-StartTask.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    let list = env.mgr.list();
    assert_eq!(list.len(), 1);
    let dead = wait_dead(&env.mgr, &list[0].id).await;
    assert_eq!(dead.exit_code, Some(3), "{dead:#?}");
}

#[tokio::test]
async fn a_start_broken_by_a_transport_error_is_asked_not_forgotten() {
    let env = Env::new();
    env.fake.s().crash_in_start = Some(DriverError::Transport("h2 protocol error".into()));
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .expect("a start that may have happened must not be reported as failed");
    assert_eq!(v.state, TaskLifecycle::Pending);
    assert!(v.task_dir.exists(), "the task directory was deleted");
    env.fake.relaunch();
    let now = until(&env.mgr, &v.id, "running", |v| {
        v.state == TaskLifecycle::Running
    })
    .await;
    assert_eq!(env.fake.starts(&v.id).len(), 1, "{now:#?}");
    env.fake.exit(&v.id, 0);
    assert_eq!(wait_dead(&env.mgr, &v.id).await.exit_code, Some(0));
}

#[tokio::test]
async fn a_restart_broken_by_a_transport_error_is_not_a_failed_attempt() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({"exit_code": 1}),
            policy(1, "1h", "10ms", RestartMode::Fail),
        ))
        .await
        .unwrap();
    env.fake.s().crash_in_start = Some(DriverError::Transport("h2 protocol error".into()));
    until(&env.mgr, &v.id, "failing the restart", |v| {
        v.events.iter().any(|e| e.kind == "DriverFailure")
    })
    .await;
    env.fake.relaunch();
    until(&env.mgr, &v.id, "running again", |v| {
        v.state == TaskLifecycle::Running
    })
    .await;
    // The restarted incarnation exits 1 again: attempts are used up then, not before.
    env.fake.exit(&v.id, 1);
    let dead = wait_dead(&env.mgr, &v.id).await;
    assert_eq!(env.fake.starts(&v.id).len(), 2, "{dead:#?}");
    assert_eq!(dead.exit_code, Some(1), "{dead:#?}");
    assert!(kinds(&dead).contains(&"Recovered"), "{dead:#?}");
}

#[tokio::test]
async fn a_wedged_start_task_is_bounded_and_probed() {
    let env = Env::new();
    env.fake.s().start_gate = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    let e = tokio::time::timeout(
        Duration::from_secs(5),
        env.mgr.run(request(serde_json::json!({}), None)),
    )
    .await
    .expect("run hung on a wedged driver")
    .unwrap_err();
    // The probe found nothing: it never started, so the caller hears the timeout.
    assert!(
        matches!(&e, DriverError::Timeout(m) if m.contains("StartTask")),
        "{e:?}"
    );
    assert!(env.mgr.list().is_empty());
    assert!(env.store.tasks().unwrap().is_empty());
}

#[tokio::test]
async fn destroy_force_without_its_driver_is_refused() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.fake.s().unloaded = true;
    let e = env.mgr.destroy(&v.id, true).await.unwrap_err();
    assert!(
        matches!(&e, DriverError::Unavailable(m) if m.contains("not loaded")),
        "{e:?}"
    );
    assert!(env.mgr.status(&v.id).is_ok());
    assert!(v.task_dir.exists());
    env.fake.s().unloaded = false;
    env.mgr.destroy(&v.id, true).await.unwrap();
    assert!(!v.task_dir.exists());
}

#[tokio::test]
async fn plugin_crash_at_runtime_is_survived() {
    plugin_crash(false).await;
}

#[tokio::test]
async fn plugin_crash_breaking_the_connection_is_survived() {
    plugin_crash(true).await;
}

async fn plugin_crash(breaks_connection: bool) {
    let env = Env::new();
    env.fake.s().crash_breaks_connection = breaks_connection;
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    until_waiting(&env.fake, &v.id).await;
    env.fake.crash();
    until(&env.mgr, &v.id, "reporting the driver failure", |v| {
        v.events.iter().any(|e| e.kind == "DriverFailure")
    })
    .await;
    assert_eq!(env.mgr.status(&v.id).unwrap().state, TaskLifecycle::Running);
    env.fake.relaunch();
    until(&env.mgr, &v.id, "recovered", |v| {
        v.events.last().is_some_and(|e| e.kind == "Recovered")
    })
    .await;
    env.fake.exit(&v.id, 5);
    let dead = wait_dead(&env.mgr, &v.id).await;
    assert_eq!(dead.exit_code, Some(5));
    assert_eq!(
        kinds(&dead),
        [
            "Received",
            "Started",
            "DriverFailure",
            "Recovered",
            "Terminated"
        ]
    );
    assert_eq!(env.fake.starts(&v.id).len(), 1);
}

#[tokio::test]
async fn a_stop_while_the_agent_was_down_is_finished_by_recovery() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    // The stop was recorded, then the agent died before the driver acted.
    env.settle();
    let mut rec = env.stored(&v.id);
    rec["kill"] = serde_json::json!({"signal": "SIGINT", "timeout": {"secs": 1, "nanos": 0}});
    env.store
        .put_task(&v.id, &serde_json::to_vec(&rec).unwrap())
        .unwrap();
    env.fake.new_process();
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    mgr.recover().await;
    let dead = wait_dead(&mgr, &v.id).await;
    assert_eq!(dead.signal, Some(15), "the fake reports 15 for any stop");
    assert!(kinds(&dead).ends_with(&["Recovered", "Terminated", "Killed"]));
}

#[tokio::test]
async fn a_failed_record_write_leaves_nothing_running() {
    // Write 1 is the pending record: it fails, nothing is started (a driver that needs
    // its handle to find a task: the record is written before the start).
    let store = Arc::new(FlakyStore::default());
    store.fail_put.store(1, Ordering::SeqCst);
    let env = Env::with_store(store.clone());
    env.fake.s().by_id = Some(false);
    let e = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("disk full"), "{e}");
    assert!(env.fake.s().starts.is_empty());

    // Write 2 (of the next run: 3) records the handle: the started task is destroyed.
    store.fail_put.store(3, Ordering::SeqCst);
    let e = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("after starting it"), "{e}");
    let s = env.fake.s();
    assert_eq!(s.starts.len(), 1);
    assert_eq!(s.destroys.len(), 1, "the started task was left running");
    assert!(s.tasks.is_empty());
    drop(s);
    assert!(env.mgr.list().is_empty());
    assert!(env.store.tasks().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&env.alloc).unwrap().count(), 0);
}

#[tokio::test]
async fn a_failed_pending_record_destroys_what_the_overlapping_start_started() {
    // A driver that finds tasks by id starts the task while the pending record is
    // written: when that write fails, the caller hears so and nothing runs.
    let store = Arc::new(FlakyStore::default());
    store.fail_put.store(1, Ordering::SeqCst);
    let env = Env::with_store(store.clone());
    env.fake.s().by_id = Some(true);
    let e = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("before starting it") && e.to_string().contains("disk full"),
        "{e}"
    );
    let s = env.fake.s();
    assert_eq!(s.starts.len(), 1, "the start ran beside the write");
    assert_eq!(s.destroys.len(), 1, "the started task was left running");
    assert!(s.tasks.is_empty());
    drop(s);
    assert!(env.mgr.list().is_empty());
    assert!(env.store.tasks().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&env.alloc).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(starting_dir(&env)).unwrap().count(), 0);
}

/// The one start intent there is: its id, record and permission bits.
fn the_intent(env: &Env) -> (String, TaskRecord, u32) {
    let intents: Vec<_> = std::fs::read_dir(starting_dir(env))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(intents.len(), 1, "{intents:?}");
    let id = intents[0].file_name().into_string().unwrap();
    let mode = intents[0].metadata().unwrap().permissions().mode() & 0o777;
    let rec = TaskRecord::decode(&id, &std::fs::read(intents[0].path()).unwrap()).unwrap();
    (id, rec, mode)
}

/// An agent whose store fails its `put_task` number `n` (1-based).
fn env_failing_put(n: usize) -> Env {
    let store = Arc::new(FlakyStore::default());
    store.fail_put.store(n, Ordering::SeqCst);
    Env::with_store(store)
}

/// The error of a start that must fail.
async fn failed_start(env: &Env) -> String {
    env.mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap_err()
        .to_string()
}

/// The stored record of `id`, with a user's stop in it (SIGTERM, 5 s).
fn stopping_record(env: &Env, id: &str) -> TaskRecord {
    let mut rec: TaskRecord = serde_json::from_value(env.stored(id)).unwrap();
    rec.kill = Some(KillRequest {
        signal: "SIGTERM".into(),
        timeout: Duration::from_secs(5),
    });
    rec
}

/// A task started through `env` (a driver that wants its handle unless `by_id`), and
/// the agent died after writing a stop into its start intent: the task's id and the
/// record that intent holds.
async fn started_with_a_stopping_intent(env: &Env, by_id: bool) -> (String, TaskRecord) {
    env.fake.s().by_id = Some(by_id);
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.settle();
    let rec = stopping_record(env, &v.id);
    std::fs::write(starting_dir(env).join(&v.id), rec.encode().unwrap()).unwrap();
    (v.id, rec)
}

#[tokio::test]
async fn a_started_task_neither_recorded_nor_destroyed_is_stopped_not_lost() {
    // The pending record's durable write fails while the start succeeds, and
    // DestroyTask fails too: the caller hears "failed", so the task must not run on,
    // and no agent may forget it meanwhile.
    let env = env_failing_put(1);
    env.fake.s().by_id = Some(true);
    env.fake.s().fail_destroys = 1;
    let e = failed_start(&env).await;
    assert!(
        e.contains("before starting it") && e.contains("destroying it failed too"),
        "{e}"
    );
    // An agent that died now would find the stop in the intent.
    let (id, rec, _) = the_intent(&env);
    assert!(rec.kill.is_some(), "the intent does not ask for the stop");
    // This one stops the task through the driver, and keeps it listed until then.
    let dead = wait_dead(&env.mgr, &id).await;
    assert!(env.fake.s().stops.contains(&id), "never stopped");
    assert_eq!(dead.signal, Some(15), "{dead:#?}");
    assert!(
        dead.events
            .iter()
            .any(|e| e.message.contains("destroying it failed too")),
        "{dead:#?}"
    );
    assert_eq!(env.fake.starts(&id).len(), 1);
}

/// A tmpfs of `size` mounted on a directory, unmounted (and the directory removed)
/// when dropped: a disk that can be filled.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> SmallTmpfs {
        rustix::mount::mount(
            "tmpfs",
            dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            Some(
                std::ffi::CString::new(format!("size={size},mode=0700"))
                    .unwrap()
                    .as_c_str(),
            ),
        )
        .expect("mount a tmpfs");
        SmallTmpfs(dir.to_owned())
    }

    /// Fill it but for one page: an empty file still fits, and one small file.
    fn fill_but_one_page(&self) {
        use std::io::Write as _;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let page = vec![0u8; rustix::param::page_size()];
        while f.write_all(&page).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len - page.len() as u64).unwrap();
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test]
async fn a_stop_that_fits_nowhere_else_is_kept_in_an_empty_marker() {
    // A full disk: the pending record fails to land (the store), the task started,
    // DestroyTask fails, and then neither the record nor a new intent with the stop
    // can be written. An agent that died then would recover a task its caller was told
    // failed as running; an empty marker file (no data block needed) keeps the stop.
    if !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "a full disk is a tmpfs mounted by the test: it needs root (CI=true: a failure)"
        );
        eprintln!("SKIPPED: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Sixteen pages, whatever the page size.
    let disk = SmallTmpfs::mount(dir.path(), &(16 * rustix::param::page_size()).to_string());
    let store = Arc::new(FlakyStore::default());
    store.fail_from.store(1, Ordering::SeqCst);
    let env = Env::with_store_in(dir, store.clone());
    env.fake.s().by_id = Some(true);
    env.fake.s().fail_destroys = 1;
    disk.fill_but_one_page();
    let e = failed_start(&env).await;
    assert!(e.contains("destroying it failed too"), "{e}");
    // What an agent that died now would leave: the first intent (without the stop),
    // no record, and the marker. Copied to a second agent's dirs and store at once,
    // before this agent's runner can act.
    let (id, rec, _) = {
        let intents: Vec<_> = std::fs::read_dir(starting_dir(&env))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        let id = intents
            .iter()
            .find(|n| !n.contains('+'))
            .unwrap_or_else(|| panic!("{intents:?}"))
            .clone();
        assert!(
            intents.contains(&format!("{id}+stop")),
            "no stop marker: {intents:?}"
        );
        let bytes = std::fs::read(starting_dir(&env).join(&id)).unwrap();
        (id.clone(), TaskRecord::decode(&id, &bytes).unwrap(), bytes)
    };
    assert!(rec.kill.is_none(), "the intent holds the stop after all");
    assert!(store.tasks().unwrap().is_empty(), "a record landed");
    let next = Env::new();
    next.fake.s().by_id = Some(true);
    for name in [id.clone(), format!("{id}+stop")] {
        std::fs::copy(
            starting_dir(&env).join(&name),
            starting_dir(&next).join(&name),
        )
        .unwrap();
    }

    let mgr = next.restart_agent();
    mgr.load().unwrap();
    assert!(
        next.stored(&id)["kill"].is_object(),
        "the next agent did not take the stop: {}",
        next.stored(&id)
    );
    assert_eq!(
        std::fs::read_dir(starting_dir(&next)).unwrap().count(),
        0,
        "the intent or the marker stayed"
    );
    // And goes by it: the task (unknown to this driver, so never started as far as
    // it can tell) is not started again, but ends.
    mgr.recover().await;
    let dead = wait_dead(&mgr, &id).await;
    assert!(next.fake.starts(&id).is_empty(), "started again: {dead:#?}");
    drop(env);
    drop(disk);
}

#[tokio::test]
async fn a_task_whose_handle_cannot_be_recorded_nor_destroyed_is_stopped_not_forgotten() {
    // Write 2 records the handle after the start (durably: a driver that needs its
    // handle); it fails, and so does DestroyTask: the durable pending record is kept
    // (with the stop), not deleted.
    let env = env_failing_put(2);
    env.fake.s().by_id = Some(false);
    env.fake.s().fail_destroys = 1;
    let e = failed_start(&env).await;
    assert!(
        e.contains("after starting it") && e.contains("destroying it failed too"),
        "{e}"
    );
    let id = env.fake.s().starts[0].0.clone();
    let dead = wait_dead(&env.mgr, &id).await;
    assert!(env.fake.s().stops.contains(&id), "never stopped");
    assert_eq!(dead.signal, Some(15), "{dead:#?}");
    assert!(env.stored(&id)["kill"].is_object(), "{}", env.stored(&id));
}

#[tokio::test]
async fn a_deferred_handle_write_that_fails_leaves_the_task_running_and_findable() {
    // A driver that finds its tasks by id: the record that adds the handle is deferred,
    // and its failure fails nobody. The task runs on; the record before the start
    // stays, and is what the next agent probes the driver with.
    let store = Arc::new(FlakyStore::default());
    store.fail_put.store(2, Ordering::SeqCst);
    let env = Env::with_store(store.clone());
    env.fake.s().by_id = Some(true);
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(v.state, TaskLifecycle::Running);
    // The deferred write is tried within its bound (on its own: nothing else is
    // written), and fails.
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.puts.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the deferred write was never tried"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(env.fake.s().destroys.is_empty(), "destroyed a running task");
    assert_eq!(env.mgr.status(&v.id).unwrap().state, TaskLifecycle::Running);
    assert!(
        env.stored(&v.id)["handle"].is_null(),
        "{}",
        env.stored(&v.id)
    );
    env.fake.new_process();
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = mgr.recover().await;
    assert_eq!(summary.recovered, 1, "{summary:?}");
    assert_eq!(env.fake.starts(&v.id).len(), 1, "started a second time");
}

#[tokio::test]
async fn a_stop_in_an_intent_is_obeyed_by_the_next_agent_whose_record_landed() {
    // The agent died after writing the stop into the intent but before its record
    // said so (the record is the pending one, or the running one): the next agent
    // stops the task rather than recovering it as running.
    let env = Env::new();
    let (id, _) = started_with_a_stopping_intent(&env, true).await;
    // And a replacement never renamed into place: not an intent.
    std::fs::write(starting_dir(&env).join(format!("{id}+new")), b"{").unwrap();
    env.fake.new_process();

    let mgr = env.restart_agent();
    mgr.load().unwrap();
    assert!(
        env.stored(&id)["kill"].is_object(),
        "the stop was not recorded"
    );
    mgr.recover().await;
    let dead = wait_dead(&mgr, &id).await;
    assert_eq!(dead.signal, Some(15), "{dead:#?}");
    assert!(env.fake.s().stops.contains(&id));
    assert_eq!(env.fake.starts(&id).len(), 1);
    assert_eq!(std::fs::read_dir(starting_dir(&env)).unwrap().count(), 0);
}

#[tokio::test]
async fn a_stopping_intent_newer_than_the_record_brings_its_handle() {
    // A driver that needs its handle (Nomad's): the handle's record failed after the
    // start, DestroyTask failed, and the agent died with the stop (and the handle) only
    // in the intent; the store holds the pending record, without a handle. The next
    // agent must take the intent whole, or it could never reach the task.
    let env = Env::new();
    let (id, rec) = started_with_a_stopping_intent(&env, false).await;
    assert!(rec.handle.is_some());
    env.store.put_task(&id, &start_intent(&env, &id)).unwrap();
    // A file that is no intent is left alone, not deleted.
    std::fs::write(starting_dir(&env).join("not an id"), b"x").unwrap();
    env.fake.new_process();

    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let stored = env.stored(&id);
    assert!(
        stored["handle"].is_object(),
        "the handle was lost: {stored}"
    );
    assert!(stored["kill"].is_object(), "the stop was lost: {stored}");
    mgr.recover().await;
    let dead = wait_dead(&mgr, &id).await;
    assert_eq!(dead.signal, Some(15), "{dead:#?}");
    assert!(starting_dir(&env).join("not an id").exists());
}

#[tokio::test]
async fn the_driver_starts_the_task_while_its_record_is_written_and_the_intent_holds_it() {
    let store = Arc::new(FlakyStore::default());
    let (open, gate) = std::sync::mpsc::channel();
    *store.gate.lock().unwrap() = Some(gate);
    let env = Env::with_store(store.clone());
    env.fake.s().by_id = Some(true);
    let mgr = env.mgr.clone();
    let run = tokio::spawn(async move { mgr.run(request(serde_json::json!({}), None)).await });
    // The durable write is held: the start goes on all the same.
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.fake.s().starts.is_empty() {
        assert!(
            Instant::now() < deadline,
            "StartTask waited for the record's write"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Meanwhile the intent is there, whole: the pending task, no handle, which the
    // next agent would read should this one die now.
    let (id, rec, mode) = the_intent(&env);
    assert_eq!(mode, 0o600);
    assert!(rec.handle.is_none());
    assert_eq!(rec.view.state, TaskLifecycle::Pending);
    assert!(!run.is_finished(), "answered before the record was durable");
    open.send(()).unwrap();
    let v = run.await.unwrap().unwrap();
    assert_eq!(v.id, id);
    assert_eq!(std::fs::read_dir(starting_dir(&env)).unwrap().count(), 0);
}

#[tokio::test]
async fn attributes_sent_with_the_start_spare_an_inspect() {
    let env = Env::new();
    env.fake.s().reports_attributes = true;
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(v.attributes.get("pid").map(String::as_str), Some("4343"));
    assert_eq!(env.fake.s().inspects, 0, "InspectTask asked all the same");
    // A driver that sends none is asked.
    env.fake.s().reports_attributes = false;
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(v.attributes.get("pid").map(String::as_str), Some("4242"));
    assert_eq!(env.fake.s().inspects, 1);
}

/// What the start of `id` wrote to `starting/<id>` before its StartTask: its record
/// as it was then, pending and without a handle.
fn start_intent(env: &Env, id: &str) -> Vec<u8> {
    let task = env.mgr.entry(id).unwrap();
    let mut rec = task.rec().clone();
    rec.handle = None;
    rec.view.state = TaskLifecycle::Pending;
    rec.view.attributes.clear();
    rec.view.started_at = None;
    rec.encode().unwrap()
}

fn starting_dir(env: &Env) -> PathBuf {
    env.alloc.with_file_name(STARTING_DIR)
}

#[tokio::test]
async fn a_start_whose_record_never_landed_is_recovered_from_its_intent() {
    let env = Env::new();
    env.fake.s().by_id = Some(true);
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_dir(starting_dir(&env)).unwrap().count(),
        0,
        "the start intent outlived the durable record"
    );
    // The agent died while the pending record was on its way to the disk: the task
    // runs, its intent is there, its record is not.
    env.settle();
    std::fs::write(starting_dir(&env).join(&v.id), start_intent(&env, &v.id)).unwrap();
    env.store.delete_task(&v.id).unwrap();
    env.fake.new_process();

    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = mgr.recover().await;
    assert_eq!(summary.recovered, 1, "{summary:?}");
    assert_eq!(env.fake.starts(&v.id).len(), 1, "started a second time");
    let t = mgr.status(&v.id).unwrap();
    assert_eq!(t.state, TaskLifecycle::Running, "{t:#?}");
    assert_eq!(env.stored(&v.id)["view"]["id"], v.id.as_str());
    assert!(!starting_dir(&env).join(&v.id).exists());
}

#[tokio::test]
async fn an_intent_whose_start_never_reached_the_driver_is_started_once() {
    let env = Env::new();
    env.fake.s().by_id = Some(true);
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    env.settle();
    std::fs::write(starting_dir(&env).join(&v.id), start_intent(&env, &v.id)).unwrap();
    env.store.delete_task(&v.id).unwrap();
    // The driver never got that StartTask.
    env.fake.lose(&v.id);
    env.fake.new_process();
    // And an intent cut short while it was written: its StartTask was never sent.
    std::fs::write(starting_dir(&env).join("cut"), b"{\"version\": 1, \"req").unwrap();

    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = mgr.recover().await;
    assert_eq!(summary.started, 1, "{summary:?}");
    assert_eq!(
        env.fake.starts(&v.id).len(),
        2,
        "the recovering agent starts it once"
    );
    assert_eq!(mgr.status(&v.id).unwrap().state, TaskLifecycle::Running);
    assert!(mgr.status("cut").is_err());
    assert_eq!(std::fs::read_dir(starting_dir(&env)).unwrap().count(), 0);
}

#[tokio::test]
async fn an_intent_this_agent_cannot_read_stops_the_load() {
    let env = Env::new();
    std::fs::create_dir_all(starting_dir(&env)).unwrap();
    std::fs::write(
        starting_dir(&env).join("t9"),
        br#"{"version": 99, "whatever": true}"#,
    )
    .unwrap();
    let e = env.restart_agent().load().unwrap_err().to_string();
    assert!(
        e.contains("start intent") && e.contains("move the file aside"),
        "{e}"
    );
    assert!(
        starting_dir(&env).join("t9").exists(),
        "the intent was lost"
    );
}

#[tokio::test]
async fn an_unreadable_intent_beside_its_record_is_kept_aside_not_deleted() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    // A newer agent's intent for a task whose record landed: whole, but not a record
    // this agent reads.
    let newer = br#"{"version": 99, "kill": {"signal": "SIGTERM"}}"#;
    std::fs::write(starting_dir(&env).join(&v.id), newer).unwrap();
    env.fake.new_process();

    let mgr = env.restart_agent();
    mgr.load().unwrap();
    assert_eq!(
        mgr.status(&v.id).unwrap().id,
        v.id,
        "the record was not loaded"
    );
    let aside = starting_dir(&env).join(format!("{}+unreadable", v.id));
    assert_eq!(std::fs::read(&aside).unwrap(), newer, "the intent was lost");
    assert!(!starting_dir(&env).join(&v.id).exists());
    // Kept until someone deletes it: the next agent loads and leaves it.
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    assert_eq!(std::fs::read(&aside).unwrap(), newer);

    // A second downgrade leaves a second unreadable intent of the same task: kept
    // beside the first, which it does not replace.
    let newest = br#"{"version": 100, "kill": {"signal": "SIGINT"}}"#;
    std::fs::write(starting_dir(&env).join(&v.id), newest).unwrap();
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    assert_eq!(
        std::fs::read(&aside).unwrap(),
        newer,
        "the first was replaced"
    );
    let second = starting_dir(&env).join(format!("{}+2+unreadable", v.id));
    assert_eq!(
        std::fs::read(&second).unwrap(),
        newest,
        "the second was lost"
    );
    assert!(!starting_dir(&env).join(&v.id).exists());
}

#[tokio::test]
async fn damaged_and_foreign_records_stop_the_load() {
    let env = Env::new();
    env.store.put_task("t1", b"\x00\x01garbage").unwrap();
    let e = env.restart_agent().load().unwrap_err().to_string();
    assert!(
        e.contains("task record t1") && e.contains("move it aside"),
        "{e}"
    );

    let env = Env::new();
    env.store
        .put_task("t2", br#"{"version": 9, "whatever": true}"#)
        .unwrap();
    let e = env.restart_agent().load().unwrap_err().to_string();
    assert!(
        e.contains("task record t2") && e.contains("record version 9"),
        "{e}"
    );
}

#[tokio::test]
async fn destroy_deletes_record_and_dir() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    let e = env.mgr.destroy(&v.id, false).await.unwrap_err();
    assert!(e.to_string().contains("still running"));
    env.mgr.destroy(&v.id, true).await.unwrap();
    assert!(env.store.tasks().unwrap().is_empty());
    assert!(!env.alloc.join(&v.id).exists());
    assert!(env.mgr.status(&v.id).is_err());
    // The runner saw the kill and wrote nothing afterwards.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(env.store.tasks().unwrap().is_empty());
}

#[tokio::test]
async fn drain_stops_every_live_task() {
    let env = Env::new();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            env.mgr
                .run(request(serde_json::json!({}), None))
                .await
                .unwrap()
                .id,
        );
    }
    assert_eq!(env.mgr.drain().await, 5);
    for id in &ids {
        assert_eq!(env.mgr.status(id).unwrap().state, TaskLifecycle::Dead);
    }
}

#[tokio::test]
async fn events_are_capped_and_the_view_says_so() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    for _ in 0..150 {
        env.mgr.signal(&v.id, "SIGHUP").await.unwrap();
    }
    let now = env.mgr.status(&v.id).unwrap();
    assert_eq!(now.events.len(), MAX_EVENTS);
    assert_eq!(now.events_dropped, 52);
    assert_eq!(
        env.stored(&v.id)["view"]["events"]
            .as_array()
            .unwrap()
            .len(),
        MAX_EVENTS
    );
}

#[tokio::test]
async fn recovering_a_thousand_tasks_is_fast() {
    let env = Env::new();
    let mut ids = Vec::new();
    for _ in 0..1000 {
        ids.push(
            env.mgr
                .run(request(serde_json::json!({}), None))
                .await
                .unwrap()
                .id,
        );
    }
    env.fake.new_process();
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    let summary = mgr.recover().await;
    assert_eq!(summary.recovered, 1000, "{summary:?}");
    eprintln!("recovered 1000 tasks in {:?}", summary.elapsed);
    assert!(summary.elapsed < Duration::from_secs(2), "{summary:?}");
}

#[tokio::test]
async fn a_restart_the_driver_refuses_counts_as_a_failed_attempt() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({"exit_code": 1, "after_ms": 20}),
            policy(2, "1m", "10ms", RestartMode::Fail),
        ))
        .await
        .unwrap();
    env.fake.s().refuse_start = Some(DriverError::Internal("no more pids".into()));
    let dead = wait_dead(&env.mgr, &v.id).await;
    assert_eq!(
        kinds(&dead),
        [
            "Received",
            "Started",
            "Terminated",
            "Restarting",
            "DriverFailure",
            "Restarting",
            "DriverFailure",
            "NotRestarting"
        ]
    );
    assert_eq!(
        dead.events[4].message,
        "driver fake could not start the task: no more pids"
    );
    assert_eq!(dead.exit_code, None);
    assert!(dead.error.unwrap().contains("no more pids"));
}

#[tokio::test]
async fn a_plugin_dying_inside_start_task_is_asked_not_started_again() {
    let env = Env::new();
    env.fake.s().crash_in_start = Some(DriverError::Unavailable("fake plugin exited".into()));
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(v.state, TaskLifecycle::Pending);
    assert_eq!(env.stored(&v.id)["handle"], serde_json::Value::Null);
    env.fake.relaunch();
    let now = until(&env.mgr, &v.id, "running", |v| {
        v.state == TaskLifecycle::Running
    })
    .await;
    assert_eq!(env.fake.starts(&v.id).len(), 1, "{now:#?}");
    assert!(
        kinds(&now).ends_with(&["DriverFailure", "Started", "Recovered"]),
        "{now:#?}"
    );
    env.fake.exit(&v.id, 0);
    assert_eq!(wait_dead(&env.mgr, &v.id).await.exit_code, Some(0));
}

#[tokio::test]
async fn a_stop_while_the_plugin_is_down_completes_after_the_relaunch() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(
            serde_json::json!({}),
            policy(3, "1h", "10ms", RestartMode::Fail),
        ))
        .await
        .unwrap();
    until_waiting(&env.fake, &v.id).await;
    env.fake.crash();
    until(&env.mgr, &v.id, "reporting the driver failure", |v| {
        v.events.iter().any(|e| e.kind == "DriverFailure")
    })
    .await;
    let mgr = env.mgr.clone();
    let id = v.id.clone();
    let stopping = tokio::spawn(async move { mgr.stop(&id, None, None).await });
    until(&env.mgr, &v.id, "recording the stop", |v| {
        v.events.iter().any(|e| e.kind == "Killing")
    })
    .await;
    assert!(!stopping.is_finished());
    env.fake.relaunch();
    let stopped = stopping.await.unwrap().unwrap();
    assert_eq!(stopped.state, TaskLifecycle::Dead);
    assert_eq!(stopped.signal, Some(15));
    assert!(
        kinds(&stopped).ends_with(&["Recovered", "Terminated", "Killed"]),
        "{stopped:#?}"
    );
    assert_eq!(
        env.fake.starts(&v.id).len(),
        1,
        "a stopped task was restarted"
    );
}

#[tokio::test]
async fn a_start_still_in_flight_when_probed_is_taken_over_not_duplicated() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    forget_handle(&env, &v.id);
    env.fake.new_process();
    // The probe finds nothing: the StartTask the dead agent sent is still in flight …
    let exit = env.fake.s().tasks.remove(&v.id).unwrap();
    // … and has finished by the time the runner sends its own.
    env.fake.s().late_start = Some((v.id.clone(), exit));
    let mgr = env.restart_agent();
    mgr.load().unwrap();
    mgr.recover().await;
    let now = until(&mgr, &v.id, "running", |v| {
        v.state == TaskLifecycle::Running
    })
    .await;
    assert_eq!(env.fake.starts(&v.id).len(), 1, "started twice: {now:#?}");
    assert!(
        kinds(&now).ends_with(&["Recovered", "Started", "Recovered"]),
        "{now:#?}"
    );
    env.fake.exit(&v.id, 0);
    assert_eq!(wait_dead(&mgr, &v.id).await.exit_code, Some(0));
}

/// The agent's own router, served on a socket over this manager, answers
/// `drover_api::Client`: every endpoint, in the JSON the typed client reads, and any
/// id reaches its endpoint as the one segment it was.
#[tokio::test]
async fn the_api_router_answers_the_typed_client() {
    use drover_api::{Client, LogsOptions, StatusCode, StopRequest};

    let env = Env::new();
    let sock = env._dir.path().join("api.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let state = crate::api::ApiState {
        catalog: Arc::new(crate::plugins::catalog::Catalog::default()),
        tasks: env.mgr.clone(),
        streams: Default::default(),
        allocs: None,
        forward: None,
    };
    tokio::spawn(async move { axum::serve(listener, crate::api::router(state)).await });
    let c = Client::new(&sock);
    let status = |e: drover_api::Error| e.status().unwrap_or_else(|| panic!("{e:?}"));

    let health = c.health().await.unwrap();
    assert_eq!(health.recovery, None, "recovery has not run");
    assert!(c.plugins().await.unwrap().is_empty());

    let req = RunRequest {
        kill_timeout: Some(Duration::from_secs(2)),
        ..request(
            serde_json::json!({}),
            policy(1, "1m", "10ms", RestartMode::Delay),
        )
    };
    let v = c.run_task(&req).await.unwrap();
    assert_eq!(v.state, TaskLifecycle::Running);
    assert_eq!(kinds(&v), ["Received", "Started"]);
    assert_eq!(env.stored(&v.id)["request"]["kill_timeout"], "2s");
    assert_eq!(
        c.get_task(&v.id).await.unwrap(),
        env.mgr.status(&v.id).unwrap()
    );
    assert_eq!(c.list_tasks().await.unwrap(), env.mgr.list());
    let signaled = c.signal_task(&v.id, "SIGHUP").await.unwrap();
    assert_eq!(kinds(&signaled).last(), Some(&"Signaling"));
    let events = c.task_events(&v.id).await.unwrap();
    assert_eq!(events, env.mgr.status(&v.id).unwrap().events);
    // No plugin named fake in the catalog: stats cannot be asked.
    let e = c.task_stats(&v.id).await.unwrap_err();
    assert_eq!(status(e), StatusCode::SERVICE_UNAVAILABLE);
    let mut logs = c.task_logs(&v.id, &LogsOptions::default()).await.unwrap();
    assert_eq!(
        logs.next().await.unwrap(),
        None,
        "the fake writes no output"
    );

    let e = c.destroy_task(&v.id, false).await.unwrap_err();
    assert_eq!(status(e), StatusCode::CONFLICT, "it runs");
    let stop = StopRequest {
        signal: Some("SIGINT".into()),
        timeout: Some(Duration::from_millis(1500)),
    };
    let stopped = c.stop_task(&v.id, &stop).await.unwrap();
    assert_eq!(stopped.state, TaskLifecycle::Dead);
    assert!(
        stopped
            .events
            .iter()
            .any(|e| e.message == "sending SIGINT, SIGKILL after 1s 500ms"),
        "{stopped:#?}"
    );
    assert_eq!(c.wait_task(&v.id).await.unwrap().state, TaskLifecycle::Dead);
    let destroyed = c.destroy_task(&v.id, false).await.unwrap();
    assert_eq!(
        (destroyed.id.as_str(), destroyed.destroyed),
        (v.id.as_str(), true)
    );
    assert_eq!(
        status(c.get_task(&v.id).await.unwrap_err()),
        StatusCode::NOT_FOUND
    );

    // Ids that are paths, queries and escapes: the agent's not-found naming them.
    for id in [
        "a b",
        "../../x",
        "..",
        ".",
        "a/b",
        "q?x#y",
        "100%",
        "%2F",
        "ünï ☃",
    ] {
        let want = format!("no task with id {id:?}");
        for e in [
            c.get_task(id).await.unwrap_err(),
            c.wait_task(id).await.unwrap_err(),
            c.task_events(id).await.unwrap_err(),
            c.task_logs(id, &LogsOptions::default()).await.unwrap_err(),
            c.follow_task_stats(id, None).await.unwrap_err(),
            c.stop_task(id, &StopRequest::default()).await.unwrap_err(),
            c.signal_task(id, "SIGHUP").await.unwrap_err(),
            c.destroy_task(id, true).await.unwrap_err(),
        ] {
            assert!(
                e.is_not_found() && e.to_string().contains(&want),
                "{id:?}: {e:?}"
            );
        }
    }
    // The logs endpoint itself, and only it, checks its query first.
    let raw = c
        .get_raw(&["v1", "tasks", "../../x", "logs"], &[("stream", "stdin")])
        .await
        .unwrap();
    assert_eq!(raw.status, StatusCode::BAD_REQUEST, "{raw:?}");
    let raw = c
        .get_raw(&["v1", "tasks", "x", "stats"], &[("interval", "often")])
        .await
        .unwrap();
    assert_eq!(raw.status, StatusCode::BAD_REQUEST);
    let message = raw.error_message().unwrap();
    assert!(
        message.contains("interval \"often\" is not a duration"),
        "{message}"
    );
    // A duration beyond its maximum is refused with the text that was sent.
    let e = c
        .run_task(&RunRequest {
            kill_timeout: Some(Duration::from_secs(2 * 24 * 3600)),
            ..request(serde_json::json!({}), None)
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::BAD_REQUEST));
    assert!(
        e.to_string()
            .contains("kill_timeout \"2days\" is longer than the maximum of 1day"),
        "{e}"
    );
    assert!(env.mgr.list().is_empty());
}

/// A task plants links in its directory to host directories (the whole of it and a
/// file in it); destroying the task removes the links, never what they point at.
/// `std::fs::remove_dir_all` does not follow links (since Rust 1.58.1 it walks with
/// `openat(O_NOFOLLOW)`/`unlinkat`); this holds it to that.
#[tokio::test]
async fn destroy_removes_planted_links_not_their_targets() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    let host = env.alloc.parent().unwrap().join("host-dir");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink(&host, v.task_dir.join("local/link-to-dir")).unwrap();
    std::os::unix::fs::symlink(host.join("precious"), v.task_dir.join("logs/stdout.0")).unwrap();
    env.mgr.destroy(&v.id, true).await.unwrap();
    assert!(!v.task_dir.exists());
    assert_eq!(
        std::fs::read_to_string(host.join("precious")).unwrap(),
        "keep me"
    );
}

/// The agent's socket answers its own endpoints itself and forwards the cluster API
/// (`/v1/jobs`, `/v1/client/fs/logs/...` of an allocation it does not run) when it has
/// servers; without servers it says that it has none.
#[tokio::test]
async fn the_api_router_forwards_the_cluster_api_only() {
    use drover_api::{Client, StatusCode};

    let env = Env::new();
    let serve = |name: &str, forward: Option<Arc<crate::cluster::forward::Forwarder>>| {
        let sock = env._dir.path().join(name);
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let state = crate::api::ApiState {
            catalog: Arc::new(crate::plugins::catalog::Catalog::default()),
            tasks: env.mgr.clone(),
            streams: Default::default(),
            allocs: None,
            forward,
        };
        tokio::spawn(async move { axum::serve(listener, crate::api::router(state)).await });
        Client::new(&sock)
    };
    let alone = serve("alone.sock", None);
    let raw = alone.get_raw(&["v1", "jobs"], &[]).await.unwrap();
    assert_eq!(raw.status, StatusCode::NOT_FOUND);
    let msg = raw.error_message().unwrap();
    assert!(msg.contains("this agent has no servers"), "{msg}");
    let raw = alone
        .get_raw(
            &["v1", "client", "fs", "logs", "a1"],
            &[("task", "main"), ("type", "stdout")],
        )
        .await
        .unwrap();
    assert_eq!(raw.status, StatusCode::NOT_FOUND);
    assert_eq!(
        String::from_utf8(raw.body).unwrap(),
        "Unknown allocation \"a1\""
    );
    assert_eq!(
        alone.get_raw(&["v1", "tasks"], &[]).await.unwrap().status,
        StatusCode::OK
    );

    let (server, seen) = crate::cluster::forward::testing::fake_server(None).await;
    let config = crate::config::AgentConfig {
        servers: vec![server],
        ..Default::default()
    };
    let forward = crate::cluster::forward::Forwarder::from_config(&config)
        .unwrap()
        .map(Arc::new);
    let member = serve("member.sock", forward);
    let raw = member
        .get_raw(&["v1", "job", "web"], &[("index", "4")])
        .await
        .unwrap();
    assert_eq!(raw.status, StatusCode::CREATED, "the fake server's status");
    assert_eq!(
        String::from_utf8(raw.body).unwrap(),
        "[\"GET /v1/job/web?index=4 \"]"
    );
    let raw = member
        .get_raw(
            &["v1", "client", "fs", "logs", "a1"],
            &[("task", "main"), ("type", "stdout")],
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(raw.body).unwrap(),
        "[\"GET /v1/client/fs/logs/a1?task=main&type=stdout \"]"
    );
    // The agent's own endpoints never reach the server.
    assert_eq!(member.list_tasks().await.unwrap(), env.mgr.list());
    assert!(member.health().await.is_ok());
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// Wait until someone subscribed to the fake's task events, or panic with `what`.
async fn until_subscribed(fake: &Fake, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while fake.s().event_subscribers.is_empty() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn what_the_driver_says_about_a_task_is_in_its_events_bounded_and_cleaned() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    // The task's runner subscribed to the driver's events.
    until_subscribed(
        &env.fake,
        Duration::from_secs(5),
        "nobody subscribed to the driver's events",
    )
    .await;
    env.fake.say("no-such-task", "dropped");
    env.fake.say(
        &v.id,
        "the guest powered off (ACPI shutdown after system_powerdown)",
    );
    env.fake
        .say(&v.id, &format!("\u{1b}[2J{}", "x".repeat(5000)));
    let v = until(&env.mgr, &v.id, "two driver messages", |v| {
        kinds(v).iter().filter(|k| **k == "DriverMessage").count() == 2
    })
    .await;
    let messages: Vec<&str> = v
        .events
        .iter()
        .filter(|e| e.kind == TaskEventKind::DriverMessage)
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(
        messages[0],
        "the guest powered off (ACPI shutdown after system_powerdown)"
    );
    assert!(messages[1].starts_with(" [2Jxxx"), "{}", messages[1]);
    assert!(messages[1].len() <= driver_events::MAX_DRIVER_MESSAGE + 3);

    // A new plugin process: the manager subscribes to it too.
    env.fake.new_process();
    until_subscribed(
        &env.fake,
        Duration::from_secs(10),
        "no subscriber to the new process",
    )
    .await;
    env.fake.say(&v.id, "said by the new process");
    until(&env.mgr, &v.id, "the new process's message", |v| {
        v.events
            .iter()
            .any(|e| e.message == "said by the new process")
    })
    .await;
}

/// Live tasks and how many are behind, of a hand-over's progress.
fn counts(p: crate::plugins::catalog::HandoverProgress) -> (usize, usize) {
    (p.tasks, p.behind)
}

/// An upgrade: a new driver instance replaces the old one while the old one still
/// serves (its WaitTask calls stay open). Every runner hands its task to the new one at
/// once, without a restart, and the hand-over progress the catalog waits on says so.
#[tokio::test]
async fn a_replaced_driver_instance_gets_every_task_at_once_without_a_restart() {
    let env = Env::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let v = env
            .mgr
            .run(request(serde_json::json!({}), None))
            .await
            .unwrap();
        until_waiting(&env.fake, &v.id).await;
        ids.push(v.id);
    }
    assert_eq!(counts(env.mgr.handover_progress("fake", 1)), (3, 3));
    assert_eq!(counts(env.mgr.handover_progress("other", 1)), (0, 0));
    let mut attachments = env.mgr.attachments();
    attachments.borrow_and_update();
    // The old instance does not die: only the generation tells the runners.
    env.fake.generation.send_modify(|g| *g += 1);
    drover_test_support::within(Duration::from_secs(5), "every task handed over", async {
        while counts(env.mgr.handover_progress("fake", 1)) != (3, 0) {
            attachments.changed().await.unwrap();
        }
    })
    .await;
    for id in &ids {
        let v = env.mgr.status(id).unwrap();
        assert_eq!(kinds(&v), ["Received", "Started", "Recovered"], "{v:#?}");
        assert_eq!(v.state, TaskLifecycle::Running);
        assert_eq!(env.fake.starts(id).len(), 1);
    }
    // The new instance answers for them: an exit reaches the task.
    env.fake.exit(&ids[0], 3);
    assert_eq!(wait_dead(&env.mgr, &ids[0]).await.exit_code, Some(3));
    assert_eq!(counts(env.mgr.handover_progress("fake", 1)), (2, 0));
}

/// A driver whose plugin file was removed takes no new task and says why; its
/// running tasks stay managed.
#[tokio::test]
async fn a_retiring_driver_refuses_new_tasks_and_keeps_its_running_ones() {
    let env = Env::new();
    let v = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap();
    until_waiting(&env.fake, &v.id).await;
    env.fake.s().retiring = Some("its file /p/fake was removed".into());
    let err = env
        .mgr
        .run(request(serde_json::json!({}), None))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DriverError::FailedPrecondition(m) if m.contains("takes no new tasks") && m.contains("was removed")),
        "{err:?}"
    );
    assert_eq!(env.mgr.list().len(), 1, "the refused task left a record");
    env.mgr.stop(&v.id, None, None).await.unwrap();
    assert_eq!(wait_dead(&env.mgr, &v.id).await.state, TaskLifecycle::Dead);
    assert_eq!(counts(env.mgr.handover_progress("fake", 0)), (0, 0));
}
