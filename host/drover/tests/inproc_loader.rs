//! The agent's loader and driver libraries, in this test process: a library is mapped
//! once however often its plugin is started again, bytes that change between their
//! check and their load are not loaded, and bytes that failed once they were mapped
//! are not mapped again.
//!
//! Each test gives its library bytes of its own (a trailer after the ELF image, which
//! the dynamic linker never reads), because the loader keeps libraries by sha256 for
//! the life of the process, and the tests of this binary share one process.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::inproc::{built_library, gcc_library};
use drover_host::loader::{self, Binary, Candidate, CandidateKind, Policy};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A plugin dir holding a copy of `library` named `file_name`, with `trailer` after
/// its bytes.
fn plugin_dir_with(library: &Path, file_name: &str, trailer: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut bytes = std::fs::read(library).unwrap();
    bytes.extend_from_slice(trailer.as_bytes());
    let path = plugins.join(file_name);
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, plugins)
}

/// The one candidate in `plugins`, a library.
fn only_candidate(plugins: &Path) -> Candidate {
    let (mut candidates, skipped) = loader::scan_plugin_dir(plugins);
    assert!(skipped.is_empty(), "{skipped:#?}");
    assert_eq!(candidates.len(), 1, "{candidates:#?}");
    let c = candidates.remove(0);
    assert_eq!(c.kind(), CandidateKind::Library);
    c
}

/// The fixture library as `fixture-library.so`, with bytes of its own (`trailer`), as
/// the one candidate of a plugin dir; `None` when it was not built.
fn fixture_candidate(trailer: &str) -> Option<(tempfile::TempDir, PathBuf, Candidate)> {
    let fixture = built_library("drover-fixture-library")?;
    let (dir, plugins) = plugin_dir_with(&fixture, "fixture-library.so", trailer);
    let c = only_candidate(&plugins);
    Some((dir, plugins, c))
}

/// Open and check the candidate's file as the catalog does before every load, and
/// hash the bytes behind the descriptor.
fn checked(c: &Candidate) -> Binary {
    let (fd, _) = loader::open_checked(c).unwrap_or_else(|e| panic!("{e}"));
    let sha256 = loader::sha256_fd(&fd).unwrap();
    Binary {
        fd: Arc::new(fd),
        sha256,
    }
}

async fn fingerprint(
    c: &Candidate,
    binary: &Binary,
    dir: &Path,
) -> Result<loader::Fingerprinted, String> {
    let policy = Policy {
        in_process: [c.label.clone()].into(),
        ..Policy::default()
    };
    policy.before_exec(c, &binary.sha256)?;
    loader::fingerprint(
        c,
        binary,
        TIMEOUT,
        dir,
        &drover_plugin_sdk::version::supported_api_range(),
    )
    .await
}

/// The reason [`fingerprint`] refuses `c`.
async fn refusal(c: &Candidate, binary: &Binary, dir: &Path) -> String {
    match fingerprint(c, binary, dir).await {
        Ok(fp) => panic!("{} was loaded: {:?}", c.path.display(), fp.info),
        Err(reason) => reason,
    }
}

/// How many distinct sealed copies named `label` this process has mapped.
fn mapped_copies(label: &str) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = format!("/memfd:{label} ");
    let inodes: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter(|l| l.contains(&name))
        .filter_map(|l| l.split_whitespace().nth(4))
        .collect();
    inodes.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_is_mapped_once_and_restarted_when_its_plugin_starts_again() {
    let Some((dir, _plugins, c)) = fixture_candidate("restart test") else {
        return;
    };
    assert_eq!(c.label, "fixture-library");
    let fp = fingerprint(&c, &checked(&c), dir.path()).await.unwrap();
    assert_eq!(fp.info.name, "fixture-library");
    assert!(fp.process.in_process());
    assert_eq!(fp.process.pid(), None);
    assert_eq!(mapped_copies("fixture-library"), 1);

    // The same bytes again while they serve (a second file, a concurrent load): one
    // copy serves, the other is refused, and nothing more is mapped.
    let err = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        err.contains("is already loaded into the agent from")
            && err.contains("a library is loaded once"),
        "{err}"
    );
    assert_eq!(mapped_copies("fixture-library"), 1);

    // Stopped (a crash of its runtime, a shutdown), then started again as the
    // supervisor does: the same copy, with a fresh runtime that answers.
    fp.process.shutdown().await;
    assert!(fp.process.has_exited());
    let again = fingerprint(&c, &checked(&c), dir.path()).await.unwrap();
    assert!(!again.process.has_exited());
    assert_eq!(again.info.name, "fixture-library");
    assert!(again.process.client().capabilities().await.is_ok());
    assert_eq!(
        mapped_copies("fixture-library"),
        1,
        "a relaunch mapped the library again"
    );
    again.process.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_rewritten_between_their_check_and_their_load_are_not_loaded() {
    let Some((dir, plugins, c)) = fixture_candidate("rewrite test") else {
        return;
    };
    let binary = checked(&c);
    // The same inode, other bytes: what the descriptor now reads is not what was
    // checked (and pinned).
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(plugins.join("fixture-library.so"))
        .unwrap();
    std::io::Write::write_all(&mut file, b" and more").unwrap();
    drop(file);
    let err = refusal(&c, &binary, dir.path()).await;
    assert!(
        err.contains("changed while it was being loaded")
            && err.contains(&format!(
                "not to the {} that was checked; not loaded",
                binary.sha256
            )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_failed_once_mapped_are_not_mapped_again() {
    let build = tempfile::tempdir().unwrap();
    let Some(library) = gcc_library(
        build.path(),
        "noentry.so",
        "int not_a_drover_driver(void) { return 42; }\n",
    ) else {
        return;
    };
    let (dir, plugins) = plugin_dir_with(&library, "noentry.so", "");
    let c = only_candidate(&plugins);
    let first = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        first.contains("exports no `drover_plugin_entry_v1`"),
        "{first}"
    );
    assert_eq!(mapped_copies("noentry"), 1);
    let second = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        second.starts_with(&first) && second.contains("this agent does not load them again"),
        "{second}"
    );
    assert_eq!(
        mapped_copies("noentry"),
        1,
        "the failed bytes were mapped again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_too_large_to_keep_in_memory_is_not_copied() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o700)).unwrap();
    let big = std::fs::File::create(plugins.join("big.so")).unwrap();
    // Sparse: nothing is written, nothing is read before the refusal.
    big.set_len(loader::library::MAX_LIBRARY_BYTES + 1).unwrap();
    std::fs::set_permissions(
        plugins.join("big.so"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let c = only_candidate(&plugins);
    let (fd, _) = loader::open_checked(&c).unwrap();
    let binary = Binary {
        fd: Arc::new(fd),
        sha256: "0".repeat(64),
    };
    let err = refusal(&c, &binary, dir.path()).await;
    assert!(
        err.contains(&format!(
            "is {} bytes, more than the {} a driver library may have",
            loader::library::MAX_LIBRARY_BYTES + 1,
            loader::library::MAX_LIBRARY_BYTES
        )),
        "{err}"
    );
    assert_eq!(mapped_copies("big"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_serves_only_the_plugin_it_is_named_after() {
    let Some(fixture) = built_library("drover-fixture-library") else {
        return;
    };
    // `[plugin.renamed] in_process = true` allows the plugin "renamed", not whatever
    // the file turns out to be.
    let (dir, plugins) = plugin_dir_with(&fixture, "renamed.so", "rename test");
    let c = only_candidate(&plugins);
    assert_eq!(c.label, "renamed");
    let err = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        err.contains("renamed.so calls itself \"fixture-library\"")
            && err.contains("name it fixture-library.so and allow it with [plugin.fixture-library] in_process = true"),
        "{err}"
    );
}
