//! Shared helpers for the agent's end-to-end tests: real binaries, real processes.
//!
//! Each area's test binary (`tests/AREA/main.rs`) declares this module once for all its
//! files; the submodules hold what only some areas use: a cluster of real processes
//! ([`cluster`], [`ha`]), driver libraries ([`inproc`]), the docker, qemu and task API
//! helpers ([`docker`], [`qemu`], [`tasks`]), Nomad's HTTP API ([`nomad_http`]).
#![allow(dead_code)]

pub mod cluster;
pub mod docker;
pub mod ha;
pub mod inproc;
pub mod nomad_http;
pub mod qemu;
pub mod tasks;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `drover` binary under test.
pub fn drover() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drover"))
}

/// Another workspace binary, from the same target directory. `scripts/test.sh` builds
/// them all (`cargo build --workspace --bins`) before the tests run.
pub fn workspace_bin(name: &str) -> PathBuf {
    let path = drover().parent().expect("target dir").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`, \
         which scripts/test.sh does)",
        path.display()
    );
    path
}

/// Write an executable file.
///
/// Written by a child process, never through a descriptor of this one: tests run on
/// many threads, and a child another thread forks while this process holds the file
/// open for writing keeps that descriptor until it execs. Executing the file meanwhile
/// (here or in an agent) fails with `ETXTBSY`, "Text file busy". A copy of a large
/// binary keeps that window open for a long time.
pub fn write_exec(path: &Path, body: &str, mode: u32) {
    write_exec_bytes(path, body.as_bytes(), mode);
}

/// [`write_exec`] of any bytes (a patched binary).
pub fn write_exec_bytes(path: &Path, body: &[u8], mode: u32) {
    use std::io::Write as _;
    let mut cat = Command::new("sh")
        .args(["-c", "cat > \"$1\"", "sh"])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("start sh to write an executable");
    let mut stdin = cat.stdin.take().expect("piped stdin");
    stdin.write_all(body).expect("write to sh");
    drop(stdin);
    let status = cat.wait().expect("wait for sh");
    assert!(
        status.success(),
        "writing {} failed: {status}",
        path.display()
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Copy the executable `from` to `to` (mode 0755), out of this process for the reason
/// [`write_exec`] gives.
pub fn copy_exec(from: impl AsRef<Path>, to: impl AsRef<Path>) {
    let (from, to) = (from.as_ref(), to.as_ref());
    let status = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .status()
        .expect("start cp");
    assert!(
        status.success(),
        "cp {} {} failed: {status}",
        from.display(),
        to.display()
    );
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Tests that measure load time, or boot VMs, hold this so that no other test of the
/// same binary that holds it competes for the two cores meanwhile.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An agent's API for tests, which run on plain threads: a [`drover_api::Client`]
/// (its methods are `Api`'s) with a runtime of its own to run its calls to the end.
pub struct Api {
    runtime: tokio::runtime::Runtime,
    client: drover_api::Client,
}

impl Api {
    /// The API of the agent whose socket is `socket`.
    pub fn new(socket: &Path) -> Api {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the API client");
        Api {
            runtime,
            client: drover_api::Client::new(socket),
        }
    }

    /// Run one call of the client to its end: `api.block_on(api.get_task(&id))`.
    pub fn block_on<F: std::future::Future>(&self, call: F) -> F::Output {
        self.runtime.block_on(call)
    }
}

impl std::ops::Deref for Api {
    type Target = drover_api::Client;

    fn deref(&self) -> &drover_api::Client {
        &self.client
    }
}

/// A running agent, killed (with its plugins) when dropped.
pub struct Agent {
    pub child: Child,
    pub data_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub socket: PathBuf,
    pub started: Instant,
    pub log: PathBuf,
    pub marker: String,
    /// Destroy (`--force`) every task the agent knows before stopping it on drop, for
    /// tests whose tasks would otherwise outlive them (tasks outlive their agent by
    /// design). Off where a later agent on the same dirs takes the tasks over.
    pub end_tasks: bool,
}

impl Agent {
    /// Start `drover agent` on fresh dirs under `root`. Every process it starts inherits
    /// `DROVER_TEST_MARKER=<marker>` so the test can find leftovers.
    pub fn start(root: &Path, plugin_dir: &Path, extra: &[&str]) -> Agent {
        Agent::start_binary(&drover(), root, plugin_dir, extra)
    }

    /// [`Agent::start`] from another copy of the `drover` binary (its built-in drivers
    /// run from that copy).
    pub fn start_binary(binary: &Path, root: &Path, plugin_dir: &Path, extra: &[&str]) -> Agent {
        Agent::start_binary_env(binary, root, plugin_dir, extra, &[])
    }

    /// [`Agent::start`] with `env` added to the agent's environment.
    pub fn start_env(
        root: &Path,
        plugin_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        Agent::start_binary_env(&drover(), root, plugin_dir, extra, env)
    }

    /// [`Agent::start`] with only the agent's own defaults: raw_exec is not enabled
    /// (every other start enables it with a config file of its own, given before the
    /// test's: a later `--config` wins).
    pub fn start_with_defaults(root: &Path, plugin_dir: &Path, extra: &[&str]) -> Agent {
        Agent::spawn(&drover(), root, plugin_dir, extra, &[])
    }

    /// [`Agent::start_binary`] with `env` added to the agent's environment.
    pub fn start_binary_env(
        binary: &Path,
        root: &Path,
        plugin_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        // A test config written for the driver's older name `rawexec` gets the
        // enabling under that name too: both names at once are refused.
        let older_name = extra.windows(2).any(|w| {
            w[0] == "--config"
                && std::fs::read_to_string(w[1]).is_ok_and(|t| t.contains("[plugin.rawexec]"))
        });
        let enable = enable_raw_exec_as(root, if older_name { "rawexec" } else { "raw_exec" });
        let mut args: Vec<&str> = vec!["--config", enable.to_str().expect("a UTF-8 path")];
        args.extend_from_slice(extra);
        Agent::spawn(binary, root, plugin_dir, &args, env)
    }

    fn spawn(
        binary: &Path,
        root: &Path,
        plugin_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let data_dir = root.join("data");
        let log = root.join("agent.log");
        let marker = format!(
            "zoo-{}-{}",
            std::process::id(),
            root.display().to_string().len()
        );
        let marker = format!("{marker}-{}", rand_suffix());
        // A dev agent's HTTP API is on Nomad's 127.0.0.1:4646 unless told otherwise:
        // tests run many at once, each on a port the OS picks.
        let dev_port: &[&str] = if extra.contains(&"--dev")
            && !extra.iter().any(|a| a.starts_with("--dev-http-addr"))
        {
            &["--dev-http-addr", "127.0.0.1:0"]
        } else {
            &[]
        };
        let child = Command::new(binary)
            .arg("agent")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--plugin-dir")
            .arg(plugin_dir)
            .args(extra)
            .args(dev_port)
            .env("DROVER_TEST_MARKER", &marker)
            .env("RUST_LOG", "info")
            // The built-in docker driver finds no daemon here whatever the machine has
            // (`undetected`); docker tests name their daemon in the plugin config.
            .env("DOCKER_HOST", "unix:///nonexistent/drover-test/docker.sock")
            // Plugins get only the agent variables listed (plugin_pass_env).
            .env("DROVER_PLUGIN_PASS_ENV", "DOCKER_HOST,DROVER_TEST_MARKER")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start drover agent");
        let socket = data_dir.join("api.sock");
        let agent = Agent {
            child,
            data_dir,
            plugin_dir: plugin_dir.to_owned(),
            socket,
            started: Instant::now(),
            log,
            marker,
            end_tasks: false,
        };
        agent.wait_for_socket();
        agent
    }

    fn wait_for_socket(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "agent API socket never appeared; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the agent's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// This agent's API, through `drover_api::Client`.
    pub fn api(&self) -> Api {
        Api::new(&self.socket)
    }

    /// Run the CLI against this agent.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(drover())
            .args(args)
            .env("DROVER_ADDR", format!("unix://{}", self.socket.display()))
            .output()
            .expect("run drover cli")
    }

    /// Run the CLI in `dir` (for commands that write files there): its stdout, or its
    /// stderr as the error.
    pub fn cli_in(&self, dir: &Path, args: &[&str]) -> Result<String, String> {
        let out = Command::new(drover())
            .args(args)
            .current_dir(dir)
            .env("DROVER_ADDR", format!("unix://{}", self.socket.display()))
            .output()
            .expect("run drover cli");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Run the CLI and parse its stdout as JSON; panics with stderr on failure.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "drover {args:?} failed: {}\n{}\nthe agent's log ends:\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
            self.log_tail(40)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "drover {args:?} printed non-JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Poll `plugin status --json` until `done` holds for it, or panic after `within`.
    pub fn wait_plugins(
        &self,
        within: Duration,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            let rows = self.cli_json(&["plugin", "status", "--json"]);
            let rows = rows.as_array().cloned().unwrap_or_default();
            if done(&rows) {
                return rows;
            }
            assert!(
                Instant::now() < deadline,
                "plugins did not settle within {within:?}: {rows:#?}\nagent log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Pids of live processes carrying this agent's marker (plugins and their children),
    /// excluding the agent itself.
    pub fn marked_pids(&self) -> Vec<u32> {
        let needle = format!("DROVER_TEST_MARKER={}", self.marker);
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if pid == self.child.id() {
                continue;
            }
            let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            // Zombies have an empty environ; they are not running processes.
            if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
                pids.push(pid);
            }
        }
        pids.sort();
        pids
    }

    /// Wait (up to 5 s) until the only live processes carrying this agent's marker are
    /// the pids of the loaded rows (`healthy`, or `undetected` like the built-in docker
    /// driver without a daemon): every other plugin process was shut down.
    pub fn assert_only_healthy_plugins_run(&self, rows: &[serde_json::Value]) {
        let want: std::collections::BTreeSet<u32> = rows
            .iter()
            .filter(|r| r["state"] == "healthy" || r["state"] == "undetected")
            .filter_map(|r| r["pid"].as_u64())
            .map(|p| p as u32)
            .collect();
        // Skipped plugins get a Shutdown, then SIGKILL after 2 s.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let live: std::collections::BTreeSet<u32> = self.marked_pids().into_iter().collect();
            if live == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "leftover plugin processes: live {live:?}, expected only the healthy {want:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM the agent and wait for it to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = nix_kill(self.child.id(), 15);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.end_tasks && self.child.try_wait().ok().flatten().is_none() {
            let list = self.cli(&["task", "list", "--json"]);
            let tasks: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap_or_default();
            for id in tasks
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["id"].as_str())
            {
                let _ = self.cli(&["task", "destroy", "--force", id]);
            }
        }
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix_kill(self.child.id(), 15);
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Plugins outlive a killed agent by design; the test owns them, so end them.
        for pid in self.marked_pids() {
            let _ = nix_kill(pid, 9);
        }
    }
}

/// `dir` bound on itself `nosuid,nodev`, as an operator makes the filesystem of a
/// host volume that docker tasks mount writable (the docker driver refuses it
/// otherwise); unmounted when dropped.
pub struct NosuidNodev(PathBuf);

impl NosuidNodev {
    pub fn mount(dir: &Path) -> Self {
        use rustix::mount::MountFlags;
        rustix::mount::mount_bind(dir, dir).expect("bind a volume directory on itself");
        let m = NosuidNodev(dir.to_owned());
        rustix::mount::mount_remount(
            dir,
            MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV,
            "",
        )
        .expect("remount a volume nosuid,nodev");
        m
    }
}

impl Drop for NosuidNodev {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

pub fn nix_kill(pid: u32, sig: i32) -> nix::Result<()> {
    let signal = nix::sys::signal::Signal::try_from(sig)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}

/// Field `key` of the row named `name`.
pub fn row<'a>(rows: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no plugin row named {name:?} in {rows:#?}"))
}

/// A config file under `root` that enables raw_exec (off by default on every agent
/// but a dev one): most tests run their tasks with it. Its path.
pub fn enable_raw_exec(root: &Path) -> PathBuf {
    enable_raw_exec_as(root, "raw_exec")
}

/// [`enable_raw_exec`] in the section `[plugin.SECTION]`.
fn enable_raw_exec_as(root: &Path, section: &str) -> PathBuf {
    let file = root.join("raw_exec.toml");
    std::fs::write(
        &file,
        format!("[plugin.{section}]\nconfig = {{ enabled = true }}\n"),
    )
    .expect("write raw_exec.toml");
    file
}

/// An agent on fresh dirs with the built-in rawexec driver healthy.
pub fn rawexec_agent() -> (tempfile::TempDir, Agent) {
    rawexec_agent_with_config("")
}

/// [`rawexec_agent`] with `config` (TOML) as its agent config.
pub fn rawexec_agent_with_config(config: &str) -> (tempfile::TempDir, Agent) {
    let (root, agent) = agent_with_config(config);
    agent.wait_plugins(Duration::from_secs(10), |rows| {
        rows.iter()
            .any(|r| r["name"] == "raw_exec" && r["state"] == "healthy")
    });
    (root, agent)
}

/// An agent on fresh dirs with `config` (TOML; empty: none) as its agent config, which
/// destroys its tasks when dropped.
pub fn agent_with_config(config: &str) -> (tempfile::TempDir, Agent) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins");
    std::fs::create_dir(&dir).unwrap();
    let file = root.path().join("agent.toml");
    let args: Vec<&str> = if config.is_empty() {
        Vec::new()
    } else {
        std::fs::write(&file, config).unwrap();
        vec!["--config", file.to_str().unwrap()]
    };
    let mut agent = Agent::start(root.path(), &dir, &args);
    agent.end_tasks = true;
    (root, agent)
}
