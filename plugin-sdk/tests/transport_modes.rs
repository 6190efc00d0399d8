//! go-plugin 1.6.3 transport parity, Rust host against Rust plugin: AutoMTLS
//! (`PLUGIN_CLIENT_CERT`, the handshake's 6th field) and gRPC multiplexing
//! (`PLUGIN_MULTIPLEX_GRPC`, the 7th field), each on and off, launched and reattached.
//!
//! The plugin is a driver linked into this test binary, served by the real
//! `drover_plugin_sdk::serve` in a re-executed copy of it ([`ENV_SERVE`] set): a real
//! plugin process. `harness = false`: the re-executed binary must print nothing before
//! its handshake line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use drover_plugin_sdk::client::{LaunchError, LaunchOptions, PluginProcess, ReattachError};
use drover_plugin_sdk::handshake::{self, HandshakeLine, PluginAddr};
use drover_plugin_sdk::*;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::AsyncBufReadExt as _;

/// Set in the re-executed copy of this binary: serve the driver as a process.
const ENV_SERVE: &str = "DROVER_SDK_TEST_SERVE_TRANSPORT";
const BUDGET: Duration = Duration::from_secs(10);

struct EchoDriver;

impl DriverPlugin for EchoDriver {
    type Config = EmptyConfig;
    type TaskConfig = EmptyConfig;
    fn info(&self) -> PluginInfo {
        PluginInfo::new("transport", "0.1.0")
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    async fn fingerprint(&self) -> Fingerprint {
        Fingerprint::healthy("ready")
    }
    async fn recover_task(&self, h: TaskHandle) -> Result<(), DriverError> {
        Err(DriverError::NotFound(h.spec.id))
    }
    async fn start_task(&self, s: TaskSpec, _: EmptyConfig) -> Result<TaskHandle, DriverError> {
        Err(DriverError::NotFound(s.id))
    }
    async fn wait_task(&self, id: &str) -> Result<ExitResult, DriverError> {
        Err(DriverError::NotFound(id.into()))
    }
    async fn stop_task(&self, id: &str, _: Duration, _: Signal) -> Result<(), DriverError> {
        Err(DriverError::NotFound(id.into()))
    }
    async fn destroy_task(&self, id: &str, _: bool) -> Result<(), DriverError> {
        Err(DriverError::NotFound(id.into()))
    }
    async fn inspect_task(&self, id: &str) -> Result<TaskStatus, DriverError> {
        Err(DriverError::NotFound(id.into()))
    }
}

/// One test case: a name and its body.
type Case = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

fn main() {
    if std::env::var_os(ENV_SERVE).is_some() {
        serve(EchoDriver);
    }
    // Every plugin's socket directory goes in here, removed at the end, whatever a
    // plugin killed by its host left behind.
    let sockets = tempfile::tempdir().expect("a socket dir");
    SOCKETS.set(sockets.path().to_owned()).expect("set once");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let cases: &[(&str, Case)] = &[
        (
            "launch: auto_mtls x multiplex, PluginInfo and reattach each",
            || Box::pin(every_mode_launches_and_reattaches()),
        ),
        (
            "reattach with a record naming another server cert is refused",
            || Box::pin(reattach_with_wrong_server_cert_is_refused()),
        ),
        (
            "a garbage PLUGIN_CLIENT_CERT fails the plugin with a clear error",
            || Box::pin(garbage_client_cert_is_a_clear_error()),
        ),
        (
            "the plugin refuses a client with another certificate; a stalled peer blocks nobody",
            || Box::pin(plugin_refuses_a_foreign_client_cert()),
        ),
        (
            "PLUGIN_MULTIPLEX_GRPC=false: the 7th field says true, connections stay plain",
            || Box::pin(multiplex_false_is_announced_but_not_used()),
        ),
        (
            "auto_mtls or multiplexing against a plugin without them: clear errors",
            || Box::pin(features_the_plugin_lacks_are_clear_errors()),
        ),
        (
            "a plugin started with SIGCHLD ignored sets it back to its default",
            || Box::pin(an_ignored_sigchld_is_set_back()),
        ),
    ];
    for (name, case) in cases {
        rt.block_on(case());
        println!("ok  {name}");
    }
    drop(rt);
    drop(sockets);
    println!("{} passed, 0 failed", cases.len());
}

/// Where the plugins of this test make their socket directories.
static SOCKETS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn sockets() -> std::path::PathBuf {
    SOCKETS.get().expect("set in main").clone()
}

fn opts(auto_mtls: bool, multiplex: bool) -> LaunchOptions {
    let exe = std::env::current_exe().expect("this test's executable");
    let mut opts = LaunchOptions::new("transport", exe);
    opts.env.push((ENV_SERVE.into(), "1".into()));
    opts.auto_mtls = auto_mtls;
    opts.multiplex_grpc = multiplex;
    opts.socket_dir = Some(sockets());
    opts
}

async fn every_mode_launches_and_reattaches() {
    for auto_mtls in [false, true] {
        for multiplex in [false, true] {
            let mode = format!("auto_mtls={auto_mtls} multiplex={multiplex}");
            let t = Instant::now();
            let plugin = PluginProcess::launch(opts(auto_mtls, multiplex))
                .await
                .unwrap_or_else(|e| panic!("{mode}: launch failed: {e}"));
            eprintln!("{mode}: launch -> healthy in {:?}", t.elapsed());
            let line = plugin.handshake();
            // What go-plugin 1.6.3 prints: the cert as RawStd base64 DER, `|true`.
            assert_eq!(line.server_cert.is_some(), auto_mtls, "{mode}: {line}");
            if let Some(cert) = &line.server_cert {
                assert!(cert.len() > 50 && !cert.ends_with('='), "{mode}: {cert}");
                let der = base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(cert)
                    .expect("RawStd base64");
                assert_eq!(der[0], 0x30, "{mode}: DER SEQUENCE");
            }
            assert_eq!(line.multiplex_grpc, multiplex.then_some(true), "{mode}");
            let info = plugin.client().plugin_info().await.expect("PluginInfo");
            assert_eq!(info.name, "transport", "{mode}");

            // A new host from the saved record (as JSON, as the agent stores it).
            let record = plugin.reattach_config();
            assert_eq!(record.tls.is_some(), auto_mtls, "{mode}");
            assert_eq!(record.multiplex_grpc, multiplex, "{mode}");
            let json = serde_json::to_string(&record).expect("record serialises");
            let record = serde_json::from_str(&json).expect("record loads");
            let again = PluginProcess::reattach("transport", record, BUDGET)
                .await
                .unwrap_or_else(|e| panic!("{mode}: reattach failed: {e}"));
            let info = again.client().plugin_info().await.expect("PluginInfo");
            assert_eq!(info.name, "transport", "{mode}");
            // The first connection still works beside the second.
            plugin.client().plugin_info().await.expect("PluginInfo");
            assert!(plugin.shutdown().await.is_success(), "{mode}");
        }
    }
}

/// A P-256 certificate (the test's own, from rcgen with ring): not the one the plugin
/// was given or gave.
fn other_cert() -> (CertificateDer<'static>, PrivateKeyDer<'static>, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let pem = cert.pem();
    (
        cert.der().clone(),
        PrivateKeyDer::try_from(key.serialize_der()).expect("pkcs8"),
        pem,
    )
}

async fn reattach_with_wrong_server_cert_is_refused() {
    let plugin = PluginProcess::launch(opts(true, false))
        .await
        .expect("launches");
    let mut record = plugin.reattach_config();
    let (other, _, _) = other_cert();
    let tls = record.tls.as_mut().expect("AutoMTLS material");
    tls.server_cert = base64::engine::general_purpose::STANDARD_NO_PAD.encode(other.as_ref());
    let err = PluginProcess::reattach("transport", record.clone(), BUDGET)
        .await
        .expect_err("a plugin whose certificate is not the recorded one is refused");
    assert!(
        matches!(&err, ReattachError::Connect { error, .. } if error.contains("certificate")),
        "{err}"
    );
    // Garbage material is its own clear error.
    record.tls.as_mut().expect("tls").client_key_pem = "not a key".into();
    let err = PluginProcess::reattach("transport", record, BUDGET)
        .await
        .expect_err("garbage key");
    assert!(
        err.to_string()
            .starts_with("the record's AutoMTLS material is unusable"),
        "{err}"
    );
    // Nothing was broken: the plugin still answers its launcher.
    plugin.client().plugin_info().await.expect("PluginInfo");
    assert!(plugin.shutdown().await.is_success());
}

async fn garbage_client_cert_is_a_clear_error() {
    let mut o = opts(false, false);
    o.env.push((
        handshake::ENV_CLIENT_CERT.into(),
        "not a certificate".into(),
    ));
    let err = PluginProcess::launch(o)
        .await
        .expect_err("the plugin cannot serve");
    let text = err.to_string();
    assert!(
        matches!(err, LaunchError::Exited { .. })
            && text.contains("cannot set up automatic mTLS (PLUGIN_CLIENT_CERT)")
            && text.contains("PLUGIN_CLIENT_CERT is not a PEM certificate"),
        "{text}"
    );
}

async fn multiplex_false_is_announced_but_not_used() {
    // go-plugin prints `|true` whenever the variable is set; only a true value turns
    // multiplexing on. A host that set it false connects plainly.
    let mut o = opts(false, false);
    o.env
        .push((handshake::ENV_MULTIPLEX_GRPC.into(), "false".into()));
    let plugin = PluginProcess::launch(o).await.expect("launches");
    assert_eq!(plugin.handshake().multiplex_grpc, Some(true));
    assert!(
        plugin.handshake().to_string().ends_with("|grpc||true"),
        "{}",
        plugin.handshake()
    );
    plugin.client().plugin_info().await.expect("plain gRPC");
    assert!(plugin.shutdown().await.is_success());
}

/// The plugin behind a shell script that hides `variable` from it: a plugin that does
/// not know that go-plugin feature.
fn plugin_without(variable: &str, dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let exe = std::env::current_exe().expect("this test's executable");
    let script = dir.join(format!("without-{variable}"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nunset {variable}\nexec '{}' \"$@\"\n",
            exe.display()
        ),
    )
    .expect("script written");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

async fn features_the_plugin_lacks_are_clear_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut o = opts(true, false);
    o.command = plugin_without(handshake::ENV_CLIENT_CERT, dir.path());
    let err = PluginProcess::launch(o)
        .await
        .expect_err("auto_mtls needs the plugin's certificate");
    assert!(
        matches!(err, LaunchError::AutoMtls(_))
            && err.to_string().contains("carries no server certificate")
            && err.to_string().contains("does not support AutoMTLS"),
        "{err}"
    );
    let mut o = opts(false, true);
    o.command = plugin_without(handshake::ENV_MULTIPLEX_GRPC, dir.path());
    let err = PluginProcess::launch(o)
        .await
        .expect_err("multiplexing needs the plugin's 7th field");
    assert!(
        matches!(err, LaunchError::Multiplex { .. })
            && err
                .to_string()
                .starts_with("plugin does not support gRPC broker multiplexing"),
        "{err}"
    );
}

/// Launch the plugin by hand with `PLUGIN_CLIENT_CERT` = `trusted_pem`, and return its
/// handshake line and the child.
async fn spawn_plugin_trusting(trusted_pem: &str) -> (HandshakeLine, tokio::process::Child) {
    let exe = std::env::current_exe().expect("this test's executable");
    let mut child = tokio::process::Command::new(exe)
        .env(ENV_SERVE, "1")
        .env(handshake::MAGIC_COOKIE_KEY, handshake::MAGIC_COOKIE_VALUE)
        .env(handshake::ENV_PROTOCOL_VERSIONS, "1")
        .env(handshake::ENV_CLIENT_CERT, trusted_pem)
        .env(handshake::ENV_UNIX_SOCKET_DIR, sockets())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawns");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(BUDGET, lines.next_line())
        .await
        .expect("a handshake line in time")
        .expect("stdout readable")
        .expect("a line");
    (line.parse().expect("a handshake line"), child)
}

/// A TLS client that presents `cert`, checks nothing of the server (the point is what
/// the plugin thinks of the client), and asks the plugin's health service.
async fn health_with_client_cert(
    addr: &PluginAddr,
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> Result<(), String> {
    let PluginAddr::Unix(path) = addr.clone() else {
        panic!("a unix socket");
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_client_auth_cert(vec![cert], key)
        .expect("client cert");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = tonic::transport::Endpoint::try_from("http://plugin")
        .expect("uri")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (path, connector) = (path.clone(), connector.clone());
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                let name = ServerName::try_from("localhost").expect("name");
                let tls = connector.connect(name, stream).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("{e:?}"))?;
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "plugin".into(),
        })
        .await
        .map(drop)
        .map_err(|s| format!("{s:?}"))
}

async fn plugin_refuses_a_foreign_client_cert() {
    let (trusted, trusted_key, trusted_pem) = other_cert();
    let (line, mut child) = spawn_plugin_trusting(&trusted_pem).await;
    assert!(line.server_cert.is_some(), "{line}");
    let (foreign, foreign_key, _) = other_cert();
    let refused = health_with_client_cert(&line.addr, foreign, foreign_key).await;
    assert!(
        refused.is_err(),
        "the plugin answered a client with a certificate it was not given"
    );
    // A peer that connects and never says a word does not hold up anyone else: TLS
    // handshakes run beside the accept loop.
    let PluginAddr::Unix(path) = &line.addr else {
        panic!("a unix socket");
    };
    let _stalled = tokio::net::UnixStream::connect(path)
        .await
        .expect("connects");
    // The same client with the certificate the plugin was given is served.
    health_with_client_cert(&line.addr, trusted, trusted_key)
        .await
        .expect("the client with PLUGIN_CLIENT_CERT's certificate is served");
    // SIGTERM: the plugin shuts down and removes its socket directory.
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .expect("a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = tokio::time::timeout(BUDGET, child.wait())
        .await
        .expect("exits after SIGTERM")
        .expect("waited");
    assert!(status.success(), "{status}");
}

/// Accepts any server: this test checks the plugin's side of mutual TLS.
#[derive(Debug)]
struct AnyServer;

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        vec![
            rustls::SignatureScheme::ECDSA_NISTP521_SHA512,
            rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
        ]
    }
}

/// Whether signal `signal` is in the `SigIgn` mask of a `/proc/<pid>/status` text.
fn ignores(status: &str, signal: u32) -> bool {
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .expect("a SigIgn line");
    let mask = u64::from_str_radix(mask.trim(), 16).expect("a hex mask");
    mask & (1 << (signal - 1)) != 0
}

/// An ignored SIGCHLD survives exec. A plugin started with it (by an agent started
/// with it) would have its children reaped by the kernel: their exit statuses lost,
/// their pids free for others while handles still name them.
async fn an_ignored_sigchld_is_set_back() {
    const SIGCHLD: u32 = 17;
    // bash's `trap '' CHLD` then `exec` (dash does not hand an ignored SIGCHLD on):
    // what the wrapper below hands on, checked, so that the plugin's mask below cannot
    // pass for want of an ignored SIGCHLD.
    let out = std::process::Command::new("/bin/bash")
        .args(["-c", "trap '' CHLD; exec cat /proc/self/status"])
        .output()
        .expect("/bin/sh runs");
    assert!(
        ignores(&String::from_utf8_lossy(&out.stdout), SIGCHLD),
        "the wrapper does not hand on an ignored SIGCHLD"
    );

    let mut opts = opts(false, false);
    let exe = std::mem::replace(&mut opts.command, "/bin/bash".into());
    opts.args = vec![
        "-c".into(),
        "trap '' CHLD; exec \"$0\"".into(),
        exe.into_os_string(),
    ];
    let plugin = PluginProcess::launch(opts).await.expect("launches");
    let status = std::fs::read_to_string(format!("/proc/{}/status", plugin.pid()))
        .expect("the plugin's status");
    assert!(
        !ignores(&status, SIGCHLD),
        "the plugin still ignores SIGCHLD:\n{status}"
    );
    let info = plugin.client().plugin_info().await.expect("PluginInfo");
    assert_eq!(info.name, "transport");
    assert!(plugin.shutdown().await.is_success());
}
