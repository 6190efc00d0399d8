//! Issue 10, scenario 5: the agent's own directories are checked before use. A data
//! dir another user created, or one that lets other users in (0755, 0777), stops the
//! agent with a message naming the path and the fix; one it creates is 0700. `--dev`'s
//! fixed `$TMPDIR/drover-dev-$UID` is refused when another user made it first.

use crate::common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A uid no test runs as: the kernel's overflow user, `nobody` on most systems.
const OTHER_UID: u32 = 65534;

/// An agent process, killed on drop if it is still running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `drover agent ARGS…` with `env`, expect it to exit by itself within 20 s
/// (an agent that accepts the directory runs on and fails this), and return its log.
fn agent_refuses(root: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let log = root.join("refused.log");
    let mut cmd = Command::new(drover());
    cmd.arg("agent")
        .args(args)
        .env("RUST_LOG", "info")
        .env("DOCKER_HOST", "unix:///nonexistent/drover-test/docker.sock")
        .env("DROVER_PLUGIN_PASS_ENV", "DOCKER_HOST,DROVER_TEST_MARKER")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut agent = Running(cmd.spawn().expect("start drover agent"));
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut status = None;
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drover_test_support::until_blocking(
            Duration::from_secs(20),
            Duration::from_millis(20),
            "the agent to refuse its directory and exit",
            || {
                status = agent.0.try_wait().unwrap();
                status.is_some()
            },
        )
    }));
    if waited.is_err() {
        panic!("the agent did not refuse to start; its log:\n{}", read());
    }
    let status = status.unwrap();
    assert!(!status.success(), "the agent exited 0; log:\n{}", read());
    read()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(uid)), None).unwrap();
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

/// Only root can hand a directory to another uid. CI runs as root, so there a
/// non-root run is a failure, not a skip.
fn require_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "these tests need root (to chown a directory to uid {OTHER_UID})"
    );
    eprintln!("skipped: needs root to chown a directory to another uid");
    false
}

#[test]
fn a_data_dir_created_by_another_user_is_refused() {
    if !require_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::create_dir(&data).unwrap();
    chmod(&data, 0o700);
    chown(&data, OTHER_UID);
    let log = agent_refuses(
        root.path(),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--plugin-dir",
            plugins.to_str().unwrap(),
        ],
        &[],
    );
    let me = rustix::process::geteuid().as_raw();
    assert!(
        log.contains(&format!(
            "refusing to use {} as the data directory: it is owned by uid {OTHER_UID}, \
             not by this agent's uid {me}",
            data.display()
        )),
        "{log}"
    );
    assert!(log.contains(&format!("rm -rf {}", data.display())), "{log}");
    // Nothing was read from or put in it.
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
}

#[test]
fn a_data_dir_open_to_other_users_is_refused_with_the_fix() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::create_dir(&data).unwrap();
    for open in [0o755, 0o777] {
        chmod(&data, open);
        let log = agent_refuses(
            root.path(),
            &[
                "--data-dir",
                data.to_str().unwrap(),
                "--plugin-dir",
                plugins.to_str().unwrap(),
            ],
            &[],
        );
        assert!(
            log.contains(&format!(
                "refusing to use {} as the data directory: its mode {open:04o}",
                data.display()
            )),
            "{log}"
        );
        assert!(
            log.contains(&format!("`chmod 0700 {}`", data.display())),
            "{log}"
        );
        assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "{open:o}");
    }
    // Fixed as the message says, the same directory is accepted.
    chmod(&data, 0o700);
    let agent = Agent::start(root.path(), &plugins, &[]);
    assert_eq!(agent.data_dir, data);
    assert!(agent.api().block_on(agent.api().health()).is_ok());
}

#[test]
fn a_fresh_data_dir_and_its_own_dirs_keep_other_users_out() {
    let (_root, agent) = rawexec_agent();
    let data = &agent.data_dir;
    assert_eq!(mode(data), 0o700, "data dir");
    assert_eq!(mode(&data.join("run")), 0o700, "plugin socket dir");
    assert_eq!(mode(&data.join("plugin-state")), 0o700, "plugin state dir");
    assert_eq!(mode(&data.join("alloc")) & 0o022, 0, "task dir root");
    assert_eq!(mode(&agent.socket) & 0o077, 0, "API socket");
}

#[test]
fn dev_refuses_a_dev_dir_another_user_created_first() {
    if !require_root() {
        return;
    }
    // `--dev` puts its data at `$TMPDIR/drover-dev-$UID`: a private TMPDIR stands in
    // for the shared /tmp, where any user could create that name first.
    let tmp = tempfile::tempdir().unwrap();
    let me = rustix::process::getuid().as_raw();
    let dev = tmp.path().join(format!("drover-dev-{me}"));
    std::fs::create_dir(&dev).unwrap();
    chmod(&dev, 0o700);
    chown(&dev, OTHER_UID);
    let log = agent_refuses(
        tmp.path(),
        &["--dev", "--dev-http-addr", "127.0.0.1:0"],
        &[("TMPDIR", tmp.path())],
    );
    assert!(
        log.contains(&format!(
            "refusing to use {} as the dev data directory: it is owned by uid {OTHER_UID}",
            dev.display()
        )),
        "{log}"
    );
    assert_eq!(std::fs::read_dir(&dev).unwrap().count(), 0);

    // Made by us but left open (0777): refused as well, with the chmod to run.
    chown(&dev, me);
    chmod(&dev, 0o777);
    let log = agent_refuses(
        tmp.path(),
        &["--dev", "--dev-http-addr", "127.0.0.1:0"],
        &[("TMPDIR", tmp.path())],
    );
    assert!(
        log.contains(&format!("`chmod 0700 {}`", dev.display())),
        "{log}"
    );
}

#[test]
fn a_plugin_dir_or_socket_dir_writable_by_others_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    chmod(&plugins, 0o777);
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--plugin-dir",
        plugins.to_str().unwrap(),
    ];
    let log = agent_refuses(root.path(), &args, &[]);
    assert!(
        log.contains(&format!(
            "refusing to use {} as the plugin directory: its mode 0777 lets group and \
             others write in it; `chmod go-w {}`",
            plugins.display(),
            plugins.display()
        )),
        "{log}"
    );
    chmod(&plugins, 0o755);

    // The API socket in a directory any user can write to (not sticky): they could
    // replace the socket with their own.
    let sockets = root.path().join("sockets");
    std::fs::create_dir(&sockets).unwrap();
    chmod(&sockets, 0o777);
    let socket = sockets.join("api.sock");
    let mut args = args.to_vec();
    args.extend(["--api-socket", socket.to_str().unwrap()]);
    let log = agent_refuses(root.path(), &args, &[]);
    assert!(
        log.contains(&format!(
            "refusing to use {} as the API socket directory: its mode 0777",
            sockets.display()
        )),
        "{log}"
    );
    assert!(!socket.exists());
}
