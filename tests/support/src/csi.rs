//! Real CSI plugins that Drover's CSI support is tested against: programs built from
//! the Kubernetes CSI projects' Apache-2.0 source (the reference hostpath plugin, the
//! CSI test suite's mock driver, csi-sanity), shipped as `csi-peers.tar.xz` beside the
//! repository (`../shared/csi/`, whose README says from which commits). They are test
//! peers: run, never copied.
//!
//! [`peers`] unpacks the archive once into the build tree and checks every file
//! against its `SHA256SUMS` before anything runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Name of the archive.
const ARCHIVE: &str = "csi-peers.tar.xz";
/// The directory it unpacks to.
const UNPACKED: &str = "csi-peers";

/// Environment variable naming the archive, when it is elsewhere.
pub const ENV_ARCHIVE: &str = "DROVER_CSI_PEERS";

/// The unpacked, checked programs.
#[derive(Debug, Clone)]
pub struct CsiPeers {
    /// The directory holding them.
    pub dir: PathBuf,
}

impl CsiPeers {
    /// kubernetes-csi's hostpath plugin (Identity, Controller and Node in one process;
    /// real bind mounts, so it must run as root): `-endpoint unix:///PATH -nodeid ID
    /// -statedir DIR`.
    pub fn hostpath(&self) -> PathBuf {
        self.dir.join("hostpathplugin")
    }
    /// The CSI test suite's in-memory mock driver (`CSI_ENDPOINT=/PATH`).
    pub fn mock(&self) -> PathBuf {
        self.dir.join("csi-mock-driver")
    }
    /// The CSI conformance suite.
    pub fn sanity(&self) -> PathBuf {
        self.dir.join("csi-sanity")
    }
}

/// The CSI programs, unpacked and checked; `None` after a loud `SKIPPED` line when the
/// archive is not on this machine, a panic under `CI=true`.
///
/// ```no_run
/// if let Some(peers) = drover_test_support::csi::peers() {
///     assert!(peers.hostpath().is_file());
/// }
/// ```
pub fn peers() -> Option<CsiPeers> {
    static UNPACK: OnceLock<Result<CsiPeers, String>> = OnceLock::new();
    match UNPACK.get_or_init(unpack) {
        Ok(p) => Some(p.clone()),
        Err(why) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("the real CSI plugins are missing (CI=true: a failure): {why}");
            }
            eprintln!("SKIPPED: a test against the real CSI plugins: {why}");
            None
        }
    }
}

fn archive() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(ENV_ARCHIVE) {
        return Ok(PathBuf::from(p));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates = [
        repo.join("../shared/csi").join(ARCHIVE),
        PathBuf::from("/work/shared/csi").join(ARCHIVE),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "no {ARCHIVE} at {} (set {ENV_ARCHIVE} to its path)",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })
}

/// Unpack into `<target>/<profile>/csi-peers` (beside the test binaries),
/// through a private temporary directory renamed into place, so that test binaries
/// running at once never see a half-unpacked tree; then check the sums.
fn unpack() -> Result<CsiPeers, String> {
    let archive = archive()?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test binary path {}", exe.display()))?;
    let dest = profile_dir.join(UNPACKED);
    if !dest.join("SHA256SUMS").is_file() {
        let staging = tempfile::Builder::new()
            .prefix(".csi-peers-")
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
        let unpacked = staging.path().join(UNPACKED);
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
    Ok(CsiPeers { dir: dest })
}
