//! The artifact hook: before a task first starts, each of its `artifact` blocks is
//! downloaded over http(s), checked against its checksum, and put into the task
//! directory, unpacked when its name says it is an archive (see [`unpack`]).
//!
//! - The download goes to an unnamed file in the allocation's own directory (the
//!   agent's, not the task's), bounded in bytes and time ([`ArtifactLimits`]); the
//!   checksum is verified before anything is unpacked or placed.
//! - The destination is checked again here ([`drover_server_api::taskfiles`]): it
//!   stays in the task's `local/`, `secrets/`, `tmp/` or the shared `alloc/`. Every
//!   directory and file is made beneath the task directory's descriptor without
//!   following links, so a link the task (or an earlier artifact) planted is refused.
//! - A failure fails the task's start with the reason (`artifacts hook: failed to
//!   download artifact ...`, Nomad's "Failed Artifact Download"). Done once: a
//!   restart of the task does not download again.
//! - `source` and `headers` may use the task's `${NOMAD_*}` variables.

mod fetch;
pub(crate) mod unpack;

use std::io::{Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_api::RunRequest;
use drover_plugin_sdk::taskdir::{Dir, OpenOptions};
use drover_server_api::taskfiles::{self, Root, TaskPath};
use drover_server_api::{ARTIFACT_HOOK, ArtifactMode, ArtifactSpec};
use serde::{Deserialize, Serialize};

use super::hooks::{AllocTaskHook, HookContext, HookState};
use crate::taskenv::interpolate::{self, Syntax};
use unpack::{Format, UnpackLimits};

/// Bounds on artifacts, `[artifact]` in the agent's config (Nomad's client `artifact`
/// block has `http_max_size` and `http_read_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArtifactLimits {
    /// Most bytes downloaded for one artifact.
    pub max_download_bytes: u64,
    /// Most bytes one archive unpacks to.
    pub max_unpacked_bytes: u64,
    /// Most entries (files and directories) of one archive.
    pub max_entries: u64,
    /// Longest time one artifact may take (download and unpack).
    #[serde(
        serialize_with = "crate::config::ser_duration",
        deserialize_with = "crate::config::de_duration"
    )]
    pub timeout: Duration,
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits {
            max_download_bytes: 1 << 30,
            max_unpacked_bytes: 4 << 30,
            max_entries: 100_000,
            timeout: Duration::from_secs(30 * 60),
        }
    }
}

impl ArtifactLimits {
    /// Each bound is at least 1.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("max_download_bytes", self.max_download_bytes),
            ("max_unpacked_bytes", self.max_unpacked_bytes),
            ("max_entries", self.max_entries),
        ] {
            if v == 0 {
                return Err(format!("artifact.{name} must be at least 1 (got 0)"));
            }
        }
        if self.timeout.is_zero() {
            return Err("artifact.timeout must be more than 0 (e.g. \"30m\")".into());
        }
        Ok(())
    }
}

/// The prefix of a task's message when an artifact failed it.
pub const FAILURE_PREFIX: &str = "failed to download artifact";

/// Downloads and places a task's artifacts before its first start.
pub(crate) struct ArtifactHook {
    limits: ArtifactLimits,
    downloader: tokio::sync::OnceCell<fetch::Downloader>,
}

impl ArtifactHook {
    pub(crate) fn new(limits: ArtifactLimits) -> Self {
        ArtifactHook {
            limits,
            downloader: tokio::sync::OnceCell::new(),
        }
    }
}

#[tonic::async_trait]
impl AllocTaskHook for ArtifactHook {
    fn name(&self) -> &'static str {
        ARTIFACT_HOOK
    }

    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        req: &mut RunRequest,
        state: &mut HookState,
    ) -> Result<(), String> {
        if ctx.task.artifacts.is_empty() || ctx.restored {
            state.done = true;
            return Ok(());
        }
        let task_dir = ctx.task_dir.to_owned();
        tokio::task::spawn_blocking(move || crate::tasks::create_task_dir(&task_dir))
            .await
            .map_err(|e| format!("making the task directory failed: {e}"))?
            .map_err(|e| format!("cannot make task directory: {e}"))?;
        let downloader = self
            .downloader
            .get_or_init(|| async { fetch::Downloader::new() })
            .await;
        for (i, a) in ctx.task.artifacts.iter().enumerate() {
            let shown = fetch::redact(&a.source);
            let one = fetch_one(downloader, ctx, a, &req.env, self.limits);
            match tokio::time::timeout(self.limits.timeout, one).await {
                Ok(Ok(())) => {
                    tracing::info!(alloc = %ctx.alloc.alloc.id, task = %ctx.task.name, artifact = i, source = %shown, "artifact in place");
                }
                Ok(Err(why)) => return Err(format!("{FAILURE_PREFIX} {shown:?}: {why}")),
                Err(_) => {
                    return Err(format!(
                        "{FAILURE_PREFIX} {shown:?}: took longer than {} (the agent's artifact.timeout)",
                        drover_api::human_duration(self.limits.timeout)
                    ));
                }
            }
        }
        state.done = true;
        Ok(())
    }
}

/// `${NAME}` references of `text` replaced from the task's environment.
fn with_env(
    text: &str,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<String, String> {
    interpolate::interpolate(
        text,
        Syntax::Plain,
        |n| env.get(n).map(String::as_str),
        &mut interpolate::Budget::default(),
    )
    .map(std::borrow::Cow::into_owned)
    .map_err(|e| e.to_string())
}

/// Download, verify and place one artifact.
async fn fetch_one(
    downloader: &fetch::Downloader,
    ctx: &HookContext<'_>,
    a: &ArtifactSpec,
    env: &std::collections::BTreeMap<String, String>,
    limits: ArtifactLimits,
) -> Result<(), String> {
    let source = with_env(&a.source, env)?;
    taskfiles::check_source(&source)?;
    let dest = taskfiles::task_path(&a.destination).map_err(|e| format!("destination: {e}"))?;
    let checksum = a
        .options
        .get("checksum")
        .filter(|c| !c.is_empty())
        .map(|c| taskfiles::parse_checksum(c))
        .transpose()
        .map_err(|e| format!("options.checksum: {e}"))?;
    let archive =
        taskfiles::archive_option(&a.options).map_err(|e| format!("options.archive: {e}"))?;
    let mut headers = std::collections::BTreeMap::new();
    for (k, v) in &a.headers {
        headers.insert(k.clone(), with_env(v, env)?);
    }
    let name = file_name(&source)?;
    let format = if archive && a.mode != ArtifactMode::File {
        unpack::format_of(&name)?
    } else {
        None
    };

    // The download: an unnamed file in the allocation's directory (the agent's).
    let alloc_root = ctx.alloc_root.to_owned();
    let mut file = tokio::task::spawn_blocking(move || scratch_file(&alloc_root))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot make a file for the download: {e}"))?;
    let mut hasher = checksum.as_ref().map(|c| fetch::Hasher::new(c.kind));
    let bytes = downloader
        .fetch(
            &source,
            &headers,
            limits.max_download_bytes,
            &mut file,
            Some(&mut hasher),
        )
        .await
        .map_err(|e| e.to_string())?;
    if let (Some(want), Some(h)) = (&checksum, hasher) {
        fetch::verify(want, &fetch::finish(h))?;
    }
    tracing::debug!(task = %ctx.task.name, bytes, "artifact downloaded");

    let root = match dest.root {
        Root::Task => ctx.task_dir.to_owned(),
        Root::Alloc => ctx.shared_dir.to_owned(),
    };
    let mode = a.mode;
    tokio::task::spawn_blocking(move || place(file, &root, &dest, mode, format, &name, limits))
        .await
        .map_err(|e| e.to_string())?
}

/// The last segment of the URL's path: the file's name (go-getter's).
fn file_name(source: &str) -> Result<String, String> {
    let uri: http::Uri = source
        .parse()
        .map_err(|e| format!("{}: {e}", fetch::redact(source)))?;
    let name = uri.path().rsplit('/').next().unwrap_or_default();
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!(
            "{}: the URL's path names no file",
            fetch::redact(source)
        ));
    }
    Ok(name.to_owned())
}

/// A read-write file with no name in `dir` (created, then unlinked at once).
fn scratch_file(dir: &Path) -> std::io::Result<std::fs::File> {
    let d = Dir::open(dir)?;
    let name = format!(".artifact-{}", uuid::Uuid::new_v4().simple());
    let f = d.open_file(
        &name,
        &OpenOptions::new().read(true).write(true).create(0o600),
    )?;
    d.remove_file(&name)?;
    Ok(f)
}

/// Put the verified download where the artifact goes: unpacked into the destination
/// directory, or as a file (`mode = "file"`: the destination is the file; otherwise
/// the file keeps its name inside the destination directory).
fn place(
    mut file: std::fs::File,
    root: &Path,
    dest: &TaskPath,
    mode: ArtifactMode,
    format: Option<Format>,
    name: &str,
    limits: ArtifactLimits,
) -> Result<(), String> {
    let top = Dir::open(root).map_err(|e| format!("cannot open {}: {e}", root.display()))?;
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let unpack_limits = UnpackLimits {
        max_bytes: limits.max_unpacked_bytes,
        max_entries: limits.max_entries,
    };
    match (format, mode) {
        (Some(format), _) => {
            let dir = top
                .create_dir_all(&dest.rel, 0o755)
                .map_err(|e| format!("destination {}: {e}", dest.rel.display()))?;
            let gz_name = name
                .strip_suffix(".gz")
                .or_else(|| name.strip_suffix(".GZ"))
                .unwrap_or(name);
            let done = unpack::unpack(&mut file, format, gz_name, &dir, unpack_limits)
                .map_err(|e| e.to_string())?;
            tracing::debug!(files = done.files, bytes = done.bytes, "artifact unpacked");
            Ok(())
        }
        (None, ArtifactMode::File) if !dest.trailing_slash => {
            write_plain(&top, &dest.rel, &mut file, limits)
        }
        (None, _) => {
            let rel: PathBuf = dest.rel.join(name);
            write_plain(&top, &rel, &mut file, limits)
        }
    }
}

/// The download as the file `rel` beneath `top` (0644).
fn write_plain(
    top: &Dir,
    rel: &Path,
    file: &mut std::fs::File,
    limits: ArtifactLimits,
) -> Result<(), String> {
    struct Plain(u64, u64);
    impl unpack::Cap for Plain {
        fn remaining(&self) -> u64 {
            self.0.saturating_sub(self.1)
        }
        fn spend(&mut self, n: u64) {
            self.1 += n;
        }
        fn too_large(&self) -> unpack::UnpackError {
            unpack::UnpackError::TooLarge { max: self.0 }
        }
    }
    let mut cap = Plain(limits.max_download_bytes, 0);
    unpack::write_file(top, rel, 0o644, file, &mut cap)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
