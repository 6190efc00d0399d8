//! The template hook: each of a task's `template` blocks is rendered before the task
//! starts ([`render`]), written into the task directory, and watched while it runs.
//!
//! - Where: the destination is checked again ([`drover_server_api::taskfiles`]) and
//!   written beneath the task directory's descriptor without following links (a link
//!   planted at or on the way to the destination is refused, not written through);
//!   `perms` applies, files under `secrets/` are always 0600; a rendered file is at
//!   most [`render::MAX_RENDERED`] bytes. It belongs to the user the task runs as
//!   ([`super::task_user`]: an exec task's `nobody` can read its 0600 secrets), given
//!   through the descriptor written, never by path.
//! - `env = true`: the rendered `KEY=VALUE` lines are added to the task's environment.
//! - Inputs: the task's environment (`env`), services (`nomadService`, Nomad's
//!   `/v1/service/:name`) and variables (`nomadVar`, `nomadVarList`, `/v1/var/:path`
//!   and `/v1/vars?prefix=` read with the task's workload identity token, the one
//!   the server signed for it, whether or not its `identity` block has it written to
//!   `secrets/nomad_token`), through a [`TemplateServer`] (the agent's forwarder to
//!   the cluster servers).
//! - Changes: while the task runs, its templates are rendered again every
//!   [`WATCH_INTERVAL`]; a file that renders differently is rewritten and, after a
//!   random delay up to `splay`, `change_mode` applies: `restart` (the task manager
//!   restarts the task), `signal` (`change_signal`) or `noop`.

pub(crate) mod render;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_api::RunRequest;
use drover_plugin_sdk::taskdir::{Dir, OpenOptions};
use drover_server_api::taskfiles::{self, Root};
use drover_server_api::{ChangeMode, Task, TemplateSpec};
use tokio_util::sync::CancellationToken;

use super::artifacts::unpack;
use super::hooks::{AllocTaskHook, HookContext, HookState};
use super::task_user::{self, Owner};
use crate::tasks::TaskManager;
use render::{Inputs, Wanted};

/// How often a running task's templates are rendered again.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);
/// Longest one render may take: a template that loops over its own input for ever
/// fails the task instead of holding the agent (the render's thread is abandoned).
const RENDER_TIMEOUT: Duration = Duration::from_secs(10);
/// Rounds of fetching what a render asked for before giving up.
const MAX_ROUNDS: usize = 4;
/// Largest template `source` file read from the task directory.
const MAX_SOURCE: u64 = 256 * 1024;

/// What templates read from the cluster. The agent's implementation forwards to the
/// servers ([`crate::cluster::forward::Forwarder`]).
#[tonic::async_trait]
pub trait TemplateServer: Send + Sync {
    /// The instances of service `name` of namespace `namespace` (Nomad's
    /// `/v1/service/:name`, as JSON), read with the task's workload identity token
    /// when it has one.
    async fn service(
        &self,
        namespace: &str,
        name: &str,
        token: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, String>;
}

/// Variables, read with a task's workload identity token (`VariableSource` of the
/// issue): Nomad's `GET /v1/var/:path` and `GET /v1/vars?prefix=`.
#[tonic::async_trait]
pub trait VariableSource: Send + Sync {
    /// The items of the variable at `path`; `None` when there is none.
    async fn variable(
        &self,
        path: &str,
        token: &str,
    ) -> Result<Option<BTreeMap<String, String>>, String>;
    /// The paths of the variables under `prefix`.
    async fn variables(&self, prefix: &str, token: &str) -> Result<Vec<String>, String>;
}

/// The server side of templates: services and variables.
pub trait TemplateSources: TemplateServer + VariableSource {}
impl<T: TemplateServer + VariableSource> TemplateSources for T {}

/// One task's rendering state: its environment and the last text of each template.
struct Watched {
    env: BTreeMap<String, String>,
    last: Vec<Option<String>>,
    stop: Option<CancellationToken>,
    /// Whose the rendered files are (from the task's final driver config).
    owner: Option<Owner>,
}

/// Renders a task's templates before it starts and watches them while it runs.
pub(crate) struct TemplateHook {
    server: Option<Arc<dyn TemplateSources>>,
    tasks: Mutex<HashMap<String, Watched>>,
}

impl TemplateHook {
    pub(crate) fn new(server: Option<Arc<dyn TemplateSources>>) -> Self {
        TemplateHook {
            server,
            tasks: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn stop_watching(&self, task_id: &str) {
        if let Some(w) = self.lock().remove(task_id)
            && let Some(stop) = w.stop
        {
            stop.cancel();
        }
    }
}

/// The directories a template reads from and writes to, whose its files are, and the
/// namespace of its allocation (where `nomadService` looks services up, as Nomad's).
#[derive(Clone)]
struct Dirs {
    task: std::path::PathBuf,
    shared: std::path::PathBuf,
    namespace: String,
    /// The user the task runs as, when not root (see [`task_user`]).
    owner: Option<Owner>,
}

/// The task's workload identity token, as the server signed it (not read back from
/// `secrets/nomad_token`, which the task may have replaced, or not have).
fn workload_token(ctx: &HookContext<'_>) -> Option<String> {
    ctx.alloc
        .identities
        .get(&ctx.task.name)
        .filter(|t| !t.is_empty())
        .cloned()
}

/// The template's text: `data`, or its `source` file read from the task directory.
fn template_text(t: &TemplateSpec, dirs: &Dirs) -> Result<String, String> {
    if t.source.is_empty() {
        return Ok(t.data.clone());
    }
    let p = taskfiles::task_path(&t.source).map_err(|e| format!("source: {e}"))?;
    let root = match p.root {
        Root::Task => &dirs.task,
        Root::Alloc => &dirs.shared,
    };
    let dir = Dir::open(root).map_err(|e| format!("source {}: {e}", t.source))?;
    let f = dir
        // One link only: a task may not hard-link an agent's file (a key, a state
        // file) into its directory and have the agent render it back to it.
        .open_file(&p.rel, &OpenOptions::new().read(true).single_link(true))
        .map_err(|e| format!("source {}: {e}", t.source))?;
    let mut s = String::new();
    use std::io::Read as _;
    f.take(MAX_SOURCE + 1)
        .read_to_string(&mut s)
        .map_err(|e| format!("source {}: {e}", t.source))?;
    if s.len() as u64 > MAX_SOURCE {
        return Err(format!(
            "source {}: larger than {MAX_SOURCE} bytes",
            t.source
        ));
    }
    Ok(s)
}

/// Fetch what a render asked for into `inputs`.
async fn fetch(
    server: Option<&Arc<dyn TemplateSources>>,
    namespace: &str,
    wanted: &Wanted,
    inputs: &mut Inputs,
    token: Option<&str>,
) -> Result<(), String> {
    let Some(server) = server else {
        return Err(
            "nomadService, nomadVar and nomadVarList need a cluster server (this agent has none)"
                .into(),
        );
    };
    for name in &wanted.services {
        let list = server
            .service(namespace, name, token)
            .await
            .map_err(|e| format!("nomadService {name:?}: {e}"))?;
        inputs.services.insert(name.clone(), list);
    }
    if !wanted.vars.is_empty() || !wanted.var_lists.is_empty() {
        let token = token.ok_or_else(|| {
            "nomadVar: the task has no workload identity token (the server signed none)".to_owned()
        })?;
        for path in &wanted.vars {
            let v = server
                .variable(path, token)
                .await
                .map_err(|e| format!("nomadVar {path:?}: {e}"))?;
            inputs.vars.insert(path.clone(), v);
        }
        for prefix in &wanted.var_lists {
            let v = server
                .variables(prefix, token)
                .await
                .map_err(|e| format!("nomadVarList {prefix:?}: {e}"))?;
            inputs.var_lists.insert(prefix.clone(), v);
        }
    }
    Ok(())
}

/// Render template `t` completely (fetching what it reads).
async fn render_one(
    t: &TemplateSpec,
    dirs: &Dirs,
    env: &BTreeMap<String, String>,
    server: Option<&Arc<dyn TemplateSources>>,
    token: Option<&str>,
) -> Result<String, String> {
    let text = {
        let (t, dirs) = (t.clone(), dirs.clone());
        tokio::task::spawn_blocking(move || template_text(&t, &dirs))
            .await
            .map_err(|e| e.to_string())??
    };
    let mut inputs = Inputs {
        env: env.clone(),
        ..Inputs::default()
    };
    for _ in 0..MAX_ROUNDS {
        let (text, left, right, strict, now) = (
            text.clone(),
            t.left_delimiter.clone(),
            t.right_delimiter.clone(),
            t.error_on_missing_key,
            inputs.clone(),
        );
        let rendering =
            tokio::task::spawn_blocking(move || render::render(&text, &left, &right, strict, &now));
        let (out, wanted) = tokio::time::timeout(RENDER_TIMEOUT, rendering)
            .await
            .map_err(|_| format!("rendering took longer than {RENDER_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())??;
        if wanted.is_empty() {
            return Ok(out);
        }
        fetch(server, &dirs.namespace, &wanted, &mut inputs, token).await?;
    }
    Err(format!(
        "what the template reads was still changing after {MAX_ROUNDS} rounds"
    ))
}

/// Write the rendered `text` to `t`'s destination (link-safe, bounded, `perms`,
/// 0600 under `secrets/`, the task user's).
fn write_one(t: &TemplateSpec, dirs: &Dirs, text: &str) -> Result<(), String> {
    let dest = taskfiles::task_path(&t.destination).map_err(|e| format!("destination: {e}"))?;
    let mode = if dest.is_secret() {
        0o600
    } else {
        taskfiles::parse_perms(&t.perms).map_err(|e| format!("perms: {e}"))?
    };
    let root = match dest.root {
        Root::Task => &dirs.task,
        Root::Alloc => &dirs.shared,
    };
    let top = Dir::open(root).map_err(|e| format!("cannot open {}: {e}", root.display()))?;
    struct Cap;
    impl unpack::Cap for Cap {
        fn remaining(&self) -> u64 {
            render::MAX_RENDERED as u64
        }
        fn spend(&mut self, _: u64) {}
        fn too_large(&self) -> unpack::UnpackError {
            unpack::UnpackError::TooLarge {
                max: render::MAX_RENDERED as u64,
            }
        }
    }
    unpack::write_file_owned(
        &top,
        &dest.rel,
        mode,
        &mut text.as_bytes(),
        &mut Cap,
        dirs.owner,
    )
    .map(|_| ())
    .map_err(|e| format!("destination {}: {e}", t.destination))
}

async fn write(t: &TemplateSpec, dirs: &Dirs, text: String) -> Result<(), String> {
    let (t, dirs) = (t.clone(), dirs.clone());
    tokio::task::spawn_blocking(move || write_one(&t, &dirs, &text))
        .await
        .map_err(|e| e.to_string())?
}

#[tonic::async_trait]
impl AllocTaskHook for TemplateHook {
    fn name(&self) -> &'static str {
        "templates"
    }

    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        req: &mut RunRequest,
        state: &mut HookState,
    ) -> Result<(), String> {
        if ctx.task.templates.is_empty() {
            state.done = true;
            return Ok(());
        }
        let dirs = Dirs {
            task: ctx.task_dir.to_owned(),
            shared: ctx.shared_dir.to_owned(),
            namespace: ctx.alloc.alloc.namespace.clone(),
            owner: task_user::task_owner(&req.driver, &req.config),
        };
        let env = req.env.clone();
        let token = workload_token(ctx);
        if ctx.restored {
            // After an agent restart the task runs with what was rendered, and its
            // poststart was seen before: watch from here on (the first render again
            // is the baseline).
            self.lock().insert(
                ctx.task_id.to_owned(),
                Watched {
                    env,
                    last: vec![None; ctx.task.templates.len()],
                    stop: None,
                    owner: dirs.owner,
                },
            );
            self.watch(ctx);
            return Ok(());
        }
        let task_dir = dirs.task.clone();
        tokio::task::spawn_blocking(move || crate::tasks::create_task_dir(&task_dir))
            .await
            .map_err(|e| format!("making the task directory failed: {e}"))?
            .map_err(|e| format!("cannot make task directory: {e}"))?;
        let mut last = Vec::new();
        let mut added = BTreeMap::new();
        for (i, t) in ctx.task.templates.iter().enumerate() {
            let text = render_one(t, &dirs, &env, self.server.as_ref(), token.as_deref())
                .await
                .map_err(|e| format!("template {i} ({}): {e}", t.destination))?;
            if t.env {
                added.extend(
                    render::parse_env(&text)
                        .map_err(|e| format!("template {i} ({}): env: {e}", t.destination))?,
                );
            }
            write(t, &dirs, text.clone())
                .await
                .map_err(|e| format!("template {i}: {e}"))?;
            last.push(Some(text));
        }
        req.env.extend(added);
        self.lock().insert(
            ctx.task_id.to_owned(),
            Watched {
                env,
                last,
                stop: None,
                owner: dirs.owner,
            },
        );
        Ok(())
    }

    async fn poststart(
        &self,
        ctx: &HookContext<'_>,
        _view: &drover_api::TaskView,
        _state: &mut HookState,
    ) {
        if !ctx.task.templates.is_empty() {
            self.watch(ctx);
        }
    }

    async fn prekill(&self, ctx: &HookContext<'_>, _state: &mut HookState) {
        self.stop_watching(ctx.task_id);
    }

    async fn exited(
        &self,
        ctx: &HookContext<'_>,
        _view: &drover_api::TaskView,
        _state: &mut HookState,
    ) {
        self.stop_watching(ctx.task_id);
    }

    async fn stop(&self, ctx: &HookContext<'_>, _state: &mut HookState) {
        self.stop_watching(ctx.task_id);
    }
}

impl TemplateHook {
    /// Start the task's watcher unless it runs already.
    fn watch(&self, ctx: &HookContext<'_>) {
        let stop = CancellationToken::new();
        let (env, last, owner) = {
            let mut tasks = self.lock();
            let Some(w) = tasks.get_mut(ctx.task_id) else {
                return;
            };
            if w.stop.is_some() {
                return;
            }
            w.stop = Some(stop.clone());
            (w.env.clone(), w.last.clone(), w.owner)
        };
        let watch = Watch {
            task: ctx.task.clone(),
            task_id: ctx.task_id.to_owned(),
            dirs: Dirs {
                task: ctx.task_dir.to_owned(),
                shared: ctx.shared_dir.to_owned(),
                namespace: ctx.alloc.alloc.namespace.clone(),
                owner,
            },
            env,
            token: workload_token(ctx),
            last,
            server: self.server.clone(),
            tasks: ctx.tasks.clone(),
        };
        tokio::spawn(async move {
            tokio::select! {
                () = watch.run() => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

/// A running task's templates, rendered again every [`WATCH_INTERVAL`].
struct Watch {
    task: Task,
    task_id: String,
    dirs: Dirs,
    env: BTreeMap<String, String>,
    token: Option<String>,
    last: Vec<Option<String>>,
    server: Option<Arc<dyn TemplateSources>>,
    tasks: Arc<TaskManager>,
}

impl Watch {
    async fn run(mut self) {
        loop {
            tokio::time::sleep(WATCH_INTERVAL).await;
            let mut restart = false;
            let mut signals = Vec::new();
            let mut splay = Duration::ZERO;
            for (i, t) in self.task.templates.iter().enumerate() {
                let text = match render_one(
                    t,
                    &self.dirs,
                    &self.env,
                    self.server.as_ref(),
                    self.token.as_deref(),
                )
                .await
                {
                    Ok(text) => text,
                    Err(e) => {
                        tracing::warn!(task = %self.task.name, template = i, "rendering again failed: {e}");
                        continue;
                    }
                };
                if self.last.get(i).and_then(Option::as_ref) == Some(&text) {
                    continue;
                }
                let first = self.last.get(i).is_some_and(Option::is_none);
                if let Err(e) = write(t, &self.dirs, text.clone()).await {
                    tracing::warn!(task = %self.task.name, template = i, "{e}");
                    continue;
                }
                if let Some(slot) = self.last.get_mut(i) {
                    *slot = Some(text.clone());
                }
                if first {
                    // After an agent restart: the first render is the baseline.
                    continue;
                }
                if t.env {
                    // The task's next incarnation starts with what rendered now (as
                    // Nomad's: a restart sees the new values, the running one keeps
                    // its environment).
                    match render::parse_env(&text) {
                        Ok(env) => {
                            if let Err(e) = self.tasks.update_env(&self.task_id, env).await {
                                tracing::warn!(task = %self.task.name, template = i, "keeping the environment of the task: {e}");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(task = %self.task.name, template = i, "env: {e}");
                        }
                    }
                }
                tracing::info!(task = %self.task.name, template = i, destination = %t.destination, "template rendered differently");
                splay = splay.max(t.splay);
                match t.change_mode {
                    ChangeMode::Restart => restart = true,
                    ChangeMode::Signal => {
                        if let Some(s) = &t.change_signal
                            && !signals.contains(s)
                        {
                            signals.push(s.clone());
                        }
                    }
                    ChangeMode::Noop => {}
                }
            }
            if !restart && signals.is_empty() {
                continue;
            }
            if !splay.is_zero() {
                let ms = u64::try_from(splay.as_millis()).unwrap_or(u64::MAX);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=ms))).await;
            }
            if restart {
                if let Err(e) = self
                    .tasks
                    .restart(&self.task_id, "template re-rendered")
                    .await
                {
                    tracing::warn!(task = %self.task.name, "restarting after a template change failed: {e}");
                }
            } else {
                for s in signals {
                    if let Err(e) = self.tasks.signal(&self.task_id, &s).await {
                        tracing::warn!(task = %self.task.name, signal = %s, "signalling after a template change failed: {e}");
                    }
                }
            }
        }
    }
}

/// The agent's forwarder as the templates' server.
#[tonic::async_trait]
impl TemplateServer for crate::cluster::forward::Forwarder {
    async fn service(
        &self,
        namespace: &str,
        name: &str,
        token: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, String> {
        let path = format!(
            "/v1/service/{}?namespace={}",
            encode(name),
            encode(namespace)
        );
        let (status, body) = self.get(&path, token).await?;
        match status {
            200 => serde_json::from_slice(&body).map_err(|e| format!("the server's answer: {e}")),
            404 => Ok(Vec::new()),
            s => Err(format!("the server answered {s}: {}", text(&body))),
        }
    }
}

#[tonic::async_trait]
impl VariableSource for crate::cluster::forward::Forwarder {
    async fn variable(
        &self,
        path: &str,
        token: &str,
    ) -> Result<Option<BTreeMap<String, String>>, String> {
        let (status, body) = self
            .get(&format!("/v1/var/{}", encode_path(path)), Some(token))
            .await?;
        match status {
            200 => {
                let v: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| format!("the server's answer: {e}"))?;
                let items = v
                    .get("Items")
                    .and_then(serde_json::Value::as_object)
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(Some(items))
            }
            404 => Ok(None),
            s => Err(format!("the server answered {s}: {}", text(&body))),
        }
    }

    async fn variables(&self, prefix: &str, token: &str) -> Result<Vec<String>, String> {
        let (status, body) = self
            .get(&format!("/v1/vars?prefix={}", encode(prefix)), Some(token))
            .await?;
        match status {
            200 => {
                let v: Vec<serde_json::Value> = serde_json::from_slice(&body)
                    .map_err(|e| format!("the server's answer: {e}"))?;
                Ok(v.iter()
                    .filter_map(|m| m.get("Path").and_then(serde_json::Value::as_str))
                    .map(str::to_owned)
                    .collect())
            }
            s => Err(format!("the server answered {s}: {}", text(&body))),
        }
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn encode_path(s: &str) -> String {
    s.split('/').map(encode).collect::<Vec<_>>().join("/")
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(512)])
        .trim()
        .to_owned()
}
