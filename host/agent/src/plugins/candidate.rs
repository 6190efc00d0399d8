//! What may become a plugin: a candidate (an executable or a driver library in
//! `plugin_dir`, or a built-in driver, which is the agent's own binary re-executed),
//! its kind and label, and the status row of one that does not serve.

use std::ffi::OsString;
use std::path::PathBuf;

use drover_api::{PluginKind, PluginSource, PluginState, PluginStatus};

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
    /// built-in name, for logs, allow/deny lists and `[plugin.<label>]`; an older
    /// driver name is replaced by the current one (`rawexec` → `raw_exec`).
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
    /// The candidate a file in `plugin_dir` is, labelled as
    /// [`super::loader::scan_plugin_dir`] labels it: its file name, or for a library
    /// (`NAME.so`, `libNAME.so`) `NAME`.
    pub fn external(path: PathBuf) -> Candidate {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let label = library_label(&file_name).unwrap_or(&file_name);
        // A file named after a driver's older name (`rawexec`, `rawexec.so`) is
        // labelled with its current one (`raw_exec`): the name its `[plugin.NAME]`
        // settings, allow/deny entries and pins are under once the config is loaded
        // (see `AgentConfig::load`), and the one a library must serve.
        let label = drover_api::canonical_driver_name(label).to_owned();
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
pub(super) fn skipped_status(c: &Candidate, reason: impl Into<String>) -> PluginStatus {
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
        protocol: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(label: &str, source: PluginSource) -> Candidate {
        Candidate {
            path: PathBuf::from("/plugins").join(label),
            args: Vec::new(),
            source,
            label: label.into(),
        }
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
        // `rawexec` is the raw_exec driver's older name: labelled with the current one.
        assert_eq!(
            (lib.label.as_str(), lib.kind()),
            ("raw_exec", CandidateKind::Library)
        );
        let lib = Candidate::external(PathBuf::from("/plugins/libacme.so"));
        assert_eq!(lib.label, "acme");
        let bin = Candidate::external(PathBuf::from("/plugins/drover-skeleton-driver"));
        assert_eq!(
            (bin.label.as_str(), bin.kind()),
            ("drover-skeleton-driver", CandidateKind::Binary)
        );
    }
}
