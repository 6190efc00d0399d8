//! `drover agent` and `drover server` under a fake service manager: the test binds the
//! unix datagram socket that `NOTIFY_SOCKET` names, as systemd does for `Type=notify`,
//! and reads what the daemon tells it.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{Agent, nix_kill};

/// The socket a `Type=notify` service manager listens on, and every message read.
pub struct FakeSystemd {
    socket: UnixDatagram,
    pub path: std::path::PathBuf,
    pub messages: Vec<String>,
}

impl FakeSystemd {
    pub fn bind(dir: &Path) -> FakeSystemd {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        FakeSystemd {
            socket,
            path,
            messages: Vec::new(),
        }
    }

    /// Read messages until one has a line `line` (after `from`, an index into
    /// [`Self::messages`]), within `limit`; the index of that message.
    pub fn wait_for(&mut self, from: usize, line: &str, limit: Duration, what: &str) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(i) =
                (from..self.messages.len()).find(|&i| self.messages[i].lines().any(|l| l == line))
            {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: no {line:?} within {limit:?}; messages: {:#?}",
                self.messages
            );
            let mut buf = [0u8; 4096];
            match self.socket.recv(&mut buf) {
                Ok(n) => self
                    .messages
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                // A receive with a timeout fails with EINTR whenever a signal handler
                // runs on this thread, even one installed with SA_RESTART (signal(7));
                // this test binary has handlers (the C library's, Rust's). Read again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("reading the notify socket: {e}"),
            }
        }
    }
}

/// `drover agent` under a service manager with a watchdog of 1 s: READY=1 (with a
/// STATUS) once its plugins are launched, WATCHDOG=1 about every 0.5 s after; SIGHUP
/// sends RELOADING=1 then READY=1, and a new `log_level` in its config file takes
/// effect (debug lines appear); a config that no longer parses is refused, logged,
/// and the agent keeps serving.
#[test]
fn agent_notifies_readiness_watchdog_and_reloads_its_log_level_on_sighup() {
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(&config, "log_level = \"info\"\n").unwrap();
    let mut systemd = FakeSystemd::bind(root.path());
    let socket = systemd.path.to_str().unwrap().to_owned();
    let agent = Agent::start_env(
        root.path(),
        &plugins,
        &["--config", config.to_str().unwrap()],
        &[
            ("NOTIFY_SOCKET", &socket),
            ("WATCHDOG_USEC", "1000000"),
            // Unset: the config's log_level decides (RUST_LOG would win over it).
            ("RUST_LOG", ""),
        ],
    );

    let ready = systemd.wait_for(0, "READY=1", Duration::from_secs(30), "agent start");
    assert!(
        systemd.messages[ready]
            .lines()
            .any(|l| l.starts_with("STATUS=serving on ") && l.contains("raw_exec")),
        "READY=1 comes with a STATUS naming the socket and plugins: {:?}",
        systemd.messages[ready]
    );
    // Ready means launched: every built-in driver is in the catalog with its process.
    let rows = agent.cli_json(&["plugin", "status", "--json"]);
    for driver in ["raw_exec", "exec", "java", "docker", "qemu"] {
        let row = crate::common::row(rows.as_array().unwrap(), driver);
        assert!(
            row["pid"].as_u64().is_some(),
            "{driver} launched at READY=1: {row}"
        );
    }
    // WATCHDOG=1 at half of WATCHDOG_USEC: at least three within 3 s.
    let started = Instant::now();
    let mut seen = ready;
    for _ in 0..3 {
        seen = systemd.wait_for(seen + 1, "WATCHDOG=1", Duration::from_secs(3), "watchdog");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "three keep-alives took {:?} (every 0.5 s expected)",
        started.elapsed()
    );

    let debug_line = "configuration read again";
    // A SIGHUP with the same level: reloaded, still no debug lines.
    nix_kill(agent.child.id(), libc_sighup()).unwrap();
    let reloading = systemd.wait_for(seen + 1, "RELOADING=1", Duration::from_secs(10), "SIGHUP");
    let again = systemd.wait_for(
        reloading + 1,
        "READY=1",
        Duration::from_secs(10),
        "reload end",
    );
    wait_log(&agent, "plugin directory rescanned", 1);
    assert!(
        !agent.log_text().contains(debug_line),
        "{}",
        agent.log_text()
    );

    // log_level = "debug", SIGHUP: debug lines appear.
    std::fs::write(&config, "log_level = \"debug\"\n").unwrap();
    nix_kill(agent.child.id(), libc_sighup()).unwrap();
    let reloading = systemd.wait_for(
        again + 1,
        "RELOADING=1",
        Duration::from_secs(10),
        "SIGHUP 2",
    );
    let again = systemd.wait_for(
        reloading + 1,
        "READY=1",
        Duration::from_secs(10),
        "reload 2",
    );
    wait_log(&agent, debug_line, 1);
    assert!(
        agent
            .log_text()
            .contains("log filter changed log_level=debug")
    );

    // A broken config: refused with a clear error, the agent keeps serving.
    std::fs::write(&config, "log_level = [\n").unwrap();
    nix_kill(agent.child.id(), libc_sighup()).unwrap();
    systemd.wait_for(again + 1, "READY=1", Duration::from_secs(10), "reload 3");
    wait_log(
        &agent,
        "the configuration cannot be loaded, keeping the one in use",
        1,
    );
    assert!(agent.cli(&["plugin", "status"]).status.success());
    // The log is for the journal: no ANSI colour codes (stderr is no terminal).
    assert!(!agent.log_text().contains('\u{1b}'), "colours in the log");
    let mut agent = agent;
    assert!(agent.stop().success());
    systemd.wait_for(again + 1, "STOPPING=1", Duration::from_secs(5), "stop");
}

/// `drover server --config FILE` under a service manager: READY=1 once it serves,
/// WATCHDOG=1, and SIGHUP applies the file's new log_level between RELOADING=1 and
/// READY=1.
#[test]
fn server_notifies_readiness_and_reloads_its_log_level_on_sighup() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("server.toml");
    let write_config = |level: &str| {
        std::fs::write(
            &config,
            format!(
                "data_dir = {:?}\nhttp_addr = \"127.0.0.1:0\"\nrpc_addr = \"127.0.0.1:0\"\n\
                 name = \"s1\"\nlog_level = {level:?}\n",
                root.path().join("server").display().to_string()
            ),
        )
        .unwrap()
    };
    write_config("warn");
    let mut systemd = FakeSystemd::bind(root.path());
    let log = root.path().join("server.log");
    let mut server = Daemon::spawn(
        std::process::Command::new(crate::common::drover())
            .args(["server", "--config", config.to_str().unwrap()])
            .env("NOTIFY_SOCKET", &systemd.path)
            .env("WATCHDOG_USEC", "1000000")
            .env_remove("RUST_LOG"),
        &log,
    );
    let ready = systemd.wait_for(0, "READY=1", Duration::from_secs(30), "server start");
    assert!(
        systemd.messages[ready]
            .lines()
            .any(|l| l.starts_with("STATUS=serving HTTP on 127.0.0.1:")),
        "{:?}",
        systemd.messages[ready]
    );
    systemd.wait_for(ready, "WATCHDOG=1", Duration::from_secs(3), "watchdog");
    // warn: the start's info lines were not logged.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("drover server listening"), "{text}");

    write_config("info");
    nix_kill(server.child.id(), libc_sighup()).unwrap();
    let reloading = systemd.wait_for(ready, "RELOADING=1", Duration::from_secs(10), "SIGHUP");
    systemd.wait_for(
        reloading + 1,
        "READY=1",
        Duration::from_secs(10),
        "reload end",
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("log filter changed log_level=info"), "{text}");
    server.stop();
    systemd.wait_for(0, "STOPPING=1", Duration::from_secs(5), "server stop");
}

/// SIGHUP's number (1 on Linux).
fn libc_sighup() -> i32 {
    nix::sys::signal::Signal::SIGHUP as i32
}

/// Wait until the agent's log has `text` at least `times` times.
fn wait_log(agent: &Agent, text: &str, times: usize) {
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        &format!("{text:?} in the agent's log"),
        || agent.log_text().matches(text).count() >= times,
    );
}

/// A daemon the test started, SIGTERMed (then killed) when dropped.
pub struct Daemon {
    pub child: std::process::Child,
}

impl Daemon {
    pub fn spawn(command: &mut std::process::Command, log: &Path) -> Daemon {
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("start the daemon");
        Daemon { child }
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self) {
        let _ = nix_kill(self.child.id(), 15);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "the daemon exited with {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix_kill(self.child.id(), 15);
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
