//! The files in an executor directory: durable writes, `exit.json`, the lock.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use crate::DriverError;

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
/// assert!(drover_plugin_sdk::executor::read_exit_file(dir.path()).unwrap().is_none());
/// std::fs::write(dir.path().join("exit.json"), "{").unwrap();
/// let err = drover_plugin_sdk::executor::read_exit_file(dir.path()).unwrap_err();
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

/// Whether a live executor holds the lock of `dir`. A process's `flock` is released
/// by the kernel when it dies, so this is true exactly while the executor lives (pid
/// reuse cannot fool it).
pub(crate) fn lock_held(dir: &Path) -> bool {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .open(dir.join(LOCK_FILE))
    else {
        return false;
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared) {
        // Got it: nobody holds it exclusively. Closing `f` releases it.
        Ok(()) => false,
        Err(e) => e == rustix::io::Errno::WOULDBLOCK,
    }
}

/// Take the executor lock of `dir` for the life of the returned file.
pub(crate) fn take_lock(dir: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(LOCK_FILE))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(f)
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
    use crate::ExitResult;
    use crate::executor::ExitInfo;
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
        assert!(!lock_held(dir.path()));
        let held = take_lock(dir.path()).unwrap();
        assert!(lock_held(dir.path()));
        assert!(take_lock(dir.path()).is_err());
        drop(held);
        assert!(!lock_held(dir.path()));
    }
}
