//! Real FIFOs, real processes: the relay is this test binary re-executed, running the
//! test [`relay_process_entry`] (which calls `run_if_relay` first); the helper that
//! spawns a relay and is then SIGKILLed is the same binary running [`helper_entry`].

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use super::*;
use crate::logs::{file_name, log_files};

const LIMIT: Duration = Duration::from_secs(60);

/// Env marker of the helper process: the directory of its test's files.
const ENV_HELPER: &str = "DROVER_RELAY_TEST_HELPER";

/// The relay, when this binary is started as one by `spawn_relay` (the test harness
/// runs only this test then); an empty test otherwise.
#[test]
fn relay_process_entry() {
    run_if_relay();
}

/// The helper: spawns a relay for the layout in `$DROVER_RELAY_TEST_HELPER`, writes
/// its pid and start time to `relay` there, and waits to be killed.
#[test]
fn helper_entry() {
    let Some(dir) = std::env::var_os(ENV_HELPER) else {
        return;
    };
    let layout = Layout::at(PathBuf::from(dir));
    let relay = spawn_relay(
        &self_exe(),
        &relay_args(),
        &layout.spec(LogConfig::new(20, 1)),
    )
    .expect("helper: spawn_relay");
    let tmp = layout.root.join("relay.tmp");
    std::fs::write(&tmp, format!("{} {}", relay.pid, relay.start_time)).expect("helper: write");
    std::fs::rename(&tmp, layout.root.join("relay")).expect("helper: rename");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn self_exe() -> PathBuf {
    std::env::current_exe().expect("current_exe")
}

fn entry_args(test: &str) -> Vec<OsString> {
    ["--exact", test, "--test-threads=1", "-q", "--nocapture"]
        .iter()
        .map(OsString::from)
        .collect()
}

fn relay_args() -> Vec<OsString> {
    entry_args("logs::relay::tests::relay_process_entry")
}

/// A test's files: `fifos/` (0700), `logs/`.
struct Layout {
    root: PathBuf,
    out_fifo: PathBuf,
    err_fifo: PathBuf,
}

impl Layout {
    fn new(tmp: &tempfile::TempDir) -> Layout {
        let root = tmp.path().to_owned();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(root.join("fifos"))
            .unwrap();
        std::fs::create_dir(root.join("logs")).unwrap();
        let (out_fifo, err_fifo) = make_fifos(&root.join("fifos"), "task-1.0").unwrap();
        Layout {
            root,
            out_fifo,
            err_fifo,
        }
    }

    fn at(root: PathBuf) -> Layout {
        Layout {
            out_fifo: root.join("fifos/task-1.0.stdout"),
            err_fifo: root.join("fifos/task-1.0.stderr"),
            root,
        }
    }

    fn out_base(&self) -> PathBuf {
        self.root.join("logs/task.stdout")
    }

    fn err_base(&self) -> PathBuf {
        self.root.join("logs/task.stderr")
    }

    fn spec(&self, limits: LogConfig) -> RelaySpec {
        RelaySpec {
            stdout_fifo: self.out_fifo.clone(),
            stdout_base: self.out_base(),
            stderr_fifo: self.err_fifo.clone(),
            stderr_base: self.err_base(),
            limits,
        }
    }

    fn spawn(&self, limits: LogConfig) -> io::Result<RelayProcess> {
        spawn_relay(&self_exe(), &relay_args(), &self.spec(limits))
    }
}

/// Everything in the series at `base`, oldest file first.
fn series(base: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for (_, p) in log_files(base).unwrap() {
        all.extend(std::fs::read(p).unwrap());
    }
    all
}

/// Poll `cond` until it holds or [`LIMIT`] passes.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Make this test process the subreaper of the relays it starts (they are orphaned at
/// once), so that their exit status can be collected.
fn adopt_orphans() {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
}

/// Wait for the (adopted) relay to exit: its exit code.
fn exit_code(relay: &RelayProcess) -> i32 {
    assert!(relay.wait_exit(LIMIT).unwrap(), "relay still running");
    let pid = Pid::from_raw(i32::try_from(relay.pid).unwrap()).unwrap();
    let (_, status) = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
        .unwrap()
        .unwrap();
    status
        .exit_status()
        .unwrap_or_else(|| panic!("relay did not exit normally: {status:?}"))
}

/// A writer process: `script` run by sh with stdout and stderr on the FIFOs.
fn writer(layout: &Layout, script: &str) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec >'{}' 2>'{}'; {script}",
            layout.out_fifo.display(),
            layout.err_fifo.display()
        ))
        .current_dir(&layout.root)
        .spawn()
        .unwrap()
}

/// Linux's FIFO behaviour the relay's end-of-stream rests on: a reader that opened
/// before any writer gets no event (no POLLHUP) until a writer has come; once it has
/// gone, POLLHUP, and a read gives the data and then 0.
#[test]
fn fifo_hup_comes_only_after_a_writer_came_and_went() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    let reader = open_fifo(&layout.out_fifo).unwrap();
    let events = |fd: &OwnedFd| {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        rustix::event::poll(
            &mut fds,
            Some(&Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .unwrap();
        fds[0].revents()
    };
    assert!(events(&reader).is_empty(), "{:?}", events(&reader));
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .open(&layout.out_fifo)
        .unwrap();
    assert!(events(&reader).is_empty());
    w.write_all(b"hi").unwrap();
    assert_eq!(events(&reader), PollFlags::IN);
    drop(w);
    assert_eq!(events(&reader), PollFlags::IN | PollFlags::HUP);
    let mut buf = [0u8; 8];
    assert_eq!(rustix::io::read(&reader, &mut buf).unwrap(), 2);
    assert_eq!(rustix::io::read(&reader, &mut buf).unwrap(), 0);
    assert_eq!(events(&reader), PollFlags::HUP);
}

#[test]
fn make_fifos_makes_0600_fifos_and_replaces_stale_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fifos");
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    // A stale regular file and a stale FIFO (a previous start's).
    std::fs::write(dir.join("t.1.stdout"), "stale").unwrap();
    rfs::mkfifoat(rfs::CWD, dir.join("t.1.stderr"), Mode::from_raw_mode(0o644)).unwrap();
    let old_ino = std::fs::symlink_metadata(dir.join("t.1.stderr"))
        .unwrap()
        .ino();
    // Held, so that its inode number cannot be reused by the new FIFO.
    let _stale = rfs::open(dir.join("t.1.stderr"), OFlags::PATH, Mode::empty()).unwrap();
    let (out, err) = make_fifos(&dir, "t.1").unwrap();
    for p in [&out, &err] {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.file_type().is_fifo(), "{}", p.display());
        assert_eq!(m.mode() & 0o7777, FIFO_MODE);
    }
    assert_ne!(std::fs::symlink_metadata(&err).unwrap().ino(), old_ino);
    // Again: replaced, not refused.
    assert_eq!(make_fifos(&dir, "t.1").unwrap(), (out, err));
    // A link planted under a FIFO's name is removed, never its target.
    let target = tmp.path().join("target");
    std::fs::write(&target, "keep").unwrap();
    std::fs::remove_file(dir.join("t.1.stdout")).unwrap();
    std::os::unix::fs::symlink(&target, dir.join("t.1.stdout")).unwrap();
    make_fifos(&dir, "t.1").unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

    for bad in ["", ".", "..", "a/b", "../x", "a b", "é", &"x".repeat(201)] {
        let e = make_fifos(&dir, bad).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}: {e}");
        assert!(e.to_string().contains("FIFO name"), "{e}");
    }
}

#[test]
fn make_fifos_refuses_a_dir_that_is_not_private() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&real)
        .unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = make_fifos(&link, "t.0").unwrap_err();
    assert!(crate::taskdir::refusal(&e).is_some(), "{e}");
    assert!(
        std::fs::read_dir(&real).unwrap().next().is_none(),
        "nothing made through the link"
    );

    let open = tmp.path().join("open");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&open)
        .unwrap();
    rfs::chmod(&open, Mode::from_raw_mode(0o777)).unwrap();
    let e = make_fifos(&open, "t.0").unwrap_err();
    assert!(e.to_string().contains("group or others can write"), "{e}");

    let missing = make_fifos(&tmp.path().join("missing"), "t.0").unwrap_err();
    assert_eq!(missing.kind(), io::ErrorKind::NotFound, "{missing}");
    assert!(missing.to_string().contains("missing"), "{missing}");

    if rustix::process::geteuid().is_root() {
        let theirs = tmp.path().join("theirs");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&theirs)
            .unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = make_fifos(&theirs, "t.0").unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    } else {
        eprintln!("SKIPPED: a directory owned by another user needs root to make");
    }
}

/// The host (the helper) that started the relay is SIGKILLed while a task writes:
/// every line of both streams arrives exactly once, in order, and the relay exits 0
/// when the task's streams end.
#[test]
fn the_hosts_death_loses_nothing() {
    adopt_orphans();
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    let mut helper = Command::new(self_exe())
        .args(entry_args("logs::relay::tests::helper_entry"))
        .env(ENV_HELPER, &layout.root)
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let said = layout.root.join("relay");
    until("the helper's relay", || said.exists());
    let text = std::fs::read_to_string(&said).unwrap();
    let (pid, start) = text.split_once(' ').unwrap();
    let relay = RelayProcess {
        pid: pid.parse().unwrap(),
        start_time: start.parse().unwrap(),
    };
    assert!(relay.is_running());

    // Half the lines, then wait for `go`, then the other half.
    let n = 40_000;
    let mut task = writer(
        &layout,
        &format!(
            "i=0; while [ $i -lt {half} ]; do echo \"out $i\"; echo \"err $i\" >&2; i=$((i+1)); done; \
             while [ ! -e go ]; do sleep 0.01; done; \
             while [ $i -lt {n} ]; do echo \"out $i\"; echo \"err $i\" >&2; i=$((i+1)); done",
            half = n / 2
        ),
    );
    until("the first lines in the log", || {
        series(&layout.out_base()).len() > 1000
    });
    helper.kill().unwrap();
    helper.wait().unwrap();
    assert!(relay.is_running(), "the relay outlives its host");
    std::fs::write(layout.root.join("go"), "").unwrap();
    assert!(task.wait().unwrap().success());
    assert_eq!(exit_code(&relay), 0);
    for (base, stream) in [(layout.out_base(), "out"), (layout.err_base(), "err")] {
        let want: String = (0..n).map(|i| format!("{stream} {i}\n")).collect();
        let got = String::from_utf8(series(&base)).unwrap();
        assert!(
            got == want,
            "{stream}: {} bytes, want {}",
            got.len(),
            want.len()
        );
    }
}

/// A task writing more than the limits allow: no file is bigger than the limit, only
/// the newest `max_files` remain, and they hold the end of the stream, contiguous. A
/// restarted task's relay appends to the series it finds.
#[test]
fn rotation_limits_hold_and_a_restart_appends() {
    adopt_orphans();
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    std::fs::write(file_name(&layout.err_base(), 0), "before the restart\n").unwrap();
    let relay = layout.spawn(LogConfig::new(3, 1)).unwrap();
    // 250_000 lines of 16 bytes: 4 MB.
    let mut task = writer(&layout, "seq -f 'line %010g' 0 249999; echo again >&2");
    assert!(task.wait().unwrap().success());
    assert_eq!(exit_code(&relay), 0);
    let files = log_files(&layout.out_base()).unwrap();
    assert_eq!(files.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1, 2, 3]);
    for (_, p) in &files[..2] {
        assert_eq!(
            std::fs::metadata(p).unwrap().len(),
            1024 * 1024,
            "{}",
            p.display()
        );
    }
    let want: String = (0..250_000).map(|i| format!("line {i:010}\n")).collect();
    let got = String::from_utf8(series(&layout.out_base())).unwrap();
    assert_eq!(got.len(), want.len() - 1024 * 1024);
    assert!(
        want.ends_with(&got),
        "the newest files hold the end of the stream"
    );
    assert_eq!(
        std::fs::read_to_string(file_name(&layout.err_base(), 0)).unwrap(),
        "before the restart\nagain\n"
    );
}

/// The relay ends with its streams: one ended, it keeps relaying the other; both
/// ended, it exits 0.
#[test]
fn eof_of_both_streams_makes_it_exit_0() {
    adopt_orphans();
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    let relay = layout.spawn(LogConfig::new(2, 1)).unwrap();
    let mut err = std::fs::OpenOptions::new()
        .write(true)
        .open(&layout.err_fifo)
        .unwrap();
    std::fs::write(&layout.out_fifo, "out only\n").unwrap();
    until("stdout's line", || {
        series(&layout.out_base()) == b"out only\n"
    });
    err.write_all(b"still relayed\n").unwrap();
    until("stderr's line", || {
        series(&layout.err_base()) == b"still relayed\n"
    });
    assert!(relay.is_running());
    drop(err);
    assert_eq!(exit_code(&relay), 0);
    assert!(!relay.is_running());
}

/// SIGTERM while a writer still holds the FIFO: what was written is drained into the
/// files, and the relay exits 0.
#[test]
fn sigterm_drains_and_exits() {
    adopt_orphans();
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    let relay = layout.spawn(LogConfig::new(2, 1)).unwrap();
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .open(&layout.out_fifo)
        .unwrap();
    // Less than a pipe holds, so the write returns before the relay reads any of it.
    let text: String = (0..2000).map(|i| format!("{i}\n")).collect();
    out.write_all(text.as_bytes()).unwrap();
    relay.stop().unwrap();
    assert_eq!(exit_code(&relay), 0);
    assert_eq!(String::from_utf8(series(&layout.out_base())).unwrap(), text);
    // A stopped relay: stopping again sends nothing and is no error.
    relay.stop().unwrap();
    drop(out);
}

/// A link planted where a FIFO or the log directory should be is refused (the relay
/// says why, and `spawn_relay` returns that), never followed.
#[test]
fn planted_links_are_refused() {
    adopt_orphans();
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    // A FIFO elsewhere, linked in place of the stdout FIFO.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .unwrap();
    rfs::mkfifoat(rfs::CWD, elsewhere.join("f"), Mode::from_raw_mode(0o600)).unwrap();
    std::fs::remove_file(&layout.out_fifo).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("f"), &layout.out_fifo).unwrap();
    let e = layout.spawn(LogConfig::new(2, 1)).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(e.to_string().contains("task-1.0.stdout"), "{e}");

    // The log directory replaced by a link to another directory.
    let tmp2 = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp2);
    let other = tmp.path().join("other-logs");
    std::fs::create_dir(&other).unwrap();
    std::fs::remove_dir(layout.root.join("logs")).unwrap();
    std::os::unix::fs::symlink(&other, layout.root.join("logs")).unwrap();
    let e = layout.spawn(LogConfig::new(2, 1)).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(
        std::fs::read_dir(&other).unwrap().next().is_none(),
        "nothing written through it"
    );
}

/// A relay that cannot start says why, and `spawn_relay` returns it.
#[test]
fn readiness_errors_are_reported() {
    adopt_orphans();
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp);
    std::fs::remove_dir(layout.root.join("logs")).unwrap();
    let e = layout.spawn(LogConfig::new(2, 1)).unwrap_err();
    assert!(e.to_string().contains("logs/task.stdout"), "{e}");
    assert!(e.to_string().contains("No such file"), "{e}");

    // The FIFO directory made writable by others after the FIFOs were made.
    let tmp2 = tempfile::tempdir().unwrap();
    let layout = Layout::new(&tmp2);
    rfs::chmod(layout.root.join("fifos"), Mode::from_raw_mode(0o733)).unwrap();
    let e = layout.spawn(LogConfig::new(2, 1)).unwrap_err();
    assert!(e.to_string().contains("group or others can write"), "{e}");

    // A program that is no relay.
    let e = spawn_relay(
        Path::new("/bin/true"),
        &[],
        &layout.spec(LogConfig::new(2, 1)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("run_if_relay"), "{e}");

    // A spec the relay would refuse is refused before anything starts.
    let mut spec = layout.spec(LogConfig::new(2, 1));
    spec.stderr_fifo = "relative.stderr".into();
    let e = spawn_relay(&self_exe(), &relay_args(), &spec).unwrap_err();
    assert!(e.to_string().contains("stderr_fifo"), "{e}");
}

/// A pid that now belongs to another process (another start time) is never signalled:
/// the target blocks SIGTERM, so a signal sent would stay visible as pending.
#[test]
fn a_reused_pid_is_never_signalled() {
    let mut other = Command::new("sleep");
    other.arg("60");
    // SAFETY: sigprocmask is async-signal-safe; the mask is kept across exec.
    #[allow(unsafe_code)]
    unsafe {
        other.pre_exec(|| {
            let mut set = nix::sys::signal::SigSet::empty();
            set.add(nix::sys::signal::Signal::SIGTERM);
            set.thread_block().map_err(io::Error::from)
        });
    }
    let mut other = other.spawn().unwrap();
    let pid = other.id();
    let (_, start) = proc_stat(pid).unwrap();
    let pending = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("ShdPnd:"))
            .unwrap()
            .to_owned();
        u64::from_str_radix(line.trim_start_matches("ShdPnd:").trim(), 16).unwrap()
    };
    let term_bit = 1 << (15 - 1);
    let stale = RelayProcess {
        pid,
        start_time: start + 1,
    };
    assert!(!stale.is_running());
    stale.stop().unwrap();
    assert_eq!(
        pending() & term_bit,
        0,
        "signalled a process that is not the relay"
    );
    assert!(
        stale.wait_exit(Duration::ZERO).unwrap(),
        "not the relay: it has exited"
    );
    // The same check with the right start time does signal: the test can see it.
    let real = RelayProcess {
        pid,
        start_time: start,
    };
    assert!(real.is_running());
    real.stop().unwrap();
    assert_ne!(pending() & term_bit, 0);
    let e = RelayProcess { pid, start_time: 0 }.stop().unwrap_err();
    assert!(e.to_string().contains("no start time"), "{e}");
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn the_relay_refuses_a_bad_spec() {
    assert_eq!(relay_main(b"not json"), 2);
    assert_eq!(
        relay_main(br#"{"ready_fd":1,"spec":{"stdout_fifo":"/a","stdout_base":"/b","stderr_fifo":"/c","stderr_base":"/d","limits":{}}}"#),
        2,
        "stdout is not the readiness pipe"
    );
    assert_eq!(relay_main(br#"{"ready_fd":9999,"spec":{},"x":1}"#), 2);
    assert_eq!(
        parse_stat("1 (a) b)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 1"),
        Some(('S', 777))
    );
    assert_eq!(parse_stat("1 (a) S 1"), None);
}
