//! What the host refuses before it runs anything of a library, and the sealed copy it
//! loads from.

use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use drover_plugin_sdk::client::{InProcessOptions, InProcessPlugin, LoadError, sealed_copy};
use drover_plugin_sdk::inproc::{ABI_VERSION, EntryV1, StartArgs};

fn sealed(bytes: &[u8]) -> std::os::fd::OwnedFd {
    let mut f = tempfile::tempfile().expect("a temp file");
    f.write_all(bytes).expect("written");
    sealed_copy(&f.into(), "test").expect("a sealed copy")
}

#[tokio::test]
async fn bytes_that_are_no_shared_library_are_refused_naming_the_file() {
    let opts = InProcessOptions::new(
        "junk",
        sealed(b"#!/bin/sh\necho not a library\n"),
        "/plugins/junk.so",
    );
    match InProcessPlugin::load(opts).await {
        Err(e @ LoadError::Elf { .. }) => {
            let text = e.to_string();
            assert!(
                text.starts_with("/plugins/junk.so is not loaded: it is not a 64-bit ELF file"),
                "{text}"
            );
        }
        other => panic!(
            "expected an ELF refusal, got {:?}",
            other.map(|p| p.name().to_owned())
        ),
    }
}

/// Set if the version-2 table's `start` is ever called.
static V2_STARTED: AtomicBool = AtomicBool::new(false);

extern "C" fn v2_start(_: *const StartArgs) -> i32 {
    V2_STARTED.store(true, Ordering::SeqCst);
    0
}

static V2_TABLE: EntryV1 = {
    let mut table = EntryV1::new(v2_start);
    table.abi_version = ABI_VERSION + 1;
    table
};

extern "C" fn v2_entry() -> *const EntryV1 {
    &V2_TABLE
}

#[tokio::test]
async fn another_abi_version_is_refused_before_anything_in_it_is_called() {
    match InProcessPlugin::load_linked("v2", v2_entry, None, Duration::from_secs(5)).await {
        Err(LoadError::AbiVersion {
            found, expected, ..
        }) => {
            assert_eq!((found, expected), (ABI_VERSION + 1, ABI_VERSION));
        }
        other => panic!(
            "expected an ABI version error, got {:?}",
            other.map(|p| p.name().to_owned())
        ),
    }
    assert!(
        !V2_STARTED.load(Ordering::SeqCst),
        "start of a refused table was called"
    );
}

static SHORT_TABLE: EntryV1 = {
    let mut table = EntryV1::new(v2_start);
    table.size = 8;
    table
};

extern "C" fn short_entry() -> *const EntryV1 {
    &SHORT_TABLE
}

#[tokio::test]
async fn a_table_shorter_than_its_version_says_is_refused() {
    match InProcessPlugin::load_linked("short", short_entry, None, Duration::from_secs(5)).await {
        Err(LoadError::Start { reason, .. }) => {
            assert!(reason.contains("entry table is 8 bytes"), "{reason}")
        }
        other => panic!(
            "expected a start error, got {:?}",
            other.map(|p| p.name().to_owned())
        ),
    }
}

#[test]
fn a_sealed_copy_cannot_be_changed_by_anyone() {
    let fd = sealed(b"checked bytes");
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    assert_eq!(std::fs::read(&path).expect("readable"), b"checked bytes");
    // Even through a fresh writable open of the same file.
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(b"changed"))
        .expect_err("a sealed memfd refuses writes");
    assert_eq!(err.raw_os_error(), Some(nix::libc::EPERM), "{err}");
    let err = rustix::fs::ftruncate(&fd, 0).expect_err("a sealed memfd refuses shrinking");
    assert_eq!(err, rustix::io::Errno::PERM);
    assert_eq!(std::fs::read(&path).expect("readable"), b"checked bytes");
}
