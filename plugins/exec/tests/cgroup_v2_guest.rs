//! The exec driver on cgroup v2, for real: this host's `/sys/fs/cgroup` may be v1, so
//! the driver's isolation, limits, recovery and security tests run again inside a
//! guest of the VM rig whose only cgroup hierarchy is cgroup v2
//! (`drover_test_support::vm`, `Rig::run_on_host`), on the host's own files: the very
//! test binaries `cargo` built, launching the very plugin binary; and the executor's
//! cgroup unit tests, whose v2 freezer test needs such a host. Each must pass there,
//! none may skip (the guest sets `CI=true` and `DROVER_TEST_EXEC_CGROUPS=v2`; every exec
//! test then asserts root and a cgroup2 `/sys/fs/cgroup` before it starts, and the
//! freezer test that it is on v2), and every test the binary lists on the host must have
//! reported `ok` in the guest.
//!
//! The test binaries are found in `$DROVER_TEST_EXEC_GUEST_TESTS`: `scripts/test.sh`
//! builds the workspace's tests with `--no-run` and lists there, separated by `:`, the
//! test binaries of the exec driver and the executor; this test takes those of
//! [`GUEST_TESTS`] by name. Without it the test skips loudly, and under `CI=true` fails.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use drover_test_support::vm::{self, HostRunOptions};

/// The variable `scripts/test.sh` lists the test binaries in.
const TESTS_VAR: &str = "DROVER_TEST_EXEC_GUEST_TESTS";

/// A test binary that runs in the guest.
struct GuestTests {
    /// The binary's name: `tests/<name>.rs`, or a library's crate name for its unit
    /// tests.
    name: &'static str,
    /// Tests it runs at once there.
    threads: u32,
    /// Only the tests whose names contain this.
    filter: &'static str,
}

/// The exec driver's tests, and the executor's cgroup unit tests (its v2 freezer path
/// needs a cgroup v2 host). The limits tests measure a CPU quota: one at a time.
const GUEST_TESTS: [GuestTests; 5] = [
    GuestTests {
        name: "isolation",
        threads: 2,
        filter: "",
    },
    GuestTests {
        name: "limits",
        threads: 1,
        filter: "",
    },
    GuestTests {
        name: "recovery",
        threads: 2,
        filter: "",
    },
    GuestTests {
        name: "security",
        threads: 2,
        filter: "",
    },
    GuestTests {
        name: "drover_executor",
        threads: 1,
        filter: "cgroup::",
    },
];

/// Prefix of the guest script's lines that the host reads.
const MARK: &str = "drover-v2:";
/// Prefix of the per-test results: `drover-v2-result: <binary> <ok|failed|ignored> <test>`.
const RESULT: &str = "drover-v2-result:";

/// The binaries of [`GUEST_TESTS`] from `$DROVER_TEST_EXEC_GUEST_TESTS`, by name.
fn test_binaries() -> Option<BTreeMap<&'static str, PathBuf>> {
    let why = match std::env::var(TESTS_VAR) {
        Ok(list) if !list.trim().is_empty() => {
            let paths: Vec<PathBuf> = std::env::split_paths(&list).collect();
            let mut found = BTreeMap::new();
            for GuestTests { name, .. } in GUEST_TESTS {
                // cargo names a test binary `<name>-<hash>`.
                let path = paths.iter().find(|p| {
                    p.file_name()
                        .and_then(|f| f.to_str())
                        .and_then(|f| f.rsplit_once('-'))
                        .is_some_and(|(n, _)| n == name)
                });
                match path {
                    Some(p) if p.is_file() => {
                        found.insert(name, p.clone());
                    }
                    Some(p) => panic!("{TESTS_VAR}: {} does not exist", p.display()),
                    None => panic!("{TESTS_VAR} lists no test binary `{name}`: {list}"),
                }
            }
            return Some(found);
        }
        _ => format!(
            "${TESTS_VAR} is not set: run through scripts/test.sh, which builds the exec \
             driver's test binaries and lists them there"
        ),
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true and {why}"
    );
    eprintln!("SKIPPED: the exec tests in a cgroup v2 guest: {why}");
    None
}

/// The tests `binary` has (those matching `filter`), as it lists them on the host.
fn listed_tests(binary: &Path, filter: &str) -> Vec<String> {
    let out = Command::new(binary)
        .args(["--list", "--format", "terse", filter])
        .output()
        .unwrap_or_else(|e| panic!("{} --list: {e}", binary.display()));
    assert!(out.status.success(), "{} --list: {out:?}", binary.display());
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect();
    assert!(!names.is_empty(), "{} lists no tests", binary.display());
    names
}

/// The script the guest runs: each binary with its results (libtest's `--logfile`)
/// copied to the console after its own output, one marked line per test.
fn guest_script(binaries: &BTreeMap<&str, PathBuf>) -> String {
    let mut script = format!(
        "#!/bin/sh\n\
         # Run by drover_test_support::vm inside the cgroup v2 guest (see cgroup_v2_guest.rs).\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n\
         export CI=true {expect}=v2 RUST_BACKTRACE=1\n\
         cd {manifest} || exit 2\n\
         echo \"{MARK} /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)\"\n\
         echo \"{MARK} controllers: $(cat /sys/fs/cgroup/cgroup.controllers)\"\n\
         status=0\n\
         run() {{\n\
         \tstart=$(date +%s)\n\
         \t\"$2\" --test-threads=\"$3\" --logfile \"/tmp/$1.results\" \"$4\" 2>&1\n\
         \trc=$?\n\
         \tsed \"s/^/{RESULT} $1 /\" \"/tmp/$1.results\"\n\
         \techo \"{MARK} $1 exit $rc after $(( $(date +%s) - start )) s\"\n\
         \t[ \"$rc\" -eq 0 ] || status=1\n\
         }}\n",
        expect = common::EXPECT_CGROUPS,
        manifest = env!("CARGO_MANIFEST_DIR"),
    );
    for t in GUEST_TESTS {
        script.push_str(&format!(
            "run {} {} {} '{}'\n",
            t.name,
            binaries[t.name].display(),
            t.threads,
            t.filter
        ));
    }
    script.push_str("exit $status\n");
    script
}

#[test]
fn the_exec_tests_pass_in_a_cgroup_v2_guest() {
    if !common::isolation_possible() {
        return;
    }
    let Some(rig) = vm::rig() else { return };
    let Some(binaries) = test_binaries() else {
        return;
    };
    let expected: BTreeMap<&str, Vec<String>> = GUEST_TESTS
        .iter()
        .map(|t| (t.name, listed_tests(&binaries[t.name], t.filter)))
        .collect();

    // Under the target dir: the guest sees it at its host path, as it does the
    // workspace and the test binaries (bound into the guest's own /tmp for a checkout
    // under /tmp), whose paths the binaries have built in.
    let dir = tempfile::Builder::new()
        .prefix("cgroup-v2-guest-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a directory for the guest script");
    let script = dir.path().join("run.sh");
    std::fs::write(&script, guest_script(&binaries)).expect("write the guest script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod the guest script");

    let host_dirs = [
        Path::new(env!("CARGO_MANIFEST_DIR")),
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        Path::new(common::BIN),
    ]
    .into_iter()
    .chain(binaries.values().map(PathBuf::as_path))
    .filter_map(|p| if p.is_dir() { Some(p) } else { p.parent() })
    .map(Path::to_path_buf)
    .collect();
    let options = HostRunOptions {
        memory_mib: 2048,
        cpus: 2,
        limit: Duration::from_secs(900),
        host_dirs,
        ..HostRunOptions::default()
    };
    let Some(run) = rig.run_on_host(&script, &options) else {
        return;
    };
    eprintln!(
        "the exec tests in the cgroup v2 guest took {:.1} s (boot and power-off included)",
        run.elapsed.as_secs_f64()
    );
    for line in run.output.lines().filter(|l| l.starts_with(MARK)) {
        eprintln!("{line}");
    }
    let output = &run.output;
    assert!(
        output
            .lines()
            .any(|l| l.trim() == format!("{MARK} /sys/fs/cgroup is cgroup2fs")),
        "the guest's /sys/fs/cgroup is not cgroup2 only:\n{output}"
    );

    // binary → test → result, from the guest.
    let mut results: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
    for line in output.lines() {
        let Some(rest) = line.trim().strip_prefix(RESULT) else {
            continue;
        };
        let mut words = rest.split_whitespace();
        if let (Some(binary), Some(result), Some(test)) = (words.next(), words.next(), words.next())
        {
            results.entry(binary).or_default().insert(test, result);
        }
    }
    let mut report = Vec::new();
    let mut all_passed = true;
    for (binary, tests) in &expected {
        for test in tests {
            let result = results
                .get(binary)
                .and_then(|r| r.get(test.as_str()))
                .copied()
                .unwrap_or("no result");
            all_passed &= result == "ok";
            report.push(format!("{binary}::{test}: {result}"));
        }
    }
    let report = report.join("\n");
    assert!(
        all_passed && run.exit_code == 0,
        "in the cgroup v2 guest (exit {}):\n{report}\n\nthe guest's console ({} bytes before it not kept):\n{output}",
        run.exit_code,
        run.output_dropped
    );
    eprintln!("{report}");
}
