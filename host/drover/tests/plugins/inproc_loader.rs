//! The agent's loader and driver libraries, in this test process: a library is mapped
//! once however often its plugin is started again, bytes that change between their
//! check and their load are not loaded, and bytes that failed once they were mapped
//! are not mapped again.
//!
//! Each test gives its library bytes of its own (a trailer after the ELF image, which
//! the dynamic linker never reads), because the loader keeps libraries by sha256 for
//! the life of the process, and the tests of this binary share one process.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::inproc::{built_library, gcc_library};
use drover_host::plugins::candidate::{Candidate, CandidateKind};
use drover_host::plugins::trust::{self, Binary, Policy};
use drover_host::plugins::{library, loader};

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
    // The test wrote and closed the file, but a process another test forks holds a copy
    // of every descriptor open at its fork until it execs (close-on-exec closes them
    // only then): the scanner may briefly see "still open for writing". Wait for that
    // to pass, not for anything else.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let (mut candidates, skipped) = loop {
        let (candidates, skipped) = loader::scan_plugin_dir(plugins);
        let busy = skipped
            .iter()
            .any(|s| format!("{s:?}").contains("still open for writing"));
        if !busy || std::time::Instant::now() > deadline {
            break (candidates, skipped);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
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
    let (fd, _) = trust::open_checked(c).unwrap_or_else(|e| panic!("{e}"));
    let sha256 = trust::sha256_fd(&fd).unwrap();
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
        &loader::LaunchSettings::default(),
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
    big.set_len(library::MAX_LIBRARY_BYTES + 1).unwrap();
    // Closed: a library still open for writing is not even scanned.
    drop(big);
    std::fs::set_permissions(
        plugins.join("big.so"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let c = only_candidate(&plugins);
    let (fd, _) = trust::open_checked(&c).unwrap();
    let binary = Binary {
        fd: Arc::new(fd),
        sha256: "0".repeat(64),
    };
    let err = refusal(&c, &binary, dir.path()).await;
    assert!(
        err.contains(&format!(
            "is {} bytes, more than the {} a driver library may have",
            library::MAX_LIBRARY_BYTES + 1,
            library::MAX_LIBRARY_BYTES
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

/// How many descriptors of this process are sealed copies named `label`.
fn open_copies(label: &str) -> usize {
    let name = format!("/memfd:{label} ");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| format!("{} ", target.display()).starts_with(&name))
        .count()
}

/// Run `gcc` with `args` in `dir`; `false` after a loud `SKIPPED` line when there is
/// no gcc (a failure under `CI=true`).
fn gcc(dir: &Path, args: &[&str]) -> bool {
    match std::process::Command::new("gcc")
        .current_dir(dir)
        .args(args)
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => panic!("gcc {args:?}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            let why = format!("gcc cannot be run ({e}); it builds the C test libraries");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

/// A copy of a real library cut short, wherever the cut falls (in its loaded segments,
/// or only in the section headers at its end), is refused before `dlopen`: nothing is
/// mapped and this process, the loader's, lives on (a page past the end of a mapped
/// file kills the process that touches it with `SIGBUS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_library_is_refused_before_dlopen() {
    let Some(fixture) = built_library("drover-fixture-library") else {
        return;
    };
    let bytes = std::fs::read(&fixture).unwrap();
    let build = tempfile::tempdir().unwrap();
    for (label, keep) in [
        ("cut-head", 100_000),
        ("cut-half", bytes.len() / 2),
        ("cut-tail", bytes.len() - 64),
    ] {
        let cut = build.path().join(format!("{label}.so"));
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        let (dir, plugins) = plugin_dir_with(&cut, &format!("{label}.so"), "");
        let c = only_candidate(&plugins);
        let err = refusal(&c, &checked(&c), dir.path()).await;
        assert!(
            err.contains(&format!(
                "{}/{label}.so is not loaded: its ",
                plugins.display()
            )) && err.contains(&format!(
                "past the end of the file ({keep} bytes): the file is truncated or still \
                     being written"
            )),
            "{err}"
        );
        assert_eq!(mapped_copies(label), 0, "{label} was mapped");
        assert_eq!(open_copies(label), 0, "the copy of {label} was kept");
        // The same bytes again are refused without being copied.
        let again = refusal(&c, &checked(&c), dir.path()).await;
        assert!(again.contains("does not try these bytes again"), "{again}");
    }
}

/// A library someone still has open for writing (a copy in progress) is not loaded;
/// once the writer closes it, it is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_still_open_for_writing_is_not_loaded_until_it_is_closed() {
    let Some((_dir, plugins, c)) = fixture_candidate("writer test") else {
        return;
    };
    let writer = std::fs::OpenOptions::new()
        .append(true)
        .open(plugins.join("fixture-library.so"))
        .unwrap();
    let err = trust::open_checked(&c).map(|_| ()).unwrap_err();
    assert!(
        err.contains("fixture-library.so is still open for writing"),
        "{err}"
    );
    // The scan refuses it too (a row that every reload tries again).
    let (candidates, skipped) = loader::scan_plugin_dir(&plugins);
    assert!(candidates.is_empty(), "{candidates:#?}");
    assert!(
        skipped[0].reason.contains("still open for writing"),
        "{skipped:#?}"
    );
    drop(writer);
    // Closed: the next scan (the reload its close starts) takes it. Not loaded here:
    // the other tests of this process count the copies named fixture-library.
    let (candidates, skipped) = loader::scan_plugin_dir(&plugins);
    assert!(skipped.is_empty(), "{skipped:#?}");
    assert_eq!(candidates.len(), 1, "{candidates:#?}");
    assert!(trust::open_checked(&c).is_ok());
}

/// Bytes `dlopen` refuses (a dependency that is not installed) leave nothing behind:
/// their sealed copy is closed, and the same bytes are not copied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_dlopen_refuses_frees_its_copy_and_is_not_copied_again() {
    let build = tempfile::tempdir().unwrap();
    let b = build.path();
    std::fs::write(
        b.join("dep.c"),
        "int drover_missing_dep(void) { return 1; }\n",
    )
    .unwrap();
    std::fs::write(
        b.join("needsdep.c"),
        "int drover_missing_dep(void);\nint use_it(void) { return drover_missing_dep(); }\n",
    )
    .unwrap();
    let built = gcc(
        b,
        &[
            "-shared",
            "-fPIC",
            "-o",
            "libdrovermissingdep.so",
            "-Wl,-soname,libdrovermissingdep.so",
            "dep.c",
        ],
    ) && gcc(
        b,
        &[
            "-shared",
            "-fPIC",
            "-o",
            "needsdep.so",
            "needsdep.c",
            "-L.",
            "-ldrovermissingdep",
        ],
    );
    if !built {
        return;
    }
    let (dir, plugins) = plugin_dir_with(&b.join("needsdep.so"), "needsdep.so", "");
    let c = only_candidate(&plugins);
    let first = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        first.contains("cannot load") && first.contains("libdrovermissingdep.so"),
        "{first}"
    );
    assert_eq!(open_copies("needsdep"), 0, "the failed copy was kept open");
    for _ in 0..3 {
        let again = refusal(&c, &checked(&c), dir.path()).await;
        assert!(
            again.starts_with(&first) && again.contains("does not try these bytes again"),
            "{again}"
        );
    }
    assert_eq!(open_copies("needsdep"), 0);
}

/// A library whose dependencies would be searched for relative to the agent's working
/// directory or to its own copy (`$ORIGIN` is `/proc/self/fd` here), or in a directory
/// other users may write, or named by a path, is refused before `dlopen`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_with_relative_search_paths_or_needed_paths_is_refused() {
    let build = tempfile::tempdir().unwrap();
    let b = build.path();
    std::fs::write(b.join("x.c"), "int drover_x(void) { return 1; }\n").unwrap();
    std::fs::write(
        b.join("y.c"),
        "int drover_x(void);\nint drover_y(void) { return drover_x(); }\n",
    )
    .unwrap();
    std::fs::create_dir(b.join("sub")).unwrap();
    let shared = b.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let shared_rpath = format!("-Wl,-rpath,{}", shared.display());
    let built = gcc(
        b,
        &[
            "-shared",
            "-fPIC",
            "-o",
            "sharedrpath.so",
            "x.c",
            &shared_rpath,
        ],
    ) && gcc(
        b,
        &[
            "-shared",
            "-fPIC",
            "-o",
            "origin.so",
            "x.c",
            "-Wl,-rpath,$ORIGIN/lib",
            "-Wl,--enable-new-dtags",
        ],
    ) && gcc(
        b,
        &[
            "-shared",
            "-fPIC",
            "-o",
            "relrpath.so",
            "x.c",
            "-Wl,-rpath,/usr/lib:lib",
            "-Wl,--disable-new-dtags",
        ],
    ) && gcc(b, &["-shared", "-fPIC", "-o", "sub/libnoname.so", "x.c"])
        && gcc(
            b,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "bypath.so",
                "y.c",
                "sub/libnoname.so",
            ],
        );
    if !built {
        return;
    }
    let shared_needle = format!(
        "entry {:?} is a directory that other users may write (mode 0777",
        shared.display().to_string()
    );
    for (file, needle) in [
        ("sharedrpath.so", shared_needle.as_str()),
        (
            "origin.so",
            "its DT_RUNPATH \"$ORIGIN/lib\" has the entry \"$ORIGIN/lib\", which is not an absolute path",
        ),
        (
            "relrpath.so",
            "its DT_RPATH \"/usr/lib:lib\" has the entry \"lib\", which is not an absolute path",
        ),
        (
            "bypath.so",
            "it needs the library \"sub/libnoname.so\" by a path",
        ),
    ] {
        let (dir, plugins) = plugin_dir_with(&b.join(file), file, "");
        let c = only_candidate(&plugins);
        let err = refusal(&c, &checked(&c), dir.path()).await;
        assert!(
            err.contains(" is not loaded: ") && err.contains(needle),
            "{file}: {err}"
        );
        assert_eq!(mapped_copies(&c.label), 0, "{file} was mapped");
    }
}

/// A library whose runtime failed to start, but stopped, is started again at the next
/// load (a timeout on a busy machine is not for ever), in the copy already mapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_failed_and_stopped_is_tried_again() {
    let build = tempfile::tempdir().unwrap();
    let Some(library) = gcc_library(build.path(), "failstart.so", FAILS_TO_START) else {
        return;
    };
    let (dir, plugins) = plugin_dir_with(&library, "failstart.so", "");
    let c = only_candidate(&plugins);
    let first = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        first.contains("the plugin failed to start: start number 1 refused")
            && first.contains("its runtime stopped; the library stays loaded"),
        "{first}"
    );
    let second = refusal(&c, &checked(&c), dir.path()).await;
    assert!(
        second.contains("the plugin failed to start: start number 2 refused"),
        "{second}"
    );
    assert_eq!(
        mapped_copies("failstart"),
        1,
        "the library was mapped again"
    );
}

/// A driver library (by the ABI's C layout) whose every `start` fails, saying how many
/// times it was called; it closes the log descriptor it owns, as a runtime that ended.
const FAILS_TO_START: &str = r#"
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
typedef struct { uint8_t *ptr; size_t cap; size_t *len; } error_buf;
typedef struct { int log_fd; const uint8_t *executor_ptr; size_t executor_len; error_buf error; } start_args;
static int starts;
static int start(const start_args *a) {
    close(a->log_fd);
    starts++;
    char m[64];
    int n = snprintf(m, sizeof m, "start number %d refused", starts);
    if ((size_t)n > a->error.cap) n = (int)a->error.cap;
    memcpy(a->error.ptr, m, (size_t)n);
    *a->error.len = (size_t)n;
    return 1;
}
static int connect_fd(int fd, error_buf e) { (void)e; close(fd); return 3; }
static int stop(uint64_t t, error_buf e) { (void)t; (void)e; return 3; }
typedef struct {
    uint32_t abi_version; uint32_t size;
    int (*start)(const start_args *);
    int (*connect)(int, error_buf);
    int (*stop)(uint64_t, error_buf);
} entry_v1;
static const entry_v1 ENTRY = { 1, sizeof(entry_v1), start, connect_fd, stop };
const entry_v1 *drover_plugin_entry_v1(void) { return &ENTRY; }
"#;

/// A library whose file is still changing (written a moment ago, and again while the
/// loader waits for it to settle) is refused before it is copied, to be tried again
/// at its next change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_changing_while_it_settles_is_not_copied() {
    let Some(fixture) = built_library("drover-fixture-library") else {
        return;
    };
    let (dir, plugins) = plugin_dir_with(&fixture, "settle.so", "settle test");
    let c = only_candidate(&plugins);
    let binary = checked(&c);
    let path = plugins.join("settle.so");
    // Changed just now (a chmod sets its ctime, as every write does), and again within
    // the settle time.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(library::SETTLE / 5);
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        std::io::Write::write_all(&mut f, b" and more").unwrap();
    });
    let err = refusal(&c, &binary, dir.path()).await;
    writer.join().unwrap();
    assert!(
        err.contains("settle.so is still being written (it changed within the last"),
        "{err}"
    );
    assert_eq!(open_copies("settle"), 0);
}
