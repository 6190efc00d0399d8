//! The executor's build id: a hash of this crate's version and sources.
//!
//! A driver runs the dedicated `drover-executor` binary only when that binary carries
//! the same id as the driver's own copy of this crate: both then read and write the
//! same task files and speak the same socket protocol, byte for byte. A stale binary
//! (an upgrade that replaced `drover` but not `drover-executor`, or a dev build of
//! another commit) carries another id and is refused. Hashing the sources rather than
//! trusting the version number means no one has to remember to bump anything.

use std::hash::{DefaultHasher, Hasher as _};
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let src = manifest.unwrap_or_default().join("src");
    let mut files = Vec::new();
    collect(&src, &mut files);
    files.sort();
    // SipHash with fixed keys: the same sources give the same id under one toolchain,
    // and a different toolchain at worst gives another id (a refusal, never a wrong
    // match between builds that differ).
    let mut hasher = DefaultHasher::new();
    hasher.write(env!("CARGO_PKG_VERSION").as_bytes());
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap_or(file);
        hasher.write(relative.as_os_str().as_encoded_bytes());
        match std::fs::read(file) {
            Ok(bytes) => hasher.write(&bytes),
            Err(e) => panic!("cannot read {}: {e}", file.display()),
        }
    }
    println!(
        "cargo:rustc-env=DROVER_EXECUTOR_BUILD_ID={}-{:016x}",
        env!("CARGO_PKG_VERSION"),
        hasher.finish()
    );
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => panic!("cannot list {}: {e}", dir.display()),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}
