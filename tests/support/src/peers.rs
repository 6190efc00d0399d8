//! Archives of real programs built from other projects' source (Nomad's, the CSI
//! plugins') that tests run as peers: found beside the repository, unpacked once into
//! the build tree and checked against their `SHA256SUMS` before anything runs them.
//! [`crate::nomad`] and [`crate::csi`] each describe theirs with a [`PeerArchive`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One archive of peer programs.
pub(crate) struct PeerArchive {
    /// Its file name.
    pub archive: &'static str,
    /// The directory it unpacks to.
    pub unpacked: &'static str,
    /// The environment variable naming it when it is elsewhere.
    pub env: &'static str,
    /// Its directory under `../shared/` beside the repository.
    pub shared_dir: &'static str,
    /// What it holds, for the failure under `CI=true` ("the real Nomad programs").
    pub missing: &'static str,
    /// What a test skipped without it runs against.
    pub skipped: &'static str,
}

/// The directory of `a`'s programs, unpacked and checked once per test binary (kept
/// in `cache`); `None` after a loud `SKIPPED` line when the archive is not on this
/// machine, a panic under `CI=true`.
pub(crate) fn unpacked(
    a: &PeerArchive,
    cache: &'static OnceLock<Result<PathBuf, String>>,
) -> Option<PathBuf> {
    match cache.get_or_init(|| unpack(a)) {
        Ok(dir) => Some(dir.clone()),
        Err(why) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{} are missing (CI=true: a failure): {why}", a.missing);
            }
            eprintln!("SKIPPED: a test against {}: {why}", a.skipped);
            None
        }
    }
}

fn archive(a: &PeerArchive) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(a.env) {
        return Ok(PathBuf::from(p));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates = [
        repo.join("../shared").join(a.shared_dir).join(a.archive),
        PathBuf::from("/work/shared")
            .join(a.shared_dir)
            .join(a.archive),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "no {} at {} (set {} to its path)",
                a.archive,
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
                a.env
            )
        })
}

/// Unpack into `<target>/<profile>/<unpacked>` (beside the test binaries),
/// through a private temporary directory renamed into place, so that test binaries
/// running at once never see a half-unpacked tree; then check the sums.
fn unpack(a: &PeerArchive) -> Result<PathBuf, String> {
    let archive = archive(a)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test binary path {}", exe.display()))?;
    let dest = profile_dir.join(a.unpacked);
    if !dest.join("SHA256SUMS").is_file() {
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{}-", a.unpacked))
            .tempdir_in(profile_dir)
            .map_err(|e| format!("temporary dir in {}: {e}", profile_dir.display()))?;
        let out = Command::new("tar")
            .arg("-xJf")
            .arg(&archive)
            .arg("-C")
            .arg(staging.path())
            .output()
            .map_err(|e| format!("cannot run tar: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "tar -xJf {} failed: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let unpacked = staging.path().join(a.unpacked);
        // Another test binary may have won the race: its tree is as good as ours.
        if let Err(e) = std::fs::rename(&unpacked, &dest)
            && !dest.join("SHA256SUMS").is_file()
        {
            return Err(format!("cannot move {} into place: {e}", dest.display()));
        }
    }
    let check = Command::new("sha256sum")
        .args(["--quiet", "-c", "SHA256SUMS"])
        .current_dir(&dest)
        .output()
        .map_err(|e| format!("cannot run sha256sum: {e}"))?;
    if !check.status.success() {
        return Err(format!(
            "{}: the programs do not match SHA256SUMS: {}{}",
            dest.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        ));
    }
    Ok(dest)
}
