//! Rules for the files a job puts into a task's directory before it starts (Nomad's
//! `artifact` and `template` blocks), shared by the server's validation and the client
//! agent that fetches and renders them: where a destination may point, which URLs an
//! artifact may come from, which checksums are understood, what `perms` means.
//!
//! A destination is relative to the task directory and must stay inside it: `local/`,
//! `secrets/`, `tmp/` of the task, or the allocation's shared `alloc/`. Nomad's
//! `${NOMAD_TASK_DIR}`, `${NOMAD_SECRETS_DIR}` and `${NOMAD_ALLOC_DIR}` may start it; a
//! leading `/` means the task directory (as Nomad joins it); `..` is refused.

use std::path::PathBuf;

/// Most artifacts of one task.
pub const MAX_ARTIFACTS: usize = 16;
/// Most templates of one task.
pub const MAX_TEMPLATES: usize = 16;
/// Longest artifact URL.
pub const MAX_SOURCE_LEN: usize = 2048;
/// Longest destination or template source path.
pub const MAX_PATH_LEN: usize = 1024;
/// Most headers of one artifact.
pub const MAX_HEADERS: usize = 32;
/// Most bytes of one artifact's headers (names and values).
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Largest inline template (`data`).
pub const MAX_TEMPLATE_DATA: usize = 64 * 1024;
/// Longest template `splay`.
pub const MAX_SPLAY: std::time::Duration = std::time::Duration::from_secs(3600);
/// The go-getter options Drover understands.
pub const ARTIFACT_OPTIONS: [&str; 2] = ["checksum", "archive"];

/// Which directory a destination is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// The task's own directory (`local/`, `secrets/`, `tmp/` beneath it).
    Task,
    /// The allocation's shared directory (`alloc/`: `data/`, `tmp/` ... beneath it).
    Alloc,
}

/// A destination made safe: the directory it is in, and a path relative to it with no
/// `.`, `..`, or empty component. `trailing_slash` says the user wrote a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPath {
    /// Task directory or shared directory.
    pub root: Root,
    /// Relative, clean, never empty for [`Root::Task`] (it starts with `local`,
    /// `secrets` or `tmp`); may be empty for [`Root::Alloc`] (the shared dir itself).
    pub rel: PathBuf,
    /// Written with a trailing `/`.
    pub trailing_slash: bool,
}

impl TaskPath {
    /// Whether the file lands under the task's `secrets/` (always 0600 there).
    pub fn is_secret(&self) -> bool {
        self.root == Root::Task && self.rel.starts_with("secrets")
    }
}

/// The top-level directories of the task directory a job may write.
const TASK_SUBDIRS: [&str; 3] = ["local", "secrets", "tmp"];

/// Check and clean `dest` (a destination or template source, relative to the task
/// directory).
///
/// ```
/// use drover_server_api::taskfiles::{task_path, Root};
/// let p = task_path("${NOMAD_TASK_DIR}/conf/app.toml").unwrap();
/// assert_eq!((p.root, p.rel.to_str().unwrap()), (Root::Task, "local/conf/app.toml"));
/// assert!(task_path("local/../../etc/passwd").unwrap_err().contains(".."));
/// assert!(task_path("logs/stdout.0").is_err());
/// ```
pub fn task_path(dest: &str) -> Result<TaskPath, String> {
    if dest.len() > MAX_PATH_LEN {
        return Err(format!("{} bytes, at most {MAX_PATH_LEN}", dest.len()));
    }
    if dest.contains('\0') {
        return Err("contains a NUL byte".to_owned());
    }
    let trailing_slash = dest.ends_with('/');
    let (root, first, rest) = if let Some(rest) = dest.strip_prefix("${NOMAD_TASK_DIR}") {
        (Root::Task, Some("local"), rest)
    } else if let Some(rest) = dest.strip_prefix("${NOMAD_SECRETS_DIR}") {
        (Root::Task, Some("secrets"), rest)
    } else if let Some(rest) = dest.strip_prefix("${NOMAD_ALLOC_DIR}") {
        (Root::Alloc, None, rest)
    } else {
        (Root::Task, None, dest)
    };
    if rest.contains("${") {
        return Err(format!(
            "{dest:?}: only ${{NOMAD_TASK_DIR}}, ${{NOMAD_SECRETS_DIR}} or ${{NOMAD_ALLOC_DIR}} \
             may start a destination; no other interpolation"
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(format!(
                    "{dest:?} has a `..` component: destinations stay inside the task directory"
                ));
            }
            c => parts.push(c),
        }
    }
    let mut root = root;
    let mut rel = PathBuf::new();
    if let Some(first) = first {
        rel.push(first);
    } else if root == Root::Task {
        match parts.first() {
            Some(&"alloc") => {
                root = Root::Alloc;
                parts.remove(0);
            }
            Some(top) if TASK_SUBDIRS.contains(top) => {}
            _ => {
                return Err(format!(
                    "{dest:?} is not inside the task's local/, secrets/ or tmp/, or the \
                     shared alloc/ directory"
                ));
            }
        }
    }
    rel.extend(parts);
    Ok(TaskPath {
        root,
        rel,
        trailing_slash,
    })
}

/// Check an artifact URL: `http://` or `https://` with a host; go-getter's other
/// schemes and forced getters (`git::`, `s3::`, `file://`, a bare path) are refused.
///
/// ```
/// use drover_server_api::taskfiles::check_source;
/// check_source("https://example.com/app.tar.gz").unwrap();
/// assert!(check_source("file:///etc/passwd").unwrap_err().contains("http"));
/// assert!(check_source("git::https://example.com/r.git").is_err());
/// ```
pub fn check_source(source: &str) -> Result<(), String> {
    if source.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if source.len() > MAX_SOURCE_LEN {
        return Err(format!("{} bytes, at most {MAX_SOURCE_LEN}", source.len()));
    }
    let lower = source.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(|| {
            format!(
                "{source:?}: only http:// and https:// URLs are fetched (go-getter's other \
                 sources, file://, git::, s3:: ..., are not supported)"
            )
        })?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("{source:?}: the URL has no host"));
    }
    if source.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{source:?}: the URL has white space or control characters"
        ));
    }
    Ok(())
}

/// A checksum an artifact must match (go-getter's `checksum` option).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    /// `md5`, `sha256` or `sha512`.
    pub kind: ChecksumKind,
    /// The expected digest.
    pub digest: Vec<u8>,
}

/// The digests understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumKind {
    /// MD5 (16 bytes).
    Md5,
    /// SHA-256 (32 bytes).
    Sha256,
    /// SHA-512 (64 bytes).
    Sha512,
}

impl ChecksumKind {
    /// The name as go-getter writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumKind::Md5 => "md5",
            ChecksumKind::Sha256 => "sha256",
            ChecksumKind::Sha512 => "sha512",
        }
    }
}

/// Parse `type:hex` (`sha256:0a1b...`).
///
/// ```
/// use drover_server_api::taskfiles::{parse_checksum, ChecksumKind};
/// let c = parse_checksum(&format!("sha256:{}", "ab".repeat(32))).unwrap();
/// assert_eq!(c.kind, ChecksumKind::Sha256);
/// assert!(parse_checksum("sha256:abc").is_err());
/// assert!(parse_checksum("crc32:00000000").is_err());
/// ```
pub fn parse_checksum(text: &str) -> Result<Checksum, String> {
    let (kind, hex) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: write TYPE:HEX, e.g. sha256:0a1b..."))?;
    let kind = match kind.to_ascii_lowercase().as_str() {
        "md5" => ChecksumKind::Md5,
        "sha256" => ChecksumKind::Sha256,
        "sha512" => ChecksumKind::Sha512,
        other => {
            return Err(format!(
                "checksum type {other:?} is not supported (md5, sha256 or sha512)"
            ));
        }
    };
    let want = match kind {
        ChecksumKind::Md5 => 16,
        ChecksumKind::Sha256 => 32,
        ChecksumKind::Sha512 => 64,
    };
    let digest = decode_hex(hex).ok_or_else(|| format!("{hex:?} is not hexadecimal"))?;
    if digest.len() != want {
        return Err(format!(
            "a {} digest is {} hex digits, got {}",
            kind.as_str(),
            want * 2,
            hex.len()
        ));
    }
    Ok(Checksum { kind, digest })
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Whether the artifact is unpacked (go-getter's `archive` option; default yes).
pub fn archive_option(
    options: &std::collections::BTreeMap<String, String>,
) -> Result<bool, String> {
    match options.get("archive").map(String::as_str) {
        None | Some("") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(format!(
            "archive = {other:?}: only \"false\" (do not unpack) or \"true\" is understood"
        )),
    }
}

/// The permission bits of `perms` (octal, `"644"` or `"0644"`): at most `0777`, so no
/// setuid, setgid or sticky bit.
///
/// ```
/// use drover_server_api::taskfiles::parse_perms;
/// assert_eq!(parse_perms("0644"), Ok(0o644));
/// assert!(parse_perms("4755").is_err());
/// assert!(parse_perms("rw").is_err());
/// ```
pub fn parse_perms(perms: &str) -> Result<u32, String> {
    let bits = u32::from_str_radix(perms, 8)
        .map_err(|_| format!("{perms:?} is not an octal mode like \"644\""))?;
    if bits > 0o777 {
        return Err(format!(
            "{perms:?}: at most 0777 (no setuid, setgid or sticky bit)"
        ));
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_stay_inside_the_task_dir() {
        for (dest, root, rel) in [
            ("local/", Root::Task, "local"),
            ("local/app", Root::Task, "local/app"),
            ("/local/app", Root::Task, "local/app"),
            ("./secrets/x.env", Root::Task, "secrets/x.env"),
            ("${NOMAD_SECRETS_DIR}/x.env", Root::Task, "secrets/x.env"),
            ("${NOMAD_TASK_DIR}", Root::Task, "local"),
            ("alloc/data/x", Root::Alloc, "data/x"),
            ("${NOMAD_ALLOC_DIR}/data", Root::Alloc, "data"),
            ("tmp//a/./b", Root::Task, "tmp/a/b"),
        ] {
            let p = task_path(dest).unwrap_or_else(|e| panic!("{dest}: {e}"));
            assert_eq!((p.root, p.rel.to_str().unwrap()), (root, rel), "{dest}");
        }
        assert!(task_path("local/").unwrap().trailing_slash);
        assert!(task_path("secrets/a").unwrap().is_secret());
        assert!(!task_path("local/secrets").unwrap().is_secret());
        for bad in [
            "../x",
            "local/../../x",
            "${NOMAD_TASK_DIR}/../../etc",
            "/etc/passwd",
            "logs/stdout.0",
            "",
            "x",
            "local/${HOME}",
            "local/a\0b",
        ] {
            assert!(task_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sources_are_http_only() {
        check_source("http://127.0.0.1:8000/a.tar.gz").unwrap();
        check_source("HTTPS://example.com/a?x=1").unwrap();
        for bad in [
            "",
            "file:///etc/passwd",
            "/etc/passwd",
            "s3::https://bucket/x",
            "git@github.com:a/b.git",
            "http:///nohost",
            "ftp://example.com/x",
            "http://exa mple.com/",
        ] {
            assert!(check_source(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn checksums_and_perms() {
        assert_eq!(
            parse_checksum(&format!("md5:{}", "0f".repeat(16)))
                .unwrap()
                .kind,
            ChecksumKind::Md5
        );
        assert_eq!(
            parse_checksum(&format!("SHA512:{}", "0f".repeat(64)))
                .unwrap()
                .kind,
            ChecksumKind::Sha512
        );
        assert!(parse_checksum(&format!("sha256:{}", "zz".repeat(32))).is_err());
        assert!(parse_checksum("sha256").is_err());
        assert_eq!(parse_perms("600"), Ok(0o600));
        assert!(parse_perms("1777").is_err());
        assert!(parse_perms("999").is_err());
        let mut o = std::collections::BTreeMap::new();
        assert_eq!(archive_option(&o), Ok(true));
        o.insert("archive".into(), "false".into());
        assert_eq!(archive_option(&o), Ok(false));
        o.insert("archive".into(), "zip".into());
        assert!(archive_option(&o).is_err());
    }
}
