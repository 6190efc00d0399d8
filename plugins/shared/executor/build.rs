//! The executor's build id: a hash of this crate's version and sources.
//!
//! A driver runs the dedicated `drover-executor` binary only when that binary carries
//! the same id as the driver's own copy of this crate: both then read and write the
//! same task files and speak the same socket protocol, byte for byte, and the binary
//! has the sandbox of the same build. A stale binary (an upgrade that replaced `drover`
//! but not `drover-executor`, or a dev build of another commit) carries another id and
//! is refused. Hashed: this crate's sources, those of the sandbox it runs
//! (`drover-isolation`) and of the SDK it links, the workspace's `Cargo.lock`, the
//! compiler's version and the profile. Hashing the sources rather than trusting the
//! version number means no one has to remember to bump anything.

use std::hash::{DefaultHasher, Hasher as _};
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    // This crate, the sandbox and the SDK (workspace paths; the sandbox crate depends
    // on this one, so it cannot add its own sources here).
    let trees = [
        manifest.join("src"),
        manifest.join("../isolation/src"),
        manifest.join("../../../plugin-sdk/src"),
    ];
    let lock = manifest.join("../../../Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
    for tree in &trees {
        println!("cargo:rerun-if-changed={}", tree.display());
    }
    println!("cargo:rerun-if-changed={}", lock.display());
    // SipHash with fixed keys: the same sources give the same id under one toolchain,
    // and a different toolchain at worst gives another id (a refusal, never a wrong
    // match between builds that differ).
    let mut hasher = DefaultHasher::new();
    hasher.write(env!("CARGO_PKG_VERSION").as_bytes());
    for tree in &trees {
        let mut files = Vec::new();
        collect(tree, &mut files);
        files.sort();
        for file in &files {
            let relative = file.strip_prefix(tree).unwrap_or(file);
            hasher.write(relative.as_os_str().as_encoded_bytes());
            hash_file(&mut hasher, file);
        }
    }
    if lock.exists() {
        hash_file(&mut hasher, &lock);
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    if let Ok(out) = std::process::Command::new(rustc).arg("-vV").output() {
        hasher.write(&out.stdout);
    }
    for var in ["PROFILE", "OPT_LEVEL", "TARGET"] {
        hasher.write(std::env::var(var).unwrap_or_default().as_bytes());
    }
    println!(
        "cargo:rustc-env=DROVER_EXECUTOR_BUILD_ID={}-{:016x}",
        env!("CARGO_PKG_VERSION"),
        hasher.finish()
    );
}

fn hash_file(hasher: &mut DefaultHasher, file: &Path) {
    match std::fs::read(file) {
        Ok(bytes) => hasher.write(&bytes),
        Err(e) => panic!("cannot read {}: {e}", file.display()),
    }
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
