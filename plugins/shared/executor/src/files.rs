//! The files in an executor directory: durable writes, `exit.json`, the lock.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use drover_plugin_sdk::DriverError;

use super::proto::ExitFile;
use super::{EXIT_FILE, ExecutorStatus, LOCK_FILE, LOG_FILE, PROTOCOL_VERSION};

/// Write `bytes` to `dir/name` so that after a crash the file is either absent or
/// complete: a temp file, fsync, rename over the name, fsync the directory.
pub(crate) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// Record the final status in `exit.json`.
pub(crate) fn write_exit_file(dir: &Path, status: &ExecutorStatus) -> io::Result<()> {
    let file = ExitFile {
        v: PROTOCOL_VERSION,
        status: status.clone(),
    };
    let bytes = serde_json::to_vec(&file).map_err(io::Error::other)?;
    write_durably(dir, EXIT_FILE, &bytes)
}

/// The final status recorded in `dir/exit.json`, or `None` when the task has not
/// exited (or its executor died before recording it). A file that exists but cannot be
/// read or parsed is an error naming it.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// assert!(drover_executor::read_exit_file(dir.path()).unwrap().is_none());
/// std::fs::write(dir.path().join("exit.json"), "{").unwrap();
/// let err = drover_executor::read_exit_file(dir.path()).unwrap_err();
/// assert!(err.to_string().contains("exit.json"));
/// ```
pub fn read_exit_file(dir: &Path) -> Result<Option<ExecutorStatus>, DriverError> {
    let path = dir.join(EXIT_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(DriverError::Internal(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    };
    let file: ExitFile = serde_json::from_slice(&bytes).map_err(|e| {
        DriverError::Internal(format!(
            "{} is not a valid exit record: {e}",
            path.display()
        ))
    })?;
    if file.v > PROTOCOL_VERSION {
        return Err(DriverError::Internal(format!(
            "{} has version {}, newer than this plugin's {PROTOCOL_VERSION}",
            path.display(),
            file.v
        )));
    }
    if file.status.exit.is_none() {
        return Err(DriverError::Internal(format!(
            "{} records no exit",
            path.display()
        )));
    }
    Ok(Some(file.status))
}

/// What the lock of an executor directory says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockState {
    /// Nobody holds it: no executor lives for this directory.
    Free,
    /// Held, but the executor has not finished starting (no pid written yet).
    Starting,
    /// Held by the executor with this pid, which has started its task and bound its
    /// socket.
    Ready(u32),
}

impl LockState {
    pub(crate) fn held(self) -> bool {
        self != LockState::Free
    }
}

/// The state of the lock of `dir`. The plugin takes the lock before it starts the
/// executor and hands it over as the executor's stdin, so the lock is held without a
/// gap from before the executor exists until it dies; the kernel releases a `flock`
/// when its last holder dies, so pid reuse cannot fool this. Once ready, the executor
/// writes its pid into the file.
pub(crate) fn lock_state(dir: &Path) -> LockState {
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .open(dir.join(LOCK_FILE))
    else {
        return LockState::Free;
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared) {
        // Got it: nobody holds it exclusively. Closing `f` releases it.
        Ok(()) => LockState::Free,
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            let mut text = String::new();
            let _ = f.read_to_string(&mut text);
            // The executor's pid is the first line (and was the whole file before the
            // task's proof was added; see `mark_ready`).
            text.lines()
                .next()
                .and_then(|first| first.trim().parse().ok())
                .map_or(LockState::Starting, LockState::Ready)
        }
        // Cannot tell; assume the safe answer: somebody may own it.
        Err(_) => LockState::Starting,
    }
}

/// Create the lock file of a fresh executor directory and take the lock, for the
/// plugin to hand over to the executor it starts.
pub(crate) fn create_lock(dir: &Path) -> io::Result<File> {
    // Locked under a temporary name, then renamed into place: whoever opens `lock`
    // finds it held, never a window in which a probe could take it first.
    let tmp = dir.join(format!(".{LOCK_FILE}.tmp"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    std::fs::rename(&tmp, dir.join(LOCK_FILE))?;
    Ok(f)
}

/// In the executor: the lock of `dir`, inherited as stdin from the plugin that
/// started it (checked to be that very file). Without one (an executor started some
/// other way), take it now.
pub(crate) fn inherit_lock(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::MetadataExt as _;
    let path = dir.join(LOCK_FILE);
    let stdin = rustix::stdio::stdin();
    let inherited = match (rustix::fs::fstat(stdin), std::fs::metadata(&path)) {
        (Ok(st), Ok(meta)) => st.st_dev == meta.dev() && st.st_ino == meta.ino(),
        _ => false,
    };
    let f = if inherited {
        // A close-on-exec copy: the task must not inherit the lock.
        File::from(rustix::io::fcntl_dupfd_cloexec(stdin, 3)?)
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)?
    };
    // A no-op on the inherited description, which holds it already.
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(f)
}

/// Mark the executor ready: its pid in the lock file, then the pid and start time of
/// the task it started. The task's are what proves, once the executor is dead, which
/// process was its task (see [`crate::lost`]) before anyone heard of the task: an
/// executor killed between its task's start and its start-up reply leaves them only
/// here. No fsync: they matter while the machine is up (a reboot ends the task too).
pub(crate) fn mark_ready(lock: &mut File, pid: u32, task: TaskProof) -> io::Result<()> {
    use std::io::{Seek as _, SeekFrom};
    lock.set_len(0)?;
    lock.seek(SeekFrom::Start(0))?;
    // One write: a reader never sees the pid without the proof behind it.
    lock.write_all(format!("{pid}\n{} {}\n", task.pid, task.start_time).as_bytes())
}

/// The main process of a task as its executor recorded it in the lock file: enough to
/// prove it is that process ([`crate::lost::prove`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskProof {
    pub(crate) pid: u32,
    pub(crate) start_time: u64,
}

/// The task proof in `dir`'s lock file, if its executor got as far as writing one
/// (executors before the proof was added wrote only their own pid).
pub(crate) fn read_task_proof(dir: &Path) -> Option<TaskProof> {
    let text = std::fs::read_to_string(dir.join(LOCK_FILE)).ok()?;
    let mut fields = text.lines().nth(1)?.split_ascii_whitespace();
    let pid = fields.next()?.parse().ok()?;
    let start_time = fields.next()?.parse().ok()?;
    (fields.next().is_none() && pid != 0 && start_time != 0)
        .then_some(TaskProof { pid, start_time })
}

/// Note a problem in `dir/executor.log`. The executor has no stderr after start-up;
/// this is where an operator finds out why, say, a task's logs stopped.
pub(crate) fn note(dir: &Path, message: &str) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(dir.join(LOG_FILE))
    {
        let _ = writeln!(f, "{secs} {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExitInfo;
    use drover_plugin_sdk::ExitResult;
    use std::time::SystemTime;

    fn status() -> ExecutorStatus {
        ExecutorStatus {
            task_id: "t".into(),
            pid: 10,
            pgid: 10,
            start_time: 5,
            started_at: SystemTime::UNIX_EPOCH,
            executor_pid: 9,
            exit: Some(ExitInfo {
                result: ExitResult::code(7),
                exited_at: SystemTime::UNIX_EPOCH,
                killed_after_timeout: false,
            }),
        }
    }

    #[test]
    fn exit_file_round_trip_and_no_temp_left() {
        let dir = tempfile::tempdir().unwrap();
        write_exit_file(dir.path(), &status()).unwrap();
        assert_eq!(read_exit_file(dir.path()).unwrap(), Some(status()));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [EXIT_FILE]);
    }

    #[test]
    fn exit_file_without_exit_or_from_the_future_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = status();
        s.exit = None;
        write_exit_file(dir.path(), &s).unwrap();
        assert!(read_exit_file(dir.path()).is_err());
        let text = serde_json::to_string(&ExitFile {
            v: PROTOCOL_VERSION + 1,
            status: status(),
        })
        .unwrap();
        std::fs::write(dir.path().join(EXIT_FILE), text).unwrap();
        let err = read_exit_file(dir.path()).unwrap_err().to_string();
        assert!(err.contains("newer"), "{err}");
    }

    #[test]
    fn lock_is_seen_while_held_and_released_on_close() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(lock_state(dir.path()), LockState::Free);
        let mut held = create_lock(dir.path()).unwrap();
        assert_eq!(lock_state(dir.path()), LockState::Starting);
        assert!(inherit_lock(dir.path()).is_err(), "a second owner");
        assert_eq!(read_task_proof(dir.path()), None);
        let proof = TaskProof {
            pid: 77,
            start_time: 123_456,
        };
        mark_ready(&mut held, 4242, proof).unwrap();
        assert_eq!(lock_state(dir.path()), LockState::Ready(4242));
        assert_eq!(read_task_proof(dir.path()), Some(proof));
        drop(held);
        // The lock belongs to the open file description: a child another test of this
        // binary forks at that moment shares it until its exec closes it (the fd is
        // close-on-exec), so "free" may take a moment, never long.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while lock_state(dir.path()) != LockState::Free {
            assert!(
                std::time::Instant::now() < deadline,
                "the lock is still held 5 s after its owner closed it: {:?}",
                lock_state(dir.path())
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_lock_file_of_an_older_executor_gives_its_pid_and_no_proof() {
        let dir = tempfile::tempdir().unwrap();
        let _held = create_lock(dir.path()).unwrap();
        // What executors wrote before the task's proof was added.
        std::fs::write(dir.path().join(LOCK_FILE), "4242\n").unwrap();
        assert_eq!(lock_state(dir.path()), LockState::Ready(4242));
        assert_eq!(read_task_proof(dir.path()), None);
        for bad in ["4242\n0 5\n", "4242\n7\n", "4242\n7 x\n", "4242\n7 8 9\n"] {
            std::fs::write(dir.path().join(LOCK_FILE), bad).unwrap();
            assert_eq!(read_task_proof(dir.path()), None, "{bad:?}");
        }
    }
}
