//! The task's workload identity: the JWT the server signed for this task of this
//! allocation (`ClientAllocation::identities`), written to `secrets/nomad_token`
//! (0600) before every start, as Nomad's identity hook does, and/or put in the task's
//! environment as `NOMAD_TOKEN`, as its `identity { env, file }` block says (without
//! one: the file only). It lets the task read its own job's variables
//! (`nomad/jobs/<job>[/<group>[/<task>]]`) and nothing else.
//!
//! The file (and `secrets/`) belongs to the user the task runs as
//! ([`super::task_user`]): an exec task runs as `nobody` and must be able to read it.
//!
//! The task owns its directory and may have planted links there: the file is opened
//! beneath the task directory's descriptor without following links, created with
//! `O_EXCL` or, when present, refused if it is not a regular file with one link, and
//! given to the task's user through that descriptor.

use std::io::Write as _;
use std::path::Path;

use drover_api::RunRequest;
use drover_plugin_sdk::taskdir::{Dir, OpenOptions};

use super::hooks::{AllocTaskHook, HookContext, HookState};
use super::task_user::{self, Owner};

/// Where the token lands, under the task directory (Nomad's).
pub const TOKEN_FILE: &str = "secrets/nomad_token";

/// The variable that holds the token with `identity { env = true }` (Nomad's).
pub const TOKEN_ENV: &str = "NOMAD_TOKEN";

/// Writes each task's workload identity to `secrets/nomad_token`.
pub(crate) struct IdentityHook;

/// Write `token` to `<task_dir>/secrets/nomad_token`, 0600, without following links;
/// the file and `secrets/` are `owner`'s when there is one.
pub(crate) fn write_token(
    task_dir: &Path,
    token: &str,
    owner: Option<Owner>,
) -> std::io::Result<()> {
    crate::tasks::create_task_dir(task_dir)?;
    let secrets = Dir::open(task_dir)?.open_dir("secrets")?;
    if let Some(owner) = owner {
        // The driver gives it to the task's user too (exec, java); the file in it is
        // no use to the task otherwise.
        owner.give(&secrets)?;
    }
    let mut f = secrets.open_file(
        "nomad_token",
        &OpenOptions::new()
            .write(true)
            .truncate(true)
            .create(0o600)
            .single_link(true),
    )?;
    if let Some(owner) = owner {
        owner.give(&f)?;
    }
    // An existing file keeps its inode: make sure it is the task user's alone.
    use std::os::unix::fs::PermissionsExt as _;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    // Not synced: only a machine crash loses it, and a task lost in a crash is not
    // restarted; after an agent restart the allocation's hooks write it again. Nomad
    // does not sync it either. A sync here cost one fsync per task of an allocation.
    f.write_all(token.as_bytes())
}

#[tonic::async_trait]
impl AllocTaskHook for IdentityHook {
    fn name(&self) -> &'static str {
        "identity"
    }
    async fn prestart(
        &self,
        ctx: &HookContext<'_>,
        req: &mut RunRequest,
        _state: &mut HookState,
    ) -> Result<(), String> {
        let Some(token) = ctx.alloc.identities.get(&ctx.task.name).cloned() else {
            return Ok(());
        };
        let wanted = ctx.task.identity();
        if wanted.env {
            req.env.insert(TOKEN_ENV.to_owned(), token.clone());
        }
        if !wanted.file {
            return Ok(());
        }
        let owner = task_user::task_owner(&req.driver, &req.config);
        let dir = ctx.task_dir.to_owned();
        tokio::task::spawn_blocking(move || write_token(&dir, &token, owner))
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
        write_token(&dir, "a.b.c", None).unwrap();
        let file = dir.join(TOKEN_FILE);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "a.b.c");
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        // Written again (a restart, a new key): replaced, not appended.
        write_token(&dir, "d.e.f", None).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "d.e.f");
        // The task replaced it with a link to a host file: refused, the target intact.
        let target = tmp.path().join("host-file");
        std::fs::write(&target, "keep").unwrap();
        std::fs::remove_file(&file).unwrap();
        symlink(&target, &file).unwrap();
        assert!(write_token(&dir, "x.y.z", None).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        // A hard link to a host file: refused too.
        std::fs::remove_file(&file).unwrap();
        std::fs::hard_link(&target, &file).unwrap();
        assert!(write_token(&dir, "x.y.z", None).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    /// The token and `secrets/` go to the task's user; a link planted in place of the
    /// file is refused and its target keeps its owner. Needs root (chown).
    #[test]
    fn the_token_goes_to_the_task_user_never_through_a_link() {
        if !rustix::process::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "giving files to a task's user needs root (CI=true: a failure)"
            );
            eprintln!("SKIPPED: giving the token to the task's user needs root");
            return;
        }
        let nobody = Owner {
            uid: 65534,
            gid: 65534,
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("alloc/t1");
        write_token(&dir, "a.b.c", Some(nobody)).unwrap();
        let file = dir.join(TOKEN_FILE);
        let m = std::fs::metadata(&file).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (65534, 65534, 0o600));
        let d = std::fs::metadata(dir.join("secrets")).unwrap();
        assert_eq!((d.uid(), d.gid()), (65534, 65534));
        let target = tmp.path().join("host-file");
        std::fs::write(&target, "keep").unwrap();
        std::fs::remove_file(&file).unwrap();
        symlink(&target, &file).unwrap();
        assert!(write_token(&dir, "x.y.z", Some(nobody)).is_err());
        let t = std::fs::metadata(&target).unwrap();
        assert_eq!(
            (t.uid(), std::fs::read_to_string(&target).unwrap().as_str()),
            (0, "keep")
        );
    }
}
