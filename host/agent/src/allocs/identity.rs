//! The task's workload identity: the JWT the server signed for this task of this
//! allocation (`ClientAllocation::identities`), written to `secrets/nomad_token`
//! (0600) before every start, as Nomad's identity hook does. It lets the task read its
//! own job's variables (`nomad/jobs/<job>[/<group>[/<task>]]`) and nothing else.
//!
//! The task owns its directory and may have planted links there: the file is opened
//! beneath the task directory's descriptor without following links, created with
//! `O_EXCL` or, when present, refused if it is not a regular file with one link.

use std::io::Write as _;
use std::path::Path;

use drover_api::RunRequest;
use drover_plugin_sdk::taskdir::{Dir, OpenOptions};

use super::hooks::{AllocTaskHook, HookContext, HookState};

/// Where the token lands, under the task directory (Nomad's).
pub const TOKEN_FILE: &str = "secrets/nomad_token";

/// Writes each task's workload identity to `secrets/nomad_token`.
pub(crate) struct IdentityHook;

/// Write `token` to `<task_dir>/secrets/nomad_token`, 0600, without following links.
pub(crate) fn write_token(task_dir: &Path, token: &str) -> std::io::Result<()> {
    crate::tasks::create_task_dir(task_dir)?;
    let secrets = Dir::open(task_dir)?.open_dir("secrets")?;
    let mut f = secrets.open_file(
        "nomad_token",
        &OpenOptions::new()
            .write(true)
            .truncate(true)
            .create(0o600)
            .single_link(true),
    )?;
    // An existing file keeps its inode: make sure it is the task user's alone.
    use std::os::unix::fs::PermissionsExt as _;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(token.as_bytes())?;
    f.sync_all()
}

#[tonic::async_trait]
impl AllocTaskHook for IdentityHook {
    fn name(&self) -> &'static str {
        "identity"
    }
    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        _req: &mut RunRequest,
        _state: &mut HookState,
    ) -> Result<(), String> {
        let Some(token) = ctx.alloc.identities.get(&ctx.task.name).cloned() else {
            return Ok(());
        };
        let dir = ctx.task_dir.to_owned();
        tokio::task::spawn_blocking(move || write_token(&dir, &token))
            .await
            .map_err(|e| format!("writing the workload identity failed: {e}"))?
            .map_err(|e| {
                format!(
                    "cannot write the workload identity to {}: {e}",
                    ctx.task_dir.join(TOKEN_FILE).display()
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, symlink};

    #[test]
    fn the_token_is_private_and_a_planted_link_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("alloc/t1");
        write_token(&dir, "a.b.c").unwrap();
        let file = dir.join(TOKEN_FILE);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "a.b.c");
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        // Written again (a restart, a new key): replaced, not appended.
        write_token(&dir, "d.e.f").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "d.e.f");
        // The task replaced it with a link to a host file: refused, the target intact.
        let target = tmp.path().join("host-file");
        std::fs::write(&target, "keep").unwrap();
        std::fs::remove_file(&file).unwrap();
        symlink(&target, &file).unwrap();
        assert!(write_token(&dir, "x.y.z").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        // A hard link to a host file: refused too.
        std::fs::remove_file(&file).unwrap();
        std::fs::hard_link(&target, &file).unwrap();
        assert!(write_token(&dir, "x.y.z").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
