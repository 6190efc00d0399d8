//! Nomad's client endpoints for allocations, as a node's agent answers them:
//!
//! - `GET /v1/client/fs/logs/:alloc?task=T&type=stdout|stderr&follow=&origin=&offset=&plain=`:
//!   a task's log as a stream of [`StreamFrame`]s (JSON objects one after the other,
//!   no separator, as Nomad writes them), or its raw bytes with `plain=true`;
//! - `GET /v1/client/allocation/:id/stats`: [`AllocResourceUsage`];
//! - `GET /v1/client/fs/{ls,stat}/:alloc?path=P`: [`AllocFileInfo`]s of the allocation's
//!   directory (`alloc/`, and one directory per task by task name);
//! - `GET /v1/client/fs/{cat,readat,stream}/:alloc?path=P`: a file's bytes, whole, from an
//!   offset (`offset=&limit=`), or as [`StreamFrame`]s that follow it as it grows.
//!
//! The shapes are Nomad 1.0's (`api.StreamFrame`, `api.AllocResourceUsage`), so that
//! Nomad's clients (its CLI, python-nomad) read them unchanged. Two Drover additions
//! ride on frames, as fields Nomad's clients ignore: [`StreamFrame::skipped`] (log
//! files rotation deleted before they were read) and [`StreamFrame::error`] (why the
//! stream ends early). The error frame is followed by the error's text, as Nomad ends
//! a stream that failed: a Nomad client, which knows no error frame, fails to decode
//! the text and reports an error rather than a complete stream.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// [`StreamFrame::file_event`] of a frame that says files were skipped (Drover's).
pub const FILE_EVENT_SKIPPED: &str = "files skipped";
/// [`StreamFrame::file_event`] of a frame that carries an error (Drover's).
pub const FILE_EVENT_ERROR: &str = "error";
/// Nomad's largest frame payload.
pub const MAX_FRAME_DATA: usize = 64 * 1024;

/// One frame of a log stream (Nomad's `StreamFrame`). `{}` is a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StreamFrame {
    // In the order Nomad writes them (by name).
    /// Bytes of the file, base64 in JSON.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    pub data: Vec<u8>,
    /// With [`FILE_EVENT_ERROR`]: why the stream ends here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The file, as Nomad names it: `alloc/logs/<task>.<stdout|stderr>.<index>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// `file deleted`, `file truncated` (Nomad's), [`FILE_EVENT_SKIPPED`] or
    /// [`FILE_EVENT_ERROR`] (Drover's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file_event: String,
    /// The file offset just after [`StreamFrame::data`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: i64,
    /// With [`FILE_EVENT_SKIPPED`]: how many files rotation deleted before they were
    /// read; the data that follows starts at the beginning of [`StreamFrame::file`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<u64>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl StreamFrame {
    /// A heartbeat carries nothing (Nomad's `IsHeartbeat`).
    pub fn is_heartbeat(&self) -> bool {
        *self == StreamFrame::default()
    }

    /// Nomad's name of log file `index` of `task`'s `stream` (`stdout` or `stderr`).
    pub fn log_file_name(task: &str, stream: &str, index: u64) -> String {
        format!("alloc/logs/{task}.{stream}.{index}")
    }
}

/// A file of an allocation's directory (Nomad's `AllocFileInfo`), as `fs ls` and
/// `fs stat` describe it: a link is described as a link, never followed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocFileInfo {
    /// The entry's name (the last component of its path).
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Size in bytes.
    pub size: i64,
    /// Type and permission bits as Go's `os.FileMode` prints them (`-rw-r--r--`,
    /// `drwxr-xr-x`, `Lrwxrwxrwx` for a link), as Nomad's clients show them.
    pub file_mode: String,
    /// Last modification, RFC 3339 (UTC).
    pub mod_time: String,
    /// `text/plain; charset=utf-8` and the like, for a regular file whose first bytes
    /// were looked at (`fs stat`); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content_type: String,
}

/// What kind of file an [`AllocFileInfo`] is, for [`go_file_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else.
    Other,
}

/// `mode` (permission bits with setuid, setgid and sticky: `0o7777` of `st_mode`) of a
/// file of type `kind`, as Go's `os.FileMode.String()` prints it: Nomad's `FileMode`.
///
/// ```
/// use drover_server_api::client_fs::{FileType, go_file_mode};
/// assert_eq!(go_file_mode(FileType::File, 0o644), "-rw-r--r--");
/// assert_eq!(go_file_mode(FileType::Dir, 0o1777), "dtrwxrwxrwx");
/// assert_eq!(go_file_mode(FileType::Symlink, 0o777), "Lrwxrwxrwx");
/// assert_eq!(go_file_mode(FileType::CharDevice, 0o666), "Dcrw-rw-rw-");
/// assert_eq!(go_file_mode(FileType::File, 0o4755), "urwxr-xr-x");
/// ```
pub fn go_file_mode(kind: FileType, mode: u32) -> String {
    let mut out = String::with_capacity(12);
    // Go's order of type letters: d a l T L D p S u g c t ?
    match kind {
        FileType::Dir => out.push('d'),
        FileType::Symlink => out.push('L'),
        FileType::BlockDevice => out.push('D'),
        FileType::CharDevice => out.push_str("Dc"),
        FileType::Fifo => out.push('p'),
        FileType::Socket => out.push('S'),
        FileType::File | FileType::Other => {}
    }
    if mode & 0o4000 != 0 {
        out.push('u');
    }
    if mode & 0o2000 != 0 {
        out.push('g');
    }
    if mode & 0o1000 != 0 {
        out.push('t');
    }
    if kind == FileType::Other {
        out.push('?');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (bit, letter) in [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ] {
        out.push(if mode & bit != 0 { letter } else { '-' });
    }
    out
}

pub(crate) mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        STANDARD
            .decode(text.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("Data is not base64: {e}")))
    }
}

/// Nomad's `MemoryStats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MemoryStats {
    /// Resident set size, bytes.
    #[serde(rename = "RSS")]
    pub rss: u64,
    /// Page cache, bytes.
    pub cache: u64,
    /// Swap, bytes.
    pub swap: u64,
    /// Usage, bytes (cgroup).
    pub usage: u64,
    /// Peak usage, bytes (cgroup).
    pub max_usage: u64,
    /// Kernel usage, bytes (cgroup).
    pub kernel_usage: u64,
    /// Peak kernel usage, bytes (cgroup).
    pub kernel_max_usage: u64,
    /// Which of the above the driver measured (Nomad's names: `RSS`, `Cache`, ...).
    pub measured: Vec<String>,
}

/// Nomad's `CpuStats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CpuStats {
    /// Percent of one core spent in the kernel over the sample.
    pub system_mode: f64,
    /// Percent of one core spent in user space over the sample.
    pub user_mode: f64,
    /// CPU use in MHz-ticks (0 when not measured).
    pub total_ticks: f64,
    /// Periods throttled (cgroup).
    pub throttled_periods: u64,
    /// Time throttled, ns (cgroup).
    pub throttled_time: u64,
    /// Percent of one core over the sample.
    pub percent: f64,
    /// Which of the above were measured (`System Mode`, `User Mode`, `Percent`, ...).
    pub measured: Vec<String>,
}

/// Nomad's `ResourceUsage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceUsage {
    /// Memory.
    pub memory_stats: MemoryStats,
    /// CPU.
    pub cpu_stats: CpuStats,
    /// Devices: none here (`[]` for an allocation, `null` for a task, as Nomad's).
    #[serde(default)]
    pub device_stats: Option<Vec<serde_json::Value>>,
}

/// Nomad's `TaskResourceUsage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskResourceUsage {
    /// The task's use.
    pub resource_usage: ResourceUsage,
    /// When it was sampled, ns since the Unix epoch.
    pub timestamp: i64,
    /// Per process: not measured here (`null`).
    #[serde(default)]
    pub pids: Option<BTreeMap<String, ResourceUsage>>,
}

/// Nomad's `AllocResourceUsage`: the allocation's running tasks and their sum.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocResourceUsage {
    /// The sum over [`AllocResourceUsage::tasks`].
    pub resource_usage: ResourceUsage,
    /// By task name.
    pub tasks: BTreeMap<String, TaskResourceUsage>,
    /// The latest of the tasks' timestamps, ns since the Unix epoch.
    pub timestamp: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_nomads_json() {
        let frame = StreamFrame {
            offset: 12,
            data: b"hello\nworld\n".to_vec(),
            file: StreamFrame::log_file_name("t", "stdout", 0),
            ..Default::default()
        };
        // As Nomad 1.0.18 answers it, byte for byte.
        let nomad = r#"{"Data":"aGVsbG8Kd29ybGQK","File":"alloc/logs/t.stdout.0","Offset":12}"#;
        assert_eq!(serde_json::to_string(&frame).unwrap(), nomad);
        let back: StreamFrame = serde_json::from_str(nomad).unwrap();
        assert_eq!(back, frame);
        assert_eq!(
            serde_json::to_string(&StreamFrame::default()).unwrap(),
            "{}"
        );
        assert!(
            serde_json::from_str::<StreamFrame>("{}")
                .unwrap()
                .is_heartbeat()
        );
        let bad = serde_json::from_str::<StreamFrame>(r#"{"Data":"!!"}"#).unwrap_err();
        assert!(bad.to_string().contains("base64"), "{bad}");
    }
}
