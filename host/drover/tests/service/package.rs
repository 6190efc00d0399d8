//! The Debian package of `scripts/package-deb.sh`, built from the `drover` binary these
//! tests run (the debug build CI already has): what it holds, whether systemd accepts
//! its units, and whether the packaged binary and configs make a working server and
//! agent when run from the unpacked tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::notify::{Daemon, FakeSystemd};
use crate::common::{Agent, cluster::free_port, drover};

/// A tool the package tests need: its absence skips the test loudly on a laptop, and
/// fails it under `CI=true` (scripts/test.sh installs it there).
fn need(tool: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is missing (Debian package {package}); CI=true: this is a failure"
        );
        eprintln!("#### SKIPPING: {tool} is missing (apt-get install {package}) ####");
    }
    found
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Run `command`; its stdout, or a panic with everything it said.
fn run(command: &mut Command) -> String {
    let out = command.output().expect("run a command");
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Build the .deb from the binary under test into `dir`; its path.
fn build_deb(dir: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/package-deb.sh");
    let printed = run(Command::new(script)
        .arg("--binary")
        .arg(drover())
        .arg("--out")
        .arg(dir)
        // The debug binary is large; compressing it would only cost time here.
        .args(["--compress", "none"]));
    let deb = PathBuf::from(printed.trim());
    assert_eq!(
        deb.file_name().and_then(|n| n.to_str()),
        Some(format!("drover_{}_amd64.deb", env!("CARGO_PKG_VERSION")).as_str())
    );
    deb
}

/// The .deb built and unpacked (`dpkg-deb -x`) under `dir`: (the .deb, the tree).
fn unpacked(dir: &Path) -> (PathBuf, PathBuf) {
    let deb = build_deb(dir);
    let tree = dir.join("tree");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree));
    (deb, tree)
}

const UNITS: [&str; 2] = ["drover-agent.service", "drover-server.service"];

#[test]
fn the_deb_holds_the_binary_the_units_the_configs_and_the_maintainer_scripts() {
    if !need("dpkg-deb", "dpkg") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let deb = build_deb(dir.path());
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let entry = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!(" .{path}")))
            .unwrap_or_else(|| panic!("{path} is not in the package:\n{listing}"))
            .to_owned()
    };
    let binary = entry("/usr/bin/drover");
    assert!(binary.starts_with("-rwxr-xr-x root/root"), "{binary}");
    // The per-task executor, beside drover, where its drivers look for it.
    let executor = entry("/usr/bin/drover-executor");
    assert!(executor.starts_with("-rwxr-xr-x root/root"), "{executor}");
    for unit in UNITS {
        let line = entry(&format!("/lib/systemd/system/{unit}"));
        assert!(line.starts_with("-rw-r--r-- root/root"), "{line}");
    }
    for conf in ["agent.toml", "server.toml"] {
        let line = entry(&format!("/etc/drover/{conf}"));
        assert!(line.starts_with("-rw-r--r-- root/root"), "{line}");
    }

    let info = run(Command::new("dpkg-deb").arg("-I").arg(&deb));
    for field in [
        "Package: drover".to_owned(),
        format!("Version: {}", env!("CARGO_PKG_VERSION")),
        "Architecture: amd64".to_owned(),
        "Depends: adduser, libc6".to_owned(),
    ] {
        assert!(
            info.lines().any(|l| l.trim() == field),
            "{field} in:\n{info}"
        );
    }
    for script in ["postinst", "prerm", "postrm", "conffiles"] {
        assert!(
            info.lines()
                .any(|l| l.contains(" bytes,") && l.split_whitespace().any(|w| w == script)),
            "{script} in:\n{info}"
        );
    }
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(
        conffiles,
        "/etc/drover/agent.toml\n/etc/drover/server.toml\n"
    );
    // The maintainer scripts are valid POSIX sh.
    let control = dir.path().join("control");
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    for script in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh").arg("-n").arg(control.join(script)));
    }
}

/// `systemd-analyze verify` accepts both units without a word (run with the packaged
/// binary at /usr/bin/drover through an overlay in a mount namespace of its own:
/// verify checks that ExecStart's program exists), and `systemd-analyze security`
/// rates the server's sandbox OK.
#[test]
fn systemd_accepts_the_units_and_rates_the_server_sandbox_ok() {
    if !need("dpkg-deb", "dpkg") || !need("systemd-analyze", "systemd") {
        return;
    }
    if !root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the unit check mounts an overlay: it needs root; CI=true: this is a failure"
        );
        eprintln!("#### SKIPPING: the unit check mounts an overlay and needs root ####");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, tree) = unpacked(dir.path());
    let units = tree.join("lib/systemd/system");
    let agent = std::fs::read_to_string(units.join(UNITS[0])).unwrap();
    let server = std::fs::read_to_string(units.join(UNITS[1])).unwrap();
    for line in [
        "Type=notify",
        "NotifyAccess=main",
        "KillMode=process",
        "ExecStart=/usr/bin/drover agent --config /etc/drover/agent.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(agent.lines().any(|l| l == line), "{line} in the agent unit");
    }
    for line in [
        "Type=notify",
        "NotifyAccess=main",
        "User=drover",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/drover/server",
        "CapabilityBoundingSet=",
        "ExecStart=/usr/bin/drover server --config /etc/drover/server.toml",
    ] {
        assert!(
            server.lines().any(|l| l == line),
            "{line} in the server unit"
        );
    }
    let script = format!(
        "set -e; mount -t overlay overlay -o lowerdir={bin}:/usr/bin /usr/bin; \
         systemd-analyze verify {a} {s} 2>&1; echo '---'; \
         systemd-analyze security --offline=yes {s} 2>&1 | tail -n 1",
        bin = tree.join("usr/bin").display(),
        a = units.join(UNITS[0]).display(),
        s = units.join(UNITS[1]).display(),
    );
    let out = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(&script));
    let (verify, security) = out.split_once("---\n").expect("both outputs");
    assert_eq!(verify, "", "systemd-analyze verify has something to say");
    let exposure: f64 = security
        .split("drover-server.service: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in {security:?}"));
    assert!(
        exposure <= 2.0,
        "the server's exposure level is {exposure}: {security}"
    );
}

/// The packaged binary runs from the unpacked tree: `--version`, then a server on the
/// packaged server.toml and an agent on the packaged agent.toml (only their paths,
/// ports and token swapped for temporary ones by flags, which win over the files),
/// each telling a fake service manager it is ready, the agent joining the server as a
/// ready node.
#[test]
fn the_packaged_server_and_agent_run_from_the_unpacked_tree() {
    if !need("dpkg-deb", "dpkg") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, tree) = unpacked(dir.path());
    let binary = tree.join("usr/bin/drover");
    let version = run(Command::new(&binary).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("drover {}", env!("CARGO_PKG_VERSION"))
    );

    let token = dir.path().join("cluster-token");
    std::fs::write(&token, "packaged-test-token-0123456789\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let rpc = format!("127.0.0.1:{}", free_port());
    let server_notify = dir.path().join("server-notify");
    std::fs::create_dir(&server_notify).unwrap();
    let mut server_systemd = FakeSystemd::bind(&server_notify);
    let server_log = dir.path().join("server.log");
    let _server = Daemon::spawn(
        Command::new(&binary)
            .arg("server")
            .arg("--config")
            .arg(tree.join("etc/drover/server.toml"))
            .arg("--data-dir")
            .arg(dir.path().join("server"))
            .args(["--http-addr", "127.0.0.1:0", "--rpc-addr", &rpc])
            .arg("--token-file")
            .arg(&token)
            .arg("--name")
            .arg("packaged")
            .env("NOTIFY_SOCKET", &server_systemd.path),
        &server_log,
    );
    server_systemd.wait_for(0, "READY=1", Duration::from_secs(30), "packaged server");

    let agent_root = dir.path().join("agent");
    let plugins = agent_root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let agent_notify = dir.path().join("agent-notify");
    std::fs::create_dir(&agent_notify).unwrap();
    let mut agent_systemd = FakeSystemd::bind(&agent_notify);
    let agent_socket = agent_systemd.path.to_str().unwrap().to_owned();
    let agent = Agent::start_binary_env(
        &binary,
        &agent_root,
        &plugins,
        &[
            "--config",
            tree.join("etc/drover/agent.toml").to_str().unwrap(),
            "--servers",
            &rpc,
            "--token-file",
            token.to_str().unwrap(),
            "--node-name",
            "packaged-node",
        ],
        &[("NOTIFY_SOCKET", &agent_socket)],
    );
    agent_systemd.wait_for(0, "READY=1", Duration::from_secs(30), "packaged agent");
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the packaged agent a ready node of the packaged server",
        || {
            let out = agent.cli(&["node", "status", "--json"]);
            let nodes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            nodes.as_array().is_some_and(|n| {
                n.iter()
                    .any(|n| n["name"] == "packaged-node" && n["status"] == "ready")
            })
        },
    );
}

/// The maintainer scripts, run as dpkg runs them, in a mount namespace whose /etc,
/// /var/lib and unit directory are overlays on temporary directories (nothing reaches
/// the host): a fresh install makes the `drover` user, the state directories with
/// their owners and modes, and the cluster token; an upgrade keeps the token and the
/// admin's enablement of a unit; a purge removes the token and the enablement and
/// keeps the state (tasks may still run from it).
#[test]
fn the_maintainer_scripts_make_the_user_dirs_and_token_and_an_upgrade_keeps_them() {
    if !need("dpkg-deb", "dpkg")
        || !need("adduser", "adduser")
        || !need("deb-systemd-helper", "init-system-helpers")
    {
        return;
    }
    if !root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the maintainer script check mounts overlays: it needs root; CI=true: this is a failure"
        );
        eprintln!("#### SKIPPING: the maintainer script check mounts overlays and needs root ####");
        return;
    }
    let host_user = || {
        Command::new("getent")
            .args(["passwd", "drover"])
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default()
    };
    let host_had_user = host_user();
    let dir = tempfile::tempdir().unwrap();
    let (deb, tree) = unpacked(dir.path());
    let control = dir.path().join("control");
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    let w = dir.path().join("overlays");
    let units_dir = std::fs::canonicalize("/lib/systemd/system").unwrap();
    let script = format!(
        r#"set -e
W={w}; C={control}; T={tree}
for d in etc varlib units; do mkdir -p "$W/$d-upper" "$W/$d-work"; done
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$W/etc-upper,workdir=$W/etc-work" /etc
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$W/varlib-upper,workdir=$W/varlib-work" /var/lib
mount -t overlay overlay -o "lowerdir={units},upperdir=$W/units-upper,workdir=$W/units-work" {units}
# What dpkg unpacks before the postinst runs.
mkdir -p /etc/drover && cp "$T"/etc/drover/*.toml /etc/drover/
cp "$T"/lib/systemd/system/drover-*.service {units}/
export DPKG_MAINTSCRIPT_PACKAGE=drover DPKG_MAINTSCRIPT_ARCH=amd64
step() {{ script=$1; shift; DPKG_MAINTSCRIPT_NAME=$script sh "$C/$script" "$@"; }}
step postinst configure ''
echo "user $(getent passwd drover | cut -d: -f6,7)"
stat -c 'mode %n %U:%G %a' /var/lib/drover /var/lib/drover/agent /var/lib/drover/server /etc/drover/cluster-token
first=$(cat /etc/drover/cluster-token)
echo "token ${{#first}}"
enabled=/etc/systemd/system/multi-user.target.wants/drover-agent.service
[ -e "$enabled" ] && echo "enabled at install" || echo "not enabled at install"
# The admin enables the agent (offline: systemctl only makes the links).
systemctl enable drover-agent.service 2>/dev/null
step prerm upgrade 0.1.0
step postinst configure 0.1.0
[ "$(cat /etc/drover/cluster-token)" = "$first" ] && echo "token kept"
[ -e "$enabled" ] && echo "still enabled after upgrade"
step prerm remove
step postrm remove
step postrm purge
[ -e /etc/drover/cluster-token ] || echo "token purged"
[ -e "$enabled" ] || echo "enablement purged"
[ -d /var/lib/drover/agent ] && echo "state kept"
"#,
        w = w.display(),
        control = control.display(),
        tree = tree.display(),
        units = units_dir.display(),
    );
    let out = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(&script));
    for line in [
        "user /var/lib/drover/server:/usr/sbin/nologin",
        "mode /var/lib/drover root:root 755",
        "mode /var/lib/drover/agent root:root 700",
        "mode /var/lib/drover/server drover:drover 700",
        "mode /etc/drover/cluster-token root:drover 640",
        "token 64",
        "not enabled at install",
        "token kept",
        "still enabled after upgrade",
        "token purged",
        "enablement purged",
        "state kept",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} in:\n{out}");
    }
    assert_eq!(
        host_user(),
        host_had_user,
        "the host's users were left alone (the scripts ran on overlays)"
    );
}
