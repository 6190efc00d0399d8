//! Finding, launching and fingerprinting plugins.
//!
//! Every candidate (each executable in `plugin_dir`, plus the built-in drivers, which
//! are this same binary re-executed) is launched once, concurrently, handshaken,
//! identified and version-negotiated. The process that was fingerprinted is the one
//! that then serves. A driver library (`NAME.so` in `plugin_dir`, allowed with
//! `[plugin.NAME] in_process = true`) is loaded into the agent instead of launched
//! ([`library`]) and then identified the same way. Anything wrong with a candidate
//! becomes a `skipped` status row with a reason for people; nothing here can take the
//! agent down.

pub mod library;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use drover_api::{PluginKind, PluginSource, PluginState, PluginStatus};
use drover_plugin_sdk::client::{HostEnv, LaunchOptions, PluginProcess};
use drover_plugin_sdk::version::{negotiate_api_version, parse_version};
use drover_plugin_sdk::{Capabilities, DriverError, PluginInfo};
use sha2::Digest as _;

use crate::config::AgentConfig;
use crate::plugins::instance::PluginInstance;

/// A plugin binary or driver library to try.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The executable, or the library.
    pub path: PathBuf,
    /// Its arguments (a library has none).
    pub args: Vec<OsString>,
    /// Where it came from.
    pub source: PluginSource,
    /// File name (external binary), file name without `lib` and `.so` (library) or
    /// built-in name, for logs, allow/deny lists and `[plugin.<label>]`.
    pub label: String,
}

/// What form a candidate's plugin takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateKind {
    /// An executable, run as a plugin process.
    Binary,
    /// A driver library (`NAME.so` in `plugin_dir`), loaded into the agent.
    Library,
}

impl Candidate {
    /// The candidate a file in `plugin_dir` is, labelled as [`scan_plugin_dir`] labels
    /// it: its file name, or for a library (`NAME.so`, `libNAME.so`) `NAME`.
    pub fn external(path: PathBuf) -> Candidate {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let label = library_label(&file_name)
            .map(str::to_owned)
            .unwrap_or(file_name);
        Candidate {
            path,
            args: Vec::new(),
            source: PluginSource::External,
            label,
        }
    }

    /// Binary or library. A library is a file in `plugin_dir` whose name ends in
    /// `.so` (see [`library_label`]); everything else, built-ins included, is a binary.
    /// Derived from the path, so that a candidate cannot say one thing and be another.
    pub fn kind(&self) -> CandidateKind {
        let named_like_a_library = self
            .path
            .file_name()
            .is_some_and(|n| library_label(&n.to_string_lossy()).is_some());
        if self.source == PluginSource::External && named_like_a_library {
            CandidateKind::Library
        } else {
            CandidateKind::Binary
        }
    }
}

/// The label of a driver library's file name: the name without `.so` and without a
/// leading `lib` (`rawexec.so` and `librawexec.so` are both `rawexec`); `None` for a
/// name that does not end in `.so` or has nothing before it.
pub fn library_label(file_name: &str) -> Option<&str> {
    let stem = file_name.strip_suffix(".so")?;
    let label = match stem.strip_prefix("lib") {
        Some(rest) if !rest.is_empty() => rest,
        _ => stem,
    };
    (!label.is_empty()).then_some(label)
}

/// A built-in driver the `drover` binary can serve by re-executing itself.
#[derive(Debug, Clone)]
pub struct Builtin {
    /// Driver name.
    pub name: String,
    /// The executable (normally the running `drover` binary).
    pub command: PathBuf,
    /// Arguments that make it serve this driver, e.g. `plugin serve rawexec`.
    pub args: Vec<OsString>,
}

/// The status row of a candidate that was not loaded.
pub(crate) fn skipped_status(c: &Candidate, reason: impl Into<String>) -> PluginStatus {
    PluginStatus {
        name: c.label.clone(),
        kind: PluginKind::Driver,
        version: String::new(),
        api_version: String::new(),
        source: c.source,
        path: c.path.clone(),
        state: PluginState::Skipped,
        reason: reason.into(),
        pid: None,
        reattached: false,
        in_process: false,
    }
}

/// A launched, identified, version-checked plugin, not yet configured.
#[derive(Debug)]
pub struct Fingerprinted {
    /// What was launched.
    pub candidate: Candidate,
    /// The running plugin (a process, or a library loaded into the agent).
    pub process: PluginInstance,
    /// Its identity.
    pub info: PluginInfo,
    /// The negotiated plugin API version.
    pub api_version: semver::Version,
    /// JSON Schema of the plugin config.
    pub config_schema: serde_json::Value,
    /// JSON Schema of the task config.
    pub task_schema: serde_json::Value,
    /// What it supports.
    pub capabilities: Capabilities,
    /// sha256 of the binary the process runs (checked before it was launched, or
    /// recorded when it was and found unchanged at reattach).
    pub sha256: String,
}

/// List candidates in `dir` (non-recursive, sorted by name): binaries, and driver
/// libraries (`NAME.so`, labelled `NAME`). Files that must not be run or loaded are
/// returned as skipped rows instead. The checks are those of [`open_checked`], which
/// runs again on every launch; whether a library may be loaded at all is the
/// [`Policy`]'s to say, before each load.
pub fn scan_plugin_dir(dir: &Path) -> (Vec<Candidate>, Vec<PluginStatus>) {
    let mut candidates = Vec::new();
    let mut skipped = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(plugin_dir = %dir.display(), "plugin_dir does not exist; no external plugins");
            return (candidates, skipped);
        }
        Err(e) => {
            tracing::error!(plugin_dir = %dir.display(), "cannot read plugin_dir: {e}");
            return (candidates, skipped);
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let candidate = Candidate::external(path.clone());
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            tracing::debug!(path = %path.display(), "ignoring directory in plugin_dir");
            continue;
        }
        match open_checked(&candidate) {
            Ok(_) => candidates.push(candidate),
            Err(reason) => skipped.push(skipped_status(&candidate, reason)),
        }
    }
    (candidates, skipped)
}

/// Identity of a file's content as far as `fstat` tells: device, inode, size, mtime and
/// ctime (which no one can set back), each with nanoseconds. While it is unchanged, a
/// hash taken earlier still describes the file.
pub type FileKey = (u64, u64, u64, i64, u64, i64, u64);

/// Why a file or directory is not safe to run plugins from: writable by others, or
/// owned by someone other than us or root. `what` names it in the message, `path` is
/// what the fix applies to.
fn insecure_reason(mode: u32, uid: u32, what: &str, path: &Path) -> Option<String> {
    let path = path.display();
    // Group-writable counts too: a group other than root's may hold other host users,
    // and any of them could then swap the binary the agent runs as its own uid.
    if mode & 0o022 != 0 {
        let who = if mode & 0o002 != 0 {
            "world-writable"
        } else {
            "group-writable"
        };
        return Some(format!(
            "{what} is {who} (mode {:04o}): another user could replace the plugin; \
             fix: chmod go-w {path}",
            mode & 0o7777
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        return Some(format!(
            "{what} is owned by uid {uid}, not by root or the agent's uid {me}; \
             fix: chown {me} {path}"
        ));
    }
    None
}

/// What a non-regular file is, for a refusal.
fn file_type_name(t: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match t {
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        _ => "not a regular file",
    }
}

/// Open the candidate's binary once and check it on the descriptor, never by path
/// again: the file itself must not be a symlink (`O_NOFOLLOW`), must be a regular,
/// executable file, owned by root or the agent's uid and not writable by group or
/// others; an external plugin's directory is checked the same way and the file is
/// opened relative to it. The descriptor is close-on-exec; it is what the launcher
/// executes, or, for a driver library, what the sealed copy that is loaded is made
/// from ([`library`]). A library need not be executable (`dlopen` maps it, nothing
/// executes the file); every other check is the same.
///
/// The file is first opened with `O_PATH`, which never blocks and reads nothing, and
/// only a regular file is then opened for reading: opening a FIFO for reading blocks
/// until a writer comes, and opening a device may act on it, so a FIFO dropped into
/// `plugin_dir` would otherwise hang plugin loading for good. The second open cannot
/// block either (`O_NONBLOCK`) and must find the same file (device and inode), or the
/// candidate is refused.
pub fn open_checked(c: &Candidate) -> Result<(OwnedFd, FileKey), String> {
    let r = open_checked_inner(c);
    match c.source {
        PluginSource::External => r,
        // Built-ins run from the agent's own binary: say so, or "file is
        // group-writable" leaves the operator looking for a plugin file.
        PluginSource::Builtin => r.map_err(|reason| {
            format!(
                "built-in drivers run from the agent's own binary, and it fails the checks \
                 every plugin binary must pass: {reason}"
            )
        }),
    }
}

fn open_checked_inner(c: &Candidate) -> Result<(OwnedFd, FileKey), String> {
    use rustix::fs::{FileType, Mode, OFlags};
    let shown = c.path.display().to_string();
    let kind = c.kind();
    let refused = |e: rustix::io::Errno| {
        if e == rustix::io::Errno::LOOP {
            let (what, how) = match kind {
                CandidateKind::Binary => ("plugin binaries are run", "binary"),
                CandidateKind::Library => ("driver libraries are loaded", "library"),
            };
            format!(
                "{shown} is a symlink: {what} only from the file itself (O_NOFOLLOW); copy \
                 or move the {how} into place"
            )
        } else {
            format!("cannot open {shown}: {e}")
        }
    };
    let (dir_fd, name) = match c.source {
        PluginSource::External => {
            let (Some(dir), Some(name)) = (c.path.parent(), c.path.file_name()) else {
                return Err(format!("{shown} is not a file in a directory"));
            };
            let dir_fd = rustix::fs::open(
                dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("cannot open plugin_dir {}: {e}", dir.display()))?;
            let st =
                rustix::fs::fstat(&dir_fd).map_err(|e| format!("cannot stat plugin_dir: {e}"))?;
            if let Some(reason) = insecure_reason(
                st.st_mode,
                st.st_uid,
                &format!("plugin_dir {}", dir.display()),
                dir,
            ) {
                return Err(reason);
            }
            (Some(dir_fd), name.to_owned())
        }
        PluginSource::Builtin => (None, c.path.as_os_str().to_owned()),
    };
    let open = |flags: OFlags| match &dir_fd {
        Some(dir) => rustix::fs::openat(dir, name.as_os_str(), flags, Mode::empty()),
        None => rustix::fs::open(name.as_os_str(), flags, Mode::empty()),
    };
    // O_PATH: no read access asked for, so nothing blocks and no device is touched.
    let path_fd = open(OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC).map_err(refused)?;
    let st = rustix::fs::fstat(&path_fd).map_err(|e| format!("cannot stat {shown}: {e}"))?;
    let file_type = FileType::from_raw_mode(st.st_mode);
    if file_type != FileType::RegularFile {
        return Err(format!(
            "{shown} is {}, not a regular file: only regular files are run or loaded as plugins",
            file_type_name(file_type)
        ));
    }
    let fd = open(
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
    )
    .map_err(refused)?;
    let st2 = rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat {shown}: {e}"))?;
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino)
        || FileType::from_raw_mode(st2.st_mode) != FileType::RegularFile
    {
        return Err(format!(
            "{shown} was replaced while it was being checked; not run"
        ));
    }
    // Reads of the binary (its hash) should block as usual.
    let fcntl_failed = |e: rustix::io::Errno| format!("fcntl on {shown}: {e}");
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(fcntl_failed)?;
    rustix::fs::fcntl_setfl(&fd, flags.difference(OFlags::NONBLOCK)).map_err(fcntl_failed)?;
    let mode = st2.st_mode;
    if kind == CandidateKind::Binary && mode & 0o111 == 0 {
        return Err(format!(
            "{shown} is not executable (mode {:04o}); chmod +x it to load it",
            mode & 0o7777
        ));
    }
    if let Some(reason) = insecure_reason(mode, st2.st_uid, &shown, &c.path) {
        return Err(reason);
    }
    if kind == CandidateKind::Library && open_for_writing(&fd) {
        return Err(format!(
            "{shown} is still open for writing (a copy in progress?): a library is loaded \
             only once nobody writes it; it is tried again at the next reload (its writer's \
             close starts one)"
        ));
    }
    let key = (
        st2.st_dev,
        st2.st_ino,
        st2.st_size as u64,
        st2.st_mtime,
        st2.st_mtime_nsec as u64,
        st2.st_ctime,
        st2.st_ctime_nsec as u64,
    );
    Ok((fd, key))
}

/// Does any process have the file behind `fd` (opened read-only) open for writing?
///
/// A read lease (`F_SETLEASE`, `F_RDLCK`) is refused with `EAGAIN` exactly then; it is
/// given back at once. A writer opening the file in between would break the lease and
/// signal this process: the signal is made `SIGURG` first (ignored unless handled; the
/// default `SIGIO` would end the agent). The lease needs the file's owner or
/// `CAP_LEASE`, and a filesystem that has leases: where it cannot be taken for those
/// reasons, this says no, and the loader's quiet-time check
/// ([`library::SETTLE`]) is what remains.
fn open_for_writing(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    // `F_SETSIG` (asm-generic/fcntl.h), which the libc crate does not export.
    const F_SETSIG: libc::c_int = 10;
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function borrows, with integer arguments.
    #[allow(unsafe_code)]
    unsafe {
        if libc::fcntl(fd, F_SETSIG, libc::SIGURG) != 0 {
            return false;
        }
        if libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) == 0 {
            libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
            return false;
        }
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
}

/// sha256 of the bytes behind `fd` (hex), read from the start.
pub fn sha256_fd(fd: &OwnedFd) -> std::io::Result<String> {
    use std::io::{Seek as _, SeekFrom};
    let mut file = std::fs::File::from(fd.try_clone()?);
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// A plugin binary opened once and checked ([`open_checked`]), with the sha256 of the
/// bytes behind its descriptor: the launcher executes this descriptor, so the bytes
/// checked are the bytes that run.
#[derive(Debug, Clone)]
pub struct Binary {
    /// The open file, close-on-exec.
    pub fd: Arc<OwnedFd>,
    /// sha256 (hex, lowercase) of its content.
    pub sha256: String,
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Which binaries may run and serve: `plugin_allow`/`plugin_deny` and the `sha256`
/// pins of `[plugin.NAME]`.
///
/// The pin rule: while no pin is configured, any binary that passes the file checks
/// runs. Once any `[plugin.NAME] sha256` is configured, an external binary runs only if
/// its sha256 equals one of the configured pins (file names do not matter, so renaming
/// a file cannot dodge a pin), and it then serves only if the name it reports has a pin
/// equal to its sha256. A built-in (the agent's own binary) needs no pin, but a pin
/// configured under its name is checked before it runs. All of it is checked before
/// every exec, relaunches included, on the bytes executed.
///
/// Driver libraries follow the same rules (pins included: a library is external),
/// and one more: a library is loaded only when `[plugin.<label>] in_process = true`
/// asks for it, checked before every load, relaunches included.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `plugin_allow`.
    pub allow: Vec<String>,
    /// `plugin_deny`.
    pub deny: Vec<String>,
    /// Pins by plugin name, lowercase hex.
    pub pins: BTreeMap<String, String>,
    /// Names whose `[plugin.NAME]` says `in_process = true`: the driver libraries that
    /// may be loaded into the agent.
    pub in_process: BTreeSet<String>,
}

impl Policy {
    /// The policy the configuration describes.
    pub fn from_config(config: &AgentConfig) -> Self {
        Policy {
            allow: config.plugin_allow.clone(),
            deny: config.plugin_deny.clone(),
            pins: config
                .plugin
                .iter()
                .filter_map(|(name, s)| {
                    s.sha256
                        .as_ref()
                        .map(|p| (name.clone(), p.trim().to_ascii_lowercase()))
                })
                .collect(),
            in_process: config
                .plugin
                .iter()
                .filter(|(_, s)| s.in_process)
                .map(|(name, _)| name.clone())
                .collect(),
        }
    }

    /// May `c`, whose binary hashes to `sha256`, be executed (a library: loaded)?
    pub fn before_exec(&self, c: &Candidate, sha256: &str) -> Result<(), String> {
        allowed(&c.label, &self.allow, &self.deny)?;
        if c.kind() == CandidateKind::Library && !self.in_process.contains(&c.label) {
            let label = &c.label;
            return Err(format!(
                "not loaded: {} is a driver library, and a library is loaded into the agent \
                 only when its config allows it (a crash of an in-process driver is a crash \
                 of the agent); to load it, add `in_process = true` under [plugin.{label}] \
                 in the agent config",
                c.path.display()
            ));
        }
        let (not_run, run) = match c.kind() {
            CandidateKind::Binary => ("not run", "run"),
            CandidateKind::Library => ("not loaded", "load"),
        };
        if let Some(pin) = self.pins.get(&c.label) {
            if !pin.eq_ignore_ascii_case(sha256) {
                return Err(format!(
                    "sha256 is {sha256}, but [plugin.{}] sha256 pins {pin}; {not_run}",
                    c.label
                ));
            }
            return Ok(());
        }
        if c.source == PluginSource::External
            && !self.pins.is_empty()
            && !self.pins.values().any(|p| p.eq_ignore_ascii_case(sha256))
        {
            return Err(format!(
                "not pinned: its sha256 {sha256} matches no [plugin.NAME] sha256 pin, and once \
                 any pin is configured only pinned binaries and libraries run; {not_run} (to \
                 {run} it, add sha256 = \"{sha256}\" under [plugin.<the name it serves>])"
            ));
        }
        Ok(())
    }

    /// May a binary hashing to `sha256` serve the plugin name it reported?
    pub fn before_serve(
        &self,
        name: &str,
        source: PluginSource,
        sha256: &str,
    ) -> Result<(), String> {
        allowed(name, &self.allow, &self.deny)?;
        match self.pins.get(name) {
            Some(pin) if !pin.eq_ignore_ascii_case(sha256) => Err(format!(
                "sha256 is {sha256}, but [plugin.{name}] sha256 pins {pin}"
            )),
            None if source == PluginSource::External && !self.pins.is_empty() => Err(format!(
                "it calls itself {name:?}, but no [plugin.{name}] sha256 pins it; once any pin \
                 is configured an external plugin serves only under a name that pins its sha256"
            )),
            _ => Ok(()),
        }
    }
}

fn parse_schema(what: &str, text: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{what} is not JSON: {e}"))?;
    if !value.is_object() && !value.is_boolean() {
        return Err(format!("{what} is not a JSON Schema object"));
    }
    jsonschema::validator_for(&value)
        .map_err(|e| format!("{what} is not a valid JSON Schema: {e}"))?;
    Ok(value)
}

/// Explain an RPC failure during fingerprinting.
fn rpc_reason(rpc: &str, e: DriverError) -> String {
    match e {
        DriverError::Unimplemented(_) => format!(
            "does not serve drover.plugin.v1 ({rpc} is unimplemented): it answers the go-plugin \
             handshake but is a plugin for another application"
        ),
        other => format!("{rpc} failed: {other}"),
    }
}

/// The agent's variables every plugin gets, whatever the configuration: the search
/// path, and the plugin SDK's log filter.
pub const PLUGIN_BASE_ENV: &[&str] = &["PATH", drover_plugin_sdk::logging::ENV_PLUGIN_LOG];

/// How a plugin process is launched: its environment and its transport.
///
/// The environment is like go-plugin's `SkipHostEnv`: none of the agent's own
/// environment but [`PLUGIN_BASE_ENV`] and what the operator listed
/// (`plugin_pass_env`, `[plugin.NAME] pass_env`), plus `[plugin.NAME] env`. The
/// handshake's variables are added by the launcher. A driver library loaded into the
/// agent shares the agent's environment: it is the agent.
///
/// ```
/// use drover_host::plugins::loader::LaunchSettings;
/// let launch = LaunchSettings::new(["DOCKER_HOST".to_string()].iter(), [].into_iter())
///     .with_auto_mtls(true);
/// assert!(format!("{launch:?}").contains("DOCKER_HOST"));
/// ```
#[derive(Clone)]
pub struct LaunchSettings {
    host_env: HostEnv,
    set: Vec<(OsString, OsString)>,
    auto_mtls: bool,
}

impl LaunchSettings {
    /// Pass the agent's `PLUGIN_BASE_ENV` and `pass` variables, then set `set`; plain
    /// (no AutoMTLS).
    pub fn new<'a>(
        pass: impl Iterator<Item = &'a String>,
        set: impl Iterator<Item = (&'a String, &'a String)>,
    ) -> LaunchSettings {
        let mut names: Vec<OsString> = PLUGIN_BASE_ENV.iter().map(OsString::from).collect();
        for name in pass {
            let name = OsString::from(name);
            if !names.contains(&name) {
                names.push(name);
            }
        }
        LaunchSettings {
            host_env: HostEnv::Only(names),
            set: set
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect(),
            auto_mtls: false,
        }
    }

    /// With go-plugin's automatic mutual TLS on or off.
    pub fn with_auto_mtls(mut self, on: bool) -> LaunchSettings {
        self.auto_mtls = on;
        self
    }
}

/// [`PLUGIN_BASE_ENV`] only, plain.
impl Default for LaunchSettings {
    fn default() -> Self {
        LaunchSettings::new(std::iter::empty(), std::iter::empty())
    }
}

/// Names only: an operator's `env` values may be credentials.
impl std::fmt::Debug for LaunchSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchSettings")
            .field("host_env", &self.host_env)
            .field("set", &self.set.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("auto_mtls", &self.auto_mtls)
            .finish()
    }
}

/// Launch one candidate from its checked `binary` (the descriptor is what runs), or
/// load it into the agent when it is a driver library (a sealed copy of the bytes
/// behind the descriptor is what is loaded, see [`library`]), and fingerprint it. On
/// failure the plugin has been shut down (politely if it got far enough to be asked)
/// and the error is the reason.
///
/// A library must serve under its label (`rawexec.so` serves `rawexec`): its
/// `[plugin.<label>] in_process = true` is the operator's consent for exactly that
/// plugin.
pub async fn fingerprint(
    candidate: &Candidate,
    binary: &Binary,
    timeout: Duration,
    socket_dir: &Path,
    accepted: &semver::VersionReq,
    launch: &LaunchSettings,
) -> Result<Fingerprinted, String> {
    let instance: PluginInstance = match candidate.kind() {
        CandidateKind::Binary => {
            let mut opts = LaunchOptions::new(candidate.label.clone(), candidate.path.clone());
            opts.args = candidate.args.clone();
            opts.host_env = launch.host_env.clone();
            opts.env = launch.set.clone();
            opts.auto_mtls = launch.auto_mtls;
            opts.handshake_timeout = timeout;
            opts.socket_dir = Some(socket_dir.to_owned());
            opts.executable = Some(binary.fd.clone());
            PluginProcess::launch(opts)
                .await
                .map_err(|e| e.to_string())?
                .into()
        }
        CandidateKind::Library => library::load(candidate, binary, timeout).await?.into(),
    };
    let fp = adopt(
        candidate,
        instance,
        binary.sha256.clone(),
        timeout,
        accepted,
    )
    .await?;
    if candidate.kind() == CandidateKind::Library && fp.info.name != candidate.label {
        fp.process.shutdown().await;
        return Err(format!(
            "{} calls itself {name:?}: a driver library serves only the plugin it is named \
             after, so that [plugin.{}] in_process = true allows exactly that plugin; to \
             load it, name it {name}.so and allow it with [plugin.{name}] in_process = true",
            candidate.path.display(),
            candidate.label,
            name = fp.info.name,
        ));
    }
    Ok(fp)
}

/// Fingerprint a running plugin process (just launched, or reattached) whose binary
/// hashes to `sha256`: identity, versions, schemas, capabilities, within `timeout`. On
/// failure the process has been shut down (killed if it stopped answering) and the
/// error is the reason.
pub async fn adopt(
    candidate: &Candidate,
    process: PluginInstance,
    sha256: String,
    timeout: Duration,
    accepted: &semver::VersionReq,
) -> Result<Fingerprinted, String> {
    match tokio::time::timeout(timeout, identify(&process, accepted)).await {
        Ok(Ok((info, api_version, config_schema, task_schema, capabilities))) => {
            process.mirror_stdio();
            Ok(Fingerprinted {
                candidate: candidate.clone(),
                process,
                info,
                api_version,
                config_schema,
                task_schema,
                capabilities,
                sha256,
            })
        }
        Ok(Err(reason)) => {
            process.shutdown().await;
            Err(reason)
        }
        Err(_) => {
            process.kill().await;
            Err(format!(
                "plugin did not answer its identity RPCs within {timeout:?}"
            ))
        }
    }
}

type Identity = (
    PluginInfo,
    semver::Version,
    serde_json::Value,
    serde_json::Value,
    Capabilities,
);

async fn identify(
    process: &PluginInstance,
    accepted: &semver::VersionReq,
) -> Result<Identity, String> {
    let client = process.client();
    let identity = client
        .plugin_info()
        .await
        .map_err(|e| rpc_reason("PluginInfo", e))?;
    if identity.kind != drover_plugin_sdk::client::PluginKind::Driver {
        return Err(format!("plugin type {} is not a driver", identity.kind));
    }
    let (info, api_versions) = (identity.info(), identity.api_versions);
    let name_ok = !info.name.is_empty()
        && info.name.len() <= 64
        && info
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !name_ok {
        return Err(format!(
            "plugin name {:?} is not 1-64 characters of [a-z0-9_-]",
            info.name
        ));
    }
    parse_version(&info.version).map_err(|e| format!("plugin_version: {e}"))?;
    let api_version = negotiate_api_version(&api_versions, accepted)
        .map_err(|e| format!("incompatible plugin API version: {e}"))?;
    let config_schema = parse_schema(
        "config schema",
        &client
            .config_schema()
            .await
            .map_err(|e| rpc_reason("ConfigSchema", e))?,
    )?;
    let task_schema = parse_schema(
        "task config schema",
        &client
            .task_config_schema()
            .await
            .map_err(|e| rpc_reason("TaskConfigSchema", e))?,
    )?;
    let capabilities = client
        .capabilities()
        .await
        .map_err(|e| rpc_reason("Capabilities", e))?;
    Ok((info, api_version, config_schema, task_schema, capabilities))
}

/// Validate `value` against `schema`; the error lists each problem with its location.
///
/// Unknown top-level fields (a typo is the most common mistake) are reported by name
/// with the fields that are allowed; the validator's own message for them does not
/// always name the field.
pub fn validate(schema: &serde_json::Value, value: &serde_json::Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| format!("bad schema: {e}"))?;
    let mut problems = unknown_fields(schema, value);
    let reported_unknown = !problems.is_empty();
    for e in validator.iter_errors(value) {
        let at = e.instance_path().to_string();
        let about_extra_fields = matches!(
            e.kind(),
            jsonschema::error::ValidationErrorKind::AdditionalProperties { .. }
                | jsonschema::error::ValidationErrorKind::FalseSchema
        );
        if at.is_empty() && about_extra_fields && reported_unknown {
            continue;
        }
        problems.push(if at.is_empty() {
            e.to_string()
        } else {
            format!("{at}: {e}")
        });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn unknown_fields(schema: &serde_json::Value, value: &serde_json::Value) -> Vec<String> {
    let (Some(object), Some(false)) = (
        value.as_object(),
        schema
            .get("additionalProperties")
            .and_then(serde_json::Value::as_bool),
    ) else {
        return Vec::new();
    };
    let known: Vec<&str> = schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let allowed = if known.is_empty() {
        "it takes no fields".to_owned()
    } else {
        format!("expected one of: {}", known.join(", "))
    };
    object
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| format!("unknown field {k:?} ({allowed})"))
        .collect()
}

/// Is `name` allowed by the allow and deny lists?
pub fn allowed(name: &str, allow: &[String], deny: &[String]) -> Result<(), String> {
    if deny.iter().any(|d| d == name) {
        return Err(format!("{name:?} is in plugin_deny"));
    }
    if !allow.is_empty() && !allow.iter().any(|a| a == name) {
        return Err(format!("{name:?} is not in plugin_allow"));
    }
    Ok(())
}

/// Which of two fingerprinted plugins with the same name should serve.
/// External beats built-in unless `prefer_builtin`; otherwise the higher
/// `plugin_version` wins; a tie keeps the first.
pub fn prefer(a: &Fingerprinted, b: &Fingerprinted, prefer_builtin: bool) -> bool {
    if a.candidate.source != b.candidate.source {
        let a_builtin = a.candidate.source == PluginSource::Builtin;
        return a_builtin == prefer_builtin;
    }
    let va = parse_version(&a.info.version).ok();
    let vb = parse_version(&b.info.version).ok();
    va >= vb
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn allow_and_deny() {
        assert!(allowed("x", &[], &[]).is_ok());
        assert!(allowed("x", &[], &["x".into()]).is_err());
        assert!(allowed("x", &["y".into()], &[]).is_err());
        assert!(allowed("y", &["y".into()], &[]).is_ok());
    }

    #[test]
    fn validate_names_the_field() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
            "additionalProperties": false
        });
        let err = validate(&schema, &serde_json::json!({"comand": "x"})).unwrap_err();
        assert!(
            err.contains("unknown field \"comand\" (expected one of: command)"),
            "{err}"
        );
        assert!(err.contains("\"command\" is a required property"), "{err}");
        let empty = serde_json::json!({"type": "object", "additionalProperties": false});
        let err = validate(&empty, &serde_json::json!({"colour": "blue"})).unwrap_err();
        assert_eq!(err, "unknown field \"colour\" (it takes no fields)");
        let err = validate(&schema, &serde_json::json!({"command": 3})).unwrap_err();
        assert!(err.contains("/command"), "{err}");
        assert!(validate(&schema, &serde_json::json!({"command": "x"})).is_ok());
    }

    #[test]
    fn scan_refuses_unsafe_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("noexec"), "#!/bin/sh\n").unwrap();
        std::fs::write(p("worldw"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("worldw"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(p("groupw"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("groupw"), std::fs::Permissions::from_mode(0o775)).unwrap();
        std::fs::write(p("good"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p("good"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(p("subdir")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1);
        assert_eq!(cands[0].label, "good");
        let reason = |n: &str| skipped.iter().find(|s| s.name == n).unwrap().reason.clone();
        assert!(reason("noexec").contains("not executable"));
        assert!(reason("worldw").contains("world-writable"));
        assert!(
            reason("groupw").contains("group-writable"),
            "{}",
            reason("groupw")
        );

        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert!(cands.is_empty());
        let r = reason_of(&skipped, "good");
        let shown = dir.path().display();
        assert!(
            r.contains(&format!("plugin_dir {shown} is world-writable"))
                && r.contains(&format!("chmod go-w {shown}")),
            "{r}"
        );
    }

    #[test]
    fn scan_skips_a_fifo_without_opening_it_for_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o755),
            0,
        )
        .unwrap();
        // Opening it for reading would block this thread until a writer came.
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert!(cands.is_empty());
        let r = reason_of(&skipped, "fifo");
        assert!(
            r.contains(&format!("{} is a FIFO, not a regular file", fifo.display())),
            "{r}"
        );
    }

    #[test]
    fn scan_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real");
        std::fs::write(&target, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1);
        assert!(
            reason_of(&skipped, "link").contains("symlink"),
            "{skipped:#?}"
        );
    }

    fn candidate(label: &str, source: PluginSource) -> Candidate {
        Candidate {
            path: PathBuf::from("/plugins").join(label),
            args: Vec::new(),
            source,
            label: label.into(),
        }
    }

    #[test]
    fn pins_bind_bytes_to_names_and_lock_out_unpinned_binaries() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let ext = PluginSource::External;
        let none = Policy::default();
        assert!(none.before_exec(&candidate("x", ext), &a).is_ok());
        assert!(none.before_serve("x", ext, &a).is_ok());

        let pinned = Policy {
            pins: [("skeleton".to_owned(), a.clone())].into(),
            ..Policy::default()
        };
        // Any file name: only the pinned bytes run.
        assert!(
            pinned
                .before_exec(&candidate("drover-skeleton-driver", ext), &a)
                .is_ok()
        );
        let err = pinned
            .before_exec(&candidate("drover-skeleton-driver", ext), &b)
            .unwrap_err();
        assert!(err.contains("not pinned"), "{err}");
        let err = pinned
            .before_exec(&candidate("skeleton", ext), &b)
            .unwrap_err();
        assert!(err.contains("[plugin.skeleton] sha256 pins"), "{err}");
        // The pinned bytes serve only under the name that pins them.
        assert!(pinned.before_serve("skeleton", ext, &a).is_ok());
        let err = pinned.before_serve("other", ext, &a).unwrap_err();
        assert!(err.contains("no [plugin.other] sha256"), "{err}");
        // Built-ins need no pin, but one under their name is checked.
        let builtin = PluginSource::Builtin;
        assert!(
            pinned
                .before_exec(&candidate("rawexec", builtin), &b)
                .is_ok()
        );
        assert!(pinned.before_serve("rawexec", builtin, &b).is_ok());
        let strict = Policy {
            pins: [("rawexec".to_owned(), a.clone())].into(),
            ..Policy::default()
        };
        assert!(
            strict
                .before_exec(&candidate("rawexec", builtin), &b)
                .is_err()
        );
        assert!(strict.before_serve("rawexec", builtin, &b).is_err());
        // Deny wins over a pin.
        let denied = Policy {
            deny: vec!["skeleton".into()],
            ..pinned
        };
        assert!(denied.before_serve("skeleton", ext, &a).is_err());
    }

    #[test]
    fn library_labels_drop_lib_and_so() {
        assert_eq!(library_label("rawexec.so"), Some("rawexec"));
        assert_eq!(library_label("librawexec.so"), Some("rawexec"));
        assert_eq!(library_label("lib.so"), Some("lib"));
        assert_eq!(library_label(".so"), None);
        assert_eq!(library_label("rawexec.so.1"), None);
        assert_eq!(library_label("rawexec"), None);
        let builtin = Candidate {
            path: PathBuf::from("/usr/bin/x.so"),
            ..candidate("x", PluginSource::Builtin)
        };
        assert_eq!(builtin.kind(), CandidateKind::Binary);
        let lib = Candidate::external(PathBuf::from("/plugins/librawexec.so"));
        assert_eq!(
            (lib.label.as_str(), lib.kind()),
            ("rawexec", CandidateKind::Library)
        );
        let bin = Candidate::external(PathBuf::from("/plugins/drover-skeleton-driver"));
        assert_eq!(
            (bin.label.as_str(), bin.kind()),
            ("drover-skeleton-driver", CandidateKind::Binary)
        );
    }

    #[test]
    fn scan_takes_libraries_without_exec_bits_and_checks_them_like_binaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let write = |n: &str, mode: u32| {
            std::fs::write(p(n), b"\x7fELF").unwrap();
            std::fs::set_permissions(p(n), std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("librawexec.so", 0o644);
        write("worldw.so", 0o646);
        write("groupw.so", 0o664);
        std::os::unix::fs::symlink(p("librawexec.so"), p("link.so")).unwrap();
        let (cands, skipped) = scan_plugin_dir(dir.path());
        assert_eq!(cands.len(), 1, "{cands:#?} {skipped:#?}");
        assert_eq!(cands[0].label, "rawexec");
        assert_eq!(cands[0].kind(), CandidateKind::Library);
        assert!(reason_of(&skipped, "worldw").contains("world-writable"));
        assert!(reason_of(&skipped, "groupw").contains("group-writable"));
        let r = reason_of(&skipped, "link");
        assert!(
            r.contains("link.so is a symlink, not a regular file"),
            "{r}"
        );
    }

    #[test]
    fn a_library_loads_only_with_in_process_and_pins_hold_for_it() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let lib = Candidate {
            path: PathBuf::from("/plugins/librawexec.so"),
            ..candidate("rawexec", PluginSource::External)
        };
        let err = Policy::default().before_exec(&lib, &a).unwrap_err();
        assert!(
            err.contains("/plugins/librawexec.so is a driver library")
                && err.contains("add `in_process = true` under [plugin.rawexec]"),
            "{err}"
        );
        let allowed = Policy {
            in_process: ["rawexec".to_owned()].into(),
            ..Policy::default()
        };
        assert!(allowed.before_exec(&lib, &a).is_ok());
        // The same label as a binary needs no consent: it runs as a process.
        assert!(
            Policy::default()
                .before_exec(&candidate("rawexec", PluginSource::External), &a)
                .is_ok()
        );
        let pinned = Policy {
            pins: [("rawexec".to_owned(), a.clone())].into(),
            ..allowed.clone()
        };
        assert!(pinned.before_exec(&lib, &a).is_ok());
        let err = pinned.before_exec(&lib, &b).unwrap_err();
        assert!(
            err.contains("[plugin.rawexec] sha256 pins") && err.ends_with("not loaded"),
            "{err}"
        );
        let other = Policy {
            pins: [("skeleton".to_owned(), a.clone())].into(),
            ..allowed.clone()
        };
        assert!(
            other
                .before_exec(&lib, &b)
                .unwrap_err()
                .contains("not pinned")
        );
        let denied = Policy {
            deny: vec!["rawexec".into()],
            ..allowed
        };
        assert!(
            denied
                .before_exec(&lib, &a)
                .unwrap_err()
                .contains("plugin_deny")
        );
    }

    fn reason_of(rows: &[PluginStatus], name: &str) -> String {
        rows.iter().find(|s| s.name == name).unwrap().reason.clone()
    }
}
