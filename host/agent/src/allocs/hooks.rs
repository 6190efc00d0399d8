//! Task hooks of an allocation (the shape of Nomad's task runner hooks): steps around
//! each task of a group, each with a small state of its own that is kept in the
//! allocation's record, so it survives agent restarts.
//!
//! The runner calls, per task: `prestart` before the task is started (and again after
//! an agent restart, with [`HookContext::restored`] set and the request thrown away,
//! unless the hook marked itself done), `poststart` after each start it sees, `prekill`
//! before it stops the task, `exited` once the task is dead for good, `update` when the
//! server changed the allocation, `stop` when the allocation is collected.

use std::path::{Path, PathBuf};

use drover_api::{RunRequest, TaskView};
use drover_plugin_sdk::FsIsolation;
use drover_plugin_sdk::taskdir::{Dir, FileKind};
use drover_server_api::{ClientAllocation, Task};
use serde::{Deserialize, Serialize};

use super::artifacts::{ArtifactHook, ArtifactLimits};
use super::templates::{TemplateHook, TemplateSources};
use crate::taskenv::{NodeEnv, TaskDirs, TaskEnv};

/// Largest hook state kept (its JSON): state is for small facts, not data.
pub const MAX_HOOK_STATE: usize = 4096;

/// What one hook keeps for one task across agent restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HookState {
    /// The hook's prestart has done its work for good: it is not called again (after
    /// an agent restart either). The other methods are still called.
    #[serde(default)]
    pub done: bool,
    /// The hook's own data (at most [`MAX_HOOK_STATE`] bytes of JSON).
    #[serde(default)]
    pub data: serde_json::Value,
}

impl HookState {
    /// Enforce [`MAX_HOOK_STATE`]: an oversized state loses its data (logged).
    pub(super) fn bound(&mut self, hook: &str, task: &str) {
        let size = serde_json::to_vec(&self.data).map_or(usize::MAX, |v| v.len());
        if size > MAX_HOOK_STATE {
            tracing::warn!(
                hook,
                task,
                size,
                "hook state is larger than {MAX_HOOK_STATE} bytes; dropped"
            );
            self.data = serde_json::Value::Null;
        }
    }
}

/// What a hook knows about the task it is called for.
pub struct HookContext<'a> {
    /// The allocation as the server last sent it.
    pub alloc: &'a ClientAllocation,
    /// The task's spec in the group.
    pub task: &'a Task,
    /// The node-local task id.
    pub task_id: &'a str,
    /// The allocation's own directory (`<data_dir>/alloc/<alloc id>`).
    pub alloc_root: &'a Path,
    /// The shared directory (`<alloc_root>/alloc`): `DROVER_ALLOC_DIR`.
    pub shared_dir: &'a Path,
    /// The task's directory on the host (`<data_dir>/alloc/<task id>`).
    pub task_dir: &'a Path,
    /// How the task's driver isolates its filesystem (where the task sees its
    /// directories).
    pub fs_isolation: FsIsolation,
    /// The node the allocation runs on.
    pub node: &'a NodeEnv,
    /// Called again after an agent restart for a task already started: what a
    /// prestart changes in the request is not used.
    pub restored: bool,
    /// The task manager (a hook that restarts or signals the task: templates).
    pub tasks: &'a std::sync::Arc<crate::tasks::TaskManager>,
}

/// One step around the tasks of an allocation. Every method defaults to nothing.
#[tonic::async_trait]
pub trait AllocTaskHook: Send + Sync {
    /// Key of its state in the record, and for logs.
    fn name(&self) -> &'static str;
    /// Before the task starts; may change the request. An error fails the task.
    async fn prestart(
        &self,
        _ctx: &HookContext<'_>,
        _req: &mut RunRequest,
        _state: &mut HookState,
    ) -> Result<(), String> {
        Ok(())
    }
    /// After a start of the task was seen.
    async fn poststart(&self, _ctx: &HookContext<'_>, _view: &TaskView, _state: &mut HookState) {}
    /// Before the runner stops the task.
    async fn prekill(&self, _ctx: &HookContext<'_>, _state: &mut HookState) {}
    /// Once the task is dead for good.
    async fn exited(&self, _ctx: &HookContext<'_>, _view: &TaskView, _state: &mut HookState) {}
    /// The server changed the allocation (`ctx.alloc` is the new one).
    async fn update(&self, _ctx: &HookContext<'_>, _state: &mut HookState) {}
    /// The allocation is being collected: last chance to clean up.
    async fn stop(&self, _ctx: &HookContext<'_>, _state: &mut HookState) {}
}

/// The hooks every task of an allocation gets, in order: the shared directory
/// (`alloc_dir`), the allocation's variables (`alloc_env`), the job version a task was
/// started with (`job_version`), the task's artifacts (`artifacts`, with the default
/// [`ArtifactLimits`]) and templates (`templates`, with no server: `nomadService` and
/// `nomadVar` fail).
pub fn default_hooks() -> Vec<Box<dyn AllocTaskHook>> {
    configured_hooks(ArtifactLimits::default(), None)
}

/// [`default_hooks`] with the agent's `[artifact]` limits, and the cluster servers
/// templates read services and variables from.
pub fn configured_hooks(
    artifact: ArtifactLimits,
    server: Option<std::sync::Arc<dyn TemplateSources>>,
) -> Vec<Box<dyn AllocTaskHook>> {
    vec![
        Box::new(AllocDirHook),
        Box::new(AllocEnvHook),
        Box::new(JobVersionHook),
        Box::new(super::identity::IdentityHook),
        Box::new(ArtifactHook::new(artifact)),
        Box::new(TemplateHook::new(server)),
    ]
}

/// Modes of the shared directory (see docs/cluster.md, "Allocations on the client").
/// The allocation's directories belong to the agent; `data/` and `tmp/` are writable
/// by every task of the group, which may run as different users (exec tasks run as
/// `nobody` by default), so they are world-writable with the sticky bit, like `/tmp`:
/// a task cannot remove or rename another user's files. `logs/` is the agent's.
pub(crate) const SHARED_DIR_MODES: [(&str, u32); 4] = [
    ("", 0o755),
    ("data", 0o1777),
    ("logs", 0o755),
    ("tmp", 0o1777),
];

/// Make `<alloc_root>/alloc/{data,logs,tmp}` with [`SHARED_DIR_MODES`]. Everything is
/// opened from the allocation directory's descriptor without following links: a
/// task running as the agent's user could have replaced `alloc/data` with a link to
/// `/etc`, which must not become world-writable. Such an entry is refused (the task
/// fails to start), never followed. Returns the shared directory.
pub(crate) fn create_alloc_dir(alloc_root: &Path) -> std::io::Result<PathBuf> {
    let (Some(parent), Some(name)) = (alloc_root.parent(), alloc_root.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "an allocation directory must be a path under the alloc dir",
        ));
    };
    // `<data_dir>/alloc` is the agent's own: a trusted path.
    std::fs::create_dir_all(parent)?;
    let root = Dir::open(parent)?.create_dir(name, 0o755)?;
    root.set_mode(0o755)?;
    let shared = root.create_dir("alloc", 0o755)?;
    for (sub, mode) in SHARED_DIR_MODES {
        let d = if sub.is_empty() {
            shared.open_dir("")?
        } else {
            match shared.metadata(sub) {
                Ok(m) if m.kind == FileKind::Dir => shared.open_dir(sub)?,
                Ok(m) => {
                    return Err(std::io::Error::other(format!(
                        "{} is a {} (planted by a task?); refusing to use it",
                        alloc_root.join("alloc").join(sub).display(),
                        m.kind
                    )));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    shared.create_dir(sub, mode)?
                }
                Err(e) => return Err(e),
            }
        };
        d.set_mode(mode)?;
    }
    Ok(alloc_root.join("alloc"))
}

/// Makes the shared allocation directory, once per task: its state records the
/// directory and marks it done, so that an agent restart does not touch the directory
/// again (its tasks may have changed what is theirs to change).
pub(crate) struct AllocDirHook;

#[tonic::async_trait]
impl AllocTaskHook for AllocDirHook {
    fn name(&self) -> &'static str {
        "alloc_dir"
    }
    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        _req: &mut RunRequest,
        state: &mut HookState,
    ) -> Result<(), String> {
        let root = ctx.alloc_root.to_owned();
        let shared = tokio::task::spawn_blocking(move || create_alloc_dir(&root))
            .await
            .map_err(|e| format!("making the allocation directory failed: {e}"))?
            .map_err(|e| {
                format!(
                    "cannot make allocation directory {}: {e}",
                    ctx.alloc_root.display()
                )
            })?;
        state.data = serde_json::json!({ "dir": shared.display().to_string() });
        state.done = true;
        Ok(())
    }
}

/// The allocation's variables and interpolation (see [`crate::taskenv`]): Nomad's
/// `NOMAD_*` variables and `NOMAD_META_*` under the task's `env` (interpolated), then
/// `DROVER_ALLOC_ID`, `DROVER_ALLOC_INDEX`, `DROVER_GROUP_NAME`, `DROVER_JOB_NAME`,
/// `DROVER_TASK_NAME`, which win over the task's `env` (the task manager adds
/// `DROVER_ALLOC_DIR` from the spec, and its own task variables). Every string of the
/// task's `config` is interpolated against the result, before the driver sees it.
pub(crate) struct AllocEnvHook;

#[tonic::async_trait]
impl AllocTaskHook for AllocEnvHook {
    fn name(&self) -> &'static str {
        "alloc_env"
    }
    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        req: &mut RunRequest,
        _state: &mut HookState,
    ) -> Result<(), String> {
        let a = &ctx.alloc.alloc;
        let dirs = TaskDirs::for_driver(ctx.fs_isolation, ctx.shared_dir, ctx.task_dir);
        // What the request's env holds so far (the task's `env`, and whatever an
        // earlier hook added) is the user's part.
        let mut task = ctx.task.clone();
        task.env = std::mem::take(&mut req.env);
        let mut task_env =
            TaskEnv::build(ctx.node, ctx.alloc, &task, &dirs).map_err(|e| e.to_string())?;
        for (k, v) in [
            ("DROVER_ALLOC_ID", a.id.clone()),
            ("DROVER_ALLOC_NAME", a.name.clone()),
            ("DROVER_ALLOC_INDEX", a.index.to_string()),
            ("DROVER_GROUP_NAME", a.group.clone()),
            ("DROVER_JOB_NAME", a.job_name.clone()),
            ("DROVER_TASK_NAME", ctx.task.name.clone()),
        ] {
            task_env.env.insert(k.to_owned(), v);
        }
        task_env
            .interpolate_config(&mut req.config)
            .map_err(|e| e.to_string())?;
        req.env = task_env.env;
        Ok(())
    }
}

/// Remembers the job version a task was started with, and says so in the task's
/// message when the server moves the allocation to another version: tasks are not
/// changed in place (the server replaces allocations whose tasks changed).
pub(crate) struct JobVersionHook;

impl JobVersionHook {
    pub(crate) const NAME: &'static str = "job_version";
}

#[tonic::async_trait]
impl AllocTaskHook for JobVersionHook {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        _req: &mut RunRequest,
        state: &mut HookState,
    ) -> Result<(), String> {
        if !ctx.restored {
            state.data = serde_json::json!({ "started": ctx.alloc.alloc.job_version });
        }
        state.done = true;
        Ok(())
    }
    async fn update(&self, ctx: &HookContext<'_>, state: &mut HookState) {
        let now = ctx.alloc.alloc.job_version;
        let started = state
            .data
            .get("started")
            .and_then(serde_json::Value::as_u64);
        if let Some(started) = started
            && started != now
        {
            tracing::info!(
                alloc = %ctx.alloc.alloc.id,
                task = %ctx.task.name,
                started,
                now,
                "the allocation moved to another job version; the task keeps running as started"
            );
            state.data["current"] = serde_json::json!(now);
        }
    }
}

/// The message of a task whose allocation moved on to another job version.
pub(crate) fn version_note(state: Option<&HookState>) -> Option<String> {
    let d = &state?.data;
    let started = d.get("started")?.as_u64()?;
    let current = d.get("current")?.as_u64()?;
    (started != current)
        .then(|| format!("runs job version {started}; the allocation is now at version {current}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, symlink};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn shared_dir_modes_and_planted_links_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("alloc/a1");
        let shared = create_alloc_dir(&root).unwrap();
        assert_eq!(shared, root.join("alloc"));
        for (sub, m) in SHARED_DIR_MODES {
            assert_eq!(mode(&shared.join(sub)), m, "alloc/{sub}");
        }
        assert_eq!(mode(&root), 0o755);

        // A task (as the agent's user) swapped data/ for a link to a host directory.
        let target = tmp.path().join("host-dir");
        std::fs::create_dir(&target).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_dir(shared.join("data")).unwrap();
        symlink(&target, shared.join("data")).unwrap();
        let e = create_alloc_dir(&root).unwrap_err().to_string();
        assert!(e.contains("alloc/data") && e.contains("refusing"), "{e}");
        assert_eq!(mode(&target), 0o700, "the link's target was not chmod'ed");

        // The allocation directory itself a link: refused, nothing made there.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, tmp.path().join("alloc/a2")).unwrap();
        let e = create_alloc_dir(&tmp.path().join("alloc/a2")).unwrap_err();
        assert!(drover_plugin_sdk::taskdir::refusal(&e).is_some(), "{e}");
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    }

    #[test]
    fn oversized_state_loses_its_data() {
        let mut s = HookState {
            done: true,
            data: serde_json::json!("x".repeat(MAX_HOOK_STATE + 1)),
        };
        s.bound("h", "t");
        assert_eq!(s.data, serde_json::Value::Null);
        assert!(s.done);
        let mut small = HookState {
            done: false,
            data: serde_json::json!({"a": 1}),
        };
        small.bound("h", "t");
        assert_eq!(small.data, serde_json::json!({"a": 1}));
    }

    #[test]
    fn version_note_only_when_versions_differ() {
        let s = |d| HookState {
            done: true,
            data: d,
        };
        assert_eq!(
            version_note(Some(&s(serde_json::json!({"started": 1})))),
            None
        );
        assert_eq!(
            version_note(Some(&s(serde_json::json!({"started": 1, "current": 1})))),
            None
        );
        assert!(
            version_note(Some(&s(serde_json::json!({"started": 1, "current": 2}))))
                .unwrap()
                .contains("version 1")
        );
    }
}
