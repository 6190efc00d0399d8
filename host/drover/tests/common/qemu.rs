//! Helpers for the qemu driver's end-to-end tests (`host/drover/tests/drivers/qemu.rs`): an
//! agent whose qemu driver takes images from the VM rig's directory, task configs that
//! boot the rig's guest, and a watch over the `qemu-system-*` processes of one task.
//!
//! Every guest a test boots carries a marker of its own on its kernel command line
//! (`drover.e2e=<marker>`, which the guest ignores). The kernel command line is on
//! qemu's command line (`-append`), so `/proc/<pid>/cmdline` tells which qemu process
//! belongs to which task, whatever the driver names its files.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_test_support::procs;
use drover_test_support::vm::Rig;
use serde_json::{Value, json};

use crate::common::{Agent, nix_kill};

/// How long a guest may take to boot, print or power off: TCG on two cores that other
/// builds share is slow, and a deadline only bounds a hang.
pub const BOOT: Duration = Duration::from_secs(120);

/// A marker unique to one guest of one test run.
pub fn marker(what: &str) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    format!("e2e-{what}-{}-{:x}", std::process::id(), h.finish())
}

/// The agent config (TOML) whose `[plugin.qemu]` config is `plugin_config`.
pub fn agent_config(plugin_config: &Value) -> String {
    format!("[plugin.qemu]\nconfig = {}\n", toml_inline(plugin_config))
}

/// A JSON value as a TOML inline value: JSON's strings, numbers, booleans and arrays
/// are TOML's already; objects become inline tables with quoted keys.
fn toml_inline(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{} = {}", Value::from(k.as_str()), toml_inline(v)))
                .collect();
            format!("{{ {} }}", fields.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml_inline).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Null => panic!("TOML has no null"),
        other => other.to_string(),
    }
}

/// Start an agent on `root` (data dir `root/data`) with the qemu plugin config
/// `plugin_config`, and wait until its qemu driver is healthy. Call it again on the
/// same `root` after a `kill -9` to get the next agent on the same state.
pub fn start_agent(root: &Path, plugin_config: &Value) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let config = root.join("agent.toml");
    std::fs::write(&config, agent_config(plugin_config)).expect("write the agent config");
    // A killed agent leaves its socket file; the helper waits for the file to appear.
    let _ = std::fs::remove_file(root.join("data").join("api.sock"));
    let agent = Agent::start(
        root,
        &plugins,
        &["--config", config.to_str().expect("utf-8 path")],
    );
    wait_qemu_plugin(&agent, BOOT, |_| true);
    agent
}

/// The qemu row of `plugin status`, once it is healthy and `also` holds for it.
pub fn wait_qemu_plugin(agent: &Agent, within: Duration, also: impl Fn(&Value) -> bool) -> Value {
    let healthy = |r: &Value| r["name"] == "qemu" && r["state"] == "healthy" && also(r);
    let rows = agent.wait_plugins(within, |rows| rows.iter().any(healthy));
    rows.into_iter().find(healthy).expect("the qemu row")
}

/// The rig's directory: the plugin's `image_paths` in these tests.
pub fn rig_dir(rig: &Rig) -> PathBuf {
    rig.kernel
        .parent()
        .expect("the rig's kernel is in a directory")
        .to_owned()
}

/// A task config booting the rig's guest directly (`kernel`/`initrd`) on a q35 machine
/// under TCG, with `orders` and the marker on its kernel command line; `extra`'s keys
/// are added (or replace these).
pub fn guest_config(rig: &Rig, marker: &str, orders: &[&str], extra: Value) -> Value {
    let mut line: Vec<String> = orders.iter().map(|o| (*o).to_owned()).collect();
    line.push(format!("drover.e2e={marker}"));
    let line: Vec<&str> = line.iter().map(String::as_str).collect();
    let mut config = json!({
        "kernel": rig.kernel,
        "initrd": rig.initrd,
        "append": rig.append(&line),
        "machine": "q35",
        "accelerator": "tcg",
    });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            c.insert(k.clone(), v.clone());
        }
    }
    config
}

/// `drover task run --driver qemu --config <config> --json <extra>`: the CLI's output.
pub fn run_cli(agent: &Agent, config: &Value, extra: &[&str]) -> std::process::Output {
    let config = config.to_string();
    let mut args = vec![
        "task", "run", "--driver", "qemu", "--config", &config, "--json",
    ];
    args.extend_from_slice(extra);
    agent.cli(&args)
}

/// Run a qemu task through the CLI; its id. Panics with the CLI's and the agent's
/// words if it is refused.
pub fn run(agent: &Agent, config: &Value, extra: &[&str]) -> String {
    let out = run_cli(agent, config, extra);
    assert!(
        out.status.success(),
        "drover task run refused {config:#}: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.log_text()
    );
    let task: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "task run printed non-JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    task["id"].as_str().expect("task id").to_owned()
}

/// `drover task status ID --json`.
pub fn status(agent: &Agent, id: &str) -> Value {
    agent.cli_json(&["task", "status", id, "--json"])
}

/// `drover task logs ID`: the guest's serial console so far.
pub fn logs(agent: &Agent, id: &str) -> String {
    let out = agent.cli(&["task", "logs", id]);
    assert!(
        out.status.success(),
        "drover task logs {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait until the task's logs contain `needle`; the logs then.
pub fn wait_log(agent: &Agent, id: &str, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = logs(agent, id);
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} never appeared in task {id}'s logs within {within:?}:\n{text}\n\
             task: {:#}\nagent log:\n{}",
            status(agent, id),
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The highest `drover-guest: tick N` in a log (0: none yet).
pub fn last_tick(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.trim().strip_prefix("drover-guest: tick "))
        .filter_map(|n| n.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

/// Wait until the guest has ticked past `after` (its logs go on); the new last tick.
pub fn ticks_past(agent: &Agent, id: &str, after: u64) -> u64 {
    let deadline = Instant::now() + BOOT;
    loop {
        let text = logs(agent, id);
        let n = last_tick(&text);
        if n > after {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "the guest of task {id} did not tick past {after} within {BOOT:?}:\n{text}\n\
             agent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Live `qemu-system-*` processes whose command line contains `marker`, with their
/// start times (a pid with its start time is one process for good).
pub fn qemu_processes(marker: &str) -> BTreeSet<(u32, u64)> {
    let mut found = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        // `comm` is short and cheap; the command line is read only for qemu.
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if !comm.starts_with("qemu-system-") {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let mine = cmdline
            .split(|b| *b == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(marker));
        if mine
            && procs::alive(pid)
            && let Some(start) = procs::start_time(pid)
        {
            found.insert((pid, start));
        }
    }
    found
}

/// What a [`QemuWatch`] saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Every qemu process of the marker seen, as (pid, start time).
    pub processes: BTreeSet<(u32, u64)>,
    /// The most seen alive at one look.
    pub most_at_once: usize,
    /// Looks taken.
    pub looks: u64,
}

/// Looks at the marker's qemu processes every 20 ms on a thread of its own, from
/// creation until [`QemuWatch::seen`] is last called or it is dropped, so that a test
/// can say how many there were *throughout*, not only when it happened to look.
/// Dropping it also SIGKILLs every qemu process of the marker still alive, so that no
/// VM outlives a failed test.
pub struct QemuWatch {
    marker: String,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl QemuWatch {
    /// Start watching the qemu processes of `marker`.
    pub fn new(marker: &str) -> QemuWatch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (marker, seen, stop) = (marker.to_owned(), seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let now = qemu_processes(&marker);
                    if let Ok(mut s) = seen.lock() {
                        s.most_at_once = s.most_at_once.max(now.len());
                        s.processes.extend(now);
                        s.looks += 1;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        QemuWatch {
            marker: marker.to_owned(),
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// What it saw so far, after one more look of its own (so that a process that
    /// appeared just before the call is counted).
    pub fn seen(&self) -> Seen {
        let now = qemu_processes(&self.marker);
        let mut s = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.most_at_once = s.most_at_once.max(now.len());
        s.processes.extend(now);
        s.clone()
    }

    /// The marker's qemu processes alive now.
    pub fn alive(&self) -> BTreeSet<(u32, u64)> {
        qemu_processes(&self.marker)
    }

    /// Assert that exactly one qemu process of the marker was ever seen (and never
    /// two at once), and return it.
    pub fn assert_one(&self, when: &str) -> (u32, u64) {
        let s = self.seen();
        assert!(
            s.processes.len() == 1 && s.most_at_once == 1,
            "{when}: expected exactly one qemu process for the task throughout, saw {:?} \
             ({} at once at most, {} looks)",
            s.processes,
            s.most_at_once,
            s.looks
        );
        *s.processes.iter().next().expect("one process")
    }

    /// Wait until no qemu process of the marker is alive.
    pub fn wait_gone(&self, within: Duration) {
        drover_test_support::until_blocking(
            within,
            Duration::from_millis(20),
            "the task's qemu process exits",
            || self.alive().is_empty(),
        );
    }
}

impl Drop for QemuWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for (pid, start) in qemu_processes(&self.marker) {
            // The pid is that process still only while its start time matches.
            if procs::start_time(pid) == Some(start) {
                let _ = nix_kill(pid, 9);
            }
        }
    }
}

/// A TCP port of 127.0.0.1 nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// Addresses with a TCP socket listening on `port`, from `/proc/net/tcp` and
/// `/proc/net/tcp6` (this network namespace's, which qemu's user-mode network shares).
pub fn tcp_listeners(port: u16) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st …; st 0A is LISTEN.
            let (Some(local), Some(state)) = (cols.get(1), cols.get(3)) else {
                continue;
            };
            if *state != "0A" {
                continue;
            }
            let Some((addr, p)) = local.split_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() != Some(port) {
                continue;
            }
            if let Some(ip) = proc_net_addr(addr, v6) {
                found.push(ip);
            }
        }
    }
    found
}

/// An address as `/proc/net/tcp*` prints it: 32-bit words in host (little-endian) order.
fn proc_net_addr(hex: &str, v6: bool) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).map(u32::swap_bytes))
        .collect::<Result<_, _>>()
        .ok()?;
    match (v6, words.as_slice()) {
        (false, [w]) => Some(IpAddr::V4(Ipv4Addr::from(*w))),
        (true, [a, b, c, d]) => {
            let bytes: Vec<u8> = [a, b, c, d].iter().flat_map(|w| w.to_be_bytes()).collect();
            let bytes: [u8; 16] = bytes.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// Connect to `addr` and read until the peer closes, again and again until what it
/// says contains `want` or `within` passes (while the guest boots, qemu accepts a
/// forwarded connection and closes it at once, or the guest refuses it). What was
/// read last.
pub fn read_when_served(
    addr: std::net::SocketAddr,
    want: &str,
    within: Duration,
) -> Result<String, String> {
    use std::io::Read as _;
    let deadline = Instant::now() + within;
    loop {
        let attempt = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).and_then(
            |mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut text = String::new();
                s.read_to_string(&mut text)?;
                Ok(text)
            },
        );
        let last = match attempt {
            Ok(text) if text.contains(want) => return Ok(text),
            Ok(text) => format!("read {text:?}"),
            Err(e) => format!("error: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kill -9 an agent and reap it (its plugins and tasks live on).
pub fn kill9_agent(agent: &mut Agent) {
    agent.child.kill().expect("kill -9 the agent");
    agent.child.wait().expect("reap the agent");
}

/// Wait until a (restarted) agent has finished its start-up recovery.
pub fn wait_recovered(agent: &Agent, within: Duration) {
    let api = agent.api();
    drover_test_support::until_blocking(
        within,
        Duration::from_millis(50),
        "the agent finishes recovery",
        || {
            api.block_on(api.health())
                .is_ok_and(|h| h.recovery.is_some())
        },
    );
}
