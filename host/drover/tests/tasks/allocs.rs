//! Allocations on a client node through a real task manager and the real rawexec (and
//! exec) drivers of the `drover` binary: lifecycle order, failures, stops, complete
//! sets, agent restarts, the shared directory.
//!
//! Each "agent" is an incarnation on its own tokio runtime over the same data dir; a
//! restart drops the runtime (every runner and task watcher with it) and boots a new
//! one from the state store, as a new agent process would.

use crate::common;
use common::tasks::alloc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::drover;
use drover_api::{RunRequest, TaskView};
use drover_host::allocs::{AllocManager, AllocTaskHook, HookContext, HookState, default_hooks};
use drover_host::config::{AgentConfig, PluginSettings};
use drover_host::plugins::candidate::Builtin;
use drover_host::plugins::catalog::{Catalog, LoadContext};
use drover_host::state::{ErrorStore, Fail, RedbStore, StateStore};
use drover_host::taskenv::NodeEnv;
use drover_host::tasks::TaskManager;
use drover_server_api::{
    AllocClientUpdate, AllocatedPort, CheckSpec, ClientAllocation, ClientStatus, DesiredStatus,
    HealthCheckMode, JobType, Lifecycle, LifecycleHook, ServiceHealth, ServiceSpec, Task,
    TaskResources, TaskRunState, UpdateStrategy,
};
use drover_test_support::until;
use tokio::sync::mpsc;

const LIMIT: Duration = Duration::from_secs(30);

struct Node {
    rt: Option<tokio::runtime::Runtime>,
    tasks: Option<Arc<TaskManager>>,
    allocs: Option<Arc<AllocManager>>,
    store: Option<Arc<dyn StateStore>>,
    updates: mpsc::UnboundedReceiver<AllocClientUpdate>,
    /// The exec plugin's cgroup parent (removed on drop).
    cgroup_parent: String,
}

fn context(root: &Path, cgroup_parent: &str) -> (AgentConfig, Vec<Builtin>, Arc<LoadContext>) {
    let plugin_dir = root.join("plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let run_dir = root.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let config = AgentConfig {
        plugin_dir: Some(plugin_dir),
        data_dir: Some(root.to_owned()),
        ..AgentConfig::default()
    };
    let builtins = ["raw_exec", "exec"]
        .map(|name| Builtin {
            name: name.into(),
            command: drover(),
            args: ["plugin", "serve", name].map(Into::into).to_vec(),
        })
        .to_vec();
    let mut settings = BTreeMap::new();
    // raw_exec runs nothing unless enabled.
    settings.insert(
        "raw_exec".to_owned(),
        PluginSettings {
            config: serde_json::json!({ "enabled": true }),
            ..PluginSettings::default()
        },
    );
    settings.insert(
        "exec".to_owned(),
        PluginSettings {
            config: serde_json::json!({ "cgroup_parent": cgroup_parent }),
            ..PluginSettings::default()
        },
    );
    let ctx = Arc::new(LoadContext {
        timeout: LIMIT,
        socket_dir: run_dir,
        accepted: drover_plugin_sdk::version::supported_api_range(),
        agent: drover_plugin_sdk::AgentInfo::new(String::new())
            .with_alloc_dir(root.join("alloc"))
            .with_plugin_state_dir(root.join("plugin-state")),
        settings,
        plugin_pass_env: Vec::new(),
        plugin_auto_mtls: false,
        nomad: None,
    });
    (config, builtins, ctx)
}

impl Node {
    /// Boot an agent on `root`: store, plugins, task recovery, allocation restore.
    fn boot(root: &Path, hooks: Vec<Box<dyn AllocTaskHook>>) -> Node {
        Self::boot_with(root, hooks, |s| s, true)
    }

    /// [`Node::boot`] with the state store wrapped by `wrap`.
    fn boot_with(
        root: &Path,
        hooks: Vec<Box<dyn AllocTaskHook>>,
        wrap: impl FnOnce(Arc<dyn StateStore>) -> Arc<dyn StateStore>,
        restore: bool,
    ) -> Node {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (tx, updates) = mpsc::unbounded_channel();
        let parent = format!(
            "/drover-allocs-{}-{}",
            std::process::id(),
            root.file_name().unwrap().to_string_lossy()
        );
        let (tasks, allocs, store) = rt.block_on(async {
            let store = wrap(Arc::new(RedbStore::open(root).unwrap()));
            let (config, builtins, ctx) = context(root, &parent);
            let catalog = Arc::new(Catalog::new(store.clone()));
            let tasks = Arc::new(TaskManager::new(
                catalog.clone(),
                root.join("alloc"),
                store.clone(),
            ));
            tasks.load().unwrap();
            catalog
                .load(
                    &config,
                    &builtins,
                    ctx,
                    tokio_util::sync::CancellationToken::new(),
                )
                .await;
            tasks.recover().await;
            let allocs = AllocManager::with_hooks(tasks.clone(), store.clone(), tx, hooks);
            if restore {
                allocs.restore().await;
            }
            (tasks, allocs, store)
        });
        Node {
            rt: Some(rt),
            tasks: Some(tasks),
            allocs: Some(allocs),
            store: Some(store),
            updates,
            cgroup_parent: parent,
        }
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().unwrap()
    }
    fn allocs(&self) -> &Arc<AllocManager> {
        self.allocs.as_ref().unwrap()
    }
    fn tasks(&self) -> &Arc<TaskManager> {
        self.tasks.as_ref().unwrap()
    }

    fn apply(&self, allocs: Vec<ClientAllocation>, complete: bool) {
        let a = self.allocs().clone();
        self.rt().block_on(a.apply(allocs, complete));
    }

    fn status(&self, id: &str) -> Option<AllocClientUpdate> {
        self.allocs().statuses().into_iter().find(|u| u.id == id)
    }

    /// Wait until allocation `id`'s status satisfies `pred`; returns it.
    fn wait(
        &self,
        id: &str,
        what: &str,
        pred: impl Fn(&AllocClientUpdate) -> bool,
    ) -> AllocClientUpdate {
        let allocs = self.allocs().clone();
        let last = std::sync::Mutex::new(None);
        let what = format!("{what} (alloc {id})");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.rt().block_on(until(LIMIT, &what, || {
                let s = allocs.statuses().into_iter().find(|u| u.id == id);
                let ok = s.as_ref().is_some_and(&pred);
                *last.lock().unwrap() = s;
                ok
            }))
        }));
        if let Err(e) = r {
            panic!(
                "{:?}; last status: {:#?}",
                e.downcast_ref::<String>(),
                last.lock().unwrap()
            );
        }
        self.status(id).unwrap()
    }

    /// Every update sent so far.
    fn drain_updates(&mut self) -> Vec<AllocClientUpdate> {
        let mut out = Vec::new();
        while let Ok(u) = self.updates.try_recv() {
            out.push(u);
        }
        out
    }

    /// Stop this agent: the runners and task watchers end, tasks keep running.
    fn crash(mut self) {
        self.allocs().shutdown();
        self.allocs.take();
        self.tasks.take();
        self.store.take();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }

    fn store(&self) -> &Arc<dyn StateStore> {
        self.store.as_ref().unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Leave no task running behind a failed test.
        if let (Some(rt), Some(tasks)) = (self.rt.as_ref(), self.tasks.as_ref()) {
            if let Some(a) = self.allocs.as_ref() {
                a.shutdown();
            }
            let tasks = tasks.clone();
            rt.block_on(async move {
                for t in tasks.list() {
                    let _ = tasks.destroy(&t.id, true).await;
                }
            });
            remove_cgroups(&self.cgroup_parent);
        }
    }
}

/// Remove the (empty, once its tasks are destroyed) cgroups under `parent` in every
/// controller, deepest first.
fn remove_cgroups(parent: &str) {
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for c in controllers.flatten() {
        let base = c.path().join(parent.trim_start_matches('/'));
        let mut dirs = vec![base.clone()];
        let mut i = 0;
        while i < dirs.len() {
            if let Ok(rd) = std::fs::read_dir(&dirs[i]) {
                dirs.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            i += 1;
        }
        for d in dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn sh(name: &str, script: &str, lifecycle: Option<(LifecycleHook, bool)>) -> Task {
    Task {
        devices: Default::default(),
        volume_mounts: Default::default(),
        services: Default::default(),
        meta: Default::default(),
        name: name.into(),
        driver: "rawexec".into(),
        config: serde_json::json!({ "command": "/bin/sh", "args": ["-c", script] }),
        env: BTreeMap::new(),
        kill_signal: None,
        kill_timeout: Some(Duration::from_secs(3)),
        restart: None,
        resources: TaskResources::default(),
        logs: None,
        lifecycle: lifecycle.map(|(hook, sidecar)| Lifecycle { hook, sidecar }),
        artifacts: Vec::new(),
        templates: Vec::new(),
        identity: None,
    }
}

fn stopped(mut a: ClientAllocation) -> ClientAllocation {
    a.alloc.desired_status = DesiredStatus::Stop;
    a.alloc.desired_description = "job stopped".into();
    a.alloc.alloc_modify_index += 1;
    a
}

fn shared(root: &Path, id: &str) -> PathBuf {
    root.join("alloc").join(id).join("alloc")
}

fn stamp(root: &Path, id: &str, file: &str) -> u128 {
    let p = shared(root, id).join("data").join(file);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {text:?}: {e}", p.display()))
}

const PRE: Option<(LifecycleHook, bool)> = Some((LifecycleHook::Prestart, false));
const SIDECAR: Option<(LifecycleHook, bool)> = Some((LifecycleHook::Prestart, true));
const POSTSTART: Option<(LifecycleHook, bool)> = Some((LifecycleHook::Poststart, false));
const POSTSTOP: Option<(LifecycleHook, bool)> = Some((LifecycleHook::Poststop, false));

fn now_script(file: &str) -> String {
    format!("date +%s%N > \"$DROVER_ALLOC_DIR/data/{file}\"")
}

#[test]
fn lifecycle_runs_in_order_with_a_shared_dir_and_the_allocation_env() {
    let root = tempfile::tempdir().unwrap();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut hooks = default_hooks();
    hooks.push(Box::new(EventsHook(events.clone())));
    let mut node = Node::boot(root.path(), hooks);
    let id = "11111111-0000-4000-8000-000000000001";
    let d = "$DROVER_ALLOC_DIR/data";
    let a = alloc(
        id,
        JobType::Batch,
        vec![
            sh(
                "init",
                // Slow, so that a main task started too early would be seen.
                &format!(
                    "sleep 0.5; echo hello > {d}/msg; {}",
                    now_script("init.done")
                ),
                PRE,
            ),
            sh(
                "side",
                &format!(
                    "{}; trap '{}; exit 0' TERM; while :; do sleep 0.05; done",
                    now_script("side.start"),
                    now_script("side.stop")
                ),
                SIDECAR,
            ),
            sh(
                "main",
                &format!(
                    "{}; cat {d}/msg > {d}/main.read; env | grep ^DROVER_ | sort > {d}/main.env; \
                     sleep 1; {}",
                    now_script("main.start"),
                    now_script("main.end")
                ),
                None,
            ),
            sh("post", &now_script("poststart"), POSTSTART),
            sh("cleanup", &now_script("poststop"), POSTSTOP),
        ],
    );
    node.apply(vec![a], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");

    let t = |f| stamp(root.path(), id, f);
    assert!(
        t("init.done") <= t("main.start"),
        "the ephemeral prestart ended before main started"
    );
    assert!(
        t("side.start") < t("main.end"),
        "the sidecar ran beside main"
    );
    assert!(
        t("main.start") <= t("poststart"),
        "poststart after main started"
    );
    assert!(
        t("main.end") <= t("side.stop"),
        "the sidecar was stopped after main ended"
    );
    assert!(
        t("side.stop") <= t("poststop"),
        "poststop after the sidecar was stopped"
    );
    assert!(t("main.end") <= t("poststop"), "poststop after main ended");
    let data = shared(root.path(), id).join("data");
    assert_eq!(
        std::fs::read_to_string(data.join("main.read")).unwrap(),
        "hello\n"
    );

    let env: BTreeMap<String, String> = std::fs::read_to_string(data.join("main.env"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(env["DROVER_ALLOC_ID"], id);
    assert_eq!(env["DROVER_GROUP_NAME"], "app");
    assert_eq!(env["DROVER_JOB_NAME"], "web");
    assert_eq!(env["DROVER_TASK_NAME"], "main");
    assert_eq!(
        Path::new(&env["DROVER_ALLOC_DIR"]),
        shared(root.path(), id),
        "{env:#?}"
    );
    assert!(
        env.contains_key("DROVER_TASK_DIR"),
        "the task manager's variables too"
    );

    for (name, st) in &done.task_states {
        assert_eq!(st.state, TaskRunState::Dead, "{name}: {st:#?}");
        assert!(!st.failed, "{name}: {st:#?}");
        assert_eq!(st.starts, 1, "{name}: {st:#?}");
        assert!(!st.task_id.is_empty());
        let view = node.tasks().status(&st.task_id).unwrap();
        assert_eq!(view.name, format!("web.app[0].{name}"));
    }
    assert_eq!(
        node.allocs().task_id(id, "main").unwrap(),
        done.task_states["main"].task_id
    );
    // The sidecar ended because it was stopped: by SIGTERM, its trap wrote the stamp.
    assert!(data.join("side.stop").exists());

    // Status went pending → running → complete on the updates channel.
    let seen: Vec<ClientStatus> = node
        .drain_updates()
        .iter()
        .filter(|u| u.id == id)
        .map(|u| u.client_status)
        .collect();
    let mut order = seen.clone();
    order.dedup();
    assert_eq!(
        order,
        [
            ClientStatus::Pending,
            ClientStatus::Running,
            ClientStatus::Complete
        ],
        "{seen:?}"
    );

    // Terminal here and on the server: collected under a tight policy.
    let mut server = alloc(id, JobType::Batch, vec![]);
    server.alloc.client_status = ClientStatus::Complete;
    node.allocs().set_gc_policy(Duration::ZERO, 0);
    node.apply(vec![server], true);
    let allocs = node.allocs().clone();
    node.rt()
        .block_on(until(LIMIT, "collected", || allocs.statuses().is_empty()));
    assert!(!root.path().join("alloc").join(id).exists());
    assert!(node.store().allocs().unwrap().is_empty());
    assert!(node.tasks().list().is_empty(), "its tasks were destroyed");

    // The task hooks were called in order, once each: the sidecar alone was killed.
    let events = events.lock().unwrap().clone();
    let of = |task: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.ends_with(&format!(" {task}")))
            .map(|e| e.split(' ').next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        of("side"),
        ["prestart", "poststart", "prekill", "exited", "stop"],
        "{events:?}"
    );
    for task in ["init", "main", "post", "cleanup"] {
        assert_eq!(
            of(task),
            ["prestart", "poststart", "exited", "stop"],
            "{task}: {events:?}"
        );
    }
}

#[test]
fn an_allocation_listed_twice_in_one_update_runs_once() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000009";
    let a = alloc(
        id,
        JobType::Batch,
        vec![sh(
            "main",
            "echo started >> $DROVER_ALLOC_DIR/data/starts",
            None,
        )],
    );
    // New allocations of an update are recorded together and started after: a repeated
    // one must not get a second runner.
    node.apply(vec![a.clone(), a], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    let starts = std::fs::read_to_string(shared(root.path(), id).join("data/starts")).unwrap();
    assert_eq!(starts, "started\n");
    assert_eq!(done.task_states["main"].starts, 1, "{done:#?}");
}

#[test]
fn a_failing_prestart_fails_the_allocation_and_main_never_starts() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000002";
    let a = alloc(
        id,
        JobType::Service,
        vec![
            sh("init", "exit 3", PRE),
            sh("main", &now_script("main.start"), None),
            sh("cleanup", &now_script("poststop"), POSTSTOP),
        ],
    );
    node.apply(vec![a], false);
    let done = node.wait(id, "failed", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Failed, "{done:#?}");
    assert!(
        done.client_description.contains("init") && done.client_description.contains("exit code 3"),
        "{}",
        done.client_description
    );
    let init = &done.task_states["init"];
    assert!(init.failed && init.exit_code == Some(3), "{init:#?}");
    let main = &done.task_states["main"];
    assert_eq!(main.starts, 0, "{main:#?}");
    assert!(main.task_id.is_empty(), "{main:#?}");
    assert!(!shared(root.path(), id).join("data/main.start").exists());
    assert!(
        shared(root.path(), id).join("data/poststop").exists(),
        "poststop ran"
    );
}

#[test]
fn desired_stop_stops_the_tasks_and_completes_the_allocation() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000003";
    let a = alloc(
        id,
        JobType::Service,
        vec![sh("main", "exec sleep 1000", None)],
    );
    node.apply(vec![a.clone()], false);
    let up = node.wait(id, "running", |u| u.client_status == ClientStatus::Running);
    let task = up.task_states["main"].task_id.clone();
    let pid: u32 = node.tasks().status(&task).unwrap().attributes["pid"]
        .parse()
        .unwrap();
    assert!(drover_test_support::procs::alive(pid));

    // A new job version on the same allocation is not applied in place: the task runs
    // on, and its state says which version it runs.
    let mut v1 = a.clone();
    v1.alloc.job_version = 1;
    v1.group.tasks[0].env.insert("NEW".into(), "1".into());
    node.apply(vec![v1.clone()], false);
    let moved = node.wait(id, "version note", |u| {
        u.task_states["main"].message.contains("job version 0")
    });
    assert_eq!(moved.task_states["main"].task_id, task);
    assert_eq!(moved.task_states["main"].starts, 1);
    assert!(drover_test_support::procs::alive(pid));

    node.apply(vec![stopped(v1)], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    let main = &done.task_states["main"];
    assert_eq!(main.state, TaskRunState::Dead);
    assert!(!main.failed, "stopped as asked is no failure: {main:#?}");
    assert!(
        !drover_test_support::procs::alive(pid),
        "the task's process is gone"
    );
    // Terminal locally but the server has not seen it yet: kept.
    assert!(root.path().join("alloc").join(id).exists());
    assert_eq!(node.store().allocs().unwrap().len(), 1);
}

#[test]
fn an_allocation_missing_from_a_complete_set_is_stopped_and_forgotten() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let keep = "11111111-0000-4000-8000-000000000004";
    let gone = "11111111-0000-4000-8000-000000000005";
    let outside = root.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "precious").unwrap();
    // The task plants links to a host directory in the shared directory.
    let plant = format!(
        "ln -s {o} \"$DROVER_ALLOC_DIR/data/link\"; ln -s {o}/keep \"$DROVER_ALLOC_DIR/data/file\"; \
         exec sleep 1000",
        o = outside.display()
    );
    node.apply(
        vec![
            alloc(
                keep,
                JobType::Service,
                vec![sh("main", "exec sleep 1000", None)],
            ),
            alloc(gone, JobType::Service, vec![sh("main", &plant, None)]),
        ],
        false,
    );
    node.wait(keep, "running", |u| {
        u.client_status == ClientStatus::Running
    });
    let up = node.wait(gone, "running", |u| {
        u.client_status == ClientStatus::Running
    });
    let task = up.task_states["main"].task_id.clone();
    let link = shared(root.path(), gone).join("data/link");
    let allocs = node.allocs().clone();
    node.rt().block_on(until(LIMIT, "the link planted", || {
        link.symlink_metadata().is_ok()
    }));

    node.apply(
        vec![alloc(
            keep,
            JobType::Service,
            vec![sh("main", "exec sleep 1000", None)],
        )],
        true,
    );
    node.rt().block_on(until(LIMIT, "forgotten", || {
        allocs.statuses().iter().all(|u| u.id != gone)
    }));
    assert!(
        node.tasks().status(&task).is_err(),
        "its task was destroyed"
    );
    assert!(!root.path().join("alloc").join(gone).exists());
    let ids: Vec<String> = node
        .store()
        .allocs()
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(ids, [keep]);
    // What the links pointed to is untouched.
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "precious"
    );
    assert_eq!(
        node.status(keep).unwrap().client_status,
        ClientStatus::Running,
        "the listed allocation runs on"
    );
}

/// Records every call it gets as `<method> <task>`.
struct EventsHook(Arc<std::sync::Mutex<Vec<String>>>);

impl EventsHook {
    fn push(&self, what: &str, ctx: &HookContext<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{what} {}", ctx.task.name));
    }
}

#[drover_host::allocs::async_trait]
impl AllocTaskHook for EventsHook {
    fn name(&self) -> &'static str {
        "events"
    }
    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        _req: &mut RunRequest,
        _state: &mut HookState,
    ) -> Result<(), String> {
        self.push("prestart", ctx);
        Ok(())
    }
    async fn poststart(&self, ctx: &HookContext<'_>, _v: &TaskView, _s: &mut HookState) {
        self.push("poststart", ctx);
    }
    async fn prekill(&self, ctx: &HookContext<'_>, _s: &mut HookState) {
        self.push("prekill", ctx);
    }
    async fn exited(&self, ctx: &HookContext<'_>, _v: &TaskView, _s: &mut HookState) {
        self.push("exited", ctx);
    }
    async fn stop(&self, ctx: &HookContext<'_>, _s: &mut HookState) {
        self.push("stop", ctx);
    }
}

/// Counts its prestart calls; its state counts them too, across restarts.
struct CountHook {
    name: &'static str,
    done: bool,
    calls: Arc<AtomicU64>,
    /// The largest count its persisted state had when it was called.
    seen_state: Arc<AtomicU64>,
}

#[drover_host::allocs::async_trait]
impl AllocTaskHook for CountHook {
    fn name(&self) -> &'static str {
        self.name
    }
    async fn prestart(
        &self,
        _ctx: &HookContext<'_>,
        _req: &mut RunRequest,
        state: &mut HookState,
    ) -> Result<(), String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let runs = state.data.get("runs").and_then(|v| v.as_u64()).unwrap_or(0);
        self.seen_state.fetch_max(runs, Ordering::SeqCst);
        state.data = serde_json::json!({ "runs": runs + 1 });
        state.done = self.done;
        Ok(())
    }
}

#[test]
fn restore_after_an_agent_restart_restarts_nothing_and_carries_on() {
    let root = tempfile::tempdir().unwrap();
    let counters: [(Arc<AtomicU64>, Arc<AtomicU64>); 2] = Default::default();
    let hooks = || {
        let mut h = default_hooks();
        for (i, (name, done)) in [("count_done", true), ("count_again", false)]
            .into_iter()
            .enumerate()
        {
            h.push(Box::new(CountHook {
                name,
                done,
                calls: counters[i].0.clone(),
                seen_state: counters[i].1.clone(),
            }) as Box<dyn AllocTaskHook>);
        }
        h
    };
    let id = "11111111-0000-4000-8000-000000000006";
    let a = alloc(
        id,
        JobType::Service,
        vec![
            sh(
                "gate",
                "while [ ! -f \"$DROVER_ALLOC_DIR/data/go\" ]; do sleep 0.05; done",
                PRE,
            ),
            sh(
                "main",
                &format!("{}; exec sleep 1000", now_script("main.start")),
                None,
            ),
        ],
    );
    let node = Node::boot(root.path(), hooks());
    node.apply(vec![a.clone()], false);
    let before = node.wait(id, "gate running", |u| {
        u.task_states["gate"].state == TaskRunState::Running
    });
    assert_eq!(before.client_status, ClientStatus::Pending);
    node.crash();

    // Mid-prestart restart: the gate keeps running, the runner waits for it again.
    let node = Node::boot(root.path(), hooks());
    let after = node.wait(id, "restored", |u| {
        u.task_states["gate"].state == TaskRunState::Running
    });
    assert_eq!(
        after.task_states["gate"].task_id,
        before.task_states["gate"].task_id
    );
    assert_eq!(after.task_states["gate"].starts, 1, "{after:#?}");
    assert_eq!(after.client_status, ClientStatus::Pending);
    assert!(
        after.task_states["main"].task_id.is_empty(),
        "main waits for the gate"
    );
    std::fs::write(shared(root.path(), id).join("data/go"), "").unwrap();
    let up = node.wait(id, "running", |u| u.client_status == ClientStatus::Running);
    assert_eq!(up.task_states["main"].starts, 1);
    node.crash();

    // This agent gets the server's allocations before anyone called restore: the
    // recorded allocation is restored first, never started a second time.
    let node = Node::boot_with(root.path(), hooks(), |s| s, false);
    node.apply(vec![a.clone()], true);
    let again = node.wait(id, "restored running", |u| {
        u.client_status == ClientStatus::Running
    });
    assert_eq!(node.tasks().list().len(), 2, "gate and main, once each");
    assert_eq!(
        again.task_states["main"].task_id,
        up.task_states["main"].task_id
    );
    assert_eq!(
        again.task_states["main"].starts, 1,
        "not restarted: {again:#?}"
    );
    assert_eq!(
        stamp(root.path(), id, "main.start"),
        stamp(root.path(), id, "main.start"),
    );
    // The done hook ran once per task (gate, main), never again after a restart; the
    // other ran once per task plus once per restart for every started task (gate
    // after the first restart; gate and main after the second), and found its state.
    // (At least: a start tried again because the driver was not ready yet right after
    // a restart runs the prestart hooks that are not done again.)
    assert_eq!(counters[0].0.load(Ordering::SeqCst), 2);
    let calls = counters[1].0.load(Ordering::SeqCst);
    assert!(calls >= 5, "{calls} calls of the hook that is not done");
    // The state it found counted the runs of earlier agents (2 after two restarts;
    // one more when a start right after a restart was tried again, as above).
    let seen = counters[1].1.load(Ordering::SeqCst);
    assert!(
        (2..=calls - 1).contains(&seen),
        "state kept across restarts: the hook saw {seen} earlier runs in {calls} calls"
    );

    // The restored runner still acts on the server.
    node.apply(vec![stopped(a)], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert!(!done.task_states["main"].failed);
}

/// The node the tests' allocations run on, as the agent would describe it.
fn test_node() -> NodeEnv {
    NodeEnv {
        id: "node-uuid-1".into(),
        name: "n1".into(),
        datacenter: "eu-west".into(),
        class: String::new(),
        attributes: BTreeMap::from([("kernel.name".into(), "linux".into())]),
        meta: BTreeMap::from([("rack".into(), "r7".into())]),
    }
}

fn env_file(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A task of an allocation sees Nomad's variables, its merged meta and its `env`
/// interpolated, and its `config` is interpolated before the driver sees it (node
/// values, task variables, unknown references left alone).
#[test]
fn a_task_sees_nomad_variables_and_an_interpolated_config() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    node.allocs().set_node(test_node());
    let id = "11111111-0000-4000-8000-000000000009";
    let mut main = sh("main", "unused", None);
    main.config = serde_json::json!({
        "command": "/bin/sh",
        "args": [
            "-c",
            // Single quotes: what the shell prints is what the driver was given.
            "env | grep -e ^NOMAD_ -e ^GREETING= | sort > \"$NOMAD_ALLOC_DIR/data/env\"; \
             echo 'idx=${NOMAD_ALLOC_INDEX} os=${attr.kernel.name} node=${node.unique.name} \
             rack=${meta.rack} owner=${NOMAD_META_owner} left=${UNKNOWN}' \
             > \"$NOMAD_ALLOC_DIR/data/config\"",
        ],
    });
    main.env = BTreeMap::from([(
        "GREETING".into(),
        "hello ${NOMAD_ALLOC_INDEX} from ${node.datacenter}".into(),
    )]);
    main.meta = BTreeMap::from([("tier".into(), "task".into())]);
    main.resources.memory_max_mb = 512;
    let mut a = alloc(id, JobType::Batch, vec![main]);
    a.alloc.index = 2;
    a.alloc.name = "web.app[2]".into();
    a.job_meta = BTreeMap::from([
        ("owner".into(), "ops".into()),
        ("tier".into(), "job".into()),
    ]);
    a.group.meta = BTreeMap::from([("tier".into(), "group".into())]);
    node.apply(vec![a], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");

    let data = shared(root.path(), id).join("data");
    let env = env_file(&data.join("env"));
    let task_dir = node.tasks().task_dir(&done.task_states["main"].task_id);
    let want = [
        ("NOMAD_ALLOC_ID", id.to_owned()),
        ("NOMAD_ALLOC_NAME", "web.app[2]".to_owned()),
        ("NOMAD_ALLOC_INDEX", "2".to_owned()),
        (
            "NOMAD_ALLOC_DIR",
            shared(root.path(), id).display().to_string(),
        ),
        // rawexec has no filesystem isolation: the host's paths.
        (
            "NOMAD_TASK_DIR",
            task_dir.join("local").display().to_string(),
        ),
        (
            "NOMAD_SECRETS_DIR",
            task_dir.join("secrets").display().to_string(),
        ),
        ("NOMAD_TASK_NAME", "main".to_owned()),
        ("NOMAD_GROUP_NAME", "app".to_owned()),
        ("NOMAD_JOB_ID", "web".to_owned()),
        ("NOMAD_JOB_NAME", "web".to_owned()),
        ("NOMAD_NAMESPACE", "default".to_owned()),
        ("NOMAD_DC", "eu-west".to_owned()),
        ("NOMAD_REGION", "global".to_owned()),
        ("NOMAD_CPU_LIMIT", "100".to_owned()),
        ("NOMAD_MEMORY_LIMIT", "300".to_owned()),
        ("NOMAD_MEMORY_MAX_LIMIT", "512".to_owned()),
        ("NOMAD_META_owner", "ops".to_owned()),
        ("NOMAD_META_OWNER", "ops".to_owned()),
        ("NOMAD_META_tier", "task".to_owned()),
        ("NOMAD_META_TIER", "task".to_owned()),
        ("GREETING", "hello 2 from eu-west".to_owned()),
    ];
    for (k, v) in &want {
        assert_eq!(env.get(*k), Some(v), "{k}: {env:#?}");
    }
    assert_eq!(env.len(), want.len(), "{env:#?}");
    assert_eq!(
        std::fs::read_to_string(data.join("config")).unwrap(),
        "idx=2 os=linux node=n1 rack=r7 owner=ops left=${UNKNOWN}\n"
    );
}

fn exec_available() -> bool {
    // The exec driver needs root (namespaces, pivot_root, cgroups).
    rustix::process::geteuid().is_root()
}

#[test]
fn exec_tasks_see_the_shared_dir_at_alloc() {
    assert!(exec_available(), "the exec driver needs root for this test");
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000007";
    let mut writer = sh(
        "writer",
        "echo \"$DROVER_ALLOC_DIR\" > /alloc/data/where; id -u > /alloc/data/uid; \
         ls -ld /alloc/data > /alloc/data/ls",
        None,
    );
    writer.driver = "exec".into();
    writer.config = serde_json::json!({
        "command": "/bin/sh",
        "args": ["-c", "echo \"$DROVER_ALLOC_DIR\" > /alloc/data/where; id -u > /alloc/data/uid; \
                        echo \"$NOMAD_ALLOC_DIR $NOMAD_TASK_DIR $NOMAD_SECRETS_DIR\" > /alloc/data/nomad; \
                        echo '${NOMAD_TASK_DIR}' > /alloc/data/config"],
    });
    let reader = sh("reader", "true", PRE);
    node.apply(vec![alloc(id, JobType::Batch, vec![reader, writer])], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    let data = shared(root.path(), id).join("data");
    assert_eq!(
        std::fs::read_to_string(data.join("where")).unwrap(),
        "/alloc\n"
    );
    // Nomad's directory variables, in the environment and in the config, are where
    // the task sees the directories inside its root.
    assert_eq!(
        std::fs::read_to_string(data.join("nomad")).unwrap(),
        "/alloc /local /secrets\n"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("config")).unwrap(),
        "/local\n"
    );
    let uid: u32 = std::fs::read_to_string(data.join("uid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(
        uid, 0,
        "the exec task ran as another user and could write alloc/data"
    );
    // Clean up the task's cgroups through the task manager.
    let mut server = alloc(id, JobType::Batch, vec![]);
    server.alloc.client_status = ClientStatus::Complete;
    node.allocs().set_gc_policy(Duration::ZERO, 0);
    node.apply(vec![server], true);
    let allocs = node.allocs().clone();
    node.rt()
        .block_on(until(LIMIT, "collected", || allocs.statuses().is_empty()));
}

#[test]
fn an_agent_restart_during_poststop_finishes_the_allocation() {
    let root = tempfile::tempdir().unwrap();
    let id = "11111111-0000-4000-8000-000000000008";
    let a = alloc(
        id,
        JobType::Batch,
        vec![
            sh("main", "true", None),
            sh(
                "cleanup",
                &format!(
                    "while [ ! -f \"$DROVER_ALLOC_DIR/data/go\" ]; do sleep 0.05; done; {}",
                    now_script("poststop")
                ),
                POSTSTOP,
            ),
        ],
    );
    let node = Node::boot(root.path(), default_hooks());
    node.apply(vec![a], false);
    let before = node.wait(id, "poststop running", |u| {
        u.task_states["cleanup"].state == TaskRunState::Running
    });
    assert!(!before.client_status.is_terminal());
    node.crash();

    let node = Node::boot(root.path(), default_hooks());
    let after = node.wait(id, "restored", |u| {
        u.task_states["cleanup"].state == TaskRunState::Running
    });
    assert_eq!(
        after.task_states["cleanup"].task_id,
        before.task_states["cleanup"].task_id
    );
    assert_eq!(after.task_states["cleanup"].starts, 1);
    assert!(!after.client_status.is_terminal(), "{after:#?}");
    std::fs::write(shared(root.path(), id).join("data/go"), "").unwrap();
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert_eq!(done.task_states["main"].starts, 1, "main was not run again");
    assert!(shared(root.path(), id).join("data/poststop").exists());
}

#[test]
fn a_service_task_dead_for_good_after_its_restarts_fails_the_allocation() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000009";
    let mut main = sh(
        "main",
        "echo run >> \"$DROVER_ALLOC_DIR/data/runs\"; exit 1",
        None,
    );
    main.restart = Some(drover_api::RestartPolicy {
        attempts: 2,
        interval: Duration::from_secs(60),
        delay: Duration::from_millis(100),
        mode: drover_api::RestartMode::Fail,
    });
    let side = sh("side", "exec sleep 1000", SIDECAR);
    node.apply(vec![alloc(id, JobType::Service, vec![side, main])], false);
    let done = node.wait(id, "failed", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Failed, "{done:#?}");
    assert!(
        done.client_description.contains("task main failed"),
        "{}",
        done.client_description
    );
    let m = &done.task_states["main"];
    assert_eq!(
        (m.starts, m.restarts, m.exit_code),
        (3, 2, Some(1)),
        "{m:#?}"
    );
    assert!(m.failed);
    let runs = std::fs::read_to_string(shared(root.path(), id).join("data/runs")).unwrap();
    assert_eq!(runs.lines().count(), 3);
    let s = &done.task_states["side"];
    assert_eq!(s.state, TaskRunState::Dead);
    assert!(
        !s.failed,
        "the sidecar was stopped, it did not fail: {s:#?}"
    );
}

#[test]
fn an_allocation_whose_record_cannot_be_written_is_not_started() {
    let root = tempfile::tempdir().unwrap();
    let faulty = std::sync::OnceLock::new();
    let node = Node::boot_with(
        root.path(),
        default_hooks(),
        |inner| {
            let s = Arc::new(ErrorStore::new(inner, Fail::Never));
            let _ = faulty.set(s.clone());
            s
        },
        true,
    );
    let faulty = faulty.get().unwrap();
    let id = "11111111-0000-4000-8000-00000000000a";
    let a = alloc(
        id,
        JobType::Batch,
        vec![sh("main", &now_script("ran"), None)],
    );
    faulty.set(Fail::Writes);
    node.apply(vec![a.clone()], false);
    assert!(node.status(id).is_none());
    assert!(
        node.tasks().list().is_empty(),
        "nothing started without a record"
    );
    assert!(!root.path().join("alloc").join(id).exists());

    // The next time the server sends it, it runs.
    faulty.set(Fail::Never);
    node.apply(vec![a], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert!(shared(root.path(), id).join("data/ran").exists());
}

/// Sets the immutable attribute on a file (nobody, root included, can unlink it)
/// and clears it on drop, so a failed test leaves a removable temp dir.
struct Immutable(std::fs::File);

impl Immutable {
    fn set(path: &Path) -> Immutable {
        let f = std::fs::File::open(path).unwrap();
        let flags = rustix::fs::ioctl_getflags(&f).unwrap();
        rustix::fs::ioctl_setflags(&f, flags | rustix::fs::IFlags::IMMUTABLE)
            .unwrap_or_else(|e| panic!("chattr +i {}: {e}", path.display()));
        Immutable(f)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if let Ok(flags) = rustix::fs::ioctl_getflags(&self.0) {
            let _ = rustix::fs::ioctl_setflags(&self.0, flags - rustix::fs::IFlags::IMMUTABLE);
        }
    }
}

#[test]
fn a_directory_that_cannot_be_removed_keeps_its_allocation_until_a_later_pass_removes_it() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000031";
    let a = alloc(
        id,
        JobType::Batch,
        vec![sh("main", &now_script("main.done"), None)],
    );
    node.apply(vec![a], false);
    node.wait(id, "complete", |u| {
        u.client_status == ClientStatus::Complete
    });
    let dir = root.path().join("alloc").join(id);
    let stuck = Immutable::set(&shared(root.path(), id).join("data").join("main.done"));

    // Terminal on the server too, collected under a tight policy: the removal fails.
    let mut server = alloc(id, JobType::Batch, vec![]);
    server.alloc.client_status = ClientStatus::Complete;
    node.allocs().set_gc_policy(Duration::ZERO, 0);
    node.apply(vec![server], true);
    let allocs = node.allocs().clone();
    node.rt().block_on(until(LIMIT, "a failed removal", || {
        allocs.removal_failures(id).is_some_and(|n| n >= 1)
    }));
    // Neither the allocation nor its record is forgotten while its directory exists.
    assert!(dir.exists());
    assert!(node.status(id).is_some());
    let records = node.store().allocs().unwrap();
    assert!(
        records.iter().any(|(k, _)| k == id),
        "the record was deleted though the directory is still there"
    );

    // Once the directory can go, the next pass removes it and then the record.
    drop(stuck);
    node.apply(vec![], true);
    node.rt().block_on(until(LIMIT, "collected", || {
        allocs.removal_failures(id).is_none()
    }));
    assert!(!dir.exists());
    assert!(node.store().allocs().unwrap().is_empty());
}

/// The CNI plugins, root and busybox (the tasks' `httpd` and `wget`), or why not.
fn bridge_available() -> bool {
    if drover_test_support::cni::plugins().is_none() {
        return false;
    }
    if !Path::new("/bin/busybox").exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: /bin/busybox (busybox-static) is needed for the bridge tests"
        );
        eprintln!("#### SKIPPED: no /bin/busybox (install busybox-static)");
        return false;
    }
    true
}

/// A group of two exec tasks in bridge mode: `web` serves `hello from <alloc id>` on
/// port 8080 of the group's namespace, `fetch` gets it from `127.0.0.1:8080` (only
/// there if the two share the namespace) into `alloc/data/fetched`. The node's
/// `host_port` on 127.0.0.1 is mapped to 8080.
fn bridge_alloc(id: &str, host_port: u16) -> ClientAllocation {
    let mut web = sh("web", "", None);
    web.driver = "exec".into();
    web.config = serde_json::json!({
        "command": "/bin/sh",
        "args": ["-c", "echo \"hello from $NOMAD_ALLOC_ID\" > /local/index.html; \
                        exec /bin/busybox httpd -f -p 8080 -h /local"],
    });
    let mut fetch = sh("fetch", "", None);
    fetch.driver = "exec".into();
    fetch.config = serde_json::json!({
        "command": "/bin/sh",
        "args": ["-c", "until /bin/busybox wget -q -O /alloc/data/fetched.part \
                        http://127.0.0.1:8080/; do sleep 0.1; done; \
                        mv /alloc/data/fetched.part /alloc/data/fetched; exec sleep 1000"],
    });
    let mut a = alloc(id, JobType::Service, vec![web, fetch]);
    a.group.network = Some(drover_server_api::NetworkSpec {
        mode: drover_server_api::NetworkMode::Bridge,
        ports: vec![drover_server_api::PortSpec {
            label: "http".into(),
            to: 8080,
            ..Default::default()
        }],
    });
    a.alloc.ports = vec![drover_server_api::AllocatedPort {
        label: "http".into(),
        value: host_port,
        to: 8080,
        host_ip: "127.0.0.1".into(),
    }];
    a
}

/// `GET /` on 127.0.0.1:`port`: the body, or why not.
fn http_get(port: u16) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let mut c = std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_secs(2),
    )
    .map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut s = String::new();
    c.read_to_string(&mut s).map_err(|e| e.to_string())?;
    s.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .ok_or_else(|| format!("not an HTTP answer: {s:?}"))
}

fn netns_of(id: &str) -> PathBuf {
    Path::new("/run/netns").join(id)
}

/// Wait until allocation `id`'s `fetch` task got the page over 127.0.0.1 and the
/// page is reached from the host through `host_port`; what its network is made of.
fn bridge_serves(
    node: &Node,
    root: &Path,
    id: &str,
    host_port: u16,
) -> drover_test_support::cni::Footprint {
    let fetched = shared(root, id).join("data/fetched");
    node.wait(id, "running", |u| u.client_status == ClientStatus::Running);
    node.rt()
        .block_on(until(LIMIT, "the tasks talk over 127.0.0.1", || {
            fetched.exists()
        }));
    let want = format!("hello from {id}\n");
    assert_eq!(std::fs::read_to_string(&fetched).unwrap(), want);
    assert_eq!(http_get(host_port).as_deref(), Ok(want.as_str()));
    let seen = drover_test_support::cni::Footprint::observe("drover", id, &netns_of(id));
    assert!(seen.ip.is_some() && seen.host_ifindex.is_some(), "{seen:?}");
    seen
}

#[test]
fn a_bridge_group_shares_a_namespace_reached_through_its_port_and_stop_leaves_nothing() {
    if !bridge_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    // Two allocations of one group (count = 2), each with its own node port.
    let ids = [
        "11111111-0000-4000-8000-000000000b01",
        "11111111-0000-4000-8000-000000000b02",
    ];
    let ports = ids.map(|_| drover_test_support::net::free_local_addr().port());
    let allocs: Vec<ClientAllocation> = ids
        .iter()
        .zip(ports)
        .map(|(id, port)| bridge_alloc(id, port))
        .collect();
    node.apply(allocs.clone(), false);
    let seen: Vec<_> = ids
        .iter()
        .zip(ports)
        .map(|(id, port)| bridge_serves(&node, root.path(), id, port))
        .collect();
    assert_ne!(
        seen[0].ip, seen[1].ip,
        "each allocation has its own address"
    );

    node.apply(allocs.into_iter().map(stopped).collect(), false);
    for (id, seen) in ids.iter().zip(&seen) {
        let done = node.wait(id, "stopped", |u| u.client_status.is_terminal());
        assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
        assert_eq!(seen.remains(), Vec::<String>::new(), "left by {id}");
    }
    for port in ports {
        assert!(
            http_get(port).is_err(),
            "nothing answers on {port} any more"
        );
    }
}

#[test]
fn a_bridge_network_is_torn_down_by_the_next_agent_after_a_crash() {
    if !bridge_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let id = "11111111-0000-4000-8000-000000000b03";
    let port = drover_test_support::net::free_local_addr().port();
    let a = bridge_alloc(id, port);
    let node = Node::boot(root.path(), default_hooks());
    node.apply(vec![a.clone()], false);
    let seen = bridge_serves(&node, root.path(), id, port);
    // The agent dies; its tasks and their network stay.
    node.crash();
    assert_eq!(
        http_get(port).as_deref(),
        Ok(format!("hello from {id}\n").as_str())
    );

    let node = Node::boot(root.path(), default_hooks());
    node.apply(vec![stopped(a)], false);
    let done = node.wait(id, "stopped", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert_eq!(seen.remains(), Vec::<String>::new());
}

#[test]
fn a_rawexec_task_of_a_bridge_group_joins_its_namespace() {
    if !bridge_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000b04";
    let mut a = bridge_alloc(id, drover_test_support::net::free_local_addr().port());
    a.group.tasks = vec![sh(
        "raw",
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' ' \
         > \"$DROVER_ALLOC_DIR/data/links\"; exec sleep 1000",
        None,
    )];
    node.apply(vec![a.clone()], false);
    node.wait(id, "running", |u| u.client_status == ClientStatus::Running);
    let links = shared(root.path(), id).join("data/links");
    node.rt()
        .block_on(until(LIMIT, "the task listed its interfaces", || {
            std::fs::read_to_string(&links).is_ok_and(|l| !l.is_empty())
        }));
    assert_eq!(
        std::fs::read_to_string(&links).unwrap().trim(),
        "eth0 lo",
        "the group's interfaces, not the host's"
    );
    let seen = drover_test_support::cni::Footprint::observe("drover", id, &netns_of(id));
    node.apply(vec![stopped(a)], false);
    let done = node.wait(id, "stopped", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert_eq!(seen.remains(), Vec::<String>::new());
}

#[test]
fn a_bridge_group_on_a_node_without_the_plugins_fails_naming_the_plugin() {
    if !bridge_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let bridge = drover_host::network::Bridge::new(drover_host::network::BridgeConfig {
        cni_path: vec![root.path().join("no-cni-here")],
        ..Default::default()
    })
    .unwrap();
    node.allocs().set_bridge(Some(bridge));
    let id = "11111111-0000-4000-8000-000000000b05";
    node.apply(
        vec![bridge_alloc(
            id,
            drover_test_support::net::free_local_addr().port(),
        )],
        false,
    );
    let done = node.wait(id, "failed", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Failed, "{done:#?}");
    let why = &done.client_description;
    assert!(
        why.contains("bridge network") && why.contains("\"loopback\" not found"),
        "{why}"
    );
    assert!(
        done.task_states.values().all(|t| t.task_id.is_empty()),
        "no task started: {done:#?}"
    );
    let seen = drover_test_support::cni::Footprint::observe("drover", id, &netns_of(id));
    assert_eq!(seen.remains(), Vec::<String>::new());
}

// Health of allocations in a deployment: decided by the runner, reported in its
// status (`healthy`), final across agent restarts.

fn in_deployment(
    mut a: ClientAllocation,
    mode: HealthCheckMode,
    min_healthy_time: Duration,
    healthy_deadline: Duration,
) -> ClientAllocation {
    a.alloc.deployment_id = Some("dddddddd-0000-4000-8000-000000000001".into());
    a.update = Some(UpdateStrategy {
        health_check: mode,
        min_healthy_time,
        healthy_deadline,
        ..UpdateStrategy::default()
    });
    a
}

#[test]
fn a_deployment_allocation_is_healthy_after_min_healthy_time_and_stays_so_after_an_agent_restart() {
    let root = tempfile::tempdir().unwrap();
    let mut node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000d01";
    let a = in_deployment(
        alloc(
            id,
            JobType::Service,
            vec![sh("main", "exec sleep 1000", None)],
        ),
        HealthCheckMode::TaskStates,
        Duration::from_secs(1),
        Duration::from_secs(20),
    );
    let applied = std::time::Instant::now();
    node.apply(vec![a.clone()], false);
    let decided = node.wait(id, "health decided", |u| u.healthy.is_some());
    assert!(
        applied.elapsed() >= Duration::from_secs(1),
        "decided after {:?}, before min_healthy_time",
        applied.elapsed()
    );
    assert_eq!(decided.healthy, Some(true), "{decided:#?}");
    assert_eq!(decided.client_status, ClientStatus::Running);
    // Running was reported undecided first; the decision came in a report of its own
    // (the timer woke the runner: nothing else changed), and every report since
    // carries it.
    let updates = node.drain_updates();
    let first = updates
        .iter()
        .position(|u| u.healthy.is_some())
        .expect("the decision was reported");
    assert!(
        updates[..first]
            .iter()
            .any(|u| u.client_status == ClientStatus::Running && u.healthy.is_none()),
        "{updates:#?}"
    );
    assert!(updates[first..].iter().all(|u| u.healthy == Some(true)));
    node.crash();

    // The next agent reports the recorded decision from its first report on.
    let mut node = Node::boot(root.path(), default_hooks());
    let again = node.wait(id, "restored", |_| true);
    assert_eq!(again.healthy, Some(true), "{again:#?}");
    assert_eq!(node.drain_updates()[0].healthy, Some(true));

    // A stop afterwards changes nothing of the decision.
    node.apply(vec![stopped(a)], false);
    let done = node.wait(id, "complete", |u| u.client_status.is_terminal());
    assert_eq!(done.healthy, Some(true), "the decision stays: {done:#?}");
}

#[test]
fn a_failing_task_makes_a_deployment_allocation_unhealthy_at_once() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let id = "11111111-0000-4000-8000-000000000d02";
    let mut main = sh("main", "exit 3", None);
    main.restart = Some(drover_api::RestartPolicy {
        attempts: 0,
        interval: Duration::from_secs(60),
        delay: Duration::from_millis(100),
        mode: drover_api::RestartMode::Fail,
    });
    let a = in_deployment(
        alloc(id, JobType::Service, vec![main]),
        HealthCheckMode::Checks,
        Duration::from_secs(1),
        Duration::from_secs(600),
    );
    let applied = std::time::Instant::now();
    node.apply(vec![a], false);
    let decided = node.wait(id, "health decided", |u| u.healthy.is_some());
    assert_eq!(decided.healthy, Some(false), "{decided:#?}");
    assert!(
        applied.elapsed() < Duration::from_secs(60),
        "not by the deadline"
    );
    let done = node.wait(id, "failed", |u| u.client_status.is_terminal());
    assert_eq!(done.client_status, ClientStatus::Failed);
    assert_eq!(done.healthy, Some(false));
}

/// A group service with a TCP check of the allocation's port `http` (127.0.0.1:port).
fn with_tcp_check(mut a: ClientAllocation, port: u16) -> ClientAllocation {
    a.alloc.ports = vec![AllocatedPort {
        label: "http".into(),
        value: port,
        to: 0,
        host_ip: "127.0.0.1".into(),
    }];
    a.group.services = vec![ServiceSpec {
        name: "web".into(),
        port: "http".into(),
        checks: vec![CheckSpec {
            name: "alive".into(),
            check_type: "tcp".into(),
            interval: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
            path: String::new(),
            method: String::new(),
            protocol: String::new(),
            header: Default::default(),
            port: String::new(),
            command: String::new(),
            args: Vec::new(),
            task: String::new(),
            expose: false,
            check_restart: None,
        }],
        ..ServiceSpec::default()
    }];
    a
}

#[test]
fn checks_gate_a_deployment_allocations_health_and_the_deadline_decides_unhealthy() {
    let root = tempfile::tempdir().unwrap();
    let node = Node::boot(root.path(), default_hooks());
    let main = || vec![sh("main", "exec sleep 1000", None)];

    // Nothing listens on the checked port: the tasks run, the check fails, and the
    // deadline decides.
    let closed = drover_test_support::net::free_local_addr().port();
    let failing = "11111111-0000-4000-8000-000000000d03";
    let a = in_deployment(
        with_tcp_check(alloc(failing, JobType::Service, main()), closed),
        HealthCheckMode::Checks,
        Duration::from_secs(1),
        Duration::from_secs(3),
    );
    node.apply(vec![a], false);
    let decided = node.wait(failing, "health decided", |u| u.healthy.is_some());
    assert_eq!(decided.healthy, Some(false), "{decided:#?}");
    assert_eq!(decided.client_status, ClientStatus::Running);
    let checks: Vec<ServiceHealth> = decided
        .services
        .iter()
        .flatten()
        .flat_map(|s| s.checks.iter().map(|c| c.status))
        .collect();
    assert_eq!(checks, vec![ServiceHealth::Critical], "{decided:#?}");

    // The same with the port answering: healthy.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().port();
    let passing = "11111111-0000-4000-8000-000000000d04";
    let a = in_deployment(
        with_tcp_check(alloc(passing, JobType::Service, main()), open),
        HealthCheckMode::Checks,
        Duration::from_secs(1),
        Duration::from_secs(20),
    );
    node.apply(vec![a], false);
    let decided = node.wait(passing, "health decided", |u| u.healthy.is_some());
    assert_eq!(decided.healthy, Some(true), "{decided:#?}");
    drop(listener);
}
