//! A small typed QMP client over tokio (QEMU Machine Protocol: JSON objects, one per
//! line, on a unix socket).
//!
//! Why not a crate: `qapi`/`qapi-qmp` (generated from QEMU's whole schema) is only
//! passively maintained and brings thousands of generated types for the five commands
//! the driver sends; QMP's framing is one JSON value per line.
//!
//! The protocol, as the driver uses it:
//! 1. on connect the server sends a greeting `{"QMP": {"version": {...}, "capabilities": [...]}}`;
//! 2. the client must send `{"execute": "qmp_capabilities"}` before any other command;
//! 3. each command gets `{"return": ...}` or `{"error": {"class", "desc"}}`, matched by
//!    the `id` the client sends with it;
//! 4. asynchronous events `{"event": "SHUTDOWN", "data": {"guest": true, "reason":
//!    "guest-shutdown"}, "timestamp": {...}}` may arrive between replies.
//!
//! Every read is bounded (a line longer than [`MAX_LINE`] is an error, so a broken or
//! hostile peer cannot grow our memory) and every call takes a timeout.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// Longest QMP line accepted (replies to the commands we send are a few hundred bytes).
pub const MAX_LINE: usize = 1 << 20;

/// Events kept while nobody asks for them; beyond this the oldest are dropped.
pub const MAX_QUEUED_EVENTS: usize = 256;

/// Longest event name or `SHUTDOWN` reason kept: QMP's are short identifiers, and a
/// queue of [`MAX_QUEUED_EVENTS`] events must stay small whatever the peer sends.
const MAX_NAME: usize = 128;

/// How much is read from the socket at once.
const READ_CHUNK: usize = 16 * 1024;

/// What can go wrong talking QMP.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting or reading/writing the socket failed.
    #[error("QMP socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The peer sent something that is not QMP (no greeting, bad JSON, a line too long).
    #[error("QMP protocol: {0}")]
    Protocol(String),
    /// The command failed: QMP's `error.class` and `error.desc`.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command sent.
        command: String,
        /// QMP's error class (`GenericError`, `CommandNotFound`, …).
        class: String,
        /// QMP's description.
        desc: String,
    },
    /// No answer in time.
    #[error("QMP {0}: no answer within {1:?}")]
    Timeout(String, Duration),
    /// The connection closed (qemu exited).
    #[error("QMP connection closed")]
    Closed,
}

/// qemu's version from the greeting.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct QemuVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Micro.
    pub micro: u32,
    /// The package string (`Debian 1:7.2+dfsg-7`), may be empty.
    pub package: String,
}

/// `query-status`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VmStatus {
    /// `running`, `paused`, `shutdown`, `prelaunch`, …
    pub status: String,
    /// Whether the VM's CPUs run.
    pub running: bool,
}

/// An asynchronous QMP event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `SHUTDOWN`: `guest` is true when the guest itself powered off (ACPI poweroff
    /// after `system_powerdown`, or a `poweroff` inside); `reason` is QMP's
    /// (`guest-shutdown`, `host-qmp-quit`, `host-signal`, …).
    Shutdown {
        /// The guest asked for it.
        guest: bool,
        /// QMP's reason.
        reason: String,
    },
    /// `POWERDOWN`: `system_powerdown` was delivered (the guest may ignore it).
    Powerdown,
    /// `STOP` / `RESUME`.
    Stop,
    /// `RESUME`.
    Resume,
    /// Any other event, by name.
    Other(String),
}

/// A connected QMP session, past the greeting and `qmp_capabilities`.
///
/// Events that arrive while a command waits for its reply are kept (bounded: the
/// oldest are dropped beyond 256) and handed out by [`Qmp::next_event`].
///
/// Every method is cancel-safe as far as reading goes: bytes read before a timeout
/// stay buffered for the next call. A command whose *write* a timeout cut off leaves
/// the peer holding half a command, so the session then refuses further commands
/// (reconnect). After [`QmpError::Closed`] or a [`QmpError::Protocol`] error from the
/// peer's side, the session stays failed the same way.
pub struct Qmp {
    path: String,
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    /// Bytes read but not yet cut into lines.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no newline (so a long line is scanned once).
    scanned: usize,
    version: QemuVersion,
    events: VecDeque<Event>,
    dropped_events: u64,
    next_id: u64,
    /// Why the session cannot go on, once it cannot.
    failed: Option<Failed>,
    /// A command is being written; still true at the next call means a timeout cut
    /// the write off.
    writing: bool,
}

impl std::fmt::Debug for Qmp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qmp")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("queued_events", &self.events.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
enum Failed {
    Closed,
    Protocol(String),
}

/// One line from the peer, classified.
enum Message {
    Greeting(QemuVersion),
    /// A command's answer: its `id` as sent back, and `return` or `error`.
    Reply {
        id: Option<Value>,
        result: Result<Value, (String, String)>,
    },
    Event(Event),
}

#[derive(Deserialize)]
struct Greeting {
    #[serde(rename = "QMP")]
    qmp: GreetingBody,
}

#[derive(Deserialize)]
struct GreetingBody {
    version: GreetingVersion,
}

#[derive(Deserialize)]
struct GreetingVersion {
    qemu: VersionTriple,
    #[serde(default)]
    package: String,
}

#[derive(Deserialize)]
struct VersionTriple {
    major: u32,
    minor: u32,
    micro: u32,
}

#[derive(Deserialize)]
struct CommandError {
    class: String,
    desc: String,
}

#[derive(Deserialize)]
struct ShutdownData {
    guest: bool,
    /// Added in qemu 4.0; absent from older ones.
    #[serde(default)]
    reason: String,
}

impl Qmp {
    /// Connect to the socket at `path`, read the greeting and negotiate
    /// (`qmp_capabilities`), all within `timeout`. `path` is a socket in a directory
    /// only the driver can write (the caller makes sure of that).
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let shown = path.display().to_string();
        let negotiate = async {
            let stream = UnixStream::connect(path)
                .await
                .map_err(|source| QmpError::Io {
                    path: shown.clone(),
                    source,
                })?;
            let (reader, writer) = stream.into_split();
            let mut qmp = Qmp {
                path: shown.clone(),
                reader,
                writer,
                pending: Vec::new(),
                scanned: 0,
                version: QemuVersion {
                    major: 0,
                    minor: 0,
                    micro: 0,
                    package: String::new(),
                },
                events: VecDeque::new(),
                dropped_events: 0,
                next_id: 1,
                failed: None,
                writing: false,
            };
            match qmp.receive().await? {
                Message::Greeting(version) => qmp.version = version,
                _ => {
                    return Err(qmp.fail(
                        "the first message is not the QMP greeting ({\"QMP\": ...})".into(),
                    ));
                }
            }
            qmp.exchange("qmp_capabilities", None).await?;
            Ok(qmp)
        };
        tokio::time::timeout(timeout, negotiate)
            .await
            .unwrap_or_else(|_| {
                Err(QmpError::Timeout(
                    format!("greeting and qmp_capabilities on {shown}"),
                    timeout,
                ))
            })
    }

    /// qemu's version, from the greeting.
    pub fn version(&self) -> &QemuVersion {
        &self.version
    }

    /// How many events were dropped because nobody took them and more than
    /// [`MAX_QUEUED_EVENTS`] were waiting.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    /// `query-status`.
    pub async fn query_status(&mut self, timeout: Duration) -> Result<VmStatus, QmpError> {
        let value = self.execute("query-status", None, timeout).await?;
        serde_json::from_value(value).map_err(|e| {
            QmpError::Protocol(format!("query-status answered something unexpected: {e}"))
        })
    }

    /// `system_powerdown`: press the ACPI power button. Returns when qemu accepted it;
    /// whether the guest acts on it shows as a `SHUTDOWN` event (or never).
    pub async fn system_powerdown(&mut self, timeout: Duration) -> Result<(), QmpError> {
        self.execute("system_powerdown", None, timeout)
            .await
            .map(drop)
    }

    /// `quit`: qemu exits at once (no guest shutdown). qemu closing the socket before
    /// its answer arrives counts as done: it did what was asked.
    pub async fn quit(&mut self, timeout: Duration) -> Result<(), QmpError> {
        match self.execute("quit", None, timeout).await {
            Ok(_) | Err(QmpError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Any command with arguments, for what has no typed method yet; the `return`
    /// value as JSON.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<serde_json::Value, QmpError> {
        tokio::time::timeout(timeout, self.exchange(command, arguments))
            .await
            .unwrap_or_else(|_| Err(QmpError::Timeout(command.to_owned(), timeout)))
    }

    /// The next event (kept ones first); `Ok(None)` when `timeout` passes without one;
    /// [`QmpError::Closed`] when qemu closed the socket.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, QmpError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(Some(event));
        }
        let wait = async {
            loop {
                match self.receive().await? {
                    Message::Event(event) => return Ok(event),
                    Message::Reply { id, .. } => {
                        tracing::debug!(path = %self.path, ?id, "QMP answer nobody waits for (its command timed out)");
                    }
                    Message::Greeting(_) => {
                        return Err(self.fail("a second greeting".into()));
                    }
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(result) => result.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Send `command` with a fresh id and wait (unbounded: the callers bound it) for
    /// its answer, keeping the events that come first.
    async fn exchange(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.usable()?;
        let id = self.next_id;
        self.next_id += 1;
        let mut request = json!({ "execute": command, "id": id });
        if let Some(arguments) = arguments {
            request["arguments"] = arguments;
        }
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        self.writing = true;
        if let Err(e) = self.writer.write_all(&line).await {
            self.writing = false;
            return Err(self.io_error(e));
        }
        self.writing = false;
        loop {
            match self.receive().await? {
                Message::Reply {
                    id: Some(answered),
                    result,
                } if answered == json!(id) => {
                    return result.map_err(|(class, desc)| QmpError::Command {
                        command: command.to_owned(),
                        class,
                        desc,
                    });
                }
                Message::Reply { id, .. } => {
                    tracing::debug!(path = %self.path, ?id, "QMP answer to an earlier command that timed out");
                }
                Message::Event(event) => self.keep(event),
                Message::Greeting(_) => return Err(self.fail("a second greeting".into())),
            }
        }
    }

    fn keep(&mut self, event: Event) {
        if self.events.len() >= MAX_QUEUED_EVENTS {
            self.events.pop_front();
            self.dropped_events += 1;
            tracing::warn!(path = %self.path, dropped = self.dropped_events, "QMP event queue full: dropped the oldest event");
        }
        self.events.push_back(event);
    }

    /// Err when the session cannot take another command.
    fn usable(&mut self) -> Result<(), QmpError> {
        if self.writing {
            return Err(self.fail(
                "an earlier command's write was cut off by its timeout; the session is out of \
                 step (reconnect)"
                    .into(),
            ));
        }
        match &self.failed {
            None => Ok(()),
            Some(Failed::Closed) => Err(QmpError::Closed),
            Some(Failed::Protocol(why)) => Err(QmpError::Protocol(why.clone())),
        }
    }

    /// Mark the session failed for `why` and return the error to give.
    fn fail(&mut self, why: String) -> QmpError {
        self.failed = Some(Failed::Protocol(why.clone()));
        QmpError::Protocol(why)
    }

    fn io_error(&mut self, source: std::io::Error) -> QmpError {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
        if matches!(source.kind(), BrokenPipe | ConnectionReset | UnexpectedEof) {
            self.failed = Some(Failed::Closed);
            return QmpError::Closed;
        }
        QmpError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// The next message from the peer.
    async fn receive(&mut self) -> Result<Message, QmpError> {
        // Not `usable()`: a half-written command leaves the peer's input out of step,
        // not what it sends us.
        match &self.failed {
            None => {}
            Some(Failed::Closed) => return Err(QmpError::Closed),
            Some(Failed::Protocol(why)) => return Err(QmpError::Protocol(why.clone())),
        }
        let line = self.read_line().await?;
        let parsed = parse_message(&line);
        parsed.map_err(|why| self.fail(why))
    }

    /// The next non-empty line, without its line end. Cancel-safe: what was read stays
    /// in `pending`.
    async fn read_line(&mut self) -> Result<Vec<u8>, QmpError> {
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            if let Some(at) = self.pending[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
            {
                let end = self.scanned + at;
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                self.scanned = 0;
                line.pop();
                if line.len() > MAX_LINE {
                    return Err(self.fail(too_long()));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(line);
            }
            self.scanned = self.pending.len();
            if self.pending.len() > MAX_LINE {
                self.pending = Vec::new();
                self.scanned = 0;
                return Err(self.fail(too_long()));
            }
            let n = match self.reader.read(&mut chunk).await {
                Ok(n) => n,
                Err(e) => return Err(self.io_error(e)),
            };
            if n == 0 {
                self.failed = Some(Failed::Closed);
                return Err(QmpError::Closed);
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

fn too_long() -> String {
    format!("a line longer than {MAX_LINE} bytes")
}

/// At most 60 bytes of `line`, escaped, for error messages.
fn snippet(line: &[u8]) -> String {
    let cut = &line[..line.len().min(60)];
    let text: String = String::from_utf8_lossy(cut).escape_debug().collect();
    if cut.len() < line.len() {
        format!("{text}…")
    } else {
        text
    }
}

fn parse_message(line: &[u8]) -> Result<Message, String> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| format!("not JSON ({e}): \"{}\"", snippet(line)))?;
    let Value::Object(mut object) = value else {
        return Err(format!("not a JSON object: \"{}\"", snippet(line)));
    };
    if let Some(greeting) = object.remove("QMP") {
        let greeting: Greeting = serde_json::from_value(json!({ "QMP": greeting }))
            .map_err(|e| format!("bad greeting ({e}): \"{}\"", snippet(line)))?;
        let v = greeting.qmp.version;
        return Ok(Message::Greeting(QemuVersion {
            major: v.qemu.major,
            minor: v.qemu.minor,
            micro: v.qemu.micro,
            package: v.package.trim().to_owned(),
        }));
    }
    if let Some(name) = object.get("event") {
        let Value::String(name) = name else {
            return Err(format!(
                "an event name that is not a string: \"{}\"",
                snippet(line)
            ));
        };
        return parse_event(name, object.get("data")).map(Message::Event);
    }
    let id = object.remove("id");
    if let Some(value) = object.remove("return") {
        return Ok(Message::Reply {
            id,
            result: Ok(value),
        });
    }
    if let Some(error) = object.remove("error") {
        let error: CommandError = serde_json::from_value(error)
            .map_err(|e| format!("bad error answer ({e}): \"{}\"", snippet(line)))?;
        return Ok(Message::Reply {
            id,
            result: Err((error.class, error.desc)),
        });
    }
    Err(format!(
        "neither greeting, answer nor event: \"{}\"",
        snippet(line)
    ))
}

fn parse_event(name: &str, data: Option<&Value>) -> Result<Event, String> {
    if name.len() > MAX_NAME {
        return Err(format!("an event name longer than {MAX_NAME} bytes"));
    }
    Ok(match name {
        "SHUTDOWN" => {
            let data: ShutdownData = data
                .cloned()
                .ok_or_else(|| "SHUTDOWN without data".to_owned())
                .and_then(|d| {
                    serde_json::from_value(d).map_err(|e| format!("SHUTDOWN's data: {e}"))
                })?;
            if data.reason.len() > MAX_NAME {
                return Err(format!("a SHUTDOWN reason longer than {MAX_NAME} bytes"));
            }
            Event::Shutdown {
                guest: data.guest,
                reason: data.reason,
            }
        }
        "POWERDOWN" => Event::Powerdown,
        "STOP" => Event::Stop,
        "RESUME" => Event::Resume,
        other => Event::Other(other.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    //! Against real qemu (`-machine none`, and the VM rig's guest under TCG); the
    //! hostile-peer cases use a small in-test peer, since they test our own bounds.
    use std::path::PathBuf;
    use std::process::Stdio;

    use drover_test_support::{until, vm, within};
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::UnixListener;
    use tokio::process::{Child, Command};

    use super::*;

    const T: Duration = Duration::from_secs(10);

    /// A qemu process with its QMP socket, killed when dropped (a failing test too).
    struct Vm {
        child: Child,
        dir: tempfile::TempDir,
        socket: PathBuf,
    }

    impl Vm {
        /// Start `qemu args...` with a QMP socket in a fresh directory; waits for the
        /// socket to appear.
        async fn start(qemu: &Path, dir: tempfile::TempDir, args: &[String]) -> Vm {
            let socket = dir.path().join("qmp.sock");
            let child = Command::new(qemu)
                .args(["-display", "none", "-nodefaults", "-no-reboot", "-qmp"])
                .arg(format!("unix:{},server=on,wait=off", socket.display()))
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn qemu");
            until(Duration::from_secs(20), "qemu's QMP socket", || {
                socket.exists()
            })
            .await;
            Vm { child, dir, socket }
        }

        /// The VM rig's guest with `orders`, serial console into `serial.log`.
        async fn guest(rig: &vm::Rig, orders: &[&str]) -> Vm {
            let dir = tempfile::tempdir().expect("temp dir");
            let args: Vec<String> = [
                "-machine",
                "q35,accel=tcg",
                "-m",
                "256",
                "-kernel",
                &rig.kernel.display().to_string(),
                "-initrd",
                &rig.initrd.display().to_string(),
                "-append",
                &rig.append(orders),
                "-serial",
                &format!("file:{}", dir.path().join("serial.log").display()),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            Vm::start(&rig.qemu, dir, &args).await
        }

        fn serial(&self) -> String {
            std::fs::read_to_string(self.dir.path().join("serial.log")).unwrap_or_default()
        }

        async fn wait_serial(&self, line: &str) {
            until(
                Duration::from_secs(120),
                &format!("guest serial line {line:?}"),
                || self.serial().contains(line),
            )
            .await;
        }

        async fn connect(&self) -> Qmp {
            Qmp::connect(&self.socket, T).await.expect("QMP connect")
        }
    }

    /// The next event that is not `Other`, within `limit`.
    async fn next_known(qmp: &mut Qmp, limit: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match qmp.next_event(left).await.expect("next_event") {
                Some(Event::Other(_)) => continue,
                other => return other,
            }
        }
    }

    #[tokio::test]
    async fn greeting_commands_errors_events_and_quit_against_real_qemu() {
        let Some(rig) = vm::rig() else { return };
        let mut vm = Vm::start(
            &rig.qemu,
            tempfile::tempdir().expect("temp dir"),
            &["-machine".into(), "none".into()],
        )
        .await;
        let mut qmp = vm.connect().await;
        assert!(qmp.version().major >= 4, "version {:?}", qmp.version());

        let status = qmp.query_status(T).await.expect("query-status");
        assert_eq!(
            status,
            VmStatus {
                status: "running".into(),
                running: true
            }
        );

        match qmp.execute("no-such-command", None, T).await {
            Err(QmpError::Command {
                command,
                class,
                desc,
            }) => {
                assert_eq!(command, "no-such-command");
                assert_eq!(class, "CommandNotFound");
                assert!(desc.contains("no-such-command"), "{desc}");
            }
            other => panic!("expected CommandNotFound, got {other:?}"),
        }
        // Bad arguments are the command's error too, and the session goes on.
        match qmp
            .execute("qom-get", Some(json!({ "path": "/machine" })), T)
            .await
        {
            Err(QmpError::Command { class, .. }) => assert_eq!(class, "GenericError"),
            other => panic!("expected GenericError for a missing argument, got {other:?}"),
        }
        let list = qmp
            .execute("qom-list", Some(json!({ "path": "/machine" })), T)
            .await
            .expect("qom-list with arguments");
        assert!(list.as_array().is_some_and(|a| !a.is_empty()), "{list}");

        // Events that arrive while a command waits are kept, in order.
        qmp.execute("stop", None, T).await.expect("stop");
        qmp.execute("cont", None, T).await.expect("cont");
        qmp.system_powerdown(T).await.expect("system_powerdown");
        assert_eq!(next_known(&mut qmp, T).await, Some(Event::Stop));
        assert_eq!(next_known(&mut qmp, T).await, Some(Event::Resume));
        assert_eq!(next_known(&mut qmp, T).await, Some(Event::Powerdown));
        assert_eq!(
            qmp.next_event(Duration::from_millis(200))
                .await
                .expect("no event"),
            None
        );

        qmp.quit(T).await.expect("quit");
        assert_eq!(
            next_known(&mut qmp, T).await,
            Some(Event::Shutdown {
                guest: false,
                reason: "host-qmp-quit".into()
            })
        );
        assert!(matches!(qmp.next_event(T).await, Err(QmpError::Closed)));
        assert!(matches!(qmp.query_status(T).await, Err(QmpError::Closed)));
        let exit = within(T, "qemu to exit after quit", vm.child.wait())
            .await
            .expect("wait qemu");
        assert!(exit.success(), "qemu exited {exit}");
    }

    #[tokio::test]
    async fn connect_to_a_missing_socket_names_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nothing.sock");
        match Qmp::connect(&path, T).await {
            Err(e @ QmpError::Io { .. }) => {
                assert!(e.to_string().contains("nothing.sock"), "{e}")
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn guest_powers_off_on_system_powerdown() {
        let Some(rig) = vm::rig() else { return };
        let vm = Vm::guest(&rig, &["drover.tick=1"]).await;
        let mut qmp = vm.connect().await;
        vm.wait_serial(vm::GUEST_STARTED).await;
        // acpid starts after the modules load, a moment after the first line: press
        // the button until the guest acts on it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let shutdown = loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no SHUTDOWN within 60 s of pressing the power button; serial:\n{}",
                vm.serial()
            );
            qmp.system_powerdown(T).await.expect("system_powerdown");
            assert_eq!(next_known(&mut qmp, T).await, Some(Event::Powerdown));
            match next_known(&mut qmp, Duration::from_secs(3)).await {
                Some(e @ Event::Shutdown { .. }) => break e,
                None => continue,
                Some(other) => panic!("unexpected event {other:?}"),
            }
        };
        assert_eq!(
            shutdown,
            Event::Shutdown {
                guest: true,
                reason: "guest-shutdown".into()
            }
        );
        assert!(
            vm.serial().contains("power button pressed"),
            "{}",
            vm.serial()
        );
    }

    #[tokio::test]
    async fn guest_without_acpid_ignores_system_powerdown() {
        let Some(rig) = vm::rig() else { return };
        let vm = Vm::guest(&rig, &["drover.acpid=0", "drover.tick=1"]).await;
        let mut qmp = vm.connect().await;
        // The tick loop starts after the point where acpid would have been started.
        vm.wait_serial("drover-guest: tick 2").await;
        qmp.system_powerdown(T).await.expect("system_powerdown");
        assert_eq!(next_known(&mut qmp, T).await, Some(Event::Powerdown));
        assert_eq!(
            next_known(&mut qmp, Duration::from_secs(5)).await,
            None,
            "the guest without acpid acted on the power button"
        );
        assert!(qmp.query_status(T).await.expect("query-status").running);
        qmp.quit(T).await.expect("quit");
        assert_eq!(
            next_known(&mut qmp, T).await,
            Some(Event::Shutdown {
                guest: false,
                reason: "host-qmp-quit".into()
            })
        );
    }

    // --- hostile peers: a listener in the test plays the server.

    const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 1, "minor": 2, "major": 7}, "package": " test "}, "capabilities": []}}"#;

    /// A peer on a fresh socket running `script` on the accepted connection.
    async fn peer<F, Fut>(script: F) -> (tempfile::TempDir, PathBuf)
    where
        F: FnOnce(UnixStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("peer.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(async move {
            if let Ok((stream, _)) = listener.accept().await {
                script(stream).await;
            }
        });
        (dir, path)
    }

    /// Read one request line from our client and return its id.
    async fn read_request(stream: &mut UnixStream) -> Value {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while stream.read_exact(&mut byte).await.is_ok() && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        serde_json::from_slice(&line).expect("request is JSON")
    }

    /// Greet and accept `qmp_capabilities`.
    async fn negotiate(stream: &mut UnixStream) {
        stream
            .write_all(format!("{GREETING}\r\n").as_bytes())
            .await
            .expect("greet");
        let request = read_request(stream).await;
        assert_eq!(request["execute"], "qmp_capabilities");
        let reply = json!({ "return": {}, "id": request["id"] });
        stream
            .write_all(format!("{reply}\r\n").as_bytes())
            .await
            .expect("reply");
    }

    #[tokio::test]
    async fn a_peer_without_greeting_times_out() {
        let (_dir, path) = peer(|stream| async move {
            // Hold the connection open, say nothing.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        })
        .await;
        let limit = Duration::from_millis(300);
        match Qmp::connect(&path, limit).await {
            Err(QmpError::Timeout(what, d)) => {
                assert!(what.contains("greeting"), "{what}");
                assert_eq!(d, limit);
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
    }

    /// Connect to a peer that sends `first` and then holds the connection open.
    async fn connect_to_peer_saying(first: &'static [u8]) -> Result<Qmp, QmpError> {
        let (_dir, path) = peer(move |mut stream| async move {
            let _ = stream.write_all(first).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        Qmp::connect(&path, T).await
    }

    #[tokio::test]
    async fn a_peer_sending_garbage_is_a_protocol_error() {
        match connect_to_peer_saying(b"SSH-2.0-OpenSSH_9.2\r\n").await {
            Err(QmpError::Protocol(why)) => {
                assert!(why.contains("not JSON") && why.contains("SSH-2.0"), "{why}")
            }
            other => panic!("expected Protocol, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_first_message_that_is_not_the_greeting_is_a_protocol_error() {
        match connect_to_peer_saying(b"{\"return\": {}}\n").await {
            Err(QmpError::Protocol(why)) => assert!(why.contains("greeting"), "{why}"),
            other => panic!("expected Protocol, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_endless_line_is_a_protocol_error_not_memory() {
        let (_dir, path) = peer(|mut stream| async move {
            negotiate(&mut stream).await;
            // An event line that never ends, far past MAX_LINE.
            let _ = stream.write_all(b"{\"event\": \"").await;
            let chunk = vec![b'A'; 64 * 1024];
            for _ in 0..(4 * MAX_LINE / chunk.len()) {
                if stream.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        let mut qmp = Qmp::connect(&path, T).await.expect("connect");
        assert_eq!(qmp.version().package, "test");
        match qmp.next_event(T).await {
            Err(QmpError::Protocol(why)) => assert!(why.contains("longer than"), "{why}"),
            other => panic!("expected Protocol, got {other:?}"),
        }
        assert!(
            qmp.pending.capacity() <= MAX_LINE + 2 * READ_CHUNK,
            "buffered {} bytes",
            qmp.pending.capacity()
        );
        // The session stays failed: the stream is out of step.
        assert!(matches!(
            qmp.query_status(T).await,
            Err(QmpError::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn a_peer_closing_mid_command_is_closed() {
        let (_dir, path) = peer(|mut stream| async move {
            negotiate(&mut stream).await;
            read_request(&mut stream).await;
        })
        .await;
        let mut qmp = Qmp::connect(&path, T).await.expect("connect");
        assert!(matches!(qmp.query_status(T).await, Err(QmpError::Closed)));
        assert!(matches!(qmp.next_event(T).await, Err(QmpError::Closed)));
    }

    #[tokio::test]
    async fn a_slow_answer_times_out_and_a_late_one_is_skipped() {
        let (_dir, path) = peer(|mut stream| async move {
            negotiate(&mut stream).await;
            let first = read_request(&mut stream).await;
            // The first command's answer comes after its timeout, then a half event line
            // (a timeout in the middle of a line must lose nothing), then the rest.
            let second = read_request(&mut stream).await;
            let late =
                json!({ "return": { "status": "late", "running": false }, "id": first["id"] });
            let on_time =
                json!({ "return": { "status": "paused", "running": false }, "id": second["id"] });
            let _ = stream
                .write_all(format!("{late}\n{on_time}\n{{\"event\": \"SHUT").as_bytes())
                .await;
            let _ = read_request(&mut stream).await; // "go on"
            let _ = stream
                .write_all(
                    b"DOWN\", \"data\": {\"guest\": true, \"reason\": \"guest-shutdown\"}}\n",
                )
                .await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        let mut qmp = Qmp::connect(&path, T).await.expect("connect");
        let short = Duration::from_millis(200);
        match qmp.query_status(short).await {
            Err(QmpError::Timeout(what, d)) => {
                assert_eq!(what, "query-status");
                assert_eq!(d, short);
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
        let status = qmp.query_status(T).await.expect("second query-status");
        assert_eq!(status.status, "paused");
        assert_eq!(qmp.next_event(short).await.expect("half an event"), None);
        // Any command makes the peer send the rest; it gets no answer, so time it out.
        let _ = qmp.execute("go-on", None, short).await;
        assert_eq!(
            qmp.next_event(T).await.expect("event"),
            Some(Event::Shutdown {
                guest: true,
                reason: "guest-shutdown".into()
            })
        );
    }

    #[tokio::test]
    async fn a_write_cut_off_by_its_timeout_stops_further_commands() {
        let (_dir, path) = peer(|mut stream| async move {
            negotiate(&mut stream).await;
            // Read nothing more: a big command fills the socket buffers and blocks.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        })
        .await;
        let mut qmp = Qmp::connect(&path, T).await.expect("connect");
        let big = json!({ "data": "x".repeat(8 << 20) });
        let short = Duration::from_millis(300);
        assert!(matches!(
            qmp.execute("big", Some(big), short).await,
            Err(QmpError::Timeout(_, _))
        ));
        match qmp.query_status(T).await {
            Err(QmpError::Protocol(why)) => assert!(why.contains("out of step"), "{why}"),
            other => panic!("expected Protocol, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn events_queue_is_bounded_dropping_the_oldest() {
        let extra = 44;
        let (_dir, path) = peer(move |mut stream| async move {
            negotiate(&mut stream).await;
            let request = read_request(&mut stream).await;
            let mut burst = String::new();
            for n in 0..(MAX_QUEUED_EVENTS + extra) {
                burst.push_str(&format!("{{\"event\": \"E{n}\"}}\n"));
            }
            burst.push_str(&format!(
                "{}\n",
                json!({ "return": {}, "id": request["id"] })
            ));
            let _ = stream.write_all(burst.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        let mut qmp = Qmp::connect(&path, T).await.expect("connect");
        qmp.execute("burst", None, T).await.expect("burst");
        assert_eq!(qmp.dropped_events(), extra as u64);
        let mut names = Vec::new();
        while let Some(e) = qmp
            .next_event(Duration::from_millis(100))
            .await
            .expect("event")
        {
            names.push(e);
        }
        assert_eq!(names.len(), MAX_QUEUED_EVENTS);
        assert_eq!(names[0], Event::Other(format!("E{extra}")));
        assert_eq!(
            names.last(),
            Some(&Event::Other(format!("E{}", MAX_QUEUED_EVENTS + extra - 1)))
        );
    }

    #[test]
    fn malformed_events_and_answers_are_protocol_errors() {
        for (line, expect) in [
            (r#"{"event": "SHUTDOWN"}"#, "SHUTDOWN without data"),
            (r#"{"event": "SHUTDOWN", "data": {"reason": "x"}}"#, "guest"),
            (r#"{"event": 7}"#, "not a string"),
            (r#"{"error": {"class": "X"}}"#, "bad error answer"),
            (r#"[1, 2]"#, "not a JSON object"),
            (r#"{"hello": 1}"#, "neither greeting"),
            (r#"{"QMP": {"version": {}}}"#, "bad greeting"),
        ] {
            match parse_message(line.as_bytes()) {
                Err(why) => assert!(why.contains(expect), "{line}: {why}"),
                Ok(_) => panic!("{line} parsed"),
            }
        }
        let long = format!(r#"{{"event": "{}"}}"#, "X".repeat(MAX_NAME + 1));
        assert!(parse_message(long.as_bytes()).is_err());
        // SHUTDOWN from a qemu before 4.0 has no reason.
        assert!(matches!(
            parse_message(br#"{"event": "SHUTDOWN", "data": {"guest": false}}"#),
            Ok(Message::Event(Event::Shutdown { guest: false, .. }))
        ));
    }
}
