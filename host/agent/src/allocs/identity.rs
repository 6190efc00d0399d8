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
//! The task owns its directory and may have planted links there. The token is written
//! to a new file beside the old one, created beneath the task directory's descriptor
//! without following links (`O_EXCL`, never a file someone else put at that name:
//! whatever is there is removed first, a link itself, never its target), given to the
//! task's user through that descriptor, and renamed over `nomad_token`: a reader (the
//! task, a template that embeds the token) sees the old token or the new one, never a
//! part of one, and a link planted as `nomad_token` is replaced, never followed.

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
    let mut f = create_staging(&secrets)?;
    let written = (|| {
        if let Some(owner) = owner {
            owner.give(&f)?;
        }
        // Not synced: only a machine crash loses it, and a task lost in a crash is not
        // restarted; after an agent restart the allocation's hooks write it again.
        // Nomad does not sync it either. A sync here cost one fsync per task of an
        // allocation.
        f.write_all(token.as_bytes())?;
        secrets.rename(TOKEN_NEW, "nomad_token")
    })();
    if written.is_err() {
        let _ = secrets.remove_file(TOKEN_NEW);
    }
    written
}

/// The token being written, renamed over `nomad_token` once whole. Its own name: no
/// template destination or other writer stages a file under it.
const TOKEN_NEW: &str = ".nomad_token.identity-new";

/// Create `TOKEN_NEW` in `secrets`, 0600, a file of this call's own: whatever is at
/// that name (a leftover of a write that failed, or the task's own file, link or
/// FIFO) is removed first, a link itself and never its target, and a file the task
/// puts back in between is removed again rather than used.
fn create_staging(secrets: &Dir) -> std::io::Result<std::fs::File> {
    let mut last = None;
    for _ in 0..8 {
        match secrets.remove_file(TOKEN_NEW) {
            // A directory there is no file to remove; the create below fails on it.
            Err(e) if e.kind() != std::io::ErrorKind::NotFound && !is_a_directory(&e) => {
                return Err(e);
            }
            _ => {}
        }
        match secrets.open_file(TOKEN_NEW, &OpenOptions::new().write(true).create_new(0o600)) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no attempt made")))
}

fn is_a_directory(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EISDIR)
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
    fn the_token_is_private_and_a_planted_link_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("alloc/t1");
        write_token(&dir, "a.b.c", None).unwrap();
        let file = dir.join(TOKEN_FILE);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "a.b.c");
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        // Written again (a restart, a new key): replaced, not appended.
        write_token(&dir, "d.e.f", None).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "d.e.f");
        // The task replaced it with a link to a host file: the link is replaced, its
        // target intact.
        let target = tmp.path().join("host-file");
        std::fs::write(&target, "keep").unwrap();
        std::fs::remove_file(&file).unwrap();
        symlink(&target, &file).unwrap();
        write_token(&dir, "x.y.z", None).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&file).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x.y.z");
        // A hard link to a host file: the name is replaced, the host file intact.
        std::fs::remove_file(&file).unwrap();
        std::fs::hard_link(&target, &file).unwrap();
        write_token(&dir, "u.v.w", None).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::metadata(&target).unwrap().nlink(), 1);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "u.v.w");
        // Links planted at the name the token is written under first: removed (the
        // link, not its target), never written through.
        let new = dir.join("secrets").join(TOKEN_NEW);
        symlink(&target, &new).unwrap();
        write_token(&dir, "s.y.m", None).unwrap();
        std::fs::hard_link(&target, &new).unwrap();
        write_token(&dir, "h.a.r", None).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "h.a.r");
        assert!(!new.exists(), "the new file stayed under its own name");
        // A directory there: an error, nothing written anywhere.
        std::fs::create_dir(&new).unwrap();
        assert!(write_token(&dir, "d.i.r", None).is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "h.a.r");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    /// A reader of the token while it is written again (a restart with a new key, a
    /// template rendering it) sees the old token or the new one, whole.
    #[test]
    fn a_reader_never_sees_part_of_a_token() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("alloc/t1");
        let (old, new) = ("o".repeat(4096), "n".repeat(8192));
        write_token(&dir, &old, None).unwrap();
        let file = dir.join(TOKEN_FILE);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (file, stop) = (file.clone(), stop.clone());
            let (old, new) = (old.clone(), new.clone());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let got = std::fs::read_to_string(&file).unwrap();
                    assert!(got == old || got == new, "read {} bytes", got.len());
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..2000 {
            write_token(&dir, if i % 2 == 0 { &new } else { &old }, None).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    /// The token and `secrets/` go to the task's user; a link planted in place of the
    /// file is replaced and its target keeps its owner. Needs root (chown).
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
        write_token(&dir, "x.y.z", Some(nobody)).unwrap();
        let m = std::fs::symlink_metadata(&file).unwrap();
        assert!(m.is_file());
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (65534, 65534, 0o600));
        let t = std::fs::metadata(&target).unwrap();
        assert_eq!(
            (t.uid(), std::fs::read_to_string(&target).unwrap().as_str()),
            (0, "keep")
        );
    }
}
