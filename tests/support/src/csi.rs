//! Real CSI plugins that Drover's CSI support is tested against: programs built from
//! the Kubernetes CSI projects' Apache-2.0 source (the reference hostpath plugin, the
//! CSI test suite's mock driver, csi-sanity), shipped as `csi-peers.tar.xz` beside the
//! repository (`../shared/csi/`, whose README says from which commits). They are test
//! peers: run, never copied.
//!
//! [`peers`] unpacks the archive once into the build tree and checks every file
//! against its `SHA256SUMS` before anything runs it.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Environment variable naming the archive, when it is elsewhere.
pub const ENV_ARCHIVE: &str = "DROVER_CSI_PEERS";

/// The archive and how to find it.
const ARCHIVE: crate::peers::PeerArchive = crate::peers::PeerArchive {
    archive: "csi-peers.tar.xz",
    unpacked: "csi-peers",
    env: ENV_ARCHIVE,
    shared_dir: "csi",
    missing: "the real CSI plugins",
    skipped: "the real CSI plugins",
};

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
    static UNPACK: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    crate::peers::unpacked(&ARCHIVE, &UNPACK).map(|dir| CsiPeers { dir })
}
