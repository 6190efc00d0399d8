//! Lifecycle hooks: the steps around a task's start and end, each in one place.
//!
//! The runner calls, for every incarnation of a task: `prestart` on the spec about to
//! be sent to `StartTask` (the first start and every restart, so a deleted task
//! directory is made again), `poststart` once the driver returned a handle, `exited`
//! when that incarnation ended, and `stop` once the task is dead for good.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_plugin_sdk::taskdir::{Dir, FileKind};
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
    /// The attributes the driver sent with its `StartTask` answer, if it did.
    pub reported: Option<BTreeMap<String, String>>,
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

/// The task directory and what the agent makes in it, with their modes (see
/// `docs/architecture.md`, "Task directories"). The task directory keeps other host
/// users out; `logs/` belongs to the agent's user, and only drivers running as that
/// user write it; `secrets/` and `tmp/` are for the task's user alone (drivers that run
/// the task as another user, exec and java, give `local/`, `secrets/` and `tmp/` to it).
pub(crate) const TASK_DIR_MODES: [(&str, u32); 5] = [
    ("", 0o700),
    ("local", 0o755),
    ("tmp", 0o700),
    ("logs", 0o700),
    ("secrets", 0o700),
];

/// The task directory: `local/`, `tmp/`, `logs/` and `secrets/`, with the modes of
/// [`TASK_DIR_MODES`], made again before every start.
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

/// Make (or repair) the task directory `dir` (`<alloc_dir>/<id>`). Everything in it is
/// opened relative to the alloc dir's descriptor without following links: a previous
/// incarnation of the task may have replaced `logs` with a link to `/etc`. Such a
/// planted entry (anything but a directory) is removed, not followed, and made again.
/// Modes are set every time, so a directory made by an older agent (0755, tmp/ 1777)
/// is tightened too.
pub(crate) fn create_task_dir(dir: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a task directory must be a path under the alloc dir",
        ));
    };
    // The alloc dir is the agent's own (the task cannot write it): a trusted path.
    std::fs::create_dir_all(parent)?;
    let alloc = Dir::open(parent)?;
    let (euid, egid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    match alloc.create_new_dir(name, TASK_DIR_MODES[0].1) {
        // New: nothing can be in it yet, so each directory is simply made.
        // Made just now, 0700 and the agent's: nobody else can have put anything in
        // it, so its directories are made and set by name (no descriptor of each to
        // open and close: a tenth of a task start's work in the agent).
        Ok(task) => {
            use rustix::fs::{AtFlags, Gid, Mode, Uid};
            for (sub, mode) in &TASK_DIR_MODES[1..] {
                let mode = Mode::from_raw_mode(*mode);
                rustix::fs::mkdirat(&task, *sub, mode)?;
                // The umask may have taken bits away.
                rustix::fs::chmodat(&task, *sub, mode, AtFlags::empty())?;
                if *sub == "logs" {
                    // The agent's and the drivers' alone (a setgid parent would have
                    // given it the parent's group).
                    rustix::fs::chownat(
                        &task,
                        *sub,
                        Some(Uid::from_raw(euid)),
                        Some(Gid::from_raw(egid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )?;
                }
            }
            return Ok(());
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // It exists (a restart, or an older agent's): whatever the task left in it is
    // checked and tightened.
    let task = alloc.create_dir(name, 0o700)?;
    for (sub, mode) in TASK_DIR_MODES {
        let d = if sub.is_empty() {
            task.open_dir("")?
        } else {
            match task.metadata(sub) {
                Ok(m) if m.kind == FileKind::Dir => task.open_dir(sub)?,
                Ok(m) => {
                    tracing::warn!(
                        "{}: {} where the task's {sub}/ belongs (planted by the task?); \
                         removed it without following it",
                        dir.join(sub).display(),
                        m.kind
                    );
                    task.remove_file(sub)?;
                    task.create_dir(sub, mode)?
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => task.create_dir(sub, mode)?,
                Err(e) => return Err(e),
            }
        };
        d.set_mode(mode)?;
        if sub == "logs" {
            // The agent's and the drivers' alone, whoever owned it before.
            d.set_owner(euid, egid)?;
        }
    }
    Ok(())
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
        let in_alloc = !spec.alloc_dir.as_os_str().is_empty();
        for (k, v) in vars {
            // A task of an allocation is named after its allocation in the task list;
            // its DROVER_TASK_NAME is the task's name in its group, which the
            // allocation runner (never an API request: only it sets `alloc_dir`) put
            // in the environment.
            if in_alloc && k == "DROVER_TASK_NAME" && spec.env.contains_key(k) {
                continue;
            }
            spec.env.insert(k.to_owned(), v);
        }
        if in_alloc {
            spec.env.insert(
                "DROVER_ALLOC_DIR".to_owned(),
                spec.alloc_dir.display().to_string(),
            );
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
        if let Some(attributes) = started.reported.take() {
            started.attributes = attributes;
            return;
        }
        let id = &started.handle.spec.id;
        // Facts are nice to have; a slow or failing InspectTask must not hold up a start.
        match tokio::time::timeout(INSPECT_TIMEOUT, started.driver.inspect_task(id)).await {
            Ok(Ok(status)) => started.attributes = status.attributes,
            Ok(Err(e)) => tracing::debug!(task = %id, "InspectTask after start failed: {e}"),
            Err(_) => tracing::debug!(task = %id, "InspectTask after start timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, symlink};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn task_dir_modes_are_as_documented_and_tightened_on_an_old_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("alloc/t1");
        create_task_dir(&dir).unwrap();
        for (sub, m) in TASK_DIR_MODES {
            assert_eq!(mode(&dir.join(sub)), m, "{sub}/");
        }
        // A directory an older agent made: 0755, tmp/ 1777, logs/ 0755.
        let old = tmp.path().join("alloc/t2");
        for sub in ["local", "tmp", "logs", "secrets"] {
            std::fs::create_dir_all(old.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt as _;
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(&old, 0o755);
        set(&old.join("tmp"), 0o1777);
        set(&old.join("logs"), 0o755);
        create_task_dir(&old).unwrap();
        for (sub, m) in TASK_DIR_MODES {
            assert_eq!(mode(&old.join(sub)), m, "{sub}/ of an old task dir");
        }
    }

    #[test]
    fn planted_links_are_replaced_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("host-dir");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o751)).unwrap();
        let dir = tmp.path().join("alloc/t1");
        create_task_dir(&dir).unwrap();
        std::fs::remove_dir(dir.join("logs")).unwrap();
        symlink(&target, dir.join("logs")).unwrap();
        std::fs::remove_dir(dir.join("tmp")).unwrap();
        std::fs::write(dir.join("tmp"), "a file").unwrap();
        create_task_dir(&dir).unwrap();
        for sub in ["logs", "tmp"] {
            let m = std::fs::symlink_metadata(dir.join(sub)).unwrap();
            assert!(m.is_dir(), "{sub} is a directory again");
        }
        // The link's target was neither chmod'ed, chown'ed nor emptied.
        assert_eq!(mode(&target), 0o751);
        assert!(target.join("keep").exists());

        // The task directory itself a link: refused (only the agent writes alloc/).
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, tmp.path().join("alloc/t3")).unwrap();
        let e = create_task_dir(&tmp.path().join("alloc/t3")).unwrap_err();
        assert!(drover_plugin_sdk::taskdir::refusal(&e).is_some(), "{e}");
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    }
}
