//! Which protocol the skeleton's binary speaks is told by the cookie its host sets:
//! Drover's (app protocol 1), Nomad's (app protocol 2: what a Nomad agent loads from its
//! plugin_dir), Drover's when both are set, and none when neither is.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use drover_plugin_sdk::handshake::{
    self, ENV_PROTOCOL_VERSIONS, HandshakeLine, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE,
    NOMAD_MAGIC_COOKIE_KEY, NOMAD_MAGIC_COOKIE_VALUE,
};

const BIN: &str = env!("CARGO_BIN_EXE_drover-skeleton-driver");

/// Start the skeleton with `env` (and nothing else of ours), read its handshake line,
/// stop it by its pid.
fn handshake_with(env: &[(&str, &str)]) -> HandshakeLine {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .env_remove(MAGIC_COOKIE_KEY)
        .env_remove(NOMAD_MAGIC_COOKIE_KEY)
        .env(handshake::ENV_UNIX_SOCKET_DIR, dir.path())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    line.parse()
        .unwrap_or_else(|e| panic!("handshake line {line:?}: {e}"))
}

#[test]
fn nomads_cookie_gets_app_protocol_2() {
    // go-plugin in Nomad 1.0 offers its one version.
    let line = handshake_with(&[
        (NOMAD_MAGIC_COOKIE_KEY, NOMAD_MAGIC_COOKIE_VALUE),
        (ENV_PROTOCOL_VERSIONS, "2"),
    ]);
    assert_eq!(line.app_protocol_version, 2);
    assert_eq!(line.to_string().split('|').nth(4), Some("grpc"));
}

#[test]
fn drovers_cookie_wins_when_both_are_set() {
    let line = handshake_with(&[
        (MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE),
        (NOMAD_MAGIC_COOKIE_KEY, NOMAD_MAGIC_COOKIE_VALUE),
        (ENV_PROTOCOL_VERSIONS, "1,2"),
    ]);
    assert_eq!(line.app_protocol_version, 1);
}

#[test]
fn without_a_cookie_it_says_where_it_belongs() {
    let out = Command::new(BIN)
        .env_remove(MAGIC_COOKIE_KEY)
        .env_remove(NOMAD_MAGIC_COOKIE_KEY)
        .env(NOMAD_MAGIC_COOKIE_KEY, "wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("Drover agent's plugin_dir") && text.contains("Nomad agent's"),
        "{text}"
    );
}
