//! Unpacking a downloaded archive (tar, tar.gz, zip, gz) into a directory of the task,
//! when the archive is hostile.
//!
//! The rules, checked for every entry in a first pass that writes nothing, so that a
//! refused archive leaves no file at all:
//!
//! - a name that is absolute, or has a `..` component, is refused;
//! - only regular files and directories are unpacked: symbolic links and hard links
//!   are refused whatever they point at (the simplest rule that cannot be got wrong:
//!   a link inside the archive could otherwise be written through by a later entry),
//!   and so are device nodes, FIFOs and anything else;
//! - the permission bits keep only `0o777`: setuid, setgid and sticky are dropped;
//!   owners are not restored (the agent's user owns what it writes);
//! - at most [`UnpackLimits::max_entries`] entries and
//!   [`UnpackLimits::max_bytes`] bytes: the declared sizes are summed in the first
//!   pass, and the bytes really written are counted in the second (a zip's declared
//!   size may lie), so a compression bomb stops at the cap whatever its ratio.
//!
//! Every directory and file is made through [`Dir`], beneath the destination's
//! descriptor, never following a link: a link the task planted where an entry goes is
//! refused, not written through.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use drover_plugin_sdk::taskdir::{Dir, FileKind, OpenOptions};

/// The archive formats unpacked, told by the file name (go-getter's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `.tar`
    Tar,
    /// `.tar.gz`, `.tgz`
    TarGz,
    /// `.zip`
    Zip,
    /// `.gz` (one compressed file)
    Gz,
}

/// The format of an archive named `name` (the last segment of its URL's path), `None`
/// for a plain file; an archive format Drover does not unpack is an error (rather
/// than a file silently left packed).
pub(crate) fn format_of(name: &str) -> Result<Option<Format>, String> {
    let lower = name.to_ascii_lowercase();
    let format = if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
        Format::TarGz
    } else if lower.ends_with(".tar") {
        Format::Tar
    } else if lower.ends_with(".zip") {
        Format::Zip
    } else if lower.ends_with(".gz") {
        Format::Gz
    } else {
        for ext in [
            ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tzst", ".bz2", ".xz", ".zst",
        ] {
            if lower.ends_with(ext) {
                return Err(format!(
                    "{name:?}: {ext} archives are not unpacked (tar, tar.gz, tgz, zip and gz \
                     are); set options {{ archive = \"false\" }} to keep the file as it is"
                ));
            }
        }
        return Ok(None);
    };
    Ok(Some(format))
}

/// Bounds of one unpacking.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnpackLimits {
    /// Most bytes written, all files together.
    pub max_bytes: u64,
    /// Most entries (files and directories).
    pub max_entries: u64,
}

/// Why an archive was not unpacked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnpackError {
    /// An entry broke a rule (see the module docs).
    #[error("archive entry {entry:?}: {why}")]
    Entry {
        /// The entry's name as the archive has it.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
    /// More bytes than [`UnpackLimits::max_bytes`].
    #[error(
        "the archive unpacks to more than {max} bytes (the agent's artifact.max_unpacked_bytes)"
    )]
    TooLarge {
        /// The cap.
        max: u64,
    },
    /// More entries than [`UnpackLimits::max_entries`].
    #[error("the archive has more than {max} entries (the agent's artifact.max_entries)")]
    TooManyEntries {
        /// The cap.
        max: u64,
    },
    /// The archive could not be read (corrupt, truncated, an unsupported method).
    #[error("cannot read the archive: {0}")]
    Read(String),
    /// Writing into the task directory failed (a planted link is refused here).
    #[error("cannot write {path}: {err}")]
    Write {
        /// The path, relative to the destination.
        path: String,
        /// What happened.
        err: io::Error,
    },
}

fn entry_err(entry: &[u8], why: impl Into<String>) -> UnpackError {
    UnpackError::Entry {
        entry: String::from_utf8_lossy(entry).into_owned(),
        why: why.into(),
    }
}

fn write_err(path: &Path, err: io::Error) -> UnpackError {
    UnpackError::Write {
        path: path.display().to_string(),
        err,
    }
}

/// What an entry is, once checked.
enum Item {
    Dir { mode: u32 },
    File { mode: u32, size: u64 },
}

/// The entry name `raw` as a clean relative path (`None`: the destination itself,
/// e.g. `./`).
fn clean_name(raw: &[u8]) -> Result<Option<PathBuf>, UnpackError> {
    use std::os::unix::ffi::OsStrExt as _;
    if raw.contains(&0) {
        return Err(entry_err(raw, "the name holds a NUL byte"));
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(raw));
    let mut clean = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => clean.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(entry_err(
                    raw,
                    "an absolute path; entries must be relative to the destination",
                ));
            }
            Component::ParentDir => {
                return Err(entry_err(
                    raw,
                    "a `..` component; entries must stay inside the destination",
                ));
            }
        }
    }
    Ok((!clean.as_os_str().is_empty()).then_some(clean))
}

/// Counts entries and bytes against the limits.
struct Budget {
    limits: UnpackLimits,
    entries: u64,
    bytes: u64,
}

impl Budget {
    fn new(limits: UnpackLimits) -> Self {
        Budget {
            limits,
            entries: 0,
            bytes: 0,
        }
    }
    fn entry(&mut self) -> Result<(), UnpackError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(UnpackError::TooManyEntries {
                max: self.limits.max_entries,
            });
        }
        Ok(())
    }
    fn remaining(&self) -> u64 {
        self.limits.max_bytes.saturating_sub(self.bytes)
    }
    fn declare(&mut self, size: u64) -> Result<(), UnpackError> {
        if size > self.remaining() {
            return Err(UnpackError::TooLarge {
                max: self.limits.max_bytes,
            });
        }
        self.bytes += size;
        Ok(())
    }
}

/// What was unpacked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpacked {
    /// Regular files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// Unpack `archive` (read from its start) as `format` into `dest`. `gz_name` is the
/// file a `.gz` becomes (its name less `.gz`).
pub(crate) fn unpack(
    archive: &mut File,
    format: Format,
    gz_name: &str,
    dest: &Dir,
    limits: UnpackLimits,
) -> Result<Unpacked, UnpackError> {
    match format {
        Format::Tar | Format::TarGz => {
            // First pass: every entry checked, nothing written.
            rewind(archive)?;
            tar_entries(archive, format, limits, None)?;
            rewind(archive)?;
            tar_entries(archive, format, limits, Some(dest))
        }
        Format::Zip => unzip(archive, limits, dest),
        Format::Gz => {
            rewind(archive)?;
            let name = clean_name(gz_name.as_bytes())?
                .ok_or_else(|| entry_err(gz_name.as_bytes(), "no file name"))?;
            let mut budget = Budget::new(limits);
            budget.entry()?;
            let mut reader = flate2::read::GzDecoder::new(io::BufReader::new(&*archive));
            let bytes = write_file(dest, &name, 0o644, &mut reader, &mut budget)?;
            Ok(Unpacked { files: 1, bytes })
        }
    }
}

fn rewind(f: &mut File) -> Result<(), UnpackError> {
    f.seek(SeekFrom::Start(0))
        .map(|_| ())
        .map_err(|e| UnpackError::Read(e.to_string()))
}

fn read_err(e: impl std::fmt::Display) -> UnpackError {
    UnpackError::Read(e.to_string())
}

/// One pass over a tar archive: checks only (`dest` None) or checks and writes.
fn tar_entries(
    archive: &File,
    format: Format,
    limits: UnpackLimits,
    dest: Option<&Dir>,
) -> Result<Unpacked, UnpackError> {
    let reader: Box<dyn Read + '_> = match format {
        Format::TarGz => Box::new(flate2::read::GzDecoder::new(io::BufReader::new(archive))),
        _ => Box::new(io::BufReader::new(archive)),
    };
    let mut tar = tar::Archive::new(reader);
    let mut budget = Budget::new(limits);
    let mut done = Unpacked::default();
    for entry in tar.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let raw = entry.path_bytes().into_owned();
        let header = entry.header();
        use tar::EntryType as T;
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o777;
        let item = match kind {
            T::Regular | T::Continuous => Item::File {
                mode,
                size: entry.size(),
            },
            T::Directory => Item::Dir { mode },
            // pax global headers carry only metadata.
            T::XGlobalHeader => continue,
            T::Symlink | T::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                let what = if kind == T::Symlink {
                    "a symbolic link"
                } else {
                    "a hard link"
                };
                return Err(entry_err(
                    &raw,
                    format!("{what} (to {target:?}); links are never unpacked"),
                ));
            }
            T::Char => return Err(entry_err(&raw, "a character device; not unpacked")),
            T::Block => return Err(entry_err(&raw, "a block device; not unpacked")),
            T::Fifo => return Err(entry_err(&raw, "a named pipe; not unpacked")),
            other => {
                return Err(entry_err(
                    &raw,
                    format!(
                        "an entry of type {:?}; only files and directories are unpacked",
                        other.as_byte() as char
                    ),
                ));
            }
        };
        budget.entry()?;
        let Some(name) = clean_name(&raw)? else {
            continue;
        };
        match item {
            Item::Dir { mode } => {
                if let Some(dest) = dest {
                    make_dir(dest, &name, mode)?;
                }
            }
            Item::File { mode, size } => match dest {
                None => budget.declare(size)?,
                Some(dest) => {
                    done.bytes += write_file(dest, &name, mode, &mut entry, &mut budget)?;
                    done.files += 1;
                }
            },
        }
    }
    Ok(done)
}

/// A zip archive: the central directory is checked first (names, kinds, declared
/// sizes), then every file is written with the bytes counted.
fn unzip(archive: &mut File, limits: UnpackLimits, dest: &Dir) -> Result<Unpacked, UnpackError> {
    rewind(archive)?;
    let mut zip = zip::ZipArchive::new(io::BufReader::new(&*archive)).map_err(read_err)?;
    if zip.len() as u64 > limits.max_entries {
        return Err(UnpackError::TooManyEntries {
            max: limits.max_entries,
        });
    }
    let mut items = Vec::with_capacity(zip.len());
    let mut budget = Budget::new(limits);
    for i in 0..zip.len() {
        let f = zip.by_index_raw(i).map_err(read_err)?;
        let raw = f.name_raw().to_vec();
        budget.entry()?;
        if f.encrypted() {
            return Err(entry_err(&raw, "encrypted; not unpacked"));
        }
        let mode = f.unix_mode();
        let item = match mode.map(|m| m & 0o170000) {
            _ if f.is_symlink() => {
                return Err(entry_err(&raw, "a symbolic link; links are never unpacked"));
            }
            Some(0o020000) => return Err(entry_err(&raw, "a character device; not unpacked")),
            Some(0o060000) => return Err(entry_err(&raw, "a block device; not unpacked")),
            Some(0o010000) => return Err(entry_err(&raw, "a named pipe; not unpacked")),
            Some(0o140000) => return Err(entry_err(&raw, "a socket; not unpacked")),
            _ if f.is_dir() => Item::Dir {
                mode: mode.map_or(0o755, |m| m & 0o777),
            },
            Some(0) | Some(0o100000) | None => Item::File {
                mode: mode.map_or(0o644, |m| m & 0o777),
                size: f.size(),
            },
            Some(other) => {
                return Err(entry_err(
                    &raw,
                    format!("unknown file type {other:o}; only files and directories are unpacked"),
                ));
            }
        };
        if let Item::File { size, .. } = item {
            budget.declare(size)?;
        }
        items.push((clean_name(&raw)?, item));
    }
    let mut budget = Budget::new(limits);
    let mut done = Unpacked::default();
    for (i, (name, item)) in items.into_iter().enumerate() {
        let Some(name) = name else { continue };
        match item {
            Item::Dir { mode } => {
                make_dir(dest, &name, mode)?;
            }
            Item::File { mode, .. } => {
                let mut f = zip.by_index(i).map_err(read_err)?;
                done.bytes += write_file(dest, &name, mode, &mut f, &mut budget)?;
                done.files += 1;
            }
        }
    }
    Ok(done)
}

/// The directory `rel` beneath `dest` (and its parents), never through a link. The
/// agent keeps the right to write into what it makes (`0o700` at least).
fn make_dir(dest: &Dir, rel: &Path, mode: u32) -> Result<Dir, UnpackError> {
    dest.create_dir_all(rel, (mode & 0o777) | 0o700)
        .map_err(|e| write_err(rel, e))
}

/// Write `reader` to the file `rel` beneath `dest` with permission bits `mode`,
/// counting the bytes against `budget`. What is there already: a regular file is
/// replaced, a directory is an error, a link (or anything else) is refused, not
/// followed.
pub(crate) fn write_file(
    dest: &Dir,
    rel: &Path,
    mode: u32,
    reader: &mut dyn Read,
    budget_or_cap: &mut dyn Cap,
) -> Result<u64, UnpackError> {
    write_file_owned(dest, rel, mode, reader, budget_or_cap, None)
}

/// [`write_file`], the file given to `owner` (through the descriptor opened, never
/// by path) when there is one.
pub(crate) fn write_file_owned(
    dest: &Dir,
    rel: &Path,
    mode: u32,
    reader: &mut dyn Read,
    budget_or_cap: &mut dyn Cap,
    owner: Option<crate::allocs::task_user::Owner>,
) -> Result<u64, UnpackError> {
    let (Some(name), parent) = (rel.file_name(), rel.parent()) else {
        return Err(write_err(rel, io::Error::other("no file name")));
    };
    let dir = match parent {
        Some(p) if !p.as_os_str().is_empty() => make_dir(dest, p, 0o755)?,
        _ => dest.open_dir("").map_err(|e| write_err(rel, e))?,
    };
    match dir.metadata(name) {
        // Replaced below, at once (a rendered template the task may be reading).
        Ok(m) if m.kind == FileKind::File => {}
        Ok(m) => {
            return Err(write_err(
                rel,
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is there already (planted?); it is not replaced or followed",
                        m.kind
                    ),
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(write_err(rel, e)),
    }
    // Written beside it under a temporary name, then renamed over it: a reader (the
    // running task, for a re-rendered template) sees the old file or the new one,
    // never a missing or half-written one.
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".drover-new");
    let tmp = Path::new(&tmp_name);
    match dir.metadata(tmp) {
        // A leftover of a write that failed (or the task's own file of that name).
        Ok(m) if m.kind == FileKind::File || m.kind == FileKind::Symlink => {
            dir.remove_file(tmp).map_err(|e| write_err(rel, e))?;
        }
        _ => {}
    }
    let written = (|| {
        let mut out = dir
            .open_file(
                tmp,
                &OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .create(mode & 0o777)
                    .single_link(true),
            )
            .map_err(|e| write_err(rel, e))?;
        if let Some(owner) = owner {
            owner.give(&out).map_err(|e| write_err(rel, e))?;
        }
        let cap = budget_or_cap.remaining();
        let written = io::copy(&mut reader.take(cap.saturating_add(1)), &mut out)
            .map_err(|e| UnpackError::Read(format!("{}: {e}", rel.display())))?;
        if written > cap {
            return Err(budget_or_cap.too_large());
        }
        // Exactly `mode`, whatever was there before.
        use std::os::unix::fs::PermissionsExt as _;
        out.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| write_err(rel, e))?;
        dir.rename(tmp, name).map_err(|e| write_err(rel, e))?;
        Ok(written)
    })();
    match written {
        Ok(n) => {
            budget_or_cap.spend(n);
            Ok(n)
        }
        Err(e) => {
            let _ = dir.remove_file(tmp);
            Err(e)
        }
    }
}

/// A byte budget [`write_file`] spends from.
pub(crate) trait Cap {
    /// Bytes left.
    fn remaining(&self) -> u64;
    /// `n` bytes were written.
    fn spend(&mut self, n: u64);
    /// The error of going over.
    fn too_large(&self) -> UnpackError;
}

impl Cap for Budget {
    fn remaining(&self) -> u64 {
        Budget::remaining(self)
    }
    fn spend(&mut self, n: u64) {
        self.bytes += n;
    }
    fn too_large(&self) -> UnpackError {
        UnpackError::TooLarge {
            max: self.limits.max_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A file written again is replaced at once: a reader polling it (a task reading
    /// its re-rendered template) never finds it missing or empty, and no temporary
    /// file is left beside it.
    #[test]
    fn a_file_written_again_is_never_missing_to_a_reader() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        let write = |text: &str| {
            let mut budget = Budget::new(LIMITS);
            write_file(
                &dir,
                Path::new("app.env"),
                0o600,
                &mut text.as_bytes(),
                &mut budget,
            )
            .unwrap();
        };
        write("A=0\n");
        let path = tmp.path().join("app.env");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 100 {
                    let text = std::fs::read_to_string(&path).expect("the file is always there");
                    assert!(text.starts_with("A="), "a reader saw {text:?}");
                    reads += 1;
                }
                reads
            })
        };
        for i in 1..300 {
            write(&format!("A={i}\n"));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().expect("the reader never failed") >= 100);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "A=299\n");
        assert_eq!(
            dir.entries().unwrap(),
            [std::ffi::OsString::from("app.env")]
        );
        assert_eq!(dir.metadata("app.env").unwrap().mode, 0o600);
    }

    const LIMITS: UnpackLimits = UnpackLimits {
        max_bytes: 1 << 20,
        max_entries: 100,
    };

    /// A tar with the given headers; `kind` per entry, data for regular files.
    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            // Names written raw: the builder's own checks would refuse `..`.
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_entry_type(*kind);
            h.set_mode(0o4755);
            h.set_size(data.len() as u64);
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn file_of(dir: &Path, bytes: &[u8]) -> File {
        let p = dir.join("archive");
        std::fs::write(&p, bytes).unwrap();
        File::open(p).unwrap()
    }

    /// A fresh destination `dest/` beside a sentinel directory `outside/`.
    fn setup() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("dest")).unwrap();
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        let d = Dir::open(tmp.path().join("dest")).unwrap();
        (tmp, d)
    }

    fn empty(p: &Path) -> bool {
        std::fs::read_dir(p).unwrap().next().is_none()
    }

    #[test]
    fn a_tar_gz_unpacks_files_and_dirs_dropping_setuid() {
        let (tmp, dest) = setup();
        let t = tar_of(&[
            ("app/", tar::EntryType::Directory, b"", None),
            ("app/hello.txt", tar::EntryType::Regular, b"hello\n", None),
            ("./top", tar::EntryType::Regular, b"t", None),
        ]);
        let mut f = file_of(tmp.path(), &gz(&t));
        let done = unpack(&mut f, Format::TarGz, "", &dest, LIMITS).unwrap();
        assert_eq!(done, Unpacked { files: 2, bytes: 7 });
        let hello = tmp.path().join("dest/app/hello.txt");
        assert_eq!(std::fs::read_to_string(&hello).unwrap(), "hello\n");
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&hello).unwrap().mode() & 0o7777, 0o755);
        assert!(tmp.path().join("dest/top").is_file());
    }

    #[test]
    fn hostile_tars_are_refused_naming_the_entry_and_nothing_is_written() {
        use tar::EntryType as T;
        let cases: Vec<(Vec<u8>, &str, &str)> = vec![
            (
                tar_of(&[
                    ("ok", T::Regular, b"x", None),
                    ("../outside/evil", T::Regular, b"x", None),
                ]),
                "../outside/evil",
                "..",
            ),
            (
                tar_of(&[("/tmp/evil", T::Regular, b"x", None)]),
                "/tmp/evil",
                "absolute",
            ),
            (
                tar_of(&[("link", T::Symlink, b"", Some("../outside"))]),
                "link",
                "symbolic link",
            ),
            (
                tar_of(&[("hard", T::Link, b"", Some("../outside/x"))]),
                "hard",
                "hard link",
            ),
            (
                tar_of(&[("null", T::Char, b"", None)]),
                "null",
                "character device",
            ),
            (tar_of(&[("p", T::Fifo, b"", None)]), "p", "named pipe"),
        ];
        for (bytes, entry, why) in cases {
            let (tmp, dest) = setup();
            let mut f = file_of(tmp.path(), &gz(&bytes));
            let e = unpack(&mut f, Format::TarGz, "", &dest, LIMITS).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains(entry) && text.contains(why),
                "{entry}: {text}"
            );
            assert!(
                empty(&tmp.path().join("dest")),
                "{entry}: something was written"
            );
            assert!(
                empty(&tmp.path().join("outside")),
                "{entry}: written outside"
            );
        }
    }

    #[test]
    fn size_and_entry_bombs_stop_at_the_caps() {
        let (tmp, dest) = setup();
        // 4 MiB of zeros compress to a few KiB; the cap is 1 MiB.
        let t = tar_of(&[("zeros", tar::EntryType::Regular, &vec![0u8; 4 << 20], None)]);
        let mut f = file_of(tmp.path(), &gz(&t));
        assert!(f.metadata().unwrap().len() < 64 * 1024);
        let e = unpack(&mut f, Format::TarGz, "", &dest, LIMITS).unwrap_err();
        assert!(matches!(e, UnpackError::TooLarge { .. }), "{e}");
        assert!(empty(&tmp.path().join("dest")));

        let names: Vec<String> = (0..101).map(|i| format!("f{i}")).collect();
        let entries: Vec<_> = names
            .iter()
            .map(|n| (n.as_str(), tar::EntryType::Regular, &b""[..], None))
            .collect();
        let mut f = file_of(tmp.path(), &tar_of(&entries));
        let e = unpack(&mut f, Format::Tar, "", &dest, LIMITS).unwrap_err();
        assert!(matches!(e, UnpackError::TooManyEntries { .. }), "{e}");
        assert!(empty(&tmp.path().join("dest")));

        // A single gz: only counted while writing.
        let mut f = file_of(tmp.path(), &gz(&vec![0u8; 4 << 20]));
        let e = unpack(&mut f, Format::Gz, "zeros", &dest, LIMITS).unwrap_err();
        assert!(matches!(e, UnpackError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn a_planted_link_in_the_destination_is_not_followed() {
        let (tmp, dest) = setup();
        let outside = tmp.path().join("outside");
        std::os::unix::fs::symlink(&outside, tmp.path().join("dest/app")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), tmp.path().join("dest/f")).unwrap();
        for (name, entry) in [("app/x", "app"), ("f", "f")] {
            let t = tar_of(&[(name, tar::EntryType::Regular, b"x", None)]);
            let mut f = file_of(tmp.path(), &t);
            let e = unpack(&mut f, Format::Tar, "", &dest, LIMITS).unwrap_err();
            assert!(e.to_string().contains(entry), "{e}");
            assert!(empty(&outside), "written through the link {entry}");
        }
    }

    fn zip_of(build: impl FnOnce(&mut zip::ZipWriter<io::Cursor<Vec<u8>>>)) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        build(&mut w);
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn zips_unpack_and_hostile_ones_are_refused() {
        use zip::write::SimpleFileOptions as O;
        let good = zip_of(|w| {
            w.add_directory("d/", O::default()).unwrap();
            w.start_file("d/a.txt", O::default().unix_permissions(0o4644))
                .unwrap();
            w.write_all(b"zip!").unwrap();
        });
        let (tmp, dest) = setup();
        let mut f = file_of(tmp.path(), &good);
        unpack(&mut f, Format::Zip, "", &dest, LIMITS).unwrap();
        let a = tmp.path().join("dest/d/a.txt");
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "zip!");
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o7777, 0o644);

        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                zip_of(|w| {
                    w.start_file("../outside/evil", O::default()).unwrap();
                    w.write_all(b"x").unwrap();
                }),
                "..",
            ),
            (
                zip_of(|w| {
                    w.start_file("/abs", O::default()).unwrap();
                    w.write_all(b"x").unwrap();
                }),
                "absolute",
            ),
            (
                zip_of(|w| {
                    w.add_symlink("l", "../outside", O::default()).unwrap();
                }),
                "symbolic link",
            ),
            (
                zip_of(|w| {
                    w.start_file("big", O::default()).unwrap();
                    w.write_all(&vec![0u8; 2 << 20]).unwrap();
                }),
                "more than",
            ),
        ];
        for (bytes, why) in cases {
            let (tmp, dest) = setup();
            let mut f = file_of(tmp.path(), &bytes);
            let e = unpack(&mut f, Format::Zip, "", &dest, LIMITS).unwrap_err();
            assert!(e.to_string().contains(why), "{why}: {e}");
            assert!(empty(&tmp.path().join("dest")), "{why}: written");
            assert!(empty(&tmp.path().join("outside")), "{why}: written outside");
        }
    }

    #[test]
    fn formats_by_name() {
        assert_eq!(format_of("a.tar.gz"), Ok(Some(Format::TarGz)));
        assert_eq!(format_of("A.TGZ"), Ok(Some(Format::TarGz)));
        assert_eq!(format_of("a.tar"), Ok(Some(Format::Tar)));
        assert_eq!(format_of("a.zip"), Ok(Some(Format::Zip)));
        assert_eq!(format_of("a.gz"), Ok(Some(Format::Gz)));
        assert_eq!(format_of("a.bin"), Ok(None));
        assert!(
            format_of("a.tar.xz")
                .unwrap_err()
                .contains("archive = \"false\"")
        );
    }
}
