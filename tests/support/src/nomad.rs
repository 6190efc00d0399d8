//! The real Nomad 1.0.18 programs (the agent, its raw_exec and mock drivers served as
//! external plugins, the unmodified skeleton driver, the example device plugin) that
//! Drover is tested against: MPL-2.0 test peers built from HashiCorp's source, shipped
//! as `nomad-peers-v1.0.18.tar.xz` beside the repository (`../shared/nomad/`, whose
//! README says from which commits).
//!
//! [`peers`] unpacks the archive once into the build tree and checks every file
//! against its `SHA256SUMS` before anything runs it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming the archive, when it is elsewhere.
pub const ENV_ARCHIVE: &str = "DROVER_NOMAD_PEERS";

/// The archive and how to find it.
const ARCHIVE: crate::peers::PeerArchive = crate::peers::PeerArchive {
    archive: "nomad-peers-v1.0.18.tar.xz",
    unpacked: "nomad-peers-v1.0.18",
    env: ENV_ARCHIVE,
    shared_dir: "nomad",
    missing: "the real Nomad programs",
    skipped: "the real Nomad 1.0.18 programs",
};

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
    static UNPACK: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    crate::peers::unpacked(&ARCHIVE, &UNPACK).map(|dir| NomadPeers { dir })
}

/// The config of a Nomad agent kept to loopback (`nomad agent -dev -config FILE`): it
/// binds and advertises 127.0.0.1 only on the ports given (`http`, `rpc`, `serf`), keeps
/// its data in `data`, and leaves out the cloud fingerprinters, which would probe
/// 169.254.169.254 (see `../shared/nomad/README.md`). `extra` is appended (plugin
/// blocks, `plugin_dir`).
///
/// ```
/// let hcl = drover_test_support::nomad::loopback_agent_hcl(
///     std::path::Path::new("/tmp/d"), [4646, 4647, 4648], "");
/// assert!(hcl.contains("bind_addr            = \"127.0.0.1\""));
/// assert!(hcl.contains("http = 4646"));
/// ```
pub fn loopback_agent_hcl(data: &Path, [http, rpc, serf]: [u16; 3], extra: &str) -> String {
    format!(
        r#"bind_addr            = "127.0.0.1"
data_dir             = "{data}"
disable_update_check = true
addresses {{ http = "127.0.0.1"  rpc = "127.0.0.1"  serf = "127.0.0.1" }}
advertise {{ http = "127.0.0.1"  rpc = "127.0.0.1"  serf = "127.0.0.1" }}
ports {{ http = {http}  rpc = {rpc}  serf = {serf} }}
client {{
  options {{ "fingerprint.denylist" = "env_aws,env_gce,env_azure" }}
}}
{extra}"#,
        data = data.display(),
    )
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
    venv_python_importing("nomad", "python-nomad")
}

/// The venv's interpreter of [`python_nomad`] when it imports `prometheus_client`
/// (PyPI `prometheus-client`: the Prometheus text parser the metrics tests read
/// `/v1/metrics` with), or `None` after a loud skip line; a failure under `CI=true`.
pub fn python_prometheus() -> Option<PathBuf> {
    venv_python_importing("prometheus_client", "prometheus-client")
}

fn venv_python_importing(module: &str, package: &str) -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidate = std::env::var_os(ENV_PYTHON_NOMAD)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/python-nomad/bin/python"));
    let why = match std::process::Command::new(&candidate)
        .args(["-c", &format!("import {module}")])
        .output()
    {
        Ok(out) if out.status.success() => return Some(candidate),
        Ok(out) => format!(
            "{} cannot import {module}: {}",
            candidate.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => format!(
            "no Python interpreter with {package} at {}: {e}",
            candidate.display()
        ),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{package} is missing (CI=true: a failure): {why}; scripts/test.sh installs it");
    }
    eprintln!("SKIPPED: a test with {package}: {why} (scripts/test.sh installs it)");
    None
}
