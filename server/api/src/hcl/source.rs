//! A file's text, its positions and the one-line error every failure becomes.

use std::io::Read as _;
use std::ops::Range;
use std::path::Path;

use hcl::edit::structure::Body;

/// A job file (or variable file) that could not be used. Displays as one line:
/// `FILE:LINE:COL: message`, or `FILE: message` when no place in the file is at fault
/// (a `-var` naming no declared variable, a file that cannot be read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", match .position { Some((l, c)) => format!(":{l}:{c}"), None => String::new() })]
pub struct HclError {
    /// The file's name as given.
    pub file: String,
    /// 1-based line and column (in characters) of what is at fault.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

impl HclError {
    /// An error about the file as a whole.
    pub fn whole(file: &str, message: impl Into<String>) -> Self {
        HclError {
            file: file.to_owned(),
            position: None,
            message: message.into(),
        }
    }
}

/// Read at most `limit` bytes of a UTF-8 file; more is an error, not a truncation.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<String, String> {
    // A FIFO or a device would block or never end: only regular files are read (these
    // are the CLI user's own files; the server reads none).
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{} is larger than {limit} bytes", path.display()));
    }
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}

/// A parsed file's name and text, to place errors.
pub(crate) struct Source<'a> {
    pub name: String,
    pub text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Source<'a> {
    pub fn new(name: &str, text: &'a str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Source {
            name: name.to_owned(),
            text,
            line_starts,
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset);
        let start = self.line_starts[line - 1];
        let col = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line, col + 1)
    }

    /// An error at the start of `span` (at the file as a whole without one).
    pub fn error_at(&self, span: Option<Range<usize>>, message: impl Into<String>) -> HclError {
        HclError {
            file: self.name.clone(),
            position: span.map(|s| self.position(s.start)),
            message: message.into(),
        }
    }

    /// An error at what `node` was parsed from.
    pub fn error(&self, node: &dyn hcl::edit::Span, message: impl Into<String>) -> HclError {
        self.error_at(node.span(), message)
    }

    /// Parse the whole text as an HCL body; a syntax error is placed where hcl-edit
    /// found it.
    pub fn parse_body(&self) -> Result<Body, HclError> {
        hcl::edit::parser::parse_body(self.text).map_err(|e| {
            let loc = e.location();
            HclError {
                file: self.name.clone(),
                position: Some((loc.line(), loc.column())),
                message: format!("syntax error: {}", e.message()),
            }
        })
    }
}
