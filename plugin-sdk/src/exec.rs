//! The plumbing of an interactive exec ([`crate::DriverPlugin::exec_task_streaming`])
//! for a driver whose command is a local process: a pseudo-terminal ([`Pty`]) and
//! the relay between the process and the [`ExecSession`] ([`relay_pty`],
//! [`relay_pipes`]).
//!
//! The relay ends when the command has exited and its output is read; if the caller
//! goes away first (its input channel closes), the command's process group is
//! killed: an exec lives no longer than its caller.
//!
//! ```no_run
//! # async fn f(session: drover_plugin_sdk::ExecSession) -> Result<(), drover_plugin_sdk::DriverError> {
//! use drover_plugin_sdk::DriverError;
//! use drover_plugin_sdk::exec::{Pty, relay_pty};
//! let pty = Pty::open(session.size).map_err(DriverError::internal)?;
//! let mut cmd = tokio::process::Command::new("/bin/sh");
//! // Stdio on the terminal, a session of its own.
//! pty.attach(cmd.as_std_mut()).map_err(DriverError::internal)?;
//! let child = cmd.spawn().map_err(DriverError::internal)?;
//! let result = relay_pty(pty, child, session).await?;
//! println!("exit code {}", result.exit_code);
//! # Ok(()) }
//! ```

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Child;

use crate::DriverError;
use crate::types::{ExecChunk, ExecInput, ExecSession, ExitResult, TerminalSize};

/// How long output is still read after the command exited: a process it left in the
/// background may hold the terminal or a pipe open forever.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// The most read from the command at once.
const CHUNK: usize = 32 * 1024;

/// A pseudo-terminal: the driver keeps the master, the command gets the slave as its
/// stdin, stdout, stderr and controlling terminal.
#[derive(Debug)]
pub struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
}

impl Pty {
    /// A new pseudo-terminal of `size` (the kernel's default, 0x0, if `None`).
    pub fn open(size: Option<TerminalSize>) -> io::Result<Pty> {
        use rustix::pty::OpenptFlags;
        let master =
            rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let slave = rustix::fs::open(
            name.as_c_str(),
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let pty = Pty { master, slave };
        if let Some(size) = size {
            pty.resize(size)?;
        }
        Ok(pty)
    }

    /// Set the terminal's size (the command gets `SIGWINCH`).
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        set_size(&self.master, size)
    }

    /// The master end as a file (for a caller that drives the terminal itself, as a
    /// user's keyboard and screen would: a test).
    pub fn master_file(&self) -> io::Result<std::fs::File> {
        Ok(std::fs::File::from(self.master.try_clone()?))
    }

    /// The slave end, for a command started another way (a helper that makes it its
    /// controlling terminal itself).
    pub fn slave(&self) -> io::Result<OwnedFd> {
        self.slave.try_clone()
    }

    /// Make `cmd` run on this terminal: the slave as stdin, stdout and stderr, in a
    /// new session whose controlling terminal it is (so that Ctrl-C reaches the
    /// command's foreground job, and its exit hangs up its children).
    pub fn attach(&self, cmd: &mut std::process::Command) -> io::Result<()> {
        cmd.stdin(self.slave.try_clone()?)
            .stdout(self.slave.try_clone()?)
            .stderr(self.slave.try_clone()?);
        // SAFETY: setsid and ioctl are async-signal-safe system calls; nothing is
        // allocated between fork and exec.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::setsid()?;
                // SAFETY: fd 0 is the slave, set up by `Command` before this runs.
                rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
                Ok(())
            });
        }
        Ok(())
    }
}

fn set_size(fd: impl AsFd, size: TerminalSize) -> io::Result<()> {
    rustix::termios::tcsetwinsize(
        fd,
        rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// How `status` ended, as an [`ExitResult`].
pub fn exit_result(status: std::process::ExitStatus) -> ExitResult {
    let mut r = ExitResult::default();
    match (status.code(), status.signal()) {
        (Some(code), _) => r.exit_code = code,
        (None, Some(sig)) => {
            r.signal = sig;
            r.exit_code = 128 + sig;
        }
        (None, None) => r.exit_code = -1,
    }
    r
}

/// At most this much of the caller's input waits for a command that does not read
/// it; beyond, the caller's input is not taken (back-pressure) until it does.
const MAX_PENDING_INPUT: usize = 256 * 1024;

/// Kill process group `pgid` (a child that leads one: [`Pty::attach`] or
/// `process_group(0)`), by the id saved at its start: `Child::id` is gone once it
/// was waited for.
fn kill_group(pgid: Option<u32>) {
    if let Some(pid) = pgid.and_then(|p| i32::try_from(p).ok())
        && let Some(pid) = rustix::process::Pid::from_raw(pid)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// How a relay ends: the command's process group killed (what it left behind goes
/// with it), and its exit result, or the relay's error once the command is reaped.
async fn finish(
    pgid: Option<u32>,
    mut child: Child,
    status: Option<std::process::ExitStatus>,
    result: Result<(), DriverError>,
) -> Result<ExitResult, DriverError> {
    kill_group(pgid);
    match result {
        Ok(()) => Ok(status.map(exit_result).unwrap_or_default()),
        Err(e) => {
            let _ = child.wait().await;
            Err(e)
        }
    }
}

fn caller_gone() -> DriverError {
    DriverError::Unavailable("the exec's caller went away".into())
}

/// The caller's input not yet written to the command.
#[derive(Default)]
struct Pending {
    bytes: std::collections::VecDeque<u8>,
    /// Close the command's stdin once `bytes` are written.
    close: bool,
}

impl Pending {
    fn has_room(&self) -> bool {
        self.bytes.len() < MAX_PENDING_INPUT && !self.close
    }
}

/// Relay `session` to `child`, which runs on `pty` ([`Pty::attach`]), until it has
/// exited and what it wrote is sent. The caller going away kills it (and its process
/// group). Input the command does not read waits (bounded) without holding up its
/// output.
pub async fn relay_pty(
    pty: Pty,
    mut child: Child,
    mut session: ExecSession,
) -> Result<ExitResult, DriverError> {
    let pgid = child.id();
    let Pty { master, slave } = pty;
    // Only the command holds the slave now: reading the master ends (EIO) once the
    // command and everything it started have closed it.
    drop(slave);
    set_nonblocking(&master).map_err(io_error)?;
    // SAFETY: the descriptor is owned by the AsyncFd, open and unchanged until it is
    // dropped.
    #[allow(unsafe_code)]
    let master = unsafe { AsyncFd::register(master) }.map_err(DriverError::internal)?;
    let mut buf = vec![0u8; CHUNK];
    let mut status = None;
    let mut eof = false;
    let mut input_open = true;
    let mut pending = Pending::default();
    let mut drain_until = None;
    let output = session.output.clone();
    let result = loop {
        if eof && status.is_some() {
            break Ok(());
        }
        let drain = async {
            match drain_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = master.readable(), if !eof => {
                let mut guard = r.map_err(io_error)?;
                match guard.try_io(|fd| read_fd(fd.get_ref(), &mut buf)) {
                    Ok(Ok(0)) | Ok(Err(_)) => eof = true,
                    Ok(Ok(n)) => {
                        if session.output.send(ExecChunk::Stdout(buf[..n].to_vec())).await.is_err() {
                            break Err(caller_gone());
                        }
                    }
                    Err(_would_block) => {}
                }
            }
            w = master.writable(), if !pending.bytes.is_empty() => {
                let mut guard = w.map_err(io_error)?;
                let (front, _) = pending.bytes.as_slices();
                match guard.try_io(|f| rustix::io::write(f.get_ref(), front).map_err(io::Error::from)) {
                    Ok(Ok(n)) => { pending.bytes.drain(..n); }
                    // The command closed its terminal: what it does not read is dropped.
                    Ok(Err(_)) => pending.bytes.clear(),
                    Err(_would_block) => {}
                }
                if pending.bytes.is_empty() && pending.close {
                    // The terminal's end-of-file character, as a terminal would send it.
                    pending.bytes.push_back(0x04);
                    pending.close = false;
                }
            }
            input = session.input.recv(), if input_open && pending.has_room() => match input {
                Some(ExecInput::Stdin(data)) => pending.bytes.extend(data),
                Some(ExecInput::Resize(size)) => set_size(master.get_ref(), size).map_err(io_error)?,
                Some(ExecInput::StdinClosed) => {
                    if pending.bytes.is_empty() {
                        pending.bytes.push_back(0x04);
                    } else {
                        pending.close = true;
                    }
                    input_open = false;
                }
                None => break Err(caller_gone()),
            },
            () = output.closed() => break Err(caller_gone()),
            s = child.wait(), if status.is_none() => {
                status = Some(s.map_err(io_error)?);
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            () = drain => break Ok(()),
        }
    };
    // Whatever way it ends, nothing the command started on the terminal stays.
    finish(pgid, child, status, result).await
}

/// Relay `session` to `child`, whose stdin, stdout and stderr are pipes
/// (`Stdio::piped()`) and which leads its process group, until it has exited and
/// what it wrote is sent. The caller going away kills its process group. Input the
/// command does not read waits (bounded) without holding up its output.
pub async fn relay_pipes(
    mut child: Child,
    mut session: ExecSession,
) -> Result<ExitResult, DriverError> {
    let pgid = child.id();
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    let mut status = None;
    let mut input_open = true;
    let mut pending = Pending::default();
    let mut drain_until = None;
    let output = session.output.clone();
    let result = loop {
        if stdout.is_none() && stderr.is_none() && status.is_some() {
            break Ok(());
        }
        if pending.bytes.is_empty() && pending.close {
            // Everything given was written: the command's stdin ends.
            stdin = None;
            pending.close = false;
        }
        let drain = async {
            match drain_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let read_out = async {
            match stdout.as_mut() {
                Some(s) => s.read(&mut out_buf).await,
                None => std::future::pending().await,
            }
        };
        let read_err = async {
            match stderr.as_mut() {
                Some(s) => s.read(&mut err_buf).await,
                None => std::future::pending().await,
            }
        };
        // A piece of what waits (the write may take part of it).
        let (front, _) = pending.bytes.as_slices();
        let front = front[..front.len().min(CHUNK)].to_vec();
        let write_in = async {
            match stdin.as_mut() {
                Some(s) if !front.is_empty() => s.write(&front).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            r = read_out => match r {
                Ok(0) | Err(_) => stdout = None,
                Ok(n) => if session.output.send(ExecChunk::Stdout(out_buf[..n].to_vec())).await.is_err() {
                    break Err(caller_gone());
                },
            },
            r = read_err => match r {
                Ok(0) | Err(_) => stderr = None,
                Ok(n) => if session.output.send(ExecChunk::Stderr(err_buf[..n].to_vec())).await.is_err() {
                    break Err(caller_gone());
                },
            },
            w = write_in => match w {
                Ok(n) => { pending.bytes.drain(..n); }
                // The command closed its stdin: what it does not read is dropped.
                Err(_) => { pending.bytes.clear(); stdin = None; }
            },
            input = session.input.recv(), if input_open && pending.has_room() => match input {
                Some(ExecInput::Stdin(data)) => if stdin.is_some() { pending.bytes.extend(data) },
                Some(ExecInput::StdinClosed) => { pending.close = true; input_open = false; }
                Some(_) => {}
                None => break Err(caller_gone()),
            },
            () = output.closed() => break Err(caller_gone()),
            s = child.wait(), if status.is_none() => {
                status = Some(s.map_err(io_error)?);
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            () = drain => break Ok(()),
        }
    };
    finish(pgid, child, status, result).await
}

fn io_error(e: io::Error) -> DriverError {
    DriverError::internal(format_args!("exec: {e}"))
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

fn read_fd(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    match rustix::io::read(fd, buf) {
        Ok(n) => Ok(n),
        // The slave has no process left: the terminal's end-of-file.
        Err(rustix::io::Errno::IO) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(mut out: tokio::sync::mpsc::Receiver<ExecChunk>) -> (Vec<u8>, Vec<u8>) {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        while let Some(c) = out.recv().await {
            match c {
                ExecChunk::Stdout(d) => o.extend(d),
                ExecChunk::Stderr(d) => e.extend(d),
            }
        }
        (o, e)
    }

    #[tokio::test]
    async fn a_shell_on_a_terminal_reads_input_sees_its_size_and_gives_its_exit_code() {
        let (mut session, input, output) = ExecSession::channel(vec!["/bin/sh".into()], true, 16);
        session.size = Some(TerminalSize { rows: 24, cols: 80 });
        let pty = Pty::open(session.size).unwrap();
        let mut cmd = tokio::process::Command::new("/bin/sh");
        pty.attach(cmd.as_std_mut()).unwrap();
        let child = cmd.spawn().unwrap();
        let relay = tokio::spawn(relay_pty(pty, child, session));
        let reader = tokio::spawn(collect(output));
        input
            .send(ExecInput::Resize(TerminalSize {
                rows: 33,
                cols: 101,
            }))
            .await
            .unwrap();
        input
            .send(ExecInput::Stdin(
                b"[ -t 0 ] && echo tty-yes; stty size; exit 3\n".to_vec(),
            ))
            .await
            .unwrap();
        let result = tokio::time::timeout(Duration::from_secs(20), relay)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(result.exit_code, 3);
        drop(input);
        let (out, _) = reader.await.unwrap();
        let out = String::from_utf8_lossy(&out);
        assert!(out.contains("tty-yes"), "{out}");
        assert!(out.contains("33 101"), "{out}");
    }

    #[tokio::test]
    async fn pipes_keep_stdout_and_stderr_apart_and_stdin_ends() {
        let (session, input, output) = ExecSession::channel(vec!["/bin/sh".into()], false, 16);
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "cat; echo err >&2; exit 7"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let child = cmd.spawn().unwrap();
        let relay = tokio::spawn(relay_pipes(child, session));
        let reader = tokio::spawn(collect(output));
        input
            .send(ExecInput::Stdin(b"hello\n".to_vec()))
            .await
            .unwrap();
        input.send(ExecInput::StdinClosed).await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(20), relay)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(result.exit_code, 7);
        drop(input);
        assert_eq!(
            reader.await.unwrap(),
            (b"hello\n".to_vec(), b"err\n".to_vec())
        );
    }

    #[tokio::test]
    async fn a_big_paste_to_a_command_that_echoes_it_neither_deadlocks_nor_is_lost() {
        let (session, input, output) = ExecSession::channel(vec!["/bin/cat".into()], false, 16);
        let mut cmd = tokio::process::Command::new("/bin/cat");
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let child = cmd.spawn().unwrap();
        let relay = tokio::spawn(relay_pipes(child, session));
        let reader = tokio::spawn(collect(output));
        let big: Vec<u8> = (0..5 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        for piece in big.chunks(64 * 1024) {
            input.send(ExecInput::Stdin(piece.to_vec())).await.unwrap();
        }
        input.send(ExecInput::StdinClosed).await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(30), relay)
            .await
            .expect("the relay deadlocked")
            .unwrap()
            .unwrap();
        assert_eq!(result.exit_code, 0);
        drop(input);
        let (out, _) = reader.await.unwrap();
        assert!(out == big, "{} bytes back of {}", out.len(), big.len());
    }

    #[tokio::test]
    async fn what_the_command_left_running_in_its_group_dies_when_it_exits() {
        let (session, input, output) = ExecSession::channel(vec!["/bin/sh".into()], false, 16);
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "sleep 1000 & echo $!"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let child = cmd.spawn().unwrap();
        let relay = tokio::spawn(relay_pipes(child, session));
        let reader = tokio::spawn(collect(output));
        let r = tokio::time::timeout(Duration::from_secs(20), relay)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.exit_code, 0);
        drop(input);
        let (out, _) = reader.await.unwrap();
        let pid: u32 = String::from_utf8_lossy(&out).trim().parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Gone, or a zombie of ours not yet reaped (init reaps it).
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the background sleep {pid} outlived the exec"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_kills_the_command() {
        let (session, input, output) = ExecSession::channel(vec!["/bin/sh".into()], false, 16);
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "echo started; exec sleep 1000"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let child = cmd.spawn().unwrap();
        let pid = child.id().unwrap();
        let relay = tokio::spawn(relay_pipes(child, session));
        let mut output = output;
        assert_eq!(
            output.recv().await,
            Some(ExecChunk::Stdout(b"started\n".to_vec()))
        );
        drop(input);
        let r = tokio::time::timeout(Duration::from_secs(20), relay)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_err());
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the command outlived its caller"
        );
    }
}
