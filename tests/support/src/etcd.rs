//! A real etcd for tests: [`Etcd::start`] runs a private single-member etcd
//! (`/usr/bin/etcd`, Debian's `etcd-server`, or `$DROVER_TEST_ETCD_BIN`) on free
//! 127.0.0.1 ports with its own data dir, and stops it by pid when dropped; tests can
//! `kill -9` it and start it again on the same data dir. [`shared`] gives a test the
//! etcd that `scripts/test.sh` started (`$DROVER_TEST_ETCD_ENDPOINT`) or a private one,
//! with a key prefix of its own so that tests sharing one etcd never see each other.
//!
//! Without an etcd binary the helpers return `None` after saying so loudly; under
//! `CI=true` they panic instead.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long [`Etcd::start`] and [`Etcd::start_again`] wait for etcd to say it is
/// healthy.
pub const START_LIMIT: Duration = Duration::from_secs(30);

/// A private etcd: one member, its own data dir and ports, stopped by pid on drop.
#[derive(Debug)]
pub struct Etcd {
    bin: PathBuf,
    dir: tempfile::TempDir,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
    /// Which start this is (the log of each start is kept apart).
    starts: u32,
    tls: Option<ClientTls>,
    /// Member name and `--initial-cluster` (one member, or every member of an
    /// [`EtcdCluster`]).
    name: String,
    initial_cluster: String,
}

/// TLS on etcd's client port: etcd's certificate and key, and the CA it checks
/// client certificates against (`--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// PEM certificate etcd serves (valid for 127.0.0.1).
    pub cert: PathBuf,
    /// Its PEM key.
    pub key: PathBuf,
    /// PEM CA that client certificates must be signed by.
    pub client_ca: PathBuf,
}

/// The etcd binary the tests run: `$DROVER_TEST_ETCD_BIN`, else `/usr/bin/etcd`, else
/// `etcd` on the `PATH`; `None` when there is none.
pub fn etcd_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DROVER_TEST_ETCD_BIN").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let usr = Path::new("/usr/bin/etcd");
    if usr.is_file() {
        return Some(usr.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    })
}

fn no_etcd(why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why} (CI=true: the etcd tests must run; scripts/test.sh installs etcd-server)"
    );
    eprintln!(
        "########################################################################\n\
         # SKIPPED: {why}: install Debian's etcd-server (scripts/test.sh does) or\n\
         # set DROVER_TEST_ETCD_BIN\n\
         ########################################################################"
    );
}

/// A free TCP port on 127.0.0.1 for etcd to bind (below the kernel's ephemeral range,
/// see [`crate::net::free_local_addr`]; another process taking it first still makes
/// the start fail loudly, not wrongly).
fn free_addr() -> SocketAddr {
    crate::net::free_local_addr()
}

impl Etcd {
    /// Start a private etcd and wait until it is healthy (panics if it does not get
    /// there within [`START_LIMIT`], with its log). `None` (said loudly) when there is
    /// no etcd binary; under `CI=true` that panics.
    pub fn start() -> Option<Etcd> {
        Etcd::start_with(None)
    }

    /// [`Etcd::start`] with TLS on the client port (`https://` endpoint, client
    /// certificates required). Ready once etcd logs that it serves clients.
    pub fn start_tls(tls: ClientTls) -> Option<Etcd> {
        Etcd::start_with(Some(tls))
    }

    fn start_with(tls: Option<ClientTls>) -> Option<Etcd> {
        let Some(bin) = etcd_bin() else {
            no_etcd("no etcd binary (/usr/bin/etcd, $DROVER_TEST_ETCD_BIN or etcd on PATH)");
            return None;
        };
        let mut e = Etcd::new(bin, "drover-test".into(), tls);
        e.initial_cluster = format!("{}=http://{}", e.name, e.peer);
        e.spawn();
        Some(e)
    }

    fn new(bin: PathBuf, name: String, tls: Option<ClientTls>) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("drover-test-etcd-")
            .tempdir()
            .expect("temp dir for etcd");
        // Its data and logs are for this test alone (tempfile makes it 0700 on Unix;
        // said here so that it stays so).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
                .expect("chmod 700 the etcd temp dir");
        }
        Etcd {
            bin,
            dir,
            client: free_addr(),
            peer: free_addr(),
            child: None,
            starts: 0,
            tls,
            name,
            initial_cluster: String::new(),
        }
    }

    fn spawn(&mut self) {
        self.launch();
        self.wait_healthy();
    }

    fn launch(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        self.starts += 1;
        let log_path = self.log_path(self.starts);
        let log = std::fs::File::create(&log_path)
            .unwrap_or_else(|e| panic!("create {}: {e}", log_path.display()));
        let log2 = log.try_clone().expect("clone the etcd log's file handle");
        let client = self.endpoint();
        let peer = format!("http://{}", self.peer);
        let mut cmd = Command::new(&self.bin);
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.client_ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg("new")
            // zap: its "serving client traffic" line (info) tells that this child
            // serves on our port.
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    fn log_path(&self, start: u32) -> PathBuf {
        self.dir.path().join(format!("etcd.{start}.log"))
    }

    /// Whether this start's log says it serves client traffic on our client address.
    fn serving_here(&self) -> bool {
        let address = format!("\"address\":\"{}\"", self.client);
        std::fs::read_to_string(self.log_path(self.starts)).is_ok_and(|log| {
            log.lines()
                .any(|l| l.contains("\"serving client traffic") && l.contains(&address))
        })
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            // Ours, not another etcd on a port taken between `free_addr` and the
            // start: our child logged that it serves clients on exactly this address
            // (and, without TLS, the address answers the health check).
            let ready = self.serving_here() && (self.tls.is_some() || health(self.client));
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                panic!(
                    "etcd exited at start ({status}); its log:\n{}",
                    self.log_text()
                );
            }
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd at {} not healthy within {START_LIMIT:?}; its log:\n{}",
                self.endpoint(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL, `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// Its pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` it and reap it (no-op when it is not running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Child::kill is SIGKILL to this pid.
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same data dir and ports (after [`Etcd::kill9`]) and wait
    /// until it is healthy.
    pub fn start_again(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Its data dir.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Everything it logged, all starts in order.
    pub fn log_text(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- restarted ---\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `GET /health` answers `"health":"true"` (bounded: 1 s per attempt).
fn health(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = Vec::new();
    let _ = s.take(64 * 1024).read_to_end(&mut body);
    let body = String::from_utf8_lossy(&body);
    body.starts_with("HTTP/1.") && body.contains("200") && body.contains("\"health\":\"true\"")
}

/// A private etcd cluster of several members on 127.0.0.1, for failover tests.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Start `n` members and wait until each is healthy (the cluster has a leader).
    /// `None` (loudly; a panic under `CI=true`) without an etcd binary.
    pub fn start(n: usize) -> Option<EtcdCluster> {
        let Some(bin) = etcd_bin() else {
            no_etcd("no etcd binary (/usr/bin/etcd, $DROVER_TEST_ETCD_BIN or etcd on PATH)");
            return None;
        };
        let mut members: Vec<Etcd> = (0..n)
            .map(|i| Etcd::new(bin.clone(), format!("drover-test-{i}"), None))
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        // Every member first: none is healthy before a quorum runs.
        for m in &mut members {
            m.initial_cluster = initial.clone();
            m.launch();
        }
        for m in &mut members {
            m.wait_healthy();
        }
        Some(EtcdCluster { members })
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Etcd::endpoint).collect()
    }

    /// Member `i` (to kill it and start it again).
    pub fn member(&mut self, i: usize) -> &mut Etcd {
        &mut self.members[i]
    }
}

/// An etcd for a test: the one `scripts/test.sh` runs, or a private one, with a key
/// prefix of this test's own.
#[derive(Debug)]
pub struct SharedEtcd {
    endpoint: String,
    private: Option<Etcd>,
}

/// The etcd of `$DROVER_TEST_ETCD_ENDPOINT` (scripts/test.sh starts one) or else a
/// private [`Etcd::start`]; `None` (loudly; a panic under `CI=true`) when there is
/// neither. Tests that kill etcd need [`Etcd::start`] instead.
pub fn shared() -> Option<SharedEtcd> {
    match std::env::var("DROVER_TEST_ETCD_ENDPOINT") {
        Ok(ep) if !ep.is_empty() => Some(SharedEtcd {
            endpoint: ep,
            private: None,
        }),
        _ => Etcd::start().map(|e| SharedEtcd {
            endpoint: e.endpoint(),
            private: Some(e),
        }),
    }
}

impl SharedEtcd {
    /// The client URL.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The private etcd, when this is not scripts/test.sh's.
    pub fn private(&self) -> Option<&Etcd> {
        self.private.as_ref()
    }
}

/// A key prefix no other test uses: `/drover-test-<pid>-<nanos>-<n>/`.
pub fn unique_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "/drover-test-{}-{nanos}-{}/",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl SharedEtcd {
    /// [`unique_prefix`].
    pub fn unique_prefix(&self) -> String {
        unique_prefix()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken by another etcd between `free_addr` and the start: the health
    /// check answers (the other one), but the start is not ours and must fail.
    #[test]
    fn an_etcd_that_is_not_our_child_answering_on_the_port_is_not_taken_for_ours() {
        let Some(first) = Etcd::start() else { return };
        let mut second = Etcd::new(first.bin.clone(), "drover-test-2".into(), None);
        second.client = first.client;
        second.initial_cluster = format!("{}=http://{}", second.name, second.peer);
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| second.spawn()));
        let why = started.expect_err("a start on a port another etcd serves is refused");
        let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(why.contains("etcd exited at start"), "{why}");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(second.dir.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o700, "the etcd dir is private");
    }
}
