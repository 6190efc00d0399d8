//! The real Nomad 1.0.18 programs (the agent, its raw_exec and mock drivers served as
//! external plugins, the unmodified skeleton driver, the example device plugin) that
//! Drover is tested against: MPL-2.0 test peers built from HashiCorp's source, shipped
//! as `nomad-peers-v1.0.18.tar.xz` beside the repository (`../shared/nomad/`, whose
//! README says from which commits).
//!
//! [`peers`] unpacks the archive once into the build tree and checks every file
//! against its `SHA256SUMS` before anything runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Name of the archive and of the directory it unpacks to.
const ARCHIVE: &str = "nomad-peers-v1.0.18.tar.xz";
const UNPACKED: &str = "nomad-peers-v1.0.18";

/// Environment variable naming the archive, when it is elsewhere.
pub const ENV_ARCHIVE: &str = "DROVER_NOMAD_PEERS";

/// The unpacked, checked programs.
#[derive(Debug, Clone)]
pub struct NomadPeers {
    /// The directory holding them.
    pub dir: PathBuf,
}

impl NomadPeers {
    /// The Nomad 1.0.18 agent.
    pub fn nomad(&self) -> PathBuf {
        self.dir.join("nomad")
    }
    /// Nomad 1.0.18's raw_exec driver as an external plugin.
    pub fn raw_exec(&self) -> PathBuf {
        self.dir.join("nomad-driver-rawexec-v1.0.18")
    }
    /// Nomad 1.0.18's mock driver as an external plugin.
    pub fn mock(&self) -> PathBuf {
        self.dir.join("nomad-driver-mock-v1.0.18")
    }
    /// hashicorp/nomad-skeleton-driver-plugin, unmodified (plugin name `test-plugin`).
    pub fn skeleton(&self) -> PathBuf {
        self.dir.join("nomad-driver-skeleton")
    }
    /// Nomad's example device plugin.
    pub fn device_example(&self) -> PathBuf {
        self.dir.join("nomad-device-example-v1.0.18")
    }
}

/// The Nomad programs, unpacked and checked; `None` after a loud `SKIPPED` line when
/// the archive is not on this machine, a panic under `CI=true`.
///
/// ```no_run
/// if let Some(peers) = drover_test_support::nomad::peers() {
///     assert!(peers.raw_exec().is_file());
/// }
/// ```
pub fn peers() -> Option<NomadPeers> {
    static UNPACK: OnceLock<Result<NomadPeers, String>> = OnceLock::new();
    match UNPACK.get_or_init(unpack) {
        Ok(p) => Some(p.clone()),
        Err(why) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("the real Nomad programs are missing (CI=true: a failure): {why}");
            }
            eprintln!("SKIPPED: a test against the real Nomad 1.0.18 programs: {why}");
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
        repo.join("../shared/nomad").join(ARCHIVE),
        PathBuf::from("/work/shared/nomad").join(ARCHIVE),
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

/// Unpack into `<target>/<profile>/nomad-peers-v1.0.18` (beside the test binaries),
/// through a private temporary directory renamed into place, so that test binaries
/// running at once never see a half-unpacked tree; then check the sums.
fn unpack() -> Result<NomadPeers, String> {
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
            .prefix(".nomad-peers-")
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
    Ok(NomadPeers { dir: dest })
}

/// Where `scripts/test.sh` announces the Python interpreter of its python-nomad venv.
pub const ENV_PYTHON_NOMAD: &str = "DROVER_TEST_PYTHON_NOMAD";

/// A Python interpreter that imports `nomad` (the PyPI package `python-nomad`, a real
/// client of Nomad's HTTP API), or `None` after a loud skip line; under `CI=true` its
/// absence is a failure. `scripts/test.sh` makes it (a venv under `target/`) and says
/// where in `DROVER_TEST_PYTHON_NOMAD`; without that variable the venv's usual place
/// is tried.
///
/// ```no_run
/// if let Some(python) = drover_test_support::nomad::python_nomad() {
///     assert!(python.is_file());
/// }
/// ```
pub fn python_nomad() -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidate = std::env::var_os(ENV_PYTHON_NOMAD)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/python-nomad/bin/python"));
    let why = match std::process::Command::new(&candidate)
        .args(["-c", "import nomad"])
        .output()
    {
        Ok(out) if out.status.success() => return Some(candidate),
        Ok(out) => format!(
            "{} cannot import nomad: {}",
            candidate.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => format!(
            "no python-nomad interpreter at {}: {e}",
            candidate.display()
        ),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("python-nomad is missing (CI=true: a failure): {why}; scripts/test.sh installs it");
    }
    eprintln!("SKIPPED: a test with python-nomad: {why} (scripts/test.sh installs it)");
    None
}
